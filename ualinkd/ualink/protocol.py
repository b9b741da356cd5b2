"""The seven device-to-device messages of spec §5.2–§5.3 and their four-dword encodings.

Pure values, shared by the UALink managers and the fabric. Messages that carry a handle carry
`handle_lo` with bits 9..0 cleared: the type overwrites them on the wire and the receiver
rebuilds them (§5.3). construct states each layout (`MESSAGE_LAYOUTS`); `decode_message` is
the fast path the tests prove equal to it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar, Final, TypeVar

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
    if type(value) is int and 0 <= value <= limit:  # the common case, first and cheap
        return
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


_H = TypeVar("_H", bound=_HandleMessage)


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

_new, _set = object.__new__, object.__setattr__


def _decoded(cls: type[_H], bits: int, handle_hi: int) -> _H:
    """`cls(bits, handle_hi)` for fields just decoded, which fit by construction (bits: dw1:dw0
    with bits 9..0 cleared; handle_hi: dw3:dw2), so without __post_init__'s checks: the
    receive path of every NPA_REQ, NPA_REVOKE and NPA_RELEASE."""
    msg = _new(cls)
    _set(msg, "handle_lo_bits", bits)
    _set(msg, "handle_hi", handle_hi)
    return msg


def _decoded_rsp(bits: int, size_pages: int, npa_offset: int) -> NpaRsp:
    """`NpaRsp(bits, size_pages, npa_offset)` for fields just decoded (bits as in
    `_decoded`; the other two a dword each), without __post_init__'s checks: every first
    import receives one."""
    msg = _new(NpaRsp)
    _set(msg, "handle_lo_bits", bits)
    _set(msg, "size_pages", size_pages)
    _set(msg, "npa_offset", npa_offset)
    return msg


def decode_message(dwords: Dwords) -> Message:
    """The four dwords of a received message → its typed value. Any four u32s decode."""
    if len(dwords) != 4:
        raise LocalProtocolError(f"a message is four dwords, not {len(dwords)}")
    dw0, dw1, dw2, dw3 = dwords
    # Four ints OR'ed are below 2^32 exactly when each is in 0..U32 (a negative one makes
    # the OR negative); anything else gets the full check and its error.
    if not type(dw0) is type(dw1) is type(dw2) is type(dw3) is int or (
            dw0 | dw1 | dw2 | dw3) >> 32:
        for i, dw in enumerate(dwords):
            _check(f"dw{i}", dw, U32)
    t = dw0 & MSG_TYPE_MASK
    bits = (dw1 << 32) | (dw0 & ~MSG_TYPE_MASK)
    if t == MsgType.HELLO:
        return Hello((dw0 >> 10) & ACCEL_FIELD_MASK, (dw0 >> 20) & ACCEL_FIELD_MASK)
    if t == MsgType.HELLO_ACK:
        return HelloAck()
    if t == MsgType.NPA_REQ:
        return _decoded(NpaReq, bits, dw3 << 32 | dw2)
    if t == MsgType.NPA_RSP:
        return _decoded_rsp(bits, dw2, dw3)
    if t == MsgType.NPA_FAIL:
        return NpaFail(bits, dw2 & 0xFF)
    if t == MsgType.NPA_REVOKE:
        return _decoded(NpaRevoke, bits, dw3 << 32 | dw2)
    if t == MsgType.NPA_RELEASE:
        return _decoded(NpaRelease, bits, dw3 << 32 | dw2)
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
