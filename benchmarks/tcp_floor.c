/* SPDX-License-Identifier: MIT */
/*
 * tcp_floor rtt <count> [size] [warmup] [congestion]
 * tcp_floor stream <total-bytes> <reps> [chunk] [congestion]
 * tcp_floor fetch <count> <size> [warmup] [congestion]
 * tcp_floor relay <bytes> <reps> [congestion]
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
 * relay:  the floor of an SDMA copy of <bytes> (a multiple of 8) from imported memory: the
 *         same work as the emulator's (1 MiB pieces sendfile'd from an exporter's memfd, 4
 *         requests out, received into an 8-slot ring, written into a third process's memory
 *         by process_vm_writev in runs of 4; see relay below) with nothing else, <reps>
 *         times after one unsampled.  Each relay is checked after it (untimed): every
 *         piece's first word, stamped anew at the exporter before it, read back from the
 *         client; the last relay's bytes all of them.  A wrong byte fails the floor (exit
 *         1); TCP_FLOOR_RELAY_NOWRITE=1 leaves the writes out, to test that it does.
 *         Timed from the first request to the last write.  Prints
 *         relay_ns=<median> min_ns=.. max_ns=.. reps=.. bytes=..
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
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/uio.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <fcntl.h>
#include <unistd.h>

#include "bench_stats.h"
#include "tcp_pair.h"

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

/*
 * relay: the GPU engine's remote copy (ualinkd/engine_remote.py, fuse/dataplane.c
 * ualinkd_dp_load_into) done in C, three processes as in the emulator: the exporter (a
 * child on the accepted end) holds the bytes in a memfd and answers each 29-byte request
 * with a 13-byte head and its piece, sendfile'd from the memfd (dp_serve_files); the
 * importer (this process) keeps RELAY_IN_FLIGHT requests out, receives each answer straight
 * into its slot of a RELAY_SLOTS-piece ring (woken once it is all in: relay_recv; the data
 * plane's thread is woken for its head, then for its piece), and writes every run of
 * pieces in, at least RELAY_STORE_PIECES (fewer at the end), into the client's anonymous
 * memory with one process_vm_writev (callermem's worker; never split: its split starts at
 * 8 MiB); the client (a child) only holds that memory.  Two copies of the bytes: socket to
 * ring, ring to client.  Two threads in the importer, as in the emulator: one receives (and
 * issues the next request as each answer comes in, where the emulator's trio thread does),
 * the other writes, so that the receive, the writes and the exporter's sendfile overlap.
 */
#define RELAY_PIECE (1u << 20)          /* engine_remote.CHUNK: the data plane's largest */
#define RELAY_IN_FLIGHT 4               /* engine_remote.IN_FLIGHT */
#define RELAY_SLOTS (2 * RELAY_IN_FLIGHT) /* engine_remote.SLOTS */
#define RELAY_STORE_PIECES RELAY_IN_FLIGHT /* engine_remote.STORE_PIECES */
#define RELAY_HEAD 13                   /* a DATA frame's head: length, type, seq, status */

struct relay {
	int sock;                       /* the importer's end, to the exporter */
	int memfd;                      /* the exporter's bytes */
	uint64_t *src;                  /* the memfd, mapped: the pattern and the stamps */
	size_t bytes;
	long pieces;
	pid_t client;
	int client_fd;                  /* the client holds its memory until this closes */
	uint64_t at;                    /* the client's memory */
	char *ring;
	int nowrite;                    /* TCP_FLOOR_RELAY_NOWRITE: the check's own test */
	int lowat;                      /* the socket's SO_RCVLOWAT (the receiving thread's) */
	pthread_mutex_t lock;
	pthread_cond_t cond;
	long gen;                       /* relays started: the receiver's start */
	int quit;
	long issued, received, stored;  /* pieces requested, in the ring, in the client */
};

static uint32_t relay_len(const struct relay *r, long k)
{
	size_t left = r->bytes - (size_t)k * RELAY_PIECE;

	return left < RELAY_PIECE ? (uint32_t)left : RELAY_PIECE;
}

