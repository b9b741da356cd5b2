"""The engine edge (ualinkd/gpu_engine.py) on a real NodeCore, its KFD queues and the SDMA
engine (issue 30 items 2 and "Bad input"): a doorbell store in a process's doorbell slice
runs the queue against the process's GPU VM; a doorbell past the ring or not dword aligned,
an illegal packet and a GPU page fault stop that queue only, with one log line naming
process, queue and ring offset; a fault counts in gpu_faults and sets the process's memory
events (kfd_signal_vm_fault_event); TRAP signals the event its context id names
(kfd_signal_event_interrupt) or, for an unknown id, every slot not UNSIGNALED; another
process's doorbell page does not ring this process's queues; a process that goes while
its queue waits on a poll leaves nothing behind."""

from __future__ import annotations

import logging
import struct
from collections.abc import Awaitable, Callable, Generator

import trio
import trio.testing
from test_kfd_queues import BASE, RING, RPTR, WPTR, create, mapped_node
from test_kfd_rules import call

from ualinkd.abi import ioctls as tbl
from ualinkd.amdgpu import sdma
from ualinkd.amdgpu.engine import EndReason, Read, Request, RunEnd
from ualinkd.amdkfd import chardev, queues
from ualinkd.drm.device import Caller
from ualinkd.gpu_engine import GpuEngineEdge

SDMA = 1
DATA = BASE + (1 << 20) + 4096  # scratch words in the mapped GTT
UNMAPPED = BASE + (64 << 20)


def fence(addr: int, value: int) -> bytes:
    return struct.pack("<IIII", 5, addr & 0xFFFF_FFFF, addr >> 32, value)


def forever_poll(va: int) -> bytes:
    """POLL_REGMEM of the dword at `va` until it equals 0 (mask 0xFFFFFFFF), retry 0xFFF:
    forever, as ROCr's dependency poll (interval 10)."""
    return struct.pack("<6I", 8 | 3 << 28 | 1 << 31, va & 0xFFFF_FFFF, va >> 32, 0,
                       0xFFFF_FFFF, 10 | 0xFFF << 16)


def copy(dst: int, src: int, n: int) -> bytes:
    return struct.pack("<7I", 1, n - 1, 0, src & 0xFFFF_FFFF, src >> 32,
                       dst & 0xFFFF_FFFF, dst >> 32)


class Rig:
    """A node whose process has SDMA queues on the first GPU, and the pieces of memory
    the client would store to: the ring / data GTT BO and the doorbell slice."""

    def __init__(self, nqueues: int = 1) -> None:
        self.node, self.p, (self.g0, _), _, self.mem = mapped_node()
        self.gtt = self.p.pdds[self.g0].mems[0].bo
        self.queues = []
        for i in range(nqueues):
            res, out = create(self.node, self.p, self.g0, queue_type=SDMA,
                              ring_base_address=RING + i * 4096,
                              read_pointer_address=RPTR + i * 16,
                              write_pointer_address=WPTR + i * 16)
            assert res == 0
            self.queues.append(self.node.kfd.queues.get(self.p.pid, out.queue_id, 0))
        self.index = [0] * nqueues

    def word(self, va: int, size: int = 4) -> int:
        return int.from_bytes(self.gtt.memory.read(va - BASE, size), "little")

    def submit(self, packets: bytes, q: int = 0, doorbell: int | None = None) -> None:
        """The producer: packets at the ring position, then the doorbell store."""
        pos = self.index[q] % 4096
        self.gtt.memory.write(RING + q * 4096 + pos - BASE, packets)
        self.index[q] += len(packets)
        value = self.index[q] if doorbell is None else doorbell
        bo = self.p.pdds[self.g0].doorbells()
        bo.memory.write(self.queues[q].doorbell_slot, value.to_bytes(8, "little"))


def run_edge(rig: Rig, body: Callable[[GpuEngineEdge], Awaitable[None]]) -> None:
    async def main() -> None:
        edge = GpuEngineEdge(rig.node)
        async with trio.open_nursery() as n:
            await n.start(edge.run)
            with trio.fail_after(10):
                await body(edge)
            n.cancel_scope.cancel()

    trio.run(main)


async def until(pred: Callable[[], object]) -> None:
    while not pred():
        await trio.sleep(0.001)


