"""The KFD's user queues, sans-IO (kfd_process_queue_manager.c, kfd_device_queue_manager.c,
kfd_doorbell.c, kfd_queue.c): who owns a queue, the limits that refuse one, the doorbell slot
and mmap cookie CREATE_QUEUE answers, and what the queue ioctls do to a queue that exists.

- `ProcessQueueManager` (pqm): one per KFD process; the per-process queue slot bitmap
  (`queue_id`, KFD_MAX_NUM_OF_QUEUES_PER_PROCESS) and, per GPU, the doorbell bitmap with the
  range the SOC15 doorbell layout keeps for non-CP engines (SDMA) reserved.
- `DeviceQueueManager` (dqm): one per GPU; the device-wide count of user queues
  (max_num_of_queues_per_device) and the SDMA queue bitmaps (PCIe and xGMI engines, each with
  num_sdma_queues_per_engine queues) from the topology.
- `KfdQueue`: queue_properties plus what the emulated engine reports (rptr, packets done,
  state, the last error); `processor` is the engine's consumer of the ring (amdgpu/sdma.py or
  amdgpu/aql.py), made by the edge that runs queues, never by this module.

Nothing here touches the caller's memory or runs a queue: the edge (ualinkd/gpu_engine.py)
watches doorbells and drives `processor`, and tells `QueueRegistry` what happened.
"""

from __future__ import annotations

import errno
import logging
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from ..abi.constants import PAGE_SIZE
from ..drm.errors import DrmError

if TYPE_CHECKING:
    from ..amdgpu.aql import AqlQueue
    from ..amdgpu.profile import DeviceProfile
    from ..amdgpu.sdma import SdmaRing
    from ..amdgpu.vm import GpuVm
    from .chardev import Kfd, KfdProcess

log = logging.getLogger(__name__)

# kfd_ioctl.h queue types
KFD_IOC_QUEUE_TYPE_COMPUTE = 0
KFD_IOC_QUEUE_TYPE_SDMA = 1
KFD_IOC_QUEUE_TYPE_COMPUTE_AQL = 2
KFD_IOC_QUEUE_TYPE_SDMA_XGMI = 3
KFD_IOC_QUEUE_TYPE_SDMA_BY_ENG_ID = 4
QUEUE_TYPE_NAMES = {0: "compute", 1: "sdma", 2: "compute_aql", 3: "sdma_xgmi",
                    4: "sdma_by_eng_id"}
SDMA_TYPES = frozenset({KFD_IOC_QUEUE_TYPE_SDMA, KFD_IOC_QUEUE_TYPE_SDMA_XGMI,
                        KFD_IOC_QUEUE_TYPE_SDMA_BY_ENG_ID})

# kfd_priv.h
KFD_MAX_NUM_OF_QUEUES_PER_PROCESS = 1024
KFD_QUEUE_DOORBELL_MIRROR_OFFSET = 512
# the amdgpu module parameter's default (max_num_of_queues_per_device)
KFD_MAX_NUM_OF_QUEUES_PER_DEVICE = 4096
KFD_DOORBELL_SIZE = 8  # gfx9: 64-bit doorbells
KFD_MMAP_TYPE_DOORBELL = 0x3 << 62
KFD_MMAP_GPU_ID_SHIFT = 46
DOORBELL_PROCESS_SLICE = KFD_MAX_NUM_OF_QUEUES_PER_PROCESS * KFD_DOORBELL_SIZE

# soc15's Vega20 doorbell layout (amdgpu_doorbell.h), what Aldebaran and the emulated parts
# use: SDMA engine e's doorbells from 0x100 + 0xA * e (the kernel names 8 engines; the same
# stride continues for the parts with 16), first_non_cp = sDMA_ENGINE0 and the non-CP range
# ending at the last assignment, so a process's compute doorbells are 0x000-0x0FF and their
# mirror 0x200-0x2FF (init_doorbell_bitmap).
SDMA_DOORBELL_BASE = 0x100
SDMA_DOORBELL_STRIDE = 0xA
NON_CP_DOORBELLS = range(0x100, 0x1CF)

