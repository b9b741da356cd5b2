"""Messages a peer may send any number of times, each logged by the receiving manager
(the robustness review, session 6): unknown types (§5.1 "logged and ignored"), malformed
HELLOs, answers and releases nobody asked for. A peer repeating one of them makes one
line per cause and a count line now and then (`UalinkManager._log_repeated`), not a line
per message: a buggy or hostile peer must not flood the node's log."""

from __future__ import annotations

import logging

import pytest
from test_manager_rules import THREE, exporter
from ualink_testkit import make_node, pod_config

from ualinkd.ualink import protocol as p

N = 1000
CASES = {
    "unknown type": lambda lo, hi: p.UnknownMessage(0x3FF, (0x3FF, 0, 0, 0)),
    "malformed HELLO": lambda lo, hi: p.Hello(7, 9),
    "NPA_RSP for an unknown handle": lambda lo, hi: p.NpaRsp(0x1234 << 10, 1, 0),
    "NPA_FAIL for an unknown handle": lambda lo, hi: p.NpaFail(0x1234 << 10, 1),
    "NPA_RELEASE for an unknown handle": lambda lo, hi: p.NpaRelease(0x1234 << 10, 5),
    "NPA_REVOKE for an unknown handle": lambda lo, hi: p.NpaRevoke(0x1234 << 10, 5),
}


@pytest.mark.parametrize("case", CASES)
def test_a_message_repeated_by_a_peer_is_a_few_log_lines(case: str, caplog) -> None:
    assert THREE  # (the pod of test_manager_rules.exporter)
    core, mgr, f, h, lo, hi = exporter()
    caplog.set_level(logging.DEBUG, logger="ualinkd")
    msg = CASES[case](lo, hi)
    for _ in range(N):
        mgr.receive(1, msg)
        mgr.take_effects()
    lines = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert 1 <= len(lines) <= 4, [r.getMessage() for r in lines[:5]]
    assert lines[-1].getMessage().endswith(f"({N} times so far)")


def test_requests_before_the_connection_is_up_are_a_few_log_lines(caplog) -> None:
    """§5.4: an NPA_REQ from a peer we have no connection with is dropped and a connection
    set up; a peer that keeps sending them does not get a line per message."""
    core = make_node(pod_config(**THREE))
    mgr = core.managers[128]
    caplog.set_level(logging.DEBUG, logger="ualinkd")
    for _ in range(N):
        mgr.receive(1, p.NpaReq(0x1234 << 10, 5))
        mgr.take_effects()
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert 1 <= len(lines) <= 8, lines[:10]
