"""The gfx9 SDMA engine, sans-IO: packets decoded from ring (or IB) bytes into typed values
and executed as engine requests (amdgpu/engine.py's run protocol).

Layouts and opcodes are the kernel's vega10 SDMA packet header (vega10_sdma_pkt_open.h,
the SDMA_OP_* / SDMA_SUBOP_* numbers and the SDMA_PKT_* field masks); the count encodings
are those its users write (sdma_v4_0.c's emit_copy_buffer / emit_fill_buffer / vm_write_pte,
ROCr 5.2.3's BlitSdmaV4) and spec userspace-surface §8 lists. Dwords are little-endian;
dword 0 carries op in bits 7:0 and sub-op in 15:8.

Ring (`SdmaRing`, a user queue's consumer state; spec §8 "The ring protocol"): 64-bit
monotonically increasing byte indices, position = index mod the ring size (a power of
two). `run(doorbell)` consumes from rptr up to the doorbell value: the bytes are read with
one Read request (two when they wrap), decoded packet by packet, each executed, and the
consumed index written back to the rptr address (a Write) when the run stops. A packet
cut by the doorbell is not consumed: the run catches up and waits for more, as the
hardware waits for wptr. A zero dword is a one-dword NOP (ROCr pads to the ring's end
with zeros).

What stops a queue for good (ERROR, one RunEnd naming the ring offset and the reason): a
doorbell not dword aligned, behind rptr or more than the ring holds past it; an unknown
op/sub-op; a malformed packet (reserved compare function, unaligned fence/atomic address,
endian swap or broadcast requested, a packet longer than the ring); a GpuFault thrown in
by the edge. Decoding random bytes gives a packet or `SdmaPacketError`, nothing else.

Polls (POLL_REGMEM on memory, ATOMIC's compare-swap loop): each unsatisfied check is
followed by a Sleep of the packet's interval; after `poll_spins` checks in one run the
ring returns POLLING (the edge runs it again later, the retries left are kept), so a run
never spins unboundedly. A retry count of 0xFFF polls forever. When a finite retry count
runs out the packet ends and execution goes on (`poll_timeouts` counts it): the header
does not say what the engine does then; moving on is this emulator's choice. A register
poll (mem_poll = 0: ROCr's HDP flush, the kernel's register waits) completes at once,
since the emulated GPU has no registers to wait for.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import ClassVar, Final

from . import engine as eng
from .engine import AtomicOp, EndReason, EngineRun, GpuFault, QueueState, Request, RunEnd

__all__ = [
    "AtomicPacket",
    "ConstFill",
    "CopyLinear",
    "CopyLinearRect",
    "Fence",
    "Nop",
    "Packet",
    "Padding",
    "PollRegMem",
    "SdmaPacketError",
    "SdmaRing",
    "TimestampGet",
    "TimestampSet",
    "Trap",
    "WriteLinear",
    "decode_packet",
    "run_ib",
]

# SDMA_OP_* and SDMA_SUBOP_* (vega10_sdma_pkt_open.h)
OP_NOP, OP_COPY, OP_WRITE, OP_FENCE, OP_TRAP = 0, 1, 2, 5, 6
OP_POLL_REGMEM, OP_ATOMIC, OP_CONST_FILL, OP_TIMESTAMP = 8, 10, 11, 13
SUBOP_COPY_LINEAR, SUBOP_COPY_LINEAR_SUB_WIND = 0, 4
SUBOP_WRITE_LINEAR = 0
SUBOP_TIMESTAMP_SET, SUBOP_TIMESTAMP_GET, SUBOP_TIMESTAMP_GET_GLOBAL = 0, 1, 2

RETRY_FOREVER: Final = 0xFFF  # POLL_REGMEM DW5 retry_count: poll until satisfied
# The header gives the poll interval's field (DW5 15:0) but not its unit; one unit is taken
# as a microsecond (ROCr asks 4, the kernel 10: tens of microseconds between re-reads).
POLL_INTERVAL_UNIT_NS: Final = 1_000
POLL_SPINS: Final = 8  # unsatisfied checks per run before the ring returns POLLING
RECT_RUN_MAX: Final = 1 << 22  # bytes of a COPY_LINEAR_RECT's joined rows per Copy (as a
# COPY_LINEAR's most): a dense 16384 x 16384 x 2048 window is 2^43 bytes in 2^25 rows,
# which must reach the edge (and its first fault) piece by piece, not after every row
JOB_TIMEOUT_NS: Final = 10_000_000_000  # amdgpu.lockup_timeout's default for SDMA jobs

Buf = bytes | bytearray | memoryview
_NONZERO = re.compile(rb"[^\x00]")
_DW = struct.Struct("<I")
_QW = struct.Struct("<Q")


class SdmaPacketError(Exception):
    """A packet the engine cannot execute: unknown op/sub-op or a malformed field. The
    message is the reason the queue error reports."""


# -- the packets (frozen, slotted; what Executed carries to the tracer) ----------------------
@dataclass(frozen=True, slots=True)
class Nop:
    """SDMA_OP_NOP: `count` dwords after the header are skipped (DW0 29:16)."""

    NAME: ClassVar[str] = "NOP"

    count: int


@dataclass(frozen=True, slots=True)
class Padding:
    """A run of zero dwords, each a one-dword NOP (ROCr zero-fills to the ring's end), taken
    as one step so that a zeroed ring costs one request, not one per dword."""

    NAME: ClassVar[str] = "NOP"

    zero_dwords: int


@dataclass(frozen=True, slots=True)
class CopyLinear:
    """SDMA_OP_COPY / COPY_LINEAR: DW1 21:0 = bytes - 1, DW3-4 src, DW5-6 dst."""

    NAME: ClassVar[str] = "COPY_LINEAR"

    src: int
    dst: int
    size: int


@dataclass(frozen=True, slots=True)
class CopyLinearRect:
    """SDMA_OP_COPY / COPY_LINEAR_SUB_WIND: a 3-D window of elements of 2**element_log2
    bytes (DW0 31:29). Per side: a dword-aligned base, the window's start x/y/z (elements,
    rows, slices), the row pitch and slice pitch in elements (fields hold value - 1); the
    window is rect_x elements by rect_y rows by rect_z slices (fields hold value - 1)."""

    NAME: ClassVar[str] = "COPY_LINEAR_RECT"

    element_log2: int
    src: int
    src_x: int
    src_y: int
    src_z: int
    src_pitch: int
    src_slice_pitch: int
    dst: int
    dst_x: int
    dst_y: int
    dst_z: int
    dst_pitch: int
    dst_slice_pitch: int
    rect_x: int
    rect_y: int
    rect_z: int

    @property
    def element(self) -> int:
        return 1 << self.element_log2

    def rows(self) -> Iterator[tuple[int, int, int]]:
        """(dst, src, bytes) of the window's rows in order, a row joined to the one before
        when both sides continue where it ended (a dense window of up to RECT_RUN_MAX
        bytes is one piece)."""
        e = self.element_log2
        width = self.rect_x << e
        run: tuple[int, int, int] | None = None
        for z in range(self.rect_z):
            for y in range(self.rect_y):
                s = self.src + ((self.src_x + (self.src_y + y) * self.src_pitch
                                 + (self.src_z + z) * self.src_slice_pitch) << e)
                d = self.dst + ((self.dst_x + (self.dst_y + y) * self.dst_pitch
                                 + (self.dst_z + z) * self.dst_slice_pitch) << e)
                if (run is not None and run[0] + run[2] == d and run[1] + run[2] == s
                        and run[2] < RECT_RUN_MAX):
                    run = (run[0], run[1], run[2] + width)
                    continue
                if run is not None:
                    yield run
                run = (d, s, width)
        if run is not None:
            yield run


@dataclass(frozen=True, slots=True)
class ConstFill:
    """SDMA_OP_CONST_FILL: DW0 31:30 fill size (log2 bytes: 0 byte, 1 word, 2 dword), DW1-2
    dst, DW3 data, DW4 21:0 count. The kernel writes bytes - 1 and ROCr (dwords - 1) * 4
    for dword fills, so the count's bits below the fill size are ignored: the fill covers
    ((count >> fill_size) + 1) << fill_size bytes."""

    NAME: ClassVar[str] = "CONST_FILL"

    dst: int
    data: int
    size: int
    fill_size_log2: int

    @property
    def pattern(self) -> int:
        """The u32 the fill repeats: the data's low byte / word / dword replicated."""
        if self.fill_size_log2 == 0:
            return (self.data & 0xFF) * 0x01010101
        if self.fill_size_log2 == 1:
            return (self.data & 0xFFFF) * 0x00010001
        return self.data


