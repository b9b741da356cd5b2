"""One established fabric connection (trio): its byte pump and flow control.

A `Conn` carries one authenticated link's Session over its stream. Its reader task decodes
what comes in and hands it on in the same call (a request is served here, through
`on_request`; anything else goes to the link's `dispatch`); queued frames are written at
once by whoever queues them on plain TCP, as far as the socket takes them, and its writer
task finishes the rest (TLS: all of it).

What a connection holds is bounded, and a full bound stops reading, never drops what the
peer sent in order. A message goes, acknowledged, to its accel's one queue (`on_message`:
the agent's ring); when that queue is full the reader waits for room, and TCP slows the
sender. Data-plane
answers held for a peer that does not take them are capped at HOLD_MAX, past which its
requests wait unserved (DEFER_MAX of them), then reading stops; a peer that takes nothing
for the heartbeat timeout is dropped as not reading (liveness.py).

A MSG's ACK waits, in the session, for the reply the MSG causes, to leave in the same write:
`HeldAcks`, a trio instrument, writes what is still held when the scheduler is about to
wait (everything the MSGs woke has run), or after ACK_COALESCE_STEPS busy batches.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
import socket
from collections import deque
from collections.abc import Callable
from typing import Any

import trio

from ..drm.completion import Completion
from .session import Event, MessageReceived, RequestReceived, Session
from .splice import PipedPayload, PipePool
from .waiting import completed
from .wire import (
    DATA_HEADER_SIZE,
    Dwords,
    FrameType,
    Load,
    RemoteProtocolError,
    Store,
    _NeedData,
)

log = logging.getLogger("ualinkd.fabric.link")

# -> (status: 0 or -errno, the loaded bytes as buffers to send as they are)
OnRequest = Callable[[str, Load | Store], tuple[int, list[memoryview]]]
# (src accel, dst accel, dwords) of an acknowledged message, queued for its accel: None, or
# a Completion that ends once its queue has room (nothing more is read from the peer
# meanwhile: back-pressure).
OnMessage = Callable[[int, int, Dwords], "Completion[None] | None"]

RECEIVE_SIZE = 1 << 20  # one data-plane chunk in as few reads as possible (TLS)
SCRATCH_SIZE = 64 << 10  # plain TCP: per-connection receive buffer for everything but payloads
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
DEFER_MAX = 1024
DEFER_MAX_BYTES = 16 << 20


def tune(stream: trio.abc.Stream, congestion: str) -> None:
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


class HeldAcks(trio.abc.Instrument):
    """The connections whose ACKs `Conn.flush_soon` held back, written once the tasks the
    MSGs woke have run: when the scheduler is about to wait for I/O (everything runnable
    ran: a reply took the ACKs with it, or none is coming), or after ACK_COALESCE_STEPS
    batches of a daemon that stays busy. A trio instrument, not the writer task: its turns
    (a wake-up and two checkpoints per MSG read) cost every import four on both daemons."""

    def __init__(self) -> None:
        self.held: dict[Conn, int] = {}  # conn -> batches it has waited

    def hold(self, conn: Conn) -> None:
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


class LinkDown(Exception):
    """Why a connection ended (logged once when its link goes down)."""

    def __init__(self, reason: str, level: int = logging.INFO) -> None:
        super().__init__(reason)
        self.level = level


class PingWaiter:
    """A PING's waiter (FabricLink.ping): its PONG, or None when the link dropped first."""

    __slots__ = ("event", "result")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.result: Any = None  # None: the link dropped first

    def set(self, result: Any) -> None:
        self.result = result
        self.event.set()


