"""DrmDevice: one emulated GPU's DRM device, and the kernel's ioctl dispatch rules (§2.1).

`DrmDevice.ioctl()` is drm_ioctl(): table lookup by nr only, copy-in of the intersection of
the user's and the table's IN bits zero-extended to max(user size, table size), the
permission check, the handler, and copy-out of the user's size whether the handler
succeeded or not. The core ioctls (GEM_CLOSE, GET_CAP, PRIME) live here too; the syncobj
ones in `syncobj.py`. The edge injects user-memory access and the wait primitive.
"""

from __future__ import annotations

import errno
import functools
import logging
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from ..abi import ioctls as tbl
from ..abi import structs as st
from ..abi.constants import (
    DRM_CAP_PRIME,
    DRM_CLOEXEC,
    DRM_PRIME_CAP_EXPORT,
    DRM_PRIME_CAP_IMPORT,
    DRM_RDWR,
)
from ..abi.ioc import IOC_READ, IOC_WRITE, ioc_dir, ioc_size
from .completion import Completion, Spawn, run_now
from .errors import DrmError
from .file import DrmFile
from .gem import DmaBuf, GemObject
from .syncobj import DrmSyncobj, EventFd, SyncobjIoctls, SyncWaits
from .tokens import DmaBufTokens

log = logging.getLogger(__name__)

DRM_CAP_TIMESTAMP_MONOTONIC = 0x6
DRM_CAP_SYNCOBJ = 0x13
DRM_CAP_SYNCOBJ_TIMELINE = 0x14
_reported_unemulated: set[int] = set()
# Out fields the core's handlers put in kdata, by the layouts' names.
_CAP_VALUE = st.GET_CAP.field("value")
_PRIME_FD = st.PRIME_HANDLE.field("fd")
_PRIME_HANDLE = st.PRIME_HANDLE.field("handle")


@dataclass(frozen=True, slots=True)
class Caller:
    """Who issued a request: the FUSE request context (fuse_req_ctx), as every layer sees it
    (fuse/backend.py re-exports it for the FUSE edge)."""

    pid: int
    uid: int
    gid: int = 0


# A handler works on the kernel buffer in place, like a drm_ioctl_t on kdata. One that must
# wait returns what finishes the work (and may raise DrmError) instead: a Completion (a
# remote import's answer), or a coroutine (it awaits the caller's memory or a wait), which
# `DrmDevice.ioctl` turns into one with the edge's Spawn.
Handler = Callable[[DrmFile, bytearray, Caller], Awaitable[None] | Completion[None] | None]
# User memory of the caller, for arrays behind ioctl pointers: awaitables (the edge does the
# access off the thread that serves FUSE, DESIGN "Restricted ioctls"); both raise
# DrmError(EFAULT) unless every byte was done.
CopyFromUser = Callable[[int, int, int], Awaitable[bytes]]  # (pid, address, size) -> bytes
CopyToUser = Callable[[int, int, bytes], Awaitable[None]]  # (pid, address, data)


# A piece of a vectored access to process memory: a buffer, or (fd, offset, length) of a
# file (a shared BO's memfd), which the access reads or writes on its side.
Segment = memoryview | tuple[int, int, int]


class ProcessMemory(Protocol):
    """One process's address space, held open for as long as a BO uses it: still that
    process after it exits (then nothing is accessible), never a later one with its pid.
    `accessible` counts the bytes from `address` mapped readable (writable, for a write);
    `read` gives the bytes up to the first page that is not (short, maybe empty), `write`
    stores up to there and gives the count; `readv`/`writev` do the same into / out of
    segments, the count moved. Awaitables, for the reason CopyFromUser is."""

    def accessible(self, address: int, size: int, write: bool) -> Awaitable[int]: ...
    def read(self, address: int, n: int) -> Awaitable[bytes]: ...
    def write(self, address: int, data: bytes) -> Awaitable[int]: ...
    # the same with the bytes moved straight into / out of the buffers (one copy)
    def readv(self, address: int, segments: list[Segment]) -> Awaitable[int]: ...
    def writev(self, address: int, segments: list[Segment]) -> Awaitable[int]: ...
    def close(self) -> None: ...


OpenProcessMemory = Callable[[int], ProcessMemory]  # a thread id -> its process's memory


@dataclass(frozen=True, slots=True)
class DriverVersion:
    """What DRM_IOCTL_VERSION reports (struct drm_driver's major..desc)."""

    major: int
    minor: int
    patchlevel: int
    name: str
    date: str
    desc: str


