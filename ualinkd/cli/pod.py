"""`ualinkd pod`: a whole local pod, one node daemon process a node, and `ualinkd start-node`.
A pod's nodes never outlive it: SIGINT, SIGTERM and SIGHUP stop it in order, and a killed pod
takes its nodes with it (parent-death signal); one pod at a time runs on a root. The node side
of that contract is `die_with_pod`.

The pod imports the node daemon's code once and forks each node from itself (`_fork_node`):
a node is `ualinkd node` run in the child, with the command line it would have had, and the
0.4 s of CPU its imports take is not paid again by each of 64 nodes on a machine of 2 CPUs.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import fcntl
import gc
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import NoReturn

from .. import sysfs
from ..amdgpu.profile import PROFILES
from ..config import ConfigError, NodeConfig, PodConfig
from ..fabric.dialing import links_at_start
from ..podinfo import NODES_FILE  # beside pod.toml, for all: the nodes without the key
from ..readiness import notify_socket, wait_ready
from .common import ready_stream, trace_options, with_quirks

log = logging.getLogger("ualinkd")


# Set by `ualinkd pod` for the node daemons it starts: the pod's pid. A node that finds it
# asks for SIGTERM when that process dies (see die_with_pod).
POD_PID_ENV = "UALINKD_POD_PID"
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_PR_SET_NAME = 15
_PR_SET_MM, _PR_SET_MM_MAP = 35, 14
# How long a new pod waits for the node daemons of a pod that just died to unmount.
_LIVE_MOUNT_GRACE = 5.0
_POD_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_NODE_DIR_RE = re.compile(r"node\d+")  # where `ualinkd pod` mounts its nodes


def die_with_pod() -> bool:
    """When `ualinkd pod` started this node ($UALINKD_POD_PID): have the kernel send us
    SIGTERM when the pod process dies, however it dies (SIGKILL included), so that no node
    outlives its pod with a live mount; SIGTERM unmounts cleanly. False if the pod is
    already gone. The signal comes when the *thread* that forked us exits: the pod forks
    from its main thread. Set here rather than in a preexec_fn because `ualinkd pod
    --netns` starts nodes through ip/unshare/nodeinit, which all exec: this process still
    has the pod as its parent."""
    pod_pid = os.environ.pop(POD_PID_ENV, None)  # not for anything this node starts
    if pod_pid is None:
        return True
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG): {os.strerror(err)}")
    # The pod may have died before the prctl, when no signal was armed yet: then our
    # parent is someone else (init or a subreaper).
    return os.getppid() == int(pod_pid)


def leaves(group: BaseExceptionGroup) -> list[BaseException]:
    return [leaf for e in group.exceptions
            for leaf in (leaves(e) if isinstance(e, BaseExceptionGroup) else [e])]


# The first line of a pod.toml that `ualinkd pod` wrote for its run: such a file is the pod's
# to rewrite at its next start; any other pod.toml is the user's and is never overwritten
# without --overwrite (issue 32, item 3).
GENERATED_MARK = ("# written by `ualinkd pod` for its nodes (it rewrites this file at its next "
                  "start; run your own with --config FILE)")

_NODE_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")  # a name usable as ROOT/NAME


def _signal_status(signum: int) -> int:
    """A pod stopped by a signal before it was ready exits as a shell reports a process
    killed by it (128 + the signal): it did not do what was asked."""
    return 128 + signum


def pod_config(args: argparse.Namespace) -> PodConfig:
    """The pod to run: --config's file, or --nodes x --accels-per-node local nodes; with
    --profile every accel's device profile, and --kernel-quirks added. Raises ConfigError."""
    if args.config is not None:
        if args.nodes is not None or args.accels_per_node is not None:
            raise ConfigError("--config FILE says the nodes and accels: not with --nodes or "
                              "--accels-per-node")
        if args.netns:
            raise ConfigError("--config is for a local pod (a --netns pod gives its nodes "
                              "their own addresses): use --nodes and --accels-per-node")
        config = PodConfig.load(args.config)
        for n in config.nodes:
            if not _NODE_NAME_RE.fullmatch(n.name) or n.name == "pod.toml":
                raise ConfigError(f"{args.config}: node name {n.name!r} cannot be a "
                                  "directory name under --root (letters, digits, _ . -)")
        # "host:0" (any free port) is filled in here: each node must know its peers' ports.
        free = iter(free_tcp_ports(sum(n.address.endswith(":0") for n in config.nodes)))
        config = replace(config, nodes=tuple(
            replace(n, address=f"{n.address[:-2]}:{next(free)}") if n.address.endswith(":0")
            else n for n in config.nodes))
    else:
        nodes = 2 if args.nodes is None else args.nodes
        per = 1 if args.accels_per_node is None else args.accels_per_node
        if not 1 <= nodes <= 256 or not 1 <= per <= 8:
            raise ConfigError("--nodes must be 1..256 and --accels-per-node 1..8")
        if args.netns:
            from ..netns.pod import pod_config as netns_pod_config  # addresses: Pod's

            config = netns_pod_config(nodes, per)
        else:
            config = PodConfig.local(nodes, per, free_tcp_ports(nodes))
    if args.profile is not None:
        config = with_profile(config, args.profile)
    return with_quirks(config, args.kernel_quirks)


