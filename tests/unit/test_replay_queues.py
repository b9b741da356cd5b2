"""What `ualinkd replay` does with a recording that has user queues (issue 30 item 6): the
`queue` records (doorbells, packets the engine decoded, errors) are not replayed — the
packets are in the ring, the client's CPU memory, which no recorded call carries — and the
replay says so, in one summary line and queue by queue with -v; the queue ioctls are
replayed, a queue id and doorbell cookie handed out differently are mapped like the other
handles (kfd_ioctl.h's kfd_ioctl_create_queue_args; pqm_create_queue gives the first queue
id 0), and a call on a queue whose CREATE_QUEUE failed in the replay is not issued."""

from __future__ import annotations

import errno
import json
import struct

import pytest
import ualink_testkit as kit

from ualinkd.abi import ioctls
from ualinkd.cli.main import main
from ualinkd.replay import session
from ualinkd.replay.mapping import Mapper

# (replays into plain directories: conftest.py's plain_dirs_as_mounts)
pytestmark = pytest.mark.usefixtures("plain_dirs_as_mounts")

CREATE_QUEUE = ioctls.KFD_CREATE_QUEUE.cmd
DESTROY_QUEUE = ioctls.KFD_DESTROY_QUEUE.cmd
UPDATE_QUEUE = ioctls.KFD_UPDATE_QUEUE.cmd


def _queue(event: str, qid: int = 0, pid: int = 10, node: str = "node0", value: int = 0,
           detail: str = "", t: float = 1.0) -> dict:
    """A queue record as trace.QueueRecord writes it."""
    return {"v": 2, "type": "queue", "time": t, "pid": pid, "node": node, "minor": 128,
            "accel": 0, "queue_id": qid, "queue_type": "sdma", "event": event,
            "value": value, "detail": detail}


def _rec(kind: str, **kw: object) -> dict:
    base = {"v": 2, "type": kind, "time": kw.pop("time", 1.0), "duration": 0.0,
            "pid": 10, "node": "node0", "file": 1}
    base.update(kw)
    return base


def _create_args(qid: int = 0, doorbell: int = 0) -> bytes:
    """kfd_ioctl_create_queue_args (88 bytes, libhsakmt 5.2.3's): ring 0x10000, wptr/rptr,
    doorbell_offset @24 and queue_id @52 copied out."""
    return struct.pack("<QQQQIIIIIIQQQII", 0x10000, 0x20008, 0x20010, doorbell, 4096,
                       0xF79B, 1, 100, 15, qid, 0, 0, 0, 0, 0)


def _ioctl(name: str, cmd: int, in_bytes: bytes, out_bytes: bytes, result: int = 0) -> dict:
    return _rec("ioctl", ioctl=name, cmd=f"{cmd:#010x}", in_hex=in_bytes.hex(),
                out_hex=out_bytes.hex(), result=result, mem=[], fds=[])


def _opened_kfd(replay: session.Replay) -> None:
    rec = _rec("open", path="kfd", minor=0, token=None, key=None, result=0)
    call = replay.plan(rec)
    assert isinstance(call, session.OpenCall)
    assert replay.compare(1, rec, call, session.Outcome(0, fd=3)) == []


def _issue(replay: session.Replay, index: int, rec: dict,
           out: session.Outcome) -> list[session.Difference]:
    call = replay.plan(rec)
    assert isinstance(call, session.IoctlCall), call
    call.sent = bytes(call.arg)
    return replay.compare(index, rec, call, out)


