"""Syncobj fds on a real node through raw ioctl(2) (drm_syncobj.c; userspace-surface.md
§2.5, §7 item 7): HANDLE_TO_FD's token opened at <mount>/dmabuf/<token> is a real fd that
FD_TO_HANDLE takes back (through /proc, as PRIME_FD_TO_HANDLE), and SYNCOBJ_EVENTFD
signals this process's own eventfd from the daemon."""

from __future__ import annotations

import ctypes
import errno
import os
import select
import struct
import time

import pytest
from nodes import call, errno_of

from ualinkd.abi import structs as st
from ualinkd.abi.ioc import iowr

pytestmark = pytest.mark.integration

CREATE, SIGNAL = iowr(0xBF, 8), iowr(0xC5, 16)
TO_FD, FROM_FD, TRANSFER, EVENTFD = iowr(0xC1, 16), iowr(0xC2, 16), iowr(0xCC, 32), iowr(0xCF, 24)
EXPORT_SYNC_FILE = IMPORT_SYNC_FILE = 1


@pytest.fixture
def fds(node):
    opened = [os.open(node.render(), os.O_RDWR) for _ in range(2)]
    yield opened
    for fd in opened:
        os.close(fd)


def create(fd: int, signaled: bool = False) -> int:
    return struct.unpack_from("<I", call(fd, CREATE, struct.pack("<II", 0, int(signaled))))[0]


def to_fd(node, fd: int, handle: int, flags: int = 0) -> int:
    """HANDLE_TO_FD, then the token turned into a real fd as the shim does (O_CLOEXEC)."""
    out = call(fd, TO_FD, st.SYNCOBJ_HANDLE.encode(st.DrmSyncobjHandle(handle, flags, -1, 0)))
    token = st.SYNCOBJ_HANDLE.decode(out).fd
    return os.open(node.mount / "dmabuf" / str(token), os.O_RDWR | os.O_CLOEXEC)


def from_fd(fd: int, sfd: int, flags: int = 0, handle: int = 0) -> int:
    out = call(fd, FROM_FD, st.SYNCOBJ_HANDLE.encode(st.DrmSyncobjHandle(handle, flags, sfd, 0)))
    return st.SYNCOBJ_HANDLE.decode(out).handle


def signal(fd: int, handle: int) -> None:
    arr = (ctypes.c_uint32 * 1)(handle)
    call(fd, SIGNAL, struct.pack("<QII", ctypes.addressof(arr), 1, 0))


def readable(efd: int) -> bool:
    return bool(select.select([efd], [], [], 0)[0])


def test_syncobj_fd_round_trip_between_two_files(node, fds):
    """A syncobj shared through its fd: signaling it in one file is seen in the other
    (an eventfd registered there fires)."""
    a, b = fds
    h = create(a)
    sfd = to_fd(node, a, h)
    try:
        h2 = from_fd(b, sfd)
        efd = os.eventfd(0, os.EFD_NONBLOCK)
        try:
            call(b, EVENTFD, st.SYNCOBJ_EVENTFD.encode(st.DrmSyncobjEventfd(h2, 0, 0, efd, 0)))
            assert not readable(efd)
            signal(a, h)
            assert os.eventfd_read(efd) == 1
        finally:
            os.close(efd)
    finally:
        os.close(sfd)


def test_sync_file_export_import(node, fds):
    a, _ = fds
    src, dst = create(a, signaled=True), create(a)
    sync = to_fd(node, a, src, EXPORT_SYNC_FILE)
    try:
        from_fd(a, sync, IMPORT_SYNC_FILE, dst)
        efd = os.eventfd(0, os.EFD_NONBLOCK)
        try:
            call(a, EVENTFD, st.SYNCOBJ_EVENTFD.encode(st.DrmSyncobjEventfd(dst, 0, 0, efd, 0)))
            assert os.eventfd_read(efd) == 1  # dst has a (signaled) fence: at once
        finally:
            os.close(efd)
    finally:
        os.close(sync)


def test_fd_to_handle_of_other_fds_is_einval(node, fds, tmp_path):
    a, _ = fds
    plain = os.open(tmp_path / "x", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        for fd in (plain, 987654):
            data = st.SYNCOBJ_HANDLE.encode(st.DrmSyncobjHandle(0, 0, fd, 0))
            assert errno_of(a, FROM_FD, data) == errno.EINVAL
    finally:
        os.close(plain)


def test_eventfd_errnos_and_transfer(node, fds, tmp_path):
    """EVENTFD of a closed fd → EBADF, of a regular file → EINVAL; TRANSFER to a timeline
    point, then an eventfd on that point fires at once."""
    a, _ = fds
    h, t = create(a, signaled=True), create(a)
    plain = os.open(tmp_path / "y", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        for fd, err in ((987654, errno.EBADF), (plain, errno.EINVAL)):
            data = st.SYNCOBJ_EVENTFD.encode(st.DrmSyncobjEventfd(h, 0, 0, fd, 0))
            assert errno_of(a, EVENTFD, data) == err
    finally:
        os.close(plain)
    call(a, TRANSFER, st.SYNCOBJ_TRANSFER.encode(st.DrmSyncobjTransfer(h, t, 0, 9, 0, 0)))
    efd = os.eventfd(0, os.EFD_NONBLOCK)
    try:
        call(a, EVENTFD, st.SYNCOBJ_EVENTFD.encode(st.DrmSyncobjEventfd(t, 0, 9, efd, 0)))
        assert os.eventfd_read(efd) == 1
    finally:
        os.close(efd)


def test_pending_eventfds_are_released_with_the_syncobj(node):
    """The daemon's own eventfd references of a syncobj that never signals go when its last
    holder (the render fd) closes: the daemon's fd count is back where it was."""
    def daemon_fds() -> int:
        return len(os.listdir(f"/proc/{node.proc.pid}/fd"))

    fd = os.open(node.render(), os.O_RDWR)
    before = daemon_fds()
    efds = [os.eventfd(0, os.EFD_NONBLOCK) for _ in range(5)]
    try:
        h = create(fd)
        for efd in efds:
            call(fd, EVENTFD, st.SYNCOBJ_EVENTFD.encode(st.DrmSyncobjEventfd(h, 0, 3, efd, 0)))
        assert daemon_fds() == before + 5
        assert not any(readable(e) for e in efds)
    finally:
        os.close(fd)
        for efd in efds:
            os.close(efd)
    deadline = time.monotonic() + 10  # FUSE sends RELEASE after close() has returned
    while daemon_fds() != before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert daemon_fds() == before
