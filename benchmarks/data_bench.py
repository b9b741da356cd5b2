"""Data-plane figures for `make bench`: GPU loads/stores of an imported BO across two
daemons (pread/pwrite at a GPU VA → fabric LOAD/STORE → the exporter's NPA page table),
next to the raw loopback TCP throughput of a Python socket pair and local-VRAM pread through
the same FUSE mount, all measured in one run."""

from __future__ import annotations

import os
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))

from nodes import Client, running_pod  # noqa: E402

from ualinkd.cli.main import free_tcp_ports  # noqa: E402
from ualinkd.config import PodConfig  # noqa: E402

SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20]
VA = 0x100000000


def raw_tcp_throughput(total: int = 256 << 20, chunk: int = 1 << 20) -> float:
    """Bytes per second one way through a loopback TCP socket pair (Python both ends)."""
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    done = threading.Event()

    def sink() -> None:
        conn, _ = srv.accept()
        got = 0
        while got < total:
            got += len(conn.recv(1 << 20))
        conn.sendall(b"k")
        conn.close()
        done.set()

    threading.Thread(target=sink, daemon=True).start()
    c = socket.create_connection(("127.0.0.1", port))
    buf = os.urandom(chunk)
    t0 = time.perf_counter()
    sent = 0
    while sent < total:
        c.sendall(buf)
        sent += chunk
    c.recv(1)
    elapsed = time.perf_counter() - t0
    c.close()
    srv.close()
    return total / elapsed


def timed(fn, seconds: float = 1.0, min_reps: int = 5) -> list[float]:  # type: ignore[no-untyped-def]
    out = []
    deadline = time.perf_counter() + seconds
    while len(out) < min_reps or time.perf_counter() < deadline:
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main(tmp: Path) -> tuple[list[str], dict[str, float]]:
    raw = raw_tcp_throughput()
    rows = []
    figures: dict[str, float] = {"raw_tcp": raw}
    cfg = PodConfig.local(2, 1, free_tcp_ports(2))
    with running_pod(tmp / "pod", config=cfg) as (a, b):
        with Client(a.render()) as ca, Client(b.render()) as cb:
            size = max(SIZES)
            bo = ca.bo_create(size)
            ca.va_map(bo, VA, size)
            fd = cb.import_(ca.export(bo))
            gem = cb.fd_to_handle(fd)
            os.close(fd)
            cb.va_map(gem, VA, size)
            data = os.urandom(size)
            ca.gpu_write(VA, data[: 1 << 20])
            for n in SIZES:
                def load(n: int = n) -> None:
                    off = 0
                    while off < n:
                        off += len(cb.gpu_read(VA + off, n - off))

                def store(n: int = n) -> None:
                    off = 0
                    while off < n:
                        off += cb.gpu_write(VA + off, data[off:n])

                def local(n: int = n) -> None:
                    off = 0
                    while off < n:
                        off += len(ca.gpu_read(VA + off, n - off))

                for kind, fn in (("remote load", load), ("remote store", store),
                                 ("local VRAM pread", local)):
                    ts = timed(fn)
                    med = statistics.median(ts)
                    rows.append((kind, n, med, n / med))
                    figures[f"{kind} {n}"] = med
    lines = [f"{'data plane (2 daemons, loopback)':<34}{'size':>9}{'median µs':>11}"
             f"{'MiB/s':>9}"]
    for kind, n, med, bw in rows:
        lines.append(f"{kind:<34}{n >> 10:>7}Ki{med * 1e6:>11.1f}{bw / (1 << 20):>9.0f}")
    lines.append(f"{'raw TCP loopback, Python socket pair':<34}{'':>9}{'':>11}"
                 f"{raw / (1 << 20):>9.0f}")
    one_mib = (1 << 20) / figures[f"remote load {1 << 20}"]
    lines.append(f"1 MiB remote load / raw TCP = {one_mib / raw:.2f} (target ≥ 0.50)")
    return lines, figures
