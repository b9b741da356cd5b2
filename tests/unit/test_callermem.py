"""The daemon's caller-memory access (ualinkd/callermem.py): the maps check that refuses
ranges of the node's own mount, and the bounded worker pool (DESIGN "Restricted ioctls")."""

from __future__ import annotations

import errno
import threading

import pytest
import trio

from ualinkd.callermem import CallerMemory, maps_extent
from ualinkd.drm.errors import DrmError

MAPS = """\
7f0000000000-7f0000002000 rw-p 00000000 00:00 0
7f0000002000-7f0000003000 r--p 00000000 08:01 1234   /usr/lib/libc.so.6
7f0000003000-7f0000004000 rw-p 00000000 00:2d 17     /mnt/node0/sys/accel_state
7f0000004000-7f0000005000 rw-p 00000000 00:00 0
7f0000006000-7f0000007000 ---p 00000000 00:00 0
"""
BASE = 0x7F0000000000
OWN = (0, 0x2D)  # maps prints the device in hex, mountinfo in decimal (0:45)


@pytest.mark.parametrize(("address", "size", "write", "refused", "extent"), [
    (BASE, 0x2000, False, None, 0x2000),
    (BASE + 0x1000, 0x2000, False, None, 0x2000),  # across two mappings
    (BASE + 0x1000, 0x2000, True, None, 0x1000),  # the library is read-only
    (BASE, 0x5000, False, None, 0x5000),
    (BASE, 0x5000, False, OWN, 0x3000),  # stops at the file of our own mount
    (BASE + 0x3000, 8, False, OWN, 0),
    (BASE + 0x3000, 8, False, (0, 0x2E), 8),  # another mount's file is fine
    (BASE + 0x4800, 0x1000, False, None, 0x800),  # then a hole
    (BASE + 0x6000, 4, False, None, 0),  # PROT_NONE
    (BASE - 8, 16, False, None, 0),  # starts before any mapping
])
def test_maps_extent(address, size, write, refused, extent):
    """/proc/<pid>/mem would read PROT_NONE pages, write read-only ones and fault in any
    file; the access is limited to what the process has mapped with that access, and never
    a file on the refused device (the dev field is hex major:minor)."""
    assert maps_extent(MAPS, address, size, write, refused) == extent


def test_the_pool_bounds_every_access_and_refuses_at_once_when_all_are_stuck():
    """A worker that does not return costs its caller `timeout` (then EFAULT) and keeps its
    slot; with every slot held, an access fails with EFAULT without waiting for a thread;
    once the stuck ones return, accesses work again. Trio keeps running throughout."""
    release = threading.Event()
    errors: list[int] = []

    async def main() -> None:
        mem = CallerMemory(timeout=0.2, workers=2)

        async def stuck() -> None:
            try:
                await mem.run(release.wait)
            except DrmError as e:
                errors.append(e.errno)

        async with trio.open_nursery() as n:
            n.start_soon(stuck)
            n.start_soon(stuck)
        assert errors == [errno.EFAULT] * 2
        assert mem.stuck == 2
        with pytest.raises(DrmError) as ei:
            await mem.run(lambda: 1)  # every worker is held: refused without a thread
        assert ei.value.errno == errno.EFAULT
        release.set()
        while mem.stuck:
            await trio.sleep(0.01)
        assert await mem.run(lambda: 7) == 7

    trio.run(main)


def test_busy_workers_are_waited_for_not_refused():
    """Only workers stuck past a deadline count as lost: with the one worker busy in an
    access that finishes, the next access waits for it instead of failing."""
    release = threading.Event()
    got: list[object] = []

    async def main() -> None:
        mem = CallerMemory(timeout=30, workers=1)

        async def access(fn) -> None:
            got.append(await mem.run(fn))

        async with trio.open_nursery() as n:
            n.start_soon(access, lambda: release.wait() and "first")
            await trio.sleep(0.05)
            n.start_soon(access, lambda: "second")
            await trio.sleep(0.05)
            release.set()
        assert mem.stuck == 0

    trio.run(main)
    assert sorted(got) == ["first", "second"]


