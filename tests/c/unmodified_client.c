/* SPDX-License-Identifier: MIT */
/*
 * unmodified_client: a DRM/amdgpu client that knows nothing of ualinkd.
 *
 * It opens /dev/dri/renderD128 and issues raw ioctls as it would on a real
 * amdgpu (retrying EINTR/EAGAIN as drmIoctl does).  Run under
 * libualink_shim.so with UALINK_DRI_DIR=<mount>/dri it talks to a ualinkd
 * node; the test (tests/integration/test_shim.py) parses its lines:
 *
 *   ok <step> key=value ...      a step that went as on real hardware
 *   info <step> key=value ...    an observation
 *   fail <step> errno=<n> ...    the first step that failed (exit status 1)
 *
 * Steps: open, version (libdrm's two-pass drmGetVersion, and a truncated
 * name), gem_create (VRAM), export, import (of its own handle: the local
 * path gives the exporter's dma-buf), import_size (lseek SEEK_END), fstat,
 * fd_to_handle (same GEM handle, spec §2.5), handle_to_fd (DRM_CLOEXEC) and
 * its fd_to_handle, handle_to_fd_dup (no DRM_CLOEXEC, on a dup of the render
 * fd), card0 (openat of /dev/dri/card0), renderD129, done.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ualink/ualink_drm.h"


#define BO_SIZE (2ull << 20)

static int xioctl(int fd, unsigned long request, void *arg)
{
	int ret;

	do {
		ret = ioctl(fd, request, arg);
	} while (ret == -1 && (errno == EINTR || errno == EAGAIN));
	return ret;
}

static void fail(const char *step)
{
	int e = errno;

	printf("fail %s errno=%d (%s)\n", step, e, strerror(e));
	exit(1);
}

static void check(int cond, const char *step)
{
	if (!cond) {
		printf("fail %s errno=0 (check)\n", step);
		exit(1);
	}
}

/* drmGetVersion: lengths first, then the strings. */
static void get_version(int fd, const char *step)
{
	struct drm_version v;
	char *name, *date, *desc;

	memset(&v, 0, sizeof(v));
	if (xioctl(fd, DRM_IOCTL_VERSION, &v))
		fail(step);
	name = calloc(1, v.name_len + 1);
	date = calloc(1, v.date_len + 1);
	desc = calloc(1, v.desc_len + 1);
	if (!name || !date || !desc)
		fail(step);
	v.name = name;
	v.date = date;
	v.desc = desc;
	if (xioctl(fd, DRM_IOCTL_VERSION, &v))
		fail(step);
	printf("ok %s name=%s major=%d minor=%d patchlevel=%d date=%s desc=%s\n",
	       step, name, v.version_major, v.version_minor,
	       v.version_patchlevel, date, desc);
	free(name);
	free(date);
	free(desc);
}

static int cloexec(int fd)
{
	int flags = fcntl(fd, F_GETFD);

	return flags < 0 ? -1 : !!(flags & FD_CLOEXEC);
}

