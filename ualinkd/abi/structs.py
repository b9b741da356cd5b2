"""Byte layouts of every ioctl struct the daemon decodes (x86-64, native little endian).

construct is the source of truth for each layout; every `Layout` also carries a
`struct.Struct` generated from the same schema for the hot path (about 20x faster than
interpreted construct), and tests prove the two decode every input identically.
Decoded values are frozen, slotted dataclasses; construct Containers do not leave here.
"""

from __future__ import annotations

import dataclasses
import struct
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import construct as cs

T = TypeVar("T")

# construct field -> struct format character (native little endian, no implicit padding).
_FORMAT = {
    cs.Int8un: "B",
    cs.Int16un: "H",
    cs.Int32un: "I",
    cs.Int32sn: "i",
    cs.Int64un: "Q",
    cs.Int64sn: "q",
}


def _flat_format(schema: cs.Struct) -> str:
    chars = []
    for sub in schema.subcons:
        inner = sub.subcon if isinstance(sub, cs.Renamed) else sub
        chars.append(_FORMAT[inner])
    return "<" + "".join(chars)


@dataclass(frozen=True, slots=True)
class Layout(Generic[T]):
    """A flat C struct: construct schema, record type, and the generated fast codec."""

    name: str
    schema: cs.Struct
    record: type[T]
    fast: struct.Struct

    @classmethod
    def of(cls, name: str, schema: cs.Struct, record: type[T]) -> Layout[T]:
        fields = [f.name for f in dataclasses.fields(record)]  # type: ignore[arg-type]
        names = [sub.name for sub in schema.subcons]
        if fields != names:
            raise TypeError(f"{name}: record fields {fields} != schema fields {names}")
        return cls(name, schema, record, struct.Struct(_flat_format(schema)))

    @property
    def size(self) -> int:
        return self.fast.size

    def decode(self, data: bytes) -> T:
        """Fast path. `data` must be exactly `size` bytes (the DRM core zero-extends)."""
        return self.record(*self.fast.unpack(data))

    def decode_construct(self, data: bytes) -> T:
        if len(data) != self.size:  # construct ignores trailing bytes; STYLE rule 4 does not
            raise cs.StreamError(f"{self.name}: expected {self.size} bytes, got {len(data)}")
        parsed = self.schema.parse(data)
        return self.record(*(parsed[sub.name] for sub in self.schema.subcons))

    def encode(self, value: T) -> bytes:
        return self.fast.pack(*dataclasses.astuple(value))  # type: ignore[call-overload]

    def encode_construct(self, value: T) -> bytes:
        return self.schema.build(dataclasses.asdict(value))  # type: ignore[call-overload]


# ---- drm.h ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DrmGemClose:
    handle: int
    pad: int


@dataclass(frozen=True, slots=True)
class DrmPrimeHandle:
    handle: int
    flags: int
    fd: int


@dataclass(frozen=True, slots=True)
class DrmGetCap:
    capability: int
    value: int


GEM_CLOSE = Layout.of(
    "drm_gem_close", cs.Struct("handle" / cs.Int32un, "pad" / cs.Int32un), DrmGemClose
)
PRIME_HANDLE = Layout.of(
    "drm_prime_handle",
    cs.Struct("handle" / cs.Int32un, "flags" / cs.Int32un, "fd" / cs.Int32sn),
    DrmPrimeHandle,
)
GET_CAP = Layout.of(
    "drm_get_cap", cs.Struct("capability" / cs.Int64un, "value" / cs.Int64un), DrmGetCap
)

# ---- drm.h: syncobjs (drm_syncobj.c) ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DrmSyncobjCreate:
    handle: int
    flags: int


@dataclass(frozen=True, slots=True)
class DrmSyncobjDestroy:
    handle: int
    pad: int


@dataclass(frozen=True, slots=True)
class DrmSyncobjWait:
    handles: int  # user pointer to count_handles u32
    timeout_nsec: int  # absolute CLOCK_MONOTONIC
    count_handles: int
    flags: int
    first_signaled: int
    pad: int
    deadline_nsec: int


@dataclass(frozen=True, slots=True)
class DrmSyncobjTimelineWait:
    handles: int
    points: int  # user pointer to count_handles u64 (NULL: every point 0)
    timeout_nsec: int
    count_handles: int
    flags: int
    first_signaled: int
    pad: int
    deadline_nsec: int


@dataclass(frozen=True, slots=True)
class DrmSyncobjArray:
    handles: int
    count_handles: int
    pad: int


@dataclass(frozen=True, slots=True)
class DrmSyncobjTimelineArray:
    handles: int
    points: int
    count_handles: int
    flags: int


