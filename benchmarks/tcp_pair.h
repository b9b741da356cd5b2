/* Two processes on one loopback TCP connection set up as the fabric sets up its links, and
 * the blocking reads and writes of whole buffers over it: shared by the C floors that are
 * a pair of processes (tcp_floor.c, fuse_relay.c).  Any failure is fatal (exit 1). */
#ifndef UALINK_BENCH_TCP_PAIR_H
#define UALINK_BENCH_TCP_PAIR_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

static inline void die(const char *what)
{
	perror(what);
	exit(1);
}

/* As the fabric tunes a link: Nagle off, big buffers, the congestion control. */
static inline void tune(int fd, const char *congestion)
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

static inline void read_full(int fd, char *p, size_t n)
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

static inline void write_full(int fd, const char *p, size_t n)
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
static inline int pair(const char *congestion, void (*child)(int, void *), void *arg, pid_t *pid)
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
		int c;

		/* A parent that dies before it connects (a congestion control the kernel
		 * refuses, a failed connect) must not leave this child in accept() for
		 * good, holding its caller's output pipes. */
		if (prctl(PR_SET_PDEATHSIG, SIGKILL) || getppid() == 1)
			_exit(1);
		c = accept(lfd, NULL, NULL);

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

#endif
