"""The AQL command processor (ualinkd/amdgpu/aql.py), sans-IO, against a dict-backed GPU VM
that answers engine.py's requests: a producer laid out as ROCr 5.2.3's AqlQueue lays out
its amd_queue_t (amd_hsa_queue.h) and signals (amd_hsa_signal.h), packets as hsa.h and
hsa_ext_amd.h define them. Covers the decoder (hypothesis: total over 64-byte slots), the
barrier packets (HSA spec 2.9's AND/OR), ROCr's own PM4-IB vendor packet
(AqlQueue::ExecutePM4 on gfx9), the barrier-value packet, the queue error a
KERNEL_DISPATCH raises (DynamicScratchHandler's code 8 in queue_inactive_signal), header
INVALID after consumption and read_dispatch_id advanced, a ring that wraps, a GPU fault."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ualinkd.amdgpu import aql
from ualinkd.amdgpu.engine import (
    Atomic,
    EndReason,
    Executed,
    GpuFault,
    Interrupt,
    QueueState,
    Read,
    RunEnd,
    Write,
    atomic_result,
    format_packet,
    packet_fields,
)

RING = 0x7F00_0000_0000
AMDQ = 0x7F10_0000_0000
SIG = 0x7F20_0000_0000  # signals, 64 bytes apart
EVENTS = 0x7F30_0000_0000  # the events page: mailbox slots
IB = 0x7F40_0000_0000


class Vm:
    """A sparse byte store; an access to a page never written is a GPU fault."""

    def __init__(self) -> None:
        self.mem: dict[int, int] = {}
        self.requests: list[object] = []
        self.unmapped: set[int] = set()

    def write(self, va: int, data: bytes) -> None:
        for i, b in enumerate(data):
            self.mem[va + i] = b

    def read(self, va: int, size: int) -> bytes:
        if any(va >> 12 == p or (va + size - 1) >> 12 == p for p in self.unmapped):
            raise GpuFault(va, False)
        return bytes(self.mem.get(va + i, 0) for i in range(size))

    def u64(self, va: int) -> int:
        return struct.unpack("<Q", self.read(va, 8))[0]

    def i64(self, va: int) -> int:
        return struct.unpack("<q", self.read(va, 8))[0]

    def fulfil(self, req: object) -> object:
        if isinstance(req, Read):
            return self.read(req.va, req.size)
        if isinstance(req, Write):
            if req.va >> 12 in self.unmapped:
                raise GpuFault(req.va, True)
            self.write(req.va, req.data)
            return None
        if isinstance(req, Atomic):
            old = int.from_bytes(self.read(req.va, req.size), "little")
            new = atomic_result(req.op, old, req.src, req.cmp, req.size)
            self.write(req.va, new.to_bytes(req.size, "little"))
            return old
        return None


def run(vm: Vm, q: aql.AqlQueue, doorbell: int = 0) -> RunEnd:
    vm.requests.clear()
    gen = q.run(doorbell)
    answer: object = None
    first = True
    while True:
        try:
            req = next(gen) if first else gen.send(answer)
        except StopIteration as stop:
            return stop.value
        first = False
        vm.requests.append(req)
        try:
            answer = vm.fulfil(req)
        except GpuFault as f:
            try:
                gen.throw(f)
            except StopIteration as stop:
                return stop.value
            raise AssertionError("the engine went on after a fault") from None


class Producer:
    """ROCr's side: amd_queue_t zeroed, the ring's headers INVALID, packets written body
    first and header last, write_dispatch_id bumped (AqlQueue's constructor, submit)."""

    def __init__(self, vm: Vm, slots: int = 16, inactive_signal: int = 0) -> None:
        self.vm, self.slots = vm, slots
        vm.write(AMDQ, bytes(256))
        vm.write(AMDQ + aql.AMD_QUEUE_READ_DISPATCH_ID_FIELD_BASE_BYTE_OFFSET,
                 struct.pack("<I", aql.AMD_QUEUE_READ_DISPATCH_ID))
        vm.write(AMDQ + aql.AMD_QUEUE_INACTIVE_SIGNAL, struct.pack("<Q", inactive_signal))
        for i in range(slots):
            vm.write(RING + 64 * i, struct.pack("<H", aql.PacketType.INVALID) + bytes(62))
        self.index = 0
        self.queue = aql.AqlQueue(RING, slots * 64, AMDQ + aql.AMD_QUEUE_READ_DISPATCH_ID,
                                  AMDQ + aql.AMD_QUEUE_WRITE_DISPATCH_ID)

    def submit(self, packet: bytes, publish: bool = True) -> int:
        assert len(packet) == 64
        idx = self.index
        self.index += 1
        slot = RING + idx % self.slots * 64
        self.vm.write(slot + 2, packet[2:])
        if publish:
            self.vm.write(slot, packet[:2])
        self.vm.write(AMDQ + aql.AMD_QUEUE_WRITE_DISPATCH_ID, struct.pack("<Q", self.index))
        return idx

    @property
    def read_dispatch_id(self) -> int:
        return self.vm.u64(AMDQ + aql.AMD_QUEUE_READ_DISPATCH_ID)


def signal(vm: Vm, n: int, value: int, event_id: int | None = None) -> int:
    """amd_signal_t n: kind USER, the value, and when event_id is given an InterruptSignal's
    mailbox (a slot of the events page) and id."""
    va = SIG + 64 * n
    mailbox = EVENTS + 8 * n if event_id is not None else 0
    vm.write(va, struct.pack("<qqQI", 1, value, mailbox, event_id or 0) + bytes(36))
    if mailbox:
        vm.write(mailbox, b"\xff" * 8)  # UNSIGNALED
    return va


def header(t: int) -> int:
    return t | 1 << 8 | 2 << 9 | 2 << 11  # barrier bit, system-scope fences


def barrier(t: int, deps: list[int], done: int) -> bytes:
    deps = deps + [0] * (5 - len(deps))
    return struct.pack("<HHI5QQQ", header(t), 0, 0, *deps, 0, done)


def dispatch(kernel_object: int, done: int) -> bytes:
    return struct.pack("<HH3H2x3IIIQQ8xQ", header(2), 1, 1, 1, 1, 1, 1, 1, 0, 0,
                       kernel_object, 0, done)


def pm4_ib(ib_va: int, ib_dwords: int, done: int = 0) -> bytes:
    """ROCr 5.2.3's ExecutePM4 on gfx9: INDIRECT_BUFFER (PM4_HDR(0x3F, 4, 9)) to the IB."""
    jump = (3 << 30 | (4 - 2) << 16 | 0x3F << 8, ib_va & 0xFFFFFFFC, ib_va >> 32 & 0xFFFF,
            ib_dwords | 1 << 23)
    return struct.pack("<HH4II32xQ", aql.PacketType.VENDOR_SPECIFIC, 1, *jump, 0xA, done)


def acquire_mem() -> bytes:
    """ROCr's cache_inv for gfx9: ACQUIRE_MEM, 7 dwords."""
    return struct.pack("<7I", 3 << 30 | (7 - 2) << 16 | 0x58 << 8,
                       1 << 29 | 1 << 27 | 1 << 23 | 1 << 18, 0xFFFFFFFF, 0xFF, 0, 0, 0)


def barrier_value(sig: int, value: int, mask: int, cond: int, done: int) -> bytes:
    return struct.pack("<HBx4xQqqI4x8x8xQ", header(0), 2, sig, value, mask, cond, done)


# -- the decoder -----------------------------------------------------------------------------
@given(st.binary(min_size=64, max_size=64))
def test_every_slot_decodes(raw: bytes):
    p = aql.decode_packet(raw)
    assert p.barrier == bool(raw[1] & 1)
    assert p.acquire_scope == raw[1] >> 1 & 3 and p.release_scope == raw[1] >> 3 & 3
    assert aql.PacketHeader.of(raw[0] | raw[1] << 8).type == raw[0]
    if isinstance(p, aql.UnknownPacket):
        assert p.type == raw[0] and raw[0] > 5
    # the tracer's view: a name and JSON-able fields (engine.py's format_packet)
    assert format_packet(p).startswith(p.NAME + "(")
    json.dumps(packet_fields(p))


@given(st.binary(max_size=200).filter(lambda b: len(b) != 64))
def test_other_lengths_are_the_documented_error(raw: bytes):
    with pytest.raises(aql.AqlDecodeError):
        aql.decode_packet(raw)


@given(st.lists(st.integers(0, 2**64 - 1), min_size=5, max_size=5), st.integers(0, 2**64 - 1),
       st.sampled_from([3, 5]))
def test_barrier_fields_round_trip(deps: list[int], done: int, t: int):
    p = aql.decode_packet(barrier(t, deps, done))
    assert isinstance(p, aql.BarrierAnd if t == 3 else aql.BarrierOr)
    assert p.dep_signals == tuple(deps) and p.completion_signal == done


@given(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))
def test_dispatch_fields_round_trip(kobj: int, done: int):
    p = aql.decode_packet(dispatch(kobj, done))
    assert isinstance(p, aql.KernelDispatch)
    assert p.kernel_object == kobj and p.completion_signal == done
    assert p.workgroup_size == (1, 1, 1) and p.grid_size == (1, 1, 1) and p.setup == 1


