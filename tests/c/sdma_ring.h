/*
 * An SDMA user queue driven through libhsakmt 5.2.3's public API, with the packets
 * ROCr 5.2.3's BlitSdmaV4 writes (the kernel's vega10_sdma_pkt_open.h layouts), for the
 * test programs hsakmt_sdma.c, hsakmt_sdma_bad.c, hsakmt_sdma_fabric.c and fabric_sdma.c
 * (static helpers, one copy each; a ring of another size than RING_SIZE sets q->size).
 */
#ifndef SDMA_RING_H
#define SDMA_RING_H
#include <hsakmt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kmt_check.h"

/* sdma_v4_0 / vega10_sdma_pkt_open.h opcodes */
#define SDMA_OP_NOP 0
#define SDMA_OP_COPY 1
#define SDMA_OP_FENCE 5
#define SDMA_OP_TRAP 6
#define SDMA_OP_POLL_REGMEM 8
#define SDMA_OP_ATOMIC 10
#define SDMA_OP_TIMESTAMP 13
#define SDMA_SUBOP_TIMESTAMP_GET_GLOBAL 2
#define SDMA_ATOMIC_ADD64 47
#define COPY_MAX 0x3FFFE0 /* BlitSdmaV4's largest COPY_LINEAR */

#define RING_SIZE 4096

struct queue {
	uint32_t *ring;
	uint64_t size;
	HsaQueueResource res;
	uint64_t index; /* the producer's byte index */
};

static inline double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static inline volatile uint64_t *rptr(struct queue *q)
{
	return (volatile uint64_t *)(uintptr_t)q->res.QueueRptrValue;
}

/*
 * BlitSdmaV4::AcquireWriteAddress: room for `bytes` (waiting on *rptr as the engine
 * moves), zero dwords to the end of the ring when the command would straddle it.
 */
static inline uint32_t *reserve(struct queue *q, uint32_t bytes)
{
	uint64_t pos = q->index % q->size;
	double until = now_s() + 10;

	if (pos + bytes > q->size) {
		memset((char *)q->ring + pos, 0, q->size - pos);
		q->index += q->size - pos;
		pos = 0;
	}
	while (q->index + bytes - *rptr(q) > q->size) {
		if (now_s() > until)
			return NULL;
		usleep(50);
	}
	q->index += bytes;
	return (uint32_t *)((char *)q->ring + pos);
}

/* The write pointer, a release fence, then the doorbell (BlitSdmaV4::UpdateWriteAndDoorbellRegister). */
static inline void ring_doorbell(struct queue *q)
{
	*(volatile uint64_t *)(uintptr_t)q->res.QueueWptrValue = q->index;
	__atomic_thread_fence(__ATOMIC_RELEASE);
	*(volatile uint64_t *)q->res.Queue_DoorBell = q->index;
}

static inline int put(struct queue *q, const uint32_t *dw, uint32_t n)
{
	uint32_t *p = reserve(q, n * 4);

	if (!p)
		return 0;
	memcpy(p, dw, n * 4);
	return 1;
}

static inline int hdp_flush(struct queue *q)
{
	const uint32_t cmd[6] = {0x8, 0, 0x80000000, 0, 0, 0};

	return put(q, cmd, 6);
}

static inline int fence(struct queue *q, volatile uint32_t *addr, uint32_t value)
{
	uint64_t a = (uintptr_t)addr;
	const uint32_t cmd[4] = {SDMA_OP_FENCE, (uint32_t)a, (uint32_t)(a >> 32), value};

	return put(q, cmd, 4);
}

static inline int copy(struct queue *q, uint64_t dst, uint64_t src, uint64_t size)
{
	for (uint64_t off = 0; off < size; off += COPY_MAX) {
		uint64_t n = size - off < COPY_MAX ? size - off : COPY_MAX;
		uint64_t s = src + off, d = dst + off;
		const uint32_t cmd[7] = {SDMA_OP_COPY, (uint32_t)(n - 1), 0, (uint32_t)s,
					 (uint32_t)(s >> 32), (uint32_t)d, (uint32_t)(d >> 32)};

		if (!put(q, cmd, 7))
			return 0;
	}
	return 1;
}

static inline int wait_value(volatile uint32_t *addr, uint32_t value, double seconds)
{
	double until = now_s() + seconds;

	while (*addr != value) {
		if (now_s() > until)
			return 0;
		usleep(20);
	}
	return 1;
}

static inline int create_queue(uint32_t gpu, struct queue *q)
{
	HsaMemFlags sysmem = {0};
	uint64_t alt = 0;
	void *ring = NULL;

	sysmem.ui32.PageSize = HSA_PAGE_SIZE_4KB;
	sysmem.ui32.HostAccess = 1;
	sysmem.ui32.NonPaged = 1;
	if (hsaKmtAllocMemory(0, RING_SIZE, sysmem, &ring) ||
	    hsaKmtMapMemoryToGPU(ring, RING_SIZE, &alt))
		return 0;
	memset(ring, 0, RING_SIZE);
	memset(q, 0, sizeof(*q));
	q->ring = ring;
	q->size = RING_SIZE;
	return hsaKmtCreateQueue(gpu, HSA_QUEUE_SDMA, 100, HSA_QUEUE_PRIORITY_MAXIMUM, ring,
				 RING_SIZE, NULL, &q->res) == HSAKMT_STATUS_SUCCESS;
}

#endif
