"""`ualinkd timeline`: a recording (`ualinkd record`) or a `--trace=json` file as a picture,
Chrome's Trace Event JSON (what Perfetto and chrome://tracing open, and ROCm's profilers
write), or as the `--trace` text in start-time order.

The picture: one process track per node; in it one thread per client pid (its ioctls, GPU
loads/stores, opens and closes as slices, "ph": "X", with their decoded arguments), one per
user queue (queue records), and the fabric's sends and receipts; each fabric message is a
flow arrow ("ph": "s" → "f") from its send on one node to its receipt on the other. A record
kind this build does not know becomes a slice (or an instant, without a duration) with its
fields as arguments, on its pid's thread or a thread of its kind.

The files are read by the replay's reader (`replay/session.py`: the same checks, the same
refusal of a schema newer than this build); everything here past `read` is pure.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import Any, BinaryIO

from .abi.ioctls import IoctlSpec, all_entries, kfd_lookup
from .replay.session import RecordingError, index_records
from .trace import FabricRecord, FileRecord, GpuAccessRecord, Record, TraceRecord, timestamp

Rec = dict[str, Any]
Event = dict[str, Any]

# What libdrm asks when it finds and opens a device (drmGetVersion, drmGetCap,
# drmSetClientCap, amdgpu_device_initialize's AMDGPU_INFO queries): a process that made no
# other call only looked (`--no-discovery` leaves it out).
DISCOVERY_IOCTLS = frozenset({"VERSION", "GET_CAP", "SET_CLIENT_CAP", "GET_UNIQUE",
                              "GET_MAGIC", "AMDGPU_INFO", "AMDKFD_IOC_GET_VERSION"})
_SYNTHETIC_TID = 1 << 23  # above any Linux pid (PID_MAX_LIMIT is 2**22): threads of no pid
_ARG_STR_MAX = 256  # characters of a string argument kept (hex dumps of data, mostly)
_DATA_ARG = 64  # bytes of a GPU access's data kept as an argument


# -- reading ---------------------------------------------------------------------------------
@dataclasses.dataclass(slots=True)
class Loaded:
    """A file's records in start-time order (file order among equal times; a `lost` record,
    which has no time, at the time of the record before it), and the line of a partial last
    record left out (a recorder killed mid-write)."""

    records: list[Rec]
    partial: int | None = None


def _lines_at(f: BinaryIO) -> Iterator[tuple[int, bytes]]:
    at = f.tell()
    for line in f:
        yield at, line
        at += len(line)


def read(path: str) -> Loaded:
    """The records of a recording or a `--trace=json` file, checked as a replay checks them
    (RecordingError names the line and field of a bad one)."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise RecordingError(f"cannot read it ({e.strerror})") from None
    with f:
        index = index_records(_lines_at(f))
        recs = []
        for entry in index.records:
            f.seek(entry["at"])
            recs.append(json.loads(f.readline()))
    return Loaded(in_start_order(recs), index.partial)


def in_start_order(recs: Iterable[Rec]) -> list[Rec]:
    timed: list[tuple[float, int, Rec]] = []
    last = 0.0
    for n, rec in enumerate(recs):
        t = rec.get("time")
        last = t if isinstance(t, int | float) and not isinstance(t, bool) else last
        timed.append((last, n, rec))
    return [r for _, _, r in sorted(timed, key=lambda x: (x[0], x[1]))]


def without_discovery(recs: list[Rec]) -> list[Rec]:
    """`recs` less libdrm's and libhsakmt's device discovery: the processes that only
    discovered devices (every ioctl of theirs in DISCOVERY_IOCTLS, no GPU access nor anything
    else), with their opens and closes, and the discovery calls of every other process (a
    runtime's own start-up asks them too: `make demo`'s libhsakmt clients do)."""
    calls: dict[tuple[str, int], set[str]] = defaultdict(set)
    for r in recs:
        if r["type"] in ("open", "release", "lost", "fabric") or "pid" not in r:
            continue
        calls[(r["node"], r["pid"])].add(r["ioctl"] if r["type"] == "ioctl" else "")
    lookers = {k for k, names in calls.items() if names and names <= DISCOVERY_IOCTLS}
    theirs = {(r["node"], r["file"]) for r in recs
              if r["type"] == "open" and (r["node"], r["pid"]) in lookers}
    return [r for r in recs
            if not (r["type"] == "release" and (r["node"], r.get("file")) in theirs)
            and not ("pid" in r and r["type"] != "release"
                     and (r.get("node"), r["pid"]) in lookers)
            and not (r["type"] == "ioctl" and r["ioctl"] in DISCOVERY_IOCTLS)]


