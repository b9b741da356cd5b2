"""Ioctl numbers and uAPI constants: the C header, `abi/ioc.py`, the ioctl table and the spec.

The header's `#define`s are read through `static const unsigned int X_VAL = X;` in a cffi
API-mode module, so the values are what a C client compiles against (spec §1.1, §2.2).
The header must also compile on its own, twice, and after the system DRM headers.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from cffi_compiled import compiled

import ualinkd.node  # noqa: F401  (the daemon's assembly: every handler module registers)
from ualinkd.abi import constants as c
from ualinkd.abi import ioctls as tbl
from ualinkd.abi import structs as st
from ualinkd.abi.ioc import DRM_COMMAND_BASE, DRM_COMMAND_END, DRM_IOCTL_BASE, ioc, iow, iowr

ROOT = Path(__file__).resolve().parents[2]
INCLUDE = ROOT / "include"

# Spec §1.1 and §2.2 table, literally.
SPEC_IOCTLS = {
    "DRM_IOCTL_GEM_CLOSE": 0x40086409,
    "DRM_IOCTL_PRIME_HANDLE_TO_FD": 0xC00C642D,
    "DRM_IOCTL_PRIME_FD_TO_HANDLE": 0xC00C642E,
    "DRM_IOCTL_AMDGPU_GEM_CREATE": 0xC0206440,
    "DRM_IOCTL_AMDGPU_GEM_MMAP": 0xC0086441,
    "DRM_IOCTL_AMDGPU_GEM_VA": 0x40406448,
    "DRM_IOCTL_AMDGPU_GEM_OP": 0xC0186450,
    "DRM_IOCTL_AMDGPU_UALINK_HANDLE": 0xC018645B,
    # drm.h / amdgpu_drm.h (syncobjs, GEM_METADATA): _IOWR('d', nr, size) of the kernel's
    "DRM_IOCTL_SYNCOBJ_CREATE": 0xC00864BF,
    "DRM_IOCTL_SYNCOBJ_DESTROY": 0xC00864C0,
    "DRM_IOCTL_SYNCOBJ_WAIT": 0xC02864C3,
    "DRM_IOCTL_SYNCOBJ_RESET": 0xC01064C4,
    "DRM_IOCTL_SYNCOBJ_SIGNAL": 0xC01064C5,
    "DRM_IOCTL_SYNCOBJ_TIMELINE_WAIT": 0xC03064CA,
    "DRM_IOCTL_SYNCOBJ_QUERY": 0xC01864CB,
    "DRM_IOCTL_SYNCOBJ_TIMELINE_SIGNAL": 0xC01864CD,
    "DRM_IOCTL_AMDGPU_GEM_METADATA": 0xC1206446,
    # libdrm's amdgpu_bo_wait_for_idle (amdgpu_drm.h: DRM_IOWR, a 16-byte union)
    "DRM_IOCTL_AMDGPU_GEM_WAIT_IDLE": 0xC0106447,
    # userspace-surface.md §2.2 / §7: VERSION, INFO, CTX, VM and the syncobj fd ioctls
    "DRM_IOCTL_VERSION": 0xC0406400,
    "DRM_IOCTL_AMDGPU_INFO": 0x40206445,
    "DRM_IOCTL_AMDGPU_CTX": 0xC0106442,
    "DRM_IOCTL_AMDGPU_VM": 0xC0086453,
    "DRM_IOCTL_SYNCOBJ_HANDLE_TO_FD": 0xC01064C1,
    "DRM_IOCTL_SYNCOBJ_FD_TO_HANDLE": 0xC01064C2,
    "DRM_IOCTL_SYNCOBJ_TRANSFER": 0xC02064CC,
    "DRM_IOCTL_SYNCOBJ_EVENTFD": 0xC01864CF,
    # issue 35: libdrm's amdgpu_bo_list_create / _update / _destroy (a 24-byte union)
    "DRM_IOCTL_AMDGPU_BO_LIST": 0xC0186443,
    "DRM_IOCTL_AMDGPU_CS": 0xC0186444,
    "DRM_IOCTL_AMDGPU_WAIT_CS": 0xC0206449,
    "DRM_IOCTL_AMDGPU_WAIT_FENCES": 0xC0186452,
    "DRM_IOCTL_AMDGPU_FENCE_TO_HANDLE": 0xC0206454,
}

# Header macro -> expected value from ualinkd's own constants.
CONSTANTS = {
    "DRM_IOCTL_GEM_CLOSE": iow(0x09, st.GEM_CLOSE.size),
    "DRM_IOCTL_GET_CAP": iowr(0x0C, st.GET_CAP.size),
    "DRM_IOCTL_PRIME_HANDLE_TO_FD": iowr(0x2D, st.PRIME_HANDLE.size),
    "DRM_IOCTL_PRIME_FD_TO_HANDLE": iowr(0x2E, st.PRIME_HANDLE.size),
    "DRM_IOCTL_AMDGPU_GEM_CREATE": iowr(0x40, st.GEM_CREATE_SIZE),
    "DRM_IOCTL_AMDGPU_GEM_MMAP": iowr(0x41, st.GEM_MMAP_SIZE),
    "DRM_IOCTL_AMDGPU_GEM_VA": iow(0x48, st.GEM_VA.size),
    "DRM_IOCTL_AMDGPU_GEM_OP": iowr(0x50, st.GEM_OP.size),
    "DRM_IOCTL_AMDGPU_UALINK_HANDLE": ioc(3, 0x64, 0x5B, st.UALINK_HANDLE_SIZE),
    "DRM_IOCTL_SYNCOBJ_CREATE": iowr(0xBF, st.SYNCOBJ_CREATE.size),
    "DRM_IOCTL_SYNCOBJ_DESTROY": iowr(0xC0, st.SYNCOBJ_DESTROY.size),
    "DRM_IOCTL_SYNCOBJ_WAIT": iowr(0xC3, st.SYNCOBJ_WAIT.size),
    "DRM_IOCTL_SYNCOBJ_RESET": iowr(0xC4, st.SYNCOBJ_ARRAY.size),
    "DRM_IOCTL_SYNCOBJ_SIGNAL": iowr(0xC5, st.SYNCOBJ_ARRAY.size),
    "DRM_IOCTL_SYNCOBJ_TIMELINE_WAIT": iowr(0xCA, st.SYNCOBJ_TIMELINE_WAIT.size),
    "DRM_IOCTL_SYNCOBJ_QUERY": iowr(0xCB, st.SYNCOBJ_TIMELINE_ARRAY.size),
    "DRM_IOCTL_SYNCOBJ_TIMELINE_SIGNAL": iowr(0xCD, st.SYNCOBJ_TIMELINE_ARRAY.size),
    "DRM_IOCTL_AMDGPU_GEM_METADATA": iowr(0x46, st.GEM_METADATA_SIZE),
    "DRM_IOCTL_AMDGPU_GEM_WAIT_IDLE": iowr(0x47, st.GEM_WAIT_IDLE_SIZE),
    "DRM_AMDGPU_GEM_METADATA": 0x06,
    "DRM_SYNCOBJ_CREATE_SIGNALED": c.DRM_SYNCOBJ_CREATE_SIGNALED,
    "DRM_SYNCOBJ_WAIT_FLAGS_WAIT_ALL": c.DRM_SYNCOBJ_WAIT_FLAGS_WAIT_ALL,
    "DRM_SYNCOBJ_WAIT_FLAGS_WAIT_FOR_SUBMIT": c.DRM_SYNCOBJ_WAIT_FLAGS_WAIT_FOR_SUBMIT,
    "DRM_SYNCOBJ_WAIT_FLAGS_WAIT_AVAILABLE": c.DRM_SYNCOBJ_WAIT_FLAGS_WAIT_AVAILABLE,
    "DRM_SYNCOBJ_WAIT_FLAGS_WAIT_DEADLINE": c.DRM_SYNCOBJ_WAIT_FLAGS_WAIT_DEADLINE,
    "DRM_SYNCOBJ_QUERY_FLAGS_LAST_SUBMITTED": c.DRM_SYNCOBJ_QUERY_FLAGS_LAST_SUBMITTED,
    "AMDGPU_GEM_METADATA_OP_SET_METADATA": c.GEM_METADATA_OP_SET_METADATA,
    "AMDGPU_GEM_METADATA_OP_GET_METADATA": c.GEM_METADATA_OP_GET_METADATA,
    "DRM_IOCTL_BASE": DRM_IOCTL_BASE,
    "DRM_COMMAND_BASE": DRM_COMMAND_BASE,
    "DRM_COMMAND_END": DRM_COMMAND_END,
    "DRM_AMDGPU_GEM_CREATE": 0x00,
    "DRM_AMDGPU_GEM_MMAP": 0x01,
    "DRM_AMDGPU_GEM_VA": 0x08,
    "DRM_AMDGPU_GEM_OP": 0x10,
    "DRM_AMDGPU_GEM_USERPTR": 0x11,
    "DRM_IOCTL_AMDGPU_GEM_USERPTR": iowr(0x51, st.GEM_USERPTR.size),
    "AMDGPU_GEM_USERPTR_READONLY": c.USERPTR_READONLY,
    "AMDGPU_GEM_USERPTR_ANONONLY": c.USERPTR_ANONONLY,
    "AMDGPU_GEM_USERPTR_VALIDATE": c.USERPTR_VALIDATE,
    "AMDGPU_GEM_USERPTR_REGISTER": c.USERPTR_REGISTER,
    "DRM_AMDGPU_UALINK_HANDLE": 0x1B,
    "DRM_AMDGPU_UALINK_HANDLE_OP_EXPORT": c.UalinkOp.EXPORT,
    "DRM_AMDGPU_UALINK_HANDLE_OP_IMPORT": c.UalinkOp.IMPORT,
    "DRM_CLOEXEC": c.DRM_CLOEXEC,
    "DRM_RDWR": c.DRM_RDWR,
    "DRM_CAP_PRIME": c.DRM_CAP_PRIME,
    "DRM_PRIME_CAP_IMPORT": c.DRM_PRIME_CAP_IMPORT,
    "DRM_PRIME_CAP_EXPORT": c.DRM_PRIME_CAP_EXPORT,
    "AMDGPU_GEM_DOMAIN_CPU": c.DOMAIN_CPU,
    "AMDGPU_GEM_DOMAIN_GTT": c.DOMAIN_GTT,
    "AMDGPU_GEM_DOMAIN_VRAM": c.DOMAIN_VRAM,
    "AMDGPU_GEM_DOMAIN_GDS": c.DOMAIN_GDS,
    "AMDGPU_GEM_DOMAIN_GWS": c.DOMAIN_GWS,
    "AMDGPU_GEM_DOMAIN_OA": c.DOMAIN_OA,
    "AMDGPU_GEM_DOMAIN_DOORBELL": c.DOMAIN_DOORBELL,
    "AMDGPU_GEM_DOMAIN_MASK": c.DOMAIN_MASK,
    "AMDGPU_GEM_CREATE_CPU_ACCESS_REQUIRED": c.CREATE_CPU_ACCESS_REQUIRED,
    "AMDGPU_GEM_CREATE_NO_CPU_ACCESS": c.CREATE_NO_CPU_ACCESS,
    "AMDGPU_GEM_CREATE_CPU_GTT_USWC": c.CREATE_CPU_GTT_USWC,
    "AMDGPU_GEM_CREATE_VRAM_CLEARED": c.CREATE_VRAM_CLEARED,
    "AMDGPU_GEM_CREATE_VRAM_CONTIGUOUS": c.CREATE_VRAM_CONTIGUOUS,
    "AMDGPU_GEM_CREATE_VM_ALWAYS_VALID": c.CREATE_VM_ALWAYS_VALID,
    "AMDGPU_GEM_CREATE_EXPLICIT_SYNC": c.CREATE_EXPLICIT_SYNC,
    "AMDGPU_VA_OP_MAP": c.VA_OP_MAP,
    "AMDGPU_VA_OP_UNMAP": c.VA_OP_UNMAP,
    "AMDGPU_VA_OP_CLEAR": c.VA_OP_CLEAR,
    "AMDGPU_VA_OP_REPLACE": c.VA_OP_REPLACE,
    "AMDGPU_VM_DELAY_UPDATE": c.VM_DELAY_UPDATE,
    "AMDGPU_VM_PAGE_READABLE": c.VM_PAGE_READABLE,
    "AMDGPU_VM_PAGE_WRITEABLE": c.VM_PAGE_WRITEABLE,
    "AMDGPU_VM_PAGE_EXECUTABLE": c.VM_PAGE_EXECUTABLE,
    "AMDGPU_VM_PAGE_PRT": c.VM_PAGE_PRT,
    "AMDGPU_GEM_OP_GET_GEM_CREATE_INFO": c.GEM_OP_GET_GEM_CREATE_INFO,
    "AMDGPU_GEM_OP_SET_PLACEMENT": c.GEM_OP_SET_PLACEMENT,
    "AMDGPU_GEM_OP_GET_MAPPING_INFO": c.GEM_OP_GET_MAPPING_INFO,
    "DRM_IOCTL_VERSION": iowr(0x00, st.DRM_VERSION.size),
    "DRM_IOCTL_AMDGPU_INFO": iow(0x45, st.INFO.size),
    "DRM_IOCTL_AMDGPU_CTX": iowr(0x42, st.CTX_SIZE),
    "DRM_IOCTL_AMDGPU_VM": iowr(0x53, st.VM_SIZE),
    "DRM_IOCTL_AMDGPU_BO_LIST": iowr(0x43, st.BO_LIST_SIZE),
    "AMDGPU_BO_LIST_OP_CREATE": c.BO_LIST_OP_CREATE,
    "AMDGPU_BO_LIST_OP_DESTROY": c.BO_LIST_OP_DESTROY,
    "AMDGPU_BO_LIST_OP_UPDATE": c.BO_LIST_OP_UPDATE,
    "DRM_IOCTL_AMDGPU_CS": iowr(0x44, st.CS_SIZE),
    "DRM_IOCTL_AMDGPU_WAIT_CS": iowr(0x49, st.WAIT_CS_SIZE),
    "DRM_IOCTL_AMDGPU_WAIT_FENCES": iowr(0x52, st.WAIT_FENCES_SIZE),
    "DRM_IOCTL_AMDGPU_FENCE_TO_HANDLE": iowr(0x54, st.FENCE_TO_HANDLE_SIZE),
    "AMDGPU_FENCE_TO_HANDLE_GET_SYNC_FILE_FD": c.FENCE_TO_HANDLE_GET_SYNC_FILE_FD,
    "AMDGPU_CHUNK_ID_IB": c.CHUNK_ID_IB,
    "AMDGPU_CHUNK_ID_BO_HANDLES": c.CHUNK_ID_BO_HANDLES,
    "AMDGPU_CHUNK_ID_SYNCOBJ_TIMELINE_SIGNAL": c.CHUNK_ID_SYNCOBJ_TIMELINE_SIGNAL,
    "DRM_IOCTL_SYNCOBJ_HANDLE_TO_FD": iowr(0xC1, st.SYNCOBJ_HANDLE.size),
    "DRM_IOCTL_SYNCOBJ_FD_TO_HANDLE": iowr(0xC2, st.SYNCOBJ_HANDLE.size),
    "DRM_IOCTL_SYNCOBJ_TRANSFER": iowr(0xCC, st.SYNCOBJ_TRANSFER.size),
    "DRM_IOCTL_SYNCOBJ_EVENTFD": iowr(0xCF, st.SYNCOBJ_EVENTFD.size),
    "DRM_CAP_SYNCOBJ": 0x13,
    "DRM_CAP_SYNCOBJ_TIMELINE": 0x14,
    "AMDGPU_INFO_ACCEL_WORKING": 0x00,
    "AMDGPU_INFO_DEV_INFO": 0x16,
    "AMDGPU_INFO_READ_MMR_REG": 0x15,
    "AMDGPU_INFO_MEMORY": 0x19,
    "AMDGPU_INFO_SENSOR": 0x1D,
    "AMDGPU_INFO_VRAM_LOST_COUNTER": 0x1F,
    "AMDGPU_CTX_OP_ALLOC_CTX": 1,
    "AMDGPU_CTX_OP_QUERY_STATE2": 4,
    "AMDGPU_CTX_OP_GET_STABLE_PSTATE": 5,
    "AMDGPU_CTX_OP_SET_STABLE_PSTATE": 6,
    "AMDGPU_CTX_STABLE_PSTATE_FLAGS_MASK": 0xF,
    "AMDGPU_CTX_STABLE_PSTATE_PEAK": 4,
    "AMDGPU_VM_OP_RESERVE_VMID": 1,
    "AMDGPU_VM_OP_UNRESERVE_VMID": 2,
    "DRM_SYNCOBJ_FD_TO_HANDLE_FLAGS_IMPORT_SYNC_FILE": 1,
    "DRM_SYNCOBJ_HANDLE_TO_FD_FLAGS_EXPORT_SYNC_FILE": 1,
}

# Header macro -> (table, nr) of the entry ualinkd dispatches on.
TABLE_ENTRIES = {
    "DRM_IOCTL_GEM_CLOSE": (tbl.CORE_IOCTLS, 0x09),
    "DRM_IOCTL_GET_CAP": (tbl.CORE_IOCTLS, 0x0C),
    "DRM_IOCTL_PRIME_HANDLE_TO_FD": (tbl.CORE_IOCTLS, 0x2D),
    "DRM_IOCTL_PRIME_FD_TO_HANDLE": (tbl.CORE_IOCTLS, 0x2E),
    "DRM_IOCTL_AMDGPU_GEM_CREATE": (tbl.AMDGPU_IOCTLS, 0x40),
    "DRM_IOCTL_AMDGPU_GEM_MMAP": (tbl.AMDGPU_IOCTLS, 0x41),
    "DRM_IOCTL_AMDGPU_GEM_VA": (tbl.AMDGPU_IOCTLS, 0x48),
    "DRM_IOCTL_AMDGPU_GEM_OP": (tbl.AMDGPU_IOCTLS, 0x50),
    "DRM_IOCTL_AMDGPU_UALINK_HANDLE": (tbl.AMDGPU_IOCTLS, 0x5B),
    "DRM_IOCTL_SYNCOBJ_CREATE": (tbl.CORE_IOCTLS, 0xBF),
    "DRM_IOCTL_SYNCOBJ_DESTROY": (tbl.CORE_IOCTLS, 0xC0),
    "DRM_IOCTL_SYNCOBJ_WAIT": (tbl.CORE_IOCTLS, 0xC3),
    "DRM_IOCTL_SYNCOBJ_RESET": (tbl.CORE_IOCTLS, 0xC4),
    "DRM_IOCTL_SYNCOBJ_SIGNAL": (tbl.CORE_IOCTLS, 0xC5),
    "DRM_IOCTL_SYNCOBJ_TIMELINE_WAIT": (tbl.CORE_IOCTLS, 0xCA),
    "DRM_IOCTL_SYNCOBJ_QUERY": (tbl.CORE_IOCTLS, 0xCB),
    "DRM_IOCTL_SYNCOBJ_TIMELINE_SIGNAL": (tbl.CORE_IOCTLS, 0xCD),
    "DRM_IOCTL_AMDGPU_GEM_METADATA": (tbl.AMDGPU_IOCTLS, 0x46),
    "DRM_IOCTL_AMDGPU_GEM_WAIT_IDLE": (tbl.AMDGPU_IOCTLS, 0x47),
    "DRM_IOCTL_AMDGPU_GEM_USERPTR": (tbl.AMDGPU_IOCTLS, 0x51),
    "DRM_IOCTL_VERSION": (tbl.CORE_IOCTLS, 0x00),
    "DRM_IOCTL_AMDGPU_INFO": (tbl.AMDGPU_IOCTLS, 0x45),
    "DRM_IOCTL_AMDGPU_CTX": (tbl.AMDGPU_IOCTLS, 0x42),
    "DRM_IOCTL_AMDGPU_VM": (tbl.AMDGPU_IOCTLS, 0x53),
    "DRM_IOCTL_AMDGPU_BO_LIST": (tbl.AMDGPU_IOCTLS, 0x43),
    "DRM_IOCTL_AMDGPU_CS": (tbl.AMDGPU_IOCTLS, 0x44),
    "DRM_IOCTL_AMDGPU_WAIT_CS": (tbl.AMDGPU_IOCTLS, 0x49),
    "DRM_IOCTL_AMDGPU_WAIT_FENCES": (tbl.AMDGPU_IOCTLS, 0x52),
    "DRM_IOCTL_AMDGPU_FENCE_TO_HANDLE": (tbl.AMDGPU_IOCTLS, 0x54),
    "DRM_IOCTL_SYNCOBJ_HANDLE_TO_FD": (tbl.CORE_IOCTLS, 0xC1),
    "DRM_IOCTL_SYNCOBJ_FD_TO_HANDLE": (tbl.CORE_IOCTLS, 0xC2),
    "DRM_IOCTL_SYNCOBJ_TRANSFER": (tbl.CORE_IOCTLS, 0xCC),
    "DRM_IOCTL_SYNCOBJ_EVENTFD": (tbl.CORE_IOCTLS, 0xCF),
}


@pytest.fixture(scope="session")
def header_values(tmp_path_factory) -> dict[str, int]:
    """Every macro of CONSTANTS as the C compiler evaluates it."""
    tmp = tmp_path_factory.mktemp("cffi_ioctls")
    mod = compiled(
        tmp, "_ualink_drm_consts",
        "\n".join(f"static const unsigned int {n}_VAL;" for n in CONSTANTS),
        '#include "ualink/ualink_drm.h"\n'
        + "\n".join(f"static const unsigned int {n}_VAL = {n};" for n in CONSTANTS),
        [str(INCLUDE)])
    return {n: getattr(mod.lib, f"{n}_VAL") for n in CONSTANTS}


@pytest.mark.parametrize("name", list(CONSTANTS))
def test_header_constant_matches_python(header_values, name):
    """§1.1, §1.2, §2.2–§2.8: each header macro equals ualinkd's value."""
    assert header_values[name] == CONSTANTS[name]


