/* SPDX-License-Identifier: MIT */
/*
 * CPU mappings of BOs, as an unmodified client does them: raw ioctl(2) and
 * mmap(2) on a render node (amdgpu_bo_cpu_map: GEM_MMAP, then mmap of the
 * render fd at its offset; libhsakmt: PROT_NONE MAP_FIXED at the BO's VA) and
 * on dma-buf fds, run under libualink_shim.so.  Each step prints
 * "ok <step> k=v..." or "fail <step> errno=N"; the Python test reads them.
 *
 *   cpu_map local <render>          one node: CPU <-> GPU, dma-buf, refusals
 *   cpu_map export <render>         a mapped, exported BO; then commands on
 *                                   stdin: "store <off> <text>", "show <off> <n>"
 *   cpu_map import <render> <lo> <hi> <load-off> <n> <store-off> <text>
 *   cpu_map other <render> <offset> map a BO of another process at its offset
 *   cpu_map grant <render>          a grant taken with the raw ioctl, not fetched
 *   cpu_map fetch <socket> <grant>  present a grant (someone else's)
 *   cpu_map hold <render>           a mapped BO whose fd is closed; stdin lines
 *                                   step it: partial munmap, then the rest
 *   cpu_map bench <render> <rounds> the cost of mmap + first touch of 2 MiB BOs
 *   cpu_map closed <render> <MiB> <n>  n BOs of MiB each: created, mapped, filled
 *                                   and GEM_CLOSEd, each mapping kept; a stdin
 *                                   line unmaps them all and creates one more
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "ualink/ualink_cpumap.h"
#include "ualink/ualink_drm.h"

#define BO_SIZE (2u << 20)
#define VA 0x100000000ull

static int failures;

static void ok(const char *step, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static void ok(const char *step, const char *fmt, ...)
{
	va_list ap;

	printf("ok %s", step);
	if (fmt && *fmt) {
		putchar(' ');
		va_start(ap, fmt);
		vprintf(fmt, ap);
		va_end(ap);
	}
	putchar('\n');
	fflush(stdout);
}

static void fail(const char *step, int err)
{
	printf("fail %s errno=%d (%s)\n", step, err, strerror(err));
	fflush(stdout);
	failures++;
}

/* A step that must fail with `want`. */
static void expect_errno(const char *step, bool failed, int err, int want)
{
	if (failed && err == want)
		ok(step, "errno=%d", err);
	else
		fail(step, failed ? err : 0);
}

static uint32_t gem_create(int fd, uint64_t size)
{
	union drm_amdgpu_gem_create c = { .in = { .bo_size = size, .alignment = 4096,
						   .domains = AMDGPU_GEM_DOMAIN_VRAM } };

	if (ioctl(fd, DRM_IOCTL_AMDGPU_GEM_CREATE, &c) != 0) {
		fail("gem_create", errno);
		exit(1);
	}
	return c.out.handle;
}

/* GEM_MMAP: the fake offset (0 with errno set on failure). */
static uint64_t gem_mmap(int fd, uint32_t handle)
{
	union drm_amdgpu_gem_mmap m = { .in = { .handle = handle } };

	return ioctl(fd, DRM_IOCTL_AMDGPU_GEM_MMAP, &m) == 0 ? m.out.addr_ptr : 0;
}

static void va_map(int fd, uint32_t handle, uint64_t va, uint64_t size)
{
	struct drm_amdgpu_gem_va v = {
		.handle = handle, .operation = AMDGPU_VA_OP_MAP,
		.flags = AMDGPU_VM_PAGE_READABLE | AMDGPU_VM_PAGE_WRITEABLE,
		.va_address = va, .map_size = size,
	};

	if (ioctl(fd, DRM_IOCTL_AMDGPU_GEM_VA, &v) != 0) {
		fail("gem_va", errno);
		exit(1);
	}
}

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int open_render(const char *path)
{
	int fd = open(path, O_RDWR | O_CLOEXEC);

	if (fd < 0) {
		fail("open", errno);
		exit(1);
	}
	return fd;
}

/* ---- one node ------------------------------------------------------------------ */

