"""The writable configuration files of spec §7.1 (policy 8): parsing, errnos, commits."""

from __future__ import annotations

import errno

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ualink_testkit import connected_export, make_node, pod_config

from ualinkd.drm.errors import DrmError
from ualinkd.sysfs import resolve
from ualinkd.ualink import protocol as p
from ualinkd.ualink.manager import Send
from ualinkd.ualink.peers import ConnState
from ualinkd.ualink.state import AccelState, AddrMode
from ualinkd.ualink.sysconfig import SysConfig, parse_hex_u8, parse_ids, parse_u32


def errno_of(fn, *args) -> int:
    with pytest.raises(DrmError) as e:
        fn(*args)
    return e.value.errno


@pytest.mark.parametrize(("text", "value"), [
    ("0", 0), ("7\n", 7), ("+12", 12), ("010", 10), ("4294967295", 0xFFFFFFFF),
])
def test_u32_files_take_decimal(text, value):
    """§7.1: setup/ and config/ numbers are decimal u32 (kstrtou32 base 10): a leading
    zero is not octal, "+" is allowed, one trailing newline is allowed."""
    assert parse_u32(text) == value


@pytest.mark.parametrize("text", [
    "", "\n", "0x10", "1_000", " 5", "5 ", "5\n\n", "-1", "-0", "0b1", "\u0663", "1.0",
])
def test_u32_files_refuse_anything_else(text):
    """§7.1: what kstrtou32 refuses is EINVAL (Python's int() would take "0x10", "1_000",
    " 5" or "٣")."""
    assert errno_of(parse_u32, text) == errno.EINVAL


def test_u32_overflow_is_erange():
    assert errno_of(parse_u32, "4294967296") == errno.ERANGE


@given(st.text("0123456789", min_size=1, max_size=6000), st.sampled_from(["", "+"]),
       st.sampled_from(["", "\n"]))
@settings(max_examples=80, deadline=None)
def test_u32_any_length_is_a_value_or_erange(digits, sign, newline):
    """_parse_integer (lib/kstrtox.c) accumulates into a u64 and answers ERANGE at the first
    overflow, for any number of digits; leading zeros never overflow. So a decimal of any
    length (beyond int()'s 4300-digit limit too) is its value or ERANGE, never another
    error; the same for the id lists."""
    significant = digits.lstrip("0") or "0"
    value = int(significant) if len(significant) <= 12 else None  # None: far above a u32
    if value is not None and value <= 0xFFFFFFFF:
        assert parse_u32(sign + digits + newline) == value
    else:
        assert errno_of(parse_u32, sign + digits + newline) == errno.ERANGE
    if value is not None and value < 256:
        assert parse_ids(sign + digits) == [value]
    else:
        assert errno_of(parse_ids, sign + digits) == errno.ERANGE


def test_a_5000_digit_decimal_to_a_sys_attribute_is_erange():
    """Issue 10 item 9: 5000 digits written to setup/bandwidth answer ERANGE (they raised
    int()'s ValueError, an EIO and a traceback)."""
    core = make_node()
    cfg = SysConfig(core.host, next(iter(core.managers.values())))
    assert errno_of(cfg.write_setup, "bandwidth", "9" * 5000 + "\n") == errno.ERANGE
    assert errno_of(cfg.write_config, "vpod_active_accels", "1" * 5000) == errno.ERANGE


def test_id_lists():
    """§7.1: ids separated by spaces/commas, each < 256 (ERANGE), at most 8 for
    setup/local_accels (ENOSPC); an empty write clears; a non-number is EINVAL."""
    assert parse_ids("1, 2 ,3\n") == [1, 2, 3]
    assert parse_ids("\n") == []
    assert errno_of(parse_ids, "1 256") == errno.ERANGE
    assert errno_of(parse_ids, "1 x") == errno.EINVAL
    assert errno_of(parse_ids, "1_0") == errno.EINVAL
    assert errno_of(parse_ids, " ".join(map(str, range(9))), 8) == errno.ENOSPC


