"""AMDGPU_INFO, DRM_IOCTL_VERSION, GET_CAP and the CTX / VM stubs, sans-IO (userspace-surface
§2.2, §2.5, §5, §7 items 4, 5, 8, 9; amdgpu_info_ioctl, drm_version, drm_getcap,
amdgpu_ctx_ioctl, amdgpu_vm_ioctl). Answers written to the caller's memory are what the
injected copy_to_user records."""

from __future__ import annotations

import errno
import struct

import pytest
from ualink_testkit import (
    CALLER,
    GET_CAP,
    MIB,
    CopyToUserFake,
    device,
    gem_create,
    make_node,
    open_file,
    pod_config,
    run,
)
from ualink_testkit import ioctl as raw_ioctl

from ualinkd.abi import structs as st
from ualinkd.abi.ioc import IOC_READ, IOC_WRITE, ioc, iow, iowr
from ualinkd.amdgpu import info as inf
from ualinkd.amdgpu import vm
from ualinkd.drm.device import Caller

INFO = iow(0x45, 32)
VERSION = iowr(0x00, 64)
CTX = iowr(0x42, 16)
VM = iowr(0x53, 8)
PTR = 0x7F00_0000_1000
ROOT = Caller(pid=4242, uid=0)


def ioctl(f, cmd: int, data: bytes, caller: Caller = CALLER):
    """An ioctl run to its result: its copy to the caller's memory is an awaitable (the
    daemon's is bounded, callermem.py) that the fake finishes at once."""
    return run(raw_ioctl(f, cmd, data, caller))


@pytest.fixture
def mem() -> CopyToUserFake:
    return CopyToUserFake()


@pytest.fixture
def core(mem):
    return make_node(copy_to_user=mem)


@pytest.fixture
def f(core):
    return open_file(core)


def info_raw(f, query: int, size: int = 4096, ptr: int = PTR, args=(0, 0, 0, 0),
             caller: Caller = CALLER):
    return ioctl(f, INFO, st.INFO.encode(st.AmdgpuInfo(ptr, size, query, tuple(args))), caller)


def info(f, mem, query: int, size: int = 4096, args=(0, 0, 0, 0)) -> bytes:
    """The bytes the query wrote to the caller's memory (one write)."""
    before = len(mem.writes)
    r = info_raw(f, query, size, args=args)
    assert r.result == 0, r
    assert r.out == b""  # DRM_IOW: the request is never copied back
    assert len(mem.writes) == before + 1
    pid, addr, data = mem.writes[-1]
    assert (pid, addr) == (CALLER.pid, PTR)
    return data


# ---- the rules every query shares ------------------------------------------------------------


@pytest.mark.parametrize("size, ptr", [(0, PTR), (4, 0), (0, 0)])
def test_zero_size_or_null_pointer_is_einval_before_the_query(f, mem, size, ptr):
    """amdgpu_info_ioctl step 1: return_size 0 or return_pointer NULL → EINVAL, for a valid
    query and an unknown one alike, and nothing is written."""
    for query in (inf.ACCEL_WORKING, 0x7F):
        assert info_raw(f, query, size, ptr).result == -errno.EINVAL
    assert mem.writes == []


@pytest.mark.parametrize("query", [0x01, 0x04, 0x20, 0x21, 0x23, 0x7F, 0xFFFFFFFF])
def test_unknown_or_unanswered_query_is_einval(f, mem, query):
    """The switch's default: EINVAL, nothing written (CRTC_FROM_ID finds no CRTC)."""
    assert info_raw(f, query).result == -errno.EINVAL
    assert mem.writes == []


@pytest.mark.parametrize("query", [inf.NUM_BYTES_MOVED, inf.NUM_EVICTIONS,
                                   inf.NUM_VRAM_CPU_PAGE_FAULTS])
def test_ttm_counters_are_zero(f, mem, query):
    """amdgpu_info_ioctl: NUM_BYTES_MOVED, NUM_EVICTIONS and NUM_VRAM_CPU_PAGE_FAULTS are the
    device's atomic64 counters, copied min(size, 8u): 0 here (nothing moves or faults)."""
    assert info(f, mem, query) == bytes(8)
    assert info(f, mem, query, size=3) == bytes(3)


