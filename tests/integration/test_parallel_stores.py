"""GPU stores of one render node run in parallel (issue 10 item 6): the render node is opened
with FOPEN_PARALLEL_DIRECT_WRITES and reports the whole 48-bit VA space as its size, so the
kernel takes the inode lock shared for every pwrite (fuse_dio_wr_exclusive_lock: a write
ending beyond st_size would still take it exclusively). Before, a store waiting on a stopped
exporter held up every other process's store on that node, even to local VRAM."""

from __future__ import annotations

import contextlib
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from nodes import Client, running_pod, stop_process
from test_pod_fabric import pod_config

pytestmark = pytest.mark.integration

SYS_PWRITE64 = 18  # x86_64
REMOTE_VA, LOCAL_VA = 0x7F00_0000_0000, 0x1_0000_0000

# The other process: imports the handle on its own render fd, maps it, and stores to it
# when told (its store then waits on the exporter).
STORER = """
import os, sys
sys.path.insert(0, sys.argv[1])
from nodes import Client
c = Client(sys.argv[2])
h = c.fd_to_handle(c.import_((int(sys.argv[3]), int(sys.argv[4]))))
c.va_map(h, int(sys.argv[5]), 1 << 20)
print("ready", flush=True)
sys.stdin.readline()
try:
    print(os.pwrite(c.fd, b"r" * 4096, int(sys.argv[5])), flush=True)
except OSError as e:
    print(e.strerror, flush=True)
"""


def _in_pwrite(pid: int) -> bool:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/syscall").read_text().split()[0] == str(SYS_PWRITE64)
    return False


def test_a_store_waiting_on_a_stopped_exporter_holds_up_no_other_store(tmp_path):
    """Process P stores (pwrite) through node b's render node into an imported BO whose
    exporter (node a) is SIGSTOPped: its STORE waits for the response timeout. While it
    waits, this process's store through the same render node (its own open) to local VRAM
    completes, and P is still inside its pwrite."""
    with running_pod(tmp_path, config=pod_config(2, response_ms=4000)) as (a, b), \
            Client(a.render()) as ca:
        lo, hi = ca.export(ca.bo_create(1 << 20))
        storer = subprocess.Popen(
            [sys.executable, "-c", STORER, str(Path(__file__).parent), b.render(), str(lo),
             str(hi), str(REMOTE_VA)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert storer.stdout is not None and storer.stdin is not None
            assert select.select([storer.stdout], [], [], 20)[0], "the storer never got ready"
            assert storer.stdout.readline().strip() == "ready"
            stop_process(a.proc.pid)
            storer.stdin.write("\n")
            storer.stdin.flush()
            deadline = time.monotonic() + 10
            while not _in_pwrite(storer.pid):
                assert time.monotonic() < deadline, "the remote store never started"
                time.sleep(0.01)
            with Client(b.render()) as cb:
                bo = cb.bo_create(1 << 20)
                cb.va_map(bo, LOCAL_VA, 1 << 20)
                assert cb.gpu_write(LOCAL_VA, b"local" * 100) == 500
                remote_done = bool(select.select([storer.stdout], [], [], 0)[0])
                still_in_pwrite = _in_pwrite(storer.pid)
                assert cb.gpu_read(LOCAL_VA, 5) == b"local"
            assert not remote_done and still_in_pwrite, \
                "the local store waited for the remote one"
        finally:
            a.proc.send_signal(signal.SIGCONT)
            try:
                storer.wait(20)
            except subprocess.TimeoutExpired:
                storer.kill()
                storer.wait(10)
        assert storer.returncode == 0
