"""Fabric links that come up on first use (`[pod] fabric_links = "on-first-use"`, the default
of pods over 32 nodes; fabric/dialing.py): real daemons over TCP on 127.0.0.1, C clients
through libualink. A pair's link is set up when an import first needs it, as the kernel's
connection is (`amdgpu_ualink_setup_connection` on first use, spec §5.4); the node whose
name sorts first dials, the other asks it to (a knock)."""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from nodes import Client, Node, start_node, tls_pod_config, wait_until

from ualinkd import sysfs
from ualinkd.cli.main import free_tcp_ports
from ualinkd.config import PodConfig

pytestmark = pytest.mark.integration

VA = 0x40_0000_0000  # where an exporter maps its BO
IMPORT_VA = 0x50_0000_0000  # where an importer maps the import


def first_use_config(nodes: int, response_ms: int = 2000) -> PodConfig:
    base = PodConfig.local(nodes, 1, free_tcp_ports(nodes))
    return replace(base, fabric_links="on-first-use", response_timeout_ms=response_ms,
                   send_ack_timeout_ms=response_ms)


@contextlib.contextmanager
def first_use_pod(tmp: Path, config: PodConfig) -> Iterator[list[Node]]:
    started: list[Node] = []
    try:
        for n in config.nodes:
            started.append(start_node(tmp, config, n.name))
        yield started
    finally:
        for node in started:
            node.close()


def links(node: Node) -> dict[str, bool]:
    return sysfs.parse_fabric((node.mount / sysfs.FABRIC_STATUS).read_text())


def import_and_load(exporter: Client, importer: Client, data: bytes) -> bytes:
    """Export a BO holding `data` on one node, import it on another and GPU-load it."""
    bo = exporter.bo_create(1 << 16)
    exporter.va_map(bo, VA, 1 << 16)
    assert exporter.gpu_write(VA, data) == len(data)
    fd = importer.import_(exporter.export(bo))
    try:
        gem = importer.fd_to_handle(fd)
        importer.va_map(gem, IMPORT_VA, 1 << 16)
        return importer.gpu_read(IMPORT_VA, len(data))
    finally:
        os.close(fd)


def test_links_come_up_on_first_use_in_either_direction(tmp_path):
    """§5.4: no link at start; an import from a node whose name sorts first (node2 imports
    node0's BO: node2 asks, node0 dials back) and one towards it (node0 imports node1's:
    node0 dials) each bring up that pair's link, and only it; the GPU loads across them
    see the exporter's bytes. Nothing above INFO is logged for it."""
    with first_use_pod(tmp_path, first_use_config(3)) as (n0, n1, n2):
        assert not any(up for n in (n0, n1, n2) for up in links(n).values())
        with Client(n0.render()) as c0, Client(n1.render()) as c1, Client(n2.render()) as c2:
            assert import_and_load(c0, c2, b"knocked") == b"knocked"
            assert links(n2) == {"node0": True, "node1": False}
            assert links(n0)["node2"] and not links(n0)["node1"]
            assert import_and_load(c1, c0, b"dialed") == b"dialed"
            assert links(n0) == {"node1": True, "node2": True}
            assert not links(n1)["node2"] and not links(n2)["node1"]
        for node in (n0, n1, n2):
            bad = [line for line in node.log_text().splitlines()
                   if " WARNING " in line or " ERROR " in line]
            assert not bad, bad


