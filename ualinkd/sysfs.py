"""The sys/ tree of a node's mount, described once: paths, modes and the text of every file.

The daemon builds the tree from this (`node.NodeCore.sys_tree`), the FUSE layer serves it
(`fuse/tree.py`: SysAttr, SysLink, SysDir), and everything that reads it — `ualinkctl`,
`ualinkd.netns`, the pod launcher, the test harnesses — finds its files with the path
functions here and turns their lines into typed values with the same `LineFormat` that
printed them, so a format is changed in one place.

Layout (paths relative to the mount), as a kernel with one PCI device per GPU has it
(drivers/base/core.c, drm_sysfs.c, pci-sysfs.c): the real directory of GPU `n` is
`sys/devices/pci0000:<bb>/0000:<bb>:00.0/` (one made-up root bus per GPU, bb = 0x10 + n,
as multi-socket hosts have one root complex per GPU); `sys/bus/pci/devices/<bdf>`,
`sys/class/drm/{card<n>,renderD<128+n>}` and `sys/dev/char/226:<minor>` are relative
symlinks into it. `sys/kernel/debug/` is debugfs: root only (mode 0700, as the kernel mounts
it), with this emulator's debug files under `dri/<render minor>/`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from .amdgpu.info import FW_SDMA
from .amdgpu.profile import DeviceProfile
from .amdkfd.queues import SDMA_QUEUES_PER_ENGINE, sdma_engines
from .amdkfd.topology import Topology, TopologyGpu

# -- the node kinds the FUSE tree serves ---------------------------------------------------------

SYSFS_SIZE = 4096  # what sysfs reports as st_size for every text attribute
DIR_MODE = 0o755
DEBUGFS_DIR_MODE = 0o700  # debugfs is mounted 0700 root:root (kernel ≥ 3.7), its tree too
ATTR_RO = 0o444  # a sysfs show-only attribute (DEVICE_ATTR_RO)
ATTR_RW = 0o600  # the deprecated ualink configuration files (§7.1)
ATTR_WO = 0o200  # the commit files (§7.1)
DEBUG_RO = 0o400  # debugfs files, readable by root only
DEBUG_RW = 0o600


@dataclass(frozen=True, slots=True)
class SysAttr:
    """One attribute file: its content produced on every read (text, or bytes for a binary
    attribute such as PCI `config`), and the store() a write calls (None: read-only)."""

    read: Callable[[], str | bytes]
    write: Callable[[str], None] | None = None
    mode: int = ATTR_RO
    size: int = SYSFS_SIZE  # st_size; a binary attribute reports its own size


@dataclass(frozen=True, slots=True)
class SysLink:
    """A symlink, its target relative to the link's directory (as sysfs writes them), so it
    resolves inside the mount and, bound over /sys in a namespace node, inside /sys."""

    target: str


class SysDir(dict[str, "SysAttr | SysLink | SysDir"]):
    """A directory: name → entry. A plain dict is a directory of mode 0755 too."""

    def __init__(self, entries: Mapping[str, SysAttr | SysLink | SysDir] | None = None,
                 mode: int = DIR_MODE) -> None:
        super().__init__(entries or {})
        self.mode = mode


SysNode = SysAttr | SysLink | SysDir


def dir_mode(d: Mapping[str, object]) -> int:
    return getattr(d, "mode", DIR_MODE)


def resolve(root: Mapping[str, object], path: str) -> object:
    """The entry at `path` (relative to the sys/ root `root`), following symlinks the way
    the kernel does: each relative target is taken from the directory holding the link."""
    parts: list[str] = []  # the resolved directory names so far
    todo = [p for p in path.split("/") if p]
    hops = 0
    node: object = root
    while todo:
        name = todo.pop(0)
        if name == ".":
            continue
        if name == "..":
            parts = parts[:-1]
            node = _walk(root, parts)
            continue
        if not isinstance(node, Mapping) or name not in node:
            raise KeyError("/".join([*parts, name]))
        child = node[name]
        if isinstance(child, SysLink):
            hops += 1
            if hops > 40:  # MAXSYMLINKS
                raise KeyError(f"{path}: too many levels of symbolic links")
            todo = [p for p in child.target.split("/") if p] + todo
            continue
        parts.append(name)
        node = child
    return node


def _walk(root: Mapping[str, object], parts: list[str]) -> object:
    node: object = root
    for p in parts:
        assert isinstance(node, Mapping)
        node = node[p]
    return node


# -- paths ----------------------------------------------------------------------------------------

DRM_MAJOR = 226
RENDER_MINOR_BASE = 128  # drm_minor_alloc: render minors are 128 + the primary's index
DRM_CLASS = "sys/class/drm"
FABRIC_STATUS = "sys/kernel/debug/ualink_fabric"
# `<counter> <n>` lines: the C data plane's (fuse/dataplane.py DataPlane.stats) and `channels`.
DATA_PLANE_STATUS = "sys/kernel/debug/ualink_data_plane"
DEBUGFS_DRI = "sys/kernel/debug/dri"
KFD_TOPOLOGY = "sys/devices/virtual/kfd/kfd/topology"  # kfd_topology.c's sysfs root


def card_index(render_minor: int) -> int:
    """n of card<n> for renderD<render_minor>: each accel its own primary minor."""
    return render_minor - RENDER_MINOR_BASE


def pci_bus(render_minor: int) -> int:
    return 0x10 + card_index(render_minor)


def pci_bdf(render_minor: int) -> str:
    """The made-up PCI address of the GPU behind render node `minor`: one bus per GPU from
    0x10 up (0000:10:00.0 for renderD128), stable across runs so scripts may name it."""
    return f"0000:{pci_bus(render_minor):02x}:00.0"


def pci_root(render_minor: int) -> str:
    """The GPU's root bus directory under sys/devices/ (`pci<domain>:<bus>`)."""
    return f"pci0000:{pci_bus(render_minor):02x}"


