/* SPDX-License-Identifier: MIT */
/*
 * libdrm_bo: buffer objects and syncobjs on one node through the public API
 * of Debian's libdrm / libdrm_amdgpu (2.4.114) only, each check naming the
 * libdrm function it follows.  The "GPU" of a ualinkd render node loads and
 * stores by pread/pwrite at a GPU VA on the device fd (DESIGN.md, "GPU loads
 * and stores"); that is the one thing here a real GPU would do with a shader.
 * Run under libualink_shim.so by tests/integration/test_libdrm.py:
 *
 *   ok <step> key=value ...     as on real amdgpu hardware
 *   fail <step> err=<n> ...     the first step that failed (exit status 1)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <amdgpu.h>
#include <amdgpu_drm.h>
#include <xf86drm.h>

#include "libdrm_check.h"

#define BO_SIZE (2u << 20)

static int cloexec(int fd)
{
	int flags = fcntl(fd, F_GETFD);

	return flags < 0 ? -1 : !!(flags & FD_CLOEXEC);
}

/* drm.h of Linux 6.6 (DRM_IOCTL_SYNCOBJ_EVENTFD); libdrm 2.4.114 has no wrapper. */
struct syncobj_eventfd {
	uint32_t handle;
	uint32_t flags;
	uint64_t point;
	int32_t fd;
	uint32_t pad;
};
#define SYNCOBJ_EVENTFD DRM_IOWR(0xCF, struct syncobj_eventfd)

/* A GPU store then a GPU load of n bytes at va: what a shader would do. */
static void gpu_roundtrip(int fd, uint64_t va, const char *pattern, const char *step)
{
	char back[64];
	size_t n = strlen(pattern);

	if (pwrite(fd, pattern, n, (off_t)va) != (ssize_t)n)
		fail(step, errno);
	memset(back, 0, sizeof(back));
	if (pread(fd, back, n, (off_t)va) != (ssize_t)n)
		fail(step, errno);
	expect(memcmp(back, pattern, n) == 0, step);
	printf("ok %s va=%#" PRIx64 " bytes=%zu\n", step, va, n);
}

/* ---- CPU mapping (amdgpu_bo_cpu_map) -----------------------------------------
 * amdgpu_bo_cpu_map (GEM_MMAP, then a shared mmap of the device fd at its offset) of
 * the VRAM BO mapped at va: one memory for the CPU mapping and GPU loads and stores
 * (README "CPU mappings"), so what the GPU stored before the map reads through it, a
 * CPU store is what a GPU load at its VA reads, and a GPU store shows in the mapping;
 * amdgpu_bo_cpu_unmap.  (A remote importer's side: tests/c/cpu_map.c.) */
static void cpu_map_checks(int fd, amdgpu_bo_handle bo, uint64_t va, const char *before)
{
	static const char by_cpu[] = "stored by the CPU";
	static const char by_gpu[] = "stored by the GPU, read by the CPU";
	char back[sizeof(by_cpu)];
	char *cpu;

	check(amdgpu_bo_cpu_map(bo, (void **)&cpu), "cpu_map");
	expect(memcmp(cpu, before, strlen(before)) == 0, "cpu_map");
	memcpy(cpu + 4096, by_cpu, sizeof(by_cpu));
	memset(back, 0, sizeof(back));
	if (pread(fd, back, sizeof(back), (off_t)(va + 4096)) != (ssize_t)sizeof(back))
		fail("cpu_map", errno);
	expect(memcmp(back, by_cpu, sizeof(by_cpu)) == 0, "cpu_map");
	if (pwrite(fd, by_gpu, sizeof(by_gpu), (off_t)(va + 8192)) != (ssize_t)sizeof(by_gpu))
		fail("cpu_map", errno);
	expect(memcmp(cpu + 8192, by_gpu, sizeof(by_gpu)) == 0, "cpu_map");
	check(amdgpu_bo_cpu_unmap(bo), "cpu_unmap");
	printf("ok cpu_map gpu_before=1 cpu_to_gpu=1 gpu_to_cpu=1\n");
}

