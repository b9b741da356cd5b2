/* SPDX-License-Identifier: MIT */
/*
 * libualink_shim.so: run an unmodified DRM/amdgpu client against a ualinkd
 * node.
 *
 *   LD_PRELOAD=libualink_c/build/libualink_shim.so \
 *   UALINK_DRI_DIR=<mount>/dri  ./program
 *
 * What it does (DESIGN.md, "A dma-buf fd from a FUSE server", "Restricted
 * ioctls" and "The real userspace on top"; spec userspace-surface §2.2, §7):
 *  - Paths.  An absolute path the client names is redirected into the node's
 *    mount (the parent of $UALINK_DRI_DIR) by the open family, fopen*,
 *    freopen*, opendir, readlink*, realpath, access*, and the stat family:
 *      /dev/dri, /dev/dri/renderD<N>     → <mount>/dri, <mount>/dri/renderD<N>
 *      /dev/dri/card<N>                  → <mount>/dri/renderD<N+128>
 *      /dev/kfd                          → <mount>/kfd
 *      /sys/dev/char/226:*, /sys/class/drm[/…], /sys/devices/virtual/kfd[/…],
 *      /sys/module/amdgpu[/…]
 *                                        → <mount>/sys/…
 *      /sys/bus/pci/devices/<bdf>[/…], /sys/devices/pci<…>/<bdf>[/…]
 *                                        → <mount>/sys/… when the node has <bdf>
 *    glibc's fopen, opendir and realpath reach the file system through
 *    internal calls, so each has its own wrapper.  realpath answers the path
 *    a real host would show (/sys/…, /dev/dri/…), never the mount's: libdrm
 *    parses it.  When <mount>/sys does not exist (a namespace node, where
 *    UALINK_DRI_DIR=/dev/dri and /sys already is the node's) /sys is left as is.
 *    Relative paths and *at() calls with a directory fd are not redirected.
 *  - Device identity.  The fds opened through those paths are remembered
 *    (with the DRM minor they were opened as); the stat family reports them,
 *    and the /dev/dri/renderD<N> and card<N> paths, as S_IFCHR|0666 with
 *    st_rdev = makedev(226, N) (drmGetNodeTypeFromFd, drmGetDevice2).
 *    readdir of /dev/dri lists card<N-128> beside each renderD<N>, both DT_CHR.
 *  - Tokens.  On those fds a successful UALINK_HANDLE IMPORT,
 *    PRIME_HANDLE_TO_FD or SYNCOBJ_HANDLE_TO_FD returns a *token*; the shim
 *    trades it for the real fd by opening <dmabuf dir>/<token>
 *    ($UALINK_DMABUF_DIR, else <mount>/dmabuf) and writes the fd where the
 *    kernel would have.  If that open fails the ioctl fails with its errno.
 *  - Loaded modules.  /proc/modules, opened for reading, reads as the host's
 *    with amdgpu's line added (rocminfo runs `lsmod | grep amdgpu` first),
 *    and /sys/module/amdgpu[/…] → <mount>/sys/module/amdgpu[/…].
 *  - Everything else passes straight through.  Without UALINK_DRI_DIR, or
 *    with one that is not a ualinkd mount, the shim changes nothing and says
 *    so once on stderr (in a process that looks at /dev or /sys at all).
 *
 * The real functions come from dlsym(RTLD_NEXT) on first use.  A thread that
 * re-enters a wrapper while it is inside dlsym (e.g. through a malloc
 * interposer that opens a file) gets the raw system call instead, so there is
 * no recursion; a wrapper re-entered while the configuration is being read
 * sees the shim off.  No wrapper allocates (realpath(…, NULL) grows glibc's
 * own answer when the host path is longer), and no code here calls a wrapped name
 * directly (it would come back here): it goes through real() or a syscall.
 * The internal interface for other wrapper files is shim.h.
 */
#define _GNU_SOURCE
#include <dirent.h>
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
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <unistd.h>

#include "shim.h"
#include "ualink/ualink_drm.h"

#define SHIM_API __attribute__((visibility("default")))

/* LP64: the 64 variants are the same structs, so one wrapper body serves both. */
_Static_assert(sizeof(struct stat) == sizeof(struct stat64), "struct stat64");
_Static_assert(sizeof(struct dirent) == sizeof(struct dirent64), "struct dirent64");

#define DRM_MAJOR 226
#define RENDER_MINOR_BASE 128
#define FUSE_SUPER_MAGIC 0x65735546

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
typedef int (*stat_fn)(const char *, struct stat *);
typedef int (*fstat_fn)(int, struct stat *);
typedef int (*fstatat_fn)(int, const char *, struct stat *, int);
typedef int (*statx_fn)(int, const char *, int, unsigned int, struct statx *);
typedef FILE *(*fopen_fn)(const char *, const char *);
typedef FILE *(*freopen_fn)(const char *, const char *, FILE *);
typedef DIR *(*opendir_fn)(const char *);
typedef struct dirent64 *(*readdir_fn)(DIR *);
typedef int (*closedir_fn)(DIR *);
typedef void (*rewinddir_fn)(DIR *);
typedef ssize_t (*readlink_fn)(const char *, char *, size_t);
typedef ssize_t (*readlinkat_fn)(int, const char *, char *, size_t);
typedef char *(*realpath_fn)(const char *, char *);
typedef char *(*realpath_chk_fn)(const char *, char *, size_t);
typedef char *(*canonicalize_fn)(const char *);
typedef int (*access_fn)(const char *, int);
typedef int (*faccessat_fn)(int, const char *, int, int);

