"""The fabric codec: UALink messages (spec §5.3), link frames, FrameDecoder, Session (sans-IO)."""

from __future__ import annotations

import struct
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ualinkd.fabric import session, wire
from ualinkd.fabric.wire import (
    MAX_FRAME,
    NEED_DATA,
    Ack,
    AuthChallenge,
    AuthHello,
    AuthOk,
    AuthProof,
    Data,
    FrameDecoder,
    Hello,
    HelloAck,
    Load,
    LocalProtocolError,
    Msg,
    MsgType,
    NpaFail,
    NpaRelease,
    NpaReq,
    NpaRevoke,
    NpaRsp,
    Ping,
    Pong,
    RemoteProtocolError,
    Store,
    UnknownMessage,
    decode_message,
    decode_payload,
    encode_data_parts,
    encode_frame,
    encode_frame_construct,
    handle_lo_bits,
    rebuild_handle_lo,
)

u32 = st.integers(0, 0xFFFFFFFF)
u64 = st.integers(0, (1 << 64) - 1)
u16 = st.integers(0, 0xFFFF)
i32 = st.integers(-(1 << 31), (1 << 31) - 1)
accel10 = st.integers(0, 0x3FF)
lo_bits = u64.map(handle_lo_bits)
dwords = st.tuples(u32, u32, u32, u32)

messages = st.one_of(
    st.builds(Hello, accel10, accel10),
    st.just(HelloAck()),
    st.builds(NpaReq, lo_bits, u64),
    st.builds(NpaRsp, lo_bits, u32, u32),
    st.builds(NpaFail, lo_bits, st.integers(0, 0xFF)),
    st.builds(NpaRevoke, lo_bits, u64),
    st.builds(NpaRelease, lo_bits, u64),
)

names = st.text(min_size=1, max_size=20).filter(lambda s: len(s.encode()) < 256)
# An AUTH_HELLO from CHANNEL_VERSION on carries any channel byte; an older one has none.
hellos = st.integers(0, 0xFFFF).flatmap(lambda v: st.builds(
    AuthHello, st.uuids(), names, st.binary(min_size=32, max_size=32), st.just(v),
    st.integers(0, 0xFF) if v >= wire.CHANNEL_VERSION else st.just(0)))
frames = st.one_of(
    hellos,
    st.builds(AuthChallenge, names, st.binary(min_size=32, max_size=32),
              st.binary(min_size=32, max_size=32)),
    st.builds(AuthProof, st.binary(min_size=32, max_size=32)),
    st.just(AuthOk()),
    st.builds(Msg, u32, u16, u16, dwords),
    st.builds(Ack, u32, i32),
    st.builds(Ping, u64, u32),
    st.builds(Pong, u64),
    st.builds(Load, u32, u16, u16, u64, u32, u32),
    st.builds(Store, u32, u16, u16, u64, st.binary(max_size=300), u32),
    st.builds(Data, u32, i32, st.binary(max_size=300)),
)


# ---- messages (§5.3) ---------------------------------------------------------------------

def test_message_encodings_match_spec_table() -> None:
    lo, hi = 0x1122334455667_3FF, 0xAABBCCDD_EEFF0011
    bits = handle_lo_bits(lo)
    assert Hello(receiver_id=5, sender_id=7).encode() == (1 | 5 << 10 | 7 << 20, 0, 0, 0)
    assert HelloAck().encode() == (2, 0, 0, 0)
    assert NpaReq(bits, hi).encode() == ((lo & 0xFFFFFC00) | 3, lo >> 32, 0xEEFF0011, 0xAABBCCDD)
    assert NpaRsp(bits, 16, 0x1234).encode() == ((lo & 0xFFFFFC00) | 4, lo >> 32, 16, 0x1234)
    assert NpaFail(bits, 0x102).encode()[2:] == (0x02, 0)  # reason & 0xFF
    assert NpaRevoke(bits, hi).encode()[0] & 0x3FF == MsgType.NPA_REVOKE
    assert NpaRelease(bits, hi).encode()[0] & 0x3FF == MsgType.NPA_RELEASE
    assert rebuild_handle_lo(bits, 3) == (lo & ~0x3FF) | 3