# -- text ------------------------------------------------------------------------------------
_SPECS: dict[str, IoctlSpec] = {s.name: s for s in all_entries()}


def _spec(rec: Rec) -> IoctlSpec | None:
    if rec.get("minor") == 0:  # node.py's KFD calls
        return kfd_lookup(int(rec.get("nr", -1)))
    return _SPECS.get(rec["ioctl"])


def as_record(rec: Rec) -> Record | None:
    """The trace's own record back from its JSON (what its `text()` prints), or None for a
    kind this build has no record class for."""
    kind = rec["type"]
    t, d = rec.get("time", 0.0), rec.get("duration", 0.0)
    if kind == "ioctl":
        return TraceRecord(rec["pid"], rec["node"], rec.get("minor", 0), int(rec["cmd"], 16),
                           _spec(rec), bytes.fromhex(rec["in_hex"]), rec["result"],
                           bytes.fromhex(rec["out_hex"]), rec.get("accel"), t, d,
                           rec.get("file"))
    if kind == "gpu":
        return GpuAccessRecord(rec["pid"], rec["node"], rec.get("minor", 0), rec.get("accel"),
                               rec["op"], rec["va"], rec["length"], rec["result"],
                               bytes.fromhex(rec.get("data_hex", "")), t, d, rec.get("file"))
    if kind == "fabric":
        fields = {k: int(v, 16) if k.startswith("handle_") and isinstance(v, str) else v
                  for k, v in rec.get("fields", {}).items()}
        return FabricRecord(rec["node"], rec["direction"], rec["message"], rec["src_accel"],
                            rec["dst_accel"], rec.get("src_node"), rec.get("dst_node"), fields,
                            rec.get("result"), t, d)
    if kind in ("open", "release"):
        return FileRecord(kind, rec["pid"], rec["node"], rec["file"], rec.get("path", "?"),
                          rec.get("minor"), rec.get("token"), rec.get("key"),
                          rec.get("result", 0), t)
    return None


def text_line(rec: Rec) -> str:
    """The `--trace` text of one record; a kind with no record class prints its name and
    fields in the same shape."""
    if rec["type"] == "lost":
        return f"-- the recorder lost {rec.get('count', '?')} records here"
    known = as_record(rec)
    if known is not None:
        return known.text()
    t = rec.get("time")
    ts = timestamp(t) + " " if isinstance(t, int | float) and t else ""
    who = f"[pid {rec['pid']}] " if "pid" in rec else ""
    args = ", ".join(f"{k}={v}" for k, v in _generic_args(rec).items())
    return f"{ts}{who}{rec.get('node', '?')} {_generic_name(rec)}({args})"


# -- the Chrome Trace Event picture ----------------------------------------------------------
def _generic_name(rec: Rec) -> str:
    """QUEUE_DOORBELL for {"type": "queue", "event": "doorbell"}: the trace's own naming."""
    kind = str(rec["type"]).upper()
    event = rec.get("event") or rec.get("op")
    return f"{kind}_{str(event).upper()}" if isinstance(event, str) and event else kind


_NOT_ARGS = frozenset({"v", "type", "time", "duration", "node", "pid"})


def _short(v: Any) -> Any:
    if isinstance(v, str) and len(v) > _ARG_STR_MAX:
        return v[:_ARG_STR_MAX] + f"… ({len(v)} characters)"
    if isinstance(v, list):
        return [_short(x) for x in v[:64]] + ([f"… ({len(v)} items)"] if len(v) > 64 else [])
    if isinstance(v, dict):
        return {k: _short(x) for k, x in v.items()}
    return v


def _generic_args(rec: Rec) -> Rec:
    return {k: _short(v) for k, v in rec.items() if k not in _NOT_ARGS}


