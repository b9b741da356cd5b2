"""Bad input on the engine edge (issue 30 "Bad input": the daemon never hangs): a run whose
requests all answer without suspending (local GTT memory) still lets the node's other
tasks in, and DESTROY_QUEUE stops it mid-packet."""

from __future__ import annotations

import struct
import time

import trio
from test_gpu_engine_edge import DATA, Rig, run_edge

from ualinkd.gpu_engine import GpuEngineEdge


def copy_rect(src: int, dst: int, pitch: int, rx: int, ry: int, rz: int) -> bytes:
    """COPY_LINEAR_SUB_WIND (vega10_sdma_pkt_open.h SDMA_PKT_COPY_LINEAR_SUBWIN) of 1-byte
    elements, both sides at x=y=z=0 with a row pitch of `pitch` elements and a slice
    pitch of 1; the rect fields hold value - 1."""
    return struct.pack("<13I", 1 | 4 << 8, src & 0xFFFF_FFFF, src >> 32, 0, (pitch - 1) << 13,
                       0, dst & 0xFFFF_FFFF, dst >> 32, 0, (pitch - 1) << 13, 0,
                       (rx - 1) | (ry - 1) << 16, rz - 1)


def test_a_huge_copy_rect_does_not_hold_the_node_and_destroy_stops_it():
    """A COPY_LINEAR_RECT of 16384 rows x 8 slices whose rows never join (pitch 2, one
    byte each: 131072 row copies in local memory, each answered without a trio checkpoint,
    several seconds here; 16384 x 2048, the most a packet asks, is 256 times that) —
    before the fix the edge ran it in one go and the trio thread served nothing else (no
    ioctl needing trio, no other queue) until it ended. Now another task is scheduled
    within a fraction of a second all along, and DESTROY_QUEUE ends the run."""
    rig = Rig()
    worst: list[float] = []

    async def body(edge: GpuEngineEdge) -> None:
        rig.submit(copy_rect(DATA, DATA + 65536, 2, 1, 16384, 8))
        t0 = time.monotonic()
        while time.monotonic() - t0 < 1.0:
            a = time.monotonic()
            await trio.sleep(0.001)
            worst.append(time.monotonic() - a)
        q = rig.queues[0]
        assert q in edge._running and q.packets == 0, "the run should still be in its packet"
        rig.node.kfd.queues.destroy(rig.p.pid, q.queue_id)
        while edge._running:
            await trio.sleep(0.001)

    run_edge(rig, body)
    assert max(worst) < 0.5, max(worst)


def test_a_dense_copy_rect_reaches_the_edge_in_pieces_and_faults_at_the_first():
    """sdma.py CopyLinearRect.rows: a dense window (rows and slices each continuing where
    the one before ended) is joined only up to RECT_RUN_MAX bytes per Copy. Before, the
    whole window was one Copy, yielded after its last row: the most a packet asks (16384
    16-byte elements x 16384 rows x 2048 slices, 2^43 bytes in 2^25 rows) kept the trio
    thread in rows() for minutes before the first request, and its unmapped start faulted
    only then. Here 16 MiB mapped (4 Copies of 4 MiB), then the largest window, which
    faults at its first piece."""
    from sdma_fakes import FakeVm, Producer, copy_rect, drive, words

    from ualinkd.amdgpu import engine as eng
    from ualinkd.amdgpu import sdma

    ring_va, src, dst = 0x7F00_0000_0000, 0x10_0000_0000, 0x20_0000_0000
    vm = FakeVm()
    vm.map(ring_va, 4096)
    vm.map(0x7F00_0001_0000, 32)
    vm.map(src, 16 << 20)
    vm.map(dst, 16 << 20)
    ring = sdma.SdmaRing(ring_va, 4096, 0x7F00_0001_0010, 0x7F00_0001_0008)
    prod = Producer(vm, ring_va, 4096)
    # 16384 elements of 16 B = 256 KiB rows, 64 of them, pitch = width: dense, 16 MiB
    db = prod.put(words(copy_rect(4, src, 0, 0, 0, 16384, 64, dst, 0, 0, 0, 16384, 64,
                                  16384, 64, 1)))
    end, reqs = drive(ring.run(db), vm)
    copies = [r for r in reqs if isinstance(r, eng.Copy)]
    assert end.ok and [c.size for c in copies] == [sdma.RECT_RUN_MAX] * 4, copies
    assert copies[0] == eng.Copy(dst, src, 1 << 22)

    ring = sdma.SdmaRing(ring_va, 4096, 0x7F00_0001_0010, 0x7F00_0001_0008)
    prod = Producer(vm, ring_va, 4096)
    unmapped = 0xFFFF_FF00_0000_0000
    db = prod.put(words(copy_rect(4, unmapped, 0, 0, 0, 16384, 16384, dst, 0, 0, 0, 16384,
                                  16384, 16384, 16384, 2048)))
    t0 = time.monotonic()
    end, reqs = drive(ring.run(db), vm)
    assert end.fault is not None and end.fault.va == unmapped, end
    assert time.monotonic() - t0 < 1.0


