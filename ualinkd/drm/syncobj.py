"""DRM syncobjs (drm_syncobj.c): the per-file handle table, the core ioctls, and waits.

The emulated GPU finishes its work the moment it is asked, so every fence is already
signaled when it is attached: a syncobj's state is only which fence it holds — none, a
plain fence (CREATE_SIGNALED, SIGNAL), or a timeline chain whose head is at some point
(TIMELINE_SIGNAL, GEM_VA's timeline out). "Submitted" and "signaled" are the same thing here.

A wait that is not satisfied at once becomes an awaitable built on the injected `SyncWaits`
(the trio edge implements it; this layer never imports trio). Attaching a fence to a syncobj
wakes whoever waits on it. Arrays behind user pointers are read and written through the
device's injected copy_from_user / copy_to_user (EFAULT on a bad pointer); those are
awaitables, so every ioctl with an array answers from a coroutine. Each copies its arrays in
before it looks anything up and changes nothing before its last copy in, as the kernel does,
so other requests served while a copy is in flight see no half-done ioctl.
"""

from __future__ import annotations

import errno
import struct
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ..abi import constants as c
from ..abi import ioctls as tbl
from ..abi import structs as st
from .errors import DrmError
from .idr import HandleIdr

if TYPE_CHECKING:
    from .device import Caller, DrmDevice
    from .file import DrmFile

INT64_MAX = (1 << 63) - 1
# kmalloc_array of the syncobj pointers fails beyond KMALLOC_MAX_SIZE (4 MiB): ENOMEM.
MAX_HANDLES = (4 << 20) // 8
# Out fields the handlers put in kdata, by the layouts' names.
_CREATE_HANDLE = st.SYNCOBJ_CREATE.field("handle")
_SYNCOBJ_FD = st.SYNCOBJ_HANDLE.field("fd")
_SYNCOBJ_HANDLE = st.SYNCOBJ_HANDLE.field("handle")
_WAIT_FIRST = st.SYNCOBJ_WAIT.field("first_signaled")
_TIMELINE_WAIT_FIRST = st.SYNCOBJ_TIMELINE_WAIT.field("first_signaled")

_WAIT_FLAGS = (c.DRM_SYNCOBJ_WAIT_FLAGS_WAIT_ALL | c.DRM_SYNCOBJ_WAIT_FLAGS_WAIT_FOR_SUBMIT
               | c.DRM_SYNCOBJ_WAIT_FLAGS_WAIT_DEADLINE)
_TIMELINE_WAIT_FLAGS = _WAIT_FLAGS | c.DRM_SYNCOBJ_WAIT_FLAGS_WAIT_AVAILABLE


class SyncWaits(Protocol):
    """What a blocking wait needs from the edge (the daemon implements it with trio).

    `now_ns()` is CLOCK_MONOTONIC in ns, the clock of the ioctls' absolute timeouts.
    `wait_until(deadline_ns, ready, keys)` re-evaluates `ready()` whenever one of `keys` is
    woken and finishes with True once it holds, or with `ready()`'s last answer at the
    deadline (None: no deadline). `wake(key)` wakes the waiters of `key`.
    """

    def now_ns(self) -> int: ...
    def wait_until(
        self, deadline_ns: int | None, ready: Callable[[], bool], keys: Iterable[object]
    ) -> Awaitable[bool]: ...
    def wake(self, key: object) -> None: ...


@dataclass(frozen=True, slots=True)
class Fence:
    """A fence held by a syncobj: a plain one (`chain` False, point 0) or the head of a
    dma_fence_chain at `point`. Always signaled in this emulator."""

    point: int
    chain: bool


STUB = Fence(0, False)  # dma_fence_get_stub()


class EventFd(Protocol):
    """The daemon's own reference to a caller's eventfd (the edge duplicates the fd)."""

    def signal(self) -> None: ...  # eventfd_signal: add 1 to the counter
    def close(self) -> None: ...


# Pending SYNCOBJ_EVENTFD entries per syncobj: each holds a duplicated fd in the daemon, so
# a client cannot exhaust the daemon's fds through them (the kernel has no cap: ENOMEM).
MAX_EVENTFDS_PER_SYNCOBJ = 256


@dataclass(slots=True)
class _EventfdEntry:
    eventfd: EventFd
    point: int