def test_procmap_query_agrees_with_the_maps_text(tmp_path):
    """PROCMAP_QUERY (one VMA by address) gives what the /proc/<pid>/maps text gives, on
    this process: read/write permissions, holes, and a file on the refused device."""
    import ctypes
    import mmap
    import os

    from ualinkd.callermem import _query_extent, _read_maps

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    page = mmap.PAGESIZE
    base = libc.mmap(None, 6 * page, mmap.PROT_READ | mmap.PROT_WRITE,
                     mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    libc.mprotect(base + page, page, mmap.PROT_READ)  # rw, r, rw, none, file, rw
    libc.mprotect(base + 3 * page, page, 0)  # PROT_NONE
    path = tmp_path / "f"
    path.write_bytes(bytes(page))
    fd = os.open(path, os.O_RDWR)
    libc.mmap(base + 4 * page, page, mmap.PROT_READ | mmap.PROT_WRITE,
              mmap.MAP_PRIVATE | 0x10, fd, 0)  # MAP_FIXED
    st_ = os.fstat(fd)
    refused = (os.major(st_.st_dev), os.minor(st_.st_dev))
    dir_fd = os.open("/proc/self", os.O_RDONLY | os.O_DIRECTORY)
    maps_fd = os.open("maps", os.O_RDONLY, dir_fd=dir_fd)
    try:
        cases = [(0, 6, False, None), (0, 3, True, None), (1, 1, False, None),
                 (2, 2, False, None), (4, 2, False, None), (4, 1, False, refused),
                 (0, 6, False, refused), (5, 1, True, refused)]
        for first, pages, write, ref in cases:
            addr, size = base + first * page, pages * page
            text = maps_extent(_read_maps(dir_fd), addr, size, write, ref)
            assert _query_extent(maps_fd, addr, size, write, ref) == text, (first, pages)
        assert _query_extent(maps_fd, base, 6 * page, False, None) == 3 * page
        assert _query_extent(maps_fd, base + 4 * page, page, False, refused) == 0
    finally:
        os.close(maps_fd)
        os.close(dir_fd)
        os.close(fd)


def test_vectored_access_moves_between_the_process_buffers_and_a_memfd_in_one_copy():
    """ProcMemory.readv/writev (a userptr BO's copies, drm.device.ProcessMemory): a
    process's bytes straight into / out of buffers and a shared BO's memfd (its holes sent
    as zeros, nothing allocated for them); a short count at the first page the process
    lacks (policy 10), here a PROT_NONE page."""
    import ctypes
    import mmap
    import os

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    page = mmap.PAGESIZE
    base = libc.mmap(None, 5 * page, mmap.PROT_READ | mmap.PROT_WRITE,
                     mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    libc.mprotect(base + 4 * page, page, 0)  # PROT_NONE after 4 pages
    mine = (ctypes.c_char * (4 * page)).from_address(base)
    pattern = bytes(range(256)) * (4 * page // 256)
    ctypes.memmove(base, pattern, 4 * page)
    memfd = os.memfd_create("bo", os.MFD_CLOEXEC)
    os.ftruncate(memfd, 4 * page)
    os.pwrite(memfd, b"\xee" * page, 0)  # page 0 data, pages 1-3 holes

    async def main() -> None:
        mem = CallerMemory().open_process(os.getpid())
        try:
            a, b = bytearray(page), bytearray(page)
            assert await mem.readv(base + 8, [memoryview(a), memoryview(b)]) == 2 * page
            assert bytes(a + b) == pattern[8 : 8 + 2 * page]
            # into the memfd at page 2 (a hole until now), from the process
            assert await mem.readv(base, [(memfd, 2 * page, page)]) == page
            assert os.pread(memfd, page, 2 * page) == pattern[:page]
            # out of a buffer and the memfd's data page and hole, into the process
            n = await mem.writev(base, [memoryview(b"\x11" * 16), (memfd, 0, 2 * page)])
            assert n == 16 + 2 * page
            assert bytes(mine[: 16 + 2 * page]) == b"\x11" * 16 + b"\xee" * page + bytes(page)
            assert os.fstat(memfd).st_blocks * 512 == 2 * page  # the hole stayed one
            # the PROT_NONE page stops the access: the count up to it
            assert await mem.readv(base + 3 * page, [memoryview(bytearray(2 * page))]) == page
            assert await mem.writev(base + 3 * page, [(memfd, 0, 2 * page)]) == page
        finally:
            mem.close()

    try:
        trio.run(main)
    finally:
        os.close(memfd)
        libc.munmap(base, 5 * page)


def test_a_shared_bo_stays_mapped_between_copies_and_is_unmapped_after_them():
    """callermem._Mappings: the copies of a shared BO (a memfd) go through one mapping of it
    kept between accesses (mapping and unmapping 64 MiB per copy cost as much as the copy),
    and that mapping goes about KEEP after the last copy, so a freed BO's pages do not stay
    behind in the daemon (its /proc/self/maps no longer names the memfd)."""
    import mmap
    import os
    import time

    from ualinkd import callermem

    page = mmap.PAGESIZE
    src = mmap.mmap(-1, 4 * page)
    src[:] = b"\x5a" * (4 * page)
    import ctypes

    base = ctypes.addressof(ctypes.c_char.from_buffer(src))
    memfd = os.memfd_create("ualinkd-test-bo-maps", os.MFD_CLOEXEC)
    os.ftruncate(memfd, 4 * page)

    def mapped() -> int:
        with open("/proc/self/maps") as f:
            return sum("ualinkd-test-bo-maps" in ln for ln in f)

    async def main() -> None:
        mem = CallerMemory().open_process(os.getpid())
        try:
            for _ in range(3):
                assert await mem.readv(base, [(memfd, 0, 4 * page)]) == 4 * page
                assert mapped() == 1  # one mapping, kept across the copies
        finally:
            mem.close()

    try:
        trio.run(main)
        assert os.pread(memfd, 4 * page, 0) == b"\x5a" * (4 * page)
        deadline = time.monotonic() + 10 * callermem._Mappings.KEEP + 5
        while mapped() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert mapped() == 0
    finally:
        os.close(memfd)
        src.close()


def test_a_kept_mapping_whose_view_is_held_in_a_reference_cycle_is_still_unmapped():
    """callermem._Mappings: a view of a kept mapping left alive in a reference cycle (a
    failed copy's exception, whose traceback holds the frame with the view) does not keep
    the mapping, nor its fd, past the reaper's round: the reaper collects once and unmaps
    (before, it gave up on the BufferError and an idle daemon held the memfd for as long as
    its collector did not run: a CI run of the 1000-queue test saw it outlive 20 s)."""
    import gc
    import mmap
    import os
    import time

    from ualinkd import callermem

    memfd = os.memfd_create("ualinkd-test-bo-cycle", os.MFD_CLOEXEC)
    os.ftruncate(memfd, 4 * mmap.PAGESIZE)

    def mapped() -> int:
        with open("/proc/self/maps") as f:
            return sum("ualinkd-test-bo-cycle" in ln for ln in f)

    class Cycle:
        pass

    gc.disable()  # (as long as an idle daemon's collector does not happen to run)
    try:
        held = callermem._MAPPINGS.acquire(memfd)
        assert held is not None
        c = Cycle()
        c.me = c  # type: ignore[attr-defined]
        c.view = memoryview(held[1].map)[:16]  # type: ignore[attr-defined]
        callermem._MAPPINGS.release(held[0])
        del c, held
        assert mapped() == 1
        deadline = time.monotonic() + 10 * callermem._Mappings.KEEP + 5
        while mapped() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert mapped() == 0
    finally:
        gc.enable()
        os.close(memfd)


def test_a_large_write_goes_straight_from_the_bytes_and_stops_at_the_first_bad_page():
    """ProcMemory.write of at least _VECTOR_WRITE_MIN (an SDMA copy's 4 MiB piece into a
    userptr BO) is one process_vm_writev from the bytes themselves (no copy of them), with
    the same short count as a small write: up to the first page the process lacks
    writable (policy 10), here a read-only page after 32 pages."""
    import ctypes
    import mmap
    import os

    from ualinkd import callermem

    page = mmap.PAGESIZE
    n = callermem._VECTOR_WRITE_MIN // page * 2  # pages written, half of them allowed
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    base = libc.mmap(None, n * page, mmap.PROT_READ | mmap.PROT_WRITE,
                     mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    libc.mprotect(base + n // 2 * page, n // 2 * page, mmap.PROT_READ)
    data = os.urandom(n * page)
    assert callermem._bytes_base(memoryview(data)) is not None  # (read in place)

    async def main() -> None:
        mem = CallerMemory().open_process(os.getpid())
        try:
            assert await mem.write(base, data[: n // 2 * page]) == n // 2 * page
            assert ctypes.string_at(base, n // 2 * page) == data[: n // 2 * page]
            assert await mem.write(base + page, data) == (n // 2 - 1) * page
            assert ctypes.string_at(base + page, 8) == data[:8]
        finally:
            mem.close()

    try:
        trio.run(main)
    finally:
        libc.munmap(base, n * page)


def _libc_mmap():
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return libc


def test_a_big_move_of_anonymous_memory_goes_in_two_halves_byte_exact(monkeypatch):
    """callermem._split_move (issue 34, the SDMA engine's host<->VRAM copies): a move of at
    least SPLIT_MIN of a process's anonymous memory, when the worker may run on two CPUs,
    is moved by two threads taking SPLIT_PIECE pieces in turn, cut inside buffers; every
    byte lands where one move would put it, both ways, between buffers of odd sizes and a
    shared BO's memfd (its kept mapping). Pinned to one CPU it stays one move."""
    import ctypes
    import mmap
    import os

    from ualinkd import callermem

    page = mmap.PAGESIZE
    pages = 64
    monkeypatch.setattr(callermem, "SPLIT_MIN", 16 * page)
    monkeypatch.setattr(callermem, "SPLIT_PIECE", 5 * page)
    cpus = [2]
    monkeypatch.setattr(callermem, "_cpus", lambda: cpus[0])
    libc = _libc_mmap()
    base = libc.mmap(None, pages * page, mmap.PROT_READ | mmap.PROT_WRITE,
                     mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    data = os.urandom(pages * page)
    ctypes.memmove(base, data, len(data))
    memfd = os.memfd_create("ualinkd-test-split", os.MFD_CLOEXEC)
    os.ftruncate(memfd, pages * page)
    sizes = [1000, 3 * page + 17, 29 * page, 5 * page - 1017, 27 * page]
    assert sum(sizes) == pages * page

    async def main() -> None:
        mem = CallerMemory().open_process(os.getpid())
        try:
            before = callermem.splits
            bufs = [bytearray(n) for n in sizes]
            assert await mem.readv(base, [memoryview(b) for b in bufs]) == pages * page
            assert b"".join(bufs) == data
            assert callermem.splits == before + 1
            # back, from other bytes, into the process
            other = os.urandom(pages * page)
            views, pos = [], 0
            for n in sizes:
                views.append(memoryview(other)[pos : pos + n])
                pos += n
            assert await mem.writev(base, views) == pages * page
            assert ctypes.string_at(base, pages * page) == other
            # a shared BO: its memfd from the process, then the process from it
            assert await mem.readv(base, [(memfd, 0, pages * page)]) == pages * page
            assert os.pread(memfd, pages * page, 0) == other
            os.pwrite(memfd, data, 0)
            assert await mem.writev(base, [(memfd, 0, pages * page)]) == pages * page
            assert ctypes.string_at(base, pages * page) == data
            assert callermem.splits == before + 4
            cpus[0] = 1  # pinned: one move
            assert await mem.readv(base, [(memfd, 0, pages * page)]) == pages * page
            assert callermem.splits == before + 4
        finally:
            mem.close()

    try:
        trio.run(main)
    finally:
        os.close(memfd)
        libc.munmap(base, pages * page)


def test_a_fault_mid_copy_stops_at_the_same_place_with_splits_allowed(monkeypatch, tmp_path):
    """Policy 10 with _split_move on: a range the maps check finds readable but that faults
    part-way — a file mapped past its end (SIGBUS pages) after anonymous memory — is never
    split (the halves could not stop together), and the copy stops at the first page past
    the file's end, nothing stored beyond it; an anonymous range whose PROT_NONE page the
    check finds is split up to it only."""
    import ctypes
    import mmap
    import os

    from ualinkd import callermem

    page = mmap.PAGESIZE
    monkeypatch.setattr(callermem, "SPLIT_MIN", 8 * page)
    monkeypatch.setattr(callermem, "SPLIT_PIECE", 3 * page)
    monkeypatch.setattr(callermem, "_cpus", lambda: 2)
    libc = _libc_mmap()
    anon, tail = 32, 8
    base = libc.mmap(None, (anon + tail) * page, mmap.PROT_READ | mmap.PROT_WRITE,
                     mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    data = os.urandom(anon * page)
    ctypes.memmove(base, data, len(data))
    f = tmp_path / "one-page"
    f.write_bytes(b"\x77" * page)
    fd = os.open(f, os.O_RDWR)
    MAP_FIXED = 0x10
    got_at = libc.mmap(base + anon * page, tail * page, mmap.PROT_READ | mmap.PROT_WRITE,
                       mmap.MAP_SHARED | MAP_FIXED, fd, 0)
    assert got_at == base + anon * page

    async def main() -> None:
        mem = CallerMemory().open_process(os.getpid())
        try:
            before = callermem.splits
            buf = bytearray(b"\xaa" * ((anon + tail) * page))
            n = await mem.readv(base, [memoryview(buf)])
            assert n == (anon + 1) * page  # the file's one page, then its end
            assert bytes(buf[:n]) == data + b"\x77" * page
            assert bytes(buf[n:]) == b"\xaa" * (len(buf) - n)
            assert callermem.splits == before
            # anonymous up to a PROT_NONE page: split, and stopped at it
            libc.mprotect(base + 20 * page, page, 0)
            buf = bytearray(b"\xaa" * (anon * page))
            assert await mem.readv(base, [memoryview(buf)]) == 20 * page
            assert bytes(buf[: 20 * page]) == data[: 20 * page]
            assert bytes(buf[20 * page :]) == b"\xaa" * (12 * page)
            assert callermem.splits == before + 1
        finally:
            mem.close()

    try:
        trio.run(main)
    finally:
        libc.munmap(base, (anon + tail) * page)
        os.close(fd)


def test_many_buffers_stop_exactly_at_the_first_page_the_process_lacks():
    """ProcMemory.readv/writev over many small buffers (a VRAM BO's 64 KiB chunks; here
    1000-byte ones, not page-aligned): the accessible prefix is cut inside the buffer it
    ends in, the count is exact and no byte past it moves (the batch's running length,
    no longer summed per buffer)."""
    import ctypes
    import mmap
    import os

    page = mmap.PAGESIZE
    libc = _libc_mmap()
    base = libc.mmap(None, 8 * page, mmap.PROT_READ | mmap.PROT_WRITE,
                     mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    data = os.urandom(8 * page)
    ctypes.memmove(base, data, len(data))
    libc.mprotect(base + 5 * page, 3 * page, mmap.PROT_READ)

    async def main() -> None:
        mem = CallerMemory().open_process(os.getpid())
        try:
            bufs = [bytearray(b"\xaa" * 1000) for _ in range(8 * page // 1000)]
            total = 1000 * len(bufs)
            assert await mem.readv(base, [memoryview(b) for b in bufs]) == total
            assert b"".join(bufs) == data[:total]
            src = os.urandom(total)
            views = [memoryview(src)[k : k + 1000] for k in range(0, total, 1000)]
            assert await mem.writev(base, views) == 5 * page  # then read-only pages
            assert ctypes.string_at(base, 8 * page) == src[: 5 * page] + data[5 * page :]
        finally:
            mem.close()

    try:
        trio.run(main)
    finally:
        libc.munmap(base, 8 * page)


def test_a_kept_mapping_is_populated_and_its_holes_looked_for_once(monkeypatch):
    """callermem._Kept: the copies of a shared BO through its kept mapping fault its pages
    in once, not per copy (a MADV_POPULATE of 64 MiB already mapped cost 2-3 ms a copy),
    and a range written through it is known to have no hole (no SEEK_HOLE walk per copy
    toward the process); the bytes are the same."""
    import ctypes
    import mmap
    import os

    from ualinkd import callermem

    page = mmap.PAGESIZE
    populates: list[tuple[int, bool]] = []
    walks: list[int] = []
    populate, file_ranges = callermem._populate, callermem._file_ranges
    monkeypatch.setattr(callermem, "_populate", lambda m, s, n, w: (
        populates.append((n, w)), populate(m, s, n, w))[1])
    monkeypatch.setattr(callermem, "_file_ranges", lambda fd, off, n: (
        walks.append(n), file_ranges(fd, off, n))[1])
    src = mmap.mmap(-1, 8 * page, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    data = os.urandom(8 * page)
    src[:] = data
    base = ctypes.addressof(ctypes.c_char.from_buffer(src))
    memfd = os.memfd_create("ualinkd-test-kept", os.MFD_CLOEXEC)
    os.ftruncate(memfd, 8 * page)

    async def main() -> None:
        mem = CallerMemory().open_process(os.getpid())
        try:
            for _ in range(3):
                assert await mem.readv(base, [(memfd, 0, 8 * page)]) == 8 * page
            assert populates == [(8 * page, True)]
            for _ in range(3):
                assert await mem.writev(base + 8, [(memfd, 0, 4 * page)]) == 4 * page
            assert populates == [(8 * page, True)] and walks == []
        finally:
            mem.close()

    try:
        trio.run(main)
        assert os.pread(memfd, 8 * page, 0) == data
        assert bytes(src[8 : 8 + 4 * page]) == data[: 4 * page]
    finally:
        os.close(memfd)


def test_a_quick_access_is_answered_without_going_back_to_trio():
    """CallerMemory.run(quick=True) (issue 34: an SDMA submission's ring read, fence and
    rptr writes): the worker hands a small access's answer straight back to the trio
    thread waiting for it, so no other task runs in between (no trip through trio's
    wake-up and scheduler); one that takes longer than QUICK_WAIT is awaited as any other,
    with its right answer; the worker slot is given back either way."""
    import random
    import time

    from ualinkd import callermem

    async def main() -> None:
        mem = CallerMemory(workers=2)
        others: list[int] = []

        async def other() -> None:
            others.append(1)

        async with trio.open_nursery() as n:
            n.start_soon(other)
            assert await mem.run(lambda: 41 + 1, quick=True) == 42
            assert others == []  # (not a schedule point: the other task has not run yet)
        assert others == [1]
        slow = callermem.QUICK_WAIT * 20
        assert await mem.run(lambda: time.sleep(slow) or "late", quick=True) == "late"
        # answers that come about when the quick wait gives up: each still its own
        for i in range(200):
            delay = random.uniform(0, 2 * callermem.QUICK_WAIT)
            assert await mem.run(lambda i=i, d=delay: time.sleep(d) or i, quick=True) == i
        assert mem._limiter.borrowed_tokens == 0 and mem.stuck == 0

    trio.run(main)


def test_no_quick_wait_while_a_worker_is_stuck(monkeypatch):
    """With a worker stuck in an access past its deadline (a client whose memory hangs), a
    quick access is awaited in trio from the start: the trio thread never blocks on it, so
    another task can still run while it waits (here the task that lets it finish)."""
    from ualinkd import callermem

    monkeypatch.setattr(callermem, "QUICK_WAIT", 5.0)
    stuck = threading.Event()
    go = threading.Event()

    async def main() -> None:
        mem = CallerMemory(timeout=0.1, workers=4)
        with pytest.raises(DrmError):
            await mem.run(stuck.wait)
        assert mem.stuck == 1

        async def release() -> None:
            go.set()

        async with trio.open_nursery() as n:
            n.start_soon(release)
            # (a blocked trio thread would leave `go` unset: wait() False after 3 s)
            assert await mem.run(lambda: go.wait(3), quick=True) is True
        stuck.set()

    trio.run(main)


@pytest.mark.parametrize("sizes", [[7], [3, 4], [1, 1, 1, 1, 1, 1, 1], [10], [2, 9, 1]])
@pytest.mark.parametrize("piece", [1, 2, 3, 5, 16])
def test_pieces_cut_views_into_consecutive_equal_pieces(sizes, piece):
    """callermem._pieces: the split move's pieces are the views' bytes in order, each
    `piece` long but the last, none empty."""
    from ualinkd.callermem import _pieces

    data = bytes(range(sum(sizes)))
    views, pos = [], 0
    for n in sizes:
        views.append(memoryview(data)[pos : pos + n])
        pos += n
    out = _pieces(views, piece)
    assert b"".join(b"".join(bytes(v) for v in p) for p in out) == data
    lengths = [sum(len(v) for v in p) for p in out]
    assert all(n == piece for n in lengths[:-1]) and 0 < lengths[-1] <= piece
    assert all(len(v) for p in out for v in p)
