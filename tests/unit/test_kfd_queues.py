"""The KFD's user queues (issue 30 item 1): kfd_ioctl_create_queue's argument checks
(set_queue_properties_from_user) in the kernel's order, then pqm_create_queue's limits and
errnos (queues.py), the doorbell offset as kfd_ioctl_create_queue encodes it, and the ioctls
on a queue that exists; a process that goes loses its queues (pqm_uninit)."""

from __future__ import annotations

import errno
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st_
from test_kfd_rules import CALLER, call, memory_node

from ualinkd.abi import ioctls as tbl
from ualinkd.abi import structs as st
from ualinkd.amdgpu.profile import MI300X
from ualinkd.amdkfd import chardev, queues
from ualinkd.drm.device import Caller
from ualinkd.drm.errors import DrmError

# A GTT allocation mapped on the first GPU holds the rings and the pointer words.
BASE = 1 << 32
RING, RPTR, WPTR = BASE, BASE + (1 << 20), BASE + (1 << 20) + 8
KERNEL_ADDR = 0xFFFF_8880_0000_0000
SDMA, AQL, XGMI, BY_ENG = 1, 2, 3, 4


def mapped_node(accels: int = 2):
    """memory_node with 2 MiB of GTT at BASE mapped on the first GPU."""
    node, p, ids, files, mem = memory_node(accels)
    res = call(node, p, tbl.KFD_ALLOC_MEMORY_OF_GPU.cmd, struct.pack(
        "<QQQQII", BASE, 2 << 20, 0, 0, ids[0],
        chardev.ALLOC_MEM_FLAGS_GTT | chardev.ALLOC_MEM_FLAGS_WRITABLE))
    assert res.result == 0
    handle = st.KFD_ALLOC_MEMORY_OF_GPU.decode(res.out).handle
    mem.arrays[0x100] = struct.pack("<I", ids[0])
    res = call(node, p, tbl.KFD_MAP_MEMORY_TO_GPU.cmd, struct.pack("<QQII", handle, 0x100, 1, 0))
    assert res.result == 0
    return node, p, ids, files, mem


def create_args(gpu: int, **kw: int) -> bytes:
    f = dict(ring_base_address=RING, write_pointer_address=WPTR, read_pointer_address=RPTR,
             doorbell_offset=0, ring_size=4096, gpu_id=gpu, queue_type=AQL,
             queue_percentage=100, queue_priority=7, queue_id=0, eop_buffer_address=0,
             eop_buffer_size=0, ctx_save_restore_address=0, ctx_save_restore_size=0,
             ctl_stack_size=0, sdma_engine_id=0, pad=0)
    f.update(kw)
    return st.KFD_CREATE_QUEUE.encode(st.KfdCreateQueue(**f))


def create(node, p, gpu: int, **kw: int) -> tuple[int, st.KfdCreateQueue]:
    res = call(node, p, tbl.KFD_CREATE_QUEUE.cmd, create_args(gpu, **kw))
    return res.result, st.KFD_CREATE_QUEUE.decode(res.out)


def destroy(node, p, qid: int) -> int:
    return call(node, p, tbl.KFD_DESTROY_QUEUE.cmd, struct.pack("<II", qid, 0)).result