@given(st.integers(0, 2**48 - 1).map(lambda v: v & ~3), st.integers(0, 0xFFFFF))
def test_pm4_ib_jump_decodes_rocr_layout(ib_va: int, n: int):
    p = aql.decode_packet(pm4_ib(ib_va, n))
    assert isinstance(p, aql.Pm4Ib)
    assert (p.ib_va, p.ib_dwords, p.dw_cnt_remain) == (ib_va, n, 0xA)


@given(st.binary(max_size=256))
def test_pm4_decoder_is_total(raw: bytes):
    try:
        out = aql.decode_pm4(raw)
    except aql.AqlDecodeError:
        return
    assert all(0 <= p.opcode <= 0xFF for p in out)


def test_pm4_decoder_reads_rocr_cache_invalidation():
    (p,) = aql.decode_pm4(acquire_mem())
    assert p.opcode == aql.PM4_IT_ACQUIRE_MEM and len(p.body) == 6


# -- barriers --------------------------------------------------------------------------------
def test_barrier_and_waits_for_every_dependency_then_completes():
    vm = Vm()
    prod = Producer(vm)
    d1, d2 = signal(vm, 1, 1), signal(vm, 2, 1)
    done = signal(vm, 3, 1, event_id=42)
    prod.submit(barrier(3, [d1, d2], done))
    end = run(vm, prod.queue, 0)
    assert end.reason is EndReason.POLLING and prod.queue.state is QueueState.POLLING
    assert prod.read_dispatch_id == 0 and vm.i64(done + 8) == 1
    assert vm.read(RING, 1)[0] == 3  # not consumed
    vm.write(d1 + 8, struct.pack("<q", 0))
    assert run(vm, prod.queue, 0).reason is EndReason.POLLING
    vm.write(d2 + 8, struct.pack("<q", 0))
    end = run(vm, prod.queue, 0)
    assert end.reason is EndReason.CAUGHT_UP and prod.queue.state is QueueState.IDLE
    assert vm.i64(done + 8) == 0
    assert vm.read(RING, 2) == struct.pack("<H", aql.PacketType.INVALID)
    assert prod.read_dispatch_id == 1 and prod.queue.packets_done == 1
    # the value is stored before the mailbox and the interrupt
    kinds = [type(r) for r in vm.requests]
    assert kinds.index(Atomic) < kinds.index(Interrupt)
    assert Interrupt(42) in vm.requests
    assert vm.read(EVENTS + 8 * 3, 4) == struct.pack("<I", 42)
    assert isinstance(vm.requests[-1], Executed) and vm.requests[-1].ring_offset == 0


