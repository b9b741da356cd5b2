"""A client's uAPI header against the ABI the emulator speaks (`ualinkd abi-check`).

The emulator's side is what it decodes: every layout of `structs.py` (plus the unions and
nested structs built from them) and every ioctl number of `ioctls.py` that has a handler.
The client's side is what the system C compiler makes of the header: a generated C program
prints `sizeof`/`offsetof` of each struct and field and the value of each `DRM_IOCTL_*`
macro, so the compiler, not a parser of ours, decides every offset.

A struct or field the header does not declare is "not declared", not a mismatch (libdrm's
amdgpu_drm.h has no UALink ioctl). A struct that is an older, shorter version of the
emulator's (every declared field in place, only trailing fields missing: libdrm 2.4.114's
drm_amdgpu_info_device, its 40-byte drm_amdgpu_gem_va) is reported as an older prefix and
passes: drm_ioctl() zero-extends a shorter argument and copies out only the caller's size
(spec §2.1), and INFO answers are cut to the caller's return_size. Its ioctl number, which
carries the shorter size, passes for the same reason.

This module runs the C compiler (subprocess), so it sits beside the sans-IO `abi/` layer it
reads, not in it; tests/abi uses it against include/ualink/ualink_drm.h.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import struct
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import construct as cs

from .abi import ioctls as tbl
from .abi import structs as st
from .abi.ioc import DRM_IOCTL_BASE, IoctlCmd


@dataclass(frozen=True, slots=True)
class Field:
    path: str  # C member designator: `in`, `data.flags`, `import_ualink_handle`
    offset: int
    size: int
    signed: bool | None = None  # a scalar integer's signedness (None: not compared)


@dataclass(frozen=True, slots=True)
class Aggregate:
    ctype: str  # `struct drm_amdgpu_gem_va`, `union drm_amdgpu_ualink_handle`
    size: int
    fields: tuple[Field, ...]

    @property
    def name(self) -> str:
        return self.ctype.split()[1]


# Python field name -> C member name where the uAPI spells it differently.
C_NAMES: dict[str, dict[str, str]] = {
    **tbl.HEADER_NAMES,  # (the trace prints the same names)
    # drm_amdgpu_info's 16-byte anonymous union: query_fw is the view that spans all of it
    "drm_amdgpu_info": {"args": "query_fw"},
}


_SIGNED = {cs.Int8un: False, cs.Int16un: False, cs.Int32un: False, cs.Int64un: False,
           cs.Int32sn: True, cs.Int64sn: True}


# Members the handlers read through views a Layout does not name: AMDGPU_INFO's request union
# is `args`, four u32 from offset 16, read per query (amdgpu/info.py).
_VIEWS: dict[str, tuple[Field, ...]] = {
    "drm_amdgpu_info": (
        Field("query_hw_ip.type", 16, 4, False), Field("query_hw_ip.ip_instance", 20, 4, False),
        Field("query_fw.fw_type", 16, 4, False), Field("query_fw.ip_instance", 20, 4, False),
        Field("query_fw.index", 24, 4, False),
        Field("read_mmr_reg.dword_offset", 16, 4, False),
        Field("read_mmr_reg.count", 20, 4, False), Field("read_mmr_reg.instance", 24, 4, False),
        Field("sensor_info.type", 16, 4, False),
    ),
}


def _layout(lay: st.Layout[Any] | st.ArrayLayout[Any]) -> Aggregate:
    names = C_NAMES.get(lay.name, {})
    out = []
    if isinstance(lay, st.Layout):
        fmt = lay.fast.format[1:]
        for i, sub in enumerate(lay.schema.subcons):
            off = struct.calcsize("<" + fmt[:i])
            out.append(Field(names.get(sub.name, sub.name), off, struct.calcsize(fmt[i]),
                             fmt[i].islower()))
    else:
        for sub in lay.schema.subcons:
            if sub.name is None:  # padding
                continue
            inner = sub.subcon if isinstance(sub, cs.Renamed) else sub
            scalar = _SIGNED.get(inner)
            out.append(Field(names.get(sub.name, sub.name), lay.offsets[sub.name],
                             sub.sizeof(), scalar))
    return Aggregate(f"struct {lay.name}", lay.size, (*out, *_VIEWS.get(lay.name, ())))


def _unions() -> list[Aggregate]:
    """The unions and nested structs the handlers read by hand (not a flat Layout)."""
    meta = st.GEM_METADATA_SCHEMA.subcons[2].subcon  # the inner `data` struct
    meta_fields = [Field("handle", 0, 4, False), Field("op", 4, 4, False),
                   Field("data", 8, meta.sizeof())]
    off = 8
    for sub in meta.subcons:
        if sub.name is not None:
            inner = sub.subcon if isinstance(sub, cs.Renamed) else sub
            meta_fields.append(Field(f"data.{sub.name}", off, sub.sizeof(),
                                     _SIGNED.get(inner)))
        off += sub.sizeof()
    heap = st.HEAP_INFO.size
    return [
        Aggregate("union drm_amdgpu_gem_create", st.GEM_CREATE_SIZE, (
            Field("in", 0, st.GEM_CREATE_IN.size), Field("out", 0, st.GEM_CREATE_OUT.size))),
        Aggregate("union drm_amdgpu_gem_mmap", st.GEM_MMAP_SIZE, (
            Field("in", 0, st.GEM_MMAP_IN.size), Field("out", 0, st.GEM_MMAP_OUT.size))),
        # out.alloc.ctx_id and out.state {flags, hangs, reset_status} (amdgpu/info.py)
        Aggregate("union drm_amdgpu_ctx_out", st.CTX_SIZE, (
            Field("alloc", 0, st.CTX_OUT_ALLOC.size), Field("alloc.ctx_id", 0, 4, False),
            Field("state", 0, st.CTX_OUT_STATE.size), Field("state.flags", 0, 8, False),
            Field("state.hangs", 8, 4, False), Field("state.reset_status", 12, 4, False))),
        Aggregate("union drm_amdgpu_ctx", st.CTX_SIZE, (
            Field("in", 0, st.CTX_IN.size), Field("out", 0, st.CTX_OUT_STATE.size))),
        Aggregate("struct drm_amdgpu_vm_out", st.VM_SIZE, (Field("flags", 0, 8, False),)),
        # BO_LIST's out {list_handle, _pad} (amdgpu/cs.py)
        Aggregate("struct drm_amdgpu_bo_list_out", st.BO_LIST_OUT.size, (
            Field("list_handle", 0, 4, False), Field("_pad", 4, 4, False))),
        Aggregate("union drm_amdgpu_bo_list", st.BO_LIST_SIZE, (
            Field("in", 0, st.BO_LIST_IN.size), Field("out", 0, st.BO_LIST_OUT.size))),
        # CS, WAIT_CS, WAIT_FENCES (amdgpu/cs.py): the out halves of their unions
        Aggregate("struct drm_amdgpu_cs_out", st.CS_OUT.size, (Field("handle", 0, 8, False),)),
        Aggregate("union drm_amdgpu_cs", st.CS_SIZE, (
            Field("in", 0, st.CS_IN.size), Field("out", 0, st.CS_OUT.size))),
        Aggregate("struct drm_amdgpu_wait_cs_out", 8, (Field("status", 0, 8, False),)),
        Aggregate("union drm_amdgpu_wait_cs", st.WAIT_CS_SIZE, (
            Field("in", 0, st.WAIT_CS_IN.size), Field("out", 0, 8))),
        Aggregate("struct drm_amdgpu_wait_fences_out", st.WAIT_FENCES_OUT.size, (
            Field("status", 0, 4, False), Field("first_signaled", 4, 4, False))),
        Aggregate("union drm_amdgpu_wait_fences", st.WAIT_FENCES_SIZE, (
            Field("in", 0, st.WAIT_FENCES_IN.size), Field("out", 0, st.WAIT_FENCES_OUT.size))),
        Aggregate("union drm_amdgpu_fence_to_handle", st.FENCE_TO_HANDLE_SIZE, (
            Field("in", 0, st.FENCE_TO_HANDLE_SIZE), Field("in.fence", 0, st.AMDGPU_FENCE.size),
            Field("in.what", 24, 4, False), Field("in.pad", 28, 4, False), Field("out", 0, 4),
            Field("out.handle", 0, 4, False))),
        Aggregate("union drm_amdgpu_vm", st.VM_SIZE, (
            Field("in", 0, st.VM_IN.size), Field("out", 0, st.VM_SIZE))),
        Aggregate("struct drm_amdgpu_gem_metadata", st.GEM_METADATA_SIZE, tuple(meta_fields)),
        Aggregate("struct drm_amdgpu_memory_info", st.MEMORY_INFO_SIZE, (
            Field("vram", 0, heap), Field("cpu_accessible_vram", heap, heap),
            Field("gtt", 2 * heap, heap))),
        # spec §1.3: in {op @0, flags @4, union {gem_handle; import_ualink_handle[2]} @8};
        # out {export_ualink_handle[2] | import_dmabuf_handle} @0
        Aggregate("struct drm_amdgpu_ualink_handle_in", st.UALINK_HANDLE_SIZE, (
            Field("op", 0, 4, False), Field("flags", 4, 4, False),
            Field("gem_handle", 8, 4, False),
            Field("import_ualink_handle", 8, 16))),
        Aggregate("union drm_amdgpu_ualink_handle_out", st.UALINK_HANDLE_OUT_EXPORT.size, (
            Field("export_ualink_handle", 0, st.UALINK_HANDLE_OUT_EXPORT.size),
            Field("import_dmabuf_handle", 0, st.UALINK_HANDLE_OUT_IMPORT.size, False))),
        Aggregate("union drm_amdgpu_ualink_handle", st.UALINK_HANDLE_SIZE, (
            Field("in", 0, st.UALINK_HANDLE_SIZE),
            Field("out", 0, st.UALINK_HANDLE_OUT_EXPORT.size))),
    ]


def emulator_aggregates() -> list[Aggregate]:
    """Every struct and union the emulator decodes, with its layout as the emulator has it."""
    # The DRM and amdgpu uAPI: the KFD's structs ('K' ioctls, include/ualink/ualink_kfd.h)
    # are another header's, checked by tests/abi/test_kfd_abi.py against <linux/kfd_ioctl.h>.
    lays = [v for v in vars(st).values() if isinstance(v, st.Layout | st.ArrayLayout)
            and not v.name.startswith("kfd_")]
    return [*(_layout(lay) for lay in lays), *_unions()]


def emulator_ioctls() -> dict[str, tbl.IoctlSpec]:
    """Header macro name -> entry, for every ioctl the emulator answers (has a handler)."""
    import ualinkd.node  # noqa: F401  (every handler module registers its entries)

    return {f"DRM_IOCTL_{s.name}": s for s in tbl.all_entries() if s.emulated}


# The argument struct of each emulated ioctl (for "older prefix" ioctl sizes).
_IOCTL_ARGS = {
    "GEM_CLOSE": "drm_gem_close", "GET_CAP": "drm_get_cap",
    "PRIME_HANDLE_TO_FD": "drm_prime_handle", "PRIME_FD_TO_HANDLE": "drm_prime_handle",
    "VERSION": "drm_version", "SYNCOBJ_CREATE": "drm_syncobj_create",
    "SYNCOBJ_DESTROY": "drm_syncobj_destroy", "SYNCOBJ_WAIT": "drm_syncobj_wait",
    "SYNCOBJ_TIMELINE_WAIT": "drm_syncobj_timeline_wait", "SYNCOBJ_RESET": "drm_syncobj_array",
    "SYNCOBJ_SIGNAL": "drm_syncobj_array", "SYNCOBJ_QUERY": "drm_syncobj_timeline_array",
    "SYNCOBJ_TIMELINE_SIGNAL": "drm_syncobj_timeline_array",
    "SYNCOBJ_HANDLE_TO_FD": "drm_syncobj_handle", "SYNCOBJ_FD_TO_HANDLE": "drm_syncobj_handle",
    "SYNCOBJ_TRANSFER": "drm_syncobj_transfer", "SYNCOBJ_EVENTFD": "drm_syncobj_eventfd",
    "AMDGPU_GEM_CREATE": "drm_amdgpu_gem_create", "AMDGPU_GEM_MMAP": "drm_amdgpu_gem_mmap",
    "AMDGPU_CTX": "drm_amdgpu_ctx", "AMDGPU_INFO": "drm_amdgpu_info",
    "AMDGPU_GEM_METADATA": "drm_amdgpu_gem_metadata", "AMDGPU_GEM_VA": "drm_amdgpu_gem_va",
    "AMDGPU_GEM_WAIT_IDLE": "drm_amdgpu_gem_wait_idle",
    "AMDGPU_GEM_OP": "drm_amdgpu_gem_op", "AMDGPU_GEM_USERPTR": "drm_amdgpu_gem_userptr",
    "AMDGPU_VM": "drm_amdgpu_vm", "AMDGPU_UALINK_HANDLE": "drm_amdgpu_ualink_handle",
    "AMDGPU_BO_LIST": "drm_amdgpu_bo_list", "AMDGPU_CS": "drm_amdgpu_cs",
    "AMDGPU_WAIT_CS": "drm_amdgpu_wait_cs", "AMDGPU_WAIT_FENCES": "drm_amdgpu_wait_fences",
    "AMDGPU_FENCE_TO_HANDLE": "drm_amdgpu_fence_to_handle",
}


# -- the client's side: what the C compiler makes of the header --------------------------------


class CompileError(Exception):
    """The header does not compile (or the probe program does not run)."""


_TIMEOUT = 120  # seconds for one compiler run (a wedged compiler fails instead of hanging)


def _run(argv: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False,
                              timeout=_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise CompileError(f"{argv[0]} did not finish in {_TIMEOUT} s") from None
    except OSError as e:
        raise CompileError(f"cannot run {argv[0]}: {e}") from None


@dataclass(slots=True)
class HeaderAbi:
    """What the compiler made of the header: sizes, (offset, size) per field, macro values.
    Absent keys were not declared."""

    sizes: dict[str, int] = field(default_factory=dict)  # ctype -> sizeof
    fields: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)
    signed: dict[tuple[str, str], bool] = field(default_factory=dict)  # scalar fields
    ioctls: dict[str, int] = field(default_factory=dict)  # every DRM_IOCTL_* macro's value
    invalid: set[str] = field(default_factory=set)  # macros defined but not evaluable


def compiler() -> list[str]:
    """$CC (it may carry words: `ccache gcc`), else cc, else gcc."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise CompileError("no C compiler (cc) on PATH; install gcc")
    return shlex.split(cc)


