"""The GPU engines' edge (trio): one task per node that notices doorbell writes and runs the
user queues whose doorbell moved (issue 30 items 2-3).

Doorbells. A process's doorbell slice is a GTT BO that becomes a memfd when the client maps
it (amdgpu/memory.py `share()`): the client's doorbell stores land in pages the daemon reads
with pread. The task reads each slice that has an active queue (8 KiB) and compares every
queue's 8-byte slot with the value it last ran to, at a tick that backs off from
`MIN_INTERVAL` after a doorbell (or a run's end: a runtime rings again once it has seen its
work done) to `MAX_INTERVAL`; then a watch thread takes over, as AMD's
rocjitsu polls its doorbell memfd from a thread: C (fuse/doorbells.c) compares the watched
slots, through read-only mappings of the slices' memfds, every `WATCH_INTERVAL_NS` (2 ms;
4 ms after a second without a doorbell) without the GIL or a system call, and when a slot
moved the thread wakes the task, which scans and runs (a slice not shared as a memfd is
pread every `WATCH_MAX_INTERVAL`). With no queue waiting for a doorbell nothing polls: the
thread sleeps on an event until a scan hands it slots to watch (it woke 20 times a second
before: 0.13% of a CPU per idle daemon, a 64-node pod on one host idled at 8% of a CPU, 1.2%
since; `make bench-pod`'s idle figures). A trio wake-up costs
~0.2-0.4 ms of CPU on the test machine, a Python thread's ~0.1 ms (polling every 1 ms from
Python cost 2% of a CPU), the C poll's ~10 µs: an idle node with 8 idle queues measured
0.5-0.6% of one CPU (tests/integration/test_hsakmt_queues.py; 0.25-0.4% with the Python
thread's 50 ms back-off before, 0.6-0.9% polling every 2 ms), and a doorbell after a quiet
spell is seen within 4 ms (2 ms on average, 1 ms within a second of the last; up to 50 ms before),
and at once when the process starts a WAIT_EVENTS (QueueRegistry.waiting: ROCr waits right
after ringing).

Running. A queue's engine (amdgpu/sdma.py's ring, amdgpu/aql.py's processor) is a sans-IO
generator of requests (amdgpu/engine.py); each run is a task of its own, so a poll that
sleeps never holds up another queue. Every memory request goes through the process's GPU
VM with the same resolver as GPU loads and stores (amdgpu/access.py): local BOs, userptr
pages (the client's own memory through caller memory, awaited here, never on the FUSE
thread), imported NPA BOs (fabric loads/stores, a COPY moved in `COPY_CHUNK` pieces). A
fault is thrown into the engine as GpuFault: the queue stops in error, gpu_faults counts it
(the resolver's on_fault), the process is told as kfd_signal_vm_fault_event tells it, and
one log line names process, queue and ring offset; other queues and processes go on. A
queue error is reported (logged, traced, a fault told) at the step where its engine reaches
it, before the engine's own report goes to memory (an AQL queue's inactive signal, its
mailbox and interrupt; an SDMA ring's rptr write-back): the client that report wakes (ROCr's
queue-error handler) may destroy the queue, or exit, before the run returns. A
queue blocked on a poll is re-checked by its own run task, one read at a time at a delay
doubling to POLL_MAX_DELAY (a forever poll: ~3% of a CPU), until released or rung again.

Command submission. `run_in_file` runs any engine generator in a render file's GPU VM with
the same fulfilment (a RunTarget says where and what to report): AMDGPU_CS's SDMA IBs, as
each amdgpu device's `driver.cs.runner`, awaited by the CS ioctl's own task.
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

import trio

from .amdgpu.access import gpu_copy_local, gpu_load, gpu_store
from .amdgpu.aql import AQL_PACKET_SIZE, AqlQueue
from .amdgpu.cs import IbRun
from .amdgpu.driver import AmdgpuDriver
from .amdgpu.engine import (
    Atomic,
    Clock,
    Copy,
    EndReason,
    EngineRun,
    Executed,
    Fill,
    GpuFault,
    Interrupt,
    Read,
    Request,
    RunEnd,
    Sleep,
    Write,
    atomic_result,
    format_packet,
    gpu_clock_counter,
    packet_fields,
)
from .amdgpu.memory import BoMemory
from .amdgpu.sdma import JOB_TIMEOUT_NS, SdmaRing
from .amdgpu.vm import LocalPiece, RemotePiece
from .amdkfd import queues as kq
from .drm.completion import Completion
from .drm.errors import DrmError
from .drm.file import DrmFile
from .drm.loaded import Loaded, in_memory
from .engine_remote import PieceStore, RemoteCopier
from .fuse._fuse_ll import ffi as _ffi
from .fuse._fuse_ll import lib as _lib
from .fuse.procfd import open_pidfd
from .trace import ENGINE_ACCESSES_KEPT, EngineAccess

if TYPE_CHECKING:
    from .fuse.dataplane import DataPlane
    from .node import NodeCore

log = logging.getLogger(__name__)
T = TypeVar("T")

MIN_INTERVAL = 50e-6  # s: the tick right after a doorbell moved
POLL_MAX_DELAY = 0.010  # s: the slowest re-check of a queue blocked on a poll
MAX_INTERVAL = 0.002  # s: the slowest trio tick; past it, the watch thread takes over
# The C poll's period over mapped doorbell slices: 2 ms (a doorbell seen within 1 ms on
# average), 4 ms once a second has gone by without a doorbell (2 ms on average; each poll
# costs ~10 µs of CPU on a loaded machine, and an idle node must stay well under 1%).
WATCH_INTERVAL_NS = 2_000_000
WATCH_SLOW_AFTER_NS = 1_000_000_000
WATCH_SLOW_INTERVAL_NS = 4_000_000
WATCH_MAX_INTERVAL = 0.050  # s: the watch thread's slowest period over unmapped slices
DOORBELL_SLICE = kq.DOORBELL_PROCESS_SLICE
COPY_CHUNK = 4 << 20  # bytes a Copy / Fill moves per load + store
# s: the longest a run keeps the trio thread before letting other tasks in (local memory
# answers without suspending, so a ring of big copies or a huge COPY_LINEAR_RECT would
# otherwise hold the whole daemon until it ends)
RUN_SLICE = 0.005


PF_EXITING = 0x4  # include/linux/sched.h: the task is in do_exit


def process_exiting(pid: int) -> bool:
    """Whether `pid` is past the start of its exit (/proc/<pid>/stat: PF_EXITING in its
    flags, or a zombie). Its memory can be gone before its files are closed (exit_mm runs
    before exit_files): a fault an engine took then is the exit's, not the queue's — the
    kernel stops the queues at the mm's release (kfd_process_notifier_release) before any
    such fault could be reported. A pid that is not there: False."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return fields[0] in (b"Z", b"X") or bool(int(fields[6]) & PF_EXITING)
