/*
 * sdma_bench: the SDMA engine's figures for `make bench` (benchmarks/run.py), measured by an
 * unmodified libhsakmt 5.2.3 client through the shim, with their C floors in the same process
 * where there is one. Packets as ROCr's BlitSdmaV4 writes them (spec userspace-surface §8).
 *
 * Each submission ends as ROCr's BlitSdmaV4 ends a copy whose completion signal is an
 * interrupt signal (the default kind): FENCE of the signal's value, FENCE of the event id to
 * the event's mailbox, TRAP(event id). The client then waits as ROCr's
 * InterruptSignal::WaitRelaxed waits: it spins on the value for up to 200 µs (its
 * kMaxElapsed), then sleeps in hsaKmtWaitOnEvent until the TRAP's interrupt, looking again
 * each time it wakes. (Spinning for the whole copy, as this client did before, is not what a
 * runtime does, and with client and daemon pinned to one CPU it takes the CPU from the daemon
 * the copy waits for.) SDMA_BENCH_WAIT=spin spins throughout, for comparison.
 *
 *   sdma_bench local <bytes> <reps>
 *       SDMA copies host->VRAM and VRAM->host of <bytes> (COPY_LINEAR chunks + the end
 *       above), and a C memcpy of the same size between two host buffers:
 *       `h2d_ns=<median> d2h_ns=<median> memcpy_ns=<median>`; then the floor of what the
 *       daemon's copy does physically: process_vm_readv of <bytes> of a child's anonymous
 *       memory into this process, on one thread and split over two (what the daemon does
 *       with two CPUs): `pvm_ns=<median> pvm2_ns=<median>`
 *   sdma_bench remote <lo> <hi> <bytes> <reps>
 *       the UALink import of an exported BO (fabric_sdma export), GEM_VA into the KFD
 *       process's VM, SDMA copies remote->host: `remote_ns=<median>`
 *   sdma_bench fence <reps> [<quiet_ms>]
 *       an empty submission (one FENCE), doorbell store to fence seen: `fence_ns=<median>`;
 *       with <quiet_ms>, each submission after that long a quiet spell (the doorbell's
 *       pickup once the daemon's watch has backed off): `fence_quiet_ns=<median>`
 */
#define _GNU_SOURCE
#include <errno.h>
#include <hsakmt.h>
#include <pthread.h>
#include <signal.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "ualink/ualink_drm.h" /* the DRM/amdgpu uAPI subset, UALink included */
#include "../tests/c/render_fd.h" /* acquired_render_fd */

#define RING_SIZE (1u << 20)
#define COPY_CHUNK 0x3FFFE0u
#define SPIN_NS 200000u /* ROCr 5.2's InterruptSignal::WaitRelaxed: kMaxElapsed */

static int spin_only; /* SDMA_BENCH_WAIT=spin */

static void die(const char *what, long v)
{
	fprintf(stderr, "sdma_bench: %s failed (%ld, errno %d)\n", what, v, errno);
	exit(1);
}
#define KMT(call) do { HSAKMT_STATUS s_ = (call); if (s_) die(#call, s_); } while (0)

static uint64_t now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static uint64_t median(uint64_t *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_u64);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static uint32_t gpu_node;
static HsaMemFlags sysmem;

static void *sys_alloc(size_t size)
{
	void *p = NULL;
	uint64_t alt;
	KMT(hsaKmtAllocMemory(0, size, sysmem, &p));
	KMT(hsaKmtMapMemoryToGPU(p, size, &alt));
	return p;
}

struct sdma {
	uint32_t *ring;
	HsaQueueResource res;
	uint64_t wptr;
	volatile uint32_t *fence;
	uint32_t value;
	HsaEvent *event; /* the TRAP's: ROCr's interrupt signal's event */
};

