"""One node daemon: the pod config, a NodeCore, its FUSE mount, signals, readiness (trio).

`run_node()` mounts `<mount>` (clearing a stale mount left by a killed daemon first),
serves until SIGINT/SIGTERM, and always unmounts on the way out.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import logging
import os
import queue
import secrets
import select
import signal
import ssl
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TextIO, TypeVar

import trio

from .abi.drmfile_query import NONCE, UALINKD_IOCTL_DRM_FILE_QUERY
from .callermem import CallerMemory
from .config import PodConfig, host_memory_total
from .cpumap_server import serve_cpu_maps
from .drm.completion import Completion
from .drm.device import Caller
from .drm.errors import DrmError
from .drm.file import DrmFile
from .drm.loaded import Loaded
from .drm.process import ProcessId
from .fabric.agent import (
    RequestFn,
    SendBatchFn,
    UalinkAgent,
)
from .fabric.link import FabricLink, OnMessage, OnRequest, SendOutcome
from .fabric.wire import Load, Store
from .fuse.dataplane import FAST_MAX as DATA_PLANE_MAX
from .fuse.dataplane import DataPlane
from .fuse.lowlevel import FuseSession, clear_stale_mount
from .fuse.procfd import mount_device, open_pidfd, process_id, resolve_caller_fd, tgid_of
from .fuse.tree import FileTree
from .gpu_engine import GpuEngineEdge
from .node import DrmFileQueries, NodeCore, NodeServices
from .readiness import sd_notify
from .trace import FabricRecord, Record, TraceFilter

log = logging.getLogger("ualinkd")
T = TypeVar("T")


_SYS_PIDFD_GETFD = 438  # x86-64 (and the generic table)
_libc = ctypes.CDLL(None, use_errno=True)


# A kernel holds a registered eventfd as a reference, the daemon as an fd of its own: so that
# one client cannot spend the fds every other client and fabric link needs, each process may
# have this many registered at once, and all processes together half the daemon's fd limit.
# Past either, SYNCOBJ_EVENTFD is ENOMEM (what the kernel answers when it cannot allocate the
# entry), with one log line per process.
MAX_EVENTFDS_PER_PROCESS = 4096


class _HeldEventFds:
    """Who holds how many registered eventfds (CallerEventFd is the one user)."""

    def __init__(self) -> None:
        self.by_tgid: dict[int, int] = {}
        self.total = 0
        self._reported: set[int] = set()
        self._limit: int | None = None

    def total_limit(self) -> int:
        """Half the fd limit, read at the first eventfd (after run_node raised it to the hard
        limit: this object exists from import time on)."""
        if self._limit is None:
            import resource

            self._limit = max(64, resource.getrlimit(resource.RLIMIT_NOFILE)[0] // 2)
        return self._limit

    def take(self, tgid: int) -> None:
        held = self.by_tgid.get(tgid, 0)
        if held >= MAX_EVENTFDS_PER_PROCESS or self.total >= self.total_limit():
            if tgid not in self._reported:
                self._reported.add(tgid)
                log.warning("process %d: SYNCOBJ_EVENTFD refused (ENOMEM): %d eventfds held "
                            "for it, %d for all (limits %d per process, %d in all)", tgid,
                            held, self.total, MAX_EVENTFDS_PER_PROCESS, self.total_limit())
            raise DrmError(errno.ENOMEM, f"process {tgid} holds {held} eventfds")
        self.by_tgid[tgid] = held + 1
        self.total += 1

    def give_back(self, tgid: int) -> None:
        held = self.by_tgid[tgid] - 1
        if held:
            self.by_tgid[tgid] = held
        else:
            del self.by_tgid[tgid]
            self._reported.discard(tgid)
        self.total -= 1


STUCK_WRITE = 0.1  # s: a signaller thread writing longer is taken to be blocked
SIGNAL_WAIT = 0.005  # s: how long a signal waits for its write (CallerEventFd.signal)


class _Signaller:
    """The threads that write registered eventfds (CallerEventFd.signal): one normally;
    another is started whenever more are queued than threads are idle, so a write a caller
    blocks on purpose holds up only its own eventfd. Threads beyond the first end after
    IDLE seconds without work."""

    IDLE = 10.0

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[CallerEventFd] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._threads = 0

    def put(self, ev: CallerEventFd) -> None:
        self._queue.put(ev)
        with self._lock:
            if self._idle >= self._queue.qsize():  # (each queued one has a thread for it)
                return
            self._threads += 1
            self._idle += 1  # (counted idle from the start: the next put does not spawn too)
        threading.Thread(target=self._work, name="ualinkd-eventfd", daemon=True).start()

    def _work(self) -> None:
        while True:
            try:
                ev = self._queue.get(timeout=self.IDLE)
            except queue.Empty:
                with self._lock:
                    if self._threads > 1:
                        self._threads -= 1
                        self._idle -= 1
                        return
                continue
            with self._lock:
                self._idle -= 1
            try:
                ev.deliver()
            finally:
                with self._lock:
                    self._idle += 1


_closer: queue.SimpleQueue[int] | None = None


def _close_elsewhere(fd: int) -> None:
    """Close `fd`, a copy of a caller's file, on a thread of its own, never the FUSE one: a
    file of our own mount would send FLUSH to the thread that is closing it."""
    global _closer
    if _closer is None:
        _closer = queue.SimpleQueue()

        def closing(q: queue.SimpleQueue[int]) -> None:
            while True:
                with contextlib.suppress(OSError):
                    os.close(q.get())

        threading.Thread(target=closing, args=(_closer,), name="ualinkd-closer",
                         daemon=True).start()
    _closer.put(fd)


class CallerEventFd:
    """drm.syncobj.EventFd: the daemon's own reference to a caller's eventfd. Reopening it
    through /proc/<pid>/fd answers ENXIO (an anonymous inode has no open), so the file is
    taken with pidfd_getfd(2), which needs the same ptrace rights as /proc/<pid>/mem. The
    fd must be an eventfd: none → EBADF, another file → EINVAL (eventfd_ctx_fdget); a
    process over its quota (MAX_EVENTFDS_PER_PROCESS) → ENOMEM."""

    held = _HeldEventFds()

    def __init__(self, tid: int, fd: int) -> None:
        self._fd: int | None = None
        self._tgid: int | None = None
        self._lock = threading.Lock()
        self._owed = 0  # signals not yet written
        self._queued = False  # on the signaller's queue
        self._writing = 0.0  # since when a signaller thread writes it (0: none does)
        self._closing = False  # closed while a write was in progress
        self._written = threading.Event()  # the queued signals were written (or lost)
        try:
            target = os.readlink(f"/proc/{tid}/fd/{fd}")
        except OSError:
            raise DrmError(errno.EBADF, f"thread {tid} has no fd {fd}") from None
        if target != "anon_inode:[eventfd]":
            raise DrmError(errno.EINVAL, f"fd {fd} is not an eventfd ({target})")
        tgid = tgid_of(tid)
        try:
            pidfd = os.pidfd_open(tgid or -1)
        except (OSError, ValueError):
            raise DrmError(errno.EBADF, f"no process for thread {tid}") from None
        try:
            self.held.take(tgid or -1)
        except DrmError:
            os.close(pidfd)
            raise
        self._tgid = tgid or -1
        try:
            self._getfd(pidfd, fd)
        except BaseException:
            self._release_quota()
            raise

    def _getfd(self, pidfd: int, fd: int) -> None:
        try:
            got = _libc.syscall(_SYS_PIDFD_GETFD, pidfd, fd, 0)
            if got < 0:
                err = ctypes.get_errno()
                raise DrmError(errno.EBADF if err == errno.EBADF else errno.EPERM,
                               f"pidfd_getfd of fd {fd}: {os.strerror(err)}")
        finally:
            os.close(pidfd)
        # The same open file as the caller's: check it is still an eventfd (the fd number
        # could have been reused between the readlink and the getfd, a race a caller can
        # win on purpose). If it is not, it may be a file of our own mount, whose close
        # sends FLUSH to this FUSE thread, which would wait for itself for good: it is
        # closed on another thread.
        try:
            target = os.readlink(f"/proc/self/fd/{got}")
        except OSError:
            target = "?"
        if target != "anon_inode:[eventfd]":
            _close_elsewhere(got)
            raise DrmError(errno.EINVAL, f"fd {fd} is not an eventfd ({target})")
        self._fd = got

    def signal(self) -> None:
        """eventfd_signal: add 1, never blocking the FUSE thread. The file's flags are the
        caller's (shared), and between a poll for room and the write the caller can fill
        the counter to ULLONG_MAX-1 and clear O_NONBLOCK: the write then blocks until
        someone reads. eventfd has no write of its own that cannot (pwritev2's RWF_NOWAIT
        is EOPNOTSUPP), so it is written by the signaller's threads; signals that come
        while one is queued or being written add to it. This waits for the write up to
        SIGNAL_WAIT, so that, as in the kernel, the eventfd is readable when the call that
        signalled it (SYNCOBJ_EVENTFD on a signalled syncobj, a SIGNAL) returns; a write
        that blocks costs that once, then its signals add up until it is unblocked."""
        with self._lock:
            if self._fd is None or self._closing:
                return
            self._owed += 1
            if self._queued or self._writing:
                return
            self._queued = True
            self._written.clear()
        _signaller.put(self)
        self._written.wait(SIGNAL_WAIT)

    def deliver(self) -> None:
        """[a signaller thread] Write what is owed; a counter with no room for it loses it,
        as a saturated one does. May block, this thread only."""
        with self._lock:
            fd, n = self._fd, self._owed
            self._owed, self._queued = 0, False
            if fd is None or n == 0:
                self._written.set()
                return
            self._writing = time.monotonic()
        try:
            p = select.poll()
            p.register(fd, select.POLLOUT)
            if p.poll(0):
                os.eventfd_write(fd, n)
        except OSError:
            pass
        finally:
            self._written.set()
            with self._lock:
                self._writing = 0.0
                closing = self._closing
                if closing:
                    self._fd = None
                again = not closing and self._owed > 0 and not self._queued
                if again:  # (signals that came while it was written)
                    self._queued = True
            if closing:
                self._close_fd(fd)
            elif again:
                _signaller.put(self)

    def close(self) -> None:
        with self._lock:
            fd = self._fd
            if fd is not None and self._writing:
                # Its writer closes it when the write returns; a write that blocks is
                # ended by a read of the counter (only a caller that filled it on
                # purpose is blocking it, and nobody else will ever read it).
                self._closing = True
                unstick: int | None = os.dup(fd)
            else:
                self._fd, unstick = None, None
        if unstick is not None:
            threading.Thread(target=self._unstick, args=(unstick,), daemon=True,
                             name="ualinkd-eventfd-unstick").start()
        elif fd is not None:
            self._close_fd(fd)
        self._release_quota()

    def _unstick(self, fd: int) -> None:
        try:
            time.sleep(STUCK_WRITE)
            p = select.poll()
            p.register(fd, select.POLLIN)
            with self._lock:
                stuck = self._fd is not None
            if stuck and p.poll(int(STUCK_WRITE * 1000)):
                with contextlib.suppress(OSError):
                    os.eventfd_read(fd)
        finally:
            os.close(fd)

    @staticmethod
    def _close_fd(fd: int) -> None:
        with contextlib.suppress(OSError):
            os.close(fd)  # (an eventfd: its close never calls into FUSE)

    def _release_quota(self) -> None:
        if self._tgid is not None:
            self.held.give_back(self._tgid)
            self._tgid = None


_signaller = _Signaller()


def query_drm_file(process: ProcessId, fd: int, own_dev: tuple[int, int] | None,
                   nonce: int) -> bool:
    """On a worker thread, never the FUSE one: take a copy of the process's fd and, if it is
    a file of our own mount, ask it the private question (abi/drmfile_query.py); whether the
    ioctl succeeded. An fd that is not open is EINVAL, as KFD's fget failure is. The fd is
    taken from exactly `process` (a pidfd checked against its identity): should this run
    late, after the caller gave up and exited, another process given its pid is refused,
    not searched."""
    pidfd = open_pidfd(process)
    if pidfd is None:
        raise DrmError(errno.EINVAL, f"process {process.pid} has exited")
    try:
        got = _libc.syscall(_SYS_PIDFD_GETFD, pidfd, fd, 0)
        if got < 0:
            raise DrmError(errno.EINVAL, f"pidfd_getfd of fd {fd}: "
                           f"{os.strerror(ctypes.get_errno())}")
    finally:
        os.close(pidfd)
    try:
        st = os.fstat(got)
        if own_dev is None or (os.major(st.st_dev), os.minor(st.st_dev)) != own_dev:
            return False  # not one of our files: no ioctl to someone else's device
        try:
            fcntl.ioctl(got, UALINKD_IOCTL_DRM_FILE_QUERY, NONCE.pack(nonce))
        except OSError:
            return False
        return True
    finally:
        os.close(got)


class ProcessExits:
    """drm/process.py's WatchExit on trio: the exit of each watched process, from its pidfd
    (readable once the process has exited), all in one epoll set that one task waits on;
    a process's Completion gets None then. A cancelled watch closes its pidfd at once."""

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._watched: dict[int, Completion[None]] = {}  # pidfd -> its notice

    @property
    def watched(self) -> int:
        return len(self._watched)

    def watch(self, process: ProcessId) -> Completion[None]:
        notice: Completion[None] = Completion()
        if self._epoll.closed:  # shutting down: the context ends with its files
            notice.set_error(DrmError(errno.ESHUTDOWN, "no longer watching exits"))
            return notice
        pidfd = open_pidfd(process)
        if pidfd is None:  # exited already
            notice.set_result(None)
            return notice
        self._epoll.register(pidfd, select.EPOLLIN)
        self._watched[pidfd] = notice

        def cancel() -> None:
            self._forget(pidfd)
            notice.set_error(DrmError(errno.ECANCELED, "no longer watched"))

        notice.on_cancel(cancel)
        return notice

    def _forget(self, pidfd: int) -> None:
        del self._watched[pidfd]
        with contextlib.suppress(OSError, ValueError):
            self._epoll.unregister(pidfd)
        os.close(pidfd)

    def exited(self) -> None:
        """Deliver the notices of the processes that have exited (the epoll is readable)."""
        for pidfd, _ in self._epoll.poll(0):
            notice = self._watched.get(pidfd)
            if notice is None:
                continue
            self._forget(pidfd)
            try:
                notice.set_result(None)  # (its consumer ends the KFD context here)
            except Exception:
                log.exception("KFD: ending the context of an exited process failed")

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        task_status.started()
        try:
            while True:
                await trio.lowlevel.wait_readable(self._epoll.fileno())
                self.exited()
        finally:
            for pidfd in list(self._watched):
                self._forget(pidfd)
            self._epoll.close()