def with_profile(config: PodConfig, profile: str) -> PodConfig:
    """Every accel of `config` with the device profile `profile` (amdgpu/profile.py)."""
    if profile not in PROFILES:
        raise ConfigError(f"--profile {profile!r} is not a device profile (one of "
                          f"{', '.join(sorted(PROFILES))})")
    return replace(config, nodes=tuple(
        replace(n, accels=tuple(replace(a, profile=profile) for a in n.accels))
        for n in config.nodes))


def _usable_root(path: str) -> str:
    """--root made absolute and created; a ConfigError (not a traceback) when it cannot
    be: a file, a parent that is a file, no permission."""
    root = os.path.abspath(path)
    if os.path.exists(root) and not os.path.isdir(root):
        raise ConfigError(f"--root {path}: not a directory")
    try:
        os.makedirs(root, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--root {path}: cannot create it: {e.strerror}") from None
    return root


def _uses_its_file(args: argparse.Namespace, root: str, config: PodConfig) -> bool:
    """The pod runs from its --config file as it is: the file is ROOT/pod.toml and the pod
    changes nothing in it (no host:0, --profile or --kernel-quirks)."""
    path = os.path.join(root, "pod.toml")
    return (args.config is not None and os.path.exists(path)
            and os.path.samefile(args.config, path)
            and PodConfig.load(args.config).to_toml() == config.to_toml())


def _refuse_overwrite(root: str, config_file: str | None, overwrite: bool) -> None:
    """ROOT/pod.toml, about to be written, is replaced only if `ualinkd pod` wrote it
    (GENERATED_MARK) or --overwrite says so."""
    path = os.path.join(root, "pod.toml")
    if overwrite or not os.path.exists(path):
        return
    try:
        with open(path) as f:
            first = f.readline().rstrip("\n")
    except OSError as e:
        raise ConfigError(f"{path}: {e.strerror}") from None
    if first != GENERATED_MARK:
        if config_file is None:
            fix = f"run that pod with --config {path}"
        elif os.path.exists(config_file) and os.path.samefile(config_file, path):
            fix = ("it would be rewritten with this pod's changes (free ports, --profile, "
                   "--kernel-quirks): copy it elsewhere and give that to --config")
        else:
            fix = "give this pod another --root"
        raise ConfigError(f"{path} is not one `ualinkd pod` wrote: {fix}, or pass "
                          "--overwrite to replace it")


def _refuse_nonempty(root: str, names: list[str]) -> None:
    """A node is never mounted over a directory that holds something (its files would be
    hidden while the pod runs); stale mounts were cleared before this."""
    for name in names:
        path = os.path.join(root, name)
        if os.path.isdir(path) and not os.path.ismount(path) and os.listdir(path):
            raise ConfigError(f"{path} is not empty: a node is mounted there; empty it or "
                              "give another --root")
        if os.path.exists(path) and not os.path.isdir(path):
            raise ConfigError(f"{path} is not a directory: a node is mounted there")


def pod_command(args: argparse.Namespace) -> int:
    config = pod_config(args)  # ConfigError: main prints it, exit status 2
    root = _usable_root(args.root)
    if args.netns:
        return _pod_netns(args, config)

    stop = 0

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stop
        stop = signum

    _catch_pod_signals(on_signal)

    # Nothing under ROOT is rewritten before we know this pod can run there: pod.toml is
    # the config of whatever nodes still serve ROOT, and holds their key.
    with _root_lock(root) as locked:
        if not locked:
            print(f"ualinkd: another `ualinkd pod` is running on {root}", file=sys.stderr)
            return 1
        names = [n.name for n in config.nodes]
        own_file = _uses_its_file(args, root, config)
        if not own_file:
            _refuse_overwrite(root, args.config, args.overwrite)
        try:
            busy = _clear_old_mounts(root, lambda: bool(stop), set(names))
        except (OSError, subprocess.CalledProcessError) as e:  # the latter: fusermount3 -uz
            print(f"ualinkd: {e}", file=sys.stderr)
            return 1
        if stop:
            return _signal_status(stop)
        if busy:
            print(f"ualinkd: {', '.join(busy)} {'is' if len(busy) == 1 else 'are'} still "
                  "served by a live FUSE server (a node of an earlier pod?): stop it first",
                  file=sys.stderr)
            return 1
        _refuse_nonempty(root, names)
        return _run_local_pod(args, root, config, lambda: stop, write_config=not own_file)


_CONTROL = ".control"  # under ROOT: `ualinkd start-node` asks the running pod through it
_CONTROL_READ_TIMEOUT = 2.0  # a control connection's request must come within this
_CONTROL_WAITING_MAX = 64  # connections whose request has not come yet; more are closed


class NodeProcess:
    """A node daemon forked by the pod (`_fork_node`), with the part of subprocess.Popen's
    interface the pod uses: pid, returncode, poll, wait, send_signal, kill."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"node {self.pid}", timeout or 0.0)
            time.sleep(0.01)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # not a pid reused by someone else once reaped
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


@dataclass
class _Child:
    """One node daemon of a local pod and its readiness socket."""

    name: str
    mount: str
    proc: NodeProcess
    sock: socket.socket
    reported: bool = False  # its exit was reported


def _ready_line(c: _Child, node: NodeConfig) -> str:
    """The line saying a node serves: the pod's, and start-node's when it is started again."""
    ids = ",".join(str(a.accel_id) for a in node.accels)
    renders = ",".join(f"{c.mount}/dri/renderD{sysfs.RENDER_MINOR_BASE + i}"
                       for i in range(len(node.accels)))
    return f"{c.name} ready: mount={c.mount} render={renders} accels={ids}"


def _spawn_node(args: argparse.Namespace, root: str, conf_path: str, name: str) -> _Child:
    mount = os.path.join(root, name)
    notify_path = os.path.join(root, f".notify-{name}")
    sock = notify_socket(notify_path)
    argv = ["node", "--config", conf_path, "--node", name, "--mount", mount,
            *trace_options(args)]
    env = {"NOTIFY_SOCKET": notify_path, POD_PID_ENV: str(os.getpid())}
    return _Child(name, mount, _fork_node(argv, env), sock)


_CMDLINE: list[ctypes.Array[ctypes.c_char]] = []  # a forked node's command line, kept alive
# The pod's config file as this process loaded it, for the nodes it forks: parsing the
# pod.toml of 256 nodes takes 0.1 s, more than half of a forked node's start-up, and 256
# nodes on 2 CPUs would pay it 256 times. Keyed by the file's identity, size and mtime.
_PRELOADED: dict[str, tuple[tuple[int, int, int], PodConfig]] = {}


def _file_key(path: str) -> tuple[int, int, int]:
    st = os.stat(path)
    return st.st_ino, st.st_size, st.st_mtime_ns


def _preload_config(path: str) -> None:
    key = _file_key(path)
    _PRELOADED[os.path.abspath(path)] = key, PodConfig.load(path)


def preloaded_config(path: str) -> PodConfig | None:
    """The config at `path` as the pod that forked this node loaded it, if the file has not
    changed since (else None: load it)."""
    entry = _PRELOADED.get(os.path.abspath(path))
    try:
        return entry[1] if entry is not None and entry[0] == _file_key(path) else None
    except OSError:
        return None


def _fork_node(argv: list[str], env: dict[str, str]) -> NodeProcess:
    """`ualinkd ARGV` (a node) in a child forked from this process, with `env` added to
    ours: what `python -m ualinkd ARGV` would run, without importing its code again. The
    pod has no threads, so the child has all it needs; it keeps none of our fds, and the
    objects it has from us are never collected (gc.freeze: a socket of ours, finalized in
    the child, would close an fd number the node uses by then)."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # else what is still buffered here would be written twice
    gc.freeze()
    pid = os.fork()
    if pid:
        gc.unfreeze()
        return NodeProcess(pid)
    _node_child(argv, env)


def _node_child(argv: list[str], env: dict[str, str]) -> NoReturn:
    code = 1
    try:
        # A session of its own: the terminal's SIGINT/SIGHUP reach the pod only, which
        # stops the nodes in order; the nodes die with the pod through POD_PID_ENV.
        os.setsid()
        for fd in map(int, os.listdir("/proc/self/fd")):  # (SC_OPEN_MAX may be 2^30)
            if fd > 2:
                with contextlib.suppress(OSError):  # (the listing's own, closed by now)
                    os.close(fd)
        for sig in _POD_SIGNALS:  # as after exec: ours reset, an inherited SIG_IGN kept
            if signal.getsignal(sig) != signal.SIG_IGN:
                signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT
                              else signal.SIG_DFL)
        os.environ.update(env)
        sys.argv = [sys.argv[0], *argv]
        _set_cmdline([sys.executable, "-m", "ualinkd", *argv], argv[argv.index("--node") + 1])
        logging.root.handlers.clear()  # the node's own logging set-up, not ours
        from .main import main

        code = main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