def test_a_doorbell_runs_the_queue_through_the_gpu_vm():
    """A COPY and a FENCE in GTT memory the VM maps: the bytes copied, the fence written,
    the rptr written back to the queue's read-pointer word, the packets counted."""
    rig = Rig()
    rig.gtt.memory.write(DATA - BASE, b"abcdefgh")

    async def body(edge: GpuEngineEdge) -> None:
        rig.submit(copy(DATA + 64, DATA, 8) + fence(DATA + 128, 7))
        await until(lambda: rig.word(DATA + 128) == 7)
        await until(lambda: rig.word(RPTR, 8) == rig.index[0])

    run_edge(rig, body)
    assert rig.gtt.memory.read(DATA + 64 - BASE, 8) == b"abcdefgh"
    q = rig.queues[0]
    assert q.packets == 2 and q.rptr == rig.index[0] == q.last_doorbell
    assert q.state is queues.KfdQueueState.ACTIVE


def test_bad_doorbells_and_packets_stop_that_queue_only(caplog):
    """A doorbell beyond what the ring holds, one not dword aligned, an unknown opcode:
    each stops its own queue (state error, one warning naming pid, queue and ring offset);
    the fourth queue goes on."""
    rig = Rig(4)
    caplog.set_level(logging.WARNING, logger="ualinkd.gpu_engine")

    async def body(edge: GpuEngineEdge) -> None:
        rig.submit(fence(DATA, 1), q=0, doorbell=4096 * 2)
        rig.submit(fence(DATA + 4, 1), q=1, doorbell=6)
        rig.submit(struct.pack("<I", 0xFF) + fence(DATA + 8, 1), q=2)
        rig.submit(fence(DATA + 12, 1), q=3)
        await until(lambda: all(q.error for q in rig.queues[:3]))
        await until(lambda: rig.word(DATA + 12) == 1)

    run_edge(rig, body)
    assert [rig.word(DATA + 4 * i) for i in range(4)] == [0, 0, 0, 1]
    lines = [r.getMessage() for r in caplog.records if "GPU queue error" in r.getMessage()]
    assert len(lines) == 3, lines
    for q, line in zip(rig.queues[:3], sorted(lines), strict=True):
        assert f"pid {rig.p.pid} queue {q.queue_id} (sdma" in line and "ring offset" in line
    assert "beyond" in " ".join(lines) and "aligned" in " ".join(lines)
    assert rig.queues[3].state is queues.KfdQueueState.ACTIVE


def test_a_gpu_fault_stops_the_queue_counts_and_sets_memory_events(caplog):
    """COPY from a VA the VM does not map: the queue stops in error, gpu_faults counts
    one fault, the process's memory-exception event is set, its signal event is not."""
    rig = Rig()
    node, p = rig.node, rig.p
    mem_ev = call(node, p, tbl.KFD_CREATE_EVENT.cmd,
                  struct.pack("<QIIIIII", 0, 0, queues.KFD_IOC_EVENT_MEMORY, 0, 0, 0, 0))
    sig_ev = call(node, p, tbl.KFD_CREATE_EVENT.cmd,
                  struct.pack("<QIIIIII", 0, 0, 0, 1, 0, 0, 0))
    assert mem_ev.result == 0 and sig_ev.result == 0
    mem_id = struct.unpack_from("<I", mem_ev.out, 8)[0]
    sig_id = struct.unpack_from("<I", sig_ev.out, 8)[0]
    driver = p.pdds[rig.g0].node.driver
    before = driver.gpu_faults

    async def body(edge: GpuEngineEdge) -> None:
        rig.submit(copy(DATA, UNMAPPED, 4096) + fence(DATA + 64, 1))
        await until(lambda: rig.queues[0].error)

    run_edge(rig, body)
    assert driver.gpu_faults == before + 1
    assert "GPU page fault" in (rig.queues[0].error or "")
    assert p.events[mem_id].signaled and not p.events[sig_id].signaled
    assert rig.word(DATA + 64) == 0
    assert sum("GPU queue error" in r.getMessage() for r in caplog.records) == 1


