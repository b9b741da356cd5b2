"""Record and replay (issue 12 item 2), end to end on real `ualinkd pod`s: the demo's C
clients (libualink_c/examples: share, import, peer; tests/c libdrm_discovery through the
shim) recorded with `--trace=json --trace-file` and with `ualinkd record`, replayed by
`ualinkd replay` (real opens and ioctl(2) through the mounts) against a fresh pod, against a
pod with the kernel quirk `stale-export-handle` switched on (spec §6.10), and from a tampered
recording."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from nodes import Client, c_program, errno_of, recording

from ualinkd.abi.ioc import ioc

MIB = 1 << 20
VA0 = 0x100000000
BIN = Path(c_program("share")).parent


@contextlib.contextmanager
def pod(tmp_path: Path, name: str, *args: str) -> Iterator[Path]:
    """A two-node `ualinkd pod` under tmp_path/name; yields its root; SIGINT at the end."""
    root = tmp_path / name
    err = tmp_path / f"{name}.err"
    out = tmp_path / f"{name}.out"
    with open(out, "w") as o, open(err, "w") as e:
        proc = subprocess.Popen([sys.executable, "-m", "ualinkd", "pod", "--nodes", "2",
                                 "--root", str(root), *args], stdout=o, stderr=e,
                                stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while (out.read_text() + err.read_text()).count(" ready: ") < 2:
            assert proc.poll() is None, err.read_text()
            assert time.monotonic() < deadline, err.read_text()
            time.sleep(0.05)
        yield root
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0, err.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _wait_line(proc: subprocess.Popen[str], prefix: str) -> str:
    assert proc.stdout is not None
    while True:
        line = proc.stdout.readline()
        assert line, f"{proc.args[0]} ended before printing {prefix!r}"
        if line.startswith(prefix):
            return line


def _wait_empty(path: Path, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while path.read_text().strip():
        assert time.monotonic() < deadline, f"{path} still lists {path.read_text()!r}"
        time.sleep(0.05)


def demo_session(root: Path) -> None:
    """`make demo`'s clients: share (node0) exports a VRAM message, import takes it locally,
    peer (node1) imports it over the fabric, loads and stores; share exits (the revoke),
    peer's next load faults; libdrm_discovery's INFO queries through the shim."""
    n0, n1 = root / "node0/dri/renderD128", root / "node1/dri/renderD128"
    run = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True}
    share = subprocess.Popen([str(BIN / "share"), str(n0)], **run)  # type: ignore[call-overload]
    try:
        handle = _wait_line(share, "handle=").split()[0].removeprefix("handle=")
        subprocess.run([str(BIN / "import"), str(n0), handle], check=True, timeout=30,
                       capture_output=True)
        peer = subprocess.Popen([str(BIN / "peer"), str(n1), handle], **run)  # type: ignore[call-overload]
        try:
            _wait_line(peer, "importer stores")
            share.stdin.close()
            assert share.wait(30) == 0
            _wait_empty(root / "node1/sys/kernel/debug/dri/128/ualink_imports")
            peer.stdin.write("load\n")
            peer.stdin.flush()
            assert "Bad address" in _wait_line(peer, "importer load at")
            peer.stdin.close()
            assert peer.wait(30) == 0
        finally:
            if peer.poll() is None:
                peer.kill()
                peer.wait()
    finally:
        if share.poll() is None:
            share.kill()
            share.wait()
    env = dict(os.environ, LD_PRELOAD=str(BIN / "libualink_shim.so"),
               UALINK_DRI_DIR=str(root / "node0/dri"))
    subprocess.run([str(BIN / "libdrm_discovery")], env=env, check=True, timeout=60,
                   capture_output=True)


def reexport_session(root: Path) -> None:
    """Spec §6.10's re-export, by a libualink client: export a VRAM BO (no importer), keep a
    dma-buf fd, close the handle (the export entry goes), import the fd to a new handle, export
    again: a fresh handle on the reference build, (stale handle_lo, handle_hi 0) with the
    quirk; then node1 imports that second handle."""
    with Client(str(root / "node0/dri/renderD128")) as a, \
            Client(str(root / "node1/dri/renderD128")) as b:
        bo = a.bo_create(2 * MIB, domains=4)
        a.export(bo)
        fd = a.handle_to_fd(bo)
        a.bo_close(bo)
        again = a.fd_to_handle(fd)
        os.close(fd)
        handle = a.export(again)
        with contextlib.suppress(OSError):
            os.close(b.import_(handle))
        a.bo_close(again)


def replay(recording: Path, root: Path,
           nodes: tuple[str, ...] = ("node0", "node1")) -> subprocess.CompletedProcess[str]:
    mounts = [a for n in nodes for a in ("--mount", f"{n}={root / n}")]
    return subprocess.run(
        [sys.executable, "-m", "ualinkd", "replay", str(recording), *mounts],
        capture_output=True, text=True, timeout=240)


def differences(res: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in res.stdout.splitlines() if line.startswith("#")]


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def demo_recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("rec")
    trace = tmp / "demo.jsonl"
    with pod(tmp, "recorded", "--trace=json", "--trace-file", str(trace)) as root:
        demo_session(root)
    return trace


def test_recording_names_files_memory_and_handed_out_values(demo_recording):
    """The JSON trace is a recording: every ioctl and GPU access names its file, opened by
    an `open` record (render node, dma-buf token); INFO's return buffer is in `mem` as
    written; GEM_CREATE and the export hand out values; PRIME_FD_TO_HANDLE's fd resolved to
    the dma-buf file the client opened."""
    recs = records(demo_recording)
    assert {r["v"] for r in recs} == {2}
    opens = {(r["node"], r["file"]): r for r in recs if r["type"] == "open"}
    calls = [r for r in recs if r["type"] in ("ioctl", "gpu")]
    assert calls and all((r["node"], r["file"]) in opens for r in calls)
    assert any(r["path"].startswith("dmabuf/") and r["token"] for r in opens.values())
    info = [r for r in calls if r.get("ioctl") == "AMDGPU_INFO" and r["result"] == 0]
    assert info and all(m["op"] == "write" for r in info for m in r["mem"])
    assert any(r["mem"] for r in info)
    kinds = {h["kind"] for r in calls if r["type"] == "ioctl" for h in r["handed"]}
    assert {"gem", "ualink_lo", "ualink_hi", "token"} <= kinds
    fd_to_handle = [r for r in calls if r.get("ioctl") == "PRIME_FD_TO_HANDLE"]
    dmabuf_keys = {o["key"] for o in opens.values() if o["key"] is not None}
    assert fd_to_handle and all(f["key"] in dmabuf_keys for r in fd_to_handle
                                for f in r["fds"])


def test_replay_against_a_fresh_pod_has_no_differences(demo_recording, tmp_path):
    """Same build, fresh pod: other GEM handles, UALink handles and tokens, the same answers
    byte for byte after mapping them; the revoked import's load faults again."""
    with pod(tmp_path, "fresh") as root:
        res = replay(demo_recording, root)
    assert res.returncode == 0, res.stdout + res.stderr
    assert differences(res) == []
    assert "no differences" in res.stdout.splitlines()[-1]


