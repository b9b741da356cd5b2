"""The file tree of one node's mount: dri/{renderD*,card*}, dmabuf/<token> and sys/..., as
FUSE ops.

Knows paths, inodes, file handles and permissions; what a file *means* is the backend's
(`backend.NodeBackend`), the sys/ layout is `ualinkd/sysfs.py`'s. Backend errors (DrmError)
become FuseError here and nowhere else. The mount has no default_permissions (the kernel
does not check modes), so every permission of the tree is checked here, by uid.
"""

from __future__ import annotations

import errno
import itertools
import os
import stat
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from ualinkd.abi.cpumap import UALINKD_IOCTL_MMAP_GRANT
from ualinkd.drm.completion import Completion
from ualinkd.drm.errors import DrmError
from ualinkd.drm.loaded import Loaded
from ualinkd.fuse.backend import Caller, DmaBufRef, KfdFile, NodeBackend, RenderFile
from ualinkd.fuse.lowlevel import ROOT_INO, Attr, DirEntry, FuseError, FuseSession, OpenReply
from ualinkd.fuse.procfd import DMABUF_INO_BASE, dmabuf_ino, dmabuf_key
from ualinkd.sysfs import SysAttr, SysDir, SysLink, dir_mode

T = TypeVar("T")

DRI_INO, DMABUF_INO, SYS_INO = 2, 3, 4
_FIRST_DYNAMIC_INO = 16
_STATIC_TIMEOUT = 60.0  # dirs and render nodes never change within a run
_DIR_MODE = stat.S_IFDIR | 0o755
_RENDER_MODE = stat.S_IFREG | 0o666  # S_IFCHR would be opened as a real device
_DMABUF_MODE = stat.S_IFREG | 0o600
_DMABUF_PRUNE_MIN = 1024  # dmabuf inodes kept before dead tokens' ones are looked for
_LINK_MODE = stat.S_IFLNK | 0o777
# A render node's size covers the whole 48-bit GPU VA space: a direct_io write that ends
# beyond st_size takes the inode lock exclusively even with parallel direct writes.
_RENDER_SIZE = 1 << 48


@dataclass(slots=True)
class _Dir:
    ino: int
    parent: int
    mode: int = _DIR_MODE
    children: dict[str, int] = field(default_factory=dict)
    hidden: bool = False  # under a directory only root may search (debugfs)


@dataclass(slots=True)
class _Render:
    ino: int
    minor: int
    hidden: bool = False


@dataclass(slots=True)
class _Kfd:
    """<mount>/kfd: the node's /dev/kfd (the shim redirects to it)."""

    ino: int
    hidden: bool = False


@dataclass(slots=True)
class _SysFile:
    ino: int
    attr: SysAttr
    hidden: bool = False


@dataclass(slots=True)
class _SysLink:
    ino: int
    target: bytes
    hidden: bool = False


def _others_may(mode: int, bit: int, caller: Caller) -> bool:
    """Whether a non-root caller passes mode bit r/w/x (4/2/1) of a root:root inode."""
    return bool(mode & (bit << 3 if caller.gid == 0 else bit))


_FMODE_AT = 24  # struct ualinkd_mmap_grant: offset, length (u64), prot, flags (u32), fmode


def _with_fmode(in_bytes: bytes, mode: int) -> bytes:
    """The grant request with its `fmode` field set to `mode` (struct ualinkd_mmap_grant)."""
    if len(in_bytes) < _FMODE_AT + 4:
        return in_bytes
    return in_bytes[:_FMODE_AT] + struct.pack("<I", mode) + in_bytes[_FMODE_AT + 4:]


def _drm_error_to_fuse(c: Completion[T]) -> T:
    """A Completion's DrmError, as the FuseError it is at this boundary."""
    try:
        return c.result()
    except DrmError as e:
        raise FuseError(e.errno) from None


