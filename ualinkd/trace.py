"""strace-like decoding of ioctls for `--trace` (text) and `--trace=json` (one object a line).

Driven by the one ioctl table (`abi/ioctls.py`) and the struct layouts (`abi/structs.py`).
"""

from __future__ import annotations

import dataclasses
import errno
import json
from collections.abc import Callable
from typing import Any

from .abi import structs as st
from .abi.ioc import IoctlCmd
from .abi.ioctls import IoctlSpec

Fields = dict[str, Any]


def _layout(layout: st.Layout) -> Callable[[bytes], Fields]:
    def decode(data: bytes) -> Fields:
        padded = data[: layout.size].ljust(layout.size, b"\0")
        return dataclasses.asdict(layout.decode(padded))  # type: ignore[call-overload]

    return decode


def _ualink_in(data: bytes) -> Fields:
    args = st.decode_ualink_handle_in(data[:24].ljust(24, b"\0"))
    out: Fields = {"op": args.op, "flags": args.flags}
    if args.op == 0:
        out["gem_handle"] = args.gem_handle
    else:
        out["import_ualink_handle"] = [hex(args.handle_lo), hex(args.handle_hi)]
    return out


def _ualink_out(data: bytes, inp: Fields) -> Fields:
    data = data[:16].ljust(16, b"\0")
    if inp.get("op") == 0:
        lo, hi = st.UALINK_HANDLE_OUT_EXPORT.unpack(data)
        return {"export_ualink_handle": [hex(lo), hex(hi)]}
    return {"import_dmabuf_handle": st.UALINK_HANDLE_OUT_IMPORT.unpack(data[:4])[0]}


def _gem_metadata(data: bytes) -> Fields:
    m = st.decode_gem_metadata(data[: st.GEM_METADATA_SIZE].ljust(st.GEM_METADATA_SIZE, b"\0"))
    used = min(m.data_size_bytes, st.GEM_METADATA_DATA_BYTES) // 4
    return {"handle": m.handle, "op": m.op, "flags": hex(m.flags),
            "tiling_info": hex(m.tiling_info), "data_size_bytes": m.data_size_bytes,
            "data": [hex(v) for v in m.data[:used]]}


_IN: dict[int, Callable[[bytes], Fields]] = {
    0x09: _layout(st.GEM_CLOSE),
    0x0C: _layout(st.GET_CAP),
    0x2D: _layout(st.PRIME_HANDLE),
    0x2E: _layout(st.PRIME_HANDLE),
    0xBF: _layout(st.SYNCOBJ_CREATE),
    0xC0: _layout(st.SYNCOBJ_DESTROY),
    0xC3: _layout(st.SYNCOBJ_WAIT),
    0xC4: _layout(st.SYNCOBJ_ARRAY),
    0xC5: _layout(st.SYNCOBJ_ARRAY),
    0xCA: _layout(st.SYNCOBJ_TIMELINE_WAIT),
    0xCB: _layout(st.SYNCOBJ_TIMELINE_ARRAY),
    0xCD: _layout(st.SYNCOBJ_TIMELINE_ARRAY),
    0x40: _layout(st.GEM_CREATE_IN),
    0x41: _layout(st.GEM_MMAP_IN),
    0x46: _gem_metadata,
    0x48: _layout(st.GEM_VA),
    0x50: _layout(st.GEM_OP),
    0x51: _layout(st.GEM_USERPTR),
    0x5B: _ualink_in,
}
_OUT: dict[int, Callable[[bytes, Fields], Fields]] = {
    0x0C: lambda d, i: _layout(st.GET_CAP)(d),
    0x2D: lambda d, i: _layout(st.PRIME_HANDLE)(d),
    0x2E: lambda d, i: _layout(st.PRIME_HANDLE)(d),
    0xBF: lambda d, i: _layout(st.SYNCOBJ_CREATE)(d),
    0xC3: lambda d, i: {"first_signaled": _layout(st.SYNCOBJ_WAIT)(d)["first_signaled"]},
    0xCA: lambda d, i: {
        "first_signaled": _layout(st.SYNCOBJ_TIMELINE_WAIT)(d)["first_signaled"]},
    0x40: lambda d, i: _layout(st.GEM_CREATE_OUT)(d),
    0x41: lambda d, i: _layout(st.GEM_MMAP_OUT)(d),
    0x46: lambda d, i: _gem_metadata(d),
    0x50: lambda d, i: _layout(st.GEM_OP)(d),
    0x51: lambda d, i: {"handle": _layout(st.GEM_USERPTR)(d)["handle"]},
    0x5B: _ualink_out,
}


@dataclasses.dataclass(frozen=True, slots=True)
class TraceRecord:
    pid: int
    node: str
    minor: int
    cmd: int
    spec: IoctlSpec | None
    in_bytes: bytes
    result: int
    out_bytes: bytes

    def as_dict(self) -> Fields:
        c = IoctlCmd.decode(self.cmd)
        nr = c.nr
        inp = _IN[nr](self.in_bytes) if nr in _IN and self.spec else {}
        out = (
            _OUT[nr](self.out_bytes, inp)
            if nr in _OUT and self.spec and self.result == 0 and self.out_bytes
            else {}
        )
        return {
            "pid": self.pid,
            "node": self.node,
            "minor": self.minor,
            "ioctl": self.spec.name if self.spec else f"UNKNOWN_NR_0x{nr:02x}",
            "cmd": f"{self.cmd:#010x}",
            "dir": "".join(x for x, b in (("W", 1), ("R", 2)) if c.direction & b) or "N",
            "size": c.size,
            "in": inp,
            "in_hex": self.in_bytes.hex(),
            "result": self.result,
            "errno": errno.errorcode.get(-self.result) if self.result < 0 else None,
            "out": out,
            "out_hex": self.out_bytes.hex(),
        }

    def json(self) -> str:
        return json.dumps(self.as_dict(), separators=(",", ":"))

    def text(self) -> str:
        d = self.as_dict()
        args = ", ".join(f"{k}={v}" for k, v in d["in"].items()) or d["in_hex"]
        res = "0" if self.result == 0 else f"-1 {d['errno']} ({-self.result})"
        out = ", ".join(f"{k}={v}" for k, v in d["out"].items())
        if not out and self.out_bytes:
            out = "bytes=" + d["out_hex"]
        tail = f" -> {{{out}}}" if out else ""
        return (
            f"[pid {self.pid}] {self.node} renderD{self.minor} "
            f"{d['ioctl']}({d['cmd']}, {{{args}}}) = {res}{tail}"
        )
