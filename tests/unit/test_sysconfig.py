"""The writable configuration files of spec §7.1 (policy 8): parsing, errnos, commits."""

from __future__ import annotations

import errno

import pytest
from ualink_testkit import make_node, pod_config

from ualinkd.drm.errors import DrmError
from ualinkd.ualink.state import AccelState
from ualinkd.ualink.sysconfig import SysConfig, parse_ids, parse_u32


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


def test_id_lists():
    """§7.1: ids separated by spaces/commas, each < 256 (ERANGE), at most 8 for
    setup/local_accels (ENOSPC); an empty write clears; a non-number is EINVAL."""
    assert parse_ids("1, 2 ,3\n") == [1, 2, 3]
    assert parse_ids("\n") == []
    assert errno_of(parse_ids, "1 256") == errno.ERANGE
    assert errno_of(parse_ids, "1 x") == errno.EINVAL
    assert errno_of(parse_ids, "1_0") == errno.EINVAL
    assert errno_of(parse_ids, " ".join(map(str, range(9))), 8) == errno.ENOSPC


def test_error_accel_leaves_its_vpod_and_recovers():
    """§5.9, §7.1: config/commit is refused only below PPOD_CONFIGURED, so an accel in
    ERROR can leave its vPod (id 0): deactivate_accelerator acts on ERROR too and takes it
    to PPOD_CONFIGURED, from where it can join again."""
    core = make_node(pod_config(nodes=[[{"id": 0}], [{"id": 1}]]))
    mgr = core.managers[128]
    cfg = SysConfig(core.host, mgr)
    cfg.write_config("vpod_id", "3")
    cfg.commit_config("true")  # vPod 1 -> 3 without leaving: ERROR
    assert mgr.state == AccelState.ERROR
    assert errno_of(cfg.commit_config, "true") == errno.EINVAL  # joining from ERROR
    cfg.write_config("vpod_id", "0")
    cfg.commit_config("true\n")
    assert mgr.state == AccelState.PPOD_CONFIGURED and mgr.vpod.vpod_id == 0
    cfg.write_config("vpod_id", "1")
    cfg.commit_config("true")
    assert mgr.state == AccelState.ACTIVE


def test_addr_mode_change_bounces_the_accel():
    """§5.9 config update on an ACTIVE accel with the same vPod id: a new address mode
    re-lays the NPA space (the emulator bounces the accel, as for a membership change)."""
    from ualinkd.config import PodConfig
    from ualinkd.node import NodeCore
    from ualinkd.ualink.state import AccelState, AddrMode

    core = NodeCore(PodConfig.local(1, 1), "node0")
    mgr = core.managers[128]
    cfg = core.sys_tree()["class"]["drm"]["renderD128"]["device"]["ualink"]["config"]
    assert mgr.npa.start == 0x800  # source-aliasing: the alias space
    cfg["addr_mode"].write("source-identification\n")
    cfg["commit"].write("true")
    assert mgr.state == AccelState.ACTIVE
    assert mgr.vpod.addr_mode == AddrMode.SOURCE_IDENTIFICATION
    assert mgr.npa.start == 0  # the whole 39-bit space, allocations per importer segment


def test_setup_ppod_id_takes_the_36_character_form_only():
    """§7.1 setup/ppod_id: a UUID string as the kernel parses it (uuid_parse), newline ok."""
    import errno as _errno

    import pytest as _pytest

    from ualinkd.config import PodConfig
    from ualinkd.drm.errors import DrmError
    from ualinkd.node import NodeCore

    core = NodeCore(PodConfig.local(1, 1), "node0")
    setup = core.sys_tree()["class"]["drm"]["renderD128"]["device"]["ualink"]["setup"]
    good = "0123abcd-0000-4000-8000-00000000beef"
    setup["ppod_id"].write(good + "\n")
    assert setup["ppod_id"].read() == good + "\n"
    for bad in ("{" + good + "}", "urn:uuid:" + good, good.replace("-", ""), good + "0"):
        with _pytest.raises(DrmError) as e:
            setup["ppod_id"].write(bad)
        assert e.value.errno == _errno.EINVAL