class _PrctlMmMap(ctypes.Structure):
    """struct prctl_mm_map (<linux/prctl.h>)."""

    _fields_ = [*((f, ctypes.c_uint64) for f in (
        "start_code", "end_code", "start_data", "end_data", "start_brk", "brk", "start_stack",
        "arg_start", "arg_end", "env_start", "env_end", "auxv")),
        ("auxv_size", ctypes.c_uint32), ("exe_fd", ctypes.c_uint32)]


def _set_cmdline(argv: list[str], name: str) -> None:
    """What ps, pgrep -f and /proc/PID/cmdline show for this forked node: `argv`, as if it
    had been exec'd. prctl(PR_SET_MM_MAP) moves the kernel's idea of where the arguments
    are to a buffer of ours; every other field of the map is given as it is (from
    /proc/self/stat, the break from sbrk(0) just before the call), and the auxv and the exe
    link are left alone (a kernel without CONFIG_CHECKPOINT_RESTORE refuses it). Refused:
    the pod's command line stays, and the process is named `ualinkd-NAME` (ps -o comm, top,
    pgrep NAME)."""
    buf = ctypes.create_string_buffer(b"".join(os.fsencode(a) + b"\0" for a in argv))
    with open("/proc/self/stat") as f:
        stat = f.read().rpartition(")")[2].split()  # fields 3, 4, ...

    def field(n: int) -> int:  # proc(5) numbers them from 1
        return int(stat[n - 3])

    mm = _PrctlMmMap(start_code=field(26), end_code=field(27), start_stack=field(28),
                     start_data=field(45), end_data=field(46), start_brk=field(47),
                     arg_start=ctypes.addressof(buf),
                     arg_end=ctypes.addressof(buf) + len(buf) - 1,  # past the last NUL
                     env_start=field(50), env_end=field(51), auxv=0, auxv_size=0,
                     exe_fd=0xFFFFFFFF)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.sbrk.restype = ctypes.c_void_p
    # Nothing between these two calls may move the break (the map sets it): no malloc of
    # a size pymalloc does not serve itself.
    mm.brk = libc.sbrk(0)
    if libc.prctl(_PR_SET_MM, _PR_SET_MM_MAP, ctypes.byref(mm), ctypes.sizeof(mm), 0) == 0:
        _CMDLINE.append(buf)
        return
    libc.prctl(_PR_SET_NAME, ctypes.c_char_p(f"ualinkd-{name}"[:15].encode()), 0, 0, 0)


