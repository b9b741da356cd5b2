"""The UALink protocol between nodes (spec §1.6 I3–I20, §5.4–§5.8, §6), end to end through
the real managers and the real agent, over an in-memory fabric that acknowledges at once.
Time is trio's autojump clock, so 5 s timeouts take microseconds."""

from __future__ import annotations

import errno
import struct
from collections.abc import Sequence
from typing import TypeVar

import pytest
import trio

from ualinkd.config import PodConfig
from ualinkd.drm.completion import Completion
from ualinkd.drm.device import Caller
from ualinkd.drm.errors import DrmError
from ualinkd.fabric.agent import UalinkAgent
from ualinkd.fabric.waiting import completed
from ualinkd.node import NodeCore
from ualinkd.ualink import protocol as p
from ualinkd.ualink.peers import ConnState, NodeState
from ualinkd.ualink.state import AddrMode

T = TypeVar("T")

UALINK = 0xC018645B
GEM_CREATE = 0xC0206440
GEM_CLOSE = 0x40086409
GEM_MMAP = 0xC0086441
ME = Caller(1000, 0)


class MemFabric:
    """Delivers every message to the agent owning its destination; `down` nodes and
    `mute` accels swallow messages (the send still fails or succeeds as configured)."""

    def __init__(self) -> None:
        self.agents: dict[int, UalinkAgent] = {}
        self.down: set[int] = set()  # accels whose link is down: sends fail with ETIME
        self.mute: set[int] = set()  # accels that accept but never process
        self.log: list[tuple[int, int, p.Message]] = []
        self.nursery: trio.Nursery | None = None

    def send_batch(self, src: int, dst: int, messages: Sequence[p.Dwords]
                   ) -> Completion[list[tuple[DrmError | None, float]]]:
        """FabricLink.send_batch's contract: queued now, in order; the outcomes complete
        the Completion from another task (a down accel's after 2 s, with ETIME)."""
        done: Completion[list[tuple[DrmError | None, float]]] = Completion()

        async def deliver() -> None:
            await trio.sleep(0)
            if dst in self.down:
                await trio.sleep(2)
                now = trio.current_time()
                done.set_result([(DrmError(errno.ETIME, "no ack"), now) for _ in messages])
                return
            out: list[tuple[DrmError | None, float]] = []
            for dwords in messages:
                self.log.append((src, dst, p.decode_message(dwords)))
                if dst not in self.mute:
                    self.agents[dst].on_message(src, dst, dwords)
                out.append((None, trio.current_time()))
            done.set_result(out)

        assert self.nursery is not None
        self.nursery.start_soon(deliver)
        return done


def make_pod(nodes: int = 2, mode: AddrMode = AddrMode.SOURCE_ALIASING, **kw) -> PodConfig:
    cfg = PodConfig.local(nodes, 1)
    v = cfg.vpods[0]
    return PodConfig(cfg.uuid, cfg.key, cfg.nodes, (type(v)(v.vpod_id, v.members, mode),),
                     cfg.ppod_size, **kw)


async def start(nursery: trio.Nursery, cfg: PodConfig, fabric: MemFabric) -> list[NodeCore]:
    cores = []
    fabric.nursery = nursery
    for n in cfg.nodes:
        core = NodeCore(cfg, n.name)
        agent = UalinkAgent(core, fabric.send_batch)
        await nursery.start(agent.run)
        for a in n.accels:
            fabric.agents[a.accel_id] = agent
        cores.append(core)
    return cores


async def ioctl(core: NodeCore, f, cmd: int, data: bytes) -> tuple[int, bytes]:
    r = core.ioctl(f, cmd, data, (cmd >> 16) & 0x3FFF, ME)
    if isinstance(r, Completion):
        return await completed(r)
    if not isinstance(r, tuple):
        r = await r
    return r


