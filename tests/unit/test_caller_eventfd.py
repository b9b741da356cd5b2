"""daemon.CallerEventFd, the daemon's copy of a caller's eventfd (drm_syncobj_eventfd_ioctl
→ eventfd_ctx_fdget): a caller can swap the fd for another file between the daemon's check
of its /proc link and its pidfd_getfd. The copy is then EINVAL, as eventfd_ctx_fdget
answers, and it is closed on a thread of its own: the swapped-in file may be one of the
daemon's own mount, whose close sends FLUSH to the FUSE thread that is closing it, which
then waits for itself for good (helper audit A hung a node so, as uid 65534)."""

from __future__ import annotations

import errno
import os
import select
import tempfile
import threading
import time

import pytest

from ualinkd import daemon
from ualinkd.drm.errors import DrmError


def test_a_file_swapped_in_for_the_eventfd_is_einval_and_closed_off_this_thread(
        monkeypatch) -> None:
    with tempfile.TemporaryFile() as f:
        fd = os.dup(f.fileno())  # what the "caller" (this process) swapped in
        real_readlink = os.readlink

        def readlink(path: str) -> str:  # the check before the swap still saw an eventfd
            if path == f"/proc/{os.getpid()}/fd/{fd}":
                return "anon_inode:[eventfd]"
            return real_readlink(path)

        closed: list[tuple[int, str]] = []
        real_close = os.close

        def close(n: int) -> None:
            closed.append((n, threading.current_thread().name))
            real_close(n)

        monkeypatch.setattr(os, "readlink", readlink)
        monkeypatch.setattr(os, "close", close)
        held = daemon.CallerEventFd.held.by_tgid.get(os.getpid(), 0)
        with pytest.raises(DrmError) as e:
            daemon.CallerEventFd(os.getpid(), fd)
        assert e.value.errno == errno.EINVAL
        deadline = time.monotonic() + 5
        while not [t for n, t in closed if t == "ualinkd-closer"]:
            assert time.monotonic() < deadline, "the copy was never closed"
            time.sleep(0.01)
        here = threading.current_thread().name
        copies = [n for n, t in closed if t == "ualinkd-closer"]
        assert len(copies) == 1 and copies[0] != fd
        # On this thread only the pidfd was closed, never the caller's file.
        assert all(n != copies[0] for n, t in closed if t == here)
        assert daemon.CallerEventFd.held.by_tgid.get(os.getpid(), 0) == held  # quota back
        real_close(fd)


def _threads(name: str) -> int:
    return sum(t.name == name for t in threading.enumerate())


def test_a_caller_that_fills_its_eventfd_blocks_only_that_eventfd_s_writer() -> None:
    """eventfd_signal never blocks in the kernel. The daemon's write can (the file's flags
    are the caller's, and the counter may be filled to ULLONG_MAX-1 between the daemon's
    poll for room and its write: helper audit A hung a node so). Such a write blocks one
    signaller thread: the signal returns within SIGNAL_WAIT, another eventfd is readable
    as soon as its signal returns, and closing the blocked one ends its write."""
    stuck_fd, other_fd = os.eventfd(0), os.eventfd(0)
    try:
        stuck = daemon.CallerEventFd(os.getpid(), stuck_fd)
        other = daemon.CallerEventFd(os.getpid(), other_fd)
        stuck.signal()
        assert os.eventfd_read(stuck_fd) == 1  # written before signal() returned
        # The race, won for good: the counter at its maximum with room polled for. The
        # daemon's copy shares the file, so write to the copy as a filled counter allows.
        os.eventfd_write(stuck_fd, (1 << 64) - 2)
        real_poll = select.poll

        class Roomy:  # (the poll that said "room" just before the caller filled it)
            def __init__(self) -> None:
                self._p = real_poll()

            def register(self, fd: int, events: int) -> None:
                self._p.register(fd, events)

            def poll(self, timeout: int) -> list[tuple[int, int]]:
                return [(0, select.POLLOUT)]

        select.poll = Roomy  # type: ignore[assignment,misc]
        try:
            t = time.monotonic()
            stuck.signal()
            assert time.monotonic() - t < 1  # SIGNAL_WAIT, not forever
        finally:
            select.poll = real_poll  # type: ignore[misc]
        deadline = time.monotonic() + 5
        while not stuck._writing:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        other.signal()
        assert os.eventfd_read(other_fd) == 1  # readable as its signal returned
        stuck.close()  # ends the blocked write (a read of the counter), then closes
        deadline = time.monotonic() + 5
        while stuck._writing or _threads("ualinkd-eventfd-unstick"):
            assert time.monotonic() < deadline, "the blocked write was never ended"
            time.sleep(0.01)
        other.close()
    finally:
        os.close(stuck_fd)
        os.close(other_fd)
