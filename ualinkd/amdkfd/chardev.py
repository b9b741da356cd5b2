"""kfd_chardev.c, sans-IO: one `Kfd` per node, a `KfdProcess` per process that opened it, the
'K' ioctls' dispatch (kfd_ioctl) and the handlers this emulator answers.

A KFD node is one of the node's accels: its `DrmDevice` and amdgpu driver, so memory the KFD
hands out later is a GEM BO of the same tables the render nodes serve (issue 14 item 3).
What needs the caller's memory or fds is injected, as for DrmDevice: `copy_to_user`, and
`resolve_drm_file` (a process's fd -> the DrmFile of one of this node's render nodes).
Time is an argument too (`clock`), so GET_CLOCK_COUNTERS is tested without sleeping.

A `KfdProcess` is bound to a process, not a pid (`identify`, drm/process.py): the edge
names the caller's process, and reports its exit (`process_exited`); `release_process` is
the one end of a context, from its process's exit or its last file's release.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import logging
from array import array
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from ..abi import constants as c
from ..abi import ioctls as tbl
from ..abi import structs as st
from ..abi.constants import PAGE_SIZE
from ..abi.ioc import IOC_READ, IOC_WRITE, ioc_dir, ioc_nr, ioc_size
from ..amdgpu.bo import AmdgpuBo
from ..amdgpu.driver import AmdgpuDriver, user_pages_present
from ..amdgpu.engine import gpu_clock_counter
from ..amdgpu.vm import MAX_PFN, GpuVm
from ..drm.completion import Completion, Spawn, run_now
from ..drm.device import (
    Caller,
    CopyFromUser,
    CopyToUser,
    IoctlResult,
    finish,
    read_user,
    write_user,
)
from ..drm.errors import DrmError
from ..drm.file import DrmFile
from ..drm.gem import DmaBuf
from ..drm.process import Identify, ProcessId, same_thread_group
from ..drm.syncobj import SyncWaits
from .queues import QueueArgs, QueueRegistry

log = logging.getLogger(__name__)

# kfd_ioctl.h's KFD_IOCTL_MAJOR/MINOR_VERSION of the kernels the spec is from (1.17: dma-buf
# export is 1.12, libhsakmt checks minor >= 12 before hsaKmtExportDMABufHandle; §3.3 step 1).
KFD_IOCTL_MAJOR_VERSION = 1
KFD_IOCTL_MINOR_VERSION = 17
KFD_IOC_CACHE_POLICY_COHERENT = 0
KFD_IOC_CACHE_POLICY_NONCOHERENT = 1
NSEC_PER_SEC = 1_000_000_000
DOORBELL_ARMED = (1 << 64) - 1  # a doorbell slot no store has written since it was armed

# kfd_flat_memory.c, gfx9 apertures (kfd_init_apertures_v9): LDS and scratch in their own
# 4 GiB windows at 1 << 48 and 2 << 48; GPUVM from 16 MiB (the reserved bottom libhsakmt
# leaves alone) to the top of the 47-bit user half of the 48-bit VM (spec §7 item 4).
LDS_APP_BASE = 1 << 48
SCRATCH_APP_BASE = 2 << 48
GPUVM_BASE = 0x1000000
GPUVM_LIMIT = (MAX_PFN << 12) // 2 - 1


# kfd_ioctl.h allocation flags
ALLOC_MEM_FLAGS_VRAM = 1 << 0
ALLOC_MEM_FLAGS_GTT = 1 << 1
ALLOC_MEM_FLAGS_USERPTR = c.KFD_IOC_ALLOC_MEM_FLAGS_USERPTR
ALLOC_MEM_FLAGS_DOORBELL = 1 << 3
ALLOC_MEM_FLAGS_MMIO_REMAP = 1 << 4
ALLOC_MEM_FLAGS_WRITABLE = 1 << 31
ALLOC_MEM_FLAGS_EXECUTABLE = 1 << 30
ALLOC_MEM_FLAGS_PUBLIC = 1 << 29
# kfd_doorbell_process_slice on gfx9: 1024 queues x 8-byte doorbells
DOORBELL_PROCESS_SLICE = 1024 * 8
# kfd_priv.h's mmap cookies on the kfd fd: the type in bits 62-63, the gpu_id from bit 46
KFD_MMAP_TYPE_DOORBELL = 0x3 << 62
KFD_MMAP_TYPE_MMIO = 0x0 << 62
KFD_MMAP_GPU_ID_SHIFT = 46


# The answers' out fields, put in kdata by name (the layouts' offsets); GET_VERSION's answer
# is always the same bytes.
_VERSION = st.KFD_GET_VERSION.encode(st.KfdGetVersion(KFD_IOCTL_MAJOR_VERSION,
                                                      KFD_IOCTL_MINOR_VERSION))
_NUM_OF_NODES = st.KFD_GET_PROCESS_APERTURES_NEW.field("num_of_nodes")
_N_SUCCESS = st.KFD_MAP_MEMORY_TO_GPU.field("n_success")
_WAIT_RESULT = st.KFD_WAIT_EVENTS.field("wait_result")
_XNACK_ENABLED = st.KFD_SET_XNACK_MODE.field("xnack_enabled")


@functools.lru_cache(maxsize=4096)  # numbers are the caller's to choose: stay bounded
def _route(cmd: int) -> tuple[int, tbl.IoctlSpec | None, int, int, int]:
    """kfd_ioctl's decisions for one whole number, made once: its nr and entry (None:
    ENOTTY), and the copies the entry's own cmd decides with the user's size — in, out,
    and the kernel buffer, zero-extended to the table's size."""
    nr = ioc_nr(cmd)
    spec = tbl.kfd_lookup(nr)
    if spec is None:
        return nr, None, 0, 0, 0
    usize = ioc_size(cmd)
    both = ioc_dir(cmd) & ioc_dir(spec.cmd)
    return (nr, spec, usize if both & IOC_WRITE else 0, usize if both & IOC_READ else 0,
            max(usize, ioc_size(spec.cmd)))


def kfd_mmap_gpu_id(gpu_id: int) -> int:
    return (gpu_id & 0xFFFF) << KFD_MMAP_GPU_ID_SHIFT


def make_handle(gpu_id: int, idr: int) -> int:
    """MAKE_HANDLE: the gpu_id in the high 32 bits, the pdd's idr in the low ones."""
    return gpu_id << 32 | idr


def _app_limit(base: int) -> int:
    """MAKE_LDS_APP_LIMIT / MAKE_SCRATCH_APP_LIMIT: the rest of the base's 4 GiB window."""
    return (base & 0xFFFF_FFFF_0000_0000) | 0xFFFF_FFFF


@dataclass(eq=False, slots=True)
class KfdNode:
    """One GPU node of the topology: a local accel with its gpu_id (kfd_topology.c)."""

    gpu_id: int
    driver: AmdgpuDriver

    @property
    def render_minor(self) -> int:
        return self.driver.device.minor


@dataclass(eq=False, slots=True)
class KfdMem:
    """kgd_mem: one allocation. Its BO holds a GEM handle in the acquired render file (the
    kernel allows that file the BO's mmap node instead; either way mmap(render fd,
    mmap_offset) reaches it), and is mapped at `va` in the VM of each GPU in `mapped`."""

    bo: AmdgpuBo
    gem_handle: int
    va: int
    size: int
    flags: int
    attached: dict[int, GpuVm] = field(default_factory=dict)  # gpu_id -> a peer's VM
    mapped: set[int] = field(default_factory=set)


@dataclass(eq=False, slots=True)
class KfdProcessDevice:
    """kfd_process_device: a process's state on one GPU; `drm_file` is the render file whose
    VM ACQUIRE_VM bound (None until then)."""

    node: KfdNode
    drm_file: DrmFile | None = None
    default_policy: int = KFD_IOC_CACHE_POLICY_COHERENT
    alternate_policy: int = KFD_IOC_CACHE_POLICY_COHERENT
    mems: dict[int, KfdMem] = field(default_factory=dict)  # alloc_idr
    scratch_backing_va: int = 0  # qpd.sh_hidden_private_base
    trap_handler: tuple[int, int] = (0, 0)  # (tba, tma)
    next_idr: int = 0
    # qpd.proc_doorbells: the process's doorbell slice on this GPU, what DOORBELL
    # allocations map on the GPU and mmap(kfd fd, KFD_MMAP_TYPE_DOORBELL) on the CPU (GTT
    # memory stands for the doorbell BAR); made on first use, dropped with the process.
    doorbell_bo: AmdgpuBo | None = None

    # The GPU's MMIO remap page (rmmio_remap: the HDP flush registers), what MMIO_REMAP
    # allocations map on the GPU and mmap(kfd fd, KFD_MMAP_TYPE_MMIO) on the CPU. The
    # kernel's is one page of the device; here one page of GTT memory per process and GPU
    # (nothing reads those registers, and so it goes with the process).
    mmio_bo: AmdgpuBo | None = None

    def doorbells(self) -> AmdgpuBo:
        if self.doorbell_bo is None:
            self.doorbell_bo = self.node.driver.bo_create(
                DOORBELL_PROCESS_SLICE, PAGE_SIZE, c.DOMAIN_GTT, 0)
        return self.doorbell_bo

    def mmio_page(self) -> AmdgpuBo:
        if self.mmio_bo is None:
            self.mmio_bo = self.node.driver.bo_create(PAGE_SIZE, PAGE_SIZE, c.DOMAIN_GTT, 0)
        return self.mmio_bo

    def vm(self) -> GpuVm:
        """The acquired VM (kfd_bind_process_to_device: ENODEV before ACQUIRE_VM)."""
        if self.drm_file is None:
            raise DrmError(errno.ENODEV, "no VM acquired for this GPU")
        return self.node.driver.vm(self.drm_file)