def test_barrier_or_completes_on_any_dependency_and_ignores_null_handles():
    vm = Vm()
    prod = Producer(vm)
    d1, d2 = signal(vm, 1, 5), signal(vm, 2, 0)
    done = signal(vm, 3, 2)
    prod.submit(barrier(5, [0, d1, 0, d2], done))
    assert run(vm, prod.queue).reason is EndReason.CAUGHT_UP
    assert vm.i64(done + 8) == 1  # decremented once, no mailbox: no interrupt
    assert not any(isinstance(r, Interrupt) for r in vm.requests)


def test_barrier_without_signals_completes_at_once():
    vm = Vm()
    prod = Producer(vm)
    prod.submit(barrier(3, [], 0))
    prod.submit(barrier(5, [], 0))
    assert run(vm, prod.queue).reason is EndReason.CAUGHT_UP
    assert prod.read_dispatch_id == 2


def test_unpublished_header_stops_the_run_and_is_taken_later():
    """A slot reserved (write_dispatch_id moved) but whose header is still INVALID: the CP
    waits for it; the doorbell of the next submission picks it up."""
    vm = Vm()
    prod = Producer(vm)
    prod.submit(barrier(3, [], 0))
    late = barrier(3, [], 0)
    idx = prod.submit(late, publish=False)
    assert run(vm, prod.queue, idx).reason is EndReason.CAUGHT_UP
    assert prod.read_dispatch_id == 1
    vm.write(RING + 64 * idx, late[:2])
    assert run(vm, prod.queue, idx).reason is EndReason.CAUGHT_UP
    assert prod.read_dispatch_id == 2


