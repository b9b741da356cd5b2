"""The per-file handle allocator of GEM handles and syncobjs: the kernel's idr_alloc(…, 1, 0).

A new handle is the lowest one not in use, counting from 1; 0 is never handed out, so a
zeroed struct never names an object (drm_gem_handle_create_tail, drm_syncobj_get_handle).
The tables that map handles to objects stay with their owners (DrmFile, SyncobjTable).
"""

from __future__ import annotations

import heapq


class HandleIdr:
    """Handles in use are [1, _next) minus `_free`; `_free` is a heap, so the lowest comes
    back first."""

    __slots__ = ("_free", "_next")

    def __init__(self) -> None:
        self._free: list[int] = []
        self._next = 1

    def alloc(self) -> int:
        """idr_alloc(idr, ptr, 1, 0, …): the lowest free handle ≥ 1."""
        if self._free:
            return heapq.heappop(self._free)
        handle = self._next
        self._next += 1
        return handle

    def remove(self, handle: int) -> None:
        """idr_remove: `handle` (one alloc() gave and not yet removed) is free again."""
        assert 0 < handle < self._next, f"handle {handle} was never allocated"
        heapq.heappush(self._free, handle)

    def clear(self) -> None:
        """idr_destroy: every handle is free; the next alloc() is 1 again."""
        self._free.clear()
        self._next = 1