COPY_PIPELINE = 4  # a Copy's loads outstanding at once (COPY_PIPELINE * COPY_CHUNK buffered)


class _InTask:
    """gpu_load's and gpu_store's Spawn for an engine run, which awaits their answer in its
    own task: a coroutine they hand it (a userptr BO's pages; the fabric's, where it answers
    no other way) runs in that task when `value` awaits the answer, as the access's own
    coroutine did before an answer had one shape: no task and no wake-up added. One per
    access."""

    __slots__ = ("_todo", "_wake")

    def __init__(self) -> None:
        self._todo: list[tuple[Awaitable[Any], Completion[Any]]] = []
        self._wake: trio.Event | None = None

    def __call__(self, aw: Awaitable[T]) -> Completion[T]:
        c: Completion[T] = Completion()
        self._todo.append((aw, c))
        self._woken()  # (handed over by a callback while `value` waits)
        return c

    def _woken(self, _: object = None) -> None:
        if self._wake is not None:
            self._wake.set()

    async def value(self, answer: T | Completion[T]) -> T:
        if not isinstance(answer, Completion):
            return answer
        watched = False
        while not answer.done:
            if self._todo:
                aw, c = self._todo.pop(0)
                try:
                    got = await aw
                except Exception as e:
                    c.set_error(e)
                else:
                    c.set_result(got)
                continue
            # Another party ends it (the fabric's DATA), or its callback hands us a
            # coroutine (the piece after a remote one).
            wake = self._wake = trio.Event()
            if not watched:
                watched = True
                answer.when_done(self._woken)
            await wake.wait()
        return answer.result()


class QueueStopped(Exception):
    """The queue was destroyed (or its process went) while a run was under way."""


@dataclass(frozen=True, slots=True)
class RunTarget:
    """What one engine run works in and reports to: `vm_file()` is the render file whose
    GPU VM the requests go to and `alive()` checks the run is still wanted (both raise
    QueueStopped when its owner went); `interrupt` takes a TRAP's context id (the KFD's
    event path) and `executed` each packet done: None for an AMDGPU_CS IB, whose TRAP
    signals no KFD event; `reached` takes a queue error at the step its engine reached it
    (`_reached`)."""

    vm_file: Callable[[], DrmFile]
    alive: Callable[[], None]
    interrupt: Callable[[int], None] | None = None
    executed: Callable[[Executed], None] | None = None
    sleep: Callable[[int], Awaitable[None]] | None = None  # None: a Sleep waits its ns
    touch: Callable[[Request], None] | None = None  # while tracing: the memory a request touches
    reached: Callable[[RunEnd], None] | None = None


