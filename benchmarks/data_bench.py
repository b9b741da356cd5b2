"""Data-plane figures for `make bench`: GPU loads/stores of an imported BO across two
daemons (pread/pwrite at a GPU VA → fabric LOAD/STORE → the exporter's NPA page table),
next to the raw loopback TCP throughput of a Python socket pair and local-VRAM pread through
the same FUSE mount, all measured in one run.

The raw TCP figure is taken twice: with the system's congestion control (a plain socket
pair, the issue's baseline) and with the fabric's (PodConfig.tcp_congestion), which moves it
a lot on kernels defaulting to BBR; both ratios are printed.
"""

from __future__ import annotations

import mmap
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


def system_congestion() -> str:
    return Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip()


def raw_tcp_throughput(congestion: str = "", total: int = 256 << 20,
                       chunk: int = 1 << 20) -> float:
    """Bytes per second one way through a loopback TCP socket pair (Python both ends, 1 MiB
    sendall / recv), with the system's congestion control or the one named."""
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]

    def sink() -> None:
        conn, _ = srv.accept()
        got = 0
        while got < total:
            got += len(conn.recv(1 << 20))
        conn.sendall(b"k")
        conn.close()

    threading.Thread(target=sink, daemon=True).start()
    c = socket.create_connection(("127.0.0.1", port))
    if congestion:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, congestion.encode())
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
    cfg = PodConfig.local(2, 1, free_tcp_ports(2))
    default_cc, fabric_cc = system_congestion(), cfg.tcp_congestion or system_congestion()
    raw = statistics.median(raw_tcp_throughput() for _ in range(3))
    raw_fabric_cc = statistics.median(raw_tcp_throughput(fabric_cc) for _ in range(3))
    rows = []
    figures: dict[str, float] = {"raw_tcp": raw, "raw_tcp_fabric_cc": raw_fabric_cc}
    with running_pod(tmp / "pod", config=cfg) as (a, b):
        with Client(a.render()) as ca, Client(b.render()) as cb:
            size = max(SIZES)
            bo = ca.bo_create(size)
            ca.va_map(bo, VA, size)
            fd = cb.import_(ca.export(bo))
            gem = cb.fd_to_handle(fd)
            os.close(fd)
            cb.va_map(gem, VA, size)
            # The client's staging buffer: page-aligned and reused, as a runtime's is. With
            # direct I/O the kernel cuts a read at the user buffer's page boundaries, so a
            # 1 MiB read into an unaligned buffer is two FUSE requests (one line below shows
            # what that costs).
            staging = mmap.mmap(-1, size)
            staging[:] = os.urandom(size)
            view = memoryview(staging)
            ca.gpu_write(VA, bytes(view[: 1 << 20]))
            for n in SIZES:
                def load(n: int = n) -> None:
                    off = 0
                    while off < n:
                        off += os.preadv(cb.fd, [view[off:n]], VA + off)

                def store(n: int = n) -> None:
                    off = 0
                    while off < n:
                        off += os.pwritev(cb.fd, [view[off:n]], VA + off)

                def local(n: int = n) -> None:
                    off = 0
                    while off < n:
                        off += os.preadv(ca.fd, [view[off:n]], VA + off)

                for kind, fn in (("remote load", load), ("remote store", store),
                                 ("local VRAM pread", local)):
                    ts = timed(fn, 2.0 if n == 1 << 20 else 1.0)
                    med = statistics.median(ts)
                    rows.append((kind, n, med, n / med))
                    figures[f"{kind} {n}"] = med

            def unaligned() -> None:
                off = 0
                while off < 1 << 20:
                    off += len(cb.gpu_read(VA + off, (1 << 20) - off))  # os.pread: new bytes

            med = statistics.median(timed(unaligned))
            rows.append(("remote load, os.pread (unaligned)", 1 << 20, med, (1 << 20) / med))
            figures["remote load unaligned 1048576"] = med
    lines = [f"{'data plane (2 daemons, loopback)':<36}{'size':>9}{'median µs':>11}"
             f"{'MiB/s':>9}"]
    for kind, n, med, bw in rows:
        lines.append(f"{kind:<36}{n >> 10:>7}Ki{med * 1e6:>11.1f}{bw / (1 << 20):>9.0f}")
    lines.append(f"{f'raw TCP, Python socket pair ({default_cc})':<36}{'':>9}{'':>11}"
                 f"{raw / (1 << 20):>9.0f}")
    lines.append(f"{f'raw TCP, same pair with {fabric_cc}':<36}{'':>9}{'':>11}"
                 f"{raw_fabric_cc / (1 << 20):>9.0f}")
    one_mib = (1 << 20) / figures[f"remote load {1 << 20}"]
    local = (1 << 20) / figures[f"local VRAM pread {1 << 20}"]
    lines.append(f"1 MiB remote load / raw TCP ({default_cc}, the issue's baseline) = "
                 f"{one_mib / raw:.2f} (target ≥ 0.50)")
    lines.append(f"1 MiB remote load / raw TCP ({fabric_cc}, the fabric's own) = "
                 f"{one_mib / raw_fabric_cc:.2f}; local 1 MiB pread / same = "
                 f"{local / raw_fabric_cc:.2f} (the FUSE bound)")
    return lines, figures
