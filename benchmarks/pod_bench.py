"""Extra pod figures for `make bench --extras` (Python clients through libualink; the floors
and goals are in run.py): first and deduplicated import latency, revoke → every RELEASE
for 1, 4 and 8 importers, and first imports per second from 8 client processes."""

from __future__ import annotations

import os
import statistics
import sys
import time
from multiprocessing import get_context
from multiprocessing.queues import Queue
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))

from nodes import Client, running_pod  # noqa: E402

from ualinkd import sysfs  # noqa: E402
from ualinkd.cli.main import free_tcp_ports  # noqa: E402
from ualinkd.config import AccelConfig, NodeConfig, PodConfig  # noqa: E402


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def pod_config(importer_accels: int) -> PodConfig:
    base = PodConfig.local(2, 1, free_tcp_ports(2))
    n0, n1 = base.nodes
    accels = tuple(AccelConfig(1 + i) for i in range(importer_accels))
    nodes = (n0, NodeConfig(n1.name, n1.address, accels))
    members = frozenset(range(importer_accels + 1))
    v = base.vpods[0]
    return PodConfig(base.uuid, base.key, nodes, (type(v)(1, members, v.addr_mode),),
                     len(members))


def _importer(render: str, handles: list[tuple[int, int]], q: Queue[int]) -> None:
    with Client(render) as c:
        for h in handles:
            os.close(c.import_(h))
    q.put(len(handles))


def main(tmp: Path) -> list[str]:
    lines = []
    with running_pod(tmp / "pod", config=pod_config(8)) as (a, b):
        with Client(a.render()) as ca, Client(b.render()) as cb:
            first, dedup = [], []
            for _ in range(200):
                bo = ca.bo_create(1 << 20)
                h = ca.export(bo)
                t0 = time.perf_counter()
                fd = cb.import_(h)
                gem = cb.fd_to_handle(fd)
                first.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                fd2 = cb.import_(h)
                cb.fd_to_handle(fd2)
                dedup.append(time.perf_counter() - t0)
                os.close(fd)
                os.close(fd2)
                cb.bo_close(gem)
                ca.bo_close(bo)
            lines.append(("first import (ioctl + dma-buf open + FD_TO_HANDLE)", first))
            lines.append(("deduped import (same)", dedup))
            # revoke -> all releases for 1, 4, 8 importer accels (all on node b)
            revoke = {}
            for n in (1, 4, 8):
                times = []
                for _ in range(20):
                    bo = ca.bo_create(1 << 16)
                    h = ca.export(bo)
                    clients = [Client(b.render(i)) for i in range(n)]
                    for c in clients:
                        os.close(c.import_(h))
                    npa = a.mount / sysfs.debugfs_file(128, "ualink_npa")
                    t0 = time.perf_counter()
                    ca.bo_close(bo)
                    while not npa.read_text().startswith("used_pages=0 "):
                        pass
                    times.append(time.perf_counter() - t0)
                    for c in clients:
                        c.close()
                revoke[n] = times
            # first imports per second, 8 client processes on node b
            per_proc = 50
            bos = [ca.bo_create(1 << 16) for _ in range(8 * per_proc)]
            handles = [ca.export(x) for x in bos]
            ctx = get_context("fork")
            q = ctx.Queue()
            procs = [ctx.Process(target=_importer,
                                 args=(b.render(i), handles[i * per_proc:(i + 1) * per_proc], q))
                     for i in range(8)]
            t0 = time.perf_counter()
            for pr in procs:
                pr.start()
            total = sum(q.get(timeout=120) for _ in procs)
            elapsed = time.perf_counter() - t0
            for pr in procs:
                pr.join()
    out = [f"{'pod (2 daemons, loopback)':<52}{'median µs':>10}{'p99 µs':>10}"]
    for name, xs in lines:
        out.append(f"{name:<52}{statistics.median(xs) * 1e6:>10.1f}{pct(xs, 0.99) * 1e6:>10.1f}")
    for n, xs in revoke.items():
        out.append(f"{f'revoke -> all RELEASEs, {n} importer(s)':<52}"
                   f"{statistics.median(xs) * 1e6:>10.1f}{pct(xs, 0.99) * 1e6:>10.1f}")
    out.append(f"first imports per second, 8 client processes: {total / elapsed:.0f}")
    return out
