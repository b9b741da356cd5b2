"""`ualinkd record`: attach to running node daemons and write their JSON trace (schema 2,
a recording `ualinkd replay` takes) until interrupted or `--duration` ends.

Each node daemon listens on a unix socket named after its mount (`trace_socket_path`, root's
runtime directory, mode 0600: a trace holds the clients' data). A subscriber gets one JSON
trace line per record from the moment it subscribes, at no cost to clients while nobody is
subscribed. A subscriber that falls more than `QUEUE` records or `QUEUE_BYTES` of them behind
loses records, and is told so by a `{"type": "lost", "count": N}` line (its recording is then
incomplete).

A subscriber says so first (`SUBSCRIBE`, within SUBSCRIBE_TIMEOUT): a connection that does
not — another daemon's sweep of stale sockets (`clear_stale_trace_sockets`) probes every
trace socket of its directory — is closed without ever becoming the node's tracer.

The socket's directory must be the daemon user's alone (`check_trace_dir`): a non-root
daemon's is under the shared /tmp, where another user could have made it first and could
then swap the socket for their own or remove it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import selectors
import signal
import socket
import stat
import tempfile
import time
from collections.abc import Callable
from typing import Protocol, TextIO

import trio

from ..trace import SCHEMA_VERSION, Record

log = logging.getLogger(__name__)

QUEUE = 65536  # records a subscriber may be behind before it loses some
# ... and bytes of them: a 1 MiB GPU load's record is 2 MiB of JSON hex, so a recorder that
# stops reading (Ctrl-Z, a pipe into a pager) would otherwise hold the daemon to 128 GiB.
QUEUE_BYTES = 64 << 20
SUBSCRIBE = b"subscribe\n"  # what a recorder sends first; anything else is not attached
SUBSCRIBE_TIMEOUT = 10.0  # s a connection may take to say it


def trace_socket_path(mount: str, resolved: bool = False) -> str:
    """Where the daemon serving `mount` takes trace subscribers: named by a hash of the
    mount's real path (unix socket paths are short; the mount path may not be). The daemon
    passes the path it resolved before mounting (`resolved`): after, resolving it would ask
    its own FUSE server, which is not serving yet."""
    real = mount if resolved else os.path.realpath(mount)
    digest = hashlib.sha256(real.encode()).hexdigest()[:16]
    base = "/run/ualinkd" if os.geteuid() == 0 else os.path.join(
        tempfile.gettempdir(), f"ualinkd-{os.geteuid()}")
    return os.path.join(base, f"trace-{digest}.sock")


class TraceHub:
    """The node's tracer while subscribers are attached: the daemon's own (`--trace`) plus
    one bounded queue per subscriber."""

    def __init__(self, base: Callable[[Record], None] | None) -> None:
        self.base = base
        # (its queue, [records lost since it was last told, bytes queued for it])
        self.subscribers: list[tuple[trio.MemorySendChannel[str], list[int]]] = []

    def __call__(self, rec: Record) -> None:
        if self.base is not None:
            self.base(rec)
        if not self.subscribers:
            return
        try:
            line = rec.json()
        except Exception:
            log.exception("trace: cannot render the record of %s", rec.name)
            return
        for send, counts in self.subscribers:
            if counts[1] + len(line) > QUEUE_BYTES:
                counts[0] += 1
                continue
            try:
                send.send_nowait(line)
                counts[1] += len(line)
            except trio.WouldBlock:
                counts[0] += 1
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass


def check_trace_dir(directory: str) -> None:
    """Refuse (PermissionError, saying why) a trace-socket directory that is not ours alone:
    a symlink, not a directory, owned by another uid, or writable by group or others.
    Whoever can write the directory can unlink or replace the socket in it, and a recorder
    would then read a trace made up by them (or a daemon give its trace to them)."""
    st = os.lstat(directory)
    why = None
    if not stat.S_ISDIR(st.st_mode):
        why = "is not a directory (a symlink?)"
    elif st.st_uid != os.geteuid():
        why = f"belongs to uid {st.st_uid}, not to us (uid {os.geteuid()})"
    elif st.st_mode & 0o022:
        why = f"is writable by others (mode {stat.S_IMODE(st.st_mode):04o})"
    if why is not None:
        raise PermissionError(errno.EPERM, f"trace socket directory {directory} {why}; "
                              "remove it, or let the daemon's user create it")


async def bind_trace_socket(real_mount: str) -> tuple[trio.socket.SocketType, str]:
    """The listening socket for the subscribers of the mount at `real_mount` (its resolved
    path); a stale socket of a dead daemon goes, this mount's and any other's."""
    path = trace_socket_path(real_mount, resolved=True)
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    check_trace_dir(os.path.dirname(path))
    clear_stale_trace_sockets(os.path.dirname(path))
    # Bound and listening under a name the sweep above does not take, then renamed into
    # place (replacing this mount's old one, if any): a trace-*.sock is never there
    # unlistened, so another daemon's sweep (the nodes of a pod start together) cannot take
    # a socket between its bind and its listen.
    tmp = f"{path}.{os.getpid()}.new"
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        await sock.bind(tmp)
        # No umask dance (process-wide, and the daemon has threads): the directory is the
        # daemon user's alone until the socket is 0600.
        os.chmod(tmp, 0o600)
        sock.listen(8)
        os.rename(tmp, path)
    except OSError:
        sock.close()
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return sock, path


_SO_ACCEPTCON = 0x10000  # /proc/net/unix's flag of a listening socket (include/linux/net.h)


def listening_unix_paths() -> set[str]:
    """The paths of the unix sockets a process listens on in this network namespace
    (/proc/net/unix), a trace socket under the name it had when it started listening
    (`<path>.<pid>.new`, bind_trace_socket's, renamed since) given as its path; empty when
    the file cannot be read."""
    paths: set[str] = set()
    try:
        with open("/proc/net/unix") as f:
            lines = f.read().splitlines()[1:]
    except OSError:
        return paths
    for line in lines:
        parts = line.split(None, 7)
        if len(parts) < 8 or not int(parts[3], 16) & _SO_ACCEPTCON:
            continue
        path = parts[7]
        base, _, pid = path.removesuffix(".new").rpartition(".")
        paths.add(base if path.endswith(".new") and pid.isdigit() else path)
    return paths


def clear_stale_trace_sockets(directory: str) -> int:
    """Unlink the trace sockets in `directory` nobody listens on: a daemon killed (SIGKILL,
    a crash) cannot remove its own, and mounts that are used once (tests, pods under fresh
    roots) would leave one each. A socket that /proc/net/unix says is listened on is left
    alone without a probe: every daemon that starts sweeps, and each probe cost a live
    daemon a wake-up and ~0.2 ms of CPU (a 256-node pod starting on one host: 32,640 of
    them). Any other is probed: a live daemon's (in another network namespace) answers the
    connect (it sees a subscriber come and go, unsubscribed: a probe sends nothing); a
    socket with no listener refuses it. Returns how many went."""
    gone = 0
    try:
        names = os.listdir(directory)
    except OSError:
        return 0
    live = listening_unix_paths()
    for name in names:
        if not (name.startswith("trace-") and name.endswith(".sock")):
            continue
        path = os.path.join(directory, name)
        if path in live:
            continue
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        probe.setblocking(False)
        try:
            probe.connect(path)
        except ConnectionRefusedError:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                gone += 1
        except OSError:  # alive and busy (EAGAIN: a full backlog), gone already, not ours
            pass
        finally:
            probe.close()
    if gone:
        log.info("removed %d stale trace socket(s) of dead daemons from %s", gone, directory)
    return gone


class TracedNode(Protocol):
    """What a recording needs of a node (node.py's NodeCore): its name, and its tracer,
    which the hub takes over while anyone is subscribed."""

    @property
    def name(self) -> str: ...

    @property
    def tracer(self) -> Callable[[Record], None] | None: ...

    @tracer.setter
    def tracer(self, tracer: Callable[[Record], None] | None) -> None: ...


async def serve_trace(core: TracedNode, sock: trio.socket.SocketType, path: str) -> None:
    """Take `ualinkd record` subscribers until cancelled; `core.tracer` is the hub while
    anyone is subscribed and the daemon's own tracer otherwise."""
    base = core.tracer
    hub = TraceHub(base)
    with sock:
        try:
            async with trio.open_nursery() as nursery:
                while True:
                    conn, _ = await sock.accept()
                    nursery.start_soon(_subscriber, conn, core, hub)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)
            core.tracer = base


async def _asked(conn: trio.socket.SocketType) -> bool:
    """Whether the connection asks to subscribe (SUBSCRIBE, in time). Another daemon's
    sweep connects and closes without a word: it must not become a subscriber, which would
    make the node its tracer for a moment, and every GPU access start or end traced."""
    got = b""
    with trio.move_on_after(SUBSCRIBE_TIMEOUT):
        while len(got) < len(SUBSCRIBE) and SUBSCRIBE.startswith(got):
            chunk = await conn.recv(len(SUBSCRIBE) - len(got))
            if not chunk:
                break
            got += chunk
    return got == SUBSCRIBE


async def _subscriber(conn: trio.socket.SocketType, core: TracedNode, hub: TraceHub) -> None:
    with conn:
        try:
            if not await _asked(conn):
                return
        except OSError:
            return
        await _subscribed(conn, core, hub)


async def _subscribed(conn: trio.socket.SocketType, core: TracedNode, hub: TraceHub) -> None:
    send, recv = trio.open_memory_channel[str](QUEUE)
    entry = (send, [0, 0])
    hub.subscribers.append(entry)
    core.tracer = hub
    try:
        with conn:
            hello = {"v": SCHEMA_VERSION, "type": "recording", "time": time.time(),
                     "node": core.name}
            await _send_all(conn, (json.dumps(hello) + "\n").encode())
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_until_closed, conn, nursery.cancel_scope)
                async for line in recv:
                    batch, size = [line], len(line)
                    while len(batch) < 256 and size < 1 << 20:
                        try:
                            batch.append(line := recv.receive_nowait())
                        except trio.WouldBlock:
                            break
                        size += len(line)
                    if entry[1][0]:
                        batch.append(json.dumps({"v": SCHEMA_VERSION, "type": "lost",
                                                 "count": entry[1][0]}))
                        entry[1][0] = 0
                    await _send_all(conn, ("\n".join(batch) + "\n").encode())
                    entry[1][1] -= size  # (held until sent: what QUEUE_BYTES bounds)
    except Exception as e:  # a recorder going away (or anything else) never stops the node
        log.debug("trace subscriber gone: %r", e)
    finally:
        hub.subscribers.remove(entry)
        send.close()
        if not hub.subscribers:
            core.tracer = hub.base


