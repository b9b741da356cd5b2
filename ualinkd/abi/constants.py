"""Numeric constants of the uAPI (spec §1.1, §1.2, §2.2–§2.8, §5.2)."""

from __future__ import annotations

import enum
import os

# ---- DRM core ------------------------------------------------------------------------
DRM_CLOEXEC = os.O_CLOEXEC
DRM_RDWR = os.O_RDWR
DRM_CAP_PRIME = 0x5
DRM_PRIME_CAP_IMPORT = 0x1
DRM_PRIME_CAP_EXPORT = 0x2
# DRM_CAP_* (drm.h), named by the trace
DRM_CAPS = {0x1: "DUMB_BUFFER", 0x2: "VBLANK_HIGH_CRTC", 0x3: "DUMB_PREFERRED_DEPTH",
            0x4: "DUMB_PREFER_SHADOW", 0x5: "PRIME", 0x6: "TIMESTAMP_MONOTONIC",
            0x7: "ASYNC_PAGE_FLIP", 0x8: "CURSOR_WIDTH", 0x9: "CURSOR_HEIGHT",
            0x10: "ADDFB2_MODIFIERS", 0x11: "PAGE_FLIP_TARGET", 0x12: "CRTC_IN_VBLANK_EVENT",
            0x13: "SYNCOBJ", 0x14: "SYNCOBJ_TIMELINE", 0x15: "ATOMIC_ASYNC_PAGE_FLIP"}

# ---- DRM syncobjs (drm.h) -------------------------------------------------------------------
DRM_SYNCOBJ_CREATE_SIGNALED = 1 << 0
DRM_SYNCOBJ_WAIT_FLAGS_WAIT_ALL = 1 << 0
DRM_SYNCOBJ_WAIT_FLAGS_WAIT_FOR_SUBMIT = 1 << 1
DRM_SYNCOBJ_WAIT_FLAGS_WAIT_AVAILABLE = 1 << 2
DRM_SYNCOBJ_WAIT_FLAGS_WAIT_DEADLINE = 1 << 3
DRM_SYNCOBJ_QUERY_FLAGS_LAST_SUBMITTED = 1 << 0

# ---- GEM domains (§2.3) ------------------------------------------------------------------
DOMAIN_CPU = 0x1
DOMAIN_GTT = 0x2
DOMAIN_VRAM = 0x4
DOMAIN_GDS = 0x8
DOMAIN_GWS = 0x10
DOMAIN_OA = 0x20
DOMAIN_DOORBELL = 0x40
DOMAIN_MASK = 0x7F
DOMAIN_NPA = 0x80  # Emulator policy 6: internal only; GEM_CREATE rejects it like any bit > 0x7F

# ---- GEM create flags (§2.3) ------------------------------------------------------------
CREATE_CPU_ACCESS_REQUIRED = 1 << 0
CREATE_NO_CPU_ACCESS = 1 << 1
CREATE_CPU_GTT_USWC = 1 << 2
CREATE_VRAM_CLEARED = 1 << 3
CREATE_VRAM_CONTIGUOUS = 1 << 5
CREATE_VM_ALWAYS_VALID = 1 << 6
CREATE_EXPLICIT_SYNC = 1 << 7
CREATE_CP_MQD_GFX9 = 1 << 8
CREATE_VRAM_WIPE_ON_RELEASE = 1 << 9
CREATE_ENCRYPTED = 1 << 10
CREATE_PREEMPTIBLE = 1 << 11
CREATE_DISCARDABLE = 1 << 12
CREATE_COHERENT = 1 << 13
CREATE_UNCACHED = 1 << 14
CREATE_EXT_COHERENT = 1 << 15
CREATE_GFX12_DCC = 1 << 16
CREATE_SETTABLE_MASK = 0x1F6CF

# ---- GEM_VA (§2.6) ------------------------------------------------------------------------
VA_OP_MAP = 1
VA_OP_UNMAP = 2
VA_OP_CLEAR = 3
VA_OP_REPLACE = 4
VM_DELAY_UPDATE = 1 << 0
VM_PAGE_READABLE = 1 << 1
VM_PAGE_WRITEABLE = 1 << 2
VM_PAGE_EXECUTABLE = 1 << 3
VM_PAGE_PRT = 1 << 4
VM_MTYPE_MASK = 0xF << 5
VM_PAGE_NOALLOC = 1 << 9

# ---- GEM_OP (§2.8) ------------------------------------------------------------------------
GEM_OP_GET_GEM_CREATE_INFO = 0
GEM_OP_SET_PLACEMENT = 1
GEM_OP_GET_MAPPING_INFO = 2

# ---- GEM_METADATA (amdgpu_drm.h: SET is 1, GET is 2) -------------------------------------------
GEM_METADATA_OP_SET_METADATA = 1
GEM_METADATA_OP_GET_METADATA = 2