@dataclass(frozen=True, slots=True)
class Fence:
    """SDMA_OP_FENCE: the dword `data` stored at `addr` (DW1-2, dword aligned)."""

    NAME: ClassVar[str] = "FENCE"

    addr: int
    data: int


@dataclass(frozen=True, slots=True)
class Trap:
    """SDMA_OP_TRAP: an interrupt with DW1 27:0 as its context (ROCr: the event id)."""

    NAME: ClassVar[str] = "TRAP"

    context_id: int


@dataclass(frozen=True, slots=True)
class PollRegMem:
    """SDMA_OP_POLL_REGMEM: DW0 bit 26 hdp_flush, 30:28 compare function, bit 31 memory
    poll; DW1-2 address; DW3 reference; DW4 mask; DW5 15:0 interval, 27:16 retry count.
    Satisfied when (value & mask) <func> reference."""

    NAME: ClassVar[str] = "POLL_REGMEM"

    mem_poll: bool
    hdp_flush: bool
    func: int
    addr: int
    reference: int
    mask: int
    interval: int
    retry_count: int

    def satisfied(self, value: int) -> bool:
        return _COMPARE[self.func](value & self.mask, self.reference)


_COMPARE: Final[tuple[Callable[[int, int], bool], ...]] = (
    lambda v, r: True,  # 0 always
    lambda v, r: v < r,  # 1
    lambda v, r: v <= r,  # 2
    lambda v, r: v == r,  # 3
    lambda v, r: v != r,  # 4
    lambda v, r: v >= r,  # 5
    lambda v, r: v > r,  # 6
)


