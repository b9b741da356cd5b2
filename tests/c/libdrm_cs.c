/* SPDX-License-Identifier: MIT */
/*
 * libdrm_cs: command submission through the public API of Debian's libdrm_amdgpu (2.4.114)
 * only -- amdgpu_cs_ctx_create, amdgpu_bo_list_create, amdgpu_cs_submit of an SDMA IB
 * holding a COPY_LINEAR, amdgpu_cs_query_fence_status, amdgpu_cs_wait_fences,
 * amdgpu_cs_submit_raw2 with a syncobj out chunk -- and a GFX IB, which fails; an IB that
 * faults (a COPY_LINEAR out of an unmapped VA) on a second context, which makes that context
 * guilty (amdgpu_cs_query_reset_state2, later submissions ECANCELED) while the first one
 * goes on. `libdrm_cs import <lo> <hi> <text>`: a COPY_LINEAR IB out of a BO imported by its
 * UALink handle (libdrm_fabric.c's import flow) into a local VRAM BO. `libdrm_cs poll`: an
 * IB that polls a word a second thread releases by a GPU store 300 ms later, through the
 * same node, while the submission waits in its ioctl. The bytes
 * are put and checked by the render node's GPU loads and stores (pwrite/pread at a GPU VA,
 * DESIGN.md "GPU loads and stores"). Run under libualink_shim.so by
 * tests/integration/test_libdrm_cs.py:
 *
 *   ok <step> key=value ...     as on real amdgpu hardware
 *   fail <step> err=<n> ...     the first step that failed (exit status 1)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include <amdgpu.h>
#include <amdgpu_drm.h>
#include <xf86drm.h>

#include "libdrm_check.h"

#include "ualink/ualink_drm.h"	/* only its UALink part: amdgpu_drm.h came first */

#define COPY_SIZE (1u << 20)
#define IB_SIZE 4096u

struct mapped {
	amdgpu_bo_handle bo;
	amdgpu_va_handle vah;
	uint64_t va;
};

static struct mapped alloc_mapped(amdgpu_device_handle dev, uint64_t size, uint32_t heap)
{
	struct amdgpu_bo_alloc_request req = { .alloc_size = size, .phys_alignment = 4096,
					       .preferred_heap = heap };
	struct mapped m;

	check(amdgpu_bo_alloc(dev, &req, &m.bo), "bo_alloc");
	check(amdgpu_va_range_alloc(dev, amdgpu_gpu_va_range_general, size, 0, 0, &m.va, &m.vah,
				    0), "va_alloc");
	check(amdgpu_bo_va_op(m.bo, 0, size, m.va, 0, AMDGPU_VA_OP_MAP), "va_map");
	return m;
}

/* An SDMA IB: COPY_LINEAR (gfx9: count = bytes - 1) then NOPs to 8 dwords. */
static uint32_t copy_ib(uint32_t *ib, uint64_t dst, uint64_t src, uint32_t n)
{
	uint32_t i = 0;

	ib[i++] = 1; /* SDMA_OP_COPY, SDMA_SUBOP_COPY_LINEAR */
	ib[i++] = n - 1;
	ib[i++] = 0;
	ib[i++] = (uint32_t)src;
	ib[i++] = (uint32_t)(src >> 32);
	ib[i++] = (uint32_t)dst;
	ib[i++] = (uint32_t)(dst >> 32);
	ib[i++] = 0; /* SDMA_OP_NOP */
	return i;
}

static void put(int fd, uint64_t va, const void *data, size_t n, const char *step)
{
	if (pwrite(fd, data, n, (off_t)va) != (ssize_t)n)
		fail(step, errno);
}

static int same(int fd, uint64_t va, const unsigned char *want, size_t n)
{
	unsigned char *got = malloc(n);
	int r;

	if (!got || pread(fd, got, n, (off_t)va) != (ssize_t)n)
		fail("gpu_load", errno);
	r = memcmp(got, want, n) == 0;
	free(got);
	return r;
}

