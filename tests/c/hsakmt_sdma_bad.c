/*
 * Bad input to SDMA queues through Debian's unmodified libhsakmt 5.2.3 (public API) and raw
 * KFD ioctls, run through libualink_shim.so against a node by
 * tests/integration/test_gpu_engine_bad_input.py (issue 30 "Bad input"; spec
 * userspace-surface §8).  Prints `ok <step> k=v ...` per step, `fail <step>` and exits with
 * the step's number on the first surprise.  Modes (argv[1]):
 *   ping      GET_VERSION on its own /dev/kfd fd in a loop until stdin closes; prints the
 *             slowest answer (the "other client" served while the others misbehave)
 *   create    CREATE_QUEUE refused: a ring in memory the GPU VM does not map, a ring size
 *             that is not a power of two (libhsakmt passes both to the kernel)
 *   packets   one queue per bad thing, each must stop in error while a last queue's
 *             fence still lands: COPY_LINEAR of 4 MiB from an unmapped VA, a COPY_LINEAR
 *             whose source wraps the 64-bit space, CONST_FILL of 4 MiB into a 4 KiB BO,
 *             a NOP skipping past the ring, a COPY_LINEAR_RECT whose window wraps 2^64,
 *             a doorbell past the ring, one not dword aligned, one going backwards
 *   abandon   as many SDMA queues as the process may have, half of them blocked on a
 *             POLL_REGMEM that never passes, then exit without destroying anything
 *   midcopy   a forever POLL_REGMEM on one queue and 64 MiB VRAM->host copies on another,
 *             then exit while they run
 *   freering  a queue blocked on a poll whose ring BO is unmapped and freed under it, then
 *             released and rung again; destroyed
 *   destroy   DESTROY_QUEUE while 64 MiB of copies are in flight (timed)
 *   longrun   a ring of 4 MiB copies and a 33.5 M-row COPY_LINEAR_RECT, exit after 2 s
 *   victim    a queue with a fence written but not rung, until a newline; then rung
 *   foreign N a queue of its own whose doorbell slot it sets to N (the victim's index)
 */
#define _GNU_SOURCE
#include "sdma_ring.h"
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/ioctl.h>

/* kfd_ioctl.h's GET_VERSION (that header needs the kernel's drm/drm.h) */
struct kfd_ioctl_get_version_args {
	uint32_t major_version;
	uint32_t minor_version;
};
#define AMDKFD_IOC_GET_VERSION _IOR('K', 0x01, struct kfd_ioctl_get_version_args)

static uint32_t gpu;
static HsaMemFlags sysmem, vram;

static void *gtt(size_t size)
{
	void *p = NULL;
	uint64_t alt = 0;

	if (hsaKmtAllocMemory(0, size, sysmem, &p) || hsaKmtMapMemoryToGPU(p, size, &alt))
		return NULL;
	memset(p, 0, size);
	return p;
}

static int poll_forever(struct queue *q, volatile uint32_t *addr)
{
	uint64_t a = (uintptr_t)addr;
	/* mem poll, func 3 (==), ref 1, mask ~0, interval 10, retry 0xFFF (forever) */
	const uint32_t cmd[6] = {SDMA_OP_POLL_REGMEM | 3u << 28 | 1u << 31, (uint32_t)a,
				 (uint32_t)(a >> 32), 1, 0xFFFFFFFF, 10 | 0xFFFu << 16};

	return put(q, cmd, 6);
}

static void set_doorbell(struct queue *q, uint64_t value)
{
	*(volatile uint64_t *)q->res.Queue_DoorBell = value;
}

static int mode_ping(void)
{
	int fd = open("/dev/kfd", O_RDWR | O_CLOEXEC);
	struct pollfd in = {.fd = 0, .events = POLLIN};
	double worst = 0;
	long n = 0;

	EXPECT("ping_open", fd >= 0);
	printf("ok ping_started\n");
	fflush(stdout);
	while (poll(&in, 1, 0) == 0) {
		struct kfd_ioctl_get_version_args v = {0};
		double t0 = now_s(), dt;

		if (ioctl(fd, AMDKFD_IOC_GET_VERSION, &v) != 0 || v.major_version != 1) {
			printf("fail ping_ioctl errno=%d\n", errno);
			return 2;
		}
		dt = now_s() - t0;
		worst = dt > worst ? dt : worst;
		n++;
		usleep(2000);
	}
	printf("ok ping n=%ld worst_ms=%.1f\n", n, worst * 1e3);
	return 0;
}