def ualink_dir(render_minor: int) -> str:
    """§7.1: the GPU's `ualink/` directory, by the render node's path."""
    return f"{DRM_CLASS}/renderD{render_minor}/device/ualink"


def ualink_file(render_minor: int, name: str) -> str:
    return f"{ualink_dir(render_minor)}/{name}"


def debugfs_file(render_minor: int, name: str) -> str:
    return f"{DEBUGFS_DRI}/{render_minor}/{name}"


# -- text formats ---------------------------------------------------------------------------------


class ParseError(ValueError):
    """A line of a sys file that does not have its format."""


def ids(text: str) -> list[int]:
    """Accel ids separated by spaces or commas (as the kernel's bitmap/list parsers take)."""
    return [int(x) for x in text.replace(",", " ").split()]


def show_value(v: object) -> str:
    """One sysfs value as its attribute prints it, newline included (§7.1: lists are
    space-separated, an empty list is just the newline)."""
    if isinstance(v, list | tuple):
        return " ".join(map(str, v)) + "\n"
    sysfs = getattr(v, "sysfs", None)  # AddrMode, AccelState
    return f"{sysfs if isinstance(sysfs, str) else v}\n"


# §7.1: the 12 read-only attributes, in the order of the kernel's attribute group, and the
# type each one's text parses to (anything else stays a string).
UALINK_ATTRS = ("link_type", "accel_id", "bandwidth", "latency", "ppod_id", "ppod_size",
                "vpod_id", "vpod_size", "vpod_active_accels", "addr_mode", "accel_state",
                "local_accels")
UALINK_TYPES: dict[str, Callable[[str], object]] = {
    "accel_id": int, "bandwidth": int, "latency": int, "ppod_size": int,
    "vpod_id": int, "vpod_size": int, "vpod_active_accels": ids, "local_accels": ids,
}
VPOD_CONFIG = ("vpod_id", "vpod_size", "vpod_active_accels", "addr_mode")


def parse_value(name: str, text: str) -> object:
    """A ualink attribute's (or config file's) text as its typed value."""
    return UALINK_TYPES.get(name, str)(text.strip())


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    parse: Callable[[str], object] = str
    show: Callable[[object], str] = str


