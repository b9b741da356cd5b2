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

from ualinkd.amdgpu.vm import RemotePiece
from ualinkd.drm.completion import Completion
from ualinkd.drm.errors import DrmError
from ualinkd.drm.loaded import Loaded
from ualinkd.engine_remote import CHUNK, IN_FLIGHT, RemoteCopier
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

    def load_into(self, src: int, dst: int, npa: int, buf: bytearray, offset: int,
                  n: int) -> Completion[int] | None:
        status = self.answer((npa - NPA) // CHUNK)
        if status is None:
            return None
        c: Completion[int] = Completion()
        self.rings.add(id(buf))
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

    result: list[tuple[int, int]] = []
    async with trio.open_nursery() as nursery:
        async def run() -> None:
            result.append(await copier.copy(0, RemotePiece(1, NPA, SIZE), store))
            nursery.cancel_scope.cancel()

        nursery.start_soon(run)
        while True:  # (the thread's answers, one per turn, while the copy runs)
            await trio.sleep(0)
            if plane.out:
                plane.deliver_one(last_first)
    loaded, stored = result[0]
    return loaded, stored, dst, stores


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
            with pytest.raises(DrmError):
                await copier.copy(0, RemotePiece(1, NPA, 2 * CHUNK), store)
            nursery.cancel_scope.cancel()

        nursery.start_soon(run)
        while True:
            await trio.sleep(0)
            if plane.out:
                plane.deliver_one(False)
    assert not plane.out and copier._rings == []
