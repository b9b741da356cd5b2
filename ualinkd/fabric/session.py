"""One established (authenticated) fabric link to a peer node, sans-IO in h11's shape: bytes in
(`receive_data`), events out (`next_event`), frames to send queued as bytes (`data_to_send`).
It enforces the transport stamp (spec §5.1) and answers MSG with ACK before delivering it.

Time is an input (aioquic's `now`, seconds on the caller's monotonic clock), never read here.
Each side's link clock is milliseconds since its Session began, mod 2^32; every PING carries
the sender's. A requester stamps each LOAD/STORE with a deadline on the *receiver's* link
clock: the latest receiver time by which it could still take the answer, from a lower bound
of the receiver's clock now (its last PING's clock plus the time since it was received: the
PING left no later than it arrived). So a receiver that finds a request past its deadline
knows the requester has given up, and refuses it unserved (`expired`): a store whose
requester reported an error never changes memory later (README, emulator decisions).

A PING with token HEARTBEAT is a heartbeat: it carries the clock and proves the sender alive,
and is not answered (each side sends its own, so a PONG would only double the traffic). Any
other token is answered with a PONG of the same token (round trips, liveness probes).

The requests' bookkeeping and the link's timers are here too, aioquic's way: a request's
sender hands its `Waiter` to `expect(waiter, give_up)`; the reply completes it in
`next_event`'s call (no event comes out for it), `handle_timer(now)` fails the waits whose
time is up (forgetting their seqs: a late reply is then dropped) and queues the PINGs the
link's liveness asks for (liveness.py), or says the link is dead; `get_timer()` says when it
is next due. `close(now)` fails what still waits when the link drops. The waits are
Completions (drm/completion.py): `RequestWait` for a LOAD/STORE, `BatchWait` for the ACKs of
MSGs queued together.
"""

from __future__ import annotations

import errno
import heapq
import itertools
import math
import secrets
import struct
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol, TypeVar

from ..drm.completion import Completion
from ..drm.errors import DrmError
from ..drm.loaded import Loaded
from .liveness import Dead, Liveness
from .liveness import Ping as LivePing
from .wire import (
    _FAST,
    COLLECT_AT,
    HANDSHAKE_FRAMES,
    MAX_DATA,
    NEED_DATA,
    Data,
    Dwords,
    Frame,
    FrameDecoder,
    FrameType,
    Incarnation,
    Load,
    LocalProtocolError,
    Ping,
    Pong,
    RemoteProtocolError,
    Sink,
    Store,
    _NeedData,
    encode_data_parts,
    encode_frame_parts,
)

_BIG = 64 << 10  # buffers this large are sent as they are, not joined
# The message round trip's frames, packed whole (wire.encode_frame's fast path, as the
# tests prove it equal to the construct layouts).
_MSG, _ACK = FrameType.MSG, FrameType.ACK
_MSG_PACK: Final = _FAST[FrameType.MSG]
_ACK_PACK: Final = _FAST[FrameType.ACK].pack
_ACK_LENGTH: Final = _FAST[FrameType.ACK].size - 4
_PONG_SIZE: Final = _FAST[FrameType.PONG].size

_Reply = TypeVar("_Reply", "AckReceived", "DataReceived")
SEQ_MOD: Final = 1 << 32
CLOCK_MOD: Final = 1 << 32  # link clocks in ms wrap after 49 days: compared modulo
# Of a requester's wait, the part kept back for the answer's way home (a quarter of it, at
# most ANSWER_MARGIN seconds): a request served later is refused, so that the answer of one
# served can still arrive in time.
ANSWER_MARGIN: Final = 0.5
HEARTBEAT: Final = 0  # the token of a PING that wants no PONG


@dataclass(frozen=True, slots=True)
class MessageReceived:
    """A MSG from the peer, already ACKed (the ACK is queued ahead of anything sent later)."""

    src_accel: int
    dst_accel: int
    dwords: Dwords


@dataclass(frozen=True, slots=True)
class AckReceived:
    seq: int
    status: int


@dataclass(frozen=True, slots=True)
class PongReceived:
    token: int


@dataclass(frozen=True, slots=True)
class RequestReceived:
    """A data-plane LOAD or STORE to answer with `Session.send_data(request.seq, ...)`."""

    request: Load | Store


@dataclass(frozen=True, slots=True)
class DataReceived:
    seq: int
    status: int
    data: bytes | bytearray | Sink  # Sink: a payload the reader diverted (a PipedPayload)