@dataclass(eq=False, slots=True)
class KfdProcess:
    """kfd_process: one per process, however often it opens /dev/kfd (kfd_create_process
    finds the existing one); a pdd per GPU from the start (kfd_process_create_pdd for every
    node), so GET_PROCESS_APERTURES_NEW counts them all. Bound to the process itself (`id`,
    the kernel's mm and lead_thread), not its pid: it ends with the last close of its files
    or when that process exits, whichever comes first (`ended`), and is never handed to a
    later process given the same pid."""

    id: ProcessId
    pdds: dict[int, KfdProcessDevice] = field(default_factory=dict)
    opens: int = 0
    ended: bool = False
    # The edge's exit notice for `id` (NodeCore sets it up at the first open); cancelled
    # when the context ends first.
    exit: Completion[None] | None = None
    events: dict[int, KfdEvent] = field(default_factory=dict)  # event_idr
    event_page: int | None = None  # the handle of the GTT BO libhsakmt gave as events page
    xnack_enabled: bool = False  # kfd_process_xnack_mode(p, false): retry faults off
    # runtime_info (RUNTIME_ENABLE): DEBUG_RUNTIME_STATE_ENABLED or not, r_debug, ttmp_setup
    runtime_enabled: bool = False
    r_debug: int = 0
    ttmp_setup: bool = False

    @property
    def pid(self) -> int:
        return self.id.pid

    def pdd_by_id(self, gpu_id: int) -> KfdProcessDevice:
        """kfd_process_device_data_by_id; an unknown gpu_id is EINVAL in every caller."""
        pdd = self.pdds.get(gpu_id)
        if pdd is None:
            raise DrmError(errno.EINVAL, f"no GPU with gpu_id {gpu_id:#x}")
        return pdd


# kfd_events.c / kfd_ioctl.h
KFD_IOC_EVENT_SIGNAL = 0
KFD_IOC_EVENT_DEBUG_EVENT = 5
KFD_IOC_EVENT_MEMORY = 8
KFD_SIGNAL_EVENT_LIMIT = 4096
KFD_FIRST_NONSIGNAL_EVENT_ID = KFD_SIGNAL_EVENT_LIMIT
KFD_MMAP_TYPE_EVENTS = 0x2 << 62
KFD_EVENT_TIMEOUT_INFINITE = 0xFFFFFFFF
KFD_IOC_WAIT_RESULT_COMPLETE = 0
KFD_IOC_WAIT_RESULT_TIMEOUT = 1
KFD_IOC_WAIT_RESULT_FAIL = 2
UNSIGNALED_EVENT_SLOT = 0xFFFF_FFFF_FFFF_FFFF
# kmalloc_array (kmalloc_large: at most MAX_PAGE_ORDER = 10 pages of order) fails past
# KMALLOC_MAX_SIZE with ENOMEM: the kernel's bound on every caller-sized KFD array.
KMALLOC_MAX_SIZE = 4 << 20
# alloc_event_waiters: sizeof(struct kfd_event_waiter) on x86-64 = a wait_queue_entry (40)
# + the event pointer (8) + activated, event_age_enabled (bools), padded to 8 = 56 bytes:
# WAIT_EVENTS of more than 74,898 events is ENOMEM.
KFD_EVENT_WAITER_SIZE = 56
MAX_WAIT_EVENTS = KMALLOC_MAX_SIZE // KFD_EVENT_WAITER_SIZE
# kfd_ioctl_(un)map_memory_to/from_gpu: kmalloc_array(n_devices, sizeof(uint32_t))
MAX_DEVICE_IDS = KMALLOC_MAX_SIZE // 4
KFD_MMAP_TYPE_RESERVED_MEM = 0x1 << 62
KFD_MMAP_TYPE_MASK = 0x3 << 62

# kfd_ioctl.h / kfd_priv.h: queues
KFD_MAX_QUEUE_PERCENTAGE = 100
KFD_MAX_QUEUE_PRIORITY = 15
# COMPUTE, SDMA, COMPUTE_AQL, SDMA_XGMI, SDMA_BY_ENG_ID (1.17)
KFD_IOC_QUEUE_TYPES = frozenset({0, 1, 2, 3, 4})
KFD_IOC_QUEUE_TYPE_SDMA_BY_ENG_ID = 4
KFD_MAX_NUM_CUS = 1024
# amdgpu_gfx_config's tile_mode_array[32] and macrotile_mode_array[16] (zero on gfx9)
GFX9_NUM_TILE_CONFIGS = 32
GFX9_NUM_MACRO_TILE_CONFIGS = 16
KFD_RUNTIME_ENABLE_MODE_ENABLE_MASK = 1
KFD_RUNTIME_ENABLE_MODE_TTMP_SAVE_MASK = 2  # kfd_ioctl_set_cu_mask's max_num_cus
ENOTSUPP = 524  # include/linux/errno.h: kernel-internal, returned as is by the KFD
# x86-64's TASK_SIZE_MAX with 4-level paging: access_ok's bound for user addresses
TASK_SIZE_MAX = (1 << 47) - PAGE_SIZE


def access_ok(address: int, size: int) -> bool:
    """access_ok: the range lies below TASK_SIZE_MAX (it says nothing about mappings)."""
    return address + size <= TASK_SIZE_MAX


@dataclass(eq=False, slots=True)
class KfdEvent:
    """kfd_event: signaled by SET_EVENT (no GPU raises one here), seen by WAIT_EVENTS; an
    auto-reset event is consumed by the wait that sees it."""

    event_id: int
    type: int
    auto_reset: bool
    signaled: bool = False
    # ev->wq: the waiters queued on it (a dict: a wait leaves in O(1), whatever its size)
    waiters: dict[KfdEventWaiter, None] = field(default_factory=dict)
    # a memory event's kfd_hsa_memory_exception_data from the last VM fault (queues.vm_fault)
    memory_exception_data: bytes = b""


@dataclass(eq=False, slots=True)
class KfdWait:
    """One WAIT_EVENTS call: its entries (one kfd_event_waiter each in the kernel), how
    many are activated, and whether an event was destroyed under a queued one. Kept as
    counts, so test_event_condition costs the same for one entry or 75,000."""

    entries: int = 0
    activated: int = 0
    failed: bool = False

    def condition(self, wait_for_all: bool) -> int:
        """test_event_condition: FAIL when an awaited event was destroyed, COMPLETE when
        all (or any) entries are activated, else TIMEOUT."""
        if self.failed:
            return KFD_IOC_WAIT_RESULT_FAIL
        done = self.activated == self.entries if wait_for_all else self.activated > 0
        return KFD_IOC_WAIT_RESULT_COMPLETE if done else KFD_IOC_WAIT_RESULT_TIMEOUT


@dataclass(eq=False, slots=True)
class KfdEventWaiter:
    """The kfd_event_waiters of every entry of one wait that names one event (they behave
    alike, so one object stands for them all): `first` of them were activated at
    init_event_waiter by the event being signaled and never queued; the other `queued`
    wait in the event's queue, where set_event activates them all; `event` None once the
    event was destroyed under them."""

    wait: KfdWait
    event: KfdEvent | None
    first: int = 0
    queued: int = 0
    queued_activated: int = 0

    def activate(self) -> None:
        self.wait.activated += self.queued - self.queued_activated
        self.queued_activated = self.queued


KfdHandler = Callable[[KfdProcess, bytearray, Caller], "Awaitable[None] | None"]
# (process, fd) -> the DrmFile behind that process's fd; DrmError(EINVAL) when the fd is not
# open, not a render node of this daemon (kfd_ioctl_acquire_vm's fget, amdgpu_file_to_fpriv),
# or the process is gone (its pid is never taken for someone else's).
ResolveDrmFile = Callable[[ProcessId, int], Awaitable[DrmFile]]
Clock = Callable[[], tuple[int, int]]  # -> (CLOCK_MONOTONIC_RAW ns, CLOCK_BOOTTIME ns)
_reported_unemulated: set[int] = set()


