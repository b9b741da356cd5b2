"""ualinkd's one private ioctl, UALINKD_IOCTL_MMAP_GRANT: how the LD_PRELOAD shim maps a BO.

A FUSE file cannot be mapped MAP_SHARED here (libfuse 3.14, DESIGN "FUSE facts"), so the shim
asks the render node (or dma-buf file) it was given for a one-time grant to the BO's memory,
then fetches the memory's fd over the daemon's unix socket (README, "CPU mappings").

The number is not a DRM ioctl and must never become one: type 'u' (not DRM's 'd') and nr
0xF0, which no DRM core or driver table has (the core ends at 0xD1, drivers use 0x40–0x9F).
The kernel's drm_ioctl dispatches by nr alone, so on a real DRM fd this cmd is EINVAL; on a
real dma-buf fd (type 'b') ENOTTY. ualinkd recognises it by the whole cmd, before the DRM
dispatch, on its render nodes and dma-buf files only. Layout: include/ualink/ualink_cpumap.h.
"""

from __future__ import annotations

from dataclasses import dataclass

import construct as cs

from .ioc import IOC_READ, IOC_WRITE, ioc
from .structs import Layout

UALINKD_IOCTL_TYPE = ord("u")
UALINKD_MMAP_GRANT_NR = 0xF0


@dataclass(frozen=True, slots=True)
class MmapGrant:
    # in: the caller's mmap(2) arguments and its fd's access mode (O_ACCMODE of F_GETFL)
    offset: int
    length: int
    prot: int
    flags: int
    fmode: int
    pad: int
    # out: the grant to present on the socket, and which socket
    grant: int
    socket: int  # the abstract unix socket "\0ualinkd-cpumap-<socket as 16 hex digits>"


MMAP_GRANT = Layout.of(
    "ualinkd_mmap_grant",
    cs.Struct(
        "offset" / cs.Int64un, "length" / cs.Int64un, "prot" / cs.Int32un,
        "flags" / cs.Int32un, "fmode" / cs.Int32un, "pad" / cs.Int32un,
        "grant" / cs.Int64un, "socket" / cs.Int64un,
    ),
    MmapGrant,
)
UALINKD_IOCTL_MMAP_GRANT = ioc(IOC_READ | IOC_WRITE, UALINKD_IOCTL_TYPE, UALINKD_MMAP_GRANT_NR,
                               MMAP_GRANT.size)


def socket_name(socket: int) -> bytes:
    """The abstract socket address (leading NUL) a grant's memory is fetched from."""
    return b"\0ualinkd-cpumap-" + f"{socket:016x}".encode()


# The socket exchange, one grant per connection (SOCK_SEQPACKET): the client sends the u64
# grant; the daemon answers with an s32 (0, or a negative errno) and u64 `backing_offset`
# (where in the fd the mapping starts), with the fd in SCM_RIGHTS when the answer is 0.
GRANT_REQUEST_SIZE = 8
GRANT_REPLY_SIZE = 16