def test_message_rejects_values_that_do_not_fit() -> None:
    with pytest.raises(LocalProtocolError):
        NpaReq(0x1234_0001, 0)  # bits 9..0 set: the caller forgot handle_lo_bits()
    with pytest.raises(LocalProtocolError):
        Hello(1024, 0)
    with pytest.raises(LocalProtocolError):
        NpaRsp(0, 1 << 32, 0)
    with pytest.raises(LocalProtocolError):
        decode_message((1, 2, 3))  # type: ignore[arg-type]


@given(messages)
def test_message_round_trip(msg: wire.Message) -> None:
    assert decode_message(msg.encode()) == msg


@given(dwords)
def test_any_dwords_decode_and_match_construct(dws: wire.Dwords) -> None:
    msg = decode_message(dws)  # never raises
    raw = struct.pack("<4I", *dws)
    t = dws[0] & 0x3FF
    if t not in MsgType.__members__.values():
        assert msg == UnknownMessage(t, dws)
        assert msg.encode() == dws
        return
    c = wire.MESSAGE_LAYOUTS[MsgType(t)].parse(raw)
    assert c.dw0.type == t == msg.type
    if isinstance(msg, Hello):
        assert (msg.receiver_id, msg.sender_id) == (c.dw0.receiver_id, c.dw0.sender_id)
        return
    if isinstance(msg, HelloAck):
        return
    assert msg.handle_lo_bits == (c.handle_lo_63_32 << 32) | (c.dw0.handle_lo_31_10 << 10)
    if isinstance(msg, NpaRsp):
        assert (msg.size_pages, msg.npa_offset) == (c.size_pages, c.npa_offset)
    elif isinstance(msg, NpaFail):
        assert msg.reason == c.reason
    else:
        assert msg.handle_hi == c.handle_hi


# ---- frames ---------------------------------------------------------------------------------

@given(frames)
def test_frame_round_trip_and_fast_path_equals_construct(frame: wire.Frame) -> None:
    raw = encode_frame(frame)
    assert raw == encode_frame_construct(frame)
    assert struct.unpack_from("<I", raw)[0] == len(raw) - 4
    assert decode_payload(raw[4], raw[5:]) == frame
    assert decode_payload(raw[4], raw[5:], fast=False) == frame
    dec = FrameDecoder()
    dec.receive_data(raw)
    assert dec.next_frame() == frame
    assert dec.next_frame() is NEED_DATA


@given(st.builds(Msg, u32, u16, u16, dwords) | st.builds(Ack, u32, i32)
       | st.builds(Ping, u64, u32) | st.builds(Pong, u64))
def test_fast_decode_equals_construct_on_any_payload(frame: wire.Frame) -> None:
    payload = encode_frame_construct(frame)[5:]
    assert decode_payload(frame.frame_type, payload, fast=True) == \
        decode_payload(frame.frame_type, payload, fast=False)


def test_encode_refuses_out_of_range_values() -> None:
    for bad in (Msg(1 << 32, 0, 0, (0, 0, 0, 0)), Msg(1, 0, 0, (0, 0, 0)), Ack(1, 1 << 31),
                AuthHello(uuid.uuid4(), "a", b"short"),
                AuthHello(uuid.uuid4(), "x" * 256, b"\0" * 32),
                AuthHello(uuid.uuid4(), "a", b"\0" * 32, channel=256),
                AuthHello(uuid.uuid4(), "a", b"\0" * 32, version=2, channel=1),
                Store(1, 0, 0, 0, b"\0" * MAX_FRAME)):
        with pytest.raises(LocalProtocolError):
            encode_frame(bad)


