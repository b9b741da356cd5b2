"""AMDGPU_BO_LIST through Debian's libdrm_amdgpu 2.4.114, unmodified (tests/c/libdrm_bo_list.c),
via the shim against a real node (issue 35 item 3; amdgpu_bo_list_ioctl): libdrm's
amdgpu_bo_list_create / _update / _destroy and the _raw forms succeed, the kernel's errnos
come back for an unknown BO, operation, array or list, and the daemon goes on."""

from __future__ import annotations

import errno

import pytest
from nodes import c_program, running_node
from test_libdrm import passed, run_shimmed

pytestmark = pytest.mark.integration


def test_libdrm_bo_lists(tmp_path):
    c_program("libualink_shim.so")
    with running_node(tmp_path) as node:
        s = passed(run_shimmed("libdrm_bo_list", node.mount))
        assert s["list_create"]["status"] == s["list_update"]["status"] == "ok"
        assert s["list_create_raw"]["handle"] == "2"  # idr_alloc(…, 1, 0): after list 1
        assert s["unknown_bo"]["ret"] == str(-errno.ENOENT)
        assert s["unknown_op"]["ret"] == str(-errno.EINVAL)
        assert s["bad_array"]["ret"] == str(-errno.EFAULT)
        assert s["update_none"]["ret"] == str(-errno.ENOENT)
        assert s["destroy_none"] == {"status": "ok", "ret": "0", "handle": "0"}
        assert s["list_again"]["handle"] == "1"  # both went: the lowest free is 1 again
        assert node.proc.poll() is None, node.log_text()