def test_ring_wraps_and_every_slot_is_released():
    vm = Vm()
    prod = Producer(vm, slots=4)
    done = signal(vm, 1, 11)
    for _ in range(11):
        prod.submit(barrier(3, [], done))
        assert run(vm, prod.queue, prod.index - 1).reason is EndReason.CAUGHT_UP
    assert prod.read_dispatch_id == 11 and vm.i64(done + 8) == 0
    assert all(vm.read(RING + 64 * i, 1)[0] == aql.PacketType.INVALID for i in range(4))


def test_run_looks_at_most_one_ring_ahead():
    """write_dispatch_id may run ahead of what the ring holds (producers reserve, then wait
    for space): the CP never reads a slot twice in one pass."""
    vm = Vm()
    prod = Producer(vm, slots=4)
    for _ in range(4):
        prod.submit(barrier(3, [], 0))
    vm.write(AMDQ + aql.AMD_QUEUE_WRITE_DISPATCH_ID, struct.pack("<Q", 100))
    assert run(vm, prod.queue).reason is EndReason.CAUGHT_UP
    assert prod.read_dispatch_id == 4


# -- vendor packets --------------------------------------------------------------------------
def test_rocr_pm4_ib_cache_invalidation_is_consumed():
    """ExecutePM4 (GpuAgent::InvalidateCodeCaches): ROCr spins until read index > its slot."""
    vm = Vm()
    prod = Producer(vm)
    vm.write(IB, acquire_mem())
    prod.submit(pm4_ib(IB, 7))
    assert run(vm, prod.queue).reason is EndReason.CAUGHT_UP
    assert prod.read_dispatch_id == 1
    assert Read(IB, 28) in vm.requests


def test_pm4_ib_with_another_opcode_is_a_vendor_packet_error():
    vm = Vm()
    inactive = signal(vm, 9, 0, event_id=7)
    prod = Producer(vm, inactive_signal=inactive)
    vm.write(IB, struct.pack("<3I", 3 << 30 | 1 << 16 | 0x49 << 8, 0, 0))  # RELEASE_MEM
    prod.submit(pm4_ib(IB, 3))
    end = run(vm, prod.queue)
    assert end.reason is EndReason.ERROR and "0x49" in (end.error or "")
    assert vm.i64(inactive + 8) == aql.QueueError.VENDOR_PACKET


@pytest.mark.parametrize("cond,value,mask,sig_value,met", [
    (0, 4, -1, 4, True), (0, 4, -1, 5, False), (1, 4, -1, 5, True), (2, 0, -1, -1, True),
    (2, 0, -1, 0, False), (3, 3, 0xFF, 0x103, True), (3, 4, 0xFF, 0x103, False)])
def test_barrier_value_packet(cond: int, value: int, mask: int, sig_value: int, met: bool):
    vm = Vm()
    prod = Producer(vm)
    s = signal(vm, 1, sig_value)
    done = signal(vm, 2, 1)
    prod.submit(barrier_value(s, value, mask, cond, done))
    end = run(vm, prod.queue)
    assert end.reason is (EndReason.CAUGHT_UP if met else EndReason.POLLING)
    assert vm.i64(done + 8) == (0 if met else 1)


