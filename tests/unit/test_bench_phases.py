"""The per-phase breakdown of `make bench` (benchmarks/run.py `phases`): which daemon stamp
ends which phase of a first import, and samples lacking a stamp are skipped, not guessed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import run


def stamps(tmp: Path, name: str, rows: list[tuple[int, str, int]]) -> run.Stamps:
    path = tmp / name
    path.write_text(json.dumps(rows))
    return run.Stamps(path)


def test_phases_follow_the_stamps(tmp_path):
    sample = {"t0": 1000, "t1": 2000, "t2": 2100, "t3": 2300}
    importer = stamps(tmp_path, "imp", [
        (500, "msg_in", 7),  # before the sample: not this import's
        (1010, "ioctl_in", 0), (1100, "msg_out", 3), (1800, "msg_in", 4),
        (1900, "ioctl_out", 0)])
    exporter = stamps(tmp_path, "exp", [
        (1120, "msg_out", 6),  # the previous BO's NPA_REVOKE, late: not an edge
        (1150, "msg_in", 3), (1300, "msg_out", 4), (1310, "msg_out", 6),
        (2500, "msg_out", 6)])
    per, seen = run.phases([sample], exporter, importer)
    assert {k: v[0] for k, v in per.items()} == {
        "fuse_in": 10, "manager": 90, "fabric_send": 50, "exporter": 150,
        "reply_fabric": 500, "reply_importer": 100, "fuse_out": 100, "token_open": 100,
        "fd_to_handle": 200, "total": 1300}
    assert seen == {"samples": 1, "skipped": 0, "other_msgs": 2}


def test_a_sample_missing_an_edge_is_skipped(tmp_path):
    sample = {"t0": 1000, "t1": 2000, "t2": 2100, "t3": 2300}
    importer = stamps(tmp_path, "imp", [(1010, "ioctl_in", 0), (1100, "msg_out", 3),
                                        (1900, "ioctl_out", 0)])
    exporter = stamps(tmp_path, "exp", [(1150, "msg_in", 3), (1300, "msg_out", 4)])
    per, seen = run.phases([sample], exporter, importer)  # the NPA_RSP never came in
    assert seen["skipped"] == 1 and per["total"] == []
    exporter = stamps(tmp_path, "exp2", [(1150, "msg_in", 3), (1300, "msg_out", 5)])
    importer = stamps(tmp_path, "imp2", [(1010, "ioctl_in", 0), (1100, "msg_out", 3),
                                         (1800, "msg_in", 5), (1900, "ioctl_out", 0)])
    per, seen = run.phases([sample], exporter, importer)  # NPA_FAIL: no NPA_RSP edge
    assert seen["skipped"] == 1 and per["total"] == []
