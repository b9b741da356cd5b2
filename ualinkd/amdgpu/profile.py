"""Named device profiles: what an emulated accel says it is (PCI identity, family, shape).

One profile feeds both faces of an accel's identity, so they cannot disagree: the PCI sysfs
files libdrm's drmGetDevice2 reads (vendor, device, revision, subsystem ids, config) and the
AMDGPU_INFO answers amdgpu_device_initialize copies (DEV_INFO's device_id, family, CU and SE
counts), and later the KFD topology (gfx_target_version, simd_count). Values marked
"chosen" in spec/userspace-surface.md §2.2 are plausible, not measured on a device.
"""

from __future__ import annotations

from dataclasses import dataclass

AMDGPU_FAMILY_AI = 141  # amdgpu_drm.h; GC 9.4.3 / 9.4.4 (MI300) report AI
AMDGPU_IDS_FLAGS_FUSION = 0x1
PCI_VENDOR_ID_ATI = 0x1002


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

PROFILES: dict[str, DeviceProfile] = {p.name: p for p in (MI300X, MI300A, MI325X)}
DEFAULT_PROFILE = MI300X.name