def test_auth_hello_carries_its_channel_after_the_nonce_from_version_3() -> None:
    """[version u16][pod uuid][name: u8 length, bytes][nonce 32][channel u8]; a version 2
    HELLO ends at its nonce and decodes as the link's channel (so a version 2 daemon is told
    its version, not that its HELLO does not parse)."""
    pod = uuid.UUID(int=0x1234)
    raw = encode_frame(AuthHello(pod, "ab", b"\7" * 32, channel=wire.Channel.DATA))
    # (the default version is today's, 4 since §13 N2's INCARNATION frame: same layout)
    assert raw == (struct.pack("<IBH", 1 + 2 + 16 + 3 + 32 + 1, 0x01, 4) + pod.bytes
                   + b"\2ab" + b"\7" * 32 + b"\1")
    old = struct.pack("<H", 2) + pod.bytes + b"\2ab" + b"\7" * 32
    assert decode_payload(0x01, old) == AuthHello(pod, "ab", b"\7" * 32, 2, wire.Channel.LINK)
    with pytest.raises(RemoteProtocolError, match="bad AUTH_HELLO"):
        decode_payload(0x01, old + b"\1")  # version 2 has no channel byte
    with pytest.raises(RemoteProtocolError, match="bad AUTH_HELLO"):
        decode_payload(0x01, raw[5:-1])  # version 3 has one


@pytest.mark.parametrize(("raw", "why"), [
    (struct.pack("<IB", 1, 0x7F), "unknown frame type"),
    (struct.pack("<I", 0), "length 0 "),
    (struct.pack("<IB", MAX_FRAME + 1, wire.FrameType.STORE), "length"),
    (struct.pack("<IB", 0xFFFFFFFF, wire.FrameType.MSG), "length"),
    (struct.pack("<IBI", 5, wire.FrameType.ACK, 1), "ACK"),  # 4-byte payload, needs 8
    (struct.pack("<IBQB", 10, wire.FrameType.PING, 1, 0), "PING"),  # trailing byte
    (struct.pack("<IB", 1, wire.FrameType.AUTH_PROOF), "AUTH_PROOF"),
    (struct.pack("<IBB", 35, wire.FrameType.AUTH_CHALLENGE, 1) + b"\xff" + b"\0" * 32,
     "AUTH_CHALLENGE"),  # truncated
])
def test_decoder_rejects_bad_frames_and_stays_broken(raw: bytes, why: str) -> None:
    dec = FrameDecoder()
    dec.receive_data(raw)
    with pytest.raises(RemoteProtocolError, match=why):
        dec.next_frame()
    with pytest.raises(RemoteProtocolError):
        dec.next_frame()


def test_oversized_length_refused_before_its_payload_arrives() -> None:
    dec = FrameDecoder()
    dec.receive_data(struct.pack("<IB", MAX_FRAME + 1, wire.FrameType.DATA))
    with pytest.raises(RemoteProtocolError):
        dec.next_frame()


def _store_header(length: int = 1 << 20) -> bytes:
    """The 25 bytes that start a STORE of `length` data bytes (its data never follows)."""
    return struct.pack("<IBIHHQI", 21 + length, wire.FrameType.STORE, 1, 0, 2, 0, 0)


def test_full_decoder_collects_a_large_store_from_its_header() -> None:
    """What the data plane does, and why a decoder before authentication must not: a 25-byte
    STORE header makes the decoder allocate the whole payload buffer."""
    dec = FrameDecoder()
    dec.receive_data(_store_header())
    assert dec.next_frame() is NEED_DATA
    buf = dec.receive_buffer()
    assert buf is not None and len(buf) == 1 << 20