def test_unknown_vendor_format_and_packet_type_are_queue_errors():
    for raw, code in ((struct.pack("<HB61x", 0, 9), aql.QueueError.VENDOR_PACKET),
                      (struct.pack("<H62x", 0x17), aql.QueueError.INVALID_FORMAT),
                      (struct.pack("<H62x", 4), aql.QueueError.INVALID_FORMAT)):
        vm = Vm()
        inactive = signal(vm, 9, 0, event_id=3)
        prod = Producer(vm, inactive_signal=inactive)
        prod.submit(raw)
        end = run(vm, prod.queue)
        assert end.reason is EndReason.ERROR
        assert vm.i64(inactive + 8) == code and Interrupt(3) in vm.requests


# -- kernel dispatch: fails visibly ----------------------------------------------------------
def test_kernel_dispatch_is_a_queue_error_rocr_sees():
    vm = Vm()
    inactive = signal(vm, 9, 0, event_id=5)
    prod = Producer(vm, inactive_signal=inactive)
    done = signal(vm, 1, 1, event_id=6)
    prod.submit(dispatch(0x7F55_1234_5000, done))
    prod.submit(barrier(3, [], done))
    end = run(vm, prod.queue, 1)
    assert end.reason is EndReason.ERROR and not end.ok
    assert "0x7f5512345000" in (end.error or "") and "KERNEL_DISPATCH" in (end.error or "")
    assert prod.queue.state is QueueState.ERROR
    # DynamicScratchHandler: 8 = invalid code -> HSA_STATUS_ERROR_INVALID_CODE_OBJECT
    assert vm.i64(inactive + 8) == aql.QueueError.INVALID_CODE == 8
    assert Interrupt(5) in vm.requests and vm.read(EVENTS + 8 * 9, 4) == struct.pack("<I", 5)
    # never completes silently, and nothing after it runs
    assert vm.i64(done + 8) == 1 and prod.read_dispatch_id == 0
    assert vm.read(RING, 1)[0] == aql.PacketType.KERNEL_DISPATCH
    # ERROR is for good: a later doorbell asks nothing of memory
    end2 = run(vm, prod.queue, 1)
    assert end2.reason is EndReason.ERROR and vm.requests == []


def test_queue_error_without_amd_queue_layout_still_stops_the_queue():
    """Pointers not laid out as amd_queue_t: nowhere to report, the queue still stops."""
    vm = Vm()
    q = aql.AqlQueue(RING, 64 * 4, AMDQ + 0x800, AMDQ)
    vm.write(AMDQ, struct.pack("<Q", 1))
    vm.write(RING, dispatch(0x1000, 0))
    end = run(vm, q)
    assert end.reason is EndReason.ERROR and q.amd_queue_va is None


def test_queue_error_with_the_legacy_doorbell_write_pointer_is_reported():
    """ROCr's doorbell types other than 2 give max_legacy_doorbell_dispatch_id_plus_1 (@80)
    as the write pointer: the same amd_queue_t, the same error report."""
    vm = Vm()
    inactive = signal(vm, 9, 0, event_id=4)
    prod = Producer(vm, inactive_signal=inactive)
    q = aql.AqlQueue(RING, 16 * 64, AMDQ + aql.AMD_QUEUE_READ_DISPATCH_ID,
                     AMDQ + aql.AMD_QUEUE_LEGACY_WRITE_POINTER)
    vm.write(RING, dispatch(0x2000, 0))
    vm.write(AMDQ + aql.AMD_QUEUE_LEGACY_WRITE_POINTER, struct.pack("<Q", 1))
    assert run(vm, q).reason is EndReason.ERROR
    assert vm.i64(inactive + 8) == aql.QueueError.INVALID_CODE and Interrupt(4) in vm.requests
    assert prod.read_dispatch_id == 0


def test_queue_error_reports_only_to_a_real_amd_queue():
    """read_dispatch_id_field_base_byte_offset (@136) must say 128, as ROCr sets it: else
    the words around the pointers are not an amd_queue_t and nothing is written there."""
    vm = Vm()
    inactive = signal(vm, 9, 0, event_id=4)
    prod = Producer(vm, inactive_signal=inactive)
    vm.write(AMDQ + aql.AMD_QUEUE_READ_DISPATCH_ID_FIELD_BASE_BYTE_OFFSET, struct.pack("<I", 0))
    prod.submit(dispatch(0x3000, 0))
    assert run(vm, prod.queue).reason is EndReason.ERROR
    assert vm.i64(inactive + 8) == 0 and not any(isinstance(r, Interrupt) for r in vm.requests)


