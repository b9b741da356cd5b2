"""`ualinkd timeline` (issue 32 item 4): a recording as Chrome Trace Event JSON, from the
trace's own records (the real ioctl table decodes them), checked against the format's
per-phase keys (a JSON Schema written here from the Trace Event Format document, not from
the code), flows paired send → receipt across nodes, each thread's slices in start order
and nested; and the `--text` view in start order without libdrm's discovery."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from ualinkd.abi import ioctls as tbl
from ualinkd.abi.ioc import IoctlCmd
from ualinkd.cli.main import main
from ualinkd.timeline import (
    as_record,
    chrome_trace,
    in_start_order,
    problems,
    text_line,
    without_discovery,
)
from ualinkd.trace import FabricRecord, FileRecord, GpuAccessRecord, TraceRecord

T0 = 1_800_000_000.0
NAMES = {0: "node0", 1: "node1"}.get

# The Trace Event Format (Google's "Trace Event Format" document): every event has ph;
# complete events X need name, ts, dur, pid, tid; instants i a scope s; flow events s/f an
# id; metadata M a name among process_name/thread_name/... and args.
_NUM = {"type": "number"}
SCHEMA = {
    "type": "object",
    "required": ["traceEvents"],
    "properties": {
        "displayTimeUnit": {"enum": ["ms", "ns"]},
        "traceEvents": {"type": "array", "items": {"oneOf": [
            {"properties": {"ph": {"const": "X"}, "name": {"type": "string"}, "ts": _NUM,
                            "dur": {"type": "number", "minimum": 0}, "pid": {"type": "integer"},
                            "tid": {"type": "integer"}, "args": {"type": "object"}},
             "required": ["ph", "name", "ts", "dur", "pid", "tid"]},
            {"properties": {"ph": {"const": "i"}, "s": {"enum": ["g", "p", "t"]}, "ts": _NUM},
             "required": ["ph", "name", "ts", "pid", "tid", "s"]},
            {"properties": {"ph": {"enum": ["s", "f"]}, "id": {"type": "integer"}, "ts": _NUM,
                            "bp": {"const": "e"}},
             "required": ["ph", "name", "id", "ts", "pid", "tid", "cat"]},
            {"properties": {"ph": {"const": "M"},
                            "name": {"enum": ["process_name", "thread_name",
                                              "process_sort_index", "thread_sort_index"]},
                            "args": {"type": "object"}},
             "required": ["ph", "name", "pid", "args"]},
        ]}},
    },
}


def check_structure(doc: dict[str, Any]) -> None:
    """The checks the tests make themselves, apart from the module's own `problems`."""
    jsonschema.validate(doc, SCHEMA)
    events = doc["traceEvents"]
    body = [e for e in events if e["ph"] != "M"]
    assert all(e["ph"] == "M" for e in events[:len(events) - len(body)]), "metadata first"
    assert [e["ts"] for e in body] == sorted(e["ts"] for e in body), "start-time order"
    per_track: dict[tuple[int, int], list[float]] = defaultdict(list)
    for e in body:
        if e["ph"] == "X":
            per_track[(e["pid"], e["tid"])].append(e["ts"])
    assert all(ts == sorted(ts) for ts in per_track.values())
    starts = {e["id"]: e for e in body if e["ph"] == "s"}
    ends = {e["id"]: e for e in body if e["ph"] == "f"}
    assert starts.keys() == ends.keys()
    assert len(starts) == sum(e["ph"] == "s" for e in body)
    names = {(e["pid"], e["tid"]) for e in events if e["name"] == "thread_name"}
    assert {(e["pid"], e["tid"]) for e in body if e["pid"]} <= names
    assert problems(doc) == []


def ioctl(pid: int, node: str, name: str, data: bytes, out: bytes, t: float,
          result: int = 0, file: int = 1) -> dict[str, Any]:
    spec = next(s for s in tbl.all_entries() if s.name == name)
    return TraceRecord(pid, node, 128, spec.cmd, spec, data, result, out, 0, t, 0.0002,
                       file).as_dict()