def _errno_args(rec: Rec) -> Rec:
    return {"result": rec.get("result"), **({"errno": rec["errno"]} if rec.get("errno") else {})}


def _args(rec: Rec) -> Rec:
    kind = rec["type"]
    if kind == "ioctl":
        return {"in": rec.get("in", {}), "out": rec.get("out", {}), **_errno_args(rec),
                "cmd": rec.get("cmd"), "file": rec.get("file"), "accel": rec.get("accel"),
                "device": "kfd" if rec.get("minor") == 0 else f"renderD{rec.get('minor')}"}
    if kind == "gpu":
        data = rec.get("data_hex", "")
        out = {"va": hex(rec["va"]), "length": rec["length"], **_errno_args(rec),
               "accel": rec.get("accel"), "file": rec.get("file"),
               "data": data[:2 * _DATA_ARG] + ("…" if len(data) > 2 * _DATA_ARG else "")}
        if rec.get("fault_va") is not None:
            out["fault_va"] = hex(rec["fault_va"])
        return out
    if kind == "fabric":
        return {"direction": rec["direction"],
                "from": f"{rec.get('src_node') or '?'}/accel{rec['src_accel']}",
                "to": f"{rec.get('dst_node') or '?'}/accel{rec['dst_accel']}",
                "fields": rec.get("fields", {}), **_errno_args(rec)}
    return _generic_args(rec)


def _name(rec: Rec) -> str:
    kind = rec["type"]
    if kind == "ioctl":
        return str(rec["ioctl"])
    if kind == "gpu":
        return f"GPU_{str(rec['op']).upper()}"
    if kind == "fabric":
        return str(rec["message"])
    if kind in ("open", "release"):
        return f"{'open' if kind == 'open' else 'close'} {rec.get('path', '?')}"
    return _generic_name(rec)


def _failed(rec: Rec) -> bool:
    r = rec.get("result")
    return isinstance(r, int) and not isinstance(r, bool) and r < 0


@dataclasses.dataclass(slots=True)
class _Slice:
    rec: Rec
    track: tuple[Any, ...]  # (node, thread key)
    ts: float  # µs from the first record
    dur: float | None  # None: an instant
    tid: int = 0
    flow: tuple[int, str] | None = None  # (id, "s" | "f")


class _Tracks:
    """Process ids per node, thread ids and names per thread key, lanes per track."""

    def __init__(self) -> None:
        self.nodes: dict[str, int] = {}
        self.names: dict[tuple[str, int], str] = {}
        self._synth: dict[tuple[str, tuple[Any, ...], int], int] = {}

    def pid(self, node: str) -> int:
        return self.nodes.setdefault(node, len(self.nodes) + 1)

    def tid(self, node: str, key: tuple[Any, ...], lane: int) -> int:
        if key[0] == "pid" and lane == 0:
            tid = int(key[1])  # the client's own pid, as a profiler would show it
        else:  # numbered per node in the order first seen, above any pid
            tid = self._synth.setdefault((node, key, lane), _SYNTHETIC_TID + sum(
                1 for n, _, _ in self._synth if n == node))
        if (node, tid) not in self.names:
            name = _thread_name(key)
            self.names[(node, tid)] = name if lane == 0 else f"{name} ({lane + 1})"
        return tid


def _thread_name(key: tuple[Any, ...]) -> str:
    if key[0] == "pid":
        return f"pid {key[1]}" if key[1] else "kernel (releases)"
    if key[0] == "queue":
        return f"pid {key[1]} queue {key[2]}" + (f" ({key[3]})" if key[3] else "")
    if key[0] == "fabric":
        return f"fabric {key[1]}"
    return str(key[1])


def _thread_key(rec: Rec, opener: dict[tuple[str, Any], int]) -> tuple[Any, ...]:
    kind = rec["type"]
    if kind == "fabric":
        return ("fabric", "send" if rec["direction"] == "send" else "receive")
    if "queue_id" in rec or "queue" in rec:
        qid = rec.get("queue_id", rec.get("queue"))
        return ("queue", rec.get("pid", 0), qid, rec.get("queue_type") or "")
    if kind == "release":  # FUSE's RELEASE comes from the kernel (pid 0): the opener's thread
        return ("pid", opener.get((rec["node"], rec.get("file")), rec.get("pid", 0)))
    if isinstance(rec.get("pid"), int):
        return ("pid", rec["pid"])
    return ("kind", kind)


