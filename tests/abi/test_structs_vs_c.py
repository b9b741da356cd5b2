"""The Python struct layouts agree with include/ualink/ualink_drm.h as a C compiler sees it.

Sizes and offsets come from `ualinkd/abi_check.py`'s probe (the one `ualinkd abi-check`
runs: a generated C file's sizeof/offsetof, compiled and read from the object file) and
are checked against the offsets derived from the `struct.Struct` codecs in
`ualinkd/abi/structs.py` (spec §1.3, §2.3–§2.8). Bytes written through the C struct (cffi in
API mode, partial structs) must also decode to the same values in Python.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from cffi_compiled import compiled
from hypothesis import given, settings
from hypothesis import strategies as hs

from ualinkd import abi_check
from ualinkd.abi import structs as st

ROOT = Path(__file__).resolve().parents[2]
INCLUDE = ROOT / "include"

CDEF = """
typedef unsigned int __u32;
typedef int __s32;
typedef unsigned long long __u64;

struct drm_gem_close { __u32 handle; __u32 pad; ...; };
struct drm_prime_handle { __u32 handle; __u32 flags; __s32 fd; ...; };
struct drm_get_cap { __u64 capability; __u64 value; ...; };

typedef long long __s64;
struct drm_syncobj_create { __u32 handle; __u32 flags; ...; };
struct drm_syncobj_destroy { __u32 handle; __u32 pad; ...; };
struct drm_syncobj_wait {
    __u64 handles; __s64 timeout_nsec; __u32 count_handles; __u32 flags;
    __u32 first_signaled; __u32 pad; __u64 deadline_nsec; ...;
};
struct drm_syncobj_timeline_wait {
    __u64 handles; __u64 points; __s64 timeout_nsec; __u32 count_handles; __u32 flags;
    __u32 first_signaled; __u32 pad; __u64 deadline_nsec; ...;
};
struct drm_syncobj_array { __u64 handles; __u32 count_handles; __u32 pad; ...; };
struct drm_syncobj_timeline_array {
    __u64 handles; __u64 points; __u32 count_handles; __u32 flags; ...;
};

struct drm_amdgpu_gem_create_in {
    __u64 bo_size; __u64 alignment; __u64 domains; __u64 domain_flags; ...;
};
struct drm_amdgpu_gem_create_out { __u32 handle; __u32 _pad; ...; };
union drm_amdgpu_gem_create {
    struct drm_amdgpu_gem_create_in in; struct drm_amdgpu_gem_create_out out; ...;
};

struct drm_amdgpu_gem_mmap_in { __u32 handle; __u32 _pad; ...; };
struct drm_amdgpu_gem_mmap_out { __u64 addr_ptr; ...; };
union drm_amdgpu_gem_mmap {
    struct drm_amdgpu_gem_mmap_in in; struct drm_amdgpu_gem_mmap_out out; ...;
};
struct drm_amdgpu_gem_wait_idle_in { __u32 handle; __u32 flags; __u64 timeout; ...; };
struct drm_amdgpu_gem_wait_idle_out { __u32 status; __u32 domain; ...; };
union drm_amdgpu_gem_wait_idle {
    struct drm_amdgpu_gem_wait_idle_in in; struct drm_amdgpu_gem_wait_idle_out out; ...;
};

struct drm_amdgpu_gem_va {
    __u32 handle; __u32 _pad; __u32 operation; __u32 flags;
    __u64 va_address; __u64 offset_in_bo; __u64 map_size; __u64 vm_timeline_point;
    __u32 vm_timeline_syncobj_out; __u32 num_syncobj_handles;
    __u64 input_fence_syncobj_handles;
    ...;
};

struct drm_amdgpu_gem_metadata {
    __u32 handle; __u32 op;
    struct { __u64 flags; __u64 tiling_info; __u32 data_size_bytes; __u32 data[64]; } data;
    ...;
};

struct drm_amdgpu_gem_op {
    __u32 handle; __u32 op; __u64 value; __u32 num_entries; __u32 padding; ...;
};

struct drm_amdgpu_gem_userptr {
    __u64 addr; __u64 size; __u32 flags; __u32 handle; ...;
};

