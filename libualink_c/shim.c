/* SPDX-License-Identifier: MIT */
/*
 * libualink_shim.so: run an unmodified DRM/amdgpu client against a ualinkd
 * node.
 *
 *   LD_PRELOAD=libualink_c/build/libualink_shim.so \
 *   UALINK_DRI_DIR=<mount>/dri  ./program
 *
 * What it does (DESIGN.md, "A dma-buf fd from a FUSE server" and "Restricted
 * ioctls"):
 *  - open/openat (and the 64 and fortify variants) of /dev/dri/renderD<N> go
 *    to $UALINK_DRI_DIR/renderD<N>, of /dev/dri/card<N> to renderD<N+128>;
 *    the fds so opened are remembered (an atomic bitmap indexed by fd, cleared
 *    by close/close_range/closefrom, copied by dup/dup2/dup3/fcntl(F_DUPFD*)).
 *  - On those fds: a successful UALINK_HANDLE IMPORT or PRIME_HANDLE_TO_FD
 *    returns a dma-buf *token*; the shim trades it for the real fd by opening
 *    <dmabuf dir>/<token> ($UALINK_DMABUF_DIR, else $UALINK_DRI_DIR/../dmabuf)
 *    and writes the fd where the kernel would have.  If that open fails the
 *    ioctl fails with its errno.
 *  - DRM_IOCTL_VERSION (user pointers a FUSE file cannot fill) is answered
 *    here, as amdgpu 3.64.0 would, with drm_version()'s copy rules.
 *  - Everything else passes straight through.  Without UALINK_DRI_DIR the
 *    shim changes nothing.
 *
 * The real functions come from dlsym(RTLD_NEXT) on first use.  A thread that
 * re-enters a wrapper while it is inside dlsym (e.g. through a malloc
 * interposer that opens a file) gets the raw system call instead, so there is
 * no recursion.  No wrapper allocates.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
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
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include "ualink/ualink_drm.h"

#define SHIM_API __attribute__((visibility("default")))

_Static_assert(sizeof(void *) != 8 || sizeof(struct drm_version) == 64,
	       "struct drm_version is 64 bytes on LP64");

#define SHIM_VERSION_MAJOR 3
#define SHIM_VERSION_MINOR 64
#define SHIM_VERSION_PATCHLEVEL 0
#define SHIM_NAME "amdgpu"
#define SHIM_DATE "20150101"
#define SHIM_DESC "AMD GPU"

/* ---- the real functions ---------------------------------------------------- */

typedef int (*open_fn)(const char *, int, ...);
typedef int (*openat_fn)(int, const char *, int, ...);
typedef int (*open2_fn)(const char *, int);
typedef int (*openat2_fn)(int, const char *, int);
typedef int (*close_fn)(int);
typedef int (*close_range_fn)(unsigned int, unsigned int, int);
typedef void (*closefrom_fn)(int);
typedef int (*ioctl_fn)(int, unsigned long, ...);
typedef int (*dup_fn)(int);
typedef int (*dup2_fn)(int, int);
typedef int (*dup3_fn)(int, int, int);
typedef int (*fcntl_fn)(int, int, ...);

enum real_id {
	R_OPEN, R_OPEN64, R_OPENAT, R_OPENAT64,
	R_OPEN_2, R_OPEN64_2, R_OPENAT_2, R_OPENAT64_2,
	R_CLOSE, R_CLOSE_RANGE, R_CLOSEFROM, R_IOCTL,
	R_DUP, R_DUP2, R_DUP3, R_FCNTL, R_FCNTL64,
	R_COUNT
};

static const char *const real_names[R_COUNT] = {
	[R_OPEN] = "open", [R_OPEN64] = "open64",
	[R_OPENAT] = "openat", [R_OPENAT64] = "openat64",
	[R_OPEN_2] = "__open_2", [R_OPEN64_2] = "__open64_2",
	[R_OPENAT_2] = "__openat_2", [R_OPENAT64_2] = "__openat64_2",
	[R_CLOSE] = "close", [R_CLOSE_RANGE] = "close_range",
	[R_CLOSEFROM] = "closefrom", [R_IOCTL] = "ioctl",
	[R_DUP] = "dup", [R_DUP2] = "dup2", [R_DUP3] = "dup3",
	[R_FCNTL] = "fcntl", [R_FCNTL64] = "fcntl64",
};

/* NULL: not looked up yet.  A failed lookup stores RESOLVE_FAILED. */
static _Atomic(void *) real_fns[R_COUNT];
static char resolve_failed_marker;
#define RESOLVE_FAILED ((void *)&resolve_failed_marker)