def _hex64(v: object) -> str:
    assert isinstance(v, int)
    return f"{v:#018x}"


def _id_list(v: object) -> str:
    assert isinstance(v, Iterable)
    return ",".join(map(str, sorted(v)))


def _guess(text: str) -> object:
    """A field this reader does not know (a newer daemon): an int if it is one."""
    try:
        return int(text, 10)
    except ValueError:
        return text


@dataclass(frozen=True)
class LineFormat:
    """One debugfs table: a line per item, leading positional fields, then key=value."""

    positional: tuple[Field, ...]
    fields: tuple[Field, ...]

    @property
    def keys(self) -> dict[str, Callable[[str], object]]:
        return {f.name: f.parse for f in self.fields}

    def line(self, **values: object) -> str:
        """The line the daemon prints for one item (every field given, in order)."""
        if set(values) != {f.name for f in (*self.positional, *self.fields)}:
            raise TypeError(f"fields {sorted(values)} do not match the format")
        out = [f.show(values[f.name]) for f in self.positional]
        out += [f"{f.name}={f.show(values[f.name])}" for f in self.fields]
        return " ".join(out) + "\n"

    def parse_line(self, line: str) -> dict[str, object]:
        tokens = line.split()
        keys = self.keys
        out: dict[str, object] = {}
        try:
            for f, tok in zip(self.positional, tokens, strict=False):
                out[f.name] = f.parse(tok)
            for tok in tokens[len(self.positional):]:
                key, sep, value = tok.partition("=")
                if not sep:
                    raise ValueError(f"{tok!r} is not key=value")
                out[key] = keys.get(key, _guess)(value)
        except ValueError as e:
            raise ParseError(f"cannot parse {line!r}: {e}") from None
        return out

    def parse(self, text: str) -> list[dict[str, object]]:
        return [self.parse_line(ln) for ln in text.splitlines() if ln.strip()]


_HANDLES = (Field("handle_lo", str, _hex64), Field("handle_hi", str, _hex64))

DEBUGFS: dict[str, LineFormat] = {
    "gem_objects": LineFormat((Field("id", int),), (
        Field("size", int), Field("refcount", int), Field("handle_count", int))),
    "ualink_exports": LineFormat(_HANDLES, (
        Field("bo", int), Field("size", int), Field("pins", int),
        Field("importers", ids, _id_list))),
    "ualink_imports": LineFormat(_HANDLES, (
        Field("exporter", int), Field("state", str), Field("pages", int))),
    "ualink_peers": LineFormat((), (
        Field("accel", int), Field("state", str), Field("generation", int))),
    "ualink_npa": LineFormat((), (Field("used_pages", int), Field("mappings", int))),
    "clients": LineFormat((), (Field("pid", int), Field("uid", int), Field("handles", int))),
    # The KFD's allocations on this GPU, per process (issue 14 item 6): the handle, where it
    # is in the GPU VA space, and the gpu_ids of the VMs it is mapped in.
    "kfd_allocations": LineFormat((), (
        Field("pid", int), Field("handle", lambda t: int(t, 16), _hex64),
        Field("va", lambda t: int(t, 16), _hex64), Field("size", int),
        Field("mapped", ids, _id_list))),
    # The KFD processes on this GPU (issue 14 item 6): each one's pdd, whether ACQUIRE_VM
    # bound a VM (the render file's owner pid, 0: none) and how many mappings that VM holds,
    # its allocations here and its events (the process's, counted on every GPU row).
    "kfd_processes": LineFormat((), (
        Field("pid", int), Field("gpu_id", int), Field("vm_file_pid", int),
        Field("vm_mappings", int), Field("allocations", int), Field("events", int))),
    # The user queues on this GPU (issue 30 item 6): each process's queue id and type, its
    # ring (GPU VA and size), the byte index the engine consumed (rptr) and the last
    # doorbell value (wptr), packets executed, state (active / inactive / error).
    "kfd_queues": LineFormat((), (
        Field("pid", int), Field("gpu_id", int), Field("queue_id", int), Field("type", str),
        Field("ring", lambda t: int(t, 16), _hex64), Field("ring_size", int),
        Field("rptr", int), Field("wptr", int), Field("packets", int), Field("state", str))),
    # Per render file's AMDGPU_CTX context (issue 35): the owner's pid, guilty (1: a job of
    # it hung the engine), the last sequence submitted and signaled, the submissions, IBs
    # and IB packets executed, the last fence's error (0 or -errno: -ETIME for a hang).
    "amdgpu_cs_contexts": LineFormat((), (
        Field("pid", int), Field("ctx_id", int), Field("guilty", int),
        Field("submitted", int), Field("signaled", int), Field("submissions", int),
        Field("ibs", int), Field("packets", int), Field("last_error", int))),
}
DROP_MSG = "ualink_drop_msg"  # Emulator policy 9: a hex bitmap, bit n = message type n


