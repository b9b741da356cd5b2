"""AQL queues without shaders: the packet formats of hsa.h / hsa_ext_amd.h / amd_hsa_queue.h
and `AqlQueue`, the command processor of a COMPUTE_AQL queue, sans-IO (engine.py's run
protocol: a generator of Read/Write/Atomic/Interrupt/Sleep/Executed requests).

What Debian's ROCr 5.2.3 does on a gfx90a agent, read from ROCR-Runtime at tag rocm-5.2.3
(amd_aql_queue.cpp, amd_gpu_agent.cpp, interrupt_signal.cpp, flag.h, amd_topology.cpp) and
ROCT-Thunk-Interface rocm-5.2.3 (queues.c, debug.c), and seen in a node's `--trace`:

* hsa_init: OPEN, GET_VERSION, ACQUIRE_VM, SET_MEMORY_POLICY, apertures;
  `hsaKmtRuntimeEnable` asks the debug-trap version (`_IOWR('K', 0x82, 40)`, ENOTTY here),
  so `supports_exception_debugging` is false: queue errors arrive ONLY through
  `amd_queue_t.queue_inactive_signal` (DynamicScratchHandler<true>), never through the
  CWSR header's ErrorReason/ErrorEventId. Events: one MEMORY event (type 8, manual reset,
  with the 32 KiB events page; Runtime's VM-fault handler, which prints "Memory access fault
  by GPU node-N ..." and abort()s), and SIGNAL events (type 0, auto reset) from its event
  pool: the async-signal thread's wake event, then one `queue_event_` shared by all AQL
  queues. No HW_EXCEPTION event in 5.2.3. SET_SCRATCH_BACKING_VA, SET_TRAP_HANDLER.
* hsa_queue_create (and ROCr's own utility / blit queues, 64 packets): the ring is paged
  system memory registered to the GPU (GPU VA = CPU VA), headers pre-set to INVALID,
  `amd_queue_t` zeroed. `hsaKmtCreateQueue(COMPUTE_AQL, 100 %, priority NORMAL -> KFD 7)`:
  ring_size = packets * 64 bytes; read_pointer_address = &amd_queue_t.read_dispatch_id
  (@128), write_pointer_address = &write_dispatch_id (@56; doorbell type 2 on gfx9);
  libhsakmt adds the EOP buffer (4096 bytes on gfx9) and the CWSR area (gfx90a, 104 CUs:
  ctx_save_restore_size 63508480, ctl_stack_size 36864; the header's ErrorEventId/ErrorReason
  unused here). libhsakmt 5.2.3 passes the 88-byte CREATE_QUEUE (ctl_stack_size @84; the
  newer kernel's 96 bytes add sdma_engine_id).
* The CP's side of amd_queue_t: it consumes packets from `read_dispatch_id` while it is
  below `write_dispatch_id` (the doorbell, a 64-bit store of the *last* packet index
  written, only wakes it: ROCr's ExecutePM4 then waits for read index > that index), stalls
  on a header still INVALID, sets each consumed header back to INVALID and advances
  `read_dispatch_id` (packets, not bytes). `read_dispatch_id_field_base_byte_offset` (@136)
  = 128 lets the CP find amd_queue_t from the rptr address; `queue_inactive_signal` (@192)
  is where the CP reports a queue error: it stores the error code in the signal's value
  and wakes its event. ROCr maps the code (DynamicScratchHandler): 8 "invalid (or NULL)
  code" -> HSA_STATUS_ERROR_INVALID_CODE_OBJECT, 32 invalid packet format / 256 vendor
  packet -> HSA_STATUS_ERROR_INVALID_PACKET_FORMAT, ...; it then suspends the queue
  (UPDATE_QUEUE, percentage 0) and calls the error callback given to hsa_queue_create.
* Vendor packets ROCr itself puts on an AQL queue: only AMD_AQL_FORMAT_PM4_IB (format 1 in
  the vendor header's second u16; GpuAgent::InvalidateCodeCaches -> ExecutePM4 on the
  utility queue whenever a code object is loaded): a PM4 INDIRECT_BUFFER jump (4 dwords) to
  an IB holding one ACQUIRE_MEM cache invalidation (7 dwords on gfx9), dw_cnt_remain 0xA, no
  completion signal; ROCr spins until the read index passes it. The barrier-value packet
  (HSA_AMD_PACKET_TYPE_BARRIER_VALUE, format 2) is public API for users (HIP's stream wait
  value); ROCr's blit kernels use BARRIER_AND for dependencies.
* Signals (amd_signal_t, 64 bytes: kind @0, value @8, event_mailbox_ptr @16, event_id @24):
  with HSA_ENABLE_INTERRUPT unset (default on) hsa_signal_create makes InterruptSignals on
  a pooled SIGNAL event: mailbox = the event's slot (HWData2), id = EventId. A blocked wait
  spins 200 us then calls hsaKmtWaitOnEvent (WAIT_EVENTS) and re-checks the value, so a
  completion must store the value first, then write the mailbox and raise the interrupt.
* Copies: hsa_amd_memory_async_copy host<->device uses BlitSdma (SDMA queues; on gfx90a the
  host->device one is created first so it lands on SDMA0) unless HSA_ENABLE_SDMA=0 (default:
  SDMA on for every gfx9 dGPU); device->device on one agent is a blit *kernel* on an AQL
  queue unless smaller than HSA_FORCE_SDMA_SIZE (1 MiB), so the emulator can serve it
  only below that size. The GPU->CPU io_link's flags (bit 3: no 64-bit atomics) choose
  between SDMA ATOMIC and FENCE completions; NumSdmaXgmiEngines adds XGMI blits for
  GPU<->GPU in one hive.

This module runs BARRIER_AND / BARRIER_OR, the barrier-value and PM4-IB vendor packets (the
IB may hold only ACQUIRE_MEM and NOP: caches are coherent here); a KERNEL_DISPATCH cannot
run (no ISA), so the queue goes to ERROR with code 8, reported through
queue_inactive_signal as the CP reports it; any other packet is code 32 or 256.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Generator
from dataclasses import dataclass
from typing import ClassVar, Final

from ualinkd.amdgpu.engine import (
    Atomic,
    AtomicOp,
    EndReason,
    EngineRun,
    Executed,
    GpuFault,
    Interrupt,
    QueueState,
    Read,
    Request,
    RunEnd,
    Write,
)

__all__ = [
    "AQL_PACKET_SIZE",
    "AgentDispatch",
    "AqlDecodeError",
    "AqlPacket",
    "AqlQueue",
    "BarrierAnd",
    "BarrierOr",
    "BarrierValue",
    "InvalidPacket",
    "KernelDispatch",
    "PacketHeader",
    "PacketType",
    "Pm4Ib",
    "QueueError",
    "UnknownPacket",
    "VendorPacket",
    "decode_packet",
    "decode_pm4",
]

AQL_PACKET_SIZE: Final = 64

# amd_hsa_queue.h: amd_queue_t offsets (256 bytes, 64-byte aligned)
AMD_QUEUE_WRITE_DISPATCH_ID: Final = 56
AMD_QUEUE_LEGACY_WRITE_POINTER: Final = 80  # max_legacy_doorbell_dispatch_id_plus_1
AMD_QUEUE_READ_DISPATCH_ID: Final = 128
AMD_QUEUE_READ_DISPATCH_ID_FIELD_BASE_BYTE_OFFSET: Final = 136
AMD_QUEUE_INACTIVE_SIGNAL: Final = 192
# amd_hsa_signal.h: amd_signal_t offsets
AMD_SIGNAL_VALUE: Final = 8
AMD_SIGNAL_EVENT_MAILBOX_PTR: Final = 16
AMD_SIGNAL_EVENT_ID: Final = 24

# hsa_ext_amd.h's hsa_amd_vendor_packet_header_t.AmdFormat, and ROCr's internal PM4 IB format
AMD_AQL_FORMAT_PM4_IB: Final = 1
HSA_AMD_PACKET_TYPE_BARRIER_VALUE: Final = 2

# PM4 type-3 opcodes ROCr 5.2.3 uses in its vendor packet (core/inc/amd_gpu_pm4.h)
PM4_IT_NOP: Final = 0x10
PM4_IT_INDIRECT_BUFFER: Final = 0x3F
PM4_IT_ACQUIRE_MEM: Final = 0x58
PM4_IB_MAX_DWORDS: Final = 0xFFFFF  # PM4_INDIRECT_BUFFER_DW3_IB_SIZE's field

class PacketType(enum.IntEnum):
    """hsa_packet_type_t (hsa.h): the header's bits 7:0."""

    VENDOR_SPECIFIC = 0
    INVALID = 1
    KERNEL_DISPATCH = 2
    BARRIER_AND = 3
    AGENT_DISPATCH = 4
    BARRIER_OR = 5


