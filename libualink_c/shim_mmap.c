/* SPDX-License-Identifier: MIT */
/*
 * CPU mappings of BOs for libualink_shim.so (README, "CPU mappings").
 *
 * A ualinkd render node or dma-buf is a FUSE file, which cannot be mapped
 * MAP_SHARED here (libfuse 3.14).  The BO's memory is a memfd the daemon
 * itself reads and writes for GPU loads, stores and the fabric, so mapping
 * that memfd is mapping the BO.  mmap/mmap64 of an fd on the ualinkd mount
 * ($UALINK_DRI_DIR's file system):
 *   1. UALINKD_IOCTL_MMAP_GRANT on the fd, with mmap's arguments: the daemon
 *      makes the kernel's checks (drm_gem_mmap, dma_buf_mmap_internal,
 *      amdgpu_gem_object_mmap) and answers a one-time grant, or the errno
 *      mmap must fail with;
 *   2. the grant is sent on the daemon's abstract unix socket, which checks
 *      that this process and uid asked for it and sends the memfd back
 *      (SCM_RIGHTS), read-only unless the mapping may ever be written;
 *   3. the memfd is mapped with the caller's address, prot and flags
 *      (MAP_FIXED included) and closed; the mapping keeps it.
 * A file of the mount that knows no grant (ENOTTY: sys attributes) is mapped
 * as before.  Anonymous mappings and other files cost one branch (plus one
 * fstat for files).
 *
 * Lifetimes.  The kernel's mapping holds the render (or dma-buf) file: its
 * DrmFile, with its handles, outlives close() until the last munmap.  Ours is
 * of the memfd, so each BO mapping also gets a *guard*: one PROT_NONE
 * MAP_PRIVATE page of the FUSE file itself (which FUSE allows and never
 * reads until touched), holding the file as the kernel's vma would, with no
 * fd the program could close or see.  A table of BO mappings follows munmap,
 * MAP_FIXED over them and mremap, and drops a guard when no byte of its
 * mapping is left (a partial munmap keeps it; mremap drops it, as if
 * unmapped).  A full table (MAX_MAPS) or a failed guard only loses the hold.
 * Every system call here is raw, so the other wrappers of the shim (stat,
 * fcntl, ioctl) never see ours.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/un.h>
#include <unistd.h>

#include "ualink/ualink_cpumap.h"

#define SHIM_API __attribute__((visibility("default")))

_Static_assert(sizeof(struct ualinkd_mmap_grant) == 48, "grant is 48 bytes");
_Static_assert(sizeof(struct ualinkd_mmap_fetch) == 16, "fetch reply is 16 bytes");

/* ---- which fds are ours ------------------------------------------------------ */

static pthread_once_t mount_once = PTHREAD_ONCE_INIT;
static bool have_mount;
static dev_t mount_dev;

/* The mount's st_dev: that of <UALINK_DRI_DIR>/renderD128 (the directory
 * itself may be a bind mount target elsewhere, the render node never is). */
static void mount_init(void)
{
	const char *dri = getenv("UALINK_DRI_DIR");
	char path[PATH_MAX];
	struct stat st;

	if (!dri || !*dri ||
	    snprintf(path, sizeof(path), "%s/renderD128", dri) >= (int)sizeof(path))
		return;
	if (syscall(SYS_newfstatat, AT_FDCWD, path, &st, 0) != 0)
		return;
	mount_dev = st.st_dev;
	have_mount = true;
}

static bool on_mount(int fd)
{
	struct stat st;
	int saved = errno;
	bool ours;

	pthread_once(&mount_once, mount_init);
	if (!have_mount)
		return false;
	ours = syscall(SYS_fstat, fd, &st) == 0 && S_ISREG(st.st_mode) &&
	       st.st_dev == mount_dev;
	errno = saved;
	return ours;
}

/* ---- the grant and the fetch --------------------------------------------------- */

static void *raw_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	return (void *)syscall(SYS_mmap, addr, len, prot, flags, fd, off);
}

/* 0 and the grant, or -errno; -ENOTTY: the file knows no grants. */
static int ask_grant(int fd, struct ualinkd_mmap_grant *g)
{
	long r;

	do {
		r = syscall(SYS_ioctl, fd, UALINKD_IOCTL_MMAP_GRANT, g);
	} while (r == -1 && (errno == EINTR || errno == EAGAIN));
	return r == 0 ? 0 : -errno;
}

static const struct timeval fetch_timeout = { .tv_sec = 10 };

/* The memfd behind a grant (>= 0) and where to map it from, or -errno
 * (ETIMEDOUT when the daemon does not answer within fetch_timeout). */
