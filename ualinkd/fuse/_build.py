"""cffi (API mode) build script for the slice of libfuse3's low-level API that ualinkd uses.

The C compiler lays out every struct and checks every callback signature against
<fuse_lowlevel.h>; `lowlevel.py` is the only user of the resulting `_fuse_ll` module.
"""

from __future__ import annotations

import os
import shlex
import subprocess

from cffi import FFI

# 35: the ioctl op gets `unsigned int cmd` (no sign games with _IOC_READ numbers).
FUSE_USE_VERSION = 35


def _pkg_config() -> tuple[list[str], list[str], list[str]]:
    """(include_dirs, library_dirs, libraries) for fuse3, with a Debian-layout fallback."""
    try:
        cflags = subprocess.run(
            ["pkg-config", "--cflags", "fuse3"], check=True, capture_output=True, text=True
        ).stdout
        libs = subprocess.run(
            ["pkg-config", "--libs", "fuse3"], check=True, capture_output=True, text=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return ["/usr/include/fuse3"], [], ["fuse3"]
    inc = [f[2:] for f in shlex.split(cflags) if f.startswith("-I")]
    libdirs = [f[2:] for f in shlex.split(libs) if f.startswith("-L")]
    libraries = [f[2:] for f in shlex.split(libs) if f.startswith("-l")]
    return inc or ["/usr/include/fuse3"], libdirs, libraries or ["fuse3"]


CDEF = r"""
typedef int... dev_t;
typedef int... ino_t;
typedef int... mode_t;
typedef int... nlink_t;
typedef int... uid_t;
typedef int... gid_t;
typedef int... pid_t;
typedef int... off_t;
typedef int... blksize_t;
typedef int... blkcnt_t;
typedef int... time_t;
typedef int... fsblkcnt_t;
typedef int... fsfilcnt_t;
typedef uint64_t fuse_ino_t;
typedef struct fuse_req *fuse_req_t;
struct fuse_session;
struct fuse_conn_info { unsigned want; unsigned capable; ...; };

struct fuse_args { int argc; char **argv; int allocated; };

struct stat {
    dev_t st_dev; ino_t st_ino; mode_t st_mode; nlink_t st_nlink;
    uid_t st_uid; gid_t st_gid; dev_t st_rdev; off_t st_size;
    blksize_t st_blksize; blkcnt_t st_blocks;
    struct timespec st_atim; struct timespec st_mtim; struct timespec st_ctim;
    ...;
};
struct timespec { time_t tv_sec; long tv_nsec; ...; };
struct statvfs {
    unsigned long f_bsize; unsigned long f_frsize;
    fsblkcnt_t f_blocks; fsblkcnt_t f_bfree; fsblkcnt_t f_bavail;
    fsfilcnt_t f_files; fsfilcnt_t f_ffree; fsfilcnt_t f_favail;
    unsigned long f_namemax;
    ...;
};

/* Complete (cffi cannot mix bitfields with '...;'); the compiler checks size and offsets. */
struct fuse_file_info {
    int flags;
    unsigned int writepage : 1;
    unsigned int direct_io : 1;
    unsigned int keep_cache : 1;
    unsigned int flush : 1;
    unsigned int nonseekable : 1;
    unsigned int flock_release : 1;
    unsigned int cache_readdir : 1;
    unsigned int noflush : 1;
    unsigned int padding : 24;
    unsigned int padding2 : 32;
    uint64_t fh;
    uint64_t lock_owner;
    uint32_t poll_events;
};

struct fuse_entry_param {
    fuse_ino_t ino;
    uint64_t generation;
    struct stat attr;
    double attr_timeout;
    double entry_timeout;
};

struct fuse_ctx { uid_t uid; gid_t gid; pid_t pid; mode_t umask; };
struct fuse_forget_data { fuse_ino_t ino; uint64_t nlookup; };

enum fuse_buf_flags { FUSE_BUF_IS_FD = 2, ... };
struct fuse_buf { size_t size; enum fuse_buf_flags flags; void *mem; int fd; off_t pos; };

struct fuse_lowlevel_ops {
    void (*init)(void *userdata, struct fuse_conn_info *conn);
    void (*destroy)(void *userdata);
    void (*lookup)(fuse_req_t req, fuse_ino_t parent, const char *name);
    void (*forget)(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup);
    void (*getattr)(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
    void (*readlink)(fuse_req_t req, fuse_ino_t ino);
    void (*setattr)(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
                    struct fuse_file_info *fi);
    void (*open)(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
    void (*read)(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                 struct fuse_file_info *fi);
    void (*write)(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
                  struct fuse_file_info *fi);
    void (*flush)(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
    void (*release)(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
    void (*opendir)(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
    void (*readdir)(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                    struct fuse_file_info *fi);
    void (*releasedir)(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
    void (*statfs)(fuse_req_t req, fuse_ino_t ino);
    void (*ioctl)(fuse_req_t req, fuse_ino_t ino, unsigned int cmd, void *arg,
                  struct fuse_file_info *fi, unsigned flags, const void *in_buf,
                  size_t in_bufsz, size_t out_bufsz);
    void (*forget_multi)(fuse_req_t req, size_t count, struct fuse_forget_data *forgets);
    ...;
};

#define FUSE_SET_ATTR_MODE ...
#define FUSE_SET_ATTR_UID ...
#define FUSE_SET_ATTR_GID ...
#define FUSE_SET_ATTR_SIZE ...
#define FUSE_SET_ATTR_ATIME ...
#define FUSE_SET_ATTR_MTIME ...
#define FUSE_IOCTL_COMPAT ...
#define FUSE_IOCTL_UNRESTRICTED ...
#define FUSE_IOCTL_DIR ...
#define FUSE_CAP_SPLICE_WRITE ...
#define FUSE_CAP_SPLICE_MOVE ...
#define FUSE_CAP_SPLICE_READ ...

struct fuse_session *fuse_session_new(struct fuse_args *args,
                                      const struct fuse_lowlevel_ops *op,
                                      size_t op_size, void *userdata);
int fuse_session_mount(struct fuse_session *se, const char *mountpoint);
void fuse_session_unmount(struct fuse_session *se);
void fuse_session_destroy(struct fuse_session *se);
int fuse_session_fd(struct fuse_session *se);
int fuse_session_receive_buf(struct fuse_session *se, struct fuse_buf *buf);
void fuse_session_process_buf(struct fuse_session *se, const struct fuse_buf *buf);
void fuse_session_exit(struct fuse_session *se);
int fuse_session_exited(struct fuse_session *se);
void fuse_opt_free_args(struct fuse_args *args);

void *fuse_req_userdata(fuse_req_t req);
const struct fuse_ctx *fuse_req_ctx(fuse_req_t req);
typedef void (*fuse_interrupt_func_t)(fuse_req_t req, void *data);
void fuse_req_interrupt_func(fuse_req_t req, fuse_interrupt_func_t func, void *data);

int fuse_reply_err(fuse_req_t req, int err);
void fuse_reply_none(fuse_req_t req);
int fuse_reply_entry(fuse_req_t req, const struct fuse_entry_param *e);
int fuse_reply_attr(fuse_req_t req, const struct stat *attr, double attr_timeout);
int fuse_reply_open(fuse_req_t req, const struct fuse_file_info *fi);
int _ualinkd_reply_open_flags(fuse_req_t req, uint64_t fh, uint32_t open_flags);
#define FOPEN_DIRECT_IO ...
#define FOPEN_KEEP_CACHE ...
#define FOPEN_NONSEEKABLE ...
#define FOPEN_PARALLEL_DIRECT_WRITES ...
int fuse_reply_write(fuse_req_t req, size_t count);
int fuse_reply_buf(fuse_req_t req, const char *buf, size_t size);
int fuse_reply_readlink(fuse_req_t req, const char *link);
int fuse_reply_statfs(fuse_req_t req, const struct statvfs *stbuf);
int fuse_reply_ioctl(fuse_req_t req, int result, const char *buf, size_t size);
uint64_t _ualinkd_in_unique(const struct fuse_buf *buf);
int _ualinkd_reply_spliced(struct fuse_session *se, fuse_req_t req, uint64_t unique,
                           const char *head, size_t head_size, int fd, size_t size,
                           int out_r, int out_w);
void free(void *ptr);
size_t fuse_add_direntry(fuse_req_t req, char *buf, size_t bufsize, const char *name,
                         const struct stat *stbuf, off_t off);

/* The GPU engines' doorbell watch (fuse/doorbells.c). */
int ualinkd_doorbell_wait(const uint64_t *const *slots, const uint64_t *last, int n,
                          int64_t interval_ns, int64_t slow_after_ns, int64_t slow_interval_ns,
                          int64_t timeout_ns, const volatile int *stop,
                          const volatile uint64_t *generation, uint64_t generation0);

/* The data plane's fast path (fuse/dataplane.c). */
struct ualinkd_dp;
struct dp_fallback { fuse_req_t req; fuse_ino_t ino; uint64_t size, off, fh, unique; int expired;
                     char *data; void *block; };
struct ualinkd_dp *ualinkd_dp_new(void);
int ualinkd_dp_start(struct ualinkd_dp *dp, int fuse_fd);
void ualinkd_dp_stop(struct ualinkd_dp *dp, int err);
void ualinkd_dp_free(struct ualinkd_dp *dp);
int ualinkd_dp_open(struct ualinkd_dp *dp, int fd, const uint16_t *accels, int naccels);
void ualinkd_dp_close(struct ualinkd_dp *dp, int handle);
void ualinkd_dp_set_timeout(struct ualinkd_dp *dp, int64_t ns);
void ualinkd_dp_set_clock(struct ualinkd_dp *dp, int handle, int64_t origin, uint32_t peer_ms,
                          int64_t peer_at);
void ualinkd_dp_flush(struct ualinkd_dp *dp);
void ualinkd_dp_forget_file(struct ualinkd_dp *dp, uint64_t fh);
void ualinkd_dp_route_import(struct ualinkd_dp *dp, uint64_t fh, uint64_t va_start,
                             uint64_t va_end, uint64_t npa_start, uint16_t src, uint16_t dst,
                             int perm);
void ualinkd_dp_route_export(struct ualinkd_dp *dp, uint16_t src, uint16_t dst,
                             uint64_t npa_start, const char *mem, int fd, uint64_t fd_off,
                             uint32_t len);
int ualinkd_dp_take_fallbacks(struct ualinkd_dp *dp, struct dp_fallback *out, int max);
int ualinkd_dp_take_event(struct ualinkd_dp *dp, int *handle, char *why, size_t size);
void ualinkd_dp_stats(struct ualinkd_dp *dp, uint64_t *out);
struct dp_loaded { uint64_t token; int32_t status; };
int ualinkd_dp_load_into(struct ualinkd_dp *dp, uint16_t src, uint16_t dst, uint64_t npa,
                         char *dest, uint32_t size, uint64_t token);
int ualinkd_dp_take_loaded(struct ualinkd_dp *dp, struct dp_loaded *out, int max);
void ualinkd_dp_engine_stats(struct ualinkd_dp *dp, uint64_t *out);
#define DP_FAST_MAX ...
#define DP_CHANNELS ...
#define DP_READ ...
#define DP_WRITE ...
#define DP_FALLBACK ...
/* Filled with the extern "Python" callbacks below by _ualinkd_ops_init(). */
void _ualinkd_ops_init(struct fuse_lowlevel_ops *ops);

/* The receive/process loop (see SOURCE). */
struct _ualinkd_loop { unsigned long requests; int stop; long linger_ns; int turns;
                       long carried_linger_ns; int wake_fd; };
int _ualinkd_drain(struct fuse_session *se, struct fuse_buf *buf, struct _ualinkd_loop *loop);

extern "Python" {
    void _on_interrupt(fuse_req_t req, void *data);
    void _op_init(void *userdata, struct fuse_conn_info *conn);
    void _op_destroy(void *userdata);
    void _op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name);
    void _op_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup);
    void _op_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *forgets);
    void _op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
    void _op_readlink(fuse_req_t req, fuse_ino_t ino);
    void _op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
                     struct fuse_file_info *fi);
    void _op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
    void _op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, uint64_t fh);
    void _op_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
                   struct fuse_file_info *fi);
    void _op_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
    void _op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
    void _op_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
    void _op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                     struct fuse_file_info *fi);
    void _op_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
    void _op_statfs(fuse_req_t req, fuse_ino_t ino);
    void _op_ioctl(fuse_req_t req, fuse_ino_t ino, uint64_t fh, unsigned int cmd,
                   const char *in_buf, size_t in_bufsz, size_t out_bufsz,
                   pid_t pid, uid_t uid, gid_t gid);
}
"""

SOURCE = f"""
#ifndef _GNU_SOURCE
#define _GNU_SOURCE  /* splice(2) */
#endif
#define FUSE_USE_VERSION {FUSE_USE_VERSION}
#include <sys/types.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <errno.h>
#include <poll.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <linux/fuse.h>
/* The request _ualinkd_drain is processing (the read callback takes its unique; the write
   callback may take its buffer over: dp_try_store). */
static struct fuse_buf *_ualinkd_cur_buf;
/* The read callback gave its request to the data plane since the last receive. */
static int _ualinkd_carried;

/* libfuse 3.14's fuse_file_info has no parallel_direct_writes bit (3.15 added it), so its
   fuse_reply_open cannot ask for FOPEN_PARALLEL_DIRECT_WRITES. This is the same reply (a
   struct fuse_open_out, exactly what fuse_reply_open sends) with the open flags given. */
static int _ualinkd_reply_open_flags(fuse_req_t req, uint64_t fh, uint32_t open_flags)
{{
    struct fuse_open_out out;
    struct iovec iov = {{ &out, sizeof(out) }};

    memset(&out, 0, sizeof(out));
    out.fh = fh;
    out.open_flags = open_flags;
    return fuse_reply_iov(req, &iov, 1);
}}

/* The `unique` of the request in `buf` (its struct fuse_in_header), while it is processed. */
static uint64_t _ualinkd_in_unique(const struct fuse_buf *buf)
{{
    return ((const struct fuse_in_header *)buf->mem)->unique;
}}

/* Answer read request `req` (`unique`) with `head`, then the `size` bytes waiting in the
   pipe `fd`: its struct fuse_out_header and `head` are written into the empty pipe
   `out_w`, the bytes moved after them (pipe to pipe: no copy), and the whole reply spliced
   from `out_r` into /dev/fuse in one write, where the kernel copies it into the caller's
   buffer. libfuse's fuse_reply_data cannot do this for a reply near 1 MiB without
   CAP_SYS_RESOURCE (its pipe would have to outgrow pipe-max-size). 0: answered, `req`
   freed. -ENOENT: the kernel no longer waits for the reply (its caller was killed), `req`
   freed, as libfuse's own writes treat it. Else -errno: `req` answered EIO. Unless 0, both
   pipes may hold bytes (drop them). */
static int _ualinkd_reply_spliced(struct fuse_session *se, fuse_req_t req, uint64_t unique,
                                  const char *head, size_t head_size, int fd, size_t size,
                                  int out_r, int out_w)
{{
    struct fuse_out_header out;
    struct iovec iov[2];
    size_t total = sizeof(out) + head_size + size, moved = 0;
    ssize_t n;
    int err;

    out.len = (uint32_t)total;
    out.error = 0;
    out.unique = unique;
    iov[0].iov_base = &out;
    iov[0].iov_len = sizeof(out);
    iov[1].iov_base = (void *)head;
    iov[1].iov_len = head_size;
    n = writev(out_w, iov, head_size ? 2 : 1);
    if (n != (ssize_t)(sizeof(out) + head_size))
        goto fail;
    while (moved < size) {{
        n = splice(fd, NULL, out_w, NULL, size - moved, SPLICE_F_NONBLOCK);
        if (n <= 0)
            goto fail;
        moved += (size_t)n;
    }}
    n = splice(out_r, NULL, fuse_session_fd(se), NULL, total, 0);
    if (n < 0 && errno == ENOENT) {{
        fuse_reply_none(req);
        return -ENOENT;
    }}
    if (n != (ssize_t)total)
        goto fail;
    fuse_reply_none(req);
    return 0;
fail:
    err = n < 0 ? errno : EIO;
    fuse_reply_err(req, EIO);
    return -err;
}}

static void _op_init(void *userdata, struct fuse_conn_info *conn);
static void _op_destroy(void *userdata);
static void _op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name);
static void _op_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup);
static void _op_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *forgets);
static void _op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
static void _op_readlink(fuse_req_t req, fuse_ino_t ino);
static void _op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
                        struct fuse_file_info *fi);
static void _op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
static void _op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, uint64_t fh);
static void _op_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size,
                      off_t off, struct fuse_file_info *fi);
static void _op_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
static void _op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
static void _op_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
static void _op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                        struct fuse_file_info *fi);
static void _op_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
static void _op_statfs(fuse_req_t req, fuse_ino_t ino);
static void _op_ioctl(fuse_req_t req, fuse_ino_t ino, uint64_t fh, unsigned int cmd,
                      const char *in_buf, size_t in_bufsz, size_t out_bufsz,
                      pid_t pid, uid_t uid, gid_t gid);

/* libfuse's ioctl callback, passing Python only what the tree uses, as plain values: each
   pointer a cffi callback receives becomes a Python object, and fuse_req_ctx() was one more
   call from Python (lowlevel._op_ioctl). 32-bit callers are not emulated (the layouts are
   the 64-bit ones): answered ENOSYS, as before, without a trip into Python. */
static void _ualinkd_op_ioctl(fuse_req_t req, fuse_ino_t ino, unsigned int cmd, void *arg,
                              struct fuse_file_info *fi, unsigned flags, const void *in_buf,
                              size_t in_bufsz, size_t out_bufsz)
{{
    const struct fuse_ctx *ctx;

    (void)arg;
    if (flags & FUSE_IOCTL_COMPAT) {{
        fuse_reply_err(req, ENOSYS);
        return;
    }}
    ctx = fuse_req_ctx(req);
    _op_ioctl(req, ino, fi->fh, cmd, (const char *)in_buf, in_bufsz, out_bufsz,
              ctx->pid, ctx->uid, ctx->gid);
}}

struct _ualinkd_loop {{ unsigned long requests; int stop; long linger_ns; int turns;
                       long carried_linger_ns; int wake_fd; }};

/* Receive and process requests until the device has none, or loop->turns requests and
   lingers were done (then trio gets a turn: it finds the device still readable and comes
   back, so its own work, the fabric's, waits behind a stream of requests for that many at
   most). Returns 0 when the caller should wait for the device to be readable, 1 when the
   session is over, 2 when a callback set loop->stop (unmount, a fatal exception), -errno
   when reading the device failed. In C because it runs twice per request (the second
   receive finds EAGAIN), and from Python each turn was two or three cffi calls; the
   callbacks it runs are Python.

   Linger: when the device is empty right after a request, wait up to loop->linger_ns for
   the next one (ppoll: the CPU is free meanwhile).
   A client on another CPU sends its next ioctl some 10-40 µs after its answer, and going
   back to trio for it (epoll_ctl, epoll_wait and a scheduler turn in Python) cost more
   than the request itself: with the daemon and the client on different CPUs, an export
   ioctl took 70.7 / 63.8 µs of daemon CPU (69.8 / 62.8 µs latency) without, 51.0 / 44.0 µs
   (50.8 / 42.8 µs) with a 50 µs linger (two runs, 6 x 20,000 ioctls each). On one CPU
   the client mostly runs before the receive and it finds the request, linger or not.
   After a read the data plane took (its answer comes from the data plane's thread, the
   caller's next request a fabric round trip later), the linger is loop->carried_linger_ns:
   4 KiB loads left to the scheduler took 154-201 µs with the 50 µs linger (back to trio
   before the next load came), 124-146 µs with 250 µs (two rounds of 3 x 3,000 loads); on
   one CPU the 50 µs one already caught them. The data plane's notify fd (loop->wake_fd)
   ends it, for trio to serve what the thread handed back.
   The caller sets linger_ns to 0 while an answer waits on trio (a task, a Completion),
   and the budget bounds how long trio's other work can wait behind a stream of
   requests. */
static int _ualinkd_drain(struct fuse_session *se, struct fuse_buf *buf,
                          struct _ualinkd_loop *loop)
{{
    int lingered = 0;

    for (;;) {{
        int n = fuse_session_receive_buf(se, buf);

        if (n > 0) {{
            lingered = 0;
            loop->requests++;
            _ualinkd_cur_buf = buf;
            fuse_session_process_buf(se, buf);
            _ualinkd_cur_buf = NULL;
            if (loop->stop)
                return 2;
            if (--loop->turns <= 0)
                return 0;
        }} else if (n == -EAGAIN) {{
            struct pollfd pfd[2] = {{ {{ fuse_session_fd(se), POLLIN, 0 }},
                                     {{ loop->wake_fd, POLLIN, 0 }} }};
            long linger = loop->linger_ns;
            struct timespec ts;

            if (_ualinkd_carried && linger > 0 && loop->carried_linger_ns > linger)
                linger = loop->carried_linger_ns;
            _ualinkd_carried = 0;
            if (lingered || linger <= 0)
                return 0;
            lingered = 1;  /* once per empty device: a readable fd that reads EAGAIN ends it */
            ts.tv_sec = linger / 1000000000L;
            ts.tv_nsec = linger % 1000000000L;
            if (--loop->turns <= 0 || ppoll(pfd, loop->wake_fd >= 0 ? 2 : 1, &ts, NULL) < 1
                    || !(pfd[0].revents & POLLIN))
                return 0;  /* nothing came, the data plane has work for trio, or a signal */
        }} else if (n == -EINTR) {{
            continue;
        }} else if (n == 0 || fuse_session_exited(se)) {{
            return 1;
        }} else {{
            return n;
        }}
    }}
}}

@DATAPLANE@
@DOORBELLS@

/* libfuse's read callback: a load the data plane carries (its routes cover it) goes out
   from here; any other read is Python's. */
static void _ualinkd_op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                             struct fuse_file_info *fi)
{{
    struct ualinkd_dp *dp = fuse_req_userdata(req);
    uint64_t unique = _ualinkd_cur_buf ? _ualinkd_in_unique(_ualinkd_cur_buf) : 0;

    if (dp != NULL && off >= 0
            && dp_try_load(dp, req, ino, size, (uint64_t)off, fi->fh, unique) == 0) {{
        _ualinkd_carried = 1;
        return;
    }}
    _op_read(req, ino, size, off, fi->fh);
}}

/* libfuse's write callback: a store the data plane carries (a route with write permission
   covers it) goes out from here; any other write is Python's. */
static void _ualinkd_op_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size,
                              off_t off, struct fuse_file_info *fi)
{{
    struct ualinkd_dp *dp = fuse_req_userdata(req);
    uint64_t unique = _ualinkd_cur_buf ? _ualinkd_in_unique(_ualinkd_cur_buf) : 0;

    if (dp != NULL && off >= 0
            && dp_try_store(dp, req, ino, buf, size, (uint64_t)off, fi->fh, unique,
                            _ualinkd_cur_buf) == 0) {{
        _ualinkd_carried = 1;
        return;
    }}
    _op_write(req, ino, buf, size, off, fi);
}}

static void _ualinkd_ops_init(struct fuse_lowlevel_ops *ops)
{{
    memset(ops, 0, sizeof(*ops));
    ops->init = _op_init;
    ops->destroy = _op_destroy;
    ops->lookup = _op_lookup;
    ops->forget = _op_forget;
    ops->forget_multi = _op_forget_multi;
    ops->getattr = _op_getattr;
    ops->readlink = _op_readlink;
    ops->setattr = _op_setattr;
    ops->open = _op_open;
    ops->read = _ualinkd_op_read;
    ops->write = _ualinkd_op_write;
    ops->flush = _op_flush;
    ops->release = _op_release;
    ops->opendir = _op_opendir;
    ops->readdir = _op_readdir;
    ops->releasedir = _op_releasedir;
    ops->statfs = _op_statfs;
    ops->ioctl = _ualinkd_op_ioctl;
}}
"""

# The data plane's C (a file of its own: it is most of the C here, and has no f-string braces).
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "dataplane.c")) as _f:
    SOURCE = SOURCE.replace("@DATAPLANE@", _f.read())
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "doorbells.c")) as _f:
    SOURCE = SOURCE.replace("@DOORBELLS@", _f.read())

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
_inc, _libdirs, _libs = _pkg_config()
ffibuilder.set_source(
    "ualinkd.fuse._fuse_ll",
    SOURCE,
    include_dirs=_inc,
    library_dirs=_libdirs,
    libraries=_libs,
)

if __name__ == "__main__":
    import tempfile

    # Build in place without leaving .c/.o files, under the name `pip install -e .` uses
    # (cffi builds for the limited API): two differently named copies would shadow each other.
    _here = os.path.dirname(os.path.abspath(__file__))
    with tempfile.TemporaryDirectory() as tmp:
        so = ffibuilder.compile(tmpdir=tmp, verbose=False)
        os.replace(so, os.path.join(_here, "_fuse_ll.abi3.so"))
    for name in os.listdir(_here):
        if name.startswith("_fuse_ll.") and name.endswith(".so") and "abi3" not in name:
            os.unlink(os.path.join(_here, name))
