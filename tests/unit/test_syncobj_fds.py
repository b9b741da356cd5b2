"""Syncobj fds, sans-IO (drm_syncobj.c: drm_syncobj_handle_to_fd_ioctl, _fd_to_handle_ioctl,
_transfer_ioctl, _eventfd_ioctl; userspace-surface.md §2.5, §7 item 7). The fd of
HANDLE_TO_FD is a token of the dma-buf namespace; the test node resolves a caller's "fd" to
the key of the same number, so an opened token's key doubles as the fd passed back."""

from __future__ import annotations

import errno
import struct

import pytest
import ualink_testkit as kit
from ualink_testkit import (
    CALLER,
    OTHER_UID,
    gem_create,
    ioctl,
    open_file,
    open_token,
    pod_config,
    prime_from_fd_raw,
    prime_to_token,
)

from ualinkd.abi import structs as st
from ualinkd.abi.ioc import iowr
from ualinkd.drm import syncobj as so
from ualinkd.drm.completion import Completion
from ualinkd.drm.errors import DrmError
from ualinkd.node import NodeCore, NodeServices

CREATE, DESTROY = iowr(0xBF, 8), iowr(0xC0, 8)
TO_FD, FROM_FD, TRANSFER, EVENTFD = iowr(0xC1, 16), iowr(0xC2, 16), iowr(0xCC, 32), iowr(0xCF, 24)
EXPORT_SYNC_FILE = IMPORT_SYNC_FILE = 1
WAIT_FOR_SUBMIT, WAIT_AVAILABLE = 2, 4


class FakeEventFd:
    def __init__(self, log: list, fd: int) -> None:
        self.log, self.fd, self.count, self.closed = log, fd, 0, False

    def signal(self) -> None:
        assert not self.closed
        self.count += 1

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def eventfds() -> list[FakeEventFd]:
    """The eventfds the node's edge opened (SYNCOBJ_EVENTFD), in order."""
    return []


@pytest.fixture
def core(eventfds: list[FakeEventFd]) -> NodeCore:
    def open_eventfd(pid: int, fd: int) -> FakeEventFd:
        if fd == 99:
            raise DrmError(errno.EBADF)
        e = FakeEventFd(eventfds, fd)
        eventfds.append(e)
        return e

    return NodeCore(pod_config(), "node0", NodeServices(resolve_fd=lambda pid, fd: fd,
                                                        open_eventfd=open_eventfd,
                                                        spawn=kit.lazy_spawn))


@pytest.fixture
def f(core):
    return open_file(core)


def create(f, signaled: bool = False) -> int:
    r = ioctl(f, CREATE, struct.pack("<II", 0, int(signaled)))
    assert r.result == 0
    return struct.unpack_from("<I", r.out)[0]


def to_fd_raw(f, handle: int, flags: int = 0, pad: int = 0, caller=CALLER):
    return ioctl(f, TO_FD, st.SYNCOBJ_HANDLE.encode(st.DrmSyncobjHandle(handle, flags, -1, pad)),
                 caller)


def to_fd(core, f, handle: int, flags: int = 0) -> int:
    """HANDLE_TO_FD, then what the shim does with the token: open it (the key is the fd)."""
    r = to_fd_raw(f, handle, flags)
    assert r.result == 0, r
    token = st.SYNCOBJ_HANDLE.decode(r.out).fd
    assert 0 < token < 1 << 31
    return open_token(core, token)


def from_fd_raw(f, fd: int, flags: int = 0, handle: int = 0, pad: int = 0):
    return ioctl(f, FROM_FD, st.SYNCOBJ_HANDLE.encode(st.DrmSyncobjHandle(handle, flags, fd, pad)))


def obj(f, handle: int) -> so.DrmSyncobj:
    found = f.syncobjs.find(handle)
    assert found is not None
    return found


# ---- HANDLE_TO_FD / FD_TO_HANDLE ----------------------------------------------------------------


def test_syncobj_file_shares_the_syncobj_across_files(core, f):
    """A syncobj file imported into another file is the same syncobj: a fence attached
    through one handle is seen through the other."""
    h = create(f)
    fd = to_fd(core, f, h)
    g = open_file(core)
    r = from_fd_raw(g, fd)
    assert r.result == 0
    h2 = struct.unpack_from("<I", r.out)[0]
    assert obj(g, h2) is obj(f, h)
    obj(g, h2).replace_fence(so.STUB)
    assert obj(f, h).has_point(0)


