"""The one ioctl table: nr -> entry (name, table cmd = direction and size, flags, how the
trace decodes its bytes, the values it hands out and takes back), and the registry of handlers.

Handlers in `drm/` and `amdgpu/` register against the named entries (`@handles(GEM_VA)`);
dispatch (drm/device.py) finds them through `bind`, the trace decoder reads the entries'
decoders, the trace's `handed` and the replay's mapping read `handed` (abi/values.py), and
"emulated" is having a handler. Flags are the kernel's DRM_* access flags
(drm_ioctl.c, spec §2.1).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from . import constants as c
from . import structs as st
from .ioc import DRM_COMMAND_BASE, DRM_COMMAND_END, IOC_NONE, IOC_READ, IOC_WRITE, ioc
from .values import FREE, NEW, NOTHING_HANDED, REF, ArraySlot, HandedValues, Slot

DRM_AUTH = 0x1
DRM_MASTER = 0x2
DRM_ROOT_ONLY = 0x4
DRM_RENDER_ALLOW = 0x20

_RW = IOC_READ | IOC_WRITE


Fields = dict[str, Any]
DecodeIn = Callable[[bytes], Fields]
DecodeOut = Callable[[bytes, Fields], Fields]


# -- how the trace prints a field (STYLE rule 6: the hints live with the entries) ------------


@dataclass(frozen=True, slots=True)
class Hex:
    """An address, a size or opaque bits: printed 0x…, as strace prints pointers."""


@dataclass(frozen=True, slots=True)
class Handle128:
    """A 128-bit UALink handle (the decoder joins handle_hi << 64 | handle_lo): one hex number;
    a hex string in JSON (no JSON reader keeps 128 bits in a number)."""


@dataclass(frozen=True, slots=True)
class FlagSet:
    """A bit mask: the names of its set bits joined by |, unknown bits as hex (strace's
    `O_RDWR|O_CLOEXEC`)."""

    bits: tuple[tuple[int, str], ...]

    def names(self, value: int) -> tuple[list[str], int]:
        """The names of the set bits and what no name covers."""
        names, rest = [], value
        for bit, name in self.bits:
            if value & bit == bit and bit:
                names.append(name)
                rest &= ~bit
        return names, rest


@dataclass(frozen=True, slots=True)
class EnumOf:
    """A value out of a list (op=EXPORT, query=DEV_INFO); an unknown one prints as a number."""

    values: tuple[tuple[int, str], ...]

    def name(self, value: int) -> str | None:
        return next((n for v, n in self.values if v == value), None)


HEX, HANDLE128 = Hex(), Handle128()
FieldFormat = Hex | Handle128 | FlagSet | EnumOf


@dataclass(frozen=True, slots=True)
class ByOp:
    """A field whose meaning is the op's (AMDGPU_CTX's flags: a pstate level for
    SET_STABLE_PSTATE, AMDGPU_CTX_QUERY2_FLAGS_* for QUERY_STATE2's answer): the format for
    each op; any other op prints it as decimal. The op is read from the call's in fields."""

    formats: tuple[tuple[int, FieldFormat], ...]

    def pick(self, inp: Fields) -> FieldFormat | None:
        return next((f for op, f in self.formats if op == inp.get("op")), None)


Hints = dict[str, FieldFormat | ByOp]  # field name -> format; a field not named is decimal


def flag_set(prefix: str, **bits: int) -> FlagSet:
    return FlagSet(tuple((v, prefix + k) for k, v in bits.items()))


def enum_of(names: dict[int, str]) -> EnumOf:
    return EnumOf(tuple(names.items()))


GEM_DOMAINS = flag_set("AMDGPU_GEM_DOMAIN_", CPU=c.DOMAIN_CPU, GTT=c.DOMAIN_GTT,
                       VRAM=c.DOMAIN_VRAM, GDS=c.DOMAIN_GDS, GWS=c.DOMAIN_GWS, OA=c.DOMAIN_OA,
                       DOORBELL=c.DOMAIN_DOORBELL)
GEM_CREATE_FLAGS = flag_set(
    "AMDGPU_GEM_CREATE_", CPU_ACCESS_REQUIRED=c.CREATE_CPU_ACCESS_REQUIRED,
    NO_CPU_ACCESS=c.CREATE_NO_CPU_ACCESS, CPU_GTT_USWC=c.CREATE_CPU_GTT_USWC,
    VRAM_CLEARED=c.CREATE_VRAM_CLEARED, VRAM_CONTIGUOUS=c.CREATE_VRAM_CONTIGUOUS,
    VM_ALWAYS_VALID=c.CREATE_VM_ALWAYS_VALID, EXPLICIT_SYNC=c.CREATE_EXPLICIT_SYNC,
    CP_MQD_GFX9=c.CREATE_CP_MQD_GFX9, VRAM_WIPE_ON_RELEASE=c.CREATE_VRAM_WIPE_ON_RELEASE,
    ENCRYPTED=c.CREATE_ENCRYPTED, PREEMPTIBLE=c.CREATE_PREEMPTIBLE,
    DISCARDABLE=c.CREATE_DISCARDABLE, COHERENT=c.CREATE_COHERENT, UNCACHED=c.CREATE_UNCACHED,
    EXT_COHERENT=c.CREATE_EXT_COHERENT, GFX12_DCC=c.CREATE_GFX12_DCC)
VM_PAGE_FLAGS = flag_set("AMDGPU_VM_", DELAY_UPDATE=c.VM_DELAY_UPDATE,
                         PAGE_READABLE=c.VM_PAGE_READABLE, PAGE_WRITEABLE=c.VM_PAGE_WRITEABLE,
                         PAGE_EXECUTABLE=c.VM_PAGE_EXECUTABLE, PAGE_PRT=c.VM_PAGE_PRT,
                         PAGE_NOALLOC=c.VM_PAGE_NOALLOC)
VA_OPERATIONS = enum_of({c.VA_OP_MAP: "MAP", c.VA_OP_UNMAP: "UNMAP", c.VA_OP_CLEAR: "CLEAR",
                         c.VA_OP_REPLACE: "REPLACE"})
PRIME_FLAGS = flag_set("DRM_", CLOEXEC=c.DRM_CLOEXEC, RDWR=c.DRM_RDWR)
SYNCOBJ_WAIT_FLAGS = flag_set(
    "DRM_SYNCOBJ_WAIT_FLAGS_", WAIT_ALL=c.DRM_SYNCOBJ_WAIT_FLAGS_WAIT_ALL,
    WAIT_FOR_SUBMIT=c.DRM_SYNCOBJ_WAIT_FLAGS_WAIT_FOR_SUBMIT,
    WAIT_AVAILABLE=c.DRM_SYNCOBJ_WAIT_FLAGS_WAIT_AVAILABLE,
    WAIT_DEADLINE=c.DRM_SYNCOBJ_WAIT_FLAGS_WAIT_DEADLINE)