class TrioSyncWaits:
    """drm/syncobj.py's SyncWaits on trio: waiters sleep on per-key trio.Events and look
    again when a key is woken. Deadlines are absolute CLOCK_MONOTONIC ns (the ioctls'
    clock), converted to trio's clock when a wait starts; `monotonic_ns` is injectable so
    tests can run on trio's MockClock."""

    def __init__(self, monotonic_ns: Callable[[], int] = time.monotonic_ns) -> None:
        self._now = monotonic_ns
        self._events: dict[object, set[trio.Event]] = {}

    def now_ns(self) -> int:
        return self._now()

    def wake(self, key: object) -> None:
        for event in self._events.pop(key, ()):
            event.set()

    def wait_until(
        self, deadline_ns: int | None, ready: Callable[[], bool], keys: Iterable[object]
    ) -> Awaitable[bool]:
        return self._wait(deadline_ns, ready, list(keys))

    async def _wait(self, deadline_ns: int | None, ready: Callable[[], bool],
                    keys: list[object]) -> bool:
        deadline = (float("inf") if deadline_ns is None
                    else trio.current_time() + (deadline_ns - self._now()) / 1e9)
        with trio.move_on_at(deadline):
            while not ready():
                event = trio.Event()
                for key in keys:
                    self._events.setdefault(key, set()).add(event)
                try:
                    await event.wait()
                finally:
                    for key in keys:
                        waiting = self._events.get(key)
                        if waiting is not None:
                            waiting.discard(event)
                            if not waiting:
                                del self._events[key]
            return True
        return ready()  # the kernel looks once more before ETIME


