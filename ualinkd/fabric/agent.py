"""The UALink agent: waits for the fabric on behalf of the managers (trio).

The managers (ualink/manager.py) decide every UALink flow, timeouts included; this only
waits, delivers and carries: one receive ring per local accel that hands that accel's
messages to its manager in arrival order, awaiting the sends each one answers with before
the next (the soft IH ring, §5.1), its task taking what is queued and the call that brings
an awaited reply's ACK going on with it (a bounded part); one timer task per accel that
calls `handle_timer(now)` at the manager's `get_timer()`; the sends' outcomes reported back
with the time; and the imports in flight, each a Completion the managers' `Wake` effects
end (no task waits).

Costs per burst, not per message: the sends one manager call produces (a file's close that
revokes 2,000 BOs, a ring's burst of NPA_REVOKEs answered) are queued on each link in
order as one batch, one flush, its ACKs' outcomes reported by callback (a Completion, from
the link's reader: FabricLink.send_batch); a ring takes every message queued for it per
wake-up. The data plane's requests are Completions too (FabricLink.request): a GPU load
over the fabric costs no task.
"""

from __future__ import annotations

import errno
import functools
import logging
import math
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, TypeGuard

import trio

from ..drm.completion import Completion
from ..drm.errors import DrmError
from ..drm.gem import DmaBuf
from ..drm.loaded import Loaded, copy_into
from ..ualink import protocol as p
from ..ualink.host import UalinkHost
from ..ualink.manager import (
    Announce,
    Effect,
    HelloAckSent,
    ImportDone,
    ImportFlow,
    ImportWaiter,
    NpaRspSent,
    ProbeFn,
    Send,
    UalinkManager,
    Wake,
)

if TYPE_CHECKING:
    from ..amdgpu.vm import RemotePiece

log = logging.getLogger(__name__)

# A message's outcome: None or its DrmError, and when it was known (FabricLink.SendOutcome).
SendOutcome = tuple[DrmError | None, float]
# (src accel, dst accel, messages): queues them at once, in order (FabricLink.send_batch);
# the Completion gives each one's outcome.
SendBatchFn = Callable[[int, int, Sequence[p.Dwords]], "Completion[list[SendOutcome]]"]
# (src accel, dst accel, NPA byte address, length to load | bytes to store) -> loaded bytes
# (FabricLink.request)
RequestFn = Callable[[int, int, int, "int | bytes"], "Completion[Loaded]"]
CHUNK = 1 << 20  # data-plane transfers are split into chunks this big ...
IN_FLIGHT = 4  # ... with this many outstanding at once per transfer
RING_SIZE = 1024  # messages queued per local accel before its ring counts as full (logged)
# Acknowledged messages of one sender an accel's queue holds past RING_SIZE before the link
# stops reading from that sender: room for the link to read on to the ACKs that the ring's
# own handlers wait for (a handler that sends a reply waits for its ACK, behind the peer's
# messages). Counted per sending accel, so a peer that floods one accel holds up its own
# link only: another peer's messages to that accel queue, and its link reads on (its ACKs
# and DATA answers to this node's requests keep coming), as with a per-link inbox.
BACKLOG = 4096
BURST = 256  # messages a ring takes per wake-up, their sends queued together
# (importing accel, piece, write, data to store | None) -> loaded bytes | count stored
RemoteAccessFn = Callable[[int, "RemotePiece", bool, "bytes | None"],
                          "Completion[Loaded | int]"]


class FabricNode(Protocol):
    """What the agent needs from the node it serves (node.py's NodeCore)."""

    @property
    def host(self) -> UalinkHost: ...

    def attach_fabric(self, drain: Callable[[], None], wait_import: ImportWaiter,
                      remote_access: RemoteAccessFn | None) -> None: ...


def _piece_fault(piece: RemotePiece, e: DrmError) -> DrmError:
    """A failed request of a piece is a GPU page fault (policy 10), whatever its cause."""
    return DrmError(errno.EFAULT,
                    f"GPU page fault at NPA {piece.npa_byte_address:#x}: {e.strerror}")