class QueueError(enum.IntEnum):
    """The error codes the CP stores in queue_inactive_signal, as ROCr 5.2.3's
    AqlQueue::DynamicScratchHandler reads them (its comments name each bit)."""

    INVALID_DIM = 2
    INVALID_GROUP_MEMORY = 4
    INVALID_CODE = 8  # -> HSA_STATUS_ERROR_INVALID_CODE_OBJECT
    INVALID_FORMAT = 32  # -> HSA_STATUS_ERROR_INVALID_PACKET_FORMAT
    VENDOR_PACKET = 256  # -> HSA_STATUS_ERROR_INVALID_PACKET_FORMAT


class AqlDecodeError(ValueError):
    """A slot that is not 64 bytes, or a PM4 stream cut inside a packet: the only errors
    the decoders raise."""


class SignalCondition(enum.IntEnum):
    """hsa_signal_condition_t (hsa.h), as the barrier-value packet's `cond`."""

    EQ = 0
    NE = 1
    LT = 2
    GTE = 3


@dataclass(frozen=True, slots=True)
class PacketHeader:
    """hsa_packet_header_t's fields (hsa.h): type 7:0, barrier bit 8, acquire fence scope
    10:9, release fence scope 12:11."""

    type: int
    barrier: bool
    acquire_scope: int
    release_scope: int

    @classmethod
    def of(cls, header: int) -> PacketHeader:
        return cls(header & 0xFF, bool(header >> 8 & 1), header >> 9 & 3, header >> 11 & 3)