static int fetch(const struct ualinkd_mmap_grant *g, struct ualinkd_mmap_fetch *reply)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	union {
		struct cmsghdr hdr;
		char buf[CMSG_SPACE(sizeof(int))];
	} ctl;
	struct iovec iov = { .iov_base = reply, .iov_len = sizeof(*reply) };
	struct msghdr msg = {
		.msg_iov = &iov, .msg_iovlen = 1,
		.msg_control = ctl.buf, .msg_controllen = sizeof(ctl.buf),
	};
	struct cmsghdr *c;
	int s, n, memfd = -1, err;
	socklen_t alen;
	long r;

	/* Abstract: sun_path[0] = 0, then the name, no terminating NUL. */
	n = snprintf(sa.sun_path + 1, sizeof(sa.sun_path) - 1, UALINKD_CPUMAP_SOCKET_FMT,
		     (unsigned long long)g->socket);
	alen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
	s = (int)syscall(SYS_socket, AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (s < 0)
		return -errno;
	/* A daemon that stops answering must not hang mmap: the fetch is one small
	 * message each way, answered at once by a live daemon. */
	syscall(SYS_setsockopt, s, SOL_SOCKET, SO_RCVTIMEO, &fetch_timeout, sizeof(fetch_timeout));
	syscall(SYS_setsockopt, s, SOL_SOCKET, SO_SNDTIMEO, &fetch_timeout, sizeof(fetch_timeout));
	do {
		r = syscall(SYS_connect, s, &sa, alen);
	} while (r == -1 && errno == EINTR);
	if (r != 0)
		goto fail;
	do {
		r = syscall(SYS_sendto, s, &g->grant, sizeof(g->grant), MSG_NOSIGNAL, NULL, 0);
	} while (r == -1 && errno == EINTR);
	if (r != (long)sizeof(g->grant))
		goto fail;
	do {
		r = syscall(SYS_recvmsg, s, &msg, MSG_CMSG_CLOEXEC);
	} while (r == -1 && errno == EINTR);
	if (r < 0) {
		if (errno == EAGAIN)
			errno = ETIMEDOUT;
		goto fail;
	}
	for (c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c))
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS &&
		    c->cmsg_len == CMSG_LEN(sizeof(int)))
			memcpy(&memfd, CMSG_DATA(c), sizeof(int));
	syscall(SYS_close, s);
	if (r != (long)sizeof(*reply)) {
		err = -EPROTO;
	} else if (reply->result < 0) {
		err = reply->result;
	} else if (memfd < 0) {
		err = -EPROTO;
	} else {
		return memfd;
	}
	if (memfd >= 0)
		syscall(SYS_close, memfd);
	return err;
fail:
	err = -errno;
	syscall(SYS_close, s);
	/* The daemon that answered the ioctl is not there: as if mmap failed. */
	return err == -ECONNREFUSED || err == -ENOENT ? -ENODEV : err;
}

static void *map_bo(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	struct ualinkd_mmap_grant g = {
		.offset = (uint64_t)off, .length = len, .prot = (uint32_t)prot,
		.flags = (uint32_t)flags,
	};
	struct ualinkd_mmap_fetch reply;
	int saved = errno, fl, memfd, err;
	void *p;

	fl = (int)syscall(SYS_fcntl, fd, F_GETFL);
	if (fl < 0)
		return MAP_FAILED;	/* EBADF, as mmap would */
	g.fmode = (uint32_t)(fl & O_ACCMODE);
	err = ask_grant(fd, &g);
	if (err == -ENOTTY) {
		errno = saved;
		return raw_mmap(addr, len, prot, flags, fd, off);
	}
	if (err == 0) {
		memfd = fetch(&g, &reply);
		err = memfd < 0 ? memfd : 0;
	}
	if (err) {
		errno = -err;
		return MAP_FAILED;
	}
	p = raw_mmap(addr, len, prot, (flags & ~MAP_TYPE) | (int)reply.map_type, memfd,
		     (off_t)reply.backing_offset);
	err = errno;
	syscall(SYS_close, memfd);
	errno = p == MAP_FAILED ? err : saved;
	return p;
}

/* ---- guards: the file held while a BO mapping lives ----------------------------- */

#define MAX_MAPS 16384
#define PAGE 4096ul

struct bo_map {
	uintptr_t start, end;	/* page-aligned; end == 0: a free slot */
	uintptr_t guard;	/* shared by the pieces of a split mapping */
};

static pthread_mutex_t maps_lock = PTHREAD_MUTEX_INITIALIZER;
static struct bo_map maps[MAX_MAPS];
static unsigned maps_used;	/* slots [0, maps_used) may be live */
static _Atomic unsigned live_maps;	/* fast path: nothing to look at */

static bool guard_in_use(uintptr_t guard)
{
	unsigned i;

	for (i = 0; i < maps_used; i++)
		if (maps[i].end && maps[i].guard == guard)
			return true;
	return false;
}

