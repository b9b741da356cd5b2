"""The KFD's dispatch and ioctl rules (kfd_chardev.c, spec userspace-surface §3.3, §7
items 2–4), sans-IO over a real NodeCore: the 'K' table, GET_VERSION, the apertures array,
ACQUIRE_VM's checks, SET_MEMORY_POLICY, AVAILABLE_MEMORY, GET_CLOCK_COUNTERS; and the
topology the same node shows under sys/devices/virtual/kfd (issue 14 items 1–3)."""

from __future__ import annotations

import errno
import struct

import pytest
import trio
import ualink_testkit as kit

from ualinkd import sysfs
from ualinkd.abi import ioctls as tbl
from ualinkd.abi import structs as st
from ualinkd.abi.ioc import IOC_READ, IOC_WRITE, ioc
from ualinkd.amdkfd import chardev
from ualinkd.config import PodConfig
from ualinkd.drm.device import Caller, IoctlResult
from ualinkd.drm.errors import DrmError
from ualinkd.drm.process import ProcessId
from ualinkd.node import NodeCore, NodeServices

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

    return NodeCore(config, config.nodes[0].name, NodeServices(clock=lambda: (10**9, 5 * 10**9),
                    copy_to_user=(mem or Memory()).copy_to_user, resolve_drm_file=resolve,
                    host_cpus=8, host_memory=1 << 34, spawn=kit.lazy_spawn))


def call(node: NodeCore, p, cmd: int, data: bytes = b"", caller: Caller | None = None
         ) -> IoctlResult:
    """The ioctl from `p`'s own process (kfd_ioctl's lead_thread check), unless `caller`."""
    res = node.kfd.ioctl(p, cmd, data, caller or Caller(pid=p.pid, uid=CALLER.uid))
    return kit.run(res)  # type: ignore[no-any-return]  # (its coroutine, run to its end)


def test_unknown_and_out_of_range_nrs_are_enotty_with_nothing_copied():
    """kfd_ioctl: nr 0 and nr >= AMDKFD_COMMAND_END have no entry: ENOTTY, no bytes back;
    an entry not emulated is ENOTTY too (not a fake success)."""
    node = make_node()
    p = node.kfd.open(CALLER)
    for nr in (0x00, tbl.KFD_COMMAND_END, 0x80, 0xFF):
        res = call(node, p, ioc(IOC_READ | IOC_WRITE, ord("K"), nr, 16), b"\x55" * 16)
        assert (res.result, res.out) == (-errno.ENOTTY, b"")
    criu = tbl.KFD_IOCTLS[0x22]  # CRIU: not emulated
    assert call(node, p, criu.cmd, bytes(56)).result == -errno.ENOTTY


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


def test_a_kfd_file_answers_only_its_own_process():
    """kfd_ioctl: after the nr lookup (an unknown nr stays ENOTTY), a caller whose process
    is not the one that opened the file gets EBADF with nothing copied; another thread of
    the same process (identify maps it) is that process."""
    node = make_node(1)
    node.kfd.identify = lambda tid: ProcessId({4243: CALLER.pid}.get(tid, tid), 0)
    p = node.kfd.open(Caller(pid=4243, uid=0))  # opened by a second thread
    assert p.pid == CALLER.pid
    stranger = Caller(pid=5000, uid=0)
    res = call(node, p, tbl.KFD_GET_VERSION.cmd, b"", stranger)
    assert (res.result, res.out) == (-errno.EBADF, b"")
    res = call(node, p, ioc(IOC_READ, ord("K"), 0x60, 8), b"", stranger)
    assert res.result == -errno.ENOTTY
    assert call(node, p, tbl.KFD_GET_VERSION.cmd, b"", Caller(pid=4243, uid=0)).result == 0
    assert call(node, p, tbl.KFD_GET_VERSION.cmd).result == 0


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


class UserArrays(Memory):
    """Memory that also answers copy_from_user with u32 arrays placed by the test."""

    def __init__(self) -> None:
        super().__init__()
        self.arrays: dict[int, bytes] = {}

    async def copy_from_user(self, pid: int, address: int, size: int) -> bytes:
        if address in self.bad or address not in self.arrays:
            raise DrmError(errno.EFAULT)
        return self.arrays[address][:size]