/* amdgpu_cs_submit of one SDMA IB of `ndw` dwords at `ib_va` naming `list`; its return */
static int submit_ib(amdgpu_context_handle ctx, amdgpu_bo_list_handle list, uint64_t ib_va,
		     uint32_t ndw, uint64_t *seq)
{
	struct amdgpu_cs_request req;
	struct amdgpu_cs_ib_info ib_info;
	int r;

	memset(&req, 0, sizeof(req));
	memset(&ib_info, 0, sizeof(ib_info));
	ib_info.ib_mc_address = ib_va;
	ib_info.size = ndw;
	req.ip_type = AMDGPU_HW_IP_DMA;
	req.resources = list;
	req.number_of_ibs = 1;
	req.ibs = &ib_info;
	r = amdgpu_cs_submit(ctx, 0, &req, 1);
	*seq = req.seq_no;
	return r;
}

/* The fence of `seq` on ctx's SDMA ring 0: amdgpu_cs_query_fence_status's return */
static int fence_status(amdgpu_context_handle ctx, uint64_t seq, uint32_t *expired)
{
	struct amdgpu_cs_fence fence;

	memset(&fence, 0, sizeof(fence));
	fence.context = ctx;
	fence.ip_type = AMDGPU_HW_IP_DMA;
	fence.fence = seq;
	return amdgpu_cs_query_fence_status(&fence, AMDGPU_TIMEOUT_INFINITE, 0, expired);
}

/* The importer's side: a UALink IMPORT of the exporter's handle (libdrm_fabric.c's flow,
 * amdgpu_bo_import of the dma-buf, a GPU VA map), then an SDMA IB copying `text`'s bytes
 * out of it at `offset` into a local VRAM BO, checked by a GPU load. */
static int do_import(uint64_t lo, uint64_t hi, uint64_t offset, const char *text)
{
	union drm_amdgpu_ualink_handle u;
	struct amdgpu_bo_import_result imp;
	amdgpu_device_handle dev;
	amdgpu_context_handle ctx;
	amdgpu_bo_list_handle list;
	amdgpu_bo_handle bos[3];
	amdgpu_va_handle vah;
	struct mapped dst, ib;
	uint32_t major, minor, ibw[8], ndw, expired;
	uint64_t va, seq;
	size_t n = strlen(text);
	int fd = open("/dev/dri/renderD128", O_RDWR | O_CLOEXEC), dfd;

	if (fd < 0)
		fail("open", errno);
	check(amdgpu_device_initialize(fd, &major, &minor, &dev), "init");
	dfd = amdgpu_device_get_fd(dev);
	memset(&u, 0, sizeof(u));
	u.in.op = DRM_AMDGPU_UALINK_HANDLE_OP_IMPORT;
	u.in.import_ualink_handle[0] = lo;
	u.in.import_ualink_handle[1] = hi;
	check(drmCommandWriteRead(dfd, DRM_AMDGPU_UALINK_HANDLE, &u, sizeof(u)), "import");
	check(amdgpu_bo_import(dev, amdgpu_bo_handle_type_dma_buf_fd,
			       (uint32_t)u.out.import_dmabuf_handle, &imp), "bo_import");
	close((int)u.out.import_dmabuf_handle);
	check(amdgpu_va_range_alloc(dev, amdgpu_gpu_va_range_general, imp.alloc_size, 0, 0, &va,
				    &vah, 0), "va_alloc");
	check(amdgpu_bo_va_op(imp.buf_handle, 0, imp.alloc_size, va, 0, AMDGPU_VA_OP_MAP),
	      "va_map");
	printf("ok import size=%" PRIu64 "\n", imp.alloc_size);

	check(amdgpu_cs_ctx_create(dev, &ctx), "ctx_create");
	dst = alloc_mapped(dev, 4096, AMDGPU_GEM_DOMAIN_VRAM);
	ib = alloc_mapped(dev, IB_SIZE, AMDGPU_GEM_DOMAIN_GTT);
	ndw = copy_ib(ibw, dst.va, va + offset, (uint32_t)n);
	put(dfd, ib.va, ibw, ndw * 4, "ib_store");
	bos[0] = imp.buf_handle;
	bos[1] = dst.bo;
	bos[2] = ib.bo;
	check(amdgpu_bo_list_create(dev, 3, bos, NULL, &list), "bo_list");
	check(submit_ib(ctx, list, ib.va, ndw, &seq), "cs_submit");
	check(fence_status(ctx, seq, &expired), "query_fence");
	printf("ok import_copy expired=%u equal=%d\n", expired,
	       same(dfd, dst.va, (const unsigned char *)text, n));

	amdgpu_bo_list_destroy(list);
	amdgpu_cs_ctx_free(ctx);
	check(amdgpu_bo_va_op(imp.buf_handle, 0, imp.alloc_size, va, 0, AMDGPU_VA_OP_UNMAP),
	      "va_unmap");
	check(amdgpu_va_range_free(vah), "va_free");
	check(amdgpu_bo_free(imp.buf_handle), "bo_free");
	amdgpu_device_deinitialize(dev);
	close(fd);
	printf("ok done\n");
	return 0;
}