SYNCOBJ_CREATE = Layout.of(
    "drm_syncobj_create", cs.Struct("handle" / cs.Int32un, "flags" / cs.Int32un),
    DrmSyncobjCreate,
)
SYNCOBJ_DESTROY = Layout.of(
    "drm_syncobj_destroy", cs.Struct("handle" / cs.Int32un, "pad" / cs.Int32un),
    DrmSyncobjDestroy,
)
SYNCOBJ_WAIT = Layout.of(
    "drm_syncobj_wait",
    cs.Struct(
        "handles" / cs.Int64un,
        "timeout_nsec" / cs.Int64sn,
        "count_handles" / cs.Int32un,
        "flags" / cs.Int32un,
        "first_signaled" / cs.Int32un,
        "pad" / cs.Int32un,
        "deadline_nsec" / cs.Int64un,
    ),
    DrmSyncobjWait,
)
SYNCOBJ_TIMELINE_WAIT = Layout.of(
    "drm_syncobj_timeline_wait",
    cs.Struct(
        "handles" / cs.Int64un,
        "points" / cs.Int64un,
        "timeout_nsec" / cs.Int64sn,
        "count_handles" / cs.Int32un,
        "flags" / cs.Int32un,
        "first_signaled" / cs.Int32un,
        "pad" / cs.Int32un,
        "deadline_nsec" / cs.Int64un,
    ),
    DrmSyncobjTimelineWait,
)
SYNCOBJ_ARRAY = Layout.of(
    "drm_syncobj_array",
    cs.Struct("handles" / cs.Int64un, "count_handles" / cs.Int32un, "pad" / cs.Int32un),
    DrmSyncobjArray,
)
SYNCOBJ_TIMELINE_ARRAY = Layout.of(
    "drm_syncobj_timeline_array",
    cs.Struct(
        "handles" / cs.Int64un,
        "points" / cs.Int64un,
        "count_handles" / cs.Int32un,
        "flags" / cs.Int32un,
    ),
    DrmSyncobjTimelineArray,
)

# ---- amdgpu_drm.h -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GemCreateIn:
    bo_size: int
    alignment: int
    domains: int
    domain_flags: int


@dataclass(frozen=True, slots=True)
class GemCreateOut:
    handle: int
    pad: int


@dataclass(frozen=True, slots=True)
class GemMmapIn:
    handle: int
    pad: int


@dataclass(frozen=True, slots=True)
class GemMmapOut:
    addr_ptr: int


@dataclass(frozen=True, slots=True)
class GemVa:
    handle: int
    pad: int
    operation: int
    flags: int
    va_address: int
    offset_in_bo: int
    map_size: int
    vm_timeline_point: int
    vm_timeline_syncobj_out: int
    num_syncobj_handles: int
    input_fence_syncobj_handles: int


@dataclass(frozen=True, slots=True)
class GemOp:
    handle: int
    op: int
    value: int
    num_entries: int
    padding: int


@dataclass(frozen=True, slots=True)
class GemUserptr:
    addr: int
    size: int
    flags: int
    handle: int


GEM_CREATE_IN = Layout.of(
    "drm_amdgpu_gem_create_in",
    cs.Struct(
        "bo_size" / cs.Int64un,
        "alignment" / cs.Int64un,
        "domains" / cs.Int64un,
        "domain_flags" / cs.Int64un,
    ),
    GemCreateIn,
)
GEM_CREATE_OUT = Layout.of(
    "drm_amdgpu_gem_create_out",
    cs.Struct("handle" / cs.Int32un, "pad" / cs.Int32un),
    GemCreateOut,
)
GEM_CREATE_SIZE = 32  # union drm_amdgpu_gem_create: max(in 32, out 8)

GEM_MMAP_IN = Layout.of(
    "drm_amdgpu_gem_mmap_in", cs.Struct("handle" / cs.Int32un, "pad" / cs.Int32un), GemMmapIn
)
GEM_MMAP_OUT = Layout.of(
    "drm_amdgpu_gem_mmap_out", cs.Struct("addr_ptr" / cs.Int64un), GemMmapOut
)
GEM_MMAP_SIZE = 8

GEM_VA = Layout.of(
    "drm_amdgpu_gem_va",
    cs.Struct(
        "handle" / cs.Int32un,
        "pad" / cs.Int32un,
        "operation" / cs.Int32un,
        "flags" / cs.Int32un,
        "va_address" / cs.Int64un,
        "offset_in_bo" / cs.Int64un,
        "map_size" / cs.Int64un,
        "vm_timeline_point" / cs.Int64un,
        "vm_timeline_syncobj_out" / cs.Int32un,
        "num_syncobj_handles" / cs.Int32un,
        "input_fence_syncobj_handles" / cs.Int64un,
    ),
    GemVa,
)
GEM_VA_LEGACY_SIZE = 40

GEM_OP = Layout.of(
    "drm_amdgpu_gem_op",
    cs.Struct(
        "handle" / cs.Int32un,
        "op" / cs.Int32un,
        "value" / cs.Int64un,
        "num_entries" / cs.Int32un,
        "padding" / cs.Int32un,
    ),
    GemOp,
)

