"""ualinkd/podinfo.py, the one reading API under ualinkctl, the namespaced pod supervisor and
the tests (issue 33 item 4): pod.json is a typed value both sides share, and reading a
namespaced pod's nodes needs neither the pod supervisor nor the key in pod.toml."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ualinkd.config import PodConfig
from ualinkd.podinfo import (
    NetnsNodeState,
    NetnsPodState,
    PodNodeInfo,
    ReadError,
    pod_nodes,
)


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def state(pids: tuple[int | None, ...]) -> NetnsPodState:
    return NetnsPodState("ualk-1-abcd", 1, "ualk-1-abcd-fabric", tuple(
        NetnsNodeState(f"node{i}", i, f"ualk-1-abcd-node{i}", f"10.177.0.{i + 1}", pid,
                       f"/tmp/ualinkd-pods/ualk-1-abcd/node{i}/mnt", (2 * i, 2 * i + 1),
                       f"v{i}") for i, pid in enumerate(pids)))


def test_pod_json_round_trip_keeps_its_format(tmp_path: Path) -> None:
    s = state((os.getpid(), None))
    s.save(tmp_path)
    assert NetnsPodState.load(tmp_path) == s
    doc = json.loads((tmp_path / "pod.json").read_text())
    assert set(doc) == {"prefix", "owner", "fabric_netns", "nodes"}
    assert doc["nodes"][0] == {"name": "node0", "index": 0, "netns": "ualk-1-abcd-node0",
                               "ip": "10.177.0.1", "pid": os.getpid(),
                               "mount": "/tmp/ualinkd-pods/ualk-1-abcd/node0/mnt",
                               "accels": [0, 1], "bridge_port": "v0"}
    assert not list(tmp_path.glob("*.tmp"))


def test_pod_nodes_of_a_netns_pod_read_pod_json_alone(tmp_path: Path) -> None:
    """No pod.toml (root-only, holds the key): the nodes still come from pod.json; a node
    whose daemon is gone has no mount."""
    state((os.getpid(), dead_pid(), None)).save(tmp_path)
    mnt = "/tmp/ualinkd-pods/ualk-1-abcd/node0/mnt"
    assert pod_nodes(str(tmp_path)) == [
        PodNodeInfo("node0", "10.177.0.1", (0, 1), f"/proc/{os.getpid()}/root{mnt}"),
        PodNodeInfo("node1", "10.177.0.2", (2, 3), None),
        PodNodeInfo("node2", "10.177.0.3", (4, 5), None)]


def test_pod_nodes_inside_a_container_name_the_node_they_are_seen_from(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a node's container ($UALINK_MOUNT and $UALINK_NODE, as the image and entrypoint set
    them) no other node's mount is beside the pod config: this node is read at its mount,
    the others are seen from it. With any node mounted beside the config (a `ualinkd pod`
    root) or without $UALINK_MOUNT, the mounts are ROOT/NAME as before."""
    toml = tmp_path / "node1.toml"
    toml.write_text(PodConfig.local(3).to_toml())
    accels = [tuple(a.accel_id for a in n.accels) for n in PodConfig.local(3).nodes]
    monkeypatch.delenv("UALINK_MOUNT", raising=False)
    at_root = pod_nodes(str(toml))
    assert [n.mount for n in at_root] == [str(tmp_path / f"node{i}") for i in range(3)]
    assert all(n.seen_from is None for n in at_root)

    monkeypatch.setenv("UALINK_MOUNT", "/run/ualink/mnt")
    monkeypatch.setenv("UALINK_NODE", "node1")
    inside = pod_nodes(str(toml))
    assert [(n.name, n.accels, n.mount, n.seen_from) for n in inside] == [
        ("node0", accels[0], None, "node1"), ("node1", accels[1], "/run/ualink/mnt", None),
        ("node2", accels[2], None, "node1")]
    assert [n.address for n in inside] == [n.address for n in at_root]

    monkeypatch.setenv("UALINK_NODE", "node9")  # not one of this pod's nodes
    assert pod_nodes(str(toml)) == at_root
    monkeypatch.setenv("UALINK_NODE", "node1")
    (tmp_path / "node2").mkdir()  # a node mounted beside the config: a pod root, not a container
    assert pod_nodes(str(toml)) == at_root


@pytest.mark.parametrize("text", ["", "{", '{"prefix": "x"}', '{"prefix": "x", "owner": 1, '
                                  '"fabric_netns": "f", "nodes": [{"name": "n"}]}'])
def test_a_broken_pod_json_is_one_read_error(tmp_path: Path, text: str) -> None:
    (tmp_path / "pod.json").write_text(text)
    with pytest.raises(ReadError, match="not a running pod's directory"):
        pod_nodes(str(tmp_path))


def test_ualinkctl_pod_status_does_not_load_the_pod_supervisor(tmp_path: Path) -> None:
    """`ualinkctl pod POD-DIR` reads pod.json through podinfo: the namespaced pod supervisor
    (ualinkd.netns.pod, with the config and the manager) is not imported."""
    state((None,)).save(tmp_path)
    check = ("import sys\nfrom ualinkd.cli import ctl\n"
             f"rows = ctl.pod_status({str(tmp_path)!r})\n"
             "assert rows[0]['status'] == 'not running' and rows[0]['accels'] == [0, 1], rows\n"
             "assert 'ualinkd.netns.pod' not in sys.modules\nprint('ok')\n")
    out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
