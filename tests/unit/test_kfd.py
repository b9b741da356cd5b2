"""The KFD's dispatch and ioctl rules (kfd_chardev.c, spec userspace-surface §3.3, §7
items 2–4), sans-IO over a real NodeCore: the 'K' table, GET_VERSION, the apertures array,
ACQUIRE_VM's checks, SET_MEMORY_POLICY, AVAILABLE_MEMORY, GET_CLOCK_COUNTERS; and the
topology the same node shows under sys/devices/virtual/kfd (issue 14 items 1–3)."""

from __future__ import annotations

import errno
import struct

import pytest
import trio

from ualinkd import sysfs
from ualinkd.abi import ioctls as tbl
from ualinkd.abi import structs as st
from ualinkd.abi.ioc import IOC_READ, IOC_WRITE, ioc
from ualinkd.amdkfd import chardev
from ualinkd.config import PodConfig
from ualinkd.drm.device import Caller, IoctlResult
from ualinkd.drm.errors import DrmError
from ualinkd.node import NodeCore

CALLER = Caller(pid=4242, uid=0)


class Memory:
    """A caller's memory: what copy_to_user wrote, by address; `bad` addresses fault."""

    def __init__(self) -> None:
        self.writes: dict[int, bytes] = {}
        self.bad: set[int] = set()

    async def copy_to_user(self, pid: int, address: int, data: bytes) -> None:
        if address in self.bad:
            raise DrmError(errno.EFAULT)
        self.writes[address] = data


def make_node(accels: int = 2, fds: dict[int, object] | None = None,
              mem: Memory | None = None) -> NodeCore:
    config = PodConfig.local(1, accels)

    async def resolve(pid: int, fd: int):  # the edge's contract: EINVAL for a foreign fd
        f = (fds or {}).get(fd)
        if f is None:
            raise DrmError(errno.EINVAL)
        return f

    return NodeCore(config, config.nodes[0].name, clock=lambda: (10**9, 5 * 10**9),
                    copy_to_user=(mem or Memory()).copy_to_user, resolve_drm_file=resolve,
                    host_cpus=8, host_memory=1 << 34)


def call(node: NodeCore, p, cmd: int, data: bytes = b"") -> IoctlResult:
    res = node.kfd.ioctl(p, cmd, data, CALLER)
    if isinstance(res, IoctlResult):
        return res

    async def run() -> IoctlResult:
        return await res

    return trio.run(run)


def test_unknown_and_out_of_range_nrs_are_enotty_with_nothing_copied():
    """kfd_ioctl: nr 0 and nr >= AMDKFD_COMMAND_END have no entry: ENOTTY, no bytes back;
    an entry not emulated is ENOTTY too (not a fake success)."""
    node = make_node()
    p = node.kfd.open(CALLER)
    for nr in (0x00, tbl.KFD_COMMAND_END, 0x80, 0xFF):
        res = call(node, p, ioc(IOC_READ | IOC_WRITE, ord("K"), nr, 16), b"\x55" * 16)
        assert (res.result, res.out) == (-errno.ENOTTY, b"")
    create_queue = tbl.KFD_IOCTLS[0x02]
    assert call(node, p, create_queue.cmd, bytes(88)).result == -errno.ENOTTY


def test_get_version_is_1_17_by_nr_whatever_the_type():
    """GET_VERSION (0x01, R 8): major 1, minor >= 12 (libhsakmt's dma-buf export check);
    the kernel dispatches by nr, so the user's type byte does not matter."""
    node = make_node()
    p = node.kfd.open(CALLER)
    res = call(node, p, tbl.KFD_GET_VERSION.cmd)
    assert res.result == 0
    assert struct.unpack("<II", res.out) == (1, 17)
    assert hex(tbl.KFD_GET_VERSION.cmd) == "0x80084b01"