def test_trap_signals_the_event_its_context_names_or_scans_the_page():
    """FENCE(mailbox <- id) + TRAP(id): that event is set and its slot acknowledged
    (written back UNSIGNALED); a TRAP with an id no event has scans the events page and
    sets every event whose slot is not UNSIGNALED."""
    rig = Rig()
    node, p, g0 = rig.node, rig.p, rig.g0
    events_va = BASE + (4 << 20)  # libhsakmt's events page: a GTT allocation, GPU-mapped
    res = call(node, p, tbl.KFD_ALLOC_MEMORY_OF_GPU.cmd, struct.pack(
        "<QQQQII", events_va, 32768, 0, 0, g0,
        chardev.ALLOC_MEM_FLAGS_GTT | chardev.ALLOC_MEM_FLAGS_WRITABLE))
    assert res.result == 0
    handle = struct.unpack_from("<Q", res.out, 16)[0]
    assert call(node, p, tbl.KFD_MAP_MEMORY_TO_GPU.cmd,
                struct.pack("<QQII", handle, 0x100, 1, 0)).result == 0
    page = p.pdds[g0].mems[handle & 0xFFFF_FFFF].bo
    res = call(node, p, tbl.KFD_CREATE_EVENT.cmd,
               struct.pack("<QIIIIII", handle, 0, 0, 1, 0, 0, 0))
    assert res.result == 0
    ids = [struct.unpack_from("<I", res.out, 8)[0]]
    for _ in range(2):
        r = call(node, p, tbl.KFD_CREATE_EVENT.cmd, struct.pack("<QIIIIII", 0, 0, 0, 1, 0, 0, 0))
        ids.append(struct.unpack_from("<I", r.out, 8)[0])

    def slot_value(i: int) -> int:
        return int.from_bytes(page.memory.read(8 * i, 8), "little")

    def trap(ctx: int) -> bytes:
        return struct.pack("<II", 6, ctx)

    async def body(edge: GpuEngineEdge) -> None:
        rig.submit(fence(events_va + 8 * ids[1], ids[1]) + trap(ids[1]))
        await until(lambda: p.events[ids[1]].signaled)
        assert not p.events[ids[2]].signaled
        assert slot_value(ids[1]) == queues.UNSIGNALED_EVENT_SLOT  # acknowledged
        rig.submit(fence(events_va + 8 * ids[2], 0) + fence(events_va + 8 * ids[2] + 4, 0)
                   + trap(0x0FFF_FFF0))
        await until(lambda: p.events[ids[2]].signaled)

    run_edge(rig, body)
    assert not p.events[ids[0]].signaled


def test_a_foreign_doorbell_page_does_not_ring_and_a_gone_process_leaves_nothing():
    """Another process's doorbell slice (its own BO, what mmap of its kfd fd maps) written
    at this queue's slot runs nothing here; a queue blocked on a POLL_REGMEM that never
    passes is torn down with its process (release): no queue, no run left, SDMA queue
    back to the device."""
    rig = Rig()
    other = rig.node.kfd.open(Caller(pid=9191, uid=0))
    slice_other = other.pdds[rig.g0].doorbells()
    assert slice_other is not rig.p.pdds[rig.g0].doorbells()
    slot = rig.queues[0].doorbell_slot
    poll = forever_poll(DATA)
    rig.gtt.memory.write(DATA - BASE, b"\x01\x00\x00\x00")

    async def body(edge: GpuEngineEdge) -> None:
        rig.gtt.memory.write(RING - BASE, fence(DATA + 16, 5))
        slice_other.memory.write(slot, (16).to_bytes(8, "little"))
        await trio.sleep(0.3)
        assert rig.word(DATA + 16) == 0 and rig.queues[0].last_doorbell == chardev.DOORBELL_ARMED
        rig.gtt.memory.write(RING - BASE, b"\x00" * 16)  # the real producer's ring
        rig.submit(poll)
        await until(lambda: edge._running)
        await trio.sleep(0.05)
        rig.node.kfd.release(rig.p)
        await until(lambda: not edge._running)

    run_edge(rig, body)
    assert rig.node.kfd.queues.pqms == {}
    assert rig.node.kfd.queues.dqms[rig.g0].sdma_used == set()
    assert rig.node.kfd.queues.dqms[rig.g0].total_queue_count == 0
    rig.node.kfd.release(other)


