"""BoMemory: the bytes behind one buffer object, allocated lazily (spec §2.3 VRAM_CLEARED).

A BO's memory is a sparse set of fixed-size chunks, created on the first write that touches
them; a chunk never written reads as zeros, which is what VRAM_CLEARED (always forced on)
promises. A 16 GiB BO nobody writes to costs a dict. Offsets are byte offsets in the BO and
every access must lie inside it: the callers (GPU VM planner, NPA page table) check ranges
first, so an out-of-range access here is a bug and raises AssertionError.

A BO that a process CPU-maps (README, "CPU mappings") moves, once and for good, into a
sealed memfd of its size: `share()`. From then on that file *is* the BO's memory: the
client's mapping of it, GPU loads/stores (pread/pwrite at a VA) and fabric LOAD/STOREs all
reach the same pages, with nothing copied back and forth. The daemon reads and writes it
with pread/pwrite rather than mapping it: a read of a hole in a memfd returns zeros without
allocating (a read fault through a mapping would allocate the page), so a 16 GiB BO stays
sparse until something writes to it. A memfd is anonymous memory, not I/O: no call here
blocks, which keeps this module sans-IO.

A client's mapping outlives the BO (the kernel's vma holds the GEM object, and with it the
BO's memory and its VRAM/GTT charge, until the last unmap). The daemon cannot see a munmap,
but it can see the memfd's other users: every grant hands out a file description of its
own (cpumap_server.py reopens the memfd), which a mapping holds until it is unmapped and a
process's fd until it is closed, wherever they went (fork, SCM_RIGHTS). `in_use_elsewhere`
asks the kernel whether any is left: a write lease (F_SETLEASE) is granted only to the
one open description of a file. So `close()` of a BO whose memfd is still in use keeps the
memfd (and the BO's pool keeps its charge, bo.py) until that answer is no.
"""

from __future__ import annotations

import fcntl
import mmap
import os
from typing import TYPE_CHECKING

from . import translation

if TYPE_CHECKING:
    from ..drm.device import ProcessMemory, Segment

# 64 KiB chunks, measured against 4 KiB pages and 256 KiB chunks (1 MiB first write /
# rewrite / read, ms): 4 KiB 0.71/0.18/0.15, 64 KiB 0.07/0.05/0.05, 256 KiB 0.06/0.05/0.04.
# 64 KiB gets nearly all the speed while a sparse BO pays at most 60 KiB per touched spot.
CHUNK_SHIFT = 16
CHUNK = 1 << CHUNK_SHIFT


_ZEROS: dict[int, bytes] = {}


def _check_range(offset: int, n: int, size: int) -> None:
    """Callers check ranges first: an access outside the BO is a bug."""
    if offset < 0 or n < 0 or offset + n > size:
        raise AssertionError(f"BO memory access [{offset:#x}, +{n:#x}) outside "
                             f"its {size:#x} bytes")


def _zeros(n: int) -> bytes:
    z = _ZEROS.get(n)
    if z is None:
        z = _ZEROS[n] = bytes(n)
    return z


# The seals a shared BO's memfd carries before any client sees it: its size can never
# change (a client that shrank it would make the daemon's reads short and its NPA LOADs
# fault), and the seals themselves cannot be changed or removed.
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
# A LOAD answer this big is sent from a mapping of a shared BO's memfd (_mapped); a
# smaller one is read (a mapping and its unmapping cost more than a copy of a few pages).
_MAP_MIN = 64 << 10
_IO_MAX = 1 << 30  # per pread/pwrite call (Linux moves at most 0x7ffff000 bytes per call)


F_SETSIG = 10  # fcntl.h (Python's fcntl module lacks it)
SIGURG = 23  # ignored unless handled: what a lease break during the probe sends


