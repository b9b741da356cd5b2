"""What the FUSE file tree needs from a node: the contract between `fuse/` and the daemon.

The tree (`fuse/tree.py`) only knows paths, inodes and replies; everything a file *means*
comes through this protocol, implemented by `ualinkd.node.NodeCore` (sans-IO, synchronous).
Errors cross it as `ualinkd.drm.errors.DrmError(errno)` and nothing else.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

# The process behind a request (fuse_req_ctx) is the DRM core's Caller, one type from the
# FUSE edge down to the ioctl handlers. The sys/ tree's node kinds live with its layout
# (ualinkd/sysfs.py); the tree serves them.
from ualinkd.drm.completion import Completion
from ualinkd.drm.device import Caller
from ualinkd.drm.loaded import Loaded
from ualinkd.sysfs import SysAttr, SysDir, SysLink

__all__ = ["Caller", "DmaBufRef", "IoctlReply", "KfdFile", "NodeBackend", "RenderFile", "SysAttr",
           "SysDir", "SysLink"]


# An ioctl answer: (result, out_bytes). result is 0 or a negative errno; out_bytes (at most
# the out_size the request asked for) is copied back even when result < 0 (DESIGN.md,
# "Restricted ioctls"); fewer bytes copy back less: b"" leaves the caller's buffer as it was,
# as when drm_ioctl fails before its copy-out.
IoctlReply = tuple[int, bytes]


# The handles a backend gives for its open files, kept by the tree as they are and handed
# back on every call on that file (its fh): NodeCore's are DrmFile, KfdProcess and the
# dma-buf key. The tree never looks inside one.
RenderFile = TypeVar("RenderFile")
KfdFile = TypeVar("KfdFile")
DmaBufRef = TypeVar("DmaBufRef")


class NodeBackend(Protocol[RenderFile, KfdFile, DmaBufRef]):
    """A node as the file tree sees it. All methods are called from the trio thread."""

    def render_minors(self) -> list[int]:
        """Minors of the render nodes, in accel order: [128, 129, ...]."""
        ...

    def primary_minors(self) -> list[int]:
        """Minors of the card<n> nodes beside them ([] for render nodes only); open_render
        takes these minors too."""
        ...

    def open_render(self, minor: int, caller: Caller) -> RenderFile:
        """open() of dri/renderD<minor> (or dri/card<minor>): returns the DrmFile (opaque to
        the tree)."""
        ...

    def release_render(self, drm_file: RenderFile) -> None:
        """Last close of that open file: drops its handles."""
        ...

    def ioctl(
        self, drm_file: RenderFile, cmd: int, in_bytes: bytes, out_size: int, caller: Caller
    ) -> IoctlReply | Completion[IoctlReply]:
        """A restricted ioctl. in_bytes has _IOC_SIZE(cmd) bytes when the IN bit is set
        (else b""), out_size is _IOC_SIZE(cmd) when the OUT bit is set (else 0).
        May return a Completion when the answer must wait (a wait, the caller's memory, a
        remote import); the tree then replies from the call that completes it, and keeps
        serving other requests meanwhile."""
        ...

    def gpu_read(
        self, drm_file: RenderFile, va: int, size: int, caller: Caller
    ) -> bytes | Completion[Loaded]:
        """pread() on a render node: a GPU load through the file's GPU VM (the bytes now,
        or later: a Completion answered by callback, whose bytes may be in a pipe:
        drm/loaded.py)."""
        ...

    def gpu_read_route(self, drm_file: RenderFile, va: int, size: int,
                       write: bool = False) -> tuple[int, int, int, int, int] | None:
        """After a remote load (`write`: store) of [va, va + size) answered whole: the
        route the data plane may take for the next loads (stores) of its mapping (VA
        start, VA end, NPA byte address at the start, issuing accel, exporting accel), or
        None."""
        ...

    def gpu_read_expired(self, drm_file: RenderFile) -> None:
        """A load the data plane carried on such a route got no answer within the link's
        deadline: a GPU page fault, counted as the link's own expired LOAD is (policy 10);
        the read is answered EFAULT."""
        ...

    def gpu_write(
        self, drm_file: RenderFile, va: int, data: bytes, caller: Caller
    ) -> int | Completion[int]:
        """pwrite() on a render node: a GPU store; returns the count written (or later, as
        gpu_read)."""
        ...

    def open_kfd(self, caller: Caller) -> KfdFile:
        """open() of <mount>/kfd: the caller's KFD process (opaque to the tree)."""
        ...

    def release_kfd(self, process: KfdFile) -> None:
        """Last close of an open of kfd."""
        ...

    def kfd_ioctl(
        self, process: KfdFile, cmd: int, in_bytes: bytes, out_size: int, caller: Caller
    ) -> IoctlReply | Completion[IoctlReply]:
        """A 'K' ioctl on an open kfd, as `ioctl` is for a render node."""
        ...

    def dmabuf_lookup(self, name: str, caller: Caller) -> tuple[int, int]:
        """lookup of dmabuf/<name>: (key, size). key is a stable non-zero int naming that
        pending token's dma-buf (the tree derives the inode from it); ENOENT if the
        token is unknown, already opened, or belongs to another uid."""
        ...

    def dmabuf_open(self, key: int, caller: Caller) -> DmaBufRef:
        """open() of a dmabuf file: consumes the token, returns the open dma-buf (an
        opaque reference the tree keeps as the file handle)."""
        ...

    def dmabuf_size(self, key: int) -> int:
        """st_size of the dmabuf file with that key (the BO size)."""
        ...

    def dmabuf_release(self, dmabuf_ref: DmaBufRef) -> None:
        """Last close of an opened dma-buf file: drops that reference."""
        ...

    def dmabuf_ioctl(
        self, dmabuf_ref: DmaBufRef, cmd: int, in_bytes: bytes, out_size: int, caller: Caller
    ) -> IoctlReply:
        """A restricted ioctl on an opened dma-buf file (ENOTTY unless the node knows it)."""
        ...

    def dmabuf_resolve(self, ino_or_key: int) -> object | None:
        """Not used by the tree; here for symmetry with PRIME_FD_TO_HANDLE."""
        ...

    def sys_tree(self) -> SysDir:
        """The sys/ tree (built once; attribute reads are live); see ualinkd/sysfs.py."""
        ...
