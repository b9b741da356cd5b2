"""SDMA queues through Debian's libhsakmt 5.2.3, unmodified (tests/c/hsakmt_sdma.c), via the
shim against a real node (issue 30, "Tests that must exist"; spec userspace-surface §8):
hsaKmtCreateQueue(HSA_QUEUE_SDMA) and packets as ROCr's BlitSdmaV4 writes them — copies
host<->VRAM (GTT and userptr host memory), FENCE, a POLL_REGMEM dependency the CPU
releases, ATOMIC, TIMESTAMP, TRAP waking hsaKmtWaitOnEvent, a ring that wraps, an illegal
packet that stops its queue only, destroy; what the node's tables show meanwhile; nothing
left after the process; the idle cost of a node with 8 idle queues, and of one with a
queue blocked on a poll."""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import time
from pathlib import Path

import pytest
from nodes import NEEDS_HSAKMT, SHIM, Node, c_program, running_node, wait_until

from ualinkd import sysfs
from ualinkd.cli import ctl

pytestmark = [
    pytest.mark.integration,
    NEEDS_HSAKMT,
]
MINOR = 128


def client(node: Node, *args: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LD_", "HSA"))}
    env.update(LD_PRELOAD=str(SHIM), UALINK_DRI_DIR=str(node.mount / "dri"),
               HSAKMT_SDMA_PAUSE="1")
    return subprocess.Popen([c_program("hsakmt_sdma"), *args], env=env, bufsize=0,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)


def read_until(proc: subprocess.Popen[bytes], marker: str, timeout: float = 120) -> str:
    """The client's output up to a line starting with `marker` or `fail` (or its end, or
    the timeout), read straight from the pipe (no buffer select() cannot see)."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    out = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = out.decode(errors="replace").splitlines(keepends=True)
        if any(ln.endswith("\n") and ln.startswith((marker, "fail")) for ln in lines):
            break
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        out += chunk
    return out.decode(errors="replace")


def finish(proc: subprocess.Popen[bytes]) -> tuple[int, str]:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(b"\n")
    proc.stdin.close()
    rest = proc.stdout.read()
    return proc.wait(timeout=60), rest.decode(errors="replace")


def queues(node: Node) -> list[dict[str, object]]:
    return sysfs.DEBUGFS["kfd_queues"].parse(node.debug(MINOR, "kfd_queues"))


def test_libhsakmt_sdma_queue_runs_rocr_packets(tmp_path: Path, capsys):
    """The whole hsakmt_sdma.c run, step by step ok; meanwhile the node lists the two SDMA
    queues (ualinkctl's kfd_queues table: the good one active with its packets counted and
    rptr = wptr, the one fed an illegal packet in error) and logged one line naming the
    process, queue and ring offset; after destroy and exit, no queue and no GEM object
    is left. The JSON trace has each queue's create, doorbells, error and destroy."""
    with running_node(tmp_path, trace="json") as node:
        proc = client(node)
        try:
            out = read_until(proc, "ok queues_before_destroy")
            assert "ok queues_before_destroy" in out, out + node.log_text()
            # (the fence lands before the engine's run ends and writes rptr back)
            assert wait_until(lambda: (r := queues(node)) and r[0]["rptr"] == r[0]["wptr"])
            rows = queues(node)
            assert [r["type"] for r in rows] == ["sdma", "sdma"], rows
            good, bad = rows
            assert good["state"] == "active" and bad["state"] == "error", rows
            assert good["rptr"] == good["wptr"] and int(good["packets"]) > 100, good
            pid = proc.pid
            assert ctl.main(["--mount", str(node.mount), "kfd"]) == 0  # ualinkctl kfd
            listed = capsys.readouterr().out.split("kfd queues\n", 1)[1]
            assert len([ln for ln in listed.splitlines() if f" {pid} " in ln]) == 2, listed
            assert "sdma" in listed and " error" in listed and " active" in listed, listed
            errors = [ln for ln in node.log_text().splitlines() if "GPU queue error" in ln]
            assert len(errors) == 1, errors
            assert re.search(rf"pid {pid} queue {bad['queue_id']} \(sdma.*ring offset 0x0",
                             errors[0]), errors
            code, rest = finish(proc)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert code == 0, out + rest + node.log_text()
        assert "ok done" in rest
        for step in ("copy_bytes", "rptr_written_back", "poll_holds", "poll_released",
                     "atomic_value", "timestamp_increases", "trap_woke", "ring_wraps",
                     "illegal_stops_queue", "other_queue_fence"):
            assert f"ok {step}" in out, (step, out)
        assert wait_until(lambda: queues(node) == [])
        assert wait_until(lambda: node.debug(MINOR, "gem_objects").strip() == "")
        assert node.debug(MINOR, "kfd_processes").strip() == ""
        recs = [json.loads(ln) for ln in node.out.read_text().splitlines()
                if ln.startswith("{")]
        events = [(r["queue_id"], r["event"]) for r in recs if r["type"] == "queue"]
        assert events.count((0, "create")) == events.count((1, "create")) == 1, events
        assert events.count((0, "destroy")) == events.count((1, "destroy")) == 1, events
        # (doorbell writes the scanner did not see apart are one doorbell)
        assert events.count((0, "doorbell")) >= 8 and (1, "error") in events, events
        err = next(r for r in recs if r["type"] == "queue" and r["event"] == "error")
        assert err["pid"] == pid and "unknown packet" in err["detail"], err


def test_64_mib_copies_each_way_are_byte_exact(tmp_path: Path):
    """hsakmt_sdma.c bench: a 64 MiB copy host→VRAM (a system-memory userptr BO into a VRAM
    BO's 1,024 chunks) and VRAM→host (into a registered malloc'd buffer), checked byte for
    byte by the client. Moves of that size are shared by two threads in 4 MiB pieces when
    the node may run on two CPUs (callermem._split_move, issue 34), cut inside the chunks'
    buffers: every byte must land where one move would put it."""
    with running_node(tmp_path) as node:
        proc = client(node, "bench")
        try:
            out = read_until(proc, "ok queues_before_destroy")
            assert "ok copy_rate bytes=67108864" in out, out + node.log_text()[-2000:]
            assert "ok copy_bytes" in out, out + node.log_text()[-2000:]
            code, rest = finish(proc)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert code == 0, out + rest + node.log_text()[-2000:]


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_an_idle_node_with_8_idle_queues_does_not_spin(tmp_path: Path):
    """Issue 30's idle node: while a client holds 8 SDMA queues whose doorbells are mapped
    and never rung, the daemon's CPU (utime + stime over 4 s) stays far below a spin's
    (under 10% of one CPU): the doorbells are watched by a timed C poll, not a busy loop.
    The figure itself (0.5-0.7%, goal < 1%) is make bench's to watch (benchmarks/run.py's
    engine table), not a timed assertion's."""
    with running_node(tmp_path) as node:
        proc = client(node, "idle")
        try:
            out = read_until(proc, "ok idle_queues")
            assert "ok idle_queues n=8" in out, out + node.log_text()
            assert len(queues(node)) == 8
            time.sleep(1)  # past the back-off after the creations
            t0, c0 = time.monotonic(), _cpu_seconds(node.proc.pid)
            time.sleep(4)
            frac = (_cpu_seconds(node.proc.pid) - c0) / (time.monotonic() - t0)
            print(f"idle daemon with 8 idle queues: {frac * 100:.2f}% of one CPU")
            code, rest = finish(proc)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert code == 0, out + rest
        # A spin is the bug this guards against (a 50 µs trio tick cost ~10% here, a
        # Python poll every 1 ms 2%); under a loaded CI machine the real figure moves.
        assert frac < 0.10, frac
        assert wait_until(lambda: queues(node) == [])


def test_a_queue_blocked_on_a_forever_poll_costs_a_few_percent_cpu(tmp_path: Path):
    """ROCr's dependency poll (POLL_REGMEM, retry count 0xFFF, on a word the CPU releases;
    spec userspace-surface §8): while it is pending the daemon's CPU (utime + stime over
    4 s) stays far below a spin's (under 10% of one CPU), as the edge re-checks a poll that
    keeps failing at a delay growing to POLL_MAX_DELAY instead of spinning; once the CPU
    writes the word the
    fence after the poll lands within 100 ms (printed: the release latency)."""
    with running_node(tmp_path) as node:
        proc = client(node, "poll")
        try:
            out = read_until(proc, "ok poll_pending")
            assert "ok poll_pending" in out, out + node.log_text()
            time.sleep(0.5)  # past the young poll's quick re-checks
            t0, c0 = time.monotonic(), _cpu_seconds(node.proc.pid)
            time.sleep(4)
            frac = (_cpu_seconds(node.proc.pid) - c0) / (time.monotonic() - t0)
            print(f"daemon while one forever poll is pending: {frac * 100:.2f}% of one CPU")
            code, rest = finish(proc)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert code == 0, out + rest + node.log_text()
        latency = re.search(r"ok poll_release latency_us=(\d+)", rest)
        assert latency, rest
        print(f"poll released {int(latency[1]) / 1000:.1f} ms after the CPU's store")
        # A spin is the bug this guards against (9-19% of a CPU here before the back-off, 27-68%
        # under load); the figure itself (3-5%) is make bench's to watch, not a timed assertion's.
        assert frac < 0.10, frac
        assert int(latency[1]) < 100_000, rest
        assert wait_until(lambda: queues(node) == [])


def test_sdma_copies_remote_memory_across_two_nodes_and_faults_after_revoke(tmp_path: Path):
    """AMD's two-node fabric flow with Debian's APIs (tests/c/hsakmt_sdma_fabric.c): node0
    allocates VRAM, stores a pattern and UALink-exports it; a libhsakmt process on node1
    imports the handle, GEM_VA-maps it in its KFD process's GPU VM, and its SDMA queue
    copies remote -> host (bytes checked) and host -> remote (node0 reads them in its own
    VRAM); after node0 frees the BO, the importer's next SDMA access faults — its queue
    stops (gpu_faults counts it, one log line), nothing hangs, and the process ends
    cleanly."""
    from nodes import Client, running_pod
    from test_pod_fabric import pod_config

    size = 1 << 20
    pattern = bytes((i * 13 + 5) & 0xFF for i in range(size))
    with running_pod(tmp_path, config=pod_config(2)) as (a, b), Client(a.render()) as ca:
        bo = ca.bo_create(size)
        ca.va_map(bo, 0x100000000, size)
        assert ca.gpu_write(0x100000000, pattern) == size
        lo, hi = ca.export(bo)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LD_", "HSA"))}
        env.update(LD_PRELOAD=str(SHIM), UALINK_DRI_DIR=str(b.mount / "dri"))
        proc = subprocess.Popen([c_program("hsakmt_sdma_fabric"), hex(lo), hex(hi), str(size)],
                                env=env, bufsize=0, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            out = read_until(proc, "ok stored")
            assert "ok stored" in out, out + b.log_text()
            assert "ok r2h_bytes" in out, out
            print(next(ln for ln in out.splitlines() if "r2h_rate" in ln))
            assert ca.gpu_read(0x100000000, size) == bytes(~x & 0xFF for x in pattern)
            before = int(b.debug(MINOR, "gpu_faults"))
            ca.va_unmap(bo, 0x100000000, size)
            ca.bo_close(bo)
            assert wait_until(lambda: b.debug(MINOR, "ualink_imports") == "")
            code, rest = finish(proc)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert code == 0, out + rest + b.log_text()
        assert "ok revoked_faults" in rest and "ok done" in rest, rest
        assert int(b.debug(MINOR, "gpu_faults")) > before
        errors = [ln for ln in b.log_text().splitlines() if "GPU queue error" in ln]
        assert len(errors) == 1 and "GPU page fault" in errors[0], errors
        assert wait_until(lambda: queues(b) == [])
