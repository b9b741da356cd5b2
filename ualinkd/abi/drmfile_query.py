"""ualinkd's private question to its own render node: "which open are you?" (ACQUIRE_VM).

KFD's ACQUIRE_VM names a render node by an fd number in the caller; every open of renderD128
shares one inode, so the daemon cannot tell from /proc which open it is. It takes a copy of
the caller's fd (pidfd_getfd) and, on a worker thread (never the FUSE thread), issues this
ioctl on the copy with a fresh random 64-bit nonce: the render node that answers it is the
open behind the fd, and it records which DrmFile it is under that nonce. Nobody else knows
a pending nonce, so no other caller can make the daemon bind a file it does not hold.

The number is 'u' nr 0xF1 (ualinkd's type, next to the CPU-map grant's 0xF0): no DRM table
has it (a real DRM fd answers EINVAL), and the KFD's table ends at 0x26 (ENOTTY).
"""

from __future__ import annotations

import struct

from .ioc import IOC_WRITE, ioc

UALINKD_DRM_FILE_QUERY_NR = 0xF1
UALINKD_IOCTL_DRM_FILE_QUERY = ioc(IOC_WRITE, ord("u"), UALINKD_DRM_FILE_QUERY_NR, 8)
NONCE = struct.Struct("<Q")
