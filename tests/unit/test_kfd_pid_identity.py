"""KFD contexts bound to the process, not its pid, and the KFD's caller-sized arrays capped
(issue 29 items 1, 3, 8, 11), sans-IO over a real NodeCore.

- kfd_create_process finds a process by its mm, kfd_ioctl compares lead_thread tasks and
  kfd_process_notifier_release ends a kfd_process when its process exits, whoever holds its
  files: a later process given the same pid never gets the context (item 1).
- kfd_wait_on_events: alloc_event_waiters' kmalloc_array fails past 74,898 waiters with
  ENOMEM; the entries are copied and initialized one at a time, so the first unknown id ends
  the call (item 3).
- kfd_ioctl_(un)map_memory_to/from_gpu: kmalloc_array of n_devices u32s, ENOMEM past
  KMALLOC_MAX_SIZE (item 8).
- amdgpu_amdkfd_gpuvm_acquire_process_vm: a VM already a compute VM is EINVAL (item 11).
"""

from __future__ import annotations

import errno
import struct
import time
from collections import Counter

import trio
import ualink_testkit as kit
from hypothesis import given, settings
from hypothesis import strategies as hs
from test_kfd_event_waiters import run_waiters
from test_kfd_rules import (
    CALLER,
    UserArrays,
    alloc,
    call,
    create,
    event_node,
    memory_node,
    wait_args,
)

from ualinkd.abi import ioctls as tbl
from ualinkd.abi import structs as st
from ualinkd.amdkfd import chardev
from ualinkd.config import PodConfig
from ualinkd.daemon import TrioSyncWaits
from ualinkd.drm.completion import Completion
from ualinkd.drm.device import Caller
from ualinkd.drm.errors import DrmError
from ualinkd.drm.process import ProcessId
from ualinkd.node import NodeCore, NodeServices

VRAM_RW = chardev.ALLOC_MEM_FLAGS_VRAM | chardev.ALLOC_MEM_FLAGS_WRITABLE
FAIL = chardev.KFD_IOC_WAIT_RESULT_FAIL
COMPLETE, TIMEOUT = chardev.KFD_IOC_WAIT_RESULT_COMPLETE, chardev.KFD_IOC_WAIT_RESULT_TIMEOUT


class Processes:
    """The edge's view of processes, played by the test: which process each thread id
    belongs to now, and the exit notices handed out (drm/process.py's Identify and
    WatchExit)."""

    def __init__(self) -> None:
        self.now: dict[int, ProcessId] = {}
        self.notices: dict[ProcessId, Completion[None]] = {}
        self.cancelled: list[ProcessId] = []

    def identify(self, tid: int) -> ProcessId | None:
        return self.now.get(tid)

    def watch(self, process: ProcessId) -> Completion[None]:
        notice: Completion[None] = Completion()

        def cancel() -> None:
            self.cancelled.append(process)
            notice.set_error(DrmError(errno.ECANCELED))

        notice.on_cancel(cancel)
        self.notices[process] = notice
        return notice

    def exit(self, process: ProcessId) -> None:
        """The process exits; its pid may go to another."""
        self.notices.pop(process).set_result(None)
        if self.now.get(process.pid) == process:
            del self.now[process.pid]


def identity_node(fds: dict[int, object]) -> tuple[NodeCore, Processes, UserArrays]:
    procs = Processes()
    mem = UserArrays()
    config = PodConfig.local(1, 1)

    async def resolve(process: ProcessId, fd: int):
        f = fds.get((process.pid, process.incarnation, fd))  # the fd in *that* process
        if f is None:
            raise DrmError(errno.EINVAL)
        return f

    node = NodeCore(config, config.nodes[0].name, NodeServices(clock=lambda: (0, 0),
                    copy_to_user=mem.copy_to_user, copy_from_user=mem.copy_from_user,
                    resolve_drm_file=resolve, host_cpus=1, host_memory=1 << 34,
                    waits=TrioSyncWaits(), identify_process=procs.identify,
                    watch_exit=procs.watch, spawn=kit.lazy_spawn))
    return node, procs, mem


