"""`make bench-pod`: the pod at scale (issue 15 item 3), then pods of 2, 8 and 32 nodes.

1. Live exports on one node (benchmarks/build/export_scale, raw ioctls): export latency of
   a new export and of an idempotent re-export at 1,000 and at BENCH_POD_EXPORTS (default
   1,000,000) live exports, and the daemon's RSS growth per export.
   Goals: p50 at the large count within 1.2x of the 1,000 figure; <= 1 KiB per export.
2. Local pods of each shape of BENCH_POD_SHAPES (NODESxACCELS, default
   256x1,128x2,64x4,32x8: the kernel's 256 accels each way; `ualinkd pod`, TCP on
   127.0.0.1): time from the command to every node ready and every accel ACTIVE (pods of
   up to 32 nodes wait for every fabric link too; larger ones link each pair on first use,
   fabric/dialing.py), the log lines the pod wrote by then, the RSS, PSS and CPU of every
   daemon, one first import across a pair with no link yet (its set-up included), and a
   fan-in: every other node's first import of a BO of node0, all at once; before the
   imports, each daemon's CPU and wake-ups a second while the pod is idle for
   BENCH_POD_IDLE_S (10) seconds.
   Goal: each shape all-ACTIVE in < 60 s, its log lines bounded (a node's "serving" line,
   one per accel, SPARE_LINES_PER_NODE more).
3. Revoke fan-out: BENCH_POD_REVOKE_BOS (2000) exported BOs, each imported by every one of
   BENCH_POD_REVOKE_IMPORTERS (8) nodes; the exporter's file closes (every BO's handle_free
   revokes it) and the time until every RELEASE is in (the exporter's NPA use back to what
   it was before the imports). Goal: < 1 s.
4. Pods of BENCH_POD_SIZES (2,8,32) nodes in network and mount namespaces
   (ualinkd.testing): time to all-ACTIVE, daemon RSS, first-import latency with one
   importer per node at once, revoke of one BO imported by every other node.

Each part runs unless its variable is 0 (BENCH_POD_SIZES empty). The ualinkd sources are
byte-compiled first, as an installed package's are (pip compiles at install): with
PYTHONDONTWRITEBYTECODE set every daemon would otherwise compile them again at start.
The figures go to BENCH_POD_JSON too (default benchmarks/results/pod_scale.json)."""

from __future__ import annotations

import compileall
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))

from nodes import Client  # noqa: E402

from ualinkd import sysfs  # noqa: E402
from ualinkd.fabric.dialing import links_at_start  # noqa: E402
from ualinkd.testing import Pod, pod_config  # noqa: E402

SIZES = [int(x) for x in os.environ.get("BENCH_POD_SIZES", "2,8,32").split(",") if x]
EXPORTS = int(os.environ.get("BENCH_POD_EXPORTS", "1000000"))
SHAPES = [tuple(int(v) for v in x.split("x")) for x in
          os.environ.get("BENCH_POD_SHAPES", "256x1,128x2,64x4,32x8").split(",") if x]
JSON_PATH = Path(os.environ.get("BENCH_POD_JSON",
                                str(REPO / "benchmarks" / "results" / "pod_scale.json")))