def test_create_queue_checks_its_arguments_then_creates():
    """set_queue_properties_from_user, in order: percentage (bits 0-7) > 100 and priority >
    15 EINVAL, a kernel ring address EFAULT, a ring size not a power of 2 EINVAL, read /
    write pointer and (given) EOP / CWSR addresses EFAULT, an unknown type ENOTSUPP (524);
    then an unknown gpu_id EINVAL, a GPU without an acquired VM ESRCH, an SDMA_BY_ENG_ID
    engine the GPU lacks EINVAL; a ring or pointer not mapped in the process's GPU VM
    EINVAL (kfd_queue_acquire_buffers); a valid request creates the queue."""
    node, p, (g0, g1), _, _ = mapped_node()
    cases = [
        (dict(queue_percentage=101), -errno.EINVAL),
        (dict(queue_priority=16), -errno.EINVAL),
        (dict(ring_base_address=KERNEL_ADDR), -errno.EFAULT),
        (dict(ring_size=3000), -errno.EINVAL),
        (dict(read_pointer_address=KERNEL_ADDR), -errno.EFAULT),
        (dict(write_pointer_address=KERNEL_ADDR), -errno.EFAULT),
        (dict(eop_buffer_address=KERNEL_ADDR), -errno.EFAULT),
        (dict(ctx_save_restore_address=KERNEL_ADDR), -errno.EFAULT),
        (dict(queue_type=5), -chardev.ENOTSUPP),
        (dict(queue_type=BY_ENG, sdma_engine_id=16), -errno.EINVAL),  # mi300x: 16 engines
        (dict(gpu_id=0xBEEF), -errno.EINVAL),
        (dict(queue_percentage=101, gpu_id=0xBEEF), -errno.EINVAL),  # args before gpu_id
        (dict(queue_type=9, gpu_id=0xBEEF), -chardev.ENOTSUPP),
        (dict(ring_base_address=BASE + (4 << 20)), -errno.EINVAL),  # ring not mapped
        (dict(ring_base_address=BASE + (2 << 20) - 2048), -errno.EINVAL),  # runs past it
        (dict(read_pointer_address=BASE - 8), -errno.EINVAL),
        (dict(gpu_id=g1), -errno.EINVAL),  # nothing mapped in the second GPU's VM
    ]
    for kw, want in cases:
        res, out = create(node, p, g0, **kw)
        assert res == want, (kw, res)
        assert out.queue_id == 0 and out.doorbell_offset == 0
    assert node.kfd.queues.all_queues() == []
    q = node.kfd.open(Caller(pid=77, uid=0))  # acquired no VM: kfd_bind_process_to_device
    assert create(node, q, g0)[0] == -errno.ESRCH
    res, out = create(node, p, g0, queue_percentage=0x3_64)  # pm4_target_xcc in bits 8-15
    assert res == 0
    # libhsakmt 5.2.3's 88-byte struct (before sdma_engine_id): zero-extended, answered
    cmd = tbl.KFD_CREATE_QUEUE.cmd
    old = (cmd & ~(0x3FFF << 16)) | (st.KFD_CREATE_QUEUE_SIZE_1_16 << 16)
    r = call(node, p, old, create_args(g0, queue_type=SDMA)[:88])
    assert r.result == 0 and len(r.out) == 88
    assert struct.unpack_from("<I", r.out, 52)[0] == 1  # the second queue id
    # ring base 0 / size 0 is allowed and makes an inactive queue (QUEUE_IS_ACTIVE)
    res, out = create(node, p, g0, ring_base_address=0, ring_size=0)
    assert res == 0
    assert node.kfd.queues.get(p.pid, out.queue_id, 0).state is queues.KfdQueueState.INACTIVE


def test_doorbell_offsets_are_the_slice_cookie_plus_an_8_byte_slot():
    """kfd_ioctl_create_queue: doorbell_offset = KFD_MMAP_TYPE_DOORBELL | gpu_id << 46 |
    the doorbell's byte offset in the process's slice; SDMA doorbells by engine and queue
    (allocate_doorbell, odd queues in the mirror half), compute ones outside the non-CP
    range; queue ids the lowest free slot; the slice is what mmap(kfd fd, cookie) maps."""
    node, p, (g0, _), _, _ = mapped_node()
    offsets, ids = [], []
    for t in (SDMA, SDMA, SDMA, AQL, XGMI, 0):
        res, out = create(node, p, g0, queue_type=t)
        assert res == 0
        offsets.append(out.doorbell_offset)
        ids.append(out.queue_id)
    assert ids == [0, 1, 2, 3, 4, 5]
    cookie = queues.KFD_MMAP_TYPE_DOORBELL | g0 << queues.KFD_MMAP_GPU_ID_SHIFT
    slots = [o - cookie for o in offsets]
    assert all(0 <= s < chardev.DOORBELL_PROCESS_SLICE and s % 8 == 0 for s in slots)
    assert len(set(slots)) == len(slots)
    # sdma_id 0, 1, 2: engine 0 queue 0, engine 1 queue 0, engine 0 queue 1 (mirror)
    assert slots[:3] == [0x100 * 8, 0x10A * 8, (0x100 + 512) * 8]
    assert slots[3] == 0 and slots[5] == 8  # compute: the first free ids
    assert slots[4] == (0x100 + 0xA * 2) * 8  # the first xGMI engine is engine 2
    bo, off = node.kfd.mmap_target(CALLER, cookie, chardev.DOORBELL_PROCESS_SLICE)
    assert bo is p.pdds[g0].doorbell_bo and off == 0