def owned_context(pid: int = 777, incarnation: int = 1):
    """A process that opened the kfd, acquired its VM, allocated VRAM (with a secret) and
    made a signal event."""
    fds: dict[object, object] = {}
    node, procs, mem = identity_node(fds)  # type: ignore[arg-type]
    owner = ProcessId(pid, incarnation)
    procs.now[pid] = owner
    device = next(iter(node.devices.values()))
    render = device.open(pid, 0)
    fds[(pid, incarnation, 5)] = render
    p = node.open_kfd(Caller(pid=pid, uid=0))
    gpu = next(iter(p.pdds))
    assert call(node, p, tbl.KFD_ACQUIRE_VM.cmd, struct.pack("<II", 5, gpu)).result == 0
    rc, a = alloc(node, p, gpu, VRAM_RW)
    assert rc == 0
    bo = p.pdds[gpu].mems[a.handle & 0xFFFFFFFF].bo
    bo.memory.write(0, b"root's secret")
    assert create(node, p)[0] == 0
    return node, procs, fds, p, gpu, a.handle, render


def test_a_later_process_with_the_pid_gets_a_context_of_its_own():
    """Issue 29 item 1: root's process opens the kfd, allocates VRAM, and exits while a
    child still holds the file; a process of another uid given the same pid opens the kfd:
    a fresh context (no allocation, no events, no VM), so EXPORT_DMABUF of root's handle is
    EINVAL; root's context has ended (its GEM handle gone); the held file answers nobody
    (EBADF), and the newcomer's mmap reaches its own doorbells, not root's."""
    node, procs, fds, old, gpu, handle, render = owned_context()
    old_doorbells = node.kfd.mmap_target(Caller(pid=777, uid=0),
                                         chardev.KFD_MMAP_TYPE_DOORBELL
                                         | chardev.kfd_mmap_gpu_id(gpu),
                                         chardev.DOORBELL_PROCESS_SLICE)[0]
    procs.now[777] = ProcessId(777, 2)  # pid 777 reused; the exit notice not in yet
    nobody = Caller(pid=777, uid=65534)
    new = node.open_kfd(nobody)
    assert new is not old and old.ended and node.kfd.processes == {777: new}
    assert not new.events and all(not pdd.mems and pdd.drm_file is None
                                  for pdd in new.pdds.values())
    res = node.kfd.ioctl(new, tbl.KFD_EXPORT_DMABUF.cmd,
                         struct.pack("<QII", handle, 0, 0), nobody)
    assert res.result == -errno.EINVAL
    assert not render.handles  # root's allocation went with its context
    res = node.kfd.ioctl(old, tbl.KFD_GET_VERSION.cmd, b"", nobody)
    assert (res.result, res.out) == (-errno.EBADF, b"")
    mine = node.kfd.mmap_target(nobody, chardev.KFD_MMAP_TYPE_DOORBELL
                                | chardev.kfd_mmap_gpu_id(gpu),
                                chardev.DOORBELL_PROCESS_SLICE)[0]
    assert mine is not old_doorbells
    try:
        node.kfd.mmap_target(nobody, chardev.KFD_MMAP_TYPE_EVENTS, 4096)
        raise AssertionError("the events page of another process")
    except DrmError as e:
        assert e.errno == errno.EINVAL
    assert procs.cancelled == [ProcessId(777, 1)]  # no late notice to come
    node.release_kfd(old)  # the child closes root's file at last
    assert node.kfd.processes == {777: new} and not new.ended


def test_process_exit_ends_the_context_whoever_holds_its_file():
    """kfd_process_notifier_release: the exit of the process ends its context at once, its
    file still open in a child: allocations and their GEM handles, the VM binding, events,
    doorbell pages all go; the file's later release is harmless, and the exit watch is not
    cancelled twice."""
    node, procs, fds, p, gpu, handle, render = owned_context()
    pdd = p.pdds[gpu]
    doorbells = pdd.doorbells()
    assert doorbells.refcount == 1
    procs.exit(ProcessId(777, 1))
    assert p.ended and node.kfd.processes == {} and not node.kfd.compute_vms
    assert not pdd.mems and pdd.drm_file is None and not p.events
    assert not render.handles and pdd.doorbell_bo is None and doorbells.refcount == 0
    assert procs.cancelled == []
    node.release_kfd(p)
    assert procs.cancelled == []