def test_a_forever_poll_is_rechecked_at_a_bounded_rate_and_released_by_the_cpu():
    """A POLL_REGMEM with retry 0xFFF (forever) on a word the CPU holds: the queue is
    re-checked by its run task at most every POLL_MAX_DELAY once the poll is old (about 50
    re-checks in 0.5 s, not a busy loop, and no scan each time); the CPU's store releases
    it and the fence after it lands."""
    rig = Rig()
    poll = forever_poll(DATA)
    rig.gtt.memory.write(DATA - BASE, b"\x01\x00\x00\x00")

    async def body(edge: GpuEngineEdge) -> None:
        rig.submit(poll + fence(DATA + 16, 9))
        await until(lambda: edge.poll_rechecks > 0)
        ticks, rechecks = edge.ticks, edge.poll_rechecks
        await trio.sleep(0.5)
        assert 10 < edge.poll_rechecks - rechecks < 150, edge.poll_rechecks - rechecks
        assert edge.ticks - ticks < 10, edge.ticks - ticks
        assert rig.word(DATA + 16) == 0
        rig.gtt.memory.write(DATA - BASE, b"\x00\x00\x00\x00")
        await until(lambda: rig.word(DATA + 16) == 9)

    run_edge(rig, body)
    assert rig.queues[0].state is queues.KfdQueueState.ACTIVE


def test_a_poll_after_a_released_one_is_rechecked_young():
    """Two forever polls in a row (a chain of dependencies): once the first, old one (its
    re-checks 10 ms apart) is released, the run stops at the second, which is re-checked
    from MIN_INTERVAL again (several re-checks in its first 30 ms, where an old poll's
    pace gives 3); releasing it lets the fence land."""
    rig = Rig()
    rig.gtt.memory.write(DATA - BASE, b"\x01\x00\x00\x00\x01\x00\x00\x00")

    async def body(edge: GpuEngineEdge) -> None:
        rig.submit(forever_poll(DATA) + forever_poll(DATA + 4) + fence(DATA + 16, 9))
        await until(lambda: edge.poll_rechecks > 20)  # old: 10 ms apart
        rig.gtt.memory.write(DATA - BASE, b"\x00\x00\x00\x00")
        await until(lambda: rig.queues[0].processor.rptr == 24)  # type: ignore[union-attr]
        rechecks = edge.poll_rechecks
        await trio.sleep(0.03)
        assert edge.poll_rechecks - rechecks >= 5, edge.poll_rechecks - rechecks
        rig.gtt.memory.write(DATA + 4 - BASE, b"\x00\x00\x00\x00")
        await until(lambda: rig.word(DATA + 16) == 9)

    run_edge(rig, body)


def test_a_ring_the_engine_refuses_is_that_queue_s_error():
    """An AQL queue whose 32-byte ring holds no 64-byte packet (CREATE_QUEUE accepts any
    power of two): its first doorbell is a queue error with one log line, the edge and
    the node go on (the SDMA queue beside it runs)."""
    rig = Rig()
    res, out = create(rig.node, rig.p, rig.g0, queue_type=2, ring_size=32,
                      ring_base_address=RING + 8192, read_pointer_address=RPTR + 64,
                      write_pointer_address=WPTR + 64)
    assert res == 0
    aql = rig.node.kfd.queues.get(rig.p.pid, out.queue_id, 0)

    async def body(edge: GpuEngineEdge) -> None:
        rig.p.pdds[rig.g0].doorbells().memory.write(aql.doorbell_slot,
                                                     (1).to_bytes(8, "little"))
        await until(lambda: aql.error)
        rig.submit(fence(DATA, 3))
        await until(lambda: rig.word(DATA) == 3)

    run_edge(rig, body)
    assert aql.state is queues.KfdQueueState.ERROR


def test_update_queue_moves_the_ring_and_the_engine_goes_on_from_its_rptr():
    """UPDATE_QUEUE with a new ring base (pqm_update_queue_properties -> update_mqd): the
    next doorbell runs the packets at the same position in the new ring, from the rptr
    the engine had (the MQD keeps it); percentage 0 makes the queue inactive: its
    doorbell is not run until the percentage is back."""
    rig = Rig()
    new_ring = RING + 3 * 4096
    upd = tbl.KFD_UPDATE_QUEUE.cmd
    qid = rig.queues[0].queue_id

    def update(ring: int, pct: int) -> int:
        return call(rig.node, rig.p, upd, struct.pack("<QIIII", ring, qid, 4096, pct, 15)).result

    async def body(edge: GpuEngineEdge) -> None:
        rig.submit(fence(DATA, 1))
        await until(lambda: rig.word(DATA) == 1 and rig.queues[0].rptr == 16)
        assert update(new_ring, 0) == 0
        assert rig.queues[0].state is queues.KfdQueueState.INACTIVE
        pos = rig.index[0] % 4096
        rig.gtt.memory.write(new_ring + pos - BASE, fence(DATA, 2))
        rig.index[0] += 16
        rig.p.pdds[rig.g0].doorbells().memory.write(
            rig.queues[0].doorbell_slot, rig.index[0].to_bytes(8, "little"))
        await trio.sleep(0.2)
        assert rig.word(DATA) == 1  # inactive: not run
        assert update(new_ring, 100) == 0
        await until(lambda: rig.word(DATA) == 2)

    run_edge(rig, body)
    assert rig.queues[0].rptr == 32 and rig.queues[0].error is None


