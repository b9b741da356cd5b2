/*
 * SDMA queues through Debian's unmodified libhsakmt 5.2.3 (public API only), run through
 * libualink_shim.so against a node by tests/integration/test_hsakmt_queues.py (issue 30,
 * "Tests that must exist"; spec userspace-surface §8).  Prints `ok <step> k=v ...` per step
 * and stops at the first `fail <step> ...`; the exit status is the number of the failed step.
 *
 * The packets are the gfx9 SDMA packets as ROCr 5.2.3's BlitSdmaV4 writes them (the
 * kernel's vega10_sdma_pkt_open.h layouts): each submission starts with the HDP-flush
 * register poll, reserves ring space against *rptr, zero-fills to the end of the ring when
 * a command would straddle it (a zero dword is a one-dword NOP), stores the new 64-bit
 * byte index to *wptr, then to the doorbell.
 *
 * Steps: a 4 KiB SDMA ring in GPU-mapped system memory; copies host->VRAM->host (a GTT
 * buffer and a registered malloc'd buffer, i.e. a userptr BO) checked byte for byte; FENCE;
 * a POLL_REGMEM dependency the CPU releases; ATOMIC (64-bit add of -1, ROCr's signal
 * decrement); TIMESTAMP; FENCE + TRAP waking hsaKmtWaitOnEvent; enough submissions that the
 * ring wraps; a 64 MiB copy each way, timed (argv[1] "bench"); an illegal packet on a
 * second queue, which stops that queue only; both queues destroyed.  argv[1] "idle": eight
 * idle SDMA queues held until a newline on stdin (the idle daemon's CPU is measured).
 * argv[1] "poll": one queue blocked on a forever POLL_REGMEM (ROCr's dependency poll) until
 * a newline on stdin, then the CPU releases it and the time to its fence is printed.
 */
#define _GNU_SOURCE
#include "sdma_ring.h"