def test_the_last_close_ends_the_context_and_stops_watching():
    """kfd_release of the last file: the context ends (the same release as an exit), and
    the process is no longer watched; a second open after that is a new context."""
    node, procs, fds, p, gpu, handle, render = owned_context()
    node.release_kfd(p)
    assert p.ended and procs.cancelled == [ProcessId(777, 1)] and not render.handles
    again = node.open_kfd(Caller(pid=777, uid=0))
    assert again is not p and not again.ended


def test_acquire_vm_of_another_processes_compute_vm_is_einval():
    """Issue 29 item 11: a render file whose VM one KFD process acquired is refused to
    another (EINVAL, "already a compute VM"); the same process asking again is 0; once the
    first context ends, the file's VM is free again."""
    node, procs, fds, p, gpu, handle, render = owned_context()
    other = ProcessId(888, 1)
    procs.now[888] = other
    fds[(888, 1, 9)] = render  # the render file passed to another process (SCM_RIGHTS)
    q = node.open_kfd(Caller(pid=888, uid=0))
    acquire = struct.pack("<II", 9, gpu)
    assert call(node, q, tbl.KFD_ACQUIRE_VM.cmd, acquire).result == -errno.EINVAL
    assert call(node, p, tbl.KFD_ACQUIRE_VM.cmd, struct.pack("<II", 5, gpu)).result == 0
    node.release_kfd(p)
    assert call(node, q, tbl.KFD_ACQUIRE_VM.cmd, acquire).result == 0


def test_acquire_vm_looks_the_fd_up_in_the_bound_process():
    """ACQUIRE_VM's fd is resolved in the process the context is bound to (its identity,
    not a pid that may have changed hands)."""
    seen: list[ProcessId] = []
    node, p, *_ = memory_node(1)
    resolve = node.kfd.resolve_drm_file

    async def spy(process: ProcessId, fd: int):
        seen.append(process)
        assert resolve is not None
        return await resolve(process, fd)

    node.kfd.resolve_drm_file = spy
    call(node, p, tbl.KFD_ACQUIRE_VM.cmd, struct.pack("<II", 10, next(iter(p.pdds))))
    assert seen == [p.id]


# -- WAIT_EVENTS (item 3) -------------------------------------------------------------------


class Prefix(UserArrays):
    """Caller memory of which only the first `readable` bytes of each array can be read;
    counts the reads."""

    def __init__(self, readable: int) -> None:
        super().__init__()
        self.readable = readable
        self.reads = 0

    async def copy_from_user(self, pid: int, address: int, size: int) -> bytes:
        self.reads += 1
        if size > self.readable:
            raise DrmError(errno.EFAULT)
        return await super().copy_from_user(pid, address, size)


def wait_result(res) -> int:
    return struct.unpack("<QIIII", res.out)[4]


def test_wait_events_past_the_waiters_allocation_is_enomem_with_nothing_read():
    """alloc_event_waiters: kmalloc_array of 56-byte waiters fails past KMALLOC_MAX_SIZE
    (4 MiB), so 74,899 events are ENOMEM before any entry is read, wait_result FAIL; the
    issue's 250k and 1M likewise."""
    assert chardev.MAX_WAIT_EVENTS == 74_898
    node, p, _ = event_node()
    mem = Prefix(1 << 40)
    node.kfd.copy_from_user = mem.copy_from_user
    for n in (chardev.MAX_WAIT_EVENTS + 1, 250_000, 1_000_000, 0xFFFFFFFF):
        res = call(node, p, tbl.KFD_WAIT_EVENTS.cmd, struct.pack("<QIIII", 0x500, n, 0, 0, 0))
        assert (res.result, wait_result(res)) == (-errno.ENOMEM, FAIL)
    assert mem.reads == 0


