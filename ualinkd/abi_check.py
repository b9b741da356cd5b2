"""A client's uAPI header against the ABI the emulator speaks (`ualinkd abi-check`).

The emulator's side is what it decodes: every layout of `structs.py` (plus the unions and
nested structs built from them) and every ioctl number of `ioctls.py` that has a handler, for
each of its two uAPIs (`Family`): the DRM's and amdgpu's (render nodes, amdgpu_drm.h and
drm.h) and the KFD's (kfd_ioctl.h). The client's side is what the system C compiler makes of
the header: a generated C file holds `sizeof`/`offsetof` of each struct and field and the
value of each `DRM_IOCTL_*` / `AMDKFD_IOC_*` macro as the initializers of one array, so the
compiler, not a parser of ours, decides every offset. The file is compiled, never run (the
values are read from the object file's section, as autoconf's AC_COMPUTE_INT does when
cross-compiling): a third-party header's constructor, or anything else it would do at run
time, never runs, whoever checks it.

A struct or field the header does not declare is "not declared", not a mismatch (libdrm's
amdgpu_drm.h has no UALink ioctl). A struct that is an older, shorter version of the
emulator's (every declared field in place, only trailing fields missing: libdrm 2.4.114's
drm_amdgpu_info_device, its 40-byte drm_amdgpu_gem_va, Linux 6.1's 88-byte
kfd_ioctl_create_queue_args) is reported as an older prefix and passes: drm_ioctl() and
kfd_ioctl() zero-extend a shorter argument and copy out only the caller's size (spec §2.1),
and INFO answers are cut to the caller's return_size. Its ioctl number, which carries the
shorter size, passes for the same reason.

This module runs the C compiler (subprocess), so it sits beside the sans-IO `abi/` layer it
reads, not in it; tests/abi uses it against include/ualink/ualink_drm.h and ualink_kfd.h.
"""

from __future__ import annotations

import os
import re
import resource
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


def kfd_aggregates() -> list[Aggregate]:
    """Every struct of the KFD's uAPI the emulated KFD decodes (kfd_ioctl.h's names)."""
    lays = [v for v in vars(st).values() if isinstance(v, st.Layout | st.ArrayLayout)
            and v.name.startswith("kfd_")]
    out = [_layout(lay) for lay in lays]
    # One Layout serves the structs kfd_ioctl.h declares twice over (same members).
    for lay, twins in ((st.KFD_EVENT_ID, ("kfd_ioctl_destroy_event_args",
                                          "kfd_ioctl_reset_event_args")),
                       (st.KFD_MAP_MEMORY_TO_GPU, ("kfd_ioctl_unmap_memory_from_gpu_args",))):
        agg = _layout(lay)
        out += [Aggregate(f"struct {name}", agg.size, agg.fields) for name in twins]
    # WAIT_EVENTS reads struct kfd_event_data[num_events] by hand: each entry's event_id.
    out.append(Aggregate("struct kfd_event_data", st.KFD_EVENT_DATA_SIZE, (
        Field("event_id", st.KFD_EVENT_DATA_EVENT_ID, 4, False),)))
    return out


def kfd_ioctls() -> dict[str, tbl.IoctlSpec]:
    """Header macro name -> entry, for every KFD ioctl the emulator answers."""
    import ualinkd.node  # noqa: F401  (every handler module registers its entries)

    return {f"AMDKFD_IOC_{s.name.removeprefix('AMDKFD_')}": s
            for s in tbl.KFD_IOCTLS.values() if s.emulated}


@dataclass(frozen=True, slots=True)
class Family:
    """One uAPI the emulator speaks, checked as a whole against a header."""

    aggregates: Sequence[Aggregate]
    ioctls: dict[str, tbl.IoctlSpec]  # header macro -> entry
    prefix: str  # of its ioctl macros: DRM_IOCTL_, AMDKFD_IOC_
    ioctl_type: int  # _IOC_TYPE of its numbers
    args: dict[str, str]  # entry name -> its argument struct (for "older prefix" numbers)
    dispatcher: str  # who zero-extends a shorter argument

    def declared_by(self, abi: HeaderAbi) -> bool:
        return (any(a.ctype in abi.sizes for a in self.aggregates)
                or any(m in abi.ioctls or m in abi.invalid for m in self.ioctls))


