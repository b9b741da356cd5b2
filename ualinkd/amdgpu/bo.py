"""amdgpu buffer objects: a GemObject with domains, creation flags and placement (§2.3).

`MemoryPool` is a domain's capacity (VRAM, GTT), accounted at creation for every BO whose
bytes the daemon holds; the bytes themselves are a `BoMemory` created on first use and
allocated lazily, so a 16 GiB BO costs nothing until something writes to it, and what all
BOs can ever hold is the pools' sizes (the pod's memory budget, config.py). A BO that is
CPU-mapped shares them as a memfd (`BoMemory.share`); freed while a client still maps that
memfd, its charge stays in the pool (`MemoryPool.hold`) until the last mapping is gone, as
the kernel's vma keeps the GEM object and its placement.
"""

from __future__ import annotations

import errno
import itertools
import os
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..abi.constants import (
    CREATE_NO_CPU_ACCESS,
    CREATE_VM_ALWAYS_VALID,
    DOMAIN_CPU,
    DOMAIN_GTT,
    DOMAIN_VRAM,
)
from ..drm.errors import DrmError
from ..drm.gem import GemObject
from .memory import BoMemory, UserMemory, in_use_elsewhere

if TYPE_CHECKING:
    from ..drm.device import DrmDevice

# Sizes, alignments and flags take few distinct values, but each BO would hold its own int
# object of each (32 bytes apiece above 256): the BOs share one per value instead, up to a
# bound so that a client making BOs of ever new sizes grows nothing here.
_SHARED_INTS: dict[int, int] = {}
_SHARED_INTS_MAX = 4096


def shared_int(v: int) -> int:
    """The one int object every BO uses for the value `v` (v itself past the bound)."""
    got = _SHARED_INTS.get(v)
    if got is None:
        if len(_SHARED_INTS) >= _SHARED_INTS_MAX:
            return v
        got = _SHARED_INTS[v] = v
    return got


# Held memfds a read of a pool's use looks at (MemoryPool.used): about a millisecond.
REAP_BATCH = 32


class MemoryPool:
    """Capacity of one memory domain of one GPU, and the BOs placed in it."""

    def __init__(self, name: str, size: int) -> None:
        self.name = name
        self.size = size
        self._used = 0
        self.residents: set[AmdgpuBo] = set()
        # The memfds of freed BOs a client still maps (BoMemory.close), with their charge:
        # memory in use, that no BO of ours names any more (never evicted or moved). In the
        # order they are next looked at (reap).
        self.held: OrderedDict[int, int] = OrderedDict()

    @property
    def used(self) -> int:
        """Bytes charged: the BOs placed here, and freed BOs' memory still mapped (looked
        at again on every read, REAP_BATCH of them: what a munmap gave back shows at once
        while few are held, and after a few reads when a client holds thousands)."""
        if self.held:
            self.reap(REAP_BATCH)
        return self._used

    def fits(self, size: int) -> bool:
        return self.used + size <= self.size

    def charge(self, bo: AmdgpuBo) -> None:
        self._used += bo.size
        self.residents.add(bo)

    def uncharge(self, bo: AmdgpuBo) -> None:
        self._used -= bo.size
        self.residents.discard(bo)

    def hold(self, bo: AmdgpuBo, memfd: int) -> None:
        """`bo` is freed, but a client still maps its memory, the memfd (now ours to
        close): its charge stays until the memfd's last other user is gone."""
        self.residents.discard(bo)
        self.held[memfd] = bo.size

    def reap(self, most: int | None = None) -> int:
        """Give back the charge of the held memory nobody maps any more, looking at `most`
        of them (the ones looked at longest ago; None: all); how many bytes. The batch
        bounds what one read costs the thread that serves every client: one probe is four
        system calls, and a client may hold a memfd per page of the pool."""
        freed = 0
        for fd in list(itertools.islice(self.held, most)):
            if in_use_elsewhere(fd):
                self.held.move_to_end(fd)
                continue
            size = self.held.pop(fd)
            os.close(fd)
            self._used -= size
            freed += size
        return freed


def move(bo: AmdgpuBo, to: MemoryPool) -> None:
    """A BO changes domain (TTM validate / eviction); its bytes stay what they are."""
    if bo.placement is not None:
        bo.placement.uncharge(bo)
    to.charge(bo)
    bo.placement = to


def pin_in_vram(bo: AmdgpuBo, vram: MemoryPool, gtt: MemoryPool) -> bool:
    """amdgpu_bo_pin(bo, VRAM) for a BO not pinned yet: in VRAM already, or moved there,
    evicting unpinned VRAM BOs that may live in GTT (largest first) when it does not fit;
    False when even that cannot make room (everything else pinned, or GTT full)."""
    if bo.placement is vram:
        return True
    if not bo.allowed_domains & DOMAIN_VRAM:
        return False
    need = vram.used + bo.size - vram.size
    victims: list[AmdgpuBo] = []
    if need > 0:
        movable = sorted((b for b in vram.residents
                          if b.pin_count == 0 and b.allowed_domains & DOMAIN_GTT),
                         key=lambda b: b.size, reverse=True)
        for b in movable:
            if need <= 0:
                break
            victims.append(b)
            need -= b.size
        gtt_free = gtt.size - gtt.used + (bo.size if bo.placement is gtt else 0)
        if need > 0 or sum(b.size for b in victims) > gtt_free:
            return False
    for b in victims:
        move(b, gtt)
    move(bo, vram)
    return True


