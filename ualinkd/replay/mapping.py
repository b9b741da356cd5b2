"""What differs between two runs of one recorded session, and how a replay sees past it
(issue 12 item 2; sans-IO: no files, no ioctl(2), no trio).

A daemon hands out values a client then passes back: GEM and syncobj handles (per open file,
`drm_gem_handle_create`'s idr), amdgpu context ids, GEM_MMAP offsets, dma-buf tokens (per
node), UALink handles (pod-wide: the importer's comes from the exporter). Two runs of the same
session get different ones. `SLOTS` says, per ioctl, where in its struct those values sit and
whether the call hands one out (`new`), takes one it handed out (`ref`) or gives one back
(`free`); `ARRAYS` says which pointers lead to arrays of them in the caller's memory (the
syncobj ioctls' `handles`). `Mapper` keeps recorded -> replayed per kind and scope and flags a
replayed value that breaks the recording's pattern: a "new" value that was already handed out
for another recorded value, or 0 where the recording had a handle (0 is never a handle).

Pointers: a u64 at an 8-aligned offset of the struct (or of caller memory the call read) that
points into memory the call read or wrote is a pointer (DRM uapi passes pointers as __u64,
naturally aligned); the replay gives it a buffer of its own holding what the recording read.
"""

from __future__ import annotations

import bisect
import dataclasses
import struct
from collections.abc import Iterable, Sequence

from ..abi import constants as c

NEW, REF, FREE = "new", "ref", "free"
# Kinds whose values live in one open file's tables; the rest are per node or pod-wide.
PER_FILE = frozenset({"gem", "syncobj", "ctx", "mmap_offset", "kfd_queue", "kfd_doorbell"})
# Kinds for which 0 is a value like any other: a KFD queue id (the process's first queue
# is 0, find_first_zero_bit in pqm_create_queue), unlike a GEM/syncobj handle or a ctx id.
ZERO_IS_VALUE = frozenset({"kfd_queue"})
PER_NODE = frozenset({"token"})
POD_WIDE = frozenset({"ualink_lo", "ualink_hi"})


@dataclasses.dataclass(frozen=True, slots=True)
class Slot:
    """A value of `kind` at `offset` (`size` bytes, little-endian) of the struct: `in` is the
    bytes the caller passed, `out` the bytes copied back."""

    field: str
    where: str  # "in" | "out"
    offset: int
    size: int
    kind: str
    role: str  # NEW | REF | FREE

    def read(self, data: bytes | bytearray) -> int | None:
        if self.offset + self.size > len(data):
            return None
        return int.from_bytes(data[self.offset:self.offset + self.size], "little")

    def write(self, data: bytearray, value: int) -> None:
        if self.offset + self.size <= len(data):
            data[self.offset:self.offset + self.size] = value.to_bytes(self.size, "little")


@dataclasses.dataclass(frozen=True, slots=True)
class ArraySlot:
    """A pointer at `ptr` to `count`'s worth of `size`-byte values of `kind` (read in)."""

    field: str
    ptr: int
    count: int
    size: int
    kind: str


def _s(field: str, where: str, offset: int, kind: str, role: str, size: int = 4) -> Slot:
    return Slot(field, where, offset, size, kind, role)