def memory_node(accels: int = 2):
    """A node whose process acquired every GPU's VM through its own render files."""
    fds: dict[int, object] = {}
    mem = UserArrays()
    node = make_node(accels, fds=fds, mem=mem)
    node.kfd.copy_from_user = mem.copy_from_user
    p = node.kfd.open(CALLER)
    ids = [g.gpu_id for g in node.topology.gpus]
    files = []
    for i, dev in enumerate(node.devices.values()):
        f = dev.open(CALLER.pid, 0)
        files.append(f)
        fds[10 + i] = f
        acquire = struct.pack("<II", 10 + i, ids[i])
        assert call(node, p, tbl.KFD_ACQUIRE_VM.cmd, acquire).result == 0
    return node, p, ids, files, mem


def alloc(node, p, gpu_id: int, flags: int, size: int = 1 << 20, va: int = 1 << 32):
    res = call(node, p, tbl.KFD_ALLOC_MEMORY_OF_GPU.cmd,
               struct.pack("<QQQQII", va, size, 0, 0, gpu_id, flags))
    return res.result, st.KFD_ALLOC_MEMORY_OF_GPU.decode(res.out)


def test_alloc_rules():
    """kfd_ioctl_alloc_memory_of_gpu: size 0 EINVAL, unknown gpu_id EINVAL, no VM ENODEV,
    doorbells one slice and MMIO one page (EINVAL), no memory type EINVAL, USERPTR at an
    unaligned address EINVAL and without the caller's pages EFAULT,
    too big ENOMEM with no fallback to GTT; a VRAM allocation is a GEM BO
    of the acquired file, handle = gpu_id << 32 | idr, mmap offset the render node's."""
    node, p, (g0, g1), (f0, _), _ = memory_node()
    vram = chardev.ALLOC_MEM_FLAGS_VRAM
    assert alloc(node, p, g0, vram, size=0)[0] == -errno.EINVAL
    assert alloc(node, p, 0xBEEF, vram)[0] == -errno.EINVAL
    assert alloc(node, p, g0, 0)[0] == -errno.EINVAL
    userptr = chardev.ALLOC_MEM_FLAGS_USERPTR
    res = call(node, p, tbl.KFD_ALLOC_MEMORY_OF_GPU.cmd,
               struct.pack("<QQQQII", 1 << 32, 4096, 0, 0x1234, g0, userptr))
    assert res.result == -errno.EINVAL  # an unaligned user address
    res = call(node, p, tbl.KFD_ALLOC_MEMORY_OF_GPU.cmd,
               struct.pack("<QQQQII", 1 << 32, 4096, 0, 0x10000, g0, userptr))
    assert res.result == -errno.EFAULT  # no access to the caller's memory here
    assert alloc(node, p, g0, chardev.ALLOC_MEM_FLAGS_MMIO_REMAP, size=8192)[0] == -errno.EINVAL
    assert alloc(node, p, g0, chardev.ALLOC_MEM_FLAGS_DOORBELL, size=4096)[0] == -errno.EINVAL
    capacity = node.topology.gpus[0].vram_size
    assert alloc(node, p, g0, vram, size=capacity + 4096)[0] == -errno.ENOMEM
    assert node.devices[128].driver.gtt.used == 0  # no fallback
    q = node.kfd.open(Caller(pid=99, uid=0))  # a process that acquired nothing
    assert alloc(node, q, g0, vram)[0] == -errno.ENODEV
    rc, out = alloc(node, p, g0, vram | chardev.ALLOC_MEM_FLAGS_WRITABLE)
    assert rc == 0 and out.handle == g0 << 32 | 0
    bo = p.pdds[g0].mems[0].bo
    assert any(o is bo for o in f0.handles.values())
    assert out.mmap_offset == bo.mmap_offset != 0
    rc, out = alloc(node, p, g0, chardev.ALLOC_MEM_FLAGS_MMIO_REMAP, size=4096, va=2 << 32)
    assert rc == 0 and out.handle == g0 << 32 | 1
    assert out.mmap_offset == chardev.KFD_MMAP_TYPE_MMIO | g0 << 46


