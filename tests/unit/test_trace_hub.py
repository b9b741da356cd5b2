"""`ualinkd record`'s subscriber queues (replay/record.py's TraceHub): bounded in records
and in bytes, so a recorder that stops reading costs the daemon a bounded amount of memory
and its recording says how many records it lost."""

from __future__ import annotations

import trio

from ualinkd.replay import record


class _Rec:
    """A record as the hub sees it: what it renders to."""

    name = "load"

    def __init__(self, size: int) -> None:
        self.line = "x" * size

    def json(self) -> str:
        return self.line


def test_a_subscriber_that_stops_reading_holds_queue_bytes_at_most(monkeypatch) -> None:
    """A GPU load's record is 2 MiB of JSON hex: 65,536 of them queued for a stopped
    recorder were 128 GiB. Past QUEUE_BYTES a record is counted lost instead; what the
    subscriber takes frees its room again."""
    monkeypatch.setattr(record, "QUEUE_BYTES", 10_000)
    hub = record.TraceHub(None)
    send, recv = trio.open_memory_channel[str](record.QUEUE)
    counts = [0, 0]
    hub.subscribers.append((send, counts))
    for _ in range(50):
        hub(_Rec(1000))  # type: ignore[arg-type]
    assert recv.statistics().current_buffer_used == 10
    assert counts == [40, 10_000]
    recv.receive_nowait()
    counts[1] -= 1000  # (the subscriber's task does this once the line is sent)
    hub(_Rec(1000))  # type: ignore[arg-type]
    assert counts == [40, 10_000] and recv.statistics().current_buffer_used == 10


def test_a_new_trace_socket_clears_the_stale_ones_of_killed_daemons(tmp_path) -> None:
    """A daemon killed by SIGKILL leaves its trace socket; the next daemon to bind one in
    that directory unlinks every socket nobody listens on, and leaves a live one (and any
    other file) alone."""
    import socket

    from ualinkd.replay.record import clear_stale_trace_sockets

    def bound(name: str, listen: bool) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(tmp_path / name))
        if listen:
            s.listen(1)
        return s

    dead = bound("trace-00000000dead0000.sock", listen=False)
    dead.close()  # as a killed daemon's: the file stays, nothing listens
    live = bound("trace-00000000a11ce000.sock", listen=True)
    (tmp_path / "trace-notes.txt").write_text("x")
    try:
        assert clear_stale_trace_sockets(str(tmp_path)) == 1
        assert sorted(p.name for p in tmp_path.iterdir()) == [
            "trace-00000000a11ce000.sock", "trace-notes.txt"]
        assert clear_stale_trace_sockets(str(tmp_path / "missing")) == 0
    finally:
        live.close()


def test_record_pid_filter_keeps_the_releases_of_that_pids_files_only() -> None:
    """`ualinkd record --pid`: a release carries no pid (FUSE's RELEASE comes from the
    kernel), so the recorder keeps it when the pid's own open of that file was kept, and
    leaves another process's out."""
    import io
    import json

    from ualinkd.replay.record import _keep

    out, opened = io.StringIO(), set()
    recs = [{"type": "open", "pid": 1, "node": "node0", "file": 3},
            {"type": "open", "pid": 2, "node": "node0", "file": 4},
            {"type": "ioctl", "pid": 2, "node": "node0", "file": 4},
            {"type": "release", "pid": 0, "node": "node0", "file": 4},
            {"type": "release", "pid": 0, "node": "node0", "file": 3},
            {"type": "lost", "count": 1}]
    assert sum(_keep(json.dumps(r).encode(), {1}, out, opened) for r in recs) == 3
    kept = [json.loads(x) for x in out.getvalue().splitlines()]
    assert [(r["type"], r.get("file")) for r in kept] == [
        ("open", 3), ("release", 3), ("lost", None)]
    assert opened == set()


def test_a_trace_socket_appears_listening(tmp_path, monkeypatch) -> None:
    """The nodes of a pod start together: another node's sweep of stale sockets, run at the
    worst moment (between this one's bind and its listen, where it sets the mode), must not
    take this socket for a dead daemon's. bind_trace_socket binds and listens under another
    name and renames the socket into place."""
    import os
    import socket

    path = str(tmp_path / "trace-0123.sock")
    monkeypatch.setattr(record, "trace_socket_path", lambda mount, resolved=False: path)
    chmod = os.chmod

    def chmod_while_another_node_sweeps(p: str, mode: int) -> None:
        chmod(p, mode)
        record.clear_stale_trace_sockets(str(tmp_path))

    monkeypatch.setattr(os, "chmod", chmod_while_another_node_sweeps)

    async def main() -> None:
        sock, got = await record.bind_trace_socket("/x")
        with sock:
            assert got == path
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            probe.connect(path)
            probe.close()
            assert sorted(os.listdir(tmp_path)) == ["trace-0123.sock"]

    trio.run(main)


class _Core:
    """What serve_trace needs of a NodeCore: `tracer`, here with every value it was given."""

    name = "node0"

    def __init__(self) -> None:
        self.history: list[object] = []
        self._tracer: object = None

    @property
    def tracer(self) -> object:
        return self._tracer

    @tracer.setter
    def tracer(self, value: object) -> None:
        self.history.append(value)
        self._tracer = value


