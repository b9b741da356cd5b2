"""The options `ualinkd node` and `ualinkd pod` share (trace and kernel-quirk switches), and
how a pod passes them on to the node daemons it starts."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from typing import TextIO

from ..config import ConfigError, PodConfig


def trace_arg(p: argparse.ArgumentParser) -> None:
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


def trace_options(args: argparse.Namespace) -> list[str]:
    """The trace options again, for the node daemons a pod starts."""
    if not args.trace:
        return []
    out = [f"--trace={args.trace}"]
    if args.trace_file:
        out.append(f"--trace-file={os.path.abspath(args.trace_file)}")
    out += [f"--trace-filter={t}" for t in args.trace_filter]
    return out


def check_trace_args(args: argparse.Namespace) -> None:
    from ..trace import TraceFilter

    if (args.trace_file or args.trace_filter) and not args.trace:
        raise ConfigError("--trace-file and --trace-filter need --trace")
    try:
        TraceFilter(args.trace_filter)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def ready_stream(args: argparse.Namespace) -> TextIO:
    """Where a pod's `ready` lines go: stdout, unless the trace goes there (then stdout holds
    the trace and nothing else, so `ualinkd pod --trace=json | jq` reads only JSON)."""
    return sys.stderr if args.trace and not args.trace_file else sys.stdout


def quirks_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--kernel-quirks", default=None, metavar="NAME[,NAME]",
        help="switch on kernel quirks (Emulator policy 2), e.g. hello-no-reset; "
             "adds to the pod config's kernel_quirks",
    )


def with_quirks(config: PodConfig, names: str | None) -> PodConfig:
    if not names:
        return config
    asked = frozenset(q.strip() for q in names.split(",") if q.strip())
    # named as the user gave them: the option, not the config's source (`<built-in>` for
    # the pod `ualinkd pod` makes up)
    from ..ualink.manager import KNOWN_QUIRKS

    if unknown := asked - KNOWN_QUIRKS:
        raise ConfigError(f"--kernel-quirks: unknown kernel quirk"
                          f"{'s' * (len(unknown) > 1)} {', '.join(sorted(unknown))} "
                          f"(known: {', '.join(sorted(KNOWN_QUIRKS))})")
    cfg = replace(config, kernel_quirks=config.kernel_quirks | asked)
    cfg.validate()
    return cfg