# -- faults ----------------------------------------------------------------------------------
def test_gpu_fault_on_a_dependency_signal_stops_the_queue():
    vm = Vm()
    prod = Producer(vm)
    bad = 0x5000_0000_0000
    vm.unmapped.add(bad >> 12)
    prod.submit(barrier(3, [bad], 0))
    end = run(vm, prod.queue)
    assert end.reason is EndReason.ERROR and end.fault is not None and end.fault.va == bad + 8
    assert prod.queue.state is QueueState.ERROR and end.offset == 0


def test_ring_size_must_be_a_power_of_two_of_packets():
    for size in (0, 32, 64 * 3, 100):
        with pytest.raises(ValueError):
            aql.AqlQueue(RING, size, AMDQ + 128, AMDQ + 56)


# -- the layouts against Debian's ROCr 5.2.3 headers ------------------------------------------
_OFFSETS_C = r"""
#include <stddef.h>
#include <stdio.h>
#include <hsa/hsa.h>
#include <hsa/hsa_ext_amd.h>
#include <hsa/amd_hsa_queue.h>
#include <hsa/amd_hsa_signal.h>
#define P(t, f) printf("%s.%s %zu\n", #t, #f, offsetof(t, f))
int main(void) {
  P(amd_queue_t, write_dispatch_id); P(amd_queue_t, read_dispatch_id);
  P(amd_queue_t, read_dispatch_id_field_base_byte_offset);
  P(amd_queue_t, queue_inactive_signal);
  P(amd_signal_t, value); P(amd_signal_t, event_mailbox_ptr); P(amd_signal_t, event_id);
  P(hsa_kernel_dispatch_packet_t, kernel_object);
  P(hsa_kernel_dispatch_packet_t, private_segment_size);
  P(hsa_kernel_dispatch_packet_t, completion_signal);
  P(hsa_barrier_and_packet_t, dep_signal); P(hsa_barrier_or_packet_t, completion_signal);
  P(hsa_agent_dispatch_packet_t, return_address);
  P(hsa_amd_barrier_value_packet_t, signal); P(hsa_amd_barrier_value_packet_t, value);
  P(hsa_amd_barrier_value_packet_t, mask); P(hsa_amd_barrier_value_packet_t, cond);
  P(hsa_amd_barrier_value_packet_t, completion_signal);
  P(hsa_amd_vendor_packet_header_t, AmdFormat);
  printf("types %d %d %d %d %d %d %d\n", HSA_PACKET_TYPE_VENDOR_SPECIFIC,
         HSA_PACKET_TYPE_INVALID, HSA_PACKET_TYPE_KERNEL_DISPATCH, HSA_PACKET_TYPE_BARRIER_AND,
         HSA_PACKET_TYPE_AGENT_DISPATCH, HSA_PACKET_TYPE_BARRIER_OR,
         HSA_AMD_PACKET_TYPE_BARRIER_VALUE);
  return 0;
}
"""


@pytest.mark.skipif(not Path("/usr/include/hsa/amd_hsa_queue.h").exists() or
                    shutil.which("cc") is None, reason="libhsa-runtime-dev is not installed")