def test_map_unmap_free_rules():
    """kfd_ioctl_map_memory_to_gpu / unmap / free: n_devices 0 or n_success > n_devices
    EINVAL, a faulting array EFAULT, an unknown handle ENOMEM; a gpu_id not the process's
    EINVAL with n_success counting the GPUs done; mapping twice is no error; a mapped
    allocation cannot be freed (EBUSY); unmapping where it is not mapped is EINVAL; the
    mapping is in each GPU's VM at va (a GPU load through the file reads the BO)."""
    node, p, (g0, g1), (f0, f1), mem = memory_node()
    flags = chardev.ALLOC_MEM_FLAGS_VRAM | chardev.ALLOC_MEM_FLAGS_WRITABLE
    va = 1 << 32
    _, out = alloc(node, p, g0, flags, va=va)
    h = out.handle
    mem.arrays[0x100] = struct.pack("<II", g0, g1)
    mem.arrays[0x200] = struct.pack("<II", g0, 0xBEEF)
    mapc, unmapc = tbl.KFD_MAP_MEMORY_TO_GPU.cmd, tbl.KFD_UNMAP_MEMORY_FROM_GPU.cmd

    def m(cmd, handle, ptr, n, done=0):
        res = call(node, p, cmd, struct.pack("<QQII", handle, ptr, n, done))
        return res.result, struct.unpack("<QQII", res.out)[3] if res.out else None

    assert m(mapc, h, 0x100, 0)[0] == -errno.EINVAL
    assert m(mapc, h, 0x100, 1, done=2)[0] == -errno.EINVAL
    assert m(mapc, h, 0x999, 2)[0] == -errno.EFAULT
    assert m(mapc, h | 7, 0x100, 2)[0] == -errno.ENOMEM
    assert m(mapc, h, 0x200, 2) == (-errno.EINVAL, 1)  # g0 mapped, then the bad id
    assert m(mapc, h, 0x200, 1) == (0, 1)  # again: nothing to do
    assert m(mapc, h, 0x100, 2, done=1) == (0, 2)  # the retry from n_success maps g1
    for f in (f0, f1):
        vm = f.device.driver.vm(f)
        assert vm.lookup(va) is not None and vm.lookup(va).bo_va.bo is p.pdds[g0].mems[0].bo
    free = tbl.KFD_FREE_MEMORY_OF_GPU.cmd
    assert call(node, p, free, struct.pack("<Q", h)).result == -errno.EBUSY
    assert m(unmapc, h, 0x100, 2) == (0, 2)
    assert m(unmapc, h, 0x100, 1) == (-errno.EINVAL, 0)  # not mapped there any more
    assert f1.device.driver.vm(f1).lookup(va) is None
    assert call(node, p, free, struct.pack("<Q", h)).result == 0
    assert call(node, p, free, struct.pack("<Q", h)).result == -errno.EINVAL
    assert node.devices[128].objects == {}


def test_process_exit_frees_its_allocations():
    """A process that goes with allocations mapped leaves nothing: its BOs unmapped from
    every VM and freed (kfd_process_wq_release)."""
    node, p, (g0, g1), (f0, f1), mem = memory_node()
    _, out = alloc(node, p, g0, chardev.ALLOC_MEM_FLAGS_VRAM)
    mem.arrays[0x100] = struct.pack("<II", g0, g1)
    res = call(node, p, tbl.KFD_MAP_MEMORY_TO_GPU.cmd,
               struct.pack("<QQII", out.handle, 0x100, 2, 0))
    assert res.result == 0
    node.release_kfd(p)
    assert f1.device.driver.vm(f1).lookup(1 << 32) is None
    assert f0.device.driver.vm(f0).lookup(1 << 32) is None
    assert node.devices[128].objects == {}


# ---- events (kfd_events.c) ------------------------------------------------------------------

def event_node():
    from ualinkd.daemon import TrioSyncWaits
    mem = UserArrays()
    node = make_node(1, mem=mem)
    node.kfd.copy_from_user = mem.copy_from_user
    node.kfd.waits = TrioSyncWaits()
    return node, node.kfd.open(CALLER), mem