def _deliver(flow: ImportFlow, c: Completion[DmaBuf]) -> None:
    try:
        buf = flow.outcome()
    except DrmError as e:
        c.set_error(e)
    else:
        c.set_result(buf)


# Replies a receive handler sends: awaited (or queued) by the ring before its next message.
_RING_REPLIES = (HelloAckSent, NpaRspSent)
# The messages that come one per request: an import's NPA_REQ, and the answers to this
# accel's own requests (NPA_RSP, NPA_FAIL, HELLO_ACK). One that reaches an idle ring
# (nothing queued, nothing being handled) is handled in the link's call, as the ring would
# handle it next; the ring's wake-up cost each a scheduler turn, 60-90 µs of each side of
# a first import (pinned). An NPA_REQ's reply is the ring's to await: the ring stays busy
# (later messages wait in it) until its ACK came, and that ACK's call goes on with them
# (_handle). The bursts whose sends the ring batches (a file's NPA_REVOKEs, their
# NPA_RELEASEs) and HELLOs go through the ring.
_HANDLED_AT_ONCE = (p.NpaReq, p.NpaRsp, p.NpaFail, p.HelloAck)


class _Ring:
    """One local accel's receive queue, the soft IH ring (§5.1): acknowledged messages wait
    here, in arrival order, until its task handles them; a sender's link waits for room
    once `limit` (RING_SIZE + BACKLOG) of that sender's messages are queued."""

    __slots__ = ("busy", "by_src", "closed", "idle", "limit", "queue", "room", "waited",
                 "wake")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.queue: deque[tuple[int, p.Message]] = deque()
        self.by_src: dict[int, int] = {}  # sending accel -> its messages in `queue`
        self.wake = trio.Event()  # set when a message is queued
        # The links waiting for room (on_message's Completions), by sending accel, each
        # ended once that sender's share of the queue is below `limit` again.
        self.room: dict[int, list[Completion[None]]] = {}
        self.waited = 0  # messages that found it full (past RING_SIZE) since it last emptied
        # True: the ring waits for a message with none queued and none being handled, so
        # the next one may be handled at once, in order (on_message); False: it has
        # messages, or is handling them.
        self.idle = False
        # True while its messages are handled outside its task: one handled at once, or a
        # reply's ACK awaited, the ring going on in the call that brings that ACK (the
        # link's: UalinkAgent._carry_on). Its task neither takes a message nor is woken
        # meanwhile (messages that come only queue); it is woken if that call hands back
        # a queue it did not empty.
        self.busy = False
        self.closed = False  # its task stopped: a pending ACK's call does not go on

    def take(self, n: int) -> list[tuple[int, p.Message]]:
        """The next `n` queued messages, the links of senders now below `limit` reading on."""
        burst = [self.queue.popleft() for _ in range(n)]
        for src, _ in burst:
            left = self.by_src[src] - 1
            if left:
                self.by_src[src] = left
            else:
                del self.by_src[src]
            if left < self.limit and src in self.room:
                for c in self.room.pop(src):
                    c.set_result(None)
        return burst

    def make_room(self) -> None:
        room, self.room = self.room, {}
        for waiting in room.values():
            for c in waiting:
                c.set_result(None)


