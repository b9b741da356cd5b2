"""Byte layouts of the fabric: the seven UALink protocol messages (spec §5.2, §5.3) and the link
frames that carry them between daemons. Sans-IO; construct is the source of truth for every
layout (little-endian), and the hot frames have `struct` fast paths the tests prove equal.

Frame: ``[u32 length][u8 frame type][payload]``, ``length`` = bytes after the length field.
"""

from __future__ import annotations

import enum
import struct
import uuid
from dataclasses import dataclass, fields
from typing import ClassVar, Final

import construct as cs

Dwords = tuple[int, int, int, int]

# --------------------------------------------------------------------------------------------
# Errors (STYLE rule 5): one documented exception, split by whose fault it is.


class ProtocolError(Exception):
    """A fabric protocol violation; the connection it happened on is dropped."""


class LocalProtocolError(ProtocolError):
    """We were asked to put something on the wire that cannot go there: a bug on our side."""


class RemoteProtocolError(ProtocolError):
    """The peer sent bytes that break the protocol: its fault; drop that connection."""


# --------------------------------------------------------------------------------------------
# UALink protocol messages (four dwords, spec §5.3)

MSG_TYPE_MASK: Final = 0x3FF  # dw0 bits 9..0
ACCEL_FIELD_MASK: Final = 0x3FF  # 10-bit accel id fields of HELLO
HANDLE_LO_ID_MASK: Final = 0x3FF  # handle_lo bits 9..0: the exporter's accel id (§3.1)
U32: Final = 0xFFFFFFFF
U64: Final = (1 << 64) - 1


class MsgType(enum.IntEnum):
    """Message types (spec §5.2); there are no others."""

    HELLO = 1
    HELLO_ACK = 2
    NPA_REQ = 3
    NPA_RSP = 4
    NPA_FAIL = 5
    NPA_REVOKE = 6
    NPA_RELEASE = 7


class NpaFailReason(enum.IntEnum):
    """NPA_FAIL reasons (spec §5.2); 8 bits on the wire."""

    NOSPACE = 1
    INVALID_HANDLE = 2
    DUPLICATE = 3
    ERROR = 4


def handle_lo_bits(handle_lo: int) -> int:
    """`handle_lo` as the wire carries it: bits 9..0 cleared (they hold the message type)."""
    return handle_lo & U64 & ~HANDLE_LO_ID_MASK


def rebuild_handle_lo(bits: int, accel_id: int) -> int:
    """The receiver's side of §5.3: put an accel id back into bits 9..0 of `handle_lo`.

    Which id (the receiver's own or the sender's stamp) depends on the message; see §5.3.
    """
    return (bits & ~HANDLE_LO_ID_MASK) | (accel_id & HANDLE_LO_ID_MASK)


