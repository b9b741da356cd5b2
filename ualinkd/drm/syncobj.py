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
import heapq
import struct
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ..abi import constants as c
from ..abi import structs as st
from .errors import DrmError

if TYPE_CHECKING:
    from .device import Caller, DrmDevice
    from .file import DrmFile

INT64_MAX = (1 << 63) - 1
# kmalloc_array of the syncobj pointers fails beyond KMALLOC_MAX_SIZE (4 MiB): ENOMEM.
MAX_HANDLES = (4 << 20) // 8

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


class DrmSyncobj:
    __slots__ = ("_changed", "fence")

    def __init__(self, changed: Callable[[DrmSyncobj], None], fence: Fence | None = None):
        self.fence = fence
        self._changed = changed

    def replace_fence(self, fence: Fence | None) -> None:
        """drm_syncobj_replace_fence: waiters look again (a NULL fence satisfies none)."""
        self.fence = fence
        self._changed(self)

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

    def query(self) -> int:
        """SYNCOBJ_QUERY: the last signaled point of a chain (all of it is signaled here,
        so with or without LAST_SUBMITTED: the head's seqno); 0 for a plain fence or none."""
        fence = self.fence
        return fence.point if fence is not None and fence.chain else 0


class SyncobjTable:
    """A file's syncobj handles: lowest free from 1 (idr_alloc(…, 1, 0)), never 0."""

    def __init__(self, changed: Callable[[DrmSyncobj], None]) -> None:
        self._changed = changed
        self._objs: dict[int, DrmSyncobj] = {}
        self._free: list[int] = []
        self._next = 1

    def __len__(self) -> int:
        return len(self._objs)

    def create(self, signaled: bool) -> int:
        handle = heapq.heappop(self._free) if self._free else self._next
        if handle == self._next:
            self._next += 1
        self._objs[handle] = DrmSyncobj(self._changed, STUB if signaled else None)
        return handle

    def find(self, handle: int) -> DrmSyncobj | None:
        return self._objs.get(handle)

    def destroy(self, handle: int) -> None:
        """drm_syncobj_destroy: unknown handle → EINVAL. A waiter keeps its reference."""
        if self._objs.pop(handle, None) is None:
            raise DrmError(errno.EINVAL, f"no syncobj {handle}")
        heapq.heappush(self._free, handle)

    def release(self) -> None:
        self._objs.clear()
        self._free.clear()
        self._next = 1


# ---- the ioctls ----------------------------------------------------------------------------


def timeout_expired(timeout_nsec: int, now_ns: int) -> bool:
    """drm_timeout_abs_to_jiffies: 0 polls, a time at or before now polls; else wait."""
    return timeout_nsec <= now_ns


class SyncobjIoctls:
    """The core syncobj ioctl handlers of one DrmDevice. The device's `copy_from_user`,
    `copy_to_user` and `waits` are read at call time (the node wires them after creation)."""

    def __init__(self, device: DrmDevice) -> None:
        self.device = device
        self.handlers = {
            0xBF: self.create_ioctl,
            0xC0: self.destroy_ioctl,
            0xC3: self.wait_ioctl,
            0xC4: self.reset_ioctl,
            0xC5: self.signal_ioctl,
            0xCA: self.timeline_wait_ioctl,
            0xCB: self.query_ioctl,
            0xCD: self.timeline_signal_ioctl,
        }

    # -- user memory --------------------------------------------------------------------------
    async def read_user(self, caller: Caller, address: int, size: int) -> bytes:
        copy = self.device.copy_from_user
        if copy is None:
            raise DrmError(errno.EFAULT, "no user memory access")
        data = await copy(caller.pid, address, size)
        if len(data) != size:
            raise DrmError(errno.EFAULT, f"short read of user memory at {address:#x}")
        return data

    async def write_user(self, caller: Caller, address: int, data: bytes) -> None:
        copy = self.device.copy_to_user
        if copy is None:
            raise DrmError(errno.EFAULT, "no user memory access")
        await copy(caller.pid, address, data)

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
    def create_ioctl(self, f: DrmFile, kdata: bytearray, caller: Caller) -> None:
        args = st.SYNCOBJ_CREATE.decode(bytes(kdata[: st.SYNCOBJ_CREATE.size]))
        if args.flags & ~c.DRM_SYNCOBJ_CREATE_SIGNALED:
            raise DrmError(errno.EINVAL, f"SYNCOBJ_CREATE flags {args.flags:#x}")
        handle = f.syncobjs.create(bool(args.flags & c.DRM_SYNCOBJ_CREATE_SIGNALED))
        kdata[0:4] = handle.to_bytes(4, "little")

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

    async def reset_ioctl(self, f: DrmFile, kdata: bytearray, caller: Caller) -> None:
        for obj in await self._array(f, kdata, caller):
            obj.replace_fence(None)

    async def signal_ioctl(self, f: DrmFile, kdata: bytearray, caller: Caller) -> None:
        for obj in await self._array(f, kdata, caller):
            obj.replace_fence(STUB)  # drm_syncobj_assign_null_handle

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
    async def wait_ioctl(self, f: DrmFile, kdata: bytearray, caller: Caller) -> None:
        args = st.SYNCOBJ_WAIT.decode(bytes(kdata[: st.SYNCOBJ_WAIT.size]))
        if args.flags & ~_WAIT_FLAGS:  # WAIT_AVAILABLE is for timeline waits only
            raise DrmError(errno.EINVAL, f"SYNCOBJ_WAIT flags {args.flags:#x}")
        if args.count_handles == 0:
            raise DrmError(errno.EINVAL, "no syncobj handles")
        objs = await self.array_find(f, caller, args.handles, args.count_handles)
        pending = self._wait(objs, [0] * len(objs), args.flags, args.timeout_nsec, kdata, 24)
        if pending is not None:
            await pending

    async def timeline_wait_ioctl(self, f: DrmFile, kdata: bytearray, caller: Caller) -> None:
        args = st.SYNCOBJ_TIMELINE_WAIT.decode(bytes(kdata[: st.SYNCOBJ_TIMELINE_WAIT.size]))
        if args.flags & ~_TIMELINE_WAIT_FLAGS:
            raise DrmError(errno.EINVAL, f"SYNCOBJ_TIMELINE_WAIT flags {args.flags:#x}")
        if args.count_handles == 0:
            raise DrmError(errno.EINVAL, "no syncobj handles")
        objs = await self.array_find(f, caller, args.handles, args.count_handles)
        points = (list(await self.read_u64s(caller, args.points, len(objs))) if args.points
                  else [0] * len(objs))
        pending = self._wait(objs, points, args.flags, args.timeout_nsec, kdata, 32)
        if pending is not None:
            await pending

    def _wait(
        self, objs: list[DrmSyncobj], points: list[int], flags: int, timeout_nsec: int,
        kdata: bytearray, first_at: int,
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
            kdata[first_at : first_at + 4] = index.to_bytes(4, "little")

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