class DrmSyncobj:
    """One syncobj, shared by every handle to it (in any file) and every syncobj file:
    `refs` counts those (drm_syncobj's kref); at 0 its pending eventfds are released."""

    __slots__ = ("_changed", "_eventfds", "fence", "refs")

    def __init__(self, changed: Callable[[DrmSyncobj], None], fence: Fence | None = None):
        self.fence = fence
        self._changed = changed
        self.refs = 1
        self._eventfds: list[_EventfdEntry] = []

    def get(self) -> None:
        self.refs += 1

    def put(self) -> None:
        self.refs -= 1
        if self.refs == 0:  # drm_syncobj_free: pending eventfd entries go with it
            for entry in self._eventfds:
                entry.eventfd.close()
            self._eventfds.clear()

    def replace_fence(self, fence: Fence | None) -> None:
        """drm_syncobj_replace_fence: waiters and eventfds look again (a NULL fence
        satisfies none)."""
        self.fence = fence
        self._changed(self)
        if self._eventfds:
            self._eventfds = [e for e in self._eventfds if not self._fire(e)]

    def _fire(self, entry: _EventfdEntry) -> bool:
        """syncobj_eventfd_entry_func: once a fence exists for the entry's point it is
        signaled (here every fence is), so the eventfd is signaled and the entry done."""
        if not self.has_point(entry.point):
            return False
        entry.eventfd.signal()
        entry.eventfd.close()
        return True

    def add_eventfd(self, eventfd: EventFd, point: int) -> None:
        """drm_syncobj_add_eventfd: checked at once, else when a fence arrives."""
        entry = _EventfdEntry(eventfd, point)
        if self._fire(entry):
            return
        if len(self._eventfds) >= MAX_EVENTFDS_PER_SYNCOBJ:
            eventfd.close()
            raise DrmError(errno.ENOMEM, "too many eventfds wait on this syncobj")
        self._eventfds.append(entry)

    @property
    def pending_eventfds(self) -> int:
        return len(self._eventfds)

    def add_point(self, point: int) -> None:
        """drm_syncobj_add_point with a signaled fence: a chain node on top of the old fence.
        dma_fence_chain_init keeps a timeline monotonic: a point at or below the previous
        chain head leaves the head's seqno (an "unordered point"); on a plain fence or none
        the chain simply starts at `point`."""
        prev = self.fence
        seqno = max(point, prev.point) if prev is not None and prev.chain else point
        self.replace_fence(Fence(seqno, True))

    def has_point(self, point: int) -> bool:
        """A fence exists for `point` (drm_syncobj_fence_get + dma_fence_chain_find_seqno):
        point 0 asks for any fence; a later point needs a chain that has reached it."""
        fence = self.fence
        if fence is None:
            return False
        return point == 0 or (fence.chain and fence.point >= point)

    def fence_at(self, point: int) -> Fence | None:
        """drm_syncobj_find_fence's fence for `point` (None: no fence for it). Point 0 is the
        fence itself; a later point's chain link is signaled, so dma_fence_chain_find_seqno
        walks past it and the caller gets the stub."""
        if not self.has_point(point):
            return None
        return self.fence if point == 0 else STUB

    def query(self) -> int:
        """SYNCOBJ_QUERY: the last signaled point of a chain (all of it is signaled here,
        so with or without LAST_SUBMITTED: the head's seqno); 0 for a plain fence or none."""
        fence = self.fence
        return fence.point if fence is not None and fence.chain else 0


class SyncobjFile:
    """What SYNCOBJ_HANDLE_TO_FD hands out (the kernel's "syncobj_file"): a token file of
    the dma-buf token namespace holding one reference to the syncobj. size 0."""

    __slots__ = ("refcount", "syncobj")
    size = 0

    def __init__(self, syncobj: DrmSyncobj) -> None:
        syncobj.get()
        self.syncobj = syncobj
        self.refcount = 1

    def get(self) -> None:
        self.refcount += 1

    def put(self) -> None:
        self.refcount -= 1
        if self.refcount == 0:
            self.syncobj.put()


class SyncFile:
    """A sync_file (EXPORT_SYNC_FILE): one fence, signaled like all of them. size 0."""

    __slots__ = ("fence", "refcount")
    size = 0

    def __init__(self, fence: Fence) -> None:
        self.fence = fence
        self.refcount = 1

    def get(self) -> None:
        self.refcount += 1

    def put(self) -> None:
        self.refcount -= 1