@pytest.mark.parametrize("size, expect", [(1, 1), (2, 2), (4, 4), (5, 4), (4096, 4)])
def test_copy_is_min_of_return_size_and_answer(f, mem, size, expect):
    """copy_to_user(out, &ui32, min(size, 4u)): ACCEL_WORKING is 1, cut to return_size."""
    assert info(f, mem, inf.ACCEL_WORKING, size) == struct.pack("<I", 1)[:expect]


def test_a_faulting_return_pointer_is_efault(f, mem):
    """Step 3: a copy_to_user that fails → EFAULT (the request itself is not copied back)."""
    mem.fault = True
    r = info_raw(f, inf.DEV_INFO)
    assert (r.result, r.out) == (-errno.EFAULT, b"")


def test_without_user_memory_access_is_efault():
    """No copy_to_user injected (no access to the caller): EFAULT, never a fake answer."""
    f = open_file(make_node())
    assert info_raw(f, inf.ACCEL_WORKING).result == -errno.EFAULT


# ---- DEV_INFO --------------------------------------------------------------------------------


def test_dev_info_448_and_libdrm_2_4_114s_368(f, mem):
    """§5: 448 bytes for a current caller; libdrm 2.4.114 asks 368 and gets exactly the
    first 368 bytes of the same answer."""
    full = info(f, mem, inf.DEV_INFO, 448)
    assert len(full) == st.INFO_DEVICE.size == 448
    assert info(f, mem, inf.DEV_INFO, 4096) == full
    assert info(f, mem, inf.DEV_INFO, 368) == full[:368]


def test_dev_info_values_match_the_gpu_vm_and_the_profile(f, mem):
    """§2.2 table: MI300X identity and the VA limits of vm.py (RESERVED_BOTTOM, the GMC
    hole, the reserved top), which are the literal values libdrm's VA managers expect."""
    d = st.INFO_DEVICE.decode(info(f, mem, inf.DEV_INFO, 448))
    assert (d.device_id, d.family, d.pci_rev, d.chip_rev) == (0x74A1, 141, 0, 0)
    assert d.virtual_address_offset == vm.VA_RESERVED_BOTTOM == 0x10000
    assert d.virtual_address_max == 0x8000_0000_0000 == vm.GMC_HOLE_START
    assert d.high_va_offset == 0xFFFF_8000_0000_0000 == vm.GMC_HOLE_END
    assert d.high_va_max == 0xFFFF_FFFF_FFBF_E000
    assert d.high_va_max & vm.GMC_HOLE_MASK == vm.VM_SIZE - vm.VA_RESERVED_TOP
    assert (d.virtual_address_alignment, d.pte_fragment_size, d.gart_page_size) == (
        4096, 2 << 20, 4096)
    assert (d.cu_active_number, d.num_shader_engines, d.wave_front_size) == (304, 32, 64)
    assert (d.vram_type, d.vram_bit_width) == (6, 8192)
    assert d.ids_flags == inf.AMDGPU_IDS_FLAGS_GANG_SUBMIT  # not an APU, not a VF
    assert sum(bin(m).count("1") for m in d.cu_bitmap) == 304 // 8  # one XCC's CUs


def test_a_gem_va_at_dev_infos_limits_is_accepted(core, f, mem):
    """What DEV_INFO advertises is what GEM_VA takes: a 2 MiB mapping ending at
    virtual_address_max and one at high_va_max both map (§2.6)."""
    d = st.INFO_DEVICE.decode(info(f, mem, inf.DEV_INFO, 448))
    h = gem_create(f, 4 << 20)
    for end in (d.virtual_address_max, d.high_va_max):
        va = st.GemVa(h, 0, 1, 6, end - (2 << 20), 0, 2 << 20, 0, 0, 0, 0)
        r = ioctl(f, iow(0x48, 64), st.GEM_VA.encode(va))
        assert r.result == 0, hex(end)