def test_a_link_never_used_is_shown_unlinked_not_down(tmp_path, capsys):
    """ualink_fabric (`ualinkctl peers`, `ualinkctl pod`): a link on first use that no use
    has asked for is `<peer> down unlinked` (the second field stays up|down), shown as
    `unlinked (first use)`, and not as a dropped link, which stays `<peer> down`."""
    import json

    from ualinkd.cli import ctl

    def peers(node: Node, *json_flag: str) -> str:
        assert ctl.main(["--mount", str(node.mount), *json_flag, "peers"]) == 0
        return capsys.readouterr().out

    with first_use_pod(tmp_path, first_use_config(3)) as (n0, n1, n2):
        status = n0.mount / sysfs.FABRIC_STATUS
        assert status.read_text() == "node1 down unlinked\nnode2 down unlinked\n"
        assert peers(n0).splitlines()[-2] == (
            "fabric links: node1 unlinked (first use), node2 unlinked (first use)")
        assert json.loads(peers(n0, "--json"))["fabric"] == [
            {"node": "node1", "up": False, "state": "unlinked"},
            {"node": "node2", "up": False, "state": "unlinked"}]
        with Client(n0.render()) as c0, Client(n1.render()) as c1:
            assert import_and_load(c0, c1, b"used") == b"used"
        assert status.read_text() == "node1 up\nnode2 down unlinked\n"
        n1.close()  # dropped: down, as any dropped link
        assert wait_until(lambda: status.read_text().startswith("node1 down\n"), timeout=15)
        assert status.read_text() == "node1 down\nnode2 down unlinked\n"
        assert peers(n0).splitlines()[-2] == (
            "fabric links: node1 down, node2 unlinked (first use)")
        assert json.loads(peers(n0, "--json"))["fabric"] == [
            {"node": "node1", "up": False},
            {"node": "node2", "up": False, "state": "unlinked"}]


def test_first_use_over_mutual_tls(tmp_path):
    """The same over mutual TLS (no data channels): node1 asks node0 for their link over
    TLS, node0 dials back, the import and its GPU load go through."""
    config = tls_pod_config(tmp_path, first_use_config(2))
    with first_use_pod(tmp_path, config) as (n0, n1):
        with Client(n0.render()) as c0, Client(n1.render()) as c1:
            assert import_and_load(c0, c1, b"tls") == b"tls"
        assert links(n1) == {"node0": True}
        for node in (n0, n1):
            bad = [line for line in node.log_text().splitlines()
                   if " WARNING " in line or " ERROR " in line]
            assert not bad, bad


@pytest.mark.parametrize("first_use", ["knocked", "dialed"])
def test_a_link_comes_back_after_its_dialer_restarts(tmp_path, first_use):
    """§5.8a: node0 (the lower name, the dialer) restarts after the pair's first use: a new
    daemon, which wants no link. knocked: node1 asked node0 for the link (it imported first);
    dialed: node0 used the pair first, so node1 never asked (before the fix nobody asked
    again: the link stayed down and node1's next import failed with ETIME). Either way the
    link is kept as one made at start is (README, "Fabric links at scale"): node1 knocks for
    it again, so its next import of node0's memory works, through the HELLO of a restarted
    peer, without anyone dialing at start."""
    config = first_use_config(2)
    with first_use_pod(tmp_path, config) as (n0, n1):
        with Client(n0.render()) as c0, Client(n1.render()) as c1:
            exporter, importer = (c0, c1) if first_use == "knocked" else (c1, c0)
            assert import_and_load(exporter, importer, b"before") == b"before"
        n0.close()
        n0b = start_node(tmp_path / "again", config, "node0")
        try:
            assert wait_until(lambda: links(n1)["node0"], timeout=10)
            with Client(n0b.render()) as c0, Client(n1.render()) as c1:
                assert import_and_load(c0, c1, b"after") == b"after"
        finally:
            n0b.close()


def test_first_use_of_an_unreachable_peer_fails_after_the_response_timeout(tmp_path):
    """§5.4 / §13 N2: an import whose exporter's node is gone waits for the link in the
    daemon (its HELLO waits in line, as the kernel's setup_connection waits for the answer)
    for the pod's response timeout, then fails as an unreachable peer's does (ETIME), and
    again at once while the peer stays away."""
    config = first_use_config(2, response_ms=1000)
    with first_use_pod(tmp_path, config) as (n0, n1):
        with Client(n0.render()) as c0:
            handle = c0.export(c0.bo_create(1 << 16))
        n0.close()
        with Client(n1.render()) as c1:
            t = time.monotonic()
            with pytest.raises(OSError) as e:
                c1.import_(handle)
            waited = time.monotonic() - t
            assert e.value.errno == errno.ETIME, e.value
            assert 0.9 <= waited < 5, waited
            t = time.monotonic()
            with pytest.raises(OSError) as e:
                c1.import_(handle)
            assert e.value.errno == errno.ETIME
            assert time.monotonic() - t < 0.5


