"""`make bench`'s harness (benchmarks/run.py) runs end to end on real daemons and writes a
JSON result with every floor, figure, ratio, goal and phase. No figure is judged here: speed
belongs in the benchmark, and a `--quick` run's numbers mean little."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ualinkd.fuse.mounts import fuse_mounts_at

pytestmark = pytest.mark.integration

RUN = Path(__file__).resolve().parents[2] / "benchmarks" / "run.py"
sys.path.insert(0, str(RUN.parent))

import run  # noqa: E402

MiB = 1 << 20


def _quick_run(args: list[str], timeout: float) -> str:
    """`run.py --quick --reps 1 <args>` with 50 samples a figure: its output, once it exited
    0 (a run past `timeout` is interrupted: its daemons stopped and its mounts gone)."""
    proc = subprocess.Popen(
        [sys.executable, str(RUN), "--quick", "--reps", "1", *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=dict(os.environ, BENCH_COUNT="50"))
    try:
        text, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)  # run.py's context managers stop daemons, unmount
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        pytest.fail(f"benchmarks/run.py {' '.join(args)} did not finish in {timeout:.0f} s")
    assert proc.returncode == 0, text
    return text


def test_quick_run_writes_every_key(tmp_path):
    out = tmp_path / "result.json"
    text = _quick_run(["--cycle", "--json", str(out)], 240)
    result = json.loads(out.read_text())
    assert set(result["placements"]) == {"pinned", "scheduler"}
    for p in result["placements"].values():
        assert set(p["floors"]) == {"fuse_echo_ioctl_ns", "fuse_echo_ioctl_idle_ns",
                                    "tcp_rtt_ns", "tcp_stream_bps", "import_floor_ns",
                                    "import_floor_back_to_back_ns", "fuse_relay_load_1m_ns",
                                    "fuse_relay_store_1m_ns"}
        assert set(p["figures"]) == {
            "export_ioctl_ns", "export_ioctl_idle_ns", "first_import_ns",
            "first_import_ioctl_ns", "first_import_open_ns", "first_import_fd_to_handle_ns",
            "load_4k_ns", "load_1m_ns", "store_1m_ns"}
        assert set(p["ratios"]) == {"export", "first_import", "load_4k", "load_1m", "store_1m"}
        # the ratios without a goal: the idle-server pair of ioctl_latency --idle; the 1 MiB
        # rows against the same work in C (fuse_relay.c), and that work against the stream
        assert set(p["info_ratios"]) == {"export_idle", "load_1m_relay", "store_1m_relay",
                                         "relay_load_1m_stream", "relay_store_1m_stream"}
        # the quick run's loads: all but the first of the mapping carried in C (the 1 MiB
        # ones spliced as their TCP pieces allow: test_data_plane*.py check that)
        for k in ("load_4k", "load_1m"):
            assert p["data_plane_share"][k]["median"] > 0.5, p["data_plane_share"]
        assert 0 <= p["spliced_share"]["median"] <= p["data_plane_share"]["load_1m"]["median"]
        for group in ("floors", "figures", "ratios", "info_ratios"):
            for v in p[group].values():
                assert 0 < v["min"] <= v["median"] <= v["max"], (group, v)
        assert set(p["server_cost"]) == {"echo", "export", "first_import", "load_4k",
                                         "load_1m", "store_1m", "relay_load_1m",
                                         "relay_store_1m"}
        for cost in p["server_cost"].values():
            assert cost["server_cpu_ns_per_op"] > 0 and cost["server_switches_per_op"] > 0
            assert cost["server_wait_ns_per_op"] >= 0
        for r in p["ratios"].values():
            assert r["goal"].split()[0] in ("<=", ">=") and isinstance(r["met"], bool)
    for name in ("pinned", "scheduler"):
        bd = result["breakdown"][name]
        # Every sample's edges were found: each import went NPA_REQ -> NPA_RSP (§5.2).
        assert bd["skipped"] == 0 and bd["samples"] > 0, bd
        assert bd["messages_per_cycle"]["importer"].get("NPA_REQ", 0) > 0, bd
        assert all(v is not None and v >= 0 for v in bd["median_ns"].values()), bd
    assert "goal" in text and "first import by phase" in text and str(out) in text
    assert text.count("1 MiB load / C FUSE relay") == 2, text  # (one per placement)
    assert text.count("C FUSE relay, 1 MiB store") == 2, text
    if "engine" in result:  # the remote copy beside the same work in C (tcp_floor relay)
        assert text.count("SDMA 16 MiB remote→host / C relay") == 2, text
    # --cycle: each step of the import cycle, in both placements, with and without gaps
    assert set(result["cycle"]) == {f"{p}, {g} ms gaps" for p in ("pinned", "scheduler")
                                    for g in (2, 0)}
    for steps in result["cycle"].values():
        assert list(steps)[3] == "import_ioctl" and len(steps) == 10, steps
        for f in steps.values():
            assert f["wall_ns"] > 0 and f["exporter_cpu_ns"] >= 0, f
        assert steps["import_ioctl"]["importer_cpu_ns"] > 0
    assert "the import cycle step by step" in text
    # the engine table (where libhsakmt is), with sdma_bench's own process_vm_readv floor
    if (RUN.parent / "build" / "sdma_bench").exists():
        assert set(result["engine"]) == {"pinned", "scheduler"}
    for e in result.get("engine", {}).values():
        for k in ("pvm_ns", "pvm2_ns", "pvm_floor", "pvm2_floor", "tcp_relay_ns",
                  "remote_over_relay", "relay_over_stream"):
            assert 0 < e[k]["min"] <= e[k]["median"] <= e[k]["max"], (k, e[k])


def test_data_rows_prints_the_1mib_rows_and_the_fetch_ceiling(tmp_path):
    """`run.py --data-rows`: only issue 34's two 1 MiB rows (remote load and store against
    the C TCP stream) in both placements, each with its latency and the daemons' CPU, and
    `tcp_floor fetch` (1 MiB answers fetched one at a time) beside them; then the same two
    against the same work in C (fuse_relay.c), with no goal; no figure judged."""
    text = _quick_run(["--data-rows"], 150)
    lines = [ln.strip() for ln in text.splitlines()]
    for name in ("pinned", "scheduler"):
        at = next(i for i, ln in enumerate(lines) if ln.startswith(f"{name}:"))
        rows = lines[at + 1:at + 7]
        assert rows[0].startswith("C TCP stream GiB/s"), rows
        assert rows[1].startswith("C client fetching 1 MiB answers / C TCP stream"), rows
        assert rows[2].startswith("1 MiB remote load / C TCP stream"), rows
        assert rows[3].startswith("1 MiB remote store / C TCP stream"), rows
        for row in rows[2:4]:
            assert "goal >= 0.5" in row and "daemons' CPU" in row, row
        assert rows[4].startswith("1 MiB load / C FUSE relay"), rows
        assert rows[5].startswith("1 MiB store / C FUSE relay"), rows
        for row in rows[4:]:
            assert "no goal" in row and "its own ratio to the stream" in row, row


def test_tcp_floor_fetch_times_whole_answers():
    """tcp_floor fetch <count> <size>: each sample is a request and its whole answer."""
    prog = RUN.parent / "build" / "tcp_floor"
    subprocess.run(["make", "-s", "-C", str(RUN.parent)], check=True, timeout=120)
    out = subprocess.run([str(prog), "fetch", "20", str(1 << 20), "2"], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    fields = dict(kv.split("=") for kv in out.split())
    assert fields["count"] == "20" and fields["size"] == str(1 << 20), out
    assert 0 < int(fields["median_ns"]) <= int(fields["p99_ns"]), out
    bad = subprocess.run([str(prog), "fetch", "20"], capture_output=True, timeout=10)
    assert bad.returncode == 2  # (a size is required)


def test_tcp_floor_relay_moves_every_byte_to_the_client():
    """tcp_floor relay <bytes> <reps>: the SDMA remote copy's work in C (exporter, importer,
    client). Every relay's pieces are read back from the client (each piece's first word,
    stamped anew before each relay) and the last relay's bytes all of them: a relay that
    writes nothing fails, so the floor cannot be fast by doing nothing. Ten pieces, the
    last one short: the 8-slot ring wraps; pinned to one CPU too (both importer threads,
    exporter and client on it: nothing waits for a CPU it cannot get)."""
    prog = RUN.parent / "build" / "tcp_floor"
    subprocess.run(["make", "-s", "-C", str(RUN.parent)], check=True, timeout=120)
    size = 9 * (1 << 20) + 4096
    one_cpu = ["taskset", "-c", str(min(os.sched_getaffinity(0)))]
    for prefix in ([], one_cpu):
        out = subprocess.run([*prefix, str(prog), "relay", str(size), "3"], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        fields = dict(kv.split("=") for kv in out.stdout.split())
        assert fields["reps"] == "3" and fields["bytes"] == str(size), out.stdout
        assert 0 < int(fields["min_ns"]) <= int(fields["relay_ns"]) <= int(fields["max_ns"])
    nowrite = subprocess.run([str(prog), "relay", str(size), "3"], capture_output=True,
                             text=True, timeout=60,
                             env=dict(os.environ, TCP_FLOOR_RELAY_NOWRITE="1"))
    assert nowrite.returncode == 1 and "relay_ns" not in nowrite.stdout, nowrite
    assert "piece 0 did not reach the client" in nowrite.stderr, nowrite.stderr
    for bad in (["relay", "12", "3"], ["relay", str(size)], ["relay", "0", "3"]):
        r = subprocess.run([str(prog), *bad], capture_output=True, timeout=10)
        assert r.returncode == 2, bad  # (a multiple of 8 bytes, at least one rep: usage)


def _memfd(pid: int, name: str) -> str:
    """The /proc path of process `pid`'s memfd called `name` (memfd_create's name)."""
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with_fd = f"/proc/{pid}/fd/{fd}"
        try:
            if os.readlink(with_fd).startswith(f"/memfd:{name} "):
                return with_fd
        except FileNotFoundError:
            continue
    raise AssertionError(f"process {pid} holds no memfd {name!r}")


def _kill_all(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_fuse_relay_moves_the_bytes_both_ways(tmp_path):
    """fuse_relay.c, the 1 MiB rows' floor, does their work, not less: a FUSE read of its
    file returns what is in the exporter process's memfd at that moment (bytes written there
    behind the server's back included: no copy kept in the server), and a FUSE write lands
    in that memfd, an unaligned 1 MiB across the 1 MiB boundary too. Its C client's loads
    and stores pass their own read-back check. Ranges past the end: a short read, ENOSPC.
    The exporter gone, a read fails with EIO and the server still unmounts cleanly. A
    watchdog kills both processes (the mount is then cleared as stale) if a read hangs."""
    subprocess.run(["make", "-s", "-C", str(RUN.parent)], check=True, timeout=120)
    size = 2 * MiB
    with run.fuse_relay(tmp_path, mib=2) as relay:
        assert len(relay.pids) == 2, relay.pids  # the FUSE server and its exporter
        server, exporter = relay.pids
        watchdog = threading.Timer(60, _kill_all, [relay.pids])
        watchdog.start()
        fd = os.open(relay.file, os.O_RDWR)
        mem = os.open(_memfd(exporter, "fuse_relay-bo"), os.O_RDWR)
        try:
            assert os.fstat(fd).st_size == size
            want = os.pread(mem, size, 0)
            assert len(want) == size and want.count(0) < size // 2
            assert os.pread(fd, MiB, 0) + os.pread(fd, MiB, MiB) == want
            data, at = os.urandom(MiB), MiB - 12345
            assert os.pwrite(fd, data, at) == MiB
            now = os.pread(mem, size, 0)
            assert now[at:at + MiB] == data
            assert now[:at] == want[:at] and now[at + MiB:] == want[at + MiB:]
            fresh = os.urandom(MiB)
            os.pwrite(mem, fresh, 4096)
            assert os.pread(fd, MiB, 4096) == fresh
            assert os.pread(fd, 100, size - 10) == now[size - 10:]
            assert os.pread(fd, 100, size) == b""
            with pytest.raises(OSError) as e:
                os.pwrite(fd, b"x", size)
            assert e.value.errno == errno.ENOSPC
            for op in ("load", "store"):
                out = subprocess.run([str(run.BUILD / "fuse_relay"), op, str(relay.file),
                                      str(MiB), "20"], capture_output=True, text=True,
                                     timeout=60)
                assert out.returncode == 0, out.stderr
                got = run.fields(out.stdout)
                assert got["size"] == MiB and got["count"] == 20, out.stdout
                assert 0 < got["median_ns"] <= got["p99_ns"], out.stdout
            os.kill(exporter, signal.SIGKILL)
            with pytest.raises(OSError) as e:
                os.pread(fd, MiB, 0)
            assert e.value.errno == errno.EIO
            assert relay.proc.poll() is None  # (the server still serves)
        finally:
            watchdog.cancel()
            os.close(mem)
            os.close(fd)
    assert relay.proc.returncode == 0
    assert not fuse_mounts_at(str(tmp_path / "relay"))
