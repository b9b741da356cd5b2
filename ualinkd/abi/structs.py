"""Byte layouts of every ioctl struct the daemon decodes (x86-64, native little endian).

construct is the source of truth for each layout; every `Layout` also carries a
`struct.Struct` generated from the same schema for the hot path (about 20x faster than
interpreted construct), and tests prove the two decode every input identically.
Decoded values are frozen, slotted dataclasses; construct Containers do not leave here.
"""

from __future__ import annotations

import dataclasses
import struct
import typing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Generic, TypeVar

import construct as cs

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")  # every record is a dataclass

# A record field's C type, in its annotation: `handle: U32` is an int that is a __u32 in the
# struct. Layout.of_record builds the construct schema from these, so a flat struct's fields
# are written once, in its record.
U32 = Annotated[int, cs.Int32un]
S32 = Annotated[int, cs.Int32sn]
U64 = Annotated[int, cs.Int64un]
S64 = Annotated[int, cs.Int64sn]

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
        fields = [f.name for f in dataclasses.fields(record)]
        names = [sub.name for sub in schema.subcons]
        if fields != names:
            raise TypeError(f"{name}: record fields {fields} != schema fields {names}")
        return cls(name, schema, record, struct.Struct(_flat_format(schema)))

    @classmethod
    def of_record(cls, name: str, record: type[T]) -> Layout[T]:
        """The layout whose fields are `record`'s, in order, each of the C type its
        annotation names (U32, S32, U64, S64)."""
        hints = typing.get_type_hints(record, include_extras=True)
        subs = []
        for f in dataclasses.fields(record):
            meta = getattr(hints[f.name], "__metadata__", ())
            if not meta:
                raise TypeError(f"{name}.{f.name}: no C type in its annotation (U32, U64, ...)")
            subs.append(f.name / meta[0])
        return cls.of(name, cs.Struct(*subs), record)

    @property
    def size(self) -> int:
        return self.fast.size

    def decode(self, data: bytes | bytearray) -> T:
        """Fast path. `data` must be exactly `size` bytes (the DRM core zero-extends)."""
        return self.record(*self.fast.unpack(data))

    def decode_construct(self, data: bytes) -> T:
        if len(data) != self.size:  # construct ignores trailing bytes; STYLE rule 4 does not
            raise cs.StreamError(f"{self.name}: expected {self.size} bytes, got {len(data)}")
        parsed = self.schema.parse(data)
        return self.record(*(parsed[sub.name] for sub in self.schema.subcons))

    def encode(self, value: T) -> bytes:
        return self.fast.pack(*dataclasses.astuple(value))

    def encode_construct(self, value: T) -> bytes:
        built: bytes = self.schema.build(dataclasses.asdict(value))
        return built

    def field(self, name: str) -> FieldAt:
        """One named field of the struct, to read or put alone (an answer's out field)."""
        fmt = self.fast.format
        for i, sub in enumerate(self.schema.subcons):
            if sub.name == name:
                return FieldAt(name, struct.calcsize(fmt[:i + 1]), struct.Struct("<" + fmt[i + 1]))
        raise KeyError(f"{self.name} has no field {name!r}")


@dataclass(frozen=True, slots=True)
class FieldAt:
    """One field of a struct: where it starts and its codec. `put` writes it in place (a
    handler filling one out field of kdata), `get` reads it."""

    name: str
    offset: int
    codec: struct.Struct

    @property
    def size(self) -> int:
        return self.codec.size

    @property
    def end(self) -> int:
        return self.offset + self.codec.size

    def get(self, data: bytes | bytearray) -> int:
        value: int = self.codec.unpack_from(data, self.offset)[0]
        return value

    def put(self, data: bytearray, value: int) -> None:
        self.codec.pack_into(data, self.offset, value)


# ---- drm.h ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DrmGemClose:
    handle: U32
    pad: U32


@dataclass(frozen=True, slots=True)
class DrmPrimeHandle:
    handle: U32
    flags: U32
    fd: S32


@dataclass(frozen=True, slots=True)
class DrmGetCap:
    capability: U64
    value: U64


GEM_CLOSE = Layout.of_record("drm_gem_close", DrmGemClose)
PRIME_HANDLE = Layout.of_record("drm_prime_handle", DrmPrimeHandle)
GET_CAP = Layout.of_record("drm_get_cap", DrmGetCap)

# ---- drm.h: syncobjs (drm_syncobj.c) ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DrmSyncobjCreate:
    handle: U32
    flags: U32


@dataclass(frozen=True, slots=True)
class DrmSyncobjDestroy:
    handle: U32
    pad: U32


@dataclass(frozen=True, slots=True)
class DrmSyncobjWait:
    handles: U64  # user pointer to count_handles u32
    timeout_nsec: S64  # absolute CLOCK_MONOTONIC
    count_handles: U32
    flags: U32
    first_signaled: U32
    pad: U32
    deadline_nsec: U64


