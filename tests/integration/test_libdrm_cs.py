"""AMDGPU_CS through Debian's libdrm_amdgpu 2.4.114, unmodified (tests/c/libdrm_cs.c), via the
shim against a real node (issue 35, "Tests that must exist"): a context, a BO list, an SDMA
IB with a COPY_LINEAR submitted by amdgpu_cs_submit, its fence queried and waited for, the
copied bytes checked by GPU loads, a syncobj out of amdgpu_cs_submit_raw2 signaled; a GFX IB
refused with EINVAL (no GFX ring here)."""

from __future__ import annotations

import errno

import pytest
from nodes import c_program, running_node
from test_libdrm import passed, run_shimmed

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