def _exit_text(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited with status {code}"


def _write_nodes_file(root: str, config: PodConfig) -> None:
    """ROOT/.nodes.json (NODES_FILE), mode 0644: what `ualinkctl pod ROOT` shows of the
    nodes, for a user who cannot read pod.toml; never a key."""
    nodes = [{"name": n.name, "address": n.address,
              "accels": [a.accel_id for a in n.accels]} for n in config.nodes]
    tmp = os.path.join(root, f"{NODES_FILE}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.fchmod(fd, 0o644)
    with os.fdopen(fd, "w") as f:
        json.dump({"nodes": nodes}, f)
    os.replace(tmp, os.path.join(root, NODES_FILE))


def _run_local_pod(args: argparse.Namespace, root: str, config: PodConfig,
                   stopping: Callable[[], int], write_config: bool = True) -> int:
    conf_path = os.path.join(root, "pod.toml")
    if write_config:  # it holds the pod key
        write_private(conf_path, f"{GENERATED_MARK}\n{config.to_toml()}")
    _write_nodes_file(root, config)
    _preload_config(conf_path)
    if args.trace_file:
        open(args.trace_file, "w").close()  # this pod's trace; its nodes append to it
    ready_out = ready_stream(args)
    from .. import daemon  # noqa: F401  # imported once, for every node forked from here

    children: dict[str, _Child] = {}
    control: _ControlRequests | None = None
    try:
        for node in config.nodes:
            children[node.name] = _spawn_node(args, root, conf_path, node.name)
        for c in children.values():
            if not wait_ready(c.sock, c.proc, args.ready_timeout, lambda: bool(stopping())):
                if stopping():  # Ctrl-C while starting: the pod never served
                    return _signal_status(stopping())
                print(f"ualinkd: {c.name} did not become ready", file=sys.stderr)
                return 1
        if links_at_start(config.fabric_links, len(config.nodes)):
            for c in children.values():
                _wait_links(c.name, c.mount, args.ready_timeout, lambda: bool(stopping()))
        else:  # (fabric/dialing.py: a pair's link comes up when the pair first needs it)
            log.info("%d nodes: each fabric link comes up on its first use", len(children))
        if stopping():
            return _signal_status(stopping())
        for c, node in zip(children.values(), config.nodes, strict=True):
            print(_ready_line(c, node), file=ready_out, flush=True)
        control = _ControlRequests(_control_socket(root))
        while not stopping():
            for c in children.values():
                if (code := c.proc.poll()) is not None and not c.reported:
                    # One node's end is a fault to study, not the pod's end (issue 11).
                    c.reported = True
                    alive = [o.name for o in children.values() if o.proc.poll() is None]
                    print(f"ualinkd: {c.name} {_exit_text(code)}; "
                          f"{', '.join(alive) or 'no node'} keep{'s' * (len(alive) == 1)} "
                          f"running (start it again: ualinkd start-node --root {root} "
                          f"{c.name})", file=sys.stderr, flush=True)
            _serve_control(control, args, root, conf_path, children, stopping)
            time.sleep(0.1)
    finally:
        if control is not None:
            control.close()
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(root, _CONTROL))
        _stop_children([(c.name, c.mount, c.proc, c.sock) for c in children.values()])
    # A node that was down when the pod stopped is reported in the exit status.
    return 1 if any(c.reported for c in children.values()) else 0


def _control_socket(root: str) -> socket.socket:
    path = os.path.join(root, _CONTROL)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # ours: the root lock says no other pod runs here
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o077)  # the pod's owner only, like pod.toml
    try:
        sock.bind(path)
    finally:
        os.umask(old)
    sock.listen(4)
    sock.setblocking(False)
    return sock


