"""`ualinkd replay --mount DIR` refuses, in one line and exit status 2, a DIR that is not a
ualinkd node's mount, with the check `ualinkd run` makes (podinfo.not_a_node_mount): a
replay into a typo'd or plain directory would otherwise report every call as a difference,
or, for a recording of opens only, "no differences" about a node it never reached."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ualinkd.cli.main import main

OPENED = {"v": 2, "type": "open", "time": 0.5, "pid": 10, "node": "node0", "file": 1,
          "path": "dri/renderD128"}


def _recording(tmp_path: Path) -> Path:
    path = tmp_path / "rec.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in
                            (OPENED, {**OPENED, "type": "release", "time": 1.0})))
    return path


@pytest.mark.parametrize(("mount", "why"), [
    ("plain", "not a mount point"),
    ("missing", "it does not exist"),
    ("rec.jsonl", "not a directory"),
    ("/proc", "a proc mount, not a node's FUSE mount"),
])
@pytest.mark.parametrize("named", [False, True])
def test_a_mount_that_is_not_a_nodes_is_refused_in_one_line(tmp_path, capsys, mount, why,
                                                            named):
    rec = _recording(tmp_path)
    (tmp_path / "plain" / "dri").mkdir(parents=True)  # a node's file names, but no mount
    (tmp_path / "plain" / "dri" / "renderD128").write_bytes(b"")
    path = mount if mount.startswith("/") else str(tmp_path / mount)
    arg = f"node0={path}" if named else path
    assert main(["replay", str(rec), "--mount", arg]) == 2
    out, err = capsys.readouterr()
    assert err == f"ualinkd replay: {path} is not a ualinkd node's mount ({why})\n"
    assert out == ""  # nothing replayed


def test_a_symlink_to_a_directory_is_named_by_where_it_leads(tmp_path, capsys):
    rec = _recording(tmp_path)
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert main(["replay", str(rec), "--mount", str(tmp_path / "link")]) == 2
    assert capsys.readouterr().err == (f"ualinkd replay: {tmp_path / 'real'} is not a "
                                       "ualinkd node's mount (not a mount point)\n")