USERPTR_FLAGS = flag_set("AMDGPU_GEM_USERPTR_", READONLY=c.USERPTR_READONLY,
                         ANONONLY=c.USERPTR_ANONONLY, VALIDATE=c.USERPTR_VALIDATE,
                         REGISTER=c.USERPTR_REGISTER)


@dataclass(frozen=True, slots=True, eq=False)
class IoctlSpec:
    """One entry of the kernel's table. Compared and hashed by identity: handlers are
    registered against the entry itself (`handles`), never against its number."""

    nr: int
    name: str
    cmd: int  # the table's own cmd: its direction and size decide copy-in/out with the user's
    flags: int
    decode_in: DecodeIn | None = None  # the trace's view of the bytes copied in
    decode_out: DecodeOut | None = None  # ... and of the bytes copied back (given the input)
    hints: Hints = dataclasses.field(default_factory=dict)  # how the decoded fields print
    out_hints: Hints | None = None  # ... those of the copied-back bytes, when they differ
    # the values it hands out and takes back (trace `handed`, the replay's mapping)
    handed: HandedValues = NOTHING_HANDED

    @property
    def copied_back_hints(self) -> Hints:
        """How the fields of the copied-back bytes print: `out_hints`, else `hints`."""
        return self.hints if self.out_hints is None else self.out_hints

    @property
    def full_name(self) -> str:
        """The name of the header's macro (what strace prints): DRM_IOCTL_AMDGPU_GEM_VA."""
        return f"DRM_IOCTL_{self.name}"

    @property
    def emulated(self) -> bool:
        """A handler is registered for it (else the kernel has it, ualinkd answers ENOTTY).
        Handlers register when their class is defined, so this reads the daemon's truth
        once `ualinkd.node` (which pulls in every handler module) is imported."""
        return self in _HANDLED

    @property
    def core(self) -> bool:
        """A DRM core ioctl (dispatched by the device), not one of the driver's."""
        return not DRM_COMMAND_BASE <= self.nr < DRM_COMMAND_END


_HANDLED: set[IoctlSpec] = set()
H = TypeVar("H", bound=Callable[..., object])


def handles(spec: IoctlSpec) -> Callable[[H], H]:
    """Mark a method as the handler of `spec`; `bind` collects the marked methods."""

    def mark(fn: H) -> H:
        fn.__ioctl__ = spec  # type: ignore[attr-defined]  # a mark on the function, read by bind()
        _HANDLED.add(spec)
        return fn

    return mark


def bind(obj: object) -> dict[IoctlSpec, Callable[..., Any]]:
    """Every method of `obj`'s class marked with @handles, bound to `obj`, by its entry.
    (`Any`: the signature is the caller's handler type, Handler or KfdHandler.)"""
    out: dict[IoctlSpec, Callable[..., Any]] = {}
    for name in dir(type(obj)):
        spec = getattr(getattr(type(obj), name, None), "__ioctl__", None)
        if isinstance(spec, IoctlSpec):
            out[spec] = getattr(obj, name)
    return out


# -- trace decoders: what the bytes of each entry mean -----------------------------------------

# Python field name -> the uAPI header's member name where they differ (structs.py's records
# cannot start a field with `_`): the trace prints the header's names. abi_check.py's C_NAMES
# starts from this.
HEADER_NAMES: dict[str, dict[str, str]] = {
    "drm_amdgpu_gem_create_out": {"pad": "_pad"},
    "drm_amdgpu_gem_mmap_in": {"pad": "_pad"},
    "drm_amdgpu_gem_va": {"pad": "_pad"},
    "drm_amdgpu_info_gds": {"pad": "_pad"},
    "drm_amdgpu_cs_chunk_ib": {"pad": "_pad"},
}


@dataclass(frozen=True, slots=True)
class Decoder:
    """A trace decoder (DecodeIn or DecodeOut) that also says where each field it yields
    starts in the bytes: drm_ioctl zero-fills past the caller's size, so the trace leaves
    out the fields that start past what the caller passed (`field_offsets`)."""

    fn: Callable[..., Fields]
    offsets: Mapping[str, int]

    def __call__(self, *args: Any) -> Fields:
        return self.fn(*args)


def field_offsets(decode: DecodeIn | DecodeOut | None) -> Mapping[str, int]:
    """Where each field of `decode`'s result starts (empty: not known, all are shown)."""
    return decode.offsets if isinstance(decode, Decoder) else {}


def _layout_offsets(layout: st.Layout[Any] | st.ArrayLayout[Any]) -> dict[str, int]:
    if isinstance(layout, st.ArrayLayout):
        return dict(layout.offsets)
    offsets, at = {}, 0
    for sub in layout.schema.subcons:
        offsets[sub.name] = at
        at += sub.sizeof()
    return offsets


def fields(layout: st.Layout[Any] | st.ArrayLayout[Any]) -> Decoder:
    names = HEADER_NAMES.get(layout.name, {})
    offsets = {names.get(k, k): v for k, v in _layout_offsets(layout).items()}

    def decode(data: bytes) -> Fields:
        padded = data[: layout.size].ljust(layout.size, b"\0")
        d = dataclasses.asdict(layout.decode(padded))
        return {names.get(k, k): v for k, v in d.items()} if names else d

    return Decoder(decode, offsets)


def out_fields(layout: st.Layout[Any] | st.ArrayLayout[Any], *names: str) -> Decoder:
    """The copied-back bytes through `layout`, all fields or only `names`."""
    decode = fields(layout)

    def out(data: bytes, inp: Fields) -> Fields:
        d = decode(data)
        return {n: d[n] for n in names} if names else d

    return Decoder(out, decode.offsets)


def _ualink_in(data: bytes) -> Fields:
    args = st.decode_ualink_handle_in(data[:24].ljust(24, b"\0"))
    out: Fields = {"op": args.op, "flags": args.flags}
    if args.op == c.UalinkOp.EXPORT:
        out["gem_handle"] = args.gem_handle
    elif args.op == c.UalinkOp.IMPORT:
        out["import_ualink_handle"] = args.handle_hi << 64 | args.handle_lo
    else:  # no arm of the union is this op's (the handler refuses it): its words as they are
        out["words"] = [args.handle_lo & 0xFFFFFFFF, args.handle_lo >> 32,
                        args.handle_hi & 0xFFFFFFFF, args.handle_hi >> 32]
    return out


def _ualink_out(data: bytes, inp: Fields) -> Fields:
    data = data[:16].ljust(16, b"\0")
    if inp.get("op") == c.UalinkOp.EXPORT:
        lo, hi = st.UALINK_HANDLE_OUT_EXPORT.unpack(data)
        return {"export_ualink_handle": hi << 64 | lo}
    if inp.get("op") == c.UalinkOp.IMPORT:
        return {"import_dmabuf_handle": st.UALINK_HANDLE_OUT_IMPORT.unpack(data[:4])[0]}
    return {}  # (an unknown op is refused before anything is written)


