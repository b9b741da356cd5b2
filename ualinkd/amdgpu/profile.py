"""Named device profiles: what an emulated accel says it is (PCI identity, family, shape).

One profile feeds both faces of an accel's identity, so they cannot disagree: the PCI sysfs
files libdrm's drmGetDevice2 reads (vendor, device, revision, subsystem ids, config) and the
AMDGPU_INFO answers amdgpu_device_initialize copies (DEV_INFO's device_id, family, CU and SE
counts), and later the KFD topology (gfx_target_version, simd_count). Values marked
"chosen" in spec/userspace-surface.md §2.2 are plausible, not measured on a device.
"""

from __future__ import annotations

from dataclasses import dataclass, field

AMDGPU_FAMILY_AI = 141  # amdgpu_drm.h; GC 9.4.3 / 9.4.4 (MI300) report AI
AMDGPU_IDS_FLAGS_FUSION = 0x1
PCI_VENDOR_ID_ATI = 0x1002

# AMDGPU_HW_IP_* (amdgpu_drm.h)
HW_IP_GFX, HW_IP_COMPUTE, HW_IP_DMA, HW_IP_UVD, HW_IP_VCE = 0, 1, 2, 3, 4
HW_IP_UVD_ENC, HW_IP_VCN_DEC, HW_IP_VCN_ENC, HW_IP_VCN_JPEG, HW_IP_VPE = 5, 6, 7, 8, 9


@dataclass(frozen=True, slots=True)
class HwIp:
    """One engine type's answer to HW_IP_INFO / HW_IP_COUNT (amdgpu_hw_ip_info): the IP
    block version, ring mask (amdgpu_ctx_num_entities caps it), alignments, instances."""

    major: int
    minor: int
    discovery_version: int  # IP_VERSION_MAJ_MIN_REV: major<<16 | minor<<8 | rev
    available_rings: int
    ib_start_alignment: int
    ib_size_alignment: int
    count: int  # HW_IP_COUNT: instances in the partition


# GC 9.4.3 has no graphics ring, only compute (chosen counts for one SPX partition of 8
# XCCs); SDMA 4.4.2, VCN/JPEG 4.0.3; no UVD, VCE or VPE blocks (HW_IP_INFO answers zeros,
# HW_IP_COUNT EINVAL for those). VCN_DEC and VCN_ENC are both the VCN block
# (amdgpu_ip_get_block_type): the same version and count, but VCN 4's one unified ring is
# an encode ring, so VCN_DEC has no ring (amdgpu_hw_ip_info counts ring_dec).
_GFX943_IPS: dict[int, HwIp] = {
    HW_IP_GFX: HwIp(9, 4, 0x090403, 0, 32, 32, 8),
    HW_IP_COMPUTE: HwIp(9, 4, 0x090403, 0xF, 32, 32, 8),
    HW_IP_DMA: HwIp(4, 4, 0x040402, 0x3, 256, 4, 16),
    HW_IP_VCN_DEC: HwIp(4, 0, 0x040003, 0, 256, 64, 4),
    HW_IP_VCN_ENC: HwIp(4, 0, 0x040003, 0x1, 256, 4, 4),
    HW_IP_VCN_JPEG: HwIp(4, 0, 0x040003, 0x1, 256, 64, 32),
}
# AMDGPU_INFO_FW_* -> (ver, feature), chosen; a type absent here answers EINVAL as the
# kernel's amdgpu_firmware_info does for an unknown type (the ones it knows but this
# compute-only part has no image for answer 0, 0).
_GFX943_FW: dict[int, tuple[int, int]] = {
    0x03: (0, 0), 0x04: (0, 0), 0x05: (0, 0), 0x06: (0, 0),  # GMC, GFX ME/PFP/CE
    0x07: (0x0000008D, 1), 0x08: (0x0000009A, 1),  # RLC, MEC (index 0; 1 is MEC2)
    0x0A: (0x00557000, 0), 0x0B: (0x00000014, 0),  # SMC, SDMA
    0x0C: (0x00230045, 0x0000005C), 0x0D: (0x21000044, 0x21000044),  # SOS, ASD
    0x0E: (0x0D204004, 0), 0x0F: (0, 0), 0x10: (0, 0), 0x11: (0, 0),  # VCN, RLC lists
    0x12: (0, 0), 0x14: (0, 0), 0x15: (0x0000001E, 0x0000001E),  # DMCU, DMCUB, TOC
    0x16: (0, 0), 0x17: (0, 0), 0x18: (0, 0),  # CAP, RLCP, RLCV
    0x19: (0, 0), 0x1A: (0, 0), 0x1B: (0, 0), 0x1C: (0, 0),  # MES_KIQ, MES, IMU, VPE
    0x01: (0, 0), 0x02: (0, 0),  # VCE, UVD
}
# AMDGPU_INFO_SENSOR_* -> value in the query's unit (MHz, millidegrees C, %, W, mV);
# chosen for an idle part. VDDNB is absent: the SMU of these parts does not report it.
_GFX943_SENSORS: dict[int, int] = {
    0x1: 134, 0x2: 900, 0x3: 38000, 0x4: 0, 0x5: 142, 0x7: 725,
    0x8: 1300, 0x9: 1300, 0xA: 2100, 0xB: 1300, 0xC: 142,
}


