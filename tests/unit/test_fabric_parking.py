"""Uses of a link that is down, waiting in line for it (fabric/parking.py), sans-IO with
time as an argument: §13 N4's older build (quirk send-fail-slow: a send that cannot be
posted waits for the link up to the ACK timeout, then fails with ETIME) and a first use's
wait (dialing.py). Each ends its Completion exactly once, in the order it was made."""

from __future__ import annotations

import errno

import pytest

from ualinkd.drm.completion import Completion
from ualinkd.drm.errors import DrmError
from ualinkd.fabric.parking import (
    ParkedLines,
    parked_batch_failed,
    parked_request_failed,
    pass_on,
)


def _queued(log: list[str], name: str):
    def queue(conn: object) -> Completion[object]:
        log.append(name)
        c: Completion[object] = Completion()
        c.set_result(f"{name} on {conn}")
        return c
    return queue


def test_a_line_is_taken_in_the_order_it_was_made_and_passes_the_answers_on() -> None:
    lines = ParkedLines(ack_timeout=2.0)
    log: list[str] = []
    first = lines.park("b", 12.0, _queued(log, "first"), parked_batch_failed(1))
    second = lines.park("b", 12.0, _queued(log, "second"), parked_batch_failed(1))
    other = lines.park("c", 12.0, _queued(log, "other"), parked_batch_failed(1))
    outs = [p.completion for p in (first, second)]
    for parked in lines.take("b"):  # (what FabricLink._unpark does when b's link is up)
        c, parked.completion = parked.completion, None
        assert c is not None
        parked.queue("conn-b").when_done(lambda q, c=c: pass_on(c, q))
    assert log == ["first", "second"]  # in order; c's line waits on
    assert [c.result() for c in outs if c is not None] == ["first on conn-b",
                                                            "second on conn-b"]
    assert not lines.take("b")  # (gone)
    assert other.completion is not None and not other.completion.done


def test_a_batch_whose_link_never_comes_fails_each_message_with_etime_at_its_deadline() -> None:
    lines = ParkedLines(ack_timeout=2.0)
    parked = lines.park("b", 12.0, _queued([], "never"), parked_batch_failed(3))
    c = parked.completion
    assert c is not None
    parked.expire(12.0)
    outcomes = c.result()
    assert [(e.errno, t) for e, t in outcomes if e is not None] == [(errno.ETIME, 12.0)] * 3
    assert "no ACK from b within 2 s" in outcomes[0][0].strerror  # type: ignore[union-attr]
    assert not lines.take("b")  # it left its line
    parked.expire(13.0)  # (once only)


def test_a_request_whose_link_never_comes_faults_and_a_closed_fabric_is_eshutdown() -> None:
    lines = ParkedLines(ack_timeout=2.0)
    late = lines.park("b", 5.0, _queued([], "x"), parked_request_failed("b"))
    closed = lines.park("b", 5.0, _queued([], "y"), parked_request_failed("b"))
    lc, cc = late.completion, closed.completion
    assert lc is not None and cc is not None
    late.expire(5.0)
    with pytest.raises(DrmError) as e:
        lc.result()
    assert e.value.errno == errno.EFAULT  # policy 3: no answer is a fault
    lines.fail_all(DrmError(errno.ESHUTDOWN, "closed"), 6.0)
    with pytest.raises(DrmError) as e:
        cc.result()
    assert e.value.errno == errno.ESHUTDOWN
