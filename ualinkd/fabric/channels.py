"""Data channels (trio): a link's second connection, handed over to the C data plane.

A data channel (plain TCP only) is authenticated as its link is but asks for channel 1; the
side that dialed the link dials it once the link is up (`keep`), and its socket goes to the
data plane (`DataChannels`) until its link goes down. It never replaces a link, and is
admitted only while its link is live (`admit`). One the data plane finds broken while its
link lasts is dialed again (DataChannels.on_broken, DATA_REDIAL_MAX). Nor does a second
channel replace a healthy one (the link's rule, for channels): the link's own side redials
only once its channel broke, which closed it, and the data plane here sees that close at
once; a channel that comes while the link's channel stays healthy for `_old_channel_gone`'s
wait is refused (a WARNING naming it), whoever holds the link's key.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Protocol

import trio

from . import admission
from .auth import bound_nonce, bound_to
from .conn import Conn, LinkDown, tune
from .dialer import Dialer
from .wire import Channel, FrameDecoder, ProtocolError

log = logging.getLogger("ualinkd.fabric.link")

# A data channel that broke is dialed again after the link's first backoff, doubling up to
# this (s) while each new one breaks again within it (a peer whose channel keeps failing:
# a WARNING from the data plane per break, so a few a minute at most).
DATA_REDIAL_MAX = 30.0


class NoRoom(LinkDown):
    """A data channel refused in its handshake: our data plane has every channel in use."""


class DataChannels(Protocol):
    """Where an authenticated data channel's socket goes (the C data plane). Called from the
    trio thread; neither may block or raise (an exception is a bug: it propagates out of
    FabricLink.run)."""

    def open(self, peer: str, fd: int, peer_accels: frozenset[int]) -> int | None:
        """Takes ownership of `fd` (a dup of the socket, blocking mode unspecified: the callee
        sets it); returns a handle, or None when it refuses (it closed fd)."""

    def close(self, handle: int) -> None:
        """The link this channel belongs to went down: stop using and close it."""

    def clock(self, handle: int, origin: float, peer_clock: tuple[int, float] | None) -> None:
        """The link's clocks (Session.clocks), for the channel's STORE deadlines: at its
        open and at each PING of the peer's."""

    def has_room(self, dialing: int = 0) -> bool:
        """Whether `open` would take one more (`dialing` more being dialed): a channel is
        neither dialed nor admitted when not (its handshake would be wasted)."""

    # Set by the link: called (in the trio thread) with the handle of a channel the data
    # plane found broken and dropped itself; the link dials a new one if it dialed that.
    on_broken: Callable[[int], None] | None