@dataclass(frozen=True, slots=True)
class DrmSyncobjTimelineWait:
    handles: U64
    points: U64  # user pointer to count_handles u64 (NULL: every point 0)
    timeout_nsec: S64
    count_handles: U32
    flags: U32
    first_signaled: U32
    pad: U32
    deadline_nsec: U64


@dataclass(frozen=True, slots=True)
class DrmSyncobjArray:
    handles: U64
    count_handles: U32
    pad: U32


@dataclass(frozen=True, slots=True)
class DrmSyncobjTimelineArray:
    handles: U64
    points: U64
    count_handles: U32
    flags: U32


SYNCOBJ_CREATE = Layout.of_record("drm_syncobj_create", DrmSyncobjCreate)
SYNCOBJ_DESTROY = Layout.of_record("drm_syncobj_destroy", DrmSyncobjDestroy)
SYNCOBJ_WAIT = Layout.of_record("drm_syncobj_wait", DrmSyncobjWait)
SYNCOBJ_TIMELINE_WAIT = Layout.of_record("drm_syncobj_timeline_wait", DrmSyncobjTimelineWait)
SYNCOBJ_ARRAY = Layout.of_record("drm_syncobj_array", DrmSyncobjArray)
SYNCOBJ_TIMELINE_ARRAY = Layout.of_record("drm_syncobj_timeline_array", DrmSyncobjTimelineArray)

# ---- amdgpu_drm.h -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GemCreateIn:
    bo_size: U64
    alignment: U64
    domains: U64
    domain_flags: U64


@dataclass(frozen=True, slots=True)
class GemCreateOut:
    handle: U32
    pad: U32


@dataclass(frozen=True, slots=True)
class GemMmapIn:
    handle: U32
    pad: U32


@dataclass(frozen=True, slots=True)
class GemMmapOut:
    addr_ptr: U64


@dataclass(frozen=True, slots=True)
class GemVa:
    handle: U32
    pad: U32
    operation: U32
    flags: U32
    va_address: U64
    offset_in_bo: U64
    map_size: U64
    vm_timeline_point: U64
    vm_timeline_syncobj_out: U32
    num_syncobj_handles: U32
    input_fence_syncobj_handles: U64


@dataclass(frozen=True, slots=True)
class GemOp:
    handle: U32
    op: U32
    value: U64
    num_entries: U32
    padding: U32


@dataclass(frozen=True, slots=True)
class GemUserptr:
    addr: U64
    size: U64
    flags: U32
    handle: U32


GEM_CREATE_IN = Layout.of_record("drm_amdgpu_gem_create_in", GemCreateIn)
GEM_CREATE_OUT = Layout.of_record("drm_amdgpu_gem_create_out", GemCreateOut)
GEM_CREATE_SIZE = 32  # union drm_amdgpu_gem_create: max(in 32, out 8)

GEM_MMAP_IN = Layout.of_record("drm_amdgpu_gem_mmap_in", GemMmapIn)
GEM_MMAP_OUT = Layout.of_record("drm_amdgpu_gem_mmap_out", GemMmapOut)
GEM_MMAP_SIZE = 8

GEM_VA = Layout.of_record("drm_amdgpu_gem_va", GemVa)
GEM_VA_LEGACY_SIZE = 40

GEM_OP = Layout.of_record("drm_amdgpu_gem_op", GemOp)

GEM_USERPTR = Layout.of_record("drm_amdgpu_gem_userptr", GemUserptr)

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
GEM_METADATA_HANDLE = FieldAt("handle", 0, struct.Struct("<I"))
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


class UalinkHandleIn(typing.NamedTuple):
    """`struct drm_amdgpu_ualink_handle_in`, with both views of its inner union. Immutable
    and without a __dict__ like the frozen dataclasses, but a NamedTuple: it is decoded for
    every UALINK_HANDLE ioctl, and a frozen dataclass's __init__ (object.__setattr__ per
    field) took 1.7 µs here against 0.15 µs for the tuple (timeit, hot)."""

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
# The unions' members one by one (in: op, flags, then the union; out: the union).
_UALINK_IN_UNION_AT = sum(sub.sizeof() for sub in UALINK_HANDLE_IN_SCHEMA.subcons[:2])
UALINK_IN_OP = FieldAt("op", 0, struct.Struct("<I"))
UALINK_IN_FLAGS = FieldAt("flags", UALINK_IN_OP.end, struct.Struct("<I"))
UALINK_IN_GEM_HANDLE = FieldAt("gem_handle", _UALINK_IN_UNION_AT, struct.Struct("<I"))
UALINK_IN_IMPORT_HANDLE = tuple(
    FieldAt(f"import_ualink_handle[{i}]", _UALINK_IN_UNION_AT + 8 * i, struct.Struct("<Q"))
    for i in range(2))
UALINK_OUT_EXPORT_HANDLE = tuple(
    FieldAt(f"export_ualink_handle[{i}]", 8 * i, struct.Struct("<Q")) for i in range(2))