def tls_contexts(
    config: PodConfig, node_name: str
) -> tuple[ssl.SSLContext | None, ssl.SSLContext | None]:
    """Mutual TLS for the fabric when the pod config names a CA: both sides present their
    node certificate and check the other's against the CA. Host names are not checked: the
    link checks that the certificate names the node the peer claims to be (its DNS
    subjectAltNames or common name), and the HMAC handshake inside proves the link key."""
    if config.tls_ca is None:
        return None, None
    node = config.node(node_name)
    assert node.tls_cert and node.tls_key
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=config.tls_ca)
    server.verify_mode = ssl.CERT_REQUIRED
    client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=config.tls_ca)
    client.check_hostname = False
    for ctx in (server, client):
        ctx.load_cert_chain(node.tls_cert, node.tls_key)
    return server, client


def make_tracer(mode: str | None, out: TextIO,
                trace_filter: TraceFilter | None = None) -> Callable[[Record], None] | None:
    """One line per record that passes the filter. Each line is one write() of a stream
    opened for appending, so the nodes of a pod can share one --trace-file."""
    if not mode:
        return None
    keep = trace_filter.match if trace_filter is not None else (lambda rec: True)
    as_json = mode == "json"
    failures: dict[str, int] = {}  # cause -> times, for one line per cause, not per record
    closed = [False]

    def trace(rec: Record) -> None:
        # Called inside request handling: a record that cannot be rendered (a decoder's
        # bug) or a full disk must cost the trace line, never the caller's ioctl.
        if closed[0]:
            return
        try:
            if not as_json and rec.kind == "file":
                return  # opens and releases are for recordings (JSON)
            if keep(rec):
                out.write((rec.json() if as_json else rec.text()) + "\n")
                out.flush()
        except BrokenPipeError:
            # Its reader is gone (`ualinkd pod --trace | head`): tracing ends, in one line.
            # The stream's fd is pointed at /dev/null so that what its buffer holds cannot
            # fail again, at the next write or at exit.
            closed[0] = True
            log.warning("trace: the trace output's reader is gone; tracing stops")
            with contextlib.suppress(OSError, ValueError):
                null = os.open(os.devnull, os.O_WRONLY)
                os.dup2(null, out.fileno())
                os.close(null)
        except Exception as e:
            cause = f"{type(e).__name__}: {e}" if isinstance(e, OSError) else type(e).__name__
            n = failures[cause] = failures.get(cause, 0) + 1
            if n == 1:  # (a decoder's bug: its traceback, once)
                log.exception("trace: cannot write the record of %s", rec.name)
            elif n in (10, 100, 1000, 10000) or n % 100000 == 0:
                log.error("trace: cannot write the record of %s: %s (%d times so far)",
                          rec.name, cause, n)

    return trace