def _check(name: str, value: object, limit: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= limit:
        raise LocalProtocolError(f"{name}={value!r} does not fit in 0..{limit:#x}")


def _check_bits(value: int) -> None:
    _check("handle_lo_bits", value, U64)
    if value & HANDLE_LO_ID_MASK:
        raise LocalProtocolError(
            f"handle_lo_bits={value:#x} has bits 9..0 set; pass handle_lo_bits(handle_lo)")


def _npa_dw01(msg_type: MsgType, bits: int) -> tuple[int, int]:
    return (bits & U32 & ~MSG_TYPE_MASK) | msg_type, bits >> 32


@dataclass(frozen=True, slots=True)
class Hello:
    receiver_id: int
    sender_id: int
    type: ClassVar[MsgType] = MsgType.HELLO

    def __post_init__(self) -> None:
        _check("receiver_id", self.receiver_id, ACCEL_FIELD_MASK)
        _check("sender_id", self.sender_id, ACCEL_FIELD_MASK)

    def encode(self) -> Dwords:
        return (MsgType.HELLO | self.receiver_id << 10 | self.sender_id << 20, 0, 0, 0)


@dataclass(frozen=True, slots=True)
class HelloAck:
    type: ClassVar[MsgType] = MsgType.HELLO_ACK

    def encode(self) -> Dwords:
        return (MsgType.HELLO_ACK, 0, 0, 0)


@dataclass(frozen=True, slots=True)
class _HandleMessage:
    """NPA_REQ, NPA_REVOKE and NPA_RELEASE: handle_lo bits 63..10 and handle_hi."""

    handle_lo_bits: int
    handle_hi: int
    type: ClassVar[MsgType]

    def __post_init__(self) -> None:
        _check_bits(self.handle_lo_bits)
        _check("handle_hi", self.handle_hi, U64)

    def encode(self) -> Dwords:
        return (*_npa_dw01(self.type, self.handle_lo_bits),
                self.handle_hi & U32, self.handle_hi >> 32)


@dataclass(frozen=True, slots=True)
class NpaReq(_HandleMessage):
    type: ClassVar[MsgType] = MsgType.NPA_REQ


@dataclass(frozen=True, slots=True)
class NpaRevoke(_HandleMessage):
    type: ClassVar[MsgType] = MsgType.NPA_REVOKE


@dataclass(frozen=True, slots=True)
class NpaRelease(_HandleMessage):
    type: ClassVar[MsgType] = MsgType.NPA_RELEASE


@dataclass(frozen=True, slots=True)
class NpaRsp:
    """NPA_RSP: no handle_hi on the wire (§5.3); size and NPA offset in pages (§4.5)."""

    handle_lo_bits: int
    size_pages: int
    npa_offset: int
    type: ClassVar[MsgType] = MsgType.NPA_RSP

    def __post_init__(self) -> None:
        _check_bits(self.handle_lo_bits)
        _check("size_pages", self.size_pages, U32)
        _check("npa_offset", self.npa_offset, U32)

    def encode(self) -> Dwords:
        return (*_npa_dw01(self.type, self.handle_lo_bits), self.size_pages, self.npa_offset)


@dataclass(frozen=True, slots=True)
class NpaFail:
    """NPA_FAIL: the reason is 8 bits on the wire (§5.2); the sender masks it, as the kernel."""

    handle_lo_bits: int
    reason: int
    type: ClassVar[MsgType] = MsgType.NPA_FAIL

    def __post_init__(self) -> None:
        _check_bits(self.handle_lo_bits)
        _check("reason", self.reason, U32)

    def encode(self) -> Dwords:
        return (*_npa_dw01(self.type, self.handle_lo_bits), self.reason & 0xFF, 0)


@dataclass(frozen=True, slots=True)
class UnknownMessage:
    """A type outside §5.2: the receiver logs and ignores it (§5.1)."""

    type: int
    dwords: Dwords

    def encode(self) -> Dwords:
        return self.dwords


Message = Hello | HelloAck | NpaReq | NpaRsp | NpaFail | NpaRevoke | NpaRelease | UnknownMessage


def decode_message(dwords: Dwords) -> Message:
    """The four dwords of a received message → its typed value. Any four u32s decode."""
    if len(dwords) != 4:
        raise LocalProtocolError(f"a message is four dwords, not {len(dwords)}")
    for i, dw in enumerate(dwords):
        _check(f"dw{i}", dw, U32)
    dw0, dw1, dw2, dw3 = dwords
    t = dw0 & MSG_TYPE_MASK
    bits = (dw1 << 32) | (dw0 & ~MSG_TYPE_MASK)
    if t == MsgType.HELLO:
        return Hello((dw0 >> 10) & ACCEL_FIELD_MASK, (dw0 >> 20) & ACCEL_FIELD_MASK)
    if t == MsgType.HELLO_ACK:
        return HelloAck()
    if t == MsgType.NPA_REQ:
        return NpaReq(bits, dw3 << 32 | dw2)
    if t == MsgType.NPA_RSP:
        return NpaRsp(bits, dw2, dw3)
    if t == MsgType.NPA_FAIL:
        return NpaFail(bits, dw2 & 0xFF)
    if t == MsgType.NPA_REVOKE:
        return NpaRevoke(bits, dw3 << 32 | dw2)
    if t == MsgType.NPA_RELEASE:
        return NpaRelease(bits, dw3 << 32 | dw2)
    return UnknownMessage(t, (dw0, dw1, dw2, dw3))


# The same layouts in construct: the reference `decode_message` is proven equal to.
_DW0_TYPED = cs.ByteSwapped(cs.BitStruct(
    "handle_lo_31_10" / cs.BitsInteger(22), "type" / cs.BitsInteger(10)))
_DW0_HELLO = cs.ByteSwapped(cs.BitStruct(
    "unused" / cs.BitsInteger(2), "sender_id" / cs.BitsInteger(10),
    "receiver_id" / cs.BitsInteger(10), "type" / cs.BitsInteger(10)))
MESSAGE_LAYOUTS: Final[dict[MsgType, cs.Construct]] = {
    MsgType.HELLO: cs.Struct("dw0" / _DW0_HELLO, "dw1_3" / cs.Array(3, cs.Int32ul)),
    MsgType.HELLO_ACK: cs.Struct("dw0" / _DW0_TYPED, "dw1_3" / cs.Array(3, cs.Int32ul)),
    MsgType.NPA_REQ: cs.Struct("dw0" / _DW0_TYPED, "handle_lo_63_32" / cs.Int32ul,
                               "handle_hi" / cs.Int64ul),
    MsgType.NPA_RSP: cs.Struct("dw0" / _DW0_TYPED, "handle_lo_63_32" / cs.Int32ul,
                               "size_pages" / cs.Int32ul, "npa_offset" / cs.Int32ul),
    MsgType.NPA_FAIL: cs.Struct("dw0" / _DW0_TYPED, "handle_lo_63_32" / cs.Int32ul,
                                "reason" / cs.Int8ul, "unused" / cs.Bytes(7)),
    MsgType.NPA_REVOKE: cs.Struct("dw0" / _DW0_TYPED, "handle_lo_63_32" / cs.Int32ul,
                                  "handle_hi" / cs.Int64ul),
    MsgType.NPA_RELEASE: cs.Struct("dw0" / _DW0_TYPED, "handle_lo_63_32" / cs.Int32ul,
                                   "handle_hi" / cs.Int64ul),
}


# --------------------------------------------------------------------------------------------
# Link frames

MAX_DATA: Final = 1 << 20  # bytes of a STORE / DATA payload (one data-plane transfer)
MAX_FRAME: Final = MAX_DATA + 64  # largest `length` accepted; more drops the connection
NONCE_SIZE: Final = 32
MAC_SIZE: Final = 32


class FrameType(enum.IntEnum):
    AUTH_HELLO = 0x01
    AUTH_CHALLENGE = 0x02
    AUTH_PROOF = 0x03
    AUTH_OK = 0x04
    MSG = 0x10
    ACK = 0x11
    PING = 0x12
    PONG = 0x13
    LOAD = 0x20  # data plane (GPU loads/stores of NPA ranges): request → DATA
    STORE = 0x21
    DATA = 0x22


HANDSHAKE_FRAMES: Final = frozenset(
    {FrameType.AUTH_HELLO, FrameType.AUTH_CHALLENGE, FrameType.AUTH_PROOF, FrameType.AUTH_OK})


@dataclass(frozen=True, slots=True)
class AuthHello:
    pod_uuid: uuid.UUID
    node_name: str
    nonce: bytes
    version: int = 1
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
    token: int
    frame_type: ClassVar[FrameType] = FrameType.PING


@dataclass(frozen=True, slots=True)
class Pong:
    token: int
    frame_type: ClassVar[FrameType] = FrameType.PONG


@dataclass(frozen=True, slots=True)
class Load:
    """Data plane: read `length` bytes at an NPA byte address of `dst_accel`; answered by DATA."""

    seq: int
    src_accel: int
    dst_accel: int
    npa_byte_addr: int
    length: int
    frame_type: ClassVar[FrameType] = FrameType.LOAD


@dataclass(frozen=True, slots=True)
class Store:
    """Data plane: write `data` at an NPA byte address of `dst_accel`; answered by DATA."""

    seq: int
    src_accel: int
    dst_accel: int
    npa_byte_addr: int
    data: bytes
    frame_type: ClassVar[FrameType] = FrameType.STORE


@dataclass(frozen=True, slots=True)
class Data:
    """The answer to LOAD (the bytes) or STORE (no bytes); status 0 or a negative errno."""

    seq: int
    status: int
    data: bytes = b""
    frame_type: ClassVar[FrameType] = FrameType.DATA


Frame = (AuthHello | AuthChallenge | AuthProof | AuthOk | Msg | Ack | Ping | Pong
         | Load | Store | Data)

FRAME_CLASSES: Final[dict[FrameType, type]] = {
    c.frame_type: c for c in (AuthHello, AuthChallenge, AuthProof, AuthOk, Msg, Ack, Ping, Pong,
                              Load, Store, Data)
}

_NAME = cs.Prefixed(cs.Int8ul, cs.GreedyBytes)
_ACCELS = ("seq" / cs.Int32ul, "src_accel" / cs.Int16ul, "dst_accel" / cs.Int16ul)

# construct: the single source of truth for every frame payload. `Terminated` refuses
# trailing bytes, so a fixed-size frame with the wrong length does not parse.
FRAME_PAYLOADS: Final[dict[FrameType, cs.Construct]] = {
    FrameType.AUTH_HELLO: cs.Struct(
        "version" / cs.Int16ul, "pod_uuid" / cs.Bytes(16), "node_name" / _NAME,
        "nonce" / cs.Bytes(NONCE_SIZE), cs.Terminated),
    FrameType.AUTH_CHALLENGE: cs.Struct(
        "node_name" / _NAME, "nonce" / cs.Bytes(NONCE_SIZE), "mac" / cs.Bytes(MAC_SIZE),
        cs.Terminated),
    FrameType.AUTH_PROOF: cs.Struct("mac" / cs.Bytes(MAC_SIZE), cs.Terminated),
    FrameType.AUTH_OK: cs.Struct(cs.Terminated),
    FrameType.MSG: cs.Struct(*_ACCELS, "dwords" / cs.Array(4, cs.Int32ul), cs.Terminated),
    FrameType.ACK: cs.Struct("seq" / cs.Int32ul, "status" / cs.Int32sl, cs.Terminated),
    FrameType.PING: cs.Struct("token" / cs.Int64ul, cs.Terminated),
    FrameType.PONG: cs.Struct("token" / cs.Int64ul, cs.Terminated),
    FrameType.LOAD: cs.Struct(
        *_ACCELS, "npa_byte_addr" / cs.Int64ul, "length" / cs.Int32ul, cs.Terminated),
    FrameType.STORE: cs.Struct(*_ACCELS, "npa_byte_addr" / cs.Int64ul, "data" / cs.GreedyBytes),
    FrameType.DATA: cs.Struct("seq" / cs.Int32ul, "status" / cs.Int32sl, "data" / cs.GreedyBytes),
}
FRAME_HEADER: Final = cs.Struct("length" / cs.Int32ul, "type" / cs.Int8ul)
HEADER_SIZE: Final = 5

# Fast paths for the frames of every message round trip (whole frame, header included).
_FAST: Final[dict[FrameType, struct.Struct]] = {
    FrameType.MSG: struct.Struct("<IBIHH4I"),
    FrameType.ACK: struct.Struct("<IBIi"),
    FrameType.PING: struct.Struct("<IBQ"),
    FrameType.PONG: struct.Struct("<IBQ"),
}


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
        kw[f.name] = v
    return cls(**kw)


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
            return fast.pack(fast.size - 4, ft, frame.token)
        payload = FRAME_PAYLOADS[ft].build(_to_fields(frame))
    except (struct.error, cs.ConstructError, TypeError, ValueError) as e:
        raise LocalProtocolError(f"cannot encode {frame!r}: {e}") from None
    if len(payload) + 1 > MAX_FRAME:
        raise LocalProtocolError(f"{ft.name} frame of {len(payload) + 1} bytes > {MAX_FRAME}")
    return FRAME_HEADER.build({"length": len(payload) + 1, "type": ft}) + payload


def encode_frame_construct(frame: Frame) -> bytes:
    """`encode_frame` without the fast paths (the reference the tests compare against)."""
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
        return FRAME_CLASSES[ft](v[0])
    try:
        c = FRAME_PAYLOADS[ft].parse(payload)
    except cs.ConstructError:
        raise RemoteProtocolError(
            f"bad {ft.name} frame: {len(payload)}-byte payload does not parse") from None
    return _from_fields(ft, c)


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
    """

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self._buf = bytearray()
        self._pos = 0
        self._max_frame = max_frame
        self._error: RemoteProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned as frames."""
        return len(self._buf) - self._pos

    def receive_data(self, data: bytes) -> None:
        if self._pos and self._pos * 2 >= len(self._buf):
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    def next_frame(self) -> Frame | _NeedData:
        if self._error is not None:
            raise self._error
        try:
            return self._next_frame()
        except RemoteProtocolError as e:
            self._error = e
            raise

    def _next_frame(self) -> Frame | _NeedData:
        buf, pos = self._buf, self._pos
        if len(buf) - pos < HEADER_SIZE:
            return NEED_DATA
        length, frame_type = struct.unpack_from("<IB", buf, pos)
        if length == 0 or length > self._max_frame:
            raise RemoteProtocolError(
                f"frame length {length} outside 1..{self._max_frame}")
        if frame_type not in FRAME_CLASSES:
            raise RemoteProtocolError(f"unknown frame type {frame_type:#04x}")
        end = pos + 4 + length
        if len(buf) < end:
            return NEED_DATA
        payload = bytes(buf[pos + HEADER_SIZE: end])
        self._pos = end
        return decode_payload(frame_type, payload)
