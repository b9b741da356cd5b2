"""The KFD layouts and numbers of ualinkd/abi (structs.py's kfd_* Layouts, ioctls.py's
KFD_IOCTLS) agree with include/ualink/ualink_kfd.h and with the system's
<linux/kfd_ioctl.h> (Debian's linux-libc-dev), as the C compiler sees them: sizeof, every
offset, and each AMDKFD_IOC_* number (the kernel's kfd_ioctl.h, issue 14)."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest
from cffi_compiled import compiled

from ualinkd.abi import ioctls as tbl
from ualinkd.abi import structs as st

INCLUDE = Path(__file__).resolve().parents[2] / "include"
SYSTEM_HEADER = Path("/usr/include/linux/kfd_ioctl.h")
LAYOUTS = [v for v in vars(st).values() if isinstance(v, st.Layout) and v.name.startswith("kfd")]
IOCTLS = {  # macro -> table entry
    "AMDKFD_IOC_GET_VERSION": tbl.KFD_GET_VERSION,
    "AMDKFD_IOC_SET_MEMORY_POLICY": tbl.KFD_SET_MEMORY_POLICY,
    "AMDKFD_IOC_GET_CLOCK_COUNTERS": tbl.KFD_GET_CLOCK_COUNTERS,
    "AMDKFD_IOC_GET_PROCESS_APERTURES_NEW": tbl.KFD_GET_PROCESS_APERTURES_NEW,
    "AMDKFD_IOC_ACQUIRE_VM": tbl.KFD_ACQUIRE_VM,
    "AMDKFD_IOC_ALLOC_MEMORY_OF_GPU": tbl.KFD_ALLOC_MEMORY_OF_GPU,
    "AMDKFD_IOC_FREE_MEMORY_OF_GPU": tbl.KFD_FREE_MEMORY_OF_GPU,
    "AMDKFD_IOC_MAP_MEMORY_TO_GPU": tbl.KFD_MAP_MEMORY_TO_GPU,
    "AMDKFD_IOC_UNMAP_MEMORY_FROM_GPU": tbl.KFD_UNMAP_MEMORY_FROM_GPU,
    "AMDKFD_IOC_AVAILABLE_MEMORY": tbl.KFD_AVAILABLE_MEMORY,
    "AMDKFD_IOC_EXPORT_DMABUF": tbl.KFD_EXPORT_DMABUF,
    "AMDKFD_IOC_CREATE_EVENT": tbl.KFD_CREATE_EVENT,
    "AMDKFD_IOC_DESTROY_EVENT": tbl.KFD_DESTROY_EVENT,
    "AMDKFD_IOC_SET_EVENT": tbl.KFD_SET_EVENT,
    "AMDKFD_IOC_RESET_EVENT": tbl.KFD_RESET_EVENT,
    "AMDKFD_IOC_WAIT_EVENTS": tbl.KFD_WAIT_EVENTS,
    "AMDKFD_IOC_SET_SCRATCH_BACKING_VA": tbl.KFD_SET_SCRATCH_BACKING_VA,
    "AMDKFD_IOC_SET_TRAP_HANDLER": tbl.KFD_SET_TRAP_HANDLER,
    "AMDKFD_IOC_SET_XNACK_MODE": tbl.KFD_SET_XNACK_MODE,
    "AMDKFD_IOC_GET_DMABUF_INFO": tbl.KFD_GET_DMABUF_INFO,
    "AMDKFD_IOC_IMPORT_DMABUF": tbl.KFD_IMPORT_DMABUF,
    "AMDKFD_IOC_CREATE_QUEUE": tbl.KFD_CREATE_QUEUE,
    "AMDKFD_IOC_DESTROY_QUEUE": tbl.KFD_DESTROY_QUEUE,
    "AMDKFD_IOC_UPDATE_QUEUE": tbl.KFD_UPDATE_QUEUE,
    "AMDKFD_IOC_GET_TILE_CONFIG": tbl.KFD_GET_TILE_CONFIG,
    "AMDKFD_IOC_SET_CU_MASK": tbl.KFD_SET_CU_MASK,
    "AMDKFD_IOC_GET_QUEUE_WAVE_STATE": tbl.KFD_GET_QUEUE_WAVE_STATE,
    "AMDKFD_IOC_ALLOC_QUEUE_GWS": tbl.KFD_ALLOC_QUEUE_GWS,
    "AMDKFD_IOC_RUNTIME_ENABLE": tbl.KFD_RUNTIME_ENABLE,
}
# Layouts that grew after Debian 12's header (KFD 1.11): its struct is this many bytes, the
# fields it has at the same offsets, and its ioctl number that size.
GREW_SINCE_SYSTEM_HEADER = {"kfd_ioctl_create_queue_args": 88}
# What came after KFD 1.11, with the KFD minor version that added it (the kernel's
# include/uapi/linux/kfd_ioctl.h version list: 1.12 "DMA buf export ioctl", 1.13 "debugger
# API"): a system header older than that lacks it, the one reason a test here skips.
# test_structs_newer_than_the_system_header_are_the_kernel_uapi_s checks them instead.
ADDED_IN_MINOR = {
    "kfd_ioctl_export_dmabuf_args": 12, "AMDKFD_IOC_EXPORT_DMABUF": 12,
    "kfd_ioctl_runtime_enable_args": 13, "AMDKFD_IOC_RUNTIME_ENABLE": 13,
}


def _compile(tmp: Path, name: str, include: str, dirs: list[str],
             known: str | None = None) -> object:
    """The header through cffi; `known`: a header's text, to leave out what it predates."""
    cdef = "typedef unsigned int __u32; typedef int __s32; typedef unsigned long long __u64;\n"
    for lay in LAYOUTS:
        if known is not None and f"struct {lay.name} {{" not in known:
            continue
        ctypes_ = {"Q": "__u64", "I": "__u32", "i": "__s32"}
        pairs = list(zip(lay.fast.format[1:], lay.schema.subcons, strict=True))
        if known is not None and lay.name in GREW_SINCE_SYSTEM_HEADER:
            old = GREW_SINCE_SYSTEM_HEADER[lay.name]
            pairs = [(c, sub) for i, (c, sub) in enumerate(pairs)
                     if struct.calcsize("<" + lay.fast.format[1:2 + i]) <= old]
        fields = " ".join(f"{ctypes_[c]} {sub.name};" for c, sub in pairs)
        cdef += f"struct {lay.name} {{ {fields} ...; }};\n"
    cdef += "struct kfd_event_data { __u64 kfd_event_data_ext; __u32 event_id; ...; };\n"
    cdef += "".join(f"#define {m} ...\n" for m in IOCTLS
                    if known is None or f"#define {m}" in known)
    return compiled(tmp, name, cdef, include, [str(INCLUDE), *dirs])