def test_replay_against_a_pod_of_another_shape_shows_its_memory_sizes(demo_recording,
                                                                    tmp_path):
    """The demo's recording (one accel per node) against a pod with two accels per node: the
    node's VRAM is split between its accels, so the INFO queries that report memory sizes
    differ (VRAM_GTT, MEMORY) and nothing else: the export, the imports over the fabric, the
    loads and stores and the revoked load's fault answer as recorded."""
    with pod(tmp_path, "shape", "--accels-per-node", "2") as root:
        res = replay(demo_recording, root)
    assert res.returncode == 1, res.stdout + res.stderr
    queries = {d.split(":")[0].rsplit(" ", 1)[1] for d in differences(res)}
    assert queries == {"AMDGPU_INFO(query=VRAM_GTT)", "AMDGPU_INFO(query=MEMORY)"}, res.stdout


def test_tampered_recording_shows_its_difference(demo_recording, tmp_path):
    """A recording whose GPU load says other bytes came back: the replay names that load
    and exits 1; nothing else differs."""
    recs = records(demo_recording)
    loads = [i for i, r in enumerate(recs) if r["type"] == "gpu" and r["op"] == "load"
             and r["result"] > 0]
    i = loads[0]
    data = bytearray.fromhex(recs[i]["data_hex"])
    data[0] ^= 0xFF
    recs[i]["data_hex"] = data.hex()
    tampered = tmp_path / "tampered.jsonl"
    tampered.write_text("".join(json.dumps(r) + "\n" for r in recs))
    with pod(tmp_path, "fresh") as root:
        res = replay(tampered, root)
    assert res.returncode == 1, res.stdout + res.stderr
    diffs = differences(res)
    assert len(diffs) == 1, res.stdout
    assert "GPU_LOAD: loaded bytes differ from offset 0x0" in diffs[0]


def test_replay_with_stale_export_quirk_shows_exactly_its_differences(tmp_path):
    """Spec §6.10, quirk `stale-export-handle`: recorded on the reference build, replayed on
    a pod with the quirk on. Exactly two calls differ: the second export (its handle_lo is
    the first export's, handle_hi 0) and node1's import of that handle (it fails); every
    other call answers as recorded. The demo's recording shows none (nothing re-exports)."""
    trace = tmp_path / "reexport.jsonl"
    with pod(tmp_path, "recorded", "--trace=json", "--trace-file", str(trace)) as root:
        reexport_session(root)
    with pod(tmp_path, "fresh") as root:
        same = replay(trace, root)
    assert same.returncode == 0, same.stdout + same.stderr
    with pod(tmp_path, "quirk", "--kernel-quirks", "stale-export-handle") as root:
        res = replay(trace, root)
    assert res.returncode == 1, res.stdout + res.stderr
    diffs = differences(res)
    calls = {d.split(":")[0] for d in diffs}
    assert len(calls) == 2, res.stdout
    export, imp = sorted(calls, key=lambda d: int(d.split()[0][1:]))
    assert export.endswith("node0 AMDGPU_UALINK_HANDLE(op=EXPORT)") and imp.endswith(
        "node1 AMDGPU_UALINK_HANDLE(op=IMPORT)"), res.stdout
    text = "\n".join(diffs)
    assert "export_ualink_handle[0] (ualink_lo)" in text and "which the recording had" in text
    assert "export_ualink_handle[1] (ualink_hi)" in text and "replayed 0x0" in text
    assert any(d.startswith(imp) and "recorded = 0" in d for d in diffs), res.stdout