static void open_queue(struct sdma *q)
{
	HsaSystemProperties sys;

	KMT(hsaKmtOpenKFD());
	KMT(hsaKmtAcquireSystemProperties(&sys));
	for (uint32_t n = 0; n < sys.NumNodes && !gpu_node; n++) {
		HsaNodeProperties p;
		KMT(hsaKmtGetNodeProperties(n, &p));
		if (p.NumFComputeCores)
			gpu_node = n;
	}
	if (!gpu_node)
		die("a GPU node", 0);
	sysmem.ui32.PageSize = HSA_PAGE_SIZE_4KB;
	sysmem.ui32.HostAccess = 1;
	q->ring = sys_alloc(RING_SIZE);
	q->fence = sys_alloc(4096);
	memset(q->ring, 0, RING_SIZE);
	KMT(hsaKmtCreateQueue(gpu_node, HSA_QUEUE_SDMA, 100, HSA_QUEUE_PRIORITY_MAXIMUM, q->ring,
			      RING_SIZE, NULL, &q->res));
	{
		HsaEventDescriptor desc = {.EventType = HSA_EVENTTYPE_SIGNAL, .NodeId = gpu_node};

		KMT(hsaKmtCreateEvent(&desc, false, false, &q->event));
	}
	spin_only = getenv("SDMA_BENCH_WAIT") && strcmp(getenv("SDMA_BENCH_WAIT"), "spin") == 0;
}

static void emit(struct sdma *q, const uint32_t *dw, unsigned n)
{
	while (q->wptr + n * 4 - __atomic_load_n((uint64_t *)q->res.Queue_read_ptr,
						 __ATOMIC_ACQUIRE) >= RING_SIZE)
		;
	if ((q->wptr % RING_SIZE) + n * 4 > RING_SIZE)
		while (q->wptr % RING_SIZE)
			q->ring[(q->wptr % RING_SIZE) / 4] = 0, q->wptr += 4;
	for (unsigned i = 0; i < n; i++)
		q->ring[(q->wptr % RING_SIZE) / 4 + i] = dw[i];
	q->wptr += n * 4;
}

/* the packets of one submission (copy chunks, then the fence), the doorbell, and the wait:
 * the time from the doorbell store to the fence seen */
static uint64_t submit_wait(struct sdma *q, uint64_t dst, uint64_t src, uint64_t size)
{
	uint64_t fence = (uint64_t)(uintptr_t)q->fence, t0;
	uint32_t value = ++q->value;

	for (uint64_t done = 0; done < size;) {
		uint64_t n = size - done < COPY_CHUNK ? size - done : COPY_CHUNK;
		uint32_t copy[7] = {1, (uint32_t)(n - 1), 0, (uint32_t)(src + done),
				    (uint32_t)((src + done) >> 32), (uint32_t)(dst + done),
				    (uint32_t)((dst + done) >> 32)};
		emit(q, copy, 7);
		done += n;
	}
	{
		uint64_t mbox = q->event->EventData.HWData2;
		uint32_t id = q->event->EventId;
		uint32_t f[4] = {5, (uint32_t)fence, (uint32_t)(fence >> 32), value};
		uint32_t m[4] = {5, (uint32_t)mbox, (uint32_t)(mbox >> 32), id};
		uint32_t trap[2] = {6, id & 0x0FFFFFFFu};

		emit(q, f, 4);
		emit(q, m, 4);
		emit(q, trap, 2);
	}
	__atomic_store_n((uint64_t *)q->res.Queue_write_ptr, q->wptr, __ATOMIC_RELEASE);
	t0 = now_ns();
	__atomic_store_n((uint64_t *)q->res.Queue_DoorBell, q->wptr, __ATOMIC_RELEASE);
	while (__atomic_load_n(q->fence, __ATOMIC_ACQUIRE) != value) {
		uint64_t waited = now_ns() - t0;

		if (waited > 60ull * 1000000000u)
			die("a fence within 60 s", value);
		if (spin_only || waited < SPIN_NS)
			continue;
		/* (auto-reset: a TRAP of an earlier submission that came after its fence was
		 * seen wakes this wait once; the loop looks at the fence again) */
		HSAKMT_STATUS s = hsaKmtWaitOnEvent(q->event, 1000);
		if (s != HSAKMT_STATUS_SUCCESS && s != HSAKMT_STATUS_WAIT_TIMEOUT)
			die("hsaKmtWaitOnEvent", s);
	}
	return now_ns() - t0;
}

