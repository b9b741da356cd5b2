/* SPDX-License-Identifier: MIT */
/*
 * peer: import another node's buffer, map it, and load/store it through the GPU.
 *
 *   peer <render-node> <handle>
 *
 * Imports the UALink handle, turns the dma-buf into a GEM handle, maps it into
 * this GPU's VM and loads the exporter's message, then stores a reply at
 * offset 4096.  After that, every line on stdin loads the message again: once
 * the exporter has revoked the buffer, that load faults (EFAULT).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <ualink/ualink.h>

#define VA 0x7f0000000000ull

static void load(ualink_dev *dev)
{
	char buf[64] = { 0 };
	ssize_t n = ualink_gpu_read(dev, VA, buf, sizeof(buf) - 1);

	if (n < 0)
		printf("importer load at VA 0x%llx: %s\n", VA, strerror((int)-n));
	else
		printf("importer loads \"%s\" across the fabric\n", buf);
	fflush(stdout);
}

int main(int argc, char **argv)
{
	const char reply[] = "hello back from the importer";
	char line[64];
	uint64_t h[2];
	uint32_t bo;
	ualink_dev *dev;
	int ret, fd;
	off_t size;

	if (argc != 3 || strlen(argv[2]) < 32) {
		fprintf(stderr, "usage: %s <render-node> <32-hex handle>\n", argv[0]);
		return 2;
	}
	h[0] = strtoull(argv[2] + strlen(argv[2]) - 16, NULL, 16);
	argv[2][strlen(argv[2]) - 16] = 0;
	h[1] = strtoull(argv[2] + strlen(argv[2]) - 16, NULL, 16);
	if ((ret = ualink_open(argv[1], &dev))) {
		fprintf(stderr, "open: %s\n", strerror(-ret));
		return 1;
	}
	if ((ret = ualink_import(dev, h, &fd))) {
		fprintf(stderr, "import: %s\n", strerror(-ret));
		return 1;
	}
	size = lseek(fd, 0, SEEK_END);
	ret = ualink_prime_fd_to_handle(dev, fd, &bo);
	close(fd);
	if (!ret)
		ret = ualink_va_map(dev, bo, VA, 0, (uint64_t)size,
				    AMDGPU_VM_PAGE_READABLE | AMDGPU_VM_PAGE_WRITEABLE);
	if (ret) {
		fprintf(stderr, "map: %s\n", strerror(-ret));
		return 1;
	}
	printf("imported %lld bytes, mapped at VA 0x%llx\n", (long long)size, VA);
	load(dev);
	ret = (int)ualink_gpu_write(dev, VA + 4096, reply, sizeof(reply));
	printf("importer stores \"%s\": %s\n", reply, ret < 0 ? strerror(-ret) : "done");
	fflush(stdout);
	while (fgets(line, sizeof(line), stdin))
		load(dev);
	ualink_close(dev);
	return 0;
}