static int run_local(const char *render)
{
	int fd = open_render(render), fd2, dmabuf;
	uint32_t bo = gem_create(fd, BO_SIZE);
	uint64_t off = gem_mmap(fd, bo);
	char buf[64] = { 0 };
	char *p, *q, *r;
	double t0, t1, t2;
	size_t i;
	int rc;

	if (!off) {
		fail("gem_mmap", errno);
		return 1;
	}
	ok("gem_mmap", "offset=0x%" PRIx64, off);
	va_map(fd, bo, VA, BO_SIZE);

	/* amdgpu_bo_cpu_map: a shared RW mapping at the GEM_MMAP offset; timed
	 * with a first touch of every page (the cost the report quotes). */
	t0 = now_us();
	p = mmap(NULL, BO_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)off);
	t1 = now_us();
	if (p == MAP_FAILED) {
		fail("mmap", errno);
		return 1;
	}
	for (i = 0; i < BO_SIZE; i += 4096)
		p[i] = 0;
	t2 = now_us();
	ok("mmap", "mmap_us=%.1f touch_us=%.1f", t1 - t0, t2 - t1);

	/* A CPU store, then a GPU load at the VA: the same byte at once. */
	memcpy(p + 4096, "cpu-store", 10);
	if (pread(fd, buf, 10, (off_t)(VA + 4096)) == 10 && !strcmp(buf, "cpu-store"))
		ok("cpu_store_gpu_load", "data=%s", buf);
	else
		fail("cpu_store_gpu_load", errno);

	/* A GPU store, then a CPU load through the mapping. */
	if (pwrite(fd, "gpu-store", 10, (off_t)(VA + 8192)) == 10 && !strcmp(p + 8192, "gpu-store"))
		ok("gpu_store_cpu_load", "data=%s", p + 8192);
	else
		fail("gpu_store_cpu_load", errno);

	/* Two mappings of one BO are one memory. */
	q = mmap(NULL, BO_SIZE, PROT_READ, MAP_SHARED, fd, (off_t)off);
	if (q != MAP_FAILED && !strcmp(q + 4096, "cpu-store")) {
		p[4096] = 'C';
		if (q[4096] == 'C')
			ok("two_mappings", NULL);
		else
			fail("two_mappings", 0);
		p[4096] = 'c';
		munmap(q, BO_SIZE);
	} else {
		fail("two_mappings", errno);
	}

	/* libhsakmt: PROT_NONE MAP_FIXED at a reserved address, then mprotect. */
	r = mmap(NULL, BO_SIZE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	q = mmap(r, BO_SIZE, PROT_NONE, MAP_SHARED | MAP_FIXED, fd, (off_t)off);
	if (r != MAP_FAILED && q == r) {
		ok("prot_none_fixed", NULL);
		if (mprotect(q, BO_SIZE, PROT_READ | PROT_WRITE) == 0 &&
		    !strcmp(q + 4096, "cpu-store")) {
			memcpy(q + 12288, "via-fixed", 10);
			if (pread(fd, buf, 10, (off_t)(VA + 12288)) == 10 && !strcmp(buf, "via-fixed"))
				ok("mprotect", "data=%s", buf);
			else
				fail("mprotect", errno);
		} else {
			fail("mprotect", errno);
		}
		if (munmap(q, BO_SIZE) == 0)
			ok("munmap", NULL);
		else
			fail("munmap", errno);
	} else {
		fail("prot_none_fixed", errno);
	}

	/* MAP_PRIVATE is copy-on-write: ttm refuses it, except amdgpu's PROT_NONE
	 * (the Thunk's), which can then be made readable but never writable. */
	q = mmap(NULL, BO_SIZE, PROT_READ, MAP_PRIVATE, fd, (off_t)off);
	expect_errno("private_read", q == MAP_FAILED, errno, EINVAL);
	q = mmap(NULL, BO_SIZE, PROT_NONE, MAP_PRIVATE, fd, (off_t)off);
	if (q != MAP_FAILED) {
		ok("private_none", NULL);
		if (mprotect(q, BO_SIZE, PROT_READ) == 0 && !strcmp(q + 4096, "cpu-store"))
			ok("private_none_read", NULL);
		else
			fail("private_none_read", errno);
		rc = mprotect(q, BO_SIZE, PROT_WRITE);
		expect_errno("private_none_write", rc != 0, errno, EACCES);
		munmap(q, BO_SIZE);
	} else {
		fail("private_none", errno);
	}

	/* drm_gem_mmap: an offset that is no BO's start, or a mapping longer than
	 * the BO: EINVAL. */
	q = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, (off_t)(off + 4096));
	expect_errno("inner_offset", q == MAP_FAILED, errno, EINVAL);
	q = mmap(NULL, 2 * BO_SIZE, PROT_READ, MAP_SHARED, fd, (off_t)off);
	expect_errno("too_long", q == MAP_FAILED, errno, EINVAL);

	/* Another open of the render node holds no handle to the BO: EACCES
	 * (drm_vma_node_is_allowed). */
	fd2 = open_render(render);
	q = mmap(NULL, BO_SIZE, PROT_READ, MAP_SHARED, fd2, (off_t)off);
	expect_errno("other_file", q == MAP_FAILED, errno, EACCES);

	/* A read-only open cannot be mapped writable (do_mmap: EACCES). */
	{
		int ro = open(render, O_RDONLY | O_CLOEXEC);
		struct drm_prime_handle ph = { .handle = bo, .flags = DRM_CLOEXEC | DRM_RDWR };

		/* Give the read-only file a handle of the same BO through a dma-buf. */
		if (ioctl(fd, DRM_IOCTL_PRIME_HANDLE_TO_FD, &ph) == 0) {
			struct drm_prime_handle back = { .fd = ph.fd };

			if (ioctl(ro, DRM_IOCTL_PRIME_FD_TO_HANDLE, &back) == 0) {
				uint64_t roff = gem_mmap(ro, back.handle);

				q = mmap(NULL, BO_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, ro,
					 (off_t)roff);
				expect_errno("readonly_write", q == MAP_FAILED, errno, EACCES);
				q = mmap(NULL, BO_SIZE, PROT_READ, MAP_SHARED, ro, (off_t)roff);
				if (q != MAP_FAILED && !strcmp(q + 4096, "cpu-store")) {
					ok("readonly_read", NULL);
					rc = mprotect(q, BO_SIZE, PROT_WRITE);
					expect_errno("readonly_mprotect", rc != 0, errno,
						     EACCES);
					munmap(q, BO_SIZE);
				} else {
					fail("readonly_read", errno);
				}
			} else {
				fail("readonly_read", errno);
			}
			close(ph.fd);
		} else {
			fail("readonly_read", errno);
		}
		close(ro);
	}

	/* mmap of the BO's dma-buf fd maps the same memory. */
	{
		struct drm_prime_handle ph = { .handle = bo, .flags = DRM_CLOEXEC | DRM_RDWR };

		if (ioctl(fd, DRM_IOCTL_PRIME_HANDLE_TO_FD, &ph) != 0) {
			fail("dmabuf", errno);
		} else {
			dmabuf = ph.fd;
			q = mmap(NULL, BO_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, dmabuf, 0);
			if (q != MAP_FAILED && !strcmp(q + 4096, "cpu-store")) {
				memcpy(q + 16384, "via-dmabuf", 11);
				if (pread(fd, buf, 11, (off_t)(VA + 16384)) == 11 &&
				    !strcmp(buf, "via-dmabuf"))
					ok("dmabuf", "data=%s", buf);
				else
					fail("dmabuf", errno);
				munmap(q, BO_SIZE);
			} else {
				fail("dmabuf", errno);
			}
			/* An offset into the dma-buf is an offset into the BO. */
			q = mmap(NULL, 4096, PROT_READ, MAP_SHARED, dmabuf, 16384);
			if (q != MAP_FAILED && !strcmp(q, "via-dmabuf"))
				ok("dmabuf_offset", NULL);
			else
				fail("dmabuf_offset", errno);
			q = mmap(NULL, 8192, PROT_READ, MAP_SHARED, dmabuf, BO_SIZE - 4096);
			expect_errno("dmabuf_past_end", q == MAP_FAILED, errno, EINVAL);
			close(dmabuf);
		}
	}

	/* A userptr BO is the process's own memory: GEM_MMAP refuses it (§2.7). */
	{
		void *mem = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
				 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		struct drm_amdgpu_gem_userptr u = {
			.addr = (uintptr_t)mem, .size = 4096,
			.flags = AMDGPU_GEM_USERPTR_REGISTER | AMDGPU_GEM_USERPTR_VALIDATE,
		};

		if (ioctl(fd, DRM_IOCTL_AMDGPU_GEM_USERPTR, &u) == 0) {
			uint64_t uoff = gem_mmap(fd, u.handle);

			int err = errno;

			expect_errno("userptr_gem_mmap", uoff == 0, err, EPERM);
		} else {
			fail("userptr_gem_mmap", errno);
		}
	}

	/* The mapping outlives the fds: the memory stays, and stays the BO's
	 * (kept alive by the dma-buf handed to the other file above). */
	close(fd2);
	close(fd);
	p[20480] = 'Z';
	if (!strcmp(p + 4096, "cpu-store") && p[20480] == 'Z')
		ok("after_close", NULL);
	else
		fail("after_close", 0);
	munmap(p, BO_SIZE);
	return failures ? 1 : 0;
}