# union drm_amdgpu_ctx_out: the arm each op writes (amdgpu_ctx_ioctl); FREE_CTX and
# SET_STABLE_PSTATE write none.
CTX_STABLE_PSTATES = enum_of({v: f"AMDGPU_CTX_STABLE_PSTATE_{n}"
                              for v, n in c.CTX_STABLE_PSTATES.items()})
CTX_QUERY2_FLAGS = flag_set("AMDGPU_CTX_QUERY2_FLAGS_", RESET=1 << 0, VRAMLOST=1 << 1,
                            GUILTY=1 << 2, RAS_CE=1 << 3, RAS_UE=1 << 4,
                            RESET_IN_PROGRESS=1 << 5)
CTX_RESET_STATUS = enum_of({v: f"AMDGPU_CTX_{n}" for v, n in c.CTX_RESETS.items()})


def _ctx_out(data: bytes, inp: Fields) -> Fields:
    data = data[: st.CTX_SIZE].ljust(st.CTX_SIZE, b"\0")
    op = inp.get("op")
    if op == c.CTX_OP_ALLOC_CTX:
        return {"ctx_id": st.CTX_OUT_ALLOC.unpack(data[:8])[0]}
    if op in (c.CTX_OP_QUERY_STATE, c.CTX_OP_QUERY_STATE2):
        flags, hangs, reset_status = st.CTX_OUT_STATE.unpack(data)
        return {"flags": flags, "hangs": hangs, "reset_status": reset_status}
    if op == c.CTX_OP_GET_STABLE_PSTATE:
        return {"flags": st.CTX_OUT_ALLOC.unpack(data[:8])[0]}
    return {}


def _gem_metadata(data: bytes) -> Fields:
    m = st.decode_gem_metadata(data[: st.GEM_METADATA_SIZE].ljust(st.GEM_METADATA_SIZE, b"\0"))
    used = min(m.data_size_bytes, st.GEM_METADATA_DATA_BYTES) // 4
    return {"handle": m.handle, "op": m.op, "flags": m.flags,
            "tiling_info": m.tiling_info, "data_size_bytes": m.data_size_bytes,
            "data": list(m.data[:used])}


def _entry(nr: int, name: str, layout: st.Layout[Any] | st.ArrayLayout[Any] | int,
           direction: int = IOC_READ | IOC_WRITE, flags: int = DRM_RENDER_ALLOW,
           decode_in: DecodeIn | None = None, decode_out: DecodeOut | None = None,
           hints: Hints | None = None, out_hints: Hints | None = None,
           handed: HandedValues = NOTHING_HANDED) -> IoctlSpec:
    """An entry whose arguments have a layout here (its size is the table's size)."""
    size = layout if isinstance(layout, int) else layout.size
    if decode_in is None and not isinstance(layout, int):
        decode_in = fields(layout)
    return IoctlSpec(nr, name, ioc(direction, ord("d"), nr, size), flags, decode_in, decode_out,
                     hints or {}, out_hints, handed)


def _drv_entry(index: int, name: str, layout: st.Layout[Any] | st.ArrayLayout[Any] | int,
               direction: int = IOC_READ | IOC_WRITE, decode_in: DecodeIn | None = None,
               decode_out: DecodeOut | None = None, hints: Hints | None = None,
               flags: int = DRM_AUTH | DRM_RENDER_ALLOW,
               out_hints: Hints | None = None,
               handed: HandedValues = NOTHING_HANDED) -> IoctlSpec:
    return _entry(DRM_COMMAND_BASE + index, f"AMDGPU_{name}", layout, direction,
                  flags, decode_in, decode_out, hints, out_hints, handed)


def _slot(layout: st.Layout[Any], name: str, where: str, kind: str, role: str) -> Slot:
    return Slot(layout.field(name), where, kind, role)


def _handed(layout: st.Layout[Any], *slots: tuple[str, str, str, str]) -> HandedValues:
    """Values at `layout`'s named fields: (field, "in"/"out", kind, role) each."""
    return HandedValues(tuple(_slot(layout, *s) for s in slots))


def _syncobj_array(layout: st.Layout[Any]) -> HandedValues:
    """The syncobj ioctls' `handles`: a pointer to `count_handles` u32 syncobj handles."""
    return HandedValues(arrays=(ArraySlot(layout.field("handles"),
                                          layout.field("count_handles"), "syncobj"),))


# -- the named entries handlers register against ------------------------------------------------

GEM_CLOSE = _entry(0x09, "GEM_CLOSE", st.GEM_CLOSE, IOC_WRITE,
                   handed=_handed(st.GEM_CLOSE, ("handle", "in", "gem", FREE)))
GET_CAP = _entry(0x0C, "GET_CAP", st.GET_CAP, decode_out=out_fields(st.GET_CAP),
                 hints={"capability": enum_of(c.DRM_CAPS)})
PRIME_HANDLE_TO_FD = _entry(0x2D, "PRIME_HANDLE_TO_FD", st.PRIME_HANDLE,
                            decode_out=out_fields(st.PRIME_HANDLE, "fd"),
                            hints={"flags": PRIME_FLAGS},
                            handed=_handed(st.PRIME_HANDLE, ("handle", "in", "gem", REF),
                                           ("fd", "out", "token", NEW)))
PRIME_FD_TO_HANDLE = _entry(0x2E, "PRIME_FD_TO_HANDLE", st.PRIME_HANDLE,
                            decode_out=out_fields(st.PRIME_HANDLE, "handle"),
                            hints={"flags": PRIME_FLAGS},
                            handed=_handed(st.PRIME_HANDLE, ("fd", "in", "fd", REF),
                                           ("handle", "out", "gem", NEW)))
SYNCOBJ_CREATE = _entry(0xBF, "SYNCOBJ_CREATE", st.SYNCOBJ_CREATE,
                        decode_out=out_fields(st.SYNCOBJ_CREATE, "handle"),
                        hints={"flags": flag_set("DRM_SYNCOBJ_CREATE_",
                                                 SIGNALED=c.DRM_SYNCOBJ_CREATE_SIGNALED)},
                        handed=_handed(st.SYNCOBJ_CREATE, ("handle", "out", "syncobj", NEW)))
SYNCOBJ_DESTROY = _entry(0xC0, "SYNCOBJ_DESTROY", st.SYNCOBJ_DESTROY,
                         handed=_handed(st.SYNCOBJ_DESTROY, ("handle", "in", "syncobj", FREE)))
