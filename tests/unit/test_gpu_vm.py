"""The GPU VM of a DrmFile: bo_va lifetimes, GEM_VA, and GPU loads/stores through it
(spec §2.1, §2.4, §2.6, §4.5, §6.3, Emulator policy 3 and 10)."""

from __future__ import annotations

import errno
import itertools
import struct
from typing import Any

import pytest
import ualink_testkit as kit
from hypothesis import given, settings
from hypothesis import strategies as hs

from ualinkd.abi import constants as c
from ualinkd.abi import structs as st
from ualinkd.abi.ioc import ioc, iow
from ualinkd.amdgpu.bo import AmdgpuBo
from ualinkd.amdgpu.driver import AmdgpuDriver
from ualinkd.amdgpu.vm import (
    GMC_HOLE_MASK,
    MAX_PFN,
    PAGE,
    VA_RESERVED_TOP,
    VM_SIZE,
    GpuVm,
    LocalPiece,
    RemotePiece,
    gem_va,
)
from ualinkd.drm.completion import Completion
from ualinkd.drm.errors import DrmError
from ualinkd.drm.file import DrmFile

R, W = c.VM_PAGE_READABLE, c.VM_PAGE_WRITEABLE
RW = R | W
VA = 0x100000
UPPER = 0xFFFF_0000_0000_0000  # the upper half of a 48-bit VM is addressed sign-extended


def canon(a: int) -> int:
    """The address a client passes for VM address `a` (sign-extended above 47 bits)."""
    return a | UPPER if a >> 47 else a


GEM_VA_LEGACY = iow(0x48, st.GEM_VA_LEGACY_SIZE)
assert GEM_VA_LEGACY == 0x40286448


def driver_of(f: DrmFile) -> AmdgpuDriver:
    d = f.device.driver
    assert isinstance(d, AmdgpuDriver)
    return d


def vm_of(f: DrmFile) -> GpuVm:
    return driver_of(f).vm(f)


def bo_of(f: DrmFile, handle: int) -> AmdgpuBo:
    bo = f.lookup(handle)
    assert isinstance(bo, AmdgpuBo)
    return bo


def va_args(handle: int = 0, op: int = c.VA_OP_MAP, flags: int = RW, va: int = VA,
            offset: int = 0, size: int = PAGE, point: int = 0, syncobj_out: int = 0,
            num_syncobjs: int = 0, syncobjs: int = 0) -> st.GemVa:
    return st.GemVa(handle, 0, op, flags, va, offset, size, point, syncobj_out, num_syncobjs,
                    syncobjs)


def va_raw(f: DrmFile, *a: Any, cmd: int = kit.GEM_VA, **kw: Any):
    data = st.GEM_VA.encode(va_args(*a, **kw))
    return kit.run(kit.ioctl(f, cmd, data[: (cmd >> 16) & 0x3FFF]))  # input fences: a coroutine


def va_ok(f: DrmFile, *a: Any, **kw: Any) -> None:
    r = va_raw(f, *a, **kw)
    assert r.result == 0, r


def spans(f: DrmFile) -> list[tuple[int, int, int, int]]:
    return [(m.start, m.end, m.offset, m.flags) for m in vm_of(f).mappings()]


# ---- GEM_VA: every check of §2.6 in the kernel's order ------------------------------------------

