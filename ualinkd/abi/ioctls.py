"""The static half of the ioctl tables: nr -> name, table cmd (direction, size), flags.

Handlers are bound in `drm/` and `amdgpu/`; this table alone drives the trace decoder and
the ABI tests. Flags are the kernel's DRM_* access flags (drm_ioctl.c, spec §2.1).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import structs as st
from .ioc import DRM_COMMAND_BASE, IOC_NONE, IOC_READ, IOC_WRITE, ioc, iow, iowr

DRM_AUTH = 0x1
DRM_MASTER = 0x2
DRM_ROOT_ONLY = 0x4
DRM_RENDER_ALLOW = 0x20

_RW = IOC_READ | IOC_WRITE


@dataclass(frozen=True, slots=True)
class IoctlSpec:
    nr: int
    name: str
    cmd: int  # the table's own cmd: its direction and size decide copy-in/out with the user's
    flags: int
    emulated: bool = True  # False: the kernel has it, ualinkd answers ENOTTY (README)


def _core(nr: int, name: str, direction: int, size: int, flags: int, emulated: bool = False):
    return IoctlSpec(nr, name, ioc(direction, ord("d"), nr, size), flags, emulated)


# DRM core ioctls of a modern kernel (no DRM_LEGACY, CONFIG_AGP off). Only the nrs listed
# exist; any other core nr is EINVAL. Those without DRM_RENDER_ALLOW answer EACCES on a
# render node before their handler would run, so they need no emulation.
CORE_IOCTLS: dict[int, IoctlSpec] = {
    s.nr: s
    for s in [
        _core(0x00, "VERSION", _RW, 64, DRM_RENDER_ALLOW),
        _core(0x01, "GET_UNIQUE", _RW, 16, 0),
        _core(0x02, "GET_MAGIC", IOC_READ, 4, 0),
        _core(0x03, "IRQ_BUSID", _RW, 16, DRM_MASTER | DRM_ROOT_ONLY),
        _core(0x05, "GET_CLIENT", _RW, 40, 0),
        _core(0x06, "GET_STATS", IOC_READ, 248, 0),
        _core(0x07, "SET_VERSION", _RW, 16, DRM_MASTER),
        _core(0x08, "MODESET_CTL", IOC_WRITE, 8, 0),
        IoctlSpec(0x09, "GEM_CLOSE", iow(0x09, st.GEM_CLOSE.size), DRM_RENDER_ALLOW),
        _core(0x0A, "GEM_FLINK", _RW, 8, DRM_AUTH),
        _core(0x0B, "GEM_OPEN", _RW, 16, DRM_AUTH),
        IoctlSpec(0x0C, "GET_CAP", iowr(0x0C, st.GET_CAP.size), DRM_RENDER_ALLOW),
        _core(0x0D, "SET_CLIENT_CAP", IOC_WRITE, 16, 0),
        _core(0x10, "SET_UNIQUE", IOC_WRITE, 16, DRM_AUTH | DRM_MASTER | DRM_ROOT_ONLY),
        _core(0x11, "AUTH_MAGIC", IOC_WRITE, 4, DRM_MASTER),
        _core(0x12, "BLOCK", _RW, 4, DRM_AUTH | DRM_MASTER | DRM_ROOT_ONLY),
        _core(0x13, "UNBLOCK", _RW, 4, DRM_AUTH | DRM_MASTER | DRM_ROOT_ONLY),
        _core(0x1E, "SET_MASTER", IOC_NONE, 0, 0),
        _core(0x1F, "DROP_MASTER", IOC_NONE, 0, 0),
        _core(0x27, "ADD_DRAW", _RW, 4, DRM_AUTH | DRM_MASTER | DRM_ROOT_ONLY),
        _core(0x28, "RM_DRAW", _RW, 4, DRM_AUTH | DRM_MASTER | DRM_ROOT_ONLY),
        _core(0x2C, "FINISH", IOC_WRITE, 8, DRM_AUTH),
        IoctlSpec(
            0x2D, "PRIME_HANDLE_TO_FD", iowr(0x2D, st.PRIME_HANDLE.size), DRM_RENDER_ALLOW
        ),
        IoctlSpec(
            0x2E, "PRIME_FD_TO_HANDLE", iowr(0x2E, st.PRIME_HANDLE.size), DRM_RENDER_ALLOW
        ),
        _core(0x3A, "WAIT_VBLANK", _RW, 24, 0),
        _core(0x3B, "CRTC_GET_SEQUENCE", _RW, 24, 0),
        _core(0x3C, "CRTC_QUEUE_SEQUENCE", _RW, 24, 0),
        _core(0x3F, "UPDATE_DRAW", IOC_WRITE, 24, DRM_AUTH | DRM_MASTER | DRM_ROOT_ONLY),
        *(
            _core(nr, f"MODE_{name}", _RW, 8, flags)
            for nr, name, flags in [
                (0xA0, "GETRESOURCES", 0), (0xA1, "GETCRTC", 0), (0xA2, "SETCRTC", DRM_MASTER),
                (0xA3, "CURSOR", DRM_MASTER), (0xA4, "GETGAMMA", 0),
                (0xA5, "SETGAMMA", DRM_MASTER), (0xA6, "GETENCODER", 0),
                (0xA7, "GETCONNECTOR", 0), (0xA8, "ATTACHMODE", DRM_MASTER),
                (0xA9, "DETACHMODE", DRM_MASTER), (0xAA, "GETPROPERTY", 0),
                (0xAB, "SETPROPERTY", DRM_MASTER), (0xAC, "GETPROPBLOB", 0), (0xAD, "GETFB", 0),
                (0xAE, "ADDFB", 0), (0xAF, "RMFB", 0), (0xB0, "PAGE_FLIP", DRM_MASTER),
                (0xB1, "DIRTYFB", DRM_MASTER), (0xB2, "CREATE_DUMB", 0),
                # mainline: no flags (a RENDER_ALLOW variant exists only as a patch)
                (0xB3, "MAP_DUMB", 0), (0xB4, "DESTROY_DUMB", 0),
                (0xB5, "GETPLANERESOURCES", 0), (0xB6, "GETPLANE", 0),
                (0xB7, "SETPLANE", DRM_MASTER), (0xB8, "ADDFB2", 0),
                (0xB9, "OBJ_GETPROPERTIES", 0), (0xBA, "OBJ_SETPROPERTY", DRM_MASTER),
                (0xBB, "CURSOR2", DRM_MASTER), (0xBC, "ATOMIC", DRM_MASTER),
                (0xBD, "CREATEPROPBLOB", 0), (0xBE, "DESTROYPROPBLOB", 0),
                (0xC6, "CREATE_LEASE", DRM_MASTER), (0xC7, "LIST_LESSEES", DRM_MASTER),
                (0xC8, "GET_LEASE", DRM_MASTER), (0xC9, "REVOKE_LEASE", DRM_MASTER),
                (0xCE, "GETFB2", 0), (0xD0, "CLOSEFB", 0),
            ]
        ),
        # Syncobjs (drm_syncobj.c): the per-file ones are emulated; sharing them through
        # fds (HANDLE_TO_FD, FD_TO_HANDLE, EVENTFD) and TRANSFER are not.
        *(
            _core(nr, f"SYNCOBJ_{name}", _RW, size, DRM_RENDER_ALLOW, emulated)
            for nr, name, size, emulated in [
                (0xBF, "CREATE", st.SYNCOBJ_CREATE.size, True),
                (0xC0, "DESTROY", st.SYNCOBJ_DESTROY.size, True),
                (0xC1, "HANDLE_TO_FD", 16, False), (0xC2, "FD_TO_HANDLE", 16, False),
                (0xC3, "WAIT", st.SYNCOBJ_WAIT.size, True),
                (0xC4, "RESET", st.SYNCOBJ_ARRAY.size, True),
                (0xC5, "SIGNAL", st.SYNCOBJ_ARRAY.size, True),
                (0xCA, "TIMELINE_WAIT", st.SYNCOBJ_TIMELINE_WAIT.size, True),
                (0xCB, "QUERY", st.SYNCOBJ_TIMELINE_ARRAY.size, True),
                (0xCC, "TRANSFER", 32, False),
                (0xCD, "TIMELINE_SIGNAL", st.SYNCOBJ_TIMELINE_ARRAY.size, True),
                (0xCF, "EVENTFD", 24, False),
            ]
        ),
        _core(0xD1, "SET_CLIENT_NAME", _RW, 16, DRM_RENDER_ALLOW),
    ]
}
CORE_IOCTL_COUNT = max(CORE_IOCTLS) + 1


def _drv(index: int, name: str, direction: int, size: int, emulated: bool = False):
    nr = DRM_COMMAND_BASE + index
    return IoctlSpec(
        nr, f"AMDGPU_{name}", ioc(direction, ord("d"), nr, size), DRM_AUTH | DRM_RENDER_ALLOW,
        emulated,
    )


# amdgpu's driver table (amdgpu_drv.c + the UALink entry at index 0x1B, spec §1.1). Indices
# 0x0A–0x0F are empty slots (EINVAL); the table ends at 0x1B, so nr ≥ 0x5C is EINVAL.
AMDGPU_IOCTLS: dict[int, IoctlSpec] = {
    s.nr: s
    for s in [
        _drv(0x00, "GEM_CREATE", _RW, st.GEM_CREATE_SIZE, True),
        _drv(0x01, "GEM_MMAP", _RW, st.GEM_MMAP_SIZE, True),
        _drv(0x02, "CTX", _RW, 16),
        _drv(0x03, "BO_LIST", _RW, 24),
        _drv(0x04, "CS", _RW, 24),
        _drv(0x05, "INFO", IOC_WRITE, 32),
        _drv(0x06, "GEM_METADATA", _RW, st.GEM_METADATA_SIZE, True),
        _drv(0x07, "GEM_WAIT_IDLE", _RW, 16),
        _drv(0x08, "GEM_VA", IOC_WRITE, st.GEM_VA.size, True),
        _drv(0x09, "WAIT_CS", _RW, 32),
        _drv(0x10, "GEM_OP", _RW, st.GEM_OP.size, True),
        _drv(0x11, "GEM_USERPTR", _RW, st.GEM_USERPTR.size, True),
        _drv(0x12, "WAIT_FENCES", _RW, 24),
        _drv(0x13, "VM", _RW, 8),
        _drv(0x14, "FENCE_TO_HANDLE", _RW, 32),
        _drv(0x15, "SCHED", IOC_WRITE, 16),
        _drv(0x16, "USERQ", _RW, 64),
        _drv(0x17, "USERQ_SIGNAL", _RW, 48),
        _drv(0x18, "USERQ_WAIT", _RW, 56),
        _drv(0x19, "GEM_LIST_HANDLES", _RW, 16),
        _drv(0x1A, "PROC_OPTIONS", _RW, 8),
        _drv(0x1B, "UALINK_HANDLE", _RW, st.UALINK_HANDLE_SIZE, True),
    ]
}
AMDGPU_NUM_IOCTLS = 0x1C


def lookup(nr: int) -> IoctlSpec | None:
    """The table entry the kernel would pick for `nr` (None: no entry, EINVAL)."""
    if DRM_COMMAND_BASE <= nr < 0xA0:
        return AMDGPU_IOCTLS.get(nr)
    return CORE_IOCTLS.get(nr)
