"""AMDGPU_CS through Debian's libdrm_amdgpu 2.4.114, unmodified (tests/c/libdrm_cs.c), via the
shim against a real node (issue 35, "Tests that must exist"): a context, a BO list, an SDMA
IB with a COPY_LINEAR submitted by amdgpu_cs_submit, its fence queried and waited for, the
copied bytes checked by GPU loads, a syncobj out of amdgpu_cs_submit_raw2 signaled; a GFX IB
refused with EINVAL (no GFX ring here)."""

from __future__ import annotations

import errno
import os
import re
import subprocess

import pytest
from nodes import c_program, running_node, running_pod
from test_libdrm import SHIM, passed, run_shimmed

pytestmark = pytest.mark.integration


def test_libdrm_command_submission(tmp_path):
    c_program("libualink_shim.so")
    with running_node(tmp_path) as node:
        s = passed(run_shimmed("libdrm_cs", node.mount))
        assert s["gfx_ib"]["ret"] == str(-errno.EINVAL)
        assert s["cs_submit"]["seq"] == "1"
        # amdgpu_cs_query_fence_status: expired; amdgpu_cs_wait_fences(all): status 1
        assert s["fence"] == {"status": "ok", "expired": "1", "signaled": "1"}
        assert s["sdma_copy"]["equal"] == "1"
        assert s["syncobj_out"]["seq"] == "2"
        assert node.proc.poll() is None, node.log_text()


AMDGPU_STRESS = "/usr/bin/amdgpu_stress"


@pytest.mark.skipif(not os.path.exists(AMDGPU_STRESS),
                    reason="libdrm-tests is not installed (make apt installs it)")
def test_amdgpu_stress_copies_between_vram_and_gtt(tmp_path):
    """Issue 35's first test as a user runs it: libdrm's own amdgpu_stress (Debian's
    libdrm-tests 2.4.114), `-b v 2m -b g 2m -c 0 1 1m 4` -- a 2 MiB VRAM and a 2 MiB GTT
    BO, then copies of 1 MiB from the first to the second, 4 of them, each an SDMA IB
    (COPY_LINEAR) submitted with amdgpu_cs_submit_raw2 and waited for -- through the shim on
    a 1-node pod: exit 0 and its report of the 4 IBs."""
    c_program("libualink_shim.so")
    with running_pod(tmp_path, nodes=1) as (node,):
        env = {k: v for k, v in os.environ.items()
               if k not in ("LD_PRELOAD", "UALINK_DRI_DIR", "UALINK_DMABUF_DIR")}
        env.update(LD_PRELOAD=str(SHIM), UALINK_DRI_DIR=str(node.mount / "dri"))
        r = subprocess.run([AMDGPU_STRESS, "-b", "v", "2m", "-b", "g", "2m",
                            "-c", "0", "1", "1m", "4"], env=env, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}{r.stderr}{node.log_text()}"
        assert "failed" not in (r.stdout + r.stderr).lower(), r.stdout + r.stderr
        # its report after the copies: "Submitted 4 IBs to copy from 0(va) to 1(va) ..."
        assert re.search(r"Submitted 4 IBs to copy from 0\(\w+\) to 1\(\w+\) 1048576 bytes",
                         r.stdout), r.stdout
        assert node.proc.poll() is None, node.log_text()