def ualink(node: str, direction: str, src: int, dst: int, dwords: tuple[int, int, int, int],
           t: float, duration: float = 0.0) -> dict[str, Any]:
    result = 0 if direction == "send" else None
    return FabricRecord.ualink(node, direction, src, dst, dwords, NAMES, result, t,
                               duration).as_dict()


def session() -> list[dict[str, Any]]:
    """A two-node session as the trace writes it: a GEM_CREATE, a store, an NPA_REQ sent by
    node1 and received by node0 (twice: the same message again, paired in order), a
    data-plane LOAD, a close from the kernel (pid 0), a queue doorbell, a kind this build
    does not know, a lost count."""
    create_in = (2 << 20).to_bytes(8, "little") + (4096).to_bytes(8, "little") + \
        (4).to_bytes(8, "little") + bytes(8)
    req = (3 | (1 << 10), 0x1234, 0x5678, 0)  # NPA_REQ: its type in dword 0's bits 9..0
    recs = [
        FileRecord("open", 100, "node0", 1, "dri/renderD128", 128, start=T0).as_dict(),
        ioctl(100, "node0", "AMDGPU_GEM_CREATE", create_in, (1).to_bytes(4, "little")
              + bytes(28), T0 + 0.001),
        GpuAccessRecord(100, "node0", 128, 0, "store", 0x100000000, 6, 6, b"hello\0",
                        T0 + 0.002, 0.0001, 1).as_dict(),
        ualink("node1", "send", 1, 0, req, T0 + 0.003, 0.004),
        ualink("node1", "send", 1, 0, req, T0 + 0.0035, 0.004),  # overlaps the first
        ualink("node0", "recv", 1, 0, req, T0 + 0.0031),
        ualink("node0", "recv", 1, 0, req, T0 + 0.0036),
        FabricRecord("node1", "send", "LOAD", 1, 0, "node1", "node0",
                     {"npa_byte_addr": 0xA00000, "length": 6}, 0, T0 + 0.010,
                     0.001).as_dict(),
        FabricRecord("node0", "recv", "LOAD", 1, 0, "node1", "node0",
                     {"npa_byte_addr": 0xA00000, "length": 6}, 0, T0 + 0.0102,
                     0.0001).as_dict(),
        {"v": 2, "type": "queue", "time": T0 + 0.011, "pid": 200, "node": "node1",
         "minor": 0, "accel": 1, "queue_id": 3, "queue_type": "sdma", "event": "doorbell",
         "value": 0x40, "detail": ""},
        {"v": 2, "type": "frobnicate", "time": T0 + 0.012, "duration": 0.001,
         "node": "node1", "pid": 200, "what": "x" * 1000},
        {"v": 2, "type": "lost", "count": 3},
        FileRecord("release", 0, "node0", 1, "dri/renderD128", start=T0 + 0.02).as_dict(),
    ]
    return in_start_order(recs)


