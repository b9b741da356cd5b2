"""DRM_IOCTL_AMDGPU_BO_LIST (ualinkd/amdgpu/cs.py) as amdgpu_bo_list_ioctl answers it
(amdgpu_bo_list.c: amdgpu_bo_create_list_entry_array, amdgpu_bo_list_create), through a
node's real dispatch, with the caller's memory faked; issue 35 item 3."""

from __future__ import annotations

import errno
import struct

import pytest
from ualink_testkit import CALLER, gem_close, gem_create, open_file, pod_config, run

from ualinkd.abi import constants as c
from ualinkd.abi import ioctls as tbl
from ualinkd.abi import structs as st
from ualinkd.amdgpu.cs import BoLists
from ualinkd.amdgpu.driver import AmdgpuDriver
from ualinkd.drm.device import IoctlResult
from ualinkd.drm.errors import DrmError
from ualinkd.drm.file import DrmFile
from ualinkd.node import NodeCore, NodeServices

BASE, SIZE = 0x10000, 1 << 16


class Mem:
    """The caller's memory: [BASE, BASE+SIZE) mapped, the rest faults."""

    def __init__(self) -> None:
        self.mem = bytearray(SIZE)
        self.reads = 0

    async def read(self, pid: int, address: int, n: int) -> bytes:
        self.reads += 1
        if not (BASE <= address and address + n <= BASE + SIZE):
            raise DrmError(errno.EFAULT, f"bad address {address:#x}")
        return bytes(self.mem[address - BASE: address - BASE + n])

    async def write(self, pid: int, address: int, data: bytes) -> None:
        raise AssertionError("BO_LIST writes nothing to user memory")

    def put(self, data: bytes) -> int:
        """`data` at the next free 8-byte-aligned address past the entry area (BASE+4096)."""
        at = getattr(self, "_next", BASE + 4096)
        self._next = at + -(-max(len(data), 1) // 8) * 8
        self.mem[at - BASE: at - BASE + len(data)] = data
        return at

    def entries(self, *pairs: tuple[int, int], stride: int = 8, at: int = BASE) -> int:
        for i, (h, prio) in enumerate(pairs):
            raw = struct.pack("<II", h, prio)[:stride]
            self.mem[at - BASE + i * stride: at - BASE + i * stride + len(raw)] = raw
        return at


@pytest.fixture
def mem() -> Mem:
    return Mem()


@pytest.fixture
def core(mem: Mem) -> NodeCore:
    return NodeCore(pod_config(), "node0", NodeServices(resolve_fd=lambda pid, fd: fd,
                    copy_to_user=mem.write, copy_from_user=mem.read))


@pytest.fixture
def f(core: NodeCore) -> DrmFile:
    return open_file(core)


def bo_list(f: DrmFile, op: int, handle: int = 0, n: int = 0, size: int = 8,
            ptr: int = 0) -> IoctlResult:
    data = st.BO_LIST_IN.encode(st.AmdgpuBoListIn(op, handle, n, size, ptr))
    r = run(f.device.ioctl(f, tbl.AMDGPU_BO_LIST.cmd, data, CALLER))
    assert isinstance(r, IoctlResult)
    return r


def out_handle(r: IoctlResult) -> int:
    assert r.result == 0, r
    assert r.out[4:] == bytes(20)  # the union is zeroed before out.list_handle
    return int(st.BO_LIST_OUT.unpack(r.out[:8])[0])


def bo_lists(f: DrmFile) -> BoLists:
    drv = f.device.driver
    assert isinstance(drv, AmdgpuDriver)
    return drv.bo_lists


def lists(f: DrmFile) -> int:
    return bo_lists(f).count(f)


def test_create_update_destroy(f: DrmFile, mem: Mem) -> None:
    """CREATE gives the lowest free handle from 1; UPDATE replaces the list's BOs; DESTROY
    answers handle 0, and the handle is free again."""
    a, b = gem_create(f), gem_create(f)
    h1 = out_handle(bo_list(f, c.BO_LIST_OP_CREATE, n=2, ptr=mem.entries((a, 0), (b, 40))))
    h2 = out_handle(bo_list(f, c.BO_LIST_OP_CREATE, n=1, ptr=mem.entries((b, 1))))
    assert (h1, h2) == (1, 2)
    lst = bo_lists(f).get(f, h1)
    assert lst is not None and [e.priority for e in lst.entries] == [0, 32]  # clamped to 32
    assert out_handle(bo_list(f, c.BO_LIST_OP_UPDATE, h1, 1, ptr=mem.entries((b, 3)))) == h1
    new = bo_lists(f).get(f, h1)
    assert new is not None and new is not lst and lst.released
    assert [e.priority for e in new.entries] == [3]
    assert out_handle(bo_list(f, c.BO_LIST_OP_DESTROY, h1)) == 0
    assert new.released and lists(f) == 1
    assert out_handle(bo_list(f, c.BO_LIST_OP_CREATE, n=0)) == 1  # the lowest free again


def test_a_list_keeps_its_bos_alive(core: NodeCore, f: DrmFile, mem: Mem) -> None:
    """amdgpu_bo_list_create takes a reference on each BO: closing the last handle does not
    free a BO a list names; destroying the list does."""
    a = gem_create(f)
    bo = f.lookup(a)
    assert bo is not None
    h = out_handle(bo_list(f, c.BO_LIST_OP_CREATE, n=1, ptr=mem.entries((a, 0))))
    gem_close(f, a)
    assert bo.refcount == 1 and bo.id in f.device.objects
    bo_list(f, c.BO_LIST_OP_DESTROY, h)
    assert bo.refcount == 0 and bo.id not in f.device.objects


def test_the_last_close_puts_every_list(core: NodeCore, f: DrmFile, mem: Mem) -> None:
    a = gem_create(f)
    bo = f.lookup(a)
    assert bo is not None
    bo_list(f, c.BO_LIST_OP_CREATE, n=1, ptr=mem.entries((a, 0)))
    bo_list(f, c.BO_LIST_OP_CREATE, n=1, ptr=mem.entries((a, 0)))
    assert bo.refcount == 3
    core.release_render(f)
    assert bo.refcount == 0 and not f.device.objects


@pytest.mark.parametrize(("stride", "n", "want"), [(4, 2, [0, 0]), (16, 2, [5, 6]),
                                                   (0, 1, None)])
def test_entry_sizes_other_than_8(f: DrmFile, mem: Mem, stride: int, n: int,
                                  want: list[int] | None) -> None:
    """bo_info_size != 8: min(size, 8) bytes of each entry, the rest zero (a 4-byte entry
    has priority 0; size 0 gives handle 0, which no BO has: ENOENT)."""
    a, b = gem_create(f), gem_create(f)
    ptr = mem.entries((a, 5), (b, 6), stride=stride) if stride else BASE
    r = bo_list(f, c.BO_LIST_OP_CREATE, n=n, size=stride, ptr=ptr)
    if want is None:
        assert r.result == -errno.ENOENT
        return
    lst = bo_lists(f).get(f, out_handle(r))
    assert lst is not None
    assert [e.priority for e in lst.entries] == want
    assert [e.bo for e in lst.entries] == [f.lookup(a), f.lookup(b)]


def test_errors(f: DrmFile, mem: Mem) -> None:
    """An unknown handle ENOENT (no list made, no reference kept); a bad array EFAULT before
    the operation is looked at; an unknown operation EINVAL; UPDATE of a handle with no list
    ENOENT; DESTROY of one answers 0; a huge count ENOMEM (kvmalloc's INT_MAX)."""
    a = gem_create(f)
    bo = f.lookup(a)
    assert bo is not None
    ptr = mem.entries((a, 0), (999, 0))
    assert bo_list(f, c.BO_LIST_OP_CREATE, n=2, ptr=ptr).result == -errno.ENOENT
    assert bo.refcount == 1 and lists(f) == 0
    assert bo_list(f, 7, n=1, ptr=0x10).result == -errno.EFAULT
    assert bo_list(f, 7, n=1, ptr=mem.entries((a, 0))).result == -errno.EINVAL
    assert bo_list(f, c.BO_LIST_OP_UPDATE, 5, 1, ptr=mem.entries((a, 0))).result == (
        -errno.ENOENT)
    assert bo.refcount == 1
    assert out_handle(bo_list(f, c.BO_LIST_OP_DESTROY, 5)) == 0
    assert bo_list(f, c.BO_LIST_OP_CREATE, n=0x1000_0000, ptr=BASE).result == -errno.ENOMEM
    assert bo_list(f, c.BO_LIST_OP_CREATE, n=2, size=16, ptr=BASE + SIZE - 20).result == (
        -errno.EFAULT)


def test_lists_are_per_file(core: NodeCore, f: DrmFile, mem: Mem) -> None:
    g = open_file(core)
    a = gem_create(f)
    h = out_handle(bo_list(f, c.BO_LIST_OP_CREATE, n=1, ptr=mem.entries((a, 0))))
    assert core.devices and bo_lists(f).get(g, h) is None
    assert bo_list(g, c.BO_LIST_OP_UPDATE, h, 0).result == -errno.ENOENT
