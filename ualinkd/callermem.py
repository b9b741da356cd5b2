"""Caller memory for the daemon: copy_from_user / copy_to_user and userptr BOs' process
memory through /proc/<pid>/mem, never on the trio thread that serves FUSE (trio).

Touching another process's memory can block for as long as faulting its page in takes: for
ever when the page is of a file of *this* mount (the kernel sends us the FUSE READ and we are
the ones waiting: D state, DESIGN "Restricted ioctls"), a hung NFS mount, a stopped FUSE
server. So:

- a range whose mapping is a file of our own mount (its `maps` line names our mount's device;
  bind mounts in a namespace node keep it) is refused with EFAULT before anything is read;
- every access (reading `maps`, which waits for the process's mmap lock too, and the
  pread/pwrite) runs on one of `workers` threads and is waited for at most `timeout`
  seconds: past it the caller gets EFAULT and the thread is left to finish on its own,
  keeping its slot; while every slot is held by such a thread, accesses fail with EFAULT at
  once (one log line when that starts). A thread held by our own mount after a race (the
  range remapped after the check) frees itself: the trio thread is free to answer the READ.
- a small access is still a worker's, but the trio thread waits for its answer itself, for
  QUICK_WAIT (1 ms) at most, before awaiting it as any other (`run`'s `quick`); a move of
  8 MiB or more of anonymous memory is shared by two threads when two CPUs are there.
"""

from __future__ import annotations

import _thread
import contextlib
import ctypes
import errno
import fcntl
import gc
import itertools
import logging
import mmap
import os
import struct
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import outcome
import trio

from .drm.device import Segment
from .drm.errors import DrmError
from .fuse.procfd import tgid_of

log = logging.getLogger(__name__)

T = TypeVar("T")

# A page fault of resident or swapped memory takes microseconds to milliseconds; a second is
# far beyond that and still short for a client stuck behind a hung file system.
TIMEOUT = 1.0
# The longest the trio thread waits, without going back to its loop, for a small access
# (CallerMemory.run's `quick`): tens of µs when it goes well; past it, it is awaited.
QUICK_WAIT = 0.001
# Accesses up to this size are quick.
QUICK_BYTES = 64 << 10
# Threads that may be inside /proc/<pid>/mem at once: enough that a few stuck ones (each
# held by a hung mapping until it recovers) leave room for everyone else.
WORKERS = 8

Dev = tuple[int, int]  # (major, minor) of a superblock


def maps_extent(maps: str, address: int, size: int, write: bool,
                refused_dev: Dev | None = None) -> int:
    """Bytes from `address` (up to `size`) covered by consecutive mappings of `maps` (the
    text of /proc/<pid>/maps) that are readable, writable too for a write, and not of a file
    on `refused_dev`: /proc/<pid>/mem itself would read PROT_NONE pages and write read-only
    ones (FOLL_FORCE), and fault in pages of any file."""
    pos, end = address, address + size
    for line in maps.splitlines():  # ascending, non-overlapping ranges
        fields = line.split()
        if len(fields) < 5:
            continue
        lo, hi = (int(x, 16) for x in fields[0].split("-"))
        if hi <= pos:
            continue
        perms = fields[1]
        if lo > pos or perms[0] != "r" or (write and perms[1] != "w"):
            break  # a hole, or a mapping without the access
        if refused_dev is not None:
            major, _, minor = fields[3].partition(":")  # hex, as show_map_vma prints them
            if (int(major, 16), int(minor, 16)) == refused_dev:
                break  # a file of our own mount: faulting it in would ask us
        pos = hi
        if pos >= end:
            return size
    return max(0, pos - address)


# PROCMAP_QUERY (Linux 6.11, uapi linux/fs.h): one VMA of /proc/<pid>/maps by address, without
# formatting the whole file (reading a Python client's 200-line maps cost ~0.5 ms a call).
# struct procmap_query: size, query_flags, query_addr, vma_start, vma_end, vma_flags,
# vma_page_size, vma_offset, inode (u64 each), dev_major, dev_minor, vma_name_size,
# build_id_size (u32), vma_name_addr, build_id_addr (u64): 104 bytes, _IOWR('f', 17, ...).
_PROCMAP_QUERY_FMT = struct.Struct("=9Q4I2Q")
PROCMAP_QUERY = (3 << 30) | (_PROCMAP_QUERY_FMT.size << 16) | (ord("f") << 8) | 17
_VMA_READABLE, _VMA_WRITABLE = 0x01, 0x02
_query_supported = True


