"""`ualinkd replay`: the edge that re-issues a recorded session as a real client — files
opened through the node's mount, ioctl(2) called through libc with the replayer's own memory
behind each pointer, GPU loads and stores as pread/pwrite — and prints where the answers differ
from the recording (the planning and comparing are `replay/session.py`'s)."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import stat
import struct
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, BinaryIO, TextIO

from .session import (
    MAX_USER_PAGES,
    Call,
    CloseCall,
    Difference,
    GpuCall,
    IoctlCall,
    OpenCall,
    Outcome,
    RecordingError,
    Replay,
    Skip,
    device_path,
    index_records,
    queue_summary,
    refuse_unreplayable,
    timeline,
)

_libc = ctypes.CDLL(None, use_errno=True)
_ioctl = _libc.ioctl
_ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
_ioctl.restype = ctypes.c_int
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_mmap = _libc.mmap
_mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                  ctypes.c_long]
_mmap.restype = ctypes.c_void_p
_munmap = _libc.munmap
_munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_munmap.restype = ctypes.c_int
# <sys/mman.h>: a private anonymous mapping at exactly the address asked, never over one
# that is there (MAP_FIXED_NOREPLACE: EEXIST), reserving no swap for pages never touched.
_MAP_ANON_FIXED = 0x02 | 0x20 | 0x4000 | 0x100000  # PRIVATE|ANONYMOUS|NORESERVE|FIXED_NOREPLACE
_PROT_RW = 0x1 | 0x2
_MAP_FAILED = ctypes.c_void_p(-1).value
PAGE = os.sysconf("SC_PAGE_SIZE")

# openat2(2) (Linux 5.6; the same number on every architecture but alpha) and its
# <linux/openat2.h> flags: RESOLVE_BENEATH refuses a walk leaving the directory (`..`, an
# absolute path or symlink), RESOLVE_NO_SYMLINKS any symlink on the way.
SYS_OPENAT2 = 437
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08


def open_beneath(dir_fd: int, path: str, flags: int) -> int:
    """open(2) of `path` under the directory `dir_fd`, never outside it and through no
    symlink: openat2 with RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS, or where the kernel (or a
    seccomp filter) lacks it, one openat(O_NOFOLLOW) per component. OSError as open's."""
    how = struct.pack("=QQQ", flags | os.O_CLOEXEC, 0, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)
    # (syscall(2) is variadic: each argument passed as the long the kernel reads)
    fd = _syscall(ctypes.c_long(SYS_OPENAT2), ctypes.c_long(dir_fd), ctypes.c_char_p(path.encode()),
                  ctypes.c_char_p(how), ctypes.c_size_t(len(how)))
    if fd >= 0:
        return int(fd)
    err = ctypes.get_errno()
    if err not in (errno.ENOSYS, errno.EPERM):  # EPERM: a container's seccomp default
        raise OSError(err, os.strerror(err), path)
    *dirs, name = path.split("/")
    if any(c in ("", ".", "..") for c in (*dirs, name)):
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), path)
    at = dir_fd
    try:
        for c in dirs:
            try:
                sub = os.open(c, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                              dir_fd=at)
            except NotADirectoryError:  # a symlink: ELOOP, as openat2 says
                if stat.S_ISLNK(os.lstat(c, dir_fd=at).st_mode):
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path) from None
                raise
            if at != dir_fd:
                os.close(at)
            at = sub
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=at)
    finally:
        if at != dir_fd:
            os.close(at)


