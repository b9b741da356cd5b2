"""The KFD's queue ioctls on a GPU with no hardware queue to give (issue 14 item 3: "the
queue ioctls answer as a KFD without free queues would"): kfd_ioctl_create_queue's argument
checks (set_queue_properties_from_user) in the kernel's order, then the device queue
manager's limit (EPERM); the ioctls that name a queue id find none (pqm_* lookups)."""

from __future__ import annotations

import errno
import struct

from test_kfd_rules import CALLER, call, memory_node

from ualinkd.abi import ioctls as tbl
from ualinkd.abi import structs as st
from ualinkd.amdkfd import chardev
from ualinkd.drm.device import Caller

RING, RPTR, WPTR = 0x7F00_0000_0000, 0x7F00_0001_0000, 0x7F00_0001_0008
KERNEL_ADDR = 0xFFFF_8880_0000_0000


def create_args(gpu: int, **kw: int) -> bytes:
    f = dict(ring_base_address=RING, write_pointer_address=WPTR, read_pointer_address=RPTR,
             doorbell_offset=0, ring_size=4096, gpu_id=gpu, queue_type=2,
             queue_percentage=100, queue_priority=7, queue_id=0, eop_buffer_address=0,
             eop_buffer_size=0, ctx_save_restore_address=0, ctx_save_restore_size=0,
             ctl_stack_size=0, sdma_engine_id=0, pad=0)
    f.update(kw)
    return st.KFD_CREATE_QUEUE.encode(st.KfdCreateQueue(**f))


def test_create_queue_checks_its_arguments_then_finds_no_free_queue():
    """set_queue_properties_from_user, in order: percentage (bits 0-7) > 100 and priority >
    15 EINVAL, a kernel ring address EFAULT, a ring size not a power of 2 EINVAL, read /
    write pointer and (given) EOP / CWSR addresses EFAULT, an unknown type ENOTSUPP (524);
    then an unknown gpu_id EINVAL, a GPU without an acquired VM ESRCH; a valid request on a
    bound GPU EPERM (the DQM's queue limit), with nothing allocated on the node."""
    node, p, (g0, _), _, _ = memory_node()
    cmd = tbl.KFD_CREATE_QUEUE.cmd
    assert cmd == 0xC0604B02  # _IOWR('K', 2, 96): kfd_ioctl.h 1.17
    cases = [
        (dict(queue_percentage=101), -errno.EINVAL),
        (dict(queue_percentage=0x3_64), -errno.EPERM),  # pm4_target_xcc in bits 8-15
        (dict(queue_priority=16), -errno.EINVAL),
        (dict(ring_base_address=KERNEL_ADDR), -errno.EFAULT),
        (dict(ring_base_address=0), -errno.EPERM),
        (dict(ring_size=3000), -errno.EINVAL),
        (dict(ring_size=0), -errno.EPERM),
        (dict(read_pointer_address=KERNEL_ADDR), -errno.EFAULT),
        (dict(write_pointer_address=KERNEL_ADDR), -errno.EFAULT),
        (dict(eop_buffer_address=KERNEL_ADDR), -errno.EFAULT),
        (dict(ctx_save_restore_address=KERNEL_ADDR), -errno.EFAULT),
        (dict(queue_type=5), -chardev.ENOTSUPP),
        (dict(queue_type=4), -errno.EPERM),  # SDMA_BY_ENG_ID, new in 1.17
        (dict(queue_type=4, sdma_engine_id=15), -errno.EPERM),  # mi300x: 16 engines
        (dict(queue_type=4, sdma_engine_id=16), -errno.EINVAL),
        (dict(queue_type=2, sdma_engine_id=16), -errno.EPERM),  # ignored for compute
        (dict(gpu_id=0xBEEF), -errno.EINVAL),
        (dict(queue_percentage=101, gpu_id=0xBEEF), -errno.EINVAL),  # args before gpu_id
        (dict(queue_type=9, gpu_id=0xBEEF), -chardev.ENOTSUPP),
        ({}, -errno.EPERM),
    ]
    for kw, want in cases:
        res = call(node, p, cmd, create_args(g0, **kw))
        assert res.result == want, (kw, res.result)
        assert st.KFD_CREATE_QUEUE.decode(res.out).queue_id == 0
    q = node.kfd.open(Caller(pid=77, uid=0))  # acquired no VM: kfd_bind_process_to_device
    assert call(node, q, cmd, create_args(g0)).result == -errno.ESRCH
    # libhsakmt 5.2.3's 88-byte struct (before sdma_engine_id): zero-extended, same answer
    old = (cmd & ~(0x3FFF << 16)) | (st.KFD_CREATE_QUEUE_SIZE_1_16 << 16)
    res = call(node, p, old, create_args(g0)[:88])
    assert res.result == -errno.EPERM and len(res.out) == 88
    for dev in node.devices.values():
        assert dev.objects == {}
        assert dev.driver.gtt.used == 0 and dev.driver.vram.used == 0


