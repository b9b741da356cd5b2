"""Command submission on the render node (issue 35): the BO lists of DRM_IOCTL_AMDGPU_BO_LIST
(amdgpu_bo_list.c), per file, as a later AMDGPU_CS names them by handle.

A list holds a reference on each of its BOs (amdgpu_bo_ref in amdgpu_bo_list_create), so a
BO whose last handle is closed stays alive while a list names it; the list's references go
when it is destroyed or replaced, and every list of a file goes at its last close
(amdgpu_driver_postclose_kms). AMDGPU_CS itself (chunks, IBs run by the SDMA engine of
amdgpu/sdma.py, fences) is not here yet: its ioctl still answers ENOTTY.
"""

from __future__ import annotations

import errno
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..abi import constants as c
from ..abi import ioctls as tbl
from ..abi import structs as st
from ..drm.errors import DrmError
from ..drm.idr import HandleIdr
from .bo import AmdgpuBo

if TYPE_CHECKING:
    from ..drm.device import Caller, DrmDevice
    from ..drm.file import DrmFile
    from .driver import AmdgpuDriver

__all__ = ["AMDGPU_BO_LIST_MAX_PRIORITY", "BoList", "BoLists"]

AMDGPU_BO_LIST_MAX_PRIORITY = 32  # amdgpu_bo_list.h: priorities above it are clamped
_KVMALLOC_MAX = 0x7FFF_FFFF  # kvmalloc refuses more than INT_MAX bytes: ENOMEM


@dataclass(frozen=True, slots=True)
class BoListEntry:
    bo: AmdgpuBo
    priority: int


class BoList:
    """One amdgpu_bo_list: its entries (userptr BOs last, as amdgpu_bo_list_create places
    them from the array's end) and the GEM references it holds until `release`."""

    __slots__ = ("entries", "released")

    def __init__(self, entries: list[BoListEntry]) -> None:
        self.entries = tuple(entries)
        self.released = False

    def release(self) -> None:
        """amdgpu_bo_list_free: each BO's reference goes, once."""
        assert not self.released, "a BO list released twice"
        self.released = True
        for e in self.entries:
            e.bo.put()


class _FileLists:
    """A file's bo_list_handles idr."""

    __slots__ = ("idr", "lists")

    def __init__(self) -> None:
        self.idr = HandleIdr()
        self.lists: dict[int, BoList] = {}