/* the process_vm_readv floor: a child holds <size> bytes of anonymous memory, the parent
 * reads them into `into` (one call per thread, as the daemon's worker does) */
struct pvm_half {
	pid_t pid;
	char *local;
	uint64_t remote;
	size_t size;
};

static void *pvm_read(void *arg)
{
	struct pvm_half *h = arg;
	struct iovec l = {h->local, h->size}, r = {(void *)(uintptr_t)h->remote, h->size};

	if (process_vm_readv(h->pid, &l, 1, &r, 1, 0) != (ssize_t)h->size)
		die("process_vm_readv", -errno);
	return NULL;
}

static void pvm_floor(char *into, size_t size, int reps)
{
	int fds[2];
	uint64_t remote, *one = calloc((size_t)reps, 8), *two = calloc((size_t)reps, 8);
	pid_t pid;

	if (pipe(fds))
		die("pipe", -errno);
	pid = fork();
	if (pid == 0) {
		char *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

		if (m == MAP_FAILED)
			_exit(1);
		memset(m, 0x3c, size);
		remote = (uint64_t)(uintptr_t)m;
		if (write(fds[1], &remote, 8) != 8)
			_exit(1);
		pause();
		_exit(0);
	}
	if (pid < 0 || read(fds[0], &remote, 8) != 8)
		die("the floor's child", pid);
	for (int i = 0; i < reps; i++) {
		struct pvm_half a = {pid, into, remote, size / 2}, b = a;
		pthread_t t;
		uint64_t t0 = now_ns();

		a.size = size;
		pvm_read(&a);
		one[i] = now_ns() - t0;
		a.size = size / 2;
		b.local += size / 2, b.remote += size / 2, b.size = size - size / 2;
		t0 = now_ns();
		if (pthread_create(&t, NULL, pvm_read, &b))
			die("pthread_create", 0);
		pvm_read(&a);
		pthread_join(t, NULL);
		two[i] = now_ns() - t0;
	}
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	close(fds[0]);
	close(fds[1]);
	printf("pvm_ns=%" PRIu64 " pvm2_ns=%" PRIu64 "\n", median(one, reps), median(two, reps));
}