struct drm_amdgpu_ualink_handle_in {
    __u32 op;
    __u32 flags;
    union {
        __u32 gem_handle;
        __u64 import_ualink_handle[2];
    };
    ...;
};
union drm_amdgpu_ualink_handle_out {
    __u64 export_ualink_handle[2];
    __u32 import_dmabuf_handle;
    ...;
};
union drm_amdgpu_ualink_handle {
    struct drm_amdgpu_ualink_handle_in in;
    union drm_amdgpu_ualink_handle_out out;
    ...;
};

struct drm_syncobj_handle { __u32 handle; __u32 flags; __s32 fd; __u32 pad; ...; };
struct drm_syncobj_transfer {
    __u32 src_handle; __u32 dst_handle; __u64 src_point; __u64 dst_point; __u32 flags;
    __u32 pad; ...;
};
struct drm_syncobj_eventfd { __u32 handle; __u32 flags; __u64 point; __s32 fd; __u32 pad; ...; };
struct drm_amdgpu_ctx_in { __u32 op; __u32 flags; __u32 ctx_id; __s32 priority; ...; };
union drm_amdgpu_ctx { struct drm_amdgpu_ctx_in in; ...; };
struct drm_amdgpu_vm_in { __u32 op; __u32 flags; ...; };
union drm_amdgpu_vm { struct drm_amdgpu_vm_in in; ...; };
struct drm_amdgpu_bo_list_in {
    __u32 operation; __u32 list_handle; __u32 bo_number; __u32 bo_info_size;
    __u64 bo_info_ptr; ...;
};
struct drm_amdgpu_bo_list_entry { __u32 bo_handle; __u32 bo_priority; ...; };
union drm_amdgpu_bo_list { struct drm_amdgpu_bo_list_in in; ...; };
struct drm_amdgpu_cs_in {
    __u32 ctx_id; __u32 bo_list_handle; __u32 num_chunks; __u32 flags; __u64 chunks; ...;
};
struct drm_amdgpu_cs_chunk { __u32 chunk_id; __u32 length_dw; __u64 chunk_data; ...; };
struct drm_amdgpu_cs_chunk_ib {
    __u32 _pad; __u32 flags; __u64 va_start; __u32 ib_bytes; __u32 ip_type;
    __u32 ip_instance; __u32 ring; ...;
};
struct drm_amdgpu_cs_chunk_dep {
    __u32 ip_type; __u32 ip_instance; __u32 ring; __u32 ctx_id; __u64 handle; ...;
};
struct drm_amdgpu_cs_chunk_fence { __u32 handle; __u32 offset; ...; };
struct drm_amdgpu_cs_chunk_sem { __u32 handle; ...; };
struct drm_amdgpu_cs_chunk_syncobj { __u32 handle; __u32 flags; __u64 point; ...; };
struct drm_amdgpu_wait_cs_in {
    __u64 handle; __u64 timeout; __u32 ip_type; __u32 ip_instance; __u32 ring;
    __u32 ctx_id; ...;
};
struct drm_amdgpu_fence {
    __u32 ctx_id; __u32 ip_type; __u32 ip_instance; __u32 ring; __u64 seq_no; ...;
};
struct drm_amdgpu_wait_fences_in {
    __u64 fences; __u32 fence_count; __u32 wait_all; __u64 timeout_ns; ...;
};
struct drm_amdgpu_info_gds {
    __u32 gds_gfx_partition_size; __u32 compute_partition_size; __u32 gds_total_size;
    __u32 gws_per_gfx_partition; __u32 gws_per_compute_partition; __u32 oa_per_gfx_partition;
    __u32 oa_per_compute_partition; __u32 _pad; ...;
};
struct drm_amdgpu_info_vram_gtt {
    __u64 vram_size; __u64 vram_cpu_accessible_size; __u64 gtt_size; ...;
};
struct drm_amdgpu_heap_info {
    __u64 total_heap_size; __u64 usable_heap_size; __u64 heap_usage; __u64 max_allocation; ...;
};
struct drm_amdgpu_memory_info {
    struct drm_amdgpu_heap_info vram; struct drm_amdgpu_heap_info cpu_accessible_vram;
    struct drm_amdgpu_heap_info gtt; ...;
};
struct drm_amdgpu_info_firmware { __u32 ver; __u32 feature; ...; };
struct drm_version { int version_major; int version_minor; int version_patchlevel; ...; };
struct drm_amdgpu_info { __u64 return_pointer; __u32 return_size; __u32 query; ...; };
struct drm_amdgpu_info_hw_ip { __u32 hw_ip_version_major; ...; };
struct drm_amdgpu_info_device { __u32 device_id; ...; };
"""

# Python field name -> C field name where the uAPI spells it differently.
C_NAMES = {
    "drm_amdgpu_gem_create_out": {"pad": "_pad"},
    "drm_amdgpu_gem_mmap_in": {"pad": "_pad"},
    "drm_amdgpu_gem_va": {"pad": "_pad"},
    "drm_amdgpu_info_gds": {"pad": "_pad"},
    "drm_amdgpu_cs_chunk_ib": {"pad": "_pad"},
}

# The KFD's layouts are checked against ualink_kfd.h in test_kfd_abi.py.
LAYOUTS = [v for v in vars(st).values()
           if isinstance(v, st.Layout) and not v.name.startswith("kfd")]


@pytest.fixture(scope="session")
def c_abi(tmp_path_factory):
    """(ffi, lib) of the header compiled by the C compiler (cffi API mode)."""
    tmp = tmp_path_factory.mktemp("cffi_structs")
    mod = compiled(tmp, "_ualink_drm_structs", CDEF, '#include "ualink/ualink_drm.h"',
                   [str(INCLUDE)])
    return mod.ffi, mod.lib


def _py_offsets(layout: st.Layout) -> dict[str, int]:
    fmt = layout.fast.format
    assert fmt[0] == "<"
    names = [sub.name for sub in layout.schema.subcons]
    return {n: struct.calcsize("<" + fmt[1 : 1 + i]) for i, n in enumerate(names)}


def test_every_layout_is_checked():
    """§1.3/§2.x: the layouts compared below are all the Layouts structs.py defines."""
    assert {lay.name for lay in LAYOUTS} == {
        "drm_gem_close", "drm_prime_handle", "drm_get_cap",
        "drm_amdgpu_gem_create_in", "drm_amdgpu_gem_create_out",
        "drm_amdgpu_gem_mmap_in", "drm_amdgpu_gem_mmap_out", "drm_amdgpu_gem_wait_idle_in",
        "drm_amdgpu_gem_va", "drm_amdgpu_gem_op", "drm_amdgpu_gem_userptr",
        "drm_syncobj_create", "drm_syncobj_destroy", "drm_syncobj_wait",
        "drm_syncobj_timeline_wait", "drm_syncobj_array", "drm_syncobj_timeline_array",
        "drm_syncobj_handle", "drm_syncobj_transfer", "drm_syncobj_eventfd",
        "drm_amdgpu_ctx_in", "drm_amdgpu_vm_in", "drm_amdgpu_info_gds",
        "drm_amdgpu_bo_list_in", "drm_amdgpu_bo_list_entry", "drm_amdgpu_cs_in",
        "drm_amdgpu_cs_chunk", "drm_amdgpu_cs_chunk_ib", "drm_amdgpu_cs_chunk_dep",
        "drm_amdgpu_cs_chunk_fence", "drm_amdgpu_cs_chunk_sem", "drm_amdgpu_cs_chunk_syncobj",
        "drm_amdgpu_wait_cs_in", "drm_amdgpu_fence", "drm_amdgpu_wait_fences_in",
        "drm_amdgpu_info_vram_gtt", "drm_amdgpu_heap_info", "drm_amdgpu_info_firmware",
    }


@pytest.fixture(scope="session")
def probed():
    """The header as `ualinkd abi-check` sees it (a generated C file's sizeof/offsetof)."""
    return abi_check.probe([str(INCLUDE / "ualink" / "ualink_drm.h")])


@pytest.mark.parametrize("layout", [*LAYOUTS, *[v for v in vars(st).values()
                                                 if isinstance(v, st.ArrayLayout)]],
                         ids=lambda lay: lay.name)
def test_layout_size_and_offsets_match_c(probed, layout):
    """§2.2–§2.8, §5: sizeof and every field offset equal the codec's, as the C compiler has
    them (drm_amdgpu_info_device 448 bytes with tcc_disabled_mask at 360, hw_ip 40, info 32,
    drm_version 64). abi_check.py's probe is the one comparison; this pins it per layout."""
    agg = next(a for a in abi_check.emulator_aggregates() if a.name == layout.name)
    assert probed.sizes[agg.ctype] == layout.size
    for f in agg.fields:
        assert probed.fields[(agg.ctype, f.path)] == (f.offset, f.size), f.path


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda lay: lay.name)
@settings(max_examples=25, deadline=None)
@given(data=hs.data())
def test_bytes_written_in_c_decode_in_python(c_abi, layout, data):
    """§0.2: values stored through the C struct read back identically in Python."""
    ffi, _ = c_abi
    p = ffi.new(f"struct {layout.name} *")
    renames = C_NAMES.get(layout.name, {})
    values = {}
    for name, ch in zip(
        [s.name for s in layout.schema.subcons], layout.fast.format[1:], strict=True
    ):
        bits = struct.calcsize(ch) * 8
        signed = ch.islower()
        lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
        values[name] = data.draw(hs.integers(lo, hi), label=name)
        setattr(p, renames.get(name, name), values[name])
    raw = bytes(ffi.buffer(p))
    assert layout.decode(raw) == layout.record(**values)
    assert layout.encode(layout.record(**values)) == raw


