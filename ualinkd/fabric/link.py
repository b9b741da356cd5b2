"""FabricLink: this node's TCP links to every other node of the pod (trio). It listens, dials
the peers whose names sort after ours, authenticates (auth.py), then runs a Session per peer with
one reader and one writer task; reconnects with backoff; sends wait for the peer's ACK. When
each pair is linked (at start, or on its first use, the other node knocking), how often dials
are retried and how many run at once is fabric/dialing.py's policy.

Before a connection has authenticated it costs little and cannot make us hold much: its
decoder takes only handshake frames of handshake size (FrameDecoder.for_handshake), at most
MAX_PENDING_HANDSHAKES are in progress at a time and MAX_PENDING_PER_ADDRESS per source
address (more are closed at once), and each has HANDSHAKE_TIMEOUT to finish. Refusals are
logged one line per cause: the first at once, the rest as a count every REFUSAL_LOG_INTERVAL.
A new connection never replaces a live link to the same peer: the old link is probed, and
only if it misses two heartbeats does the newcomer take over; else the newcomer is refused.

Data channels (`DataChannels`, plain TCP only): a link's second connection, authenticated as
the link is but asking for channel 1, that the side that dialed the link dials once it is up;
its socket is handed over to the C data plane and closed when its link goes down. It never
replaces a link, and is admitted only while its link is live. One the data plane finds broken
while its link lasts is dialed again (DataChannels.on_broken, DATA_REDIAL_MAX). Nor does a
second channel replace a healthy one (the link's rule, for channels): the link's own side
redials only once its channel broke, which closed it, and the data plane here sees that
close at once; a channel that comes while the link's channel stays healthy for
`_old_channel_gone`'s wait is refused (a WARNING naming it), whoever holds the link's key.

A MSG's ACK waits, in the session, for the reply the MSG causes, to leave in the same write:
`_HeldAcks`, a trio instrument, writes what is still held when the scheduler is about to
wait (everything the MSGs woke has run), or after ACK_COALESCE_STEPS busy batches.

Timers: each link's Session decides its own (requests' deadlines; heartbeats, probes and
death, liveness.py) with time as an input; one task (`_timers`) sleeps until the first
Session's `get_timer()` and calls its `handle_timer(now)`, then writes what it queued or
drops the link. Liveness's due times share one grid, so the links' timers come together.

What a link holds is bounded, and a full bound stops reading, never drops what the peer sent
in order. A message whose receive ring is full waits in the link's inbox (acknowledged, in
order, up to INBOX_MAX), past which the reader waits too and TCP slows the sender; the inbox
lets the reader reach the ACKs that the ring's own handlers wait for. Data-plane answers held
for a peer that does not take them are capped at HOLD_MAX, past which its requests wait
unserved (DEFER_MAX of them), then reading stops; a peer that takes nothing for the
heartbeat timeout is dropped as not reading.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import heapq
import itertools
import logging
import math
import os
import re
import secrets
import socket
import ssl
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

import trio

from ..config import ConfigError, PodConfig
from ..drm.completion import Completion
from ..drm.errors import DrmError
from ..drm.loaded import Loaded
from . import dialing
from .auth import (
    HANDSHAKE_TIMEOUT,
    AuthError,
    ClientHandshake,
    NonceCache,
    ServerHandshake,
    bound_nonce,
    bound_to,
    node_keys,
)
from .liveness import Liveness
from .session import (
    BatchWait,
    IncarnationReceived,
    MessageReceived,
    PongReceived,
    RequestReceived,
    RequestWait,
    SendOutcome,
    Session,
)
from .splice import PipedPayload, PipePool, unread
from .wire import (
    DATA_HEADER_SIZE,
    Channel,
    Dwords,
    Frame,
    FrameDecoder,
    FrameType,
    Load,
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
    Store,
    _NeedData,
    encode_frame,
)

log = logging.getLogger(__name__)

# May return an awaitable: the message is taken once it completes, and nothing more is read
# from that peer meanwhile (back-pressure).
OnMessage = Callable[[int, int, Dwords], Awaitable[None] | None]
OnPeerState = Callable[[str, bool], None]
# -> (status: 0 or -errno, the loaded bytes as buffers to send as they are)
OnRequest = Callable[[str, Load | Store], tuple[int, list[memoryview]]]


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

    # Set by the link: called (in the trio thread) with the handle of a channel the data
    # plane found broken and dropped itself; the link dials a new one if it dialed that.
    on_broken: Callable[[int], None] | None


RECEIVE_SIZE = 1 << 20  # one data-plane chunk in as few reads as possible (TLS)
SCRATCH_SIZE = 64 << 10  # plain TCP: per-connection receive buffer for everything but payloads
HANDSHAKE_RECEIVE_SIZE = 4096  # handshake frames are at most HANDSHAKE_MAX_FRAME bytes
# Unauthenticated connections in progress: in all, and from one source address (a local pod
# of up to 250 nodes dials from 127.0.0.1; its handshakes take milliseconds).
MAX_PENDING_HANDSHAKES = 512
MAX_PENDING_PER_ADDRESS = 64
REFUSAL_LOG_INTERVAL = 5.0
DIAL_WARN_AFTER = 10.0  # s a peer may stay unreachable before it is worth a WARNING
# A data channel that broke is dialed again after the link's first backoff, doubling up to
# this (s) while each new one breaks again within it (a peer whose channel keeps failing:
# a WARNING from the data plane per break, so a few a minute at most).
DATA_REDIAL_MAX = 30.0
# Per connection: bytes of answers held for a peer (beyond its socket buffers) before its
# further requests wait unserved; how many may wait (and their STORE bytes) before reading
# from it stops. A few transfers' worth of chunks (agent.CHUNK, agent.IN_FLIGHT).
HOLD_MAX = 16 << 20
# Scheduler batches the ACKs of MSGs just read wait at most (flush_soon) while other tasks
# are runnable: the task a MSG wakes (a receive ring) answers in the next batch, the task
# that ring wakes in turn (an import waiting for HELLO_ACK, which sends NPA_REQ) in the one
# after, and trio may run a batch's tasks in either order.
ACK_COALESCE_STEPS = 2
# Reads in a row that found their bytes without a wait before the reader yields: a large
# payload takes two (its header, then its bytes), and more in a row means a busy link.
BUSY_READS = 4
INBOX_MAX = 4096  # acknowledged messages waiting for their ring, per connection
DEFER_MAX = 1024
DEFER_MAX_BYTES = 16 << 20


def parse_address(address: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` → (host, port)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"fabric address {address!r} is not host:port")
    return host.strip("[]") or "0.0.0.0", int(port)


def _tune(stream: trio.abc.Stream, congestion: str) -> None:
    """Room for a few data-plane chunks in flight each way (loopback autotuning starts
    small and a 256 KiB DATA frame would otherwise go out in many partial sends), and the
    pod's congestion control (PodConfig.tcp_congestion: BBR's pacing made a 1 MiB LOAD
    answer leave in 200 KiB pieces and cost 1.4 times as long as under cubic)."""
    if not isinstance(stream, trio.SocketStream):
        return
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        with contextlib.suppress(OSError):
            stream.socket.setsockopt(socket.SOL_SOCKET, opt, 4 << 20)
    if congestion:
        try:
            stream.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION,
                                     congestion.encode())
        except OSError as e:  # not built in, or not allowed here: the system default stays
            if congestion not in _CONGESTION_REFUSED:
                _CONGESTION_REFUSED.add(congestion)
                log.warning("fabric: TCP congestion control %r refused (%s); links use the "
                            "system default", congestion, e.strerror)


_CONGESTION_REFUSED: set[str] = set()  # each refusal is logged once per process


class _HeldAcks(trio.abc.Instrument):
    """The connections whose ACKs `_Conn.flush_soon` held back, written once the tasks the
    MSGs woke have run: when the scheduler is about to wait for I/O (everything runnable
    ran: a reply took the ACKs with it, or none is coming), or after ACK_COALESCE_STEPS
    batches of a daemon that stays busy. A trio instrument, not the writer task: its turns
    (a wake-up and two checkpoints per MSG read) cost every import four on both daemons."""

    def __init__(self) -> None:
        self.held: dict[_Conn, int] = {}  # conn -> batches it has waited

    def hold(self, conn: _Conn) -> None:
        self.held.setdefault(conn, 0)

    def before_io_wait(self, timeout: float) -> None:
        if not self.held:
            return
        rerun = False
        try:
            for conn, waited in list(self.held.items()):
                if timeout > 0 or waited >= ACK_COALESCE_STEPS or not conn.has_data_to_send:
                    del self.held[conn]
                    conn.soon = False
                    if conn.down is None:
                        conn.flush()  # what the woken tasks did not write with it
                        # The writer must finish it (TLS; a full socket): it was woken, but
                        # trio chose this wait's timeout before calling us.
                        rerun = rerun or bool(conn.pending)
                else:
                    self.held[conn] = waited + 1
        except Exception:  # a bug: loud, and what is held still goes (trio would drop us)
            log.exception("fabric: writing held ACKs failed")
            for conn in self.held:
                conn.soon = False
            self.held.clear()
            rerun = True
        if rerun:
            trio.lowlevel.current_trio_token().run_sync_soon(_nothing)


def _nothing() -> None:
    """(run_sync_soon's callback: only its wake-up of the run loop is wanted)"""


class _LinkDown(Exception):
    """Why a connection ended (logged once by `_run_conn`)."""

    def __init__(self, reason: str, level: int = logging.INFO) -> None:
        super().__init__(reason)
        self.level = level


class _ProofTaken(_LinkDown):
    """The peer proved itself and took our proof, then closed without AUTH_OK: what a knock
    gets once heard (dialing.py), unlike a refusal before the handshake (a limit)."""


class _Waiter:
    """A PING's waiter (FabricLink.ping): its PONG, or None when the link dropped first."""

    __slots__ = ("event", "result")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.result: Any = None  # None: the link dropped first

    def set(self, result: Any) -> None:
        self.result = result
        self.event.set()


class _Parked:
    """A use of a link that is down (a batch under quirk send-fail-slow, anything sent
    while the link is set up for its first use): `queue(conn)` when the link comes up, in
    line with the others parked for that peer, before anything sent later; `failed` at
    its deadline (the link's timer heap) if it is not queued by then."""

    __slots__ = ("completion", "failed", "give_up", "link", "peer", "queue")

    def __init__(self, link: FabricLink, peer: str, give_up: float,
                 queue: Callable[[_Conn], Completion[Any]],
                 failed: Callable[[Completion[Any], DrmError], None]) -> None:
        self.link, self.peer, self.give_up = link, peer, give_up
        self.queue, self.failed = queue, failed
        # None once queued (what it queued completes it then) or failed.
        self.completion: Completion[Any] | None = Completion()

    def fail(self, error: DrmError) -> None:
        c, self.completion = self.completion, None
        if c is not None:
            self.failed(c, error)

    def expire(self) -> None:
        """Its wait is over and its link never came: it fails as unanswered."""
        line = self.link._parked.get(self.peer)
        if line is not None and self in line:
            line.remove(self)
            if not line:
                del self.link._parked[self.peer]
        self.fail(DrmError(errno.ETIME,
                           f"no ACK from {self.peer} within {self.link.ack_timeout:g} s"))


def _batch_failed(count: int) -> Callable[[Completion[Any], DrmError], None]:
    """How a parked batch of `count` messages fails: each message with the error."""
    def failed(c: Completion[Any], error: DrmError) -> None:
        now = trio.current_time()
        c.set_result([(error, now) for _ in range(count)])
    return failed


def _request_failed(peer: str) -> Callable[[Completion[Any], DrmError], None]:
    """How a parked request to `peer` fails: unanswered is EFAULT (policy 3), as a request
    the link took and its peer never answered; closed is ESHUTDOWN."""
    def failed(c: Completion[Any], error: DrmError) -> None:
        c.set_error(DrmError(errno.EFAULT, f"no answer from {peer}")
                    if error.errno == errno.ETIME else error)
    return failed




class _Conn:
    """One authenticated connection: its stream, its Session (which keeps its requests), its PINGs.

    On plain TCP (`fd` set) queued frames are written at once by whoever queues them, as far
    as the socket takes them without blocking; the writer task only finishes what is left
    (`pending`). Saves a task switch per frame on the data plane's round trips."""

    def __init__(self, peer: str, stream: trio.abc.Stream, session: Session,
                 label: str) -> None:
        self.peer = peer
        self.stream = stream
        self.session = session
        self.label = label
        self.scope = trio.CancelScope()
        self.wake = trio.Event()
        self.writing = False
        self.soon = False  # flush_soon() held ACKs back (in held_acks, until they go)
        self.held_acks: _HeldAcks | None = None  # the link's, once it runs this connection
        self.pending: list[Buffer] = []  # bytes the socket did not take yet, in order
        self.held = 0  # their length
        self.stuck_since = trio.current_time()  # since when `pending` has not shrunk
        self.deferred: deque[Load | Store] = deque()  # requests waiting for `held` to drop
        self.deferred_bytes = 0
        self.room = trio.Event()  # set when `deferred` is no longer full
        # Acknowledged messages their ring could not take yet, in order: (src, dst, dwords,
        # what to await until it is in, if on_message already said; FabricLink._deliver).
        self.inbox: deque[tuple[int, int, Dwords, Awaitable[None] | None]] = deque()
        self.inbox_wake = trio.Event()
        self.inbox_room = trio.Event()
        self.paused = False  # the reader waits (for the inbox, `deferred` or `held`)
        # session.replied when `held` was last seen below HOLD_MAX (FabricLink._reader).
        self.replied_mark = 0
        self.not_reading_logged = False
        self.expired = 0  # requests refused past their deadline
        self.pings: dict[int, _Waiter] = {}
        self.timer_at = math.inf  # when the link's timer task calls session.handle_timer
        # last_rx (bytes came in), last_tx (the socket took bytes from us): liveness.py
        assert session.liveness is not None
        self.live = session.liveness
        # The socket's SO_RCVLOWAT (the reader waits for the rest of a large payload with it)
        # and, meanwhile, the bytes the timer last saw queued: bytes coming in are life.
        self.lowat = 1
        self.inq = 0
        self.down: _LinkDown | None = None
        self.data_handle: int | None = None  # its data channel's, from DataChannels.open
        self.clocks_pushed: tuple[int, float] | None = None  # the PING it was last told of
        # What binds a data channel to this link (auth.bound_nonce): from its handshake
        self.channel_key = b""
        self.data_broken = trio.Event()  # set when the data plane dropped that channel
        self.close_data: Callable[[int], None] | None = None  # DataChannels.close
        self.sock = stream.socket if isinstance(stream, trio.SocketStream) else None
        self.fd = self.sock.fileno() if self.sock is not None else -1

    @property
    def has_data_to_send(self) -> bool:
        return bool(self.pending) or self.session.has_data_to_send

    def flush(self) -> None:
        if not self.has_data_to_send:
            return
        if self.fd >= 0 and not self.writing and not self.pending:
            self.write_now()
        if self.session.has_data_to_send:
            self._hold(self.session.data_to_send_parts())
        if self.pending:
            self.wake.set()

    def flush_soon(self) -> None:
        """Flush after the tasks that the frames just read woke have run (_HeldAcks): a
        MSG's ACK then leaves in the same write as the reply it caused, one write and one
        wake-up of the peer instead of two. The ACK is delayed by those tasks only (at most
        ACK_COALESCE_STEPS scheduler batches), never past the next write of anything else."""
        if not self.has_data_to_send:
            return
        if self.writing or self.pending or self.held_acks is None:
            self.flush()
            return
        self.soon = True
        self.held_acks.hold(self)

    def write_now(self) -> None:
        """Write what is queued without blocking; hold the rest in `pending`."""
        new = self.session.data_to_send_parts()
        bufs = self.pending + new
        total = self.held + sum(len(b) for b in new)
        self.pending, self.held = [], 0
        written = 0
        try:
            while bufs:
                n = os.writev(self.fd, bufs[:_IOV_MAX])
                written += n
                bufs = _advance(bufs, n)
        except BlockingIOError:
            pass
        except OSError as e:
            bufs, total = [], 0
            self.drop(_LinkDown(f"send failed: {e!r}"))
        if written:
            self.stuck_since = self.live.last_tx = trio.current_time()
        self._hold(bufs, total - written)

    def _hold(self, bufs: list[Buffer], size: int | None = None) -> None:
        """Keep `bufs` (`size` bytes) for the writer, as they are now: a LOAD's answer is
        views of the BO's memory, and what it sends must be the bytes when it was served."""
        if not bufs:
            return
        if not self.pending:
            self.stuck_since = trio.current_time()
        self.pending += [bytes(b) if isinstance(b, memoryview) else b for b in bufs]
        self.held += sum(len(b) for b in bufs) if size is None else size

    def drop(self, reason: _LinkDown) -> None:
        if self.down is None:
            self.down = reason
        if self.data_handle is not None and self.close_data is not None:
            # At once, not at the teardown a few scheduler turns later: a load the data
            # plane carried meanwhile would get bytes where the link's faults.
            handle, self.data_handle = self.data_handle, None
            self.close_data(handle)
        self.scope.cancel()


# What the link's timer heap holds: a connection whose Session's timer is due then (unless
# it moved: `_Conn.timer_at`), or a parked use of a link that is down.
_Timed = _Parked | _Conn
Buffer = bytes | bytearray | memoryview
_IOV_MAX = 1024


def _advance(bufs: list[Buffer], n: int) -> list[Buffer]:
    """What is left of `bufs` after the first `n` bytes were written."""
    i = 0
    while i < len(bufs) and n >= len(bufs[i]):
        n -= len(bufs[i])
        i += 1
    rest = bufs[i:]
    if n:
        rest[0] = memoryview(rest[0])[n:]
    return rest


def _cause(reason: str) -> str:
    """What kind of refusal `reason` is: the reason without its names and numbers. A name
    is quoted as its repr: in single quotes, or in double quotes when it holds a single
    quote (a peer's made-up names are not as many causes)."""
    return re.sub(r"""'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|\S*\d\S*""", "_", reason)


def _rejected_by_peer(e: BaseException) -> bool:
    """Whether a failed dial met something that answered and failed the handshake (a bad
    proof or frame: RemoteProtocolError, AuthError; a TLS certificate that does not verify),
    rather than a refused, reset or timed-out connection."""
    if isinstance(e, RemoteProtocolError):
        return True
    cause = e.__cause__
    return isinstance(cause, ssl.SSLCertVerificationError)


def _reason(e: BaseException) -> str:
    """Why `e` ended a connection. trio keeps the error underneath as __cause__: the
    ssl.SSLError of a failed TLS handshake (its BrokenResourceError says nothing), the
    ConnectionRefusedError of a failed dial."""
    text = str(e)
    cause = e.__cause__
    if isinstance(cause, BaseExceptionGroup):  # open_tcp_stream: one error per address tried
        cause = cause.exceptions[-1]
    if isinstance(cause, OSError):  # ssl.SSLError is one
        detail = str(cause) or repr(cause)
        return f"{text}: {detail}" if text else detail
    return text or repr(e)


class _Refusals:
    """Refused inbound connections, logged one line per cause and interval: the first of a
    cause at once, in full; those that follow within `interval` as one line with their count
    (a flood of a thousand connections is two lines, not a thousand)."""

    def __init__(self, node_name: str, interval: float) -> None:
        self._node = node_name
        self.interval = interval
        # cause -> [window start, count since the first, source hosts, the last reason]
        self._open: dict[str, list[Any]] = {}

    def note(self, who: str, host: str, reason: str, now: float) -> None:
        cause = _cause(reason)
        w = self._open.get(cause)
        if w is None:
            log.warning("fabric %s: refused connection from %s: %s", self._node, who, reason)
            self._open[cause] = [now, 0, set(), reason]
        else:
            w[1] += 1
            w[2].add(host)
            w[3] = f"{who}: {reason}"

    def flush(self, now: float, everything: bool = False) -> None:
        for cause, w in list(self._open.items()):
            if not everything and now - w[0] < self.interval:
                continue
            if not w[1]:
                del self._open[cause]
                continue
            log.warning("fabric %s: refused %d more connection%s like that within %.0f s, "
                        "from %d address%s (the last from %s)", self._node, w[1],
                        "s" if w[1] > 1 else "", self.interval, len(w[2]),
                        "es" if len(w[2]) > 1 else "", w[3])
            self._open[cause] = [now, 0, set(), w[3]]

    async def run(self) -> None:
        try:
            while True:
                await trio.sleep(self.interval)
                self.flush(trio.current_time())
        finally:
            self.flush(trio.current_time(), everything=True)


def _cert_names(stream: trio.abc.Stream) -> frozenset[str] | None:
    """The names a TLS peer's verified certificate gives (DNS subjectAltNames and common
    names), or None on plain TCP."""
    if not isinstance(stream, trio.SSLStream):
        return None
    cert = stream.getpeercert() or {}
    names = {v for k, v in cert.get("subjectAltName", ()) if k == "DNS"}
    names |= {v for rdn in cert.get("subject", ()) for k, v in rdn if k == "commonName"}
    return frozenset(names)


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
                 max_pending: tuple[int, int] = (MAX_PENDING_HANDSHAKES,
                                                 MAX_PENDING_PER_ADDRESS),
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
        self._held_acks = _HeldAcks()
        self._data_channels = data_channels
        if data_channels is not None:
            data_channels.on_broken = self._data_channel_broken
        # The data plane behind `data_channels` reads and writes the socket itself: no TLS.
        self._data_plane_tcp = (data_channels is not None and self._ssl_server is None
                                and self._ssl_client is None)
        # Per peer: its inbound links between their AUTH_OK and their start (the old link's
        # probe), which a data channel from it waits out (`_admit_data_channel`).
        self._admitting: dict[str, int] = {}
        self._admitted = trio.lowlevel.ParkingLot()
        self._channel_broke = trio.lowlevel.ParkingLot()  # `_old_channel_gone`'s waits
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
        self._conns: dict[str, _Conn] = {}
        self._up = {p: trio.Event() for p in self._peers}
        self._nonces = NonceCache()
        self._max_pending = max_pending
        self._pending: dict[str, int] = {}  # source host -> handshakes in progress
        self._pending_total = 0
        self._refusals = _Refusals(node_name, REFUSAL_LOG_INTERVAL)
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
        self._parked: dict[str, deque[_Parked]] = {}
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
        self._dial_slots = trio.CapacityLimiter(dialing.DIAL_CONCURRENCY)
        self._down: dict[str, trio.Event] = {}  # per peer with a link: set when it goes

    # -- queries -----------------------------------------------------------------------------
    def is_up(self, node_name: str) -> bool:
        return node_name in self._conns

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
            parked_lines, self._parked = self._parked, {}
            for line in parked_lines.values():
                for parked in line:
                    parked.fail(DrmError(errno.ESHUTDOWN, "the fabric link is closed"))
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
        return self._pending_total

    async def _serve_inbound(self, tcp: trio.SocketStream) -> None:
        try:
            host, port = tcp.socket.getpeername()[:2]
            addr = f"{host}:{port}"
        except OSError:
            host = addr = "?"
        total, per_address = self._max_pending
        if self._pending_total >= total or self._pending.get(host, 0) >= per_address:
            why = (f"{self._pending_total} handshakes in progress (the limit)"
                   if self._pending_total >= total else
                   f"{self._pending[host]} handshakes in progress from {host} (the limit "
                   "per address)")
            self._refusals.note(addr, host, why, trio.current_time())
            await trio.aclose_forcefully(tcp)
            return
        self._pending_total += 1
        self._pending[host] = self._pending.get(host, 0) + 1
        try:
            admitted = await self._authenticate_inbound(tcp, host, addr)
        finally:
            self._pending_total -= 1
            self._pending[host] -= 1
            if not self._pending[host]:
                del self._pending[host]
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
        counted: list[str] = []  # the peer, once this link is in `_admitting`
        data_link: list[_Conn] = []  # a data channel: the link it belongs to

        async def before_ok() -> None:
            assert hs.peer_name is not None
            if hs.channel is Channel.DATA:
                data_link.append(await self._admit_data_channel(hs.peer_name, decoder,
                                                                hs.link_nonces[0]))
            elif not dialing.dials(hs.peer_name, self.node_name):  # (on first use only)
                self._want(hs.peer_name)
                raise dialing.Knocked(hs.peer_name)
            else:  # from its AUTH_OK on, the peer may dial this link's data channel
                self._admitting[hs.peer_name] = self._admitting.get(hs.peer_name, 0) + 1
                counted.append(hs.peer_name)

        try:
            with trio.move_on_at(hs.deadline) as within:
                if self._ssl_server is not None:
                    stream = trio.SSLStream(tcp, self._ssl_server, server_side=True)
                    await stream.do_handshake()
                    hs.cert_names = _cert_names(stream)
                await self._handshake(stream, hs, decoder, [], before_ok)
            if within.cancelled_caught:  # (also after the proof: in before_ok, or AUTH_OK)
                raise AuthError(f"handshake not finished within {hs.timeout:g} s")
            hs.check_deadline(trio.current_time())
            assert hs.peer_name is not None
            if data_link:
                self._hand_over_inbound(data_link[0], tcp, addr)
                await trio.aclose_forcefully(stream)  # (the data plane has its dup)
                return None
            if not await self._old_link_gone(hs.peer_name):
                raise _LinkDown(f"a live link to {hs.peer_name} exists (it answered a "
                                "liveness probe); a second connection does not replace it")
        except dialing.Knocked:
            log.debug("fabric %s: %s (%s) asks for our link: dialing it", self.node_name,
                      hs.peer_name, addr)
            await trio.aclose_forcefully(stream)
            return None
        except (ProtocolError, _LinkDown, trio.BrokenResourceError, OSError) as e:
            who = f"{hs.peer_name} ({addr})" if hs.peer_name else addr
            self._refusals.note(who, host, _reason(e), trio.current_time())
            await trio.aclose_forcefully(stream)
            return None
        finally:
            for peer in counted:  # (no checkpoint from here to the link's start: _run_conn)
                self._admitting[peer] -= 1
                if not self._admitting[peer]:
                    del self._admitting[peer]
                self._admitted.unpark_all()
        decoder.open_data_plane()
        _tune(tcp, self.config.tcp_congestion)
        return hs.peer_name, stream, decoder, hs.channel_key()

    async def _admit_data_channel(self, peer: str, decoder: FrameDecoder,
                                  nonce: bytes) -> _Conn:
        """The link an authenticated data channel from `peer` belongs to, before it is told
        AUTH_OK: our live link from `peer`, which its client `nonce` must name (dialed by
        that link's end: auth.bound_to); _LinkDown when there is none, or when the channel
        may not be had. One that comes while a link from `peer` is being admitted (its
        AUTH_OK sent, an old link probed) is that link's: it waits to see that link start,
        and is refused if it does not."""
        if self._data_channels is None:
            raise _LinkDown("a data channel, and this node takes none")
        if not self._data_plane_tcp:
            raise _LinkDown("a data channel on a TLS fabric (data channels are plain TCP only)")
        if decoder.buffered:  # what the handover cannot pass on: the data plane reads the fd
            raise _LinkDown(f"{decoder.buffered} bytes sent on a data channel before its "
                            "handshake finished")
        before = self._conns.get(peer)
        waited = False
        while self._admitting.get(peer):
            waited = True
            await self._admitted.park()
        conn = self._conns.get(peer)
        if conn is None or conn.down is not None or (waited and conn is before):
            raise _LinkDown(f"a data channel from {peer} without a live link from it")
        if not bound_to(nonce, conn.channel_key):
            raise _LinkDown(f"a data channel from {peer} not dialed by its live link's end "
                            "(it has the link's key, not the link's handshake)")
        if not await self._old_channel_gone(conn):
            raise _LinkDown(f"a second data channel from {peer} while its link's channel is "
                            "healthy: it does not replace it")
        return conn

    async def _old_channel_gone(self, conn: _Conn) -> bool:
        """True when the link `conn` holds no data channel, or the one it holds breaks
        within a short wait. The peer's own side dials a new channel only after its old one
        broke, and closed it: the data plane here sees that close (EOF, a reset) at once
        and drops the channel (DataChannels.on_broken). One that stays healthy is still in
        use by the link's peer: a newcomer with the link's key (a stolen or superseded
        config) must not take it over and answer that peer's loads."""
        wait = min(self._hb_timeout, 2 * self._hb_interval, self._handshake_timeout / 2)
        with trio.move_on_after(wait):
            while conn.data_handle is not None and conn.down is None:
                with trio.move_on_after(0.05):  # (woken by a break; the link's end polled)
                    await self._channel_broke.park()
        return conn.data_handle is None and conn.down is None

    def _hand_over_inbound(self, conn: _Conn, tcp: trio.SocketStream, addr: str) -> None:
        """An admitted data channel, told AUTH_OK: to the data plane, if its link is still
        up (else _LinkDown)."""
        if conn.down is not None or self._conns.get(conn.peer) is not conn:
            raise _LinkDown(f"a data channel from {conn.peer}: its link went down during "
                            "the handshake")
        _tune(tcp, self.config.tcp_congestion)  # (this side sends the LOAD answers)
        if self._hand_over(conn, tcp):
            log.debug("fabric %s: data channel from %s (%s) handed over", self.node_name,
                      conn.peer, addr)
        else:
            log.info("fabric %s: the data plane refused the data channel from %s (%s); the "
                     "link carries its loads", self.node_name, conn.peer, addr)

    def _hand_over(self, conn: _Conn, tcp: trio.SocketStream) -> bool:
        """A dup of `tcp`'s socket to `data_channels` as the data channel of the link `conn`,
        in place of one it had (the caller closes `tcp`); False if the data plane refused it.
        Synchronous: the link cannot end between the caller's check and the handle being
        `conn`'s (its teardown closes it)."""
        assert self._data_channels is not None
        fd = os.dup(tcp.socket.fileno())
        # (A channel that is there still, on the side that dialed it: the data plane has not
        # said it broke yet. The side that admits channels let none in while one was held.)
        if conn.data_handle is not None:
            old, conn.data_handle = conn.data_handle, None
            self._data_channels.close(old)
        conn.close_data = self._data_channels.close
        conn.data_handle = self._data_channels.open(conn.peer, fd, self._accels[conn.peer])
        if conn.data_handle is not None:
            conn.clocks_pushed = None
            self._push_clocks(conn)
        return conn.data_handle is not None

    def _push_clocks(self, conn: _Conn) -> None:
        """The data channel's STORE deadlines follow the link's clocks (the peer's last PING)."""
        origin, peer_clock = conn.session.clocks
        if conn.data_handle is not None and self._data_channels is not None \
                and (peer_clock is None or peer_clock is not conn.clocks_pushed):
            conn.clocks_pushed = peer_clock
            self._data_channels.clock(conn.data_handle, origin, peer_clock)

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
            old.drop(_LinkDown(f"silent for {probe:g} s after a liveness probe (a new "
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
            try:
                host, port = parse_address(self._addresses[peer])
            except ConfigError:
                host, port = "", 0
            if port == 0:  # not known yet (ephemeral port, no address): set_peer_address
                await changed.wait()
                continue
            try:
                stream, decoder, channel_key = await self._dial(peer, host, port)
            except (ProtocolError, _LinkDown, OSError, trio.BrokenResourceError) as e:
                # WARNING when the failure is new or of another kind than the last (refused,
                # then an impostor answering: both are news); each repeat at DEBUG.
                reason = _reason(e)
                kind = (type(e), _cause(reason))
                now = trio.current_time()
                failing_since = now if failing_since is None else failing_since
                lasting = now - failing_since >= DIAL_WARN_AFTER
                if _rejected_by_peer(e):
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
            try:
                host, port = parse_address(self._addresses[peer])
            except ConfigError:
                host, port = "", 0
            if port == 0:  # not known yet (ephemeral port, no address): set_peer_address
                await self._address_changed[peer].wait()
                continue
            try:
                stream, decoder, channel_key = await self._dial(peer, host, port)
            except (ProtocolError, _LinkDown, OSError, trio.BrokenResourceError) as e:
                now = trio.current_time()
                failing_since = now if failing_since is None else failing_since
                knocked = isinstance(e, _ProofTaken)
                # One WARNING once the peer has been unreachable for DIAL_WARN_AFTER (as a
                # dial loop's), none for a knock heard.
                loud = not knocked and not warned and now - failing_since >= DIAL_WARN_AFTER
                warned = warned or loud
                log.log(logging.WARNING if loud else logging.DEBUG,
                        "fabric %s: asking %s at %s:%d for our link: %s", self.node_name,
                        peer, host, port, "it dials back" if knocked else _reason(e))
                # Heard: its dial back may wait its turn there (dialing.DIAL_CONCURRENCY),
                # and each knock again would cost it a handshake.
                wait = self._handshake_timeout if knocked else backoff.next_delay()
                with trio.move_on_after(wait):
                    await self._up[peer].wait()
                continue
            # A peer that links at start took us as its dialer: the link is this one.
            await self._run_conn(peer, stream, decoder, f"to {host}:{port}",
                                 (host, port), channel_key)

    async def _dial(self, peer: str, host: str, port: int, channel: Channel = Channel.LINK,
                    nonce: bytes | None = None
                    ) -> tuple[trio.abc.Stream, FrameDecoder, bytes]:
        """`_dial_now` once one of the DIAL_CONCURRENCY slots is free: the handshake's time
        starts then, not while its turn waits."""
        async with self._dial_slots:
            return await self._dial_now(peer, host, port, channel, nonce)

    async def _dial_now(self, peer: str, host: str, port: int, channel: Channel = Channel.LINK,
                        nonce: bytes | None = None
                        ) -> tuple[trio.abc.Stream, FrameDecoder, bytes]:
        """A connection to `peer` authenticated (with `nonce`: a data channel's bound one):
        its stream, decoder and, for a link, its data channels' key."""
        hs = ClientHandshake(self.config, self.node_name, peer, now=trio.current_time(),
                             key=self._keys[peer], timeout=self._handshake_timeout,
                             channel=channel, nonce=nonce)
        decoder = FrameDecoder.for_handshake()
        stream: trio.abc.Stream | None = None
        try:
            with trio.move_on_at(hs.deadline) as within:
                stream = await trio.open_tcp_stream(host, port)
                _tune(stream, self.config.tcp_congestion)
                if self._ssl_client is not None:
                    stream = trio.SSLStream(stream, self._ssl_client, server_hostname=host)
                    await stream.do_handshake()
                    hs.cert_names = _cert_names(stream)
                await self._handshake(stream, hs, decoder, hs.initial_frames())
            if within.cancelled_caught and not hs.established:
                # Timed out (a peer busy or starting, a network that drops): not a failed
                # proof, so it keeps the dial's grace (_dial_loop).
                raise _LinkDown(f"handshake not finished within {hs.timeout:g} s")
            hs.check_deadline(trio.current_time())
        except BaseException:
            if stream is not None:
                await trio.aclose_forcefully(stream)
            raise
        assert stream is not None
        decoder.open_data_plane()
        return stream, decoder, hs.channel_key()

    async def _handshake(self, stream: trio.abc.Stream, hs: ClientHandshake | ServerHandshake,
                         decoder: FrameDecoder, first: list[Frame],
                         before_ok: Callable[[], Awaitable[None]] | None = None) -> None:
        """Run `hs` to its end on `stream`; the server's `before_ok()` runs once the peer
        has proved itself, before it is sent AUTH_OK (a refusal then raises from it)."""
        if first:
            await stream.send_all(b"".join(encode_frame(f) for f in first))
        while not hs.established:
            frame = decoder.next_frame()
            if isinstance(frame, _NeedData):
                data = await stream.receive_some(HANDSHAKE_RECEIVE_SIZE)
                if not data:
                    if isinstance(hs, ClientHandshake) and hs.peer_name is not None:
                        raise _ProofTaken("connection closed during the handshake (after "
                                          "our proof)")
                    raise _LinkDown("connection closed during the handshake")
                decoder.receive_data(data)
                continue
            replies = hs.receive_frame(frame, trio.current_time())
            if hs.established and before_ok is not None:
                await before_ok()
            if replies:
                await stream.send_all(b"".join(encode_frame(f) for f in replies))

    # -- an established connection -----------------------------------------------------------
    async def _run_conn(self, peer: str, stream: trio.abc.Stream, decoder: FrameDecoder,
                        label: str, dialed: tuple[str, int] | None = None,
                        channel_key: bytes = b"") -> None:
        """Run the link `stream` to `peer` until it ends; `dialed`: the address we dialed it
        at, where its data channel is dialed too (`data_channels`)."""
        now = trio.current_time()
        session = Session(peer, self._accels[peer], self._local_accels, decoder, now=now,
                          liveness=Liveness(self._hb_interval, self._hb_timeout, now))
        conn = _Conn(peer, stream, session, label)
        conn.channel_key = channel_key
        conn.held_acks = self._held_acks
        old = self._conns.get(peer)
        if old is not None:  # the peer redialed: its old connection is dead to it
            old.drop(_LinkDown(f"replaced by a new connection {label}"))
        self._conns[peer] = conn
        self._up[peer].set()
        self._first_use.up(peer)
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
                    nursery.start_soon(self._reader, conn)
                    nursery.start_soon(self._deliver, conn)
                    nursery.start_soon(self._writer, conn)
                    # The peer speaks PROTOCOL_VERSION (the handshake admits no other), which
                    # has data channels; in this nursery, the dial ends with the link.
                    if dialed is not None and self._data_plane_tcp:
                        nursery.start_soon(self._keep_data_channel, conn, *dialed)
                    # Our link clock at once: the peer's deadlines need it (Session).
                    session.send_heartbeat(now=trio.current_time())
                    conn.flush()
                    self._arm(conn, conn.live.next_due())
        finally:
            if conn.data_handle is not None:  # first: the data plane stops using the peer
                handle, conn.data_handle = conn.data_handle, None
                assert self._data_channels is not None
                self._data_channels.close(handle)
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
            down = conn.down or _LinkDown("closed")
            if conn.expired > 1:
                log.info("fabric %s: %d requests from %s refused past their deadline",
                         self.node_name, conn.expired, peer)
            # A link we closed ourselves (stopping: cancelled, nothing went wrong) is DEBUG;
            # a peer that left or a failure is news.
            quiet = (self._closed or conn.down is None) and down.level <= logging.INFO
            log.log(logging.DEBUG if quiet else down.level, "fabric %s: link to %s (%s) down: %s",
                    self.node_name, peer, label, down)
            self._progress.unpark_all()
            if conn.inbox and self._nursery is not None:
                self._nursery.start_soon(self._deliver_rest, conn)
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)

    async def _keep_data_channel(self, conn: _Conn, host: str, port: int) -> None:
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
            if await self._dial_data_channel(conn, host, port, quiet=broke):
                since = trio.current_time()
                await conn.data_broken.wait()
                if trio.current_time() - since >= DATA_REDIAL_MAX:
                    delay = self._backoff[0]  # (it had served a while: not one that keeps breaking)
                broke = True
            elif not broke:
                return
            await trio.sleep(delay)
            delay = min(delay * 2, DATA_REDIAL_MAX)

    def _data_channel_broken(self, handle: int) -> None:
        """DataChannels.on_broken: the data plane dropped the channel `handle`."""
        for conn in self._conns.values():
            if conn.data_handle == handle:
                conn.data_handle = None
                conn.data_broken.set()
        self._channel_broke.unpark_all()

    async def _dial_data_channel(self, conn: _Conn, host: str, port: int,
                                 quiet: bool = False) -> bool:
        """Dial the data channel of the link `conn` at host:port and hand it over to
        `data_channels`; True if it was. Failing is one INFO line (DEBUG when `quiet`: a
        redial, whose channel's break the data plane logged): the link carries the data
        plane without it."""
        assert self._data_channels is not None
        peer = conn.peer
        level = logging.DEBUG if quiet else logging.INFO
        try:
            stream, decoder, _ = await self._dial(peer, host, port, Channel.DATA,
                                                  bound_nonce(conn.channel_key))
        except (ProtocolError, _LinkDown, OSError, trio.BrokenResourceError) as e:
            log.log(level, "fabric %s: no data channel to %s at %s:%d: %s (the link carries "
                    "its loads)", self.node_name, peer, host, port, _reason(e))
            return False
        try:
            assert isinstance(stream, trio.SocketStream)  # (plain TCP: _data_plane_tcp)
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

    async def _reader(self, conn: _Conn) -> None:
        session, live = conn.session, conn.live
        # Plain TCP: receive into one reusable buffer, and the rest of a large STORE / DATA
        # payload straight into its own buffer (one copy of a megabyte, not three), with
        # plain non-blocking reads (trio's recv adds a task switch each). TLS: receive_some.
        # A large DATA payload is spliced into a pipe instead (fabric/splice.py): a GPU load's
        # FUSE reply splices it on from there.
        sock, fd = conn.sock, conn.fd
        scratch = memoryview(bytearray(SCRATCH_SIZE))
        pipes = PipePool() if fd >= 0 else None
        piped: PipedPayload | None = None
        unyielded = 0  # reads in a row that found bytes without waiting for them
        try:
            while True:
                # Frames first: the handshake's last read may have brought some already.
                acked = False
                if conn.data_handle is not None and session.clocks[1] is not conn.clocks_pushed:
                    self._push_clocks(conn)  # (a PING came)
                while not isinstance(ev := session.next_event(trio.current_time()), _NeedData):
                    # A MSG's ACK is queued in the session as the MSG is decoded, so it goes
                    # out ahead of anything the MSG causes whenever it is written. Data-plane
                    # answers go out at once; a MSG's ACK waits for the reply the message
                    # usually causes (written by another task), to share its write.
                    if type(ev) is MessageReceived:
                        acked = True
                    elif type(ev) is RequestReceived:
                        conn.flush()  # answers to earlier requests leave as we go
                    self._dispatch(conn, ev)
                    while len(conn.inbox) >= INBOX_MAX:  # rings full: read nothing more
                        conn.flush()  # the ACKs of what waits in the inbox go out now
                        conn.paused = True
                        conn.inbox_room = trio.Event()
                        await conn.inbox_room.wait()
                        conn.paused = False
                    while len(conn.deferred) >= DEFER_MAX or conn.deferred_bytes >= DEFER_MAX_BYTES:
                        conn.flush()
                        conn.paused = True  # the peer does not take its answers: read no more
                        conn.room = trio.Event()
                        await conn.room.wait()
                        conn.paused = False
                # Its frame was dispatched above, and its consumers ran in that call
                # (drm/loaded.py's contract): no await may come between the two.
                if piped is not None and not piped.left:
                    piped.settle()
                    piped = None
                if acked or conn.soon:  # (conn.soon: ACKs still owed from an earlier read)
                    conn.flush_soon()
                else:
                    conn.flush()
                if conn.held < HOLD_MAX:
                    conn.replied_mark = session.replied
                elif session.replied - conn.replied_mark >= HOLD_MAX:
                    await self._wait_taken(conn)
                if unyielded >= BUSY_READS:
                    # A busy link must not starve the rest. A frame that takes two reads
                    # (a large payload's header, then its bytes) is not a busy link: a turn
                    # there cost every 1 MiB load a scheduler round.
                    await trio.lowlevel.checkpoint()
                    unyielded = 0
                if sock is None:
                    data: Buffer = await conn.stream.receive_some(RECEIVE_SIZE)
                    if not data:
                        raise _LinkDown(f"{conn.peer} closed the connection")
                    session.receive_data(data)
                else:
                    if (piped is None and pipes is not None
                            and session.collecting() is FrameType.DATA
                            and (pipe := pipes.take()) is not None):
                        piped = PipedPayload(session.collecting_size(), pipes, pipe)
                        piped.start(session.divert(piped))
                    unyielded += 1
                    while True:
                        try:
                            if piped is None:
                                into = session.receive_buffer()
                                if into is not None:
                                    n = os.readv(fd, [into])
                                elif session.expects_large_data:
                                    # Only the next frame's header (a large DATA's, likely):
                                    # the payload is then spliced whole, none of it copied
                                    # through scratch and again into the FUSE reply's pipe.
                                    n = os.readv(fd, [scratch[:DATA_HEADER_SIZE]])
                                else:
                                    n = os.readv(fd, [scratch])
                            elif piped.piping:
                                n = piped.splice_from(fd)
                            else:
                                n = os.readv(fd, [piped.rest()])
                                piped.received(n)
                            break
                        except BlockingIOError:
                            if piped is not None and piped.pipe_full():
                                piped.to_memory()  # (a peer trickling tiny segments)
                                continue
                            # The rest of a large payload: be woken once most of it is
                            # in, not for each segment (a 1 MiB DATA woke the reader ~6
                            # times, a trio turn each). The kernel caps it at half the
                            # receive buffer and wakes sooner under memory pressure, at EOF
                            # or on an error; reads are not held back by it.
                            want = (piped.left if piped is not None
                                    else 1 if into is None else len(into))
                            if want != conn.lowat:
                                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, want)
                                conn.lowat, conn.inq = want, 0
                            await trio.lowlevel.wait_readable(sock)
                            unyielded = 0
                    if not n:
                        raise _LinkDown(f"{conn.peer} closed the connection")
                    if piped is None and into is None:
                        session.receive_data(scratch[:n])
                    else:  # (into the payload's own buffer, or its pipe)
                        session.received_into(n)
                live.last_rx = trio.current_time()
        except RemoteProtocolError as e:
            conn.drop(_LinkDown(f"protocol error: {e}", logging.WARNING))
        except _LinkDown as e:
            conn.drop(e)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
            conn.drop(_LinkDown(f"receive failed: {e!r}"))
        finally:
            if piped is not None:
                piped.close()
            if pipes is not None:
                pipes.close()

    async def _wait_taken(self, conn: _Conn) -> None:
        """The peer's MSGs and PINGs made us queue HOLD_MAX of ACKs and PONGs since it last
        had less than HOLD_MAX held for it: it sends faster than it takes them (requests
        wait in `deferred` instead, but these are answered as they are read). Read nothing
        more from it until it has taken what is held; TCP slows it down meanwhile, and
        its liveness drops it if it takes nothing for the heartbeat timeout."""
        if not conn.not_reading_logged:
            conn.not_reading_logged = True
            log.warning("fabric %s: %s is not taking its answers (%d MiB held for it): "
                        "reading from it waits", self.node_name, conn.peer, conn.held >> 20)
        conn.flush()
        conn.paused = True
        while conn.held >= HOLD_MAX:
            conn.room = trio.Event()
            await conn.room.wait()
        conn.paused = False
        conn.replied_mark = conn.session.replied

    def _dispatch(self, conn: _Conn, ev: object) -> None:
        if isinstance(ev, MessageReceived):
            if conn.inbox:  # behind those already waiting
                conn.inbox.append((ev.src_accel, ev.dst_accel, ev.dwords, None))
            elif (wait := self._on_message(ev.src_accel, ev.dst_accel, ev.dwords)) is not None:
                conn.inbox.append((ev.src_accel, ev.dst_accel, ev.dwords, wait))
                conn.inbox_wake.set()
        elif isinstance(ev, IncarnationReceived):
            self._peer_incarnations[ev.accel] = ev.incarnation
        elif isinstance(ev, PongReceived):
            waiter = conn.pings.pop(ev.token, None)
            if waiter is not None:
                waiter.set(ev)
        elif isinstance(ev, RequestReceived):
            req = ev.request
            if conn.deferred or conn.held >= HOLD_MAX:  # in order, behind those waiting
                if not conn.not_reading_logged:
                    conn.not_reading_logged = True
                    log.warning("fabric %s: %s is not taking its answers (%d MiB held for "
                                "it): its requests wait unserved", self.node_name,
                                conn.peer, conn.held >> 20)
                conn.deferred.append(req)
                conn.deferred_bytes += len(req.data) if isinstance(req, Store) else 0
            else:
                self._serve(conn, req)

    async def _deliver(self, conn: _Conn) -> None:
        """Hands the inbox's messages to their rings, in order, as they take them."""
        while True:
            while not conn.inbox:
                conn.inbox_wake = trio.Event()
                await conn.inbox_wake.wait()
            await self._deliver_head(conn)
            conn.inbox_room.set()

    async def _deliver_head(self, conn: _Conn) -> None:
        src, dst, dwords, wait = conn.inbox[0]
        # Cancelled while it waits (the link went down): not delivered, and tried afresh.
        conn.inbox[0] = (src, dst, dwords, None)
        if wait is None:
            wait = self._on_message(src, dst, dwords)
        if wait is not None:
            await wait
        conn.inbox.popleft()

    async def _deliver_rest(self, conn: _Conn) -> None:
        while conn.inbox:
            await self._deliver_head(conn)

    def _serve(self, conn: _Conn, req: Load | Store) -> None:
        session = conn.session
        if session.expired(req, trio.current_time()):
            conn.expired += 1
            if conn.expired == 1:  # one line per link; the count when it goes down
                log.warning("fabric %s: refused a %s from %s past its deadline (its "
                            "requester had given up)", self.node_name,
                            type(req).__name__.upper(), conn.peer)
            session.send_data(req.seq, -errno.ETIME)
        elif self._on_request is None:
            session.send_data(req.seq, -errno.EOPNOTSUPP)
        else:
            status, data = self._on_request(conn.peer, req)
            session.send_data(req.seq, status, data)

    def _serve_deferred(self, conn: _Conn) -> None:
        """Serve waiting requests, in order, while what is held for the peer allows."""
        while conn.deferred and conn.held < HOLD_MAX and conn.down is None:
            req = conn.deferred.popleft()
            conn.deferred_bytes -= len(req.data) if isinstance(req, Store) else 0
            self._serve(conn, req)
            conn.flush()
        if len(conn.deferred) < DEFER_MAX and conn.deferred_bytes < DEFER_MAX_BYTES:
            conn.room.set()

    async def _writer(self, conn: _Conn) -> None:
        """Finishes what `_Conn.flush` could not write at once (all of it, with TLS)."""
        try:
            while True:
                await conn.wake.wait()
                conn.wake = trio.Event()
                conn.writing = True
                while conn.has_data_to_send or conn.deferred:
                    if conn.sock is not None:
                        await trio.lowlevel.wait_writable(conn.sock)
                        conn.write_now()
                    else:
                        parts = conn.pending + conn.session.data_to_send_parts()
                        conn.pending = []
                        conn.held = sum(len(p) for p in parts)
                        for part in parts:
                            await conn.stream.send_all(part)
                            conn.held -= len(part)
                            conn.stuck_since = conn.live.last_tx = trio.current_time()
                    self._serve_deferred(conn)
                conn.writing = False
                self._progress.unpark_all()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
            conn.drop(_LinkDown(f"send failed: {e!r}"))

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
        now = trio.current_time()
        peer = self._owner.get(dst_accel)
        if not messages:
            c = Completion()
            c.set_result([])
            return c
        err = self._route_error(dst_accel, src_accel)
        if err is not None:
            return _outcomes(err, now, len(messages))
        assert peer is not None
        conn = self._conns.get(peer)
        if conn is not None:
            return self._queue_batch(conn, src_accel, dst_accel, messages)
        setting_up = self._setting_up(peer)
        if self._post_fails_fast and not setting_up:
            # §13 N4: the copy engine's post fails, at once
            return _outcomes(DrmError(errno.ETIME, f"{peer} is not reachable: not posted"),
                             now, len(messages))
        # Set up for its first use, or quirk send-fail-slow: in line for the link.
        give_up = now + self.ack_timeout
        if setting_up:  # (first use: §5.4's wait)
            give_up = max(give_up, self._first_use.deadline(peer))
        return self._park(peer, give_up, lambda conn: self._queue_batch(
            conn, src_accel, dst_accel, messages, give_up), _batch_failed(len(messages)))

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

    def _park(self, peer: str, give_up: float, queue: Callable[[_Conn], Completion[Any]],
              failed: Callable[[Completion[Any], DrmError], None]) -> Completion[Any]:
        """A use of the link to `peer`, which is down: `queue(conn)` once it is up (in line
        with the others parked for it), or `failed` at `give_up`."""
        parked = _Parked(self, peer, give_up, queue, failed)
        self._parked.setdefault(peer, deque()).append(parked)
        self._deadline(give_up, parked)
        assert parked.completion is not None
        return parked.completion

    def _unpark(self, peer: str, conn: _Conn) -> None:
        """The link to `peer` is up: queue what waited for it, in the order it was sent,
        before anyone can send anything else on it (a task woken by the link runs later,
        and trio runs the tasks of one wake-up in either order)."""
        now = trio.current_time()
        for parked in self._parked.pop(peer, ()):
            if parked.completion is None:
                continue
            if parked.give_up <= now:  # (its deadline is due: the wait is over)
                parked.expire()
                continue
            c, parked.completion = parked.completion, None
            try:
                queued = parked.queue(conn)
            except LocalProtocolError as e:  # (the sender's bug: raised to it)
                c.set_error(e)
            else:
                queued.when_done(functools.partial(_pass_on, c))

    def _queue_batch(self, conn: _Conn, src_accel: int, dst_accel: int,
                     messages: Sequence[Dwords], give_up: float | None = None
                     ) -> Completion[list[SendOutcome]]:
        """Queue `messages` on `conn` and write them; their ACKs go to one batch waiter,
        which gives up at `give_up` (ack_timeout from now by default)."""
        if give_up is None:
            give_up = trio.current_time() + self.ack_timeout
        session = conn.session
        batch = BatchWait(conn.peer, session.send_messages(src_accel, dst_accel, messages),
                          self.ack_timeout)
        session.expect(batch, give_up)
        self._arm(conn, give_up)
        conn.flush()
        assert batch.completion is not None
        return batch.completion

    def _arm(self, conn: _Conn, when: float) -> None:
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
        give_up = trio.current_time() + self.ack_timeout
        if conn is None:  # (being set up for its first use: the request waits for it)
            assert peer is not None
            return self._park(peer, give_up, lambda conn: self._queue_request(
                conn, src_accel, dst_accel, npa_byte_addr, length_or_data, give_up),
                _request_failed(peer))
        return self._queue_request(conn, src_accel, dst_accel, npa_byte_addr, length_or_data,
                                   give_up)

    def _queue_request(self, conn: _Conn, src_accel: int, dst_accel: int, npa_byte_addr: int,
                       length_or_data: int | bytes, give_up: float) -> Completion[Loaded]:
        session = conn.session
        waiter = RequestWait(conn.peer, session.send_request(
            src_accel, dst_accel, npa_byte_addr, length_or_data, now=trio.current_time(),
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
                if isinstance(target, _Parked):
                    if target.completion is not None:
                        target.expire()
                elif target.timer_at == when:
                    target.timer_at = math.inf
                    if target.down is None:
                        self._session_timer(target, now)

    def _session_timer(self, conn: _Conn, now: float) -> None:
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
            conn.drop(_LinkDown(dead.reason, logging.WARNING))
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
            waiter = conn.pings[token] = _Waiter()
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


def _outcomes(err: DrmError, now: float, count: int) -> Completion[list[SendOutcome]]:
    """A batch's outcomes known at once: every message failed with `err` at `now`."""
    c: Completion[list[SendOutcome]] = Completion()
    c.set_result([(err, now) for _ in range(count)])
    return c


def _pass_on(to: Completion[Any], c: Completion[Any]) -> None:
    """What a parked use queued, once answered: to the Completion its sender holds."""
    try:
        to.set_result(c.result())
    except Exception as e:  # (its error, handed on as its own)
        to.set_error(e)
