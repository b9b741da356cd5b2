"""Reading a running node and a running pod: the one API under `ualinkctl`, the pod
supervisor (ualinkd.netns) and the test harnesses.

A node is read through its mount (`Mount`: the sys/ tree only, every read bounded, so a
stopped node is "not answering", never a hang) into ualinkctl's JSON document (`collect`,
`node_report`) or the list of what it still holds (`node_leaks`). A pod is read from where
it runs (`pod_nodes`, typed `PodNodeInfo`): a `ualinkd pod` root (pod.toml, or the
key-less .nodes.json), or the state directory of a namespaced pod (pod.json,
`NetnsPodState`, which ualinkd.netns writes); inside a node's container, the pod config
names every node but only this container's mount is here (`container_node`). The line
formats are sysfs.py's; every failure is one `ReadError` whose text says what was refused
and why.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import stat
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from . import sysfs
from .bounded import NotAnswering, bounded
from .ualink.protocol import MsgType

NODES_FILE = ".nodes.json"  # a `ualinkd pod` root's key-less list of nodes (cli/pod.py)
POD_STATE_FILE = "pod.json"  # a namespaced pod's state directory (netns/pod.py)


class ReadError(Exception):
    """A node or pod that could not be read, as one line (ualinkctl: exit status 1)."""


def errname(e: OSError) -> str:
    return errno.errorcode.get(e.errno or 0, str(e.errno))


# -- parsing the files (pure: text in, typed dicts out) ------------------------------------


def parse_line(line: str, fmt: sysfs.LineFormat, where: str = "") -> dict[str, object]:
    try:
        return fmt.parse_line(line)
    except sysfs.ParseError as e:
        raise ReadError(f"{where}: {e}") from None


def parse_lines(text: str, fmt: sysfs.LineFormat, where: str = "") -> list[dict[str, object]]:
    return [parse_line(ln, fmt, where) for ln in text.splitlines() if ln.strip()]


def parse_fabric(text: str) -> list[dict[str, object]]:
    """sys/kernel/debug/ualink_fabric as the JSON document's list of links: `node` and
    `up`, and `state` (sysfs.FABRIC_NOT_YET) on a link of a pod linked on first use that
    has not been up yet, which is down but not the way a dropped link is."""
    links: list[dict[str, object]] = []
    for n, state in sysfs.parse_fabric_states(text).items():
        link: dict[str, object] = {"node": n, "up": state == sysfs.FABRIC_UP}
        if state in sysfs.FABRIC_NOT_YET:
            link["state"] = state
        links.append(link)
    return links


def link_word(link: dict[str, object]) -> str:
    """How `ualinkctl` shows a link of parse_fabric: up, down, `unlinked (first use)` (a
    link on first use no use has asked for yet), `linking (first use)`."""
    state = link.get("state")
    if state is not None:
        return f"{state} (first use)"
    return "up" if link["up"] else "down"


def msg_names(bitmap: int) -> list[str]:
    return [MsgType(t).name if t in MsgType._value2member_map_ else str(t)
            for t in range(64) if bitmap >> t & 1]


# -- a node ----------------------------------------------------------------------------------


def _pod_root_hint(path: str) -> str:
    """A pod's root given as --mount: say where its nodes are (from mountinfo: no stat into
    a node that may not answer)."""
    from .fuse.lowlevel import fuse_mounts_under

    root = os.path.abspath(path)
    nodes = sorted(p for p in fuse_mounts_under(root) if os.path.dirname(p) == root)
    if not nodes:
        return ""
    return (f"; a pod root: --mount {os.path.join(path, os.path.basename(nodes[0]))}"
            f" (its nodes: {', '.join(os.path.basename(p) for p in nodes)}; "
            f"`ualinkctl pod {path}` shows them all)")


def _why_not_a_mount(path: str) -> str | None:
    """Why `path` is not a ualinkd node's mount, or None if it is one (a FUSE file system
    with dri/renderD128 as a regular file and the node's sys/class/drm, DESIGN.md "The mount
    of one node"; what the shim itself checks, and more)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "it does not exist"
    except OSError as e:
        return e.strerror or str(e)
    if not stat.S_ISDIR(st.st_mode):
        return "not a directory"
    if not os.path.ismount(path):
        return "not a mount point"
    try:
        with open("/proc/self/mountinfo") as f:
            fstype = next((line.split(" - ", 1)[1].split()[0] for line in f
                           if line.split()[4] == path.replace(" ", "\\040")),
                          "")
    except OSError:
        fstype = "fuse"  # no mountinfo to ask: the files below decide
    if not fstype.startswith("fuse"):
        return f"a {fstype or 'non-FUSE'} mount, not a node's FUSE mount"
    render = os.path.join(path, "dri", f"renderD{sysfs.RENDER_MINOR_BASE}")
    if not os.path.isfile(render) or not os.path.isdir(os.path.join(path, sysfs.DRM_CLASS)):
        return "a FUSE mount without a node's dri/renderD128 and sys/class/drm"
    return None


