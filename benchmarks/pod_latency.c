/* SPDX-License-Identifier: MIT */
/*
 * pod_latency import <exporter-render> <importer-render> <count> [warmup]
 * pod_latency load <exporter-render> <importer-render> <size>:<count> [...]
 * pod_latency store <exporter-render> <importer-render> <size>:<count> [...]
 * pod_latency cycle <exporter-render> <importer-render> <count> <settle-ns> <exporter-pid>
 *             <importer-pid>
 *
 * ualinkd's pod figures from a C client issuing raw ioctl(2)s and preads, so
 * that they sit beside C floors with no Python on the client side.
 *
 * import: for each sample, a fresh 1 MiB VRAM BO is created and exported on
 *   the exporter's render node (not timed), then the importer's first import
 *   of it is timed step by step: the UALINK_HANDLE import ioctl (t0..t1), the
 *   open of <mount>/dmabuf/<token> (t1..t2) and PRIME_FD_TO_HANDLE (t2..t3).
 *   The fd, the imported handle and the BO are closed and the releases they
 *   cause are given 2 ms (IMPORT_SETTLE_NS) to settle before the next sample.  One line per
 *   timed sample: t0=.. t1=.. t2=.. t3=.. (CLOCK_MONOTONIC ns, the clock
 *   Python's time.monotonic_ns reads, so daemon-side stamps line up).
 * load: one BO of the largest size is created, mapped, filled (a local GPU
 *   store on the exporter), exported, imported, mapped at the same VA on the
 *   importer; then each <size> is loaded with pread at that VA (a remote GPU
 *   load, looping over short counts) <count> times after count/10 warm-ups,
 *   into one page-aligned buffer.  One line per size:
 *   size=.. median_ns=.. p99_ns=.. mean_ns=.. count=..
 * store: the same with pwrite at that VA (a remote GPU store, the same BO and buffer),
 *   one line per size in the same format.
 * cycle: the import cycle of `import`, every step timed and costed: for each step
 *   (GEM_CREATE, export, the idle gap of <settle-ns>, the import ioctl, the token
 *   open, FD_TO_HANDLE, the closes, the idle gap after them) the wall time and the
 *   CPU time every thread of each daemon used meanwhile (the schedstat of each
 *   /proc/<pid>/task/<tid>).  Means over <count> cycles after count/10 warm-ups,
 *   one line per step: step=.. wall_ns=.. exporter_cpu_ns=.. importer_cpu_ns=..
 * Any failing call is fatal (exit 1, the call named on stderr).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <dirent.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "bench_stats.h"

#include "ualink/ualink_drm.h"

#define VA 0x100000000ull
#define IMPORT_BO_SIZE (1u << 20)

static void fail(const char *what)
{
	fprintf(stderr, "pod_latency: %s: %s\n", what, strerror(errno));
	exit(1);
}

static void xioctl(int fd, unsigned long cmd, void *arg, const char *what)
{
	if (ioctl(fd, cmd, arg) < 0)
		fail(what);
}

static int open_render(const char *path)
{
	int fd = open(path, O_RDWR | O_CLOEXEC);

	if (fd < 0)
		fail(path);
	return fd;
}

/* <mount>/dri/renderD128 -> <mount>/dri/../dmabuf */
static void dmabuf_dir(const char *render, char *out, size_t n)
{
	const char *slash = strrchr(render, '/');

	int len = slash ? snprintf(out, n, "%.*s/../dmabuf", (int)(slash - render), render)
			: snprintf(out, n, "../dmabuf");

	if (len < 0 || (size_t)len >= n) {
		errno = ENAMETOOLONG;
		fail(render);
	}
}

static uint32_t bo_create(int fd, uint64_t size)
{
	union drm_amdgpu_gem_create c;

	memset(&c, 0, sizeof(c));
	c.in.bo_size = size;
	c.in.alignment = 4096;
	c.in.domains = AMDGPU_GEM_DOMAIN_VRAM;
	xioctl(fd, DRM_IOCTL_AMDGPU_GEM_CREATE, &c, "GEM_CREATE");
	return c.out.handle;
}

