"""What differs between two runs of one recorded session, and how a replay sees past it
(issue 12 item 2; sans-IO: no files, no ioctl(2), no trio).

A daemon hands out values a client then passes back (GEM and syncobj handles, context ids,
mmap offsets, dma-buf tokens, UALink handles); two runs of the same session get different
ones. Where they sit in each ioctl's struct is the ioctl table's (`IoctlSpec.handed`,
abi/values.py). `Mapper` keeps recorded -> replayed per kind and scope (an open file, a
node, the pod) and flags a replayed value that breaks the recording's pattern: a "new" value
that was already handed out for another recorded value, or 0 where the recording had a
handle (0 is never a handle, though it is a KFD queue id: `ZERO_IS_VALUE`).

Pointers: a u64 at an 8-aligned offset of the struct (or of caller memory the call read) that
points into memory the call read or wrote is a pointer (DRM uapi passes pointers as __u64,
naturally aligned); the replay gives it a buffer of its own holding what the recording read.
"""

from __future__ import annotations

import bisect
import dataclasses
import struct
from collections.abc import Iterable, Sequence

# Kinds whose values live in one open file's tables; the rest are per node or pod-wide.
PER_FILE = frozenset({"gem", "syncobj", "ctx", "mmap_offset", "kfd_queue", "kfd_doorbell"})
# Kinds for which 0 is a value like any other: a KFD queue id (the process's first queue
# is 0, find_first_zero_bit in pqm_create_queue), unlike a GEM/syncobj handle or a ctx id.
ZERO_IS_VALUE = frozenset({"kfd_queue"})
PER_NODE = frozenset({"token"})
POD_WIDE = frozenset({"ualink_lo", "ualink_hi"})


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
