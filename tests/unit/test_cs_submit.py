"""AMDGPU_CS, WAIT_CS and WAIT_FENCES (ualinkd/amdgpu/cs.py) as amdgpu_cs_ioctl /
amdgpu_cs_wait_ioctl / amdgpu_cs_wait_fences_ioctl answer them, through a node's real
dispatch; SDMA IBs run by sdma.run_ib through a runner that stands for the node's engine edge
(a fake GPU VM, tests/unit/sdma_fakes.py). Issue 35 items 1-2."""

from __future__ import annotations

import errno
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs
from sdma_fakes import FakeVm, copy_linear, drive, fence, words
from test_cs_bo_list import Mem
from ualink_testkit import CALLER, gem_create, open_file, pod_config, run

from ualinkd.abi import constants as c
from ualinkd.abi import ioctls as tbl
from ualinkd.abi import structs as st
from ualinkd.amdgpu.cs import IbRun
from ualinkd.amdgpu.driver import AmdgpuDriver
from ualinkd.amdgpu.engine import EngineRun, RunEnd
from ualinkd.amdgpu.profile import HW_IP_COMPUTE, HW_IP_DMA, HW_IP_GFX
from ualinkd.drm.device import IoctlResult
from ualinkd.drm.file import DrmFile
from ualinkd.node import NodeCore, NodeServices

SRC, DST, IBS = 0x7000_0000, 0x7100_0000, 0x7200_0000
ETIME = errno.ETIME