def test_run_in_file_runs_cs_ibs_in_the_file_s_gpu_vm():
    """AMDGPU_CS's runner (issue 35): the edge is each amdgpu device's `cs.runner`; an SDMA
    IB (sdma.run_ib) run in a render file's GPU VM copies and fences with the queues'
    fulfilment (no KFD queue, no packet counted on one); a poll in it backs off and is
    released by the CPU's store; a poll never released ends the run in error after the
    edge's job timeout (real time: amdgpu's lockup_timeout for SDMA jobs), with a bounded
    number of wake-ups; an IB reading an unmapped VA ends in a GPU fault."""
    rig = Rig()
    drm_file = rig.p.pdds[rig.g0].drm_file
    assert drm_file is not None
    ib = DATA + 1024
    rig.gtt.memory.write(DATA - BASE, b"abcdefgh")
    poll = struct.pack("<6I", 8 | 3 << 28 | 1 << 31, (DATA + 32) & 0xFFFF_FFFF,
                       (DATA + 32) >> 32, 0, 0xFFFF_FFFF, 1 | 0xFFF << 16)

    def put_ib(packets: bytes) -> int:
        rig.gtt.memory.write(ib - BASE, packets)
        return len(packets) // 4

    async def body(edge: GpuEngineEdge) -> None:
        assert drm_file.device.driver.cs.runner == edge.run_in_file  # type: ignore[attr-defined]
        n = put_ib(copy(DATA + 64, DATA, 8) + fence(DATA + 128, 7))
        end = await edge.run_in_file(drm_file, sdma.run_ib(ib, n))
        assert end.reason is EndReason.CAUGHT_UP, end
        assert rig.gtt.memory.read(DATA + 64 - BASE, 8) == b"abcdefgh"
        assert rig.word(DATA + 128) == 7
        # a poll the CPU releases after 50 ms
        rig.gtt.memory.write(DATA + 32 - BASE, b"\x01\x00\x00\x00")
        n = put_ib(poll + fence(DATA + 128, 8))

        async def release() -> None:
            await trio.sleep(0.05)
            rig.gtt.memory.write(DATA + 32 - BASE, b"\x00\x00\x00\x00")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(release)
            end = await edge.run_in_file(drm_file, sdma.run_ib(ib, n))
        assert end.reason is EndReason.CAUGHT_UP and rig.word(DATA + 128) == 8, end
        # a poll never released: the job timeout, in real time, not a busy loop
        rig.gtt.memory.write(DATA + 32 - BASE, b"\x01\x00\x00\x00")
        edge.job_timeout = 0.3
        reads = 0
        gen = sdma.run_ib(ib, n)

        def counted() -> Generator[Request, object, RunEnd]:
            nonlocal reads
            answer: object = None
            while True:
                try:
                    req = gen.send(answer)
                except StopIteration as stop:
                    return stop.value  # type: ignore[no-any-return]
                reads += isinstance(req, Read)
                answer = yield req

        t0 = trio.current_time()
        end = await edge.run_in_file(drm_file, counted())
        assert end.reason is EndReason.ERROR and "timed out" in (end.error or ""), end
        assert 0.3 <= trio.current_time() - t0 < 2 and reads < 60, reads
        # an IB reading an unmapped VA: a GPU fault
        n = put_ib(copy(DATA + 64, UNMAPPED, 8))
        end = await edge.run_in_file(drm_file, sdma.run_ib(ib, n))
        assert end.reason is EndReason.ERROR and end.fault is not None, end
        assert end.fault.va == UNMAPPED and not end.fault.write

    run_edge(rig, body)


