"""libfuse3's low-level session driven from trio: mount, the receive/process loop, replies.

Turns C callbacks into calls on an `Operations` object with Python values, and its return
values (or `FuseError`, or a Completion answered in the call that completes it) into
`fuse_reply_*` calls. It is also the trio edge's Spawn: a coroutine of the core runs as a
task of the session (`spawn`), which answers through a Completion like any other.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import trio

from ualinkd.drm.completion import Completion
from ualinkd.drm.loaded import Loaded, PipedBytes
from ualinkd.fuse._fuse_ll import ffi, lib
from ualinkd.fuse.backend import Caller
from ualinkd.fuse.dataplane import FAST_MAX, DataPlane

# Stale-mount clearing lives in mounts.py; these names stay importable from here.
from ualinkd.fuse.mounts import (
    clear_stale_mount,
    fuse_mounts_at,
    fuse_mounts_under,
    non_root_mount_hint,
    unescape_mountinfo,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

__all__ = [
    "Attr",
    "Caller",
    "DirEntry",
    "FuseError",
    "FuseSession",
    "OpenReply",
    "Operations",
    "clear_stale_mount",
    "fuse_mounts_at",
    "fuse_mounts_under",
    "non_root_mount_hint",
    "unescape_mountinfo",
]

ROOT_INO = 1
# How long the receive loop waits for the next request once the device is empty
# (fuse/_build.py's _ualinkd_drain says why: a client on another CPU sends its next ioctl
# 10-40 µs after its answer), and how many requests and lingers it does per trio wake-up:
# trio's own work (the fabric's) waits behind a stream of requests for that many at most,
# a millisecond or two, and costs them one scheduler turn (under a µs each).
LINGER_NS = 50_000
# ... and after a read the C data plane took: its answer comes from the data plane's thread
# after a fabric round trip, and the caller's next load after that (_ualinkd_drain).
CARRIED_LINGER_NS = 250_000
TURNS_PER_WAKEUP = 32
_SPLICE_CAPS = lib.FUSE_CAP_SPLICE_READ | lib.FUSE_CAP_SPLICE_WRITE | lib.FUSE_CAP_SPLICE_MOVE


class FuseError(Exception):
    """The one exception an operation may raise on purpose: the request fails with errno."""

    def __init__(self, errno_: int) -> None:
        super().__init__(errno_, os.strerror(errno_))
        self.errno = errno_


@dataclass(slots=True)
class Attr:
    """Attributes of an inode, and how long the kernel may cache them (and the name)."""

    ino: int
    mode: int
    size: int = 0
    nlink: int = 1
    uid: int = 0
    gid: int = 0
    attr_timeout: float = 0.0
    entry_timeout: float = 0.0


@dataclass(slots=True)
class OpenReply:
    """What open() tells the kernel about the new file handle."""

    fh: int
    direct_io: bool = False
    keep_cache: bool = False
    nonseekable: bool = False
    # FOPEN_PARALLEL_DIRECT_WRITES: direct_io writes of this file take the inode's lock
    # shared, not exclusive, so they run side by side (the kernel still serializes a write
    # that ends beyond the file's size, and every write while someone has it mmapped).
    parallel_direct_writes: bool = False


# (name, ino, mode, offset of the *next* entry)
DirEntry = tuple[str, int, int, int]


class Operations(Protocol):
    """What a FuseSession calls. Raise FuseError(errno) to fail a request; any other
    exception is a bug (logged with its traceback, answered with EIO)."""

    def lookup(self, parent: int, name: str, caller: Caller) -> Attr: ...
    def forget(self, ino: int, nlookup: int) -> None: ...
    def getattr(self, ino: int, caller: Caller) -> Attr: ...
    def readlink(self, ino: int, caller: Caller) -> bytes: ...
    def setattr(self, ino: int, size: int | None, caller: Caller) -> Attr: ...
    def open(self, ino: int, flags: int, caller: Caller) -> OpenReply: ...
    def read(
        self, ino: int, fh: int, off: int, size: int, caller: Caller
    ) -> bytes | Completion[Loaded]: ...
    def read_route(self, fh: int, off: int, size: int,
                   write: bool = False) -> tuple[int, int, int, int, int] | None: ...
    def read_expired(self, fh: int) -> None: ...
    def write(
        self, ino: int, fh: int, off: int, data: bytes, caller: Caller
    ) -> int | Completion[int]: ...
    def release(self, ino: int, fh: int) -> None: ...
    def opendir(self, ino: int, caller: Caller) -> int: ...
    def readdir(self, ino: int, fh: int, off: int) -> Iterable[DirEntry]: ...
    def releasedir(self, ino: int, fh: int) -> None: ...
    def ioctl(
        self, ino: int, fh: int, cmd: int, in_bytes: bytes, out_size: int, caller: Caller
    ) -> tuple[int, bytes] | Completion[tuple[int, bytes]]: ...


# The session whose fuse_session_process_buf() is running. Callbacks only ever run inside
# that call (or inside fuse_session_destroy), always on the trio thread, so a global set
# just before is exact and cheaper than fuse_req_userdata + ffi.from_handle.
_active: FuseSession | None = None


class FuseSession:
    """One FUSE mount served from trio. Lifecycle: mount() -> serve() -> unmount() -> close()."""

    def __init__(self, ops: Operations, *, fsname: str = "ualinkd",
                 data_plane: DataPlane | None = None) -> None:
        self.ops = ops
        self.fsname = fsname
        self.mountpoint: str | None = None
        self._se: Any = ffi.NULL
        self._fd = -1
        self._buf = ffi.new("struct fuse_buf *")
        self._llops = ffi.new("struct fuse_lowlevel_ops *")
        lib._ualinkd_ops_init(self._llops)
        self._callers: dict[tuple[int, int, int], Caller] = {}
        # req address -> what gives up its wait when its caller gets a signal (INTERRUPT):
        # a task's cancel scope, or a Completion's cancel (then the key is in _interrupted)
        self._interruptible: dict[int, Callable[[], None]] = {}
        self._interrupted: set[int] = set()
        # Requests a Completion will answer (req address -> req): answered EINTR when serve()
        # ends, as its tasks are, so none is answered after the session is gone.
        self._completing: dict[int, Any] = {}
        # The pipe a spliced read reply is put together in (_reply_spliced), made at the first.
        self._splice_out: tuple[int, int] | None = None
        self._splice_refused = False
        self._nursery: trio.Nursery | None = None
        self._fatal: BaseException | None = None
        self._serving = False
        # The C receive/process loop's state: its request count, the flag that stops it
        # after the request it is processing (unmount, a fatal exception), and its linger.
        self._loop = ffi.new("struct _ualinkd_loop *")
        self._tasks = 0  # coroutines running as tasks in the nursery (spawn)
        # Small GPU loads of imported memory, in C (fuse/dataplane.py); its thread runs
        # while serve() does. (A daemon makes it first: the node shows its counters.)
        self.data_plane = data_plane if data_plane is not None else DataPlane()
        # The unique of a read the data plane handed back (its buffer is long gone).
        self._unique: int | None = None

    @property
    def requests(self) -> int:
        """Requests received so far (handy for tests and benchmarks)."""
        return int(self._loop.requests)

    # -- lifecycle ---------------------------------------------------------------------

    def mount(self, mountpoint: str | os.PathLike[str]) -> None:
        """Create the session and mount it. Options: allow_other (clients are any uid; we
        run as root), no default_permissions (the tree checks), no splice."""
        if self._se != ffi.NULL:
            raise RuntimeError("already mounted")
        mp = os.path.abspath(os.fspath(mountpoint))
        opts = f"fsname={self.fsname},subtype={self.fsname},allow_other"
        argv_keep = [ffi.new("char[]", a.encode()) for a in ("ualinkd", "-o", opts)]
        argv = ffi.new("char *[]", [*argv_keep, ffi.NULL])
        args = ffi.new("struct fuse_args *", {"argc": 3, "argv": argv, "allocated": 0})
        se = lib.fuse_session_new(
            args, self._llops, ffi.sizeof("struct fuse_lowlevel_ops"), self.data_plane.pointer
        )
        lib.fuse_opt_free_args(args)
        if se == ffi.NULL:
            raise OSError(errno.EINVAL, "fuse_session_new failed (see stderr)")
        if lib.fuse_session_mount(se, mp.encode()) != 0:
            lib.fuse_session_destroy(se)
            raise OSError(errno.EIO, f"fuse_session_mount({mp}) failed"
                          + (non_root_mount_hint() or " (see stderr)"))
        self._se = se
        self.mountpoint = mp
        self._fd = lib.fuse_session_fd(se)
        self._loop.stop = 0  # an earlier session's unmount() set it
        os.set_blocking(self._fd, False)

    def start_data_plane(self) -> bool:
        """Start this session's data plane (it replies to our reads from its thread, large
        ones spliced into our /dev/fuse); False if it cannot (loads go through Python)."""
        return self.data_plane.start(self._fd)

    async def serve(self) -> None:
        """Answer requests until the session ends (unmount, or the kernel drops it).
        Coroutines run as tasks in a nursery owned here (`spawn`), so when serve() returns
        no request is left unanswered."""
        if self._se == ffi.NULL:
            raise RuntimeError("not mounted")
        self._serving = True
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                if self.data_plane.running or self.start_data_plane():  # (the daemon's
                    nursery.start_soon(self._serve_handed_back)  # runs before its link)
                try:
                    while not self._drain():
                        try:
                            await trio.lowlevel.wait_readable(self._fd)
                        except (trio.ClosedResourceError, OSError):
                            break  # unmount() closed the fd under us
                finally:
                    self._nursery = None
                    nursery.cancel_scope.cancel()
        finally:
            self._serving = False
            self.data_plane.stop(errno.EINTR)
            # An interruptible wait answered by a Completion gives up as a task's does when
            # its nursery is cancelled (an import in flight is dropped): answered EINTR.
            for key in [k for k in self._completing if k in self._interruptible]:
                give_up = self._interruptible.get(key)  # (an earlier one's may answer it)
                if give_up is not None:
                    try:
                        give_up()
                    except Exception:
                        log.exception("fuse: giving up a wait at the session's end failed")
            pending, self._completing = self._completing, {}
            for req in pending.values():
                self._reply_err_late(req, errno.EINTR)

    def unmount(self) -> None:
        """Unmount (lazily) and close the device fd; pending client calls fail. Idempotent."""
        if self._se == ffi.NULL or self._fd < 0:
            return
        try:
            trio.lowlevel.notify_closing(self._fd)
        except RuntimeError:
            pass  # not inside trio: nobody can be waiting on the fd
        # Its thread replies on the device fd: stopped first, it writes to no fd number
        # that this close frees for reuse.
        self.data_plane.stop(errno.EINTR)
        lib.fuse_session_unmount(self._se)
        self._fd = -1
        self._loop.stop = 1  # called from a callback: no further receive on the closed fd

    def close(self) -> None:
        """Unmount if needed and free the session. Call after serve() has returned."""
        global _active
        if self._serving:
            raise RuntimeError("close() while serve() is running")
        self.unmount()
        if self._se != ffi.NULL:
            _active = self
            lib.fuse_session_destroy(self._se)
            self._se = ffi.NULL
        self.data_plane.free()
        if self._buf.mem != ffi.NULL:
            lib.free(self._buf.mem)
            self._buf.mem = ffi.NULL
        if self._splice_out is not None:
            os.close(self._splice_out[0])
            os.close(self._splice_out[1])
            self._splice_out = None

    def __enter__(self) -> FuseSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the loop ----------------------------------------------------------------------

    def _drain(self) -> bool:
        """Receive and process requests until the device has none (EAGAIN). Returns True
        when the session is over. Draining before going back to trio saves a scheduler
        round trip per request when requests queue up. The loop itself is C
        (`_ualinkd_drain`, fuse/_build.py); the callbacks it runs are the Python below."""
        global _active
        if self._fd < 0:
            return True
        _active = self
        loop = self._loop
        # No linger while an answer waits on trio: it would wait behind us.
        loop.linger_ns = 0 if self._tasks or self._completing else LINGER_NS
        loop.carried_linger_ns = CARRIED_LINGER_NS
        loop.wake_fd = self.data_plane.notify_fd
        loop.turns = TURNS_PER_WAKEUP
        n = lib._ualinkd_drain(self._se, self._buf, loop)
        if self._fatal is not None:
            exc, self._fatal = self._fatal, None
            self._loop.stop = 0
            raise exc
        if n == 0:
            return False
        if n > 0:  # over, or stopped by unmount()
            return True
        raise OSError(-n, f"fuse: reading device: {os.strerror(-n)}")

    async def _serve_handed_back(self) -> None:
        """The reads the data plane's thread handed back (no route at the exporter, a
        partial answer, a channel that went down): Python serves them, as if the read had
        just come in; one that got no answer within the link's deadline faults, as the same
        LOAD on the link does (its GPU fault counted: ops.read_expired)."""
        global _active
        dp = self.data_plane
        while dp.running:
            try:
                await trio.lowlevel.wait_readable(dp.notify_fd)
            except (trio.ClosedResourceError, OSError):
                return  # stopped (unmount)
            dp.log_events()
            handed = dp.take_fallbacks()
            dp.finish_loads()  # (the GPU engine's: gpu_engine.py's remote copies)
            if self._fd < 0:
                for req, *_ in handed:
                    lib.fuse_reply_none(req)
                continue
            _active = self
            for req, ino, size, off, fh, unique, expired, data in handed:
                if expired:  # (a store too: the link's STORE that expired faults it)
                    try:
                        self.ops.read_expired(fh)
                    except Exception as e:
                        self._bug(None, "read (expired)", e)
                    lib.fuse_reply_err(req, errno.EFAULT)
                    continue
                if data is not None:  # a store: Python stores it through the link
                    fi = ffi.new("struct fuse_file_info *")
                    fi.fh = fh
                    _write(req, ino, ffi.from_buffer(data), size, off, fi)
                    continue
                self._unique = unique
                try:
                    _read(req, ino, size, off, fh)
                finally:
                    self._unique = None

    # -- helpers used by the callbacks ---------------------------------------------------

    def _caller(self, req: Any) -> Caller:
        c = lib.fuse_req_ctx(req)
        return self._callers.get((c.pid, c.uid, c.gid)) or self._new_caller(c.pid, c.uid, c.gid)

    def _new_caller(self, pid: int, uid: int, gid: int) -> Caller:
        if len(self._callers) > 4096:
            self._callers.clear()
        caller = self._callers[pid, uid, gid] = Caller(pid, uid, gid)
        return caller

    def _bug(self, req: Any, op: str, exc: BaseException) -> None:
        """An exception other than FuseError escaped an op: loud, EIO, keep serving."""
        log.error("fuse %s: unexpected exception, replying EIO", op, exc_info=exc)
        if req is not None:
            lib.fuse_reply_err(req, errno.EIO)
        if not isinstance(exc, Exception):
            self._fatal = exc  # KeyboardInterrupt and friends: re-raised by serve()
            self._loop.stop = 1

    def spawn(self, aw: Awaitable[T]) -> Completion[T]:
        """The trio edge's Spawn (drm/completion.py): `aw` runs as a task of this session's
        nursery, and the Completion returned ends with its outcome; a request answered by
        it is answered as any Completion's (`_complete`). An ioctl's caller may get a signal
        while it waits (an import's HELLO_ACK or NPA_RSP, a syncobj wait): the kernel then
        sends INTERRUPT, `_complete` cancels the Completion, which cancels the task, and
        its answer is EINTR (spec I10/I13), as it is when serve() ends; without that a
        SIGKILLed caller would hang in the kernel until the wait ended. GPU loads and
        stores (read/write) are not interruptible, as on a GPU: a profiler's timer signal
        must not restart a long remote read forever; they end within the fabric's
        timeouts. Outside serve() the answer is EIO."""
        c: Completion[T] = Completion()
        if self._nursery is None:
            c.set_error(FuseError(errno.EIO))
            return c
        scope = trio.CancelScope()
        c.on_cancel(scope.cancel)  # (the task ends it, once it is cancelled)
        self._tasks += 1
        self._loop.linger_ns = 0  # its answer comes from trio: the loop must not linger
        self._nursery.start_soon(self._run_spawned, aw, c, scope)
        return c

    async def _run_spawned(self, aw: Awaitable[T], c: Completion[T],
                           scope: trio.CancelScope) -> None:
        try:
            with scope:
                value = await aw
        except trio.Cancelled:  # the session is shutting down
            c.set_error(FuseError(errno.EINTR))
            raise
        except Exception as e:
            c.set_error(e)
        else:
            if scope.cancelled_caught:  # interrupted
                log.debug("fuse: a wait interrupted by a signal to the caller, replying EINTR")
                c.set_error(FuseError(errno.EINTR))
            else:
                c.set_result(value)
        finally:
            self._tasks -= 1
        if not self._tasks and not self._completing and self._fd >= 0:
            # Its caller's next request (an import's token open) comes some 10-40 µs after
            # this answer: the C loop waits for it (LINGER_NS) rather than trio, as it
            # does after an answer it gave itself (_ualinkd_drain).
            self._drain()

    def _complete(self, req: Any, op: str, c: Completion[Any], finish: Reply,
                  args: tuple[Any, ...]) -> None:
        """Answer `req` when `c` completes, from whoever completes it (the fabric's reader:
        a GPU load's DATA, an import's NPA_RSP, or a task of `spawn`), with no task in
        between. An ioctl's wait is interruptible (I10/I13): INTERRUPT cancels `c`, and the
        answer is EINTR. GPU loads and stores are not; the fabric's deadline ends them."""

        key = int(ffi.cast("uintptr_t", req))
        self._completing[key] = req
        self._loop.linger_ns = 0  # whoever completes it runs in trio: do not linger
        ioctl = op == "ioctl"
        if ioctl and not c.done:
            def interrupted() -> None:
                self._interrupted.add(key)  # (before: the cancel may answer it at once)
                if not c.cancel():  # a wait that cannot be given up: it ends as it ends
                    self._interrupted.discard(key)

            self._interruptible[key] = interrupted
            lib.fuse_req_interrupt_func(req, lib._on_interrupt, ffi.NULL)  # may cancel now
        if op == "read":
            # A GPU load's bytes may come in a pipe (drm/loaded.py): its reply is then
            # written to /dev/fuse by us, which takes the request's unique (read now, from
            # its buffer).
            unique = self._unique if self._unique is not None \
                else lib._ualinkd_in_unique(self._buf)
            reply_buf = finish

            def finish(req: Any, value: Any, *args: Any) -> None:
                if isinstance(value, bytes | bytearray) or \
                        not self._reply_spliced(req, unique, value):
                    reply_buf(req, value, *args)

        def done(c: Completion[Any]) -> None:
            if ioctl:
                self._interruptible.pop(key, None)  # (req's address may be reused after this)
                if key in self._interrupted:
                    self._interrupted.discard(key)
                    if self._completing.pop(key, None) is not None:
                        log.debug("fuse ioctl: interrupted by a signal to the caller, "
                                  "replying EINTR")
                        self._reply_err_late(req, errno.EINTR)
                    return
            if self._completing.pop(key, None) is None:
                return  # answered when serve() ended
            try:
                value = c.result()
            except FuseError as e:
                self._reply_err_late(req, e.errno)
                return
            except Exception as e:
                log.error("fuse %s (completion): unexpected exception, replying EIO", op,
                          exc_info=e)
                self._reply_err_late(req, errno.EIO)
                return
            # No drain here (a task of `spawn` drains after this): this runs inside
            # whoever completed it (the ring, the link's reader), and a request read now
            # would queue its sends before the ones its caller has yet to queue (a ring
            # reply): the caller's next request comes through serve()'s own turn.
            self._finish_late(req, op, finish, value, args)

        try:
            c.when_done(done)
        except BaseException:
            del self._completing[key]  # the callback answers it (EIO): serve() must not
            raise

    def _finish_late(self, req: Any, op: str, finish: Reply, value: Any,
                     args: tuple[Any, ...]) -> None:
        """Answer `req` with its op's value, after the callback returned (its Completion
        ended): nothing but freeing it once the device is gone."""
        if self._fd < 0:
            lib.fuse_reply_none(req)
            return
        try:
            finish(req, value, *args)
        except Exception as e:
            self._bug(req, op, e)

    def _reply_spliced(self, req: Any, unique: int, data: PipedBytes) -> bool:
        """Answer a read with bytes held in a pipe by splicing them on into /dev/fuse (one
        copy, the kernel's, into the caller's buffer). False when they are in memory (or
        no pipe of ours could be had): the caller replies with `data.memory()`."""
        out = self._splice_out
        if out is None:
            if self._splice_refused:
                return False
            try:
                out = self._splice_out = _out_pipe()
            except OSError:  # no fd free now (EMFILE, ENFILE): this reply from memory
                return False
            if out is None:
                self._splice_refused = True
                return False
        parts = data.splice_parts()
        if parts is None:
            return False
        prefix, fd, count = parts
        err = lib._ualinkd_reply_spliced(self._se, req, unique, prefix, len(prefix), fd, count,
                                         out[0], out[1])
        if err:  # what is left in our pipe belongs to no reply
            if err == -errno.ENOENT:  # its caller is gone (killed): nobody to answer
                log.debug("fuse read: the caller of a %d-byte read is gone",
                          len(prefix) + count)
            else:  # (answered EIO)
                log.error("fuse read: splicing a %d-byte reply failed (%s), replied EIO",
                          len(prefix) + count, os.strerror(-err))
            os.close(out[0])
            os.close(out[1])
            self._splice_out = None
        return True

    def _reply_err_late(self, req: Any, err: int) -> None:
        if self._fd < 0:
            lib.fuse_reply_none(req)  # the connection is gone: just free the request
        else:
            lib.fuse_reply_err(req, err)


# -- reply helpers (module level: called per request, keep them flat) --------------------


def _fill_stat(st: Any, a: Attr) -> None:
    st.st_ino = a.ino
    st.st_mode = a.mode
    st.st_nlink = a.nlink
    st.st_uid = a.uid
    st.st_gid = a.gid
    st.st_size = a.size
    st.st_blksize = 4096
    st.st_blocks = (a.size + 511) // 512
    st.st_atim.tv_sec = st.st_mtim.tv_sec = st.st_ctim.tv_sec = _EPOCH


_EPOCH = int(time.time())


# One struct of each for every reply: libfuse copies it before fuse_reply_* returns, and
# _fill_stat writes the same fields each time (the rest stay zero), so the bytes sent are
# those of a fresh one. ffi.new() took 0.5 µs per reply (timeit), reuse nothing.
_stat = ffi.new("struct stat *")
_entry = ffi.new("struct fuse_entry_param *")


def _reply_attr(req: Any, a: Attr) -> None:
    st = _stat
    _fill_stat(st, a)
    lib.fuse_reply_attr(req, st, a.attr_timeout)


def _reply_entry(req: Any, a: Attr) -> None:
    e = _entry
    e.ino = a.ino
    e.attr_timeout = a.attr_timeout
    e.entry_timeout = a.entry_timeout
    _fill_stat(e.attr, a)
    lib.fuse_reply_entry(req, e)


def _out_pipe() -> tuple[int, int] | None:
    """A pipe for spliced read replies: 256 slots (1 MiB, the default pipe-max-size), room
    for a reply's header, the bytes that came with the DATA frame's header and every slot
    of the fabric's payload pipe (fabric/splice.py: half as many)."""
    r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 1 << 20)
    except OSError as e:
        os.close(r)
        os.close(w)
        log.info("fuse: a 1 MiB pipe was refused (%s); GPU loads are replied from memory",
                 e.strerror)
        return None
    return r, w


