"""The sans-IO SDMA engine (ualinkd/amdgpu/sdma.py) driven against a fake GPU VM.

Packets are encoded as ROCr 5.2.3's BlitSdmaV4 and the kernel's sdma_v4_0 write them
(userspace-surface §8's table, layouts of vega10_sdma_pkt_open.h); the ring protocol is §8's
"The ring protocol": 64-bit byte indices, consumption to the doorbell value, rptr written back.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sdma_fakes import (
    HDP_FLUSH,
    FakeVm,
    Producer,
    TooManySteps,
    atomic,
    const_fill,
    copy_linear,
    copy_rect,
    drive,
    fence,
    nop,
    poll,
    timestamp,
    timestamp_set,
    trap,
    words,
    write_linear,
)

from ualinkd.amdgpu import engine as eng
from ualinkd.amdgpu import sdma
from ualinkd.amdgpu.engine import AtomicOp, EndReason, QueueState

RING, RING_SIZE = 0x7F00_0000_0000, 4096
RPTR, WPTR = 0x7F00_0001_0010, 0x7F00_0001_0008
HOST, VRAM = 0x7F00_0010_0000, 0x0000_0080_0000_0000
SIGNAL = 0x7F00_0002_0000


def setup(ring_size: int = RING_SIZE, **kw: int) -> tuple[FakeVm, sdma.SdmaRing, Producer]:
    vm = FakeVm()
    vm.map(RING, ring_size)
    vm.map(WPTR - 8, 32)  # libhsakmt's struct queue: id, wptr, rptr
    vm.map(HOST, 1 << 20)
    vm.map(VRAM, 1 << 20)
    vm.map(SIGNAL, 64)
    return vm, sdma.SdmaRing(RING, ring_size, RPTR, WPTR, **kw), Producer(vm, RING, ring_size)


def test_copy_linear_moves_bytes_in_one_request_and_writes_rptr_back() -> None:
    """COPY_LINEAR (count = bytes - 1, src DW3-4, dst DW5-6): one Copy request for the whole
    packet; after the run, *rptr holds the consumed index (§8 ring protocol)."""
    vm, ring, prod = setup()
    payload = bytes(range(256)) * 16
    vm.write(HOST, payload)
    db = prod.put(words(copy_linear(VRAM + 16, HOST, len(payload))))
    end, reqs = drive(ring.run(db), vm)
    assert end.reason is EndReason.CAUGHT_UP and end.offset == 28
    assert vm.read(VRAM + 16, len(payload)) == payload
    copies = [r for r in reqs if isinstance(r, eng.Copy)]
    assert copies == [eng.Copy(VRAM + 16, HOST, len(payload))]
    assert vm.u64(RPTR) == 28 and ring.rptr == 28
    assert ring.packets_done == 1 and ring.state is QueueState.IDLE
    assert reqs[0] == eng.Read(RING, 28)  # the ring's bytes in one Read
    assert eng.Executed(0, sdma.CopyLinear(HOST, VRAM + 16, 4096)) in reqs


def test_rocr_submission_copy_atomic_fence_trap() -> None:
    """One ROCr submission (§8): HDP-flush register poll, copy, ATOMIC ADD_RTN_64 of -1 on
    the signal value, FENCE of the event id to the mailbox, TRAP(event id)."""
    vm, ring, prod = setup()
    vm.write(HOST, b"x" * 100)
    vm.write(SIGNAL + 8, struct.pack("<q", 1))
    mailbox, event_id = SIGNAL + 32, 7
    db = prod.put(words(HDP_FLUSH, copy_linear(VRAM, HOST, 100),
                        atomic(SIGNAL + 8, 0x2F, (1 << 64) - 1),
                        fence(mailbox, event_id), trap(event_id)))
    end, reqs = drive(ring.run(db), vm)
    assert end.ok and ring.packets_done == 5
    assert vm.read(VRAM, 100) == b"x" * 100
    assert vm.u64(SIGNAL + 8) == 0
    assert vm.u32(mailbox) == event_id and vm.interrupts == [event_id]
    # the register poll completed at once: no Read other than the ring's
    assert [r for r in reqs if isinstance(r, eng.Read)] == [eng.Read(RING, prod.wptr)]
    # the value is written before the interrupt (the waiter re-checks it when woken)
    kinds = [type(r) for r in reqs if not isinstance(r, eng.Executed)]
    assert kinds.index(eng.Atomic) < kinds.index(eng.Interrupt)


@pytest.mark.parametrize("count_field", [4 * 64 - 1, 4 * 63])  # kernel: bytes-1, ROCr: (n-1)*4
def test_const_fill_dwords_with_either_count_encoding(count_field: int) -> None:
    vm, ring, prod = setup()
    end, reqs = drive(ring.run(prod.put(words(const_fill(VRAM, 0xA5A5_0102, count_field)))),
                      vm)
    assert end.ok
    assert [r for r in reqs if isinstance(r, eng.Fill)] == [eng.Fill(VRAM, 0xA5A50102, 256)]
    assert vm.read(VRAM, 260) == struct.pack("<I", 0xA5A50102) * 64 + bytes(4)


def test_const_fill_bytes() -> None:
    vm, ring, prod = setup()
    end, _ = drive(ring.run(prod.put(words(const_fill(VRAM + 1, 0x1234_56AB, 4, 0)))), vm)
    assert end.ok and vm.read(VRAM, 7) == b"\0" + b"\xab" * 5 + b"\0"


def test_write_linear_and_timestamps() -> None:
    """WRITE_LINEAR (count = dwords - 1, data after DW3); TIMESTAMP GET_GLOBAL stores the GPU
    clock (Clock request), GET the local counter that SET started."""
    vm, ring, prod = setup()
    db = prod.put(words(write_linear(VRAM, [1, 2, 3]), timestamp(VRAM + 0x100 | 5),
                        timestamp_set(1000), timestamp(VRAM + 0x108, sub=1)))
    end, _ = drive(ring.run(db), vm)
    assert end.ok
    assert vm.read(VRAM, 12) == struct.pack("<3I", 1, 2, 3)
    assert vm.u64(VRAM + 0x100) == vm.clock  # DW1 31:3: the low bits are not address
    assert vm.u64(VRAM + 0x108) == 1000


def test_nops_and_zero_dwords_are_skipped() -> None:
    """NOP's DW0 29:16 dwords are skipped (ROCr's min-submission padding); a zero dword is a
    one-dword NOP."""
    vm, ring, prod = setup()
    db = prod.put(words(nop(5), [0, 0], fence(VRAM, 9)))
    end, reqs = drive(ring.run(db), vm)
    assert end.ok and vm.u32(VRAM) == 9
    assert [r.packet for r in reqs if isinstance(r, eng.Executed)] == [
        sdma.Nop(5), sdma.Padding(2), sdma.Fence(VRAM, 9)]
    assert ring.packets_done == 4  # the zero dwords are two NOPs


def test_a_zeroed_ring_is_one_step_not_one_request_per_dword() -> None:
    """A doorbell a whole ring ahead over zeros (1 MiB: 262144 one-dword NOPs) is consumed
    with a handful of requests."""
    vm, ring, _ = setup(ring_size=1 << 20)
    end, reqs = drive(ring.run(1 << 20), vm)
    assert end.ok and ring.rptr == 1 << 20 and len(reqs) == 3  # Read, Executed, rptr Write
    assert ring.packets_done == 1 << 18


def test_copy_rect_window() -> None:
    """COPY_LINEAR_SUB_WIND: a 3x2 window of 4-byte elements from (1,1) of a 4-element-pitch
    source to (0,2) of a 5-element-pitch destination."""
    vm, ring, prod = setup()
    src = struct.pack("<16I", *range(16))
    vm.write(HOST, src)
    db = prod.put(words(copy_rect(2, HOST, 1, 1, 0, 4, 16, VRAM, 0, 2, 0, 5, 25, 3, 2, 1)))
    end, reqs = drive(ring.run(db), vm)
    assert end.ok
    got = struct.unpack("<25I", vm.read(VRAM, 100))
    assert got[10:13] == (5, 6, 7) and got[15:18] == (9, 10, 11)
    assert sum(got) == 5 + 6 + 7 + 9 + 10 + 11
    assert len([r for r in reqs if isinstance(r, eng.Copy)]) == 2


def test_copy_rect_dense_window_is_one_copy() -> None:
    vm, ring, prod = setup()
    vm.write(HOST, bytes(range(64)))
    db = prod.put(words(copy_rect(0, HOST, 0, 0, 0, 8, 32, VRAM, 0, 0, 0, 8, 32, 8, 4, 2)))
    end, reqs = drive(ring.run(db), vm)
    assert end.ok and vm.read(VRAM, 64) == bytes(range(64))
    assert [r for r in reqs if isinstance(r, eng.Copy)] == [eng.Copy(VRAM, HOST, 64)]


# -- atomics -----------------------------------------------------------------------------------
@pytest.mark.parametrize(("code", "size", "old", "src", "cmp", "new"), [
    (0x2F, 8, 5, (1 << 64) - 1, 0, 4),  # ADD_RTN_64 (ROCr)
    (0x6F, 8, 5, 2, 0, 7),  # ADD_64
    (0x0F, 4, 0xFFFFFFFF, 1, 0, 0),  # ADD_RTN_32 wraps
    (0x30, 8, 5, 1, 0, 4),  # SUB_RTN_64
    (0x28, 8, 5, 9, 5, 9),  # CMPSWAP_RTN_64, equal
    (0x28, 8, 5, 9, 4, 5),  # CMPSWAP_RTN_64, not equal
    (0x27, 8, 5, 9, 0, 9),  # SWAP_RTN_64
    (0x36, 8, 0b01, 0b10, 0, 0b11),  # OR_RTN_64
    (0x52, 4, 3, 2, 0, 2),  # UMIN_32
])
def test_atomic_operations(code: int, size: int, old: int, src: int, cmp: int,
                           new: int) -> None:
    vm, ring, prod = setup()
    fmt = "<Q" if size == 8 else "<I"
    vm.write(SIGNAL + 8, struct.pack(fmt, old))
    end, _ = drive(ring.run(prod.put(words(atomic(SIGNAL + 8, code, src, cmp)))), vm)
    assert end.ok
    assert struct.unpack(fmt, vm.read(SIGNAL + 8, size))[0] == new


def test_atomic_cmpswap_loop_retries_until_it_succeeds() -> None:
    vm, ring, prod = setup()
    vm.write(SIGNAL, struct.pack("<Q", 1))
    vm.on_sleep = lambda n: vm.write(SIGNAL, struct.pack("<Q", 3)) if n == 2 else None
    end, reqs = drive(ring.run(prod.put(words(atomic(SIGNAL, 0x28, 8, 3, loop=True,
                                                     interval=5)))), vm)
    assert end.ok and vm.u64(SIGNAL) == 8
    assert len([r for r in reqs if isinstance(r, eng.Atomic)]) == 3
    assert vm.sleeps == [5000, 5000]


@pytest.mark.parametrize("words_", [atomic(SIGNAL + 4, 0x2F, 1), atomic(SIGNAL, 0x21, 1),
                                    atomic(SIGNAL, 0x7F, 1)])
def test_atomic_misaligned_or_unsupported_is_a_queue_error(words_: list[int]) -> None:
    vm, ring, prod = setup()
    end, _ = drive(ring.run(prod.put(words(nop(), words_))), vm)
    assert end.reason is EndReason.ERROR and end.offset == 4 and ring.state is QueueState.ERROR
    assert "ATOMIC" in (end.error or "")


# -- polls ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("func", "value", "ref", "ok"), [
    (0, 1, 0, True), (1, 1, 2, True), (1, 2, 2, False), (2, 2, 2, True), (2, 3, 2, False),
    (3, 2, 2, True), (3, 1, 2, False), (4, 1, 2, True), (4, 2, 2, False), (5, 2, 2, True),
    (5, 1, 2, False), (6, 3, 2, True), (6, 2, 2, False),
])
def test_poll_compare_functions(func: int, value: int, ref: int, ok: bool) -> None:
    """POLL_REGMEM DW0 30:28: 0 always, 1 <, 2 <=, 3 ==, 4 !=, 5 >=, 6 >; with retry count 0
    a failed check times out at once and the ring moves on."""
    vm, ring, prod = setup()
    vm.write(SIGNAL, struct.pack("<I", value | 0xF00))  # masked off by mask 0xFF
    end, _ = drive(ring.run(prod.put(words(poll(SIGNAL, ref, mask=0xFF, func=func, retry=0),
                                           fence(VRAM, 1)))), vm)
    assert end.ok and vm.u32(VRAM) == 1
    assert ring.poll_timeouts == (0 if ok else 1)


def test_poll_released_after_retries() -> None:
    """ROCr's dependency poll (== 0, retry forever): the CPU releases it after 3 re-reads;
    each re-read is preceded by a Sleep of the interval."""
    vm, ring, prod = setup(poll_spins=100)
    vm.write(SIGNAL, struct.pack("<I", 1))
    vm.on_sleep = lambda n: vm.write(SIGNAL, bytes(4)) if n == 3 else None
    end, reqs = drive(ring.run(prod.put(words(poll(SIGNAL, 0, interval=4), fence(VRAM, 1)))),
                      vm)
    assert end.ok and vm.u32(VRAM) == 1
    assert vm.sleeps == [4000] * 3
    assert len([r for r in reqs if r == eng.Read(SIGNAL, 4)]) == 4


def test_poll_forever_returns_polling_and_resumes() -> None:
    """A forever poll (0xFFF) does not hold the run: after poll_spins checks the ring returns
    POLLING with rptr at the poll (what came before it is written back); the next run, with
    the same doorbell, re-checks and goes on once the memory is released."""
    vm, ring, prod = setup(poll_spins=4)
    vm.write(SIGNAL, struct.pack("<I", 1))
    db = prod.put(words(fence(VRAM, 7), poll(SIGNAL, 0), fence(VRAM + 4, 8)))
    for _ in range(3):
        end, reqs = drive(ring.run(db), vm)
        assert end.reason is EndReason.POLLING and end.offset == 16
        assert ring.state is QueueState.POLLING and vm.u64(RPTR) == 16
        assert len([r for r in reqs if r == eng.Read(SIGNAL, 4)]) == 4
    assert vm.u32(VRAM) == 7 and vm.u32(VRAM + 4) == 0
    vm.write(SIGNAL, bytes(4))
    end, _ = drive(ring.run(db), vm)
    assert end.reason is EndReason.CAUGHT_UP and vm.u32(VRAM + 4) == 8
    assert vm.u64(RPTR) == db and ring.poll_timeouts == 0


def test_poll_finite_retries_carry_across_runs_then_time_out() -> None:
    """Retry count 5 with 2 spins a run: the retries left are kept across runs; when they run
    out the poll ends (poll_timeouts) and the packets after it execute."""
    vm, ring, prod = setup(poll_spins=2)
    vm.write(SIGNAL, struct.pack("<I", 1))
    db = prod.put(words(poll(SIGNAL, 0, retry=5), fence(VRAM, 1)))
    ends = [drive(ring.run(db), vm)[0].reason for _ in range(3)]
    assert ends == [EndReason.POLLING, EndReason.POLLING, EndReason.CAUGHT_UP]
    assert ring.poll_timeouts == 1 and vm.u32(VRAM) == 1


def test_register_poll_completes_at_once() -> None:
    vm, ring, prod = setup()
    end, reqs = drive(ring.run(prod.put(words(poll(0x1234, 5, mem=False, retry=0xFFF)))), vm)
    assert end.ok and not vm.sleeps
    assert reqs[-2] == eng.Executed(0, sdma.PollRegMem(False, False, 3, 0x1234, 5, 0xFFFFFFFF,
                                                       4, 0xFFF))


# -- the ring ------------------------------------------------------------------------------------
def test_ring_wrap_reads_two_pieces() -> None:
    """A submission written across the ring's end (no padding): the engine reads it in two
    pieces and decodes packets that straddle the end; indices keep growing past the size."""
    vm, ring, prod = setup(ring_size=64)
    first = prod.put(words(nop(9)))  # 40 bytes
    drive(ring.run(first), vm)
    db = prod.put(words(fence(VRAM, 1), fence(VRAM + 4, 2)), pad=False)  # 32 bytes from 40
    end, reqs = drive(ring.run(db), vm)
    assert end.ok and vm.u32(VRAM) == 1 and vm.u32(VRAM + 4) == 2
    assert reqs[:2] == [eng.Read(RING + 40, 24), eng.Read(RING, 8)]
    assert vm.u64(RPTR) == 72 and end.offset == 8


def test_rocr_zero_padding_to_the_ring_end() -> None:
    """ROCr zero-fills to the ring's end when a command would straddle it: zero dwords are
    one-dword NOPs, and the command after them runs from the ring's start."""
    vm, ring, prod = setup(ring_size=64)
    for _ in range(5):
        db = prod.put(words(copy_linear(VRAM, HOST, 8), fence(VRAM + 64, 3)))
        end, _ = drive(ring.run(db), vm)
        assert end.ok
    assert ring.rptr == prod.wptr > 64 and vm.u64(RPTR) == prod.wptr