@pytest.mark.parametrize("name", list(SPEC_IOCTLS))
def test_ioctl_number_matches_spec_table(header_values, name):
    """§1.1 and the §2.2 table: the full ioctl values, literally."""
    assert header_values[name] == SPEC_IOCTLS[name]
    assert CONSTANTS[name] == SPEC_IOCTLS[name]


def test_table_entries_cover_every_emulated_entry():
    """The header-checked entries are exactly the emulated ones plus the header's others:
    every entry with a handler has its DRM_IOCTL_ macro compared below."""
    checked = {table[nr] for table, nr in TABLE_ENTRIES.values()}
    emulated = {s for s in tbl.all_entries() if s.emulated}
    assert emulated <= checked, sorted(s.name for s in emulated - checked)
    for macro, (table, nr) in TABLE_ENTRIES.items():
        assert macro == "DRM_IOCTL_" + table[nr].name


def test_every_handler_is_registered_against_a_table_entry():
    """ioctls.py is the one table: a node's devices dispatch exactly the entries the table
    calls emulated, each keyed by the entry itself (core ones by the device, the rest by
    the driver)."""
    from ualinkd.config import PodConfig
    from ualinkd.node import NodeCore

    device = next(iter(NodeCore(PodConfig.local(1, 1), "node0").devices.values()))
    bound = {**device.handlers, **device.driver.ioctls}
    assert set(bound) == {s for s in tbl.all_entries() if s.emulated}
    assert all(s.core for s in device.handlers)
    assert not any(s.core for s in device.driver.ioctls)
    assert all(tbl.lookup(s.nr) is s for s in bound)