def _serve_control(control: _ControlRequests, args: argparse.Namespace, root: str,
                   conf_path: str, children: dict[str, _Child],
                   stopping: Callable[[], int]) -> None:
    """Answer `ualinkd start-node` requests: one line in ("start NAME"), one line out."""
    control.serve(lambda words: _start_again(words, args, root, conf_path, children,
                                             stopping))


class _ControlRequests:
    """The control socket of a running pod: each connection one request in (its words, one
    read), one answer line out ("ok: …" or "error: …"). Requests are read without
    blocking: a client that connects and sends nothing holds up neither the pod's loop
    (which watches its nodes) nor the clients behind it; it is closed after
    _CONTROL_READ_TIMEOUT. An answer may take a while (a node started again)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._waiting: list[tuple[socket.socket, float]] = []  # (connection, deadline)

    def serve(self, answer: Callable[[list[str]], str]) -> None:
        now = time.monotonic()
        while True:
            try:
                conn, _ = self.sock.accept()
            except BlockingIOError:
                break
            if len(self._waiting) >= _CONTROL_WAITING_MAX:
                conn.close()
                continue
            conn.setblocking(False)
            self._waiting.append((conn, now + _CONTROL_READ_TIMEOUT))
        waiting, self._waiting = self._waiting, []
        for conn, deadline in waiting:
            try:
                request = conn.recv(256)
            except BlockingIOError:
                if time.monotonic() < deadline:
                    self._waiting.append((conn, deadline))
                else:
                    conn.close()
                continue
            except OSError:
                conn.close()
                continue
            with conn:
                reply = answer(request.decode(errors="replace").split())
                conn.settimeout(_CONTROL_READ_TIMEOUT)
                with contextlib.suppress(OSError):
                    conn.sendall(reply.encode() + b"\n")

    def close(self) -> None:
        for conn, _ in self._waiting:
            conn.close()
        self._waiting.clear()
        self.sock.close()


def _start_again(words: list[str], args: argparse.Namespace, root: str, conf_path: str,
                 children: dict[str, _Child], stopping: Callable[[], int]) -> str:
    if len(words) != 2 or words[0] != "start":
        return "error: unknown request"
    name = words[1]
    old = children.get(name)
    if old is None:
        return f"error: no node {name!r} in this pod (have: {', '.join(children)})"
    if old.proc.poll() is None:
        return f"error: {name} is running (pid {old.proc.pid})"
    old.sock.close()
    new = _spawn_node(args, root, conf_path, name)
    children[name] = new
    if not wait_ready(new.sock, new.proc, args.ready_timeout, lambda: bool(stopping())):
        new.reported = new.proc.poll() is not None
        return f"error: {name} did not become ready"
    ready = _ready_line(new, PodConfig.load(conf_path).node(name))
    print(f"{ready} (started again)", file=ready_stream(args), flush=True)
    return f"ok: {ready}"


def ask_pod(pod_dir: str, request: str, timeout: float) -> tuple[bool, str]:
    """One request to the process that runs a pod (`ualinkd pod`, `ualinkd pod --netns`)
    through its control socket in `pod_dir`: (answered ok, the answer or why not)."""
    path = os.path.join(os.path.abspath(pod_dir), _CONTROL)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(path)
            s.sendall(request.encode())
            reply = s.makefile().readline().strip()
    except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError):
        return False, f"no running pod to ask in {pod_dir} (no {path})"
    except OSError as e:  # e.g. a socket of another user's pod (EACCES)
        return False, f"cannot ask the pod in {pod_dir}: {path}: {e.strerror}"
    except TimeoutError:
        return False, f"the pod did not answer in {timeout:g} s"
    if reply.startswith("ok: "):
        return True, reply[4:]
    return False, reply.removeprefix("error: ") or "the pod closed the connection"


def start_node_command(args: argparse.Namespace) -> int:
    """`ualinkd start-node --root ROOT NODE`: ask the `ualinkd pod` serving ROOT to start
    its node NODE again (after it died or was killed)."""
    ok, text = ask_pod(args.root, f"start {args.node}", args.timeout)
    if ok:
        print(text)
        return 0
    if text.startswith("no running pod"):
        text = f"no `ualinkd pod` is running on {args.root} ({text})"
    print(f"ualinkd: {text}", file=sys.stderr)
    return 1


def _pod_netns(args: argparse.Namespace, config: PodConfig) -> int:
    """`ualinkd pod --netns`: the local pod through ualinkd.netns, one namespace a node."""
    from ..netns.pod import Pod, PodError, PodUnavailable

    stop = 0

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stop
        stop = signum

    # Before Pod.start: it turns a SIGHUP still at its default into SystemExit(129).
    _catch_pod_signals(on_signal)
    if args.trace and not args.trace_file:
        print("ualinkd: the trace goes to each node's daemon log in the pod dir, which is "
              "deleted on exit; --trace-file FILE keeps it", file=sys.stderr)
    pod = Pod(config, trace=args.trace, state_root=os.path.abspath(args.root),
              ready_timeout=args.ready_timeout, trace_file=args.trace_file,
              trace_filter=args.trace_filter)
    # Pod starts each node with our environment, through ip netns exec, unshare and
    # nodeinit, which all exec: the node's parent is this process, and it dies with it.
    os.environ[POD_PID_ENV] = str(os.getpid())
    try:
        try:
            try:
                pod.start()
            finally:
                os.environ.pop(POD_PID_ENV, None)  # not for the clients run in the pod
        except PodUnavailable as e:
            print(f"ualinkd: {e}", file=sys.stderr)
            return 1
        except PodError as e:
            print(f"ualinkd: {e}", file=sys.stderr)
            return 1
        if stop:  # interrupted while the nodes started: the pod never served
            return _signal_status(stop)
        for node in pod.nodes:
            ids = ",".join(map(str, node.accels))
            renders = ",".join(f"/dev/dri/renderD{sysfs.RENDER_MINOR_BASE + i}"
                               for i in range(len(node.accels)))
            print(f"{node.name} ready: ip={node.ip} netns={node.netns} pid={node.pid} "
                  f"render={renders} (inside the node) accels={ids}", flush=True)
        first = pod.nodes[0]
        print(f"pod dir: {pod.dir}\n"
              f"run a client inside {first.name}: nsenter --net=/run/netns/{first.netns} "
              f"--mount=/proc/{first.pid}/ns/mnt -- CMD  (plain `ip netns exec "
              f"{first.netns} CMD` gives the network only, not /dev/dri)\n"
              f"  or, with the shim set up: ualinkd run --root {pod.dir} {first.name} -- CMD\n"
              f"  or: {sys.executable} -m ualinkd.testing {pod.dir} run {first.name} -- CMD\n"
              f"faults: {sys.executable} -m ualinkd.testing {pod.dir} "
              "kill|stop|cont|cut|heal NODE, drop-next NODE NPA_RSP, status", flush=True)
        dead: set[str] = set()

        def start_again(words: list[str]) -> str:
            # `python -m ualinkd.testing POD-DIR start NODE`: the node is started by this
            # process, so it stays this pod's (its child, closed with it).
            if len(words) != 2 or words[0] != "start":
                return "error: unknown request"
            try:
                node = pod.node(words[1])
                node.start()
                pod.wait_links()
            except (PodError, KeyError) as e:
                return f"error: {e}"
            dead.discard(node.name)
            print(f"{node.name} ready: ip={node.ip} pid={node.pid} (started again)", flush=True)
            return f"ok: {node.name} ready: pid={node.pid}"

        control = _ControlRequests(_control_socket(str(pod.dir)))
        try:
            while not stop:
                for node in pod.nodes:
                    if not node.running and node.name not in dead:
                        dead.add(node.name)
                        print(f"ualinkd: {node.name} is not running any more (start it "
                              f"again: {sys.executable} -m ualinkd.testing {pod.dir} start "
                              f"{node.name})", file=sys.stderr, flush=True)
                control.serve(start_again)
                time.sleep(0.1)
        finally:
            control.close()
    finally:
        os.environ.pop(POD_PID_ENV, None)
        pod.close()
    return 0


def _catch_pod_signals(handler: Callable[[int, object], None]) -> None:
    """SIGINT, SIGTERM and SIGHUP (terminal closed, ssh dropped) stop the pod, except a
    SIGHUP inherited as ignored: `nohup ualinkd pod &` must survive the hangup."""
    for sig in _POD_SIGNALS:
        if sig == signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN:
            continue
        signal.signal(sig, handler)


@contextlib.contextmanager
def _root_lock(root: str) -> Iterator[bool]:
    """An exclusive flock on the pod's root directory while the pod runs: True when we got
    it, False when another pod holds it. The kernel lets go when the pod dies, however it
    dies; the nodes never hold it (Popen closes every other fd)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
        except OSError as e:  # e.g. NFS: no locks on a directory there
            log.warning("cannot lock %s (%s): not guarding against a second pod", root,
                        e.strerror)
            yield True
        else:
            yield True
    finally:
        os.close(fd)


