"""DRM_IOCTL_AMDGPU_INFO (amdgpu_info_ioctl in amdgpu_kms.c) and the non-submitting stubs
CTX and VM (amdgpu_ctx_ioctl, amdgpu_vm_ioctl), for clients that never submit work.

INFO is DRM_IOW: nothing of the 32-byte request is copied back; the answer goes to
`return_pointer` in the caller's memory through the device's copy_to_user, at most
`return_size` bytes (min(return_size, sizeof answer), so libdrm 2.4.114's 368-byte
DEV_INFO gets the first 368 bytes of the current kernel's 448). The device is the accel's
profile (amdgpu/profile.py); VRAM and GTT sizes are the accel's pools, usage figures live.
"""

from __future__ import annotations

import errno
import struct
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..abi import constants as c
from ..abi import ioctls as tbl
from ..abi import structs as st
from ..drm.errors import DrmError
from .engine import gpu_clock_counter
from .profile import DeviceProfile
from .vm import GMC_HOLE_END, GMC_HOLE_START, PAGE, VA_RESERVED_BOTTOM, VA_RESERVED_TOP, VM_SIZE

if TYPE_CHECKING:
    from ..drm.device import Caller
    from ..drm.file import DrmFile
    from .driver import AmdgpuDriver

# AMDGPU_INFO_* queries (amdgpu_drm.h)
ACCEL_WORKING, CRTC_FROM_ID, HW_IP_INFO, HW_IP_COUNT, TIMESTAMP = 0x00, 0x01, 0x02, 0x03, 0x05
FW_VERSION, VRAM_USAGE, GTT_USAGE, GDS_CONFIG, VRAM_GTT = 0x0E, 0x10, 0x11, 0x13, 0x14
READ_MMR_REG, DEV_INFO, VIS_VRAM_USAGE, MEMORY = 0x15, 0x16, 0x17, 0x19
SENSOR, VRAM_LOST_COUNTER = 0x1D, 0x1F
NUM_BYTES_MOVED, NUM_EVICTIONS, NUM_VRAM_CPU_PAGE_FAULTS = 0x0F, 0x18, 0x1E
FW_GFX_MEC, FW_SDMA, FW_TA = 0x08, 0x0B, 0x13

AMDGPU_HW_IP_NUM = 10
AMDGPU_HW_IP_INSTANCE_MAX_COUNT = 1
CTX_QUERY2_FLAGS_GUILTY = 1 << 2  # AMDGPU_CTX_QUERY2_FLAGS_GUILTY
AMDGPU_GFX_MAX_SE = 4  # amdgpu_gfx.h: READ_MMR_REG's SE / SH selectors are bounded by these
AMDGPU_GFX_MAX_SH_PER_SE = 2
MMR_MAX_COUNT = 128
AMDGPU_VM_RESERVED_VRAM = 8 << 20  # page tables: VRAM_GTT and MEMORY do not offer it
AMDGPU_IDS_FLAGS_GANG_SUBMIT = 0x10  # set by every kernel that is not an SR-IOV VF
PTE_FRAGMENT = 9  # vm_manager.fragment_size of gfx9: 2 MiB fragments
# TA firmware index (TA_FW_TYPE_PSP_*: XGMI, RAS, HDCP, DTM, RAP, SECUREDISPLAY) -> version
_TA_FW = {1: (0x2000000A, 0), 2: (0x1B00013E, 0), 3: (0, 0), 4: (0, 0), 5: (0, 0), 6: (0, 0)}

