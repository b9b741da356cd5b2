"""GPU loads and stores through a GpuVm (spec policy 10, §4.5, §4.6, §6.3).

`gpu_load`/`gpu_store` take the pieces `GpuVm.plan()` cut a VA range into and carry them
out with policy 10's EFAULT / short-count rule, one after another, returning a Completion
only when the fabric or a process's memory (a userptr BO, reached off the FUSE thread, whose
coroutine the edge's Spawn runs) is needed.
"""

from __future__ import annotations

import errno
import functools
from collections.abc import Callable
from typing import Any

from ..drm.completion import Completion, Spawn, done
from ..drm.errors import DrmError
from ..drm.loaded import Loaded, in_memory
from .engine import GpuFault
from .vm import GpuVm, LocalPiece, Piece, RemotePiece

__all__ = ["RemoteFn", "gpu_copy_local", "gpu_load", "gpu_store"]

# (piece, write, data for a store) -> the loaded bytes | the count stored, by callback
# (drm/completion.py); may come back short when the exporter faults part-way;
# DrmError(EFAULT) when nothing could be done.
RemoteFn = Callable[[RemotePiece, bool, bytes | None], Completion[Loaded | int]]


def _fault(va: int) -> DrmError:
    return DrmError(errno.EFAULT, f"GPU page fault at VA {va:#x}")


def _plan(vm: GpuVm, va: int, n: int, write: bool,
          on_fault: Callable[[], None]) -> tuple[list[Piece], Callable[[], None] | None]:
    """The pieces of an access and who reports a fault found later: a fault in the page
    table is reported now (EFAULT if it is at the first byte), and then not again, since
    an access faults once."""
    pieces, fault_at = vm.plan(va, n, write=write)
    if fault_at is not None:
        on_fault()
        if fault_at == va:
            raise _fault(va)
    return pieces, (on_fault if fault_at is None else None)


def gpu_load(
    vm: GpuVm, va: int, size: int, remote: RemoteFn, on_fault: Callable[[], None],
    spawn: Spawn[Any],
) -> bytes | Completion[Loaded]:
    """A GPU load of `size` bytes at `va` (policy 10): EFAULT if the first byte faults, else
    the bytes up to the first faulting page. `on_fault` runs once per faulting access;
    `spawn` runs a userptr BO's reads."""
    pieces, later_fault = _plan(vm, va, size, False, on_fault)
    if all(type(p) is LocalPiece and p.bo.userptr is None for p in pieces):
        return b"".join([p.bo.memory.read(p.bo_offset, p.length)  # type: ignore[union-attr]
                         for p in pieces])  # (all() above: every piece is a LocalPiece)
    if len(pieces) == 1 and type(piece := pieces[0]) is RemotePiece:
        return remote(piece, False, None).then(
            lambda c: _loaded(piece, _outcome(c), 0, va, later_fault))
    return _load_pieces(pieces, va, remote, spawn, later_fault)


def _part(data: bytes | bytearray, start: int, n: int) -> bytes:
    """data[start:start + n] as bytes (what the fabric's STORE takes), copied once at most
    (none for all of a bytes)."""
    if isinstance(data, bytes):
        return data[start : start + n]
    return bytes(memoryview(data)[start : start + n])


def _outcome(c: Completion[Loaded | int]) -> Loaded | int | DrmError:
    """A remote piece's answer, its DrmError as a value (what _loaded/_stored take)."""
    try:
        return c.result()
    except DrmError as e:
        return e


def _check_failed(r: DrmError, done: int) -> None:
    """Policy 10 for a piece that failed after `done` bytes of the access: a fault does
    nothing of the piece (the caller goes on with it as empty); an error other than a
    fault fails an access not yet begun."""
    if r.errno != errno.EFAULT and not done:
        raise r