int main(int argc, char **argv)
{
	HsaNodeProperties props;
	int failed;
	uint32_t gpu = 0;
	struct queue q, bad;
	HsaMemFlags vram = {0}, sysmem = {0};
	void *dev = NULL, *host = NULL, *back = NULL;
	uint64_t alt = 0, back_gpu = 0;
	size_t size = 2 << 20;
	volatile uint32_t *sig;
	int bench = argc > 1 && strcmp(argv[1], "bench") == 0;

	if ((failed = open_kfd_gpu(&gpu, &props)))
		return failed;
	if (argc > 1 && strcmp(argv[1], "idle") == 0) {
		/* 8 idle SDMA queues held until a newline on stdin (the idle-cost measurement) */
		struct queue idle[8];

		for (int i = 0; i < 8; i++)
			EXPECT("create_idle_queue", create_queue(gpu, &idle[i]));
		printf("ok idle_queues n=8\n");
		fflush(stdout);
		(void)getchar();
		for (int i = 0; i < 8; i++)
			CHECK("destroy_idle_queue", hsaKmtDestroyQueue(idle[i].res.QueueId));
		CHECK("close_kfd", hsaKmtCloseKFD());
		printf("ok done\n");
		return 0;
	}
	if (argc > 1 && strcmp(argv[1], "poll") == 0) {
		/* a forever poll (== 0 on a word the CPU holds at 1, retry 0xFFF), then a fence;
		 * pending until a newline on stdin (the daemon's CPU is measured meanwhile) */
		volatile uint32_t *w;
		double t0;

		EXPECT("create_queue", create_queue(gpu, &q));
		sysmem.ui32.PageSize = HSA_PAGE_SIZE_4KB;
		sysmem.ui32.HostAccess = 1;
		sysmem.ui32.NonPaged = 1;
		CHECK("alloc_system", hsaKmtAllocMemory(0, 4096, sysmem, &host));
		CHECK("map_system", hsaKmtMapMemoryToGPU(host, 4096, &alt));
		w = (volatile uint32_t *)host;
		w[0] = 0;
		w[1] = 1;
		{
			uint64_t a = (uintptr_t)&w[1];
			const uint32_t poll[6] = {SDMA_OP_POLL_REGMEM | 3u << 28 | 1u << 31,
						  (uint32_t)a, (uint32_t)(a >> 32), 0, 0xFFFFFFFF,
						  10 | 0xFFFu << 16};

			EXPECT("submit_poll", hdp_flush(&q) && put(&q, poll, 6) && fence(&q, w, 1));
		}
		ring_doorbell(&q);
		usleep(100000);
		EXPECT("poll_holds", w[0] == 0);
		printf("ok poll_pending\n");
		fflush(stdout);
		(void)getchar();
		EXPECT("poll_still_holds", w[0] == 0);
		t0 = now_s();
		w[1] = 0; /* the CPU releases the dependency */
		EXPECT("poll_released", wait_value(w, 1, 10));
		printf("ok poll_release latency_us=%.0f\n", (now_s() - t0) * 1e6);
		CHECK("destroy_queue", hsaKmtDestroyQueue(q.res.QueueId));
		CHECK("close_kfd", hsaKmtCloseKFD());
		printf("ok done\n");
		return 0;
	}
	EXPECT("create_queue", create_queue(gpu, &q));
	printf("ok queue id=%" PRIu64 " doorbell=%p rptr=%" PRIu64 "\n", q.res.QueueId,
	       (void *)q.res.Queue_DoorBell, *rptr(&q));

	vram.ui32.PageSize = HSA_PAGE_SIZE_4KB;
	vram.ui32.NonPaged = 1;
	vram.ui32.NoSubstitute = 1;
	if (bench)
		size = 64 << 20;
	CHECK("alloc_vram", hsaKmtAllocMemory(gpu, size, vram, &dev));
	CHECK("map_vram", hsaKmtMapMemoryToGPU(dev, size, &alt));
	sysmem.ui32.PageSize = HSA_PAGE_SIZE_4KB;
	sysmem.ui32.HostAccess = 1;
	sysmem.ui32.NonPaged = 1;
	CHECK("alloc_system", hsaKmtAllocMemory(0, size + 4096, sysmem, &host));
	CHECK("map_system", hsaKmtMapMemoryToGPU(host, size + 4096, &alt));
	sig = (volatile uint32_t *)((char *)host + size); /* a page of signal words */
	memset((void *)sig, 0, 4096);
	/* a registered malloc'd buffer: a userptr BO, the process's own pages */
	EXPECT("alloc_userptr", posix_memalign(&back, 4096, size) == 0);
	memset(back, 0, size);
	CHECK("register_userptr", hsaKmtRegisterMemory(back, size));
	/* a registered range's GPU VA is its own (AlternateVAGPU), as ROCr's agent pointer */
	CHECK("map_userptr", hsaKmtMapMemoryToGPU(back, size, &back_gpu));
	printf("ok userptr cpu=%p gpu=0x%" PRIx64 "\n", back, back_gpu);

	/* host -> VRAM -> userptr host buffer, then a fence */
	for (size_t i = 0; i < size; i++)
		((unsigned char *)host)[i] = (unsigned char)(i * 7 + 3);
	{
		double t0 = now_s(), t1, t2;

		EXPECT("submit_h2d", hdp_flush(&q) &&
		       copy(&q, (uintptr_t)dev, (uintptr_t)host, size) && fence(&q, sig, 1));
		ring_doorbell(&q);
		EXPECT("fence_h2d", wait_value(sig, 1, 60));
		t1 = now_s();
		EXPECT("submit_d2h", hdp_flush(&q) &&
		       copy(&q, back_gpu, (uintptr_t)dev, size) && fence(&q, sig, 2));
		ring_doorbell(&q);
		EXPECT("fence_d2h", wait_value(sig, 2, 60));
		t2 = now_s();
		EXPECT("copy_bytes", memcmp(host, back, size) == 0);
		printf("ok copy_rate bytes=%zu h2d_mib_s=%.0f d2h_mib_s=%.0f\n", size,
		       size / (t1 - t0) / (1 << 20), size / (t2 - t1) / (1 << 20));
	}
	if (bench) { /* an empty submission's doorbell -> fence latency, back to back */
		double best = 1e9, total = 0;

		for (uint32_t i = 0; i < 200; i++) {
			double t0 = now_s(), dt;

			if (!fence(&q, &sig[3], 1000 + i))
				break;
			ring_doorbell(&q);
			if (!wait_value(&sig[3], 1000 + i, 10))
				break;
			dt = now_s() - t0;
			total += dt;
			best = dt < best ? dt : best;
		}
		printf("ok fence_latency mean_us=%.0f best_us=%.0f\n", total / 200 * 1e6,
		       best * 1e6);
	}
	/* rptr written back as the engine consumed: it reaches the producer's index */
	{
		double until = now_s() + 10;

		while (*rptr(&q) != q.index && now_s() < until)
			usleep(20);
		EXPECT("rptr_written_back", *rptr(&q) == q.index);
	}

	/* POLL_REGMEM: a dependency (== 0 on a word the CPU holds at 1), then a fence */
	sig[1] = 1;
	{
		uint64_t a = (uintptr_t)&sig[1];
		const uint32_t poll[6] = {SDMA_OP_POLL_REGMEM | 3u << 28 | 1u << 31, (uint32_t)a,
					  (uint32_t)(a >> 32), 0, 0xFFFFFFFF, 10 | 0xFFFu << 16};

		EXPECT("submit_poll", hdp_flush(&q) && put(&q, poll, 6) && fence(&q, sig, 3));
		ring_doorbell(&q);
		usleep(200000);
		EXPECT("poll_holds", sig[0] == 2);
		sig[1] = 0; /* the CPU releases the dependency */
		EXPECT("poll_released", wait_value(sig, 3, 10));
	}
	/* ATOMIC: 64-bit add of -1 (ROCr's signal decrement), returning form */
	{
		volatile uint64_t *value = (volatile uint64_t *)&sig[4];
		uint64_t a = (uintptr_t)value, src = (uint64_t)-1;
		const uint32_t cmd[8] = {SDMA_OP_ATOMIC | (uint32_t)SDMA_ATOMIC_ADD64 << 25,
					 (uint32_t)a, (uint32_t)(a >> 32), (uint32_t)src,
					 (uint32_t)(src >> 32), 0, 0, 0};

		*value = 5;
		EXPECT("submit_atomic", put(&q, cmd, 8) && fence(&q, sig, 4));
		ring_doorbell(&q);
		EXPECT("atomic_fence", wait_value(sig, 4, 10));
		EXPECT("atomic_value", *value == 4);
	}
	/* TIMESTAMP: the GPU clock, twice, increasing */
	{
		volatile uint64_t *ts = (volatile uint64_t *)&sig[8];
		uint64_t a = (uintptr_t)ts, b = (uintptr_t)(ts + 1);
		const uint32_t t1[3] = {SDMA_OP_TIMESTAMP | SDMA_SUBOP_TIMESTAMP_GET_GLOBAL << 8,
					(uint32_t)a, (uint32_t)(a >> 32)};
		const uint32_t t2[3] = {SDMA_OP_TIMESTAMP | SDMA_SUBOP_TIMESTAMP_GET_GLOBAL << 8,
					(uint32_t)b, (uint32_t)(b >> 32)};

		EXPECT("submit_timestamp", put(&q, t1, 3) && fence(&q, sig, 5) && put(&q, t2, 3) &&
		       fence(&q, sig, 6));
		ring_doorbell(&q);
		EXPECT("timestamp_fence", wait_value(sig, 6, 10));
		printf("ok timestamps t1=%" PRIu64 " t2=%" PRIu64 "\n", ts[0], ts[1]);
		EXPECT("timestamp_increases", ts[0] != 0 && ts[1] > ts[0]);
	}
	/* FENCE to the event's mailbox then TRAP(event id): wakes hsaKmtWaitOnEvent */
	{
		HsaEventDescriptor desc = {.EventType = HSA_EVENTTYPE_SIGNAL, .NodeId = gpu};
		HsaEvent *ev = NULL;
		uint32_t id;
		volatile uint32_t *mailbox;

		CHECK("create_event", hsaKmtCreateEvent(&desc, false, false, &ev));
		id = ev->EventId;
		mailbox = (volatile uint32_t *)(uintptr_t)ev->EventData.HWData2;
		EXPECT("event_unsignaled", hsaKmtWaitOnEvent(ev, 0) == HSAKMT_STATUS_WAIT_TIMEOUT);
		{
			const uint32_t trap[2] = {SDMA_OP_TRAP, id & 0x0FFFFFFF};

			EXPECT("submit_trap", fence(&q, mailbox, id) && put(&q, trap, 2));
		}
		ring_doorbell(&q);
		CHECK("trap_wakes_wait", hsaKmtWaitOnEvent(ev, 10000));
		printf("ok trap_woke id=%u\n", id);
		CHECK("destroy_event", hsaKmtDestroyEvent(ev));
	}
	/* A ring that wraps: fences until the index passed the ring size several times */
	{
		uint32_t n = 0;
		uint64_t start = q.index;

		while (q.index < start + 3 * RING_SIZE) {
			n++;
			if (!(hdp_flush(&q) && fence(&q, sig, 100 + n)))
				break;
			ring_doorbell(&q);
		}
		EXPECT("ring_wraps", wait_value(sig, 100 + n, 10));
		printf("ok wrapped submissions=%u index=%" PRIu64 " rptr=%" PRIu64 "\n", n, q.index,
		       *rptr(&q));
	}
	/* An illegal packet stops its queue only: the fence after it never lands */
	EXPECT("create_second_queue", create_queue(gpu, &bad));
	{
		const uint32_t illegal[1] = {0xFF};

		sig[2] = 0;
		EXPECT("submit_illegal", put(&bad, illegal, 1) && fence(&bad, &sig[2], 7));
		ring_doorbell(&bad);
		usleep(300000);
		EXPECT("illegal_stops_queue", sig[2] == 0);
		/* the other queue goes on */
		EXPECT("other_queue_runs", fence(&q, sig, 8));
		ring_doorbell(&q);
		EXPECT("other_queue_fence", wait_value(sig, 8, 10));
	}
	printf("ok queues_before_destroy\n");
	fflush(stdout);
	if (getenv("HSAKMT_SDMA_PAUSE")) /* the test reads the node's tables, then a newline */
		(void)getchar();
	CHECK("destroy_bad", hsaKmtDestroyQueue(bad.res.QueueId));
	CHECK("destroy_queue", hsaKmtDestroyQueue(q.res.QueueId));
	CHECK("deregister", hsaKmtUnmapMemoryToGPU(back));
	CHECK("deregister2", hsaKmtDeregisterMemory(back));
	CHECK("close_kfd", hsaKmtCloseKFD());
	printf("ok done\n");
	return 0;
}