static __thread bool in_dlsym __attribute__((tls_model("initial-exec")));

/* The next definition of a symbol, or NULL (caller falls back to the raw
 * system call) if there is none or we are already inside dlsym. */
static void *real(enum real_id id)
{
	void *fn = atomic_load_explicit(&real_fns[id], memory_order_acquire);

	if (fn == NULL) {
		if (in_dlsym)
			return NULL;
		in_dlsym = true;
		fn = dlsym(RTLD_NEXT, real_names[id]);
		in_dlsym = false;
		if (fn == NULL)
			fn = RESOLVE_FAILED;
		/* Racing threads store the same value. */
		atomic_store_explicit(&real_fns[id], fn, memory_order_release);
	}
	return fn == RESOLVE_FAILED ? NULL : fn;
}

/* ---- configuration (read once) --------------------------------------------- */

static pthread_once_t config_once = PTHREAD_ONCE_INIT;
static bool shim_active;
static char dri_dir[PATH_MAX];
static char dmabuf_dir[PATH_MAX];

/* dst = src made absolute against the cwd of the moment (openat() with a
 * dirfd must not resolve our redirected path against that dirfd). */
static bool absolute_path(char *dst, size_t size, const char *src)
{
	char cwd[PATH_MAX];
	int n;

	if (src[0] == '/')
		n = snprintf(dst, size, "%s", src);
	else if (getcwd(cwd, sizeof(cwd)))
		n = snprintf(dst, size, "%s/%s", cwd, src);
	else
		return false;
	return n > 0 && (size_t)n < size;
}

static void config_init(void)
{
	const char *dri = getenv("UALINK_DRI_DIR");
	const char *dmabuf = getenv("UALINK_DMABUF_DIR");
	char tmp[PATH_MAX];

	if (!dri || !*dri || !absolute_path(dri_dir, sizeof(dri_dir), dri))
		return;
	if (dmabuf && *dmabuf) {
		if (!absolute_path(dmabuf_dir, sizeof(dmabuf_dir), dmabuf))
			return;
	} else {
		/* "<dri>/../dmabuf"; the kernel resolves the "..". */
		if (snprintf(tmp, sizeof(tmp), "%s/../dmabuf", dri_dir) >=
		    (int)sizeof(tmp))
			return;
		memcpy(dmabuf_dir, tmp, sizeof(tmp));
	}
	shim_active = true;
}

static bool active(void)
{
	pthread_once(&config_once, config_init);
	return shim_active;
}

/* ---- the fd table: one bit per fd ------------------------------------------ */

/* fs.nr_open's default ceiling; 128 KiB of bss, touched only where used. */
#define FD_LIMIT (1u << 20)
#define WORD_BITS 64u
static atomic_uint_least64_t render_fds[FD_LIMIT / WORD_BITS];

static bool fd_tracked(int fd)
{
	if (fd < 0 || (unsigned)fd >= FD_LIMIT)
		return false;
	return atomic_load_explicit(&render_fds[(unsigned)fd / WORD_BITS],
				    memory_order_relaxed) &
	       ((uint_least64_t)1 << ((unsigned)fd % WORD_BITS));
}

static void fd_set_tracked(int fd, bool on)
{
	uint_least64_t bit;

	if (fd < 0 || (unsigned)fd >= FD_LIMIT)
		return;
	bit = (uint_least64_t)1 << ((unsigned)fd % WORD_BITS);
	if (on)
		atomic_fetch_or_explicit(&render_fds[(unsigned)fd / WORD_BITS],
					 bit, memory_order_relaxed);
	else
		atomic_fetch_and_explicit(&render_fds[(unsigned)fd / WORD_BITS],
					  ~bit, memory_order_relaxed);
}

static void fd_clear_range(unsigned first, unsigned last)
{
	unsigned fd;

	if (first >= FD_LIMIT)
		return;
	if (last >= FD_LIMIT)
		last = FD_LIMIT - 1;
	for (fd = first; fd <= last; fd++) {
		if (fd % WORD_BITS == 0 && fd + WORD_BITS - 1 <= last) {
			atomic_store_explicit(&render_fds[fd / WORD_BITS], 0,
					      memory_order_relaxed);
			fd += WORD_BITS - 1;
		} else {
			fd_set_tracked((int)fd, false);
		}
	}
}

/* ---- redirection ------------------------------------------------------------ */