enum real_id {
	R_OPEN, R_OPEN64, R_OPENAT, R_OPENAT64,
	R_OPEN_2, R_OPEN64_2, R_OPENAT_2, R_OPENAT64_2,
	R_CLOSE, R_CLOSE_RANGE, R_CLOSEFROM, R_IOCTL,
	R_DUP, R_DUP2, R_DUP3, R_FCNTL, R_FCNTL64,
	R_STAT, R_STAT64, R_LSTAT, R_LSTAT64, R_FSTAT, R_FSTAT64,
	R_FSTATAT, R_FSTATAT64, R_STATX,
	R_FOPEN, R_FOPEN64, R_FREOPEN, R_FREOPEN64,
	R_OPENDIR, R_READDIR, R_READDIR64, R_CLOSEDIR, R_REWINDDIR,
	R_READLINK, R_READLINKAT, R_REALPATH, R_REALPATH_CHK, R_CANONICALIZE,
	R_ACCESS, R_FACCESSAT, R_EUIDACCESS, R_EACCESS,
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
	[R_STAT] = "stat", [R_STAT64] = "stat64",
	[R_LSTAT] = "lstat", [R_LSTAT64] = "lstat64",
	[R_FSTAT] = "fstat", [R_FSTAT64] = "fstat64",
	[R_FSTATAT] = "fstatat", [R_FSTATAT64] = "fstatat64", [R_STATX] = "statx",
	[R_FOPEN] = "fopen", [R_FOPEN64] = "fopen64",
	[R_FREOPEN] = "freopen", [R_FREOPEN64] = "freopen64",
	[R_OPENDIR] = "opendir", [R_READDIR] = "readdir",
	[R_READDIR64] = "readdir64", [R_CLOSEDIR] = "closedir",
	[R_REWINDDIR] = "rewinddir",
	[R_READLINK] = "readlink", [R_READLINKAT] = "readlinkat",
	[R_REALPATH] = "realpath", [R_REALPATH_CHK] = "__realpath_chk",
	[R_CANONICALIZE] = "canonicalize_file_name",
	[R_ACCESS] = "access", [R_FACCESSAT] = "faccessat",
	[R_EUIDACCESS] = "euidaccess", [R_EACCESS] = "eaccess",
};

/* NULL: not looked up yet.  A failed lookup stores RESOLVE_FAILED. */
static _Atomic(void *) real_fns[R_COUNT];
static char resolve_failed_marker;
#define RESOLVE_FAILED ((void *)&resolve_failed_marker)

static __thread bool in_dlsym __attribute__((tls_model("initial-exec")));

void *shim_next(_Atomic(void *) *slot, const char *name)
{
	void *fn = atomic_load_explicit(slot, memory_order_acquire);

	if (fn == NULL) {
		if (in_dlsym)
			return NULL;
		in_dlsym = true;
		fn = dlsym(RTLD_NEXT, name);
		in_dlsym = false;
		if (fn == NULL)
			fn = RESOLVE_FAILED;
		/* Racing threads store the same value. */
		atomic_store_explicit(slot, fn, memory_order_release);
	}
	return fn == RESOLVE_FAILED ? NULL : fn;
}

/* The next definition of a symbol, or NULL (caller falls back to the raw
 * system call) if there is none or we are already inside dlsym. */
static void *real(enum real_id id)
{
	return shim_next(&real_fns[id], real_names[id]);
}

/* ---- configuration (read once) --------------------------------------------- */

static pthread_once_t config_once = PTHREAD_ONCE_INIT;
static bool is_active;
static char dri_dir[PATH_MAX];		/* canonical <mount>/dri */
static char dmabuf_dir[PATH_MAX];
static char sys_dir[PATH_MAX];		/* "<mount>/sys", or "" for the system's /sys */
static char kfd_path[PATH_MAX];

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

static int raw_stat(const char *path, struct stat *st)
{
	return (int)syscall(SYS_newfstatat, AT_FDCWD, path, st, 0);
}

/* Why dir is not a ualinkd mount's dri/, or NULL if it is one: a directory on
 * a FUSE file system holding the first accel's render node as a regular file
 * (a real /dev/dri holds character devices; the node's renderD128 always
 * exists, DESIGN.md "The mount of one node"). */