@dataclass(frozen=True, slots=True)
class KernelDispatch:
    NAME: ClassVar[str] = "KERNEL_DISPATCH"
    barrier: bool  # the header's fields (PacketHeader), the type being the class
    acquire_scope: int
    release_scope: int
    setup: int  # dimensions in bits 1:0
    workgroup_size: tuple[int, int, int]
    grid_size: tuple[int, int, int]
    private_segment_size: int
    group_segment_size: int
    kernel_object: int
    kernarg_address: int
    completion_signal: int


@dataclass(frozen=True, slots=True)
class BarrierAnd:
    NAME: ClassVar[str] = "BARRIER_AND"
    barrier: bool  # the header's fields (PacketHeader), the type being the class
    acquire_scope: int
    release_scope: int
    dep_signals: tuple[int, ...]  # the five handles, 0 = none
    completion_signal: int


@dataclass(frozen=True, slots=True)
class BarrierOr:
    NAME: ClassVar[str] = "BARRIER_OR"
    barrier: bool  # the header's fields (PacketHeader), the type being the class
    acquire_scope: int
    release_scope: int
    dep_signals: tuple[int, ...]
    completion_signal: int


@dataclass(frozen=True, slots=True)
class AgentDispatch:
    NAME: ClassVar[str] = "AGENT_DISPATCH"
    barrier: bool  # the header's fields (PacketHeader), the type being the class
    acquire_scope: int
    release_scope: int
    type: int
    return_address: int
    args: tuple[int, int, int, int]
    completion_signal: int


@dataclass(frozen=True, slots=True)
class BarrierValue:
    """hsa_amd_barrier_value_packet_t: wait until (signal.value & mask) `cond` value."""

    NAME: ClassVar[str] = "BARRIER_VALUE"
    barrier: bool  # the header's fields (PacketHeader), the type being the class
    acquire_scope: int
    release_scope: int
    signal: int
    value: int  # signed, as hsa_signal_value_t
    mask: int
    cond: int
    completion_signal: int


@dataclass(frozen=True, slots=True)
class Pm4Ib:
    """ROCr's amd_aql_pm4_ib (ExecutePM4 on gfx9+): an INDIRECT_BUFFER jump in dwords 1-4,
    dw_cnt_remain, completion signal @56. ib_va/ib_dwords decoded from the jump when its
    first dword is a type-3 INDIRECT_BUFFER header, else None."""

    NAME: ClassVar[str] = "PM4_IB"
    barrier: bool  # the header's fields (PacketHeader), the type being the class
    acquire_scope: int
    release_scope: int
    ib_jump: tuple[int, int, int, int]
    dw_cnt_remain: int
    completion_signal: int
    ib_va: int | None
    ib_dwords: int