def test_another_queue_s_fence_releases_an_old_poll_at_once():
    """One engine's fence is another's dependency (ROCr's SDMA and AQL queues wait on each
    other's signals): queue 0 polls a word, long enough that its re-checks are 10 ms apart;
    queue 1's FENCE writes the word; queue 0 is re-checked as queue 1's run ends, not at
    its back-off's next tick. Measured on trio's virtual clock (MockClock, no real time):
    the fence after the poll lands within 2 ms of queue 1's doorbell scan, where the
    back-off alone would take ~7 ms more."""
    rig = Rig(nqueues=2)
    poll = forever_poll(DATA)
    rig.gtt.memory.write(DATA - BASE, b"\x01\x00\x00\x00")
    landed: list[float] = []

    async def main() -> None:
        edge = GpuEngineEdge(rig.node)
        async with trio.open_nursery() as n:
            await n.start(edge.run)
            with trio.fail_after(10):
                rig.submit(poll + fence(DATA + 16, 9), q=0)
                await until(lambda: edge.poll_rechecks > 20)
                await trio.sleep(0.0031)  # (between two of its 10 ms re-checks)
                rig.submit(fence(DATA, 0), q=1)
                edge._wake.set()  # (the watch thread's real-time wake-up, on virtual time)
                t0 = trio.current_time()
                await until(lambda: rig.word(DATA + 16) == 9)
                landed.append(trio.current_time() - t0)
            n.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert landed and landed[0] < 0.003, landed  # (until() looks every 1 ms)


def test_a_queue_blocked_on_a_poll_waits_while_inactive_and_goes_on_once_active():
    """A queue blocked on a forever POLL_REGMEM (ROCr's dependency poll) that UPDATE_QUEUE
    makes inactive (percentage 0, pqm_update_queue_properties) is not run while inactive,
    even once the CPU released the word; made active again, its poll is re-checked and the
    fence after it lands, without a doorbell (its run task is the one that waits)."""
    rig = Rig()
    upd = tbl.KFD_UPDATE_QUEUE.cmd
    qid = rig.queues[0].queue_id
    poll = forever_poll(DATA + 32)
    rig.gtt.memory.write(DATA + 32 - BASE, b"\x01\x00\x00\x00")

    def update(pct: int) -> int:
        return call(rig.node, rig.p, upd, struct.pack("<QIIII", RING, qid, 4096, pct, 15)).result

    async def body(edge: GpuEngineEdge) -> None:
        rig.submit(poll + fence(DATA, 7))
        await until(lambda: edge.poll_rechecks > 2)
        assert rig.word(DATA) == 0
        assert update(0) == 0
        rig.gtt.memory.write(DATA + 32 - BASE, b"\x00\x00\x00\x00")  # the CPU releases it
        await trio.sleep(0.2)
        assert rig.word(DATA) == 0  # inactive: not run
        assert update(100) == 0
        await until(lambda: rig.word(DATA) == 7)

    run_edge(rig, body)
    assert rig.queues[0].error is None


def _doorbell_thread_wakeups() -> int:
    """How many times the kernel has run the watch thread ("ualinkd-doorbells"): the third
    field of its /proc schedstat (timeslices run, one per wake-up of a sleeping thread)."""
    import threading
    from pathlib import Path
    (tid,) = [t.native_id for t in threading.enumerate() if t.name == "ualinkd-doorbells"]
    return int(Path(f"/proc/self/task/{tid}/schedstat").read_text().split()[2])


def test_with_no_queue_to_watch_the_watch_thread_never_wakes():
    """An idle node (no queue; then a queue that waited for a doorbell and was destroyed)
    pays no timer wake-up for its engine: the watch thread sleeps until a scan gives it
    slots to poll (it woke every WATCH_MAX_INTERVAL, 20 times a second: 27% of a CPU for
    a 256-node pod's idle daemons on one host). With a queue waiting it polls, and a
    doorbell still runs it. (Wake-ups are the kernel's count: /proc schedstat.)"""
    rig = Rig(nqueues=0)

    async def body(edge: GpuEngineEdge) -> None:
        await trio.sleep(0.05)
        before = _doorbell_thread_wakeups()
        await trio.sleep(1.0)
        assert _doorbell_thread_wakeups() - before <= 2
        # a queue: watched (polled), and its doorbell runs it
        res, out = create(rig.node, rig.p, rig.g0, queue_type=SDMA, ring_base_address=RING,
                          read_pointer_address=RPTR, write_pointer_address=WPTR)
        assert res == 0
        rig.queues.append(rig.node.kfd.queues.get(rig.p.pid, out.queue_id, 0))
        rig.index.append(0)
        rig.p.pdds[rig.g0].doorbells()
        await until(lambda: edge._watched)
        rig.submit(fence(DATA, 7))
        await until(lambda: rig.word(DATA) == 7)
        # destroyed: nothing left to watch, and the thread sleeps again
        rig.node.kfd.queues.destroy(rig.p.pid, out.queue_id)
        await until(lambda: not edge._watched)
        await trio.sleep(0.05)
        before = _doorbell_thread_wakeups()
        await trio.sleep(1.0)
        assert _doorbell_thread_wakeups() - before <= 2

    run_edge(rig, body)