static void gem_close(int fd, uint32_t handle)
{
	struct drm_gem_close c = { .handle = handle };

	xioctl(fd, DRM_IOCTL_GEM_CLOSE, &c, "GEM_CLOSE");
}

static void export(int fd, uint32_t bo, uint64_t handle[2])
{
	union drm_amdgpu_ualink_handle u;

	memset(&u, 0, sizeof(u));
	u.in.op = DRM_AMDGPU_UALINK_HANDLE_OP_EXPORT;
	u.in.gem_handle = bo;
	xioctl(fd, DRM_IOCTL_AMDGPU_UALINK_HANDLE, &u, "UALINK export");
	handle[0] = u.out.export_ualink_handle[0];
	handle[1] = u.out.export_ualink_handle[1];
}

static uint32_t import_token(int fd, const uint64_t handle[2])
{
	union drm_amdgpu_ualink_handle u;

	memset(&u, 0, sizeof(u));
	u.in.op = DRM_AMDGPU_UALINK_HANDLE_OP_IMPORT;
	u.in.import_ualink_handle[0] = handle[0];
	u.in.import_ualink_handle[1] = handle[1];
	xioctl(fd, DRM_IOCTL_AMDGPU_UALINK_HANDLE, &u, "UALINK import");
	return u.out.import_dmabuf_handle;
}

static int open_token(const char *dir, uint32_t token)
{
	char path[PATH_MAX];
	int fd;

	if (snprintf(path, sizeof(path), "%s/%u", dir, token) >= (int)sizeof(path)) {
		errno = ENAMETOOLONG;
		fail(dir);
	}
	fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		fail(path);
	return fd;
}

static uint32_t fd_to_handle(int fd, int dmabuf)
{
	struct drm_prime_handle p = { .fd = dmabuf };

	xioctl(fd, DRM_IOCTL_PRIME_FD_TO_HANDLE, &p, "PRIME_FD_TO_HANDLE");
	return p.handle;
}

static void va_map(int fd, uint32_t bo, uint64_t size)
{
	struct drm_amdgpu_gem_va va;

	memset(&va, 0, sizeof(va));
	va.handle = bo;
	va.operation = AMDGPU_VA_OP_MAP;
	va.flags = AMDGPU_VM_PAGE_READABLE | AMDGPU_VM_PAGE_WRITEABLE;
	va.va_address = VA;
	va.map_size = size;
	xioctl(fd, DRM_IOCTL_AMDGPU_GEM_VA, &va, "GEM_VA map");
}

static int cmd_import(const char *exp_path, const char *imp_path, long count, long warmup)
{
	int efd = open_render(exp_path), ifd = open_render(imp_path);
	char dir[PATH_MAX];
	long i;

	dmabuf_dir(imp_path, dir, sizeof(dir));
	for (i = -warmup; i < count; i++) {
		uint64_t handle[2], t0, t1, t2, t3;
		uint32_t bo = bo_create(efd, IMPORT_BO_SIZE), token, gem;
		int dmabuf;
		struct timespec settle = { 0, IMPORT_SETTLE_NS };

		export(efd, bo, handle);
		nanosleep(&settle, NULL);
		t0 = now_ns();
		token = import_token(ifd, handle);
		t1 = now_ns();
		dmabuf = open_token(dir, token);
		t2 = now_ns();
		gem = fd_to_handle(ifd, dmabuf);
		t3 = now_ns();
		if (i >= 0)
			printf("t0=%llu t1=%llu t2=%llu t3=%llu\n", (unsigned long long)t0,
			       (unsigned long long)t1, (unsigned long long)t2,
			       (unsigned long long)t3);
		close(dmabuf);
		gem_close(ifd, gem);
		gem_close(efd, bo);
	}
	close(ifd);
	close(efd);
	return 0;
}

