"""--trace-file for namespaced pods (issue 12): without it a `--netns` node's trace is in its
daemon log, deleted with the pod; with it the nodes (in their own mount namespaces) append
to one file that outlives the pod. Both `ualinkd pod --netns` and the testing Pod."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from ualinkd.testing import Pod
from ualinkd.testing.plugin import pod_or_skip

pytestmark = pytest.mark.pod


def test_testing_pod_trace_file_outlives_the_pod(tmp_path):
    """Pod(trace="text", trace_file=…): both nodes' ioctls and the fabric messages of an
    import across them are in the one file, strace-style, after close() removed everything
    else."""
    trace = tmp_path / "trace.txt"
    pod = pod_or_skip(nodes=2, response_timeout_ms=300, trace="text", trace_file=trace)
    try:
        exporter, importer = pod.node(0).agent(), pod.node(1).agent()
        try:
            handle = exporter.export(exporter.bo_create(8192))
            importer.import_(handle)
        finally:
            exporter.close()
            importer.close()
    finally:
        pod.close()
    assert not pod.dir.exists()
    text = trace.read_text()
    assert ("node0 renderD128 DRM_IOCTL_AMDGPU_GEM_CREATE({bo_size=0x2000, alignment="
            in text), text
    assert "node1 renderD128 DRM_IOCTL_AMDGPU_UALINK_HANDLE({op=IMPORT" in text
    assert "domains=AMDGPU_GEM_DOMAIN_VRAM" in text
    assert "node1 fabric send node1/accel1 -> node0/accel0 NPA_REQ{" in text
    assert "node0 fabric recv node1/accel1 -> node0/accel0 NPA_REQ{" in text


def test_ualinkd_pod_netns_trace_file(tmp_path):
    """`ualinkd pod --netns --trace=json --trace-file F`: F holds only JSON records (the
    ready lines stay on stdout), among them node0's GEM_CREATE, and stays after SIGINT."""
    pod_or_skip(nodes=1).close()  # skips where namespaced pods cannot run
    trace = tmp_path / "trace.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "ualinkd", "pod", "--netns", "--nodes", "2",
                             "--root", str(tmp_path / "root"), "--trace=json",
                             "--trace-file", str(trace)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        lines = [proc.stdout.readline() for _ in range(3)]
        assert lines[0].startswith("node0 ready: ip="), lines
        pod_dir = lines[2].split(": ", 1)[1].strip()
        agent = Pod.attach(pod_dir).node(0).agent()
        try:
            agent.bo_create(4096)
        finally:
            agent.close()
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    assert not os.path.exists(pod_dir)
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    assert any(r["type"] == "ioctl" and r["ioctl"] == "AMDGPU_GEM_CREATE"
               and r["node"] == "node0" and r["in"]["bo_size"] == 4096 for r in records)
    assert {r["v"] for r in records} == {2}
