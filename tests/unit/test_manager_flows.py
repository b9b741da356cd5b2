"""The UALink flows as the manager decides them, time as an input (aioquic's get_timer /
handle_timer): the import flow's 5 s waits (§1.6 I11, I14), the transport's 2 s send
failures (§5.8a, I9), the revoke's 5 s wait for NPA_RELEASE (§5.7 steps 6–8), and an
interrupted import (I10). No sleeping: each test says what time it is."""

from __future__ import annotations

import errno

import pytest
from ualink_testkit import connected_export, make_node, open_file, pod_config

from ualinkd.drm.errors import DrmError
from ualinkd.drm.gem import DmaBuf
from ualinkd.ualink import protocol as p
from ualinkd.ualink.manager import (
    HelloSent,
    ImportDone,
    ImportFlow,
    NpaReqSent,
    RevokeSent,
    Send,
    UalinkManager,
    Wake,
)
from ualinkd.ualink.peers import ConnEvent, ConnState, NodeState

THREE = {"nodes": [[{"id": 0}], [{"id": 1}], [{"id": 2}]]}
LO, HI = 0x1234_5678_9ABC_0000, 0x42  # exported by accel 0
ETIME = DrmError(errno.ETIME, "no ACK within 2 s")  # what the link reports after 2 s


def importer(quirks: tuple[str, ...] = ()) -> tuple[object, UalinkManager, list[ImportFlow]]:
    """Accel 1 (node1) importing from accel 0; the 'waiter' only records the flow."""
    core = make_node(pod_config(**THREE, quirks=quirks), node="node1")
    mgr = core.managers[128]
    flows: list[ImportFlow] = []

    def waiter(m: UalinkManager, flow: ImportFlow) -> ImportFlow:
        flows.append(flow)
        return flow

    mgr.attach(waiter)  # type: ignore[arg-type]  # a recorder, not an awaitable
    return core, mgr, flows


def start_import(core, mgr, flows, lo: int = LO, hi: int = HI) -> tuple[ImportFlow, Send]:
    mgr.import_handle(open_file(core), lo, hi)
    (send,) = mgr.take_effects()
    assert isinstance(send, Send)
    return flows[-1], send


def outcome_errno(flow: ImportFlow) -> int:
    with pytest.raises(DrmError) as e:
        flow.outcome()
    return e.value.errno


def test_no_hello_ack_within_5_s_times_out_without_cleanup():
    """§1.6 I11, §5.4: the wait for the connection starts once HELLO was accepted and
    lasts response_timeout (5 s); then NOT_READY, ETIMEDOUT, the node gone, no message."""
    core, mgr, flows = importer()
    flow, hello = start_import(core, mgr, flows)
    assert isinstance(hello.msg, p.Hello) and isinstance(hello.tag, HelloSent)
    assert mgr.conn(0).state == ConnState.IN_PROGRESS
    assert mgr.get_timer() is None  # nothing runs until the HELLO is accepted
    mgr.on_sent(hello, None, 100.0)
    assert mgr.get_timer() == 105.0
    mgr.handle_timer(104.999)
    assert not flow.done and mgr.conn(0).state == ConnState.IN_PROGRESS
    mgr.handle_timer(105.0)
    assert flow.done and outcome_errno(flow) == errno.ETIMEDOUT
    assert mgr.conn(0).state == ConnState.NOT_READY and LO not in mgr.imports
    assert mgr.take_effects() == [Wake(ImportDone(LO))]
    assert mgr.get_timer() is None


def test_a_hello_the_link_could_not_deliver_fails_with_its_error():
    """§5.8a, I9: the transport gives up after send_ack_timeout_ms (2 s) with ETIME; the
    import returns that error, the connection goes back to NOT_READY, no timer is left."""
    core, mgr, flows = importer()
    flow, hello = start_import(core, mgr, flows)
    mgr.on_sent(hello, ETIME, 2.0)
    assert flow.done and outcome_errno(flow) == errno.ETIME
    assert mgr.conn(0).state == ConnState.NOT_READY and not mgr.imports
    assert mgr.get_timer() is None