class FileTree(Generic[RenderFile, KfdFile, DmaBufRef]):
    """The `lowlevel.Operations` of a node's mount. All calls come from the trio thread."""

    def __init__(self, backend: NodeBackend[RenderFile, KfdFile, DmaBufRef],
                 mountpoint: str | os.PathLike[str]) -> None:
        self.backend = backend
        self.mountpoint = os.path.abspath(os.fspath(mountpoint))
        self._nodes: dict[int, _Dir | _Render | _Kfd | _SysFile | _SysLink] = {}
        self._next_ino = itertools.count(_FIRST_DYNAMIC_INO)
        self._next_fh = itertools.count(1)
        # fh -> open object, one table per kind so the hot paths do a single dict lookup.
        self._render_fh: dict[int, RenderFile] = {}
        self._dmabuf_fh: dict[int, DmaBufRef] = {}
        self._kfd_fh: dict[int, KfdFile] = {}
        self._sys_fh: dict[int, SysAttr] = {}
        # What a sys file showed at the read at offset 0, per open: later offsets read from
        # it, so a file longer than one FUSE read is one consistent text (seq_file's rule),
        # never the head of one version and the tail of another.
        self._sys_text: dict[int, bytes] = {}
        self._fh_mode: dict[int, int] = {}  # render, kfd, dma-buf opens: flags & O_ACCMODE
        # dmabuf inode -> [lookup count, uid, gid]; dropped when the kernel forgets it, or
        # when its dma-buf file is released or its token died: a key is single-use, so its
        # inode can do nothing more (getattr: ENOENT). The kernel keeps a dentry whose
        # zero timeout had not expired when its last fd closed (fuse_dentry_delete compares
        # jiffies), and with it the inode, until memory pressure: the FORGET may never come
        # (an import cycle left one entry behind, 8,000 cycles 1.7 MiB).
        self._dmabuf_inodes: dict[int, list[int]] = {}
        self._dmabuf_prune_at = _DMABUF_PRUNE_MIN
        self._backend_ioctl = backend.ioctl

        root = self._add_dir(ROOT_INO, ROOT_INO, None, "")
        dri = self._add_dir(DRI_INO, ROOT_INO, root, "dri")
        self._add_dir(DMABUF_INO, ROOT_INO, root, "dmabuf", mode=stat.S_IFDIR | 0o711)
        sys_dir = self._add_dir(SYS_INO, ROOT_INO, root, "sys")
        for minor in backend.render_minors():
            ino = next(self._next_ino)
            self._nodes[ino] = _Render(ino, minor)
            dri.children[f"renderD{minor}"] = ino
        # card<n>: the GPU's primary node, opened as its render node (no DRM master or
        # authentication is emulated: every opener is a render client).
        for minor in backend.primary_minors():
            ino = next(self._next_ino)
            self._nodes[ino] = _Render(ino, minor)
            dri.children[f"card{minor}"] = ino
        kfd_ino = next(self._next_ino)
        self._nodes[kfd_ino] = _Kfd(kfd_ino)
        root.children["kfd"] = kfd_ino
        self._add_sys(sys_dir, backend.sys_tree())

    def _add_dir(
        self, ino: int, parent: int, into: _Dir | None, name: str, mode: int = _DIR_MODE
    ) -> _Dir:
        d = _Dir(ino, parent, mode)
        self._nodes[ino] = d
        if into is not None:
            into.children[name] = ino
        return d

    def _add_sys(self, into: _Dir, tree: SysDir) -> None:
        # Children of a directory others may not search are hidden from them, and so is
        # everything below a hidden directory.
        hidden = into.hidden or not into.mode & 0o001
        for name, item in tree.items():
            ino = next(self._next_ino)
            if isinstance(item, SysAttr):
                self._nodes[ino] = _SysFile(ino, item, hidden)
                into.children[name] = ino
            elif isinstance(item, SysLink):
                self._nodes[ino] = _SysLink(ino, item.target.encode(), hidden)
                into.children[name] = ino
            else:
                d = self._add_dir(ino, into.ino, into, name, stat.S_IFDIR | dir_mode(item))
                d.hidden = hidden
                self._add_sys(d, item)

    # -- mounting convenience -------------------------------------------------------------

    def session(self) -> FuseSession:
        """A FuseSession serving this tree, mounted at self.mountpoint."""
        s = FuseSession(self)
        s.mount(self.mountpoint)
        return s

    # -- attributes ------------------------------------------------------------------------

    def _attr(self, ino: int, caller: Caller) -> Attr:
        node = self._nodes.get(ino)
        if node is None:
            key = dmabuf_key(ino)
            if key is None:
                raise FuseError(errno.ENOENT)
            try:
                size = self.backend.dmabuf_size(key)
            except DrmError as e:
                raise FuseError(e.errno) from None
            owner = self._dmabuf_inodes.get(ino)
            uid, gid = (owner[1], owner[2]) if owner else (caller.uid, caller.gid)
            return Attr(ino, _DMABUF_MODE, size, 1, uid, gid)
        if isinstance(node, _Kfd):
            return Attr(ino, _RENDER_MODE, 0, 1, 0, 0, _STATIC_TIMEOUT, _STATIC_TIMEOUT)
        if isinstance(node, _Render):
            return Attr(ino, _RENDER_MODE, _RENDER_SIZE, 1, 0, 0, _STATIC_TIMEOUT,
                        _STATIC_TIMEOUT)
        if node.hidden and caller.uid != 0:
            raise FuseError(errno.EACCES)  # the walk to it would have failed
        if isinstance(node, _SysFile):
            return Attr(ino, stat.S_IFREG | node.attr.mode, node.attr.size)
        if isinstance(node, _SysLink):
            return Attr(ino, _LINK_MODE, len(node.target), 1, 0, 0, _STATIC_TIMEOUT,
                        _STATIC_TIMEOUT)
        nlink = 2 + sum(isinstance(self._nodes[c], _Dir) for c in node.children.values())
        return Attr(ino, node.mode, 0, nlink, 0, 0, _STATIC_TIMEOUT, _STATIC_TIMEOUT)

    def lookup(self, parent: int, name: str, caller: Caller) -> Attr:
        if parent == DMABUF_INO:
            return self._lookup_dmabuf(name, caller)
        node = self._nodes.get(parent)
        if not isinstance(node, _Dir):
            raise FuseError(errno.ENOTDIR if node is not None else errno.ENOENT)
        if caller.uid != 0 and (node.hidden or not _others_may(node.mode, 1, caller)):
            raise FuseError(errno.EACCES)  # may_lookup: search permission on the directory
        if name == ".":
            return self._attr(parent, caller)
        if name == "..":
            return self._attr(node.parent, caller)
        ino = node.children.get(name)
        if ino is None:
            raise FuseError(errno.ENOENT)
        return self._attr(ino, caller)

    def _lookup_dmabuf(self, name: str, caller: Caller) -> Attr:
        try:
            key, size = self.backend.dmabuf_lookup(name, caller)
        except DrmError as e:
            raise FuseError(e.errno) from None
        ino = dmabuf_ino(key)
        if len(self._dmabuf_inodes) >= self._dmabuf_prune_at:
            self._prune_dmabuf_inodes()
        entry = self._dmabuf_inodes.setdefault(ino, [0, caller.uid, caller.gid])
        entry[0] += 1
        # Timeouts 0: every open() goes through lookup (tokens are single-use) and every
        # fstat/lseek(SEEK_END) through getattr.
        return Attr(ino, _DMABUF_MODE, size, 1, entry[1], entry[2])

    def _prune_dmabuf_inodes(self) -> None:
        """Drop the inodes of tokens that died unopened (looked up, then their DrmFile
        closed); amortised: the next prune waits until the table has doubled."""
        for ino in list(self._dmabuf_inodes):
            try:
                self.backend.dmabuf_size(ino - DMABUF_INO_BASE)
            except DrmError:
                del self._dmabuf_inodes[ino]
        self._dmabuf_prune_at = max(_DMABUF_PRUNE_MIN, 2 * len(self._dmabuf_inodes))

    def forget(self, ino: int, nlookup: int) -> None:
        entry = self._dmabuf_inodes.get(ino)
        if entry is not None:
            entry[0] -= nlookup
            if entry[0] <= 0:
                del self._dmabuf_inodes[ino]

    def getattr(self, ino: int, caller: Caller) -> Attr:
        return self._attr(ino, caller)

    def setattr(self, ino: int, size: int | None, caller: Caller) -> Attr:
        node = self._nodes.get(ino)
        if size is not None:
            # Only open(O_TRUNC) of a writable sys attribute truncates (to nothing, as sysfs).
            if isinstance(node, _Dir):
                raise FuseError(errno.EISDIR)
            if not isinstance(node, _SysFile):
                raise FuseError(errno.EINVAL)
            self._check_sys_access(node.attr, os.O_WRONLY, caller)
        return self._attr(ino, caller)

    # -- open / release ----------------------------------------------------------------------

    @staticmethod
    def _check_sys_access(attr: SysAttr, flags: int, caller: Caller) -> None:
        """Attributes belong to root, like sysfs; we check since default_permissions is off.
        As kernfs_fop_open (§7.1 modes), a file with no read bit at all cannot be opened for
        reading, nor one with no write bit for writing, even by root."""
        acc = flags & os.O_ACCMODE
        if acc != os.O_RDONLY:
            if attr.write is None or not attr.mode & 0o222:
                raise FuseError(errno.EACCES)
            if caller.uid != 0 and not _others_may(attr.mode, 2, caller):
                raise FuseError(errno.EACCES)
        if acc != os.O_WRONLY:
            if not attr.mode & 0o444:
                raise FuseError(errno.EACCES)
            if caller.uid != 0 and not _others_may(attr.mode, 4, caller):
                raise FuseError(errno.EACCES)

    def open(self, ino: int, flags: int, caller: Caller) -> OpenReply:
        node = self._nodes.get(ino)
        fh = next(self._next_fh)
        try:
            if isinstance(node, _Render):
                self._render_fh[fh] = self.backend.open_render(node.minor, caller)
                self._fh_mode[fh] = flags & os.O_ACCMODE
            elif isinstance(node, _Kfd):
                self._kfd_fh[fh] = self.backend.open_kfd(caller)
                self._fh_mode[fh] = flags & os.O_ACCMODE  # mmap(kfd fd) checks it too
            elif isinstance(node, _SysFile):
                # The open itself is checked, not only the lookup: the kernel's dentry cache
                # answers a path another uid looked up without asking us.
                if node.hidden and caller.uid != 0:
                    raise FuseError(errno.EACCES)
                self._check_sys_access(node.attr, flags, caller)
                self._sys_fh[fh] = node.attr
            elif isinstance(node, _Dir):
                raise FuseError(errno.EISDIR)
            else:
                key = dmabuf_key(ino)
                if key is None:
                    raise FuseError(errno.ENOENT)
                self._dmabuf_fh[fh] = self.backend.dmabuf_open(key, caller)
                self._fh_mode[fh] = flags & os.O_ACCMODE
        except DrmError as e:
            raise FuseError(e.errno) from None
        # direct_io: pread/pwrite offsets (GPU VAs) and sizes arrive unchanged, and sys
        # attributes are read live every time (no page cache). A render node's GPU stores
        # run in parallel: one waiting on a remote exporter holds up no other.
        return OpenReply(fh, direct_io=True,
                         parallel_direct_writes=isinstance(node, _Render))

    def release(self, ino: int, fh: int) -> None:
        self._fh_mode.pop(fh, None)
        if (drm_file := self._render_fh.pop(fh, None)) is not None:
            self.backend.release_render(drm_file)
        elif (ref := self._dmabuf_fh.pop(fh, None)) is not None:
            self.backend.dmabuf_release(ref)
            self._dmabuf_inodes.pop(ino, None)  # its key is dead: no FORGET needed
        elif (process := self._kfd_fh.pop(fh, None)) is not None:
            self.backend.release_kfd(process)
        else:
            self._sys_fh.pop(fh, None)
            self._sys_text.pop(fh, None)

    # -- data ------------------------------------------------------------------------------

    def ioctl(
        self, ino: int, fh: int, cmd: int, in_bytes: bytes, out_size: int, caller: Caller
    ) -> tuple[int, bytes] | Completion[tuple[int, bytes]]:
        if cmd == UALINKD_IOCTL_MMAP_GRANT:
            # The file's access mode is what the open gave it, not what the caller says:
            # a read-only fd never gets a writable mapping (do_mmap's FMODE_WRITE check).
            in_bytes = _with_fmode(in_bytes, self._fh_mode.get(fh, os.O_RDONLY))
        drm_file = self._render_fh.get(fh)
        if drm_file is None and (process := self._kfd_fh.get(fh)) is not None:
            try:
                r = self.backend.kfd_ioctl(process, cmd, in_bytes, out_size, caller)
            except DrmError as e:
                raise FuseError(e.errno) from None
            return r.then(_drm_error_to_fuse) if isinstance(r, Completion) else r
        if drm_file is None:
            ref = self._dmabuf_fh.get(fh)
            if ref is None:
                raise FuseError(errno.ENOTTY)
            try:
                return self.backend.dmabuf_ioctl(ref, cmd, in_bytes, out_size, caller)
            except DrmError as e:
                raise FuseError(e.errno) from None
        try:
            got = self._backend_ioctl(drm_file, cmd, in_bytes, out_size, caller)
        except DrmError as e:
            raise FuseError(e.errno) from None
        return got.then(_drm_error_to_fuse) if isinstance(got, Completion) else got

    def read(
        self, ino: int, fh: int, off: int, size: int, caller: Caller
    ) -> bytes | Completion[Loaded]:
        try:
            if (drm_file := self._render_fh.get(fh)) is not None:
                r = self.backend.gpu_read(drm_file, off, size, caller)
                return r.then(_drm_error_to_fuse) if isinstance(r, Completion) else r
            if (attr := self._sys_fh.get(fh)) is not None:
                if off == 0 or fh not in self._sys_text:
                    data = attr.read()
                    self._sys_text[fh] = data.encode() if isinstance(data, str) else data
                data = self._sys_text[fh]
                return data[off : off + size] if off >= 0 else b""
        except DrmError as e:
            raise FuseError(e.errno) from None
        raise FuseError(errno.EINVAL)  # dma-buf CPU access is not emulated

    def read_route(self, fh: int, off: int, size: int,
                   write: bool = False) -> tuple[int, int, int, int, int] | None:
        """The data plane's route for the next reads (`write`: writes) of a render file
        like that one (Backend.gpu_read_route), or None."""
        drm_file = self._render_fh.get(fh)
        if drm_file is None:
            return None
        if write:
            return self.backend.gpu_read_route(drm_file, off, size, write=True)
        return self.backend.gpu_read_route(drm_file, off, size)

    def read_expired(self, fh: int) -> None:
        """A read the data plane carried got no answer in time: it faults
        (Backend.gpu_read_expired)."""
        drm_file = self._render_fh.get(fh)
        if drm_file is not None:
            self.backend.gpu_read_expired(drm_file)

    def write(
        self, ino: int, fh: int, off: int, data: bytes, caller: Caller
    ) -> int | Completion[int]:
        try:
            if (drm_file := self._render_fh.get(fh)) is not None:
                r = self.backend.gpu_write(drm_file, off, data, caller)
                return r.then(_drm_error_to_fuse) if isinstance(r, Completion) else r
            if (attr := self._sys_fh.get(fh)) is not None:
                if attr.write is None:
                    raise FuseError(errno.EACCES)
                # Like a sysfs store(): each write() is one call with the text as written
                # (a trailing newline included).
                self._sys_text.pop(fh, None)
                attr.write(data.decode("utf-8", "replace"))
                return len(data)
        except DrmError as e:
            raise FuseError(e.errno) from None
        raise FuseError(errno.EINVAL)

    # -- directories -------------------------------------------------------------------------

    def opendir(self, ino: int, caller: Caller) -> int:
        node = self._nodes.get(ino)
        if not isinstance(node, _Dir):
            raise FuseError(errno.ENOTDIR)
        if ino == DMABUF_INO:
            raise FuseError(errno.EACCES)  # DESIGN: the directory cannot be listed
        if caller.uid != 0 and (node.hidden or not _others_may(node.mode, 4, caller)):
            raise FuseError(errno.EACCES)
        return 0

    def readdir(self, ino: int, fh: int, off: int) -> Iterable[DirEntry]:
        d = self._nodes.get(ino)
        if not isinstance(d, _Dir):
            raise FuseError(errno.ENOTDIR)
        # dmabuf/ has no children here: tokens are never listed.
        names: list[tuple[str, int]] = [(".", ino), ("..", d.parent), *d.children.items()]
        out = []
        for i in range(max(off, 0), len(names)):
            name, child = names[i]
            node = self._nodes[child]
            if isinstance(node, _Dir):
                mode = stat.S_IFDIR
            elif isinstance(node, _SysLink):
                mode = stat.S_IFLNK
            else:
                mode = stat.S_IFREG
            out.append((name, child, mode, i + 1))
        return out

    def readlink(self, ino: int, caller: Caller) -> bytes:
        node = self._nodes.get(ino)
        if not isinstance(node, _SysLink):
            raise FuseError(errno.EINVAL)  # readlink(2) of something not a link
        if node.hidden and caller.uid != 0:
            raise FuseError(errno.EACCES)
        return node.target

    def releasedir(self, ino: int, fh: int) -> None:
        pass

    # -- introspection (tests, ualinkctl) ----------------------------------------------------

    def open_handles(self) -> dict[str, int]:
        return {
            "render": len(self._render_fh),
            "dmabuf": len(self._dmabuf_fh),
            "kfd": len(self._kfd_fh),
            "sys": len(self._sys_fh),
        }
