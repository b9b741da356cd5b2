"""`ualinkd record` and `ualinkd replay` of a session with user queues (issue 30 item 6), on
real nodes: Debian's unmodified libhsakmt 5.2.3 running tests/c/hsakmt_sdma.c through the
shim (as tests/integration/test_hsakmt_queues.py runs it) is recorded, then replayed against
a fresh node. The recording has each queue's creation, doorbells, packets decoded with the
memory they touched, its error and destruction; the replay re-creates and destroys the
queues through the real ioctls (their rings, in userptr memory, get zero pages at the
recorded addresses), and says what it does not replay: the doorbells and packets (the ring's
bytes are the client's CPU memory), and the event wait a TRAP packet had woken. Debian's
ROCr 5.2.3 (tests/c/rocr_client.c) the same, its AQL queue too, without the replay hanging
in ROCr's event thread's endless waits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from nodes import NEEDS_HSAKMT, SHIM, c_program, recording, running_node
from test_hsakmt_queues import MINOR, queues

from ualinkd.replay.session import QUEUE_EVENTS_NOTE

pytestmark = [
    pytest.mark.integration,
    NEEDS_HSAKMT,
]


def test_a_recorded_hsakmt_sdma_session_replays_and_says_what_of_its_queues_it_does_not(
        tmp_path: Path):
    rec = tmp_path / "rec.jsonl"
    with running_node(tmp_path / "a") as node:
        with recording([node.mount], rec):
            env = {k: v for k, v in os.environ.items() if not k.startswith(("LD_", "HSA"))}
            env.update(LD_PRELOAD=str(SHIM), UALINK_DRI_DIR=str(node.mount / "dri"))
            run = subprocess.run([c_program("hsakmt_sdma")], env=env, capture_output=True,
                                 text=True, timeout=180)
            assert run.returncode == 0, run.stdout + run.stderr + node.log_text()
    recs = [json.loads(ln) for ln in rec.read_text().splitlines()]
    queued = [r for r in recs if r["type"] == "queue"]
    pid = queued[0]["pid"]
    events = [(r["queue_id"], r["event"]) for r in queued]
    assert events.count((0, "create")) == events.count((1, "destroy")) == 1, events
    # each packet decoded, in JSON, with the memory it touched: the 2 MiB host->VRAM copy
    copies = [r for r in queued if r["event"] == "packet"
              and r["detail"].startswith("COPY_LINEAR") and r["fields"]["size"] == 2 << 20]
    assert copies, [r["detail"] for r in queued if r["event"] == "packet"][:20]
    c = copies[0]
    assert c["mem"] == [{"op": "read", "va": c["fields"]["src"], "len": 2 << 20},
                        {"op": "write", "va": c["fields"]["dst"], "len": 2 << 20}], c
    fences = [r for r in queued if r["event"] == "packet" and r["detail"].startswith("FENCE")]
    assert all(f["mem"] == [{"op": "write", "va": f["fields"]["addr"], "len": 4}]
               for f in fences), fences[:3]
    counts = {e: sum(1 for r in queued if r["event"] == e) for e in ("doorbell", "packet")}

    with running_node(tmp_path / "b", trace="json") as fresh:
        res = subprocess.run([sys.executable, "-m", "ualinkd", "replay", "-v", str(rec),
                              "--mount", str(fresh.mount)],
                             capture_output=True, text=True, timeout=240)
        out = res.stdout
        # only the wait a TRAP packet woke differs, and says why
        diffs = [ln for ln in out.splitlines() if ln.startswith("#")]
        assert len(diffs) == 1 and "AMDKFD_WAIT_EVENTS" in diffs[0], out + fresh.log_text()
        assert diffs[0].endswith(QUEUE_EVENTS_NOTE), diffs
        assert res.returncode == 1
        assert (f"not replayed: {len(queued)} queue records ({counts['doorbell']} doorbells, "
                f"{counts['packet']} packets, 1 queue errors on 2 queues): the rings' contents "
                "are the client's CPU memory, not in the recording; the queues' ioctls are "
                "replayed, their doorbells and packets are not") in out, out
        notes = [ln for ln in out.splitlines() if ln.startswith("  queue not replayed: ")]
        assert len(notes) == 2, out
        assert notes[0].startswith(f"  queue not replayed: [pid {pid}] node0 queue 0 (sdma): "
                                   "created, ") and notes[0].endswith(", destroyed"), notes
        assert "stopped in error at ring offset 0x0: unknown packet" in notes[1], notes
        # the replay's own node made both queues and destroyed them; none of them ran
        again = [json.loads(ln) for ln in fresh.out.read_text().splitlines()
                 if ln.startswith('{"v"')]
        made = [(r["queue_id"], r["event"]) for r in again if r["type"] == "queue"]
        assert sorted(made) == [(0, "create"), (0, "destroy"), (1, "create"),
                                (1, "destroy")], made
        assert queues(fresh) == [] and fresh.debug(MINOR, "kfd_processes").strip() == ""


def test_a_recorded_rocr_session_replays_its_aql_and_sdma_queues_without_hanging(
        tmp_path: Path):
    """Debian's ROCr 5.2.3 (tests/c/rocr_client.c: hsa_queue_create, async copies on its
    SDMA queues, signal waits, barriers, a dispatch that fails, shutdown) recorded and
    replayed: every queue ioctl replays as recorded (the AQL and SDMA queues are made and
    destroyed again), and ROCr's event thread's waits — forever, in the recording ended by
    completion signals the packets sent — end after their recorded time, each a
    difference saying why; the replay says what of the 4 queues it did not run."""
    from test_rocr import client_env, mi210_config

    rec = tmp_path / "rec.jsonl"
    with running_node(tmp_path / "a", mi210_config()) as node:
        with recording([node.mount], rec):
            run = subprocess.run([c_program("rocr_client")], env=client_env(node.mount),
                                 capture_output=True, text=True, timeout=280)
            assert run.returncode == 0, run.stdout + run.stderr[-3000:] + node.log_text()
    recs = [json.loads(ln) for ln in rec.read_text().splitlines()]
    kinds = {r["queue_type"] for r in recs if r["type"] == "queue"}
    assert kinds == {"compute_aql", "sdma"}, kinds
    with running_node(tmp_path / "b", mi210_config()) as fresh:
        res = subprocess.run([sys.executable, "-m", "ualinkd", "replay", "-v", str(rec),
                              "--mount", str(fresh.mount)],
                             capture_output=True, text=True, timeout=240)
        out = res.stdout
        diffs = [ln for ln in out.splitlines() if ln.startswith("#")]
        assert diffs and all("AMDKFD_WAIT_EVENTS" in d and d.endswith(QUEUE_EVENTS_NOTE)
                             for d in diffs), out + fresh.log_text()[-3000:]
        notes = [ln for ln in out.splitlines() if ln.startswith("  queue not replayed: ")]
        assert len(notes) == 4, out
        assert any("(compute_aql)" in n and "KERNEL_DISPATCH" in n for n in notes), notes
        assert "not replayed: " in out and " on 4 queues): the rings' contents" in out, out
        assert queues(fresh) == []