def test_a_wait_for_events_looks_at_the_process_s_doorbells_at_once(monkeypatch):
    """Issue 34 (doorbell→fence): a process with queues that starts WAIT_EVENTS is
    told to the engine (QueueRegistry.waiting), which scans its doorbells then rather than
    at the watch thread's next poll, so work rung just before the wait runs at once. With
    the watch's polls slowed to a minute, only that scan can run the fence here; a process
    without queues tells nobody."""
    from test_kfd_rules import wait_args

    from ualinkd import gpu_engine

    for name in ("WATCH_INTERVAL_NS", "WATCH_SLOW_INTERVAL_NS"):
        monkeypatch.setattr(gpu_engine, name, 60_000_000_000)
    monkeypatch.setattr(gpu_engine, "WATCH_MAX_INTERVAL", 60.0)
    rig = Rig()
    told: list[int] = []
    rig.node.kfd.queues.waiting.append(told.append)

    async def body(edge: GpuEngineEdge) -> None:
        await trio.sleep(0.1)  # the trio ticks back off; the (slowed) watch thread polls
        rig.submit(fence(DATA, 9))
        await trio.sleep(0.05)
        assert rig.word(DATA) == 0  # not seen by any poll
        assert call(rig.node, rig.p, tbl.KFD_WAIT_EVENTS.cmd,
                    wait_args(rig.mem, [])).result == 0
        assert told == [rig.p.pid]
        await until(lambda: rig.word(DATA) == 9)

    run_edge(rig, body)
    other = rig.node.kfd.open(Caller(pid=9292, uid=0))
    assert call(rig.node, other, tbl.KFD_WAIT_EVENTS.cmd, wait_args(rig.mem, [])).result == 0
    assert told == [rig.p.pid]
    rig.node.kfd.release(other)


def test_a_run_that_ends_puts_the_doorbell_tick_back_to_its_shortest():
    """Issue 34 (doorbell→fence): a runtime rings again as soon as it has seen its work
    done, so a queue's run that ends makes the loop look at the doorbells again from
    MIN_INTERVAL, backing off to MAX_INTERVAL (a few scans, then the watch thread), as
    after a doorbell — not only once. Here the run is released from a long poll, while
    the loop had long backed off."""
    rig = Rig()
    poll = forever_poll(DATA)
    rig.gtt.memory.write(DATA - BASE, b"\x01\x00\x00\x00")

    async def body(edge: GpuEngineEdge) -> None:
        rig.submit(poll + fence(DATA + 16, 9))
        await until(lambda: edge.poll_rechecks > 5)
        await trio.sleep(0.05)  # (the loop has backed off to the watch thread)
        ticks = edge.ticks
        rig.gtt.memory.write(DATA - BASE, b"\x00\x00\x00\x00")  # the CPU releases it
        await until(lambda: rig.word(DATA + 16) == 9 and not edge._running)
        await trio.sleep(0.1)
        # 50, 100, 200, ... µs up to MAX_INTERVAL: about 6 scans (1 before), then none
        assert 4 <= edge.ticks - ticks <= 12, edge.ticks - ticks

    run_edge(rig, body)