static const char *not_a_mount(const char *dir)
{
	char path[PATH_MAX];
	struct statfs fs;
	struct stat st;

	if (raw_stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
		return "not a directory";
	if (syscall(SYS_statfs, dir, &fs) != 0 || fs.f_type != FUSE_SUPER_MAGIC)
		return "not a FUSE mount";
	if (snprintf(path, sizeof(path), "%s/renderD%d", dir, RENDER_MINOR_BASE) >=
		    (int)sizeof(path) ||
	    raw_stat(path, &st) != 0 || !S_ISREG(st.st_mode))
		return "no ualinkd renderD128 in it";
	return NULL;
}

/* Said once (config_init runs once), with write(2): stdio may not be ready.
 * dir NULL: UALINK_DRI_DIR is not set (preloaded without it, the shim would
 * otherwise be off without a word and the program fail on /dev/dri). */
static void say_off(const char *dir, const char *why)
{
	char msg[PATH_MAX + 160];
	int n = dir ? snprintf(msg, sizeof(msg),
			       "libualink_shim: UALINK_DRI_DIR=%s is not a ualinkd mount (%s); "
			       "the shim is off and /dev/dri is the system's\n", dir, why)
		    : snprintf(msg, sizeof(msg),
			       "libualink_shim: UALINK_DRI_DIR is not set; the shim is off and "
			       "/dev/dri is the system's (ualinkd run NODE -- PROG sets it)\n");

	if (n > 0)
		(void)!syscall(SYS_write, 2, msg,
			       (size_t)n < sizeof(msg) ? (size_t)n : sizeof(msg) - 1);
}

static void config_init(void)
{
	const char *dri = getenv("UALINK_DRI_DIR");
	const char *dmabuf = getenv("UALINK_DMABUF_DIR");
	realpath_fn canon = (realpath_fn)real(R_REALPATH);
	char mount[PATH_MAX];
	const char *why;
	struct stat st;
	char *slash;

	if (!dri || !*dri) {
		say_off(NULL, NULL);
		return;
	}
	if (!canon || !canon(dri, dri_dir)) {
		say_off(dri, strerror(errno));
		return;
	}
	why = not_a_mount(dri_dir);
	if (why) {
		say_off(dri, why);
		return;
	}
	memcpy(mount, dri_dir, sizeof(mount));
	slash = strrchr(mount, '/');
	if (slash == mount)
		slash++;	/* <mount> is "/" */
	*slash = '\0';
	if (dmabuf && *dmabuf) {
		if (!absolute_path(dmabuf_dir, sizeof(dmabuf_dir), dmabuf))
			return;
	} else if (snprintf(dmabuf_dir, sizeof(dmabuf_dir), "%s/dmabuf",
			    strcmp(mount, "/") ? mount : "") >= (int)sizeof(dmabuf_dir)) {
		return;
	}
	if (snprintf(sys_dir, sizeof(sys_dir), "%s/sys", strcmp(mount, "/") ? mount : "") >=
		    (int)sizeof(sys_dir) ||
	    strcmp(sys_dir, "/sys") == 0 || raw_stat(sys_dir, &st) != 0 ||
	    !S_ISDIR(st.st_mode))
		sys_dir[0] = '\0';
	if (snprintf(kfd_path, sizeof(kfd_path), "%s/kfd", strcmp(mount, "/") ? mount : "") >=
	    (int)sizeof(kfd_path))
		return;
	is_active = true;
}

/* Set while this thread reads the configuration: a wrapper it re-enters (a
 * malloc interposer reading /sys/kernel/mm/... from inside dlsym or realpath)
 * sees the shim off instead of waiting on its own pthread_once. */
static __thread bool in_config __attribute__((tls_model("initial-exec")));

static void config_init_guarded(void)
{
	in_config = true;
	config_init();
	in_config = false;
}

bool shim_active(void)
{
	if (in_config)
		return false;
	pthread_once(&config_once, config_init_guarded);
	return is_active;
}

const char *shim_dri_dir(void)
{
	return dri_dir;
}

const char *shim_dmabuf_dir(void)
{
	return dmabuf_dir;
}

/* ---- the fd table: the DRM minor each render-node fd was opened as --------- */

/* fs.nr_open's default ceiling.  2 MiB of bss, touched only where used: an
 * entry is minor + 1, 0 for any fd that is not a render node. */
#define FD_LIMIT (1u << 20)
static _Atomic uint16_t fd_nodes[FD_LIMIT];
/* One past the highest fd ever tracked: close_range/closefrom sweep no more. */
static atomic_uint fd_high;

int shim_fd_minor(int fd)
{
	if (fd < 0 || (unsigned)fd >= FD_LIMIT)
		return -1;
	return (int)atomic_load_explicit(&fd_nodes[fd], memory_order_relaxed) - 1;
}

/* minor -1: the fd is not (or no longer) a render node. */
static void fd_track(int fd, int minor)
{
	unsigned high;

	if (fd < 0 || (unsigned)fd >= FD_LIMIT)
		return;
	if (minor >= 0) {
		high = atomic_load_explicit(&fd_high, memory_order_relaxed);
		while (high <= (unsigned)fd &&
		       !atomic_compare_exchange_weak(&fd_high, &high, (unsigned)fd + 1))
			;
	}
	atomic_store_explicit(&fd_nodes[fd], (uint16_t)(minor + 1), memory_order_relaxed);
}

static void fd_clear_range(unsigned first, unsigned last)
{
	unsigned high = atomic_load_explicit(&fd_high, memory_order_relaxed);
	unsigned fd;

	if (last >= high)
		last = high - 1;	/* high 0: the loop below does not run */
	for (fd = first; high && fd <= last; fd++)
		if (atomic_load_explicit(&fd_nodes[fd], memory_order_relaxed))
			atomic_store_explicit(&fd_nodes[fd], 0, memory_order_relaxed);
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

/* path is dir itself or below it ("/sys/class/drm" covers ".../drm/x", not
 * ".../drmx"); *rest is what follows dir. */
static bool under(const char *path, const char *dir, const char **rest)
{
	size_t n = strlen(dir);

	if (strncmp(path, dir, n) != 0 || (path[n] != '\0' && path[n] != '/'))
		return false;
	if (rest)
		*rest = path + n;
	return true;
}

/* What a redirected path is: the answer to stat and realpath depends on it. */
enum target_kind { T_NONE, T_NODE, T_DRI_DIR, T_KFD, T_SYS };
struct target {
	enum target_kind kind;
	int minor;		/* T_NODE: the DRM minor the path names */
};

static const char *join(char *buf, size_t size, const char *dir, const char *rest)
{
	int n = snprintf(buf, size, "%s%s", dir, rest);

	return n < 0 || (size_t)n >= size ? NULL : buf;
}

/* The PCI device directories the node serves (l1b's tree): redirected when
 * the node has the directory rest names up to the end of the component that
 * starts at comp (the <bdf>); another device of that name is the host's. */
static const char *sys_pci(const char *rest, const char *comp, char *buf, size_t size)
{
	const char *end = strchrnul(comp, '/');
	char probe[PATH_MAX];
	int n;

	if (end == comp)
		return NULL;
	n = snprintf(probe, sizeof(probe), "%s%.*s", sys_dir, (int)(end - rest), rest);
	if (n < 0 || (size_t)n >= sizeof(probe) ||
	    syscall(SYS_faccessat, AT_FDCWD, probe, F_OK) != 0)
		return NULL;
	return join(buf, size, sys_dir, rest);
}

static const char *redirect_sys(const char *path, char *buf, size_t size)
{
	const char *rest = path + 4;	/* "/dev/char/…" of "/sys/dev/char/…" */
	const char *bdf;

	if (!sys_dir[0])
		return NULL;
	if (strncmp(rest, "/dev/char/226:", 14) == 0 || under(rest, "/class/drm", NULL) ||
	    under(rest, "/devices/virtual/kfd", NULL) || under(rest, "/class/kfd", NULL) ||
	    under(rest, "/module/amdgpu", NULL))
		return join(buf, size, sys_dir, rest);
	if (strncmp(rest, "/bus/pci/devices/", 17) == 0)
		return sys_pci(rest, rest + 17, buf, size);
	if (strncmp(rest, "/devices/pci", 12) == 0) {
		/* /devices/pci<domain:bus>/<bdf>: never the root bus alone. */
		bdf = strchr(rest + 12, '/');
		return bdf ? sys_pci(rest, bdf + 1, buf, size) : NULL;
	}
	return NULL;
}

/* If path names something of the node, write where it lives into buf and
 * return buf (t says what it is); else return path unchanged (T_NONE). */
static const char *redirect(const char *path, char *buf, size_t size, struct target *t)
{
	const char *leaf, *out = NULL;
	unsigned long n;

	t->kind = T_NONE;
	t->minor = -1;
	if (!path || path[0] != '/' ||
	    (strncmp(path, "/dev/", 5) != 0 && strncmp(path, "/sys/", 5) != 0) ||
	    !shim_active())
		return path;
	if (path[1] == 's') {
		out = redirect_sys(path, buf, size);
		if (out)
			t->kind = T_SYS;
	} else if (strcmp(path, "/dev/kfd") == 0) {
		out = join(buf, size, kfd_path, "");
		t->kind = T_KFD;
	} else if (strcmp(path, "/dev/dri") == 0 || strcmp(path, "/dev/dri/") == 0) {
		out = join(buf, size, dri_dir, "");
		t->kind = T_DRI_DIR;
	} else if (strncmp(path, "/dev/dri/", 9) == 0) {
		leaf = path + 9;
		if (strncmp(leaf, "renderD", 7) == 0 && parse_index(leaf + 7, 0xfffe, &n)) {
			t->minor = (int)n;
		} else if (strncmp(leaf, "card", 4) == 0 &&
			   parse_index(leaf + 4, 0xfffe - RENDER_MINOR_BASE, &n)) {
			t->minor = (int)n;
			n += RENDER_MINOR_BASE;
		} else {
			return path;
		}
		if (snprintf(buf, size, "%s/renderD%lu", dri_dir, n) < (int)size) {
			out = buf;
			t->kind = T_NODE;
		}
	}
	if (!out) {
		t->kind = T_NONE;
		t->minor = -1;
		return path;
	}
	return out;
}

/* After an open: remember the fd if it is a render node, forget any stale
 * entry otherwise. */
static int track_open(int fd, const struct target *t)
{
	int saved = errno;

	if (fd >= 0) {
		if (t->kind == T_NODE && (unsigned)fd >= FD_LIMIT) {
			/* Cannot track it; an untracked render node would hand
			 * out tokens as fds.  Refuse rather than mislead. */
			syscall(SYS_close, fd);
			errno = EMFILE;
			return -1;
		}
		fd_track(fd, t->kind == T_NODE ? t->minor : -1);
	}
	errno = saved;
	return fd;
}

/* ---- /proc/modules: a host with amdgpu loaded ------------------------------------ */

/* rocminfo's first check is `lsmod | grep amdgpu` (ROCk loaded?), and kmod's
 * lsmod reads /proc/modules (libkmod kmod_module_new_from_loaded); lsmod is a
 * child of the client, with LD_PRELOAD and UALINK_DRI_DIR inherited.  When the
 * shim is on, /proc/modules reads as the host's with amdgpu's line added, as
 * on a host where the driver is loaded: the line in the kernel's format
 * (kernel/module/procfs.c m_show(): name, size, refcount, users, state,
 * address; the address reads 0 to whoever lacks CAP_SYSLOG).  A host that
 * lists amdgpu already, or an open for writing, is passed through. */
#define PROC_MODULES "/proc/modules"

/* One number from the node's sys/module/amdgpu/<attr> (sysfs.module_sysfs),
 * or "0" when it has none. */
static void module_attr(const char *attr, char *out, size_t size)
{
	char path[PATH_MAX];
	ssize_t n = -1;
	int fd;

	if (snprintf(path, sizeof(path), "%s/module/amdgpu/%s", sys_dir[0] ? sys_dir : "/sys",
		     attr) < (int)sizeof(path) &&
	    (fd = (int)syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC)) >= 0) {
		n = syscall(SYS_read, fd, out, size - 1);
		syscall(SYS_close, fd);
	}
	if (n <= 0)
		n = snprintf(out, size, "0");
	out[n] = '\0';
	out[strspn(out, "0123456789")] = '\0';
	if (!out[0])
		snprintf(out, size, "0");
}

static bool write_all(int fd, const char *buf, size_t n)
{
	while (n) {
		ssize_t w = syscall(SYS_write, fd, buf, n);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return false;
		buf += w;
		n -= (size_t)w;
	}
	return true;
}

/* A read-only fd that reads as /proc/modules with amdgpu in it (errno set and
 * -1 when it cannot be made), or -2: pass the open through (not ours to
 * answer, or the host lists amdgpu itself). */
static int modules_fd(const char *path, int flags)
{
	static const char name[] = "amdgpu ";
	char buf[4096], self[64], line[128], size[24], refcnt[24];
	size_t at_line = 0;	/* chars of `name` matched at the current line's start */
	bool start = true, host_has = false;
	int host, mem, ro, saved;
	ssize_t n, i;

	if (!path || strcmp(path, PROC_MODULES) != 0 || (flags & O_ACCMODE) != O_RDONLY ||
	    (flags & (O_DIRECTORY | O_CREAT | O_TRUNC)) || !shim_active())
		return -2;
	mem = (int)syscall(SYS_memfd_create, "modules", MFD_CLOEXEC);
	if (mem < 0)
		return -1;
	host = (int)syscall(SYS_openat, AT_FDCWD, PROC_MODULES, O_RDONLY | O_CLOEXEC);
	while (host >= 0 && (n = syscall(SYS_read, host, buf, sizeof(buf))) != 0) {
		if (n < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		for (i = 0; i < n && !host_has; i++) {
			if (start && buf[i] == name[at_line]) {
				if (++at_line == sizeof(name) - 1)
					host_has = true;
			} else {
				start = buf[i] == '\n';
				at_line = 0;
			}
		}
		if (host_has || !write_all(mem, buf, (size_t)n))
			break;
	}
	if (host >= 0)
		syscall(SYS_close, host);
	if (!host_has) {
		module_attr("coresize", size, sizeof(size));
		module_attr("refcnt", refcnt, sizeof(refcnt));
		n = snprintf(line, sizeof(line), "amdgpu %s %s - Live 0x0000000000000000\n",
			     size, refcnt);
	}
	if (host_has || !write_all(mem, line, (size_t)n)) {
		saved = errno;
		syscall(SYS_close, mem);
		errno = saved;
		return host_has ? -2 : -1;
	}
	/* Read-only as the real file: the memfd opened again through /proc, with
	 * the caller's flags (O_CLOEXEC, O_NONBLOCK). */
	snprintf(self, sizeof(self), "/proc/self/fd/%d", mem);
	ro = (int)syscall(SYS_openat, AT_FDCWD, self, flags & ~(O_NOFOLLOW | O_NOCTTY));
	if (ro < 0) {	/* no /proc/self: the memfd itself, at offset 0 */
		syscall(SYS_lseek, mem, 0, SEEK_SET);
		if (!(flags & O_CLOEXEC))
			syscall(SYS_fcntl, mem, F_SETFD, 0);
		return mem;
	}
	syscall(SYS_close, mem);
	return ro;
}

/* The mode argument is there only for O_CREAT and O_TMPFILE. */
#define NEEDS_MODE(flags) \
	(((flags) & O_CREAT) != 0 || ((flags) & O_TMPFILE) == O_TMPFILE)

static int do_openat(enum real_id id, int dirfd, const char *path, int flags,
		     mode_t mode)
{
	char buf[PATH_MAX];
	struct target t;
	const char *target;
	int fd = dirfd == AT_FDCWD || (path && path[0] == '/') ? modules_fd(path, flags) : -2;

	if (fd != -2)
		return fd;
	target = redirect(path, buf, sizeof(buf), &t);
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
	return track_open(fd, &t);
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

/* fopen and freopen open through glibc's internal __open: a wrapper each.
 * No raw fallback exists for them; inside dlsym they fail with ENOSYS. */
static FILE *do_fopen(enum real_id id, const char *path, const char *mode, FILE *stream)
{
	char buf[PATH_MAX];
	struct target t;
	const char *target = redirect(path, buf, sizeof(buf), &t);
	void *fn = real(id);
	FILE *f;

	if (!fn) {
		errno = ENOSYS;
		return NULL;
	}
	if (id != R_FREOPEN && id != R_FREOPEN64 && mode && mode[0] == 'r' &&
	    !strchr(mode, '+')) {
		int fd = modules_fd(path, O_RDONLY | (strchr(mode, 'e') ? O_CLOEXEC : 0));

		if (fd == -1)
			return NULL;
		if (fd >= 0) {
			f = fdopen(fd, mode);
			if (!f) {
				int saved = errno;

				syscall(SYS_close, fd);
				errno = saved;
			}
			return f;
		}
	}
	if (id == R_FREOPEN || id == R_FREOPEN64)
		f = ((freopen_fn)fn)(path ? target : NULL, mode, stream);
	else
		f = ((fopen_fn)fn)(target, mode);
	if (f)
		track_open(fileno(f), &t);
	return f;
}

SHIM_API FILE *fopen(const char *path, const char *mode)
{
	return do_fopen(R_FOPEN, path, mode, NULL);
}

SHIM_API FILE *fopen64(const char *path, const char *mode)
{
	return do_fopen(R_FOPEN64, path, mode, NULL);
}

SHIM_API FILE *freopen(const char *path, const char *mode, FILE *stream)
{
	return do_fopen(R_FREOPEN, path, mode, stream);
}

SHIM_API FILE *freopen64(const char *path, const char *mode, FILE *stream)
{
	return do_fopen(R_FREOPEN64, path, mode, stream);
}

/* ---- the stat family: a character device 226:N ------------------------------- */

/* What stat(2) says of a real DRM minor (only the type, mode and rdev matter
 * to libdrm; the size of a character device is 0). */
static void chr_identity(struct stat *st, int minor)
{
	st->st_mode = S_IFCHR | 0666;
	st->st_rdev = makedev(DRM_MAJOR, (unsigned)minor);
	st->st_size = 0;
}

static int identity(int ret, struct stat *st, int minor)
{
	if (ret == 0 && minor >= 0)
		chr_identity(st, minor);
	return ret;
}

/* The fd itself, not a path: "" (or NULL, kernels >= 6.11) with AT_EMPTY_PATH. */
static bool fd_itself(const char *path, int flags)
{
	return (!path || path[0] == '\0') && (flags & AT_EMPTY_PATH);
}

static int raw_fstatat(int dirfd, const char *path, struct stat *st, int flags)
{
	return (int)syscall(SYS_newfstatat, dirfd, path, st, flags);
}

/* fstatat(dirfd, path, …) with glibc's rules: an empty path with
 * AT_EMPTY_PATH is the fd itself. */
static int do_fstatat(enum real_id id, int dirfd, const char *path, struct stat *st,
		      int flags)
{
	char buf[PATH_MAX];
	struct target t;
	const char *target;
	fstatat_fn fn = (fstatat_fn)real(id);
	int ret, minor;

	if (fd_itself(path, flags)) {
		ret = fn ? fn(dirfd, path, st, flags) : raw_fstatat(dirfd, path, st, flags);
		return identity(ret, st, shim_fd_minor(dirfd));
	}
	target = redirect(path, buf, sizeof(buf), &t);
	ret = fn ? fn(dirfd, target, st, flags) : raw_fstatat(dirfd, target, st, flags);
	minor = t.kind == T_NODE ? t.minor : -1;
	return identity(ret, st, minor);
}

static int do_stat(enum real_id id, const char *path, struct stat *st)
{
	char buf[PATH_MAX];
	struct target t;
	const char *target = redirect(path, buf, sizeof(buf), &t);
	stat_fn fn = (stat_fn)real(id);
	bool nofollow = id == R_LSTAT || id == R_LSTAT64;
	int ret;

	ret = fn ? fn(target, st)
		 : raw_fstatat(AT_FDCWD, target, st, nofollow ? AT_SYMLINK_NOFOLLOW : 0);
	return identity(ret, st, t.kind == T_NODE ? t.minor : -1);
}

static int do_fstat(enum real_id id, int fd, struct stat *st)
{
	fstat_fn fn = (fstat_fn)real(id);
	int ret = fn ? fn(fd, st) : raw_fstatat(fd, "", st, AT_EMPTY_PATH);

	return identity(ret, st, shim_fd_minor(fd));
}

SHIM_API int stat(const char *path, struct stat *st)
{
	return do_stat(R_STAT, path, st);
}

SHIM_API int stat64(const char *path, struct stat64 *st)
{
	return do_stat(R_STAT64, path, (struct stat *)st);
}

SHIM_API int lstat(const char *path, struct stat *st)
{
	return do_stat(R_LSTAT, path, st);
}

SHIM_API int lstat64(const char *path, struct stat64 *st)
{
	return do_stat(R_LSTAT64, path, (struct stat *)st);
}

SHIM_API int fstat(int fd, struct stat *st)
{
	return do_fstat(R_FSTAT, fd, st);
}

SHIM_API int fstat64(int fd, struct stat64 *st)
{
	return do_fstat(R_FSTAT64, fd, (struct stat *)st);
}

SHIM_API int fstatat(int dirfd, const char *path, struct stat *st, int flags)
{
	return do_fstatat(R_FSTATAT, dirfd, path, st, flags);
}

SHIM_API int fstatat64(int dirfd, const char *path, struct stat64 *st, int flags)
{
	return do_fstatat(R_FSTATAT64, dirfd, path, (struct stat *)st, flags);
}

/* Binaries linked against glibc < 2.33 call these (versioned compat symbols,
 * which dlsym cannot find); the version argument is checked as glibc does on
 * 64-bit kABIs (x86_64: _STAT_VER_KERNEL 0 or _STAT_VER_LINUX 1; else 0). */
static bool stat_ver_ok(int ver)
{
#if defined(__x86_64__)
	if (ver == 0 || ver == 1)
		return true;
#else
	if (ver == 0)
		return true;
#endif
	errno = EINVAL;
	return false;
}

int __xstat(int ver, const char *path, struct stat *st);
int __xstat64(int ver, const char *path, struct stat64 *st);
int __lxstat(int ver, const char *path, struct stat *st);
int __lxstat64(int ver, const char *path, struct stat64 *st);
int __fxstat(int ver, int fd, struct stat *st);
int __fxstat64(int ver, int fd, struct stat64 *st);
int __fxstatat(int ver, int dirfd, const char *path, struct stat *st, int flags);
int __fxstatat64(int ver, int dirfd, const char *path, struct stat64 *st, int flags);

SHIM_API int __xstat(int ver, const char *path, struct stat *st)
{
	return stat_ver_ok(ver) ? do_fstatat(R_FSTATAT64, AT_FDCWD, path, st, 0) : -1;
}

SHIM_API int __xstat64(int ver, const char *path, struct stat64 *st)
{
	return __xstat(ver, path, (struct stat *)st);
}

SHIM_API int __lxstat(int ver, const char *path, struct stat *st)
{
	return stat_ver_ok(ver) ? do_fstatat(R_FSTATAT64, AT_FDCWD, path, st,
					     AT_SYMLINK_NOFOLLOW) : -1;
}

SHIM_API int __lxstat64(int ver, const char *path, struct stat64 *st)
{
	return __lxstat(ver, path, (struct stat *)st);
}

SHIM_API int __fxstat(int ver, int fd, struct stat *st)
{
	return stat_ver_ok(ver) ? do_fstat(R_FSTAT64, fd, st) : -1;
}

SHIM_API int __fxstat64(int ver, int fd, struct stat64 *st)
{
	return __fxstat(ver, fd, (struct stat *)st);
}

SHIM_API int __fxstatat(int ver, int dirfd, const char *path, struct stat *st, int flags)
{
	return stat_ver_ok(ver) ? do_fstatat(R_FSTATAT64, dirfd, path, st, flags) : -1;
}

SHIM_API int __fxstatat64(int ver, int dirfd, const char *path, struct stat64 *st,
			  int flags)
{
	return __fxstatat(ver, dirfd, path, (struct stat *)st, flags);
}

SHIM_API int statx(int dirfd, const char *path, int flags, unsigned int mask,
		   struct statx *stx)
{
	char buf[PATH_MAX];
	struct target t = { T_NONE, -1 };
	const char *target = path;
	statx_fn fn = (statx_fn)real(R_STATX);
	int ret, minor;

	if (fd_itself(path, flags))
		minor = shim_fd_minor(dirfd);
	else {
		target = redirect(path, buf, sizeof(buf), &t);
		minor = t.kind == T_NODE ? t.minor : -1;
	}
	ret = fn ? fn(dirfd, target, flags, mask, stx)
		 : (int)syscall(SYS_statx, dirfd, target, flags, mask, stx);
	if (ret == 0 && minor >= 0) {
		stx->stx_mode = S_IFCHR | 0666;
		stx->stx_rdev_major = DRM_MAJOR;
		stx->stx_rdev_minor = (unsigned)minor;
		stx->stx_size = 0;
	}
	return ret;
}

/* ---- access, readlink, realpath --------------------------------------------- */

static int do_access(enum real_id id, const char *path, int mode)
{
	char buf[PATH_MAX];
	struct target t;
	const char *target = redirect(path, buf, sizeof(buf), &t);
	access_fn fn = (access_fn)real(id);
	int flags = id == R_ACCESS ? 0 : AT_EACCESS;

	return fn ? fn(target, mode)
		  : (int)syscall(SYS_faccessat2, AT_FDCWD, target, mode, flags);
}

SHIM_API int access(const char *path, int mode)
{
	return do_access(R_ACCESS, path, mode);
}

SHIM_API int euidaccess(const char *path, int mode)
{
	return do_access(R_EUIDACCESS, path, mode);
}

SHIM_API int eaccess(const char *path, int mode)
{
	return do_access(R_EACCESS, path, mode);
}

SHIM_API int faccessat(int dirfd, const char *path, int mode, int flags)
{
	char buf[PATH_MAX];
	struct target t;
	const char *target = redirect(path, buf, sizeof(buf), &t);
	faccessat_fn fn = (faccessat_fn)real(R_FACCESSAT);

	return fn ? fn(dirfd, target, mode, flags)
		  : (int)syscall(SYS_faccessat2, dirfd, target, mode, flags);
}

/* A link's text is passed on as it is: the node's sysfs links are relative,
 * as the kernel's are, and libdrm reads only their last component. */
SHIM_API ssize_t readlink(const char *path, char *out, size_t size)
{
	char buf[PATH_MAX];
	struct target t;
	const char *target = redirect(path, buf, sizeof(buf), &t);
	readlink_fn fn = (readlink_fn)real(R_READLINK);

	return fn ? fn(target, out, size)
		  : (ssize_t)syscall(SYS_readlinkat, AT_FDCWD, target, out, size);
}

SHIM_API ssize_t readlinkat(int dirfd, const char *path, char *out, size_t size)
{
	char buf[PATH_MAX];
	struct target t;
	const char *target = redirect(path, buf, sizeof(buf), &t);
	readlinkat_fn fn = (readlinkat_fn)real(R_READLINKAT);

	return fn ? fn(dirfd, target, out, size)
		  : (ssize_t)syscall(SYS_readlinkat, dirfd, target, out, size);
}

/* The host path for resolved, the canonical path of a redirected one, written
 * into resolved (which has room for PATH_MAX, or was malloc'd by realpath:
 * then grown if the answer is longer).  Returns the answer, or NULL (ENOMEM). */
static char *host_path(char *resolved, bool malloced, const char *path,
		       const struct target *t)
{
	char out[PATH_MAX];
	const char *rest;
	size_t n;

	switch (t->kind) {
	case T_NODE:		/* the name asked for: card0 is not renderD128 */
		n = (size_t)snprintf(out, sizeof(out), "%s", path);
		break;
	case T_DRI_DIR:
		n = (size_t)snprintf(out, sizeof(out), "/dev/dri");
		break;
	case T_KFD:
		n = (size_t)snprintf(out, sizeof(out), "/dev/kfd");
		break;
	case T_SYS:
		/* A link that leads out of the node's tree is answered as it is. */
		if (!under(resolved, sys_dir, &rest))
			return resolved;
		n = (size_t)snprintf(out, sizeof(out), "/sys%s", rest);
		break;
	default:
		return resolved;
	}
	if (n >= sizeof(out)) {
		errno = ENAMETOOLONG;
		return NULL;
	}
	if (malloced && n > strlen(resolved)) {
		char *grown = realloc(resolved, n + 1);

		if (!grown) {
			free(resolved);
			errno = ENOMEM;
			return NULL;
		}
		resolved = grown;
	}
	memcpy(resolved, out, n + 1);
	return resolved;
}

SHIM_API char *realpath(const char *path, char *resolved)
{
	char buf[PATH_MAX];
	struct target t;
	const char *target = redirect(path, buf, sizeof(buf), &t);
	realpath_fn fn = (realpath_fn)real(R_REALPATH);
	char *r;

	if (!fn) {
		errno = ENOSYS;
		return NULL;
	}
	r = fn(target, resolved);
	return r && t.kind != T_NONE ? host_path(r, resolved == NULL, path, &t) : r;
}

/* The fortified realpath (libdrm's get_pci_path is built with it). */
char *__realpath_chk(const char *path, char *resolved, size_t resolvedlen);
SHIM_API char *__realpath_chk(const char *path, char *resolved, size_t resolvedlen)
{
	char buf[PATH_MAX];
	struct target t;
	const char *target = redirect(path, buf, sizeof(buf), &t);
	realpath_chk_fn fn = (realpath_chk_fn)real(R_REALPATH_CHK);
	char *r;

	if (!fn) {
		errno = ENOSYS;
		return NULL;
	}
	r = fn(target, resolved, resolvedlen);	/* aborts if resolvedlen < PATH_MAX */
	return r && t.kind != T_NONE ? host_path(r, false, path, &t) : r;
}

SHIM_API char *canonicalize_file_name(const char *path)
{
	char buf[PATH_MAX];
	struct target t;
	const char *target = redirect(path, buf, sizeof(buf), &t);
	canonicalize_fn fn = (canonicalize_fn)real(R_CANONICALIZE);
	char *r;

	if (!fn) {
		errno = ENOSYS;
		return NULL;
	}
	r = fn(target);
	return r && t.kind != T_NONE ? host_path(r, true, path, &t) : r;
}

/* ---- /dev/dri listings --------------------------------------------------------- */

/* An opendir("/dev/dri") is remembered here: its readdir gives the node's
 * entries as they are (renderD* and card* as DT_CHR), then, after a rewind,
 * card<N-128> for each renderD<N> the directory did not list itself, as a real
 * /dev/dri lists both (drmGetDevices2 folds them into one device by PCI
 * address).  More than DRI_LISTINGS at once are listed as they are. */
#define DRI_LISTINGS 8
#define LISTED_CARDS 256
static struct dri_listing {
	_Atomic(DIR *) dir;
	bool cards;		/* the second pass: card entries */
	uint64_t listed[LISTED_CARDS / 64];	/* card<n> the directory has */
	struct dirent64 card;
} dri_listings[DRI_LISTINGS];
static atomic_int dri_listings_open;

static struct dri_listing *listing_of(DIR *dir)
{
	int i;

	if (!dir || atomic_load_explicit(&dri_listings_open, memory_order_relaxed) == 0)
		return NULL;
	for (i = 0; i < DRI_LISTINGS; i++)
		if (atomic_load(&dri_listings[i].dir) == dir)
			return &dri_listings[i];
	return NULL;
}

SHIM_API DIR *opendir(const char *path)
{
	char buf[PATH_MAX];
	struct target t;
	const char *target = redirect(path, buf, sizeof(buf), &t);
	opendir_fn fn = (opendir_fn)real(R_OPENDIR);
	DIR *dir;
	int i;

	if (!fn) {
		errno = ENOSYS;
		return NULL;
	}
	dir = fn(target);
	if (dir && t.kind == T_DRI_DIR) {
		for (i = 0; i < DRI_LISTINGS; i++) {
			DIR *expected = NULL;

			if (atomic_compare_exchange_strong(&dri_listings[i].dir, &expected, dir)) {
				dri_listings[i].cards = false;
				memset(dri_listings[i].listed, 0, sizeof(dri_listings[i].listed));
				atomic_fetch_add(&dri_listings_open, 1);
				break;
			}
		}
	}
	return dir;
}

/* renderD<N> with N >= 128: N, else -1. */
static int render_minor(const char *name)
{
	unsigned long n;

	if (strncmp(name, "renderD", 7) != 0 || !parse_index(name + 7, 0xfffe, &n) ||
	    n < RENDER_MINOR_BASE)
		return -1;
	return (int)n;
}

/* card<N>: N, else -1. */
static int card_minor(const char *name)
{
	unsigned long n;

	if (strncmp(name, "card", 4) != 0 || !parse_index(name + 4, 0xfffe, &n))
		return -1;
	return (int)n;
}

static struct dirent64 *do_readdir(enum real_id id, DIR *dir)
{
	readdir_fn fn = (readdir_fn)real(id);
	rewinddir_fn rewind_fn;
	struct dri_listing *l;
	struct dirent64 *e;
	int minor;

	if (!fn) {
		errno = ENOSYS;
		return NULL;
	}
	l = listing_of(dir);
	if (!l)
		return fn(dir);
	while (!l->cards) {
		e = fn(dir);
		if (e) {
			minor = card_minor(e->d_name);
			if (minor >= 0 && minor < LISTED_CARDS)
				l->listed[minor / 64] |= (uint64_t)1 << (minor % 64);
			if (minor >= 0 || render_minor(e->d_name) >= 0)
				e->d_type = DT_CHR;
			return e;
		}
		rewind_fn = (rewinddir_fn)real(R_REWINDDIR);
		if (!rewind_fn)
			return NULL;
		rewind_fn(dir);
		l->cards = true;
	}
	while ((e = fn(dir))) {
		minor = render_minor(e->d_name) - RENDER_MINOR_BASE;	/* the card's */
		if (minor < 0 || (minor < LISTED_CARDS &&
				  (l->listed[minor / 64] >> (minor % 64) & 1)))
			continue;
		memset(&l->card, 0, sizeof(l->card));
		l->card.d_ino = e->d_ino;
		l->card.d_off = e->d_off;
		l->card.d_reclen = sizeof(l->card);
		l->card.d_type = DT_CHR;
		snprintf(l->card.d_name, sizeof(l->card.d_name), "card%d", minor);
		return &l->card;
	}
	return NULL;
}

SHIM_API struct dirent *readdir(DIR *dir)
{
	return (struct dirent *)do_readdir(R_READDIR, dir);
}

SHIM_API struct dirent64 *readdir64(DIR *dir)
{
	return do_readdir(R_READDIR64, dir);
}

SHIM_API void rewinddir(DIR *dir)
{
	rewinddir_fn fn = (rewinddir_fn)real(R_REWINDDIR);
	struct dri_listing *l = listing_of(dir);

	if (l)
		l->cards = false;
	if (fn)
		fn(dir);
}

SHIM_API int closedir(DIR *dir)
{
	closedir_fn fn = (closedir_fn)real(R_CLOSEDIR);
	struct dri_listing *l = listing_of(dir);

	/* Forgotten before the DIR is freed: a later opendir may reuse it. */
	if (l) {
		atomic_store(&l->dir, NULL);
		atomic_fetch_sub(&dri_listings_open, 1);
	}
	if (!fn) {
		errno = ENOSYS;
		return -1;
	}
	return fn(dir);
}

/* ---- close and dup ------------------------------------------------------------ */

/* The entry goes before the fd does: once closed, the number can be reused by
 * another thread's open, whose entry we must not wipe. */
SHIM_API int close(int fd)
{
	close_fn fn = (close_fn)real(R_CLOSE);

	fd_track(fd, -1);
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

/* newfd refers to oldfd's open file: same DrmFile, same minor. */
static int track_dup(int oldfd, int newfd)
{
	if (newfd >= 0) {
		int saved = errno;

		fd_track(newfd, shim_fd_minor(oldfd));
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
		ret = syscall(SYS_fcntl, oldfd, F_GETFD) < 0 ? -1 : newfd;
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

/* Trade a token for the real fd (single-use, same uid). */
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
		fd_track(fd, -1);	/* a dma-buf or syncobj, not a render node */
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

/* KFD EXPORT_DMABUF on the node's kfd (include/ualink/ualink_kfd.h): the fd it returns is a
 * token, traded for the real fd as PRIME's is.  Whether `fd` is the node's kfd is asked of
 * /proc only for this one request. */
struct shim_kfd_export_dmabuf {
	__u64 handle;
	__u32 flags;
	__u32 dmabuf_fd;
};
#define SHIM_KFD_EXPORT_DMABUF _IOWR('K', 0x24, struct shim_kfd_export_dmabuf)

static bool fd_is_kfd(int fd)
{
	char link[32], target[PATH_MAX];
	ssize_t n;

	if (!kfd_path[0])
		return false;
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	n = (ssize_t)syscall(SYS_readlinkat, AT_FDCWD, link, target, sizeof(target) - 1);
	if (n <= 0)
		return false;
	target[n] = 0;
	return strcmp(target, kfd_path) == 0;
}

static int kfd_export_dmabuf(int fd, unsigned long request, void *arg)
{
	struct shim_kfd_export_dmabuf *a = arg;
	int ret = real_ioctl(fd, request, arg), dmabuf;

	if (ret != 0)
		return ret;
	dmabuf = open_token(a->dmabuf_fd, O_RDWR | ((a->flags & O_CLOEXEC) ? O_CLOEXEC : 0));
	if (dmabuf < 0)
		return -1;
	a->dmabuf_fd = (__u32)dmabuf;
	return ret;
}

/* struct drm_syncobj_handle (drm.h): handle, flags, fd, pad [, point]. */
#define DRM_SYNCOBJ_HANDLE_TO_FD_NR 0xC1
#define SYNCOBJ_HANDLE_FD_OFFSET 8

SHIM_API int ioctl(int fd, unsigned long request, ...)
{
	va_list ap;
	void *arg;
	int ret, dmabuf;

	va_start(ap, request);
	arg = va_arg(ap, void *);
	va_end(ap);

	if (request == SHIM_KFD_EXPORT_DMABUF && arg && fd_is_kfd(fd))
		return kfd_export_dmabuf(fd, request, arg);
	if (!shim_fd_is_render(fd))
		return real_ioctl(fd, request, arg);

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

	/* SYNCOBJ_HANDLE_TO_FD (a syncobj fd, or a sync_file with
	 * EXPORT_SYNC_FILE): the token at offset 8 out.  The kernel's
	 * drm_syncobj_get_fd and drm_syncobj_export_sync_file always take an
	 * O_CLOEXEC fd; there is no flag for it. */
	if (is_drm_rw(request, DRM_SYNCOBJ_HANDLE_TO_FD_NR,
		      SYNCOBJ_HANDLE_FD_OFFSET + sizeof(__s32))) {
		__s32 token;

		ret = real_ioctl(fd, request, arg);
		if (ret != 0)
			return ret;
		memcpy(&token, (char *)arg + SYNCOBJ_HANDLE_FD_OFFSET, sizeof(token));
		dmabuf = open_token((uint32_t)token, O_RDWR | O_CLOEXEC);
		if (dmabuf < 0)
			return -1;
		memcpy((char *)arg + SYNCOBJ_HANDLE_FD_OFFSET, &dmabuf, sizeof(dmabuf));
		return ret;
	}

	return real_ioctl(fd, request, arg);
}