@pytest.mark.parametrize("name", list(TABLE_ENTRIES))
def test_dispatch_table_cmd_matches_header(header_values, name):
    """§2.2: the table cmd (direction and size used by dispatch, §2.1) is the header's."""
    table, nr = TABLE_ENTRIES[name]
    spec = table[nr]
    assert spec.nr == nr
    assert tbl.lookup(nr) is spec
    assert spec.cmd == header_values[name]
    assert spec.flags & tbl.DRM_RENDER_ALLOW


def test_ualink_entry_and_table_end():
    """§1.1: index 0x1B → nr 0x5B, flags AUTH|RENDER_ALLOW, and the table ends there."""
    spec = tbl.AMDGPU_IOCTLS[0x5B]
    assert spec.name == "AMDGPU_UALINK_HANDLE"
    assert spec.flags == tbl.DRM_AUTH | tbl.DRM_RENDER_ALLOW
    assert spec.emulated
    assert tbl.AMDGPU_NUM_IOCTLS == 0x1C
    assert max(tbl.AMDGPU_IOCTLS) == DRM_COMMAND_BASE + 0x1B
    assert all(tbl.lookup(nr) is None for nr in range(0x4A, 0x50))
    assert all(tbl.lookup(nr) is None for nr in range(0x5C, 0xA0))


