"""Run `ualinkd node` with timestamps at the edges of an import, for the per-phase breakdown
of `make bench` (benchmarks/run.py). Nothing in ualinkd changes: this wrapper replaces four
methods with timed copies before the daemon starts, so a daemon started the ordinary way
pays nothing.

    python benchmarks/stamps.py [python] -m ualinkd node --config … --node … --mount …

(the command `start_node` builds, behind this script: its `prefix`). The stamps,
CLOCK_MONOTONIC ns as the C client reads it, go to the JSON file named by
$UALINK_BENCH_STAMPS when the daemon exits:

- ``ioctl_in`` / ``ioctl_out``: NodeCore.ioctl entered / NodeCore._reply done (the ioctl's
  answer is built; the FUSE reply follows) for DRM_IOCTL_AMDGPU_UALINK_HANDLE;
- ``msg_out``: Session.send_messages (each MSG queued to the socket: single sends and batches
  both come through it), with its type (§5.2);
- ``msg_in``: Session.next_event returning a MessageReceived (the MSG decoded; the link's
  reader hands it to its accel's queue in the same call), with its type.

A stamp is (ns, kind, msg type or 0). If a method named here is gone (the daemon was
refactored), the wrapper stops with an error naming it rather than produce a silent gap.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import sys
import time
from typing import Any

from ualinkd.abi import structs
from ualinkd.abi.ioc import DRM_COMMAND_BASE, iowr
from ualinkd.fabric.session import MessageReceived, Session
from ualinkd.node import NodeCore
from ualinkd.ualink.protocol import MSG_TYPE_MASK

# DRM_IOCTL_AMDGPU_UALINK_HANDLE as a caller issues it (uapi: DRM_AMDGPU_UALINK_HANDLE 0x1B)
DRM_IOCTL_AMDGPU_UALINK_HANDLE = iowr(DRM_COMMAND_BASE + 0x1B, structs.UALINK_HANDLE_SIZE)

STAMPS: list[tuple[int, str, int]] = []


def install() -> None:
    now = time.monotonic_ns
    add = STAMPS.append
    cmd_ualink = DRM_IOCTL_AMDGPU_UALINK_HANDLE
    ioctl, reply = NodeCore.ioctl, NodeCore._reply
    send_messages, next_event = Session.send_messages, Session.next_event

    def timed_ioctl(self: NodeCore, drm_file: object, cmd: int, *args: Any) -> Any:
        if cmd == cmd_ualink:
            add((now(), "ioctl_in", 0))
        return ioctl(self, drm_file, cmd, *args)

    def timed_reply(self: NodeCore, res: Any, drm_file: Any, cmd: int, *args: Any) -> Any:
        out = reply(self, res, drm_file, cmd, *args)
        if cmd == cmd_ualink:
            add((now(), "ioctl_out", 0))
        return out

    def timed_send(self: Session, src: int, dst: int, messages: Any) -> list[int]:
        t = now()
        for dwords in messages:
            add((t, "msg_out", dwords[0] & MSG_TYPE_MASK))
        return send_messages(self, src, dst, messages)

    def timed_next_event(self: Session, at: float | None = None) -> Any:
        ev = next_event(self, at)
        if type(ev) is MessageReceived:
            add((now(), "msg_in", ev.dwords[0] & MSG_TYPE_MASK))
        return ev

    # Patched in for the run: the stamps are this benchmark's only, the classes stay as they are.
    NodeCore.ioctl = timed_ioctl  # type: ignore[method-assign]
    NodeCore._reply = timed_reply  # type: ignore[method-assign]
    Session.send_messages = timed_send  # type: ignore[method-assign]
    Session.next_event = timed_next_event  # type: ignore[method-assign]


def _dump(path: str) -> None:
    with open(path, "w") as f:
        json.dump(STAMPS, f)


def main() -> None:
    path = os.environ.get("UALINK_BENCH_STAMPS")
    if not path:
        sys.exit("stamps.py: set UALINK_BENCH_STAMPS to the output file")
    argv = sys.argv[1:]
    if argv and argv[0] != "-m":  # start_node's prefix is followed by its own interpreter
        argv = argv[1:]
    if argv[:2] != ["-m", "ualinkd"]:
        sys.exit("usage: stamps.py -m ualinkd node …")
    install()
    atexit.register(_dump, path)
    sys.argv = ["ualinkd", *argv[2:]]
    runpy.run_module("ualinkd", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
