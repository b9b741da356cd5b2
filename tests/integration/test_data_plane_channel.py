"""The C data plane's exporter side (fuse/dataplane.c) against a hand-driven peer on a real
socket: it answers a LOAD from its routes with the bytes as they are now, answers anything
else DP_FALLBACK (the importer asks again on the link, where Python decides), drops every
route at a flush, and drops a channel that sends what no data channel carries, with one
log line, while the others are served."""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import select
import socket
import struct
import time
from collections.abc import Callable

import pytest

from ualinkd.amdgpu import translation
from ualinkd.amdgpu.memory import CHUNK
from ualinkd.fabric.wire import FrameType
from ualinkd.fuse.dataplane import FAST_MAX, DataPlane

pytestmark = pytest.mark.integration
LOAD = struct.Struct("<IBIHHQII")  # fabric/wire.py's LOAD frame
DATA_HEAD = struct.Struct("<IBIi")
STORE = struct.Struct("<IBIHHQI")  # fabric/wire.py's STORE frame, before its bytes
PEER_ACCEL, OUR_ACCEL, NPA = 1, 0, 0x80_0000_0000
OTHER_ACCEL = 2  # the peer's second accel
FALLBACK = -errno.EAGAIN


@pytest.fixture
def channel(open_channel: Callable[..., socket.socket]) -> socket.socket:
    """The peer's end of a data channel (conftest.py's) to its two accels."""
    return open_channel({PEER_ACCEL, OTHER_ACCEL})


def load(peer: socket.socket, seq: int, npa: int, length: int, src: int = PEER_ACCEL,
         dst: int = OUR_ACCEL) -> tuple[int, int, bytes]:
    peer.sendall(LOAD.pack(LOAD.size - 4, FrameType.LOAD, seq, src, dst, npa, length, 0))
    return answer(peer)


def answer(peer: socket.socket) -> tuple[int, int, bytes]:
    head = recv_exactly(peer, DATA_HEAD.size)
    length, ft, seq, status = DATA_HEAD.unpack(head)
    assert ft == FrameType.DATA
    return seq, status, recv_exactly(peer, length - 9)