def test_no_npa_rsp_within_5_s_resets_the_connection():
    """§1.6 I14, §5.8: NPA_REQ accepted, no answer in 5 s: ETIMEDOUT and a reset of the
    connection with the generation it was sent with, which tears down the READY imports
    from that exporter (no NPA_RELEASE)."""
    core, mgr, flows = importer()
    flow, hello = start_import(core, mgr, flows)
    mgr.on_sent(hello, None, 0.0)
    mgr.receive(0, p.HelloAck())
    (req,) = mgr.take_effects()  # the manager goes on by itself: no waiter involved
    assert isinstance(req.msg, p.NpaReq) and req.tag == NpaReqSent(LO)
    assert mgr.conn(0).state == ConnState.ESTABLISHED and mgr.get_timer() is None
    mgr.on_sent(req, None, 1.0)
    mgr.receive(0, p.NpaRsp(p.handle_lo_bits(LO), 256, 0x802))
    (wake,) = mgr.take_effects()
    assert wake == Wake(ImportDone(LO)) and isinstance(flow.outcome(), DmaBuf)
    assert mgr.imports[LO].state == NodeState.READY and mgr.get_timer() is None
    # A second handle: its NPA_REQ goes out at once (ESTABLISHED), nobody answers.
    lo2 = LO + 0x400
    flow2, req2 = start_import(core, mgr, flows, lo2)
    assert isinstance(req2.msg, p.NpaReq)
    mgr.on_sent(req2, None, 10.0)
    mgr.handle_timer(14.9)
    assert not flow2.done and mgr.conn(0).state == ConnState.ESTABLISHED
    mgr.handle_timer(15.0)
    assert outcome_errno(flow2) == errno.ETIMEDOUT
    assert mgr.conn(0).state == ConnState.NOT_READY
    assert not mgr.imports  # the READY import of LO went with the reset
    sends = [e for e in mgr.take_effects() if isinstance(e, Send)]
    assert sends == []  # no NPA_RELEASE, no HELLO


def test_quirk_npa_req_fail_no_reset_a_failed_npa_req_send_leaves_the_connection():
    """§13 N3's quirk "npa-req-fail-no-reset" (U, I12 with a send error, the 2 s rule):
    the import fails with it; the connection is not reset (that is I14's, for a delivered
    request)."""
    core, mgr, flows = importer(quirks=("npa-req-fail-no-reset",))
    mgr.conn(0).apply(ConnEvent.SETUP)
    mgr.conn(0).apply(ConnEvent.HELLO_ACK)
    flow, req = start_import(core, mgr, flows)
    mgr.on_sent(req, ETIME, 2.0)
    assert outcome_errno(flow) == errno.ETIME
    assert mgr.conn(0).state == ConnState.ESTABLISHED and not mgr.imports
    assert mgr.get_timer() is None


def test_an_answer_before_the_npa_req_is_reported_sent_is_kept():
    """The answer can be processed before the send's outcome: the import completes when
    the NPA_REQ is reported accepted, without waiting for the timer."""
    core, mgr, flows = importer()
    mgr.conn(0).apply(ConnEvent.SETUP)
    mgr.conn(0).apply(ConnEvent.HELLO_ACK)
    flow, req = start_import(core, mgr, flows)
    mgr.receive(0, p.NpaRsp(p.handle_lo_bits(LO), 256, 0x802))
    assert not flow.done
    mgr.on_sent(req, None, 3.0)
    assert flow.done and isinstance(flow.outcome(), DmaBuf) and mgr.get_timer() is None


def test_an_interrupted_import_leaves_the_connection_not_ready():
    """§1.6 I10: the waiter interrupted while the connection is set up: NOT_READY (not
    IN_PROGRESS for good), the node gone; a late HELLO outcome changes nothing."""
    core, mgr, flows = importer()
    flow, hello = start_import(core, mgr, flows)
    mgr.import_cancelled(flow)
    assert mgr.conn(0).state == ConnState.NOT_READY and not mgr.imports
    mgr.on_sent(hello, None, 1.0)
    assert mgr.get_timer() is None and not mgr.take_effects()