def test_packet_cut_by_the_doorbell_waits_for_the_rest() -> None:
    vm, ring, prod = setup()
    data = words(fence(VRAM, 1), copy_linear(VRAM + 8, HOST, 4))
    db1 = prod.put(data[:20])
    end, _ = drive(ring.run(db1), vm)
    assert end.reason is EndReason.CAUGHT_UP and ring.rptr == 16 and vm.u64(RPTR) == 16
    db2 = prod.put(data[20:])
    end, reqs = drive(ring.run(db2), vm)
    assert end.ok and ring.rptr == len(data)
    assert reqs[0] == eng.Read(RING + 16, 28)


def test_empty_doorbell_is_caught_up_without_requests() -> None:
    vm, ring, _ = setup()
    end, reqs = drive(ring.run(0), vm)
    assert end == eng.RunEnd(EndReason.CAUGHT_UP, 0) and reqs == []


@pytest.mark.parametrize(("doorbell", "why"), [
    (6, "not dword aligned"), (RING_SIZE + 4, "beyond what the ring holds")])
def test_bad_doorbell_is_a_queue_error(doorbell: int, why: str) -> None:
    vm, ring, _ = setup()
    end, reqs = drive(ring.run(doorbell), vm)
    assert end.reason is EndReason.ERROR and why in (end.error or "") and reqs == []
    assert ring.state is QueueState.ERROR