def in_use_elsewhere(fd: int) -> bool:
    """Whether a file description of the memfd `fd` other than the one memfd_create made is
    open anywhere: a grant's (a client's fd, or the mapping that holds it), in any process,
    or in flight in a unix socket. A probe description of our own asks for a write lease,
    which the kernel grants only when the probe is the file's one open description
    (check_conflicting_open: i_writecount and i_readcount; memfd_create's own description
    counts in neither), and is closed at once, lease and all. A kernel that gives no leases
    (fs.leases-enable 0: EINVAL) cannot tell: False, so memory is given back as before."""
    try:
        probe = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except BlockingIOError:  # (someone holds a lease on it: in use)
        return True
    try:
        # A lease broken in the moment we hold it signals us: SIGURG, not SIGIO, whose
        # default would end the daemon.
        fcntl.fcntl(probe, F_SETSIG, SIGURG)
        fcntl.fcntl(probe, fcntl.F_SETLEASE, fcntl.F_WRLCK)
    except BlockingIOError:  # EAGAIN: another description is open
        return True
    except OSError:
        return False
    finally:
        os.close(probe)  # (the lease goes with it)
    return False


class BoMemory:
    __slots__ = ("_chunks", "_filled", "_shared", "_shift", "chunk", "size")

    def __init__(self, size: int, chunk: int = CHUNK) -> None:
        if size < 0 or chunk <= 0 or chunk & (chunk - 1):
            raise AssertionError(f"BoMemory({size}, chunk={chunk})")
        self.size = size
        self.chunk = chunk
        self._shift = chunk.bit_length() - 1
        self._chunks: dict[int, bytearray] = {}
        self._shared: int | None = None  # the memfd, once shared
        # A range of the memfd known to have no hole (_mapped): holes get filled, never
        # made (nothing punches one), so it stays true; it saves the SEEK_HOLE, whose
        # walk goes on to the first hole, the file's end for a BO written whole.
        self._filled = (0, 0)

    @property
    def chunks(self) -> int:
        """How many chunks hold real bytes (0 once shared: the memfd holds them)."""
        return len(self._chunks)

    @property
    def resident_bytes(self) -> int:
        if self._shared is not None:
            return os.fstat(self._shared).st_blocks * 512
        return sum(len(c) for c in self._chunks.values())

    @property
    def shared(self) -> bool:
        return self._shared is not None

    @property
    def memfd(self) -> int | None:
        """The memfd once shared (ours: a user dups it), else None."""
        return self._shared

    def share(self, name: str = "ualinkd-bo") -> int:
        """The memfd that holds this BO's bytes from now on (created, sealed and filled with
        what was written so far on the first call; the same fd after). The fd stays ours:
        callers hand out duplicates, and `close()` closes it."""
        if self._shared is None:
            translation.changed()  # the chunks (and zeros) a data-plane route may read go
            fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            try:
                os.ftruncate(fd, self.size)  # sparse: no page exists until written
                for idx, c in self._chunks.items():
                    _pwrite_all(fd, c, idx << self._shift)
                fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
            except BaseException:
                os.close(fd)
                raise
            self._chunks.clear()
            self._shared = fd
        return self._shared

    def close(self) -> int | None:
        """The BO is freed: our reference to a shared memfd goes, or, while a client still
        maps it (`in_use_elsewhere`), passes to the caller: the memfd, returned, which the
        BO's pool holds with its charge until nobody else does (MemoryPool.hold). Nobody
        but that client can reach those pages any more."""
        if self._chunks or self._shared is not None:
            # Before the bytes a data-plane route may read go. (A BO with neither: its
            # routes read zeros and hold nothing; its NPA unmap drops them.)
            translation.changed()
        self._chunks.clear()
        self._filled = (0, 0)
        if self._shared is not None:
            fd, self._shared = self._shared, None
            if in_use_elsewhere(fd):
                return fd
            os.close(fd)
        return None

    def _check(self, offset: int, n: int) -> None:
        _check_range(offset, n, self.size)

    def read(self, offset: int, n: int) -> bytes:
        self._check(offset, n)
        if n == 0:
            return b""
        if self._shared is not None:
            return _pread_all(self._shared, n, offset)
        shift, chunks = self._shift, self._chunks
        first = offset >> shift
        if first == (offset + n - 1) >> shift:
            c = chunks.get(first)
            if c is None:
                return bytes(n)
            o = offset - (first << shift)
            return bytes(c[o : o + n])
        return b"".join(self.read_views(offset, n))  # one copy

    def read_views(self, offset: int, n: int) -> list[memoryview]:
        """The bytes at [offset, offset + n) as views of the chunks (a shared zero chunk where
        nothing was written), for a reader that copies them out itself (a socket's writev).
        They see later writes to those chunks (once shared, to the memfd)."""
        self._check(offset, n)
        if self._shared is not None:
            if not n:
                return []
            view = self._mapped(offset, n) if n >= _MAP_MIN else None
            return [view if view is not None else memoryview(_pread_all(self._shared, n, offset))]
        shift, chunks, size = self._shift, self._chunks, self.chunk
        zeros = memoryview(_zeros(size))
        parts: list[memoryview] = []
        end = offset + n
        for idx in range(offset >> shift, ((end - 1) >> shift) + 1 if n else 0):
            base = idx << shift
            lo, hi = max(offset, base), min(end, base + size)
            c = chunks.get(idx)
            parts.append(zeros[: hi - lo] if c is None else memoryview(c)[lo - base : hi - base])
        return parts

    def _mapped(self, offset: int, n: int) -> memoryview | None:
        assert self._shared is not None
        view, self._filled = _mapped(self._shared, offset, n, self._filled)
        return view

    def write(self, offset: int, data: bytes | bytearray | memoryview) -> None:
        n = len(data)
        self._check(offset, n)
        if self._shared is not None:
            _pwrite_all(self._shared, data, offset)
            return
        shift, chunks, size = self._shift, self._chunks, self.chunk
        mv = memoryview(data)
        pos = 0
        while pos < n:
            idx = (offset + pos) >> shift
            base = idx << shift
            c = chunks.get(idx)
            if c is None:
                c = chunks[idx] = bytearray(min(size, self.size - base))
                translation.changed()  # a data-plane route may read this chunk as zeros
            o = offset + pos - base
            k = min(len(c) - o, n - pos)
            c[o : o + k] = mv[pos : pos + k]
            pos += k

    def segments(self, offset: int, n: int, write: bool) -> list[Segment]:
        """[offset, offset + n) for a vectored copy between the BO and a process's memory
        (UserMemory.readv/writev: one copy): views of the chunks (for a write, writable
        ones, made where nothing was written yet; for a read, zeros where nothing was),
        or once shared (memfd, offset, n), the memfd read or written in place (not
        mapped: a mapping's read fault would allocate a hole's page)."""
        if self._shared is not None:
            self._check(offset, n)
            return [(self._shared, offset, n)] if n else []
        return list(self._write_views(offset, n) if write else self.read_views(offset, n))

    def _write_views(self, offset: int, n: int) -> list[memoryview]:
        self._check(offset, n)
        shift, chunks, size = self._shift, self._chunks, self.chunk
        parts: list[memoryview] = []
        end = offset + n
        for idx in range(offset >> shift, ((end - 1) >> shift) + 1 if n else 0):
            base = idx << shift
            c = chunks.get(idx)
            if c is None:
                c = chunks[idx] = bytearray(min(size, self.size - base))
                translation.changed()  # a data-plane route may read this chunk as zeros
            parts.append(memoryview(c)[max(offset, base) - base : min(end, base + size) - base])
        return parts

    def backing(self, offset: int, n: int) -> list[tuple[int, int, bytearray | int | None]]:
        """Where the bytes of [offset, offset + n) live, whole chunks at a time, for a
        reader outside Python (the data plane, fuse/dataplane.c): (offset of the chunk,
        its length, its bytearray, or the memfd once shared, or None for a chunk never
        written, which reads as zeros). Valid until translation.changed(): a new chunk, a
        share() and close() call it."""
        self._check(offset, n)
        shift, size = self._shift, self.chunk
        out: list[tuple[int, int, bytearray | int | None]] = []
        for idx in range(offset >> shift, ((offset + n - 1) >> shift) + 1 if n else 0):
            base = idx << shift
            length = min(size, self.size - base)
            out.append((base, length, self._shared if self._shared is not None
                        else self._chunks.get(idx)))
        return out