def _reply_buf(req: Any, data: Loaded, *_: Any) -> None:
    if not isinstance(data, bytes | bytearray):
        data = data.memory()  # (FuseSession._complete splices it when it can)
    # A bytearray (fabric data received in place) is passed by address, not copied.
    lib.fuse_reply_buf(req, data if type(data) is bytes else ffi.from_buffer(data), len(data))


def _reply_write(req: Any, count: int, *_: Any) -> None:
    if type(count) is not int:
        raise TypeError(f"write op returned {type(count).__name__}")
    lib.fuse_reply_write(req, count)


def _reply_ioctl(req: Any, value: tuple[int, bytes], out_size: int) -> None:
    result, out = value
    if len(out) > out_size:
        raise ValueError(f"ioctl reply has {len(out)} bytes, the caller asked {out_size}")
    lib.fuse_reply_ioctl(req, result, out, len(out))


def _reply_none(req: Any, _value: None, *_: Any) -> None:
    lib.fuse_reply_none(req)


def _reply_ok(req: Any, _value: None, *_: Any) -> None:
    lib.fuse_reply_err(req, 0)


# -- the callbacks -----------------------------------------------------------------------
# Each libfuse callback is a `body` that calls the op and returns its value; `_callback`
# is where that value (or a Completion of it) becomes a reply and where exceptions cross
# the boundary: FuseError -> fuse_reply_err, anything else -> _bug (EIO). The ioctl
# callback (`_op_ioctl`, at the end) is the same steps written out, for speed.


