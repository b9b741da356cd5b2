/* SPDX-License-Identifier: MIT */
/*
 * libdrm_fabric: libhsakmt's FABRIC export and import (spec userspace-surface
 * §3.3 steps 6-8: hsaKmtHandleExport, hsaKmtHandleImport, hsaKmtMemoryVaMap)
 * done with the calls libhsakmt makes, across two nodes, through the public
 * API of Debian's libdrm / libdrm_amdgpu (2.4.114).  The UALink ioctl and the
 * 64-byte GEM_VA are newer than that libdrm's headers, so, as libhsakmt does
 * with its own header, they come from the patch series' uAPI (the UALink part
 * of include/ualink/ualink_drm.h) and a local struct.
 *
 *   libdrm_fabric export
 *       on the exporter's node: a VRAM BO, a GPU store into it, the FABRIC
 *       export; prints the handle, then holds the BO until stdin closes.
 *   libdrm_fabric import <handle lo> <handle hi> <text>
 *       on the importer's node: the FABRIC import, a GPU load of what the
 *       exporter stored, and a CPU map of the import (refused).
 *
 * Output (tests/integration/test_libdrm.py parses it):
 *   ok <step> key=value ...  |  fail <step> err=<n> ...  (exit status 1)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <amdgpu.h>
#include <amdgpu_drm.h>
#include <xf86drm.h>

#include "libdrm_check.h"

#include "ualink/ualink_drm.h"	/* only its UALink part: amdgpu_drm.h came first */

#define BO_SIZE (2u << 20)
#define STORE_OFFSET 4096u	/* where the exporter stores, inside the BO */

/* drm_amdgpu_gem_va with the timeline fields (amdgpu_drm.h of libdrm >= 2.4.125,
 * libhsakmt's own copy): 64 bytes, dispatched by nr as the 40-byte one is. */
struct gem_va_timeline {
	uint32_t handle;
	uint32_t _pad;
	uint32_t operation;
	uint32_t flags;
	uint64_t va_address;
	uint64_t offset_in_bo;
	uint64_t map_size;
	uint64_t vm_timeline_point;
	uint32_t vm_timeline_syncobj_out;
	uint32_t num_syncobj_handles;
	uint64_t input_fence_syncobj_handles;
};
_Static_assert(sizeof(struct gem_va_timeline) == 64, "64-byte GEM_VA");

static amdgpu_device_handle init(void)
{
	amdgpu_device_handle dev;
	uint32_t major, minor;
	int fd = open("/dev/dri/renderD128", O_RDWR | O_CLOEXEC);

	if (fd < 0)
		fail("open", errno);
	check(amdgpu_device_initialize(fd, &major, &minor, &dev), "init");
	close(fd);	/* libdrm keeps its own dup */
	return dev;
}

/* hsaKmtHandleExport(FABRIC): amdgpu_device_get_fd, amdgpu_bo_export(kms), and the
 * UALink EXPORT through drmCommandWriteRead (24 bytes). */
static int do_export(void)
{
	struct amdgpu_bo_alloc_request req = {
		.alloc_size = BO_SIZE, .phys_alignment = 4096,
		.preferred_heap = AMDGPU_GEM_DOMAIN_VRAM,
	};
	static const char text[] = "stored-by-the-exporter-GPU";
	union drm_amdgpu_ualink_handle u;
	amdgpu_device_handle dev = init();
	amdgpu_va_handle vah;
	amdgpu_bo_handle bo;
	uint32_t kms;
	uint64_t va;
	char line[16];
	int fd = amdgpu_device_get_fd(dev);

	check(amdgpu_bo_alloc(dev, &req, &bo), "bo_alloc");
	check(amdgpu_va_range_alloc(dev, amdgpu_gpu_va_range_general, BO_SIZE, 0, 0, &va,
				    &vah, 0), "va_alloc");
	check(amdgpu_bo_va_op(bo, 0, BO_SIZE, va, 0, AMDGPU_VA_OP_MAP), "va_map");
	if (pwrite(fd, text, sizeof(text) - 1, (off_t)(va + STORE_OFFSET)) !=
	    (ssize_t)sizeof(text) - 1)
		fail("gpu_store", errno);
	printf("ok gpu_store text=%s\n", text);

	check(amdgpu_bo_export(bo, amdgpu_bo_handle_type_kms, &kms), "export_kms");
	memset(&u, 0, sizeof(u));
	u.in.op = DRM_AMDGPU_UALINK_HANDLE_OP_EXPORT;
	u.in.gem_handle = kms;
	check(drmCommandWriteRead(fd, DRM_AMDGPU_UALINK_HANDLE, &u, sizeof(u)), "export");
	printf("ok export lo=%#" PRIx64 " hi=%#" PRIx64 "\n",
	       (uint64_t)u.out.export_ualink_handle[0], (uint64_t)u.out.export_ualink_handle[1]);
	fflush(stdout);

	/* the importer runs now; the BO stays exported until we are told */
	while (fgets(line, sizeof(line), stdin))
		;
	check(amdgpu_bo_va_op(bo, 0, BO_SIZE, va, 0, AMDGPU_VA_OP_UNMAP), "va_unmap");
	check(amdgpu_va_range_free(vah), "va_free");
	check(amdgpu_bo_free(bo), "bo_free");
	amdgpu_device_deinitialize(dev);
	printf("ok done\n");
	return 0;
}