def _loaded(p: RemotePiece, r: Loaded | int | DrmError, done: int, va: int,
            on_fault: Callable[[], None] | None) -> Loaded:
    """A remote piece's bytes after `done` bytes of the access (policy 10): a fault
    loads nothing from it, an error other than a fault fails an access not yet begun;
    short, it ends the access (EFAULT when nothing at all was loaded)."""
    if isinstance(r, DrmError):
        _check_failed(r, done)
        r = b""
    assert not isinstance(r, int)
    # (Never longer than asked from the fabric, whose session refuses such a DATA.)
    got = r if len(r) <= p.length else in_memory(r)[: p.length]
    if len(got) < p.length:
        _short(done + len(got), va, on_fault)
    return got


def _short(done: int, va: int, on_fault: Callable[[], None] | None) -> None:
    """A piece came back short (policy 10): count the fault unless the planner already
    did; EFAULT when nothing at all was done, else the caller stops at its short count."""
    if on_fault is not None:
        on_fault()
    if not done:
        raise _fault(va)


def _in_turn(pieces: list[Piece], start: Callable[[Piece], Completion[Any]],
             take: Callable[[Piece, Completion[Any]], bool]) -> Completion[None]:
    """The pieces of an access one after another (policy 10 stops an access at its first
    short piece, and a store must not reach past it): `start(p)` begins piece p, `take(p, c)`
    takes its outcome (raising ends the access with that error) and says whether to go on.
    A piece that waits resumes the rest from the call that completes it."""
    over: Completion[None] = Completion()

    def go(i: int) -> None:
        try:
            while i < len(pieces):
                p = pieces[i]
                c = start(p)
                if not c.done:
                    c.when_done(functools.partial(resume, i))
                    return
                if not take(p, c):
                    break
                i += 1
        except Exception as e:
            over.set_error(e)
            return
        over.set_result(None)

    def resume(i: int, c: Completion[Any]) -> None:
        try:
            more = take(pieces[i], c)
        except Exception as e:
            over.set_error(e)
            return
        if more:
            go(i + 1)
        else:
            over.set_result(None)

    go(0)
    return over


def _local(p: LocalPiece, spawn: Spawn[Any], data: bytes | bytearray | None
           ) -> Completion[Any]:
    """A local piece's load (data None) or store. Only a userptr BO can fault here, or wait
    (its process's memory, reached off the FUSE thread): the bytes up to the first page
    the process does not have readable, or the count stored up to the first it lacks
    writable (policy 10's short count)."""
    user = p.bo.userptr
    if data is None:
        return done(p.bo.memory.read(p.bo_offset, p.length)) if user is None \
            else spawn(user.read(p.bo_offset, p.length))
    if user is None:
        p.bo.memory.write(p.bo_offset, data)
        return done(p.length)
    return spawn(user.write(p.bo_offset, data))


def _load_pieces(
    pieces: list[Piece], va: int, remote: RemoteFn, spawn: Spawn[Any],
    on_fault: Callable[[], None] | None,
) -> Completion[Loaded]:
    out: list[bytes | bytearray] = []
    count = [0]  # bytes loaded so far

    def start(p: Piece) -> Completion[Any]:
        if isinstance(p, LocalPiece):
            return _local(p, spawn, None)
        return remote(p, False, None)

    def take(p: Piece, c: Completion[Any]) -> bool:
        if isinstance(p, LocalPiece):
            got: bytes | bytearray = c.result()
            if len(got) < p.length:
                _short(count[0] + len(got), va, on_fault)
        else:
            got = in_memory(_loaded(p, _outcome(c), count[0], va, on_fault))
        out.append(got)
        count[0] += len(got)
        return len(got) == p.length

    def joined(over: Completion[None]) -> Loaded:
        over.result()  # (the access's error, raised)
        return out[0] if len(out) == 1 else b"".join(out)  # one piece: its buffer, uncopied

    return _in_turn(pieces, start, take).then(joined)


