"""Record and replay, sans-IO (issue 12 item 2): the mapping of values the daemon hands out
(GEM handles per file — drm_gem_handle_create's idr, handle 0 never valid; UALink handles
pod-wide, spec §3.4 / §6.10), caller-memory spans and the pointers into them, a recorded call
planned against the replayer's own buffers and its answer compared; and what a traced NodeCore
puts in a recording (schema 2: opens, caller memory, resolved fds, handed-out values)."""

from __future__ import annotations

import io
import json
import struct

from hypothesis import given, settings
from hypothesis import strategies as st_h
from ualink_testkit import CALLER, GEM_CLOSE, GEM_CREATE, UALINK, open_file, pod_config, run

from ualinkd.abi import constants as c
from ualinkd.abi import structs as st
from ualinkd.abi.ioc import ioc
from ualinkd.node import NodeCore, NodeServices
from ualinkd.replay import session
from ualinkd.replay.mapping import Mapper, Region, pointers, regions, span_at
from ualinkd.replay.record import _keep

SYNCOBJ_WAIT = ioc(3, 0x64, 0xC3, 40)
SCOPE = ("node0", 1)


# -- Mapper ----------------------------------------------------------------------------------
def test_mapper_follows_handed_out_values_and_keeps_unknown_ones():
    m = Mapper()
    assert m.learn("gem", SCOPE, 1, 7) is None
    assert m.to_replay("gem", SCOPE, 1) == 7
    assert m.to_replay("gem", SCOPE, 99) == 99  # a client's bogus handle stays bogus
    assert m.to_replay("gem", ("node0", 2), 1) == 1  # another file's table
    assert m.learn("gem", SCOPE, 1, 7) is None  # handed out again as the same (E3 export)


def test_mapper_flags_a_value_reused_for_another_and_zero_for_a_handle():
    """§6.10: the stale re-export hands out the first export's handle_lo (a value the
    recording had for another handle) and handle_hi 0."""
    m = Mapper()
    assert m.learn("ualink_lo", ("", None), 0xA00, 0xB00) is None
    assert "which the recording had as 0xa00" in m.learn("ualink_lo", ("", None), 0xC00, 0xB00)
    assert "0 where the recording had a value" in m.learn("ualink_hi", ("", None), 0x5, 0)
    # the replay goes on with what its daemon handed out
    assert m.to_replay("ualink_lo", ("", None), 0xC00) == 0xB00


def test_mapper_forget_lets_the_idr_hand_a_closed_handle_out_again():
    m = Mapper()
    m.learn("gem", SCOPE, 1, 1)
    m.learn("gem", SCOPE, 2, 3)
    m.forget("gem", SCOPE, 2)
    assert m.learn("gem", SCOPE, 4, 3) is None  # 3 was closed in the replay: free again
    m.forget_scope(SCOPE)
    assert m.to_replay("gem", SCOPE, 1) == 1


def test_spans_merge_and_aligned_u64_pointers_into_them_are_found():
    spans = regions([(0x1008, 8), (0x1000, 8), (0x2000, 4), (0x3000, 0)])
    assert spans == [Region(0x1000, 0x1010), Region(0x2000, 0x2004)]
    # a u32 of the span's address in a u64's high half is no pointer; a misaligned one neither
    data = struct.pack("<QQII", 0x1008, 5, 0, 0x2000) + struct.pack("<IQI", 0, 0x2000, 0)
    assert pointers(data, spans) == [(0, 0, 8)]
    assert pointers(struct.pack("<QQ", 7, 0x2003), spans) == [(8, 1, 3)]


@settings(max_examples=200, deadline=None)
@given(st_h.lists(st_h.tuples(st_h.integers(0, 1 << 20), st_h.integers(0, 4096)), max_size=40),
       st_h.lists(st_h.integers(0, (1 << 20) + 8192), max_size=40))
def test_span_at_finds_the_span_a_linear_search_finds(accesses, addrs):
    """span_at bisects (a call may have thousands of spans: issue 29 item 9's limit is in
    bytes); it answers what looking through every span would."""
    spans = regions(accesses)
    for a in addrs:
        linear = next((i for i, r in enumerate(spans) if r.start <= a < r.end), None)
        assert span_at(spans, a) == linear


