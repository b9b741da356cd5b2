"""Pod configuration validation and TOML round trip (Emulator policy 2 and 8, spec §8 limits)."""

from __future__ import annotations

import re
import tomllib

import pytest
from ualink_testkit import pod_doc

from ualinkd.config import ConfigError, PodConfig, parse_size
from ualinkd.ualink.state import AddrMode, ConfigStage


def err(doc: dict) -> str:
    with pytest.raises(ConfigError) as e:
        PodConfig.from_dict(doc, "pod.toml")
    return str(e.value)


def test_valid_doc_loads():
    """Policy 8: a well-formed pod gives its accels their pPod/vPod info."""
    cfg = PodConfig.from_dict(pod_doc(nodes=[[{"id": 0, "vram_size": "64MiB",
                                                "stage": "ppod"}], [{"id": 5}]]))
    a0 = cfg.node("node0").accels[0]
    assert (a0.vram_size, a0.stage) == (64 << 20, ConfigStage.PPOD)
    assert cfg.ppod_size == 6
    assert cfg.vpod_info(5).active_accels == frozenset({0, 5})
    assert cfg.vpod_info(5).vpod_size == 2
    assert cfg.vpod_info(9).vpod_id == 0


def test_duplicate_accel_ids():
    """§8: accel ids are unique in the pod."""
    msg = err(pod_doc(nodes=[[{"id": 3}], [{"id": 3}]]))
    assert msg == "pod.toml: accel id 3 is on both 'node0' and 'node1'"


@pytest.mark.parametrize("accel_id", [256, 1023, -1])
def test_accel_id_out_of_range(accel_id):
    """§8 AMDGPU_UALINK_ACCEL_MAX = 256: ids are 0..255."""
    msg = err(pod_doc(nodes=[[{"id": accel_id}]], vpods=[]))
    assert msg == f"pod.toml: accel id {accel_id} on node 'node0' is outside 0..255"


def test_more_than_eight_accels_per_node():
    """§8 AMDGPU_UALINK_LOCAL_ACCELS_MAX = 8."""
    msg = err(pod_doc(nodes=[[{"id": i} for i in range(9)]]))
    assert msg == "pod.toml: node 'node0' has 9 accels (at most 8)"
    PodConfig.from_dict(pod_doc(nodes=[[{"id": i} for i in range(8)]]))


def test_vpod_member_on_no_node():
    """Policy 8: a vPod member must be an accel of some node."""
    msg = err(pod_doc(vpods=[{"id": 1, "members": [0, 9]}]))
    assert msg == "pod.toml: vPod 1 member 9 is on no node"


def test_accel_in_two_vpods():
    """§5.9: an accel is in at most one vPod."""
    msg = err(pod_doc(vpods=[{"id": 1, "members": [0]}, {"id": 2, "members": [0, 5]}]))
    assert msg == "pod.toml: accel 0 is in vPods 1 and 2"


def test_unknown_quirk():
    """Policy 2: only the named kernel quirks exist."""
    msg = err(pod_doc(quirks=["hello-no-reset", "bogus"]))
    assert msg.startswith("pod.toml: unknown kernel quirks ['bogus'] (known: [")
    assert "'hello-no-reset'" in msg


@pytest.mark.parametrize("mode", ["invalid", "aliasing", ""])
def test_bad_addr_mode(mode):
    """§7.1: addr_mode is source-aliasing or source-identification."""
    msg = err(pod_doc(vpods=[{"id": 1, "members": [0], "addr_mode": mode}]))
    assert msg == ("pod.toml: vpods[0]: addr_mode must be source-aliasing or "
                   "source-identification")


@pytest.mark.parametrize("vid", [0, -1, "1"])
def test_bad_vpod_id(vid):
    """§5.9: vPod id 0 means "no vPod", so a configured vPod needs a positive id."""
    msg = err(pod_doc(vpods=[{"id": vid, "members": [0]}]))
    assert msg == "pod.toml: vpods[0]: id must be a positive integer (0 means no vPod)"


