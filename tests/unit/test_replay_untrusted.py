"""A recording is untrusted input (issue 29 items 2, 9, 10; issue 32 item 7): one attached
to a bug report and replayed as root opens only the files a node's mount serves, under the
mount, through no symlink; claims no more caller memory than a call can copy; cannot crash
the check with deep JSON; and is not sent to the wrong node by an ambiguous `--mount`. Each
refusal is one line and exit 2, before anything is issued."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from ualinkd.cli.main import main
from ualinkd.replay import issue, session

# (replays into plain directories: conftest.py's plain_dirs_as_mounts)
pytestmark = pytest.mark.usefixtures("plain_dirs_as_mounts")

STORE = b"written by the recording"


def _recording(tmp_path: Path, *recs: dict, name: str = "rec.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def _open(path: str, node: str = "node0", file: int = 1, time: float = 0.1) -> dict:
    return {"v": 2, "type": "open", "time": time, "pid": 1, "node": node, "file": file,
            "path": path, "result": 0}


def _store(node: str = "node0", file: int = 1, time: float = 0.2) -> dict:
    return {"v": 2, "type": "gpu", "time": time, "pid": 1, "node": node, "file": file,
            "op": "store", "va": 0, "length": len(STORE), "result": len(STORE),
            "data_hex": STORE.hex()}


def _release(node: str = "node0", file: int = 1, time: float = 0.3) -> dict:
    return {"v": 2, "type": "release", "time": time, "pid": 1, "node": node, "file": file}


@pytest.fixture
def mount(tmp_path: Path) -> Path:
    """A directory standing for a node's mount (the files a replay may open are plain files
    here), next to a file of the host the recordings aim at."""
    m = tmp_path / "mnt"
    (m / "dri").mkdir(parents=True)
    (m / "dri/renderD128").write_bytes(b"")
    (m / "kfd").write_bytes(b"")
    (m / "sys/kernel/debug/dri/128").mkdir(parents=True)
    (m / "sys/kernel/debug/dri/128/ualink_drop_msg").write_text("0x0\n")
    (tmp_path / "outside").write_text("the host's file\n")
    return m


@pytest.mark.parametrize("path", [
    "../outside",  # leaves the mount
    "dri/../../outside",
    "dri/renderD128/../../../outside",
    "{outside}",  # an absolute path
    "sys/kernel/debug/dri/128/ualink_drop_msg",  # the node's fault-injection knob
    "dri/renderD128/",
    "./kfd",
    "dri//renderD128",
    "dri/renderD",
    "dri/renderD128\n",
    "dri/renderD١٢٨",  # Arabic-Indic digits: \d would take them
    "dmabuf/../../outside",
    "",
])
def test_an_open_outside_the_device_files_is_refused_before_anything_is_issued(
        tmp_path, mount, capsys, path):
    """issue 29 item 2: a recorded open names dri/renderD<n>, dri/card<n>, kfd or
    dmabuf/<token> (fuse/tree.py's files), nothing else; at cb563a2 the path was joined to
    the mount unchecked and opened read-write, and the store went into the file."""
    path = path.format(outside=tmp_path / "outside")
    rec = _recording(tmp_path, _open(path), _store(), _release())
    assert main(["replay", str(rec), "--mount", str(mount)]) == 2
    err = capsys.readouterr().err
    assert err == (f"ualinkd replay: {rec}: line 1: `path` is not dri/renderD<n>, "
                   f"dri/card<n>, kfd or dmabuf/<token> ({session._shown(path)})\n")
    assert (tmp_path / "outside").read_text() == "the host's file\n"
    assert (mount / "sys/kernel/debug/dri/128/ualink_drop_msg").read_text() == "0x0\n"


def test_a_release_naming_another_path_is_refused_too(tmp_path, mount, capsys):
    """A release's path is only its label (node.py's _trace_release: "dmabuf" for a
    dma-buf's), never opened; another one is a forged recording all the same."""
    rec = _recording(tmp_path, _open("kfd"), {**_release(), "path": "../outside"})
    assert main(["replay", str(rec), "--mount", str(mount)]) == 2
    assert "line 2: `path` is not dri/renderD<n>" in capsys.readouterr().err
    for label in ("dmabuf", "kfd", "dri/renderD128"):
        session.load([json.dumps({**_release(), "path": label})])


@pytest.mark.parametrize("path", ["dri/renderD128", "dri/card0", "kfd", "dmabuf/4096",
                                  "dmabuf/None"])
def test_the_device_files_pass_the_check(path):
    """What trace.py writes (node.py's _trace_open): dmabuf/None when it lost the name."""
    recs = session.load([json.dumps({**_open(path), "token": None})])
    assert recs[0]["path"] == path


@pytest.mark.parametrize("openat2", [True, False], ids=["openat2", "O_NOFOLLOW"])
@pytest.mark.parametrize("link", ["dri", "dri/renderD128"])
def test_a_symlink_in_the_mount_is_not_followed(tmp_path, mount, monkeypatch, capsys,
                                                openat2, link):
    """issue 29 item 2: the open is relative to the mount's directory with no symlink
    followed (openat2 RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS; one openat(O_NOFOLLOW) per
    component where openat2 is missing): a mount whose dri/ (or dri/renderD128) is a symlink
    out of it gives the open ELOOP, a difference, and the file outside is not touched."""
    if not openat2:  # no such syscall: ENOSYS, as on a kernel before 5.6
        monkeypatch.setattr(issue, "SYS_OPENAT2", -1)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "dri").mkdir(parents=True)
    (elsewhere / "dri/renderD128").write_text("the host's file\n")
    target = mount / link
    if target.is_dir():
        (target / "renderD128").unlink()
        target.rmdir()
    else:
        target.unlink()
    target.symlink_to(elsewhere / link)
    rec = _recording(tmp_path, _open("dri/renderD128"), _store(), _release())
    assert main(["replay", str(rec), "--mount", str(mount)]) == 1
    out = capsys.readouterr().out
    assert "open(dri/renderD128): open failed: -1 ELOOP, recorded 0" in out
    assert (elsewhere / "dri/renderD128").read_text() == "the host's file\n"


