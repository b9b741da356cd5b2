"""What `ualinkd replay` makes of a recording before it issues anything (issue 12 item 2):
every field a replay later reads is checked on the first pass, so a malformed, newer,
truncated or empty recording is one line naming the line and the field (exit 2), never a
traceback halfway through a replay."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import ualink_testkit as kit

from ualinkd.cli.main import main
from ualinkd.replay import session

# (replays into plain directories: conftest.py's plain_dirs_as_mounts)
pytestmark = pytest.mark.usefixtures("plain_dirs_as_mounts")

GOOD = {"v": 2, "type": "ioctl", "time": 1.0, "duration": 0.0, "pid": 10, "node": "node0",
        "file": 1, "ioctl": "GEM_CLOSE", "cmd": "0x40086409", "in_hex": "0100000000000000",
        "out_hex": "", "result": 0, "mem": [], "fds": []}
MEM = {"op": "read", "addr": 0x9000, "len": 4, "hex": "01000000", "result": 0}


def _without(rec: dict, field: str) -> dict:
    return {k: v for k, v in rec.items() if k != field}


@pytest.mark.parametrize(("rec", "why"), [
    (_without(GOOD, "time"), "line 2: `time` is missing"),
    ({**GOOD, "v": 99}, "line 2: trace schema 99 is newer than this build reads (schema 2)"),
    ({**GOOD, "v": "2"}, "line 2: `v` is not a schema number"),
    ({**GOOD, "in_hex": "zz"}, 'line 2: `in_hex` is not a hex string ("zz")'),
    ({**GOOD, "out_hex": None}, "line 2: `out_hex` is not a hex string (null)"),
    ({**GOOD, "cmd": "nope"}, 'line 2: `cmd` is not a 32-bit hex ioctl number ("nope")'),
    ({**GOOD, "time": "yesterday"}, 'line 2: `time` is not a number of seconds ("yesterday")'),
    ({**GOOD, "time": float("nan")}, "line 2: `time` is not a number of seconds (NaN)"),
    ({**GOOD, "duration": True}, "line 2: `duration` is not a number of seconds (true)"),
    ({**GOOD, "node": 0}, "line 2: `node` is not a string (0)"),
    ({**GOOD, "pid": None}, "line 2: `pid` is not an integer (null)"),
    ({**GOOD, "file": "1"}, 'line 2: `file` is not a file id or null ("1")'),
    (_without(GOOD, "ioctl"), "line 2: `ioctl` is missing"),
    (_without(GOOD, "result"), "line 2: `result` is missing"),
    ({**GOOD, "in": []}, "line 2: `in` is not an object ([])"),
    ({**GOOD, "mem": {}}, "line 2: `mem` is not a list ({})"),
    ({**GOOD, "mem": [5]}, "line 2: `mem[0]` is not an object"),
    ({**GOOD, "mem": [MEM, _without(MEM, "addr")]}, "line 2: mem[1].`addr` is missing"),
    ({**GOOD, "mem": [{**MEM, "hex": "0"}]}, 'line 2: mem[0].`hex` is not a hex string ("0")'),
    ({**GOOD, "mem": [{**MEM, "addr": -1}]},
     "line 2: mem[0].`addr` is not an unsigned 64-bit integer (-1)"),
    ({**GOOD, "mem": [{**MEM, "op": "peek"}]}, 'line 2: mem[0].`op` is not "read" or "write"'),
    ({**GOOD, "fds": [{"fd": 3}]}, "line 2: fds[0].`key` is missing"),
    ({"v": 2, "type": "open", "time": 0.0, "pid": 1, "node": "node0", "file": 1},
     "line 2: `path` is missing"),
    ({"v": 2, "type": "open", "time": 0.0, "pid": 1, "node": "node0", "file": 1,
      "path": "dmabuf/7", "token": "x"}, 'line 2: `token` is not an integer or null ("x")'),
    ({"v": 2, "type": "release", "time": 0.0, "pid": 1, "node": "node0", "file": None},
     "line 2: `file` is not a file id (null)"),
    ({"v": 2, "type": "gpu", "time": 0.0, "pid": 1, "node": "node0", "file": 1, "op": "load",
      "va": 4096, "length": 4, "result": 4, "data_hex": "xyz"},
     'line 2: `data_hex` is not a hex string ("xyz")'),
    ({"v": 2, "type": "gpu", "time": 0.0, "pid": 1, "node": "node0", "file": 1, "op": "peek",
      "va": 4096, "length": 4, "result": 4}, 'line 2: `op` is not "load" or "store"'),
    ({"v": 2, "type": "gpu", "time": 0.0, "pid": 1, "node": "node0", "file": 1, "op": "load",
      "length": 4, "result": 4}, "line 2: `va` is missing"),
    ({"v": 2, "type": "gpu", "time": 0.0, "pid": 1, "node": "node0", "file": 1, "op": "load",
      "va": 1 << 63, "length": 4, "result": 4}, "line 2: `va` is not an offset below 2**63"),
    ({"v": 2, "type": "gpu", "time": 0.0, "pid": 1, "node": "node0", "file": 1, "op": "load",
      "va": 0, "length": 1 << 40, "result": 4},
     "line 2: `length` is not a byte count up to 0x7ffff000"),
    ({**GOOD, "mem": [{**MEM, "len": 1 << 60}]},
     "line 2: mem[0].`len` is not a byte count up to 0x7ffff000"),
    ({"v": 2, "type": "lost", "count": "3"}, 'line 2: `count` is not an integer ("3")'),
    ({"v": 2, "type": 7}, "line 2: not a trace record"),
])
def test_a_malformed_record_is_refused_naming_its_line_and_field(rec, why):
    lines = [json.dumps(GOOD) + "\n", json.dumps(rec) + "\n"]
    with pytest.raises(session.RecordingError) as e:
        session.index_records(enumerate(lines))
    assert why in str(e.value)
    with pytest.raises(session.RecordingError):
        session.load(lines)


def test_the_records_a_trace_writes_pass_the_checks():
    """The fields the checks ask for are the ones trace.py writes (a fabric record, which
    a replay does not issue, is not checked beyond its type)."""
    opened = {"v": 2, "type": "open", "time": 0.5, "duration": 0.0, "pid": 1, "node": "node0",
              "file": 1, "path": "dri/renderD128", "minor": 128, "token": None, "key": None,
              "result": 0, "errno": None}
    gpu = {"v": 2, "type": "gpu", "time": 2.0, "duration": 0.0, "pid": 1, "node": "node0",
           "file": 1, "op": "store", "va": 4096, "length": 2, "result": 2, "data_hex": "abcd"}
    recs = [opened, {**GOOD, "mem": [MEM], "fds": [{"fd": 3, "key": None, "result": 0}]}, gpu,
            {"v": 2, "type": "fabric", "time": 1.0}, {"v": 2, "type": "lost", "count": 1},
            {**opened, "type": "release"}]
    assert session.load([json.dumps(r) for r in recs]) == recs


def _replay(tmp_path: Path, *args: str) -> int:
    return main(["replay", *args, "--mount", str(tmp_path)])


def test_a_malformed_recording_exits_2_with_one_line(tmp_path, capsys):
    path = tmp_path / "rec.jsonl"
    path.write_text(json.dumps(_without(GOOD, "time")) + "\n")
    assert _replay(tmp_path, str(path)) == 2
    err = capsys.readouterr().err
    assert err == f"ualinkd replay: {path}: line 1: `time` is missing\n"


def test_a_recording_that_does_not_exist_exits_2_with_one_line(tmp_path, capsys):
    path = tmp_path / "missing.jsonl"
    assert _replay(tmp_path, str(path)) == 2
    assert capsys.readouterr().err == (f"ualinkd replay: {path}: cannot read it "
                                       "(No such file or directory)\n")


def _numbered(text: bytes) -> list[tuple[int, bytes]]:
    out, at = [], 0
    for line in text.splitlines(keepends=True):
        out.append((at, line))
        at += len(line)
    return out


def test_a_partial_last_record_is_left_out_and_named():
    """A recorder killed mid-write leaves a last line with no newline that is not JSON:
    left out, its line number kept for the edge to report; the records before it stand."""
    whole = json.dumps(GOOD) + "\n"
    index = session.index_records(_numbered((whole * 2 + whole[:40]).encode()))
    assert len(index.records) == 2 and index.partial == 3
    assert session.index_records(_numbered((whole * 2).encode())).partial is None
    # a last line that is whole JSON without its newline is a record like any other
    index = session.index_records(_numbered((whole + whole.rstrip("\n")).encode()))
    assert len(index.records) == 2 and index.partial is None


def test_a_bad_line_elsewhere_is_still_refused():
    whole = json.dumps(GOOD) + "\n"
    for text, why in ((whole + whole[:40] + "\n" + whole, "line 2: not JSON"),
                      (whole + whole[:40] + "\n", "line 2: not JSON"),  # it has its newline
                      (whole + '{"v": 2}', "line 2: not a trace record")):  # JSON, no record
        with pytest.raises(session.RecordingError, match=why):
            session.index_records(_numbered(text.encode()))
    # lines paired by hand, one without its newline before others
    with pytest.raises(session.RecordingError, match="line 1: not JSON"):
        session.index_records([(0, "{"), (1, whole)])


def test_replay_of_a_truncated_recording_reports_it_and_replays_the_rest(tmp_path):
    from io import StringIO

    from ualinkd.replay.issue import run

    (tmp_path / "dri").mkdir()
    (tmp_path / "dri/renderD128").write_bytes(b"")
    opened = {"v": 2, "type": "open", "time": 0.5, "pid": 1, "node": "node0", "file": 1,
              "path": "dri/renderD128"}
    path = tmp_path / "rec.jsonl"
    whole = [json.dumps(opened), json.dumps({**opened, "type": "release", "time": 0.6})]
    path.write_text("\n".join(whole) + "\n" + json.dumps(GOOD)[:30])
    out = StringIO()
    (d,) = run(str(path), {"": str(tmp_path)}, out=out)
    assert d.what == "the recording ends in a partial record (line 3), left out"
    assert out.getvalue().splitlines()[-1].endswith(
        "replayed 2 records (0 ioctls and GPU accesses) from "
        f"{path}: 1 about the recording itself")


OPENED = {"v": 2, "type": "open", "time": 0.5, "pid": 1, "node": "node0", "file": 1,
          "path": "dri/renderD128"}
RELEASED = {**OPENED, "type": "release", "time": 0.6}


@pytest.mark.parametrize(("recs", "why"), [
    ((), "no calls to replay"),
    (({"v": 2, "type": "fabric", "time": 1.0},), "no calls to replay"),
    (({"v": 2, "type": "lost", "count": 3},), "no calls to replay (the recording lost 3 records)"),
])
def test_a_recording_with_no_call_in_it_is_refused(tmp_path, capsys, recs, why):
    path = kit.write_recording(tmp_path, *recs)
    assert _replay(tmp_path, str(path)) == 2
    assert capsys.readouterr().err == f"ualinkd replay: {path}: {why}\n"


def test_a_pid_filter_that_leaves_nothing_is_refused(tmp_path, capsys):
    path = kit.write_recording(tmp_path, OPENED, RELEASED)
    assert _replay(tmp_path, str(path), "--pid", "7") == 2
    assert capsys.readouterr().err.endswith(
        ": no calls to replay from pid 7 (the recording's pids: 1)\n")
    assert _replay(tmp_path, str(path), "--pid", "1") == 0


def test_a_mount_for_a_node_the_recording_never_has_is_refused(tmp_path, capsys):
    path = kit.write_recording(tmp_path, OPENED, {**OPENED, "node": "node1", "file": 2}, RELEASED)
    assert main(["replay", str(path), "--mount", f"node0={tmp_path}",
                 "--mount", f"nod1={tmp_path}"]) == 2
    assert capsys.readouterr().err == (f"ualinkd replay: {path}: --mount nod1=: the recording "
                                       "has no node 'nod1' (its nodes: node0, node1)\n")
    assert main(["replay", str(path), "--mount", f"node0={tmp_path}",
                 "--mount", f"node1={tmp_path}"]) == 0