class ChannelKeeper:
    """The data channels of node `node_name`'s links (`conns`, the link's table of them),
    for `plane` (None: this node takes none); `tcp`: the fabric is plain TCP (the data plane
    speaks no TLS, so with TLS configured no channel is dialed nor admitted)."""

    def __init__(self, node_name: str, plane: DataChannels | None, tcp: bool,
                 conns: dict[str, Conn], accels: dict[str, frozenset[int]], dialer: Dialer,
                 congestion: str, backoff: tuple[float, float],
                 probe_wait: float) -> None:
        self.node_name = node_name
        self.plane = plane
        self.tcp = plane is not None and tcp
        self._conns = conns
        self._accels = accels
        self._dialer = dialer
        self._congestion = congestion
        self._backoff = backoff
        self._probe_wait = probe_wait  # `_old_channel_gone`'s
        # Per peer: its inbound links between their AUTH_OK and their start (the old link's
        # probe), which a data channel from it waits out (`admit`).
        self._admitting: dict[str, int] = {}
        self._admitted = trio.lowlevel.ParkingLot()
        self._dialing = 0  # data channels being dialed (DataChannels.has_room)
        self._channel_broke = trio.lowlevel.ParkingLot()  # `_old_channel_gone`'s waits
        if plane is not None:
            plane.on_broken = self.broken

    def admitting(self, peer: str) -> None:
        """An inbound link from `peer` was told AUTH_OK: its data channel may come."""
        self._admitting[peer] = self._admitting.get(peer, 0) + 1

    def admitted(self, peer: str) -> None:
        """... and has started, or failed (no checkpoint from here to its start)."""
        self._admitting[peer] -= 1
        if not self._admitting[peer]:
            del self._admitting[peer]
        self._admitted.unpark_all()

    def close(self, conn: Conn) -> None:
        """`conn`'s link goes down: first, the data plane stops using the peer."""
        if conn.data_handle is not None:
            handle, conn.data_handle = conn.data_handle, None
            assert self.plane is not None
            self.plane.close(handle)

    async def admit(self, peer: str, decoder: FrameDecoder,
                                  nonce: bytes) -> Conn:
        """The link an authenticated data channel from `peer` belongs to, before it is told
        AUTH_OK: our live link from `peer`, which its client `nonce` must name (dialed by
        that link's end: auth.bound_to); LinkDown when there is none, or when the channel
        may not be had. One that comes while a link from `peer` is being admitted (its
        AUTH_OK sent, an old link probed) is that link's: it waits to see that link start,
        and is refused if it does not."""
        if self.plane is None:
            raise LinkDown("a data channel, and this node takes none")
        if not self.tcp:
            raise LinkDown("a data channel on a TLS fabric (data channels are plain TCP only)")
        if decoder.buffered:  # what the handover cannot pass on: the data plane reads the fd
            raise LinkDown(f"{decoder.buffered} bytes sent on a data channel before its "
                            "handshake finished")
        before = self._conns.get(peer)
        waited = False
        while self._admitting.get(peer):
            waited = True
            await self._admitted.park()
        conn = self._conns.get(peer)
        if conn is None or conn.down is not None or (waited and conn is before):
            raise LinkDown(f"a data channel from {peer} without a live link from it")
        if not bound_to(nonce, conn.channel_key):
            raise LinkDown(f"a data channel from {peer} not dialed by its live link's end "
                            "(it has the link's key, not the link's handshake)")
        if not await self._old_channel_gone(conn):
            raise LinkDown(f"a second data channel from {peer} while its link's channel is "
                            "healthy: it does not replace it")
        assert self.plane is not None
        if not self.plane.has_room():  # (last: one that may not be had says why)
            raise NoRoom("a data channel, and this node's data plane has no room for one")
        return conn

    async def _old_channel_gone(self, conn: Conn) -> bool:
        """True when the link `conn` holds no data channel, or the one it holds breaks
        within a short wait. The peer's own side dials a new channel only after its old one
        broke, and closed it: the data plane here sees that close (EOF, a reset) at once
        and drops the channel (DataChannels.on_broken). One that stays healthy is still in
        use by the link's peer: a newcomer with the link's key (a stolen or superseded
        config) must not take it over and answer that peer's loads."""
        with trio.move_on_after(self._probe_wait):
            while conn.data_handle is not None and conn.down is None:
                with trio.move_on_after(0.05):  # (woken by a break; the link's end polled)
                    await self._channel_broke.park()
        return conn.data_handle is None and conn.down is None

    def hand_over_inbound(self, conn: Conn, tcp: trio.SocketStream, addr: str) -> None:
        """An admitted data channel, told AUTH_OK: to the data plane, if its link is still
        up (else LinkDown)."""
        if conn.down is not None or self._conns.get(conn.peer) is not conn:
            raise LinkDown(f"a data channel from {conn.peer}: its link went down during "
                            "the handshake")
        tune(tcp, self._congestion)  # (this side sends the LOAD answers)
        if self._hand_over(conn, tcp):
            log.debug("fabric %s: data channel from %s (%s) handed over", self.node_name,
                      conn.peer, addr)
        else:
            log.info("fabric %s: the data plane refused the data channel from %s (%s); the "
                     "link carries its loads", self.node_name, conn.peer, addr)

    def _hand_over(self, conn: Conn, tcp: trio.SocketStream) -> bool:
        """A dup of `tcp`'s socket to `data_channels` as the data channel of the link `conn`,
        in place of one it had (the caller closes `tcp`); False if the data plane refused it.
        Synchronous: the link cannot end between the caller's check and the handle being
        `conn`'s (its teardown closes it)."""
        assert self.plane is not None
        fd = os.dup(tcp.socket.fileno())
        # (A channel that is there still, on the side that dialed it: the data plane has not
        # said it broke yet. The side that admits channels let none in while one was held.)
        if conn.data_handle is not None:
            old, conn.data_handle = conn.data_handle, None
            self.plane.close(old)
        conn.close_data = self.plane.close
        conn.data_clock = self.plane.clock
        conn.data_handle = self.plane.open(conn.peer, fd, self._accels[conn.peer])
        if conn.data_handle is not None:
            conn.clocks_pushed = None
            conn.push_clocks()
        return conn.data_handle is not None

    async def keep(self, conn: Conn, host: str, port: int) -> None:
        """The data channel of the link `conn`, which we dialed at host:port, for as long as
        `conn` lasts (this task is in its nursery). A first dial that fails is not repeated
        (the peer takes no channel: one INFO line, the link carries the loads). A channel
        that worked and broke while the link stayed up (a reset, a hostile frame) is dialed
        again, with the link's backoff, until one is handed over: the loads went back to
        the slower link path meanwhile, which must not last for the link's life."""
        delay = self._backoff[0]
        broke = False
        while True:
            conn.data_broken = trio.Event()
            if await self._dial(conn, host, port, quiet=broke):
                since = trio.current_time()
                await conn.data_broken.wait()
                if trio.current_time() - since >= DATA_REDIAL_MAX:
                    delay = self._backoff[0]  # (it had served a while: not one that keeps breaking)
                broke = True
            elif not broke:
                return
            await trio.sleep(delay)
            delay = min(delay * 2, DATA_REDIAL_MAX)

    def broken(self, handle: int) -> None:
        """DataChannels.on_broken: the data plane dropped the channel `handle`."""
        for conn in self._conns.values():
            if conn.data_handle == handle:
                conn.data_handle = None
                conn.data_broken.set()
        self._channel_broke.unpark_all()

    async def _dial(self, conn: Conn, host: str, port: int,
                                 quiet: bool = False) -> bool:
        """Dial the data channel of the link `conn` at host:port and hand it over to
        `data_channels`; True if it was. Failing is one INFO line (DEBUG when `quiet`: a
        redial, whose channel's break the data plane logged): the link carries the data
        plane without it."""
        assert self.plane is not None
        if not self.plane.has_room(self._dialing):  # (it said so, once)
            return False
        peer = conn.peer
        level = logging.DEBUG if quiet else logging.INFO
        self._dialing += 1  # (until the handover, in the same step as the dial's end)
        try:
            stream, decoder, _ = await self._dialer.dial(peer, host, port, Channel.DATA,
                                                  bound_nonce(conn.channel_key))
        except (ProtocolError, LinkDown, OSError, trio.BrokenResourceError) as e:
            log.log(level, "fabric %s: no data channel to %s at %s:%d: %s (the link carries "
                    "its loads)", self.node_name, peer, host, port, admission.reason(e))
            return False
        finally:
            self._dialing -= 1
        try:
            assert isinstance(stream, trio.SocketStream)  # (plain TCP: `tcp`)
            why = None
            if decoder.buffered:  # the handover could not pass them on
                why = f"{decoder.buffered} bytes came with its AUTH_OK"
            else:
                try:
                    if not self._hand_over(conn, stream):
                        why = "the data plane refused it"
                except OSError as e:
                    why = f"dup failed: {e.strerror}"
            if why is None:
                log.log(logging.INFO if quiet else logging.DEBUG,
                        "fabric %s: data channel to %s at %s:%d handed over%s", self.node_name,
                        peer, host, port, " again" if quiet else "")
            else:
                log.log(level, "fabric %s: no data channel to %s at %s:%d: %s (the link "
                        "carries its loads)", self.node_name, peer, host, port, why)
            return why is None
        finally:
            await trio.aclose_forcefully(stream)  # (the data plane has its dup)