UALINK_OUT_IMPORT_DMABUF = FieldAt("import_dmabuf_handle", 0, UALINK_HANDLE_OUT_IMPORT)


def decode_ualink_handle_in(data: bytes) -> UalinkHandleIn:
    """Fast path for the 24-byte union; proven equal to the construct schema in tests."""
    op, flags, lo, hi = _UALINK_IN_FAST.unpack(data)
    return _new_tuple(UalinkHandleIn, (op, flags, lo & 0xFFFFFFFF, lo, hi))


# A NamedTuple made without its Python-level __new__ (the same tuple, a frame fewer).
_new_tuple = tuple.__new__


def decode_ualink_handle_in_construct(data: bytes) -> UalinkHandleIn:
    if len(data) != UALINK_HANDLE_SIZE:
        raise cs.StreamError(f"expected {UALINK_HANDLE_SIZE} bytes, got {len(data)}")
    parsed: Any = UALINK_HANDLE_IN_SCHEMA.parse(data)
    lo, hi = parsed.u["import"].import_ualink_handle
    return UalinkHandleIn(parsed.op, parsed.flags, parsed.u["export"].gem_handle, lo, hi)


# ---- structs with arrays or padding (answers copied to user memory, and their requests) -----


@dataclass(frozen=True, slots=True)
class ArrayLayout(Generic[T]):
    """A C struct with fixed arrays (a tuple field) and explicit padding (`cs.Padding`):
    the construct schema is the source of truth, the struct.Struct is generated from it,
    and `offsets` gives each field's offset for the C comparison. Kept apart from the flat
    `Layout`s, whose codecs map one format character to one field."""

    name: str
    schema: cs.Struct
    record: type[T]
    fast: struct.Struct
    counts: tuple[int | None, ...]  # per field: its array length, None for a scalar
    offsets: dict[str, int]

    @classmethod
    def of(cls, name: str, schema: cs.Struct, record: type[T]) -> ArrayLayout[T]:
        fmt, counts, offsets = "<", [], {}
        for sub in schema.subcons:
            if sub.name is None:  # cs.Padding
                fmt += f"{sub.sizeof()}x"
                continue
            inner = sub.subcon if isinstance(sub, cs.Renamed) else sub
            offsets[sub.name] = struct.calcsize(fmt)
            if isinstance(inner, cs.Array):
                fmt += f"{inner.count}{_FORMAT[inner.subcon]}"
                counts.append(inner.count)
            else:
                fmt += _FORMAT[inner]
                counts.append(None)
        fields = [f.name for f in dataclasses.fields(record)]
        if fields != list(offsets):
            raise TypeError(f"{name}: record fields {fields} != schema fields {list(offsets)}")
        fast = struct.Struct(fmt)
        if fast.size != schema.sizeof():
            raise TypeError(f"{name}: struct size {fast.size} != schema {schema.sizeof()}")
        return cls(name, schema, record, fast, tuple(counts), offsets)

    @property
    def size(self) -> int:
        return self.fast.size

    def decode(self, data: bytes | bytearray) -> T:
        flat = self.fast.unpack(data)
        values: list[Any] = []
        i = 0
        for n in self.counts:
            if n is None:
                values.append(flat[i])
                i += 1
            else:
                values.append(tuple(flat[i : i + n]))
                i += n
        return self.record(*values)

    def decode_construct(self, data: bytes) -> T:
        if len(data) != self.size:
            raise cs.StreamError(f"{self.name}: expected {self.size} bytes, got {len(data)}")
        parsed = self.schema.parse(data)
        return self.record(*(
            tuple(parsed[n]) if c is not None else parsed[n]
            for n, c in zip(self.offsets, self.counts, strict=True)))

    def encode(self, value: T) -> bytes:
        flat: list[int] = []
        for v, n in zip(dataclasses.astuple(value), self.counts,
                        strict=True):
            if n is None:
                flat.append(v)
            elif len(v) != n:
                raise struct.error(f"{self.name}: array of {len(v)}, not {n}")
            else:
                flat.extend(v)
        return self.fast.pack(*flat)

    def field(self, name: str, index: int = 0) -> FieldAt:
        """One named field (element `index` of an array field), to read or put alone."""
        for sub in self.schema.subcons:
            if sub.name == name:
                inner = sub.subcon if isinstance(sub, cs.Renamed) else sub
                elem = inner.subcon if isinstance(inner, cs.Array) else inner
                codec = struct.Struct("<" + _FORMAT[elem])
                shown = f"{name}[{index}]" if isinstance(inner, cs.Array) else name
                return FieldAt(shown, self.offsets[name] + index * codec.size, codec)
        raise KeyError(f"{self.name} has no field {name!r}")

    def encode_construct(self, value: T) -> bytes:
        d = dataclasses.asdict(value)
        built: bytes = self.schema.build({k: list(v) if isinstance(v, tuple) else v
                                          for k, v in d.items()})
        return built


