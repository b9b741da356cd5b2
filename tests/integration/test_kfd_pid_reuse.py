"""Issue 29 on a real node: a KFD context never passes with its pid (item 1), WAIT_EVENTS and
the device arrays capped as kmalloc_array caps them (items 3, 8), one compute VM per render
file (item 11), and the identity primitive under them (pid + pidfd inode, drm/process.py).

The kernel ends a kfd_process when its process's mm goes (kfd_process_notifier_release),
whoever still holds its files, and compares tasks, never pid numbers. Here a root process
allocates VRAM, forks a worker that keeps its kfd file, and exits; a process of uid nobody
is then given the same pid (root sets /proc/sys/kernel/ns_last_pid) and opens the kfd.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from nodes import call_errno as kfd_call
from nodes import running_node, wait_until

from ualinkd import sysfs
from ualinkd.abi import ioctls as tbl
from ualinkd.config import PodConfig
from ualinkd.daemon import query_drm_file
from ualinkd.drm.errors import DrmError
from ualinkd.fuse.procfd import open_pidfd, process_id

NS_LAST_PID = Path("/proc/sys/kernel/ns_last_pid")
PYTHON = "/usr/bin/python3"  # Debian's: nobody cannot reach a python under /root
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0 or not NS_LAST_PID.exists()
                       or shutil.which("setpriv") is None or not Path(PYTHON).exists(),
                       reason="needs root, ns_last_pid, setpriv and /usr/bin/python3"),
]

# Root's KFD process (argv: kfd, render node, gpu_id, then the ioctl numbers): ACQUIRE_VM,
# a 1 MiB VRAM allocation (handle), mapped to the GPU, holding a secret.
_ROOT_ALLOCATES = r"""
import ctypes, fcntl, os, struct, sys
kfd_path, render_path, gpu = sys.argv[1], sys.argv[2], int(sys.argv[3])
ACQ, ALLOC, MAPC = (int(a) for a in sys.argv[4:7])
VA = 1 << 33
kfd = os.open(kfd_path, os.O_RDWR); r = os.open(render_path, os.O_RDWR)
fcntl.ioctl(kfd, ACQ, bytearray(struct.pack("<II", r, gpu)))
b = bytearray(struct.pack("<QQQQII", VA, 1 << 20, 0, 0, gpu, 0x80000001))
fcntl.ioctl(kfd, ALLOC, b)
handle = struct.unpack("<QQQQII", b)[2]
ids = (ctypes.c_uint32 * 1)(gpu)
fcntl.ioctl(kfd, MAPC, bytearray(struct.pack("<QQII", handle, ctypes.addressof(ids), 1, 0)))
os.pwrite(r, b"root's secret", VA)  # a GPU store into the allocation
"""

VICTIM = _ROOT_ALLOCATES + r"""
if os.fork() == 0:  # a worker that did not exec: it keeps the kfd (and render) file
    sys.stdin.read()  # until the test closes our stdin
    os._exit(0)
print(os.getpid(), handle, flush=True)
os._exit(0)
"""

ATTACKER = r"""
import fcntl, os, struct, sys
kfd_path, handle, EXPORT = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
kfd = os.open(kfd_path, os.O_RDWR)
b = bytearray(struct.pack("<QII", handle, 0x80002, 0))
try:
    fcntl.ioctl(kfd, EXPORT, b)
    err = 0
except OSError as e:
    err = e.errno
