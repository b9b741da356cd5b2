"""The GPU engine's copies from imported memory through the C data plane (issue 34;
ualinkd/engine_remote.py, fuse/dataplane.c `ualinkd_dp_load_into`), on real daemons with an
unmodified libhsakmt 5.2.3 client (tests/c/fabric_sdma.c `copies`): an SDMA copy of the
exporter's VRAM (node 0) into the importer's system memory (node 1) loads its source in
1 MiB pieces that node 1's data-plane thread receives, with the link carrying what the data
plane does not (a piece whose route the exporter has not learnt yet), and the same bytes,
faults and policy 10 as the link's path (spec ualink-kernel-behaviour policy 10, §4.5)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from nodes import NEEDS_HSAKMT, Node, c_program, running_pod, tls_pod_config, wait_until
from test_data_plane import stats, while_stopped
from test_fabric_sdma import env_for, fields, gpu_faults, read_ok
from test_pod_fabric import pod_config

pytestmark = [pytest.mark.integration, NEEDS_HSAKMT]
MIB = 1 << 20
BO_SIZE = 12 * MIB  # past the copier's ring (8 slots of 1 MiB): its slots are reused


@contextmanager
def exported(node: Node, size: int) -> Iterator[tuple[subprocess.Popen[str], dict[str, str]]]:
    """`fabric_sdma export size` on `node` (pattern seed 1 written by its CPU): the process
    and its handle, killed at the end."""
    proc = subprocess.Popen([c_program("fabric_sdma"), "export", str(size)],
                            env=env_for(node.mount), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        yield proc, read_ok(proc, "export")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@contextmanager
def importer(node: Node, exp: dict[str, str], size: int
             ) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """`fabric_sdma copies` on `node`, its import mapped (the process, and the GPU VA of the
    import); killed at the end."""
    proc = subprocess.Popen([c_program("fabric_sdma"), "copies", exp["lo"], exp["hi"],
                             str(size)], env=env_for(node.mount), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        read_ok(proc, "gpu_node")
        read_ok(proc, "create_queue")
        yield proc, int(read_ok(proc, "import")["va"], 16)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def copy(proc: subprocess.Popen[str], off: int, size: int) -> tuple[str, dict[str, str]]:
    """One SDMA copy of the BO's [off, off + size) remote->host: ("copy", {"equal": ...})
    or ("fault", {...})."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(f"copy {off} {size}\n")
    proc.stdin.flush()
    line = proc.stdout.readline()
    status, step, kv = fields(line) if line.strip() else ("eof", "", {})
    assert status == "ok" and step in ("copy", "fault"), line
    return step, kv


def test_remote_copies_ride_the_data_plane_byte_exact_across_pieces_and_past_route_misses(
        tmp_path: Path):
    """A 12 MiB BO: the first copy's pieces miss every route at the exporter (each answered
    "not here", then loaded through the link, whose LOADs teach the routes); the next ones
    are carried by the data plane whole (engine_loads counts them on the importer, served
    on the exporter). Byte-exact, and nothing written around the copy, at odd offsets and
    sizes across the 1 MiB pieces and the ring's reuse. Fails before issue 34's engine
    loads (no engine_loads: every piece went through the link)."""
    c_program("libualink_shim.so")
    with running_pod(tmp_path, config=pod_config(2)) as (a, b):
        assert wait_until(lambda: stats(a)["channels"] == 1 and stats(b)["channels"] == 1, 10)
        with exported(a, BO_SIZE) as (_, exp), importer(b, exp, BO_SIZE) as (imp, _):
            before = stats(b)
            kind, kv = copy(imp, 0, BO_SIZE)
            assert (kind, kv.get("equal")) == ("copy", "1"), kv
            first = stats(b)
            assert first["engine_fallbacks"] > before.get("engine_fallbacks", 0), first
            for off, size in [(0, BO_SIZE), (MIB - 3, 2 * MIB + 7), (5 * MIB + 4095, 4097),
                              (123, 9 * MIB + 1), (BO_SIZE - MIB - 1, MIB + 1), (7, 1),
                              (3 * MIB, 8 * MIB)]:
                was, served = stats(b)["engine_loads"], stats(a)["served"]
                kind, kv = copy(imp, off, size)
                assert (kind, kv.get("equal")) == ("copy", "1"), (off, size, kv)
                assert stats(b)["engine_loads"] > was, (off, size, stats(b))
                assert stats(a)["served"] > served, (off, size)
            assert "unexpected exception" not in a.log_text() + b.log_text()