SYNCOBJ_HANDLE_TO_FD = _entry(
    0xC1, "SYNCOBJ_HANDLE_TO_FD", st.SYNCOBJ_HANDLE, decode_out=out_fields(st.SYNCOBJ_HANDLE, "fd"),
    hints={"flags": flag_set("DRM_SYNCOBJ_HANDLE_TO_FD_FLAGS_", EXPORT_SYNC_FILE=(
        c.DRM_SYNCOBJ_HANDLE_TO_FD_FLAGS_EXPORT_SYNC_FILE))},
    handed=_handed(st.SYNCOBJ_HANDLE, ("handle", "in", "syncobj", REF),
                   ("fd", "out", "token", NEW)))
SYNCOBJ_FD_TO_HANDLE = _entry(
    0xC2, "SYNCOBJ_FD_TO_HANDLE", st.SYNCOBJ_HANDLE,
    decode_out=out_fields(st.SYNCOBJ_HANDLE, "handle"),
    hints={"flags": flag_set("DRM_SYNCOBJ_FD_TO_HANDLE_FLAGS_", IMPORT_SYNC_FILE=(
        c.DRM_SYNCOBJ_FD_TO_HANDLE_FLAGS_IMPORT_SYNC_FILE))},
    handed=_handed(st.SYNCOBJ_HANDLE, ("fd", "in", "fd", REF),
                   ("handle", "out", "syncobj", NEW)))
SYNCOBJ_WAIT = _entry(0xC3, "SYNCOBJ_WAIT", st.SYNCOBJ_WAIT,
                      decode_out=out_fields(st.SYNCOBJ_WAIT, "first_signaled"),
                      hints={"handles": HEX, "flags": SYNCOBJ_WAIT_FLAGS},
                      handed=_syncobj_array(st.SYNCOBJ_WAIT))
SYNCOBJ_RESET = _entry(0xC4, "SYNCOBJ_RESET", st.SYNCOBJ_ARRAY, hints={"handles": HEX},
                       handed=_syncobj_array(st.SYNCOBJ_ARRAY))
SYNCOBJ_SIGNAL = _entry(0xC5, "SYNCOBJ_SIGNAL", st.SYNCOBJ_ARRAY, hints={"handles": HEX},
                        handed=_syncobj_array(st.SYNCOBJ_ARRAY))
SYNCOBJ_TIMELINE_WAIT = _entry(0xCA, "SYNCOBJ_TIMELINE_WAIT", st.SYNCOBJ_TIMELINE_WAIT,
                               decode_out=out_fields(st.SYNCOBJ_TIMELINE_WAIT,
                                                     "first_signaled"),
                               hints={"handles": HEX, "points": HEX,
                                      "flags": SYNCOBJ_WAIT_FLAGS},
                               handed=_syncobj_array(st.SYNCOBJ_TIMELINE_WAIT))
SYNCOBJ_QUERY = _entry(0xCB, "SYNCOBJ_QUERY", st.SYNCOBJ_TIMELINE_ARRAY,
                       hints={"handles": HEX, "points": HEX, "flags": flag_set(
                           "DRM_SYNCOBJ_QUERY_FLAGS_",
                           LAST_SUBMITTED=c.DRM_SYNCOBJ_QUERY_FLAGS_LAST_SUBMITTED)},
                       handed=_syncobj_array(st.SYNCOBJ_TIMELINE_ARRAY))
SYNCOBJ_TRANSFER = _entry(0xCC, "SYNCOBJ_TRANSFER", st.SYNCOBJ_TRANSFER,
                          hints={"flags": SYNCOBJ_WAIT_FLAGS},
                          handed=_handed(st.SYNCOBJ_TRANSFER,
                                         ("src_handle", "in", "syncobj", REF),
                                         ("dst_handle", "in", "syncobj", REF)))
SYNCOBJ_TIMELINE_SIGNAL = _entry(0xCD, "SYNCOBJ_TIMELINE_SIGNAL", st.SYNCOBJ_TIMELINE_ARRAY,
                                 hints={"handles": HEX, "points": HEX},
                                 handed=_syncobj_array(st.SYNCOBJ_TIMELINE_ARRAY))
SYNCOBJ_EVENTFD = _entry(0xCF, "SYNCOBJ_EVENTFD", st.SYNCOBJ_EVENTFD,
                         hints={"flags": SYNCOBJ_WAIT_FLAGS},
                         handed=_handed(st.SYNCOBJ_EVENTFD, ("handle", "in", "syncobj", REF)))

AMDGPU_GEM_CREATE = _drv_entry(0x00, "GEM_CREATE", st.GEM_CREATE_SIZE,
                               decode_in=fields(st.GEM_CREATE_IN),
                               decode_out=out_fields(st.GEM_CREATE_OUT, "handle"),
                               hints={"bo_size": HEX, "alignment": HEX, "domains": GEM_DOMAINS,
                                      "domain_flags": GEM_CREATE_FLAGS},
                               handed=_handed(st.GEM_CREATE_OUT, ("handle", "out", "gem", NEW)))
AMDGPU_GEM_MMAP = _drv_entry(0x01, "GEM_MMAP", st.GEM_MMAP_SIZE,
                             decode_in=fields(st.GEM_MMAP_IN),
                             decode_out=out_fields(st.GEM_MMAP_OUT),
                             hints={"addr_ptr": HEX},
                             handed=HandedValues((
                                 _slot(st.GEM_MMAP_IN, "handle", "in", "gem", REF),
                                 _slot(st.GEM_MMAP_OUT, "addr_ptr", "out", "mmap_offset", NEW))))
AMDGPU_CTX = _drv_entry(
    0x02, "CTX", st.CTX_SIZE, decode_in=fields(st.CTX_IN), decode_out=Decoder(_ctx_out, {}),
    hints={"op": enum_of(c.CTX_OPS),
           "flags": ByOp(((c.CTX_OP_SET_STABLE_PSTATE, CTX_STABLE_PSTATES),))},
    out_hints={"flags": ByOp(((c.CTX_OP_QUERY_STATE, HEX),
                              (c.CTX_OP_QUERY_STATE2, CTX_QUERY2_FLAGS),
                              (c.CTX_OP_GET_STABLE_PSTATE, CTX_STABLE_PSTATES))),
               "reset_status": CTX_RESET_STATUS},
    # out.alloc.ctx_id handed out by ALLOC_CTX, in.ctx_id given back by FREE_CTX, else used
    handed=HandedValues(
        (Slot(st.CTX_IN.field("ctx_id"), "in", "ctx", REF),), op=st.CTX_IN.field("op"),
        by_op=((c.CTX_OP_ALLOC_CTX, (Slot(st.CTX_OUT_CTX_ID, "out", "ctx", NEW),)),
               (c.CTX_OP_FREE_CTX, (Slot(st.CTX_IN.field("ctx_id"), "in", "ctx", FREE),)))))
