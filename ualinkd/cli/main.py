"""`ualinkd node` (one node daemon) and `ualinkd pod` (a whole local pod, one process a node).

`main(argv) -> int` so tests call it directly; `entry()` is the console script.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace

import trio

from ..config import ConfigError, PodConfig

log = logging.getLogger("ualinkd")


def _trace_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--trace", nargs="?", const="text", choices=["text", "json"], default=None,
        help="print one line per ioctl to stdout (--trace=json: one JSON object a line)",
    )


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
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True)
    node = sub.add_parser("node", help="run one node daemon")
    node.add_argument("--config", required=True, help="the pod's TOML file")
    node.add_argument("--node", required=True, help="this node's name in the config")
    node.add_argument("--mount", required=True, help="where to mount the node's files")
    _trace_arg(node)
    _quirks_arg(node)
    pod = sub.add_parser("pod", help="run a whole local pod, one daemon process per node")
    pod.add_argument("--nodes", type=int, default=2)
    pod.add_argument("--accels-per-node", type=int, default=1)
    pod.add_argument("--root", default="./ualink-pod", help="node i is mounted at ROOT/node<i>")
    pod.add_argument("--ready-timeout", type=float, default=30.0, help=argparse.SUPPRESS)
    pod.add_argument("--netns", action="store_true",
                     help="each node in its own network and mount namespace (needs root): "
                          "its own IP on a bridge, /dev/dri/renderD128 inside the node")
    _trace_arg(pod)
    _quirks_arg(pod)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0].startswith("--config"):
        # DESIGN.md's "Pod configuration" spells it without the subcommand: the same thing.
        argv = ["node", *argv]
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    try:
        if args.command == "node":
            return _node(args)
        return _pod(args)
    except ConfigError as e:
        print(f"ualinkd: {e}", file=sys.stderr)
        return 2


def entry() -> None:
    sys.exit(main())


def _node(args: argparse.Namespace) -> int:
    from ..daemon import run_node

    config = _with_quirks(PodConfig.load(args.config), args.kernel_quirks)
    config.node(args.node)  # fail early on an unknown name
    failed: list[BaseException] = []
    try:
        profile = os.environ.get("UALINKD_PROFILE")  # developers: cProfile output file
        if profile:
            import cProfile

            cProfile.runctx("trio.run(run_node, config, args.node, args.mount, args.trace)",
                            globals(), {**locals(), "run_node": run_node},
                            f"{profile}.{args.node}")
        else:
            trio.run(run_node, config, args.node, args.mount, args.trace)
    except* OSError as group:  # e.g. the fabric port in use, raised inside trio's nursery
        failed = _leaves(group)
    for e in failed:
        print(f"ualinkd: {args.node}: {e}", file=sys.stderr)
    return 1 if failed else 0


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
    config = _with_quirks(
        PodConfig.local(args.nodes, args.accels_per_node, free_tcp_ports(args.nodes)),
        args.kernel_quirks)
    conf_path = os.path.join(root, "pod.toml")
    write_private(conf_path, config.to_toml())  # it holds the pod key

    stop = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    children: list[tuple[str, str, subprocess.Popen[bytes], socket.socket]] = []
    status = 0
    try:
        for node in config.nodes:
            mount = os.path.join(root, node.name)
            notify_path = os.path.join(root, f".notify-{node.name}")
            if os.path.exists(notify_path):
                os.unlink(notify_path)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sock.bind(notify_path)
            cmd = [sys.executable, "-m", "ualinkd", "node", "--config", conf_path,
                   "--node", node.name, "--mount", mount]
            if args.trace:
                cmd.append(f"--trace={args.trace}")
            env = dict(os.environ, NOTIFY_SOCKET=notify_path)
            proc = subprocess.Popen(cmd, env=env, start_new_session=True)
            children.append((node.name, mount, proc, sock))
        for name, _, proc, sock in children:
            if not _wait_ready(sock, proc, args.ready_timeout, lambda: stop):
                if stop:  # Ctrl-C while starting
                    return 0
                print(f"ualinkd: {name} did not become ready", file=sys.stderr)
                return 1
        for name, mount, _, _ in children:
            _wait_links(name, mount, args.ready_timeout)
        for (name, mount, _, _), node in zip(children, config.nodes, strict=True):
            ids = ",".join(str(a.accel_id) for a in node.accels)
            print(f"{name} ready: mount={mount} render={mount}/dri/renderD128 accels={ids}",
                  flush=True)
        while not stop:
            for name, _, proc, _ in children:
                if proc.poll() is not None:
                    print(f"ualinkd: {name} exited with status {proc.returncode}",
                          file=sys.stderr)
                    stop, status = True, 1
            time.sleep(0.1)
    finally:
        _stop_children(children)
    return status


def _pod_netns(args: argparse.Namespace) -> int:
    """`ualinkd pod --netns`: the local pod through ualinkd.testing, one namespace a node."""
    from ..testing import Pod, PodError, PodUnavailable, pod_config

    stop = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    config = _with_quirks(pod_config(args.nodes, args.accels_per_node), args.kernel_quirks)
    pod = Pod(config, trace=args.trace, state_root=os.path.abspath(args.root),
              ready_timeout=args.ready_timeout)
    try:
        try:
            pod.start()
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
        while not stop:
            for node in pod.nodes:
                if not node.running and node.name not in dead:
                    dead.add(node.name)
                    print(f"ualinkd: {node.name} is not running any more", file=sys.stderr)
            time.sleep(0.1)
    finally:
        pod.close()
    return 0


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


def _wait_ready(sock: socket.socket, proc: subprocess.Popen[bytes], timeout: float,
                stopping: object) -> bool:
    deadline = time.monotonic() + timeout
    sock.settimeout(0.1)
    while time.monotonic() < deadline:
        try:
            if b"READY=1" in sock.recv(256):
                return True
        except TimeoutError:
            pass
        if proc.poll() is not None or stopping():  # type: ignore[operator]
            return False
    return False


def _wait_links(name: str, mount: str, timeout: float) -> None:
    """Until the node's fabric links to every peer are up, so the pod is usable at once."""
    status = os.path.join(mount, "sys", "kernel", "debug", "ualink_fabric")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(status) as f:
            if " down" not in f.read():
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