# num_sdma_queues_per_engine for SDMA 4.x (kfd_device_info_set_sdma_info)
SDMA_QUEUES_PER_ENGINE = 8
# kfd_get_num_sdma_engines: with xGMI, two engines serve PCIe (host) copies, the rest are
# xGMI engines (kfd_get_num_xgmi_sdma_engines)
SDMA_PCIE_ENGINES = 2


def sdma_engines(profile: DeviceProfile) -> tuple[int, int]:
    """(num_sdma_engines, num_sdma_xgmi_engines) of a GPU: the topology's numbers."""
    pcie = min(profile.sdma_instances, SDMA_PCIE_ENGINES)
    return pcie, profile.sdma_instances - pcie


class KfdQueueState(Enum):
    """What ualinkctl shows: ACTIVE runs on a doorbell, INACTIVE (QUEUE_IS_ACTIVE false:
    no ring, size 0 or percentage 0) does not, ERROR stopped for good (a GPU fault or an
    illegal packet) until destroyed."""

    ACTIVE = "active"
    INACTIVE = "inactive"
    ERROR = "error"


@dataclass(eq=False, slots=True)
class KfdQueue:
    """struct queue + queue_properties of one user queue."""

    pid: int
    gpu_id: int
    queue_id: int
    type: int  # the ioctl's queue type (SDMA_BY_ENG_ID becomes SDMA or SDMA_XGMI)
    ring_base: int
    ring_size: int
    rptr_address: int
    wptr_address: int
    percentage: int
    priority: int
    doorbell_id: int
    doorbell_offset: int  # what CREATE_QUEUE answered: the mmap cookie plus the slot
    vm: GpuVm  # the VM of the render file ACQUIRE_VM bound: the queue's GPU VM
    sdma_engine: int = 0
    sdma_queue: int = 0
    eop_address: int = 0
    ctx_save_address: int = 0
    ctl_stack_size: int = 0
    cu_mask: bytes = b""
    gws: bool = False
    error: str | None = None
    processor: SdmaRing | AqlQueue | None = None  # the engine's ring consumer (the edge makes it)
    rptr: int = 0  # the byte index consumed, as the engine last wrote it back
    last_doorbell: int = 0
    packets: int = 0
    doorbells: int = 0

    @property
    def doorbell_slot(self) -> int:
        """The byte offset of the queue's doorbell in the process's slice."""
        return (self.doorbell_id * KFD_DOORBELL_SIZE) % DOORBELL_PROCESS_SLICE

    @property
    def is_sdma(self) -> bool:
        return self.type in SDMA_TYPES

    @property
    def state(self) -> KfdQueueState:
        if self.error is not None:
            return KfdQueueState.ERROR
        # QUEUE_IS_ACTIVE (kfd_priv.h)
        if self.ring_size > 0 and self.ring_base != 0 and self.percentage > 0:
            return KfdQueueState.ACTIVE
        return KfdQueueState.INACTIVE

    @property
    def type_name(self) -> str:
        return QUEUE_TYPE_NAMES.get(self.type, str(self.type))