# -- Replay: planning and comparing ---------------------------------------------------------
def _rec(kind: str, **kw: object) -> dict:
    base = {"v": 2, "type": kind, "time": kw.pop("time", 0.0), "duration": 0.0,
            "pid": 10, "node": "node0", "file": 1}
    base.update(kw)
    return base


def _ioctl(name: str, cmd: int, in_bytes: bytes, out_bytes: bytes, result: int = 0,
           mem: list | None = None, fds: list | None = None, time: float = 1.0) -> dict:
    return _rec("ioctl", ioctl=name, cmd=f"{cmd:#010x}", in_hex=in_bytes.hex(),
                out_hex=out_bytes.hex(), result=result, mem=mem or [], fds=fds or [],
                time=time)


def _opened(replay: session.Replay) -> None:
    rec = _rec("open", path="dri/renderD128", minor=128, token=None, key=None, result=0)
    call = replay.plan(rec)
    assert isinstance(call, session.OpenCall) and call.path == "dri/renderD128"
    assert replay.compare(1, rec, call, session.Outcome(0, fd=3)) == []


def _gem_create(handle: int) -> bytes:
    return struct.pack("<I", handle).ljust(32, b"\0")


def test_a_handle_handed_out_differently_is_mapped_into_later_calls():
    replay = session.Replay([])
    _opened(replay)
    inp = st.GEM_CREATE_IN.encode(st.GemCreateIn(4096, 0, c.DOMAIN_VRAM, 0))
    create = _ioctl("AMDGPU_GEM_CREATE", GEM_CREATE, inp, _gem_create(1))
    call = replay.plan(create)
    assert isinstance(call, session.IoctlCall)
    call.sent = bytes(call.arg)
    assert replay.compare(2, create, call, session.Outcome(0, arg=_gem_create(5))) == []
    close = _ioctl("GEM_CLOSE", GEM_CLOSE, struct.pack("<II", 1, 0), b"")
    call = replay.plan(close)
    assert isinstance(call, session.IoctlCall) and call.arg[:4] == struct.pack("<I", 5)


def test_fresh_replay_value_that_the_recording_had_for_another_call_is_a_difference():
    replay = session.Replay([])
    _opened(replay)
    inp = st.GEM_CREATE_IN.encode(st.GemCreateIn(4096, 0, c.DOMAIN_VRAM, 0))
    for i, (rec_h, rep_h) in enumerate(((1, 1), (2, 1))):
        rec = _ioctl("AMDGPU_GEM_CREATE", GEM_CREATE, inp, _gem_create(rec_h))
        call = replay.plan(rec)
        assert isinstance(call, session.IoctlCall)
        call.sent = bytes(call.arg)
        diffs = replay.compare(2 + i, rec, call, session.Outcome(0, arg=_gem_create(rep_h)))
    assert len(diffs) == 1 and "handle (gem)" in diffs[0].what


def test_syncobj_array_behind_a_pointer_gets_a_buffer_with_mapped_handles():
    """SYNCOBJ_WAIT reads `count_handles` u32s at `handles` (drm_syncobj_array_find): the
    replay's buffer holds the replay's handles, and the struct points at it."""
    replay = session.Replay([])
    _opened(replay)
    replay.mapper.learn("syncobj", SCOPE, 1, 8)
    replay.mapper.learn("syncobj", SCOPE, 2, 9)
    addr = 0x7FFD0000
    wait = struct.pack("<QqIIIIQ", addr, 0, 2, 0, 0, 0, 0)
    rec = _ioctl("SYNCOBJ_WAIT", SYNCOBJ_WAIT, wait, wait, mem=[
        {"op": "read", "addr": addr, "len": 8, "hex": struct.pack("<II", 1, 2).hex(),
         "result": 0}])
    call = replay.plan(rec)
    assert isinstance(call, session.IoctlCall)
    assert call.buffers[0].data[:8] == struct.pack("<II", 8, 9)
    assert call.buffers[0].data[8:] == bytes([session.CANARY]) * (len(call.buffers[0].data) - 8)
    assert call.patches == [(-1, 0, 0, 0)]
    sent = bytearray(call.arg)
    sent[0:8] = struct.pack("<Q", 0x5555000)  # where the edge put the buffer
    call.sent = bytes(sent)
    ok = session.Outcome(0, arg=bytes(sent), buffers=[bytes(call.buffers[0].data)])
    assert replay.compare(2, rec, call, ok) == []
    # a daemon that writes into the caller's array, where the recording's did not
    wrote = bytearray(call.buffers[0].data)
    wrote[12] = 0
    got = session.Outcome(0, arg=bytes(sent), buffers=[bytes(wrote)])
    diffs = replay.compare(3, rec, call, got)
    assert len(diffs) == 1 and "written past what the recording wrote" in diffs[0].what


