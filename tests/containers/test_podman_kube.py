"""`podman kube play packaging/k8s/podman-pod.yaml` (issue 32 item 5): the Kubernetes YAML
the engine here runs, as shipped (only its names made unique): three node containers of one
Pod come up and link, the image's own clients import across them, and `ualinkctl pod` in a
node's container shows the whole pod — its own node from its mount, the others through its
links — where it said "not mounted" for every node.

Everything is named ualk-kube-<pid>-… and removed afterwards, even on failure."""

from __future__ import annotations

import base64
import json
import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from test_podman_pod import FABRIC, podman, share_and_peer, wait_for

REPO = Path(__file__).resolve().parents[2]
NAME = f"ualk-kube-{os.getpid()}"
NODES = ("node0", "node1", "node2")


class KubePod:
    """The shipped podman-pod.yaml under unique names: the Pod, its ConfigMap, the Secret."""

    def __init__(self, image: str, tmp: Path) -> None:
        docs = list(yaml.safe_load_all((REPO / "packaging/k8s/podman-pod.yaml").read_text()))
        cm = next(d for d in docs if d["kind"] == "ConfigMap")
        pod = next(d for d in docs if d["kind"] == "Pod")
        cm["metadata"]["name"] = f"{NAME}-config"
        pod["metadata"]["name"] = NAME
        spec = pod["spec"]
        next(v for v in spec["volumes"] if "configMap" in v)["configMap"]["name"] = \
            f"{NAME}-config"
        for c in spec["containers"]:
            # the image the tier built (the shipped name is what `make image` tags)
            c["image"] = image if "/" in image else f"localhost/{image}"
            for e in c["env"]:
                if "valueFrom" in e:
                    e["valueFrom"]["secretKeyRef"]["name"] = f"{NAME}-key"
        self.file = tmp / "kube.yaml"
        self.file.write_text(yaml.safe_dump_all(docs))

    def name(self, i: int) -> str:
        return f"{NAME}-{NODES[i]}"  # podman kube play names a container POD-CONTAINER

    def up(self) -> None:
        key = secrets.token_hex(32)
        doc = json.dumps({"key": base64.b64encode(key.encode()).decode()})
        podman("secret", "create", f"{NAME}-key", "-", input=doc)
        podman("kube", "play", str(self.file), timeout=300)

    def links(self, i: int) -> dict[str, bool]:
        r = podman("exec", self.name(i), "cat", FABRIC, check=False, timeout=30)
        return {p: s == "up" for p, s in (line.split() for line in r.stdout.splitlines())}

    def logs(self) -> str:
        out = []
        for i in range(len(NODES)):
            r = podman("logs", self.name(i), check=False)
            out.append(f"--- {NODES[i]}\n{r.stdout}{r.stderr}")
        return "\n".join(out)

    def down(self) -> None:
        podman("kube", "down", str(self.file), check=False, timeout=120)
        podman("pod", "rm", "-f", "-t", "2", NAME, check=False)
        podman("secret", "rm", f"{NAME}-key", check=False)


@pytest.fixture
def kube(engine: str, tmp_path: Path) -> Iterator[KubePod]:
    pod = KubePod(engine, tmp_path)
    try:
        pod.up()
        yield pod
    finally:
        pod.down()


def test_kube_play_runs_the_pod_and_ualinkctl_sees_it_from_inside(kube: KubePod):
    try:
        def serving(i: int) -> bool:
            return podman("exec", kube.name(i), "ualinkctl", "state", check=False,
                          timeout=30).returncode == 0

        wait_for("every node serving", lambda: all(serving(i) for i in range(3)), 90)
        wait_for("every link up", lambda: all(
            all(kube.links(i).get(n) for n in NODES if n != NODES[i]) for i in range(3)), 60)
        share_and_peer(kube, 0, 1)  # type: ignore[arg-type]  # (has .name(i), all it uses)
        share_and_peer(kube, 2, 0)  # type: ignore[arg-type]

        r = podman("exec", kube.name(1), "ualinkctl", "pod", check=False, timeout=30)
        assert r.returncode == 0, r.stdout + r.stderr
        rows = {line.split()[0]: line for line in r.stdout.splitlines()[1:]}
        assert set(rows) == set(NODES), r.stdout
        assert "not mounted" not in r.stdout, r.stdout
        assert "serving" in rows["node1"] and "ppod_configured" not in rows["node1"], r.stdout
        assert "serving (link from node1 up)" in rows["node0"], r.stdout
        doc = json.loads(podman("exec", kube.name(1), "ualinkctl", "pod", "--json",
                                timeout=30).stdout)
        by = {n["node"]: n for n in doc["nodes"]}
        assert by["node1"]["mount"] == "/run/ualinkd/node" and by["node1"]["states"]
        assert by["node2"]["seen_from"] == "node1" and by["node2"]["links"] == {"node1": True}

        # a node gone: the others' view of it says so, and the command fails
        podman("stop", "-t", "5", kube.name(2), timeout=60)
        wait_for("node1 to see node2 down", lambda: not kube.links(1).get("node2"), 30)
        r = podman("exec", kube.name(1), "ualinkctl", "pod", check=False, timeout=30)
        assert r.returncode == 1 and "link from node1 down" in r.stdout, r.stdout
    except (AssertionError, subprocess.TimeoutExpired) as e:
        raise AssertionError(f"{e}\n{kube.logs()[-6000:]}") from None
