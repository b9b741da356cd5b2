"""The GPU engine's copies from imported memory through the C data plane (issue 34; trio).

An SDMA copy whose source is one imported NPA BO mapping and whose destination is one local
piece (a userptr BO: the client's own memory; or a BO of this node) loads its source in
`CHUNK` pieces (the link's and the data plane's largest request), `IN_FLIGHT` of them out
at once, each received by the data plane's C thread straight into a slot of a buffer ring
(fuse/dataplane.c `ualinkd_dp_load_into`: one copy of the bytes on this side, no task and no
frame parsing in Python), and stores every run of pieces loaded in order in one store as
soon as it is in, while the next pieces load into the ring's other slots: the C thread's
receive, the worker thread's process_vm_writev and the exporter's sendfile overlap.

What the data plane does not carry goes through the link exactly as a FUSE load's does: a
piece it does not take (no channel to the exporter, its window full) or hands back (no
route at the exporter yet, a partial answer, a channel that went down) is that piece's
LOAD on the link, into the same slot; a piece that got no answer within the link's deadline
(EXPIRED) faults as the link's LOAD would, and so does a piece the link faults.

Policy 10 as the piece-by-piece copy keeps it: pieces are stored in order, and the copy
stops at the first piece not loaded whole, storing nothing of it (nor of any after it): the
copy faults at the first byte not loaded, or, when a store comes back short, at the first
byte not stored. Its destination is looked up in the GPU VM again at every store
(`PieceStore`), as the piece-by-piece copy looks it up per piece: one unmapped during the
copy faults at its first unmapped byte.

Lifetimes: a slot's buffer is the data plane's to write into until the load's outcome was
posted (DataPlane keeps the buffer alive until then), whatever becomes of the copy (its
queue destroyed, its process gone: the task is cancelled, the outcome still comes, within
the link's deadline at most). A ring goes back to the pool only when no load of it is out.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from .amdgpu.vm import GpuVm, LocalPiece, RemotePiece
from .drm.completion import Completion, done
from .drm.device import Segment
from .drm.errors import DrmError
from .drm.loaded import Loaded, copy_into
from .fabric.waiting import completed
from .fuse.dataplane import EXPIRED, FAST_MAX, LOADED

log = logging.getLogger(__name__)

CHUNK = FAST_MAX  # bytes per load: the data plane's largest (and the link's CHUNK)
IN_FLIGHT = 4  # loads out at once per copy (the data plane's window per channel: 4 MiB)
# Slots of a copy's buffer ring: twice the loads out, so that IN_FLIGHT pieces load while
# as many are stored (with IN_FLIGHT slots, a store of the pieces in them held up the next
# loads until it ended: 16 MiB in 4 rounds of load-then-store).
SLOTS = 2 * IN_FLIGHT
# Pieces a store waits for (fewer: the copy's last ones, or a fault among them): a store of
# each piece as it came in cost a worker's hand-over and a check of the process's mappings
# per MiB (a 16 MiB copy, answers coming one by one: ~14 stores; now 4).
STORE_PIECES = IN_FLIGHT
RING = SLOTS * CHUNK  # bytes of a full ring (a copy of fewer pieces gets one of its length)
RINGS_KEPT = 1  # full rings kept for the next copies (a fresh one's page faults cost about
#                 as much as its copy)

# (importing accel, piece, write, data) -> the loaded bytes, by Completion (node.py's
# remote_access: the link's LOAD)
RemoteAccess = Callable[[int, RemotePiece, bool, "bytes | None"], "Completion[Loaded | int]"]
# (offset in the copy, its bytes from there on) -> the count stored (short: a fault there)
Store = Callable[[int, list[memoryview]], Awaitable[int]]


class DataPlaneLoads(Protocol):
    """What the copier asks of the data plane (fuse/dataplane.py DataPlane)."""

    @property
    def running(self) -> bool: ...

    def load_into(self, src: int, dst: int, npa: int, buf: bytearray, offset: int,
                  n: int) -> Completion[int] | None: ...


class PieceStore:
    """A copy's destination (a `Store`): the local piece `vm` mapped at `va` when the copy
    began (a userptr BO: the client's own memory; or a BO of this node). Each store plans
    its range again, as the piece-by-piece copy looked the VM up for every piece, and
    writes only the prefix still mapped to that piece at the same place: a destination
    unmapped or freed during the copy (which takes up to the link's deadline) faults at
    its first unmapped byte (policy 10), and no byte reaches what its address names now
    (a reused userptr address: another allocation of the client's)."""

    def __init__(self, vm: GpuVm, va: int, piece: LocalPiece) -> None:
        self._vm = vm
        self._va = va
        self._bo = piece.bo
        self._base = piece.bo_offset

    async def __call__(self, off: int, data: list[memoryview]) -> int:
        want = sum(len(v) for v in data)
        pieces, _ = self._vm.plan(self._va + off, want, write=True)
        n = 0  # (the bytes from `off` still mapped to the BO at the same offset)
        for p in pieces:
            if type(p) is not LocalPiece or p.bo is not self._bo \
                    or p.bo_offset != self._base + off + n:
                break
            n += p.length
        if n < want:
            data = _prefix(data, n)
        bo, at = self._bo, self._base + off
        if bo.userptr is not None:
            segments: list[Segment] = [*data]
            return await bo.userptr.writev(at, segments)
        for v in data:
            bo.memory.write(at, v)
            at += len(v)
        return n


def _prefix(views: list[memoryview], n: int) -> list[memoryview]:
    """The first `n` bytes of `views`."""
    out: list[memoryview] = []
    for v in views:
        if n <= 0:
            break
        out.append(v[:n])
        n -= len(out[-1])
    return out


class RemoteCopier:
    """The node's engine copies from imported memory (one per GpuEngineEdge). `copy` does
    one; `copies` and `link_pieces` count them and their pieces the link carried. One
    full ring (SLOTS MiB) is kept between copies."""

    def __init__(self, data_plane: DataPlaneLoads, remote_access: RemoteAccess) -> None:
        self._dp = data_plane
        self._remote = remote_access
        self._rings: list[bytearray] = []
        self.copies = 0  # copies done this way
        self.link_pieces = 0  # pieces that went through the link instead

    @property
    def running(self) -> bool:
        return self._dp.running

    async def copy(self, src_accel: int, piece: RemotePiece, store: Store) -> tuple[int, int]:
        """Copy `piece` (issued by our accel `src_accel`) to `store`: (bytes loaded in order
        up to the first piece not loaded whole, bytes stored). Both are piece.length when
        all went well; loaded < length: the source faulted there; stored < length with
        loaded == length: the destination did (`store` came back short: the copy stops
        there, so the source did not fault before it, whatever its later pieces did, and
        the caller must not report one). Every piece loaded whole since the
        last store goes in one store (one system call, one check of the process's
        mappings: a store per piece cost more than the load of the next ones)."""
        # (A fresh ring of fewer than SLOTS pieces holds just them: piece k is at k * CHUNK
        # and only the last one may be short. It is not kept: the next copy may be longer.)
        ring = self._rings.pop() if self._rings else bytearray(min(RING, piece.length))
        one = RingCopy(self, src_accel, piece, ring)
        # (Raised: a store that raised, callermem's worker past its deadline or cancelled,
        # may still be reading the ring in its worker thread: the ring goes with it, lest
        # the next copy's bytes, another process's, reach this one's memory.)
        loaded, stored = await one.run(store)
        if one.out == 0 and len(ring) == RING and len(self._rings) < RINGS_KEPT:
            self._rings.append(ring)
        self.copies += 1
        return loaded, stored

    def load(self, src_accel: int, piece: RemotePiece, span: tuple[int, int],
             ring: bytearray, slot: int) -> Completion[int]:
        """One span of `piece` into ring[slot:]: the count loaded (less than asked: a
        fault)."""
        off, n = span
        sub = RemotePiece(piece.exporter_accel, piece.npa_byte_address + off, n, piece.bo)
        fast = self._dp.load_into(src_accel, piece.exporter_accel, sub.npa_byte_address,
                                  ring, slot, n)
        if fast is None:
            return self._by_link(src_accel, sub, ring, slot)
        over: Completion[int] = Completion()
        fast.when_done(functools.partial(self._by_status, src_accel, sub, ring, slot, over))
        return over

    def _by_status(self, src_accel: int, sub: RemotePiece, ring: bytearray, slot: int,
                   over: Completion[int], fast: Completion[int]) -> None:
        """`over` from the data plane's outcome of `sub`: its length, a fault, or the
        link's LOAD of it when the data plane handed it back."""
        status = fast.result()
        if status == LOADED:
            over.set_result(sub.length)
        elif status == EXPIRED:  # (the link's LOAD past its deadline: a fault)
            over.set_result(0)
        else:  # not carried: the link's LOAD, into the same slot
            self._by_link(src_accel, sub, ring, slot).when_done(
                lambda c: over.set_result(c.result()))

    def _by_link(self, src_accel: int, sub: RemotePiece, ring: bytearray,
                 slot: int) -> Completion[int]:
        self.link_pieces += 1

        def landed(c: Completion[Loaded | int]) -> int:
            try:
                got = c.result()
                assert not isinstance(got, int)  # (a load's answer)
                # (in the link reader's call: a piped answer is still in its pipe)
                return copy_into(got, memoryview(ring)[slot:slot + sub.length])
            except DrmError:
                return 0
            except OSError as e:  # (the fabric's pipe gave less than it holds: a fault)
                log.warning("engine: a loaded piece at NPA %#x could not be read: %s",
                            sub.npa_byte_address, e)
                return 0

        try:
            return self._remote(src_accel, sub, False, None).then(landed)
        except DrmError:
            return done(0)


class RingCopy:
    """One copy's buffer ring and its window of loads (RemoteCopier.copy): piece k loads
    into slot k % SLOTS; at most IN_FLIGHT loads are out, none into a slot whose piece is
    not stored yet; each load's answer issues the next load in its own call, so that the
    window stays full while the copy waits for a store. `out` counts the loads not yet
    ended: the ring may be reused only with none."""

    def __init__(self, copier: RemoteCopier, src_accel: int, piece: RemotePiece,
                 ring: bytearray) -> None:
        self._copier = copier
        self._src_accel = src_accel
        self._piece = piece
        self._ring = ring
        self._spans = [(off, min(CHUNK, piece.length - off))
                       for off in range(0, piece.length, CHUNK)]
        self._loads: list[Completion[int]] = []  # piece k's load, issued in order
        self._next = 0  # the next piece to store (its slot and the ones after it are busy)
        self._going = True  # (False once the copy ended: no more loads)
        self._issuing = False  # (a load that ends at once is counted, not issued from again)
        self._waiting: tuple[int, int, Completion[None]] | None = None  # (run's: _loaded)
        self.out = 0

    def issue(self) -> None:
        """Issue loads while the window and the free slots allow."""
        self._issuing = True
        try:
            while self._going and self.out < IN_FLIGHT \
                    and len(self._loads) < min(self._next + SLOTS, len(self._spans)):
                k = len(self._loads)
                self.out += 1
                self._loads.append(self._copier.load(
                    self._src_accel, self._piece, self._spans[k], self._ring,
                    (k % SLOTS) * CHUNK).then(self._ended))
        finally:
            self._issuing = False

    def _ended(self, c: Completion[int]) -> int:
        self.out -= 1
        if not self._issuing:  # (in the call that brings the answer: the window stays full)
            self.issue()
        # (c is its piece's load, done already: the store it completes is run's to do)
        if (w := self._waiting) is not None and self._unfinished(w[0], w[1]) is None:
            self._waiting = None
            w[2].set_result(None)
        return c.result()

    async def _loaded(self, i: int, until: int) -> None:
        """Once pieces i..until-1 are in, or one of those in came back short: one wake-up
        of the copy for its next store, not one per piece."""
        if self._unfinished(i, until) is None:
            return
        waiter: Completion[None] = Completion()
        self._waiting = (i, until, waiter)
        try:
            await completed(waiter)
        finally:
            self._waiting = None

    def _unfinished(self, i: int, until: int) -> int | None:
        """The first piece of i..until-1 whose load is not in yet, up to the first one in
        that came back short (a fault: the pieces before it are stored, and the copy stops
        there, policy 10); None when there is none."""
        loads, spans = self._loads, self._spans
        first = None
        for k in range(i, until):
            if not loads[k].done:
                if first is None:
                    first = k
            elif loads[k].result() < spans[k][1]:
                break  # (those before it: stored, then the copy stops there)
        return first

    async def run(self, store: Store) -> tuple[int, int]:
        """RemoteCopier.copy's (loaded, stored): the pieces stored in order, each run of
        pieces loaded whole in one store, up to the first piece not loaded whole or the
        first short store."""
        spans, loads = self._spans, self._loads
        loaded = stored = 0
        try:
            self.issue()
            while (i := self._next) < len(spans):
                # (a run of STORE_PIECES, or up to the copy's end: one store of several
                # pieces rather than one per piece as each comes in)
                await self._loaded(i, min(i + STORE_PIECES, len(loads)))
                j, whole = i, True
                while j < len(loads) and loads[j].done:
                    got = loads[j].result()
                    loaded += got
                    if got < spans[j][1]:
                        whole = False
                        break
                    j += 1
                if j > i:
                    views = [memoryview(self._ring)[(k % SLOTS) * CHUNK:][:spans[k][1]]
                             for k in range(i, j)]
                    want = sum(len(v) for v in views)
                    n = await store(spans[i][0], views)
                    stored += n
                    if n < want:  # (the destination's fault comes first in copy order)
                        return self._piece.length, stored
                if not whole:
                    break
                self._next = j
                self.issue()
            return loaded, stored
        finally:
            self._going = False
