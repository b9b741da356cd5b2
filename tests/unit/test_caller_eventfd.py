"""daemon.CallerEventFd, the daemon's copy of a caller's eventfd (drm_syncobj_eventfd_ioctl
→ eventfd_ctx_fdget): a caller can swap the fd for another file between the daemon's check
of its /proc link and its pidfd_getfd. The copy is then EINVAL, as eventfd_ctx_fdget
answers, and it is closed on a thread of its own: the swapped-in file may be one of the
daemon's own mount, whose close sends FLUSH to the FUSE thread that is closing it, which
then waits for itself for good (helper audit A hung a node so, as uid 65534)."""

from __future__ import annotations

import errno
import os
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