def gpu_store(
    vm: GpuVm, va: int, data: bytes | bytearray, remote: RemoteFn,
    on_fault: Callable[[], None], spawn: Spawn[Any],
) -> int | Completion[int]:
    """A GPU store of `data` at `va` (policy 10): EFAULT if the first byte faults, else the
    count stored up to the first faulting page (`gpu_load`'s arguments)."""
    pieces, later_fault = _plan(vm, va, len(data), True, on_fault)
    if len(pieces) == 1 and type(piece := pieces[0]) is RemotePiece:
        return remote(piece, True, _part(data, 0, piece.length)).then(
            lambda c: _stored(piece, _outcome(c), 0, va, later_fault))
    if all(type(p) is LocalPiece and p.bo.userptr is None for p in pieces):
        mv = memoryview(data)
        done = 0
        for p in pieces:
            # all() above: every piece is a LocalPiece, which mypy cannot see
            p.bo.memory.write(p.bo_offset, mv[done : done + p.length])  # type: ignore[union-attr]
            done += p.length
        return done
    return _store_pieces(pieces, va, data, remote, spawn, later_fault)


def _store_pieces(
    pieces: list[Piece], va: int, data: bytes | bytearray, remote: RemoteFn,
    spawn: Spawn[Any], on_fault: Callable[[], None] | None,
) -> Completion[int]:
    count = [0]  # bytes stored so far

    def start(p: Piece) -> Completion[Any]:
        if isinstance(p, LocalPiece):
            # (All of it, as it is, for a store of one piece: the GPU engine's remote
            # copy stores each loaded megabyte-sized bytearray into a userptr BO.)
            whole = count[0] == 0 and p.length == len(data)
            return _local(p, spawn, data if whole else data[count[0] : count[0] + p.length])
        return remote(p, True, _part(data, count[0], p.length))

    def take(p: Piece, c: Completion[Any]) -> bool:
        if isinstance(p, LocalPiece):
            n: int = c.result()
            if n < p.length:
                _short(count[0] + n, va, on_fault)
        else:
            n = _stored(p, _outcome(c), count[0], va, on_fault)
        count[0] += n
        return n == p.length

    def counted(over: Completion[None]) -> int:
        over.result()  # (the access's error, raised)
        return count[0]

    return _in_turn(pieces, start, take).then(counted)


def _stored(p: RemotePiece, r: Loaded | int | DrmError, done: int, va: int,
            on_fault: Callable[[], None] | None) -> int:
    """The count a remote piece stored after `done` bytes of the access: `_loaded`'s rule."""
    if isinstance(r, DrmError):
        _check_failed(r, done)
        r = 0
    assert isinstance(r, int)
    n = min(r, p.length)
    if n < p.length:
        _short(done + n, va, on_fault)
    return n


async def gpu_copy_local(vm: GpuVm, dst_va: int, src_va: int, size: int,
                         on_fault: Callable[[], None]) -> bool:
    """An engine copy between a process's own memory (a userptr BO) and a local BO in one
    move: the process's pages read straight into the BO's chunks (or its memfd), or written
    straight from them (UserMemory.readv/writev: no bytes object per side, no 4 MiB
    round trip per piece). False when the copy is not of that shape (faulting, several
    pieces, the fabric): the caller copies it piece by piece. A page the process lacks
    part-way is the copy's fault at that byte (GpuFault; `on_fault` counts it)."""
    src, src_fault = vm.plan(src_va, size, write=False)
    dst, dst_fault = vm.plan(dst_va, size, write=True)
    if src_fault is not None or dst_fault is not None or len(src) != 1 or len(dst) != 1:
        return False
    s, d = src[0], dst[0]
    if type(s) is not LocalPiece or type(d) is not LocalPiece:
        return False
    if s.bo.userptr is not None and d.bo.userptr is None:
        n = await s.bo.userptr.readv(
            s.bo_offset, d.bo.memory.segments(d.bo_offset, size, write=True))
        fault_va, write = src_va + n, False
    elif s.bo.userptr is None and d.bo.userptr is not None:
        n = await d.bo.userptr.writev(
            d.bo_offset, s.bo.memory.segments(s.bo_offset, size, write=False))
        fault_va, write = dst_va + n, True
    else:
        return False
    if n < size:
        on_fault()
        raise GpuFault(fault_va, write)
    return True
