/* SPDX-License-Identifier: MIT */
/*
 * fuse_relay serve <mountpoint> <MiB> [congestion]
 * fuse_relay load|store <file> <size> <count> [warmup]
 *
 * The floor under ualinkd's 1 MiB remote loads and stores: the same work in C.
 *
 * serve: a minimal libfuse3 low-level server, single-threaded like fuse_echo.c,
 *   mounting one regular file, <mountpoint>/bo (<MiB> MiB, 0666, opened
 *   direct_io), in front of a child process, the "exporter", that holds the
 *   file's bytes in a memfd.  The two talk over one loopback TCP connection set
 *   up as the fabric's links are (tcp_pair.h; congestion control default
 *   "cubic", the pod's, "" keeps the system's).  Each FUSE read or write of the
 *   file is forwarded as one request: a 16-byte head (op, size, offset), and
 *   for a write its bytes after it.  The exporter answers a read with a head and
 *   the bytes sendfile()d from the memfd, and a write, once it has received the
 *   bytes straight into the memfd's mapping, with a head alone.  The server then
 *   replies to FUSE: a read with fuse_reply_buf of the answer recv()d into a
 *   buffer (the minimal way: ualinkd's importer splices a large answer from the
 *   socket through a pipe into /dev/fuse instead, fuse/dataplane.c), a write
 *   with fuse_reply_write.  libfuse's defaults (max_write 1 MiB, so max_pages
 *   256, ualinkd's own) make a 1 MiB pread or pwrite one FUSE request and one
 *   exchange with the exporter, as ualinkd makes it one LOAD or STORE.  The
 *   exporter's memory starts as byte i = PATTERN(i).  SIGINT/SIGTERM/SIGHUP end
 *   the loop and unmount; the exporter ends when the server's end closes.
 *   Always in the foreground.
 *
 * load|store: the client, as pod_latency's load and store are timed: <size>
 *   bytes read with pread (written with pwrite) at offset 0 of <file>, looping
 *   over short counts, <count> times after <warmup> (default count/10 + 1),
 *   into (from) one page-aligned buffer.  Then, untimed, a check that the bytes
 *   went through: a fresh pattern written over [0, size) and read back whole (a
 *   server answering reads with anything but what was written fails the floor,
 *   exit 1).  Prints size=.. median_ns=.. p99_ns=.. mean_ns=.. count=..
 */
#define _GNU_SOURCE
#define FUSE_USE_VERSION 34
#include <errno.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_stats.h"
#include "fuse_one_file.h"
#include "tcp_pair.h"

#define RELAY_MAX (1u << 20)	/* the largest FUSE request: libfuse's max_write, 256 pages */
#define PATTERN(i) ((unsigned char)((i) * 131 + ((i) >> 12)))

enum { OP_LOAD = 1, OP_STORE = 2 };

/* A request, and its answer (op 0 and size, the bytes that follow it). */
struct head {
	uint32_t op;
	uint32_t size;
	uint64_t off;
};

static int sock = -1;		/* the server's end of the connection */
static char *answer;		/* a load's answer, received here */

/* -- the exporter (child) --------------------------------------------------------------- */

/* A read of exactly `n` bytes: 0 at the server's end of file, else it exits 1. */
static int exporter_read(int fd, char *p, size_t n)
{
	size_t got = 0;

	while (got < n) {
		ssize_t k = recv(fd, p + got, n - got, MSG_WAITALL);

		if (k < 0 && errno == EINTR)
			continue;
		if (k == 0 && got == 0)
			return 0;
		if (k <= 0)
			_exit(1);
		got += (size_t)k;
	}
	return 1;
}

static void exporter(int fd, void *arg)
{
	size_t size = *(size_t *)arg;
	int memfd = memfd_create("fuse_relay-bo", MFD_CLOEXEC);
	struct head h;
	char *mem;

	if (memfd < 0 || ftruncate(memfd, (off_t)size))
		_exit(1);
	mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
	if (mem == MAP_FAILED)
		_exit(1);
	for (size_t i = 0; i < size; i++)
		mem[i] = (char)PATTERN(i);
	while (exporter_read(fd, (char *)&h, sizeof(h))) {
		struct head ans = { .op = 0, .size = h.size, .off = h.off };

		/* a bad request ends the exporter: the server's next exchange fails (EIO) */
		if (h.size > RELAY_MAX || h.off > size || h.size > size - h.off)
			_exit(1);
		if (h.op == OP_STORE) {
			if (h.size && !exporter_read(fd, mem + h.off, h.size))
				_exit(1);
			write_full(fd, (const char *)&ans, sizeof(ans));
		} else if (h.op == OP_LOAD) {
			off_t at = (off_t)h.off;
			size_t left = h.size;

			if (send(fd, &ans, sizeof(ans), MSG_MORE) != (ssize_t)sizeof(ans))
				_exit(1);
			while (left) {
				ssize_t k = sendfile(fd, memfd, &at, left);

				if (k < 0 && errno == EINTR)
					continue;
				if (k <= 0)
					_exit(1);
				left -= (size_t)k;
			}
		} else {
			_exit(1);
		}
	}
}

/* -- the FUSE server --------------------------------------------------------------------- */

/* A whole read or write of the connection; errno set and -1 when it failed (the exporter
   gone), so that the request gets EIO rather than ending the server. */
static int relay_io(char *p, size_t n, int out)
{
	while (n) {
		ssize_t k = out ? send(sock, p, n, MSG_NOSIGNAL) : recv(sock, p, n, MSG_WAITALL);

		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return -1;
		p += k;
		n -= (size_t)k;
	}
	return 0;
}

/* The head of a request for `size` bytes at `off`, its size clipped to the file (and to
   one exchange's largest): 0, or -1 with `req` answered when it is not for the file. */
