/*
 * An unmodified ROCr client (Debian's libhsa-runtime64 5.2.3), run through libualink_shim.so
 * against a node with a gfx90a accel by tests/integration/test_rocr.py (issue 30, "Tests that
 * must exist": ROCr).  Public HSA API only (hsa.h, hsa_ext_amd.h).  Prints `ok <step> k=v`
 * per step and stops at the first `fail <step> ...`; the exit status is that step's number.
 * alarm() bounds the whole run: a wait that never ends is a failure, not a hang.
 *
 * Steps: hsa_init; the CPU and GPU agents and their pools; hsa_queue_create (an AQL queue:
 * CREATE_QUEUE COMPUTE_AQL); hsa_amd_memory_async_copy host->VRAM->host at several sizes
 * (ROCr's BlitSdma: SDMA queues) with the bytes checked; a copy held by a dependency signal
 * until the CPU releases it; a blocking hsa_signal_wait on a long copy (the interrupt path:
 * mailbox FENCE + TRAP -> KFD event -> hsaKmtWaitOnEvent); a BARRIER_AND packet on the AQL
 * queue waiting on a signal; a KERNEL_DISPATCH that fails visibly (the queue's error
 * callback, the completion signal never decremented); hsa_queue_destroy; hsa_shut_down.
 *
 * argv[1], optional: "dispatch" runs only the failing dispatch, "bad" only a packet of an
 * unknown type (default: every step, BARRIER_OR and AMD's barrier-value packet included).
 */
#define _GNU_SOURCE
#include <hsa/hsa.h>
#include <hsa/hsa_ext_amd.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int step;
static hsa_agent_t cpu, gpu;
static hsa_amd_memory_pool_t sys_pool, vram_pool;
static int have_sys, have_vram;
static _Atomic int queue_error_status;
static _Atomic int queue_errors;