def _flow_key(rec: Rec) -> tuple[Any, ...]:
    return (rec["message"], rec["src_accel"], rec["dst_accel"],
            json.dumps(rec.get("fields", {}), sort_keys=True))


def _pair_flows(slices: list[_Slice]) -> int:
    """Each receipt to the first unpaired send of the same message (type, ends, fields) on
    another node before it in the list (start order): a flow id each. How many paired."""
    waiting: dict[tuple[Any, ...], list[_Slice]] = defaultdict(list)
    for s in slices:
        if s.rec["type"] == "fabric" and s.rec["direction"] == "send":
            waiting[_flow_key(s.rec)].append(s)
    flows = 0
    for s in slices:
        if s.rec["type"] != "fabric" or s.rec["direction"] == "send":
            continue
        sends = waiting.get(_flow_key(s.rec), [])
        for i, send in enumerate(sends):
            if send.rec["node"] != s.rec["node"]:
                flows += 1
                send.flow, s.flow = (flows, "s"), (flows, "f")
                del sends[i]
                break
    return flows


def _lay_out(slices: list[_Slice], tracks: _Tracks) -> None:
    """Give each slice a tid: its track's lanes, a slice going to the first lane where it
    nests in (or follows) what is open there, a new lane otherwise (viewers need the slices
    of one thread properly nested: overlapping fabric round trips are not)."""
    by_track: dict[tuple[Any, ...], list[_Slice]] = defaultdict(list)
    for s in slices:
        by_track[s.track].append(s)
    for (node, *key), mine in by_track.items():
        lanes: list[list[float]] = []  # the ends of the slices open in each lane
        for s in sorted(mine, key=lambda s: (s.ts, -(s.dur or 0.0))):
            end = s.ts + (s.dur or 0.0)
            n = len(lanes)
            for i, stack in enumerate(lanes):
                while stack and stack[-1] <= s.ts:
                    stack.pop()
                if not stack or end <= stack[-1]:
                    n = i
                    break
            else:
                lanes.append([])
            if s.dur is not None:
                lanes[n].append(end)
            s.tid = tracks.tid(node, tuple(key), n)


