"""Bad input to the KFD loses nothing (issue 14 "Bad input"): 10,000 random 'K' ioctls on
<mount>/kfd (random directions, sizes and bytes; pointers into the hammer's own memory; fds
that are its own), then the node still serves Debian's libhsakmt end to end, the hammer's
process leaves no KFD allocation and no render client behind, and nothing was logged as a
bug."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from nodes import NEEDS_HSAKMT, SHIM, c_program, running_node

from ualinkd.config import PodConfig

pytestmark = [
    pytest.mark.integration,
    NEEDS_HSAKMT,
]


def test_kfd_hammer_then_libhsakmt_still_works(tmp_path: Path):
    with running_node(tmp_path, PodConfig.local(1, 1)) as node:
        out = subprocess.run([c_program("ioctl_hammer"), str(node.mount / "kfd"), "10000",
                              "4321"], check=True, capture_output=True, text=True,
                             timeout=300).stdout
        assert "hammer: 10000 ioctls" in out
        assert node.debug(128, "kfd_allocations") == ""
        assert node.debug(128, "clients") == ""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LD_", "HSA"))}
        env.update(LD_PRELOAD=str(SHIM), UALINK_DRI_DIR=str(node.mount / "dri"))
        r = subprocess.run([c_program("hsakmt_client")], env=env, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr + node.log_text()
        assert node.debug(128, "kfd_allocations") == ""
        log = node.log_text()
        assert "Traceback" not in log and " BUG " not in log, log
