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

/*
 * A timed floor's exchange with its child: `prepare` (NULL: none) before each sample,
 * untimed; `run`, timed; `check` (NULL: none) after each, untimed, nonzero when the
 * exchange did not do its work.
 */
struct exchange {
	void (*prepare)(void *arg, long i);
	void (*run)(void *arg);
	int (*check)(void *arg, long i);
	void *arg;
};

/*
 * The parent's loop of the timed floors: `count` samples of x->run after `warmup`
 * unsampled ones (i < 0), then the child's end (`fd` closed: its end of file; the child
 * reaped).  The samples, or NULL when out of memory, a check failed or the child did.
 */
static uint64_t *sample(const struct exchange *x, long count, long warmup, int fd, pid_t pid)
{
	uint64_t *ns = calloc((size_t)count, sizeof(*ns));
	int status, ok = ns != NULL;
	long i;

	for (i = -warmup; ok && i < count; i++) {
		uint64_t t0;

		if (x->prepare)
			x->prepare(x->arg, i);
		t0 = now_ns();
		x->run(x->arg);
		if (i >= 0)
			ns[i] = now_ns() - t0;
		ok = x->check == NULL || x->check(x->arg, i) == 0;
	}
	close(fd);
	if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status))
		ok = 0;
	if (!ok) {
		free(ns);
		return NULL;
	}
	return ns;
}

/* The summary line of a floor timed by `sample`, `size=..` at its end (0: none): 0, or 1
   when sample() failed. */
static int report(uint64_t *ns, long count, size_t size)
{
	if (ns == NULL)
		return 1;
	print_stats(ns, count);
	if (size)
		printf(" size=%zu", size);
	printf("\n");
	free(ns);
	return 0;
}

/* rtt and fetch: the parent's end of the pair, the request and the answer's buffer */
struct ask {
	int fd;
	const char *req;
	size_t req_size;
	char *answer;
	size_t size;
};

static void ask_run(void *arg)
{
	struct ask *a = arg;

	write_full(a->fd, a->req, a->req_size);
	read_full(a->fd, a->answer, a->size);
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
	struct ask a = { -1, buf, size, buf, size };
	struct exchange x = { NULL, ask_run, NULL, &a };
	pid_t pid;

	if (size == 0 || size > sizeof(buf))
		return 2;
	a.fd = pair(congestion, echo_child, &size, &pid);
	memset(buf, 0x5a, size);
	return report(sample(&x, count, warmup, a.fd, pid), count, size);
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
	char req[29], *buf = malloc(size);
	struct ask a = { -1, req, sizeof(req), buf, size };
	struct exchange x = { NULL, ask_run, NULL, &a };
	pid_t pid;
	int ret;

	if (!buf || size == 0)
		return 2;
	memset(req, 1, sizeof(req));
	a.fd = pair(congestion, fetch_child, &size, &pid);
	ret = report(sample(&x, count, warmup, a.fd, pid), count, size);
	free(buf);
	return ret;
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

/* import: after the idle gap, an echo ioctl, a 64-byte round trip, two more ioctls */
struct import_ex {
	struct ask rt;
	int efd;
	unsigned long cmd;
	char buf[4096];
};

static void import_settle(void *arg, long i)
{
	struct timespec settle = { 0, IMPORT_SETTLE_NS };

	(void)arg, (void)i;
	nanosleep(&settle, NULL);
}

static void import_run(void *arg)
{
	struct import_ex *m = arg;
	int k;

	for (k = 0; k < 3; k++) {
		if (ioctl(m->efd, m->cmd, m->buf) < 0)
			die("echo ioctl");
		if (k == 0)
			ask_run(&m->rt);
	}
}

static int import_floor(const char *path, unsigned long cmd, long count, long warmup)
{
	static char msg[64];
	static struct import_ex m = { { -1, msg, sizeof(msg), msg, sizeof(msg) }, -1, 0, { 0 } };
	struct exchange x = { import_settle, import_run, NULL, &m };
	size_t size = sizeof(msg);
	pid_t pid;
	int ret;

	m.cmd = cmd;
	m.efd = open(path, O_RDWR | O_CLOEXEC);
	if (m.efd < 0)
		die(path);
	m.rt.fd = pair("cubic", echo_child, &size, &pid);
	ret = report(sample(&x, count, warmup, m.rt.fd, pid), count, 0);
	close(m.efd);
	return ret;
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