class BoLists:
    """The BO_LIST handler of one AmdgpuDriver and every file's lists."""

    def __init__(self, driver: AmdgpuDriver, device: DrmDevice) -> None:
        self.driver = driver
        self.device = device
        self._files: weakref.WeakKeyDictionary[DrmFile, _FileLists] = (
            weakref.WeakKeyDictionary())

    def get(self, file: DrmFile, handle: int) -> BoList | None:
        """amdgpu_bo_list_get: the file's list with that handle (AMDGPU_CS's bo_list_handle)."""
        fl = self._files.get(file)
        return None if fl is None else fl.lists.get(handle)

    def count(self, file: DrmFile) -> int:
        fl = self._files.get(file)
        return 0 if fl is None else len(fl.lists)

    def file_closed(self, file: DrmFile) -> None:
        """amdgpu_driver_postclose_kms: every list of the file is put."""
        fl = self._files.pop(file, None)
        if fl is not None:
            for lst in fl.lists.values():
                lst.release()
            fl.lists.clear()

    @tbl.handles(tbl.AMDGPU_BO_LIST)
    async def bo_list_ioctl(self, file: DrmFile, kdata: bytearray, caller: Caller) -> None:
        """amdgpu_bo_list_ioctl, step by step: the entry array is copied first, whatever the
        operation (amdgpu_bo_create_list_entry_array: all bo_number entries at once when
        bo_info_size is the entry's size, else min(bo_info_size, 8) bytes of each, the rest
        zero; EFAULT; more than kvmalloc's INT_MAX bytes ENOMEM) (1). CREATE makes the list
        (an unknown handle ENOENT; priorities clamped to 32) and gives it the lowest free
        handle from 1 (2); DESTROY drops the handle's list, if there is one, and answers
        handle 0 (3); UPDATE makes a new list and swaps it in for the handle's (none:
        ENOENT) (4); any other operation EINVAL (5). Then the union is zeroed and
        out.list_handle written (6)."""
        args = st.BO_LIST_IN.decode(bytes(kdata[: st.BO_LIST_IN.size]))
        info = await self._entries(caller, args)  # 1
        fl = self._files.get(file)
        if fl is None:
            fl = self._files[file] = _FileLists()
        handle = args.list_handle
        if args.operation == c.BO_LIST_OP_CREATE:  # 2
            lst = self._create(file, info)
            handle = fl.idr.alloc()
            fl.lists[handle] = lst
        elif args.operation == c.BO_LIST_OP_DESTROY:  # 3
            old = fl.lists.pop(handle, None)
            if old is not None:
                fl.idr.remove(handle)
                old.release()
            handle = 0
        elif args.operation == c.BO_LIST_OP_UPDATE:  # 4
            lst = self._create(file, info)
            old = fl.lists.get(handle)
            if old is None:
                lst.release()
                raise DrmError(errno.ENOENT, f"no BO list {handle}")
            fl.lists[handle] = lst
            old.release()
        else:  # 5
            raise DrmError(errno.EINVAL, f"BO_LIST operation {args.operation}")
        kdata[: st.BO_LIST_SIZE] = bytes(st.BO_LIST_SIZE)  # 6
        kdata[: st.BO_LIST_OUT.size] = st.BO_LIST_OUT.pack(handle, 0)

    async def _entries(self, caller: Caller,
                       args: st.AmdgpuBoListIn) -> list[st.AmdgpuBoListEntry]:
        size, n = st.BO_LIST_ENTRY.size, args.bo_number
        if n * size > _KVMALLOC_MAX:
            raise DrmError(errno.ENOMEM, f"{n} BO list entries")
        if n == 0:
            return []
        if args.bo_info_size == size:
            raw = await self.device.read_user(caller, args.bo_info_ptr, n * size)
            return [st.BO_LIST_ENTRY.decode(raw[i * size: (i + 1) * size]) for i in range(n)]
        take = min(args.bo_info_size, size)
        out = []
        for i in range(n):
            raw = (await self.device.read_user(caller, args.bo_info_ptr + i * args.bo_info_size,
                                               take) if take else b"")
            out.append(st.BO_LIST_ENTRY.decode(raw.ljust(size, b"\0")))
        return out

    def _create(self, file: DrmFile, info: list[st.AmdgpuBoListEntry]) -> BoList:
        """amdgpu_bo_list_create: each handle looked up (ENOENT, nothing kept), a
        reference taken; userptr BOs fill the array from its end. (Its EPERM for a userptr
        BO of another process's mm is not made: a BO here does not record its mm.)"""
        bos: list[AmdgpuBo] = []
        for e in info:
            obj = file.lookup(e.bo_handle)
            if obj is None:
                raise DrmError(errno.ENOENT, f"no GEM handle {e.bo_handle} for the BO list")
            assert isinstance(obj, AmdgpuBo)
            bos.append(obj)
        plain = [BoListEntry(bo, min(e.bo_priority, AMDGPU_BO_LIST_MAX_PRIORITY))
                 for bo, e in zip(bos, info, strict=True) if bo.userptr is None]
        userptr = [BoListEntry(bo, min(e.bo_priority, AMDGPU_BO_LIST_MAX_PRIORITY))
                   for bo, e in zip(bos, info, strict=True) if bo.userptr is not None]
        for bo in bos:
            bo.get()
        return BoList([*plain, *reversed(userptr)])