@dataclass(frozen=True, slots=True)
class VendorPacket:
    """A vendor-specific packet of a format nobody here runs."""

    NAME: ClassVar[str] = "VENDOR_SPECIFIC"
    barrier: bool  # the header's fields (PacketHeader), the type being the class
    acquire_scope: int
    release_scope: int
    amd_format: int
    completion_signal: int


@dataclass(frozen=True, slots=True)
class InvalidPacket:
    """Header type INVALID: a slot not (yet) published by its producer."""

    NAME: ClassVar[str] = "INVALID"
    barrier: bool  # the header's fields (PacketHeader), the type being the class
    acquire_scope: int
    release_scope: int


@dataclass(frozen=True, slots=True)
class UnknownPacket:
    """A header type hsa.h does not define (6..255)."""

    NAME: ClassVar[str] = "UNKNOWN"
    barrier: bool  # the header's fields (PacketHeader), the type being the class
    acquire_scope: int
    release_scope: int
    type: int
    completion_signal: int


AqlPacket = (KernelDispatch | BarrierAnd | BarrierOr | AgentDispatch | BarrierValue | Pm4Ib
             | VendorPacket | InvalidPacket | UnknownPacket)

_DISPATCH = struct.Struct("<HH3H2x3IIIQQ8xQ")
_BARRIER = struct.Struct("<H2x4x5Q8xQ")
_AGENT = struct.Struct("<HH4xQ4Q8xQ")
_BARRIER_VALUE = struct.Struct("<HBx4xQqqI4x8x8xQ")
_PM4_IB = struct.Struct("<HH4II32xQ")
_VENDOR = struct.Struct("<HBx52xQ")
_HEADER = struct.Struct("<H54xQ")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
_U32 = struct.Struct("<I")
assert all(s.size == AQL_PACKET_SIZE for s in (_DISPATCH, _BARRIER, _AGENT, _BARRIER_VALUE,
                                                _PM4_IB, _VENDOR, _HEADER))


def _ib_target(jump: tuple[int, int, int, int]) -> tuple[int | None, int]:
    """An INDIRECT_BUFFER's IB address and size in dwords (amd_gpu_pm4.h: DW1 IB_BASE_LO
    bits 31:2, DW2 IB_BASE_HI 15:0, DW3 IB_SIZE 19:0), or (None, 0) for another header."""
    hdr = jump[0]
    if hdr >> 30 != 3 or hdr >> 8 & 0xFF != PM4_IT_INDIRECT_BUFFER:
        return None, 0
    return (jump[2] & 0xFFFF) << 32 | (jump[1] & ~3 & 0xFFFFFFFF), jump[3] & PM4_IB_MAX_DWORDS


def decode_packet(raw: bytes) -> AqlPacket:
    """One 64-byte AQL slot as its typed packet. Total over every 64-byte value (an unknown
    type or vendor format is a value too); AqlDecodeError only for another length."""
    if len(raw) != AQL_PACKET_SIZE:
        raise AqlDecodeError(f"an AQL packet is {AQL_PACKET_SIZE} bytes, not {len(raw)}")
    h = PacketHeader.of(raw[0] | raw[1] << 8)
    fences = (h.barrier, h.acquire_scope, h.release_scope)
    t = h.type
    if t == PacketType.KERNEL_DISPATCH:
        (_, setup, wx, wy, wz, gx, gy, gz, priv, group, kobj, karg,
         done) = _DISPATCH.unpack(raw)
        return KernelDispatch(*fences, setup, (wx, wy, wz), (gx, gy, gz), priv, group, kobj,
                              karg, done)
    if t in (PacketType.BARRIER_AND, PacketType.BARRIER_OR):
        _, *deps, done = _BARRIER.unpack(raw)
        cls = BarrierAnd if t == PacketType.BARRIER_AND else BarrierOr
        return cls(*fences, tuple(deps), done)
    if t == PacketType.AGENT_DISPATCH:
        _, kind, ret, a0, a1, a2, a3, done = _AGENT.unpack(raw)
        return AgentDispatch(*fences, kind, ret, (a0, a1, a2, a3), done)
    if t == PacketType.INVALID:
        return InvalidPacket(*fences)
    if t == PacketType.VENDOR_SPECIFIC:
        fmt = raw[2]
        if fmt == HSA_AMD_PACKET_TYPE_BARRIER_VALUE:
            _, _, sig, value, mask, cond, done = _BARRIER_VALUE.unpack(raw)
            return BarrierValue(*fences, sig, value, mask, cond, done)
        # ROCr writes the PM4 format as a u16 (ven_hdr = 1): the second byte is 0.
        if fmt == AMD_AQL_FORMAT_PM4_IB and raw[3] == 0:
            _, _, j0, j1, j2, j3, remain, done = _PM4_IB.unpack(raw)
            jump = (j0, j1, j2, j3)
            ib_va, ib_dwords = _ib_target(jump)
            return Pm4Ib(*fences, jump, remain, done, ib_va, ib_dwords)
        _, fmt, done = _VENDOR.unpack(raw)
        return VendorPacket(*fences, fmt, done)
    _, done = _HEADER.unpack(raw)
    return UnknownPacket(*fences, t, done)