def _clear_old_mounts(root: str, stopping: Callable[[], bool],
                      names: set[str] | None = None) -> list[str]:
    """Make the `node<i>` mount points under `root` usable (DESIGN: stale mounts are cleared
    at the next start): a dead FUSE mount (its daemon was SIGKILL'd) is unmounted lazily; a
    live one gets _LIVE_MOUNT_GRACE seconds to go, as the nodes of a pod that just died
    unmount on their parent-death SIGTERM. The mount points still live after that.
    `names`: the nodes of this pod (a --config pod's names need not be node<i>)."""
    from ..fuse.lowlevel import clear_stale_mount, fuse_mounts_under

    deadline = time.monotonic() + _LIVE_MOUNT_GRACE
    while True:
        busy = []
        # Parsed from mountinfo, once a pass: no stat into a server that may hang.
        mounted = sorted({path for path in fuse_mounts_under(root)
                          if os.path.dirname(path) == root
                          and (_NODE_DIR_RE.fullmatch(os.path.basename(path))
                               or os.path.basename(path) in (names or ()))})
        for path in mounted:
            if not _answers_in_time(path):
                busy.append(path)  # a stopped server: statfs here would never return
                continue
            try:
                clear_stale_mount(path)
            except OSError as e:
                if e.errno != errno.EBUSY:
                    raise
                busy.append(path)
        if not busy or time.monotonic() >= deadline or stopping():
            return busy
        time.sleep(0.1)