class Runner:
    """The engine edge's part: an engine run to its end in the submitting file's VM."""

    def __init__(self) -> None:
        self.vm = FakeVm()
        self.vm.map(SRC, 1 << 16)
        self.vm.map(DST, 1 << 16)
        self.vm.map(IBS, 1 << 16)
        self.files: list[DrmFile] = []
        self.ibs: list[IbRun] = []
        self.ib_at = IBS

    async def __call__(self, file: DrmFile, gen: EngineRun, ib: IbRun) -> RunEnd:
        self.files.append(file)
        self.ibs.append(ib)
        return drive(gen, self.vm)[0]

    def ib(self, *packets: list[int]) -> tuple[int, int]:
        data = words(*packets)
        va = self.ib_at
        self.vm.write(va, data)
        self.ib_at += -(-len(data) // 256) * 256
        return va, len(data)


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


@pytest.fixture
def runner(f: DrmFile) -> Runner:
    r = Runner()
    driver(f).cs.runner = r
    return r


def driver(f: DrmFile) -> AmdgpuDriver:
    drv = f.device.driver
    assert isinstance(drv, AmdgpuDriver)
    return drv


def ioctl(f: DrmFile, spec: tbl.IoctlSpec, data: bytes) -> IoctlResult:
    r = run(f.device.ioctl(f, spec.cmd, data, CALLER))
    assert isinstance(r, IoctlResult)
    return r


def ctx_op(f: DrmFile, op: int, ctx_id: int = 0) -> IoctlResult:
    return ioctl(f, tbl.AMDGPU_CTX, st.CTX_IN.encode(st.AmdgpuCtxIn(op, 0, ctx_id, 0)))


def ctx_alloc(f: DrmFile) -> int:
    r = ctx_op(f, c.CTX_OP_ALLOC_CTX)
    assert r.result == 0
    return int.from_bytes(r.out[:4], "little")


def ib_chunk(va: int, size: int, ip: int = HW_IP_DMA, ring: int = 0,
             instance: int = 0) -> tuple[int, bytes]:
    return c.CHUNK_ID_IB, st.CS_CHUNK_IB.encode(st.AmdgpuCsChunkIb(0, 0, va, size, ip,
                                                                   instance, ring))


def cs(f: DrmFile, mem: Mem, ctx: int, *chunks: tuple[int, bytes],
       bo_list: int = 0) -> IoctlResult:
    ptrs = [mem.put(struct.pack("<IIQ", cid, len(data) // 4, mem.put(data)))
            for cid, data in chunks]
    array = mem.put(struct.pack(f"<{len(ptrs)}Q", *ptrs))
    return ioctl(f, tbl.AMDGPU_CS, st.CS_IN.encode(st.AmdgpuCsIn(ctx, bo_list, len(ptrs), 0,
                                                                 array)))


def seq(r: IoctlResult) -> int:
    assert r.result == 0, r
    assert r.out[8:] == bytes(16)
    return int(st.CS_OUT.unpack(r.out[:8])[0])


def wait_cs(f: DrmFile, ctx: int, handle: int, ip: int = HW_IP_DMA,
            ring: int = 0) -> IoctlResult:
    return ioctl(f, tbl.AMDGPU_WAIT_CS, st.WAIT_CS_IN.encode(
        st.AmdgpuWaitCsIn(handle, 0, ip, 0, ring, ctx)))


def wait_fences(f: DrmFile, mem: Mem, fences: list[tuple[int, int]], wait_all: bool,
                ring: int = 0) -> IoctlResult:
    raw = b"".join(st.AMDGPU_FENCE.encode(st.AmdgpuFence(ctx, HW_IP_DMA, 0, ring, s))
                   for ctx, s in fences)
    return ioctl(f, tbl.AMDGPU_WAIT_FENCES, st.WAIT_FENCES_IN.encode(st.AmdgpuWaitFencesIn(
        mem.put(raw) if raw else 0, len(fences), int(wait_all), 0)))


def test_sdma_ib_runs_and_its_fence_is_waited(f: DrmFile, mem: Mem, runner: Runner) -> None:
    """An SDMA IB (COPY_LINEAR) runs in the submitting file's VM before CS answers;
    out.handle is the entity's sequence from 1; WAIT_CS of it answers status 0 (signaled),
    of a sequence not yet given EINVAL; WAIT_FENCES all / any answer status 1."""
    ctx = ctx_alloc(f)
    runner.vm.write(SRC, b"sdma!" * 100)
    assert seq(cs(f, mem, ctx, ib_chunk(*runner.ib(copy_linear(DST, SRC, 500))))) == 1
    assert runner.vm.read(DST, 500) == b"sdma!" * 100 and runner.files == [f]
    assert seq(cs(f, mem, ctx, ib_chunk(*runner.ib(fence(DST + 1024, 7)),
                                         ring=1))) == 1  # ring 1: its own entity
    assert seq(cs(f, mem, ctx, ib_chunk(*runner.ib(fence(DST + 1024, 8))))) == 2
    assert runner.vm.u32(DST + 1024) == 8
    r = wait_cs(f, ctx, 2)
    assert r.result == 0 and r.out == bytes(32)  # out.status 0: signaled
    assert wait_cs(f, ctx, 3).result == -errno.EINVAL
    assert wait_cs(f, ctx, 2, ip=HW_IP_DMA, ring=2).result == -errno.EINVAL
    assert wait_cs(f, ctx + 1, 1).result == -errno.EINVAL
    r = wait_fences(f, mem, [(ctx, 1), (ctx, 2)], True)
    assert r.result == 0 and st.WAIT_FENCES_OUT.unpack(r.out[:8]) == (1, 0)
    r = wait_fences(f, mem, [(ctx, 2), (ctx, 0)], False)
    assert r.result == 0 and st.WAIT_FENCES_OUT.unpack(r.out[:8]) == (1, 1)
    assert wait_fences(f, mem, [(ctx, 9)], True).result == -errno.EINVAL
    assert wait_fences(f, mem, [], False).result == -errno.EINVAL
    assert driver(f).cs.submissions == 3


@pytest.mark.parametrize(("chunk", "err"), [
    (ib_chunk(IBS, 16, ip=HW_IP_GFX), errno.EINVAL),  # no GFX ring on this part
    (ib_chunk(IBS, 16, ip=HW_IP_COMPUTE), errno.EINVAL),  # no PM4 engine here
    (ib_chunk(IBS, 16, ip=10), errno.EINVAL),
    (ib_chunk(IBS, 16, ring=2), errno.EINVAL),
    (ib_chunk(IBS, 16, instance=1), errno.EINVAL),
    ((c.CHUNK_ID_IB, bytes(28)), errno.EINVAL),  # shorter than drm_amdgpu_cs_chunk_ib
    ((0x42, bytes(8)), errno.EINVAL),  # unknown chunk id
    ((c.CHUNK_ID_SYNCOBJ_IN, bytes(4)), errno.EINVAL),  # no IB at all
])
def test_pass1_errors(f: DrmFile, mem: Mem, runner: Runner, chunk: tuple[int, bytes],
                      err: int) -> None:
    ctx = ctx_alloc(f)
    assert cs(f, mem, ctx, chunk).result == -err
    assert not runner.files


def test_parser_init_and_copy_errors(f: DrmFile, mem: Mem, runner: Runner) -> None:
    """No chunks EINVAL; an unknown context EINVAL; a bad chunk array EFAULT; 50 IBs for one
    SDMA ring EINVAL (49 pass); without an engine edge (no runner) an SDMA IB has no
    scheduler: EINVAL."""
    ctx = ctx_alloc(f)
    assert cs(f, mem, ctx).result == -errno.EINVAL
    assert cs(f, mem, ctx + 5, ib_chunk(IBS, 16)).result == -errno.EINVAL
    bad = st.CS_IN.encode(st.AmdgpuCsIn(ctx, 0, 1, 0, 0x10))
    assert ioctl(f, tbl.AMDGPU_CS, bad).result == -errno.EFAULT
    one = ib_chunk(*runner.ib(fence(DST, 1)))
    assert cs(f, mem, ctx, *[one] * 50).result == -errno.EINVAL  # amdgpu_ring_max_ibs: 49
    assert seq(cs(f, mem, ctx, *[one] * 49)) == 1
    driver(f).cs.runner = None
    assert cs(f, mem, ctx, one).result == -errno.EINVAL


def test_bo_lists_of_a_submission(f: DrmFile, mem: Mem, runner: Runner) -> None:
    """BO_HANDLES makes the job's list (its BOs referenced while it runs, released after);
    a second one EINVAL; an unknown BO ENOENT; bo_list_handle unknown ENOENT, or together
    with BO_HANDLES EINVAL."""
    ctx = ctx_alloc(f)
    a = gem_create(f)
    bo = f.lookup(a)
    assert bo is not None
    handles = (c.CHUNK_ID_BO_HANDLES, st.BO_LIST_IN.encode(st.AmdgpuBoListIn(
        0, 0, 1, 8, mem.put(struct.pack("<II", a, 0)))))
    ib = ib_chunk(*runner.ib(fence(DST, 1)))
    assert seq(cs(f, mem, ctx, handles, ib)) == 1 and bo.refcount == 1
    assert cs(f, mem, ctx, handles, handles, ib).result == -errno.EINVAL
    missing = (c.CHUNK_ID_BO_HANDLES, st.BO_LIST_IN.encode(st.AmdgpuBoListIn(
        0, 0, 1, 8, mem.put(struct.pack("<II", 99, 0)))))
    assert cs(f, mem, ctx, missing, ib).result == -errno.ENOENT
    assert cs(f, mem, ctx, ib, bo_list=3).result == -errno.ENOENT
    assert cs(f, mem, ctx, handles, ib, bo_list=1).result == -errno.EINVAL
    assert bo.refcount == 1


def test_dependencies_and_syncobjs(f: DrmFile, mem: Mem, runner: Runner) -> None:
    """A dependency on a submitted fence passes, on one not yet submitted EINVAL, on an
    unknown context EINVAL; SYNCOBJ_IN: unknown ENOENT, without a fence EINVAL;
    SYNCOBJ_OUT: unknown EINVAL, a second out chunk EINVAL, and after CS the syncobj holds a
    signaled fence; TIMELINE_SIGNAL adds its point."""
    ctx = ctx_alloc(f)
    ib = ib_chunk(*runner.ib(fence(DST, 1)))
    seq(cs(f, mem, ctx, ib))

    def dep(s: int, ctx_id: int = ctx) -> tuple[int, bytes]:
        return c.CHUNK_ID_DEPENDENCIES, st.CS_CHUNK_DEP.encode(
            st.AmdgpuCsChunkDep(HW_IP_DMA, 0, 0, ctx_id, s))

    assert seq(cs(f, mem, ctx, dep(1), ib)) == 2
    assert cs(f, mem, ctx, dep(3), ib).result == -errno.EINVAL
    assert cs(f, mem, ctx, dep(1, ctx + 1), ib).result == -errno.EINVAL
    sync = f.syncobjs
    empty, signaled = sync.create(False), sync.create(True)

    def sem(cid: int, h: int) -> tuple[int, bytes]:
        return cid, struct.pack("<I", h)

    assert cs(f, mem, ctx, sem(c.CHUNK_ID_SYNCOBJ_IN, 77), ib).result == -errno.ENOENT
    assert cs(f, mem, ctx, sem(c.CHUNK_ID_SYNCOBJ_IN, empty), ib).result == -errno.EINVAL
    assert cs(f, mem, ctx, sem(c.CHUNK_ID_SYNCOBJ_OUT, 77), ib).result == -errno.EINVAL
    out = sem(c.CHUNK_ID_SYNCOBJ_OUT, empty)
    assert cs(f, mem, ctx, out, out, ib).result == -errno.EINVAL
    assert seq(cs(f, mem, ctx, sem(c.CHUNK_ID_SYNCOBJ_IN, signaled), out, ib)) == 3
    obj = sync.find(empty)
    assert obj is not None and obj.fence is not None
    tl = sync.create(False)
    point = (c.CHUNK_ID_SYNCOBJ_TIMELINE_SIGNAL, st.CS_CHUNK_SYNCOBJ.encode(
        st.AmdgpuCsChunkSyncobj(tl, 0, 5)))
    assert seq(cs(f, mem, ctx, point, ib)) == 4
    tobj = sync.find(tl)
    assert tobj is not None and tobj.query() == 5
    wait = (c.CHUNK_ID_SYNCOBJ_TIMELINE_WAIT, st.CS_CHUNK_SYNCOBJ.encode(
        st.AmdgpuCsChunkSyncobj(tl, 0, 5)))
    assert seq(cs(f, mem, ctx, wait, ib)) == 5


def test_user_fence_gets_the_sequence(f: DrmFile, mem: Mem, runner: Runner) -> None:
    """The FENCE chunk's BO (one page) gets the job's sequence at its offset; a BO that is
    not one page, or an offset past it, EINVAL."""
    ctx = ctx_alloc(f)
    h, big = gem_create(f, 4096, c.DOMAIN_GTT), gem_create(f, 8192, c.DOMAIN_GTT)
    ib = ib_chunk(*runner.ib(fence(DST, 1)))

    def uf(handle: int, offset: int) -> tuple[int, bytes]:
        return c.CHUNK_ID_FENCE, st.CS_CHUNK_FENCE.encode(st.AmdgpuCsChunkFence(handle, offset))

    seq(cs(f, mem, ctx, ib))
    assert seq(cs(f, mem, ctx, uf(h, 16), ib)) == 2
    bo = f.lookup(h)
    assert bo is not None and bo.memory.read(16, 8) == struct.pack("<Q", 2)  # type: ignore[attr-defined]
    assert bo.refcount == 1  # the job's reference went with it
    assert cs(f, mem, ctx, uf(big, 0), ib).result == -errno.EINVAL
    assert cs(f, mem, ctx, uf(h, 4092), ib).result == -errno.EINVAL
    assert cs(f, mem, ctx, uf(999, 0), ib).result == -errno.EINVAL


def test_a_faulting_ib_makes_its_context_guilty(f: DrmFile, mem: Mem, runner: Runner) -> None:
    """An IB the engine stops on (a copy from an unmapped VA): CS still answers its sequence;
    the fence carries -ETIME (WAIT_CS and WAIT_FENCES answer it), the context is guilty (its
    next CS ECANCELED, QUERY_STATE2 flags GUILTY), another context goes on; a freed and
    re-made context starts clean."""
    ctx, other = ctx_alloc(f), ctx_alloc(f)
    assert seq(cs(f, mem, ctx, ib_chunk(*runner.ib(copy_linear(DST, 0xDEAD000, 64))))) == 1
    assert wait_cs(f, ctx, 1).result == -ETIME
    assert wait_fences(f, mem, [(ctx, 1)], True).result == -ETIME
    r = wait_fences(f, mem, [(ctx, 1)], False)
    assert r.result == -ETIME and st.WAIT_FENCES_OUT.unpack(r.out[:8]) == (1, 0)
    ok = ib_chunk(*runner.ib(fence(DST, 5)))
    assert cs(f, mem, ctx, ok).result == -errno.ECANCELED
    r = ctx_op(f, c.CTX_OP_QUERY_STATE2, ctx)
    assert r.result == 0 and int.from_bytes(r.out[:8], "little") == 1 << 2  # GUILTY
    assert int.from_bytes(ctx_op(f, c.CTX_OP_QUERY_STATE2, other).out[:8], "little") == 0
    assert seq(cs(f, mem, other, ok)) == 1 and runner.vm.u32(DST) == 5
    assert ctx_op(f, c.CTX_OP_FREE_CTX, ctx).result == 0
    again = ctx_alloc(f)
    assert again == ctx and seq(cs(f, mem, again, ok)) == 1


def test_fence_to_handle(f: DrmFile, mem: Mem, runner: Runner) -> None:
    """amdgpu_cs_fence_to_handle_ioctl: a submitted fence as a new syncobj (its handle, a
    signaled fence in it), as a syncobj file or a sync file (a dma-buf token each); a
    sequence not yet given, an unknown context or an unknown `what` EINVAL; only out.handle
    (4 bytes) is written."""
    ctx = ctx_alloc(f)
    seq(cs(f, mem, ctx, ib_chunk(*runner.ib(fence(DST, 1)))))

    def to_handle(what: int, s: int = 1, ctx_id: int = ctx) -> IoctlResult:
        data = st.AMDGPU_FENCE.encode(st.AmdgpuFence(ctx_id, HW_IP_DMA, 0, 0, s))
        return ioctl(f, tbl.AMDGPU_FENCE_TO_HANDLE,
                     data + st.FENCE_TO_HANDLE_WHAT.pack(what, 0))

    r = to_handle(c.FENCE_TO_HANDLE_GET_SYNCOBJ)
    assert r.result == 0 and r.out[4:24] == r.kdata[4:24]
    obj = f.syncobjs.find(int.from_bytes(r.out[:4], "little"))
    assert obj is not None and obj.fence is not None
    tokens = [int.from_bytes(to_handle(w).out[:4], "little")
              for w in (c.FENCE_TO_HANDLE_GET_SYNCOBJ_FD, c.FENCE_TO_HANDLE_GET_SYNC_FILE_FD)]
    assert all(t > 0 for t in tokens) and tokens[0] != tokens[1]
    assert to_handle(3).result == -errno.EINVAL
    assert to_handle(c.FENCE_TO_HANDLE_GET_SYNCOBJ, s=2).result == -errno.EINVAL
    assert to_handle(c.FENCE_TO_HANDLE_GET_SYNCOBJ, ctx_id=ctx + 1).result == -errno.EINVAL


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chunks=hs.lists(hs.tuples(hs.sampled_from([*c.CHUNK_IDS, 0, 0x42]),
                                 hs.binary(max_size=64)), min_size=1, max_size=5),
       bo_list=hs.integers(0, 3), ctx_delta=hs.integers(0, 1))
def test_random_chunks_answer_an_errno_or_a_sequence(f: DrmFile, mem: Mem, runner: Runner,
                                                      chunks: list[tuple[int, bytes]],
                                                      bo_list: int, ctx_delta: int) -> None:
    """Any chunk ids and bytes: CS answers 0 with a sequence or one of the kernel's errnos,
    never another exception, and holds no BO reference afterwards."""
    ctx = ctx_alloc(f) + ctx_delta
    a = gem_create(f, 4096, c.DOMAIN_GTT)
    bo = f.lookup(a)
    assert bo is not None
    r = cs(f, mem, ctx, *[(cid, data[: len(data) // 4 * 4]) for cid, data in chunks],
           bo_list=bo_list)
    assert r.result in (0, -errno.EINVAL, -errno.ENOENT, -errno.EFAULT, -errno.ENOMEM,
                        -errno.ECANCELED)
    assert bo.refcount == 1