def test_emulated_entries():
    """§2.2: exactly the ioctls a UALink client needs are emulated."""
    emulated = {s.name for s in (*tbl.CORE_IOCTLS.values(), *tbl.AMDGPU_IOCTLS.values())
                if s.emulated}
    assert emulated == {
        "GEM_CLOSE", "GET_CAP", "PRIME_HANDLE_TO_FD", "PRIME_FD_TO_HANDLE",
        "AMDGPU_GEM_CREATE", "AMDGPU_GEM_MMAP", "AMDGPU_GEM_VA", "AMDGPU_GEM_OP",
        "AMDGPU_UALINK_HANDLE", "AMDGPU_GEM_METADATA",
        # userptr BOs, for the userptr rules of §1.6 E2, §2.5, §2.7, §2.8
        "AMDGPU_GEM_USERPTR",
        # libhsakmt's VA map/unmap waits on a timeline syncobj (spec §9)
        "SYNCOBJ_CREATE", "SYNCOBJ_DESTROY", "SYNCOBJ_WAIT", "SYNCOBJ_RESET", "SYNCOBJ_SIGNAL",
        "SYNCOBJ_TIMELINE_WAIT", "SYNCOBJ_QUERY", "SYNCOBJ_TIMELINE_SIGNAL",
        # unmodified libdrm_amdgpu clients (userspace-surface.md §7 items 4, 5, 8, 9)
        "VERSION", "AMDGPU_INFO", "AMDGPU_CTX", "AMDGPU_VM",
        "SYNCOBJ_HANDLE_TO_FD", "SYNCOBJ_FD_TO_HANDLE", "SYNCOBJ_TRANSFER", "SYNCOBJ_EVENTFD",
        # libdrm's amdgpu_bo_wait_for_idle: every BO is idle (nothing executes)
        "AMDGPU_GEM_WAIT_IDLE",
        # command submission (issue 35): BO lists, SDMA IBs, their fences
        "AMDGPU_BO_LIST", "AMDGPU_CS", "AMDGPU_WAIT_CS", "AMDGPU_WAIT_FENCES",
        "AMDGPU_FENCE_TO_HANDLE",
    }


