/* SPDX-License-Identifier: MIT */
/*
 * export: allocate device memory and publish it to the pod.
 *
 *   export <render-node> [size] [--wait]
 *
 * Creates a VRAM buffer object, exports it as a 128-bit UALink handle and
 * prints it; any GPU in the pod can import that handle (see import.c).
 * With --wait it keeps the buffer alive until stdin reaches EOF: the export
 * lives only as long as our GEM handle does.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ualink/ualink.h>

static void print_handle(const uint64_t h[2])
{
	printf("handle=%016" PRIx64 "%016" PRIx64
	       " handle_lo=0x%016" PRIx64 " handle_hi=0x%016" PRIx64 "\n",
	       h[1], h[0], h[0], h[1]);
	fflush(stdout);
}

int main(int argc, char **argv)
{
	uint64_t size = 2 << 20, h[2], again[2];
	const char *node = NULL;
	int wait = 0, i, ret;
	uint32_t bo;
	ualink_dev *dev;

	for (i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--wait"))
			wait = 1;
		else if (!node)
			node = argv[i];
		else
			size = strtoull(argv[i], NULL, 0);
	}
	if (!node) {
		fprintf(stderr, "usage: %s <render-node> [size] [--wait]\n", argv[0]);
		return 2;
	}

	/* Every call returns 0 or -errno. */
	ret = ualink_open(node, &dev);
	if (ret) {
		fprintf(stderr, "open %s: %s\n", node, strerror(-ret));
		return 1;
	}
	/* Only BOs whose preferred domains include VRAM can be exported. */
	ret = ualink_bo_create(dev, size, 4096, AMDGPU_GEM_DOMAIN_VRAM, 0, &bo);
	if (ret) {
		fprintf(stderr, "GEM_CREATE: %s\n", strerror(-ret));
		goto out;
	}
	ret = ualink_export(dev, bo, h);
	if (ret) {
		fprintf(stderr, "UALINK export: %s\n", strerror(-ret));
		goto out;
	}
	print_handle(h);

	/* Exporting the same BO again returns the same handle. */
	ret = ualink_export(dev, bo, again);
	if (ret) {
		fprintf(stderr, "UALINK re-export: %s\n", strerror(-ret));
		goto out;
	}
	printf("re-export: %s\n",
	       again[0] == h[0] && again[1] == h[1] ? "same handle" : "DIFFERENT handle");
	if (again[0] != h[0] || again[1] != h[1])
		ret = -1;

	if (wait && ret == 0) {
		print_handle(h);
		while (getchar() != EOF)	/* hold the export until stdin closes */
			;
	}
out:
	ualink_close(dev);	/* drops the GEM handle, and with it the export */
	return ret ? 1 : 0;
}