# Offsets from the uapi structs (drm.h, amdgpu_drm.h; abi/structs.py has their layouts).
_FIXED: dict[str, tuple[Slot, ...]] = {
    "GEM_CLOSE": (_s("handle", "in", 0, "gem", FREE),),
    "PRIME_HANDLE_TO_FD": (_s("handle", "in", 0, "gem", REF), _s("fd", "out", 8, "token", NEW)),
    "PRIME_FD_TO_HANDLE": (_s("fd", "in", 8, "fd", REF), _s("handle", "out", 0, "gem", NEW)),
    "SYNCOBJ_CREATE": (_s("handle", "out", 0, "syncobj", NEW),),
    "SYNCOBJ_DESTROY": (_s("handle", "in", 0, "syncobj", FREE),),
    "SYNCOBJ_HANDLE_TO_FD": (_s("handle", "in", 0, "syncobj", REF),
                             _s("fd", "out", 8, "token", NEW)),
    "SYNCOBJ_FD_TO_HANDLE": (_s("fd", "in", 8, "fd", REF),
                             _s("handle", "out", 0, "syncobj", NEW)),
    "SYNCOBJ_TRANSFER": (_s("src_handle", "in", 0, "syncobj", REF),
                         _s("dst_handle", "in", 4, "syncobj", REF)),
    "SYNCOBJ_EVENTFD": (_s("handle", "in", 0, "syncobj", REF),),
    "AMDGPU_GEM_CREATE": (_s("handle", "out", 0, "gem", NEW),),
    "AMDGPU_GEM_MMAP": (_s("handle", "in", 0, "gem", REF),
                        _s("addr_ptr", "out", 0, "mmap_offset", NEW, 8)),
    "AMDGPU_GEM_METADATA": (_s("handle", "in", 0, "gem", REF),),
    "AMDGPU_GEM_WAIT_IDLE": (_s("handle", "in", 0, "gem", REF),),
    "AMDGPU_GEM_VA": (_s("handle", "in", 0, "gem", REF),
                      _s("vm_timeline_syncobj_out", "in", 40, "syncobj", REF)),
    "AMDGPU_GEM_OP": (_s("handle", "in", 0, "gem", REF),),
    "AMDGPU_GEM_USERPTR": (_s("handle", "out", 20, "gem", NEW),),
    # A user queue (kfd_ioctl.h): its id per process (the kfd file's), and the doorbell's
    # mmap cookie, which no ioctl takes back (the client mmaps it) but a re-created queue
    # may legitimately get another of.
    "AMDKFD_CREATE_QUEUE": (_s("doorbell_offset", "out", 24, "kfd_doorbell", NEW, 8),
                            _s("queue_id", "out", 52, "kfd_queue", NEW)),
    "AMDKFD_DESTROY_QUEUE": (_s("queue_id", "in", 0, "kfd_queue", FREE),),
    "AMDKFD_UPDATE_QUEUE": (_s("queue_id", "in", 8, "kfd_queue", REF),),
    "AMDKFD_SET_CU_MASK": (_s("queue_id", "in", 0, "kfd_queue", REF),),
    "AMDKFD_GET_QUEUE_WAVE_STATE": (_s("queue_id", "in", 16, "kfd_queue", REF),),
    "AMDKFD_ALLOC_QUEUE_GWS": (_s("queue_id", "in", 0, "kfd_queue", REF),),
}
_SYNCOBJ_HANDLES = (ArraySlot("handles", 0, 16, 4, "syncobj"),)
ARRAYS: dict[str, tuple[ArraySlot, ...]] = {
    "SYNCOBJ_WAIT": _SYNCOBJ_HANDLES,
    "SYNCOBJ_RESET": (ArraySlot("handles", 0, 8, 4, "syncobj"),),
    "SYNCOBJ_SIGNAL": (ArraySlot("handles", 0, 8, 4, "syncobj"),),
    "SYNCOBJ_TIMELINE_WAIT": (ArraySlot("handles", 0, 24, 4, "syncobj"),),
    "SYNCOBJ_QUERY": (ArraySlot("handles", 0, 16, 4, "syncobj"),),
    "SYNCOBJ_TIMELINE_SIGNAL": (ArraySlot("handles", 0, 16, 4, "syncobj"),),
    "AMDGPU_GEM_VA": (ArraySlot("input_fence_syncobj_handles", 48, 44, 4, "syncobj"),),
}


_INFO_TIMESTAMP = 0x05  # AMDGPU_INFO_TIMESTAMP: the GPU clock counter


def clock_reading(name: str, in_bytes: bytes) -> tuple[bool, tuple[int, int] | None]:
    """Answers that read a clock, which no two runs share: (the memory the call writes is
    one, the struct's copied-out byte range that is one). Compared by size only."""
    if name == "AMDGPU_INFO":
        query = int.from_bytes(in_bytes[12:16].ljust(4, b"\0"), "little")
        return query == _INFO_TIMESTAMP, None
    if name == "AMDKFD_GET_CLOCK_COUNTERS":  # gpu, cpu, system counters (u64 each)
        return False, (0, 24)
    return False, None


def slots(name: str, in_bytes: bytes) -> tuple[Slot, ...]:
    """The handed-out values in `name`'s struct; unions are read from the input's op."""
    if name == "AMDGPU_UALINK_HANDLE":
        op = int.from_bytes(in_bytes[:4].ljust(4, b"\0"), "little")
        if op == c.UalinkOp.EXPORT:
            return (_s("gem_handle", "in", 8, "gem", REF),
                    _s("export_ualink_handle[0]", "out", 0, "ualink_lo", NEW, 8),
                    _s("export_ualink_handle[1]", "out", 8, "ualink_hi", NEW, 8))
        return (_s("import_ualink_handle[0]", "in", 8, "ualink_lo", REF, 8),
                _s("import_ualink_handle[1]", "in", 16, "ualink_hi", REF, 8),
                _s("import_dmabuf_handle", "out", 0, "token", NEW))
    if name == "AMDGPU_CTX":
        op = int.from_bytes(in_bytes[:4].ljust(4, b"\0"), "little")
        if op == 1:  # AMDGPU_CTX_OP_ALLOC_CTX: out.alloc.ctx_id
            return (_s("ctx_id", "out", 0, "ctx", NEW),)
        return (_s("ctx_id", "in", 8, "ctx", FREE if op == 2 else REF),)
    return _FIXED.get(name, ())


@dataclasses.dataclass(frozen=True, slots=True)
class Handed:
    """A value the daemon handed out in a call's copied-back bytes (trace `handed`)."""

    kind: str
    field: str
    value: int

    def as_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "field": self.field, "value": self.value}