def test_syncobj_outlives_its_handles_while_a_file_holds_it(core, f, eventfds):
    """drm_syncobj kref: destroying the handle leaves the syncobj to its file; a pending
    eventfd is released only when the last reference (the file) goes."""
    h = create(f)
    so_obj = obj(f, h)
    assert ioctl(f, EVENTFD, st.SYNCOBJ_EVENTFD.encode(
        st.DrmSyncobjEventfd(h, 0, 0, 5, 0))).result == 0
    key = to_fd(core, f, h)
    assert ioctl(f, DESTROY, struct.pack("<II", h, 0)).result == 0
    assert so_obj.refs == 1 and not eventfds[0].closed
    core.dmabuf_release(key)
    assert so_obj.refs == 0 and eventfds[0].closed and eventfds[0].count == 0


@pytest.mark.parametrize("flags, pad, handle, err", [
    (0, 1, 1, errno.EINVAL), (2, 0, 1, errno.EINVAL), (3, 0, 1, errno.EINVAL),
    (0, 0, 77, errno.EINVAL),  # drm_syncobj_handle_to_fd: unknown handle → EINVAL
    (EXPORT_SYNC_FILE, 0, 77, errno.ENOENT),  # drm_syncobj_find_fence: ENOENT
    (EXPORT_SYNC_FILE, 0, 1, errno.EINVAL),  # no fence to export
])
def test_handle_to_fd_errnos(core, f, flags, pad, handle, err):
    create(f)
    r = to_fd_raw(f, handle, flags, pad)
    assert r.result == -err
    assert core.tokens.pending_count == 0


def test_export_and_import_sync_file(core, f):
    """EXPORT_SYNC_FILE of a signaled syncobj gives a sync file; IMPORT_SYNC_FILE puts its
    fence into another syncobj (which then has one)."""
    a, b = create(f, signaled=True), create(f)
    fd = to_fd(core, f, a, EXPORT_SYNC_FILE)
    assert from_fd_raw(f, fd, IMPORT_SYNC_FILE, handle=b).result == 0
    assert obj(f, b).has_point(0)
    assert from_fd_raw(f, fd, IMPORT_SYNC_FILE, handle=55).result == -errno.ENOENT


def test_fd_to_handle_refuses_other_files(core, f):
    """A dma-buf fd, a sync file without IMPORT_SYNC_FILE, a syncobj file with it, an fd
    that is no token at all: EINVAL; pad or unknown flags: EINVAL. And PRIME refuses a
    syncobj file (not a dma-buf)."""
    h = create(f, signaled=True)
    sobj = to_fd(core, f, h)
    sync = to_fd(core, f, h, EXPORT_SYNC_FILE)
    dmabuf = open_token(core, prime_to_token(f, gem_create(f)))
    for fd, flags in ((dmabuf, 0), (sync, 0), (sobj, IMPORT_SYNC_FILE), (dmabuf, 1),
                      (123456, 0)):
        assert from_fd_raw(f, fd, flags, handle=h).result == -errno.EINVAL, (fd, flags)
    assert from_fd_raw(f, sobj, pad=1).result == -errno.EINVAL
    assert from_fd_raw(f, sobj, flags=2).result == -errno.EINVAL
    assert prime_from_fd_raw(f, sobj).result == -errno.EINVAL


def test_tokens_are_the_callers_uid_only(core, f):
    """The same token rules as dma-bufs: another uid cannot open it."""
    h = create(f)
    token = st.SYNCOBJ_HANDLE.decode(to_fd_raw(f, h).out).fd
    with pytest.raises(DrmError) as ei:
        open_token(core, token, OTHER_UID)
    assert ei.value.errno == errno.ENOENT


def test_unopened_tokens_die_with_the_file(core, f):
    h = create(f)
    assert to_fd_raw(f, h).result == 0
    so_obj = obj(f, h)
    f.release()
    assert core.tokens.pending_count == 0 and so_obj.refs == 0


# ---- TRANSFER ---------------------------------------------------------------------------------


def transfer(f, src: int, dst: int, src_point: int = 0, dst_point: int = 0, flags: int = 0,
             pad: int = 0):
    return ioctl(f, TRANSFER, st.SYNCOBJ_TRANSFER.encode(
        st.DrmSyncobjTransfer(src, dst, src_point, dst_point, flags, pad)))


def test_transfer_binary_to_timeline_and_back(f):
    """dst_point ≠ 0: the source's fence becomes point dst_point of the destination's
    timeline; dst_point 0: it replaces the destination's fence (point 0 of a timeline is
    the chain itself, so QUERY sees its seqno)."""
    a, t, b = create(f, signaled=True), create(f), create(f)
    assert transfer(f, a, t, 0, 7).result == 0
    assert obj(f, t).query() == 7 and obj(f, t).has_point(7)
    assert transfer(f, t, b, 7, 0).result == 0
    assert obj(f, b).has_point(0) and obj(f, b).query() == 0  # a later point: the stub
    assert transfer(f, t, b, 0, 0).result == 0
    assert obj(f, b).query() == 7  # point 0: the chain head itself