def recv_exactly(peer: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        got = peer.recv(n - len(out))
        assert got, "the data plane closed the channel"
        out += got
    return out


def test_a_load_a_route_covers_is_answered_with_the_bytes_as_they_are_now(
        plane: DataPlane, channel: socket.socket) -> None:
    """Routes of two chunks side by side and one that reads as zeros: a LOAD inside one, one
    across two, one of the zero chunk; a later write to the chunk is what the next LOAD
    reads; a LOAD past the routes, from an accel that is not the peer's, or longer than
    the fast path carries is answered DP_FALLBACK."""
    a, b = bytearray(range(256)) * 16, bytearray(b"\xab" * 4096)
    plane.route_export(PEER_ACCEL, OUR_ACCEL, NPA, 4096, a, 0)
    plane.route_export(PEER_ACCEL, OUR_ACCEL, NPA + 4096, 4096, b, 0)
    plane.route_export(PEER_ACCEL, OUR_ACCEL, NPA + 8192, 4096, None, 0)
    assert load(channel, 1, NPA + 100, 50) == (1, 0, bytes(a[100:150]))
    assert load(channel, 2, NPA + 4000, 200) == (2, 0, bytes(a[4000:] + b[:104]))
    assert load(channel, 3, NPA + 8192, 4096) == (3, 0, bytes(4096))
    a[100:105] = b"hello"
    assert load(channel, 4, NPA + 100, 5) == (4, 0, b"hello")
    assert load(channel, 5, NPA + 8192 + 4000, 200) == (5, FALLBACK, b"")  # past the routes
    assert load(channel, 6, NPA, 16, src=7) == (6, FALLBACK, b"")  # not the peer's accel
    assert load(channel, 7, NPA, 16, dst=3) == (7, FALLBACK, b"")  # not that accel's route
    assert load(channel, 8, NPA, FAST_MAX + 1) == (8, FALLBACK, b"")
    s = plane.stats()
    assert (s["served"], s["refused"], s["channels"]) == (4, 4, 1)


def test_a_translation_change_drops_every_route(plane: DataPlane,
                                                channel: socket.socket) -> None:
    """amdgpu/translation.py's changed() (a VM or NPA mapping, an importer, a BO's memory):
    the next LOAD of a route learnt before it is DP_FALLBACK."""
    chunk = bytearray(4096)
    plane.route_export(PEER_ACCEL, OUR_ACCEL, NPA, 4096, chunk, 0)
    assert load(channel, 1, NPA, 8)[1] == 0
    translation.changed()
    assert load(channel, 2, NPA, 8) == (2, FALLBACK, b"")


@pytest.mark.parametrize("frame", [
    LOAD.pack(LOAD.size - 4, FrameType.PING, 1, 1, 0, NPA, 8, 0),  # not a data-channel frame
    LOAD.pack(LOAD.size - 3, FrameType.LOAD, 1, 1, 0, NPA, 8, 0) + b"x",  # a LOAD's length wrong
    DATA_HEAD.pack(9 + FAST_MAX + 1, FrameType.DATA, 1, 0),  # longer than any load we ask
    STORE.pack(STORE.size - 4 + FAST_MAX + 1, FrameType.STORE, 1, 1, 0, NPA, 0),  # too long
    STORE.pack(STORE.size - 4, FrameType.STORE, 1, 1, 0, NPA, 0),  # a STORE of no bytes
    struct.pack("<IB", 0xFFFFFFFF, FrameType.DATA),
])
def test_a_frame_no_data_channel_carries_drops_that_channel_only(
        plane: DataPlane, channel: socket.socket, frame: bytes, caplog) -> None:
    """Whatever a peer sends that is not a LOAD or the DATA of one of our loads: that
    channel is dropped (closed, one warning naming its peer, its link told: on_broken),
    and another channel is served as before."""
    caplog.set_level(logging.WARNING, logger="ualinkd.fuse.dataplane")
    broken: list[int] = []
    plane.on_broken = broken.append
    other_ours, other = socket.socketpair()
    other.settimeout(5)
    handle = plane.open("other", other_ours.detach(), {PEER_ACCEL})
    assert handle is not None
    try:
        chunk = bytearray(b"z" * 4096)  # (a route's memory must live: BoMemory's does)
        plane.route_export(PEER_ACCEL, OUR_ACCEL, NPA, 4096, chunk, 0)
        channel.sendall(frame)
        assert channel.recv(1) == b""  # closed by the data plane
        deadline = time.monotonic() + 5
        while not [r for r in caplog.records if "channel to peer dropped" in r.getMessage()]:
            assert time.monotonic() < deadline, "no log line for the dropped channel"
            select.select([plane.notify_fd], [], [], 0.1)
            plane.log_events()
        assert len([r for r in caplog.records if "dropped" in r.getMessage()]) == 1
        assert load(other, 9, NPA, 4) == (9, 0, b"zzzz")
        # Only the other one counts now; the link heard of the dropped one's handle.
        assert plane.stats()["channels"] == 1 and len(broken) == 1 and broken[0] != handle
    finally:
        plane.close(handle)
        other.close()


def test_a_broken_channel_s_slot_is_free_again_for_the_next_peer(plane: DataPlane) -> None:
    """The data plane has 64 channel slots (DP_CHANNELS): a channel it drops as broken
    gives its slot back once its line is logged, so 100 broken channels in a row (a peer
    that keeps sending what no data channel carries, or links that break over a daemon's
    life) leave every slot for the next peer, whose loads are served. Before, each left
    its slot broken for good: the 65th open was EBUSY and every later peer's loads went
    through the link."""
    chunk = bytearray(b"q" * 4096)
    plane.route_export(PEER_ACCEL, OUR_ACCEL, NPA, 4096, chunk, 0)
    for i in range(100):
        ours, peer = socket.socketpair()
        peer.settimeout(5)
        handle = plane.open(f"peer{i}", ours.detach(), {PEER_ACCEL})
        assert handle is not None, f"open {i} refused: a broken channel kept its slot"
        with peer:
            peer.sendall(struct.pack("<IB", 1, 0x99))  # no data channel carries it
            assert peer.recv(1) == b""  # dropped
        deadline = time.monotonic() + 5
        while plane.stats()["channels"]:
            assert time.monotonic() < deadline, "the broken channel was never reported"
            select.select([plane.notify_fd], [], [], 0.1)
            plane.log_events()
    ours, peer = socket.socketpair()
    peer.settimeout(5)
    handle = plane.open("last", ours.detach(), {PEER_ACCEL})
    assert handle is not None
    try:
        assert load(peer, 1, NPA, 4) == (1, 0, b"qqqq")
    finally:
        plane.close(handle)
        peer.close()


def test_a_channel_its_link_closed_is_not_reported_broken_after(plane: DataPlane,
                                                                 caplog) -> None:
    """A channel that breaks as its link goes down: the link's close comes first (it
    logs why), and the break the thread reported before is not a second line naming
    "?" nor a redial."""
    caplog.set_level(logging.WARNING, logger="ualinkd.fuse.dataplane")
    broken: list[int] = []
    plane.on_broken = broken.append
    ours, peer = socket.socketpair()
    handle = plane.open("peer", ours.detach(), {PEER_ACCEL})
    assert handle is not None
    peer.close()  # the channel breaks...
    deadline = time.monotonic() + 5
    while not select.select([plane.notify_fd], [], [], 0.1)[0]:
        assert time.monotonic() < deadline, "the break was never reported"
    plane.close(handle)  # ...and its link closes it before the report is taken
    plane.log_events()
    assert not [r for r in caplog.records if "dropped" in r.getMessage()]
    assert broken == [] and plane.stats()["channels"] == 0


def test_a_peer_that_does_not_read_its_answers_is_dropped_not_buffered_forever(
        plane: DataPlane, channel: socket.socket) -> None:
    """LOADs of 64 KiB from a peer that never reads the answers: the channel holds at most
    DP_OUT_MAX (8 MiB) beyond what the socket takes, then drops the peer."""
    chunk = bytearray(CHUNK)
    plane.route_export(PEER_ACCEL, OUR_ACCEL, NPA, CHUNK, chunk, 0)
    frame = LOAD.pack(LOAD.size - 4, FrameType.LOAD, 1, PEER_ACCEL, OUR_ACCEL, NPA, CHUNK, 0)
    channel.settimeout(0.05)
    sent = 0
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            channel.sendall(frame * 64)
            sent += 64
        except (TimeoutError, BrokenPipeError, ConnectionResetError):
            break
    # More answers asked for than the 8 MiB it holds (how many more depends on how fast
    # the C serves them: it drops the peer once it holds 8 MiB), then EOF: dropped, with
    # at most 8 MiB + the socket buffers held.
    assert sent * CHUNK > 8 << 20, sent
    channel.settimeout(5)
    drained = 0
    try:
        while chunk_ := channel.recv(1 << 20):
            drained += len(chunk_)
    except ConnectionResetError:
        pass
    assert drained < (8 << 20) + (16 << 20), drained  # then EOF: dropped


def test_a_load_of_no_bytes_is_python_s_to_answer(plane: DataPlane,
                                                   channel: socket.socket) -> None:
    """A LOAD of 0 bytes checks no route: the exporter's Python refuses one at an NPA it
    does not map (UalinkManager._resolve_npa: EFAULT) and serves one it maps, so the C
    answers every such LOAD DP_FALLBACK rather than success, wherever it points."""
    chunk = bytearray(4096)
    plane.route_export(PEER_ACCEL, OUR_ACCEL, NPA, 4096, chunk, 0)
    assert load(channel, 1, NPA + (1 << 40), 0) == (1, FALLBACK, b"")  # no route there
    assert load(channel, 2, NPA, 0) == (2, FALLBACK, b"")
    assert load(channel, 3, NPA, 4) == (3, 0, bytes(4))  # (the channel serves on)


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _malloced() -> int:
    """Bytes this process holds from malloc, in every arena and mmapped (glibc's
    mallinfo2): what a buffer of the C thread's costs, whether or not free() gave the
    pages back to the system."""
    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = _Mallinfo2
    info = libc.mallinfo2()
    return int(info.uordblks + info.hblkhd)


def test_answers_held_for_a_slow_peer_are_let_go_once_it_has_them(
        plane: DataPlane, channel: socket.socket) -> None:
    """6 MiB of answers queued for a peer that reads nothing for a while (under the 8 MiB
    that drops it): once it has read them all, the channel's queue gives its memory back
    (a data plane has 64 channels: 8 MiB kept by each would be 512 MiB for good)."""
    chunk = bytearray(b"q" * CHUNK)
    plane.route_export(PEER_ACCEL, OUR_ACCEL, NPA, CHUNK, chunk, 0)
    n = 96  # 6 MiB of answers
    before = _malloced()
    frame = LOAD.pack(LOAD.size - 4, FrameType.LOAD, 1, PEER_ACCEL, OUR_ACCEL, NPA, CHUNK, 0)
    channel.sendall(frame * n)
    deadline = time.monotonic() + 10
    while plane.stats()["served"] < n:
        assert time.monotonic() < deadline, plane.stats()
        time.sleep(0.01)
    held = _malloced() - before
    assert held > 3 << 20, held  # (beyond what the socket buffers took)
    for _ in range(n):
        assert answer(channel)[1:] == (0, bytes(chunk))
    assert load(channel, 2, NPA, 4) == (2, 0, b"qqqq")  # (served on after it)
    assert _malloced() - before < 2 << 20, (held, _malloced() - before)


def test_thousands_of_routes_each_answer_its_own_bytes(plane: DataPlane,
                                                        channel: socket.socket) -> None:
    """3,000 routes of 64 KiB chunks (of a BO's memfd: a 187 MiB working set, past the 256
    routes once kept) each answer with their own chunk's bytes, LOADs across two of them
    too; 16 routes of 4 KiB BOs in one 64 KiB of NPA space and a second importer's routes
    at the same NPAs (source aliasing) answer theirs, or DP_FALLBACK (the routes of a
    crowded bucket not kept), never another route's bytes."""
    n = 3000
    fd = os.memfd_create("bo")
    try:
        os.ftruncate(fd, n * CHUNK)
        for i in range(n):
            os.pwrite(fd, i.to_bytes(4, "little") * 4, i * CHUNK)
        for i in range(n):
            plane.route_export(PEER_ACCEL, OUR_ACCEL, NPA + i * CHUNK, CHUNK, fd,
                               i * CHUNK)
        seq = 0
        for i in (0, 1, 2, 999, 1000, 2998, 2999):
            seq += 1
            assert load(channel, seq, NPA + i * CHUNK + 4, 8) == (
                seq, 0, i.to_bytes(4, "little") * 2)
        seq += 1
        assert load(channel, seq, NPA + 2 * CHUNK - 4, 8) == (
            seq, 0, bytes(4) + (2).to_bytes(4, "little"))
        small = NPA + (1 << 40)
        chunks = [bytearray(i.to_bytes(4, "little") * 1024) for i in range(32)]
        for i in range(16):
            plane.route_export(PEER_ACCEL, OUR_ACCEL, small + i * 4096, 4096, chunks[i], 0)
            plane.route_export(OTHER_ACCEL, OUR_ACCEL, small + i * 4096, 4096,
                               chunks[16 + i], 0)
        served = 0
        for src, base in ((PEER_ACCEL, 0), (OTHER_ACCEL, 16)):
            for i in range(16):
                seq += 1
                got = load(channel, seq, small + i * 4096, 4096, src=src)
                assert got in ((seq, 0, bytes(chunks[base + i])), (seq, FALLBACK, b"")), i
                served += got[1] == 0
        assert served >= 2 * 4, served  # (at least the last routes put in each bucket)
    finally:
        translation.changed()  # (before the memfd a route reads goes)
        os.close(fd)


def test_a_load_of_a_mebibyte_is_answered_from_every_kind_of_chunk(
        plane: DataPlane, channel: socket.socket) -> None:
    """The largest load the fast path carries (FAST_MAX: the link's largest, 1 MiB) across
    chunks of every kind side by side, off their edges: in memory, in a BO's memfd, never
    written (zeros, sent in pieces of the C's 64 KiB zero buffer, a 128 KiB route of them
    too); one more byte, or a range past the routes, is DP_FALLBACK."""
    assert FAST_MAX == 1 << 20
    n = FAST_MAX // CHUNK + 2
    fd = os.memfd_create("bo")
    mem = [bytearray(bytes([i]) * CHUNK) for i in range(n)]
    try:
        os.ftruncate(fd, n * CHUNK)
        for i in range(n):
            if i % 3 == 1:
                os.pwrite(fd, bytes([100 + i]) * CHUNK, i * CHUNK)
        for i in range(n):
            backing: bytearray | int | None = (mem[i], fd, None)[i % 3]
            plane.route_export(PEER_ACCEL, OUR_ACCEL, NPA + i * CHUNK, CHUNK, backing,
                               i * CHUNK if i % 3 == 1 else 0)
        want = b"".join((bytes(mem[i]), bytes([100 + i]) * CHUNK, bytes(CHUNK))[i % 3]
                        for i in range(n))
        assert load(channel, 1, NPA, FAST_MAX) == (1, 0, want[:FAST_MAX])
        assert load(channel, 2, NPA + 12345, FAST_MAX) == (2, 0, want[12345:12345 + FAST_MAX])
        assert load(channel, 3, NPA, FAST_MAX + 1) == (3, FALLBACK, b"")
        assert load(channel, 4, NPA + 3 * CHUNK, FAST_MAX) == (4, FALLBACK, b"")  # past them
        assert load(channel, 5, NPA + CHUNK - 1, 2) == (5, 0, want[CHUNK - 1:CHUNK + 1])
        # one route of zeros longer than the C's zero buffer (a route spans two buckets
        # at most: 128 KiB)
        zeros = NPA + (2 << 40)
        plane.route_export(PEER_ACCEL, OUR_ACCEL, zeros, 2 * CHUNK, None, 0)
        assert load(channel, 6, zeros, 2 * CHUNK) == (6, 0, bytes(2 * CHUNK))
        assert load(channel, 7, zeros + 100, 100 << 10) == (7, 0, bytes(100 << 10))
    finally:
        translation.changed()  # (before the memfd a route reads goes)
        os.close(fd)


def test_a_mebibyte_load_of_small_bos_is_one_answer_of_their_pieces(
        plane: DataPlane, channel: socket.socket) -> None:
    """A 1 MiB load over 16 KiB BOs side by side (64 pieces, all a bucket keeps: four per
    64 KiB of NPA space) is answered whole, each BO's bytes in place; over 4 KiB ones
    (more than a bucket keeps), DP_FALLBACK, for Python to serve, never a short answer."""
    bos = [bytearray(bytes([i]) * 16384) for i in range(FAST_MAX // 16384)]
    for i, chunk in enumerate(bos):
        plane.route_export(PEER_ACCEL, OUR_ACCEL, NPA + i * 16384, 16384, chunk, 0)
    assert load(channel, 1, NPA, FAST_MAX) == (1, 0, b"".join(map(bytes, bos)))
    tiny = [bytearray(bytes([i & 0xFF]) * 4096) for i in range(FAST_MAX // 4096)]
    base = NPA + (1 << 40)
    for i, chunk in enumerate(tiny):
        plane.route_export(PEER_ACCEL, OUR_ACCEL, base + i * 4096, 4096, chunk, 0)
    assert load(channel, 2, base, FAST_MAX) == (2, FALLBACK, b"")


def test_mebibyte_answers_a_slow_peer_takes_late_arrive_whole_and_in_order(
        plane: DataPlane, channel: socket.socket) -> None:
    """Six 1 MiB LOADs (of 16 chunks each) from a peer that reads nothing until all are
    served: the sends the socket took in part are queued from where they stopped, mid-
    piece, so every answer arrives whole, in order, with its bytes."""
    chunks = [bytearray(bytes([i]) * CHUNK) for i in range(17)]
    for i, chunk in enumerate(chunks):
        plane.route_export(PEER_ACCEL, OUR_ACCEL, NPA + i * CHUNK, CHUNK, chunk, 0)
    flat = b"".join(map(bytes, chunks))
    offsets = [0, 1, 4095, 7777, CHUNK - 3, CHUNK]
    channel.sendall(b"".join(
        LOAD.pack(LOAD.size - 4, FrameType.LOAD, seq, PEER_ACCEL, OUR_ACCEL, NPA + off,
                  FAST_MAX, 0) for seq, off in enumerate(offsets)))
    deadline = time.monotonic() + 10
    while plane.stats()["served"] < len(offsets):
        assert time.monotonic() < deadline, plane.stats()
        time.sleep(0.01)
    for seq, off in enumerate(offsets):
        assert answer(channel) == (seq, 0, flat[off:off + FAST_MAX]), seq


def test_has_room_until_every_channel_is_in_use_then_one_info_line(plane: DataPlane,
                                                                   caplog) -> None:
    """DataChannels.has_room, which the link asks before it dials or admits a channel: yes
    while fewer than DP_CHANNELS are open (counting those being dialed), no once all are,
    which is said in one INFO line per time the table fills; a channel closed makes room.
    (The C refuses the 65th open, EBUSY: what has_room spares a handshake for.)"""
    from ualinkd.fuse.dataplane import CHANNELS

    caplog.set_level(logging.INFO, logger="ualinkd.fuse.dataplane")
    ends, handles = [], []
    try:
        for i in range(CHANNELS):
            assert plane.has_room()
            assert plane.has_room(CHANNELS - 1 - i) and not plane.has_room(CHANNELS - i)
            ours, peer = socket.socketpair()
            ends.append(peer)
            handle = plane.open(f"peer{i}", ours.detach(), {PEER_ACCEL})
            assert handle is not None
            handles.append(handle)
        assert not [r for r in caplog.records if "channels in use" in r.getMessage()]
        assert not plane.has_room() and not plane.has_room()
        [line] = [r for r in caplog.records if "channels in use" in r.getMessage()]
        assert line.levelno == logging.INFO
        caplog.clear()
        ours, peer = socket.socketpair()
        ends.append(peer)
        assert plane.open("one too many", ours.detach(), {PEER_ACCEL}) is None  # EBUSY
        plane.close(handles.pop())
        assert plane.has_room()
        assert not plane.has_room(1)  # (full counting one being dialed: no line)
        assert not [r for r in caplog.records if "channels in use" in r.getMessage()]
    finally:
        for h in handles:
            plane.close(h)
        for e in ends:
            e.close()
def store(peer: socket.socket, seq: int, npa: int, data: bytes, src: int = PEER_ACCEL,
          dst: int = OUR_ACCEL, pause_after: int = 0) -> tuple[int, int, bytes]:
    """A STORE of `data` (sent in two parts, `pause_after` bytes then the rest a moment
    later, when given); its answer."""
    frame = STORE.pack(STORE.size - 4 + len(data), FrameType.STORE, seq, src, dst, npa, 0) + data
    if pause_after:
        peer.sendall(frame[:pause_after])
        time.sleep(0.05)
        frame = frame[pause_after:]
    peer.sendall(frame)
    return answer(peer)


def test_a_store_the_routes_cover_with_memory_is_stored_whole_or_not_at_all(
        plane: DataPlane, channel: socket.socket) -> None:
    """A STORE inside a chunk, across two, into a memfd BO's route: stored, answered status 0
    with no bytes. A STORE that reaches a chunk never written (a zeros route: no memory to
    put it in), past the routes, from an accel not the peer's: DP_FALLBACK and not a byte
    stored (the exporter's Python stores a STORE whole or refuses it:
    UalinkManager.serve_store), so the importer's Python stores it through the link."""
    a, b = bytearray(4096), bytearray(4096)
    fd = os.memfd_create("bo")
    try:
        os.ftruncate(fd, 8192)
        plane.route_export(PEER_ACCEL, OUR_ACCEL, NPA, 4096, a, 0)
        plane.route_export(PEER_ACCEL, OUR_ACCEL, NPA + 4096, 4096, b, 0)
        plane.route_export(PEER_ACCEL, OUR_ACCEL, NPA + 8192, 4096, None, 0)
        plane.route_export(PEER_ACCEL, OUR_ACCEL, NPA + 65536, 4096, fd, 4096)
        assert store(channel, 1, NPA + 100, b"hello") == (1, 0, b"")
        assert bytes(a[100:105]) == b"hello"
        assert store(channel, 2, NPA + 4090, b"0123456789ab") == (2, 0, b"")
        assert bytes(a[4090:]) + bytes(b[:6]) == b"0123456789ab"
        assert store(channel, 3, NPA + 65536 + 10, b"memfd") == (3, 0, b"")
        assert os.pread(fd, 5, 4096 + 10) == b"memfd"
        before_a, before_b = bytes(a), bytes(b)
        assert store(channel, 4, NPA + 8000, b"x" * 400) == (4, FALLBACK, b"")  # zeros
        assert store(channel, 5, NPA + 4000, b"y" * 200) == (5, 0, b"")
        assert store(channel, 6, NPA + 8192 - 10, b"z" * 20) == (6, FALLBACK, b"")
        assert store(channel, 7, NPA, b"w" * 8, src=7) == (7, FALLBACK, b"")
        assert store(channel, 8, NPA, b"v" * 8, dst=3) == (8, FALLBACK, b"")
        assert bytes(b[:104]) == b"y" * 104 and bytes(a[4000:]) == b"y" * 96
        assert bytes(a[:4000]) == before_a[:4000] and bytes(b[104:]) == before_b[104:]
        s = plane.stats()
        assert (s["served_stores"], s["refused_stores"]) == (4, 4)
    finally:
        plane.close(-1)  # (no such channel: nothing)
        translation.changed()  # (the memfd's route goes before the fd)
        os.close(fd)


@pytest.fixture(params=["tcp", "unix"])
def stream(request: pytest.FixtureRequest,
           open_channel: Callable[..., socket.socket]) -> socket.socket:
    """A channel on loopback TCP, as the link's are (a large STORE's bytes are received
    straight into the chunks), or on a socketpair (whose buffer cannot hold them: they go
    through the channel's buffer)."""
    if request.param == "unix":
        return open_channel({PEER_ACCEL})
    with socket.create_server(("127.0.0.1", 0)) as server:
        peer = socket.create_connection(server.getsockname())
        ours, _ = server.accept()
    return open_channel({PEER_ACCEL}, (ours, peer))


def test_a_mebibyte_store_is_received_into_the_chunks_and_answered_after(
        plane: DataPlane, stream: socket.socket) -> None:
    """A 1 MiB STORE across 16 chunks, its bytes arriving in two parts: stored whole (the
    part received first, and the rest straight into the chunks once all there:
    dp_store_direct), answered once stored; the LOAD after it on the channel reads it (one
    channel's frames are served in order); a flush before the next one and it is
    DP_FALLBACK, nothing stored."""
    channel = stream
    chunks = [bytearray(CHUNK) for _ in range(FAST_MAX // CHUNK)]
    for i, c in enumerate(chunks):
        plane.route_export(PEER_ACCEL, OUR_ACCEL, NPA + i * CHUNK, CHUNK, c, 0)
    data = bytes((i * 13 + 7) & 0xFF for i in range(FAST_MAX))
    for pause_after in (STORE.size + 1000, STORE.size + 3 * CHUNK + 17, 0):
        assert store(channel, 1, NPA, data, pause_after=pause_after) == (1, 0, b"")
        assert b"".join(chunks) == data, pause_after
        assert load(channel, 2, NPA + 5, 4096) == (2, 0, data[5:4101])
        data = data[1:] + data[:1]
    translation.changed()
    assert store(channel, 3, NPA, data, pause_after=STORE.size + 1000) == (3, FALLBACK, b"")
    assert b"".join(chunks) != data
    # The frame after it, alone on the channel, is answered at once: the receive mark
    # raised for the refused STORE's bytes is down again (left up, it went unread until
    # more bytes came, past its deadline: test_pod_gpu's 64 MiB round trip saw that).
    plane.route_export(PEER_ACCEL, OUR_ACCEL, NPA, CHUNK, chunks[0], 0)
    assert store(channel, 4, NPA, b"next") == (4, 0, b"")
    assert bytes(chunks[0][:4]) == b"next"
    assert plane.stats()["served_stores"] == 4