def test_a_sweep_of_stale_sockets_never_attaches_as_a_subscriber(tmp_path) -> None:
    """Issue 29 item 4: every node daemon that starts sweeps the trace sockets of its
    directory (clear_stale_trace_sockets), connecting to each live one. That probe must not
    be taken for a recorder: attaching made the node's tracer the hub for a moment, and a
    tracer coming or going failed in-flight GPU accesses. A real recorder (it says
    SUBSCRIBE first) still attaches, and the node's tracer is back when it leaves."""
    import socket

    core = _Core()

    async def main() -> None:
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        path = str(tmp_path / "trace-0123.sock")
        await sock.bind(path)
        sock.listen(8)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(record.serve_trace, core, sock, path)
            for _ in range(20):
                assert await trio.to_thread.run_sync(
                    record.clear_stale_trace_sockets, str(tmp_path)) == 0
            await trio.sleep(0.2)  # (the daemon has seen every probe come and go)
            assert core.history == []
            sub = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            await sub.connect(path)
            await sub.send(record.SUBSCRIBE)
            hello = await sub.recv(4096)
            assert b'"recording"' in hello and isinstance(core.tracer, record.TraceHub)
            sub.close()
            with trio.fail_after(5):
                while core.tracer is not None:
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()

    trio.run(main)
    # (and None again as serve_trace ends)
    assert [type(t).__name__ for t in core.history][:2] == ["TraceHub", "NoneType"]


def test_a_trace_directory_that_is_not_ours_alone_is_refused(tmp_path, monkeypatch) -> None:
    """Issue 29: a non-root daemon's trace sockets live in /tmp/ualinkd-<uid>, which another
    user may create first (and then swap the socket for their own). The daemon refuses a
    directory owned by another uid, or writable by others, with one clear error (it then
    serves without recorders: daemon.py logs it), and so does `ualinkd record`."""
    import errno
    import os

    import pytest

    directory = tmp_path / "ualinkd-1000"
    directory.mkdir(mode=0o700)
    path = str(directory / "trace-0123.sock")
    monkeypatch.setattr(record, "trace_socket_path", lambda mount, resolved=False: path)

    async def bind() -> None:
        sock, _ = await record.bind_trace_socket("/x")
        sock.close()

    trio.run(bind)  # ours, 0700: fine
    os.unlink(path)
    for mode, owner in ((0o777, os.geteuid()), (0o1777, os.geteuid()), (0o700, 65534)):
        directory.chmod(mode)
        if owner != os.geteuid():
            if os.geteuid() != 0:
                continue
            os.chown(directory, owner, -1)
        with pytest.raises(PermissionError) as e:
            trio.run(bind)
        assert e.value.errno == errno.EPERM and str(directory) in str(e.value)
        assert os.listdir(directory) == []
        with pytest.raises(PermissionError):
            record.record(["/x"], open(os.devnull, "w"))
    link = tmp_path / "ualinkd-link"
    link.symlink_to(directory)
    with pytest.raises(PermissionError):
        record.check_trace_dir(str(link))


def test_a_non_root_daemon_refuses_a_trace_directory_another_user_made_first() -> None:
    """Issue 29, the non-root hazard as it happens: a daemon running as nobody puts its
    trace sockets in $TMPDIR/ualinkd-65534. Made there first by another user (root here,
    mode 1777 like /tmp's own), the directory is refused with one clear error and nothing
    is bound in it; with $TMPDIR clean, nobody makes its own (0700) and binds."""
    import os
    import shutil
    import tempfile
    from pathlib import Path

    import pytest

    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run as nobody")
    # ($TMPDIR must be reachable by nobody, or tempfile falls back to the real /tmp.)
    tmp = Path(tempfile.mkdtemp(prefix="ualinkd-tmpdir-"))
    tmp.chmod(0o1777)
    try:
        _nobody_in(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _nobody_in(tmp) -> None:  # type: ignore[no-untyped-def]
    import os
    import subprocess
    import sys

    script = ("import trio\nfrom ualinkd.replay import record\n"
              "try:\n    s, p = trio.run(record.bind_trace_socket, '/x')\n"
              "except PermissionError as e:\n    print('refused:', e.strerror)\n"
              "else:\n    print('bound', p)\n")

    def as_nobody() -> str:
        r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                            "--", sys.executable, "-c", script],
                           env=dict(os.environ, TMPDIR=str(tmp)), capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return r.stdout.strip()

    squatted = tmp / "ualinkd-65534"
    squatted.mkdir()
    squatted.chmod(0o1777)  # another user's, open to all
    got = as_nobody()
    assert got == (f"refused: trace socket directory {squatted} belongs to uid 0, not to "
                   "us (uid 65534); remove it, or let the daemon's user create it"), got
    assert os.listdir(squatted) == []
    squatted.rmdir()
    assert as_nobody().startswith(f"bound {squatted}/trace-")
    assert squatted.stat().st_uid == 65534 and squatted.stat().st_mode & 0o777 == 0o700


def test_a_sweep_does_not_probe_a_socket_proc_net_unix_says_is_listened_on(tmp_path) -> None:
    """The sweep every starting daemon makes (clear_stale_trace_sockets) leaves a live
    daemon's trace socket alone without connecting to it when /proc/net/unix lists it as
    listening, under its path or the `<path>.<pid>.new` name bind_trace_socket bound it to
    before renaming it: a 256-node pod starting on one host probed each live daemon by each
    later one (~0.2 ms of CPU and a wake-up each). A dead one is still found and removed."""
    import os
    import socket

    import pytest

    path = str(tmp_path / "trace-00000000a11ce000.sock")
    live = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    live.bind(f"{path}.{os.getpid()}.new")
    live.listen(8)
    os.rename(f"{path}.{os.getpid()}.new", path)
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(tmp_path / "trace-00000000dead0000.sock"))
    dead.close()
    try:
        assert path in record.listening_unix_paths()
        assert record.clear_stale_trace_sockets(str(tmp_path)) == 1
        assert sorted(p.name for p in tmp_path.iterdir()) == ["trace-00000000a11ce000.sock"]
        live.setblocking(False)
        with pytest.raises(BlockingIOError):  # nobody connected: no probe
            live.accept()
    finally:
        live.close()