def _mapped(fd: int, offset: int, n: int, filled: tuple[int, int]
            ) -> tuple[memoryview | None, tuple[int, int]]:
    """[offset, offset + n) of a sealed memfd as a read-only view of a mapping of it (the
    exporter's LOAD answer is copied once, into the socket, not read into a buffer first),
    or None if the range has a hole: a mapping's fault there would allocate the page that
    a pread reads as zeros. The mapping goes when the last view of it does. `filled`: a
    range known to have no hole, and the one known after this call."""
    try:
        if not filled[0] <= offset <= offset + n <= filled[1]:
            hole = os.lseek(fd, offset, os.SEEK_HOLE)
            if hole < offset + n:
                return None, filled
            filled = (offset, hole)
        base = offset - offset % mmap.ALLOCATIONGRANULARITY
        # (MAP_POPULATE: the range's pages mapped in this call, not one fault at a time.)
        m = mmap.mmap(fd, offset + n - base, mmap.MAP_SHARED | mmap.MAP_POPULATE,
                      mmap.PROT_READ, offset=base)
    except OSError:  # (ENXIO: none; ENOMEM: no room to map it now) read it instead
        return None, filled
    return memoryview(m)[offset - base :], filled


def _pread_all(fd: int, n: int, offset: int) -> bytes:
    """n bytes at `offset` of a sealed memfd of at least offset + n bytes (never short)."""
    if n <= _IO_MAX:
        data = os.pread(fd, n, offset)
    else:
        data = b"".join(os.pread(fd, min(_IO_MAX, n - k), offset + k)
                        for k in range(0, n, _IO_MAX))
    if len(data) != n:
        raise AssertionError(f"short read of a sealed BO memfd: {len(data)} of {n}")
    return data