static int relay_head(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct head *h)
{
	if (ino != ONE_FILE_INO) {
		fuse_reply_err(req, EISDIR);
		return -1;
	}
	if (off >= one_file.size)
		size = 0;
	else if (size > (size_t)(one_file.size - off))
		size = (size_t)(one_file.size - off);
	h->off = (uint64_t)off;
	h->size = (uint32_t)(size < RELAY_MAX ? size : RELAY_MAX);
	return 0;
}

static void relay_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		       struct fuse_file_info *fi)
{
	struct head h = { .op = OP_LOAD };

	(void)fi;
	if (relay_head(req, ino, size, off, &h))
		return;
	if (!h.size) {
		fuse_reply_buf(req, NULL, 0);
		return;
	}
	if (relay_io((char *)&h, sizeof(h), 1) || relay_io((char *)&h, sizeof(h), 0) ||
	    h.size > RELAY_MAX || relay_io(answer, h.size, 0)) {
		fuse_reply_err(req, EIO);
		return;
	}
	fuse_reply_buf(req, answer, h.size);
}

static void relay_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size,
			off_t off, struct fuse_file_info *fi)
{
	struct head h = { .op = OP_STORE };

	(void)fi;
	if (relay_head(req, ino, size, off, &h))
		return;
	if (!h.size) {
		fuse_reply_err(req, off >= one_file.size ? ENOSPC : EIO);
		return;
	}
	/* the head and the bytes in one go: MSG_MORE holds the head for the bytes' segments */
	if (send(sock, &h, sizeof(h), MSG_MORE | MSG_NOSIGNAL) != (ssize_t)sizeof(h) ||
	    relay_io((char *)buf, h.size, 1) || relay_io((char *)&h, sizeof(h), 0)) {
		fuse_reply_err(req, EIO);
		return;
	}
	fuse_reply_write(req, h.size);
}

static const struct fuse_lowlevel_ops relay_ops = {
	ONE_FILE_OPS,
	.read = relay_read,
	.write = relay_write,
};

static int serve(const char *mountpoint, size_t mib, const char *congestion)
{
	char *argv[] = { "fuse_relay", "-ofsname=fuse_relay,subtype=relay", NULL };
	struct fuse_args args = FUSE_ARGS_INIT(2, argv);
	size_t size = mib << 20;
	struct fuse_session *se;
	pid_t child;
	int ret = 1;

	one_file.name = "bo";
	one_file.size = (off_t)size;
	answer = malloc(RELAY_MAX);
	if (!answer)
		die("malloc");
	/* the exporter first: it must not inherit /dev/fuse */
	sock = pair(congestion, exporter, &size, &child);
	se = fuse_session_new(&args, &relay_ops, sizeof(relay_ops), NULL);
	if (se)
		ret = one_file_serve(se, mountpoint);
	close(sock);	/* the exporter's end of file: it exits */
	waitpid(child, NULL, 0);
	return ret;
}

/* -- the client ---------------------------------------------------------------------------- */

static void client_io(int fd, char *buf, size_t size, int store)
{
	size_t done = 0;

	while (done < size) {
		ssize_t n = store ? pwrite(fd, buf + done, size - done, (off_t)done)
				  : pread(fd, buf + done, size - done, (off_t)done);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			if (n == 0)
				errno = EIO;
			die(store ? "pwrite" : "pread");
		}
		done += (size_t)n;
	}
}

static int client(const char *path, size_t size, long count, long warmup, int store)
{
	size_t len = (size + 4095) & ~(size_t)4095;
	char *buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	char *back = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	uint64_t *ns = calloc((size_t)count, sizeof(*ns)), seed = now_ns();
	int fd = open(path, O_RDWR);
	long i;

	if (fd < 0)
		die(path);
	if (buf == MAP_FAILED || back == MAP_FAILED || !ns)
		die("alloc");
	for (size_t k = 0; k < size; k++)
		buf[k] = (char)PATTERN(k);
	for (i = -warmup; i < count; i++) {
		uint64_t t0 = now_ns();

		client_io(fd, buf, size, store);
		if (i >= 0)
			ns[i] = now_ns() - t0;
	}
	/* untimed: the bytes went through, both ways */
	for (size_t k = 0; k < size; k++)
		buf[k] = (char)(PATTERN(k) ^ seed ^ (k >> 8));
	client_io(fd, buf, size, 1);
	client_io(fd, back, size, 0);
	if (memcmp(buf, back, size)) {
		fprintf(stderr, "fuse_relay: the %zu bytes written did not read back\n", size);
		return 1;
	}
	printf("size=%zu ", size);
	print_stats(ns, count);
	printf("\n");
	close(fd);
	return 0;
}

int main(int argc, char **argv)
{
	if ((argc == 4 || argc == 5) && !strcmp(argv[1], "serve")) {
		long mib = strtol(argv[3], NULL, 0);

		if (mib > 0 && mib <= 4096)
			return serve(argv[2], (size_t)mib, argc == 5 ? argv[4] : "cubic");
	} else if ((argc == 5 || argc == 6) &&
		   (!strcmp(argv[1], "load") || !strcmp(argv[1], "store"))) {
		long size = strtol(argv[3], NULL, 0), count = strtol(argv[4], NULL, 0);
		long warmup = argc == 6 ? strtol(argv[5], NULL, 0) : count / 10 + 1;

		if (size > 0 && count > 0 && warmup >= 0)
			return client(argv[2], (size_t)size, count, warmup,
				      !strcmp(argv[1], "store"));
	}
	fprintf(stderr, "usage: %s serve <mountpoint> <MiB> [congestion]\n"
			"       %s load|store <file> <size> <count> [warmup]\n", argv[0], argv[0]);
	return 2;
}