class SyncobjTable:
    """A file's syncobj handles: lowest free from 1 (idr_alloc(…, 1, 0)), never 0."""

    def __init__(self, changed: Callable[[DrmSyncobj], None]) -> None:
        self._changed = changed
        self._objs: dict[int, DrmSyncobj] = {}
        self._idr = HandleIdr()

    def __len__(self) -> int:
        return len(self._objs)

    def create(self, signaled: bool) -> int:
        obj = DrmSyncobj(self._changed, STUB if signaled else None)
        handle = self.install(obj)
        obj.put()  # the handle holds its own reference
        return handle

    def install(self, obj: DrmSyncobj) -> int:
        """A new handle to `obj` taking its own reference (drm_syncobj_get + idr_alloc)."""
        handle = self._idr.alloc()
        obj.get()
        self._objs[handle] = obj
        return handle

    def find(self, handle: int) -> DrmSyncobj | None:
        return self._objs.get(handle)

    def destroy(self, handle: int) -> None:
        """drm_syncobj_destroy: unknown handle → EINVAL. A waiter keeps its reference."""
        obj = self._objs.pop(handle, None)
        if obj is None:
            raise DrmError(errno.EINVAL, f"no syncobj {handle}")
        self._idr.remove(handle)
        obj.put()

    def release(self) -> None:
        for obj in self._objs.values():
            obj.put()
        self._objs.clear()
        self._idr.clear()


# ---- the ioctls ----------------------------------------------------------------------------


def timeout_expired(timeout_nsec: int, now_ns: int) -> bool:
    """drm_timeout_abs_to_jiffies: 0 polls, a time at or before now polls; else wait."""
    return timeout_nsec <= now_ns


