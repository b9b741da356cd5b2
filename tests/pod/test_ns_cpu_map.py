"""CPU mappings inside namespace nodes (README, "CPU mappings"): the same C client as
tests/integration/test_cpu_map.py, on the plain /dev/dri paths of a node's own mount and
network namespaces — the daemon's abstract socket is reached in the node's netns."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ualinkd.testing import Pod, pod_config
from ualinkd.testing.plugin import pod_or_skip

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from test_shim import steps

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "libualink_c" / "build"
# Inside a node /dev/dri is the node's own (bound from its mount), /dev/dmabuf too.
SHIM_ENV = ["env", f"LD_PRELOAD={BUILD / 'libualink_shim.so'}", "UALINK_DRI_DIR=/dev/dri"]


@pytest.fixture(scope="module")
def pod() -> Iterator[Pod]:
    if not (BUILD / "cpu_map").exists() or not (BUILD / "libualink_shim.so").exists():
        subprocess.run(["make", "-s", "-C", str(REPO / "libualink_c")], check=True)
    p = pod_or_skip(config=pod_config(nodes=2, accels_per_node=1))
    try:
        yield p
    finally:
        p.close()


def test_one_node_cpu_maps_in_its_namespaces(pod):
    """Issue 9 item 6 "inside a --netns node with the plain /dev/dri paths": every step of
    the one-node run (CPU↔GPU, dma-buf, PROT_NONE MAP_FIXED, the refusals) passes."""
    r = pod.node(0).run([*SHIM_ENV, str(BUILD / "cpu_map"), "local", "/dev/dri/renderD128"],
                        timeout=60)
    s = steps(r.stdout)
    assert r.returncode == 0 and "after_close" in s, r.stdout + r.stderr
    assert all(v["status"] == "ok" for v in s.values()), r.stdout


def test_across_namespace_nodes(pod):
    """The exporter's CPU store is the remote importer's GPU load, and the importer's store
    is in the exporter's mapping; the import is not CPU mappable (EPERM)."""
    exp = pod.node(0).popen([*SHIM_ENV, str(BUILD / "cpu_map"), "export", "/dev/dri/renderD128"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        handle = steps(exp.stdout.readline())["export"]
        exp.stdin.write("store 4096 ns-cpu-store\n")
        exp.stdin.flush()
        assert steps(exp.stdout.readline())["store"]["status"] == "ok"
        r = pod.node(1).run([*SHIM_ENV, str(BUILD / "cpu_map"), "import", "/dev/dri/renderD128",
                             handle["lo"], handle["hi"], "4096", "12", "8192", "ns-remote"],
                            timeout=60)
        s = steps(r.stdout)
        assert s["import_mmap"] == {"status": "ok", "errno": "1"}, r.stdout + r.stderr
        assert s["remote_load"]["data"] == "ns-cpu-store", r.stdout
        exp.stdin.write("show 8192 9\n")
        exp.stdin.flush()
        assert steps(exp.stdout.readline())["show"]["data"] == "ns-remote"
    finally:
        exp.stdin.close()
        try:
            exp.wait(10)
        except subprocess.TimeoutExpired:
            exp.kill()
            exp.wait()
