"""Large remote GPU loads on real daemons whose DATA payloads are spliced (fabric/splice.py,
drm/loaded.py): consumers other than the FUSE reply get the bytes in memory."""

from __future__ import annotations

import os

import pytest
from nodes import Client, recording, running_pod
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
            with recording([b.mount], out):
                for _ in range(3):
                    assert cb.gpu_read(VA_B, MIB) == pattern[:MIB]
            assert "unexpected exception" not in b.log_text()
    assert os.path.getsize(out) > 3 * MIB  # the loads' bytes are in the recording