def test_union_sizes_match_c(c_abi):
    """§2.3, §2.7, §1.3: the union sizes the dispatcher and handlers use."""
    ffi, _ = c_abi
    assert ffi.sizeof("union drm_amdgpu_gem_create") == st.GEM_CREATE_SIZE == 32
    assert ffi.sizeof("union drm_amdgpu_gem_mmap") == st.GEM_MMAP_SIZE == 8
    assert ffi.sizeof("union drm_amdgpu_gem_wait_idle") == st.GEM_WAIT_IDLE_SIZE == 16
    assert ffi.offsetof("union drm_amdgpu_gem_create", "out") == 0
    assert ffi.offsetof("union drm_amdgpu_gem_mmap", "out") == 0
    assert ffi.offsetof("struct drm_amdgpu_gem_va", "vm_timeline_point") == (
        st.GEM_VA_LEGACY_SIZE
    )


def test_ualink_union_layout(c_abi):
    """§1.3: in @0 size 24, gem_handle @8, import_ualink_handle @8/@16; out: export
    handle @0/@8, import_dmabuf_handle @0, out size 16; union size 24, alignment 8."""
    ffi, _ = c_abi
    u, i, o = (
        "union drm_amdgpu_ualink_handle",
        "struct drm_amdgpu_ualink_handle_in",
        "union drm_amdgpu_ualink_handle_out",
    )
    assert ffi.sizeof(u) == st.UALINK_HANDLE_SIZE == 24
    assert ffi.alignof(u) == 8
    assert ffi.offsetof(u, "in") == 0
    assert ffi.offsetof(u, "out") == 0
    assert ffi.sizeof(i) == 24
    assert ffi.sizeof(o) == 16
    assert ffi.offsetof(i, "op") == 0
    assert ffi.offsetof(i, "flags") == 4
    assert ffi.offsetof(i, "gem_handle") == 8
    assert ffi.offsetof(i, "import_ualink_handle", 0) == 8
    assert ffi.offsetof(i, "import_ualink_handle", 1) == 16
    assert ffi.offsetof(o, "export_ualink_handle", 0) == 0
    assert ffi.offsetof(o, "export_ualink_handle", 1) == 8
    assert ffi.offsetof(o, "import_dmabuf_handle") == 0
    # The Python codecs use the same offsets.
    assert st.UALINK_HANDLE_OUT_EXPORT.size == 16
    assert st.UALINK_HANDLE_OUT_IMPORT.size == 4