@dataclass(frozen=True, slots=True)
class DeviceProfile:
    name: str
    pci_vendor: int
    pci_device: int
    pci_revision: int
    subsystem_vendor: int
    subsystem_device: int
    family: int
    chip_rev: int
    external_rev: int
    ids_flags: int  # AMDGPU_IDS_FLAGS_*: FUSION for an APU
    gfx_target_version: int  # KFD topology: major*10000 + minor*100 + stepping
    num_shader_engines: int
    num_cu: int  # active compute units
    simd_per_cu: int
    wave_front_size: int
    num_xcc: int
    vram_type: int  # AMDGPU_VRAM_TYPE_*: 6 = HBM
    vram_bit_width: int
    max_engine_clock_khz: int
    max_memory_clock_khz: int
    gb_addr_config: int  # READ_MMR_REG 0x263e (chosen)
    # DEV_INFO's remaining shape (chosen, gfx9-like; see amdgpu/info.py for the rest)
    num_shader_arrays_per_engine: int = 1
    num_cu_per_sh: int = 10
    num_tcc_blocks: int = 16
    min_engine_clock_khz: int = 500_000
    min_memory_clock_khz: int = 900_000
    gpu_counter_freq_khz: int = 100_000  # the TIMESTAMP counter: 100 MHz
    pcie_gen: int = 5
    pcie_num_lanes: int = 16
    # On-chip apertures (gfx_v9_0/gfx_v9_4_3_set_gds_init): GC 9.4.2 and 9.4.3 removed
    # all GDS memory; GWS and OA are counted in entries (TTM's range managers, one "page"
    # per entry).
    gds_size: int = 0
    gws_size: int = 64
    oa_size: int = 16
    sdma_instances: int = 16
    hw_ips: dict[int, HwIp] = field(default_factory=lambda: dict(_GFX943_IPS))
    firmware: dict[int, tuple[int, int]] = field(default_factory=lambda: dict(_GFX943_FW))
    sensors: dict[int, int] = field(default_factory=lambda: dict(_GFX943_SENSORS))