async def _send_all(conn: trio.socket.SocketType, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[await conn.send(view):]


async def _until_closed(conn: trio.socket.SocketType, scope: trio.CancelScope) -> None:
    while await conn.recv(4096):
        pass
    scope.cancel()


def record(mounts: list[str], out: TextIO, pids: set[int] | None = None,
           duration: float | None = None, ready: Callable[[], None] | None = None) -> int:
    """Write the nodes' records to `out` until SIGINT/SIGTERM or `duration` seconds; the
    number of records written. Records of other pids are left out with `pids` (fabric
    records have none: they go too)."""
    socks = []
    for m in mounts:
        path = trace_socket_path(m)
        check_trace_dir(os.path.dirname(path))
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        s.sendall(SUBSCRIBE)
        socks.append(s)
    stop = [False]

    def on_signal(signum: int, frame: object) -> None:
        stop[0] = True

    old = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    sel = selectors.DefaultSelector()
    partial: dict[socket.socket, bytes] = {}
    for s in socks:
        sel.register(s, selectors.EVENT_READ)
        partial[s] = b""
    written = 0
    opened: set[tuple[object, object]] = set()  # the kept pids' files, for their releases
    end = None if duration is None else time.monotonic() + duration
    try:
        # The hello line of each node says it is subscribed: from here on nothing is missed.
        for s in socks:
            while b"\n" not in partial[s]:
                chunk = s.recv(65536)
                if not chunk:
                    raise ConnectionError("the node closed the trace subscription")
                partial[s] += chunk
            _, partial[s] = partial[s].split(b"\n", 1)
        if ready is not None:
            ready()
        while not stop[0] and (end is None or time.monotonic() < end):
            timeout = 0.2 if end is None else max(0.0, min(0.2, end - time.monotonic()))
            for key, _ in sel.select(timeout):
                sub = key.fileobj
                assert isinstance(sub, socket.socket)
                s = sub
                chunk = s.recv(1 << 20)
                if not chunk:
                    sel.unregister(s)
                    continue
                data = partial[s] + chunk
                *lines, partial[s] = data.split(b"\n")
                for line in lines:
                    written += _keep(line, pids, out, opened)
            if partial and not sel.get_map():
                break
        # Drain what the nodes sent before we stopped.
        for s in socks:
            s.setblocking(False)
            with contextlib.suppress(BlockingIOError, OSError):
                while chunk := s.recv(1 << 20):
                    data = partial[s] + chunk
                    *lines, partial[s] = data.split(b"\n")
                    for line in lines:
                        written += _keep(line, pids, out, opened)
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)
        for s in socks:
            s.close()
        out.flush()
    return written


def _keep(line: bytes, pids: set[int] | None, out: TextIO,
          opened: set[tuple[object, object]] | None = None) -> int:
    """Write `line` unless `pids` leaves it out. A release has no pid (FUSE's RELEASE comes
    from the kernel, pid 0): it is kept when `opened` (the (node, file) of the kept pids'
    opens, which this call keeps up to date) has its file, or always without `opened`."""
    if not line.strip():
        return 0
    if pids is not None:
        rec = json.loads(line)
        kind = rec.get("type")
        if kind == "release":
            if opened is not None:
                key = (rec.get("node"), rec.get("file"))
                if key not in opened:
                    return 0
                opened.discard(key)
        elif rec.get("pid") not in pids and kind != "lost":
            return 0
        elif kind == "open" and opened is not None:
            opened.add((rec.get("node"), rec.get("file")))
    out.write(line.decode() + "\n")
    return 1
