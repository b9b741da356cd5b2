"""Issue 35 item 4: the tracer's AMDGPU_CS chunk decode (trace.cs_chunks, from the caller
memory amdgpu/cs.py's pass 1 read and the node recorded: amdgpu_cs_pass1's copies), the IB
packet records (trace.IbRecord), the per-context submission counters of debugfs
amdgpu_cs_contexts (amdgpu_ctx's fences and guilty flag as amdgpu_cs_ioctl leaves them) and
ualinkctl's `cs` table. Through a node's real dispatch with a tracer attached; the engine
edge's part is test_cs_submit.py's Runner over a fake GPU VM."""

from __future__ import annotations

import errno
import json
import struct

import pytest
from sdma_fakes import copy_linear, fence
from test_cs_bo_list import Mem
from test_cs_submit import DST, SRC, Runner, ctx_alloc, ib_chunk
from ualink_testkit import CALLER, gem_create, open_file, pod_config, run

from ualinkd import sysfs
from ualinkd.abi import constants as c
from ualinkd.abi import ioctls as tbl
from ualinkd.abi import structs as st
from ualinkd.amdgpu.cs import IbRun
from ualinkd.amdgpu.driver import AmdgpuDriver
from ualinkd.amdgpu.profile import HW_IP_DMA
from ualinkd.cli.ctl import render_text
from ualinkd.drm.file import DrmFile
from ualinkd.node import NodeCore, NodeServices
from ualinkd.podinfo import parse_lines
from ualinkd.trace import EngineAccess, IbRecord, Record, TraceRecord, cs_chunks


@pytest.fixture
def mem() -> Mem:
    return Mem()


@pytest.fixture
def records() -> list[Record]:
    return []


@pytest.fixture
def core(mem: Mem, records: list[Record]) -> NodeCore:
    core = NodeCore(pod_config(), "node0", NodeServices(resolve_fd=lambda pid, fd: fd,
                    copy_to_user=mem.write, copy_from_user=mem.read))
    core.tracer = records.append
    return core


@pytest.fixture
def f(core: NodeCore) -> DrmFile:
    return open_file(core)


@pytest.fixture
def runner(f: DrmFile) -> Runner:
    r = Runner()
    drv = f.device.driver
    assert isinstance(drv, AmdgpuDriver)
    drv.cs.runner = r
    return r


def call(core: NodeCore, f: DrmFile, in_bytes: bytes) -> tuple[int, bytes]:
    """AMDGPU_CS through the node (NodeCore.ioctl: what the FUSE edge calls), traced."""
    res: tuple[int, bytes] = run(core.ioctl(f, tbl.AMDGPU_CS.cmd, in_bytes, 24, CALLER))
    return res