@pytest.fixture(scope="module", params=["ours", "system"])
def c_kfd(request, tmp_path_factory):
    if request.param == "system" and not SYSTEM_HEADER.exists():
        pytest.skip("no <linux/kfd_ioctl.h> (linux-libc-dev)")
    tmp = tmp_path_factory.mktemp(f"kfd_{request.param}")
    dirs: list[str] = []
    if request.param == "ours":
        include = '#include "ualink/ualink_kfd.h"'
    else:
        # kfd_ioctl.h includes <drm/drm.h>; libdrm-dev has it as libdrm/drm.h
        (tmp / "inc").mkdir()
        (tmp / "inc" / "drm").symlink_to("/usr/include/libdrm")
        include, dirs = "#include <linux/kfd_ioctl.h>", [str(tmp / "inc")]
        # Debian 12's header is KFD 1.11 (Linux 6.1): EXPORT_DMABUF came later
        return _compile(tmp, f"_ualink_kfd_{request.param}", include, dirs,
                        SYSTEM_HEADER.read_text())
    return _compile(tmp, f"_ualink_kfd_{request.param}", include, dirs)


def _newer_than_the_system_header(c_kfd, name: str) -> str:
    """The skip reason for `name` (a struct or an ioctl macro) missing from the compiled
    header: only the system header may lack something, only what came after its KFD
    version, and then it must not name it at all (a struct it has but we failed to see is a
    failure, not a skip)."""
    assert c_kfd.__name__.endswith("_system"), f"{name} is missing from ualink_kfd.h"
    text = SYSTEM_HEADER.read_text()
    m = re.search(r"#define\s+KFD_IOCTL_MINOR_VERSION\s+(\d+)", text)
    assert m, "the system header has no KFD_IOCTL_MINOR_VERSION"
    minor = int(m.group(1))
    assert name in ADDED_IN_MINOR and minor < ADDED_IN_MINOR[name], (
        f"{name} is missing from the system header of KFD 1.{minor}, which should have it")
    assert not re.search(rf"\b{name}\b", text), f"the system header has {name}: not seen"
    return f"{name} is newer than this header (KFD 1.{minor} < 1.{ADDED_IN_MINOR[name]})"


def test_every_kfd_layout_is_here():
    assert len(LAYOUTS) == 27


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda lay: lay.name)
def test_kfd_layouts_match_c(c_kfd, layout):
    ffi = c_kfd.ffi
    ctype = f"struct {layout.name}"
    try:
        ffi.sizeof(ctype)
    except ffi.error:
        pytest.skip(_newer_than_the_system_header(c_kfd, layout.name))
    size = layout.size
    if c_kfd.__name__.endswith("_system"):
        size = GREW_SINCE_SYSTEM_HEADER.get(layout.name, size)
    assert ffi.sizeof(ctype) == size
    fmt = layout.fast.format
    for i, sub in enumerate(layout.schema.subcons):
        if struct.calcsize("<" + fmt[1 : 2 + i]) > size:
            break
        assert ffi.offsetof(ctype, sub.name) == struct.calcsize("<" + fmt[1 : 1 + i]), sub.name