async def create_export(core: NodeCore, size: int = 1 << 20):
    f = core.open_render(128, ME)
    rc, out = await ioctl(core, f, GEM_CREATE, struct.pack("<QQQQ", size, 0, 4, 0))
    assert rc == 0
    bo = struct.unpack_from("<I", out)[0]
    rc, out = await ioctl(core, f, UALINK, struct.pack("<IIIxxxxQ", 0, 0, bo, 0))
    assert rc == 0
    return f, bo, struct.unpack("<QQ", out[:16])


async def import_(core: NodeCore, f, handle: tuple[int, int]) -> tuple[int, bytes]:
    return await ioctl(core, f, UALINK, struct.pack("<IIQQ", 1, 0, *handle))


async def test_remote_import_dedupe_and_npa_bo(nursery, autojump_clock):
    """§1.6 I20, I5, §4.6, §5.6: HELLO/HELLO_ACK, NPA_REQ/NPA_RSP; the NPA BO is in the
    NPA domain, not CPU-mappable (GEM_MMAP EPERM), not exportable; a second import dedupes
    on handle_lo and sends nothing; the exporter pins once."""
    fabric = MemFabric()
    a, b = await start(nursery, make_pod(), fabric)
    fa, bo, handle = await create_export(a)
    fb = b.open_render(128, ME)
    rc, out = await import_(b, fb, handle)
    assert rc == 0
    token = struct.unpack_from("<I", out)[0]
    assert token != 0 and out[4:] == struct.pack("<IQQ", 0, *handle)
    types = [type(m).__name__ for _, _, m in fabric.log]
    assert types == ["Hello", "HelloAck", "NpaReq", "NpaRsp"]
    exp = a.managers[128].exports[handle[0]]
    assert exp.bo.pin_count == 1 and list(exp.importers) == [1]
    key = b.tokens.open(b.tokens.lookup(str(token), 0)[0], 0)
    h = b.devices[128].prime_fd_to_handle(fb, b.tokens.resolve(key))
    npa_bo = fb.handles[h]
    assert npa_bo.preferred_domains == 0x80 and npa_bo.size == 1 << 20
    assert (await ioctl(b, fb, GEM_MMAP, struct.pack("<II", h, 0)))[0] == -errno.EPERM
    rc, _ = await ioctl(b, fb, UALINK, struct.pack("<IIIxxxxQ", 0, 0, h, 0))
    assert rc == -errno.EOPNOTSUPP
    n = len(fabric.log)
    rc, out2 = await import_(b, fb, handle)
    assert rc == 0 and len(fabric.log) == n  # dedupe: no messages
    key2 = b.tokens.open(b.tokens.lookup(str(struct.unpack_from("<I", out2)[0]), 0)[0], 0)
    assert b.tokens.resolve(key2) is b.tokens.resolve(key)


async def test_revoke_release_on_close(nursery, autojump_clock):
    """§5.7: GEM_CLOSE of the exporter's last handle sends NPA_REVOKE; the importer tears
    its node down and answers NPA_RELEASE; the exporter frees the NPA and unpins."""
    fabric = MemFabric()
    a, b = await start(nursery, make_pod(), fabric)
    fa, bo, handle = await create_export(a)
    fb = b.open_render(128, ME)
    assert (await import_(b, fb, handle))[0] == 0
    mgr_a, mgr_b = a.managers[128], b.managers[128]
    assert mgr_a.npa_import_pages == 256
    assert (await ioctl(a, fa, GEM_CLOSE, struct.pack("<II", bo, 0)))[0] == 0
    await trio.sleep(0.1)
    types = [type(m).__name__ for _, _, m in fabric.log]
    assert types[-2:] == ["NpaRevoke", "NpaRelease"]
    assert mgr_a.npa_import_pages == 0 and not mgr_a.invalid and not mgr_b.imports
    assert a.live_objects() == 0
    rc, _ = await import_(b, fb, handle)  # §6.3: re-import after revoke → EINVAL
    assert rc == -errno.EINVAL