/* ---- two nodes ------------------------------------------------------------------ */

static int run_export(const char *render)
{
	int fd = open_render(render);
	uint32_t bo = gem_create(fd, BO_SIZE);
	uint64_t off = gem_mmap(fd, bo);
	union drm_amdgpu_ualink_handle u = { .in = { .op = DRM_AMDGPU_UALINK_HANDLE_OP_EXPORT,
						      .gem_handle = bo } };
	char line[256], text[200];
	unsigned long o, n;
	char *p;

	p = mmap(NULL, BO_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)off);
	if (!off || p == MAP_FAILED) {
		fail("mmap", errno);
		return 1;
	}
	if (ioctl(fd, DRM_IOCTL_AMDGPU_UALINK_HANDLE, &u) != 0) {
		fail("export", errno);
		return 1;
	}
	ok("export", "lo=%" PRIu64 " hi=%" PRIu64, (uint64_t)u.out.export_ualink_handle[0],
	   (uint64_t)u.out.export_ualink_handle[1]);
	while (fgets(line, sizeof(line), stdin)) {
		if (sscanf(line, "store %lu %199s", &o, text) == 2 && o + strlen(text) < BO_SIZE) {
			memcpy(p + o, text, strlen(text) + 1);
			ok("store", "off=%lu", o);
		} else if (sscanf(line, "show %lu %lu", &o, &n) == 2 && o + n <= BO_SIZE &&
			   n < sizeof(text)) {
			memcpy(text, p + o, n);
			text[n] = 0;
			ok("show", "data=%s", text);
		}
	}
	munmap(p, BO_SIZE);
	close(fd);
	return 0;
}