def test_doorbell_behind_rptr_is_a_queue_error() -> None:
    vm, ring, prod = setup()
    drive(ring.run(prod.put(words(nop(3)))), vm)
    end, _ = drive(ring.run(8), vm)
    assert end.reason is EndReason.ERROR


def test_unknown_opcode_stops_the_queue_at_its_offset() -> None:
    """An unknown op (SEM, 7) stops the queue in ERROR with the ring offset; what came before
    ran and rptr points at the bad packet; later runs return the same error, no request."""
    vm, ring, prod = setup()
    db = prod.put(words(fence(VRAM, 1), [7, 0, 0], fence(VRAM + 4, 2)))
    end, _ = drive(ring.run(db), vm)
    assert end.reason is EndReason.ERROR and end.offset == 16
    assert "unknown packet op 7" in (end.error or "")
    assert vm.u32(VRAM) == 1 and vm.u32(VRAM + 4) == 0 and vm.u64(RPTR) == 16
    again, reqs = drive(ring.run(prod.put(words(fence(VRAM + 8, 3)))), vm)
    assert again == end and reqs == []


@pytest.mark.parametrize("bad", [
    poll(SIGNAL, 0, func=7), fence(VRAM + 2, 1), const_fill(VRAM, 0, 3, 3),
    const_fill(VRAM + 2, 0, 7, 2), [1 | 1 << 27, 0, 0, 0, 0, 0, 0], [1, 0, 1 << 16, 0, 0, 0, 0],
    [1 | 4 << 8 | 5 << 29] + [0] * 12, [0x102, 0, 0, 0],
])
def test_malformed_packets_are_queue_errors(bad: list[int]) -> None:
    vm, ring, prod = setup()
    end, _ = drive(ring.run(prod.put(words(bad))), vm)
    assert end.reason is EndReason.ERROR and end.offset == 0 and end.error