static int mode_create(void)
{
	HsaQueueResource res;
	void *ring = gtt(RING_SIZE), *loose = NULL;
	HSAKMT_STATUS s;

	EXPECT("create_alloc", ring != NULL && posix_memalign(&loose, 4096, RING_SIZE) == 0);
	memset(&res, 0, sizeof(res));
	errno = 0;
	s = hsaKmtCreateQueue(gpu, HSA_QUEUE_SDMA, 100, HSA_QUEUE_PRIORITY_MAXIMUM, loose,
			      RING_SIZE, NULL, &res);
	printf("ok unmapped_ring status=%d errno=%d\n", (int)s, errno);
	EXPECT("unmapped_ring_refused", s != HSAKMT_STATUS_SUCCESS);
	errno = 0;
	s = hsaKmtCreateQueue(gpu, HSA_QUEUE_SDMA, 100, HSA_QUEUE_PRIORITY_MAXIMUM, ring,
			      RING_SIZE - 1024, NULL, &res);
	printf("ok size_not_pow2 status=%d errno=%d\n", (int)s, errno);
	EXPECT("size_not_pow2_refused", s != HSAKMT_STATUS_SUCCESS);
	return 0;
}

#define NBAD 8

static int mode_packets(void)
{
	struct queue q[NBAD + 1];
	volatile uint32_t *sig = gtt(4096);
	void *small = gtt(4096);

	EXPECT("packets_alloc", sig && small);
	for (int i = 0; i <= NBAD; i++)
		EXPECT("packets_create", create_queue(gpu, &q[i]));
	{
		const uint32_t c0[7] = {SDMA_OP_COPY, 0x3FFFFF, 0, 0x1000, 0, (uint32_t)(uintptr_t)small,
					(uint32_t)((uintptr_t)small >> 32)};
		const uint32_t c1[7] = {SDMA_OP_COPY, 0x3FFFFF, 0, 0xFFFFF000, 0xFFFFFFFF,
					(uint32_t)(uintptr_t)small, (uint32_t)((uintptr_t)small >> 32)};
		const uint32_t c2[5] = {11u | 2u << 30, (uint32_t)(uintptr_t)small,
					(uint32_t)((uintptr_t)small >> 32), 0xABABABAB, 0x3FFFFC};
		const uint32_t c3[1] = {SDMA_OP_NOP | 0x3FFFu << 16};
		/* COPY_LINEAR_SUB_WIND, 16-byte elements, 16384 x 16384 x 2048 window ending
		 * past 2^64 on the destination side */
		const uint32_t c4[13] = {SDMA_OP_COPY | 4u << 8 | 4u << 29,
					 (uint32_t)(uintptr_t)small, (uint32_t)((uintptr_t)small >> 32),
					 0, 0x3FFFu << 13, 0x0FFFFFFF, 0xFFFFFF00, 0xFFFFFFFF, 0,
					 0x3FFFu << 13, 0x0FFFFFFF, 0x3FFF | 0x3FFFu << 16, 0x7FF};

		EXPECT("put_bad", put(&q[0], c0, 7) && put(&q[1], c1, 7) && put(&q[2], c2, 5) &&
		       put(&q[3], c3, 1) && put(&q[4], c4, 13));
		for (int i = 0; i < 5; i++)
			EXPECT("put_fence", fence(&q[i], &sig[i], 1));
		for (int i = 0; i < 5; i++)
			ring_doorbell(&q[i]);
	}
	/* doorbells: past the ring, not dword aligned, backwards (after a fence ran) */
	EXPECT("put_doorbell_fences", fence(&q[5], &sig[5], 1) && fence(&q[6], &sig[6], 1) &&
	       fence(&q[7], &sig[7], 1) && fence(&q[7], &sig[8], 1));
	set_doorbell(&q[5], q[5].index + 2 * RING_SIZE);
	set_doorbell(&q[6], q[6].index - 2);
	set_doorbell(&q[7], 16);
	EXPECT("first_fence_ran", wait_value(&sig[7], 1, 30));
	set_doorbell(&q[7], 8);
	EXPECT("good_fence", fence(&q[NBAD], &sig[NBAD + 1], 1));
	ring_doorbell(&q[NBAD]);
	EXPECT("good_queue_goes_on", wait_value(&sig[NBAD + 1], 1, 30));
	usleep(300000);
	for (int i = 0; i < 7; i++)
		if (sig[i] != 0) {
			printf("fail bad_queue_%d_ran_its_fence\n", i);
			return 100 + i;
		}
	printf("ok bad_queues_stopped n=%d\n", NBAD);
	fflush(stdout);
	(void)getchar();
	for (int i = 0; i <= NBAD; i++)
		CHECK("packets_destroy", hsaKmtDestroyQueue(q[i].res.QueueId));
	printf("ok done\n");
	return 0;
}