def exporter():
    core, mgr, f, lo, hi = connected_export(pod_config(**THREE))
    for remote in (1, 2):
        mgr.receive(remote, p.NpaReq(p.handle_lo_bits(lo), hi))
        for eff in mgr.take_effects():
            mgr.on_sent(eff, None, 0.0)
    return core, mgr, lo, hi


def test_revoke_waits_5_s_after_its_sends_then_resets_the_silent_importer():
    """§5.7 steps 5–8: NPA_REVOKE to both importers; the 5 s wait starts once both sends
    are done; accel 1 releases, accel 2 does not: at the deadline every NPA is freed and
    only the connection to accel 2 is reset."""
    core, mgr, lo, hi = exporter()
    entry = mgr.exports[lo]
    mgr.revoke(entry.bo)
    revokes = [e for e in mgr.take_effects() if isinstance(e, Send)]
    assert sorted(e.dst for e in revokes) == [1, 2]
    assert all(e.tag == RevokeSent(lo) for e in revokes)
    mgr.on_sent(revokes[0], None, 20.0)
    assert mgr.get_timer() is None  # one send still out
    mgr.on_sent(revokes[1], None, 21.0)
    assert mgr.get_timer() == 26.0
    mgr.receive(1, p.NpaRelease(p.handle_lo_bits(lo), hi))
    mgr.handle_timer(25.9)
    assert lo in mgr.invalid
    mgr.handle_timer(26.0)
    assert lo not in mgr.invalid and mgr.npa_import_pages == 0
    assert mgr.conn(1).state == ConnState.ESTABLISHED
    assert mgr.conn(2).state == ConnState.NOT_READY
    mgr.check_invariants()


def test_revoke_ends_at_the_last_release_and_a_failed_send_resets():
    """§5.7: the release set empties → done at once, no timer; a REVOKE that could not be
    sent (the 2 s rule) drops that importer and resets its connection (U′)."""
    core, mgr, lo, hi = exporter()
    mgr.revoke(mgr.exports[lo].bo)
    r1, r2 = sorted((e for e in mgr.take_effects() if isinstance(e, Send)),
                    key=lambda e: e.dst)
    mgr.on_sent(r2, ETIME, 2.0)
    assert mgr.conn(2).state == ConnState.NOT_READY and lo in mgr.invalid
    mgr.on_sent(r1, None, 2.0)
    assert mgr.get_timer() == 7.0
    mgr.receive(1, p.NpaRelease(p.handle_lo_bits(lo), hi))
    assert lo not in mgr.invalid and mgr.get_timer() is None
    assert mgr.conn(1).state == ConnState.ESTABLISHED
    mgr.check_invariants()


def test_connection_reset_goes_through_the_connection_table():
    """§5.8: a reset applies only from ESTABLISHED with the same generation, to NOT_READY
    (timeouts) or PENDING (a HELLO while ESTABLISHED): rows of peers.CONN_TRANSITIONS."""
    from ualinkd.ualink.peers import CONN_TRANSITIONS

    assert CONN_TRANSITIONS[(ConnState.ESTABLISHED, ConnEvent.RESET)] == ConnState.NOT_READY
    assert (CONN_TRANSITIONS[(ConnState.ESTABLISHED, ConnEvent.RESET_FOR_HELLO)]
            == ConnState.PENDING)
    assert not any((s, ConnEvent.RESET) in CONN_TRANSITIONS
                   for s in ConnState if s != ConnState.ESTABLISHED)
    core, mgr, flows = importer()
    c = mgr.conn(0)
    assert not mgr.connection_reset(0, ConnState.NOT_READY, 0)  # NOT_READY: no row
    c.apply(ConnEvent.SETUP)
    c.apply(ConnEvent.HELLO_ACK)
    assert not mgr.connection_reset(0, ConnState.NOT_READY, c.generation + 1)
    assert c.state == ConnState.ESTABLISHED
    assert mgr.connection_reset(0, ConnState.PENDING, c.generation)
    assert c.state == ConnState.PENDING