/* Requests out while the window and the ring's free slots allow. [r->lock held] */
static void relay_issue(struct relay *r)
{
	while (r->issued < r->pieces && r->issued - r->received < RELAY_IN_FLIGHT &&
	       r->issued < r->stored + RELAY_SLOTS) {
		char req[29] = { 0 };
		uint64_t off = (uint64_t)r->issued * RELAY_PIECE;
		uint32_t n = relay_len(r, r->issued), seq = (uint32_t)r->issued;

		memcpy(req + 5, &seq, 4);
		memcpy(req + 13, &off, 8);
		memcpy(req + 21, &n, 4);
		write_full(r->sock, req, sizeof(req));
		r->issued++;
	}
}

/* The exporter: each request's piece of the memfd, after its head; a bad request ends it
   with 1 (the floor fails). */
static void relay_exporter(int fd, void *arg)
{
	struct relay *r = arg;
	char req[29], head[RELAY_HEAD] = { 0 };

	close(r->client_fd);  /* (the client's end of file is the importer's to give) */
	while (child_read(fd, req, sizeof(req))) {
		uint32_t n, len;
		uint64_t off;
		off_t at;

		memcpy(&off, req + 13, 8);
		memcpy(&n, req + 21, 4);
		if (n == 0 || n > RELAY_PIECE || off > r->bytes || n > r->bytes - off)
			_exit(1);
		len = 9 + n;
		memcpy(head, &len, 4);
		head[4] = 2;
		memcpy(head + 5, req + 5, 4);
		if (send(fd, head, sizeof(head), MSG_MORE) != (ssize_t)sizeof(head))
			_exit(1);
		for (at = (off_t)off; n; ) {
			ssize_t k = sendfile(fd, r->memfd, &at, n);

			if (k < 0 && errno == EINTR)
				continue;
			if (k <= 0)
				_exit(1);
			n -= (uint32_t)k;
		}
	}
}

/*
 * An answer into `head` and `to` (its `n` bytes), the receiving thread woken once it is all
 * in: SO_RCVLOWAT at what is left of it, lowered as it comes, as the data plane lowers it
 * (dp_direct_more).  Not a blocking read with the mark at the answer's size: one that took
 * part of it sleeps past the rest (the socket wakes a reader once its unread bytes reach
 * the mark, and the part taken is not unread any more).
 */
static void relay_recv(struct relay *r, char *head, char *to, uint32_t n)
{
	struct iovec v[2] = { { head, RELAY_HEAD }, { to, n } }, *at = v;
	struct msghdr m = { .msg_iov = v, .msg_iovlen = 2 };
	size_t left = RELAY_HEAD + (size_t)n;

	while (left) {
		struct pollfd in = { r->sock, POLLIN, 0 };
		ssize_t k;

		if ((int)left != r->lowat) {
			r->lowat = (int)left;
			setsockopt(r->sock, SOL_SOCKET, SO_RCVLOWAT, &r->lowat, sizeof(r->lowat));
		}
		if (poll(&in, 1, -1) < 0 && errno != EINTR)
			die("poll");
		k = recvmsg(r->sock, &m, MSG_DONTWAIT);
		if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
			continue;
		if (k <= 0)
			die("recvmsg");
		left -= (size_t)k;
		for (; at < v + 2 && (size_t)k >= at->iov_len; at++)
			k -= (ssize_t)at->iov_len;
		if (at < v + 2) {
			at->iov_base = (char *)at->iov_base + k;
			at->iov_len -= (size_t)k;
		}
		m.msg_iov = at;
		m.msg_iovlen = (size_t)(v + 2 - at);
	}
}

/* The importer's receiving thread: each relay's answers in order, each into its slot. */
static void *relay_receiver(void *arg)
{
	struct relay *r = arg;
	long seen = 0, k;

	for (;;) {
		pthread_mutex_lock(&r->lock);
		while (r->gen == seen && !r->quit)
			pthread_cond_wait(&r->cond, &r->lock);
		seen = r->gen;
		pthread_mutex_unlock(&r->lock);
		if (r->quit)
			return NULL;
		for (k = 0; k < r->pieces; k++) {
			char head[RELAY_HEAD];
			uint32_t n = relay_len(r, k), len, seq;

			relay_recv(r, head, r->ring + (size_t)(k % RELAY_SLOTS) * RELAY_PIECE, n);
			memcpy(&len, head, 4);
			memcpy(&seq, head + 5, 4);
			if (len != 9 + n || seq != (uint32_t)k) {
				fprintf(stderr, "relay: answer %ld: length %u seq %u\n", k, len, seq);
				exit(1);
			}
			pthread_mutex_lock(&r->lock);
			r->received++;
			relay_issue(r);
			pthread_cond_broadcast(&r->cond);
			pthread_mutex_unlock(&r->lock);
		}
	}
}