/* A decimal number filling all of s (no sign, no leading junk), <= max. */
static bool parse_index(const char *s, unsigned long max, unsigned long *out)
{
	unsigned long v = 0;

	if (*s < '0' || *s > '9')
		return false;
	for (; *s; s++) {
		if (*s < '0' || *s > '9')
			return false;
		v = v * 10 + (unsigned long)(*s - '0');
		if (v > max)
			return false;
	}
	*out = v;
	return true;
}

/* If path names a DRM node, write the ualinkd render node into buf and
 * return buf; else return path unchanged. */
static const char *redirect(const char *path, char *buf, size_t size)
{
	static const char prefix[] = "/dev/dri/";
	unsigned long n;
	const char *leaf;
	int len;

	if (!path || strncmp(path, prefix, sizeof(prefix) - 1) != 0 ||
	    !active())
		return path;
	leaf = path + sizeof(prefix) - 1;
	if (strncmp(leaf, "renderD", 7) == 0 &&
	    parse_index(leaf + 7, 1u << 20, &n)) {
		/* renderD<N> as is */
	} else if (strncmp(leaf, "card", 4) == 0 &&
		   parse_index(leaf + 4, 1u << 20, &n)) {
		n += 128;
	} else {
		return path;
	}
	len = snprintf(buf, size, "%s/renderD%lu", dri_dir, n);
	if (len < 0 || (size_t)len >= size)
		return path;
	return buf;
}

/* After an open: remember the fd if it is one of ours, forget any stale
 * entry otherwise. */
static int track_open(int fd, bool redirected)
{
	int saved = errno;

	if (fd >= 0) {
		if (redirected && (unsigned)fd >= FD_LIMIT) {
			/* Cannot track it; an untracked render node would hand
			 * out tokens as fds.  Refuse rather than mislead. */
			syscall(SYS_close, fd);
			errno = EMFILE;
			return -1;
		}
		fd_set_tracked(fd, redirected);
	}
	errno = saved;
	return fd;
}

/* The mode argument is there only for O_CREAT and O_TMPFILE. */
#define NEEDS_MODE(flags) \
	(((flags) & O_CREAT) != 0 || ((flags) & O_TMPFILE) == O_TMPFILE)

static int do_openat(enum real_id id, int dirfd, const char *path, int flags,
		     mode_t mode)
{
	char buf[PATH_MAX];
	const char *target = redirect(path, buf, sizeof(buf));
	bool redirected = target != path;
	int fd;

	switch (id) {
	case R_OPEN:
	case R_OPEN64: {
		open_fn fn = (open_fn)real(id);

		fd = fn ? fn(target, flags, mode)
			: (int)syscall(SYS_openat, AT_FDCWD, target, flags, mode);
		break;
	}
	case R_OPENAT:
	case R_OPENAT64: {
		openat_fn fn = (openat_fn)real(id);

		fd = fn ? fn(dirfd, target, flags, mode)
			: (int)syscall(SYS_openat, dirfd, target, flags, mode);
		break;
	}
	case R_OPEN_2:
	case R_OPEN64_2: {
		open2_fn fn = (open2_fn)real(id);

		fd = fn ? fn(target, flags)
			: (int)syscall(SYS_openat, AT_FDCWD, target, flags, 0);
		break;
	}
	default: {
		openat2_fn fn = (openat2_fn)real(id);

		fd = fn ? fn(dirfd, target, flags)
			: (int)syscall(SYS_openat, dirfd, target, flags, 0);
		break;
	}
	}
	return track_open(fd, redirected);
}

#define MODE_ARG(flags, mode)                          \
	do {                                           \
		if (NEEDS_MODE(flags)) {               \
			va_list ap;                    \
			va_start(ap, flags);           \
			mode = (mode_t)va_arg(ap, int); \
			va_end(ap);                    \
		}                                      \
	} while (0)

SHIM_API int open(const char *path, int flags, ...)
{
	mode_t mode = 0;

	MODE_ARG(flags, mode);
	return do_openat(R_OPEN, AT_FDCWD, path, flags, mode);
}

SHIM_API int open64(const char *path, int flags, ...)
{
	mode_t mode = 0;

	MODE_ARG(flags, mode);
	return do_openat(R_OPEN64, AT_FDCWD, path, flags, mode);
}

SHIM_API int openat(int dirfd, const char *path, int flags, ...)
{
	mode_t mode = 0;

	MODE_ARG(flags, mode);
	return do_openat(R_OPENAT, dirfd, path, flags, mode);
}

SHIM_API int openat64(int dirfd, const char *path, int flags, ...)
{
	mode_t mode = 0;

	MODE_ARG(flags, mode);
	return do_openat(R_OPENAT64, dirfd, path, flags, mode);
}

