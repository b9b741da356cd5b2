"""The exporter's data plane against any LOAD / STORE an authenticated peer can send (the
robustness review, session 6; §4.4, policy 10): `serve_load` / `serve_store` give the bytes
asked for, or refuse with DrmError(EFAULT) and change nothing; never another exception,
which would escape Conn._serve (fabric/conn.py) and end the node. Both address modes."""

from __future__ import annotations

import errno

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_pod_protocol import ME, MemFabric, create_export, import_, make_pod, start

from ualinkd.drm.errors import DrmError
from ualinkd.fabric.wire import MAX_DATA
from ualinkd.ualink.state import AddrMode

SIZE = 64 << 10


@pytest.mark.parametrize("mode", [AddrMode.SOURCE_ALIASING, AddrMode.SOURCE_IDENTIFICATION])
async def test_any_load_or_store_is_served_or_refused_with_efault(nursery, autojump_clock,
                                                                  mode) -> None:
    fabric = MemFabric()
    a, b, _ = await start(nursery, make_pod(3, mode), fabric)
    fa, bo, handle = await create_export(a, SIZE)
    fb = b.open_render(128, ME)
    assert (await import_(b, fb, handle))[0] == 0
    mgr = a.managers[128]
    base = b.managers[128].imports[handle[0]].npa_offset * 4096
    if mode == AddrMode.SOURCE_IDENTIFICATION:
        base &= ~(0xFF << 41)  # (the exporter's segment: its own accel id in the high bits)
    mgr.serve_store(1, base, bytes(range(256)) * (SIZE // 256))
    image = b"".join(mgr.serve_load(1, base, SIZE))
    addrs = (st.integers(-4096, SIZE + 4096).map(lambda o: max(0, base + o))
             | st.integers(0, 2**64 - 1)
             | st.integers(0, 63).map(lambda bit: base ^ (1 << bit)))

    @settings(max_examples=1500, deadline=None)
    @given(st.integers(0, 0xFFFF), addrs, st.integers(0, MAX_DATA), st.booleans())
    def probe(src: int, addr: int, n: int, store: bool) -> None:
        inside = src == 1 and base <= addr and addr + n <= base + SIZE
        try:
            if store:
                mgr.serve_store(src, addr, b"\xee" * n)
            else:
                got = b"".join(mgr.serve_load(src, addr, n))
        except DrmError as e:
            assert e.errno == errno.EFAULT
            assert not inside or n == 0, (src, hex(addr), n)
            return
        assert inside, (src, hex(addr), n)
        if store:
            mgr.serve_store(src, addr, image[addr - base: addr - base + n])  # (as it was)
        else:
            assert got == image[addr - base: addr - base + n]

    probe()
    assert b"".join(mgr.serve_load(1, base, SIZE)) == image