/* Pieces [i, j) from the ring into the client, in one process_vm_writev. */
static void relay_write(struct relay *r, long i, long j)
{
	struct iovec local[RELAY_SLOTS], remote;
	long k;

	remote.iov_base = (void *)(uintptr_t)(r->at + (uint64_t)i * RELAY_PIECE);
	remote.iov_len = 0;
	for (k = i; k < j; k++) {
		local[k - i].iov_base = r->ring + (size_t)(k % RELAY_SLOTS) * RELAY_PIECE;
		local[k - i].iov_len = relay_len(r, k);
		remote.iov_len += local[k - i].iov_len;
	}
	if (!r->nowrite &&
	    process_vm_writev(r->client, local, (unsigned long)(j - i), &remote, 1, 0) !=
		    (ssize_t)remote.iov_len)
		die("process_vm_writev");
}

/* One relay, timed (the writing thread): from the first request to the last write. */
static void relay_run(void *arg)
{
	struct relay *r = arg;

	pthread_mutex_lock(&r->lock);
	r->issued = r->received = r->stored = 0;
	r->gen++;
	relay_issue(r);
	pthread_cond_broadcast(&r->cond);
	while (r->stored < r->pieces) {
		long i = r->stored, j;
		long want = i + RELAY_STORE_PIECES < r->pieces ? i + RELAY_STORE_PIECES : r->pieces;

		while (r->received < want)
			pthread_cond_wait(&r->cond, &r->lock);
		j = r->received;
		pthread_mutex_unlock(&r->lock);
		relay_write(r, i, j);
		pthread_mutex_lock(&r->lock);
		r->stored = j;
		relay_issue(r);
	}
	pthread_mutex_unlock(&r->lock);
}

/* Before each relay (untimed): a new stamp in each piece's first word at the exporter. */
static void relay_prepare(void *arg, long i)
{
	struct relay *r = arg;
	uint64_t stamp = (uint64_t)(i + 1 + (1L << 20)) << 32;  /* (i: -1 for the warm-up) */
	long k;

	for (k = 0; k < r->pieces; k++)
		r->src[(size_t)k * RELAY_PIECE / 8] = stamp | (uint64_t)k;
}

/* Compare the client's [off, off + n) with the exporter's (`n` <= RELAY_PIECE): 0 if equal. */
static int relay_compare(struct relay *r, char *buf, size_t off, size_t n)
{
	struct iovec l = { buf, n }, c = { (void *)(uintptr_t)(r->at + off), n };

	if (process_vm_readv(r->client, &l, 1, &c, 1, 0) != (ssize_t)n)
		die("process_vm_readv");
	return memcmp(buf, (char *)r->src + off, n) != 0;
}

/* After each relay (untimed): every piece's stamp reached the client (a relay that wrote
   nothing, or a piece of the one before, fails). */
static int relay_check(void *arg, long i)
{
	struct relay *r = arg;
	char word[8];
	long k;

	(void)i;
	for (k = 0; k < r->pieces; k++)
		if (relay_compare(r, word, (size_t)k * RELAY_PIECE, 8)) {
			fprintf(stderr, "relay: piece %ld did not reach the client\n", k);
			return 1;
		}
	return 0;
}

/* The client: `bytes` of anonymous memory, its address to the importer, held until the
   importer closes its end. */
static pid_t relay_client(struct relay *r)
{
	int sv[2];
	pid_t pid;

	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv))
		die("socketpair");
	pid = fork();
	if (pid < 0)
		die("fork");
	if (pid == 0) {
		char *m = mmap(NULL, r->bytes, PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		uint64_t at = (uint64_t)(uintptr_t)m;
		char c;

		close(sv[0]);
		if (m == MAP_FAILED)
			_exit(1);
		memset(m, 0, r->bytes);
		if (write(sv[1], &at, 8) != 8)
			_exit(1);
		while (read(sv[1], &c, 1) > 0 || errno == EINTR)
			;
		_exit(0);
	}
	close(sv[1]);
	r->client_fd = sv[0];
	read_full(sv[0], (char *)&r->at, 8);
	return pid;
}

