/*
 * fabric_sdma: AMD's two-node UALink fabric test, with the APIs Debian has (issue 30,
 * "Tests that must exist": two nodes), run through the shim by
 * tests/integration/test_fabric_sdma.py. Public APIs only: Debian's libdrm_amdgpu 2.4.114,
 * libhsakmt 5.2.3, and the UALink handle ioctl of the patch series' uAPI
 * (include/ualink/ualink_drm.h).
 *
 *   fabric_sdma export [bytes]
 *       the exporter: a VRAM BO (libdrm; 4 MiB unless `bytes` says), its bytes written through the CPU mapping,
 *       the UALink EXPORT; prints the handle, then serves stdin lines:
 *         check <offset> <size> <seed>   the BO holds pattern(seed) there? (its own
 *                                         CPU mapping: what the importer's SDMA stored)
 *         free                            unmap, close the BO (the import is revoked)
 *   fabric_sdma import <lo> <hi>
 *       the importer: hsaKmtOpenKFD (which ACQUIRE_VMs the render file), an SDMA queue
 *       (hsaKmtCreateQueue(HSA_QUEUE_SDMA), packets as ROCr's BlitSdmaV4 writes them:
 *       the HDP-flush POLL_REGMEM, COPY_LINEAR chunks, a FENCE), then, on that render file,
 *       the UALink IMPORT, PRIME_FD_TO_HANDLE and GEM_VA of the imported BO (what newer
 *       libhsakmt's hsaKmtMemoryVaMap does); the SDMA queue copies remote->host (bytes
 *       checked against the exporter's pattern) and host->remote; then waits for a stdin
 *       line ("again") and copies remote->host once more, which after the exporter freed
 *       the BO must fault: the fence never comes, the KFD's memory event fires.
 *   fabric_sdma copies <lo> <hi> <bytes>
 *       the importer of a `bytes` BO (`export <bytes>`), as `import` sets it up, then one
 *       SDMA copy remote->host per stdin line `copy <offset> <size>` (the BO's bytes from
 *       offset into a host buffer filled with 0xEE, at the same offset): `ok copy equal=1`
 *       when the host buffer holds pattern(1) there and 0xEE around it; a copy not fenced
 *       within 10 s is a fault: `ok fault memory_event=1 fault_va=...`, and no more copies
 *       (the queue stopped in error).
 *
 * Output: ok <step> key=value ...  |  fail <step> ... (exit status = step number).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <hsakmt.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <amdgpu.h>
#include <amdgpu_drm.h>
#include <xf86drm.h>

#include "ualink/ualink_drm.h" /* only its UALink part: amdgpu_drm.h came first */
#include "fabric_pattern.h"
#include "render_fd.h"
#include "sdma_ring.h" /* the ring and its packets; its `step` is the one counted here */
#include "ualink_import.h"

#define BO_SIZE (4u << 20)
#define RING_BYTES (1u << 20) /* the importer's ring (sdma_ring.h's RING_SIZE: 4 KiB) */
#define STORE_OFFSET (1u << 20) /* where the importer stores, inside the BO */
#define STORE_SIZE (1u << 20)

