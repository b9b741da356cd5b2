"""GpuVm: one DrmFile's GPU virtual address space (spec §2.4, §2.6, §4.6, §6.3, policy 10).

The mappings. The bo_va bookkeeping: one `BoVa` per (file, BO), created by gem_object_open
and removed with all its mappings when the file's last handle to the BO closes (§2.4).
GEM_VA: `gem_va()` is amdgpu_gem_va_ioctl with every check in the kernel's order, and the
`GpuVm` map/unmap/replace/clear operations are amdgpu_vm_bo_map & co. The page-table walk
`plan()` cuts a VA range into pieces of local BO memory and remote NPA memory and says where
the first GPU page fault is; carrying the pieces out (GPU loads and stores) is access.py's.

Mappings are page aligned and never overlap; they sit in a sorted list of start addresses
(bisect) with a dict beside it, so a lookup is logarithmic. Addresses inside the VM are the
48-bit masked form GEM_VA stores; `pread`/`pwrite` offsets are taken as such addresses.
"""

from __future__ import annotations

import bisect
import errno
from collections.abc import Awaitable, Callable, Set
from dataclasses import dataclass, field

from ..abi import constants as c
from ..abi.structs import GemVa
from ..drm.errors import DrmError
from ..drm.syncobj import STUB, DrmSyncobj
from . import translation
from .bo import AmdgpuBo

PAGE = c.GPU_PAGE_SIZE
PAGE_SHIFT = 12
_U64 = (1 << 64) - 1

# amdgpu_vm.h / amdgpu_gmc.h (§2.6 [R] for the numbers the spec does not list).
VA_RESERVED_BOTTOM = 0x10000
GMC_HOLE_START = 0x0000_8000_0000_0000
GMC_HOLE_END = 0xFFFF_8000_0000_0000
GMC_HOLE_MASK = 0x0000_FFFF_FFFF_FFFF
# AMDGPU_VA_RESERVED_TOP = trap (2 pages) + seq64 (2 MiB) + CSA (2 MiB) [R].
VA_RESERVED_TOP = (2 << 12) + (2 << 20) + (2 << 20)
MAX_PFN = 1 << 36  # a 48-bit VM: 4-level page tables of 4 KiB pages
VM_SIZE = MAX_PFN * PAGE

VALID_FLAGS = (c.VM_DELAY_UPDATE | c.VM_PAGE_READABLE | c.VM_PAGE_WRITEABLE
               | c.VM_PAGE_EXECUTABLE | c.VM_MTYPE_MASK | c.VM_PAGE_NOALLOC)
PRT_FLAGS = c.VM_DELAY_UPDATE | c.VM_PAGE_PRT

KMALLOC_MAX_SIZE = 4 << 20  # memdup_user of a larger array fails with ENOMEM
NPA_GPUID_SHIFT = 29  # §4.1: the accel id field of a page-unit NPA


# ---- bookkeeping ------------------------------------------------------------------------


# The mappings of every bo_va that has none: one shared empty set, not a set per BO and
# file (an empty set is 216 bytes; a node with 10^6 exported BOs has a bo_va for each).
_NO_MAPPINGS: frozenset[Mapping] = frozenset()


@dataclass(eq=False, slots=True)
class BoVa:
    """amdgpu_bo_va: a BO's presence in one VM. `bo` is None for the VM's PRT bo_va."""

    vm: GpuVm
    bo: AmdgpuBo | None
    ref_count: int = 1  # handles of this file to the BO
    mappings: Set[Mapping] = _NO_MAPPINGS  # a set of its own from the first mapping


@dataclass(eq=False, slots=True)
class Mapping:
    """amdgpu_bo_va_mapping: VA [start, end) → BO bytes from `offset`, with GEM_VA flags."""

    start: int
    end: int
    offset: int
    flags: int
    bo_va: BoVa

    @property
    def bo(self) -> AmdgpuBo | None:
        return self.bo_va.bo


# ---- planned accesses ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LocalPiece:
    """Bytes of a BO of this node: `bo` is the BO that owns the memory (an import of another
    local device's dma-buf is followed to the exporting BO)."""

    bo: AmdgpuBo
    bo_offset: int
    length: int


@dataclass(frozen=True, slots=True)
class RemotePiece:
    """Bytes of an imported NPA BO: a fabric LOAD/STORE at the exporter (§4.5, §4.6).
    `bo` is the importing NPA BO (its device is the accel that issues the access)."""

    exporter_accel: int
    npa_byte_address: int
    length: int
    bo: AmdgpuBo | None = field(default=None, compare=False)


Piece = LocalPiece | RemotePiece