class SyncobjIoctls:
    """The core syncobj ioctl handlers of one DrmDevice. The device's `copy_from_user`,
    `copy_to_user` and `waits` are read at call time (the node wires them after creation)."""

    def __init__(self, device: DrmDevice) -> None:
        self.device = device

    # -- user memory --------------------------------------------------------------------------
    async def read_user(self, caller: Caller, address: int, size: int) -> bytes:
        return await self.device.read_user(caller, address, size)

    async def write_user(self, caller: Caller, address: int, data: bytes) -> None:
        await self.device.write_user(caller, address, data)

    async def read_u32s(self, caller: Caller, address: int, count: int) -> tuple[int, ...]:
        return struct.unpack(f"<{count}I", await self.read_user(caller, address, 4 * count))

    async def read_u64s(self, caller: Caller, address: int, count: int) -> tuple[int, ...]:
        return struct.unpack(f"<{count}Q", await self.read_user(caller, address, 8 * count))

    async def array_find(
        self, f: DrmFile, caller: Caller, address: int, count: int
    ) -> list[DrmSyncobj]:
        """drm_syncobj_array_find: copy the handles in (EFAULT), each must exist (ENOENT)."""
        if count > MAX_HANDLES:
            raise DrmError(errno.ENOMEM, f"{count} syncobj handles")
        objs = []
        for handle in await self.read_u32s(caller, address, count):
            obj = f.syncobjs.find(handle)
            if obj is None:
                raise DrmError(errno.ENOENT, f"no syncobj {handle}")
            objs.append(obj)
        return objs

    # -- CREATE / DESTROY ---------------------------------------------------------------------
    @tbl.handles(tbl.SYNCOBJ_CREATE)
    def create_ioctl(self, f: DrmFile, kdata: bytearray, caller: Caller) -> None:
        args = st.SYNCOBJ_CREATE.decode(bytes(kdata[: st.SYNCOBJ_CREATE.size]))
        if args.flags & ~c.DRM_SYNCOBJ_CREATE_SIGNALED:
            raise DrmError(errno.EINVAL, f"SYNCOBJ_CREATE flags {args.flags:#x}")
        handle = f.syncobjs.create(bool(args.flags & c.DRM_SYNCOBJ_CREATE_SIGNALED))
        _CREATE_HANDLE.put(kdata, handle)

    @tbl.handles(tbl.SYNCOBJ_DESTROY)
    def destroy_ioctl(self, f: DrmFile, kdata: bytearray, caller: Caller) -> None:
        args = st.SYNCOBJ_DESTROY.decode(bytes(kdata[: st.SYNCOBJ_DESTROY.size]))
        if args.pad:
            raise DrmError(errno.EINVAL, "SYNCOBJ_DESTROY pad must be 0")
        f.syncobjs.destroy(args.handle)

    # -- RESET / SIGNAL / TIMELINE_SIGNAL -----------------------------------------------------
    async def _array(self, f: DrmFile, kdata: bytearray, caller: Caller) -> list[DrmSyncobj]:
        args = st.SYNCOBJ_ARRAY.decode(bytes(kdata[: st.SYNCOBJ_ARRAY.size]))
        if args.pad:
            raise DrmError(errno.EINVAL, "syncobj array pad must be 0")
        if args.count_handles == 0:
            raise DrmError(errno.EINVAL, "no syncobj handles")
        return await self.array_find(f, caller, args.handles, args.count_handles)

    @tbl.handles(tbl.SYNCOBJ_RESET)
    async def reset_ioctl(self, f: DrmFile, kdata: bytearray, caller: Caller) -> None:
        for obj in await self._array(f, kdata, caller):
            obj.replace_fence(None)

    @tbl.handles(tbl.SYNCOBJ_SIGNAL)
    async def signal_ioctl(self, f: DrmFile, kdata: bytearray, caller: Caller) -> None:
        for obj in await self._array(f, kdata, caller):
            obj.replace_fence(STUB)  # drm_syncobj_assign_null_handle

    @tbl.handles(tbl.SYNCOBJ_TIMELINE_SIGNAL)
    async def timeline_signal_ioctl(self, f: DrmFile, kdata: bytearray, caller: Caller) -> None:
        """Flags must be 0; a NULL `points` signals every syncobj at point 0. The points are
        read before any syncobj changes (older kernels' copy; newer ones fault part-way)."""
        args = st.SYNCOBJ_TIMELINE_ARRAY.decode(bytes(kdata[: st.SYNCOBJ_TIMELINE_ARRAY.size]))
        if args.flags:
            raise DrmError(errno.EINVAL, f"TIMELINE_SIGNAL flags {args.flags:#x}")
        if args.count_handles == 0:
            raise DrmError(errno.EINVAL, "no syncobj handles")
        objs = await self.array_find(f, caller, args.handles, args.count_handles)
        points = (await self.read_u64s(caller, args.points, len(objs)) if args.points
                  else (0,) * len(objs))
        for obj, point in zip(objs, points, strict=True):
            obj.add_point(point)

    # -- QUERY ------------------------------------------------------------------------------------
    @tbl.handles(tbl.SYNCOBJ_QUERY)
    async def query_ioctl(self, f: DrmFile, kdata: bytearray, caller: Caller) -> None:
        args = st.SYNCOBJ_TIMELINE_ARRAY.decode(bytes(kdata[: st.SYNCOBJ_TIMELINE_ARRAY.size]))
        if args.flags & ~c.DRM_SYNCOBJ_QUERY_FLAGS_LAST_SUBMITTED:
            raise DrmError(errno.EINVAL, f"SYNCOBJ_QUERY flags {args.flags:#x}")
        if args.count_handles == 0:
            raise DrmError(errno.EINVAL, "no syncobj handles")
        objs = await self.array_find(f, caller, args.handles, args.count_handles)
        points = [obj.query() for obj in objs]
        await self.write_user(caller, args.points, struct.pack(f"<{len(points)}Q", *points))

    # -- WAIT / TIMELINE_WAIT ---------------------------------------------------------------------
    @tbl.handles(tbl.SYNCOBJ_WAIT)
    async def wait_ioctl(self, f: DrmFile, kdata: bytearray, caller: Caller) -> None:
        args = st.SYNCOBJ_WAIT.decode(bytes(kdata[: st.SYNCOBJ_WAIT.size]))
        if args.flags & ~_WAIT_FLAGS:  # WAIT_AVAILABLE is for timeline waits only
            raise DrmError(errno.EINVAL, f"SYNCOBJ_WAIT flags {args.flags:#x}")
        if args.count_handles == 0:
            raise DrmError(errno.EINVAL, "no syncobj handles")
        objs = await self.array_find(f, caller, args.handles, args.count_handles)
        pending = self._wait(objs, [0] * len(objs), args.flags, args.timeout_nsec, kdata,
                             _WAIT_FIRST)
        if pending is not None:
            await pending

    @tbl.handles(tbl.SYNCOBJ_TIMELINE_WAIT)
    async def timeline_wait_ioctl(self, f: DrmFile, kdata: bytearray, caller: Caller) -> None:
        args = st.SYNCOBJ_TIMELINE_WAIT.decode(bytes(kdata[: st.SYNCOBJ_TIMELINE_WAIT.size]))
        if args.flags & ~_TIMELINE_WAIT_FLAGS:
            raise DrmError(errno.EINVAL, f"SYNCOBJ_TIMELINE_WAIT flags {args.flags:#x}")
        if args.count_handles == 0:
            raise DrmError(errno.EINVAL, "no syncobj handles")
        objs = await self.array_find(f, caller, args.handles, args.count_handles)
        points = (list(await self.read_u64s(caller, args.points, len(objs))) if args.points
                  else [0] * len(objs))
        pending = self._wait(objs, points, args.flags, args.timeout_nsec, kdata,
                             _TIMELINE_WAIT_FIRST)
        if pending is not None:
            await pending

    def _wait(
        self, objs: list[DrmSyncobj], points: list[int], flags: int, timeout_nsec: int,
        kdata: bytearray, first_signaled: st.FieldAt,
    ) -> Awaitable[None] | None:
        """drm_syncobj_array_wait_timeout. A syncobj with no fence for its point fails with
        EINVAL unless WAIT_FOR_SUBMIT (or WAIT_AVAILABLE) lets the wait see one arrive. Every
        fence is signaled on arrival, so an entry is done once its point has a fence.
        `first_signaled` starts at ~0, is set by the first pass to the first entry already
        done and, for WAIT_ANY, by the entry that finished the wait."""
        wait_all = bool(flags & c.DRM_SYNCOBJ_WAIT_FLAGS_WAIT_ALL)
        may_wait_for_submit = bool(flags & (c.DRM_SYNCOBJ_WAIT_FLAGS_WAIT_FOR_SUBMIT
                                            | c.DRM_SYNCOBJ_WAIT_FLAGS_WAIT_AVAILABLE))
        done = [obj.has_point(p) for obj, p in zip(objs, points, strict=True)]
        if not all(done) and not may_wait_for_submit:
            raise DrmError(errno.EINVAL, "a syncobj has no fence (and no WAIT_FOR_SUBMIT)")
        first = next((i for i, d in enumerate(done) if d), 0xFFFFFFFF)

        def finish(index: int) -> None:
            first_signaled.put(kdata, index)

        if all(done) or (any(done) and not wait_all):
            finish(first)
            return None
        waits = self.device.waits
        now = waits.now_ns() if waits is not None else time.monotonic_ns()
        if timeout_expired(timeout_nsec, now):
            raise DrmError(errno.ETIME, "syncobj wait timed out")
        if waits is None:
            raise RuntimeError("a blocking syncobj wait needs the edge's SyncWaits")
        # Only WAIT_FOR_SUBMIT waiters see fences that arrive later (drm_syncobj_fence_add_wait);
        # the rest already hold fences, and ours are all signaled, so they are done above.
        deadline = None if timeout_nsec >= INT64_MAX else timeout_nsec
        signaled_by: list[int] = []

        def ready() -> bool:
            for i, (obj, p) in enumerate(zip(objs, points, strict=True)):
                if not done[i] and obj.has_point(p):
                    done[i] = True  # the waiter captured this fence: a later reset is moot
                    if not wait_all and not signaled_by:
                        signaled_by.append(i)
            return all(done) if wait_all else bool(signaled_by)

        async def wait() -> None:
            if not await waits.wait_until(deadline, ready, objs):
                raise DrmError(errno.ETIME, "syncobj wait timed out")
            finish(signaled_by[0] if signaled_by else first)

        return wait()

    # -- sharing through fds: HANDLE_TO_FD / FD_TO_HANDLE / TRANSFER / EVENTFD ---------------------
    # The fd field of HANDLE_TO_FD carries a token of the dma-buf token namespace (opened at
    # <mount>/dmabuf/<token>, as PRIME's); FD_TO_HANDLE and EVENTFD take a real fd of the
    # caller, resolved through /proc by the edge.

    @tbl.handles(tbl.SYNCOBJ_HANDLE_TO_FD)
    def handle_to_fd_ioctl(self, f: DrmFile, kdata: bytearray, caller: Caller) -> None:
        """drm_syncobj_handle_to_fd_ioctl: pad ≠ 0 (1) or flags other than 0 /
        EXPORT_SYNC_FILE (2) → EINVAL. A syncobj file: unknown handle → EINVAL (3).
        EXPORT_SYNC_FILE (drm_syncobj_export_sync_file): unknown handle → ENOENT (4), no
        fence → EINVAL (5), else a sync file of that fence. The fd is the token (6)."""
        args = st.SYNCOBJ_HANDLE.decode(bytes(kdata[: st.SYNCOBJ_HANDLE.size]))
        if args.pad:  # 1
            raise DrmError(errno.EINVAL, "SYNCOBJ_HANDLE_TO_FD pad must be 0")
        if args.flags not in (0, c.DRM_SYNCOBJ_HANDLE_TO_FD_FLAGS_EXPORT_SYNC_FILE):  # 2
            raise DrmError(errno.EINVAL, f"SYNCOBJ_HANDLE_TO_FD flags {args.flags:#x}")
        obj = f.syncobjs.find(args.handle)
        shared: SyncobjFile | SyncFile
        if not args.flags:
            if obj is None:  # 3
                raise DrmError(errno.EINVAL, f"no syncobj {args.handle}")
            shared = SyncobjFile(obj)
        else:
            if obj is None:  # 4
                raise DrmError(errno.ENOENT, f"no syncobj {args.handle}")
            fence = obj.fence_at(0)
            if fence is None:  # 5
                raise DrmError(errno.EINVAL, f"syncobj {args.handle} has no fence")
            shared = SyncFile(fence)
        token = self.device.tokens.install(shared, f, caller.uid)  # 6 (EMFILE when full)
        _SYNCOBJ_FD.put(kdata, token)

    @tbl.handles(tbl.SYNCOBJ_FD_TO_HANDLE)
    def fd_to_handle_ioctl(self, f: DrmFile, kdata: bytearray, caller: Caller) -> None:
        """drm_syncobj_fd_to_handle_ioctl: pad ≠ 0 (1) or flags other than 0 /
        IMPORT_SYNC_FILE (2) → EINVAL. Without flags the fd must be a syncobj file (any
        other fd, or none: EINVAL) and a new handle to its syncobj comes back (3).
        IMPORT_SYNC_FILE: the fd must be a sync file (else EINVAL) (4), the handle an
        existing syncobj (else ENOENT) (5), which then holds the sync file's fence (6)."""
        args = st.SYNCOBJ_HANDLE.decode(bytes(kdata[: st.SYNCOBJ_HANDLE.size]))
        if args.pad:  # 1
            raise DrmError(errno.EINVAL, "SYNCOBJ_FD_TO_HANDLE pad must be 0")
        if args.flags not in (0, c.DRM_SYNCOBJ_FD_TO_HANDLE_FLAGS_IMPORT_SYNC_FILE):  # 2
            raise DrmError(errno.EINVAL, f"SYNCOBJ_FD_TO_HANDLE flags {args.flags:#x}")
        shared = self._resolve(caller, args.fd)
        if not args.flags:
            if not isinstance(shared, SyncobjFile):  # 3
                raise DrmError(errno.EINVAL, f"fd {args.fd} is not a syncobj file")
            handle = f.syncobjs.install(shared.syncobj)
            _SYNCOBJ_HANDLE.put(kdata, handle)
            return
        if not isinstance(shared, SyncFile):  # 4
            raise DrmError(errno.EINVAL, f"fd {args.fd} is not a sync file")
        obj = f.syncobjs.find(args.handle)
        if obj is None:  # 5
            raise DrmError(errno.ENOENT, f"no syncobj {args.handle}")
        obj.replace_fence(shared.fence)  # 6

    def _resolve(self, caller: Caller, fd: int) -> object:
        """The token file behind the caller's fd; fdget failing is EINVAL here too."""
        resolve = self.device.resolve_token_fd
        if resolve is None:
            raise DrmError(errno.EINVAL, "no fd resolution")
        try:
            return resolve(caller.pid, fd)
        except DrmError as e:
            if e.errno == errno.EBADF:
                raise DrmError(errno.EINVAL, f"no fd {fd}") from None
            raise

    @tbl.handles(tbl.SYNCOBJ_TRANSFER)
    def transfer_ioctl(
        self, f: DrmFile, kdata: bytearray, caller: Caller
    ) -> Awaitable[None] | None:
        """drm_syncobj_transfer_ioctl: pad ≠ 0 → EINVAL (1); flags other than
        WAIT_FOR_SUBMIT → EINVAL (2); an unknown destination (3) or source (4) → ENOENT;
        the source's fence for src_point (5): none → EINVAL, unless WAIT_FOR_SUBMIT waits
        up to 5 s for one (ETIME); then dst_point ≠ 0 adds it to the destination's
        timeline at dst_point, dst_point 0 replaces the destination's fence (6)."""
        args = st.SYNCOBJ_TRANSFER.decode(bytes(kdata[: st.SYNCOBJ_TRANSFER.size]))
        if args.pad:  # 1
            raise DrmError(errno.EINVAL, "SYNCOBJ_TRANSFER pad must be 0")
        if args.flags & ~c.DRM_SYNCOBJ_WAIT_FLAGS_WAIT_FOR_SUBMIT:  # 2
            raise DrmError(errno.EINVAL, f"SYNCOBJ_TRANSFER flags {args.flags:#x}")
        dst = f.syncobjs.find(args.dst_handle)
        if dst is None:  # 3
            raise DrmError(errno.ENOENT, f"no syncobj {args.dst_handle}")
        src = f.syncobjs.find(args.src_handle)
        if src is None:  # 4
            raise DrmError(errno.ENOENT, f"no syncobj {args.src_handle}")

        def finish() -> None:  # 6
            fence = src.fence_at(args.src_point)
            assert fence is not None
            if args.dst_point:
                dst.add_point(args.dst_point)  # dma_fence_unwrap_merge: a plain fence
            else:
                dst.replace_fence(fence)

        if src.has_point(args.src_point):  # 5
            finish()
            return None
        if not args.flags & c.DRM_SYNCOBJ_WAIT_FLAGS_WAIT_FOR_SUBMIT:
            raise DrmError(errno.EINVAL, "SYNCOBJ_TRANSFER: no fence for the source point")
        waits = self.device.waits
        if waits is None:
            raise RuntimeError("a blocking syncobj wait needs the edge's SyncWaits")
        deadline = waits.now_ns() + WAIT_FOR_SUBMIT_TIMEOUT_NS

        async def wait() -> None:
            if not await waits.wait_until(deadline, lambda: src.has_point(args.src_point),
                                          [src]):
                raise DrmError(errno.ETIME, "SYNCOBJ_TRANSFER: no fence was submitted")
            finish()

        return wait()

    @tbl.handles(tbl.SYNCOBJ_EVENTFD)
    def eventfd_ioctl(self, f: DrmFile, kdata: bytearray, caller: Caller) -> None:
        """drm_syncobj_eventfd_ioctl: flags other than WAIT_AVAILABLE (1) or pad ≠ 0 (2) →
        EINVAL; an unknown handle → ENOENT (3); the caller's fd must be an eventfd (no such
        fd: EBADF, another file: EINVAL) (4); the daemon keeps its own reference to it and
        signals it once a fence exists for `point`: at once if one does, since every fence
        is signaled on arrival (5)."""
        args = st.SYNCOBJ_EVENTFD.decode(bytes(kdata[: st.SYNCOBJ_EVENTFD.size]))
        if args.flags & ~c.DRM_SYNCOBJ_WAIT_FLAGS_WAIT_AVAILABLE:  # 1
            raise DrmError(errno.EINVAL, f"SYNCOBJ_EVENTFD flags {args.flags:#x}")
        if args.pad:  # 2
            raise DrmError(errno.EINVAL, "SYNCOBJ_EVENTFD pad must be 0")
        obj = f.syncobjs.find(args.handle)
        if obj is None:  # 3
            raise DrmError(errno.ENOENT, f"no syncobj {args.handle}")
        open_eventfd = self.device.open_eventfd
        if open_eventfd is None:
            raise DrmError(errno.EBADF, "no access to the caller's fds")
        obj.add_eventfd(open_eventfd(caller.pid, args.fd), args.point)  # 4, 5


# drm_syncobj.c: how long WAIT_FOR_SUBMIT waits for a fence in drm_syncobj_find_fence
WAIT_FOR_SUBMIT_TIMEOUT_NS = 5_000_000_000