def test_a_copy_half_of_whose_routes_the_exporter_lacks_is_byte_exact(tmp_path: Path):
    """Routes learnt for the first 2 MiB only: the whole BO's copy has its first pieces
    carried and the rest answered "not here" by the exporter's thread, then loaded through
    the link into the same slots, in order: byte-exact."""
    c_program("libualink_shim.so")
    with running_pod(tmp_path, config=pod_config(2)) as (a, b):
        assert wait_until(lambda: stats(a)["channels"] == 1 and stats(b)["channels"] == 1, 10)
        with exported(a, BO_SIZE) as (_, exp), importer(b, exp, BO_SIZE) as (imp, _):
            for _ in range(2):  # (the first teaches the routes of these 2 MiB)
                kind, kv = copy(imp, 0, 2 * MIB)
                assert (kind, kv.get("equal")) == ("copy", "1"), kv
            before_b, before_a = stats(b), stats(a)
            kind, kv = copy(imp, 0, BO_SIZE)
            assert (kind, kv.get("equal")) == ("copy", "1"), kv
            after_b, after_a = stats(b), stats(a)
            assert after_b["engine_loads"] - before_b["engine_loads"] >= 2, after_b
            assert after_b["engine_fallbacks"] - before_b["engine_fallbacks"] >= 1, after_b
            assert after_a["refused"] > before_a["refused"], after_a


@pytest.mark.parametrize("tls", [False, True], ids=["data-plane", "link-only"])
def test_a_remote_copy_while_the_exporter_is_stopped_faults_as_on_the_link(
        tmp_path: Path, tls: bool):
    """Policy 7, 10: a LOAD not answered within the pod's send_ack_timeout_ms faults. The
    exporter's daemon stopped (SIGSTOP) past that deadline and resumed within the
    heartbeat's: the SDMA copy faults (no fence, the KFD's memory event, gpu_faults + 1)
    through the data plane as through the link (the TLS pod's, which has no data plane),
    the answers that come late are dropped, and the next importer's copy is byte-exact
    (through the data plane again, where it has one)."""
    c_program("libualink_shim.so")
    config = pod_config(2, response_ms=250)
    with running_pod(tmp_path, config=tls_pod_config(tmp_path, config) if tls
                     else config) as (a, b):
        if not tls:
            assert wait_until(lambda: stats(b)["channels"] == 1, 10)
        with exported(a, 4 * MIB) as (_, exp):
            with importer(b, exp, 4 * MIB) as (imp, va):
                for _ in range(2):  # (routes learnt, then carried)
                    kind, kv = copy(imp, 0, 4 * MIB)
                    assert (kind, kv.get("equal")) == ("copy", "1"), kv
                faults, handed = gpu_faults(b), stats(b).get("engine_fallbacks", 0)
                got = while_stopped(a.proc, lambda: copy(imp, 0, 4 * MIB))
                assert len(got) == 1 and isinstance(got[0], tuple), got
                kind, kv = got[0]
                assert kind == "fault" and kv["memory_event"] == "1", (got, b.log_text()[-2000:])
                # (a load's fault: its page is the copy's source, in the import)
                assert va <= int(kv["fault_va"], 16) < va + 4 * MIB, (hex(va), kv)
                assert gpu_faults(b) == faults + 1
                if not tls:  # (its loads were the data plane's, and expired there)
                    assert stats(b)["engine_fallbacks"] > handed, stats(b)
            with importer(b, exp, 4 * MIB) as (imp, _):
                loads = stats(b).get("engine_loads", 0)
                kind, kv = copy(imp, 0, 4 * MIB)
                assert (kind, kv.get("equal")) == ("copy", "1"), kv
                if not tls:
                    assert stats(b)["engine_loads"] > loads
            assert "unexpected exception" not in a.log_text() + b.log_text()


def test_an_importer_killed_mid_copy_leaves_the_data_plane_working(tmp_path: Path):
    """The C thread never writes into a copy's buffer once its loads' outcomes are posted,
    and the buffer lives until then whatever becomes of the copy: the importing process
    SIGKILLed while its copy's loads wait on a stopped exporter (its queue goes, the copy's
    task is cancelled, the loads expire, their answers come after the exporter resumes and
    are dropped), then another process's copies are byte-exact and carried, and neither
    daemon logged an unexpected exception."""
    c_program("libualink_shim.so")
    with running_pod(tmp_path, config=pod_config(2, response_ms=250)) as (a, b):
        assert wait_until(lambda: stats(b)["channels"] == 1, 10)
        with exported(a, BO_SIZE) as (_, exp):
            with importer(b, exp, BO_SIZE) as (imp, _):
                for _ in range(2):
                    kind, kv = copy(imp, 0, BO_SIZE)
                    assert (kind, kv.get("equal")) == ("copy", "1"), kv

                def start_and_kill() -> None:
                    assert imp.stdin is not None
                    imp.stdin.write(f"copy 0 {BO_SIZE}\n")
                    imp.stdin.flush()
                    time.sleep(0.1)  # (its copy under way: the doorbell seen, loads out)
                    imp.kill()
                    imp.wait()

                while_stopped(a.proc, start_and_kill)
            with importer(b, exp, BO_SIZE) as (imp, _):
                for off, size in [(0, BO_SIZE), (MIB + 1, 7 * MIB)]:
                    loads = stats(b)["engine_loads"]
                    kind, kv = copy(imp, off, size)
                    assert (kind, kv.get("equal")) == ("copy", "1"), kv
                    assert stats(b)["engine_loads"] > loads
        assert a.proc.poll() is None and b.proc.poll() is None
        assert "unexpected exception" not in a.log_text() + b.log_text()
