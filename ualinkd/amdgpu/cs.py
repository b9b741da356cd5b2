"""Command submission on the render node (issue 35): DRM_IOCTL_AMDGPU_BO_LIST
(amdgpu_bo_list.c), AMDGPU_CS (amdgpu_cs.c), AMDGPU_WAIT_CS and AMDGPU_WAIT_FENCES.

BO lists. A list holds a reference on each of its BOs (amdgpu_bo_ref in
amdgpu_bo_list_create), so a BO whose last handle is closed stays alive while a list names
it; the list's references go when it is destroyed or replaced, and every list of a file
goes at its last close (amdgpu_driver_postclose_kms).

Submissions. CS makes the kernel's checks in its order (amdgpu_cs_parser_init, pass 1 over
the chunks as they are copied in, pass 2 over dependencies and syncobjs, the BO list), then
runs the job's IBs: SDMA IBs (AMDGPU_HW_IP_DMA) through amdgpu/sdma.py's `run_ib` in the
submitting file's GPU VM, by the injected `runner` (the node's engine edge). An IP with no
engine here (GFX, COMPUTE PM4, video), or DMA on a node with no runner, has no scheduler:
EINVAL, as amdgpu_cs_p1_ib answers a ring without a run queue. The job runs before the
ioctl answers, so its fence is signaled when CS returns, as the DRM layer here assumes of
every fence (drm/syncobj.py): WAIT_CS and WAIT_FENCES never wait, SYNCOBJ_OUT gets a
signaled fence. A job the engine stops (illegal packet, GPU fault, a poll past the job
timeout) is what hangs a real SDMA engine until the scheduler's job timeout: its fence
carries -ETIME and its context is guilty (later CS on it ECANCELED, QUERY_STATE2 says
GUILTY); other contexts go on.
"""

from __future__ import annotations

import errno
import logging
import struct
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..abi import constants as c
from ..abi import ioctls as tbl
from ..abi import structs as st
from ..drm.errors import DrmError
from ..drm.idr import HandleIdr
from ..drm.syncobj import STUB, DrmSyncobj, SyncFile, SyncobjFile
from .bo import AmdgpuBo
from .engine import EngineRun, Executed, Request, RunEnd
from .profile import HW_IP_DMA
from .sdma import run_ib

if TYPE_CHECKING:
    from ..drm.device import Caller, DrmDevice
    from ..drm.file import DrmFile
    from .driver import AmdgpuDriver

__all__ = ["AMDGPU_BO_LIST_MAX_PRIORITY", "BoList", "BoLists", "CommandSubmission",
           "EngineRunner", "IbRun"]

log = logging.getLogger(__name__)



@dataclass(frozen=True, slots=True)
class IbRun:
    """Which IB an engine run is (for the engine edge's trace records): the submitting
    process, its context, the sequence number the submission takes, the IB's index in the
    job, VA and size in bytes."""

    pid: int
    ctx_id: int
    seq: int
    index: int
    va: int
    size: int