GOAL_S = 60.0  # issue 34: any shape up to 256 accels all-ACTIVE within this
# Log lines a node may write while its pod starts (bounded output): its "serving" line, one
# "ACTIVE" line per accel, and this many more.
SPARE_LINES_PER_NODE = 2
# Seconds each shape's pod is watched idle once ready (its daemons' CPU and wake-ups)
IDLE_S = float(os.environ.get("BENCH_POD_IDLE_S", "10"))
REVOKE_BOS = int(os.environ.get("BENCH_POD_REVOKE_BOS", "2000"))
REVOKE_IMPORTERS = int(os.environ.get("BENCH_POD_REVOKE_IMPORTERS", "8"))
EXPORT_SCALE = REPO / "benchmarks" / "build" / "export_scale"
RESULT: dict[str, object] = {}  # what BENCH_POD_JSON gets


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def pss_mib(pid: int) -> float:
    """The process's proportional share of the memory it maps: the nodes `ualinkd pod`
    forks share the pages of the code it imported once, which RSS counts in full for each."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_s(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def sched(pid: int) -> tuple[float, int]:
    """CPU seconds and wake-ups so far of every thread of a process (/proc/PID/task/*/
    schedstat: ns on the CPU, then timeslices run, one per wake-up of a sleeping thread;
    ns-exact where /proc/PID/stat counts clock ticks)."""
    cpu = wakeups = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            run, _, slices = map(int, (task / "schedstat").read_text().split())
        except (OSError, ValueError):  # a thread that just ended
            continue
        cpu += run
        wakeups += slices
    return cpu / 1e9, wakeups


def idle(pids: list[int], seconds: float) -> dict[str, float]:
    """Each daemon's CPU (% of one CPU) and wake-ups a second over `seconds` with nothing
    to do (after the pod is ready, before any import): medians, and the pod's CPU total."""
    before = [sched(pid) for pid in pids]
    time.sleep(seconds)
    after = [sched(pid) for pid in pids]
    cpu = [(a[0] - b[0]) / seconds * 100 for a, b in zip(after, before, strict=True)]
    wake = [(a[1] - b[1]) / seconds for a, b in zip(after, before, strict=True)]
    return {"seconds": seconds, "cpu_pct_median": round(statistics.median(cpu), 3),
            "cpu_pct_total": round(sum(cpu), 1),
            "wakeups_per_s_median": round(statistics.median(wake), 1)}


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


def fields(line: str) -> dict[str, int]:
    return {k: int(v) for k, v in (kv.split("=") for kv in line.split())}


def exports(n: int) -> None:
    """Part 1: one node, n live exports of 4 KiB VRAM BOs from one file."""
    checkpoints = sorted({c for c in (1000, 10_000, 100_000, n) if c <= n})
    # Accounted VRAM only: BO bytes are allocated on first write, and nothing writes.
    vram = max(1 << 30, n * 4096 * 2)
    print("\nlive exports on one node (4 KiB VRAM BOs, one file; export_scale)")
    print(f"{'live':>9} {'new p50 us':>11} {'new p99 us':>11} {'re-export p50 us':>17} "
          f"{'RSS MiB':>9} {'KiB/export':>11}")
    t = time.perf_counter()
    with Pod(pod_config(nodes=2, vram_size=vram)) as pod:
        node = pod.nodes[0]
        assert node.pid is not None
        out = subprocess.run([str(EXPORT_SCALE), render(node), str(node.pid),
                              *map(str, checkpoints)],
                             check=True, capture_output=True, text=True,
                             timeout=60 + n * 0.002).stdout
    rows = [fields(line) for line in out.splitlines()]
    base = rows[0]["rss_kib"]
    for r in rows[1:]:
        per = (r["rss_kib"] - base) / r["live"]
        print(f"{r['live']:>9} {r['new_p50_ns'] / 1e3:>11.1f} {r['new_p99_ns'] / 1e3:>11.1f} "
              f"{r['reexport_p50_ns'] / 1e3:>17.1f} {r['rss_kib'] / 1024:>9.1f} {per:>11.3f}")
    small, big = rows[1], rows[-1]
    new, again = (big[k] / small[k] for k in ("new_p50_ns", "reexport_p50_ns"))
    per = (big["rss_kib"] - base) / big["live"]
    print(f"goals at {big['live']}: new export p50 {new:.2f}x, re-export p50 {again:.2f}x "
          f"of the {small['live']} figure (<= 1.2x); {per:.3f} KiB per export (<= 1 KiB) "
          f"[{'met' if max(new, again) <= 1.2 and per <= 1 else 'MISSED'}] "
          f"({time.perf_counter() - t:.0f} s)")


def local_pod(n: int, per: int) -> dict[str, object]:
    """Part 2: `ualinkd pod --nodes n --accels-per-node per`, timed to every node ready and
    every accel ACTIVE; then one first import across a pair that has no link yet."""
    print(f"\nlocal pod: ualinkd pod --nodes {n} --accels-per-node {per} (127.0.0.1)", flush=True)
    with tempfile.TemporaryDirectory(prefix="ualinkd-bench-pod-") as root:
        errors = Path(root) / "pod.log"
        t = time.perf_counter()
        with open(errors, "w") as err:
            proc = subprocess.Popen([sys.executable, "-m", "ualinkd", "pod", "--nodes", str(n),
                                     "--accels-per-node", str(per), "--root", root,
                                     "--ready-timeout", "120"],
                                    stdout=subprocess.PIPE, stderr=err, text=True)
        try:
            assert proc.stdout is not None
            ready = 0
            for line in proc.stdout:  # printed once every node serves (and links, <= 32)
                ready += " ready: " in line
                if ready == n:
                    break
            up = time.perf_counter() - t
            if ready != n:
                raise RuntimeError(f"only {ready} of {n} nodes became ready:\n"
                                   + "\n".join(errors.read_text().splitlines()[-20:]))
            lines = len(errors.read_text().splitlines())
            states = {(Path(root) / f"node{i}" / "sys" / "class" / "drm"
                       / f"renderD{sysfs.RENDER_MINOR_BASE + a}" / "device" / "ualink"
                       / "accel_state").read_text().strip()
                      for i in range(n) for a in range(per)}
            kids = [int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
                    .read_text().split()]
            rss = [rss_mib(pid) for pid in kids]
            pss = [pss_mib(pid) for pid in kids]
            cpu = [cpu_s(pid) for pid in kids]
            quiet = idle(kids, IDLE_S) if IDLE_S else None
            first = first_import(Path(root) / "node0", Path(root) / f"node{n - 1}") if n > 1 \
                else None
            fan = fan_in(Path(root), n) if n > 2 else None
            lines_after = len(errors.read_text().splitlines())
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(120)
        # what the pod's orderly stop wrote: a peer that stops is news (INFO), not a WARNING
        stop_lines = errors.read_text().splitlines()[lines_after:]
        stop_warnings = sum(" WARNING " in ln or " ERROR " in ln for ln in stop_lines)
    bound = n * (1 + per + SPARE_LINES_PER_NODE)
    met = up < GOAL_S and states == {"active"} and lines <= bound
    print(f"all {n} nodes ready, {n * per} accels {'/'.join(sorted(states))}, in {up:.1f} s"
          f" [{'met' if met else 'MISSED'}: < {GOAL_S:.0f} s, <= {bound} log lines]")
    print(f"log lines by then: {lines} ({lines / n:.1f} a node); after the first import: "
          f"{lines_after}; at the stop: {len(stop_lines)}, {stop_warnings} WARNING or worse")
    print(f"RSS per daemon MiB: min {min(rss):.1f} median {statistics.median(rss):.1f} "
          f"max {max(rss):.1f} total {sum(rss):.0f}")
    print(f"PSS per daemon MiB (shared pages split among their users): median "
          f"{statistics.median(pss):.1f}, total {sum(pss):.0f}")
    print(f"CPU per daemon until then: median {statistics.median(cpu):.2f} s, "
          f"total {sum(cpu):.0f} s (this machine: {os.cpu_count()} CPUs)")
    if quiet is not None:
        print(f"idle for {IDLE_S:.0f} s once ready: per daemon median "
              f"{quiet['cpu_pct_median']:.3f}% of a CPU, {quiet['wakeups_per_s_median']:.1f} "
              f"wake-ups/s; all {n}: {quiet['cpu_pct_total']:.1f}% of a CPU")
    if fan is not None:
        print(f"fan-in: {n - 1} first imports at once into node0, one from each other node: "
              f"all done in {fan[0]:.2f} s, {fan[1]} failed")
    if first is not None:
        how = ("its link up since the start" if links_at_start("auto", n)
               else "no link yet: set up on this use")
        print(f"first import node{n - 1} <- node0 ({how}): {first * 1e3:.1f} ms")
    return {"nodes": n, "accels_per_node": per, "ready_s": round(up, 2),
            "accel_states": sorted(states), "log_lines": lines,
            "log_lines_after_import": lines_after,
            "stop_log_lines": len(stop_lines), "stop_warnings": stop_warnings,
            "rss_mib": {"min": round(min(rss), 1), "median": round(statistics.median(rss), 1),
                        "max": round(max(rss), 1)},
            "pss_mib_median": round(statistics.median(pss), 1),
            "cpu_s": {"median": round(statistics.median(cpu), 3), "total": round(sum(cpu), 1)},
            "idle": quiet,
            "first_import_ms": None if first is None else round(first * 1e3, 2),
            "fan_in_s": None if fan is None else round(fan[0], 2),
            "fan_in_failed": None if fan is None else fan[1],
            "goal_met": met}


def fan_in(root: Path, n: int) -> tuple[float, int]:
    """Every node but node0 imports a BO of node0's at once (most pairs not linked yet in a
    pod linked on first use): seconds until all are done, and how many failed."""
    with Client(str(root / "node0" / "dri" / "renderD128")) as ca:
        handles = [ca.export(ca.bo_create(64 << 10)) for _ in range(n - 1)]
        failed: list[OSError] = []

        def importer(i: int) -> None:
            with Client(str(root / f"node{i + 1}" / "dri" / "renderD128")) as c:
                try:
                    os.close(c.import_(handles[i]))
                except OSError as e:
                    failed.append(e)

        threads = [threading.Thread(target=importer, args=(i,)) for i in range(n - 1)]
        t = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        return time.perf_counter() - t, len(failed)


def first_import(exporter: Path, importer: Path) -> float:
    """Seconds one import on `importer` of a BO exported on `exporter` takes (libualink, so
    the EAGAINs of a link being set up are retried as drmIoctl retries them)."""
    with Client(str(exporter / "dri" / "renderD128")) as ca, \
            Client(str(importer / "dri" / "renderD128")) as cb:
        handle = ca.export(ca.bo_create(64 << 10))
        t = time.perf_counter()
        os.close(cb.import_(handle))
        return time.perf_counter() - t


def revoke_fanout(bos: int, importers: int) -> None:
    """Part 3: `bos` exports, each imported by `importers` nodes, revoked at once."""
    print(f"\nrevoke fan-out: {bos} exported BOs imported by {importers} nodes each")
    with Pod(pod_config(nodes=importers + 1, response_timeout_ms=5000)) as pod:
        exporter = pod.nodes[0]
        npa = exporter.root / sysfs.debugfs_file(128, "ualink_npa")
        baseline = npa.read_text()
        ca = Client(render(exporter))
        try:
            handles = [ca.export(ca.bo_create(64 << 10)) for _ in range(bos)]
            held: list[list[int]] = []
            clients = [Client(render(node)) for node in pod.nodes[1:]]
            t = time.perf_counter()

            def import_all(c: Client) -> None:
                fds = [c.import_(h) for h in handles]
                held.append(fds)

            threads = [threading.Thread(target=import_all, args=(c,)) for c in clients]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            if sum(map(len, held)) != bos * importers:
                raise RuntimeError("an importer failed")
            imported = time.perf_counter() - t
            assert npa.read_text() != baseline
            t = time.perf_counter()
            ca.close()  # drm_release: every handle goes, every BO's handle_free revokes it
            # The NPA frees come with the RELEASEs. Each read is a FUSE open/read/release
            # the exporter serves (~0.4 ms of its CPU): polled every 1 ms, the measurement
            # took a third of the exporter's time from the revoke it measures; every 5 ms
            # it takes < 10%, for at most 5 ms of resolution.
            while npa.read_text() != baseline:
                time.sleep(0.005)
            revoke = time.perf_counter() - t
        finally:
            ca.close()
            for fds in held:
                for fd in fds:
                    os.close(fd)
            for c in clients:
                c.close()
    print(f"{bos * importers} imports in {imported:.1f} s; revoke -> every RELEASE in: "
          f"{revoke * 1e3:.0f} ms [{'met' if revoke < 1 else 'MISSED'}: < 1 s]")


def main() -> int:
    compileall.compile_dir(str(REPO / "ualinkd"), quiet=1)
    if EXPORTS:
        exports(EXPORTS)
    RESULT["machine_before"] = {"cpus": os.cpu_count(), "loadavg": os.getloadavg()}
    if SHAPES:
        RESULT["shapes"] = [local_pod(n, per) for n, per in SHAPES]
        print(f"\n{'shape':>8} {'ACTIVE s':>9} {'log lines':>10} {'RSS MiB':>8} "
              f"{'PSS MiB':>8} {'CPU s':>6} {'idle %':>7} {'wake/s':>7} "
              f"{'1st import ms':>14} {'fan-in s':>9}")
        for r in RESULT["shapes"]:  # type: ignore[attr-defined]
            q = r["idle"] or {"cpu_pct_median": 0, "wakeups_per_s_median": 0}
            print(f"{r['nodes']:>4}x{r['accels_per_node']:<3} {r['ready_s']:>9.1f} "
                  f"{r['log_lines']:>10} {r['rss_mib']['median']:>8.1f} "
                  f"{r['pss_mib_median']:>8.1f} {r['cpu_s']['median']:>6.2f} "
                  f"{q['cpu_pct_median']:>7.3f} {q['wakeups_per_s_median']:>7.1f} "
                  f"{r['first_import_ms'] or 0:>14.1f} {r['fan_in_s'] or 0:>9.2f} "
                  f"{'met' if r['goal_met'] else 'MISSED'}")
        print(f"goal: every shape all-ACTIVE < {GOAL_S:.0f} s (per-daemon medians)")
        _write_json(quiet=True)
    if REVOKE_BOS and REVOKE_IMPORTERS:
        revoke_fanout(REVOKE_BOS, REVOKE_IMPORTERS)
    if not SIZES:
        _write_json()
        return 0
    print("\npods in namespaces, one accel per node")
    print(f"{'nodes':>5} {'ACTIVE s':>12} {'RSS MiB':>10} {'imp p50 ms':>10} "
          f"{'imp p99 ms':>10} {'revoke ms':>12}")
    for n in SIZES:
        print(one(n), flush=True)
    print("targets: 32 nodes ACTIVE < 30 s; revoke to 31 importers < 100 ms")
    _write_json()
    return 0


def _write_json(quiet: bool = False) -> None:
    RESULT["machine_after"] = {"cpus": os.cpu_count(), "loadavg": os.getloadavg()}
    JSON_PATH.parent.mkdir(parents=True, exist_ok=True)
    JSON_PATH.write_text(json.dumps(RESULT, indent=1) + "\n")
    if not quiet:
        print(f"JSON: {JSON_PATH}")


if __name__ == "__main__":
    sys.exit(main())
