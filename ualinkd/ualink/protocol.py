"""The seven device-to-device messages of spec §5.2–§5.3 and their four-dword encodings.

Pure values; the fabric carries them as four little-endian u32 with the sender's accel id
stamped by the transport. Messages that carry a handle carry `handle_lo` with bits 9..0
cleared: the type overwrites them on the wire and the receiver rebuilds them (§5.3).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

Dwords = tuple[int, int, int, int]
_M32 = 0xFFFFFFFF
_TYPE_MASK = 0x3FF


class MsgType(enum.IntEnum):
    HELLO = 1
    HELLO_ACK = 2
    NPA_REQ = 3
    NPA_RSP = 4
    NPA_FAIL = 5
    NPA_REVOKE = 6
    NPA_RELEASE = 7


class FailReason(enum.IntEnum):
    NOSPACE = 1
    INVALID_HANDLE = 2
    DUPLICATE = 3
    ERROR = 4


@dataclass(frozen=True, slots=True)
class Hello:
    receiver_id: int
    sender_id: int
    type = MsgType.HELLO

    def encode(self) -> Dwords:
        return (1 | (self.receiver_id & 0x3FF) << 10 | (self.sender_id & 0x3FF) << 20, 0, 0, 0)


@dataclass(frozen=True, slots=True)
class HelloAck:
    type = MsgType.HELLO_ACK

    def encode(self) -> Dwords:
        return (2, 0, 0, 0)


@dataclass(frozen=True, slots=True)
class HandleMsg:
    """NPA_REQ / NPA_REVOKE / NPA_RELEASE: handle_lo (bits 9..0 cleared) and handle_hi."""

    type: MsgType
    handle_lo_bits: int
    handle_hi: int

    def encode(self) -> Dwords:
        lo = (self.handle_lo_bits & ~_TYPE_MASK) | self.type
        return (lo & _M32, lo >> 32 & _M32, self.handle_hi & _M32, self.handle_hi >> 32 & _M32)


@dataclass(frozen=True, slots=True)
class NpaRsp:
    handle_lo_bits: int
    size_pages: int
    npa_offset: int  # page number with the GPU-id bits stripped (§4.5)
    type = MsgType.NPA_RSP

    def encode(self) -> Dwords:
        lo = (self.handle_lo_bits & ~_TYPE_MASK) | self.type
        return (lo & _M32, lo >> 32 & _M32, self.size_pages & _M32, self.npa_offset & _M32)


@dataclass(frozen=True, slots=True)
class NpaFail:
    handle_lo_bits: int
    reason: int
    type = MsgType.NPA_FAIL

    def encode(self) -> Dwords:
        lo = (self.handle_lo_bits & ~_TYPE_MASK) | self.type
        return (lo & _M32, lo >> 32 & _M32, self.reason & 0xFF, 0)


@dataclass(frozen=True, slots=True)
class Unknown:
    type: int
    dwords: Dwords

    def encode(self) -> Dwords:
        return self.dwords


Message = Hello | HelloAck | HandleMsg | NpaRsp | NpaFail | Unknown


def decode(dw: Dwords) -> Message:
    """Any 16 bytes decode to something; unknown types become `Unknown` (§5.1)."""
    dw0, dw1, dw2, dw3 = (x & _M32 for x in dw)
    t = dw0 & _TYPE_MASK
    lo_bits = (dw1 << 32 | dw0) & ~_TYPE_MASK
    if t == MsgType.HELLO:
        return Hello(dw0 >> 10 & 0x3FF, dw0 >> 20 & 0x3FF)
    if t == MsgType.HELLO_ACK:
        return HelloAck()
    if t in (MsgType.NPA_REQ, MsgType.NPA_REVOKE, MsgType.NPA_RELEASE):
        return HandleMsg(MsgType(t), lo_bits, dw3 << 32 | dw2)
    if t == MsgType.NPA_RSP:
        return NpaRsp(lo_bits, dw2, dw3)
    if t == MsgType.NPA_FAIL:
        return NpaFail(lo_bits, dw2 & 0xFF)
    return Unknown(t, (dw0, dw1, dw2, dw3))