def test_layouts_match_rocr_headers(tmp_path: Path):
    """Every offset aql.py reads or writes is the one Debian's ROCr 5.2.3 headers give."""
    src, exe = tmp_path / "off.c", tmp_path / "off"
    src.write_text(_OFFSETS_C)
    subprocess.run(["cc", "-o", str(exe), str(src)], check=True)
    out = dict(line.rsplit(" ", 1) for line in
               subprocess.run([str(exe)], capture_output=True, text=True,
                              check=True).stdout.splitlines() if not line.startswith("types"))
    got = {k: int(v) for k, v in out.items()}
    assert got["amd_queue_t.write_dispatch_id"] == aql.AMD_QUEUE_WRITE_DISPATCH_ID
    assert got["amd_queue_t.read_dispatch_id"] == aql.AMD_QUEUE_READ_DISPATCH_ID
    assert (got["amd_queue_t.read_dispatch_id_field_base_byte_offset"]
            == aql.AMD_QUEUE_READ_DISPATCH_ID_FIELD_BASE_BYTE_OFFSET)
    assert got["amd_queue_t.queue_inactive_signal"] == aql.AMD_QUEUE_INACTIVE_SIGNAL
    assert got["amd_signal_t.value"] == aql.AMD_SIGNAL_VALUE
    assert got["amd_signal_t.event_mailbox_ptr"] == aql.AMD_SIGNAL_EVENT_MAILBOX_PTR
    assert got["amd_signal_t.event_id"] == aql.AMD_SIGNAL_EVENT_ID
    # the decoder's struct formats put each field where the header does
    kobj, done = 0x1111_2222_3333_4444, 0x5555_6666_7777_8888
    raw = bytearray(64)
    raw[0] = aql.PacketType.KERNEL_DISPATCH
    off = got["hsa_kernel_dispatch_packet_t.kernel_object"]
    raw[off:off + 8] = kobj.to_bytes(8, "little")
    off = got["hsa_kernel_dispatch_packet_t.completion_signal"]
    raw[off:off + 8] = done.to_bytes(8, "little")
    off = got["hsa_kernel_dispatch_packet_t.private_segment_size"]
    raw[off:off + 4] = (77).to_bytes(4, "little")
    p = aql.decode_packet(bytes(raw))
    assert isinstance(p, aql.KernelDispatch)
    assert (p.kernel_object, p.completion_signal, p.private_segment_size) == (kobj, done, 77)
    raw = bytearray(64)
    raw[got["hsa_amd_vendor_packet_header_t.AmdFormat"]] = aql.HSA_AMD_PACKET_TYPE_BARRIER_VALUE
    for name, v, n in (("signal", 0xAB00, 8), ("value", 5, 8), ("mask", 0xFF, 8), ("cond", 2, 4),
                       ("completion_signal", 0xCD00, 8)):
        off = got[f"hsa_amd_barrier_value_packet_t.{name}"]
        raw[off:off + n] = v.to_bytes(n, "little")
    bv = aql.decode_packet(bytes(raw))
    assert isinstance(bv, aql.BarrierValue)
    assert (bv.signal, bv.value, bv.mask, bv.cond, bv.completion_signal) == (
        0xAB00, 5, 0xFF, 2, 0xCD00)
    assert got["hsa_barrier_and_packet_t.dep_signal"] == 8
    assert got["hsa_barrier_or_packet_t.completion_signal"] == 56


@given(st.lists(st.tuples(st.sampled_from([3, 5]), st.booleans(), st.booleans()),
                min_size=1, max_size=40),
       st.sampled_from([1, 2, 4, 8]))
def test_any_submission_order_completes_every_barrier_once(
        subs: list[tuple[int, bool, bool]], slots: int):
    """ROCr's producer protocol in any interleaving (a slot published now or at the next
    doorbell, a doorbell rung or not), across ring wraps: every published barrier runs
    exactly once, in order, and the read index ends at the number of packets."""
    vm = Vm()
    prod = Producer(vm, slots=slots)
    done = signal(vm, 1, len(subs))
    pending: list[tuple[int, bytes]] = []
    for kind, publish_now, ring in subs:
        if prod.index - prod.read_dispatch_id >= slots:  # ROCr waits for room
            for idx, pkt in pending:
                vm.write(RING + 64 * (idx % slots), pkt[:2])
            pending.clear()
            run(vm, prod.queue, prod.index - 1)
        assert prod.index - prod.read_dispatch_id < slots
        pkt = barrier(kind, [], done)
        idx = prod.submit(pkt, publish=publish_now and not pending)
        if not (publish_now and not pending):
            pending.append((idx, pkt))
        if ring:
            assert run(vm, prod.queue, idx).reason is EndReason.CAUGHT_UP
    for idx, pkt in pending:
        vm.write(RING + 64 * (idx % slots), pkt[:2])
    assert run(vm, prod.queue, prod.index - 1).reason is EndReason.CAUGHT_UP
    assert prod.read_dispatch_id == len(subs) == prod.queue.packets_done
    assert vm.i64(done + 8) == 0
    assert all(vm.read(RING + 64 * i, 1)[0] == aql.PacketType.INVALID for i in range(slots))