BAD_FLAGS = R | c.VM_PAGE_PRT
NO_HANDLE = 999
# Each row breaks its own rule and, where it can, every later one too: the first rule
# broken decides the answer (alternating EINVAL / ENOENT makes the order visible).
ORDER = [
    ("1 reserved bottom", dict(va=0xF000, flags=BAD_FLAGS, op=9, handle=NO_HANDLE),
     errno.EINVAL, "reserved bottom"),
    ("2 GMC hole start", dict(va=0x0000_8000_0000_0000, flags=BAD_FLAGS, op=9,
                              handle=NO_HANDLE), errno.EINVAL, "GMC hole"),
    ("2 GMC hole end", dict(va=0xFFFF_7FFF_FFFF_F000, flags=BAD_FLAGS, handle=NO_HANDLE),
     errno.EINVAL, "GMC hole"),
    ("3 reserved top", dict(va=canon(VM_SIZE - VA_RESERVED_TOP - PAGE), size=2 * PAGE,
                            flags=BAD_FLAGS, op=9, handle=NO_HANDLE), errno.EINVAL,
     "reserved top"),
    ("3 upper half masked then too long", dict(va=0xFFFF_FFFF_FFFF_F000, size=PAGE,
                                               handle=NO_HANDLE), errno.EINVAL, "reserved top"),
    ("4 flags mix PRT and READABLE", dict(flags=BAD_FLAGS, op=9, handle=NO_HANDLE),
     errno.EINVAL, "flags"),
    ("4 unknown flag bit", dict(flags=1 << 10, op=9, handle=NO_HANDLE), errno.EINVAL, "flags"),
    ("5 operation 0", dict(op=0, handle=NO_HANDLE), errno.EINVAL, "operation"),
    ("5 operation 5", dict(op=5, handle=NO_HANDLE, flags=c.VM_DELAY_UPDATE, syncobj_out=1),
     errno.EINVAL, "operation"),
    ("6 DELAY_UPDATE with timeline syncobj", dict(flags=c.VM_DELAY_UPDATE | R, syncobj_out=1,
                                                 handle=NO_HANDLE), errno.EINVAL, "DELAY_UPDATE"),
    ("7 unknown handle", dict(handle=NO_HANDLE, num_syncobjs=1, va=VA + 1), errno.ENOENT,
     "no GEM handle"),
    ("7 handle 0", dict(handle=0, num_syncobjs=1), errno.ENOENT, "no GEM handle"),
    # Without user memory access (no copy_from_user here) the handle array cannot be read;
    # the syncobj rules of step 8 are tested in test_syncobj.py.
    ("8 input syncobjs", dict(num_syncobjs=1, syncobjs=0x7000, syncobj_out=3, va=VA + 1),
     errno.EFAULT, "input syncobj"),
    ("9 timeline syncobj out", dict(syncobj_out=3, va=VA + 1), errno.ENOENT, "no syncobj"),
    ("10 unaligned va", dict(va=VA + 0x800), errno.EINVAL, "page aligned"),
    ("10 unaligned offset", dict(offset=0x10), errno.EINVAL, "page aligned"),
    ("10 unaligned size", dict(size=PAGE + 1), errno.EINVAL, "page aligned"),
    ("10 size 0", dict(size=0), errno.EINVAL, "size is 0"),
    ("10 offset+size past the BO", dict(offset=PAGE, size=4 * PAGE), errno.EINVAL,
     "past the BO"),
    ("10 offset overflow", dict(offset=(1 << 64) - PAGE, size=2 * PAGE), errno.EINVAL,
     "overflows"),
    ("10 va+size wraps past check 3", dict(va=VA, size=(1 << 64) - VA), errno.EINVAL,
     "overflows"),
    ("10 REPLACE past the BO", dict(op=c.VA_OP_REPLACE, size=8 * PAGE), errno.EINVAL,
     "past the BO"),
    ("10 CLEAR size 0", dict(op=c.VA_OP_CLEAR, size=0, handle=NO_HANDLE), errno.EINVAL,
     "size is 0"),
    ("11 UNMAP with nothing mapped", dict(op=c.VA_OP_UNMAP), errno.ENOENT, "no mapping"),
]


@pytest.mark.parametrize("name,kw,err,msg", ORDER, ids=[r[0] for r in ORDER])
def test_gem_va_checks_in_kernel_order(f, name, kw, err, msg):
    """§2.6 steps 1–11: the first broken rule decides the errno, in the kernel's order."""
    h = kit.gem_create(f, 4 * PAGE)
    args = {"handle": h, **kw}
    with pytest.raises(DrmError) as ei:
        gem_va(vm_of(f), va_args(**args), lambda handle: f.lookup(handle))  # type: ignore
    assert (ei.value.errno, msg in ei.value.strerror) == (err, True), ei.value
    assert va_raw(f, **args).result == -err  # the same through the ioctl table
    assert spans(f) == []


def test_bo_not_in_this_files_vm_is_enoent_before_parameter_checks(f):
    """§2.6 step 9: a handle whose BO has no bo_va in this VM → ENOENT, before step 10.
    (The kernel reaches this only if gem_object_open failed; we drop the bo_va by hand.)"""
    h = kit.gem_create(f, PAGE)
    vm_of(f).bo_close(bo_of(f, h))
    with pytest.raises(DrmError) as ei:
        gem_va(vm_of(f), va_args(h, va=VA + 1, syncobj_out=3), f.lookup)  # type: ignore
    assert ei.value.errno == errno.ENOENT and "not in this file's VM" in ei.value.strerror


