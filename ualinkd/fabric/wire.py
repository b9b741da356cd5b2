"""Byte layouts of the fabric: the seven UALink protocol messages (spec §5.2, §5.3) and the link
frames that carry them between daemons. Sans-IO; construct is the source of truth for every
layout (little-endian), and the hot frames have `struct` fast paths the tests prove equal.

Frame: ``[u32 length][u8 frame type][payload]``, ``length`` = bytes after the length field.
"""

from __future__ import annotations

import enum
import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import ClassVar, Final, Protocol

import construct as cs

# Errors and the protocol messages live with the UALink protocol; re-exported here.
from ..ualink.protocol import (  # noqa: F401
    ACCEL_FIELD_MASK,
    HANDLE_LO_ID_MASK,
    MESSAGE_LAYOUTS,
    MSG_TYPE_MASK,
    U32,
    U64,
    Dwords,
    Hello,
    HelloAck,
    LocalProtocolError,
    Message,
    MsgType,
    NpaFail,
    NpaFailReason,
    NpaRelease,
    NpaReq,
    NpaRevoke,
    NpaRsp,
    ProtocolError,
    RemoteProtocolError,
    UnknownMessage,
    _check,
    decode_message,
    handle_lo_bits,
    rebuild_handle_lo,
)

# --------------------------------------------------------------------------------------------
# Link frames

MAX_DATA: Final = 1 << 20  # bytes of a STORE / DATA payload (one data-plane transfer)
MAX_FRAME: Final = MAX_DATA + 64  # largest `length` accepted; more drops the connection
NONCE_SIZE: Final = 32
MAC_SIZE: Final = 32
# Largest `length` of a handshake frame: AUTH_CHALLENGE with a 255-byte name is 322. Before
# the handshake completes nothing larger is accepted (FrameDecoder.for_handshake).
HANDSHAKE_MAX_FRAME: Final = 512


class FrameType(enum.IntEnum):
    AUTH_HELLO = 0x01
    AUTH_CHALLENGE = 0x02
    AUTH_PROOF = 0x03
    AUTH_OK = 0x04
    MSG = 0x10
    ACK = 0x11
    PING = 0x12
    PONG = 0x13
    INCARNATION = 0x14  # §13 N2: an accel's manager incarnation (protocol version 4)
    LOAD = 0x20  # data plane (GPU loads/stores of NPA ranges): request → DATA
    STORE = 0x21
    DATA = 0x22


HANDSHAKE_FRAMES: Final = frozenset(
    {FrameType.AUTH_HELLO, FrameType.AUTH_CHALLENGE, FrameType.AUTH_PROOF, FrameType.AUTH_OK})


class Channel(enum.IntEnum):
    """What a connection between two daemons is for, as its AUTH_HELLO asks (auth.py)."""

    LINK = 0  # the link: handshake, then every frame type (FabricLink)
    DATA = 1  # a data channel: the handshake, then the data plane's own bytes (FabricLink)


# The first protocol version whose AUTH_HELLO carries the channel byte (after the nonce). An
# older HELLO still parses (as channel 0), so its sender is told which version it speaks.
CHANNEL_VERSION: Final = 3


@dataclass(frozen=True, slots=True)
class AuthHello:
    pod_uuid: uuid.UUID
    node_name: str
    nonce: bytes
    version: int = 4  # auth.PROTOCOL_VERSION (wire sits below auth)
    channel: int = Channel.LINK  # any u8 on the wire; auth.py refuses one it does not know
    frame_type: ClassVar[FrameType] = FrameType.AUTH_HELLO


@dataclass(frozen=True, slots=True)
class AuthChallenge:
    node_name: str
    nonce: bytes
    mac: bytes
    frame_type: ClassVar[FrameType] = FrameType.AUTH_CHALLENGE


@dataclass(frozen=True, slots=True)
class AuthProof:
    mac: bytes
    frame_type: ClassVar[FrameType] = FrameType.AUTH_PROOF


