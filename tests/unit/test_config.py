"""Pod configuration validation and TOML round trip (Emulator policy 2 and 8, spec §8 limits)."""

from __future__ import annotations

import copy
import re
import tomllib

import pytest
from ualink_testkit import pod_doc

from ualinkd.config import KEYS, ConfigError, PodConfig, parse_size
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


def test_misplaced_key_at_the_top_level():
    """Policy 8: `kernel_quirks` above [pod] is not ignored: the error names the key, where
    it was found, what is allowed there and where it belongs."""
    doc = pod_doc()
    doc["kernel_quirks"] = ["hello-no-reset"]
    assert err(doc) == ("pod.toml: unknown key 'kernel_quirks' at the top level (allowed "
                        "there: nodes, pod, vpods); 'kernel_quirks' belongs in [pod]")


def test_misspelt_array_of_tables():
    """Policy 8: `[[vpod]]` for `[[vpods]]` would leave every accel outside a vPod."""
    text = PodConfig.local(2).to_toml().replace("[[vpods]]", "[[vpod]]")
    assert err(tomllib.loads(text)) == ("pod.toml: unknown key 'vpod' at the top level "
                                        "(allowed there: nodes, pod, vpods); did you mean "
                                        "'vpods'?")


@pytest.mark.parametrize("edit,expected", [
    (lambda d: d["pod"].update(response_timeout=50),
     "pod.toml: unknown key 'response_timeout' in [pod] (allowed there: "
     "caller_memory_timeout_ms, fabric_links, kernel_quirks, key, memory_budget, "
     "response_timeout_ms, send_ack_timeout_ms, size, tcp_congestion, tls_ca, uuid); "
     "did you mean 'response_timeout_ms'?"),
    (lambda d: d["nodes"][1].update(adress="127.0.0.1:7001"),
     "pod.toml: nodes[1]: unknown key 'adress' in [[nodes]] (allowed there: accels, address, "
     "link_keys, name, tls_cert, tls_key); did you mean 'address'?"),
    (lambda d: d["nodes"][0]["accels"][0].update(vram="1GiB", stage="ppod", colour="red"),
     "pod.toml: nodes[0].accels[0]: unknown keys 'vram', 'colour' in [[nodes.accels]] "
     "(allowed there: bandwidth, gtt_size, id, latency, npa_pages, profile, stage, "
     "ualink, vram_size); "
     "did you mean 'vram_size'?"),
    (lambda d: d["vpods"][0].update(members=[0], addr_mode="source-aliasing", name="x"),
     "pod.toml: vpods[0]: unknown key 'name' in [[vpods]] (allowed there: addr_mode, id, "
     "members); 'name' belongs in [[nodes]]"),
])
def test_unknown_keys_in_each_table(edit, expected):
    """Policy 8: a typo in any table is an error naming the table entry and its keys."""
    doc = copy.deepcopy(pod_doc())  # its default accel tables are shared
    edit(doc)
    assert err(doc) == expected


def test_single_table_for_an_array_of_tables():
    """Policy 8: `[vpods]` or `[nodes.accels]` (one pair of brackets) is named as such."""
    text = PodConfig.local(2).to_toml()
    assert err(tomllib.loads(text.replace("[[vpods]]", "[vpods]"))) == (
        "pod.toml: vpods must be an array of tables ([[vpods]])")
    one = PodConfig.local(1).to_toml().replace("[[nodes.accels]]", "[nodes.accels]")
    assert err(tomllib.loads(one)) == (
        "pod.toml: nodes[0]: accels must be an array of tables ([[nodes.accels]])")
    assert err({**pod_doc(), "pod": "x"}) == "pod.toml: pod must be a table ([pod])"


def test_to_toml_writes_exactly_the_known_keys(tmp_path):
    """Policy 8: with every optional field set, to_toml writes every key the loader knows
    and no other, and the file loads back as the same pod."""
    doc = pod_doc(nodes=[[{"id": 0, "npa_pages": 64, "vram_size": "1GiB", "gtt_size": 4096}],
                         [{"id": 5, "profile": "mi300a"}]],
                  quirks=["hello-no-reset"], tls_ca="/ca.pem", tcp_congestion="",
                  memory_budget="8GiB", fabric_links="on-first-use")
    for i, n in enumerate(doc["nodes"]):
        n.update(tls_cert=f"/n{i}.pem", tls_key=f"/n{i}.key")
    doc["nodes"][0]["link_keys"] = {"node1": "cd" * 32}
    cfg = PodConfig.from_dict(doc)
    path = tmp_path / "pod.toml"
    path.write_text(cfg.to_toml())
    assert PodConfig.load(path) == cfg
    written = tomllib.loads(cfg.to_toml())
    assert {
        "the top level": set(written),
        "[pod]": set(written["pod"]),
        "[[nodes]]": set().union(*written["nodes"]),
        "[[nodes.accels]]": set().union(*(a for n in written["nodes"] for a in n["accels"])),
        "[[vpods]]": set().union(*written["vpods"]),
    } == KEYS


def _mutate(where: str, key: str, value: object) -> dict:
    doc = pod_doc(nodes=[[{"id": 0}], [{"id": 1}]])
    table = {"pod": doc["pod"], "node": doc["nodes"][0], "accel": doc["nodes"][0]["accels"][0],
             "vpod": doc["vpods"][0] if doc.get("vpods") else None}[where]
    assert table is not None
    table[key] = value
    return doc


