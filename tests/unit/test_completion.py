"""drm/completion.py: a result handed on by callback, through chained steps (issue 15's GPU
load path: link → agent → access → FUSE edge, one object, no task)."""

from __future__ import annotations

import errno

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ualinkd.drm.completion import Completion
from ualinkd.drm.errors import DrmError


def test_steps_run_in_order_in_the_producers_call_and_the_consumer_last() -> None:
    seen: list[object] = []
    c: Completion[int] = Completion()
    d = c.then(lambda c: c.result() + 1).then(lambda c: c.result() * 10)
    d.when_done(lambda c: seen.append(c.result()))
    assert seen == [] and not d.done
    c.set_result(4)
    assert seen == [50]


def test_an_error_passes_the_steps_that_do_not_catch_it() -> None:
    """A step sees the error by calling result(); one that translates it (the FUSE edge's
    DrmError → FuseError) hands the new error on; one that recovers hands on a value."""
    c: Completion[bytes] = Completion()
    translated = c.then(lambda c: c.result())

    def to_errno(c: Completion[bytes]) -> int:
        try:
            c.result()
        except DrmError as e:
            return -e.errno
        return 0

    out = translated.then(to_errno)
    c.set_error(DrmError(errno.EFAULT))
    assert out.result() == -errno.EFAULT


def test_done_before_the_consumer_comes() -> None:
    """A request answered before its consumer registered (an error found at once) is handed
    over when it does register, and steps added then run at once."""
    c: Completion[int] = Completion()
    c.set_result(1)
    d = c.then(lambda c: c.result() + 1)
    seen: list[int] = []
    d.when_done(lambda c: seen.append(c.result()))
    assert seen == [2]


def test_misuse_is_loud() -> None:
    c: Completion[int] = Completion()
    with pytest.raises(RuntimeError):
        c.result()  # not done yet
    c.when_done(lambda c: None)
    with pytest.raises(RuntimeError):
        c.when_done(lambda c: None)  # one consumer
    with pytest.raises(RuntimeError):
        c.then(lambda c: 0)  # steps come before the consumer
    c.set_result(1)
    with pytest.raises(RuntimeError):
        c.set_error(DrmError(errno.EIO))  # delivered once


@given(st.lists(st.integers(-3, 3), max_size=8), st.booleans(), st.integers())
def test_a_chain_is_the_composition_of_its_steps(adds: list[int], early: bool, x: int) -> None:
    """Whether the result comes before or after the steps are added, the consumer sees the
    steps applied in order, exactly once each."""
    c: Completion[int] = Completion()
    if early:
        c.set_result(x)
    d = c
    for a in adds:
        d = d.then(lambda c, a=a: c.result() + a)
    seen: list[int] = []
    d.when_done(lambda c: seen.append(c.result()))
    if not early:
        c.set_result(x)
    assert seen == [x + sum(adds)]


def test_cancel_runs_the_producers_canceller_once_and_only_before_the_result() -> None:
    """An interruptible wait (spec I13: the NPA_RSP wait): the consumer's cancel() runs the
    producer's canceller, which ends the completion with its error, through the steps; a
    second cancel, or one after the result, does nothing."""
    calls: list[int] = []
    c: Completion[int] = Completion()
    c.on_cancel(lambda: (calls.append(1), c.set_error(DrmError(errno.EINTR))))
    d = c.then(lambda c: c.result() + 1)
    seen: list[BaseException] = []

    def done(c: Completion[int]) -> None:
        with pytest.raises(DrmError) as e:
            c.result()
        seen.append(e.value)

    d.when_done(done)
    assert d.cancel() and not d.cancel()
    assert calls == [1] and len(seen) == 1 and seen[0].errno == errno.EINTR

    late: Completion[int] = Completion()
    late.on_cancel(lambda: calls.append(2))
    late.set_result(3)
    uncancellable: Completion[int] = Completion()
    assert not late.cancel() and not uncancellable.cancel()
    assert calls == [1] and late.result() == 3 and not uncancellable.done
