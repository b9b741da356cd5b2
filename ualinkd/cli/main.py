"""`ualinkd node` (one node daemon) and `ualinkd pod` (a whole local pod, one process a node).
A pod's nodes never outlive it: SIGINT, SIGTERM and SIGHUP stop it in order, and a killed pod
takes its nodes with it (parent-death signal); one pod at a time runs on a root.

`main(argv) -> int` so tests call it directly; `entry()` is the console script.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import fcntl
import functools
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import TextIO

import trio

from .. import __version__
from ..config import ConfigError, PodConfig
from ..fabric.auth import node_config, node_keys
from ..readiness import notify_socket, wait_ready
from ..replay import cli as replay_cli

log = logging.getLogger("ualinkd")

# Set by `ualinkd pod` for the node daemons it starts: the pod's pid. A node that finds it
# asks for SIGTERM when that process dies (see _die_with_pod).
POD_PID_ENV = "UALINKD_POD_PID"
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# How long a new pod waits for the node daemons of a pod that just died to unmount.
_LIVE_MOUNT_GRACE = 5.0
_POD_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_NODE_DIR_RE = re.compile(r"node\d+")  # where `ualinkd pod` mounts its nodes


def _trace_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--trace", nargs="?", const="text", choices=["text", "json"], default=None,
        help="one line per ioctl, GPU load/store and fabric message, strace-style (--trace=json:"
             " one JSON object a line), to stdout or --trace-file",
    )
    p.add_argument("--trace-file", metavar="FILE", default=None,
                   help="write the trace to FILE (a pod's nodes share it) instead of stdout")
    p.add_argument("--trace-filter", metavar="KEY=V[,V]", action="append", default=[],
                   help="trace only what matches (repeatable, terms AND): kind=ioctl,gpu,fabric"
                        " ioctl=GEM_VA,UALINK_HANDLE node=NAME accel=N pid=N failed")


def _trace_options(args: argparse.Namespace) -> list[str]:
    """The trace options again, for the node daemons a pod starts."""
    if not args.trace:
        return []
    out = [f"--trace={args.trace}"]
    if args.trace_file:
        out.append(f"--trace-file={os.path.abspath(args.trace_file)}")
    out += [f"--trace-filter={t}" for t in args.trace_filter]
    return out


def _check_trace_args(args: argparse.Namespace) -> None:
    from ..trace import TraceFilter

    if (args.trace_file or args.trace_filter) and not args.trace:
        raise ConfigError("--trace-file and --trace-filter need --trace")
    try:
        TraceFilter(args.trace_filter)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _ready_stream(args: argparse.Namespace) -> TextIO:
    """Where a pod's `ready` lines go: stdout, unless the trace goes there (then stdout holds
    the trace and nothing else, so `ualinkd pod --trace=json | jq` reads only JSON)."""
    return sys.stderr if args.trace and not args.trace_file else sys.stdout


def _quirks_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--kernel-quirks", default=None, metavar="NAME[,NAME]",
        help="switch on kernel quirks (Emulator policy 2), e.g. hello-no-reset; "
             "adds to the pod config's kernel_quirks",
    )


def _with_quirks(config: PodConfig, names: str | None) -> PodConfig:
    if not names:
        return config
    cfg = replace(config, kernel_quirks=config.kernel_quirks
                  | frozenset(q.strip() for q in names.split(",") if q.strip()))
    cfg.validate()
    return cfg


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ualinkd", description=__doc__.split("\n\n")[0])
    p.add_argument("--version", action="version", version=f"ualinkd {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    # -v after the subcommand too (`ualinkd pod -v`): SUPPRESS keeps a leading -v when the
    # subcommand's own is absent.
    verbose = argparse.ArgumentParser(add_help=False)
    verbose.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                         help="debug logging")
    sub = p.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", parents=[verbose],
                           help="validate a pod's TOML file without running anything")
    check.add_argument("file", nargs="?", metavar="POD.toml", help="the pod's TOML file")
    check.add_argument("--config", help="the same, as the other commands spell it")
    check.add_argument("--node", help="also check that this node is in it")
    cfg = sub.add_parser("config", help="where the C side is, pkg-config style: "
                         "cc prog.c $(ualinkd config --cflags --libs)")
    for flag, what in (("--cflags", "the compiler flags for <ualink/ualink.h>"),
                       ("--libs", "the linker flags for libualink.so"),
                       ("--shim", "the LD_PRELOAD shim's path"),
                       ("--libdir", "the directory of libualink.so"),
                       ("--includedir", "the directory holding ualink/"),
                       ("--bindir", "the directory of the example clients"),
                       ("--pkgconfig-path", "a PKG_CONFIG_PATH entry for ualink.pc"),
                       ("--wireshark", "the fabric protocol's Wireshark dissector: "
                                       "tshark -X lua_script:$(ualinkd config --wireshark)")):
        cfg.add_argument(flag, action="append_const", const=flag, dest="what", help=what)
    abi = sub.add_parser(
        "abi-check", help="compile a client's uAPI header (amdgpu_drm.h, drm.h) and compare "
                          "its structs and ioctl numbers with the emulator's")
    abi.add_argument("headers", nargs="+", metavar="HEADER")
    abi.add_argument("-I", dest="include", action="append", default=[], metavar="DIR",
                     help="an include directory for the compiler")
    abi.add_argument("--cflags", default="", metavar="FLAGS",
                     help="more compiler flags, one string (--cflags='-DFOO -m64')")
    node = sub.add_parser("node", parents=[verbose], help="run one node daemon")
    node.add_argument("--config", required=True, help="the pod's TOML file")
    node.add_argument("--node", required=True, help="this node's name in the config")
    node.add_argument("--mount", required=True, help="where to mount the node's files")
    _trace_arg(node)
    _quirks_arg(node)
    pod = sub.add_parser("pod", parents=[verbose],
                         help="run a whole local pod, one daemon process per node")
    pod.add_argument("--nodes", type=int, default=2)
    pod.add_argument("--accels-per-node", type=int, default=1)
    pod.add_argument("--root", default="./ualink-pod", help="node i is mounted at ROOT/node<i>")
    pod.add_argument("--ready-timeout", type=float, default=30.0, help=argparse.SUPPRESS)
    pod.add_argument("--netns", action="store_true",
                     help="each node in its own network and mount namespace (needs root): "
                          "its own IP on a bridge, /dev/dri/renderD128 inside the node")
    _trace_arg(pod)
    _quirks_arg(pod)
    again = sub.add_parser("start-node", parents=[verbose],
                           help="start a node of a running `ualinkd pod` again")
    again.add_argument("node")
    again.add_argument("--root", default="./ualink-pod", help="the pod's --root")
    again.add_argument("--timeout", type=float, default=60.0, help=argparse.SUPPRESS)
    own = sub.add_parser(
        "node-config", help="the pod config for one node alone: its own link keys, no pod key "
                            "(holding it proves that node and no other)")
    own.add_argument("--config", required=True, help="the pod's TOML file (with the pod key)")
    own.add_argument("--node", required=True, help="the node the file is for")
    own.add_argument("--out", required=True, help="where to write it (mode 0600)")
    replay_cli.add_parsers(sub, verbose)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    lead = 0
    while lead < len(argv) and argv[lead] in ("-v", "--verbose"):
        lead += 1
    if lead < len(argv) and argv[lead] not in (
            "node", "pod", "check", "config", "start-node", "node-config", "abi-check", "-h",
            "--help", *replay_cli.COMMANDS,
            "--version") and any(
            a == "--config" or a.startswith("--config=") for a in argv[lead:]):
        # DESIGN.md's "Pod configuration" spells it without the subcommand: the same thing,
        # its options in any order (`ualinkd -v --node n --config pod.toml --mount m`).
        argv = [*argv[:lead], "node", *argv[lead:]]
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    try:
        if args.command in ("node", "pod"):
            _check_trace_args(args)
        if args.command == "check":
            return _check(args)
        if args.command == "start-node":
            return _start_node(args)
        if args.command == "config":
            return _native_config(args.what or [])
        if args.command == "node":
            return _node(args)
        if args.command == "node-config":
            return _node_config(args)
        if args.command == "abi-check":
            return _abi_check(args)
        if args.command in replay_cli.COMMANDS:
            return replay_cli.run(args)
        return _pod(args)
    except ConfigError as e:
        print(f"ualinkd: {e}", file=sys.stderr)
        return 2


def _check(args: argparse.Namespace) -> int:
    """`ualinkd check`: the whole validation a start would do (PodConfig.load), nothing run."""
    path = args.file or args.config
    if path is None or (args.file and args.config):
        raise ConfigError("check needs one pod file: ualinkd check POD.toml")
    config = PodConfig.load(path)
    if args.node is not None:
        config.node(args.node)
    accels = sum(len(n.accels) for n in config.nodes)
    print(f"{path}: ok: {len(config.nodes)} node{'s' * (len(config.nodes) != 1)}, "
          f"{accels} accel{'s' * (accels != 1)}, {len(config.vpods)} vPod"
          f"{'s' * (len(config.vpods) != 1)}, {'mutual TLS' if config.tls_ca else 'key'} "
          "authentication")
    return 0


def _abi_check(args: argparse.Namespace) -> int:
    """`ualinkd abi-check HEADER...`: one line per mismatch or note; 1 on any mismatch, 2 when
    the header does not compile."""
    import shlex

    from .. import abi_check as check

    cflags = [f"-I{d}" for d in args.include] + shlex.split(args.cflags)
    try:
        report = check.check(args.headers, cflags)
    except check.CompileError as e:
        print(f"ualinkd: {e}", file=sys.stderr)
        return 2
    for line in report.lines():
        print(line)
    return 0 if report.ok else 1


def _native_config(what: list[str]) -> int:
    """`ualinkd config --cflags --libs ...`: one line, the answers in the order asked."""
    from .. import native

    lay = native.layout()
    if what == ["--wireshark"]:  # a Lua file: no C build needed
        print(lay.wireshark)
        return 0
    if not lay.library.exists():
        print(f"ualinkd: libualink.so is not built ({lay.library}): run `make c` in the "
              "checkout", file=sys.stderr)
        return 1
    answers = {
        "--cflags": f"-I{lay.include_dir}",
        "--libs": f"-L{lay.lib_dir} -Wl,-rpath,{lay.lib_dir} -lualink",
        "--shim": str(lay.shim),
        "--libdir": str(lay.lib_dir),
        "--includedir": str(lay.include_dir),
        "--bindir": str(lay.bin_dir),
        "--pkgconfig-path": str(lay.pkgconfig_dir or ""),
        "--wireshark": str(lay.wireshark),
    }
    if not what:
        for flag, value in answers.items():
            print(f"{flag[2:]}: {value}")
        return 0
    print(" ".join(answers[w] for w in what))
    return 0


def entry() -> None:
    sys.exit(main())


def _node(args: argparse.Namespace) -> int:
    from ..daemon import run_node

    if not _die_with_pod():
        print(f"ualinkd: {args.node}: the pod that started this node is gone",
              file=sys.stderr)
        return 1
    config = _with_quirks(PodConfig.load(args.config), args.kernel_quirks)
    node_keys(config, args.node)  # fail early on an unknown name or a link without a key
    from ..daemon import open_trace_file
    from ..trace import TraceFilter

    failed: list[BaseException] = []
    trace_out = open_trace_file(args.trace_file) if args.trace else sys.stdout
    trace_filter = TraceFilter(args.trace_filter)
    run = functools.partial(run_node, trace_filter=trace_filter)
    try:
        profile = os.environ.get("UALINKD_PROFILE")  # developers: cProfile output file
        if profile:
            import cProfile

            cProfile.runctx("trio.run(run, config, args.node, args.mount, args.trace, "
                            "trace_out)", globals(), {**locals(), "run": run},
                            f"{profile}.{args.node}")
        else:
            trio.run(run, config, args.node, args.mount, args.trace, trace_out)
    except* OSError as group:  # e.g. the fabric port in use, raised inside trio's nursery
        failed = _leaves(group)
    finally:
        if trace_out is not sys.stdout:
            trace_out.close()
    for e in failed:
        print(f"ualinkd: {args.node}: {e}", file=sys.stderr)
    return 1 if failed else 0


def _node_config(args: argparse.Namespace) -> int:
    write_private(args.out, node_config(PodConfig.load(args.config), args.node).to_toml())
    return 0


def _die_with_pod() -> bool:
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


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    return [leaf for e in group.exceptions
            for leaf in (_leaves(e) if isinstance(e, BaseExceptionGroup) else [e])]


def _pod(args: argparse.Namespace) -> int:
    if not 1 <= args.nodes <= 256 or not 1 <= args.accels_per_node <= 8:
        print("ualinkd: --nodes must be 1..256 and --accels-per-node 1..8", file=sys.stderr)
        return 2
    if args.netns:
        return _pod_netns(args)
    root = os.path.abspath(args.root)
    os.makedirs(root, exist_ok=True)

    stop = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    _catch_pod_signals(on_signal)

    # Nothing under ROOT is rewritten before we know this pod can run there: pod.toml is
    # the config of whatever nodes still serve ROOT, and holds their key.
    with _root_lock(root) as locked:
        if not locked:
            print(f"ualinkd: another `ualinkd pod` is running on {root}", file=sys.stderr)
            return 1
        try:
            busy = _clear_old_mounts(root, lambda: stop)
        except (OSError, subprocess.CalledProcessError) as e:  # the latter: fusermount3 -uz
            print(f"ualinkd: {e}", file=sys.stderr)
            return 1
        if stop:
            return 0
        if busy:
            print(f"ualinkd: {', '.join(busy)} {'is' if len(busy) == 1 else 'are'} still "
                  "served by a live FUSE server (a node of an earlier pod?): stop it first",
                  file=sys.stderr)
            return 1
        config = _with_quirks(
            PodConfig.local(args.nodes, args.accels_per_node, free_tcp_ports(args.nodes)),
            args.kernel_quirks)
        return _run_local_pod(args, root, config, lambda: stop)


_CONTROL = ".control"  # under ROOT: `ualinkd start-node` asks the running pod through it


@dataclass
class _Child:
    """One node daemon of a local pod and its readiness socket."""

    name: str
    mount: str
    proc: subprocess.Popen[bytes]
    sock: socket.socket
    reported: bool = False  # its exit was reported


def _spawn_node(args: argparse.Namespace, root: str, conf_path: str, name: str) -> _Child:
    mount = os.path.join(root, name)
    notify_path = os.path.join(root, f".notify-{name}")
    sock = notify_socket(notify_path)
    cmd = [sys.executable, "-m", "ualinkd", "node", "--config", conf_path,
           "--node", name, "--mount", mount, *_trace_options(args)]
    env = {**os.environ, "NOTIFY_SOCKET": notify_path, POD_PID_ENV: str(os.getpid())}
    # A session of its own: the terminal's SIGINT/SIGHUP reach the pod only, which
    # stops the nodes in order; the nodes die with the pod through POD_PID_ENV.
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    return _Child(name, mount, proc, sock)


def _exit_text(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited with status {code}"


def _run_local_pod(args: argparse.Namespace, root: str, config: PodConfig,
                   stopping: Callable[[], bool]) -> int:
    conf_path = os.path.join(root, "pod.toml")
    write_private(conf_path, config.to_toml())  # it holds the pod key
    if args.trace_file:
        open(args.trace_file, "w").close()  # this pod's trace; its nodes append to it
    ready_out = _ready_stream(args)
    children: dict[str, _Child] = {}
    control: socket.socket | None = None
    try:
        for node in config.nodes:
            children[node.name] = _spawn_node(args, root, conf_path, node.name)
        for c in children.values():
            if not wait_ready(c.sock, c.proc, args.ready_timeout, stopping):
                if stopping():  # Ctrl-C while starting
                    return 0
                print(f"ualinkd: {c.name} did not become ready", file=sys.stderr)
                return 1
        for c in children.values():
            _wait_links(c.name, c.mount, args.ready_timeout, stopping)
        for c, node in zip(children.values(), config.nodes, strict=True):
            ids = ",".join(str(a.accel_id) for a in node.accels)
            print(f"{c.name} ready: mount={c.mount} render={c.mount}/dri/renderD128 "
                  f"accels={ids}", file=ready_out, flush=True)
        control = _control_socket(root)
        while not stopping():
            for c in children.values():
                if c.proc.poll() is not None and not c.reported:
                    # One node's end is a fault to study, not the pod's end (issue 11).
                    c.reported = True
                    alive = [o.name for o in children.values() if o.proc.poll() is None]
                    print(f"ualinkd: {c.name} {_exit_text(c.proc.returncode)}; "
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


def _serve_control(control: socket.socket, args: argparse.Namespace, root: str,
                   conf_path: str, children: dict[str, _Child],
                   stopping: Callable[[], bool]) -> None:
    """Answer `ualinkd start-node` requests: one line in ("start NAME"), one line out."""
    _serve_requests(control, lambda words: _start_again(words, args, root, conf_path,
                                                        children, stopping))


def _serve_requests(control: socket.socket, answer: Callable[[list[str]], str]) -> None:
    """The control socket of a running pod: each connection one request line in (its
    words), one answer line out ("ok: …" or "error: …")."""
    while True:
        try:
            conn, _ = control.accept()
        except BlockingIOError:
            return
        with conn:
            conn.settimeout(2)
            try:
                words = conn.recv(256).decode(errors="replace").split()
            except OSError:
                continue
            reply = answer(words)
            with contextlib.suppress(OSError):
                conn.sendall(reply.encode() + b"\n")


def _start_again(words: list[str], args: argparse.Namespace, root: str, conf_path: str,
                 children: dict[str, _Child], stopping: Callable[[], bool]) -> str:
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
    if not wait_ready(new.sock, new.proc, args.ready_timeout, stopping):
        new.reported = new.proc.poll() is not None
        return f"error: {name} did not become ready"
    print(f"{name} ready: mount={new.mount} render={new.mount}/dri/renderD128 (started "
          "again)", file=_ready_stream(args), flush=True)
    return f"ok: {name} ready: mount={new.mount}"


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
    except (FileNotFoundError, ConnectionRefusedError):
        return False, f"no running pod to ask in {pod_dir} (no {path})"
    except TimeoutError:
        return False, f"the pod did not answer in {timeout:g} s"
    if reply.startswith("ok: "):
        return True, reply[4:]
    return False, reply.removeprefix("error: ") or "the pod closed the connection"


def _start_node(args: argparse.Namespace) -> int:
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


def _pod_netns(args: argparse.Namespace) -> int:
    """`ualinkd pod --netns`: the local pod through ualinkd.testing, one namespace a node."""
    from ..testing import Pod, PodError, PodUnavailable, pod_config

    stop = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    # Before Pod.start: it turns a SIGHUP still at its default into SystemExit(129).
    _catch_pod_signals(on_signal)
    config = _with_quirks(pod_config(args.nodes, args.accels_per_node), args.kernel_quirks)
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
        for node in pod.nodes:
            ids = ",".join(map(str, node.accels))
            print(f"{node.name} ready: ip={node.ip} netns={node.netns} pid={node.pid} "
                  f"render=/dev/dri/renderD128 (inside the node) accels={ids}", flush=True)
        first = pod.nodes[0]
        print(f"pod dir: {pod.dir}\n"
              f"run a client inside {first.name}: nsenter --net=/run/netns/{first.netns} "
              f"--mount=/proc/{first.pid}/ns/mnt -- CMD  (plain `ip netns exec "
              f"{first.netns} CMD` gives the network only, not /dev/dri)\n"
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

        control = _control_socket(str(pod.dir))
        try:
            while not stop:
                for node in pod.nodes:
                    if not node.running and node.name not in dead:
                        dead.add(node.name)
                        print(f"ualinkd: {node.name} is not running any more (start it "
                              f"again: {sys.executable} -m ualinkd.testing {pod.dir} start "
                              f"{node.name})", file=sys.stderr, flush=True)
                _serve_requests(control, start_again)
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


def _clear_old_mounts(root: str, stopping: Callable[[], bool]) -> list[str]:
    """Make the `node<i>` mount points under `root` usable (DESIGN: stale mounts are cleared
    at the next start): a dead FUSE mount (its daemon was SIGKILL'd) is unmounted lazily; a
    live one gets _LIVE_MOUNT_GRACE seconds to go, as the nodes of a pod that just died
    unmount on their parent-death SIGTERM. The mount points still live after that."""
    from ..fuse.lowlevel import clear_stale_mount, fuse_mounts_under

    deadline = time.monotonic() + _LIVE_MOUNT_GRACE
    while True:
        busy = []
        # Parsed from mountinfo, once a pass: no stat into a server that may hang.
        mounted = sorted({path for path in fuse_mounts_under(root)
                          if os.path.dirname(path) == root
                          and _NODE_DIR_RE.fullmatch(os.path.basename(path))})
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


def _stop_children(children: list[tuple[str, str, subprocess.Popen[bytes], socket.socket]]) -> None:
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
