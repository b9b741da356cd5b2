/* SPDX-License-Identifier: MIT */
/*
 * import: map another GPU's exported memory into this one.
 *
 *   import <render-node> <handle_hi:handle_lo | 32 hex digits>
 *
 * Imports a UALink handle (as printed by export) and gets back a dma-buf fd,
 * learns its size with lseek, and turns it into a GEM handle of this render
 * node, ready for GEM_VA.  This is what libhsakmt's hsaKmtHandleImport does.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <ualink/ualink.h>

/* "hi:lo" (each hex, 0x optional) or 32 hex digits, hi first. */
static int parse_handle(const char *s, uint64_t h[2])
{
	char hi[17], *end;

	if (!strncmp(s, "handle=", 7))
		s += 7;
	if (strchr(s, ':')) {
		h[1] = strtoull(s, &end, 16);
		if (*end != ':')
			return -1;
		h[0] = strtoull(end + 1, &end, 16);
		return *end ? -1 : 0;
	}
	if (strlen(s) != 32 || strspn(s, "0123456789abcdefABCDEF") != 32)
		return -1;
	memcpy(hi, s, 16);
	hi[16] = 0;
	h[1] = strtoull(hi, NULL, 16);
	h[0] = strtoull(s + 16, NULL, 16);
	return 0;
}

int main(int argc, char **argv)
{
	uint64_t h[2];
	uint32_t bo;
	ualink_dev *dev;
	int ret, fd;
	off_t size;

	if (argc != 3 || parse_handle(argv[2], h)) {
		fprintf(stderr, "usage: %s <render-node> <handle_hi:handle_lo | 32-hex>\n",
			argv[0]);
		return 2;
	}
	ret = ualink_open(argv[1], &dev);
	if (ret) {
		fprintf(stderr, "open %s: %s\n", argv[1], strerror(-ret));
		return 1;
	}
	/* A real dma-buf fd: it can be passed on (SCM_RIGHTS) and closed. */
	ret = ualink_import(dev, h, &fd);
	if (ret) {
		fprintf(stderr, "UALINK import: %s\n", strerror(-ret));
		goto out;
	}
	size = lseek(fd, 0, SEEK_END);	/* as libdrm's amdgpu_bo_import does */
	ret = ualink_prime_fd_to_handle(dev, fd, &bo);
	if (ret) {
		fprintf(stderr, "PRIME_FD_TO_HANDLE: %s\n", strerror(-ret));
		close(fd);
		goto out;
	}
	printf("dmabuf_fd=%d size=%jd gem_handle=%" PRIu32 "\n", fd, (intmax_t)size, bo);

	ualink_bo_close(dev, bo);
	close(fd);	/* the last reference: the importer lets go of the memory */
out:
	ualink_close(dev);
	return ret ? 1 : 0;
}
