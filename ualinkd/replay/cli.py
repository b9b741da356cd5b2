"""The `ualinkd record` and `ualinkd replay` subcommands (issue 12 item 2); cli/main.py only
adds these parsers and dispatches here."""

from __future__ import annotations

import argparse
import os
import sys

from ..podinfo import not_a_node_mount

COMMANDS = ("record", "replay")


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser],
                verbose: argparse.ArgumentParser) -> None:
    rec = sub.add_parser(
        "record", parents=[verbose],
        help="attach to running node daemons and write their session as a JSON recording")
    rec.add_argument("--mount", action="append", required=True, metavar="MOUNT",
                     help="a running node's mount (repeat for several nodes)")
    rec.add_argument("-o", "--output", required=True, metavar="FILE", help="the recording")
    rec.add_argument("--pid", type=int, action="append", metavar="PID",
                     help="only this client's calls (repeatable)")
    rec.add_argument("--duration", type=float, metavar="SECONDS",
                     help="stop after this long (default: until SIGINT/SIGTERM)")
    rep = sub.add_parser(
        "replay", parents=[verbose],
        help="re-issue a recording against a node or pod and print where the answers differ")
    rep.add_argument("recording", metavar="FILE")
    rep.add_argument("--mount", action="append", required=True, metavar="[NODE=]MOUNT",
                     help="where a recorded node's calls go (NODE=MOUNT, once per node); a "
                          "bare MOUNT takes the calls of the one node without its own (a "
                          "one-node recording)")
    rep.add_argument("--pid", type=int, action="append", metavar="PID",
                     help="only this recorded pid's calls (repeatable)")


def run(args: argparse.Namespace) -> int:
    if args.command == "record":
        from .record import record

        with open(args.output, "w", buffering=1) as out:
            try:
                n = record(args.mount, out, set(args.pid) if args.pid else None,
                           args.duration,
                           ready=lambda: print("recording", file=sys.stderr, flush=True))
            except (FileNotFoundError, ConnectionRefusedError) as e:
                print(f"ualinkd record: no node daemon takes recorders there ({e})",
                      file=sys.stderr)
                return 1
            except PermissionError as e:  # (check_trace_dir: the directory is not ours alone)
                print(f"ualinkd record: {e.strerror}", file=sys.stderr)
                return 1
        print(f"ualinkd record: {n} records in {args.output}", file=sys.stderr)
        return 0
    from .issue import run as replay
    from .session import RecordingError

    mounts: list[tuple[str, str]] = []  # as given: the replay refuses a node given twice
    for m in args.mount:
        node, sep, path = m.partition("=")
        mounts.append((node, path) if sep else ("", m))
    for _node, path in mounts:  # (else every call of a typo'd DIR is a "difference")
        if (refusal := not_a_node_mount(os.path.realpath(path))) is not None:
            print(f"ualinkd replay: {refusal}", file=sys.stderr)
            return 2
    try:
        found = replay(args.recording, mounts, set(args.pid) if args.pid else None,
                       verbose=getattr(args, "verbose", False))
    except RecordingError as e:
        print(f"ualinkd replay: {args.recording}: {e}", file=sys.stderr)
        return 2
    return 1 if found else 0
