"""`make bench-pod`: pods of 2, 8 and 32 nodes (one accel each, every node in its own
network and mount namespace, ualinkd.testing) — time to all-ACTIVE with every fabric link
up, daemon RSS, first-import latency with one importer per node at once, and revoke → every
RELEASE with all other nodes importing. Targets: 32 nodes ACTIVE in < 30 s; revoke fan-out
to 31 importers < 100 ms."""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))

from nodes import Client  # noqa: E402

from ualinkd import sysfs  # noqa: E402
from ualinkd.testing import Pod, pod_config  # noqa: E402

SIZES = [int(x) for x in os.environ.get("BENCH_POD_SIZES", "2,8,32").split(",")]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def render(node) -> str:  # type: ignore[no-untyped-def]
    # The host reaches a node's files through the daemon's mount namespace.
    return str(node.root / "dri" / "renderD128")


def one(n: int) -> str:
    t0 = time.perf_counter()
    with Pod(pod_config(nodes=n, response_timeout_ms=5000)) as pod:
        up = time.perf_counter() - t0
        states = {node.sysfs("accel_state").strip() for node in pod.nodes}
        assert states == {"active"}, states
        rss = [rss_mib(node.pid) for node in pod.nodes if node.pid]
        exporter, importers = pod.nodes[0], pod.nodes[1:]
        with Client(render(exporter)) as ca:
            handles = [ca.export(ca.bo_create(64 << 10)) for _ in importers]
            lat: list[float] = []
            lock = threading.Lock()

            def importer(node, handle) -> None:  # type: ignore[no-untyped-def]
                with Client(render(node)) as c:
                    t = time.perf_counter()
                    os.close(c.import_(handle))
                    dt = time.perf_counter() - t
                with lock:
                    lat.append(dt)

            threads = [threading.Thread(target=importer, args=(node, h))
                       for node, h in zip(importers, handles, strict=True)]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            # revoke fan-out: one BO imported by every other node
            bo = ca.bo_create(64 << 10)
            handle = ca.export(bo)
            for node in importers:
                with Client(render(node)) as c:
                    os.close(c.import_(handle))
            npa = exporter.root / sysfs.debugfs_file(128, "ualink_npa")
            before = npa.read_text()
            t = time.perf_counter()
            ca.bo_close(bo)
            while npa.read_text() == before:  # the revoke's NPA frees come last
                pass
            revoke = time.perf_counter() - t
    return (f"{n:>5} {up:>12.1f} {statistics.median(rss):>10.1f} "
            f"{statistics.median(lat) * 1e3:>10.2f} {pct(lat, 0.99) * 1e3:>10.2f} "
            f"{revoke * 1e3:>12.1f}")


def main() -> int:
    print("pods in namespaces, one accel per node")
    print(f"{'nodes':>5} {'ACTIVE s':>12} {'RSS MiB':>10} {'imp p50 ms':>10} "
          f"{'imp p99 ms':>10} {'revoke ms':>12}")
    for n in SIZES:
        print(one(n), flush=True)
    print("targets: 32 nodes ACTIVE < 30 s; revoke to 31 importers < 100 ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
