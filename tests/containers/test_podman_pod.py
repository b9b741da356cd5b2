"""A pod of real containers (issue 11 item 1): the project's image on a podman network,
one node per container with `--device /dev/fuse --cap-add SYS_ADMIN`; links, health, an
export in one container imported, loaded and stored in another by the image's own clients;
a container killed and started again while the others keep serving; then the compose file.

Everything a test creates is named ualk-ct-<pid>-… and removed afterwards, even on failure.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ualinkd.config import PodConfig

REPO = Path(__file__).resolve().parents[2]
PREFIX = f"ualk-ct-{os.getpid()}"
RENDER = "/run/ualinkd/node/dri/renderD128"
FABRIC = "/run/ualinkd/node/sys/kernel/debug/ualink_fabric"


def podman(*args: str, timeout: float = 120, check: bool = True,
           **kw: object) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout,
                       **kw)  # type: ignore[call-overload]
    if check and r.returncode != 0:
        raise AssertionError(f"podman {' '.join(args[:3])} failed ({r.returncode}):\n"
                             f"{r.stdout}\n{r.stderr}")
    return r


def wait_for(what: str, cond, timeout: float = 60, every: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if cond():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(every)


class ContainerPod:
    """Three nodes, node<i> at 10.213.<k>.1<i>:7000 on a network of its own."""

    def __init__(self, image: str, tmp: Path, nodes: int = 3) -> None:
        self.image, self.n = image, nodes
        self.net = f"{PREFIX}-net"
        octet = 100 + os.getpid() % 100
        self.subnet = f"10.213.{octet}"
        doc = {
            "pod": {"uuid": str(uuid.uuid4()), "key": secrets.token_hex(32)},
            "nodes": [{"name": f"node{i}", "address": f"{self.subnet}.{10 + i}:7000",
                       "accels": [{"id": i, "vram_size": "256MiB", "gtt_size": "256MiB"}]}
                      for i in range(nodes)],
            "vpods": [{"id": 1, "members": list(range(nodes))}],
        }
        self.toml = tmp / "pod.toml"
        self.toml.write_text(PodConfig.from_dict(doc).to_toml())
        self.toml.chmod(0o600)

    def name(self, i: int) -> str:
        return f"{PREFIX}-node{i}"

    def start(self) -> None:
        podman("network", "create", "--subnet", f"{self.subnet}.0/24", self.net)
        for i in range(self.n):
            podman("run", "-d", "--name", self.name(i), "--hostname", f"node{i}",
                   "--network", self.net, "--ip", f"{self.subnet}.{10 + i}",
                   "--device", "/dev/fuse", "--cap-add", "SYS_ADMIN",
                   "-e", f"UALINK_NODE=node{i}",
                   "-v", f"{self.toml}:/etc/ualinkd/pod.toml:ro", self.image)

    def exec(self, i: int, *argv: str, **kw: object) -> subprocess.CompletedProcess[str]:
        return podman("exec", self.name(i), *argv, **kw)  # type: ignore[arg-type]

    def healthy(self, i: int) -> bool:
        # The image's HEALTHCHECK, run now (podman's timers for it need systemd as PID 1).
        return podman("healthcheck", "run", self.name(i), check=False,
                      timeout=30).returncode == 0

    def links(self, i: int) -> dict[str, bool]:
        r = self.exec(i, "cat", FABRIC, check=False, timeout=30)
        return {p: s == "up" for p, s in (line.split() for line in r.stdout.splitlines())}

    def all_linked(self, among: range | list[int]) -> bool:
        for i in among:
            up = self.links(i)
            if not all(up.get(f"node{j}") for j in among if j != i):
                return False
        return True

    def logs(self) -> str:
        return "\n".join(f"--- node{i}\n" + podman("logs", self.name(i), check=False).stdout
                         + podman("logs", self.name(i), check=False).stderr
                         for i in range(self.n))

    def close(self) -> None:
        for i in range(self.n):
            podman("rm", "-f", "-t", "2", self.name(i), check=False)
        podman("network", "rm", "-f", self.net, check=False)


@pytest.fixture
def cpod(engine: str, tmp_path: Path) -> Iterator[ContainerPod]:
    pod = ContainerPod(engine, tmp_path)
    try:
        pod.start()
        yield pod
    finally:
        pod.close()


def share_and_peer(pod: ContainerPod, exporter: int, importer: int) -> None:
    """The image's own clients: ualink-share stores a message in VRAM and exports it;
    ualink-peer on another container imports it, loads it across the fabric and stores an
    answer, which the exporter then loads (DESIGN "GPU loads and stores")."""
    share = subprocess.Popen(["podman", "exec", "-i", pod.name(exporter), "ualink-share",
                              RENDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        assert share.stdout is not None and share.stdin is not None
        line = share.stdout.readline()
        assert line.startswith("handle="), line + share.stderr.read() if share.stderr else ""
        handle = line.split()[0].split("=")[1]
        peer = podman("exec", "-i", pod.name(importer), "ualink-peer", RENDER, handle,
                      input="", timeout=60)
        assert 'importer loads "hello from the exporter\'s VRAM" across the fabric' in \
            peer.stdout, peer.stdout
        assert "importer stores" in peer.stdout
        share.stdin.close()
        rest = share.stdout.read()
        assert share.wait(timeout=60) == 0
        assert 'exporter loads offset 4096: "hello back from the importer"' in rest, rest
    finally:
        if share.poll() is None:
            share.kill()
            share.wait()


def test_three_containers_link_share_and_survive_a_restart(cpod: ContainerPod):
    try:
        wait_for("all three healthy", lambda: all(cpod.healthy(i) for i in range(3)), 90)
        wait_for("every link up", lambda: cpod.all_linked(range(3)), 60)
        share_and_peer(cpod, 0, 1)
        share_and_peer(cpod, 2, 0)
        # The client side is in the image: headers and pkg-config file where a toolchain looks.
        cpod.exec(1, "test", "-f", "/usr/local/include/ualink/ualink.h")
        cpod.exec(1, "test", "-f", "/usr/local/lib/pkgconfig/ualink.pc")
        cpod.exec(1, "test", "-e", "/usr/local/lib/libualink_shim.so")

        podman("kill", cpod.name(2))
        wait_for("the survivors to see node2 down",
                 lambda: not cpod.links(0).get("node2") and not cpod.links(1).get("node2"), 30)
        assert cpod.healthy(0) and cpod.healthy(1)
        share_and_peer(cpod, 0, 1)  # the survivors keep serving each other
        podman("start", cpod.name(2))
        wait_for("node2 healthy again", lambda: cpod.healthy(2), 90)
        wait_for("every link up again", lambda: cpod.all_linked(range(3)), 60)
        share_and_peer(cpod, 1, 2)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{cpod.logs()[-6000:]}") from None


def test_dry_run_needs_no_fuse_device(engine: str, tmp_path: Path):
    """UALINK_DRY_RUN=1 validates and prints the command, with no /dev/fuse given."""
    pod = ContainerPod(engine, tmp_path, nodes=2)
    r = podman("run", "--rm", "--network", "none", "-e", "UALINK_NODE=node1",
               "-e", "UALINK_DRY_RUN=1", "-v", f"{pod.toml}:/etc/ualinkd/pod.toml:ro", engine)
    assert r.stdout.startswith("exec ualinkd node --config /etc/ualinkd/pod.toml --node node1"), \
        r.stdout + r.stderr


@pytest.fixture
def compose_dir(tmp_path: Path) -> Iterator[Path]:
    """A copy of packaging/ (compose.yaml and its pod.toml) with a fresh key file."""
    work = tmp_path / "packaging"
    shutil.copytree(REPO / "packaging", work)
    key = work / "compose" / "pod.key"
    key.write_text(secrets.token_hex(32) + "\n")
    key.chmod(0o600)
    yield work


def test_compose_file_runs_a_pod(engine: str, compose_dir: Path):
    """packaging/compose.yaml through podman-compose, on the image built above (the
    compose file's build section is not used: the image exists)."""
    compose = shutil.which("podman-compose") or str(Path(sys.executable).parent /
                                                    "podman-compose")
    assert os.path.exists(compose), "podman-compose is missing: pip install podman-compose"
    project = f"{PREFIX}-compose"
    base = [compose, "-p", project, "-f", str(compose_dir / "compose.yaml")]

    def run(*args: str, check: bool = True, timeout: float = 300):
        r = subprocess.run([*base, *args], capture_output=True, text=True, timeout=timeout,
                           cwd=compose_dir)
        if check:
            assert r.returncode == 0, f"{args}: {r.stdout}\n{r.stderr}"
        return r

    try:
        run("up", "-d", "--no-build")
        names = {f"node{i}": f"{project}_node{i}_1" for i in range(3)}

        def linked() -> bool:
            for me, cname in names.items():
                r = podman("exec", cname, "cat", FABRIC, check=False, timeout=30)
                up = {p for p, s in (line.split() for line in r.stdout.splitlines())
                      if s == "up"}
                if up != set(names) - {me}:
                    return False
            return True

        wait_for("the compose pod's links", linked, 120)
    finally:
        with contextlib.suppress(subprocess.TimeoutExpired):
            run("down", "-t", "2", check=False, timeout=120)