async def test_silent_importer_reset_after_timeout(nursery, autojump_clock):
    """§6.5, §5.7 step 8: an importer that never releases: the NPA is freed after the
    response timeout and the connection to it is reset."""
    fabric = MemFabric()
    a, b = await start(nursery, make_pod(), fabric)
    fa, bo, handle = await create_export(a)
    fb = b.open_render(128, ME)
    assert (await import_(b, fb, handle))[0] == 0
    fabric.mute.add(1)
    await ioctl(a, fa, GEM_CLOSE, struct.pack("<II", bo, 0))
    mgr_a = a.managers[128]
    await trio.sleep(4.9)
    assert mgr_a.invalid  # still waiting for the release
    await trio.sleep(0.2)
    assert not mgr_a.invalid and mgr_a.npa_import_pages == 0
    assert mgr_a.conn(1).state == ConnState.NOT_READY


async def test_import_errnos(nursery, autojump_clock):
    """§1.6 I16 (unknown handle → EINVAL after NPA_FAIL), I1 (id ≥ 256 → EINVAL),
    policy 4 (outside the vPod → EACCES), I14 (no NPA_RSP → ETIMEDOUT + reset),
    I11 (no HELLO_ACK → ETIMEDOUT), I9 (HELLO not accepted → ETIME)."""
    fabric = MemFabric()
    a, b, _ = await start(nursery, make_pod(3), fabric)
    fa, bo, (lo, hi) = await create_export(a)
    fb = b.open_render(128, ME)
    assert (await import_(b, fb, (lo, hi ^ 1)))[0] == -errno.EINVAL  # wrong handle_hi
    assert (await import_(b, fb, (lo | 0x3FF, hi)))[0] == -errno.EINVAL  # id 1023
    assert (await import_(b, fb, ((lo & ~0x3FF) | 77, hi)))[0] == -errno.EACCES
    fabric.mute.add(0)  # exporter accepts but never answers NPA_REQ
    t0 = trio.current_time()
    assert (await import_(b, fb, (lo, hi)))[0] == -errno.ETIMEDOUT
    assert 4.9 < trio.current_time() - t0 < 5.5
    assert b.managers[128].conn(0).state == ConnState.NOT_READY  # reset
    assert (await import_(b, fb, (lo, hi)))[0] == -errno.ETIMEDOUT  # now no HELLO_ACK
    assert b.managers[128].conn(0).state == ConnState.NOT_READY
    fabric.mute.clear()
    fabric.down.add(0)
    assert (await import_(b, fb, (lo, hi)))[0] == -errno.ETIME
    fabric.down.clear()
    assert (await import_(b, fb, (lo, hi)))[0] == 0


async def test_concurrent_import_eagain(nursery, autojump_clock):
    """§1.6 I3: a second import of a handle while the first waits → EAGAIN."""
    fabric = MemFabric()
    a, b = await start(nursery, make_pod(), fabric)
    fa, bo, handle = await create_export(a)
    fb = b.open_render(128, ME)
    fabric.mute.add(0)
    results = []

    async def first():
        results.append(await import_(b, fb, handle))

    nursery.start_soon(first)
    await trio.sleep(0.01)
    assert (await import_(b, fb, handle))[0] == -errno.EAGAIN
    await trio.sleep(11)
    assert results[0][0] == -errno.ETIMEDOUT


async def test_enospc_tiny_npa_space(nursery, autojump_clock):
    """§4.3, §1.6 I15: the exporter's NPA space cannot hold the BO → NPA_FAIL(NOSPACE) →
    ENOSPC; the BO is unpinned again."""
    fabric = MemFabric()
    a, b = await start(nursery, make_pod(), fabric)
    a.managers[128].npa_limit_pages = 16
    a.managers[128].npa = a.managers[128]._new_npa_space(AddrMode.SOURCE_ALIASING)
    fa, bo, handle = await create_export(a, 1 << 20)
    fb = b.open_render(128, ME)
    assert (await import_(b, fb, handle))[0] == -errno.ENOSPC
    assert a.managers[128].exports[handle[0]].bo.pin_count == 0