@dataclass(frozen=True, slots=True)
class Pm4Packet:
    """A PM4 type-3 packet in an IB: opcode and its body dwords (header excluded)."""

    opcode: int
    body: tuple[int, ...]


def decode_pm4(data: bytes) -> list[Pm4Packet]:
    """A PM4 stream's type-3 packets (header: type 31:30 = 3, count 29:16 = body dwords - 1,
    opcode 15:8). A type-2 filler dword (0x80000000) is skipped; any other type, or a count
    running past the end, is AqlDecodeError."""
    if len(data) % 4:
        raise AqlDecodeError("a PM4 stream is whole dwords")
    dws = struct.unpack(f"<{len(data) // 4}I", data)
    out, i = [], 0
    while i < len(dws):
        hdr = dws[i]
        kind = hdr >> 30
        if kind == 2:
            i += 1
            continue
        if kind != 3:
            raise AqlDecodeError(f"PM4 type-{kind} header {hdr:#010x} at dword {i}")
        n = (hdr >> 16 & 0x3FFF) + 1
        if i + 1 + n > len(dws):
            raise AqlDecodeError(f"PM4 packet at dword {i} runs past the IB ({n} dwords)")
        out.append(Pm4Packet(hdr >> 8 & 0xFF, dws[i + 1:i + 1 + n]))
        i += 1 + n
    return out


def _condition_met(cond: int, value: int, ref: int) -> bool | None:
    if cond == SignalCondition.EQ:
        return value == ref
    if cond == SignalCondition.NE:
        return value != ref
    if cond == SignalCondition.LT:
        return value < ref
    if cond == SignalCondition.GTE:
        return value >= ref
    return None


# A step of a run (a packet's work, a signal update): requests out, answers in, no value.
_Steps = Generator[Request, object, None]


class _Stop(Exception):
    """Internal: a packet stopped the queue (error) or must be retried (polling)."""

    def __init__(self, end: RunEnd) -> None:
        super().__init__(end.error)
        self.end = end