/* _FORTIFY_SOURCE entry points; the real ones check O_CREAT-without-mode. */
SHIM_API int __open_2(const char *path, int flags)
{
	return do_openat(R_OPEN_2, AT_FDCWD, path, flags, 0);
}

SHIM_API int __open64_2(const char *path, int flags)
{
	return do_openat(R_OPEN64_2, AT_FDCWD, path, flags, 0);
}

SHIM_API int __openat_2(int dirfd, const char *path, int flags)
{
	return do_openat(R_OPENAT_2, dirfd, path, flags, 0);
}

SHIM_API int __openat64_2(int dirfd, const char *path, int flags)
{
	return do_openat(R_OPENAT64_2, dirfd, path, flags, 0);
}

/* ---- close and dup ------------------------------------------------------------ */

/* The bit goes before the fd does: once closed, the number can be reused by
 * another thread's open, whose entry we must not wipe. */
SHIM_API int close(int fd)
{
	close_fn fn = (close_fn)real(R_CLOSE);

	fd_set_tracked(fd, false);
	return fn ? fn(fd) : (int)syscall(SYS_close, fd);
}

SHIM_API int close_range(unsigned int first, unsigned int last, int flags)
{
	close_range_fn fn = (close_range_fn)real(R_CLOSE_RANGE);

	if (!(flags & CLOSE_RANGE_CLOEXEC))
		fd_clear_range(first, last);
	return fn ? fn(first, last, flags)
		  : (int)syscall(SYS_close_range, first, last, flags);
}

SHIM_API void closefrom(int lowfd)
{
	closefrom_fn fn = (closefrom_fn)real(R_CLOSEFROM);

	if (lowfd >= 0)
		fd_clear_range((unsigned)lowfd, ~0u);
	if (fn)
		fn(lowfd);
	else if (lowfd >= 0)
		syscall(SYS_close_range, (unsigned)lowfd, ~0u, 0);
}

/* newfd refers to oldfd's open file: same DrmFile, same tracking. */
static int track_dup(int oldfd, int newfd)
{
	if (newfd >= 0) {
		int saved = errno;

		fd_set_tracked(newfd, fd_tracked(oldfd));
		errno = saved;
	}
	return newfd;
}

SHIM_API int dup(int oldfd)
{
	dup_fn fn = (dup_fn)real(R_DUP);

	return track_dup(oldfd, fn ? fn(oldfd) : (int)syscall(SYS_dup, oldfd));
}

SHIM_API int dup2(int oldfd, int newfd)
{
	dup2_fn fn = (dup2_fn)real(R_DUP2);
	int ret;

	if (fn) {
		ret = fn(oldfd, newfd);
	} else if (oldfd == newfd) {
		ret = fcntl(oldfd, F_GETFD) < 0 ? -1 : newfd;
	} else {
		ret = (int)syscall(SYS_dup3, oldfd, newfd, 0);
	}
	return track_dup(oldfd, ret);
}

SHIM_API int dup3(int oldfd, int newfd, int flags)
{
	dup3_fn fn = (dup3_fn)real(R_DUP3);

	return track_dup(oldfd, fn ? fn(oldfd, newfd, flags)
				   : (int)syscall(SYS_dup3, oldfd, newfd, flags));
}

/* Every fcntl argument is an int, a long or a pointer; like glibc, pass a
 * pointer-sized value through. */
static int do_fcntl(enum real_id id, int fd, int cmd, void *arg)
{
	fcntl_fn fn = (fcntl_fn)real(id);
	int ret = fn ? fn(fd, cmd, arg) : (int)syscall(SYS_fcntl, fd, cmd, arg);

	if (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC)
		return track_dup(fd, ret);
	return ret;
}

SHIM_API int fcntl(int fd, int cmd, ...)
{
	va_list ap;
	void *arg;

	va_start(ap, cmd);
	arg = va_arg(ap, void *);
	va_end(ap);
	return do_fcntl(R_FCNTL, fd, cmd, arg);
}

SHIM_API int fcntl64(int fd, int cmd, ...)
{
	va_list ap;
	void *arg;

	va_start(ap, cmd);
	arg = va_arg(ap, void *);
	va_end(ap);
	return do_fcntl(R_FCNTL64, fd, cmd, arg);
}

/* ---- ioctl ---------------------------------------------------------------------- */

static int real_ioctl(int fd, unsigned long request, void *arg)
{
	ioctl_fn fn = (ioctl_fn)real(R_IOCTL);

	return fn ? fn(fd, request, arg)
		  : (int)syscall(SYS_ioctl, fd, request, arg);
}