def test_ualink_union_bytes_round_trip_through_c(c_abi):
    """§1.3/§1.4: bytes built by C for each view decode to the right fields in Python,
    and the Python out-codecs produce what C reads."""
    ffi, _ = c_abi
    p = ffi.new("union drm_amdgpu_ualink_handle *")
    cin = getattr(p, "in")  # `in` is a Python keyword
    cin.op = 1
    cin.flags = 0xDEADBEEF
    cin.import_ualink_handle[0] = 0x1122334455667788
    cin.import_ualink_handle[1] = 0x99AABBCCDDEEFF00
    args = st.decode_ualink_handle_in(bytes(ffi.buffer(p)))
    assert args == st.UalinkHandleIn(
        1, 0xDEADBEEF, 0x55667788, 0x1122334455667788, 0x99AABBCCDDEEFF00
    )

    p = ffi.new("union drm_amdgpu_ualink_handle *")
    cin = getattr(p, "in")
    cin.op = 0
    cin.gem_handle = 7
    args = st.decode_ualink_handle_in(bytes(ffi.buffer(p)))
    assert (args.op, args.gem_handle, args.handle_lo, args.handle_hi) == (0, 7, 7, 0)

    raw = st.UALINK_HANDLE_OUT_EXPORT.pack(0xAAAA000000000005, 0x0123456789ABCDEF) + bytes(8)
    p = ffi.new("union drm_amdgpu_ualink_handle *")
    ffi.memmove(p, raw, 24)
    assert p.out.export_ualink_handle[0] == 0xAAAA000000000005
    assert p.out.export_ualink_handle[1] == 0x0123456789ABCDEF
    ffi.memmove(p, st.UALINK_HANDLE_OUT_IMPORT.pack(41), 4)
    assert p.out.import_dmabuf_handle == 41


