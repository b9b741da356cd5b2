"""Caller memory behind ioctl pointers and userptr BOs is never touched on the thread that
serves FUSE (DESIGN "Restricted ioctls"; issue 10 item 1).

A pointer into a not yet faulted page of a MAP_PRIVATE mapping of a file of the node's own
mount made the daemon read /proc/<pid>/mem there, the kernel asked the daemon (a FUSE READ)
for the page, and its only thread was the one waiting: D state for good. Every caller-memory
path is exercised here with a real daemon and a raw-ioctl client in a subprocess; the
client has a watchdog, and a node that hangs anyway is freed with umount -f
(nodes.force_unmount) so that a regression fails instead of hanging the suite.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import fcntl
import os
import select
import signal
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from nodes import Client, Node, c_program, force_unmount, running_node, running_pod, stop_process

from ualinkd.abi.ioc import iowr
from ualinkd.cli.main import free_tcp_ports
from ualinkd.config import PodConfig

pytestmark = pytest.mark.integration

ATTR = "sys/class/drm/renderD128/device/ualink/accel_state"
SYS_PREAD64 = 17  # x86_64
SYNCOBJ_CREATE, SYNCOBJ_RESET = iowr(0xBF, 8), iowr(0xC4, 16)


class MappedCaller:
    """tests/c/mapped_caller.c in a subprocess, read with deadlines."""

    def __init__(self, render: str, path: Path, threads: int = 0) -> None:
        self.proc = subprocess.Popen(
            [c_program("mapped_caller"), render, str(path), *([str(threads)] * bool(threads))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.line(20) == "mapped"

    def line(self, timeout: float) -> str:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise TimeoutError(f"the client answered nothing in {timeout} s (a hung daemon?)")
        return self.proc.stdout.readline().strip()

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()

    def result(self, timeout: float) -> dict[str, object]:
        """One line of name=errno pairs (a comma list for the threads)."""
        out: dict[str, object] = {}
        for pair in self.line(timeout).split():
            name, _, value = pair.partition("=")
            out[name] = [int(v) for v in value.split(",")] if "," in value else int(value)
        return out


@contextlib.contextmanager
def mapped_caller(node: Node, path: Path, threads: int = 0) -> Iterator[MappedCaller]:
    client = MappedCaller(node.render(), path, threads)
    try:
        yield client
    finally:
        client.proc.kill()
        try:
            client.proc.wait(10)
        except subprocess.TimeoutExpired:  # stuck in a request of a hung daemon
            force_unmount(node.mount)
            client.proc.wait(10)


def test_pointers_into_the_nodes_own_mount_are_efault(tmp_path):
    """Every caller-memory path with its pointer in a MAP_PRIVATE mapping of the node's own
    `accel_state`: syncobj handles (RESET), a QUERY's points (copy_to_user), GEM_OP
    GET_GEM_CREATE_INFO's value, GEM_VA's input fences, a READONLY userptr with VALIDATE,
    and a GPU load through one without: each EFAULT (creating and mapping the userptr BO is
    fine, get_user_pages is not run). The node answers afterwards."""
    with running_node(tmp_path) as node:
        try:
            with mapped_caller(node, node.mount / ATTR) as client:
                client.go()
                got = client.result(timeout=30)
        except TimeoutError:
            force_unmount(node.mount)  # the daemon was in D state: free it, then fail
            raise
        efault = {name: errno.EFAULT for name in (
            "syncobj_reset", "syncobj_query", "gem_op_create_info", "gem_va_input_fences",
            "userptr_validate", "userptr_gpu_load")}
        assert got == {**efault, "userptr_create": 0, "userptr_va_map": 0}
        assert node.sysfs(128, "accel_state") == "active\n"


def ordinary_reset(fd: int) -> int:
    """SYNCOBJ_RESET of a new syncobj, its handle array in this process's memory: errno."""
    out = bytearray(8)
    fcntl.ioctl(fd, SYNCOBJ_CREATE, out)
    handles = (ctypes.c_uint32 * 1)(struct.unpack_from("<I", out)[0])
    try:
        fcntl.ioctl(fd, SYNCOBJ_RESET, struct.pack("<QII", ctypes.addressof(handles), 1, 0))
    except OSError as e:
        return e.errno
    return 0


def _threads_in_pread(pid: int) -> int:
    """Threads of `pid` blocked in pread64 (the daemon's trio thread never is)."""
    count = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/task/{tid}/syscall").read_text().split()[0] == str(
                    SYS_PREAD64):
                count += 1
    return count


def test_a_hung_mapping_holds_only_its_caller_and_only_for_the_timeout(tmp_path):
    """The pointers lie in a mapping of another node's mount whose daemon is SIGSTOPped (a
    hung file system). Nine threads RESET through it at once: eight workers block in the
    pread, and while they do node0 serves other clients (sys reads, BOs, GPU stores and
    loads) with the caller's ioctls still pending; the ninth waits for a worker; all nine
    fail with EFAULT at the deadline. Now every worker is stuck, so any caller-memory ioctl
    (an ordinary array of another client) fails at once, with one log line. When the file
    system comes back the workers finish and caller-memory ioctls work again."""
    config = dataclasses.replace(PodConfig.local(2, 1, free_tcp_ports(2)),
                                 caller_memory_timeout_ms=5000)
    with running_pod(tmp_path, config=config) as (n0, n1), \
            mapped_caller(n0, n1.mount / ATTR, threads=9) as client:
        stop_process(n1.proc.pid)
        try:
            client.go()
            deadline = time.monotonic() + 10
            while _threads_in_pread(n0.proc.pid) < 8:
                assert time.monotonic() < deadline, "the workers never blocked"
                time.sleep(0.01)
            assert n0.sysfs(128, "accel_state") == "active\n"
            with Client(n0.render()) as other:
                bo = other.bo_create(1 << 16)
                other.va_map(bo, 0x1_0000_0000, 1 << 16)
                assert other.gpu_write(0x1_0000_0000, b"still serving") == 13
                assert other.gpu_read(0x1_0000_0000, 13) == b"still serving"
            assert client.proc.poll() is None  # its ioctls are still waiting
            assert _threads_in_pread(n0.proc.pid) >= 8
            assert client.result(timeout=30) == {"reset_threads": [errno.EFAULT] * 9}
            with open(n0.render(), "rb+", buffering=0) as other:
                for _ in range(2):
                    assert ordinary_reset(other.fileno()) == errno.EFAULT
        finally:
            n1.proc.send_signal(signal.SIGCONT)
        deadline = time.monotonic() + 10
        while _threads_in_pread(n0.proc.pid):
            assert time.monotonic() < deadline, "the workers did not finish"
            time.sleep(0.01)
        client.go()
        assert client.result(timeout=30) == {"reset_good": 0}
        with open(n0.render(), "rb+", buffering=0) as other:
            assert ordinary_reset(other.fileno()) == 0
        assert n0.log_text().count("workers are stuck") == 1