def create(node, p, event_type: int = 0, auto_reset: int = 1, page: int = 0):
    res = call(node, p, tbl.KFD_CREATE_EVENT.cmd,
               struct.pack("<QIIIIII", page, 0, event_type, auto_reset, 0, 0, 0))
    return res.result, st.KFD_CREATE_EVENT.decode(res.out)


def wait_args(mem, ids, ptr=0x500, all_=0, timeout=0) -> bytes:
    mem.arrays[ptr] = b"".join(struct.pack("<32xQII", 0, i, 0) for i in ids)
    return struct.pack("<QIIII", ptr, len(ids), all_, timeout, 0xFF)


def test_signal_events_set_wait_reset_destroy():
    """kfd_event_create: signal ids are slots 0, 1, ... with the events mmap cookie; other
    types ids from 4096. SET then a polling WAIT completes and consumes an auto-reset event
    (the next poll is TIMEOUT, 0 returned); a manual-reset one stays signaled until RESET;
    wait_for_all needs every one; unknown ids and CPU-setting a non-signal event EINVAL."""
    node, p, mem = event_node()
    _, e0 = create(node, p)
    _, e1 = create(node, p, auto_reset=0)
    rc, other = create(node, p, event_type=3)
    assert (e0.event_id, e0.event_slot_index, e0.event_trigger_data) == (0, 0, 0)
    assert e1.event_id == 1 and e0.event_page_offset == chardev.KFD_MMAP_TYPE_EVENTS
    assert rc == 0 and other.event_id == chardev.KFD_FIRST_NONSIGNAL_EVENT_ID
    ev_set = tbl.KFD_SET_EVENT.cmd

    def wait(ids, **kw):
        res = call(node, p, tbl.KFD_WAIT_EVENTS.cmd, wait_args(mem, ids, **kw))
        return res.result, struct.unpack("<QIIII", res.out)[4]

    assert wait([0]) == (0, chardev.KFD_IOC_WAIT_RESULT_TIMEOUT)
    assert call(node, p, ev_set, struct.pack("<II", 0, 0)).result == 0
    assert wait([0, 1]) == (0, chardev.KFD_IOC_WAIT_RESULT_COMPLETE)
    assert wait([0]) == (0, chardev.KFD_IOC_WAIT_RESULT_TIMEOUT)  # auto-reset: consumed
    call(node, p, ev_set, struct.pack("<II", 1, 0))
    assert wait([1]) == wait([1]) == (0, chardev.KFD_IOC_WAIT_RESULT_COMPLETE)
    assert wait([0, 1], all_=1) == (0, chardev.KFD_IOC_WAIT_RESULT_TIMEOUT)
    assert call(node, p, tbl.KFD_RESET_EVENT.cmd, struct.pack("<II", 1, 0)).result == 0
    assert wait([1]) == (0, chardev.KFD_IOC_WAIT_RESULT_TIMEOUT)
    assert call(node, p, ev_set, struct.pack("<II", other.event_id, 0)).result == -errno.EINVAL
    assert call(node, p, ev_set, struct.pack("<II", 77, 0)).result == -errno.EINVAL
    assert wait([77])[0] == -errno.EINVAL
    assert call(node, p, tbl.KFD_WAIT_EVENTS.cmd, struct.pack("<QIIII", 0x999, 1, 0, 0, 0)
                ).result == -errno.EFAULT
    destroy = tbl.KFD_DESTROY_EVENT.cmd
    assert call(node, p, destroy, struct.pack("<II", 0, 0)).result == 0
    assert call(node, p, destroy, struct.pack("<II", 0, 0)).result == -errno.EINVAL
    _, again = create(node, p)
    assert again.event_id == 0  # the lowest free slot


