/* SPDX-License-Identifier: MIT */
/*
 * tcp_floor rtt <count> [size] [warmup] [congestion]
 * tcp_floor stream <total-bytes> <reps> [chunk] [congestion]
 * tcp_floor fetch <count> <size> [warmup] [congestion]
 * tcp_floor import <echo-file> <cmd-hex> <count> [warmup]
 *
 * The TCP floors under ualinkd's fabric figures, in C: two processes (this
 * one and a child it forks, so both inherit the caller's CPU placement) on a
 * loopback TCP connection set up the way the fabric sets up its links
 * (TCP_NODELAY as trio does, 4 MiB SO_SNDBUF/SO_RCVBUF and the congestion
 * control as fabric/conn.py tune does).
 *
 * rtt:    <size> bytes (default 64, about one fabric MSG frame) sent and
 *         echoed back, <count> times after <warmup> (default 1000).  The
 *         congestion control (default "cubic") hardly matters here.  Prints
 *         median_ns=.. p99_ns=.. mean_ns=.. count=..
 * stream: <total-bytes> written one way in <chunk>-byte write(2)s (default
 *         1 MiB), the sink answering one byte when it has everything; <reps>
 *         such transfers.  Congestion control default "cubic" (the pod's
 *         default tcp_congestion), "" keeps the system's.  Prints
 *         median_bps=.. min_bps=.. max_bps=.. reps=.. congestion=..
 * fetch:  a 29-byte request (a LOAD's size) answered with <size> bytes, <count>
 *         times after <warmup> (default 10): one request and its answer in turn, the
 *         answer's two copies (send, receive) one after the other, as a remote GPU load's
 *         are; not a goal's floor, the ceiling of a load done one at a time (issue 34).
 *         Prints median_ns=.. p99_ns=.. mean_ns=.. count=.. size=..
 * import: the first import's floor in the first import's own pattern (pod_latency
 *         import): after the same idle gap (IMPORT_SETTLE_NS), one ioctl <cmd-hex>
 *         on <echo-file> (fuse_echo's file), one 64-byte round trip, two more such
 *         ioctls, timed as one sample.  The gap matters: on this kind of machine
 *         the first FUSE round trip after 2 ms idle takes about 4x a hot one
 *         (caches, a halted vCPU), so a floor timed back to back is not the same
 *         work.  Prints median_ns=.. p99_ns=.. mean_ns=.. count=..
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <fcntl.h>
#include <unistd.h>

#include "bench_stats.h"

static void die(const char *what)
{
	perror(what);
	exit(1);
}

/* As the fabric tunes a link: Nagle off, big buffers, the congestion control. */
static void tune(int fd, const char *congestion)
{
	int one = 1, buf = 4 << 20;

	if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)))
		die("TCP_NODELAY");
	setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
	setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
	if (congestion && *congestion &&
	    setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, congestion, strlen(congestion)))
		die("TCP_CONGESTION");
}

static void read_full(int fd, char *p, size_t n)
{
	while (n) {
		ssize_t r = read(fd, p, n);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			die("read");
		p += r;
		n -= (size_t)r;
	}
}

static void write_full(int fd, const char *p, size_t n)
{
	while (n) {
		ssize_t r = write(fd, p, n);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			die("write");
		p += r;
		n -= (size_t)r;
	}
}

/*
 * A connected pair: the child gets the accepted end and runs child(fd, arg),
 * the parent gets the connecting end.  Both ends are tuned.
 */
static int pair(const char *congestion, void (*child)(int, void *), void *arg, pid_t *pid)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	socklen_t len = sizeof(a);
	int lfd, fd;

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof(a)) || listen(lfd, 1) ||
	    getsockname(lfd, (struct sockaddr *)&a, &len))
		die("listen");
	*pid = fork();
	if (*pid < 0)
		die("fork");
	if (*pid == 0) {
		int c = accept(lfd, NULL, NULL);

		if (c < 0)
			die("accept");
		close(lfd);
		tune(c, congestion);
		child(c, arg);
		_exit(0);
	}
	close(lfd);
	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		die("socket");
	tune(fd, congestion);
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)))
		die("connect");
	return fd;
}