class Issuer:
    """Issues planned calls; `mounts` maps a recorded node name to a mount ("" = default).
    A file is opened only by a name a node's mount serves (`device_path`), under the
    mount's directory and through no symlink (`open_beneath`)."""

    def __init__(self, mounts: dict[str, str]) -> None:
        self.mounts = mounts
        self.fds: dict[tuple[str, int], int] = {}
        self.dir_fds: dict[str, int] = {}  # mount -> an O_PATH fd of its directory
        self.user_ranges: list[tuple[int, int]] = []  # (start, end) of zero pages mapped

    def mount_for(self, node: str) -> str:
        m = self.mounts.get(node, self.mounts.get(""))
        if m is None:
            raise KeyError(node)
        return m

    def _open(self, call: OpenCall) -> int:
        if not device_path(call.path):  # (a token the recording named: dmabuf/-1)
            raise OSError(errno.ENOENT, os.strerror(errno.ENOENT), call.path)
        mount = self.mount_for(call.node)
        if mount not in self.dir_fds:
            self.dir_fds[mount] = os.open(mount, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        return open_beneath(self.dir_fds[mount], call.path, os.O_RDWR)

    def issue(self, call: Call) -> Outcome:
        if isinstance(call, OpenCall):
            try:
                fd = self._open(call)
            except OSError as e:
                return Outcome(-(e.errno or 5))
            self.fds[call.file] = fd
            return Outcome(0, fd=fd)
        if isinstance(call, CloseCall):
            closing = self.fds.pop(call.file, None)
            if closing is not None:
                os.close(closing)
            return Outcome(0)
        if isinstance(call, GpuCall):
            fd = self.fds[call.file]
            try:
                if call.op == "load":
                    data = os.pread(fd, call.length, call.va)
                    return Outcome(len(data), data=data)
                return Outcome(os.pwrite(fd, call.data, call.va))
            except OSError as e:
                return Outcome(-(e.errno or 5))
        return self._ioctl(call)

    def user_pages(self, addr: int, size: int) -> str | None:
        """Map zero pages at [addr, addr + size) in the replayer where it has none of its
        own (what was there in the recorded client is not recorded), for a userptr
        allocation to pin; None, or why not. Never over the replayer's own memory: a BO of
        it would let a replayed GPU store write into the replayer."""
        if size == 0 or (addr | size) % PAGE or addr + size > 1 << 47:
            return None  # the daemon refuses it as it refused the recorded one
        gaps, at = [], addr
        for start, end in sorted(self.user_ranges):
            if end <= at or start >= addr + size:
                continue
            if start > at:
                gaps.append((at, start))
            at = max(at, end)
        if at < addr + size:
            gaps.append((at, addr + size))
        total = sum(e - s for s, e in (*self.user_ranges, *gaps))
        if total > MAX_USER_PAGES:
            return (f"its userptr range would take the replay's zero pages past "
                    f"{MAX_USER_PAGES >> 30} GiB")
        for start, end in gaps:
            got = _mmap(start, end - start, _PROT_RW, _MAP_ANON_FIXED, -1, 0)
            if got != start:
                err = ctypes.get_errno()
                if got not in (None, _MAP_FAILED):  # (a kernel without NOREPLACE: a hint)
                    _munmap(got, end - start)
                return (f"the replayer has memory of its own in the recorded userptr range "
                        f"{addr:#x}+{size:#x} ({errno.errorcode.get(err, err)})")
            self.user_ranges.append((start, end))
        return None

    def _ioctl(self, call: IoctlCall) -> Outcome:
        if call.user_pages is not None:
            why = self.user_pages(*call.user_pages)
            if why is not None:
                return Outcome(-errno.EFAULT, refused=why)
        bufs = [ctypes.create_string_buffer(bytes(b.data), len(b.data)) for b in call.buffers]
        addrs = [ctypes.addressof(b) for b in bufs]
        arg = bytearray(call.arg)
        for where, off, j, delta in call.patches:
            ptr = (addrs[j] + delta).to_bytes(8, "little")
            if where == -1:
                arg[off:off + 8] = ptr
            else:
                ctypes.memmove(addrs[where] + off, ptr, 8)
        call.sent = bytes(arg)
        c_arg = ctypes.create_string_buffer(bytes(arg), max(len(arg), 1))
        ret = _ioctl(self.fds[call.file], call.cmd, ctypes.addressof(c_arg))
        err = ctypes.get_errno() if ret < 0 else 0
        after = [bytes(b.raw) for b in bufs]
        # Pointers the replay patched into its buffers read back as the recording's.
        for where, off, _j, _delta in call.patches:
            if where >= 0:
                after[where] = (after[where][:off] + bytes(call.buffers[where].expect[off:off + 8])
                                + after[where][off + 8:])
        return Outcome(-err if ret < 0 else ret, arg=c_arg.raw[:len(arg)], buffers=after)

    def close_all(self) -> None:
        for fd in (*self.fds.values(), *self.dir_fds.values()):
            os.close(fd)
        self.fds.clear()
        self.dir_fds.clear()
        for start, end in self.user_ranges:  # (after the files: their BOs let go of them)
            _munmap(start, end - start)
        self.user_ranges.clear()


MAX_GAP = 2.0  # seconds: the longest recorded pause between two calls a replay keeps


def run(path: str, mounts: Mapping[str, str] | Sequence[tuple[str, str]],
        pids: set[int] | None = None, out: TextIO | None = None,
        nodes: set[str] | None = None, verbose: bool = False) -> list[Difference]:
    """Replay the recording at `path`; print each difference and a summary; return them.
    What it does not replay of the recording's user queues (their doorbells and packets:
    `QueueSummary`) is said in one line before the summary, and queue by queue with
    `verbose`; that is the recording's nature, not a difference.
    `mounts`: (recorded node, its mount) pairs, "" for a mount given without a node, in the
    order given (`refuse_unreplayable` refuses a node given twice).

    Calls keep the recorded pauses between them (up to MAX_GAP): what the daemons did in
    the background meanwhile (a revoke's NPA_REVOKE and NPA_RELEASE after a close) had that
    long in the recording too.

    The recording is read twice rather than held: once for the order its calls completed
    in, and again record by record as each one's turn comes (a parsed record takes some
    ten times its line)."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise RecordingError(f"cannot read it ({e.strerror})") from None
    with f:  # (stdout when called, not when this module was imported: pytest swaps it)
        return _run(f, path, mounts, pids, sys.stdout if out is None else out, nodes,
                    verbose)


def _lines_at(f: BinaryIO) -> Iterator[tuple[int, bytes]]:
    at = f.tell()
    for line in f:
        yield at, line
        at += len(line)


def _run(f: BinaryIO, path: str, given: Mapping[str, str] | Sequence[tuple[str, str]],
         pids: set[int] | None, out: TextIO, nodes: set[str] | None,
         verbose: bool = False) -> list[Difference]:
    indexed = index_records(_lines_at(f))
    everything = indexed.records
    recs = timeline(everything, pids, nodes)
    pairs = list(given.items()) if isinstance(given, Mapping) else list(given)
    refuse_unreplayable(everything, recs, pairs, pids)
    mounts = dict(pairs)

    def whole(rec: dict[str, Any]) -> dict[str, Any]:
        f.seek(rec["at"])
        return json.loads(f.readline())

    queued = queue_summary(everything, pids, nodes)
    replay = Replay(recs, whole)
    replay.queues_ran = {q.node for q in queued.queues if q.packets or q.errors}
    issuer = Issuer(mounts)
    found: list[Difference] = []
    skipped = 0
    say: Callable[[str], None] = lambda s: print(s, file=out, flush=True)  # noqa: E731
    lost = sum(r.get("count", 0) for r in everything if r["type"] == "lost")
    if lost:  # the recorder fell behind: calls are missing, later ones may differ for it
        found.append(Difference(0, path, f"the recording lost {lost} records"))
        say(str(found[-1]))
    if indexed.partial is not None:  # the recorder was killed mid-write: its last call is gone
        found.append(Difference(0, path, f"the recording ends in a partial record (line "
                                         f"{indexed.partial}), left out"))
        say(str(found[-1]))
    last: tuple[float, float] | None = None  # (recorded end, when the replay issued it)
    try:
        for index, rec in replay.steps():
            end = rec["time"] + rec.get("duration", 0.0)
            if last is not None:
                wait = min(max(end - last[0], 0.0), MAX_GAP) - (time.monotonic() - last[1])
                if wait > 0:
                    time.sleep(wait)
            last = (end, time.monotonic())
            if rec["node"] not in mounts and "" not in mounts:
                skipped += 1
                say(f"#{index} {replay.label(rec)}: skipped (no --mount for node "
                    f"{rec['node']})")
                continue
            call = replay.plan(rec)
            if isinstance(call, Skip):
                skipped += 1
                see = f" (#{call.because})" if call.because is not None else ""
                say(f"  not issued: #{index} {replay.label(rec)}: {call.why}{see}")
                continue
            if isinstance(call, str):
                found.append(Difference(index, replay.label(rec), f"not replayable: {call}"))
                say(str(found[-1]))
                continue
            diffs = replay.compare(index, rec, call, issuer.issue(call))
            for d in diffs:
                say(str(d))
            found += diffs
    finally:
        issuer.close_all()
    if verbose:
        for q in queued.queues:
            q.errors = [whole(e) for e in q.errors]  # (indexed without their detail)
            say(f"  queue not replayed: {q.note()}")
    if (line := queued.line()) is not None:
        say(line)
    calls = sum(1 for r in recs if r["type"] in ("ioctl", "gpu"))
    in_calls = [d for d in found if d.index]  # index 0: the recording's own (lost, partial)
    said = [f"{len(in_calls)} differences in {len({d.index for d in in_calls})} calls"
            ] if in_calls else []
    if len(found) > len(in_calls):
        said.append(f"{len(found) - len(in_calls)} about the recording itself")
    say(f"replayed {len(recs) - skipped} records ({calls} ioctls and GPU accesses) from "
        f"{path}: " + (", ".join(said) or "no differences"))
    return found