GEM_USERPTR = Layout.of(
    "drm_amdgpu_gem_userptr",
    cs.Struct(
        "addr" / cs.Int64un,
        "size" / cs.Int64un,
        "flags" / cs.Int32un,
        "handle" / cs.Int32un,
    ),
    GemUserptr,
)

# struct drm_amdgpu_gem_metadata: {u32 handle; u32 op; struct drm_amdgpu_gem_metadata_data
# {u64 flags; u64 tiling_info; u32 data_size_bytes; u32 data[64];} data;}. The inner struct
# holds 276 bytes of fields and is padded to 280 for its u64 alignment (at offset 8), so the
# whole struct is 288 bytes with data[] at 28. Not a flat `Layout` (it nests an array): a
# construct schema and a generated struct.Struct, proven equal in tests like the UALink union.


@dataclass(frozen=True, slots=True)
class GemMetadata:
    handle: int
    op: int
    flags: int
    tiling_info: int
    data_size_bytes: int
    data: tuple[int, ...]  # 64 u32


GEM_METADATA_SCHEMA = cs.Struct(
    "handle" / cs.Int32un,
    "op" / cs.Int32un,
    "data"
    / cs.Struct(
        "flags" / cs.Int64un,
        "tiling_info" / cs.Int64un,
        "data_size_bytes" / cs.Int32un,
        "data" / cs.Array(64, cs.Int32un),
        cs.Padding(4),
    ),
)
GEM_METADATA_FAST = struct.Struct("<IIQQI64I4x")
GEM_METADATA_SIZE = 288
GEM_METADATA_DATA_OFFSET = 28  # data.data[0]
GEM_METADATA_DATA_BYTES = 256  # sizeof(data.data)
assert GEM_METADATA_FAST.size == GEM_METADATA_SCHEMA.sizeof() == GEM_METADATA_SIZE


def decode_gem_metadata(data: bytes) -> GemMetadata:
    """Fast path (exactly 288 bytes); proven equal to the construct schema in tests."""
    v = GEM_METADATA_FAST.unpack(data)
    return GemMetadata(v[0], v[1], v[2], v[3], v[4], v[5:])


def decode_gem_metadata_construct(data: bytes) -> GemMetadata:
    if len(data) != GEM_METADATA_SIZE:
        raise cs.StreamError(f"expected {GEM_METADATA_SIZE} bytes, got {len(data)}")
    p: Any = GEM_METADATA_SCHEMA.parse(data)
    d = p.data
    return GemMetadata(p.handle, p.op, d.flags, d.tiling_info, d.data_size_bytes,
                       tuple(d.data))


def encode_gem_metadata(value: GemMetadata) -> bytes:
    return GEM_METADATA_FAST.pack(value.handle, value.op, value.flags, value.tiling_info,
                                  value.data_size_bytes, *value.data)


# ---- UALink (spec §1.3) -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class UalinkHandleIn:
    """`struct drm_amdgpu_ualink_handle_in`, with both views of its inner union."""

    op: int
    flags: int
    gem_handle: int  # export view: u32 at offset 8
    handle_lo: int  # import view: import_ualink_handle[0], u64 at offset 8
    handle_hi: int  # import view: import_ualink_handle[1], u64 at offset 16


# The construct schema states the union exactly: both members parsed from offset 8.
UALINK_HANDLE_IN_SCHEMA = cs.Struct(
    "op" / cs.Int32un,
    "flags" / cs.Int32un,
    "u"
    / cs.Union(
        None,
        "export" / cs.Struct("gem_handle" / cs.Int32un, cs.Padding(4)),
        "import" / cs.Struct("import_ualink_handle" / cs.Array(2, cs.Int64un)),
    ),
    cs.Padding(0),
)
UALINK_HANDLE_SIZE = 24
UALINK_HANDLE_OUT_EXPORT = struct.Struct("<QQ")  # export_ualink_handle[2] at offset 0
UALINK_HANDLE_OUT_IMPORT = struct.Struct("<I")  # import_dmabuf_handle at offset 0
_UALINK_IN_FAST = struct.Struct("<IIQQ")


def decode_ualink_handle_in(data: bytes) -> UalinkHandleIn:
    """Fast path for the 24-byte union; proven equal to the construct schema in tests."""
    op, flags, lo, hi = _UALINK_IN_FAST.unpack(data)
    return UalinkHandleIn(op, flags, lo & 0xFFFFFFFF, lo, hi)


def decode_ualink_handle_in_construct(data: bytes) -> UalinkHandleIn:
    if len(data) != UALINK_HANDLE_SIZE:
        raise cs.StreamError(f"expected {UALINK_HANDLE_SIZE} bytes, got {len(data)}")
    parsed: Any = UALINK_HANDLE_IN_SCHEMA.parse(data)
    lo, hi = parsed.u["import"].import_ualink_handle
    return UalinkHandleIn(parsed.op, parsed.flags, parsed.u["export"].gem_handle, lo, hi)