static int mode_abandon(void)
{
	struct queue q[64];
	volatile uint32_t *sig = gtt(4096);
	int n = 0;

	EXPECT("abandon_alloc", sig != NULL);
	while (n < 64 && create_queue(gpu, &q[n]))
		n++;
	for (int i = 0; i < n; i += 2) {
		if (!hdp_flush(&q[i]) || !poll_forever(&q[i], sig))
			return 90;
		ring_doorbell(&q[i]);
	}
	printf("ok abandon n=%d\n", n);
	fflush(stdout);
	usleep(20000);
	_exit(0);
}

static int big_copies(struct queue *q, void **dev, void **host, size_t size)
{
	uint64_t alt = 0;

	if (hsaKmtAllocMemory(gpu, size, vram, dev) || hsaKmtMapMemoryToGPU(*dev, size, &alt))
		return 0;
	*host = gtt(size);
	return *host && hdp_flush(q) && copy(q, (uintptr_t)*host, (uintptr_t)*dev, size / 2) &&
	       copy(q, (uintptr_t)*dev + size / 2, (uintptr_t)*host, size / 2);
}

static int mode_midcopy(void)
{
	struct queue a, b;
	volatile uint32_t *sig = gtt(4096);
	void *dev, *host;

	EXPECT("midcopy_queues", sig && create_queue(gpu, &a) && create_queue(gpu, &b));
	EXPECT("midcopy_submit", poll_forever(&a, sig) && big_copies(&b, &dev, &host, 64 << 20));
	ring_doorbell(&a);
	ring_doorbell(&b);
	usleep(5000);
	printf("ok midcopy rptr=%" PRIu64 "\n", *rptr(&b));
	fflush(stdout);
	_exit(0);
}

static int mode_freering(void)
{
	struct queue q;
	volatile uint32_t *sig = gtt(4096);

	EXPECT("freering_queue", sig && create_queue(gpu, &q));
	EXPECT("freering_poll", poll_forever(&q, sig) && fence(&q, &sig[1], 1));
	ring_doorbell(&q);
	usleep(100000);
	CHECK("freering_unmap", hsaKmtUnmapMemoryToGPU(q.ring));
	CHECK("freering_free", hsaKmtFreeMemory(q.ring, RING_SIZE));
	printf("ok ring_freed\n");
	fflush(stdout);
	sig[0] = 1; /* release the poll: the fence after it is in the freed ring */
	usleep(300000);
	set_doorbell(&q, q.index + 16); /* and ask for more of it */
	usleep(300000);
	printf("ok freering fence=%u\n", sig[1]);
	fflush(stdout);
	(void)getchar();
	CHECK("freering_destroy", hsaKmtDestroyQueue(q.res.QueueId));
	printf("ok done\n");
	return 0;
}

static int mode_destroy(void)
{
	struct queue q;
	void *dev, *host;
	double t0;
	uint64_t done;

	EXPECT("destroy_queue", create_queue(gpu, &q));
	EXPECT("destroy_submit", big_copies(&q, &dev, &host, 64 << 20));
	ring_doorbell(&q);
	usleep(2000);
	t0 = now_s();
	done = *rptr(&q); /* (libhsakmt frees the rptr word with the queue) */
	CHECK("destroy_in_flight", hsaKmtDestroyQueue(q.res.QueueId));
	printf("ok destroy_in_flight ms=%.1f rptr=%" PRIu64 " of %" PRIu64 "\n",
	       (now_s() - t0) * 1e3, done, q.index);
	CHECK("destroy_unmap", hsaKmtUnmapMemoryToGPU(dev));
	CHECK("destroy_free", hsaKmtFreeMemory(dev, 64 << 20));
	printf("ok done\n");
	return 0;
}

/* Long runs: a ring of 4 MiB VRAM->VRAM copies, and a COPY_LINEAR_RECT of 16384 rows x
 * 2048 slices of one byte each that never join (33.5 M row copies) in mapped memory; then
 * exit while both run. */