static int do_import(uint64_t lo, uint64_t hi, const char *text)
{
	union drm_amdgpu_ualink_handle u;
	struct amdgpu_bo_import_result imp;
	struct gem_va_timeline gva;
	amdgpu_device_handle dev = init();
	amdgpu_va_handle vah;
	uint32_t kms, syncobj;
	uint64_t va, point;
	char back[64];
	struct stat st;
	size_t n = strlen(text);
	void *cpu;
	int fd = amdgpu_device_get_fd(dev), dmabuf, flags, ret;

	/* hsaKmtHandleImport(FABRIC): UALink IMPORT → a dma-buf fd, amdgpu_bo_import */
	memset(&u, 0, sizeof(u));
	u.in.op = DRM_AMDGPU_UALINK_HANDLE_OP_IMPORT;
	u.in.import_ualink_handle[0] = lo;
	u.in.import_ualink_handle[1] = hi;
	check(drmCommandWriteRead(fd, DRM_AMDGPU_UALINK_HANDLE, &u, sizeof(u)), "import");
	dmabuf = (int)u.out.import_dmabuf_handle;
	flags = fcntl(dmabuf, F_GETFD);
	check(fstat(dmabuf, &st), "import_fd");
	printf("ok import fd_valid=%d cloexec=%d\n", flags >= 0, flags >= 0 && (flags & FD_CLOEXEC));
	check(amdgpu_bo_import(dev, amdgpu_bo_handle_type_dma_buf_fd, (uint32_t)dmabuf, &imp),
	      "bo_import");
	printf("ok bo_import size=%" PRIu64 "\n", imp.alloc_size);
	close(dmabuf);	/* ROCr closes it: the GEM handle keeps the BO */

	/* hsaKmtMemoryVaMap: the VM timeline syncobj, the 64-byte GEM_VA, and
	 * SYNCOBJ_TIMELINE_WAIT with WAIT_FOR_SUBMIT */
	check(drmSyncobjCreate(fd, 0, &syncobj), "syncobj_create");
	check(amdgpu_va_range_alloc(dev, amdgpu_gpu_va_range_general, imp.alloc_size, 0, 0,
				    &va, &vah, 0), "va_alloc");
	check(amdgpu_bo_export(imp.buf_handle, amdgpu_bo_handle_type_kms, &kms), "export_kms");
	point = 1;
	memset(&gva, 0, sizeof(gva));
	gva.handle = kms;
	gva.operation = AMDGPU_VA_OP_MAP;
	gva.flags = AMDGPU_VM_PAGE_READABLE | AMDGPU_VM_PAGE_WRITEABLE;
	gva.va_address = va;
	gva.map_size = imp.alloc_size;
	gva.vm_timeline_point = point;
	gva.vm_timeline_syncobj_out = syncobj;
	check(drmCommandWriteRead(fd, DRM_AMDGPU_GEM_VA, &gva, sizeof(gva)), "gem_va_64");
	check(drmSyncobjTimelineWait(fd, &syncobj, &point, 1, INT64_MAX,
				     DRM_SYNCOBJ_WAIT_FLAGS_WAIT_FOR_SUBMIT, NULL),
	      "timeline_wait");
	printf("ok gem_va_64 va=%#" PRIx64 "\n", va);

	/* a GPU load over the fabric equals the exporter's store */
	memset(back, 0, sizeof(back));
	if (n >= sizeof(back) || pread(fd, back, n, (off_t)(va + STORE_OFFSET)) != (ssize_t)n)
		fail("load", errno);
	printf("ok load equal=%d\n", memcmp(back, text, n) == 0);

	/* amdgpu_bo_cpu_map of an imported (NPA) BO: GEM_MMAP refuses, EPERM */
	ret = amdgpu_bo_cpu_map(imp.buf_handle, &cpu);
	printf("ok cpu_map_import ret=%d\n", ret);

	gva.operation = AMDGPU_VA_OP_UNMAP;
	gva.vm_timeline_point = ++point;
	check(drmCommandWriteRead(fd, DRM_AMDGPU_GEM_VA, &gva, sizeof(gva)), "gem_va_unmap");
	check(drmSyncobjTimelineWait(fd, &syncobj, &point, 1, INT64_MAX,
				     DRM_SYNCOBJ_WAIT_FLAGS_WAIT_FOR_SUBMIT, NULL),
	      "unmap_wait");
	check(amdgpu_va_range_free(vah), "va_free");
	check(drmSyncobjDestroy(fd, syncobj), "syncobj_destroy");
	check(amdgpu_bo_free(imp.buf_handle), "bo_free");
	amdgpu_device_deinitialize(dev);
	printf("ok done\n");
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 2 && strcmp(argv[1], "export") == 0)
		return do_export();
	if (argc == 5 && strcmp(argv[1], "import") == 0)
		return do_import(strtoull(argv[2], NULL, 0), strtoull(argv[3], NULL, 0), argv[4]);
	fprintf(stderr, "usage: libdrm_fabric export | import <lo> <hi> <text>\n");
	return 2;
}