def _answers_in_time(path: str, timeout: float = 2.0) -> bool:
    """statfs of a FUSE mount from a child process: False if it has not returned within
    `timeout` (its server is alive but stopped); the child, still waiting for a request the
    server never read, dies of the SIGKILL. A dead server answers at once (ENOTCONN)."""
    try:
        subprocess.run(["stat", "-f", "-c", "%T", path], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return False
    return True


def write_private(path: str | os.PathLike[str], text: str) -> None:
    """Write `text` to `path`, readable by its owner only (a pod config holds the key)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT
    with os.fdopen(fd, "w") as f:
        f.write(text)


def free_tcp_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """n ports nobody listens on right now (the kernel picks them; we let go at once)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _wait_links(name: str, mount: str, timeout: float,
                stopping: Callable[[], bool] = lambda: False) -> None:
    """Until the node's fabric links to every peer are up, so the pod is usable at once."""
    from .. import sysfs

    status = os.path.join(mount, sysfs.FABRIC_STATUS)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not stopping():
        with open(status) as f:
            if all(sysfs.parse_fabric(f.read()).values()):
                return
        time.sleep(0.05)
    log.warning("%s: some fabric links are still down", name)


def _stop_children(children: list[tuple[str, str, NodeProcess, socket.socket]]) -> None:
    from ..fuse.lowlevel import clear_stale_mount

    for _, _, proc, _ in children:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for name, mount, proc, sock in children:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop in 10 s; killing it", name)
            proc.kill()
            proc.wait()
        with contextlib.suppress(OSError):
            os.unlink(sock.getsockname())  # before close(): a closed socket has no name
        sock.close()
        try:
            clear_stale_mount(mount)
        except OSError as e:
            log.warning("%s: could not clear %s: %s", name, mount, e)