/* A child's read of exactly `n` bytes: 0 once the parent is done (end of file, an error). */
static int child_read(int fd, char *buf, size_t n)
{
	size_t got = 0;

	while (got < n) {
		ssize_t r = read(fd, buf + got, n - got);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return 0;
		got += (size_t)r;
	}
	return 1;
}

static void echo_child(int fd, void *arg)
{
	size_t size = *(size_t *)arg;
	char buf[65536];

	while (child_read(fd, buf, size))
		write_full(fd, buf, size);
}

static int rtt(long count, size_t size, long warmup, const char *congestion)
{
	static char buf[65536];
	uint64_t *ns = calloc((size_t)count, sizeof(*ns));
	pid_t pid;
	int fd, status;
	long i;

	if (!ns || size == 0 || size > sizeof(buf))
		return 2;
	fd = pair(congestion, echo_child, &size, &pid);
	memset(buf, 0x5a, size);
	for (i = -warmup; i < count; i++) {
		uint64_t t0 = now_ns();

		write_full(fd, buf, size);
		read_full(fd, buf, size);
		if (i >= 0)
			ns[i] = now_ns() - t0;
	}
	close(fd);
	waitpid(pid, &status, 0);
	print_stats(ns, count);
	printf(" size=%zu\n", size);
	free(ns);
	return 0;
}

/* fetch: the child answers each 29-byte request (a LOAD's size) with <size> bytes from one
   buffer; the parent times request to last byte read. */
static void fetch_child(int fd, void *arg)
{
	size_t size = *(size_t *)arg;
	char *buf = malloc(size), req[29];

	if (buf == NULL)
		return;
	memset(buf, 0x3c, size);
	while (child_read(fd, req, sizeof(req)))
		write_full(fd, buf, size);
	free(buf);
}

static int fetch(long count, size_t size, long warmup, const char *congestion)
{
	uint64_t *ns = calloc((size_t)count, sizeof(*ns));
	char *buf = malloc(size), req[29];
	pid_t pid;
	int fd, status;
	long i;

	if (!ns || !buf || size == 0)
		return 2;
	memset(req, 1, sizeof(req));
	fd = pair(congestion, fetch_child, &size, &pid);
	for (i = -warmup; i < count; i++) {
		uint64_t t0 = now_ns();

		write_full(fd, req, sizeof(req));
		read_full(fd, buf, size);
		if (i >= 0)
			ns[i] = now_ns() - t0;
	}
	close(fd);
	waitpid(pid, &status, 0);
	print_stats(ns, count);
	printf(" size=%zu\n", size);
	free(ns);
	free(buf);
	return 0;
}

struct sink_arg {
	size_t total;
	long reps;
};

static void sink_child(int fd, void *argp)
{
	struct sink_arg *arg = argp;
	static char buf[1 << 20];
	long r;

	for (r = 0; r < arg->reps; r++) {
		size_t got = 0;

		while (got < arg->total) {
			ssize_t n = read(fd, buf, sizeof(buf));

			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0)
				return;
			got += (size_t)n;
		}
		write_full(fd, "k", 1);
	}
}

static int stream(size_t total, long reps, size_t chunk, const char *congestion)
{
	struct sink_arg arg = { total, reps };
	double *bps = calloc((size_t)reps, sizeof(*bps));
	char *buf = malloc(chunk), k;
	pid_t pid;
	int fd, status;
	long r;

	if (!bps || !buf || chunk == 0 || total < chunk)
		return 2;
	memset(buf, 0xa5, chunk);
	fd = pair(congestion, sink_child, &arg, &pid);
	for (r = 0; r < reps; r++) {
		uint64_t t0 = now_ns();
		size_t sent = 0;

		while (sent < total) {
			size_t n = total - sent < chunk ? total - sent : chunk;

			write_full(fd, buf, n);
			sent += n;
		}
		read_full(fd, &k, 1);
		bps[r] = (double)total * 1e9 / (double)(now_ns() - t0);
	}
	close(fd);
	waitpid(pid, &status, 0);
	/* sort ascending by insertion: reps is small */
	for (r = 1; r < reps; r++)
		for (long j = r; j > 0 && bps[j - 1] > bps[j]; j--) {
			double t = bps[j];

			bps[j] = bps[j - 1];
			bps[j - 1] = t;
		}
	printf("median_bps=%.0f min_bps=%.0f max_bps=%.0f reps=%ld chunk=%zu congestion=%s\n",
	       bps[(reps - 1) / 2], bps[0], bps[reps - 1], reps, chunk,
	       congestion && *congestion ? congestion : "system");
	free(bps);
	free(buf);
	return 0;
}