@pytest.mark.parametrize("openat2", [True, False], ids=["openat2", "O_NOFOLLOW"])
def test_a_device_file_is_opened_and_written_under_the_mount(tmp_path, mount, monkeypatch,
                                                             capsys, openat2):
    """The refusals leave the replay itself alone: the store goes to the mount's file."""
    if not openat2:
        monkeypatch.setattr(issue, "SYS_OPENAT2", -1)
    rec = _recording(tmp_path, _open("dri/renderD128"), _store(), _release())
    assert main(["replay", str(rec), "--mount", str(mount)]) == 0, capsys.readouterr().out
    assert (mount / "dri/renderD128").read_bytes() == STORE
    fds = set(os.listdir("/proc/self/fd"))
    assert main(["replay", str(rec), "--mount", str(mount)]) == 0
    assert set(os.listdir("/proc/self/fd")) == fds  # the mount's directory fd is closed too


def test_open_beneath_refuses_what_the_check_would(tmp_path, mount, monkeypatch):
    """The edge's own guard (a dma-buf path is built from a recorded token): `..` and an
    absolute path fail with openat2 (EXDEV) and without it."""
    fd = os.open(mount, os.O_PATH | os.O_DIRECTORY)
    try:
        for name in ("../outside", str(tmp_path / "outside")):
            with pytest.raises(OSError) as e:
                issue.open_beneath(fd, name, os.O_RDONLY)
            assert e.value.errno == errno.EXDEV
        monkeypatch.setattr(issue, "SYS_OPENAT2", -1)
        with pytest.raises(OSError) as e:
            issue.open_beneath(fd, "dri/../../outside", os.O_RDONLY)
        assert e.value.errno == errno.EXDEV
        os.close(issue.open_beneath(fd, "dri/renderD128", os.O_RDONLY))
    finally:
        os.close(fd)


# -- caller memory (item 9) ------------------------------------------------------------------
IOCTL = {"v": 2, "type": "ioctl", "time": 0.2, "pid": 1, "node": "node0", "file": 1,
         "ioctl": "GEM_CLOSE", "cmd": "0x40086409", "in_hex": "0100000000000000",
         "out_hex": "", "result": 0, "fds": []}
MIB = 1 << 20


def _mem(addr: int, length: int, op: str = "read", result: int = 0) -> dict:
    return {"op": op, "addr": addr, "len": length, "hex": "", "result": result}


@pytest.mark.parametrize(("mem", "why"), [
    ([_mem(0x10000, 0x7FFFF000)],
     "line 2: mem[0] copies 2147479552 bytes, more than a call copies at once (4194304, "
     "KMALLOC_MAX_SIZE)"),
    ([_mem(0x10000, 4 * MIB), _mem(0x10000, 4 * MIB + 1, "write")],
     "line 2: mem[1] copies 4194305 bytes"),
    ([_mem(i << 32, 4 * MIB) for i in range(1, 5)],
     "line 2: `mem` needs 16793600 bytes of caller memory (its spans and 4096 after each), "
     "more than a call copies (16777216)"),
    ([_mem(i << 20, 1) for i in range(1, 4100)], "line 2: `mem` needs 16793603 bytes"),
])
def test_caller_memory_a_call_cannot_have_copied_is_refused(tmp_path, mount, capsys, mem, why):
    """issue 29 item 9: a replay gives each caller-memory span a buffer of its length (and
    SLACK): one copy is at most KMALLOC_MAX_SIZE (4 MiB) as in the kernel, and the buffers
    of one call at most 16 MiB, or 851 bytes of recording took 4.1 GiB at cb563a2."""
    rec = {**IOCTL, "mem": mem}
    with pytest.raises(session.RecordingError) as e:
        session.load([json.dumps(_open("dri/renderD128")), json.dumps(rec)])
    assert str(e.value).startswith(why)
    path = _recording(tmp_path, _open("dri/renderD128"), rec, _release())
    assert main(["replay", str(path), "--mount", str(mount)]) == 2
    assert capsys.readouterr().err == f"ualinkd replay: {path}: {e.value}\n"