def chrome_trace(recs: list[Rec], source: str = "") -> dict[str, Any]:
    """The Trace Event JSON object of `recs` (in start order, as `read` gives them)."""
    t0 = next((r["time"] for r in recs if isinstance(r.get("time"), int | float) and r["time"]),
              0.0)
    opener = {(r["node"], r["file"]): r["pid"] for r in recs if r["type"] == "open"}
    tracks = _Tracks()
    slices: list[_Slice] = []
    instants: list[Event] = []
    last = 0.0
    lost = 0
    for r in recs:
        if r["type"] == "lost":  # no node, no time: a global instant where it came
            lost += int(r.get("count", 0))
            instants.append({"name": f"recorder lost {r.get('count')} records",
                             "cat": "lost", "ph": "i", "s": "g", "ts": last, "pid": 0,
                             "tid": 0, "args": {"count": r.get("count")}})
            continue
        t = r.get("time")
        ts = round((t - t0) * 1e6, 3) if isinstance(t, int | float) and t else last
        last = ts
        tracks.pid(r.get("node", "?"))
        d = r.get("duration")
        # a receipt has no duration (it is a moment), but a flow must end on a slice: 1 µs
        dur: float | None = (round(d * 1e6, 3) if isinstance(d, int | float) and d > 0
                             else 1.0 if r["type"] in ("fabric", "ioctl", "gpu", "open",
                                                       "release") else None)
        slices.append(_Slice(r, (r.get("node", "?"), *_thread_key(r, opener)), ts, dur))
    flows = _pair_flows(slices)
    _lay_out(slices, tracks)
    events: list[Event] = []
    for s in slices:
        pid = tracks.pid(s.rec.get("node", "?"))
        ev: Event = {"name": _name(s.rec), "cat": s.rec["type"], "ts": s.ts, "pid": pid,
                     "tid": s.tid, "args": _args(s.rec)}
        if s.dur is None:
            ev.update(ph="i", s="t")
        else:
            ev.update(ph="X", dur=s.dur)
        if _failed(s.rec):
            ev["cname"] = "terrible"  # chrome://tracing's red; Perfetto keeps it as an arg
        events.append(ev)
        if s.flow is not None:
            fid, ph = s.flow
            flow: Event = {"name": _name(s.rec), "cat": "fabric", "ph": ph, "id": fid,
                           "ts": s.ts, "pid": pid, "tid": s.tid}
            if ph == "f":
                flow["bp"] = "e"  # bound to the receipt's slice, which starts at ts
            events.append(flow)
    events += instants
    # start order; at one time a slice before the flow event bound to it
    order = {"X": 0, "i": 0, "s": 1, "f": 1}
    events.sort(key=lambda e: (e["ts"], order[e["ph"]]))
    meta: list[Event] = []
    for node, pid in tracks.nodes.items():
        meta.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                     "args": {"name": node}})
        meta.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
                     "args": {"sort_index": pid}})
    for (node, tid), name in sorted(tracks.names.items(), key=lambda x: (x[0][0], x[0][1])):
        meta.append({"name": "thread_name", "ph": "M", "pid": tracks.pid(node), "tid": tid,
                     "args": {"name": name}})
    sends = sum(1 for s in slices if s.rec["type"] == "fabric"
                and s.rec["direction"] == "send")
    return {"traceEvents": meta + events, "displayTimeUnit": "ms",
            "otherData": {"source": source, "start_time": t0, "records": len(recs),
                          "nodes": list(tracks.nodes), "flows": flows,
                          "unpaired_sends": sends - flows, "lost": lost}}


# -- what a viewer needs of the file ---------------------------------------------------------
_REQUIRED = {"X": ("name", "ts", "dur", "pid", "tid"), "i": ("name", "ts", "pid", "tid", "s"),
             "s": ("name", "id", "ts", "pid", "tid"), "f": ("name", "id", "ts", "pid", "tid"),
             "M": ("name", "pid", "args")}


def problems(doc: Any) -> list[str]:
    """What is wrong with a Trace Event JSON object for a viewer: a phase's required keys,
    non-numeric times, flows not paired one start to one finish (the finish not before the
    start's event in the list), slices of one thread out of start order or improperly
    nested, a track without a name."""
    out: list[str] = []
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        return ["not an object with a traceEvents list"]
    starts: dict[Any, int] = {}
    ends: dict[Any, int] = {}
    named: set[tuple[Any, Any]] = set()
    last_ts: dict[tuple[Any, Any], float] = {}
    open_: dict[tuple[Any, Any], list[float]] = defaultdict(list)
    used: set[tuple[Any, Any]] = set()
    prev = None
    for n, ev in enumerate(doc["traceEvents"]):
        ph = ev.get("ph") if isinstance(ev, dict) else None
        if ph not in _REQUIRED:
            out.append(f"event {n}: phase {ph!r} is not one this file uses")
            continue
        missing = [k for k in _REQUIRED[ph] if k not in ev]
        if missing:
            out.append(f"event {n} ({ph}): no {', '.join(missing)}")
            continue
        if ph == "M":
            if ev["name"] == "thread_name":
                named.add((ev["pid"], ev["tid"]))
            continue
        if not all(isinstance(ev[k], int | float) for k in ("ts", "pid", "tid")):
            out.append(f"event {n}: ts, pid and tid must be numbers")
            continue
        if prev is not None and ev["ts"] < prev:
            out.append(f"event {n}: ts {ev['ts']} before the event ahead of it ({prev})")
        prev = ev["ts"]
        track = (ev["pid"], ev["tid"])
        if ph == "s":
            if ev["id"] in starts:
                out.append(f"event {n}: a second flow start of id {ev['id']}")
            starts[ev["id"]] = n
        elif ph == "f":
            if ev["id"] not in starts:
                out.append(f"event {n}: flow finish of id {ev['id']} with no start before it")
            if ev["id"] in ends:
                out.append(f"event {n}: a second flow finish of id {ev['id']}")
            ends[ev["id"]] = n
        if ph in ("X", "i") and ev["pid"] != 0:
            used.add(track)
        if ph == "X":
            if not isinstance(ev["dur"], int | float) or ev["dur"] < 0:
                out.append(f"event {n}: dur {ev['dur']!r}")
                continue
            if ev["ts"] < last_ts.get(track, float("-inf")):
                out.append(f"event {n}: ts goes back on thread {track}")
            last_ts[track] = ev["ts"]
            stack = open_[track]
            while stack and stack[-1] <= ev["ts"]:
                stack.pop()
            end = ev["ts"] + ev["dur"]
            if stack and end > stack[-1]:
                out.append(f"event {n}: slice {ev['name']!r} overlaps the one open on "
                           f"thread {track} without nesting in it")
            stack.append(end)
    for fid in starts.keys() - ends.keys():
        out.append(f"flow {fid}: started, never finished")
    for track in sorted(used - named):
        out.append(f"thread {track}: has events but no thread_name")
    return out