class AqlQueue:
    """The CP's view of one COMPUTE_AQL queue (CREATE_QUEUE's ring and pointers). One owner:
    the edge that drives its `run()`; `state`, `read_index` and `packets_done` are read by
    the tracer and ualinkctl, `error` (a RunEnd, as SdmaRing's) by the edge.

    `run(doorbell)` consumes packets from `read_index` while it is below the
    write_dispatch_id in memory (the doorbell value is the last index written, a wake-up),
    stops at a header still INVALID (caught up: the producer has not published it), at a
    barrier whose signals are not satisfied yet (POLLING: run it again later; nothing
    consumed) or at a queue error (ERROR, for good: the code stored in queue_inactive_signal
    and its event woken, as the CP does)."""

    def __init__(self, ring_base: int, ring_size: int, read_pointer_va: int,
                 write_pointer_va: int) -> None:
        if ring_size < AQL_PACKET_SIZE or ring_size & (ring_size - 1):
            raise ValueError(f"an AQL ring is a power of two of packets, not {ring_size} bytes")
        self.ring_base = ring_base
        self.ring_size = ring_size
        self.slots = ring_size // AQL_PACKET_SIZE
        self.read_pointer_va = read_pointer_va
        self.write_pointer_va = write_pointer_va
        # amd_queue_t is found from the rptr address (read_dispatch_id @128), as the CP does
        # with read_dispatch_id_field_base_byte_offset; only when the pointers are laid out
        # as in amd_queue_t (the write pointer write_dispatch_id, or the legacy doorbell's
        # proxy) is there a queue_inactive_signal to report errors to (_fail checks @136).
        base = read_pointer_va - AMD_QUEUE_READ_DISPATCH_ID
        self.amd_queue_va: int | None = (
            base if write_pointer_va - base in (AMD_QUEUE_WRITE_DISPATCH_ID,
                                                AMD_QUEUE_LEGACY_WRITE_POINTER) else None)
        self.read_index = 0  # packets; CREATE_QUEUE zeroes the hardware rptr
        self.state = QueueState.IDLE
        self.packets_done = 0
        # The queue error, once reached (for good): what every later run returns; the edge
        # reads it after each step, to report it before the requests that tell the client
        # (whose handler may destroy the queue before the run ends).
        self.error: RunEnd | None = None

    def offset_of(self, index: int) -> int:
        return index % self.slots * AQL_PACKET_SIZE

    def run(self, doorbell: int) -> EngineRun:
        if self.error is not None:
            return self.error
        self.state = QueueState.RUNNING
        offset = self.offset_of(self.read_index)
        try:
            raw_wptr = yield Read(self.write_pointer_va, 8)
            assert isinstance(raw_wptr, bytes)
            wptr = _U64.unpack(raw_wptr)[0]
            # Producers may reserve beyond what the ring holds (they wait for space before
            # writing), so never look further than one ring ahead.
            end = min(wptr, self.read_index + self.slots)
            while self.read_index < end:
                offset = self.offset_of(self.read_index)
                raw = yield Read(self.ring_base + offset, AQL_PACKET_SIZE)
                assert isinstance(raw, bytes)
                packet = decode_packet(raw)
                if isinstance(packet, InvalidPacket):
                    break
                yield from self._execute(packet, offset)
                # Release the slot: header INVALID first, then the read index, so a
                # producer waiting on the index never sees our late store on its new packet.
                yield Write(self.ring_base + offset, struct.pack("<H", PacketType.INVALID))
                self.read_index += 1
                yield Write(self.read_pointer_va, _U64.pack(self.read_index))
                done = _completion_signal(packet)
                if done:
                    yield from self._decrement(done)
                self.packets_done += 1
                yield Executed(offset, packet)
        except _Stop as stop:
            if stop.end.reason is EndReason.POLLING:
                self.state = QueueState.POLLING
            return stop.end
        except GpuFault as fault:
            self.state = QueueState.ERROR
            self.error = RunEnd(EndReason.ERROR, offset, f"{fault} at ring offset {offset:#x}",
                                fault)
            return self.error
        self.state = QueueState.IDLE
        return RunEnd(EndReason.CAUGHT_UP, self.offset_of(self.read_index))

    # -- packets ---------------------------------------------------------------------------
    def _execute(self, packet: AqlPacket, offset: int) -> _Steps:
        if isinstance(packet, (BarrierAnd, BarrierOr)):
            deps = [s for s in packet.dep_signals if s]
            values = []
            for sig in deps:
                raw = yield Read(sig + AMD_SIGNAL_VALUE, 8)
                assert isinstance(raw, bytes)
                values.append(_I64.unpack(raw)[0])
            # HSA spec 2.9: AND waits for every dependency at 0, OR for any (none = done)
            met = (all(v == 0 for v in values) if isinstance(packet, BarrierAnd)
                   else not values or any(v == 0 for v in values))
            if not met:
                raise _Stop(RunEnd(EndReason.POLLING, offset))
        elif isinstance(packet, BarrierValue):
            raw = yield Read(packet.signal + AMD_SIGNAL_VALUE, 8)
            assert isinstance(raw, bytes)
            value = _I64.unpack(raw)[0] & packet.mask
            holds = _condition_met(packet.cond, _signed64(value), packet.value)
            if holds is None:
                yield from self._fail(QueueError.VENDOR_PACKET, offset,
                                      f"barrier-value packet with condition {packet.cond}")
            if not holds:
                raise _Stop(RunEnd(EndReason.POLLING, offset))
        elif isinstance(packet, Pm4Ib):
            yield from self._pm4_ib(packet, offset)
        elif isinstance(packet, KernelDispatch):
            yield from self._fail(
                QueueError.INVALID_CODE, offset,
                f"KERNEL_DISPATCH of kernel object {packet.kernel_object:#x} cannot run: the "
                "emulated GPU has no shader ISA")
        elif isinstance(packet, VendorPacket):
            yield from self._fail(QueueError.VENDOR_PACKET, offset,
                                  f"vendor packet of unknown format {packet.amd_format}")
        elif isinstance(packet, AgentDispatch):
            yield from self._fail(QueueError.INVALID_FORMAT, offset,
                                  "AGENT_DISPATCH on a GPU queue")
        elif isinstance(packet, UnknownPacket):
            yield from self._fail(QueueError.INVALID_FORMAT, offset,
                                  f"packet type {packet.type}")

    def _pm4_ib(self, packet: Pm4Ib, offset: int) -> _Steps:
        """ROCr's cache invalidation: the IB may hold ACQUIRE_MEM (a no-op: nothing caches
        here) and NOPs; anything else is a PM4 program this CP does not run."""
        if packet.ib_va is None:
            yield from self._fail(QueueError.VENDOR_PACKET, offset,
                                  f"PM4-IB packet without an INDIRECT_BUFFER "
                                  f"({packet.ib_jump[0]:#010x})")
            return
        data = b""
        if packet.ib_dwords:
            raw = yield Read(packet.ib_va, packet.ib_dwords * 4)
            assert isinstance(raw, bytes)
            data = raw
        try:
            pm4 = decode_pm4(data)
        except AqlDecodeError as e:
            yield from self._fail(QueueError.VENDOR_PACKET, offset, f"PM4 IB: {e}")
            return
        for p in pm4:
            if p.opcode not in (PM4_IT_ACQUIRE_MEM, PM4_IT_NOP):
                yield from self._fail(QueueError.VENDOR_PACKET, offset,
                                      f"PM4 IB opcode {p.opcode:#04x} is not run here")

    # -- signals ---------------------------------------------------------------------------
    def _decrement(self, signal: int) -> _Steps:
        """The completion: value - 1 (one atomic), then the event mailbox and the interrupt
        when the signal has one (the value is visible before the waiter wakes)."""
        yield Atomic(signal + AMD_SIGNAL_VALUE, AtomicOp.ADD, (1 << 64) - 1, 0, 8)
        yield from self._wake(signal)

    def _wake(self, signal: int) -> _Steps:
        raw = yield Read(signal + AMD_SIGNAL_EVENT_MAILBOX_PTR, 12)
        assert isinstance(raw, bytes)
        mailbox, event_id = struct.unpack("<QI", raw)
        if mailbox:
            yield Write(mailbox, _U32.pack(event_id))
            yield Interrupt(event_id)

    def _fail(self, code: QueueError, offset: int, why: str) -> _Steps:
        """A queue error: ERROR for good; the code stored in queue_inactive_signal and its
        event woken, which ROCr's handler turns into the queue's error callback."""
        self.state = QueueState.ERROR
        end = self.error = RunEnd(EndReason.ERROR, offset,
                                  f"queue error {int(code)} ({code.name}) at ring offset "
                                  f"{offset:#x}: {why}")
        if self.amd_queue_va is not None:
            raw = yield Read(self.amd_queue_va + AMD_QUEUE_READ_DISPATCH_ID_FIELD_BASE_BYTE_OFFSET,
                             4)
            assert isinstance(raw, bytes)
            is_amd_queue = _U32.unpack(raw)[0] == AMD_QUEUE_READ_DISPATCH_ID
            raw = yield Read(self.amd_queue_va + AMD_QUEUE_INACTIVE_SIGNAL, 8)
            assert isinstance(raw, bytes)
            inactive = _U64.unpack(raw)[0]
            if is_amd_queue and inactive:
                yield Write(inactive + AMD_SIGNAL_VALUE, _U64.pack(int(code)))
                yield from self._wake(inactive)
        raise _Stop(end)


def _completion_signal(packet: AqlPacket) -> int:
    return 0 if isinstance(packet, InvalidPacket) else packet.completion_signal


def _signed64(v: int) -> int:
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >> 63 else v