@dataclass(frozen=True, slots=True)
class AuthOk:
    frame_type: ClassVar[FrameType] = FrameType.AUTH_OK


@dataclass(frozen=True, slots=True)
class Msg:
    """One UALink message from accel `src_accel` to accel `dst_accel`; answered by an ACK."""

    seq: int
    src_accel: int
    dst_accel: int
    dwords: Dwords
    frame_type: ClassVar[FrameType] = FrameType.MSG


@dataclass(frozen=True, slots=True)
class Ack:
    """The peer accepted MSG `seq` (status 0) or refused it (a negative errno)."""

    seq: int
    status: int
    frame_type: ClassVar[FrameType] = FrameType.ACK


@dataclass(frozen=True, slots=True)
class Ping:
    """`clock`: the sender's link clock (ms since its side of the link came up, mod 2^32),
    from which the receiver stamps its data-plane requests (Session.send_request)."""

    token: int
    clock: int = 0
    frame_type: ClassVar[FrameType] = FrameType.PING


@dataclass(frozen=True, slots=True)
class Pong:
    token: int
    frame_type: ClassVar[FrameType] = FrameType.PONG


@dataclass(frozen=True, slots=True)
class Incarnation:
    """The sender's accel `accel` runs manager incarnation `incarnation` (§13 N2): sent for
    each of its accels when the link comes up and again at each manager start, ahead of
    anything that incarnation sends; what the receiver's probe of that accel reads."""

    accel: int
    incarnation: int
    frame_type: ClassVar[FrameType] = FrameType.INCARNATION


@dataclass(frozen=True, slots=True)
class Load:
    """Data plane: read `length` bytes at an NPA byte address of `dst_accel`; answered by DATA.
    `deadline`: on the receiver's link clock, after which the requester no longer waits
    (0: none); a request served later could change memory after its requester reported
    an error, so it is refused instead (Session.expired)."""

    seq: int
    src_accel: int
    dst_accel: int
    npa_byte_addr: int
    length: int
    deadline: int = 0
    frame_type: ClassVar[FrameType] = FrameType.LOAD


@dataclass(frozen=True, slots=True)
class Store:
    """Data plane: write `data` at an NPA byte address of `dst_accel`; answered by DATA."""

    seq: int
    src_accel: int
    dst_accel: int
    npa_byte_addr: int
    data: bytes | bytearray  # bytearray: a large payload received into its own buffer
    deadline: int = 0  # as Load.deadline
    frame_type: ClassVar[FrameType] = FrameType.STORE


