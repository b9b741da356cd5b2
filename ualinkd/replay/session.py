"""A recorded session as the calls a replay issues, and each answer compared with the
recording's (sans-IO: the edge, `replay/issue.py`, opens the files and calls ioctl(2)).

The recording is a JSON trace of schema 2 (`trace.py`). Calls are replayed in the order they
completed (start + duration), across all pids and nodes: a wait that blocked until another
process signalled completes after the signal, and an import after the export it imports. A
call is planned (`plan`), issued by the edge, and its outcome compared (`compare`), which also
teaches the mapper the values the replay's daemon handed out.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..abi import structs as st
from ..abi.constants import KFD_IOC_ALLOC_MEM_FLAGS_USERPTR
from ..abi.ioc import IoctlCmd
from ..abi.ioctls import by_name
from ..abi.values import FREE, NEW, NOTHING_HANDED, HandedValues
from ..trace import SCHEMA_VERSION
from .mapping import Mapper, Region, is_value, pointers, regions, scope_of, span_at

SLACK = 4096  # bytes after each caller-memory span: a replay that writes past it shows
CANARY = 0xA5  # what a span holds where the recording neither read nor wrote
FileKey = tuple[str, int]  # (node, the trace's file id)


class RecordingError(ValueError):
    """The file is not a recording a replay can use (not JSON lines, a schema it does not
    read, a field a replay reads missing or of the wrong type, nothing to replay)."""


# What a replay orders and filters records by (`timeline`, Replay's bookkeeping, the lost
# count): all `index_records` keeps of a record until its turn comes to be planned.
INDEX_FIELDS = ("type", "node", "file", "pid", "time", "duration", "count")
REPLAYED = ("open", "release", "ioctl", "gpu")  # the record types a replay issues
# ... and of a `queue` record (what `queue_summary` counts; "at" reads an error's detail back)
QUEUE_INDEX_FIELDS = ("event", "queue_id", "queue_type", "value")


# -- checking a record ---------------------------------------------------------------------
# Every field `plan`, `compare` and the edge read, per record type, checked when the file is
# first read: a malformed record is refused with its line and field before anything is
# issued, never a traceback halfway through the replay.
def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_u64(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 64


# Linux moves at most MAX_RW_COUNT (0x7ffff000) bytes in one read(2) or copy, and a file
# offset is a signed 64-bit off_t: a GPU access or a caller-memory span past these was never
# recorded, and would overflow pread or the buffer a replay allocates for it.
MAX_RW_COUNT = 0x7FFFF000


# What one call's caller memory can be: the daemon copies each array the way the kernel
# kmalloc's it, so no single copy is larger than KMALLOC_MAX_SIZE (4 MiB: memdup_user and
# kmalloc_array fail past it, amdgpu/vm.py, drm/syncobj.py), and the most one call copies
# is a few such arrays (SYNCOBJ_TIMELINE_WAIT: 2 MiB of handles and 4 MiB of points). A
# replay gives each span its own buffer (plus SLACK, and copies of it to compare): a
# recording claiming more was never recorded, and would cost the replayer gigabytes.
MAX_COPY = 4 << 20
MAX_CALL_MEMORY = 16 << 20  # a call's spans, each with its SLACK


def _is_count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_RW_COUNT


def _is_offset(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 63


def _is_time(v: object) -> bool:  # JSON's NaN and Infinity would not sort into a timeline
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _is_hex(v: object) -> bool:
    if not isinstance(v, str):
        return False
    try:
        bytes.fromhex(v)
    except ValueError:
        return False
    return True


# The files a recording may open: what a node's mount serves to clients (fuse/tree.py), by
# their names relative to it. Nothing else (`..`, an absolute path, sys/kernel/debug's
# knobs, a file of the host) is opened, whatever a recording attached to a bug report says.
# A dma-buf's recorded name is only its label (the replay opens the token its own daemon
# handed out); the trace writes dmabuf/None when it had lost the token's name.
DEVICE_PATH = re.compile(
    r"dri/renderD[0-9]{1,9}|dri/card[0-9]{1,9}|kfd|dmabuf/(?:[0-9]{1,20}|None)")
DEVICE_PATHS = "dri/renderD<n>, dri/card<n>, kfd or dmabuf/<token>"


def device_path(v: object) -> bool:
    """`v` names a file a node's mount serves to clients (a relative path, no symlink, no
    `..`): the only paths a replay opens."""
    return isinstance(v, str) and DEVICE_PATH.fullmatch(v) is not None


def _is_cmd(v: object) -> bool:
    if not isinstance(v, str):
        return False
    try:
        return 0 <= int(v, 16) < 1 << 32
    except ValueError:
        return False


Check = tuple[Callable[[object], bool], str]  # (accepts, what it must be)
_INT: Check = (_is_int, "an integer")
_U64: Check = (_is_u64, "an unsigned 64-bit integer")
_COUNT: Check = (_is_count, f"a byte count up to {MAX_RW_COUNT:#x}")
_OFFSET: Check = (_is_offset, "an offset below 2**63")
_TIME: Check = (_is_time, "a number of seconds")
_HEX: Check = (_is_hex, "a hex string")
_STR: Check = (lambda v: isinstance(v, str), "a string")
_FILE: Check = (lambda v: v is None or _is_int(v), "a file id or null")
_KEY: Check = (lambda v: v is None or _is_int(v), "an integer or null")
_DICT: Check = (lambda v: isinstance(v, dict), "an object")
_LIST: Check = (lambda v: isinstance(v, list), "a list")
_PATH: Check = (device_path, DEVICE_PATHS)
# A release's path is its label (never opened): node.py names a dma-buf's release "dmabuf".
_RELEASED: Check = (lambda v: device_path(v) or v == "dmabuf", DEVICE_PATHS)

_COMMON = {"node": _STR, "pid": _INT, "time": _TIME}
# field -> (check, required); an optional field, when present, is checked all the same.
FIELDS: dict[str, dict[str, tuple[Check, bool]]] = {
    "open": {**{k: (c, True) for k, c in _COMMON.items()}, "duration": (_TIME, False),
             "file": ((_is_int, "a file id"), True), "path": (_PATH, True),
             "token": (_KEY, False), "key": (_KEY, False), "result": (_INT, False)},
    "release": {**{k: (c, True) for k, c in _COMMON.items()}, "duration": (_TIME, False),
                "file": ((_is_int, "a file id"), True), "path": (_RELEASED, False)},
    "ioctl": {**{k: (c, True) for k, c in _COMMON.items()}, "duration": (_TIME, False),
              "file": (_FILE, True), "ioctl": (_STR, True),
              "cmd": ((_is_cmd, "a 32-bit hex ioctl number"), True), "in_hex": (_HEX, True),
              "out_hex": (_HEX, True), "result": (_INT, True), "in": (_DICT, False),
              "mem": (_LIST, False), "fds": (_LIST, False)},
    "gpu": {**{k: (c, True) for k, c in _COMMON.items()}, "duration": (_TIME, False),
            "file": (_FILE, True),
            "op": ((lambda v: v in ("load", "store"), '"load" or "store"'), True),
            "va": (_OFFSET, True), "length": (_COUNT, True), "result": (_INT, True),
            "data_hex": (_HEX, False)},
    "lost": {"count": (_INT, False)},
    # (never replayed: read for `queue_summary`'s account of what is not)
    "queue": {**{k: (c, True) for k, c in _COMMON.items()}, "queue_id": (_INT, True),
              "event": (_STR, True), "queue_type": (_STR, False), "value": (_INT, False),
              "detail": (_STR, False)},
}
MEM_FIELDS: dict[str, Check] = {
    "op": (lambda v: v in ("read", "write"), '"read" or "write"'), "addr": _U64,
    "len": _COUNT, "hex": _HEX, "result": _INT}
FD_FIELDS: dict[str, Check] = {"fd": _INT, "key": _KEY}


def _shown(v: object) -> str:
    """A refused value as the error quotes it: its JSON, cut to 40 characters."""
    text = json.dumps(v)
    return text if len(text) <= 40 else text[:39] + "…"


def _check_fields(n: int, where: str, rec: dict[str, Any],
                  fields: dict[str, tuple[Check, bool]]) -> None:
    for name, ((ok, what), required) in fields.items():
        if name not in rec:
            if required:
                raise RecordingError(f"line {n}: {where}`{name}` is missing")
        elif not ok(rec[name]):
            raise RecordingError(f"line {n}: {where}`{name}` is not {what} "
                                 f"({_shown(rec[name])})")


def _check(n: int, rec: dict[str, Any]) -> None:
    kind = rec["type"]
    _check_fields(n, "", rec, FIELDS.get(kind, {}))
    for list_name, entry_fields in (("mem", MEM_FIELDS), ("fds", FD_FIELDS)):
        for i, entry in enumerate(rec.get(list_name, []) if kind == "ioctl" else []):
            where = f"{list_name}[{i}]."
            if not isinstance(entry, dict):
                raise RecordingError(f"line {n}: `{list_name}[{i}]` is not an object")
            _check_fields(n, where, entry, {k: (c, True) for k, c in entry_fields.items()})
    if kind == "ioctl":
        _check_memory(n, rec["mem"] if "mem" in rec else [])


def _check_memory(n: int, mem: list[dict[str, Any]]) -> None:
    """The caller memory an ioctl record claims is memory a call could have copied: each
    copy at most MAX_COPY, the spans a replay allocates at most MAX_CALL_MEMORY in all."""
    done = [m for m in mem if m["result"] == 0]  # only these get a buffer (`_plan_ioctl`)
    for i, m in enumerate(mem):
        if m["result"] == 0 and m["len"] > MAX_COPY:
            raise RecordingError(f"line {n}: mem[{i}] copies {m['len']} bytes, more than a "
                                 f"call copies at once ({MAX_COPY}, KMALLOC_MAX_SIZE)")
    total = sum(r.end - r.start + SLACK for r in regions((m["addr"], m["len"]) for m in done))
    if total > MAX_CALL_MEMORY:
        raise RecordingError(f"line {n}: `mem` needs {total} bytes of caller memory (its spans "
                             f"and {SLACK} after each), more than a call copies "
                             f"({MAX_CALL_MEMORY})")


def _parse(n: int, line: str | bytes) -> dict[str, Any] | None:
    """Line `n` of a recording as its record (None: a blank line)."""
    if not line.strip():
        return None
    try:
        return _parse_line(n, line)
    except RecursionError:  # the JSON decoder (or a check's json.dumps) went too deep
        raise RecordingError(f"line {n}: JSON nested too deep") from None


def _parse_line(n: int, line: str | bytes) -> dict[str, Any]:
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as e:
        raise RecordingError(f"line {n}: not JSON ({e.msg})") from None
    except UnicodeDecodeError:
        raise RecordingError(f"line {n}: not UTF-8") from None
    if not isinstance(rec, dict) or not isinstance(rec.get("type"), str):
        raise RecordingError(f"line {n}: not a trace record")
    v = rec.get("v", 0)
    if not _is_int(v):
        raise RecordingError(f"line {n}: `v` is not a schema number ({_shown(v)})")
    if v > SCHEMA_VERSION:
        raise RecordingError(f"line {n}: trace schema {v} is newer than this build reads "
                             f"(schema {SCHEMA_VERSION}); replay it with the build that "
                             "recorded it")
    if v < 2 and rec["type"] in ("ioctl", "gpu"):
        raise RecordingError(f"line {n}: trace schema {rec.get('v')} has no file ids nor "
                             "caller memory; record with this build (schema 2)")
    _check(n, rec)
    return rec


def load(lines: Iterable[str | bytes]) -> list[dict[str, Any]]:
    return [rec for n, line in enumerate(lines, 1) if (rec := _parse(n, line)) is not None]


@dataclasses.dataclass(slots=True)
class Index:
    """What `index_records` read: the records, and the line number of a partial last
    record it left out (a recorder killed mid-write), if there was one."""

    records: list[dict[str, Any]]
    partial: int | None = None


def index_records(lines: Iterable[tuple[int, str | bytes]]) -> Index:
    """`load` for a recording too large to hold: each record checked as `load` does, but
    only its INDEX_FIELDS kept, and under "at" what `lines` paired its line with (where it
    starts, for the edge to read the whole record back when it is replayed).

    A last line with no newline that is not JSON is what a recorder killed mid-write leaves:
    left out and named in `partial`, the rest replays. Anywhere else it is refused."""
    out = []
    partial: tuple[int, str | bytes] | None = None
    for n, (at, line) in enumerate(lines, 1):
        if partial is not None:
            _parse(*partial)  # not the last line after all: refused as any bad line is
        ended = line.endswith(b"\n") if isinstance(line, bytes) else line.endswith("\n")
        if not ended and line.strip():
            try:
                json.loads(line)
            except ValueError:  # JSONDecodeError, UnicodeDecodeError
                partial = (n, line)
                continue
            except RecursionError:  # whole, but too deep: refused by _parse
                pass
        rec = _parse(n, line)
        if rec is not None:
            fields = INDEX_FIELDS + (QUEUE_INDEX_FIELDS if rec["type"] == "queue" else ())
            out.append({**{k: rec[k] for k in fields if k in rec}, "at": at})
    return Index(out, partial[0] if partial is not None else None)


def timeline(recs: Iterable[dict[str, Any]], pids: set[int] | None = None,
             nodes: set[str] | None = None) -> list[dict[str, Any]]:
    """The replayable records in completion order; with `pids`, those pids' calls and the
    releases of the files they opened."""
    keep = [r for r in recs if r["type"] in ("open", "release", "ioctl", "gpu")
            and (nodes is None or r["node"] in nodes)]
    if pids is not None:
        mine = {(r["node"], r["file"]) for r in keep if r["type"] == "open" and r["pid"] in pids}
        keep = [r for r in keep if r["pid"] in pids
                or (r["type"] == "release" and (r["node"], r["file"]) in mine)]
    return sorted(keep, key=lambda r: (r["time"] + r.get("duration", 0.0)))


# kfd_ioctl_wait_events_args' timeout (ms) and its offset. A replay is one thread issuing
# calls in their recorded completion order: whatever signalled a recorded wait's events
# through a call (SET_EVENT, another pid's) is issued before it. Only a queue's TRAP or
# completion signal, which the replay does not run, could end it otherwise, so on a node
# whose queues ran, a wait waits at most its recorded time plus WAIT_SLACK_MS — never the
# forever of ROCr's event thread, whose queues will not signal.
EVENT_WAITS = ("AMDKFD_WAIT_EVENTS",)
WAIT_TIMEOUT = st.KFD_WAIT_EVENTS.field("timeout")
WAIT_SLACK_MS = 250
QUEUE_EVENTS_NOTE = (" (the recording's queues on this node ran packets, which signal events — "
                     "TRAP, completion signals — and are not replayed; the wait was given its "
                     f"recorded time + {WAIT_SLACK_MS} ms)")


@dataclasses.dataclass(slots=True)
class QueueLife:
    """One user queue as the recording saw it, from its `create` (or from the recording's
    start, for a queue made before it) to its `destroy` (or the recording's end)."""

    node: str
    pid: int
    queue_id: int
    queue_type: str
    created: bool = False
    destroyed: bool = False
    doorbells: int = 0
    packets: int = 0
    errors: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # their records

    def note(self) -> str:
        """`[pid 12] node0 queue 0 (sdma): created, 9 doorbells, 340 packets, destroyed`."""
        parts = ["created" if self.created else "created before the recording",
                 f"{self.doorbells} doorbells", f"{self.packets} packets"]
        parts += [f"stopped in error at ring offset {e.get('value', 0):#x}"
                  + (f": {e['detail']}" if e.get("detail") else "") for e in self.errors]
        parts.append("destroyed" if self.destroyed else "not destroyed in the recording")
        return (f"[pid {self.pid}] {self.node} queue {self.queue_id} ({self.queue_type}): "
                + ", ".join(parts))


@dataclasses.dataclass(slots=True)
class QueueSummary:
    """What of a recording's user queues a replay does not replay (issue 30 item 6).

    A replay re-issues ioctls and GPU loads/stores. A queue's work is not one of them: the
    client's CPU writes packets into the ring (its own memory, or a BO it mapped) and stores
    the write pointer to the doorbell page it mmapped, and the daemon's engine executes
    them. None of that passes through a call the trace records, so a recording has the
    doorbells and the packets the engine decoded (`queue` records) but not the ring's bytes
    a replay would need to make the engine run them again. CREATE_QUEUE and DESTROY_QUEUE
    (and the other queue ioctls) are ioctls, replayed and compared as any other; the queue
    they make in the replay gets no doorbell and runs nothing."""

    records: int = 0
    queues: list[QueueLife] = dataclasses.field(default_factory=list)

    @property
    def doorbells(self) -> int:
        return sum(q.doorbells for q in self.queues)

    @property
    def packets(self) -> int:
        return sum(q.packets for q in self.queues)

    @property
    def errors(self) -> int:
        return sum(len(q.errors) for q in self.queues)

    def line(self) -> str | None:
        """The summary's line, or None for a recording without queue records."""
        if not self.records:
            return None
        errors = f", {self.errors} queue errors" if self.errors else ""
        return (f"not replayed: {self.records} queue records ({self.doorbells} doorbells, "
                f"{self.packets} packets{errors} on {len(self.queues)} queues): the rings' "
                "contents are the client's CPU memory, not in the recording; the queues' "
                "ioctls are replayed, their doorbells and packets are not")


def queue_summary(recs: Iterable[dict[str, Any]], pids: set[int] | None = None,
                  nodes: set[str] | None = None) -> QueueSummary:
    """The `queue` records of `recs` (in the recording's order; of `pids` and `nodes` only,
    as `timeline` keeps calls) as queue lives: a queue id a process reuses after a destroy
    is another queue."""
    out = QueueSummary()
    live: dict[tuple[str, int, int], QueueLife] = {}
    for r in recs:
        if r["type"] != "queue" or (pids is not None and r["pid"] not in pids) or (
                nodes is not None and r["node"] not in nodes):
            continue
        out.records += 1
        key = (r["node"], r["pid"], r["queue_id"])
        event = r["event"]
        q = live.get(key)
        if q is None or event == "create":
            q = live[key] = QueueLife(r["node"], r["pid"], r["queue_id"],
                                      r.get("queue_type") or "?", created=event == "create")
            out.queues.append(q)
        if event == "doorbell":
            q.doorbells += 1
        elif event == "packet":
            q.packets += 1
        elif event == "error":
            q.errors.append(r)
        elif event == "destroy":
            q.destroyed = True
            del live[key]
    return out


def refuse_unreplayable(everything: list[dict[str, Any]], recs: list[dict[str, Any]],
                        mounts: Iterable[tuple[str, str]], pids: set[int] | None) -> None:
    """Raise RecordingError, before anything is issued, for a replay that could only say
    "no differences" about nothing, or about calls sent to the wrong node: a recording with
    no call in it, a `--mount NODE=` for a node it never has (a typo would otherwise skip
    every call of the node meant), one node's mount given twice, or a mount without a node
    that would take the calls of several nodes (`mounts`: (node or "", directory) pairs as
    given), or a `--pid` filter that leaves nothing."""
    nodes = sorted({r["node"] for r in everything if r["type"] in REPLAYED})
    if not nodes:
        lost = sum(r.get("count", 0) for r in everything if r["type"] == "lost")
        raise RecordingError("no calls to replay" + (f" (the recording lost {lost} records)"
                                                     if lost else ""))
    dirs: dict[str, list[str]] = {}
    for node, directory in mounts:
        if node and node not in nodes:
            raise RecordingError(f"--mount {node}=: the recording has no node {node!r} "
                                 f"(its nodes: {', '.join(nodes)})")
        dirs.setdefault(node, []).append(directory)
    form = " ".join(f"--mount {n}=DIR" for n in nodes)
    for node, given in dirs.items():
        if len(given) > 1 and node:
            raise RecordingError(f"--mount {node}= given {len(given)} times "
                                 f"({', '.join(given)}): one mount per node ({form})")
        if len(given) > 1:
            raise RecordingError(f"--mount {' --mount '.join(given)}: {len(given)} mounts "
                                 "without a node (only the last would be used): name each "
                                 f"node's mount ({form})")
    if "" in dirs:  # it takes the calls of every node without its own
        taken = sorted({r["node"] for r in recs} - dirs.keys())
        if len(taken) > 1:
            raise RecordingError(
                f"--mount {dirs[''][0]}: the recording has calls on {len(taken)} nodes "
                f"({', '.join(taken)}), which one mount without a node would take all of: "
                f"name each node's mount ({form})")
    if not recs:
        had = ", ".join(map(str, sorted({r["pid"] for r in everything if r["type"] in REPLAYED})))
        asked = f" from pid {', '.join(map(str, sorted(pids)))}" if pids else ""
        raise RecordingError(f"no calls to replay{asked} (the recording's pids: {had})")


# -- what the edge issues ------------------------------------------------------------------
@dataclasses.dataclass(slots=True)
class OpenCall:
    node: str
    path: str
    file: FileKey


@dataclasses.dataclass(slots=True)
class CloseCall:
    file: FileKey


@dataclasses.dataclass(slots=True)
class Buffer:
    """Replayer memory standing for one span of the recorded caller's memory."""

    data: bytearray  # initial contents (span + SLACK)
    expect: bytearray  # what it must hold after the call if the replay matches
    any_of: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # clock readings


@dataclasses.dataclass(slots=True)
class IoctlCall:
    file: FileKey
    cmd: int
    arg: bytearray  # the struct (pointers still the recorded ones)
    buffers: list[Buffer]
    # (in the struct: -1 | in buffer i, offset, buffer j, offset in j): a pointer to patch
    patches: list[tuple[int, int, int, int]]
    sent: bytes = b""  # set by the edge: the struct with the pointers patched
    # A userptr allocation's range (address, size): the edge maps zero pages there in the
    # replayer first (`user_pages`), as the recorded client had its own pages there.
    user_pages: tuple[int, int] | None = None
    bounded: tuple[int, int] | None = None  # (offset, size) of a timeout the plan lowered


@dataclasses.dataclass(slots=True)
class GpuCall:
    file: FileKey
    op: str
    va: int
    length: int
    data: bytes


Call = OpenCall | CloseCall | IoctlCall | GpuCall


@dataclasses.dataclass(frozen=True, slots=True)
class Skip:
    """A record that follows from a call that already differed (its file or token came
    from it): not issued, not a difference of its own."""

    because: int | None  # the index of the differing call (None: nothing to replay)
    why: str


@dataclasses.dataclass(slots=True)
class Outcome:
    """What the replay's call answered: 0 / a count, or -errno; the struct and buffers after
    (ioctl); the bytes loaded (GPU load); the fd opened (open)."""

    result: int
    arg: bytes = b""
    buffers: list[bytes] = dataclasses.field(default_factory=list)
    data: bytes = b""
    fd: int = -1
    refused: str | None = None  # the edge did not issue the call, and why


@dataclasses.dataclass(frozen=True, slots=True)
class Difference:
    index: int  # the record's position in the timeline (1-based)
    call: str  # "[pid 123] node0 AMDGPU_UALINK_HANDLE"
    what: str

    def __str__(self) -> str:
        return f"#{self.index} {self.call}: {self.what}"


def _errname(result: int) -> str:
    if result >= 0:
        return str(result)
    return f"-1 {errno.errorcode.get(-result, str(-result))}"


class Replay:
    """Plans each recorded record as a call, compares what the replay answered."""

    def __init__(self, recs: list[dict[str, Any]],
                 whole: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> None:
        """`recs` in replay order (`timeline`); `whole`, for records from `index_records`, reads
        one back whole when its turn comes."""
        self.recs = recs
        self.whole = whole
        self.mapper = Mapper()
        self.fd_of: dict[FileKey, int] = {}  # the replayer's fd of each recorded open
        self.file_of_key: dict[tuple[str, int], FileKey] = {}  # a dma-buf key's open
        self.calls = 0
        # Values the recording's call handed out and the replay's did not (it failed):
        # (kind, scope, recorded value) -> that call's index; files not opened because of one.
        self.lost: dict[tuple[str, tuple[str, int | None], int], int] = {}
        self.skipped_files: dict[FileKey, int] = {}
        self.recorded_opens = {(r["node"], r["file"]) for r in recs if r["type"] == "open"}
        # The nodes whose queues the recording saw run packets (`queue_summary`): their
        # TRAPs and completion signals woke event waits the replay's queues cannot (a
        # process's threads wait too, each its own recorded pid: by node, not by pid).
        self.queues_ran: set[str] = set()

    def steps(self) -> Iterator[tuple[int, dict[str, Any]]]:
        for i, rec in enumerate(self.recs, 1):
            yield i, self.whole(rec) if self.whole else rec

    @staticmethod
    def label(rec: dict[str, Any]) -> str:
        what = {"open": f"open({rec.get('path')})", "release": f"close({rec.get('path')})",
                "gpu": f"GPU_{str(rec.get('op', '')).upper()}"}.get(rec["type"],
                                                                    rec.get("ioctl", "?"))
        for field in ("query", "op"):  # which of a multiplexed ioctl's calls (INFO, UALINK)
            value = rec.get("in", {}).get(field) if rec["type"] == "ioctl" else None
            if isinstance(value, dict) and value.get("name"):
                what += f"({field}={value['name']})"
                break
        return f"[pid {rec.get('pid')}] {rec['node']} {what}"

    # -- planning -------------------------------------------------------------------------
    def plan(self, rec: dict[str, Any]) -> Call | Skip | str:
        """The call to issue, a Skip, or why this record cannot be replayed."""
        kind = rec["type"]
        key: FileKey = (rec["node"], rec["file"]) if rec.get("file") is not None else ("", 0)
        if key in self.skipped_files:
            if kind == "release":
                return Skip(self.skipped_files.pop(key), "its file was not opened")
            return Skip(self.skipped_files[key], "its file was not opened")
        if kind == "release" and key not in self.recorded_opens:
            return Skip(None, "the file was opened before the recording began (or by a pid "
                              "left out)")
        if kind == "open":
            path = rec["path"]
            if path.startswith("dmabuf/"):
                if rec.get("token") is None:
                    return "a dma-buf opened by a name the recording does not have"
                scope = scope_of("token", rec["node"], None)
                lost = self.lost.get(("token", scope, rec["token"]))
                if lost is not None:
                    self.skipped_files[key] = lost
                    return Skip(lost, "the replay's call was not given its token")
                token = self.mapper.to_replay("token", scope, rec["token"])
                path = f"dmabuf/{token}"
            return OpenCall(rec["node"], path, key)
        if rec.get("file") is None or key not in self.fd_of:
            return "its file was opened before the recording began (or not replayed)"
        if kind == "release":
            return CloseCall(key)
        if kind == "gpu":
            data = bytes.fromhex(rec.get("data_hex", ""))
            if rec["op"] == "store" and rec.get("data_truncated"):
                return f"the recording kept {len(data)} of the store's {rec['length']} bytes"
            return GpuCall(key, rec["op"], rec["va"], rec["length"], data)
        gone = self._lost_queue(rec, key)
        if gone is not None:
            return gone
        return self._plan_ioctl(rec, key)

    def _lost_queue(self, rec: dict[str, Any], key: FileKey) -> Skip | None:
        """A call on a queue the replay's CREATE_QUEUE did not make (it failed where the
        recording's succeeded): not issued, it follows from that difference (the queue id
        it names is not the replay's, or names another queue)."""
        in_bytes = bytes.fromhex(rec["in_hex"])
        for s in _handed(rec["ioctl"]).slots_for(in_bytes):
            if s.where != "in" or s.kind != "kfd_queue" or (v := s.read(in_bytes)) is None:
                continue
            lost_key = (s.kind, scope_of(s.kind, rec["node"], key[1]), v)
            because = self.lost.get(lost_key)
            if because is not None:
                if s.role == FREE:
                    del self.lost[lost_key]
                return Skip(because, f"the replay's CREATE_QUEUE did not make queue {v}")
        return None

    def _plan_ioctl(self, rec: dict[str, Any], key: FileKey) -> IoctlCall:
        cmd = int(rec["cmd"], 16)
        in_bytes = bytes.fromhex(rec["in_hex"])
        arg = bytearray(in_bytes.ljust(max(IoctlCmd.decode(cmd).size, len(in_bytes)), b"\0"))
        node, name = rec["node"], rec["ioctl"]
        handed = _handed(name)
        fd_of_recorded = {f["fd"]: f.get("key") for f in rec.get("fds", [])}
        for s in handed.slots_for(in_bytes):
            if s.where != "in" or (v := s.read(in_bytes)) is None:
                continue
            if s.kind == "fd":
                opened = self.file_of_key.get((node, fd_of_recorded.get(v, -1)))
                if opened is not None and opened in self.fd_of:
                    s.write(arg, self.fd_of[opened])
            else:
                s.write(arg, self.mapper.to_replay(s.kind, scope_of(s.kind, node, key[1]), v))
        # Only memory the recorded call reached gets a buffer: a pointer whose access failed
        # (EFAULT: the caller passed a bad one) goes as recorded, unpatched, so the replay's
        # daemon faults on it the same way rather than finding the replayer's buffer there.
        mem = [m for m in rec.get("mem", []) if m["result"] == 0]
        spans = regions((m["addr"], m["len"]) for m in mem)
        buffers = []
        for r in spans:
            data = bytearray([CANARY]) * (r.end - r.start + SLACK)
            buffers.append(Buffer(data, bytearray()))
        for m in mem:  # what was read in, where it was read
            if m["op"] == "read":
                self._place(spans, buffers, m["addr"], bytes.fromhex(m["hex"]), initial=True)
        for a in handed.arrays:
            self._map_array(spans, buffers, a.pointer(in_bytes), a.length(in_bytes), a.size,
                            a.kind, node, key[1])
        for b in buffers:
            b.expect = bytearray(b.data)
        clock_mem, _ = handed.clock_reading(in_bytes)
        for m in mem:  # what the recording's daemon wrote back
            if m["op"] == "write":
                self._place(spans, buffers, m["addr"], bytes.fromhex(m["hex"]), initial=False)
                if clock_mem and (i := span_at(spans, m["addr"])) is not None:
                    off = m["addr"] - spans[i].start
                    buffers[i].any_of.append((off, off + m["len"]))
        patches = [(-1, off, j, delta) for off, j, delta in pointers(in_bytes, spans)]
        for i, (r, b) in enumerate(zip(spans, buffers, strict=True)):
            patches += [(i, off, j, delta)
                        for off, j, delta in pointers(b.data[:r.end - r.start], spans)]
        call = IoctlCall(key, cmd, arg, buffers, patches, user_pages=user_pages(name, in_bytes))
        if name in EVENT_WAITS and node in self.queues_ran and len(arg) >= WAIT_TIMEOUT.end:
            o, n = WAIT_TIMEOUT.offset, WAIT_TIMEOUT.size
            recorded = int.from_bytes(in_bytes[o:o + n].ljust(n, b"\0"), "little")
            bound = min(recorded, math.ceil(rec.get("duration", 0.0) * 1000) + WAIT_SLACK_MS)
            arg[o:o + n] = bound.to_bytes(n, "little")
            call.bounded = (o, n)
        return call

    @staticmethod
    def _place(spans: list[Region], buffers: list[Buffer], addr: int, data: bytes,
               initial: bool) -> None:
        i = span_at(spans, addr)
        if i is not None:
            b, off = buffers[i], addr - spans[i].start
            (b.data if initial else b.expect)[off:off + len(data)] = data
            if initial:
                b.expect[off:off + len(data)] = data

    def _map_array(self, spans: list[Region], buffers: list[Buffer], ptr: int, count: int,
                   size: int, kind: str, node: str, file: int) -> None:
        at = span_at(spans, ptr)
        if at is None:
            return
        r, b = spans[at], buffers[at]
        base = ptr - r.start
        for i in range(min(count, (r.end - ptr) // size)):
            o = base + i * size
            v = int.from_bytes(b.data[o:o + size], "little")
            mapped = self.mapper.to_replay(kind, scope_of(kind, node, file), v)
            b.data[o:o + size] = mapped.to_bytes(size, "little")

    # -- comparing ------------------------------------------------------------------------
    def compare(self, index: int, rec: dict[str, Any], call: Call,
                out: Outcome) -> list[Difference]:
        self.calls += 1
        label = self.label(rec)

        def diff(what: str) -> Difference:
            return Difference(index, label, what)

        if isinstance(call, OpenCall):
            want = rec.get("result", 0)
            if out.result < 0:
                return [diff(f"open failed: {_errname(out.result)}, recorded {_errname(want)}")]
            self.fd_of[call.file] = out.fd
            if rec.get("key") is not None:
                self.file_of_key[(rec["node"], rec["key"])] = call.file
            return []
        if isinstance(call, CloseCall):
            self.fd_of.pop(call.file, None)
            self.mapper.forget_scope(call.file)
            return []
        if isinstance(call, GpuCall):
            return self._compare_gpu(rec, out, diff)
        found = self._compare_ioctl(rec, call, out, diff)
        if found and rec["ioctl"] in EVENT_WAITS and rec["node"] in self.queues_ran:
            found = [dataclasses.replace(d, what=d.what + QUEUE_EVENTS_NOTE) for d in found]
        return found

    @staticmethod
    def _compare_gpu(rec: dict[str, Any], out: Outcome,
                     diff: Callable[[str], Difference]) -> list[Difference]:
        found = []
        if out.result != rec["result"]:
            found.append(diff(f"result {_errname(out.result)}, recorded "
                              f"{_errname(rec['result'])}"))
        if rec["op"] == "load" and rec["result"] > 0:
            want = bytes.fromhex(rec["data_hex"])
            got = out.data[:len(want)]
            if got != want:
                at = next(i for i in range(min(len(got), len(want)) + 1)
                          if i >= len(got) or i >= len(want) or got[i] != want[i])
                found.append(diff(f"loaded bytes differ from offset {at:#x}: "
                                  f"{got[at:at + 16].hex()} vs recorded {want[at:at + 16].hex()}"))
        return found

    def _compare_ioctl(self, rec: dict[str, Any], call: IoctlCall, out: Outcome,
                       diff: Callable[[str], Difference]) -> list[Difference]:
        found: list[Difference] = []
        node, name, file = rec["node"], rec["ioctl"], call.file[1]
        handed = _handed(name)
        in_bytes = bytes.fromhex(rec["in_hex"])
        want = bytes.fromhex(rec["out_hex"])
        if out.refused is not None or out.result != rec["result"]:
            found.append(diff(f"not issued: {out.refused}" if out.refused is not None else
                              f"= {_errname(out.result)}, recorded = {_errname(rec['result'])}"))
            if rec["result"] == 0:
                for s in handed.slots_for(in_bytes):
                    if s.where == "out" and s.role == NEW and is_value(s.kind, r := s.read(want)):
                        assert r is not None
                        self.lost[(s.kind, scope_of(s.kind, node, file), r)] = found[0].index
            return found  # what it copied out means nothing next to the recording's
        got = bytearray(out.arg[:len(want)])
        # Echoed inputs: the replay sent mapped values and patched pointers; read them back
        # as the recording's where the daemon left them as sent.
        for s in handed.slots_for(in_bytes):
            if s.where == "in" and (v := s.read(in_bytes)) is not None:
                if s.read(got) == s.read(call.sent):
                    s.write(got, v)
        for where, off, _j, _d in call.patches:
            if where == -1 and off + 8 <= len(got) and got[off:off + 8] == call.sent[off:off + 8]:
                got[off:off + 8] = in_bytes[off:off + 8]
        if out.result == 0 and rec["result"] == 0:
            for s in handed.slots_for(in_bytes):
                scope = scope_of(s.kind, node, file)
                if s.where == "out" and s.role == NEW:
                    r, p = s.read(want), s.read(out.arg)
                    if r is None or p is None:
                        continue
                    problem = self.mapper.learn(s.kind, scope, r, p)
                    if problem:
                        found.append(diff(f"{s.field} ({s.kind}): {problem}"))
                    s.write(got, r)  # told once, as a handed-out value
                elif s.where == "in" and s.role == FREE and is_value(s.kind, v := s.read(in_bytes)):
                    assert v is not None
                    self.mapper.forget(s.kind, scope, v)
        if call.bounded is not None:  # the lowered timeout, echoed: read as the recording's
            lo, hi = call.bounded[0], call.bounded[0] + call.bounded[1]
            if got[lo:hi] == call.sent[lo:hi]:
                got[lo:hi] = in_bytes[lo:hi]
        _, clock_out = handed.clock_reading(in_bytes)
        if clock_out is not None:
            lo, hi = clock_out
            got[lo:hi] = want[lo:hi]
        if bytes(got) != want:
            found += [diff(d) for d in _field_diffs(want, bytes(got), name, in_bytes)]
        for i, (b, after) in enumerate(zip(call.buffers, out.buffers, strict=True)):
            expect = bytearray(b.expect)
            for lo, hi in b.any_of:
                expect[lo:hi] = after[lo:hi]
            if after != bytes(expect):
                at = next(k for k in range(len(after)) if after[k] != expect[k])
                found.append(diff(
                    f"caller memory (pointer #{i}) differs at +{at:#x}: "
                    f"{after[at:at + 16].hex()} vs recorded {bytes(expect[at:at + 16]).hex()}"
                    + (" (written past what the recording wrote)"
                       if all(x == CANARY for x in expect[at:at + 16]) else "")))
        return found


def _handed(name: str) -> HandedValues:
    """The values the recorded ioctl hands out and takes back (none: not in the table)."""
    spec = by_name(name)
    return spec.handed if spec is not None else NOTHING_HANDED


# The userptr allocations: the caller's own pages become a BO (amdgpu_ttm_tt_get_user_pages
# checks they are mapped). KFD_IOC_ALLOC_MEM_FLAGS_USERPTR (kfd_ioctl.h) with the address
# in mmap_offset; AMDGPU_GEM_USERPTR's drm_amdgpu_gem_userptr {addr, size, flags, handle}.
MAX_USER_PAGES = 16 << 30  # bytes of zero pages a replay maps for them, in all


def user_pages(name: str, in_bytes: bytes) -> tuple[int, int] | None:
    """The (address, size) of caller memory a userptr allocation makes a BO of, else None."""
    def read(at: st.FieldAt) -> int:
        return int.from_bytes(in_bytes[at.offset:at.end].ljust(at.size, b"\0"), "little")

    kfd, gem = st.KFD_ALLOC_MEMORY_OF_GPU, st.GEM_USERPTR
    if name == "AMDKFD_ALLOC_MEMORY_OF_GPU" and len(in_bytes) >= kfd.field("flags").end:
        return ((read(kfd.field("mmap_offset")), read(kfd.field("size")))
                if read(kfd.field("flags")) & KFD_IOC_ALLOC_MEM_FLAGS_USERPTR else None)
    if name == "AMDGPU_GEM_USERPTR" and len(in_bytes) >= gem.field("size").end:
        return (read(gem.field("addr")), read(gem.field("size")))
    return None


def _field_diffs(want: bytes, got: bytes, name: str, in_bytes: bytes) -> list[str]:
    """Copied-out bytes that differ, by field where the ioctl table decodes them."""
    from ..abi.ioctls import all_entries

    spec = next((s for s in all_entries() if s.name == name), None)
    if spec is not None and spec.decode_out is not None and spec.decode_in is not None:
        a: dict[str, Any] | None
        b: dict[str, Any] | None
        try:
            inp = spec.decode_in(in_bytes)
            a, b = spec.decode_out(want, inp), spec.decode_out(got, inp)
        except Exception:  # undecodable: compare the bytes
            a = b = None
        if a is not None and b is not None and a != b:
            return [f"out {k}: {_show(b.get(k))}, recorded {_show(a.get(k))}"
                    for k in a if a.get(k) != b.get(k)]
    at = next(i for i in range(min(len(want), len(got)) + 1)
              if i >= len(want) or i >= len(got) or want[i] != got[i])
    return [f"copied-out bytes differ at offset {at}: {got[at:at + 16].hex()}, recorded "
            f"{want[at:at + 16].hex()}"]


def _show(v: object) -> str:
    return hex(v) if isinstance(v, int) else str(v)