def test_queue_ids_name_no_queue():
    """pqm_destroy_queue EINVAL; kfd_ioctl_update_queue's checks (whole percentage,
    priority, ring base, ring size) then pqm_update_queue_properties EFAULT; set_cu_mask:
    num_cu_mask 0 or not a multiple of 32 EINVAL, the mask read (EFAULT), then EFAULT;
    pqm_get_wave_state EFAULT; alloc_queue_gws EINVAL."""
    node, p, _, _, mem = memory_node()
    destroy = call(node, p, tbl.KFD_DESTROY_QUEUE.cmd, struct.pack("<II", 0, 0))
    assert destroy.result == -errno.EINVAL
    upd = tbl.KFD_UPDATE_QUEUE.cmd
    assert call(node, p, upd, struct.pack("<QIIII", RING, 0, 4096, 101, 0)).result \
        == -errno.EINVAL
    assert call(node, p, upd, struct.pack("<QIIII", RING, 0, 4096, 0x164, 0)).result \
        == -errno.EINVAL  # no pm4_target_xcc here: the whole u32 is the percentage
    assert call(node, p, upd, struct.pack("<QIIII", RING, 0, 4096, 50, 16)).result \
        == -errno.EINVAL
    assert call(node, p, upd, struct.pack("<QIIII", KERNEL_ADDR, 0, 4096, 50, 1)).result \
        == -errno.EFAULT
    assert call(node, p, upd, struct.pack("<QIIII", RING, 0, 4095, 50, 1)).result \
        == -errno.EINVAL
    assert call(node, p, upd, struct.pack("<QIIII", RING, 0, 4096, 50, 1)).result \
        == -errno.EFAULT
    cu = tbl.KFD_SET_CU_MASK.cmd
    assert call(node, p, cu, struct.pack("<IIQ", 0, 0, 0x300)).result == -errno.EINVAL
    assert call(node, p, cu, struct.pack("<IIQ", 0, 33, 0x300)).result == -errno.EINVAL
    mem.arrays[0x300] = b"\xff" * 128
    assert call(node, p, cu, struct.pack("<IIQ", 0, 64, 0x300)).result == -errno.EFAULT
    wave = call(node, p, tbl.KFD_GET_QUEUE_WAVE_STATE.cmd, struct.pack("<QIIII", 0, 0, 0, 0, 0))
    assert wave.result == -errno.EFAULT
    gws = call(node, p, tbl.KFD_ALLOC_QUEUE_GWS.cmd, struct.pack("<IIII", 0, 1, 0, 0))
    assert gws.result == -errno.EINVAL


def test_queue_layouts():
    assert st.KFD_CREATE_QUEUE.size == 96
    assert (st.KFD_DESTROY_QUEUE.size, st.KFD_UPDATE_QUEUE.size, st.KFD_SET_CU_MASK.size,
            st.KFD_GET_QUEUE_WAVE_STATE.size, st.KFD_ALLOC_QUEUE_GWS.size) == (8, 24, 16, 24, 16)
    assert CALLER.pid != 77
