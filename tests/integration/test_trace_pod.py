"""`ualinkd pod --trace`, end to end (issue 12): a demo-like session across two real node
daemons — a BO in VRAM, a GPU store, an export, an import over the fabric, a GPU load — traced
as strace-like text into --trace-file, and as JSON on stdout that a JSON reader takes line by
line (the pod's ready lines go to stderr then)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from nodes import Client, recording

MIB = 1 << 20
VA0, VA1 = 0x100000000, 0x7F0000000000
LINE_TIME = re.compile(r"^\d\d:\d\d:\d\d\.\d{6} ")
DURATION = re.compile(r" <\d+\.\d{6}>$")


@contextlib.contextmanager
def traced_pod(tmp_path: Path, *trace_args: str) -> Iterator[tuple[Path, list[str]]]:
    """A two-node `ualinkd pod` with the given trace options; yields its root and, once it
    stopped (SIGINT, as Ctrl-C), its [stdout, stderr]."""
    root = tmp_path / "pod"
    out, err = tmp_path / "pod.out", tmp_path / "pod.err"
    with open(out, "w") as o, open(err, "w") as e:
        proc = subprocess.Popen([sys.executable, "-m", "ualinkd", "pod", "--nodes", "2",
                                 "--root", str(root), *trace_args], stdout=o, stderr=e,
                                stdin=subprocess.DEVNULL)
    result: list[str] = []
    try:
        deadline = time.monotonic() + 60
        ready_in = err if "--trace-file" not in " ".join(trace_args) else out
        while ready_in.read_text().count(" ready: ") < 2:
            assert proc.poll() is None, err.read_text()
            assert time.monotonic() < deadline, err.read_text()
            time.sleep(0.05)
        yield root, result
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0, err.read_text()
        result += [out.read_text(), err.read_text()]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def session(root: Path) -> tuple[int, int]:
    """What `make demo` does, through the real render nodes; the export's handle."""
    with Client(str(root / "node0/dri/renderD128")) as a, \
            Client(str(root / "node1/dri/renderD128")) as b:
        bo = a.bo_create(2 * MIB, domains=4)
        a.va_map(bo, VA0, 2 * MIB)
        assert a.gpu_write(VA0, b"hello\0") == 6
        handle = a.export(bo)
        with pytest.raises(OSError):
            a.export(bo + 5)  # ENOENT
        fd = b.import_(handle)
        imported = b.fd_to_handle(fd)
        os.close(fd)
        b.va_map(imported, VA1, 2 * MIB)
        assert b.gpu_read(VA1, 6) == b"hello\0"
        return handle


def test_text_trace_file_reads_like_strace(tmp_path):
    """--trace --trace-file: hex addresses and sizes, named flags and enums, the 128-bit
    handle as one number, `-1 ENOENT (No such file or directory)`, -tt times and -T
    durations, GPU loads/stores and the fabric's NPA_REQ/NPA_RSP/LOAD with both ends; the
    ready lines stay on stdout, the trace is only in the file and outlives the pod."""
    trace = tmp_path / "trace.txt"
    with traced_pod(tmp_path, "--trace", "--trace-file", str(trace)) as (root, result):
        lo, hi = session(root)
    out, _ = result
    assert out.count(" ready: ") == 2 and "DRM_IOCTL" not in out
    text = trace.read_text()
    lines = text.splitlines()
    assert all(LINE_TIME.match(line) for line in lines), lines[:3]
    for needle in (
        "node0 renderD128 DRM_IOCTL_AMDGPU_GEM_CREATE({bo_size=0x200000, alignment=",
        "domains=AMDGPU_GEM_DOMAIN_VRAM, domain_flags=0} => {handle=",
        f"operation=MAP, flags=AMDGPU_VM_PAGE_READABLE|AMDGPU_VM_PAGE_WRITEABLE, "
        f"va_address={VA0:#x}, offset_in_bo=0, map_size=0x200000",
        f"DRM_IOCTL_AMDGPU_UALINK_HANDLE({{op=EXPORT, flags=0, gem_handle=1}} => "
        f"{{export_ualink_handle={hi << 64 | lo:#x}}}) = 0",
        "= -1 ENOENT (No such file or directory)",
        f"node1 renderD128 DRM_IOCTL_AMDGPU_UALINK_HANDLE({{op=IMPORT, flags=0, "
        f"import_ualink_handle={hi << 64 | lo:#x}}} => {{import_dmabuf_handle=",
        "DRM_IOCTL_PRIME_FD_TO_HANDLE(",
        f'node0 renderD128 GPU_STORE(va={VA0:#x}, "hello\\0", len=0x6) = 6',
        f'node1 renderD128 GPU_LOAD(va={VA1:#x}, "hello\\0", len=0x6) = 6',
        "node1 fabric send node1/accel1 -> node0/accel0 NPA_REQ{",
        "node0 fabric recv node1/accel1 -> node0/accel0 NPA_REQ{",
        "node0 fabric send node0/accel0 -> node1/accel1 NPA_RSP{",
        "node1 fabric send node1/accel1 -> node0/accel0 LOAD{npa_byte_addr=0x",
    ):
        assert needle in text, (needle, text)
    ioctls = [line for line in lines if "DRM_IOCTL" in line or "GPU_" in line]
    assert ioctls and all(DURATION.search(line) for line in ioctls)