class Conn:
    """One authenticated connection: its stream, its Session (which keeps its requests and
    timers), its reader and writer (the byte pump, flow control), its PINGs.

    On plain TCP (`fd` set) queued frames are written at once by whoever queues them, as far
    as the socket takes them without blocking; the writer task only finishes what is left
    (`pending`). Saves a task switch per frame on the data plane's round trips."""

    def __init__(self, peer: str, stream: trio.abc.Stream, session: Session, label: str, *,
                 node: str, on_message: OnMessage, dispatch: Callable[[Conn, Event], None],
                 on_request: OnRequest | None, on_progress: Callable[[], object]) -> None:
        self.peer = peer
        self.node = node  # ours (for the log)
        # A message, acknowledged, to its accel's queue; events other than a message or a
        # request (an incarnation, a PONG) to `dispatch`, in the reader's call; requests are
        # served here (`on_request`), or refused.
        self.on_message = on_message
        self.dispatch = dispatch
        self.on_request = on_request
        self.on_progress = on_progress  # the writer wrote all it had
        self.stream = stream
        self.session = session
        self.queued = session.queued  # (its frames queued and not yet taken: a list)
        self.label = label
        self.scope = trio.CancelScope()
        self.wake = trio.Event()
        self.writing = False
        self.soon = False  # flush_soon() held ACKs back (in held_acks, until they go)
        self.held_acks: HeldAcks | None = None  # the link's, once it runs this connection
        self.pending: list[Buffer] = []  # bytes the socket did not take yet, in order
        self.held = 0  # their length
        # trio.current_time() is three Python calls (the run's clock behind two wrappers);
        # the clock's own method is one. Read on every frame in and out.
        self.now: Callable[[], float] = trio.lowlevel.current_clock().current_time
        self.stuck_since = self.now()  # since when `pending` has not shrunk
        self.deferred: deque[Load | Store] = deque()  # requests waiting for `held` to drop
        self.deferred_bytes = 0
        self.room = trio.Event()  # set when `deferred` is no longer full
        self.paused = False  # the reader waits (for a ring's room, `deferred` or `held`)
        # session.replied when `held` was last seen below HOLD_MAX (`read`).
        self.replied_mark = 0
        self.not_reading_logged = False
        self.expired = 0  # requests refused past their deadline
        self.pings: dict[int, PingWaiter] = {}
        self.timer_at = math.inf  # when the link's timer task calls session.handle_timer
        # last_rx (bytes came in), last_tx (the socket took bytes from us): liveness.py
        assert session.liveness is not None
        self.live = session.liveness
        # The socket's SO_RCVLOWAT (the reader waits for the rest of a large payload with it)
        # and, meanwhile, the bytes the timer last saw queued: bytes coming in are life.
        self.lowat = 1
        self.inq = 0
        self.down: LinkDown | None = None
        self.data_handle: int | None = None  # its data channel's, from DataChannels.open
        # What binds a data channel to this link (auth.bound_nonce): from its handshake
        self.channel_key = b""
        self.data_broken = trio.Event()  # set when the data plane dropped that channel
        self.close_data: Callable[[int], None] | None = None  # DataChannels.close
        # DataChannels.clock, and the peer's PING it was last told of (push_clocks)
        self.data_clock: Callable[[int, float, tuple[int, float] | None], None] | None = None
        self.clocks_pushed: tuple[int, float] | None = None
        self.sock = stream.socket if isinstance(stream, trio.SocketStream) else None
        self.fd = self.sock.fileno() if self.sock is not None else -1

    @property
    def has_data_to_send(self) -> bool:
        return bool(self.pending) or bool(self.queued)

    def flush(self) -> None:
        # (The lists themselves, not has_data_to_send: a flush runs several times per
        # wake-up, and each property was a call or two.)
        if not self.pending and not self.queued:
            return
        if self.fd >= 0 and not self.writing and not self.pending:
            self.write_now()
        if self.queued:
            self._hold(self.session.data_to_send_parts())
        if self.pending:
            self.wake.set()

    def flush_soon(self) -> None:
        """Flush after the tasks that the frames just read woke have run (HeldAcks): a
        MSG's ACK then leaves in the same write as the reply it caused, one write and one
        wake-up of the peer instead of two. The ACK is delayed by those tasks only (at most
        ACK_COALESCE_STEPS scheduler batches), never past the next write of anything else."""
        if not self.pending and not self.queued:
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
        total = self.held + sum(map(len, new))  # (map: no generator frame per write)
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
            self.drop(LinkDown(f"send failed: {e!r}"))
        if written:
            self.stuck_since = self.live.last_tx = self.now()
        self._hold(bufs, total - written)

    def _hold(self, bufs: list[Buffer], size: int | None = None) -> None:
        """Keep `bufs` (`size` bytes) for the writer, as they are now: a LOAD's answer is
        views of the BO's memory, and what it sends must be the bytes when it was served."""
        if not bufs:
            return
        if not self.pending:
            self.stuck_since = self.now()
        self.pending += [bytes(b) if isinstance(b, memoryview) else b for b in bufs]
        self.held += sum(map(len, bufs)) if size is None else size

    def drop(self, reason: LinkDown) -> None:
        if self.down is None:
            self.down = reason
        if self.data_handle is not None and self.close_data is not None:
            # At once, not at the teardown a few scheduler turns later: a load the data
            # plane carried meanwhile would get bytes where the link's faults.
            handle, self.data_handle = self.data_handle, None
            self.close_data(handle)
        self.scope.cancel()

    def push_clocks(self) -> None:
        """The data channel's STORE deadlines follow the link's clocks (the peer's last
        PING): told at the channel's open and after each PING."""
        origin, peer_clock = self.session.clocks
        if self.data_handle is not None and self.data_clock is not None \
                and (peer_clock is None or peer_clock is not self.clocks_pushed):
            self.clocks_pushed = peer_clock
            self.data_clock(self.data_handle, origin, peer_clock)

    def _request(self, req: Load | Store) -> None:
        """A LOAD/STORE from the peer: served now, or in order behind those waiting for
        what is held for the peer to drop below HOLD_MAX."""
        if self.deferred or self.held >= HOLD_MAX:  # in order, behind those waiting
            if not self.not_reading_logged:
                self.not_reading_logged = True
                log.warning("fabric %s: %s is not taking its answers (%d MiB held for "
                            "it): its requests wait unserved", self.node,
                            self.peer, self.held >> 20)
            self.deferred.append(req)
            self.deferred_bytes += len(req.data) if isinstance(req, Store) else 0
        else:
            self._serve(req)

    async def read(self) -> None:
        """The reader task: bytes in, frames decoded and handed on, as fast as the peer
        sends and we take them (flow control: a ring's room, DEFER_MAX, HOLD_MAX)."""
        session, live, dispatch, now = self.session, self.live, self.dispatch, self.now
        on_message = self.on_message
        # Plain TCP: receive into one reusable buffer, and the rest of a large STORE / DATA
        # payload straight into its own buffer (one copy of a megabyte, not three), with
        # plain non-blocking reads (trio's recv adds a task switch each). TLS: receive_some.
        # A large DATA payload is spliced into a pipe instead (fabric/splice.py): a GPU load's
        # FUSE reply splices it on from there.
        sock, fd = self.sock, self.fd
        scratch = memoryview(bytearray(SCRATCH_SIZE))
        pipes = PipePool() if fd >= 0 else None
        piped: PipedPayload | None = None
        unyielded = 0  # reads in a row that found bytes without waiting for them
        drained = False  # the last read into scratch emptied the socket
        try:
            while True:
                # Frames first: the handshake's last read may have brought some already.
                acked = False
                if self.data_handle is not None and session.clocks[1] is not self.clocks_pushed:
                    self.push_clocks()  # (a PING came)
                while not isinstance(ev := session.next_event(now()), _NeedData):
                    # A MSG's ACK is queued in the session as the MSG is decoded, so it goes
                    # out ahead of anything the MSG causes whenever it is written. Data-plane
                    # answers go out at once; a MSG's ACK waits for the reply the message
                    # usually causes (written by another task), to share its write.
                    if type(ev) is MessageReceived:
                        acked = True
                        room = on_message(ev.src_accel, ev.dst_accel, ev.dwords)
                        if room is not None and not room.done:  # its ring is full
                            self.flush()  # the ACKs of what waits in the ring go out now
                            self.paused = True  # read nothing more until it has room
                            await completed(room)
                            self.paused = False
                    elif type(ev) is RequestReceived:
                        self.flush()  # answers to earlier requests leave as we go
                        self._request(ev.request)
                    else:
                        dispatch(self, ev)
                    while len(self.deferred) >= DEFER_MAX or self.deferred_bytes >= DEFER_MAX_BYTES:
                        self.flush()
                        self.paused = True  # the peer does not take its answers: read no more
                        self.room = trio.Event()
                        await self.room.wait()
                        self.paused = False
                # Its frame was dispatched above, and its consumers ran in that call
                # (drm/loaded.py's contract): no await may come between the two.
                if piped is not None and not piped.left:
                    piped.settle()
                    piped = None
                if acked or self.soon:  # (self.soon: ACKs still owed from an earlier read)
                    self.flush_soon()
                else:
                    self.flush()
                if self.held < HOLD_MAX:
                    self.replied_mark = session.replied
                elif session.replied - self.replied_mark >= HOLD_MAX:
                    await self._wait_taken()
                if unyielded >= BUSY_READS:
                    # A busy link must not starve the rest. A frame that takes two reads
                    # (a large payload's header, then its bytes) is not a busy link: a turn
                    # there cost every 1 MiB load a scheduler round.
                    await trio.lowlevel.checkpoint()
                    unyielded = 0
                if sock is None:
                    data: Buffer = await self.stream.receive_some(RECEIVE_SIZE)
                    if not data:
                        raise LinkDown(f"{self.peer} closed the connection")
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
                                elif drained:
                                    # The last read took less than scratch holds: the
                                    # socket was empty then. Wait for it rather than read
                                    # it again for an EAGAIN (an exception on every
                                    # wake-up, both daemons' twice per import); bytes that
                                    # came meanwhile make the wait end at once.
                                    n = -1
                                elif session.expects_large_data:
                                    # Only the next frame's header (a large DATA's, likely):
                                    # the payload is then spliced whole, none of it copied
                                    # through scratch and again into the FUSE reply's pipe.
                                    n = os.readv(fd, [scratch[:DATA_HEADER_SIZE]])
                                else:
                                    n = os.readv(fd, [scratch])
                                    drained = n < SCRATCH_SIZE
                            elif piped.piping:
                                n = piped.splice_from(fd)
                            else:
                                n = os.readv(fd, [piped.rest()])
                                piped.received(n)
                            if n >= 0:
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
                        drained = False
                        want = (piped.left if piped is not None
                                else 1 if into is None else len(into))
                        if want != self.lowat:
                            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, want)
                            self.lowat, self.inq = want, 0
                        await trio.lowlevel.wait_readable(fd)  # (fd: no fileno() call)
                        unyielded = 0
                    if not n:
                        raise LinkDown(f"{self.peer} closed the connection")
                    if piped is None and into is None:
                        session.receive_data(scratch[:n])
                    else:  # (into the payload's own buffer, or its pipe)
                        session.received_into(n)
                live.last_rx = now()
        except RemoteProtocolError as e:
            self.drop(LinkDown(f"protocol error: {e}", logging.WARNING))
        except LinkDown as e:
            self.drop(e)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
            self.drop(LinkDown(f"receive failed: {e!r}"))
        finally:
            if piped is not None:
                piped.close()
            if pipes is not None:
                pipes.close()

    async def _wait_taken(self) -> None:
        """The peer's MSGs and PINGs made us queue HOLD_MAX of ACKs and PONGs since it last
        had less than HOLD_MAX held for it: it sends faster than it takes them (requests
        wait in `deferred` instead, but these are answered as they are read). Read nothing
        more from it until it has taken what is held; TCP slows it down meanwhile, and
        its liveness drops it if it takes nothing for the heartbeat timeout."""
        if not self.not_reading_logged:
            self.not_reading_logged = True
            log.warning("fabric %s: %s is not taking its answers (%d MiB held for it): "
                        "reading from it waits", self.node, self.peer, self.held >> 20)
        self.flush()
        self.paused = True
        while self.held >= HOLD_MAX:
            self.room = trio.Event()
            await self.room.wait()
        self.paused = False
        self.replied_mark = self.session.replied

    def _serve(self, req: Load | Store) -> None:
        session = self.session
        if session.expired(req, self.now()):
            self.expired += 1
            if self.expired == 1:  # one line per link; the count when it goes down
                log.warning("fabric %s: refused a %s from %s past its deadline (its "
                            "requester had given up)", self.node,
                            type(req).__name__.upper(), self.peer)
            session.send_data(req.seq, -errno.ETIME)
        elif self.on_request is None:
            session.send_data(req.seq, -errno.EOPNOTSUPP)
        else:
            status, data = self.on_request(self.peer, req)
            session.send_data(req.seq, status, data)

    def _serve_deferred(self) -> None:
        """Serve waiting requests, in order, while what is held for the peer allows."""
        while self.deferred and self.held < HOLD_MAX and self.down is None:
            req = self.deferred.popleft()
            self.deferred_bytes -= len(req.data) if isinstance(req, Store) else 0
            self._serve(req)
            self.flush()
        if len(self.deferred) < DEFER_MAX and self.deferred_bytes < DEFER_MAX_BYTES:
            self.room.set()

    async def write(self) -> None:
        """The writer task: finishes what `flush` could not write at once (all of it, with
        TLS), and serves the requests that waited for room."""
        try:
            while True:
                await self.wake.wait()
                self.wake = trio.Event()
                self.writing = True
                while self.has_data_to_send or self.deferred:
                    if self.sock is not None:
                        await trio.lowlevel.wait_writable(self.sock)
                        self.write_now()
                    else:
                        parts = self.pending + self.session.data_to_send_parts()
                        self.pending = []
                        self.held = sum(len(p) for p in parts)
                        for part in parts:
                            await self.stream.send_all(part)
                            self.held -= len(part)
                            self.stuck_since = self.live.last_tx = self.now()
                    self._serve_deferred()
                self.writing = False
                self.on_progress()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
            self.drop(LinkDown(f"send failed: {e!r}"))


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