def test_gem_va_syncobjs_are_mapped_at_the_layouts_fields_and_the_timeline_point_is_not():
    """drm_amdgpu_gem_va (amdgpu_drm.h): vm_timeline_syncobj_out (u32 at 48) and the array
    at input_fence_syncobj_handles (u64 at 56) of num_syncobj_handles (u32 at 52) are
    syncobj handles the replay maps; vm_timeline_point (u64 at 40) is a plain number and is
    sent as recorded. (The entry's fields come from st.GEM_VA, not from offsets typed by
    hand: the old table had the three at 40, 48 and 44.)"""
    replay = session.Replay([])
    _opened(replay)
    replay.mapper.learn("syncobj", SCOPE, 3, 30)
    replay.mapper.learn("syncobj", SCOPE, 4, 40)
    replay.mapper.learn("gem", SCOPE, 1, 11)
    fences = 0x7FFD0000
    va = st.GEM_VA.encode(st.GemVa(1, 0, c.VA_OP_MAP, 0, 1 << 20, 0, 4096, 3, 4, 1, fences))
    rec = _ioctl("AMDGPU_GEM_VA", ioc(1, 0x64, 0x48, st.GEM_VA.size), va, b"", mem=[
        {"op": "read", "addr": fences, "len": 4, "hex": struct.pack("<I", 3).hex(),
         "result": 0}])
    call = replay.plan(rec)
    assert isinstance(call, session.IoctlCall)
    sent = st.GEM_VA.decode(bytes(call.arg))
    assert (sent.handle, sent.vm_timeline_point, sent.vm_timeline_syncobj_out) == (11, 3, 40)
    assert call.buffers[0].data[:4] == struct.pack("<I", 30)
    assert call.patches == [(-1, 56, 0, 0)]


def test_every_handed_value_lies_inside_its_entry():
    """Each slot, array pointer and count of the ioctl table lies within the entry's struct
    (the table's size in its cmd), and the names are the header's fields."""
    from ualinkd.abi import ioctls as tbl
    from ualinkd.abi.ioc import IoctlCmd

    seen = 0
    for spec in (*tbl.all_entries(), *tbl.KFD_IOCTLS.values()):
        size = IoctlCmd.decode(spec.cmd).size
        h = spec.handed
        fields = [s.at for s in (*h.slots, *(x for _, v in h.by_op for x in v))]
        fields += [f for a in h.arrays for f in (a.ptr, a.count)]
        for at in fields:
            assert at.end <= size, (spec.name, at)
            seen += 1
    assert seen >= 30
    assert [s.field for s in tbl.AMDGPU_UALINK_HANDLE.handed.slots_for(
        struct.pack("<II", c.UalinkOp.EXPORT, 0))] == [
        "gem_handle", "export_ualink_handle[0]", "export_ualink_handle[1]"]


