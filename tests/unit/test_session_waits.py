"""The Session's request bookkeeping, sans-IO with time as an argument (aioquic's
`get_timer()` / `handle_timer(now)`): a LOAD/STORE's `RequestWait` and a batch's
`BatchWait` end exactly once, by their reply, their deadline or the link's drop; a reply
that comes after the deadline is dropped, not an error. Spec §5.1 (a send's ACK within the
ack timeout, ETIME; ECOMM for a refusal), Emulator policy 3/10 (an unanswered request is
EFAULT). No sleeping: every `now` is given."""

from __future__ import annotations

import errno

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ualinkd.drm.errors import DrmError
from ualinkd.fabric.session import (
    NEED_DATA,
    BatchWait,
    RequestReceived,
    RequestWait,
    Session,
)
from ualinkd.fabric.wire import Ack, encode_frame


def _pair() -> tuple[Session, Session]:
    """A (accel 0, the requester) and B (accel 2, the exporter)."""
    return Session("B", {2}, {0}), Session("A", {0}, {2})


def _deliver(src: Session, dst: Session, now: float) -> list[object]:
    dst.receive_data(src.data_to_send())
    out = []
    while (ev := dst.next_event(now)) is not NEED_DATA:
        out.append(ev)
    return out


def _errno(c: object) -> int:
    with pytest.raises(DrmError) as e:
        c.result()  # type: ignore[attr-defined]
    return e.value.errno


def test_a_requests_data_completes_its_wait_and_no_event_comes_out() -> None:
    a, b = _pair()
    w = RequestWait("B", a.send_request(0, 2, 4096, 8))
    a.expect(w, 3.0)
    c = w.completion
    assert c is not None and a.get_timer() == 3.0 and a.waiting == 1
    [req] = _deliver(a, b, 1.0)
    assert isinstance(req, RequestReceived)
    b.send_data(req.request.seq, 0, b"12345678")
    assert _deliver(b, a, 1.5) == []  # taken by the wait, in this call
    assert c.done and c.result() == b"12345678"
    assert a.waiting == 0 and a.get_timer() is None  # (the answered wait left the heap)


def test_the_exporters_error_is_the_requests() -> None:
    a, b = _pair()
    w = RequestWait("B", a.send_request(0, 2, 4096, 8))
    a.expect(w, 3.0)
    c = w.completion
    [req] = _deliver(a, b, 1.0)
    b.send_data(req.request.seq, -errno.EFAULT)
    _deliver(b, a, 1.1)
    assert _errno(c) == errno.EFAULT


def test_a_request_fails_at_its_deadline_not_before_and_its_late_data_is_dropped() -> None:
    a, b = _pair()
    w = RequestWait("B", a.send_request(0, 2, 4096, 8))
    a.expect(w, 3.0)
    c = w.completion
    assert c is not None
    [req] = _deliver(a, b, 1.0)
    a.handle_timer(2.999)
    assert not c.done and a.waiting == 1
    a.handle_timer(3.0)
    assert _errno(c) == errno.EFAULT and "no answer from B" in str(c._error)
    assert a.waiting == 0 and a.get_timer() is None
    b.send_data(req.request.seq, 0, b"late....")
    assert _deliver(b, a, 3.5) == []  # dropped: the link goes on


def test_a_batch_gives_each_message_its_outcome() -> None:
    """§5.1 per message: accepted (when its ACK came), refused (ECOMM, when its ACK came),
    never acknowledged (ETIME, at the deadline)."""
    a, _ = _pair()
    seqs = a.send_messages(0, 2, [(3, i, 0, 0) for i in range(3)])
    w = BatchWait("B", seqs, 0.3)
    a.expect(w, 10.3)
    c = w.completion
    assert c is not None
    a.receive_data(encode_frame(Ack(seqs[0], 0)))
    assert a.next_event(10.1) is NEED_DATA  # taken by the wait
    a.receive_data(encode_frame(Ack(seqs[1], -5)))
    assert a.next_event(10.2) is NEED_DATA
    assert not c.done
    a.handle_timer(10.3)
    (e0, t0), (e1, t1), (e2, t2) = c.result()
    assert e0 is None and t0 == 10.1
    assert e1 is not None and e1.errno == errno.ECOMM and t1 == 10.2
    assert e2 is not None and e2.errno == errno.ETIME and t2 == 10.3


