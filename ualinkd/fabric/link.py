"""FabricLink: this node's TCP links to every other node of the pod (trio), the facade the agent
and the node use. It listens, dials the peers, authenticates (auth.py), then runs a Session
per peer (session.py) on a Conn (conn.py) with one reader and one writer task; reconnects
with backoff. Sends and requests are answered by Completions. When each pair is linked (at
start, or on its first use, the other node knocking), how often dials are retried and how
many run at once is fabric/dialing.py's policy.

Before a connection has authenticated it costs little and cannot make us hold much
(admission.py: the limits on handshakes in progress, the refusals' log). A new connection
never replaces a live link to the same peer: the old link is probed, and only if it misses
two heartbeats does the newcomer take over; else the newcomer is refused.

Data channels (plain TCP only): a link's second connection, handed over to the C data
plane, are channels.py's (ChannelKeeper).

Timers: each link's Session decides its own (requests' deadlines; heartbeats, probes and
death, liveness.py) with time as an input; one task (`_timers`) sleeps until the first
Session's `get_timer()` and calls its `handle_timer(now)`, then writes what it queued or
drops the link. Liveness's due times share one grid, so the links' timers come together.

An established connection's byte pump, flow control and held ACKs are conn.py's; what
sends wait for is the Session's (session.py); what waits for a link that is down,
parking.py's.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import heapq
import itertools
import logging
import math
import secrets
import ssl
from collections.abc import Callable, Sequence
from typing import Any

import trio

from ..config import ConfigError, PodConfig
from ..drm.completion import Completion
from ..drm.errors import DrmError
from ..drm.loaded import Loaded
from . import admission, dialer, dialing
from .auth import (
    HANDSHAKE_TIMEOUT,
    AuthError,
    NonceCache,
    ServerHandshake,
    node_keys,
)
from .channels import ChannelKeeper, DataChannels, NoRoom
from .conn import (
    Conn,
    HeldAcks,
    LinkDown,
    OnMessage,
    OnRequest,
    PingWaiter,
    tune,
)
from .dialer import Dialer, ProofTaken, handshake, parse_address
from .liveness import Liveness
from .parking import (
    Failed,
    Parked,
    ParkedLines,
    failed_batch,
    parked_batch_failed,
    parked_request_failed,
    pass_on,
)
from .session import (
    BatchWait,
    Event,
    IncarnationReceived,
    PongReceived,
    RequestWait,
    SendOutcome,
    Session,
)
from .splice import unread
from .wire import (
    Channel,
    Dwords,
    FrameDecoder,
    LocalProtocolError,
    ProtocolError,
)

log = logging.getLogger(__name__)

OnPeerState = Callable[[str, bool], None]


# What the link's timer heap holds: a connection whose Session's timer is due then (unless
# it moved: `Conn.timer_at`), or a parked use of a link that is down.
_Timed = Parked | Conn


class FabricLink:
    """The fabric seen from node `node_name`: one authenticated connection per peer node.

    `on_message(src_accel, dst_accel, dwords)` is called synchronously from the reader task of
    the connection the message came in on, in arrival order, after its ACK has been queued;
    it must not raise (an exception from it is a bug and propagates out of `run`).
    `on_request(peer, Load | Store) -> (status, buffers)` serves the data plane (the daemon
    resolves the NPA through its page table); without it LOAD/STORE are answered with
    -EOPNOTSUPP.

    `data_channels`: each link gets a data channel too, a second connection between the same
    two daemons authenticated the same way (auth.py, channel 1) and then handed over to it:
    the side that dialed the link dials it once the link is up, the other admits it only
    while it has a live link from that peer, and it is closed when that link goes down. A
    fast path only (the link carries everything without one): a data channel that cannot be
    had is one INFO line, not retried until the link comes up again. Plain TCP only: the
    data plane on the other side of `data_channels` speaks no TLS, so with TLS configured no
    data channel is dialed and none is admitted. Python sends nothing on a data channel past
    its handshake.
    """

    def __init__(self, config: PodConfig, node_name: str, on_message: OnMessage, *,
                 ack_timeout: float | None = None,
                 connect_backoff: tuple[float, float] = (0.05, 2.0),
                 ssl_context: ssl.SSLContext | None = None,
                 ssl_client_context: ssl.SSLContext | None = None,
                 on_peer_state: OnPeerState | None = None,
                 on_request: OnRequest | None = None,
                 handshake_timeout: float = HANDSHAKE_TIMEOUT,
                 heartbeat_interval: float = 1.0,
                 heartbeat_timeout: float = 5.0,
                 max_pending: tuple[int, int] = (admission.MAX_PENDING_HANDSHAKES,
                                                 admission.MAX_PENDING_PER_ADDRESS),
                 data_channels: DataChannels | None = None,
                 local_incarnation: Callable[[int], int] | None = None) -> None:
        self.config = config
        self.node_name = node_name
        self._me = config.node(node_name)
        self._keys = node_keys(config, node_name)
        self._on_message = on_message
        self._on_peer_state = on_peer_state
        self._on_request = on_request
        self.ack_timeout = (config.send_ack_timeout_ms / 1000 if ack_timeout is None
                            else ack_timeout)
        self._backoff = connect_backoff
        self._ssl_server = ssl_context
        self._ssl_client = ssl_client_context or ssl_context
        self._held_acks = HeldAcks()
        # The run's clock (trio.current_time() is it behind two wrappers: three Python calls
        # where this is one), read on every send and request; set once running.
        self._now: Callable[[], float] = trio.current_time
        self._handshake_timeout = handshake_timeout
        self._hb_interval = heartbeat_interval
        self._hb_timeout = heartbeat_timeout
        self._local_accels = frozenset(a.accel_id for a in self._me.accels)
        self._owner = {a.accel_id: n.name for n in config.nodes for a in n.accels}
        self._accels = {n.name: frozenset(a.accel_id for a in n.accels) for n in config.nodes}
        self._peers = sorted(n.name for n in config.nodes if n.name != node_name)
        self._addresses = {n.name: n.address for n in config.nodes}
        parse_address(self._me.address)  # ours must be usable; a peer's may come later
        self._address_changed = {p: trio.Event() for p in self._peers}
        self._conns: dict[str, Conn] = {}
        self._up = {p: trio.Event() for p in self._peers}
        self._nonces = NonceCache()
        self._pending = admission.PendingHandshakes(*max_pending)
        self._refusals = admission.Refusals(node_name, admission.REFUSAL_LOG_INTERVAL)
        self._progress = trio.lowlevel.ParkingLot()
        self._ever_up: set[str] = set()
        self._scope: trio.CancelScope | None = None
        self._nursery: trio.Nursery | None = None
        self._stopped = trio.Event()
        self._closed = False
        # The waits that end at a deadline (a request's, a batch's, a parked batch's), by
        # deadline, and the event that wakes `_timers` when one sooner than its sleep comes.
        # (deadline, tie-break, waiter): ties broken in order, never by the waiter.
        self._deadlines: list[tuple[float, int, _Timed]] = []
        self._deadline_ids = itertools.count()
        self._timer_moved = trio.Event()
        # Per peer whose link is down: the batches waiting for it, in the order they were sent.
        self._parked = ParkedLines(self.ack_timeout)
        self.port: int | None = None
        # §13 N2: our accels' manager incarnations (from whoever runs the managers; None:
        # nothing to announce), and the peers' as their links last announced them.
        self.local_incarnation = local_incarnation
        self._peer_incarnations: dict[int, int] = {}
        # §13 N4: a send that cannot be posted (its link is down) fails at once, as the
        # newest kernel's; quirk "send-fail-slow": it waits in line for the link (U polled
        # its ACK for the 2 s).
        self._post_fails_fast = "send-fail-slow" not in config.kernel_quirks
        # fabric/dialing.py: every pair linked at start, or each on its first use (a knock
        # from the node that does not dial); dials in their handshake at once are limited.
        self.links_at_start = dialing.links_at_start(config.fabric_links, len(config.nodes))
        self._first_use = dialing.FirstUse(config.response_timeout_ms / 1000)  # (§5.4's wait)
        self._dialer = Dialer(config, node_name, self._keys, handshake_timeout,
                              self._ssl_client)
        # The data plane behind `data_channels` reads and writes the socket itself: no TLS.
        self._channels = ChannelKeeper(
            node_name, data_channels, self._ssl_server is None and self._ssl_client is None,
            self._conns, self._accels, self._dialer, config.tcp_congestion, connect_backoff,
            min(heartbeat_timeout, 2 * heartbeat_interval, handshake_timeout / 2))
        self._down: dict[str, trio.Event] = {}  # per peer with a link: set when it goes

    # -- queries -----------------------------------------------------------------------------
    def is_up(self, node_name: str) -> bool:
        return node_name in self._conns

    def link_state(self, node_name: str) -> str:
        """ualink_fabric's state of the link (dialing.UP, DOWN, UNLINKED, LINKING)."""
        if node_name in self._conns:
            return dialing.UP
        if self.links_at_start:
            return dialing.DOWN
        return self._first_use.down_state(node_name, trio.current_time())

    def peer_of(self, accel_id: int) -> str | None:
        """The node that owns `accel_id`, or None."""
        return self._owner.get(accel_id)

    def set_peer_address(self, node_name: str, address: str) -> None:
        """Where `node_name` listens now (nodes started on ephemeral ports); redials at once."""
        if node_name not in self._address_changed:
            raise ConfigError(f"{node_name!r} is not a peer of {self.node_name!r}")
        parse_address(address)
        self._addresses[node_name] = address
        self._address_changed[node_name].set()
        self._address_changed[node_name] = trio.Event()

    # -- running -----------------------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen on our address, keep the links up; `task_status.started(bound_port)`."""
        host, port = parse_address(self._addresses[self.node_name])
        trio.lowlevel.add_instrument(self._held_acks)
        self._now = trio.lowlevel.current_clock().current_time
        try:
            with trio.CancelScope() as self._scope:
                listeners = await trio.open_tcp_listeners(port, host=host)
                self.port = listeners[0].socket.getsockname()[1]
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._refusals.run)
                    nursery.start_soon(self._timers)
                    self._nursery = nursery
                    for listener in listeners:
                        nursery.start_soon(self._accept_loop, listener, nursery)
                    for peer in self._peers:
                        if self.links_at_start and dialing.dials(self.node_name, peer):
                            nursery.start_soon(self._dial_loop, peer)
                    log.debug("fabric %s: listening on %s:%d", self.node_name, host, self.port)
                    task_status.started(self.port)
        finally:
            with contextlib.suppress(KeyError):  # (not there if it ever raised: trio drops it)
                trio.lowlevel.remove_instrument(self._held_acks)
            self._held_acks.held.clear()
            self._closed = True
            self._deadlines.clear()  # (their connections, now closed, failed them)
            for ev in self._up.values():  # wake pings waiting for a link: they fail now
                ev.set()
            self._parked.fail_all(DrmError(errno.ESHUTDOWN, "the fabric link is closed"),
                                  trio.current_time())
            self._stopped.set()

    async def aclose(self, grace: float = 0.5) -> None:
        """Flush what is queued (up to `grace` seconds), then close every connection."""
        with trio.move_on_after(grace):
            while any(c.writing or c.has_data_to_send for c in self._conns.values()):
                await self._progress.park()
        if self._scope is not None:
            self._scope.cancel()
            await self._stopped.wait()
        self._closed = True

    async def _accept_loop(self, listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        async with listener:
            while True:
                try:
                    stream = await listener.accept()
                except OSError as e:  # EMFILE and friends: back off, keep serving
                    log.warning("fabric %s: accept failed: %s", self.node_name, e)
                    await trio.sleep(self._backoff[0])
                    continue
                nursery.start_soon(self._serve_inbound, stream)

    @property
    def pending_handshakes(self) -> int:
        """Inbound connections that have not finished their handshake yet."""
        return self._pending.total

    async def _serve_inbound(self, tcp: trio.SocketStream) -> None:
        try:
            host, port = tcp.socket.getpeername()[:2]
            addr = f"{host}:{port}"
        except OSError:
            host = addr = "?"
        why = self._pending.refusal(host)
        if why is not None:
            self._refusals.note(addr, host, why, trio.current_time())
            await trio.aclose_forcefully(tcp)
            return
        self._pending.start(host)
        try:
            admitted = await self._authenticate_inbound(tcp, host, addr)
        finally:
            self._pending.end(host)
        if admitted is not None:
            peer, stream, decoder, channel_key = admitted
            await self._run_conn(peer, stream, decoder, f"from {addr}",
                                 channel_key=channel_key)

    async def _authenticate_inbound(self, tcp: trio.SocketStream, host: str, addr: str
                                    ) -> tuple[str, trio.abc.Stream, FrameDecoder, bytes] | None:
        """The handshake of an inbound connection, and the check that it does not displace
        a live link: (peer, stream, decoder, its data channels' key), or None when refused
        (and closed) or when it was a data channel (handed over, and closed here)."""
        stream: trio.abc.Stream = tcp
        hs = ServerHandshake(self.config, self.node_name, now=trio.current_time(),
                             nonces=self._nonces, keys=self._keys,
                             accept_from=[p for p in self._peers if not self.links_at_start
                                          or dialing.dials(p, self.node_name)],
                             timeout=self._handshake_timeout)
        decoder = FrameDecoder.for_handshake()
        counted: list[str] = []  # the peer, once this link is `admitting` (channels.py)
        data_link: list[Conn] = []  # a data channel: the link it belongs to

        async def before_ok() -> None:
            assert hs.peer_name is not None
            if hs.channel is Channel.DATA:
                data_link.append(await self._channels.admit(hs.peer_name, decoder,
                                                            hs.link_nonces[0]))
            elif not dialing.dials(hs.peer_name, self.node_name):  # (on first use only)
                self._want(hs.peer_name)
                raise dialing.Knocked(hs.peer_name)
            else:  # from its AUTH_OK on, the peer may dial this link's data channel
                self._channels.admitting(hs.peer_name)
                counted.append(hs.peer_name)

        try:
            with trio.move_on_at(hs.deadline) as within:
                if self._ssl_server is not None:
                    stream = trio.SSLStream(tcp, self._ssl_server, server_side=True)
                    await stream.do_handshake()
                    hs.cert_names = admission.cert_names(stream)
                await handshake(stream, hs, decoder, [], before_ok)
            if within.cancelled_caught:  # (also after the proof: in before_ok, or AUTH_OK)
                raise AuthError(f"handshake not finished within {hs.timeout:g} s")
            hs.check_deadline(trio.current_time())
            assert hs.peer_name is not None
            if data_link:
                self._channels.hand_over_inbound(data_link[0], tcp, addr)
                await trio.aclose_forcefully(stream)  # (the data plane has its dup)
                return None
            if not await self._old_link_gone(hs.peer_name):
                raise LinkDown(f"a live link to {hs.peer_name} exists (it answered a "
                                "liveness probe); a second connection does not replace it")
        except dialing.Knocked:
            log.debug("fabric %s: %s (%s) asks for our link: dialing it", self.node_name,
                      hs.peer_name, addr)
            await trio.aclose_forcefully(stream)
            return None
        except NoRoom as e:  # (not a hostile connection: the data plane said it is full)
            log.debug("fabric %s: %s (%s): %s", self.node_name, hs.peer_name, addr, e)
            await trio.aclose_forcefully(stream)
            return None
        except (ProtocolError, LinkDown, trio.BrokenResourceError, OSError) as e:
            who = f"{hs.peer_name} ({addr})" if hs.peer_name else addr
            self._refusals.note(who, host, admission.reason(e), trio.current_time())
            await trio.aclose_forcefully(stream)
            return None
        finally:
            for peer in counted:  # (no checkpoint from here to the link's start: _run_conn)
                self._channels.admitted(peer)
        decoder.open_data_plane()
        tune(tcp, self.config.tcp_congestion)
        return hs.peer_name, stream, decoder, hs.channel_key()

    async def _old_link_gone(self, peer: str) -> bool:
        """True when no live link to `peer` stands in the way of a new one. A link that is
        there is sent a PING: whatever it receives within two heartbeat intervals (a PONG
        takes one round trip; the peer sends something, a heartbeat at least, about every
        interval) proves it alive (False); a link that misses that many heartbeats is
        dropped as dead (True). Short, so that a peer that redialed because it lost the old
        link is not left waiting."""
        probe = min(self._hb_timeout, 2 * self._hb_interval)
        while (old := self._conns.get(peer)) is not None and old.down is None:
            start = trio.current_time()
            # With our clock: a PING carries it, and the peer stamps its requests from it.
            # Not a heartbeat: this one is answered (a PONG in one round trip).
            old.session.send_ping(secrets.randbits(64) or 1, track=False,
                                  now=trio.current_time())
            old.flush()
            with trio.move_on_after(probe):
                while old.down is None and old.live.last_rx <= start:
                    await trio.sleep(min(0.02, self._hb_interval))
            if old.down is None and old.live.last_rx > start:
                return False
            old.drop(LinkDown(f"silent for {probe:g} s after a liveness probe (a new "
                               "connection came)", logging.WARNING))
        return True

    async def _dial_loop(self, peer: str) -> None:
        backoff = dialing.Backoff(*self._backoff)
        last: tuple[object, ...] | None = None  # the kind of the last failure
        # A pod's nodes start in any order, so a refused dial in the first seconds is the
        # normal case: failures are DEBUG until the peer has been unreachable for
        # DIAL_WARN_AFTER (its retry budget), then one WARNING, and again when the kind
        # of failure changes. That grace is for refused and timed-out connections only:
        # something on the peer's port that fails the handshake (a wrong key or pod, an
        # impostor while the peer restarts, TLS verification) is no restarting peer, and
        # is a WARNING at once, once per kind until a link is up again.
        failing_since: float | None = None
        warned = False
        rejected: set[tuple[object, ...]] = set()  # the kinds of those warned of
        while True:
            changed = self._address_changed[peer]
            host, port = self._peer_address(peer)
            if port == 0:  # not known yet (ephemeral port, no address): set_peer_address
                await changed.wait()
                continue
            try:
                stream, decoder, channel_key = await self._dialer.dial(peer, host, port)
            except (ProtocolError, LinkDown, OSError, trio.BrokenResourceError) as e:
                # WARNING when the failure is new or of another kind than the last (refused,
                # then an impostor answering: both are news); each repeat at DEBUG.
                reason = admission.reason(e)
                kind = (type(e), admission.cause(reason))
                now = trio.current_time()
                failing_since = now if failing_since is None else failing_since
                lasting = now - failing_since >= dialer.DIAL_WARN_AFTER
                if admission.rejected_by_peer(e):
                    loud = kind not in rejected
                    rejected.add(kind)
                else:
                    loud = lasting and (not warned or kind != last)
                    warned = warned or loud
                log.log(logging.WARNING if loud else logging.DEBUG,
                        "fabric %s: cannot link to %s at %s:%d%s: %s (retrying)",
                        self.node_name, peer, host, port,
                        f" for {now - failing_since:.0f} s" if lasting else "", reason)
                last = kind
                with trio.move_on_after(backoff.next_delay()):
                    await changed.wait()
                continue
            last, failing_since, warned = None, None, False
            rejected.clear()
            backoff.reset()
            await self._run_conn(peer, stream, decoder, f"to {host}:{port}", (host, port),
                                 channel_key)
            with trio.move_on_after(backoff.next_delay()):
                await changed.wait()

    def _peer_address(self, peer: str) -> tuple[str, int]:
        """Where `peer` listens; port 0 while that is not known (an ephemeral port not set
        yet, no address: set_peer_address)."""
        try:
            return parse_address(self._addresses[peer])
        except ConfigError:
            return "", 0

    def _want(self, peer: str) -> None:
        """A use of the link with `peer` (links on first use): its dial loop, or its knock
        loop on the side that does not dial, starts the first time."""
        if (not self.links_at_start and self._nursery is not None and not self._closed
                and self._first_use.want(peer, trio.current_time())):
            self._nursery.start_soon(self._dial_loop if dialing.dials(self.node_name, peer)
                                     else self._knock_loop, peer)

    def _setting_up(self, peer: str | None) -> bool:
        """A use of `peer`'s link, which is not up: wanted now, and True while it is being
        set up for its first use (the use waits for it), False once the peer counts as
        unreachable (dialing.FirstUse)."""
        if self.links_at_start or peer not in self._up or self._closed:
            return False
        self._want(peer)
        return self._first_use.setting_up(peer, trio.current_time())

    async def _knock_loop(self, peer: str) -> None:
        """The link with `peer`, which dials it, asked for and kept (dialing.py): a knock (a
        link handshake the peer refuses once it has proved us, then dials back) whenever
        the link is down, with the dial loop's backoff while no link comes."""
        backoff = dialing.Backoff(*self._backoff)
        failing_since: float | None = None
        warned = False
        while not self._closed:
            if peer in self._conns:
                backoff.reset()
                failing_since, warned = None, False
                await self._down.setdefault(peer, trio.Event()).wait()
                continue
            host, port = self._peer_address(peer)
            if port == 0:  # not known yet (ephemeral port, no address): set_peer_address
                await self._address_changed[peer].wait()
                continue
            try:
                stream, decoder, channel_key = await self._dialer.dial(peer, host, port)
            except (ProtocolError, LinkDown, OSError, trio.BrokenResourceError) as e:
                now = trio.current_time()
                failing_since = now if failing_since is None else failing_since
                knocked = isinstance(e, ProofTaken)
                # One WARNING once the peer has been unreachable for DIAL_WARN_AFTER (as a
                # dial loop's), none for a knock heard.
                loud = not knocked and not warned and now - failing_since >= dialer.DIAL_WARN_AFTER
                warned = warned or loud
                log.log(logging.WARNING if loud else logging.DEBUG,
                        "fabric %s: asking %s at %s:%d for our link: %s", self.node_name,
                        peer, host, port, "it dials back" if knocked else admission.reason(e))
                # Heard: its dial back may wait its turn there (dialing.DIAL_CONCURRENCY),
                # and each knock again would cost it a handshake.
                wait = self._handshake_timeout if knocked else backoff.next_delay()
                with trio.move_on_after(wait):
                    await self._up[peer].wait()
                continue
            # A peer that links at start took us as its dialer: the link is this one.
            await self._run_conn(peer, stream, decoder, f"to {host}:{port}",
                                 (host, port), channel_key)

    # -- an established connection -----------------------------------------------------------
    async def _run_conn(self, peer: str, stream: trio.abc.Stream, decoder: FrameDecoder,
                        label: str, dialed: tuple[str, int] | None = None,
                        channel_key: bytes = b"") -> None:
        """Run the link `stream` to `peer` until it ends; `dialed`: the address we dialed it
        at, where its data channel is dialed too (`data_channels`)."""
        now = trio.current_time()
        session = Session(peer, self._accels[peer], self._local_accels, decoder, now=now,
                          liveness=Liveness(self._hb_interval, self._hb_timeout, now))
        conn = Conn(peer, stream, session, label, node=self.node_name,
                    on_message=self._on_message, dispatch=self._dispatch,
                    on_request=self._on_request, on_progress=self._progress.unpark_all)
        conn.channel_key = channel_key
        conn.held_acks = self._held_acks
        old = self._conns.get(peer)
        if old is not None:  # the peer redialed: its old connection is dead to it
            old.drop(LinkDown(f"replaced by a new connection {label}"))
        self._conns[peer] = conn
        self._up[peer].set()
        self._first_use.up(peer)
        # Linked on first use, the pair is wanted by both sides from now on, whichever used
        # it first: the side that does not dial knocks again when it drops (dialing.py).
        self._want(peer)
        if self.local_incarnation is not None:  # (ahead of anything else we send it)
            for accel in sorted(self._local_accels):
                session.send_incarnation(accel, self.local_incarnation(accel))
        self._unpark(peer, conn)
        # The first link to a peer is the normal start (DEBUG); one after it went down is news.
        again = peer in self._ever_up
        self._ever_up.add(peer)
        log.log(logging.INFO if again else logging.DEBUG, "fabric %s: link to %s up%s (%s)",
                self.node_name, peer, " again" if again else "", label)
        if old is None and self._on_peer_state is not None:
            self._on_peer_state(peer, True)
        try:
            with conn.scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(conn.read)
                    nursery.start_soon(conn.write)
                    # The peer speaks PROTOCOL_VERSION (the handshake admits no other), which
                    # has data channels; in this nursery, the dial ends with the link.
                    if dialed is not None and self._channels.tcp:
                        nursery.start_soon(self._channels.keep, conn, *dialed)
                    # Our link clock at once: the peer's deadlines need it (Session).
                    session.send_heartbeat(now=trio.current_time())
                    conn.flush()
                    self._arm(conn, conn.live.next_due())
        finally:
            self._channels.close(conn)  # first: the data plane stops using the peer
            conn.fd = -1  # nothing writes to the fd number once it is closed (and reused)
            if self._conns.get(peer) is conn:
                del self._conns[peer]
                self._up[peer] = trio.Event()
                self._down.pop(peer, trio.Event()).set()  # (a knock loop waits for it)
                for accel in self._accels[peer]:  # (unreadable until it announces again)
                    self._peer_incarnations.pop(accel, None)
                if self._on_peer_state is not None:
                    self._on_peer_state(peer, False)
            # After the link is gone: a waiter's callback (a batch's outcomes)
            # that sends to this peer again parks that send for the next link, as a task
            # woken here did when it ran.
            conn.session.close(trio.current_time())
            for w in conn.pings.values():
                w.set(None)
            down = conn.down or LinkDown("closed")
            if conn.expired > 1:
                log.info("fabric %s: %d requests from %s refused past their deadline",
                         self.node_name, conn.expired, peer)
            # A link we closed ourselves (stopping: cancelled, nothing went wrong) is DEBUG;
            # a peer that left or a failure is news.
            quiet = (self._closed or conn.down is None) and down.level <= logging.INFO
            log.log(logging.DEBUG if quiet else down.level, "fabric %s: link to %s (%s) down: %s",
                    self.node_name, peer, label, down)
            self._progress.unpark_all()
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)

    def _dispatch(self, conn: Conn, ev: Event) -> None:
        """What `conn`'s reader decoded, other than a request (Conn serves those)."""
        if isinstance(ev, IncarnationReceived):
            self._peer_incarnations[ev.accel] = ev.incarnation
        elif isinstance(ev, PongReceived):
            waiter = conn.pings.pop(ev.token, None)
            if waiter is not None:
                waiter.set(ev)

    # -- sending -----------------------------------------------------------------------------
    def _route_error(self, dst_accel: int, src_accel: int) -> DrmError | None:
        """Why nothing from `src_accel` to `dst_accel` can go over this fabric, if so."""
        peer = self._owner.get(dst_accel)
        if peer is None:
            return DrmError(errno.EINVAL, f"no node owns accel {dst_accel}")
        if peer == self.node_name:
            return DrmError(errno.EINVAL, f"accel {dst_accel} is local, not across the fabric")
        if src_accel not in self._local_accels:
            return DrmError(errno.EINVAL, f"accel {src_accel} is not on {self.node_name}")
        if self._closed:
            return DrmError(errno.ESHUTDOWN, "the fabric link is closed")
        return None

    def send(self, src_accel: int, dst_accel: int, dwords: Dwords) -> Completion[None]:
        """Send one UALink message; it completes once the peer accepted it (spec §5.1).

        Its error (set_error): DrmError ETIME (no ACK within ack_timeout, the link dropped
        before it came, or §13 N4: the link is down and it cannot be posted), ECOMM (the
        peer refused it), EINVAL (no such remote accel), ESHUTDOWN (closed). `send_batch`
        of one message, its outcome raised.
        """
        def raised(c: Completion[list[SendOutcome]]) -> None:
            ((err, _),) = c.result()
            if err is not None:
                raise err

        return self.send_batch(src_accel, dst_accel, (dwords,)).then(raised)

    def send_batch(self, src_accel: int, dst_accel: int,
                   messages: Sequence[Dwords]) -> Completion[list[SendOutcome]]:
        """`send` for several messages to one accel: all queued, in order, before this
        returns when the link is up (so they keep their place among the caller's sends) and
        written with one flush; their ACKs complete one Completion (in the reader's call
        that brings the last, the link's teardown, or the timer task at the deadline:
        ack_timeout from now, as for sends started together). It gives each message's
        outcome, in order: None or the DrmError `send` gives, with the time it became known
        (its ACK's arrival; the deadline or the link's drop for one that never came).

        When the link is down (§13 N4) they fail at once with ETIME, not posted; with
        quirk send-fail-slow they wait in line for it until the deadline, queued as it
        comes up (`_unpark`)."""
        c: Completion[list[SendOutcome]]
        now = self._now()
        peer = self._owner.get(dst_accel)
        if not messages:
            c = Completion()
            c.set_result([])
            return c
        err = self._route_error(dst_accel, src_accel)
        if err is not None:
            return failed_batch(err, now, len(messages))
        assert peer is not None
        conn = self._conns.get(peer)
        if conn is not None:
            return self._queue_batch(conn, src_accel, dst_accel, messages,
                                     now + self.ack_timeout)
        setting_up = self._setting_up(peer)
        if self._post_fails_fast and not setting_up:
            # §13 N4: the copy engine's post fails, at once
            return failed_batch(DrmError(errno.ETIME, f"{peer} is not reachable: not posted"),
                             now, len(messages))
        # Set up for its first use, or quirk send-fail-slow: in line for the link.
        give_up = now + self.ack_timeout
        if setting_up:  # (first use: §5.4's wait)
            give_up = max(give_up, self._first_use.deadline(peer))
        return self._park(peer, give_up, lambda conn: self._queue_batch(
            conn, src_accel, dst_accel, messages, give_up), parked_batch_failed(len(messages)))

    def announce(self, accel: int, incarnation: int) -> None:
        """Our accel `accel` started manager incarnation `incarnation` (§13 N2): told to
        every peer whose link is up, ahead of what that accel sends next."""
        for conn in list(self._conns.values()):
            if conn.down is None:
                conn.session.send_incarnation(accel, incarnation)
                conn.flush()

    def incarnation(self, src_accel: int, dst_accel: int) -> int:
        """§13 N2's probe: remote accel `dst_accel`'s manager incarnation, as its link
        announced it; 0 while not known (its link has not brought it yet, or is being set up
        for its first use: the HELLO that follows waits for it). DrmError: EINVAL (no node
        owns it, or it is ours), ETIME (its link is down: the copy engine's read of an
        unreachable peer fails, §13 "ETIME on timeout", at once since nothing can be
        read)."""
        peer = self._owner.get(dst_accel)
        if peer is None or peer == self.node_name or src_accel not in self._local_accels:
            raise DrmError(errno.EINVAL, f"accel {dst_accel} is not across the fabric")
        conn = self._conns.get(peer)
        if (conn is None or conn.down is not None) and self._setting_up(peer):
            return 0  # (not known yet: the link comes up on this first use, dialing.py)
        if conn is None or conn.down is not None or self._closed:
            raise DrmError(errno.ETIME, f"{peer} is not reachable: cannot be probed")
        return self._peer_incarnations.get(dst_accel, 0)

    def _park(self, peer: str, give_up: float, queue: Callable[[Conn], Completion[Any]],
              failed: Failed) -> Completion[Any]:
        """A use of the link to `peer`, which is down: `queue(conn)` once it is up (in line
        with the others parked for it), or `failed` at `give_up`."""
        parked = self._parked.park(peer, give_up, queue, failed)
        self._deadline(give_up, parked)
        assert parked.completion is not None
        return parked.completion

    def _unpark(self, peer: str, conn: Conn) -> None:
        """The link to `peer` is up: queue what waited for it, in the order it was sent,
        before anyone can send anything else on it (a task woken by the link runs later,
        and trio runs the tasks of one wake-up in either order)."""
        now = trio.current_time()
        for parked in self._parked.take(peer):
            if parked.completion is None:
                continue
            if parked.give_up <= now:  # (its deadline is due: the wait is over)
                parked.expire(now)
                continue
            c, parked.completion = parked.completion, None
            try:
                queued = parked.queue(conn)
            except LocalProtocolError as e:  # (the sender's bug: raised to it)
                c.set_error(e)
            else:
                queued.when_done(functools.partial(pass_on, c))

    def _queue_batch(self, conn: Conn, src_accel: int, dst_accel: int,
                     messages: Sequence[Dwords], give_up: float | None = None
                     ) -> Completion[list[SendOutcome]]:
        """Queue `messages` on `conn` and write them; their ACKs go to one batch waiter,
        which gives up at `give_up` (ack_timeout from now by default)."""
        if give_up is None:
            give_up = self._now() + self.ack_timeout
        session = conn.session
        batch = BatchWait(conn.peer, session.send_messages(src_accel, dst_accel, messages),
                          self.ack_timeout)
        session.expect(batch, give_up)
        self._arm(conn, give_up)
        conn.flush()
        assert batch.completion is not None
        return batch.completion

    def _arm(self, conn: Conn, when: float) -> None:
        """`conn`'s Session has a timer due at `when`: the timer task calls its
        handle_timer then, if that is sooner than it would have."""
        if when < conn.timer_at:
            conn.timer_at = when
            self._deadline(when, conn)

    def _deadline(self, give_up: float, waiter: _Timed) -> None:
        if not self._deadlines or give_up < self._deadlines[0][0]:
            self._timer_moved.set()  # its sleep ends too late (or it has none)
        heapq.heappush(self._deadlines, (give_up, next(self._deadline_ids), waiter))

    def request(self, src_accel: int, dst_accel: int, npa_byte_addr: int,
                length_or_data: int | bytes) -> Completion[Loaded]:
        """Data plane: LOAD (`length_or_data` an int) or STORE (bytes) at an NPA byte address.

        Queued and written now; its DATA completes the Completion in the reader's call: the
        loaded bytes (b"" for a STORE; a payload the reader holds in a pipe, drm/loaded.py,
        for a large one on plain TCP). Its error: DrmError(EFAULT) when the peer is not
        reachable, did not answer within ack_timeout, or answered with an error (Emulator
        policy 3, 10); EINVAL when the accels do not go over the fabric.
        """
        c: Completion[Loaded]
        peer = self._owner.get(dst_accel)
        conn = self._conns.get(peer) if peer is not None else None
        err = None
        if peer in self._up and conn is None and not self._setting_up(peer):
            err = DrmError(errno.EFAULT, f"{peer} is not reachable")  # policy 3: at once
        else:
            err = self._route_error(dst_accel, src_accel)
        if err is not None:
            c = Completion()
            c.set_error(err)
            return c
        give_up = self._now() + self.ack_timeout
        if conn is None:  # (being set up for its first use: the request waits for it)
            assert peer is not None
            return self._park(peer, give_up, lambda conn: self._queue_request(
                conn, src_accel, dst_accel, npa_byte_addr, length_or_data, give_up),
                parked_request_failed(peer))
        return self._queue_request(conn, src_accel, dst_accel, npa_byte_addr, length_or_data,
                                   give_up)

    def _queue_request(self, conn: Conn, src_accel: int, dst_accel: int, npa_byte_addr: int,
                       length_or_data: int | bytes, give_up: float) -> Completion[Loaded]:
        session = conn.session
        waiter = RequestWait(conn.peer, session.send_request(
            src_accel, dst_accel, npa_byte_addr, length_or_data, now=self._now(),
            give_up=give_up))
        session.expect(waiter, give_up)
        self._arm(conn, give_up)
        completion = waiter.completion
        assert completion is not None  # (set only by the reader, later)
        conn.flush()
        return completion

    async def _timers(self) -> None:
        """aioquic's loop for every link at once: sleep until the first due timer (a
        Session's `get_timer()`, a parked use's deadline), then hand the time to it
        (`handle_timer(now)`). An entry whose connection's timer moved is dropped when it
        comes up (a Session drops its answered waits itself: in steady traffic a link's
        timer comes about once per ack_timeout)."""
        deadlines = self._deadlines
        while True:
            self._timer_moved = trio.Event()
            if not deadlines:
                await self._timer_moved.wait()
                continue
            with trio.move_on_at(deadlines[0][0]):
                await self._timer_moved.wait()
                continue
            now = trio.current_time()
            while deadlines and deadlines[0][0] <= now:
                when, _, target = heapq.heappop(deadlines)
                if isinstance(target, Parked):
                    if target.completion is not None:
                        target.expire(now)
                elif target.timer_at == when:
                    target.timer_at = math.inf
                    if target.down is None:
                        self._session_timer(target, now)

    def _session_timer(self, conn: Conn, now: float) -> None:
        """`conn`'s Session's timer is due: what the link sees goes in first (the two ways
        a link dies quietly: nothing received while reading, nothing taken while answers
        are held), then its handle_timer decides."""
        live, session = conn.live, conn.session
        if conn.paused:  # not reading, on purpose: silence means nothing
            live.last_rx = now
        elif conn.lowat > 1:  # the reader waits for most of a payload: is it coming in?
            queued = unread(conn.fd)
            if queued != conn.inq:
                conn.inq, live.last_rx = queued, now
        live.held, live.stuck_since = conn.held, conn.stuck_since  # (TLS: held in send_all)
        dead = session.handle_timer(now)
        if dead is not None:
            conn.drop(LinkDown(dead.reason, logging.WARNING))
            return
        conn.flush()  # (what it queued)
        nxt = session.get_timer()
        if nxt is not None:
            self._arm(conn, nxt)

    async def ping(self, node_name: str) -> float:
        """Round-trip time to `node_name` in seconds; DrmError(ETIME) after ack_timeout."""
        if node_name not in self._up:
            raise DrmError(errno.EINVAL, f"{node_name!r} is not a peer of {self.node_name!r}")
        self._setting_up(node_name)
        waiter = None
        start = math.nan
        with trio.move_on_after(self.ack_timeout):
            while (conn := self._conns.get(node_name)) is None:
                if self._closed:
                    raise DrmError(errno.ESHUTDOWN, "the fabric link is closed")
                await self._up[node_name].wait()
            token = secrets.randbits(64) or 1  # (0: a heartbeat, never answered)
            waiter = conn.pings[token] = PingWaiter()
            start = trio.current_time()
            conn.session.send_ping(token, now=start)
            conn.flush()
            try:
                await waiter.event.wait()
            finally:
                if not waiter.event.is_set():
                    conn.pings.pop(token, None)
                    conn.session.forget_ping(token)
        if waiter is None or waiter.result is None:
            raise DrmError(errno.ETIME, f"no PONG from {node_name}")
        return trio.current_time() - start
