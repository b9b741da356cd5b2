"""`ualinkctl`: look at and steer a running node through its mount (the sys/ tree only).

Reading (ualinkd/podinfo.py, the library every reader shares): the 12 sysfs attributes and
the debugfs files of each render node are parsed into typed dicts (`--json`: one stable
document) or printed as aligned tables. Steering: the
writable files the kernel has too (config/ + commit, ualink_drop_msg). Every failure is one
line on stderr that says what was refused and why; exit status 1, usage errors 2.
`main(argv) -> int` so tests call it directly; `entry()` is the console script.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
from collections.abc import Callable

from .. import __version__, sysfs
from ..bounded import bounded
from ..podinfo import (
    SECTIONS,
    Mount,
    PodNodeInfo,
    collect,
    link_word,
    msg_names,
    pod_nodes,
)
from ..podinfo import ReadError as CtlError
from ..podinfo import errname as _errname
from ..podinfo import parse_line as parse_line
from ..ualink.protocol import MsgType
from ..ualink.state import (
    AccelState,
    AddrMode,
    PpodInfo,
    VpodInfo,
    config_refusal,
    why_error,
)

# A failure to report as one line (exit status 1) is a CtlError: the reading library's
# ReadError, so a read and a refused write fail alike.

# -- parsing the command line ----------------------------------------------------------------


# The formats are the daemon's own (ualinkd/sysfs.py); these names are ualinkctl's API.
SYSFS_ATTRS = sysfs.UALINK_ATTRS
DEBUGFS_FORMATS = sysfs.DEBUGFS
_ids = sysfs.ids


def msg_type(word: str) -> MsgType:
    """HELLO … NPA_RELEASE, any case, or the type's number."""
    try:
        return MsgType(int(word, 0)) if word[:1].isdigit() else MsgType[word.upper()]
    except (KeyError, ValueError):
        raise argparse.ArgumentTypeError(
            f"{word!r} is not a message type (one of {', '.join(m.name for m in MsgType)})"
        ) from None


def accel_ids(text: str) -> list[int]:
    try:
        ids = sorted(set(_ids(text)))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of accel ids") from None
    if not ids or not all(0 <= i < 256 for i in ids):
        raise argparse.ArgumentTypeError(f"{text!r}: accel ids are 0..255, at least one")
    return ids


def _pending_vpod(accel: dict[str, object], pending: dict[str, object]
                  ) -> tuple[AccelState, PpodInfo, VpodInfo]:
    """The accel's state, pPod and pending vPod as the daemon's state machine sees them,
    from its sysfs attributes and config/ files."""
    aid, ppod_size, size = accel["accel_id"], accel["ppod_size"], pending["vpod_size"]
    members = pending["vpod_active_accels"]
    assert isinstance(aid, int) and isinstance(ppod_size, int) and isinstance(size, int)
    assert isinstance(members, list)
    modes = {m.sysfs: m for m in AddrMode}
    vpod_id = pending.get("vpod_id", 1)  # only a vPod being joined is ever refused
    assert isinstance(vpod_id, int)
    return (next((s for s in AccelState if s.sysfs == accel["accel_state"]), AccelState.ERROR),
            PpodInfo(accel_id=aid, ppod_size=ppod_size),
            VpodInfo(vpod_id, size, modes.get(str(pending["addr_mode"]), AddrMode.INVALID),
                     frozenset(members)))


def explain_vpod_refusal(accel: dict[str, object], pending: dict[str, object]) -> str:
    """Why config/commit said EINVAL, by the daemon's own checks (ualink/state.py
    `config_refusal`, §7.1: the accel is below PPOD_CONFIGURED, or the vPod is invalid):
    `accel` is the accel's sysfs attributes, `pending` its config/ files. An accel in error
    is not refused: the commit runs and leaves it in error unless it leaves its vPod (§5.9)."""
    why = config_refusal(*_pending_vpod(accel, pending))
    return (f"accel {accel['accel_id']} is {accel['accel_state']}; "
            f"{why or 'the daemon refused the configuration'}")


# -- the render node a command steers -------------------------------------------------------


def pick(m: Mount, render: str | None) -> str:
    """`--render`: renderD<n> or <n>; may be left out on a node with one accel."""
    if render is None:
        if len(m.renders) == 1:
            return m.renders[0]
        raise UsageError(f"--render is needed: this node has {', '.join(m.renders)}")
    name = render if render.startswith("renderD") else f"renderD{render}"
    if name not in m.renders:
        raise UsageError(f"no {name} on this node (it has {', '.join(m.renders)})")
    return name