def _includes(headers: Sequence[str]) -> str:
    """A file that exists by its absolute path; any other name as <name>, found through the
    -I directories (`ualinkd abi-check amdgpu_drm.h -I /usr/include/libdrm`)."""
    return "".join(f'#include "{os.path.abspath(h)}"\n' if os.path.isfile(h)
                   else f"#include <{h}>\n" for h in headers)


def _ioctl_macros(cc: list[str], headers: Sequence[str], cflags: Sequence[str]) -> list[str]:
    """Every object-like DRM_IOCTL_* macro the headers define (cc -E -dM)."""
    r = _run([*cc, *cflags, "-E", "-dM", "-x", "c", "-"], _includes(headers))
    if r.returncode != 0:
        raise CompileError(f"the header does not compile:\n{r.stderr.strip()}")
    names = re.findall(r"^#define (DRM_IOCTL_\w+) ", r.stdout, re.M)
    return sorted(n for n in names if n not in ("DRM_IOCTL_BASE",))


def probe(headers: Sequence[str], cflags: Sequence[str] = (),
          aggregates: Sequence[Aggregate] | None = None) -> HeaderAbi:
    """Compile and run a program printing the layout of every emulator aggregate and the
    value of every DRM_IOCTL_* macro as `headers` declare them. A line the compiler refuses
    (an undeclared struct or member) is dropped and the program compiled again."""
    cc = compiler()
    aggregates = emulator_aggregates() if aggregates is None else aggregates
    macros = _ioctl_macros(cc, headers, cflags)
    items: list[tuple[str, str]] = []  # (C statement, what it probes)
    for agg in aggregates:
        t = agg.ctype
        items.append((f'printf("S|{t}|%zu\\n", sizeof({t}));', f"S|{t}"))
        for f in agg.fields:
            items.append((f'printf("F|{t}|{f.path}|%zu|%zu\\n", __builtin_offsetof({t}, '
                          f"{f.path}), sizeof((({t} *)0)->{f.path}));", f"F|{t}|{f.path}"))
            if f.signed is not None:  # its own line: a non-scalar member drops only it
                items.append((f'printf("G|{t}|{f.path}|%d\\n", (int)((__typeof__((({t} *)0)'
                              f"->{f.path}))-1 < 0));", f"G|{t}|{f.path}"))
    for m in macros:
        items.append((f'printf("I|{m}|%llu\\n", (unsigned long long)({m}));', f"I|{m}"))
    dropped: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="ualinkd-abi-check-") as tmp:
        src, exe = Path(tmp) / "probe.c", Path(tmp) / "probe"
        while True:  # each failed pass drops at least one item (clang stops at 20 errors)
            live = [it for it in items if it[1] not in dropped]
            head = "#include <stdio.h>\n#include <stddef.h>\n" + _includes(headers)
            first = head.count("\n") + 2  # line of the first item
            body = "\n".join(stmt for stmt, _ in live)
            src.write_text(f"{head}int main(void) {{\n{body}\nreturn 0;\n}}\n")
            r = _run([*cc, *cflags, "-w", "-o", str(exe), str(src)])
            if r.returncode == 0:
                break
            bad = {int(n) for n in re.findall(rf"{re.escape(str(src))}:(\d+):", r.stderr)}
            hit = {live[n - first][1] for n in bad if 0 <= n - first < len(live)}
            if not hit:
                raise CompileError(f"the probe does not compile:\n{r.stderr.strip()}")
            dropped |= hit
        run = _run([str(exe)])
        if run.returncode != 0:
            raise CompileError(f"the probe failed: {run.stderr.strip()}")
    abi = HeaderAbi(invalid={k[2:] for k in dropped if k.startswith("I|")})
    for line in run.stdout.splitlines():
        kind, *rest = line.split("|")
        if kind == "S":
            abi.sizes[rest[0]] = int(rest[1])
        elif kind == "F":
            abi.fields[(rest[0], rest[1])] = (int(rest[2]), int(rest[3]))
        elif kind == "G":
            abi.signed[(rest[0], rest[1])] = rest[2] == "1"
        elif kind == "I":
            abi.ioctls[rest[0]] = int(rest[1])
    return abi