def test_table_nrs_are_consistent():
    """§2.1: every table entry's cmd carries its own nr and the 'd' type."""
    for table in (tbl.CORE_IOCTLS, tbl.AMDGPU_IOCTLS):
        for nr, spec in table.items():
            assert spec.nr == nr
            assert spec.cmd & 0xFF == nr
            assert (spec.cmd >> 8) & 0xFF == DRM_IOCTL_BASE


# ---- the header compiles in every way a client may include it -----------------------------

GCC = shutil.which("gcc")
needs_gcc = pytest.mark.skipif(GCC is None, reason="needs gcc")


def _compile(source: str, *extra: str) -> subprocess.CompletedProcess:
    assert GCC is not None
    return subprocess.run(
        [GCC, "-fsyntax-only", "-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic",
         f"-I{INCLUDE}", *extra, "-x", "c", "-"],
        input=source, capture_output=True, text=True, check=False,
    )


_USE = """
_Static_assert(sizeof(union drm_amdgpu_ualink_handle) == 24, "size");
_Static_assert(DRM_IOCTL_AMDGPU_UALINK_HANDLE == 0xC018645Bu, "nr");
int main(void) { return 0; }
"""


@needs_gcc
def test_header_compiles_alone():
    """§1.3: the header is self-contained C11 (-Wall -Wextra -pedantic -Werror)."""
    r = _compile('#include "ualink/ualink_drm.h"\n' + _USE)
    assert r.returncode == 0, r.stderr