@dataclass(frozen=True, slots=True)
class IncarnationReceived:
    """The peer's accel `accel` now runs manager incarnation `incarnation` (§13 N2)."""

    accel: int
    incarnation: int


Event = (MessageReceived | AckReceived | PongReceived | RequestReceived | DataReceived
         | IncarnationReceived)

# A message's outcome: None (accepted) or the DrmError its send gives, and when that became
# known (its ACK's arrival; the deadline or the link's drop, for one that never came).
SendOutcome = tuple[DrmError | None, float]


class Waiter(Protocol):
    """Who takes the replies to `seqs` (Session.expect). `completion` is None once it is
    done (its entry in the timer heap is then dropped)."""

    @property
    def seqs(self) -> Sequence[int]: ...

    @property
    def completion(self) -> Completion[Any] | None: ...

    def answered(self, seq: int, status: int, data: Any, now: float) -> None:
        """The reply to `seq` (its status; a DATA's payload, None for an ACK), at `now`."""

    def failed(self, now: float, dropped: bool) -> None:
        """No more replies come: its time is up, or (`dropped`) the link dropped."""


class RequestWait:
    """A LOAD/STORE's wait: its DATA gives the loaded bytes (b"" for a STORE; a payload the
    reader holds in a pipe, drm/loaded.py), or DrmError: the exporter's -errno, EFAULT when
    no answer came (Emulator policy 3, 10)."""

    __slots__ = ("completion", "peer", "seqs")

    def __init__(self, peer: str, seq: int) -> None:
        self.peer = peer
        self.seqs = (seq,)
        # Dropped once set: the timer heap keeps this waiter until its deadline, and must not
        # keep the loaded bytes that long.
        self.completion: Completion[Loaded] | None = Completion()

    def answered(self, seq: int, status: int, data: Any, now: float) -> None:
        c, self.completion = self.completion, None
        if c is None:
            return
        if status != 0:
            c.set_error(DrmError(-status if status < 0 else errno.EFAULT))
        else:
            c.set_result(data)

    def failed(self, now: float, dropped: bool) -> None:
        c, self.completion = self.completion, None
        if c is not None:
            c.set_error(DrmError(errno.EFAULT, f"no answer from {self.peer}"))


class BatchWait:
    """One wait for the ACKs of several MSGs queued together (FabricLink.send_batch): it
    notes every ACK with the time it came, and completes once, when the last is in, its
    time is up or the link dropped, with each message's outcome in order: so a burst of N
    messages costs one callback."""

    __slots__ = ("ack_timeout", "acks", "completion", "dropped", "left", "peer", "seqs")

    def __init__(self, peer: str, seqs: Sequence[int], ack_timeout: float) -> None:
        self.peer = peer
        self.seqs = seqs
        self.ack_timeout = ack_timeout
        self.acks: dict[int, tuple[int, float]] = {}  # seq -> (ACK status, when it came)
        self.left = len(seqs)
        self.dropped = False
        self.completion: Completion[list[SendOutcome]] | None = Completion()

    def answered(self, seq: int, status: int, data: Any, now: float) -> None:
        self.acks[seq] = (status, now)
        self.left -= 1
        if not self.left:
            self._finish(now)

    def failed(self, now: float, dropped: bool) -> None:
        self.dropped = dropped  # (what is not acknowledged now never will be)
        self._finish(now)

    def _finish(self, now: float) -> None:
        c, self.completion = self.completion, None
        if c is not None:
            c.set_result(self.outcomes(now))

    def outcomes(self, now: float) -> list[SendOutcome]:
        """Each MSG's outcome, in order: accepted (None), refused by the peer (ECOMM), or
        never acknowledged (ETIME, at `now`)."""
        peer = self.peer
        out: list[SendOutcome] = []
        missing = (f"link to {peer} dropped before the ACK" if self.dropped else
                   f"no ACK from {peer} within {self.ack_timeout:g} s")
        for seq in self.seqs:
            got = self.acks.get(seq)
            if got is None:
                out.append((DrmError(errno.ETIME, missing), now))
            elif got[0] != 0:
                out.append((DrmError(errno.ECOMM, f"{peer} refused the message "
                                                  f"(status {got[0]})"), got[1]))
            else:
                out.append((None, got[1]))
        return out


