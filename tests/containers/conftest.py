"""The container tier (`make test-containers`): real podman, the project's image, pods of
containers. Collected only when UALINK_CONTAINER_TESTS=1 (the make target sets it): it
builds a base image with debootstrap the first time (minutes), too slow for `make test`.
When the tier runs, a machine that cannot run it is a failure that says why, not a skip."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("UALINK_IMAGE", "ualinkd:0.1.0")

if os.environ.get("UALINK_CONTAINER_TESTS") != "1":
    collect_ignore_glob = ["test_*.py"]


def engine_problems() -> list[str]:
    """What this host lacks for the tier, each with what to do about it."""
    problems = []
    if os.geteuid() != 0:
        problems.append("not root: the image's base is made with debootstrap and the "
                        "containers mount FUSE (run as root, or sudo make test-containers)")
    for tool, pkg in (("podman", "podman"), ("debootstrap", "debootstrap")):
        if shutil.which(tool) is None:
            problems.append(f"{tool} is missing: apt-get install {pkg}")
    if not os.path.exists("/dev/fuse"):
        problems.append("/dev/fuse is missing: modprobe fuse (the containers get it with "
                        "--device /dev/fuse)")
    if shutil.which("podman"):
        info = subprocess.run(["podman", "info", "--format",
                               "{{.Host.OCIRuntime.Name}} {{.Host.CgroupManager}}"],
                              capture_output=True, text=True, timeout=60)
        if info.returncode != 0:
            problems.append(f"podman info fails: {info.stderr.strip()} (a cgroup manager "
                            "podman can use: --cgroup-manager=cgroupfs in containers.conf "
                            "where systemd is not PID 1)")
    return problems


@pytest.fixture(scope="session")
def image() -> str:
    """The image, built from build/wheelhouse by packaging/build-image.sh."""
    problems = engine_problems()
    if problems:
        pytest.fail("this host cannot run the container tier:\n  " + "\n  ".join(problems))
    def dangling() -> set[str]:
        return set(subprocess.run(["podman", "images", "-q", "--filter", "dangling=true"],
                                  capture_output=True, text=True, timeout=60).stdout.split())

    before = dangling()
    r = subprocess.run([str(REPO / "packaging" / "build-image.sh"), IMAGE], cwd=REPO,
                       capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, f"building {IMAGE} failed:\n{r.stderr[-4000:]}"
    # a rebuild removes the image it replaced rather than leaving it untagged
    assert dangling() <= before, dangling() - before
    return IMAGE


@pytest.fixture(scope="module")
def engine(image: str) -> Iterator[str]:
    """The image, with CONTAINERS_CONF set to what this host needs (podman-probe.sh)."""
    probe = subprocess.run([str(REPO / "packaging" / "podman-probe.sh"), image],
                           capture_output=True, text=True, timeout=300)
    assert probe.returncode == 0, probe.stderr
    old = os.environ.get("CONTAINERS_CONF")
    if probe.stdout.strip():
        os.environ["CONTAINERS_CONF"] = probe.stdout.strip()
    try:
        yield image
    finally:
        if old is None:
            os.environ.pop("CONTAINERS_CONF", None)
        else:
            os.environ["CONTAINERS_CONF"] = old