int main(int argc, char **argv)
{
	struct sdma q = {0};
	int reps;
	uint64_t *t, *t2, *t3;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 4 && strcmp(argv[1], "local") == 0) {
		size_t size = strtoull(argv[2], NULL, 0);
		HsaMemFlags vram = {0};
		void *dev = NULL, *h, *h2;
		uint64_t alt;

		reps = atoi(argv[3]);
		open_queue(&q);
		vram.ui32.PageSize = HSA_PAGE_SIZE_4KB;
		vram.ui32.NonPaged = 1;
		vram.ui32.NoSubstitute = 1;
		KMT(hsaKmtAllocMemory(gpu_node, size, vram, &dev));
		KMT(hsaKmtMapMemoryToGPU(dev, size, &alt));
		h = sys_alloc(size);
		h2 = sys_alloc(size);
		memset(h, 0x5a, size);
		memset(h2, 0, size);
		t = calloc((size_t)reps, 8), t2 = calloc((size_t)reps, 8), t3 = calloc((size_t)reps, 8);
		submit_wait(&q, (uint64_t)(uintptr_t)dev, (uint64_t)(uintptr_t)h, size); /* warm */
		for (int i = 0; i < reps; i++) {
			uint64_t t0;

			t[i] = submit_wait(&q, (uint64_t)(uintptr_t)dev, (uint64_t)(uintptr_t)h, size);
			t2[i] = submit_wait(&q, (uint64_t)(uintptr_t)h2, (uint64_t)(uintptr_t)dev,
					    size);
			t0 = now_ns();
			memcpy(h2, h, size);
			__asm__ volatile("" ::: "memory");
			t3[i] = now_ns() - t0;
		}
		if (memcmp(h, h2, size) != 0)
			die("the bytes copied back", 0);
		printf("h2d_ns=%" PRIu64 " d2h_ns=%" PRIu64 " memcpy_ns=%" PRIu64 " bytes=%zu\n",
		       median(t, reps), median(t2, reps), median(t3, reps), size);
		pvm_floor(h2, size, reps);
	} else if (argc == 6 && strcmp(argv[1], "remote") == 0) {
		union drm_amdgpu_ualink_handle u;
		struct drm_prime_handle ph = {0};
		struct drm_amdgpu_gem_va gva = {0};
		size_t size = strtoull(argv[4], NULL, 0);
		HsaNodeProperties p;
		uint64_t remote;
		void *h, *reserve;
		int fd;

		reps = atoi(argv[5]);
		open_queue(&q);
		KMT(hsaKmtGetNodeProperties(gpu_node, &p));
		fd = acquired_render_fd(p.DrmRenderMinor);
		if (fd < 0)
			die("the acquired render fd", fd);
		memset(&u, 0, sizeof(u));
		u.in.op = DRM_AMDGPU_UALINK_HANDLE_OP_IMPORT;
		u.in.import_ualink_handle[0] = strtoull(argv[2], NULL, 0);
		u.in.import_ualink_handle[1] = strtoull(argv[3], NULL, 0);
		if (ioctl(fd, DRM_IOCTL_AMDGPU_UALINK_HANDLE, &u))
			die("the UALink import", -errno);
		ph.fd = (int32_t)u.out.import_dmabuf_handle;
		if (ioctl(fd, DRM_IOCTL_PRIME_FD_TO_HANDLE, &ph))
			die("PRIME_FD_TO_HANDLE", -errno);
		close(ph.fd);
		reserve = mmap(NULL, size + (2u << 20), PROT_NONE,
			       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		if (reserve == MAP_FAILED)
			die("a VA reservation", -errno);
		remote = ((uint64_t)(uintptr_t)reserve + (2u << 20) - 1) & ~(uint64_t)((2u << 20) - 1);
		gva.handle = ph.handle;
		gva.operation = AMDGPU_VA_OP_MAP;
		gva.flags = AMDGPU_VM_PAGE_READABLE | AMDGPU_VM_PAGE_WRITEABLE;
		gva.va_address = remote;
		gva.map_size = size;
		if (ioctl(fd, DRM_IOCTL_AMDGPU_GEM_VA, &gva))
			die("GEM_VA", -errno);
		h = sys_alloc(size);
		t = calloc((size_t)reps, 8);
		submit_wait(&q, (uint64_t)(uintptr_t)h, remote, size); /* warm */
		for (int i = 0; i < reps; i++)
			t[i] = submit_wait(&q, (uint64_t)(uintptr_t)h, remote, size);
		printf("remote_ns=%" PRIu64 " bytes=%zu\n", median(t, reps), size);
	} else if ((argc == 3 || argc == 4) && strcmp(argv[1], "fence") == 0) {
		int quiet_ms = argc == 4 ? atoi(argv[3]) : 0;

		reps = atoi(argv[2]);
		open_queue(&q);
		t = calloc((size_t)reps, 8);
		submit_wait(&q, 0, 0, 0);
		for (int i = 0; i < reps; i++) {
			if (quiet_ms)
				usleep((useconds_t)quiet_ms * 1000);
			t[i] = submit_wait(&q, 0, 0, 0);
		}
		printf("%s=%" PRIu64 "\n", quiet_ms ? "fence_quiet_ns" : "fence_ns", median(t, reps));
	} else {
		fprintf(stderr, "usage: sdma_bench local BYTES REPS | remote LO HI BYTES REPS | "
				"fence REPS [QUIET_MS]\n");
		return 2;
	}
	KMT(hsaKmtDestroyQueue(q.res.QueueId));
	KMT(hsaKmtDestroyEvent(q.event));
	KMT(hsaKmtCloseKFD());
	return 0;
}