def handed_out(name: str, in_bytes: bytes, out_bytes: bytes, result: int) -> list[Handed]:
    if result != 0:
        return []
    out = []
    for s in slots(name, in_bytes):
        v = s.read(out_bytes) if s.where == "out" and s.role == NEW else None
        if v is not None:
            out.append(Handed(s.kind, s.field, v))
    return out


def is_value(kind: str, v: int | None) -> bool:
    """`v` (a slot's content) is a value of `kind` rather than "none" (0, for most kinds)."""
    return v is not None and (v != 0 or kind in ZERO_IS_VALUE)


def scope_of(kind: str, node: str, file: int | None) -> tuple[str, int | None]:
    if kind in POD_WIDE:
        return ("", None)
    if kind in PER_NODE:
        return (node, None)
    return (node, file)


class Mapper:
    """recorded -> replayed per (kind, scope), and the reverse to tell a fresh value from a
    reused one."""

    def __init__(self) -> None:
        self._fwd: dict[tuple[str, tuple[str, int | None]], dict[int, int]] = {}
        self._back: dict[tuple[str, tuple[str, int | None]], dict[int, int]] = {}

    def to_replay(self, kind: str, scope: tuple[str, int | None], recorded: int) -> int:
        """The replay's value for a recorded one; a value never handed out stays (a client's
        bogus handle is bogus in both runs)."""
        return self._fwd.get((kind, scope), {}).get(recorded, recorded)

    def to_recorded(self, kind: str, scope: tuple[str, int | None], replayed: int) -> int | None:
        return self._back.get((kind, scope), {}).get(replayed)

    def learn(self, kind: str, scope: tuple[str, int | None], recorded: int,
              replayed: int) -> str | None:
        """A value handed out in both runs: remember the pair (the replay goes on with what
        its daemon gave) and say how it breaks the recording's pattern, if it does."""
        fwd = self._fwd.setdefault((kind, scope), {})
        back = self._back.setdefault((kind, scope), {})
        problem = None
        zero_ok = kind in ZERO_IS_VALUE
        if not zero_ok and (recorded == 0) != (replayed == 0):
            problem = (f"recorded {recorded:#x}, replayed {replayed:#x} "
                       f"({'0 where the recording had a value' if replayed == 0 else 'not 0'})")
        elif recorded in fwd and fwd[recorded] != replayed:
            problem = (f"recorded {recorded:#x} again (replayed then as {fwd[recorded]:#x}), "
                       f"replayed {replayed:#x}")
        elif recorded not in fwd and replayed in back and back[replayed] != recorded:
            problem = (f"recorded {recorded:#x} (new), replayed {replayed:#x}, which the "
                       f"recording had as {back[replayed]:#x}")
        if zero_ok or (recorded and replayed):
            old = fwd.get(recorded)
            if old is not None and back.get(old) == recorded:
                del back[old]
            fwd[recorded] = replayed
            back[replayed] = recorded
        return problem

    def forget(self, kind: str, scope: tuple[str, int | None], recorded: int) -> None:
        """The value was given back (GEM_CLOSE, SYNCOBJ_DESTROY): the idr may hand it out
        again, in either run."""
        replayed = self._fwd.get((kind, scope), {}).pop(recorded, None)
        if replayed is not None:
            self._back.get((kind, scope), {}).pop(replayed, None)

    def forget_scope(self, scope: tuple[str, int | None]) -> None:
        """The file was released: its handle tables went with it."""
        for key in [k for k in self._fwd if k[1] == scope]:
            del self._fwd[key]
            self._back.pop(key, None)


# -- caller memory --------------------------------------------------------------------------
@dataclasses.dataclass(slots=True)
class Region:
    """A span of caller memory one call touched (merged from its accesses)."""

    start: int
    end: int


def regions(accesses: Iterable[tuple[int, int]]) -> list[Region]:
    """Merge (addr, length) accesses into disjoint spans, in address order."""
    out: list[Region] = []
    for addr, length in sorted((a, n) for a, n in accesses if n > 0):
        if out and addr <= out[-1].end:
            out[-1].end = max(out[-1].end, addr + length)
        else:
            out.append(Region(addr, addr + length))
    return out


_U64 = struct.Struct("<Q")


def pointers(data: bytes | bytearray, spans: Sequence[Region]) -> list[tuple[int, int, int]]:
    """(offset in data, index of the span, offset in the span) of every aligned u64 in
    `data` that points into one of `spans`."""
    found = []
    for off in range(0, len(data) - 7, 8):
        (v,) = _U64.unpack_from(data, off)
        i = span_at(spans, v)
        if i is not None:
            found.append((off, i, v - spans[i].start))
    return found


def span_at(spans: Sequence[Region], addr: int) -> int | None:
    """The index of the span of `spans` (disjoint, in address order: `regions`) holding
    `addr`, found by bisection (a call may have many)."""
    i = bisect.bisect_right(spans, addr, key=lambda r: r.start) - 1
    return i if i >= 0 and addr < spans[i].end else None