def test_a_blocking_wait_is_woken_by_set_event_and_times_out_otherwise():
    """WAIT_EVENTS with a timeout sleeps until SET_EVENT (COMPLETE) or its deadline
    (TIMEOUT); the clock is trio's (autojump: no real sleeping)."""
    node, p, mem = event_node()
    create(node, p)
    args = wait_args(mem, [0], timeout=5000)

    async def main() -> tuple[int, int]:
        async with trio.open_nursery() as nursery:
            out: list[int] = []

            async def waiter() -> None:
                res = await kit.answer(node.kfd.ioctl(p, tbl.KFD_WAIT_EVENTS.cmd, args, CALLER))
                out.extend([res.result, struct.unpack("<QIIII", res.out)[4]])

            nursery.start_soon(waiter)
            await trio.sleep(1)
            node.kfd.ioctl(p, tbl.KFD_SET_EVENT.cmd, struct.pack("<II", 0, 0), CALLER)
        return out[0], out[1]

    from trio.testing import MockClock

    from ualinkd.daemon import TrioSyncWaits
    node.kfd.waits = TrioSyncWaits(lambda: int(trio.current_time() * 1e9))
    assert trio.run(main, clock=MockClock(autojump_threshold=0)) == (
        0, chardev.KFD_IOC_WAIT_RESULT_COMPLETE)

    async def alone() -> int:
        res = await kit.answer(node.kfd.ioctl(p, tbl.KFD_WAIT_EVENTS.cmd, args, CALLER))
        return struct.unpack("<QIIII", res.out)[4]

    assert trio.run(alone, clock=MockClock(autojump_threshold=0)) == (
        chardev.KFD_IOC_WAIT_RESULT_TIMEOUT)


def test_events_page_is_set_once_from_an_allocation():
    """CREATE_EVENT's event_page_offset: an allocation handle of the process (EINVAL
    otherwise), accepted once (a second page EINVAL)."""
    node, p, ids, _, _ = memory_node(1)
    _, out = alloc(node, p, ids[0], chardev.ALLOC_MEM_FLAGS_GTT, size=4096 * 2)
    assert create(node, p, page=ids[0] << 32 | 9)[0] == -errno.EINVAL
    rc, ev = create(node, p, page=out.handle)
    assert rc == 0 and p.event_page == out.handle
    assert create(node, p, page=out.handle)[0] == -errno.EINVAL


def test_scratch_backing_and_trap_handler_need_a_bound_gpu():
    """SET_SCRATCH_BACKING_VA: unknown gpu_id EINVAL, no VM ENODEV; SET_TRAP_HANDLER:
    unknown gpu_id EINVAL, not bindable ESRCH; both kept once the VM is acquired (ROCr's
    GpuAgent asserts both succeed)."""
    node, p, (g0, _), _, _ = memory_node()
    q = node.kfd.open(Caller(pid=77, uid=0))
    scratch, trap = tbl.KFD_SET_SCRATCH_BACKING_VA.cmd, tbl.KFD_SET_TRAP_HANDLER.cmd
    assert call(node, p, scratch, struct.pack("<QII", 1 << 40, 5, 0)).result == -errno.EINVAL
    assert call(node, q, scratch, struct.pack("<QII", 1 << 40, g0, 0)).result == -errno.ENODEV
    assert call(node, p, scratch, struct.pack("<QII", 1 << 40, g0, 0)).result == 0
    assert p.pdds[g0].scratch_backing_va == 1 << 40
    assert call(node, p, trap, struct.pack("<QQII", 1, 2, 5, 0)).result == -errno.EINVAL
    assert call(node, q, trap, struct.pack("<QQII", 1, 2, g0, 0)).result == -errno.ESRCH
    assert call(node, p, trap, struct.pack("<QQII", 0x1000, 0x2000, g0, 0)).result == 0
    assert p.pdds[g0].trap_handler == (0x1000, 0x2000)


def test_gpu_nodes_list_their_caches_as_hsacu_data_caches():
    """ROCr's GpuAgent keeps only HSACU, non-instruction caches and asserts one is left:
    every GPU node lists caches_count entries of type DATA|HSACU (9)."""
    node = make_node(1)
    tree = node.sys_tree()
    base = f"{sysfs.KFD_TOPOLOGY[len('sys/'):]}/nodes/1"
    props = dict(line.split() for line in
                 sysfs.resolve(tree, f"{base}/properties").read().splitlines())
    caches = sysfs.resolve(tree, f"{base}/caches")
    assert len(caches) == int(props["caches_count"]) > 0
    for c in caches.values():
        kv = dict(line.split() for line in c["properties"].read().splitlines())
        assert kv["type"] == "9" and int(kv["size"]) > 0


