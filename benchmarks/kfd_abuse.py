"""Issue 29's KFD figures on one real node, before and after a fix (run as root):

    .venv/bin/python benchmarks/kfd_abuse.py            # this tree
    PYTHONPATH=<old tree> .venv/bin/python <old tree>/../benchmarks/kfd_abuse.py

- WAIT_EVENTS of N events naming one signaled event (poll): how long the call took, and the
  longest a GET_VERSION of another kfd file waited meanwhile (the node's serving thread);
- MAP_MEMORY_TO_GPU with 16M device ids: errno, time, and the daemon's peak RSS growth;
- a uid-nobody process given the pid of root's exited KFD process (its forked worker still
  holding the kfd file): EXPORT_DMABUF of root's allocation handle (0 = root's VRAM exported);
- ACQUIRE_VM of a render file another KFD process acquired.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import struct
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))

from nodes import call_errno as kfd_call  # noqa: E402
from nodes import running_node  # noqa: E402
from test_kfd_pid_reuse import (  # noqa: E402
    acquire_twice,
    attack,
    rss_kib,
    serving_gaps,
    victim,
)

from ualinkd.abi import ioctls as tbl  # noqa: E402
from ualinkd.config import PodConfig  # noqa: E402


def wait_events(node, n: int) -> str:
    fd = os.open(node.mount / "kfd", os.O_RDWR)
    try:
        _, out = kfd_call(fd, tbl.KFD_CREATE_EVENT.cmd, struct.pack("<QIIIIII", 0, 0, 0, 0,
                                                                    0, 0, 0))
        event_id = struct.unpack("<QIIIIII", out)[1]
        kfd_call(fd, tbl.KFD_SET_EVENT.cmd, struct.pack("<II", event_id, 0))
        entries = ctypes.create_string_buffer(struct.pack("<32xQII", 0, event_id, 0) * n)

        def wait() -> tuple[int, bytes, float]:
            t = time.monotonic()
            err, out = kfd_call(fd, tbl.KFD_WAIT_EVENTS.cmd, struct.pack(
                "<QIIII", ctypes.addressof(entries), n, 1, 0, 0xFF))
            return err, out, time.monotonic() - t

        gap, (err, out, took) = serving_gaps(node, wait)
        return (f"WAIT_EVENTS {n:>9,} events: {errno.errorcode.get(err, err)!s:>7}, "
                f"wait_result {struct.unpack('<QIIII', out)[4]}, call {took:6.2f} s, "
                f"another caller blocked up to {gap:6.2f} s")
    finally:
        os.close(fd)


def map_16m(node) -> str:
    fd = os.open(node.mount / "kfd", os.O_RDWR)
    try:
        ids = ctypes.create_string_buffer(4 * (16 << 20))
        before = rss_kib(node.proc.pid)
        t = time.monotonic()
        err, _ = kfd_call(fd, tbl.KFD_MAP_MEMORY_TO_GPU.cmd,
                          struct.pack("<QQII", 1 << 32, ctypes.addressof(ids), 16 << 20, 0))
        took = time.monotonic() - t
        grew = (rss_kib(node.proc.pid) - before) / 1024
        return (f"MAP_MEMORY_TO_GPU 16M device ids: {errno.errorcode.get(err, err)}, "
                f"{took:.2f} s, daemon peak RSS +{grew:.0f} MiB")
    finally:
        os.close(fd)


def pid_reuse(node) -> str:
    with victim(node) as (pid, handle):
        got_pid, err = attack(node, pid, handle)
    return (f"pid reuse: uid nobody as pid {got_pid} (root's was {pid}): EXPORT_DMABUF of "
            f"root's handle -> {errno.errorcode.get(err, err)}")


def acquire_twice_row(node) -> str:
    err = acquire_twice(node)
    return f"ACQUIRE_VM of another KFD process's compute VM: {errno.errorcode.get(err, err)}"


def main() -> int:
    root = Path(tempfile.mkdtemp(prefix="ualinkd-kfdabuse-"))
    root.chmod(0o755)
    try:
        with running_node(root, PodConfig.local(1, 1)) as node:
            for n in (74_898, 250_000):
                print(wait_events(node, n), flush=True)
            print(map_16m(node), flush=True)
            print(pid_reuse(node), flush=True)
            print(acquire_twice_row(node), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
