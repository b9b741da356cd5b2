"""Data channels over real sockets on 127.0.0.1: each link's second, data-only connection,
authenticated as the link is (auth.py, channel 1) and handed over to the node's DataChannels
(the C data plane's seam; here a recorder that keeps each socket it is given), closed with
its link; refused without a live link, with a wrong key, over TLS, or with bytes sent early."""

from __future__ import annotations

import itertools
import logging
import os
import select
import socket
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
import trio
import trustme
from test_fabric_link import Pod, _tls_kw, expect_closed, make_pod, raw_auth, read_frame, warnings

from ualinkd.fabric import auth
from ualinkd.fabric import conn as conn_mod
from ualinkd.fabric.link import FabricLink
from ualinkd.fabric.waiting import completed
from ualinkd.fabric.wire import AuthOk, AuthProof, Channel, FrameDecoder, Ping, encode_frame

DW = (3, 0x1000, 0, 0)
WATCHDOG = 20.0
_handles = itertools.count(1)


class Recorder:
    """DataChannels that keeps the socket of every open() until its close(); `refuse`: it
    closes each fd and returns None, as a data plane that cannot take one does."""

    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse
        self.live: dict[int, tuple[str, socket.socket, frozenset[int]]] = {}
        self.opened: list[tuple[int, str, frozenset[int]]] = []
        self.closed: list[int] = []
        self.discarded = False
        self.on_broken: Callable[[int], None] | None = None  # (the link sets it)
        self.full = False  # has_room says no, as a data plane with every channel in use

    def has_room(self, dialing: int = 0) -> bool:
        return not self.full

    def clock(self, handle: int, origin: float, peer_clock: tuple[int, float] | None) -> None:
        pass  # (no STOREs here)

    def open(self, peer: str, fd: int, peer_accels: frozenset[int]) -> int | None:
        if self.refuse:
            os.close(fd)
            return None
        handle = next(_handles)
        sock = socket.socket(fileno=fd)
        sock.settimeout(2.0)  # (a test that waits for bytes fails instead of hanging)
        self.live[handle] = (peer, sock, peer_accels)
        self.opened.append((handle, peer, peer_accels))
        return handle

    def close(self, handle: int) -> None:
        if self.discarded:  # (the test is over; its links are still stopping)
            return
        _, sock, _ = self.live.pop(handle)  # KeyError: never opened, or closed twice
        sock.close()
        self.closed.append(handle)

    def break_channel(self, peer: str) -> int:
        """What the data plane does with a channel it finds broken: closes and forgets it,
        then tells the link (on_broken). Returns its handle."""
        [handle] = [h for h, (p, _, _) in self.live.items() if p == peer]
        _, sock, _ = self.live.pop(handle)
        sock.close()
        assert self.on_broken is not None
        self.on_broken(handle)
        return handle

    def sock(self, peer: str) -> socket.socket:
        [s] = [s for p, s, _ in self.live.values() if p == peer]
        return s

    def peers(self) -> list[str]:
        return sorted(p for p, _, _ in self.live.values())

    def discard(self) -> None:
        self.discarded = True
        for _, sock, _ in self.live.values():
            sock.close()
        self.live.clear()


@pytest.fixture
def recorders() -> Iterator[dict[str, Recorder]]:
    """One Recorder per node name; whatever a test leaves open is closed after it."""
    made: dict[str, Recorder] = {}
    yield made
    for r in made.values():
        r.discard()


@pytest.fixture
async def pod() -> AsyncIterator[Pod]:
    async with trio.open_nursery() as nursery:
        yield Pod(make_pod(), nursery)
        nursery.cancel_scope.cancel()


async def start(pod: Pod, recorders: dict[str, Recorder], name: str, refuse: bool = False,
                **kw: object) -> FabricLink:
    rec = recorders[name] = Recorder(refuse)
    return await pod.start(name, data_channels=rec, **kw)


