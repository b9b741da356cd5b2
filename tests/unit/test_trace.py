"""--trace rendering: strace-like text and one JSON object a line (STYLE rule 6: the same
ioctl table drives dispatch and the trace decoder, its per-field hints the formatting; spec
§1.4 for what failures carry; issue 12 for the format)."""

from __future__ import annotations

import io
import itertools
import json
import os
import struct
import time

import pytest
from ualink_testkit import (
    CALLER,
    GEM_CREATE,
    GEM_VA,
    PRIME_FLAGS,
    PRIME_HANDLE_TO_FD,
    UALINK,
    ScriptedBits,
    attach_remote_access,
    iowr,
    open_file,
    pod_config,
    run,
)

from ualinkd.abi import constants as c
from ualinkd.abi import ioctls as tbl
from ualinkd.abi import structs as st
from ualinkd.abi.ioc import ioc
from ualinkd.drm.errors import DrmError
from ualinkd.node import NodeCore, NodeServices
from ualinkd.trace import (
    SCHEMA_VERSION,
    FabricRecord,
    GpuAccessRecord,
    TraceFilter,
    TraceRecord,
)
from ualinkd.ualink.protocol import NpaReq

T0 = 1_700_000_000.25  # 22:13:20.250000 UTC


@pytest.fixture(autouse=True)
def utc(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.fixture
def core():
    recs: list = []
    bits = ScriptedBits(0x1111_2222_3333_4000, 0x5555_6666_7777_8888)
    ticks = [itertools.count()]
    # Every call of the clock advances 125 µs: a request starts at one tick, ends at the next.
    node = NodeCore(pod_config(nodes=[[{"id": 0}]]), "node0", NodeServices(
        resolve_fd=lambda p, f: f, tracer=recs.append, randbits=bits,
        trace_clock=lambda: T0 + next(ticks[0]) * 0.000125))
    node.recs = recs  # type: ignore[attr-defined]
    node.ticks = ticks  # type: ignore[attr-defined]
    return node


@pytest.fixture
def traced(core):
    f = open_file(core)
    core.ticks[0] = itertools.count()  # the open's record took a tick: calls start at T0

    def call(cmd: int, data: bytes) -> TraceRecord:
        run(core.ioctl(f, cmd, data, (cmd >> 16) & 0x3FFF, CALLER))
        return core.recs[-1]

    call.file = f  # type: ignore[attr-defined]
    return call


def check_json(rec) -> dict:
    line = rec.json()
    assert "\n" not in line
    d = json.loads(line)
    assert d == rec.as_dict() and d["v"] == SCHEMA_VERSION
    return d


def gem_create(traced, size=4096, domains=c.DOMAIN_VRAM, flags=0) -> TraceRecord:
    return traced(GEM_CREATE, st.GEM_CREATE_IN.encode(st.GemCreateIn(size, 0, domains, flags)))


def test_success_record(traced):
    """§2.3: a successful GEM_CREATE: strace -tt time, hex sizes, named domains and flags,
    the copied-back handle after =>, the -T duration."""
    rec = gem_create(traced, 0x200000, c.DOMAIN_VRAM | c.DOMAIN_GTT,
                     c.CREATE_VRAM_CLEARED | c.CREATE_CPU_ACCESS_REQUIRED | 1 << 20)
    assert rec.text() == (
        "22:13:20.250000 [pid 4242] node0 renderD128 DRM_IOCTL_AMDGPU_GEM_CREATE({"
        "bo_size=0x200000, alignment=0, domains=AMDGPU_GEM_DOMAIN_GTT|AMDGPU_GEM_DOMAIN_VRAM, "
        "domain_flags=AMDGPU_GEM_CREATE_CPU_ACCESS_REQUIRED|AMDGPU_GEM_CREATE_VRAM_CLEARED|"
        "0x100000}) = -1 EINVAL (Invalid argument) <0.000125>")
    rec = gem_create(traced, 4096)
    assert rec.text().endswith(
        "DRM_IOCTL_AMDGPU_GEM_CREATE({bo_size=0x1000, alignment=0, "
        "domains=AMDGPU_GEM_DOMAIN_VRAM, domain_flags=0} => {handle=1}) = 0 <0.000125>")
    d = check_json(rec)
    assert (d["type"], d["ioctl"], d["dir"], d["size"], d["result"], d["errno"]) == (
        "ioctl", "AMDGPU_GEM_CREATE", "WR", 32, 0, None)
    assert d["in"]["bo_size"] == 4096
    assert d["in"]["domains"] == {"value": 4, "names": ["AMDGPU_GEM_DOMAIN_VRAM"]}
    assert d["in"]["domain_flags"] == {"value": 0, "names": []}
    assert d["out"] == {"handle": 1}
    assert d["out_hex"] == "01" + "00" * 31
    assert d["time"] == T0 + 2 * 0.000125 and d["duration"] == pytest.approx(0.000125, abs=1e-6)
    assert (d["pid"], d["node"], d["minor"], d["accel"]) == (4242, "node0", 128, 0)


def test_unknown_flag_bits_are_kept_in_json(traced):
    rec = gem_create(traced, 4096, c.DOMAIN_VRAM, 1 << 20)
    d = check_json(rec)
    assert d["in"]["domain_flags"] == {"value": 1 << 20, "names": [], "unknown": 1 << 20}
    assert d["errno"] == "EINVAL" and d["result"] == -22


def test_ualink_export_record(traced):
    """§1.4: export success shows the 128-bit handle as one number; op is named."""
    gem_create(traced)
    rec = traced(UALINK, struct.pack("<IIIIQ", 0, 0, 1, 0, 0))
    assert rec.text().endswith(
        "DRM_IOCTL_AMDGPU_UALINK_HANDLE({op=EXPORT, flags=0, gem_handle=1} => "
        "{export_ualink_handle=0x55556666777788881111222233334000}) = 0 <0.000125>")
    d = check_json(rec)
    assert d["in"]["op"] == {"value": 0, "name": "EXPORT"}
    assert d["out"] == {"export_ualink_handle": "0x55556666777788881111222233334000"}


def test_failure_record_shows_errno_message(traced):
    """§1.4: a failure: `-1 EINVAL (Invalid argument)`; the core echoed the bytes unchanged,
    so nothing follows =>; JSON keeps the raw bytes."""
    data = struct.pack("<IIQQ", 1, 0, 0x3FF, 7)
    rec = traced(UALINK, data)
    assert rec.text() == (
        "22:13:20.250000 [pid 4242] node0 renderD128 DRM_IOCTL_AMDGPU_UALINK_HANDLE({op=IMPORT, "
        "flags=0, import_ualink_handle=0x700000000000003ff}) = -1 EINVAL (Invalid argument) "
        "<0.000125>")
    d = check_json(rec)
    assert (d["result"], d["errno"], d["out"], d["out_hex"]) == (-22, "EINVAL", {}, data.hex())
    assert d["in"]["import_ualink_handle"] == "0x000000000000000700000000000003ff"


def test_gem_va_record(traced):
    """§2.6: the VA, offset and size in hex, operation and page flags by name."""
    h = TraceRecord.as_dict(gem_create(traced, 0x200000))["out"]["handle"]
    va = st.GEM_VA.encode(st.GemVa(h, 0, c.VA_OP_MAP, c.VM_PAGE_READABLE | c.VM_PAGE_WRITEABLE,
                                   0x7F0000200000, 0, 0x200000, 0, 0, 0, 0))
    rec = traced(GEM_VA, va)
    assert ("({handle=1, _pad=0, operation=MAP, flags=AMDGPU_VM_PAGE_READABLE|"
            "AMDGPU_VM_PAGE_WRITEABLE, va_address=0x7f0000200000, offset_in_bo=0, "
            "map_size=0x200000, vm_timeline_point=0, vm_timeline_syncobj_out=0, "
            "num_syncobj_handles=0, input_fence_syncobj_handles=0}) = 0") in rec.text()
    d = check_json(rec)
    assert d["in"]["operation"] == {"value": 1, "name": "MAP"}
    assert d["in"]["va_address"] == 0x7F0000200000
    assert d["in"]["flags"]["names"] == ["AMDGPU_VM_PAGE_READABLE", "AMDGPU_VM_PAGE_WRITEABLE"]


def test_legacy_gem_va_shows_its_size_and_only_the_fields_it_passed(traced):
    """libdrm 2.4.114's 40-byte drm_amdgpu_gem_va: drm_ioctl zero-fills the kernel's 64
    bytes past the caller's 40, so vm_timeline_point and what follows are not the caller's
    and are not printed; the name says the size (JSON has every field, and cmd/size)."""
    gem_create(traced, 0x200000)
    va = st.GEM_VA.encode(st.GemVa(1, 0, c.VA_OP_MAP, c.VM_PAGE_READABLE, 0x7F0000200000, 0,
                                   0x200000, 0, 0, 0, 0))[:st.GEM_VA_LEGACY_SIZE]
    rec = traced(ioc(1, 0x64, 0x48, st.GEM_VA_LEGACY_SIZE), va)
    assert rec.text().endswith(
        "DRM_IOCTL_AMDGPU_GEM_VA[size 40 of 64]({handle=1, _pad=0, operation=MAP, "
        "flags=AMDGPU_VM_PAGE_READABLE, va_address=0x7f0000200000, offset_in_bo=0, "
        "map_size=0x200000}) = 0 <0.000125>")
    d = check_json(rec)
    assert (d["size"], d["dir"], d["in"]["vm_timeline_point"]) == (40, "W", 0)


def test_caller_number_of_another_size_or_direction_is_named(traced):
    """The DRM core dispatches by nr alone: a caller's _IOC(RW,'d',0x5b,16) or an _IOW
    UALINK_HANDLE reaches the table's entry, and the text line says how its number
    differs (copying in or out only what both directions allow, drm_ioctl)."""
    rec = traced(ioc(3, 0x64, 0x5B, 16), struct.pack("<IIQ", 1, 0, 0x3FF))
    assert "DRM_IOCTL_AMDGPU_UALINK_HANDLE[size 16 of 24]({op=IMPORT," in rec.text()
    rec = traced(ioc(1, 0x64, 0x5B, 24), struct.pack("<IIQQ", 1, 0, 0x3FF, 7))
    assert "DRM_IOCTL_AMDGPU_UALINK_HANDLE[_IOW, kernel _IOWR]({op=IMPORT," in rec.text()
    rec = traced(ioc(1, 0x64, 0x5B, 16), struct.pack("<IIQ", 1, 0, 0x3FF))
    assert "UALINK_HANDLE[_IOW size 16, kernel _IOWR size 24]({" in rec.text()
    rec = traced(ioc(2, 0x64, 0x5B, 24), b"")  # _IOR: nothing is copied in
    assert "UALINK_HANDLE[_IOR, kernel _IOWR]({}) = -1" in rec.text()
    assert "UALINK_HANDLE({op=EXPORT" in traced(UALINK, bytes(24)).text()  # (the table's own)


def test_prime_flags_and_info_query_are_named(traced):
    """drm_prime.c flags (DRM_CLOEXEC|DRM_RDWR) and AMDGPU_INFO's query by name."""
    gem_create(traced)
    rec = traced(PRIME_HANDLE_TO_FD, struct.pack("<IIi", 1, PRIME_FLAGS, -1))
    assert "({handle=1, flags=DRM_CLOEXEC|DRM_RDWR, fd=-1} => {fd=" in rec.text()
    info = TraceRecord(1, "n", 128, tbl.AMDGPU_INFO.cmd, tbl.AMDGPU_INFO,
                       st.INFO.encode(st.AmdgpuInfo(0x7FFD1000, 368, 0x16, (0, 0, 0, 0))),
                       0, b"")
    assert ("DRM_IOCTL_AMDGPU_INFO({return_pointer=0x7ffd1000, return_size=368, "
            "query=DEV_INFO, args=[0, 0, 0, 0]}) = 0") in info.text()
    assert info.as_dict()["in"]["query"] == {"value": 0x16, "name": "DEV_INFO"}


def test_unknown_nr_record(traced):
    """§2.1: no table entry: strace's _IOC spelling, EINVAL, nothing copied back."""
    rec = traced(ioc(3, 0x64, 0x4A, 8), bytes(8))
    assert rec.text() == (
        "22:13:20.250000 [pid 4242] node0 renderD128 _IOC(_IOC_WRITE|_IOC_READ, 0x64, 0x4a, "
        "0x8)({0000000000000000}) = -1 EINVAL (Invalid argument) <0.000125>")
    d = check_json(rec)
    assert (d["ioctl"], d["in"], d["out"], d["out_hex"]) == ("UNKNOWN_NR_0x4a", {}, {}, "")


def test_entry_without_decoder_shows_raw_bytes(traced):
    """A table entry ualinkd does not emulate (AMDGPU_USERQ: ENOTTY) prints its bytes in
    hex."""
    rec = traced(tbl.AMDGPU_IOCTLS[0x56].cmd, bytes(range(64)))
    assert rec.text().endswith("DRM_IOCTL_AMDGPU_USERQ({" + bytes(range(64)).hex()
                               + "}) = -1 ENOTTY (Inappropriate ioctl for device) <0.000125>")


def test_short_input_is_rendered_not_raised(traced):
    """§2.1: a short struct (zero-extended by the core) still renders."""
    rec = traced(ioc(3, 0x64, 0x5B, 8), struct.pack("<II", 0, 0))
    d = check_json(rec)
    assert d["in"] == {"op": {"value": 0, "name": "EXPORT"}, "flags": {"value": 0, "names": []},
                       "gem_handle": 0}
    assert ("UALINK_HANDLE[size 8 of 24]({op=EXPORT, flags=0}) = -1 ENOENT (No such file "
            "or directory)") in rec.text()


def test_every_hint_names_a_field_its_decoder_gives():
    """A hint for a field no decoder produces is a typo that would print silently raw."""
    for spec in tbl.all_entries():
        if not spec.hints:
            continue
        size = st.UALINK_HANDLE_SIZE if spec is tbl.AMDGPU_UALINK_HANDLE else 512
        names, out_names = set(), set()
        for op in range(8):  # (AMDGPU_CTX's ops are 1..6, an unknown UALink op is 7)
            data = struct.pack("<I", op).ljust(size, b"\0")
            inp = spec.decode_in(data) if spec.decode_in else {}
            out = spec.decode_out(data, inp) if spec.decode_out else {}
            names |= set(inp) | set(out)
            out_names |= set(out)
        assert set(spec.hints) <= names, (spec.name, set(spec.hints) - names)
        assert set(spec.out_hints or ()) <= out_names, spec.name


def test_gpu_loads_and_stores_are_traced(traced, core):
    """Policy 10: a GPU store and load at a VA: VA, length, result, the data; a load that
    runs off the mapping faults part-way (short count, fault VA); one wholly outside:
    EFAULT."""
    f = traced.file
    gem_create(traced, 4096)
    va = 0x100000
    traced(GEM_VA, st.GEM_VA.encode(st.GemVa(1, 0, c.VA_OP_MAP, c.VM_PAGE_READABLE
                                             | c.VM_PAGE_WRITEABLE, va, 0, 4096, 0, 0, 0, 0)))
    assert run(core.gpu_write(f, va, b"hello\0", CALLER)) == 6
    store = core.recs[-1]
    assert isinstance(store, GpuAccessRecord)
    assert store.text() == ('22:13:20.250500 [pid 4242] node0 renderD128 GPU_STORE('
                            'va=0x100000, "hello\\0", len=0x6) = 6 <0.000125>')
    run(core.gpu_read(f, va + 4000, 200, CALLER))
    load = core.recs[-1]
    assert load.result == 96 and load.fault_va == va + 4096
    assert load.text().endswith(", len=0xc8) = 96 (GPU fault at va=0x101000) <0.000125>")
    with pytest.raises(DrmError):
        run(core.gpu_read(f, 0x900000, 8, CALLER))
    miss = core.recs[-1]
    assert miss.text().endswith("GPU_LOAD(va=0x900000, len=0x8) = -1 EFAULT (Bad address) "
                                "<0.000125>")
    d = check_json(miss)
    assert (d["type"], d["op"], d["va"], d["length"], d["result"], d["errno"],
            d["fault_va"]) == ("gpu", "load", 0x900000, 8, -14, "EFAULT", 0x900000)
    assert check_json(store)["data_hex"] == b"hello\0".hex()


def test_fabric_record():
    """§5.1: a UALink message with both ends named, the handle halves in hex."""
    msg = NpaReq(0x1234_5678_0400, 0xAABB)
    names = {0: "node0", 1: "node1"}.get
    rec = FabricRecord.ualink("node1", "send", 1, 0, msg.encode(), names, 0, T0, 0.0005)
    assert rec.text() == (
        "22:13:20.250000 node1 fabric send node1/accel1 -> node0/accel0 NPA_REQ{"
        "handle_lo_bits=0x123456780400, handle_hi=0xaabb} = 0 <0.000500>")
    d = check_json(rec)
    assert (d["type"], d["message"], d["src_node"], d["dst_node"], d["fields"]) == (
        "fabric", "NPA_REQ", "node1", "node0",
        {"handle_lo_bits": "0x123456780400", "handle_hi": "0xaabb"})
    recv = FabricRecord.ualink("node0", "recv", 1, 0, msg.encode(), names, start=T0)
    assert recv.text().startswith("22:13:20.250000 node0 fabric recv node1/accel1 -> ")
    assert " = " not in recv.text()


def test_filter(traced):
    """--trace-filter: terms AND, values OR; ioctl names with or without prefixes."""
    gem = gem_create(traced)
    bad = traced(UALINK, struct.pack("<IIQQ", 1, 0, 0x3FF, 7))
    gpu = GpuAccessRecord(7, "node1", 128, 1, "load", 0, 8, 8, bytes(8))
    fab = FabricRecord("node0", "send", "HELLO", 0, 1, "node0", "node1", {}, 0)
    assert TraceFilter().match(gem)
    only = TraceFilter(["ioctl=DRM_IOCTL_AMDGPU_UALINK_HANDLE"])
    assert [only.match(r) for r in (gem, bad, gpu, fab)] == [False, True, True, True]
    f = TraceFilter(["ioctl=gem_create,UALINK_HANDLE", "kind=ioctl"])
    assert [f.match(r) for r in (gem, bad, gpu, fab)] == [True, True, False, False]
    assert [TraceFilter(["failed"]).match(r) for r in (gem, bad, gpu)] == [False, True, False]
    assert [TraceFilter(["accel=1"]).match(r) for r in (gem, gpu, fab)] == [False, True, True]
    assert [TraceFilter(["pid=4242,7"]).match(r) for r in (gem, gpu, fab)] == [
        True, True, False]
    assert [TraceFilter(["node=node1"]).match(r) for r in (gem, gpu, fab)] == [
        False, True, False]
    for bad_term in ("ioctl=NOPE", "kind=syscall", "accel=x", "colour=red", "pid"):
        with pytest.raises(ValueError):
            TraceFilter([bad_term])


def test_tracer_filters_and_survives_a_failing_stream(traced, caplog):
    """daemon.make_tracer: a filtered-out record writes nothing; a stream that fails (a full
    disk) costs the trace line, not the request."""
    import io

    from ualinkd.daemon import make_tracer

    rec = gem_create(traced)
    buf = io.StringIO()
    make_tracer("json", buf, TraceFilter(["kind=gpu"]))(rec)
    assert buf.getvalue() == ""
    make_tracer("json", buf)(rec)
    assert json.loads(buf.getvalue())["ioctl"] == "AMDGPU_GEM_CREATE"

    class Full(io.StringIO):
        def write(self, s: str) -> int:
            raise OSError(28, "No space left on device")

    make_tracer("text", Full())(rec)
    assert "cannot write the record of AMDGPU_GEM_CREATE" in caplog.text


def test_tracer_whose_reader_is_gone_stops_in_one_line(traced, caplog):
    """`ualinkd pod --trace | head`: once the pipe's reader is gone every write is EPIPE.
    The tracer says so once and stops (before, each traced call logged a traceback,
    forever); a full disk that keeps failing is one line per cause with its count, one
    traceback at most."""
    import logging

    from ualinkd.daemon import make_tracer

    rec = gem_create(traced)
    r, w = os.pipe()
    os.close(r)
    out = os.fdopen(w, "w")
    trace = make_tracer("text", out)
    for _ in range(50):
        trace(rec)
    assert caplog.text.count("reader is gone") == 1 and "Traceback" not in caplog.text
    out.write("x\n")
    out.flush()  # (its fd is /dev/null now: nothing more can fail, at exit either)
    out.close()
    caplog.clear()

    class Full(io.StringIO):
        def write(self, s: str) -> int:
            raise OSError(28, "No space left on device")

    trace = make_tracer("text", Full())
    with caplog.at_level(logging.ERROR):
        for _ in range(100):
            trace(rec)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3 and "(100 times so far)" in lines[-1]
    assert caplog.text.count("Traceback") == 1


def test_info_query_names_agree_with_the_handler():
    """The trace's AMDGPU_INFO_* names (abi/constants.py) and the numbers amdgpu/info.py
    answers are one list: every query the handler knows has its own name in the trace."""
    from ualinkd.amdgpu import info

    for name in ("ACCEL_WORKING", "HW_IP_INFO", "HW_IP_COUNT", "TIMESTAMP", "FW_VERSION",
                 "VRAM_USAGE", "GTT_USAGE", "GDS_CONFIG", "VRAM_GTT", "READ_MMR_REG",
                 "DEV_INFO", "VIS_VRAM_USAGE", "MEMORY", "SENSOR", "VRAM_LOST_COUNTER"):
        assert c.INFO_QUERIES[getattr(info, name)] == name


def test_ualink_flags_are_named_and_an_unknown_op_is_decoded_neutrally(traced):
    """UALINK_HANDLE's flags print as a flag set (none is defined: unknown bits in hex, as
    GEM_CREATE's are); an op that is neither EXPORT nor IMPORT has no arm of the union, so
    its words are shown as they are, not as an import handle."""
    rec = traced(UALINK, struct.pack("<IIQQ", 1, 0x80000001, 0x3FF, 7))
    assert "({op=IMPORT, flags=0x80000001, import_ualink_handle=0x7" in rec.text()
    assert check_json(rec)["in"]["flags"] == {"value": 0x80000001, "names": [],
                                              "unknown": 0x80000001}
    rec = traced(UALINK, struct.pack("<IIIIII", 7, 0, 1, 2, 3, 4))
    assert rec.text().endswith(
        "UALINK_HANDLE({op=7, flags=0, words=[0x1, 0x2, 0x3, 0x4]}) = -1 EINVAL (Invalid "
        "argument) <0.000125>")
    assert check_json(rec)["in"]["words"] == [1, 2, 3, 4]


def test_ctx_answers_are_decoded_per_op(traced):
    """union drm_amdgpu_ctx_out by op: ALLOC_CTX's ctx_id, QUERY_STATE2's flags, hangs and
    reset_status, GET_STABLE_PSTATE's level by name, as SET_STABLE_PSTATE's in.flags is."""
    ctx = iowr(0x42, 16)
    rec = traced(ctx, struct.pack("<IIIi", 1, 0, 0, 0))
    assert rec.text().endswith("({op=ALLOC_CTX, flags=0, ctx_id=0, priority=0} => "
                               "{ctx_id=1}) = 0 <0.000125>")
    assert check_json(rec)["out"] == {"ctx_id": 1}
    rec = traced(ctx, struct.pack("<IIIi", 6, 4, 1, 0))
    assert ("({op=SET_STABLE_PSTATE, flags=AMDGPU_CTX_STABLE_PSTATE_PEAK, ctx_id=1, "
            "priority=0}) = 0") in rec.text()
    rec = traced(ctx, struct.pack("<IIIi", 5, 0, 1, 0))
    assert rec.text().endswith("({op=GET_STABLE_PSTATE, flags=0, ctx_id=1, priority=0} => "
                               "{flags=AMDGPU_CTX_STABLE_PSTATE_PEAK}) = 0 <0.000125>")
    assert check_json(rec)["out"]["flags"] == {"value": 4,
                                               "name": "AMDGPU_CTX_STABLE_PSTATE_PEAK"}
    rec = traced(ctx, struct.pack("<IIIi", 4, 0, 1, 0))
    assert rec.text().endswith("=> {flags=0, hangs=0, reset_status=AMDGPU_CTX_NO_RESET}) = 0 "
                               "<0.000125>")
    assert "=>" not in traced(ctx, struct.pack("<IIIi", 2, 0, 1, 0)).text()  # FREE: no answer


def test_pad_fields_have_the_headers_names():
    """GEM_VA's and GEM_MMAP's in and GEM_CREATE's out spell it `_pad`, as amdgpu_drm.h
    and include/ualink/ualink_drm.h do."""
    assert "_pad" in tbl.AMDGPU_GEM_VA.decode_in(bytes(64))  # type: ignore[misc]
    assert "_pad" in tbl.AMDGPU_GEM_MMAP.decode_in(bytes(8))  # type: ignore[misc]
    assert tbl.out_fields(st.GEM_CREATE_OUT)(bytes(8), {}) == {"handle": 0, "_pad": 0}


def test_a_kfd_call_is_traced_on_kfd_not_a_render_node():
    """A KFD ioctl's line names /dev/kfd: node.py records it with minor 0, which no render
    node has (they start at 128); it printed `renderD0`."""
    spec = tbl.kfd_lookup(0x01)  # GET_VERSION
    assert spec is not None
    line = TraceRecord(7, "node0", 0, spec.cmd, spec, b"", 0, struct.pack("<II", 1, 17)).text()
    assert "[pid 7] node0 kfd DRM_IOCTL_AMDKFD_GET_VERSION(" in line, line
    assert "renderD" not in line


def _remote_mapping(core, f, va: int) -> None:
    """An imported NPA BO (§4.6: domain NPA, NO_CPU_ACCESS, bo.npa set) mapped at `va`, so
    that a GPU access there goes to core.remote_access."""
    bo = f.device.driver.bo_create(4096, 1, c.DOMAIN_NPA, c.CREATE_NO_CPU_ACCESS)
    bo.npa = (5, 0x1234, 1)
    h = f.handle_create(bo)
    bo.put()
    res = run(core.ioctl(f, GEM_VA, st.GEM_VA.encode(st.GemVa(
        h, 0, c.VA_OP_MAP, c.VM_PAGE_READABLE | c.VM_PAGE_WRITEABLE, va, 0, 4096, 0, 0, 0,
        0)), 64, CALLER))
    assert res[0] == 0


@pytest.mark.parametrize("op", ["store", "load"])
def test_a_recorder_leaving_mid_access_changes_nothing(traced, core, op):
    """Issue 29 item 4: a tracer never changes a call's outcome. A recorder that leaves
    (`ualinkd record` ending: core.tracer goes back to None) while a GPU access waits for
    its remote piece must not turn the access into an error (it was EIO: the completion
    asserted the tracer was still there, for a store that had already changed memory).
    The access is recorded to the tracer that was there when it started."""
    f = traced.file
    va = 0x200000
    _remote_mapping(core, f, va)
    seen = core.recs

    def remote(accel, piece, write, data=None):
        core.tracer = None  # the recorder goes while the piece is on the fabric
        return piece.length if write else b"R" * piece.length

    attach_remote_access(core, remote)
    before = len(seen)
    if op == "store":
        assert run(core.gpu_write(f, va, b"far", CALLER)) == 3
    else:
        assert run(core.gpu_read(f, va, 3, CALLER)) == b"RRR"
    assert core.tracer is None
    (rec,) = seen[before:]
    assert isinstance(rec, GpuAccessRecord) and rec.op == op and rec.result == 3


def test_a_recorder_coming_mid_access_gets_no_half_access(traced, core):
    """The other way round: an access that started untraced stays untraced when a recorder
    attaches meanwhile (it saw no start), and completes as it would have."""
    f = traced.file
    va = 0x200000
    _remote_mapping(core, f, va)
    late: list = []
    core.tracer = None

    def remote(accel, piece, write, data=None):
        core.tracer = late.append
        return piece.length

    attach_remote_access(core, remote)
    assert run(core.gpu_write(f, va, b"far", CALLER)) == 3
    assert late == []