def test_reserved_top_boundary_and_upper_half(f):
    """§2.6 steps 2–3: a range ending exactly at VM size − reserved top is accepted; an
    upper-half address is masked to 48 bits and stored masked."""
    h = kit.gem_create(f, 4 * PAGE)
    top = VM_SIZE - VA_RESERVED_TOP
    va_ok(f, h, va=canon(top - 2 * PAGE), size=2 * PAGE)
    assert spans(f)[-1][:2] == (top - 2 * PAGE, top)
    assert (top - 1) >> 12 < MAX_PFN
    va_ok(f, h, va=0xFFFF_8000_0001_0000, size=PAGE)
    assert (0xFFFF_8000_0001_0000 & GMC_HOLE_MASK, PAGE) in [(s, e - s) for s, e, *_ in
                                                                spans(f)]
    va_ok(f, h, op=c.VA_OP_UNMAP, va=0xFFFF_8000_0001_0000)


def test_flag_subsets_accepted(f):
    """§2.6 step 4: the ordinary set with MTYPE and NOALLOC, and {DELAY_UPDATE, PRT}."""
    h = kit.gem_create(f, 4 * PAGE)
    va_ok(f, h, flags=c.VM_DELAY_UPDATE | RW | c.VM_PAGE_EXECUTABLE | c.VM_MTYPE_MASK
          | c.VM_PAGE_NOALLOC)
    va_ok(f, NO_HANDLE, flags=c.VM_PAGE_PRT | c.VM_DELAY_UPDATE, va=VA + 0x10000)
    va_ok(f, h, flags=0, va=VA + 0x20000)


def test_clear_and_prt_ignore_the_handle(f):
    """§2.6 step 7: CLEAR and PRT operations do not look the handle up; CLEAR checks no
    offset (it passes 0 to the parameter check)."""
    va_ok(f, NO_HANDLE, op=c.VA_OP_CLEAR, offset=0x123)
    va_ok(f, NO_HANDLE, flags=c.VM_PAGE_PRT, size=2 * PAGE)
    assert spans(f) == [(VA, VA + 2 * PAGE, 0, c.VM_PAGE_PRT)]
    va_ok(f, NO_HANDLE, op=c.VA_OP_UNMAP, flags=c.VM_PAGE_PRT)
    assert spans(f) == []


def test_legacy_40_byte_call(f):
    """§2.1/§2.2: a 40-byte GEM_VA (0x40286448) is zero-extended to 64 bytes by the core;
    nothing is copied back (table direction W), and an IOWR call gets nothing back either."""
    h = kit.gem_create(f, PAGE)
    r = va_raw(f, h, cmd=GEM_VA_LEGACY)
    assert (r.result, r.out) == (0, b"")
    assert spans(f) == [(VA, VA + PAGE, 0, RW)]
    r = va_raw(f, h, op=c.VA_OP_UNMAP, cmd=ioc(3, 0x64, 0x48, 64))
    assert (r.result, r.out) == (0, b"")
    assert spans(f) == []


# ---- map / unmap / replace / clear ----------------------------------------------------------


def test_map_overlap_is_einval_even_across_bos(f):
    """§2.6 step 11: MAP onto any existing mapping of this VM → EINVAL."""
    a, b = kit.gem_create(f, 4 * PAGE), kit.gem_create(f, 4 * PAGE)
    va_ok(f, a, size=2 * PAGE)
    assert va_raw(f, b, va=VA + PAGE, size=2 * PAGE).result == -errno.EINVAL
    assert va_raw(f, b, va=VA - PAGE, size=2 * PAGE).result == -errno.EINVAL
    va_ok(f, b, va=VA + 2 * PAGE, size=2 * PAGE)  # adjacent is fine
    va_ok(f, b, va=VA - PAGE, size=PAGE)


def test_unmap_needs_this_bo_at_that_page(f):
    """§2.6 step 11: UNMAP finds a mapping of *this* BO starting at the page of va (the
    kernel compares page numbers); a mapping's middle or another BO's → ENOENT."""
    a, b = kit.gem_create(f, 4 * PAGE), kit.gem_create(f, 4 * PAGE)
    va_ok(f, a, size=2 * PAGE)
    assert va_raw(f, b, op=c.VA_OP_UNMAP).result == -errno.ENOENT
    assert va_raw(f, a, op=c.VA_OP_UNMAP, va=VA + PAGE).result == -errno.ENOENT
    va_ok(f, a, op=c.VA_OP_UNMAP, va=VA + 0x800)
    assert spans(f) == []