def show_drop_msg(bitmap: int) -> str:
    return f"{bitmap:#x}\n"


def parse_drop_msg(text: str) -> int:
    """What a write to ualink_drop_msg means (hex, with or without 0x; empty is 0)."""
    try:
        return int(text.strip() or "0", 16) & ((1 << 64) - 1)
    except ValueError:
        raise ParseError("ualink_drop_msg takes a hex bitmap") from None


# ualink_fabric's states of a link (fabric/dialing.py): `up`, `down`, and two kinds of down
# of a pair linked on first use that has never been up, written `down <state>` so that the
# second field stays `up|down` for every reader of the file.
FABRIC_UP, FABRIC_DOWN = "up", "down"
FABRIC_NOT_YET = ("unlinked", "linking")  # no use has asked for it yet; its first set-up


def show_fabric(links: Mapping[str, str]) -> str:
    """sys/kernel/debug/ualink_fabric: `<peer node> up|down`, one line per peer; a link of
    a pod linked on first use that has not been up yet is `<peer> down unlinked` (no use
    yet) or `<peer> down linking` (its first use waits for it)."""
    return "".join(f"{peer} {state}\n" if state in (FABRIC_UP, FABRIC_DOWN)
                   else f"{peer} {FABRIC_DOWN} {state}\n" for peer, state in links.items())


def show_data_plane(stats: Mapping[str, int]) -> str:
    """sys/kernel/debug/ualink_data_plane: `<counter> <n>`, one line per counter."""
    return "".join(f"{k} {v}\n" for k, v in stats.items())


def parse_data_plane(text: str) -> dict[str, int]:
    """Counter name → value."""
    out = {}
    for ln in text.splitlines():
        k, _, v = ln.partition(" ")
        if v.strip().isdigit():
            out[k] = int(v)
    return out


def parse_fabric(text: str) -> dict[str, bool]:
    """Peer node name → link up."""
    return {peer: state == FABRIC_UP for peer, state in parse_fabric_states(text).items()}


def parse_fabric_states(text: str) -> dict[str, str]:
    """Peer node name → its link's state: `up`, `down`, or one of FABRIC_NOT_YET."""
    out = {}
    for ln in text.splitlines():
        parts = ln.split()
        if len(parts) == 2:
            out[parts[0]] = parts[1]
        elif len(parts) == 3 and parts[1] == FABRIC_DOWN:
            out[parts[0]] = parts[2] if parts[2] in FABRIC_NOT_YET else FABRIC_DOWN
    return out


# -- the DRM and PCI sysfs of one GPU -------------------------------------------------------------


def minor_uevent(minor: int) -> str:
    """drm_sysfs's uevent of a minor (what drmGetDeviceNameFromFd2 reads DEVNAME from)."""
    name = f"renderD{minor}" if minor >= RENDER_MINOR_BASE else f"card{minor}"
    return f"MAJOR={DRM_MAJOR}\nMINOR={minor}\nDEVNAME=dri/{name}\nDEVTYPE=drm_minor\n"


# Class code 12h/00h, "processing accelerator" (chosen: an accelerator without display; the
# profiles do not name a class, and libdrm does not read it).
PCI_CLASS = 0x120000