def npa_byte_address(npa: tuple[int, int, int], offset_in_bo: int) -> int:
    """§4.5: the importer rebuilds its NPA as offset | exporter_id << 29 (pages)."""
    exporter, page_offset, _pages = npa
    return ((exporter << NPA_GPUID_SHIFT) | page_offset) * PAGE + offset_in_bo


def _backing(bo: AmdgpuBo) -> AmdgpuBo:
    """The BO whose memory a BO shows: an import of a local foreign dma-buf is its exporter's."""
    return bo.backing()


def verify_parameters(bo: AmdgpuBo | None, saddr: int, offset: int, size: int) -> None:
    """amdgpu_vm_verify_parameters (§2.6 step 10): alignment, size, overflow, fit, max_pfn."""
    if (saddr | offset | size) & (PAGE - 1):
        raise DrmError(errno.EINVAL, "GEM_VA address, offset and size must be page aligned")
    if saddr + size > _U64 or offset + size > _U64 or size == 0:
        raise DrmError(errno.EINVAL, "GEM_VA size is 0 or the range overflows")
    if bo is not None and offset + size > bo.size:
        raise DrmError(errno.EINVAL, f"GEM_VA range ends past the BO ({bo.size:#x} bytes)")
    if (saddr + size - 1) >> PAGE_SHIFT >= MAX_PFN:
        raise DrmError(errno.EINVAL, "GEM_VA range ends past max_pfn")


class GpuVm:
    def __init__(self) -> None:
        self._starts: list[int] = []
        self._by_start: dict[int, Mapping] = {}
        self._bo_vas: dict[AmdgpuBo, BoVa] = {}  # by identity (no int key object per BO)
        self.prt_va = BoVa(self, None)  # fpriv->prt_va

    # -- bo_va (§2.4: gem_object_open / gem_object_close) -----------------------------------
    def bo_find(self, bo: AmdgpuBo) -> BoVa | None:
        return self._bo_vas.get(bo)

    def bo_open(self, bo: AmdgpuBo) -> BoVa:
        """A new handle of this file to `bo`: find or add its bo_va, one more reference."""
        bo_va = self._bo_vas.get(bo)
        if bo_va is None:
            bo_va = self._bo_vas[bo] = BoVa(self, bo)
        else:
            bo_va.ref_count += 1
        return bo_va

    def bo_close(self, bo: AmdgpuBo) -> None:
        """A handle of this file to `bo` closed; the last one removes the bo_va and every
        mapping of it (amdgpu_vm_bo_del)."""
        bo_va = self._bo_vas.get(bo)
        if bo_va is None:
            return
        bo_va.ref_count -= 1
        if bo_va.ref_count == 0:
            for m in list(bo_va.mappings):
                self._remove(m)
            del self._bo_vas[bo]

    # -- the interval structure --------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._starts)

    def mappings(self) -> list[Mapping]:
        """Every mapping, by address."""
        return [self._by_start[s] for s in self._starts]

    def lookup(self, va: int) -> Mapping | None:
        i = bisect.bisect_right(self._starts, va) - 1
        if i < 0:
            return None
        m = self._by_start[self._starts[i]]
        return m if va < m.end else None

    def overlapping(self, start: int, end: int) -> list[Mapping]:
        """Mappings that intersect [start, end), by address."""
        starts = self._starts
        i = bisect.bisect_right(starts, start) - 1
        if i < 0 or self._by_start[starts[i]].end <= start:
            i += 1
        out = []
        while i < len(starts) and starts[i] < end:
            out.append(self._by_start[starts[i]])
            i += 1
        return out

    def _insert(self, m: Mapping) -> None:
        translation.changed()
        bisect.insort(self._starts, m.start)
        self._by_start[m.start] = m
        mappings = m.bo_va.mappings
        if not isinstance(mappings, set):
            mappings = m.bo_va.mappings = set()
        mappings.add(m)

    def _remove(self, m: Mapping) -> None:
        translation.changed()
        i = bisect.bisect_left(self._starts, m.start)
        del self._starts[i]
        del self._by_start[m.start]
        mappings = m.bo_va.mappings
        assert isinstance(mappings, set), "a mapping in the VM is in its bo_va's set"
        mappings.discard(m)

    # -- GEM_VA operations (§2.6 steps 10–11; VM: amdgpu_vm_bo_map & co) -------------------
    def bo_map(self, bo_va: BoVa, va: int, offset: int, size: int, flags: int) -> Mapping:
        verify_parameters(bo_va.bo, va, offset, size)
        if self.overlapping(va, va + size):
            raise DrmError(errno.EINVAL, f"GEM_VA MAP at {va:#x} overlaps a mapping")
        m = Mapping(va, va + size, offset, flags, bo_va)
        self._insert(m)
        return m

    def bo_replace_map(
        self, bo_va: BoVa, va: int, offset: int, size: int, flags: int
    ) -> Mapping:
        verify_parameters(bo_va.bo, va, offset, size)
        self.clear_mappings(va, size)
        m = Mapping(va, va + size, offset, flags, bo_va)
        self._insert(m)
        return m

    def bo_unmap(self, bo_va: BoVa, va: int) -> None:
        """A mapping of this bo_va starting in the page of `va` (the kernel compares page
        numbers), else ENOENT."""
        page = va >> PAGE_SHIFT
        for m in bo_va.mappings:
            if m.start >> PAGE_SHIFT == page:
                self._remove(m)
                return
        raise DrmError(errno.ENOENT, f"GEM_VA UNMAP: no mapping of this BO at {va:#x}")

    def clear_mappings(self, va: int, size: int) -> None:
        """Remove everything in [va, va+size), keeping the parts of mappings that stick out."""
        verify_parameters(None, va, 0, size)
        end = va + size
        for m in self.overlapping(va, end):
            self._remove(m)
            if m.start < va:
                self._insert(Mapping(m.start, va, m.offset, m.flags, m.bo_va))
            if m.end > end:
                self._insert(Mapping(end, m.end, m.offset + (end - m.start), m.flags, m.bo_va))

    # -- GPU loads and stores (policy 10) ------------------------------------------------------
    def remote_route(self, va: int, length: int,
                     write: bool = False) -> tuple[Mapping, AmdgpuBo] | None:
        """The one readable (`write`: writeable) mapping of an imported NPA BO (not
        revoked) that holds all of [va, va + length), with that BO, or None: where a load
        (a store) of it goes, for the data plane's routes (node.gpu_read_route)."""
        need = c.VM_PAGE_WRITEABLE if write else c.VM_PAGE_READABLE
        m = self.lookup(va)
        if (m is None or not m.flags & need or m.bo_va.bo is None
                or va + length > m.end):
            return None
        bo = _backing(m.bo_va.bo)
        if bo.npa is None or bo.npa_revoked:
            return None
        return m, bo

    def plan(self, va: int, length: int, write: bool) -> tuple[list[Piece], int | None]:
        """Cut [va, va+length) into pieces by mapping; the second value is the VA of the
        first fault (unmapped, missing READABLE/WRITEABLE, a PRT mapping, a revoked NPA BO
        §6.3), or None. Pieces cover exactly [va, fault). Mappings are page aligned, so a
        fault after the first byte is always at a page boundary."""
        need = c.VM_PAGE_WRITEABLE if write else c.VM_PAGE_READABLE
        pieces: list[Piece] = []
        pos, end = va, va + length
        while pos < end:
            m = self.lookup(pos)
            if m is None or not m.flags & need or m.bo_va.bo is None:
                return pieces, pos
            bo = _backing(m.bo_va.bo)
            if write and bo.userptr is not None and bo.userptr.readonly:
                return pieces, pos  # its PTEs never carry WRITEABLE
            n = min(end, m.end) - pos
            off = m.offset + (pos - m.start)
            if bo.npa is not None:
                if bo.npa_revoked:
                    return pieces, pos
                pieces.append(RemotePiece(bo.npa[0], npa_byte_address(bo.npa, off), n, bo))
            else:
                pieces.append(LocalPiece(bo, off, n))
            pos += n
        return pieces, None


