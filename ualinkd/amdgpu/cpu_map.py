"""CPU mappings of BOs: the kernel's mmap checks, and one-time grants to a BO's memory.

A process maps a BO by mmap(2) of its render node at the GEM_MMAP offset (drm_gem_mmap) or
of a dma-buf fd (dma_buf_mmap_internal → drm_gem_prime_mmap); both end in
amdgpu_gem_object_mmap. A FUSE file cannot be mapped MAP_SHARED here, so the LD_PRELOAD shim
asks first with UALINKD_IOCTL_MMAP_GRANT (abi/cpumap.py): the checks below are the kernel's,
in its order, and a request that passes gets a random single-use grant naming the BO's
memory (BoMemory.share, a sealed memfd). The shim then presents the grant on the daemon's
unix socket, from the same process (the very process, not its pid: drm/process.py) and uid,
and receives the memfd to map in
place of the FUSE file. So a process maps only what its own DrmFile holds a handle to (or
what its own dma-buf fd is), as drm_vma_node_is_allowed and the dma-buf fd require.
"""

from __future__ import annotations

import errno
import secrets
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from ..abi import constants as c
from ..abi import cpumap as abi
from ..drm.device import Caller
from ..drm.errors import DrmError
from ..drm.file import DrmFile
from ..drm.gem import DmaBuf
from ..drm.process import Identify, ProcessId, same_thread_group
from .bo import AmdgpuBo

# mmap(2) constants (asm-generic/mman*.h).
PROT_READ, PROT_WRITE, PROT_EXEC = 0x1, 0x2, 0x4
MAP_SHARED, MAP_PRIVATE, MAP_SHARED_VALIDATE, MAP_TYPE = 0x1, 0x2, 0x3, 0xF
O_ACCMODE, O_RDONLY, O_WRONLY, O_RDWR = 0x3, 0x0, 0x1, 0x2

# Grants the shim asked for and has not fetched yet. It fetches at once (the same mmap call),
# so only a client that dies in between leaves one behind; past this many the oldest goes,
# with the BO reference it held, and the daemon never grows without bound.
MAX_PENDING_GRANTS = 1024


@dataclass(frozen=True, slots=True)
class Grant:
    """What a fetched grant hands out: `bo`'s memory (one reference held until `done`),
    mapped from `backing_offset`, read-only unless `writable`; `map_type` is how the shim
    maps it (MAP_SHARED even for amdgpu's PROT_NONE MAP_PRIVATE, which is never COW)."""

    bo: AmdgpuBo
    process: ProcessId  # the FUSE caller's process
    uid: int
    backing_offset: int
    writable: bool
    map_type: int

    @property
    def memfd(self) -> int:
        return self.bo.memory.share()  # never a userptr BO (BO.memory asserts it)


def _mm_core_checks(req: abi.MmapGrant) -> bool:
    """do_mmap's checks before any driver sees the call, for a file mapping; whether the
    mapping may ever be written (VM_MAYWRITE with VM_SHARED)."""
    if req.length == 0 or req.offset & (c.PAGE_SIZE - 1):
        raise DrmError(errno.EINVAL, "mmap length 0 or unaligned offset")
    map_type = req.flags & MAP_TYPE
    if map_type not in (MAP_SHARED, MAP_PRIVATE, MAP_SHARED_VALIDATE):
        raise DrmError(errno.EINVAL, f"mmap flags {req.flags:#x}")
    mode = req.fmode & O_ACCMODE
    readable, writable = mode in (O_RDONLY, O_RDWR), mode in (O_WRONLY, O_RDWR)
    if map_type != MAP_PRIVATE and req.prot & PROT_WRITE and not writable:
        raise DrmError(errno.EACCES, "PROT_WRITE MAP_SHARED of a file not open for writing")
    if not readable:
        raise DrmError(errno.EACCES, "mmap of a file not open for reading")
    return map_type != MAP_PRIVATE and writable


def _amdgpu_gem_object_mmap(bo: AmdgpuBo, req: abi.MmapGrant) -> int:
    """amdgpu_gem_object_mmap, then ttm_bo_mmap_obj's no-COW rule; how the shim maps it.
    A userptr BO or one with NO_CPU_ACCESS (every imported NPA BO, §2.7) → EPERM. MAP_PRIVATE
    is COW (EINVAL) except PROT_NONE, which amdgpu keeps for the Thunk by clearing
    VM_MAYWRITE: then a read-only shared mapping, never writable, even after mprotect."""
    # The BO named and the one whose memory is mapped (an import of a local dma-buf is
    # backed by its exporter's BO, which may be NO_CPU_ACCESS or an NPA BO).
    for b in (bo, bo.backing()):
        if b.userptr is not None or not b.cpu_accessible:
            raise DrmError(errno.EPERM, "userptr BO, or BO with NO_CPU_ACCESS")
    if req.flags & MAP_TYPE == MAP_PRIVATE and req.prot & (PROT_READ | PROT_WRITE | PROT_EXEC):
        raise DrmError(errno.EINVAL, "a COW mapping of a BO")
    return MAP_SHARED