def test_packet_longer_than_the_ring_is_an_error_not_a_wait() -> None:
    vm, ring, prod = setup(ring_size=64)
    end, _ = drive(ring.run(prod.put(struct.pack("<I", 100 << 16) + bytes(60))), vm)
    assert end.reason is EndReason.ERROR and "longer than the ring" in (end.error or "")


def test_gpu_fault_stops_the_queue() -> None:
    """A copy from an unmapped VA: the edge throws GpuFault; the queue is in ERROR, the
    RunEnd carries the fault and the packet's ring offset, nothing after it runs."""
    vm, ring, prod = setup()
    db = prod.put(words(nop(), copy_linear(VRAM, 0xDEAD_0000, 64), fence(VRAM, 1)))
    end, reqs = drive(ring.run(db), vm)
    assert end.reason is EndReason.ERROR and end.offset == 4
    assert end.fault is not None and end.fault.va == 0xDEAD_0000 and not end.fault.write
    assert vm.u32(VRAM) == 0 and ring.state is QueueState.ERROR
    assert not any(isinstance(r, eng.Write) and r.va == VRAM for r in reqs)


def test_unmapped_ring_faults() -> None:
    vm, ring, _ = setup()
    del vm.maps[RING]
    end, _ = drive(ring.run(64), vm)
    assert end.reason is EndReason.ERROR and end.fault is not None and end.fault.va == RING


