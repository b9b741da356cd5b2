"""A queue error is reported once (the edge's "GPU queue error" log line and the tracer's
`error` record, gpu_engine.py `_queue_error`) even when the queue is destroyed after its
engine reached the error but before the run returned: it is reported at the step where the
engine reaches it, before the engine's own report reaches the client's memory. The CP
reports an AQL error through amd_queue_t.queue_inactive_signal (aql.py `AqlQueue._fail`:
the code stored in the signal's value, its mailbox written, its event interrupted), and
ROCr 5.2.3's DynamicScratchHandler, woken by that value, calls the queue's error callback,
which may destroy the queue (hsa_queue_destroy -> DESTROY_QUEUE) while the run still awaits
a store to the client's own memory (a userptr page: caller memory). An SDMA ring's packet
error is followed by its rptr write-back (sdma.py `SdmaRing.run`), the same window.

The destroying client is played deterministically: the edge's store to a word (the error's
mailbox, the rptr) is followed, before the run goes on, by the real KFD DESTROY_QUEUE ioctl
(kfd_ioctl_destroy_queue), as a client served while that store awaited its memory."""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from functools import partial

from test_gpu_engine_edge import BASE, DATA, RPTR, UNMAPPED, Rig, fence, run_edge, until
from test_kfd_queues import create, destroy
from test_kfd_rules import call

from ualinkd.abi import ioctls as tbl
from ualinkd.amdgpu import aql, sdma
from ualinkd.amdgpu.engine import EndReason, EngineRun, RunEnd
from ualinkd.amdkfd import queues
from ualinkd.gpu_engine import GpuEngineEdge, RunTarget
from ualinkd.trace import QueueRecord, Record

AQL = 2  # KFD_IOC_QUEUE_TYPE_COMPUTE_AQL
AQL_RING = BASE + 16384  # 64 packets, past the Rig's SDMA rings
AMDQ = DATA + 8192  # ROCr's amd_queue_t (256 bytes)
SIGNAL = DATA + 16384  # the queue_inactive_signal's amd_signal_t (64 bytes)
MAILBOX = DATA + 20480  # its event mailbox (the event's events-page slot)
EVENT_ID = 5


def _errors(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "GPU queue error" in r.getMessage()]


def _on_stores(edge: GpuEngineEdge, before: dict[int, Callable[[], None]],
               after: dict[int, Callable[[], None]]) -> None:
    """Around each of the edge's stores to a word named in `before` / `after`, call what
    it names (once per word): after a store, before the run's next step, is where a
    client served while that store awaited its memory acts."""
    store = edge._store

    async def watched(q: RunTarget, va: int, data: bytes | bytearray) -> None:
        if va in before:
            before.pop(va)()
        await store(q, va, data)
        if va in after:
            after.pop(va)()

    edge._store = watched  # type: ignore[method-assign]


def test_an_aql_error_is_reported_when_its_wake_up_destroys_the_queue(caplog):
    """A packet of type 23 (hsa.h defines none) on an AQL queue laid out as ROCr's
    amd_queue_t: the processor stores code 32 (INVALID_PACKET_FORMAT) in the inactive
    signal and writes its mailbox; the queue is destroyed right after that write, before
    the run returns. Still one log line naming the queue and the packet, one `error`
    record before the queue's `destroy` record, nothing of the queue kept by the edge; the
    line was logged before the signal's value (what wakes ROCr's handler) was stored.
    (Before: the run's QueueStopped ended it silently; ROCr's
    test_rocr_unknown_packet_type_is_an_invalid_packet_format saw no line 1 time in 4.)"""
    caplog.set_level(logging.WARNING, logger="ualinkd.gpu_engine")
    rig = Rig()
    seen: list[Record] = []
    rig.node.tracer = seen.append
    q = _bad_aql_queue(rig, SIGNAL)

    logged: list[int] = []
    destroyed: list[int] = []

    async def body(edge: GpuEngineEdge) -> None:
        _on_stores(edge, {SIGNAL + 8: lambda: logged.append(len(_errors(caplog)))},
                   {MAILBOX: lambda: destroyed.append(destroy(rig.node, rig.p, q.queue_id))})
        # ROCr's doorbell: the index of the last packet written
        rig.p.pdds[rig.g0].doorbells().memory.write(q.doorbell_slot, (0).to_bytes(8, "little"))
        await until(lambda: destroyed and not edge._running)
        assert edge._touched == {}  # (nothing kept of the destroyed queue)

    run_edge(rig, body)
    assert destroyed == [0]  # (DESTROY_QUEUE succeeded)
    assert logged == [1]  # (the line was there before the client could see the error)
    assert rig.word(SIGNAL + 8, 8) == aql.QueueError.INVALID_FORMAT  # what woke the client
    assert rig.word(MAILBOX) == EVENT_ID
    assert q.queue_id not in getattr(rig.node.kfd.queues.pqms.get(rig.p.pid), "queues", {})
    (line,) = _errors(caplog)
    assert f"pid {rig.p.pid} queue {q.queue_id} (compute_aql" in line.lower(), line
    assert "queue error 32 (INVALID_FORMAT) at ring offset 0x0: packet type 23" in line, line
    events = [(r.event, r.detail) for r in seen
              if isinstance(r, QueueRecord) and r.queue_id == q.queue_id]
    assert [e for e, _ in events] == ["create", "doorbell", "error", "destroy"], events
    assert "packet type 23" in events[2][1], events


