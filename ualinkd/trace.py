"""strace-like tracing for `--trace` (text) and `--trace=json` (one object a line).

Three kinds of record share one timeline: ioctls (decoded through the one ioctl table,
`abi/ioctls.py`: each entry says how its bytes decode and how each field prints), GPU loads
and stores (pread/pwrite at a VA of a render node), and fabric messages (the seven UALink
messages and the data plane's LOAD/STORE, on the sending and on the receiving node).

Text follows strace: `-tt` wall-clock time, the call with its decoded argument
(`{in} => {out}` where the kernel copied bytes back), `= 0` or `= -1 EINVAL (Invalid
argument)`, the `-T` duration in `<…>`. JSON: one object a line with `"v": SCHEMA_VERSION`,
every field typed (numbers as numbers, 128-bit handles as hex strings, flags and enums as
their raw value with their names) and the raw in/out bytes in hex.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .abi import structs as st
from .abi.constants import (
    CHUNK_ID_BO_HANDLES,
    CHUNK_ID_DEPENDENCIES,
    CHUNK_ID_FENCE,
    CHUNK_ID_IB,
    CHUNK_ID_SCHEDULED_DEPENDENCIES,
    CHUNK_ID_SYNCOBJ_IN,
    CHUNK_ID_SYNCOBJ_OUT,
    CHUNK_ID_SYNCOBJ_TIMELINE_SIGNAL,
    CHUNK_ID_SYNCOBJ_TIMELINE_WAIT,
    CHUNK_IDS,
)
from .abi.ioc import IOC_READ, IOC_WRITE, IoctlCmd
from .abi.ioctls import (
    ByOp,
    EnumOf,
    FieldFormat,
    Fields,
    FlagSet,
    Handle128,
    Hex,
    Hints,
    IoctlSpec,
    all_entries,
    field_offsets,
)
from .ualink.protocol import MSG_TYPE_MASK, MsgType, decode_message

# 2: a recording (issue 12 item 2): open/release records name each file, ioctls and GPU
# accesses name their file, ioctls carry the caller memory they read and wrote (`mem`), the
# fds they resolved (`fds`) and the values the daemon handed out (`handed`). v1 readers that
# key on "type" and the v1 fields still work; a v1 file lacks what a replay needs.
SCHEMA_VERSION = 2
_DATA_PREVIEW = 32  # bytes of a load/store shown in text (strace -s 32)
_DATA_JSON_MAX = 1 << 20  # bytes of a load/store kept in JSON: a FUSE read/write's most (a
# recording keeps every byte; data_truncated says when not)


# -- one field ----------------------------------------------------------------------------------
def text_value(value: Any, fmt: FieldFormat | None) -> str:
    if isinstance(value, list | tuple):
        return "[" + ", ".join(text_value(v, fmt) for v in value) + "]"
    if not isinstance(value, int):
        return str(value)
    if isinstance(fmt, Hex | Handle128):
        return hex(value) if value else "0"
    if isinstance(fmt, FlagSet):
        names, rest = fmt.names(value)
        if rest or not names:
            names.append(hex(rest) if rest else "0")
        return "|".join(names)
    if isinstance(fmt, EnumOf):
        return fmt.name(value) or str(value)
    return str(value)


def json_value(value: Any, fmt: FieldFormat | None) -> Any:
    if isinstance(value, list | tuple):
        return [json_value(v, fmt) for v in value]
    if not isinstance(value, int):
        return value
    if isinstance(fmt, Handle128):
        return f"{value:#034x}"
    if isinstance(fmt, FlagSet):
        names, rest = fmt.names(value)
        out: dict[str, Any] = {"value": value, "names": names}
        if rest:
            out["unknown"] = rest
        return out
    if isinstance(fmt, EnumOf):
        return {"value": value, "name": fmt.name(value)}
    return value


def _hint(hints: Hints, key: str, inp: Fields) -> FieldFormat | None:
    fmt = hints.get(key)
    return fmt.pick(inp) if isinstance(fmt, ByOp) else fmt


def _text_fields(fields: Fields, hints: Hints, inp: Fields | None = None) -> str:
    ctx = fields if inp is None else inp
    return ", ".join(f"{k}={text_value(v, _hint(hints, k, ctx))}" for k, v in fields.items())


def _json_fields(fields: Fields, hints: Hints, inp: Fields | None = None) -> Fields:
    ctx = fields if inp is None else inp
    return {k: json_value(v, _hint(hints, k, ctx)) for k, v in fields.items()}


def strerror(err: int) -> str:
    """`EINVAL (Invalid argument)`, as strace prints a failed call's errno."""
    return f"{errno.errorcode.get(err, str(err))} ({os.strerror(err)})"


