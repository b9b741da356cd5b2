"""Python calls the daemons make per export ioctl and per first-import cycle: a figure of
the Python work on the paths of issue 34's export and first-import rows that, unlike their
latencies, does not move with what else the machine runs (a busy 2-CPU machine moved the
first import's median by ±20% between two runs of the same tree). Counted with
sys.setprofile ("call" events: Python frames; C functions are not counted), between two
SIGUSR2s sent to a daemon, over a pod of two daemons on loopback as `make bench`'s.

    .venv/bin/python benchmarks/pycalls.py [imports] [export ioctls]

prints, for the exporter (node0) and the importer (node1):

- per export ioctl: `ioctl_latency --export` on node0 (an already exported BO, its
  warm-up calls included), trio's wake-ups shared among the ioctls each one served: how
  many the receive loop's linger caught varies with the timing (±1 call per ioctl);
- per import cycle: `pod_latency import` (per sample: a BO created, exported and closed on
  node0; imported, its dma-buf token opened, FD_TO_HANDLE, all closed on node1; the
  NPA_REVOKE/NPA_RELEASE that follow), each daemon's calls over the whole cycle.

The daemons run under this file (`--wrap`, as benchmarks/stamps.py wraps them), which
counts only between the signals: the daemons' start-up and the links' set-up are not in it.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
HERE = REPO / "benchmarks"
OUT_ENV = "UALINK_PYCALLS_OUT"


def wrap(argv: list[str]) -> None:
    """Run `ualinkd node …` counting Python calls between SIGUSR2s; each second one writes
    the count to $UALINK_PYCALLS_OUT.<pid>."""
    count = [0]
    on = [False]

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            count[0] += 1

    def toggle(signum: int, frame: FrameType | None) -> None:
        if on[0]:
            sys.setprofile(None)
            on[0] = False
            Path(f"{os.environ[OUT_ENV]}.{os.getpid()}").write_text(str(count[0]))
        else:
            count[0] = 0
            on[0] = True
            sys.setprofile(profile)

    signal.signal(signal.SIGUSR2, toggle)
    if argv and argv[0] != "-m":  # start_node's prefix is followed by its own interpreter
        argv = argv[1:]
    sys.argv = ["ualinkd", *argv[2:]]
    runpy.run_module("ualinkd", run_name="__main__", alter_sys=True)


def main(imports: int, ioctls: int) -> None:
    sys.path.insert(0, str(HERE))
    import run as bench  # (benchmarks/run.py: its pod helpers and C programs)

    bench.build()
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        os.environ[OUT_ENV] = str(tmp / "calls")
        config = bench.PodConfig.local(2, 1, bench.free_tcp_ports(2))
        prefix = [sys.executable, str(Path(__file__).resolve()), "--wrap"]
        nodes = []
        try:
            for n in config.nodes:
                nodes.append(bench.start_node(tmp, config, n.name, prefix=prefix))
            for node in nodes:
                bench.wait_links_up(node)
            a, b = nodes

            def counted(who: list[Any], prog: Path, args: list[str]) -> list[int]:
                for node in who:
                    os.kill(node.proc.pid, signal.SIGUSR2)
                time.sleep(0.2)  # (the handlers run between the daemons' bytecodes)
                bench.run_c(prog, args, None)
                for node in who:
                    os.kill(node.proc.pid, signal.SIGUSR2)
                out = []
                for node in who:
                    path = Path(f"{tmp / 'calls'}.{node.proc.pid}")
                    deadline = time.monotonic() + 10
                    while not path.exists() and time.monotonic() < deadline:
                        time.sleep(0.05)
                    out.append(int(path.read_text()))
                    path.unlink()
                return out

            (exp,) = counted([a], bench.LIB_BUILD / "ioctl_latency",
                             ["--export", a.render(), str(ioctls)])
            per_ioctl = exp / (ioctls + bench.WARMUP)
            # pod_latency import does count + count // 10 + 1 cycles (its warm-up: run.py)
            cycles = imports + imports // 10 + 1
            ca, cb = counted([a, b], bench.BUILD / "pod_latency",
                             ["import", a.render(), b.render(), str(imports)])
        finally:
            for node in nodes:
                node.stop()
    print(f"Python calls per export ioctl (exporter):      {per_ioctl:8.1f}")
    print(f"Python calls per import cycle, exporter:       {ca / cycles:8.1f}")
    print(f"Python calls per import cycle, importer:       {cb / cycles:8.1f}")
    print(f"Python calls per import cycle, both:           {(ca + cb) / cycles:8.1f}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--wrap"]:
        wrap(sys.argv[2:])
    else:
        main(int(sys.argv[1]) if len(sys.argv) > 1 else 200,
             int(sys.argv[2]) if len(sys.argv) > 2 else 5000)