def test_wait_events_stops_at_the_first_unknown_id_before_a_later_fault():
    """kfd_wait_on_events copies and initializes entry by entry: an unknown id ends the call
    with EINVAL even when later entries cannot be read, and the entries before it were
    initialized (an auto-reset event signaled before is consumed); a fault after readable
    entries is EFAULT with those initialized too; wait_result FAIL either way."""
    node, p, _ = event_node()
    size = st.KFD_EVENT_DATA_SIZE
    for _ in range(2):
        assert create(node, p)[0] == 0
    for ids, readable, errno_ in (([0, 0, 999, 1], 3 * size, errno.EINVAL),
                                  ([1, 0, 1], 2 * size, errno.EFAULT)):
        mem = Prefix(readable)
        node.kfd.copy_from_user = mem.copy_from_user
        assert call(node, p, tbl.KFD_SET_EVENT.cmd, struct.pack("<II", 0, 0)).result == 0
        res = call(node, p, tbl.KFD_WAIT_EVENTS.cmd, wait_args(mem, ids, timeout=0))
        assert (res.result, wait_result(res)) == (-errno_, FAIL)
        assert not p.events[0].signaled  # taken by the entry before the failure
        assert all(not ev.waiters for ev in p.events.values())


def test_a_wait_of_75k_entries_is_one_waiter_and_quick():
    """74,898 entries naming one unsignaled event: one waiter in the event's queue (the
    kernel's 74,898 behave alike), wait_for_all completed by one SET_EVENT, and the queue
    empty afterwards; the whole call well under a second (it froze the node for seconds
    with a waiter object per entry and list.remove)."""
    node, p, mem = event_node()
    assert create(node, p, auto_reset=1)[0] == 0
    n = chardev.MAX_WAIT_EVENTS
    args = wait_args(mem, [0] * n, ptr=0x500, all_=1, timeout=chardev.KFD_EVENT_TIMEOUT_INFINITE)
    node.kfd.waits = TrioSyncWaits(lambda: int(trio.current_time() * 1e9))
    queue_sizes: list[int] = []

    async def actions(set_event, out) -> None:
        queue_sizes.append(len(p.events[0].waiters))
        set_event(0)

    start = time.perf_counter()
    assert run_waiters(node, p, [args], actions) == [(0, COMPLETE)]
    assert time.perf_counter() - start < 1.5
    assert queue_sizes == [1] and not p.events[0].waiters
    assert not p.events[0].signaled  # consumed by the waiters it woke


def test_wait_for_all_counts_every_entry_and_destroy_fails_queued_ones():
    """test_event_condition over entries: wait_for_all of {0 x 3, 1} completes only when 1
    is set too; an event destroyed under queued entries fails the wait (EIO), while entries
    of a signaled manual-reset event never queued."""
    node, p, mem = event_node()
    assert create(node, p)[0] == 0 and create(node, p)[0] == 0
    node.kfd.waits = TrioSyncWaits(lambda: int(trio.current_time() * 1e9))
    args = wait_args(mem, [0, 0, 0, 1], ptr=0x500, all_=1,
                     timeout=chardev.KFD_EVENT_TIMEOUT_INFINITE)

    async def both(set_event, out) -> None:
        set_event(0)
        await trio.sleep(1)
        assert out[0] is None
        set_event(1)

    assert run_waiters(node, p, [args], both) == [(0, COMPLETE)]
    caller = Caller(pid=p.pid, uid=0)

    async def destroy(set_event, out) -> None:
        node.kfd.ioctl(p, tbl.KFD_DESTROY_EVENT.cmd, struct.pack("<II", 1, 0), caller)

    args = wait_args(mem, [0, 1], ptr=0x600, all_=1, timeout=chardev.KFD_EVENT_TIMEOUT_INFINITE)
    assert run_waiters(node, p, [args], destroy) == [(-errno.EIO, FAIL)]


def test_an_interrupted_wait_gives_back_the_auto_reset_signal_it_took():
    """free_waiters(undo_auto_reset) on -ERESTARTSYS: a wait cancelled by a signal (FUSE
    INTERRUPT) sets again the auto-reset events its waiters had consumed."""
    node, p, mem = event_node()
    assert create(node, p)[0] == 0 and create(node, p)[0] == 0
    node.kfd.waits = TrioSyncWaits(lambda: int(trio.current_time() * 1e9))
    call(node, p, tbl.KFD_SET_EVENT.cmd, struct.pack("<II", 0, 0))
    args = wait_args(mem, [0, 1], ptr=0x500, all_=1, timeout=chardev.KFD_EVENT_TIMEOUT_INFINITE)

    async def main() -> None:
        with trio.move_on_after(1):
            await kit.answer(node.kfd.ioctl(p, tbl.KFD_WAIT_EVENTS.cmd, args,
                                            Caller(pid=p.pid, uid=0)))

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert p.events[0].signaled and not p.events[0].waiters and not p.events[1].waiters


