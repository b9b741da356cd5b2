/*
 * An SDMA queue copying remote (UALink-imported) memory, the flow of AMD's two-node fabric
 * test with the APIs Debian has (issue 30, "Tests that must exist"; spec userspace-surface
 * §3.3 steps 7-8, §8), run through libualink_shim.so by
 * tests/integration/test_hsakmt_queues.py on the importer's node:
 *
 *   hsakmt_sdma_fabric <handle lo> <handle hi> <size>
 *
 * libhsakmt 5.2.3 opens the KFD and makes an SDMA queue; the exporter's handle is
 * imported (the UALink IMPORT ioctl, a dma-buf fd) and the BO mapped into the KFD
 * process's GPU VM with GEM_VA on the render fd libhsakmt acquired (as newer libhsakmt's
 * hsaKmtMemoryVaMap does), through Debian's libdrm. The queue copies remote -> host (the
 * bytes checked against the exporter's pattern) and host -> remote; then, after a
 * newline on stdin (the exporter has freed its BO meanwhile), the next remote copy must
 * fault: its fence never lands and nothing hangs.  Output: `ok <step> ...` / `fail <step>`.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <amdgpu_drm.h>
#include <xf86drm.h>

#include "ualink/ualink_drm.h" /* only its UALink part: amdgpu_drm.h came first */
#include "render_fd.h"
#include "sdma_ring.h"
#include "ualink_import.h"

#define REMOTE_VA 0x600000000000ull /* in the GPUVM aperture, clear of libhsakmt's areas */

static unsigned char pattern(size_t i)
{
	return (unsigned char)(i * 13 + 5);
}

int main(int argc, char **argv)
{
	HsaNodeProperties props;
	HsaMemFlags sysmem = {0};
	uint32_t gpu = 0, kms = 0;
	struct queue q;
	uint64_t alt = 0, size;
	void *host = NULL;
	volatile uint32_t *sig;
	const char *failed;
	int fd, r;

	if (argc != 4)
		return 100;
	size = strtoull(argv[3], NULL, 0);
	if ((r = open_kfd_gpu(&gpu, &props)))
		return r;
	EXPECT("create_queue", create_queue(gpu, &q));
	fd = acquired_render_fd(props.DrmRenderMinor);
	EXPECT("acquired_render_fd", fd >= 0);

	/* UALink IMPORT -> a dma-buf fd -> a GEM handle of the acquired file -> GEM_VA */
	failed = import_and_map(fd, strtoull(argv[1], NULL, 0), strtoull(argv[2], NULL, 0),
				REMOTE_VA, size, &kms);
	EXPECT(failed ? failed : "import", !failed);

	sysmem.ui32.PageSize = HSA_PAGE_SIZE_4KB;
	sysmem.ui32.HostAccess = 1;
	sysmem.ui32.NonPaged = 1;
	CHECK("alloc_system", hsaKmtAllocMemory(0, size + 4096, sysmem, &host));
	CHECK("map_system", hsaKmtMapMemoryToGPU(host, size + 4096, &alt));
	sig = (volatile uint32_t *)((char *)host + size);
	memset(host, 0, size + 4096);

	/* remote -> host: the exporter's pattern */
	{
		double t0 = now_s(), t1;
		size_t bad = 0;

		EXPECT("submit_r2h", hdp_flush(&q) && copy(&q, (uintptr_t)host, REMOTE_VA, size) &&
		       fence(&q, sig, 1));
		ring_doorbell(&q);
		EXPECT("fence_r2h", wait_value(sig, 1, 60));
		t1 = now_s();
		for (size_t i = 0; i < size; i++)
			bad += ((unsigned char *)host)[i] != pattern(i);
		printf("ok r2h_rate bytes=%" PRIu64 " mib_s=%.0f\n", size,
		       size / (t1 - t0) / (1 << 20));
		EXPECT("r2h_bytes", bad == 0);
	}
	/* host -> remote: the complement, which the exporter then reads in its own memory */
	for (size_t i = 0; i < size; i++)
		((unsigned char *)host)[i] = (unsigned char)~pattern(i);
	EXPECT("submit_h2r", copy(&q, REMOTE_VA, (uintptr_t)host, size) && fence(&q, sig, 2));
	ring_doorbell(&q);
	EXPECT("fence_h2r", wait_value(sig, 2, 60));
	printf("ok stored\n");
	fflush(stdout);

	/* the exporter frees its BO: the next access to the import is a GPU page fault */
	(void)getchar();
	EXPECT("submit_after_revoke", copy(&q, (uintptr_t)host, REMOTE_VA, 4096) &&
	       fence(&q, sig, 3));
	ring_doorbell(&q);
	EXPECT("revoked_faults", !wait_value(sig, 3, 2));
	CHECK("destroy_queue", hsaKmtDestroyQueue(q.res.QueueId));
	CHECK("close_kfd", hsaKmtCloseKFD());
	printf("ok done\n");
	return 0;
}