_U32, _U64 = cs.Int32un, cs.Int64un


@dataclass(frozen=True, slots=True)
class DrmVersion:
    """struct drm_version: the three lengths are in/out, the pointers are caller buffers."""

    version_major: int
    version_minor: int
    version_patchlevel: int
    name_len: int
    name: int
    date_len: int
    date: int
    desc_len: int
    desc: int


DRM_VERSION = ArrayLayout.of(
    "drm_version",
    cs.Struct("version_major" / cs.Int32sn, "version_minor" / cs.Int32sn,
              "version_patchlevel" / cs.Int32sn, cs.Padding(4),
              "name_len" / _U64, "name" / _U64, "date_len" / _U64, "date" / _U64,
              "desc_len" / _U64, "desc" / _U64),
    DrmVersion,
)


@dataclass(frozen=True, slots=True)
class DrmSyncobjHandle:
    handle: U32
    flags: U32
    fd: S32
    pad: U32


@dataclass(frozen=True, slots=True)
class DrmSyncobjTransfer:
    src_handle: U32
    dst_handle: U32
    src_point: U64
    dst_point: U64
    flags: U32
    pad: U32


@dataclass(frozen=True, slots=True)
class DrmSyncobjEventfd:
    handle: U32
    flags: U32
    point: U64
    fd: S32
    pad: U32


SYNCOBJ_HANDLE = Layout.of_record("drm_syncobj_handle", DrmSyncobjHandle)
SYNCOBJ_TRANSFER = Layout.of_record("drm_syncobj_transfer", DrmSyncobjTransfer)
SYNCOBJ_EVENTFD = Layout.of_record("drm_syncobj_eventfd", DrmSyncobjEventfd)


# ---- amdgpu_drm.h: CTX, VM, INFO ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AmdgpuCtxIn:
    op: U32
    flags: U32
    ctx_id: U32
    priority: S32


@dataclass(frozen=True, slots=True)
class GemWaitIdleIn:
    handle: U32
    flags: U32
    timeout: U64


@dataclass(frozen=True, slots=True)
class AmdgpuVmIn:
    op: U32
    flags: U32


CTX_IN = Layout.of_record("drm_amdgpu_ctx_in", AmdgpuCtxIn)
CTX_SIZE = 16  # union drm_amdgpu_ctx
CTX_OUT_ALLOC = struct.Struct("<II")  # out.alloc: ctx_id, _pad
CTX_OUT_STATE = struct.Struct("<QII")  # out.state: flags, hangs, reset_status
CTX_OUT_CTX_ID = FieldAt("ctx_id", 0, struct.Struct("<I"))  # out.alloc.ctx_id (the union's start)
GEM_WAIT_IDLE_IN = Layout.of_record("drm_amdgpu_gem_wait_idle_in", GemWaitIdleIn)
GEM_WAIT_IDLE_SIZE = 16  # union drm_amdgpu_gem_wait_idle (out: status, domain)
VM_IN = Layout.of_record("drm_amdgpu_vm_in", AmdgpuVmIn)
VM_SIZE = 8  # union drm_amdgpu_vm


@dataclass(frozen=True, slots=True)
class AmdgpuBoListIn:
    operation: U32
    list_handle: U32
    bo_number: U32
    bo_info_size: U32
    bo_info_ptr: U64


@dataclass(frozen=True, slots=True)
class AmdgpuBoListEntry:
    bo_handle: U32
    bo_priority: U32


BO_LIST_IN = Layout.of_record("drm_amdgpu_bo_list_in", AmdgpuBoListIn)
BO_LIST_ENTRY = Layout.of_record("drm_amdgpu_bo_list_entry", AmdgpuBoListEntry)
BO_LIST_SIZE = 24  # union drm_amdgpu_bo_list
BO_LIST_OUT = struct.Struct("<II")  # out: list_handle, _pad


@dataclass(frozen=True, slots=True)
class AmdgpuCsIn:
    ctx_id: U32
    bo_list_handle: U32
    num_chunks: U32
    flags: U32
    chunks: U64  # a user array of num_chunks pointers, each to a drm_amdgpu_cs_chunk


@dataclass(frozen=True, slots=True)
class AmdgpuCsChunk:
    chunk_id: U32
    length_dw: U32
    chunk_data: U64


@dataclass(frozen=True, slots=True)
class AmdgpuCsChunkIb:
    pad: U32
    flags: U32
    va_start: U64
    ib_bytes: U32
    ip_type: U32
    ip_instance: U32
    ring: U32


@dataclass(frozen=True, slots=True)
class AmdgpuCsChunkDep:
    ip_type: U32
    ip_instance: U32
    ring: U32
    ctx_id: U32
    handle: U64


@dataclass(frozen=True, slots=True)
class AmdgpuCsChunkFence:
    handle: U32
    offset: U32


@dataclass(frozen=True, slots=True)
class AmdgpuCsChunkSem:
    handle: U32


