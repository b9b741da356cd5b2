"""The tracer's `queue` records (issue 30 item 6: "the tracer shows queue creation/
destruction, each doorbell, each packet decoded (strace style, and in the JSON trace) with
the memory it touched"), from a real NodeCore whose engine edge runs an SDMA queue
(gpu_engine.py; packets as the kernel's vega10_sdma_pkt_open.h lays them out)."""

from __future__ import annotations

import json

from test_gpu_engine_edge import DATA, RING, RPTR, UNMAPPED, Rig, copy, fence, run_edge, until

from ualinkd.gpu_engine import GpuEngineEdge
from ualinkd.trace import ENGINE_ACCESSES_KEPT, EngineAccess, QueueRecord, Record


def _traced(rig: Rig) -> list[Record]:
    """Every record the node traces from now on (the caller picks the queue records)."""
    seen: list[Record] = []
    rig.node.tracer = seen.append
    return seen


def test_each_packet_record_names_the_memory_it_touched_and_its_fields():
    """COPY_LINEAR reads its source and writes its destination, FENCE writes its word;
    the ring's bytes and the rptr write-back are the queue's own (consuming the ring), not
    a packet's; JSON has the decoded fields and `mem`, text has `mem=[...]`."""
    rig = Rig()
    seen = _traced(rig)

    async def body(edge: GpuEngineEdge) -> None:
        rig.submit(copy(DATA + 64, DATA, 8) + fence(DATA + 128, 7))
        await until(lambda: rig.word(DATA + 128) == 7)
        await until(lambda: rig.word(RPTR, 8) == rig.index[0])
        await until(lambda: not edge._running)
        assert edge._touched == {}  # (nothing kept of a queue between runs)

    run_edge(rig, body)
    packets = [r for r in seen if isinstance(r, QueueRecord) and r.event == "packet"]
    assert [p.detail.split("(")[0] for p in packets] == ["COPY_LINEAR", "FENCE"]
    cp, fc = packets
    assert cp.mem == (EngineAccess("read", DATA, 8), EngineAccess("write", DATA + 64, 8))
    assert fc.mem == (EngineAccess("write", DATA + 128, 4),)
    assert not cp.mem_truncated and not fc.mem_truncated
    for p in packets:  # nothing of the ring nor of the pointers
        assert all(not RING <= a.va < RING + 4096 and a.va != RPTR for a in p.mem)
    d = json.loads(cp.json())
    assert d["mem"] == [{"op": "read", "va": DATA, "len": 8},
                        {"op": "write", "va": DATA + 64, "len": 8}]
    assert d["fields"]["src"] == DATA and d["fields"]["dst"] == DATA + 64
    assert d["fields"]["size"] == 8 and d["mem_truncated"] is False
    assert cp.text().endswith(f"mem=[read {DATA:#x}+0x8, write {DATA + 64:#x}+0x8])")
    doorbell = next(r for r in seen if isinstance(r, QueueRecord) and r.event == "doorbell")
    assert "mem" not in json.loads(doorbell.json()) and "mem=" not in doorbell.text()


def test_the_packet_that_faults_is_in_the_error_record_with_its_memory():
    rig = Rig()
    seen = _traced(rig)

    async def body(edge: GpuEngineEdge) -> None:
        rig.submit(copy(DATA, UNMAPPED, 4096))
        await until(lambda: rig.queues[0].error)

    run_edge(rig, body)
    (err,) = [r for r in seen if isinstance(r, QueueRecord) and r.event == "error"]
    assert EngineAccess("read", UNMAPPED, 4096) in err.mem, err
    assert json.loads(err.json())["mem"][0] == {"op": "read", "va": UNMAPPED, "len": 4096}


def test_a_packet_touching_more_than_kept_is_marked_truncated():
    """At most ENGINE_ACCESSES_KEPT distinct accesses; a repeat is listed once."""
    rig = Rig()
    edge = GpuEngineEdge(rig.node)
    q = rig.queues[0]
    from ualinkd.amdgpu.engine import Read

    for i in range(ENGINE_ACCESSES_KEPT + 5):
        edge._touch(q, Read(DATA + 4 * i, 4))
        edge._touch(q, Read(DATA + 4 * i, 4))
    edge._touch(q, Read(RING + 16, 16))  # the ring: not the packet's
    mem, truncated = edge._kept(edge._touched[q])
    assert len(mem) == ENGINE_ACCESSES_KEPT and truncated
    assert len(set(mem)) == len(mem)
    rec = QueueRecord(1, "node0", 128, 0, 0, "sdma", "packet", 0, "NOP()", 0.0, mem, truncated)
    assert rec.text().endswith(", ...])")