def test_profile_chosen_per_accel_in_the_pod():
    """The pod TOML's `profile`: an MI300A accel reports 0x74a0 and the APU flag."""
    mem = CopyToUserFake()
    core = make_node(pod_config(nodes=[[{"id": 0}, {"id": 1, "profile": "mi300a"}]]),
                     copy_to_user=mem)
    out = []
    for i in (0, 1):
        info(open_file(core, i), mem, inf.DEV_INFO, 448)
        out.append(st.INFO_DEVICE.decode(mem.writes[-1][2]))
    assert [d.device_id for d in out] == [0x74A1, 0x74A0]
    assert out[1].ids_flags & 1 and not out[0].ids_flags & 1
    assert out[1].cu_active_number == 228


# ---- READ_MMR_REG ----------------------------------------------------------------------------


def test_gb_addr_config_as_amdgpu_device_initialize_reads_it(f, mem):
    """§2.2 step 5: dword 0x263e, count 1, instance 0xffffffff → the profile's value."""
    data = info(f, mem, inf.READ_MMR_REG, 4, (0x263E, 1, 0xFFFFFFFF, 0))
    assert data == struct.pack("<I", 0x2A114042)


@pytest.mark.parametrize("args, err", [
    ((0x263E, 129, 0xFFFFFFFF, 0), errno.EINVAL),  # count > 128
    ((0x263E, 1, 0x04, 0), errno.EINVAL),  # SE 4 ≥ AMDGPU_GFX_MAX_SE
    ((0x263E, 1, 0x0200, 0), errno.EINVAL),  # SH 2 ≥ AMDGPU_GFX_MAX_SH_PER_SE
    ((0x263F, 1, 0xFFFFFFFF, 0), errno.EFAULT),  # not whitelisted: the read fails
    ((0x263D, 2, 0xFFFFFFFF, 0), errno.EFAULT),  # the first of two is not allowed
    ((0x0000, 128, 0xFFFFFFFF, 0), errno.EFAULT),
])
def test_mmr_rules(f, mem, args, err):
    """amdgpu_info_ioctl READ_MMR_REG: selector bounds and count ≤ 128 → EINVAL; a register
    off soc15's whitelist fails the read → EFAULT; nothing written either way."""
    assert info_raw(f, inf.READ_MMR_REG, 512, args=args).result == -err
    assert mem.writes == []


def test_mmr_whitelisted_run_and_truncation(f, mem):
    """Consecutive whitelisted registers (GRBM_STATUS_SE0, SE1) read as idle (0); SE 0 SH 1
    is a valid selector; count 0 copies nothing; min(return_size, count*4)."""
    assert info(f, mem, inf.READ_MMR_REG, 64, (0x2005, 2, 0x0100, 0)) == bytes(8)
    assert info(f, mem, inf.READ_MMR_REG, 2, (0x263E, 1, 0xFFFF, 0)) == struct.pack(
        "<I", 0x2A114042)[:2]
    assert info(f, mem, inf.READ_MMR_REG, 64, (0x263E, 0, 0xFFFFFFFF, 0)) == b""


# ---- memory: live figures --------------------------------------------------------------------