def _query_extent(maps_fd: int, address: int, size: int, write: bool,
                  refused: Dev | None, anonymous: list[bool] | None = None) -> int | None:
    """maps_extent() through PROCMAP_QUERY on an open maps file; None when the kernel has
    no such ioctl (then the text is read). `anonymous`, when given, gets one flag: whether
    every mapping of the extent is anonymous memory (no file: nothing past the check can
    make a copy of it fail part-way, save the process changing its own mappings)."""
    global _query_supported
    pos, end = address, address + size
    anon = True
    while pos < end:
        buf = bytearray(_PROCMAP_QUERY_FMT.pack(_PROCMAP_QUERY_FMT.size, 0, pos,
                                                *([0] * 12)))
        try:
            fcntl.ioctl(maps_fd, PROCMAP_QUERY, buf)
        except OSError as e:
            if e.errno in (errno.ENOTTY, errno.EINVAL) and pos == address:
                _query_supported = False
                return None
            break  # ENOENT: no VMA covers pos (a hole); ESRCH: the process is gone
        except OverflowError:
            break
        f = _PROCMAP_QUERY_FMT.unpack(buf)
        lo, hi, flags, dev = f[3], f[4], f[5], (f[9], f[10])
        if lo > pos or not flags & _VMA_READABLE or (write and not flags & _VMA_WRITABLE):
            break
        if refused is not None and dev == refused:
            break  # a file of our own mount: faulting it in would ask us
        anon = anon and f[8] == 0 and dev == (0, 0)  # (inode 0: no file behind it)
        pos = hi
    if anonymous is not None:
        anonymous.append(anon and pos > address)
    return min(size, max(0, pos - address))


def _extent_of(dir_fd: int, address: int, size: int, write: bool,
               refused: Dev | None, anonymous: list[bool] | None = None) -> int:
    """In a worker: the accessible prefix of [address, address + size) of the process
    (`anonymous`: _query_extent's; nothing appended when the maps text was read)."""
    if _query_supported:
        try:
            maps_fd = os.open("maps", os.O_RDONLY, dir_fd=dir_fd)
        except OSError:
            return 0  # the process is gone
        try:
            n = _query_extent(maps_fd, address, size, write, refused, anonymous)
        finally:
            os.close(maps_fd)
        if n is not None:
            return n
    return maps_extent(_read_maps(dir_fd), address, size, write, refused)


def _read_maps(dir_fd: int) -> str:
    try:
        fd = os.open("maps", os.O_RDONLY, dir_fd=dir_fd)
        with os.fdopen(fd) as f:
            return f.read()
    except OSError:
        return ""  # the process is gone: nothing is accessible


def _access(dir_fd: int, mem_fd: int, address: int, arg: int | bytes,
            refused: Dev | None) -> bytes | int:
    """In a worker: the accessible prefix of the range, then read (arg = size) or write
    (arg = data) it. Closes both fds (dups, so a BO closing meanwhile cannot reuse them)."""
    try:
        write = isinstance(arg, bytes)
        size = len(arg) if isinstance(arg, bytes) else arg
        n = _extent_of(dir_fd, address, size, write, refused)
        if isinstance(arg, bytes):
            if not n:
                return 0
            try:
                return os.pwrite(mem_fd, arg[:n], address)
            except (OSError, OverflowError):
                return 0
        if not n:
            return b""
        try:
            return os.pread(mem_fd, n, address)
        except (OSError, OverflowError):
            return b""
    finally:
        for fd in (dir_fd, mem_fd):
            with contextlib.suppress(OSError):
                os.close(fd)


# Buffers per call (the kernel's UIO_MAXIOV) and bytes per worker call: a large copy is
# several calls, each well inside TIMEOUT.
_IOV_MAX = 1024
VECTOR_BYTES = 64 << 20
# A write this big goes by process_vm_writev (_access_vector) rather than a pwrite of `mem`,
# which moves a page at a time through a bounce page: half the speed (a remote→host SDMA
# copy stores 4 MiB pieces this way: 8% of the importer's busy time, py-spy).
_VECTOR_WRITE_MIN = 64 << 10


class _Iovec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


_libc = ctypes.CDLL(None, use_errno=True)
_process_vm: dict[bool, Any] = {  # write -> the call (None: use mem)
    w: getattr(_libc, "process_vm_writev" if w else "process_vm_readv", None)
    for w in (False, True)}
for _f in _process_vm.values():
    if _f is not None:
        _f.argtypes = [ctypes.c_int, ctypes.POINTER(_Iovec), ctypes.c_ulong,
                       ctypes.POINTER(_Iovec), ctypes.c_ulong, ctypes.c_ulong]
        _f.restype = ctypes.c_ssize_t


def _len(seg: memoryview | tuple[int, int, int]) -> int:
    return len(seg) if isinstance(seg, memoryview) else seg[2]


def _alive(dir_fd: int) -> bool:
    try:
        os.stat("stat", dir_fd=dir_fd)
    except OSError:
        return False
    return True


def _bytes_base(b: memoryview) -> int | None:
    """The address of a read-only view's bytes when it is a whole `bytes` object (the
    common case: data to store), so that process_vm_writev reads it in place; None for
    any other read-only buffer (copied first: ctypes maps only writable ones)."""
    obj = b.obj
    if type(obj) is bytes and b.contiguous and b.nbytes == len(obj):
        return ctypes.cast(ctypes.c_char_p(obj), ctypes.c_void_p).value
    return None


def _address(b: memoryview) -> int:
    base = _bytes_base(b) if b.readonly else None
    return base if base is not None else ctypes.addressof(ctypes.c_char.from_buffer(b))