def test_gem_metadata_layout(c_abi):
    """amdgpu_drm.h: handle @0, op @4, the inner struct @8 (u64 aligned) with flags @8,
    tiling_info @16, data_size_bytes @24, data[64] @28..284, padded to 288 in all."""
    ffi, _ = c_abi
    s = "struct drm_amdgpu_gem_metadata"
    assert ffi.sizeof(s) == st.GEM_METADATA_SIZE == st.GEM_METADATA_FAST.size == 288
    assert ffi.alignof(s) == 8
    p = ffi.new(f"{s} *")
    base = int(ffi.cast("uintptr_t", p))

    def off(cdata) -> int:
        return int(ffi.cast("uintptr_t", ffi.addressof(cdata))) - base

    assert (off(p.data), ffi.sizeof(p.data)) == (8, 280)
    assert off(p.data) + ffi.offsetof(ffi.typeof(p.data), "flags") == 8
    assert off(p.data) + ffi.offsetof(ffi.typeof(p.data), "tiling_info") == 16
    assert off(p.data) + ffi.offsetof(ffi.typeof(p.data), "data_size_bytes") == 24
    assert off(p.data) + ffi.offsetof(ffi.typeof(p.data), "data") == st.GEM_METADATA_DATA_OFFSET
    assert ffi.sizeof(p.data.data) == st.GEM_METADATA_DATA_BYTES


@settings(max_examples=25, deadline=None)
@given(handle=hs.integers(0, 2**32 - 1), op=hs.integers(0, 2**32 - 1),
       flags=hs.integers(0, 2**64 - 1), tiling=hs.integers(0, 2**64 - 1),
       size=hs.integers(0, 2**32 - 1),
       blob=hs.lists(hs.integers(0, 2**32 - 1), min_size=64, max_size=64))
