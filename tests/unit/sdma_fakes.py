"""Test doubles for the sans-IO SDMA engine (ualinkd/amdgpu/sdma.py): a fake GPU VM (a dict
of bytearrays) that fulfils the engine's requests and throws GpuFault for unmapped VAs, a
producer that writes packets into a ring as ROCr's BlitSdmaV4 does, and packet encoders
written from the field layout in userspace-surface §8 (vega10_sdma_pkt_open.h)."""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ualinkd.amdgpu import engine as eng
from ualinkd.amdgpu.engine import EngineRun, GpuFault, RunEnd, atomic_result

M32 = 0xFFFFFFFF


class FakeVm:
    """GPU memory: mapped ranges (base -> bytearray). An access touching an unmapped byte
    faults at that access's VA, as the edge's resolver reports it."""

    def __init__(self) -> None:
        self.maps: dict[int, bytearray] = {}
        self.interrupts: list[int] = []
        self.sleeps: list[int] = []
        self.clock = 0x1234_5678_9ABC
        self.on_sleep: Callable[[int], None] | None = None

    def map(self, va: int, size: int, fill: int = 0) -> bytearray:
        buf = bytearray([fill]) * size
        self.maps[va] = buf
        return buf

    def _find(self, va: int, n: int, write: bool) -> tuple[bytearray, int]:
        for base, buf in self.maps.items():
            if base <= va and va + n <= base + len(buf):
                return buf, va - base
        raise GpuFault(va, write, "unmapped")

    def read(self, va: int, n: int) -> bytes:
        buf, off = self._find(va, n, False)
        return bytes(buf[off: off + n])

    def write(self, va: int, data: bytes) -> None:
        buf, off = self._find(va, len(data), True)
        buf[off: off + len(data)] = data

    def u32(self, va: int) -> int:
        return int(struct.unpack("<I", self.read(va, 4))[0])

    def u64(self, va: int) -> int:
        return int(struct.unpack("<Q", self.read(va, 8))[0])

    def fulfil(self, req: eng.Request) -> object:
        if isinstance(req, eng.Read):
            return self.read(req.va, req.size)
        if isinstance(req, eng.Write):
            self.write(req.va, req.data)
        elif isinstance(req, eng.Copy):
            src = self.read(req.src_va, req.size)
            self._find(req.dst_va, req.size, True)
            self.write(req.dst_va, src)
        elif isinstance(req, eng.Fill):
            pat = struct.pack("<I", req.value) * (req.size // 4 + 1)
            self.write(req.dst_va, pat[: req.size])
        elif isinstance(req, eng.Atomic):
            fmt = "<I" if req.size == 4 else "<Q"
            old = int(struct.unpack(fmt, self.read(req.va, req.size))[0])
            new = atomic_result(req.op, old, req.src, req.cmp, req.size)
            self.write(req.va, struct.pack(fmt, new))
            return old
        elif isinstance(req, eng.Interrupt):
            self.interrupts.append(req.context_id)
        elif isinstance(req, eng.Clock):
            return self.clock
        elif isinstance(req, eng.Sleep):
            self.sleeps.append(req.ns)
            if self.on_sleep is not None:
                self.on_sleep(len(self.sleeps))
        return None


class TooManySteps(Exception):
    pass


def drive(gen: EngineRun, vm: FakeVm, max_steps: int = 100_000) -> tuple[RunEnd, list[object]]:
    """Run the engine's generator to its end against `vm`: every request answered, every
    fault thrown back in. -> (the RunEnd, the requests in order)."""
    reqs: list[object] = []
    answer: object = None
    fault: GpuFault | None = None
    try:
        while True:
            req = gen.throw(fault) if fault is not None else gen.send(answer)
            fault, answer = None, None
            reqs.append(req)
            if len(reqs) > max_steps:
                gen.close()
                raise TooManySteps(len(reqs))
            try:
                answer = vm.fulfil(req)
            except GpuFault as f:
                fault = f
    except StopIteration as stop:
        assert isinstance(stop.value, RunEnd), stop.value
        return stop.value, reqs


# -- packet encoders ----------------------------------------------------------------------------
def _lo(v: int) -> int:
    return v & M32


def _hi(v: int) -> int:
    return v >> 32 & M32


def nop(count: int = 0) -> list[int]:
    return [count << 16] + [0xDEAD0000 | i for i in range(count)]


def copy_linear(dst: int, src: int, n: int) -> list[int]:
    return [1, n - 1, 0, _lo(src), _hi(src), _lo(dst), _hi(dst)]


def fence(addr: int, data: int) -> list[int]:
    return [5, _lo(addr), _hi(addr), data]


def trap(ctx: int) -> list[int]:
    return [6, ctx]


def poll(addr: int, ref: int, *, mask: int = M32, func: int = 3, interval: int = 4,
         retry: int = 0xFFF, mem: bool = True) -> list[int]:
    return [8 | int(mem) << 31 | func << 28, _lo(addr), _hi(addr), ref, mask,
            interval | retry << 16]


HDP_FLUSH = [0x8, 0, 0x80000000, 0, 0, 0]  # ROCr's register poll (userspace-surface §8)


def atomic(addr: int, op: int, src: int, cmp: int = 0, *, loop: bool = False,
           interval: int = 0) -> list[int]:
    return [10 | op << 25 | int(loop) << 16, _lo(addr), _hi(addr), _lo(src), _hi(src),
            _lo(cmp), _hi(cmp), interval]


def const_fill(dst: int, data: int, count_field: int, fill_size: int = 2) -> list[int]:
    return [11 | fill_size << 30, _lo(dst), _hi(dst), data, count_field]


def timestamp(addr: int, sub: int = 2) -> list[int]:
    return [13 | sub << 8, _lo(addr), _hi(addr)]


def timestamp_set(value: int) -> list[int]:
    return [13, _lo(value), _hi(value)]


def write_linear(dst: int, dwords: Sequence[int]) -> list[int]:
    return [2, _lo(dst), _hi(dst), len(dwords) - 1, *dwords]


def copy_rect(e: int, src: int, sx: int, sy: int, sz: int, spitch: int, sslice: int,
              dst: int, dx: int, dy: int, dz: int, dpitch: int, dslice: int,
              rx: int, ry: int, rz: int) -> list[int]:
    """COPY_LINEAR_SUB_WIND with pitches and window sizes as counts (encoded - 1)."""
    return [1 | 4 << 8 | e << 29, _lo(src), _hi(src), sx | sy << 16, sz | (spitch - 1) << 13,
            sslice - 1, _lo(dst), _hi(dst), dx | dy << 16, dz | (dpitch - 1) << 13,
            dslice - 1, (rx - 1) | (ry - 1) << 16, rz - 1]


def words(*packets: Sequence[int]) -> bytes:
    flat = [w for p in packets for w in p]
    return struct.pack(f"<{len(flat)}I", *flat)


@dataclass
class Producer:
    """The user side of a ring, as ROCr's BlitSdmaV4 writes it: packets at wptr mod size,
    zero-filled to the ring's end when a submission would straddle it (unless told to
    split it across the end), and the new 64-bit index as the doorbell value."""

    vm: FakeVm
    base: int
    size: int
    wptr: int = 0
    doorbells: list[int] = field(default_factory=list)

    def put(self, data: bytes, *, pad: bool = True) -> int:
        pos = self.wptr % self.size
        if pad and pos + len(data) > self.size:
            self.vm.write(self.base + pos, bytes(self.size - pos))
            self.wptr += self.size - pos
            pos = 0
        first = min(len(data), self.size - pos)  # the rest wraps to the start (pad=False)
        self.vm.write(self.base + pos, data[:first])
        if first < len(data):
            self.vm.write(self.base, data[first:])
        self.wptr += len(data)
        self.doorbells.append(self.wptr)
        return self.wptr