Reply = Callable[..., None]


def _callback(op: str, reply: Reply, *, no_error_reply: bool = False) -> Callable[
        [Callable[..., Any]], Callable[..., None]]:
    """Register `body(s, req, *args)` as libfuse's `_op_<op>`; `reply(req, value, *args)`
    answers it, when its Completion ends if it is one. `no_error_reply`: requests that
    take no error reply (forget, release): a failing op is logged and the reply still sent."""

    def register(body: Callable[..., Any]) -> Callable[..., None]:
        if no_error_reply:
            def cb(req: Any, *args: Any) -> None:
                s = _active
                try:
                    body(s, req, *args)
                except BaseException as e:
                    s._bug(None, op, e)
                reply(req, None)
        else:
            def cb(req: Any, *args: Any) -> None:
                s = _active
                try:
                    r = body(s, req, *args)
                    if type(r) is Completion:
                        s._complete(req, op, r, reply, args)
                    else:
                        reply(req, r, *args)
                except FuseError as e:
                    lib.fuse_reply_err(req, e.errno)
                except BaseException as e:
                    s._bug(req, op, e)

        cb.__name__ = cb.__qualname__ = f"_op_{op}"
        return ffi.def_extern(name=f"_op_{op}")(cb)

    return register


@ffi.def_extern()
def _on_interrupt(req: Any, data: Any) -> None:
    """libfuse: the kernel interrupted `req` (its caller got a signal)."""
    s = _active
    give_up = s._interruptible.get(int(ffi.cast("uintptr_t", req))) if s is not None else None
    if give_up is not None:
        give_up()


