/* SPDX-License-Identifier: MIT */
/*
 * libdrm_bo_list: AMDGPU_BO_LIST through the public API of Debian's libdrm_amdgpu
 * (2.4.114) only -- amdgpu_bo_list_create / _update / _destroy and their _raw forms --
 * and the kernel's errnos through drmCommandWriteRead (amdgpu_bo_list_ioctl). Run under
 * libualink_shim.so by tests/integration/test_libdrm_bo_list.py:
 *
 *   ok <step> key=value ...     as on real amdgpu hardware
 *   fail <step> err=<n> ...     the first step that failed (exit status 1)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <amdgpu.h>
#include <amdgpu_drm.h>
#include <xf86drm.h>

#include "libdrm_check.h"

/* One raw AMDGPU_BO_LIST: the return value (0 or -errno) and out.list_handle. */
static int raw_bo_list(int fd, uint32_t op, uint32_t handle, uint32_t n, uint32_t size,
		       uint64_t ptr, uint32_t *out)
{
	union drm_amdgpu_bo_list args;
	int r;

	memset(&args, 0, sizeof(args));
	args.in.operation = op;
	args.in.list_handle = handle;
	args.in.bo_number = n;
	args.in.bo_info_size = size;
	args.in.bo_info_ptr = ptr;
	r = drmCommandWriteRead(fd, DRM_AMDGPU_BO_LIST, &args, sizeof(args));
	if (out)
		*out = args.out.list_handle;
	return r;
}

int main(void)
{
	struct amdgpu_bo_alloc_request req = { .alloc_size = 1 << 20, .phys_alignment = 4096,
					       .preferred_heap = AMDGPU_GEM_DOMAIN_VRAM };
	struct drm_amdgpu_bo_list_entry entries[2];
	amdgpu_bo_list_handle list;
	amdgpu_device_handle dev;
	amdgpu_bo_handle bos[2];
	uint8_t prios[2] = { 1, 200 };
	uint32_t major, minor, kms[2], raw, h;
	int fd, dfd, r;

	setvbuf(stdout, NULL, _IOLBF, 0);
	fd = open("/dev/dri/renderD128", O_RDWR | O_CLOEXEC);
	if (fd < 0)
		fail("open", errno);
	check(amdgpu_device_initialize(fd, &major, &minor, &dev), "init");
	dfd = amdgpu_device_get_fd(dev);
	check(amdgpu_bo_alloc(dev, &req, &bos[0]), "bo_alloc");
	req.preferred_heap = AMDGPU_GEM_DOMAIN_GTT;
	check(amdgpu_bo_alloc(dev, &req, &bos[1]), "bo_alloc");
	check(amdgpu_bo_export(bos[0], amdgpu_bo_handle_type_kms, &kms[0]), "export_kms");
	check(amdgpu_bo_export(bos[1], amdgpu_bo_handle_type_kms, &kms[1]), "export_kms");

	/* amdgpu_bo_list_create / _update / _destroy: CREATE, UPDATE, DESTROY */
	check(amdgpu_bo_list_create(dev, 2, bos, prios, &list), "list_create");
	printf("ok list_create\n");
	check(amdgpu_bo_list_update(list, 1, &bos[1], NULL), "list_update");
	printf("ok list_update\n");

	/* amdgpu_bo_list_create_raw: the handle the kernel gave (the lowest free after 1) */
	entries[0] = (struct drm_amdgpu_bo_list_entry){ kms[0], 0 };
	entries[1] = (struct drm_amdgpu_bo_list_entry){ kms[1], 7 };
	check(amdgpu_bo_list_create_raw(dev, 2, entries, &raw), "list_create_raw");
	printf("ok list_create_raw handle=%u\n", raw);

	/* the kernel's errnos: an unknown BO, an unknown operation, a bad array, an UPDATE of
	 * a handle with no list; DESTROY of one answers handle 0 */
	entries[1].bo_handle = 0xdead;
	r = raw_bo_list(dfd, AMDGPU_BO_LIST_OP_CREATE, 0, 2, sizeof(entries[0]),
			(uintptr_t)entries, NULL);
	printf("ok unknown_bo ret=%d\n", r);
	r = raw_bo_list(dfd, 9, 0, 0, 0, 0, NULL);
	printf("ok unknown_op ret=%d\n", r);
	r = raw_bo_list(dfd, AMDGPU_BO_LIST_OP_CREATE, 0, 1, sizeof(entries[0]), 8, NULL);
	printf("ok bad_array ret=%d\n", r);
	r = raw_bo_list(dfd, AMDGPU_BO_LIST_OP_UPDATE, 77, 0, sizeof(entries[0]), 0, NULL);
	printf("ok update_none ret=%d\n", r);
	h = 123;
	r = raw_bo_list(dfd, AMDGPU_BO_LIST_OP_DESTROY, 77, 0, 0, 0, &h);
	printf("ok destroy_none ret=%d handle=%u\n", r, h);

	check(amdgpu_bo_list_destroy_raw(dev, raw), "list_destroy_raw");
	check(amdgpu_bo_list_destroy(list), "list_destroy");
	printf("ok list_destroy\n");
	/* the handle is free again: the next list gets it */
	entries[1].bo_handle = kms[1];
	check(amdgpu_bo_list_create_raw(dev, 2, entries, &h), "list_again");
	printf("ok list_again handle=%u first=%u\n", h, raw);
	check(amdgpu_bo_list_destroy_raw(dev, h), "list_destroy_raw");

	amdgpu_bo_free(bos[0]);
	amdgpu_bo_free(bos[1]);
	amdgpu_device_deinitialize(dev);
	close(fd);
	printf("ok done\n");
	return 0;
}