static int relay(size_t bytes, long reps, const char *congestion)
{
	static struct relay r = { .lock = PTHREAD_MUTEX_INITIALIZER,
				  .cond = PTHREAD_COND_INITIALIZER };
	struct exchange x = { relay_prepare, relay_run, relay_check, &r };
	uint64_t *ns;
	pthread_t rx;
	pid_t exporter;
	char *buf = malloc(RELAY_PIECE);
	size_t i, off;
	int status, ok;

	r.bytes = bytes;
	r.pieces = (long)((bytes + RELAY_PIECE - 1) / RELAY_PIECE);
	r.nowrite = getenv("TCP_FLOOR_RELAY_NOWRITE") != NULL;
	r.ring = malloc((size_t)RELAY_SLOTS * RELAY_PIECE);
	r.memfd = memfd_create("relay", MFD_CLOEXEC);
	if (!buf || !r.ring || r.memfd < 0 || ftruncate(r.memfd, (off_t)bytes))
		die("relay's memory");
	r.src = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, r.memfd, 0);
	if (r.src == MAP_FAILED)
		die("mmap");
	for (i = 0; i < bytes / 8; i++)  /* (a pattern no piece has at another offset) */
		r.src[i] = (i * 0x9e3779b97f4a7c15ull) ^ 0x5aa5c33cull;
	r.client = relay_client(&r);
	r.sock = pair(congestion, relay_exporter, &r, &exporter);
	if (pthread_create(&rx, NULL, relay_receiver, &r))
		die("pthread_create");
	ns = sample(&x, reps, 1, r.sock, exporter);
	pthread_mutex_lock(&r.lock);
	r.quit = 1;
	pthread_cond_broadcast(&r.cond);
	pthread_mutex_unlock(&r.lock);
	pthread_join(rx, NULL);
	/* the last relay's bytes, all of them (untimed: once, lest it warm the caches) */
	for (off = 0, ok = ns != NULL; ok && off < bytes; off += RELAY_PIECE) {
		size_t n = bytes - off < RELAY_PIECE ? bytes - off : RELAY_PIECE;

		if (relay_compare(&r, buf, off, n)) {
			fprintf(stderr, "relay: the client's bytes differ in [%zu, +%zu)\n", off, n);
			ok = 0;
		}
	}
	close(r.client_fd);
	if (waitpid(r.client, &status, 0) != r.client || !WIFEXITED(status) || WEXITSTATUS(status))
		ok = 0;
	free(buf);
	if (!ok) {
		free(ns);
		return 1;
	}
	qsort(ns, (size_t)reps, sizeof(*ns), cmp_u64);
	printf("relay_ns=%llu min_ns=%llu max_ns=%llu reps=%ld bytes=%zu\n",
	       (unsigned long long)ns[(reps - 1) / 2], (unsigned long long)ns[0],
	       (unsigned long long)ns[reps - 1], reps, bytes);
	free(ns);
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
	} else if ((argc == 4 || argc == 5) && !strcmp(argv[1], "relay")) {
		size_t bytes = strtoul(argv[2], NULL, 0);
		long reps = strtol(argv[3], NULL, 0);

		if (bytes > 0 && bytes % 8 == 0 && reps > 0)  /* (each piece holds its stamp) */
			return relay(bytes, reps, argc > 4 ? argv[4] : "cubic");
	} else if ((argc == 5 || argc == 6) && !strcmp(argv[1], "import")) {
		long count = strtol(argv[4], NULL, 0);
		long warmup = argc > 5 ? strtol(argv[5], NULL, 0) : 5;

		if (count > 0 && warmup >= 0)
			return import_floor(argv[2], strtoul(argv[3], NULL, 16), count, warmup);
	}
	fprintf(stderr, "usage: %s rtt <count> [size] [warmup] [congestion]\n"
			"       %s stream <total-bytes> <reps> [chunk] [congestion]\n"
			"       %s fetch <count> <size> [warmup] [congestion]\n"
			"       %s relay <bytes> <reps> [congestion]\n"
			"       %s import <echo-file> <cmd-hex> <count> [warmup]\n",
		argv[0], argv[0], argv[0], argv[0], argv[0]);
	return 2;
}