class UalinkAgent:
    def __init__(self, node: FabricNode, send_batch: SendBatchFn,
                 request: RequestFn | None = None, *, ring_size: int = RING_SIZE,
                 probe: ProbeFn | None = None,
                 announce: Callable[[int, int], None] | None = None) -> None:
        self.host = node.host
        # §13 N2: the managers read their peers' incarnations through `probe` (the link's
        # record of them); `announce` tells the peers of a manager start.
        self._announce = announce
        if probe is not None:
            for mgr in self.host.managers:
                mgr.probe = probe
        self._send_batch = send_batch
        self.ring_size = ring_size
        self._request = request
        # The imports in flight, by the Wake that ends them (wait_import).
        self._imports: dict[tuple[int, ImportDone], tuple[ImportFlow, Completion[DmaBuf]]] = {}
        self._nursery: trio.Nursery | None = None
        # accel -> its receive queue (the soft IH ring): the one place an acknowledged
        # message waits, from the link's call that decoded it to its handling
        self._rings: dict[int, _Ring] = {}
        # accel -> the cancel scope its timer task sleeps in, whose deadline is the manager's
        # next one: brought forward in place when a sooner one is armed (no wake-up).
        self._timer_scopes: dict[int, trio.CancelScope] = {}
        # The run's clock: trio.current_time() is three Python calls, this one (set in run)
        self._now: Callable[[], float] = trio.current_time
        node.attach_fabric(self.drain, self.wait_import,
                           self.remote_access if request is not None else None)

    # -- data plane ------------------------------------------------------------------------
    def serve(self, src_accel: int, dst_accel: int, npa_byte_addr: int,
              length_or_data: int | bytes | bytearray) -> list[memoryview]:
        """An importer's LOAD/STORE at one of our accels' NPAs: the loaded bytes as views of
        the BO's memory (none for a STORE); DrmError(EFAULT) refuses it."""
        mgr = self.host.by_accel_id(dst_accel)
        if mgr is None:
            raise DrmError(errno.EFAULT, f"accel {dst_accel} is not on this node")
        if isinstance(length_or_data, int):
            return mgr.serve_load(src_accel, npa_byte_addr, length_or_data)
        mgr.serve_store(src_accel, npa_byte_addr, length_or_data)
        return []

    def load_routes(self, src_accel: int, dst_accel: int, npa_byte_addr: int, length: int
                    ) -> list[tuple[int, int, bytearray | int | None, int]]:
        """The data plane's routes for a LOAD just served (UalinkManager.load_routes)."""
        mgr = self.host.by_accel_id(dst_accel)
        return [] if mgr is None else mgr.load_routes(src_accel, npa_byte_addr, length)

    def remote_access(
        self, accel_id: int, piece: RemotePiece, write: bool, data: bytes | None = None
    ) -> Completion[Loaded | int]:
        """A GPU load/store of an imported NPA BO: LOAD/STORE requests to the exporter, in
        chunks, several in flight, answered by callback (no task: the link's reader
        completes them). A store completes once the exporter applied it. If a chunk
        faults, the result stops before it (EFAULT when nothing was done, policy 10)."""
        assert self._request is not None
        length = piece.length
        if length > CHUNK:
            return _Transfer(self._request, accel_id, piece, write, data).start()
        c = self._request(accel_id, piece.exporter_accel, piece.npa_byte_address,
                          length if not write else (data or b"")[:length])

        def answered(c: Completion[Loaded]) -> Loaded | int:
            try:
                got = c.result()
            except DrmError as e:
                raise _piece_fault(piece, e) from None
            return length if write else got

        return c.then(answered)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self._now = trio.lowlevel.current_clock().current_time
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for mgr in self.host.managers:
                ring = self._rings[mgr.accel_id] = _Ring(self.ring_size + BACKLOG)
                nursery.start_soon(self._receive_loop, mgr, ring)
                nursery.start_soon(self._timer_loop, mgr)
            task_status.started()
            await trio.sleep_forever()

    # -- receiving -------------------------------------------------------------------------
    def on_message(self, src: int, dst: int, dwords: p.Dwords) -> Completion[None] | None:
        """Called by the link once it has acknowledged a message (§5.1), in arrival order:
        the message is queued for `dst`'s ring now (or handled at once by an idle ring).
        An acknowledged message is never dropped: when the queue holds RING_SIZE + BACKLOG
        of `src`'s messages this returns a Completion that ends once it has room for them
        again, and the link reads nothing more from that peer meanwhile (back-pressure: TCP
        slows the sender down); other senders' links read on."""
        ring = self._rings.get(dst)
        if ring is None:
            log.warning("message from accel %d for accel %d, which is not ours", src, dst)
            return None
        msg = p.decode_message(dwords)
        if ring.idle and isinstance(msg, _HANDLED_AT_ONCE):
            self._receive_now(dst, src, msg)
            return None
        ring.idle = False  # (what follows it waits behind it, in the ring)
        queue = ring.queue
        queue.append((src, msg))
        mine = ring.by_src[src] = ring.by_src.get(src, 0) + 1
        if not ring.busy:  # (a busy ring's handler takes it next, in the ACK's call)
            ring.wake.set()
        if len(queue) > self.ring_size:
            ring.waited += 1
            if mine >= ring.limit:
                room: Completion[None] = Completion()
                ring.room.setdefault(src, []).append(room)
                return room
        return None

    async def _receive_loop(self, mgr: UalinkManager, ring: _Ring) -> None:
        """The soft IH ring (§5.1): messages handled one after the other, in arrival order.
        It takes what is queued (up to BURST) per wake-up: the sends their handlers do not
        wait for (NPA_RELEASE, NPA_FAIL, …) are queued on their links as they come and go
        out together, one batch per destination, once the burst is handled or before a
        reply the ring must wait for (HELLO_ACK, NPA_RSP), so each link's order stays the
        order of the handlers. Such a reply's ACK is awaited in no task: the ring goes on
        in the call that brings it (_carry_on)."""
        try:
            await self._ring(mgr, ring)
        finally:
            ring.idle = False  # (stopped: nothing is handled at once)
            ring.closed = True
            ring.make_room()  # (a link that waits for room reads on)

    async def _ring(self, mgr: UalinkManager, ring: _Ring) -> None:
        queue = ring.queue
        while True:
            while ring.busy or not queue:
                ring.idle = not queue and not ring.busy
                ring.wake = trio.Event()
                await ring.wake.wait()
            ring.idle = False
            self._handle(mgr, ring, deque(ring.take(min(BURST, len(queue)))), [], 0)

    def _handle(self, mgr: UalinkManager, ring: _Ring, burst: deque[tuple[int, p.Message]],
                later: list[Effect], budget: int) -> None:
        """The ring's messages, in order: `burst`'s, then (in a link's call) more of the
        queue's, a burst at a time, while fewer than `budget` were handled in this call.
        A reply the ring awaits (HELLO_ACK, NPA_RSP) whose ACK has not come leaves the
        ring busy: this returns, and the call that brings the ACK goes on (_carry_on),
        with a new budget. Otherwise the ring is idle at the end (an empty queue), or its
        task is woken for the rest (the budget spent: a link's reader serves no long
        queue)."""
        while True:
            while burst:
                src, msg = burst.popleft()
                mgr.receive(src, msg)
                done: Completion[None] = Completion()
                self._effects(mgr, deque(), later, functools.partial(done.set_result, None))
                if not done.done:  # a reply's ACK is awaited before the next message
                    ring.busy = True
                    done.when_done(functools.partial(self._carry_on, mgr, ring, burst, later))
                    return
                budget -= 1
            self._start(mgr, later)
            later = []
            self._check_timer(mgr)
            queue = ring.queue
            if not queue and ring.waited:
                # One line per episode of a full ring, not one per message that waited.
                log.info("accel %d: receive ring (%d messages) was full; %d messages waited "
                         "for room (none dropped)", mgr.accel_id, self.ring_size,
                         ring.waited)
                ring.waited = 0
            if not queue or budget <= 0 or ring.closed:
                break
            burst = deque(ring.take(min(BURST, budget, len(queue))))
        if ring.busy:  # (a link's call: the ring is its task's again)
            ring.busy = False
            if ring.queue:
                ring.wake.set()
            elif not ring.closed:
                ring.idle = True

    def _carry_on(self, mgr: UalinkManager, ring: _Ring, burst: deque[tuple[int, p.Message]],
                  later: list[Effect], _: Completion[None]) -> None:
        """The reply the ring awaited is acknowledged (or failed), in the link's call that
        brings it: the ring goes on in this call, rather than wake its task (a scheduler
        turn, and a wait for one on a loaded machine: a HELLO fan-in's ring waited ~3 ms
        per HELLO), for the rest of its burst and at most BURST messages in all."""
        if ring.closed:
            return
        self._handle(mgr, ring, burst, later, BURST)

    def _receive_now(self, accel_id: int, src: int, msg: p.Message) -> None:
        """An idle ring's next message, handled in the caller's call as the ring would
        (on_message): its sends queued on their links in order, its waiters woken, and a
        reply the ring awaits sent now, the ring busy until its ACK, whose call goes on
        with what was queued meanwhile (`_handle`)."""
        mgr = self.host.by_accel_id(accel_id)
        assert mgr is not None  # (it has a ring: self._rings)
        ring = self._rings[accel_id]
        ring.idle = False
        ring.busy = True
        self._handle(mgr, ring, deque([(src, msg)]), [], 0)

    async def _timer_loop(self, mgr: UalinkManager) -> None:
        """aioquic's loop: sleep until the manager's next deadline (or until an earlier one
        is armed), then let it decide what the time means."""
        while True:
            deadline = mgr.get_timer()
            with trio.CancelScope(deadline=math.inf if deadline is None else deadline) as scope:
                self._timer_scopes[mgr.accel_id] = scope
                await trio.sleep_forever()
            mgr.handle_timer(trio.current_time())
            self._run_effects(mgr)

    def _check_timer(self, mgr: UalinkManager) -> None:
        """A deadline armed before the timer task's: its sleep ends then instead. Moving the
        scope's deadline wakes nobody (an import's NPA_REQ arms one, its NPA_RSP, often in
        the same read, disarms it: a wake-up each cost the importer a task step). A scope
        that already ended is harmless to move: its task reads get_timer() anew."""
        if not mgr.deadline_armed:  # none armed since get_timer() last ran: none sooner
            return
        deadline = mgr.get_timer()
        if deadline is None:
            return
        scope = self._timer_scopes.get(mgr.accel_id)
        if scope is not None and deadline < scope.deadline:
            scope.deadline = deadline

    # -- imports --------------------------------------------------------------------------------
    def wait_import(self, mgr: UalinkManager, flow: ImportFlow) -> Completion[DmaBuf]:
        """The import's outcome (§1.6 I6–I20), the manager's decision, delivered by callback
        in the call that brings its `Wake` (the link's, for an NPA_RSP handled at once): no
        task waits for it. Its canceller is the waiter's interruption (I10/I13): the
        manager drops the import and the completion ends with EINTR."""
        c: Completion[DmaBuf] = Completion()
        if flow.done:
            _deliver(flow, c)
            return c
        key = (mgr.accel_id, ImportDone(flow.node.handle_lo))
        self._imports[key] = (flow, c)

        def cancel() -> None:
            if self._imports.get(key, (None, None))[1] is not c:
                return  # (its Wake is being delivered: the outcome is on its way)
            del self._imports[key]
            mgr.import_cancelled(flow)
            self.drain()
            c.set_error(DrmError(errno.EINTR, "the import was interrupted"))

        c.on_cancel(cancel)
        return c

    # -- effects ------------------------------------------------------------------------------
    def _effects(self, mgr: UalinkManager, pending: deque[Effect], later: list[Effect],
                 then: Callable[[], None]) -> None:
        """The effects of one ring message, in order (the ring's, and one handled at once):
        a reply the ring waits for (HELLO_ACK, NPA_RSP) is sent after what `later` holds
        went out ahead of it, and the rest goes on in the call that brings its ACK (the
        link's); the others are added to `later`. `then()` once none is left."""
        while True:
            while pending:
                eff = pending.popleft()
                if self._ring_awaits(eff):
                    self._start(mgr, later)
                    later.clear()
                    self._send_one(mgr, eff, lambda: self._effects(mgr, pending, later, then))
                    return
                later.append(eff)
            if not mgr.outbox:  # (most messages, a RELEASE received, cause none)
                break
            pending.extend(mgr.take_effects())
        then()

    def _ring_awaits(self, eff: Effect) -> TypeGuard[Send]:
        """A send the ring awaits before its next message: a reply (HELLO_ACK, NPA_RSP)."""
        return isinstance(eff, Send) and isinstance(eff.tag, _RING_REPLIES)

    def _run_effects(self, mgr: UalinkManager) -> None:
        while effects := mgr.take_effects():
            self._start(mgr, effects)
        self._check_timer(mgr)

    def drain(self) -> None:
        """After a request (ioctl, close): start whatever the managers queued."""
        for mgr in self.host.managers:
            if mgr.outbox:  # (most requests, an export of an exported BO for one, queue none)
                self._start(mgr, mgr.take_effects())
            if mgr.deadline_armed:  # (most arm none either: no call)
                self._check_timer(mgr)

    def _start(self, mgr: UalinkManager, effects: list[Effect]) -> None:
        """Wake the waiters; queue the sends on their links now, in order (their places
        among this accel's sends fixed), one batch per destination whose ACKs one task
        awaits (a revoke of 2,000 BOs from 8 importers: 8 batches, not 16,000 tasks)."""
        batches: dict[int, list[Send]] = {}
        woken: list[tuple[ImportFlow, Completion[DmaBuf]]] = []
        inactive: list[Send] = []
        now: float | None = None
        for eff in effects:
            if isinstance(eff, Wake):
                waiter = self._imports.pop((mgr.accel_id, eff.key), None)
                if waiter is not None:
                    woken.append(waiter)
            elif isinstance(eff, Announce):
                if self._announce is not None:
                    self._announce(eff.accel, eff.incarnation)
            elif not mgr.send_due(eff, now := self._now() if now is None else now):
                continue  # (§13 N5: its importer went down; the manager dropped it)
            elif self._nursery is None:
                log.debug("agent not running: dropping %s", eff)
            elif mgr.accel_active:
                batches.setdefault(eff.dst, []).append(eff)
            else:
                inactive.append(eff)
        # A revoke's one NPA_REVOKE goes to each of its importers: encoded once, not once each.
        encoded: dict[int, p.Dwords] = {}
        sent: list[tuple[Completion[list[SendOutcome]], list[Send]]] = []
        for dst, sends in batches.items():
            messages = []
            for eff in sends:
                dwords = encoded.get(id(eff.msg))
                if dwords is None:
                    dwords = encoded[id(eff.msg)] = eff.msg.encode()
                messages.append(dwords)
            sent.append((self._send_batch(mgr.accel_id, dst, messages), sends))
        # Last, as an Event's waiter ran after them: a waiter's answer ends its ioctl in
        # this call, and that ioctl's after_request starts whatever its manager queued
        # meanwhile, which must leave after the sends above.
        for flow, c in woken:
            _deliver(flow, c)
        # The outcomes after all of that: one already known (a link down, §13 N4) is
        # reported now, and what the manager does about it leaves after the sends above.
        for outcomes, sends in sent:
            outcomes.when_done(functools.partial(self._batch_done, mgr, sends))
        for eff in inactive:
            self._send_one(mgr, eff, functools.partial(self._run_effects, mgr))

    def _send_one(self, mgr: UalinkManager, eff: Send, then: Callable[[], None]) -> None:
        """One message from `mgr`'s accel (§5.1), its outcome reported to the manager
        (`on_sent`) by callback, then `then()`: ESHUTDOWN at once when that accel is not
        ACTIVE (deactivated while the send was queued), else the link's. A send no longer
        due (§13 N5) is dropped, and `then()` runs."""
        now = self._now()
        if not mgr.send_due(eff, now):
            then()
            return
        if not mgr.accel_active:
            mgr.on_sent(eff, DrmError(errno.ESHUTDOWN, f"accel {mgr.accel_id} is not ACTIVE"),
                        now)
            then()
            return

        def acked(c: Completion[list[SendOutcome]]) -> None:
            ((err, when),) = c.result()
            mgr.on_sent(eff, err, when)
            then()

        self._send_batch(mgr.accel_id, eff.dst, [eff.msg.encode()]).when_done(acked)

    def _batch_done(self, mgr: UalinkManager, sends: list[Send],
                    c: Completion[list[SendOutcome]]) -> None:
        """Each send's outcome, with the time it was known (a wait it starts is counted
        from its ACK, as when each send reported on its own)."""
        for eff, (err, when) in zip(sends, c.result(), strict=True):
            mgr.on_sent(eff, err, when)
        self._run_effects(mgr)


