"""AMDGPU_GEM_USERPTR: BOs over a process's own memory, and the userptr rules of spec §1.6 E2
(not UALink-exportable), §2.5 (PRIME: EPERM), §2.7 (GEM_MMAP: EPERM) and §2.8 (SET_PLACEMENT:
EPERM). The process's memory is a fake here: a bytearray at a base address, reached through
the device's copy_from_user / copy_to_user as the daemon's /proc/<pid>/mem functions are."""

from __future__ import annotations

import errno
import struct

import pytest
from ualink_testkit import (
    CALLER,
    GEM_CLOSE,
    GEM_MMAP,
    GEM_OP,
    GEM_VA,
    ioctl,
    lazy_spawn,
    open_file,
    pod_config,
    prime_to_fd_raw,
    run,
    ualink_export_raw,
)

from ualinkd.abi import constants as c
from ualinkd.abi import structs as st
from ualinkd.abi.ioc import ioc
from ualinkd.amdgpu.access import gpu_load, gpu_store
from ualinkd.drm.errors import DrmError
from ualinkd.node import NodeCore, NodeServices

GEM_USERPTR = ioc(3, 0x64, 0x51, 24)
BASE, PAGES = 0x7F0000000000, 4
PAGE = 4096
RO, REG, VALIDATE = c.USERPTR_READONLY, c.USERPTR_REGISTER, c.USERPTR_VALIDATE