def cs(core: NodeCore, f: DrmFile, mem: Mem, ctx: int, *chunks: tuple[int, bytes],
       bo_list: int = 0) -> tuple[int, bytes]:
    ptrs = [mem.put(struct.pack("<IIQ", cid, len(data) // 4, mem.put(data)))
            for cid, data in chunks]
    array = mem.put(struct.pack(f"<{len(ptrs)}Q", *ptrs))
    return call(core, f, st.CS_IN.encode(st.AmdgpuCsIn(ctx, bo_list, len(ptrs), 0, array)))


def seq(r: tuple[int, bytes]) -> int:
    assert r[0] == 0, r
    return int(st.CS_OUT.unpack(r[1][:8])[0])


def last_cs(records: list[Record]) -> TraceRecord:
    rec = [r for r in records if isinstance(r, TraceRecord) and r.name == "AMDGPU_CS"][-1]
    return rec


def contexts(f: DrmFile) -> list[dict[str, object]]:
    drv = f.device.driver
    assert isinstance(drv, AmdgpuDriver)
    text = "".join(sysfs.DEBUGFS["amdgpu_cs_contexts"].line(**r)  # type: ignore[arg-type]
                   for r in drv.cs.context_rows())
    return parse_lines(text, sysfs.DEBUGFS["amdgpu_cs_contexts"], "amdgpu_cs_contexts")


def test_chunks_decoded_from_what_the_cs_read(core: NodeCore, f: DrmFile, mem: Mem,
                                              runner: Runner, records: list[Record]) -> None:
    """Every chunk kind a CS passes, in the JSON record's `chunks` and its strace-style text:
    the IB's ip_type/ip_instance/ring/va_start/ib_bytes/flags, the user fence's handle and
    offset, a dependency's entries, SYNCOBJ_IN/OUT handles, a timeline signal's point and the
    BO_HANDLES chunk's BO handles (its entry array, read by amdgpu_bo_create_list_entry_array);
    nothing read twice (the memory the node recorded is the CS's own reads)."""
    ctx = ctx_alloc(f)
    first = seq(cs(core, f, mem, ctx, ib_chunk(*runner.ib(fence(DST, 1)))))
    h = gem_create(f, 4096, c.DOMAIN_GTT)
    sync = f.syncobjs
    signaled, out, tl = sync.create(True), sync.create(False), sync.create(False)
    va, size = runner.ib(copy_linear(DST, SRC, 64))
    reads_before = mem.reads
    chunks = [
        (c.CHUNK_ID_BO_HANDLES, st.BO_LIST_IN.encode(st.AmdgpuBoListIn(
            0, 0, 1, 8, mem.put(struct.pack("<II", h, 3))))),
        (c.CHUNK_ID_FENCE, st.CS_CHUNK_FENCE.encode(st.AmdgpuCsChunkFence(h, 16))),
        (c.CHUNK_ID_DEPENDENCIES, st.CS_CHUNK_DEP.encode(
            st.AmdgpuCsChunkDep(HW_IP_DMA, 0, 0, ctx, first))),
        (c.CHUNK_ID_SYNCOBJ_IN, struct.pack("<I", signaled)),
        (c.CHUNK_ID_SYNCOBJ_OUT, struct.pack("<I", out)),
        ib_chunk(va, size),
    ]
    assert seq(cs(core, f, mem, ctx, *chunks)) == 2
    rec = last_cs(records)
    d = rec.as_dict()
    by_id = {ch["id"]: ch for ch in d["chunks"]}
    assert [ch["id"] for ch in d["chunks"]] == ["BO_HANDLES", "FENCE", "DEPENDENCIES",
                                                "SYNCOBJ_IN", "SYNCOBJ_OUT", "IB"]
    assert by_id["IB"] | {"chunk_data": 0} == {
        "id": "IB", "length_dw": 8, "chunk_data": 0, "ip_type": HW_IP_DMA, "ip_instance": 0,
        "ring": 0, "va_start": va, "ib_bytes": size, "flags": 0}
    assert by_id["FENCE"]["handle"] == h and by_id["FENCE"]["offset"] == 16
    assert by_id["DEPENDENCIES"]["deps"] == [{"ip_type": HW_IP_DMA, "ip_instance": 0,
                                              "ring": 0, "ctx_id": ctx, "handle": first}]
    assert by_id["SYNCOBJ_IN"]["handles"] == [signaled]
    assert by_id["SYNCOBJ_OUT"]["handles"] == [out]
    assert by_id["BO_HANDLES"]["bos"] == [h] and by_id["BO_HANDLES"]["bo_number"] == 1
    json.loads(rec.json())  # (one JSON line)
    text = rec.text()
    assert "AMDGPU_CS({" in text and "IB{length_dw=8, chunk_data=" in text
    assert f"ip_type={HW_IP_DMA}, ip_instance=0, ring=0, va_start={va:#x}, ib_bytes={size}" \
        in text
    assert "BO_HANDLES{" in text and f"bos=[{h}]" in text
    assert " = 0 <" in text
    # the trace adds no reads of its own: the CS's reads are all there is
    assert mem.reads - reads_before == len([m for m in rec.mem if m.op == "read"])

    sync_tl = (c.CHUNK_ID_SYNCOBJ_TIMELINE_SIGNAL, st.CS_CHUNK_SYNCOBJ.encode(
        st.AmdgpuCsChunkSyncobj(tl, 0, 9)))
    assert seq(cs(core, f, mem, ctx, sync_tl, ib_chunk(va, size))) == 3
    tl_chunk = last_cs(records).as_dict()["chunks"][0]
    assert tl_chunk["syncobjs"] == [{"handle": tl, "flags": 0, "point": 9}]


def test_chunks_of_a_failed_cs(core: NodeCore, f: DrmFile, mem: Mem, runner: Runner,
                               records: list[Record]) -> None:
    """A CS that stopped part-way (a chunk header behind an unmapped pointer: EFAULT) has the
    chunks it read, and the one it could not as its pointer alone; one with no chunks read
    (no context: EINVAL before pass 1) has no `chunks`."""
    ctx = ctx_alloc(f)
    ib = ib_chunk(*runner.ib(fence(DST, 1)))
    good = mem.put(struct.pack("<IIQ", ib[0], len(ib[1]) // 4, mem.put(ib[1])))
    array = mem.put(struct.pack("<2Q", good, 0xDEAD0000))
    assert call(core, f, st.CS_IN.encode(st.AmdgpuCsIn(ctx, 0, 2, 0, array)))[0] == -errno.EFAULT
    chunks = last_cs(records).as_dict()["chunks"]
    assert chunks[0]["id"] == "IB" and chunks[1] == {"ptr": 0xDEAD0000}
    assert "ptr=0xdead0000" in last_cs(records).text()
    assert cs(core, f, mem, ctx + 7, ib)[0] == -errno.EINVAL
    assert "chunks" not in last_cs(records).as_dict()
    assert cs_chunks(b"", ()) is None


def test_contexts_count_submissions_ibs_packets_and_guilt(
        core: NodeCore, f: DrmFile, mem: Mem, runner: Runner, records: list[Record]) -> None:
    """amdgpu_cs_contexts: per context its pid, guilty, last sequence submitted and
    signaled, submissions, IBs and packets executed and last fence error; a context that
    never submitted is listed with zeros; a faulting IB (a copy from an unmapped VA) makes
    its context guilty with -ETIME, the other context goes on. The edge is told each IB's
    context, sequence and index (IbRun)."""
    ctx, other, idle = ctx_alloc(f), ctx_alloc(f), ctx_alloc(f)
    two = ib_chunk(*runner.ib(fence(DST, 1), fence(DST + 8, 2)))
    one = ib_chunk(*runner.ib(fence(DST, 3)))
    assert seq(cs(core, f, mem, ctx, two, one)) == 1
    assert seq(cs(core, f, mem, ctx, one)) == 2
    bad_va, bad_size = runner.ib(copy_linear(DST, 0xDEAD000, 64))
    assert seq(cs(core, f, mem, other, ib_chunk(bad_va, bad_size))) == 1
    ib0 = st.CS_CHUNK_IB.decode(two[1])
    assert runner.ibs[0] == IbRun(f.pid, ctx, 1, 0, ib0.va_start, ib0.ib_bytes)
    assert [(i.ctx_id, i.seq, i.index) for i in runner.ibs] == [
        (ctx, 1, 0), (ctx, 1, 1), (ctx, 2, 0), (other, 1, 0)]
    rows = {r["ctx_id"]: r for r in contexts(f)}
    assert rows[ctx] == {"pid": f.pid, "ctx_id": ctx, "guilty": 0, "submitted": 2,
                         "signaled": 2, "submissions": 2, "ibs": 3, "packets": 4,
                         "last_error": 0}
    assert rows[other]["guilty"] == 1 and rows[other]["last_error"] == -errno.ETIME
    assert rows[other]["submissions"] == 1 and rows[other]["packets"] == 0
    assert rows[idle] == {"pid": f.pid, "ctx_id": idle, "guilty": 0, "submitted": 0,
                          "signaled": 0, "submissions": 0, "ibs": 0, "packets": 0,
                          "last_error": 0}
    assert cs(core, f, mem, other, one)[0] == -errno.ECANCELED
    assert {r["ctx_id"]: r for r in contexts(f)}[other]["submissions"] == 1


def test_ib_record_text_and_json() -> None:
    """An IB packet's record: strace-style, naming the context, sequence and IB, the packet
    as decoded and the memory it touched; its JSON has the same."""
    rec = IbRecord(42, "node0", 128, 0, 3, 1, 7, 0, 0x7200_0000, "packet", 0x10,
                   "COPY_LINEAR(count=64)", 1.5,
                   (EngineAccess("read", 0x7000_0000, 64), EngineAccess("write", 0x100, 64)),
                   False, {"op": "COPY_LINEAR"})
    text = rec.text()
    assert "[pid 42] node0 renderD128 IB_PACKET(ctx=1, seq=7, ib=0@0x72000000, " \
           "offset=0x10, COPY_LINEAR(count=64), mem=[read 0x70000000+0x40, " \
           "write 0x100+0x40])" in text
    d = json.loads(rec.json())
    assert d["type"] == "ib" and d["seq"] == 7 and d["file"] == 3 and d["ctx_id"] == 1
    assert d["fields"] == {"op": "COPY_LINEAR"} and d["mem"][1] == {"op": "write", "va": 0x100,
                                                                     "len": 64}


def test_ualinkctl_cs_table() -> None:
    """`ualinkctl cs`: one row per context, guilty as yes/no and the error as its name."""
    doc = {"mount": "/m", "accels": [{"render": "renderD128", "minor": 128, "accel_id": 0,
                                      "cs": [{"pid": 9, "ctx_id": 1, "guilty": 1,
                                              "submitted": 3, "signaled": 3,
                                              "submissions": 3, "ibs": 4, "packets": 10,
                                              "last_error": -errno.ETIME}]}]}
    text = render_text(doc, ["cs"])
    assert "ctx" in text and "-ETIME" in text and "yes" in text
    assert "no AMDGPU_CS contexts" in render_text(
        {"mount": "/m", "accels": [{"render": "renderD128", "minor": 128, "accel_id": 0,
                                    "cs": []}]}, ["cs"])