def pci_uevent(profile: DeviceProfile, render_minor: int) -> str:
    """pci_uevent(): DRIVER, PCI_CLASS, PCI_ID (upper hex), PCI_SUBSYS_ID, PCI_SLOT_NAME
    (drmParsePciBusInfo reads it as %04x:%02x:%02x.%1u), MODALIAS."""
    p = profile
    return (f"DRIVER=amdgpu\nPCI_CLASS={PCI_CLASS:X}\n"
            f"PCI_ID={p.pci_vendor:04X}:{p.pci_device:04X}\n"
            f"PCI_SUBSYS_ID={p.subsystem_vendor:04X}:{p.subsystem_device:04X}\n"
            f"PCI_SLOT_NAME={pci_bdf(render_minor)}\n"
            f"MODALIAS=pci:v{p.pci_vendor:08X}d{p.pci_device:08X}"
            f"sv{p.subsystem_vendor:08X}sd{p.subsystem_device:08X}"
            f"bc{PCI_CLASS >> 16:02X}sc{PCI_CLASS >> 8 & 0xFF:02X}i{PCI_CLASS & 0xFF:02X}\n")


PCI_CONFIG_HEADER = 64  # what an unprivileged reader gets of config space (pci_read_config)


def pci_config(profile: DeviceProfile) -> bytes:
    """The standard 64-byte type-0 header, little-endian: vendor@0, device@2, revision@8,
    class code@9..11, subsystem vendor@44, subsystem device@46 (parse_config_sysfs_file)."""
    p = profile
    cfg = bytearray(PCI_CONFIG_HEADER)
    cfg[0:2] = p.pci_vendor.to_bytes(2, "little")
    cfg[2:4] = p.pci_device.to_bytes(2, "little")
    cfg[8] = p.pci_revision
    cfg[9:12] = PCI_CLASS.to_bytes(3, "little")
    cfg[44:46] = p.subsystem_vendor.to_bytes(2, "little")
    cfg[46:48] = p.subsystem_device.to_bytes(2, "little")
    return bytes(cfg)


def _const(text: str) -> SysAttr:
    return SysAttr(lambda: text)


def gpu_sysfs(render_minor: int, profile: DeviceProfile, ualink: SysDir) -> SysDir:
    """The sys/ entries of one GPU: its PCI device directory (with `ualink` in it), its two
    DRM minors, and the links the kernel makes to them. A tree to merge into sys/."""
    n = card_index(render_minor)
    bdf, root = pci_bdf(render_minor), pci_root(render_minor)
    p = profile
    minors = {}
    for name, minor in ((f"card{n}", n), (f"renderD{render_minor}", render_minor)):
        minors[name] = SysDir({
            "dev": _const(f"{DRM_MAJOR}:{minor}\n"),
            "uevent": _const(minor_uevent(minor)),
            # from sys/devices/<root>/<bdf>/drm/<name>
            "device": SysLink(f"../../../{bdf}"),
            "subsystem": SysLink("../../../../../class/drm"),
        })
    device = SysDir({
        "vendor": _const(f"{p.pci_vendor:#06x}\n"),
        "device": _const(f"{p.pci_device:#06x}\n"),
        "subsystem_vendor": _const(f"{p.subsystem_vendor:#06x}\n"),
        "subsystem_device": _const(f"{p.subsystem_device:#06x}\n"),
        "revision": _const(f"{p.pci_revision:#04x}\n"),
        "class": _const(f"{PCI_CLASS:#08x}\n"),
        "uevent": _const(pci_uevent(p, render_minor)),
        "config": SysAttr(lambda: pci_config(p), size=PCI_CONFIG_HEADER),
        # drmParseSubsystemType: the basename of this link's target must start with "pci".
        "subsystem": SysLink("../../../bus/pci"),
        "driver": SysLink("../../../bus/pci/drivers/amdgpu"),
        "drm": SysDir(minors),
        "ualink": ualink,
    })
    to_device = f"devices/{root}/{bdf}"
    return SysDir({
        "devices": SysDir({root: SysDir({bdf: device})}),
        "bus": SysDir({"pci": SysDir({
            "devices": SysDir({bdf: SysLink(f"../../../{to_device}")}),
            "drivers": SysDir({"amdgpu": SysDir({bdf: SysLink(f"../../../../{to_device}")})}),
        })}),
        "class": SysDir({"drm": SysDir({
            name: SysLink(f"../../{to_device}/drm/{name}") for name in minors})}),
        "dev": SysDir({"char": SysDir({
            f"{DRM_MAJOR}:{minor}": SysLink(f"../../{to_device}/drm/{name}")
            for name, minor in ((f"card{n}", n), (f"renderD{render_minor}", render_minor))})}),
    })