static int import_floor(const char *path, unsigned long cmd, long count, long warmup)
{
	static char buf[4096], msg[64];
	size_t size = sizeof(msg);
	struct timespec settle = { 0, IMPORT_SETTLE_NS };
	uint64_t *ns = calloc((size_t)count, sizeof(*ns));
	int efd = open(path, O_RDWR | O_CLOEXEC), fd, status, k;
	pid_t pid;
	long i;

	if (!ns)
		return 2;
	if (efd < 0)
		die(path);
	fd = pair("cubic", echo_child, &size, &pid);
	for (i = -warmup; i < count; i++) {
		uint64_t t0;

		nanosleep(&settle, NULL);
		t0 = now_ns();
		if (ioctl(efd, cmd, buf) < 0)
			die("echo ioctl");
		write_full(fd, msg, size);
		read_full(fd, msg, size);
		for (k = 0; k < 2; k++)
			if (ioctl(efd, cmd, buf) < 0)
				die("echo ioctl");
		if (i >= 0)
			ns[i] = now_ns() - t0;
	}
	close(fd);
	close(efd);
	waitpid(pid, &status, 0);
	print_stats(ns, count);
	printf("\n");
	free(ns);
	return 0;
}

int main(int argc, char **argv)
{
	signal(SIGPIPE, SIG_IGN);
	if (argc >= 3 && !strcmp(argv[1], "rtt") && argc <= 6) {
		long count = strtol(argv[2], NULL, 0);
		size_t size = argc > 3 ? strtoul(argv[3], NULL, 0) : 64;
		long warmup = argc > 4 ? strtol(argv[4], NULL, 0) : 1000;

		if (count > 0 && warmup >= 0)
			return rtt(count, size, warmup, argc > 5 ? argv[5] : "cubic");
	} else if (argc >= 4 && !strcmp(argv[1], "stream") && argc <= 6) {
		size_t total = strtoul(argv[2], NULL, 0);
		long reps = strtol(argv[3], NULL, 0);
		size_t chunk = argc > 4 ? strtoul(argv[4], NULL, 0) : 1 << 20;

		if (reps > 0)
			return stream(total, reps, chunk, argc > 5 ? argv[5] : "cubic");
	} else if (argc >= 4 && argc <= 6 && !strcmp(argv[1], "fetch")) {
		long count = strtol(argv[2], NULL, 0);
		size_t size = strtoul(argv[3], NULL, 0);
		long warmup = argc > 4 ? strtol(argv[4], NULL, 0) : 10;

		if (count > 0 && warmup >= 0)
			return fetch(count, size, warmup, argc > 5 ? argv[5] : "cubic");
	} else if ((argc == 5 || argc == 6) && !strcmp(argv[1], "import")) {
		long count = strtol(argv[4], NULL, 0);
		long warmup = argc > 5 ? strtol(argv[5], NULL, 0) : 5;

		if (count > 0 && warmup >= 0)
			return import_floor(argv[2], strtoul(argv[3], NULL, 16), count, warmup);
	}
	fprintf(stderr, "usage: %s rtt <count> [size] [warmup] [congestion]\n"
			"       %s stream <total-bytes> <reps> [chunk] [congestion]\n"
			"       %s fetch <count> <size> [warmup] [congestion]\n"
			"       %s import <echo-file> <cmd-hex> <count> [warmup]\n",
		argv[0], argv[0], argv[0], argv[0]);
	return 2;
}
