"""Liveness of one established fabric link, sans-IO: when to send a heartbeat PING, when to
probe a silent peer, when the link is dead. Time is an input (aioquic's `now`); the caller
(the Session's `handle_timer`) acts on the answer, and `next_due()` says when to ask again.

Each side makes sure its peer hears from it about every heartbeat interval: a heartbeat
PING (unanswered: the peer's own prove the peer alive) only when it has sent nothing else
for that long, and at least every CLOCK_REFRESH_INTERVALS intervals for the link clock the
PING carries. A peer heard nothing from for PROBE_AFTER_INTERVALS intervals (its heartbeats
may be sparser than ours) is sent PINGs that it answers, once an interval. A link that
brought nothing for the heartbeat timeout is dead, and so is one whose peer took none of
what is held for it for as long.

Due times fall on one grid of HEARTBEAT_SWEEPS points an interval, shared by every link of
the daemon: a pod of 64 nodes has 63 links a node, handled in one wake-up rather than 63,
and an idle link carries two frames an interval, not four (a PING and a PONG each way).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Final

# Sweeps of the links per heartbeat interval: the grid due times are rounded up to. A link we
# have sent nothing on for more than an interval less half a step gets its heartbeat PING
# (so the PINGs of an idle link come an interval apart, however late each wake-up runs, and
# no link is quiet for much longer).
HEARTBEAT_SWEEPS: Final = 4
# A peer silent for this many intervals (twice what its heartbeats leave, if it uses ours)
# is asked for PONGs: its silence then says it is gone, whatever its own interval.
PROBE_AFTER_INTERVALS: Final = 2
# A busy link (never quiet for an interval) still sends a PING every this many intervals:
# the peer's reading of our link clock is then never old (its deadlines assume our clock
# runs at its rate; two hosts' clocks, 100 ppm apart, drift 1 ms in 10 s, and none on one).
CLOCK_REFRESH_INTERVALS: Final = 10


class Ping(enum.Enum):
    HEARTBEAT = "heartbeat"  # a PING that wants no PONG (our clock, and we are alive)
    PROBE = "probe"  # a PING the peer answers: its silence then means it is gone


@dataclass(frozen=True, slots=True)
class Dead:
    """The link is dead: drop it, saying why."""

    reason: str


class Liveness:
    """One link's liveness. The link reports what it sees as it goes: `last_rx` (bytes
    came in), `last_tx` (the socket took bytes from us), and, before each `handle(now)`,
    what its writer holds for the peer (`held` bytes, not shrinking since `stuck_since`)."""

    __slots__ = ("_handled", "held", "interval", "last_rx", "last_tx", "pinged", "step",
                 "stuck_since", "timeout")

    def __init__(self, interval: float, timeout: float, now: float) -> None:
        self.interval = interval
        self.timeout = timeout
        self.step = interval / HEARTBEAT_SWEEPS
        self.last_rx = now
        self.last_tx = now
        self.pinged = -math.inf  # when our last PING (heartbeat or probe) was queued
        self.held = 0
        self.stuck_since = now
        self._handled = -math.inf  # the last `handle(now)`'s now

    def ping_queued(self, now: float) -> None:
        """A PING that carries our clock was queued at `now` (the link's first, at once)."""
        self.pinged = now

    def next_due(self) -> float:
        """When `handle` may have something to do: on the grid, strictly after the last
        `handle` (a rule that did not fire then is asked again a step later, not at once)."""
        i = self.interval
        due = min(self.last_rx + self.timeout,
                  max(self.last_rx + PROBE_AFTER_INTERVALS * i, self.pinged + i),
                  max(self.last_tx, self.pinged) + i - self.step / 2,
                  self.pinged + CLOCK_REFRESH_INTERVALS * i)
        if self.held:
            due = min(due, self.stuck_since + self.timeout)
        t = max(due, self._handled)
        return (math.floor(t / self.step) + 1) * self.step

    def handle(self, now: float) -> Ping | Dead | None:
        """What the time `now` means for the link: a PING to send (noted as sent), the link
        dead, or nothing."""
        self._handled = now
        silent = now - self.last_rx
        if silent >= self.timeout:
            return Dead(f"nothing received for {silent:.1f} s")
        stuck = now - self.stuck_since
        if self.held and stuck >= self.timeout:
            return Dead(f"peer not reading: {self.held >> 20} MiB held, none taken for "
                        f"{stuck:.1f} s")
        i = self.interval
        if silent > PROBE_AFTER_INTERVALS * i and now - self.pinged >= i:
            self.pinged = now
            return Ping.PROBE
        # Anything written proves us alive as well as a PING, except for the clock it carries.
        if (now - max(self.last_tx, self.pinged) > i - self.step / 2
                or now - self.pinged >= CLOCK_REFRESH_INTERVALS * i):
            self.pinged = now
            return Ping.HEARTBEAT
        return None
