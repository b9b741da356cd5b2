"""The values an ioctl hands out and takes back, where they sit in its struct (issue 12
item 2; issue 33 item 4: they live on the ioctl table's entries, next to the trace hints).

A driver hands out values a client then passes back: GEM and syncobj handles (per open
file, `drm_gem_handle_create`'s idr), amdgpu context ids, GEM_MMAP offsets, dma-buf tokens
(per node), UALink handles (pod-wide: the importer's comes from the exporter), KFD queue
ids and doorbell mmap cookies (per kfd file). An entry's `HandedValues` says, by the struct
layout's field names (abi/structs.py), whether the call hands one out (`NEW`), takes one it
handed out (`REF`) or gives one back (`FREE`), which pointers lead to arrays of them in the
caller's memory (the syncobj ioctls' `handles`), and which answers read a clock no two runs
share. The trace reports the values handed out (`handed`); the replay (replay/) maps them
between two runs. Sans-IO: bytes in, ints out.
"""

from __future__ import annotations

from dataclasses import dataclass

from .structs import FieldAt

NEW, REF, FREE = "new", "ref", "free"


@dataclass(frozen=True, slots=True)
class Slot:
    """A value of `kind` in the struct's `at` field: `where` "in" is the bytes the caller
    passed, "out" the bytes copied back. Read unsigned and little-endian whatever the
    field's C type (an fd is a token here, never negative)."""

    at: FieldAt
    where: str  # "in" | "out"
    kind: str
    role: str  # NEW | REF | FREE

    @property
    def field(self) -> str:
        return self.at.name

    def read(self, data: bytes | bytearray) -> int | None:
        """The value, or None when `data` stops before the field ends."""
        if self.at.end > len(data):
            return None
        return int.from_bytes(data[self.at.offset:self.at.end], "little")

    def write(self, data: bytearray, value: int) -> None:
        if self.at.end <= len(data):
            data[self.at.offset:self.at.end] = value.to_bytes(self.at.size, "little")


def _padded(at: FieldAt, data: bytes | bytearray) -> int:
    """The field's value with the bytes past `data`'s end read as 0 (drm_ioctl zero-fills
    past what the caller passed)."""
    return int.from_bytes(data[at.offset:at.end], "little")


@dataclass(frozen=True, slots=True)
class ArraySlot:
    """The pointer field `ptr` leads to `count`'s worth of `size`-byte values of `kind` in
    the caller's memory (read in)."""

    ptr: FieldAt
    count: FieldAt
    kind: str
    size: int = 4

    @property
    def field(self) -> str:
        return self.ptr.name

    def pointer(self, in_bytes: bytes) -> int:
        return _padded(self.ptr, in_bytes)

    def length(self, in_bytes: bytes) -> int:
        return _padded(self.count, in_bytes)


@dataclass(frozen=True, slots=True)
class Handed:
    """A value the daemon handed out in a call's copied-back bytes (trace `handed`)."""

    kind: str
    field: str
    value: int

    def as_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "field": self.field, "value": self.value}


@dataclass(frozen=True, slots=True)
class HandedValues:
    """One entry's handed-out values. A union struct's slots depend on its op (`op`, read
    from the input): `by_op` pairs an op with its slots, any other op has `slots`. A clock:
    `clock_out` is the copied-back field span that holds readings; `clock_if` an input
    field and value saying the caller memory the call writes is one (compared by size)."""

    slots: tuple[Slot, ...] = ()
    op: FieldAt | None = None
    by_op: tuple[tuple[int, tuple[Slot, ...]], ...] = ()
    arrays: tuple[ArraySlot, ...] = ()
    clock_out: tuple[FieldAt, FieldAt] | None = None  # first and last field of the span
    clock_if: tuple[FieldAt, int] | None = None

    def slots_for(self, in_bytes: bytes) -> tuple[Slot, ...]:
        """The slots of this call; a union's are read from the input's op."""
        if self.op is not None:
            op = _padded(self.op, in_bytes)
            return next((s for v, s in self.by_op if v == op), self.slots)
        return self.slots

    def handed_out(self, in_bytes: bytes, out_bytes: bytes, result: int) -> list[Handed]:
        """The values a successful call handed out in its copied-back bytes."""
        if result != 0:
            return []
        out = []
        for s in self.slots_for(in_bytes):
            v = s.read(out_bytes) if s.where == "out" and s.role == NEW else None
            if v is not None:
                out.append(Handed(s.kind, s.field, v))
        return out

    def clock_reading(self, in_bytes: bytes) -> tuple[bool, tuple[int, int] | None]:
        """Answers that read a clock, which no two runs share: (the memory the call writes
        is one, the copied-out byte range that is one)."""
        memory = self.clock_if is not None and _padded(self.clock_if[0], in_bytes) == \
            self.clock_if[1]
        span = None if self.clock_out is None else (self.clock_out[0].offset,
                                                    self.clock_out[1].end)
        return memory, span


NOTHING_HANDED = HandedValues()  # an entry that hands out and takes back nothing

