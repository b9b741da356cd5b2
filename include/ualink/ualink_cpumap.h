/* SPDX-License-Identifier: MIT */
/*
 * ualinkd's one private ioctl: UALINKD_IOCTL_MMAP_GRANT, how libualink_shim.so
 * maps a BO (README, "CPU mappings"; ualinkd/abi/cpumap.py is the same layout).
 *
 * Type 'u', nr 0xF0: not DRM's 'd', and an nr no DRM table has (drm_ioctl
 * dispatches by nr only, so on a real DRM fd this is EINVAL; on a real dma-buf
 * ENOTTY).  Issued on a ualinkd render node or dma-buf file with the caller's
 * mmap(2) arguments; on success `grant` is fetched, once, from the abstract
 * unix socket "\0ualinkd-cpumap-<socket as %016llx>" (SOCK_SEQPACKET: send the
 * u64 grant, receive struct ualinkd_mmap_fetch and the memory's fd).
 */
#ifndef UALINK_CPUMAP_H
#define UALINK_CPUMAP_H

#include <linux/types.h>
#include <linux/ioctl.h>

struct ualinkd_mmap_grant {
	/* in: mmap(2)'s arguments and the fd's O_ACCMODE */
	__u64 offset;
	__u64 length;
	__u32 prot;
	__u32 flags;
	__u32 fmode;
	__u32 pad;
	/* out */
	__u64 grant;
	__u64 socket;
};

struct ualinkd_mmap_fetch {
	__s32 result;		/* 0, or a negative errno (no fd then) */
	__u32 map_type;		/* MAP_SHARED: how to map the fd */
	__u64 backing_offset;	/* the fd offset the mapping starts at */
};

#define UALINKD_IOCTL_MMAP_GRANT _IOWR('u', 0xF0, struct ualinkd_mmap_grant)
#define UALINKD_CPUMAP_SOCKET_FMT "ualinkd-cpumap-%016llx"

#endif