def test_clear_splits_and_keeps_offsets(f):
    """§2.6 step 11: CLEAR removes the range and keeps the parts sticking out, the tail
    with its BO offset moved on; the tail is then unmapped at its own start."""
    h = kit.gem_create(f, 8 * PAGE)
    va_ok(f, h, offset=PAGE, size=6 * PAGE, flags=R)
    va_ok(f, NO_HANDLE, op=c.VA_OP_CLEAR, va=VA + 2 * PAGE, size=2 * PAGE)
    assert spans(f) == [(VA, VA + 2 * PAGE, PAGE, R), (VA + 4 * PAGE, VA + 6 * PAGE, 5 * PAGE, R)]
    assert va_raw(f, h, op=c.VA_OP_UNMAP, va=VA + 2 * PAGE).result == -errno.ENOENT
    va_ok(f, h, op=c.VA_OP_UNMAP, va=VA + 4 * PAGE)
    va_ok(f, h, op=c.VA_OP_UNMAP, va=VA)
    assert spans(f) == [] and not vm_of(f).prt_va.mappings


def test_clear_spanning_several_mappings(f):
    """§2.6 step 11: CLEAR across three mappings of two BOs."""
    a, b = kit.gem_create(f, 4 * PAGE), kit.gem_create(f, 4 * PAGE)
    va_ok(f, a, size=2 * PAGE)
    va_ok(f, b, va=VA + 2 * PAGE, size=PAGE)
    va_ok(f, a, va=VA + 4 * PAGE, offset=2 * PAGE, size=2 * PAGE)
    va_ok(f, NO_HANDLE, op=c.VA_OP_CLEAR, va=VA + PAGE, size=4 * PAGE)
    assert spans(f) == [(VA, VA + PAGE, 0, RW), (VA + 5 * PAGE, VA + 6 * PAGE, 3 * PAGE, RW)]


def test_replace_clears_the_range_first(f):
    """§2.6 step 11: REPLACE clears [va, va+size) of whatever is there, then maps."""
    a, b = kit.gem_create(f, 4 * PAGE), kit.gem_create(f, 4 * PAGE)
    va_ok(f, a, size=4 * PAGE)
    va_ok(f, b, op=c.VA_OP_REPLACE, va=VA + PAGE, offset=PAGE, size=2 * PAGE, flags=R)
    assert spans(f) == [(VA, VA + PAGE, 0, RW), (VA + PAGE, VA + 3 * PAGE, PAGE, R),
                        (VA + 3 * PAGE, VA + 4 * PAGE, 3 * PAGE, RW)]
    bva, bvb = vm_of(f).bo_find(bo_of(f, a)), vm_of(f).bo_find(bo_of(f, b))
    assert bva is not None and bvb is not None
    assert len(bva.mappings) == 2 and len(bvb.mappings) == 1


def test_lookup_is_by_interval(f):
    """§2.6: lookups hit inside a mapping and miss in gaps and at the end."""
    h = kit.gem_create(f, 4 * PAGE)
    va_ok(f, h, size=PAGE)
    va_ok(f, h, va=VA + 2 * PAGE, size=PAGE)
    vm = vm_of(f)
    assert vm.lookup(VA - 1) is None
    assert vm.lookup(VA) is vm.lookup(VA + PAGE - 1) is not None
    assert vm.lookup(VA + PAGE) is None
    assert vm.lookup(VA + 2 * PAGE) is not None
    assert vm.lookup(VA + 3 * PAGE) is None


# ---- bo_va lifetimes (§2.4) ---------------------------------------------------------------------


def test_gem_close_removes_bo_va_and_mappings(f):
    """§2.4: closing the file's last handle to a BO removes its bo_va and every mapping."""
    h = kit.gem_create(f, 4 * PAGE)
    va_ok(f, h, size=PAGE)
    va_ok(f, h, va=VA + 4 * PAGE, size=PAGE)
    bo = bo_of(f, h)
    assert vm_of(f).bo_find(bo) is not None
    kit.gem_close(f, h)
    assert spans(f) == [] and vm_of(f).bo_find(bo) is None


def test_bo_va_counts_handles_of_the_same_file(f):
    """§2.4: two handles of one file to one BO share a bo_va; the mappings go only with the
    second close. (A second handle to the same BO, as GEM_OPEN would make it.)"""
    h = kit.gem_create(f, PAGE)
    bo = bo_of(f, h)
    h2 = f.handle_create(bo)
    va_ok(f, h, size=PAGE)
    bo_va = vm_of(f).bo_find(bo)
    assert bo_va is not None and bo_va.ref_count == 2
    kit.gem_close(f, h)
    assert len(spans(f)) == 1
    kit.gem_close(f, h2)
    assert spans(f) == []


