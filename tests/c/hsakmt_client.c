/*
 * An unmodified libhsakmt client (Debian's libhsakmt 5.2.3), run through libualink_shim.so
 * against a node by tests/integration/test_hsakmt.py (issue 14, "Acceptance with the real
 * thing"; spec userspace-surface §3.3).  Prints `ok <step> k=v ...` per step and stops at
 * the first `fail <step> status=N`; the exit status is the number of the failed step.
 *
 * Steps: open the KFD, its version, the topology snapshot (a CPU node and one GPU node per
 * accel), each GPU's node and memory properties, then VRAM and system memory allocations
 * mapped to the GPU, a GPU store and load of them through the render node (pwrite/pread at
 * the GPU VA, the emulator's GPU), free, a signal event set and waited for, close.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <hsakmt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kmt_check.h"
#include "render_fd.h"

/* A GPU store of `pattern` at `va` and a load back, through that file's emulated GPU. */
static int gpu_store_load(int minor, uint64_t va, size_t size, unsigned char pattern)
{
	int fd = acquired_render_fd(minor);
	unsigned char *buf = malloc(size), *back = malloc(size);
	int ok;

	ok = fd >= 0 && buf && back;

	if (ok) {
		ssize_t w, r = -1;

		memset(buf, pattern, size);
		w = pwrite(fd, buf, size, (off_t)va);
		if (w == (ssize_t)size)
			r = pread(fd, back, size, (off_t)va);
		ok = r == (ssize_t)size && memcmp(buf, back, size) == 0;
		if (!ok)
			printf("info gpu_access fd=%d stored=%zd loaded=%zd errno=%d\n", fd, w, r,
			       errno);
	} else {
		printf("info gpu_access no_device_fd fd=%d\n", fd);
	}
	free(buf);
	free(back);
	return ok;
}