# Runs an engine generator to its end in a render file's GPU VM (the node's engine edge).
EngineRunner = Callable[["DrmFile", EngineRun, IbRun], Awaitable[RunEnd]]

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
        info = await self.entries(caller, args)  # 1
        fl = self._files.get(file)
        if fl is None:
            fl = self._files[file] = _FileLists()
        handle = args.list_handle
        if args.operation == c.BO_LIST_OP_CREATE:  # 2
            lst = self.create(file, info)
            handle = fl.idr.alloc()
            fl.lists[handle] = lst
        elif args.operation == c.BO_LIST_OP_DESTROY:  # 3
            old = fl.lists.pop(handle, None)
            if old is not None:
                fl.idr.remove(handle)
                old.release()
            handle = 0
        elif args.operation == c.BO_LIST_OP_UPDATE:  # 4
            lst = self.create(file, info)
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

    async def entries(self, caller: Caller,
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

    def create(self, file: DrmFile, info: list[st.AmdgpuBoListEntry]) -> BoList:
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


# -- AMDGPU_CS, WAIT_CS, WAIT_FENCES ----------------------------------------------------------
AMDGPU_HW_IP_NUM = 10
# amdgpu_ctx_num_entities: the rings a context may name per IP (GFX, COMPUTE, DMA, UVD, VCE,
# UVD_ENC, VCN_DEC, VCN_ENC, VCN_JPEG, VPE)
AMDGPU_CTX_NUM_ENTITIES = (1, 4, 2, 1, 1, 1, 1, 1, 1, 1)
AMDGPU_SCHED_JOBS = 32  # amdgpu.sched_jobs: fences kept per entity; older ones are signaled
AMDGPU_CS_GANG_SIZE = 4
AMDGPU_RING_MAX_IBS = 49  # amdgpu_ring_max_ibs for an SDMA ring (the default case)
_PAGE = 4096


@dataclass(slots=True)
class _Entity:
    """A context's scheduler entity for one (IP, ring): its next sequence number and the
    errors of its last AMDGPU_SCHED_JOBS fences (a fence not listed had none)."""

    sequence: int = 1
    errors: dict[int, int] = field(default_factory=dict)

    def fence(self, seq: int) -> int | None:
        """amdgpu_ctx_get_fence: EINVAL for a sequence not yet given; None for one old
        enough to be signaled and forgotten; else its error (0: none)."""
        if seq == (1 << 64) - 1:
            seq = self.sequence - 1
        if seq >= self.sequence:
            raise DrmError(errno.EINVAL, f"fence {seq} not submitted yet")
        if seq + AMDGPU_SCHED_JOBS < self.sequence or seq == 0:
            return None
        return self.errors.get(seq, 0)

    def add_fence(self, error: int) -> int:
        seq = self.sequence
        self.sequence += 1
        if error:
            self.errors[seq] = error
        for old in [k for k in self.errors if k + AMDGPU_SCHED_JOBS < self.sequence]:
            del self.errors[old]
        return seq


@dataclass(slots=True)
class _CtxState:
    entities: dict[tuple[int, int], _Entity] = field(default_factory=dict)
    guilty: bool = False
    # What debugfs's amdgpu_cs_contexts shows: submissions that ran, their IBs and packets
    # executed, the last sequence submitted and the last signaled, the last fence error.
    submissions: int = 0
    ibs: int = 0
    packets: int = 0
    submitted: int = 0
    signaled: int = 0
    last_error: int = 0

    def entity(self, ip: int, instance: int, ring: int) -> _Entity:
        """amdgpu_ctx_get_entity: an IP beyond the table, an instance other than 0 or a ring
        beyond amdgpu_ctx_num_entities is EINVAL."""
        if ip >= AMDGPU_HW_IP_NUM:
            raise DrmError(errno.EINVAL, f"unknown HW IP type {ip}")
        if instance != 0:
            raise DrmError(errno.EINVAL, f"invalid ip instance {instance}")
        if ring >= AMDGPU_CTX_NUM_ENTITIES[ip]:
            raise DrmError(errno.EINVAL, f"invalid ring {ip} {ring}")
        ent = self.entities.get((ip, ring))
        if ent is None:
            ent = self.entities[(ip, ring)] = _Entity()
        return ent


@dataclass(slots=True)
class _Job:
    ibs: list[st.AmdgpuCsChunkIb] = field(default_factory=list)
    gang: list[tuple[int, int]] = field(default_factory=list)  # (ip, ring) entities
    bo_list: BoList | None = None
    user_fence: tuple[AmdgpuBo, int] | None = None
    post: list[tuple[DrmSyncobj, int]] | None = None  # SYNCOBJ_OUT / TIMELINE_SIGNAL
    leader: tuple[int, int] = (HW_IP_DMA, 0)


class CommandSubmission:
    """The CS, WAIT_CS and WAIT_FENCES handlers of one AmdgpuDriver, and each context's
    submission state (amdgpu_ctx's entities and guilty flag)."""

    def __init__(self, driver: AmdgpuDriver, device: DrmDevice, bo_lists: BoLists) -> None:
        self.driver = driver
        self.device = device
        self.bo_lists = bo_lists
        self.runner: EngineRunner | None = None  # the node's engine edge sets it
        self.submissions = 0
        self._ctxs: weakref.WeakKeyDictionary[DrmFile, dict[int, _CtxState]] = (
            weakref.WeakKeyDictionary())

    # -- contexts (their ids are amdgpu/info.py's CTX ioctl's) ---------------------------------
    def _ctx(self, file: DrmFile, ctx_id: int) -> _CtxState:
        """amdgpu_ctx_get: EINVAL for an id CTX did not give this file."""
        if not self.driver.info.context_exists(file, ctx_id):
            raise DrmError(errno.EINVAL, f"no context {ctx_id}")
        ctxs = self._ctxs.get(file)
        if ctxs is None:
            ctxs = self._ctxs[file] = {}
        state = ctxs.get(ctx_id)
        if state is None:
            state = ctxs[ctx_id] = _CtxState()
        return state

    def context_freed(self, file: DrmFile, ctx_id: int) -> None:
        """amdgpu_ctx_fini: the context's fences and guilt go with it."""
        ctxs = self._ctxs.get(file)
        if ctxs is not None:
            ctxs.pop(ctx_id, None)

    def guilty(self, file: DrmFile, ctx_id: int) -> bool:
        ctxs = self._ctxs.get(file)
        return bool(ctxs and ctx_id in ctxs and ctxs[ctx_id].guilty)

    def _has_engine(self, ip: int) -> bool:
        hw = self.driver.profile.hw_ips.get(ip)
        return (ip == HW_IP_DMA and self.runner is not None and hw is not None
                and hw.available_rings != 0)

    # -- CS ----------------------------------------------------------------------------------
    @tbl.handles(tbl.AMDGPU_CS)
    async def cs_ioctl(self, file: DrmFile, kdata: bytearray, caller: Caller) -> None:
        """amdgpu_cs_ioctl. parser_init: no chunks EINVAL (1), an unknown context EINVAL (2), a
        guilty one ECANCELED (3). Pass 1 (amdgpu_cs_pass1): the chunk pointer array and each
        chunk's header and data copied in (EFAULT; over INT_MAX bytes ENOMEM) (4); an IB
        chunk shorter than its struct EINVAL, its IP/instance/ring checked
        (amdgpu_ctx_get_entity) and a ring with no scheduler here EINVAL, at most 4 entities
        in the gang and 49 IBs per SDMA entity (5); a FENCE chunk's BO (EINVAL: none, not
        one page, offset past it, userptr) (6); one BO_HANDLES chunk (a second EINVAL) made
        into a list as BO_LIST CREATE makes one (7); the dependency and syncobj chunk ids
        accepted, any other EINVAL (8); no IB EINVAL (9). Pass 2: each dependency's context
        (EINVAL), entity and sequence (not yet submitted: EINVAL) (10); each SYNCOBJ_IN and
        TIMELINE_WAIT syncobj (ENOENT) and its fence (none: EINVAL) (11); one SYNCOBJ_OUT or
        TIMELINE_SIGNAL set (a second EINVAL), each syncobj EINVAL when unknown (12). The
        bo_list_handle: with a BO_HANDLES chunk too EINVAL, unknown ENOENT (13). Then the
        IBs run (14), the leader entity's fence takes the next sequence number, written to
        out.handle, and the user fence and the syncobjs get it (15)."""
        args = st.CS_IN.decode(bytes(kdata[: st.CS_IN.size]))
        if args.num_chunks == 0:  # 1
            raise DrmError(errno.EINVAL, "no chunks")
        ctx = self._ctx(file, args.ctx_id)  # 2
        if ctx.guilty:  # 3
            raise DrmError(errno.ECANCELED, f"context {args.ctx_id} is guilty of a hang")
        job = _Job()
        try:
            chunks = await self._pass1(file, caller, args, ctx, job)
            self._pass2(file, chunks, job)
            if args.bo_list_handle:  # 13
                if job.bo_list is not None:
                    raise DrmError(errno.EINVAL, "a BO list handle and a BO_HANDLES chunk")
                if self.bo_lists.get(file, args.bo_list_handle) is None:
                    raise DrmError(errno.ENOENT, f"no BO list {args.bo_list_handle}")
            ip, ring = job.leader
            entity = ctx.entity(ip, 0, ring)
            ctx.submitted = entity.sequence
            error = await self._run(file, caller, args.ctx_id, ctx, entity.sequence, job)  # 14
            seq = entity.add_fence(error)  # 15
            if error:
                ctx.guilty = True
            self.submissions += 1
            ctx.submissions += 1
            ctx.signaled, ctx.last_error = seq, error
            if job.user_fence is not None:
                bo, offset = job.user_fence
                bo.memory.write(offset, struct.pack("<Q", seq))
            for obj, point in job.post or ():
                if point:
                    obj.add_point(point)
                else:
                    obj.replace_fence(STUB)
        finally:  # the job's references: its BO list's and the user fence BO's
            if job.bo_list is not None:
                job.bo_list.release()
            if job.user_fence is not None:
                job.user_fence[0].put()
        kdata[: st.CS_SIZE] = bytes(st.CS_SIZE)
        kdata[: st.CS_OUT.size] = st.CS_OUT.pack(seq)

    async def _read(self, caller: Caller, address: int, size: int) -> bytes:
        if size > _KVMALLOC_MAX:
            raise DrmError(errno.ENOMEM, f"{size} bytes")
        return await self.device.read_user(caller, address, size) if size else b""

    async def _pass1(self, file: DrmFile, caller: Caller, args: st.AmdgpuCsIn,
                     ctx: _CtxState, job: _Job) -> list[tuple[int, bytes]]:
        n = args.num_chunks
        ptrs = struct.unpack(f"<{n}Q", await self._read(caller, args.chunks, 8 * n))  # 4
        chunks: list[tuple[int, bytes]] = []
        for ptr in ptrs:
            head = st.CS_CHUNK.decode(await self._read(caller, ptr, st.CS_CHUNK.size))
            data = await self._read(caller, head.chunk_data, 4 * head.length_dw)
            cid = head.chunk_id
            if cid == c.CHUNK_ID_IB:  # 5
                if len(data) < st.CS_CHUNK_IB.size:
                    raise DrmError(errno.EINVAL, "IB chunk too short")
                ib = st.CS_CHUNK_IB.decode(data[: st.CS_CHUNK_IB.size])
                ctx.entity(ib.ip_type, ib.ip_instance, ib.ring)
                if not self._has_engine(ib.ip_type):
                    raise DrmError(errno.EINVAL, f"no scheduler runs IP {ib.ip_type} IBs "
                                                 f"here (only SDMA IBs run)")
                key = (ib.ip_type, ib.ring)
                if key not in job.gang:  # amdgpu_cs_job_idx
                    if len(job.gang) == AMDGPU_CS_GANG_SIZE:
                        raise DrmError(errno.EINVAL, "more than 4 entities in the gang")
                    job.gang.append(key)
                if sum((i.ip_type, i.ring) == key for i in job.ibs) >= AMDGPU_RING_MAX_IBS:
                    raise DrmError(errno.EINVAL, f"more than {AMDGPU_RING_MAX_IBS} IBs")
                job.ibs.append(ib)
                job.leader = key  # the gang leader: the entity of the last IB chunk
            elif cid == c.CHUNK_ID_FENCE:  # 6
                if len(data) < st.CS_CHUNK_FENCE.size:
                    raise DrmError(errno.EINVAL, "FENCE chunk too short")
                uf = self._user_fence(
                    file, st.CS_CHUNK_FENCE.decode(data[: st.CS_CHUNK_FENCE.size]))
                if job.user_fence is not None:  # a later FENCE chunk replaces it
                    job.user_fence[0].put()
                job.user_fence = uf
            elif cid == c.CHUNK_ID_BO_HANDLES:  # 7
                if len(data) < st.BO_LIST_IN.size or job.bo_list is not None:
                    raise DrmError(errno.EINVAL, "BO_HANDLES chunk too short or a second one")
                info = await self.bo_lists.entries(
                    caller, st.BO_LIST_IN.decode(data[: st.BO_LIST_IN.size]))
                job.bo_list = self.bo_lists.create(file, info)
            elif cid not in c.CHUNK_IDS:  # 8
                raise DrmError(errno.EINVAL, f"unknown chunk id {cid}")
            chunks.append((cid, data))
        if not job.ibs:  # 9
            raise DrmError(errno.EINVAL, "no IB chunk")
        return chunks

    def _user_fence(self, file: DrmFile, f: st.AmdgpuCsChunkFence) -> tuple[AmdgpuBo, int]:
        """amdgpu_cs_p1_user_fence: the BO exists, is one page, the 8 bytes fit, not
        userptr (each EINVAL); the job takes a reference on it."""
        obj = file.lookup(f.handle)
        if not isinstance(obj, AmdgpuBo):
            raise DrmError(errno.EINVAL, f"no GEM handle {f.handle} for the user fence")
        if obj.size != _PAGE or f.offset > obj.size - 8 or obj.userptr is not None:
            raise DrmError(errno.EINVAL, "bad user fence BO or offset")
        obj.get()  # amdgpu_bo_ref: the job holds it (its handle may be closed meanwhile)
        return obj, f.offset

    def _pass2(self, file: DrmFile, chunks: list[tuple[int, bytes]], job: _Job) -> None:
        for cid, data in chunks:
            if cid in (c.CHUNK_ID_DEPENDENCIES, c.CHUNK_ID_SCHEDULED_DEPENDENCIES):  # 10
                size = st.CS_CHUNK_DEP.size
                for i in range(len(data) // size):
                    dep = st.CS_CHUNK_DEP.decode(data[i * size: (i + 1) * size])
                    other = self._ctx(file, dep.ctx_id)
                    other.entity(dep.ip_type, dep.ip_instance, dep.ring).fence(dep.handle)
            elif cid == c.CHUNK_ID_SYNCOBJ_IN:  # 11
                for i in range(len(data) // 4):
                    self._in_fence(file, int.from_bytes(data[4 * i: 4 * i + 4], "little"), 0)
            elif cid == c.CHUNK_ID_SYNCOBJ_TIMELINE_WAIT:
                size = st.CS_CHUNK_SYNCOBJ.size
                for i in range(len(data) // size):
                    sy = st.CS_CHUNK_SYNCOBJ.decode(data[i * size: (i + 1) * size])
                    self._in_fence(file, sy.handle, sy.point)
            elif cid in (c.CHUNK_ID_SYNCOBJ_OUT, c.CHUNK_ID_SYNCOBJ_TIMELINE_SIGNAL):  # 12
                if job.post is not None:
                    raise DrmError(errno.EINVAL, "a second syncobj out chunk")
                job.post = []
                timeline = cid == c.CHUNK_ID_SYNCOBJ_TIMELINE_SIGNAL
                size = st.CS_CHUNK_SYNCOBJ.size if timeline else 4
                for i in range(len(data) // size):
                    raw = data[i * size: (i + 1) * size]
                    handle, point = ((st.CS_CHUNK_SYNCOBJ.decode(raw).handle,
                                      st.CS_CHUNK_SYNCOBJ.decode(raw).point) if timeline
                                     else (int.from_bytes(raw, "little"), 0))
                    obj = file.syncobjs.find(handle)
                    if obj is None:
                        raise DrmError(errno.EINVAL, f"no syncobj {handle}")
                    job.post.append((obj, point))

    @staticmethod
    def _in_fence(file: DrmFile, handle: int, point: int) -> None:
        """drm_syncobj_find_fence: an unknown syncobj ENOENT, no fence at the point EINVAL
        (every fence here is signaled, so a found one is no wait)."""
        obj = file.syncobjs.find(handle)
        if obj is None:
            raise DrmError(errno.ENOENT, f"no syncobj {handle}")
        if obj.fence_at(point) is None:
            raise DrmError(errno.EINVAL, f"syncobj {handle} has no fence at point {point}")

    async def _run(self, file: DrmFile, caller: Caller, ctx_id: int, ctx: _CtxState, seq: int,
                   job: _Job) -> int:
        """The job's IBs in order through the engine, each IB and packet counted for the
        context; the fence's error (0, or -ETIME for an IB the engine stopped on: one log
        line names the context, IB and reason). `seq` is the sequence the job's fence
        takes (named in each IB's trace records)."""
        assert self.runner is not None  # _has_engine let no IB through without one
        for n, ib in enumerate(job.ibs):
            ctx.ibs += 1
            end = await self.runner(file, _counted(run_ib(ib.va_start, ib.ib_bytes // 4), ctx),
                                    IbRun(caller.pid, ctx_id, seq, n, ib.va_start,
                                          ib.ib_bytes))
            if not end.ok:
                log.warning("AMDGPU_CS: context %d's SDMA IB %d at %#x stopped at byte %#x: "
                            "%s; its fence gets -ETIME and the context is guilty", ctx_id, n,
                            ib.va_start, end.offset, end.error)
                return -errno.ETIME
        return 0

    # -- debugfs -------------------------------------------------------------------------------
    def context_rows(self) -> list[dict[str, object]]:
        """debugfs amdgpu_cs_contexts: per render file's context, its submissions."""
        rows: list[dict[str, object]] = []
        for file in list(self.device.files):
            ctxs = self._ctxs.get(file, {})
            for ctx_id in self.driver.info.context_ids(file):
                s = ctxs.get(ctx_id) or _CtxState()
                rows.append({"pid": file.pid, "ctx_id": ctx_id, "guilty": int(s.guilty),
                             "submitted": s.submitted, "signaled": s.signaled,
                             "submissions": s.submissions, "ibs": s.ibs,
                             "packets": s.packets, "last_error": s.last_error})
        return rows

    # -- FENCE_TO_HANDLE ----------------------------------------------------------------------
    @tbl.handles(tbl.AMDGPU_FENCE_TO_HANDLE)
    def fence_to_handle_ioctl(self, file: DrmFile, kdata: bytearray, caller: Caller) -> None:
        """amdgpu_cs_fence_to_handle_ioctl: the fence looked up as WAIT_FENCES does (an
        unknown context, entity or a sequence not yet given EINVAL; a forgotten one is the
        stub fence) (1); then, by in.what, a new syncobj holding it, its handle (2), or a
        syncobj file (3) or sync file (4) of it, whose fd is a dma-buf token here (the
        dma-buf tokens of the README); any other `what` EINVAL (5). out.handle is the first
        4 bytes; the rest is copied back as sent. (Every fence here is signaled; a failed
        job's -ETIME does not travel into the syncobj.)"""
        fence = st.AMDGPU_FENCE.decode(bytes(kdata[: st.AMDGPU_FENCE.size]))
        what, _pad = st.FENCE_TO_HANDLE_WHAT.unpack_from(kdata, st.AMDGPU_FENCE.size)
        self._ctx(file, fence.ctx_id).entity(
            fence.ip_type, fence.ip_instance, fence.ring).fence(fence.seq_no)  # 1
        if what == c.FENCE_TO_HANDLE_GET_SYNCOBJ:  # 2
            handle = file.syncobjs.create(signaled=True)
        elif what == c.FENCE_TO_HANDLE_GET_SYNCOBJ_FD:  # 3
            obj = DrmSyncobj(self.device.syncobj_changed, STUB)
            shared = SyncobjFile(obj)
            obj.put()  # the file holds its own reference
            handle = self.device.tokens.install(shared, file, caller.uid)
        elif what == c.FENCE_TO_HANDLE_GET_SYNC_FILE_FD:  # 4
            handle = self.device.tokens.install(SyncFile(STUB), file, caller.uid)
        else:  # 5
            raise DrmError(errno.EINVAL, f"FENCE_TO_HANDLE what {what}")
        kdata[0:4] = handle.to_bytes(4, "little")

    # -- WAIT_CS / WAIT_FENCES -----------------------------------------------------------------
    @tbl.handles(tbl.AMDGPU_WAIT_CS)
    def wait_cs_ioctl(self, file: DrmFile, kdata: bytearray, caller: Caller) -> None:
        """amdgpu_cs_wait_ioctl: the context (EINVAL), its entity, the fence (a sequence not
        yet given EINVAL); a fence with an error answers it; else out.status 0 (signaled:
        every submitted job has run, so the timeout never matters)."""
        args = st.WAIT_CS_IN.decode(bytes(kdata[: st.WAIT_CS_IN.size]))
        ctx = self._ctx(file, args.ctx_id)
        error = ctx.entity(args.ip_type, args.ip_instance, args.ring).fence(args.handle)
        if error:
            raise DrmError(-error, f"fence {args.handle} of context {args.ctx_id} failed")
        kdata[: st.WAIT_CS_SIZE] = bytes(st.WAIT_CS_SIZE)

    @tbl.handles(tbl.AMDGPU_WAIT_FENCES)
    async def wait_fences_ioctl(self, file: DrmFile, kdata: bytearray, caller: Caller) -> None:
        """amdgpu_cs_wait_fences_ioctl: the fence array copied in (EFAULT; ENOMEM past
        INT_MAX bytes), each fence's context, entity and sequence checked as WAIT_CS does
        (EINVAL). wait_all (amdgpu_cs_wait_all_fences): a fence with an error answers it,
        else out.status 1. Any (amdgpu_cs_wait_any_fence): the look stops at the first
        fence old enough to be forgotten (first_signaled its index), else the first fence
        is the one signaled (index 0); out.status 1, and that fence's error is answered
        after out is written; an empty array EINVAL."""
        args = st.WAIT_FENCES_IN.decode(bytes(kdata[: st.WAIT_FENCES_IN.size]))
        size = st.AMDGPU_FENCE.size
        raw = await self._read(caller, args.fences, size * args.fence_count)
        fences = [st.AMDGPU_FENCE.decode(raw[i * size: (i + 1) * size])
                  for i in range(args.fence_count)]
        if args.wait_all:  # amdgpu_cs_wait_all_fences
            for f in fences:
                error = self._ctx(file, f.ctx_id).entity(
                    f.ip_type, f.ip_instance, f.ring).fence(f.seq_no)
                if error:
                    raise DrmError(-error, f"fence {f.seq_no} failed")
            first, error = 0, 0
        else:  # amdgpu_cs_wait_any_fence: a forgotten (signaled) fence ends the look
            found: int | None = None
            errors: list[int] = []
            for i, f in enumerate(fences):
                e = self._ctx(file, f.ctx_id).entity(
                    f.ip_type, f.ip_instance, f.ring).fence(f.seq_no)
                if e is None:
                    found = i
                    break
                errors.append(e)
            if found is None and not fences:
                raise DrmError(errno.EINVAL, "wait for any of no fence")
            first = 0 if found is None else found
            error = errors[0] if found is None else 0
        kdata[: st.WAIT_FENCES_SIZE] = bytes(st.WAIT_FENCES_SIZE)
        kdata[: st.WAIT_FENCES_OUT.size] = st.WAIT_FENCES_OUT.pack(1, first)
        if error:
            raise DrmError(-error, f"fence {fences[first].seq_no} failed")


def _counted(gen: EngineRun, ctx: _CtxState) -> EngineRun:
    """`gen` as it is, counting its packets executed (its Executed requests) for `ctx`;
    every answer and fault passes through to it."""
    try:
        req: Request = next(gen)
        while True:
            if isinstance(req, Executed):
                ctx.packets += 1
            try:
                answer = yield req
            except GeneratorExit:
                raise
            except BaseException as e:  # a GPU fault thrown in by the edge
                req = gen.throw(e)
            else:
                req = gen.send(answer)
    except StopIteration as stop:
        end = stop.value
        assert isinstance(end, RunEnd)
        return end
    finally:
        gen.close()