class DrmDriver(Protocol):
    """The driver half of a device (amdgpu implements it)."""

    ioctls: dict[tbl.IoctlSpec, Handler]  # tbl.bind(driver): its @handles methods
    version: DriverVersion
    # drm_getcap's answers past the render-only caps, from the driver's mode_config;
    # None for a driver without DRIVER_MODESET (those caps are then EOPNOTSUPP)
    kms_caps: dict[int, int] | None

    def gem_object_open(self, obj: GemObject, file: DrmFile) -> None: ...
    def gem_object_close(self, obj: GemObject, file: DrmFile) -> None: ...
    def gem_prime_export(self, obj: GemObject) -> DmaBuf: ...
    def gem_prime_import(self, buf: DmaBuf) -> GemObject: ...
    def postclose(self, file: DrmFile) -> None: ...


class IoctlResult(NamedTuple):
    """What dispatch produced: the result (0 / -errno), the bytes copied out, and the
    table entry (None when there was none) for the trace. (A NamedTuple, not a frozen
    dataclass: one is built per ioctl, and a frozen dataclass's __init__ sets each field
    through object.__setattr__, several times the cost.)"""

    result: int
    out: bytes
    spec: tbl.IoctlSpec | None
    kdata: bytes  # the kernel buffer after the handler (for tracing)


_new_tuple = tuple.__new__


class _Route(NamedTuple):
    """drm_ioctl's decisions for one whole ioctl number of a RENDER_ALLOW entry: they depend
    on the number and the (constant) kernel table only, so `DrmDevice.ioctl` makes them once
    per number. The handler is still looked up every time: the handler tables may change
    (tests swap in spies)."""

    spec: tbl.IoctlSpec
    core: bool  # the device's table (the core ioctls) rather than the driver's
    in_size: int
    out_size: int
    ksize: int


async def read_user(copy: CopyFromUser | None, caller: Caller, address: int,
                    size: int) -> bytes:
    """copy_from_user (the DRM's and the KFD's): all `size` bytes or DrmError(EFAULT). An
    awaitable: the daemon reaches the caller's memory off the FUSE thread, within a bound
    (callermem.py)."""
    if copy is None:
        raise DrmError(errno.EFAULT, "no user memory access")
    data = await copy(caller.pid, address, size)
    if len(data) != size:
        raise DrmError(errno.EFAULT, f"short read of user memory at {address:#x}")
    return data


async def write_user(copy: CopyToUser | None, caller: Caller, address: int,
                     data: bytes) -> None:
    """copy_to_user: all of `data` or DrmError(EFAULT) (an awaitable, as read_user)."""
    if copy is None:
        raise DrmError(errno.EFAULT, "no user memory access")
    await copy(caller.pid, address, data)


def finish(spec: tbl.IoctlSpec, kdata: bytearray, out_size: int,
           answered: Completion[None]) -> IoctlResult:
    """The end of an ioctl whose handler answered later (it awaited caller memory or a
    wait, or a remote import answered it): its errno, and the user's size copied back
    whether it failed or not (drm_ioctl's and kfd_ioctl's rule)."""
    try:
        answered.result()
    except DrmError as e:
        return _finished(-e.errno, spec, kdata, out_size)
    return _finished(0, spec, kdata, out_size)


def _finished(result: int, spec: tbl.IoctlSpec, kdata: bytearray, out_size: int
              ) -> IoctlResult:
    return IoctlResult(result, bytes(kdata[:out_size]), spec, bytes(kdata))


