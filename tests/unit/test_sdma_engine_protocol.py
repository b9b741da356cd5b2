"""The engine's shared vocabulary (ualinkd/amdgpu/engine.py): the GPU clock's one owner and
the atomic operations' arithmetic, which the edge applies for SDMA ATOMIC and AQL signals."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ualinkd.amdgpu.engine import AtomicOp, GpuFault, atomic_result, gpu_clock_counter


def test_gpu_clock_counter_runs_at_the_profile_rate() -> None:
    """amdgpu_gfx_get_gpu_clock_counter: a counter at gpu_counter_freq kHz; 100 MHz -> 100
    ticks per microsecond, truncated."""
    assert gpu_clock_counter(0, 100_000) == 0
    assert gpu_clock_counter(1_000, 100_000) == 100
    assert gpu_clock_counter(1_000_000_009, 100_000) == 100_000_000


def test_info_timestamp_uses_the_same_counter() -> None:
    """AMDGPU_INFO TIMESTAMP answers gpu_clock_counter of its clock (one owner)."""
    import struct

    from ualinkd.amdgpu import info

    class _P:
        gpu_counter_freq_khz = 25_000

    fake = info.AmdgpuInfo.__new__(info.AmdgpuInfo)
    fake.profile = _P()  # type: ignore[assignment]
    fake.now_ns = lambda: 7_000_000_123
    q = type("Q", (), {"query": info.TIMESTAMP, "args": (0, 0, 0, 0)})()
    got = info.AmdgpuInfo.answer(fake, None, q)  # type: ignore[arg-type]
    assert struct.unpack("<Q", got)[0] == gpu_clock_counter(7_000_000_123, 25_000)


@pytest.mark.parametrize(("op", "old", "src", "cmp", "size", "new"), [
    (AtomicOp.ADD, 5, (1 << 64) - 1, 0, 8, 4),  # ROCr's signal decrement: add -1
    (AtomicOp.ADD, 0, (1 << 64) - 1, 0, 8, (1 << 64) - 1),
    (AtomicOp.SUB, 0, 1, 0, 4, 0xFFFFFFFF),
    (AtomicOp.SWAP, 1, 2, 0, 8, 2),
    (AtomicOp.CMPSWAP, 7, 9, 7, 8, 9),
    (AtomicOp.CMPSWAP, 7, 9, 8, 8, 7),
    (AtomicOp.SMIN, 1, 0xFFFFFFFF, 0, 4, 0xFFFFFFFF),  # -1 < 1 signed
    (AtomicOp.UMIN, 1, 0xFFFFFFFF, 0, 4, 1),
    (AtomicOp.SMAX, 1, 0xFFFFFFFF, 0, 4, 1),
    (AtomicOp.UMAX, 1, 0xFFFFFFFF, 0, 4, 0xFFFFFFFF),
    (AtomicOp.AND, 0b1100, 0b1010, 0, 4, 0b1000),
    (AtomicOp.OR, 0b1100, 0b1010, 0, 4, 0b1110),
    (AtomicOp.XOR, 0b1100, 0b1010, 0, 4, 0b0110),
    (AtomicOp.INC, 3, 3, 0, 4, 0),
    (AtomicOp.INC, 2, 3, 0, 4, 3),
    (AtomicOp.DEC, 0, 3, 0, 4, 3),
    (AtomicOp.DEC, 5, 3, 0, 4, 3),
    (AtomicOp.DEC, 2, 3, 0, 4, 1),
])
def test_atomic_result(op: AtomicOp, old: int, src: int, cmp: int, size: int,
                       new: int) -> None:
    assert atomic_result(op, old, src, cmp, size) == new


@given(st.sampled_from(list(AtomicOp)), st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1),
       st.integers(0, 2**64 - 1), st.sampled_from([4, 8]))
def test_atomic_result_stays_in_range(op: AtomicOp, old: int, src: int, cmp: int,
                                      size: int) -> None:
    assert 0 <= atomic_result(op, old, src, cmp, size) < 1 << (8 * size)


def test_gpu_fault_names_the_access() -> None:
    assert str(GpuFault(0x1000, True, "unmapped")) == (
        "GPU page fault: write at VA 0x1000 (unmapped)")


def test_format_packet_reads_like_strace() -> None:
    """The tracer's text for a decoded packet: the kernel's packet name, addresses in hex,
    sizes in decimal, long data elided; the JSON fields keep numbers as numbers."""
    from ualinkd.amdgpu import sdma
    from ualinkd.amdgpu.engine import format_packet, packet_fields

    assert format_packet(sdma.CopyLinear(0x7F0000100000, 0x800000000, 4096)) == (
        "COPY_LINEAR(src=0x7f0000100000, dst=0x800000000, size=4096)")
    assert format_packet(sdma.WriteLinear(0x1000, bytes(64))) == (
        "WRITE_LINEAR(dst=0x1000, data=<64 bytes>)")
    atomic = sdma.AtomicPacket(0x2F, AtomicOp.ADD, 8, False, 0x10, 2**64 - 1, 0, 0)
    assert format_packet(atomic).startswith("ATOMIC(op_code=0x2f, op=ADD, size=8, loop=false")
    assert packet_fields(atomic)["op"] == "ADD" and packet_fields(atomic)["addr"] == 0x10