AMDGPU_BO_LIST = _drv_entry(
    0x03, "BO_LIST", st.BO_LIST_SIZE, decode_in=fields(st.BO_LIST_IN),
    decode_out=Decoder(lambda d, i: {"list_handle": st.BO_LIST_OUT.unpack(
        d[:8].ljust(8, b"\0"))[0]}, {"list_handle": 0}),
    hints={"operation": enum_of({v: f"AMDGPU_BO_LIST_OP_{n}" for v, n in c.BO_LIST_OPS.items()}),
           "bo_info_ptr": HEX})
AMDGPU_CS = _drv_entry(
    0x04, "CS", st.CS_SIZE, decode_in=fields(st.CS_IN),
    decode_out=Decoder(lambda d, i: {"handle": st.CS_OUT.unpack(d[:8].ljust(8, b"\0"))[0]},
                       {"handle": 0}),
    hints={"chunks": HEX})
AMDGPU_WAIT_CS = _drv_entry(
    0x09, "WAIT_CS", st.WAIT_CS_SIZE, decode_in=fields(st.WAIT_CS_IN),
    decode_out=Decoder(lambda d, i: {"status": int.from_bytes(d[:8].ljust(8, b"\0"),
                                                              "little")}, {"status": 0}))
AMDGPU_WAIT_FENCES = _drv_entry(
    0x12, "WAIT_FENCES", st.WAIT_FENCES_SIZE, decode_in=fields(st.WAIT_FENCES_IN),
    decode_out=Decoder(lambda d, i: dict(zip(("status", "first_signaled"),
                                             st.WAIT_FENCES_OUT.unpack(d[:8].ljust(8, b"\0")),
                                             strict=True)),
                       {"status": 0, "first_signaled": 4}),
    hints={"fences": HEX})


def _fence_to_handle_in(data: bytes) -> Fields:
    data = data[: st.FENCE_TO_HANDLE_SIZE].ljust(st.FENCE_TO_HANDLE_SIZE, b"\0")
    out: Fields = dataclasses.asdict(st.AMDGPU_FENCE.decode(data[: st.AMDGPU_FENCE.size]))
    out["what"], out["pad"] = st.FENCE_TO_HANDLE_WHAT.unpack(data[st.AMDGPU_FENCE.size:])
    return out


AMDGPU_FENCE_TO_HANDLE = _drv_entry(
    0x14, "FENCE_TO_HANDLE", st.FENCE_TO_HANDLE_SIZE,
    decode_in=Decoder(_fence_to_handle_in, {"ctx_id": 0, "ip_type": 4, "ip_instance": 8,
                                            "ring": 12, "seq_no": 16, "what": 24, "pad": 28}),
    decode_out=Decoder(lambda d, i: {"handle": int.from_bytes(d[:4].ljust(4, b"\0"),
                                                              "little")}, {"handle": 0}),
    hints={"what": enum_of({v: f"AMDGPU_FENCE_TO_HANDLE_{n}"
                            for v, n in c.FENCE_TO_HANDLE_WHATS.items()})})
AMDGPU_INFO = _drv_entry(0x05, "INFO", st.INFO, IOC_WRITE,
                         hints={"return_pointer": HEX, "query": enum_of(c.INFO_QUERIES)},
                         # TIMESTAMP writes the GPU clock counter to the caller's memory
                         handed=HandedValues(clock_if=(st.INFO.field("query"),
                                                       c.INFO_TIMESTAMP)))
AMDGPU_GEM_METADATA = _drv_entry(0x06, "GEM_METADATA", st.GEM_METADATA_SIZE,
                                 decode_in=_gem_metadata,
                                 decode_out=lambda d, i: _gem_metadata(d),
                                 hints={"op": enum_of({
                                     c.GEM_METADATA_OP_SET_METADATA: "SET_METADATA",
                                     c.GEM_METADATA_OP_GET_METADATA: "GET_METADATA"}),
                                     "flags": HEX, "tiling_info": HEX, "data": HEX},
                                 handed=HandedValues((Slot(st.GEM_METADATA_HANDLE, "in",
                                                           "gem", REF),)))
AMDGPU_GEM_WAIT_IDLE = _drv_entry(0x07, "GEM_WAIT_IDLE", st.GEM_WAIT_IDLE_SIZE,
                                  decode_in=fields(st.GEM_WAIT_IDLE_IN),
                                  decode_out=lambda d, i: {"status": int.from_bytes(d[:4],
                                                                                    "little")},
                                  handed=_handed(st.GEM_WAIT_IDLE_IN,
                                                 ("handle", "in", "gem", REF)))
AMDGPU_GEM_VA = _drv_entry(0x08, "GEM_VA", st.GEM_VA, IOC_WRITE,
                           hints={"operation": VA_OPERATIONS, "flags": VM_PAGE_FLAGS,
                                  "va_address": HEX, "offset_in_bo": HEX, "map_size": HEX,
                                  "input_fence_syncobj_handles": HEX},
                           handed=HandedValues(
                               (_slot(st.GEM_VA, "handle", "in", "gem", REF),
                                _slot(st.GEM_VA, "vm_timeline_syncobj_out", "in", "syncobj",
                                      REF)),
                               arrays=(ArraySlot(st.GEM_VA.field("input_fence_syncobj_handles"),
                                                 st.GEM_VA.field("num_syncobj_handles"),
                                                 "syncobj"),)))
AMDGPU_GEM_OP = _drv_entry(0x10, "GEM_OP", st.GEM_OP, decode_out=out_fields(st.GEM_OP),
                           hints={"op": enum_of({
                               c.GEM_OP_GET_GEM_CREATE_INFO: "GET_GEM_CREATE_INFO",
                               c.GEM_OP_SET_PLACEMENT: "SET_PLACEMENT",
                               c.GEM_OP_GET_MAPPING_INFO: "GET_MAPPING_INFO"}),
                               "value": HEX},
                           handed=_handed(st.GEM_OP, ("handle", "in", "gem", REF)))
AMDGPU_GEM_USERPTR = _drv_entry(0x11, "GEM_USERPTR", st.GEM_USERPTR,
                                decode_out=out_fields(st.GEM_USERPTR, "handle"),
                                hints={"addr": HEX, "size": HEX, "flags": USERPTR_FLAGS},
                                handed=_handed(st.GEM_USERPTR, ("handle", "out", "gem", NEW)))
AMDGPU_VM = _drv_entry(0x13, "VM", st.VM_SIZE, decode_in=fields(st.VM_IN),
                       hints={"op": enum_of(c.VM_OPS)})
