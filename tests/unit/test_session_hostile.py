"""fabric/session.py against a peer that sends any sequence of well-formed frames with any
field values (the robustness review, session 6): every frame gives an event, nothing, or
RemoteProtocolError (the link then drops the connection); a reply answers a request we
still wait for, of its kind, once; a MSG is acknowledged and a PING with a token answered,
in order, and `replied` counts those answers' bytes (STYLE.md 12: a decoder decodes or
raises its documented error, never anything else)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ualinkd.fabric.session import (
    HEARTBEAT,
    AckReceived,
    DataReceived,
    MessageReceived,
    RequestReceived,
    Session,
)
from ualinkd.fabric.wire import (
    NEED_DATA,
    Ack,
    Data,
    FrameDecoder,
    Load,
    Msg,
    Ping,
    Pong,
    RemoteProtocolError,
    Store,
    encode_frame,
)

LOCAL, PEER = (0, 1), (2, 3)
u32 = st.integers(0, 2**32 - 1)
seqs = st.integers(0, 12) | u32  # mostly near the seqs we issue
accels = st.sampled_from((0, 1, 2, 3, 4))
small = st.binary(max_size=40)
peer_frames = st.one_of(
    st.builds(Ack, seqs, st.integers(-(2**31), 2**31 - 1)),
    st.builds(Data, seqs, st.integers(-(2**31), 2**31 - 1), small),
    st.builds(Msg, seqs, accels, accels, st.tuples(u32, u32, u32, u32)),
    st.builds(Ping, st.sampled_from((HEARTBEAT, 1, 2**64 - 1)), u32),
    st.builds(Pong, st.sampled_from((0, 1, 7, 2**64 - 1))),
    st.builds(Load, seqs, accels, accels, st.integers(0, 2**64 - 1),
              st.integers(0, 2 << 20), u32),
    st.builds(Store, seqs, accels, accels, st.integers(0, 2**64 - 1), small, u32),
)
# What we send first: ("msg",) / ("load", length) / ("store",) / ("forget", which) / ("ping",)
our_sends = st.lists(st.one_of(
    st.just(("msg",)), st.tuples(st.just("load"), st.integers(0, 40)), st.just(("store",)),
    st.tuples(st.just("forget"), st.integers(0, 11)), st.just(("ping",))), max_size=12)


@settings(max_examples=400, deadline=None)
@given(our_sends, st.lists(peer_frames, max_size=25))
def test_any_peer_frames_give_events_or_a_remote_error(sends: list[tuple], frames: list
                                                        ) -> None:
    s = Session("b", PEER, LOCAL, FrameDecoder(), now=0.0)
    waiting: dict[int, tuple[str, int]] = {}  # seq -> (kind, LOAD length)
    issued: list[int] = []
    for op in sends:
        if op[0] == "msg":
            seq = s.send_message(0, 2, (1, 2, 3, 4))
            waiting[seq] = ("msg", 0)
        elif op[0] == "load":
            seq = s.send_request(1, 3, 0, op[1])
            waiting[seq] = ("load", op[1])
        elif op[0] == "store":
            seq = s.send_request(0, 3, 0, b"x")
            waiting[seq] = ("store", 0)
        elif op[0] == "ping":
            s.send_ping(7, now=0.0)
            continue
        else:
            if issued:
                gone = issued[op[1] % len(issued)]
                s.forget(gone)
                waiting.pop(gone, None)
            continue
        issued.append(seq)
    s.data_to_send()
    answered = 0
    for f in frames:
        s.receive_data(encode_frame(f))
        try:
            ev = s.next_event(now=1.0)
        except RemoteProtocolError:
            return  # the link drops the connection (Conn.read, fabric/conn.py)
        if isinstance(f, Msg):
            answered += 1
            assert ev == MessageReceived(f.src_accel, f.dst_accel, f.dwords)
            assert f.src_accel in PEER and f.dst_accel in LOCAL
        elif isinstance(f, Ping):
            answered += f.token != HEARTBEAT
            assert ev is NEED_DATA
        elif isinstance(f, Ack):
            kind = waiting.pop(f.seq, None)
            if ev is NEED_DATA:  # late: a seq we forgot, never one we wait for
                assert kind is None and f.seq in issued
            else:
                assert ev == AckReceived(f.seq, f.status) and kind == ("msg", 0)
        elif isinstance(f, Data):
            kind = waiting.pop(f.seq, None)
            if ev is NEED_DATA:
                assert kind is None and f.seq in issued
            else:
                assert isinstance(ev, DataReceived) and ev.seq == f.seq
                assert kind is not None and kind[0] in ("load", "store")
                assert kind[0] != "load" or len(ev.data) <= kind[1]
        elif isinstance(f, Load | Store):
            assert isinstance(ev, RequestReceived) and ev.request == f
            assert f.src_accel in PEER and f.dst_accel in LOCAL
        else:
            assert ev is NEED_DATA or ev.token == 7  # a PONG: ours only
        assert s.replied == 13 * answered
    out = FrameDecoder()
    out.receive_data(s.data_to_send())
    replies = []
    while (r := out.next_frame()) is not NEED_DATA:
        replies.append(r)
    want = [Ack(f.seq, 0) if isinstance(f, Msg) else Pong(f.token) for f in frames
            if isinstance(f, Msg) or (isinstance(f, Ping) and f.token != HEARTBEAT)]
    assert replies == want