# -- MAP / UNMAP device arrays (item 8) ----------------------------------------------------


def map_args(handle: int, n: int, n_success: int = 0, ptr: int = 0x900) -> bytes:
    return struct.pack("<QQII", handle, ptr, n, n_success)


def n_success(res) -> int:
    return struct.unpack("<QQII", res.out)[3]


def test_device_arrays_past_kmalloc_max_are_enomem_with_nothing_read():
    """kfd_ioctl_(un)map_memory_to/from_gpu: kmalloc_array(n_devices, 4) fails past
    1,048,576 entries: ENOMEM before the array is read (the issue's 16M grew the daemon by
    156 MiB); n_devices 0 or n_success > n_devices stay EINVAL first."""
    node, p, (g0,), _, _ = memory_node(1)
    rc, a = alloc(node, p, g0, VRAM_RW)
    mem = Prefix(1 << 40)
    node.kfd.copy_from_user = mem.copy_from_user
    for spec in (tbl.KFD_MAP_MEMORY_TO_GPU, tbl.KFD_UNMAP_MEMORY_FROM_GPU):
        for n in (chardev.MAX_DEVICE_IDS + 1, 16 << 20, 0xFFFFFFFF):
            assert call(node, p, spec.cmd, map_args(a.handle, n)).result == -errno.ENOMEM
        assert call(node, p, spec.cmd, map_args(a.handle, 0)).result == -errno.EINVAL
        res = call(node, p, spec.cmd, map_args(a.handle, 2, 3))
        assert res.result == -errno.EINVAL
    assert mem.reads == 0


def test_a_million_device_ids_map_quickly_and_duplicates_follow_the_kernel():
    """1,048,576 copies of one gpu_id (the most kmalloc_array allows): mapped once,
    n_success = n_devices, quickly; unmap of [g, g] fails on the second (no longer mapped:
    EINVAL, n_success 1); map of [g, bogus, ...] stops at the bogus one (EINVAL,
    n_success 1)."""
    node, p, (g0,), _, mem = memory_node(1)
    rc, a = alloc(node, p, g0, VRAM_RW)
    n = chardev.MAX_DEVICE_IDS
    mem.arrays[0x900] = struct.pack("<I", g0) * n
    start = time.perf_counter()
    res = call(node, p, tbl.KFD_MAP_MEMORY_TO_GPU.cmd, map_args(a.handle, n))
    assert (res.result, n_success(res)) == (0, n)
    assert time.perf_counter() - start < 1.5
    mem.arrays[0xA00] = struct.pack("<II", g0, g0)
    res = call(node, p, tbl.KFD_UNMAP_MEMORY_FROM_GPU.cmd, map_args(a.handle, 2, ptr=0xA00))
    assert (res.result, n_success(res)) == (-errno.EINVAL, 1)
    mem.arrays[0xB00] = struct.pack("<III", g0, 0xBAD, g0)
    res = call(node, p, tbl.KFD_MAP_MEMORY_TO_GPU.cmd, map_args(a.handle, 3, ptr=0xB00))
    assert (res.result, n_success(res)) == (-errno.EINVAL, 1)
    res = call(node, p, tbl.KFD_UNMAP_MEMORY_FROM_GPU.cmd,
               map_args(a.handle, 3, 2, ptr=0xB00))  # from n_success on: [g0]
    assert (res.result, n_success(res)) == (0, 3)
    assert CALLER.pid == p.pid


# -- the waiters kept as counts behave as the kernel's one waiter per entry ------------------