def test_failed_import_skips_the_dmabuf_open_of_its_token():
    replay = session.Replay([])
    _opened(replay)
    imp = bytearray(24)
    imp[0:4] = struct.pack("<I", c.UalinkOp.IMPORT)
    imp[8:24] = struct.pack("<QQ", 0xAB00, 0xCD)
    out = struct.pack("<I", 77).ljust(24, b"\0")
    rec = _ioctl("AMDGPU_UALINK_HANDLE", UALINK, bytes(imp), out)
    call = replay.plan(rec)
    assert isinstance(call, session.IoctlCall)
    call.sent = bytes(call.arg)
    diffs = replay.compare(2, rec, call, session.Outcome(-22, arg=bytes(imp)))
    assert [d.what for d in diffs] == ["= -1 EINVAL, recorded = 0"]
    dmabuf = _rec("open", path="dmabuf/77", token=77, key=5, file=2, result=0)
    skip = replay.plan(dmabuf)
    assert isinstance(skip, session.Skip) and skip.because == 2
    assert isinstance(replay.plan(_rec("release", path="dmabuf", file=2)), session.Skip)


def test_release_of_a_file_opened_before_the_recording_is_not_a_difference():
    """`ualinkd record` attached mid-session (or `--pid`): a release of a file it never saw
    opened is nothing to replay; an ioctl on such a file cannot be replayed (a difference)."""
    replay = session.Replay([])
    skip = replay.plan(_rec("release", path="dri/renderD128", file=4))
    assert isinstance(skip, session.Skip) and skip.because is None
    assert isinstance(replay.plan(_ioctl("GEM_CLOSE", GEM_CLOSE, bytes(8), b"")), str)


def test_gpu_load_compares_the_bytes_loaded():
    replay = session.Replay([])
    _opened(replay)
    rec = _rec("gpu", op="load", va=0x1000, length=4, result=4, data_hex="68656c6c")
    call = replay.plan(rec)
    assert isinstance(call, session.GpuCall)
    assert replay.compare(2, rec, call, session.Outcome(4, data=b"hell")) == []
    (d,) = replay.compare(3, rec, call, session.Outcome(4, data=b"help"))
    assert "loaded bytes differ from offset 0x3" in d.what


def test_timeline_orders_by_completion_and_keeps_a_pids_releases():
    recs = [_rec("ioctl", time=1.0, duration=5.0, pid=1),  # a wait that blocked
            _rec("ioctl", time=2.0, pid=2),  # the signal it waited for
            _rec("open", time=0.5, pid=1, file=9),
            _rec("release", time=7.0, pid=0, file=9),
            _rec("fabric", time=1.5)]
    assert [r["time"] for r in session.timeline(recs)] == [0.5, 2.0, 1.0, 7.0]
    assert [r["time"] for r in session.timeline(recs, pids={1})] == [0.5, 1.0, 7.0]


def test_a_v1_trace_is_refused_as_a_recording():
    line = json.dumps({"v": 1, "type": "ioctl"})
    try:
        session.load([line])
    except ValueError as e:
        assert "schema 1" in str(e)
    else:
        raise AssertionError("a v1 trace was taken as a recording")


def test_record_pid_filter_keeps_that_pid_and_releases():
    out = io.StringIO()
    for rec in ({"type": "ioctl", "pid": 1}, {"type": "ioctl", "pid": 2},
                {"type": "release", "pid": 0}):
        _keep(json.dumps(rec).encode(), {1}, out)
    assert [json.loads(x)["pid"] for x in out.getvalue().splitlines()] == [1, 0]