# -- the account of what is not replayed ------------------------------------------------------
def test_queue_summary_counts_each_queue_life():
    """A queue id reused after its destroy is another queue; a queue whose create is not in
    the recording was made before it; errors keep their ring offset and reason."""
    recs = [_queue("doorbell", 3, value=0x40), _queue("packet", 3),
            _queue("create", 0), _queue("doorbell", 0, value=0x40), _queue("packet", 0),
            _queue("packet", 0), _queue("destroy", 0),
            _queue("create", 0), _queue("doorbell", 0, value=0x20),
            _queue("error", 0, value=0x20, detail="unknown packet op 255"),
            _queue("create", 1, pid=11),
            _rec("ioctl", ioctl="GEM_CLOSE")]
    s = session.queue_summary(recs)
    assert (s.records, s.doorbells, s.packets, s.errors, len(s.queues)) == (11, 3, 3, 1, 4)
    before, first, again, other = s.queues
    assert before.note() == ("[pid 10] node0 queue 3 (sdma): created before the recording, "
                             "1 doorbells, 1 packets, not destroyed in the recording")
    assert first.note() == ("[pid 10] node0 queue 0 (sdma): created, 1 doorbells, 2 packets, "
                            "destroyed")
    assert again.note() == ("[pid 10] node0 queue 0 (sdma): created, 1 doorbells, 0 packets, "
                            "stopped in error at ring offset 0x20: unknown packet op 255, "
                            "not destroyed in the recording")
    assert other.pid == 11 and other.created and not other.doorbells
    assert s.line() == (
        "not replayed: 11 queue records (3 doorbells, 3 packets, 1 queue errors on 4 queues): "
        "the rings' contents are the client's CPU memory, not in the recording; the queues' "
        "ioctls are replayed, their doorbells and packets are not")
    mine = session.queue_summary(recs, pids={11})
    assert (mine.records, len(mine.queues)) == (1, 1)
    assert session.queue_summary(recs, nodes={"node1"}).line() is None


def test_index_keeps_what_the_queue_summary_reads_and_checks_it():
    lines = [json.dumps(_queue("error", 2, value=0x40, detail="bad")) + "\n"]
    (rec,) = session.index_records(enumerate(lines)).records
    assert {k: rec[k] for k in ("type", "event", "queue_id", "queue_type", "value")} == {
        "type": "queue", "event": "error", "queue_id": 2, "queue_type": "sdma", "value": 0x40}
    assert "detail" not in rec  # (read back whole when -v prints it)
    bad = [json.dumps({**_queue("doorbell"), "queue_id": "0"}) + "\n"]
    try:
        session.index_records(enumerate(bad))
    except session.RecordingError as e:
        assert str(e) == 'line 1: `queue_id` is not an integer ("0")'
    else:
        raise AssertionError("a queue record with a string queue_id was accepted")


OPENED = {"v": 2, "type": "open", "time": 0.5, "pid": 10, "node": "node0", "file": 1,
          "path": "dri/renderD128"}
RELEASED = {**OPENED, "type": "release", "time": 3.0}