class UsageError(Exception):
    """A command line that cannot mean anything on this node (exit status 2)."""


# -- tables for people ---------------------------------------------------------------------------


def _size(n: object) -> str:
    if not isinstance(n, int):
        return str(n)
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):g} {unit}"
    return f"{n} B"


def _cell(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, list):
        return ",".join(map(str, v)) or "-"
    return str(v)


def format_table(header: list[str], rows: list[list[object]]) -> str:
    """Aligned columns: numbers right-aligned, everything else left-aligned."""
    cells = [header] + [[_cell(v) for v in r] for r in rows]
    numeric = [all(isinstance(r[i], int) and not isinstance(r[i], bool) for r in rows)
               for i in range(len(header))]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    out = []
    for r in cells:
        out.append("  ".join((v.rjust(w) if num else v.ljust(w))
                             for v, w, num in zip(r, widths, numeric, strict=True)).rstrip())
    return "\n".join(out)


def _rows(doc: dict, key: str, cols: list[str],
          fmt: dict[str, Callable[[object], object]] | None = None) -> list[list[object]]:
    fmt = fmt or {}
    rows = []
    for a in doc["accels"]:
        for item in a[key]:
            rows.append([a["render"], a["accel_id"]]
                        + [fmt.get(c, lambda v: v)(item.get(c)) for c in cols])
    return rows


def _fence_error(v: object) -> str:
    """A fence error as -ENAME (0: none)."""
    return f"-{errno.errorcode.get(-v, -v)}" if isinstance(v, int) and v < 0 else str(v)


def render_text(doc: dict, sections: list[str]) -> str:
    parts: list[str] = []

    def add(title: str, header: list[str], rows: list[list[object]], empty: str,
            footer: str = "") -> None:
        body = format_table(header, rows) if rows else f"({empty})"
        body += f"\n{footer}" if footer else ""
        titled = len(sections) > 1 or bool({"objects", "kfd"} & set(sections))  # 2 tables each
        parts.append(f"{title}\n{body}" if titled else body)

    accels = doc["accels"]
    if "state" in sections:
        cols = ["accel_state", "vpod_id", "vpod_size", "vpod_active_accels", "addr_mode",
                "ppod_size", "local_accels", "bandwidth", "latency"]
        add("state", ["render", "accel", "state", "vpod", "vpod_size", "members", "addr_mode",
                      "ppod_size", "local", "bandwidth", "latency"],
            [[a["render"], a["accel_id"]] + [a[c] for c in cols] for a in accels], "no accels",
            f"pPod {accels[0]['ppod_id']} ({accels[0]['link_type']})" if accels else "")
    if "peers" in sections:
        links = ", ".join(f"{x['node']} {link_word(x)}" for x in doc.get("fabric", []))
        dp = doc.get("data_plane") or {}
        assert isinstance(dp, dict)
        add("peers", ["render", "accel", "remote", "state", "generation"],
            _rows(doc, "peers", ["accel", "state", "generation"]), "no peer connections",
            f"fabric links: {links or 'none (no peer nodes)'}\n"
            f"data plane: {dp.get('channels', 0)} channels, {dp.get('fast_loads', 0)} loads "
            f"carried, {dp.get('served', 0)} served, {dp.get('fallbacks', 0)} handed back")
    if "exports" in sections:
        add("exports", ["render", "accel", "handle_lo", "handle_hi", "bo", "size", "pins",
                        "importers"],
            _rows(doc, "exports", ["handle_lo", "handle_hi", "bo", "size", "pins", "importers"],
                  {"size": _size}), "no exports")
    if "imports" in sections:
        add("imports", ["render", "accel", "handle_lo", "handle_hi", "exporter", "state",
                        "pages"],
            _rows(doc, "imports", ["handle_lo", "handle_hi", "exporter", "state", "pages"]),
            "no imports")
    if "npa" in sections:
        add("npa", ["render", "accel", "used_pages", "mappings"],
            [[a["render"], a["accel_id"], a["npa"]["used_pages"], a["npa"]["mappings"]]
             for a in accels], "no accels")
    if "faults" in sections:
        add("faults", ["render", "accel", "gpu_faults", "drop_msg", "drop_next"],
            [[a["render"], a["accel_id"], a["faults"]["gpu_faults"],
              None if a["faults"]["drop_msg"] is None else f"{a['faults']['drop_msg']:#x}",
              a["faults"]["drop_next"]] for a in accels], "no accels")
    if "objects" in sections:
        add("objects", ["render", "accel", "id", "size", "refcount", "handle_count"],
            _rows(doc, "objects", ["id", "size", "refcount", "handle_count"],
                  {"size": _size}), "no GEM objects")
        add("clients", ["render", "accel", "pid", "uid", "handles"],
            _rows(doc, "clients", ["pid", "uid", "handles"]), "no open render nodes")
    if "kfd" in sections:
        add("kfd processes", ["render", "accel", "pid", "gpu_id", "vm", "vm_mappings",
                              "allocations", "events"],
            _rows(doc, "kfd_processes", ["pid", "gpu_id", "vm_file_pid", "vm_mappings",
                                         "allocations", "events"],
                  {"vm_file_pid": lambda v: f"render file of pid {v}" if v else "none"}),
            "no KFD processes")
        add("kfd", ["render", "accel", "pid", "handle", "va", "size", "mapped"],
            _rows(doc, "kfd", ["pid", "handle", "va", "size", "mapped"],
                  {"size": _size, "handle": lambda v: f"{v:#x}", "va": lambda v: f"{v:#x}"}),
            "no KFD allocations")
        add("kfd queues", ["render", "accel", "pid", "gpu_id", "queue", "type", "ring",
                           "ring_size", "rptr", "wptr", "packets", "state"],
            _rows(doc, "kfd_queues", ["pid", "gpu_id", "queue_id", "type", "ring",
                                      "ring_size", "rptr", "wptr", "packets", "state"],
                  {"ring": lambda v: f"{v:#x}", "ring_size": _size}),
            "no KFD queues")
    if "cs" in sections:
        add("cs", ["render", "accel", "pid", "ctx", "guilty", "submitted", "signaled",
                   "submissions", "ibs", "packets", "last_error"],
            _rows(doc, "cs", ["pid", "ctx_id", "guilty", "submitted", "signaled",
                              "submissions", "ibs", "packets", "last_error"],
                  {"guilty": lambda v: "yes" if v else "no",
                   "last_error": _fence_error}),
            "no AMDGPU_CS contexts")
    return "\n\n".join(parts)