# -- what a traced node records ---------------------------------------------------------------
def test_traced_node_records_opens_caller_memory_and_handed_out_values():
    """Schema 2: the render node's open with its file id, GEM_CREATE's handle in `handed`,
    SYNCOBJ_WAIT's handle array in `mem` as read from the caller."""
    recs: list = []
    memory = {0x9000: struct.pack("<I", 1)}

    async def copy_from_user(pid: int, addr: int, size: int) -> bytes:
        return memory[addr][:size]

    async def copy_to_user(pid: int, addr: int, data: bytes) -> None:
        memory[addr] = data

    core = NodeCore(pod_config(nodes=[[{"id": 0}]]), "node0", NodeServices(tracer=recs.append,
                    copy_from_user=copy_from_user, copy_to_user=copy_to_user))
    f = open_file(core)
    inp = st.GEM_CREATE_IN.encode(st.GemCreateIn(4096, 0, c.DOMAIN_VRAM, 0))
    run(core.ioctl(f, GEM_CREATE, inp, 32, CALLER))
    run(core.ioctl(f, ioc(3, 0x64, 0xBF, 8), bytes(8), 8, CALLER))  # SYNCOBJ_CREATE
    wait = struct.pack("<QqIIIIQ", 0x9000, 0, 1, 0, 0, 0, 0)
    run(core.ioctl(f, SYNCOBJ_WAIT, wait, 40, CALLER))
    core.release_render(f)
    d = [r.as_dict() for r in recs]
    assert [x["type"] for x in d] == ["open", "ioctl", "ioctl", "ioctl", "release"]
    assert d[0]["path"] == "dri/renderD128" and d[0]["pid"] == CALLER.pid
    assert {x["file"] for x in d} == {d[0]["file"]}
    assert d[1]["handed"] == [{"kind": "gem", "field": "handle", "value": 1}]
    assert d[2]["handed"] == [{"kind": "syncobj", "field": "handle", "value": 1}]
    assert d[3]["mem"] == [{"op": "read", "addr": 0x9000, "len": 4, "hex": "01000000",
                            "result": 0}]


@settings(max_examples=200, deadline=None)
@given(st_h.lists(st_h.tuples(st_h.booleans(), st_h.integers(0, 30)), max_size=60),
       st_h.randoms(use_true_random=False))
def test_mapper_never_flags_two_runs_of_one_session(ops, rnd):
    """Two runs of one create/close sequence, each with its own idr (the recording's hands
    out the lowest free handle from 1, drm_gem_handle_create's idr_alloc; the replay's any
    free value): learn never reports a problem, and every live handle maps to its twin. A
    replay value still live for another handle is always reported."""
    m = Mapper()
    rec_live: dict[int, int] = {}  # recorded -> replayed
    for create, pick in ops:
        if create or not rec_live:
            r = next(h for h in range(1, 100) if h not in rec_live)
            p = rnd.choice([h for h in range(1, 200) if h not in rec_live.values()])
            assert m.learn("gem", SCOPE, r, p) is None
            rec_live[r] = p
        else:
            r = sorted(rec_live)[pick % len(rec_live)]
            m.forget("gem", SCOPE, r)
            del rec_live[r]
        assert all(m.to_replay("gem", SCOPE, r) == p for r, p in rec_live.items())
    if rec_live:
        r = next(h for h in range(1, 100) if h not in rec_live)
        assert m.learn("gem", SCOPE, r, next(iter(rec_live.values()))) is not None


def test_a_recording_that_lost_records_is_a_difference(tmp_path):
    """`ualinkd record` fell behind (a `lost` line): the replay says so and fails."""
    from ualinkd.replay.issue import run as replay_run

    (tmp_path / "dri").mkdir()
    (tmp_path / "dri/renderD128").write_bytes(b"")
    opened = _rec("open", time=0.5, path="dri/renderD128")
    path = tmp_path / "rec.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (
        opened, {"v": 2, "type": "lost", "count": 3}, {**opened, "type": "release"})))
    out = io.StringIO()
    (d,) = replay_run(str(path), {"": str(tmp_path)}, out=out)
    assert "lost 3 records" in d.what and "lost 3 records" in out.getvalue()