def test_a_batch_missing_acks_fail_at_the_deadline_with_etime() -> None:
    a, b = _pair()
    seqs = a.send_messages(0, 2, [(3, i, 0, 0) for i in range(2)])
    w = BatchWait("B", seqs, 0.3)
    a.expect(w, 10.3)
    c = w.completion
    assert c is not None
    _deliver(a, b, 10.0)
    acks = b.data_to_send()
    a.receive_data(acks[: len(acks) // 2])  # only the first ACK arrives
    assert a.next_event(10.05) is NEED_DATA
    assert not c.done
    a.handle_timer(10.3)
    (e0, t0), (e1, t1) = c.result()
    assert e0 is None and t0 == 10.05
    assert e1 is not None and e1.errno == errno.ETIME and t1 == 10.3
    assert "within 0.3 s" in e1.strerror
    a.receive_data(acks[len(acks) // 2:])  # the late ACK: dropped
    assert a.next_event(10.4) is NEED_DATA


def test_the_links_drop_fails_every_wait_once() -> None:
    a, _ = _pair()
    batch = BatchWait("B", a.send_messages(0, 2, [(3, 0, 0, 0), (3, 1, 0, 0)]), 0.3)
    a.expect(batch, 5.0)
    req = RequestWait("B", a.send_request(0, 2, 0, 8))
    a.expect(req, 5.0)
    bc, rc = batch.completion, req.completion
    assert bc is not None and rc is not None
    a.close(1.0)
    assert [(e.errno, t) for e, t in bc.result() if e is not None] == [(errno.ETIME, 1.0)] * 2
    assert "dropped" in bc.result()[0][0].strerror  # type: ignore[union-attr]
    assert _errno(rc) == errno.EFAULT
    assert a.waiting == 0 and a.get_timer() is None


@given(st.lists(st.tuples(st.sampled_from(["answer", "time", "late"]),
                          st.floats(0, 10, allow_nan=False)), max_size=40),
       st.lists(st.floats(0.1, 10, allow_nan=False), min_size=1, max_size=12))
def test_every_wait_ends_exactly_once(steps: list[tuple[str, float]],
                                      deadlines: list[float]) -> None:
    """Whatever comes first (its DATA, its deadline, the drop), each request's Completion
    ends once, its seq leaves the tables, and nothing later raises."""
    a, b = _pair()
    waits = []
    for i, give_up in enumerate(deadlines):
        w = RequestWait("B", a.send_request(0, 2, 4096 * i, 8))
        a.expect(w, give_up)
        waits.append((w.completion, give_up))
    reqs = [ev.request for ev in _deliver(a, b, 0.0)]  # type: ignore[attr-defined]
    ended = [0] * len(waits)
    for i, (c, _) in enumerate(waits):
        c.when_done(lambda _c, i=i: ended.__setitem__(i, ended[i] + 1))  # type: ignore[union-attr]
    now = 0.0
    for kind, x in steps:
        if kind == "time":
            now = max(now, x)
            a.handle_timer(now)
            for (_c, give_up), n in zip(waits, ended, strict=True):
                assert n == 1 if give_up <= now else n <= 1
            timer = a.get_timer()
            assert timer is None or timer > now
        elif reqs:
            req = reqs[int(x * 1000) % len(reqs)]
            b.send_data(req.seq, 0, b"8 bytes!")
            _deliver(b, a, now)
    a.close(now + 1)
    assert ended == [1] * len(waits)
    assert a.waiting == 0 and a.get_timer() is None
