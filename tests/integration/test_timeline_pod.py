"""`ualinkd timeline` on what real pods wrote (issue 32 item 4): a `ualinkd record`
recording of a two-node `ualinkd pod` running the demo's session (a BO in VRAM, a store, an
export, an import over the fabric, a load), and `make demo` itself (its --trace=json file,
its real C clients and libdrm's discovery through the shim), exported as Chrome Trace Event
JSON and checked for structure (tests/unit/test_timeline.py's schema: required keys per
phase, flows paired, each thread's slices in start order) and for the UALink story.

(Named test_timeline_pod.py: pytest's default import mode wants one basename per test
file, and tests/unit has test_timeline.py.)"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from nodes import recording
from test_trace_pod import session, traced_pod

from ualinkd.timeline import problems

REPO = Path(__file__).resolve().parents[2]
TIME = re.compile(r"^(\d\d:\d\d:\d\d\.\d{6}) ")


def structure(doc: dict) -> None:
    """The unit tests' independent schema when they are importable, and `problems`."""
    try:
        sys.path.insert(0, str(REPO / "tests" / "unit"))
        from test_timeline import check_structure  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    check_structure(doc)
    assert problems(doc) == []


def test_a_recorded_pod_session_as_a_timeline(tmp_path: Path):
    """Two process tracks (node0, node1), the client (this test's pid) a thread of each;
    GEM_CREATE a slice with bo_size decoded; GPU_STORE and GPU_LOAD slices; NPA_REQ a flow
    from node1's send to node0's receipt and NPA_RSP back, LOAD too; all flows paired."""
    rec = tmp_path / "rec.jsonl"
    with traced_pod(tmp_path, "--trace", "--trace-file", str(tmp_path / "t.txt")) as (root,
                                                                                    _):
        with recording([root / "node0", root / "node1"], rec):
            session(root)
    out = tmp_path / "timeline.json"
    r = subprocess.run([sys.executable, "-m", "ualinkd", "timeline", str(rec), "-o", str(out)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert f"{out}: 2 nodes" in r.stderr and "0 sends unpaired" in r.stderr, r.stderr
    doc = json.loads(out.read_text())
    structure(doc)
    events = doc["traceEvents"]
    procs = {e["args"]["name"]: e["pid"] for e in events if e["name"] == "process_name"}
    assert set(procs) == {"node0", "node1"}
    me = os.getpid()
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e["name"] == "thread_name"}
    assert threads[(procs["node0"], me)] == threads[(procs["node1"], me)] == f"pid {me}"
    create = next(e for e in events if e["name"] == "AMDGPU_GEM_CREATE")
    assert (create["ph"], create["pid"], create["tid"]) == ("X", procs["node0"], me)
    assert create["args"]["in"]["bo_size"] == 2 << 20 and create["dur"] > 0
    failed = [e for e in events if e.get("args", {}).get("errno")]
    assert [(e["name"], e["args"]["errno"]) for e in failed] == [
        ("AMDGPU_UALINK_HANDLE", "ENOENT")]
    assert {e["name"] for e in events if e["ph"] == "X" and e["cat"] == "gpu"} == {
        "GPU_STORE", "GPU_LOAD"}
    flows = {}
    for e in events:
        if e["ph"] in "sf":
            flows.setdefault(e["id"], {})[e["ph"]] = e
    sides = {(f["s"]["name"], f["s"]["pid"], f["f"]["pid"]) for f in flows.values()}
    assert {("NPA_REQ", procs["node1"], procs["node0"]),
            ("NPA_RSP", procs["node0"], procs["node1"]),
            ("LOAD", procs["node1"], procs["node0"])} <= sides, sides
    assert doc["otherData"]["unpaired_sends"] == 0


@pytest.mark.skipif(not (REPO / "libualink_c/build/share").exists(),
                    reason="the C examples are built by `make c`")
def test_make_demo_ends_with_a_timeline_and_its_story_in_order(tmp_path: Path):
    """`make demo`'s script: its trace section is in start-time order and holds no libdrm
    discovery (no VERSION or AMDGPU_INFO of the discovery program), and the story's steps
    come in the order they happened; it ends by writing a timeline and saying where."""
    out = tmp_path / "demo-timeline.json"
    r = subprocess.run(["bash", str(REPO / "libualink_c/examples/demo.sh")], cwd=REPO,
                       capture_output=True, text=True, timeout=240,
                       env=dict(os.environ, UALINK_DEMO_TIMELINE=str(out)))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    section = r.stdout.split("what the daemons traced", 1)[1].split("\n== ", 1)[0]
    lines = section.splitlines()[1:]
    stamps = [m.group(1) for line in lines if (m := TIME.match(line))]
    assert len(stamps) > 20 and stamps == sorted(stamps), section
    assert "DRM_IOCTL_VERSION" not in section and "AMDGPU_INFO" not in section, section
    story = ["op=EXPORT", "op=IMPORT", "HELLO{", "NPA_REQ{", "NPA_RSP{", "LOAD{",
             "STORE{", "NPA_REVOKE{", "NPA_RELEASE{", "= -1 EFAULT"]
    at = [next(i for i, line in enumerate(lines) if s in line) for s in story]
    assert at == sorted(at), list(zip(story, at, strict=True))
    assert r.stdout.rstrip().endswith(f"timeline: {out} (open it in https://ui.perfetto.dev "
                                      "or chrome://tracing)"), r.stdout[-500:]
    doc = json.loads(out.read_text())
    structure(doc)
    assert doc["otherData"]["flows"] >= 8 and doc["otherData"]["unpaired_sends"] == 0
    # the discovery is in the picture (only the text leaves it out): libdrm's queries
    assert any(e["name"] == "AMDGPU_INFO" for e in doc["traceEvents"])
