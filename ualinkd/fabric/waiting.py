"""Awaiting a Completion (drm/completion.py) from a trio task: the one adapter from an
answer by callback to a wait, for the few callers that are tasks anyway (the receive ring
awaiting its reply's ACK, a caller of `FabricLink.ping`'s kind, tests).

A cancelled wait gives the Completion up (`cancel()`: its producer's canceller, if any, ends
it), as the FUSE edge does with an interrupted request's.
"""

from __future__ import annotations

from typing import TypeVar

import trio

from ..drm.completion import Completion

T = TypeVar("T")


async def completed(c: Completion[T]) -> T:
    """`c`'s result once it is in (its exception raised)."""
    if not c.done:
        done = trio.Event()
        c.when_done(lambda _: done.set())
        try:
            await done.wait()
        except trio.Cancelled:
            c.cancel()
            raise
    return c.result()