# ---- AMDGPU_INFO queries (amdgpu_drm.h AMDGPU_INFO_*) ------------------------------------
INFO_QUERIES = {0x00: "ACCEL_WORKING", 0x01: "CRTC_FROM_ID", 0x02: "HW_IP_INFO",
                0x03: "HW_IP_COUNT", 0x05: "TIMESTAMP", 0x0E: "FW_VERSION",
                0x0F: "NUM_BYTES_MOVED", 0x10: "VRAM_USAGE", 0x11: "GTT_USAGE",
                0x13: "GDS_CONFIG", 0x14: "VRAM_GTT", 0x15: "READ_MMR_REG", 0x16: "DEV_INFO",
                0x17: "VIS_VRAM_USAGE", 0x18: "NUM_EVICTIONS", 0x19: "MEMORY",
                0x1A: "VCE_CLOCK_TABLE", 0x1B: "VBIOS", 0x1C: "NUM_HANDLES", 0x1D: "SENSOR",
                0x1E: "NUM_VRAM_CPU_PAGE_FAULTS", 0x1F: "VRAM_LOST_COUNTER",
                0x20: "RAS_ENABLED_FEATURES", 0x21: "VIDEO_CAPS", 0x22: "MAX_IBS",
                0x23: "GPUVM_FAULT", 0x24: "UQ_FW_AREAS"}
# AMDGPU_BO_LIST_OP_* (amdgpu_drm.h)
BO_LIST_OP_CREATE, BO_LIST_OP_DESTROY, BO_LIST_OP_UPDATE = 0, 1, 2
BO_LIST_OPS = {BO_LIST_OP_CREATE: "CREATE", BO_LIST_OP_DESTROY: "DESTROY",
               BO_LIST_OP_UPDATE: "UPDATE"}
INFO_TIMESTAMP = 0x05  # the GPU clock counter, written to the caller's memory
# AMDGPU_CTX_OP_* and AMDGPU_VM_OP_* (amdgpu_drm.h)
CTX_OP_ALLOC_CTX, CTX_OP_FREE_CTX, CTX_OP_QUERY_STATE, CTX_OP_QUERY_STATE2 = 1, 2, 3, 4
CTX_OP_GET_STABLE_PSTATE, CTX_OP_SET_STABLE_PSTATE = 5, 6
CTX_OPS = {CTX_OP_ALLOC_CTX: "ALLOC_CTX", CTX_OP_FREE_CTX: "FREE_CTX",
           CTX_OP_QUERY_STATE: "QUERY_STATE", CTX_OP_QUERY_STATE2: "QUERY_STATE2",
           CTX_OP_GET_STABLE_PSTATE: "GET_STABLE_PSTATE",
           CTX_OP_SET_STABLE_PSTATE: "SET_STABLE_PSTATE"}
# AMDGPU_CTX_STABLE_PSTATE_* (the level in SET's in.flags and GET's out.pstate.flags)
CTX_STABLE_PSTATES = {0: "NONE", 1: "STANDARD", 2: "MIN_SCLK", 3: "MIN_MCLK", 4: "PEAK"}
CTX_STABLE_PSTATE_FLAGS_MASK, CTX_STABLE_PSTATE_NONE, CTX_STABLE_PSTATE_PEAK = 0xF, 0, 4
# AMDGPU_CTX_*_RESET (QUERY_STATE's reset_status)
CTX_RESETS = {0: "NO_RESET", 1: "GUILTY_RESET", 2: "INNOCENT_RESET", 3: "UNKNOWN_RESET"}
CTX_NO_RESET = 0
VM_OPS = {1: "RESERVE_VMID", 2: "UNRESERVE_VMID"}

# ---- UALink (§1.2) -------------------------------------------------------------------------


class UalinkOp(enum.IntEnum):
    EXPORT = 0
    IMPORT = 1


GPU_PAGE_SIZE = 4096  # AMDGPU_GPU_PAGE_SIZE: GPU VA and NPA pages
PAGE_SIZE = 4096  # x86-64's CPU page: BO sizes (amdgpu_bo_create), mmap offsets (drm_vma)

# AMDGPU_GEM_USERPTR flags (amdgpu_drm.h)
USERPTR_READONLY = 1 << 0
USERPTR_ANONONLY = 1 << 1
USERPTR_VALIDATE = 1 << 2
USERPTR_REGISTER = 1 << 3
USERPTR_FLAGS = USERPTR_READONLY | USERPTR_ANONONLY | USERPTR_VALIDATE | USERPTR_REGISTER

# drm.h: syncobj fds
DRM_SYNCOBJ_FD_TO_HANDLE_FLAGS_IMPORT_SYNC_FILE = 1 << 0
DRM_SYNCOBJ_HANDLE_TO_FD_FLAGS_EXPORT_SYNC_FILE = 1 << 0
