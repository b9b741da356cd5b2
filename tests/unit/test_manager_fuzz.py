"""Hostile fabric input to the UALink manager (spec §5.1, §5.3–§5.7): any sequence of
four-dword messages from any sender stamp is handled or dropped, never raises, and leaves
the lifetimes consistent (pin count ≥ importers, NPA space and page table agree)."""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from ualinkd.config import PodConfig
from ualinkd.drm.device import Caller
from ualinkd.node import NodeCore
from ualinkd.ualink import protocol as p
from ualinkd.ualink.manager import Send

ME = Caller(1, 0)
u32 = st.integers(0, 0xFFFFFFFF)


def _node() -> tuple[NodeCore, list[tuple[int, int]]]:
    core = NodeCore(PodConfig.local(3, 1), "node0")
    f = core.open_render(128, ME)
    los = []
    for size in (4096, 1 << 20):
        rc, out = core.ioctl(f, 0xC0206440, struct.pack("<QQQQ", size, 0, 4, 0), 32, ME)
        bo = struct.unpack_from("<I", out)[0]
        rc, out = core.ioctl(f, 0xC018645B, struct.pack("<IIIxxxxQ", 0, 0, bo, 0), 24, ME)
        los.append(struct.unpack_from("<QQ", out))
    return core, los


@st.composite
def messages(draw, los: list[tuple[int, int]]) -> tuple[int, p.Dwords]:
    src = draw(st.sampled_from([1, 2, 5, 0, 300]))
    kind = draw(st.integers(0, 3))
    if kind == 0:  # anything at all
        return src, (draw(u32), draw(u32), draw(u32), draw(u32))
    lo, real_hi = draw(st.sampled_from(los))
    t = draw(st.sampled_from(list(p.MsgType)))
    bits = p.handle_lo_bits(lo)
    hi = draw(st.sampled_from([real_hi, real_hi, draw(st.integers(0, (1 << 64) - 1))]))
    dw = (bits & 0xFFFFFFFF | t, bits >> 32, hi & 0xFFFFFFFF, hi >> 32)
    if t == p.MsgType.HELLO:
        receiver = draw(st.sampled_from([0, 0, draw(st.integers(0, 1023))]))
        dw = (1 | receiver << 10 | (src & 0x3FF) << 20, 0, 0, 0)
    return src, dw


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_random_messages_never_break_the_manager(data):
    core, los = _node()
    mgr = core.managers[128]
    for _ in range(data.draw(st.integers(1, 40))):
        src, dwords = data.draw(messages(los))
        mgr.receive(src, p.decode_message(dwords))
        for eff in mgr.take_effects():
            if isinstance(eff, Send):
                assert eff.src == 0
                assert 0 <= eff.dst < 256
                eff.msg.encode()  # well-formed on the wire
                # the peer accepts every message: complete the send like the agent does
                mgr.on_sent(eff, None, 0.0)
        mgr.check_invariants()


def test_the_generator_can_reach_a_grant():
    """The generator's building blocks are not vacuous: a HELLO with receiver 0 and an
    NPA_REQ with the real handle_hi (both of which it draws often) grant an NPA."""
    core, los = _node()
    mgr = core.managers[128]
    lo, hi = los[0]
    for dwords in ((1 | 1 << 20, 0, 0, 0),
                   p.NpaReq(p.handle_lo_bits(lo), hi).encode()):
        mgr.receive(1, p.decode_message(dwords))
        for eff in mgr.take_effects():
            if isinstance(eff, Send):
                mgr.on_sent(eff, None, 0.0)
    assert list(mgr.exports[lo].importers) == [1]
