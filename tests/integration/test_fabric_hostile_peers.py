"""FabricLink against hand-driven peers that hold the pod key and misbehave on the data and
control planes (the robustness review, session 6): whatever such a peer does costs a bounded
amount of memory, loses nothing it was promised, and the other links keep being served."""

from __future__ import annotations

import errno
import logging
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
from test_fabric_link import DW, Pod, expect_closed, make_pod, raw_server_b, wait_until

from ualinkd.drm.completion import Completion
from ualinkd.drm.errors import DrmError
from ualinkd.fabric import conn as conn_mod
from ualinkd.fabric.link import FabricLink
from ualinkd.fabric.waiting import completed
from ualinkd.fabric.wire import AuthHello, Data, Load, Ping, Pong, _NeedData, encode_frame


@pytest.fixture
async def pod() -> AsyncIterator[Pod]:
    async with trio.open_nursery() as nursery:
        yield Pod(make_pod(), nursery)
        nursery.cancel_scope.cancel()


async def test_a_ping_flood_from_a_peer_that_reads_too_little_is_bounded(
        pod: Pod, monkeypatch, caplog) -> None:
    """Each PING with a token is answered with a PONG (session.py). A peer that sends them
    far faster than it takes the PONGs (here: not at all, while it sends) must not make us
    hold PONGs without bound: once HOLD_MAX of replies are held for it, we read nothing
    more from it (TCP then slows it down), another link is still served, and once it reads
    again every PING is answered, in order, none lost. (A peer that takes a little now and
    then is never "not reading", so the heartbeat timeout alone does not bound this.)"""
    monkeypatch.setattr(conn_mod, "HOLD_MAX", 64 << 10)
    a, stream, dec, out, listeners = await raw_server_b(pod)
    await pod.start("c")
    await stream.send_all(b"".join(encode_frame(f) for f in out))
    await wait_until(lambda: a.is_up("b") and a.is_up("c"))
    conn = a._conns["b"]
    assert conn.sock is not None
    # Our side's socket takes little (the peer's window is small), so what it does not
    # take is held by the link, where it is counted.
    conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    count = 200_000  # 2.6 MB of PONGs, forty times HOLD_MAX
    flood = b"".join(encode_frame(Ping(i + 1, 0)) for i in range(count))
    # HOLD_MAX held before, HOLD_MAX of replies since, one read's replies more
    bound = 3 * conn_mod.HOLD_MAX
    tokens: list[int] = []
    with trio.fail_after(30):  # watchdog
        async with trio.open_nursery() as n:
            n.start_soon(stream.send_all, flood)  # (it blocks once we stop reading)
            await wait_until(lambda: conn.paused or conn.held > bound, timeout=20)
            assert conn.held <= bound, f"{conn.held} bytes held for a peer that does not read"
            assert [r for r in caplog.records if "not taking its answers" in r.getMessage()]
            await completed(a.send(0, 4, DW))  # another link is served meanwhile
            assert pod.got["c"] == [(0, 4, DW)]
            # It reads again, as fast as it can: every PING is answered, in order.
            while len(tokens) < count:
                data = await stream.receive_some(1 << 20)
                assert data, "a closed the link"
                dec.receive_data(data)
                while not isinstance(f := dec.next_frame(), _NeedData):
                    if isinstance(f, Pong):
                        tokens.append(f.token)
    assert tokens == list(range(1, count + 1))
    assert a.is_up("b")
    assert len([r for r in caplog.records if "not taking its answers" in r.getMessage()]) == 1
    await stream.aclose()
    for lst in listeners:
        await lst.aclose()


