"""The one error type of the DRM/amdgpu/UALink layers: an errno for the client.

Raised wherever the kernel would return -errno; caught once, by the ioctl dispatcher (or the
FUSE edge for open/read/write), and turned into the reply. Anything else escaping is a bug.
"""

from __future__ import annotations

import os


class DrmError(OSError):
    errno: int  # always set (OSError's may be None): the reply is -errno

    def __init__(self, err: int, detail: str | None = None) -> None:
        super().__init__(err, detail or os.strerror(err))
