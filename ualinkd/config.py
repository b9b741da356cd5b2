"""The pod configuration (one TOML file) and its validation (DESIGN "Pod configuration").
A key the file format does not have is an error, never ignored: it is a typo.

The file plays the firmware (Emulator policy 8): it gives each accel its pPod and vPod
information and configuration stage. `PodConfig.local()` builds the embedded default pod
that `ualinkd pod` runs.
"""

from __future__ import annotations

import difflib
import re
import secrets
import tomllib
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from .amdgpu.profile import DEFAULT_PROFILE, PROFILES
from .fabric.dialing import MODES as LINK_MODES
from .ualink.manager import KNOWN_QUIRKS
from .ualink.state import (
    ACCEL_MAX,
    LOCAL_ACCELS_MAX,
    AddrMode,
    ConfigStage,
    PpodInfo,
    VpodInfo,
)

GIB = 1 << 30
_SIZE_RE = re.compile(r"^\s*(\d+)\s*([KMGT]i?B?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


class ConfigError(ValueError):
    """A pod configuration that cannot be run; the message says what and where."""


def split_address(address: str, where: str) -> tuple[str, int]:
    """A node's fabric address `host:port` or `[v6]:port` → (host, port), port 0..65535
    (0: any free one); a ConfigError naming `where` otherwise."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"{where}: address {address!r} is not host:port (no port)")
    if int(port) > 65535:
        raise ConfigError(f"{where}: address {address!r}: port {port} is outside 0..65535")
    return host.strip("[]"), int(port)


# Every key a pod file may hold, per table: what from_dict reads (and to_toml writes).
# Anything else is a typo that would otherwise be ignored without a word.
TOP_LEVEL = "the top level"
KEYS: dict[str, frozenset[str]] = {
    TOP_LEVEL: frozenset({"pod", "nodes", "vpods"}),
    "[pod]": frozenset({"uuid", "key", "size", "kernel_quirks", "response_timeout_ms",
                        "send_ack_timeout_ms", "tls_ca", "tcp_congestion",
                        "caller_memory_timeout_ms", "memory_budget", "fabric_links"}),
    "[[nodes]]": frozenset({"name", "address", "accels", "tls_cert", "tls_key", "link_keys"}),
    "[[nodes.accels]]": frozenset({"id", "vram_size", "gtt_size", "stage", "bandwidth",
                                   "latency", "npa_pages", "profile", "ualink"}),
    "[[vpods]]": frozenset({"id", "members", "addr_mode"}),
}


def _check_keys(table: dict, section: str, where: str) -> None:
    """A ConfigError naming the keys of `table` that `section` does not have, the keys it
    has, and where a misplaced or misspelt key probably belongs."""
    allowed = KEYS[section]
    unknown = [k for k in table if k not in allowed]
    if not unknown:
        return
    hints = []
    for key in unknown:
        homes = [s for s, keys in KEYS.items() if key in keys]
        close = difflib.get_close_matches(str(key), allowed, n=1)
        if homes:
            hints.append(f"{key!r} belongs in {' or '.join(homes)}")
        elif close:
            hints.append(f"did you mean {close[0]!r}?")
    place = "at the top level" if section == TOP_LEVEL else f"in {section}"
    raise ConfigError(f"{where}: unknown key{'s' if len(unknown) > 1 else ''} "
                      f"{', '.join(map(repr, unknown))} {place} "
                      f"(allowed there: {', '.join(sorted(allowed))})"
                      + "".join(f"; {h}" for h in hints))


def _tables(value: object, header: str, where: str) -> list[dict]:
    """An array of tables (`[[header]]`), checked: `[header]` or `header = 3` is an error."""
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise ConfigError(f"{where}: {header.rsplit('.', 1)[-1]} must be an array of tables "
                          f"([[{header}]])")
    return value


def _profile(value: object, where: str) -> str:
    if isinstance(value, str) and value in PROFILES:
        return value
    close = difflib.get_close_matches(str(value), PROFILES, n=1)
    raise ConfigError(f"{where}: {value!r} is not a device profile (one of "
                      f"{', '.join(sorted(PROFILES))})"
                      + (f"; did you mean {close[0]!r}?" if close else ""))


def _ualink_block(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: {value!r} is not true or false")
    return value


def _int(value: object, where: str, lo: int | None = None, hi: int | None = None) -> int:
    """A TOML integer within [lo, hi]: a string, float or bool is an error naming the key
    (int("fast") would be a traceback, int(2.7) a silent 2, int("2") a silent 2)."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(f"{where}: {value!r} is not an integer")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        bounds = (f"at least {lo}" if hi is None else f"in {lo}..{hi}" if lo is not None
                  else f"at most {hi}")
        raise ConfigError(f"{where}: {value} must be {bounds}")
    return value