def test_usage_is_live_and_sizes_are_the_accels(core, f, mem):
    """VRAM_USAGE / VIS_VRAM_USAGE / GTT_USAGE follow BO creation and close; VRAM_GTT and
    MEMORY are the accel's pools (VRAM less the 8 MiB page-table reserve, 3/4 max
    allocation), their heap_usage the same live figures."""
    vram_size, gtt_size = core.config.accel_memory(core.node.accels[0])

    def u64(q: int) -> int:
        return struct.unpack("<Q", info(f, mem, q, 8))[0]

    base_vram, base_gtt = u64(inf.VRAM_USAGE), u64(inf.GTT_USAGE)
    h = gem_create(f, 3 * MIB)
    g = gem_create(f, 1 * MIB, domains=2)
    assert u64(inf.VRAM_USAGE) == base_vram + 3 * MIB
    assert u64(inf.VIS_VRAM_USAGE) == base_vram + 3 * MIB
    assert u64(inf.GTT_USAGE) == base_gtt + MIB
    vram_gtt = st.INFO_VRAM_GTT.decode(info(f, mem, inf.VRAM_GTT, 24))
    assert vram_gtt.vram_size == vram_size - inf.AMDGPU_VM_RESERVED_VRAM
    assert vram_gtt.gtt_size == gtt_size
    raw = info(f, mem, inf.MEMORY, 96)
    heaps = [st.HEAP_INFO.decode(raw[i : i + 32]) for i in (0, 32, 64)]
    assert heaps[0].total_heap_size == vram_size
    assert heaps[0].heap_usage == base_vram + 3 * MIB
    assert heaps[0].max_allocation == heaps[0].usable_heap_size * 3 // 4
    assert heaps[2] == st.HeapInfo(gtt_size, gtt_size, base_gtt + MIB,
                                   gtt_size * 3 // 4)
    for handle in (h, g):
        assert ioctl(f, iow(0x09, 8), struct.pack("<II", handle, 0)).result == 0
    assert u64(inf.VRAM_USAGE) == base_vram and u64(inf.GTT_USAGE) == base_gtt


def test_timestamp_counts_the_profile_clock(core, f, mem):
    """TIMESTAMP: the GPU clock counter, gpu_counter_freq kHz ticks of the injected clock."""
    drv = device(core).driver
    drv.info.now_ns = lambda: 3_000_000_000
    assert struct.unpack("<Q", info(f, mem, inf.TIMESTAMP, 8))[0] == 300_000_000


# ---- engines, firmware, sensors, GDS ---------------------------------------------------------


def test_hw_ip_info_sizes_and_absent_blocks(f, mem):
    """HW_IP_INFO: 40 bytes (32 for libdrm 2.4.114's struct); a type the part has no block
    of (UVD) answers zeros; type ≥ AMDGPU_HW_IP_NUM or ip_instance ≥ 1 → EINVAL."""
    full = info(f, mem, inf.HW_IP_INFO, 40, (1, 0, 0, 0))
    ip = st.INFO_HW_IP.decode(full)
    assert (ip.hw_ip_version_major, ip.hw_ip_version_minor, ip.available_rings) == (9, 4, 0xF)
    assert ip.ip_discovery_version == 0x090403
    assert info(f, mem, inf.HW_IP_INFO, 32, (1, 0, 0, 0)) == full[:32]
    assert info(f, mem, inf.HW_IP_INFO, 40, (3, 0, 0, 0)) == bytes(40)
    assert info_raw(f, inf.HW_IP_INFO, args=(10, 0, 0, 0)).result == -errno.EINVAL
    assert info_raw(f, inf.HW_IP_INFO, args=(1, 1, 0, 0)).result == -errno.EINVAL


def test_hw_ip_count(f, mem):
    """HW_IP_COUNT: the instances of a present block; absent (VCE) or unknown → EINVAL."""
    assert info(f, mem, inf.HW_IP_COUNT, 4, (2, 0, 0, 0)) == struct.pack("<I", 16)
    for t in (4, 9, 10, 0xFFFF):
        assert info_raw(f, inf.HW_IP_COUNT, args=(t, 0, 0, 0)).result == -errno.EINVAL


def test_vcn_dec_and_enc_are_one_block(f, mem):
    """amdgpu_ip_get_block_type maps VCN_DEC (6) and VCN_ENC (7) both to the VCN block: the
    same count and version; VCN 4.0.3's unified ring is an encode ring, so VCN_DEC counts
    no ring (amdgpu_hw_ip_info's ring_dec loop), and its alignments are the decoder's."""
    count = [info(f, mem, inf.HW_IP_COUNT, 4, (t, 0, 0, 0)) for t in (6, 7)]
    assert count[0] == count[1] == struct.pack("<I", 4)
    dec, enc = (st.INFO_HW_IP.decode(info(f, mem, inf.HW_IP_INFO, 40, (t, 0, 0, 0)))
                for t in (6, 7))
    assert (dec.hw_ip_version_major, dec.hw_ip_version_minor) == (4, 0) == (
        enc.hw_ip_version_major, enc.hw_ip_version_minor)
    assert (dec.available_rings, dec.ib_start_alignment, dec.ib_size_alignment) == (0, 256, 64)
    assert (enc.available_rings, enc.ib_start_alignment, enc.ib_size_alignment) == (1, 256, 4)


@pytest.mark.parametrize("args, err", [
    ((0x08, 1, 0, 0), 0), ((0x08, 0, 1, 0), 0), ((0x08, 0, 2, 0), errno.EINVAL),
    ((0x0B, 0, 15, 0), 0), ((0x0B, 0, 16, 0), errno.EINVAL),
    ((0x13, 0, 1, 0), 0), ((0x13, 0, 7, 0), errno.EINVAL),
    ((0x0C, 0, 0, 0), 0), ((0x99, 0, 0, 0), errno.EINVAL),
])
def test_fw_version_rules(f, mem, args, err):
    """amdgpu_firmware_info: ip_instance ≠ 0 → EINVAL (args[1]); MEC index 0/1, SDMA index
    below the instances, TA by index; unknown type → EINVAL; else 8 bytes."""
    if args[1]:
        err = errno.EINVAL
    r = info_raw(f, inf.FW_VERSION, args=args)
    assert r.result == -err
    if not err:
        assert len(mem.writes[-1][2]) == st.INFO_FIRMWARE.size


def test_sensor_gds_vram_lost(f, mem):
    """SENSOR: GPU_TEMP in millidegrees; VDDNB, which this SMU lacks, and an unknown type →
    EINVAL. GDS_CONFIG the profile's sizes (GC 9.4.3: no GDS); VRAM_LOST_COUNTER 0."""
    assert info(f, mem, inf.SENSOR, 4, (3, 0, 0, 0)) == struct.pack("<I", 38000)
    for t in (6, 0, 0xD):
        assert info_raw(f, inf.SENSOR, args=(t, 0, 0, 0)).result == -errno.EINVAL
    gds = st.INFO_GDS.decode(info(f, mem, inf.GDS_CONFIG, 32))
    assert (gds.gds_total_size, gds.gws_per_compute_partition, gds.oa_per_compute_partition) == (
        0, 64, 16)
    assert info(f, mem, inf.VRAM_LOST_COUNTER, 4) == bytes(4)


# ---- DRM_IOCTL_VERSION -----------------------------------------------------------------------


def version_raw(f, lens=(0, 0, 0), ptrs=(0, 0, 0)):
    v = st.DrmVersion(0, 0, 0, lens[0], ptrs[0], lens[1], ptrs[1], lens[2], ptrs[2])
    return ioctl(f, VERSION, st.DRM_VERSION.encode(v))


def test_version_lengths_only(f, mem):
    """drm_version with zero lengths (drmGetVersion's first call): 3.64.0 and the full
    lengths of "amdgpu", "20150101", "AMD GPU"; nothing written to the caller."""
    r = version_raw(f)
    assert r.result == 0
    v = st.DRM_VERSION.decode(r.out)
    assert (v.version_major, v.version_minor, v.version_patchlevel) == (3, 64, 0)
    assert (v.name_len, v.date_len, v.desc_len) == (6, 8, 7)
    assert mem.writes == []


def test_version_copies_min_and_reports_full_length(f, mem):
    """drm_copy_field: min(strlen, user length) bytes, no NUL; a NULL buffer with a length
    writes nothing; the full length always comes back."""
    r = version_raw(f, (3, 100, 7), (0x1000, 0x2000, 0))
    assert r.result == 0
    assert mem.writes == [(CALLER.pid, 0x1000, b"amd"), (CALLER.pid, 0x2000, b"20150101")]
    v = st.DRM_VERSION.decode(r.out)
    assert (v.name_len, v.date_len, v.desc_len, v.name, v.date) == (6, 8, 7, 0x1000, 0x2000)


def test_version_fault_is_efault_with_lengths_so_far(f, mem):
    """A faulting name buffer: EFAULT; the kernel buffer still comes back (drm_ioctl copies
    out on failure) with the version and name_len set, date_len as sent."""
    mem.fault = True
    r = version_raw(f, (10, 10, 10), (0x1000, 0x2000, 0x3000))
    assert r.result == -errno.EFAULT
    v = st.DRM_VERSION.decode(r.out)
    assert (v.version_major, v.name_len, v.date_len, v.desc_len) == (3, 6, 10, 10)


# ---- GET_CAP ---------------------------------------------------------------------------------


@pytest.mark.parametrize("cap, value", [(0x13, 1), (0x14, 1), (0x5, 3), (0x6, 1)])
def test_get_cap_syncobj(f, cap, value):
    """drm_getcap for a render client: SYNCOBJ and SYNCOBJ_TIMELINE are 1 (amdgpu has
    both features), PRIME import|export, TIMESTAMP_MONOTONIC."""
    r = ioctl(f, GET_CAP, struct.pack("<QQ", cap, 0))
    assert r.result == 0
    assert struct.unpack("<QQ", r.out) == (cap, value)


@pytest.mark.parametrize("cap, value", [
    (0x1, 1), (0x2, 1), (0x3, 0), (0x4, 0), (0x7, 0), (0x8, 64), (0x9, 64), (0x10, 1),
    (0x11, 1), (0x12, 1), (0x15, 0)])
def test_get_cap_kms_caps_of_a_gpu_without_display(f, cap, value):
    """drm_getcap's second half: amdgpu is a DRIVER_MODESET driver even with no display
    block (drm_mode_config_init in amdgpu_device_init, mode_config otherwise untouched, no
    CRTC): DUMB_BUFFER 1 (amdgpu_mode_dumb_create), the cursor sizes' default 64,
    ADDFB2_MODIFIERS and PAGE_FLIP_TARGET 1, the depth/shadow/async fields 0."""
    r = ioctl(f, GET_CAP, struct.pack("<QQ", cap, 0xFFFF))
    assert r.result == 0
    assert struct.unpack("<QQ", r.out) == (cap, value)


@pytest.mark.parametrize("cap", [0x0, 0xA, 0xF, 0x16, 1 << 63])
def test_get_cap_unknown_is_einval(f, cap):
    """drm_getcap's `default: return -EINVAL`: the holes in the numbering and past the last."""
    assert ioctl(f, GET_CAP, struct.pack("<QQ", cap, 0)).result == -errno.EINVAL


def test_get_cap_kms_caps_of_a_driver_without_modeset_are_eopnotsupp(f, monkeypatch):
    """drm_getcap: "Other caps only work with KMS drivers": without DRIVER_MODESET every
    cap past the render-only ones is EOPNOTSUPP, before the unknown ones' EINVAL."""
    monkeypatch.setattr(f.device.driver, "kms_caps", None)
    for cap in (0x1, 0x16):
        assert ioctl(f, GET_CAP, struct.pack("<QQ", cap, 0)).result == -errno.EOPNOTSUPP
    assert struct.unpack("<QQ", ioctl(f, GET_CAP, struct.pack("<QQ", 0x13, 0)).out) == (0x13, 1)


# ---- CTX / VM --------------------------------------------------------------------------------


def ctx(f, op: int, ctx_id: int = 0, flags: int = 0, priority: int = 0, caller=CALLER):
    return ioctl(f, CTX, st.CTX_IN.encode(st.AmdgpuCtxIn(op, flags, ctx_id, priority)), caller)


def test_ctx_alloc_free_query(core, f):
    """amdgpu_ctx_ioctl: ids lowest-free from 1, per file; FREE / QUERY of an unknown id →
    EINVAL; QUERY_STATE answers no reset; the bytes the kernel does not write echo."""
    r = ctx(f, 1, ctx_id=0xAA, priority=0)
    assert r.result == 0 and r.out[:4] == struct.pack("<I", 1)
    assert r.out[4:] == struct.pack("<IIi", 0, 0xAA, 0)  # _pad = in.flags, then echoed
    assert struct.unpack("<I", ctx(f, 1).out[:4]) == (2,)
    other = open_file(core)
    assert ctx(other, 3, ctx_id=1).result == -errno.EINVAL  # contexts are per file
    assert ctx(f, 3, ctx_id=1).out == struct.pack("<QII", 0, 0, 0)
    assert ctx(f, 4, ctx_id=2, priority=-5).out == struct.pack("<QIi", 0, 0, -5)
    assert ctx(f, 2, ctx_id=1).result == 0
    assert ctx(f, 2, ctx_id=1).result == -errno.EINVAL
    assert struct.unpack("<I", ctx(f, 1).out[:4]) == (1,)


@pytest.mark.parametrize("op", [1, 2, 3, 4, 5])
def test_ctx_flags_must_be_zero(f, op):
    ctx(f, 1)
    assert ctx(f, op, ctx_id=1, flags=1).result == -errno.EINVAL


def test_ctx_priority_rules(f):
    """Garbage priority counts as NORMAL; above NORMAL needs CAP_SYS_NICE (root): EACCES."""
    assert ctx(f, 1, priority=5000).result == 0
    assert ctx(f, 1, priority=-4000).result == 0
    r = ctx(f, 1, priority=512)
    assert r.result == -errno.EACCES and r.out[:4] == bytes(4)
    assert ctx(f, 1, priority=1023, caller=ROOT).result == 0


def test_ctx_ids_run_out_at_amdgpu_vm_max_num_ctx(f):
    """idr_alloc(…, 1, AMDGPU_VM_MAX_NUM_CTX): ids 1..4095, then ENOSPC."""
    for _ in range(inf.AMDGPU_VM_MAX_NUM_CTX - 1):
        assert ctx(f, 1).result == 0
    r = ctx(f, 1)
    assert (r.result, r.out[:4]) == (-errno.ENOSPC, bytes(4))


@pytest.mark.parametrize("op", [0, 7, 8, 0xFFFFFFFF])
def test_ctx_other_ops_einval(f, op):
    ctx(f, 1)
    assert ctx(f, op, ctx_id=1).result == -errno.EINVAL


GET_PSTATE, SET_PSTATE = 5, 6
NONE, STANDARD, PEAK = 0, 1, 4


def pstate(f, ctx_id: int) -> int:
    r = ctx(f, GET_PSTATE, ctx_id=ctx_id, priority=-7)
    assert r.result == 0, r
    assert r.out[4:] == struct.pack("<IIi", 0, ctx_id, -7)  # out.pstate.flags only
    return struct.unpack("<I", r.out[:4])[0]


def test_ctx_stable_pstate_get_and_set(f):
    """amdgpu_ctx_ioctl GET/SET_STABLE_PSTATE: the level is in in.flags; bits outside
    AMDGPU_CTX_STABLE_PSTATE_FLAGS_MASK or a level above PEAK → EINVAL; an unknown context
    → EINVAL; GET answers the device's level in out.pstate.flags."""
    ctx(f, 1)
    assert pstate(f, 1) == NONE
    assert ctx(f, SET_PSTATE, ctx_id=1, flags=PEAK + 1).result == -errno.EINVAL
    assert ctx(f, SET_PSTATE, ctx_id=1, flags=0x10 | STANDARD).result == -errno.EINVAL
    assert ctx(f, SET_PSTATE, ctx_id=9, flags=STANDARD).result == -errno.EINVAL
    assert ctx(f, GET_PSTATE, ctx_id=9).result == -errno.EINVAL
    assert ctx(f, SET_PSTATE, ctx_id=1, flags=PEAK).result == 0
    assert pstate(f, 1) == PEAK
    assert ctx(f, SET_PSTATE, ctx_id=1, flags=STANDARD).result == 0
    assert pstate(f, 1) == STANDARD
    assert ctx(f, SET_PSTATE, ctx_id=1, flags=NONE).result == 0
    assert pstate(f, 1) == NONE


def test_ctx_stable_pstate_one_holder_per_device(core, f):
    """amdgpu_ctx_set_stable_pstate: a context holding the device away from NONE makes any
    other context's SET EBUSY (another file's too), until it sets NONE or goes; a context
    put back the level it found when it was made (amdgpu_ctx_init, amdgpu_ctx_fini)."""
    other = open_file(core)
    ctx(f, 1), ctx(f, 1), ctx(other, 1)
    assert ctx(f, SET_PSTATE, ctx_id=1, flags=PEAK).result == 0
    assert ctx(f, SET_PSTATE, ctx_id=2, flags=STANDARD).result == -errno.EBUSY
    assert ctx(other, SET_PSTATE, ctx_id=1, flags=NONE).result == -errno.EBUSY
    assert pstate(other, 1) == PEAK  # the device's, seen from any context
    assert ctx(f, 2, ctx_id=1).result == 0  # FREE: it found NONE, and puts it back
    assert pstate(other, 1) == NONE
    assert ctx(other, SET_PSTATE, ctx_id=1, flags=STANDARD).result == 0
    assert ctx(f, SET_PSTATE, ctx_id=2, flags=PEAK).result == -errno.EBUSY
    other.release()  # its last close: its contexts go, the level goes back
    assert pstate(f, 2) == NONE
    assert ctx(f, SET_PSTATE, ctx_id=2, flags=PEAK).result == 0


def test_vm_reserve_unreserve(f):
    """amdgpu_vm_ioctl: RESERVE / UNRESERVE_VMID succeed, the 8 bytes echo; other ops EINVAL."""
    for op in (1, 2, 2, 1):
        r = ioctl(f, VM, struct.pack("<II", op, 7))
        assert (r.result, r.out) == (0, struct.pack("<II", op, 7))
    assert ioctl(f, VM, struct.pack("<II", 3, 0)).result == -errno.EINVAL


def test_info_called_with_other_directions(f, mem):
    """§2.1: INFO called _IOWR still copies nothing back (the table says W); called _IOR,
    nothing is copied in, so return_size and return_pointer read 0 → EINVAL."""
    data = st.INFO.encode(st.AmdgpuInfo(PTR, 4, 0, (0, 0, 0, 0)))
    r = ioctl(f, ioc(IOC_READ | IOC_WRITE, 0x64, 0x45, 32), data)
    assert (r.result, r.out) == (0, b"")
    r = ioctl(f, ioc(IOC_READ, 0x64, 0x45, 32), data)
    assert (r.result, r.out) == (-errno.EINVAL, b"")
    assert mem.writes == [(CALLER.pid, PTR, struct.pack("<I", 1))]


def test_trace_decodes_info_and_version_from_the_table():
    """STYLE rule 6: --trace decodes the new entries from abi/ioctls.py (INFO's request,
    VERSION's request and answer)."""
    from ualinkd.node import NodeCore, NodeServices
    from ualinkd.trace import TraceRecord

    recs: list[TraceRecord] = []
    core = NodeCore(pod_config(), "node0", NodeServices(
        resolve_fd=lambda p, fd: fd, tracer=recs.append, copy_to_user=CopyToUserFake()))
    f = open_file(core)
    run(core.ioctl(f, INFO, st.INFO.encode(st.AmdgpuInfo(PTR, 448, inf.DEV_INFO, (0, 0, 0, 0))),
                   0, CALLER))
    run(core.ioctl(f, VERSION, bytes(64), 64, CALLER))
    info_rec, version_rec = (r.as_dict() for r in recs if isinstance(r, TraceRecord))
    assert info_rec["ioctl"] == "AMDGPU_INFO"
    assert info_rec["in"]["query"] == {"value": 0x16, "name": "DEV_INFO"}
    assert info_rec["in"]["return_size"] == 448 and info_rec["out"] == {}
    assert version_rec["out"]["version_minor"] == 64 and version_rec["out"]["name_len"] == 6
    # schema 2 (a recording): what INFO copied to its return_pointer, as written
    (w,) = info_rec["mem"]
    assert (w["op"], w["addr"], w["result"]) == ("write", PTR, 0) and 0 < w["len"] <= 448