@pytest.mark.parametrize("args, err", [
    ((1, 2, 0, 0, 0, 1), errno.EINVAL),  # pad
    ((1, 2, 0, 0, 1, 0), errno.EINVAL),  # WAIT_ALL is not a transfer flag
    ((1, 9, 0, 0, 0, 0), errno.ENOENT),  # destination
    ((9, 2, 0, 0, 0, 0), errno.ENOENT),  # source
    ((2, 1, 0, 5, 0, 0), errno.EINVAL),  # the source has no fence
    ((1, 2, 3, 0, 0, 0), errno.EINVAL),  # a plain fence has no point 3
])
def test_transfer_errnos(f, args, err):
    create(f, signaled=True)
    create(f)
    assert transfer(f, *args).result == -err


class FakeWaits:
    """SyncWaits whose wait finishes with ready()'s answer when driven (no real time)."""

    def __init__(self) -> None:
        self.deadlines: list[int | None] = []

    def now_ns(self) -> int:
        return 1_000

    def wait_until(self, deadline_ns, ready, keys):
        self.deadlines.append(deadline_ns)

        async def wait() -> bool:
            return ready()

        return wait()

    def wake(self, key) -> None:
        pass


def test_transfer_wait_for_submit_waits_for_the_fence(f):
    """WAIT_FOR_SUBMIT with no fence yet: the ioctl waits (deadline now + 5 s, as
    drm_syncobj_find_fence) and transfers once the fence arrives; ETIME if none does."""
    waits = FakeWaits()
    f.device.waits = waits
    a, b = create(f), create(f)
    pending = transfer(f, a, b, 0, 0, WAIT_FOR_SUBMIT)
    assert isinstance(pending, Completion) and not pending.done
    obj(f, a).replace_fence(so.STUB)
    assert kit.run(pending).result == 0 and obj(f, b).has_point(0)
    assert waits.deadlines == [1_000 + so.WAIT_FOR_SUBMIT_TIMEOUT_NS]
    c = create(f)
    assert kit.run(transfer(f, c, b, 0, 0, WAIT_FOR_SUBMIT)).result == -errno.ETIME


# ---- EVENTFD ----------------------------------------------------------------------------------


def eventfd(f, handle: int, fd: int = 5, point: int = 0, flags: int = 0, pad: int = 0):
    return ioctl(f, EVENTFD, st.SYNCOBJ_EVENTFD.encode(
        st.DrmSyncobjEventfd(handle, flags, point, fd, pad)))


def test_eventfd_signaled_at_once_or_when_the_point_arrives(f, eventfds):
    """A point that has a fence signals the eventfd at once (all fences are signaled);
    a later one when a fence for it arrives, once, and the daemon's reference is closed."""
    h = create(f, signaled=True)
    assert eventfd(f, h).result == 0
    assert (eventfds[0].count, eventfds[0].closed) == (1, True)
    t = create(f)
    assert eventfd(f, t, point=3).result == 0
    assert eventfd(f, t, point=5, flags=WAIT_AVAILABLE).result == 0
    pending = eventfds[1:]
    assert [e.count for e in pending] == [0, 0]
    obj(f, t).add_point(4)
    assert [e.count for e in pending] == [1, 0]
    obj(f, t).add_point(5)
    obj(f, t).add_point(6)
    assert [(e.count, e.closed) for e in pending] == [(1, True), (1, True)]
    assert obj(f, t).pending_eventfds == 0


@pytest.mark.parametrize("kw, err", [
    ({"flags": 1}, errno.EINVAL), ({"flags": 2}, errno.EINVAL), ({"pad": 1}, errno.EINVAL),
    ({"handle": 42}, errno.ENOENT), ({"fd": 99}, errno.EBADF),
])
def test_eventfd_errnos(f, eventfds, kw, err):
    h = create(f)
    args = {"handle": h, **kw}
    assert eventfd(f, **args).result == -err
    assert eventfds == []


def test_eventfd_pending_entries_are_capped(f, eventfds):
    """Emulator limit: each pending entry holds a duplicated fd in the daemon."""
    h = create(f)
    for _ in range(so.MAX_EVENTFDS_PER_SYNCOBJ):
        assert eventfd(f, h).result == 0
    assert eventfd(f, h).result == -errno.ENOMEM
    assert eventfds[-1].closed