def _pod_nodes_hint(path: str) -> str:
    """A pod root given where a node was meant: name its nodes."""
    try:
        nodes = sorted(n for n in os.listdir(path) if _why_not_a_mount(os.path.join(path, n))
                       is None)
    except OSError:
        return ""
    if nodes:
        return f" (a pod root? its nodes: {', '.join(os.path.join(path, n) for n in nodes)})"
    return ""


def not_a_node_mount(path: str) -> str | None:
    """One line saying why `path` (a realpath: mountinfo names mounts so) is not a ualinkd
    node's mount, a pod root's nodes named, or None if it is one: what `ualinkd run` and
    `ualinkd replay --mount` refuse before they send a program or a recording there."""
    why = _why_not_a_mount(path)
    if why is None:
        return None
    return f"{path} is not a ualinkd node's mount ({why}){_pod_nodes_hint(path)}"


class Mount:
    """A node's mount, checked once; every read and write failure becomes a ReadError (a
    node that does not answer included: every call is bounded)."""

    def __init__(self, path: str) -> None:
        self.path = path
        drm = os.path.join(path, sysfs.DRM_CLASS)
        try:
            names = bounded(lambda: (os.stat(path), os.listdir(drm))[1], f"node at {path}")
        except NotAnswering as e:
            raise ReadError(str(e)) from None
        except FileNotFoundError:
            if not os.path.exists(path):
                raise ReadError(f"{path} does not exist (is the node running? --mount DIR)") \
                    from None
            raise ReadError(f"{path} is not a ualinkd mount (no sys/class/drm)"
                           f"{_pod_root_hint(path)}") from None
        except OSError as e:
            if e.errno == errno.ENOTCONN:
                raise ReadError(f"{path}: the node's daemon is gone and left its mount behind "
                               f"(ENOTCONN); clear it with fusermount3 -uz {path}") from None
            raise ReadError(f"{path}: {e.strerror} ({errname(e)})") from None
        self.renders = sorted((n for n in names if n.startswith("renderD")),
                              key=lambda n: int(n[len("renderD"):]))
        if not self.renders:
            raise ReadError(f"{path} is not a ualinkd mount (no renderD* in sys/class/drm)")

    def _file(self, rel: str) -> str:
        return os.path.join(self.path, rel)

    def read(self, rel: str) -> str:
        def read() -> str:
            with open(self._file(rel)) as f:
                return f.read()
        try:
            return bounded(read, f"node at {self.path}")
        except NotAnswering as e:
            raise ReadError(str(e)) from None
        except FileNotFoundError:
            raise ReadError(f"{self.path}: no {rel} (a ualinkd older than this ualinkctl?)") \
                from None
        except PermissionError as e:
            hint = (" (debugfs is root only, as on a real host: run ualinkctl as root)"
                    if rel.startswith("sys/kernel/debug/") else "")
            raise ReadError(f"{self.path}: reading {rel}: {e.strerror} ({errname(e)}){hint}") \
                from None
        except OSError as e:
            raise ReadError(f"{self.path}: reading {rel}: {e.strerror} ({errname(e)})") \
                from None

    def write(self, rel: str, text: str) -> None:
        """One write(2) of `text`; OSError goes to the caller, who knows what it means
        (a node that does not answer is a ReadError)."""
        def write() -> None:
            fd = os.open(self._file(rel), os.O_WRONLY)
            try:
                os.write(fd, text.encode())
            finally:
                os.close(fd)
        try:
            bounded(write, f"node at {self.path}")
        except NotAnswering as e:
            raise ReadError(str(e)) from None

    @staticmethod
    def minor(render: str) -> int:
        return int(render[len("renderD"):])

    def ualink_dir(self, render: str) -> str:
        return sysfs.ualink_dir(self.minor(render))

    def debugfs(self, render: str, name: str) -> str:
        return sysfs.debugfs_file(self.minor(render), name)

    def sysfs(self, render: str) -> dict[str, object]:
        return {attr: sysfs.parse_value(attr, self.read(f"{self.ualink_dir(render)}/{attr}"))
                for attr in sysfs.UALINK_ATTRS}

    def pending_config(self, render: str) -> dict[str, object]:
        cfg = f"{self.ualink_dir(render)}/config"
        return {attr: sysfs.parse_value(attr, self.read(f"{cfg}/{attr}"))
                for attr in sysfs.VPOD_CONFIG}

    def npa(self, render: str) -> dict[str, object]:
        """ualink_npa's one line (used_pages, mappings), zeros when it is empty."""
        rows = self.table(render, "ualink_npa")
        return rows[0] if rows else {"used_pages": 0, "mappings": 0}

    def table(self, render: str, name: str) -> list[dict[str, object]]:
        rel = self.debugfs(render, name)
        return parse_lines(self.read(rel), sysfs.DEBUGFS[name], rel)

    def drop_msg(self, render: str) -> int:
        rel = self.debugfs(render, sysfs.DROP_MSG)
        try:
            return sysfs.parse_drop_msg(self.read(rel))
        except sysfs.ParseError as e:
            raise ReadError(f"{rel}: {e}") from None

    def fabric(self) -> list[dict[str, object]]:
        return parse_fabric(self.read(sysfs.FABRIC_STATUS))

    def data_plane(self) -> dict[str, int]:
        """sys/kernel/debug/ualink_data_plane: the C data plane's counters."""
        return sysfs.parse_data_plane(self.read(sysfs.DATA_PLANE_STATUS))