@pytest.mark.parametrize(("raw", "why"), [
    (_store_header(), "frame length 1048597 outside 1..512"),
    (_store_header()[:4], "frame length 1048597 outside 1..512"),  # refused at the length
    (_store_header(100), "STORE frame before the handshake finished"),
    (encode_frame(Msg(1, 0, 2, (1, 2, 3, 4))), "MSG frame before the handshake finished"),
    (encode_frame(Load(1, 0, 2, 0, 1 << 20)), "LOAD frame before the handshake finished"),
    (struct.pack("<IB", 1, 0x7F), "unknown frame type"),
])
def test_handshake_decoder_refuses_other_frames_at_the_header(raw: bytes, why: str) -> None:
    """Issue 10 item 3: before the handshake only handshake frames of handshake size; anything
    else is refused from its header alone, with nothing buffered or allocated for it."""
    dec = FrameDecoder.for_handshake()
    dec.receive_data(raw)
    with pytest.raises(RemoteProtocolError, match=why):
        dec.next_frame()
    assert dec.receive_buffer() is None and dec.buffered <= len(raw)


def test_handshake_decoder_opens_the_data_plane_after_the_handshake() -> None:
    """Frames that come in the same read as AUTH_OK decode once the handshake is done."""
    dec = FrameDecoder.for_handshake()
    msg = Msg(1, 0, 2, (1, 2, 3, 4))
    dec.receive_data(encode_frame(AuthOk()) + encode_frame(msg) + _store_header())
    assert dec.next_frame() == AuthOk()
    dec.open_data_plane()
    assert dec.next_frame() == msg
    assert dec.next_frame() is NEED_DATA
    assert dec.receive_buffer() is not None


@given(st.binary(max_size=600))
def test_handshake_decoder_never_allocates_for_any_bytes(raw: bytes) -> None:
    """Any bytes: handshake frames, NEED_DATA or RemoteProtocolError, and never a payload
    buffer, nor more buffered than was received."""
    dec = FrameDecoder.for_handshake()
    dec.receive_data(raw)
    try:
        while (f := dec.next_frame()) is not NEED_DATA:
            assert f.frame_type in wire.HANDSHAKE_FRAMES
    except RemoteProtocolError:
        pass
    assert dec.receive_buffer() is None and dec.buffered <= len(raw)


def test_non_utf8_name_is_a_remote_error() -> None:
    raw = encode_frame(AuthChallenge("n", b"\0" * 32, b"\0" * 32)).replace(b"\x01n", b"\x01\xff")
    with pytest.raises(RemoteProtocolError, match="UTF-8"):
        decode_payload(raw[4], raw[5:])


@given(st.lists(frames, max_size=6), st.data())
def test_frames_survive_any_chunking(fs: list[wire.Frame], data: st.DataObject) -> None:
    raw = b"".join(encode_frame(f) for f in fs)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=8)))
    dec, out, prev = FrameDecoder(), [], 0
    for cut in [*cuts, len(raw)]:
        dec.receive_data(raw[prev:cut])
        prev = cut
        while (f := dec.next_frame()) is not NEED_DATA:
            out.append(f)
    assert out == fs
    assert dec.buffered == 0


