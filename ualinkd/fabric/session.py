"""One established (authenticated) fabric link to a peer node, sans-IO in h11's shape: bytes in
(`receive_data`), events out (`next_event`), frames to send queued as bytes (`data_to_send`).
It enforces the transport stamp (spec §5.1) and answers MSG with ACK before delivering it.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Final

from .wire import (
    HANDSHAKE_FRAMES,
    MAX_DATA,
    NEED_DATA,
    Ack,
    Data,
    Dwords,
    Frame,
    FrameDecoder,
    FrameType,
    Load,
    LocalProtocolError,
    Msg,
    Ping,
    Pong,
    RemoteProtocolError,
    Store,
    _NeedData,
    encode_data_parts,
    encode_frame_parts,
)

_BIG = 64 << 10  # buffers this large are sent as they are, not joined

SEQ_MOD: Final = 1 << 32


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
    data: bytes | bytearray


Event = MessageReceived | AckReceived | PongReceived | RequestReceived | DataReceived


class Session:
    """The established link to node `peer`, whose accels are `peer_accels`; ours are `local_accels`.

    Every MSG, LOAD and STORE must carry a `src_accel` of the peer and a `dst_accel` of ours
    (the fabric's stamp, §5.1): anything else means the peer lies, and is RemoteProtocolError.
    Replies (ACK, DATA) must answer a request of the matching kind; one for a request we have
    forgotten (its sender gave up waiting) is dropped silently.
    """

    def __init__(self, peer: str, peer_accels: Collection[int], local_accels: Collection[int],
                 decoder: FrameDecoder | None = None) -> None:
        self.peer = peer
        self._peer_accels = frozenset(peer_accels)
        self._local_accels = frozenset(local_accels)
        self._decoder = decoder or FrameDecoder()
        self._out: list[bytes | bytearray | memoryview] = []
        self._next_seq = 1
        self._issued = 0
        self._outstanding: dict[int, FrameType] = {}  # seq -> MSG | LOAD | STORE
        self._pings: set[int] = set()

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
        self._check_stamp(src_accel, dst_accel, outgoing=True)
        seq = self._seq()
        self._queue(Msg(seq, src_accel, dst_accel, tuple(dwords)))
        self._outstanding[seq] = FrameType.MSG
        return seq

    def send_request(self, src_accel: int, dst_accel: int, npa_byte_addr: int,
                     length_or_data: int | bytes) -> int:
        """Queue a LOAD (an int length) or a STORE (the bytes); returns the seq DATA answers."""
        self._check_stamp(src_accel, dst_accel, outgoing=True)
        seq = self._seq()
        if isinstance(length_or_data, int):
            frame: Frame = Load(seq, src_accel, dst_accel, npa_byte_addr, length_or_data)
        else:
            frame = Store(seq, src_accel, dst_accel, npa_byte_addr, bytes(length_or_data))
        self._queue(frame)
        self._outstanding[seq] = frame.frame_type
        return seq

    def send_data(self, seq: int, status: int,
                  data: bytes | Sequence[bytes | bytearray | memoryview] = b"") -> None:
        """Queue the DATA answering `seq`. `data` may be several buffers (an exporter's BO
        chunks): they are queued as they are, for the socket to copy, not joined here."""
        if isinstance(data, bytes):
            self._queue(Data(seq, status, data))
        else:
            self._out.extend(encode_data_parts(seq, status, data))

    def send_ping(self, token: int, *, track: bool = True) -> None:
        """Queue a PING; a tracked token comes back as PongReceived, an untracked one is eaten."""
        if track:
            self._pings.add(token)
        self._queue(Ping(token))

    def forget(self, seq: int) -> None:
        """The sender stopped waiting for `seq`: a late reply is dropped, not an error."""
        self._outstanding.pop(seq, None)

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

    # -- receiving ---------------------------------------------------------------------------
    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        self._decoder.receive_data(data)

    def receive_buffer(self) -> memoryview | None:
        """Where the rest of a large incoming payload goes (FrameDecoder.receive_buffer)."""
        return self._decoder.receive_buffer()

    def received_into(self, n: int) -> None:
        self._decoder.received_into(n)

    def next_event(self) -> Event | _NeedData:
        while True:
            frame = self._decoder.next_frame()
            if frame is NEED_DATA:
                return NEED_DATA
            event = self._handle(frame)
            if event is not None:
                return event

    def _handle(self, frame: Frame) -> Event | None:
        ft = frame.frame_type
        if ft == FrameType.MSG:
            self._check_stamp(frame.src_accel, frame.dst_accel)
            # §5.1: the peer's firmware accepts a message before its driver sees it.
            self._queue(Ack(frame.seq, 0))
            return MessageReceived(frame.src_accel, frame.dst_accel, frame.dwords)
        if ft == FrameType.ACK:
            return self._reply(frame.seq, (FrameType.MSG,), AckReceived(frame.seq, frame.status))
        if ft == FrameType.PING:
            self._queue(Pong(frame.token))
            return None
        if ft == FrameType.PONG:
            if frame.token in self._pings:
                self._pings.discard(frame.token)
                return PongReceived(frame.token)
            return None
        if ft in (FrameType.LOAD, FrameType.STORE):
            self._check_stamp(frame.src_accel, frame.dst_accel)
            if ft == FrameType.LOAD and frame.length > MAX_DATA:
                raise RemoteProtocolError(
                    f"{self.peer}: LOAD of {frame.length} bytes > {MAX_DATA}")
            return RequestReceived(frame)
        if ft == FrameType.DATA:
            return self._reply(frame.seq, (FrameType.LOAD, FrameType.STORE),
                               DataReceived(frame.seq, frame.status, frame.data))
        assert ft in HANDSHAKE_FRAMES
        raise RemoteProtocolError(f"{self.peer}: {ft.name} after the handshake")

    def _reply(self, seq: int, kinds: tuple[FrameType, ...], event: Event) -> Event | None:
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