def test_get_process_apertures_new_counts_then_fills():
    """kfd_ioctl_get_process_apertures_new: 0 asks the count (one pdd per GPU); a count
    fills min(count, pdds) entries with each GPU's gpu_id and the gfx9 apertures; a faulting
    array is EFAULT."""
    mem = Memory()
    node = make_node(2, mem=mem)
    p = node.kfd.open(CALLER)
    cmd = tbl.KFD_GET_PROCESS_APERTURES_NEW.cmd
    res = call(node, p, cmd, struct.pack("<QII", 0x1000, 0, 0))
    assert res.result == 0 and struct.unpack("<QII", res.out)[1] == 2
    res = call(node, p, cmd, struct.pack("<QII", 0x1000, 8, 0))
    assert res.result == 0 and struct.unpack("<QII", res.out)[1] == 2
    entries = [st.KFD_PROCESS_DEVICE_APERTURES.decode(mem.writes[0x1000][i * 56:(i + 1) * 56])
               for i in range(2)]
    assert [e.gpu_id for e in entries] == [g.gpu_id for g in node.topology.gpus]
    assert entries[0].lds_base == 1 << 48 and entries[0].scratch_base == 2 << 48
    assert entries[0].lds_limit == (1 << 48) | 0xFFFFFFFF
    assert (entries[0].gpuvm_base, entries[0].gpuvm_limit) == (0x1000000, 0x7FFFFFFFFFFF)
    res = call(node, p, cmd, struct.pack("<QII", 0x1000, 1, 0))
    assert struct.unpack("<QII", res.out)[1] == 1 and len(mem.writes[0x1000]) == 56
    mem.bad.add(0x2000)
    assert call(node, p, cmd, struct.pack("<QII", 0x2000, 2, 0)).result == -errno.EFAULT


def test_acquire_vm_rules():
    """kfd_ioctl_acquire_vm: a foreign fd EINVAL (1), an unknown gpu_id EINVAL (2), the
    same file twice 0 and another file EBUSY (3), another GPU's render file EINVAL (4)."""
    fds: dict[int, object] = {}
    node = make_node(2, fds=fds)
    d0, d1 = list(node.devices.values())
    f0, f0b, f1 = d0.open(1, 0), d0.open(1, 0), d1.open(1, 0)
    fds.update({5: f0, 6: f0b, 7: f1})
    p = node.kfd.open(CALLER)
    g0, g1 = (g.gpu_id for g in node.topology.gpus)
    cmd = tbl.KFD_ACQUIRE_VM.cmd
    assert call(node, p, cmd, struct.pack("<II", 99, g0)).result == -errno.EINVAL  # 1
    assert call(node, p, cmd, struct.pack("<II", 5, 0xDEAD)).result == -errno.EINVAL  # 2
    assert call(node, p, cmd, struct.pack("<II", 7, g0)).result == -errno.EINVAL  # 4
    assert call(node, p, cmd, struct.pack("<II", 5, g0)).result == 0
    assert p.pdds[g0].drm_file is f0
    assert call(node, p, cmd, struct.pack("<II", 5, g0)).result == 0  # 3
    assert call(node, p, cmd, struct.pack("<II", 6, g0)).result == -errno.EBUSY
    assert call(node, p, cmd, struct.pack("<II", 7, g1)).result == 0
    assert call(node, p, cmd, b"").result == -errno.EINVAL  # W-only: 0 bytes in, fd 0


