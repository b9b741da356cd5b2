"""What one client can make the daemon hold in fds of its own (README "Known limits"): a
kernel holds a userptr BO's pages and a registered eventfd as references, the daemon as fds,
and a client must not be able to spend the fds every other client and fabric link needs.

- GEM_USERPTR (amdgpu_gem_userptr_ioctl): every BO of one process shares one pinned view of
  its memory, so a thousand userptr BOs cost the daemon two fds, not two thousand.
- SYNCOBJ_EVENTFD (drm_syncobj_eventfd_ioctl): at most MAX_EVENTFDS_PER_PROCESS registered
  per process; past it ENOMEM (the kernel's answer when it cannot allocate the entry), one
  log line, and other processes are still served.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import resource
import subprocess
import sys
import textwrap

import pytest
from nodes import call

from ualinkd.abi import constants as c
from ualinkd.abi import ioctls as tbl
from ualinkd.abi import structs as st
from ualinkd.daemon import MAX_EVENTFDS_PER_PROCESS

pytestmark = pytest.mark.integration

PAGE = 4096


def daemon_fds(node) -> int:
    return len(os.listdir(f"/proc/{node.proc.pid}/fd"))


def test_userptr_bos_share_one_view_of_the_process(node):
    """1000 userptr BOs of one process: the daemon's fd count grows by the one pinned view
    (a /proc directory and its mem), and is back where it was once they are closed."""
    n = 1000
    buf = mmap.mmap(-1, n * PAGE)
    view = (ctypes.c_char * (n * PAGE)).from_buffer(buf)
    base = ctypes.addressof(view)
    fd = os.open(node.render(), os.O_RDWR)
    try:
        before = daemon_fds(node)
        handles = []
        for i in range(n):
            args = st.GemUserptr(base + i * PAGE, PAGE, c.USERPTR_READONLY, 0)
            out = call(fd, tbl.AMDGPU_GEM_USERPTR.cmd, st.GEM_USERPTR.encode(args))
            handles.append(st.GEM_USERPTR.decode(out).handle)
        held = daemon_fds(node) - before
        assert held <= 4, f"{n} userptr BOs hold {held} daemon fds"
        for h in handles:
            call(fd, tbl.GEM_CLOSE.cmd, st.GEM_CLOSE.encode(st.DrmGemClose(h, 0)))
        assert daemon_fds(node) <= before
    finally:
        os.close(fd)
        del view
        buf.close()


def test_eventfd_quota_per_process(node):
    """A process past MAX_EVENTFDS_PER_PROCESS registered eventfds gets ENOMEM, the log says
    so once, another process is still served, and closing the render fd gives the quota
    back (the syncobjs go, and their pending eventfds with them)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = MAX_EVENTFDS_PER_PROCESS + 64
    if hard < 2 * need:
        pytest.skip(f"RLIMIT_NOFILE hard {hard} < {2 * need}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    fd = os.open(node.render(), os.O_RDWR)
    efds: list[int] = []
    try:
        before = daemon_fds(node)
        create = st.SYNCOBJ_CREATE.encode(st.DrmSyncobjCreate(0, 0))

        def register() -> int:
            """One more eventfd on its own syncobj (a syncobj takes 256): 0 or the errno."""
            h = st.SYNCOBJ_CREATE.decode(call(fd, tbl.SYNCOBJ_CREATE.cmd, create)).handle
            efds.append(os.eventfd(0, os.EFD_CLOEXEC))
            args = st.DrmSyncobjEventfd(h, c.DRM_SYNCOBJ_WAIT_FLAGS_WAIT_AVAILABLE, 1,
                                        efds[-1], 0)
            try:
                call(fd, tbl.SYNCOBJ_EVENTFD.cmd, st.SYNCOBJ_EVENTFD.encode(args))
            except OSError as e:
                return e.errno
            return 0

        results = [register() for _ in range(MAX_EVENTFDS_PER_PROCESS)]
        assert results == [0] * MAX_EVENTFDS_PER_PROCESS
        assert register() == errno.ENOMEM
        assert register() == errno.ENOMEM
        assert node.log_text().count("SYNCOBJ_EVENTFD refused (ENOMEM)") == 1
        # Another process is served.
        other = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
            import os, sys
            sys.path.insert(0, {os.path.dirname(__file__)!r})
            from nodes import call
            from ualinkd.abi import constants as c, ioctls as tbl, structs as st
            fd = os.open({node.render()!r}, os.O_RDWR)
            create = st.SYNCOBJ_CREATE.encode(st.DrmSyncobjCreate(0, 0))
            h = st.SYNCOBJ_CREATE.decode(call(fd, tbl.SYNCOBJ_CREATE.cmd, create)).handle
            e = os.eventfd(0)
            args = st.DrmSyncobjEventfd(h, c.DRM_SYNCOBJ_WAIT_FLAGS_WAIT_AVAILABLE, 1, e, 0)
            call(fd, tbl.SYNCOBJ_EVENTFD.cmd, st.SYNCOBJ_EVENTFD.encode(args))
            print("ok")
        """)], capture_output=True, text=True, timeout=60)
        assert other.stdout.strip() == "ok", other.stderr
    finally:
        os.close(fd)
        for e in efds:
            os.close(e)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    # The file's release destroyed its syncobjs: their eventfds and the quota are back.
    fd = os.open(node.render(), os.O_RDWR)
    try:
        create = st.SYNCOBJ_CREATE.encode(st.DrmSyncobjCreate(0, 0))
        h = st.SYNCOBJ_CREATE.decode(call(fd, tbl.SYNCOBJ_CREATE.cmd, create)).handle
        e = os.eventfd(0)
        args = st.DrmSyncobjEventfd(h, c.DRM_SYNCOBJ_WAIT_FLAGS_WAIT_AVAILABLE, 1, e, 0)
        call(fd, tbl.SYNCOBJ_EVENTFD.cmd, st.SYNCOBJ_EVENTFD.encode(args))
        os.close(e)
    finally:
        os.close(fd)
    assert daemon_fds(node) <= before + 2