class FakeProcess:
    """One process's address space (drm.device.ProcessMemory): pages [BASE, BASE + PAGES
    pages) mapped, the last one read-only; anything else faults."""

    def __init__(self) -> None:
        self.mem = bytearray(bytes(range(256)) * (PAGES * PAGE // 256))
        self.opened: list[int] = []  # thread ids it was opened for
        self.closed = 0

    def extent(self, address: int, size: int, write: bool) -> int:
        off = address - BASE
        top = (PAGES - 1) * PAGE if write else len(self.mem)  # the last page: read-only
        if off < 0 or off >= top:
            return 0
        return min(size, top - off)

    # The awaitables of drm.device.ProcessMemory (the daemon's go through worker threads).
    async def accessible(self, address: int, size: int, write: bool) -> int:
        return self.extent(address, size, write)

    async def read(self, address: int, n: int) -> bytes:
        n = self.extent(address, n, write=False)
        return bytes(self.mem[address - BASE:address - BASE + n])

    async def write(self, address: int, data: bytes) -> int:
        n = self.extent(address, len(data), write=True)
        self.mem[address - BASE:address - BASE + n] = data[:n]
        return n

    def close(self) -> None:
        self.closed += 1


@pytest.fixture
def proc() -> FakeProcess:
    return FakeProcess()


@pytest.fixture
def f(proc):
    def open_process_memory(tid: int) -> FakeProcess:
        proc.opened.append(tid)
        return proc

    core = NodeCore(pod_config(), "node0", NodeServices(
        resolve_fd=lambda pid, fd: fd, open_process_memory=open_process_memory))
    return open_file(core)


def userptr_raw(f, addr: int = BASE, size: int = PAGES * PAGE, flags: int = RO | VALIDATE):
    return run(ioctl(f, GEM_USERPTR, st.GEM_USERPTR.encode(st.GemUserptr(addr, size, flags, 0))))


def userptr(f, **kw) -> int:
    r = userptr_raw(f, **kw)
    assert r.result == 0, r
    return st.GEM_USERPTR.decode(r.out).handle


@pytest.mark.parametrize(("addr", "size", "flags", "err"), [
    (BASE + 8, PAGE, RO, errno.EINVAL),  # address not page aligned
    (BASE, PAGE + 1, RO, errno.EINVAL),  # size not page aligned
    (BASE, PAGE, RO | 1 << 4, errno.EINVAL),  # unknown flag
    (BASE, PAGE, 0, errno.EACCES),  # writable without REGISTER (no MMU notifier)
    (BASE, PAGE, c.USERPTR_ANONONLY | VALIDATE, errno.EACCES),
    (BASE, 0, RO, errno.EINVAL),  # nothing to map
    (BASE + PAGES * PAGE - PAGE, 2 * PAGE, RO | VALIDATE, errno.EFAULT),  # a page not mapped
    (BASE, PAGES * PAGE, REG | VALIDATE, errno.EFAULT),  # writable over a read-only page
])
def test_userptr_refusals_echo_the_input(f, addr, size, flags, err):
    """amdgpu_gem_userptr_ioctl's checks in order; on failure the struct is copied back
    unchanged (§2.1)."""
    r = userptr_raw(f, addr, size, flags)
    assert r.result == -err
    assert r.out == st.GEM_USERPTR.encode(st.GemUserptr(addr, size, flags, 0))


def test_userptr_success_writes_only_the_handle(f):
    """Writable with REGISTER, or READONLY: a handle at offset 20, the rest as sent; without
    VALIDATE nothing is faulted in, so unmapped memory is accepted until the GPU touches it."""
    r = userptr_raw(f, flags=REG)
    h = st.GEM_USERPTR.decode(r.out).handle
    assert r.result == 0 and h != 0
    assert r.out[:20] == st.GEM_USERPTR.encode(st.GemUserptr(BASE, PAGES * PAGE, REG, 0))[:20]
    assert userptr(f, addr=0x1000, size=PAGE, flags=RO) != h


def test_userptr_bo_rules(f):
    """§1.6 E2 (preferred domain GTT: EOPNOTSUPP), §2.5 PRIME_HANDLE_TO_FD → EPERM, §2.7
    GEM_MMAP → EPERM with the union zeroed, §2.8 SET_PLACEMENT → EPERM (even to VRAM, so it
    never becomes exportable); GET_GEM_CREATE_INFO shows GTT and no flags."""
    h = userptr(f)
    assert ualink_export_raw(f, h).result == -errno.EOPNOTSUPP
    assert prime_to_fd_raw(f, h).result == -errno.EPERM
    r = ioctl(f, GEM_MMAP, struct.pack("<II", h, 0))
    assert (r.result, r.out) == (-errno.EPERM, bytes(8))
    for value in (c.DOMAIN_VRAM, c.DOMAIN_GTT):
        r = ioctl(f, GEM_OP, st.GEM_OP.encode(st.GemOp(h, c.GEM_OP_SET_PLACEMENT, value, 0, 0)))
        assert r.result == -errno.EPERM
    assert ualink_export_raw(f, h).result == -errno.EOPNOTSUPP
    bo = f.handles[h]
    assert (bo.preferred_domains, bo.allowed_domains, bo.flags) == (c.DOMAIN_GTT,
                                                                    c.DOMAIN_GTT, 0)


def remote(*a):
    """The RemoteFn of a VM with local pieces only."""
    raise AssertionError("no remote pieces here")


def _map(f, h: int, va: int, flags: int, size: int = PAGES * PAGE) -> None:
    args = st.GemVa(h, 0, c.VA_OP_MAP, flags, va, 0, size, 0, 0, 0, 0)
    assert ioctl(f, GEM_VA, st.GEM_VA.encode(args)).result == 0


def test_gpu_loads_and_stores_reach_the_process_memory(f, proc):
    """A mapped userptr BO: GPU loads read the process's bytes, stores change them (the
    process memory opened for the calling thread, closed with the BO); a store to a page the
    process has read-only faults, as does any store through a READONLY BO."""
    h = userptr(f, flags=REG)
    va = 0x100000
    _map(f, h, va, c.VM_PAGE_READABLE | c.VM_PAGE_WRITEABLE)
    vm = f.device.driver.vm(f)
    faults: list[int] = []

    got = run(gpu_load(vm, va + 5, 300, remote, lambda: faults.append(1), lazy_spawn))
    assert got == bytes(proc.mem[5:305])
    assert run(gpu_store(vm, va + PAGE, b"written by the GPU", remote, lambda: None,
                         lazy_spawn)) == 18
    assert proc.mem[PAGE:PAGE + 18] == b"written by the GPU"
    assert proc.opened == [CALLER.pid]
    with pytest.raises(DrmError):  # the process's last page is read-only
        run(gpu_store(vm, va + (PAGES - 1) * PAGE, b"x", remote, lambda: None, lazy_spawn))
    ro = userptr(f, flags=RO)
    _map(f, ro, 0x200000, c.VM_PAGE_READABLE | c.VM_PAGE_WRITEABLE)
    with pytest.raises(DrmError) as e:
        run(gpu_store(vm, 0x200000, b"x", remote, lambda: faults.append(1), lazy_spawn))
    assert e.value.errno == errno.EFAULT and faults == [1]
    assert run(gpu_load(vm, 0x200000, 4, remote, lambda: None, lazy_spawn)) == bytes(proc.mem[:4])
    for handle in (h, ro):
        assert ioctl(f, GEM_CLOSE, struct.pack("<II", handle, 0)).result == 0
    assert proc.closed == 2


def test_userptr_faults_give_short_counts(f, proc):
    """Policy 10: a GPU access that runs into a page the process does not have (or, for a
    store, has read-only) returns what came before it, and counts one GPU fault."""
    vm = f.device.driver.vm(f)
    faults: list[int] = []

    edge = BASE + (PAGES - 1) * PAGE  # the last mapped page; the next one is not mapped
    h = userptr(f, addr=edge, size=2 * PAGE, flags=RO)  # no VALIDATE: accepted as is
    _map(f, h, 0x100000, c.VM_PAGE_READABLE, size=2 * PAGE)
    got = run(gpu_load(vm, 0x100000 + 100, 2 * PAGE - 100, remote, lambda: faults.append(1),
                       lazy_spawn))
    assert got == bytes(proc.mem[-PAGE + 100:]) and faults == [1]
    w = userptr(f, flags=REG)  # the last page is read-only in the process
    _map(f, w, 0x200000, c.VM_PAGE_READABLE | c.VM_PAGE_WRITEABLE)
    at = 0x200000 + (PAGES - 2) * PAGE
    assert run(gpu_store(vm, at, b"y" * 2 * PAGE, remote, lambda: faults.append(2),
                         lazy_spawn)) == PAGE
    assert proc.mem[(PAGES - 2) * PAGE:(PAGES - 1) * PAGE] == b"y" * PAGE
    assert faults == [1, 2]