@dataclass(frozen=True, slots=True)
class AmdgpuCsChunkSyncobj:
    handle: U32
    flags: U32
    point: U64


@dataclass(frozen=True, slots=True)
class AmdgpuWaitCsIn:
    handle: U64
    timeout: U64
    ip_type: U32
    ip_instance: U32
    ring: U32
    ctx_id: U32


@dataclass(frozen=True, slots=True)
class AmdgpuFence:
    ctx_id: U32
    ip_type: U32
    ip_instance: U32
    ring: U32
    seq_no: U64


@dataclass(frozen=True, slots=True)
class AmdgpuWaitFencesIn:
    fences: U64
    fence_count: U32
    wait_all: U32
    timeout_ns: U64


CS_IN = Layout.of_record("drm_amdgpu_cs_in", AmdgpuCsIn)
CS_SIZE = 24  # union drm_amdgpu_cs
CS_OUT = struct.Struct("<Q")  # out.handle: the submission's sequence number
CS_CHUNK = Layout.of_record("drm_amdgpu_cs_chunk", AmdgpuCsChunk)
CS_CHUNK_IB = Layout.of_record("drm_amdgpu_cs_chunk_ib", AmdgpuCsChunkIb)
CS_CHUNK_DEP = Layout.of_record("drm_amdgpu_cs_chunk_dep", AmdgpuCsChunkDep)
CS_CHUNK_FENCE = Layout.of_record("drm_amdgpu_cs_chunk_fence", AmdgpuCsChunkFence)
CS_CHUNK_SEM = Layout.of_record("drm_amdgpu_cs_chunk_sem", AmdgpuCsChunkSem)
CS_CHUNK_SYNCOBJ = Layout.of_record("drm_amdgpu_cs_chunk_syncobj", AmdgpuCsChunkSyncobj)
WAIT_CS_IN = Layout.of_record("drm_amdgpu_wait_cs_in", AmdgpuWaitCsIn)
WAIT_CS_SIZE = 32  # union drm_amdgpu_wait_cs (out: status u64)
AMDGPU_FENCE = Layout.of_record("drm_amdgpu_fence", AmdgpuFence)
WAIT_FENCES_IN = Layout.of_record("drm_amdgpu_wait_fences_in", AmdgpuWaitFencesIn)
WAIT_FENCES_SIZE = 24  # union drm_amdgpu_wait_fences
WAIT_FENCES_OUT = struct.Struct("<II")  # out: status, first_signaled
FENCE_TO_HANDLE_SIZE = 32  # union drm_amdgpu_fence_to_handle: in {fence, what, pad}
FENCE_TO_HANDLE_WHAT = struct.Struct("<II")  # in.what, in.pad after the 24-byte fence


@dataclass(frozen=True, slots=True)
class AmdgpuInfo:
    """struct drm_amdgpu_info; `args` is the 16-byte union as four u32: every view
    (query_hw_ip, read_mmr_reg, query_fw, sensor_info, ...) is u32s from offset 16."""

    return_pointer: int
    return_size: int
    query: int
    args: tuple[int, int, int, int]


INFO = ArrayLayout.of(
    "drm_amdgpu_info",
    cs.Struct("return_pointer" / _U64, "return_size" / _U32, "query" / _U32,
              "args" / cs.Array(4, _U32)),
    AmdgpuInfo,
)


@dataclass(frozen=True, slots=True)
class InfoGds:
    gds_gfx_partition_size: int
    compute_partition_size: int
    gds_total_size: int
    gws_per_gfx_partition: int
    gws_per_compute_partition: int
    oa_per_gfx_partition: int
    oa_per_compute_partition: int
    pad: int


@dataclass(frozen=True, slots=True)
class InfoVramGtt:
    vram_size: U64
    vram_cpu_accessible_size: U64
    gtt_size: U64


@dataclass(frozen=True, slots=True)
class HeapInfo:
    total_heap_size: U64
    usable_heap_size: U64
    heap_usage: U64
    max_allocation: U64


@dataclass(frozen=True, slots=True)
class InfoFirmware:
    ver: U32
    feature: U32


INFO_GDS = Layout.of("drm_amdgpu_info_gds",
                     cs.Struct(*(f.name / _U32 for f in dataclasses.fields(InfoGds))), InfoGds)
INFO_VRAM_GTT = Layout.of_record("drm_amdgpu_info_vram_gtt", InfoVramGtt)
HEAP_INFO = Layout.of_record("drm_amdgpu_heap_info", HeapInfo)
MEMORY_INFO_SIZE = 3 * 32  # struct drm_amdgpu_memory_info: vram, cpu_accessible_vram, gtt
INFO_FIRMWARE = Layout.of_record("drm_amdgpu_info_firmware", InfoFirmware)


