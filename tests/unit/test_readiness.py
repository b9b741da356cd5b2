"""ualinkd/readiness.py: the one READY=1 wait that the local pod, ualinkd.testing's Pod and
the integration tests share (sd_notify(3)'s protocol), with real processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ualinkd.readiness import notify_socket, wait_ready

NOTIFY = "from ualinkd.readiness import sd_notify; sd_notify({state!r})"


def _spawn(code: str, notify: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code],
                            env=dict(os.environ, NOTIFY_SOCKET=str(notify)))


def test_ready_when_the_daemon_says_ready(tmp_path: Path) -> None:
    notify = tmp_path / "notify"
    notify.write_text("stale")  # left by an earlier run: replaced
    sock = notify_socket(notify)
    proc = _spawn(NOTIFY.format(state="STATUS=starting") + "; "
                  + NOTIFY.format(state="READY=1") + "; import time; time.sleep(30)", notify)
    try:
        assert wait_ready(sock, proc, timeout=30)
    finally:
        proc.kill()
        proc.wait()
        sock.close()


def test_not_ready_when_the_daemon_exits_first(tmp_path: Path) -> None:
    sock = notify_socket(tmp_path / "notify")
    proc = _spawn("raise SystemExit(3)", tmp_path / "notify")
    try:
        assert not wait_ready(sock, proc, timeout=30)
        assert proc.returncode == 3
    finally:
        sock.close()


def test_not_ready_when_stopping_or_past_the_timeout(tmp_path: Path) -> None:
    sock = notify_socket(tmp_path / "notify")
    proc = _spawn("import time; time.sleep(30)", tmp_path / "notify")
    try:
        assert not wait_ready(sock, proc, timeout=30, stopping=lambda: True)
        assert not wait_ready(sock, proc, timeout=0.2)
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
        sock.close()
