"""The UALink agent: carries out the managers' effects over the fabric link (trio).

The managers are sans-IO; this is where their waits happen: HELLO_ACK and NPA_RSP waits
with the pod's response timeout (§1.6 I8–I14), revoke workers waiting for NPA_RELEASE
(§5.7), and one receive task per local accel that processes that accel's messages in
arrival order, awaiting the sends each one causes before the next (the soft IH ring, §5.1).
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio

from ..drm.errors import DrmError
from ..drm.file import DrmFile
from ..drm.gem import DmaBuf
from ..ualink import protocol as p
from ..ualink.manager import (
    ExportEntry,
    Send,
    StartRevoke,
    StartSetup,
    UalinkManager,
    Wake,
)
from ..ualink.peers import ConnState, NodeState

if TYPE_CHECKING:
    from ..amdgpu.vm import RemotePiece
    from ..node import NodeCore

log = logging.getLogger(__name__)

SendFn = Callable[[int, int, p.Dwords], Awaitable[None]]
# Queues the message at once (its order fixed); the awaitable waits for the ACK.
SendQueuedFn = Callable[[int, int, p.Dwords], Awaitable[None]]
# (src accel, dst accel, NPA byte address, length to load | bytes to store) -> loaded bytes
RequestFn = Callable[[int, int, int, "int | bytes"], Awaitable[bytes | bytearray]]
CHUNK = 1 << 20  # data-plane transfers are split into chunks this big ...
IN_FLIGHT = 4  # ... with this many outstanding at once per transfer
RING_SIZE = 1024  # messages queued per local accel; past it the link stops reading


class UalinkAgent:
    def __init__(self, core: NodeCore, send: SendFn, response_timeout: float,
                 request: RequestFn | None = None, ring_size: int = RING_SIZE,
                 send_queued: SendQueuedFn | None = None) -> None:
        self.core = core
        self._send_queued = send_queued
        self.ring_size = ring_size
        # accel -> times the link waited for room in its full ring since it last emptied
        self._ring_waits: dict[int, int] = {}
        self._send = send
        self._request = request
        self.timeout = response_timeout
        self._events: dict[tuple[object, ...], trio.Event] = {}
        self._nursery: trio.Nursery | None = None
        self._rx: dict[int, trio.MemorySendChannel[tuple[int, p.Message]]] = {}
        for mgr in core.managers.values():
            mgr.remote_import = self.import_remote
        core.after_request = self.drain
        if request is not None:
            core.remote_access = self.remote_access

    # -- data plane ------------------------------------------------------------------------
    def serve(self, src_accel: int, dst_accel: int, npa_byte_addr: int,
              length_or_data: int | bytes | bytearray) -> list[memoryview]:
        """An importer's LOAD/STORE at one of our accels' NPAs: the loaded bytes as views of
        the BO's memory (none for a STORE); DrmError(EFAULT) refuses it."""
        mgr = self.core.manager_by_accel(dst_accel)
        if mgr is None:
            raise DrmError(errno.EFAULT, f"accel {dst_accel} is not on this node")
        if isinstance(length_or_data, int):
            return mgr.serve_load(src_accel, npa_byte_addr, length_or_data)
        mgr.serve_store(src_accel, npa_byte_addr, length_or_data)
        return []

    async def remote_access(
        self, accel_id: int, piece: RemotePiece, write: bool, data: bytes | None = None
    ) -> bytes | bytearray | int:
        """A GPU load/store of an imported NPA BO: LOAD/STORE requests to the exporter, in
        chunks, several in flight. A store returns once the exporter applied it. If a chunk
        faults, the result stops before it (EFAULT when nothing was done, policy 10)."""
        assert self._request is not None
        length = piece.length
        if length <= CHUNK:  # one request: no tasks to spawn
            arg = length if not write else (data or b"")[:length]
            try:
                got = await self._request(accel_id, piece.exporter_accel,
                                          piece.npa_byte_address, arg)
            except DrmError as e:
                raise DrmError(errno.EFAULT, f"GPU page fault at NPA "
                                             f"{piece.npa_byte_address:#x}: {e.strerror}") from None
            return length if write else got
        spans = [(off, min(CHUNK, length - off)) for off in range(0, length, CHUNK)]
        results: list[bytes | bytearray | None] = [None] * len(spans)
        limiter = trio.CapacityLimiter(IN_FLIGHT)

        async def one(i: int, off: int, n: int) -> None:
            async with limiter:
                arg: int | bytes = n if not write else (data or b"")[off:off + n]
                try:
                    results[i] = await self._request(  # type: ignore[misc]  # asserted above
                        accel_id, piece.exporter_accel, piece.npa_byte_address + off, arg)
                except DrmError:
                    results[i] = None

        async with trio.open_nursery() as nursery:
            for i, (off, n) in enumerate(spans):
                nursery.start_soon(one, i, off, n)
        done = 0
        loaded = []
        for (_, n), r in zip(spans, results, strict=True):
            if r is None:
                break
            # A short answer (policy 10: the exporter faulted part-way) ends the count there:
            # later chunks would land at the wrong offsets.
            count = n if write else len(r)
            done += count
            loaded.append(r)
            if count < n:
                break
        if done == 0 and length:
            raise DrmError(errno.EFAULT, f"GPU page fault at NPA {piece.npa_byte_address:#x}")
        return done if write else b"".join(loaded)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for mgr in self.core.managers.values():
                tx, rx = trio.open_memory_channel[tuple[int, p.Message]](self.ring_size)
                self._rx[mgr.accel_id] = tx
                nursery.start_soon(self._receive_loop, mgr, rx)
            task_status.started()
            await trio.sleep_forever()

    # -- receiving -------------------------------------------------------------------------
    def on_message(self, src: int, dst: int, dwords: p.Dwords) -> Awaitable[None] | None:
        """Called by the link once it has acknowledged a message (§5.1), in arrival order.
        An acknowledged message is never dropped: when `dst`'s ring is full this returns
        what to await until it is queued, and the link reads nothing more from that peer
        meanwhile (back-pressure: TCP slows the sender down)."""
        tx = self._rx.get(dst)
        if tx is None:
            log.warning("message from accel %d for accel %d, which is not ours", src, dst)
            return None
        item = (src, p.decode_message(dwords))
        try:
            tx.send_nowait(item)
        except trio.WouldBlock:
            self._ring_waits[dst] = self._ring_waits.get(dst, 0) + 1
            return tx.send(item)
        return None

    async def _receive_loop(
        self, mgr: UalinkManager, rx: trio.MemoryReceiveChannel[tuple[int, p.Message]]
    ) -> None:
        async for src, msg in rx:
            mgr.receive(src, msg)
            await self._run_effects(mgr, inline=True)
            if rx.statistics().current_buffer_used == 0 and self._ring_waits.get(mgr.accel_id):
                # One line per episode of a full ring, not one per message that waited.
                log.info("accel %d: receive ring (%d messages) was full; %d messages waited "
                         "for room (none dropped)", mgr.accel_id, self.ring_size,
                         self._ring_waits.pop(mgr.accel_id))

    # -- effects ------------------------------------------------------------------------------
    async def _run_effects(self, mgr: UalinkManager, inline: bool) -> None:
        while effects := mgr.take_effects():
            for eff in effects:
                if isinstance(eff, Send) and inline:
                    if (eff.tag is None and self._send_queued is not None
                            and self._nursery is not None and mgr.accel_active):
                        # Nothing waits on its outcome (NPA_RELEASE, NPA_FAIL): queued now,
                        # in order, and the ring goes on while the ACK comes.
                        wait = self._send_queued(mgr.accel_id, eff.dst, eff.msg.encode())
                        self._nursery.start_soon(self._finish_send, mgr, eff, wait)
                    else:
                        await self._do_send(mgr, eff)
                else:
                    self._dispatch(mgr, eff)

    def drain(self) -> None:
        """After a request (ioctl, close): start whatever the managers queued."""
        for mgr in self.core.managers.values():
            for eff in mgr.take_effects():
                self._dispatch(mgr, eff)

    def _dispatch(self, mgr: UalinkManager, eff: object) -> None:
        if isinstance(eff, Wake):
            ev = self._events.pop((mgr.accel_id, *eff.key), None)
            if ev is not None:
                ev.set()
            return
        if self._nursery is None:
            log.debug("agent not running: dropping %s", eff)
            return
        if isinstance(eff, Send):
            self._nursery.start_soon(self._send_then_drain, mgr, eff)
        elif isinstance(eff, StartSetup):
            self._nursery.start_soon(self._background_setup, mgr, eff.remote)
        elif isinstance(eff, StartRevoke):
            self._nursery.start_soon(self._revoke_worker, mgr, eff.entry)

    async def _transmit(self, mgr: UalinkManager, dst: int, dwords: p.Dwords) -> None:
        """One message from `mgr`'s accel (§5.1): ESHUTDOWN once that accel is not ACTIVE
        (deactivated while the send was queued or waited for), else the link's send."""
        if not mgr.accel_active:
            raise DrmError(errno.ESHUTDOWN, f"accel {mgr.accel_id} is not ACTIVE")
        await self._send(mgr.accel_id, dst, dwords)

    async def _do_send(self, mgr: UalinkManager, eff: Send) -> None:
        err: DrmError | None = None
        try:
            await self._transmit(mgr, eff.dst, eff.msg.encode())
        except DrmError as e:
            err = e
        mgr.on_sent(eff, err)

    async def _finish_send(self, mgr: UalinkManager, eff: Send, wait: Awaitable[None]) -> None:
        err: DrmError | None = None
        try:
            await wait
        except DrmError as e:
            err = e
        mgr.on_sent(eff, err)
        await self._run_effects(mgr, inline=False)

    async def _send_then_drain(self, mgr: UalinkManager, eff: Send) -> None:
        await self._do_send(mgr, eff)
        await self._run_effects(mgr, inline=False)

    async def _wait_for(
        self, mgr: UalinkManager, key: tuple[object, ...], done: Callable[[], bool]
    ) -> bool:
        k = (mgr.accel_id, *key)
        try:
            with trio.move_on_after(self.timeout):
                while not done():
                    await self._events.setdefault(k, trio.Event()).wait()
                return True
            return done()
        finally:
            # A wait that ends without its Wake (timeout, cancellation) must not leave its
            # event behind: one per timed-out import would pile up for good.
            ev = self._events.get(k)
            if ev is not None and not ev.is_set() and not ev.statistics().tasks_waiting:
                del self._events[k]

    # -- flows ----------------------------------------------------------------------------------
    async def setup_connection(self, mgr: UalinkManager, remote: int) -> None:
        """§5.4 setup_connection (I8–I11)."""
        if not mgr.setup_connection(remote):
            return
        try:
            await self._transmit(mgr, remote, mgr.hello(remote).encode())
        except BaseException:
            mgr.setup_failed(remote)  # I9 (or interrupted while sending, as I10)
            raise
        try:
            established = await self._wait_for(
                mgr, ("hello", remote), lambda: mgr.conn(remote).state == ConnState.ESTABLISHED
            )
        except BaseException:
            mgr.setup_failed(remote)  # I10: interrupted → NOT_READY (not IN_PROGRESS for good)
            raise
        if not established:
            mgr.setup_failed(remote)  # I11: NOT_READY, no cleanup
            raise DrmError(errno.ETIMEDOUT, f"no HELLO_ACK from accel {remote}")

    async def _background_setup(self, mgr: UalinkManager, remote: int) -> None:
        try:
            await self.setup_connection(mgr, remote)
        except DrmError as e:
            log.info("accel %d: connection setup towards accel %d: %s", mgr.accel_id,
                     remote, e.strerror)

    async def import_remote(
        self, mgr: UalinkManager, file: DrmFile, handle_lo: int, handle_hi: int
    ) -> DmaBuf:
        """§1.6 I6–I20 for a handle whose exporter is on another node."""
        node = mgr.import_begin(handle_lo, handle_hi)
        try:
            await self.setup_connection(mgr, node.exporter)
            generation = mgr.conn(node.exporter).ready_generation()
            await self._transmit(mgr, node.exporter, mgr.npa_req(node).encode())  # I12
            answered = await self._wait_for(
                mgr, ("import", handle_lo), lambda: node.state != NodeState.NOT_READY
            )
            if not answered:  # I14: ETIMEDOUT and a connection reset
                mgr.import_timed_out(node, generation)
                raise DrmError(errno.ETIMEDOUT, f"no NPA_RSP from accel {node.exporter}")
            return mgr.import_finish(node)
        finally:
            mgr.import_abort(node)
            self.drain()

    async def _revoke_worker(self, mgr: UalinkManager, entry: ExportEntry) -> None:
        """§5.7 steps 6–9: wait (not interruptibly) for the releases, then finish."""
        assert entry.revoke is not None
        revoke = entry.revoke
        await self._wait_for(mgr, ("release", entry.handle_lo), lambda: not revoke.expected)
        mgr.revoke_finish(entry)
        self.drain()