@dataclass(frozen=True, slots=True)
class InfoHwIp:
    hw_ip_version_major: int
    hw_ip_version_minor: int
    capabilities_flags: int
    ib_start_alignment: int
    ib_size_alignment: int
    available_rings: int
    ip_discovery_version: int
    userq_num_slots: int


INFO_HW_IP = ArrayLayout.of(
    "drm_amdgpu_info_hw_ip",
    cs.Struct("hw_ip_version_major" / _U32, "hw_ip_version_minor" / _U32,
              "capabilities_flags" / _U64, "ib_start_alignment" / _U32,
              "ib_size_alignment" / _U32, "available_rings" / _U32,
              "ip_discovery_version" / _U32, "userq_num_slots" / _U32, cs.Padding(4)),
    InfoHwIp,
)


@dataclass(frozen=True, slots=True)
class InfoDevice:
    """struct drm_amdgpu_info_device of the current kernel uAPI (448 bytes); libdrm 2.4.114
    asks for its first 368 bytes (to tcc_disabled_mask) and gets exactly those."""

    device_id: int
    chip_rev: int
    external_rev: int
    pci_rev: int
    family: int
    num_shader_engines: int
    num_shader_arrays_per_engine: int
    gpu_counter_freq: int
    max_engine_clock: int
    max_memory_clock: int
    cu_active_number: int
    cu_ao_mask: int
    cu_bitmap: tuple[int, ...]  # [4][4], row-major
    enabled_rb_pipes_mask: int
    num_rb_pipes: int
    num_hw_gfx_contexts: int
    pcie_gen: int
    ids_flags: int
    virtual_address_offset: int
    virtual_address_max: int
    virtual_address_alignment: int
    pte_fragment_size: int
    gart_page_size: int
    ce_ram_size: int
    vram_type: int
    vram_bit_width: int
    vce_harvest_config: int
    gc_double_offchip_lds_buf: int
    prim_buf_gpu_addr: int
    pos_buf_gpu_addr: int
    cntl_sb_buf_gpu_addr: int
    param_buf_gpu_addr: int
    prim_buf_size: int
    pos_buf_size: int
    cntl_sb_buf_size: int
    param_buf_size: int
    wave_front_size: int
    num_shader_visible_vgprs: int
    num_cu_per_sh: int
    num_tcc_blocks: int
    gs_vgt_table_depth: int
    gs_prim_buffer_depth: int
    max_gs_waves_per_vgt: int
    pcie_num_lanes: int
    cu_ao_bitmap: tuple[int, ...]  # [4][4]
    high_va_offset: int
    high_va_max: int
    pa_sc_tile_steering_override: int
    tcc_disabled_mask: int
    min_engine_clock: int
    min_memory_clock: int
    tcp_cache_size: int
    num_sqc_per_wgp: int
    sqc_data_cache_size: int
    sqc_inst_cache_size: int
    gl1c_cache_size: int
    gl2c_cache_size: int
    mall_size: int
    enabled_rb_pipes_mask_hi: int
    shadow_size: int
    shadow_alignment: int
    csa_size: int
    csa_alignment: int
    userq_ip_mask: int
    pad: int


_U64_FIELDS = {
    "max_engine_clock", "max_memory_clock", "ids_flags", "virtual_address_offset",
    "virtual_address_max", "prim_buf_gpu_addr", "pos_buf_gpu_addr", "cntl_sb_buf_gpu_addr",
    "param_buf_gpu_addr", "high_va_offset", "high_va_max", "tcc_disabled_mask",
    "min_engine_clock", "min_memory_clock", "mall_size",
}


def _dev_info_schema() -> cs.Struct:
    subcons: list[Any] = []
    for f in dataclasses.fields(InfoDevice):
        if f.name in ("cu_bitmap", "cu_ao_bitmap"):
            subcons.append(f.name / cs.Array(16, _U32))
        elif f.name in _U64_FIELDS:
            if f.name == "tcc_disabled_mask":
                subcons.append(cs.Padding(4))  # after pa_sc_tile_steering_override
            subcons.append(f.name / _U64)
        else:
            subcons.append(f.name / _U32)
    subcons.append(cs.Padding(4))  # the struct's u64 alignment: 444 -> 448
    return cs.Struct(*subcons)


INFO_DEVICE = ArrayLayout.of("drm_amdgpu_info_device", _dev_info_schema(), InfoDevice)
INFO_DEVICE_2_4_114_SIZE = 368  # libdrm 2.4.114's struct ends at tcc_disabled_mask
assert INFO_DEVICE.size == 448
assert INFO_DEVICE.offsets["tcc_disabled_mask"] + 8 == INFO_DEVICE_2_4_114_SIZE


# ---- kfd_ioctl.h (the KFD's 'K' ioctls, include/ualink/ualink_kfd.h) ----------------------


@dataclass(frozen=True, slots=True)
class KfdGetVersion:
    major_version: U32
    minor_version: U32


@dataclass(frozen=True, slots=True)
class KfdSetMemoryPolicy:
    alternate_aperture_base: U64
    alternate_aperture_size: U64
    gpu_id: U32
    default_policy: U32
    alternate_policy: U32
    pad: U32