def test_gem_metadata_bytes_round_trip_through_c(c_abi, handle, op, flags, tiling, size, blob):
    """Values stored through the C struct decode identically with both Python codecs,
    and the Python encoding is what C reads (tail padding zero)."""
    ffi, _ = c_abi
    p = ffi.new("struct drm_amdgpu_gem_metadata *")
    p.handle, p.op = handle, op
    p.data.flags, p.data.tiling_info, p.data.data_size_bytes = flags, tiling, size
    for i, v in enumerate(blob):
        p.data.data[i] = v
    raw = bytes(ffi.buffer(p))
    want = st.GemMetadata(handle, op, flags, tiling, size, tuple(blob))
    assert st.decode_gem_metadata(raw) == want == st.decode_gem_metadata_construct(raw)
    assert st.encode_gem_metadata(want) == raw


# ---- the structs with arrays and padding (ArrayLayout): the C compiler decides ------------------

ARRAY_LAYOUTS = [v for v in vars(st).values() if isinstance(v, st.ArrayLayout)]


def test_every_array_layout_is_checked():
    """userspace-surface.md §2.2, §2.5: the ArrayLayouts compared below are all there are."""
    assert {lay.name for lay in ARRAY_LAYOUTS} == {
        "drm_version", "drm_amdgpu_info", "drm_amdgpu_info_hw_ip", "drm_amdgpu_info_device"}


def test_info_structs_against_c(c_abi, probed):
    """§5: the sizes libdrm versions disagree on, and the memory info's three heaps."""
    ffi, _ = c_abi
    assert probed.sizes["struct drm_amdgpu_info_device"] == 448
    assert st.INFO_DEVICE.offsets["tcc_disabled_mask"] + 8 == st.INFO_DEVICE_2_4_114_SIZE
    assert probed.sizes["struct drm_amdgpu_info_hw_ip"] == 40
    assert ffi.sizeof("struct drm_amdgpu_memory_info") == st.MEMORY_INFO_SIZE == 96
    assert ffi.offsetof("struct drm_amdgpu_memory_info", "gtt") == 64
    assert ffi.sizeof("union drm_amdgpu_ctx") == st.CTX_SIZE
    assert ffi.sizeof("union drm_amdgpu_vm") == st.VM_SIZE


@pytest.mark.parametrize("layout", ARRAY_LAYOUTS, ids=lambda lay: lay.name)
@settings(max_examples=30, deadline=None)
@given(data=hs.data())
def test_array_layout_codecs_agree(layout, data):
    """STYLE 4: the generated struct.Struct and the construct schema decode random bytes
    alike (padding ignored), and encode what they decode."""
    raw = data.draw(hs.binary(min_size=layout.size, max_size=layout.size))
    value = layout.decode(raw)
    assert value == layout.decode_construct(raw)
    assert layout.encode(value) == layout.encode_construct(value)
    assert layout.decode(layout.encode(value)) == value


def test_union_members_the_ioctl_table_names_match_c(c_abi):
    """§1.3: the UALink unions' members the ioctl table's handed values name one by one
    (abi/values.py) start where the C compiler puts them, with the header's sizes."""
    ffi, _ = c_abi
    fields = {ctype: dict(ffi.typeof(ctype).fields) for ctype in (
        "struct drm_amdgpu_ualink_handle_in", "union drm_amdgpu_ualink_handle_out")}
    for ctype, name, at in [
            ("struct drm_amdgpu_ualink_handle_in", "op", st.UALINK_IN_OP),
            ("struct drm_amdgpu_ualink_handle_in", "flags", st.UALINK_IN_FLAGS),
            ("struct drm_amdgpu_ualink_handle_in", "gem_handle", st.UALINK_IN_GEM_HANDLE),
            ("union drm_amdgpu_ualink_handle_out", "import_dmabuf_handle",
             st.UALINK_OUT_IMPORT_DMABUF)]:
        member = fields[ctype][name]
        assert (member.offset, ffi.sizeof(member.type)) == (at.offset, at.size), name
    for i, at in enumerate(st.UALINK_IN_IMPORT_HANDLE):
        assert ffi.offsetof("struct drm_amdgpu_ualink_handle_in",
                            "import_ualink_handle") + 8 * i == at.offset and at.size == 8
    for i, at in enumerate(st.UALINK_OUT_EXPORT_HANDLE):
        assert ffi.offsetof("union drm_amdgpu_ualink_handle_out",
                            "export_ualink_handle") + 8 * i == at.offset and at.size == 8