@ffi.def_extern()
def _op_init(userdata: Any, conn: Any) -> None:
    conn.want &= ~_SPLICE_CAPS


@ffi.def_extern()
def _op_destroy(userdata: Any) -> None:
    pass


@_callback("lookup", lambda req, a, *_: _reply_entry(req, a))
def _lookup(s: FuseSession, req: Any, parent: int, name: Any) -> Attr:
    return s.ops.lookup(
        parent, ffi.string(name).decode("utf-8", "surrogateescape"), s._caller(req))


@_callback("forget", _reply_none, no_error_reply=True)
def _forget(s: FuseSession, req: Any, ino: int, nlookup: int) -> None:
    s.ops.forget(ino, nlookup)


@_callback("forget_multi", _reply_none, no_error_reply=True)
def _forget_multi(s: FuseSession, req: Any, count: int, forgets: Any) -> None:
    for i in range(count):
        s.ops.forget(forgets[i].ino, forgets[i].nlookup)


@_callback("getattr", lambda req, a, *_: _reply_attr(req, a))
def _getattr(s: FuseSession, req: Any, ino: int, fi: Any) -> Attr:
    return s.ops.getattr(ino, s._caller(req))


@_callback("readlink", lambda req, target, *_: lib.fuse_reply_readlink(req, target))
def _readlink(s: FuseSession, req: Any, ino: int) -> bytes:
    return s.ops.readlink(ino, s._caller(req))