class Session:
    """The established link to node `peer`, whose accels are `peer_accels`; ours are `local_accels`.

    Every MSG, LOAD and STORE must carry a `src_accel` of the peer and a `dst_accel` of ours
    (the fabric's stamp, §5.1): anything else means the peer lies, and is RemoteProtocolError.
    Replies (ACK, DATA) must answer a request of the matching kind; one for a request we have
    forgotten (its sender gave up waiting) is dropped silently.
    """

    def __init__(self, peer: str, peer_accels: Collection[int], local_accels: Collection[int],
                 decoder: FrameDecoder | None = None, *, now: float = 0.0,
                 liveness: Liveness | None = None) -> None:
        self.peer = peer
        # When to PING and when the link is dead (None: the caller keeps no heartbeats).
        self.liveness = liveness
        self._origin = now  # our link clock's zero
        # The peer's clock from its last PING: (its link clock in ms, our `now` on receipt).
        self._peer_clock: tuple[int, float] | None = None
        self._peer_accels = frozenset(peer_accels)
        self._local_accels = frozenset(local_accels)
        self._decoder = decoder or FrameDecoder()
        # The decoder's methods as ours, not wrapped: the reader calls them on every pass (a
        # wrapper was a Python call more each, on every wake-up).
        self.receive_data: Callable[[bytes | bytearray | memoryview], None] = \
            self._decoder.receive_data
        self.receive_buffer: Callable[[], memoryview | None] = self._decoder.receive_buffer
        self.received_into: Callable[[int], None] = self._decoder.received_into
        self.collecting: Callable[[], FrameType | None] = self._decoder.collecting
        self._out: list[bytes | bytearray | memoryview] = []
        # The same list, for the link to test for bytes to send without a call (it does on
        # every flush, several per wake-up); only this class changes it.
        self.queued: Sequence[bytes | bytearray | memoryview] = self._out
        self._next_seq = 1
        self._issued = 0
        self._outstanding: dict[int, FrameType] = {}  # seq -> MSG | LOAD | STORE
        self._load_length: dict[int, int] = {}  # seq of an outstanding LOAD -> its length
        self._large_loads = 0  # of them, those whose DATA is collected (wire.COLLECT_AT on)
        self._pings: set[int] = set()
        # seq -> who takes its reply; the waits by deadline: (give_up, tie-break, waiter)
        self._waiters: dict[int, Waiter] = {}
        self._timers: list[tuple[float, int, Waiter]] = []
        self._timer_ids = itertools.count()
        self._now = now  # the latest time we were given (replies are dated by it)
        # Bytes of the ACKs and PONGs queued so far in answer to the peer's MSGs and PINGs
        # (the link stops reading from a peer that sends them faster than it takes them).
        self.replied = 0

    # -- sending -----------------------------------------------------------------------------
    def _seq(self) -> int:
        seq = self._next_seq
        self._next_seq = (seq + 1) % SEQ_MOD or 1
        self._issued += 1
        return seq

    def _queue(self, frame: Frame) -> None:
        self._out.extend(encode_frame_parts(frame))

    def send_message(self, src_accel: int, dst_accel: int, dwords: Dwords) -> int:
        """Queue a MSG; returns its seq, which the matching AckReceived carries."""
        return self.send_messages(src_accel, dst_accel, (dwords,))[0]

    def send_messages(self, src_accel: int, dst_accel: int,
                      messages: Sequence[Dwords]) -> list[int]:
        """`send_message` for several messages, in order; their seqs. The stamp is checked
        once and each frame packed as it goes on the wire (a burst of 2,000 NPA_REVOKEs
        should not cost 2,000 frame objects)."""
        self._check_stamp(src_accel, dst_accel, outgoing=True)
        pack, length, ft = _MSG_PACK.pack, _MSG_PACK.size - 4, FrameType.MSG
        outstanding, out = self._outstanding, self._out
        seqs = []
        try:
            for dwords in messages:
                seq = self._seq()
                dw0, dw1, dw2, dw3 = dwords
                out.append(pack(length, ft, seq, src_accel, dst_accel, dw0, dw1, dw2, dw3))
                outstanding[seq] = ft
                seqs.append(seq)
        except (struct.error, ValueError) as e:  # a dword that does not fit; not 4 of them
            raise LocalProtocolError(f"cannot encode a MSG of {dwords!r}: {e}") from None
        return seqs

    @property
    def clocks(self) -> tuple[float, tuple[int, float] | None]:
        """Our link clock's zero and the peer's clock from its last PING (its link clock in
        ms, our time on receipt), or None: for the data channel's STOREs (fuse/dataplane.c),
        stamped and checked as the link's are."""
        return self._origin, self._peer_clock

    def clock(self, now: float) -> int:
        """Our link clock at `now` (what our PINGs carry)."""
        return math.floor((now - self._origin) * 1000) % CLOCK_MOD

    def deadline_for(self, now: float, give_up: float, margin: bool = True) -> int:
        """The Load/Store deadline for a request queued at `now` whose sender stops waiting
        at `give_up` (both our time): on the peer's link clock, a lower bound of it at `now`
        plus what is left of the wait, less the answer's margin (`margin`: a STORE, whose
        late answer would hide a change; a LOAD changes nothing, and is refused only once
        its sender surely gave up). 0 (none) before the peer's first PING; a wait already
        over gives an already-passed deadline."""
        if self._peer_clock is None:
            return 0
        peer_ms, received = self._peer_clock
        lower = peer_ms + math.floor((now - received) * 1000)
        left = give_up - now
        keep = min(ANSWER_MARGIN, left / 4) if margin else 0.0
        budget = math.floor((left - keep) * 1000)
        return (lower + max(budget, -1)) % CLOCK_MOD or CLOCK_MOD - 1

    def expired(self, request: Load | Store, now: float) -> bool:
        """Whether `request`'s deadline has passed on our link clock at `now`: its
        requester no longer waits, so serving it would act on a request reported failed."""
        if not request.deadline:
            return False
        late = (self.clock(now) - request.deadline) % CLOCK_MOD
        return 0 < late < CLOCK_MOD // 2

    def send_request(self, src_accel: int, dst_accel: int, npa_byte_addr: int,
                     length_or_data: int | bytes, *, now: float | None = None,
                     give_up: float | None = None) -> int:
        """Queue a LOAD (an int length) or a STORE (the bytes); returns the seq DATA answers.
        With `now` and `give_up` (when the sender stops waiting), stamped with a deadline."""
        self._check_stamp(src_accel, dst_accel, outgoing=True)
        seq = self._seq()
        store = not isinstance(length_or_data, int)
        deadline = (0 if now is None or give_up is None
                    else self.deadline_for(now, give_up, margin=store))
        if isinstance(length_or_data, int):
            frame: Frame = Load(seq, src_accel, dst_accel, npa_byte_addr, length_or_data,
                                deadline)
        else:
            frame = Store(seq, src_accel, dst_accel, npa_byte_addr, bytes(length_or_data),
                          deadline)
        self._queue(frame)
        self._outstanding[seq] = frame.frame_type
        if isinstance(length_or_data, int):
            self._load_length[seq] = length_or_data
            self._large_loads += length_or_data >= COLLECT_AT
        return seq

    def send_data(self, seq: int, status: int,
                  data: bytes | Sequence[bytes | bytearray | memoryview] = b"") -> None:
        """Queue the DATA answering `seq`. `data` may be several buffers (an exporter's BO
        chunks): they are queued as they are, for the socket to copy, not joined here."""
        if isinstance(data, bytes):
            self._queue(Data(seq, status, data))
        else:
            self._out.extend(encode_data_parts(seq, status, data))

    def send_ping(self, token: int, *, now: float, track: bool = True) -> None:
        """Queue a PING that the peer answers with a PONG; a tracked token comes back as
        PongReceived, an untracked one is eaten. It carries our link clock at `now`, which
        the peer stamps its requests from, so `now` is required: a PING with clock 0 would
        make every request after it look expired. `token` is not HEARTBEAT (no PONG)."""
        if token == HEARTBEAT:
            raise LocalProtocolError("PING token 0 is the heartbeat's, which gets no PONG")
        if track:
            self._pings.add(token)
        self._queue(Ping(token, self.clock(now)))

    def send_incarnation(self, accel: int, incarnation: int) -> None:
        """Queue our accel `accel`'s manager incarnation (§13 N2), in order with our MSGs."""
        if accel not in self._local_accels:
            raise LocalProtocolError(f"accel {accel} is not ours to announce to {self.peer}")
        self._queue(Incarnation(accel, incarnation))

    def send_heartbeat(self, *, now: float) -> None:
        """Queue a heartbeat PING: our link clock at `now`, and no PONG asked for."""
        self._queue(Ping(HEARTBEAT, self.clock(now)))
        if self.liveness is not None:
            self.liveness.ping_queued(now)

    def forget(self, seq: int) -> None:
        """The sender stopped waiting for `seq`: a late reply is dropped, not an error."""
        self._outstanding.pop(seq, None)
        self._load_done(seq)

    def _load_done(self, seq: int) -> None:
        if self._load_length.pop(seq, 0) >= COLLECT_AT:
            self._large_loads -= 1

    @property
    def expects_large_data(self) -> bool:
        """A LOAD whose DATA the decoder will collect is outstanding, and no frame is part
        read: the reader may then read just the next frame's DATA header, so that all of a
        large payload can be spliced (none of it copied in with the header)."""
        return self._large_loads > 0 and not self._decoder.buffered

    def forget_ping(self, token: int) -> None:
        self._pings.discard(token)

    def data_to_send(self) -> bytes:
        out = b"".join(self._out)
        self._out.clear()
        return out

    def data_to_send_parts(self) -> list[bytes | bytearray | memoryview]:
        """The queued bytes as few buffers: small frames joined, large data left alone."""
        parts: list[bytes | bytearray | memoryview] = []
        small: list[bytes | bytearray | memoryview] = []
        for b in self._out:
            if len(b) < _BIG:
                small.append(b)
                continue
            if small:
                parts.append(b"".join(small))
                small = []
            parts.append(b)
        if small:
            parts.append(b"".join(small))
        self._out.clear()
        return parts

    @property
    def has_data_to_send(self) -> bool:
        return bool(self._out)

    # -- waiting for replies -----------------------------------------------------------------
    def expect(self, waiter: Waiter, give_up: float) -> None:
        """`waiter` takes the replies to its seqs (sent already), until `give_up`."""
        for seq in waiter.seqs:
            self._waiters[seq] = waiter
        heapq.heappush(self._timers, (give_up, next(self._timer_ids), waiter))

    @property
    def waiting(self) -> int:
        """Seqs whose reply a waiter still expects."""
        return len(self._waiters)

    def get_timer(self) -> float | None:
        """When `handle_timer` is next due (aioquic's): the first wait whose time is up, or
        the liveness's next due time; None when nothing waits and no liveness is kept."""
        timers = self._timers
        while timers and timers[0][2].completion is None:  # answered: gone lazily
            heapq.heappop(timers)
        due = timers[0][0] if timers else None
        if self.liveness is not None:
            live = self.liveness.next_due()
            due = live if due is None else min(due, live)
        return due

    def handle_timer(self, now: float) -> Dead | None:
        """Fail the waits whose time is up at `now`: their seqs are forgotten (a late reply
        is dropped, not an error). Answered ones leave the heap here too. Then the
        liveness's turn: a heartbeat or probe PING queued, or Dead (drop the link)."""
        self._now = max(self._now, now)
        timers = self._timers
        while timers and (timers[0][0] <= now or timers[0][2].completion is None):
            _, _, waiter = heapq.heappop(timers)
            if waiter.completion is not None:
                self._give_up(waiter, now, dropped=False)
        if self.liveness is None:
            return None
        verdict = self.liveness.handle(now)
        if verdict is LivePing.PROBE:
            # Answered, unlike a heartbeat (and carrying our clock as well).
            self.send_ping(secrets.randbits(64) or 1, track=False, now=now)
        elif verdict is LivePing.HEARTBEAT:
            self.send_heartbeat(now=now)
        elif verdict is not None:
            return verdict
        return None

    def _give_up(self, waiter: Waiter, now: float, dropped: bool) -> None:
        for seq in waiter.seqs:
            if self._waiters.get(seq) is waiter:
                del self._waiters[seq]
                self.forget(seq)
        waiter.failed(now, dropped)

    def close(self, now: float) -> None:
        """The link dropped: every wait fails now (each waiter once, in the order sent), and
        no timer is left."""
        waiters = list({id(w): w for w in self._waiters.values()}.values())
        self._waiters.clear()
        self._timers.clear()
        self.liveness = None
        for waiter in waiters:
            if waiter.completion is not None:
                waiter.failed(now, dropped=True)

    def _to_waiter(self, event: AckReceived | DataReceived, data: Any = None) -> Event | None:
        """A reply for its waiter, if any (then no event); else the event."""
        waiter = self._waiters.pop(event.seq, None)
        if waiter is None:
            return event
        waiter.answered(event.seq, event.status, data, self._now)
        return None

    # -- receiving ---------------------------------------------------------------------------
    # receive_data, receive_buffer (where the rest of a large incoming payload goes),
    # received_into and collecting (a large payload that may be diverted) are the decoder's
    # own methods, bound in __init__.

    def collecting_size(self) -> int:
        return self._decoder.collecting_size

    def divert(self, sink: Sink) -> bytes:
        """FrameDecoder.divert."""
        return self._decoder.divert(sink)

    def next_event(self, now: float | None = None) -> Event | _NeedData:
        """The next event; `now` is when the bytes were taken in (a PING's clock is dated
        by it; without it, PINGs give the peer's clock no reading)."""
        if now is not None:
            self._now = now
        while True:
            frame = self._decoder.next_frame()
            if isinstance(frame, _NeedData):
                return NEED_DATA
            if now is not None and type(frame) is Ping:
                self._peer_clock = (frame.clock, now)
            event = self._handle(frame)
            if event is not None:
                return event

    def _handle(self, frame: Frame) -> Event | None:
        ft = frame.frame_type
        if ft is _MSG:  # the message round trip's frames first, with nothing on the way
            src, dst = frame.src_accel, frame.dst_accel
            if src not in self._peer_accels or dst not in self._local_accels:
                self._check_stamp(src, dst)  # raises, saying which
            seq = frame.seq
            # §5.1: the peer's firmware accepts a message before its driver sees it.
            self._out.append(_ACK_PACK(_ACK_LENGTH, _ACK, seq, 0))
            self.replied += _ACK_LENGTH + 4
            return MessageReceived(src, dst, frame.dwords)
        if ft is _ACK:
            seq = frame.seq
            if self._outstanding.get(seq) is _MSG:
                del self._outstanding[seq]
                return self._to_waiter(AckReceived(seq, frame.status))
            ack = self._reply(seq, (FrameType.MSG,), AckReceived(seq, frame.status))
            return None if ack is None else self._to_waiter(ack)
        if ft == FrameType.PING:
            if frame.token != HEARTBEAT:
                self._queue(Pong(frame.token))
                self.replied += _PONG_SIZE
            return None
        if ft == FrameType.PONG:
            if frame.token in self._pings:
                self._pings.discard(frame.token)
                return PongReceived(frame.token)
            return None
        if ft == FrameType.INCARNATION:
            if frame.accel not in self._peer_accels:
                raise RemoteProtocolError(
                    f"{self.peer} announced accel {frame.accel}, not one of its own "
                    f"{sorted(self._peer_accels)}")
            return IncarnationReceived(frame.accel, frame.incarnation)
        if type(frame) is Load or type(frame) is Store:
            self._check_stamp(frame.src_accel, frame.dst_accel)
            if type(frame) is Load and frame.length > MAX_DATA:
                raise RemoteProtocolError(
                    f"{self.peer}: LOAD of {frame.length} bytes > {MAX_DATA}")
            return RequestReceived(frame)
        if ft == FrameType.DATA:
            asked = self._load_length.get(frame.seq)
            if asked is not None and len(frame.data) > asked:
                raise RemoteProtocolError(f"{self.peer}: DATA of {len(frame.data)} bytes "
                                          f"answers a LOAD of {asked}")
            event = self._reply(frame.seq, (FrameType.LOAD, FrameType.STORE),
                                DataReceived(frame.seq, frame.status, frame.data))
            if event is None:
                return None
            self._load_done(frame.seq)
            return self._to_waiter(event, frame.data)
        assert ft in HANDSHAKE_FRAMES
        raise RemoteProtocolError(f"{self.peer}: {ft.name} after the handshake")

    def _reply(self, seq: int, kinds: tuple[FrameType, ...], event: _Reply) -> _Reply | None:
        kind = self._outstanding.get(seq)
        if kind is None:
            age = (self._next_seq - seq) % SEQ_MOD
            if seq == 0 or not 0 < age <= min(self._issued, SEQ_MOD // 2):
                raise RemoteProtocolError(f"{self.peer}: reply to seq {seq}, never sent")
            return None  # late: its sender already gave up
        if kind not in kinds:
            raise RemoteProtocolError(
                f"{self.peer}: {type(event).__name__} answers seq {seq}, a {kind.name}")
        del self._outstanding[seq]
        return event

    def _check_stamp(self, src: int, dst: int, *, outgoing: bool = False) -> None:
        if outgoing:
            if src not in self._local_accels or dst not in self._peer_accels:
                raise LocalProtocolError(f"accel {src} -> {dst} does not go over the link "
                                         f"to {self.peer}")
            return
        if src not in self._peer_accels:
            raise RemoteProtocolError(
                f"{self.peer} sent src accel {src}, not one of its own "
                f"{sorted(self._peer_accels)}")
        if dst not in self._local_accels:
            raise RemoteProtocolError(
                f"{self.peer} sent dst accel {dst}, not one of ours {sorted(self._local_accels)}")