def test_ualinkd_pod_of_first_use_links_is_ready_without_links(tmp_path):
    """`ualinkd pod` with `fabric_links = "on-first-use"` prints every node's ready line once
    the nodes serve, with every accel ACTIVE and no link up (none is needed yet); the first
    import across a pair links it. SIGINT stops it cleanly, its mounts gone."""
    import signal
    import subprocess
    import sys

    from ualinkd.fuse.lowlevel import fuse_mounts_under

    mine = tmp_path / "mine.toml"
    mine.write_text(first_use_config(3).to_toml())
    root = tmp_path / "pod"
    out, err = tmp_path / "pod.out", tmp_path / "pod.err"
    with open(out, "w") as o, open(err, "w") as e:
        proc = subprocess.Popen([sys.executable, "-m", "ualinkd", "pod", "--config", str(mine),
                                 "--root", str(root)], stdout=o, stderr=e,
                                stdin=subprocess.DEVNULL)
    try:
        assert wait_until(lambda: proc.poll() is not None
                          or out.read_text().count(" ready: ") == 3, 60), err.read_text()
        assert proc.poll() is None, err.read_text()
        assert "each fabric link comes up on its first use" in err.read_text()
        for i in range(3):
            node = root / f"node{i}"
            state = node / "sys/class/drm/renderD128/device/ualink/accel_state"
            assert state.read_text().strip() == "active"
            status = sysfs.parse_fabric((node / sysfs.FABRIC_STATUS).read_text())
            assert not any(status.values()), status
        with Client(str(root / "node0/dri/renderD128")) as c0, \
                Client(str(root / "node2/dri/renderD128")) as c2:
            assert import_and_load(c0, c2, b"pod") == b"pod"
        assert sysfs.parse_fabric((root / "node2" / sysfs.FABRIC_STATUS).read_text()) == {
            "node0": True, "node1": False}
        # `ualinkctl pod`: the pair never used is unlinked, not DOWN as a dropped link
        from ualinkd.cli import ctl
        rows = {r["node"]: r for r in ctl.pod_status(str(root))}
        assert rows["node2"]["links"] == {"node0": True, "node1": False}
        assert rows["node2"]["first_use"] == {"node1": "unlinked"}
        table = ctl.render_pod_status(list(rows.values()))
        assert "node0:up node1:unlinked" in table and "DOWN" not in table, table
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0, err.read_text()
        assert not fuse_mounts_under(str(root))
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_a_pod_over_32_nodes_links_on_first_use_by_default(tmp_path):
    """`ualinkd pod --nodes 33` (fabric_links "auto": over dialing.AT_START_MAX_NODES) is
    ready with no link up and writes a bounded log while it starts: a "serving" and an
    "ACTIVE" line per node, and one line saying how it links. The full mesh of a pod this
    size would be 528 links."""
    import signal
    import subprocess
    import sys

    from ualinkd.fabric.dialing import AT_START_MAX_NODES

    n = AT_START_MAX_NODES + 1
    root = tmp_path / "pod"
    out, err = tmp_path / "pod.out", tmp_path / "pod.err"
    with open(out, "w") as o, open(err, "w") as e:
        proc = subprocess.Popen([sys.executable, "-m", "ualinkd", "pod", "--nodes", str(n),
                                 "--root", str(root)], stdout=o, stderr=e,
                                stdin=subprocess.DEVNULL)
    try:
        assert wait_until(lambda: proc.poll() is not None
                          or out.read_text().count(" ready: ") == n, 120), err.read_text()
        assert proc.poll() is None, err.read_text()
        lines = err.read_text().splitlines()
        assert len(lines) <= 2 * n + 2, lines
        assert any("each fabric link comes up on its first use" in ln for ln in lines)
        for i in (0, n - 1):
            status = sysfs.parse_fabric((root / f"node{i}" / sysfs.FABRIC_STATUS).read_text())
            assert len(status) == n - 1 and not any(status.values()), status
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0, err.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
