"""GEM objects, dma-bufs and the lifetimes that tie them together (spec §2.4, §2.5, §6.4).

Two counts per object, as in drm_gem.c: `refcount` (every holder: handles, dma-bufs, export
entries) frees the object at 0; `handle_count` (GEM handles in all DrmFiles of the device)
runs `handle_free` at 0, after the cached export dma-buf reference has been dropped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .device import DrmDevice


class GemObject:
    __slots__ = ("device", "dma_buf", "handle_count", "id", "import_buf", "refcount", "size")

    def __init__(self, device: DrmDevice, size: int) -> None:
        self.device = device
        self.size = size
        self.refcount = 1  # the creator's reference
        self.handle_count = 0
        self.dma_buf: DmaBuf | None = None  # the cached export (obj->dma_buf)
        # The foreign dma-buf this object imports (obj->import_attach's): a driver's
        # gem_prime_import sets it, its free hook drops the reference (drm_prime_gem_destroy).
        self.import_buf: DmaBuf | None = None
        self.id = device.next_object_id()
        device.objects[self.id] = self

    def get(self) -> None:
        self.refcount += 1

    def put(self) -> None:
        if self.refcount <= 0:
            raise AssertionError(f"GEM object {self.id}: put with refcount {self.refcount}")
        self.refcount -= 1
        if self.refcount == 0:
            del self.device.objects[self.id]
            self.free()

    # -- handle count ------------------------------------------------------------------
    def handle_get(self) -> None:
        self.handle_count += 1
        self.get()

    def handle_put(self) -> None:
        """Drop one GEM handle (drm_gem_object_handle_put_unlocked)."""
        if self.handle_count <= 0:
            raise AssertionError(f"GEM object {self.id}: handle_put at handle_count 0")
        self.handle_count -= 1
        if self.handle_count == 0:
            cached, self.dma_buf = self.dma_buf, None
            if cached is not None:
                cached.put()
            self.handle_free()
        self.put()

    # -- driver hooks --------------------------------------------------------------------
    def handle_free(self) -> None:
        """Runs once each time handle_count drops to 0 (SEED's drm_gem_object_funcs hook)."""

    def free(self) -> None:
        """Runs once when the last reference is gone."""


class DmaBuf:
    """A dma-buf exported from a GEM object. It holds one reference on the object.

    `refcount` counts files (opened dmabuf/<token> files), pending tokens, the object's
    export cache and the UALink export entry.
    """

    __slots__ = ("id", "obj", "refcount")

    def __init__(self, obj: GemObject) -> None:
        obj.get()
        self.obj = obj
        self.refcount = 1
        self.id = obj.device.next_object_id()

    @property
    def size(self) -> int:
        return self.obj.size

    def get(self) -> None:
        self.refcount += 1

    def put(self) -> None:
        if self.refcount <= 0:
            raise AssertionError(f"dma-buf {self.id}: put with refcount {self.refcount}")
        self.refcount -= 1
        if self.refcount == 0:
            if self.obj.dma_buf is self:
                self.obj.dma_buf = None
            self.obj.put()