def _process_vm_copy(tgid: int, dir_fd: int, address: int, group: list[memoryview],
                     write: bool) -> int | None:
    """One process_vm_readv/writev between the buffers and [address, +their size) of
    `tgid`: the kernel copies straight between the two address spaces (reading
    /proc/<pid>/mem goes a page at a time through a bounce page: about half the speed).
    The pinned /proc/<tgid> directory says the process is still the one we mean, before
    the call and, for a read, after it (a pid is reused only after the whole pid space
    went round, not within a call). None when the call is not allowed here (seccomp,
    no CAP_SYS_PTRACE over the process, an old kernel): the caller uses `mem`."""
    fn = _process_vm[write]
    if fn is None or not _alive(dir_fd):
        return None if fn is None else 0
    keep = [b if not b.readonly or _bytes_base(b) is not None else memoryview(bytearray(b))
            for b in group]
    local = (_Iovec * len(keep))(*[_Iovec(_address(b), len(b)) for b in keep])
    remote = _Iovec(address, sum(len(b) for b in keep))
    n = fn(tgid, local, len(keep), ctypes.byref(remote), 1, 0)
    if n < 0:
        err = ctypes.get_errno()
        if err in (errno.ENOSYS, errno.EPERM):
            _process_vm[write] = None
            return None
        return 0
    if not write and not _alive(dir_fd):
        return 0
    return int(n)


# A move at least this big, of anonymous memory, goes in two halves on two threads when two
# CPUs are there (_split_move): process_vm_readv/writev copies at about 0.65 of a memcpy's
# speed on one thread (it pins each page before copying it; a C floor: 64 MiB in 20 ms
# against memcpy's 13 ms), and two threads move 64 MiB in 10.5 ms.
SPLIT_MIN = 8 << 20
SPLIT_PIECE = 4 << 20  # what each of the two threads takes at a time
splits = 0  # moves done in two halves (for tests)


def _cpus() -> int:
    """The CPUs this thread may run on (a pinned daemon: one, and a split would only add a
    thread's wake-up)."""
    try:
        return len(os.sched_getaffinity(0))
    except OSError:
        return 1


def _pieces(views: list[memoryview], size: int) -> list[list[memoryview]]:
    """The views cut into consecutive pieces of `size` bytes (the last one shorter), in one
    pass over them."""
    out: list[list[memoryview]] = []
    piece: list[memoryview] = []
    room = size
    for v in views:
        while len(v) >= room:
            piece.append(v[:room])
            out.append(piece)
            v, piece, room = v[room:], [], size
        if v:
            piece.append(v)
            room -= len(v)
    if piece:
        out.append(piece)
    return out


def _split_move(tgid: int, dir_fd: int, address: int, views: list[memoryview],
                write: bool) -> int | None:
    """_process_vm_copy of `views` by two threads at once, this one and a helper made for
    it (a helper stuck in a hostile mapping holds nobody else up, and its worker is bounded
    as any other), in SPLIT_PIECE pieces each takes in turn: a thread that gets less of a
    CPU (another process on the second one) moves fewer pieces instead of holding up the
    end. The count is that of the pieces in order up to the first short one, as one move
    would have stopped (policy 10): the extent checked before is anonymous memory, which
    only the process changing its own mappings under the copy can make fail part-way, and
    then the bytes past that point are as undefined as a GPU copy's into memory its owner
    unmaps."""
    global splits
    want = sum(len(v) for v in views)
    starts = list(range(0, want, SPLIT_PIECE))
    pieces = _pieces(views, SPLIT_PIECE)
    results: list[int | None] = [-1] * len(starts)  # -1: not moved
    taken = itertools.count()  # (next() is atomic under the GIL: each piece taken once)
    stop = threading.Event()

    def mover() -> None:
        while not stop.is_set() and (i := next(taken)) < len(starts):
            at = starts[i]
            n = min(SPLIT_PIECE, want - at)
            got = _process_vm_copy(tgid, dir_fd, address + at, pieces[i], write)
            results[i] = got
            if got is None or got < n:
                stop.set()  # (no piece after it counts: none is taken any more)

    helped = threading.Lock()
    helped.acquire()

    def helper() -> None:
        try:
            mover()
        finally:
            helped.release()

    # (_thread's start does not wait for the new thread to run, as Thread.start does: on a
    # busy machine that wait, for a CPU and the GIL, held this one up for 1-2 ms)
    try:
        _thread.start_new_thread(helper, ())
    except RuntimeError:  # (no thread to be had now: one move, as on one CPU)
        return _process_vm_copy(tgid, dir_fd, address, views, write)
    mover()
    helped.acquire()
    splits += 1
    done = 0
    for at, got in zip(starts, results, strict=True):
        if got is None:
            return None  # process_vm_* not allowed here: the caller moves it all by mem
        if got < 0:  # (pieces are taken in order: one before this one stopped the move)
            return done
        done += got
        if got < min(SPLIT_PIECE, want - at):
            break
    return done


_ZERO_PIECE = 4 << 20
_zeros = threading.local()