/* The node's GEM objects on renderD<minor>: lines of its debugfs table gem_objects. */
static int gem_objects(int minor)
{
	const char *dri = getenv("UALINK_DRI_DIR");
	char path[4096], line[512];
	int n = 0;
	FILE *f;

	if (!dri)
		return -1;
	snprintf(path, sizeof(path), "%s/../sys/kernel/debug/dri/%d/gem_objects", dri, minor);
	f = fopen(path, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		n += line[0] != '\n';
	fclose(f);
	return n;
}

int main(void)
{
	HsaVersionInfo ver;
	HsaSystemProperties sys;
	uint32_t gpu = 0;

	CHECK("open_kfd", hsaKmtOpenKFD());
	printf("ok open_kfd\n");
	CHECK("get_version", hsaKmtGetVersion(&ver));
	printf("ok get_version major=%u minor=%u\n", ver.KernelInterfaceMajorVersion,
	       ver.KernelInterfaceMinorVersion);
	CHECK("system_properties", hsaKmtAcquireSystemProperties(&sys));
	printf("ok system_properties nodes=%u\n", sys.NumNodes);
	for (uint32_t n = 0; n < sys.NumNodes; n++) {
		HsaNodeProperties p;
		CHECK("node_properties", hsaKmtGetNodeProperties(n, &p));
		printf("ok node_properties node=%u cpu_cores=%u simds=%u device_id=%u "
		       "location_id=%u render_minor=%d banks=%u gfx=%u.%u.%u\n", n, p.NumCPUCores,
		       p.NumFComputeCores, p.DeviceId, p.LocationId,
		       p.DrmRenderMinor, p.NumMemoryBanks, p.EngineId.ui32.Major,
		       p.EngineId.ui32.Minor, p.EngineId.ui32.Stepping);
		if (p.NumFComputeCores && !gpu)
			gpu = n;
		if (p.NumMemoryBanks) {
			HsaMemoryProperties m[8];
			uint32_t k = p.NumMemoryBanks < 8 ? p.NumMemoryBanks : 8;
			CHECK("memory_properties", hsaKmtGetNodeMemoryProperties(n, k, m));
			for (uint32_t i = 0; i < k; i++)
				printf("ok memory_properties node=%u bank=%u heap=%d size=%" PRIu64 "\n",
				       n, i, (int)m[i].HeapType, m[i].SizeInBytes);
		}
	}
	if (!gpu) {
		printf("fail no_gpu_node\n");
		return 100;
	}
	{
		HsaNodeProperties p;
		HsaMemFlags vram = {0}, sysmem = {0};
		void *va = NULL, *host = NULL;
		uint64_t alt = 0;
		size_t size = 2 << 20;

		CHECK("node_properties", hsaKmtGetNodeProperties(gpu, &p));

		vram.ui32.PageSize = HSA_PAGE_SIZE_4KB;
		vram.ui32.NonPaged = 1;
		vram.ui32.NoSubstitute = 1;
		CHECK("alloc_vram", hsaKmtAllocMemory(gpu, size, vram, &va));
		printf("ok alloc_vram va=%p\n", va);
		CHECK("map_vram", hsaKmtMapMemoryToGPU(va, size, &alt));
		printf("ok map_vram\n");
		step++;
		if (!gpu_store_load(p.DrmRenderMinor, (uint64_t)(uintptr_t)va, size, 0x5a)) {
			printf("fail gpu_store_load_vram\n");
			return step;
		}
		printf("ok gpu_store_load_vram\n");

		sysmem.ui32.PageSize = HSA_PAGE_SIZE_4KB;
		sysmem.ui32.HostAccess = 1;
		sysmem.ui32.NonPaged = 1;
		CHECK("alloc_system", hsaKmtAllocMemory(0, size, sysmem, &host));
		memset(host, 0xa5, size); /* the CPU pointer works */
		printf("ok alloc_system ptr=%p\n", host);
		CHECK("map_system", hsaKmtMapMemoryToGPU(host, size, &alt));
		printf("ok map_system\n");
		step++;
		if (!gpu_store_load(p.DrmRenderMinor, (uint64_t)(uintptr_t)host, size, 0x3c) ||
		    ((unsigned char *)host)[size - 1] != 0x3c) {
			printf("fail gpu_store_load_system\n");
			return step;
		}
		printf("ok gpu_store_load_system\n");

		CHECK("unmap_vram", hsaKmtUnmapMemoryToGPU(va));
		CHECK("free_vram", hsaKmtFreeMemory(va, size));
		CHECK("unmap_system", hsaKmtUnmapMemoryToGPU(host));
		CHECK("free_system", hsaKmtFreeMemory(host, size));
		printf("ok free\n");
	}
	{
		/* A signal event: set from the CPU, seen by the next wait (auto-reset). */
		HsaEventDescriptor desc = {.EventType = HSA_EVENTTYPE_SIGNAL, .NodeId = gpu};
		HsaEvent *ev = NULL;
		HSAKMT_STATUS s;

		CHECK("create_event", hsaKmtCreateEvent(&desc, false, false, &ev));
		printf("ok create_event id=%u\n", ev->EventId);
		s = hsaKmtWaitOnEvent(ev, 0);
		step++;
		if (s != HSAKMT_STATUS_WAIT_TIMEOUT) {
			printf("fail wait_unsignaled status=%d\n", (int)s);
			return step;
		}
		CHECK("set_event", hsaKmtSetEvent(ev));
		CHECK("wait_event", hsaKmtWaitOnEvent(ev, 1000));
		printf("ok wait_event\n");
		CHECK("destroy_event", hsaKmtDestroyEvent(ev));
	}
	{
		/*
		 * A compute queue on memory the GPU VM does not map (a malloc'd ring, the
		 * pointers on the stack): CREATE_QUEUE refuses it (EINVAL), so hsaKmtCreateQueue
		 * fails with the status libhsakmt gives any failed CREATE_QUEUE, having freed
		 * the EOP / CWSR buffers it allocated first (the VRAM left is the same).
		 */
		HsaQueueResource res = {0};
		uint64_t rwptr[2] = {0, 0};
		HsaNodeProperties p;
		int before, after;
		void *ring = NULL;
		HSAKMT_STATUS s;

		if (posix_memalign(&ring, 4096, 4096))
			return 101;
		memset(ring, 0, 4096);
		res.QueueRptrValue = (uintptr_t)&rwptr[0];
		res.QueueWptrValue = (uintptr_t)&rwptr[1];
		CHECK("node_properties", hsaKmtGetNodeProperties(gpu, &p));
		before = gem_objects(p.DrmRenderMinor);
		s = hsaKmtCreateQueue(gpu, HSA_QUEUE_COMPUTE_AQL, 100, HSA_QUEUE_PRIORITY_NORMAL,
				      ring, 4096, NULL, &res);
		after = gem_objects(p.DrmRenderMinor);
		printf("ok create_queue status=%d gem_before=%d gem_after=%d\n", (int)s, before,
		       after);
		free(ring);
	}
	CHECK("release_system_properties", hsaKmtReleaseSystemProperties());
	CHECK("close_kfd", hsaKmtCloseKFD());
	printf("ok close_kfd\n");
	return 0;
}