static int run_import(char **argv)
{
	int fd = open_render(argv[0]);
	union drm_amdgpu_ualink_handle u = { .in = { .op = DRM_AMDGPU_UALINK_HANDLE_OP_IMPORT } };
	unsigned long load_off = strtoul(argv[3], NULL, 0), n = strtoul(argv[4], NULL, 0);
	unsigned long store_off = strtoul(argv[5], NULL, 0);
	const char *text = argv[6];
	struct drm_prime_handle ph = { 0 };
	char buf[256] = { 0 };
	void *q;

	u.in.import_ualink_handle[0] = strtoull(argv[1], NULL, 0);
	u.in.import_ualink_handle[1] = strtoull(argv[2], NULL, 0);
	if (ioctl(fd, DRM_IOCTL_AMDGPU_UALINK_HANDLE, &u) != 0) {
		fail("import", errno);
		return 1;
	}
	ph.fd = (int)u.out.import_dmabuf_handle;
	ok("import", "fd=%d", ph.fd);
	/* §4.6: an imported NPA BO is not CPU mappable, by its dma-buf or GEM_MMAP. */
	q = mmap(NULL, BO_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, ph.fd, 0);
	expect_errno("import_mmap", q == MAP_FAILED, errno, EPERM);
	if (ioctl(fd, DRM_IOCTL_PRIME_FD_TO_HANDLE, &ph) != 0) {
		fail("prime_fd_to_handle", errno);
		return 1;
	}
	{
		uint64_t ioff = gem_mmap(fd, ph.handle);

		expect_errno("import_gem_mmap", ioff == 0, errno, EPERM);
	}
	va_map(fd, ph.handle, VA, BO_SIZE);
	if (n >= sizeof(buf) || pread(fd, buf, n, (off_t)(VA + load_off)) != (ssize_t)n)
		fail("remote_load", errno);
	else
		ok("remote_load", "data=%s", buf);
	if (pwrite(fd, text, strlen(text) + 1, (off_t)(VA + store_off)) ==
	    (ssize_t)strlen(text) + 1)
		ok("remote_store", NULL);
	else
		fail("remote_store", errno);
	close(fd);
	return failures ? 1 : 0;
}

/* ---- another process, another uid ----------------------------------------------- */

static int run_other(const char *render, const char *offset)
{
	int fd = open_render(render);
	void *q = mmap(NULL, BO_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
		       (off_t)strtoull(offset, NULL, 0));

	expect_errno("other_process", q == MAP_FAILED, errno, EACCES);
	return 0;
}