class _Transfer:
    """A remote access larger than one request (UalinkAgent.remote_access): CHUNK-sized
    requests, IN_FLIGHT of them at a time, each answer issuing the next in the call that
    brings it; the Completion ends once every chunk is answered. A load's chunks land in
    one buffer of the whole length as they come, each at its offset (from the fabric's
    pipe when the payload is still there: PipedBytes.read_into), not gathered and joined
    at the end: one copy of the bytes on this side instead of three."""

    def __init__(self, request: RequestFn, accel_id: int, piece: RemotePiece, write: bool,
                 data: bytes | None) -> None:
        self._request, self._accel_id, self._piece = request, accel_id, piece
        self._write, self._data = write, data or b""
        length = piece.length
        self._spans = [(off, min(CHUNK, length - off)) for off in range(0, length, CHUNK)]
        # Each chunk's count (stored, or loaded into _buf at its offset), None if it failed.
        self._counts: list[int | None] = [None] * len(self._spans)
        self._buf = bytearray(0 if write else length)
        self._next = 0
        self._in_flight = 0
        self._left = len(self._spans)
        self._issuing = False
        self.done: Completion[Loaded | int] = Completion()

    def start(self) -> Completion[Loaded | int]:
        self._issue()
        return self.done

    def _issue(self) -> None:
        if self._issuing:  # (an answer that came at once: the loop below goes on)
            return
        self._issuing = True
        try:
            while self._next < len(self._spans) and self._in_flight < IN_FLIGHT:
                i = self._next
                self._next += 1
                self._in_flight += 1
                off, n = self._spans[i]
                arg: int | bytes = n if not self._write else self._data[off:off + n]
                c = self._request(self._accel_id, self._piece.exporter_accel,
                                  self._piece.npa_byte_address + off, arg)
                c.when_done(functools.partial(self._chunk_done, i))
        finally:
            self._issuing = False

    def _chunk_done(self, i: int, c: Completion[Loaded]) -> None:
        self._in_flight -= 1
        self._left -= 1
        off, n = self._spans[i]
        try:
            got = c.result()
            # (Never longer than asked: the session refuses such a DATA.)
            self._counts[i] = n if self._write else copy_into(
                got, memoryview(self._buf)[off:off + n])
        except DrmError:
            self._counts[i] = None
        except OSError as e:  # (the fabric's pipe gave less than it holds: a fault)
            log.warning("fabric: a loaded chunk at NPA %#x could not be read: %s",
                        self._piece.npa_byte_address + off, e)
            self._counts[i] = None
        if self._left:
            self._issue()
            return
        done = 0
        for (_, n), count in zip(self._spans, self._counts, strict=True):
            if count is None:
                break
            # A short answer (policy 10: the exporter faulted part-way) ends the count there:
            # later chunks would land at the wrong offsets.
            done += count
            if count < n:
                break
        if done == 0:
            self.done.set_error(DrmError(
                errno.EFAULT, f"GPU page fault at NPA {self._piece.npa_byte_address:#x}"))
        elif self._write:
            self.done.set_result(done)
        else:
            # (A fault's short result copies the bytes before it: rare, and the views
            # of _buf may still be alive.)
            buf = self._buf
            self.done.set_result(buf if done == len(buf) else buf[:done])