static struct bo_map *free_slot(void)
{
	unsigned i;

	for (i = 0; i < maps_used; i++)
		if (!maps[i].end)
			return &maps[i];
	return maps_used < MAX_MAPS ? &maps[maps_used++] : NULL;
}

/* [start, end) is no longer mapped: cut it out of every BO mapping, and drop
 * the guards nothing is left of.  Called with maps_lock held. */
static void forget_range_locked(uintptr_t start, uintptr_t end)
{
	uintptr_t dropped[16];
	unsigned i, n = 0;

	for (i = 0; i < maps_used; i++) {
		struct bo_map *m = &maps[i];
		struct bo_map *tail;

		if (!m->end || m->end <= start || end <= m->start)
			continue;
		if (m->start < start && end < m->end && (tail = free_slot())) {
			/* A hole in the middle: two pieces, one guard. */
			*tail = (struct bo_map){ end, m->end, m->guard };
			live_maps++;
			m->end = start;
		} else if (m->start < start) {
			m->end = start;
		} else if (end < m->end) {
			m->start = end;
		} else {
			m->end = 0;
			live_maps--;
			if (n < sizeof(dropped) / sizeof(dropped[0]))
				dropped[n++] = m->guard;
			else if (!guard_in_use(m->guard))
				syscall(SYS_munmap, m->guard, PAGE);
		}
	}
	for (i = 0; i < n; i++)
		if (!guard_in_use(dropped[i]))
			syscall(SYS_munmap, dropped[i], PAGE);
}

static void forget_range(void *addr, size_t len)
{
	uintptr_t start = (uintptr_t)addr & ~(PAGE - 1);
	uintptr_t end = ((uintptr_t)addr + len + PAGE - 1) & ~(PAGE - 1);

	if (!live_maps || !len)
		return;
	pthread_mutex_lock(&maps_lock);
	forget_range_locked(start, end);
	pthread_mutex_unlock(&maps_lock);
}

/* A new BO mapping at [p, p + len) of `fd`'s file: guard it. */
static void remember(void *p, size_t len, int fd)
{
	void *guard = raw_mmap(NULL, PAGE, PROT_NONE, MAP_PRIVATE, fd, 0);
	struct bo_map *m;

	if (guard == MAP_FAILED)
		return;
	pthread_mutex_lock(&maps_lock);
	m = free_slot();
	if (m) {
		*m = (struct bo_map){ (uintptr_t)p, ((uintptr_t)p + len + PAGE - 1) & ~(PAGE - 1),
				      (uintptr_t)guard };
		live_maps++;
	}
	pthread_mutex_unlock(&maps_lock);
	if (!m)
		syscall(SYS_munmap, guard, PAGE);
}

/* ---- the wrappers ------------------------------------------------------------ */

SHIM_API void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	int saved = errno;
	void *p;

	if (fd < 0 || (flags & MAP_ANONYMOUS) || !on_mount(fd)) {
		p = raw_mmap(addr, len, prot, flags, fd, off);
		if (p != MAP_FAILED && (flags & MAP_FIXED))
			forget_range(p, len);	/* whatever was there is gone */
		return p;
	}
	p = map_bo(addr, len, prot, flags, fd, off);
	if (p != MAP_FAILED) {
		saved = errno;
		if (flags & MAP_FIXED)
			forget_range(p, len);
		remember(p, len, fd);
		errno = saved;
	}
	return p;
}

SHIM_API int munmap(void *addr, size_t len)
{
	long r = syscall(SYS_munmap, addr, len);

	if (r == 0) {
		int saved = errno;

		forget_range(addr, len);
		errno = saved;
	}
	return (int)r;
}

/* A BO mapping that moves loses its guard (as if unmapped: the hold ends
 * early, never late); one that shrinks in place loses the cut-off tail; what
 * was mapped at a MREMAP_FIXED target was unmapped first. */
SHIM_API void *mremap(void *old, size_t old_len, size_t new_len, int flags, ...)
{
	void *new_addr = NULL, *p;
	va_list ap;

	if (flags & MREMAP_FIXED) {
		va_start(ap, flags);
		new_addr = va_arg(ap, void *);
		va_end(ap);
	}
	p = (void *)syscall(SYS_mremap, old, old_len, new_len, flags, new_addr);
	if (p != MAP_FAILED) {
		int saved = errno;

		if (p != old)
			forget_range(old, old_len);
		else if (new_len < old_len)
			forget_range((char *)old + new_len, old_len - new_len);
		if (flags & MREMAP_FIXED)
			forget_range(p, new_len);
		errno = saved;
	}
	return p;
}

/* LP64: off_t is 64 bits, so mmap64 is the same call. */
SHIM_API void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	return mmap(addr, len, prot, flags, fd, off);
}