# -- steering ------------------------------------------------------------------------------------


def drop_next(m: Mount, render: str, msg: MsgType) -> str:
    rel = m.debugfs(render, sysfs.DROP_MSG)
    bitmap = m.drop_msg(render) | 1 << int(msg)
    try:
        m.write(rel, sysfs.show_drop_msg(bitmap))
    except OSError as e:
        raise CtlError(f"{render}: could not arm the drop of {msg.name}: writing {rel}: "
                       f"{e.strerror} ({_errname(e)})") from None
    return (f"{render}: the next {msg.name} it receives is dropped "
            f"(ualink_drop_msg {bitmap:#x}: {', '.join(msg_names(bitmap))})")


def _config_write(m: Mount, render: str, attr: str, value: str, what: str) -> None:
    rel = f"{m.ualink_dir(render)}/config/{attr}"
    try:
        m.write(rel, value)
    except OSError as e:
        raise CtlError(f"{what} not committed: {render} refused config/{attr} = "
                       f"{value.strip()!r}: {e.strerror} ({_errname(e)})") from None


def commit_vpod(m: Mount, render: str, vpod_id: int, members: list[int] | None,
                addr_mode: str | None, force: bool = False) -> str:
    """Write the pending vPod (members/size/addr_mode when given, then vpod_id) and commit.
    vpod_id 0 leaves the vPod (deactivate)."""
    accel = m.sysfs(render)
    aid, cur = accel["accel_id"], accel["vpod_id"]
    what = f"vPod {vpod_id}" if vpod_id else f"leaving vPod {cur}"
    if vpod_id and cur not in (0, vpod_id) and not force:
        # The kernel's config update handler puts an accel that moves between two vPods
        # without leaving first into ERROR (§5.9); make that a deliberate act (--force).
        raise CtlError(f"{what} not committed: accel {aid} is {accel['accel_state']} in vPod "
                       f"{cur}; leave it first (ualinkctl deactivate), or --force to send "
                       "the accel to error as the kernel would")
    if members is not None:
        _config_write(m, render, "vpod_active_accels", " ".join(map(str, members)) + "\n", what)
        _config_write(m, render, "vpod_size", f"{len(members)}\n", what)
    if addr_mode is not None:
        _config_write(m, render, "addr_mode", addr_mode, what)
    _config_write(m, render, "vpod_id", f"{vpod_id}\n", what)
    rel = f"{m.ualink_dir(render)}/config/commit"
    try:
        m.write(rel, "true\n")
    except OSError as e:
        why = (explain_vpod_refusal(accel, m.pending_config(render))
               if e.errno == errno.EINVAL else e.strerror)
        raise CtlError(f"{what} not committed: {why} ({_errname(e)})") from None
    after = m.sysfs(render)
    state = after["accel_state"]
    if state == "error" and force and cur not in (0, vpod_id):
        return (f"{render}: accel {aid} moved from vPod {cur} to {vpod_id} without leaving "
                "first and is now error, as the kernel does (ualinkctl deactivate recovers it)")
    if state == "error":  # why, by the §5.9 config-update rules (ualink/state.py)
        before = next(s for s in AccelState if s.sysfs == accel["accel_state"])
        assert isinstance(cur, int)
        raise CtlError(f"{what} committed, and accel {aid} is now error: "
                       f"{why_error(before, cur, vpod_id)}"
                       + ("" if not cur else "; ualinkctl deactivate recovers it"))
    if not vpod_id:
        return f"{render}: accel {aid} left vPod {cur}; now {state}"
    members_now = ",".join(map(str, after["vpod_active_accels"]))  # type: ignore[call-overload]  # a list
    note = "" if state == "active" else (
        " (activation waits for the other local accels of the vPod to be configured)")
    return (f"{render}: accel {aid} in vPod {vpod_id} (members {members_now}, "
            f"{after['addr_mode']}); now {state}{note}")


