/* SPDX-License-Identifier: MIT */
/*
 * The LD_PRELOAD shim's internal interface, for the files of
 * libualink_shim.so besides shim.c (all hidden; nothing here is exported).
 *
 * shim.c owns the configuration ($UALINK_DRI_DIR, read once), the table of
 * render-node fds (set by the open wrappers, copied by dup*, cleared by
 * close*), and the recursion-guarded lookup of the next definition of a libc
 * symbol.  Another wrapper file (e.g. mmap of BOs) uses these and never keeps
 * its own copy of them.
 */
#ifndef UALINK_SHIM_H
#define UALINK_SHIM_H

#include <stdatomic.h>
#include <stdbool.h>

#define SHIM_HIDDEN __attribute__((visibility("hidden")))

/* True when $UALINK_DRI_DIR names a ualinkd mount; reads the configuration
 * on first use (safe from any wrapper, any thread). */
SHIM_HIDDEN bool shim_active(void);

/* The mount's directories, canonical, without a trailing '/': "<mount>/dri"
 * and "<mount>/dmabuf" (or $UALINK_DMABUF_DIR).  Valid once shim_active(). */
SHIM_HIDDEN const char *shim_dri_dir(void);
SHIM_HIDDEN const char *shim_dmabuf_dir(void);

/* The DRM minor an fd was opened as (renderD<N>: N, card<N>: N; it is a
 * ualinkd render node either way), or -1 for any other fd. */
SHIM_HIDDEN int shim_fd_minor(int fd);
static inline bool shim_fd_is_render(int fd) { return shim_fd_minor(fd) >= 0; }

/* The next definition of `name` (dlsym(RTLD_NEXT)), cached in *slot; NULL if
 * there is none, or if this thread is already inside the lookup (the caller
 * then issues the raw system call: no recursion through dlsym's own opens or
 * mallocs).  `slot` is a static of the caller, zero-initialised. */
SHIM_HIDDEN void *shim_next(_Atomic(void *) *slot, const char *name);

#endif /* UALINK_SHIM_H */