def _zero_buffer() -> memoryview:
    buf = getattr(_zeros, "buf", None)
    if buf is None:  # (per worker thread; only ever read)
        buf = _zeros.buf = memoryview(bytearray(_ZERO_PIECE))
    return buf


def _file_ranges(fd: int, off: int, n: int) -> list[tuple[int, int, bool]]:
    """[off, off + n) of a memfd as (start, end, holds data) ranges (SEEK_DATA/SEEK_HOLE;
    the daemon reads and writes memfds with pread/pwrite, so moving the shared offset is
    harmless)."""
    out: list[tuple[int, int, bool]] = []
    pos, end = off, off + n
    while pos < end:
        try:
            data = min(os.lseek(fd, pos, os.SEEK_DATA), end)
        except OSError:  # ENXIO: only a hole from here
            data = end
        if data > pos:
            out.append((pos, data, False))
        if data >= end:
            break
        try:
            hole = min(os.lseek(fd, data, os.SEEK_HOLE), end)
        except OSError:
            hole = end
        out.append((data, hole, True))
        pos = hole
    return out


# madvise(2) advice numbers (Linux 5.14; Python 3.11's mmap has no names for them): fault a
# range's pages in at once, for reading or for writing.
_MADV_POPULATE_READ, _MADV_POPULATE_WRITE = 22, 23


Span = tuple[int, int]  # [start, end) of a memfd


def _within(span: Span, lo: int, hi: int) -> bool:
    return span[0] <= lo and hi <= span[1]


def _joined(span: Span, lo: int, hi: int) -> Span:
    """`span` grown by [lo, hi) when they touch, else [lo, hi) (the newest wins)."""
    return (min(span[0], lo), max(span[1], hi)) if lo <= span[1] and span[0] <= hi else (lo, hi)


class _Kept:
    """One kept mapping of a memfd and what is known of it: the span whose pages it has
    mapped for reading and for writing (populated once, not again for each copy: a
    MADV_POPULATE of 64 MiB already mapped walks 16,384 pages, 2-3 ms a copy), and a span
    known to hold no hole (a SEEK_HOLE walks every page to the first hole: 0.7 ms for
    64 MiB). Both only grow: nothing here punches a hole, and a page the kernel takes
    back (swap, a client's hole punch) is faulted in again by the copy, only slower.
    Updated by several workers without a lock: a lost update costs one populate more."""

    __slots__ = ("filled", "last", "map", "read", "users", "written")

    def __init__(self, m: mmap.mmap) -> None:
        self.map = m
        self.users = 0
        self.last = 0.0
        self.read: Span = (0, 0)
        self.written: Span = (0, 0)
        self.filled: Span = (0, 0)

    def populate(self, lo: int, hi: int, write: bool) -> None:
        """[lo, hi) of the mapping faulted in for the access, unless it already was."""
        if _within(self.written, lo, hi) or (not write and _within(self.read, lo, hi)):
            return
        _populate(self.map, lo, hi - lo, write)
        if write:  # (its pages exist now: data, no hole)
            self.written = _joined(self.written, lo, hi)
            self.filled = _joined(self.filled, lo, hi)
        else:
            self.read = _joined(self.read, lo, hi)

    def data_ranges(self, fd: int, off: int, n: int) -> list[tuple[int, int, bool]]:
        """_file_ranges, without the walk over a span known to hold no hole."""
        if _within(self.filled, off, off + n):
            return [(off, off + n, True)]
        ranges = _file_ranges(fd, off, n)
        for lo, hi, data in ranges:
            if data:
                self.filled = _joined(self.filled, lo, hi)
        return ranges