def test_an_sdma_packet_error_is_reported_when_the_rptr_write_back_outlives_the_queue(caplog):
    """A FENCE then an unknown opcode on an SDMA ring: the ring reaches its error, then
    writes the rptr back (the FENCE consumed); the queue is destroyed right after that
    store. Still one log line (there before the write-back) and one `error` record for it.
    A second queue destroyed the same way after a run without error reports nothing (a
    destroyed queue's run is no error of its own)."""
    caplog.set_level(logging.WARNING, logger="ualinkd.gpu_engine")
    rig = Rig(2)
    seen: list[Record] = []
    rig.node.tracer = seen.append
    bad, good = rig.queues

    logged: list[int] = []
    destroyed: list[int] = []

    async def body(edge: GpuEngineEdge) -> None:
        _on_stores(edge, {RPTR: lambda: logged.append(len(_errors(caplog)))},
                   {RPTR + 16 * i: partial(lambda q: destroyed.append(
                       destroy(rig.node, rig.p, q.queue_id)), q)
                    for i, q in enumerate(rig.queues)})
        rig.submit(fence(DATA, 1) + struct.pack("<I", 0xFF), q=0)
        rig.submit(fence(DATA + 4, 2), q=1)
        await until(lambda: len(destroyed) == 2 and not edge._running)
        assert edge._touched == {}

    run_edge(rig, body)
    assert destroyed == [0, 0] and logged == [1]
    assert rig.word(DATA) == 1 and rig.word(DATA + 4) == 2
    assert rig.word(RPTR, 8) == 16 and rig.word(RPTR + 16, 8) == 16  # (the write-backs)
    (line,) = _errors(caplog)
    assert f"pid {rig.p.pid} queue {bad.queue_id} (sdma" in line.lower(), line
    assert "ring offset 0x10" in line, line
    errors = [r for r in seen if isinstance(r, QueueRecord) and r.event == "error"]
    assert [r.queue_id for r in errors] == [bad.queue_id], errors
    assert good.error is None


def _bad_aql_queue(rig: Rig, inactive_signal: int) -> queues.KfdQueue:
    """An AQL queue laid out as ROCr's amd_queue_t, its inactive signal at
    `inactive_signal` (its event's mailbox MAILBOX), with one packet of type 23 (hsa.h
    defines none) written: its doorbell is still to ring."""
    res, out = create(rig.node, rig.p, rig.g0, queue_type=AQL, ring_base_address=AQL_RING,
                      ring_size=4096, read_pointer_address=AMDQ + aql.AMD_QUEUE_READ_DISPATCH_ID,
                      write_pointer_address=AMDQ + aql.AMD_QUEUE_WRITE_DISPATCH_ID)
    assert res == 0
    q = rig.node.kfd.queues.get(rig.p.pid, out.queue_id, 0)
    mem = rig.gtt.memory
    mem.write(AMDQ + aql.AMD_QUEUE_READ_DISPATCH_ID_FIELD_BASE_BYTE_OFFSET - BASE,
              struct.pack("<I", aql.AMD_QUEUE_READ_DISPATCH_ID))
    mem.write(AMDQ + aql.AMD_QUEUE_INACTIVE_SIGNAL - BASE, struct.pack("<Q", inactive_signal))
    mem.write(SIGNAL - BASE, struct.pack("<qqQI", 1, 0, MAILBOX, EVENT_ID))
    mem.write(AQL_RING - BASE, struct.pack("<H", 23).ljust(aql.AQL_PACKET_SIZE, b"\0"))
    mem.write(AMDQ + aql.AMD_QUEUE_WRITE_DISPATCH_ID - BASE, struct.pack("<Q", 1))
    return q