def drm_family(aggregates: Sequence[Aggregate] | None = None,
               ioctls: dict[str, tbl.IoctlSpec] | None = None) -> Family:
    return Family(emulator_aggregates() if aggregates is None else aggregates,
                  emulator_ioctls() if ioctls is None else ioctls, "DRM_IOCTL_",
                  DRM_IOCTL_BASE, _IOCTL_ARGS, "the DRM core")


def kfd_family() -> Family:
    ioctls = kfd_ioctls()
    args = {s.name: f"kfd_ioctl_{s.name.removeprefix('AMDKFD_').lower()}_args"
            for s in ioctls.values()}
    args["AMDKFD_AVAILABLE_MEMORY"] = "kfd_ioctl_get_available_memory_args"
    return Family(kfd_aggregates(), ioctls, "AMDKFD_IOC_", tbl.KFD_IOCTL_TYPE, args,
                  "kfd_ioctl")


# -- the client's side: what the C compiler makes of the header --------------------------------


class CompileError(Exception):
    """The header does not compile (or the compiler's object file cannot be read)."""


_TIMEOUT = 120  # seconds for one compiler run (a wedged compiler fails instead of hanging)
# What one compiler run may take: a header is a third party's, and `#include "/dev/zero"`
# makes cc1 read for ever (3 GiB of memory in 5 s); a real header's probe takes ~100 MiB.
_MAX_MEMORY = 2 << 30  # RLIMIT_AS of the compiler and its children
_MAX_OUTPUT = 256 << 20  # RLIMIT_FSIZE: the object file (-E's output goes to a pipe)


def _limited() -> None:
    """In the compiler's process, before exec (inherited by cc1 and as)."""
    resource.setrlimit(resource.RLIMIT_AS, (_MAX_MEMORY, _MAX_MEMORY))
    resource.setrlimit(resource.RLIMIT_FSIZE, (_MAX_OUTPUT, _MAX_OUTPUT))
    resource.setrlimit(resource.RLIMIT_CPU, (_TIMEOUT, _TIMEOUT))


def _run(argv: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """The compiler, bounded in time and memory, reading only `stdin` (a header including
    /dev/stdin reads nothing of ours)."""
    try:
        return subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False,
                              timeout=_TIMEOUT, preexec_fn=_limited,
                              stdin=subprocess.DEVNULL if stdin is None else None)
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
    ioctls: dict[str, int] = field(default_factory=dict)  # every ioctl macro's value
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


# kfd_ioctl.h includes <drm/drm.h>, which Debian ships only as libdrm-dev's libdrm/drm.h: a
# directory searched last (-idirafter, after the system's) whose drm/ is that one.
LIBDRM_INCLUDE = Path("/usr/include/libdrm")


def _last_resort_includes(tmp: Path) -> list[str]:
    if not (LIBDRM_INCLUDE / "drm.h").is_file():
        return []
    (tmp / "last").mkdir()
    (tmp / "last" / "drm").symlink_to(LIBDRM_INCLUDE)
    return ["-idirafter", str(tmp / "last")]


_MACROS = re.compile(r"^#define ((?:DRM_IOCTL|AMDKFD_IOC)_\w+) ", re.M)


def _ioctl_macros(cc: list[str], headers: Sequence[str], cflags: Sequence[str]) -> list[str]:
    """Every object-like DRM_IOCTL_* and AMDKFD_IOC_* macro the headers define (cc -E -dM)."""
    r = _run([*cc, *cflags, "-E", "-dM", "-x", "c", "-"], _includes(headers))
    if r.returncode != 0:
        raise CompileError(f"the header does not compile:\n{r.stderr.strip()}")
    return sorted(n for n in _MACROS.findall(r.stdout) if n not in ("DRM_IOCTL_BASE",))


# The probe's values: one array of unsigned long long in a section of its own, its first
# element a marker (it also tells the object's byte order is read right).
_SECTION = "ualink_abi_probe"
_MARK = 0x75616C696E6B4142