@_callback("setattr", lambda req, a, *_: _reply_attr(req, a))
def _setattr(s: FuseSession, req: Any, ino: int, attr: Any, to_set: int, fi: Any) -> Attr:
    size = attr.st_size if to_set & lib.FUSE_SET_ATTR_SIZE else None
    return s.ops.setattr(ino, size, s._caller(req))


def _reply_open(req: Any, r: OpenReply, ino: int, fi: Any) -> None:
    if r.parallel_direct_writes:
        flags = (lib.FOPEN_PARALLEL_DIRECT_WRITES
                 | lib.FOPEN_DIRECT_IO * r.direct_io | lib.FOPEN_KEEP_CACHE * r.keep_cache
                 | lib.FOPEN_NONSEEKABLE * r.nonseekable)
        sent = lib._ualinkd_reply_open_flags(req, r.fh, flags)
    else:
        fi.fh = r.fh
        fi.direct_io = r.direct_io
        fi.keep_cache = r.keep_cache
        fi.nonseekable = r.nonseekable
        sent = lib.fuse_reply_open(req, fi)
    if sent == -errno.ENOENT:
        # The caller went away before the reply: the kernel sends no release.
        s = _active
        try:
            s.ops.release(ino, r.fh)
        except BaseException as e:
            s._bug(None, "release (after aborted open)", e)