async def test_messages_that_waited_for_the_link_keep_their_order(pod: Pod) -> None:
    """§5.1 (the soft IH ring takes messages in arrival order) and FabricLink.send_batch's
    contract (queued in order): a batch sent while the link to b is down waits for it; a
    message sent once the link is up (here: from the link-up callback, before any waiting
    task has run) goes behind it, not ahead. So does a single `send`."""
    order: list[Completion[Any]] = []
    a: FabricLink

    def on_peer_state(peer: str, up: bool) -> None:
        if up and peer == "b":
            order.append(a.send_batch(0, 2, [(3, 2, 0, 0)]))
            order.append(a.send(0, 2, (3, 3, 0, 0)))

    a = FabricLink(pod.cfg, "a", lambda s, d, w: None, on_peer_state=on_peer_state,
                   connect_backoff=(0.01, 0.05), handshake_timeout=0.5, ack_timeout=5.0)
    pod.ports["a"] = await pod.nursery.start(a.run)
    pod.links["a"] = a
    waited = [a.send_batch(0, 2, [(3, 0, 0, 0)]), a.send(0, 2, (3, 1, 0, 0))]  # b is down
    outcomes: list[object] = []

    async def wait(c: Completion[Any]) -> None:
        outcomes.append(await completed(c))

    with trio.fail_after(10):  # watchdog
        async with trio.open_nursery() as n:
            for aw in waited:
                n.start_soon(wait, aw)
            await trio.sleep(0.05)  # both wait for the link
            await pod.start("b")
            await wait_until(lambda: len(order) == 2)
            for aw in order:
                n.start_soon(wait, aw)
    assert [w[1] for _, _, w in pod.got["b"]] == [0, 1, 2, 3]
    assert outcomes.count(None) == 2  # the sends' (they raise on failure)
    assert all(o == [(None, o[0][1])] for o in outcomes if o is not None)


async def test_a_flood_of_hellos_with_made_up_names_is_two_log_lines(pod: Pod, caplog) -> None:
    """Refusals are logged one line per cause and interval (admission.py, Refusals): the cause is
    the reason without the names in it. A name the refusal quotes with double quotes (its
    repr, when it holds a single quote) is still a name: 30 unauthenticated HELLOs, each
    with a different made-up name, are one line and one count line, not 30 lines."""
    caplog.set_level(logging.WARNING, logger="ualinkd.fabric")
    c = await pod.start("c")
    for i in range(30):
        name = "evil'" + "".join(chr(ord("a") + int(d)) for d in f"{i:02d}")  # no digits
        stream = await trio.open_tcp_stream("127.0.0.1", pod.ports["c"])
        await stream.send_all(encode_frame(AuthHello(pod.cfg.uuid, name, b"\1" * 32)))
        await expect_closed(stream)
    await c.aclose()  # (flushes the count line)
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(lines) == 2, lines
    assert "unknown node \"evil'aa\"" in lines[0]
    assert "refused 29 more connections like that" in lines[1]


async def test_every_request_is_answered_once_when_the_peer_vanishes(pod: Pod) -> None:
    """The data plane without tasks (request's Completion, drm/completion.py): of 2,000 LOADs in
    flight, the peer answers every other one (a few of them twice), then
    vanishes. Each Completion is done exactly once (a second answer would raise in the
    reader and end the link loudly): with the bytes, or EFAULT (policy 3); nothing is
    left in the link's tables afterwards, and the link comes up again."""
    a, stream, dec, out, listeners = await raw_server_b(pod)
    await stream.send_all(b"".join(encode_frame(f) for f in out))
    await wait_until(lambda: a.is_up("b"))
    conn = a._conns["b"]
    n = 2000
    done: list[int] = []
    completions = []
    for i in range(n):
        c = a.request(0, 2, 4096 * i, 8)
        c.when_done(lambda c, i=i: done.append(i))
        completions.append(c)
    loads: list[Load] = []
    with trio.fail_after(10):
        while len(loads) < n:
            data = await stream.receive_some(1 << 16)
            dec.receive_data(data)
            while not isinstance(f := dec.next_frame(), _NeedData):
                if isinstance(f, Load):
                    loads.append(f)
    answers = []
    for k, load in enumerate(loads[::2]):
        frame = encode_frame(Data(load.seq, 0, k.to_bytes(8, "little")))
        answers.append(frame * 2 if k % 100 == 0 else frame)  # a duplicate: dropped
    await stream.send_all(b"".join(answers))
    await wait_until(lambda: len(done) == n // 2, timeout=5)
    await stream.aclose()  # the peer vanishes with half of the LOADs unanswered
    await wait_until(lambda: len(done) == n, timeout=5)
    assert sorted(done) == list(range(n))  # each exactly once
    for k, c in enumerate(completions):
        if k % 2 == 0:
            assert c.result() == (k // 2).to_bytes(8, "little")
        else:
            with pytest.raises(DrmError) as e:
                c.result()
            assert e.value.errno == errno.EFAULT
    assert conn.session.waiting == 0 and conn.session.get_timer() is None
    for lst in listeners:
        await lst.aclose()
