"""Recorders coming and going on a live pod (issue 29 item 4): a tracer never changes a
call's outcome. Remote GPU stores and loads run while `ualinkd record` subscribers attach
and leave on the importer's trace socket, and while other daemons' sweeps of stale sockets
probe it (replay/record.py): none fails, and a sweep is never a subscriber."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest
from nodes import Client, running_pod
from test_pod_gpu import VA_B, share

from ualinkd.replay import record

pytestmark = pytest.mark.integration
STORES = 1500


def _attach_and_leave(path: str) -> None:
    """One `ualinkd record` subscription: SUBSCRIBE, the hello line, gone."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(path)
        s.sendall(record.SUBSCRIBE)
        s.recv(4096)


def test_remote_accesses_never_fail_while_recorders_come_and_go(tmp_path):
    """Issue 29 item 4: 28-32 of ~10,000 remote stores failed with EIO under 700 attaches
    (the completion asserted the tracer was still there). Here STORES remote stores and as
    many loads of the importer's, with subscribers attaching and leaving and stale-socket
    sweeps probing throughout: every one succeeds, and each load reads back its store."""
    with running_pod(tmp_path, 2) as (a, b):
        path = record.trace_socket_path(str(b.mount))
        stop = threading.Event()
        churn = {"attaches": 0, "sweeps": 0}

        def churner() -> None:
            while not stop.is_set():
                _attach_and_leave(path)
                churn["attaches"] += 1
                record.clear_stale_trace_sockets(os.path.dirname(path))
                churn["sweeps"] += 1

        with Client(a.render()) as ca, Client(b.render()) as cb:
            share(ca, cb, 1 << 20)
            thread = threading.Thread(target=churner, daemon=True)
            thread.start()
            failures: list[str] = []
            try:
                deadline = time.monotonic() + 120
                for i in range(STORES):
                    data = i.to_bytes(4, "little") * 16
                    try:
                        assert cb.gpu_write(VA_B + 64 * (i % 1024), data) == 64
                        assert cb.gpu_read(VA_B + 64 * (i % 1024), 64) == data
                    except OSError as e:
                        failures.append(f"{i}: {e}")
                    if time.monotonic() > deadline:
                        break
            finally:
                stop.set()
                thread.join(10)
            print(f"{len(failures)} of {STORES} remote store+load pairs failed under "
                  f"{churn['attaches']} attaches and {churn['sweeps']} sweeps")
            assert churn["attaches"] > 10
            assert failures == [], failures[:5]
        assert "Traceback" not in b.log_text()