def test_each_file_has_its_own_vm(core, f):
    """§2.4/§2.6: VMs are per file; another file's GEM_CLOSE leaves ours alone, and a BO
    shared through PRIME needs its own GEM_VA in each file."""

    h = kit.gem_create(f, PAGE)
    g = kit.open_file(core)
    hg = kit.prime_from_fd(g, kit.open_token(core, kit.prime_to_token(f, h)))
    va_ok(f, h)
    assert spans(g) == []
    va_ok(g, hg, va=VA + PAGE, flags=R)
    kit.gem_close(g, hg)
    assert spans(g) == [] and len(spans(f)) == 1


def test_file_release_empties_its_vm(core, f):
    """§2.4: the last close of the file closes every handle, so every bo_va goes."""
    h = kit.gem_create(f, PAGE)
    va_ok(f, h)
    vm = vm_of(f)
    core.release_render(f)
    assert len(vm) == 0


# ---- GPU loads and stores (policy 10) ------------------------------------------------------------


def test_write_then_read_back(core, f):
    """Policy 10: a store then a load at the same VA through one mapping."""
    h = kit.gem_create(f, 4 * PAGE)
    va_ok(f, h, offset=PAGE, size=2 * PAGE)
    assert core.gpu_write(f, VA + 10, b"hello", kit.CALLER) == 5
    assert core.gpu_read(f, VA + 8, 9, kit.CALLER) == b"\0\0hello\0\0"
    assert bo_of(f, h).memory.read(PAGE + 10, 5) == b"hello"


def test_two_mappings_of_one_bo_alias(core, f):
    """§2.6: two VAs mapping the same BO page see each other's stores."""
    h = kit.gem_create(f, PAGE)
    va_ok(f, h)
    va_ok(f, h, va=VA + 0x10000, flags=R)
    core.gpu_write(f, VA, b"alias", kit.CALLER)
    assert core.gpu_read(f, VA + 0x10000, 5, kit.CALLER) == b"alias"


def test_unmapped_first_byte_is_efault_and_counted(core, f):
    """Policy 10: the first byte faults → EFAULT; the device's gpu_faults counts it and
    debugfs shows it."""
    faults = core.sys_tree()["kernel"]["debug"]["dri"]["128"]["gpu_faults"]
    assert faults.read() == "0\n"
    for op in (lambda: core.gpu_read(f, VA, 4, kit.CALLER),
               lambda: core.gpu_write(f, VA, b"x", kit.CALLER)):
        with pytest.raises(DrmError) as ei:
            op()
        assert ei.value.errno == errno.EFAULT
    assert driver_of(f).gpu_faults == 2
    assert faults.read() == "2\n"


def test_short_count_at_the_end_of_a_mapping(core, f):
    """Policy 10: a load/store running past the mapping stops at the first faulting page."""
    h = kit.gem_create(f, 2 * PAGE)
    va_ok(f, h, size=2 * PAGE)
    assert len(core.gpu_read(f, VA + 100, 3 * PAGE, kit.CALLER)) == 2 * PAGE - 100
    assert core.gpu_write(f, VA + PAGE, b"y" * 2 * PAGE, kit.CALLER) == PAGE
    assert driver_of(f).gpu_faults == 2


def test_permissions(core, f):
    """Policy 10: stores need WRITEABLE, loads READABLE; PRT mappings have neither."""
    h = kit.gem_create(f, 4 * PAGE)
    va_ok(f, h, flags=R)
    va_ok(f, h, va=VA + PAGE, offset=PAGE, flags=W)
    va_ok(f, NO_HANDLE, va=VA + 2 * PAGE, flags=c.VM_PAGE_PRT)
    assert core.gpu_read(f, VA, 8, kit.CALLER) == bytes(8)
    assert core.gpu_write(f, VA + PAGE, b"w", kit.CALLER) == 1
    for fn, va, arg in [(core.gpu_write, VA, b"w"), (core.gpu_read, VA + PAGE, 1),
                        (core.gpu_read, VA + 2 * PAGE, 1), (core.gpu_write, VA + 2 * PAGE, b"w")]:
        with pytest.raises(DrmError) as ei:
            fn(f, va, arg, kit.CALLER)
        assert ei.value.errno == errno.EFAULT
    # A read from the readable page into the write-only one stops at the boundary.
    assert core.gpu_read(f, VA + PAGE - 4, 8, kit.CALLER) == bytes(4)


def test_gem_close_then_access_faults(core, f):
    """§2.4 + policy 10: after GEM_CLOSE the mapping is gone and the VA faults."""
    h = kit.gem_create(f, PAGE)
    va_ok(f, h)
    core.gpu_write(f, VA, b"z", kit.CALLER)
    kit.gem_close(f, h)
    with pytest.raises(DrmError) as ei:
        core.gpu_read(f, VA, 1, kit.CALLER)
    assert ei.value.errno == errno.EFAULT