def test_a_session_is_tracks_slices_and_flows():
    """One process per node, named; the client pid its own thread; the ioctl a complete
    slice with its decoded arguments; each receipt the end of a flow from the send it
    answers, on the other node, in order; a queue record on a queue's thread; an unknown
    kind a slice with its fields; the lost count a global instant."""
    doc = chrome_trace(session(), "s.jsonl")
    check_structure(doc)
    events = doc["traceEvents"]
    procs = {e["args"]["name"]: e["pid"] for e in events if e["name"] == "process_name"}
    assert set(procs) == {"node0", "node1"}
    threads = {(e["pid"], e["args"]["name"]): e["tid"] for e in events
               if e["name"] == "thread_name"}
    assert threads[(procs["node0"], "pid 100")] == 100
    assert (procs["node1"], "pid 200 queue 3 (sdma)") in threads
    create = next(e for e in events if e["name"] == "AMDGPU_GEM_CREATE")
    assert (create["ph"], create["pid"], create["tid"]) == ("X", procs["node0"], 100)
    assert create["args"]["in"]["bo_size"] == 2 << 20
    assert create["args"]["in"]["domains"]["names"] == ["AMDGPU_GEM_DOMAIN_VRAM"]
    assert create["args"]["out"]["handle"] == 1 and create["ts"] == pytest.approx(1000, abs=0.5)
    assert create["dur"] == pytest.approx(200, abs=0.5)
    store = next(e for e in events if e["name"] == "GPU_STORE")
    assert store["args"]["data"] == b"hello\0".hex() and store["args"]["va"] == "0x100000000"
    close = next(e for e in events if e["name"] == "close dri/renderD128")
    assert close["tid"] == 100  # the kernel's release, on the opener's thread
    flows = [e for e in events if e["ph"] in "sf"]
    assert [(e["name"], e["ph"], e["pid"]) for e in flows] == [
        ("NPA_REQ", "s", procs["node1"]), ("NPA_REQ", "f", procs["node0"]),
        ("NPA_REQ", "s", procs["node1"]), ("NPA_REQ", "f", procs["node0"]),
        ("LOAD", "s", procs["node1"]), ("LOAD", "f", procs["node0"])]
    by_id = defaultdict(list)
    for e in flows:
        by_id[e["id"]].append(e["ts"])
    # (a wall-clock time near 1.8e9 s is a float good to some 0.2 µs)
    assert list(by_id.values()) == [pytest.approx(ts, abs=0.5) for ts in (
        [3000, 3100], [3500, 3600], [10000, 10200])]
    assert doc["otherData"]["flows"] == 3 and doc["otherData"]["unpaired_sends"] == 0
    # the two NPA_REQ round trips overlap: the second goes to a second lane of node1's sends
    sends = [e for e in events if e["ph"] == "X" and e["name"] == "NPA_REQ"
             and e["pid"] == procs["node1"]]
    assert len({e["tid"] for e in sends}) == 2
    lane_names = {e["args"]["name"] for e in events if e["name"] == "thread_name"
                  and e["pid"] == procs["node1"]}
    assert {"fabric send", "fabric send (2)"} <= lane_names
    doorbell = next(e for e in events if e["name"] == "QUEUE_DOORBELL")
    assert doorbell["ph"] == "i" and doorbell["args"]["value"] == 0x40
    odd = next(e for e in events if e["name"] == "FROBNICATE")
    assert odd["ph"] == "X" and odd["dur"] == pytest.approx(1000, abs=0.5)
    assert odd["args"]["what"].startswith("x" * 256) and len(odd["args"]["what"]) < 300
    lost = next(e for e in events if e.get("cat") == "lost")
    assert lost["ph"] == "i" and lost["s"] == "g" and doc["otherData"]["lost"] == 3


def test_a_receipt_without_its_send_is_no_flow():
    """A recording of one node only: its receipts have no send to pair with."""
    recs = [r for r in session() if r.get("node") != "node1"]
    doc = chrome_trace(recs)
    check_structure(doc)
    assert not [e for e in doc["traceEvents"] if e["ph"] in "sf"]


@pytest.mark.parametrize("break_it, said", [
    (lambda ev: ev.pop("dur"), "no dur"),
    (lambda ev: ev.update(ts=-5.0), "before the event ahead"),
])
def test_problems_finds_a_broken_slice(break_it, said):
    doc = chrome_trace(session())
    create = next(e for e in doc["traceEvents"] if e["name"] == "AMDGPU_GEM_CREATE")
    break_it(create)
    assert any(said in p for p in problems(doc)), problems(doc)


def test_problems_finds_unpaired_flows_and_overlaps():
    doc = chrome_trace(session())
    events = doc["traceEvents"]
    events.remove(next(e for e in events if e["ph"] == "f"))
    create = next(e for e in events if e["name"] == "AMDGPU_GEM_CREATE")
    create["dur"] = 1050.0  # now it ends inside the thread's GPU_STORE (at 2000 µs)
    said = problems(doc)
    assert any("never finished" in p for p in said), said
    assert any("without nesting" in p for p in said), said


def test_text_is_the_trace_text_in_start_order():
    """--text: each record prints as --trace would have printed it (its record rebuilt
    from the JSON), in start order; an unknown kind in the same shape."""
    recs = session()
    lines = [text_line(r) for r in recs]
    for rec, line in zip(recs, lines, strict=True):
        back = as_record(rec)
        if back is not None:
            assert line == back.text()
    assert "DRM_IOCTL_AMDGPU_GEM_CREATE({bo_size=0x200000" in lines[1]
    assert lines[-1].endswith("node0 close(dri/renderD128) = 0")
    assert any(" QUEUE_DOORBELL(minor=0, accel=1, queue_id=3" in line for line in lines)
    assert any(line.startswith("-- the recorder lost 3 records") for line in lines)