async def wait_until(pred, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    with trio.fail_after(timeout):
        while not pred():
            await trio.sleep(0.005)


def assert_ends_of_one_connection(x: socket.socket, y: socket.socket) -> None:
    """Bytes written on either come out of the other; nothing else was there first."""
    assert x.getsockname() == y.getpeername() and y.getsockname() == x.getpeername()
    # Python sent nothing on either past the handshake (no frame, no heartbeat):
    assert select.select([x, y], [], [], 0)[0] == []
    x.sendall(b"load me")
    assert y.recv(64) == b"load me"
    y.sendall(b"data")
    assert x.recv(64) == b"data"


async def data_hello(port: int, cfg, name: str, peer: str, key: bytes | None = None,
                     ssl_context=None, extra: bytes = b"",
                     link: auth.ClientHandshake | None = None
                     ) -> tuple[trio.abc.Stream, bool]:  # type: ignore[no-untyped-def]
    """A hand-driven data channel that authenticates as `name` (`extra` sent with its
    AUTH_PROOF), as the end of the hand-driven `link` (its nonce bound to that link's
    handshake) or, without one, as a party that only has the key: its stream, and whether
    it was told AUTH_OK (else the server closed it)."""
    stream: trio.abc.Stream = await trio.open_tcp_stream("127.0.0.1", port)
    if ssl_context is not None:
        stream = trio.SSLStream(stream, ssl_context, server_hostname="127.0.0.1")
        await stream.do_handshake()
    hs = auth.ClientHandshake(cfg, name, peer, now=trio.current_time(), key=key,
                              channel=Channel.DATA, nonce=None if link is None
                              else auth.bound_nonce(link.channel_key()))
    dec = FrameDecoder()
    await stream.send_all(encode_frame(hs.initial_frames()[0]))
    try:
        challenge = await read_frame(stream, dec)
        [proof] = hs.receive_frame(challenge, trio.current_time())
    except auth.AuthError:  # (a wrong key: the server's mac does not verify; prove anyway)
        proof = AuthProof(b"\0" * 32)
    await stream.send_all(encode_frame(proof) + extra)
    try:
        ok = await read_frame(stream, dec)
    except (AssertionError, trio.BrokenResourceError):  # closed
        return stream, False
    assert ok == AuthOk()
    return stream, True


# ---- the handover -----------------------------------------------------------------------------

async def test_each_link_gets_one_data_channel_whose_two_ends_meet(pod: Pod, recorders) -> None:
    """Every link of a three-node pod: each side's DataChannels gets exactly one open() for
    the other node, with that node's accels, and the two fds are the two ends of one TCP
    connection, on which Python sent nothing (not past the handshake, not a heartbeat)."""
    with trio.fail_after(WATCHDOG):
        links = {n: await start(pod, recorders, n, heartbeat_interval=0.05) for n in "abc"}
        await wait_until(lambda: all(len(r.opened) == 2 for r in recorders.values()))
        await trio.sleep(0.3)  # six heartbeat intervals: nothing more is opened, nor sent
        accels = {"a": frozenset({0, 1}), "b": frozenset({2, 3}), "c": frozenset({4, 5})}
        for n, r in recorders.items():
            assert sorted((p, acc) for _, p, acc in r.opened) == sorted(
                (p, accels[p]) for p in "abc" if p != n)
            assert r.closed == []
        for x, y in itertools.combinations("abc", 2):
            assert_ends_of_one_connection(recorders[x].sock(y), recorders[y].sock(x))
            for n, p in ((x, y), (y, x)):  # both ends tuned as the link's own (link._tune)
                link_sock = links[n]._conns[p].sock
                assert link_sock is not None
                for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
                    assert recorders[n].sock(p).getsockopt(socket.SOL_SOCKET, opt) == \
                        link_sock.getsockopt(socket.SOL_SOCKET, opt)
        await completed(links["a"].send(0, 4, DW))  # the links themselves carry on as before
        await completed(links["c"].send(5, 2, DW))
        assert pod.got["c"] == [(0, 4, DW)] and pod.got["b"] == [(5, 2, DW)]


async def test_a_dropped_link_closes_both_data_channels_and_a_new_pair_comes_back(
        pod: Pod, recorders) -> None:
    """close(handle) on both sides when the link goes down (dropped by the dialer; then the
    other node stopped), and a new pair of ends that meet with each new link."""
    with trio.fail_after(WATCHDOG):
        a, b = await start(pod, recorders, "a"), await start(pod, recorders, "b")
        ra, rb = recorders["a"], recorders["b"]
        await wait_until(lambda: ra.peers() == ["b"] and rb.peers() == ["a"])
        first = (ra.opened[0][0], rb.opened[0][0])
        a._conns["b"].drop(conn_mod.LinkDown("test"))
        # at once, before the link's teardown: a load carried meanwhile would get bytes
        # where the link's LOAD faults
        assert ra.closed == [first[0]]
        await wait_until(lambda: ra.closed == [first[0]] and rb.closed == [first[1]])
        await wait_until(lambda: ra.peers() == ["b"] and rb.peers() == ["a"])
        assert len(ra.opened) == len(rb.opened) == 2
        assert_ends_of_one_connection(ra.sock("b"), rb.sock("a"))
        second = (ra.opened[1][0], rb.opened[1][0])
        await b.aclose()  # b stopping closes its own; a's goes when a sees the link down
        await wait_until(lambda: rb.closed == [first[1], second[1]] and not rb.live)
        await wait_until(lambda: ra.closed == [first[0], second[0]] and not ra.live)
        assert not a.is_up("b")


async def test_with_tls_no_data_channel_is_opened_nor_admitted(pod: Pod, recorders,
                                                                caplog) -> None:
    """The data plane speaks plain TCP: with TLS configured, the dialer dials no data
    channel and the listener refuses one (over TLS, with the right certificate and key),
    noted as a refusal; the TLS link carries messages as before."""
    caplog.set_level(logging.INFO, logger="ualinkd.fabric")
    with trio.fail_after(WATCHDOG):
        ca = trustme.CA()
        a = await start(pod, recorders, "a", **_tls_kw("a", ca))
        c = await start(pod, recorders, "c", **_tls_kw("c", ca))
        await completed(a.send(0, 4, DW))
        await completed(c.send(4, 0, DW))
        assert pod.got["c"] == [(0, 4, DW)] and pod.got["a"] == [(4, 0, DW)]
        stream, ok = await data_hello(pod.ports["c"], pod.cfg, "a", "c",
                                      ssl_context=_tls_kw("a", ca)["ssl_client_context"])
        assert not ok
        await expect_closed(stream)
        await wait_until(lambda: bool(warnings(caplog)))
        [line] = warnings(caplog)
        assert "refused connection from a (127.0.0.1:" in line
        assert "a data channel on a TLS fabric" in line
        assert recorders["a"].opened == recorders["c"].opened == []
        assert c.is_up("a")


async def test_a_data_channel_with_a_wrong_key_is_refused_and_noted(pod: Pod, recorders,
                                                                   caplog) -> None:
    caplog.set_level(logging.INFO, logger="ualinkd.fabric")
    with trio.fail_after(WATCHDOG):
        a, b = await start(pod, recorders, "a"), await start(pod, recorders, "b")
        await wait_until(lambda: recorders["b"].peers() == ["a"])
        wrong = auth.node_keys(pod.cfg, "a")["c"]  # a's key, of another link
        stream, ok = await data_hello(pod.ports["b"], pod.cfg, "a", "b", key=wrong)
        assert not ok
        await expect_closed(stream)
        await wait_until(lambda: bool(warnings(caplog)))
        [line] = warnings(caplog)
        assert "refused connection from a (127.0.0.1:" in line
        assert "'a' failed to prove the key of our link" in line
        assert len(recorders["b"].opened) == 1 and recorders["b"].closed == []
        await completed(a.send(0, 2, DW))
        assert pod.got["b"] == [(0, 2, DW)] and b.is_up("a")


async def test_a_data_channel_without_a_live_link_from_its_peer_is_refused(
        pod: Pod, recorders, caplog) -> None:
    """b has no link from a: a data channel that authenticates as a, right key and all, is
    refused before AUTH_OK and noted; and a node without DataChannels refuses one too."""
    caplog.set_level(logging.INFO, logger="ualinkd.fabric")
    with trio.fail_after(WATCHDOG):
        await start(pod, recorders, "b")
        stream, ok = await data_hello(pod.ports["b"], pod.cfg, "a", "b")
        assert not ok
        await expect_closed(stream)
        await wait_until(lambda: bool(warnings(caplog)))
        [line] = warnings(caplog)
        assert "refused connection from a (127.0.0.1:" in line
        assert "a data channel from a without a live link from it" in line
        assert recorders["b"].opened == []
        c = await pod.start("c")  # no data_channels
        main, _ = await raw_auth(pod.ports["c"], pod.cfg, "a", "c")
        await wait_until(lambda: c.is_up("a"))
        stream, ok = await data_hello(pod.ports["c"], pod.cfg, "a", "c")
        assert not ok
        await expect_closed(stream)
        await wait_until(lambda: any("this node takes none" in w for w in warnings(caplog)))
        assert c.is_up("a")
        await main.aclose()


async def test_a_data_channel_that_sends_before_auth_ok_is_refused_and_a_second_waits(
        pod: Pod, recorders, caplog) -> None:
    """Against a hand-driven peer a: a data channel whose AUTH_PROOF came with more bytes is
    refused (the handover could not pass them on); a good one is handed over, its bytes
    reach the data plane; a second one for the same link is refused while the first is
    healthy (issue 29 item 6), and admitted once the data plane found the first broken.
    None of them probes or replaces the link (a silent one: a new link would drop it)."""
    caplog.set_level(logging.INFO, logger="ualinkd.fabric")
    with trio.fail_after(WATCHDOG):
        b = await start(pod, recorders, "b", heartbeat_interval=0.05, heartbeat_timeout=10.0)
        rb = recorders["b"]
        hss: list[auth.ClientHandshake] = []
        main, _ = await raw_auth(pod.ports["b"], pod.cfg, "a", "b",  # never answers a PING
                                 handshakes=hss)
        await wait_until(lambda: b.is_up("a"))
        conn = b._conns["a"]
        early, ok = await data_hello(pod.ports["b"], pod.cfg, "a", "b", extra=b"\0" * 7,
                                     link=hss[0])
        assert not ok
        await expect_closed(early)
        await wait_until(lambda: bool(warnings(caplog)))
        [line] = warnings(caplog)
        assert "bytes sent on a data channel before its handshake finished" in line
        first, ok = await data_hello(pod.ports["b"], pod.cfg, "a", "b", link=hss[0])
        assert ok
        await wait_until(lambda: rb.peers() == ["a"])
        assert rb.opened[0][1:] == ("a", frozenset({0, 1}))
        await first.send_all(b"to the data plane")
        assert rb.sock("a").recv(64) == b"to the data plane"
        refused, ok = await data_hello(pod.ports["b"], pod.cfg, "a", "b", link=hss[0])
        assert not ok
        await expect_closed(refused)
        assert len(rb.opened) == 1 and rb.closed == []
        await first.aclose()  # the peer's end goes: the data plane sees it and drops it
        assert rb.sock("a").recv(64) == b""
        rb.break_channel("a")
        second, ok = await data_hello(pod.ports["b"], pod.cfg, "a", "b", link=hss[0])
        assert ok
        await wait_until(lambda: len(rb.opened) == 2)
        assert rb.closed == [] and list(rb.live) == [rb.opened[1][0]]
        await trio.sleep(0.3)  # a probe of the silent link would have dropped it by now
        assert b._conns.get("a") is conn and conn.down is None
        await main.aclose()
        await wait_until(lambda: not rb.live)  # the link went: its data channel with it
        assert rb.closed == [rb.opened[1][0]]
        await second.aclose()


async def test_a_data_channel_waits_for_its_link_to_replace_a_silent_old_one(
        pod: Pod, recorders) -> None:
    """a restarts while b still holds a's old, silent link: a's new link is admitted only
    once the old one fails its liveness probe, and the data channel a dials as soon as its
    link is up belongs to the new link, not the old one (it would be closed with it)."""
    with trio.fail_after(WATCHDOG):
        # (handshakes of 5 s: the data channel's includes waiting out the probe, 0.2 s)
        b = await start(pod, recorders, "b", heartbeat_interval=0.1, heartbeat_timeout=10.0,
                        handshake_timeout=5.0)
        old, _ = await raw_auth(pod.ports["b"], pod.cfg, "a", "b")  # never reads nor writes
        await wait_until(lambda: b.is_up("a"))
        await start(pod, recorders, "a", handshake_timeout=5.0)
        ra, rb = recorders["a"], recorders["b"]
        await wait_until(lambda: ra.peers() == ["b"] and rb.peers() == ["a"])
        await expect_closed(old)
        await trio.sleep(0.3)
        assert rb.closed == [] and ra.closed == [] and len(rb.opened) == 1
        assert_ends_of_one_connection(ra.sock("b"), rb.sock("a"))


async def test_a_data_channel_the_data_plane_refuses_or_cannot_have_is_one_info_line(
        pod: Pod, recorders, caplog) -> None:
    """The fast path is optional: a dialer whose data plane refuses the socket, or whose
    peer takes no data channels, logs one INFO line and does not retry; the link works."""
    caplog.set_level(logging.INFO, logger="ualinkd.fabric")
    with trio.fail_after(WATCHDOG):
        a = await start(pod, recorders, "a", refuse=True)
        b = await start(pod, recorders, "b")
        c = await pod.start("c")  # no data_channels
        await wait_until(lambda: a.is_up("b") and a.is_up("c"))
        await wait_until(lambda: recorders["b"].peers() == ["a"])

        def infos(what: str) -> list[str]:
            return [m for r in caplog.records if r.levelno == logging.INFO
                    and (m := r.getMessage()).startswith(f"fabric a: no data channel {what}")]
        await wait_until(lambda: bool(infos("to b") and infos("to c")))
        await trio.sleep(0.3)
        [to_b], [to_c] = infos("to b"), infos("to c")
        assert "the data plane refused it" in to_b
        assert "connection closed during the handshake" in to_c
        assert recorders["a"].opened == []
        await completed(a.send(0, 2, DW))
        await completed(a.send(1, 4, DW))
        assert pod.got["b"] == [(0, 2, DW)] and pod.got["c"] == [(1, 4, DW)]
        assert b.is_up("a") and c.is_up("a")


async def test_a_full_data_plane_is_asked_for_no_channel(pod: Pod, recorders, caplog) -> None:
    """A data plane with every channel in use (DP_CHANNELS peers: a node linked to more than
    64) is not asked for one more: its link dials no channel (no handshake, no line: the data
    plane said once that it is full), and a channel dialed to it is refused in its handshake
    (one INFO line on the dialer, no retry). Before, each such link did a channel handshake
    to have it refused, with two INFO lines. The links work."""
    caplog.set_level(logging.INFO, logger="ualinkd.fabric")
    with trio.fail_after(WATCHDOG):
        recorders["a"] = Recorder()
        recorders["a"].full = True
        recorders["c"] = Recorder()
        recorders["c"].full = True
        a = await pod.start("a", data_channels=recorders["a"])
        b = await start(pod, recorders, "b")
        c = await pod.start("c", data_channels=recorders["c"])
        await wait_until(lambda: a.is_up("b") and a.is_up("c") and b.is_up("c"))

        def infos() -> list[str]:
            return [r.getMessage() for r in caplog.records
                    if "data channel" in r.getMessage()]
        await wait_until(lambda: bool(infos()))
        await trio.sleep(0.3)
        [to_c] = infos()  # a asked for none; b's to c was refused in its handshake
        assert to_c.startswith("fabric b: no data channel to c "), to_c
        assert "closed during the handshake" in to_c, to_c
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert [r.opened for r in recorders.values()] == [[], [], []]
        await completed(a.send(0, 2, DW))
        await completed(b.send(2, 4, DW))
        assert pod.got["b"] == [(0, 2, DW)] and pod.got["c"] == [(2, 4, DW)]
        assert c.is_up("a") and c.is_up("b")


async def test_a_data_channel_that_breaks_while_its_link_lasts_is_dialed_again(
        pod: Pod, recorders, caplog) -> None:
    """A channel the data plane finds broken (a reset, a hostile frame: it drops that
    channel and says so, DataChannels.on_broken) while the link stays up: the dialer dials
    a new one with the link's backoff, one INFO line says so, and the two new ends meet;
    neither side close()s the handle the data plane dropped itself (Recorder raises), and
    the link is the same one throughout."""
    caplog.set_level(logging.INFO, logger="ualinkd.fabric")
    with trio.fail_after(WATCHDOG):
        a, b = await start(pod, recorders, "a"), await start(pod, recorders, "b")
        ra, rb = recorders["a"], recorders["b"]
        await wait_until(lambda: ra.peers() == ["b"] and rb.peers() == ["a"])
        links = (a._conns["b"], b._conns["a"])
        for rec, peer in ((ra, "b"), (rb, "a")):  # (both ends see the break)
            rec.break_channel(peer)
        await wait_until(lambda: ra.peers() == ["b"] and rb.peers() == ["a"])
        assert_ends_of_one_connection(ra.sock("b"), rb.sock("a"))
        assert len(ra.opened) == len(rb.opened) == 2 and ra.closed == rb.closed == []
        assert (a._conns["b"], b._conns["a"]) == links
        again = [m for r in caplog.records if r.levelno == logging.INFO
                 and "handed over again" in (m := r.getMessage())]
        assert len(again) == 1
        # Again, with only the dialer's end noticing first: it closed its socket, so the
        # other end's data plane reads EOF and drops the old channel (after the new one
        # came: the newcomer waits for that, issue 29 item 6), then takes the new one.
        dialer, other = (ra, rb) if "fabric a: data channel to b" in again[0] else (rb, ra)
        dialer.break_channel("b" if dialer is ra else "a")
        await trio.sleep(0.05)  # (the redial is on its way: 20 ms backoff)
        other_peer = "a" if other is rb else "b"
        assert other.sock(other_peer).recv(64) == b""
        other.break_channel(other_peer)
        await wait_until(lambda: len(dialer.opened) == len(other.opened) == 3)
        assert other.closed == []
        assert_ends_of_one_connection(ra.sock("b"), rb.sock("a"))
        await completed(a.send(0, 2, DW))
        assert pod.got["b"] == [(0, 2, DW)]


async def test_the_dialer_dials_its_data_channel_at_the_links_address_and_takes_no_bytes(
        pod: Pod, recorders, caplog) -> None:
    """Against a hand-driven listener b: once a's link to it is up, a dials the same address
    again with a channel 1 HELLO; a data channel whose AUTH_OK came with more bytes is not
    handed over (they could not be passed on), one INFO line, and a does not retry."""
    caplog.set_level(logging.INFO, logger="ualinkd.fabric")
    nonces = auth.NonceCache()

    async def answer(stream: trio.abc.Stream, extra: bytes) -> auth.ServerHandshake:
        hs = auth.ServerHandshake(pod.cfg, "b", now=trio.current_time(), nonces=nonces)
        dec = FrameDecoder()
        while not hs.established:
            out = hs.receive_frame(await read_frame(stream, dec), trio.current_time())
            await stream.send_all(b"".join(encode_frame(f) for f in out)
                                  + (extra if hs.established else b""))
        return hs

    with trio.fail_after(WATCHDOG):
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        a = await start(pod, recorders, "a")
        a.set_peer_address("b", f"127.0.0.1:{port}")
        main = await listeners[0].accept()
        assert (await answer(main, b"")).channel is Channel.LINK
        await wait_until(lambda: a.is_up("b"))
        data = await listeners[0].accept()
        assert (await answer(data, encode_frame(Ping(1)))).channel is Channel.DATA
        await expect_closed(data)

        def infos() -> list[str]:
            return [m for r in caplog.records if r.levelno == logging.INFO
                    and (m := r.getMessage()).startswith("fabric a: no data channel to b")]
        await wait_until(lambda: bool(infos()))
        with trio.move_on_after(0.3):  # no retry while the link is up
            await listeners[0].accept()
            raise AssertionError("a dialed again")
        [line] = infos()
        n = len(encode_frame(Ping(1)))
        assert f"at 127.0.0.1:{port}: {n} bytes came with its AUTH_OK" in line
        assert recorders["a"].opened == [] and a.is_up("b")
        await main.aclose()
        for lst in listeners:
            await lst.aclose()


async def test_a_second_data_channel_never_takes_a_healthy_one(pod: Pod, recorders,
                                                               caplog) -> None:
    """Issue 29 item 6: the link's rule for channels. A party holding a's link key (a
    stolen or superseded config) dials b a data channel as a while a's own is healthy: b
    refuses it before AUTH_OK, again and again, one WARNING naming it (repeats counted in
    REFUSAL_LOG_INTERVAL's line), and a's channel stays the one b uses — on the old code
    each newcomer took it, and b's loads of a's memory went to the newcomer."""
    caplog.set_level(logging.INFO, logger="ualinkd.fabric")
    with trio.fail_after(WATCHDOG):
        a, b = await start(pod, recorders, "a"), await start(pod, recorders, "b")
        ra, rb = recorders["a"], recorders["b"]
        await wait_until(lambda: ra.peers() == ["b"] and rb.peers() == ["a"])
        taken = 0
        for _ in range(5):
            stream, ok = await data_hello(pod.ports["b"], pod.cfg, "a", "b")
            taken += ok
            await stream.aclose()
        print(f"{taken} of 5 second data channels took the link's healthy one")
        assert taken == 0
        assert len(rb.opened) == 1 and rb.closed == []
        assert_ends_of_one_connection(ra.sock("b"), rb.sock("a"))
        await wait_until(lambda: bool(warnings(caplog)))
        lines = [w for w in warnings(caplog) if "refused connection" in w]
        assert len(lines) == 1, warnings(caplog)
        assert "refused connection from a (127.0.0.1:" in lines[0]
        # (refused at once: not bound to the live link's handshake; a's own end's second
        # channel would be refused as a second while the first is healthy, tested above)
        assert "a data channel from a not dialed by its live link's end" in lines[0]
        await completed(a.send(0, 2, DW))
        assert pod.got["b"] == [(0, 2, DW)] and b.is_up("a")


async def test_a_data_channel_is_bound_to_its_live_link_not_only_its_key(
        pod: Pod, recorders, caplog) -> None:
    """Issue 29 item 6's windows: a party holding a's link key (a stolen or superseded
    config), not an end of the live link, dials b data channels as a — one parked while a's
    channel is healthy, and one more the moment b's data plane found a's channel broken
    (when a's own redial is still on its way). b refuses both before AUTH_OK: a channel's
    nonce must be bound to the live link's handshake (auth.bound_nonce), which only a and b
    saw; a's own redial is taken. At the review of issue 29 the parked one took the channel
    the moment a's broke, and b's loads of a's memory went to it."""
    caplog.set_level(logging.INFO, logger="ualinkd.fabric")
    with trio.fail_after(WATCHDOG):
        a, b = await start(pod, recorders, "a"), await start(pod, recorders, "b")
        ra, rb = recorders["a"], recorders["b"]
        await wait_until(lambda: ra.peers() == ["b"] and rb.peers() == ["a"])
        results: list[bool] = []

        async def impostor() -> None:
            stream, ok = await data_hello(pod.ports["b"], pod.cfg, "a", "b")
            results.append(ok)
            await stream.aclose()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(impostor)
            await trio.sleep(0.05)  # (parked, if it is let wait for the healthy channel)
            rb.break_channel("a")  # b's data plane finds a's channel broken
            nursery.start_soon(impostor)
        print(f"{sum(results)} of 2 impostor channels taken when a's channel broke")
        assert results == [False, False]
        # a's own end redials once it sees the break (its socket closed by b's data plane)
        ra.break_channel("b")
        await wait_until(lambda: len(rb.opened) == 2 and len(rb.live) == 1)
        assert_ends_of_one_connection(ra.sock("b"), rb.sock("a"))
        assert any("not dialed by its live link's end" in w for w in warnings(caplog))
        await completed(a.send(0, 2, DW))
        assert pod.got["b"] == [(0, 2, DW)] and b.is_up("a")
