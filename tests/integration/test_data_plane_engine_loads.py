"""The C data plane's engine loads (fuse/dataplane.c `ualinkd_dp_load_into`, issue 34)
against a hand-driven exporter on a real socket: an answer is received straight into the
engine's buffer and posted LOADED; an answer that stops half way past the load's deadline
is posted EXPIRED and the rest of it, when it comes, never touches the buffer (Python may
have reused it), the channel carrying the next load byte-exact; a channel that breaks half
way through an answer posts the load FALLBACK (the link's to load) and writes no more; a
DATA not the whole answer is FALLBACK; the data plane stopped with loads out posts them
all (-errno), none lost, none twice."""

from __future__ import annotations

import errno
import select
import socket
import struct
import time
from collections.abc import Callable

import pytest

from ualinkd.drm.completion import Completion
from ualinkd.fabric.wire import FrameType
from ualinkd.fuse.dataplane import EXPIRED, FALLBACK, LOADED, DataPlane

pytestmark = pytest.mark.integration
LOAD = struct.Struct("<IBIHHQII")  # fabric/wire.py's LOAD frame
DATA_HEAD = struct.Struct("<IBIi")
OUR_ACCEL, PEER_ACCEL, NPA = 0, 1, 0x80_0000_0000
SIZE = 256 * 1024  # (past DP_SPLICE_MIN: the answer's head is read alone either way)


@pytest.fixture
def peer(plane: DataPlane, open_channel: Callable[..., socket.socket]) -> socket.socket:
    """The exporter's end of a data channel (conftest.py's), its loads' deadline 0.3 s."""
    plane.set_timeout(0.3)
    return open_channel({PEER_ACCEL})


def take_load(peer: socket.socket) -> tuple[int, int, int]:
    """The LOAD the data plane sent: (seq, npa, length)."""
    frame = b""
    while len(frame) < LOAD.size:
        got = peer.recv(LOAD.size - len(frame))
        assert got
        frame += got
    _, ft, seq, src, dst, npa, length, _ = LOAD.unpack(frame)
    assert (ft, src, dst) == (FrameType.LOAD, OUR_ACCEL, PEER_ACCEL)
    return seq, npa, length


def outcome(plane: DataPlane, c: Completion[int], within: float = 5.0) -> int:
    """The load's outcome once the thread posted it (what the FUSE session's task does)."""
    deadline = time.monotonic() + within
    while not c.done:
        assert time.monotonic() < deadline, "no outcome posted"
        select.select([plane.notify_fd], [], [], 0.05)
        plane.finish_loads()
    return c.result()


def test_an_answer_lands_in_the_buffer_and_is_posted_loaded(plane, peer):
    buf = bytearray(b"\xee" * (SIZE + 8))
    c = plane.load_into(OUR_ACCEL, PEER_ACCEL, NPA, buf, 4, SIZE)
    assert c is not None
    seq, npa, length = take_load(peer)
    assert (npa, length) == (NPA, SIZE)
    data = bytes((i * 13) & 0xFF for i in range(SIZE))
    peer.sendall(DATA_HEAD.pack(9 + SIZE, FrameType.DATA, seq, 0) + data)
    assert outcome(plane, c) == LOADED
    assert buf[4:4 + SIZE] == data and buf[:4] == buf[-4:] == b"\xee" * 4


def test_an_answer_half_received_past_its_deadline_never_touches_the_buffer_again(
        plane, peer):
    buf = bytearray(SIZE)
    c = plane.load_into(OUR_ACCEL, PEER_ACCEL, NPA, buf, 0, SIZE)
    assert c is not None
    seq, _, _ = take_load(peer)
    peer.sendall(DATA_HEAD.pack(9 + SIZE, FrameType.DATA, seq, 0) + b"\x11" * (SIZE // 2))
    assert outcome(plane, c) == EXPIRED
    buf[:] = b"\x55" * SIZE  # (Python's again: the next copy's bytes)
    peer.sendall(b"\x22" * (SIZE - SIZE // 2))  # the rest of the late answer
    # the next load on the channel: byte-exact, and the old buffer untouched
    buf2 = bytearray(SIZE)
    c2 = plane.load_into(OUR_ACCEL, PEER_ACCEL, NPA + SIZE, buf2, 0, SIZE)
    assert c2 is not None
    seq2, npa2, _ = take_load(peer)
    assert npa2 == NPA + SIZE and seq2 != seq
    peer.sendall(DATA_HEAD.pack(9 + SIZE, FrameType.DATA, seq2, 0) + b"\x33" * SIZE)
    assert outcome(plane, c2) == LOADED
    assert buf2 == b"\x33" * SIZE and buf == b"\x55" * SIZE
    assert plane.engine_stats() == (1, 1)


def test_a_channel_broken_half_way_through_an_answer_posts_fallback(plane, peer):
    buf = bytearray(SIZE)
    c = plane.load_into(OUR_ACCEL, PEER_ACCEL, NPA, buf, 0, SIZE)
    assert c is not None
    seq, _, _ = take_load(peer)
    peer.sendall(DATA_HEAD.pack(9 + SIZE, FrameType.DATA, seq, 0) + b"\x11" * 1000)
    peer.close()
    assert outcome(plane, c) == FALLBACK
    assert plane.load_into(OUR_ACCEL, PEER_ACCEL, NPA, buf, 0, SIZE) is None  # (no channel)


@pytest.mark.parametrize("how", ["short", "refused"])
def test_a_data_not_the_whole_answer_is_the_links_to_load(plane, peer, how):
    buf = bytearray(b"\xee" * SIZE)
    c = plane.load_into(OUR_ACCEL, PEER_ACCEL, NPA, buf, 0, SIZE)
    assert c is not None
    seq, _, _ = take_load(peer)
    if how == "short":
        peer.sendall(DATA_HEAD.pack(9 + 100, FrameType.DATA, seq, 0) + b"\x11" * 100)
    else:
        peer.sendall(DATA_HEAD.pack(9, FrameType.DATA, seq, -errno.EAGAIN))
    assert outcome(plane, c) == FALLBACK
    assert buf == b"\xee" * SIZE


def test_loads_out_when_the_data_plane_stops_are_each_posted_once(plane, peer):
    bufs = [bytearray(SIZE) for _ in range(3)]
    loads = [plane.load_into(OUR_ACCEL, PEER_ACCEL, NPA + i * SIZE, b, 0, SIZE)
             for i, b in enumerate(bufs)]
    assert all(c is not None for c in loads)
    for _ in loads:
        take_load(peer)
    plane.stop(errno.ESHUTDOWN)
    assert [c.result() for c in loads if c is not None] == [-errno.ESHUTDOWN] * 3
    assert plane._loads == {}