def test_without_discovery_leaves_out_processes_that_only_looked():
    """libdrm's device discovery (VERSION, GET_CAP, AMDGPU_INFO and nothing else) goes,
    with its open and its kernel-side close; a process that also created a BO stays, less
    its own discovery calls."""
    version = ioctl(300, "node0", "VERSION", bytes(64), bytes(64), T0 - 0.5, file=9)
    info = ioctl(300, "node0", "AMDGPU_INFO", bytes(32), b"", T0 - 0.4, file=9)
    looked = [FileRecord("open", 300, "node0", 9, "dri/renderD128", 128,
                         start=T0 - 0.6).as_dict(), version, info,
              FileRecord("release", 0, "node0", 9, "dri/renderD128", start=T0 - 0.3).as_dict()]
    also = ioctl(100, "node0", "VERSION", bytes(64), bytes(64), T0 + 0.0005)
    recs = in_start_order([*looked, also, *session()])
    kept = without_discovery(recs)
    assert not [r for r in kept if r.get("pid") == 300 or r.get("file") == 9]
    assert also not in kept and len(kept) == len(recs) - 5
    assert [r for r in kept if r.get("pid") == 100]


def test_the_command(tmp_path: Path, capsys):
    """`ualinkd timeline FILE -o OUT` writes the picture and says where; `--text` prints;
    a file that is not a recording is refused with its line (exit 2)."""
    rec = tmp_path / "rec.jsonl"
    rec.write_text("".join(json.dumps(r) + "\n" for r in reversed(session())))
    assert main(["timeline", str(rec), "-o", str(tmp_path / "t.json")]) == 0
    assert f"{tmp_path / 't.json'}: 2 nodes" in capsys.readouterr().err
    check_structure(json.loads((tmp_path / "t.json").read_text()))
    assert main(["timeline", str(rec)]) == 0  # the default name beside the recording
    assert (tmp_path / "rec.timeline.json").exists()
    capsys.readouterr()
    assert main(["timeline", str(rec), "--text", "--pid", "100"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("node0 open(dri/renderD128) = 3") or "open(" in out[0]
    assert not [line for line in out if "[pid 200]" in line]
    assert [line[:15] for line in out if line[:2].isdigit()] == sorted(
        line[:15] for line in out if line[:2].isdigit())
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"v": 2, "type": "ioctl", "node": "n"}\n')
    assert main(["timeline", str(bad)]) == 2
    assert "line 1: `pid` is missing" in capsys.readouterr().err
    bad.write_text('{"v": 9, "type": "ioctl"}\n')
    assert main(["timeline", str(bad)]) == 2
    assert "trace schema 9 is newer than this build reads" in capsys.readouterr().err
    # a recorder killed mid-write: the partial last line is named and left out
    cut = tmp_path / "cut.jsonl"
    cut.write_text(rec.read_text() + '{"v": 2, "type": "ioctl", "ti')
    assert main(["timeline", str(cut), "-o", str(tmp_path / "cut.json")]) == 0
    assert f"line {len(session()) + 1} is a partial record" in capsys.readouterr().err
    assert json.loads((tmp_path / "cut.json").read_text())["otherData"]["records"] == len(
        session())


def test_kfd_calls_decode_by_the_kfd_table():
    """node.py records a /dev/kfd call with minor 0: its name is the KFD table's."""
    spec = tbl.kfd_lookup(1)
    assert spec is not None
    rec = TraceRecord(7, "node0", 0, spec.cmd, spec, bytes(IoctlCmd.decode(spec.cmd).size), 0,
                      bytes(IoctlCmd.decode(spec.cmd).size), None, T0, 0.0001, 2).as_dict()
    assert text_line(rec) == as_record(rec).text()  # type: ignore[union-attr]
    assert " kfd " in text_line(rec) and spec.full_name in text_line(rec)
