"""<mount>/kfd on a real node (issue 14 items 1–4; spec userspace-surface §3.3): the 'K'
ioctls through ioctl(2) on the FUSE file, ACQUIRE_VM naming a render node by the caller's
fd (found by the daemon's private question on a copy of it, never guessed), and the KFD
topology read through the shim's /sys/devices/virtual/kfd and /sys/class/kfd redirects."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from nodes import SHIM, Client, c_program, running_node, running_pod
from nodes import call_errno as kfd_ioctl

from ualinkd import sysfs
from ualinkd.abi import ioctls as tbl
from ualinkd.abi.ioc import IOC_READ, IOC_WRITE, ioc
from ualinkd.cli import ctl
from ualinkd.config import PodConfig

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (FUSE mounts, pidfd_getfd)"),
]


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    with running_node(tmp_path_factory.mktemp("kfd"), PodConfig.local(1, 2)) as n:
        yield n


def gpu_ids(node) -> list[int]:
    top = node.mount / sysfs.KFD_TOPOLOGY
    return [int((top / f"nodes/{n}/gpu_id").read_text()) for n in (1, 2)]


def test_kfd_get_version_and_unknown_nrs(node):
    fd = os.open(node.mount / "kfd", os.O_RDWR | os.O_CLOEXEC)
    try:
        err, out = kfd_ioctl(fd, tbl.KFD_GET_VERSION.cmd, bytes(8))
        assert err == 0 and struct.unpack("<II", out) == (1, 17)
        err, out = kfd_ioctl(fd, ioc(IOC_READ | IOC_WRITE, ord("K"), 0x60, 16), b"\x77" * 16)
        assert (err, out) == (errno.ENOTTY, b"\x77" * 16)  # nothing copied back
    finally:
        os.close(fd)


def test_acquire_vm_finds_the_open_behind_the_fd(node):
    """Two opens of renderD128 share its inode; ACQUIRE_VM binds the one the fd names, the
    other is then EBUSY; a file that is not a render node of this daemon and a closed fd are
    EINVAL (kfd_ioctl_acquire_vm's fget / amdgpu_file_to_fpriv); renderD129 for GPU 0 is
    EINVAL (another GPU's VM)."""
    g0, g1 = gpu_ids(node)
    kfd = os.open(node.mount / "kfd", os.O_RDWR | os.O_CLOEXEC)
    r0 = os.open(node.render(0), os.O_RDWR | os.O_CLOEXEC)
    r0b = os.open(node.render(0), os.O_RDWR | os.O_CLOEXEC)
    r1 = os.open(node.render(1), os.O_RDWR | os.O_CLOEXEC)
    other = tempfile.TemporaryFile()
    closed = os.open("/dev/null", os.O_RDONLY)
    os.close(closed)
    cmd = tbl.KFD_ACQUIRE_VM.cmd
    try:
        assert kfd_ioctl(kfd, cmd, struct.pack("<II", other.fileno(), g0))[0] == errno.EINVAL
        assert kfd_ioctl(kfd, cmd, struct.pack("<II", closed, g0))[0] == errno.EINVAL
        assert kfd_ioctl(kfd, cmd, struct.pack("<II", kfd, g0))[0] == errno.EINVAL
        assert kfd_ioctl(kfd, cmd, struct.pack("<II", r1, g0))[0] == errno.EINVAL
        assert kfd_ioctl(kfd, cmd, struct.pack("<II", r0b, g0))[0] == 0
        assert kfd_ioctl(kfd, cmd, struct.pack("<II", r0b, g0))[0] == 0
        assert kfd_ioctl(kfd, cmd, struct.pack("<II", r0, g0))[0] == errno.EBUSY
        assert kfd_ioctl(kfd, cmd, struct.pack("<II", r1, g1))[0] == 0
    finally:
        for fd in (kfd, r0, r0b, r1):
            os.close(fd)
        other.close()


def test_process_apertures_into_caller_memory(node):
    kfd = os.open(node.mount / "kfd", os.O_RDWR | os.O_CLOEXEC)
    try:
        cmd = tbl.KFD_GET_PROCESS_APERTURES_NEW.cmd
        err, out = kfd_ioctl(kfd, cmd, struct.pack("<QII", 0, 0, 0))
        assert err == 0 and struct.unpack("<QII", out)[1] == 2
        arr = ctypes.create_string_buffer(2 * 56)
        err, out = kfd_ioctl(kfd, cmd, struct.pack("<QII", ctypes.addressof(arr), 2, 0))
        assert err == 0 and struct.unpack("<QII", out)[1] == 2
        ids = [struct.unpack_from("<6QII", arr.raw, i * 56)[6] for i in range(2)]
        assert ids == gpu_ids(node)
        err, _ = kfd_ioctl(kfd, cmd, struct.pack("<QII", 8, 2, 0))
        assert err == errno.EFAULT
    finally:
        os.close(kfd)


def test_topology_through_the_shim(node):
    """/sys/devices/virtual/kfd and /sys/class/kfd are the node's tree under the shim, and
    /dev/kfd its kfd (the shim's redirects; libhsakmt fopens and opendirs these)."""
    c_program("libualink_shim.so")
    script = ("cat /sys/devices/virtual/kfd/kfd/topology/generation_id && "
              "ls /sys/class/kfd/kfd/topology/nodes && "
              "cat /sys/class/kfd/kfd/topology/nodes/2/gpu_id && "
              "grep drm_render_minor /sys/devices/virtual/kfd/kfd/topology/nodes/2/properties"
              " && test -e /dev/kfd && echo kfd-ok")
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD",)}
    env.update(LD_PRELOAD=str(SHIM), UALINK_DRI_DIR=str(node.mount / "dri"))
    r = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.split("\n")[:-1] == ["1", "0", "1", "2", str(gpu_ids(node)[1]),
                                         "drm_render_minor 129", "kfd-ok"]
    assert Path(node.mount / "kfd").exists()


# ---- KFD memory over UALink (issue 14 item 3: "its dma-buf export is exportable over UALink")

KFD_VRAM_RW = (1 << 0) | (1 << 31)  # KFD_IOC_ALLOC_MEM_FLAGS_VRAM | WRITABLE
SIZE = 2 << 20
VA = 1 << 33


def kfd_vram(kfd: int, render_fd: int, gpu_id: int) -> int:
    """ACQUIRE_VM with `render_fd`, a VRAM allocation at VA mapped on the GPU: its handle."""
    assert kfd_ioctl(kfd, tbl.KFD_ACQUIRE_VM.cmd, struct.pack("<II", render_fd, gpu_id))[0] == 0
    err, out = kfd_ioctl(kfd, tbl.KFD_ALLOC_MEMORY_OF_GPU.cmd,
                         struct.pack("<QQQQII", VA, SIZE, 0, 0, gpu_id, KFD_VRAM_RW))
    assert err == 0
    handle = struct.unpack("<QQQQII", out)[2]
    ids = (ctypes.c_uint32 * 1)(gpu_id)
    err, out = kfd_ioctl(kfd, tbl.KFD_MAP_MEMORY_TO_GPU.cmd,
                         struct.pack("<QQII", handle, ctypes.addressof(ids), 1, 0))
    assert err == 0 and struct.unpack("<QQII", out)[3] == 1
    return handle


def test_kfd_memory_exported_over_ualink_and_read_on_another_node(tmp_path):
    """A KFD VRAM allocation on node A, written by A's GPU through the acquired file;
    EXPORT_DMABUF -> (the token opened as the dma-buf fd) -> PRIME_FD_TO_HANDLE -> UALink
    export; node B imports the handle, maps it and its GPU loads A's bytes over the fabric
    (spec userspace-surface §3.3 steps 5–8)."""
    with running_pod(tmp_path, 2) as (a, b):
        gpu = int((a.mount / sysfs.KFD_TOPOLOGY / "nodes/1/gpu_id").read_text())
        kfd = os.open(a.mount / "kfd", os.O_RDWR | os.O_CLOEXEC)
        try:
            with Client(a.render()) as ca, Client(b.render()) as cb:
                handle = kfd_vram(kfd, ca.fd, gpu)
                data = bytes(range(256)) * (SIZE // 256)
                assert ca.gpu_write(VA, data) == SIZE
                err, out = kfd_ioctl(kfd, tbl.KFD_EXPORT_DMABUF.cmd,
                                     struct.pack("<QII", handle, os.O_CLOEXEC, 0))
                assert err == 0
                token = struct.unpack("<QII", out)[2]
                dmabuf = os.open(a.mount / "dmabuf" / str(token), os.O_RDWR | os.O_CLOEXEC)
                try:
                    assert os.lseek(dmabuf, 0, os.SEEK_END) == SIZE
                    gem = ca.fd_to_handle(dmabuf)
                finally:
                    os.close(dmabuf)
                ualink = ca.export(gem)
                fd = cb.import_(ualink)
                try:
                    h = cb.fd_to_handle(fd)
                    cb.va_map(h, VA, SIZE)
                    assert cb.gpu_read(VA, 4096) == data[:4096]
                    assert cb.gpu_read(VA + SIZE - 4096, 4096) == data[-4096:]
                finally:
                    os.close(fd)
                # A GEM handle keeps the BO after KFD frees its allocation (§3.3 step 5)
                ids = (ctypes.c_uint32 * 1)(gpu)
                assert kfd_ioctl(kfd, tbl.KFD_UNMAP_MEMORY_FROM_GPU.cmd, struct.pack(
                    "<QQII", handle, ctypes.addressof(ids), 1, 0))[0] == 0
                assert kfd_ioctl(kfd, tbl.KFD_FREE_MEMORY_OF_GPU.cmd,
                                 struct.pack("<Q", handle))[0] == 0
        finally:
            os.close(kfd)


SHIM_EXPORT = """
import ctypes, fcntl, os, struct, sys
kfd = os.open("/dev/kfd", os.O_RDWR | os.O_CLOEXEC)
render = os.open("/dev/dri/renderD128", os.O_RDWR | os.O_CLOEXEC)
gpu = int(open("/sys/class/kfd/kfd/topology/nodes/1/gpu_id").read())
def io(cmd, data):
    buf = bytearray(data)
    fcntl.ioctl(kfd, cmd, buf)
    return bytes(buf)
io({acquire}, struct.pack("<II", render, gpu))
out = io({alloc}, struct.pack("<QQQQII", 1 << 33, 1 << 20, 0, 0, gpu, {flags}))
handle = struct.unpack("<QQQQII", out)[2]
fd = struct.unpack("<QII", io({export}, struct.pack("<QII", handle, os.O_CLOEXEC, 0)))[2]
print(os.fstat(fd).st_size, "/dmabuf/" in os.readlink(f"/proc/self/fd/{{fd}}"))
"""


def test_kfd_export_dmabuf_gives_a_real_fd_under_the_shim(node):
    """Under the shim, EXPORT_DMABUF's dmabuf_fd is the dma-buf file's fd (the token traded
    as for PRIME), not the token."""
    c_program("libualink_shim.so")
    script = SHIM_EXPORT.format(acquire=tbl.KFD_ACQUIRE_VM.cmd,
                                alloc=tbl.KFD_ALLOC_MEMORY_OF_GPU.cmd,
                                export=tbl.KFD_EXPORT_DMABUF.cmd, flags=KFD_VRAM_RW)
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env.update(LD_PRELOAD=str(SHIM), UALINK_DRI_DIR=str(node.mount / "dri"))
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.split() == [str(1 << 20), "True"]


def test_ualinkctl_lists_kfd_allocations(node, capsys):
    """Issue 14 item 6: `ualinkctl kfd` shows each KFD allocation of the node (pid, handle,
    GPU VA, size, the GPUs it is mapped on), in text and --json; gone when the process
    closes its kfd."""
    gpu = gpu_ids(node)[0]
    kfd = os.open(node.mount / "kfd", os.O_RDWR | os.O_CLOEXEC)
    render = os.open(node.render(0), os.O_RDWR | os.O_CLOEXEC)
    try:
        handle = kfd_vram(kfd, render, gpu)
        assert ctl.main(["--mount", str(node.mount), "kfd"]) == 0
        text = capsys.readouterr().out
        assert f"{handle:#x}" in text and f"{VA:#x}" in text and "2 MiB" in text
        assert ctl.main(["--mount", str(node.mount), "--json", "kfd"]) == 0
        doc = json.loads(capsys.readouterr().out)
        rows = [r for a in doc["accels"] for r in a["kfd"]]
        assert rows == [{"pid": os.getpid(), "handle": handle, "va": VA, "size": SIZE,
                         "mapped": [gpu]}]
        # the process on each GPU: its VM (the render file ACQUIRE_VM bound, one mapping)
        # on the first, no VM on the second
        procs = [r for a in doc["accels"] for r in a["kfd_processes"]]
        assert procs == [
            {"pid": os.getpid(), "gpu_id": gpu, "vm_file_pid": os.getpid(), "vm_mappings": 1,
             "allocations": 1, "events": 0},
            {"pid": os.getpid(), "gpu_id": gpu_ids(node)[1], "vm_file_pid": 0,
             "vm_mappings": 0, "allocations": 0, "events": 0}]
        assert f"render file of pid {os.getpid()}" in text and "kfd processes" in text
    finally:
        os.close(kfd)
        os.close(render)
    assert ctl.main(["--mount", str(node.mount), "--json", "kfd"]) == 0
    after = json.loads(capsys.readouterr().out)["accels"]
    assert all(a["kfd"] == [] and a["kfd_processes"] == [] for a in after)


def test_kfd_import_dmabuf_of_a_render_node_bo(node):
    """IMPORT_DMABUF with a real dma-buf fd (PRIME_HANDLE_TO_FD of a GEM BO through
    libualink): the daemon finds the dma-buf behind the caller's fd, the BO becomes a KFD
    allocation of the GPU, mapped at va_addr, and GET_DMABUF_INFO reports its size and GPU;
    a regular file's fd is EINVAL."""
    gpu = gpu_ids(node)[0]
    kfd = os.open(node.mount / "kfd", os.O_RDWR | os.O_CLOEXEC)
    try:
        with Client(node.render(0)) as c:
            assert kfd_ioctl(kfd, tbl.KFD_ACQUIRE_VM.cmd, struct.pack("<II", c.fd, gpu))[0] == 0
            bo = c.bo_create(SIZE)
            fd = c.handle_to_fd(bo)
            try:
                err, out = kfd_ioctl(kfd, tbl.KFD_GET_DMABUF_INFO.cmd,
                                     struct.pack("<QQIIII", 0, 0, 0, 0, 0, fd))
                assert err == 0
                size, _, _, got_gpu, _, _ = struct.unpack("<QQIIII", out)
                assert (size, got_gpu) == (SIZE, gpu)
                err, out = kfd_ioctl(kfd, tbl.KFD_IMPORT_DMABUF.cmd,
                                     struct.pack("<QQII", VA, 0, gpu, fd))
                assert err == 0
                handle = struct.unpack("<QQII", out)[1]
                ids = (ctypes.c_uint32 * 1)(gpu)
                assert kfd_ioctl(kfd, tbl.KFD_MAP_MEMORY_TO_GPU.cmd, struct.pack(
                    "<QQII", handle, ctypes.addressof(ids), 1, 0))[0] == 0
                assert c.gpu_write(VA, b"\x42" * 4096) == 4096
                assert c.gpu_read(VA, 4096) == b"\x42" * 4096
                with tempfile.TemporaryFile() as f:
                    assert kfd_ioctl(kfd, tbl.KFD_IMPORT_DMABUF.cmd, struct.pack(
                        "<QQII", VA, 0, gpu, f.fileno()))[0] == errno.EINVAL
            finally:
                os.close(fd)
    finally:
        os.close(kfd)


def test_a_kfd_fd_works_only_in_the_process_that_opened_it(node):
    """kfd_ioctl's lead_thread check: another thread of the opening process may use the fd;
    a process that inherited it gets EBADF with nothing copied back, and the same process
    opening /dev/kfd itself gets a KFD context of its own that works."""
    import threading
    fd = os.open(node.mount / "kfd", os.O_RDWR)
    try:
        got: list[tuple[int, bytes]] = []
        t = threading.Thread(target=lambda: got.append(
            kfd_ioctl(fd, tbl.KFD_GET_VERSION.cmd, bytes(8))))
        t.start()
        t.join(30)
        assert got and got[0][0] == 0 and struct.unpack("<II", got[0][1]) == (1, 17)
        child = (
            "import fcntl, os, struct, sys\n"
            "fd, cmd, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]\n"
            "buf = bytearray(b'\\x55' * 8)\n"
            "try:\n"
            "    fcntl.ioctl(fd, cmd, buf); err = 0\n"
            "except OSError as e:\n"
            "    err = e.errno\n"
            "own = os.open(path, os.O_RDWR)\n"
            "mine = bytearray(8)\n"
            "fcntl.ioctl(own, cmd, mine)\n"
            "print(err, buf.hex(), struct.unpack('<II', mine))\n")
        r = subprocess.run([sys.executable, "-c", child, str(fd), str(tbl.KFD_GET_VERSION.cmd),
                            str(node.mount / "kfd")], pass_fds=[fd], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        err, buf, mine = r.stdout.split(" ", 2)
        assert int(err) == errno.EBADF and buf == "55" * 8
        assert mine.strip() == "(1, 17)"
    finally:
        os.close(fd)


def test_a_killed_process_leaves_no_kfd_state(node):
    """A process killed (SIGKILL) holding a VM, a mapped VRAM allocation, a GTT one and a
    signal event leaves nothing (issue 14 "Bad input"; kfd_process_wq_release): no KFD
    process, allocation, GEM object or render client remains on the node."""
    import signal
    import time
    gpu = gpu_ids(node)[0]
    child = (
        "import ctypes, fcntl, os, struct, sys\n"
        "kfd_path, render_path, gpu = sys.argv[1], sys.argv[2], int(sys.argv[3])\n"
        "acq, alloc, mapc, ev = (int(a) for a in sys.argv[4:8])\n"
        "kfd = os.open(kfd_path, os.O_RDWR); r = os.open(render_path, os.O_RDWR)\n"
        "fcntl.ioctl(kfd, acq, bytearray(struct.pack('<II', r, gpu)))\n"
        "handles = []\n"
        "for va, flags in ((1 << 33, 0x80000001), (1 << 34, 0x80000002)):\n"
        "    b = bytearray(struct.pack('<QQQQII', va, 1 << 20, 0, 0, gpu, flags))\n"
        "    fcntl.ioctl(kfd, alloc, b); handles.append(struct.unpack('<QQQQII', b)[2])\n"
        "ids = (ctypes.c_uint32 * 1)(gpu)\n"
        "fcntl.ioctl(kfd, mapc, bytearray(struct.pack('<QQII', handles[0],\n"
        "            ctypes.addressof(ids), 1, 0)))\n"
        "fcntl.ioctl(kfd, ev, bytearray(struct.pack('<QIIIIII', 0, 0, 0, 1, 0, 0, 0)))\n"
        "print('ready', flush=True)\n"
        "import time; time.sleep(600)\n")
    proc = subprocess.Popen(
        [sys.executable, "-c", child, str(node.mount / "kfd"), str(node.render(0)), str(gpu),
         *(str(s.cmd) for s in (tbl.KFD_ACQUIRE_VM, tbl.KFD_ALLOC_MEMORY_OF_GPU,
                                tbl.KFD_MAP_MEMORY_TO_GPU, tbl.KFD_CREATE_EVENT))],
        stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        minor = 128
        rows = node.debug(minor, "kfd_processes").splitlines()
        assert len(rows) == 1 and f"pid={proc.pid}" in rows[0] and "allocations=2" in rows[0]
        assert "events=1" in rows[0] and "vm_mappings=1" in rows[0]
        assert len(node.debug(minor, "kfd_allocations").splitlines()) == 2
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        deadline = time.monotonic() + 30  # the releases follow the exit asynchronously
        tables = ("kfd_processes", "kfd_allocations", "gem_objects", "clients")
        while time.monotonic() < deadline and any(node.debug(minor, t).strip()
                                                  for t in tables):
            time.sleep(0.1)
        for t in tables:
            assert node.debug(minor, t).strip() == "", (t, node.debug(minor, t))
    finally:
        proc.kill()
        proc.wait(30)


KFD_MMAP_CHILD = r'''
import ctypes, errno, fcntl, json, os, struct, sys
kfd_path, render_path, gpu = sys.argv[1], sys.argv[2], int(sys.argv[3])
ACQ, ALLOC, MAPC, CREATE = (int(a) for a in sys.argv[4:8])
libc = ctypes.CDLL(None, use_errno=True)  # the shim's mmap under LD_PRELOAD
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                      ctypes.c_int, ctypes.c_int64]
kfd = os.open(kfd_path, os.O_RDWR); r = os.open(render_path, os.O_RDWR)
fcntl.ioctl(kfd, ACQ, bytearray(struct.pack("<II", r, gpu)))
ids = (ctypes.c_uint32 * 1)(gpu)

def alloc(va, size, flags):
    b = bytearray(struct.pack("<QQQQII", va, size, 0, 0, gpu, flags))
    fcntl.ioctl(kfd, ALLOC, b)
    _, _, handle, offset, _, _ = struct.unpack("<QQQQII", b)
    fcntl.ioctl(kfd, MAPC, bytearray(struct.pack("<QQII", handle, ctypes.addressof(ids), 1, 0)))
    return handle, offset

def kmap(size, offset):
    off = offset - (1 << 64) if offset >= 1 << 63 else offset
    p = libc.mmap(None, size, 3, 1, kfd, off)  # PROT_READ|WRITE, MAP_SHARED
    return (p, 0) if p not in (None, ctypes.c_void_p(-1).value) else (None, ctypes.get_errno())

out = {}
EV_VA, DB_VA, MMIO_VA = 1 << 35, (1 << 35) + (1 << 20), (1 << 35) + (2 << 20)
page, _ = alloc(EV_VA, 32768, 0x80000002)  # GTT | WRITABLE: libhsakmt's events page
b = bytearray(struct.pack("<QIIIIII", page, 0, 0, 1, 0, 0, 0))
fcntl.ioctl(kfd, CREATE, b)
_, trigger, _, _, _, event_id, slot = struct.unpack("<QIIIIII", b)
ev, err = kmap(32768, 2 << 62)  # KFD_MMAP_TYPE_EVENTS
out["events_err"] = err
if ev is None:
    sys.exit(f"mmap of the events page: errno {err}")
out["slot_before"] = ctypes.string_at(ev + 8 * slot, 8).hex()
out["page_rest"] = ctypes.string_at(ev + 8 * (slot + 1), 8).hex()
ctypes.memmove(ev + 8 * slot, struct.pack("<Q", event_id), 8)  # as a GPU's signal would
out["slot_gpu_load"] = os.pread(r, 8, EV_VA + 8 * slot).hex()
out["events_too_big"] = kmap(65536, 2 << 62)[1]
_, db_cookie = alloc(DB_VA, 8192, 0x80000008)  # DOORBELL
db, out["doorbell_err"] = kmap(8192, db_cookie)
ctypes.memmove(db + 8, struct.pack("<Q", 0x1234), 8)
out["doorbell_gpu_load"] = os.pread(r, 8, DB_VA + 8).hex()
out["doorbell_wrong_size"] = kmap(4096, db_cookie)[1]
_, mmio_cookie = alloc(MMIO_VA, 4096, 0x80000010)  # MMIO_REMAP
out["mmio_err"] = kmap(4096, mmio_cookie)[1]
out["mmio_wrong_size"] = kmap(8192, mmio_cookie)[1]
out["unknown_gpu"] = kmap(8192, (3 << 62) | (0x1 << 46))[1]
print(json.dumps(out))
'''


def test_kfd_fd_mmap_events_doorbells_and_mmio_through_the_shim(node):
    """mmap(kfd fd) through the shim's CPU mappings (kfd_mmap): at KFD_MMAP_TYPE_EVENTS the
    events page CREATE_EVENT was given, every slot UNSIGNALED_EVENT_SLOT
    (kfd_event_page_set), and a store to the event's slot is the GPU's load of the same
    page; more than 32 KiB EINVAL. At a DOORBELL allocation's cookie the process's
    doorbell slice, the memory the GPU mapping of that allocation reaches, any other size
    EINVAL; the MMIO remap page, one page only; an unknown gpu_id ENODEV."""
    gpu = gpu_ids(node)[0]
    env = {k: v for k, v in os.environ.items() if not k.startswith("LD_")}
    env.update(LD_PRELOAD=str(SHIM), UALINK_DRI_DIR=str(node.mount / "dri"))
    r = subprocess.run(
        [sys.executable, "-c", KFD_MMAP_CHILD, str(node.mount / "kfd"), str(node.render(0)),
         str(gpu), *(str(s.cmd) for s in (tbl.KFD_ACQUIRE_VM, tbl.KFD_ALLOC_MEMORY_OF_GPU,
                                          tbl.KFD_MAP_MEMORY_TO_GPU, tbl.KFD_CREATE_EVENT))],
        env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr + node.log_text()
    out = json.loads(r.stdout)
    assert out["events_err"] == 0
    assert out["slot_before"] == "ff" * 8 and out["page_rest"] == "ff" * 8
    assert out["slot_gpu_load"] == struct.pack("<Q", 0).hex()  # event 0 in slot 0
    assert out["events_too_big"] == errno.EINVAL
    assert out["doorbell_err"] == 0
    assert out["doorbell_gpu_load"] == struct.pack("<Q", 0x1234).hex()
    assert out["doorbell_wrong_size"] == errno.EINVAL
    assert out["mmio_err"] == 0 and out["mmio_wrong_size"] == errno.EINVAL
    assert out["unknown_gpu"] == errno.ENODEV