@needs_gcc
def test_header_compiles_twice_included():
    """§1.3: the include guard holds."""
    r = _compile('#include "ualink/ualink_drm.h"\n#include "ualink/ualink_drm.h"\n' + _USE)
    assert r.returncode == 0, r.stderr


def _system_drm_flags() -> tuple[list[str], str] | None:
    """Flags and includes that bring in the system DRM and amdgpu uAPI headers, or None."""
    if GCC is None:
        return None
    # The kernel's uapi layout (<drm/drm.h>) or libdrm's (-I/usr/include/libdrm, <drm.h>).
    for flags, src in (([], _KERNEL_STYLE), (["-I/usr/include/libdrm"], _LIBDRM_STYLE)):
        r = subprocess.run(
            [GCC, "-fsyntax-only", *flags, "-x", "c", "-"],
            input=src, capture_output=True, text=True, check=False,
        )
        if r.returncode == 0:
            return flags, src
    return None


_KERNEL_STYLE = "#include <drm/drm.h>\n#include <drm/amdgpu_drm.h>\n"
_LIBDRM_STYLE = "#include <drm.h>\n#include <amdgpu_drm.h>\n"


SYSTEM_DRM = _system_drm_flags()


@pytest.mark.skipif(SYSTEM_DRM is None, reason="no system DRM headers (libdrm-dev)")
def test_header_compiles_after_system_drm_headers():
    """§1.1: included after the system DRM headers, the header adds only the UALink block
    and its layout and number still agree."""
    assert SYSTEM_DRM is not None
    flags, system = SYSTEM_DRM
    src = system + "#include \"ualink/ualink_drm.h\"\n"
    r = _compile(src + _USE, *flags)
    assert r.returncode == 0, r.stderr
