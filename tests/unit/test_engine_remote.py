"""engine_remote.RemoteCopier (issue 34) against a fake data plane and a fake link: the
bytes of an imported range land in the destination in order and whole, whatever order the
data plane answers in; a piece the data plane does not take or hands back goes through the
link; an expired piece or a link fault stops the copy there, storing nothing of it or
after it (spec policy 10, as the piece-by-piece copy); a short store stops it; at most
IN_FLIGHT loads are out at once and no slot is loaded into before its piece was stored."""

from __future__ import annotations

import errno
from collections.abc import Callable

import pytest
import trio
import ualink_testkit as kit
from test_gpu_vm import NO_HANDLE, VA, bo_of, va_ok, vm_of

from ualinkd.abi import constants as c
from ualinkd.amdgpu.vm import PAGE, LocalPiece, RemotePiece
from ualinkd.drm.completion import Completion
from ualinkd.drm.errors import DrmError
from ualinkd.drm.loaded import Loaded
from ualinkd.engine_remote import (
    CHUNK,
    IN_FLIGHT,
    SLOTS,
    STORE_PIECES,
    PieceStore,
    RemoteCopier,
    Store,
)
from ualinkd.fuse.dataplane import EXPIRED, FALLBACK, LOADED

NPA = 0x4000_0000
SIZE = 11 * CHUNK + 5  # (past the ring's SLOTS: its slots reused; a short last piece)
SRC = bytes((i * 7 + 3) & 0xFF for i in range(256)) * (SIZE // 256 + 1)


class FakePlane:
    """Loads answered by `deliver`, in the order `pick` chooses; `answer(piece index)` says
    LOADED, FALLBACK, EXPIRED, or None (not taken)."""

    def __init__(self, answer: Callable[[int], int | None]) -> None:
        self.running = True
        self.answer = answer
        self.out: list[tuple[Completion[int], bytearray, int, int, int, int]] = []
        self.most_out = 0
        self.rings: set[int] = set()  # the buffers loaded into
        self.sizes: list[int] = []  # their lengths, at each load

    def load_into(self, src: int, dst: int, npa: int, buf: bytearray, offset: int,
                  n: int) -> Completion[int] | None:
        status = self.answer((npa - NPA) // CHUNK)
        if status is None:
            return None
        c: Completion[int] = Completion()
        self.rings.add(id(buf))
        self.sizes.append(len(buf))
        self.out.append((c, buf, offset, npa, n, status))
        self.most_out = max(self.most_out, len(self.out))
        return c

    def deliver_one(self, last: bool) -> None:
        c, buf, offset, npa, n, status = self.out.pop(-1 if last else 0)
        if status == LOADED:
            buf[offset:offset + n] = SRC[npa - NPA:npa - NPA + n]
        c.set_result(status)


def link(fault_at: int | None = None, calls: list[int] | None = None
         ) -> Callable[[int, RemotePiece, bool, bytes | None], Completion[Loaded | int]]:
    """The link's LOAD, answered at once (a fault from piece `fault_at` on)."""
    def remote(accel: int, piece: RemotePiece, write: bool,
               data: bytes | None) -> Completion[Loaded | int]:
        i = (piece.npa_byte_address - NPA) // CHUNK
        if calls is not None:
            calls.append(i)
        c: Completion[Loaded | int] = Completion()
        if fault_at is not None and i >= fault_at:
            c.set_error(DrmError(errno.EFAULT, "GPU page fault"))
        else:
            off = piece.npa_byte_address - NPA
            c.set_result(SRC[off:off + piece.length])
        return c
    return remote


async def run_copy(plane: FakePlane, copier: RemoteCopier, last_first: bool = False,
                   short_store_at: int | None = None
                   ) -> tuple[int, int, bytearray, list[tuple[int, int]]]:
    dst = bytearray(b"\xee" * SIZE)
    stores: list[tuple[int, int]] = []

    async def store(off: int, views: list[memoryview]) -> int:
        await trio.lowlevel.checkpoint()
        n = 0
        for v in views:
            if short_store_at is not None and off + n + len(v) > short_store_at:
                k = max(0, short_store_at - off - n)
                dst[off + n:off + n + k] = v[:k]
                stores.append((off, n + k))
                return n + k
            dst[off + n:off + n + len(v)] = v
            n += len(v)
        stores.append((off, n))
        return n

    loaded, stored = await answered(plane, copier, SIZE, store, last_first)
    return loaded, stored, dst, stores


async def answered(plane: FakePlane, copier: RemoteCopier, length: int, store: Store,
                   last_first: bool = False) -> tuple[int, int]:
    """The copy of NPA [NPA, +length) to `store`, its loads answered one per turn."""
    result: list[tuple[int, int]] = []
    async with trio.open_nursery() as nursery:
        async def run() -> None:
            result.append(await copier.copy(0, RemotePiece(1, NPA, length), store))
            nursery.cancel_scope.cancel()

        nursery.start_soon(run)
        while True:  # (the thread's answers, one per turn, while the copy runs)
            await trio.sleep(0)
            if plane.out:
                plane.deliver_one(last_first)
    return result[0]


async def test_a_store_takes_store_pieces_pieces_not_one_per_answer():
    """Issue 34: pieces answered one at a time, in order, are stored STORE_PIECES at a time
    (the copy's last ones fewer): one hand-over to a caller-memory worker and one check
    of the process's mappings per 4 MiB, not per MiB as each piece came in (a 16 MiB
    copy: ~14 stores, now 4)."""
    plane = FakePlane(lambda i: LOADED)
    copier = RemoteCopier(plane, link())
    loaded, stored, dst, stores = await run_copy(plane, copier)
    assert (loaded, stored) == (SIZE, SIZE) and dst == SRC[:SIZE]
    pieces = -(-SIZE // CHUNK)
    assert STORE_PIECES > 1
    # (in order, contiguous; every store but the last one STORE_PIECES pieces or more: more
    # when further answers came in before the copy's task ran)
    assert [off for off, _ in stores] == [sum(n for _, n in stores[:k])
                                          for k in range(len(stores))]
    assert all(n >= STORE_PIECES * CHUNK for _, n in stores[:-1]), stores
    assert len(stores) <= -(-pieces // STORE_PIECES)
    assert plane.most_out <= IN_FLIGHT


async def test_a_fault_inside_a_store_s_run_stores_the_pieces_before_it_at_once():
    """Policy 10 with stores of STORE_PIECES: piece 1 expires while piece 0 is in and pieces
    2.. are still out: piece 0 is stored and the copy stops at piece 1's first byte,
    without waiting for the rest of the run."""
    plane = FakePlane(lambda i: EXPIRED if i == 1 else LOADED)
    copier = RemoteCopier(plane, link())
    dst = bytearray(b"\xee" * SIZE)
    stores: list[tuple[int, int]] = []

    async def store(off: int, views: list[memoryview]) -> int:
        n = sum(len(v) for v in views)
        dst[off:off + n] = b"".join(views)
        stores.append((off, n))
        return n

    result: list[tuple[int, int]] = []
    async with trio.open_nursery() as nursery:
        async def run() -> None:
            result.append(await copier.copy(0, RemotePiece(1, NPA, SIZE), store))
            nursery.cancel_scope.cancel()

        nursery.start_soon(run)
        while len(plane.out) < IN_FLIGHT:
            await trio.sleep(0)
        plane.deliver_one(False)  # piece 0
        plane.deliver_one(False)  # piece 1: expired; 2 and 3 stay out
        await trio.sleep(1)  # (ended at once: cancelled)
        raise AssertionError("the copy waited for pieces after the fault")
    assert result == [(CHUNK, CHUNK)]
    assert stores == [(0, CHUNK)] and dst[:CHUNK] == SRC[:CHUNK]
    assert dst[CHUNK:] == b"\xee" * (SIZE - CHUNK)
    for out, *_ in plane.out:  # (the loads still out end: the ring is not kept with them)
        out.set_result(LOADED)


@pytest.mark.parametrize("last_first", [False, True], ids=["in-order", "reversed"])
async def test_every_piece_carried_lands_in_order_byte_exact(last_first: bool):
    plane = FakePlane(lambda i: LOADED)
    copier = RemoteCopier(plane, link())
    loaded, stored, dst, stores = await run_copy(plane, copier, last_first)
    assert (loaded, stored) == (SIZE, SIZE)
    assert dst == SRC[:SIZE]
    # in order, contiguous, runs of pieces (fewer stores than pieces when they queue up)
    assert [off for off, _ in stores] == [sum(n for _, n in stores[:k])
                                          for k in range(len(stores))]
    assert plane.most_out <= IN_FLIGHT
    assert copier.link_pieces == 0 and len(copier._rings) == 1  # (its ring kept)


async def test_pieces_not_taken_or_handed_back_go_through_the_link():
    """Pieces 2 and 7 not taken (no channel, window full), 3 and 9 handed back ("not
    here"): each is the link's LOAD into its slot, answered at once (in the call that
    issues it: no load issued twice)."""
    calls: list[int] = []
    plane = FakePlane(lambda i: None if i in (2, 7) else FALLBACK if i in (3, 9) else LOADED)
    copier = RemoteCopier(plane, link(calls=calls))
    loaded, stored, dst, _ = await run_copy(plane, copier)
    assert (loaded, stored) == (SIZE, SIZE) and dst == SRC[:SIZE]
    assert sorted(calls) == [2, 3, 7, 9] and copier.link_pieces == 4


@pytest.mark.parametrize("how", ["expired", "link-fault"])
async def test_a_piece_not_loaded_stops_the_copy_there(how: str):
    """Piece 5 expires on the data plane (the link's deadline: a fault), or is handed back
    and faults on the link: pieces 0-4 stored, nothing of 5 or after."""
    if how == "expired":
        plane = FakePlane(lambda i: EXPIRED if i == 5 else LOADED)
        copier = RemoteCopier(plane, link())
    else:
        plane = FakePlane(lambda i: FALLBACK if i >= 5 else LOADED)
        copier = RemoteCopier(plane, link(fault_at=5))
    loaded, stored, dst, _ = await run_copy(plane, copier)
    assert (loaded, stored) == (5 * CHUNK, 5 * CHUNK)
    assert dst[:5 * CHUNK] == SRC[:5 * CHUNK]
    assert dst[5 * CHUNK:] == b"\xee" * (SIZE - 5 * CHUNK)


async def test_a_short_store_stops_the_copy_at_it():
    plane = FakePlane(lambda i: LOADED)
    copier = RemoteCopier(plane, link())
    at = 3 * CHUNK + 4096
    loaded, stored, dst, _ = await run_copy(plane, copier, short_store_at=at)
    assert stored == at and loaded >= at
    assert dst[:at] == SRC[:at] and dst[at:] == b"\xee" * (SIZE - at)


async def test_a_cancelled_copy_leaves_its_ring_to_the_loads_still_out():
    """Its process gone (the queue's run cancelled) while loads are out: the ring is not
    reused by the next copy (the data plane may still write into it), and the answers
    that come afterwards land in it harmlessly."""
    plane = FakePlane(lambda i: LOADED)
    copier = RemoteCopier(plane, link())

    async def store(off: int, views: list[memoryview]) -> int:
        return sum(len(v) for v in views)

    with trio.move_on_after(0.01):
        await copier.copy(0, RemotePiece(1, NPA, SIZE), store)
    assert len(plane.out) == IN_FLIGHT and copier._rings == []
    (first,) = plane.rings
    plane.rings.clear()
    loaded, stored, dst, _ = await run_copy(plane, copier)  # (the old loads answered first)
    assert (loaded, stored) == (SIZE, SIZE) and dst == SRC[:SIZE]
    assert first not in plane.rings and len(plane.rings) == 1


async def test_a_short_store_before_the_last_batch_is_the_destinations_fault():
    """Policy 10, the fault address exact: a store that comes back short in a batch
    before the copy's last one is the destination's fault (gpu_engine._copy_remote reads
    `loaded < length` as a source fault first): the source did not fault before it, so
    `loaded` is the whole length. Failed before: loaded was the pieces up to that batch."""
    plane = FakePlane(lambda i: LOADED)
    copier = RemoteCopier(plane, link())
    at = 1 * CHUNK + 4096  # (the second piece: stored before the last pieces are loaded)
    loaded, stored, dst, _ = await run_copy(plane, copier, short_store_at=at)
    assert (loaded, stored) == (SIZE, at)
    assert dst[:at] == SRC[:at] and dst[at:] == b"\xee" * (SIZE - at)


async def test_a_store_that_raised_does_not_give_its_ring_to_the_next_copy():
    """A store given up (callermem's worker past its deadline, or the copy cancelled
    mid-store) may still be reading the ring from its worker thread, which finishes the
    process_vm_writev later: the ring is not reused by the next copy (another process's
    bytes would reach the first one's memory). Failed before: it was kept."""
    plane = FakePlane(lambda i: LOADED)
    copier = RemoteCopier(plane, link())

    async def store(off: int, views: list[memoryview]) -> int:
        while plane.out:  # (every load answered: none out when the store gives up)
            await trio.sleep(0)
        raise DrmError(errno.EFAULT, "caller memory access took over 2.0 s")

    async with trio.open_nursery() as nursery:
        async def run() -> None:
            with pytest.raises(DrmError):  # (a full ring: one that would be kept)
                await copier.copy(0, RemotePiece(1, NPA, SIZE), store)
            nursery.cancel_scope.cancel()

        nursery.start_soon(run)
        while True:
            await trio.sleep(0)
            if plane.out:
                plane.deliver_one(False)
    assert not plane.out and copier._rings == []


@pytest.mark.parametrize("change", ["freed", "cleared", "another-bo", "moved", "read-only"])
async def test_a_destination_unmapped_during_the_copy_faults_at_its_first_unmapped_byte(
        change: str):
    """Policy 10 (spec "Emulator policy" 10), gpu_engine._copy_remote's destination: the
    client changes its GPU VM between two stores of the copy (the BO freed: GEM_CLOSE; part
    of the range cleared; another BO, or the same BO at another offset, mapped there by
    REPLACE; the range made read-only): each store plans its range again, as the
    piece-by-piece copy looked the VM up per piece, so the copy stores up to the first
    byte no longer mapped to the same place and comes back short there (_copy_remote:
    GpuFault(dst_va + stored)); nothing reaches the BO past it, nor the BO now mapped.
    Failed before: every store wrote where the copy's first plan said (stored == length:
    no fault, and the bytes went to memory the address no longer names, for a userptr
    BO a CPU address the client may have reused)."""
    core = kit.make_node()
    f = kit.open_file(core)
    length = 6 * CHUNK
    h, other = kit.gem_create(f, length), kit.gem_create(f, length)
    a, b = bo_of(f, h), bo_of(f, other)
    va_ok(f, h, size=length)
    vm = vm_of(f)
    (d,), fault = vm.plan(VA, length, write=True)
    assert fault is None and isinstance(d, LocalPiece)
    at = 5 * CHUNK + PAGE  # (past the first store: at most IN_FLIGHT pieces)
    tail = dict(va=VA + at, size=length - at)
    first: list[int] = []
    pieces = PieceStore(vm, VA, d)

    async def store(off: int, views: list[memoryview]) -> int:
        n = await pieces(off, views)
        if not first:  # (the VM changed under the copy, after its first store)
            first.append(off + n)
            if change == "freed":
                kit.gem_close(f, h)
            elif change == "cleared":
                va_ok(f, NO_HANDLE, op=c.VA_OP_CLEAR, **tail)
            elif change == "another-bo":
                va_ok(f, other, op=c.VA_OP_REPLACE, offset=at, **tail)
            elif change == "moved":
                va_ok(f, h, op=c.VA_OP_REPLACE, offset=0, **tail)
            else:
                va_ok(f, h, op=c.VA_OP_REPLACE, offset=at, flags=c.VM_PAGE_READABLE, **tail)
        return n

    plane = FakePlane(lambda i: LOADED)
    loaded, stored = await answered(plane, RemoteCopier(plane, link()), length, store)
    end = first[0] if change == "freed" else at
    assert first[0] < at and (loaded, stored) == (length, end)
    if change != "freed":  # (a freed BO's memory is gone)
        assert a.memory.read(0, length) == SRC[:end] + bytes(length - end)
    assert b.memory.read(0, length) == bytes(length)


async def test_a_copy_of_fewer_pieces_than_the_ring_gets_a_ring_of_its_length():
    """A copy of fewer than SLOTS pieces with no ring kept loads into a ring of its own
    length, which is not kept (the next copy may be longer); a full ring kept serves a
    short copy and is kept again. Failed before: every fresh ring was SLOTS MiB, zeroed
    (a 4-byte copy paid the page faults of 8 MiB)."""
    plane = FakePlane(lambda i: LOADED)
    copier = RemoteCopier(plane, link())

    def into(dst: bytearray) -> Store:
        async def store(off: int, views: list[memoryview]) -> int:
            for v in views:
                dst[off:off + len(v)] = v
                off += len(v)
            return sum(len(v) for v in views)
        return store

    for length in (4, 3 * CHUNK + 5):
        dst = bytearray(length)
        assert await answered(plane, copier, length, into(dst)) == (length, length)
        assert dst == SRC[:length] and plane.sizes[-1] == length and copier._rings == []
    await run_copy(plane, copier)  # (SIZE: more pieces than slots, a full ring, kept)
    (ring,) = copier._rings
    assert len(ring) == SLOTS * CHUNK
    dst = bytearray(4)
    assert await answered(plane, copier, 4, into(dst)) == (4, 4) and dst == SRC[:4]
    assert plane.sizes[-1] == SLOTS * CHUNK
    assert len(copier._rings) == 1 and copier._rings[0] is ring