def _big(n: int, seed: int) -> bytes:
    """n bytes of a pattern (hypothesis would take long to draw 100 KiB of binary)."""
    return bytes((i * 131 + seed) & 0xFF for i in range(256)) * (n // 256) + bytes(n % 256)


big_frames = st.one_of(
    frames,
    st.builds(lambda seq, st_, n, seed: Data(seq, st_, _big(n, seed)),
              u32, i32, st.integers(60 << 10, 200 << 10), st.integers(0, 255)),
    st.builds(lambda seq, s, d, a, n, seed, dl: Store(seq, s, d, a, _big(n, seed), dl),
              u32, u16, u16, u64, st.integers(60 << 10, 200 << 10), st.integers(0, 255), u32),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(big_frames, max_size=5), st.data())
def test_large_payloads_received_in_place_survive_any_chunking(
        fs: list[wire.Frame], data: st.DataObject) -> None:
    """A reader mixing receive_data (its scratch buffer) and receive_buffer/received_into
    (straight into a large payload's own buffer) gets the frames that were sent."""
    raw = b"".join(encode_frame(f) for f in fs)
    dec, out, pos = FrameDecoder(), [], 0
    while pos < len(raw):
        into = dec.receive_buffer()
        k = data.draw(st.integers(1, min(len(raw) - pos, 150_000)))
        if into is not None:
            k = min(k, len(into))
            into[:k] = raw[pos:pos + k]
            dec.received_into(k)
        else:
            dec.receive_data(memoryview(raw)[pos:pos + k])  # a scratch buffer's view
        pos += k
        while (f := dec.next_frame()) is not NEED_DATA:
            out.append(f)
    assert out == fs  # payloads received in place are bytearrays, equal to the bytes sent
    assert dec.buffered == 0 and dec.receive_buffer() is None


def test_large_payload_collected_once_its_header_is_in() -> None:
    frame = encode_frame(Data(7, 0, _big(1 << 20, 3)))
    dec = FrameDecoder()
    dec.receive_data(frame[:100])
    assert dec.next_frame() is NEED_DATA
    into = dec.receive_buffer()
    assert into is not None and len(into) == len(frame) - 100  # the rest of the payload
    into[:] = frame[100:]
    dec.received_into(len(into))
    got = dec.next_frame()
    assert isinstance(got, Data) and got.seq == 7 and got.data == _big(1 << 20, 3)
    assert type(got.data) is bytearray
    # A small DATA frame still comes out of the stream buffer, as bytes.
    dec.receive_data(encode_frame(Data(8, 0, b"abc")))
    assert dec.receive_buffer() is None and dec.next_frame() == Data(8, 0, b"abc")


def test_gathered_data_is_the_frame_sent_as_one_buffer() -> None:
    parts = [memoryview(b"a" * 70000), memoryview(b"b" * 10), b"c" * 5]
    joined = b"".join(encode_data_parts(5, 0, parts))
    assert joined == encode_frame(Data(5, 0, b"a" * 70000 + b"b" * 10 + b"c" * 5))
    with pytest.raises(LocalProtocolError):
        encode_data_parts(5, 0, [bytes(wire.MAX_DATA + 100)])


@given(st.binary(max_size=400), st.data())
def test_random_bytes_decode_or_raise_remote_error(raw: bytes, data: st.DataObject) -> None:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=6)))
    dec, prev = FrameDecoder(), 0
    try:
        for cut in [*cuts, len(raw)]:
            dec.receive_data(raw[prev:cut])
            prev = cut
            while (f := dec.next_frame()) is not NEED_DATA:
                assert type(f) in wire.FRAME_CLASSES.values()
    except RemoteProtocolError:
        pass


# ---- session (sans-IO established link) ---------------------------------------------------

def _pair() -> tuple[session.Session, session.Session]:
    """Node A (accels 0, 1) and node B (accel 2), each holding its side of one link."""
    return session.Session("B", {2}, {0, 1}), session.Session("A", {0, 1}, {2})


def _pump(src: session.Session, dst: session.Session) -> list[object]:
    dst.receive_data(src.data_to_send())
    out = []
    while (ev := dst.next_event()) is not NEED_DATA:
        out.append(ev)
    return out


def test_session_msg_is_acked_before_it_is_delivered() -> None:
    a, b = _pair()
    seq = a.send_message(1, 2, (3, 0, 0, 0))
    b.receive_data(a.data_to_send())
    ev = b.next_event()
    assert ev == session.MessageReceived(1, 2, (3, 0, 0, 0))
    assert b.data_to_send() == encode_frame(Ack(seq, 0))  # queued before the event came out
    a.receive_data(encode_frame(Ack(seq, 0)))
    assert a.next_event() == session.AckReceived(seq, 0)


