"""`make bench`: ualinkd's ioctl latency next to a minimal C libfuse3 echo server, measured
in the same run on the same machine, plus GEM_CREATE+GEM_CLOSE throughput.

Two placements are measured for both servers: client and server pinned to one CPU (the
FUSE round trip without a cross-CPU wake-up) and left to the scheduler. The ratio of
ualinkd's median to the echo server's median is the figure the target refers to (≤ 2.5).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUILD = REPO / "libualink_c" / "build"
sys.path.insert(0, str(REPO / "tests" / "integration"))

from nodes import start_node  # noqa: E402

from ualinkd.config import PodConfig  # noqa: E402
from ualinkd.fuse.lowlevel import clear_stale_mount, fuse_mounts_at  # noqa: E402

UALINK_CMD = "c018645b"
COUNT = int(os.environ.get("BENCH_COUNT", "20000"))


def parse(out: str) -> dict[str, float]:
    return {k: float(v) for k, v in re.findall(r"(\w+)=([0-9.]+)", out)}


def latency(args: list[str], pin: bool) -> dict[str, float]:
    cmd = (["taskset", "-c", "0"] if pin else []) + [str(BUILD / "ioctl_latency"), *args]
    return parse(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def pin_process(pid: int, pin: bool) -> None:
    os.sched_setaffinity(pid, {0} if pin else set(range(os.cpu_count() or 1)))


def main() -> int:
    subprocess.run(["make", "-s", "-C", str(REPO / "libualink_c")], check=True)
    tmp = Path(tempfile.mkdtemp(prefix="ualink-bench."))
    echo_mnt = tmp / "echo"
    echo_mnt.mkdir()
    echo = subprocess.Popen([str(BUILD / "fuse_echo"), str(echo_mnt), "-f"])
    node = None
    try:
        for _ in range(100):
            if fuse_mounts_at(str(echo_mnt)):
                break
            time.sleep(0.05)
        node = start_node(tmp, PodConfig.local(1, 1), "node0")
        render = node.render()
        rows = []
        for pin in (True, False):
            pin_process(echo.pid, pin)
            pin_process(node.proc.pid, pin)
            e = latency([str(echo_mnt / "dev"), UALINK_CMD, str(COUNT)], pin)
            u = latency(["--export", render, str(COUNT)], pin)
            rows.append((pin, e, u))
        churn = parse(subprocess.run([str(BUILD / "gem_churn"), render, "3"], check=True,
                                     capture_output=True, text=True).stdout)
    finally:
        if node is not None:
            node.stop()
        echo.send_signal(signal.SIGTERM)
        echo.wait(10)
        for m in (echo_mnt, tmp / "mnt-node0"):
            if fuse_mounts_at(str(m)):
                clear_stale_mount(m)
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"ioctl round trip, 24-byte DRM_IOCTL_AMDGPU_UALINK_HANDLE, {COUNT} calls each")
    print(f"{'placement':<22}{'server':<34}{'median µs':>10}{'p99 µs':>10}")
    for pin, e, u in rows:
        where = "same CPU (pinned)" if pin else "scheduler's choice"
        print(f"{where:<22}{'C libfuse3 echo (baseline)':<34}"
              f"{e['median_ns'] / 1e3:>10.1f}{e['p99_ns'] / 1e3:>10.1f}")
        print(f"{'':<22}{'ualinkd export (already exported)':<34}"
              f"{u['median_ns'] / 1e3:>10.1f}{u['p99_ns'] / 1e3:>10.1f}")
        print(f"{'':<22}{'ratio ualinkd / echo (target 2.5)':<34}"
              f"{u['median_ns'] / e['median_ns']:>10.2f}{u['p99_ns'] / e['p99_ns']:>10.2f}")
    print(f"GEM_CREATE + GEM_CLOSE pairs per second (4 KiB VRAM): {churn['pairs_per_sec']:.0f}")

    import data_bench
    import pod_bench

    tmp = Path(tempfile.mkdtemp(prefix="ualink-bench."))
    try:
        lines, first, rtt = pod_bench.main(tmp)
        data_lines, data = data_bench.main(tmp / "data")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print()
    print("\n".join(lines))
    floor = rows[1][1]["median_ns"] / 1e9  # the echo round trip, scheduler's placement
    budget = 3 * floor + rtt
    print(f"first import / (3 FUSE echo floors + 1 TCP round trip) = {first / budget:.2f}"
          f" (target 4; floor {floor * 1e6:.1f} µs, TCP {rtt * 1e6:.1f} µs)")
    print()
    print("\n".join(data_lines))
    small = data[f"remote load {4 << 10}"]
    print(f"4 KiB remote load / (FUSE echo floor + TCP round trip) = "
          f"{small / (floor + rtt):.2f} (target ≤ 3)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
