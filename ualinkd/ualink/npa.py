"""NPA (network physical address) space of one accel: allocator and page table (spec §4).

All values are in 4 KiB pages, as in the driver. The accel id sits in bits 38..29 of a
page-unit NPA; a segment is 2^29 pages (2 TiB). `NpaSpace` is a best-fit range allocator
(drm_mm in the kernel) with 2 MiB alignment for allocations of 2 MiB or more; `NpaPageTable`
maps the exporter's granted NPA pages onto its BOs' pages.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..amdgpu.bo import AmdgpuBo

GPUID_SHIFT = 29
GPUID_MASK = (1 << 10) - 1  # the accel id: 10 bits, at GPUID_SHIFT
RANGE_MASK = (1 << GPUID_SHIFT) - 1  # bits 28..0: offset inside one GPU's segment
SEGMENT_PAGES = 1 << GPUID_SHIFT
RANGE_RESERVED = 512  # 2 MiB at the start of every segment (source-identification rings)
ALIAS_METADATA = 0x800  # 8 MiB reserved at the start of the alias space
WRITEBACK_PAGES = 2  # source-aliasing write-back area, allocated at activation (§4.2)
ALIGN_PAGES = 512  # 2 MiB alignment for allocations of >= 2 MiB


def strip_npa(npa: int) -> int:
    return npa & ~(GPUID_MASK << GPUID_SHIFT)


class NpaSpace:
    """Free-range allocator over [start, end) pages, best fit."""

    def __init__(self, start: int, end: int) -> None:
        self.start, self.end = start, end
        self._free: list[tuple[int, int]] = [(start, end)]  # sorted (start, end) holes
        self.used: dict[int, int] = {}  # start -> pages
        self.reserved: int | None = None  # the owner's own allocation (alias write-back area)

    def alloc(self, pages: int, lo: int | None = None, hi: int | None = None) -> int | None:
        """Best-fit allocation of `pages` inside [lo, hi) (default: the whole space)."""
        lo = self.start if lo is None else max(lo, self.start)
        hi = self.end if hi is None else min(hi, self.end)
        align = ALIGN_PAGES if pages >= ALIGN_PAGES else 1
        best: tuple[int, int, int] | None = None  # (hole size, index, aligned start)
        for i, (s, e) in enumerate(self._free):
            s2 = max(s, lo)
            s2 = -(-s2 // align) * align
            e2 = min(e, hi)
            if pages > 0 and s2 + pages <= e2 and (best is None or e - s < best[0]):
                best = (e - s, i, s2)
        if best is None:
            return None
        _, i, at = best
        s, e = self._free.pop(i)
        pieces = [(s, at), (at + pages, e)]
        for piece in reversed(pieces):
            if piece[0] < piece[1]:
                self._free.insert(i, piece)
        self.used[at] = pages
        return at

    def free(self, at: int) -> None:
        pages = self.used.pop(at)
        s, e = at, at + pages
        i = bisect.bisect(self._free, (s, e))
        if i < len(self._free) and self._free[i][0] == e:
            e = self._free.pop(i)[1]
        if i > 0 and self._free[i - 1][1] == s:
            s = self._free.pop(i - 1)[0]
            i -= 1
        self._free.insert(i, (s, e))

    @property
    def used_pages(self) -> int:
        return sum(self.used.values())


@dataclass(slots=True)
class NpaMapping:
    start: int  # NPA page (segment offset, GPU id stripped) as granted
    pages: int
    bo: AmdgpuBo
    valid: bool = True


class NpaPageTable:
    """The exporter's NPA VM: granted NPA page ranges -> (BO, page offset in BO)."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._maps: dict[int, NpaMapping] = {}

    def map(self, start: int, pages: int, bo: AmdgpuBo) -> None:
        bisect.insort(self._starts, start)
        self._maps[start] = NpaMapping(start, pages, bo)

    def unmap(self, start: int) -> None:
        if self._maps.pop(start, None) is not None:
            self._starts.remove(start)

    def invalidate(self, start: int) -> None:
        m = self._maps.get(start)
        if m is not None:
            m.valid = False

    def lookup(self, page: int) -> tuple[NpaMapping, int] | None:
        """The mapping holding `page` and the page's index inside the BO."""
        i = bisect.bisect_right(self._starts, page) - 1
        if i < 0:
            return None
        m = self._maps[self._starts[i]]
        if page >= m.start + m.pages or not m.valid:
            return None
        return m, page - m.start

    def __len__(self) -> int:
        return len(self._maps)
