"""Extra data-plane figures for `make bench --extras` (a Python client; the C floors and
goals are in run.py): GPU loads/stores of an imported BO across two daemons (pread/pwrite
at a GPU VA → fabric LOAD/STORE → the exporter's NPA page table) by size, beside local-VRAM
pread through the same FUSE mount."""

from __future__ import annotations

import mmap
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))

from nodes import Client, running_pod  # noqa: E402

from ualinkd.cli.main import free_tcp_ports  # noqa: E402
from ualinkd.config import PodConfig  # noqa: E402

SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20]
VA = 0x100000000


def timed(fn: Callable[[], object], seconds: float = 1.0, min_reps: int = 5) -> list[float]:
    out: list[float] = []
    deadline = time.perf_counter() + seconds
    while len(out) < min_reps or time.perf_counter() < deadline:
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main(tmp: Path) -> tuple[list[str], dict[str, float]]:
    cfg = PodConfig.local(2, 1, free_tcp_ports(2))
    rows = []
    figures: dict[str, float] = {}
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
    return lines, figures