def test_set_memory_policy_and_available_memory_and_clocks():
    """SET_MEMORY_POLICY: policies 0/1 only, a known gpu_id; AVAILABLE_MEMORY: that GPU's
    free VRAM, EINVAL for an unknown gpu_id; GET_CLOCK_COUNTERS: the injected clocks, a 0
    GPU counter (no error) for an unknown gpu_id."""
    node = make_node(1)
    p = node.kfd.open(CALLER)
    g = node.topology.gpus[0].gpu_id
    pol = tbl.KFD_SET_MEMORY_POLICY.cmd
    assert call(node, p, pol, struct.pack("<QQIIII", 0, 0, g, 1, 0, 0)).result == 0
    assert p.pdds[g].default_policy == 1
    assert call(node, p, pol, struct.pack("<QQIIII", 0, 0, g, 2, 0, 0)).result == -errno.EINVAL
    assert call(node, p, pol, struct.pack("<QQIIII", 0, 0, 7, 0, 0, 0)).result == -errno.EINVAL
    avail = tbl.KFD_AVAILABLE_MEMORY.cmd
    res = call(node, p, avail, struct.pack("<QII", 0, g, 0))
    assert res.result == 0 and struct.unpack("<QII", res.out)[0] == node.topology.gpus[0].vram_size
    node.devices[128].driver.bo_create(1 << 20, 4096, 4, 0)  # VRAM charged
    res = call(node, p, avail, struct.pack("<QII", 0, g, 0))
    assert struct.unpack("<QII", res.out)[0] == node.topology.gpus[0].vram_size - (1 << 20)
    assert call(node, p, avail, struct.pack("<QII", 0, 3, 0)).result == -errno.EINVAL
    clk = tbl.KFD_GET_CLOCK_COUNTERS.cmd
    out = struct.unpack("<QQQQII", call(node, p, clk, struct.pack("<32xII", g, 0)).out)
    assert out == (10**8, 10**9, 5 * 10**9, 10**9, g, 0)  # 100 MHz GPU counter
    out = struct.unpack("<QQQQII", call(node, p, clk, struct.pack("<32xII", 1, 0)).out)
    assert out[0] == 0 and out[1] == 10**9


def test_one_process_per_pid_released_with_its_last_open():
    """kfd_create_process: a second open by the same process gets the same kfd_process;
    it (and its VM bindings) goes with the last release."""
    node = make_node(1)
    a, b = node.kfd.open(CALLER), node.kfd.open(CALLER)
    assert a is b and node.kfd.processes == {CALLER.pid: a}
    node.release_kfd(a)
    assert node.kfd.processes
    node.release_kfd(b)
    assert node.kfd.processes == {}


@pytest.mark.parametrize("accels", [1, 3])
def test_topology_matches_the_drm_identity(accels: int):
    """§3.3: node 0 the CPU (gpu_id 0), then one node per accel with drm_render_minor,
    location_id = bus << 8 of its PCI address, device_id, gfx_target_version, simd_count,
    and a VRAM bank of the accel's capacity; gpu_ids unique, non-zero, those the KFD takes."""
    node = make_node(accels)
    tree = node.sys_tree()
    top = "devices/virtual/kfd/kfd/topology"
    nodes = sysfs.resolve(tree, f"{top}/nodes")
    assert sorted(nodes) == [str(i) for i in range(accels + 1)]
    assert sysfs.resolve(tree, f"{top}/nodes/0/gpu_id").read() == "0\n"
    ids = []
    for i, (minor, dev) in enumerate(node.devices.items(), start=1):
        props = dict(line.split() for line in
                     sysfs.resolve(tree, f"{top}/nodes/{i}/properties").read().splitlines())
        profile = dev.driver.profile
        assert int(props["drm_render_minor"]) == minor
        bdf = sysfs.pci_bdf(minor)
        assert int(props["location_id"]) == int(bdf[5:7], 16) << 8 and props["domain"] == "0"
        assert int(props["device_id"]) == profile.pci_device
        assert int(props["gfx_target_version"]) == profile.gfx_target_version
        assert int(props["simd_count"]) == profile.num_cu * profile.simd_per_cu
        bank = dict(line.split() for line in sysfs.resolve(
            tree, f"{top}/nodes/{i}/mem_banks/0/properties").read().splitlines())
        assert int(bank["size_in_bytes"]) == node.config.accel_memory(node.node.accels[i - 1])[0]
        assert bank["heap_type"] == "1"
        ids.append(int(sysfs.resolve(tree, f"{top}/nodes/{i}/gpu_id").read()))
        assert sysfs.resolve(tree, f"{top}/nodes/{i}/io_links/0/properties").read()
    assert len(set(ids)) == accels and 0 not in ids
    assert ids == list(node.kfd.nodes)
    assert "topology" in sysfs.resolve(tree, "class/kfd/kfd")  # the link resolves


def test_apertures_layout_is_56_bytes():
    assert st.KFD_PROCESS_DEVICE_APERTURES.size == 56
    assert chardev.GPUVM_LIMIT == 0x7FFFFFFFFFFF
    assert ioc(IOC_WRITE, ord("K"), 0x15, 8) == tbl.KFD_ACQUIRE_VM.cmd