/* drm_version()'s copy_field: at most *len bytes, no NUL, *len = real length. */
static void copy_field(char *buf, size_t *len, const char *value)
{
	size_t n = strlen(value);

	if (n > *len)
		n = *len;
	*len = strlen(value);
	if (n && buf)
		memcpy(buf, value, n);
}

/* Answered here: the FUSE file cannot write through the user pointers.  A bad
 * pointer faults in the caller instead of giving EFAULT. */
static int answer_version(struct drm_version *v)
{
	if (!v) {
		errno = EFAULT;
		return -1;
	}
	v->version_major = SHIM_VERSION_MAJOR;
	v->version_minor = SHIM_VERSION_MINOR;
	v->version_patchlevel = SHIM_VERSION_PATCHLEVEL;
	copy_field(v->name, &v->name_len, SHIM_NAME);
	copy_field(v->date, &v->date_len, SHIM_DATE);
	copy_field(v->desc, &v->desc_len, SHIM_DESC);
	return 0;
}

/* Trade a dma-buf token for the real fd (single-use, same uid). */
static int open_token(uint32_t token, int oflags)
{
	char path[PATH_MAX];
	openat_fn fn;
	int fd;

	if (token == 0) {
		errno = EPROTO;	/* the daemon never hands out token 0 */
		return -1;
	}
	if (snprintf(path, sizeof(path), "%s/%u", dmabuf_dir, token) >=
	    (int)sizeof(path)) {
		errno = ENAMETOOLONG;
		return -1;
	}
	fn = (openat_fn)real(R_OPENAT);
	do {
		fd = fn ? fn(AT_FDCWD, path, oflags)
			: (int)syscall(SYS_openat, AT_FDCWD, path, oflags);
	} while (fd == -1 && errno == EINTR);
	if (fd >= 0)
		fd_set_tracked(fd, false);	/* a dma-buf, not a render node */
	return fd;
}

/* Dispatch is by nr (spec §2.2): a size variant of the same _IOWR ioctl is the same call,
 * so the token in it becomes an fd as well, when the struct reaches the field. */
static bool is_drm_rw(unsigned long request, unsigned int nr, unsigned int min_size)
{
	return _IOC_TYPE(request) == DRM_IOCTL_BASE && _IOC_NR(request) == nr &&
	       _IOC_DIR(request) == (_IOC_READ | _IOC_WRITE) &&
	       _IOC_SIZE(request) >= min_size;
}

SHIM_API int ioctl(int fd, unsigned long request, ...)
{
	va_list ap;
	void *arg;
	int ret, dmabuf;

	va_start(ap, request);
	arg = va_arg(ap, void *);
	va_end(ap);

	if (!fd_tracked(fd))
		return real_ioctl(fd, request, arg);

	if (request == DRM_IOCTL_VERSION)
		return answer_version(arg);

	/* The UALink import: op at offset 0 in, the token at offset 0 out. */
	if (is_drm_rw(request, DRM_COMMAND_BASE + DRM_AMDGPU_UALINK_HANDLE, sizeof(__u32))) {
		union drm_amdgpu_ualink_handle *u = arg;
		/* Read before the call: the reply overwrites bytes 0-3. */
		bool import = u && u->in.op == DRM_AMDGPU_UALINK_HANDLE_OP_IMPORT;

		ret = real_ioctl(fd, request, arg);
		if (ret != 0 || !import)
			return ret;
		dmabuf = open_token(u->out.import_dmabuf_handle,
				    O_RDWR | O_CLOEXEC);
		if (dmabuf < 0)
			return -1;
		u->out.import_dmabuf_handle = (uint32_t)dmabuf;
		return ret;
	}

	/* PRIME_HANDLE_TO_FD: flags at offset 4 in, the token at offset 8 out. */
	if (is_drm_rw(request, 0x2D, offsetof(struct drm_prime_handle, fd) + sizeof(__s32))) {
		struct drm_prime_handle *p = arg;
		uint32_t flags = p ? p->flags : 0;

		ret = real_ioctl(fd, request, arg);
		if (ret != 0)
			return ret;
		/* The token file is always opened O_RDWR (the daemon's
		 * contract); close-on-exec only if asked, as the kernel does. */
		dmabuf = open_token((uint32_t)p->fd,
				    O_RDWR | ((flags & DRM_CLOEXEC) ? O_CLOEXEC : 0));
		if (dmabuf < 0)
			return -1;
		p->fd = dmabuf;
		return ret;
	}

	return real_ioctl(fd, request, arg);
}