AMDGPU_UALINK_HANDLE = _drv_entry(
    0x1B, "UALINK_HANDLE", st.UALINK_HANDLE_SIZE,
    decode_in=Decoder(_ualink_in, {
        "op": st.UALINK_IN_OP.offset, "flags": st.UALINK_IN_FLAGS.offset,
        "gem_handle": st.UALINK_IN_GEM_HANDLE.offset,
        "import_ualink_handle": st.UALINK_IN_IMPORT_HANDLE[0].offset,
        "words": st.UALINK_IN_GEM_HANDLE.offset}),
    decode_out=Decoder(_ualink_out, {
        "export_ualink_handle": st.UALINK_OUT_EXPORT_HANDLE[0].offset,
        "import_dmabuf_handle": st.UALINK_OUT_IMPORT_DMABUF.offset}),
    # no flag is defined yet (the handler refuses any): all of them are unknown bits, in hex
    hints={"op": enum_of({op.value: op.name for op in c.UalinkOp}), "flags": FlagSet(()),
           "import_ualink_handle": HANDLE128, "export_ualink_handle": HANDLE128,
           "words": HEX},
    # EXPORT takes a GEM handle and hands out the pod-wide handle; any other op (IMPORT)
    # takes that handle and hands out a dma-buf token
    handed=HandedValues(
        (*(Slot(at, "in", kind, REF) for at, kind in zip(
            st.UALINK_IN_IMPORT_HANDLE, ("ualink_lo", "ualink_hi"), strict=True)),
         Slot(st.UALINK_OUT_IMPORT_DMABUF, "out", "token", NEW)),
        op=st.UALINK_IN_OP,
        by_op=((c.UalinkOp.EXPORT, (
            Slot(st.UALINK_IN_GEM_HANDLE, "in", "gem", REF),
            *(Slot(at, "out", kind, NEW) for at, kind in zip(
                st.UALINK_OUT_EXPORT_HANDLE, ("ualink_lo", "ualink_hi"), strict=True)))),)))


# DRM core ioctls of a modern kernel (no DRM_LEGACY, CONFIG_AGP off). Only the nrs listed
# exist; any other core nr is EINVAL. Those without DRM_RENDER_ALLOW answer EACCES on a
# render node before their handler would run, so they need no emulation.
VERSION = _entry(0x00, "VERSION", st.DRM_VERSION, decode_out=out_fields(st.DRM_VERSION),
                 hints={"name": HEX, "date": HEX, "desc": HEX})


def _core(nr: int, name: str, direction: int, size: int, flags: int) -> IoctlSpec:
    return IoctlSpec(nr, name, ioc(direction, ord("d"), nr, size), flags)


CORE_IOCTLS: dict[int, IoctlSpec] = {
    s.nr: s
    for s in [
        VERSION,
        _core(0x01, "GET_UNIQUE", _RW, 16, 0),
        _core(0x02, "GET_MAGIC", IOC_READ, 4, 0),
        _core(0x03, "IRQ_BUSID", _RW, 16, DRM_MASTER | DRM_ROOT_ONLY),
        _core(0x05, "GET_CLIENT", _RW, 40, 0),
        _core(0x06, "GET_STATS", IOC_READ, 248, 0),
        _core(0x07, "SET_VERSION", _RW, 16, DRM_MASTER),
        _core(0x08, "MODESET_CTL", IOC_WRITE, 8, 0),
        GEM_CLOSE,
        _core(0x0A, "GEM_FLINK", _RW, 8, DRM_AUTH),
        _core(0x0B, "GEM_OPEN", _RW, 16, DRM_AUTH),
        GET_CAP,
        _core(0x0D, "SET_CLIENT_CAP", IOC_WRITE, 16, 0),
        _core(0x10, "SET_UNIQUE", IOC_WRITE, 16, DRM_AUTH | DRM_MASTER | DRM_ROOT_ONLY),
        _core(0x11, "AUTH_MAGIC", IOC_WRITE, 4, DRM_MASTER),
        _core(0x12, "BLOCK", _RW, 4, DRM_AUTH | DRM_MASTER | DRM_ROOT_ONLY),
        _core(0x13, "UNBLOCK", _RW, 4, DRM_AUTH | DRM_MASTER | DRM_ROOT_ONLY),
        _core(0x1E, "SET_MASTER", IOC_NONE, 0, 0),
        _core(0x1F, "DROP_MASTER", IOC_NONE, 0, 0),
        _core(0x27, "ADD_DRAW", _RW, 4, DRM_AUTH | DRM_MASTER | DRM_ROOT_ONLY),
        _core(0x28, "RM_DRAW", _RW, 4, DRM_AUTH | DRM_MASTER | DRM_ROOT_ONLY),
        _core(0x2C, "FINISH", IOC_WRITE, 8, DRM_AUTH),
        PRIME_HANDLE_TO_FD,
        PRIME_FD_TO_HANDLE,
        _core(0x3A, "WAIT_VBLANK", _RW, 24, 0),
        _core(0x3B, "CRTC_GET_SEQUENCE", _RW, 24, 0),
        _core(0x3C, "CRTC_QUEUE_SEQUENCE", _RW, 24, 0),
        _core(0x3F, "UPDATE_DRAW", IOC_WRITE, 24, DRM_AUTH | DRM_MASTER | DRM_ROOT_ONLY),
        *(
            _core(nr, f"MODE_{name}", _RW, 8, flags)
            for nr, name, flags in [
                (0xA0, "GETRESOURCES", 0), (0xA1, "GETCRTC", 0), (0xA2, "SETCRTC", DRM_MASTER),
                (0xA3, "CURSOR", DRM_MASTER), (0xA4, "GETGAMMA", 0),
                (0xA5, "SETGAMMA", DRM_MASTER), (0xA6, "GETENCODER", 0),
                (0xA7, "GETCONNECTOR", 0), (0xA8, "ATTACHMODE", DRM_MASTER),
                (0xA9, "DETACHMODE", DRM_MASTER), (0xAA, "GETPROPERTY", 0),
                (0xAB, "SETPROPERTY", DRM_MASTER), (0xAC, "GETPROPBLOB", 0), (0xAD, "GETFB", 0),
                (0xAE, "ADDFB", 0), (0xAF, "RMFB", 0), (0xB0, "PAGE_FLIP", DRM_MASTER),
                (0xB1, "DIRTYFB", DRM_MASTER), (0xB2, "CREATE_DUMB", 0),
                # mainline: no flags (a RENDER_ALLOW variant exists only as a patch)
                (0xB3, "MAP_DUMB", 0), (0xB4, "DESTROY_DUMB", 0),
                (0xB5, "GETPLANERESOURCES", 0), (0xB6, "GETPLANE", 0),
                (0xB7, "SETPLANE", DRM_MASTER), (0xB8, "ADDFB2", 0),
                (0xB9, "OBJ_GETPROPERTIES", 0), (0xBA, "OBJ_SETPROPERTY", DRM_MASTER),
                (0xBB, "CURSOR2", DRM_MASTER), (0xBC, "ATOMIC", DRM_MASTER),
                (0xBD, "CREATEPROPBLOB", 0), (0xBE, "DESTROYPROPBLOB", 0),
                (0xC6, "CREATE_LEASE", DRM_MASTER), (0xC7, "LIST_LESSEES", DRM_MASTER),
                (0xC8, "GET_LEASE", DRM_MASTER), (0xC9, "REVOKE_LEASE", DRM_MASTER),
                (0xCE, "GETFB2", 0), (0xD0, "CLOSEFB", 0),
            ]
        ),
        # Syncobjs (drm_syncobj.c)
        SYNCOBJ_CREATE, SYNCOBJ_DESTROY, SYNCOBJ_HANDLE_TO_FD, SYNCOBJ_FD_TO_HANDLE,
        SYNCOBJ_WAIT, SYNCOBJ_RESET, SYNCOBJ_SIGNAL, SYNCOBJ_TIMELINE_WAIT, SYNCOBJ_QUERY,
        SYNCOBJ_TRANSFER, SYNCOBJ_TIMELINE_SIGNAL, SYNCOBJ_EVENTFD,
        _core(0xD1, "SET_CLIENT_NAME", _RW, 16, DRM_RENDER_ALLOW),
    ]
}


