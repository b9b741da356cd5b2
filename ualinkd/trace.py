"""strace-like decoding of ioctls for `--trace` (text) and `--trace=json` (one object a line).

Driven by the one ioctl table (`abi/ioctls.py`): each entry says how its bytes decode.
"""

from __future__ import annotations

import dataclasses
import errno
import json

from .abi.ioc import IoctlCmd
from .abi.ioctls import Fields, IoctlSpec


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
        spec = self.spec
        inp = spec.decode_in(self.in_bytes) if spec and spec.decode_in else {}
        out = (
            spec.decode_out(self.out_bytes, inp)
            if spec and spec.decode_out and self.result == 0 and self.out_bytes
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