def test_sdma_queue_limits_come_from_the_topology():
    """allocate_sdma_queue: num_sdma_engines x num_sdma_queues_per_engine PCIe SDMA queues
    (2 x 8 on mi300x), num_sdma_xgmi_engines x 8 xGMI ones, device-wide (a second
    process shares them), the next ENOMEM; SDMA_BY_ENG_ID the named engine's 8 queues;
    a destroyed queue's engine queue is free again."""
    node, p, (g0, _), _, _ = mapped_node()
    dqm = node.kfd.queues.dqms[g0]
    assert (dqm.num_sdma_engines, dqm.num_xgmi_engines) == (2, 14)
    made = [create(node, p, g0, queue_type=BY_ENG, sdma_engine_id=1) for _ in range(8)]
    assert all(r == 0 for r, _ in made)
    assert {node.kfd.queues.get(p.pid, o.queue_id, 0).sdma_engine for _, o in made} == {1}
    assert create(node, p, g0, queue_type=BY_ENG, sdma_engine_id=1)[0] == -errno.ENOMEM
    for _ in range(8):  # engine 0's eight are left for plain SDMA
        assert create(node, p, g0, queue_type=SDMA)[0] == 0
    assert create(node, p, g0, queue_type=SDMA)[0] == -errno.ENOMEM
    for _ in range(14 * 8):
        assert create(node, p, g0, queue_type=XGMI)[0] == 0
    assert create(node, p, g0, queue_type=XGMI)[0] == -errno.ENOMEM
    assert create(node, p, g0, queue_type=BY_ENG, sdma_engine_id=5)[0] == -errno.ENOMEM
    assert destroy(node, p, made[3][1].queue_id) == 0
    res, out = create(node, p, g0, queue_type=SDMA)
    assert res == 0 and out.queue_id == made[3][1].queue_id  # the freed slot and queue
    assert node.kfd.queues.get(p.pid, out.queue_id, 0).sdma_engine == 1


def test_compute_doorbells_and_the_device_limit(monkeypatch):
    """A process has 610 compute doorbells (1024 minus the non-CP range 0x100-0x1CE and its
    mirror):
    the next compute queue EBUSY (allocate_doorbell); the device's queue count at
    max_num_of_queues_per_device is EPERM for every type (create_queue_cpsch)."""
    node, p, (g0, _), _, _ = mapped_node()
    compute = 1024 - 2 * len(queues.NON_CP_DOORBELLS)
    assert compute == 610
    for _ in range(compute):
        assert create(node, p, g0)[0] == 0
    assert create(node, p, g0)[0] == -errno.EBUSY
    assert create(node, p, g0, queue_type=SDMA)[0] == 0  # SDMA doorbells are reserved
    monkeypatch.setattr(queues, "KFD_MAX_NUM_OF_QUEUES_PER_DEVICE", compute + 1)
    assert create(node, p, g0, queue_type=SDMA)[0] == -errno.EPERM
    assert node.kfd.queues.dqms[g0].sdma_used == {0}  # the refused one took nothing


