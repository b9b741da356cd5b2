"""FabricLink over real sockets on 127.0.0.1: messages, ACKs, timeouts, reconnects, and peers
that misbehave (each dropped with one log line while a well-behaved peer keeps working)."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import itertools
import logging
import secrets
import socket
import ssl
import struct
import threading
import uuid
from collections.abc import AsyncIterator, Callable

import pytest
import trio
import trio.testing
import trustme

from ualinkd.amdgpu.memory import BoMemory
from ualinkd.config import AccelConfig, NodeConfig, PodConfig
from ualinkd.drm.completion import Completion
from ualinkd.drm.errors import DrmError
from ualinkd.drm.loaded import Loaded, in_memory
from ualinkd.fabric import admission, auth
from ualinkd.fabric import conn as conn_mod
from ualinkd.fabric.link import Dwords, FabricLink, OnRequest
from ualinkd.fabric.session import HEARTBEAT
from ualinkd.fabric.waiting import completed
from ualinkd.fabric.wire import (
    NEED_DATA,
    Ack,
    AuthHello,
    AuthProof,
    Data,
    Frame,
    FrameDecoder,
    Load,
    Msg,
    Ping,
    Pong,
    Store,
    encode_frame,
)

DW = (3, 0x1000, 0, 0)
WATCHDOG = 20.0


def make_pod(ack_ms: int = 300,
             quirks: frozenset[str] = frozenset({"send-fail-slow"})) -> PodConfig:
    """Nodes a (accels 0, 1), b (2, 3), c (4, 5): a dials b and c, b dials c. By default
    with the quirk "send-fail-slow" (§13 N4's older build): these tests are of sends that
    wait in line for a link that is down (tests/integration/test_kernel_n_pod.py has N's
    failing at once)."""
    nodes = tuple(NodeConfig(n, "127.0.0.1:0", (AccelConfig(2 * i), AccelConfig(2 * i + 1)))
                  for i, n in enumerate("abc"))
    cfg = PodConfig(uuid=uuid.uuid4(), key=secrets.token_hex(32), nodes=nodes,
                    send_ack_timeout_ms=ack_ms, kernel_quirks=quirks)
    cfg.validate()
    return cfg


class Pod:
    """Links started in one nursery, with every address book kept up to date."""

    def __init__(self, cfg: PodConfig, nursery: trio.Nursery) -> None:
        self.cfg = cfg
        self.nursery = nursery
        self.links: dict[str, FabricLink] = {}
        self.ports: dict[str, int] = {}
        self.got: dict[str, list[tuple[int, int, tuple[int, ...]]]] = {}
        self.states: list[tuple[str, str, bool]] = []

    async def start(self, name: str, cfg: PodConfig | None = None, on_message=None,
                    **kw: object) -> FabricLink:
        got = self.got.setdefault(name, [])
        kw = {"connect_backoff": (0.01, 0.05), "handshake_timeout": 0.5, **kw}
        link = FabricLink(cfg or self.cfg, name,
                          on_message or (lambda s, d, w: got.append((s, d, w))),
                          on_peer_state=lambda p, up: self.states.append((name, p, up)),
                          **kw)  # type: ignore[arg-type]
        port = await self.nursery.start(link.run)
        self.links[name], self.ports[name] = link, port
        for other, olink in self.links.items():
            if other != name:
                olink.set_peer_address(name, f"127.0.0.1:{port}")
                link.set_peer_address(other, f"127.0.0.1:{self.ports[other]}")
        return link


@pytest.fixture
async def pod() -> AsyncIterator[Pod]:
    async with trio.open_nursery() as nursery:
        yield Pod(make_pod(), nursery)
        nursery.cancel_scope.cancel()


async def wait_until(pred: Callable[[], bool], timeout: float = 2.0) -> None:
    with trio.fail_after(timeout):
        while not pred():
            await trio.sleep(0.002)


async def read_frame(stream: trio.abc.Stream, dec: FrameDecoder,
                     pings: bool = False) -> Frame:
    """The next frame; the link's heartbeat PINGs (one as soon as it is up) are skipped."""
    while True:
        while (f := dec.next_frame()) is NEED_DATA:
            data = await stream.receive_some(4096)
            assert data, "peer closed"
            dec.receive_data(data)
        if pings or not isinstance(f, Ping):
            return f  # type: ignore[return-value]


async def raw_auth(port: int, cfg: PodConfig, name: str, peer: str,
                   nonce: bytes | None = None, key: bytes | None = None,
                   ssl_context: ssl.SSLContext | None = None,
                   handshakes: list[auth.ClientHandshake] | None = None
                   ) -> tuple[trio.abc.Stream, FrameDecoder]:
    """A hand-driven client that authenticates as `name` (with the key of its link to `peer`,
    or `key`; over TLS with `ssl_context`), then may misbehave. Its handshake is appended to
    `handshakes` (what its data channels are bound with)."""
    stream: trio.abc.Stream = await trio.open_tcp_stream("127.0.0.1", port)
    if ssl_context is not None:
        stream = trio.SSLStream(stream, ssl_context, server_hostname="127.0.0.1")
        await stream.do_handshake()
    hs = auth.ClientHandshake(cfg, name, peer, now=trio.current_time(), nonce=nonce, key=key)
    dec = FrameDecoder()
    out = hs.initial_frames()
    if handshakes is not None:
        handshakes.append(hs)
    while out or not hs.established:
        await stream.send_all(b"".join(encode_frame(f) for f in out))
        if hs.established:
            break
        out = hs.receive_frame(await read_frame(stream, dec), trio.current_time())
    return stream, dec


async def raw_server_b(pod: Pod, **kw: object) -> tuple[FabricLink, trio.abc.Stream,
                                                       FrameDecoder, list[Frame],
                                                       list[trio.SocketListener]]:
    """Link a (FabricLink arguments `kw`), dialing a hand-driven "b" that answers its
    handshake up to the last frames (returned unsent: the caller sends them, with whatever
    it wants in the same write)."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    a = await pod.start("a", **kw)
    a.set_peer_address("b", f"127.0.0.1:{port}")
    stream = await listeners[0].accept()
    hs = auth.ServerHandshake(pod.cfg, "b", now=trio.current_time(), nonces=auth.NonceCache())
    dec = FrameDecoder()
    while True:
        out = hs.receive_frame(await read_frame(stream, dec), trio.current_time())
        if hs.established:
            return a, stream, dec, out, listeners
        await stream.send_all(b"".join(encode_frame(f) for f in out))


async def expect_closed(stream: trio.abc.Stream, timeout: float = 2.0) -> None:
    with trio.fail_after(timeout):
        try:
            while await stream.receive_some(4096):
                pass
        except trio.BrokenResourceError:
            pass
    await trio.aclose_forcefully(stream)


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name.startswith("ualinkd.fabric") and r.levelno >= logging.WARNING]


# ---- messages ---------------------------------------------------------------------------------

async def test_messages_flow_both_ways_with_the_right_stamps(pod: Pod) -> None:
    a, b, c = [await pod.start(n) for n in "abc"]
    await wait_until(lambda: a.is_up("b") and a.is_up("c") and b.is_up("c"))
    await completed(a.send(0, 2, DW))
    await completed(b.send(3, 1, (4, 5, 6, 7)))
    await completed(c.send(5, 0, (6, 0, 0, 0)))
    await completed(a.send(1, 4, (7, 1, 2, 3)))
    await completed(c.send(4, 3, (1, 2 << 10, 0, 0)))
    assert pod.got["a"] == [(3, 1, (4, 5, 6, 7)), (5, 0, (6, 0, 0, 0))]
    assert pod.got["b"] == [(0, 2, DW), (4, 3, (1, 2 << 10, 0, 0))]
    assert pod.got["c"] == [(1, 4, (7, 1, 2, 3))]
    assert ("a", "b", True) in pod.states and ("c", "b", True) in pod.states
    assert (a.peer_of(4), a.peer_of(9)) == ("c", None)
    rtt = await c.ping("a")
    assert 0 < rtt < 0.5


async def test_many_concurrent_sends_keep_order_per_link(pod: Pod) -> None:
    a, b = await pod.start("a"), await pod.start("b")
    async with trio.open_nursery() as n:
        for i in range(50):
            n.start_soon(_send, a, 0, 2, (3, i, 0, 0))
            n.start_soon(_send, b, 2, 1, (3, i, 0, 0))
    assert sorted(w[1] for _, _, w in pod.got["b"]) == list(range(50))
    assert len(pod.got["a"]) == 50


async def test_send_errors(pod: Pod) -> None:
    a = await pod.start("a")
    with pytest.raises(DrmError) as e:
        await completed(a.send(0, 77, DW))
    assert e.value.errno == errno.EINVAL
    with pytest.raises(DrmError) as e:
        await completed(a.send(0, 1, DW))  # local accel
    assert e.value.errno == errno.EINVAL
    start = trio.current_time()
    with pytest.raises(DrmError) as e:
        await completed(a.send(0, 2, DW))  # b never started
    assert e.value.errno == errno.ETIME
    assert 0.3 <= trio.current_time() - start < 0.6


async def test_send_waits_for_a_link_that_comes_up(pod: Pod) -> None:
    a = await pod.start("a", ack_timeout=2.0)
    async with trio.open_nursery() as n:
        n.start_soon(_send, a, 0, 2, DW)
        await trio.sleep(0.05)
        await pod.start("b")
    assert pod.got["b"] == [(0, 2, DW)]


async def test_reconnects_after_the_listening_side_restarts(pod: Pod, caplog) -> None:
    caplog.set_level(logging.INFO, logger="ualinkd.fabric")
    a, b = await pod.start("a"), await pod.start("b")
    await completed(a.send(0, 2, DW))
    await b.aclose()
    await wait_until(lambda: not a.is_up("b"))
    assert ("a", "b", False) in pod.states
    with pytest.raises(DrmError) as e:
        await completed(a.send(0, 2, DW))
    assert e.value.errno == errno.ETIME
    # Same port again: only the dialer's backoff brings the link back.
    nodes = tuple(dataclasses.replace(n, address=f"127.0.0.1:{pod.ports['b']}")
                  if n.name == "b" else n for n in pod.cfg.nodes)
    pod.got["b"] = []
    await pod.start("b", dataclasses.replace(pod.cfg, nodes=nodes))
    await wait_until(lambda: a.is_up("b"))
    await completed(a.send(1, 3, DW))
    assert pod.got["b"] == [(1, 3, DW)]
    assert len(warnings(caplog)) <= 1  # the first failed redial; repeats are DEBUG
    assert all("cannot link to b" in w for w in warnings(caplog))


async def test_nonzero_ack_status_is_ecomm(pod: Pod) -> None:
    c = await pod.start("c")
    stream, dec = await raw_auth(pod.ports["c"], pod.cfg, "a", "c")
    await wait_until(lambda: c.is_up("a"))
    async with trio.open_nursery() as n:
        async def fake_firmware() -> None:
            msg = await read_frame(stream, dec)
            assert isinstance(msg, Msg) and (msg.src_accel, msg.dst_accel) == (4, 0)
            await stream.send_all(encode_frame(Ack(msg.seq, -5)))
        n.start_soon(fake_firmware)
        with pytest.raises(DrmError) as e:
            await completed(c.send(4, 0, DW))
    assert e.value.errno == errno.ECOMM
    await stream.aclose()


async def test_a_full_ring_holds_messages_without_blocking_the_acks_behind_them(
        pod: Pod) -> None:
    """Issue 10 item 4 (§5.1): b's ring handles nothing until the handler of b's first
    message has sent a message to a and had its ACK, which comes back among a's 60 further
    messages: b keeps reading (the acknowledged messages wait in the accel's one queue, in
    order), so the ACK arrives and nothing is lost. With the queue at its bound (40 here:
    on_message's Completion) b stops reading, and reads on once it has room."""
    queue: list[int] = []
    room: list[Completion[None]] = []
    handler_sent: list[object] = []
    links: dict[str, FabricLink] = {}

    async def talk_back() -> None:  # the first message's handler
        handler_sent.append(None)
        await completed(links["b"].send(2, 0, (9, 0, 0, 0)))
        handler_sent[0] = "acked"

    def on_message(src: int, dst: int, dwords: tuple[int, ...]) -> Completion[None] | None:
        queue.append(dwords[1])
        if len(queue) == 1:
            pod.nursery.start_soon(talk_back)
        if len(queue) >= 40 and not handler_sent[1:]:
            c: Completion[None] = Completion()
            room.append(c)
            return c
        return None

    a = await pod.start("a", ack_timeout=5.0)
    links["b"] = await pod.start("b", on_message=on_message, ack_timeout=5.0)
    await wait_until(lambda: a.is_up("b"))
    async with trio.open_nursery() as n:
        for i in range(61):
            n.start_soon(_send, a, 0, 2, (3, i, 0, 0))
            await trio.sleep(0)
        await wait_until(lambda: handler_sent == ["acked"])  # not stuck behind the 60
        b_conn = links["b"]._conns["a"]
        await wait_until(lambda: b_conn.paused)  # the queue at its bound: reading stopped
        assert len(queue) == 40
        handler_sent.append("free")
        for c in room:
            c.set_result(None)
    assert queue == list(range(61))  # every message, in order
    assert pod.got["a"] == [(2, 0, (9, 0, 0, 0))]


async def test_a_message_is_in_its_queue_before_its_ack_leaves(pod: Pod) -> None:
    """Issue 10 item 4 (§5.1: the firmware accepts a message before its driver sees it):
    the link hands an acknowledged message to its accel's queue in the call that decodes
    it, before the ACK is written; so a link that drops after the ACK went loses nothing."""
    got: list[int] = []
    acked: list[int] = []
    links: dict[str, FabricLink] = {}

    def on_message(src: int, dst: int, dwords: tuple[int, ...]) -> None:
        got.append(dwords[1])

    a = await pod.start("a")
    links["b"] = await pod.start("b", on_message=on_message)
    await wait_until(lambda: a.is_up("b"))

    async def send(i: int) -> None:
        await completed(a.send(0, 2, (3, i, 0, 0)))
        acked.append(i)
        assert i in got  # (in its queue before the sender heard its ACK)

    async with trio.open_nursery() as n:
        n.start_soon(send, 0)
    await a.aclose()
    await wait_until(lambda: not links["b"].is_up("a"))
    assert got == [0] and acked == [0]


# ---- misbehaving peers ----------------------------------------------------------------------

async def _hello(stream: trio.SocketStream, hello: AuthHello) -> None:
    await stream.send_all(encode_frame(hello))


CASES: dict[str, str] = {
    "wrong_key": "failed to prove the key of our link",
    "wrong_uuid": "is not this pod",
    "unknown_node": "unknown node 'zed'",
    "own_name": "claims to be this node",
    "replayed_nonce": "replayed nonce",
    "frame_before_handshake": "MSG frame before the handshake finished",
    "garbage": "frame length",
    "oversized_after_auth": "frame length 4294967295",
    "forged_src_accel": "sent src accel 0",
    "foreign_dst_accel": "sent dst accel 1",
    "handshake_timeout": "within 0.5 s",
    "silent_peer": "nothing received",
}


@pytest.mark.parametrize("case", CASES)
async def test_bad_peer_is_dropped_and_logged_once(pod: Pod, caplog, case: str) -> None:
    caplog.set_level(logging.INFO, logger="ualinkd.fabric")
    a = await pod.start("a")
    # (silent_peer: c drops a peer silent for 1 s; at 0.3 s a stall of this one process,
    # which runs a's side too, once dropped the well-behaved link with it under CI's load)
    kw = {"heartbeat_interval": 0.05, "heartbeat_timeout": 1.0} if case == "silent_peer" else {}
    c = await pod.start("c", **kw)
    await wait_until(lambda: a.is_up("c"))
    cfg, port, nonce = pod.cfg, pod.ports["c"], secrets.token_bytes(32)
    if case in ("oversized_after_auth", "forged_src_accel", "foreign_dst_accel",
                "silent_peer", "replayed_nonce"):
        stream, _ = await raw_auth(port, cfg, "b", "c", nonce)
        await wait_until(lambda: c.is_up("b"))
        if case == "replayed_nonce":
            await stream.aclose()
            await wait_until(lambda: not c.is_up("b"))
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await _hello(stream, AuthHello(cfg.uuid, "b", nonce))
        elif case == "oversized_after_auth":
            await stream.send_all(struct.pack("<IB", 0xFFFFFFFF, 0x10))
        elif case == "forged_src_accel":
            await stream.send_all(encode_frame(Msg(1, 0, 4, DW)))
        elif case == "foreign_dst_accel":
            await stream.send_all(encode_frame(Msg(1, 2, 1, DW)))
    else:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        if case == "wrong_key":
            await _hello(stream, AuthHello(cfg.uuid, "b", nonce))
            await read_frame(stream, FrameDecoder())
            await stream.send_all(encode_frame(AuthProof(b"\0" * 32)))
        elif case == "wrong_uuid":
            await _hello(stream, AuthHello(uuid.uuid4(), "b", nonce))
        elif case == "unknown_node":
            await _hello(stream, AuthHello(cfg.uuid, "zed", nonce))
        elif case == "own_name":
            await _hello(stream, AuthHello(cfg.uuid, "c", nonce))
        elif case == "frame_before_handshake":
            await stream.send_all(encode_frame(Msg(1, 2, 4, DW)))
        elif case == "garbage":
            await stream.send_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    await expect_closed(stream)
    await wait_until(lambda: bool(warnings(caplog)))
    # The well-behaved peer keeps exchanging messages both ways.
    await completed(a.send(0, 4, DW))
    await completed(c.send(5, 1, DW))
    assert pod.got["c"] == [(0, 4, DW)] and pod.got["a"] == [(5, 1, DW)]
    [line] = warnings(caplog)
    assert CASES[case] in line, line


# ---- data plane -------------------------------------------------------------------------------

def _memory_server(mem: bytearray) -> OnRequest:
    """An exporter's on_request over one flat buffer, answering LOADs with 64 KiB views (as
    BoMemory.read_views does) and refusing what lies outside it."""
    def on_request(peer: str, req: Load | Store) -> tuple[int, list[memoryview]]:
        n = req.length if isinstance(req, Load) else len(req.data)
        if req.npa_byte_addr + n > len(mem):
            return -errno.EFAULT, []
        view = memoryview(mem)[req.npa_byte_addr:req.npa_byte_addr + n]
        if isinstance(req, Load):
            return 0, [view[i:i + (64 << 10)] for i in range(0, n, 64 << 10)]
        view[:] = req.data
        return 0, []
    return on_request


def _tls_kw(name: str, ca: trustme.CA, cert_name: str | None = None) -> dict[str, object]:
    """Mutual TLS as daemon.tls_contexts sets it up, with a certificate for `cert_name`
    (default: the node's own name) from `ca`."""
    cert = ca.issue_cert("127.0.0.1", cert_name or name)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.verify_mode = ssl.CERT_REQUIRED
    client_ctx = ssl.create_default_context()
    client_ctx.check_hostname = False
    for ctx in (server_ctx, client_ctx):
        ca.configure_trust(ctx)
        cert.configure_cert(ctx)
    return {"ssl_context": server_ctx, "ssl_client_context": client_ctx}


@pytest.mark.parametrize("tls", [False, True], ids=["tcp", "tls"])
async def test_a_held_ack_leaves_without_waiting_for_other_traffic(pod: Pod, tls: bool) -> None:
    """§5.1: a MSG whose handler sends nothing back (no reply to share the ACK's write
    with) is still acknowledged at once, not at the next heartbeat: with heartbeats 4 s
    apart and the 0.3 s ACK timeout every send succeeds, over TLS too (where the writer
    task, not the held-ACK hook, writes: review5 found it waited for the next wake-up)."""
    ca = trustme.CA()
    kw: dict[str, object] = {"heartbeat_interval": 4.0, "heartbeat_timeout": 20.0}
    a = await pod.start("a", **(_tls_kw("a", ca) if tls else {}), **kw)
    await pod.start("c", **(_tls_kw("c", ca) if tls else {}), **kw)
    with trio.fail_after(WATCHDOG):
        await completed(a.send(0, 4, DW))  # (the link comes up)
        for _ in range(3):
            await trio.sleep(0.05)
            await completed(a.send(0, 4, DW))  # DrmError(ETIME) if the ACK waited for a heartbeat


@pytest.mark.parametrize("tls", [False, True], ids=["tcp", "tls"])
async def test_loads_and_stores_of_every_size_cross_concurrently(pod: Pod, tls: bool) -> None:
    """LOAD/STORE of 1 byte to 1 MiB, many in flight both ways: every byte arrives, whether
    a payload comes through the stream buffer or is received in place (plain TCP) or
    through TLS; failures are per request (EFAULT) and the link stays up."""
    ca = trustme.CA()
    mem_a, mem_b = bytearray(4 << 20), bytearray(4 << 20)
    a = await pod.start("a", on_request=_memory_server(mem_a), **(_tls_kw("a", ca) if tls else {}))
    b = await pod.start("b", on_request=_memory_server(mem_b), **(_tls_kw("b", ca) if tls else {}))
    await wait_until(lambda: a.is_up("b") and b.is_up("a"))
    pattern = bytes(range(256)) * (1 << 13)  # 2 MiB
    mem_b[:] = pattern * 2
    sizes = [1, 100, 4096, 65535, 65536, 65537, 300_000, 1 << 20]

    async def loads(link: FabricLink, src: int, dst: int, base: int) -> None:
        for n in sizes:
            got = await _completed(link.request(src, dst, base + n, n))
            assert got == (pattern * 2)[base + n:base + 2 * n]

    async def stores(link: FabricLink, src: int, dst: int, base: int) -> None:
        for i, n in enumerate(sizes):
            data = bytes([i + 1]) * n
            assert await _completed(link.request(src, dst, base, data)) == b""
            # the store was applied
            assert await _completed(link.request(src, dst, base, n)) == data

    async with trio.open_nursery() as nursery:
        for k in range(3):
            nursery.start_soon(loads, a, 0, 2, k * 7)
        nursery.start_soon(stores, a, 1, 3, 3 << 20)  # into b's memory, above the loads
        nursery.start_soon(stores, b, 2, 0, 0)  # and the other way, at the same time
    assert mem_b[:3 << 20] == (pattern * 2)[:3 << 20]
    with pytest.raises(DrmError) as e:
        await _completed(a.request(0, 2, (4 << 20) - 10, 11))
    assert e.value.errno == errno.EFAULT
    assert await _completed(a.request(0, 2, 0, 4)) == pattern[:4]  # the link survived the refusal


async def _completed(c: Completion[Loaded]) -> bytes | bytearray:
    """Wait (a test's poll) for what a request's Completion says: a large payload that
    was spliced into a pipe is in memory by then (drm/loaded.py's contract)."""
    await wait_until(lambda: c.done)
    return in_memory(c.result())


async def _send(link: FabricLink, src: int, dst: int, dwords: Dwords) -> None:
    """A send from a task of its own (a test's concurrent senders)."""
    await completed(link.send(src, dst, dwords))


def _failed_at_once(c: Completion[Loaded]) -> int:
    """The errno of a request that failed in the call that made it."""
    assert c.done
    with pytest.raises(DrmError) as e:
        c.result()
    return e.value.errno


async def test_requests_complete_by_callback(pod: Pod) -> None:
    """A request's Completion (the data plane without a task per request) gives the
    loaded bytes and the stored count, fails with the exporter's error (EFAULT refused by
    the exporter), with EFAULT when the link drops with requests in flight, and at once
    where nothing can be sent: no link up (policy 3), an accel that is not ours."""
    mem_b = bytearray(4 << 20)
    a = await pod.start("a")
    assert _failed_at_once(a.request(0, 2, 0, 4)) == errno.EFAULT  # b has not come up
    b = await pod.start("b", on_request=_memory_server(mem_b))
    await wait_until(lambda: a.is_up("b") and b.is_up("a"))
    assert _failed_at_once(a.request(2, 0, 0, 4)) == errno.EINVAL  # accel 2 is b's, not a's
    pattern = bytes(range(256)) * (1 << 12)  # 1 MiB
    mem_b[: 1 << 20] = pattern
    many = [a.request(0, 2, n, n) for n in (1, 4096, 65537, 1 << 19)]
    for n, c in zip((1, 4096, 65537, 1 << 19), many, strict=True):
        assert await _completed(c) == pattern[n:2 * n]
    assert await _completed(a.request(1, 3, 2 << 20, b"\x5a" * 4096)) == b""
    assert mem_b[2 << 20:(2 << 20) + 4096] == b"\x5a" * 4096
    with pytest.raises(DrmError) as e:
        await _completed(a.request(0, 2, (4 << 20) - 10, 11))
    assert e.value.errno == errno.EFAULT  # the exporter's -EFAULT
    assert await _completed(a.request(0, 2, 0, 4)) == pattern[:4]  # and the link is still up
    in_flight = [a.request(0, 2, 0, 1 << 20) for _ in range(8)]
    a._conns["b"].drop(conn_mod.LinkDown("test"))
    for c in in_flight:
        assert c is not None
        await wait_until(lambda c=c: c.done)
        try:
            assert c.result() == pattern  # answered before the drop
        except DrmError as err:
            assert err.errno == errno.EFAULT  # or failed with the link


async def test_a_request_gives_up_at_its_deadline(pod: Pod) -> None:
    """§5.1's ack timeout bounds a data-plane request as it does `request`'s: a peer that
    reads a LOAD and never answers fails it with EFAULT once ack_timeout (300 ms here) has
    passed, not before; its late DATA is then dropped and the link stays up."""
    a, stream, dec, out, listeners = await raw_server_b(pod)
    await stream.send_all(b"".join(encode_frame(f) for f in out))
    await wait_until(lambda: a.is_up("b"))
    start = trio.current_time()
    c = a.request(0, 2, 4096, 16)
    assert c is not None
    load = await read_frame(stream, dec)
    assert isinstance(load, Load) and load.length == 16
    await trio.sleep(0.2)
    assert not c.done  # still within its 300 ms
    await wait_until(lambda: c.done, timeout=2.0)
    assert trio.current_time() - start >= 0.3
    with pytest.raises(DrmError) as e:
        c.result()
    assert e.value.errno == errno.EFAULT
    await stream.send_all(encode_frame(Data(load.seq, 0, b"\0" * 16)))  # too late: dropped
    await trio.sleep(0.05)
    assert a.is_up("b")
    await stream.aclose()
    for lst in listeners:
        await lst.aclose()


def _congestion(link: FabricLink, peer: str) -> str:
    sock = link._conns[peer].sock
    assert sock is not None
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).rstrip(b"\0").decode()


async def test_links_use_the_pods_congestion_control(pod: Pod, caplog) -> None:
    """PodConfig.tcp_congestion is set on both ends of every link; one the kernel refuses
    is logged once and the links run with the system default."""
    want = "reno"  # always built in (the default, cubic, is a module on some kernels)
    cfg = dataclasses.replace(pod.cfg, tcp_congestion=want)
    a, b = await pod.start("a", cfg), await pod.start("b", cfg)
    await wait_until(lambda: a.is_up("b") and b.is_up("a"))
    assert _congestion(a, "b") == _congestion(b, "a") == want
    caplog.set_level(logging.WARNING, logger="ualinkd.fabric")
    bogus = dataclasses.replace(pod.cfg, tcp_congestion="no-such-algorithm")
    c = await pod.start("c", bogus)
    await wait_until(lambda: c.is_up("a") and c.is_up("b"))
    await completed(c.send(4, 0, DW))
    assert [w for w in warnings(caplog) if "congestion" in w] == [
        "fabric: TCP congestion control 'no-such-algorithm' refused (No such file or "
        "directory); links use the system default"]


# ---- TLS ------------------------------------------------------------------------------------

async def test_tls_links_carry_messages_and_refuse_plain_tcp(pod: Pod, caplog) -> None:
    caplog.set_level(logging.INFO, logger="ualinkd.fabric")
    ca = trustme.CA()
    a, c = await pod.start("a", **_tls_kw("a", ca)), await pod.start("c", **_tls_kw("c", ca))
    await completed(a.send(0, 4, DW))
    await completed(c.send(4, 0, DW))
    assert pod.got["c"] == [(0, 4, DW)] and pod.got["a"] == [(4, 0, DW)]
    stream = await trio.open_tcp_stream("127.0.0.1", pod.ports["c"])
    await _hello(stream, AuthHello(pod.cfg.uuid, "b", secrets.token_bytes(32)))
    await expect_closed(stream)
    await wait_until(lambda: bool(warnings(caplog)))
    [line] = warnings(caplog)
    assert "refused connection" in line
    assert "SSL" in line.rpartition(": ")[2] or "SSL" in line, line  # item 9: the reason


async def test_a_load_answer_is_the_memory_when_it_was_served(pod: Pod) -> None:
    """Policy 10 / issue "GPU loads and stores": LOADs pipelined ahead of a STORE to the same
    bytes are answered with what the memory held when each was served, never with the later
    STORE's bytes or a mix, even though answers are sent from views of the memory and the
    peer reads nothing until everything was served (its socket backs up)."""
    mib = 1 << 20
    mem = BoMemory(4 * mib)
    mem.write(0, b"\x11" * mib)

    def on_request(peer: str, req: Load | Store) -> tuple[int, list[memoryview]]:
        if isinstance(req, Load):
            return 0, mem.read_views(req.npa_byte_addr, req.length)
        mem.write(req.npa_byte_addr, req.data)
        return 0, []

    cfg = dataclasses.replace(pod.cfg, send_ack_timeout_ms=5000)
    await pod.start("b", cfg, on_request=on_request)
    stream, dec = await raw_auth(pod.ports["b"], cfg, "a", "b")
    n = 16
    frames = [Load(i + 1, 0, 2, 0, mib) for i in range(n)] + [Store(n + 1, 0, 2, 0,
                                                                      b"\x22" * mib)]
    for f in frames:
        await stream.send_all(encode_frame(f))
    await trio.sleep(0.3)  # b serves all of it while nothing is read here
    got: dict[int, bytes] = {}
    while len(got) < n + 1:
        f = await read_frame(stream, dec)
        if isinstance(f, Data):
            got[f.seq] = bytes(f.data)
    assert all(got[s] == b"\x11" * mib for s in range(1, n + 1))
    assert mem.read(0, 4) == b"\x22" * 4


async def test_frames_that_arrive_with_the_handshake_are_delivered(pod: Pod) -> None:
    """§5.1: a MSG the peer sends in the same write as its AUTH_OK is delivered at once, not
    when the next bytes happen to arrive."""
    a, stream, dec, out, listeners = await raw_server_b(pod)
    await stream.send_all(encode_frame(out[0]) + encode_frame(Msg(1, 2, 0, DW)))
    await wait_until(lambda: bool(pod.got.get("a")), timeout=0.5)  # no heartbeat needed
    assert pod.got["a"] == [(2, 0, DW)]
    await stream.aclose()
    for lst in listeners:
        await lst.aclose()


# ---- identity and pre-authentication limits (issue 10 items 3, 8, 9) ---------------------

def _round_trips(link: FabricLink, src: int, dst: int, n: int) -> Callable[[], object]:
    async def run() -> None:
        for i in range(n):
            await completed(link.send(src, dst, (3, i, 0, 0)))
            await trio.sleep(0.005)
    return run


async def test_an_impostor_with_another_nodes_keys_is_refused(pod: Pod, caplog) -> None:
    """Item 8: a holds only its own link keys (node_config); claiming to be b to c with
    either of them fails the proof, and c's real link to b never goes down."""
    caplog.set_level(logging.INFO, logger="ualinkd.fabric")
    a, b, c = [await pod.start(n) for n in "abc"]
    await wait_until(lambda: c.is_up("a") and c.is_up("b"))
    stolen = auth.node_config(pod.cfg, "a")
    for key in auth.node_keys(stolen, "a").values():
        stream = await trio.open_tcp_stream("127.0.0.1", pod.ports["c"])
        hs = auth.ClientHandshake(stolen, "b", "c", now=trio.current_time(), key=key)
        await stream.send_all(encode_frame(hs.initial_frames()[0]))
        challenge = await read_frame(stream, FrameDecoder())
        with pytest.raises(auth.AuthError, match="failed to prove"):
            hs.receive_frame(challenge, trio.current_time())
        await stream.send_all(encode_frame(AuthProof(b"\0" * 32)))  # try its luck anyway
        await expect_closed(stream)
    await completed(b.send(2, 4, DW))
    await completed(c.send(4, 2, DW))
    assert pod.got["c"] == [(2, 4, DW)] and pod.got["b"] == [(4, 2, DW)]
    assert ("c", "b", False) not in pod.states
    lines = warnings(caplog)
    assert len(lines) == 1 and "refused connection from b (127.0.0.1:" in lines[0]
    assert "'b' failed to prove the key of our link" in lines[0]


async def test_a_second_connection_does_not_replace_a_live_link(pod: Pod, caplog) -> None:
    """Item 8: connections that authenticate as b (with the right key) while c's link to b
    is alive are refused after a liveness probe of the old link; round trips over it keep
    succeeding the whole time and it never flaps."""
    caplog.set_level(logging.INFO, logger="ualinkd.fabric")
    b, c = await pod.start("b"), await pod.start("c")
    await wait_until(lambda: c.is_up("b"))
    async with trio.open_nursery() as n:
        n.start_soon(_round_trips(b, 2, 4, 40))
        n.start_soon(_round_trips(c, 5, 3, 40))
        for _ in range(5):
            stream, _dec = await raw_auth(pod.ports["c"], pod.cfg, "b", "c")
            await expect_closed(stream, timeout=6)
    assert len(pod.got["c"]) == len(pod.got["b"]) == 40
    assert [s for s in pod.states if s[1] == "b"] == [("c", "b", True)]
    refused = [w for w in warnings(caplog) if "refused" in w]
    assert refused and "a live link to b exists" in refused[0]


async def test_a_silent_link_gives_way_to_a_new_connection(pod: Pod) -> None:
    """Item 8: a link whose peer has gone silent (half-open) does not lock its peer out: the
    newcomer takes over once the old link fails its liveness probe, and carries messages."""
    c = await pod.start("c", heartbeat_interval=0.05, heartbeat_timeout=0.5)
    old, _ = await raw_auth(pod.ports["c"], pod.cfg, "b", "c")  # never reads nor writes
    await wait_until(lambda: c.is_up("b"))
    new, dec = await raw_auth(pod.ports["c"], pod.cfg, "b", "c")
    await expect_closed(old)
    with trio.fail_after(2):
        async with trio.open_nursery() as n:
            n.start_soon(_send, c, 4, 2, DW)
            while not isinstance(f := await read_frame(new, dec), Msg):
                pass
            await new.send_all(encode_frame(Ack(f.seq, 0)))
    assert (f.src_accel, f.dst_accel, f.dwords) == (4, 2, DW)
    await new.aclose()


async def test_tls_a_valid_certificate_of_another_node_is_refused(pod: Pod, caplog) -> None:
    """Item 8: with mutual TLS, a's own valid certificate does not admit a connection that
    claims to be b, even with the right link key; b's certificate does."""
    caplog.set_level(logging.INFO, logger="ualinkd.fabric")
    ca = trustme.CA()
    await pod.start("c", **_tls_kw("c", ca))
    a_cert = _tls_kw("a", ca)["ssl_client_context"]
    stream = await trio.open_tcp_stream("127.0.0.1", pod.ports["c"])
    tls = trio.SSLStream(stream, a_cert, server_hostname="127.0.0.1")  # type: ignore[arg-type]
    await tls.do_handshake()
    await tls.send_all(encode_frame(AuthHello(pod.cfg.uuid, "b", secrets.token_bytes(32))))
    await expect_closed(tls)
    await wait_until(lambda: bool(warnings(caplog)))
    [line] = warnings(caplog)
    assert "claims to be 'b' but its TLS certificate is for" in line and "'a'" not in line
    b_cert = _tls_kw("b", ca)["ssl_client_context"]
    ok, _ = await raw_auth(pod.ports["c"], pod.cfg, "b", "c",
                           ssl_context=b_cert)  # type: ignore[arg-type]
    await ok.aclose()


async def _idle(host: str, port: int) -> trio.SocketStream:
    sock = trio.socket.socket()
    await sock.bind((host, 0))
    await sock.connect(("127.0.0.1", port))
    return trio.SocketStream(sock)


async def _closed_by_peer(stream: trio.SocketStream) -> bool:
    with trio.move_on_after(1):
        try:
            return await stream.receive_some(1) == b""
        except trio.BrokenResourceError:
            return True
    return False


async def test_pending_handshakes_are_capped_in_all_and_per_address(
        pod: Pod, caplog, monkeypatch) -> None:
    """Item 3: at most `max_pending` unauthenticated connections (5 in all, 3 from one
    address here); more are closed at once, one log line per cause plus one with the count
    of the rest; the established link keeps working, and the slots come back."""
    caplog.set_level(logging.INFO, logger="ualinkd.fabric")
    monkeypatch.setattr(admission, "REFUSAL_LOG_INTERVAL", 0.2)
    a = await pod.start("a")
    c = await pod.start("c", max_pending=(5, 3), handshake_timeout=5.0)
    await wait_until(lambda: c.is_up("a"))
    held = [await _idle("127.0.0.2", pod.ports["c"]) for _ in range(3)]
    await wait_until(lambda: c.pending_handshakes == 3)
    per_address = await _idle("127.0.0.2", pod.ports["c"])
    assert await _closed_by_peer(per_address)
    held += [await _idle("127.0.0.3", pod.ports["c"]) for _ in range(2)]
    await wait_until(lambda: c.pending_handshakes == 5)
    in_all = [await _idle(f"127.0.0.{4 + i}", pod.ports["c"]) for i in range(20)]
    for s in [per_address, *in_all]:
        assert await _closed_by_peer(s)
        await s.aclose()
    await completed(a.send(0, 4, DW))
    assert pod.got["c"] == [(0, 4, DW)]
    await wait_until(lambda: len(warnings(caplog)) >= 3)
    lines = warnings(caplog)
    assert "3 handshakes in progress from 127.0.0.2 (the limit per address)" in lines[0]
    assert "5 handshakes in progress (the limit)" in lines[1]
    assert "refused 19 more connections like that within 0 s, from 19 addresses" in lines[2]
    assert len(lines) == 3
    for s in held:
        await s.aclose()
    await wait_until(lambda: c.pending_handshakes == 0)
    await pod.start("b")
    await wait_until(lambda: c.is_up("b"))


async def _impostor(pod: Pod, listener: trio.SocketListener) -> None:
    """Node c's handshake answering every dial that reaches `listener` (b's address)."""
    while True:
        stream = await listener.accept()
        hs = auth.ServerHandshake(pod.cfg, "c", now=trio.current_time(),
                                  nonces=auth.NonceCache())
        with contextlib.suppress(Exception):
            out = hs.receive_frame(await read_frame(stream, FrameDecoder()),
                                   trio.current_time())
            await stream.send_all(encode_frame(out[0]))
            await stream.receive_some(100)
        await stream.aclose()


async def test_a_dial_failure_is_a_warning_when_its_kind_changes(pod: Pod, caplog,
                                                                 monkeypatch) -> None:
    """Item 9: a dialer logs at WARNING the first lasting failure and each change of its kind
    (the peer refuses connections, then an impostor answers on its address), each repeat at
    DEBUG. (DIAL_WARN_AFTER 0: every failure counts as lasting here.)"""
    import ualinkd.fabric.dialer as dialer_module

    monkeypatch.setattr(dialer_module, "DIAL_WARN_AFTER", 0.0)
    caplog.set_level(logging.DEBUG, logger="ualinkd.fabric")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    a = await pod.start("a")
    a.set_peer_address("b", f"127.0.0.1:{port}")

    def dial_failures() -> list[logging.LogRecord]:
        return [r for r in caplog.records if "cannot link to b" in r.getMessage()]

    await wait_until(lambda: len(dial_failures()) >= 3)
    listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")

    async with trio.open_nursery() as n:
        n.start_soon(_impostor, pod, listeners[0])
        await wait_until(lambda: sum("'c' answered" in r.getMessage()
                                     for r in dial_failures()) >= 3)
        n.cancel_scope.cancel()
    await listeners[0].aclose()
    loud = [r.getMessage() for r in dial_failures() if r.levelno >= logging.WARNING]
    assert len(loud) == 2, loud
    assert "Connection refused" in loud[0]
    assert "dialed node 'b' but 'c' answered" in loud[1]


async def test_an_impostor_on_a_restarting_peers_port_is_a_warning_at_once(
        pod: Pod, caplog) -> None:
    """Issue 29 item 12: the dial's grace (DIAL_WARN_AFTER, 10 s, DEBUG meanwhile) is for
    refused and timed-out connections — a peer restarting. Something on the peer's port
    that fails the handshake is no restarting peer: a WARNING at once, once per kind (each
    repeat DEBUG). A listener that accepts and never answers (a handshake timeout) keeps
    the grace."""
    caplog.set_level(logging.DEBUG, logger="ualinkd.fabric")
    with socket.socket() as s:  # a port nobody listens on yet
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    a = await pod.start("a")
    a.set_peer_address("b", f"127.0.0.1:{port}")

    def dial_failures() -> list[logging.LogRecord]:
        return [r for r in caplog.records if "cannot link to b" in r.getMessage()]

    await wait_until(lambda: len(dial_failures()) >= 2)  # refused
    listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")

    async def silent() -> None:  # accepts, says nothing: a handshake that times out (0.5 s)
        while True:
            stream = await listeners[0].accept()
            pod.nursery.start_soon(_hold, stream)

    async def _hold(stream: trio.SocketStream) -> None:
        with contextlib.suppress(Exception):
            await stream.receive_some(100)
            await trio.sleep(2)
        await stream.aclose()

    async with trio.open_nursery() as n:
        n.start_soon(silent)
        await wait_until(lambda: any("not finished" in r.getMessage()
                                     for r in dial_failures()), timeout=5)
        n.cancel_scope.cancel()
    assert all(r.levelno == logging.DEBUG for r in dial_failures()), [
        (r.levelname, r.getMessage()) for r in dial_failures()]
    started = trio.current_time()
    async with trio.open_nursery() as n:
        n.start_soon(_impostor, pod, listeners[0])
        await wait_until(lambda: sum("'c' answered" in r.getMessage()
                                     for r in dial_failures()) >= 3)
        n.cancel_scope.cancel()
    await listeners[0].aclose()
    assert trio.current_time() - started < 5  # within the 10 s grace
    loud = [r.getMessage() for r in dial_failures() if r.levelno >= logging.WARNING]
    print(f"{len(loud)} WARNING(s) for {sum('answered' in r.getMessage() for r in dial_failures())}"
          f" impostor answers in {trio.current_time() - started:.1f} s")
    assert len(loud) == 1 and "dialed node 'b' but 'c' answered" in loud[0], loud


async def test_a_peer_that_starts_within_the_grace_is_no_warning(pod: Pod, caplog) -> None:
    """Issue 11: a pod's nodes start in any order, so refused dials in the first seconds are
    DEBUG, and the first link to a peer too (INFO is for a link that comes back)."""
    caplog.set_level(logging.DEBUG, logger="ualinkd.fabric")
    with socket.socket() as sk:  # where b is not listening yet
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    a = await pod.start("a")
    a.set_peer_address("b", f"127.0.0.1:{port}")
    await trio.sleep(0.3)  # a dials b, which is not there yet: refused, several times
    b = await pod.start("b")
    await wait_until(lambda: a.is_up("b") and b.is_up("a"))
    refused = [r for r in caplog.records if "cannot link to b" in r.getMessage()]
    assert refused and all(r.levelno == logging.DEBUG for r in refused)
    ups = [r for r in caplog.records if "link to" in r.getMessage() and " up" in r.getMessage()]
    assert ups and all(r.levelno == logging.DEBUG for r in ups)


async def test_an_ack_shares_its_write_with_the_reply_its_message_caused(
        pod: Pod, monkeypatch: pytest.MonkeyPatch) -> None:
    """Spec §5.1's ACK, sent in order ahead of the reply the message causes: a receive ring's
    task answers in a later scheduler step, and the link's deferred flush (flush_soon) puts
    the ACK and that reply in one write (one wake-up of the peer, not two)."""
    writes: list[tuple[int, bytes]] = []
    real_writev = conn_mod.os.writev

    def recording_writev(fd: int, bufs: list[bytes]) -> int:
        n = real_writev(fd, bufs)
        writes.append((fd, b"".join(bytes(b) for b in bufs)[:n]))
        return n

    tx, rx = trio.open_memory_channel[tuple[int, int, tuple[int, ...]]](16)
    b_got: list[tuple[int, int, tuple[int, ...]]] = []

    def ring(src: int, dst: int, dwords: tuple[int, ...]) -> None:
        b_got.append((src, dst, dwords))
        tx.send_nowait((src, dst, dwords))

    def frames(data: bytes) -> list[Frame]:
        dec, out = FrameDecoder(), []
        dec.receive_data(data)
        while (f := dec.next_frame()) is not NEED_DATA:
            out.append(f)
        return out

    monkeypatch.setattr(conn_mod.os, "writev", recording_writev)
    a = await pod.start("a")
    # b's heartbeat: one PING at link-up (a flush of its own), then none during the test.
    b = await pod.start("b", on_message=ring, heartbeat_interval=60.0, heartbeat_timeout=120.0)
    await wait_until(lambda: a.is_up("b") and b.is_up("a"))
    b_fd = b._conns["a"].fd
    await wait_until(lambda: any(fd == b_fd and any(isinstance(f, Ping) for f in frames(d))
                                 for fd, d in writes))
    writes.clear()
    reply = (6, 7, 8, 9)

    async def answer() -> None:
        async for src, dst, _ in rx:  # a ring task, as the agent's
            await completed(b.send_batch(dst, src, [reply]))

    pod.nursery.start_soon(answer)
    with trio.fail_after(5):
        await completed(a.send(0, 2, DW))
        await wait_until(lambda: (0, 2, reply) in pod.got["a"] or (2, 0, reply) in pod.got["a"])
    assert b_got == [(0, 2, DW)]
    frames_per_write = []
    for fd, data in writes:
        # Heartbeat PINGs and PONGs go out with whatever is written.
        kinds = [type(f).__name__ for f in frames(data) if isinstance(f, Ack | Msg)]
        if fd == b_fd and kinds:
            frames_per_write.append(kinds)
    assert frames_per_write == [["Ack", "Msg"]]


# ---- heartbeats, on trio's MockClock (virtual time: exact, and no real waiting) ---------------

@contextlib.contextmanager
def real_time_watchdog(seconds: float):  # type: ignore[no-untyped-def]
    """Fails the test after `seconds` of real time: on a MockClock, trio.fail_after waits
    for virtual time, which passes only when the test jumps it."""
    token = trio.lowlevel.current_trio_token()
    scope = trio.CancelScope()

    def expire() -> None:
        with contextlib.suppress(trio.RunFinishedError):
            trio.from_thread.run_sync(scope.cancel, trio_token=token)

    timer = threading.Timer(seconds, expire)
    timer.start()
    try:
        with scope:
            yield
    finally:
        timer.cancel()
    if scope.cancelled_caught:
        pytest.fail(f"watchdog: not done after {seconds} s of real time")


async def settle() -> None:
    """Until every task waits (for time or I/O), frames written on 127.0.0.1 taken in."""
    for _ in range(3):
        await trio.testing.wait_all_tasks_blocked()


async def advance(clock: trio.testing.MockClock, seconds: float, step: float = 0.25) -> None:
    """Virtual time passes by `step`s, each with everything it wakes done."""
    end = trio.current_time() + seconds
    while trio.current_time() < end:
        clock.jump(min(step, end - trio.current_time()))
        await settle()


class RawPeer:
    """Node b, hand-driven: authenticated to c, it keeps every frame c sends with the
    (virtual) time it came, ACKs each MSG, and answers PINGs only if `pong`."""

    def __init__(self, stream: trio.abc.Stream, dec: FrameDecoder, pong: bool) -> None:
        self.stream, self.dec, self.pong = stream, dec, pong
        self.frames: list[tuple[float, Frame]] = []
        self.closed = False

    def pings(self) -> list[tuple[float, Ping]]:
        return [(t, f) for t, f in self.frames if isinstance(f, Ping)]

    async def run(self) -> None:
        try:
            while True:
                while (f := self.dec.next_frame()) is NEED_DATA:
                    data = await self.stream.receive_some(4096)
                    if not data:
                        self.closed = True
                        return
                    self.dec.receive_data(data)
                self.frames.append((trio.current_time(), f))  # type: ignore[arg-type]
                if isinstance(f, Msg):
                    await self.stream.send_all(encode_frame(Ack(f.seq, 0)))
                elif isinstance(f, Ping) and self.pong and f.token != HEARTBEAT:
                    await self.stream.send_all(encode_frame(Pong(f.token)))
        except (trio.BrokenResourceError, trio.ClosedResourceError):  # (the latter: ours)
            self.closed = True


async def test_a_busy_link_sends_no_heartbeat_pings(
        pod: Pod, mock_clock: trio.testing.MockClock) -> None:
    """A link that carries traffic needs no heartbeat: what c sends proves it alive to b as
    well as a PING would. c PINGs once at link-up (its link clock, which b stamps its
    requests from), then, while it sends every 0.25 s, only every 10 intervals (the clock
    again); idle, about every interval. Heartbeat PINGs (token 0) get no PONG; others do."""
    c = await pod.start("c")  # the daemon's heartbeat: interval 1 s, timeout 5 s
    with real_time_watchdog(30):
        stream, dec = await raw_auth(pod.ports["c"], pod.cfg, "b", "c")
        raw = RawPeer(stream, dec, pong=True)
        pod.nursery.start_soon(raw.run)
        await settle()
        assert c.is_up("b")
        [(up, first)] = raw.pings()
        assert first.token == HEARTBEAT
        await stream.send_all(encode_frame(Ping(HEARTBEAT, 1)) + encode_frame(Ping(7, 1)))
        await settle()
        assert [f for _, f in raw.frames if isinstance(f, Pong)] == [Pong(7)]
        while trio.current_time() < up + 9.5:
            await completed(c.send(4, 2, DW))
            await advance(mock_clock, 0.25)
        assert len(raw.pings()) == 1, raw.pings()  # every interval, before
        while trio.current_time() < up + 10.5:
            await completed(c.send(4, 2, DW))
            await advance(mock_clock, 0.25)
        [_, (refresh, again)] = raw.pings()
        assert again.token == HEARTBEAT and refresh - up == 10.0
        quiet = trio.current_time()
        await advance(mock_clock, 4.0)  # idle
        idle = [t for t, _ in raw.pings()[2:]]
        assert len(idle) == 4 and idle[0] - quiet <= 1.125, (quiet, idle)
        assert all(0.75 <= t1 - t0 <= 1.25 for t0, t1 in itertools.pairwise(idle))
        assert c.is_up("b") and not raw.closed
    await stream.aclose()


@pytest.mark.parametrize("answers", [False, True], ids=["silent", "answers_pings"])
async def test_a_silent_peer_is_probed_then_dropped_after_the_timeout(
        pod: Pod, mock_clock: trio.testing.MockClock, caplog, answers: bool) -> None:
    """A peer that sends nothing is still dropped once nothing came from it for the
    heartbeat timeout (5 s), exactly then. After 2 intervals of silence its PINGs ask for a
    PONG, once an interval: a peer with sparser heartbeats of its own (another interval) that
    answers them is alive, and stays."""
    caplog.set_level(logging.INFO, logger="ualinkd.fabric")
    c = await pod.start("c")
    with real_time_watchdog(30):
        stream, dec = await raw_auth(pod.ports["c"], pod.cfg, "b", "c")
        raw = RawPeer(stream, dec, pong=answers)
        pod.nursery.start_soon(raw.run)
        await settle()
        up = trio.current_time()
        assert c.is_up("b")
        await advance(mock_clock, 4.75)
        assert c.is_up("b")
        await advance(mock_clock, 0.25 if not answers else 7.0)
        assert c.is_up("b") == answers and raw.closed != answers
        if not answers:
            assert trio.current_time() - up == 5.0
            assert "nothing received for 5.0 s" in warnings(caplog)[-1]
        probes = [t - up for t, f in raw.pings() if f.token != HEARTBEAT]
        heartbeats = [t - up for t, f in raw.pings() if f.token == HEARTBEAT]
        assert heartbeats[0] == 0.0 and probes and min(probes) > 2.0
        if not answers:  # (an answer resets the silence: heartbeats again, for 2 s)
            assert max(heartbeats) <= 2.0
            assert all(t1 - t0 >= 1.0 for t0, t1 in itertools.pairwise(probes))
    await stream.aclose()


# ---- batches (send_batch: a burst of sends, one flush, one ACK waiter) ---------------------

async def batch_outcomes(link: FabricLink, src: int, dst: int, messages: list[Dwords]
                         ) -> list[tuple[DrmError | None, float]]:
    """`send_batch`'s outcomes (its Completion, polled: no task of ours waits on it)."""
    c = link.send_batch(src, dst, messages)
    await wait_until(lambda: c.done, timeout=10)
    return c.result()


async def test_a_batch_has_each_messages_outcome_as_single_sends_would(pod: Pod) -> None:
    """Spec §5.1 per message of a batch: the MSGs leave in order; each one's ACK is its own
    outcome (status 0: accepted, with the time it came; a refusal: ECOMM); one the peer
    never acknowledges fails with ETIME at ack_timeout (0.3 s) from the queueing, and its
    late ACK is dropped without harm, as for a single send that gave up."""
    c = await pod.start("c")
    stream, dec = await raw_auth(pod.ports["c"], pod.cfg, "a", "c")
    await wait_until(lambda: c.is_up("a"))
    batch = [(3, i << 10, 0, 0) for i in range(3)]
    got: list[Msg] = []

    async def firmware() -> None:
        for _ in batch:
            got.append(await read_frame(stream, dec))  # type: ignore[arg-type]
        await stream.send_all(encode_frame(Ack(got[0].seq, 0))
                              + encode_frame(Ack(got[1].seq, -5)))

    start = trio.current_time()
    async with trio.open_nursery() as n:
        n.start_soon(firmware)
        outcomes = await batch_outcomes(c, 4, 0, batch)
    assert [(m.src_accel, m.dst_accel, m.dwords) for m in got] == [(4, 0, dw) for dw in batch]
    assert [m.seq for m in got] == sorted({m.seq for m in got})
    (e0, t0), (e1, t1), (e2, t2) = outcomes
    assert e0 is None and start <= t0 < start + 0.3
    assert e1 is not None and e1.errno == errno.ECOMM and t0 <= t1
    assert e2 is not None and e2.errno == errno.ETIME and t2 >= start + 0.3
    await stream.send_all(encode_frame(Ack(got[2].seq, 0)))  # late: dropped, link stays
    with trio.fail_after(0.1):
        assert await completed(c.send_batch(4, 0, [])) == []  # an empty batch is nothing, at once

    async def firmware_again() -> None:
        m = await read_frame(stream, dec)
        await stream.send_all(encode_frame(Ack(m.seq, 0)))  # type: ignore[union-attr]

    async with trio.open_nursery() as n:
        n.start_soon(firmware_again)
        (outcome,) = await batch_outcomes(c, 4, 0, [DW])
    assert outcome[0] is None and c.is_up("a")
    await stream.aclose()


async def test_a_batch_fails_at_once_when_the_link_drops(pod: Pod) -> None:
    """A link that drops before the ACKs came fails every unacknowledged message of the
    batch with ETIME then, not at the ACK timeout (as `send` does: the peer may never have
    taken them); its Completion is completed once, by the teardown."""
    c = await pod.start("c", ack_timeout=5.0)
    stream, dec = await raw_auth(pod.ports["c"], pod.cfg, "a", "c")
    await wait_until(lambda: c.is_up("a"))

    async def firmware() -> None:
        m = await read_frame(stream, dec)
        await stream.send_all(encode_frame(Ack(m.seq, 0)))  # type: ignore[union-attr]
        await read_frame(stream, dec)
        await stream.aclose()  # the second one is never acknowledged

    start = trio.current_time()
    async with trio.open_nursery() as n:
        n.start_soon(firmware)
        with trio.fail_after(3):
            (e0, _), (e1, t1) = await batch_outcomes(c, 4, 0, [DW, DW])
    assert e0 is None
    assert e1 is not None and e1.errno == errno.ETIME and "dropped" in e1.strerror
    assert t1 - start < 3


async def test_a_batch_waits_for_its_link_like_single_sends(pod: Pod) -> None:
    """A batch queued while the link is down waits for it up to the ACK timeout (then is
    sent whole, in order); without the link it fails with ETIME; an accel no node owns is
    EINVAL, for every message."""
    a = await pod.start("a", ack_timeout=2.0)
    async with trio.open_nursery() as n:
        results: list[object] = []

        async def batch() -> None:
            results.extend(await completed(a.send_batch(0, 2, [(3, i, 0, 0) for i in range(5)])))

        n.start_soon(batch)
        await trio.sleep(0.05)
        await pod.start("b")
    assert [e for e, _ in results] == [None] * 5  # type: ignore[misc]
    assert pod.got["b"] == [(0, 2, (3, i, 0, 0)) for i in range(5)]
    outcomes = await completed(a.send_batch(0, 77, [DW, DW]))
    assert [e.errno for e, _ in outcomes if e is not None] == [errno.EINVAL] * 2
    start = trio.current_time()
    outcomes = await completed(a.send_batch(0, 4, [DW, DW]))  # c never started
    assert [e.errno for e, _ in outcomes if e is not None] == [errno.ETIME] * 2
    assert trio.current_time() - start >= 2.0
