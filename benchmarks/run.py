"""`make bench`: ualinkd's figures next to their C floors, measured in the same run and the
same CPU placement, with the ratios and the goals of issue 34 (issue 15's, with the export
and first-import goals it set: the first import stays in Python, and both goals hold in both
placements).

Every figure is taken by a C client (benchmarks/ioctl_latency.c, pod_latency.c) and every
floor is a C program doing the same physical work:

| figure (ualinkd)                             | floor (C)                           | goal   |
|----------------------------------------------|-------------------------------------|--------|
| export ioctl on an exported BO               | libfuse3 echo ioctl (fuse_echo.c)   | ≤ 2.5× |
| first import: ioctl + dma-buf open + FD→hdl  | 3 echo ioctls + 1 TCP round trip ¹  | ≤ 8×   |
| 4 KiB remote GPU load                        | 1 echo ioctl + 1 TCP round trip     | ≤ 3×   |
| 1 MiB remote GPU load, as throughput         | TCP loopback stream (tcp_floor.c)   | ≥ 0.5  |
| 1 MiB remote GPU store, as throughput        | TCP loopback stream (tcp_floor.c)   | ≥ 0.5  |
| 1 MiB remote GPU load and store              | the same work in C (fuse_relay.c ⁷) | printed|
| SDMA copy 64 MiB host→VRAM, VRAM→host ⁴      | C memcpy of 64 MiB, same process    | ≥ 0.5  |
| SDMA copy 16 MiB remote→host ⁴               | TCP loopback stream (tcp_floor.c)   | ≥ 0.5  |
| SDMA copy 16 MiB remote→host ⁴               | the same work in C (relay ⁶)        | printed|
| empty SDMA submission, doorbell→fence ⁴      | TCP round trip                      | printed|
| idle daemon CPU, 8 idle SDMA queues ⁵        | (none: % of one CPU)                | < 1%   |
| daemon CPU, one queue on a forever poll ⁵    | (none: % of one CPU)                | printed|

⁴ The GPU engine (issue 30): benchmarks/sdma_bench.c, an unmodified libhsakmt 5.2.3 client
through the shim on node 1 (an SDMA queue, BlitSdmaV4's packets, the CPU spinning on the
fence for 200 µs, then sleeping in hsaKmtWaitOnEvent until the TRAP, as ROCr's interrupt
signals wait);
the remote copy reads a 16 MiB VRAM BO node 0 exported (tests/c/fabric_sdma.c export). Its
own table, after the main one, with the same placements and repetitions. Beside the local
copies, what they do physically (the daemon moves a client's bytes with process_vm_readv /
writev, which pins each page: on this kind of machine 0.6-0.7 of a memcpy's speed on one
thread): sdma_bench's own process_vm_readv of 64 MiB of a child's memory, on one thread and
split over two, printed as the ceiling a copy can reach in that placement. Beside the remote
copy, its floor doing the same work in C (tcp_floor.c relay ⁶), its ratio printed (no goal),
and that floor's own ratio to the stream: where the same work in C stands against the
remote copy's goal (not a ceiling: a design better than the plain one may beat it).

⁵ tests/c/hsakmt_sdma.c's `idle` (8 SDMA queues, doorbells mapped, never rung) and `poll`
(one queue blocked on POLL_REGMEM with retry 0xFFF, ROCr's dependency poll) on node 1: the
daemon's CPU (every thread's schedstat) over `Counts.engine_cpu_seconds`, as a share of one
CPU, after a second's settling; the poll's release latency (CPU store → fence) beside it.
The tests (tests/integration/test_hsakmt_queues.py) only guard these against a spin.

⁶ The remote copy's work in C, three processes as in the emulator: an exporter answering
each 1 MiB request with sendfile from a memfd, an importer keeping 4 requests out,
receiving each answer into an 8-slot ring on one thread and writing runs of 4 into the
client's memory with process_vm_writev on another, and a client holding that memory. Two
copies of the bytes (socket → ring → client) where the C TCP stream makes one between two
processes; the goal stays against the stream.

⁷ The 1 MiB rows' work in C (benchmarks/fuse_relay.c): a single-threaded libfuse3 server
whose direct_io file forwards each 1 MiB read or write over loopback TCP to an exporter
process holding the bytes in a memfd (reads answered with sendfile, writes received into
its mapping), replying to FUSE from a buffer (ualinkd splices a load's answer instead); its
own client times pread/pwrite as pod_latency does, then checks a pattern written and read
back. Printed beside the rows, and its own ratio to the stream: where the plain way of
that work stands against the goal. Not a ceiling: ualinkd's load, which splices, beats it.

¹ In the first import's own pattern (tcp_floor.c import): each sample after the same 2 ms
idle gap as each first import (IMPORT_SETTLE_NS), the four round trips timed as one. On this
kind of machine the first FUSE round trip after such a gap takes about 4× a hot one, so the
back-to-back sum (3 hot echoes + 1 hot round trip) is not the same work; it is printed too.

The TCP floors (tcp_floor.c) run between two processes set up as the fabric's links are
(TCP_NODELAY, 4 MiB buffers, the pod's congestion control: PodConfig.tcp_congestion).

Two placements: everything (client, daemons or floor servers) pinned to one CPU, and left
to the scheduler. Each placement is measured `--reps` times, floor and figure interleaved in
each repetition so that a machine's drift moves both; a ratio is computed per repetition
(floor and figure of the same repetition) and the median and min–max of those are printed.

The first import is also broken down by phase in a second pod whose daemons run under
benchmarks/stamps.py (timestamps at the ioctl, message-send and message-receive edges;
they cost a few µs, so that pod's totals are not the figures above).

Beside each FUSE server's figure: what one operation costs the server processes (the echo
server; both daemons) in CPU time, time spent runnable but waiting for a CPU, and context
switches, from /proc/<pid>/task/*/schedstat and status. The waiting column says how much
of a latency a loaded machine added; the CPU column is the work itself (it moves too under
load, with caches shared with other work, but less than the latency does).

The result, with every repetition's numbers, is written as JSON (default
benchmarks/results/latest.json; `--json PATH`). `--quick` is a short run for smoke tests
(its figures mean little). `--extras` adds the older pod and data-plane tables (revoke →
RELEASE, imports/s, loads and stores by size) after the main table; `--profile` runs the
import and load workload once more with both daemons under cProfile and prints each one's
top functions (the stats files are kept beside the JSON); `--cycle` adds the whole import
cycle step by step (pod_latency cycle: each step's wall time and each daemon's CPU on it),
in both placements, with the first import's 2 ms idle gaps and with none.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
HERE = REPO / "benchmarks"
LIB_BUILD = REPO / "libualink_c" / "build"
BUILD = HERE / "build"
sys.path.insert(0, str(REPO / "tests" / "integration"))

from nodes import Node, start_node, wait_links_up  # noqa: E402

from ualinkd import sysfs  # noqa: E402
from ualinkd.cli.main import free_tcp_ports  # noqa: E402
from ualinkd.config import PodConfig  # noqa: E402
from ualinkd.fuse.lowlevel import clear_stale_mount, fuse_mounts_at  # noqa: E402

UALINK_CMD = "c018645b"  # DRM_IOCTL_AMDGPU_UALINK_HANDLE
KiB, MiB = 1 << 10, 1 << 20
# "Left to the scheduler" is every CPU this process may run on (a cpuset may hide some).
ALLOWED = os.sched_getaffinity(0)

GOALS = {  # name: (what, comparison, goal)
    "export": ("export ioctl / C FUSE echo", "<=", 2.5),
    "first_import": ("first import / (3 FUSE echoes + 1 TCP RTT)¹", "<=", 8.0),
    "load_4k": ("4 KiB remote load / (1 FUSE echo + 1 TCP RTT)", "<=", 3.0),
    "load_1m": ("1 MiB remote load throughput / C TCP stream", ">=", 0.5),
    "store_1m": ("1 MiB remote store throughput / C TCP stream", ">=", 0.5),
}
# Ratios printed without a goal: what they explain.
INFO = {
    "export_idle": "export ioctl / C echo, both after 2 ms idle ³",
    "load_1m_relay": "1 MiB load / C FUSE relay ⁷",
    "store_1m_relay": "1 MiB store / C FUSE relay ⁷",
    "relay_load_1m_stream": "C FUSE relay load / C TCP stream ⁷",
    "relay_store_1m_stream": "C FUSE relay store / C TCP stream ⁷",
}

# Phases of the first import, from the client's and the stamped daemons' clocks.
PHASES = [
    ("fuse_in", "FUSE in (client ioctl → daemon's handler)"),
    ("manager", "manager (handler → NPA_REQ queued)"),
    ("fabric_send", "fabric send (→ exporter decoded it)"),
    ("exporter", "exporter processing (→ NPA_RSP queued)"),
    ("reply_fabric", "reply over the fabric (→ importer decoded it)"),
    ("reply_importer", "importer's reply (→ ioctl answer built)"),
    ("fuse_out", "FUSE out (answer → client's ioctl returns)"),
    ("token_open", "token open (dmabuf/<token>)"),
    ("fd_to_handle", "FD_TO_HANDLE"),
]




class Counts:
    """How much each measurement does; `--quick` shrinks everything."""

    def __init__(self, quick: bool) -> None:
        base = int(os.environ.get("BENCH_COUNT", "200" if quick else "10000"))
        self.ioctls = base  # echo and export ioctls per repetition
        self.rtts = base  # TCP round trips
        self.imports = max(5, base // 50)  # first imports
        self.loads_4k = max(10, base // 5)
        self.loads_1m = max(3, base // 50)
        self.stream_bytes = (16 if quick else 256) * MiB
        self.stream_reps = 2 if quick else 3
        self.breakdown = max(5, base // 50)
        self.idle_ioctls = max(20, base // 40)  # each after the first import's 2 ms gap
        # the GPU engine's rows (sdma_bench): copies per repetition, empty submissions
        self.sdma_local_bytes = 64 * MiB
        self.sdma_remote_bytes = 16 * MiB
        self.sdma_copies = 2 if quick else 3
        self.sdma_fences = 50 if quick else 200
        self.engine_cpu_seconds = 2 if quick else 4  # idle / forever-poll CPU windows (s)

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


# -- processes and placement ---------------------------------------------------------------

def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of `pid` onto `cpus` (sched_setaffinity is per thread)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(int(tid), cpus)


def run_c(prog: Path, args: list[str], cpus: set[int] | None, timeout: float = 600) -> str:
    """Run a C program in a placement (None: the scheduler's); its stdout."""
    prefix = ["taskset", "-c", ",".join(map(str, sorted(cpus)))] if cpus else []
    r = subprocess.run([*prefix, str(prog), *args], capture_output=True, text=True,
                       timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{prog.name} {' '.join(args)}: exit {r.returncode}\n{r.stderr}")
    return r.stdout


def fields(line: str) -> dict[str, float]:
    return {k: float(v) for k, v in re.findall(r"(\w+)=([0-9.]+)", line)}


@contextlib.contextmanager
def fuse_server(mnt: Path, argv: list[str]) -> Iterator[subprocess.Popen[bytes]]:
    """A C FUSE floor (`argv`, mounting at `mnt`) once it mounted; stopped (SIGTERM, then
    SIGKILL) and its mount gone after, even a stale one."""
    mnt.mkdir()
    proc = subprocess.Popen(argv)
    try:
        deadline = time.monotonic() + 10
        while not fuse_mounts_at(str(mnt)):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{Path(argv[0]).name} did not mount")
            time.sleep(0.02)
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if fuse_mounts_at(str(mnt)):
            clear_stale_mount(mnt)


@contextlib.contextmanager
def fuse_echo(tmp: Path) -> Iterator[subprocess.Popen[bytes]]:
    with fuse_server(tmp / "echo", [str(LIB_BUILD / "fuse_echo"), str(tmp / "echo"),
                                    "-f"]) as proc:
        yield proc


class Relay:
    """A running `fuse_relay serve`: its file, and its two processes (the FUSE server and the
    exporter it forked)."""

    def __init__(self, proc: subprocess.Popen[bytes], file: Path) -> None:
        self.proc, self.file = proc, file
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        self.pids = [proc.pid, *map(int, children)]


@contextlib.contextmanager
def fuse_relay(tmp: Path, mib: int = 1) -> Iterator[Relay]:
    """The 1 MiB loads' and stores' floor (fuse_relay.c): <tmp>/relay/bo, `mib` MiB."""
    mnt = tmp / "relay"
    with fuse_server(mnt, [str(BUILD / "fuse_relay"), "serve", str(mnt), str(mib)]) as proc:
        yield Relay(proc, mnt / "bo")


@contextlib.contextmanager
def pod(tmp: Path, stamps: bool) -> Iterator[list[Node]]:
    """Two `ualinkd node` daemons on loopback TCP (the pod's defaults, cubic included);
    with `stamps`, each under benchmarks/stamps.py writing tmp/stamps-<node>.json at exit."""
    config = PodConfig.local(2, 1, free_tcp_ports(2))
    prefix = [sys.executable, str(HERE / "stamps.py")] if stamps else None
    started: list[Node] = []
    try:
        for n in config.nodes:
            if stamps:
                os.environ["UALINK_BENCH_STAMPS"] = str(tmp / f"stamps-{n.name}.json")
            try:
                started.append(start_node(tmp, config, n.name, prefix=prefix))
            finally:
                os.environ.pop("UALINK_BENCH_STAMPS", None)
        for node in started:
            wait_links_up(node)
        yield started
    finally:
        for node in started:
            if node.stop() != 0:
                print(f"warning: {node.log} ended with exit {node.proc.returncode}",
                      file=sys.stderr)
            if fuse_mounts_at(str(node.mount)):
                clear_stale_mount(node.mount)


# -- one repetition of each measurement ----------------------------------------------------

class ServerClock:
    """CPU time, run-queue wait and context switches of server processes (every thread),
    from /proc/<pid>/task/*/schedstat and status: what an operation costs the daemons
    whatever else the machine runs, and how much of its latency was spent waiting for a
    CPU."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        # (pid, tid) -> its last (CPU, wait, switches): a thread that ended keeps what it was
        # last seen with, so the sum never goes back (a worker thread ending inside a window
        # took its whole CPU out of a sum of the live threads, and the share came out < 0).
        self._seen: dict[tuple[int, str], tuple[int, int, int]] = {}
        self.start = self.read()

    def read(self) -> tuple[int, int, int]:
        for pid in self.pids:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                    on, queued, _ = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()
                    switches = 0
                    for line in Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines():
                        if "ctxt_switches:" in line:
                            switches += int(line.split()[1])
                    self._seen[(pid, tid)] = (int(on), int(queued), switches)
        cpu = sum(v[0] for v in self._seen.values())
        wait = sum(v[1] for v in self._seen.values())
        return cpu, wait, sum(v[2] for v in self._seen.values())

    def per_op(self, ops: int) -> dict[str, float]:
        end = self.read()
        cpu, wait, switches = (e - s for e, s in zip(end, self.start, strict=True))
        return {"server_cpu_ns_per_op": cpu / ops, "server_wait_ns_per_op": wait / ops,
                "server_switches_per_op": switches / ops}


WARMUP = 1000  # ioctl_latency's default warm-up calls


def measure(kind: str, c: Counts, cpus: set[int] | None, echo: subprocess.Popen[bytes] | None,
            echo_dev: Path, a: Node, b: Node, relay: Relay | None = None) -> dict[str, float]:
    """One measurement; every value in ns (or bytes/s for the stream), and for the FUSE
    servers' figures their cost per operation (ServerClock). `echo` may be None for the
    kinds that do not use fuse_echo (--data-rows), `relay` for those not fuse_relay's."""
    lat, pod_lat = LIB_BUILD / "ioctl_latency", BUILD / "pod_latency"
    pods = [a.proc.pid, b.proc.pid]
    if kind == "echo":
        assert echo is not None
        clock = ServerClock([echo.pid])
        out = fields(run_c(lat, [str(echo_dev), UALINK_CMD, str(c.ioctls)], cpus))
        return {**out, **clock.per_op(c.ioctls + WARMUP)}
    if kind == "export":
        clock = ServerClock(pods)
        out = fields(run_c(lat, ["--export", a.render(), str(c.ioctls)], cpus))
        return {**out, **clock.per_op(c.ioctls + WARMUP)}
    if kind in ("echo_idle", "export_idle"):
        # One request to a server that has been idle as long as the first import finds
        # both daemons: the cost of a cold wake-up, C against Python.
        warmup = str(max(2, c.idle_ioctls // 10))
        target = ([str(echo_dev), UALINK_CMD] if kind == "echo_idle"
                  else ["--export", a.render()])
        return fields(run_c(lat, ["--idle", *target, str(c.idle_ioctls), warmup], cpus))
    if kind == "tcp_rtt":
        return fields(run_c(BUILD / "tcp_floor", ["rtt", str(c.rtts)], cpus))
    if kind == "import_floor":
        return fields(run_c(BUILD / "tcp_floor", ["import", str(echo_dev), UALINK_CMD,
                                                   str(c.imports)], cpus))
    if kind == "tcp_stream":
        return fields(run_c(BUILD / "tcp_floor", ["stream", str(c.stream_bytes),
                                                   str(c.stream_reps)], cpus))
    if kind == "first_import":
        # Each sample also creates, exports and closes a BO and closes the import: the
        # daemons' cost per op is per such cycle.
        clock = ServerClock(pods)
        steps = import_samples(run_c(pod_lat, ["import", a.render(), b.render(),
                                               str(c.imports)], cpus))
        return {**{k: statistics.median(s[k] for s in steps)
                   for k in ("total_ns", "ioctl_ns", "open_ns", "fd_to_handle_ns")},
                **clock.per_op(c.imports + c.imports // 10 + 1)}
    if kind in ("relay_load_1m", "relay_store_1m"):
        # The same work as load_1m / store_1m in C: fuse_relay's client on its file, the
        # same count after the same warm-ups, then one 1 MiB store and load of its check.
        assert relay is not None
        clock = ServerClock(relay.pids)
        op = kind.split("_")[1]
        out = fields(run_c(BUILD / "fuse_relay", [op, str(relay.file), str(MiB),
                                                   str(c.loads_1m)], cpus))
        return {**out, **clock.per_op(c.loads_1m + c.loads_1m // 10 + 1 + 2)}
    if kind == "store_1m":
        clock = ServerClock(pods)
        out = fields(run_c(pod_lat, ["store", a.render(), b.render(), f"{MiB}:{c.loads_1m}"],
                           cpus))
        return {**out, **clock.per_op(c.loads_1m + c.loads_1m // 10 + 1)}
    if kind in ("load_4k", "load_1m"):
        size, count = (4 * KiB, c.loads_4k) if kind == "load_4k" else (MiB, c.loads_1m)
        clock = ServerClock(pods)
        before = data_plane(b)
        out = fields(run_c(pod_lat, ["load", a.render(), b.render(), f"{size}:{count}"], cpus))
        # The share of the loads the C data plane carried (fuse/dataplane.c; the rest went
        # through the daemons' Python and the link), and of those it spliced into FUSE.
        loads = count + count // 10 + 1
        after = data_plane(b)
        return {**out, **clock.per_op(loads),
                "data_plane_share": (after["fast_loads"] - before["fast_loads"]) / loads,
                "spliced_share": (after["spliced"] - before["spliced"]) / loads}
    raise ValueError(kind)


def data_plane(node: Node) -> dict[str, int]:
    """The importer's data-plane counters (sys/kernel/debug): fast_loads, the loads it
    carried; spliced, those whose answer it spliced into /dev/fuse."""
    return sysfs.parse_data_plane((node.mount / sysfs.DATA_PLANE_STATUS).read_text())


def import_samples(out: str) -> list[dict[str, float]]:
    steps = []
    for line in out.splitlines():
        f = fields(line)
        steps.append({**f, "total_ns": f["t3"] - f["t0"], "ioctl_ns": f["t1"] - f["t0"],
                      "open_ns": f["t2"] - f["t1"], "fd_to_handle_ns": f["t3"] - f["t2"]})
    return steps


def ratios(m: dict[str, dict[str, float]]) -> dict[str, float]:
    """The four goal ratios of one repetition (floor and figure from the same one)."""
    echo, rtt = m["echo"]["median_ns"], m["tcp_rtt"]["median_ns"]
    return {
        "export": m["export"]["median_ns"] / echo,
        "first_import": m["first_import"]["total_ns"] / m["import_floor"]["median_ns"],
        "load_4k": m["load_4k"]["median_ns"] / (echo + rtt),
        "load_1m": (MiB * 1e9 / m["load_1m"]["median_ns"]) / m["tcp_stream"]["median_bps"],
        "store_1m": (MiB * 1e9 / m["store_1m"]["median_ns"]) / m["tcp_stream"]["median_bps"],
        "export_idle": m["export_idle"]["median_ns"] / m["echo_idle"]["median_ns"],
        **relay_ratios(m),
    }


def relay_ratios(m: dict[str, dict[str, float]]) -> dict[str, float]:
    """The 1 MiB rows against the same work in C (fuse_relay.c), as throughputs (no goal),
    and that floor's own throughput over the stream: where the plain way of that work in C
    stands against the goal (not a ceiling: ualinkd's load splices where it copies)."""
    out = {}
    for k in ("load_1m", "store_1m"):
        relay_ns = m[f"relay_{k}"]["median_ns"]
        out[f"{k}_relay"] = relay_ns / m[k]["median_ns"]
        out[f"relay_{k}_stream"] = MiB * 1e9 / relay_ns / m["tcp_stream"]["median_bps"]
    return out


KINDS = ["echo", "export", "tcp_rtt", "import_floor", "first_import", "tcp_stream", "load_4k",
         "load_1m", "relay_load_1m", "store_1m", "relay_store_1m", "echo_idle", "export_idle"]
SERVED = {"echo": "C libfuse3 echo, per ioctl", "export": "ualinkd, per export ioctl",
          "first_import": "ualinkd, per import cycle", "load_4k": "ualinkd, per 4 KiB load",
          "load_1m": "ualinkd, per 1 MiB load", "store_1m": "ualinkd, per 1 MiB store",
          "relay_load_1m": "C FUSE relay, per 1 MiB load ⁷",
          "relay_store_1m": "C FUSE relay, per 1 MiB store ⁷"}


# --data-rows: the 1 MiB rows, their floor and the same work in C
DATA_ROWS = ["tcp_stream", "load_1m", "relay_load_1m", "store_1m", "relay_store_1m"]


def data_rows(reps: int, c: Counts, cpus: set[int] | None, a: Node, b: Node,
              relay: Relay) -> list[str]:
    """`--data-rows`: only the 1 MiB remote load and store against the C TCP stream (issue
    34's two data rows) and against the same work in C (fuse_relay.c, no goal), each
    repetition's floors and figures measured back to back."""
    for pid in (a.proc.pid, b.proc.pid, *relay.pids):
        pin(pid, cpus or ALLOWED)
    rows = []
    for _ in range(reps):
        m = {k: measure(k, c, cpus, None, Path(), a, b, relay) for k in DATA_ROWS}
        # (a C client fetching 1 MiB answers one request at a time: the ceiling of a load)
        fetch = fields(run_c(BUILD / "tcp_floor", ["fetch", str(c.loads_1m), str(MiB)], cpus))
        rows.append({"stream": m["tcp_stream"]["median_bps"],
                     "fetch": MiB * 1e9 / fetch["median_ns"] / m["tcp_stream"]["median_bps"],
                     **{k: MiB * 1e9 / m[k]["median_ns"] / m["tcp_stream"]["median_bps"]
                        for k in ("load_1m", "store_1m")},
                     **{f"{k}_us": m[k]["median_ns"] / 1e3 for k in ("load_1m", "store_1m")},
                     **{f"{k}_cpu_us": m[k]["server_cpu_ns_per_op"] / 1e3
                        for k in ("load_1m", "store_1m", "relay_load_1m", "relay_store_1m")},
                     **{f"relay_{k}_us": m[f"relay_{k}"]["median_ns"] / 1e3
                        for k in ("load_1m", "store_1m")},
                     **relay_ratios(m)})
    def col(k: str, scale: float = 1, fmt: str = "{:.2f}") -> str:
        return spread(summary([r[k] for r in rows]), scale, fmt)
    return [f"  C TCP stream GiB/s {col('stream', 1 << 30)}",
            f"  {'C client fetching 1 MiB answers / C TCP stream':<46} {col('fetch')}  "
            "(no goal: the answers' copies in series)",
            *(f"  {what:<46} {col(k)}  (goal >= 0.5; {col(k + '_us', 1, '{:.0f}')} µs, "
              f"daemons' CPU {col(k + '_cpu_us', 1, '{:.0f}')} µs per op)"
              for k, what in (("load_1m", "1 MiB remote load / C TCP stream"),
                              ("store_1m", "1 MiB remote store / C TCP stream"))),
            *(f"  {what:<46} {col(k + '_relay')}  (no goal; the relay "
              f"{col('relay_' + k + '_us', 1, '{:.0f}')} µs, its CPU "
              f"{col('relay_' + k + '_cpu_us', 1, '{:.0f}')} µs per op, its own ratio to the "
              f"stream {col('relay_' + k + '_stream')})"
              for k, what in (("load_1m", "1 MiB load / C FUSE relay"),
                              ("store_1m", "1 MiB store / C FUSE relay")))]


def placement_runs(reps: int, c: Counts, cpus: set[int] | None, echo: subprocess.Popen[bytes],
                   echo_dev: Path, a: Node, b: Node, relay: Relay) -> list[dict[str, Any]]:
    all_cpus = ALLOWED
    for pid in (echo.pid, a.proc.pid, b.proc.pid, *relay.pids):
        pin(pid, cpus or all_cpus)
    runs = []
    for _ in range(reps):
        m = {k: measure(k, c, cpus, echo, echo_dev, a, b, relay) for k in KINDS}
        runs.append({"measured": m, "ratios": ratios(m)})
    return runs


# -- the first import, phase by phase ------------------------------------------------------

class Stamps:
    """One daemon's stamps (benchmarks/stamps.py), by kind and MSG type."""

    def __init__(self, path: Path) -> None:
        self.times: dict[tuple[str, int], list[int]] = {}
        for ns, kind, typ in sorted(json.loads(path.read_text())):
            self.times.setdefault((kind, typ), []).append(ns)

    def first(self, kind: str, lo: float, hi: float, typ: int = 0) -> int | None:
        xs = self.times.get((kind, typ), [])
        i = bisect.bisect_left(xs, lo)
        return xs[i] if i < len(xs) and xs[i] <= hi else None

    def last(self, kind: str, lo: float, hi: float, typ: int = 0) -> int | None:
        xs = self.times.get((kind, typ), [])
        i = bisect.bisect_right(xs, hi) - 1
        return xs[i] if i >= 0 and xs[i] >= lo else None

    def count(self, kind: str, lo: float, hi: float) -> dict[int, int]:
        """MSGs of each type stamped `kind` in [lo, hi)."""
        out = {}
        for (k, typ), xs in self.times.items():
            if k == kind and (n := bisect.bisect_left(xs, hi) - bisect.bisect_left(xs, lo)):
                out[typ] = n
        return out


def phases(samples: list[dict[str, float]], exporter: Stamps,
           importer: Stamps) -> tuple[dict[str, list[float]], dict[str, int]]:
    """Per sample (the client's t0..t3): the importer's ioctl entry, its NPA_REQ queued, the
    exporter's NPA_REQ decoded and its NPA_RSP queued, the importer's NPA_RSP decoded, the
    importer's ioctl answer. MSGs of other types in the same window (a revoke of the
    previous sample's BO going out late, a HELLO) are counted, not taken for an edge; a
    sample with an edge missing (an NPA_FAIL instead of NPA_RSP) is skipped and counted."""
    from ualinkd.ualink.protocol import MsgType

    req_t, rsp_t = MsgType.NPA_REQ, MsgType.NPA_RSP
    out: dict[str, list[float]] = {k: [] for k, _ in PHASES}
    out["total"] = []
    seen = {"samples": len(samples), "skipped": 0, "other_msgs": 0}
    for s in samples:
        t0, t1, t2, t3 = s["t0"], s["t1"], s["t2"], s["t3"]
        a = importer.first("ioctl_in", t0, t1)
        req = a and importer.first("msg_out", a, t1, req_t)
        got = req and exporter.first("msg_in", req, t1, req_t)
        rsp = got and exporter.first("msg_out", got, t1, rsp_t)
        back = rsp and importer.first("msg_in", rsp, t1, rsp_t)
        done = back and importer.last("ioctl_out", back, t1)
        for st in (importer, exporter):
            seen["other_msgs"] += sum(n for typ, n in st.count("msg_out", t0, t1).items()
                                      if typ not in (req_t, rsp_t))
        if not (a and req and got and rsp and back and done):
            seen["skipped"] += 1
            continue
        for k, v in zip([k for k, _ in PHASES],
                        [a - t0, req - a, got - req, rsp - got, back - rsp, done - back,
                         t1 - done, t2 - t1, t3 - t2], strict=True):
            out[k].append(v)
        out["total"].append(t3 - t0)
    return out, seen


def breakdown(tmp: Path, c: Counts, cpu: int) -> dict[str, Any]:
    result: dict[str, Any] = {}
    samples: dict[str, list[dict[str, float]]] = {}
    with pod(tmp, stamps=True) as (a, b):
        for name, cpus in (("pinned", {cpu}), ("scheduler", None)):
            for node in (a, b):
                pin(node.proc.pid, cpus or ALLOWED)
            samples[name] = import_samples(run_c(
                BUILD / "pod_latency", ["import", a.render(), b.render(), str(c.breakdown)],
                cpus))
    exporter, importer = Stamps(tmp / "stamps-node0.json"), Stamps(tmp / "stamps-node1.json")
    for name, ss in samples.items():
        per, seen = phases(ss, exporter, importer)
        result[name] = {"median_ns": {k: statistics.median(v) if v else None
                                      for k, v in per.items()}, **seen,
                        "messages_per_cycle": messages_per_cycle(ss, exporter, importer)}
    return result


def messages_per_cycle(samples: list[dict[str, float]], exporter: Stamps,
                       importer: Stamps) -> dict[str, dict[str, float]]:
    """MSGs each daemon sent per sample cycle (import, then the closes and the next BO's
    create and export: from one sample's t0 to the next), by type (§5.2); each also costs
    an ACK the other way."""
    from ualinkd.ualink.protocol import MsgType

    if len(samples) < 2:
        return {}
    lo, hi, n = samples[0]["t0"], samples[-1]["t0"], len(samples) - 1
    names = {int(t): t.name for t in MsgType}
    return {role: {names.get(typ, str(typ)): k / n
                   for typ, k in st.count("msg_out", lo, hi).items()}
            for role, st in (("exporter", exporter), ("importer", importer))}


# -- where the daemons' time goes --------------------------------------------------------

def cycle(a: Node, b: Node, c: Counts, cpu: int) -> dict[str, dict[str, dict[str, float]]]:
    """The whole import cycle step by step (pod_latency cycle), in both placements, with
    the first import's 2 ms idle gaps and with none: each step's wall time and what each
    daemon spent on it in CPU, means in ns by placement and gap."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for name, cpus in (("pinned", {cpu}), ("scheduler", None)):
        for pid in (a.proc.pid, b.proc.pid):
            pin(pid, cpus or ALLOWED)
        for gap_ms in (2, 0):
            text = run_c(BUILD / "pod_latency", [
                "cycle", a.render(), b.render(), str(c.imports), str(gap_ms * 1_000_000),
                str(a.proc.pid), str(b.proc.pid)], cpus)
            steps = {}
            for line in text.splitlines():
                step = line.split()[0].removeprefix("step=")
                steps[step] = fields(line)
            out[f"{name}, {gap_ms} ms gaps"] = steps
    return out


def cycle_table(result: dict[str, dict[str, dict[str, float]]]) -> list[str]:
    lines = ["", "the import cycle step by step (pod_latency cycle; mean µs per cycle: wall, "
                 "then each daemon's CPU)"]
    for where, steps in result.items():
        lines.append(f"{where:<36}{'wall':>10}{'exporter':>10}{'importer':>10}")
        for step, f in steps.items():
            lines.append(f"  {step:<34}{f['wall_ns'] / 1e3:>10.1f}"
                         f"{f['exporter_cpu_ns'] / 1e3:>10.1f}{f['importer_cpu_ns'] / 1e3:>10.1f}")
    return lines


def profile(tmp: Path, c: Counts, out_dir: Path) -> list[str]:
    """The first-import cycle and the 4 KiB and 1 MiB loads once more, in a pod whose
    daemons run under cProfile ($UALINKD_PROFILE, ualinkd/cli/main.py); the stats files
    go to out_dir/profile.<node> (pstats) and the top functions of each are printed."""
    import pstats

    out_dir.mkdir(parents=True, exist_ok=True)
    os.environ["UALINKD_PROFILE"] = str(out_dir / "profile")
    try:
        with pod(tmp, stamps=False) as (a, b):
            os.environ.pop("UALINKD_PROFILE")
            run_c(BUILD / "pod_latency", ["import", a.render(), b.render(), str(c.imports)],
                  None)
            run_c(BUILD / "pod_latency", ["load", a.render(), b.render(),
                                          f"{4 * KiB}:{c.loads_4k}", f"{MiB}:{c.loads_1m}"],
                  None)
    finally:
        os.environ.pop("UALINKD_PROFILE", None)
    lines = []
    for role, name in (("exporter", "node0"), ("importer", "node1")):
        import io

        buf = io.StringIO()
        stats = pstats.Stats(str(out_dir / f"profile.{name}"), stream=buf)
        stats.sort_stats("tottime").print_stats(15)
        lines += ["", f"cProfile of the {role} ({out_dir / f'profile.{name}'}), by own time:",
                  *[ln for ln in buf.getvalue().splitlines()
                    if ln.strip() and not ln.startswith(("   Ordered", "   List"))][1:]]
    return lines


# -- report --------------------------------------------------------------------------------

def summary(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    def pick(kind: str, key: str) -> dict[str, float]:
        return summary([r["measured"][kind][key] for r in runs])

    out = {
        "floors": {
            "fuse_echo_ioctl_ns": pick("echo", "median_ns"),
            "fuse_echo_ioctl_idle_ns": pick("echo_idle", "median_ns"),
            "tcp_rtt_ns": pick("tcp_rtt", "median_ns"),
            "tcp_stream_bps": pick("tcp_stream", "median_bps"),
            "import_floor_ns": pick("import_floor", "median_ns"),
            "import_floor_back_to_back_ns": summary(
                [3 * r["measured"]["echo"]["median_ns"] + r["measured"]["tcp_rtt"]["median_ns"]
                 for r in runs]),
            "fuse_relay_load_1m_ns": pick("relay_load_1m", "median_ns"),
            "fuse_relay_store_1m_ns": pick("relay_store_1m", "median_ns"),
        },
        "figures": {
            "export_ioctl_ns": pick("export", "median_ns"),
            "export_ioctl_idle_ns": pick("export_idle", "median_ns"),
            "first_import_ns": pick("first_import", "total_ns"),
            "first_import_ioctl_ns": pick("first_import", "ioctl_ns"),
            "first_import_open_ns": pick("first_import", "open_ns"),
            "first_import_fd_to_handle_ns": pick("first_import", "fd_to_handle_ns"),
            "load_4k_ns": pick("load_4k", "median_ns"),
            "load_1m_ns": pick("load_1m", "median_ns"),
            "store_1m_ns": pick("store_1m", "median_ns"),
        },
        # the share of the loads fuse/dataplane.c carried (the first of a mapping is Python's)
        "data_plane_share": {k: pick(k, "data_plane_share") for k in ("load_4k", "load_1m")},
        "spliced_share": pick("load_1m", "spliced_share"),
        "server_cost": {k: {f: pick(k, f)["median"] for f in (
            "server_cpu_ns_per_op", "server_wait_ns_per_op", "server_switches_per_op")}
            for k in SERVED},
        "ratios": {},
    }
    for k, (what, cmp, goal) in GOALS.items():
        s = summary([r["ratios"][k] for r in runs])
        worst = s["max"] if cmp == "<=" else s["min"]
        out["ratios"][k] = {**s, "what": what, "goal": f"{cmp} {goal}",
                            "met": s["median"] <= goal if cmp == "<=" else s["median"] >= goal,
                            "met_every_run": worst <= goal if cmp == "<=" else worst >= goal}
    out["info_ratios"] = {k: {**summary([r["ratios"][k] for r in runs]), "what": what}
                          for k, what in INFO.items()}
    return out


def spread(s: dict[str, float], scale: float, fmt: str = "{:.1f}") -> str:
    med, lo, hi = (fmt.format(s[k] / scale) for k in ("median", "min", "max"))
    return f"{med} [{lo}–{hi}]"


def table(result: dict[str, Any]) -> list[str]:
    lines = [f"ualinkd against C floors, {result['reps']} repetition(s) per placement: "
             "median [min–max] of the repetitions' medians"]
    w = 46
    for name, p in result["placements"].items():
        where = (f"pinned: client and servers on CPU {result['cpu']}" if name == "pinned"
                 else "left to the scheduler")
        f, g = p["floors"], p["figures"]
        lines += ["", f"== {where} ==",
                  f"{'floors (C)':<{w}}{'µs, or GiB/s':>26}",
                  f"{'  libfuse3 echo ioctl (24 bytes)':<{w}}"
                  f"{spread(f['fuse_echo_ioctl_ns'], 1e3):>26}",
                  f"{'    the same, after 2 ms idle ³':<{w}}"
                  f"{spread(f['fuse_echo_ioctl_idle_ns'], 1e3):>26}",
                  f"{'  TCP round trip (64 bytes, loopback)':<{w}}"
                  f"{spread(f['tcp_rtt_ns'], 1e3):>26}",
                  f"{'  TCP stream GiB/s (' + result['congestion'] + ')':<{w}}"
                  f"{spread(f['tcp_stream_bps'], 1 << 30, '{:.2f}'):>26}",
                  f"{'  3 echoes + 1 round trip, after 2 ms idle ¹':<{w}}"
                  f"{spread(f['import_floor_ns'], 1e3):>26}",
                  f"{'    (the same back to back, hot)':<{w}}"
                  f"{spread(f['import_floor_back_to_back_ns'], 1e3):>26}",
                  f"{'  C FUSE relay, 1 MiB load ⁷':<{w}}"
                  f"{spread(f['fuse_relay_load_1m_ns'], 1e3):>26}",
                  f"{'  C FUSE relay, 1 MiB store ⁷':<{w}}"
                  f"{spread(f['fuse_relay_store_1m_ns'], 1e3):>26}",
                  f"{'ualinkd (C client)':<{w}}",
                  f"{'  export ioctl (already exported BO)':<{w}}"
                  f"{spread(g['export_ioctl_ns'], 1e3):>26}",
                  f"{'    the same, after 2 ms idle ³':<{w}}"
                  f"{spread(g['export_ioctl_idle_ns'], 1e3):>26}",
                  f"{'  first import (3 steps below)':<{w}}"
                  f"{spread(g['first_import_ns'], 1e3):>26}",
                  f"{'    import ioctl':<{w}}{spread(g['first_import_ioctl_ns'], 1e3):>26}",
                  f"{'    dma-buf token open':<{w}}{spread(g['first_import_open_ns'], 1e3):>26}",
                  f"{'    PRIME_FD_TO_HANDLE':<{w}}"
                  f"{spread(g['first_import_fd_to_handle_ns'], 1e3):>26}",
                  f"{'  4 KiB remote GPU load':<{w}}{spread(g['load_4k_ns'], 1e3):>26}",
                  f"{'    share the C data plane carried ²':<{w}}"
                  f"{spread(p['data_plane_share']['load_4k'], 0.01, '{:.0f}%'):>26}",
                  f"{'  1 MiB remote GPU load':<{w}}{spread(g['load_1m_ns'], 1e3):>26}",
                  f"{'    share the C data plane carried ²':<{w}}"
                  f"{spread(p['data_plane_share']['load_1m'], 0.01, '{:.0f}%'):>26}",
                  f"{'    share spliced into /dev/fuse':<{w}}"
                  f"{spread(p['spliced_share'], 0.01, '{:.0f}%'):>26}",
                  f"{'  1 MiB remote GPU store':<{w}}{spread(g['store_1m_ns'], 1e3):>26}",
                  f"{'ratios (per repetition)':<{w}}{'ratio':>26}{'goal':>9}{'  met':<6}"]
        for r in p["ratios"].values():
            met = "yes" if r["met"] else "NO"
            lines.append(f"{'  ' + r['what']:<{w}}{spread(r, 1, '{:.2f}'):>26}"
                         f"{r['goal']:>9}  {met}")
        for r in p["info_ratios"].values():
            lines.append(f"{'  ' + r['what']:<{w}}{spread(r, 1, '{:.2f}'):>26}{'none':>9}")
        lines.append(f"{'server processes (all threads), median':<{w}}{'CPU µs':>10}"
                     f"{'waiting µs':>12}{'switches':>10}")
        for k, what in SERVED.items():
            sc = p["server_cost"][k]
            lines.append(f"{'  ' + what:<{w}}{sc['server_cpu_ns_per_op'] / 1e3:>10.1f}"
                         f"{sc['server_wait_ns_per_op'] / 1e3:>12.1f}"
                         f"{sc['server_switches_per_op']:>10.1f}")
    lines += ["", "¹ the first import's floor is timed in its own pattern: each sample after the "
                  "same 2 ms idle gap", "  as each first import (the back-to-back sum below it is "
                  "not the same work)",
              "² loads that fuse/dataplane.c carried (its debugfs counter); the rest, the "
              "first of a mapping", "  among them, went through the daemons' Python and the "
              "link",
              "³ one request to a server idle for the first import's gap, and nothing else: "
              "the price of", "  waking a Python daemon against a C one. A first import "
              "wakes two idle daemons (the importer", "  for the ioctl, the exporter for the "
              "NPA_REQ), where its floor wakes two idle C servers",
              *RELAY_FUSE_NOTE.splitlines()]
    bd = result.get("breakdown")
    if bd:
        lines += ["", "first import by phase (a second pod, daemons under benchmarks/stamps.py; "
                      "median µs)",
                  f"{'phase':<{w}}" + "".join(f"{n:>12}" for n in bd)]
        for k, label in [*PHASES, ("total", "total (instrumented)")]:
            lines.append(f"{'  ' + label:<{w}}" + "".join(
                f"{v['median_ns'][k] / 1e3:>12.1f}" if v["median_ns"][k] is not None
                else f"{'-':>12}" for v in bd.values()))
        for n, v in bd.items():
            for role, counts in v["messages_per_cycle"].items():
                lines.append(f"  {n}: MSGs the {role} sent per import cycle (each ACKed): " +
                             ", ".join(f"{k} {x:.1f}" for k, x in sorted(counts.items())))
            if v["skipped"]:
                lines.append(f"  {n}: {v['skipped']} of {v['samples']} samples lacked a stamp")
            if v["other_msgs"]:
                lines.append(f"  {n}: {v['other_msgs']} other MSGs went out during the "
                             "samples' import ioctls (not counted as their edges)")
    return lines


RELAY_FUSE_NOTE = """\
⁷ C FUSE relay (fuse_relay.c): the 1 MiB rows' work in C, a single-threaded libfuse3 server
  forwarding each 1 MiB read or write of its direct_io file over loopback TCP to an exporter
  process (reads answered by sendfile from a memfd, writes received into it), timed by the
  same pread/pwrite client loop; it replies to FUSE from a buffer where ualinkd splices a
  load's answer (so a load of ualinkd's can beat it). No goal: the goals stay against the
  stream; its own ratio to the stream says where the plain way of this work stands."""


# -- the GPU engine (SDMA) against its floors -----------------------------------------------

ENGINE_GOALS = {  # name: (what, goal as a ratio >=)
    "sdma_h2d": ("SDMA 64 MiB host→VRAM / C memcpy", 0.5),
    "sdma_d2h": ("SDMA 64 MiB VRAM→host / C memcpy", 0.5),
    "sdma_remote": ("SDMA 16 MiB remote→host / C TCP stream", 0.5),
}
# the engine table's word on the remote copy's second floor (tcp_floor.c relay)
RELAY_NOTE = """\
⁶ C relay (tcp_floor.c relay): the remote copy's work in C, one exporter, one importer and
  one client process, as in the emulator: the exporter sendfile()s 1 MiB pieces of a memfd,
  the importer keeps 4 requests out, receives each answer into an 8-slot ring on one thread
  and writes runs of 4 into the client's memory by process_vm_writev on another: two copies
  of the bytes, where the C TCP stream makes one between two processes. The goal stays
  against the stream; the copy's ratio to the relay says how far the emulator is from the
  same work in C, and the relay's own to the stream where that work done the plain way in C
  stands against the goal (not a ceiling: a better design may beat it)."""
IDLE_CPU_GOAL = 0.01  # of one CPU: issue 30's idle node with 8 idle queues


def shimmed_env(node: Node) -> dict[str, str]:
    """An unmodified libhsakmt client's environment: the shim, the node's dri directory."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LD_", "HSA"))}
    env.update(LD_PRELOAD=str(LIB_BUILD / "libualink_shim.so"),
               UALINK_DRI_DIR=str(node.mount / "dri"))
    return env


def run_shimmed(node: Node, args: list[str], cpus: set[int] | None) -> dict[str, float]:
    prefix = ["taskset", "-c", ",".join(map(str, sorted(cpus)))] if cpus else []
    r = subprocess.run([*prefix, str(BUILD / "sdma_bench"), *args], env=shimmed_env(node),
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"sdma_bench {' '.join(args)}: exit {r.returncode}\n{r.stderr}")
    return fields(r.stdout)


@contextlib.contextmanager
def exported_bo(a: Node, size: int) -> Iterator[tuple[str, str]]:
    """A VRAM BO of `size` exported on node `a` (fabric_sdma export), held while in use."""
    proc = subprocess.Popen([str(LIB_BUILD / "fabric_sdma"), "export", str(size)],
                            env=shimmed_env(a), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        kv = dict(w.split("=", 1) for w in line.split() if "=" in w)
        if "lo" not in kv:
            raise RuntimeError(f"fabric_sdma export: {line!r}")
        yield kv["lo"], kv["hi"]
    finally:
        proc.communicate("", timeout=60)


def engine_cpu(node: Node, mode: str, c: Counts, cpus: set[int] | None) -> dict[str, float]:
    """The daemon's CPU (all threads, schedstat) as a share of one CPU while
    tests/c/hsakmt_sdma.c `mode` holds its queues (`idle`: 8 idle SDMA queues; `poll`: one
    queue blocked on a forever POLL_REGMEM), over c.engine_cpu_seconds after 1 s of
    settling; for `poll`, also the release latency the client prints (CPU store → fence)."""
    import threading

    prefix = ["taskset", "-c", ",".join(map(str, sorted(cpus)))] if cpus else []
    ready = "ok idle_queues" if mode == "idle" else "ok poll_pending"
    proc = subprocess.Popen([*prefix, str(LIB_BUILD / "hsakmt_sdma"), mode],
                            env=shimmed_env(node), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    watchdog = threading.Timer(120, proc.kill)
    watchdog.start()
    try:
        assert proc.stdout is not None and proc.stdin is not None
        out = ""
        while ready not in out:
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"hsakmt_sdma {mode}: no {ready!r}:\n{out}")
            out += line
        time.sleep(1)  # past the back-off after the creations (and the young poll)
        clock, t0 = ServerClock([node.proc.pid]), time.monotonic()
        while time.monotonic() - t0 < c.engine_cpu_seconds:
            time.sleep(0.1)
            clock.read()  # (a worker thread that ends keeps the CPU it was last seen with)
        cpu = clock.read()[0] - clock.start[0]
        share = cpu / 1e9 / (time.monotonic() - t0)
        rest, _ = proc.communicate("\n", timeout=60)
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"hsakmt_sdma {mode}: exit {proc.returncode}\n{out}{rest}")
    got = {"cpu_share": share}
    if mode == "poll":
        m = re.search(r"poll_release latency_us=(\d+)", rest)
        if m is None:
            raise RuntimeError(f"hsakmt_sdma poll: no release latency:\n{rest}")
        got["release_ns"] = float(m[1]) * 1e3
    return got


def engine_runs(reps: int, c: Counts, cpus: set[int] | None, a: Node, b: Node,
                handle: tuple[str, str]) -> list[dict[str, Any]]:
    """Per repetition: the SDMA figures on node b and their floors, interleaved."""
    for pid in (a.proc.pid, b.proc.pid):
        pin(pid, cpus or ALLOWED)
    runs = []
    for _ in range(reps):
        local = run_shimmed(b, ["local", str(c.sdma_local_bytes), str(c.sdma_copies)], cpus)
        stream = fields(run_c(BUILD / "tcp_floor", ["stream", str(c.stream_bytes),
                                                     str(c.stream_reps)], cpus))
        remote = run_shimmed(b, ["remote", *handle, str(c.sdma_remote_bytes),
                                 str(c.sdma_copies)], cpus)
        relay = fields(run_c(BUILD / "tcp_floor", ["relay", str(c.sdma_remote_bytes),
                                                    str(c.sdma_copies)], cpus))
        fence = run_shimmed(b, ["fence", str(c.sdma_fences)], cpus)
        rtt = fields(run_c(BUILD / "tcp_floor", ["rtt", str(c.rtts)], cpus))
        idle = engine_cpu(b, "idle", c, cpus)
        poll = engine_cpu(b, "poll", c, cpus)
        measured = {"local": local, "remote": remote, "fence": fence, "tcp_stream": stream,
                    "tcp_relay": relay, "tcp_rtt": rtt, "idle": idle, "poll": poll}
        runs.append({"measured": measured, "ratios": engine_ratios(measured)})
    return runs


def engine_ratios(m: dict[str, dict[str, float]]) -> dict[str, float]:
    """One repetition's ratios from its measurements (the C programs' fields)."""
    local, remote = m["local"], m["remote"]
    remote_bps = remote["bytes"] * 1e9 / remote["remote_ns"]
    relay_bps = m["tcp_relay"]["bytes"] * 1e9 / m["tcp_relay"]["relay_ns"]
    return {"sdma_h2d": local["memcpy_ns"] / local["h2d_ns"],
            "sdma_d2h": local["memcpy_ns"] / local["d2h_ns"],
            "sdma_remote": remote_bps / m["tcp_stream"]["median_bps"],
            # against the same work done in C (no goal: printed beside it), and that work's
            # own ratio to the stream: where the plain way of that work stands against the goal
            "remote_over_relay": remote_bps / relay_bps,
            "relay_over_stream": relay_bps / m["tcp_stream"]["median_bps"],
            "fence_over_rtt": m["fence"]["fence_ns"] / m["tcp_rtt"]["median_ns"],
            # the ceiling of a copy done by process_vm_readv: on one thread, on two
            "pvm_floor": local["memcpy_ns"] / local["pvm_ns"],
            "pvm2_floor": local["memcpy_ns"] / local["pvm2_ns"]}


def engine_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    def pick(kind: str, key: str) -> dict[str, float]:
        return summary([r["measured"][kind][key] for r in runs])

    out: dict[str, Any] = {
        "sdma_h2d_ns": pick("local", "h2d_ns"), "sdma_d2h_ns": pick("local", "d2h_ns"),
        "memcpy_ns": pick("local", "memcpy_ns"), "sdma_remote_ns": pick("remote", "remote_ns"),
        "pvm_ns": pick("local", "pvm_ns"), "pvm2_ns": pick("local", "pvm2_ns"),
        "pvm_floor": summary([r["ratios"]["pvm_floor"] for r in runs]),
        "pvm2_floor": summary([r["ratios"]["pvm2_floor"] for r in runs]),
        "tcp_stream_bps": pick("tcp_stream", "median_bps"),
        "tcp_relay_ns": pick("tcp_relay", "relay_ns"),
        "remote_over_relay": summary([r["ratios"]["remote_over_relay"] for r in runs]),
        "relay_over_stream": summary([r["ratios"]["relay_over_stream"] for r in runs]),
        "fence_ns": pick("fence", "fence_ns"), "tcp_rtt_ns": pick("tcp_rtt", "median_ns"),
        "fence_over_rtt": summary([r["ratios"]["fence_over_rtt"] for r in runs]),
        "idle_cpu_share": pick("idle", "cpu_share"), "poll_cpu_share": pick("poll", "cpu_share"),
        "poll_release_ns": pick("poll", "release_ns"),
        "ratios": {}}
    for k, (what, goal) in ENGINE_GOALS.items():
        s = summary([r["ratios"][k] for r in runs])
        out["ratios"][k] = {**s, "what": what, "goal": f">= {goal}", "met": s["median"] >= goal}
    idle = out["idle_cpu_share"]
    out["idle_cpu"] = {**idle, "what": "idle daemon CPU, 8 idle SDMA queues ⁵",
                       "goal": f"< {IDLE_CPU_GOAL:.0%}", "met": idle["median"] < IDLE_CPU_GOAL}
    return out


def engine_table(result: dict[str, Any]) -> list[str]:
    w = 46
    lines = ["", "the GPU engine (SDMA, benchmarks/sdma_bench.c through the shim) against C "
                 "floors ⁴"]
    for name, e in result["engine"].items():
        where = (f"pinned: client and daemons on CPU {result['cpu']}" if name == "pinned"
                 else "left to the scheduler")
        gib = 1 << 30
        lines += ["", f"== {where} ==", f"{'':<{w}}{'ms, µs or GiB/s':>26}",
                  f"{'  C memcpy 64 MiB (ms)':<{w}}{spread(e['memcpy_ns'], 1e6, '{:.2f}'):>26}",
                  f"{'  SDMA 64 MiB host→VRAM (ms)':<{w}}"
                  f"{spread(e['sdma_h2d_ns'], 1e6, '{:.2f}'):>26}",
                  f"{'  SDMA 64 MiB VRAM→host (ms)':<{w}}"
                  f"{spread(e['sdma_d2h_ns'], 1e6, '{:.2f}'):>26}",
                  f"{'  C process_vm_readv 64 MiB, 1 thread (ms)':<{w}}"
                  f"{spread(e['pvm_ns'], 1e6, '{:.2f}'):>26}",
                  f"{'  C process_vm_readv 64 MiB, 2 threads (ms)':<{w}}"
                  f"{spread(e['pvm2_ns'], 1e6, '{:.2f}'):>26}",
                  f"{'  C TCP stream (GiB/s)':<{w}}"
                  f"{spread(e['tcp_stream_bps'], gib, '{:.2f}'):>26}",
                  f"{'  SDMA 16 MiB remote→host (ms)':<{w}}"
                  f"{spread(e['sdma_remote_ns'], 1e6, '{:.2f}'):>26}",
                  f"{'  C relay 16 MiB, the same work ⁶ (ms)':<{w}}"
                  f"{spread(e['tcp_relay_ns'], 1e6, '{:.2f}'):>26}",
                  f"{'  C TCP round trip (µs)':<{w}}{spread(e['tcp_rtt_ns'], 1e3):>26}",
                  f"{'  empty submission doorbell→fence (µs)':<{w}}"
                  f"{spread(e['fence_ns'], 1e3):>26}",
                  f"{'ratios (per repetition)':<{w}}{'ratio':>26}{'goal':>9}{'  met':<6}"]
        for r in e["ratios"].values():
            lines.append(f"{'  ' + r['what']:<{w}}{spread(r, 1, '{:.2f}'):>26}"
                         f"{r['goal']:>9}  {'yes' if r['met'] else 'NO'}")
        lines.append(f"{'  SDMA 16 MiB remote→host / C relay ⁶':<{w}}"
                     f"{spread(e['remote_over_relay'], 1, '{:.2f}'):>26}{'none':>9}")
        lines.append(f"{'  doorbell→fence / C TCP round trip':<{w}}"
                     f"{spread(e['fence_over_rtt'], 1, '{:.1f}'):>26}{'none':>9}")
        for key, threads in (("pvm_floor", "1 thread"), ("pvm2_floor", "2 threads")):
            lines.append(f"{'  C memcpy / process_vm_readv, ' + threads:<{w}}"
                         f"{spread(e[key], 1, '{:.2f}'):>26}{'none':>9}")
        lines.append(f"{'  C relay / C TCP stream ⁶':<{w}}"
                     f"{spread(e['relay_over_stream'], 1, '{:.2f}'):>26}{'none':>9}")
        ic = e["idle_cpu"]
        lines += [f"{'daemon CPU, % of one CPU ⁵':<{w}}{'%':>26}{'goal':>9}{'  met':<6}",
                  f"{'  8 idle SDMA queues':<{w}}{spread(ic, 0.01, '{:.2f}'):>26}"
                  f"{ic['goal']:>9}  {'yes' if ic['met'] else 'NO'}",
                  f"{'  one queue on a forever poll':<{w}}"
                  f"{spread(e['poll_cpu_share'], 0.01, '{:.2f}'):>26}{'none':>9}",
                  f"{'    its release, CPU store → fence (ms)':<{w}}"
                  f"{spread(e['poll_release_ns'], 1e6, '{:.2f}'):>26}"]
    lines += ["", *RELAY_NOTE.splitlines()]
    return lines


def machine() -> dict[str, Any]:
    return {"cpus": len(ALLOWED), "kernel": platform.release(),
            "loadavg": Path("/proc/loadavg").read_text().split()[:3],
            "system_congestion": Path("/proc/sys/net/ipv4/tcp_congestion_control")
            .read_text().strip()}


def build() -> None:
    subprocess.run(["make", "-s", "-C", str(REPO / "libualink_c")], check=True)
    subprocess.run(["make", "-s", "-C", str(HERE)], check=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a short run (smoke tests)")
    ap.add_argument("--reps", type=int, default=int(os.environ.get("BENCH_REPS", 0)) or None,
                    help="repetitions per placement (default 5, --quick 1; $BENCH_REPS)")
    ap.add_argument("--cpu", type=int, default=int(os.environ.get("BENCH_CPU", min(ALLOWED))),
                    help="the CPU of the pinned placement ($BENCH_CPU, default the first "
                         "this process may use)")
    ap.add_argument("--json", type=Path, default=HERE / "results" / "latest.json")
    ap.add_argument("--no-breakdown", action="store_true")
    ap.add_argument("--no-engine", action="store_true", help="skip the GPU engine's table")
    ap.add_argument("--engine-only", action="store_true",
                    help="only the GPU engine's table (no FUSE/import/load rows, no breakdown)")
    ap.add_argument("--extras", action="store_true", help="also the older pod/data tables")
    ap.add_argument("--cycle", action="store_true",
                    help="also the import cycle step by step, with and without idle gaps")
    ap.add_argument("--profile", action="store_true",
                    help="also cProfile both daemons over an import and load workload")
    ap.add_argument("--data-rows", action="store_true",
                    help="only the 1 MiB remote load and store rows and their C TCP stream, "
                         "both placements (printed, no JSON)")
    args = ap.parse_args(argv)
    reps = args.reps or (1 if args.quick else 5)
    counts = Counts(args.quick)
    build()
    if args.data_rows:
        tmp = Path(tempfile.mkdtemp(prefix="ualink-bench."))
        try:
            with fuse_relay(tmp) as relay, pod(tmp / "pod", stamps=False) as (a, b):
                for name, cpus in (("pinned", {args.cpu}), ("scheduler", None)):
                    print(f"{name}: {reps} repetition(s), median [min–max]", flush=True)
                    print("\n".join(data_rows(reps, counts, cpus, a, b, relay)), flush=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return 0
    congestion = PodConfig.local(1, 1).tcp_congestion or "system default"
    result: dict[str, Any] = {"reps": reps, "cpu": args.cpu, "counts": counts.as_dict(),
                              "congestion": congestion, "machine_before": machine(),
                              "placements": {}, "runs": {}}
    tmp = Path(tempfile.mkdtemp(prefix="ualink-bench."))
    try:
        with fuse_echo(tmp) as echo, fuse_relay(tmp) as relay, \
                pod(tmp / "pod", stamps=False) as (a, b):
            for name, cpus in (("pinned", {args.cpu}), ("scheduler", None)):
                if args.engine_only:
                    break
                runs = placement_runs(reps, counts, cpus, echo, tmp / "echo" / "dev", a, b,
                                      relay)
                result["runs"][name] = runs
                result["placements"][name] = summarize(runs)
            if (BUILD / "sdma_bench").exists() and not args.no_engine:
                result["engine_runs"], result["engine"] = {}, {}
                with exported_bo(a, counts.sdma_remote_bytes) as handle:
                    for name, cpus in (("pinned", {args.cpu}), ("scheduler", None)):
                        runs = engine_runs(reps, counts, cpus, a, b, handle)
                        result["engine_runs"][name] = runs
                        result["engine"][name] = engine_summary(runs)
            if args.cycle:
                result["cycle"] = cycle(a, b, counts, args.cpu)
            if args.extras:
                churn = fields(run_c(LIB_BUILD / "gem_churn", [a.render(), "3"], None))
                result["gem_churn_pairs_per_sec"] = churn["pairs_per_sec"]
        if not args.no_breakdown and not args.engine_only:
            result["breakdown"] = breakdown(tmp / "stamped", counts, args.cpu)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result["machine_after"] = machine()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    if result["placements"]:
        print("\n".join(table(result)))
    if "engine" in result:
        print("\n".join(engine_table(result)))
    if "cycle" in result:
        print("\n".join(cycle_table(result["cycle"])))
    print(f"\nload average before / after: {' '.join(result['machine_before']['loadavg'])} / "
          f"{' '.join(result['machine_after']['loadavg'])} ({result['machine_before']['cpus']} "
          f"CPUs); JSON: {args.json}")
    if args.profile:
        tmp = Path(tempfile.mkdtemp(prefix="ualink-bench."))
        try:
            print("\n".join(profile(tmp, counts, args.json.parent)))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.extras:
        print(f"GEM_CREATE + GEM_CLOSE pairs per second (4 KiB VRAM): "
              f"{result['gem_churn_pairs_per_sec']:.0f}")
        extras()
    return 0


def extras() -> None:
    import data_bench
    import pod_bench

    tmp = Path(tempfile.mkdtemp(prefix="ualink-bench."))
    try:
        lines = pod_bench.main(tmp)
        data_lines, _data = data_bench.main(tmp / "data")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("\nextras (Python clients; no floors)")
    print("\n".join([*lines, "", *data_lines]))

if __name__ == "__main__":
    sys.exit(main())