def _elf_section(obj: bytes, name: str) -> tuple[bytes, str]:
    """The contents of section `name` of the ELF relocatable `obj`, and its byte order
    ("<" or ">") — from the ELF header and section headers alone (elf(5))."""
    if obj[:4] != b"\x7fELF" or obj[4] not in (1, 2) or obj[5] not in (1, 2):
        raise CompileError("the compiler did not write an ELF object file")
    bits64, order = obj[4] == 2, "<" if obj[5] == 1 else ">"
    try:
        if bits64:
            shoff, = struct.unpack_from(order + "Q", obj, 0x28)
            shentsize, shnum, shstrndx = struct.unpack_from(order + "HHH", obj, 0x3A)
            sh = order + "IIQQQQ"  # name, type, flags, addr, offset, size
        else:
            shoff, = struct.unpack_from(order + "I", obj, 0x20)
            shentsize, shnum, shstrndx = struct.unpack_from(order + "HHH", obj, 0x2E)
            sh = order + "IIIIII"
        headers = [struct.unpack_from(sh, obj, shoff + i * shentsize) for i in range(shnum)]
        strtab = headers[shstrndx]
        names = obj[strtab[4]:strtab[4] + strtab[5]]
        for h in headers:
            if names[h[0]:names.index(b"\0", h[0])] == name.encode():
                return obj[h[4]:h[4] + h[5]], order
    except (struct.error, IndexError, ValueError):
        raise CompileError("the compiler's object file is malformed") from None
    raise CompileError(f"the compiler's object file has no {name} section")


def probe(headers: Sequence[str], cflags: Sequence[str] = (),
          aggregates: Sequence[Aggregate] | None = None) -> HeaderAbi:
    """Compile (never run) a C file holding the layout of every emulator aggregate (both
    uAPIs' by default) and the value of every DRM_IOCTL_* and AMDKFD_IOC_* macro as
    `headers` declare them, and read the values back from the object file. A line the
    compiler refuses (an undeclared struct or member) is dropped and the file compiled
    again."""
    cc = compiler()
    if aggregates is None:
        aggregates = [*emulator_aggregates(), *kfd_aggregates()]
    # (initializer line, what it probes, how many values it holds)
    items: list[tuple[str, str, int]] = []
    for agg in aggregates:
        t = agg.ctype
        items.append((f"sizeof({t}),", f"S|{t}", 1))
        for f in agg.fields:
            items.append((f"__builtin_offsetof({t}, {f.path}), sizeof((({t} *)0)->{f.path}),",
                          f"F|{t}|{f.path}", 2))
            if f.signed is not None:  # its own line: a non-scalar member drops only it
                items.append((f"(__typeof__((({t} *)0)->{f.path}))-1 < 0,", f"G|{t}|{f.path}",
                              1))
    with tempfile.TemporaryDirectory(prefix="ualinkd-abi-check-") as tmp:
        flags = [*cflags, *_last_resort_includes(Path(tmp))]
        macros = _ioctl_macros(cc, headers, flags)
        for m in macros:
            items.append((f"(unsigned long long)({m}),", f"I|{m}", 1))
        dropped: set[str] = set()
        src, obj = Path(tmp) / "probe.c", Path(tmp) / "probe.o"
        while True:  # each failed pass drops at least one item (clang stops at 20 errors)
            live = [it for it in items if it[1] not in dropped]
            # (stdio.h as the run-time probe had it: a header that leaned on it still builds)
            head = ("#include <stdio.h>\n#include <stddef.h>\n" + _includes(headers)
                    + f'__attribute__((used, section("{_SECTION}")))\n'
                    + "static const unsigned long long ualink_abi_values[] = {\n"
                    + f"{_MARK:#x}ULL,\n")
            first = head.count("\n") + 1  # line of the first item
            body = "\n".join(init for init, _, _ in live)
            src.write_text(f"{head}{body}\n}};\n")
            # -fno-lto: the section's bytes, not the compiler's intermediate form
            r = _run([*cc, *flags, "-w", "-fno-lto", "-c", "-o", str(obj), str(src)])
            if r.returncode == 0:
                break
            bad = {int(n) for n in re.findall(rf"{re.escape(str(src))}:(\d+):", r.stderr)}
            hit = {live[n - first][1] for n in bad if 0 <= n - first < len(live)}
            if not hit:
                raise CompileError(f"the probe does not compile:\n{r.stderr.strip()}")
            dropped |= hit
        data, order = _elf_section(obj.read_bytes(), _SECTION)
    count = 1 + sum(n for _, _, n in live)
    if len(data) != 8 * count or struct.unpack_from(order + "Q", data)[0] != _MARK:
        raise CompileError(f"the compiler's {_SECTION} section is not the probe's values")
    values = iter(struct.unpack(f"{order}{count}Q", data)[1:])
    abi = HeaderAbi(invalid={k[2:] for k in dropped if k.startswith("I|")})
    for _, key, _ in live:
        kind, *rest = key.split("|")
        if kind == "S":
            abi.sizes[rest[0]] = next(values)
        elif kind == "F":
            abi.fields[(rest[0], rest[1])] = (next(values), next(values))
        elif kind == "G":
            abi.signed[(rest[0], rest[1])] = next(values) == 1
        elif kind == "I":
            abi.ioctls[rest[0]] = next(values)
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