static void syncobjs(amdgpu_device_handle dev)
{
	uint32_t bin, linked, from_file, timeline, first;
	uint64_t point, value;
	struct syncobj_eventfd ev;
	int sfd, sync_file, efd, ret;

	/* amdgpu_cs_create_syncobj2 / _signal / _wait / _reset (binary) */
	check(amdgpu_cs_create_syncobj2(dev, 0, &bin), "syncobj_create");
	ret = amdgpu_cs_syncobj_wait(dev, &bin, 1, 0, 0, &first);
	printf("ok syncobj_unsignaled ret=%d\n", ret);
	check(amdgpu_cs_syncobj_signal(dev, &bin, 1), "syncobj_signal");
	check(amdgpu_cs_syncobj_wait(dev, &bin, 1, INT64_MAX, 0, &first), "syncobj_wait");
	printf("ok syncobj_wait first=%u\n", first);
	check(amdgpu_cs_syncobj_reset(dev, &bin, 1), "syncobj_reset");

	/* amdgpu_cs_export_syncobj (SYNCOBJ_HANDLE_TO_FD): a real fd, close-on-exec as the
	 * kernel's drm_syncobj_get_fd makes it; amdgpu_cs_import_syncobj (FD_TO_HANDLE): a
	 * new handle to the same syncobj */
	check(amdgpu_cs_export_syncobj(dev, bin, &sfd), "syncobj_export");
	{
		struct stat st;

		check(fstat(sfd, &st), "syncobj_export_fstat");
	}
	printf("ok syncobj_export fd_valid=%d cloexec=%d\n", sfd >= 0, cloexec(sfd));
	check(amdgpu_cs_import_syncobj(dev, sfd, &linked), "syncobj_import");
	check(amdgpu_cs_syncobj_signal(dev, &linked, 1), "syncobj_import_signal");
	ret = amdgpu_cs_syncobj_wait(dev, &bin, 1, 0, 0, &first);
	printf("ok syncobj_import distinct=%d shared=%d\n", linked != bin, ret == 0);
	close(sfd);

	/* amdgpu_cs_syncobj_export_sync_file (EXPORT_SYNC_FILE) and _import_sync_file
	 * (IMPORT_SYNC_FILE): the fence of a signaled syncobj moves through a sync_file fd */
	check(amdgpu_cs_syncobj_export_sync_file(dev, bin, &sync_file), "sync_file_export");
	printf("ok sync_file_export fd_valid=%d cloexec=%d\n", sync_file >= 0,
	       cloexec(sync_file));
	check(amdgpu_cs_create_syncobj2(dev, 0, &from_file), "sync_file_create");
	check(amdgpu_cs_syncobj_import_sync_file(dev, from_file, sync_file), "sync_file_import");
	ret = amdgpu_cs_syncobj_wait(dev, &from_file, 1, 0, 0, &first);
	printf("ok sync_file_import signaled=%d\n", ret == 0);
	close(sync_file);

	/* timelines: amdgpu_cs_syncobj_timeline_signal / _query / _timeline_wait */
	check(amdgpu_cs_create_syncobj2(dev, 0, &timeline), "timeline_create");
	point = 3;
	check(amdgpu_cs_syncobj_timeline_signal(dev, &timeline, &point, 1), "timeline_signal");
	check(amdgpu_cs_syncobj_query(dev, &timeline, &value, 1), "timeline_query");
	check(amdgpu_cs_syncobj_timeline_wait(dev, &timeline, &point, 1, INT64_MAX,
					      DRM_SYNCOBJ_WAIT_FLAGS_WAIT_FOR_SUBMIT, &first),
	      "timeline_wait");
	printf("ok timeline point=%" PRIu64 "\n", value);
	/* amdgpu_cs_syncobj_transfer (SYNCOBJ_TRANSFER): binary → timeline point 5 */
	check(amdgpu_cs_syncobj_transfer(dev, timeline, 5, bin, 0, 0), "transfer");
	check(amdgpu_cs_syncobj_query(dev, &timeline, &value, 1), "transfer_query");
	printf("ok transfer point=%" PRIu64 "\n", value);

	/* SYNCOBJ_EVENTFD (drmIoctl: no libdrm wrapper in 2.4.114): a signaled point
	 * signals the eventfd at once, a later one when it is signaled */
	efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (efd < 0)
		fail("eventfd", errno);
	memset(&ev, 0, sizeof(ev));
	ev.handle = timeline;
	ev.point = 5;
	ev.fd = efd;
	check(drmIoctl(amdgpu_device_get_fd(dev), SYNCOBJ_EVENTFD, &ev), "eventfd_signaled");
	printf("ok eventfd_signaled read=%d\n", read(efd, &value, 8) == 8);
	ev.point = 7;
	check(drmIoctl(amdgpu_device_get_fd(dev), SYNCOBJ_EVENTFD, &ev), "eventfd_later");
	ret = read(efd, &value, 8) == 8;
	point = 7;
	check(amdgpu_cs_syncobj_timeline_signal(dev, &timeline, &point, 1), "eventfd_signal");
	printf("ok eventfd_later before=%d after=%d\n", ret, read(efd, &value, 8) == 8);
	close(efd);

	check(amdgpu_cs_destroy_syncobj(dev, timeline), "destroy");
	check(amdgpu_cs_destroy_syncobj(dev, from_file), "destroy");
	check(amdgpu_cs_destroy_syncobj(dev, linked), "destroy");
	check(amdgpu_cs_destroy_syncobj(dev, bin), "destroy");
	printf("ok syncobj_destroy\n");
}