class DrmDevice:
    def __init__(
        self,
        minor: int,
        tokens: DmaBufTokens,
        resolve_fd: Callable[[int, int], DmaBuf],
        copy_from_user: CopyFromUser | None = None,
        copy_to_user: CopyToUser | None = None,
        waits: SyncWaits | None = None,
        open_process_memory: OpenProcessMemory | None = None,
        resolve_token_fd: Callable[[int, int], object] | None = None,
        open_eventfd: Callable[[int, int], EventFd] | None = None,
        spawn: Spawn[None] = run_now,
    ) -> None:
        self.minor = minor
        self.tokens = tokens
        self.resolve_fd = resolve_fd  # (pid, fd) -> DmaBuf; raises EBADF / EINVAL
        self.copy_from_user = copy_from_user
        self.copy_to_user = copy_to_user
        self.waits = waits  # None: a wait that would block is a bug (the daemon injects one)
        # Opens the address space of a calling thread's process for a BO that keeps using
        # it after the ioctl (userptr); None: no such access (EFAULT).
        self.open_process_memory = open_process_memory
        # (pid, fd) -> the token file behind a caller's fd (syncobj and sync files, for
        # SYNCOBJ_FD_TO_HANDLE); EBADF / EINVAL. None: no fd resolution.
        self.resolve_token_fd = resolve_token_fd
        # (pid, fd) -> the daemon's own reference to a caller's eventfd (EBADF, EINVAL)
        self.open_eventfd = open_eventfd
        # Runs a handler's coroutine to a Completion (the edge's tasks; run_now: no edge)
        self.spawn = spawn
        self.driver: DrmDriver = _NoDriver()
        self.objects: dict[int, GemObject] = {}
        self.files: set[DrmFile] = set()
        self._ids = 0
        self.syncobj = SyncobjIoctls(self)
        # The core ioctls' handlers: this device's and its syncobj half's @handles methods.
        self.handlers: dict[tbl.IoctlSpec, Handler] = {
            **tbl.bind(self), **tbl.bind(self.syncobj)}
        # Whole ioctl number -> its route to a handler (`ioctl`): one dict lookup per ioctl
        # instead of the table lookup, four _IOC_ field extractions and the handler's
        # lookup (with the NamedTuple results, an export of an exported BO in-process:
        # 7.2 -> 5.5 µs, 13 -> 8 Python calls in this method and below).
        self._routes: dict[int, _Route] = {}

    # -- the caller's memory (copy_from_user / copy_to_user) -------------------------------
    async def read_user(self, caller: Caller, address: int, size: int) -> bytes:
        return await read_user(self.copy_from_user, caller, address, size)

    async def write_user(self, caller: Caller, address: int, data: bytes) -> None:
        await write_user(self.copy_to_user, caller, address, data)

    def next_object_id(self) -> int:
        self._ids += 1
        return self._ids

    # -- files ----------------------------------------------------------------------------
    def open(self, pid: int = 0, uid: int = 0) -> DrmFile:
        f = DrmFile(self, pid, uid)
        self.files.add(f)
        return f

    def syncobj_changed(self, obj: DrmSyncobj) -> None:
        """A syncobj got a fence (or lost it): its waiters look again."""
        if self.waits is not None:
            self.waits.wake(obj)

    def file_closed(self, f: DrmFile) -> None:
        self.files.discard(f)
        self.tokens.drop_file(f)
        self.driver.postclose(f)  # drm_file_free → driver->postclose

    # -- dispatch (drm_ioctl) -----------------------------------------------------------------
    def ioctl(
        self, f: DrmFile, cmd: int, in_bytes: bytes, caller: Caller
    ) -> IoctlResult | Completion[IoctlResult]:
        route = self._routes.get(cmd) or self._route(cmd)
        if route is None:
            return self._ioctl_unrouted(f, cmd, in_bytes)
        spec, core, in_size, out_size, ksize = route
        handler = (self.handlers if core else self.driver.ioctls).get(spec)
        if handler is None:
            return self._ioctl_unrouted(f, cmd, in_bytes)
        if in_size == ksize == len(in_bytes):
            kdata = bytearray(in_bytes)
        else:
            kdata = bytearray(ksize)
            kdata[:in_size] = in_bytes[:in_size]
        try:
            pending = handler(f, kdata, caller)
        except DrmError as e:
            result = -e.errno
        else:
            if pending is not None:
                if not isinstance(pending, Completion):  # a coroutine: adapted here, once
                    pending = self.spawn(pending)
                return pending.then(functools.partial(finish, spec, kdata, out_size))
            result = 0
        after = bytes(kdata)  # (a handler may have resized it: out is cut from what it is)
        # tuple.__new__: the NamedTuple without its Python-level __new__ (a frame fewer).
        return _new_tuple(IoctlResult, (result, after if len(after) == out_size
                                        else after[:out_size], spec, after))

    def _sizes(self, cmd: int, spec: tbl.IoctlSpec) -> tuple[int, int, int]:
        """drm_ioctl's copy sizes: in and out are the user's size where the user's and the
        table's direction bits both say so; the kernel buffer is the largest of those and
        the table's size, zero-extended."""
        user_dir = ioc_dir(cmd)
        user_size = ioc_size(cmd)
        table_dir = ioc_dir(spec.cmd)
        in_size = user_size if user_dir & table_dir & IOC_WRITE else 0
        out_size = user_size if user_dir & table_dir & IOC_READ else 0
        return in_size, out_size, max(in_size, out_size, ioc_size(spec.cmd))

    def _handler(self, spec: tbl.IoctlSpec) -> Handler | None:
        return (self.handlers if spec.core else self.driver.ioctls).get(spec)

    def _route(self, cmd: int) -> _Route | None:
        """The route of `cmd` when its entry is RENDER_ALLOW (remembered), else None."""
        spec = tbl.lookup(cmd & 0xFF)
        if spec is None or not spec.flags & tbl.DRM_RENDER_ALLOW:
            return None
        if len(self._routes) >= 4096:  # numbers are the caller's to choose: stay bounded
            self._routes.clear()
        route = self._routes[cmd] = _Route(spec, spec.core, *self._sizes(cmd, spec))
        return route

    def _ioctl_unrouted(self, f: DrmFile, cmd: int, in_bytes: bytes) -> IoctlResult:
        """An ioctl that ends before any handler: no entry (EINVAL), an entry ualinkd does
        not emulate (ENOTTY), or one a render client may not call (EACCES, its buffer
        still copied in and back as drm_ioctl does)."""
        nr = cmd & 0xFF
        spec = tbl.lookup(nr)
        if spec is None:
            return IoctlResult(-errno.EINVAL, b"", None, b"")
        in_size, out_size, ksize = self._sizes(cmd, spec)
        if self._handler(spec) is None and spec.flags & tbl.DRM_RENDER_ALLOW:
            # The kernel has it, ualinkd does not emulate it: say so (once) rather than fake it.
            if nr not in _reported_unemulated:
                _reported_unemulated.add(nr)
                log.info("ioctl %s (nr 0x%02x) is not emulated: ENOTTY", spec.name, nr)
            return IoctlResult(-errno.ENOTTY, b"", spec, b"")
        assert not spec.flags & tbl.DRM_RENDER_ALLOW
        kdata = bytearray(ksize)
        kdata[:in_size] = in_bytes[:in_size]
        # drm_ioctl_permit: render clients need RENDER_ALLOW
        return IoctlResult(-errno.EACCES, bytes(kdata[:out_size]), spec, bytes(kdata))

    # -- core handlers ---------------------------------------------------------------------
    @tbl.handles(tbl.GEM_CLOSE)
    def _gem_close(self, f: DrmFile, kdata: bytearray, caller: Caller) -> None:
        args = st.GEM_CLOSE.decode(kdata[: st.GEM_CLOSE.size])
        f.handle_delete(args.handle)

    @tbl.handles(tbl.VERSION)
    async def _version(self, f: DrmFile, kdata: bytearray, caller: Caller) -> None:
        """drm_version: the driver's numbers, then name, date, desc by drm_copy_field: each
        copies min(strlen, the caller's length) bytes (no NUL) to the caller's buffer when
        that is non-zero and the buffer non-NULL, and always reports the full length (1);
        a copy that faults ends the ioctl with EFAULT, the lengths already set still copied
        back (2), the later fields untouched."""
        v = st.DRM_VERSION.decode(bytes(kdata[: st.DRM_VERSION.size]))
        drv = self.driver.version
        struct.pack_into("<iii", kdata, 0, drv.major, drv.minor, drv.patchlevel)
        for at, (buf, user_len), value in zip(
            (st.DRM_VERSION.offsets["name_len"], st.DRM_VERSION.offsets["date_len"],
             st.DRM_VERSION.offsets["desc_len"]),
            ((v.name, v.name_len), (v.date, v.date_len), (v.desc, v.desc_len)),
            (drv.name, drv.date, drv.desc), strict=True,
        ):
            text = value.encode()
            n = min(len(text), user_len)
            struct.pack_into("<Q", kdata, at, len(text))  # 1
            if n and buf:
                await self.write_user(caller, buf, text[:n])  # 2

    @tbl.handles(tbl.GET_CAP)
    def _get_cap(self, f: DrmFile, kdata: bytearray, caller: Caller) -> None:
        """drm_getcap: first the caps any driver answers (PRIME import|export, a monotonic
        timestamp, SYNCOBJ / SYNCOBJ_TIMELINE: amdgpu has DRIVER_SYNCOBJ and
        DRIVER_SYNCOBJ_TIMELINE), then, for a DRIVER_MODESET driver, the KMS caps from its
        mode_config (`DrmDriver.kms_caps`); a cap neither knows is EINVAL."""
        args = st.GET_CAP.decode(kdata[: st.GET_CAP.size])
        if args.capability == DRM_CAP_PRIME:
            value = DRM_PRIME_CAP_IMPORT | DRM_PRIME_CAP_EXPORT
        elif args.capability in (DRM_CAP_TIMESTAMP_MONOTONIC, DRM_CAP_SYNCOBJ,
                                 DRM_CAP_SYNCOBJ_TIMELINE):
            value = 1
        else:
            kms = self.driver.kms_caps
            if kms is None:
                raise DrmError(errno.EOPNOTSUPP, f"capability {args.capability:#x}: not a "
                               "KMS driver")
            known = kms.get(args.capability)
            if known is None:
                raise DrmError(errno.EINVAL, f"no capability {args.capability:#x}")
            value = known
        _CAP_VALUE.put(kdata, value)

    def prime_handle_to_dmabuf(self, f: DrmFile, handle: int) -> DmaBuf:
        """drm_gem_prime_handle_to_dmabuf: a *new* reference to the handle's dma-buf,
        exporting (and caching on the object) on first use."""
        obj = f.lookup(handle)
        if obj is None or obj.handle_count == 0:
            raise DrmError(errno.ENOENT, f"no GEM handle {handle}")
        cached = f.prime_by_handle.get(handle)
        if cached is not None:
            cached.get()
            return cached
        if obj.import_buf is not None:  # an import exports the dma-buf it imports
            buf = obj.import_buf
            buf.get()
        elif obj.dma_buf is not None:
            buf = obj.dma_buf
            buf.get()
        else:
            buf = self.driver.gem_prime_export(obj)  # may raise EPERM
            buf.get()
            obj.dma_buf = buf  # the object's cache keeps one reference
        f.prime_add(buf, handle)
        return buf

    @tbl.handles(tbl.PRIME_HANDLE_TO_FD)
    def _prime_handle_to_fd(self, f: DrmFile, kdata: bytearray, caller: Caller) -> None:
        args = st.PRIME_HANDLE.decode(kdata[: st.PRIME_HANDLE.size])
        if args.flags & ~(DRM_CLOEXEC | DRM_RDWR):
            raise DrmError(errno.EINVAL, f"PRIME flags {args.flags:#x}")
        buf = self.prime_handle_to_dmabuf(f, args.handle)
        token = self.tokens.install(buf, f, caller.uid)  # takes over our reference
        _PRIME_FD.put(kdata, token)

    def prime_fd_to_handle(self, f: DrmFile, buf: DmaBuf) -> int:
        """drm_gem_prime_fd_to_handle for an already resolved dma-buf."""
        handle = f.prime_by_buf.get(buf.id)
        if handle is not None:
            return handle
        obj = self.driver.gem_prime_import(buf)  # returns a new reference
        handle = f.handle_create(obj)
        if obj.dma_buf is None and obj is buf.obj:
            buf.get()
            obj.dma_buf = buf
        f.prime_add(buf, handle)
        obj.put()
        return handle

    @tbl.handles(tbl.PRIME_FD_TO_HANDLE)
    def _prime_fd_to_handle(self, f: DrmFile, kdata: bytearray, caller: Caller) -> None:
        args = st.PRIME_HANDLE.decode(kdata[: st.PRIME_HANDLE.size])
        buf = self.resolve_fd(caller.pid, args.fd)
        _PRIME_HANDLE.put(kdata, self.prime_fd_to_handle(f, buf))


class _NoDriver:
    ioctls: dict[tbl.IoctlSpec, Handler] = {}
    version = DriverVersion(0, 0, 0, "", "", "")
    kms_caps: dict[int, int] | None = None

    def gem_object_open(self, obj: GemObject, file: DrmFile) -> None:
        pass

    def gem_object_close(self, obj: GemObject, file: DrmFile) -> None:
        pass

    def gem_prime_export(self, obj: GemObject) -> DmaBuf:
        return DmaBuf(obj)

    def gem_prime_import(self, buf: DmaBuf) -> GemObject:
        raise DrmError(errno.EINVAL)

    def postclose(self, file: DrmFile) -> None:
        pass