def _state(m: Mount, r: str) -> dict[str, object]:
    return m.sysfs(r)


def _peers(m: Mount, r: str) -> dict[str, object]:
    return {"peers": m.table(r, "ualink_peers")}


def _exports(m: Mount, r: str) -> dict[str, object]:
    return {"exports": m.table(r, "ualink_exports")}


def _imports(m: Mount, r: str) -> dict[str, object]:
    return {"imports": m.table(r, "ualink_imports")}


def _npa(m: Mount, r: str) -> dict[str, object]:
    return {"npa": m.npa(r)}


def _faults(m: Mount, r: str) -> dict[str, object]:
    faults = m.read(m.debugfs(r, "gpu_faults")).strip()
    bitmap: int | None = m.drop_msg(r)
    return {"faults": {"gpu_faults": int(faults), "drop_msg": bitmap,
                       "drop_next": msg_names(bitmap) if bitmap is not None else None}}


def _objects(m: Mount, r: str) -> dict[str, object]:
    return {"objects": m.table(r, "gem_objects"), "clients": m.table(r, "clients")}


def _kfd(m: Mount, r: str) -> dict[str, object]:
    return {"kfd": m.table(r, "kfd_allocations"), "kfd_processes": m.table(r, "kfd_processes"),
            "kfd_queues": m.table(r, "kfd_queues")}


def _cs(m: Mount, r: str) -> dict[str, object]:
    return {"cs": m.table(r, "amdgpu_cs_contexts")}


SECTIONS: dict[str, Callable[[Mount, str], dict[str, object]]] = {
    "state": _state, "peers": _peers, "exports": _exports, "imports": _imports,
    "npa": _npa, "faults": _faults, "objects": _objects, "kfd": _kfd, "cs": _cs,
}


def collect(m: Mount, sections: Iterable[str]) -> dict[str, object]:
    """ualinkctl's --json document: {"mount", "accels": [{render, minor, accel_id, …}],
    "fabric"?, "data_plane"?} with `sections`' keys in each accel."""
    sections = list(sections)
    accels = []
    for r in m.renders:
        entry: dict[str, object] = {"render": r, "minor": m.minor(r)}
        if "state" not in sections:
            entry["accel_id"] = int(m.read(f"{m.ualink_dir(r)}/accel_id").strip())
        for s in sections:
            entry.update(SECTIONS[s](m, r))
        accels.append(entry)
    doc: dict[str, object] = {"mount": os.path.abspath(m.path), "accels": accels}
    if "peers" in sections:
        doc["fabric"] = m.fabric()
        doc["data_plane"] = m.data_plane()
    return doc


def node_report(root: str | os.PathLike[str]) -> dict[str, object]:
    """Everything `ualinkctl --mount ROOT --json all` prints, for the node mounted at `root`."""
    return collect(Mount(os.fspath(root)), SECTIONS)


def node_leaks(root: str | os.PathLike[str], name: str) -> list[str]:
    """What the node mounted at `root` still holds (GEM objects, exports, imports, open
    files, NPA ranges), one line each naming `name` and the render node; any node mount,
    in a pod or not."""
    m = Mount(os.fspath(root))
    found = []
    for r in m.renders:
        where = f"{name} {r}"
        held = {"objects": m.table(r, "gem_objects"), "exports": m.table(r, "ualink_exports"),
                "imports": m.table(r, "ualink_imports"), "clients": m.table(r, "clients")}
        found += [f"{where} {key}: {rows}" for key, rows in held.items() if rows]
        npa = m.npa(r)
        if npa["used_pages"] or npa["mappings"]:
            found.append(f"{where} npa: {npa}")
    return found


# -- the pod -----------------------------------------------------------------------------------


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class PodNodeInfo:
    """One node of a pod, as a reader finds it."""

    name: str
    address: str  # host:port of a `ualinkd pod` node; the netns node's IP
    accels: tuple[int, ...]
    # where this process reads the node's files; None: not running, or in another container
    mount: str | None
    # in a pod of containers, a node in another container: the name of this container's
    # node, through whose links alone this one is seen (its mount is not here)
    seen_from: str | None = None