@dataclass(frozen=True, slots=True)
class AtomicPacket:
    """SDMA_OP_ATOMIC: DW0 bit 16 loop, 31:25 the TC atomic operation; DW1-2 address;
    DW3-4 source; DW5-6 compare; DW7 12:0 loop interval. `op` and `size` are what the
    operation code means (TC_OP_ATOMIC_*: *_RTN_32 from 0x07, *_RTN_64 from 0x27, the
    non-returning forms 0x40 higher; ROCr's signal decrement is 0x2F, ADD_RTN_64, with
    source -1). With `loop`, a compare-swap is retried until it succeeds."""

    NAME: ClassVar[str] = "ATOMIC"

    op_code: int
    op: AtomicOp
    size: int
    loop: bool
    addr: int
    src: int
    cmp: int
    loop_interval: int


@dataclass(frozen=True, slots=True)
class TimestampSet:
    """SDMA_OP_TIMESTAMP / SET: the engine's local timestamp counter starts at `value`."""

    NAME: ClassVar[str] = "TIMESTAMP_SET"

    value: int


@dataclass(frozen=True, slots=True)
class TimestampGet:
    """SDMA_OP_TIMESTAMP / GET (local counter) or GET_GLOBAL (the GPU clock counter):
    the 64-bit counter stored at `addr` (DW1 31:3, so 8-byte aligned)."""

    NAME: ClassVar[str] = "TIMESTAMP_GET"

    addr: int
    global_clock: bool


@dataclass(frozen=True, slots=True)
class WriteLinear:
    """SDMA_OP_WRITE / WRITE_LINEAR (write untiled): DW1-2 dst, DW3 19:0 dwords - 1, the
    dwords after it stored at dst (the kernel's page-table updates and ring tests)."""

    NAME: ClassVar[str] = "WRITE_LINEAR"

    dst: int
    data: bytes


Packet = (Nop | Padding | CopyLinear | CopyLinearRect | ConstFill | Fence | Trap | PollRegMem
          | AtomicPacket | TimestampSet | TimestampGet | WriteLinear)

# TC_OP_ATOMIC_* operation codes (gfx9's TC_OP enum) -> the operation; the returning forms
# (*_RTN_*) and the plain ones differ only in what the TC sends back, which SDMA drops.
_TC_OPS_32: Final = {0x07: AtomicOp.SWAP, 0x08: AtomicOp.CMPSWAP, 0x0F: AtomicOp.ADD,
                     0x10: AtomicOp.SUB, 0x11: AtomicOp.SMIN, 0x12: AtomicOp.UMIN,
                     0x13: AtomicOp.SMAX, 0x14: AtomicOp.UMAX, 0x15: AtomicOp.AND,
                     0x16: AtomicOp.OR, 0x17: AtomicOp.XOR, 0x18: AtomicOp.INC,
                     0x19: AtomicOp.DEC}