def _pwrite_all(fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    mv = memoryview(data).cast("B")
    done = 0
    while done < len(mv):
        done += os.pwrite(fd, mv[done : done + _IO_MAX], offset + done)


def _seg_len(seg: Segment) -> int:
    return len(seg) if isinstance(seg, memoryview) else seg[2]


class UserMemory:
    """The bytes of a userptr BO (AMDGPU_GEM_USERPTR): a process's own memory at `address`,
    through the ProcessMemory the BO holds open. Accesses are awaitables (the edge reaches
    that memory off the FUSE thread) and stop at the first page that is not mapped, not
    writable for a store, or gone with the process: a short count, which a GPU access turns
    into a fault (policy 10)."""

    __slots__ = ("address", "process", "readonly", "size")

    def __init__(self, process: ProcessMemory, address: int, size: int,
                 readonly: bool = False) -> None:
        self.process = process
        self.address = address
        self.size = size
        self.readonly = readonly  # USERPTR_READONLY: the GPU mapping has no write permission

    def _check(self, offset: int, n: int) -> None:
        _check_range(offset, n, self.size)

    async def accessible(self, offset: int, n: int, write: bool) -> int:
        """How many of the n bytes at `offset` the process has mapped for the access."""
        self._check(offset, n)
        return await self.process.accessible(self.address + offset, n, write) if n else 0

    async def read(self, offset: int, n: int) -> bytes:
        """The bytes at `offset` up to the first page the process does not have readable."""
        self._check(offset, n)
        return await self.process.read(self.address + offset, n) if n else b""

    async def write(self, offset: int, data: bytes | bytearray | memoryview) -> int:
        """Store up to the first page the process does not have writable; the count."""
        self._check(offset, len(data))
        return await self.process.write(self.address + offset, bytes(data)) if len(data) else 0

    async def readv(self, offset: int, segments: list[Segment]) -> int:
        """`read` straight into `segments` (one copy); the count read."""
        self._check(offset, sum(_seg_len(s) for s in segments))
        return await self.process.readv(self.address + offset, segments) if segments else 0

    async def writev(self, offset: int, segments: list[Segment]) -> int:
        """`write` straight from `segments` (one copy); the count stored."""
        self._check(offset, sum(_seg_len(s) for s in segments))
        return await self.process.writev(self.address + offset, segments) if segments else 0

    def close(self) -> None:
        self.process.close()