MI300X = DeviceProfile(
    name="mi300x", pci_vendor=PCI_VENDOR_ID_ATI, pci_device=0x74A1, pci_revision=0x00,
    subsystem_vendor=PCI_VENDOR_ID_ATI, subsystem_device=0x74A1, family=AMDGPU_FAMILY_AI,
    chip_rev=0, external_rev=0x3C, ids_flags=0, gfx_target_version=90402,
    num_shader_engines=32, num_cu=304, simd_per_cu=4, wave_front_size=64, num_xcc=8,
    vram_type=6, vram_bit_width=8192, max_engine_clock_khz=2_100_000,
    max_memory_clock_khz=1_300_000, gb_addr_config=0x2A114042,
)
MI300A = DeviceProfile(
    name="mi300a", pci_vendor=PCI_VENDOR_ID_ATI, pci_device=0x74A0, pci_revision=0x00,
    subsystem_vendor=PCI_VENDOR_ID_ATI, subsystem_device=0x74A0, family=AMDGPU_FAMILY_AI,
    chip_rev=0, external_rev=0x3C, ids_flags=AMDGPU_IDS_FLAGS_FUSION, gfx_target_version=90402,
    num_shader_engines=24, num_cu=228, simd_per_cu=4, wave_front_size=64, num_xcc=6,
    vram_type=6, vram_bit_width=8192, max_engine_clock_khz=2_100_000,
    max_memory_clock_khz=1_300_000, gb_addr_config=0x2A114042,
)
MI325X = DeviceProfile(
    name="mi325x", pci_vendor=PCI_VENDOR_ID_ATI, pci_device=0x74A5, pci_revision=0x00,
    subsystem_vendor=PCI_VENDOR_ID_ATI, subsystem_device=0x74A5, family=AMDGPU_FAMILY_AI,
    chip_rev=0, external_rev=0x3C, ids_flags=0, gfx_target_version=90402,
    num_shader_engines=32, num_cu=304, simd_per_cu=4, wave_front_size=64, num_xcc=8,
    vram_type=6, vram_bit_width=8192, max_engine_clock_khz=2_100_000,
    max_memory_clock_khz=1_300_000, gb_addr_config=0x2A114042,
)

# An MI200-class part (Aldebaran, GC 9.4.2 = gfx90a), which ROCr 5.2.3 knows: Debian's
# rocminfo lists it as a GPU agent without HSA_OVERRIDE_GFX_VERSION (it drops gfx942 as an
# "unrecognized id"). MI210's public shape: PCI 1002:740f, 104 CUs of 4 SIMDs, one XCC,
# 4096-bit HBM2e, 1700 MHz engine / 1600 MHz memory clock peaks, 64 GB (the emulated VRAM
# capacity is the pod config's, not the part's). Shader engines 8 x 13 CUs and the IP
# versions (SDMA 4.4.0 x 5, VCN/JPEG 2.6.0, VCN with a decode ring and encode rings, the
# encode mask capped at one entity) are Aldebaran's layout as chosen here;
# external_rev = rev_id + 0x3C as soc15.c sets it for Aldebaran.
_GFX90A_IPS: dict[int, HwIp] = {
    HW_IP_GFX: HwIp(9, 4, 0x090402, 0, 32, 32, 1),
    HW_IP_COMPUTE: HwIp(9, 4, 0x090402, 0xF, 32, 32, 1),
    HW_IP_DMA: HwIp(4, 4, 0x040400, 0x1, 256, 4, 5),
    HW_IP_VCN_DEC: HwIp(2, 6, 0x020600, 0x1, 256, 64, 2),
    HW_IP_VCN_ENC: HwIp(2, 6, 0x020600, 0x1, 256, 4, 2),
    HW_IP_VCN_JPEG: HwIp(2, 6, 0x020600, 0x1, 256, 64, 2),
}
MI210 = DeviceProfile(
    name="mi210", pci_vendor=PCI_VENDOR_ID_ATI, pci_device=0x740F, pci_revision=0x02,
    subsystem_vendor=PCI_VENDOR_ID_ATI, subsystem_device=0x0C34, family=AMDGPU_FAMILY_AI,
    chip_rev=0, external_rev=0x3E, ids_flags=0, gfx_target_version=90010,
    num_shader_engines=8, num_cu=104, simd_per_cu=4, wave_front_size=64, num_xcc=1,
    vram_type=6, vram_bit_width=4096, max_engine_clock_khz=1_700_000,
    max_memory_clock_khz=1_600_000, gb_addr_config=0x2A114042, num_cu_per_sh=13,
    sdma_instances=5, hw_ips=dict(_GFX90A_IPS),
)

PROFILES: dict[str, DeviceProfile] = {p.name: p for p in (MI300X, MI300A, MI325X, MI210)}
DEFAULT_PROFILE = MI300X.name