ATOMIC_OPS: Final[dict[int, tuple[AtomicOp, int]]] = {}
for _code, _op in _TC_OPS_32.items():
    ATOMIC_OPS[_code] = (_op, 4)  # *_RTN_32
    ATOMIC_OPS[_code + 0x20] = (_op, 8)  # *_RTN_64
    ATOMIC_OPS[_code + 0x40] = (_op, 4)  # *_32
    ATOMIC_OPS[_code + 0x60] = (_op, 8)  # *_64
del _code, _op
TC_OP_ATOMIC_ADD_RTN_64: Final = 0x2F

# Packet lengths in dwords of the fixed-size packets, by (op, sub-op).
_FIXED: Final = {
    (OP_COPY, SUBOP_COPY_LINEAR): 7, (OP_COPY, SUBOP_COPY_LINEAR_SUB_WIND): 13,
    (OP_CONST_FILL, 0): 5, (OP_FENCE, 0): 4, (OP_TRAP, 0): 2, (OP_POLL_REGMEM, 0): 6,
    (OP_ATOMIC, 0): 8, (OP_TIMESTAMP, SUBOP_TIMESTAMP_SET): 3,
    (OP_TIMESTAMP, SUBOP_TIMESTAMP_GET): 3, (OP_TIMESTAMP, SUBOP_TIMESTAMP_GET_GLOBAL): 3,
}


def packet_dwords(header: int, dw3: int | None) -> int:
    """How many dwords the packet with this header spans; WRITE_LINEAR needs its DW3
    (None: not read yet -> 4, enough to read it). SdmaPacketError for an unknown one."""
    op, sub = header & 0xFF, header >> 8 & 0xFF
    if op == OP_NOP:
        return 1 + (header >> 16 & 0x3FFF)
    if op == OP_WRITE and sub == SUBOP_WRITE_LINEAR:
        return 4 if dw3 is None else 4 + (dw3 & 0xFFFFF) + 1
    n = _FIXED.get((op, sub))
    if n is None:
        raise SdmaPacketError(f"unknown packet op {op} sub-op {sub} (header {header:#010x})")
    return n


def _u64(lo: int, hi: int) -> int:
    return hi << 32 | lo