def test_a_doorbell_rung_while_its_queue_runs_goes_on_in_the_same_task():
    """Issue 34 (doorbell→fence): a runtime rings its next submission as soon as it has
    seen its fence, often before the run has written its rptr back; the run's task goes on
    with the new doorbell (counted and traced as a scan's) instead of ending and leaving it
    to the scan it wakes. Both submissions run, in one task."""
    from ualinkd.amdgpu.engine import Write

    rig = Rig()

    async def body(edge: GpuEngineEdge) -> None:
        starts: list[int] = []
        start, fulfil = edge._start, edge._fulfil

        def counted_start(q: queues.KfdQueue, value: int) -> None:
            starts.append(value)
            start(q, value)

        async def fulfil_and_ring(q, req):  # the client rings once it sees the first fence
            out = await fulfil(q, req)
            if isinstance(req, Write) and req.va == DATA and not rig.word(DATA + 4):
                rig.submit(fence(DATA + 4, 2))
            return out

        edge._start = counted_start  # type: ignore[method-assign]
        edge._fulfil = fulfil_and_ring  # type: ignore[method-assign]
        rig.submit(fence(DATA, 1))
        await until(lambda: rig.word(DATA + 4) == 2 and not edge._running)
        assert starts == [16]  # (one task for both: the scan started only the first)
        q = rig.queues[0]
        assert (q.doorbells, q.packets, q.last_doorbell) == (2, 2, 32)
        await until(lambda: rig.word(RPTR, 8) == 32)

    run_edge(rig, body)


def test_scans_while_every_queue_runs_leave_the_watch_thread_asleep():
    """Issue 34 (SDMA remote copy): while the only queue is in a run (here blocked on a
    forever poll; a long copy alike) no doorbell is watched, and a scan of the loop (each
    a tick after a doorbell, a wait for events, a queue update) leaves the watch thread
    parked on the empty snapshot it has: it woke on every scan, two context switches and
    a GIL hand-over each, on the CPU the copy needs. (Wake-ups: /proc schedstat.)"""
    import threading
    from pathlib import Path

    # (the Thread objects, not their idents: glibc hands an exited thread's stack, and so
    # its ident, to the next thread started, an earlier test's watch thread's to this one)
    earlier = set(threading.enumerate())
    rig = Rig()
    poll = forever_poll(DATA)
    rig.gtt.memory.write(DATA - BASE, b"\x01\x00\x00\x00")

    async def body(edge: GpuEngineEdge) -> None:
        rig.submit(poll + fence(DATA + 16, 9))
        await until(lambda: edge.poll_rechecks > 0 and not edge._watched)
        # (this edge's watch thread: an earlier test's may still be on its way out)
        (tid,) = [t.native_id for t in threading.enumerate()
                  if t.name == "ualinkd-doorbells" and t not in earlier]
        schedstat = Path(f"/proc/self/task/{tid}/schedstat")
        await trio.sleep(0.05)
        ticks, before = edge.ticks, int(schedstat.read_text().split()[2])
        for _ in range(30):
            edge._wake.set()
            await trio.sleep(0.003)
        assert edge.ticks - ticks >= 30
        assert int(schedstat.read_text().split()[2]) - before <= 3
        rig.gtt.memory.write(DATA - BASE, b"\x00\x00\x00\x00")  # released: fence lands
        await until(lambda: rig.word(DATA + 16) == 9)

    run_edge(rig, body)


def test_while_every_queue_runs_the_loop_does_not_tick():
    """Issue 34 (SDMA remote copy): with every queue in a run (here the only one, blocked
    on a forever poll; a long copy alike) a scan finds nothing to look at, so after a
    doorbell the loop waits for a wake-up (a run ending, a queue changing, a wait for
    events) instead of ticking its back-off, 50 µs up to MAX_INTERVAL (~7 scans, each
    on the CPU the copy needs). The run's end still puts the tick back (its queue is then
    watched again) and the fence after the poll lands."""
    rig = Rig()
    poll = forever_poll(DATA)
    rig.gtt.memory.write(DATA - BASE, b"\x01\x00\x00\x00")

    async def body(edge: GpuEngineEdge) -> None:
        ticks = edge.ticks
        rig.submit(poll + fence(DATA + 16, 9))
        await until(lambda: edge._running)
        await trio.sleep(0.05)
        assert edge.ticks - ticks <= 3, edge.ticks - ticks
        ticks = edge.ticks
        rig.gtt.memory.write(DATA - BASE, b"\x00\x00\x00\x00")  # released: fence lands
        await until(lambda: rig.word(DATA + 16) == 9 and not edge._running)
        await until(lambda: edge._watched)  # (its doorbell looked at again)
        assert edge.ticks > ticks

    run_edge(rig, body)
