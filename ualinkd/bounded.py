"""File system calls into a node's mount that cannot hang their caller.

A FUSE request to a stopped daemon (SIGSTOP, a debugger, a hung node) waits until the daemon
runs again; the waiting thread is killable but not interruptible, so a tool that reads a
mount on its main thread ignores Ctrl-C and blocks for good. `bounded()` runs the call on a
daemon thread and gives up after `timeout` seconds with NotAnswering; the abandoned thread
stays blocked until the daemon answers or the process exits (exit kills it: the wait is
killable). Tools (ualinkctl, ualinkd.testing's CLI) use it for every read and write.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

DEFAULT_TIMEOUT = 2.0


class NotAnswering(OSError):
    """The mount did not answer in time (its daemon is stopped or hung)."""


def bounded(fn: Callable[[], T], what: str, timeout: float = DEFAULT_TIMEOUT) -> T:
    """fn() on a helper thread: its result or exception, or NotAnswering after `timeout`.
    The main thread waits on an Event, so Ctrl-C (KeyboardInterrupt) still works."""
    done = threading.Event()
    box: list[tuple[bool, Any]] = []  # (True, fn's result) or (False, what it raised)

    def run() -> None:
        try:
            box.append((True, fn()))
        except BaseException as e:  # handed to the caller below
            box.append((False, e))
        done.set()

    threading.Thread(target=run, name=f"bounded {what}", daemon=True).start()
    if not done.wait(timeout):
        raise NotAnswering(f"{what}: not answering after {timeout:g} s (is the node's daemon "
                           "stopped?)")
    ok, value = box[0]
    if ok:
        return value  # fn's T, boxed
    raise value