@dataclass(frozen=True, slots=True)
class KfdGetClockCounters:
    gpu_clock_counter: U64
    cpu_clock_counter: U64
    system_clock_counter: U64
    system_clock_freq: U64
    gpu_id: U32
    pad: U32


@dataclass(frozen=True, slots=True)
class KfdProcessDeviceApertures:
    lds_base: U64
    lds_limit: U64
    scratch_base: U64
    scratch_limit: U64
    gpuvm_base: U64
    gpuvm_limit: U64
    gpu_id: U32
    pad: U32


@dataclass(frozen=True, slots=True)
class KfdGetProcessAperturesNew:
    kfd_process_device_apertures_ptr: U64
    num_of_nodes: U32
    pad: U32


@dataclass(frozen=True, slots=True)
class KfdAcquireVm:
    drm_fd: U32
    gpu_id: U32


@dataclass(frozen=True, slots=True)
class KfdGetAvailableMemory:
    available: U64
    gpu_id: U32
    pad: U32


KFD_GET_VERSION = Layout.of_record("kfd_ioctl_get_version_args", KfdGetVersion)
KFD_SET_MEMORY_POLICY = Layout.of_record("kfd_ioctl_set_memory_policy_args", KfdSetMemoryPolicy)
KFD_GET_CLOCK_COUNTERS = Layout.of_record("kfd_ioctl_get_clock_counters_args", KfdGetClockCounters)
KFD_PROCESS_DEVICE_APERTURES = Layout.of_record(
    "kfd_process_device_apertures", KfdProcessDeviceApertures)
KFD_GET_PROCESS_APERTURES_NEW = Layout.of_record(
    "kfd_ioctl_get_process_apertures_new_args", KfdGetProcessAperturesNew)
KFD_ACQUIRE_VM = Layout.of_record("kfd_ioctl_acquire_vm_args", KfdAcquireVm)
KFD_GET_AVAILABLE_MEMORY = Layout.of_record(
    "kfd_ioctl_get_available_memory_args", KfdGetAvailableMemory)


@dataclass(frozen=True, slots=True)
class KfdAllocMemoryOfGpu:
    va_addr: U64
    size: U64
    handle: U64
    mmap_offset: U64
    gpu_id: U32
    flags: U32


@dataclass(frozen=True, slots=True)
class KfdFreeMemoryOfGpu:
    handle: U64


@dataclass(frozen=True, slots=True)
class KfdMapMemoryToGpu:
    handle: U64
    device_ids_array_ptr: U64
    n_devices: U32
    n_success: U32


KFD_ALLOC_MEMORY_OF_GPU = Layout.of_record(
    "kfd_ioctl_alloc_memory_of_gpu_args", KfdAllocMemoryOfGpu)
KFD_FREE_MEMORY_OF_GPU = Layout.of_record("kfd_ioctl_free_memory_of_gpu_args", KfdFreeMemoryOfGpu)
# kfd_ioctl_map_memory_to_gpu_args and kfd_ioctl_unmap_memory_from_gpu_args: one layout
KFD_MAP_MEMORY_TO_GPU = Layout.of_record("kfd_ioctl_map_memory_to_gpu_args", KfdMapMemoryToGpu)


@dataclass(frozen=True, slots=True)
class KfdExportDmabuf:
    handle: U64
    flags: U32
    dmabuf_fd: U32


KFD_EXPORT_DMABUF = Layout.of_record("kfd_ioctl_export_dmabuf_args", KfdExportDmabuf)


@dataclass(frozen=True, slots=True)
class KfdCreateEvent:
    event_page_offset: U64
    event_trigger_data: U32
    event_type: U32
    auto_reset: U32
    node_id: U32
    event_id: U32
    event_slot_index: U32


@dataclass(frozen=True, slots=True)
class KfdEventId:
    """kfd_ioctl_destroy_event_args, _set_event_args and _reset_event_args: one layout."""

    event_id: U32
    pad: U32


@dataclass(frozen=True, slots=True)
class KfdWaitEvents:
    events_ptr: U64
    num_events: U32
    wait_for_all: U32
    timeout: U32
    wait_result: U32


KFD_CREATE_EVENT = Layout.of_record("kfd_ioctl_create_event_args", KfdCreateEvent)
KFD_EVENT_ID = Layout.of_record("kfd_ioctl_set_event_args", KfdEventId)
KFD_WAIT_EVENTS = Layout.of_record("kfd_ioctl_wait_events_args", KfdWaitEvents)
KFD_EVENT_DATA_SIZE = 48  # struct kfd_event_data: a 32-byte union, an ext pointer, event_id, pad
KFD_EVENT_DATA_EVENT_ID = 40  # offsetof(struct kfd_event_data, event_id)


@dataclass(frozen=True, slots=True)
class KfdSetScratchBackingVa:
    va_addr: U64
    gpu_id: U32
    pad: U32