def test_xnack_mode_query_and_set():
    """kfd_ioctl_set_xnack_mode: -1 queries (off at first), 1 switches it on, then -1 says
    so."""
    node = make_node(1)
    p = node.kfd.open(CALLER)
    cmd = tbl.KFD_SET_XNACK_MODE.cmd
    assert call(node, p, cmd, struct.pack("<i", -1)).out == struct.pack("<i", 0)
    assert call(node, p, cmd, struct.pack("<i", 1)).result == 0
    assert call(node, p, cmd, struct.pack("<i", -1)).out == struct.pack("<i", 1)


def test_kfd_allocations_debugfs_table():
    """Issue 14 item 6: each GPU's debugfs lists the KFD allocations on it (pid, handle,
    va, size, the gpu_ids it is mapped on), in the format ualinkctl parses."""
    node, p, (g0, g1), _, mem = memory_node()
    _, out = alloc(node, p, g0, chardev.ALLOC_MEM_FLAGS_VRAM, va=1 << 32)
    mem.arrays[0x100] = struct.pack("<II", g0, g1)
    call(node, p, tbl.KFD_MAP_MEMORY_TO_GPU.cmd, struct.pack("<QQII", out.handle, 0x100, 2, 0))
    tree = node.sys_tree()
    fmt = sysfs.DEBUGFS["kfd_allocations"]
    rows = fmt.parse(sysfs.resolve(tree, "kernel/debug/dri/128/kfd_allocations").read())
    assert rows == [{"pid": CALLER.pid, "handle": out.handle, "va": 1 << 32, "size": 1 << 20,
                     "mapped": sorted([g0, g1])}]
    assert sysfs.resolve(tree, "kernel/debug/dri/129/kfd_allocations").read() == ""


def test_dmabuf_info_and_import():
    """kfd_ioctl_get_dmabuf_info: size, the exporting GPU's gpu_id, VRAM, the metadata
    (EINVAL when it does not fit); an fd that is no dma-buf is the resolver's EBADF.
    kfd_ioctl_import_dmabuf: the BO becomes an allocation of the importing GPU (a new
    handle gpu_id << 32 | idr), mappable there; an unknown gpu_id EINVAL."""
    node, p, (g0, g1), (f0, f1), mem = memory_node()
    dev0 = node.devices[128]
    bo = dev0.driver.bo_create(1 << 20, 4096, 4, 0)
    bo.set_metadata(b"meta!", 0)
    gem = f0.handle_create(bo)
    bo.put()
    buf = dev0.prime_handle_to_dmabuf(f0, gem)
    node.kfd.resolve_dmabuf = lambda pid, fd: buf if fd == 9 else (_ for _ in ()).throw(
        DrmError(errno.EBADF))
    info = tbl.KFD_GET_DMABUF_INFO.cmd
    res = call(node, p, info, struct.pack("<QQIIII", 0, 0, 0, 0, 0, 9))
    size, _, msize, gpu, flags, _ = struct.unpack("<QQIIII", res.out)
    assert (res.result, size, msize, gpu) == (0, 1 << 20, 5, g0)
    assert flags & chardev.ALLOC_MEM_FLAGS_VRAM
    assert call(node, p, info, struct.pack("<QQIIII", 0, 0x700, 2, 0, 0, 9)
                ).result == -errno.EINVAL
    assert call(node, p, info, struct.pack("<QQIIII", 0, 0x700, 64, 0, 0, 9)).result == 0
    assert mem.writes[0x700] == b"meta!"
    assert call(node, p, info, struct.pack("<QQIIII", 0, 0, 0, 0, 0, 3)).result == -errno.EBADF
    imp = tbl.KFD_IMPORT_DMABUF.cmd
    assert call(node, p, imp, struct.pack("<QQII", 1 << 34, 0, 0xBEEF, 9)).result == -errno.EINVAL
    res = call(node, p, imp, struct.pack("<QQII", 1 << 34, 0, g0, 9))
    handle = struct.unpack("<QQII", res.out)[1]
    assert res.result == 0 and handle == g0 << 32 | 0
    assert p.pdds[g0].mems[0].bo is bo
    mem.arrays[0x100] = struct.pack("<I", g0)
    res = call(node, p, tbl.KFD_MAP_MEMORY_TO_GPU.cmd, struct.pack("<QQII", handle, 0x100, 1, 0))
    assert res.result == 0 and f0.device.driver.vm(f0).lookup(1 << 34).bo_va.bo is bo