# -- command line --------------------------------------------------------------------------------

READ_COMMANDS = {
    "state": "accel states and pPod/vPod information",
    "peers": "per accel: remote accels, connection states, generations; fabric links",
    "exports": "exported handles: BO, size, pins, importers",
    "imports": "imported handles: exporter, state, pages",
    "npa": "NPA space usage",
    "faults": "GPU fault counters and pending message drops",
    "objects": "GEM objects and the clients holding render nodes open",
    "kfd": "KFD processes (their VM, allocation and event counts) and allocations: handle, "
           "GPU VA, size, the GPUs it is mapped on",
    "cs": "AMDGPU_CTX contexts of render files: guilty, last sequence submitted/signaled, "
          "submissions, IBs and packets executed, last fence error",
    "all": "everything above, one document",
}


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: the options work before or after the subcommand without overwriting.
    common.add_argument("--mount", default=argparse.SUPPRESS,
                        help="the node's mount directory (default: $UALINK_MOUNT)")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="one JSON document (stable keys, typed values)")
    p = argparse.ArgumentParser(
        prog="ualinkctl", parents=[common],
        description="Look at and steer a running ualinkd node through its mount.")
    p.add_argument("--version", action="version", version=f"ualinkctl {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    ps = sub.add_parser("pod", help="every node of a pod in one table (no --mount needed)")
    # `status` is the only thing `pod` does (and its default): `ualinkctl pod ROOT` too
    # [status] [POD]: argparse cannot tell two optional positionals apart, _pod_where can
    ps.add_argument("pod", nargs="*", metavar="[status] POD.toml|POD-DIR",
                    help="a `ualinkd pod` root or its pod.toml (nodes mounted beside it), or "
                         "a namespaced pod's state directory (`ualinkd pod --netns` prints it); "
                         "in a node's container, its pod config ($UALINK_CONFIG) by default")
    ps.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                    help="one JSON document")
    ps.add_argument("--watch", type=float, nargs="?", const=1.0, default=None, metavar="S",
                    help="print again every S seconds (default 1) until Ctrl-C")
    for name, text in READ_COMMANDS.items():
        sub.add_parser(name, parents=[common], help=text, description=text)

    def render_arg(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--render", help="renderD<n> or <n> (default: the node's only one)")

    d = sub.add_parser("drop-next", parents=[common],
                       help="drop the next message of a type that the accel receives")
    d.add_argument("msg_type", type=msg_type, metavar="MSG_TYPE",
                   help=", ".join(mt.name for mt in MsgType))
    render_arg(d)
    v = sub.add_parser("vpod", parents=[common], help="put the accel in a vPod (config/ + commit)")
    render_arg(v)
    v.add_argument("--id", type=int, required=True, help="vPod id (1..2^32-1)")
    v.add_argument("--members", type=accel_ids, required=True, metavar="ID,ID,…",
                   help="accel ids of the vPod, this accel among them")
    v.add_argument("--addr-mode", choices=["source-aliasing", "source-identification"],
                   default=None, help="default: leave the pending addr_mode as it is")
    v.add_argument("--force", action="store_true",
                   help="commit even from another vPod (the kernel then puts the accel in error)")
    de = sub.add_parser("deactivate", parents=[common], help="leave the vPod (vpod_id 0 + commit)")
    render_arg(de)
    re_ = sub.add_parser("reactivate", parents=[common],
                         help="join a vPod again with the pending members (vpod_id N + commit)")
    render_arg(re_)
    re_.add_argument("--id", type=int, required=True, help="the vPod id to join")
    return p


def _inside_a_node() -> str | None:
    """Inside a namespace node (ualinkd.netns, `ualinkd pod --netns`) the node's sys/ tree
    is the plain /sys: then the mount is "/", found without --mount."""
    try:
        names = bounded(lambda: os.listdir("/" + sysfs.DRM_CLASS), "/sys/class/drm")
    except OSError:
        return None
    render = next((n for n in names if n.startswith("renderD")), None)
    if render is None:
        return None
    state = os.path.join("/", sysfs.ualink_file(int(render[len("renderD"):]), "accel_state"))
    try:
        return "/" if bounded(lambda: os.path.isfile(state), state) else None
    except OSError:
        return None


def _pod_where(words: list[str]) -> str:
    """`ualinkctl pod [status] [POD]`'s POD; in a node's container ($UALINK_CONFIG set, as the
    image sets it) the node's own pod config when none is given."""
    if words[:1] == ["status"] and not (len(words) == 1 and os.path.exists("status")):
        words = words[1:]
    if len(words) > 1:
        raise UsageError(f"pod: one POD expected, not {' '.join(words)}")
    if words:
        return words[0]
    config = os.environ.get("UALINK_CONFIG")
    if config and os.path.isfile(config):
        return config
    raise UsageError("pod: which pod? give its root, its pod.toml or a namespaced pod's "
                     "state directory")


def pod_status(path: str) -> list[dict[str, object]]:
    """One row per node: whether it serves (every read bounded: a stopped node is "not
    answering"), its accels' states and its links."""
    rows: list[dict[str, object]] = []
    nodes = pod_nodes(path)
    for node in nodes:
        row: dict[str, object] = {"node": node.name, "address": node.address,
                                  "accels": list(node.accels), "mount": node.mount,
                                  "status": "serving", "states": [], "links": {},
                                  "first_use": {}}
        if node.seen_from is not None:
            rows.append(_seen_from(row, node.seen_from, nodes))
            continue
        try:
            if node.mount is None:
                raise CtlError("not running")
            m = Mount(node.mount)
            row["states"] = [str(m.sysfs(r).get("accel_state", "?")) for r in m.renders]
            try:
                states = sysfs.parse_fabric_states(m.read(sysfs.FABRIC_STATUS))
                row["links"] = {p: s == sysfs.FABRIC_UP for p, s in states.items()}
                # links on first use not up yet: down, but not the way a dropped link is
                row["first_use"] = {p: s for p, s in states.items()
                                    if s in sysfs.FABRIC_NOT_YET}
            except CtlError:
                row["links"] = None  # debugfs is root only
        except CtlError as e:
            text = str(e)
            row["status"] = ("not answering (stopped?)" if "not answering" in text
                             else "not running" if text == "not running"
                             else "gone (its mount is dead)" if "ENOTCONN" in text
                             else "not mounted" if "does not exist" in text else text)
        rows.append(row)
    return rows


def _seen_from(row: dict[str, object], me: str, nodes: list[PodNodeInfo]) -> dict[str, object]:
    """A node in another container, as this container's node sees it: serving when its
    link to us is up (it answered the handshake and keeps answering heartbeats)."""
    mine = next(n.mount for n in nodes if n.name == me)
    row["seen_from"] = me
    try:
        links = sysfs.parse_fabric(Mount(str(mine)).read(sysfs.FABRIC_STATUS))
    except CtlError as e:
        row["status"] = f"not known here ({me}: {e})"
        return row
    row["status"] = (f"serving (link from {me} up)" if links.get(str(row["node"]))
                     else f"link from {me} down")
    row["links"] = None if links.get(str(row["node"])) is None else {
        me: bool(links[str(row["node"])])}
    return row


def render_pod_status(rows: list[dict[str, object]]) -> str:
    def links(row: dict[str, object]) -> str:
        up = row["links"]
        if up is None:
            return "(root only)"
        assert isinstance(up, dict)
        first_use = row.get("first_use") or {}
        assert isinstance(first_use, dict)
        return " ".join(f"{p}:{'up' if ok else first_use.get(p, 'DOWN')}"
                        for p, ok in up.items())
    return format_table(["node", "address", "accels", "status", "state", "links"],
                        [[r["node"], r["address"],
                          ",".join(map(str, r["accels"])),  # type: ignore[call-overload]  # list
                          r["status"],
                          ",".join(r["states"]) or "-", links(r) or "-"]  # type: ignore[arg-type]  # list
                         for r in rows])


def _pod_command(args: argparse.Namespace, as_json: bool) -> int:
    import time

    # --watch on a terminal redraws in place (as watch(1)); to a file or a pipe each table
    # follows the last one. Either way each says when it was taken.
    redraw = args.watch is not None and not as_json and sys.stdout.isatty()
    while True:
        where = _pod_where(args.pod)
        rows = pod_status(where)
        if as_json:
            doc: dict[str, object] = {"pod": where, "nodes": rows}
            if args.watch is not None:
                doc["time"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            text = json.dumps(doc, indent=2)
        else:
            text = render_pod_status(rows)
            if args.watch is not None:
                text = (f"{where} at {time.strftime('%H:%M:%S')} (every {args.watch:g} s,"
                        f" Ctrl-C stops)\n{text}")
        print(("\x1b[H\x1b[2J" if redraw else "") + text, flush=True)
        if args.watch is None:
            return 0 if all(str(r["status"]).startswith("serving") for r in rows) else 1
        try:
            time.sleep(args.watch)
        except KeyboardInterrupt:
            return 0
        if not redraw:
            print()


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help (0) and usage errors (2) as return values
        return e.code if isinstance(e.code, int) else 2
    if args.command == "pod":
        try:
            return _pod_command(args, getattr(args, "json", False))
        except CtlError as e:
            print(f"ualinkctl: {e}", file=sys.stderr)
            return 1
        except UsageError as e:
            print(f"ualinkctl: error: {e}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            return 130
    mount = getattr(args, "mount", None) or os.environ.get("UALINK_MOUNT") or _inside_a_node()
    as_json = getattr(args, "json", False)
    if not mount:
        parser.print_usage(sys.stderr)
        print("ualinkctl: error: --mount DIR is needed (or $UALINK_MOUNT)", file=sys.stderr)
        return 2
    if args.command in ("vpod", "reactivate") and not 1 <= args.id <= 0xFFFFFFFF:
        print(f"ualinkctl: error: --id {args.id}: a vPod id is 1..4294967295 "
              "(0 is no vPod: use deactivate)", file=sys.stderr)
        return 2
    try:
        m = Mount(mount)
        if args.command in READ_COMMANDS:
            sections = list(SECTIONS) if args.command == "all" else [args.command]
            doc = collect(m, sections)
            print(json.dumps(doc, indent=2) if as_json else render_text(doc, sections))
            return 0
        render = pick(m, args.render)
        if args.command == "drop-next":
            msg = drop_next(m, render, args.msg_type)
        elif args.command == "vpod":
            msg = commit_vpod(m, render, args.id, args.members, args.addr_mode, args.force)
        elif args.command == "deactivate":
            msg = commit_vpod(m, render, 0, None, None)
        else:
            msg = commit_vpod(m, render, args.id, None, None)
        if as_json:
            doc = collect(m, ["state", "faults"])
            # JSON-shaped (dict[str, object]): "accels" is a list of dicts
            doc["accels"] = [a for a in doc["accels"] if a["render"] == render]  # type: ignore[attr-defined]
            doc["message"] = msg
            print(json.dumps(doc, indent=2))
        else:
            print(msg)
        return 0
    except UsageError as e:
        print(f"ualinkctl: error: {e}", file=sys.stderr)
        return 2
    except CtlError as e:
        print(f"ualinkctl: {e}", file=sys.stderr)
        return 1


def entry() -> None:
    sys.exit(main())