@_callback("open", _reply_open)
def _open(s: FuseSession, req: Any, ino: int, fi: Any) -> OpenReply:
    return s.ops.open(ino, fi.flags, s._caller(req))


@_callback("read", _reply_buf)
def _read(s: FuseSession, req: Any, ino: int, size: int, off: int,
          fh: int) -> bytes | Completion[Loaded]:
    r = s.ops.read(ino, fh, off, size, s._caller(req))
    if type(r) is Completion and size <= FAST_MAX and s.data_plane.running:
        # A remote load: once it is served whole, the data plane may carry the next ones
        # of its mapping (the tree says which, if it is one remote mapping).
        def learn(c: Completion[Loaded]) -> Loaded:
            got = c.result()
            if len(got) == size and (route := s.ops.read_route(fh, off, size)) is not None:
                s.data_plane.route_import(fh, *route)
            return got

        return r.then(learn)
    return r


@_callback("write", _reply_write)
def _write(s: FuseSession, req: Any, ino: int, buf: Any, size: int, off: int,
           fi: Any) -> int | Completion[int]:
    fh = fi.fh
    r = s.ops.write(ino, fh, off, ffi.buffer(buf, size)[:], s._caller(req))
    if type(r) is Completion and size <= FAST_MAX and s.data_plane.running:
        # A remote store: once it is stored whole, the data plane may carry the next ones
        # of its mapping (the tree says which, if it is one writable remote mapping).
        def learn(c: Completion[int]) -> int:
            n = c.result()
            if n == size and (route := s.ops.read_route(fh, off, size, True)) is not None:
                s.data_plane.route_import(fh, *route, write=True)
            return n

        return r.then(learn)
    return r