# ---- imported NPA BOs: remote pieces (§4.5, §4.6, §6.3) ------------------------------------------


def npa_bo(f: DrmFile, exporter: int = 5, page_offset: int = 0x1234, pages: int = 4) -> int:
    """A stand-in for an imported NPA BO (§4.6): domain NPA, NO_CPU_ACCESS, bo.npa set."""
    bo = driver_of(f).bo_create(pages * PAGE, 1, c.DOMAIN_NPA, c.CREATE_NO_CPU_ACCESS)
    bo.npa = (exporter, page_offset, pages)
    h = f.handle_create(bo)
    bo.put()
    return h


class FakeFabric:
    """remote_access that serves from a dict of exporter memories; `fault_from` makes every
    NPA address at or above it fault (short results stop there)."""

    def __init__(self) -> None:
        self.mem: dict[int, bytearray] = {}
        self.calls: list[tuple[int, RemotePiece, bool]] = []
        self.fault_from = 1 << 64

    def __call__(self, accel: int, piece: RemotePiece, write: bool,
                       data: bytes | None = None) -> bytes | int:
        self.calls.append((accel, piece, write))
        n = max(0, min(piece.length, self.fault_from - piece.npa_byte_address))
        if n == 0:
            raise DrmError(errno.EFAULT, "no PTE")
        base = piece.npa_byte_address
        if write:
            assert data is not None
            for i in range(n):
                self.mem.setdefault(base + i, bytearray(1))[0] = data[i]
            return n
        return bytes(self.mem.get(base + i, b"\0")[0] for i in range(n))


def test_npa_address_and_remote_round_trip(core, f):
    """§4.5: the NPA byte address is ((exporter << 29) | page offset) * 4096 + offset in
    the BO; accesses go to remote_access with the importing accel id."""
    fabric = FakeFabric()
    kit.attach_remote_access(core, fabric)
    h = npa_bo(f)
    va_ok(f, h, offset=PAGE, size=2 * PAGE)
    w = core.gpu_write(f, VA + 3, b"far", kit.CALLER)
    assert not isinstance(w, int)
    assert kit.run(w) == 3
    assert kit.run(core.gpu_read(f, VA + 2, 5, kit.CALLER)) == b"\0far\0"
    accel, piece, write = fabric.calls[0]
    assert accel == core.managers[128].accel_id == 0
    assert piece.exporter_accel == 5
    assert piece.npa_byte_address == ((5 << 29) | 0x1234) * 4096 + PAGE + 3
    assert write and piece.length == 3


def test_remote_fault_rules(core, f):
    """Policy 10 for remote pieces: a fault at the first byte → EFAULT, later → short
    count; a local piece before a failing remote one is kept."""
    fabric = FakeFabric()
    kit.attach_remote_access(core, fabric)
    local, remote = kit.gem_create(f, PAGE), npa_bo(f, pages=2)
    va_ok(f, local, size=PAGE)
    va_ok(f, remote, va=VA + PAGE, size=2 * PAGE)
    base = ((5 << 29) | 0x1234) * 4096
    fabric.fault_from = base + PAGE  # the NPA BO's second page has no PTE at the exporter
    core.gpu_write(f, VA, b"L" * PAGE, kit.CALLER)
    assert kit.run(core.gpu_write(f, VA + PAGE - 2, b"abcdef", kit.CALLER)) == 6
    assert kit.run(core.gpu_read(f, VA + PAGE - 2, 6, kit.CALLER)) == b"abcdef"
    assert len(kit.run(core.gpu_read(f, VA, 3 * PAGE, kit.CALLER))) == 2 * PAGE
    with pytest.raises(DrmError) as ei:
        kit.run(core.gpu_read(f, VA + 2 * PAGE, 4, kit.CALLER))
    assert ei.value.errno == errno.EFAULT
    assert driver_of(f).gpu_faults == 2


class LaterFabric:
    """A fabric that answers every remote piece by callback, when the test completes it
    (as the link's reader does when the DATA comes in)."""

    def __init__(self) -> None:
        self.pending: list[tuple[RemotePiece, Completion[Any]]] = []

    def access(self, accel: int, piece: RemotePiece, write: bool,
               data: bytes | None = None) -> Completion[Any]:
        c: Completion[Any] = Completion()
        self.pending.append((piece, c))
        return c

    def attach(self, core: Any) -> None:
        def no_imports(mgr: Any, flow: Any) -> Any:
            raise AssertionError("this test's fabric carries no imports")

        core.attach_fabric(core.after_request, no_imports, self.access)