def decode_packet(buf: Buf, pos: int, end: int) -> tuple[Packet, int] | None:
    """The packet at byte `pos` of `buf` (dword aligned), reading no further than `end`:
    (packet, its length in bytes), or None when it runs past `end` (wait for more bytes).
    SdmaPacketError for an unknown or malformed packet."""
    if pos + 4 > end:
        return None
    header = _DW.unpack_from(buf, pos)[0]
    if header == 0:  # scanned in place: no copy of the rest of the buffer per run
        nonzero = _NONZERO.search(buf, pos, end)
        n = ((nonzero.start() if nonzero else end) - pos) & ~3
        return Padding(n // 4), n
    dw3 = _DW.unpack_from(buf, pos + 12)[0] if (
        header & 0xFFFF == OP_WRITE | SUBOP_WRITE_LINEAR << 8 and pos + 16 <= end) else None
    n = packet_dwords(header, dw3)
    if pos + 4 * n > end or (dw3 is None and header & 0xFF == OP_WRITE):
        return None
    d = struct.unpack_from(f"<{min(n, 13)}I", buf, pos)
    return _decode(header, d, buf, pos, n), 4 * n


def _decode(h: int, d: tuple[int, ...], buf: Buf, pos: int,
            n: int) -> Packet:
    op, sub = h & 0xFF, h >> 8 & 0xFF
    if op == OP_NOP:
        return Nop(n - 1)
    if op == OP_COPY and sub == SUBOP_COPY_LINEAR:
        if h >> 27 & 1:
            raise SdmaPacketError("COPY_LINEAR broadcast is not supported")
        if d[2] & 0x03030000:
            raise SdmaPacketError("COPY_LINEAR endian swap is not supported")
        return CopyLinear(_u64(d[3], d[4]), _u64(d[5], d[6]), (d[1] & 0x3FFFFF) + 1)
    if op == OP_COPY:  # COPY_LINEAR_SUB_WIND
        e = h >> 29 & 7
        if e > 4:
            raise SdmaPacketError(f"COPY_LINEAR_RECT element size 2**{e} is reserved")
        if d[1] & 3 or d[6] & 3:
            raise SdmaPacketError("COPY_LINEAR_RECT base address not dword aligned")
        if d[12] & 0x03030000:
            raise SdmaPacketError("COPY_LINEAR_RECT endian swap is not supported")
        return CopyLinearRect(
            e, _u64(d[1], d[2]), d[3] & 0x3FFF, d[3] >> 16 & 0x3FFF, d[4] & 0x7FF,
            (d[4] >> 13) + 1, (d[5] & 0xFFFFFFF) + 1,
            _u64(d[6], d[7]), d[8] & 0x3FFF, d[8] >> 16 & 0x3FFF, d[9] & 0x7FF,
            (d[9] >> 13) + 1, (d[10] & 0xFFFFFFF) + 1,
            (d[11] & 0x3FFF) + 1, (d[11] >> 16 & 0x3FFF) + 1, (d[12] & 0x7FF) + 1)
    if op == OP_CONST_FILL:
        fs = h >> 30
        if fs == 3:
            raise SdmaPacketError("CONST_FILL fill size 3 is reserved")
        if h >> 16 & 3:
            raise SdmaPacketError("CONST_FILL endian swap is not supported")
        dst = _u64(d[1], d[2])
        if dst & ((1 << fs) - 1):
            raise SdmaPacketError(f"CONST_FILL destination {dst:#x} not aligned to its "
                                  f"{1 << fs}-byte fill")
        return ConstFill(dst, d[3], (((d[4] & 0x3FFFFF) >> fs) + 1) << fs, fs)
    if op == OP_FENCE:
        addr = _u64(d[1], d[2])
        if addr & 3:
            raise SdmaPacketError(f"FENCE address {addr:#x} not dword aligned")
        return Fence(addr, d[3])
    if op == OP_TRAP:
        return Trap(d[1] & 0xFFFFFFF)
    if op == OP_POLL_REGMEM:
        func = h >> 28 & 7
        if func == 7:
            raise SdmaPacketError("POLL_REGMEM compare function 7 is reserved")
        p = PollRegMem(bool(h >> 31), bool(h >> 26 & 1), func, _u64(d[1], d[2]), d[3], d[4],
                       d[5] & 0xFFFF, d[5] >> 16 & 0xFFF)
        if p.mem_poll and p.addr & 3:
            raise SdmaPacketError(f"POLL_REGMEM address {p.addr:#x} not dword aligned")
        return p
    if op == OP_ATOMIC:
        code = h >> 25
        kind = ATOMIC_OPS.get(code)
        if kind is None:
            raise SdmaPacketError(f"ATOMIC operation {code:#x} is not supported")
        addr = _u64(d[1], d[2])
        if addr & (kind[1] - 1):
            raise SdmaPacketError(f"ATOMIC address {addr:#x} not {kind[1]}-byte aligned")
        return AtomicPacket(code, kind[0], kind[1], bool(h >> 16 & 1), addr, _u64(d[3], d[4]),
                            _u64(d[5], d[6]), d[7] & 0x1FFF)
    if op == OP_TIMESTAMP:
        if sub == SUBOP_TIMESTAMP_SET:
            return TimestampSet(_u64(d[1], d[2]))
        return TimestampGet(_u64(d[1] & ~7 & 0xFFFFFFFF, d[2]),
                            sub == SUBOP_TIMESTAMP_GET_GLOBAL)
    # WRITE_LINEAR (packet_dwords refused every other op)
    if d[3] >> 24 & 3:
        raise SdmaPacketError("WRITE_LINEAR endian swap is not supported")
    dst = _u64(d[1], d[2])
    if dst & 3:
        raise SdmaPacketError(f"WRITE_LINEAR destination {dst:#x} not dword aligned")
    return WriteLinear(dst, bytes(buf[pos + 16: pos + 4 * n]))


# -- execution --------------------------------------------------------------------------------
class _Blocked(Exception):
    """A poll (or an atomic loop) used up this run's spins unsatisfied."""


class _TimedOut(SdmaPacketError):
    """An IB's polls waited longer than its job may run."""


@dataclass(slots=True)
class _PollState:
    """The retries a poll packet at one ring index has left, kept across runs."""

    index: int
    left: int


class _Executor:
    """Executes decoded packets as requests; the counters a ring (or an IB) keeps."""

    def __init__(self, poll_spins: int | None, sleep_budget_ns: int | None = None) -> None:
        self.poll_spins = poll_spins  # None: spin (with Sleeps) until the poll ends
        self.timestamp_offset = 0  # TIMESTAMP SET: the local counter = clock + offset
        self.poll_timeouts = 0
        self.poll: _PollState | None = None
        self.sleep_budget_ns = sleep_budget_ns  # None: a poll may wait forever
        self.slept_ns = 0

    def _sleep(self, ns: int) -> Generator[Request, object, None]:
        # Each wait counts at least one interval unit, so interval-0 polls use it up too.
        self.slept_ns += max(ns, POLL_INTERVAL_UNIT_NS)
        if self.sleep_budget_ns is not None and self.slept_ns > self.sleep_budget_ns:
            raise _TimedOut(f"timed out after {self.sleep_budget_ns // 1_000_000} ms of "
                            f"polling")
        yield eng.Sleep(ns)

    def execute(self, pkt: Packet, index: int) -> Generator[Request, object, None]:
        """Run one packet; raises _Blocked when a poll must be resumed by a later run
        (index identifies the packet so its retries carry over)."""
        match pkt:
            case CopyLinear():
                yield eng.Copy(pkt.dst, pkt.src, pkt.size)
            case Fence():
                yield eng.Write(pkt.addr, _DW.pack(pkt.data))
            case AtomicPacket():
                yield from self._atomic(pkt)
            case PollRegMem(mem_poll=True):
                yield from self._poll(pkt, index)
            case Trap():
                yield eng.Interrupt(pkt.context_id)
            case ConstFill():
                yield eng.Fill(pkt.dst, pkt.pattern, pkt.size)
            case CopyLinearRect():
                for dst, src, n in pkt.rows():
                    yield eng.Copy(dst, src, n)
            case TimestampGet():
                now = _int((yield eng.Clock()))
                if not pkt.global_clock:
                    now += self.timestamp_offset
                yield eng.Write(pkt.addr, _QW.pack(now & (1 << 64) - 1))
            case TimestampSet():
                self.timestamp_offset = pkt.value - _int((yield eng.Clock()))
            case WriteLinear():
                yield eng.Write(pkt.dst, pkt.data)
            case _:  # NOP, padding, a register poll (no registers to wait for)
                pass

    def _retries(self, index: int, retry_count: int) -> _PollState:
        if self.poll is None or self.poll.index != index:
            self.poll = _PollState(index, retry_count)
        return self.poll

    def _poll(self, pkt: PollRegMem, index: int) -> Generator[Request, object, None]:
        state = self._retries(index, pkt.retry_count)
        spins = 0
        while True:
            raw = yield eng.Read(pkt.addr, 4)
            if pkt.satisfied(_DW.unpack(_bytes(raw, 4))[0]):
                break
            if pkt.retry_count != RETRY_FOREVER:
                if state.left == 0:
                    self.poll_timeouts += 1
                    break
                state.left -= 1
            spins += 1
            if self.poll_spins is not None and spins >= self.poll_spins:
                raise _Blocked
            yield from self._sleep(pkt.interval * POLL_INTERVAL_UNIT_NS)
        self.poll = None

    def _atomic(self, pkt: AtomicPacket) -> Generator[Request, object, None]:
        """One atomic; a looping compare-swap again until the old value was `cmp` (a
        failed compare-swap changes nothing, so a later run may simply redo it)."""
        loop = pkt.loop and pkt.op is AtomicOp.CMPSWAP
        mask = (1 << 8 * pkt.size) - 1
        spins = 0
        while True:
            old = _int((yield eng.Atomic(pkt.addr, pkt.op, pkt.src, pkt.cmp, pkt.size)))
            if not loop or old & mask == pkt.cmp & mask:
                return
            spins += 1
            if self.poll_spins is not None and spins >= self.poll_spins:
                raise _Blocked
            yield from self._sleep(pkt.loop_interval * POLL_INTERVAL_UNIT_NS)


def _int(answer: object) -> int:
    """A Clock's or an Atomic's answer, which the edge promises is an int."""
    if not isinstance(answer, int):
        raise TypeError(f"an int was due, the edge answered {type(answer).__name__}")
    return answer


def _bytes(answer: object, size: int) -> Buf:
    """A Read's answer, which the edge promises is exactly `size` bytes."""
    if not isinstance(answer, bytes | bytearray | memoryview) or len(answer) != size:
        raise TypeError(f"Read answered {type(answer).__name__} of the wrong size, "
                        f"{size} bytes expected")
    return answer


class SdmaRing:
    """One SDMA user queue's consumer (the HQD's view of its ring): where the ring is, how
    far it has consumed, its state. One owner (the KFD queue), one run at a time."""

    def __init__(self, ring_base: int, ring_size: int, rptr_va: int, wptr_va: int, *,
                 poll_spins: int = POLL_SPINS) -> None:
        if ring_size < 4 or ring_size & (ring_size - 1):
            raise ValueError(f"ring size {ring_size} is not a power of two")
        self.ring_base = ring_base
        self.ring_size = ring_size
        self.rptr_va = rptr_va
        self.wptr_va = wptr_va  # the producer's copy; the doorbell value is what counts
        self.rptr = 0  # consumed byte index (64-bit, monotonic)
        self.state = QueueState.IDLE
        self.packets_done = 0
        # The queue error, once reached (for good): what every later run returns; the edge
        # reads it after each step, to report it before the rptr write-back that follows a
        # packet error (the client may destroy the queue before the run ends).
        self.error: RunEnd | None = None
        self._exec = _Executor(poll_spins)
        self._reported_rptr = 0

    @property
    def poll_timeouts(self) -> int:
        return self._exec.poll_timeouts

    def offset(self, index: int | None = None) -> int:
        return (self.rptr if index is None else index) & (self.ring_size - 1)

    def _fail(self, reason: str, fault: GpuFault | None = None) -> RunEnd:
        self.state = QueueState.ERROR
        self.error = RunEnd(EndReason.ERROR, self.offset(), reason, fault)
        return self.error

    def run(self, doorbell: int) -> EngineRun:
        """Consume from rptr to `doorbell` (a generator of requests; returns a RunEnd)."""
        if self.error is not None:
            return self.error
        if doorbell & 3:
            return self._fail(f"doorbell {doorbell:#x} not dword aligned")
        if doorbell < self.rptr:
            return self._fail(f"doorbell {doorbell:#x} behind the read pointer {self.rptr:#x}"
                              f" (a write pointer that went backwards)")
        if doorbell - self.rptr > self.ring_size:
            return self._fail(f"doorbell {doorbell:#x} beyond what the ring holds "
                              f"(rptr {self.rptr:#x}, ring size {self.ring_size:#x})")
        self.state = QueueState.RUNNING
        try:
            end = yield from self._consume(doorbell)
        except GpuFault as f:
            return self._fail(str(f), f)
        except SdmaPacketError as e:
            end = self._fail(str(e))
        try:
            yield from self._report_rptr()
        except GpuFault as f:
            return self._fail(f"rptr write-back: {f}", f)
        return end

    def _consume(self, doorbell: int) -> Generator[Request, object, RunEnd]:
        avail = doorbell - self.rptr
        if avail == 0:
            self.state = QueueState.IDLE
            return RunEnd(EndReason.CAUGHT_UP, self.offset())
        start = self.offset()
        first = min(avail, self.ring_size - start)
        data = _bytes((yield eng.Read(self.ring_base + start, first)), first)
        if first < avail:  # wrapped: the rest from the ring's start
            rest = _bytes((yield eng.Read(self.ring_base, avail - first)), avail - first)
            data = bytes(data) + bytes(rest)
        pos = 0
        while pos < avail:
            got = decode_packet(data, pos, avail)
            if got is None:  # cut by the doorbell: wait for the rest, unless it cannot fit
                need = 4 * packet_dwords(*_header_and_dw3(data, pos, avail))
                if need > self.ring_size:
                    raise SdmaPacketError(f"packet of {need} bytes is longer than the ring")
                break
            pkt, n = got
            index = self.rptr
            if isinstance(pkt, CopyLinear):
                run = _copy_run(data, pos, avail, pkt, n)
                if len(run) > 1:
                    yield from self._copy_merged(run)
                    pos += sum(k for _, k in run)
                    continue
            try:
                yield from self._exec.execute(pkt, index)
            except _Blocked:
                self.state = QueueState.POLLING
                return RunEnd(EndReason.POLLING, self.offset())
            pos += n
            self.rptr += n
            self.packets_done += pkt.zero_dwords if isinstance(pkt, Padding) else 1
            yield eng.Executed(self.offset(index), pkt)
        self.state = QueueState.IDLE
        return RunEnd(EndReason.CAUGHT_UP, self.offset())

    def _copy_merged(self, run: list[tuple[CopyLinear, int]]) -> Generator[Request, object, None]:
        """Consecutive COPY_LINEARs that continue one another (ROCr's BlitSdma cuts a large
        copy into packets of at most 4 MiB) as one Copy request, so the edge moves it in
        one go; each packet is then done and traced as its own. A fault part-way: the
        packets wholly before the faulting byte are done, the queue stops at the one it
        hit, as it would have packet by packet."""
        first = run[0][0]
        total = sum(p.size for p, _ in run)
        try:
            yield eng.Copy(first.dst, first.src, total)
        except GpuFault as f:
            done = f.va - (first.dst if f.write else first.src)
            for p, k in run:
                if done < p.size:
                    break
                done -= p.size
                yield from self._packet_done(p, k)
            raise
        for p, k in run:
            yield from self._packet_done(p, k)

    def _packet_done(self, pkt: CopyLinear, n: int) -> Generator[Request, object, None]:
        index = self.rptr
        self.rptr += n
        self.packets_done += 1
        yield eng.Executed(self.offset(index), pkt)

    def _report_rptr(self) -> Generator[Request, object, None]:
        if self.rptr != self._reported_rptr:
            yield eng.Write(self.rptr_va, _QW.pack(self.rptr & (1 << 64) - 1))
            self._reported_rptr = self.rptr


MERGE_MAX = 256 << 20  # bytes of consecutive COPY_LINEARs made one Copy request


def _copy_run(data: Buf, pos: int, end: int, first: CopyLinear,
              n: int) -> list[tuple[CopyLinear, int]]:
    """The COPY_LINEAR at `pos` and those right after it in the ring that continue it
    (source and destination both follow on), up to MERGE_MAX bytes, while the whole
    source and destination do not overlap (one copy then does what the packets in turn
    would). A packet that does not decode ends the run (its turn reports it)."""
    run = [(first, n)]
    total, pos = first.size, pos + n
    while pos < end and total < MERGE_MAX:
        try:
            got = decode_packet(data, pos, end)
        except SdmaPacketError:
            break
        if got is None or not isinstance(got[0], CopyLinear):
            break
        pkt, k = got[0], got[1]
        if (pkt.src != first.src + total or pkt.dst != first.dst + total
                or total + pkt.size > MERGE_MAX):
            break
        run.append((pkt, k))
        total += pkt.size
        pos += k
    while len(run) > 1 and (first.src < first.dst + total and first.dst < first.src + total):
        run.pop()  # overlapping: the packets one by one
        total = sum(p.size for p, _ in run)
    return run


def _header_and_dw3(data: Buf, pos: int, end: int) -> tuple[int, int | None]:
    header = _DW.unpack_from(data, pos)[0]
    dw3 = _DW.unpack_from(data, pos + 12)[0] if pos + 16 <= end else None
    return header, dw3


def run_ib(va: int, size_dw: int, *, poll_spins: int | None = None,
           timeout_ns: int | None = JOB_TIMEOUT_NS) -> EngineRun:
    """Execute an indirect buffer of `size_dw` dwords at GPU VA `va` (AMDGPU_CS's SDMA IBs;
    the kernel's own IB packets are the ring's). The IB is read with one Read; a packet
    running past its end is malformed. Polls spin with Sleeps until they end unless
    `poll_spins` bounds them (then the run ends POLLING and cannot be resumed: the caller
    treats it as a timeout). The Sleeps asked for (each at least 1 µs) may add up to
    `timeout_ns` (the kernel's lockup_timeout for SDMA jobs, 10 s); past it the IB ends in
    ERROR, as the scheduler's job timeout ends a hung job. RunEnd offsets are byte offsets
    in the IB."""
    if va & 3:
        return RunEnd(EndReason.ERROR, 0, f"IB address {va:#x} not dword aligned")
    ex = _Executor(poll_spins, timeout_ns)
    pos = 0
    try:
        size = size_dw * 4
        data = _bytes((yield eng.Read(va, size)), size) if size else b""
        while pos < size:
            got = decode_packet(data, pos, size)
            if got is None:
                raise SdmaPacketError("packet runs past the end of the IB")
            pkt, n = got
            try:
                yield from ex.execute(pkt, pos)
            except _Blocked:
                return RunEnd(EndReason.POLLING, pos)
            yield eng.Executed(pos, pkt)
            pos += n
    except GpuFault as f:
        return RunEnd(EndReason.ERROR, pos, str(f), f)
    except SdmaPacketError as e:
        return RunEnd(EndReason.ERROR, pos, str(e))
    return RunEnd(EndReason.CAUGHT_UP, pos)