@pytest.mark.parametrize("mode", [AddrMode.SOURCE_ALIASING, AddrMode.SOURCE_IDENTIFICATION])
async def test_addressing_modes(nursery, autojump_clock, mode):
    """§4.2: source-aliasing shares one NPA among importers; source-identification gives
    each importer its own NPA inside the importer's segment; pins = importers."""
    fabric = MemFabric()
    a, b, c = await start(nursery, make_pod(3, mode), fabric)
    fa, bo, handle = await create_export(a)
    for core in (b, c):
        assert (await import_(core, core.open_render(128, ME), handle))[0] == 0
    mgr = a.managers[128]
    entry = mgr.exports[handle[0]]
    assert entry.bo.pin_count == 2
    starts = {r.npa_start for r in entry.importers.values()}
    if mode == AddrMode.SOURCE_ALIASING:
        assert len(starts) == 1 and mgr.npa_import_pages == 256
    else:
        assert {s >> 29 for s in starts} == {1, 2} and mgr.npa_import_pages == 512
    mgr.check_invariants()
    await ioctl(a, fa, GEM_CLOSE, struct.pack("<II", bo, 0))
    await trio.sleep(0.1)
    assert mgr.npa_import_pages == 0 and not b.managers[128].imports
    assert not c.managers[128].imports


async def test_peer_restart_hello_resets(nursery, autojump_clock):
    """§5.4 + policy 1: a HELLO on an ESTABLISHED connection (the peer restarted) cleans
    up what was shared with it: the exporter unpins and frees; with the quirk
    "hello-no-reset" only the generation moves."""
    for quirks, cleaned in ((frozenset(), True), (frozenset({"hello-no-reset"}), False)):
        fabric = MemFabric()
        a, b = await start(nursery, make_pod(kernel_quirks=quirks), fabric)
        fa, bo, handle = await create_export(a)
        assert (await import_(b, b.open_render(128, ME), handle))[0] == 0
        mgr_a = a.managers[128]
        gen = mgr_a.conn(1).generation
        b.managers[128].stop()  # node b's accel resets ...
        fabric.agents[0].on_message(1, 0, p.Hello(0, 1).encode())  # ... and says HELLO
        await trio.sleep(0.1)
        assert mgr_a.conn(1).generation == gen + 1
        entry = mgr_a.exports[handle[0]]
        assert (entry.bo.pin_count == 0) is cleaned
        assert (not entry.importers) is cleaned


async def test_drop_bitmap_one_npa_rsp(nursery, autojump_clock):
    """§5.12, policy 9: bit 4 drops exactly one NPA_RSP: that import times out (and
    resets the connection), the next one succeeds."""
    fabric = MemFabric()
    a, b = await start(nursery, make_pod(), fabric)
    fa, bo, handle = await create_export(a)
    fb = b.open_render(128, ME)
    b.managers[128].drop_msg_bitmap = 1 << p.MsgType.NPA_RSP
    assert (await import_(b, fb, handle))[0] == -errno.ETIMEDOUT
    assert b.managers[128].drop_msg_bitmap == 0
    assert (await import_(b, fb, handle))[0] == 0
    assert b.managers[128].imports[handle[0]].state == NodeState.READY