def test_ioctls_on_queues_that_exist_and_queues_that_do_not():
    """DESTROY no such queue EINVAL; UPDATE_QUEUE's checks then EFAULT for no queue, else
    the ring, size, percentage (0 = inactive) and priority replaced, a new ring mapped
    (EINVAL); SET_CU_MASK's checks, the mask read, EFAULT for no queue, kept otherwise;
    GET_QUEUE_WAVE_STATE EFAULT for no queue, EINVAL for an SDMA or active queue, zero
    sizes for an inactive compute queue; ALLOC_QUEUE_GWS EINVAL for no queue, one queue
    of the process holds it (EBUSY)."""
    node, p, (g0, _), _, mem = mapped_node()
    assert destroy(node, p, 0) == -errno.EINVAL
    _, aql = create(node, p, g0)
    _, sdma = create(node, p, g0, queue_type=SDMA)
    upd = tbl.KFD_UPDATE_QUEUE.cmd

    def update(qid, ring=RING, size=4096, pct=50, prio=1):
        return call(node, p, upd, struct.pack("<QIIII", ring, qid, size, pct, prio)).result

    assert update(aql.queue_id, pct=101) == -errno.EINVAL
    assert update(aql.queue_id, pct=0x164) == -errno.EINVAL  # the whole u32 is checked
    assert update(aql.queue_id, prio=16) == -errno.EINVAL
    assert update(aql.queue_id, ring=KERNEL_ADDR) == -errno.EFAULT
    assert update(aql.queue_id, size=4095) == -errno.EINVAL
    assert update(9) == -errno.EFAULT
    assert update(aql.queue_id, ring=BASE + (8 << 20)) == -errno.EINVAL
    assert update(aql.queue_id, ring=RING + 8192, size=8192, pct=0, prio=3) == 0
    q = node.kfd.queues.get(p.pid, aql.queue_id, 0)
    assert (q.ring_base, q.ring_size, q.percentage, q.priority) == (RING + 8192, 8192, 0, 3)
    assert q.state is queues.KfdQueueState.INACTIVE
    cu = tbl.KFD_SET_CU_MASK.cmd
    assert call(node, p, cu, struct.pack("<IIQ", 0, 0, 0x300)).result == -errno.EINVAL
    assert call(node, p, cu, struct.pack("<IIQ", 0, 33, 0x300)).result == -errno.EINVAL
    assert call(node, p, cu, struct.pack("<IIQ", 0, 64, 0x999)).result == -errno.EFAULT
    mem.arrays[0x300] = b"\x0f" * 8
    assert call(node, p, cu, struct.pack("<IIQ", 9, 64, 0x300)).result == -errno.EFAULT
    assert call(node, p, cu, struct.pack("<IIQ", aql.queue_id, 64, 0x300)).result == 0
    assert q.cu_mask == b"\x0f" * 8
    wave = tbl.KFD_GET_QUEUE_WAVE_STATE.cmd

    def wave_state(qid):
        return call(node, p, wave, struct.pack("<QIIII", 0, 7, 7, qid, 0))

    assert wave_state(9).result == -errno.EFAULT
    assert wave_state(sdma.queue_id).result == -errno.EINVAL
    r = wave_state(aql.queue_id)  # inactive now
    assert r.result == 0 and struct.unpack("<QIIII", r.out)[1:3] == (0, 0)
    assert update(aql.queue_id, ring=RING, pct=100) == 0
    assert wave_state(aql.queue_id).result == -errno.EINVAL
    gws = tbl.KFD_ALLOC_QUEUE_GWS.cmd
    assert call(node, p, gws, struct.pack("<IIII", 9, 1, 5, 0)).result == -errno.EINVAL
    r = call(node, p, gws, struct.pack("<IIII", aql.queue_id, 1, 5, 0))
    assert r.result == 0 and struct.unpack("<IIII", r.out)[2] == 0
    assert call(node, p, gws, struct.pack("<IIII", sdma.queue_id, 1, 0, 0)).result \
        == -errno.EBUSY
    assert destroy(node, p, aql.queue_id) == 0
    assert destroy(node, p, aql.queue_id) == -errno.EINVAL
    assert wave_state(aql.queue_id).result == -errno.EFAULT


def test_xnack_and_runtime_enable_refuse_a_process_with_queues():
    """kfd_ioctl_set_xnack_mode: EBUSY while the process has queues (a query still
    answers); runtime_enable: EEXIST while it has queues."""
    node, p, (g0, _), _, _ = mapped_node()
    _, out = create(node, p, g0, queue_type=SDMA)
    xnack = tbl.KFD_SET_XNACK_MODE.cmd
    assert call(node, p, xnack, struct.pack("<i", 1)).result == -errno.EBUSY
    assert call(node, p, xnack, struct.pack("<i", -1)).result == 0
    rt = tbl.KFD_RUNTIME_ENABLE.cmd
    assert call(node, p, rt, struct.pack("<QII", 0, 1, 0)).result == -errno.EEXIST
    assert destroy(node, p, out.queue_id) == 0
    assert call(node, p, xnack, struct.pack("<i", 1)).result == 0