# -- the comparison ---------------------------------------------------------------------------


@dataclass(slots=True)
class Report:
    mismatches: list[str] = field(default_factory=list)  # each one a failure
    notes: list[str] = field(default_factory=list)  # not declared, older prefixes
    unanswered: list[str] = field(default_factory=list)  # header ioctls ualinkd answers ENOTTY
    checked_structs: int = 0
    checked_ioctls: int = 0

    @property
    def ok(self) -> bool:
        return not self.mismatches

    def lines(self) -> list[str]:
        out = [*self.mismatches, *self.notes]
        if self.unanswered:
            out.append("not answered by the emulator (the header has them; ualinkd answers "
                       "ENOTTY/EINVAL or the kernel's permission error): "
                       + ", ".join(self.unanswered))
        verdict = (f"{len(self.mismatches)} mismatch{'es' * (len(self.mismatches) != 1)}"
                   if self.mismatches else "ok")
        out.append(f"{verdict}: {self.checked_structs} structs and {self.checked_ioctls} "
                   "ioctl numbers compared")
        return out


def compare(abi: HeaderAbi, aggregates: Sequence[Aggregate] | None = None,
            ioctls: dict[str, tbl.IoctlSpec] | None = None) -> Report:
    aggregates = emulator_aggregates() if aggregates is None else aggregates
    ioctls = emulator_ioctls() if ioctls is None else ioctls
    rep = Report()
    prefix: dict[str, int] = {}  # struct name -> the header's (older, shorter) size
    for agg in aggregates:
        t = agg.ctype
        if t not in abi.sizes:
            rep.notes.append(f"`{agg.name}` not declared")
            continue
        rep.checked_structs += 1
        missing = [f for f in agg.fields if (t, f.path) not in abi.fields]
        bad = False
        for f in agg.fields:
            got = abi.fields.get((t, f.path))
            if got is None:
                continue
            off, size = got
            if off != f.offset:
                rep.mismatches.append(f"`{agg.name}.{f.path}` at offset {off}, emulator "
                                      f"expects {f.offset}")
                bad = True
            if size != f.size:
                rep.mismatches.append(f"`{agg.name}.{f.path}` is {size} bytes, emulator "
                                      f"expects {f.size}")
                bad = True
            signed = abi.signed.get((t, f.path))
            if f.signed is not None and signed is not None and signed != f.signed:
                rep.mismatches.append(
                    f"`{agg.name}.{f.path}` is {'signed' if signed else 'unsigned'}, "
                    f"emulator expects {'signed' if f.signed else 'unsigned'}")
                bad = True
        hsize = abi.sizes[t]
        declared = [f for f in agg.fields if f not in missing]
        end = max((f.offset + f.size for f in declared), default=0)
        inside = [f for f in missing if f.offset < hsize]  # a reserved name there
        beyond = [f.path for f in missing if f.offset >= hsize]
        wrong_size = hsize > agg.size or (hsize < agg.size and (not beyond or end > hsize))
        if wrong_size or bad:
            # the layout disagrees: a member the header lacks is then likely why, so name it
            # (past an older prefix's end only when the size is wrong too)
            for f in missing if wrong_size else inside:
                rep.mismatches.append(f"`{agg.name}.{f.path}` is not in this header, emulator "
                                      f"has it at offset {f.offset} ({f.size} bytes)")
            if wrong_size:
                rep.mismatches.append(f"`{agg.name}` is {hsize} bytes, emulator expects "
                                      f"{agg.size}")
            continue
        if inside:
            rep.notes.append(f"`{agg.name}`: {', '.join(f.path for f in inside)} not named "
                             "in this header "
                             "(its offset is padding or a reserved field there; layout agrees)")
        if hsize < agg.size:
            prefix[agg.name] = hsize
            rep.notes.append(
                f"`{agg.name}` is an older prefix: {hsize} bytes (through "
                f"`{declared[-1].path}`), emulator {agg.size}; {', '.join(beyond)} not "
                "declared (accepted: the DRM core zero-extends a shorter argument and copies "
                "out only the caller's size)")
    for macro, spec in ioctls.items():
        if macro in abi.invalid:
            rep.mismatches.append(f"`{macro}` is defined but does not compile")
            continue
        value = abi.ioctls.get(macro)
        if value is None:
            rep.notes.append(f"`{macro}` not declared")
            continue
        rep.checked_ioctls += 1
        if value == spec.cmd:
            continue
        h, e = IoctlCmd.decode(value), IoctlCmd.decode(spec.cmd)
        older = prefix.get(_IOCTL_ARGS.get(spec.name, ""))
        if (h.direction, h.type, h.nr) == (e.direction, e.type, e.nr) and h.size == older:
            rep.notes.append(f"`{macro}` is {value:#010x}: the older {h.size}-byte argument "
                             f"(emulator {spec.cmd:#010x}; accepted)")
            continue
        rep.mismatches.append(f"`{macro}` is {value:#010x} (dir {h.direction}, nr {h.nr:#04x}, "
                              f"size {h.size}), emulator expects {spec.cmd:#010x} (dir "
                              f"{e.direction}, nr {e.nr:#04x}, size {e.size})")
    if not rep.checked_structs and not rep.checked_ioctls:
        rep.mismatches.append("the header declares none of the emulator's structs or ioctls "
                              "(the wrong file, or a missing -I/-D?)")
    answered = {s.nr for s in ioctls.values()}
    for macro, value in sorted(abi.ioctls.items()):
        cmd = IoctlCmd.decode(value)
        if cmd.type == DRM_IOCTL_BASE and macro not in ioctls and cmd.nr not in answered:
            rep.unanswered.append(macro[len("DRM_IOCTL_"):])
    return rep


def check(headers: Sequence[str], cflags: Sequence[str] = ()) -> Report:
    """`ualinkd abi-check`: probe the headers and compare them with the emulator's ABI."""
    return compare(probe(headers, cflags))