/* CPU time (ns) every thread of `pid` has used, from its tasks' schedstat. */
static uint64_t process_cpu_ns(int pid)
{
	char path[64], line[128];
	uint64_t total = 0;
	struct dirent *t;
	DIR *d;

	snprintf(path, sizeof(path), "/proc/%d/task", pid);
	d = opendir(path);
	if (!d)
		fail(path);
	while ((t = readdir(d))) {
		FILE *f;

		if (t->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/%d/task/%.16s/schedstat", pid, t->d_name);
		f = fopen(path, "r");
		if (!f)
			continue;	/* (a thread that just ended) */
		if (fgets(line, sizeof(line), f))
			total += strtoull(line, NULL, 10);
		fclose(f);
	}
	closedir(d);
	return total;
}

enum { C_CREATE, C_EXPORT, C_SETTLE, C_IMPORT, C_OPEN, C_FD_TO_HANDLE, C_CLOSE_FD,
       C_CLOSE_IMPORT, C_CLOSE_BO, C_SETTLE_AFTER, C_STEPS };
static const char *const cycle_steps[C_STEPS] = {
	"gem_create", "export", "settle", "import_ioctl", "token_open", "fd_to_handle",
	"close_dmabuf", "gem_close_import", "gem_close_bo", "settle_after",
};

struct cycle_clock {
	int pid[2];		/* exporter, importer */
	uint64_t wall, cpu[2];	/* at the last mark */
	double sum[C_STEPS][3];	/* wall, exporter CPU, importer CPU */
};

/* The step that ended now: add what it took; start the next one. */
static void cycle_mark(struct cycle_clock *c, int step)
{
	uint64_t cpu0 = process_cpu_ns(c->pid[0]), cpu1 = process_cpu_ns(c->pid[1]);
	uint64_t wall = now_ns();

	if (step >= 0) {
		c->sum[step][0] += (double)(wall - c->wall);
		c->sum[step][1] += (double)(cpu0 - c->cpu[0]);
		c->sum[step][2] += (double)(cpu1 - c->cpu[1]);
	}
	c->wall = wall;
	c->cpu[0] = cpu0;
	c->cpu[1] = cpu1;
}

static int cmd_cycle(const char *exp_path, const char *imp_path, long count, long settle_ns,
		     int exp_pid, int imp_pid)
{
	int efd = open_render(exp_path), ifd = open_render(imp_path);
	struct timespec settle = { settle_ns / 1000000000, settle_ns % 1000000000 };
	struct cycle_clock c = { .pid = { exp_pid, imp_pid } };
	char dir[PATH_MAX];
	long i;

	dmabuf_dir(imp_path, dir, sizeof(dir));
	for (i = -(count / 10 + 1); i < count; i++) {
		uint64_t handle[2];
		uint32_t bo, token, gem;
		int dmabuf;

		if (i == 0)
			memset(c.sum, 0, sizeof(c.sum));
		cycle_mark(&c, -1);
		bo = bo_create(efd, IMPORT_BO_SIZE);
		cycle_mark(&c, C_CREATE);
		export(efd, bo, handle);
		cycle_mark(&c, C_EXPORT);
		nanosleep(&settle, NULL);
		cycle_mark(&c, C_SETTLE);
		token = import_token(ifd, handle);
		cycle_mark(&c, C_IMPORT);
		dmabuf = open_token(dir, token);
		cycle_mark(&c, C_OPEN);
		gem = fd_to_handle(ifd, dmabuf);
		cycle_mark(&c, C_FD_TO_HANDLE);
		close(dmabuf);
		cycle_mark(&c, C_CLOSE_FD);
		gem_close(ifd, gem);
		cycle_mark(&c, C_CLOSE_IMPORT);
		gem_close(efd, bo);
		cycle_mark(&c, C_CLOSE_BO);
		nanosleep(&settle, NULL);
		cycle_mark(&c, C_SETTLE_AFTER);
	}
	for (i = 0; i < C_STEPS; i++)
		printf("step=%s wall_ns=%.0f exporter_cpu_ns=%.0f importer_cpu_ns=%.0f\n",
		       cycle_steps[i], c.sum[i][0] / (double)count, c.sum[i][1] / (double)count,
		       c.sum[i][2] / (double)count);
	close(ifd);
	close(efd);
	return 0;
}

static void load_full(int fd, char *buf, size_t size)
{
	size_t done = 0;

	while (done < size) {
		ssize_t n = pread(fd, buf + done, size - done, (off_t)(VA + done));

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			if (n == 0)
				errno = EIO;
			fail("pread (remote GPU load)");
		}
		done += (size_t)n;
	}
}