static int mode_longrun(void)
{
	struct queue a, b;
	void *dev = NULL;
	uint8_t *buf = gtt(1 << 20);
	uint64_t alt = 0, d, s;
	int n = 0;

	EXPECT("longrun_alloc", buf && hsaKmtAllocMemory(gpu, 8 << 20, vram, &dev) == 0 &&
	       hsaKmtMapMemoryToGPU(dev, 8 << 20, &alt) == 0);
	EXPECT("longrun_queues", create_queue(gpu, &a) && create_queue(gpu, &b));
	d = (uintptr_t)dev;
	while (a.index + 7 * 4 <= RING_SIZE - 4 && copy(&a, d + (4 << 20), d, 4 << 20))
		n++;
	s = (uintptr_t)buf;
	{
		const uint32_t rect[13] = {SDMA_OP_COPY | 4u << 8, (uint32_t)s, (uint32_t)(s >> 32),
					   0, 1u << 13, 0, (uint32_t)(s + 65536),
					   (uint32_t)((s + 65536) >> 32), 0, 1u << 13, 0,
					   0x3FFFu << 16, 0x7FF};

		EXPECT("longrun_rect", put(&b, rect, 13));
	}
	ring_doorbell(&a);
	ring_doorbell(&b);
	printf("ok longrun copies=%d\n", n);
	fflush(stdout);
	sleep(2);
	printf("ok longrun_exit rptr_a=%" PRIu64 " of %" PRIu64 " rptr_b=%" PRIu64 "\n",
	       *rptr(&a), a.index, *rptr(&b));
	fflush(stdout);
	_exit(0);
}

static int mode_victim(void)
{
	struct queue q;
	volatile uint32_t *sig = gtt(4096);

	EXPECT("victim_queue", sig && create_queue(gpu, &q));
	EXPECT("victim_fence", fence(&q, sig, 1)); /* written, not rung */
	printf("ok victim index=%" PRIu64 "\n", q.index);
	fflush(stdout);
	(void)getchar(); /* the others write their own slices meanwhile */
	printf("ok victim_before_ring fence=%u\n", sig[0]);
	ring_doorbell(&q);
	EXPECT("victim_rings_itself", wait_value(sig, 1, 30));
	CHECK("victim_destroy", hsaKmtDestroyQueue(q.res.QueueId));
	printf("ok done\n");
	return 0;
}

/* Another process (this uid or another) rings the slot the victim's queue has, in its
 * own doorbell slice: the doorbell mmap cookie names a GPU, not a process, so the kfd fd
 * maps the caller's slice (kfd_doorbell_mmap), never another's. */
static int mode_foreign(uint64_t index)
{
	struct queue q;

	EXPECT("foreign_queue", create_queue(gpu, &q));
	set_doorbell(&q, index);
	usleep(300000);
	printf("ok foreign rang=%" PRIu64 "\n", index);
	return 0;
}

int main(int argc, char **argv)
{
	HsaNodeProperties props;
	int failed;
	const char *mode = argc > 1 ? argv[1] : "";

	if (strcmp(mode, "ping") == 0)
		return mode_ping();
	if ((failed = open_kfd_gpu(&gpu, &props)))
		return failed;
	sysmem.ui32.PageSize = HSA_PAGE_SIZE_4KB;
	sysmem.ui32.HostAccess = 1;
	sysmem.ui32.NonPaged = 1;
	vram.ui32.PageSize = HSA_PAGE_SIZE_4KB;
	vram.ui32.NonPaged = 1;
	vram.ui32.NoSubstitute = 1;
	if (strcmp(mode, "create") == 0)
		return mode_create();
	if (strcmp(mode, "packets") == 0)
		return mode_packets();
	if (strcmp(mode, "abandon") == 0)
		return mode_abandon();
	if (strcmp(mode, "midcopy") == 0)
		return mode_midcopy();
	if (strcmp(mode, "freering") == 0)
		return mode_freering();
	if (strcmp(mode, "longrun") == 0)
		return mode_longrun();
	if (strcmp(mode, "victim") == 0)
		return mode_victim();
	if (strcmp(mode, "foreign") == 0 && argc > 2)
		return mode_foreign(strtoull(argv[2], NULL, 0));
	if (strcmp(mode, "destroy") == 0)
		return mode_destroy();
	printf("fail unknown_mode %s\n", mode);
	return 1;
}