# -- the command -----------------------------------------------------------------------------
def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser],
               verbose: argparse.ArgumentParser) -> None:
    """`ualinkd timeline` (cli/main.py adds it and dispatches to `run`)."""
    p = sub.add_parser(
        "timeline", parents=[verbose],
        help="a recording or --trace=json file as Chrome Trace Event JSON (Perfetto, "
             "chrome://tracing), or as --trace text in start-time order")
    p.add_argument("recording", metavar="FILE",
                   help="a `ualinkd record` recording or a --trace=json file")
    p.add_argument("-o", "--output", metavar="OUT.json",
                   help="where the Trace Event JSON goes (default: FILE's name with "
                        ".timeline.json)")
    p.add_argument("--text", action="store_true",
                   help="print the records as --trace text in start-time order instead")
    p.add_argument("--no-discovery", action="store_true",
                   help="leave out device discovery: libdrm's VERSION, GET_CAP, AMDGPU_INFO "
                        "queries, and the processes that made nothing else")
    p.add_argument("--pid", type=int, action="append", metavar="PID",
                   help="only this client's records (repeatable; fabric messages stay)")


def default_output(path: str) -> str:
    base = path[:-len(".jsonl")] if path.endswith(".jsonl") else path.removesuffix(".json")
    return base + ".timeline.json"


def run(args: argparse.Namespace) -> int:
    try:
        loaded = read(args.recording)
    except RecordingError as e:
        print(f"ualinkd timeline: {args.recording}: {e}", file=sys.stderr)
        return 2
    recs = loaded.records
    if args.no_discovery:
        recs = without_discovery(recs)
    if args.pid:
        pids = set(args.pid)
        mine = {(r["node"], r["file"]) for r in recs if r["type"] == "open"
                and r["pid"] in pids}
        recs = [r for r in recs if "pid" not in r or r["pid"] in pids
                or (r["type"] == "release" and (r["node"], r.get("file")) in mine)]
    if loaded.partial is not None:
        print(f"ualinkd timeline: {args.recording}: line {loaded.partial} is a partial record "
              "(a recorder stopped mid-write): left out", file=sys.stderr)
    if args.text:
        for r in recs:
            print(text_line(r))
        return 0
    doc = chrome_trace(recs, os.path.abspath(args.recording))
    wrong = problems(doc)
    if wrong:  # our bug: say so rather than hand a viewer a file it misdraws
        print("ualinkd timeline: the timeline came out malformed (a bug): " + "; ".join(
            wrong[:5]), file=sys.stderr)
        return 1
    out = args.output or default_output(args.recording)
    with open(out, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    info = doc["otherData"]
    slices = sum(1 for e in doc["traceEvents"] if e["ph"] == "X")
    print(f"ualinkd timeline: {out}: {len(info['nodes'])} nodes, {slices} slices, "
          f"{info['flows']} fabric flows ({info['unpaired_sends']} sends unpaired); open it "
          "in https://ui.perfetto.dev or chrome://tracing", file=sys.stderr)
    return 0