@pytest.mark.parametrize("abandon", [True, False])
def test_a_process_that_goes_leaves_no_queue(abandon: bool):
    """pqm_uninit at the last close: every queue of the process destroyed, its SDMA
    queues back to the device, the listeners told. 1000 queues created and destroyed, or
    created to the limits and abandoned, leave nothing."""
    node, p, (g0, _), _, _ = mapped_node()
    seen: list[tuple[int, bool]] = []
    node.kfd.queues.listeners.append(lambda q, created: seen.append((q.queue_id, created)))
    made = 0
    for i in range(1000):
        res, out = create(node, p, g0, queue_type=(SDMA, AQL, XGMI)[i % 3])
        if abandon:  # until the process's doorbells and the GPU's SDMA queues run out
            assert res in (0, -errno.ENOMEM, -errno.EBUSY)
        else:
            assert res == 0 and destroy(node, p, out.queue_id) == 0
        made += res == 0
    assert node.kfd.queues.created == made
    assert made == (333 + 16 + 112 if abandon else 1000)
    other = node.kfd.open(Caller(pid=5151, uid=0))
    node.kfd.release(p)
    assert node.kfd.queues.pqms == {}
    assert node.kfd.queues.dqms[g0].total_queue_count == 0
    assert node.kfd.queues.dqms[g0].sdma_used == set()
    assert sum(1 for _, c in seen if c) == sum(1 for _, c in seen if not c) == made
    node.kfd.release(other)


class _NoVm:
    """A GPU VM that maps everything (the registry's own rules are under test here)."""

    def lookup(self, va: int):
        class M:
            end = 1 << 64
        return M()


@settings(max_examples=60, deadline=None)
@given(st_.lists(st_.tuples(st_.sampled_from(["create", "destroy", "exit"]),
                            st_.integers(0, 2),  # which process
                            st_.sampled_from([0, SDMA, AQL, XGMI, BY_ENG]),
                            st_.integers(0, 15)),  # engine / which queue to destroy
                 max_size=120))
def test_queue_registry_invariants(ops):
    """Any interleaving of CREATE (every type), DESTROY and process exits over three
    processes keeps the managers consistent: queue ids and doorbells unique within a
    process, the device's queue count and SDMA bitmaps exactly those of live queues, an
    SDMA doorbell fixed by (engine, queue), every refusal one of the kernel's errnos with
    nothing taken; after every process is gone nothing is left."""
    reg = queues.QueueRegistry({1: MI300X})
    vm = _NoVm()
    for op, pid, qtype, n in ops:
        if op == "create":
            dqm = reg.dqms[1]
            before = (dqm.total_queue_count, set(dqm.sdma_used), set(dqm.xgmi_used))
            try:
                reg.create(pid, vm, queues.QueueArgs(1, qtype, RING, 4096, RPTR, WPTR, 100,
                                                     15, n))  # type: ignore[arg-type]
            except DrmError as e:
                assert e.errno in (errno.ENOMEM, errno.EBUSY, errno.EPERM)
                assert before == (dqm.total_queue_count, dqm.sdma_used, dqm.xgmi_used)
        elif op == "destroy":
            live = sorted(reg.pqms[pid].queues) if pid in reg.pqms else []
            qid = live[n % len(live)] if live else n
            try:
                reg.destroy(pid, qid)
            except DrmError as e:
                assert e.errno == errno.EINVAL and not live
        else:
            reg.process_gone(pid)
        live_qs = reg.all_queues()
        dqm = reg.dqms[1]
        assert dqm.total_queue_count == len(live_qs)
        sdma = [q for q in live_qs if q.type == SDMA]
        xgmi = [q for q in live_qs if q.type == XGMI]
        assert {q.sdma_queue * 2 + q.sdma_engine for q in sdma} == dqm.sdma_used
        assert {q.sdma_queue * 14 + q.sdma_engine - 2 for q in xgmi} == dqm.xgmi_used
        for pqm in reg.pqms.values():
            qs = list(pqm.queues.values())
            assert len({q.doorbell_id for q in qs}) == len(qs)
            assert pqm.doorbells[1] == {q.doorbell_id for q in qs}
            for q in qs:
                assert q.doorbell_offset & 0x1FFF == q.doorbell_slot
                if q.is_sdma:
                    assert q.doorbell_id == (0x100 + 0xA * q.sdma_engine
                                             + (q.sdma_queue & 1) * 512 + (q.sdma_queue >> 1))
                else:
                    assert q.doorbell_id % 512 not in queues.NON_CP_DOORBELLS
    for pid in range(3):
        reg.process_gone(pid)
    assert reg.pqms == {} and reg.dqms[1].total_queue_count == 0
    assert reg.dqms[1].sdma_used == set() == reg.dqms[1].xgmi_used