@pytest.mark.parametrize(("where", "key", "value", "says"), [
    ("accel", "bandwidth", "fast", "bandwidth: 'fast' is not an integer"),
    ("accel", "latency", 2.5, "latency: 2.5 is not an integer"),
    ("accel", "npa_pages", 0, "npa_pages: 0 must be at least 1"),
    ("pod", "size", -1, "[pod] size: -1 must be in 0..4294967295"),
    ("pod", "size", "2", "[pod] size: '2' is not an integer"),
    ("pod", "size", 2.7, "[pod] size: 2.7 is not an integer"),
    ("pod", "response_timeout_ms", True, "response_timeout_ms: True is not an integer"),
    ("pod", "kernel_quirks", "hello-no-reset", "kernel_quirks: 'hello-no-reset' is not an array"),
    ("node", "address", 7000, "address: 7000 is not a string"),
])
def test_wrong_types_are_errors_naming_the_key(where, key, value, says):
    """Policy 8: a value of the wrong type is a ConfigError that names the key, never a
    traceback (int('fast')) nor a silent conversion (int(2.7) == 2, int('2'))."""
    assert says in err(_mutate(where, key, value))


def test_vpod_members_must_be_an_array_of_accel_ids():
    """`members = "0,1"` is an error about the type, not "member , is on no node"."""
    doc = pod_doc(nodes=[[{"id": 0}], [{"id": 1}]])
    doc["vpods"] = [{"id": 1, "members": "0,1"}]
    assert "members: '0,1' is not an array" in err(doc)
    doc["vpods"] = [{"id": 1, "members": [0, "1"]}]
    assert "members[1]: '1' is not an integer" in err(doc)


def test_two_nodes_on_one_address_is_an_error():
    """Two nodes with one fabric address would dial each other's listener as themselves;
    port 0 ("any free port") is exempt."""
    doc = pod_doc(nodes=[[{"id": 0}], [{"id": 1}]])
    doc["nodes"][0]["address"] = doc["nodes"][1]["address"] = "127.0.0.1:7000"
    assert "nodes 'node0' and 'node1' have the same address 127.0.0.1:7000" in err(doc)


def test_default_memory_follows_the_host():
    """Issue 10 item 10: with no sizes in the file, every accel's VRAM and GTT are its share
    of the pod's memory budget, half of MemTotal by default, so the BOs of a whole local pod
    cannot hold more than half of the host (it was 16 + 16 GiB per accel on a 24 GiB host).
    An accel's own vram_size / gtt_size win; memory_budget sets the pod's total."""
    host = 24 << 30
    cfg = PodConfig.from_dict(pod_doc(nodes=[[{"id": 0}, {"id": 1}], [{"id": 2}, {"id": 3}]]))
    sizes = [cfg.accel_memory(a, host) for n in cfg.nodes for a in n.accels]
    assert sizes == [(3 << 29, 3 << 29)] * 4  # 12 GiB over 4 accels, half VRAM, half GTT
    assert sum(v + g for v, g in sizes) <= host // 2
    cfg = PodConfig.from_dict(pod_doc(nodes=[[{"id": 0, "vram_size": "1GiB"}], [{"id": 5}]],
                                      memory_budget="1GiB"))
    assert [cfg.accel_memory(a) for n in cfg.nodes for a in n.accels] == [
        (1 << 30, 256 << 20), (256 << 20, 256 << 20)]
    assert "memory_budget: '1 parsec' is not a size" in err(pod_doc(memory_budget="1 parsec"))


def test_default_memory_of_this_host():
    """Without a budget the share comes from this host's /proc/meminfo MemTotal."""
    from ualinkd.config import host_memory_total

    cfg = PodConfig.from_dict(pod_doc())
    vram, gtt = cfg.accel_memory(cfg.nodes[0].accels[0])
    assert vram == gtt and 0 < 4 * vram <= host_memory_total() // 2


@pytest.mark.parametrize("value", [0, -1, "0MiB"])
def test_sizes_must_be_positive(value):
    """Issue 11: a pool of 0 bytes (or less) is a ConfigError naming the key."""
    doc = pod_doc(nodes=[[{"id": 0, "vram_size": value}], [{"id": 1}]])
    assert f"nodes[0].accels[0].vram_size: {value!r} must be a positive size" in err(doc)


@pytest.mark.parametrize("value,ok", [("auto", True), ("at-start", True),
                                      ("on-first-use", True), ("lazy", False), (1, False)])
def test_fabric_links_mode(value, ok):
    """`[pod] fabric_links` (fabric/dialing.py): when each pair's link comes up; another
    value is an error naming the allowed ones, and "auto" (the default) is not written."""
    doc = pod_doc(fabric_links=value)
    if not ok:
        with pytest.raises(ConfigError, match="fabric_links"):
            PodConfig.from_dict(doc)
        return
    cfg = PodConfig.from_dict(doc)
    assert cfg.fabric_links == value
    assert ("fabric_links" in cfg.to_toml()) == (value != "auto")
    assert PodConfig.from_dict(pod_doc()).fabric_links == "auto"