def _fabric_links(value: object, source: str) -> str:
    mode = _str(value, f"{source}: [pod] fabric_links")
    if mode not in LINK_MODES:
        raise ConfigError(f"{source}: [pod] fabric_links must be one of "
                          f"{', '.join(LINK_MODES)}, not {mode!r}")
    return mode


def _str(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{where}: {value!r} is not a string")
    return value


def _int_list(value: object, where: str) -> list[int]:
    """An array of integers: `members = "0,1"` is an error, not the members '0', ',', '1'."""
    if not isinstance(value, list):
        raise ConfigError(f"{where}: {value!r} is not an array (e.g. [0, 1])")
    return [_int(v, f"{where}[{i}]", 0) for i, v in enumerate(value)]


def _str_list(value: object, where: str) -> list[str]:
    if not isinstance(value, list):
        raise ConfigError(f"{where}: {value!r} is not an array of strings (e.g. [\"a\"])")
    return [_str(v, f"{where}[{i}]") for i, v in enumerate(value)]


def parse_size(value: object, where: str) -> int:
    """A positive size: bytes, or a string with a unit ("64MiB"); 0 is a pool that could
    hold nothing, refused here rather than as ENOMEM at every GEM_CREATE."""
    size = None
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    elif isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m:
            size = int(m.group(1)) * _UNITS[(m.group(2) or "")[:1].upper()]
    if size is not None and size <= 0:
        raise ConfigError(f"{where}: {value!r} must be a positive size")
    if size is not None:
        return size
    raise ConfigError(f"{where}: {value!r} is not a size (e.g. 4096, \"64MiB\", \"16GiB\")")


MIB = 1 << 20


def host_memory_total(meminfo: str = "/proc/meminfo") -> int:
    """MemTotal of the host this runs on, in bytes."""
    with open(meminfo) as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise ConfigError(f"{meminfo} has no MemTotal")


@dataclass(frozen=True)
class AccelConfig:
    accel_id: int
    # None: the accel's share of the pod's memory budget (PodConfig.accel_memory).
    vram_size: int | None = None
    gtt_size: int | None = None
    stage: ConfigStage = ConfigStage.COMPLETE
    bandwidth: int = 100
    latency: int = 1
    npa_pages: int | None = None  # emulator only: shrink the NPA space (ENOSPC tests)
    profile: str = DEFAULT_PROFILE  # amdgpu/profile.py: the device the accel says it is
    ualink: bool = True  # False: a GPU without the UALink IP block (§13 N6)


@dataclass(frozen=True)
class NodeConfig:
    name: str
    address: str
    accels: tuple[AccelConfig, ...]
    tls_cert: str | None = None  # PEM certificate (chain) of this node's fabric endpoint
    tls_key: str | None = None
    # The secrets of this node's links, (peer name, hex key) sorted by peer: a node's own file
    # carries them instead of the pod key, so it can prove only its own name (fabric/auth.py).
    link_keys: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class VpodConfig:
    vpod_id: int
    members: frozenset[int]
    addr_mode: AddrMode


@dataclass(frozen=True)
class PodConfig:
    uuid: uuid.UUID
    key: str
    nodes: tuple[NodeConfig, ...]
    vpods: tuple[VpodConfig, ...] = ()
    ppod_size: int = 0
    kernel_quirks: frozenset[str] = frozenset()
    response_timeout_ms: int = 5000
    send_ack_timeout_ms: int = 2000
    # How long a daemon waits for a client's memory (an ioctl's arrays, a userptr BO) before
    # it answers EFAULT: a page of a hung file system must not hold the ioctl for ever.
    caller_memory_timeout_ms: int = 1000
    # Bytes of emulated VRAM + GTT the whole pod may hold (every BO's bytes live in a daemon's
    # memory); None: half the MemTotal of the host a daemon runs on. See accel_memory().
    memory_budget: int | None = None
    tls_ca: str | None = None  # when set (with each node's cert and key) links use mutual TLS
    # The fabric links' TCP congestion control; "" keeps the system default. Not BBR: its
    # pacing slows the data plane's megabyte bursts (see fabric/conn.py tune).
    tcp_congestion: str = "cubic"
    # When the fabric links each pair: "at-start", "on-first-use", or "auto" (at start up to
    # fabric/dialing.py's AT_START_MAX_NODES nodes, on first use above).
    fabric_links: str = "auto"
    source: str = field(default="<built-in>", compare=False)

    # -- lookups --------------------------------------------------------------------------
    def node(self, name: str) -> NodeConfig:
        for n in self.nodes:
            if n.name == name:
                return n
        raise ConfigError(f"{self.source}: no node named {name!r} (have: "
                          f"{', '.join(n.name for n in self.nodes)})")

    def ppod_info(self, accel: AccelConfig) -> PpodInfo:
        return PpodInfo(accel.accel_id, accel.bandwidth, accel.latency, self.ppod_size, self.uuid)

    def accel_memory(self, accel: AccelConfig,
                     host_total: int | None = None) -> tuple[int, int]:
        """(VRAM, GTT) capacity of `accel`: its own vram_size / gtt_size where set, else an
        even share of the pod's memory budget over every accel of the pod, half VRAM and
        half GTT, in whole MiB. The whole pod may sit on one host (`ualinkd pod`), so the
        budget is split over all of its accels; with the default budget (half of MemTotal)
        the BOs of every daemon on this host together stay within half of its memory."""
        if accel.vram_size is not None and accel.gtt_size is not None:
            return accel.vram_size, accel.gtt_size
        budget = self.memory_budget
        if budget is None:
            budget = (host_memory_total() if host_total is None else host_total) // 2
        accels = sum(len(n.accels) for n in self.nodes)
        half = budget // accels // 2 // MIB * MIB
        return (half if accel.vram_size is None else accel.vram_size,
                half if accel.gtt_size is None else accel.gtt_size)

    def vpod_info(self, accel_id: int) -> VpodInfo:
        for v in self.vpods:
            if accel_id in v.members:
                return VpodInfo(v.vpod_id, len(v.members), v.addr_mode, v.members)
        return VpodInfo()

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def local(
        cls, nodes: int = 2, accels_per_node: int = 1, ports: list[int] | None = None
    ) -> PodConfig:
        """The default local pod on 127.0.0.1: every accel in vPod 1, source-aliasing, all
        ACTIVE. `ports` are the nodes' fabric ports (0: any, for a node alone)."""
        node_cfgs = []
        for i in range(nodes):
            accels = tuple(AccelConfig(i * accels_per_node + k) for k in range(accels_per_node))
            port = ports[i] if ports else 0
            node_cfgs.append(NodeConfig(f"node{i}", f"127.0.0.1:{port}", accels))
        members = frozenset(a.accel_id for n in node_cfgs for a in n.accels)
        cfg = cls(
            uuid=uuid.uuid4(),
            key=secrets.token_hex(32),
            nodes=tuple(node_cfgs),
            vpods=(VpodConfig(1, members, AddrMode.SOURCE_ALIASING),),
            ppod_size=len(members),
        )
        cfg.validate()
        return cfg

    @classmethod
    def load(cls, path: str | Path) -> PodConfig:
        try:
            with open(path, "rb") as f:
                doc = tomllib.load(f)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: not valid TOML: {e}") from None
        except OSError as e:
            raise ConfigError(f"{path}: {e.strerror}") from None
        return cls.from_dict(doc, str(path))

    @classmethod
    def from_dict(cls, doc: dict, source: str = "<dict>") -> PodConfig:
        _check_keys(doc, TOP_LEVEL, source)
        pod = doc.get("pod", {})
        if not isinstance(pod, dict):
            raise ConfigError(f"{source}: pod must be a table ([pod])")
        _check_keys(pod, "[pod]", source)
        try:
            pod_uuid = uuid.UUID(str(pod.get("uuid", "")))
        except ValueError:
            raise ConfigError(f"{source}: [pod] uuid must be a UUID") from None
        nodes = []
        for i, n in enumerate(_tables(doc.get("nodes", []), "nodes", source)):
            where = f"{source}: nodes[{i}]"
            _check_keys(n, "[[nodes]]", where)
            if "name" not in n:
                raise ConfigError(f"{where}: a node needs a name")
            accels = []
            for j, a in enumerate(_tables(n.get("accels", []), "nodes.accels", where)):
                aw = f"{where}.accels[{j}]"
                _check_keys(a, "[[nodes.accels]]", aw)
                if "id" not in a:
                    raise ConfigError(f"{aw}: an accel needs an integer id")
                _int(a["id"], f"{aw}.id")
                try:
                    stage = ConfigStage(a.get("stage", "complete"))
                except ValueError:
                    raise ConfigError(
                        f"{aw}: stage must be one of {[s.value for s in ConfigStage]}"
                    ) from None
                accels.append(AccelConfig(
                    a["id"],
                    parse_size(a["vram_size"], f"{aw}.vram_size") if "vram_size" in a else None,
                    parse_size(a["gtt_size"], f"{aw}.gtt_size") if "gtt_size" in a else None,
                    stage,
                    _int(a.get("bandwidth", 100), f"{aw}.bandwidth", 1),
                    _int(a.get("latency", 1), f"{aw}.latency", 0),
                    _int(a["npa_pages"], f"{aw}.npa_pages", 1) if "npa_pages" in a else None,
                    _profile(a.get("profile", DEFAULT_PROFILE), f"{aw}.profile"),
                    _ualink_block(a.get("ualink", True), f"{aw}.ualink"),
                ))
            link_keys = n.get("link_keys", {})
            if not isinstance(link_keys, dict) or not all(
                    isinstance(v, str) for v in link_keys.values()):
                raise ConfigError(f"{where}: link_keys must be a table of peer name = "
                                  '"hex key" (e.g. link_keys = { node1 = "…" })')
            nodes.append(NodeConfig(
                _str(n["name"], f"{where}.name"), _str(n.get("address", ""), f"{where}.address"),
                tuple(accels),
                _str(n["tls_cert"], f"{where}.tls_cert") if "tls_cert" in n else None,
                _str(n["tls_key"], f"{where}.tls_key") if "tls_key" in n else None,
                tuple(sorted(link_keys.items()))))
        vpods = []
        for i, v in enumerate(_tables(doc.get("vpods", []), "vpods", source)):
            where = f"{source}: vpods[{i}]"
            _check_keys(v, "[[vpods]]", where)
            mode = {"source-aliasing": AddrMode.SOURCE_ALIASING,
                    "source-identification": AddrMode.SOURCE_IDENTIFICATION}.get(
                        _str(v.get("addr_mode", "source-aliasing"), f"{where}.addr_mode"))
            if mode is None:
                raise ConfigError(
                    f"{where}: addr_mode must be source-aliasing or source-identification")
            if not isinstance(v.get("id"), int) or isinstance(v["id"], bool) or v["id"] <= 0:
                raise ConfigError(f"{where}: id must be a positive integer (0 means no vPod)")
            vpods.append(VpodConfig(
                v["id"], frozenset(_int_list(v.get("members", []), f"{where}.members")), mode))
        all_ids = [a.accel_id for n in nodes for a in n.accels]
        cfg = cls(
            uuid=pod_uuid,
            key=_str(pod.get("key", ""), f"{source}: [pod] key"),
            nodes=tuple(nodes),
            vpods=tuple(vpods),
            ppod_size=_int(pod.get("size", max(all_ids, default=-1) + 1),
                           f"{source}: [pod] size", 0, (1 << 32) - 1),  # a u32 in sysfs
            kernel_quirks=frozenset(_str_list(pod.get("kernel_quirks", []),
                                              f"{source}: [pod] kernel_quirks")),
            response_timeout_ms=_int(pod.get("response_timeout_ms", 5000),
                                     f"{source}: [pod] response_timeout_ms", 1),
            send_ack_timeout_ms=_int(pod.get("send_ack_timeout_ms", 2000),
                                     f"{source}: [pod] send_ack_timeout_ms", 1),
            tls_ca=_str(pod["tls_ca"], f"{source}: [pod] tls_ca") if "tls_ca" in pod else None,
            tcp_congestion=_str(pod.get("tcp_congestion", "cubic"),
                                f"{source}: [pod] tcp_congestion"),
            caller_memory_timeout_ms=_int(pod.get("caller_memory_timeout_ms", 1000),
                                          f"{source}: [pod] caller_memory_timeout_ms", 1),
            memory_budget=(parse_size(pod["memory_budget"], f"{source}: [pod] memory_budget")
                           if "memory_budget" in pod else None),
            fabric_links=_fabric_links(pod.get("fabric_links", "auto"), source),
            source=source,
        )
        cfg.validate()
        return cfg

    def validate(self) -> None:
        src = self.source
        if not self.nodes:
            raise ConfigError(f"{src}: the pod has no nodes")
        names = [n.name for n in self.nodes]
        for name in names:
            if names.count(name) > 1:
                raise ConfigError(f"{src}: node name {name!r} appears twice")
        addresses: dict[str, str] = {}
        for n in self.nodes:
            if n.address:  # what the fabric's parse_address then refuses, said at load
                split_address(n.address, f"{src}: node {n.name!r}")
            # Two nodes on one address would each dial the other's listener as itself: not a
            # warning twice a second forever, an error before anything starts. (Port 0 is
            # "any free port", filled in at start-up.)
            if n.address and not n.address.endswith(":0") and n.address in addresses:
                raise ConfigError(f"{src}: nodes {addresses[n.address]!r} and {n.name!r} "
                                  f"have the same address {n.address}")
            addresses[n.address] = n.name
        owner: dict[int, str] = {}
        for n in self.nodes:
            if not n.accels:
                raise ConfigError(f"{src}: node {n.name!r} has no accels")
            if len(n.accels) > LOCAL_ACCELS_MAX:
                raise ConfigError(f"{src}: node {n.name!r} has {len(n.accels)} accels "
                                  f"(at most {LOCAL_ACCELS_MAX})")
            for a in n.accels:
                if not 0 <= a.accel_id < ACCEL_MAX:
                    raise ConfigError(f"{src}: accel id {a.accel_id} on node {n.name!r} "
                                      f"is outside 0..{ACCEL_MAX - 1}")
                if a.accel_id in owner:
                    raise ConfigError(f"{src}: accel id {a.accel_id} is on both "
                                      f"{owner[a.accel_id]!r} and {n.name!r}")
                owner[a.accel_id] = n.name
        seen: dict[int, int] = {}
        for v in self.vpods:
            for m in sorted(v.members):
                if m not in owner:
                    raise ConfigError(f"{src}: vPod {v.vpod_id} member {m} is on no node")
                if m in seen:
                    raise ConfigError(f"{src}: accel {m} is in vPods {seen[m]} and {v.vpod_id}")
                seen[m] = v.vpod_id
        keys: dict[frozenset[str], str] = {}
        for n in self.nodes:
            for peer, hexkey in n.link_keys:
                if peer == n.name or peer not in names:
                    what = "itself" if peer == n.name else "no node of the pod"
                    raise ConfigError(f"{src}: node {n.name!r} has a link key for "
                                      f"{peer!r}, which is {what}")
                try:
                    ok = len(bytes.fromhex(hexkey)) >= 16
                except ValueError:
                    ok = False
                if not ok:
                    raise ConfigError(f"{src}: node {n.name!r}: link_keys.{peer} must be at "
                                      "least 16 bytes in hex (32 hex digits)")
                pair = frozenset((n.name, peer))
                if keys.setdefault(pair, hexkey.lower()) != hexkey.lower():
                    raise ConfigError(f"{src}: nodes {n.name!r} and {peer!r} give their link "
                                      "different keys")
        if self.tls_ca is not None:
            for n in self.nodes:
                if not (n.tls_cert and n.tls_key):
                    raise ConfigError(f"{src}: [pod] tls_ca is set, so node {n.name!r} needs "
                                      "tls_cert and tls_key")
        if min(self.response_timeout_ms, self.send_ack_timeout_ms,
               self.caller_memory_timeout_ms) <= 0:
            raise ConfigError(f"{src}: timeouts must be positive milliseconds")
        unknown = self.kernel_quirks - KNOWN_QUIRKS
        if unknown:
            raise ConfigError(f"{src}: unknown kernel quirks {sorted(unknown)} "
                              f"(known: {sorted(KNOWN_QUIRKS)})")

    def to_toml(self) -> str:
        """The same pod as a TOML file `ualinkd node --config` reads."""
        lines = [
            "[pod]",
            f'uuid = "{self.uuid}"',
            f'key = "{self.key}"',
            f"size = {self.ppod_size}",
            f"kernel_quirks = {sorted(self.kernel_quirks)!r}".replace("'", '"'),
            f"response_timeout_ms = {self.response_timeout_ms}",
            f"send_ack_timeout_ms = {self.send_ack_timeout_ms}",
            f"caller_memory_timeout_ms = {self.caller_memory_timeout_ms}",
        ]
        if self.memory_budget is not None:
            lines.append(f"memory_budget = {self.memory_budget}")
        if self.tls_ca is not None:
            lines.append(f'tls_ca = "{self.tls_ca}"')
        lines.append(f'tcp_congestion = "{self.tcp_congestion}"')
        if self.fabric_links != "auto":
            lines.append(f'fabric_links = "{self.fabric_links}"')
        for n in self.nodes:
            lines += ["", "[[nodes]]", f'name = "{n.name}"', f'address = "{n.address}"']
            if n.tls_cert and n.tls_key:
                lines += [f'tls_cert = "{n.tls_cert}"', f'tls_key = "{n.tls_key}"']
            if n.link_keys:
                lines.append("link_keys = { " + ", ".join(
                    f'"{peer}" = "{k}"' for peer, k in n.link_keys) + " }")
            for a in n.accels:
                lines += [
                    "[[nodes.accels]]",
                    f"id = {a.accel_id}",
                    *([f"vram_size = {a.vram_size}"] if a.vram_size is not None else []),
                    *([f"gtt_size = {a.gtt_size}"] if a.gtt_size is not None else []),
                    f'stage = "{a.stage.value}"',
                    f"bandwidth = {a.bandwidth}",
                    f"latency = {a.latency}",
                ]
                if a.npa_pages is not None:
                    lines.append(f"npa_pages = {a.npa_pages}")
                lines.append(f'profile = "{a.profile}"')
                lines.append(f"ualink = {'true' if a.ualink else 'false'}")
        for v in self.vpods:
            lines += ["", "[[vpods]]", f"id = {v.vpod_id}",
                      f"members = {sorted(v.members)}", f'addr_mode = "{v.addr_mode.sysfs}"']
        return "\n".join(lines) + "\n"