def test_pieces_answered_later_go_in_turn_and_stop_at_a_short_one(core, f):
    """Policy 10 over several pieces answered by callback (access.py's _in_turn): the next
    remote piece is asked only once the one before came back, from the call that completes
    it, the bytes joined in order; a store whose remote piece comes back short stops there
    (the piece after it is never written) with the short count, and counts one fault."""
    fabric = LaterFabric()
    fabric.attach(core)
    local, a, b = kit.gem_create(f, PAGE), npa_bo(f, pages=1), npa_bo(f, pages=1)
    va_ok(f, local, size=PAGE)
    va_ok(f, a, va=VA + PAGE, size=PAGE)
    va_ok(f, b, va=VA + 2 * PAGE, size=PAGE)
    assert core.gpu_write(f, VA + PAGE - 2, b"LL", kit.CALLER) == 2  # (local: at once)

    r = core.gpu_read(f, VA + PAGE - 2, PAGE + 4, kit.CALLER)
    assert isinstance(r, Completion) and not r.done
    assert [p.length for p, _ in fabric.pending] == [PAGE]  # B waits for A
    fabric.pending.pop(0)[1].set_result(b"A" * PAGE)
    assert [p.length for p, _ in fabric.pending] == [2] and not r.done
    fabric.pending.pop(0)[1].set_result(b"BB")
    assert r.result() == b"LL" + b"A" * PAGE + b"BB"

    w = core.gpu_write(f, VA + PAGE, b"x" * (PAGE + 2), kit.CALLER)
    assert isinstance(w, Completion) and not w.done
    fabric.pending.pop(0)[1].set_result(100)  # the exporter faulted part-way
    assert w.result() == 100 and not fabric.pending
    assert driver_of(f).gpu_faults == 1


def test_no_fabric_means_exporter_unreachable(core, f):
    """Policy 3: without a fabric agent every remote access faults (EFAULT)."""
    h = npa_bo(f)
    va_ok(f, h)
    with pytest.raises(DrmError) as ei:
        kit.run(core.gpu_read(f, VA, 4, kit.CALLER))
    assert ei.value.errno == errno.EFAULT
    assert driver_of(f).gpu_faults == 1


def test_revoked_npa_bo_faults_but_mapping_stays(core, f):
    """§6.3: after a revoke the mapping record stays, its accesses fault."""
    fabric = FakeFabric()
    kit.attach_remote_access(core, fabric)
    h = npa_bo(f)
    va_ok(f, h)
    bo_of(f, h).npa_revoked = True
    with pytest.raises(DrmError) as ei:
        core.gpu_read(f, VA, 4, kit.CALLER)  # faults before any remote access: synchronous
    assert ei.value.errno == errno.EFAULT and not fabric.calls
    assert len(spans(f)) == 1
    va_ok(f, h, op=c.VA_OP_UNMAP)


def test_import_of_another_local_devices_dmabuf_shares_memory():
    """§2.5: a dma-buf of accel A imported into accel B is a GTT import BO of B; its GPU
    loads see A's memory."""

    core = kit.make_node(kit.pod_config(nodes=(({"id": 0}, {"id": 1}),)))
    fa, fb = kit.open_file(core, 0), kit.open_file(core, 1)
    ha = kit.gem_create(fa, PAGE)
    hb = kit.prime_from_fd(fb, kit.open_token(core, kit.prime_to_token(fa, ha)))
    assert bo_of(fb, hb) is not bo_of(fa, ha)
    va_ok(fa, ha)
    va_ok(fb, hb, va=VA + PAGE)
    core.gpu_write(fa, VA, b"shared", kit.CALLER)
    assert core.gpu_read(fb, VA + PAGE, 6, kit.CALLER) == b"shared"


# ---- the planner against a byte-by-byte model (hypothesis) -----------------------------------

WINDOW = 12  # pages of VA the random mappings live in
BASE = 0x200000


@hs.composite
def layouts(draw: Any) -> list[tuple[int, int, int, int, str]]:
    """Non-overlapping mappings: (first page, pages, BO page offset, flags, BO kind)."""
    out, page = [], 0
    while page < WINDOW:
        page += draw(hs.integers(0, 2))
        if page >= WINDOW:
            break
        pages = draw(hs.integers(1, min(4, WINDOW - page)))
        flags = draw(hs.sampled_from([R, W, RW, 0, c.VM_PAGE_PRT]))
        kind = draw(hs.sampled_from(["local", "local2", "npa", "npa_revoked"]))
        out.append((page, pages, draw(hs.integers(0, 4 - 1)), flags, kind))
        page += pages
    return out