@given(st.lists(dwords, min_size=1, max_size=20))
def test_session_a_batch_is_the_frames_of_single_sends(batch: list[tuple[int, ...]]) -> None:
    """Session.send_messages (one stamp check, frames packed as they go) queues exactly
    what as many send_message calls would: the same MSG frames, in order, seqs in turn,
    each ACK matched to its own seq; an out-of-range dword is refused as single sends
    refuse it (spec §5.1: per-peer order is the sending order)."""
    a, b = _pair()
    singles = [a.send_message(0, 2, dw) for dw in batch]
    one_by_one = a.data_to_send()
    a2, _ = _pair()
    seqs = a2.send_messages(0, 2, batch)
    assert seqs == singles and a2.data_to_send() == one_by_one
    assert one_by_one == b"".join(encode_frame_construct(Msg(s, 0, 2, dw))
                                  for s, dw in zip(seqs, batch, strict=True))
    b.receive_data(one_by_one)
    while (ev := b.next_event()) is not NEED_DATA:
        assert isinstance(ev, session.MessageReceived)
    assert _pump(b, a2) == [session.AckReceived(s, 0) for s in seqs]
    with pytest.raises(LocalProtocolError):
        a2.send_messages(0, 2, [(0, 0, 0, 1 << 32)])
    with pytest.raises(LocalProtocolError):
        a2.send_messages(0, 2, [(0, 0, 0)])  # type: ignore[list-item]


def test_session_ping_pong_and_data_plane() -> None:
    a, b = _pair()
    a.send_ping(77, now=0.0)
    a.send_ping(78, track=False, now=0.0)
    assert _pump(a, b) == []
    assert _pump(b, a) == [session.PongReceived(77)]
    seq = a.send_request(0, 2, 4096, 8)
    [ev] = _pump(a, b)
    assert ev == session.RequestReceived(Load(seq, 0, 2, 4096, 8))
    b.send_data(seq, 0, b"x" * 8)
    assert _pump(b, a) == [session.DataReceived(seq, 0, b"x" * 8)]


def test_a_heartbeat_ping_is_not_answered_but_gives_its_clock() -> None:
    """A PING with token HEARTBEAT (0) gets no PONG: each side sends its own heartbeats, so
    answering them doubled a link's idle traffic. Its clock still dates the sender's link
    clock (requests are stamped from it); any other token is answered."""
    a, b = _pair()
    a.send_heartbeat(now=2.5)
    b.receive_data(a.data_to_send())
    assert b.next_event(7.0) is NEED_DATA
    assert not b.has_data_to_send  # no PONG queued
    # a's clock read 2500 ms at b's 7.0: a LOAD b sends at 7.125 waiting 2 s is stamped
    # from it (a LOAD keeps no margin for its answer).
    seq = b.send_request(2, 0, 4096, 8, now=7.125, give_up=9.125)
    [ev] = _pump(b, a)
    assert ev == session.RequestReceived(Load(seq, 2, 0, 4096, 8, 2500 + 125 + 2000))
    a.send_ping(9, track=False, now=3.0)
    assert _pump(a, b) == []
    assert b.data_to_send() == encode_frame(Pong(9))
    with pytest.raises(wire.LocalProtocolError):
        a.send_ping(session.HEARTBEAT, now=3.0)  # a PONG for it would never come


@pytest.mark.parametrize(("src", "dst"), [(2, 2), (0, 0), (1, 9)])
def test_session_rejects_a_forged_stamp(src: int, dst: int) -> None:
    a, b = _pair()
    b.receive_data(encode_frame(Msg(1, src, dst, (3, 0, 0, 0))))
    with pytest.raises(RemoteProtocolError, match="accel"):
        b.next_event()
    assert b.data_to_send() == b""  # no ACK for a lie