class GpuEngineEdge:
    """The node's doorbell watcher and queue runner. `run()` is the task; the KFD's queue
    registry tells it of queues made and destroyed."""

    def __init__(self, core: NodeCore, data_plane: DataPlane | None = None) -> None:
        self.core = core
        # Copies from imported memory through the C data plane (engine_remote.py), when
        # the node has one.
        self.remote_copier = None if data_plane is None else RemoteCopier(
            data_plane, lambda accel, piece, write, data: core.remote_access(
                accel, piece, write, data))
        self.kfd = core.kfd
        self._wake = trio.Event()
        self._running: set[kq.KfdQueue] = set()
        self._nursery: trio.Nursery | None = None
        self._atomics = trio.Lock()
        self.ticks = 0  # scans done, for tests of the idle cost
        self._ended = False  # a queue's run ended since the last scan (_loop's back-off)
        # While tracing: the memory each running queue's engine touched since its last
        # packet (`_touch`), for that packet's trace record.
        self._touched: dict[kq.KfdQueue, list[EngineAccess]] = {}
        self.poll_rechecks = 0  # re-runs of queues blocked on a poll (_recheck_poll)
        self.job_timeout = JOB_TIMEOUT_NS / 1e9  # s: the longest a CS job may run
        # set (and replaced) when a run ends having done work: what it wrote may release
        # another queue's poll (one engine's fence is another's dependency), re-checked then
        self._progress = trio.Event()
        # What the watch thread compares: per doorbell slice, its memory and the (slot,
        # last value) of each queue there that waits for a doorbell. Replaced whole by
        # each scan (the thread only reads the reference it took).
        self._watched: tuple[tuple[BoMemory, tuple[tuple[int, bytes], ...]], ...] = ()
        # The watch thread's view of the shared doorbell slices: read-only mappings made
        # here (trio thread) per watched memfd, retired when no longer watched and closed
        # by the thread (the only one that reads through them) once it holds a newer
        # snapshot; `_generation` counts snapshots (the C poll returns when it moves).
        self._maps: dict[BoMemory, mmap.mmap] = {}
        self._retired: list[mmap.mmap] = []
        self._generation = _ffi.new("uint64_t *")
        self._stop_flag = _ffi.new("int *")
        # Set with each new snapshot (and at the end): what the thread sleeps on while it
        # has nothing to poll, rather than waking on a timer.
        self._rewatch = threading.Event()
        self._all_running = False  # (the last scan's: every queue was in a run)
        self.kfd.queues.listeners.append(self._queue_changed)
        self.kfd.queues.updated.append(lambda q: self._wake.set())
        self.kfd.queues.waiting.append(self._waiting)
        # AMDGPU_CS's SDMA IBs run here too, in the submitting render file's GPU VM: with
        # no runner the render node refuses them (EINVAL, amdgpu/cs.py)
        for device in core.devices.values():
            if isinstance(device.driver, AmdgpuDriver):
                device.driver.cs.runner = self.run_in_file

    def _waiting(self, pid: int) -> None:
        """A process with queues started a WAIT_EVENTS: scan now (the doorbell it rang
        before waiting is seen at once instead of at the watch's next poll; a scan that
        finds nothing costs ~20-40 µs)."""
        self._wake.set()

    def _queue_changed(self, q: kq.KfdQueue, created: bool) -> None:
        # (a queue gone: the scan drops its slot, so the watch thread stops polling it)
        self._wake.set()
        if not created:
            self._touched.pop(q, None)
            q.processor = None

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        interval = MAX_INTERVAL
        stop = threading.Event()
        token = trio.lowlevel.current_trio_token()
        watch = threading.Thread(target=self._watch, args=(stop, token),
                                 name="ualinkd-doorbells", daemon=True)
        watch.start()
        try:
            await self._loop(interval, task_status)
        finally:
            stop.set()
            self._stop_flag[0] = 1
            self._rewatch.set()

    async def _loop(self, interval: float, task_status: trio.TaskStatus[None]) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            while True:
                self._wake = trio.Event()
                ended, self._ended = self._ended, False
                if self._scan() or ended:
                    # (a queue rung, or one that just went idle: a runtime rings again as
                    # soon as it has seen its work done, so look often for a while)
                    interval = MIN_INTERVAL
                else:
                    interval = min(interval * 2, MAX_INTERVAL)
                if not self.kfd.queues.pqms or self._all_running:
                    # no queue: nothing to watch until one is made; every queue in a run
                    # (one long SDMA copy): nothing until a run ends (its task rings again
                    # itself for a doorbell rung meanwhile) or a queue changes, each of
                    # which wakes us (the back-off's ticks cost the copy's CPU ~7 scans)
                    await self._wake.wait()
                    interval = MIN_INTERVAL
                else:
                    # past MAX_INTERVAL the watch thread wakes us when a doorbell moves (a
                    # poll's re-checks are its run task's own: _recheck_poll)
                    wait = float("inf") if interval >= MAX_INTERVAL else interval
                    with trio.move_on_after(wait):
                        await self._wake.wait()

    def _watch(self, stop: threading.Event, token: trio.lowlevel.TrioToken) -> None:
        """The watch thread: wake the trio task when a watched doorbell slot differs from
        what it last ran. Slices whose memfd the daemon maps (a client that rings a
        doorbell has mapped its slice, so it is shared) are polled by C every
        WATCH_INTERVAL_NS without the GIL or a system call (fuse/doorbells.c): a
        doorbell after a quiet spell is seen within about 1 ms for a few µs of CPU per
        poll; any other slice is read (pread) every WATCH_MAX_INTERVAL. It only hints:
        the trio task scans again and decides, so a slice freed under it costs one
        needless scan."""
        seen: object = None
        while not stop.is_set():
            # (cleared before the snapshot is read: one published after is never missed)
            self._rewatch.clear()
            watched, gen0 = self._watched, self._generation[0]
            for m in self._retired[:]:  # (the trio task no longer hands these out)
                self._retired.remove(m)
                m.close()
            if watched is seen or not watched:
                # woke the task for this snapshot, or nothing to watch (no queue, or none
                # waiting for a doorbell): no wake-up until the task publishes the next one
                self._rewatch.wait()
                continue
            moved = self._watch_once(watched, gen0)
            if moved:
                seen = watched
                try:
                    # (the event is looked up in the trio thread: the current one)
                    token.run_sync_soon(lambda: self._wake.set())
                except trio.RunFinishedError:
                    return

    def _watch_once(self, watched: tuple[tuple[BoMemory, tuple[tuple[int, bytes], ...]], ...],
                    gen0: int) -> bool:
        """One wait of the watch thread over a snapshot: True when a slot moved."""
        slots, lasts, buffers = [], [], []
        unmapped = []
        try:
            for memory, pairs in watched:
                m = self._maps.get(memory)
                if m is None:
                    unmapped.append((memory, pairs))
                    continue
                buf = _ffi.from_buffer(m)
                buffers.append(buf)
                for off, last in pairs:
                    slots.append(_ffi.cast("uint64_t *", buf + off))
                    lasts.append(int.from_bytes(last, "little"))
            r = _lib.ualinkd_doorbell_wait(
                _ffi.new("uint64_t *[]", slots), _ffi.new("uint64_t[]", lasts), len(slots),
                WATCH_INTERVAL_NS, WATCH_SLOW_AFTER_NS, WATCH_SLOW_INTERVAL_NS,
                int(WATCH_MAX_INTERVAL * 1e9) if unmapped else -1,
                self._stop_flag, self._generation, gen0)
        finally:
            for buf in buffers:
                _ffi.release(buf)
        if r >= 0:
            return True
        if r == -1:
            return False  # stopped, or a new snapshot
        for memory, pairs in unmapped:
            try:
                page = memory.read(0, DOORBELL_SLICE)
            except Exception:  # freed meanwhile: let the trio task look
                return True
            if any(page[off : off + 8] != last for off, last in pairs):
                return True
        return False

    # -- noticing doorbells --------------------------------------------------------------------
    def _scan(self) -> bool:
        """One tick: start a run for every active queue whose doorbell moved (a queue
        blocked on a poll is its run task's, still running). True when a doorbell moved."""
        self.ticks += 1
        busy = False
        all_running = True
        watched: list[tuple[BoMemory, tuple[tuple[int, bytes], ...]]] = []
        for pqm in list(self.kfd.queues.pqms.values()):
            proc = self.kfd.processes.get(pqm.pid)
            if proc is None:
                all_running = False
                continue
            slices: dict[int, bytes] = {}
            waiting: dict[int, list[tuple[int, bytes]]] = {}
            for q in list(pqm.queues.values()):
                if q in self._running:
                    continue
                all_running = False
                if q.state is not kq.KfdQueueState.ACTIVE:
                    continue
                page = slices.get(q.gpu_id)
                if page is None:
                    bo = proc.pdds[q.gpu_id].doorbell_bo
                    if bo is None:
                        continue
                    page = slices[q.gpu_id] = bo.memory.read(0, bo.size)
                value = int.from_bytes(page[q.doorbell_slot : q.doorbell_slot + 8], "little")
                if self._moved(q, value):
                    self._start(q, value)
                    busy = True
                else:
                    waiting.setdefault(q.gpu_id, []).append(
                        (q.doorbell_slot, value.to_bytes(8, "little")))
            for gpu_id, slots in waiting.items():
                bo = proc.pdds[gpu_id].doorbell_bo
                assert bo is not None  # (a slot of it was just read)
                watched.append((bo.memory, tuple(slots)))
        self._map_watched(watched)
        # Nothing watched before nor now (every queue running, e.g. one long copy): the
        # thread, parked on the last empty snapshot with no mapping to close, has nothing
        # new; waking it cost every scan two context switches and a GIL hand-over (on one
        # CPU, 5% of an SDMA copy's importer time).
        quiet = not watched and not self._watched and not self._retired
        self._watched = tuple(watched)
        self._generation[0] += 1
        if not quiet:
            self._rewatch.set()
        self._all_running = all_running and not busy
        return busy

    def _moved(self, q: kq.KfdQueue, value: int) -> bool:
        """Whether `value`, read from `q`'s doorbell slot, is a doorbell: it differs from
        what the queue last ran to (then counted, traced and taken as the new target)."""
        if value == q.last_doorbell:
            return False
        q.doorbells += 1
        self._trace_doorbell(q, value)
        q.last_doorbell = value
        return True

    def _rung_again(self, q: kq.KfdQueue) -> int | None:
        """`q`'s doorbell, if it moved while its run went on (and the queue is still active):
        the run's task goes on with it, as a scan would start it (QueueStopped when it was
        destroyed meanwhile)."""
        self._alive(q)
        proc = self.kfd.processes.get(q.pid)
        bo = proc.pdds[q.gpu_id].doorbell_bo if proc is not None else None
        if bo is None or q.state is not kq.KfdQueueState.ACTIVE:
            return None
        value = int.from_bytes(bo.memory.read(q.doorbell_slot, 8), "little")
        return value if self._moved(q, value) else None

    def _map_watched(self, watched: list[tuple[BoMemory, tuple[tuple[int, bytes], ...]]],
                     ) -> None:
        """A read-only mapping of each watched slice whose BO is shared (a memfd) for the
        watch thread's C poll; mappings no longer watched are retired for the thread to
        close."""
        keep = set()
        for memory, _ in watched:
            keep.add(memory)
            if memory not in self._maps and memory.memfd is not None:
                try:
                    self._maps[memory] = mmap.mmap(memory.memfd, memory.size,
                                                   mmap.MAP_SHARED, mmap.PROT_READ)
                except (OSError, ValueError):
                    pass  # (then read by pread)
        for memory in [m for m in self._maps if m not in keep]:
            self._retired.append(self._maps.pop(memory))

    def _start(self, q: kq.KfdQueue, doorbell: int) -> None:
        assert self._nursery is not None
        self._running.add(q)
        self._nursery.start_soon(self._run_queue, q, doorbell)

    # -- running a queue -------------------------------------------------------------------------
    async def _run_queue(self, q: kq.KfdQueue, doorbell: int) -> None:
        try:
            end = await self._drive(q, doorbell)
            end = await self._recheck_poll(q, doorbell, end)
            # Rung again while it ran (a runtime rings as soon as it has seen its fence,
            # often before the run has written its rptr back): on at once in this task,
            # not after the scan this task's end wakes (100-150 µs on a loaded machine).
            while (end.reason is EndReason.CAUGHT_UP
                   and (rung := self._rung_again(q)) is not None):
                doorbell = rung
                end = await self._drive(q, doorbell)
                end = await self._recheck_poll(q, doorbell, end)
        except QueueStopped:
            return  # (an error its engine reached before was reported then: _reached)
        except (ValueError, TypeError, ArithmeticError, IndexError) as e:
            # a ring the engine refuses (e.g. an AQL ring smaller than one packet), or an
            # engine bug on strange input: that queue's error, never the node's
            end = RunEnd(EndReason.ERROR, 0, f"the engine refused the queue: {e}")
        finally:
            self._running.discard(q)
            self._ended = True
            self._wake.set()  # look again at once: the doorbell may have moved meanwhile
        try:
            self._alive(q)  # destroyed meanwhile: nothing to keep of it
        except QueueStopped:
            return
        self._sync(q)
        # (a run that ends POLLING stopped re-checking because its doorbell moved: the
        # scan, woken above, runs the queue again and the poll is a young one again)
        if end.reason is EndReason.ERROR and q.error is None:  # (not reported at its step)
            self._report_error(q, end)
        self._touched.pop(q, None)  # (what the rptr write-back touched: no packet's)

    def _reached(self, q: kq.KfdQueue, end: RunEnd) -> None:
        """The error `q`'s engine holds after a step of its run, reported now: before the
        requests that report it to the client's memory (aql.py `_fail`: the inactive
        signal, whose value ROCr's handler sees, then its mailbox and interrupt; sdma.py:
        the rptr write-back) are fulfilled, since that client may destroy the queue or exit
        before the run returns. Once per error: the KFD queue keeps the one told. An engine
        that faults while telling its error (its inactive signal, or the rptr write-back,
        unmapped) holds a new one carrying that fault, told too: the process's memory
        events and gpu_faults hear of the fault as of any other."""
        if q.error is None or (end.fault is not None and end.error != q.error):
            self._report_error(q, end)

    def _report_error(self, q: kq.KfdQueue, end: RunEnd) -> None:
        if end.fault is not None and self._exiting(q):
            return  # its memory went first: the release that follows stops the queue
        self._queue_error(q, end)

    async def _recheck_poll(self, q: kq.KfdQueue, doorbell: int, end: RunEnd) -> RunEnd:
        """A queue blocked on a poll (ROCr's dependency poll waits on a signal, forever):
        its run task re-checks it itself, at a delay doubling from MIN_INTERVAL to
        POLL_MAX_DELAY (from MIN_INTERVAL again when the run stopped at another poll), until
        it is released or the doorbell moves (then the scan, woken as the task ends, runs
        the new work with the back-off reset). Each re-check is one
        wake-up and one poll read, no scan: a forever poll costs ~3% of a CPU. Another
        run's work (a queue's or a CS job's) re-checks it at once: an engine's fence
        releases another's poll without waiting for the back-off. While UPDATE_QUEUE has
        the queue inactive the task keeps waiting (at the same delays) without running it:
        the poll is re-checked once the queue is active again (the one place a blocked
        queue waits: the scan never runs a queue whose doorbell did not move)."""
        delay = MIN_INTERVAL
        while end.reason is EndReason.POLLING:
            progress = self._progress
            with trio.move_on_after(delay):
                await progress.wait()
            delay = MIN_INTERVAL if progress.is_set() else min(delay * 2, POLL_MAX_DELAY)
            self._alive(q)
            if q.state is not kq.KfdQueueState.ACTIVE:
                continue  # (UPDATE_QUEUE made it inactive: not run until it is again)
            proc = self.kfd.processes.get(q.pid)
            bo = proc.pdds[q.gpu_id].doorbell_bo if proc is not None else None
            if bo is None:
                raise QueueStopped
            value = int.from_bytes(bo.memory.read(q.doorbell_slot, 8), "little")
            if value != q.last_doorbell:
                break  # (the doorbell is the scan's to notice: it resets the back-off)
            self.poll_rechecks += 1
            offset, end = end.offset, await self._drive(q, doorbell)
            if end.offset != offset:  # it went on to another poll: a young one again
                delay = MIN_INTERVAL
        if end.reason is not EndReason.POLLING:
            self._progressed()
        return end

    def _progressed(self) -> None:
        self._progress.set()
        self._progress = trio.Event()

    def _processor(self, q: kq.KfdQueue) -> SdmaRing | AqlQueue | None:
        """The engine consuming the queue's ring, made on its first doorbell: an SDMA ring
        for the SDMA types, the AQL processor for COMPUTE_AQL; a PM4 compute queue has
        none (no PM4 command processor here: its doorbell is a queue error)."""
        if q.processor is None:
            if q.is_sdma:
                # one check per run: the edge spaces a failing poll's re-checks (POLLING,
                # back-off to POLL_MAX_DELAY), which the ring's own Sleeps between spins
                # would not (8 wake-ups of 10 µs each per re-check: 10-20% of a CPU)
                ring = SdmaRing(q.ring_base, q.ring_size, q.rptr_address, q.wptr_address,
                                poll_spins=1)
                ring.rptr = q.rptr  # 0 for a new queue; kept across UPDATE_QUEUE's new ring
                q.processor = ring
            elif q.type == kq.KFD_IOC_QUEUE_TYPE_COMPUTE_AQL:
                q.processor = AqlQueue(q.ring_base, q.ring_size, q.rptr_address,
                                       q.wptr_address)
        return q.processor

    @staticmethod
    def _sync(q: kq.KfdQueue) -> None:
        """What ualinkctl shows of the engine: the byte index consumed."""
        p = q.processor
        if isinstance(p, SdmaRing):
            q.rptr = p.rptr
        elif isinstance(p, AqlQueue):
            q.rptr = p.read_index * AQL_PACKET_SIZE

    def _exiting(self, q: kq.KfdQueue) -> bool:
        """Whether `q`'s process is exiting or gone: past the start of its exit, or its exact
        identity no longer there (reaped already, before the pidfd watch has ended its KFD
        context: the fault was the exit's all the same). A sans-IO identity never exits."""
        if process_exiting(q.pid):
            return True
        proc = self.kfd.processes.get(q.pid)
        if proc is None or proc.id.incarnation == 0:
            return False
        pidfd = open_pidfd(proc.id)
        if pidfd is None:
            return True
        os.close(pidfd)
        return False

    def _alive(self, q: kq.KfdQueue) -> None:
        pqm = self.kfd.queues.pqms.get(q.pid)
        if pqm is None or pqm.queues.get(q.queue_id) is not q:
            raise QueueStopped

    async def _drive(self, q: kq.KfdQueue, doorbell: int) -> RunEnd:
        engine = self._processor(q)
        if engine is None:
            return RunEnd(EndReason.ERROR, 0,
                          "a PM4 compute queue: no PM4 command processor runs here")
        gen = engine.run(doorbell)
        self._touched.pop(q, None)  # (a poll re-run re-reads: its packet starts afresh)
        return await self._drive_run(self._queue_target(q), gen, engine)

    def _queue_target(self, q: kq.KfdQueue) -> RunTarget:
        return RunTarget(partial(self._queue_file, q), partial(self._alive, q),
                         partial(self._queue_interrupt, q), partial(self._queue_executed, q),
                         touch=partial(self._touch, q), reached=partial(self._reached, q))

    async def run_in_file(self, drm_file: DrmFile, gen: EngineRun,
                          ib: IbRun | None = None) -> RunEnd:
        """Run an engine generator to its end in `drm_file`'s GPU VM (AMDGPU_CS's SDMA IBs:
        the device's `driver.cs.runner`), with the queues' fulfilment. Awaited by the CS
        ioctl's own task (drm/device.py runs an awaiting handler off the FUSE thread); a
        file closed meanwhile ends the run in error. A poll's Sleeps back off (doubling
        from MIN_INTERVAL to POLL_MAX_DELAY, the queues' re-check rate) and the run ends
        in error after `job_timeout` of real time, as the scheduler's job timeout ends a
        hung job (the engine's own budget counts the ns it asked for, which 1 µs sleeps
        would take minutes of CPU to add up). While tracing, each packet of `ib` is
        traced (core.trace_ib) with the memory it touched outside the IB, as a queue's."""
        def alive() -> None:
            if drm_file.closed:
                raise QueueStopped

        def vm_file() -> DrmFile:
            alive()
            return drm_file

        delay = MIN_INTERVAL

        async def sleep(ns: int) -> None:
            nonlocal delay
            await trio.sleep(max(ns / 1e9, delay))
            delay = min(delay * 2, POLL_MAX_DELAY)

        touched: list[EngineAccess] = []
        with trio.move_on_after(self.job_timeout) as cancel:
            try:
                end = await self._drive_run(self._ib_target(drm_file, vm_file, alive, sleep,
                                                            ib, touched), gen)
            except QueueStopped:
                end = RunEnd(EndReason.ERROR, 0, "the render file was closed")
            finally:
                self._progressed()
        if cancel.cancelled_caught:
            end = RunEnd(EndReason.ERROR, 0, f"timed out after {self.job_timeout:g} s "
                                             f"(the job timeout)")
        if not end.ok and ib is not None:  # (the IB's last record: why it stopped)
            self.core.trace_ib(drm_file, ib, "error", end.offset, end.error or "IB error",
                               *self._kept(touched))
        return end

    def _ib_target(self, drm_file: DrmFile, vm_file: Callable[[], DrmFile],
                   alive: Callable[[], None], sleep: Callable[[int], Awaitable[None]],
                   ib: IbRun | None, touched: list[EngineAccess]) -> RunTarget:
        """An IB's run target: with `ib`, its packets traced (while a tracer is attached)."""
        if ib is None:
            return RunTarget(vm_file, alive, sleep=sleep)

        def executed(req: Executed) -> None:
            if self.core.tracer is not None:
                self.core.trace_ib(drm_file, ib, "packet", req.ring_offset,
                                   format_packet(req.packet), *self._kept(touched),
                                   fields=packet_fields(req.packet))
            touched.clear()

        def touch(req: Request) -> None:  # (the IB's own words are its packets, not work)
            _note_touch(touched, req, lambda a: ib.va <= a.va < ib.va + ib.size)

        return RunTarget(vm_file, alive, executed=executed, sleep=sleep, touch=touch)

    async def _drive_run(self, q: RunTarget, gen: EngineRun,
                         engine: SdmaRing | AqlQueue | None = None) -> RunEnd:
        """Fulfil `gen`'s requests to its RunEnd; `engine`, a queue's, is looked at after
        each step for an error it reached (q.reached)."""
        answer: object = None
        fault: GpuFault | None = None
        yield_at = time.monotonic() + RUN_SLICE
        try:
            while True:
                if time.monotonic() >= yield_at:
                    await trio.lowlevel.checkpoint()
                    q.alive()
                    yield_at = time.monotonic() + RUN_SLICE
                try:
                    req = gen.send(answer) if fault is None else gen.throw(fault)
                except StopIteration as stop:
                    end = stop.value
                    assert isinstance(end, RunEnd)
                    return end
                finally:
                    if engine is not None and engine.error is not None and q.reached:
                        q.reached(engine.error)
                answer, fault = None, None
                q.alive()
                try:
                    answer = await self._fulfil(q, req)
                except GpuFault as f:
                    fault = f
                q.alive()
        finally:
            gen.close()

    # -- fulfilling requests against the process's GPU VM ------------------------------------
    def _queue_file(self, q: kq.KfdQueue) -> DrmFile:
        proc = self.kfd.processes.get(q.pid)
        drm_file = proc.pdds[q.gpu_id].drm_file if proc is not None else None
        if drm_file is None:
            raise QueueStopped
        return drm_file

    def _queue_interrupt(self, q: kq.KfdQueue, context_id: int) -> None:
        proc = self.kfd.processes.get(q.pid)
        if proc is not None:
            kq.event_interrupt(self.kfd, proc, context_id)

    def _queue_executed(self, q: kq.KfdQueue, req: Executed) -> None:
        q.packets += 1
        touched = self._touched.pop(q, [])
        if self.core.tracer is not None:  # strace-style: the packet as decoded
            self.core.trace_queue(q, "packet", req.ring_offset, format_packet(req.packet),
                                  *self._kept(touched), fields=packet_fields(req.packet))

    def _vm_file(self, q: RunTarget) -> tuple[DrmFile, AmdgpuDriver]:
        drm_file = q.vm_file()
        driver = drm_file.device.driver
        assert isinstance(driver, AmdgpuDriver)
        return drm_file, driver

    async def _load(self, q: RunTarget, va: int, size: int) -> bytes | bytearray:
        drm_file, driver = self._vm_file(q)
        here = _InTask()
        try:
            got: Loaded = await here.value(gpu_load(driver.vm(drm_file), va, size,
                                                    self.core._remote_for(drm_file),
                                                    driver.count_gpu_fault, here))
        except DrmError as e:
            raise GpuFault(va, False, e.strerror or "") from None
        data = in_memory(got)
        if len(data) < size:
            raise GpuFault(va + len(data), False)
        # (As it came: a remote copy's piece is a megabyte-sized bytearray no one else
        # holds, which a bytes() would copy once more for nothing.)
        return data

    async def _store(self, q: RunTarget, va: int, data: bytes | bytearray) -> None:
        drm_file, driver = self._vm_file(q)
        here = _InTask()
        try:
            n = await here.value(gpu_store(driver.vm(drm_file), va, data,
                                           self.core._remote_for(drm_file),
                                           driver.count_gpu_fault, here))
        except DrmError as e:
            raise GpuFault(va, True, e.strerror or "") from None
        assert isinstance(n, int)
        if n < len(data):
            raise GpuFault(va + n, True)

    async def _copy_local(self, q: RunTarget, req: Copy) -> bool:
        """A Copy between the process's own memory and a local BO, in one move (access.py
        gpu_copy_local); False when it is not one (then it goes in COPY_CHUNK pieces)."""
        drm_file, driver = self._vm_file(q)
        try:
            return await gpu_copy_local(driver.vm(drm_file), req.dst_va, req.src_va, req.size,
                                        driver.count_gpu_fault)
        except DrmError as e:  # (the process's memory closed under the copy)
            raise GpuFault(req.src_va, False, e.strerror or "") from None

    async def _copy_remote(self, q: RunTarget, req: Copy) -> bool:
        """A Copy from one imported NPA BO mapping to one local piece (a userptr BO, a BO of
        this node), through the C data plane (engine_remote.py); False when it is not one,
        or there is no data plane (then it goes in COPY_CHUNK pieces through the link). A
        tracer attached sees every access through Python, as its FUSE loads."""
        copier = self.remote_copier
        if copier is None or not copier.running or self.core.tracer is not None:
            return False
        drm_file, driver = self._vm_file(q)
        vm = driver.vm(drm_file)
        src, src_fault = vm.plan(req.src_va, req.size, write=False)
        if src_fault is not None or len(src) != 1 or type(s := src[0]) is not RemotePiece \
                or s.bo is None:
            return False
        dst, dst_fault = vm.plan(req.dst_va, req.size, write=True)
        if dst_fault is not None or len(dst) != 1 or type(d := dst[0]) is not LocalPiece:
            return False
        # Issued by the accel that holds the NPA BO, as node._remote_for's pieces are.
        src_accel = self.core.managers[s.bo.device.minor].accel_id
        try:
            loaded, stored = await copier.copy(src_accel, s, PieceStore(vm, req.dst_va, d))
        except DrmError as e:  # (the process's memory closed under the copy)
            raise GpuFault(req.dst_va, True, e.strerror or "") from None
        if loaded < req.size:  # policy 10: the link's fault (access._short), counted once
            driver.count_gpu_fault()
            raise GpuFault(req.src_va + loaded, False,
                           "" if loaded else f"GPU page fault at VA {req.src_va:#x}")
        if stored < req.size:
            driver.count_gpu_fault()
            raise GpuFault(req.dst_va + stored, True,
                           "" if stored else f"GPU page fault at VA {req.dst_va:#x}")
        return True

    async def _copy_pieces(self, q: RunTarget, req: Copy) -> None:
        """A Copy in COPY_CHUNK pieces, up to COPY_PIPELINE loads outstanding (a remote
        source's fabric round trips overlap one another and the stores), stored in order:
        a fault stops the copy where it would have piece by piece (the pieces before it
        stored, none after)."""
        offsets = range(0, req.size, COPY_CHUNK)
        loaded: dict[int, bytes | bytearray | Exception] = {}
        ready = [trio.Event() for _ in offsets]
        window = trio.Semaphore(COPY_PIPELINE)
        failed: Exception | None = None

        async def load(i: int, off: int) -> None:
            try:
                loaded[i] = await self._load(q, req.src_va + off,
                                             min(COPY_CHUNK, req.size - off))
            except Exception as e:  # (GpuFault, QueueStopped: raised in its turn)
                loaded[i] = e
            finally:
                ready[i].set()

        async def feed(nursery: trio.Nursery) -> None:
            for i, off in enumerate(offsets):
                await window.acquire()
                nursery.start_soon(load, i, off)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(feed, nursery)
            for i, off in enumerate(offsets):
                await ready[i].wait()
                data = loaded.pop(i)
                if isinstance(data, Exception):
                    failed = data
                    break
                try:
                    await self._store(q, req.dst_va + off, data)
                except Exception as e:  # (raised past the nursery, unwrapped)
                    failed = e
                    break
                window.release()
            nursery.cancel_scope.cancel()
        if failed is not None:
            raise failed

    async def _fulfil(self, q: RunTarget, req: Request) -> object:
        if q.touch is not None and self.core.tracer is not None:
            q.touch(req)
        if isinstance(req, Read):
            return await self._load(q, req.va, req.size)
        if isinstance(req, Write):
            await self._store(q, req.va, req.data)
            return None
        if isinstance(req, Copy):
            if not await self._copy_local(q, req) and not await self._copy_remote(q, req):
                await self._copy_pieces(q, req)
            return None
        if isinstance(req, Fill):
            pattern = (req.value & 0xFFFF_FFFF).to_bytes(4, "little")
            chunk = pattern * (min(COPY_CHUNK, req.size) // 4)
            for off in range(0, req.size, COPY_CHUNK):
                await self._store(q, req.dst_va + off, chunk[: min(COPY_CHUNK, req.size - off)])
            return None
        if isinstance(req, Atomic):
            # one read-modify-write: no other queue's atomic runs between the load and the
            # store, even when they wait for userptr pages or the fabric (the CPU's own
            # accesses are the client's; ROCr only decrements signals this way)
            async with self._atomics:
                old = int.from_bytes(await self._load(q, req.va, req.size), "little")
                new = atomic_result(req.op, old, req.src, req.cmp, req.size)
                await self._store(q, req.va, new.to_bytes(req.size, "little"))
            return old
        if isinstance(req, Interrupt):
            if q.interrupt is not None:
                q.interrupt(req.context_id)
            return None
        if isinstance(req, Clock):
            _, driver = self._vm_file(q)
            return gpu_clock_counter(time.monotonic_ns(), driver.profile.gpu_counter_freq_khz)
        if isinstance(req, Sleep):
            await (trio.sleep(req.ns / 1e9) if q.sleep is None else q.sleep(req.ns))
            return None
        if isinstance(req, Executed):
            if q.executed is not None:
                q.executed(req)
            return None
        raise AssertionError(f"unknown engine request {req!r}")

    # -- errors and tracing --------------------------------------------------------------------
    def _queue_error(self, q: kq.KfdQueue, end: RunEnd) -> None:
        """A queue error: the queue stops for good; one log line; a fault is reported to
        the process as kfd_signal_vm_fault_event reports a VM fault (its memory events)."""
        q.error = end.error or "queue error"
        log.warning("GPU queue error: pid %d queue %d (%s, gpu_id %#x) at ring offset %#x: %s",
                    q.pid, q.queue_id, q.type_name, q.gpu_id, end.offset, q.error)
        self.core.trace_queue(q, "error", end.offset, q.error,
                              *self._kept(self._touched.pop(q, [])))
        proc = self.kfd.processes.get(q.pid)
        if end.fault is not None and proc is not None:
            kq.vm_fault(self.kfd, proc, q.gpu_id, end.fault.va, end.fault.write)

    def _trace_doorbell(self, q: kq.KfdQueue, value: int) -> None:
        self.core.trace_queue(q, "doorbell", value)

    def _touch(self, q: kq.KfdQueue, req: Request) -> None:
        """Note the memory `req` touches for the packet being executed, less the queue's
        own ring and read/write pointers (consuming the ring, not the packet's work), each
        distinct access once (a poll re-reads its word)."""
        ring_end = q.ring_base + q.ring_size
        _note_touch(self._touched.setdefault(q, []), req, lambda a: (
            q.ring_base <= a.va < ring_end or a.va in (q.rptr_address, q.wptr_address)))

    @staticmethod
    def _kept(touched: list[EngineAccess]) -> tuple[tuple[EngineAccess, ...], bool]:
        return tuple(touched[:ENGINE_ACCESSES_KEPT]), len(touched) > ENGINE_ACCESSES_KEPT


def _note_touch(touched: list[EngineAccess], req: Request,
                skip: Callable[[EngineAccess], bool]) -> None:
    """Add what `req` touches to `touched`, less what `skip` says is the run's own (a
    queue's ring and pointers, an IB's words), each distinct access once (a poll re-reads
    its word), one past ENGINE_ACCESSES_KEPT at most (saying "truncated")."""
    if isinstance(req, Read):
        got = [EngineAccess("read", req.va, req.size)]
    elif isinstance(req, Write):
        got = [EngineAccess("write", req.va, len(req.data))]
    elif isinstance(req, Copy):
        got = [EngineAccess("read", req.src_va, req.size),
               EngineAccess("write", req.dst_va, req.size)]
    elif isinstance(req, Fill):
        got = [EngineAccess("write", req.dst_va, req.size)]
    elif isinstance(req, Atomic):
        got = [EngineAccess("atomic", req.va, req.size)]
    else:
        return
    for a in got:
        if skip(a) or a in touched:
            continue
        if len(touched) > ENGINE_ACCESSES_KEPT:
            break
        touched.append(a)