@ffi.def_extern()
def _op_flush(req: Any, ino: int, fi: Any) -> None:
    lib.fuse_reply_err(req, 0)


# The kernel ignores release errors: always 0.
@_callback("release", _reply_ok, no_error_reply=True)
def _release(s: FuseSession, req: Any, ino: int, fi: Any) -> None:
    s.data_plane.forget_file(fi.fh)  # its routes name the file by fh
    s.ops.release(ino, fi.fh)


def _reply_opendir(req: Any, fh: int, ino: int, fi: Any) -> None:
    fi.fh = fh
    lib.fuse_reply_open(req, fi)


@_callback("opendir", _reply_opendir)
def _opendir(s: FuseSession, req: Any, ino: int, fi: Any) -> int:
    return s.ops.opendir(ino, s._caller(req))


@_callback("readdir", lambda req, buf, *_: lib.fuse_reply_buf(req, buf[0], buf[1]))
def _readdir(s: FuseSession, req: Any, ino: int, size: int, off: int,
             fi: Any) -> tuple[Any, int]:
    entries = s.ops.readdir(ino, fi.fh, off)
    out = ffi.new("char[]", size)
    st = ffi.new("struct stat *")
    used = 0
    for name, e_ino, mode, next_off in entries:
        st.st_ino = e_ino
        st.st_mode = mode
        bname = name.encode("utf-8", "surrogateescape")
        need = lib.fuse_add_direntry(req, out + used, size - used, bname, st, next_off)
        if need > size - used:
            break
        used += need
    return out, used