def test_error_accel_takes_config_updates_and_recovers_by_leaving():
    """§7.1 config/commit is EINVAL only below PPOD_CONFIGURED or for an invalid vPod; then
    the §5.9 rules apply. An accel in ERROR that commits a non-zero vPod id falls in the
    "any other case" row: deactivate, state ERROR, and the new vPod info is what sysfs
    shows. Leaving (id 0) deactivates it to PPOD_CONFIGURED, from where it joins again."""
    core = make_node(pod_config(nodes=[[{"id": 0}, {"id": 1}], [{"id": 5}]]))
    mgr = core.managers[128]
    cfg = SysConfig(core.host, mgr)
    shown = resolve(core.sys_tree(), "class/drm/renderD128/device/ualink")
    cfg.write_config("vpod_id", "3")
    cfg.commit_config("true")  # vPod 1 -> 3 without leaving: ERROR
    assert mgr.state == AccelState.ERROR
    cfg.commit_config("true")  # the same id again, from ERROR: no EINVAL, still ERROR
    assert mgr.state == AccelState.ERROR and mgr.vpod.vpod_id == 3
    cfg.write_config("vpod_id", "7")
    cfg.write_config("vpod_active_accels", "0 5")
    cfg.write_config("vpod_size", "2")
    cfg.commit_config("true")  # 3 -> 7 from ERROR: ERROR, the new vPod visible
    assert mgr.state == AccelState.ERROR
    assert (shown["vpod_id"].read(), shown["vpod_size"].read(),
            shown["vpod_active_accels"].read()) == ("7\n", "2\n", "0 5\n")
    assert core.managers[129].state == AccelState.ACTIVE  # its local peer is left alone
    cfg.write_config("vpod_size", "5")  # an invalid vPod is still refused, ERROR or not
    assert errno_of(cfg.commit_config, "true") == errno.EINVAL
    assert mgr.vpod.vpod_size == 2
    cfg.write_config("vpod_id", "0")
    cfg.commit_config("true\n")
    assert mgr.state == AccelState.PPOD_CONFIGURED and mgr.vpod.vpod_id == 0
    cfg.write_config("vpod_id", "1")
    cfg.write_config("vpod_active_accels", "0,1,5")
    cfg.write_config("vpod_size", "3")
    cfg.commit_config("true")
    assert mgr.state == AccelState.ACTIVE


THREE = {"nodes": [[{"id": 0}], [{"id": 1}], [{"id": 2}]]}


def exporter_with_an_importer():
    """node0 (accel 0, source-aliasing) with connections to accels 1 and 2 up, a 1 MiB BO
    exported and granted to accel 1."""
    core, mgr, f, lo, hi = connected_export(pod_config(**THREE))
    assert npa_req(mgr, 1, lo, hi).npa_offset == 0x802
    return core, mgr, lo, hi


def npa_req(mgr, src: int, lo: int, hi: int) -> p.NpaRsp | p.NpaFail:
    mgr.receive(src, p.NpaReq(p.handle_lo_bits(lo), hi))
    (eff,) = mgr.take_effects()
    assert isinstance(eff, Send)
    return eff.msg


def test_addr_mode_change_in_the_same_vpod_leaves_the_manager_running():
    """§5.9 "config update, state was ACTIVE and vPod id unchanged": membership unchanged
    → nothing. A new addr_mode alone bounces nothing: exports, importers, pins and
    connections survive; the recorded vPod info (sysfs addr_mode) takes the new mode while
    the NPA space keeps the layout of its activation; the next activation uses the new
    mode."""
    core, mgr, lo, hi = exporter_with_an_importer()
    npa, entry = mgr.npa, mgr.exports[lo]
    ualink = resolve(core.sys_tree(), "class/drm/renderD128/device/ualink")
    ualink["config"]["addr_mode"].write("source-identification\n")
    ualink["config"]["commit"].write("true")
    assert mgr.state == AccelState.ACTIVE
    assert ualink["addr_mode"].read() == "source-identification\n"
    assert mgr.vpod.addr_mode == AddrMode.SOURCE_IDENTIFICATION
    assert mgr.npa is npa and npa.start == 0x800  # still the alias space of the activation
    assert mgr.exports[lo] is entry and list(entry.importers) == [1]
    assert entry.bo.pin_count == 1 and len(mgr.npa_table) == 1
    assert all(mgr.conn(r).state == ConnState.ESTABLISHED for r in (1, 2))
    mgr.check_invariants()
    mgr.deactivate()
    mgr.activate()
    assert mgr.npa.start == 0  # the 39-bit space of source-identification