# ---- GEM_VA (§2.6) ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VaSync:
    """GEM_VA's access to the calling file's syncobjs: `read_handles(address, count)` reads
    the input-fence handle array from user memory (an awaitable; EFAULT), `find` looks a
    handle up."""

    read_handles: Callable[[int, int], Awaitable[tuple[int, ...]]]
    find: Callable[[int], DrmSyncobj | None]


def gem_va(
    vm: GpuVm, args: GemVa, lookup: Callable[[int], AmdgpuBo | None],
    sync: VaSync | None = None,
) -> Awaitable[None] | None:
    """amdgpu_gem_va_ioctl: every check in the kernel's order (§2.6 steps 1–11), then the
    operation and the timeline syncobj (step 12). Page tables are "updated" at once;
    DELAY_UPDATE changes nothing observable here (no command submission exists to pick the
    update up later). Without `sync` no user memory can be read and no syncobj exists.
    With input fences the rest runs after their handles are copied in: an awaitable."""
    va, size, flags, op = args.va_address, args.map_size, args.flags, args.operation
    if va < VA_RESERVED_BOTTOM:  # 1
        raise DrmError(errno.EINVAL, f"GEM_VA address {va:#x} in the reserved bottom")
    if GMC_HOLE_START <= va < GMC_HOLE_END:  # 2
        raise DrmError(errno.EINVAL, f"GEM_VA address {va:#x} in the GMC hole")
    va &= GMC_HOLE_MASK
    if (va + size) & _U64 > VM_SIZE - VA_RESERVED_TOP:  # 3 (u64 arithmetic, as in C)
        raise DrmError(errno.EINVAL, "GEM_VA range ends in the reserved top of the VM")
    if flags & ~VALID_FLAGS and flags & ~PRT_FLAGS:  # 4
        raise DrmError(errno.EINVAL, f"GEM_VA flags {flags:#x}")
    if op not in (c.VA_OP_MAP, c.VA_OP_UNMAP, c.VA_OP_CLEAR, c.VA_OP_REPLACE):  # 5
        raise DrmError(errno.EINVAL, f"GEM_VA operation {op}")
    if flags & c.VM_DELAY_UPDATE and args.vm_timeline_syncobj_out:  # 6
        raise DrmError(errno.EINVAL, "GEM_VA DELAY_UPDATE with a timeline syncobj")
    bo = None
    if op != c.VA_OP_CLEAR and not flags & c.VM_PAGE_PRT:  # 7
        bo = lookup(args.handle)
        if bo is None:
            raise DrmError(errno.ENOENT, f"no GEM handle {args.handle}")
    if args.num_syncobj_handles:  # 8
        if sync is None:
            raise DrmError(errno.EFAULT, "GEM_VA input syncobj handles: no user memory access")
        if args.num_syncobj_handles * 4 > KMALLOC_MAX_SIZE:
            raise DrmError(errno.ENOMEM, f"{args.num_syncobj_handles} input syncobj handles")
        return _va_after_input_fences(vm, args, va, bo, sync)
    _gem_va_apply(vm, args, va, bo, sync)
    return None


