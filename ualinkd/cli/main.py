"""The `ualinkd` command line: `ualinkd node` (one node daemon), `ualinkd pod` (cli/pod.py),
`check`, `config`, `node-config`, `abi-check`, `run` (cli/run.py), `record`, `replay` and
`timeline`.

`main(argv) -> int` so tests call it directly; `entry()` is the console script.
"""

from __future__ import annotations

import argparse
import errno
import functools
import logging
import os
import socket
import sys

import trio

from .. import __version__, timeline
from ..config import ConfigError, PodConfig, split_address
from ..fabric.auth import node_config, node_keys
from ..replay import cli as replay_cli
from . import run as run_cli
from .common import (
    check_trace_args,
    quirks_arg,
    trace_arg,
    with_quirks,
)
from .pod import (
    ask_pod,
    die_with_pod,
    free_tcp_ports,
    leaves,
    pod_command,
    preloaded_config,
    start_node_command,
    write_private,
)

__all__ = ["ask_pod", "build_parser", "entry", "free_tcp_ports", "main", "write_private"]

log = logging.getLogger("ualinkd")


@functools.cache  # (the nodes `ualinkd pod` forks parse their command line with the pod's)
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
    check.add_argument("--no-resolve", dest="resolve", action="store_false",
                       help="do not resolve the nodes' host names (a file for a container "
                            "network, checked outside it)")
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
        "abi-check", help="compile (never run) a client's uAPI header (amdgpu_drm.h, drm.h, "
                          "kfd_ioctl.h) and compare its structs and ioctl numbers with the "
                          "emulator's")
    abi.add_argument("headers", nargs="+", metavar="HEADER")
    abi.add_argument("-I", dest="include", action="append", default=[], metavar="DIR",
                     help="an include directory for the compiler")
    abi.add_argument("--cflags", default="", metavar="FLAGS",
                     help="more compiler flags, one string (--cflags='-DFOO -m64')")
    node = sub.add_parser("node", parents=[verbose], help="run one node daemon")
    node.add_argument("--config", required=True, help="the pod's TOML file")
    node.add_argument("--node", required=True, help="this node's name in the config")
    node.add_argument("--mount", required=True, help="where to mount the node's files")
    trace_arg(node)
    quirks_arg(node)
    pod = sub.add_parser("pod", parents=[verbose],
                         help="run a whole local pod, one daemon process per node")
    pod.add_argument("--nodes", type=int, default=None, help="nodes, 1..256 (default 2)")
    pod.add_argument("--accels-per-node", type=int, default=None,
                     help="accels (GPUs) per node, 1..8 (default 1)")
    pod.add_argument("--config", default=None, metavar="FILE",
                     help="run the pod FILE describes (`ualinkd check FILE` checks it); node "
                          "NAME is mounted at ROOT/NAME; an address host:0 gets a free port")
    pod.add_argument("--profile", default=None, metavar="NAME",
                     help="every accel's device profile, e.g. mi210 (gfx90a, which Debian's "
                          "ROCr 5.2.3 knows); default: the config's (gfx942)")
    pod.add_argument("--root", default="./ualink-pod", help="node i is mounted at ROOT/node<i>")
    pod.add_argument("--overwrite", action="store_true",
                     help="replace ROOT/pod.toml even if `ualinkd pod` did not write it")
    pod.add_argument("--ready-timeout", type=float, default=30.0, help=argparse.SUPPRESS)
    pod.add_argument("--netns", action="store_true",
                     help="each node in its own network and mount namespace (needs root): "
                          "its own IP on a bridge, /dev/dri/renderD128 inside the node")
    trace_arg(pod)
    quirks_arg(pod)
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
    run_cli.add_parser(sub)
    replay_cli.add_parsers(sub, verbose)
    timeline.add_parser(sub, verbose)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    lead = 0
    while lead < len(argv) and argv[lead] in ("-v", "--verbose"):
        lead += 1
    if lead < len(argv) and argv[lead] not in (
            "node", "pod", "check", "config", "start-node", "node-config", "abi-check", "run", "-h",
            "--help", *replay_cli.COMMANDS, "timeline",
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
            check_trace_args(args)
        if args.command == "check":
            return _check(args)
        if args.command == "run":
            return run_cli.run_command(args)
        if args.command == "start-node":
            return start_node_command(args)
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
        if args.command == "timeline":
            return timeline.run(args)
        return pod_command(args)
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
    # what a node checks next at its start: every link of it has a key (the pod key's form
    # included), whether the links then run under mutual TLS or not
    for n in config.nodes:
        if args.node is None or n.name == args.node:
            node_keys(config, n.name)
    # what a node refuses when it starts or dials: no address, a host that does not resolve
    for n in config.nodes:
        if not n.address:
            raise ConfigError(f"{path}: node {n.name!r} has no address (host:port)")
        host, port = split_address(n.address, f"{path}: node {n.name!r}")
        if args.resolve:
            try:
                socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM)
            except (socket.gaierror, UnicodeError) as e:
                why = e.strerror if isinstance(e, socket.gaierror) else str(e)
                raise ConfigError(f"{path}: node {n.name!r}: host {host!r} of address "
                                  f"{n.address!r} does not resolve here ({why}; "
                                  "--no-resolve checks a file for another network)") from None
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

    if not die_with_pod():
        print(f"ualinkd: {args.node}: the pod that started this node is gone",
              file=sys.stderr)
        return 1
    config = with_quirks(preloaded_config(args.config) or PodConfig.load(args.config),
                         args.kernel_quirks)
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
        failed = leaves(group)
    finally:
        if trace_out is not sys.stdout:
            trace_out.close()
    address = config.node(args.node).address
    for e in failed:
        print(f"ualinkd: {args.node}: {_listen_error(e, address)}", file=sys.stderr)
    return 1 if failed else 0


def _listen_error(e: BaseException, address: str) -> str:
    """A node's start failure in words naming its fabric address: `[Errno 98] Address
    already in use` alone does not say which address, nor who may hold it."""
    if isinstance(e, socket.gaierror):
        host = address.rpartition(":")[0].strip("[]")
        return f"fabric address {address}: host {host!r} does not resolve ({e.strerror})"
    if isinstance(e, OSError) and e.errno == errno.EADDRINUSE:
        return (f"fabric address {address} is in use ({e.strerror}): another pod or program "
                "listens there (ss -ltnp shows which)")
    if isinstance(e, OSError) and e.errno == errno.EADDRNOTAVAIL:
        return f"fabric address {address} is not an address of this host ({e.strerror})"
    return str(e)


def _node_config(args: argparse.Namespace) -> int:
    write_private(args.out, node_config(PodConfig.load(args.config), args.node).to_toml())
    return 0