class CpuMapGrants:
    """The node's pending grants. `socket` is the id of the unix socket they are fetched
    from (abi.socket_name); 0 while no server listens, and then every request is ENODEV,
    which is what mmap answered before CPU mappings existed."""

    def __init__(self, randbits: Callable[[int], int] = secrets.randbits,
                 identify: Identify = same_thread_group) -> None:
        self._randbits = randbits
        self.identify = identify  # the calling thread's process (the edge's /proc answer)
        self._pending: OrderedDict[int, Grant] = OrderedDict()
        self.socket = 0

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    # -- the ioctl --------------------------------------------------------------------------
    def render_ioctl(self, file: DrmFile, in_bytes: bytes, caller: Caller) -> tuple[int, bytes]:
        """The grant ioctl on a render node: mmap(render fd, offset = GEM_MMAP's)."""
        return self._ioctl(in_bytes, caller, lambda req: self._render_target(file, req))

    def dmabuf_ioctl(self, buf: DmaBuf, in_bytes: bytes, caller: Caller) -> tuple[int, bytes]:
        """The grant ioctl on a dma-buf file: mmap(dma-buf fd, offset into the buffer)."""
        return self._ioctl(in_bytes, caller, lambda req: self._dmabuf_target(buf, req))

    def kfd_ioctl(self, target: Callable[[int, int], tuple[AmdgpuBo, int]], in_bytes: bytes,
                  caller: Caller) -> tuple[int, bytes]:
        """The grant ioctl on the kfd file: mmap(kfd fd, a KFD_MMAP_TYPE_* cookie);
        `target(offset, length)` is kfd_mmap's choice of memory (amdkfd/chardev.py)."""
        return self._ioctl(in_bytes, caller, lambda req: target(req.offset, req.length))

    def _ioctl(self, in_bytes: bytes, caller: Caller,
               target: Callable[[abi.MmapGrant], tuple[AmdgpuBo, int]]) -> tuple[int, bytes]:
        data = bytearray(in_bytes[: abi.MMAP_GRANT.size].ljust(abi.MMAP_GRANT.size, b"\0"))
        req = abi.MMAP_GRANT.decode(bytes(data))
        try:
            if not self.socket:
                raise DrmError(errno.ENODEV, "no CPU-mapping socket")
            may_write = _mm_core_checks(req)
            bo, backing_offset = target(req)
            map_type = _amdgpu_gem_object_mmap(bo, req)
            process = self.identify(caller.pid)
            if process is None:
                raise DrmError(errno.ESRCH, f"no process for thread {caller.pid}")
            grant = self._install(Grant(bo.backing(), process, caller.uid, backing_offset,
                                        may_write, map_type))
        except DrmError as e:
            return -e.errno, b""  # nothing copied back, like a failed mmap
        out = abi.MmapGrant(req.offset, req.length, req.prot, req.flags, req.fmode, req.pad,
                            grant, self.socket)
        return 0, abi.MMAP_GRANT.encode(out)

    @staticmethod
    def _render_target(file: DrmFile, req: abi.MmapGrant) -> tuple[AmdgpuBo, int]:
        """drm_gem_mmap: the offset must be exactly a BO's (drm_vma_offset_exact_lookup) and
        the mapping no longer than it (EINVAL); the file must hold a handle to it
        (drm_vma_node_is_allowed: EACCES)."""
        bo = next((o for o in file.device.objects.values()
                   if isinstance(o, AmdgpuBo) and o.mmap_offset == req.offset != 0), None)
        if bo is None or req.length > bo.size:
            raise DrmError(errno.EINVAL, f"no BO at mmap offset {req.offset:#x}")
        if not any(o is bo for o in file.handles.values()):
            raise DrmError(errno.EACCES, "this DrmFile holds no handle to that BO")
        return bo, 0

    @staticmethod
    def _dmabuf_target(buf: DmaBuf, req: abi.MmapGrant) -> tuple[AmdgpuBo, int]:
        """dma_buf_mmap_internal: the range must lie inside the buffer (EINVAL)."""
        if req.offset + req.length > buf.size:
            raise DrmError(errno.EINVAL, "mmap past the end of the dma-buf")
        bo = buf.obj
        assert isinstance(bo, AmdgpuBo)
        return bo, req.offset

    def _install(self, grant: Grant) -> int:
        grant.memfd  # noqa: B018  (share now: the fetch only hands out what exists)
        grant.bo.get()
        while len(self._pending) >= MAX_PENDING_GRANTS:
            _, old = self._pending.popitem(last=False)
            old.bo.put()
        gid = 0
        while gid == 0 or gid in self._pending:
            gid = self._randbits(64)
        self._pending[gid] = grant
        return gid

    # -- the socket -------------------------------------------------------------------------
    def take(self, gid: int, peer: ProcessId | None, peer_uid: int) -> Grant:
        """The fetch: the grant, once, to the process and uid that asked for it (the peer's
        credentials against the ioctl's caller: its process — a pidfd of the peer, not a
        pid that a later process may have been given — and uid). The caller calls `done`
        after sending."""
        grant = self._pending.pop(gid, None)
        if grant is None:
            raise DrmError(errno.ENOENT, "no such grant")
        if grant.uid != peer_uid or peer != grant.process:
            grant.bo.put()
            raise DrmError(errno.EACCES, "the grant belongs to another process")
        return grant

    @staticmethod
    def done(grant: Grant) -> None:
        grant.bo.put()

    def clear(self) -> None:
        while self._pending:
            _, g = self._pending.popitem()
            g.bo.put()