def test_session_replies_late_unknown_and_mismatched() -> None:
    a, b = _pair()
    s1 = a.send_message(0, 2, (3, 0, 0, 0))
    a.forget(s1)
    a.receive_data(encode_frame(Ack(s1, 0)))
    assert a.next_event() is NEED_DATA  # late ACK: dropped
    s2 = a.send_request(0, 2, 0, 8)
    a.receive_data(encode_frame(Ack(s2, 0)))
    with pytest.raises(RemoteProtocolError, match="LOAD"):
        a.next_event()
    a, b = _pair()
    a.receive_data(encode_frame(Ack(99, 0)))
    with pytest.raises(RemoteProtocolError, match="never sent"):
        a.next_event()


def test_session_refuses_handshake_frames_and_local_misuse() -> None:
    a, b = _pair()
    b.receive_data(encode_frame(AuthOk()))
    with pytest.raises(RemoteProtocolError, match="after the handshake"):
        b.next_event()
    with pytest.raises(LocalProtocolError):
        a.send_message(2, 1, (0, 0, 0, 0))  # not our accel -> not theirs


class _Sink:
    """A test's diverted-payload sink: a bytearray the 'reader' fills itself."""

    def __init__(self, n: int) -> None:
        self.mem = bytearray(n)

    def __len__(self) -> int:
        return len(self.mem)


@settings(deadline=None, max_examples=50)
@given(st.integers(64 << 10, 1 << 20), st.integers(5, 70 << 10), st.integers(512, 100 << 10))
def test_a_diverted_data_payload_is_the_readers_sink(size: int, first: int, step: int) -> None:
    """FrameDecoder.divert (the reader's splice path, fabric/splice.py): a large DATA named
    by collecting() from its header on, before any buffer exists; diverted, the bytes that
    came with the header are handed back, the rest is only counted (received_into), the
    frame carries the sink, and what follows the frame decodes as before."""
    payload = (bytes(range(251)) * (size // 251 + 1))[:size]
    tail = encode_frame(Ping(99, 5))
    raw = b"".join(wire.encode_frame_parts(Data(7, 0, payload))) + tail
    head = min(first, len(raw) - len(tail) - 1)
    dec = FrameDecoder()
    dec.receive_data(raw[:head])
    while dec.next_frame() is NEED_DATA and dec.collecting() is None:
        dec.receive_data(raw[head:head + 1])  # the header, a byte at a time
        head += 1
    assert dec.collecting() is wire.FrameType.DATA and dec.collecting_size == size
    sink = _Sink(size)
    prefix = dec.divert(sink)
    assert payload.startswith(prefix) and dec.receive_buffer() is None
    with pytest.raises(wire.LocalProtocolError):
        dec.receive_data(b"x")  # bytes of a diverted payload go to the sink, not here
    done = len(prefix)
    sink.mem[:done] = prefix
    pos = len(raw) - len(tail) - (size - done)  # where the payload's rest starts
    while done < size:
        n = min(step, size - done)
        sink.mem[done:done + n] = raw[pos:pos + n]
        assert dec.next_frame() is NEED_DATA
        dec.received_into(n)
        done += n
        pos += n
    dec.receive_data(raw[pos:])
    frame = dec.next_frame()
    assert isinstance(frame, Data) and frame.seq == 7 and frame.data is sink
    assert bytes(sink.mem) == payload
    assert dec.next_frame() == Ping(99, 5) and dec.next_frame() is NEED_DATA


def test_a_large_store_is_named_but_only_data_is_diverted_by_the_link() -> None:
    """collecting() names a large STORE too (the link diverts only DATA); a divert of the
    wrong size is refused, and asking for the buffer allocates it with the bytes so far."""
    dec = FrameDecoder()
    dec.receive_data(_store_header() + b"\x01\x02")
    assert dec.next_frame() is NEED_DATA
    assert dec.collecting() is wire.FrameType.STORE and dec.collecting_size == 1 << 20
    with pytest.raises(wire.LocalProtocolError):
        dec.divert(_Sink(10))
    buf = dec.receive_buffer()
    assert buf is not None and len(buf) == (1 << 20) - 2
    assert dec.collecting() is None and dec.buffered == 2
