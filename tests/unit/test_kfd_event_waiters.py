"""WAIT_EVENTS with several waiters (kfd_events.c: set_event activates every waiter of the
event's queue, init_event_waiter, test_event_condition, destroy_event; issue 14 item 3):
two concurrent waiters both complete on one SET_EVENT of an auto-reset event, wait_for_all
keeps activations across SET_EVENTs, a timeout ends in TIMEOUT, a destroyed event in FAIL
(EIO). The clock is trio's MockClock (autojump), so nothing really sleeps."""

from __future__ import annotations

import errno
import struct

import trio
import ualink_testkit as kit
from test_kfd_rules import call, create, event_node, wait_args
from trio.testing import MockClock

from ualinkd.abi import ioctls as tbl
from ualinkd.amdkfd import chardev
from ualinkd.daemon import TrioSyncWaits
from ualinkd.drm.device import Caller


def setup(n_events: int, auto_reset: int = 1):
    node, p, mem = event_node()
    node.kfd.waits = TrioSyncWaits(lambda: int(trio.current_time() * 1e9))
    for _ in range(n_events):
        assert create(node, p, auto_reset=auto_reset)[0] == 0
    return node, p, mem


def run_waiters(node, p, waits: list[bytes], actions) -> list[tuple[int, int]]:
    """Start one WAIT_EVENTS per args in `waits`, then run `actions(set_event, out)`; each
    waiter's (return value, wait_result), in order."""
    caller = Caller(pid=p.pid, uid=0)
    out: list[tuple[int, int] | None] = [None] * len(waits)

    async def main() -> None:
        # watchdog: on the mock clock a waiter that is never woken fails, not hangs
        with trio.fail_after(3600):
            async with trio.open_nursery() as nursery:
                for i, args in enumerate(waits):
                    async def waiter(i: int = i, args: bytes = args) -> None:
                        res = await kit.answer(node.kfd.ioctl(
                            p, tbl.KFD_WAIT_EVENTS.cmd, args, caller))
                        out[i] = (res.result, struct.unpack("<QIIII", res.out)[4])
                    nursery.start_soon(waiter)
                await trio.sleep(0.5)
                await actions(lambda eid: node.kfd.ioctl(
                    p, tbl.KFD_SET_EVENT.cmd, struct.pack("<II", eid, 0), caller), out)

    trio.run(main, clock=MockClock(autojump_threshold=0))
    assert None not in out
    return out  # type: ignore[return-value]


COMPLETE, TIMEOUT = chardev.KFD_IOC_WAIT_RESULT_COMPLETE, chardev.KFD_IOC_WAIT_RESULT_TIMEOUT


def test_one_set_event_wakes_both_waiters_of_an_auto_reset_event():
    """set_event: both waiters activated by one SET_EVENT; the auto-reset event is consumed
    by them (a later poll times out) rather than by the first one alone."""
    node, p, mem = setup(1)
    a = wait_args(mem, [0], ptr=0x500, timeout=10_000)
    b = wait_args(mem, [0], ptr=0x600, timeout=10_000)

    async def actions(set_event, out) -> None:
        set_event(0)

    assert run_waiters(node, p, [a, b], actions) == [(0, COMPLETE), (0, COMPLETE)]
    poll = call(node, p, tbl.KFD_WAIT_EVENTS.cmd, wait_args(mem, [0], ptr=0x700))
    assert poll.result == 0 and struct.unpack("<QIIII", poll.out)[4] == TIMEOUT
    assert not p.events[0].waiters


def test_wait_for_all_keeps_activations_and_others_time_out():
    """Waiter A waits for all of {0, 1}, B for any of {1}, C for {2} with a 2 s timeout:
    SET_EVENT(1) completes B and activates A's 1; SET_EVENT(0) then completes A; C ends in
    TIMEOUT with 0 returned."""
    node, p, mem = setup(3)
    a = wait_args(mem, [0, 1], ptr=0x500, all_=1, timeout=chardev.KFD_EVENT_TIMEOUT_INFINITE)
    b = wait_args(mem, [1], ptr=0x600, timeout=10_000)
    c = wait_args(mem, [2], ptr=0x700, timeout=2000)

    async def actions(set_event, out) -> None:
        set_event(1)
        await trio.sleep(1)
        assert out[1] == (0, COMPLETE) and out[0] is None
        set_event(0)

    assert run_waiters(node, p, [a, b, c], actions) == [(0, COMPLETE), (0, COMPLETE),
                                                         (0, TIMEOUT)]


def test_a_manual_reset_event_stays_signaled_for_every_waiter():
    """Not auto-reset: signaled after SET_EVENT with waiters too, so later waits see it."""
    node, p, mem = setup(1, auto_reset=0)
    a = wait_args(mem, [0], ptr=0x500, timeout=10_000)
    b = wait_args(mem, [0], ptr=0x600, timeout=10_000)

    async def actions(set_event, out) -> None:
        set_event(0)

    assert run_waiters(node, p, [a, b], actions) == [(0, COMPLETE), (0, COMPLETE)]
    for ptr in (0x700, 0x800):
        poll = call(node, p, tbl.KFD_WAIT_EVENTS.cmd, wait_args(mem, [0], ptr=ptr))
        assert struct.unpack("<QIIII", poll.out)[4] == COMPLETE


def test_destroying_an_awaited_event_fails_the_wait():
    """destroy_event under a waiter: test_event_condition FAIL, the ioctl EIO."""
    node, p, mem = setup(1)
    a = wait_args(mem, [0], ptr=0x500, timeout=chardev.KFD_EVENT_TIMEOUT_INFINITE)
    caller = Caller(pid=p.pid, uid=0)

    async def actions(set_event, out) -> None:
        node.kfd.ioctl(p, tbl.KFD_DESTROY_EVENT.cmd, struct.pack("<II", 0, 0), caller)

    assert run_waiters(node, p, [a], actions) == [(-errno.EIO,
                                                   chardev.KFD_IOC_WAIT_RESULT_FAIL)]