static void store_full(int fd, const char *buf, size_t size)
{
	size_t done = 0;

	while (done < size) {
		ssize_t n = pwrite(fd, buf + done, size - done, (off_t)(VA + done));

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			if (n == 0)
				errno = EIO;
			fail("pwrite (remote GPU store)");
		}
		done += (size_t)n;
	}
}

static int cmd_load(const char *exp_path, const char *imp_path, int nspec, char **spec,
		    int store)
{
	int efd = open_render(exp_path), ifd = open_render(imp_path), dmabuf;
	size_t sizes[16], max = 0;
	long counts[16];
	char dir[PATH_MAX], *buf;
	uint64_t handle[2];
	uint32_t bo, gem;
	int s;

	if (nspec > 16)
		return 2;
	for (s = 0; s < nspec; s++) {
		char *colon = strchr(spec[s], ':');

		if (!colon)
			return 2;
		sizes[s] = strtoul(spec[s], NULL, 0);
		counts[s] = strtol(colon + 1, NULL, 0);
		if (!sizes[s] || counts[s] <= 0)
			return 2;
		if (sizes[s] > max)
			max = sizes[s];
	}
	max = (max + 4095) & ~(size_t)4095;
	buf = mmap(NULL, max, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED)
		fail("mmap");
	for (size_t i = 0; i < max; i++)
		buf[i] = (char)(i * 131);
	bo = bo_create(efd, max);
	va_map(efd, bo, max);
	if (pwrite(efd, buf, max, (off_t)VA) != (ssize_t)max)
		fail("pwrite (local GPU store)");
	export(efd, bo, handle);
	dmabuf_dir(imp_path, dir, sizeof(dir));
	dmabuf = open_token(dir, import_token(ifd, handle));
	gem = fd_to_handle(ifd, dmabuf);
	close(dmabuf);
	va_map(ifd, gem, max);
	for (s = 0; s < nspec; s++) {
		long count = counts[s], warmup = count / 10 + 1, i;
		uint64_t *ns = calloc((size_t)count, sizeof(*ns));

		if (!ns)
			return 1;
		for (i = -warmup; i < count; i++) {
			uint64_t t0 = now_ns();

			if (store)
				store_full(ifd, buf, sizes[s]);
			else
				load_full(ifd, buf, sizes[s]);
			if (i >= 0)
				ns[i] = now_ns() - t0;
		}
		printf("size=%zu ", sizes[s]);
		print_stats(ns, count);
		printf("\n");
		fflush(stdout);
		free(ns);
	}
	close(ifd);
	close(efd);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc >= 5 && argc <= 6 && !strcmp(argv[1], "import")) {
		long count = strtol(argv[4], NULL, 0);
		long warmup = argc > 5 ? strtol(argv[5], NULL, 0) : count / 10 + 1;

		if (count > 0 && warmup >= 0)
			return cmd_import(argv[2], argv[3], count, warmup);
	} else if (argc == 8 && !strcmp(argv[1], "cycle")) {
		long count = strtol(argv[4], NULL, 0), settle = strtol(argv[5], NULL, 0);

		if (count > 0 && settle >= 0)
			return cmd_cycle(argv[2], argv[3], count, settle, atoi(argv[6]),
					 atoi(argv[7]));
	} else if (argc >= 5 && (!strcmp(argv[1], "load") || !strcmp(argv[1], "store"))) {
		int rc = cmd_load(argv[2], argv[3], argc - 4, argv + 4, !strcmp(argv[1], "store"));

		if (rc != 2)
			return rc;
	}
	fprintf(stderr, "usage: %s import <exporter-render> <importer-render> <count> [warmup]\n"
			"       %s load|store <exporter-render> <importer-render> <size>:<count>"
			" [...]\n"
			"       %s cycle <exporter-render> <importer-render> <count> <settle-ns>"
			" <exporter-pid> <importer-pid>\n",
		argv[0], argv[0], argv[0]);
	return 2;
}