# -- the driver's module (kernel/module/sysfs.c): sys/module/amdgpu/ ---------------------------
# What kmod's lsmod reads for a module /proc/modules lists (libkmod kmod_module_get_refcnt,
# _get_size, _get_holders); the shim adds amdgpu's /proc/modules line with these values.
AMDGPU_CORESIZE = 9928704  # chosen: an amdgpu.ko of Linux 6.x is about this size


def module_sysfs(refcnt: Callable[[], int]) -> SysDir:
    """sys/module/amdgpu as a host with the driver loaded has it (issue 32, item 1).
    `refcnt`: the module's references, one per open render node or kfd file (their
    file_operations' owner is the module: fops_get in chrdev_open takes one)."""
    return SysDir({"module": SysDir({"amdgpu": SysDir({
        "coresize": _const(f"{AMDGPU_CORESIZE}\n"),
        "initstate": _const("live\n"),
        "refcnt": SysAttr(lambda: f"{refcnt()}\n"),
        "holders": SysDir(),
    })})})


def merge(into: SysDir, tree: Mapping[str, SysNode]) -> SysDir:
    """Merge `tree` into `into` (directories joined; a name given twice is a bug)."""
    for name, item in tree.items():
        sub = into.get(name)
        if isinstance(item, SysDir) and isinstance(sub, SysDir):
            merge(sub, item)
        else:
            assert name not in into, f"{name} is in the sys tree twice"
            into[name] = item
    return into


def is_dir(node: object) -> bool:
    return isinstance(node, dict)


# -- the KFD topology (kfd_topology.c): sys/devices/virtual/kfd/kfd/topology/ ---------------------
# Each `properties` file is "name value" lines, the order of the kernel's node_show /
# mem_show / iolink_show; libhsakmt's parser reads them by name and ignores the rest.
HSA_MEM_HEAP_TYPE_SYSTEM = 0
HSA_MEM_HEAP_TYPE_FB_PUBLIC = 1
CRAT_IOLINK_TYPE_PCIEXPRESS = 2
CRAT_IOLINK_FLAGS_ENABLED = 1
GFX9_MAX_WAVES_PER_SIMD = 10  # gfx_v9_0_get_cu_info
GFX9_LDS_SIZE_KB = 64
# kfd_topology.h's HSA_CACHE_TYPE_* (kfd_crat.c turns the CRAT flags into these for `type`);
# ROCr keeps a GPU cache only if it is HSACU and not an instruction cache.
HSA_CACHE_TYPE_DATA, HSA_CACHE_TYPE_HSACU = 0x1, 0x8
# A GPU node's caches (chosen, gfx9-like: the per-CU L1 vector cache and the L2 the node
# shares; the kernel lists one L1 entry per CU group, one is enough for a runtime's totals).
# (level, size in KiB, line size) — ROCr asserts a GPU node has at least one.
GPU_CACHES = ((1, 16, 128), (2, 4096, 128))


def _props(pairs: list[tuple[str, int]]) -> str:
    return "".join(f"{k} {v}\n" for k, v in pairs)


