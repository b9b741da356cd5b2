"""Completion: a result that arrives later, handed to its one consumer by callback.

The kernel's `struct completion` / `dma_fence_add_callback` idea, sans-IO: whoever produces
the result (the fabric link, when the exporter's DATA comes in) calls `set_result` or
`set_error`, and the consumer's callback runs right there, in the producer's call. No task is
started and no scheduler step passes in between, which is what a GPU load's round trip costs
otherwise (a task per request and two wake-ups: issue 15's profile). A consumer that cannot
take a callback gets an awaitable instead; producers offer both (see fabric/agent.py).

A wait the caller may give up (an import's NPA_RSP wait, interruptible in the kernel: I13)
has a canceller: the producer's `on_cancel(fn)`, run by the consumer's `cancel()` while the
result is not in; `fn` ends the completion itself, with the error it chooses.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["Completion"]

T = TypeVar("T")
U = TypeVar("U")


class Completion(Generic[T]):
    """One result (or one exception), delivered once, to one consumer.

    Contract: `set_result`/`set_error` are called exactly once. `then(fn)` adds a step: the
    result becomes what `fn(self)` returns (or raises), and the completion is handed on as
    that new result's; the old one is consumed (steps run in order, in `set_*`'s call, and a
    chain of them is one object, since a GPU load's answer passes through four layers).
    `when_done(cb)`, at most once and last, runs `cb(self)` as soon as the result is there
    (at once if it already is)."""

    __slots__ = ("_callback", "_canceller", "_done", "_error", "_steps", "_value")

    def __init__(self) -> None:
        self._callback: Callable[[Completion[T]], None] | None = None
        self._steps: list[Callable[[Completion[Any]], Any]] = []
        self._done = False
        self._value: T | None = None
        self._error: Exception | None = None
        self._canceller: Callable[[], None] | None = None

    @property
    def done(self) -> bool:
        return self._done

    def set_result(self, value: T) -> None:
        self._finish(value, None)

    def set_error(self, error: Exception) -> None:
        self._finish(None, error)

    def _finish(self, value: T | None, error: Exception | None) -> None:
        if self._done:
            raise RuntimeError("Completion finished twice")
        self._done, self._value, self._error = True, value, error
        self._canceller = None
        steps, self._steps = self._steps, []
        for fn in steps:
            self._step(fn)
        cb, self._callback = self._callback, None
        if cb is not None:
            cb(self)

    def _step(self, fn: Callable[[Completion[Any]], Any]) -> None:
        try:
            self._value, self._error = fn(self), None
        except Exception as e:
            self._value, self._error = None, e

    def on_cancel(self, canceller: Callable[[], None]) -> None:
        """(The producer) what `cancel()` runs: it must finish the completion."""
        self._canceller = canceller

    def cancel(self) -> bool:
        """(The consumer) give up the wait: the producer's canceller runs, once, if the
        result is not in; True when that ended it. Without one, once done, or when the
        canceller found nothing to give up (its result is on its way), False."""
        canceller, self._canceller = self._canceller, None
        if canceller is None or self._done:
            return False
        canceller()
        return self._done

    def result(self) -> T:
        """The value, or the exception raised; only once done."""
        if not self._done:
            raise RuntimeError("Completion.result() before it is done")
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]  # done without error: a T

    def when_done(self, callback: Callable[[Completion[T]], None]) -> None:
        if self._callback is not None:
            raise RuntimeError("a Completion has one consumer")
        if self._done:
            callback(self)
        else:
            self._callback = callback

    def then(self, fn: Callable[[Completion[T]], U]) -> Completion[U]:
        if self._callback is not None:
            raise RuntimeError("then() after when_done()")
        if self._done:
            self._step(fn)
        else:
            self._steps.append(fn)
        return self  # type: ignore[return-value]  # the same object, its result now a U
