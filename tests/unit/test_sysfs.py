"""The ualink/ sysfs attribute files (spec §7.1), read from `node.ualink_sysfs`."""

from __future__ import annotations

import uuid

from ualink_testkit import make_node, pod_config

from ualinkd.amdgpu.driver import AmdgpuDriver
from ualinkd.drm.device import DrmDevice
from ualinkd.drm.tokens import DmaBufTokens
from ualinkd.node import ualink_sysfs
from ualinkd.ualink.host import UalinkHost
from ualinkd.ualink.manager import UalinkManager
from ualinkd.ualink.state import AddrMode, ConfigStage, PpodInfo, VpodInfo

FILES = {
    "link_type", "accel_id", "bandwidth", "latency", "ppod_id", "ppod_size", "vpod_id",
    "vpod_size", "vpod_active_accels", "addr_mode", "accel_state", "local_accels",
}


def read_all(mgr) -> dict[str, str]:
    d = ualink_sysfs(mgr)
    assert set(d) == FILES
    for attr in d.values():
        assert attr.mode == 0o444 and attr.write is None  # read-only in the reference build
    return {name: attr.read() for name, attr in d.items()}


def bare_manager(ppod=None, vpod=None) -> UalinkManager:
    dev = DrmDevice(128, DmaBufTokens(), lambda pid, fd: None)  # type: ignore[arg-type, return-value]
    drv = AmdgpuDriver(dev, 1 << 20, 1 << 20)
    return UalinkManager(UalinkHost(), drv, ppod or PpodInfo(), vpod or VpodInfo(),
                         ConfigStage.IDLE)


def test_active_accel_values():
    """§7.1: exact text of every file for an active accel; uuid lowercase; every value
    ends with a newline."""
    core = make_node(pod_config(nodes=[[{"id": 3, "bandwidth": 400, "latency": 7},
                                        {"id": 1}], [{"id": 10}, {"id": 2}]]))
    mgr = core.managers[128]
    assert read_all(mgr) == {
        "link_type": "UALoE\n",
        "accel_id": "3\n",
        "bandwidth": "400\n",
        "latency": "7\n",
        "ppod_id": "0123abcd-4567-89ab-cdef-0123456789ab\n",
        "ppod_size": "11\n",
        "vpod_id": "1\n",
        "vpod_size": "4\n",
        "vpod_active_accels": "1 2 3 10\n",
        "addr_mode": "source-aliasing\n",
        "accel_state": "active\n",
        "local_accels": "3 1\n",
    }
    assert read_all(core.managers[129])["local_accels"] == "1 3\n"


def test_unset_values():
    """§7.1: 4294967295 until configured; empty bitmap prints just a newline; initial
    addr mode 2 → invalid; nil uuid."""
    vals = read_all(bare_manager())
    assert vals["accel_id"] == vals["bandwidth"] == vals["latency"] == "4294967295\n"
    assert vals["vpod_active_accels"] == "\n"
    assert vals["local_accels"] == "\n"
    assert vals["addr_mode"] == "invalid\n"
    assert vals["accel_state"] == "unconfigured\n"
    assert vals["vpod_id"] == "0\n"
    assert vals["ppod_id"] == "00000000-0000-0000-0000-000000000000\n"
    assert all(v.endswith("\n") and not v.endswith("\n\n") for v in vals.values())


def test_uuid_lowercase_and_identification_mode():
    """§7.1: UUID printed lowercase; source-identification spelled out."""
    u = uuid.UUID("ABCDEF00-1111-2222-3333-444455556666")
    mgr = bare_manager(PpodInfo(0, 1, 1, 4, u),
                       VpodInfo(9, 1, AddrMode.SOURCE_IDENTIFICATION, frozenset({0})))
    vals = read_all(mgr)
    assert vals["ppod_id"] == "abcdef00-1111-2222-3333-444455556666\n"
    assert vals["addr_mode"] == "source-identification\n"
    assert vals["vpod_active_accels"] == "0\n"


def test_reads_are_live():
    """§7.1: files reflect the current state on every read."""
    core = make_node(pod_config(nodes=[[{"id": 0}], [{"id": 5}]]))
    mgr = core.managers[128]
    attrs = ualink_sysfs(mgr)
    assert attrs["accel_state"].read() == "active\n"
    mgr.deactivate()
    assert attrs["accel_state"].read() == "ppod_configured\n"


def test_sys_tree_layout():
    """§7.1: /sys/class/drm/renderD<minor>/device/ualink/ for every render node."""
    core = make_node(pod_config(nodes=[[{"id": 0}, {"id": 1}], [{"id": 5}]]))
    drm = core.sys_tree()["class"]["drm"]
    assert set(drm) == {"renderD128", "renderD129"}
    ualink = drm["renderD129"]["device"]["ualink"]
    assert set(ualink) == FILES | {"setup", "config", "stations"}  # policy 8: live config dirs
    assert all(ualink[n].mode == 0o444 for n in FILES)
    assert ualink["accel_id"].read() == "1\n"
