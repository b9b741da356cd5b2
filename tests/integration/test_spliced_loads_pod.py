"""Large remote GPU loads on real daemons whose DATA payloads are spliced (fabric/splice.py,
drm/loaded.py): consumers other than the FUSE reply get the bytes in memory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from nodes import Client, running_pod
from test_pod_fabric import pod_config
from test_pod_gpu import VA_A, VA_B, share

pytestmark = pytest.mark.integration
MIB = 1 << 20


def test_a_large_load_recorded_by_ualinkd_record_comes_back_whole(tmp_path):
    """`ualinkd record` attached to a running pod (no --trace: the importer's loads are
    answered by callback, their 1 MiB DATA spliced) makes the node trace every GPU load
    (node.py `_traced_gpu`): the load still returns its bytes, and the recording has
    them (a traced load's result is the payload in memory, not a pipe)."""
    pattern = bytes(range(251)) * (MIB // 251 + 1)
    out = tmp_path / "attached.jsonl"
    with running_pod(tmp_path, config=pod_config(2)) as (a, b):
        with Client(a.render()) as ca, Client(b.render()) as cb:
            bo, _, _ = share(ca, cb, MIB)
            ca.va_map(bo, VA_A, MIB)
            assert ca.gpu_write(VA_A, pattern[:MIB]) == MIB
            assert cb.gpu_read(VA_B, MIB) == pattern[:MIB]  # not recorded: spliced
            rec = subprocess.Popen(
                [sys.executable, "-m", "ualinkd", "record", "--mount", str(b.mount),
                 "-o", str(out)], stderr=subprocess.PIPE, text=True)
            try:
                assert rec.stderr is not None
                assert rec.stderr.readline().strip() == "recording"
                for _ in range(3):
                    assert cb.gpu_read(VA_B, MIB) == pattern[:MIB]
                time.sleep(0.5)  # the last lines on their way through the socket
                rec.send_signal(signal.SIGINT)
                assert rec.wait(30) == 0
            finally:
                if rec.poll() is None:
                    rec.kill()
                    rec.wait()
            assert "unexpected exception" not in b.log_text()
    assert os.path.getsize(out) > 3 * MIB  # the loads' bytes are in the recording
