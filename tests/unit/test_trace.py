"""--trace rendering: strace-like text and one JSON object a line (STYLE rule 6: the same
ioctl table drives dispatch and the trace decoder; spec §1.4 for what failures carry)."""

from __future__ import annotations

import json
import struct

import pytest
from ualink_testkit import (
    CALLER,
    GEM_CREATE,
    UALINK,
    ScriptedBits,
    open_file,
    pod_config,
)

from ualinkd.abi import structs as st
from ualinkd.abi.ioc import ioc
from ualinkd.node import NodeCore
from ualinkd.trace import TraceRecord


@pytest.fixture
def traced():
    recs: list[TraceRecord] = []
    bits = ScriptedBits(0x1111_2222_3333_4000, 0x5555_6666_7777_8888)
    core = NodeCore(pod_config(nodes=[[{"id": 0}]]), "node0", resolve_fd=lambda p, f: f,
                    tracer=recs.append, randbits=bits)
    f = open_file(core)

    def call(cmd: int, data: bytes) -> TraceRecord:
        core.ioctl(f, cmd, data, (cmd >> 16) & 0x3FFF, CALLER)
        return recs[-1]

    return call


def check_json(rec: TraceRecord) -> dict:
    line = rec.json()
    assert "\n" not in line
    d = json.loads(line)
    assert d == rec.as_dict()
    return d


def test_success_record(traced):
    """§2.3: a successful GEM_CREATE: decoded in and out, result 0."""
    rec = traced(GEM_CREATE, st.GEM_CREATE_IN.encode(st.GemCreateIn(4096, 0, 4, 0)))
    assert rec.text() == (
        "[pid 4242] node0 renderD128 AMDGPU_GEM_CREATE(0xc0206440, {bo_size=4096, "
        "alignment=0, domains=4, domain_flags=0}) = 0 -> {handle=1, pad=0}"
    )
    d = check_json(rec)
    assert (d["ioctl"], d["dir"], d["size"], d["result"], d["errno"]) == (
        "AMDGPU_GEM_CREATE", "WR", 32, 0, None)
    assert d["out"] == {"handle": 1, "pad": 0}
    assert d["out_hex"] == "01" + "00" * 31


def test_ualink_export_record(traced):
    """§1.4: export success shows both handle halves."""
    traced(GEM_CREATE, st.GEM_CREATE_IN.encode(st.GemCreateIn(4096, 0, 4, 0)))
    rec = traced(UALINK, struct.pack("<IIIIQ", 0, 0, 1, 0, 0))
    assert rec.text().endswith(
        "AMDGPU_UALINK_HANDLE(0xc018645b, {op=0, flags=0, gem_handle=1}) = 0 -> "
        "{export_ualink_handle=['0x1111222233334000', '0x5555666677778888']}")
    d = check_json(rec)
    assert d["out"] == {"export_ualink_handle": ["0x1111222233334000", "0x5555666677778888"]}


def test_failure_record_shows_errno_and_echo(traced):
    """§1.4: a failure carries the errno name and the echoed bytes."""
    data = struct.pack("<IIQQ", 1, 0, 0x3FF, 7)
    rec = traced(UALINK, data)
    assert rec.text() == (
        "[pid 4242] node0 renderD128 AMDGPU_UALINK_HANDLE(0xc018645b, {op=1, flags=0, "
        "import_ualink_handle=['0x3ff', '0x7']}) = -1 EINVAL (22) -> {bytes="
        + data.hex() + "}"
    )
    d = check_json(rec)
    assert (d["result"], d["errno"], d["out"], d["out_hex"]) == (-22, "EINVAL", {}, data.hex())


def test_unknown_nr_record(traced):
    """§2.1: no table entry: named by nr, EINVAL, nothing copied back."""
    rec = traced(ioc(3, 0x64, 0x4A, 8), bytes(8))
    assert rec.text() == (
        "[pid 4242] node0 renderD128 UNKNOWN_NR_0x4a(0xc008644a, {0000000000000000}) "
        "= -1 EINVAL (22)")
    d = check_json(rec)
    assert (d["in"], d["out"], d["out_hex"]) == ({}, {}, "")


def test_short_input_is_rendered_not_raised(traced):
    """§2.1: a short struct (zero-extended by the core) still renders."""
    rec = traced(ioc(3, 0x64, 0x5B, 8), struct.pack("<II", 0, 0))
    d = check_json(rec)
    assert d["in"] == {"op": 0, "flags": 0, "gem_handle": 0}
    assert "ENOENT" in rec.text()