def test_the_most_a_real_call_copies_passes():
    """SYNCOBJ_TIMELINE_WAIT at drm/syncobj.py's MAX_HANDLES: 2 MiB of handles and 4 MiB
    of points (read, then written back), adjacent in one allocation; a failed copy of any
    length gets no buffer (the daemon's EFAULT is replayed with the recorded pointer)."""
    handles, points = 0x7F0000000000, 0x7F0000000000 + 2 * MIB
    mem = [_mem(handles, 2 * MIB), _mem(points, 4 * MIB), _mem(points, 4 * MIB, "write"),
           _mem(0x1000, 0x7FFFF000, result=-errno.EFAULT)]
    (rec,) = session.load([json.dumps({**IOCTL, "mem": mem})])
    assert len(rec["mem"]) == 4


# -- deep JSON (item 10) ---------------------------------------------------------------------
@pytest.mark.parametrize("line", [
    "[" * 100_000 + "]" * 100_000,
    '{"v": 2, "type": "ioctl", "in": ' + "[" * 100_000 + "]" * 100_000 + "}",
    "[" * 100_000,  # no closing: refused, not taken for a recorder killed mid-write
])
@pytest.mark.parametrize("newline", ["\n", ""])
def test_json_nested_too_deep_is_one_line_and_exit_2(tmp_path, mount, capsys, line, newline):
    """issue 29 item 10: at cb563a2 a recording nested 100,000 deep ended the replay with
    a RecursionError traceback and exit 1."""
    path = tmp_path / "rec.jsonl"
    path.write_text(json.dumps(_open("kfd")) + "\n" + line + newline)
    assert main(["replay", str(path), "--mount", str(mount)]) == 2
    assert capsys.readouterr().err == f"ualinkd replay: {path}: line 2: JSON nested too deep\n"


# -- which node's calls go where (issue 32 item 7) ---------------------------------------------
def _two_nodes(tmp_path: Path) -> Path:
    return _recording(tmp_path, _open("kfd"), _open("kfd", node="node1", file=2),
                      _release(), _release(node="node1", file=2))


def test_one_bare_mount_for_a_two_node_recording_is_refused(tmp_path, mount, capsys):
    """issue 32 item 7: a mount without a node takes every node's calls; with two nodes'
    calls that is every call on one node (false differences, or a false "no differences")."""
    rec = _two_nodes(tmp_path)
    assert main(["replay", str(rec), "--mount", str(mount)]) == 2
    assert capsys.readouterr().err == (
        f"ualinkd replay: {rec}: --mount {mount}: the recording has calls on 2 nodes (node0, "
        "node1), which one mount without a node would take all of: name each node's mount "
        "(--mount node0=DIR --mount node1=DIR)\n")


def test_two_bare_mounts_are_refused(tmp_path, mount, capsys):
    """At cb563a2 the second silently replaced the first."""
    rec = _two_nodes(tmp_path)
    assert main(["replay", str(rec), "--mount", str(mount), "--mount", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"ualinkd replay: {rec}: --mount {mount} --mount {tmp_path}: 2 mounts without a node "
        "(only the last would be used): name each node's mount (--mount node0=DIR --mount "
        "node1=DIR)\n")
    one = _recording(tmp_path, _open("kfd"), _release(), name="one.jsonl")
    assert main(["replay", str(one), "--mount", str(mount), "--mount", str(mount)]) == 2


def test_one_node_given_twice_is_refused(tmp_path, mount, capsys):
    rec = _two_nodes(tmp_path)
    assert main(["replay", str(rec), "--mount", f"node0={mount}", "--mount",
                 f"node1={mount}", "--mount", f"node0={tmp_path}"]) == 2
    assert capsys.readouterr().err == (
        f"ualinkd replay: {rec}: --mount node0= given 2 times ({mount}, {tmp_path}): one "
        "mount per node (--mount node0=DIR --mount node1=DIR)\n")


def test_a_bare_mount_taking_one_node_is_accepted(tmp_path, mount, capsys):
    """A bare mount for a one-node recording (the common case), or for the one node left
    without its own, or a `--pid` whose calls are all on one node, is not ambiguous."""
    rec = _two_nodes(tmp_path)
    assert main(["replay", str(rec), "--mount", f"node0={mount}", "--mount", str(mount)]) == 0
    one = _recording(tmp_path, _open("kfd"), _release(), name="one.jsonl")
    assert main(["replay", str(one), "--mount", str(mount)]) == 0
    mixed = _recording(tmp_path, _open("kfd"), {**_open("kfd", node="node1", file=2), "pid": 2},
                       _release(), {**_release(node="node1", file=2), "pid": 0},
                       name="mixed.jsonl")
    assert main(["replay", str(mixed), "--mount", str(mount), "--pid", "1"]) == 0
    capsys.readouterr()