static int run_grant(const char *render)
{
	int fd = open_render(render), i;
	uint32_t bo = gem_create(fd, BO_SIZE);
	uint64_t off = gem_mmap(fd, bo);
	char line[64], step[16];

	/* The raw ioctl, twice: the shim's mmap is not involved, the grants stay
	 * unfetched for other processes to try. */
	for (i = 1; i <= 2; i++) {
		struct ualinkd_mmap_grant g = { .offset = off, .length = BO_SIZE,
						.prot = PROT_READ | PROT_WRITE,
						.flags = MAP_SHARED, .fmode = O_RDWR };

		snprintf(step, sizeof(step), "grant%d", i);
		if (!off || ioctl(fd, UALINKD_IOCTL_MMAP_GRANT, &g) != 0) {
			fail(step, errno);
			return 1;
		}
		ok(step, "offset=%" PRIu64 " socket=%016" PRIx64 " grant=%" PRIu64,
		   (uint64_t)g.offset, (uint64_t)g.socket, (uint64_t)g.grant);
	}
	/* Hold the BO until stdin closes. */
	while (fgets(line, sizeof(line), stdin))
		;
	close(fd);
	return 0;
}

static int run_fetch(const char *socket_hex, const char *grant)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	uint64_t g = strtoull(grant, NULL, 0);
	struct ualinkd_mmap_fetch reply = { 0 };
	int s, n;

	n = snprintf(sa.sun_path + 1, sizeof(sa.sun_path) - 1, UALINKD_CPUMAP_SOCKET_FMT,
		     (unsigned long long)strtoull(socket_hex, NULL, 16));
	s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (s < 0 || connect(s, (struct sockaddr *)&sa,
			     (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n)) != 0 ||
	    send(s, &g, sizeof(g), 0) != sizeof(g) || recv(s, &reply, sizeof(reply), 0) < 0) {
		fail("fetch", errno);
		return 1;
	}
	ok("fetch", "result=%d", reply.result);
	return 0;
}

/* ---- lifetimes ---------------------------------------------------------------------- */

/* The kernel's mapping holds the render file: close() leaves the DrmFile (and
 * its handle, and so the UALink export) until the last byte is unmapped. */
static int run_hold(const char *render)
{
	int fd = open_render(render);
	uint32_t bo = gem_create(fd, BO_SIZE);
	uint64_t off = gem_mmap(fd, bo);
	union drm_amdgpu_ualink_handle u = { .in = { .op = DRM_AMDGPU_UALINK_HANDLE_OP_EXPORT,
						      .gem_handle = bo } };
	char line[64], *p;

	p = mmap(NULL, BO_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)off);
	if (!off || p == MAP_FAILED || ioctl(fd, DRM_IOCTL_AMDGPU_UALINK_HANDLE, &u) != 0) {
		fail("hold", errno);
		return 1;
	}
	close(fd);
	memcpy(p, "held", 5);
	ok("closed", "pid=%d lo=%" PRIu64, (int)getpid(), (uint64_t)u.out.export_ualink_handle[0]);
	if (!fgets(line, sizeof(line), stdin))
		return 1;
	/* Unmapping part of it keeps the hold; so does a hole in the middle. */
	if (munmap(p + BO_SIZE / 2, 4096) == 0 && munmap(p, 4096) == 0 && !strcmp(p + 4096, ""))
		ok("partial", NULL);
	else
		fail("partial", errno);
	if (!fgets(line, sizeof(line), stdin))
		return 1;
	if (munmap(p, BO_SIZE) == 0)
		ok("unmapped", NULL);
	else
		fail("unmapped", errno);
	while (fgets(line, sizeof(line), stdin))
		;
	return failures ? 1 : 0;
}

/* The kernel's mapping holds the GEM object: a BO closed while mapped keeps its
 * memory and its VRAM charge until the last unmap (issue 29 item 5).  Prints
 * "ok create<i> errno=E" (0: created, mapped, filled, closed; else GEM_CREATE's
 * errno), then on a stdin line "ok unmapped" and "ok after errno=E". */
