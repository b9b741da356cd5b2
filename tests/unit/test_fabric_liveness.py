"""A link's liveness, sans-IO with time as an argument (fabric/liveness.py, driven by the
Session's get_timer/handle_timer as aioquic's connection is): heartbeats about every
interval when nothing else went out, a PING at least every CLOCK_REFRESH_INTERVALS for the
link clock, probes of a peer silent for PROBE_AFTER_INTERVALS, death after the heartbeat
timeout (nothing received, or nothing taken of what is held). 5-second timeouts tested in
microseconds: no sleeping."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from ualinkd.fabric.liveness import (
    CLOCK_REFRESH_INTERVALS,
    HEARTBEAT_SWEEPS,
    PROBE_AFTER_INTERVALS,
    Dead,
    Liveness,
    Ping,
)
from ualinkd.fabric.session import NEED_DATA, Session
from ualinkd.fabric.wire import FrameDecoder
from ualinkd.fabric.wire import Ping as PingFrame

INTERVAL, TIMEOUT = 1.0, 5.0
STEP = INTERVAL / HEARTBEAT_SWEEPS


def _run(live: Liveness, until: float, *, peer_every: float | None = None,
         busy: bool = False) -> list[tuple[float, object]]:
    """Drive `live` as the link's timer task does (handle at next_due), with the peer
    sending every `peer_every` s and (`busy`) our socket taking bytes at every step."""
    out: list[tuple[float, object]] = []
    now = live.last_rx
    while True:
        due = live.next_due()
        assert due > now  # never due again at once: no busy loop
        now = due
        if now > until:
            return out
        if peer_every is not None:
            live.last_rx = now - (now % peer_every)
        if busy:
            live.last_tx = now
        verdict = live.handle(now)
        if verdict is not None:
            out.append((now, verdict))
        if isinstance(verdict, Dead):
            return out


def test_an_idle_link_heartbeats_once_an_interval_on_the_grid() -> None:
    live = Liveness(INTERVAL, TIMEOUT, now=10.1)
    live.ping_queued(10.1)  # the link's first PING, at once
    got = _run(live, 20.0, peer_every=0.5)
    assert [v for _, v in got] == [Ping.HEARTBEAT] * len(got)
    times = [t for t, _ in got]
    assert all(abs(t / STEP - round(t / STEP)) < 1e-9 for t in times)  # on the grid
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(INTERVAL - 1e-9 <= g <= INTERVAL + STEP + 1e-9 for g in gaps)
    assert len(got) >= 9


def test_a_busy_link_still_sends_its_clock() -> None:
    live = Liveness(INTERVAL, TIMEOUT, now=0.0)
    live.ping_queued(0.0)
    got = _run(live, 35.0, peer_every=0.5, busy=True)
    times = [t for t, v in got if v is Ping.HEARTBEAT]
    assert times and times[0] >= CLOCK_REFRESH_INTERVALS * INTERVAL
    assert all(b - a >= CLOCK_REFRESH_INTERVALS * INTERVAL
               for a, b in itertools.pairwise(times))


def test_a_silent_peer_is_probed_once_an_interval_then_dropped() -> None:
    live = Liveness(INTERVAL, TIMEOUT, now=0.0)
    live.ping_queued(0.0)
    got = _run(live, 100.0)
    probes = [t for t, v in got if v is Ping.PROBE]
    assert probes[0] > PROBE_AFTER_INTERVALS * INTERVAL
    assert all(b - a >= INTERVAL for a, b in itertools.pairwise(probes))
    when, verdict = got[-1]
    assert isinstance(verdict, Dead) and "nothing received for 5.0 s" in verdict.reason
    assert TIMEOUT <= when < TIMEOUT + STEP + 1e-9


def test_a_peer_that_takes_nothing_is_dropped_at_the_timeout() -> None:
    live = Liveness(INTERVAL, TIMEOUT, now=0.0)
    live.ping_queued(0.0)
    live.held, live.stuck_since = 32 << 20, 1.0
    got = _run(live, 100.0, peer_every=0.5)
    when, verdict = got[-1]
    assert isinstance(verdict, Dead) and "peer not reading: 32 MiB held" in verdict.reason
    assert 1.0 + TIMEOUT <= when < 1.0 + TIMEOUT + STEP + 1e-9


def test_links_started_apart_share_the_grid() -> None:
    """One wake-up serves every link due then: their due times coincide on the grid."""
    a, b = Liveness(INTERVAL, TIMEOUT, now=3.01), Liveness(INTERVAL, TIMEOUT, now=3.1)
    a.ping_queued(3.01)
    b.ping_queued(3.1)
    assert a.next_due() == b.next_due() == 4.0


@given(st.lists(st.tuples(st.sampled_from(["rx", "tx", "wait"]),
                          st.floats(0.0, 3.0, allow_nan=False)), max_size=60))
def test_never_dead_while_the_peer_talks_and_never_quiet_for_long(
        steps: list[tuple[str, float]]) -> None:
    """Whatever the traffic, handled at its due times: a link whose peer sent within the
    timeout is never dead, and we never go an interval and a step without sending."""
    live = Liveness(INTERVAL, TIMEOUT, now=0.0)
    live.ping_queued(0.0)
    now = 0.0
    for kind, dt in steps:
        target = now + dt
        while (due := live.next_due()) <= target:
            assert due > now
            now = due
            verdict = live.handle(now)
            assert not isinstance(verdict, Dead) or now - live.last_rx >= TIMEOUT
            if isinstance(verdict, Dead):
                return
            assert now - max(live.last_tx, live.pinged) <= INTERVAL + STEP + 1e-9
        now = target
        if kind == "rx":
            live.last_rx = now
        elif kind == "tx":
            live.last_tx = now


def test_the_sessions_timer_queues_the_ping_and_reports_death() -> None:
    """Session.handle_timer(now) acts on the verdict: the heartbeat PING (our clock, token
    0) is queued for the link to write, and a dead link is returned, not raised."""
    s = Session("B", {2}, {0}, now=0.0, liveness=Liveness(INTERVAL, TIMEOUT, now=0.0))
    s.send_heartbeat(now=0.0)
    s.data_to_send()
    due = s.get_timer()
    assert due == INTERVAL  # an idle link's next PING
    assert s.handle_timer(due) is None
    dec = FrameDecoder()
    dec.receive_data(s.data_to_send())
    ping = dec.next_frame()
    assert isinstance(ping, PingFrame) and ping.token == 0 and ping.clock == 1000
    assert dec.next_frame() is NEED_DATA
    dead = None
    while dead is None:
        due = s.get_timer()
        assert due is not None
        dead = s.handle_timer(due)
    assert isinstance(dead, Dead) and due >= TIMEOUT
