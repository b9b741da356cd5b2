"""GPU loads and stores through a GpuVm (spec policy 10, §4.5, §4.6, §6.3).

`gpu_load`/`gpu_store` take the pieces `GpuVm.plan()` cut a VA range into and carry them
out with policy 10's EFAULT / short-count rule, returning an awaitable only when the fabric
or a process's memory (a userptr BO, reached off the FUSE thread) is needed.
"""

from __future__ import annotations

import errno
from collections.abc import Awaitable, Callable

from ..drm.completion import Completion
from ..drm.errors import DrmError
from ..drm.loaded import Loaded, in_memory
from .engine import GpuFault
from .vm import GpuVm, LocalPiece, Piece, RemotePiece

__all__ = ["RemoteFn", "RemoteSoonFn", "gpu_copy_local", "gpu_load", "gpu_store"]

# (piece, write, data for a store) -> the loaded bytes | the count stored; may come back
# short when the exporter faults part-way; DrmError(EFAULT) when nothing could be done.
RemoteFn = Callable[[RemotePiece, bool, bytes | None], Awaitable[bytes | bytearray | int]]
# The same answered by callback (drm/completion.py), or None when it cannot be.
RemoteSoonFn = Callable[[RemotePiece, bool, bytes | None],
                        Completion[Loaded | int] | None]


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
    vm: GpuVm, va: int, size: int, remote: RemoteFn, on_fault: Callable[[], None], *,
    remote_soon: RemoteSoonFn | None = None,
) -> bytes | Awaitable[bytes | bytearray] | Completion[Loaded]:
    """A GPU load of `size` bytes at `va` (policy 10): EFAULT if the first byte faults, else
    the bytes up to the first faulting page. `on_fault` runs once per faulting access.
    A load of one remote piece is a Completion when `remote_soon` takes it."""
    pieces, later_fault = _plan(vm, va, size, False, on_fault)
    if all(type(p) is LocalPiece and p.bo.userptr is None for p in pieces):
        return b"".join([p.bo.memory.read(p.bo_offset, p.length)  # type: ignore[union-attr]
                         for p in pieces])  # (all() above: every piece is a LocalPiece)
    if remote_soon is not None and len(pieces) == 1 and type(piece := pieces[0]) is RemotePiece:
        c = remote_soon(piece, False, None)
        if c is not None:
            return c.then(lambda c: _loaded(piece, _outcome(c), 0, va, later_fault))
    return _load_later(pieces, va, remote, later_fault)


def _outcome(c: Completion[Loaded | int]) -> Loaded | int | DrmError:
    """A remote piece's answer, its DrmError as a value (what _loaded/_stored take)."""
    try:
        return c.result()
    except DrmError as e:
        return e


async def _answer(remote: RemoteFn, p: RemotePiece, write: bool,
                  data: bytes | None) -> bytes | bytearray | int | DrmError:
    """`_outcome` for the awaitable path."""
    try:
        return await remote(p, write, data)
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


async def _read_local(p: LocalPiece) -> bytes:
    """A local piece's bytes. Only a userptr BO can fault here (its process's memory, read
    off the FUSE thread, so this is a coroutine): then the bytes up to the first page the
    process does not have readable (policy 10's short count), empty if that is the first."""
    user = p.bo.userptr
    if user is None:
        return p.bo.memory.read(p.bo_offset, p.length)
    return await user.read(p.bo_offset, p.length)


async def _write_local(p: LocalPiece, data: bytes | memoryview) -> int:
    """Store into a local piece; the count stored (short only for a userptr BO whose
    process has a page unmapped or read-only, policy 10)."""
    user = p.bo.userptr
    if user is None:
        p.bo.memory.write(p.bo_offset, data)
        return p.length
    return await user.write(p.bo_offset, data)


async def _load_later(
    pieces: list[Piece], va: int, remote: RemoteFn, on_fault: Callable[[], None] | None
) -> bytes | bytearray:
    out: list[bytes | bytearray] = []
    done = 0
    for p in pieces:
        if isinstance(p, LocalPiece):
            got: bytes | bytearray = await _read_local(p)
            if len(got) < p.length:
                _short(done + len(got), va, on_fault)
        else:
            got = in_memory(_loaded(p, await _answer(remote, p, False, None), done, va,
                                    on_fault))
        out.append(got)
        done += len(got)
        if len(got) < p.length:
            break
    return out[0] if len(out) == 1 else b"".join(out)  # one piece: its buffer, uncopied


def gpu_store(
    vm: GpuVm, va: int, data: bytes, remote: RemoteFn, on_fault: Callable[[], None], *,
    remote_soon: RemoteSoonFn | None = None,
) -> int | Awaitable[int] | Completion[int]:
    """A GPU store of `data` at `va` (policy 10): EFAULT if the first byte faults, else the
    count stored up to the first faulting page. A store of one remote piece is a Completion
    when `remote_soon` takes it."""
    pieces, later_fault = _plan(vm, va, len(data), True, on_fault)
    if remote_soon is not None and len(pieces) == 1 and type(piece := pieces[0]) is RemotePiece:
        c = remote_soon(piece, True, data[: piece.length])
        if c is not None:
            return c.then(lambda c: _stored(piece, _outcome(c), 0, va, later_fault))
    if all(type(p) is LocalPiece and p.bo.userptr is None for p in pieces):
        mv = memoryview(data)
        done = 0
        for p in pieces:
            # all() above: every piece is a LocalPiece, which mypy cannot see
            p.bo.memory.write(p.bo_offset, mv[done : done + p.length])  # type: ignore[union-attr]
            done += p.length
        return done
    return _store_later(pieces, va, data, remote, later_fault)


async def _store_later(
    pieces: list[Piece], va: int, data: bytes, remote: RemoteFn,
    on_fault: Callable[[], None] | None,
) -> int:
    done = 0
    for p in pieces:
        chunk = data[done : done + p.length]
        if isinstance(p, LocalPiece):
            n = await _write_local(p, chunk)
            if n < p.length:
                _short(done + n, va, on_fault)
        else:
            n = _stored(p, await _answer(remote, p, True, chunk), done, va, on_fault)
        done += n
        if n < p.length:
            break
    return done


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
