"""DrmFile: one open of a render node, with its GEM handle table and PRIME cache (§2.4–2.5)
and its syncobj table (drm_syncobj.c).

Handles are per file, allocated lowest-free from 1 (idr_alloc(…, 1, 0); drm/idr.py); 0 is
never valid.
"""

from __future__ import annotations

import errno
from typing import TYPE_CHECKING

from .errors import DrmError
from .gem import DmaBuf, GemObject
from .idr import HandleIdr
from .syncobj import SyncobjTable

if TYPE_CHECKING:
    from .device import DrmDevice


class DrmFile:
    def __init__(self, device: DrmDevice, pid: int = 0, uid: int = 0) -> None:
        self.device = device
        self.pid = pid
        self.uid = uid
        self.handles: dict[int, GemObject] = {}
        self._idr = HandleIdr()
        # PRIME cache: the dma-buf each handle was exported as / imported from.
        self.prime_by_handle: dict[int, DmaBuf] = {}
        self.prime_by_buf: dict[int, int] = {}  # dma-buf id -> handle
        self.closed = False
        self.vm: object | None = None  # the driver's GPU VM of this file (amdgpu: GpuVm)
        self.syncobjs = SyncobjTable(device.syncobj_changed)

    # -- handle table -----------------------------------------------------------------
    def handle_create(self, obj: GemObject) -> int:
        """drm_gem_handle_create_tail: a new handle taking its own reference."""
        handle = self._idr.alloc()
        obj.handle_get()
        self.handles[handle] = obj
        self.device.driver.gem_object_open(obj, self)
        return handle

    def lookup(self, handle: int) -> GemObject | None:
        return self.handles.get(handle)

    def handle_delete(self, handle: int) -> None:
        """GEM_CLOSE: unknown handle -> EINVAL (drm_gem_handle_delete, spec §2.4)."""
        obj = self.handles.pop(handle, None)
        if obj is None:
            raise DrmError(errno.EINVAL, f"no GEM handle {handle}")
        self._idr.remove(handle)
        self._release_handle(handle, obj)

    def _release_handle(self, handle: int, obj: GemObject) -> None:
        self.device.driver.gem_object_close(obj, self)
        buf = self.prime_by_handle.pop(handle, None)
        if buf is not None:
            # Two handles of this file can share one dma-buf (both handles of one object);
            # the lookup by dma-buf then moves to the one that stays (drm_prime_remove_...).
            if self.prime_by_buf.get(buf.id) == handle:
                # Only another handle of the same object can share its dma-buf: none when
                # this is the object's last handle (a scan per close would make closing n
                # handles, e.g. n imports torn down by a revoke, cost n^2).
                other = None if obj.handle_count <= 1 else next(
                    (h for h, b in self.prime_by_handle.items() if b is buf), None)
                if other is None:
                    del self.prime_by_buf[buf.id]
                else:
                    self.prime_by_buf[buf.id] = other
            buf.put()
        obj.handle_put()

    # -- PRIME cache --------------------------------------------------------------------
    def prime_add(self, buf: DmaBuf, handle: int) -> None:
        if handle in self.prime_by_handle:
            return
        buf.get()
        self.prime_by_handle[handle] = buf
        self.prime_by_buf[buf.id] = handle

    def release(self) -> None:
        """Last close of the file (drm_release → drm_gem_release): every handle goes."""
        if self.closed:
            return
        self.closed = True
        for handle in sorted(self.handles):
            obj = self.handles.pop(handle)
            self._release_handle(handle, obj)
        self.syncobjs.release()  # drm_syncobj_release: waiters keep their own references
        self.device.file_closed(self)