def test_other_errors_name_the_place():
    """Policy 8: every error names the file and the offending entry."""
    assert "nodes[0]: a node needs a name" in err({"pod": {"uuid": str(pod_doc()["pod"]["uuid"])},
                                                    "nodes": [{"accels": [{"id": 0}]}]})
    assert err({**pod_doc(), "pod": {"uuid": "nope"}}) == "pod.toml: [pod] uuid must be a UUID"
    assert re.search(r"nodes\[0\]\.accels\[0\]: stage must be one of",
                     err(pod_doc(nodes=[[{"id": 0, "stage": "done"}]])))
    assert "nodes[0].accels[0].vram_size: '12 parsecs' is not a size" in err(
        pod_doc(nodes=[[{"id": 0, "vram_size": "12 parsecs"}]]))
    assert err(pod_doc(nodes=[[{"id": 0}], []], vpods=[])) == (
        "pod.toml: node 'node1' has no accels")
    assert err({**pod_doc(), "nodes": []}).endswith("the pod has no nodes")


@pytest.mark.parametrize(
    "value,expected",
    [(4096, 4096), ("4096", 4096), ("64MiB", 64 << 20), ("16GiB", 16 << 30), ("1K", 1024),
     ("2 T", 2 << 40), ("3mb", 3 << 20)],
)
def test_parse_size(value, expected):
    """Policy 8: sizes as integers or with binary units."""
    assert parse_size(value, "x") == expected


@pytest.mark.parametrize("value", [-1, True, "1.5GiB", "GiB", "1 PiB", None])
def test_parse_size_rejects(value):
    """Policy 8: anything else is a ConfigError."""
    with pytest.raises(ConfigError):
        parse_size(value, "x")


@pytest.mark.parametrize("nodes,per_node", [(1, 1), (2, 1), (3, 2)])
def test_local_pod_toml_round_trip(nodes, per_node, tmp_path):
    """Policy 8: PodConfig.local() → TOML → load gives back the same pod."""
    cfg = PodConfig.local(nodes, per_node)
    text = cfg.to_toml()
    tomllib.loads(text)
    assert PodConfig.from_dict(tomllib.loads(text)) == cfg
    path = tmp_path / "pod.toml"
    path.write_text(text)
    loaded = PodConfig.load(path)
    assert loaded == cfg
    assert loaded.source == str(path)
    assert cfg.vpods[0].members == frozenset(range(nodes * per_node))
    assert cfg.vpods[0].addr_mode is AddrMode.SOURCE_ALIASING


def test_round_trip_keeps_quirks_stages_and_modes():
    """Policy 2 / 8: quirks, stages, sizes and identification mode survive the round trip."""
    doc = pod_doc(nodes=[[{"id": 0, "stage": "station", "vram_size": 1 << 20}], [{"id": 5}]],
                  vpods=[{"id": 3, "members": [0, 5], "addr_mode": "source-identification"}],
                  quirks=["hello-no-reset", "stale-export-handle"], response_timeout_ms=50)
    cfg = PodConfig.from_dict(doc)
    assert PodConfig.from_dict(tomllib.loads(cfg.to_toml())) == cfg


def test_tcp_congestion_defaults_to_cubic_and_round_trips():
    assert PodConfig.from_dict(pod_doc(nodes=[[{"id": 0}]])).tcp_congestion == "cubic"
    doc = pod_doc(nodes=[[{"id": 0}]])
    doc["pod"]["tcp_congestion"] = ""  # the system default
    cfg = PodConfig.from_dict(doc)
    assert cfg.tcp_congestion == ""
    assert PodConfig.from_dict(tomllib.loads(cfg.to_toml())) == cfg


def test_load_reports_bad_toml_and_missing_file(tmp_path):
    """Policy 8: unreadable or invalid files are ConfigErrors naming the file."""
    bad = tmp_path / "bad.toml"
    bad.write_text("[pod\n")
    with pytest.raises(ConfigError, match=r"bad\.toml: not valid TOML"):
        PodConfig.load(bad)
    with pytest.raises(ConfigError, match=r"missing\.toml: No such file"):
        PodConfig.load(tmp_path / "missing.toml")


def test_node_lookup():
    """Policy 8: asking for an unknown node lists the known ones."""
    cfg = PodConfig.local(2)
    with pytest.raises(ConfigError, match=r"no node named 'x' \(have: node0, node1\)"):
        cfg.node("x")