def test_npa_req_after_an_addr_mode_change_uses_the_running_mode():
    """§5.9, §4.2: after an addr_mode change without a bounce, the NPA space running is
    still source-aliasing, so a second importer gets the same shared NPA."""
    core, mgr, lo, hi = exporter_with_an_importer()
    cfg = SysConfig(core.host, mgr)
    cfg.write_config("addr_mode", "source-identification")
    cfg.commit_config("true")
    rsp = npa_req(mgr, 2, lo, hi)
    assert isinstance(rsp, p.NpaRsp) and rsp.npa_offset == 0x802


def test_granted_npa_still_translates_after_an_addr_mode_change():
    """§5.9, §4.4: the exporter's NPA page table is the one of its activation, so an
    importer's LOAD at the NPA it was granted still reaches the BO after the change."""
    core, mgr, lo, hi = exporter_with_an_importer()
    npa_byte = 0x802 << 12  # accel 0's segment, the shared alias NPA
    assert sum(map(len, mgr.serve_load(1, npa_byte, 16))) == 16
    cfg = SysConfig(core.host, mgr)
    cfg.write_config("addr_mode", "source-identification")
    cfg.commit_config("true")
    assert sum(map(len, mgr.serve_load(1, npa_byte, 16))) == 16


@pytest.mark.parametrize(("text", "value"), [
    ("0", 0), ("4", 4), ("ff", 0xFF), ("FF\n", 0xFF), ("0x1f", 0x1F), ("0X1F\n", 0x1F),
    ("+0x2", 2), ("00000004", 4),
])
def test_stations_flags_take_hex_u8(text, value):
    """§7.1 stations/flags "hex u8" (kstrtou8 base 16): optional "0x"/"0X" (and "+"), hex
    digits, one trailing newline."""
    assert parse_hex_u8(text) == value


@pytest.mark.parametrize("text", [
    "", "\n", "0x", "0x\n", " 4", "4 ", "4\n\n", "f_f", "-1", "-0", "0o7", "g", "0x-1",
    "1.0", "\u0663", "\t4",
])
def test_stations_flags_refuse_anything_else(text):
    """§7.1 stations/flags: what kstrtou8 refuses is EINVAL (int(…, 16) took " 4", "f_f"
    and "-1"), and the file keeps its value."""
    core = make_node()
    cfg = SysConfig(core.host, core.managers[128])
    cfg.write_stations("flags", "0x4")
    assert errno_of(cfg.write_stations, "flags", text) == errno.EINVAL
    assert cfg.stations.flags == 4


@pytest.mark.parametrize("text", ["100", "0x100", "fff\n", "1" * 40])
def test_stations_flags_above_a_u8_is_erange(text):
    """§7.1 stations/flags: a hex number above 0xFF is ERANGE (kstrtou8)."""
    assert errno_of(parse_hex_u8, text) == errno.ERANGE


@pytest.mark.parametrize("commit", ["commit_setup", "commit_config", "commit_stations"])
def test_commit_takes_true_as_sysfs_streq_does(commit):
    """§7.1 commit files "must be `true` (else -EINVAL)", compared as sysfs_streq: "true"
    or "true\n" only; no leading space, no second newline, no other case."""
    core = make_node()
    cfg = SysConfig(core.host, core.managers[128])
    for bad in (" true", "true\n\n", "true ", "\ttrue", "True", "true\r\n", "", "\n", "1"):
        assert errno_of(getattr(cfg, commit), bad) == errno.EINVAL, bad
    for good in ("true", "true\n"):
        getattr(cfg, commit)(good)


def test_setup_ppod_id_takes_the_36_character_form_only():
    """§7.1 setup/ppod_id: a UUID string as the kernel parses it (uuid_parse), newline ok."""
    import errno as _errno

    import pytest as _pytest

    from ualinkd.config import PodConfig
    from ualinkd.drm.errors import DrmError
    from ualinkd.node import NodeCore

    core = NodeCore(PodConfig.local(1, 1), "node0")
    setup = resolve(core.sys_tree(), "class/drm/renderD128/device/ualink")["setup"]
    good = "0123abcd-0000-4000-8000-00000000beef"
    setup["ppod_id"].write(good + "\n")
    assert setup["ppod_id"].read() == good + "\n"
    for bad in ("{" + good + "}", "urn:uuid:" + good, good.replace("-", ""), good + "0"):
        with _pytest.raises(DrmError) as e:
            setup["ppod_id"].write(bad)
        assert e.value.errno == _errno.EINVAL