def families_of(abi: HeaderAbi) -> list[Family]:
    """The uAPIs a header is checked against: the KFD's when it declares any of the KFD's
    structs or ioctls, the DRM's and amdgpu's when it declares any of amdgpu's, or any of the
    DRM core's without the KFD's (kfd_ioctl.h includes drm.h: that is not what is checked).
    A header declaring none of either is checked against the DRM's (and fails)."""
    drm, kfd = drm_family(), kfd_family()
    amdgpu = Family([a for a in drm.aggregates if a.name.startswith("drm_amdgpu_")],
                    {m: s for m, s in drm.ioctls.items() if m.startswith("DRM_IOCTL_AMDGPU_")},
                    drm.prefix, drm.ioctl_type, drm.args, drm.dispatcher)
    if not kfd.declared_by(abi):
        return [drm]
    return [drm, kfd] if amdgpu.declared_by(abi) else [kfd]


def compare(abi: HeaderAbi, aggregates: Sequence[Aggregate] | None = None,
            ioctls: dict[str, tbl.IoctlSpec] | None = None) -> Report:
    """The header's layouts and numbers against the emulator's: those of `families_of` the
    header, or (tests) of the DRM's with these aggregates and ioctls in place of its own."""
    rep = Report()
    if aggregates is None and ioctls is None:
        families = families_of(abi)
    else:
        families = [drm_family(aggregates, ioctls)]
    for fam in families:
        _compare(abi, fam, rep)
    if not rep.checked_structs and not rep.checked_ioctls:
        rep.mismatches.append("the header declares none of the emulator's structs or ioctls "
                              "(the wrong file, or a missing -I/-D?)")
    return rep


def _compare(abi: HeaderAbi, fam: Family, rep: Report) -> None:
    aggregates, ioctls = fam.aggregates, fam.ioctls
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
                f"declared (accepted: {fam.dispatcher} zero-extends a shorter argument and "
                "copies out only the caller's size)")
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
        older = prefix.get(fam.args.get(spec.name, ""))
        if (h.direction, h.type, h.nr) == (e.direction, e.type, e.nr) and h.size == older:
            rep.notes.append(f"`{macro}` is {value:#010x}: the older {h.size}-byte argument "
                             f"(emulator {spec.cmd:#010x}; accepted)")
            continue
        rep.mismatches.append(f"`{macro}` is {value:#010x} (dir {h.direction}, nr {h.nr:#04x}, "
                              f"size {h.size}), emulator expects {spec.cmd:#010x} (dir "
                              f"{e.direction}, nr {e.nr:#04x}, size {e.size})")
    answered = {s.nr for s in ioctls.values()}
    for macro, value in sorted(abi.ioctls.items()):
        cmd = IoctlCmd.decode(value)
        if (macro.startswith(fam.prefix) and cmd.type == fam.ioctl_type
                and macro not in ioctls and cmd.nr not in answered):
            rep.unanswered.append(macro[len(fam.prefix):])


def check(headers: Sequence[str], cflags: Sequence[str] = ()) -> Report:
    """`ualinkd abi-check`: probe the headers and compare them with the emulator's ABI."""
    return compare(probe(headers, cflags))