class AmdgpuBo(GemObject):
    __slots__ = (
        "_memory",
        "alignment",
        "allowed_domains",
        "flags",
        "metadata",
        "metadata_flags",
        "mmap_offset",
        "npa",
        "npa_revoked",
        "on_handle_free",
        "pin_count",
        "placement",
        "preferred_domains",
        "tiling_flags",
        "ualink_handle_lo",
        "userptr",
    )

    def __init__(
        self,
        device: DrmDevice,
        size: int,
        alignment: int,
        domains: int,
        flags: int,
        placement: MemoryPool | None,
    ) -> None:
        super().__init__(device, shared_int(size))
        self.alignment = shared_int(alignment)
        self.preferred_domains = domains
        self.allowed_domains = domains | DOMAIN_GTT if domains == DOMAIN_VRAM else domains
        self.flags = shared_int(flags)
        self.placement = placement
        if placement is not None:
            placement.charge(self)
        self.pin_count = 0
        self.ualink_handle_lo = 0  # bo->ualink_handle_lo: non-zero once exported (§3.4)
        self.mmap_offset = 0
        # An imported NPA BO (§4.6): (exporter accel id, NPA page offset, pages), and
        # whether a revoke/reset took the memory behind it away (§6.3).
        self.npa: tuple[int, int, int] | None = None
        self.npa_revoked = False
        self.on_handle_free: Callable[[AmdgpuBo], None] | None = None
        self._memory: BoMemory | None = None
        # A userptr BO (AMDGPU_GEM_USERPTR): its pages are a process's memory.
        self.userptr: UserMemory | None = None
        # amdgpu_bo_user's UMD metadata and tiling flags (GEM_METADATA): the BO's own, so
        # every handle and every importer of this BO (self-import) sees the same.
        self.tiling_flags = 0
        self.metadata = b""
        self.metadata_flags = 0

    def set_metadata(self, data: bytes, flags: int) -> None:
        """amdgpu_bo_set_metadata: an empty blob only drops the old one — the flags stay
        as they were (they change only together with a non-empty blob)."""
        if not data:
            self.metadata = b""
            return
        self.metadata = bytes(data)
        self.metadata_flags = flags

    @property
    def memory(self) -> BoMemory:
        """The BO's bytes, created on first use (reads of untouched bytes give zeros). A
        userptr BO has none of its own: its bytes are `userptr`, its process's memory."""
        assert self.userptr is None, "a userptr BO's memory is its process's"
        if self._memory is None:
            self._memory = BoMemory(self.size)
        return self._memory

    def backing(self) -> AmdgpuBo:
        """The BO whose bytes this one is: itself, or for an import of another local
        device's dma-buf the exporter's BO (as the GPU VM planner resolves it)."""
        bo = self
        while bo.import_buf is not None and isinstance(bo.import_buf.obj, AmdgpuBo):
            bo = bo.import_buf.obj
        return bo

    @property
    def vm_always_valid(self) -> bool:
        return bool(self.flags & CREATE_VM_ALWAYS_VALID)

    @property
    def cpu_accessible(self) -> bool:
        return not self.flags & CREATE_NO_CPU_ACCESS

    def handle_free(self) -> None:
        # amdgpu wires drm_gem_object_funcs.handle_free to the UALink revoke (§6.4).
        if self.on_handle_free is not None:
            self.on_handle_free(self)

    def free(self) -> None:
        mapped = None
        if self._memory is not None:  # VRAM_WIPE_ON_RELEASE: the bytes go with the BO
            mapped = self._memory.close()  # (unless a client still maps them)
            self._memory = None
        if self.userptr is not None:
            self.userptr.close()
            self.userptr = None
        if self.placement is not None:
            if mapped is not None:
                self.placement.hold(self, mapped)
            else:
                self.placement.uncharge(self)
            self.placement = None
        elif mapped is not None:  # (no pool accounts it: nothing to keep charged)
            os.close(mapped)
        if self.import_buf is not None:
            buf, self.import_buf = self.import_buf, None
            buf.put()


def place(size: int, domains: int, vram: MemoryPool, gtt: MemoryPool) -> MemoryPool:
    """Initial placement: VRAM first if allowed and free, then GTT; ENOMEM if neither.
    CPU-domain BOs (and domain 0, which amdgpu treats as CPU) live in system memory, which
    is what the GTT pool accounts. So do the special domains (GDS, GWS, OA, DOORBELL): tiny
    apertures on a GPU, but here their bytes are the daemon's like any BO's, and a BO whose
    bytes nobody accounts could grow the daemon without bound through GPU stores."""
    accounted = domains & (DOMAIN_VRAM | DOMAIN_GTT)
    if domains & DOMAIN_CPU or not accounted:
        accounted |= DOMAIN_GTT
    pools = [p for p, bit in ((vram, DOMAIN_VRAM), (gtt, DOMAIN_GTT)) if accounted & bit]
    for pool in pools:
        if pool.fits(size):
            return pool
    raise DrmError(errno.ENOMEM, f"{size} bytes fit in no allowed domain")
