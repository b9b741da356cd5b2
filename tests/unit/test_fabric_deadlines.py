"""Session deadlines (issue 10 item 7; README, emulator decisions), sans-IO with time as an
argument: a requester stamps each LOAD/STORE with a deadline on the receiver's link clock,
taken from the receiver's last PING; a receiver past it refuses the request unserved, so a
request its sender reported as failed never acts later. No sleeping: every `now` is given."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ualinkd.fabric.session import ANSWER_MARGIN, CLOCK_MOD, RequestReceived, Session
from ualinkd.fabric.wire import NEED_DATA, Load, Store


def _pair(origin_a: float, origin_b: float) -> tuple[Session, Session]:
    """A (accel 0, the requester) and B (accel 2, the exporter), each with its own clock."""
    return (Session("B", {2}, {0}, now=origin_a), Session("A", {0}, {2}, now=origin_b))


def _deliver(src: Session, dst: Session, now: float) -> list[object]:
    dst.receive_data(src.data_to_send())
    out = []
    while (ev := dst.next_event(now)) is not NEED_DATA:
        out.append(ev)
    return out


def _request(a: Session, b: Session, *, ping_at: float, ping_delay: float, sent: float,
             timeout: float, store: bool = True) -> Load | Store:
    """B PINGs A at `ping_at` (true time), received `ping_delay` later; A sends a request at
    `sent` that it waits `timeout` for; the request as B decodes it."""
    b.send_ping(1, track=False, now=ping_at)
    assert _deliver(b, a, ping_at + ping_delay) == []
    a.send_request(0, 2, 4096, b"x" * 8 if store else 8, now=sent, give_up=sent + timeout)
    [ev] = _deliver(a, b, sent)
    assert isinstance(ev, RequestReceived)
    return ev.request


def test_no_deadline_before_the_peers_first_ping() -> None:
    a, b = _pair(0.0, 100.0)
    a.send_request(0, 2, 0, 8, now=1.0, give_up=3.0)
    [ev] = _deliver(a, b, 1.0)
    assert ev.request.deadline == 0
    assert not b.expired(ev.request, 1e6)  # never refused: nothing to go by


def test_a_store_held_past_its_requesters_wait_is_refused() -> None:
    """The SIGSTOP case: the exporter's last PING went out at 10.0, the store at 10.4 with a
    2 s wait; the exporter, stopped meanwhile, looks at it at 12.5: refused. At 10.5 (in
    time, with room for the answer) it is served."""
    a, b = _pair(3.0, 7.0)
    req = _request(a, b, ping_at=10.0, ping_delay=0.001, sent=10.4, timeout=2.0)
    assert isinstance(req, Store)
    assert not b.expired(req, 10.5)
    assert not b.expired(req, 10.4 + 2.0 - ANSWER_MARGIN - 0.01)
    assert b.expired(req, 12.5)
    assert b.expired(req, 10.4 + 2.0)  # the requester gives up then: never served after


def test_a_wait_already_over_gives_a_passed_deadline() -> None:
    a, b = _pair(0.0, 0.0)
    req = _request(a, b, ping_at=1.0, ping_delay=0.0, sent=5.0, timeout=0.0, store=False)
    assert isinstance(req, Load) and req.deadline
    assert b.expired(req, 5.0 + 0.002)


def test_link_clocks_wrap_modulo_2_32_ms() -> None:
    """49.7 days of link: the clocks wrap, and deadlines compare modulo."""
    wrap = CLOCK_MOD / 1000
    a, b = _pair(0.0, 0.0)
    req = _request(a, b, ping_at=wrap - 0.5, ping_delay=0.0, sent=wrap - 0.2, timeout=2.0)
    assert req.deadline < 2000  # wrapped
    assert not b.expired(req, wrap + 0.5)
    assert b.expired(req, wrap + 2.0)


@given(origin_a=st.floats(0, 1e6), origin_b=st.floats(0, 1e6),
       ping_at=st.floats(0, 1e5), ping_delay=st.floats(0, 5),
       after_ping=st.floats(0, 10), timeout=st.floats(0.001, 10),
       served=st.floats(0, 30))
def test_a_request_served_is_one_its_requester_still_waits_for(
        origin_a: float, origin_b: float, ping_at: float, ping_delay: float,
        after_ping: float, timeout: float, served: float) -> None:
    """Whatever the clocks' origins and the delays (a PING dated late, a request read late):
    if B serves a request (not expired), A is still waiting then, with at least the answer's
    margin left (1 ms for the clocks' rounding)."""
    a, b = _pair(origin_a, origin_b)
    sent = ping_at + ping_delay + after_ping
    req = _request(a, b, ping_at=ping_at, ping_delay=ping_delay, sent=sent, timeout=timeout)
    at = sent + served  # true time B looks at it (both clocks run at the same rate)
    if not b.expired(req, at):
        margin = min(ANSWER_MARGIN, timeout / 4)
        assert at <= sent + timeout - margin + 0.002


@given(ping_delay=st.floats(0, 0.05), after_ping=st.floats(0, 3), timeout=st.floats(0.01, 5),
       late=st.floats(0.003, 0.5))
def test_just_past_the_wait_is_refused(ping_delay: float, after_ping: float, timeout: float,
                                       late: float) -> None:
    """The other side of the bound: a request looked at after its requester's wait, less
    the answer's margin, is refused (tight: no more slack than the PING's own delay)."""
    a, b = _pair(5.0, 1.0)
    sent = 100.0 + ping_delay + after_ping
    req = _request(a, b, ping_at=100.0, ping_delay=ping_delay, sent=sent, timeout=timeout)
    margin = min(ANSWER_MARGIN, timeout / 4)
    assert b.expired(req, sent + timeout - margin + late)


def test_a_load_keeps_no_margin() -> None:
    """A LOAD changes nothing: it is refused only once its requester surely gave up (the
    answer's margin is for stores, whose late answer would hide a change)."""
    a, b = _pair(0.0, 0.0)
    req = _request(a, b, ping_at=1.0, ping_delay=0.0, sent=2.0, timeout=2.0, store=False)
    assert isinstance(req, Load)
    assert not b.expired(req, 3.9)
    assert b.expired(req, 4.01)


def test_every_ping_carries_the_link_clock():
    """Review finding: the liveness probe sent a PING without `now`, clock 0, and the peer's
    next requests carried deadlines the exporter saw as long past (ETIME at once). A PING
    now always carries the clock; a request after any PING is served in its window."""
    from ualinkd.fabric.session import RequestReceived, Session
    from ualinkd.fabric.wire import NEED_DATA

    def deliver(src, dst, now):
        dst.receive_data(src.data_to_send())
        out = []
        while (ev := dst.next_event(now)) is not NEED_DATA:
            out.append(ev)
        return out

    a = Session("B", {2}, {0}, now=0.0)
    b = Session("A", {0}, {2}, now=0.0)
    t = 3600.0
    b.send_ping(1, track=False, now=t)
    deliver(b, a, t)
    b.send_ping(2, track=False, now=t + 0.1)  # the probe, as link.py sends it now
    deliver(b, a, t + 0.2)
    a.send_request(0, 2, 4096, 8, now=t + 0.2, give_up=t + 2.2)
    [ev] = deliver(a, b, t + 0.2)
    assert isinstance(ev, RequestReceived)
    assert not b.expired(ev.request, t + 0.2)


def test_data_longer_than_its_load_is_a_protocol_error():
    """Review finding: a DATA answering a LOAD must not carry more than was asked (a hostile
    or broken exporter); a shorter one is the short count of policy 10."""
    import pytest

    from ualinkd.fabric.session import DataReceived, Session
    from ualinkd.fabric.wire import NEED_DATA, RemoteProtocolError

    def pump(src, dst):
        dst.receive_data(src.data_to_send())
        out = []
        while (ev := dst.next_event(0.0)) is not NEED_DATA:
            out.append(ev)
        return out

    a = Session("B", {2}, {0}, now=0.0)
    b = Session("A", {0}, {2}, now=0.0)
    seq = a.send_request(0, 2, 4096, 8)
    pump(a, b)
    b.send_data(seq, 0, b"x" * 4)  # short: fine
    [ev] = pump(b, a)
    assert isinstance(ev, DataReceived) and ev.data == b"x" * 4
    seq = a.send_request(0, 2, 4096, 8)
    pump(a, b)
    b.send_data(seq, 0, b"x" * 9)
    a.receive_data(b.data_to_send())
    with pytest.raises(RemoteProtocolError, match="DATA of 9 bytes answers a LOAD of 8"):
        a.next_event(0.0)


def test_a_large_load_outstanding_is_known_until_its_data_or_forget():
    """The reader's header-only read (conn.py) follows `expects_large_data`: true while a
    LOAD whose DATA the decoder collects (wire.COLLECT_AT on) is outstanding and no frame
    is part read, false once its DATA was decoded or it was forgotten; small LOADs and
    STOREs never make it true."""
    from ualinkd.fabric.session import DataReceived
    from ualinkd.fabric.wire import COLLECT_AT, DATA_HEADER_SIZE

    a = Session("B", {2}, {0}, now=0.0)
    b = Session("A", {0}, {2}, now=0.0)
    a.send_request(0, 2, 4096, COLLECT_AT - 1)
    a.send_request(0, 2, 4096, b"x" * COLLECT_AT)
    assert not a.expects_large_data
    big = a.send_request(0, 2, 0, COLLECT_AT)
    other = a.send_request(0, 2, 0, 1 << 20)
    assert a.expects_large_data
    a.forget(other)
    assert a.expects_large_data
    b.receive_data(a.data_to_send())
    while b.next_event(0.0) is not NEED_DATA:
        pass
    b.send_data(big, 0, b"y" * COLLECT_AT)
    wire = b.data_to_send()
    a.receive_data(wire[:DATA_HEADER_SIZE - 1])  # part of a frame: read on normally
    assert a.next_event(0.0) is NEED_DATA and not a.expects_large_data
    a.receive_data(wire[DATA_HEADER_SIZE - 1:])
    ev = a.next_event(0.0)
    assert isinstance(ev, DataReceived) and len(ev.data) == COLLECT_AT
    assert not a.expects_large_data