class KernelWaiters:
    """kfd_events.c with one kfd_event_waiter per entry, as a reference: init_event_waiter,
    set_event, destroy_event, test_event_condition."""

    def __init__(self, events: list[tuple[bool, bool]], entries: list[int]) -> None:
        self.auto = [a for a, _ in events]
        self.signaled = [s for _, s in events]
        self.alive = [True] * len(events)
        self.queue: list[list[dict[str, object]]] = [[] for _ in events]
        self.waiters: list[dict[str, object]] = []
        for eid in entries:
            w: dict[str, object] = {"event": eid, "activated": self.signaled[eid]}
            self.signaled[eid] = self.signaled[eid] and not self.auto[eid]
            if not w["activated"]:
                self.queue[eid].append(w)
            self.waiters.append(w)

    def set(self, eid: int) -> None:
        self.signaled[eid] = not self.auto[eid] or not self.queue[eid]
        for w in self.queue[eid]:
            w["activated"] = True

    def destroy(self, eid: int) -> None:
        for w in self.queue[eid]:
            w["event"] = None
        self.queue[eid] = []
        self.alive[eid] = False

    def condition(self, all_: bool) -> int:
        if any(w["event"] is None for w in self.waiters):
            return FAIL
        done = (all if all_ else any)(w["activated"] for w in self.waiters)
        return COMPLETE if done else TIMEOUT


@settings(max_examples=300, deadline=None)
@given(events=hs.lists(hs.tuples(hs.booleans(), hs.booleans()), min_size=1, max_size=4),
       data=hs.data())
def test_waiters_kept_as_counts_match_one_waiter_per_entry(events, data):
    """KfdWait / KfdEventWaiter (one per wait and event, with counts) against the kernel's
    per-entry waiters: after init and after every SET_EVENT or destroy, the same condition
    (all and any) and the same signaled state of every event."""
    n = len(events)
    entries = data.draw(hs.lists(hs.integers(0, n - 1), max_size=12))
    ops = data.draw(hs.lists(hs.tuples(hs.sampled_from(["set", "destroy"]),
                                       hs.integers(0, n - 1)), max_size=8))
    ref = KernelWaiters(events, entries)
    kfd = chardev.Kfd([], lambda: (0, 0))
    p = chardev.KfdProcess(ProcessId(1, 0))
    evs = [chardev.KfdEvent(i, chardev.KFD_IOC_EVENT_SIGNAL, auto, signaled)
           for i, (auto, signaled) in enumerate(events)]
    p.events = {e.event_id: e for e in evs}
    wait = chardev.KfdWait()
    for eid, count in Counter(entries).items():
        kfd._init_waiters(wait, evs[eid], count)

    def same() -> None:
        for all_ in (True, False):
            assert wait.condition(all_) == ref.condition(all_)
        assert [e.signaled for e in evs] == ref.signaled

    same()
    for op, eid in ops:
        if not ref.alive[eid]:
            continue
        if op == "set":
            ref.set(eid)
            kfd._set_event(evs[eid])
        else:
            ref.destroy(eid)
            kfd._destroy_event(p, evs[eid])
        same()


def test_process_exits_notices_an_exit_and_a_cancel_closes_the_pidfd():
    """daemon.ProcessExits (the edge's WatchExit): a watched process that exits completes
    its notice; a cancelled watch ends with an error and holds no pidfd; a process already
    gone is done at once."""
    import os
    import subprocess

    from ualinkd.daemon import ProcessExits
    from ualinkd.fuse.procfd import process_id

    def fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    async def main() -> None:
        exits = ProcessExits()
        async with trio.open_nursery() as nursery:
            await nursery.start(exits.run)
            a, b = subprocess.Popen(["sleep", "60"]), subprocess.Popen(["sleep", "60"])
            try:
                pa, pb = process_id(a.pid), process_id(b.pid)
                assert pa is not None and pb is not None
                before = fds()
                na, nb = exits.watch(pa), exits.watch(pb)
                assert exits.watched == 2 and fds() == before + 2
                assert nb.cancel() and exits.watched == 1 and fds() == before + 1
                with trio.fail_after(10):
                    a.kill()
                    while not na.done:
                        await trio.sleep(0.01)
                na.result()
                assert exits.watched == 0 and fds() == before
                a.wait()
                assert exits.watch(pa).done  # gone already
            finally:
                for proc in (a, b):
                    proc.kill()
                    proc.wait()
            nursery.cancel_scope.cancel()

    trio.run(main)
