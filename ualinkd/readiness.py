"""systemd's readiness protocol, both ends: a node daemon says READY=1 on $NOTIFY_SOCKET
once it serves its mount and fabric (sd_notify); whoever starts one (the local pod in
cli/main.py, ualinkd.netns's Pod, the integration tests) binds the socket and waits.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger("ualinkd")

READY = b"READY=1"


class _Process(Protocol):
    """A subprocess.Popen, or what `ualinkd pod` forks (cli/pod.py NodeProcess)."""

    def poll(self) -> int | None: ...


def sd_notify(state: str) -> None:
    """One datagram to $NOTIFY_SOCKET, if set (sd_notify(3); "@" is the abstract namespace)."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return
    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.connect(addr)
            s.sendall(state.encode())
    except OSError as e:
        log.warning("sd_notify to %s failed: %s", os.environ["NOTIFY_SOCKET"], e.strerror)


def notify_socket(path: str | os.PathLike[str]) -> socket.socket:
    """The datagram socket a daemon started with NOTIFY_SOCKET=`path` reports to (a stale
    one left at `path` by an earlier run is removed first)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.bind(os.fspath(path))
    except BaseException:
        sock.close()
        raise
    return sock


def wait_ready(sock: socket.socket, proc: _Process, timeout: float,
               stopping: Callable[[], bool] = lambda: False) -> bool:
    """Until `proc` says READY=1 on `sock`: True; False once it exits, `stopping()` is true
    or `timeout` seconds passed (the caller decides what a failed start means)."""
    deadline = time.monotonic() + timeout
    sock.settimeout(0.05)
    while time.monotonic() < deadline:
        try:
            if READY in sock.recv(256):
                return True
        except TimeoutError:
            pass
        if proc.poll() is not None or stopping():
            return False
    return False