def test_an_mi210_node_is_gfx90a_in_the_topology():
    """The MI200-class profile: gfx_target_version 90010 (gfx90a, which ROCr 5.2.3 knows),
    PCI 1002:740f, 104 CUs x 4 SIMDs, one XCC, in the KFD topology and the PCI identity."""
    import dataclasses

    from ualinkd.config import AccelConfig
    base = PodConfig.local(1, 1)
    node_cfg = dataclasses.replace(base.nodes[0], accels=(AccelConfig(0, profile="mi210"),))
    config = dataclasses.replace(base, nodes=(node_cfg,))
    node = NodeCore(config, config.nodes[0].name, NodeServices(clock=lambda: (0, 0), host_cpus=2,
                    host_memory=1 << 34))
    props = dict(line.split() for line in sysfs.resolve(
        node.sys_tree(), "devices/virtual/kfd/kfd/topology/nodes/1/properties")
        .read().splitlines())
    assert (props["gfx_target_version"], props["device_id"], props["simd_count"],
            props["num_xcc"]) == ("90010", str(0x740F), "416", "1")


def test_kfd_mmap_targets():
    """kfd_mmap's choice of memory: no KFD process for the caller EINVAL; a DOORBELL /
    MMIO_REMAP allocation is the very BO the kfd fd's mmap of its cookie maps (one memory,
    GPU and CPU); RESERVED_MEM EINVAL, a device type of an unknown gpu_id ENODEV; the events
    page given to CREATE_EVENT starts all UNSIGNALED_EVENT_SLOT."""
    node, p, (g0, _), _, _ = memory_node()
    me = Caller(pid=p.pid, uid=0)
    with pytest.raises(DrmError) as e:
        node.kfd.mmap_target(Caller(pid=31337, uid=0), chardev.KFD_MMAP_TYPE_EVENTS, 4096)
    assert e.value.errno == errno.EINVAL
    rc, db = alloc(node, p, g0, chardev.ALLOC_MEM_FLAGS_DOORBELL, size=8192, va=3 << 32)
    assert rc == 0
    bo, off = node.kfd.mmap_target(me, db.mmap_offset, 8192)
    assert bo is p.pdds[g0].mems[db.handle & 0xFFFFFFFF].bo and off == 0
    rc, mmio = alloc(node, p, g0, chardev.ALLOC_MEM_FLAGS_MMIO_REMAP, size=4096, va=4 << 32)
    assert node.kfd.mmap_target(me, mmio.mmap_offset, 4096)[0] is \
        p.pdds[g0].mems[mmio.handle & 0xFFFFFFFF].bo
    for cookie, want in ((chardev.KFD_MMAP_TYPE_RESERVED_MEM | g0 << 46, errno.EINVAL),
                         (chardev.KFD_MMAP_TYPE_MMIO | 0x1 << 46, errno.ENODEV),
                         (chardev.KFD_MMAP_TYPE_EVENTS, errno.EINVAL)):  # no page yet
        with pytest.raises(DrmError) as e:
            node.kfd.mmap_target(me, cookie, 4096)
        assert e.value.errno == want, hex(cookie)
    rc, page = alloc(node, p, g0, chardev.ALLOC_MEM_FLAGS_GTT, size=32768, va=5 << 32)
    res = call(node, p, tbl.KFD_CREATE_EVENT.cmd,
               struct.pack("<QIIIIII", page.handle, 0, 0, 1, 0, 0, 0))
    assert res.result == 0
    bo, _ = node.kfd.mmap_target(me, chardev.KFD_MMAP_TYPE_EVENTS, 32768)
    assert bo.memory.read(0, 32768) == b"\xff" * 32768
    node.release_kfd(p)
    assert node.devices[128].objects == {}  # doorbell and MMIO pages go with the process
