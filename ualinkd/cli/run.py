"""`ualinkd run NODE -- PROG ARGS...`: run an unmodified program against one node, with the
LD_PRELOAD shim and the node's directories set (README "Unmodified binaries: the LD_PRELOAD
shim"), as `umockdev-run` does for its devices.

NODE is a node's mount directory (`ualink-pod/node0`), or a node's name with `--root`: the
root of a `ualinkd pod` (ROOT/NAME is its mount) or the state directory of a `ualinkd pod
--netns` (the program then runs inside the node's namespaces, where /dev/dri is the node's).
The program replaces this process (exec): its exit status is the command's.
"""

from __future__ import annotations

import argparse
import os
import sys

from ..podinfo import not_a_node_mount


class RunError(Exception):
    """Why the program cannot be run against that node (one line for the user)."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser(
        "run", help="run a program against a node with the shim set up: "
                    "ualinkd run ualink-pod/node0 -- rocminfo",
        description=__doc__.split("\n\n")[0])
    r.add_argument("node", metavar="NODE",
                   help="a node's mount directory, or a node's name with --root")
    r.add_argument("--root", default=None,
                   help="a `ualinkd pod` root or a `ualinkd pod --netns` pod directory "
                        "holding the node NODE")
    r.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- PROG ARGS",
                   help="the program and its arguments")


def plan(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """(argv to exec, environment variables to set). Raises RunError."""
    from .. import native

    argv = args.argv[1:] if args.argv[:1] == ["--"] else list(args.argv)
    if not argv:
        raise RunError("no program to run: ualinkd run NODE -- PROG ARGS...")
    shim = native.layout().shim
    if not shim.exists():
        raise RunError(f"the shim is not built ({shim}): run `make c` in the checkout")
    env = {"LD_PRELOAD": " ".join(filter(None, (str(shim), os.environ.get("LD_PRELOAD"))))}
    if args.root is not None:
        root = os.path.abspath(args.root)
        if os.path.isfile(os.path.join(root, "pod.json")):  # `ualinkd pod --netns`'s dir
            from ..netns.pod import Pod, PodError

            try:
                node = Pod.attach(root).node(args.node)
                # Inside the node's mount namespace its mount is at node.mount (and bound
                # over /dev/dri, /sys/class/drm…): pointing the shim at the mount itself
                # gives the program what it gives on a local node, sys/module/amdgpu
                # included. Set by env(1) inside, for PROG only: nsenter is not preloaded
                # (the mount is not there on its side).
                env.update(UALINK_DRI_DIR=str(node.mount / "dri"),
                           UALINK_MOUNT=str(node.mount))
                enter = node.enter_cmd(["env", *(f"{k}={v}" for k, v in env.items()),
                                        *argv])
            except (PodError, KeyError, OSError, ValueError) as e:
                raise RunError(f"{args.node} of the pod in {root}: {e}") from None
            return enter, {}
        if not os.path.isdir(root):
            raise RunError(f"--root {args.root}: not a directory")
        path = os.path.join(root, args.node)
    else:
        path = os.path.abspath(args.node)
    path = os.path.realpath(path)  # a symlink to a mount: the mount (mountinfo names it)
    if (refusal := not_a_node_mount(path)) is not None:
        raise RunError(refusal)
    env.update(UALINK_DRI_DIR=os.path.join(path, "dri"), UALINK_MOUNT=path)
    return argv, env


def run_command(args: argparse.Namespace) -> int:
    try:
        argv, env = plan(args)
    except RunError as e:
        print(f"ualinkd run: {e}", file=sys.stderr)
        return 2
    os.environ.update(env)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvp(argv[0], argv)
    except OSError as e:
        print(f"ualinkd run: {argv[0]}: {e.strerror}", file=sys.stderr)
        return 127