#define FAIL(name, fmt, ...)                                                      \
	do {                                                                      \
		printf("fail %s " fmt "\n", name, ##__VA_ARGS__);                 \
		fflush(stdout);                                                   \
		exit(step);                                                       \
	} while (0)

#define CHECK(name, call)                                                         \
	do {                                                                      \
		hsa_status_t s_ = (call);                                         \
		step++;                                                           \
		if (s_ != HSA_STATUS_SUCCESS) {                                   \
			const char *m_ = "";                                      \
			hsa_status_string(s_, &m_);                               \
			FAIL(name, "status=0x%x msg=\"%s\"", (unsigned)s_, m_);   \
		}                                                                 \
	} while (0)

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static hsa_status_t agent_cb(hsa_agent_t agent, void *data)
{
	hsa_device_type_t dev;
	(void)data;
	if (hsa_agent_get_info(agent, HSA_AGENT_INFO_DEVICE, &dev) != HSA_STATUS_SUCCESS)
		return HSA_STATUS_ERROR;
	if (dev == HSA_DEVICE_TYPE_CPU && !cpu.handle)
		cpu = agent;
	if (dev == HSA_DEVICE_TYPE_GPU && !gpu.handle)
		gpu = agent;
	return HSA_STATUS_SUCCESS;
}

static hsa_status_t pool_cb(hsa_amd_memory_pool_t pool, void *data)
{
	int is_gpu = data != NULL;
	hsa_amd_segment_t seg;
	uint32_t flags = 0;
	bool alloc = false;

	hsa_amd_memory_pool_get_info(pool, HSA_AMD_MEMORY_POOL_INFO_SEGMENT, &seg);
	hsa_amd_memory_pool_get_info(pool, HSA_AMD_MEMORY_POOL_INFO_RUNTIME_ALLOC_ALLOWED, &alloc);
	if (seg != HSA_AMD_SEGMENT_GLOBAL || !alloc)
		return HSA_STATUS_SUCCESS;
	hsa_amd_memory_pool_get_info(pool, HSA_AMD_MEMORY_POOL_INFO_GLOBAL_FLAGS, &flags);
	if (is_gpu && !have_vram && (flags & HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_COARSE_GRAINED)) {
		vram_pool = pool;
		have_vram = 1;
	}
	if (!is_gpu && !have_sys && (flags & HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_FINE_GRAINED)) {
		sys_pool = pool;
		have_sys = 1;
	}
	return HSA_STATUS_SUCCESS;
}

static void queue_error_cb(hsa_status_t status, hsa_queue_t *source, void *data)
{
	(void)source;
	(void)data;
	atomic_store(&queue_error_status, (int)status);
	atomic_fetch_add(&queue_errors, 1);
}

static void *host_alloc(size_t size)
{
	void *p = NULL;
	CHECK("host_alloc", hsa_amd_memory_pool_allocate(sys_pool, size, 0, &p));
	CHECK("host_allow_access", hsa_amd_agents_allow_access(1, &gpu, NULL, p));
	return p;
}

static void fill(uint8_t *p, size_t n, uint32_t seed)
{
	uint32_t x = seed * 2654435761u + 1;
	for (size_t i = 0; i < n; i++) {
		x = x * 1103515245u + 12345u;
		p[i] = (uint8_t)(x >> 16);
	}
}

/* host -> VRAM -> host through hsa_amd_memory_async_copy, bytes checked */
static void copy_round_trip(size_t size, uint32_t seed)
{
	uint8_t *src = host_alloc(size), *dst = host_alloc(size);
	void *dev = NULL;
	hsa_signal_t done;
	hsa_signal_value_t v;
	double t0;

	CHECK("vram_alloc", hsa_amd_memory_pool_allocate(vram_pool, size, 0, &dev));
	fill(src, size, seed);
	memset(dst, 0xA5, size);
	CHECK("signal_create", hsa_signal_create(1, 0, NULL, &done));
	t0 = now_s();
	CHECK("copy_h2d", hsa_amd_memory_async_copy(dev, gpu, src, cpu, size, 0, NULL, done));
	v = hsa_signal_wait_scacquire(done, HSA_SIGNAL_CONDITION_LT, 1, UINT64_MAX,
				      HSA_WAIT_STATE_ACTIVE);
	step++;
	if (v != 0)
		FAIL("copy_h2d_wait", "size=%zu value=%" PRId64, size, v);
	hsa_signal_store_relaxed(done, 1);
	CHECK("copy_d2h", hsa_amd_memory_async_copy(dst, cpu, dev, gpu, size, 0, NULL, done));
	v = hsa_signal_wait_scacquire(done, HSA_SIGNAL_CONDITION_LT, 1, UINT64_MAX,
				      HSA_WAIT_STATE_ACTIVE);
	step++;
	if (v != 0)
		FAIL("copy_d2h_wait", "size=%zu value=%" PRId64, size, v);
	step++;
	if (memcmp(src, dst, size) != 0) {
		size_t i = 0;
		while (src[i] == dst[i])
			i++;
		FAIL("copy_bytes", "size=%zu first_diff=%zu", size, i);
	}
	printf("ok copy size=%zu seconds=%.6f\n", size, now_s() - t0);
	hsa_signal_destroy(done);
	hsa_amd_memory_pool_free(dev);
	hsa_amd_memory_pool_free(src);
	hsa_amd_memory_pool_free(dst);
}

/* A copy whose dependency signal the CPU releases later: nothing moves before. */
static void copy_with_dependency(void)
{
	const size_t size = 64 << 10;
	uint8_t *src = host_alloc(size), *dst = host_alloc(size);
	void *dev = NULL;
	hsa_signal_t dep, done;
	hsa_signal_value_t v;

	CHECK("vram_alloc", hsa_amd_memory_pool_allocate(vram_pool, size, 0, &dev));
	fill(src, size, 7);
	CHECK("signal_create", hsa_signal_create(1, 0, NULL, &done));
	CHECK("signal_create", hsa_signal_create(1, 0, NULL, &dep));
	CHECK("copy_h2d", hsa_amd_memory_async_copy(dev, gpu, src, cpu, size, 0, NULL, done));
	v = hsa_signal_wait_scacquire(done, HSA_SIGNAL_CONDITION_LT, 1, UINT64_MAX,
				      HSA_WAIT_STATE_ACTIVE);
	hsa_signal_store_relaxed(done, 1);
	memset(dst, 0xA5, size);
	CHECK("copy_dep", hsa_amd_memory_async_copy(dst, cpu, dev, gpu, size, 1, &dep, done));
	/* held: 200 ms later the copy has not completed nor written a byte */
	v = hsa_signal_wait_scacquire(done, HSA_SIGNAL_CONDITION_LT, 1, 200000000ull,
				      HSA_WAIT_STATE_BLOCKED);
	step++;
	if (v != 1 || dst[0] != 0xA5 || dst[size - 1] != 0xA5)
		FAIL("copy_dep_held", "value=%" PRId64 " first=%u", v, dst[0]);
	printf("ok copy_dep_held value=%" PRId64 "\n", v);
	hsa_signal_store_screlease(dep, 0);
	v = hsa_signal_wait_scacquire(done, HSA_SIGNAL_CONDITION_LT, 1, UINT64_MAX,
				      HSA_WAIT_STATE_ACTIVE);
	step++;
	if (v != 0 || memcmp(src, dst, size) != 0)
		FAIL("copy_dep_released", "value=%" PRId64, v);
	printf("ok copy_dep_released\n");
	hsa_signal_destroy(dep);
	hsa_signal_destroy(done);
	hsa_amd_memory_pool_free(dev);
	hsa_amd_memory_pool_free(src);
	hsa_amd_memory_pool_free(dst);
}

/*
 * A blocking wait (HSA_WAIT_STATE_BLOCKED): ROCr spins briefly, then sleeps in
 * hsaKmtWaitOnEvent on the signal's KFD event; only the engine's TRAP wakes it.
 */
static void blocked_wait(void)
{
	const size_t size = 32 << 20;
	uint8_t *src = host_alloc(size);
	void *dev = NULL;
	hsa_signal_t done;
	hsa_signal_value_t v;
	double t0;

	CHECK("vram_alloc", hsa_amd_memory_pool_allocate(vram_pool, size, 0, &dev));
	fill(src, size, 11);
	CHECK("signal_create", hsa_signal_create(1, 0, NULL, &done));
	t0 = now_s();
	CHECK("copy_h2d", hsa_amd_memory_async_copy(dev, gpu, src, cpu, size, 0, NULL, done));
	v = hsa_signal_wait_scacquire(done, HSA_SIGNAL_CONDITION_EQ, 0, UINT64_MAX,
				      HSA_WAIT_STATE_BLOCKED);
	step++;
	if (v != 0)
		FAIL("blocked_wait", "value=%" PRId64, v);
	printf("ok blocked_wait size=%zu seconds=%.6f\n", size, now_s() - t0);
	hsa_signal_destroy(done);
	hsa_amd_memory_pool_free(dev);
	hsa_amd_memory_pool_free(src);
}

/* Reserve one AQL slot, write the body, publish the header last, ring the doorbell. */
static void submit(hsa_queue_t *q, const void *pkt)
{
	uint64_t idx = hsa_queue_add_write_index_screlease(q, 1);
	uint32_t *slot;

	while (idx - hsa_queue_load_read_index_scacquire(q) >= q->size)
		usleep(100);
	slot = (uint32_t *)((char *)q->base_address + (idx % q->size) * 64);
	memcpy(slot + 1, (const uint32_t *)pkt + 1, 60);
	__atomic_store_n(slot, *(const uint32_t *)pkt, __ATOMIC_RELEASE);
	hsa_signal_store_screlease(q->doorbell_signal, (hsa_signal_value_t)idx);
}

static uint16_t header(hsa_packet_type_t type)
{
	return (uint16_t)((type << HSA_PACKET_HEADER_TYPE) | (1 << HSA_PACKET_HEADER_BARRIER) |
			  (HSA_FENCE_SCOPE_SYSTEM << HSA_PACKET_HEADER_SCACQUIRE_FENCE_SCOPE) |
			  (HSA_FENCE_SCOPE_SYSTEM << HSA_PACKET_HEADER_SCRELEASE_FENCE_SCOPE));
}

static void barrier_and(hsa_queue_t *q)
{
	hsa_barrier_and_packet_t p;
	hsa_signal_t dep, done;
	hsa_signal_value_t v;

	CHECK("signal_create", hsa_signal_create(1, 0, NULL, &dep));
	CHECK("signal_create", hsa_signal_create(1, 0, NULL, &done));
	memset(&p, 0, sizeof(p));
	p.header = header(HSA_PACKET_TYPE_BARRIER_AND);
	p.dep_signal[0] = dep;
	p.completion_signal = done;
	submit(q, &p);
	v = hsa_signal_wait_scacquire(done, HSA_SIGNAL_CONDITION_LT, 1, 200000000ull,
				      HSA_WAIT_STATE_BLOCKED);
	step++;
	if (v != 1)
		FAIL("barrier_and_held", "value=%" PRId64, v);
	hsa_signal_store_screlease(dep, 0);
	v = hsa_signal_wait_scacquire(done, HSA_SIGNAL_CONDITION_LT, 1, UINT64_MAX,
				      HSA_WAIT_STATE_BLOCKED);
	step++;
	if (v != 0)
		FAIL("barrier_and", "value=%" PRId64, v);
	printf("ok barrier_and read_index=%" PRIu64 "\n", hsa_queue_load_read_index_scacquire(q));
	hsa_signal_destroy(dep);
	hsa_signal_destroy(done);
}

/* BARRIER_OR: any one dependency at 0 releases it */
static void barrier_or(hsa_queue_t *q)
{
	hsa_barrier_or_packet_t p;
	hsa_signal_t a, b, done;
	hsa_signal_value_t v;

	CHECK("signal_create", hsa_signal_create(1, 0, NULL, &a));
	CHECK("signal_create", hsa_signal_create(1, 0, NULL, &b));
	CHECK("signal_create", hsa_signal_create(1, 0, NULL, &done));
	memset(&p, 0, sizeof(p));
	p.header = header(HSA_PACKET_TYPE_BARRIER_OR);
	p.dep_signal[0] = a;
	p.dep_signal[3] = b;
	p.completion_signal = done;
	submit(q, &p);
	v = hsa_signal_wait_scacquire(done, HSA_SIGNAL_CONDITION_LT, 1, 100000000ull,
				      HSA_WAIT_STATE_BLOCKED);
	step++;
	if (v != 1)
		FAIL("barrier_or_held", "value=%" PRId64, v);
	hsa_signal_store_screlease(b, 0);
	v = hsa_signal_wait_scacquire(done, HSA_SIGNAL_CONDITION_LT, 1, UINT64_MAX,
				      HSA_WAIT_STATE_BLOCKED);
	step++;
	if (v != 0)
		FAIL("barrier_or", "value=%" PRId64, v);
	printf("ok barrier_or\n");
	hsa_signal_destroy(a);
	hsa_signal_destroy(b);
	hsa_signal_destroy(done);
}

/* AMD's barrier-value vendor packet (hsa_ext_amd.h): wait until (value & mask) < 3 */
static void barrier_value(hsa_queue_t *q)
{
	hsa_amd_barrier_value_packet_t p;
	hsa_signal_t s, done;
	hsa_signal_value_t v;

	CHECK("signal_create", hsa_signal_create(0x105, 0, NULL, &s));
	CHECK("signal_create", hsa_signal_create(1, 0, NULL, &done));
	memset(&p, 0, sizeof(p));
	p.header.AmdFormat = HSA_AMD_PACKET_TYPE_BARRIER_VALUE;
	p.signal = s;
	p.value = 3;
	p.mask = 0xFF;
	p.cond = HSA_SIGNAL_CONDITION_LT;
	p.completion_signal = done;
	p.header.header = header(HSA_PACKET_TYPE_VENDOR_SPECIFIC);
	submit(q, &p);
	v = hsa_signal_wait_scacquire(done, HSA_SIGNAL_CONDITION_LT, 1, 100000000ull,
				      HSA_WAIT_STATE_BLOCKED);
	step++;
	if (v != 1)
		FAIL("barrier_value_held", "value=%" PRId64, v);
	hsa_signal_store_screlease(s, 0x302); /* 0x02 under the mask */
	v = hsa_signal_wait_scacquire(done, HSA_SIGNAL_CONDITION_LT, 1, UINT64_MAX,
				      HSA_WAIT_STATE_BLOCKED);
	step++;
	if (v != 0)
		FAIL("barrier_value", "value=%" PRId64, v);
	printf("ok barrier_value\n");
	hsa_signal_destroy(s);
	hsa_signal_destroy(done);
}

/* A packet type hsa.h does not define: the queue reports INVALID_PACKET_FORMAT. */
static void bad_packet(hsa_queue_t *q)
{
	uint8_t p[64];
	double t0 = now_s();

	memset(p, 0, sizeof(p));
	p[0] = 0x17;
	submit(q, p);
	step++;
	while (atomic_load(&queue_errors) == 0) {
		if (now_s() - t0 > 20)
			FAIL("bad_packet", "no queue error after 20 s");
		usleep(1000);
	}
	printf("ok bad_packet status=0x%x\n", atomic_load(&queue_error_status));
}

/*
 * A kernel dispatch: the emulated GPU has no ISA, so the queue reports an error (the
 * error callback hsa_queue_create was given), and the completion signal stays 1.
 */
static void dispatch_fails(hsa_queue_t *q)
{
	hsa_kernel_dispatch_packet_t p;
	hsa_signal_t done;
	hsa_signal_value_t v;
	double t0 = now_s();
	void *code = host_alloc(4096);

	memset(code, 0, 4096);
	CHECK("signal_create", hsa_signal_create(1, 0, NULL, &done));
	memset(&p, 0, sizeof(p));
	p.header = header(HSA_PACKET_TYPE_KERNEL_DISPATCH);
	p.setup = 1 << HSA_KERNEL_DISPATCH_PACKET_SETUP_DIMENSIONS;
	p.workgroup_size_x = p.workgroup_size_y = p.workgroup_size_z = 1;
	p.grid_size_x = p.grid_size_y = p.grid_size_z = 1;
	p.kernel_object = (uint64_t)(uintptr_t)code;
	p.completion_signal = done;
	submit(q, &p);
	step++;
	while (atomic_load(&queue_errors) == 0) {
		if (now_s() - t0 > 20)
			FAIL("dispatch_error", "no queue error after 20 s");
		usleep(1000);
	}
	v = hsa_signal_load_scacquire(done);
	step++;
	if (v != 1)
		FAIL("dispatch_not_completed", "value=%" PRId64, v);
	printf("ok dispatch_fails status=0x%x kernel_object=0x%" PRIx64 " completion=%" PRId64
	       "\n", atomic_load(&queue_error_status), p.kernel_object, v);
	hsa_signal_destroy(done);
	hsa_amd_memory_pool_free(code);
}

int main(int argc, char **argv)
{
	hsa_queue_t *q = NULL;
	static const size_t sizes[] = {4, 4096, 65536 + 12, 4 << 20, 9 << 20};
	int only_dispatch = argc > 1 && (strcmp(argv[1], "dispatch") == 0 ||
					  strcmp(argv[1], "bad") == 0);

	alarm(240);
	setvbuf(stdout, NULL, _IOLBF, 0);
	CHECK("hsa_init", hsa_init());
	printf("ok hsa_init\n");
	CHECK("iterate_agents", hsa_iterate_agents(agent_cb, NULL));
	step++;
	if (!cpu.handle || !gpu.handle)
		FAIL("agents", "cpu=%d gpu=%d", cpu.handle != 0, gpu.handle != 0);
	CHECK("cpu_pools", hsa_amd_agent_iterate_memory_pools(cpu, pool_cb, NULL));
	CHECK("gpu_pools", hsa_amd_agent_iterate_memory_pools(gpu, pool_cb, (void *)1));
	step++;
	if (!have_sys || !have_vram)
		FAIL("pools", "sys=%d vram=%d", have_sys, have_vram);
	printf("ok agents\n");
	CHECK("queue_create", hsa_queue_create(gpu, 1024, HSA_QUEUE_TYPE_MULTI, queue_error_cb,
					       NULL, UINT32_MAX, UINT32_MAX, &q));
	printf("ok queue_create size=%u\n", q->size);
	if (!only_dispatch) {
		for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
			copy_round_trip(sizes[i], (uint32_t)i);
		copy_with_dependency();
		blocked_wait();
		barrier_and(q);
		barrier_or(q);
		barrier_value(q);
	}
	if (argc > 1 && strcmp(argv[1], "bad") == 0)
		bad_packet(q);
	else
		dispatch_fails(q);
	CHECK("queue_destroy", hsa_queue_destroy(q));
	printf("ok queue_destroy\n");
	CHECK("shut_down", hsa_shut_down());
	printf("ok shut_down\n");
	return 0;
}
