"""Who dials which peer, when, and how often: the fabric's dialing policy, sans-IO (time is
an input, randomness is injected), used by FabricLink (link.py) at its dial, accept and send
hooks.

**When.** A pod of up to AT_START_MAX_NODES nodes links every pair at start-up (`at-start`):
a full mesh of n(n-1)/2 links costs little there and a pod is usable with every link up. A
larger pod links a pair when it is first needed (`on-first-use`), as the kernel sets up a
connection on its first use (`amdgpu_ualink_setup_connection`, spec §5.4): the full mesh of
256 nodes is 32,640 links (65,280 connections with their data channels), whose handshakes
and heartbeats alone need more than two CPUs, while a pod's traffic needs the pairs that
share memory. `[pod] fabric_links` in the pod config chooses (`auto`: by the pod's size).

**Who.** One link per pair, dialed by the node whose name sorts first (`dials`), so two
nodes never dial each other at once. On first use the other node *knocks*: it dials and
proves itself as for a link (auth.py), and the node that dials answers by refusing that
connection and dialing back (`Knocked`); the link, its data channel and its redials are then
the dialer's as at start-up. Once wanted or up, a link is kept by both sides: it is dialed
again when it drops (a knocking node knocks again), as an at-start link is.

**How often.** Failed dials back off exponentially with jitter (`Backoff`: each delay drawn
from [d/2, d], d doubling up to its cap), so the dials of nodes that failed together do not
come back together; at most DIAL_CONCURRENCY dials of one node are in their handshake at a
time (a burst of first uses waits its turn rather than timing out in a crowd of handshakes).

**Until when.** A first use of a pair waits for its link (`FirstUse`), in the daemon, as the
kernel's `setup_connection` waits for its HELLO's answer: the probe of the peer (§13 N2)
finds it not known yet (and reads it once the connection is ESTABLISHED), and the HELLO waits
in line for the link until `FirstUse.deadline`, so the client's ioctl blocks rather than
spinning on EAGAIN. Once the pair has been tried for the pod's response timeout
(FIRST_USE_WAIT by default) with no link, the peer is unreachable, as after a link that
dropped: its uses fail at once with ETIME. A knock that is heard (the peer took our proof)
waits for the dial back for a handshake's time before knocking again.
"""

from __future__ import annotations

import random
from collections.abc import Callable

AT_START = "at-start"
ON_FIRST_USE = "on-first-use"
AUTO = "auto"
MODES = (AUTO, AT_START, ON_FIRST_USE)
# Pods up to this size link every pair at start (auto): 32 nodes is 496 links, all up in
# about 3 s on two CPUs; 64 nodes (2,016 links) took 9 s, 128 nodes (8,128) 167 s.
AT_START_MAX_NODES = 32
DIAL_CONCURRENCY = 64  # dials of one node in their handshake at a time
# How long a first use waits for its link before the peer counts as unreachable: the
# kernel's HELLO wait (setup_connection waits <= 5 s for hello_done, §5.4).
FIRST_USE_WAIT = 5.0
# A link's states in ualink_fabric (sysfs.show_fabric): up, or down; a pair linked on first
# use is not down the way a dropped link is until it has been up once: unlinked (no use yet)
# or linking (its first use waits for it).
UP, DOWN, UNLINKED, LINKING = "up", "down", "unlinked", "linking"


def links_at_start(mode: str, nodes: int) -> bool:
    """Whether a pod of `nodes` nodes with `[pod] fabric_links = mode` links every pair at
    start-up (else each pair on its first use)."""
    if mode not in MODES:
        raise ValueError(f"fabric_links {mode!r} is not one of {', '.join(MODES)}")
    return mode == AT_START or (mode == AUTO and nodes <= AT_START_MAX_NODES)


def dials(me: str, peer: str) -> bool:
    """Whether node `me` dials the link with `peer` (else it knocks, and `peer` dials)."""
    return me < peer


class Knocked(Exception):
    """An inbound link from a node that does not dial us, refused on purpose: it asked for
    the link, which we dial back."""


class Backoff:
    """Delays between the attempts of one dial loop: each drawn from [d/2, d], d starting at
    `first` and doubling up to `cap` after each failure; `reset()` after a success."""

    def __init__(self, first: float, cap: float,
                 rand: Callable[[], float] = random.random) -> None:
        if not 0 < first <= cap:
            raise ValueError(f"backoff {first}..{cap}: need 0 < first <= cap")
        self.first, self.cap = first, cap
        self._rand = rand
        self._d = first

    def next_delay(self) -> float:
        d = self._d
        self._d = min(d * 2, self.cap)
        return d / 2 + d / 2 * self._rand()

    def reset(self) -> None:
        self._d = self.first


class FirstUse:
    """The pairs this node wants linked on first use, and what a use of one that is not up
    yet gets. `want` starts a pair (True the first time: its dial or knock loop starts);
    `up` notes a link up (the pair has worked: a later drop is an unreachable peer, not a
    link being set up). Times are seconds on the caller's monotonic clock."""

    def __init__(self, wait: float = FIRST_USE_WAIT) -> None:
        self.wait = wait
        self._since: dict[str, float] = {}  # peer -> when first wanted
        self._linked: set[str] = set()  # peers whose link has been up

    def want(self, peer: str, now: float) -> bool:
        if peer in self._since:
            return False
        self._since[peer] = now
        return True

    def wanted(self, peer: str) -> bool:
        return peer in self._since

    def up(self, peer: str) -> None:
        self._linked.add(peer)

    def deadline(self, peer: str) -> float:
        """Until when a use of `peer`'s link, wanted, may wait for its first set-up."""
        return self._since[peer] + self.wait

    def down_state(self, peer: str, now: float) -> str:
        """What a link that is not up is, for ualink_fabric (sysfs.show_fabric): UNLINKED
        when no use has asked for it yet (nor has the peer linked it), LINKING while its
        first set-up is waited for, else DOWN (it dropped, or its peer is unreachable)."""
        if peer in self._linked:
            return DOWN
        if peer not in self._since:
            return UNLINKED
        return LINKING if self.setting_up(peer, now) else DOWN

    def setting_up(self, peer: str, now: float) -> bool:
        """Whether a use of `peer`'s link, not up now, is waiting for its first set-up
        (rather than finding a peer that cannot be reached)."""
        since = self._since.get(peer)
        return since is not None and peer not in self._linked and now - since < self.wait
