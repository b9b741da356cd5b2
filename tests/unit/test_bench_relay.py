"""The 1 MiB rows of `make bench` beside the same work in C (benchmarks/run.py relay_ratios,
summarize, table; the relay itself is benchmarks/fuse_relay.c, run in
tests/integration/test_bench_harness.py): the goal ratios stay against the C TCP stream,
the relay's ratios are printed with no goal."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import run

MiB = 1 << 20
COST = {"server_cpu_ns_per_op": 1000.0, "server_wait_ns_per_op": 10.0,
        "server_switches_per_op": 2.0}


def measured(load_us: float, store_us: float, relay_load_us: float,
             relay_store_us: float) -> dict[str, dict[str, float]]:
    """One repetition's measurements: a stream of 1 MiB per 250 µs, the rest plausible."""
    common = {"median_ns": 10_000.0, "total_ns": 900_000.0, "ioctl_ns": 300_000.0,
              "open_ns": 300_000.0, "fd_to_handle_ns": 300_000.0, "data_plane_share": 0.9,
              "spliced_share": 0.8, **COST}
    m = {k: dict(common) for k in run.KINDS}
    m["tcp_stream"]["median_bps"] = MiB * 1e9 / 250_000
    for k, us in (("load_1m", load_us), ("store_1m", store_us),
                  ("relay_load_1m", relay_load_us), ("relay_store_1m", relay_store_us)):
        m[k]["median_ns"] = us * 1e3
    return m


def test_the_relay_ratios_are_throughputs_against_the_same_work_in_c():
    # ualinkd 500 µs a load, the relay 400 µs: 0.8 of the relay; the relay 250/400 of the
    # stream. The goal ratio is unchanged: 250/500 of the stream.
    r = run.ratios(measured(500, 1000, 400, 300))
    assert r["load_1m_relay"] == 0.8 and r["store_1m_relay"] == 0.3
    assert r["relay_load_1m_stream"] == 250 / 400 and r["relay_store_1m_stream"] == 250 / 300
    assert r["load_1m"] == 0.5 and r["store_1m"] == 0.25


def test_the_main_table_prints_the_relay_without_a_goal():
    runs = [{"measured": m, "ratios": run.ratios(m)}
            for m in (measured(500, 1000, 400, 300), measured(600, 900, 450, 350))]
    p = run.summarize(runs)
    assert p["floors"]["fuse_relay_load_1m_ns"] == {"median": 425e3, "min": 400e3,
                                                    "max": 450e3}
    assert set(p["ratios"]) == set(run.GOALS)  # (no goal of the relay's)
    assert p["info_ratios"]["load_1m_relay"]["median"] == (0.8 + 0.75) / 2
    result = {"reps": 2, "cpu": 0, "placements": {"pinned": p}, "congestion": "cubic"}
    text = "\n".join(run.table(result))
    relay_rows = [ln for ln in text.splitlines() if "C FUSE relay" in ln]
    assert any(ln.startswith("  C FUSE relay, 1 MiB load ⁷") and "425.0 [400.0–450.0]" in ln
               for ln in relay_rows), relay_rows
    for what in ("1 MiB load / C FUSE relay", "1 MiB store / C FUSE relay"):
        row = next(ln for ln in relay_rows if what in ln)
        assert row.rstrip().endswith("none"), row
    assert "C FUSE relay, per 1 MiB store ⁷" in text and "⁷ C FUSE relay (fuse_relay.c)" in text