@settings(max_examples=150, deadline=None)
@given(layouts(), hs.integers(0, WINDOW * PAGE), hs.integers(0, 3 * PAGE + 7), hs.booleans())
def test_plan_matches_byte_model(layout, start, length, write):
    """Policy 10, §4.5, §6.3: plan() equals a model that looks up every byte on its own:
    the pieces cover exactly [va, first faulting byte), each byte lands where its mapping
    says, and a fault after the first byte sits on a page boundary."""
    core = kit.make_node()
    f = kit.open_file(core)
    d = driver_of(f)
    bos: dict[str, AmdgpuBo] = {}
    for kind in ("local", "local2", "npa", "npa_revoked"):
        if kind.startswith("local"):
            h = kit.gem_create(f, 8 * PAGE)
        else:
            h = npa_bo(f, exporter=7, page_offset=0x40 if kind == "npa" else 0x80, pages=8)
            bo_of(f, h).npa_revoked = kind == "npa_revoked"
        bos[kind] = bo_of(f, h)
    vm = d.vm(f)
    for page, pages, off, flags, kind in layout:
        bo_va = vm.prt_va if flags == c.VM_PAGE_PRT else vm.bo_find(bos[kind])
        assert bo_va is not None
        vm.bo_map(bo_va, BASE + page * PAGE, off * PAGE, pages * PAGE, flags)

    need = W if write else R

    def model(byte_va: int) -> tuple[str, int, int] | None:
        for page, pages, off, flags, kind in layout:
            lo = BASE + page * PAGE
            if lo <= byte_va < lo + pages * PAGE:
                if flags == c.VM_PAGE_PRT or not flags & need or kind == "npa_revoked":
                    return None
                boff = off * PAGE + byte_va - lo
                if kind == "npa":
                    return ("npa", 7, ((7 << 29) | 0x40) * PAGE + boff)
                return ("local", id(bos[kind]), boff)
        return None

    va = BASE + start
    expected, fault = [], None
    for b in range(va, va + length):
        t = model(b)
        if t is None:
            fault = b
            break
        expected.append(t)

    pieces, fault_at = vm.plan(va, length, write)
    got = []
    for p in pieces:
        for i in range(p.length):
            if isinstance(p, LocalPiece):
                got.append(("local", id(p.bo), p.bo_offset + i))
            else:
                got.append(("npa", p.exporter_accel, p.npa_byte_address + i))
    assert fault_at == fault
    assert got == expected
    assert all(p.length > 0 for p in pieces)
    if fault is not None and fault != va:
        assert fault % PAGE == 0


@settings(max_examples=60, deadline=None)
@given(hs.lists(hs.tuples(hs.sampled_from([c.VA_OP_MAP, c.VA_OP_REPLACE, c.VA_OP_CLEAR,
                                           c.VA_OP_UNMAP]),
                          hs.integers(0, 15), hs.integers(1, 6), hs.integers(0, 2)),
                max_size=25))
def test_random_gem_va_sequences_keep_invariants(ops):
    """§2.6: after any sequence of GEM_VA calls mappings never overlap, every mapping is in
    its bo_va's set and vice versa, and every mapping fits its BO."""
    core = kit.make_node()
    f = kit.open_file(core)
    handles = [kit.gem_create(f, 8 * PAGE) for _ in range(3)]
    for op, page, pages, which in ops:
        va_raw(f, handles[which], op=op, va=BASE + page * PAGE, size=pages * PAGE,
               offset=(page % 3) * PAGE)
    vm = vm_of(f)
    ms = vm.mappings()
    for a, b in itertools.pairwise(ms):
        assert a.end <= b.start
    in_sets = {id(m) for h in handles for m in vm.bo_find(bo_of(f, h)).mappings}  # type: ignore
    assert in_sets == {id(m) for m in ms}
    for m in ms:
        assert m.bo is not None and m.offset + (m.end - m.start) <= m.bo.size


def test_gem_va_struct_is_what_the_table_says():
    """§2.2: GEM_VA nr 0x48 is IOW 64 bytes and now emulated."""
    from ualinkd.abi import ioctls as tbl

    spec = tbl.AMDGPU_IOCTLS[0x48]
    assert spec.emulated and spec.cmd == 0x40406448
    assert st.GEM_VA.size == 64 and struct.calcsize("<IIIIQQQQIIQ") == 64
    assert kit.device(kit.make_node()).driver.ioctls[tbl.AMDGPU_GEM_VA]