class Sink(Protocol):
    """Where a reader collects a diverted payload (FrameDecoder.divert): a DATA frame then
    carries it as its data. Its length is the payload's."""

    def __len__(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Data:
    """The answer to LOAD (the bytes) or STORE (no bytes); status 0 or a negative errno."""

    seq: int
    status: int
    # bytearray: a large payload received into its own buffer; a Sink: one a reader diverted.
    data: bytes | bytearray | Sink = b""
    frame_type: ClassVar[FrameType] = FrameType.DATA


Frame = (AuthHello | AuthChallenge | AuthProof | AuthOk | Msg | Ack | Ping | Pong
         | Incarnation | Load | Store | Data)

FRAME_CLASSES: Final[dict[FrameType, type]] = {
    c.frame_type: c for c in (AuthHello, AuthChallenge, AuthProof, AuthOk, Msg, Ack, Ping, Pong,
                              Incarnation, Load, Store, Data)
}

_NAME = cs.Prefixed(cs.Int8ul, cs.GreedyBytes)
_ACCELS = ("seq" / cs.Int32ul, "src_accel" / cs.Int16ul, "dst_accel" / cs.Int16ul)

# construct: the single source of truth for every frame payload. `Terminated` refuses
# trailing bytes, so a fixed-size frame with the wrong length does not parse.
FRAME_PAYLOADS: Final[dict[FrameType, cs.Construct]] = {
    FrameType.AUTH_HELLO: cs.Struct(
        "version" / cs.Int16ul, "pod_uuid" / cs.Bytes(16), "node_name" / _NAME,
        "nonce" / cs.Bytes(NONCE_SIZE),
        "channel" / cs.If(cs.this.version >= CHANNEL_VERSION, cs.Int8ul), cs.Terminated),
    FrameType.AUTH_CHALLENGE: cs.Struct(
        "node_name" / _NAME, "nonce" / cs.Bytes(NONCE_SIZE), "mac" / cs.Bytes(MAC_SIZE),
        cs.Terminated),
    FrameType.AUTH_PROOF: cs.Struct("mac" / cs.Bytes(MAC_SIZE), cs.Terminated),
    FrameType.AUTH_OK: cs.Struct(cs.Terminated),
    FrameType.MSG: cs.Struct(*_ACCELS, "dwords" / cs.Array(4, cs.Int32ul), cs.Terminated),
    FrameType.ACK: cs.Struct("seq" / cs.Int32ul, "status" / cs.Int32sl, cs.Terminated),
    FrameType.PING: cs.Struct("token" / cs.Int64ul, "clock" / cs.Int32ul, cs.Terminated),
    FrameType.PONG: cs.Struct("token" / cs.Int64ul, cs.Terminated),
    FrameType.INCARNATION: cs.Struct("accel" / cs.Int16ul, "incarnation" / cs.Int64ul,
                                     cs.Terminated),
    FrameType.LOAD: cs.Struct(
        *_ACCELS, "npa_byte_addr" / cs.Int64ul, "length" / cs.Int32ul,
        "deadline" / cs.Int32ul, cs.Terminated),
    FrameType.STORE: cs.Struct(*_ACCELS, "npa_byte_addr" / cs.Int64ul, "deadline" / cs.Int32ul,
                               "data" / cs.GreedyBytes),
    FrameType.DATA: cs.Struct("seq" / cs.Int32ul, "status" / cs.Int32sl, "data" / cs.GreedyBytes),
}
FRAME_HEADER: Final = cs.Struct("length" / cs.Int32ul, "type" / cs.Int8ul)
HEADER_SIZE: Final = 5

# Fast paths for the frames of every message round trip (whole frame, header included).
_FAST: Final[dict[FrameType, struct.Struct]] = {
    FrameType.MSG: struct.Struct("<IBIHH4I"),
    FrameType.ACK: struct.Struct("<IBIi"),
    FrameType.PING: struct.Struct("<IBQI"),
    FrameType.PONG: struct.Struct("<IBQ"),
}
# Decoding them (FrameDecoder): a MSG's and an ACK's fields straight out of the stream buffer.
_MSG_FIELDS: Final = struct.Struct("<IHH4I")
_ACK_FIELDS: Final = struct.Struct("<Ii")
_MSG_LENGTH: Final = _FAST[FrameType.MSG].size - 4
_ACK_LENGTH: Final = _FAST[FrameType.ACK].size - 4
_LENGTH: Final = struct.Struct("<I")
# ... and for the data plane, whose payloads can be a megabyte: header struct + raw bytes.
_LOAD: Final = struct.Struct("<IBIHHQII")
_STORE_HDR: Final = struct.Struct("<IBIHHQI")
_DATA_HDR: Final = struct.Struct("<IBIi")


def _to_fields(frame: Frame) -> dict[str, object]:
    out: dict[str, object] = {}
    for f in fields(frame):
        v = getattr(frame, f.name)
        if isinstance(v, uuid.UUID):
            v = v.bytes
        elif isinstance(v, str):
            v = v.encode()
        elif isinstance(v, tuple):
            v = list(v)
        out[f.name] = v
    return out


def _from_fields(ft: FrameType, c: cs.Container) -> Frame:
    cls = FRAME_CLASSES[ft]
    kw = {}
    for f in fields(cls):
        v = c[f.name]
        if f.name == "pod_uuid":
            v = uuid.UUID(bytes=v)
        elif f.name == "node_name":
            try:
                v = v.decode()
            except UnicodeDecodeError:
                raise RemoteProtocolError(f"{ft.name}: node name is not UTF-8") from None
        elif isinstance(v, list):
            v = tuple(v)
        elif v is None and f.name == "channel":  # a HELLO older than CHANNEL_VERSION
            v = int(Channel.LINK)
        kw[f.name] = v
    return cls(**kw)


def _check_hello(frame: AuthHello) -> None:
    if frame.version < CHANNEL_VERSION and frame.channel != Channel.LINK:
        raise LocalProtocolError(f"cannot encode {frame!r}: a version {frame.version} "
                                 "AUTH_HELLO has no channel byte")


def encode_frame(frame: Frame) -> bytes:
    """A frame → its bytes on the wire. Values that do not fit → LocalProtocolError."""
    ft = frame.frame_type
    fast = _FAST.get(ft)
    try:
        if fast is not None:
            if ft == FrameType.MSG:
                return fast.pack(fast.size - 4, ft, frame.seq, frame.src_accel,
                                 frame.dst_accel, *frame.dwords)
            if ft == FrameType.ACK:
                return fast.pack(fast.size - 4, ft, frame.seq, frame.status)
            if ft == FrameType.PING:
                return fast.pack(fast.size - 4, ft, frame.token, frame.clock)
            return fast.pack(fast.size - 4, ft, frame.token)
        if ft == FrameType.LOAD:
            return _LOAD.pack(_LOAD.size - 4, ft, frame.seq, frame.src_accel, frame.dst_accel,
                              frame.npa_byte_addr, frame.length, frame.deadline)
        if ft in (FrameType.STORE, FrameType.DATA):
            return b"".join(encode_frame_parts(frame))
        if isinstance(frame, AuthHello):
            _check_hello(frame)
        payload = FRAME_PAYLOADS[ft].build(_to_fields(frame))
    except (struct.error, cs.ConstructError, TypeError, ValueError) as e:
        raise LocalProtocolError(f"cannot encode {frame!r}: {e}") from None
    if len(payload) + 1 > MAX_FRAME:
        raise LocalProtocolError(f"{ft.name} frame of {len(payload) + 1} bytes > {MAX_FRAME}")
    return FRAME_HEADER.build({"length": len(payload) + 1, "type": ft}) + payload


def encode_frame_parts(frame: Frame) -> tuple[bytes, ...]:
    """`encode_frame` as pieces to send one after the other: a STORE or DATA frame is its
    header and its data, so a megabyte of data is not copied just to prepend 19 bytes."""
    ft = frame.frame_type
    if ft not in (FrameType.STORE, FrameType.DATA):
        return (encode_frame(frame),)
    data = frame.data
    if not isinstance(data, bytes | bytearray):  # a Sink is what a reader received
        raise LocalProtocolError(f"cannot encode a {type(data).__name__} as frame data")
    if _STORE_HDR.size - 4 + len(data) > MAX_FRAME:
        raise LocalProtocolError(f"{ft.name} frame too large ({len(data)} bytes)")
    try:
        if ft == FrameType.STORE:
            head = _STORE_HDR.pack(_STORE_HDR.size - 4 + len(data), ft, frame.seq,
                                   frame.src_accel, frame.dst_accel, frame.npa_byte_addr,
                                   frame.deadline)
        else:
            head = _DATA_HDR.pack(_DATA_HDR.size - 4 + len(data), ft, frame.seq, frame.status)
    except struct.error as e:
        raise LocalProtocolError(f"cannot encode {frame!r}: {e}") from None
    return head, bytes(data)


def encode_data_parts(seq: int, status: int, data: Sequence[bytes | bytearray | memoryview]
                      ) -> list[bytes | bytearray | memoryview]:
    """A DATA frame whose data is several buffers: its header, then the buffers themselves."""
    n = sum(len(b) for b in data)
    if _DATA_HDR.size - 4 + n > MAX_FRAME:
        raise LocalProtocolError(f"DATA frame too large ({n} bytes)")
    try:
        head = _DATA_HDR.pack(_DATA_HDR.size - 4 + n, FrameType.DATA, seq, status)
    except struct.error as e:
        raise LocalProtocolError(f"cannot encode DATA seq {seq} status {status}: {e}") from None
    return [head, *data]


def encode_frame_construct(frame: Frame) -> bytes:
    """`encode_frame` without the fast paths (the reference the tests compare against)."""
    if isinstance(frame, AuthHello):
        _check_hello(frame)
    payload = FRAME_PAYLOADS[frame.frame_type].build(_to_fields(frame))
    return FRAME_HEADER.build({"length": len(payload) + 1, "type": frame.frame_type}) + payload


def decode_payload(frame_type: int, payload: bytes, *, fast: bool = True) -> Frame:
    """One frame's payload → the frame. Unknown type or a bad payload → RemoteProtocolError."""
    try:
        ft = FrameType(frame_type)
    except ValueError:
        raise RemoteProtocolError(f"unknown frame type {frame_type:#04x}") from None
    s = _FAST.get(ft) if fast else None
    if s is not None and len(payload) == s.size - HEADER_SIZE:
        v = struct.unpack_from(s.format[:1] + s.format[3:], payload)
        if ft == FrameType.MSG:
            return Msg(v[0], v[1], v[2], v[3:7])
        if ft == FrameType.ACK:
            return Ack(v[0], v[1])
        return FRAME_CLASSES[ft](*v)
    if fast and ft == FrameType.LOAD and len(payload) == _LOAD.size - HEADER_SIZE:
        return Load(*struct.unpack_from("<IHHQII", payload))
    if fast and ft == FrameType.STORE and len(payload) >= _STORE_HDR.size - HEADER_SIZE:
        n = _STORE_HDR.size - HEADER_SIZE
        return _store(struct.unpack_from(_STORE_FMT, payload), payload[n:])
    if fast and ft == FrameType.DATA and len(payload) >= _DATA_HDR.size - HEADER_SIZE:
        n = _DATA_HDR.size - HEADER_SIZE
        return Data(*struct.unpack_from("<Ii", payload), payload[n:])  # type: ignore[call-arg]  # seq, status
    try:
        c = FRAME_PAYLOADS[ft].parse(payload)
    except cs.ConstructError:
        raise RemoteProtocolError(
            f"bad {ft.name} frame: {len(payload)}-byte payload does not parse") from None
    return _from_fields(ft, c)


_STORE_FMT: Final = "<IHHQI"  # a STORE's fields before its data


def _store(head: tuple[int, ...], data: bytes | bytearray) -> Store:
    seq, src, dst, addr, deadline = head
    return Store(seq, src, dst, addr, data, deadline)


class _NeedData:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA: Final = _NeedData()


class FrameDecoder:
    """Bytes in (`receive_data`), frames out (`next_frame`), as h11 does for HTTP.

    `next_frame()` returns a frame or NEED_DATA, or raises RemoteProtocolError, after which the
    decoder stays broken (every later call raises the same error). An oversized length is
    refused as soon as its header arrives, before any of its payload is buffered.

    A decoder made by `for_handshake()` serves a connection that has not authenticated yet: it
    accepts only handshake frames of at most HANDSHAKE_MAX_FRAME bytes, and refuses anything
    else at its 5-byte header, before buffering or allocating for it (an unauthenticated peer
    must not make the daemon hold a megabyte per 19-byte STORE header). `open_data_plane()`
    lifts the limits once the handshake is done.

    A large STORE / DATA payload is collected in a buffer of its own, exactly its size: while
    one is incomplete, `receive_buffer()` is the writable rest of it, so a reader can receive
    straight into it (`recv_into`, then `received_into(n)`) instead of copying the megabyte
    through the stream buffer; the frame then carries that buffer as its data. That buffer
    is allocated only when asked for: until then `collecting()` names the payload, and a
    reader may `divert()` it into a `Sink` of its own (a pipe it splices the socket into),
    counting what it puts there with `received_into(n)`; the frame then carries the sink.
    """

    def __init__(self, max_frame: int = MAX_FRAME,
                 frame_types: frozenset[FrameType] | None = None) -> None:
        self._buf = bytearray()
        self._pos = 0
        self._max_frame = max_frame
        self._types: frozenset[int] = frozenset(FRAME_CLASSES if frame_types is None
                                                else frame_types)
        self._error: RemoteProtocolError | None = None
        # The large payload being collected: its frame's header fields and its bytes (or the
        # reader's sink for them). Before its buffer is allocated: its size and the bytes of
        # it that came with its header.
        self._payload: bytearray | Sink | None = None
        self._filled = 0
        self._head: tuple[int, ...] = ()
        self._size = 0
        self._prefix = b""

    @classmethod
    def for_handshake(cls) -> FrameDecoder:
        """A decoder for a connection before its handshake is done (see the class docstring)."""
        return cls(HANDSHAKE_MAX_FRAME, HANDSHAKE_FRAMES)

    def open_data_plane(self) -> None:
        """The handshake is done: every frame type, up to MAX_FRAME."""
        self._max_frame = MAX_FRAME
        self._types = frozenset(FRAME_CLASSES)

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned as frames."""
        return len(self._buf) - self._pos + self._filled + len(self._prefix)

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        if self._size:
            self._allocate()
        if self._payload is not None:  # fill the payload first, buffer what follows it
            k = min(len(data), len(self._payload) - self._filled)
            if k:
                if not isinstance(self._payload, bytearray):
                    raise LocalProtocolError("receive_data() while a diverted payload is "
                                             "collected")
                self._payload[self._filled: self._filled + k] = data[:k]
                self._filled += k
                data = data[k:]
                if not data:
                    return
        if self._pos and self._pos * 2 >= len(self._buf):
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    def receive_buffer(self) -> memoryview | None:
        """The unfilled rest of the large payload being collected, or None (also while it
        is diverted)."""
        if self._size:
            self._allocate()
        if not isinstance(self._payload, bytearray):
            return None
        return memoryview(self._payload)[self._filled:]

    def collecting(self) -> FrameType | None:
        """The type of the large payload being collected, while it has no buffer yet (and
        may be diverted); else None."""
        if not self._size:
            return None
        return FrameType.DATA if len(self._head) == 2 else FrameType.STORE

    @property
    def collecting_size(self) -> int:
        """The size of the payload `collecting()` names (0: none)."""
        return self._size

    def divert(self, sink: Sink) -> bytes:
        """Collect the payload `collecting()` names in `sink`, of its size, instead of a
        buffer of ours: returns the bytes of it already received (the caller puts them first
        in the sink; they are counted), and the caller counts the rest with
        `received_into(n)` as it puts it there."""
        if not self._size or len(sink) != self._size:
            raise LocalProtocolError("divert() without a payload of that size being collected")
        prefix, self._prefix = self._prefix, b""
        self._payload, self._filled, self._size = sink, len(prefix), 0
        return prefix

    def _allocate(self) -> None:
        payload = self._payload = bytearray(self._size)
        payload[: len(self._prefix)] = self._prefix
        self._filled, self._size, self._prefix = len(self._prefix), 0, b""

    def received_into(self, n: int) -> None:
        """`n` bytes were written at the start of the last `receive_buffer()`."""
        assert self._payload is not None and 0 <= n <= len(self._payload) - self._filled
        self._filled += n

    def next_frame(self) -> Frame | _NeedData:
        if self._error is not None:
            raise self._error
        # One call per frame (the reader asks on every pass): the body is here, in a
        # try that makes an error stick, not in a helper of its own.
        try:
            payload: bytes | bytearray | Sink
            if self._size:
                return NEED_DATA
            if self._payload is not None:
                if self._filled < len(self._payload):
                    return NEED_DATA
                payload, head = self._payload, self._head
                self._payload, self._filled, self._head = None, 0, ()
                if len(head) == 2:
                    return Data(head[0], head[1], payload)
                assert isinstance(payload, bytearray)  # (only a DATA payload is diverted)
                return _store(head, payload)
            buf, pos = self._buf, self._pos
            if len(buf) - pos < 4:
                return NEED_DATA
            (length,) = _LENGTH.unpack_from(buf, pos)
            if length == 0 or length > self._max_frame:
                raise RemoteProtocolError(f"frame length {length} outside 1..{self._max_frame}")
            if len(buf) - pos < HEADER_SIZE:
                return NEED_DATA
            frame_type = buf[pos + 4]
            if frame_type not in self._types:
                if frame_type not in FRAME_CLASSES:
                    raise RemoteProtocolError(f"unknown frame type {frame_type:#04x}")
                raise RemoteProtocolError(f"{FrameType(frame_type).name} frame before the "
                                          "handshake finished")
            end = pos + 4 + length
            # The frames of every message round trip, unpacked in place (decode_payload's fast
            # path, without copying the payload out first).
            if frame_type == _MSG_TYPE and length == _MSG_LENGTH:
                if len(buf) < end:
                    return NEED_DATA
                seq, src, dst, dw0, dw1, dw2, dw3 = _MSG_FIELDS.unpack_from(buf, pos + HEADER_SIZE)
                self._pos = end
                return Msg(seq, src, dst, (dw0, dw1, dw2, dw3))
            if frame_type == _ACK_TYPE and length == _ACK_LENGTH:
                if len(buf) < end:
                    return NEED_DATA
                seq, status = _ACK_FIELDS.unpack_from(buf, pos + HEADER_SIZE)
                self._pos = end
                return Ack(seq, status)
            if frame_type == FrameType.DATA and length >= _DATA_HDR.size - 4:
                return self._data_plane(pos, end, _DATA_HDR.size, "<Ii")
            if frame_type == FrameType.STORE and length >= _STORE_HDR.size - 4:
                return self._data_plane(pos, end, _STORE_HDR.size, _STORE_FMT)
            if len(buf) < end:
                return NEED_DATA
            payload = bytes(buf[pos + HEADER_SIZE: end])
            self._pos = end
            return decode_payload(frame_type, payload)
        except RemoteProtocolError as e:
            self._error = e
            raise

    def _data_plane(self, pos: int, end: int, head_size: int, head_fmt: str
                    ) -> Frame | _NeedData:
        """A DATA / STORE frame: its data copied once out of the stream buffer, or, when
        large and incomplete, collected in a buffer of its own (see the class docstring)."""
        buf = self._buf
        start = pos + head_size
        if len(buf) < start:
            return NEED_DATA
        head = struct.unpack_from(head_fmt, buf, pos + HEADER_SIZE)
        if len(buf) >= end:
            self._pos = end
            with memoryview(buf) as view:  # one copy, not a bytearray slice and a copy of it
                data = bytes(view[start:end])
            return Data(*head, data) if len(head) == 2 else _store(head, data)
        if end - start < COLLECT_AT:
            return NEED_DATA
        self._head = head
        self._size = end - start
        with memoryview(buf) as view:
            self._prefix = bytes(view[start:])
        del buf[pos:]
        return NEED_DATA


_MSG_TYPE: Final = int(FrameType.MSG)
_ACK_TYPE: Final = int(FrameType.ACK)
# Payloads from this size on are collected in their own buffer (FrameDecoder.receive_buffer).
COLLECT_AT: Final = 64 << 10
DATA_HEADER_SIZE: Final = _DATA_HDR.size  # a DATA frame up to its payload