@pytest.mark.parametrize("macro", sorted(IOCTLS))
def test_kfd_ioctl_numbers_match_c(c_kfd, macro):
    if not hasattr(c_kfd.lib, macro):
        pytest.skip(_newer_than_the_system_header(c_kfd, macro))
    cmd = IOCTLS[macro].cmd
    grown = {"AMDKFD_IOC_CREATE_QUEUE": "kfd_ioctl_create_queue_args"}
    if c_kfd.__name__.endswith("_system") and macro in grown:
        cmd = (cmd & ~(0x3FFF << 16)) | GREW_SINCE_SYSTEM_HEADER[grown[macro]] << 16
    assert getattr(c_kfd.lib, macro) & 0xFFFFFFFF == cmd


def test_event_data_entries_match_c(c_kfd):
    """WAIT_EVENTS reads struct kfd_event_data[num_events]: its size and event_id offset."""
    ffi = c_kfd.ffi
    assert ffi.sizeof("struct kfd_event_data") == st.KFD_EVENT_DATA_SIZE
    assert ffi.offsetof("struct kfd_event_data", "event_id") == st.KFD_EVENT_DATA_EVENT_ID



# The kernel's include/uapi/linux/kfd_ioctl.h, as offset: field, each struct's size, and
# its number (all AMDKFD_IOWR: _IOWR('K', nr, size)): what the system header's checks above
# cannot say of what came after Debian 12's KFD 1.11. EXPORT_DMABUF came in 1.12,
# RUNTIME_ENABLE in 1.13, CREATE_QUEUE's sdma_engine_id and pad (88 -> 96 bytes) in 1.17.
KERNEL_UAPI = {
    "kfd_ioctl_export_dmabuf_args": (
        16, {0: "handle", 8: "flags", 12: "dmabuf_fd"}, tbl.KFD_EXPORT_DMABUF, 0xC0104B24),
    "kfd_ioctl_runtime_enable_args": (
        16, {0: "r_debug", 8: "mode_mask", 12: "capabilities_mask"}, tbl.KFD_RUNTIME_ENABLE,
        0xC0104B25),
    "kfd_ioctl_create_queue_args": (
        96, {0: "ring_base_address", 8: "write_pointer_address", 16: "read_pointer_address",
             24: "doorbell_offset", 32: "ring_size", 36: "gpu_id", 40: "queue_type",
             44: "queue_percentage", 48: "queue_priority", 52: "queue_id",
             56: "eop_buffer_address", 64: "eop_buffer_size", 72: "ctx_save_restore_address",
             80: "ctx_save_restore_size", 84: "ctl_stack_size", 88: "sdma_engine_id",
             92: "pad"}, tbl.KFD_CREATE_QUEUE, 0xC0604B02),
}


@pytest.mark.parametrize("name", sorted(KERNEL_UAPI))
def test_structs_newer_than_the_system_header_are_the_kernel_uapi_s(name):
    """EXPORT_DMABUF (0x24: `hsaKmtExportDMABufHandle`, userspace-surface.md §7 item 5: 16
    bytes), RUNTIME_ENABLE (0x25) and CREATE_QUEUE's 1.17 layout against the kernel's uapi:
    size, each field's offset and width, in both codecs (the fast struct and the construct
    schema, built and parsed), and the ioctl number. Debian 12's <linux/kfd_ioctl.h> is
    KFD 1.11: test_kfd_layouts_match_c and test_kfd_ioctl_numbers_match_c check the first
    two, and CREATE_QUEUE's last 8 bytes, only against ualink_kfd.h, our own header."""
    size, fields, spec, cmd = KERNEL_UAPI[name]
    layout = next(lay for lay in LAYOUTS if lay.name == name)
    assert layout.size == size
    assert [sub.name for sub in layout.schema.subcons] == list(fields.values())
    ends = [*list(fields)[1:], size]
    widths = {o: end - o for o, end in zip(fields, ends, strict=True)}  # (no padding in them)
    for offset, field in fields.items():
        at = layout.field(field)
        assert (at.offset, at.size) == (offset, widths[offset]), field
    # Distinct bytes in every field: a field read at another offset or width shows.
    wire = bytes(range(0x11, 0x11 + size))
    want = {f: int.from_bytes(wire[o:o + widths[o]], "little") for o, f in fields.items()}
    value = layout.record(**want)
    assert layout.decode_construct(wire) == value == layout.decode(wire)
    assert layout.encode_construct(value) == wire == layout.encode(value)
    assert spec.cmd == cmd  # (its size field, bits 16-29, is the struct's size)