def test_process_exiting_reads_the_exit_from_proc():
    """gpu_engine.process_exiting: a zombie child is exiting; this process and a pid that
    does not exist are not."""
    import os
    import subprocess

    from ualinkd.gpu_engine import process_exiting

    child = subprocess.Popen(["true"])
    try:
        deadline = time.monotonic() + 10
        while not process_exiting(child.pid) and time.monotonic() < deadline:
            time.sleep(0.01)  # (not reaped: a zombie once it has exited)
        assert process_exiting(child.pid)
    finally:
        child.wait()
    assert not process_exiting(os.getpid())
    assert not process_exiting(2**22 + 1)  # above pid_max's ceiling: never a process


def test_a_fault_of_an_exiting_process_is_no_queue_error(caplog, monkeypatch):
    """A queue whose process is exiting faults (its memory went with exit_mm before the
    kfd fd's release): no GPU queue error line, no VM fault event; the release that
    follows removes the queue. A live process's fault is still one line."""
    import logging

    from test_gpu_engine_edge import UNMAPPED, fence

    from ualinkd import gpu_engine

    caplog.set_level(logging.WARNING, logger="ualinkd.gpu_engine")
    for exiting in (True, False):
        caplog.clear()
        monkeypatch.setattr(gpu_engine, "process_exiting", lambda pid, e=exiting: e)
        rig = Rig()

        async def body(edge: GpuEngineEdge, rig: Rig = rig) -> None:
            rig.submit(fence(UNMAPPED, 1))
            while rig.queues[0] in edge._running or rig.queues[0].processor is None:
                await trio.sleep(0.001)
            await trio.sleep(0.05)

        run_edge(rig, body)
        lines = [r for r in caplog.records if "GPU queue error" in r.getMessage()]
        assert len(lines) == (0 if exiting else 1), (exiting, lines)


def test_a_fault_of_a_process_reaped_already_is_no_queue_error(caplog, monkeypatch):
    """The exit can be over before the engine looks (/proc/<pid> gone: reaped, its pidfd
    watch not yet heard): a fault of a queue whose process's exact identity is gone is the
    exit's too, no queue error (CI saw four such lines when 1000 abandoned queues raced
    their processes' exits). The identity, not the pid, says so: a pid given to another
    process since is still gone for it."""
    import dataclasses
    import logging
    import subprocess

    from test_gpu_engine_edge import UNMAPPED, fence

    from ualinkd import gpu_engine
    from ualinkd.fuse.procfd import process_id

    caplog.set_level(logging.WARNING, logger="ualinkd.gpu_engine")
    child = subprocess.Popen(["sleep", "30"])
    gone = process_id(child.pid)
    child.kill()
    child.wait()  # (reaped: no /proc/<pid>, so process_exiting says no)
    assert gone is not None and not gpu_engine.process_exiting(gone.pid)
    rig = Rig()
    proc = rig.node.kfd.processes[rig.p.pid]
    monkeypatch.setattr(proc, "id", dataclasses.replace(proc.id, incarnation=gone.incarnation,
                                                        pid=gone.pid))

    async def body(edge: GpuEngineEdge) -> None:
        rig.submit(fence(UNMAPPED, 1))
        while rig.queues[0] in edge._running or rig.queues[0].processor is None:
            await trio.sleep(0.001)
        await trio.sleep(0.05)

    run_edge(rig, body)
    assert not [r for r in caplog.records if "GPU queue error" in r.getMessage()]


def test_a_doorbell_going_backwards_is_named_so():
    """A doorbell below what the engine already consumed is a queue error whose one line
    says the write pointer went backwards (it said "beyond what the ring holds")."""
    from sdma_fakes import FakeVm, Producer, drive, fence, words

    from ualinkd.amdgpu import sdma

    vm = FakeVm()
    vm.map(0x7F00_0000_0000, 4096)
    vm.map(0x7F00_0001_0000, 64)
    ring = sdma.SdmaRing(0x7F00_0000_0000, 4096, 0x7F00_0001_0010, 0x7F00_0001_0008)
    prod = Producer(vm, 0x7F00_0000_0000, 4096)
    assert drive(ring.run(prod.put(words(fence(0x7F00_0001_0020, 1)))), vm)[0].ok
    end, _ = drive(ring.run(8), vm)
    assert end.error == ("doorbell 0x8 behind the read pointer 0x10 (a write pointer that "
                         "went backwards)"), end
