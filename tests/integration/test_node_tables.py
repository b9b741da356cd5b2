"""What a long-running node keeps per operation: nothing, once the operation's owner is gone.

A real `run_node` (FUSE mount, fabric, trace socket) runs in this process so the test can
look at its tables; the clients are other processes, killed in the middle of a call as a
user's Ctrl-C or the OOM killer would.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from ualinkd.cli.main import free_tcp_ports
from ualinkd.config import PodConfig
from ualinkd.daemon import run_node
from ualinkd.fuse.lowlevel import fuse_mounts_at
from ualinkd.node import NodeCore
from ualinkd.sysfs import RENDER_MINOR_BASE

pytestmark = pytest.mark.integration

TIMEOUT = 30

# A client blocked for good in a wait: SYNCOBJ_WAIT (drm_syncobj_array_wait_timeout) on a
# syncobj nobody signals, or KFD WAIT_EVENTS (kfd_wait_on_events) on an event nobody sets.
_SYNCOBJ_WAIT = """
    import ctypes, fcntl, os, sys, time
    from ualinkd.abi import constants as c, ioctls as tbl, structs as st
    fd = os.open(sys.argv[1] + "/dri/renderD128", os.O_RDWR)
    buf = bytearray(st.SYNCOBJ_CREATE.encode(st.DrmSyncobjCreate(0, 0)))
    fcntl.ioctl(fd, tbl.SYNCOBJ_CREATE.cmd, buf)
    handles = (ctypes.c_uint32 * 1)(st.SYNCOBJ_CREATE.decode(bytes(buf)).handle)
    print("waiting", flush=True)
    fcntl.ioctl(fd, tbl.SYNCOBJ_WAIT.cmd, bytearray(st.SYNCOBJ_WAIT.encode(st.DrmSyncobjWait(
        ctypes.addressof(handles), time.monotonic_ns() + 600 * 10**9, 1,
        c.DRM_SYNCOBJ_WAIT_FLAGS_WAIT_FOR_SUBMIT, 0, 0, 0))))
"""
_KFD_WAIT = """
    import ctypes, fcntl, os, struct, sys
    from ualinkd.abi import ioctls as tbl, structs as st
    fd = os.open(sys.argv[1] + "/kfd", os.O_RDWR)
    buf = bytearray(st.KFD_CREATE_EVENT.encode(st.KfdCreateEvent(0, 0, 0, 0, 0, 0, 0)))
    fcntl.ioctl(fd, tbl.KFD_CREATE_EVENT.cmd, buf)
    data = (ctypes.c_uint8 * st.KFD_EVENT_DATA_SIZE)()
    struct.pack_into("<I", data, st.KFD_EVENT_DATA_EVENT_ID,
                     st.KFD_CREATE_EVENT.decode(bytes(buf)).event_id)
    print("waiting", flush=True)
    fcntl.ioctl(fd, tbl.KFD_WAIT_EVENTS.cmd, bytearray(st.KFD_WAIT_EVENTS.encode(
        st.KfdWaitEvents(ctypes.addressof(data), 1, 1, 600_000, 0))))
"""


@asynccontextmanager
async def traced_node(tmp_path: Path) -> AsyncIterator[tuple[NodeCore, Path]]:
    """One node, traced (--trace=json, into memory), served from this process."""
    mount = tmp_path / "mnt"
    config = PodConfig.local(1, 1, free_tcp_ports(1))
    try:
        with trio.fail_after(TIMEOUT):
            async with trio.open_nursery() as nursery:
                core = await nursery.start(run_node, config, "node0", str(mount), "json",
                                           io.StringIO())
                try:
                    yield core, mount
                finally:
                    nursery.cancel_scope.cancel()
    finally:
        assert not fuse_mounts_at(str(mount)), "mount left behind"


async def kill_while_waiting(core: NodeCore, mount: Path, script: str,
                             released: Callable[[], bool]) -> None:
    """Run `script` as a client of `mount`; once its wait is in the daemon, SIGKILL it and
    wait until the daemon released its file (the interrupted call has been answered)."""
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), str(mount)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = await trio.to_thread.run_sync(proc.stdout.readline, abandon_on_cancel=True)
        assert line == "waiting\n"
        while proc.pid not in core._mem:  # the ioctl is in flight (its tid: the pid)
            await trio.sleep(0.005)
        os.kill(proc.pid, signal.SIGKILL)
        # The kernel sends INTERRUPT and waits for the answer before the process can exit.
        while not released():
            await trio.sleep(0.005)
    finally:
        if proc.poll() is None:
            proc.kill()
        await trio.to_thread.run_sync(proc.wait)


@pytest.mark.parametrize("client", ["syncobj_wait", "kfd_wait_events"])
async def test_interrupted_traced_ioctls_leave_nothing_behind(tmp_path: Path, client: str):
    """A traced ioctl that waits keeps, per calling thread, the caller memory and fds it
    touched until it completes (for its trace record). Clients killed in the wait (the
    kernel: SIGKILL → FUSE INTERRUPT; the waits end in -ERESTARTSYS, spec §1.6 I13's
    pattern) complete nothing: their entries must go with the call, or a long-running
    traced node grows by one per killed thread for good."""
    async with traced_node(tmp_path) as (core, mount):
        device = core.devices[RENDER_MINOR_BASE]
        script, released = {
            "syncobj_wait": (_SYNCOBJ_WAIT, lambda: not device.files),
            "kfd_wait_events": (_KFD_WAIT, lambda: not core.kfd.processes),
        }[client]
        for _ in range(3):
            await kill_while_waiting(core, mount, script, released)
        assert core._mem == {}
        assert core._fds == {}