def test_replay_says_what_of_the_queues_it_does_not_replay(tmp_path, capsys):
    """The CLI prints the summary line before its last line (and per queue with -v); not
    a difference: a recording whose calls all replay exits 0."""
    path = kit.write_recording(tmp_path, OPENED, _queue("create", 0, t=1.0),
                  _queue("doorbell", 0, value=0x20, t=1.1),
                  _queue("packet", 0, detail="FENCE(addr=0x1000, data=0x1)", t=1.2),
                  _queue("error", 1, value=0x8, detail="unknown packet", t=1.3), RELEASED)
    assert main(["replay", str(path), "--mount", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2] == (
        "not replayed: 4 queue records (1 doorbells, 1 packets, 1 queue errors on 2 queues): "
        "the rings' contents are the client's CPU memory, not in the recording; the queues' "
        "ioctls are replayed, their doorbells and packets are not")
    assert lines[-1].startswith("replayed 2 records (0 ioctls and GPU accesses)")
    assert not any("queue not replayed" in ln for ln in lines)
    assert main(["replay", "-v", str(path), "--mount", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-4:-2] == [
        "  queue not replayed: [pid 10] node0 queue 0 (sdma): created, 1 doorbells, "
        "1 packets, not destroyed in the recording",
        "  queue not replayed: [pid 10] node0 queue 1 (sdma): created before the recording, "
        "0 doorbells, 0 packets, stopped in error at ring offset 0x8: unknown packet, "
        "not destroyed in the recording"]


def test_a_recording_without_queues_says_nothing_of_them(tmp_path, capsys):
    path = kit.write_recording(tmp_path, OPENED, RELEASED)
    assert main(["replay", str(path), "--mount", str(tmp_path)]) == 0
    assert "not replayed" not in capsys.readouterr().out


# -- the queue ioctls ---------------------------------------------------------------------------
def test_a_queue_id_handed_out_differently_is_mapped_into_later_calls():
    """Queue 0 is a queue like any other (not "0 where the recording had a value"); a
    re-created queue's doorbell cookie may differ; DESTROY_QUEUE and UPDATE_QUEUE name the
    replay's queue, and its id is free again after the destroy."""
    replay = session.Replay([])
    _opened_kfd(replay)
    first = _ioctl("AMDKFD_CREATE_QUEUE", CREATE_QUEUE, _create_args(), _create_args(0, 0x1000))
    assert _issue(replay, 2, first, session.Outcome(0, arg=_create_args(0, 0x1000))) == []
    second = _ioctl("AMDKFD_CREATE_QUEUE", CREATE_QUEUE, _create_args(),
                    _create_args(1, 0x1008))
    assert _issue(replay, 3, second, session.Outcome(0, arg=_create_args(2, 0x1010))) == []
    upd = struct.pack("<QIIII", 0x10000, 1, 4096, 0, 15)
    call = replay.plan(_ioctl("AMDKFD_UPDATE_QUEUE", UPDATE_QUEUE, upd, b""))
    assert isinstance(call, session.IoctlCall) and call.arg[8:12] == struct.pack("<I", 2)
    destroy = _ioctl("AMDKFD_DESTROY_QUEUE", DESTROY_QUEUE, struct.pack("<II", 1, 0),
                     struct.pack("<II", 1, 0))
    call = replay.plan(destroy)
    assert isinstance(call, session.IoctlCall) and call.arg[:4] == struct.pack("<I", 2)
    call.sent = bytes(call.arg)
    assert replay.compare(4, destroy, call, session.Outcome(0, arg=bytes(call.arg))) == []
    # queue 1 again, handed out as 2 again now that 2 is free: not a broken pattern
    again = _ioctl("AMDKFD_CREATE_QUEUE", CREATE_QUEUE, _create_args(), _create_args(1, 0x1008))
    assert _issue(replay, 5, again, session.Outcome(0, arg=_create_args(2, 0x1010))) == []


def test_a_queue_id_the_recording_had_for_another_queue_is_a_difference():
    replay = session.Replay([])
    _opened_kfd(replay)
    a = _ioctl("AMDKFD_CREATE_QUEUE", CREATE_QUEUE, _create_args(), _create_args(0, 0x1000))
    assert _issue(replay, 2, a, session.Outcome(0, arg=_create_args(0, 0x1000))) == []
    b = _ioctl("AMDKFD_CREATE_QUEUE", CREATE_QUEUE, _create_args(), _create_args(1, 0x1008))
    (d,) = _issue(replay, 3, b, session.Outcome(0, arg=_create_args(0, 0x1008)))
    assert d.what.startswith("queue_id (kfd_queue): recorded 0x1 (new), replayed 0x0"), d


def test_a_call_on_a_queue_the_replay_did_not_create_is_not_issued():
    """CREATE_QUEUE failing in the replay (its ring not mapped there) is the difference;
    the DESTROY_QUEUE of that queue follows from it: a Skip naming it, not another
    EINVAL difference; a queue the replay did make is destroyed as recorded."""
    replay = session.Replay([])
    _opened_kfd(replay)
    ok = _ioctl("AMDKFD_CREATE_QUEUE", CREATE_QUEUE, _create_args(), _create_args(0, 0x1000))
    (d,) = _issue(replay, 2, ok, session.Outcome(-errno.EINVAL, arg=_create_args()))
    assert d.what == "= -1 EINVAL, recorded = 0"
    skip = replay.plan(_ioctl("AMDKFD_DESTROY_QUEUE", DESTROY_QUEUE, struct.pack("<II", 0, 0),
                              struct.pack("<II", 0, 0)))
    assert skip == session.Skip(2, "the replay's CREATE_QUEUE did not make queue 0")
    # given back: a later queue 0 of the recording is the replay's to make again
    again = replay.plan(_ioctl("AMDKFD_DESTROY_QUEUE", DESTROY_QUEUE,
                               struct.pack("<II", 0, 0), struct.pack("<II", 0, 0)))
    assert isinstance(again, session.IoctlCall)


def test_mapper_zero_is_a_queue_id_and_not_a_gem_handle():
    m = Mapper()
    assert m.learn("kfd_queue", ("node0", 1), 0, 3) is None
    assert m.to_replay("kfd_queue", ("node0", 1), 0) == 3
    assert m.learn("gem", ("node0", 1), 0, 3) is not None


# -- the memory a queue lives in: userptr allocations ----------------------------------------
def test_a_userptr_allocation_names_the_range_the_replay_maps():
    """KFD_IOC_ALLOC_MEM_FLAGS_USERPTR (mmap_offset the address) and AMDGPU_GEM_USERPTR
    take the caller's own pages; other allocations take none."""
    kfd = struct.pack("<QQQQII", 0x7F0000000000, 8192, 0, 0x7F0000001000, 0xF79B, 0xD6000004)
    assert session.user_pages("AMDKFD_ALLOC_MEMORY_OF_GPU", kfd) == (0x7F0000001000, 8192)
    gtt = struct.pack("<QQQQII", 0x7F0000000000, 8192, 0, 0, 0xF79B, 0xD6000002)
    assert session.user_pages("AMDKFD_ALLOC_MEMORY_OF_GPU", gtt) is None
    gem = struct.pack("<QQII", 0x7E0000000000, 4096, 0, 0)
    assert session.user_pages("AMDGPU_GEM_USERPTR", gem) == (0x7E0000000000, 4096)
    assert session.user_pages("AMDGPU_GEM_CREATE", gem) is None


def test_the_issuer_maps_zero_pages_only_where_the_replayer_has_none():
    """The recorded client's pages at a userptr address become zero pages of the replayer
    (an overlapping second allocation reuses them); a range over the replayer's own memory
    is refused, never pinned (a replayed GPU store would write into the replayer)."""
    import ctypes

    from ualinkd.replay.issue import PAGE, Issuer

    issuer = Issuer({})
    free = 0x3F0000000000  # (far below the mmap base and above the heap: unused)
    try:
        assert issuer.user_pages(free, 4 * PAGE) is None
        assert ctypes.string_at(free, 4 * PAGE) == bytes(4 * PAGE)
        assert issuer.user_pages(free + 2 * PAGE, 4 * PAGE) is None  # half of it already ours
        assert sorted(issuer.user_ranges) == [(free, free + 4 * PAGE),
                                                       (free + 4 * PAGE, free + 6 * PAGE)]
        own = ctypes.create_string_buffer(4 * PAGE)
        start = (ctypes.addressof(own) + PAGE - 1) // PAGE * PAGE
        why = issuer.user_pages(start, PAGE)
        assert why is not None and "has memory of its own" in why and "EEXIST" in why
        assert issuer.user_pages(free, 1 << 40) is not None  # past MAX_USER_PAGES
    finally:
        issuer.close_all()
    assert issuer.user_ranges == []


def test_an_event_wait_on_a_node_whose_queues_ran_is_bounded_and_says_why_it_differs():
    """A wait a queue's TRAP ended in the recording cannot end in the replay (no packet
    runs): on a node whose queues ran, the wait is sent with its recorded time + 250 ms
    as its timeout (never ROCr's forever), the timeout echoed back is not a difference,
    and a wait that then differs says why."""
    replay = session.Replay([])
    _opened_kfd(replay)
    replay.queues_ran = {"node0"}
    cmd = ioctls.KFD_WAIT_EVENTS.cmd
    args = struct.pack("<QIIII", 0, 1, 1, 0xFFFFFFFE, 0)
    rec = {**_ioctl("AMDKFD_WAIT_EVENTS", cmd, args, args), "duration": 0.5}
    call = replay.plan(rec)
    assert isinstance(call, session.IoctlCall)
    assert struct.unpack_from("<I", call.arg, 16)[0] == 750
    call.sent = bytes(call.arg)
    timed_out = bytearray(call.arg)
    timed_out[20:24] = struct.pack("<I", 1)
    (d,) = replay.compare(2, rec, call, session.Outcome(0, arg=bytes(timed_out)))
    assert d.what == ("copied-out bytes differ at offset 20: 01000000, recorded 00000000"
                      + session.QUEUE_EVENTS_NOTE), d
    assert replay.compare(3, rec, call, session.Outcome(0, arg=call.sent)) == []
    short = {**rec, "in_hex": struct.pack("<QIIII", 0, 1, 1, 100, 0).hex()}
    call = replay.plan(short)
    assert isinstance(call, session.IoctlCall)
    assert struct.unpack_from("<I", call.arg, 16)[0] == 100  # (its own, shorter)
    replay.queues_ran = set()
    call = replay.plan(rec)
    assert isinstance(call, session.IoctlCall)
    assert struct.unpack_from("<I", call.arg, 16)[0] == 0xFFFFFFFE  # no queues: as recorded
    call.sent = bytes(call.arg)
    timed_out = bytearray(call.arg)
    timed_out[20:24] = struct.pack("<I", 1)
    (d,) = replay.compare(4, rec, call, session.Outcome(0, arg=bytes(timed_out)))
    assert not d.what.endswith(session.QUEUE_EVENTS_NOTE)