int main(void)
{
	struct amdgpu_bo_alloc_request req = {
		.alloc_size = BO_SIZE,
		.phys_alignment = 4096,
		.preferred_heap = AMDGPU_GEM_DOMAIN_VRAM,
	};
	struct amdgpu_bo_metadata meta;
	struct amdgpu_bo_import_result imp;
	struct amdgpu_bo_info info;
	amdgpu_device_handle dev;
	amdgpu_bo_handle bo, ubo;
	amdgpu_va_handle vah, uvah;
	uint32_t major, minor, kms, shared;
	uint64_t va, uva;
	char back[16];
	void *user;
	int fd, dfd, dmabuf;

	setvbuf(stdout, NULL, _IOLBF, 0);

	fd = open("/dev/dri/renderD128", O_RDWR | O_CLOEXEC);
	if (fd < 0)
		fail("open", errno);
	check(amdgpu_device_initialize(fd, &major, &minor, &dev), "init");
	dfd = amdgpu_device_get_fd(dev);
	printf("ok init major=%u\n", major);

	/* amdgpu_bo_alloc (GEM_CREATE, VRAM) */
	check(amdgpu_bo_alloc(dev, &req, &bo), "bo_alloc");
	printf("ok bo_alloc size=%u\n", BO_SIZE);
	/* amdgpu_bo_export(kms): the GEM handle */
	check(amdgpu_bo_export(bo, amdgpu_bo_handle_type_kms, &kms), "export_kms");
	printf("ok export_kms handle=%u\n", kms);
	/* amdgpu_bo_export(dma_buf_fd) (PRIME_HANDLE_TO_FD, DRM_CLOEXEC|DRM_RDWR): a real fd */
	check(amdgpu_bo_export(bo, amdgpu_bo_handle_type_dma_buf_fd, &shared), "export_dmabuf");
	dmabuf = (int)shared;
	printf("ok export_dmabuf cloexec=%d size=%lld\n", cloexec(dmabuf),
	       (long long)lseek(dmabuf, 0, SEEK_END));
	/* amdgpu_bo_import(dma_buf_fd): the same GEM handle, so libdrm's same bo */
	check(amdgpu_bo_import(dev, amdgpu_bo_handle_type_dma_buf_fd, (uint32_t)dmabuf, &imp),
	      "import_dmabuf");
	printf("ok import_dmabuf same=%d size=%" PRIu64 "\n", imp.buf_handle == bo,
	       imp.alloc_size);
	amdgpu_bo_free(imp.buf_handle);
	close(dmabuf);

	/* amdgpu_va_range_alloc + amdgpu_bo_va_op(MAP) (GEM_VA, libdrm's 40-byte struct) */
	check(amdgpu_va_range_alloc(dev, amdgpu_gpu_va_range_general, BO_SIZE, 0, 0, &va,
				    &vah, 0), "va_alloc");
	check(amdgpu_bo_va_op(bo, 0, BO_SIZE, va, 0, AMDGPU_VA_OP_MAP), "va_map");
	printf("ok va_map va=%#" PRIx64 "\n", va);
	gpu_roundtrip(dfd, va, "stored by the GPU", "gpu_store_load");
	cpu_map_checks(dfd, bo, va, "stored by the GPU");
	/* amdgpu_bo_va_op(UNMAP): the VA faults afterwards */
	check(amdgpu_bo_va_op(bo, 0, BO_SIZE, va, 0, AMDGPU_VA_OP_UNMAP), "va_unmap");
	printf("ok va_unmap load_errno=%d\n",
	       pread(dfd, back, sizeof(back), (off_t)va) < 0 ? errno : 0);
	check(amdgpu_va_range_free(vah), "va_free");

	/* amdgpu_bo_wait_for_idle (GEM_WAIT_IDLE): nothing executes, the BO is idle */
	{
		bool busy = true;

		check(amdgpu_bo_wait_for_idle(bo, 1000000000ull, &busy), "wait_idle");
		printf("ok wait_idle busy=%d\n", busy);
	}
	/* amdgpu_cs_ctx_create / amdgpu_cs_ctx_stable_pstate (CTX GET/SET_STABLE_PSTATE) */
	{
		amdgpu_context_handle ctx;
		uint32_t before = 99, peak = 99, after = 99;

		check(amdgpu_cs_ctx_create(dev, &ctx), "ctx_create");
		check(amdgpu_cs_ctx_stable_pstate(ctx, AMDGPU_CTX_OP_GET_STABLE_PSTATE, 0, &before),
		      "pstate_get");
		check(amdgpu_cs_ctx_stable_pstate(ctx, AMDGPU_CTX_OP_SET_STABLE_PSTATE,
						  AMDGPU_CTX_STABLE_PSTATE_PEAK, NULL), "pstate_set");
		check(amdgpu_cs_ctx_stable_pstate(ctx, AMDGPU_CTX_OP_GET_STABLE_PSTATE, 0, &peak),
		      "pstate_get");
		check(amdgpu_cs_ctx_free(ctx), "ctx_free");
		check(amdgpu_cs_ctx_create(dev, &ctx), "ctx_create");
		check(amdgpu_cs_ctx_stable_pstate(ctx, AMDGPU_CTX_OP_GET_STABLE_PSTATE, 0, &after),
		      "pstate_get");
		check(amdgpu_cs_ctx_free(ctx), "ctx_free");
		printf("ok stable_pstate before=%u peak=%u after_free=%u\n", before, peak, after);
	}

	/* amdgpu_bo_set_metadata / amdgpu_bo_query_info (GEM_METADATA, GEM_OP) */
	memset(&meta, 0, sizeof(meta));
	meta.flags = 1;
	meta.tiling_info = 0x1234;
	meta.size_metadata = 8;
	meta.umd_metadata[0] = 0xcafe;
	meta.umd_metadata[1] = 0xf00d;
	check(amdgpu_bo_set_metadata(bo, &meta), "set_metadata");
	memset(&info, 0, sizeof(info));
	check(amdgpu_bo_query_info(bo, &info), "query_info");
	printf("ok query_info size=%" PRIu64 " alignment=%" PRIu64 " heap=%u tiling=%#" PRIx64
	       " meta_size=%u meta0=%#x meta1=%#x\n", info.alloc_size, info.phys_alignment,
	       info.preferred_heap, info.metadata.tiling_info, info.metadata.size_metadata,
	       info.metadata.umd_metadata[0], info.metadata.umd_metadata[1]);

	/* amdgpu_create_bo_from_user_mem (GEM_USERPTR): GPU stores reach our memory */
	user = mmap(NULL, BO_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (user == MAP_FAILED)
		fail("userptr_mem", errno);
	memset(user, 0, BO_SIZE);
	check(amdgpu_create_bo_from_user_mem(dev, user, BO_SIZE, &ubo), "userptr");
	check(amdgpu_va_range_alloc(dev, amdgpu_gpu_va_range_general, BO_SIZE, 0, 0, &uva,
				    &uvah, 0), "userptr_va_alloc");
	check(amdgpu_bo_va_op(ubo, 0, BO_SIZE, uva, 0, AMDGPU_VA_OP_MAP), "userptr_map");
	gpu_roundtrip(dfd, uva + 4096, "userptr bytes", "userptr_store_load");
	printf("ok userptr cpu_sees=%d\n", memcmp((char *)user + 4096, "userptr bytes", 13) == 0);
	check(amdgpu_bo_va_op(ubo, 0, BO_SIZE, uva, 0, AMDGPU_VA_OP_UNMAP), "userptr_unmap");
	check(amdgpu_va_range_free(uvah), "userptr_va_free");
	check(amdgpu_bo_free(ubo), "userptr_free");
	munmap(user, BO_SIZE);

	syncobjs(dev);

	check(amdgpu_bo_free(bo), "bo_free");
	amdgpu_device_deinitialize(dev);
	close(fd);
	printf("ok done\n");
	return 0;
}