def open_trace_file(path: str | None) -> TextIO:
    """--trace-file: appended to (a pod truncates it once and its nodes share it); stdout
    when none is given."""
    if path is None:
        return sys.stdout
    return open(path, "a", buffering=1)


def _kill_caller(caller: Caller) -> None:
    """§13 N6's quirk: U's NULL dereference oopses in the caller's ioctl, and an oops in
    process context ends that task without a chance to catch it; the emulator kills it."""
    try:
        os.kill(caller.pid, signal.SIGKILL)
    except OSError as e:
        log.warning("could not kill pid %d after the oops: %s", caller.pid, e.strerror)


def _kfd_clock() -> tuple[int, int]:
    """The KFD's GET_CLOCK_COUNTERS clocks (amdkfd/chardev.py's Clock)."""
    return (time.clock_gettime_ns(time.CLOCK_MONOTONIC_RAW),
            time.clock_gettime_ns(time.CLOCK_BOOTTIME))


async def resolve_drm_file(queries: DrmFileQueries, caller_memory: CallerMemory,
                           process: ProcessId, fd: int) -> DrmFile:
    """ACQUIRE_VM's fd -> the DrmFile behind it (abi/drmfile_query.py), off the FUSE thread
    within the caller-memory bound; EINVAL for anything not our render node."""
    nonce = secrets.randbits(64) or 1
    queries.pending[nonce] = None
    try:
        await caller_memory.run(query_drm_file, process, fd, caller_memory.own_dev, nonce)
        drm_file = queries.pending.get(nonce)
    finally:
        queries.pending.pop(nonce, None)
    if drm_file is None:
        raise DrmError(errno.EINVAL, f"fd {fd} is not a render node of this daemon")
    return drm_file


