"""`ualinkctl pod` inside a node's container (issue 32 item 5), on real node daemons: a
container has its own node's mount at $UALINK_MOUNT, its name in $UALINK_NODE and the pod
config at $UALINK_CONFIG, and no other node's mount beside the config. It showed every node
"not mounted"; it shows its own node from the mount and the others through its links.
(tests/containers/test_podman_kube.py runs the same in real containers.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from nodes import running_pod

CTL = str(Path(sys.executable).parent / "ualinkctl")


def ctl(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("UALINK_")}
    return subprocess.run([CTL, "pod", *args], capture_output=True, text=True, timeout=60,
                          env=clean | env)


def test_ualinkctl_pod_from_inside_a_node(tmp_path: Path):
    with running_pod(tmp_path, nodes=3) as nodes:
        # as the image and the entrypoint set it: the node's mount, its name, its config
        # (running_pod mounts node<i> at mnt-node<i>: nothing at tmp/node<i> beside it)
        inside = {"UALINK_MOUNT": str(nodes[0].mount), "UALINK_NODE": "node0",
                  "UALINK_CONFIG": str(tmp_path / "node0.toml")}
        r = ctl(inside)
        assert r.returncode == 0, r.stdout + r.stderr
        rows = {ln.split()[0]: ln for ln in r.stdout.splitlines()[1:]}
        assert " serving " in rows["node0"] and " active " in rows["node0"], r.stdout
        assert "node1:up node2:up" in rows["node0"]
        for other in ("node1", "node2"):
            assert "serving (link from node0 up)" in rows[other], r.stdout
        doc = json.loads(ctl(inside, "status", "--json").stdout)
        by = {n["node"]: n for n in doc["nodes"]}
        assert by["node0"]["mount"] == str(nodes[0].mount)
        assert by["node2"]["seen_from"] == "node0" and by["node2"]["mount"] is None

        # the host's view of the same config (no $UALINK_MOUNT) is what it was: no mounts
        r = ctl({}, str(tmp_path / "node0.toml"))
        assert r.returncode == 1 and r.stdout.count("not mounted") == 3, r.stdout

        nodes[2].close()
        deadline = time.monotonic() + 30
        while "link from node0 down" not in (r := ctl(inside)).stdout:
            assert time.monotonic() < deadline, r.stdout
            time.sleep(0.2)
        assert r.returncode == 1
        assert "serving (link from node0 up)" in r.stdout  # node1 still


def test_ualinkctl_pod_without_a_pod_says_which(tmp_path: Path):
    """No POD and no $UALINK_CONFIG (outside a container): a usage error naming what to give."""
    r = ctl({})
    assert r.returncode == 2 and "which pod?" in r.stderr, r.stderr
