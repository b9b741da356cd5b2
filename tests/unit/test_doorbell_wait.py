"""The doorbell watch's C poll (ualinkd/fuse/doorbells.c), as the GPU engine edge's watch
thread calls it: slots compared with their last values through a read-only mapping of a
doorbell memfd (the client's stores land there: userspace-surface §8, the doorbell is the
write pointer the client stores), the index of a slot that moved, -1 when the watched set's
generation moves or the edge stops, -2 past the timeout."""

from __future__ import annotations

import mmap
import os
import struct
import threading
import time

from ualinkd.fuse._fuse_ll import ffi, lib

MS = 1_000_000


def _slice() -> tuple[int, mmap.mmap]:
    fd = os.memfd_create("doorbells", os.MFD_CLOEXEC)
    os.ftruncate(fd, 8192)
    return fd, mmap.mmap(fd, 8192, mmap.MAP_SHARED, mmap.PROT_READ)


def _wait(m: mmap.mmap, offsets: list[int], lasts: list[int], timeout_ns: int,
          stop: object | None = None, gen: object | None = None, gen0: int = 0) -> int:
    buf = ffi.from_buffer(m)
    try:
        slots = ffi.new("uint64_t *[]", [ffi.cast("uint64_t *", buf + o) for o in offsets])
        return int(lib.ualinkd_doorbell_wait(
            slots, ffi.new("uint64_t[]", lasts), len(offsets), MS, 10 * MS, 2 * MS, timeout_ns,
            stop if stop is not None else ffi.new("int *"),
            gen if gen is not None else ffi.new("uint64_t *"), gen0))
    finally:
        ffi.release(buf)


def test_a_store_through_the_memfd_is_seen_and_names_its_slot() -> None:
    fd, m = _slice()
    try:
        assert _wait(m, [0, 8, 16], [0, 0, 0], 5 * MS) == -2  # nothing moved
        os.pwrite(fd, struct.pack("<Q", 0x40), 16)  # (a client's store, as the kernel sees it)
        assert _wait(m, [0, 8, 16], [0, 0, 0], 5 * MS) == 2
        assert _wait(m, [0, 8, 16], [0, 0, 0x40], 5 * MS) == -2  # caught up
    finally:
        m.close()
        os.close(fd)


def test_a_store_during_the_wait_wakes_it_within_a_few_polls() -> None:
    """The pickup after a quiet spell: within a few 1 ms polls (generous for a loaded
    machine; the point is the 50 ms of the old back-off)."""
    fd, m = _slice()
    try:
        t = threading.Timer(0.05, lambda: os.pwrite(fd, struct.pack("<Q", 8), 8))
        t.start()
        t0 = time.monotonic()
        assert _wait(m, [8], [0], 2000 * MS) == 0
        assert time.monotonic() - t0 < 1.0
        t.join()
    finally:
        m.close()
        os.close(fd)


def test_a_new_generation_or_stop_ends_the_wait() -> None:
    fd, m = _slice()
    try:
        gen, stop = ffi.new("uint64_t *", 5), ffi.new("int *")
        assert _wait(m, [0], [0], -1, stop, gen, 4) == -1  # already moved on
        threading.Timer(0.02, lambda: stop.__setitem__(0, 1)).start()
        assert _wait(m, [0], [0], -1, stop, gen, 5) == -1  # no timeout: the stop ends it
    finally:
        m.close()
        os.close(fd)