def _raise_fd_limit() -> None:
    """Clients hold daemon fds (userptr BOs' process memory, eventfds, CPU-map fetches, fabric
    links): take the hard RLIMIT_NOFILE as the soft one, as servers do, so the default 1024
    is not what a busy node runs out of."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def run_node(
    config: PodConfig,
    node_name: str,
    mount: str,
    trace: str | None = None,
    trace_out: TextIO = sys.stdout,
    task_status: trio.TaskStatus[NodeCore] = trio.TASK_STATUS_IGNORED,
    trace_filter: TraceFilter | None = None,
) -> None:
    mount = os.path.abspath(mount)
    _raise_fd_limit()
    node = NodeDaemon(config, node_name, mount, make_tracer(trace, trace_out, trace_filter))
    real_mount = node.mount_fuse()
    await node.serve(real_mount, task_status)


class NodeDaemon:
    """One node: its core and the edges that serve it, each built once and complete, in the
    order they need each other: the caller's memory, the exit watch and the C data plane
    (they need no node), the core (given them as one NodeServices), its FUSE session, the
    fabric link, the UALink agent.

    Four needs point forward, and go through this object's methods, which nothing calls
    before `serve`: the link hands what it receives to the agent, which sends on the link;
    the core's debugfs shows the link's state; and the core's coroutines run as tasks of
    the FUSE session (its Spawn), which answer their requests."""

    def __init__(self, config: PodConfig, node_name: str, mount: str,
                 tracer: Callable[[Record], None] | None) -> None:
        self.config, self.name, self.mount = config, node_name, mount
        self.caller_memory = CallerMemory(config.caller_memory_timeout_ms / 1000)
        self.exits = ProcessExits()
        self._peers = [n.name for n in config.nodes if n.name != node_name]
        # Made before the core, which shows its counters, and the link, which hands it its
        # data channels; the session runs it.
        self.data_plane = DataPlane()
        try:
            self.core = NodeCore(config, node_name, self._services(tracer))
            self.session = FuseSession(FileTree(self.core, mount), data_plane=self.data_plane)
        except BaseException:
            self.data_plane.free()
            raise
        self.link = self._fabric_link(traced=tracer is not None)
        self.data_plane.set_timeout(self.link.ack_timeout)  # a carried load's deadline
        self.data_plane.link_up = self.link.is_up  # (a dropped channel's line: its link's fate)
        self.agent = self._agent(traced=tracer is not None)

    def _services(self, tracer: Callable[[Record], None] | None) -> NodeServices:
        memory, mount, queries = self.caller_memory, self.mount, DrmFileQueries()
        return NodeServices(
            resolve_fd=lambda pid, fd: resolve_caller_fd(pid, fd, mount),
            copy_from_user=memory.copy_from_user,
            copy_to_user=memory.copy_to_user,
            open_process_memory=memory.open_process,
            open_eventfd=CallerEventFd,
            resolve_drm_file=functools.partial(resolve_drm_file, queries, memory),
            drm_file_queries=queries,
            waits=TrioSyncWaits(),
            clock=_kfd_clock,
            tracer=tracer,
            identify_process=process_id,
            watch_exit=self.exits.watch,
            host_cpus=os.cpu_count() or 1,
            host_memory=host_memory_total(),
            fabric_links=self._fabric_links,
            data_plane_stats=self.data_plane.stats,
            kill_caller=_kill_caller,
            spawn=self._spawn,
        )

    def _fabric_link(self, traced: bool) -> FabricLink:
        server_tls, client_tls = tls_contexts(self.config, self.name)
        on_message: OnMessage = self._receive
        on_request: OnRequest = self._serve_request
        # (An untraced node keeps the link's own callables and its fast paths: a recorder
        # attached to it records no fabric messages, as README's Tracing says.)
        if traced:
            on_message, on_request = _trace_receives(self._trace, self.config, self.name,
                                                     on_message, on_request)
        # §13 N2: the managers' incarnations go out on every link, and their probes read the
        # peers' from it.
        by_accel = {m.accel_id: m for m in self.core.managers.values()}
        return FabricLink(self.config, self.name, on_message, connect_backoff=(0.02, 0.5),
                          on_request=on_request, ssl_context=server_tls,
                          ssl_client_context=client_tls,
                          # (A traced node takes its data channels too, so its peers log no
                          # refusals, but learns no routes: every load it serves or makes is
                          # Python's, and recorded.)
                          data_channels=self.data_plane,
                          local_incarnation=lambda accel: by_accel[accel].incarnation)

    def _agent(self, traced: bool) -> UalinkAgent:
        link = self.link
        send_batch: SendBatchFn = link.send_batch
        request: RequestFn = link.request
        if traced:  # (each request and batch recorded by _trace_sends' steps)
            send_batch, request = _trace_sends(self._trace, self.config, self.name, link)
        return UalinkAgent(self.core, send_batch, request,
                           probe=link.incarnation, announce=link.announce)

    # -- what the link, the agent and the core ask each other, once serving -----------------
    def _spawn(self, aw: Awaitable[T]) -> Completion[T]:
        return self.session.spawn(aw)

    def _receive(self, src: int, dst: int, dwords: tuple[int, int, int, int]
                 ) -> Completion[None] | None:
        return self.agent.on_message(src, dst, dwords)

    def _serve_request(self, peer: str, req: Load | Store) -> tuple[int, list[memoryview]]:
        agent, data_plane = self.agent, self.data_plane
        arg = req.length if isinstance(req, Load) else req.data
        try:
            served = agent.serve(req.src_accel, req.dst_accel, req.npa_byte_addr, arg)
        except DrmError as e:
            return -e.errno, []
        # (core.tracer: the --trace one, or `ualinkd record`'s while it is attached)
        length = req.length if isinstance(req, Load) else len(req.data)
        if (0 < length <= DATA_PLANE_MAX and data_plane.running
                and self.core.tracer is None):
            # Served: the data plane may answer the next LOADs and STOREs of these BO
            # chunks itself (a STORE has the same reach as a LOAD: _resolve_npa).
            for npa, n, backing, offset in agent.load_routes(
                    req.src_accel, req.dst_accel, req.npa_byte_addr, length):
                data_plane.route_export(req.src_accel, req.dst_accel, npa, n, backing, offset)
        return 0, served

    def _trace(self, rec: Record) -> None:
        """The node's tracer of the moment, not the --trace one it started with: `ualinkd
        record` puts its TraceHub (which feeds --trace too) in core.tracer when it attaches,
        and the fabric's records must reach it as the ioctls' do."""
        if (now := self.core.tracer) is not None:
            now(rec)

    def _fabric_links(self) -> dict[str, str]:
        return {p: self.link.link_state(p) for p in self._peers}

    # -- running ----------------------------------------------------------------------------
    def mount_fuse(self) -> str:
        """Mount (clearing a stale mount left by a killed daemon first) and start the data
        plane; the mount point's real path."""
        clear_stale_mount(self.mount)
        # mountinfo names the mount point by its real path; resolve it before mounting
        # (after, the last lstat would ask our own FUSE server, which is not serving yet).
        real_mount = os.path.realpath(self.mount)
        try:
            self.session.mount(self.mount)
        except BaseException:
            self.session.close()  # (its data plane listens to translation changes until closed)
            raise
        # Caller ranges that map files of this mount are refused (faulting them in would
        # ask us).
        self.caller_memory.own_dev = mount_device(real_mount)
        if self.caller_memory.own_dev is None:
            self.session.unmount()
            self.session.close()
            raise OSError(errno.EIO, f"{self.mount} is not in our mountinfo after mounting it")
        # Before the link runs: a data channel it hands over to a data plane not running yet
        # is refused, and not dialed again while that link lasts (session.serve() keeps it).
        self.session.start_data_plane()
        return real_mount

    async def serve(self, real_mount: str,
                    task_status: trio.TaskStatus[NodeCore] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until SIGINT/SIGTERM (or the mount goes); always unmounts on the way out."""
        core = self.core
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(_stop_on_signal, nursery.cancel_scope, self.name)
                await nursery.start(self.link.run)
                await nursery.start(self.agent.run)
                await nursery.start(serve_cpu_maps, core.cpu_maps)
                await nursery.start(self.exits.run)
                await nursery.start(_serve_trace, core, real_mount)
                # the queues' doorbells (issue 30); remote copies through the data plane
                await nursery.start(GpuEngineEdge(core, self.data_plane).run)
                states = ", ".join(
                    f"accel {m.accel_id} {m.state.sysfs}" for m in core.managers.values()
                )
                log.info("%s: serving %s (%s)", self.name, self.mount, states)
                sd_notify("READY=1")
                task_status.started(core)
                await self.session.serve()
                nursery.cancel_scope.cancel()
        finally:
            self.session.unmount()
            self.session.close()
            log.info("%s: unmounted %s", self.name, self.mount)


async def _serve_trace(core: NodeCore, real_mount: str,
                       task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """`ualinkd record`'s subscriptions (replay/record.py); a node that cannot listen still
    serves its clients, only not recorders."""
    from .replay.record import bind_trace_socket, serve_trace

    try:
        sock, path = await bind_trace_socket(real_mount)
    except OSError as e:
        log.warning("%s: no trace subscriptions (ualinkd record): %s", core.name, e)
        task_status.started()
        return
    task_status.started()
    await serve_trace(core, sock, path)


def _accel_names(config: PodConfig) -> Callable[[int], str | None]:
    owner = {a.accel_id: n.name for n in config.nodes for a in n.accels}
    return owner.get


def _trace_receives(
    tracer: Callable[[Record], None], config: PodConfig, node: str,
    on_message: Callable[[int, int, tuple[int, int, int, int]], Completion[None] | None],
    on_request: Callable[[str, Load | Store], tuple[int, list[memoryview]]],
) -> tuple[Callable[[int, int, tuple[int, int, int, int]], Completion[None] | None],
           Callable[[str, Load | Store], tuple[int, list[memoryview]]]]:
    """The fabric on the receiving side: each UALink message as it arrives, each LOAD/STORE
    as this node serves it (the result is its DATA answer's status)."""
    names = _accel_names(config)

    def message(src: int, dst: int, dwords: tuple[int, int, int, int]
                ) -> Completion[None] | None:
        tracer(FabricRecord.ualink(node, "recv", src, dst, dwords, names, start=time.time()))
        return on_message(src, dst, dwords)

    def request(peer: str, req: Load | Store) -> tuple[int, list[memoryview]]:
        start = time.time()
        status, bufs = on_request(peer, req)
        tracer(_data_record(node, "recv", req, names, status, start))
        return status, bufs

    return message, request


def _data_record(node: str, direction: str, req: Load | Store,
                 names: Callable[[int], str | None], status: int,
                 start: float) -> FabricRecord:
    is_load = isinstance(req, Load)
    length = req.length if isinstance(req, Load) else len(req.data)
    return FabricRecord(node, direction, "LOAD" if is_load else "STORE", req.src_accel,
                        req.dst_accel, names(req.src_accel), names(req.dst_accel),
                        {"npa_byte_addr": req.npa_byte_addr, "length": length}, status,
                        start, time.time() - start)


def _trace_sends(
    tracer: Callable[[Record], None], config: PodConfig, node: str, link: FabricLink,
) -> tuple[SendBatchFn, RequestFn]:
    """The fabric on the sending side: each UALink message when its ACK came (or the send
    failed), each LOAD/STORE when its DATA came back; the duration is the round trip.
    Recorded in the call that completes each (a step on the link's Completion)."""
    names = _accel_names(config)

    def send_batch(src: int, dst: int, messages: Sequence[tuple[int, int, int, int]]
                   ) -> Completion[list[SendOutcome]]:
        start, t0 = time.time(), trio.current_time()

        def traced(c: Completion[list[SendOutcome]]) -> list[SendOutcome]:
            outcomes = c.result()
            for dwords, (err, when) in zip(messages, outcomes, strict=True):
                # each one's round trip: from the queueing to its own ACK (or failure)
                tracer(FabricRecord.ualink(node, "send", src, dst, dwords, names,
                                           -err.errno if err else 0, start, when - t0))
            return outcomes

        # queued now, in the caller's order
        return link.send_batch(src, dst, messages).then(traced)

    def request(src: int, dst: int, npa_byte_addr: int,
                length_or_data: int | bytes) -> Completion[Loaded]:
        start = time.time()
        req: Load | Store = (Load(0, src, dst, npa_byte_addr, length_or_data)
                             if isinstance(length_or_data, int)
                             else Store(0, src, dst, npa_byte_addr, length_or_data))

        def traced(c: Completion[Loaded]) -> Loaded:
            try:
                got = c.result()
            except DrmError as e:
                tracer(_data_record(node, "send", req, names, -e.errno, start))
                raise
            tracer(_data_record(node, "send", req, names, 0, start))
            return got

        return link.request(src, dst, npa_byte_addr, length_or_data).then(traced)

    return send_batch, request


async def _stop_on_signal(
    scope: trio.CancelScope, node_name: str, task_status: trio.TaskStatus[None]
) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        task_status.started()  # handlers are in place before anyone hears READY
        async for signum in signals:
            log.info("%s: %s, shutting down", node_name, signal.Signals(signum).name)
            scope.cancel()
            return