def _iolink(node_from: int, node_to: int) -> SysDir:
    return SysDir({"properties": _const(_props([
        ("type", CRAT_IOLINK_TYPE_PCIEXPRESS), ("version_major", 0), ("version_minor", 0),
        ("node_from", node_from), ("node_to", node_to), ("weight", 20),
        ("min_latency", 0), ("max_latency", 0), ("min_bandwidth", 0), ("max_bandwidth", 0),
        ("recommended_transfer_size", 0), ("flags", CRAT_IOLINK_FLAGS_ENABLED)]))})


def _bank(heap_type: int, size: int, width: int, clk_mhz: int) -> SysDir:
    return SysDir({"properties": _const(_props([
        ("heap_type", heap_type), ("size_in_bytes", size), ("flags", 0), ("width", width),
        ("mem_clk_max", clk_mhz)]))})


def gpu_simd_id_base(n: int) -> int:
    """The first processor id of GPU node `n` (kfd_topology's 0x80001000 base, apart per
    node)."""
    return 0x80001000 + (n << 12)


def _cache(simd_id_base: int, level: int, size_kb: int, line: int) -> SysDir:
    return SysDir({"properties": _const(_props([
        ("processor_id_low", simd_id_base), ("level", level), ("size", size_kb),
        ("cache_line_size", line), ("cache_lines_per_tag", 1), ("association", 16),
        ("latency", 0),
        ("type", HSA_CACHE_TYPE_DATA | HSA_CACHE_TYPE_HSACU)]) + "sibling_map 1\n")})


# kfd_topology_add_device (kfd_sysfs.h bits): every GC >= 9.0.1 part has 64-bit AQL
# doorbells, HSA_CAP_DOORBELL_TYPE_2_0 in DoorbellType (bits 13:12). ROCr 5.2.3's AqlQueue
# reads it: type 2 makes write_dispatch_id the CP's write pointer and the doorbell a 64-bit
# store; any other type falls back to gfx8's legacy 32-bit doorbell protocol.
HSA_CAP_DOORBELL_TYPE_TOTALBITS_SHIFT = 12
HSA_CAP_DOORBELL_TYPE_2_0 = 0x2
GFX9_CAPABILITY = HSA_CAP_DOORBELL_TYPE_2_0 << HSA_CAP_DOORBELL_TYPE_TOTALBITS_SHIFT


