"""The unmodified libdrm programs of tests/c/libdrm_*.c inside namespace nodes, on the plain
/dev/dri and /sys paths (issue 9: "the same programs run inside a --netns node").

Inside a node the paths already are the node's (ualinkd.testing binds them), but a FUSE file
is no character device: without the shim drmGetNodeTypeFromFd fails; with it
(UALINK_DRI_DIR=/dev/dri: the device identity and the token fds only) everything passes.
"""

from __future__ import annotations

import errno
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from nodes import SHIM, c_program
from test_libdrm import BO_SIZE, check_discovery, parse, passed

from ualinkd.netns.pod import PodUnavailable, check_prerequisites
from ualinkd.testing import Pod, pod_config

pytestmark = pytest.mark.pod



def shimmed(argv: list[str]) -> list[str]:
    return ["env", f"LD_PRELOAD={SHIM}", "UALINK_DRI_DIR=/dev/dri", *argv]


@pytest.fixture
def pod(tmp_path: Path) -> Iterator[Pod]:
    try:
        check_prerequisites()
    except PodUnavailable as e:
        pytest.skip(str(e))
    c_program("libualink_shim.so")
    c_program("libdrm_discovery")
    with Pod(pod_config(nodes=2, accels_per_node=2), state_root=tmp_path) as p:
        yield p


def test_libdrm_programs_inside_namespace_nodes(pod: Pod):
    n0, n1 = pod.node(0), pod.node(1)
    # drmGetNodeTypeFromFd without the shim: the FUSE render node is a regular file
    bare = n0.run([c_program("libdrm_discovery")], timeout=60)
    assert bare.returncode == 1
    assert parse(bare.stdout)["node_type"] == {"status": "fail", "err": str(-errno.EINVAL)}
    # with it: discovery of both accels, one device handle each (spec §2.2)
    r = n0.run(shimmed([c_program("libdrm_discovery")]), timeout=60)
    s = passed(r)
    check_discovery(s, accels=2)
    assert s["init_other"] == {"status": "ok", "node": "/dev/dri/renderD129", "distinct": "1"}
    assert r.stderr == ""
    # BOs and syncobjs, their dma-buf and syncobj fds from /dev/dmabuf
    s = passed(n1.run(shimmed([c_program("libdrm_bo")]), timeout=60))
    assert s["syncobj_export"] == {"status": "ok", "fd_valid": "1", "cloexec": "1"}
    # the FABRIC flow between the two nodes' namespaces (spec §3.3 steps 6-8)
    exporter = n0.popen(shimmed([c_program("libdrm_fabric"), "export"]),
                        stdin=-1, stdout=-1, stderr=-1)
    assert exporter.stdout is not None
    head = parse(exporter.stdout.readline() + exporter.stdout.readline())
    assert "export" in head, head
    s = passed(n1.run(shimmed([c_program("libdrm_fabric"), "import", head["export"]["lo"],
                               head["export"]["hi"], head["gpu_store"]["text"]]), timeout=60))
    assert s["bo_import"]["size"] == str(BO_SIZE)
    assert s["load"]["equal"] == "1"
    assert s["cpu_map_import"]["ret"] == str(-errno.EPERM)
    out, err = exporter.communicate("", timeout=30)
    assert exporter.returncode == 0 and "ok done" in out, out + err