def test_ring_size_must_be_a_power_of_two() -> None:
    with pytest.raises(ValueError, match="power of two"):
        sdma.SdmaRing(RING, 3000, RPTR, WPTR)


# -- indirect buffers --------------------------------------------------------------------------
def test_run_ib_executes_an_sdma_ib() -> None:
    vm, _, _ = setup()
    vm.write(HOST, b"q" * 40)
    ib = words(copy_linear(VRAM, HOST, 40), fence(VRAM + 64, 5), nop(1))
    vm.write(HOST + 0x1000, ib)
    end, reqs = drive(sdma.run_ib(HOST + 0x1000, len(ib) // 4), vm)
    assert end == eng.RunEnd(EndReason.CAUGHT_UP, len(ib))
    assert vm.read(VRAM, 40) == b"q" * 40 and vm.u32(VRAM + 64) == 5
    assert reqs[0] == eng.Read(HOST + 0x1000, len(ib))


def test_run_ib_packet_past_the_end_and_faults() -> None:
    vm, _, _ = setup()
    vm.write(HOST, words(fence(VRAM, 1), copy_linear(VRAM, HOST, 4)))
    end, _ = drive(sdma.run_ib(HOST, 6), vm)
    assert end.reason is EndReason.ERROR and end.offset == 16
    assert "past the end" in (end.error or "")
    end, _ = drive(sdma.run_ib(0xBAD000, 4), vm)
    assert end.reason is EndReason.ERROR and end.fault is not None


def test_run_ib_poll_spins_until_released() -> None:
    vm, _, _ = setup()
    vm.write(SIGNAL, struct.pack("<I", 1))
    vm.write(HOST, words(poll(SIGNAL, 0, interval=2)))
    vm.on_sleep = lambda n: vm.write(SIGNAL, bytes(4)) if n == 50 else None
    end, _ = drive(sdma.run_ib(HOST, 6), vm)
    assert end.ok and len(vm.sleeps) == 50


def test_run_ib_poll_that_never_ends_times_out_as_a_hung_job() -> None:
    """An IB polling memory nobody releases ends in ERROR once its Sleeps add up to the job
    timeout (10 s by default, the kernel's lockup_timeout); interval-0 polls count 1 µs each,
    so they end too."""
    vm, _, _ = setup()
    vm.write(SIGNAL, struct.pack("<I", 1))
    vm.write(HOST, words(nop(), poll(SIGNAL, 0, interval=1000)))
    end, _ = drive(sdma.run_ib(HOST, 7), vm)
    assert end.reason is EndReason.ERROR and end.offset == 4 and "timed out" in (end.error or "")
    assert len(vm.sleeps) == 10_000 and sum(vm.sleeps) == 10_000_000_000
    vm.sleeps.clear()
    vm.write(HOST, words(poll(SIGNAL, 0, interval=0)))
    end, _ = drive(sdma.run_ib(HOST, 6, timeout_ns=5_000_000), vm)
    assert end.reason is EndReason.ERROR and len(vm.sleeps) == 5000


# -- hostile bytes -------------------------------------------------------------------------------
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(min_size=0, max_size=256), st.integers(0, 300))
def test_random_ring_bytes_run_or_stop_with_the_documented_error(data: bytes,
                                                                 doorbell: int) -> None:
    """Random ring contents and doorbells: the run ends with a RunEnd (caught up, polling
    or a queue error with a reason) or keeps yielding requests; never another exception, and
    never a step without a request (the driver bounds the steps)."""
    vm, ring, _ = setup(ring_size=256)
    vm.write(RING, data.ljust(256, b"\0"))
    for _ in range(2):
        try:
            end, _ = drive(ring.run(doorbell), vm, max_steps=2000)
        except TooManySteps:
            return
        assert isinstance(end, eng.RunEnd)
        if end.reason is EndReason.ERROR:
            assert end.error and ring.state is QueueState.ERROR
            assert 0 <= end.offset < 256
        doorbell += 64


@settings(max_examples=500, deadline=None)
@given(st.binary(min_size=0, max_size=80))
def test_decode_packet_decodes_or_raises_the_packet_error(data: bytes) -> None:
    end = len(data) & ~3
    try:
        got = sdma.decode_packet(data, 0, end)
    except sdma.SdmaPacketError as e:
        assert str(e)
        return
    if got is not None:
        pkt, n = got
        assert 4 <= n <= end and n % 4 == 0
        assert type(pkt) in sdma.Packet.__args__


def test_decoded_packets_are_frozen_values() -> None:
    pkt, _ = sdma.decode_packet(words(fence(VRAM, 3)), 0, 16) or (None, 0)
    assert pkt == sdma.Fence(VRAM, 3)
    with pytest.raises(AttributeError):
        pkt.data = 4  # type: ignore[misc]
    assert not hasattr(pkt, "__dict__")
    assert sdma.ATOMIC_OPS[sdma.TC_OP_ATOMIC_ADD_RTN_64] == (AtomicOp.ADD, 8)



def test_zero_runs_between_packets_cost_no_copy_of_the_ring() -> None:
    """1 MiB of a zero dword then a NOP, 65536 times: 131072 packets, each zero run a
    padding step found in place (a copy of the ring's rest per run would be quadratic)."""
    import time

    vm, ring, _ = setup(ring_size=1 << 20)
    vm.write(RING, words(*([[0], nop(2)] * (1 << 16))))
    t0 = time.process_time()
    end, _ = drive(ring.run(1 << 20), vm, max_steps=1 << 20)
    assert end.ok and ring.packets_done == 1 << 17
    assert time.process_time() - t0 < 30


_VALID = st.one_of(
    st.builds(lambda o, v: ("fence", o, v), st.integers(0, 63), st.integers(0, 2**32 - 1)),
    st.builds(lambda o, ws: ("write", o, ws), st.integers(0, 48),
              st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=12)),
    st.builds(lambda o, s, n: ("copy", o, s, n), st.integers(0, 255), st.integers(0, 255),
              st.integers(1, 64)),
    st.builds(lambda c: ("nop", c), st.integers(0, 20)),
    st.builds(lambda n: ("zeros", n), st.integers(1, 6)),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_VALID, min_size=1, max_size=25), st.lists(st.integers(1, 60), max_size=30),
       st.sampled_from([128, 256, 512]))