# amdgpu's driver table (amdgpu_drv.c + the UALink entry at index 0x1B, spec §1.1). Indices
# 0x0A–0x0F are empty slots (EINVAL); the table ends at 0x1B, so nr ≥ 0x5C is EINVAL.
AMDGPU_IOCTLS: dict[int, IoctlSpec] = {
    s.nr: s
    for s in [
        AMDGPU_GEM_CREATE,
        AMDGPU_GEM_MMAP,
        AMDGPU_CTX,
        AMDGPU_BO_LIST,
        AMDGPU_CS,
        AMDGPU_INFO,
        AMDGPU_GEM_METADATA,
        AMDGPU_GEM_WAIT_IDLE,
        AMDGPU_GEM_VA,
        AMDGPU_WAIT_CS,
        AMDGPU_GEM_OP,
        AMDGPU_GEM_USERPTR,
        AMDGPU_WAIT_FENCES,
        AMDGPU_VM,
        AMDGPU_FENCE_TO_HANDLE,
        # DRM_MASTER only (amdgpu_ioctls_kms): a render client gets EACCES at drm_ioctl_permit
        _drv_entry(0x15, "SCHED", 16, IOC_WRITE, flags=DRM_MASTER),
        _drv_entry(0x16, "USERQ", 64),
        _drv_entry(0x17, "USERQ_SIGNAL", 48),
        _drv_entry(0x18, "USERQ_WAIT", 56),
        _drv_entry(0x19, "GEM_LIST_HANDLES", 16),
        _drv_entry(0x1A, "PROC_OPTIONS", 8),
        AMDGPU_UALINK_HANDLE,
    ]
}
AMDGPU_NUM_IOCTLS = 0x1C


def lookup(nr: int) -> IoctlSpec | None:
    """The table entry the kernel would pick for `nr` (None: no entry, EINVAL)."""
    if DRM_COMMAND_BASE <= nr < DRM_COMMAND_END:
        return AMDGPU_IOCTLS.get(nr)
    return CORE_IOCTLS.get(nr)


def all_entries() -> list[IoctlSpec]:
    return [*CORE_IOCTLS.values(), *AMDGPU_IOCTLS.values()]


# -- the KFD's table (/dev/kfd, kfd_chardev.c's amdkfd_ioctls) -----------------------------------
# Type 'K'; the kernel dispatches by nr alone, within [AMDKFD_COMMAND_START,
# AMDKFD_COMMAND_END): anything else is ENOTTY before a byte is copied. Entries without a
# layout here carry only their size (not emulated: ENOTTY, said once in the log).
KFD_IOCTL_TYPE = ord("K")
KFD_COMMAND_START = 0x01
KFD_COMMAND_END = 0x27


def _kfd(nr: int, name: str, layout: st.Layout[Any] | int, direction: int = _RW,
         handed: HandedValues = NOTHING_HANDED) -> IoctlSpec:
    size = layout if isinstance(layout, int) else layout.size
    decode_in = None if isinstance(layout, int) else fields(layout)
    decode_out = None if isinstance(layout, int) else out_fields(layout)
    return IoctlSpec(nr, f"AMDKFD_{name}", ioc(direction, KFD_IOCTL_TYPE, nr, size), 0,
                     decode_in, decode_out, handed=handed)


KFD_GET_VERSION = _kfd(0x01, "GET_VERSION", st.KFD_GET_VERSION, IOC_READ)
KFD_SET_MEMORY_POLICY = _kfd(0x04, "SET_MEMORY_POLICY", st.KFD_SET_MEMORY_POLICY, IOC_WRITE)
KFD_GET_CLOCK_COUNTERS = _kfd(  # the gpu, cpu and system counters differ in every run
    0x05, "GET_CLOCK_COUNTERS", st.KFD_GET_CLOCK_COUNTERS,
    handed=HandedValues(clock_out=(st.KFD_GET_CLOCK_COUNTERS.field("gpu_clock_counter"),
                                   st.KFD_GET_CLOCK_COUNTERS.field("system_clock_counter"))))
KFD_CREATE_EVENT = _kfd(0x08, "CREATE_EVENT", st.KFD_CREATE_EVENT)
KFD_DESTROY_EVENT = _kfd(0x09, "DESTROY_EVENT", st.KFD_EVENT_ID, IOC_WRITE)
KFD_SET_EVENT = _kfd(0x0A, "SET_EVENT", st.KFD_EVENT_ID, IOC_WRITE)
KFD_RESET_EVENT = _kfd(0x0B, "RESET_EVENT", st.KFD_EVENT_ID, IOC_WRITE)
KFD_WAIT_EVENTS = _kfd(0x0C, "WAIT_EVENTS", st.KFD_WAIT_EVENTS)
KFD_SET_SCRATCH_BACKING_VA = _kfd(0x11, "SET_SCRATCH_BACKING_VA",
                                  st.KFD_SET_SCRATCH_BACKING_VA)
KFD_SET_TRAP_HANDLER = _kfd(0x13, "SET_TRAP_HANDLER", st.KFD_SET_TRAP_HANDLER, IOC_WRITE)
KFD_GET_PROCESS_APERTURES_NEW = _kfd(0x14, "GET_PROCESS_APERTURES_NEW",
                                     st.KFD_GET_PROCESS_APERTURES_NEW)