def test_ualinkd_record_attaches_to_a_running_pod(tmp_path):
    """`ualinkd record --mount … -o FILE` on a pod started without --trace: the session's
    calls are in FILE (schema 2, with their opens) and replay against a fresh pod with no
    differences."""
    out = tmp_path / "attached.jsonl"
    with pod(tmp_path, "running") as root:
        with recording([root / "node0", root / "node1"], out):
            reexport_session(root)
    recs = [r for r in records(out) if r["type"] in ("ioctl", "open")]
    assert {r["pid"] for r in recs} == {os.getpid()}
    assert sum(r.get("ioctl") == "AMDGPU_UALINK_HANDLE" for r in recs) == 3
    with pod(tmp_path, "fresh") as root:
        res = replay(out, root)
    assert res.returncode == 0, res.stdout + res.stderr
    assert differences(res) == []


AMDGPU_INFO = ioc(1, 0x64, 0x45, 32)  # DRM_IOW(DRM_COMMAND_BASE + AMDGPU_INFO)
SYNCOBJ_WAIT = ioc(3, 0x64, 0xC3, 40)


def test_a_call_given_a_bad_pointer_replays_its_fault(tmp_path):
    """A client passing 0x10 for INFO's return_pointer and for SYNCOBJ_WAIT's handles gets
    EFAULT, and so does the replay of its recording: the pointer goes as recorded, with no
    buffer of the replayer's behind it."""
    trace = tmp_path / "badptr.jsonl"
    with pod(tmp_path, "recorded", "--trace=json", "--trace-file", str(trace)) as root:
        with Client(str(root / "node0/dri/renderD128")) as a:
            info = struct.pack("<QII", 0x10, 4, 0x00).ljust(32, b"\0")  # ACCEL_WORKING
            assert errno_of(a.fd, AMDGPU_INFO, info) == errno.EFAULT
            wait = struct.pack("<QqIIIIQ", 0x10, 0, 1, 0, 0, 0, 0)
            assert errno_of(a.fd, SYNCOBJ_WAIT, wait) == errno.EFAULT
    faulted = [r for r in records(trace) if r["type"] == "ioctl" and r["result"] == -14]
    assert {r["ioctl"] for r in faulted} == {"AMDGPU_INFO", "SYNCOBJ_WAIT"}
    assert all(m["result"] == -14 for r in faulted for m in r["mem"])
    with pod(tmp_path, "fresh") as root:
        res = replay(trace, root, nodes=("node0",))  # the session never touched node1
    assert res.returncode == 0, res.stdout + res.stderr
    assert differences(res) == []


def test_a_recording_reaches_nothing_but_the_device_files(tmp_path):
    """issue 29 item 2, on a real pod: a three-line recording (open, GPU store, release)
    whose open names the node's debugfs knob ualink_drop_msg, a file outside the mount by
    `..`, or by its absolute path, is refused before anything is issued (exit 2, one line):
    at cb563a2 the first set the node's drop bitmap to 0xff and the others overwrote the
    file, and the replays said "no differences"."""
    outside = tmp_path / "outside"
    outside.write_text("the host's file\n")
    evil = tmp_path / "evil.jsonl"
    with pod(tmp_path, "target") as root:
        knob = root / "node0/sys/kernel/debug/dri/128/ualink_drop_msg"
        before = knob.read_text()
        for path in ("sys/kernel/debug/dri/128/ualink_drop_msg", "../../outside",
                     str(outside)):
            opened = {"v": 2, "type": "open", "time": 1.0, "pid": 7, "node": "node0",
                      "file": 1, "path": path, "result": 0}
            store = {"v": 2, "type": "gpu", "time": 1.1, "pid": 7, "node": "node0", "file": 1,
                     "op": "store", "va": 0, "length": 3, "result": 3, "data_hex": b"ff\n".hex()}
            evil.write_text("".join(json.dumps(r) + "\n" for r in (
                opened, store, {**opened, "type": "release", "time": 1.2, "pid": 0})))
            res = replay(evil, root, nodes=("node0",))
            text = json.dumps(path)  # (cut to 40 characters, as the check quotes it)
            shown = text if len(text) <= 40 else text[:39] + "…"
            assert res.returncode == 2, res.stdout + res.stderr
            assert res.stdout == ""
            assert res.stderr == (f"ualinkd replay: {evil}: line 1: `path` is not "
                                  "dri/renderD<n>, dri/card<n>, kfd or dmabuf/<token> "
                                  f"({shown})\n")
        assert knob.read_text() == before
    assert outside.read_text() == "the host's file\n"