KFD_SET_SCRATCH_BACKING_VA = Layout.of_record(
    "kfd_ioctl_set_scratch_backing_va_args", KfdSetScratchBackingVa)


@dataclass(frozen=True, slots=True)
class KfdSetTrapHandler:
    tba_addr: U64
    tma_addr: U64
    gpu_id: U32
    pad: U32


KFD_SET_TRAP_HANDLER = Layout.of_record("kfd_ioctl_set_trap_handler_args", KfdSetTrapHandler)


@dataclass(frozen=True, slots=True)
class KfdSetXnackMode:
    xnack_enabled: S32  # __s32: < 0 queries


KFD_SET_XNACK_MODE = Layout.of_record("kfd_ioctl_set_xnack_mode_args", KfdSetXnackMode)


@dataclass(frozen=True, slots=True)
class KfdImportDmabuf:
    va_addr: U64
    handle: U64
    gpu_id: U32
    dmabuf_fd: U32


@dataclass(frozen=True, slots=True)
class KfdGetDmabufInfo:
    size: U64
    metadata_ptr: U64
    metadata_size: U32
    gpu_id: U32
    flags: U32
    dmabuf_fd: U32


KFD_IMPORT_DMABUF = Layout.of_record("kfd_ioctl_import_dmabuf_args", KfdImportDmabuf)
KFD_GET_DMABUF_INFO = Layout.of_record("kfd_ioctl_get_dmabuf_info_args", KfdGetDmabufInfo)


# -- queues (kfd_ioctl.h 1.17: create_queue_args grew sdma_engine_id + pad to 96 bytes; an
# older caller's 88 bytes are zero-extended, as kfd_ioctl does for any shorter user size)
@dataclass(frozen=True, slots=True)
class KfdCreateQueue:
    ring_base_address: U64
    write_pointer_address: U64
    read_pointer_address: U64
    doorbell_offset: U64
    ring_size: U32
    gpu_id: U32
    queue_type: U32
    queue_percentage: U32
    queue_priority: U32
    queue_id: U32
    eop_buffer_address: U64
    eop_buffer_size: U64
    ctx_save_restore_address: U64
    ctx_save_restore_size: U32
    ctl_stack_size: U32
    sdma_engine_id: U32
    pad: U32


KFD_CREATE_QUEUE = Layout.of_record("kfd_ioctl_create_queue_args", KfdCreateQueue)
KFD_CREATE_QUEUE_SIZE_1_16 = 88  # before sdma_engine_id (libhsakmt 5.2.3's size)


@dataclass(frozen=True, slots=True)
class KfdDestroyQueue:
    queue_id: U32
    pad: U32


@dataclass(frozen=True, slots=True)
class KfdUpdateQueue:
    ring_base_address: U64
    queue_id: U32
    ring_size: U32
    queue_percentage: U32
    queue_priority: U32


@dataclass(frozen=True, slots=True)
class KfdSetCuMask:
    queue_id: U32
    num_cu_mask: U32
    cu_mask_ptr: U64


@dataclass(frozen=True, slots=True)
class KfdGetQueueWaveState:
    ctl_stack_address: U64
    ctl_stack_used_size: U32
    save_area_used_size: U32
    queue_id: U32
    pad: U32


@dataclass(frozen=True, slots=True)
class KfdAllocQueueGws:
    queue_id: U32
    num_gws: U32
    first_gws: U32
    pad: U32


KFD_DESTROY_QUEUE = Layout.of_record("kfd_ioctl_destroy_queue_args", KfdDestroyQueue)
KFD_UPDATE_QUEUE = Layout.of_record("kfd_ioctl_update_queue_args", KfdUpdateQueue)
KFD_SET_CU_MASK = Layout.of_record("kfd_ioctl_set_cu_mask_args", KfdSetCuMask)
KFD_GET_QUEUE_WAVE_STATE = Layout.of_record(
    "kfd_ioctl_get_queue_wave_state_args", KfdGetQueueWaveState)
KFD_ALLOC_QUEUE_GWS = Layout.of_record("kfd_ioctl_alloc_queue_gws_args", KfdAllocQueueGws)


@dataclass(frozen=True, slots=True)
class KfdGetTileConfig:
    tile_config_ptr: U64
    macro_tile_config_ptr: U64
    num_tile_configs: U32
    num_macro_tile_configs: U32
    gpu_id: U32
    gb_addr_config: U32
    num_banks: U32
    num_ranks: U32


KFD_GET_TILE_CONFIG = Layout.of_record("kfd_ioctl_get_tile_config_args", KfdGetTileConfig)


@dataclass(frozen=True, slots=True)
class KfdRuntimeEnable:
    r_debug: U64
    mode_mask: U32
    capabilities_mask: U32


KFD_RUNTIME_ENABLE = Layout.of_record("kfd_ioctl_runtime_enable_args", KfdRuntimeEnable)