KFD_ACQUIRE_VM = _kfd(0x15, "ACQUIRE_VM", st.KFD_ACQUIRE_VM, IOC_WRITE)
KFD_ALLOC_MEMORY_OF_GPU = _kfd(0x16, "ALLOC_MEMORY_OF_GPU", st.KFD_ALLOC_MEMORY_OF_GPU)
KFD_FREE_MEMORY_OF_GPU = _kfd(0x17, "FREE_MEMORY_OF_GPU", st.KFD_FREE_MEMORY_OF_GPU, IOC_WRITE)
KFD_MAP_MEMORY_TO_GPU = _kfd(0x18, "MAP_MEMORY_TO_GPU", st.KFD_MAP_MEMORY_TO_GPU)
KFD_UNMAP_MEMORY_FROM_GPU = _kfd(0x19, "UNMAP_MEMORY_FROM_GPU", st.KFD_MAP_MEMORY_TO_GPU)
KFD_GET_DMABUF_INFO = _kfd(0x1C, "GET_DMABUF_INFO", st.KFD_GET_DMABUF_INFO)
KFD_IMPORT_DMABUF = _kfd(0x1D, "IMPORT_DMABUF", st.KFD_IMPORT_DMABUF)
KFD_SET_XNACK_MODE = _kfd(0x21, "SET_XNACK_MODE", st.KFD_SET_XNACK_MODE)
KFD_EXPORT_DMABUF = _kfd(0x24, "EXPORT_DMABUF", st.KFD_EXPORT_DMABUF)
KFD_AVAILABLE_MEMORY = _kfd(0x23, "AVAILABLE_MEMORY", st.KFD_GET_AVAILABLE_MEMORY)
# A user queue: its id, per process (the kfd file's; 0 is the first, find_first_zero_bit in
# pqm_create_queue), and the doorbell's mmap cookie, which no ioctl takes back (the client
# mmaps it) but a re-created queue may legitimately get another of.
KFD_CREATE_QUEUE = _kfd(0x02, "CREATE_QUEUE", st.KFD_CREATE_QUEUE,
                        handed=_handed(st.KFD_CREATE_QUEUE,
                                       ("doorbell_offset", "out", "kfd_doorbell", NEW),
                                       ("queue_id", "out", "kfd_queue", NEW)))
KFD_DESTROY_QUEUE = _kfd(
    0x03, "DESTROY_QUEUE", st.KFD_DESTROY_QUEUE,
    handed=_handed(st.KFD_DESTROY_QUEUE, ("queue_id", "in", "kfd_queue", FREE)))
KFD_UPDATE_QUEUE = _kfd(0x07, "UPDATE_QUEUE", st.KFD_UPDATE_QUEUE, IOC_WRITE,
                        handed=_handed(st.KFD_UPDATE_QUEUE, ("queue_id", "in", "kfd_queue", REF)))
KFD_SET_CU_MASK = _kfd(0x1A, "SET_CU_MASK", st.KFD_SET_CU_MASK, IOC_WRITE,
                       handed=_handed(st.KFD_SET_CU_MASK, ("queue_id", "in", "kfd_queue", REF)))
KFD_GET_QUEUE_WAVE_STATE = _kfd(
    0x1B, "GET_QUEUE_WAVE_STATE", st.KFD_GET_QUEUE_WAVE_STATE,
    handed=_handed(st.KFD_GET_QUEUE_WAVE_STATE, ("queue_id", "in", "kfd_queue", REF)))
KFD_ALLOC_QUEUE_GWS = _kfd(
    0x1E, "ALLOC_QUEUE_GWS", st.KFD_ALLOC_QUEUE_GWS,
    handed=_handed(st.KFD_ALLOC_QUEUE_GWS, ("queue_id", "in", "kfd_queue", REF)))
KFD_GET_TILE_CONFIG = _kfd(0x12, "GET_TILE_CONFIG", st.KFD_GET_TILE_CONFIG)
KFD_RUNTIME_ENABLE = _kfd(0x25, "RUNTIME_ENABLE", st.KFD_RUNTIME_ENABLE)
KFD_SVM = _kfd(0x20, "SVM", 24)

KFD_IOCTLS: dict[int, IoctlSpec] = {
    s.nr: s
    for s in [
        KFD_GET_VERSION,
        KFD_CREATE_QUEUE,
        KFD_DESTROY_QUEUE,
        KFD_SET_MEMORY_POLICY,
        KFD_GET_CLOCK_COUNTERS,
        _kfd(0x06, "GET_PROCESS_APERTURES", 400, IOC_READ),
        KFD_UPDATE_QUEUE,
        KFD_CREATE_EVENT,
        KFD_DESTROY_EVENT,
        KFD_SET_EVENT,
        KFD_RESET_EVENT,
        KFD_WAIT_EVENTS,
        _kfd(0x0D, "DBG_REGISTER_DEPRECATED", 8, IOC_WRITE),
        _kfd(0x0E, "DBG_UNREGISTER_DEPRECATED", 8, IOC_WRITE),
        _kfd(0x0F, "DBG_ADDRESS_WATCH_DEPRECATED", 16, IOC_WRITE),
        _kfd(0x10, "DBG_WAVE_CONTROL_DEPRECATED", 16, IOC_WRITE),
        KFD_SET_SCRATCH_BACKING_VA,
        KFD_GET_TILE_CONFIG,
        KFD_SET_TRAP_HANDLER,
        KFD_GET_PROCESS_APERTURES_NEW,
        KFD_ACQUIRE_VM,
        KFD_ALLOC_MEMORY_OF_GPU,
        KFD_FREE_MEMORY_OF_GPU,
        KFD_MAP_MEMORY_TO_GPU,
        KFD_UNMAP_MEMORY_FROM_GPU,
        KFD_SET_CU_MASK,
        KFD_GET_QUEUE_WAVE_STATE,
        KFD_GET_DMABUF_INFO,
        KFD_IMPORT_DMABUF,
        KFD_ALLOC_QUEUE_GWS,
        _kfd(0x1F, "SMI_EVENTS", 8),
        KFD_SVM,
        KFD_SET_XNACK_MODE,
        _kfd(0x22, "CRIU_OP", 56),
        KFD_AVAILABLE_MEMORY,
        KFD_EXPORT_DMABUF,
        KFD_RUNTIME_ENABLE,
        _kfd(0x26, "DBG_TRAP", 32),
    ]
}
assert set(KFD_IOCTLS) == set(range(KFD_COMMAND_START, KFD_COMMAND_END))


def kfd_lookup(nr: int) -> IoctlSpec | None:
    """kfd_ioctl's entry for `nr` (None: outside the command range, ENOTTY)."""
    return KFD_IOCTLS.get(nr) if KFD_COMMAND_START <= nr < KFD_COMMAND_END else None


_BY_NAME = {s.name: s for s in (*all_entries(), *KFD_IOCTLS.values())}


def by_name(name: str) -> IoctlSpec | None:
    """The entry a trace record names (its `ioctl`: GEM_CLOSE, AMDKFD_GET_VERSION)."""
    return _BY_NAME.get(name)