#define FAIL(name, fmt, ...)                                                      \
	do {                                                                      \
		printf("fail %s " fmt "\n", name, ##__VA_ARGS__);                 \
		fflush(stdout);                                                   \
		exit(step ? step : 1);                                            \
	} while (0)
#define KMT(name, call)                                                           \
	do {                                                                      \
		HSAKMT_STATUS s_ = (call);                                        \
		step++;                                                           \
		if (s_ != HSAKMT_STATUS_SUCCESS)                                  \
			FAIL(name, "status=%d", (int)s_);                         \
	} while (0)
#define SYS(name, call)                                                           \
	do {                                                                      \
		int r_ = (call);                                                  \
		step++;                                                           \
		if (r_ != 0)                                                      \
			FAIL(name, "ret=%d errno=%d", r_, errno);                 \
	} while (0)

/* ---------------------------------------------------------------- exporter */
static int do_export(size_t bo_size)
{
	struct amdgpu_bo_alloc_request req = {
		.alloc_size = bo_size, .phys_alignment = 4096,
		.preferred_heap = AMDGPU_GEM_DOMAIN_VRAM,
		.flags = AMDGPU_GEM_CREATE_CPU_ACCESS_REQUIRED,
	};
	union drm_amdgpu_ualink_handle u;
	amdgpu_device_handle dev;
	amdgpu_bo_handle bo;
	uint32_t major, minor, kms;
	uint8_t *cpu = NULL, *want;
	char line[128];
	int fd = open("/dev/dri/renderD128", O_RDWR | O_CLOEXEC);

	if (fd < 0)
		FAIL("open", "errno=%d", errno);
	SYS("init", amdgpu_device_initialize(fd, &major, &minor, &dev));
	close(fd);
	fd = amdgpu_device_get_fd(dev);
	SYS("bo_alloc", amdgpu_bo_alloc(dev, &req, &bo));
	SYS("cpu_map", amdgpu_bo_cpu_map(bo, (void **)&cpu));
	pattern(cpu, bo_size, 1);
	SYS("export_kms", amdgpu_bo_export(bo, amdgpu_bo_handle_type_kms, &kms));
	memset(&u, 0, sizeof(u));
	u.in.op = DRM_AMDGPU_UALINK_HANDLE_OP_EXPORT;
	u.in.gem_handle = kms;
	SYS("export", drmCommandWriteRead(fd, DRM_AMDGPU_UALINK_HANDLE, &u, sizeof(u)));
	printf("ok export lo=%#" PRIx64 " hi=%#" PRIx64 " size=%zu seed=1\n",
	       (uint64_t)u.out.export_ualink_handle[0], (uint64_t)u.out.export_ualink_handle[1],
	       bo_size);
	want = malloc(bo_size);
	while (fgets(line, sizeof(line), stdin)) {
		unsigned long off, size, seed;

		if (sscanf(line, "check %lu %lu %lu", &off, &size, &seed) == 3 &&
		    off + size <= bo_size && cpu) {
			pattern(want, size, (uint32_t)seed);
			printf("ok check equal=%d\n", memcmp(cpu + off, want, size) == 0);
		} else if (strncmp(line, "free", 4) == 0 && cpu) {
			SYS("cpu_unmap", amdgpu_bo_cpu_unmap(bo));
			SYS("bo_free", amdgpu_bo_free(bo));
			cpu = NULL;
			printf("ok freed\n");
		}
	}
	free(want);
	if (cpu) {
		amdgpu_bo_cpu_unmap(bo);
		amdgpu_bo_free(bo);
	}
	amdgpu_device_deinitialize(dev);
	printf("ok done\n");
	return 0;
}

/* ---------------------------------------------------------------- importer */
/* copy + fence, the fence at `sig`: seconds until the fence, or -1 after `timeout` seconds */
static double sdma_copy(struct queue *q, volatile uint32_t *sig, uint64_t dst, uint64_t src,
			uint64_t size, double timeout)
{
	static uint32_t value;
	double t0 = now_s();

	value++;
	if (!(hdp_flush(q) && copy(q, dst, src, size) && fence(q, sig, value)))
		return -1; /* no room in the ring within 10 s */
	ring_doorbell(q);
	return wait_value(sig, value, timeout) ? now_s() - t0 : -1;
}

/* What both importing modes set up: an SDMA queue on system memory (ROCr's system
   allocator: its ring, a fence and a host buffer of `bo_size`), a memory event for the
   queue's faults, and the handle imported on the render file libhsakmt acquired the VM
   with, mapped at a GPU VA nobody else uses. Exits with the failing step's number. */
struct importer {
	struct queue q;
	volatile uint32_t *sig;
	uint8_t *host;
	HsaEvent *memev;
	uint64_t remote;
	uint32_t handle;
	int fd;
};

static void set_up_importer(uint64_t lo, uint64_t hi, size_t bo_size, struct importer *im)
{
	HsaNodeProperties p;
	HsaMemFlags sysmem = {0};
	HsaEventDescriptor mdesc = {.EventType = HSA_EVENTTYPE_MEMORY};
	uint32_t gpu = 0;
	uint64_t alt;
	const char *failed;
	void *hole;

	memset(im, 0, sizeof(*im));
	if (open_kfd_gpu(&gpu, &p))
		exit(step);
	sysmem.ui32.PageSize = HSA_PAGE_SIZE_4KB;
	sysmem.ui32.HostAccess = 1;
	KMT("alloc_ring", hsaKmtAllocMemory(0, RING_BYTES, sysmem, (void **)&im->q.ring));
	KMT("map_ring", hsaKmtMapMemoryToGPU(im->q.ring, RING_BYTES, &alt));
	KMT("alloc_fence", hsaKmtAllocMemory(0, 4096, sysmem, (void **)&im->sig));
	KMT("map_fence", hsaKmtMapMemoryToGPU((void *)im->sig, 4096, &alt));
	KMT("alloc_host", hsaKmtAllocMemory(0, bo_size, sysmem, (void **)&im->host));
	KMT("map_host", hsaKmtMapMemoryToGPU(im->host, bo_size, &alt));
	memset(im->q.ring, 0, RING_BYTES);
	im->q.size = RING_BYTES;
	*im->sig = 0;
	KMT("create_queue", hsaKmtCreateQueue(gpu, HSA_QUEUE_SDMA, 100, HSA_QUEUE_PRIORITY_MAXIMUM,
					       im->q.ring, RING_BYTES, NULL, &im->q.res));
	printf("ok create_queue id=%" PRIu64 "\n", (uint64_t)im->q.res.QueueId);
	mdesc.NodeId = gpu;
	KMT("memory_event", hsaKmtCreateEvent(&mdesc, true, false, &im->memev));
	im->fd = acquired_render_fd(p.DrmRenderMinor);
	step++;
	if (im->fd < 0)
		FAIL("render_fd", "minor=%d", p.DrmRenderMinor);
	/* (a CPU reservation, 2 MiB aligned, that nothing else will map) */
	hole = mmap(NULL, bo_size + (2u << 20), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS |
		    MAP_NORESERVE, -1, 0);
	step++;
	if (hole == MAP_FAILED)
		FAIL("reserve_va", "errno=%d", errno);
	im->remote = ((uint64_t)(uintptr_t)hole + (2u << 20) - 1) & ~(uint64_t)((2u << 20) - 1);
	failed = import_and_map(im->fd, lo, hi, im->remote, bo_size, &im->handle);
	step++;
	if (failed)
		FAIL(failed, "errno=%d", errno);
	printf("ok import va=%#" PRIx64 " size=%zu\n", im->remote, bo_size);
}

static int do_import(uint64_t lo, uint64_t hi)
{
	struct importer im;
	struct drm_amdgpu_gem_va gva;
	uint8_t *want;
	char line[64];
	double secs;

	alarm(120);
	set_up_importer(lo, hi, BO_SIZE, &im);

	/* remote -> host: the exporter's bytes, over the fabric, by the SDMA engine */
	memset(im.host, 0, BO_SIZE);
	secs = sdma_copy(&im.q, im.sig, (uint64_t)(uintptr_t)im.host, im.remote, BO_SIZE, 30);
	step++;
	if (secs < 0)
		FAIL("copy_remote_to_host", "no fence after 30 s");
	want = malloc(BO_SIZE);
	pattern(want, BO_SIZE, 1);
	step++;
	if (memcmp(im.host, want, BO_SIZE) != 0)
		FAIL("remote_bytes", "differ");
	printf("ok copy_remote_to_host size=%u seconds=%.6f\n", BO_SIZE, secs);

	/* host -> remote: the exporter checks them in its own memory */
	pattern(im.host, STORE_SIZE, 2);
	secs = sdma_copy(&im.q, im.sig, im.remote + STORE_OFFSET, (uint64_t)(uintptr_t)im.host,
			 STORE_SIZE, 30);
	step++;
	if (secs < 0)
		FAIL("copy_host_to_remote", "no fence after 30 s");
	printf("ok copy_host_to_remote offset=%u size=%u seed=2 seconds=%.6f\n", STORE_OFFSET,
	       STORE_SIZE, secs);

	/* the test frees the exporter's BO, then says "again": the next access faults */
	if (!fgets(line, sizeof(line), stdin))
		FAIL("again", "stdin closed");
	secs = sdma_copy(&im.q, im.sig, (uint64_t)(uintptr_t)im.host, im.remote, 4096, 5);
	step++;
	if (secs >= 0)
		FAIL("revoked_copy", "completed in %.6f s", secs);
	{
		HSAKMT_STATUS s = hsaKmtWaitOnEvent(im.memev, 5000);
		HsaMemoryAccessFault *f = &im.memev->EventData.EventData.MemoryAccessFault;

		printf("ok revoked_copy fenced=0 memory_event=%d fault_va=%#" PRIx64 "\n",
		       s == HSAKMT_STATUS_SUCCESS, s == HSAKMT_STATUS_SUCCESS ?
		       (uint64_t)f->VirtualAddress : 0);
	}
	KMT("destroy_queue", hsaKmtDestroyQueue(im.q.res.QueueId));
	memset(&gva, 0, sizeof(gva));
	gva.handle = im.handle;
	gva.operation = AMDGPU_VA_OP_UNMAP;
	gva.flags = AMDGPU_VM_PAGE_READABLE | AMDGPU_VM_PAGE_WRITEABLE;
	gva.va_address = im.remote;
	gva.map_size = BO_SIZE;
	drmCommandWriteRead(im.fd, DRM_AMDGPU_GEM_VA, &gva, sizeof(gva));
	{
		struct drm_gem_close c = {.handle = im.handle};
		drmIoctl(im.fd, DRM_IOCTL_GEM_CLOSE, &c);
	}
	KMT("destroy_event", hsaKmtDestroyEvent(im.memev));
	hsaKmtUnmapMemoryToGPU(im.host);
	hsaKmtFreeMemory(im.host, BO_SIZE);
	hsaKmtUnmapMemoryToGPU((void *)im.sig);
	hsaKmtFreeMemory((void *)im.sig, 4096);
	hsaKmtUnmapMemoryToGPU(im.q.ring);
	hsaKmtFreeMemory(im.q.ring, RING_BYTES);
	KMT("close_kfd", hsaKmtCloseKFD());
	free(want);
	printf("ok done\n");
	return 0;
}

static int do_copies(uint64_t lo, uint64_t hi, size_t bo_size)
{
	struct importer im;
	uint8_t *want;
	char line[128];

	alarm(300);
	set_up_importer(lo, hi, bo_size, &im);
	want = malloc(bo_size);
	pattern(want, bo_size, 1);
	while (fgets(line, sizeof(line), stdin)) {
		unsigned long off, size;
		double secs;
		int equal;

		if (sscanf(line, "copy %lu %lu", &off, &size) != 2 || size == 0 ||
		    off + size > bo_size) {
			printf("fail copy bad line\n");
			continue;
		}
		memset(im.host, 0xEE, bo_size);
		secs = sdma_copy(&im.q, im.sig, (uint64_t)(uintptr_t)im.host + off, im.remote + off,
				 size, 10);
		if (secs < 0) {
			HSAKMT_STATUS s = hsaKmtWaitOnEvent(im.memev, 5000);
			HsaMemoryAccessFault *f = &im.memev->EventData.EventData.MemoryAccessFault;

			printf("ok fault memory_event=%d fault_va=%#" PRIx64 "\n",
			       s == HSAKMT_STATUS_SUCCESS, s == HSAKMT_STATUS_SUCCESS ?
			       (uint64_t)f->VirtualAddress : 0);
			break;
		}
		equal = memcmp(im.host + off, want + off, size) == 0;
		for (size_t i = 0; i < bo_size && equal; i += 4093)  /* (around it: untouched) */
			if ((i < off || i >= off + size) && im.host[i] != 0xEE)
				equal = 0;
		if ((off && im.host[off - 1] != 0xEE) ||
		    (off + size < bo_size && im.host[off + size] != 0xEE))
			equal = 0;
		printf("ok copy equal=%d seconds=%.6f\n", equal, secs);
	}
	free(want);
	printf("ok done\n");
	return 0;  /* (the process's exit frees the rest: what the daemon must clean up) */
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if ((argc == 2 || argc == 3) && strcmp(argv[1], "export") == 0)
		return do_export(argc == 3 ? strtoull(argv[2], NULL, 0) : BO_SIZE);
	if (argc == 4 && strcmp(argv[1], "import") == 0)
		return do_import(strtoull(argv[2], NULL, 0), strtoull(argv[3], NULL, 0));
	if (argc == 5 && strcmp(argv[1], "copies") == 0)
		return do_copies(strtoull(argv[2], NULL, 0), strtoull(argv[3], NULL, 0),
				 strtoull(argv[4], NULL, 0));
	fprintf(stderr, "usage: fabric_sdma export [bytes] | import <lo> <hi> | "
		"copies <lo> <hi> <bytes>\n");
	return 2;
}
