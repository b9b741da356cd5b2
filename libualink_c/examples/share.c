/* SPDX-License-Identifier: MIT */
/*
 * share: put a message in GPU memory and publish it to the pod.
 *
 *   share <render-node>
 *
 * Creates a 2 MiB VRAM buffer, maps it into this GPU's VM, stores a message
 * through the GPU (a pwrite at the GPU VA), exports the buffer and prints the
 * UALink handle.  Then it holds the buffer until stdin closes; before letting
 * go it loads what sits at offset 4096, where a peer (see peer.c) may have
 * written back.  Closing the buffer revokes the export.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include <ualink/ualink.h>

#define SIZE (2u << 20)
#define VA 0x100000000ull

int main(int argc, char **argv)
{
	const char msg[] = "hello from the exporter's VRAM";
	char back[64] = { 0 };
	uint64_t h[2];
	uint32_t bo;
	ualink_dev *dev;
	int ret;

	if (argc != 2) {
		fprintf(stderr, "usage: %s <render-node>\n", argv[0]);
		return 2;
	}
	ret = ualink_open(argv[1], &dev);
	if (ret) {
		fprintf(stderr, "open: %s\n", strerror(-ret));
		return 1;
	}
	if ((ret = ualink_bo_create(dev, SIZE, 4096, AMDGPU_GEM_DOMAIN_VRAM, 0, &bo)) ||
	    (ret = ualink_va_map(dev, bo, VA, 0, SIZE,
				 AMDGPU_VM_PAGE_READABLE | AMDGPU_VM_PAGE_WRITEABLE)) ||
	    (ret = (int)ualink_gpu_write(dev, VA, msg, sizeof(msg))) < 0 ||
	    (ret = ualink_export(dev, bo, h))) {
		fprintf(stderr, "share: %s\n", strerror(-ret));
		ualink_close(dev);
		return 1;
	}
	printf("handle=%016" PRIx64 "%016" PRIx64 " stored \"%s\" at VA 0x%llx\n",
	       h[1], h[0], msg, VA);
	fflush(stdout);
	while (getchar() != EOF)	/* the export lives as long as our handle */
		;
	ret = (int)ualink_gpu_read(dev, VA + 4096, back, sizeof(back) - 1);
	printf("exporter loads offset 4096: \"%s\"\n", ret > 0 ? back : strerror(-ret));
	ualink_close(dev);		/* last GEM handle: handle_free revokes the export */
	return 0;
}
