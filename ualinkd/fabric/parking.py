"""Uses of a fabric link that is down, waiting in line for it (sans-IO, time as an input).

A send under quirk "send-fail-slow" (§13 N4's older build), and anything sent to a peer
whose link is being set up for its first use (dialing.py), waits for the link: queued when
it comes up, in the order sent and before anything sent later (`FabricLink._unpark`), or
failed at its deadline, which the link's timer task passes on (`Parked.expire(now)`). Each
ends its Completion once: with what its queueing completes, or with its failure.
"""

from __future__ import annotations

import errno
from collections import deque
from collections.abc import Callable
from typing import Any

from ..drm.completion import Completion
from ..drm.errors import DrmError
from .session import SendOutcome

# How a parked use fails (its Completion, the error, when): a batch gives each message the
# error, a request the error itself (parked_batch_failed, parked_request_failed).
Failed = Callable[[Completion[Any], DrmError, float], None]


class Parked:
    """One use of the link to `peer` waiting for it: `queue(conn)` once it is up (its
    Completion then ends with what that queued), or `failed` at `give_up`."""

    __slots__ = ("ack_timeout", "completion", "failed", "give_up", "lines", "peer", "queue")

    def __init__(self, lines: ParkedLines, peer: str, give_up: float,
                 queue: Callable[[Any], Completion[Any]], failed: Failed) -> None:
        self.lines, self.peer, self.give_up = lines, peer, give_up
        self.queue, self.failed = queue, failed
        # None once queued (what it queued completes it then) or failed.
        self.completion: Completion[Any] | None = Completion()

    def fail(self, error: DrmError, now: float) -> None:
        c, self.completion = self.completion, None
        if c is not None:
            self.failed(c, error, now)

    def expire(self, now: float) -> None:
        """Its wait is over and its link never came: it leaves the line and fails as
        unanswered (ETIME, as a send whose ACK never came)."""
        self.lines.remove(self)
        self.fail(DrmError(errno.ETIME, f"no ACK from {self.peer} within "
                                        f"{self.lines.ack_timeout:g} s"), now)


class ParkedLines:
    """Per peer whose link is down: the uses waiting for it, in the order they were made."""

    def __init__(self, ack_timeout: float) -> None:
        self.ack_timeout = ack_timeout
        self._lines: dict[str, deque[Parked]] = {}

    def park(self, peer: str, give_up: float, queue: Callable[[Any], Completion[Any]],
             failed: Failed) -> Parked:
        parked = Parked(self, peer, give_up, queue, failed)
        self._lines.setdefault(peer, deque()).append(parked)
        return parked

    def take(self, peer: str) -> deque[Parked]:
        """`peer`'s line, which leaves: its link is up."""
        return self._lines.pop(peer, deque())

    def remove(self, parked: Parked) -> None:
        line = self._lines.get(parked.peer)
        if line is not None and parked in line:
            line.remove(parked)
            if not line:
                del self._lines[parked.peer]

    def fail_all(self, error: DrmError, now: float) -> None:
        """Every line fails (the fabric closed)."""
        lines, self._lines = self._lines, {}
        for line in lines.values():
            for parked in line:
                parked.fail(error, now)


def parked_batch_failed(count: int) -> Failed:
    """How a parked batch of `count` messages fails: each message with the error."""
    def failed(c: Completion[Any], error: DrmError, now: float) -> None:
        c.set_result([(error, now) for _ in range(count)])
    return failed


def parked_request_failed(peer: str) -> Failed:
    """How a parked request to `peer` fails: unanswered is EFAULT (policy 3), as a request
    the link took and its peer never answered; closed is ESHUTDOWN."""
    def failed(c: Completion[Any], error: DrmError, now: float) -> None:
        c.set_error(DrmError(errno.EFAULT, f"no answer from {peer}")
                    if error.errno == errno.ETIME else error)
    return failed


def failed_batch(err: DrmError, now: float, count: int) -> Completion[list[SendOutcome]]:
    """A batch's outcomes known at once: every message failed with `err` at `now`."""
    c: Completion[list[SendOutcome]] = Completion()
    c.set_result([(err, now) for _ in range(count)])
    return c


def pass_on(to: Completion[Any], c: Completion[Any]) -> None:
    """What a parked use queued, once answered: to the Completion its sender holds."""
    try:
        to.set_result(c.result())
    except Exception as e:  # (its error, handed on as its own)
        to.set_error(e)