@_callback("releasedir", _reply_ok, no_error_reply=True)
def _releasedir(s: FuseSession, req: Any, ino: int, fi: Any) -> None:
    s.ops.releasedir(ino, fi.fh)


@ffi.def_extern()
def _op_statfs(req: Any, ino: int) -> None:
    st = ffi.new("struct statvfs *")
    st.f_bsize = st.f_frsize = 4096
    st.f_namemax = 255
    lib.fuse_reply_statfs(req, st)


# The ioctl callback is written out rather than made by _callback, with its reply inline
# for the common answer (a tuple now): it runs for every ioctl, and _callback's cb -> body
# -> _caller chain with its *args tuples was 3 of the 19 Python calls the daemon made per
# export ioctl outside trio (cProfile). Its arguments are plain values (fuse/_build.py's
# _ualinkd_op_ioctl takes the file handle and the caller out of libfuse's, and answers
# 32-bit callers ENOSYS). Errors cross as in _callback: FuseError -> fuse_reply_err,
# anything else -> _bug (EIO).
@ffi.def_extern(name="_op_ioctl")
def _op_ioctl(req: Any, ino: int, fh: int, cmd: int, in_buf: Any, in_bufsz: int,
              out_bufsz: int, pid: int, uid: int, gid: int) -> None:
    s = _active
    try:
        r = s.ops.ioctl(ino, fh, cmd, ffi.unpack(in_buf, in_bufsz) if in_bufsz else b"",
                        out_bufsz,
                        s._callers.get((pid, uid, gid)) or s._new_caller(pid, uid, gid))
        if type(r) is tuple:  # _reply_ioctl, inline
            result, out = r
            if len(out) > out_bufsz:
                raise ValueError(f"ioctl reply has {len(out)} bytes, the caller asked {out_bufsz}")
            lib.fuse_reply_ioctl(req, result, out, len(out))
        elif isinstance(r, Completion):
            s._complete(req, "ioctl", r, _reply_ioctl, (out_bufsz,))
        else:
            _reply_ioctl(req, r, out_bufsz)
    except FuseError as e:
        lib.fuse_reply_err(req, e.errno)
    except BaseException as e:
        s._bug(req, "ioctl", e)