def test_json_trace_on_stdout_is_json_only(tmp_path):
    """--trace=json without a file: stdout is one JSON object a line and nothing else (the
    ready lines are on stderr), each with the schema version, typed fields and raw hex;
    `python -m json.tool --json-lines` accepts the whole stream."""
    with traced_pod(tmp_path, "--trace=json") as (root, result):
        lo, hi = session(root)
    out, err = result
    assert err.count(" ready: ") == 2
    records = [json.loads(line) for line in out.splitlines()]
    assert records and all(r["v"] == 2 for r in records)
    tool = subprocess.run([sys.executable, "-m", "json.tool", "--json-lines"], input=out,
                          capture_output=True, text=True, timeout=60)
    assert tool.returncode == 0, tool.stderr
    assert {r["type"] for r in records} == {"ioctl", "gpu", "fabric", "open", "release"}
    create = next(r for r in records if r["type"] == "ioctl"
                  and r["ioctl"] == "AMDGPU_GEM_CREATE")
    assert create["in"]["bo_size"] == 2 * MIB and create["result"] == 0
    assert create["in"]["domains"] == {"value": 4, "names": ["AMDGPU_GEM_DOMAIN_VRAM"]}
    assert len(bytes.fromhex(create["in_hex"])) == 32
    export = next(r for r in records if r["type"] == "ioctl" and r["result"] == 0
                  and r["ioctl"] == "AMDGPU_UALINK_HANDLE" and r["node"] == "node0"
                  and r["in"]["op"]["name"] == "EXPORT")
    assert export["out"]["export_ualink_handle"] == f"{hi << 64 | lo:#034x}"
    failed = [r for r in records if r["type"] == "ioctl" and r["result"] < 0]
    assert [(r["errno"], r["result"]) for r in failed] == [("ENOENT", -2)]
    store = next(r for r in records if r["type"] == "gpu")
    assert (store["op"], store["va"], store["length"], store["result"], store["data_hex"]) == (
        "store", VA0, 6, 6, b"hello\0".hex())
    req = [r for r in records if r["type"] == "fabric" and r["message"] == "NPA_REQ"]
    assert {(r["node"], r["direction"]) for r in req} == {("node1", "send"), ("node0", "recv")}
    assert all(isinstance(r["time"], float) for r in records)


def test_trace_filter_keeps_only_what_matches(tmp_path):
    """--trace-filter kind=fabric node=node1: only node1's fabric messages reach the file."""
    trace = tmp_path / "trace.jsonl"
    with traced_pod(tmp_path, "--trace=json", "--trace-file", str(trace),
                    "--trace-filter", "kind=fabric", "--trace-filter", "node=node1") as (
            root, _):
        session(root)
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    assert records and {(r["type"], r["node"]) for r in records} == {("fabric", "node1")}


def test_trace_options_are_checked(tmp_path):
    """A bad filter or a trace file without --trace is refused before anything starts."""
    for args in (["--trace", "--trace-filter", "ioctl=NOPE"],
                 ["--trace-file", str(tmp_path / "t")]):
        r = subprocess.run([sys.executable, "-m", "ualinkd", "pod", "--root",
                            str(tmp_path / "pod"), *args], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 2 and "ualinkd: " in r.stderr, r
    assert not (tmp_path / "pod").exists()


def test_recording_a_traced_pod_has_its_fabric_messages(tmp_path):
    """`ualinkd record` attached to a pod running --trace: the recording has the fabric's
    messages (both nodes' NPA_REQ/NPA_RSP and the LOAD), not only the ioctls: the fabric's
    records go to the node's tracer of the moment, the recorder's hub once it attached."""
    out = tmp_path / "attached.jsonl"
    with traced_pod(tmp_path, "--trace", "--trace-file", str(tmp_path / "t.txt")) as (root,
                                                                                    _):
        with recording([root / "node0", root / "node1"], out):
            session(root)
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    fabric = {(r["node"], r["direction"], r["message"]) for r in recs if r["type"] == "fabric"}
    assert {("node1", "send", "NPA_REQ"), ("node0", "recv", "NPA_REQ"),
            ("node0", "send", "NPA_RSP"), ("node1", "send", "LOAD"),
            ("node0", "recv", "LOAD")} <= fabric, fabric
    assert any(r["type"] == "ioctl" for r in recs)
    assert "fabric send" in (tmp_path / "t.txt").read_text()  # (and --trace still has them)