int main(void)
{
	union drm_amdgpu_gem_create create;
	union drm_amdgpu_ualink_handle uh;
	struct drm_prime_handle prime;
	struct drm_version v;
	uint64_t handle[2];
	char small[8];
	struct stat st;
	uint32_t bo;
	int fd, fd2, card, dmabuf, dmabuf2, dmabuf3;
	off_t size;

	setvbuf(stdout, NULL, _IOLBF, 0);

	fd = open("/dev/dri/renderD128", O_RDWR | O_CLOEXEC);
	if (fd < 0)
		fail("open");
	printf("ok open fd=%d\n", fd);

	get_version(fd, "version");
	memset(&v, 0, sizeof(v));
	memset(small, 0, sizeof(small));
	v.name = small;
	v.name_len = 3;
	if (xioctl(fd, DRM_IOCTL_VERSION, &v))
		fail("version_truncated");
	printf("ok version_truncated name=%s name_len=%zu\n", small, v.name_len);

	memset(&create, 0, sizeof(create));
	create.in.bo_size = BO_SIZE;
	create.in.alignment = 4096;
	create.in.domains = AMDGPU_GEM_DOMAIN_VRAM;
	if (xioctl(fd, DRM_IOCTL_AMDGPU_GEM_CREATE, &create))
		fail("gem_create");
	bo = create.out.handle;
	printf("ok gem_create handle=%u size=%llu\n", bo, BO_SIZE);

	memset(&uh, 0, sizeof(uh));
	uh.in.op = DRM_AMDGPU_UALINK_HANDLE_OP_EXPORT;
	uh.in.gem_handle = bo;
	if (xioctl(fd, DRM_IOCTL_AMDGPU_UALINK_HANDLE, &uh))
		fail("export");
	handle[0] = uh.out.export_ualink_handle[0];
	handle[1] = uh.out.export_ualink_handle[1];
	printf("ok export handle=%016llx:%016llx\n",
	       (unsigned long long)handle[0], (unsigned long long)handle[1]);

	memset(&uh, 0, sizeof(uh));
	uh.in.op = DRM_AMDGPU_UALINK_HANDLE_OP_IMPORT;
	uh.in.import_ualink_handle[0] = handle[0];
	uh.in.import_ualink_handle[1] = handle[1];
	if (xioctl(fd, DRM_IOCTL_AMDGPU_UALINK_HANDLE, &uh))
		fail("import");
	dmabuf = (int)uh.out.import_dmabuf_handle;
	printf("ok import fd=%d cloexec=%d\n", dmabuf, cloexec(dmabuf));

	/* A longer struct for the same nr (§2.2): the same import, the same fd treatment. */
	{
		struct { union drm_amdgpu_ualink_handle u; __u64 tail; } big;
		int wide;

		memset(&big, 0, sizeof(big));
		big.u.in.op = DRM_AMDGPU_UALINK_HANDLE_OP_IMPORT;
		big.u.in.import_ualink_handle[0] = handle[0];
		big.u.in.import_ualink_handle[1] = handle[1];
		if (xioctl(fd, DRM_IOWR(DRM_COMMAND_BASE + DRM_AMDGPU_UALINK_HANDLE,
					  big), &big))
			fail("import_32");
		wide = (int)big.u.out.import_dmabuf_handle;
		printf("ok import_32 fd=%d size=%lld\n", wide,
		       (long long)lseek(wide, 0, SEEK_END));
		close(wide);
	}

	size = lseek(dmabuf, 0, SEEK_END);
	if (size < 0)
		fail("import_size");
	printf("ok import_size size=%lld\n", (long long)size);

	if (fstat(dmabuf, &st))
		fail("fstat");
	printf("ok fstat mode=%o size=%lld uid=%u\n", (unsigned)st.st_mode,
	       (long long)st.st_size, (unsigned)st.st_uid);

	memset(&prime, 0, sizeof(prime));
	prime.fd = dmabuf;
	if (xioctl(fd, DRM_IOCTL_PRIME_FD_TO_HANDLE, &prime))
		fail("fd_to_handle");
	printf("ok fd_to_handle handle=%u same=%d\n", prime.handle,
	       prime.handle == bo);

	memset(&prime, 0, sizeof(prime));
	prime.handle = bo;
	prime.flags = DRM_CLOEXEC | DRM_RDWR;
	prime.fd = -1;
	if (xioctl(fd, DRM_IOCTL_PRIME_HANDLE_TO_FD, &prime))
		fail("handle_to_fd");
	dmabuf2 = prime.fd;
	size = lseek(dmabuf2, 0, SEEK_END);
	printf("ok handle_to_fd fd=%d distinct=%d cloexec=%d size=%lld\n",
	       dmabuf2, dmabuf2 != dmabuf, cloexec(dmabuf2), (long long)size);

	memset(&prime, 0, sizeof(prime));
	prime.fd = dmabuf2;
	if (xioctl(fd, DRM_IOCTL_PRIME_FD_TO_HANDLE, &prime))
		fail("handle_to_fd_back");
	printf("ok handle_to_fd_back handle=%u same=%d\n", prime.handle,
	       prime.handle == bo);

	/* A dup shares the open file, hence the DrmFile and its handles. */
	fd2 = dup(fd);
	if (fd2 < 0)
		fail("dup");
	memset(&prime, 0, sizeof(prime));
	prime.handle = bo;
	prime.flags = DRM_RDWR;
	prime.fd = -1;
	if (xioctl(fd2, DRM_IOCTL_PRIME_HANDLE_TO_FD, &prime))
		fail("handle_to_fd_dup");
	dmabuf3 = prime.fd;
	size = lseek(dmabuf3, 0, SEEK_END);
	printf("ok handle_to_fd_dup fd=%d cloexec=%d size=%lld\n", dmabuf3,
	       cloexec(dmabuf3), (long long)size);

	card = openat(AT_FDCWD, "/dev/dri/card0", O_RDWR | O_CLOEXEC);
	if (card < 0)
		fail("card0");
	get_version(card, "card0");

	check(open("/dev/dri/renderD129", O_RDWR) < 0, "renderD129");
	printf("info renderD129 errno=%d\n", errno);

	close(dmabuf3);
	close(dmabuf2);
	close(dmabuf);
	close(card);
	close(fd2);
	close(fd);
	printf("ok done\n");
	return 0;
}