# The GC registers soc15_read_register lets userspace read (soc15_allowed_read_registers),
# dword offsets with GC segment 0 at 0x2000, as gc_9_0_offset.h gives them; a status
# register of an idle part reads 0. The whitelist's SDMA, CP_STAT and DB_DEBUG2 entries
# are not here (their offsets were not verified), so they fault like any other register.
_GC = 0x2000
_MMR_IDLE = {
    _GC + 0x002,  # GRBM_STATUS2
    _GC + 0x004,  # GRBM_STATUS
    _GC + 0x005, _GC + 0x006, _GC + 0x00E, _GC + 0x00F,  # GRBM_STATUS_SE0..3
    _GC + 0x084, _GC + 0x085, _GC + 0x086,  # CP_CPC_STATUS, _BUSY_STAT, _STALLED_STAT1
    _GC + 0x087, _GC + 0x088, _GC + 0x089,  # CP_CPF_STATUS, _BUSY_STAT, _STALLED_STAT1
    _GC + 0x19C, _GC + 0x19D, _GC + 0x19E,  # CP_STALLED_STAT3, 1, 2
}
GB_ADDR_CONFIG = _GC + 0x63E  # 0x263e, what amdgpu_device_initialize reads


def cu_bitmap(profile: DeviceProfile) -> tuple[int, ...]:
    """cu_bitmap[4][4] (row = SE % 4, column = SH): the active CUs of the first XCC's four
    SEs, spread as evenly as the profile's count allows (chosen layout)."""
    per_xcc = profile.num_cu // max(profile.num_xcc, 1)
    rows = [per_xcc // 4 + (1 if i < per_xcc % 4 else 0) for i in range(4)]
    out = [0] * 16
    for se, n in enumerate(rows):
        out[se * 4] = (1 << n) - 1
    return tuple(out)


def dev_info(profile: DeviceProfile) -> st.InfoDevice:
    """AMDGPU_INFO_DEV_INFO as amdgpu_info_ioctl fills it, from the profile and the GPU VM's
    limits (vm.py): VA from AMDGPU_VA_RESERVED_BOTTOM to min(vm_size, HOLE_START), the high
    range from HOLE_END to HOLE_END | vm_size, vm_size = max_pfn pages less the reserved top."""
    vm_size = VM_SIZE - VA_RESERVED_TOP
    bitmap = cu_bitmap(profile)
    high = vm_size > GMC_HOLE_START
    return st.InfoDevice(
        device_id=profile.pci_device, chip_rev=profile.chip_rev,
        external_rev=profile.external_rev, pci_rev=profile.pci_revision,
        family=profile.family, num_shader_engines=profile.num_shader_engines,
        num_shader_arrays_per_engine=profile.num_shader_arrays_per_engine,
        gpu_counter_freq=profile.gpu_counter_freq_khz,
        max_engine_clock=profile.max_engine_clock_khz,
        max_memory_clock=profile.max_memory_clock_khz,
        cu_active_number=profile.num_cu, cu_ao_mask=0, cu_bitmap=bitmap,
        enabled_rb_pipes_mask=0, num_rb_pipes=0,  # compute-only: no render backends
        num_hw_gfx_contexts=8, pcie_gen=profile.pcie_gen,
        ids_flags=profile.ids_flags | AMDGPU_IDS_FLAGS_GANG_SUBMIT,
        virtual_address_offset=VA_RESERVED_BOTTOM,
        virtual_address_max=min(vm_size, GMC_HOLE_START),
        virtual_address_alignment=max(4096, PAGE),
        pte_fragment_size=(1 << PTE_FRAGMENT) * PAGE, gart_page_size=max(4096, PAGE),
        ce_ram_size=0, vram_type=profile.vram_type, vram_bit_width=profile.vram_bit_width,
        vce_harvest_config=0, gc_double_offchip_lds_buf=1,
        prim_buf_gpu_addr=0, pos_buf_gpu_addr=0, cntl_sb_buf_gpu_addr=0, param_buf_gpu_addr=0,
        prim_buf_size=0, pos_buf_size=0, cntl_sb_buf_size=0, param_buf_size=0,
        wave_front_size=profile.wave_front_size, num_shader_visible_vgprs=256,
        num_cu_per_sh=profile.num_cu_per_sh, num_tcc_blocks=profile.num_tcc_blocks,
        gs_vgt_table_depth=32, gs_prim_buffer_depth=1792, max_gs_waves_per_vgt=32,
        pcie_num_lanes=profile.pcie_num_lanes, cu_ao_bitmap=bitmap,
        high_va_offset=GMC_HOLE_END if high else 0,
        high_va_max=GMC_HOLE_END | vm_size if high else 0,
        pa_sc_tile_steering_override=0,  # families before NV
        tcc_disabled_mask=0,
        min_engine_clock=profile.min_engine_clock_khz,
        min_memory_clock=profile.min_memory_clock_khz,
        tcp_cache_size=0, num_sqc_per_wgp=0, sqc_data_cache_size=0, sqc_inst_cache_size=0,
        gl1c_cache_size=0, gl2c_cache_size=0, mall_size=0,  # gfx11+ fields: 0 before
        enabled_rb_pipes_mask_hi=0, shadow_size=0, shadow_alignment=0, csa_size=0,
        csa_alignment=0, userq_ip_mask=0, pad=0,
    )


class AmdgpuInfo:
    """The INFO, CTX and VM handlers of one AmdgpuDriver (bound into its ioctls)."""

    def __init__(self, driver: AmdgpuDriver, profile: DeviceProfile,
                 now_ns: Callable[[], int] = time.monotonic_ns) -> None:
        self.driver = driver
        self.profile = profile
        self.now_ns = now_ns  # CLOCK_MONOTONIC: the GPU clock counter runs from it
        self._dev_info = st.INFO_DEVICE.encode(dev_info(profile))
        self.vram_lost_counter = 0  # no GPU reset ever loses VRAM here
        self._ctxs: weakref.WeakKeyDictionary[DrmFile, dict[int, int]] = (
            weakref.WeakKeyDictionary())
        # adev->pm: the stable pstate (AMDGPU_CTX_STABLE_PSTATE_*) and the context holding it
        self.stable_pstate = c.CTX_STABLE_PSTATE_NONE
        self._pstate_owner: tuple[DrmFile, int] | None = None
        self.reserved_vmid: weakref.WeakKeyDictionary[DrmFile, bool] = (
            weakref.WeakKeyDictionary())

    # -- the answers, live --------------------------------------------------------------------
    def _pinned_vram(self) -> int:
        return sum(bo.size for bo in self.driver.vram.residents if bo.pin_count)

    def _heaps(self) -> tuple[st.HeapInfo, st.HeapInfo, st.HeapInfo]:
        """AMDGPU_INFO_MEMORY: VRAM less pins and the page-table reserve, all of it CPU
        visible (a large-BAR part), GTT; max_allocation is 3/4 of the usable heap."""
        vram, gtt = self.driver.vram, self.driver.gtt
        usable = max(vram.size - self._pinned_vram() - AMDGPU_VM_RESERVED_VRAM, 0)
        vis_usable = min(vram.size - self._pinned_vram(), usable)
        return (st.HeapInfo(vram.size, usable, vram.used, usable * 3 // 4),
                st.HeapInfo(vram.size, vis_usable, vram.used, vis_usable * 3 // 4),
                st.HeapInfo(gtt.size, gtt.size, gtt.used, gtt.size * 3 // 4))

    def answer(self, file: DrmFile, info: st.AmdgpuInfo) -> bytes:
        """The bytes of the query's answer (before min(return_size, ...)); DrmError as the
        kernel's switch answers. The request's union is `info.args` (four u32)."""
        a0, a1, a2, _a3 = info.args
        q = info.query
        if q == ACCEL_WORKING:
            return struct.pack("<I", 1)
        if q == HW_IP_INFO:
            return st.INFO_HW_IP.encode(self._hw_ip_info(a0, a1))
        if q == HW_IP_COUNT:
            ip = self.profile.hw_ips.get(a0)
            if ip is None:  # no such type, or no such block on this part
                raise DrmError(errno.EINVAL, f"HW_IP_COUNT type {a0}")
            return struct.pack("<I", ip.count)
        if q == TIMESTAMP:
            # amdgpu_gfx_get_gpu_clock_counter: the counter SDMA TIMESTAMP packets read too
            return struct.pack("<Q", gpu_clock_counter(self.now_ns(),
                                                       self.profile.gpu_counter_freq_khz))
        if q == FW_VERSION:
            return st.INFO_FIRMWARE.encode(self._firmware(a0, a1, a2))
        if q == VRAM_USAGE:
            return struct.pack("<Q", self.driver.vram.used)
        if q == VIS_VRAM_USAGE:
            return struct.pack("<Q", self.driver.vram.used)  # all VRAM is CPU visible
        if q == GTT_USAGE:
            return struct.pack("<Q", self.driver.gtt.used)
        if q == GDS_CONFIG:
            p = self.profile
            return st.INFO_GDS.encode(st.InfoGds(0, p.gds_size, p.gds_size, 0, p.gws_size, 0,
                                                 p.oa_size, 0))
        if q == VRAM_GTT:
            vram, vis, gtt = self._heaps()
            return st.INFO_VRAM_GTT.encode(st.InfoVramGtt(
                vram.usable_heap_size, vis.usable_heap_size, gtt.usable_heap_size))
        if q == MEMORY:
            return b"".join(st.HEAP_INFO.encode(h) for h in self._heaps())
        if q == READ_MMR_REG:
            return self._read_mmr(a0, a1, a2)
        if q == DEV_INFO:
            return self._dev_info
        if q == SENSOR:
            value = self.profile.sensors.get(a0)
            if value is None:
                raise DrmError(errno.EINVAL, f"SENSOR type {a0}")
            return struct.pack("<I", value)
        if q == VRAM_LOST_COUNTER:
            return struct.pack("<I", self.vram_lost_counter)
        if q in (NUM_BYTES_MOVED, NUM_EVICTIONS, NUM_VRAM_CPU_PAGE_FAULTS):
            # The device's atomic64 counters of TTM moves, evictions and CPU faults on VRAM:
            # BOs here stay where they were placed and CPU maps never fault into VRAM.
            return struct.pack("<Q", 0)
        # CRTC_FROM_ID finds no CRTC (there are none); every other query is unknown here
        raise DrmError(errno.EINVAL, f"AMDGPU_INFO query {q:#x}")

    def _hw_ip_info(self, ip_type: int, ip_instance: int) -> st.InfoHwIp:
        """amdgpu_hw_ip_info: instance ≥ 1 → EINVAL (1), a type the uAPI does not name →
        EINVAL (2), a named type this part has no block of → all zeros (3)."""
        if ip_instance >= AMDGPU_HW_IP_INSTANCE_MAX_COUNT:  # 1
            raise DrmError(errno.EINVAL, f"HW_IP_INFO ip_instance {ip_instance}")
        if ip_type >= AMDGPU_HW_IP_NUM:  # 2
            raise DrmError(errno.EINVAL, f"HW_IP_INFO type {ip_type}")
        ip = self.profile.hw_ips.get(ip_type)
        if ip is None:  # 3
            return st.InfoHwIp(0, 0, 0, 0, 0, 0, 0, 0)
        return st.InfoHwIp(ip.major, ip.minor, 0, ip.ib_start_alignment, ip.ib_size_alignment,
                           ip.available_rings, ip.discovery_version, 0)

    def _firmware(self, fw_type: int, ip_instance: int, index: int) -> st.InfoFirmware:
        """FW_VERSION: ip_instance ≠ 0 → EINVAL (1); MEC index 0 or 1 (2), SDMA index below
        the instance count (3), TA by its index (4); an unknown type → EINVAL (5)."""
        if ip_instance != 0:  # 1
            raise DrmError(errno.EINVAL, f"FW_VERSION ip_instance {ip_instance}")
        if fw_type == FW_GFX_MEC and index > 1:  # 2
            raise DrmError(errno.EINVAL, f"FW_VERSION MEC index {index}")
        if fw_type == FW_SDMA and index >= self.profile.sdma_instances:  # 3
            raise DrmError(errno.EINVAL, f"FW_VERSION SDMA index {index}")
        if fw_type == FW_TA:  # 4
            ta = _TA_FW.get(index)
            if ta is None:
                raise DrmError(errno.EINVAL, f"FW_VERSION TA index {index}")
            return st.InfoFirmware(*ta)
        fw = self.profile.firmware.get(fw_type)
        if fw is None:  # 5
            raise DrmError(errno.EINVAL, f"FW_VERSION type {fw_type:#x}")
        return st.InfoFirmware(*fw)

    def _read_mmr(self, dword_offset: int, count: int, instance: int) -> bytes:
        """READ_MMR_REG: SE selector (bits 0–7, 0xff = all) < AMDGPU_GFX_MAX_SE (1) and SH
        (bits 8–15) < AMDGPU_GFX_MAX_SH_PER_SE (2) else EINVAL; count ≤ 128 else EINVAL
        (3); a register off the whitelist fails the read and the ioctl answers EFAULT (4),
        as amdgpu_info_ioctl maps every failed read."""
        se, sh = instance & 0xFF, (instance >> 8) & 0xFF
        if se != 0xFF and se >= AMDGPU_GFX_MAX_SE:  # 1
            raise DrmError(errno.EINVAL, f"READ_MMR_REG SE {se}")
        if sh != 0xFF and sh >= AMDGPU_GFX_MAX_SH_PER_SE:  # 2
            raise DrmError(errno.EINVAL, f"READ_MMR_REG SH {sh}")
        if count > MMR_MAX_COUNT:  # 3
            raise DrmError(errno.EINVAL, f"READ_MMR_REG count {count} > {MMR_MAX_COUNT}")
        regs = []
        for reg in range(dword_offset, dword_offset + count):
            if reg == GB_ADDR_CONFIG:
                regs.append(self.profile.gb_addr_config)
            elif reg in _MMR_IDLE:
                regs.append(0)
            else:  # 4
                raise DrmError(errno.EFAULT, f"READ_MMR_REG register {reg:#x} not allowed")
        return struct.pack(f"<{len(regs)}I", *regs)

    # -- the ioctls -----------------------------------------------------------------------------
    @tbl.handles(tbl.AMDGPU_INFO)
    async def info_ioctl(self, file: DrmFile, kdata: bytearray, caller: Caller) -> None:
        """amdgpu_info_ioctl: return_size 0 or a NULL return_pointer → EINVAL before the
        query is looked at (1); the query's answer (2); min(return_size, its size) bytes
        to the caller's memory, EFAULT if that fails (3)."""
        info = st.INFO.decode(bytes(kdata[: st.INFO.size]))
        if not info.return_size or not info.return_pointer:  # 1
            raise DrmError(errno.EINVAL, "AMDGPU_INFO needs return_pointer and return_size")
        data = self.answer(file, info)  # 2
        await self.driver.device.write_user(caller, info.return_pointer,  # 3
                                            data[: info.return_size])

    @tbl.handles(tbl.AMDGPU_CTX)
    def ctx_ioctl(self, file: DrmFile, kdata: bytearray, caller: Caller) -> None:
        """amdgpu_ctx_ioctl. A priority outside
        VERY_LOW..VERY_HIGH counts as NORMAL (the kernel's backwards compatibility) (1);
        ALLOC, FREE, QUERY_STATE, QUERY_STATE2, GET_STABLE_PSTATE refuse non-zero flags (2);
        ALLOC needs CAP_SYS_NICE (root here) above NORMAL, else EACCES (3), and writes the
        lowest free id from 1 to out.alloc.ctx_id (4); FREE and the other ops on an unknown
        id → EINVAL (5); QUERY_STATE answers no flags, no hangs, AMDGPU_CTX_NO_RESET and
        QUERY_STATE2 no hangs and no flag but GUILTY once a job of the context hung
        (amdgpu/cs.py): no GPU reset ever happens (6);
        SET_STABLE_PSTATE takes its level from in.flags: bits outside the mask, or a level
        above PEAK → EINVAL (8), then amdgpu_ctx_set_stable_pstate (_set_stable_pstate);
        GET_STABLE_PSTATE writes the device's level to out.pstate.flags (9); any other op
        EINVAL (7). Bytes the kernel does not write are copied back as sent."""
        args = st.CTX_IN.decode(bytes(kdata[: st.CTX_IN.size]))
        ctxs = self._contexts(file)
        prio = args.priority
        if not CTX_PRIORITY_VERY_LOW <= prio <= CTX_PRIORITY_VERY_HIGH:  # 1
            prio = CTX_PRIORITY_NORMAL
        if args.op not in _CTX_OPS:  # 7
            raise DrmError(errno.EINVAL, f"context op {args.op}")
        if args.op == c.CTX_OP_SET_STABLE_PSTATE:
            level = args.flags & c.CTX_STABLE_PSTATE_FLAGS_MASK
            if args.flags != level or level > c.CTX_STABLE_PSTATE_PEAK:  # 8
                raise DrmError(errno.EINVAL, f"stable pstate flags {args.flags:#x}")
        elif args.flags:  # 2
            raise DrmError(errno.EINVAL, f"context flags {args.flags:#x}")
        if args.op == c.CTX_OP_ALLOC_CTX:
            if prio > CTX_PRIORITY_NORMAL and caller.uid != 0:  # 3
                st.CTX_OUT_CTX_ID.put(kdata, 0)  # amdgpu_ctx_alloc failed: out.alloc.ctx_id = 0
                raise DrmError(errno.EACCES, "a high-priority context needs CAP_SYS_NICE")
            ctx_id = 1
            while ctx_id in ctxs:
                ctx_id += 1
            if ctx_id >= AMDGPU_VM_MAX_NUM_CTX:  # idr_alloc(…, 1, AMDGPU_VM_MAX_NUM_CTX)
                st.CTX_OUT_CTX_ID.put(kdata, 0)
                raise DrmError(errno.ENOSPC, "no context id left")
            # amdgpu_ctx_init: the level it finds (its holder's own, if one holds it) is
            # what the context puts back when it goes
            owner = self._pstate_owner
            ctxs[ctx_id] = (self._ctxs[owner[0]][owner[1]] if owner is not None
                            else self.stable_pstate)
            st.CTX_OUT_CTX_ID.put(kdata, ctx_id)  # 4
            return
        if args.ctx_id not in ctxs:  # 5
            raise DrmError(errno.EINVAL, f"no context {args.ctx_id}")
        if args.op == c.CTX_OP_FREE_CTX:
            self._ctx_fini(file, args.ctx_id)
        elif args.op == c.CTX_OP_QUERY_STATE:  # 6
            st.CTX_OUT_STATE.pack_into(kdata, 0, 0, 0, c.CTX_NO_RESET)
        elif args.op == c.CTX_OP_QUERY_STATE2:  # GUILTY once a job of it hung (amdgpu/cs.py)
            guilty = CTX_QUERY2_FLAGS_GUILTY if self.driver.cs.guilty(file, args.ctx_id) else 0
            kdata[0:12] = st.CTX_OUT_STATE.pack(guilty, 0, 0)[:12]
        elif args.op == c.CTX_OP_GET_STABLE_PSTATE:  # 9
            kdata[0:4] = self.stable_pstate.to_bytes(4, "little")
        else:
            self._set_stable_pstate(file, args.ctx_id, level)

    def _set_stable_pstate(self, file: DrmFile, ctx_id: int, level: int) -> None:
        """amdgpu_ctx_set_stable_pstate: one context at a time may hold the device's level
        away from NONE; any other context's request is EBUSY. Asking for the current level
        changes nothing; setting NONE lets it go."""
        owner = self._pstate_owner
        if owner is not None and not self._holds(file, ctx_id):
            raise DrmError(errno.EBUSY, f"context {owner[1]} holds the stable pstate")
        if level == self.stable_pstate:
            return
        self.stable_pstate = level  # (amdgpu_dpm_force_performance_level: a level is set)
        self._pstate_owner = None if level == c.CTX_STABLE_PSTATE_NONE else (file, ctx_id)

    def _ctx_fini(self, file: DrmFile, ctx_id: int) -> None:
        """amdgpu_ctx_fini: the context puts back the level it found (EBUSY, when another
        holds it, is ignored), then goes."""
        try:
            self._set_stable_pstate(file, ctx_id, self._ctxs[file][ctx_id])
        except DrmError:
            pass
        del self._ctxs[file][ctx_id]
        self.driver.cs.context_freed(file, ctx_id)
        if self._holds(file, ctx_id):  # (it was holding the level it found)
            self._pstate_owner = None

    def context_exists(self, file: DrmFile, ctx_id: int) -> bool:
        """amdgpu_ctx_get's lookup: a context CTX gave this file and it has not freed."""
        ctxs = self._ctxs.get(file)
        return ctxs is not None and ctx_id in ctxs

    def context_ids(self, file: DrmFile) -> list[int]:
        """The file's live context ids, lowest first (debugfs, amdgpu/cs.py's table)."""
        return sorted(self._ctxs.get(file, ()))

    def _holds(self, file: DrmFile, ctx_id: int) -> bool:
        owner = self._pstate_owner
        return owner is not None and owner[0] is file and owner[1] == ctx_id

    def contexts_closed(self, file: DrmFile) -> None:
        """amdgpu_ctx_mgr_fini at the file's last close: each context is finished."""
        for ctx_id in sorted(self._ctxs.get(file, ())):
            self._ctx_fini(file, ctx_id)

    def _contexts(self, file: DrmFile) -> dict[int, int]:
        """The file's contexts (amdgpu_fpriv's ctx_mgr), each with the stable pstate it
        found at creation (ctx->stable_pstate): they go with the file."""
        ctxs = self._ctxs.get(file)
        if ctxs is None:
            ctxs = self._ctxs[file] = {}
        return ctxs

    @tbl.handles(tbl.AMDGPU_VM)
    def vm_ioctl(self, file: DrmFile, kdata: bytearray, caller: Caller) -> None:
        """amdgpu_vm_ioctl: RESERVE_VMID and UNRESERVE_VMID succeed (a reserved VMID
        changes nothing without submissions; flags are not looked at), any other op →
        EINVAL. Nothing is written: the 8 bytes come back as sent."""
        args = st.VM_IN.decode(bytes(kdata[: st.VM_IN.size]))
        if args.op not in (VM_OP_RESERVE_VMID, VM_OP_UNRESERVE_VMID):
            raise DrmError(errno.EINVAL, f"VM op {args.op}")
        self.reserved_vmid[file] = args.op == VM_OP_RESERVE_VMID


_CTX_OPS = frozenset(c.CTX_OPS)
CTX_PRIORITY_UNSET, CTX_PRIORITY_VERY_LOW = -2048, -1023
CTX_PRIORITY_NORMAL, CTX_PRIORITY_VERY_HIGH = 0, 1023
AMDGPU_VM_MAX_NUM_CTX = 4096
VM_OP_RESERVE_VMID, VM_OP_UNRESERVE_VMID = 1, 2