@dataclass(eq=False, slots=True)
class DeviceQueueManager:
    """device_queue_manager of one GPU (cpsch: the HWS schedules, oversubscription allowed):
    the device-wide queue count and the SDMA queue bitmaps."""

    gpu_id: int
    num_sdma_engines: int
    num_xgmi_engines: int
    queues_per_engine: int = SDMA_QUEUES_PER_ENGINE
    total_queue_count: int = 0
    sdma_used: set[int] = field(default_factory=set)  # sdma_id over the PCIe engines
    xgmi_used: set[int] = field(default_factory=set)  # over the xGMI engines

    def allocate_sdma_queue(self, qtype: int, engine: int) -> tuple[int, int, int]:
        """allocate_sdma_queue: the first free queue of the kind (ENOMEM when none); an
        SDMA_BY_ENG_ID queue a free queue of the named engine, its kind that engine's.
        sdma_id n is engine n % engines, queue n // engines. Returns (type, engine, queue)."""
        if qtype == KFD_IOC_QUEUE_TYPE_SDMA_BY_ENG_ID:
            xgmi = engine >= self.num_sdma_engines
            used, engines = ((self.xgmi_used, self.num_xgmi_engines) if xgmi
                             else (self.sdma_used, self.num_sdma_engines))
            local = engine - self.num_sdma_engines if xgmi else engine
            free = [i for i in range(local, engines * self.queues_per_engine, engines)
                    if i not in used]
            if not free:
                raise DrmError(errno.ENOMEM, f"no more SDMA queues on engine {engine}")
            used.add(free[0])
            return (KFD_IOC_QUEUE_TYPE_SDMA_XGMI if xgmi else KFD_IOC_QUEUE_TYPE_SDMA,
                    engine, free[0] // engines)
        xgmi = qtype == KFD_IOC_QUEUE_TYPE_SDMA_XGMI
        used, engines = ((self.xgmi_used, self.num_xgmi_engines) if xgmi
                         else (self.sdma_used, self.num_sdma_engines))
        sdma_id = next((i for i in range(engines * self.queues_per_engine) if i not in used),
                       None)
        if sdma_id is None:
            kind = "XGMI SDMA" if xgmi else "SDMA"
            raise DrmError(errno.ENOMEM, f"no more {kind} queues to allocate")
        used.add(sdma_id)
        engine = sdma_id % engines + (self.num_sdma_engines if xgmi else 0)
        return qtype, engine, sdma_id // engines

    def deallocate_sdma_queue(self, qtype: int, engine: int, queue: int) -> None:
        if qtype == KFD_IOC_QUEUE_TYPE_SDMA_XGMI:
            engines, local = self.num_xgmi_engines, engine - self.num_sdma_engines
            self.xgmi_used.discard(queue * engines + local)
        else:
            self.sdma_used.discard(queue * self.num_sdma_engines + engine)


@dataclass(eq=False, slots=True)
class ProcessQueueManager:
    """process_queue_manager: the process's queues by id and its doorbell bitmaps."""

    pid: int
    queues: dict[int, KfdQueue] = field(default_factory=dict)
    doorbells: dict[int, set[int]] = field(default_factory=dict)  # gpu_id -> ids in use

    def find_available_queue_slot(self) -> int:
        qid = next((i for i in range(KFD_MAX_NUM_OF_QUEUES_PER_PROCESS)
                    if i not in self.queues), None)
        if qid is None:
            raise DrmError(errno.ENOMEM, "cannot open more queues for this process")
        return qid

    def allocate_doorbell(self, gpu_id: int, qtype: int, engine: int, queue: int) -> int:
        """allocate_doorbell (SOC15): an SDMA queue's doorbell is fixed by its engine and
        queue (odd queues in the mirror half); a compute queue takes the first free id
        outside the non-CP range (EBUSY when none)."""
        used = self.doorbells.setdefault(gpu_id, set())
        if qtype in SDMA_TYPES:
            did = (SDMA_DOORBELL_BASE + SDMA_DOORBELL_STRIDE * engine
                   + (queue & 1) * KFD_QUEUE_DOORBELL_MIRROR_OFFSET + (queue >> 1))
        else:
            did = next((i for i in range(KFD_MAX_NUM_OF_QUEUES_PER_PROCESS)
                        if i not in used
                        and i % KFD_QUEUE_DOORBELL_MIRROR_OFFSET not in NON_CP_DOORBELLS),
                       -1)
            if did < 0:
                raise DrmError(errno.EBUSY, "no free doorbell for a compute queue")
        used.add(did)
        return did


@dataclass(frozen=True, slots=True)
class QueueArgs:
    """What CREATE_QUEUE asks for once chardev.py checked the arguments."""

    gpu_id: int
    type: int
    ring_base: int
    ring_size: int
    rptr_address: int
    wptr_address: int
    percentage: int
    priority: int
    sdma_engine_id: int = 0
    eop_address: int = 0
    ctx_save_address: int = 0
    ctl_stack_size: int = 0


QueueListener = Callable[[KfdQueue, bool], None]  # (queue, created) -> None


class QueueRegistry:
    """Every user queue of one KFD: the pqm of each process, the dqm of each GPU, and who
    wants to hear of creations and destructions (the engine edge, the tracer)."""

    def __init__(self, profiles: dict[int, DeviceProfile]) -> None:
        self.dqms: dict[int, DeviceQueueManager] = {}
        for gpu_id, profile in profiles.items():
            pcie, xgmi = sdma_engines(profile)
            self.dqms[gpu_id] = DeviceQueueManager(gpu_id, pcie, xgmi)
        self.pqms: dict[int, ProcessQueueManager] = {}
        self.listeners: list[QueueListener] = []
        # told of UPDATE_QUEUE (an inactive queue may become active: look at its doorbell)
        self.updated: list[Callable[[KfdQueue], None]] = []
        # told of a WAIT_EVENTS by a process that has queues, when it comes in: a runtime
        # waits for the work it has just rung for (ROCr: 200 µs of spinning on the signal,
        # then WAIT_EVENTS), so the engine looks at that process's doorbells now rather
        # than at its next poll (the hardware sees a doorbell write at once; the emulator
        # polls for it, every 2-4 ms when quiet)
        self.waiting: list[Callable[[int], None]] = []
        self.created = 0  # since start, for ualinkctl and the abandoned-queue checks

    def pqm(self, pid: int) -> ProcessQueueManager:
        pqm = self.pqms.get(pid)
        if pqm is None:
            pqm = self.pqms[pid] = ProcessQueueManager(pid)
        return pqm

    def all_queues(self) -> list[KfdQueue]:
        return [q for pqm in self.pqms.values() for q in pqm.queues.values()]

    # -- CREATE_QUEUE (pqm_create_queue) -------------------------------------------------------
    def create(self, pid: int, vm: GpuVm, a: QueueArgs) -> KfdQueue:
        """pqm_create_queue after the ioctl's argument checks: the buffers the queue uses
        mapped in the process's GPU VM (kfd_queue_acquire_buffers: EINVAL) (1); a free
        queue slot of the process (find_available_queue_slot: ENOMEM) (2); the device's
        queue count under max_num_of_queues_per_device (create_queue_cpsch: EPERM) (3);
        for SDMA an engine queue (allocate_sdma_queue: ENOMEM) (4); a doorbell
        (allocate_doorbell: EBUSY) (5). The doorbell offset is the process's doorbell
        mmap cookie plus the slot (kfd_ioctl_create_queue). The queue's rptr starts at 0
        (the MQD's); the caller's rptr/wptr words are not written."""
        for what, va, size in (("ring", a.ring_base, a.ring_size),  # 1
                               ("read pointer", a.rptr_address, 8),
                               ("write pointer", a.wptr_address, 8)):
            if va and size and not _mapped(vm, va, size):
                raise DrmError(errno.EINVAL, f"the queue's {what} at {va:#x} (+{size:#x}) "
                                             "is not mapped in the process's GPU VM")
        pqm = self.pqm(pid)
        qid = pqm.find_available_queue_slot()  # 2
        dqm = self.dqms[a.gpu_id]
        if dqm.total_queue_count >= KFD_MAX_NUM_OF_QUEUES_PER_DEVICE:  # 3
            raise DrmError(errno.EPERM, f"{dqm.total_queue_count} queues were already "
                                        "created on this GPU")
        qtype, engine, sdma_queue = a.type, 0, 0
        if a.type in SDMA_TYPES:  # 4
            qtype, engine, sdma_queue = dqm.allocate_sdma_queue(a.type, a.sdma_engine_id)
        try:
            did = pqm.allocate_doorbell(a.gpu_id, qtype, engine, sdma_queue)  # 5
        except DrmError:
            if qtype in SDMA_TYPES:
                dqm.deallocate_sdma_queue(qtype, engine, sdma_queue)
            raise
        cookie = KFD_MMAP_TYPE_DOORBELL | (a.gpu_id & 0xFFFF) << KFD_MMAP_GPU_ID_SHIFT
        q = KfdQueue(pid, a.gpu_id, qid, qtype, a.ring_base, a.ring_size, a.rptr_address,
                     a.wptr_address, a.percentage, a.priority, did,
                     cookie | (did * KFD_DOORBELL_SIZE) % DOORBELL_PROCESS_SLICE, vm,
                     engine, sdma_queue, a.eop_address, a.ctx_save_address, a.ctl_stack_size)
        pqm.queues[qid] = q
        dqm.total_queue_count += 1
        self.created += 1
        for listen in list(self.listeners):
            listen(q, True)
        return q

    # -- the ioctls on a queue that exists ----------------------------------------------------
    def get(self, pid: int, queue_id: int, missing: int) -> KfdQueue:
        """pqm_get_user_queue / get_queue_by_qid: no such queue is `missing`."""
        pqm = self.pqms.get(pid)
        q = pqm.queues.get(queue_id) if pqm is not None else None
        if q is None:
            raise DrmError(missing, f"no queue {queue_id}")
        return q

    def destroy(self, pid: int, queue_id: int) -> KfdQueue:
        """pqm_destroy_queue: no such queue EINVAL; the queue's engine queue, doorbell and
        slot are freed."""
        q = self.get(pid, queue_id, errno.EINVAL)
        self._remove(q)
        return q

    def _remove(self, q: KfdQueue) -> None:
        pqm = self.pqms[q.pid]
        del pqm.queues[q.queue_id]
        pqm.doorbells.get(q.gpu_id, set()).discard(q.doorbell_id)
        dqm = self.dqms[q.gpu_id]
        if q.is_sdma:
            dqm.deallocate_sdma_queue(q.type, q.sdma_engine, q.sdma_queue)
        dqm.total_queue_count -= 1
        if not pqm.queues:
            del self.pqms[q.pid]
        for listen in list(self.listeners):
            listen(q, False)

    def update(self, pid: int, queue_id: int, ring_base: int, ring_size: int,
               percentage: int, priority: int) -> KfdQueue:
        """pqm_update_queue_properties: no such queue EFAULT; the ring, its size, the
        percentage (0 makes the queue inactive) and the priority replaced; a new ring
        must be mapped in the queue's VM as CREATE_QUEUE's was (EINVAL)."""
        q = self.get(pid, queue_id, errno.EFAULT)
        if ring_base and ring_size and not _mapped(q.vm, ring_base, ring_size):
            raise DrmError(errno.EINVAL, f"the new ring at {ring_base:#x} is not mapped")
        if (ring_base, ring_size) != (q.ring_base, q.ring_size):
            # a new ring (update_mqd): the engine is made again on the next doorbell and
            # goes on from the rptr it had (the MQD keeps it)
            q.processor = None
        q.ring_base, q.ring_size = ring_base, ring_size
        q.percentage, q.priority = percentage, priority
        for tell in list(self.updated):
            tell(q)
        return q

    def set_cu_mask(self, pid: int, queue_id: int, mask: bytes) -> None:
        """pqm_update_mqd: no such queue EFAULT; the mask is kept (an SDMA queue's MQD has
        no CU mask: update_mqd_sdma ignores it; no shader runs here to use it)."""
        self.get(pid, queue_id, errno.EFAULT).cu_mask = mask

    def wave_state(self, pid: int, queue_id: int) -> tuple[int, int]:
        """pqm_get_wave_state -> get_wave_state: no such queue EFAULT; only an inactive
        compute queue has its waves saved (else EINVAL); no wave ever runs here, so the
        control stack and save area used are both 0 bytes. Returns the two sizes."""
        q = self.get(pid, queue_id, errno.EFAULT)
        if q.is_sdma or q.state is KfdQueueState.ACTIVE:
            raise DrmError(errno.EINVAL, "only an inactive compute queue has a wave state")
        return 0, 0

    def alloc_gws(self, pid: int, queue_id: int, num_gws: int) -> None:
        """kfd_ioctl_alloc_queue_gws -> pqm_set_gws: no such queue EINVAL; only one queue
        of a process holds the GWS (EBUSY); num_gws 0 gives it back."""
        q = self.get(pid, queue_id, errno.EINVAL)
        if num_gws and any(o.gws for o in self.pqms[pid].queues.values() if o is not q):
            raise DrmError(errno.EBUSY, "another queue of the process holds the GWS")
        q.gws = num_gws != 0

    # -- process end (pqm_uninit) -------------------------------------------------------------
    def process_gone(self, pid: int) -> int:
        """pqm_uninit: every queue of the process destroyed. Returns how many."""
        pqm = self.pqms.get(pid)
        if pqm is None:
            return 0
        queues = list(pqm.queues.values())
        for q in queues:
            self._remove(q)
        return len(queues)


# kfd_events.c: the interrupt path and VM fault reporting
KFD_SIGNAL_EVENT_LIMIT = 4096
UNSIGNALED_EVENT_SLOT = 0xFFFF_FFFF_FFFF_FFFF
KFD_IOC_EVENT_SIGNAL = 0
KFD_IOC_EVENT_MEMORY = 8
KFD_IOC_EVENT_DEBUG_EVENT = 5
SDMA_TRAP_CONTEXT_BITS = 28  # kfd_int_process_v9: the SDMA trap's context id, 28 bits


def event_interrupt(kfd: Kfd, p: KfdProcess, context_id: int) -> int:
    """kfd_signal_event_interrupt(pasid, context_id, 28), what an SDMA TRAP (and an AQL
    signal's mailbox interrupt) raises: the event the id names, if its slot in the events
    page is no longer UNSIGNALED (lookup_signaled_event_by_partial_id); else every event
    whose slot is not UNSIGNALED (the exhaustive search). Each found GPU-signalable event
    has its slot written back UNSIGNALED (acknowledge_signal) and is set, waking its
    WAIT_EVENTS waiters (set_event). The slot values were written by the engine before the
    trap, so they are visible before the wake. Returns how many events were set."""
    page = kfd._events_page(p)
    if page is None:
        return 0
    slots = page.memory.read(0, min(page.size, KFD_SIGNAL_EVENT_LIMIT * 8))

    def signaled(eid: int) -> bool:
        return (eid * 8 + 8 <= len(slots)
                and int.from_bytes(slots[eid * 8 : eid * 8 + 8], "little")
                != UNSIGNALED_EVENT_SLOT)

    eid = context_id & ((1 << SDMA_TRAP_CONTEXT_BITS) - 1)
    found = [p.events[eid]] if eid in p.events and signaled(eid) else [
        ev for i, ev in sorted(p.events.items())
        if i < KFD_SIGNAL_EVENT_LIMIT and signaled(i)]
    n = 0
    for ev in found:
        if ev.type in (KFD_IOC_EVENT_SIGNAL, KFD_IOC_EVENT_DEBUG_EVENT):  # gpu-signalable
            page.memory.write(ev.event_id * 8, UNSIGNALED_EVENT_SLOT.to_bytes(8, "little"))
            kfd._set_event(ev)
            n += 1
    return n


def memory_exception_data(gpu_id: int, va: int) -> bytes:
    """struct kfd_hsa_memory_exception_data (kfd_ioctl.h, 32 bytes) as
    kfd_signal_vm_fault_event fills it for a fault on a page nothing maps: failure
    {NotPresent = 1, ReadOnly, NoExecute, imprecise = 0} @0, the page's address @16, the
    user gpu_id @24, ErrorType 0 (no RAS error) @28."""
    return struct.pack("<4IQII", 1, 0, 0, 0, va & ~(PAGE_SIZE - 1), gpu_id, 0)


def vm_fault(kfd: Kfd, p: KfdProcess, gpu_id: int, va: int, write: bool) -> int:
    """kfd_signal_vm_fault_event: every memory-exception event of the process gets the
    fault's memory_exception_data and is set; WAIT_EVENTS copies the data out to the waiter
    (copy_signaled_event_data), which is how libhsakmt fills HsaMemoryAccessFault and ROCr's
    VM-fault handler learns of it. Returns how many events were set."""
    n = 0
    data = memory_exception_data(gpu_id, va)
    for ev in list(p.events.values()):
        if ev.type == KFD_IOC_EVENT_MEMORY:
            ev.memory_exception_data = data
            kfd._set_event(ev)
            n += 1
    return n


def _mapped(vm: GpuVm, va: int, size: int) -> bool:
    """Every byte of [va, va + size) is inside some mapping of the VM."""
    end = va + size
    while va < end:
        m = vm.lookup(va)
        if m is None:
            return False
        va = m.end
    return True
