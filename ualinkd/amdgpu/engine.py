"""The GPU engine's run protocol: what a sans-IO command processor asks of its edge.

An engine (the SDMA ring of sdma.py, the AQL processor of aql.py) never touches memory,
clocks or interrupts itself. Its `run(...)` is a generator of *requests*; the edge fulfils
each one against the queue's GPU VM (amdgpu/access.py's resolver: local BOs, userptr pages,
imported NPA BOs over the fabric) and sends the answer back in:

    Read(va, size)              -> bytes, exactly `size` of them       (GPU VM load)
    Write(va, data)             -> None                                (GPU VM store)
    Copy(dst_va, src_va, size)  -> None    one request per COPY_LINEAR, so the edge may move
                                           a 4 MiB chunk in one piece
    Fill(dst_va, value, size)   -> None    `size` bytes of the u32 `value` repeated
    Atomic(va, op, src, cmp, size) -> int  the old value; the edge applies `atomic_result`
                                           as one read-modify-write
    Interrupt(context_id)       -> None    an engine trap (the KFD's interrupt path)
    Clock()                     -> int     the GPU clock counter (`gpu_clock_counter`)
    Sleep(ns)                   -> None    a poll's retry interval: come back after `ns`
    Executed(ring_offset, packet) -> None  a trace point after each packet

A VM fault is thrown in (`gen.throw(GpuFault(va, write))`): the engine stops the queue in
ERROR and returns a `RunEnd` naming the ring offset of the packet that faulted. The
generator's return value is always a `RunEnd`: caught up, blocked on a poll that has not
been released yet (run it again later), or a queue error with its reason. No other
exception leaves an engine for bad packets or bad memory: those are the user's, not ours.

The GPU clock (TIMESTAMP packets, AMDGPU_INFO TIMESTAMP, KFD GET_CLOCK_COUNTERS) has one
owner here: `gpu_clock_counter` turns the host's monotonic nanoseconds into ticks of the
profile's `gpu_counter_freq` (kHz), as amdgpu_gfx_get_gpu_clock_counter reads a counter
running at that rate.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Generator
from dataclasses import dataclass
from typing import Final

__all__ = [
    "Atomic",
    "AtomicOp",
    "Clock",
    "Copy",
    "EndReason",
    "EngineRun",
    "Executed",
    "Fill",
    "GpuFault",
    "Interrupt",
    "QueueState",
    "Read",
    "Request",
    "RunEnd",
    "Sleep",
    "Write",
    "atomic_result",
    "format_packet",
    "gpu_clock_counter",
    "packet_fields",
]

NSEC_PER_MSEC: Final = 1_000_000


def gpu_clock_counter(now_ns: int, freq_khz: int) -> int:
    """The GPU clock counter at host time `now_ns` (a monotonic clock's nanoseconds): a
    counter running at `freq_khz` kHz since that clock's zero (the profile's
    gpu_counter_freq; AMDGPU_INFO_DEV_INFO reports the same rate)."""
    return now_ns * freq_khz // NSEC_PER_MSEC


class GpuFault(Exception):
    """A GPU page fault met while fulfilling a request: unmapped VA, a revoked import, an
    unreadable userptr page, a write to a read-only mapping. Thrown into the engine by the
    edge; the engine ends the run in ERROR with it."""

    def __init__(self, va: int, write: bool, reason: str = "") -> None:
        super().__init__(va, write, reason)
        self.va = va
        self.write = write
        self.reason = reason

    def __str__(self) -> str:
        kind = "write" if self.write else "read"
        why = f" ({self.reason})" if self.reason else ""
        return f"GPU page fault: {kind} at VA {self.va:#x}{why}"


class AtomicOp(enum.Enum):
    """The read-modify-write an Atomic request asks for (the TC atomic operations SDMA's
    ATOMIC packet and AQL signal updates use; sdma.py maps the packet's operation code)."""

    SWAP = "swap"
    CMPSWAP = "cmpswap"  # store src if the old value == cmp
    ADD = "add"
    SUB = "sub"
    SMIN = "smin"
    UMIN = "umin"
    SMAX = "smax"
    UMAX = "umax"
    AND = "and"
    OR = "or"
    XOR = "xor"
    INC = "inc"  # old >= src ? 0 : old + 1 (the wrapping increment of the TC ops)
    DEC = "dec"  # old == 0 or old > src ? src : old - 1


def _signed(v: int, bits: int) -> int:
    return v - (1 << bits) if v >> (bits - 1) & 1 else v


def atomic_result(op: AtomicOp, old: int, src: int, cmp: int, size: int) -> int:
    """The value an atomic leaves in memory, given the old one; `size` is 4 or 8 bytes and
    every value is taken unsigned modulo 2^(8*size). The edge does the read and the store
    as one step (no other access between them) and answers the request with `old`."""
    bits = size * 8
    m = (1 << bits) - 1
    old, src, cmp = old & m, src & m, cmp & m
    if op is AtomicOp.SWAP:
        new = src
    elif op is AtomicOp.CMPSWAP:
        new = src if old == cmp else old
    elif op is AtomicOp.ADD:
        new = old + src
    elif op is AtomicOp.SUB:
        new = old - src
    elif op is AtomicOp.SMIN:
        new = src if _signed(src, bits) < _signed(old, bits) else old
    elif op is AtomicOp.UMIN:
        new = min(old, src)
    elif op is AtomicOp.SMAX:
        new = src if _signed(src, bits) > _signed(old, bits) else old
    elif op is AtomicOp.UMAX:
        new = max(old, src)
    elif op is AtomicOp.AND:
        new = old & src
    elif op is AtomicOp.OR:
        new = old | src
    elif op is AtomicOp.XOR:
        new = old ^ src
    elif op is AtomicOp.INC:
        new = 0 if old >= src else old + 1
    else:  # DEC
        new = src if old == 0 or old > src else old - 1
    return new & m


# -- the requests (frozen, slotted: they cross into the edge as plain values) ---------------
@dataclass(frozen=True, slots=True)
class Read:
    va: int
    size: int


@dataclass(frozen=True, slots=True)
class Write:
    va: int
    data: bytes


@dataclass(frozen=True, slots=True)
class Copy:
    dst_va: int
    src_va: int
    size: int


@dataclass(frozen=True, slots=True)
class Fill:
    """`size` bytes at `dst_va`, the little-endian u32 `value` repeated (size % 4 == 0)."""

    dst_va: int
    value: int
    size: int


@dataclass(frozen=True, slots=True)
class Atomic:
    va: int
    op: AtomicOp
    src: int
    cmp: int
    size: int  # 4 or 8; va is aligned to it


@dataclass(frozen=True, slots=True)
class Interrupt:
    """An engine trap: the KFD signals the event `context_id` names (or scans the process's
    events page when no event has that id), as the kernel's SDMA trap interrupt does."""

    context_id: int


@dataclass(frozen=True, slots=True)
class Clock:
    """-> the GPU clock counter now (gpu_clock_counter of the edge's monotonic clock)."""


@dataclass(frozen=True, slots=True)
class Sleep:
    ns: int


@dataclass(frozen=True, slots=True)
class Executed:
    """After each packet: its offset in the ring (or IB) and the decoded packet (a frozen
    value of sdma.py or aql.py), for the tracer and the packets_done counter."""

    ring_offset: int
    packet: object


Request = Read | Write | Copy | Fill | Atomic | Interrupt | Clock | Sleep | Executed


class QueueState(enum.Enum):
    """A queue's consumer state. IDLE: caught up with its doorbell. RUNNING: consuming.
    POLLING: stopped at a POLL_REGMEM (or AQL barrier) not yet satisfied; run it again
    later. ERROR: stopped for good (bad packet, bad doorbell, GPU fault); only a new queue
    runs again, as a hung/faulted hardware queue needs the KFD to reset it."""

    IDLE = "idle"
    RUNNING = "running"
    POLLING = "polling"
    ERROR = "error"


class EndReason(enum.Enum):
    CAUGHT_UP = "caught up"
    POLLING = "polling"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class RunEnd:
    """Why a run stopped. `offset`: the ring byte offset (index mod size; for an IB, the
    byte offset in it) of the packet that stopped it, or where it caught up. `error`: the
    reason of a queue error (one log line's worth); `fault` when a GpuFault caused it."""

    reason: EndReason
    offset: int
    error: str | None = None
    fault: GpuFault | None = None

    @property
    def ok(self) -> bool:
        return self.reason is not EndReason.ERROR


# What an engine's run() is: send each request's answer, get a RunEnd back at the end.
EngineRun = Generator[Request, object, RunEnd]


# -- how a decoded packet reads in the trace (strace style, and as JSON fields) ----------------
_HEX_NAMES: Final = frozenset({"src", "dst", "addr", "data", "reference", "mask", "value", "cmp",
                               "op_code"})


def _hex_field(name: str) -> bool:
    return name in _HEX_NAMES or name.endswith(("_addr", "_address", "_va", "_signal"))


def packet_fields(packet: object) -> dict[str, object]:
    """A decoded packet's fields as JSON values: numbers, enum names, bytes as hex text."""
    out: dict[str, object] = {}
    for f in dataclasses.fields(packet):  # type: ignore[arg-type]
        v = getattr(packet, f.name)
        if isinstance(v, enum.Enum):
            v = v.name
        elif isinstance(v, bytes | bytearray):
            v = bytes(v).hex()
        out[f.name] = v
    return out


def format_packet(packet: object) -> str:
    """`COPY_LINEAR(src=0x7f0000100000, dst=0x800000000, size=4096)`: the packet's kernel
    name (its class's NAME) and fields, addresses and data in hex, counts in decimal."""
    parts = []
    for name, v in packet_fields(packet).items():
        if isinstance(v, bool):
            text = str(v).lower()
        elif isinstance(v, int) and _hex_field(name):
            text = hex(v)
        elif isinstance(v, str) and isinstance(getattr(packet, name), bytes | bytearray):
            text = f"<{len(v) // 2} bytes>" if len(v) > 32 else "0x" + v
        else:
            text = str(v)
        parts.append(f"{name}={text}")
    return f"{getattr(packet, 'NAME', type(packet).__name__)}({', '.join(parts)})"
