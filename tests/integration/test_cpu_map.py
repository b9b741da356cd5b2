"""CPU mappings of BOs through libualink_shim.so against real daemons (README, "CPU
mappings"; issue 9 item 6; userspace-surface §7 item 6): one memory per BO for CPU mappings,
GPU loads/stores and a remote importer's loads/stores, the kernel's mmap refusals, and who may
map what. The C client is tests/c/cpu_map.c (raw ioctl(2) and mmap(2) only)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from nodes import SHIM, c_program, running_node, running_pod
from test_shim import steps

pytestmark = pytest.mark.integration

RENDER = "/dev/dri/renderD128"  # the shim's redirect: its fds are tracked (tokens become fds)
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]


def env_for(node) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("LD_PRELOAD", "UALINK_DRI_DIR", "UALINK_DMABUF_DIR")}
    env.update(LD_PRELOAD=str(SHIM), UALINK_DRI_DIR=str(node.mount / "dri"))
    return env


def cpu_map(node, *args: str, prefix: list[str] | None = None) -> dict[str, dict[str, str]]:
    r = subprocess.run([*(prefix or []), c_program("cpu_map"), *args], env=env_for(node),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode in (0, 1), r.stdout + r.stderr
    return steps(r.stdout)


@contextlib.contextmanager
def cpu_map_proc(node, *args: str,
                 prefix: list[str] | None = None) -> Iterator[subprocess.Popen[str]]:
    """A long-lived cpu_map driven on stdin; killed on the way out whatever happens."""
    proc = subprocess.Popen([*(prefix or []), c_program("cpu_map"), *args], env=env_for(node),
                            text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        yield proc
    finally:
        with contextlib.suppress(OSError):
            proc.stdin.close()  # type: ignore[union-attr]
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def next_step(proc: subprocess.Popen[str]) -> dict[str, dict[str, str]]:
    line = proc.stdout.readline()  # type: ignore[union-attr]
    assert line, "cpu_map ended early"
    return steps(line)


def command(proc: subprocess.Popen[str], text: str) -> dict[str, dict[str, str]]:
    proc.stdin.write(text + "\n")  # type: ignore[union-attr]
    proc.stdin.flush()  # type: ignore[union-attr]
    return next_step(proc)


@pytest.fixture(scope="module")
def node():
    c_program("libualink_shim.so")
    # World-traversable: the uid tests run clients as nobody, who must reach the mount.
    root = Path(tempfile.mkdtemp(prefix="ualinkd-cpumap-"))
    root.chmod(0o755)
    try:
        with running_node(root) as n:
            yield n
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def local(node):
    return cpu_map(node, "local", RENDER)


@pytest.mark.parametrize("step", [
    "gem_mmap", "mmap", "cpu_store_gpu_load", "gpu_store_cpu_load", "two_mappings",
])
def test_one_memory_cpu_and_gpu(local, step):
    """amdgpu_bo_cpu_map (GEM_MMAP, mmap of the render fd at its offset): a CPU store is
    a GPU load's at once (pread at the VA), a GPU store (pwrite) is the mapping's at once,
    and two mappings of one BO are one memory."""
    assert local[step]["status"] == "ok", local


def test_cpu_store_reaches_the_gpu(local):
    """The bytes a GPU load returns are the ones the CPU stored through the mapping."""
    assert local["cpu_store_gpu_load"]["data"] == "cpu-store"
    assert local["gpu_store_cpu_load"]["data"] == "gpu-store"


@pytest.mark.parametrize("step", ["prot_none_fixed", "mprotect", "munmap"])
def test_libhsakmt_prot_none_map_fixed(local, step):
    """libhsakmt (§3.3 step 4): mmap(va, size, PROT_NONE, MAP_SHARED|MAP_FIXED, render_fd,
    offset) over its reserved VA range maps the BO there; mprotect makes it RW and it is the
    BO (a store through it is a GPU load's); munmap works."""
    assert local[step]["status"] == "ok", local


@pytest.mark.parametrize("step,errno_", [
    ("private_read", 22),        # ttm_bo_mmap_obj: no COW mappings
    ("private_none_write", 13),  # amdgpu's Thunk workaround: PROT_NONE MAP_PRIVATE, never W
    ("inner_offset", 22),        # drm_gem_mmap: exact offset lookup
    ("too_long", 22),            # drm_gem_mmap_obj: no longer than the BO
    ("other_file", 13),          # drm_vma_node_is_allowed: this file holds no handle
    ("readonly_write", 13),      # do_mmap: PROT_WRITE MAP_SHARED of an O_RDONLY file
    ("readonly_mprotect", 13),   # ... and mprotect cannot make it writable later
    ("dmabuf_past_end", 22),     # dma_buf_mmap_internal: range inside the buffer
    ("userptr_gem_mmap", 1),     # §2.7: userptr BO → GEM_MMAP EPERM
])
def test_kernel_refusals(local, step, errno_):
    """The kernel's mmap errnos, in its order (amdgpu/cpu_map.py names each check)."""
    assert local[step] == {"status": "ok", "errno": str(errno_)}, local


@pytest.mark.parametrize("step", ["private_none", "private_none_read", "readonly_read",
                                  "dmabuf", "dmabuf_offset"])
def test_mappings_that_work(local, step):
    """PROT_NONE MAP_PRIVATE maps and can become readable; an O_RDONLY file maps read-only;
    mmap of the BO's dma-buf fd maps the same memory (at an offset: the BO's bytes there)."""
    assert local[step]["status"] == "ok", local


def test_mapping_outlives_the_fds(local):
    """The kernel keeps a mapped BO's memory while mapped: closing every fd leaves the
    mapping readable and writable, with the BO's bytes in it."""
    assert local["after_close"]["status"] == "ok", local


def test_daemon_holds_no_grant_after_mapping(node):
    """Every grant the shim asked for was fetched: nothing stays pending in the daemon."""
    text = (node.mount / "sys/kernel/debug/cpu_map_grants").read_text()
    assert text == "0\n"


# ---- who may map ------------------------------------------------------------------------


def test_other_processes_and_uids_get_nothing(node):
    """§7 item 6's security rule: a process maps only BOs its own DrmFile holds a handle to.
    Another process (same uid, or nobody) mapping the offset through its own render fd gets
    EACCES; a grant taken by one process cannot be fetched by another (nobody, or root in
    another process: EACCES), and a grant is single-use (then ENOENT)."""
    with cpu_map_proc(node, "grant", RENDER) as owner:
        g1 = next_step(owner)["grant1"]
        g2 = next_step(owner)["grant2"]
        assert g1["status"] == g2["status"] == "ok"
        offset = g1["offset"]
        assert cpu_map(node, "other", RENDER, offset)["other_process"]["errno"] == "13"
        as_nobody = cpu_map(node, "other", RENDER, offset, prefix=NOBODY)
        assert as_nobody["other_process"] == {"status": "ok", "errno": "13"}
        stolen = cpu_map(node, "fetch", g1["socket"], g1["grant"], prefix=NOBODY)
        assert stolen["fetch"]["result"] == "-13"
        again = cpu_map(node, "fetch", g1["socket"], g1["grant"])
        assert again["fetch"]["result"] == "-2"
        other_root = cpu_map(node, "fetch", g2["socket"], g2["grant"])
        assert other_root["fetch"]["result"] == "-13"


# ---- across the fabric ------------------------------------------------------------------


def test_remote_importer_and_exporter_cpu_map_share_one_memory(tmp_path):
    """Issue 9 item 6 across two nodes: the exporter's CPU store is what the importer's GPU
    load over the fabric returns, and the importer's remote store is in the exporter's CPU
    mapping at once. The import itself is not CPU mappable (§4.6: mmap of its dma-buf and
    GEM_MMAP → EPERM)."""
    c_program("libualink_shim.so")
    with running_pod(tmp_path, 2) as (n0, n1), cpu_map_proc(n0, "export", RENDER) as exp:
        handle = next_step(exp)["export"]
        assert handle["status"] == "ok"
        assert command(exp, "store 4096 exporter-cpu-store")["store"]["status"] == "ok"
        imp = cpu_map(n1, "import", RENDER, handle["lo"], handle["hi"], "4096", "18",
                      "8192", "remote-store")
        assert imp["import_mmap"] == {"status": "ok", "errno": "1"}, imp
        assert imp["import_gem_mmap"] == {"status": "ok", "errno": "1"}, imp
        assert imp["remote_load"]["data"] == "exporter-cpu-store", imp
        assert imp["remote_store"]["status"] == "ok", imp
        assert command(exp, "show 8192 12")["show"]["data"] == "remote-store"


def test_another_uid_maps_its_own_bos(node):
    """The uid rule is not "root only": nobody maps the BOs of its own DrmFile, with every
    mapping and refusal of the one-node run the same (SO_PEERCRED uid = the FUSE caller's)."""
    as_nobody = cpu_map(node, "local", RENDER, prefix=NOBODY)
    failed = {k: v for k, v in as_nobody.items() if v["status"] != "ok"}
    assert not failed and "after_close" in as_nobody, as_nobody


def _clients(node) -> str:
    return node.debug(128, "clients")


def test_a_mapping_holds_its_render_file(node):
    """The kernel's vma holds the render file: after close() the DrmFile stays, with its
    handle and so its UALink export (§6.4: the handle count drops only when the file goes),
    through a partial munmap and a hole, until the last byte is unmapped; then the file is
    released and the export revoked."""
    with cpu_map_proc(node, "hold", RENDER) as proc:
        closed = next_step(proc)["closed"]
        mine = f"pid={closed['pid']} "
        lo = f"{int(closed['lo']):#018x}"
        assert mine in _clients(node) and lo in node.debug(128, "ualink_exports")
        assert command(proc, "partial")["partial"]["status"] == "ok"
        assert mine in _clients(node) and lo in node.debug(128, "ualink_exports")
        assert command(proc, "unmap")["unmapped"]["status"] == "ok"
        deadline = time.monotonic() + 10
        while mine in _clients(node) or lo in node.debug(128, "ualink_exports"):
            assert time.monotonic() < deadline, _clients(node)
            time.sleep(0.02)


def test_a_read_only_fd_cannot_claim_to_be_writable(node):
    """Review finding (do_mmap's FMODE_WRITE rule, enforced at the FUSE edge): the grant's
    `fmode` is the open's own access mode, not what the caller writes in the request, so a
    raw caller holding an O_RDONLY render fd that asks for a writable shared mapping with
    fmode=O_RDWR gets EACCES."""
    import errno
    import fcntl

    from ualinkd.abi import cpumap as abi
    from ualinkd.abi import structs as st
    from ualinkd.abi.ioc import iowr
    from ualinkd.amdgpu import cpu_map as cm

    fd = os.open(node.render(), os.O_RDONLY)
    try:
        create = bytearray(st.GEM_CREATE_IN.encode(st.GemCreateIn(1 << 20, 4096, 4, 0)))
        fcntl.ioctl(fd, iowr(0x40, 32), create)
        handle = int.from_bytes(create[:4], "little")
        mm = bytearray(handle.to_bytes(4, "little") + bytes(4))
        fcntl.ioctl(fd, iowr(0x41, 8), mm)
        offset = int.from_bytes(mm, "little")
        req = bytearray(abi.MMAP_GRANT.encode(abi.MmapGrant(
            offset, 1 << 20, cm.PROT_READ | cm.PROT_WRITE, cm.MAP_SHARED, cm.O_RDWR, 0, 0, 0)))
        with pytest.raises(OSError) as e:
            fcntl.ioctl(fd, abi.UALINKD_IOCTL_MMAP_GRANT, req)
        assert e.value.errno == errno.EACCES
    finally:
        os.close(fd)


def _vram_used(node) -> int:
    """AMDGPU_INFO_VRAM_USAGE (0x10) through a render fd of our own."""
    import ctypes
    import fcntl
    import struct

    from ualinkd.abi import structs as st
    from ualinkd.abi.ioc import iow

    out = (ctypes.c_uint8 * 8)()
    fd = os.open(node.render(), os.O_RDWR)
    try:
        fcntl.ioctl(fd, iow(0x45, 32), bytearray(st.INFO.encode(
            st.AmdgpuInfo(ctypes.addressof(out), 8, 0x10, (0, 0, 0, 0)))))
    finally:
        os.close(fd)
    return int(struct.unpack("<Q", bytes(out))[0])


def test_a_closed_bo_keeps_its_charge_while_it_is_mapped():
    """Issue 29 item 5: in the kernel a mapping holds a reference on the GEM object, so a
    BO GEM_CLOSEd while mapped keeps its memory and its VRAM charge until the last unmap.
    On 16 MiB pools of VRAM and GTT, nobody creates, maps, fills and closes 8 MiB VRAM BOs
    (GEM_CREATE retries a VRAM BO that does not fit as VRAM|GTT), keeping each mapping:
    the fifth is ENOMEM (it was created, and the sixth: host memory past the pools), VRAM
    shows its 16 MiB in use, and once every mapping is gone the charge is back."""
    import dataclasses

    from ualinkd.config import PodConfig

    c_program("libualink_shim.so")
    base = PodConfig.local(1, 1)
    accels = tuple(dataclasses.replace(a, vram_size=16 << 20, gtt_size=16 << 20)
                   for a in base.nodes[0].accels)
    config = dataclasses.replace(base, nodes=(dataclasses.replace(base.nodes[0],
                                                                  accels=accels),))
    root = Path(tempfile.mkdtemp(prefix="ualinkd-cpumap-"))
    root.chmod(0o755)  # (nobody reaches the mount)
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, root, ignore_errors=True)
        node = stack.enter_context(running_node(root, config))
        with cpu_map_proc(node, "closed", RENDER, "8", "6", prefix=NOBODY) as proc:
            created = [next_step(proc)[f"create{i}"] for i in range(6)]
            print(f"{sum(c['errno'] == '0' for c in created)} of 6 8 MiB BOs created, "
                  "filled, closed and kept mapped on 16 MiB VRAM + 16 MiB GTT")
            assert [c["errno"] for c in created] == ["0", "0", "0", "0", "12", "12"], created
            assert _vram_used(node) == 16 << 20
            done = command(proc, "unmap")
            assert done["unmapped"] == {"status": "ok", "count": "4"}
            assert next_step(proc)["after"] == {"status": "ok", "errno": "0"}
            assert _vram_used(node) == 8 << 20  # (the one made after: still open)
        assert _vram_used(node) == 0
