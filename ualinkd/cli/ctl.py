"""`ualinkctl`: look at a running node through its mount (the sys/ tree)."""

from __future__ import annotations

import argparse
import json
import os
import sys


def read_accels(mount: str) -> list[dict[str, str]]:
    base = os.path.join(mount, "sys", "class", "drm")
    accels = []
    for name in sorted(os.listdir(base)):
        d = os.path.join(base, name, "device", "ualink")
        info = {"render": name}
        for attr in sorted(os.listdir(d)):
            if os.path.isdir(os.path.join(d, attr)):
                continue  # setup/, config/, stations/: the configuration interface
            with open(os.path.join(d, attr)) as f:
                info[attr] = f.read().rstrip("\n")
        accels.append(info)
    return accels


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="ualinkctl", description=__doc__)
    p.add_argument("--mount", required=True, help="the node's mount directory")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("state", help="accel states and pPod/vPod information")
    args = p.parse_args(argv)
    try:
        accels = read_accels(args.mount)
    except OSError as e:
        print(f"ualinkctl: {args.mount}: {e.strerror}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(accels, indent=2))
        return 0
    cols = ["render", "accel_id", "accel_state", "vpod_id", "vpod_active_accels",
            "addr_mode", "local_accels"]
    rows = [cols] + [[a.get(c, "") for c in cols] for a in accels]
    widths = [max(len(r[i]) for r in rows) for i in range(len(cols))]
    for r in rows:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())
    return 0


def entry() -> None:
    sys.exit(main())