def _memory_event(rig: Rig) -> int:
    """A memory-exception event of the process (KFD_IOC_EVENT_MEMORY): what
    kfd_signal_vm_fault_event sets."""
    ev = call(rig.node, rig.p, tbl.KFD_CREATE_EVENT.cmd,
              struct.pack("<QIIIIII", 0, 0, queues.KFD_IOC_EVENT_MEMORY, 0, 0, 0, 0))
    assert ev.result == 0
    return int(struct.unpack_from("<I", ev.out, 8)[0])


def test_a_fault_while_telling_an_aql_error_is_told_too(caplog):
    """The inactive signal's pointer names memory the GPU VM does not map: the processor
    reaches INVALID_PACKET_FORMAT (told at that step), then faults storing the code into
    the signal. The fault is a second error, told as any GPU fault is: its own line,
    gpu_faults, the process's memory event (kfd_signal_vm_fault_event). (Before: the first
    error was told at its step and the fault after it dropped silently.)"""
    caplog.set_level(logging.WARNING, logger="ualinkd.gpu_engine")
    rig = Rig()
    q = _bad_aql_queue(rig, UNMAPPED)
    mem_id = _memory_event(rig)
    driver = rig.p.pdds[rig.g0].node.driver
    before = driver.gpu_faults

    async def body(edge: GpuEngineEdge) -> None:
        rig.p.pdds[rig.g0].doorbells().memory.write(q.doorbell_slot, (0).to_bytes(8, "little"))
        await until(lambda: len(_errors(caplog)) == 2 and not edge._running)

    run_edge(rig, body)
    first, fault = _errors(caplog)
    assert "queue error 32 (INVALID_FORMAT)" in first, first
    assert f"GPU page fault: write at VA {UNMAPPED + aql.AMD_SIGNAL_VALUE:#x}" in fault, fault
    assert driver.gpu_faults == before + 1
    assert rig.p.events[mem_id].signaled
    assert "GPU page fault" in (q.error or "")


def _finish(gen: EngineRun, answers: list[object]) -> RunEnd:
    """Run an engine generator to its end, answering its requests in turn."""
    answer: object = None
    try:
        for answer in [None, *answers]:
            gen.send(answer)
    except StopIteration as stop:
        assert isinstance(stop.value, RunEnd)
        return stop.value
    raise AssertionError("the run asked more than was answered")


def test_an_engine_keeps_the_error_it_reached_as_one_run_end():
    """aql.py and sdma.py keep a queue's error the same way (the edge reads it after each
    step of a run, to report it at the step that reached it): a RunEnd, returned again,
    unchanged and without a request, by every later run."""
    ring = sdma.SdmaRing(AQL_RING, 4096, AMDQ, AMDQ + 8)
    end = _finish(ring.run(4), [struct.pack("<I", 0xFF)])
    assert end.reason is EndReason.ERROR and ring.error is end
    assert _finish(ring.run(8), []) is end

    q = aql.AqlQueue(AQL_RING, 4096, AMDQ + 0x800, AMDQ)  # (no amd_queue_t: nowhere to report)
    end = _finish(q.run(0), [struct.pack("<Q", 1),
                             struct.pack("<H", 23).ljust(aql.AQL_PACKET_SIZE, b"\0")])
    assert end.reason is EndReason.ERROR and q.error is end
    assert "packet type 23" in (end.error or "")
    assert _finish(q.run(0), []) is end