class Kfd:
    def __init__(
        self,
        nodes: list[KfdNode],
        clock: Clock,
        copy_to_user: CopyToUser | None = None,
        resolve_drm_file: ResolveDrmFile | None = None,
        copy_from_user: CopyFromUser | None = None,
        waits: SyncWaits | None = None,
        identify: Identify = same_thread_group,
        resolve_dmabuf: Callable[[int, int], DmaBuf] | None = None,
        spawn: Spawn[None] = run_now,
    ) -> None:
        self.nodes = {n.gpu_id: n for n in nodes}
        self.spawn = spawn  # runs a handler's coroutine to a Completion (DrmDevice.spawn)
        assert len(self.nodes) == len(nodes), "gpu_ids must be unique"
        self.clock = clock
        self.copy_to_user = copy_to_user
        self.copy_from_user = copy_from_user
        self.waits = waits  # None: a wait that would block is a bug (the daemon injects one)
        self.resolve_drm_file = resolve_drm_file
        # The live contexts by pid: at most one per pid, that of the process now holding it.
        self.processes: dict[int, KfdProcess] = {}
        self.queues = QueueRegistry({g: n.driver.profile for g, n in self.nodes.items()})
        # amdgpu_vm.process_info: the render files whose VM a KFD process acquired (a
        # compute VM), and by whom.
        self.compute_vms: dict[DrmFile, KfdProcessDevice] = {}
        # (pid, fd) -> the dma-buf behind a caller's fd (dma_buf_get: EBADF / EINVAL)
        self.resolve_dmabuf = resolve_dmabuf
        self.handlers: dict[tbl.IoctlSpec, KfdHandler] = tbl.bind(self)
        # The process of a calling thread (FUSE reports the thread), None when it is gone;
        # the edge injects /proc's and pidfds' answer (drm/process.py). A kfd_process is one
        # per process, not thread, and not per pid.
        self.identify = identify

    # -- open / release (kfd_open, kfd_release, process exit) -------------------------------
    def open(self, caller: Caller) -> KfdProcess:
        """kfd_open -> kfd_create_process(current): the caller's process (its thread
        group, the lead_thread later ioctls are checked against), found by the process
        itself (the kernel looks it up by mm). A context still filed under the caller's pid
        belongs to an earlier process that has exited (its exit notice is on its way): the
        kernel ended that one at its mm's exit, so it ends now and the caller gets its own."""
        who = self.identify(caller.pid)
        if who is None:
            raise DrmError(errno.ESRCH, f"no process for thread {caller.pid}")
        p = self.processes.get(who.pid)
        if p is not None and p.id != who:
            log.info("KFD: pid %d is a new process; the context of the one before ends",
                     who.pid)
            self.release_process(p)
            p = None
        if p is None:
            p = KfdProcess(who, {g: KfdProcessDevice(n) for g, n in self.nodes.items()})
            self.processes[who.pid] = p
        p.opens += 1
        return p

    def release(self, p: KfdProcess) -> None:
        """kfd_release: one file of `p` closed; the last one ends the context (if the
        process's exit did not already)."""
        p.opens -= 1
        assert p.opens >= 0
        if p.opens == 0:
            self.release_process(p)

    def process_exited(self, p: KfdProcess) -> None:
        """The edge's notice that `p`'s process has exited (kfd_process_notifier_release:
        the kernel ends a kfd_process with its mm, whoever still holds its files — a child
        that inherited one, a process it was passed to)."""
        self.release_process(p)

    def release_process(self, p: KfdProcess) -> None:
        """The one end of a KFD context, from the last close or the process's exit,
        whichever comes first (later calls do nothing): everything it owned goes —
        allocations and their GEM handles, VM bindings (a compute VM is a render file's
        again), doorbell and MMIO pages, events (a waiter still on one fails) — and no
        ioctl or mmap reaches it again. The kernel takes a kfd_process out of its table and
        stops its queues at the mm's exit (kfd_process_notifier_release) and frees the rest
        at its last reference (kfd_process_wq_release, after the last file's release);
        nothing can reach it in between, so here it all goes at the first of the two."""
        if p.ended:
            return
        p.ended = True
        self.queues.process_gone(p.pid)  # pqm_uninit: its queues stop first
        if self.processes.get(p.pid) is p:
            del self.processes[p.pid]
        for pdd in p.pdds.values():
            for idr in list(pdd.mems):
                self._free(p, pdd, idr, force=True)
        for pdd in p.pdds.values():
            if pdd.drm_file is not None and self.compute_vms.get(pdd.drm_file) is pdd:
                del self.compute_vms[pdd.drm_file]
            pdd.drm_file = None
            for bar in (pdd.doorbell_bo, pdd.mmio_bo):
                if bar is not None:
                    bar.put()
            pdd.doorbell_bo = pdd.mmio_bo = None
        for ev in list(p.events.values()):
            self._destroy_event(p, ev)
        if p.exit is not None:
            p.exit.cancel()  # the context ended first: stop watching the process

    # -- dispatch (kfd_ioctl) -----------------------------------------------------------------
    def ioctl(self, p: KfdProcess, cmd: int, in_bytes: bytes,
              caller: Caller) -> IoctlResult | Completion[IoctlResult]:
        """kfd_ioctl: the entry by nr alone (outside the command range: ENOTTY, nothing
        copied) (1); only the process that opened the file may use it — a child that
        inherited the fd, or one it was passed to, gets EBADF, nothing copied (the
        lead_thread check, a task, not a pid: another process given the pid of one that
        exited is another process, and an ended context answers nobody; children make their
        own KFD context) (1b); the table's own
        cmd decides the copies, with the user's size, the buffer zero-extended to the
        table's size (2); the handler (3); the user's size copied back whenever the
        table's cmd has the OUT bit, success or not (4)."""
        nr, spec, in_size, out_size, ksize = _route(cmd)  # 1, 2
        if spec is None:
            return IoctlResult(-errno.ENOTTY, b"", None, b"")
        if p.ended or self.identify(caller.pid) != p.id:  # 1b
            return IoctlResult(-errno.EBADF, b"", spec, b"")
        handler = self.handlers.get(spec)
        if handler is None:
            if nr not in _reported_unemulated:
                _reported_unemulated.add(nr)
                log.info("KFD ioctl %s (nr 0x%02x) is not emulated: ENOTTY", spec.name, nr)
            return IoctlResult(-errno.ENOTTY, b"", spec, b"")
        kdata = bytearray(ksize)
        chunk = in_bytes[:in_size]  # a short copy-in leaves zeros, never a shorter buffer
        kdata[: len(chunk)] = chunk
        try:
            pending = handler(p, kdata, caller)  # 3
        except DrmError as e:
            return IoctlResult(-e.errno, bytes(kdata[:out_size]), spec, bytes(kdata))  # 4
        if pending is not None:  # a coroutine: adapted here, once
            return self.spawn(pending).then(functools.partial(finish, spec, kdata, out_size))
        return IoctlResult(0, bytes(kdata[:out_size]), spec, bytes(kdata))

    async def _read_user(self, caller: Caller, address: int, size: int) -> bytes:
        return await read_user(self.copy_from_user, caller, address, size)

    async def _write_user(self, caller: Caller, address: int, data: bytes) -> None:
        await write_user(self.copy_to_user, caller, address, data)

    # -- handlers ------------------------------------------------------------------------------
    @tbl.handles(tbl.KFD_GET_VERSION)
    def get_version(self, p: KfdProcess, kdata: bytearray, caller: Caller) -> None:
        kdata[: len(_VERSION)] = _VERSION

    @tbl.handles(tbl.KFD_SET_MEMORY_POLICY)
    def set_memory_policy(self, p: KfdProcess, kdata: bytearray, caller: Caller) -> None:
        """kfd_ioctl_set_memory_policy: both policies COHERENT or NONCOHERENT (1), a gpu_id
        of the process (2); gfx9's set_cache_memory_policy ignores the alternate aperture
        and always succeeds (3)."""
        a = st.KFD_SET_MEMORY_POLICY.decode(bytes(kdata[: st.KFD_SET_MEMORY_POLICY.size]))
        policies = (KFD_IOC_CACHE_POLICY_COHERENT, KFD_IOC_CACHE_POLICY_NONCOHERENT)
        if a.default_policy not in policies or a.alternate_policy not in policies:  # 1
            raise DrmError(errno.EINVAL, "unknown cache policy")
        pdd = p.pdd_by_id(a.gpu_id)  # 2
        pdd.default_policy, pdd.alternate_policy = a.default_policy, a.alternate_policy  # 3

    @tbl.handles(tbl.KFD_GET_CLOCK_COUNTERS)
    def get_clock_counters(self, p: KfdProcess, kdata: bytearray, caller: Caller) -> None:
        """kfd_ioctl_get_clock_counters: the GPU counter only for a gpu_id of the process
        (else 0, no error) (1); CPU = CLOCK_MONOTONIC_RAW, system = CLOCK_BOOTTIME, both
        in ns at 1 GHz (2). The emulated GPU counter runs at the profile's
        gpu_counter_freq off the raw clock."""
        a = st.KFD_GET_CLOCK_COUNTERS.decode(bytes(kdata[: st.KFD_GET_CLOCK_COUNTERS.size]))
        raw, boot = self.clock()
        gpu = 0
        pdd = p.pdds.get(a.gpu_id)  # 1
        if pdd is not None:
            gpu = gpu_clock_counter(raw, pdd.node.driver.profile.gpu_counter_freq_khz)
        kdata[: st.KFD_GET_CLOCK_COUNTERS.size] = st.KFD_GET_CLOCK_COUNTERS.encode(
            st.KfdGetClockCounters(
            gpu, raw, boot, NSEC_PER_SEC, a.gpu_id, a.pad))  # 2

    @staticmethod
    def apertures(pdd: KfdProcessDevice) -> st.KfdProcessDeviceApertures:
        return st.KfdProcessDeviceApertures(
            LDS_APP_BASE, _app_limit(LDS_APP_BASE), SCRATCH_APP_BASE,
            _app_limit(SCRATCH_APP_BASE), GPUVM_BASE, GPUVM_LIMIT, pdd.node.gpu_id, 0)

    @tbl.handles(tbl.KFD_GET_PROCESS_APERTURES_NEW)
    def get_process_apertures_new(self, p: KfdProcess, kdata: bytearray,
                                  caller: Caller) -> Awaitable[None] | None:
        """kfd_ioctl_get_process_apertures_new: num_of_nodes 0 asks how many (the process's
        pdd count, nothing written) (1); else min(asked, pdds) entries (2), written to the
        user array in one copy_to_user (EFAULT) (3), and that count returned (4)."""
        layout = st.KFD_GET_PROCESS_APERTURES_NEW
        a = layout.decode(bytes(kdata[: layout.size]))
        if a.num_of_nodes == 0:  # 1
            _NUM_OF_NODES.put(kdata, len(p.pdds))
            return None
        n = min(a.num_of_nodes, len(p.pdds))  # 2
        array = b"".join(st.KFD_PROCESS_DEVICE_APERTURES.encode(self.apertures(pdd))
                         for pdd in list(p.pdds.values())[:n])

        async def copy_out() -> None:
            await self._write_user(caller, a.kfd_process_device_apertures_ptr, array)  # 3
            _NUM_OF_NODES.put(kdata, n)  # 4

        return copy_out()

    @tbl.handles(tbl.KFD_ACQUIRE_VM)
    def acquire_vm(self, p: KfdProcess, kdata: bytearray, caller: Caller) -> Awaitable[None]:
        """kfd_ioctl_acquire_vm: the fd must be an open file of the process (fget: EINVAL)
        (1), the gpu_id the process's (EINVAL) (2); a pdd already bound answers 0 for the
        same file and EBUSY for another (3); the file must be an amdgpu DRM file
        (amdgpu_file_to_fpriv: EINVAL) — here a render node of this daemon, and of the
        gpu_id's accel, since its VM is the one bound (4); a VM another KFD process already
        made its compute VM is EINVAL (amdgpu_amdkfd_gpuvm_acquire_process_vm: "Already a
        compute VM?") (5). The fd is looked up in the process `p` is bound to, never in
        whichever process has its pid now."""
        a = st.KFD_ACQUIRE_VM.decode(bytes(kdata[: st.KFD_ACQUIRE_VM.size]))

        async def acquire() -> None:
            if self.resolve_drm_file is None:
                raise DrmError(errno.EINVAL, "no way to resolve the caller's fd")
            drm_file = await self.resolve_drm_file(p.id, a.drm_fd)  # 1, 4
            if p.ended:  # (its process exited meanwhile: nothing to bind)
                raise DrmError(errno.EBADF, "the KFD process has ended")
            pdd = p.pdd_by_id(a.gpu_id)  # 2
            if pdd.drm_file is not None:  # 3
                if pdd.drm_file is not drm_file:
                    raise DrmError(errno.EBUSY, "this GPU's VM is already acquired")
                return
            if drm_file.device is not pdd.node.driver.device:  # 4
                raise DrmError(errno.EINVAL, "the fd is another GPU's render node")
            if drm_file in self.compute_vms:  # 5
                raise DrmError(errno.EINVAL, "the render file's VM is already a compute VM")
            pdd.drm_file = drm_file
            self.compute_vms[drm_file] = pdd

        return acquire()

    @tbl.handles(tbl.KFD_AVAILABLE_MEMORY)
    def available_memory(self, p: KfdProcess, kdata: bytearray, caller: Caller) -> None:
        """kfd_ioctl_get_available_memory: the gpu_id the process's (EINVAL) (1); the VRAM
        not yet used on that GPU (amdgpu_amdkfd_get_available_memory, no reserve kept
        back here) (2)."""
        layout = st.KFD_GET_AVAILABLE_MEMORY
        a = layout.decode(bytes(kdata[: layout.size]))
        vram = p.pdd_by_id(a.gpu_id).node.driver.vram  # 1
        kdata[: layout.size] = layout.encode(st.KfdGetAvailableMemory(
            max(vram.size - vram.used, 0), a.gpu_id, a.pad))  # 2

    # -- memory (kfd_ioctl_alloc/free_memory_of_gpu, map/unmap_memory_to/from_gpu) ----------
    @tbl.handles(tbl.KFD_ALLOC_MEMORY_OF_GPU)
    def alloc_memory_of_gpu(self, p: KfdProcess, kdata: bytearray,
                            caller: Caller) -> Awaitable[None] | None:
        """kfd_ioctl_alloc_memory_of_gpu + amdgpu_amdkfd_gpuvm_alloc_memory_of_gpu: a size
        (1), a gpu_id of the process (2), a VM acquired on it (ENODEV) (3); DOORBELL takes
        exactly the process's doorbell slice and MMIO_REMAP one page (4); the first memory
        type set picks the domain, none is EINVAL (5); USERPTR: the user address (in
        mmap_offset) and size page aligned (EINVAL), its pages there now with the BO's
        access (init_user_pages: EFAULT), a GTT BO over the caller's memory (6);
        capacity as the KFD's limit, no fallback to another domain (ENOMEM) (7); the
        handle is MAKE_HANDLE(gpu_id, idr) (8); mmap_offset the render node's for
        VRAM/GTT/USERPTR, the kfd fd's cookie for MMIO/doorbells (9)."""
        layout = st.KFD_ALLOC_MEMORY_OF_GPU
        a = layout.decode(bytes(kdata[: layout.size]))
        if a.size == 0:  # 1
            raise DrmError(errno.EINVAL, "zero-sized allocation")
        pdd = p.pdd_by_id(a.gpu_id)  # 2
        pdd.vm()  # 3
        driver = pdd.node.driver
        if a.flags & ALLOC_MEM_FLAGS_DOORBELL and a.size != DOORBELL_PROCESS_SLICE:  # 4
            raise DrmError(errno.EINVAL, "a doorbell allocation is one process slice")
        if a.flags & ALLOC_MEM_FLAGS_MMIO_REMAP and a.size != PAGE_SIZE:
            raise DrmError(errno.EINVAL, "an MMIO remap allocation is one page")
        size = -(-a.size // PAGE_SIZE) * PAGE_SIZE
        if a.flags & ALLOC_MEM_FLAGS_VRAM:  # 5
            domain, pool = c.DOMAIN_VRAM, driver.vram
        elif a.flags & ALLOC_MEM_FLAGS_GTT:
            domain, pool = c.DOMAIN_GTT, driver.gtt
        elif a.flags & ALLOC_MEM_FLAGS_USERPTR:  # 6
            return self._alloc_userptr(p, pdd, a, kdata, caller)
        elif a.flags & (ALLOC_MEM_FLAGS_DOORBELL | ALLOC_MEM_FLAGS_MMIO_REMAP):
            # An SG BO over the BAR pages (the process's doorbells, the device's MMIO page):
            # the same memory the kfd fd's mmap of that cookie reaches.
            bar = pdd.doorbells() if a.flags & ALLOC_MEM_FLAGS_DOORBELL else pdd.mmio_page()
            bar.get()  # _install's put leaves the handle's reference
            self._install(pdd, bar, a, kdata)
            return None
        else:
            raise DrmError(errno.EINVAL, f"no memory type in flags {a.flags:#x}")
        if not pool.fits(size):  # 7
            raise DrmError(errno.ENOMEM, f"{pool.name} is full")
        create_flags = c.CREATE_CPU_ACCESS_REQUIRED if a.flags & ALLOC_MEM_FLAGS_PUBLIC else 0
        self._install(pdd, driver.bo_create(size, PAGE_SIZE, domain, create_flags), a, kdata)
        return None

    async def _alloc_userptr(self, p: KfdProcess, pdd: KfdProcessDevice,
                             a: st.KfdAllocMemoryOfGpu, kdata: bytearray,
                             caller: Caller) -> None:
        addr = a.mmap_offset
        if (addr | a.size) & (PAGE_SIZE - 1):
            raise DrmError(errno.EINVAL, "userptr address and size must be page aligned")
        driver = pdd.node.driver
        opener = driver.device.open_process_memory
        if opener is None:
            raise DrmError(errno.EFAULT, "no access to the caller's memory")
        process = opener(caller.pid)
        readonly = not a.flags & ALLOC_MEM_FLAGS_WRITABLE
        await user_pages_present(process, addr, a.size, readonly)
        if pdd.drm_file is None:  # released while the pages were looked at
            process.close()
            raise DrmError(errno.ENODEV, "no VM acquired for this GPU")
        self._install(pdd, driver.userptr_bo(process, addr, a.size, readonly), a, kdata)

    def _install(self, pdd: KfdProcessDevice, bo: AmdgpuBo, a: st.KfdAllocMemoryOfGpu,
                 kdata: bytearray) -> None:
        """Steps 8–9: the BO's GEM handle in the acquired file, the allocation's handle and
        its mmap offset copied back."""
        assert pdd.drm_file is not None
        gem_handle = pdd.drm_file.handle_create(bo)
        bo.put()  # the handle holds its reference
        idr = pdd.next_idr  # 8
        pdd.next_idr += 1
        pdd.mems[idr] = KfdMem(bo, gem_handle, a.va_addr, bo.size, a.flags)
        if a.flags & ALLOC_MEM_FLAGS_MMIO_REMAP:  # 9
            offset = KFD_MMAP_TYPE_MMIO | kfd_mmap_gpu_id(a.gpu_id)
        elif a.flags & ALLOC_MEM_FLAGS_DOORBELL:
            offset = KFD_MMAP_TYPE_DOORBELL | kfd_mmap_gpu_id(a.gpu_id)
        else:
            offset = pdd.node.driver.mmap_offset(bo)
        layout = st.KFD_ALLOC_MEMORY_OF_GPU
        kdata[: layout.size] = layout.encode(st.KfdAllocMemoryOfGpu(
            a.va_addr, a.size, make_handle(a.gpu_id, idr), offset, a.gpu_id, a.flags))

    def _mem(self, p: KfdProcess, handle: int, missing: int) -> tuple[KfdProcessDevice, int]:
        pdd = p.pdd_by_id(handle >> 32)
        idr = handle & 0xFFFF_FFFF
        if idr not in pdd.mems:
            raise DrmError(missing, f"no allocation {handle:#x}")
        return pdd, idr

    def _free(self, p: KfdProcess, pdd: KfdProcessDevice, idr: int, force: bool) -> None:
        mem = pdd.mems[idr]
        if mem.mapped and not force:
            raise DrmError(errno.EBUSY, "the allocation is still mapped")
        for gpu_id in list(mem.mapped):
            self._unmap_on(p, mem, gpu_id)
        for vm in mem.attached.values():
            vm.bo_close(mem.bo)
        mem.attached.clear()
        del pdd.mems[idr]
        if pdd.drm_file is not None and pdd.drm_file.lookup(mem.gem_handle) is mem.bo:
            pdd.drm_file.handle_delete(mem.gem_handle)

    @tbl.handles(tbl.KFD_FREE_MEMORY_OF_GPU)
    def free_memory_of_gpu(self, p: KfdProcess, kdata: bytearray, caller: Caller) -> None:
        """kfd_ioctl_free_memory_of_gpu: the handle's gpu_id the process's (1) and its idr
        an allocation (EINVAL) (2); still mapped on a GPU: EBUSY
        (amdgpu_amdkfd_gpuvm_free_memory_of_gpu) (3); its GEM handle goes with it (4)."""
        a = st.KFD_FREE_MEMORY_OF_GPU.decode(bytes(kdata[: st.KFD_FREE_MEMORY_OF_GPU.size]))
        pdd, idr = self._mem(p, a.handle, errno.EINVAL)  # 1, 2
        self._free(p, pdd, idr, force=False)  # 3, 4

    def _vm_of(self, p: KfdProcess, gpu_id: int) -> GpuVm:
        return p.pdd_by_id(gpu_id).vm()

    def _unmap_on(self, p: KfdProcess, mem: KfdMem, gpu_id: int) -> None:
        vm = mem.attached.get(gpu_id) or self._vm_of(p, gpu_id)
        bo_va = vm.bo_find(mem.bo)
        if bo_va is not None:
            with contextlib.suppress(DrmError):  # the render file may have dropped it
                vm.bo_unmap(bo_va, mem.va)
        mem.mapped.discard(gpu_id)

    def _device_ids(self, kdata: bytearray, caller: Caller
                    ) -> tuple[st.KfdMapMemoryToGpu, Awaitable[bytes]]:
        """Both ioctls' first steps: n_devices > 0 and n_success <= n_devices (EINVAL), the
        array allocated (kmalloc_array: ENOMEM past MAX_DEVICE_IDS, nothing read), then the
        gpu_id array read from the caller (EFAULT)."""
        a = st.KFD_MAP_MEMORY_TO_GPU.decode(bytes(kdata[: st.KFD_MAP_MEMORY_TO_GPU.size]))
        if a.n_devices == 0 or a.n_success > a.n_devices:
            raise DrmError(errno.EINVAL, "bad n_devices / n_success")
        if a.n_devices > MAX_DEVICE_IDS:
            raise DrmError(errno.ENOMEM, f"{a.n_devices} device ids")
        return a, self._read_user(caller, a.device_ids_array_ptr, 4 * a.n_devices)

    @staticmethod
    def _each_gpu(kdata: bytearray, raw: bytes, start: int, once: bool,
                  do: Callable[[int], None]) -> None:
        """The ioctls' loop over the array from n_success on: `do(gpu_id)` for each entry in
        order, n_success = the index after the last one done, copied back on failure too.
        Entries naming a GPU already done are done again by the kernel: for map a no-op
        (`once` False: skipped), for unmap a failure (`once`: `do` sees it again). So `do`
        runs once per distinct gpu_id, in order of first appearance, and the array (up to a
        million entries) is only searched in C: one GPU id that fails stops everything, and
        there are as few GPUs that succeed as this node has."""
        ids = array("I", raw)[start:]
        assert ids.itemsize == 4
        repeat_at = len(ids)  # (unmap) the first entry naming a GPU done before it
        for gpu_id in dict.fromkeys(ids):
            at = ids.index(gpu_id)
            if once and repeat_at < at:
                break
            try:
                do(gpu_id)
            except DrmError:
                _N_SUCCESS.put(kdata, start + at)
                raise
            if once:
                with contextlib.suppress(ValueError):
                    repeat_at = min(repeat_at, ids.index(gpu_id, at + 1))
        if once and repeat_at < len(ids):
            _N_SUCCESS.put(kdata, start + repeat_at)
            do(ids[repeat_at])  # raises: not mapped there any more
        _N_SUCCESS.put(kdata, start + len(ids))

    @tbl.handles(tbl.KFD_MAP_MEMORY_TO_GPU)
    def map_memory_to_gpu(self, p: KfdProcess, kdata: bytearray,
                          caller: Caller) -> Awaitable[None]:
        """kfd_ioctl_map_memory_to_gpu: n_devices / n_success (EINVAL), the array's
        allocation (ENOMEM) (1), the array (EFAULT) (2), the handle's GPU the process's
        (EINVAL) with a VM (ENODEV) (3), the allocation known (ENOMEM, as the kernel's
        translate_handle failure) (4); then from n_success on, each gpu_id the process's
        (EINVAL) with a VM (ENODEV), the BO mapped at its va in that VM (already mapped:
        nothing to do), n_success counting each GPU done, copied back on failure too (5)."""
        a, ids_read = self._device_ids(kdata, caller)  # 1

        async def run() -> None:
            raw = await ids_read  # 2
            pdd, idr = self._mem_checked(p, a.handle)  # 3, 4
            mem = pdd.mems[idr]
            writable = c.VM_PAGE_WRITEABLE if mem.flags & ALLOC_MEM_FLAGS_WRITABLE else 0
            execable = c.VM_PAGE_EXECUTABLE if mem.flags & ALLOC_MEM_FLAGS_EXECUTABLE else 0

            def map_on(gpu_id: int) -> None:  # 5
                vm = self._vm_of(p, gpu_id)
                if gpu_id not in mem.mapped:
                    bo_va = vm.bo_find(mem.bo)
                    if bo_va is None:  # a peer GPU: kfd_mem_attach
                        bo_va = vm.bo_open(mem.bo)
                        mem.attached[gpu_id] = vm
                    vm.bo_map(bo_va, mem.va, 0, mem.size,
                              c.VM_PAGE_READABLE | writable | execable)
                    mem.mapped.add(gpu_id)

            self._each_gpu(kdata, raw, a.n_success, False, map_on)

        return run()

    def _mem_checked(self, p: KfdProcess, handle: int) -> tuple[KfdProcessDevice, int]:
        pdd = p.pdd_by_id(handle >> 32)
        pdd.vm()
        return self._mem(p, handle, errno.ENOMEM)

    @tbl.handles(tbl.KFD_UNMAP_MEMORY_FROM_GPU)
    def unmap_memory_from_gpu(self, p: KfdProcess, kdata: bytearray,
                              caller: Caller) -> Awaitable[None]:
        """kfd_ioctl_unmap_memory_from_gpu: the map ioctl's steps 1–4, then from n_success
        on each gpu_id the process's (EINVAL), the BO mapped there (else EINVAL,
        amdgpu_amdkfd_gpuvm_unmap_memory_from_gpu's not-attached case), unmapped;
        n_success as for map."""
        a, ids_read = self._device_ids(kdata, caller)

        async def run() -> None:
            raw = await ids_read
            pdd, idr = self._mem_checked(p, a.handle)
            mem = pdd.mems[idr]

            def unmap_on(gpu_id: int) -> None:
                p.pdd_by_id(gpu_id)
                if gpu_id not in mem.mapped:
                    raise DrmError(errno.EINVAL, f"not mapped on GPU {gpu_id:#x}")
                self._unmap_on(p, mem, gpu_id)

            self._each_gpu(kdata, raw, a.n_success, True, unmap_on)

        return run()

    @tbl.handles(tbl.KFD_EXPORT_DMABUF)
    def export_dmabuf(self, p: KfdProcess, kdata: bytearray, caller: Caller) -> None:
        """kfd_ioctl_export_dmabuf: the handle's GPU known and the process's (EINVAL) (1),
        its idr an allocation (EINVAL) (2); the BO exported as PRIME_HANDLE_TO_FD exports
        it (amdgpu_amdkfd_gpuvm_export_dmabuf: the same dma-buf every time) (3), and the
        fd a dma-buf token of the acquired render file, which the shim (or libualink)
        opens as the real fd, as for PRIME (DESIGN "A dma-buf fd from a FUSE server") (4).
        MMIO and doorbell pages are not memory to share: EINVAL (an SG BO's export)."""
        layout = st.KFD_EXPORT_DMABUF
        a = layout.decode(bytes(kdata[: layout.size]))
        pdd, idr = self._mem(p, a.handle, errno.EINVAL)  # 1, 2
        mem = pdd.mems[idr]
        if mem.flags & (ALLOC_MEM_FLAGS_DOORBELL | ALLOC_MEM_FLAGS_MMIO_REMAP):
            raise DrmError(errno.EINVAL, "MMIO and doorbell pages are not exported")
        assert pdd.drm_file is not None  # an allocation implies an acquired VM
        device = pdd.node.driver.device
        buf = device.prime_handle_to_dmabuf(pdd.drm_file, mem.gem_handle)  # 3
        token = device.tokens.install(buf, pdd.drm_file, caller.uid)  # 4
        kdata[: layout.size] = layout.encode(st.KfdExportDmabuf(a.handle, a.flags, token))

    # -- events (kfd_events.c) -----------------------------------------------------------------
    @tbl.handles(tbl.KFD_CREATE_EVENT)
    def create_event(self, p: KfdProcess, kdata: bytearray, caller: Caller) -> None:
        """kfd_ioctl_create_event: an event_page_offset names the process's events page
        once (a second one EINVAL), as an allocation handle of a GPU of the process with
        a VM (EINVAL / ENODEV / EINVAL) (1); a signal (or debug) event takes the lowest
        free slot below KFD_SIGNAL_EVENT_LIMIT (ENOSPC when full), its id = slot = trigger
        data, and answers event_page_offset = KFD_MMAP_TYPE_EVENTS (2); any other type an
        id from KFD_FIRST_NONSIGNAL_EVENT_ID on (3)."""
        layout = st.KFD_CREATE_EVENT
        a = layout.decode(bytes(kdata[: layout.size]))
        page_offset = a.event_page_offset
        if page_offset:  # 1
            if p.event_page is not None:
                raise DrmError(errno.EINVAL, "the events page is already set")
            p.pdd_by_id(page_offset >> 32).vm()
            pdd, idr = self._mem(p, page_offset, errno.EINVAL)
            p.event_page = page_offset
            # kfd_event_page_set: every slot starts unsignaled
            bo = pdd.mems[idr].bo
            with contextlib.suppress(DrmError):
                bo.memory.write(0, b"\xff" * min(bo.size, KFD_SIGNAL_EVENT_LIMIT * 8))
        slot = 0
        if a.event_type in (KFD_IOC_EVENT_SIGNAL, KFD_IOC_EVENT_DEBUG_EVENT):  # 2
            event_id = next((i for i in range(KFD_SIGNAL_EVENT_LIMIT) if i not in p.events),
                            None)
            if event_id is None:
                raise DrmError(errno.ENOSPC, "no free signal event slot")
            page_offset, slot = KFD_MMAP_TYPE_EVENTS, event_id
            self._write_slot(p, slot, UNSIGNALED_EVENT_SLOT)
        else:  # 3
            event_id = max((i for i in p.events if i >= KFD_FIRST_NONSIGNAL_EVENT_ID),
                           default=KFD_FIRST_NONSIGNAL_EVENT_ID - 1) + 1
        p.events[event_id] = KfdEvent(event_id, a.event_type, a.auto_reset != 0)
        kdata[: layout.size] = layout.encode(st.KfdCreateEvent(
            page_offset, event_id, a.event_type, a.auto_reset, a.node_id, event_id, slot))

    def _events_page(self, p: KfdProcess) -> AmdgpuBo | None:
        """p->signal_page: the allocation CREATE_EVENT named (None before one did)."""
        if p.event_page is None:
            return None
        pdd = p.pdds.get(p.event_page >> 32)
        mem = pdd.mems.get(p.event_page & 0xFFFF_FFFF) if pdd is not None else None
        return mem.bo if mem is not None else None

    def _write_slot(self, p: KfdProcess, slot: int, value: int) -> None:
        bo = self._events_page(p)
        if bo is not None and (slot + 1) * 8 <= bo.size:
            with contextlib.suppress(DrmError):
                bo.memory.write(slot * 8, value.to_bytes(8, "little"))

    # -- mmap of the kfd fd (kfd_mmap) -----------------------------------------------------
    def mmap_target(self, caller: Caller, offset: int, length: int) -> tuple[AmdgpuBo, int]:
        """kfd_mmap: the calling process's KFD context (kfd_get_process(current): EINVAL
        without one) (1); the gpu_id in bits 46-61 names a device or none (2); by the type
        in bits 62-63: DOORBELL the process's doorbell slice, exactly its size
        (kfd_doorbell_mmap: EINVAL) (3); EVENTS the signal page, at most 32 KiB rounded to
        its page order (kfd_event_mmap: EINVAL), none yet EINVAL (4); MMIO the device's
        remap page, exactly one page (kfd_mmio_mmap: EINVAL) (5); a device type without a
        device ENODEV (6); RESERVED_MEM is the APU CWSR area, which no GPU here has:
        EINVAL (7). Returns the BO whose memory is mapped and the offset into it."""
        who = self.identify(caller.pid)
        p = self.processes.get(who.pid) if who is not None else None
        if p is None or p.id != who:  # 1 (a context of an earlier process with this pid: none)
            raise DrmError(errno.EINVAL, "no KFD process for the caller")
        gpu_id = (offset >> KFD_MMAP_GPU_ID_SHIFT) & 0xFFFF  # 2
        node = self.nodes.get(gpu_id) if gpu_id else None
        kind = offset & KFD_MMAP_TYPE_MASK
        if kind == KFD_MMAP_TYPE_EVENTS:  # 4
            pages = -(-length // PAGE_SIZE)
            if (pages - 1).bit_length() > ((KFD_SIGNAL_EVENT_LIMIT * 8 // PAGE_SIZE) - 1
                                           ).bit_length():
                raise DrmError(errno.EINVAL, "events page mmap of an illegal size")
            bo = self._events_page(p)
            if bo is None:
                raise DrmError(errno.EINVAL, "no signal page")
            return bo, 0
        if node is None:  # 6
            raise DrmError(errno.ENODEV, f"no GPU with gpu_id {gpu_id:#x}")
        if kind == KFD_MMAP_TYPE_DOORBELL:  # 3
            if length != DOORBELL_PROCESS_SLICE:
                raise DrmError(errno.EINVAL, "a doorbell mapping is one process slice")
            return p.pdds[gpu_id].doorbells(), 0
        if kind == KFD_MMAP_TYPE_MMIO:  # 5
            if length != PAGE_SIZE:
                raise DrmError(errno.EINVAL, "the MMIO remap mapping is one page")
            return p.pdds[gpu_id].mmio_page(), 0
        raise DrmError(errno.EINVAL, "no reserved memory on this GPU")  # 7

    @staticmethod
    def _event(p: KfdProcess, kdata: bytearray, cpu_signaled: bool) -> KfdEvent:
        """lookup_event_by_id (EINVAL); SET/RESET need a CPU-signalable (signal) event."""
        a = st.KFD_EVENT_ID.decode(bytes(kdata[: st.KFD_EVENT_ID.size]))
        ev = p.events.get(a.event_id)
        if ev is None:
            raise DrmError(errno.EINVAL, f"no event {a.event_id}")
        if cpu_signaled and ev.type != KFD_IOC_EVENT_SIGNAL:
            raise DrmError(errno.EINVAL, "only signal events are set from the CPU")
        return ev

    @tbl.handles(tbl.KFD_DESTROY_EVENT)
    def destroy_event(self, p: KfdProcess, kdata: bytearray, caller: Caller) -> None:
        self._destroy_event(p, self._event(p, kdata, cpu_signaled=False))

    def _destroy_event(self, p: KfdProcess, ev: KfdEvent) -> None:
        """destroy_event: the waiters in its queue lose it (their wait fails) and are
        woken; entries activated at once by a signaled event were never queued."""
        del p.events[ev.event_id]
        for w in ev.waiters:
            w.event = None
            w.wait.failed = True
            self._wake(w.wait)
        ev.waiters.clear()

    def _wake(self, wait: KfdWait) -> None:
        if self.waits is not None:
            self.waits.wake(wait)

    def _set_event(self, ev: KfdEvent) -> None:
        """set_event: every waiter in the event's queue is activated at once
        (wake_up_all); the event stays signaled unless it is auto-reset and its queue is
        not empty (then those waiters consumed it together)."""
        ev.signaled = not ev.auto_reset or not ev.waiters
        for w in ev.waiters:
            w.activate()
            self._wake(w.wait)

    @tbl.handles(tbl.KFD_SET_EVENT)
    def set_event(self, p: KfdProcess, kdata: bytearray, caller: Caller) -> None:
        """kfd_set_event: a CPU-signalable event of the process (EINVAL), set."""
        self._set_event(self._event(p, kdata, cpu_signaled=True))

    @tbl.handles(tbl.KFD_RESET_EVENT)
    def reset_event(self, p: KfdProcess, kdata: bytearray, caller: Caller) -> None:
        self._event(p, kdata, cpu_signaled=True).signaled = False

    @tbl.handles(tbl.KFD_WAIT_EVENTS)
    def wait_events(self, p: KfdProcess, kdata: bytearray, caller: Caller) -> Awaitable[None]:
        """kfd_wait_on_events: the waiters allocated up front (alloc_event_waiters'
        kmalloc_array: ENOMEM past MAX_WAIT_EVENTS, nothing read) (1); entry by entry, each
        kfd_event_data read from the caller (EFAULT) and its event known (EINVAL), the
        first failing entry ending the call with the ones before it initialized (2);
        init_event_waiter: an entry is activated at once if its event is signaled, which an
        auto-reset event gives up to it, else it joins the event's queue, where SET_EVENT
        activates them all (3); test_event_condition: all / any activated completes, a
        queued waiter whose event was destroyed fails (4); timeout 0 polls, 0xFFFFFFFF
        waits for ever, else that many ms (5); COMPLETE or TIMEOUT with 0 returned, FAIL
        with EIO, and FAIL in wait_result whenever the call fails (6); the waiters leave the
        queues whatever happened, and a wait interrupted by a signal gives back the
        auto-reset signals it took (free_waiters' undo_auto_reset) (7).

        No work here grows with the entries beyond C-level passes over them: the array is
        read off the serving thread, its ids picked out and counted per event in C, and
        the waiters are one per (wait, event) with the wait's counts (KfdWait)."""
        layout = st.KFD_WAIT_EVENTS
        a = layout.decode(bytes(kdata[: layout.size]))
        if p.pid in self.queues.pqms:
            for tell in list(self.queues.waiting):
                tell(p.pid)

        def result(value: int) -> None:
            _WAIT_RESULT.put(kdata, value)

        if a.num_events > MAX_WAIT_EVENTS:  # 1
            result(KFD_IOC_WAIT_RESULT_FAIL)
            raise DrmError(errno.ENOMEM, f"{a.num_events} event waiters")

        async def run() -> None:
            raw, error = await self._read_entries(caller, a.events_ptr, a.num_events)  # 2
            step, at = st.KFD_EVENT_DATA_SIZE // 4, st.KFD_EVENT_DATA_EVENT_ID // 4
            ids = memoryview(raw).cast("I")[at::step].tolist()
            unknown = set(ids).difference(p.events)
            if unknown:
                stop = next(i for i, eid in enumerate(ids) if eid in unknown)
                ids, error = ids[:stop], DrmError(errno.EINVAL, f"no event {ids[stop]}")
            wait = KfdWait()
            waiters: list[KfdEventWaiter] = []
            interrupted = True
            try:
                for eid, n in Counter(ids).items():  # 3
                    waiters.append(self._init_waiters(wait, p.events[eid], n))
                if error is not None:
                    raise error
                outcome = wait.condition(bool(a.wait_for_all))  # 4
                if outcome == KFD_IOC_WAIT_RESULT_TIMEOUT and a.timeout != 0:  # 5
                    if self.waits is None:
                        raise DrmError(errno.EINVAL, "no way to wait")
                    deadline = (None if a.timeout == KFD_EVENT_TIMEOUT_INFINITE
                                else self.waits.now_ns() + a.timeout * 1_000_000)
                    await self.waits.wait_until(
                        deadline, lambda: wait.condition(bool(a.wait_for_all))
                        != KFD_IOC_WAIT_RESULT_TIMEOUT, [wait])
                    outcome = wait.condition(bool(a.wait_for_all))
                interrupted = False
            except DrmError:
                interrupted = False
                result(KFD_IOC_WAIT_RESULT_FAIL)  # 6
                raise
            finally:
                for w in waiters:  # 7
                    ev = w.event
                    if ev is None:
                        continue
                    ev.waiters.pop(w, None)
                    if interrupted and ev.auto_reset and (w.first or w.queued_activated):
                        self._set_event(ev)
            if outcome == KFD_IOC_WAIT_RESULT_COMPLETE:
                await self._copy_signaled_event_data(p, caller, a.events_ptr, ids, waiters)
            result(outcome)  # 6
            if outcome == KFD_IOC_WAIT_RESULT_FAIL:
                raise DrmError(errno.EIO, "an event was destroyed during the wait")

        return run()

    async def _copy_signaled_event_data(self, p: KfdProcess, caller: Caller, events_ptr: int,
                                        ids: list[int], waiters: list[KfdEventWaiter]) -> None:
        """copy_signaled_event_data: each entry whose waiter was activated on a memory event
        gets the event's kfd_hsa_memory_exception_data in its kfd_event_data's union (what
        libhsakmt turns into HsaMemoryAccessFault, and ROCr's VM-fault handler reads)."""
        activated = {w.event.event_id for w in waiters
                     if w.event is not None and (w.first or w.queued_activated)}
        for i, eid in enumerate(ids):
            ev = p.events.get(eid)
            if (ev is not None and eid in activated and ev.type == KFD_IOC_EVENT_MEMORY
                    and ev.memory_exception_data):
                await self._write_user(caller, events_ptr + i * st.KFD_EVENT_DATA_SIZE,
                                       ev.memory_exception_data)

    @staticmethod
    def _init_waiters(wait: KfdWait, ev: KfdEvent, n: int) -> KfdEventWaiter:
        """init_event_waiter for `n` entries naming `ev`, in order: while it is signaled
        each is activated, and an auto-reset event is consumed by the first; the rest
        join its queue."""
        first = (1 if ev.auto_reset else n) if ev.signaled and n else 0
        ev.signaled = ev.signaled and not ev.auto_reset
        w = KfdEventWaiter(wait, ev, first, n - first)
        wait.entries += n
        wait.activated += first
        if w.queued:
            ev.waiters[w] = None
        return w

    async def _read_entries(self, caller: Caller, address: int,
                            count: int) -> tuple[bytes, DrmError | None]:
        """The caller's kfd_event_data array, or the longest prefix of whole entries that
        can be read and the EFAULT that stopped it there (the kernel copies them one at a
        time: the entries before a fault are initialized). One read in the usual case; a
        fault is placed by bisection, since a readable prefix is readable all along."""
        size = st.KFD_EVENT_DATA_SIZE
        try:
            return await self._read_user(caller, address, size * count), None
        except DrmError as e:
            if e.errno != errno.EFAULT:
                raise
            fault = e
        good, bad, data = 0, count, b""
        while bad - good > 1:
            mid = (good + bad) // 2
            try:
                data = await self._read_user(caller, address, size * mid)
                good = mid
            except DrmError as e:
                if e.errno != errno.EFAULT:
                    raise
                bad = mid
        return data[: size * good], fault

    @tbl.handles(tbl.KFD_SET_SCRATCH_BACKING_VA)
    def set_scratch_backing_va(self, p: KfdProcess, kdata: bytearray, caller: Caller) -> None:
        """kfd_ioctl_set_scratch_backing_va: a gpu_id of the process (EINVAL) with a VM
        (kfd_bind_process_to_device: ENODEV); the address is kept for the queues (none run
        here)."""
        a = st.KFD_SET_SCRATCH_BACKING_VA.decode(bytes(kdata[: st.KFD_SET_SCRATCH_BACKING_VA.size]))
        pdd = p.pdd_by_id(a.gpu_id)
        pdd.vm()
        pdd.scratch_backing_va = a.va_addr

    @tbl.handles(tbl.KFD_SET_TRAP_HANDLER)
    def set_trap_handler(self, p: KfdProcess, kdata: bytearray, caller: Caller) -> None:
        """kfd_ioctl_set_trap_handler: a gpu_id of the process (EINVAL) bound to it (ESRCH
        when it cannot be, here: no VM); TBA/TMA kept for the queues (none run here)."""
        a = st.KFD_SET_TRAP_HANDLER.decode(bytes(kdata[: st.KFD_SET_TRAP_HANDLER.size]))
        pdd = p.pdd_by_id(a.gpu_id)
        if pdd.drm_file is None:
            raise DrmError(errno.ESRCH, "the process cannot be bound to this GPU")
        pdd.trap_handler = (a.tba_addr, a.tma_addr)

    @tbl.handles(tbl.KFD_SET_XNACK_MODE)
    def set_xnack_mode(self, p: KfdProcess, kdata: bytearray, caller: Caller) -> None:
        """kfd_ioctl_set_xnack_mode: a negative value queries the mode (1); else the mode
        is switched, EBUSY while the process has queues; every GPU of this emulator
        is a gfx9.4 part that can retry faults, so enabling is allowed (kfd_process_xnack_mode)
        (2)."""
        a = st.KFD_SET_XNACK_MODE.decode(bytes(kdata[: st.KFD_SET_XNACK_MODE.size]))
        if a.xnack_enabled < 0:  # 1
            _XNACK_ENABLED.put(kdata, int(p.xnack_enabled))
        else:
            if p.pid in self.queues.pqms:
                raise DrmError(errno.EBUSY, "the process has user queues")
            p.xnack_enabled = a.xnack_enabled != 0  # 2

    # -- queues (kfd_ioctl_create_queue ... kfd_ioctl_alloc_queue_gws) ------------------------
    # The argument checks are the ioctls' own; what happens to a queue is queues.py's
    # (process/device queue managers); the emulated engines run them (gpu_engine.py).

    @staticmethod
    def _queue_fields_checked(percentage: int, priority: int, ring_base: int,
                              ring_size: int) -> None:
        """The checks set_queue_properties_from_user and kfd_ioctl_update_queue share:
        percentage (bits 0-7 since pm4_target_xcc took bits 8-15) <= 100 and priority <= 15
        (EINVAL), a ring base the user may address (access_ok: EFAULT), a ring size 0 or a
        power of two (EINVAL)."""
        if percentage > KFD_MAX_QUEUE_PERCENTAGE:
            raise DrmError(errno.EINVAL, "queue percentage above KFD_MAX_QUEUE_PERCENTAGE")
        if priority > KFD_MAX_QUEUE_PRIORITY:
            raise DrmError(errno.EINVAL, "queue priority above KFD_MAX_QUEUE_PRIORITY")
        if ring_base and not access_ok(ring_base, 8):
            raise DrmError(errno.EFAULT, "ring base address not a user address")
        if ring_size & (ring_size - 1):
            raise DrmError(errno.EINVAL, "ring size is not a power of 2 or 0")

    @tbl.handles(tbl.KFD_CREATE_QUEUE)
    def create_queue(self, p: KfdProcess, kdata: bytearray, caller: Caller) -> None:
        """kfd_ioctl_create_queue: set_queue_properties_from_user's checks in order —
        percentage/priority/ring base/ring size (EINVAL/EINVAL/EFAULT/EINVAL), read and
        write pointers and, when given, EOP buffer and CWSR area user addresses (EFAULT),
        a known queue type (ENOTSUPP, the kernel's internal 524, as it leaks to the user)
        (1); the gpu_id the process's (EINVAL) (2), the process bound to it (ESRCH: here,
        no VM acquired) (3), an SDMA_BY_ENG_ID queue's engine one of the GPU's (EINVAL)
        (3b); then pqm_create_queue (queues.QueueRegistry.create: its limits and errnos),
        and the answer: queue_id and doorbell_offset (4)."""
        layout = st.KFD_CREATE_QUEUE
        a = layout.decode(bytes(kdata[: layout.size]))
        self._queue_fields_checked(a.queue_percentage & 0xFF, a.queue_priority,  # 1
                                   a.ring_base_address, a.ring_size)
        for name, addr, optional in (("read pointer", a.read_pointer_address, False),
                                     ("write pointer", a.write_pointer_address, False),
                                     ("EOP buffer", a.eop_buffer_address, True),
                                     ("CWSR area", a.ctx_save_restore_address, True)):
            if (addr or not optional) and not access_ok(addr, 4):
                raise DrmError(errno.EFAULT, f"{name} not a user address")
        if a.queue_type not in KFD_IOC_QUEUE_TYPES:
            raise DrmError(ENOTSUPP, f"unknown queue type {a.queue_type}")
        pdd = p.pdd_by_id(a.gpu_id)  # 2
        if pdd.drm_file is None:  # 3
            raise DrmError(errno.ESRCH, "the process cannot be bound to this GPU")
        # 3b: SDMA_BY_ENG_ID names an engine of the GPU (PCIe and xGMI SDMA engines)
        sdma_engines = pdd.node.driver.profile.sdma_instances
        if a.queue_type == KFD_IOC_QUEUE_TYPE_SDMA_BY_ENG_ID and a.sdma_engine_id >= sdma_engines:
            raise DrmError(errno.EINVAL, f"no SDMA engine {a.sdma_engine_id}")
        q = self.queues.create(p.pid, pdd.vm(), QueueArgs(  # 4
            a.gpu_id, a.queue_type, a.ring_base_address, a.ring_size,
            a.read_pointer_address, a.write_pointer_address, a.queue_percentage & 0xFF,
            a.queue_priority, a.sdma_engine_id, a.eop_buffer_address,
            a.ctx_save_restore_address, a.ctl_stack_size))
        # The slice the doorbell_offset cookie maps, with the queue's slot armed: all-ones,
        # a value no doorbell store makes (as AMD's rocjitsu re-arms a recycled slot), so
        # the first store is seen even when it writes what the slot held. ROCr's first AQL
        # doorbell is 0 (the index of packet 0), which a zeroed slot would hide.
        pdd.doorbells().memory.write(q.doorbell_slot, DOORBELL_ARMED.to_bytes(8, "little"))
        q.last_doorbell = DOORBELL_ARMED
        kdata[: layout.size] = layout.encode(dataclasses.replace(
            a, doorbell_offset=q.doorbell_offset, queue_id=q.queue_id))

    @tbl.handles(tbl.KFD_DESTROY_QUEUE)
    def destroy_queue(self, p: KfdProcess, kdata: bytearray, caller: Caller) -> None:
        """pqm_destroy_queue: a queue id that matches no queue is EINVAL."""
        a = st.KFD_DESTROY_QUEUE.decode(bytes(kdata[: st.KFD_DESTROY_QUEUE.size]))
        self.queues.destroy(p.pid, a.queue_id)

    @tbl.handles(tbl.KFD_UPDATE_QUEUE)
    def update_queue(self, p: KfdProcess, kdata: bytearray, caller: Caller) -> None:
        """kfd_ioctl_update_queue: the shared checks on the whole percentage (1), then
        pqm_update_queue_properties (EFAULT for no such queue) (2)."""
        a = st.KFD_UPDATE_QUEUE.decode(bytes(kdata[: st.KFD_UPDATE_QUEUE.size]))
        self._queue_fields_checked(a.queue_percentage, a.queue_priority,  # 1
                                   a.ring_base_address, a.ring_size)
        self.queues.update(p.pid, a.queue_id, a.ring_base_address, a.ring_size,  # 2
                           a.queue_percentage, a.queue_priority)

    @tbl.handles(tbl.KFD_SET_CU_MASK)
    def set_cu_mask(self, p: KfdProcess, kdata: bytearray, caller: Caller) -> Awaitable[None]:
        """kfd_ioctl_set_cu_mask: num_cu_mask a non-zero multiple of 32 (EINVAL) (1), at
        most 1024 bits used (2), that many bits read from cu_mask_ptr (EFAULT) (3); then
        pqm_update_mqd (EFAULT for no such queue) (4)."""
        a = st.KFD_SET_CU_MASK.decode(bytes(kdata[: st.KFD_SET_CU_MASK.size]))
        if a.num_cu_mask % 32 or a.num_cu_mask == 0:  # 1
            raise DrmError(errno.EINVAL, "num_cu_mask must be a non-zero multiple of 32")
        count = min(a.num_cu_mask, KFD_MAX_NUM_CUS)  # 2

        async def run() -> None:
            mask = await self._read_user(caller, a.cu_mask_ptr, count // 8)  # 3
            self.queues.set_cu_mask(p.pid, a.queue_id, mask)  # 4

        return run()

    @tbl.handles(tbl.KFD_GET_QUEUE_WAVE_STATE)
    def get_queue_wave_state(self, p: KfdProcess, kdata: bytearray, caller: Caller) -> None:
        """pqm_get_wave_state: no queue with that id EFAULT, else the saved sizes (none:
        no wave runs here) or EINVAL (queues.QueueRegistry.wave_state)."""
        layout = st.KFD_GET_QUEUE_WAVE_STATE
        a = layout.decode(bytes(kdata[: layout.size]))
        ctl, save = self.queues.wave_state(p.pid, a.queue_id)
        kdata[: layout.size] = layout.encode(dataclasses.replace(
            a, ctl_stack_used_size=ctl, save_area_used_size=save))

    @tbl.handles(tbl.KFD_ALLOC_QUEUE_GWS)
    def alloc_queue_gws(self, p: KfdProcess, kdata: bytearray, caller: Caller) -> None:
        """kfd_ioctl_alloc_queue_gws: pqm_get_user_queue (EINVAL for no such queue), then
        pqm_set_gws; first_gws 0 (the whole GWS)."""
        layout = st.KFD_ALLOC_QUEUE_GWS
        a = layout.decode(bytes(kdata[: layout.size]))
        self.queues.alloc_gws(p.pid, a.queue_id, a.num_gws)
        kdata[: layout.size] = layout.encode(dataclasses.replace(a, first_gws=0))

    @tbl.handles(tbl.KFD_GET_TILE_CONFIG)
    def get_tile_config(self, p: KfdProcess, kdata: bytearray,
                        caller: Caller) -> Awaitable[None] | None:
        """kfd_ioctl_get_tile_config: a gpu_id of the process (EINVAL) (1); gb_addr_config
        from the GPU's profile, num_banks / num_ranks 0 (amdgpu_amdkfd_get_tile_config:
        gfx9 sets neither) (2); num_tile_configs becomes min(asked, 32) and that many
        entries of the tile mode array go to tile_config_ptr, a fault leaving it 0 and
        EFAULT (3); then the same for the 16 macro tile modes (4). gfx9 programs no tile
        mode tables (swizzle modes replaced them), so every entry is 0."""
        layout = st.KFD_GET_TILE_CONFIG
        a = layout.decode(bytes(kdata[: layout.size]))
        pdd = p.pdd_by_id(a.gpu_id)  # 1
        tiles = min(a.num_tile_configs, GFX9_NUM_TILE_CONFIGS)
        macros = min(a.num_macro_tile_configs, GFX9_NUM_MACRO_TILE_CONFIGS)

        def answer(n_tiles: int, n_macros: int) -> None:  # 2
            kdata[: layout.size] = layout.encode(st.KfdGetTileConfig(
                a.tile_config_ptr, a.macro_tile_config_ptr, n_tiles, n_macros, a.gpu_id,
                pdd.node.driver.profile.gb_addr_config, 0, 0))

        answer(tiles, a.num_macro_tile_configs)
        if not tiles and not macros:
            answer(tiles, macros)
            return None

        async def copy_out() -> None:
            if tiles:  # 3 (copy_to_user of 0 bytes touches nothing)
                try:
                    await self._write_user(caller, a.tile_config_ptr, bytes(4 * tiles))
                except DrmError:
                    answer(0, a.num_macro_tile_configs)
                    raise
            answer(tiles, macros)
            if macros:  # 4
                try:
                    await self._write_user(caller, a.macro_tile_config_ptr, bytes(4 * macros))
                except DrmError:
                    answer(tiles, 0)
                    raise

        return copy_out()

    @tbl.handles(tbl.KFD_RUNTIME_ENABLE)
    def runtime_enable(self, p: KfdProcess, kdata: bytearray, caller: Caller) -> None:
        """kfd_ioctl_runtime_enable (since 1.13, the debugger API; GET_VERSION says 1.17):
        ENABLE in mode_mask enables (runtime_enable): EBUSY when already enabled, EEXIST
        when the process has queues, else the state, r_debug and the TTMP
        setup are kept; no debugger attaches to this KFD, so nothing waits (1). Without
        ENABLE it disables (runtime_disable): r_debug and TTMP setup cleared, 0 (2).
        capabilities_mask is not written, as the kernel's is not."""
        a = st.KFD_RUNTIME_ENABLE.decode(bytes(kdata[: st.KFD_RUNTIME_ENABLE.size]))
        if a.mode_mask & KFD_RUNTIME_ENABLE_MODE_ENABLE_MASK:  # 1
            if p.runtime_enabled:
                raise DrmError(errno.EBUSY, "the runtime is already enabled")
            if p.pid in self.queues.pqms:
                raise DrmError(errno.EEXIST, "the process already has queues")
            p.runtime_enabled, p.r_debug = True, a.r_debug
            p.ttmp_setup = bool(a.mode_mask & KFD_RUNTIME_ENABLE_MODE_TTMP_SAVE_MASK)
        else:  # 2
            p.runtime_enabled, p.r_debug, p.ttmp_setup = False, 0, False

    @tbl.handles(tbl.KFD_SVM)
    def svm(self, p: KfdProcess, kdata: bytearray, caller: Caller) -> None:
        """kfd_ioctl_svm of a kernel built without CONFIG_HSA_AMD_SVM: EPERM for every op.
        This KFD has no SVM: no GPU node sets HSA_CAP_SVMAPI_SUPPORTED in its topology
        capability, so libhsakmt 5.2.3 reports the SVM API unsupported and ROCr keeps to
        ALLOC_MEMORY_OF_GPU; SET/GET_ATTR would need HMM-style migration and fault
        handling this emulator does not have."""
        raise DrmError(errno.EPERM, "no SVM support")

    # -- dma-buf import and info (kfd_ioctl_import_dmabuf, kfd_ioctl_get_dmabuf_info) -------
    def _dmabuf_bo(self, caller: Caller, fd: int) -> AmdgpuBo:
        """dma_buf_get (EBADF / EINVAL) and an amdgpu BO behind it (EINVAL otherwise)."""
        if self.resolve_dmabuf is None:
            raise DrmError(errno.EBADF, "no fd resolution")
        buf = self.resolve_dmabuf(caller.pid, fd)
        if not isinstance(buf.obj, AmdgpuBo):
            raise DrmError(errno.EINVAL, "not an amdgpu dma-buf")
        return buf.obj

    @tbl.handles(tbl.KFD_IMPORT_DMABUF)
    def import_dmabuf(self, p: KfdProcess, kdata: bytearray, caller: Caller) -> None:
        """kfd_ioctl_import_dmabuf: a gpu_id of the process (EINVAL) with a VM (ENODEV) (1),
        the fd a dma-buf (EBADF / EINVAL) of an amdgpu BO (EINVAL) (2); the BO becomes an
        allocation of that GPU at va_addr, through a GEM handle of the acquired file
        (PRIME_FD_TO_HANDLE's: the file's existing handle if it has one) (3)."""
        layout = st.KFD_IMPORT_DMABUF
        a = layout.decode(bytes(kdata[: layout.size]))
        pdd = p.pdd_by_id(a.gpu_id)  # 1
        pdd.vm()
        assert pdd.drm_file is not None
        if self.resolve_dmabuf is None:
            raise DrmError(errno.EBADF, "no fd resolution")
        buf = self.resolve_dmabuf(caller.pid, a.dmabuf_fd)  # 2
        if not isinstance(buf.obj, AmdgpuBo) or buf.obj.npa is not None:
            raise DrmError(errno.EINVAL, "not an amdgpu dma-buf")
        device = pdd.node.driver.device
        gem_handle = device.prime_fd_to_handle(pdd.drm_file, buf)  # 3
        bo = pdd.drm_file.lookup(gem_handle)
        assert isinstance(bo, AmdgpuBo)
        flags = (ALLOC_MEM_FLAGS_VRAM if bo.placement is pdd.node.driver.vram
                 else ALLOC_MEM_FLAGS_GTT) | ALLOC_MEM_FLAGS_WRITABLE
        idr = pdd.next_idr
        pdd.next_idr += 1
        pdd.mems[idr] = KfdMem(bo, gem_handle, a.va_addr, bo.size, flags)
        kdata[: layout.size] = layout.encode(st.KfdImportDmabuf(
            a.va_addr, make_handle(a.gpu_id, idr), a.gpu_id, a.dmabuf_fd))

    @tbl.handles(tbl.KFD_GET_DMABUF_INFO)
    def get_dmabuf_info(self, p: KfdProcess, kdata: bytearray,
                        caller: Caller) -> Awaitable[None] | None:
        """kfd_ioctl_get_dmabuf_info: a KFD device at all (EINVAL) (1); the fd a dma-buf
        of an amdgpu BO (EBADF / EINVAL) (2); with a metadata buffer, the BO's UMD
        metadata must fit in metadata_size (EINVAL) and is copied out (EFAULT) (3); the
        answer: size, the gpu_id of the BO's GPU, VRAM or GTT (PUBLIC when CPU access was
        required), the metadata's size (4)."""
        layout = st.KFD_GET_DMABUF_INFO
        a = layout.decode(bytes(kdata[: layout.size]))
        if not self.nodes:  # 1
            raise DrmError(errno.EINVAL, "no KFD device")
        bo = self._dmabuf_bo(caller, a.dmabuf_fd)  # 2
        node = next((n for n in self.nodes.values() if n.driver.device is bo.device), None)
        if node is None:
            raise DrmError(errno.EINVAL, "the dma-buf is not of a GPU of this node")
        flags = ALLOC_MEM_FLAGS_VRAM if bo.placement is node.driver.vram else ALLOC_MEM_FLAGS_GTT
        if bo.flags & c.CREATE_CPU_ACCESS_REQUIRED:
            flags |= ALLOC_MEM_FLAGS_PUBLIC
        meta = bo.metadata

        def answer() -> None:  # 4
            kdata[: layout.size] = layout.encode(st.KfdGetDmabufInfo(
                bo.size, a.metadata_ptr, len(meta), node.gpu_id, flags, a.dmabuf_fd))

        if not a.metadata_ptr:
            answer()
            return None
        if len(meta) > a.metadata_size:  # 3
            raise DrmError(errno.EINVAL, "the metadata buffer is too small")

        async def copy_out() -> None:
            if meta:
                await self._write_user(caller, a.metadata_ptr, meta)
            answer()

        return copy_out()