async def test_data_plane_refusals(nursery, autojump_clock):
    """§4.4, issue 4 "Bad input": LOAD/STORE at NPAs that are not mapped, outside the
    exporter's segment, past the BO's end, or from an accel that is not an importer are
    refused (EFAULT) and counted; a revoke invalidates the PTEs so the next load faults."""
    fabric = MemFabric()
    a, b, c = await start(nursery, make_pod(3), fabric)
    fa, bo, handle = await create_export(a, 64 << 10)
    fb = b.open_render(128, ME)
    assert (await import_(b, fb, handle))[0] == 0
    mgr = a.managers[128]
    node = b.managers[128].imports[handle[0]]
    base = ((0 << 29) | node.npa_offset) * 4096
    mgr.serve_store(1, base + 10, b"hello")
    assert b"".join(mgr.serve_load(1, base + 10, 5)) == b"hello"
    bad = [
        (1, base + (64 << 10), 1),  # past the end of the BO
        (1, base + (60 << 10), 8 << 10),  # runs past the end
        (1, base + (5 << 41), 4),  # another GPU's segment
        (1, 0x800 * 4096 + (1 << 30), 4),  # not mapped
        (2, base, 4),  # accel 2 never imported it
    ]
    for src, addr, n in bad:
        with pytest.raises(DrmError) as e:
            mgr.serve_load(src, addr, n)
        assert e.value.errno == errno.EFAULT
    assert mgr.refused_accesses == len(bad)
    await ioctl(a, fa, GEM_CLOSE, struct.pack("<II", bo, 0))
    with pytest.raises(DrmError):
        mgr.serve_load(1, base, 4)


async def test_timed_out_waits_leave_no_events_behind(nursery, autojump_clock):
    """§1.6 I11, I14: waits that end in ETIMEDOUT (no HELLO_ACK, no NPA_RSP) leave nothing
    in the agent: a client importing handle after handle from a mute exporter must not
    grow the daemon."""
    fabric = MemFabric()
    a, b = await start(nursery, make_pod(), fabric)
    fa, bo, (lo, hi) = await create_export(a)
    fb = b.open_render(128, ME)
    agent_b = fabric.agents[1]
    fabric.mute.add(0)
    for i in range(3):
        rc, _ = await import_(b, fb, (lo ^ (i << 10), hi))
        assert rc == -errno.ETIMEDOUT
    assert agent_b._imports == {}
    assert not b.managers[128].imports


async def test_interrupted_hello_wait_leaves_not_ready(nursery, autojump_clock):
    """§1.6 I10, §5.4: a HELLO_ACK wait that is interrupted puts the connection back to
    NOT_READY, so the next import sets it up again instead of answering EAGAIN forever."""
    fabric = MemFabric()
    a, b = await start(nursery, make_pod(), fabric)
    fa, bo, handle = await create_export(a)
    fb = b.open_render(128, ME)
    fabric.mute.add(0)
    with trio.move_on_after(1):
        await import_(b, fb, handle)
    assert b.managers[128].conn(0).state == ConnState.NOT_READY
    assert not b.managers[128].imports
    fabric.mute.clear()
    assert (await import_(b, fb, handle))[0] == 0


async def test_sends_of_a_deactivated_accel_fail_with_eshutdown(nursery, autojump_clock):
    """§5.1 send errors ("-ESHUTDOWN: local accel not ACTIVE"), §6.9: an NPA_REVOKE queued by
    a GEM_CLOSE just before the accel is deactivated never reaches the wire; the stop has
    already freed everything, and the importer keeps its node (§5.8a)."""
    fabric = MemFabric()
    a, b = await start(nursery, make_pod(), fabric)
    fa, bo, handle = await create_export(a)
    fb = b.open_render(128, ME)
    assert (await import_(b, fb, handle))[0] == 0
    sent = len(fabric.log)
    drain, a.after_request = a.after_request, lambda: None  # (the agent starts it below)
    assert (await ioctl(a, fa, GEM_CLOSE, struct.pack("<II", bo, 0)))[0] == 0  # REVOKE queued
    assert a.managers[128].outbox  # not started yet ...
    a.managers[128].deactivate()  # ... when the accel is deactivated
    drain()
    await trio.sleep(1)
    assert fabric.log[sent:] == []
    assert a.managers[128].npa_import_pages == 0
    assert [n.state for n in b.managers[128].imports.values()] == [NodeState.READY]