def test_valid_streams_split_anywhere_equal_running_them_in_one_go(
        ops: list[tuple], cuts: list[int], ring_size: int) -> None:
    """§8 ring protocol, as a model: a stream of valid packets, written across the ring's
    end (no padding) and rung in arbitrary dword-aligned pieces (packets cut in two by a
    doorbell), leaves memory exactly as executing the packets one after another does, and
    rptr ends at the last doorbell."""
    vm, ring, prod = setup(ring_size=ring_size)
    src = bytes(range(256)) * 2
    vm.write(HOST, src)
    model = bytearray(512)
    stream: list[list[int]] = []
    for op in ops:
        if op[0] == "fence":
            stream.append(fence(VRAM + 4 * op[1], op[2]))
            model[4 * op[1]: 4 * op[1] + 4] = struct.pack("<I", op[2])
        elif op[0] == "write":
            stream.append(write_linear(VRAM + 4 * op[1], op[2]))
            model[4 * op[1]: 4 * op[1] + 4 * len(op[2])] = struct.pack(f"<{len(op[2])}I", *op[2])
        elif op[0] == "copy":
            stream.append(copy_linear(VRAM + op[1], HOST + op[2], op[3]))
            model[op[1]: op[1] + op[3]] = src[op[2]: op[2] + op[3]]
        elif op[0] == "nop":
            stream.append(nop(op[1]))
        else:
            stream.append([0] * op[1])
    data = words(*stream)
    pos = 0
    while pos < len(data):  # ring in pieces no bigger than the space the engine freed
        step = min(4 * (cuts.pop(0) if cuts else 64), len(data) - pos,
                   ring_size - (prod.wptr - ring.rptr))
        db = prod.put(data[pos: pos + step], pad=False)
        pos += step
        end, _ = drive(ring.run(db), vm)
        assert end.reason is EndReason.CAUGHT_UP, end
    assert ring.rptr == len(data) and vm.u64(RPTR) == len(data)
    assert vm.read(VRAM, 512) == bytes(model)


