"""Completion: a result that arrives later, handed to its one consumer by callback.

The kernel's `struct completion` / `dma_fence_add_callback` idea, sans-IO: whoever produces
the result (the fabric link, when the exporter's DATA comes in) calls `set_result` or
`set_error`, and the consumer's callback runs right there, in the producer's call. No task is
started and no scheduler step passes in between, which is what a GPU load's round trip costs
otherwise (a task per request and two wake-ups: issue 15's profile).

It is the one deferred shape a request's answer has when it crosses a layer: a layer returns
a plain value or a Completion, never an awaitable. Work the core writes as a coroutine (an
ioctl handler that awaits the caller's memory) is adapted into a Completion once, by the
`Spawn` the edge injects: the trio edge runs it as a task that ends the Completion; a node
with no edge runs it at once (`run_now`), which suits fakes that never wait.

A wait the caller may give up (an import's NPA_RSP wait, interruptible in the kernel: I13)
has a canceller: the producer's `on_cancel(fn)`, run by the consumer's `cancel()` while the
result is not in; `fn` ends the completion itself, with the error it chooses (at once, or,
for a Spawn's task, once that task has unwound from its cancel).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

__all__ = ["Completion", "Spawn", "done", "run_now"]

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
        """(The producer) what `cancel()` runs: it must finish the completion (at once, or
        as soon as the work it cancelled has unwound: then `cancel()` returns False)."""
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


# The edge's adapter from a coroutine to a Completion: it runs `aw` (a task at the trio edge)
# and ends the Completion with its outcome. Its canceller (Completion.cancel) gives up the
# run; the Completion then ends with the error the edge chooses (the FUSE edge's EINTR).
Spawn = Callable[[Awaitable[T]], Completion[T]]


def done(value: T) -> Completion[T]:
    """A Completion that already has its result."""
    c: Completion[T] = Completion()
    c.set_result(value)
    return c


def run_now(aw: Awaitable[T]) -> Completion[T]:
    """The Spawn of a node with no edge (unit tests): `aw` runs to its end in this call,
    which works when nothing it awaits suspends (fakes that answer at once); one that does
    suspend is a bug of the test, raised here (after `aw` is closed, its cleanup done)."""
    c: Completion[T] = Completion()
    steps = aw.__await__()
    try:
        steps.send(None)
    except StopIteration as stop:
        c.set_result(stop.value)
        return c
    except Exception as e:
        c.set_error(e)
        return c
    close = getattr(steps, "close", None)
    if close is not None:
        close()
    raise RuntimeError("a coroutine waited, and this node has no edge to run it (Spawn)")