@dataclass(frozen=True)
class NetnsNodeState:
    """One node of pod.json."""

    name: str
    index: int
    netns: str
    ip: str
    pid: int | None
    mount: str  # inside the daemon's mount namespace
    accels: tuple[int, ...]
    bridge_port: str

    @property
    def root(self) -> str | None:
        """The node's mount as the host reaches it (through the daemon's mount
        namespace); None when the daemon is not running."""
        if self.pid is None or not pid_alive(self.pid):
            return None
        return f"/proc/{self.pid}/root{self.mount}"


@dataclass(frozen=True)
class NetnsPodState:
    """pod.json in a namespaced pod's state directory: what `python -m ualinkd.testing`,
    `ualinkctl pod` and `ualinkd run` need to reach the pod and its nodes (no key: that is
    pod.toml's)."""

    prefix: str
    owner: int  # the pid of the process that runs the pod
    fabric_netns: str
    nodes: tuple[NetnsNodeState, ...]

    def save(self, pod_dir: Path) -> None:
        """Replaced atomically: a reader never sees half of it."""
        tmp = pod_dir / f"{POD_STATE_FILE}.tmp"
        tmp.write_text(json.dumps(asdict(self), indent=1))
        tmp.replace(pod_dir / POD_STATE_FILE)

    @classmethod
    def load(cls, pod_dir: str | os.PathLike[str]) -> NetnsPodState:
        try:
            state = json.loads((Path(pod_dir) / POD_STATE_FILE).read_text())
            nodes = tuple(NetnsNodeState(**dict(n, accels=tuple(n["accels"])))
                          for n in state["nodes"])
            return cls(state["prefix"], state["owner"], state["fabric_netns"], nodes)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ReadError(f"{pod_dir}: not a running pod's directory ({e})") from None


def pod_nodes(path: str) -> list[PodNodeInfo]:
    """Every node of the pod at `path`: a `ualinkd pod` root or its pod.toml (node NAME is
    mounted at ROOT/NAME), or the state directory of a namespaced pod (its pod.json; the
    mount is reached through the daemon's /proc/<pid>/root, None when it is not running)."""
    from .config import ConfigError, PodConfig

    if os.path.isfile(os.path.join(path, POD_STATE_FILE)):
        return [PodNodeInfo(n.name, n.ip, n.accels, n.root)
                for n in NetnsPodState.load(path).nodes]
    toml = os.path.join(path, "pod.toml") if os.path.isdir(path) else path
    root = os.path.dirname(os.path.abspath(toml))
    if not os.access(toml, os.R_OK) and os.path.exists(toml):
        # pod.toml holds the key (mode 0600): the pod's key-less list of nodes instead
        return _public_nodes(root, toml)
    try:
        config = PodConfig.load(toml)
    except ConfigError as e:
        raise ReadError(str(e)) from None
    nodes = [PodNodeInfo(n.name, n.address, tuple(a.accel_id for a in n.accels),
                         os.path.join(root, n.name)) for n in config.nodes]
    here = container_node(n.name for n in nodes)
    if here is not None and not any(n.mount and os.path.isdir(n.mount) for n in nodes):
        # A pod of containers: each node's mount is in its own container. This one's is
        # here; the others are seen through this node's links.
        me, mount = here
        nodes = [replace(n, mount=mount) if n.name == me else
                 replace(n, mount=None, seen_from=me) for n in nodes]
    return nodes


def container_node(names: Iterable[str]) -> tuple[str, str] | None:
    """(name, mount) of the node whose container this is: the image sets UALINK_MOUNT, and
    the node is $UALINK_NODE or the host name, as the entrypoint takes it (None elsewhere,
    or when the pod has no such node)."""
    mount = os.environ.get("UALINK_MOUNT")
    if not mount:
        return None
    name = os.environ.get("UALINK_NODE") or socket.gethostname()
    return (name, mount) if name in set(names) else None


def _public_nodes(root: str, toml: str) -> list[PodNodeInfo]:
    """The nodes `ualinkd pod` lists in ROOT/.nodes.json (readable by all), for a user who
    may not read its pod.toml."""
    try:
        with open(os.path.join(root, NODES_FILE)) as f:
            nodes = json.load(f)["nodes"]
        return [PodNodeInfo(str(n["name"]), str(n["address"]),
                            tuple(int(a) for a in n["accels"]),
                            os.path.join(root, str(n["name"]))) for n in nodes]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ReadError(f"{toml}: not readable by this user (it holds the pod key), and no "
                        f"{NODES_FILE} beside it ({e})") from None