# -- what Debian's ROCr 5.2.3 really writes ---------------------------------------------------
# Ring bytes captured from libhsa-runtime64 1.5.0 (ROCr 5.2.3, BlitSdmaV4) running
# hsa_amd_memory_async_copy / _copy_rect on ualinkd (an MI210 profile, gfx90a): one plain
# 8 KiB host->device copy, one device->host copy behind a dependency signal, one rect copy.
ROCR_COPY = bytes.fromhex(
    "08000000000000000000008000000000000000000000000001000000ff1f00000000000000c06b16147f0000"
    "00004015147f00000a00005e88eead16147f0000ffffffffffffffff00000000000000000000000005000000"
    "08006c16147f0000010000000600000001000000")
ROCR_DEP_COPY = bytes.fromhex(
    "080000b00cecad16147f000000000000ffffffff0400ff0f080000b008ecad16147f000000000000ffffffff"
    "0400ff0f08000000000000000000008000000000000000000000000001000000ff1f00000000000000004015"
    "147f000000806b16147f00000a00005e88eead16147f0000ffffffffffffffff000000000000000000000000"
    "0500000008006c16147f0000010000000600000001000000")
ROCR_RECT = bytes.fromhex(
    "0800000000000000000000800000000000000000000000000104006088c06b16147f00000000000000e00000"
    "0000000084004015147f00000000000000e001000000000004000200000000000a00005e88eead16147f0000"
    "ffffffffffffffff0000000000000000000000000500000008006c16147f0000010000000600000001000000")
R_SRC, R_DST, R_SIGNAL, R_MAILBOX = 0x7F14166BC000, 0x7F1415400000, 0x7F1416ADEE88, 0x7F14166C0008
R_DEP = 0x7F1416ADEC08


def _decoded(data: bytes) -> list[object]:
    out: list[object] = []
    pos = 0
    while pos < len(data):
        got = sdma.decode_packet(data, pos, len(data))
        assert got is not None
        out.append(got[0])
        pos += got[1]
    return out


def test_rocr_5_2_3_submissions_decode() -> None:
    """§8's submission, as ROCr 5.2.3 wrote it: the HDP-flush register poll, COPY_LINEAR
    (count = bytes - 1), ATOMIC ADD_RTN_64 of -1 on the signal, FENCE of the event id to the
    mailbox, TRAP(event id); a dependency adds two == 0 polls, high dword first."""
    hdp = sdma.PollRegMem(False, False, 0, 1 << 63, 0, 0, 0, 0)
    dec = sdma.AtomicPacket(0x2F, AtomicOp.ADD, 8, False, R_SIGNAL, (1 << 64) - 1, 0, 0)
    tail = [dec, sdma.Fence(R_MAILBOX, 1), sdma.Trap(1)]
    assert _decoded(ROCR_COPY) == [hdp, sdma.CopyLinear(R_SRC, R_DST, 8192), *tail]
    assert _decoded(ROCR_DEP_COPY) == [
        sdma.PollRegMem(True, False, 3, R_DEP + 4, 0, 0xFFFFFFFF, 4, 0xFFF),
        sdma.PollRegMem(True, False, 3, R_DEP, 0, 0xFFFFFFFF, 4, 0xFFF),
        hdp, sdma.CopyLinear(R_DST, 0x7F14166B8000, 8192), *tail]
    rect = _decoded(ROCR_RECT)[1]
    assert isinstance(rect, sdma.CopyLinearRect) and rect.element == 8
    # 3 rows of 40 bytes: from (8, 2) of a 64-byte-pitch image to (4, 1) of a 128-byte one
    assert list(rect.rows()) == [(R_DST + 4 + 128 * y, R_SRC + 8 + 64 * (1 + y), 40)
                                 for y in range(1, 4)]