struct release {
	int fd;
	uint64_t va;
};

static void *release_later(void *arg)
{
	const struct release *r = arg;
	const uint32_t zero = 0;

	usleep(300000);
	put(r->fd, r->va, &zero, 4, "release_store");
	return NULL;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* A POLL_REGMEM (== 0, retry forever) on a word held at 1, then a FENCE: the CS ioctl waits
 * for the poll while another thread's GPU store (a pwrite through the same node) releases
 * it -- which it cannot if the node's serving thread waits in the CS. */
static int do_poll_ib(void)
{
	amdgpu_device_handle dev;
	amdgpu_context_handle ctx;
	amdgpu_bo_list_handle list;
	amdgpu_bo_handle bos[2];
	struct mapped data, ib;
	struct release rel;
	pthread_t thread;
	uint32_t major, minor, ibw[16], expired, one = 1, got = 0, i = 0;
	uint64_t seq;
	double t0;
	int fd = open("/dev/dri/renderD128", O_RDWR | O_CLOEXEC), dfd, r;

	if (fd < 0)
		fail("open", errno);
	check(amdgpu_device_initialize(fd, &major, &minor, &dev), "init");
	dfd = amdgpu_device_get_fd(dev);
	check(amdgpu_cs_ctx_create(dev, &ctx), "ctx_create");
	data = alloc_mapped(dev, 4096, AMDGPU_GEM_DOMAIN_GTT);
	ib = alloc_mapped(dev, IB_SIZE, AMDGPU_GEM_DOMAIN_GTT);
	put(dfd, data.va, &one, 4, "hold_store");
	ibw[i++] = 8u | 3u << 28 | 1u << 31; /* POLL_REGMEM, memory, function == */
	ibw[i++] = (uint32_t)data.va;
	ibw[i++] = (uint32_t)(data.va >> 32);
	ibw[i++] = 0;			/* reference */
	ibw[i++] = 0xFFFFFFFF;		/* mask */
	ibw[i++] = 10 | 0xFFFu << 16;	/* interval, retry forever */
	ibw[i++] = 5;			/* FENCE 7 at data + 64 */
	ibw[i++] = (uint32_t)(data.va + 64);
	ibw[i++] = (uint32_t)((data.va + 64) >> 32);
	ibw[i++] = 7;
	put(dfd, ib.va, ibw, i * 4, "ib_store");
	bos[0] = data.bo;
	bos[1] = ib.bo;
	check(amdgpu_bo_list_create(dev, 2, bos, NULL, &list), "bo_list");
	rel.fd = dfd;
	rel.va = data.va;
	if (pthread_create(&thread, NULL, release_later, &rel))
		fail("thread", EAGAIN);
	t0 = now_s();
	r = submit_ib(ctx, list, ib.va, i, &seq);
	check(r, "cs_submit");
	check(fence_status(ctx, seq, &expired), "query_fence");
	pthread_join(thread, NULL);
	if (pread(dfd, &got, 4, (off_t)(data.va + 64)) != 4)
		fail("gpu_load", errno);
	printf("ok poll_ib ms=%.0f expired=%u fence=%u\n", (now_s() - t0) * 1e3, expired, got);
	amdgpu_bo_list_destroy(list);
	amdgpu_cs_ctx_free(ctx);
	amdgpu_device_deinitialize(dev);
	close(fd);
	printf("ok done\n");
	return 0;
}

int main(int argc, char **argv)
{
	struct amdgpu_cs_request req;
	struct amdgpu_cs_ib_info ib_info;
	struct amdgpu_cs_fence fence;
	struct drm_amdgpu_cs_chunk chunks[2];
	struct drm_amdgpu_cs_chunk_ib chunk_ib;
	struct drm_amdgpu_cs_chunk_sem sem;
	struct mapped src, dst, ib;
	amdgpu_context_handle ctx;
	amdgpu_device_handle dev;
	amdgpu_bo_list_handle list;
	amdgpu_bo_handle bos[3];
	uint32_t major, minor, ibw[8], ndw, expired, status, first, syncobj;
	unsigned char *pattern;
	uint64_t seq;
	int fd, dfd, r;
	size_t i;
	/* "hold": before the contexts go, wait for a line on stdin (a test reads the node's
	 * per-context table meanwhile) */
	int hold = argc == 2 && strcmp(argv[1], "hold") == 0;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 2 && strcmp(argv[1], "poll") == 0)
		return do_poll_ib();
	if (argc == 6 && strcmp(argv[1], "import") == 0)
		return do_import(strtoull(argv[2], NULL, 0), strtoull(argv[3], NULL, 0),
				 strtoull(argv[4], NULL, 0), argv[5]);
	fd = open("/dev/dri/renderD128", O_RDWR | O_CLOEXEC);
	if (fd < 0)
		fail("open", errno);
	check(amdgpu_device_initialize(fd, &major, &minor, &dev), "init");
	dfd = amdgpu_device_get_fd(dev);
	check(amdgpu_cs_ctx_create(dev, &ctx), "ctx_create");
	src = alloc_mapped(dev, COPY_SIZE, AMDGPU_GEM_DOMAIN_GTT);
	dst = alloc_mapped(dev, COPY_SIZE, AMDGPU_GEM_DOMAIN_VRAM);
	ib = alloc_mapped(dev, IB_SIZE, AMDGPU_GEM_DOMAIN_GTT);
	pattern = malloc(COPY_SIZE);
	if (!pattern)
		fail("malloc", ENOMEM);
	for (i = 0; i < COPY_SIZE; i++)
		pattern[i] = (unsigned char)(i * 31 + 7);
	put(dfd, src.va, pattern, COPY_SIZE, "gpu_store");
	ndw = copy_ib(ibw, dst.va, src.va, COPY_SIZE);
	put(dfd, ib.va, ibw, ndw * 4, "ib_store");
	bos[0] = src.bo;
	bos[1] = dst.bo;
	bos[2] = ib.bo;
	check(amdgpu_bo_list_create(dev, 3, bos, NULL, &list), "bo_list");

	/* amdgpu_cs_submit: one SDMA IB on ring 0 */
	memset(&req, 0, sizeof(req));
	memset(&ib_info, 0, sizeof(ib_info));
	ib_info.ib_mc_address = ib.va;
	ib_info.size = ndw;
	req.ip_type = AMDGPU_HW_IP_DMA;
	req.resources = list;
	req.number_of_ibs = 1;
	req.ibs = &ib_info;
	r = amdgpu_cs_submit(ctx, 0, &req, 1);
	{
		check(r, "cs_submit");
		printf("ok cs_submit seq=%" PRIu64 "\n", req.seq_no);
		memset(&fence, 0, sizeof(fence));
		fence.context = ctx;
		fence.ip_type = AMDGPU_HW_IP_DMA;
		fence.fence = req.seq_no;
		check(amdgpu_cs_query_fence_status(&fence, AMDGPU_TIMEOUT_INFINITE, 0, &expired),
		      "query_fence");
		check(amdgpu_cs_wait_fences(&fence, 1, true, AMDGPU_TIMEOUT_INFINITE, &status,
					    &first), "wait_fences");
		printf("ok fence expired=%u signaled=%u\n", expired, status);
		printf("ok sdma_copy equal=%d\n", same(dfd, dst.va, pattern, COPY_SIZE));

		/* amdgpu_cs_submit_raw2: the IB chunk and a syncobj out chunk */
		check(amdgpu_cs_create_syncobj2(dev, 0, &syncobj), "syncobj_create");
		memset(&chunk_ib, 0, sizeof(chunk_ib));
		chunk_ib.va_start = ib.va;
		chunk_ib.ib_bytes = ndw * 4;
		chunk_ib.ip_type = AMDGPU_HW_IP_DMA;
		sem.handle = syncobj;
		chunks[0].chunk_id = AMDGPU_CHUNK_ID_IB;
		chunks[0].length_dw = sizeof(chunk_ib) / 4;
		chunks[0].chunk_data = (uintptr_t)&chunk_ib;
		chunks[1].chunk_id = AMDGPU_CHUNK_ID_SYNCOBJ_OUT;
		chunks[1].length_dw = sizeof(sem) / 4;
		chunks[1].chunk_data = (uintptr_t)&sem;
		check(amdgpu_cs_submit_raw2(dev, ctx, 0, 2, chunks, &seq), "submit_raw2");
		check(amdgpu_cs_syncobj_wait(dev, &syncobj, 1, INT64_MAX, 0, &first),
		      "syncobj_wait");
		printf("ok syncobj_out seq=%" PRIu64 "\n", seq);
		amdgpu_cs_destroy_syncobj(dev, syncobj);
	}

	/* a GFX IB: this part has no GFX ring, so no scheduler takes it */
	req.ip_type = AMDGPU_HW_IP_GFX;
	r = amdgpu_cs_submit(ctx, 0, &req, 1);
	printf("ok gfx_ib ret=%d\n", r);

	/* an IB that faults (a copy out of an unmapped VA) on a second context: the job is
	 * what hangs a real SDMA engine until the job timeout -- its fence -ETIME, its context
	 * guilty, later submissions to it ECANCELED -- while the first context goes on */
	{
		amdgpu_context_handle bad, bad2;
		uint64_t bad_seq, flags = 0;
		struct mapped badib = alloc_mapped(dev, IB_SIZE, AMDGPU_GEM_DOMAIN_GTT);
		amdgpu_bo_handle badbos[2] = {dst.bo, badib.bo};
		amdgpu_bo_list_handle badlist;

		check(amdgpu_cs_ctx_create(dev, &bad), "ctx_create_bad");
		ndw = copy_ib(ibw, dst.va, 0x7f0000000000ull, 4096);
		put(dfd, badib.va, ibw, ndw * 4, "bad_ib_store");
		check(amdgpu_bo_list_create(dev, 2, badbos, NULL, &badlist), "bad_bo_list");
		r = submit_ib(bad, badlist, badib.va, ndw, &bad_seq);
		printf("ok fault_submit ret=%d\n", r);
		r = fence_status(bad, bad_seq, &expired);
		printf("ok fault_fence ret=%d\n", r);
		check(amdgpu_cs_query_reset_state2(bad, &flags), "reset_state2");
		printf("ok fault_guilty guilty=%d\n", !!(flags & AMDGPU_CTX_QUERY2_FLAGS_GUILTY));
		r = submit_ib(bad, badlist, badib.va, ndw, &bad_seq);
		printf("ok guilty_submit ret=%d\n", r);
		/* the first context still runs its copy */
		memset(pattern, 0x5a, 4096);
		put(dfd, src.va, pattern, 4096, "gpu_store2");
		ndw = copy_ib(ibw, dst.va, src.va, 4096);
		put(dfd, ib.va, ibw, ndw * 4, "ib_store2");
		check(submit_ib(ctx, list, ib.va, ndw, &seq), "other_ctx_submit");
		check(fence_status(ctx, seq, &expired), "other_ctx_fence");
		flags = 0;
		check(amdgpu_cs_query_reset_state2(ctx, &flags), "other_reset_state2");
		printf("ok other_ctx_runs expired=%u equal=%d guilty=%d\n", expired,
		       same(dfd, dst.va, pattern, 4096),
		       !!(flags & AMDGPU_CTX_QUERY2_FLAGS_GUILTY));
		/* an IB outside mapped memory: gfx9 SDMA IBs are not looked up at CS time (no
		 * parse_cs), so the job faults reading it -- the same hang, on a third context */
		check(amdgpu_cs_ctx_create(dev, &bad2), "ctx_create_unmapped");
		r = submit_ib(bad2, badlist, 0x7f0000100000ull, 8, &bad_seq);
		printf("ok unmapped_ib_submit ret=%d\n", r);
		r = fence_status(bad2, bad_seq, &expired);
		flags = 0;
		check(amdgpu_cs_query_reset_state2(bad2, &flags), "unmapped_reset_state2");
		printf("ok unmapped_ib_fence ret=%d guilty=%d\n", r,
		       !!(flags & AMDGPU_CTX_QUERY2_FLAGS_GUILTY));
		if (hold) {
			char line[8];

			printf("ok hold\n");
			if (!fgets(line, sizeof line, stdin))
				line[0] = 0;
		}
		amdgpu_cs_ctx_free(bad2);
		amdgpu_bo_list_destroy(badlist);
		amdgpu_cs_ctx_free(bad);
	}

	amdgpu_bo_list_destroy(list);
	amdgpu_cs_ctx_free(ctx);
	free(pattern);
	amdgpu_device_deinitialize(dev);
	close(fd);
	printf("ok done\n");
	return 0;
}
