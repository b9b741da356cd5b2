"""drm/completion.py: a result handed on by callback, through chained steps (issue 15's GPU
load path: link → agent → access → FUSE edge, one object, no task)."""

from __future__ import annotations

import errno

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from ualinkd.drm.completion import Completion, run_now
from ualinkd.drm.errors import DrmError
from ualinkd.gpu_engine import _InTask


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


def test_run_now_is_the_spawn_of_a_node_without_an_edge() -> None:
    """completion.run_now: a coroutine that never suspends (fakes answering at once) ends
    its Completion in the call, its error too; one that suspends is a bug of the test,
    raised at once, after the coroutine is closed (its cleanup ran)."""
    async def value() -> int:
        return 7

    async def fails() -> int:
        raise DrmError(errno.EFAULT, "no memory")

    assert run_now(value()).result() == 7
    with pytest.raises(DrmError):
        run_now(fails()).result()
    cleaned: list[bool] = []

    class Suspends:  # what an event loop's wait does: yield to the loop
        def __await__(self):  # type: ignore[no-untyped-def]
            yield "a trap only an event loop understands"

    async def waits() -> None:
        try:
            await Suspends()
        finally:
            cleaned.append(True)

    with pytest.raises(RuntimeError, match="no edge"):
        run_now(waits())
    assert cleaned == [True]


def test_the_engine_runs_a_spawned_coroutine_in_its_own_task() -> None:
    """gpu_engine._InTask, the engine's Spawn: the coroutines an access hands it run in the
    awaiting task (no task started), also one handed over by a callback while it waits for
    a Completion another task ends (a piece after a remote one), and the answer is the
    chain's."""
    here = _InTask()
    tasks_before: list[int] = []
    remote: Completion[int] = Completion()

    async def local(n: int) -> int:
        tasks_before.append(id(trio.lowlevel.current_task()))
        return n

    def after_remote(c: Completion[int]) -> None:
        here(local(c.result() + 1)).when_done(lambda d: answer.set_result(d.result() * 10))

    answer: Completion[int] = Completion()
    first = here(local(1))
    first.when_done(lambda c: remote.when_done(after_remote))

    async def main() -> int:
        async with trio.open_nursery() as n:
            async def exporter() -> None:
                await trio.sleep(0.1)
                remote.set_result(4)

            n.start_soon(exporter)
            got = await here.value(answer)
            assert set(tasks_before) == {id(trio.lowlevel.current_task())}
            return got

    assert trio.run(main) == 50
    assert len(tasks_before) == 2