static int run_closed(const char *render, unsigned mib, int n)
{
	int fd = open_render(render), i, kept = 0;
	size_t size = (size_t)mib << 20;
	char **maps = calloc((size_t)n, sizeof(*maps)), line[64], step[32];

	for (i = 0; i < n; i++) {
		union drm_amdgpu_gem_create c = { .in = { .bo_size = size, .alignment = 4096,
							   .domains = AMDGPU_GEM_DOMAIN_VRAM } };
		struct drm_gem_close cl = { 0 };
		uint64_t off;
		char *p;

		snprintf(step, sizeof(step), "create%d", i);
		if (ioctl(fd, DRM_IOCTL_AMDGPU_GEM_CREATE, &c) != 0) {
			ok(step, "errno=%d", errno);
			continue;
		}
		off = gem_mmap(fd, c.out.handle);
		p = off ? mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)off)
			: MAP_FAILED;
		if (p == MAP_FAILED) {
			fail(step, errno);
			return 1;
		}
		memset(p, 0x5a, size);	/* every page real: host memory, not a hole */
		cl.handle = c.out.handle;
		if (ioctl(fd, DRM_IOCTL_GEM_CLOSE, &cl) != 0 || p[size - 1] != 0x5a) {
			fail(step, errno);
			return 1;
		}
		maps[kept++] = p;
		ok(step, "errno=0");
	}
	if (!fgets(line, sizeof(line), stdin))
		return 1;
	for (i = 0; i < kept; i++)
		munmap(maps[i], size);
	ok("unmapped", "count=%d", kept);
	{
		union drm_amdgpu_gem_create c = { .in = { .bo_size = size, .alignment = 4096,
							   .domains = AMDGPU_GEM_DOMAIN_VRAM } };

		ok("after", "errno=%d", ioctl(fd, DRM_IOCTL_AMDGPU_GEM_CREATE, &c) ? errno : 0);
	}
	while (fgets(line, sizeof(line), stdin))
		;
	free(maps);
	close(fd);
	return 0;
}

/* ---- cost (printed, never asserted) ---------------------------------------------- */

static void touch_all(volatile char *p, size_t n)
{
	size_t i;

	for (i = 0; i < n; i += 4096)
		p[i] = 1;
}

static int run_bench(const char *render, int rounds)
{
	int fd = open_render(render), i;
	double t0, map_us = 0, touch_us = 0, remap_us = 0, anon_us = 0, unmap_us = 0;
	char *p;

	for (i = 0; i < rounds; i++) {
		uint32_t bo = gem_create(fd, BO_SIZE);
		uint64_t off = gem_mmap(fd, bo);
		struct drm_gem_close cl = { .handle = bo };

		t0 = now_us();
		p = mmap(NULL, BO_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)off);
		map_us += now_us() - t0;
		if (p == MAP_FAILED) {
			fail("bench", errno);
			return 1;
		}
		t0 = now_us();
		touch_all(p, BO_SIZE);	/* first touch: the pages come to exist */
		touch_us += now_us() - t0;
		t0 = now_us();
		munmap(p, BO_SIZE);
		unmap_us += now_us() - t0;
		t0 = now_us();
		p = mmap(NULL, BO_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)off);
		touch_all(p, BO_SIZE);	/* a second mapping: the pages exist already */
		remap_us += now_us() - t0;
		munmap(p, BO_SIZE);
		ioctl(fd, DRM_IOCTL_GEM_CLOSE, &cl);
		t0 = now_us();
		p = mmap(NULL, BO_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		touch_all(p, BO_SIZE);	/* what the same touch costs in plain anonymous memory */
		anon_us += now_us() - t0;
		munmap(p, BO_SIZE);
	}
	ok("bench", "rounds=%d mmap_us=%.1f first_touch_us=%.1f munmap_us=%.1f "
	   "remap_and_touch_us=%.1f anon_map_and_touch_us=%.1f", rounds, map_us / rounds,
	   touch_us / rounds, unmap_us / rounds, remap_us / rounds, anon_us / rounds);
	close(fd);
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 3 && !strcmp(argv[1], "local"))
		return run_local(argv[2]);
	if (argc == 3 && !strcmp(argv[1], "export"))
		return run_export(argv[2]);
	if (argc == 9 && !strcmp(argv[1], "import"))
		return run_import(argv + 2);
	if (argc == 4 && !strcmp(argv[1], "other"))
		return run_other(argv[2], argv[3]);
	if (argc == 3 && !strcmp(argv[1], "grant"))
		return run_grant(argv[2]);
	if (argc == 3 && !strcmp(argv[1], "hold"))
		return run_hold(argv[2]);
	if (argc == 4 && !strcmp(argv[1], "bench"))
		return run_bench(argv[2], atoi(argv[3]));
	if (argc == 5 && !strcmp(argv[1], "closed"))
		return run_closed(argv[2], (unsigned)atoi(argv[3]), atoi(argv[4]));
	if (argc == 4 && !strcmp(argv[1], "fetch"))
		return run_fetch(argv[2], argv[3]);
	fprintf(stderr, "usage: see the comment at the top of cpu_map.c\n");
	return 2;
}