def kfd_gpu_properties(n: int, g: TopologyGpu) -> str:
    """A GPU node's `properties`: its shape from the profile, the same numbers AMDGPU_INFO
    gives (simd_count = CUs x SIMDs per CU), and the identity of its render node and PCI
    device (drm_render_minor, location_id = bus << 8 | devfn, domain)."""
    p = g.profile
    return _props([
        ("cpu_cores_count", 0), ("simd_count", p.num_cu * p.simd_per_cu),
        ("mem_banks_count", 1), ("caches_count", len(GPU_CACHES)), ("io_links_count", 1),
        ("p2p_links_count", 0), ("cpu_core_id_base", 0), ("simd_id_base", gpu_simd_id_base(n)),
        ("max_waves_per_simd", GFX9_MAX_WAVES_PER_SIMD), ("lds_size_in_kb", GFX9_LDS_SIZE_KB),
        ("gds_size_in_kb", 0), ("num_gws", p.gws_size), ("wave_front_size", p.wave_front_size),
        ("array_count", p.num_shader_engines * p.num_shader_arrays_per_engine),
        ("simd_arrays_per_engine", p.num_shader_arrays_per_engine),
        ("cu_per_simd_array", p.num_cu_per_sh), ("simd_per_cu", p.simd_per_cu),
        ("max_slots_scratch_cu", 32), ("gfx_target_version", p.gfx_target_version),
        ("vendor_id", p.pci_vendor), ("device_id", p.pci_device),
        ("location_id", g.pci_bus << 8), ("domain", 0),
        ("drm_render_minor", g.render_minor), ("hive_id", 0),
        ("num_sdma_engines", sdma_engines(p)[0]), ("num_sdma_xgmi_engines", sdma_engines(p)[1]),
        ("num_sdma_queues_per_engine", SDMA_QUEUES_PER_ENGINE), ("num_cp_queues", 0),
        ("max_engine_clk_fcompute", p.max_engine_clock_khz // 1000), ("local_mem_size", 0),
        ("fw_version", 0), ("capability", GFX9_CAPABILITY), ("debug_prop", 0),
        ("sdma_fw_version", p.firmware.get(FW_SDMA, (0, 0))[0]),
        ("unique_id", 0), ("num_xcc", p.num_xcc),
        ("max_engine_clk_ccompute", p.max_engine_clock_khz // 1000)])


def kfd_topology_sysfs(topo: Topology) -> SysDir:
    """The topology tree, to merge into sys/: node 0 the CPU (gpu_id 0, its system memory,
    one link to each GPU), then a node per GPU with its VRAM bank and a PCIe link to the
    CPU; class/kfd/kfd links to the device directory as the kernel's class device does."""
    nodes = SysDir({"0": SysDir({
        "gpu_id": _const("0\n"),
        "name": _const("\n"),
        "properties": _const(_props([
            ("cpu_cores_count", topo.cpu_cores), ("simd_count", 0), ("mem_banks_count", 1),
            ("caches_count", 0), ("io_links_count", len(topo.gpus)), ("p2p_links_count", 0),
            ("cpu_core_id_base", 0), ("simd_id_base", 0), ("max_waves_per_simd", 0),
            ("lds_size_in_kb", 0), ("gds_size_in_kb", 0), ("num_gws", 0),
            ("wave_front_size", 0), ("array_count", 0), ("simd_arrays_per_engine", 0),
            ("cu_per_simd_array", 0), ("simd_per_cu", 0), ("max_slots_scratch_cu", 0),
            ("gfx_target_version", 0), ("vendor_id", 0), ("device_id", 0),
            ("location_id", 0), ("domain", 0), ("drm_render_minor", 0), ("hive_id", 0),
            ("num_sdma_engines", 0), ("num_sdma_xgmi_engines", 0),
            ("num_sdma_queues_per_engine", 0), ("num_cp_queues", 0),
            ("max_engine_clk_fcompute", 0), ("local_mem_size", 0), ("fw_version", 0),
            ("capability", 0), ("debug_prop", 0), ("sdma_fw_version", 0), ("unique_id", 0),
            ("num_xcc", 0), ("max_engine_clk_ccompute", 0)])),
        "mem_banks": SysDir({"0": _bank(HSA_MEM_HEAP_TYPE_SYSTEM, topo.system_memory, 64, 0)}),
        "caches": SysDir(),
        "io_links": SysDir({str(i): _iolink(0, i + 1) for i in range(len(topo.gpus))}),
        "p2p_links": SysDir(),
    })})
    for i, g in enumerate(topo.gpus):
        n = i + 1
        nodes[str(n)] = SysDir({
            "gpu_id": _const(f"{g.gpu_id}\n"),
            # node_props.name: the ASIC's name; GC 9.4.x parts are named by IP discovery
            "name": _const("ip discovery\n"),
            "properties": _const(kfd_gpu_properties(n, g)),
            "mem_banks": SysDir({"0": _bank(HSA_MEM_HEAP_TYPE_FB_PUBLIC, g.vram_size,
                                            g.profile.vram_bit_width,
                                            g.profile.max_memory_clock_khz // 1000)}),
            "caches": SysDir({str(i): _cache(gpu_simd_id_base(n), *c)
                              for i, c in enumerate(GPU_CACHES)}),
            "io_links": SysDir({"0": _iolink(n, 0)}),
            "p2p_links": SysDir(),
        })
    topology = SysDir({
        "generation_id": _const("1\n"),
        "system_properties": _const(_props([("platform_oem", 0), ("platform_id", 0),
                                            ("platform_rev", 0)])),
        "nodes": nodes,
    })
    return SysDir({
        "devices": SysDir({"virtual": SysDir({"kfd": SysDir({"kfd": SysDir({
            "topology": topology})})})}),
        "class": SysDir({"kfd": SysDir({"kfd": SysLink("../../devices/virtual/kfd/kfd")})}),
    })