class _Mappings:
    """Mappings of shared BOs' memfds (whole, MAP_SHARED, read-write) kept across the
    accesses of the workers: mapping a 64 MiB BO with MAP_POPULATE and unmapping it again
    cost about as much CPU as the copy itself (py-spy of `sdma_bench local`: 9% against
    8%), for every copy. Keyed by the memfd's inode (which cannot be reused while a mapping
    holds its file); an entry no worker uses is unmapped KEEP seconds after its last use by
    a reaper thread that runs only while entries exist. So a freed BO's pages outlive it by
    at most about KEEP. A mapping is of the BO's own file description (a dup of it), which
    memory.py's in_use_elsewhere() does not count as another user."""

    KEEP = 0.5  # s

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._maps: dict[tuple[int, int], _Kept] = {}
        self._reaper = False

    def acquire(self, fd: int) -> tuple[tuple[int, int], _Kept] | None:
        """A mapping of the whole memfd, held until release(key); None when it cannot be
        mapped (the caller maps the range itself)."""
        try:
            st = os.fstat(fd)
        except OSError:
            return None
        key = (st.st_dev, st.st_ino)
        with self._lock:
            e = self._maps.get(key)
            if e is not None:
                e.users += 1
                return key, e
        if not st.st_size:
            return None
        try:
            m = mmap.mmap(fd, st.st_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except (OSError, ValueError):
            return None
        with self._lock:
            e = self._maps.get(key)
            if e is None:
                e = self._maps[key] = _Kept(m)
                if not self._reaper:
                    self._reaper = True
                    threading.Thread(target=self._reap, name="ualinkd-bo-maps",
                                     daemon=True).start()
            e.users += 1
        if e.map is not m:  # (another worker mapped it meanwhile)
            m.close()
        return key, e

    def release(self, key: tuple[int, int]) -> None:
        with self._lock:
            e = self._maps[key]
            e.users -= 1
            e.last = time.monotonic()

    def _reap(self) -> None:
        while True:
            time.sleep(self.KEEP / 2)
            now = time.monotonic()
            with self._lock:
                old = [k for k, e in self._maps.items()
                       if not e.users and now - e.last >= self.KEEP]
                done = [self._maps.pop(k) for k in old]
            collected = False
            for e in done:
                try:
                    e.map.close()
                    continue
                except BufferError:
                    pass
                # A view of it is still alive: most likely in a reference cycle (a copy that
                # failed keeps its exception, whose traceback holds the frame with the view),
                # which an idle daemon's collector may not look at for hours, the BO's pages
                # and the memfd's fd held all that time (a CI run saw the fd outlive 20 s).
                # One collection; a view still alive after it unmaps the mapping at its end.
                if not collected:
                    gc.collect()
                    collected = True
                with contextlib.suppress(BufferError):
                    e.map.close()
            with self._lock:
                last = self._reaper = bool(self._maps)
            if not last:
                return

    def __len__(self) -> int:
        with self._lock:
            return len(self._maps)


_MAPPINGS = _Mappings()


def _populate(m: mmap.mmap, start: int, length: int, write: bool) -> None:
    """Fault [start, +length) of a mapping in at once (one call, not a fault per page);
    a kernel without MADV_POPULATE_* faults them in as they are touched."""
    with contextlib.suppress(OSError, ValueError):
        m.madvise(_MADV_POPULATE_WRITE if write else _MADV_POPULATE_READ, start, length)


def _file_segment(fd: int, off: int, n: int, write: bool,
                  move: Callable[[list[memoryview], int], int]) -> int:
    """Move [off, off + n) of a memfd (a shared BO, sealed against shrinking: no SIGBUS)
    to (write) or from the process, through a mapping of it (_Mappings'): one copy. Toward
    the process, holes are sent from a zero buffer rather than read through the mapping (a
    read fault there would allocate the BO's page). `move(views, at)` moves to/from the
    process at byte `at` of the access; the count moved."""
    done = 0
    held = _MAPPINGS.acquire(fd)
    kept = held[1] if held is not None else None
    try:
        ranges = ([(off, off + n, True)] if not write
                  else _file_ranges(fd, off, n) if kept is None else kept.data_ranges(fd, off, n))
        for lo, hi, data in ranges:
            if not data:
                zeros = _zero_buffer()
                for pos in range(lo, hi, _ZERO_PIECE):
                    k = min(_ZERO_PIECE, hi - pos)
                    got = move([zeros[:k]], done)
                    done += got
                    if got < k:
                        return done
                continue
            base = lo & ~(mmap.PAGESIZE - 1)
            if kept is None:
                m = mmap.mmap(fd, hi - base, mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
                              mmap.PROT_READ | mmap.PROT_WRITE, offset=base)
            else:
                m = kept.map
                kept.populate(base, hi, not write)
                base = 0
            try:
                view = memoryview(m)
                try:
                    got = move([view[lo - base : hi - base]], done)
                finally:
                    with contextlib.suppress(BufferError):
                        view.release()
            finally:
                if kept is None:
                    with contextlib.suppress(BufferError):
                        m.close()
            done += got
            if got < hi - lo:
                return done
        return done
    finally:
        if held is not None:
            _MAPPINGS.release(held[0])


def _access_vector(tgid: int, dir_fd: int, mem_fd: int, address: int,
                   segments: list[Segment], write: bool, refused: Dev | None) -> int:
    """In a worker: the accessible prefix of the range the segments cover, then one copy
    between it and the buffers (process_vm_readv/writev, else preadv/pwritev of `mem`):
    no intermediate bytes object; a file segment (a shared BO's memfd) through a mapping
    of it (_file_segment). The count moved (short at the first
    inaccessible page). Closes both fds and the segments' fds (duplicates)."""
    try:
        size = sum(len(b) if isinstance(b, memoryview) else b[2] for b in segments)
        anonymous: list[bool] = []
        n = _extent_of(dir_fd, address, size, write, refused, anonymous)
        # Two threads per big move when the whole extent is the process's anonymous memory
        # and this thread may run on two CPUs (_split_move)
        split = n >= SPLIT_MIN and anonymous == [True] and _cpus() >= 2
        done = 0

        def move(views: list[memoryview], at: int) -> int:
            want = sum(len(v) for v in views)
            got = (_split_move(tgid, dir_fd, at, views, write) if split and want >= SPLIT_MIN
                   else _process_vm_copy(tgid, dir_fd, at, views, write))
            if got is None:
                try:
                    got = (os.pwritev(mem_fd, views, at) if write
                           else os.preadv(mem_fd, views, at))
                except (OSError, OverflowError):
                    got = 0
            return min(got, want)

        batch: list[memoryview] = []
        batched = 0  # bytes in batch (a sum over it per segment was quadratic: 1024 chunks
        # of a 64 MiB BO cost 35 ms of Python, twice the copy)
        for seg in [*segments, None]:
            if batch and (seg is None or not isinstance(seg, memoryview)
                          or len(batch) == _IOV_MAX):
                got = move(batch, address + done)
                done += got
                want, batch, batched = batched, [], 0
                if got < want:
                    return done
            if seg is None or done >= n:
                break
            if isinstance(seg, memoryview):
                view = seg[: n - done - batched]
                if view:  # (none past the accessible prefix: an empty buffer has no address)
                    batch.append(view)
                    batched += len(view)
                continue
            fd, off, length = seg
            k = min(length, n - done)
            start = address + done

            def move_at(views: list[memoryview], at: int, start: int = start) -> int:
                return move(views, start + at)

            got = _file_segment(fd, off, k, write, move_at)
            done += got
            if got < k:
                return done
        return done
    finally:
        for fd in (dir_fd, mem_fd, *(b[0] for b in segments if not isinstance(b, memoryview))):
            with contextlib.suppress(OSError):
                os.close(fd)


def _extent(dir_fd: int, mem_fd: int, address: int, size: int, write: bool,
            refused: Dev | None) -> int:
    """In a worker: maps_extent of the process behind `dir_fd` (closes both fds)."""
    try:
        return _extent_of(dir_fd, address, size, write, refused)
    finally:
        for fd in (dir_fd, mem_fd):
            with contextlib.suppress(OSError):
                os.close(fd)


def _open_thread(tid: int) -> tuple[int, int]:
    """/proc/<tid> and its mem: a thread's directory shows its process's address space."""
    dir_fd = os.open(f"/proc/{tid}", os.O_RDONLY | os.O_DIRECTORY)
    try:
        return dir_fd, os.open("mem", os.O_RDWR, dir_fd=dir_fd)
    except OSError:
        os.close(dir_fd)
        raise


def _one_shot(dir_fd: int, address: int, arg: int | bytes,
              refused: Dev | None) -> bytes | int:
    """In a worker: one access through the pinned /proc/<tid> directory `dir_fd` (closed
    here). Once that thread has exited, opening its `mem` fails, even if its id has been
    given to another thread since: the access reaches nobody else's memory."""
    try:
        mem_fd = os.open("mem", os.O_RDWR, dir_fd=dir_fd)
    except OSError:
        os.close(dir_fd)
        return 0 if isinstance(arg, bytes) else b""
    return _access(dir_fd, mem_fd, address, arg, refused)


def _pin_caller(tid: int) -> int:
    """/proc/<tid> of a caller, opened while its request is in progress, when the thread
    cannot have exited: FUSE holds it until we answer, even past SIGKILL. (A worker that
    opened it by number later, after an interrupted request was answered, could find the
    id given to another process.) EFAULT when it is gone."""
    try:
        return os.open(f"/proc/{tid}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        raise DrmError(errno.EFAULT, f"no thread {tid}") from None


class CallerMemory:
    """The daemon's one way into its callers' memory (see the module docstring). Set
    `own_dev` to the mount's device once it is mounted: ranges mapping its files are
    refused."""

    def __init__(self, timeout: float = TIMEOUT, workers: int = WORKERS) -> None:
        self.timeout = timeout
        self.own_dev: Dev | None = None
        self._limiter = trio.CapacityLimiter(workers)
        self._exhausted_reported = False
        self._timeout_reported = False
        self._stuck = 0
        self._processes: dict[int, _PinnedProcess] = {}

    @property
    def stuck(self) -> int:
        """Workers still inside an access that outlived its deadline."""
        return self._stuck

    async def run(self, fn: Callable[..., T], *args: object,
                  unstarted: Callable[[], None] | None = None, quick: bool = False) -> T:
        """`fn(*args)` on a worker, at most `timeout` seconds in all (waiting for a free
        worker included): EFAULT past it, and at once when every worker is stuck in an
        access that outlived its deadline. Busy workers are waited for; stuck ones are not.
        `unstarted` runs, once, in place of `fn` when `fn` never runs (to close what `fn`
        would have closed).

        `quick`: a small access, which a worker does in a few µs. The trio thread waits
        for it without going back to its loop, for QUICK_WAIT at most, and only then as
        any other access (in trio, up to `timeout`): the worker hands the answer straight
        back, instead of the thread's report through trio's wake-up, the scheduler's pass
        and the task's resumption (a small access 30-40 µs instead of 110-130 µs on an
        idle machine; 300-900 µs per access of an SDMA submission's ring, fence and rptr
        in a loaded daemon). Never while a worker is stuck (a client whose memory hangs
        would cost every access QUICK_WAIT of the whole daemon), nor while every worker
        is busy."""
        if self._stuck >= self._limiter.total_tokens:
            if unstarted is not None:
                unstarted()
            if not self._exhausted_reported:
                self._exhausted_reported = True
                log.warning("caller memory: all %d workers are stuck in accesses that do "
                            "not finish (a hung file system mapped by a client?); refusing "
                            "caller memory with EFAULT until one returns",
                            self._limiter.total_tokens)
            raise DrmError(errno.EFAULT, "every caller-memory worker is stuck")
        borrower = object()
        finished = trio.Event()
        box: dict[str, object] = {}
        token = trio.lowlevel.current_trio_token()
        handover = threading.Lock()  # the quick wait's: who takes the answer
        answered = threading.Event()  # set for a waiter still waiting in the trio thread

        def start() -> T:  # on the worker: an access given up before it began never begins
            if box.get("abandoned"):
                if unstarted is not None:
                    unstarted()
                raise DrmError(errno.EFAULT, "caller memory access given up before it began")
            return fn(*args)

        def report(result: outcome.Outcome[T]) -> None:  # on the trio thread
            box["result"] = result
            self._limiter.release_on_behalf_of(borrower)
            if box.get("abandoned"):
                self._unstuck()
            finished.set()

        def deliver(result: outcome.Outcome[T]) -> None:  # on the worker, when fn returns
            with handover:
                if box.get("quick") and not box.get("awaited"):  # the trio thread waits
                    box["result"] = result
                    answered.set()
                    return
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(report, result)

        def launch() -> bool:  # its worker token held: the access on a worker thread
            try:
                trio.lowlevel.start_thread_soon(lambda: start(), deliver)
            except BaseException:
                self._limiter.release_on_behalf_of(borrower)
                raise
            return True

        launched = False
        if quick and not self._stuck:
            try:
                self._limiter.acquire_on_behalf_of_nowait(borrower)
            except trio.WouldBlock:
                pass
            else:
                box["quick"] = True
                launched = launch()
                answered.wait(QUICK_WAIT)
                with handover:
                    if "result" not in box:
                        box["awaited"] = True  # (its answer comes as any other's: report)
                if "result" in box:
                    self._limiter.release_on_behalf_of(borrower)
                    return box["result"].unwrap()  # type: ignore[attr-defined]  # an Outcome
        try:
            with trio.move_on_after(self.timeout):
                if not launched:
                    await self._limiter.acquire_on_behalf_of(borrower)  # a busy one frees soon
                    launched = launch()
                await finished.wait()
        finally:
            if not launched and unstarted is not None:
                unstarted()
            if launched and not finished.is_set():  # past the deadline, or interrupted:
                box["abandoned"] = True  # the thread keeps its worker until fn returns
                self._stuck += 1
        if finished.is_set():
            return box["result"].unwrap()  # type: ignore[attr-defined]  # the Outcome above
        if not self._timeout_reported:
            self._timeout_reported = True
            log.warning("caller memory: an access did not finish in %.1f s: EFAULT; its "
                        "worker is left to finish (%d of %d stuck)", self.timeout,
                        self._stuck, self._limiter.total_tokens)
        raise DrmError(errno.EFAULT, f"caller memory access took over {self.timeout} s")

    def _unstuck(self) -> None:
        self._stuck -= 1
        if not self._stuck:
            self._exhausted_reported = self._timeout_reported = False  # all recovered

    # -- the injected functions (drm.device's CopyFromUser, CopyToUser, OpenProcessMemory) --
    async def copy_from_user(self, pid: int, address: int, size: int) -> bytes:
        """copy_from_user for ioctls with user pointers: EFAULT unless all `size` bytes are
        mapped readable (not from our own mount) and read."""
        if size == 0:
            return b""
        dir_fd = _pin_caller(pid)
        data = await self.run(_one_shot, dir_fd, address, size, self.own_dev,
                              unstarted=lambda: os.close(dir_fd), quick=size <= QUICK_BYTES)
        # _one_shot returns bytes for a size (an int count for data to write)
        if len(data) != size:  # type: ignore[arg-type]
            raise DrmError(errno.EFAULT, f"bad user address {address:#x}")
        return data  # type: ignore[return-value]

    async def copy_to_user(self, pid: int, address: int, data: bytes) -> None:
        """copy_to_user: EFAULT unless every byte lands in a writable mapping."""
        if not data:
            return
        dir_fd = _pin_caller(pid)
        if await self.run(_one_shot, dir_fd, address, data, self.own_dev,
                          unstarted=lambda: os.close(dir_fd),
                          quick=len(data) <= QUICK_BYTES) != len(data):
            raise DrmError(errno.EFAULT, f"bad user address {address:#x}")

    def open_process(self, tid: int) -> ProcMemory:
        """A handle on the memory of `tid`'s process. Every handle on one live process
        shares one pair of fds (a client with many userptr BOs costs the daemon two fds, not
        two per BO); a process that has exited since gets a new pair."""
        # FUSE reports the calling thread; the memory is its process's, which outlives the
        # thread. The thread is blocked in our ioctl, so its process cannot go away (and its
        # pid be reused) between reading Tgid and opening /proc/<tgid>.
        try:
            tgid = tgid_of(tid)
            if tgid is None:
                raise OSError(errno.ESRCH, "gone")
            pinned = self._processes.get(tgid)
            if pinned is None or not pinned.alive():
                pinned = self._processes[tgid] = _PinnedProcess(tgid, *_open_thread(tgid))
        except (OSError, StopIteration, ValueError):
            raise DrmError(errno.EFAULT, f"no process for thread {tid}") from None
        pinned.refs += 1
        return ProcMemory(pinned, self)

    def _unpin(self, pinned: _PinnedProcess) -> None:
        pinned.refs -= 1
        if pinned.refs == 0:
            if self._processes.get(pinned.tgid) is pinned:
                del self._processes[pinned.tgid]
            for fd in (pinned.mem, pinned.dir):
                with contextlib.suppress(OSError):
                    os.close(fd)

    @property
    def pinned_processes(self) -> int:
        return len(self._processes)


class _PinnedProcess:
    """A directory fd of /proc/<tgid>, which pins that process (once it exits, opening
    anything in it fails, even if its pid is reused), and its `mem`; `refs` counts the open
    ProcMemory handles (CallerMemory owns it)."""

    __slots__ = ("dir", "mem", "refs", "tgid")

    def __init__(self, tgid: int, dir_fd: int, mem_fd: int) -> None:
        self.tgid, self.dir, self.mem, self.refs = tgid, dir_fd, mem_fd, 0

    def alive(self) -> bool:
        try:
            os.stat("stat", dir_fd=self.dir)
        except OSError:
            return False
        return True


class ProcMemory:
    """drm.device.ProcessMemory through /proc (a handle on a _PinnedProcess). Opening
    reads no caller memory, so it happens on the caller's request; every access goes through
    the CallerMemory's workers, on duplicates of the pinned fds."""

    def __init__(self, pinned: _PinnedProcess, owner: CallerMemory) -> None:
        self._owner = owner
        self._pinned: _PinnedProcess | None = pinned

    def _fds(self) -> tuple[int, int]:
        if self._pinned is None:
            raise DrmError(errno.EFAULT, "the process memory is closed")
        return os.dup(self._pinned.dir), os.dup(self._pinned.mem)

    async def accessible(self, address: int, size: int, write: bool) -> int:
        return await self._owner.run(_extent, *self._fds(), address, size, write,
                                     self._owner.own_dev, quick=True)

    # _access returns bytes for a size and the count written for data (one worker function).
    async def read(self, address: int, n: int) -> bytes:
        return await self._owner.run(_access, *self._fds(), address, n,  # type: ignore[arg-type]
                                     self._owner.own_dev, quick=n <= QUICK_BYTES)

    async def write(self, address: int, data: bytes) -> int:
        if len(data) >= _VECTOR_WRITE_MIN:  # (straight from the buffer: process_vm_writev)
            return await self._vector(address, [memoryview(bytes(data))], True)
        return await self._owner.run(_access, *self._fds(), address, bytes(data),  # type: ignore[arg-type]
                                     self._owner.own_dev, quick=True)

    async def readv(self, address: int, segments: list[Segment]) -> int:
        return await self._vector(address, segments, False)

    async def writev(self, address: int, segments: list[Segment]) -> int:
        return await self._vector(address, segments, True)

    async def _vector(self, address: int, segments: list[Segment], write: bool) -> int:
        """Up to VECTOR_BYTES of segments per worker call; stops at the first short one.
        A file segment's fd is duplicated for the worker now, while it is surely the
        BO's (the BO may be freed, and its fd number reused, before the worker runs)."""
        pieces: list[Segment] = []
        for seg in segments:
            if isinstance(seg, memoryview):
                pieces.append(seg)
            else:
                fd, off, length = seg
                pieces += [(fd, off + k, min(VECTOR_BYTES, length - k))
                           for k in range(0, length, VECTOR_BYTES)]
        done, i = 0, 0
        while i < len(pieces):
            group: list[Segment] = []
            size = 0
            while i < len(pieces) and (not group or size + _len(pieces[i]) <= VECTOR_BYTES):
                group.append(pieces[i])
                size += _len(pieces[i])
                i += 1
            assert self._pinned is not None  # (_fds() checked)
            dir_fd, mem_fd = self._fds()
            dups = [b if isinstance(b, memoryview) else (os.dup(b[0]), b[1], b[2])
                    for b in group]

            def unstarted(dups: list[Segment] = dups, fds: tuple[int, int] = (dir_fd, mem_fd),
                          ) -> None:
                for fd in (*fds, *(b[0] for b in dups if not isinstance(b, memoryview))):
                    with contextlib.suppress(OSError):
                        os.close(fd)

            n = await self._owner.run(_access_vector, self._pinned.tgid, dir_fd, mem_fd,
                                      address + done, dups, write, self._owner.own_dev,
                                      unstarted=unstarted)
            done += n
            if n < size:
                break
        return done

    def close(self) -> None:
        if self._pinned is not None:
            self._owner._unpin(self._pinned)
            self._pinned = None
