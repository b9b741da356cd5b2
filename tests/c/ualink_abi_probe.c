/* SPDX-License-Identifier: MIT */
/*
 * ualink_abi_probe <render-node>
 *
 * Shows, byte for byte, what the UALINK_HANDLE ioctl copies back for the
 * struct sizes and inputs the spec pins down (§1.4, §2.1): a short user
 * struct is zero-extended and its copy-out truncated, a long one has its
 * tail echoed, a failed ioctl still copies the buffer back.  Raw ioctl(2),
 * no library, no retry.  One line per case, parsed by the tests:
 *
 *   case=<name> ret=<0|-errno> bytes=<hex of the whole user buffer after>
 *
 * Cases and their inputs (gem_handle = the BO from "create"):
 *   create        GEM_CREATE 32 B: 64 KiB, align 4096, VRAM
 *   export24      24 B: op 0, flags 0, gem_handle, rest 0
 *   export24_tail 24 B: as export24, bytes 16..23 = 0x5a
 *   export16      16 B (_IOC(RW,'d',0x5b,16)): op 0, flags 0, gem_handle
 *   export32      32 B: as export24, bytes 24..31 = 0xa5
 *   unknown_op    24 B: op 7, byte i = 0x80 + i for i = 4..23
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "ualink/ualink_drm.h"

#define UALINK_NR (DRM_COMMAND_BASE + DRM_AMDGPU_UALINK_HANDLE)

static int fd;

/* Issue cmd on buf (of _IOC_SIZE(cmd) bytes) and print the case line. */
static int run_case(const char *name, unsigned long cmd, unsigned char *buf)
{
	unsigned i, size = _IOC_SIZE(cmd);
	int ret = ioctl(fd, cmd, buf) < 0 ? -errno : 0;

	printf("case=%s ret=%d bytes=", name, ret);
	for (i = 0; i < size; i++)
		printf("%02x", buf[i]);
	printf("\n");
	return ret;
}

static void put_u32(unsigned char *p, uint32_t v)
{
	memcpy(p, &v, sizeof(v));	/* host order, as the ABI is */
}

static void export_in(unsigned char *buf, size_t size, uint32_t gem_handle)
{
	memset(buf, 0, size);
	put_u32(buf + 0, DRM_AMDGPU_UALINK_HANDLE_OP_EXPORT);
	put_u32(buf + 8, gem_handle);
}

int main(int argc, char **argv)
{
	unsigned char buf[64];
	union drm_amdgpu_gem_create create;
	struct drm_gem_close close_args;
	uint32_t bo = 0;
	unsigned i;

	_Static_assert(sizeof(union drm_amdgpu_ualink_handle) == 24, "uapi size");
	_Static_assert(DRM_IOCTL_AMDGPU_UALINK_HANDLE == 0xC018645B, "uapi number");
	if (argc != 2) {
		fprintf(stderr, "usage: %s <render-node>\n", argv[0]);
		return 2;
	}
	fd = open(argv[1], O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		fprintf(stderr, "%s: %s: %s\n", argv[0], argv[1], strerror(errno));
		return 1;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);

	memset(&create, 0, sizeof(create));
	create.in.bo_size = 64 << 10;
	create.in.alignment = 4096;
	create.in.domains = AMDGPU_GEM_DOMAIN_VRAM;
	if (run_case("create", DRM_IOCTL_AMDGPU_GEM_CREATE, (unsigned char *)&create) == 0)
		bo = create.out.handle;

	export_in(buf, 24, bo);
	run_case("export24", DRM_IOCTL_AMDGPU_UALINK_HANDLE, buf);

	export_in(buf, 24, bo);
	memset(buf + 16, 0x5a, 8);
	run_case("export24_tail", DRM_IOCTL_AMDGPU_UALINK_HANDLE, buf);

	export_in(buf, 16, bo);
	run_case("export16", _IOC(_IOC_READ | _IOC_WRITE, DRM_IOCTL_BASE, UALINK_NR, 16), buf);

	export_in(buf, 32, bo);
	memset(buf + 24, 0xa5, 8);
	run_case("export32", _IOC(_IOC_READ | _IOC_WRITE, DRM_IOCTL_BASE, UALINK_NR, 32), buf);

	memset(buf, 0, 24);
	put_u32(buf, 7);
	for (i = 4; i < 24; i++)
		buf[i] = (unsigned char)(0x80 + i);
	run_case("unknown_op", DRM_IOCTL_AMDGPU_UALINK_HANDLE, buf);

	if (bo) {
		memset(&close_args, 0, sizeof(close_args));
		close_args.handle = bo;
		ioctl(fd, DRM_IOCTL_GEM_CLOSE, &close_args);
	}
	close(fd);
	return 0;
}