print(os.getpid(), err, flush=True)
"""


@pytest.fixture(scope="module")
def node():
    # World-traversable: the attacker runs as nobody and must reach the mount.
    root = Path(tempfile.mkdtemp(prefix="ualinkd-pidreuse-"))
    root.chmod(0o755)
    try:
        with running_node(root, PodConfig.local(1, 1)) as n:
            yield n
    finally:
        shutil.rmtree(root, ignore_errors=True)


def gpu_id(node) -> int:
    return int((node.mount / sysfs.KFD_TOPOLOGY / "nodes/1/gpu_id").read_text())


def spawn_as(pid: int, cmd: list[str], tries: int = 300, **kw) -> subprocess.Popen[str]:
    """`cmd` started as process `pid` (the next pid after ns_last_pid); other processes on
    the host may take it first, so it is tried again. pytest.skip if it never lands."""
    for _ in range(tries):
        NS_LAST_PID.write_text(str(pid - 1))
        proc = subprocess.Popen(cmd, text=True, **kw)
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
    pytest.skip(f"pid {pid} could not be taken (a busy host)")


def rows(node) -> list[str]:
    return node.debug(128, "kfd_processes").splitlines()


@contextlib.contextmanager
def victim(node) -> Iterator[tuple[int, int]]:
    """Root's process with a VRAM allocation holding a secret; it has exited, its forked
    worker still holds the kfd file. (pid, allocation handle); the worker ends after."""
    proc = subprocess.Popen(
        [PYTHON, "-c", VICTIM, str(node.mount / "kfd"), node.render(0), str(gpu_id(node)),
         *(str(s.cmd) for s in (tbl.KFD_ACQUIRE_VM, tbl.KFD_ALLOC_MEMORY_OF_GPU,
                                tbl.KFD_MAP_MEMORY_TO_GPU))],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        pid, handle = (int(x) for x in proc.stdout.readline().split())
        assert proc.wait(30) == 0  # reaped: the pid is free for the next process
        yield pid, handle
    finally:
        assert proc.stdin is not None
        proc.stdin.close()  # the worker ends
        proc.kill()
        proc.wait(30)


def attack(node, pid: int, handle: int) -> tuple[int, int]:
    """A uid-nobody process that got `pid` (root's exited one) exports root's allocation
    `handle`: (the pid it ran as, EXPORT_DMABUF's errno, 0 if the export worked)."""
    attacker = spawn_as(pid, [*NOBODY, PYTHON, "-c", ATTACKER, str(node.mount / "kfd"),
                              str(handle), str(tbl.KFD_EXPORT_DMABUF.cmd)],
                        stdout=subprocess.PIPE)
    out, _ = attacker.communicate(timeout=60)
    got_pid, err = (int(x) for x in out.split())
    return got_pid, err


def acquire_twice(node) -> int:
    """ACQUIRE_VM of a render file another KFD process acquired: its errno (0 if it worked)."""
    r = subprocess.run([PYTHON, "-c", ACQUIRE_TWICE, str(node.mount / "kfd"), node.render(0),
                        str(gpu_id(node)), str(tbl.KFD_ACQUIRE_VM.cmd)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return int(r.stdout)


def test_a_kfd_context_does_not_pass_to_the_next_process_with_its_pid(node):
    """Item 1: a process of uid nobody given the pid of root's exited process opens the
    kfd, and EXPORT_DMABUF of root's allocation handle is EINVAL (on cb563a2 it was 0, and
    the dma-buf read root's secret); root's context has ended although its worker still
    holds the kfd file (the node's kfd_processes table has no row left once the attacker
    is gone too)."""
    with victim(node) as (pid, handle):
        assert attack(node, pid, handle) == (pid, errno.EINVAL)
        assert wait_until(lambda: not rows(node), 10), rows(node)


def test_a_process_exit_frees_what_it_allocated_while_a_child_holds_the_file(node):
    """kfd_process_notifier_release: the allocation goes with the process's exit, not with
    the worker's last close: the node's kfd_allocations table is empty while the worker
    still runs."""
    with victim(node):
        assert wait_until(lambda: not node.debug(128, "kfd_allocations").strip(), 10), \
            node.debug(128, "kfd_allocations")


ACQUIRE_TWICE = r"""
import fcntl, os, struct, sys
kfd_path, render_path, gpu, ACQ = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
r = os.open(render_path, os.O_RDWR)
kfd = os.open(kfd_path, os.O_RDWR)
fcntl.ioctl(kfd, ACQ, bytearray(struct.pack("<II", r, gpu)))
rd, wr = os.pipe()
if os.fork() == 0:  # another process, with the render file inherited, its own kfd context
    own = os.open(kfd_path, os.O_RDWR)
    try:
        fcntl.ioctl(own, ACQ, bytearray(struct.pack("<II", r, gpu)))
        err = 0
    except OSError as e:
        err = e.errno
    os.write(wr, str(err).encode())
    os._exit(0)
os.wait()
print(os.read(rd, 16).decode())
"""


def test_acquire_vm_of_a_render_file_another_kfd_process_acquired_is_einval(node):
    """Item 11: amdgpu_amdkfd_gpuvm_acquire_process_vm refuses a VM already a compute VM
    (EINVAL): a child with the parent's render file and a KFD context of its own cannot
    acquire it (on cb563a2: 0)."""
    assert acquire_twice(node) == errno.EINVAL


def serving_gaps(node, seconds_while) -> tuple[float, object]:
    """The longest time a GET_VERSION on a second kfd file of ours waited while
    `seconds_while()` ran (the node's serving thread busy with it), and its result."""
    fd = os.open(node.mount / "kfd", os.O_RDWR)
    gaps: list[float] = []
    done = threading.Event()

    def probe() -> None:
        while not done.is_set():
            t = time.monotonic()
            kfd_call(fd, tbl.KFD_GET_VERSION.cmd, bytes(8))
            gaps.append(time.monotonic() - t)
            time.sleep(0.01)

    t = threading.Thread(target=probe)
    t.start()
    try:
        result = seconds_while()
    finally:
        done.set()
        t.join(60)
        os.close(fd)
    return max(gaps or [0.0]), result


def test_wait_events_of_250k_events_is_enomem_at_once(node):
    """Item 3: alloc_event_waiters fails past 74,898 waiters: 250,000 events (which held
    the node 5.7-6.8 s at cb563a2) are ENOMEM at once with wait_result FAIL; 74,898 entries
    naming one signaled event complete quickly; the node answers another caller meanwhile."""
    fd = os.open(node.mount / "kfd", os.O_RDWR)
    try:
        err, out = kfd_call(fd, tbl.KFD_CREATE_EVENT.cmd,
                            struct.pack("<QIIIIII", 0, 0, 0, 0, 0, 0, 0))  # manual reset
        assert err == 0
        event_id = struct.unpack("<QIIIIII", out)[1]
        assert kfd_call(fd, tbl.KFD_SET_EVENT.cmd, struct.pack("<II", event_id, 0))[0] == 0
        n = 250_000
        entries = ctypes.create_string_buffer(struct.pack("<32xQII", 0, event_id, 0) * n)

        def wait(count: int) -> tuple[float, int, int]:
            t = time.monotonic()
            err, out = kfd_call(fd, tbl.KFD_WAIT_EVENTS.cmd, struct.pack(
                "<QIIII", ctypes.addressof(entries), count, 1, 0, 0xFF))
            return time.monotonic() - t, err, struct.unpack("<QIIII", out)[4]

        gap, (took, err, result) = serving_gaps(node, lambda: wait(n))
        assert (err, result) == (errno.ENOMEM, 2) and took < 1.0 and gap < 1.0
        gap, (took, err, result) = serving_gaps(node, lambda: wait(74_898))
        assert (err, result) == (0, 0) and took < 3.0 and gap < 1.5, (took, gap)
        assert wait(74_899)[1] == errno.ENOMEM
    finally:
        os.close(fd)


def rss_kib(pid: int) -> int:
    """The process's peak resident memory (VmHWM): what one call cost it at its height,
    though freed since."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def test_a_16m_device_array_is_enomem_and_costs_the_daemon_nothing(node):
    """Item 8: MAP/UNMAP_MEMORY_TO_GPU with 16M device ids (which grew the daemon by
    156 MiB at cb563a2) is ENOMEM before the array is read: the daemon's peak RSS stays
    put."""
    fd = os.open(node.mount / "kfd", os.O_RDWR)
    try:
        ids = ctypes.create_string_buffer(4 * (16 << 20))
        before = rss_kib(node.proc.pid)
        for spec in (tbl.KFD_MAP_MEMORY_TO_GPU, tbl.KFD_UNMAP_MEMORY_FROM_GPU):
            err, _ = kfd_call(fd, spec.cmd, struct.pack("<QQII", 1 << 32,
                                                         ctypes.addressof(ids), 16 << 20, 0))
            assert err == errno.ENOMEM
        assert rss_kib(node.proc.pid) - before < 16 << 10
    finally:
        os.close(fd)


def test_a_pid_given_to_another_process_is_another_identity():
    """The identity under it all (fuse/procfd.py): a process's ProcessId names it alone; once
    it has exited, a pidfd of it cannot be had, even when its pid is running another
    process, whose ProcessId differs; ACQUIRE_VM's fd copy (query_drm_file) from the exited
    one is EINVAL, never taken from the newcomer."""
    first = subprocess.Popen(["sleep", "60"])
    old = process_id(first.pid)
    assert old is not None and old.pid == first.pid
    first.kill()
    first.wait()
    assert open_pidfd(old) is None
    second = spawn_as(old.pid, ["sleep", "60"])
    try:
        new = process_id(second.pid)
        assert new is not None and new.pid == old.pid and new != old
        assert open_pidfd(old) is None
        fd = open_pidfd(new)
        assert fd is not None
        os.close(fd)
        with pytest.raises(DrmError) as e:
            query_drm_file(old, 0, None, 1)
        assert e.value.errno == errno.EINVAL
    finally:
        second.kill()
        second.wait()


def test_caller_memory_never_reaches_the_next_process_with_the_callers_id():
    """callermem.py: the caller's /proc/<tid> is pinned while its request is in progress;
    an access that a worker runs after the caller exited (an interrupted request answered
    meanwhile) reads nothing, although its id now names another process whose memory is
    mapped at that address."""
    from ualinkd.callermem import _one_shot, _pin_caller

    first = subprocess.Popen(["sleep", "60"])
    pinned = _pin_caller(first.pid)
    first.kill()
    first.wait()
    second = spawn_as(first.pid, ["sleep", "60"])
    try:
        lo = int(Path(f"/proc/{second.pid}/maps").read_text().split("-", 1)[0], 16)
        fresh = _pin_caller(second.pid)
        assert len(_one_shot(fresh, lo, 16, None)) == 16  # (the address is readable)
        assert _one_shot(pinned, lo, 16, None) == b""
    finally:
        second.kill()
        second.wait()


EXEC_VICTIM = _ROOT_ALLOCATES + r"""
EXPORT, attacker = int(sys.argv[7]), sys.argv[8]
os.set_inheritable(kfd, True); os.set_inheritable(r, True)  # both stay open across exec
os.setgroups([]); os.setgid(65534); os.setuid(65534)  # drop to nobody, run its program
os.execv(sys.executable, [sys.executable, "-c", attacker, kfd_path, str(handle), str(EXPORT)])
"""


def test_a_kfd_context_ends_when_its_process_execs(node):
    """Item 1, exec: the kernel binds a kfd_process to the mm (kfd_create_process finds it
    by current->mm, kfd_process_notifier_release ends it when the mm goes), and execve
    gives the process a new mm. A root process that allocated VRAM, dropped to nobody and
    exec'd another program: that program's kfd open is a new context, and EXPORT_DMABUF of
    root's handle is EINVAL (the old one had ended, though the exec'd program still holds
    its kfd and render files: they are not close-on-exec; on the old code it was 0)."""
    r = subprocess.run(
        [PYTHON, "-c", EXEC_VICTIM, str(node.mount / "kfd"), node.render(0),
         str(gpu_id(node)),
         *(str(s.cmd) for s in (tbl.KFD_ACQUIRE_VM, tbl.KFD_ALLOC_MEMORY_OF_GPU,
                                tbl.KFD_MAP_MEMORY_TO_GPU, tbl.KFD_EXPORT_DMABUF)),
         ATTACKER], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    got_pid, err = (int(x) for x in r.stdout.split())
    assert err == errno.EINVAL
    assert wait_until(lambda: not rows(node), 10), rows(node)