def test_rocr_5_2_3_submissions_execute() -> None:
    """The captured bytes run: the copy lands, the signal goes 1 -> 0, the mailbox gets the
    event id and the trap interrupts with it; the dependency polls pass once the dependency
    signal is 0."""
    vm = FakeVm()
    vm.map(RING, RING_SIZE)
    vm.map(WPTR - 8, 32)
    vm.map(R_SRC & ~0xFFFF, 1 << 20)
    vm.map(R_DST, 1 << 16)
    vm.map(R_SIGNAL & ~0xFFF, 4096)
    ring = sdma.SdmaRing(RING, RING_SIZE, RPTR, WPTR)
    prod = Producer(vm, RING, RING_SIZE)
    payload = bytes(range(256)) * 32
    vm.write(R_SRC, payload)
    for data, dep in ((ROCR_COPY, 0), (ROCR_DEP_COPY, 1)):
        vm.write(R_SIGNAL, struct.pack("<q", 1))
        vm.write(R_DEP, struct.pack("<q", dep))
        db = prod.put(data)
        end, _ = drive(ring.run(db), vm)
        if dep:
            assert end.reason is EndReason.POLLING and vm.u64(R_SIGNAL) == 1
            vm.write(R_DEP, bytes(8))
            end, _ = drive(ring.run(db), vm)
        assert end.ok and vm.u64(R_SIGNAL) == 0 and vm.u32(R_MAILBOX) == 1
    assert vm.read(R_DST, 8192) == payload and vm.read(0x7F14166B8000, 8192) == payload
    assert vm.interrupts == [1, 1] and vm.u64(RPTR) == len(ROCR_COPY) + len(ROCR_DEP_COPY)


def test_consecutive_copy_linears_are_one_copy_request_each_packet_traced() -> None:
    """ROCr's BlitSdma cuts a large copy into COPY_LINEARs that continue one another: the
    engine asks for them as one Copy (the edge moves it in one go), then traces each packet
    as its own (Executed, packets_done); a copy that does not continue, or whose source and
    destination overlap, stays its own request."""
    vm, ring, prod = setup()
    payload = bytes(range(256)) * 12
    vm.write(HOST, payload)
    db = prod.put(words(copy_linear(VRAM, HOST, 1024), copy_linear(VRAM + 1024, HOST + 1024, 1024),
                        copy_linear(VRAM + 2048, HOST + 2048, 1024),
                        copy_linear(VRAM + 8192, HOST + 3072, 16),  # does not continue
                        copy_linear(HOST + 64, HOST, 64), copy_linear(HOST + 128, HOST + 64, 64),
                        fence(SIGNAL, 9)))
    end, reqs = drive(ring.run(db), vm)
    assert end.ok and ring.packets_done == 7
    assert [r for r in reqs if isinstance(r, eng.Copy)] == [
        eng.Copy(VRAM, HOST, 3072), eng.Copy(VRAM + 8192, HOST + 3072, 16),
        eng.Copy(HOST + 64, HOST, 64), eng.Copy(HOST + 128, HOST + 64, 64)]
    assert vm.read(VRAM, 3072) == payload[:3072]
    assert [r.ring_offset for r in reqs if isinstance(r, eng.Executed)] == [
        0, 28, 56, 84, 112, 140, 168]
    assert vm.u32(SIGNAL) == 9


def test_a_fault_inside_merged_copies_stops_at_the_packet_it_hit() -> None:
    """A fault part-way through merged COPY_LINEARs: the packets wholly before the faulting
    byte are done (traced), the queue stops at the one it hit, with that ring offset, as
    packet by packet (§8: an engine fault stops the queue at the packet)."""
    vm, ring, prod = setup()
    db = prod.put(words(copy_linear(VRAM, HOST, 1024), copy_linear(VRAM + 1024, HOST + 1024, 1024),
                        copy_linear(VRAM + 2048, HOST + 2048, 1024), fence(SIGNAL, 9)))
    gen = ring.run(db)
    req = gen.send(None)
    executed = []
    while True:
        if isinstance(req, eng.Copy):
            assert req == eng.Copy(VRAM, HOST, 3072)
            req = gen.throw(eng.GpuFault(VRAM + 1024 + 100, True))
            continue
        if isinstance(req, eng.Executed):
            executed.append(req.ring_offset)
        try:
            req = gen.send(vm.fulfil(req))
        except StopIteration as stop:
            end = stop.value
            break
    assert end.reason is EndReason.ERROR and end.offset == 28
    assert end.fault is not None and end.fault.va == VRAM + 1124 and end.fault.write
    assert executed == [0] and ring.packets_done == 1 and vm.u32(SIGNAL) == 0
