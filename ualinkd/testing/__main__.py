"""Faults on a running namespaced pod from a shell: `python -m ualinkd.testing POD-DIR CMD`.

POD-DIR is the pod's state directory (`ualinkd pod --netns` prints it; tests: `pod.dir`).
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from ..cli.ctl import msg_type
from ..netns.pod import Pod, PodError
from ..sysfs import RENDER_MINOR_BASE


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ualinkd.testing", description=__doc__)
    p.add_argument("pod_dir", help="the pod's state directory (holds pod.json)")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("status", help="nodes, addresses, pids, links")
    for name, text in (("kill", "SIGKILL the node's daemon"),
                       ("stop", "SIGSTOP it (a hung node)"), ("cont", "SIGCONT it"),
                       ("cut", "take its link down"), ("heal", "bring its link up")):
        sub.add_parser(name, help=text).add_argument("node")
    sub.add_parser("start", help="start a stopped or killed node again (a `ualinkd pod "
                   "--netns` pod: its own process starts it)").add_argument("node")
    n = sub.add_parser("netem", help="tc netem delay/loss on the node's eth0 (0 0: off)")
    n.add_argument("node")
    n.add_argument("--delay-ms", type=float, default=0)
    n.add_argument("--loss-pct", type=float, default=0)
    d = sub.add_parser("drop-next", help="drop the next message of a type (§5.12 bitmap)")
    d.add_argument("node")
    d.add_argument("msg_type", type=msg_type, help="a name (NPA_RSP) or a number")
    d.add_argument("--minor", type=int, default=RENDER_MINOR_BASE)
    sub.add_parser("deactivate", help="take an accel out of its vPod").add_argument(
        "accel", type=int)
    v = sub.add_parser("set-vpod", help="make ACCELS the vPod ID (leaving others first)")
    v.add_argument("vpod_id", type=int)
    v.add_argument("accels", type=int, nargs="+")
    r = sub.add_parser("run", help="run a command inside the node's namespaces")
    r.add_argument("node")
    r.add_argument("argv", nargs=argparse.REMAINDER)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "start":
        return _ask_pod(args.pod_dir, f"start {args.node}")
    try:
        pod = Pod.attach(args.pod_dir)
        cmd = args.command
        if cmd == "status":
            for node in pod.nodes:
                try:
                    links = " ".join(f"{peer}:{'up' if up else 'DOWN'}" for peer, up in
                                     (node.fabric() if node.running else {}).items())
                except PodError:  # stopped: the read gave up instead of waiting for it
                    links = "not answering (stopped?)"
                print(f"{node.name} ip={node.ip} netns={node.netns} pid={node.pid or '-'} "
                      f"accels={','.join(map(str, node.accels))} {links}".rstrip())
        elif cmd in ("kill", "stop", "cont", "cut", "heal"):
            getattr(pod.node(args.node), cmd)()
        elif cmd == "netem":
            pod.node(args.node).netem(args.delay_ms, args.loss_pct)
        elif cmd == "drop-next":
            pod.node(args.node).drop_next(args.msg_type, args.minor)
        elif cmd == "deactivate":
            pod.deactivate(args.accel)
        elif cmd == "set-vpod":
            pod.set_vpod(args.vpod_id, args.accels)
        elif cmd == "run":
            argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
            return subprocess.run(pod.node(args.node).enter_cmd(argv)).returncode
    except (PodError, KeyError, ValueError, OSError) as e:
        print(f"ualinkd.testing: {e}", file=sys.stderr)
        return 1
    return 0


def _ask_pod(pod_dir: str, request: str) -> int:
    """One request to the process that owns the pod (ualinkd pod --netns): a node it starts
    stays its own (closed with the pod)."""
    from ..cli.main import ask_pod

    ok, text = ask_pod(pod_dir, request, 90)
    if ok:
        print(text)
        return 0
    if text.startswith("no running pod"):
        text += "; in a test, pod.node(NAME).start()"
    print(f"ualinkd.testing: {text}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