async def _va_after_input_fences(
    vm: GpuVm, args: GemVa, va: int, bo: AmdgpuBo | None, sync: VaSync
) -> None:
    handles = await sync.read_handles(args.input_fence_syncobj_handles,
                                      args.num_syncobj_handles)
    _wait_input_fences(sync, handles)
    _gem_va_apply(vm, args, va, bo, sync)


def _gem_va_apply(
    vm: GpuVm, args: GemVa, va: int, bo: AmdgpuBo | None, sync: VaSync | None
) -> None:
    """Steps 9–12, once the input fences are there. The BO is looked up again through the
    VM: if its handle closed meanwhile its bo_va went with it (ENOENT, as the kernel's)."""
    flags, op, size = args.flags, args.operation, args.map_size
    if bo is not None:  # 9
        bo_va = vm.bo_find(bo)
        if bo_va is None:
            raise DrmError(errno.ENOENT, "BO is not in this file's VM")
    elif op != c.VA_OP_CLEAR:
        bo_va = vm.prt_va
    else:
        bo_va = None
    timeline = None
    if args.vm_timeline_syncobj_out:  # amdgpu_gem_update_timeline_node
        timeline = sync.find(args.vm_timeline_syncobj_out) if sync is not None else None
        if timeline is None:
            raise DrmError(errno.ENOENT, f"no syncobj {args.vm_timeline_syncobj_out}")
    if op == c.VA_OP_MAP:  # 10, 11
        assert bo_va is not None
        vm.bo_map(bo_va, va, args.offset_in_bo, size, flags)
    elif op == c.VA_OP_UNMAP:
        assert bo_va is not None
        vm.bo_unmap(bo_va, va)
    elif op == c.VA_OP_CLEAR:
        vm.clear_mappings(va, size)
    else:
        assert bo_va is not None
        vm.bo_replace_map(bo_va, va, args.offset_in_bo, size, flags)
    # 12: the page tables are up to date at once; the update's fence (a plain, signaled one)
    # goes to the timeline syncobj. DELAY_UPDATE never gets here with one (step 6).
    if timeline is not None:
        if args.vm_timeline_point:
            timeline.add_point(args.vm_timeline_point)
        else:
            timeline.replace_fence(STUB)


def _wait_input_fences(sync: VaSync, handles: tuple[int, ...]) -> None:
    """amdgpu_gem_add_input_fence: the handle array is copied in whole (memdup_user: EFAULT,
    ENOMEM past KMALLOC_MAX_SIZE, checked by the caller), then each handle in turn: 0 →
    EINVAL, unknown → ENOENT, no fence → EINVAL (drm_syncobj_find_fence without
    WAIT_FOR_SUBMIT). The fences are waited for; every fence here is already signaled, so
    that wait returns at once."""
    for handle in handles:
        if handle == 0:
            raise DrmError(errno.EINVAL, "GEM_VA input syncobj handle 0")
        obj = sync.find(handle)
        if obj is None:
            raise DrmError(errno.ENOENT, f"no syncobj {handle}")
        if not obj.has_point(0):
            raise DrmError(errno.EINVAL, f"input syncobj {handle} has no fence")