def test_index_keeps_what_orders_a_replay_and_where_each_record_starts():
    """A streamed replay (`ualinkd replay` reads the file twice rather than holding it):
    `index_records` checks every line as `load` does, but keeps of each record only what
    `timeline` and Replay's bookkeeping read, and its line's offset, from which the whole
    record is read back at its turn."""
    recs = [_rec("open", time=0.5, pid=1, file=9, path="dri/renderD128"),
            _rec("ioctl", time=1.0, duration=5.0, pid=1, file=9, ioctl="GEM_CLOSE",
                 cmd=f"{GEM_CLOSE:#010x}", in_hex="00" * 64, out_hex="", result=0),
            {"v": 2, "type": "lost", "count": 2},
            _rec("release", time=7.0, pid=0, file=9)]
    text = "".join(json.dumps(r) + "\n" + ("\n" if i == 1 else "") for i, r in enumerate(recs))
    data = text.encode()
    lines, at = [], 0
    for line in data.splitlines(keepends=True):
        lines.append((at, line))
        at += len(line)
    index = session.index_records(lines).records
    assert [r["type"] for r in index] == ["open", "ioctl", "lost", "release"]
    assert all(set(r) <= {*session.INDEX_FIELDS, "at"} for r in index)
    assert "in_hex" not in index[1] and "path" not in index[0]
    for r, whole in zip(index, recs, strict=True):
        assert json.loads(data[r["at"]:].split(b"\n", 1)[0]) == whole
    order = session.timeline(index)
    assert [r["time"] for r in order] == [0.5, 1.0, 7.0]
    full = {r["at"]: whole for r, whole in zip(index, recs, strict=True)}
    replay = session.Replay(order, lambda r: full[r["at"]])
    assert [rec for _, rec in replay.steps()] == [recs[0], recs[1], recs[3]]
    assert replay.recorded_opens == {("node0", 9)}
    # the same refusals as load, with the same line numbers (blank lines counted)
    bad = [(0, b"{}\n"), (3, b"\n"), (4, b"not json\n")]
    for lines_, why in ((bad[:1], "line 1: not a trace record"),
                        (bad[1:], "line 2: not JSON"),
                        ([(0, b"\xff\n")], "line 1: not UTF-8")):
        try:
            session.index_records(lines_)
        except session.RecordingError as e:
            assert why in str(e), e
        else:
            raise AssertionError(f"{lines_} was taken as a recording")


AMDGPU_INFO = ioc(1, 0x64, 0x45, 32)


def test_a_pointer_whose_recorded_access_faulted_goes_unpatched():
    """The recorded caller passed a bad pointer (INFO's return_pointer 0x10, SYNCOBJ_WAIT's
    handles 0x10): its access is in `mem` with result -EFAULT. The replay passes that value
    as it was, with no buffer behind it, so its daemon faults too; it answers as recorded."""
    replay = session.Replay([])
    _opened(replay)
    info = struct.pack("<QII", 0x10, 4, 0x00).ljust(32, b"\0")  # ACCEL_WORKING
    wait = struct.pack("<QqIIIIQ", 0x10, 0, 1, 0, 0, 0, 0)
    for name, cmd, arg, op in (("AMDGPU_INFO", AMDGPU_INFO, info, "write"),
                               ("SYNCOBJ_WAIT", SYNCOBJ_WAIT, wait, "read")):
        hexed = "01000000" if op == "write" else ""
        rec = _ioctl(name, cmd, arg, arg, result=-14, mem=[
            {"op": op, "addr": 0x10, "len": 4, "hex": hexed, "result": -14}])
        call = replay.plan(rec)
        assert isinstance(call, session.IoctlCall)
        assert call.buffers == [] and call.patches == [] and bytes(call.arg) == arg
        call.sent = bytes(call.arg)
        assert replay.compare(2, rec, call, session.Outcome(-14, arg=arg)) == []


def test_a_faulted_access_beside_good_ones_leaves_those_their_buffers():
    """SYNCOBJ_WAIT's array read, then a faulting access elsewhere: the array still gets
    the replay's buffer and its patched pointer; the fault's address none."""
    replay = session.Replay([])
    _opened(replay)
    addr = 0x7FFD0000
    wait = struct.pack("<QqIIIIQ", addr, 0, 1, 0, 0, 0, 0)
    rec = _ioctl("SYNCOBJ_WAIT", SYNCOBJ_WAIT, wait, wait, result=-14, mem=[
        {"op": "read", "addr": addr, "len": 4, "hex": "01000000", "result": 0},
        {"op": "write", "addr": 0x10, "len": 4, "hex": "00000000", "result": -14}])
    call = replay.plan(rec)
    assert isinstance(call, session.IoctlCall)
    assert len(call.buffers) == 1 and call.patches == [(-1, 0, 0, 0)]