def timestamp(t: float) -> str:
    """strace -tt: local wall-clock time with microseconds."""
    us = round(t * 1_000_000)
    return time.strftime("%H:%M:%S", time.localtime(us // 1_000_000)) + f".{us % 1_000_000:06d}"


_IOC_MACRO = {0: "_IO", IOC_WRITE: "_IOW", IOC_READ: "_IOR", IOC_WRITE | IOC_READ: "_IOWR"}


def copy_sizes(cmd: int, spec: IoctlSpec) -> tuple[int, int]:
    """What drm_ioctl (and kfd_ioctl) copy in from and out to the caller: its size, where
    its direction and the table's both say so (drm/device.py's rule); past that the kernel's
    buffer is zero-filled, and nothing of it goes back."""
    user, table = IoctlCmd.decode(cmd), IoctlCmd.decode(spec.cmd)
    both = user.direction & table.direction
    return (user.size if both & IOC_WRITE else 0, user.size if both & IOC_READ else 0)


def cmd_mismatch(cmd: int, spec: IoctlSpec) -> str:
    """How the caller's number differs from the table's, after the name:
    `[size 40 of 64]`, `[_IOW, kernel _IOWR]`, `[_IOW size 16, kernel _IOWR size 24]`."""
    user, table = IoctlCmd.decode(cmd), IoctlCmd.decode(spec.cmd)
    if user.direction == table.direction:
        return "" if user.size == table.size else f"[size {user.size} of {table.size}]"
    mine, theirs = _IOC_MACRO[user.direction], _IOC_MACRO[table.direction]
    if user.size == table.size:
        return f"[{mine}, kernel {theirs}]"
    return f"[{mine} size {user.size}, kernel {theirs} size {table.size}]"


def _passed(fields: Fields, offsets: Mapping[str, int], size: int, table_size: int) -> Fields:
    """The fields the caller's `size` bytes reach: the rest are the kernel's zero fill,
    not the caller's (a field that starts inside them is shown)."""
    if size >= table_size or not offsets:
        return fields
    return {k: v for k, v in fields.items() if offsets.get(k, 0) < size}


def _ioc_text(cmd: int) -> str:
    """strace's spelling of an ioctl number it has no name for."""
    c = IoctlCmd.decode(cmd)
    d = "|".join(n for n, b in (("_IOC_WRITE", 1), ("_IOC_READ", 2)) if c.direction & b)
    return f"_IOC({d or '_IOC_NONE'}, {c.type:#x}, {c.nr:#x}, {c.size:#x})"


def _preview(data: bytes) -> str:
    """strace's quoting of a buffer: printable ASCII as is, the rest escaped, 32 bytes."""
    out = []
    for b in data[:_DATA_PREVIEW]:
        ch = chr(b)
        out.append({0: "\\0", 10: "\\n", 9: "\\t", 34: '\\"', 92: "\\\\"}.get(b)
                   or (ch if 32 <= b < 127 else f"\\x{b:02x}"))
    return '"' + "".join(out) + '"' + ("..." if len(data) > _DATA_PREVIEW else "")


def _tail(start: float, duration: float) -> tuple[str, str]:
    return (timestamp(start) + " " if start else "",
            f" <{duration:.6f}>" if start else "")


# -- AMDGPU_CS chunks, from the caller memory the CS read ----------------------------------------
def cs_chunks(in_bytes: bytes, mem: Iterable[MemAccess]) -> list[Fields] | None:
    """AMDGPU_CS's chunks as the daemon read them (amdgpu/cs.py's pass 1: the pointer array,
    each drm_amdgpu_cs_chunk, its data, a BO_HANDLES chunk's entries), decoded from the
    call's recorded `mem` rather than read again; None when the call read no pointer
    array. A chunk whose header or data the call did not get (EFAULT, or checks that
    stopped it first) has what it got: `id` alone, or no `data`."""
    if len(in_bytes) < st.CS_IN.size:
        return None
    args = st.CS_IN.decode(in_bytes[: st.CS_IN.size])
    got: dict[int, bytes] = {}
    for m in mem:
        if m.op == "read" and m.result == 0:
            got.setdefault(m.addr, m.data)
    ptrs = got.get(args.chunks)
    if ptrs is None:
        return None
    out: list[Fields] = []
    for i in range(min(args.num_chunks, len(ptrs) // 8)):
        ptr = int.from_bytes(ptrs[8 * i: 8 * i + 8], "little")
        head = got.get(ptr)
        if head is None or len(head) < st.CS_CHUNK.size:
            out.append({"ptr": ptr})
            continue
        h = st.CS_CHUNK.decode(head[: st.CS_CHUNK.size])
        chunk: Fields = {"id": CHUNK_IDS.get(h.chunk_id, h.chunk_id), "length_dw": h.length_dw,
                         "chunk_data": h.chunk_data}
        data = got.get(h.chunk_data, b"") if h.length_dw else b""
        if len(data) >= 4 * h.length_dw:
            chunk.update(_chunk_data(h.chunk_id, data[: 4 * h.length_dw], got))
        out.append(chunk)
    return out


def _entries(data: bytes, layout: Any) -> list[Fields]:
    n = len(data) // layout.size
    return [dataclasses.asdict(layout.decode(data[i * layout.size: (i + 1) * layout.size]))
            for i in range(n)]


def _chunk_data(cid: int, data: bytes, got: Mapping[int, bytes]) -> Fields:
    """One chunk's data as its id says (amdgpu_drm.h's drm_amdgpu_cs_chunk_*)."""
    if cid == CHUNK_ID_IB and len(data) >= st.CS_CHUNK_IB.size:
        ib = st.CS_CHUNK_IB.decode(data[: st.CS_CHUNK_IB.size])
        return {"ip_type": ib.ip_type, "ip_instance": ib.ip_instance, "ring": ib.ring,
                "va_start": ib.va_start, "ib_bytes": ib.ib_bytes, "flags": ib.flags}
    if cid == CHUNK_ID_FENCE and len(data) >= st.CS_CHUNK_FENCE.size:
        return dataclasses.asdict(st.CS_CHUNK_FENCE.decode(data[: st.CS_CHUNK_FENCE.size]))
    if cid in (CHUNK_ID_DEPENDENCIES, CHUNK_ID_SCHEDULED_DEPENDENCIES):
        return {"deps": _entries(data, st.CS_CHUNK_DEP)}
    if cid in (CHUNK_ID_SYNCOBJ_IN, CHUNK_ID_SYNCOBJ_OUT):
        return {"handles": [int.from_bytes(data[i: i + 4], "little")
                            for i in range(0, len(data) - 3, 4)]}
    if cid in (CHUNK_ID_SYNCOBJ_TIMELINE_WAIT, CHUNK_ID_SYNCOBJ_TIMELINE_SIGNAL):
        return {"syncobjs": _entries(data, st.CS_CHUNK_SYNCOBJ)}
    if cid == CHUNK_ID_BO_HANDLES and len(data) >= st.BO_LIST_IN.size:
        bl = st.BO_LIST_IN.decode(data[: st.BO_LIST_IN.size])
        size = st.BO_LIST_ENTRY.size
        out: Fields = {"bo_number": bl.bo_number, "bo_info_size": bl.bo_info_size}
        if bl.bo_info_size == size and (raw := got.get(bl.bo_info_ptr)) is not None:
            out["bos"] = [e["bo_handle"] for e in _entries(raw[: bl.bo_number * size],
                                                            st.BO_LIST_ENTRY)]
        elif bl.bo_number and bl.bo_info_size:  # one read per entry, the first 8 bytes
            raws = [got.get(bl.bo_info_ptr + i * bl.bo_info_size) for i in range(bl.bo_number)]
            if all(r is not None for r in raws):
                out["bos"] = [int.from_bytes(r[:4], "little") for r in raws if r is not None]
        return out
    return {"data_hex": data.hex()}


def _chunk_text(ch: Fields) -> str:
    hexed = {"chunk_data", "va_start", "ptr"}
    parts = []
    for k, v in ch.items():
        if k == "id":
            continue
        if isinstance(v, list):
            v = "[" + ", ".join("{" + ", ".join(f"{a}={b}" for a, b in e.items()) + "}"
                                if isinstance(e, dict) else str(e) for e in v) + "]"
        elif k in hexed and isinstance(v, int):
            v = f"{v:#x}"
        parts.append(f"{k}={v}")
    return f"{ch.get('id', '?')}{{{', '.join(parts)}}}"


# -- the records --------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class MemAccess:
    """One copy_from_user (`read`) or copy_to_user (`write`) an ioctl made: the bytes read
    in (what a replay must put behind the pointer) or copied out (what it must find there)."""

    op: str  # "read" | "write"
    addr: int
    length: int
    data: bytes  # read: the bytes read (b"" when it failed); write: the bytes written
    result: int = 0  # 0 or -errno (EFAULT)

    def as_dict(self) -> Fields:
        return {"op": self.op, "addr": self.addr, "len": self.length, "hex": self.data.hex(),
                "result": self.result}


@dataclasses.dataclass(frozen=True, slots=True)
class FdResolution:
    """A caller's fd an ioctl looked up (PRIME_FD_TO_HANDLE's, SYNCOBJ_FD_TO_HANDLE's): the
    dma-buf token file behind it (`key`, the one its FileRecord opened), or -errno."""

    fd: int
    key: int | None
    result: int = 0

    def as_dict(self) -> Fields:
        return {"fd": self.fd, "key": self.key, "result": self.result}


@dataclasses.dataclass(frozen=True, slots=True)
class FileRecord:
    """A file of the mount opened (`open`) or its last reference released (`release`):
    which one each later ioctl and GPU access is on, so a replay opens the same."""

    event: str  # "open" | "release"
    pid: int
    node: str
    file: int  # the node's id for this open file, unique while the daemon runs
    path: str  # relative to the mount: dri/renderD128, kfd, dmabuf/<token>
    minor: int | None = None
    token: int | None = None  # dmabuf/<token>: the token named, and the key it opened
    key: int | None = None
    result: int = 0
    start: float = 0.0

    kind = "file"
    accel = None

    @property
    def name(self) -> str:
        return self.event.upper()

    def as_dict(self) -> Fields:
        err = -self.result if self.result < 0 else None
        return {"v": SCHEMA_VERSION, "type": self.event, "time": self.start, "duration": 0.0,
                "pid": self.pid, "node": self.node, "file": self.file, "path": self.path,
                "minor": self.minor, "token": self.token, "key": self.key,
                "result": self.result, "errno": errno.errorcode.get(err) if err else None}

    def json(self) -> str:
        return json.dumps(self.as_dict(), separators=(",", ":"))

    def text(self) -> str:
        ts = timestamp(self.start) + " " if self.start else ""
        if self.event == "release":
            return f"{ts}[pid {self.pid}] {self.node} close({self.path}) = 0"
        res = str(self.file) if self.result == 0 else f"-1 {strerror(-self.result)}"
        return f"{ts}[pid {self.pid}] {self.node} open({self.path}) = {res}"


@dataclasses.dataclass(frozen=True, slots=True)
class TraceRecord:
    """One ioctl on a render node, as the DRM core answered it."""

    pid: int
    node: str
    minor: int
    cmd: int
    spec: IoctlSpec | None
    in_bytes: bytes
    result: int  # 0 or -errno
    out_bytes: bytes  # what the core copied back (also on failure: drm_ioctl copies out)
    accel: int | None = None
    start: float = 0.0  # wall clock (time.time) when the request came
    duration: float = 0.0  # seconds until the answer
    file: int | None = None  # the node's id of the open file (its FileRecord)
    mem: tuple[MemAccess, ...] = ()  # caller memory behind the struct's pointers, in order
    fds: tuple[FdResolution, ...] = ()  # the caller's fds the call resolved

    kind = "ioctl"

    @property
    def name(self) -> str:
        return self.spec.name if self.spec else f"UNKNOWN_NR_0x{IoctlCmd.decode(self.cmd).nr:02x}"

    def _decoded(self) -> tuple[Fields, Fields]:
        spec = self.spec
        inp = spec.decode_in(self.in_bytes) if spec and spec.decode_in else {}
        out: Fields = {}
        # The copied-back bytes are worth decoding when the call succeeded, or when a failed
        # call changed them (GEM_MMAP zeroes its union before failing).
        if spec and spec.decode_out and self.out_bytes and (self.result == 0 or self._changed()):
            out = spec.decode_out(self.out_bytes, inp)
        return inp, out

    def _changed(self) -> bool:
        """The handler wrote to the kernel's buffer: what was copied back differs from what
        was copied in (the caller's bytes, zero-filled past what it passed)."""
        n = len(self.out_bytes)
        passed = copy_sizes(self.cmd, self.spec)[0] if self.spec else len(self.in_bytes)
        return self.out_bytes != self.in_bytes[:passed][:n].ljust(n, b"\0")

    def _passed(self) -> tuple[Fields, Fields]:
        """`_decoded`'s fields less those past the caller's size (text only: JSON keeps
        every field, and its cmd and size say what the caller passed)."""
        inp, out = self._decoded()
        if self.spec is None:
            return inp, out
        in_size, out_size = copy_sizes(self.cmd, self.spec)
        table = IoctlCmd.decode(self.spec.cmd).size
        return (_passed(inp, field_offsets(self.spec.decode_in), in_size, table),
                _passed(out, field_offsets(self.spec.decode_out), out_size, table))

    def as_dict(self) -> Fields:
        c = IoctlCmd.decode(self.cmd)
        hints = self.spec.hints if self.spec else {}
        out_hints = self.spec.copied_back_hints if self.spec else {}
        inp, out = self._decoded()
        err = -self.result if self.result < 0 else None
        return {
            "v": SCHEMA_VERSION,
            "type": "ioctl",
            "time": self.start,
            "duration": self.duration,
            "pid": self.pid,
            "node": self.node,
            "minor": self.minor,
            "accel": self.accel,
            "ioctl": self.name,
            "cmd": f"{self.cmd:#010x}",
            "nr": c.nr,
            "dir": "".join(x for x, b in (("W", 1), ("R", 2)) if c.direction & b) or "N",
            "size": c.size,
            "in": _json_fields(inp, hints),
            "in_hex": self.in_bytes.hex(),
            "result": self.result,
            "errno": errno.errorcode.get(err) if err else None,
            "out": _json_fields(out, out_hints, inp),
            "out_hex": self.out_bytes.hex(),
            "file": self.file,
            "mem": [m.as_dict() for m in self.mem],
            "fds": [f.as_dict() for f in self.fds],
            **self._chunks_dict(),
            "handed": [h.as_dict() for h in self.spec.handed.handed_out(
                self.in_bytes, self.out_bytes, self.result)] if self.spec else [],
        }

    def _chunks(self) -> list[Fields] | None:
        if self.spec is None or self.spec.name != "AMDGPU_CS":
            return None
        return cs_chunks(self.in_bytes, self.mem)

    def _chunks_dict(self) -> Fields:
        chunks = self._chunks()
        return {} if chunks is None else {"chunks": chunks}

    def json(self) -> str:
        return json.dumps(self.as_dict(), separators=(",", ":"))

    def text(self) -> str:
        hints = self.spec.hints if self.spec else {}
        out_hints = self.spec.copied_back_hints if self.spec else {}
        inp, out = self._passed()
        name = (self.spec.full_name + cmd_mismatch(self.cmd, self.spec) if self.spec
                else _ioc_text(self.cmd))
        decoded = self.spec is not None and self.spec.decode_in is not None
        arg = "{" + (_text_fields(inp, hints) if decoded else self.in_bytes.hex()) + "}"
        if (chunks := self._chunks()) is not None:  # strace -v: what the pointers point at
            arg += ", [" + ", ".join(_chunk_text(ch) for ch in chunks) + "]"
        if out:
            arg += " => {" + _text_fields(out, out_hints, inp) + "}"
        elif self.out_bytes and not (self.spec and self.spec.decode_out) and (
                self.result == 0 or self._changed()):
            arg += " => {" + self.out_bytes.hex() + "}"
        res = "0" if self.result == 0 else f"-1 {strerror(-self.result)}"
        ts, dur = _tail(self.start, self.duration)
        # node.py gives a KFD call minor 0 (no render node has it: they start at 128)
        dev = "kfd" if self.minor == 0 else f"renderD{self.minor}"
        return f"{ts}[pid {self.pid}] {self.node} {dev} {name}({arg}) = {res}{dur}"


@dataclasses.dataclass(frozen=True, slots=True)
class GpuAccessRecord:
    """A GPU load (pread) or store (pwrite) at a VA through a render node's GPU VM. A
    result short of `length` is a fault part-way (at `va + result`); -errno: none of it."""

    pid: int
    node: str
    minor: int
    accel: int | None
    op: str  # "load" | "store"
    va: int
    length: int
    result: int  # bytes done, or -errno
    data: bytes  # what was loaded / what was asked to be stored
    start: float = 0.0
    duration: float = 0.0
    file: int | None = None

    kind = "gpu"

    @property
    def name(self) -> str:
        return f"GPU_{self.op.upper()}"

    @property
    def fault_va(self) -> int | None:
        if self.result < 0:
            return self.va
        return self.va + self.result if self.result < self.length else None

    def as_dict(self) -> Fields:
        err = -self.result if self.result < 0 else None
        return {
            "v": SCHEMA_VERSION, "type": "gpu", "time": self.start, "duration": self.duration,
            "pid": self.pid, "node": self.node, "minor": self.minor, "accel": self.accel,
            "op": self.op, "va": self.va, "length": self.length, "result": self.result,
            "errno": errno.errorcode.get(err) if err else None,
            "fault_va": self.fault_va,
            "data_hex": self.data[:_DATA_JSON_MAX].hex(),
            "data_truncated": len(self.data) > _DATA_JSON_MAX, "file": self.file,
        }

    def json(self) -> str:
        return json.dumps(self.as_dict(), separators=(",", ":"))

    def text(self) -> str:
        ts, dur = _tail(self.start, self.duration)
        if self.result < 0:
            res = f"-1 {strerror(-self.result)}"
        else:
            res = str(self.result)
            if self.fault_va is not None:
                res += f" (GPU fault at va={self.fault_va:#x})"
        shown = self.data if self.op == "store" or self.result > 0 else b""
        data = f", {_preview(shown)}" if shown else ""
        return (f"{ts}[pid {self.pid}] {self.node} renderD{self.minor} {self.name}("
                f"va={self.va:#x}{data}, len={self.length:#x}) = {res}{dur}")


# Fabric fields that print in hex (the handle's halves, addresses); the rest are decimal.
_FABRIC_HEX: Hints = {"handle_lo_bits": Hex(), "handle_hi": Hex(), "npa_offset": Hex(),
                      "npa_byte_addr": Hex(), "length": Hex()}
_FABRIC_HANDLE = ("handle_lo_bits", "handle_hi")


@dataclasses.dataclass(frozen=True, slots=True)
class FabricRecord:
    """One fabric message as this node sent or received it: a UALink message (its four
    dwords) or a data-plane LOAD/STORE (summarised: address and length, not the data)."""

    node: str  # the node that traced it
    direction: str  # "send" | "recv"
    message: str  # HELLO … NPA_RELEASE, LOAD, STORE
    src_accel: int
    dst_accel: int
    src_node: str | None
    dst_node: str | None
    fields: Fields
    result: int | None = None  # sends: 0 (ACKed / answered) or -errno; receives: None
    start: float = 0.0
    duration: float = 0.0

    kind = "fabric"
    pid = None

    @classmethod
    def ualink(cls, node: str, direction: str, src: int, dst: int,
               dwords: tuple[int, int, int, int], names: Callable[[int], str | None],
               result: int | None = None, start: float = 0.0,
               duration: float = 0.0) -> FabricRecord:
        t = dwords[0] & MSG_TYPE_MASK
        try:
            name = MsgType(t).name
            fields = dataclasses.asdict(decode_message(dwords))
        except ValueError:
            name, fields = f"UNKNOWN_{t}", {"dwords": [hex(d) for d in dwords]}
        return cls(node, direction, name, src, dst, names(src), names(dst), fields, result,
                   start, duration)

    @property
    def name(self) -> str:
        return self.message

    def as_dict(self) -> Fields:
        err = -self.result if self.result is not None and self.result < 0 else None
        return {
            "v": SCHEMA_VERSION, "type": "fabric", "time": self.start,
            "duration": self.duration, "node": self.node, "direction": self.direction,
            "message": self.message, "src_accel": self.src_accel, "dst_accel": self.dst_accel,
            "src_node": self.src_node, "dst_node": self.dst_node,
            # the handle's halves are handles: hex strings, as ioctls' 128-bit handles are
            "fields": {k: hex(v) if k in _FABRIC_HANDLE and isinstance(v, int) else v
                       for k, v in self.fields.items()}, "result": self.result,
            "errno": errno.errorcode.get(err) if err else None,
        }

    def json(self) -> str:
        return json.dumps(self.as_dict(), separators=(",", ":"))

    def text(self) -> str:
        ts, dur = _tail(self.start, self.duration)
        route = (f"{self.src_node or '?'}/accel{self.src_accel} -> "
                 f"{self.dst_node or '?'}/accel{self.dst_accel}")
        body = f"{self.message}{{{_text_fields(self.fields, _FABRIC_HEX)}}}"
        if self.result is None:
            return f"{ts}{self.node} fabric {self.direction} {route} {body}"
        res = "0" if self.result == 0 else f"-1 {strerror(-self.result)}"
        return f"{ts}{self.node} fabric {self.direction} {route} {body} = {res}{dur}"


@dataclasses.dataclass(frozen=True, slots=True)
class EngineAccess:
    """Memory a queue's engine touched for one packet, through the process's GPU VM:
    `op` "read", "write" or "atomic" (a read-modify-write), `length` bytes at `va`."""

    op: str
    va: int
    length: int

    def as_dict(self) -> Fields:
        return {"op": self.op, "va": self.va, "len": self.length}

    def text(self) -> str:
        return f"{self.op} {self.va:#x}+{self.length:#x}"


@dataclasses.dataclass(frozen=True, slots=True)
class QueueRecord:
    """A user queue's life on the emulated GPU (issue 30 item 6): `event` "create" /
    "destroy" / "doorbell" (`value` the doorbell's 64-bit value) / "packet" (one executed,
    `detail` as decoded, `fields` its decoded fields, `value` its ring offset) / "error"
    (`detail` the reason, `value` the ring offset). A packet (and an error: the packet that
    stopped the queue) carries `mem`, the memory the engine touched for it outside the
    queue's own ring and read/write pointers (the packet's reads, writes and atomics, each
    distinct access once, at most `ENGINE_ACCESSES_KEPT`; `mem_truncated` when more)."""

    pid: int
    node: str
    minor: int
    accel: int | None
    queue_id: int
    queue_type: str
    event: str
    value: int = 0
    detail: str = ""
    start: float = 0.0
    mem: tuple[EngineAccess, ...] = ()
    mem_truncated: bool = False
    fields: Fields | None = None  # a packet's decoded fields (engine.packet_fields)

    kind = "queue"
    result = None  # (no call: never "failed")

    @property
    def name(self) -> str:
        return f"QUEUE_{self.event.upper()}"

    def as_dict(self) -> Fields:
        out = {"v": SCHEMA_VERSION, "type": "queue", "time": self.start, "pid": self.pid,
               "node": self.node, "minor": self.minor, "accel": self.accel,
               "queue_id": self.queue_id, "queue_type": self.queue_type,
               "event": self.event, "value": self.value, "detail": self.detail}
        if self.event in ("packet", "error"):
            if self.fields is not None:
                out["fields"] = self.fields
            out["mem"] = [m.as_dict() for m in self.mem]
            out["mem_truncated"] = self.mem_truncated
        return out

    def json(self) -> str:
        return json.dumps(self.as_dict(), separators=(",", ":"))

    def text(self) -> str:
        ts, _ = _tail(self.start, 0.0)
        what = {"doorbell": f", doorbell={self.value:#x}",
                "packet": f", ring_offset={self.value:#x}, {self.detail}",
                "error": f", ring_offset={self.value:#x}, {self.detail}"}.get(self.event, "")
        if self.mem or self.mem_truncated:
            what += (", mem=[" + ", ".join(m.text() for m in self.mem)
                     + (", ..." if self.mem_truncated else "") + "]")
        return (f"{ts}[pid {self.pid}] {self.node} renderD{self.minor} {self.name}("
                f"queue={self.queue_id}, {self.queue_type}{what})")


@dataclasses.dataclass(frozen=True, slots=True)
class IbRecord:
    """One packet of an AMDGPU_CS IB as the SDMA engine executed it (issue 35 item 4),
    traced as a queue's packet is: the render file, context, the submission's sequence
    number and the IB (its index in the job and VA), `event` "packet" (`offset` its byte
    offset in the IB, `detail` as decoded, `fields` its decoded fields) or "error" (the IB
    stopped there: `detail` the reason), and `mem`, the memory the engine touched for it
    outside the IB itself (as QueueRecord's)."""

    pid: int
    node: str
    minor: int
    accel: int | None
    file: int | None
    ctx_id: int
    seq: int
    ib: int
    ib_va: int
    event: str
    offset: int
    detail: str = ""
    start: float = 0.0
    mem: tuple[EngineAccess, ...] = ()
    mem_truncated: bool = False
    fields: Fields | None = None

    kind = "ib"
    result = None  # (no call: never "failed")

    @property
    def name(self) -> str:
        return f"IB_{self.event.upper()}"

    def as_dict(self) -> Fields:
        out = {"v": SCHEMA_VERSION, "type": "ib", "time": self.start, "pid": self.pid,
               "node": self.node, "minor": self.minor, "accel": self.accel,
               "file": self.file, "ctx_id": self.ctx_id, "seq": self.seq, "ib": self.ib,
               "ib_va": self.ib_va, "event": self.event, "offset": self.offset,
               "detail": self.detail, "mem": [m.as_dict() for m in self.mem],
               "mem_truncated": self.mem_truncated}
        if self.fields is not None:
            out["fields"] = self.fields
        return out

    def json(self) -> str:
        return json.dumps(self.as_dict(), separators=(",", ":"))

    def text(self) -> str:
        ts, _ = _tail(self.start, 0.0)
        what = f", offset={self.offset:#x}, {self.detail}"
        if self.mem or self.mem_truncated:
            what += (", mem=[" + ", ".join(m.text() for m in self.mem)
                     + (", ..." if self.mem_truncated else "") + "]")
        return (f"{ts}[pid {self.pid}] {self.node} renderD{self.minor} {self.name}("
                f"ctx={self.ctx_id}, seq={self.seq}, ib={self.ib}@{self.ib_va:#x}{what})")


ENGINE_ACCESSES_KEPT = 64  # distinct accesses a packet's record lists (a poll re-reads one)


Record = TraceRecord | GpuAccessRecord | FabricRecord | FileRecord | QueueRecord | IbRecord
KINDS = ("ioctl", "gpu", "fabric", "file", "queue", "ib")


# -- filters ------------------------------------------------------------------------------------
class TraceFilter:
    """`--trace-filter KEY=V[,V…]` (repeatable; terms AND, values OR), strace `-e` style:

    - `kind=ioctl,gpu,fabric` — which records;
    - `ioctl=GEM_VA,UALINK_HANDLE` — which ioctls (the table's names, with or without the
      `DRM_IOCTL_` and `AMDGPU_` prefixes); other kinds pass;
    - `node=node0`, `accel=0,1` (a fabric message matches by either end), `pid=1234`
      (fabric messages have no pid: none match);
    - `failed` — only calls that failed (strace -Z) and loads/stores that faulted.
    """

    def __init__(self, terms: Iterable[str] = ()) -> None:
        self.kinds: set[str] | None = None
        self.ioctls: set[str] | None = None
        self.nodes: set[str] | None = None
        self.accels: set[int] | None = None
        self.pids: set[int] | None = None
        self.failed = False
        names = {s.name for s in all_entries()}
        for term in terms:
            key, sep, value = term.partition("=")
            key = key.strip()
            values = [v.strip() for v in value.split(",") if v.strip()]
            if key == "failed" and not sep:
                self.failed = True
                continue
            if not sep or not values:
                raise ValueError(f"trace filter {term!r}: expected KEY=VALUE[,VALUE…]")
            if key == "kind":
                bad = [v for v in values if v not in KINDS]
                if bad:
                    raise ValueError(f"trace filter kind: {bad[0]!r} is not one of "
                                     f"{', '.join(KINDS)}")
                self.kinds = set(values)
            elif key == "ioctl":
                wanted = set()
                for v in values:
                    n = v.upper().removeprefix("DRM_IOCTL_")
                    found = [x for x in (n, f"AMDGPU_{n}") if x in names]
                    if not found:
                        raise ValueError(f"trace filter ioctl: no ioctl named {v!r}")
                    wanted.update(found)
                self.ioctls = wanted
            elif key == "node":
                self.nodes = set(values)
            elif key in ("accel", "pid"):
                try:
                    ints = {int(v, 0) for v in values}
                except ValueError:
                    raise ValueError(f"trace filter {key}: {value!r} is not a number") from None
                setattr(self, key + "s", ints)
            else:
                raise ValueError(f"trace filter {term!r}: the keys are kind, ioctl, node, "
                                 "accel, pid, failed")

    def match(self, rec: Record) -> bool:
        if self.kinds is not None and rec.kind not in self.kinds:
            return False
        if self.nodes is not None and rec.node not in self.nodes:
            return False
        if self.pids is not None and rec.pid not in self.pids:
            return False
        if self.accels is not None:
            ends = ((rec.src_accel, rec.dst_accel) if isinstance(rec, FabricRecord)
                    else (rec.accel,))
            if not self.accels.intersection(ends):
                return False
        if self.ioctls is not None and isinstance(rec, TraceRecord):
            if rec.spec is None or rec.spec.name not in self.ioctls:
                return False
        if self.failed:
            if isinstance(rec, GpuAccessRecord):
                return rec.fault_va is not None
            return rec.result is not None and rec.result < 0
        return True
