"""Resolve a client's fd to one of this mount's dma-buf files (for PRIME_FD_TO_HANDLE),
and the dmabuf inode numbering that the file tree and this resolution share; and the
identity of a calling process (drm/process.py's ProcessId) from /proc and pidfds.

Only /proc is read: stat'ing the fd's target would call back into our own FUSE server.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select

from ualinkd.drm.errors import DrmError
from ualinkd.drm.process import ProcessId

from .mounts import unescape_mountinfo

# dmabuf/<token> files get inode DMABUF_INO_BASE + key; nothing else in the tree is that high.
DMABUF_INO_BASE = 1 << 48
DMABUF_KEY_LIMIT = 1 << 48


def dmabuf_ino(key: int) -> int:
    """Inode number of the dmabuf file whose backend key is `key` (0 < key < 2**48)."""
    if not 0 < key < DMABUF_KEY_LIMIT:
        raise ValueError(f"dmabuf key out of range: {key}")
    return DMABUF_INO_BASE + key


def dmabuf_key(ino: int) -> int | None:
    """The backend key of a dmabuf inode, or None if `ino` is not one."""
    key = ino - DMABUF_INO_BASE
    return key if 0 < key < DMABUF_KEY_LIMIT else None


def _read_proc(path: str) -> bytes:
    """A small /proc file in one read: a third of what open()'s text layer costs (~10 µs
    against ~30 µs here), which matters on PRIME_FD_TO_HANDLE's path."""
    f = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(f, 4096)
    finally:
        os.close(f)


def _fdinfo(pid: int, fd: int) -> tuple[int | None, str | None]:
    """(ino, mnt_id) of fd `fd` of process `pid`, from its fdinfo (None for a field it
    lacks). FileNotFoundError: no such fd."""
    text = _read_proc(f"/proc/{pid}/fdinfo/{fd}")
    mnt_id = _field(text, b"mnt_id:")
    return _field(text, b"ino:"), None if mnt_id is None else str(mnt_id)


def _field(text: bytes, name: bytes) -> int | None:
    """The decimal value of the /proc line `name` (e.g. b"ino:" of an fdinfo, b"Tgid:" of
    a status), None if absent."""
    if text.startswith(name):
        at = 0
    elif (at := text.find(b"\n" + name)) < 0:
        return None
    else:
        at += 1
    end = text.find(b"\n", at)
    try:
        return int(text[at + len(name):end if end >= 0 else None])
    except ValueError:
        return None


def _mount_dev(mountinfo: str, *, mount_id: str | None = None, path: str | None = None) -> str:
    """The st_dev ("major:minor") of a mount found by id or by mount point; "" if none.
    For stacked mounts at one path the last (topmost) wins."""
    return _mount_entry(mountinfo, mount_id=mount_id, path=path)[1]


def _mount_entry(mountinfo: str, *, mount_id: str | None = None,
                 path: str | None = None) -> tuple[str, str]:
    """(mount id, st_dev) of a mount found by id or by mount point; ("", "") if none.
    For stacked mounts at one path the last (topmost) wins."""
    found = ("", "")
    try:
        with open(mountinfo) as f:
            for line in f:
                fields = line.split()
                mp = unescape_mountinfo(fields[4])
                if (mount_id is not None and fields[0] == mount_id) or (
                    path is not None and mp == path
                ):
                    found = (fields[0], fields[2])
    except FileNotFoundError:
        pass
    return found


def mount_device(mountpoint: str) -> tuple[int, int] | None:
    """(major, minor) of the superblock mounted at `mountpoint` in our mount namespace, from
    mountinfo (a stat of a FUSE mount would ask its server, which may be us)."""
    dev = _mount_dev("/proc/self/mountinfo", path=os.path.abspath(mountpoint))
    if not dev:
        return None
    major, _, minor = dev.partition(":")
    return int(major), int(minor)


def resolve_caller_fd(pid: int, fd: int, mountpoint: str) -> int:
    """The dmabuf key behind fd `fd` of process `pid`, which must be a file under
    `<mountpoint>/dmabuf/` of *this* mount. EBADF: no such fd; EINVAL: not one of ours.

    The fd's fdinfo says it all: an inode number in the dmabuf range names one of our
    dmabuf files by construction, and the mount it is on must be ours. Its path (a
    readlink, as dear as the rest cold: /proc/<pid>/fd of another process is built anew at
    each lookup) is read only to say what a refused fd is.

    The fdinfo is read on every call, not cached per (pid, fd): nothing tells us that a
    caller closed or dup2'd over an fd (a close of one of several fds of a file sends no
    RELEASE), so a cached answer could let another file through under the same number;
    and comparing the fd with a file of ours (kcmp) would need our own reference to the
    caller's file, which would hold its dma-buf open (its RELEASE) for as long as we kept
    it."""
    try:
        ino, mnt_id = _fdinfo(pid, fd)
    except FileNotFoundError:
        raise DrmError(errno.EBADF, f"pid {pid} has no fd {fd}") from None
    except PermissionError:
        raise DrmError(errno.EACCES, f"cannot inspect fd {fd} of pid {pid}") from None
    key = dmabuf_key(ino) if ino is not None else None
    if key is None:
        raise DrmError(errno.EINVAL, f"fd {fd} is not a dma-buf file ({_link(pid, fd)})")
    # The path may differ in the caller's mount namespace; the superblock device may not.
    # It tells apart two ualinkd mounts on one host (a local pod). Parsing mountinfo costs
    # ~100 µs, so both sides are cached: ours per mount point, theirs per (mount namespace,
    # mount id) once seen to be ours (ids are unique among live mounts).
    ours = _ours.get(mountpoint)
    if ours is None or not ours[1]:
        ours = _ours[mountpoint] = _mount_entry("/proc/self/mountinfo",
                                                path=os.path.abspath(mountpoint))
    if mnt_id is not None and mnt_id == ours[0]:
        # Our own mount (a caller in our mount namespace, the usual one): mount ids are
        # unique among live mounts, and ours lives while we serve it, so no other mount
        # has its id; the caller's namespace is not read (a /proc readlink per call).
        return key
    try:
        ns = os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        ns = f"pid:{pid}"
    seen = (mountpoint, ns, mnt_id)
    if seen not in _theirs_ok:
        theirs = _mount_dev(f"/proc/{pid}/mountinfo", mount_id=mnt_id)
        if not theirs or theirs != ours[1]:
            raise DrmError(errno.EINVAL, f"fd {fd} is a dma-buf file of another mount")
        if len(_theirs_ok) > 4096:
            _theirs_ok.clear()
        _theirs_ok.add(seen)
    return key


def _link(pid: int, fd: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError as e:
        return e.strerror or "?"


_ours: dict[str, tuple[str, str]] = {}  # mount point -> (mount id, st_dev) in our namespace
_theirs_ok: set[tuple[str, str, str | None]] = set()


def tgid_of(tid: int) -> int | None:
    """The process of a thread (FUSE reports the calling thread), None when it is gone."""
    try:
        return _field(_read_proc(f"/proc/{tid}/status"), b"Tgid:")
    except OSError:
        return None


def _pidfs() -> bool:
    """Whether pidfds have an inode per process (pidfs, Linux 6.9): ours and pid 1's
    differ. Before that every pidfd is the one anonymous inode and the start time is used."""
    try:
        a, b = os.pidfd_open(os.getpid()), os.pidfd_open(1)
    except OSError:
        return False
    try:
        return os.fstat(a).st_ino != os.fstat(b).st_ino
    finally:
        os.close(a)
        os.close(b)


_PIDFS = _pidfs()


def _incarnation(pid: int, pidfd: int) -> int | None:
    """What tells the process behind `pidfd` from any later one with `pid`: its pidfs inode,
    else its start time (field 22 of /proc/<pid>/stat, read while the pidfd shows it alive,
    so the stat read is its own)."""
    if _PIDFS:
        return os.fstat(pidfd).st_ino
    try:
        text = _read_proc(f"/proc/{pid}/stat")
        start = int(text[text.rindex(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None
    return None if _exited(pidfd) else start


def _exited(pidfd: int) -> bool:
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


def _image(tid: int) -> bytes:
    """The program image of thread `tid`'s process: the auxiliary vector its last execve
    gave its mm (/proc/<tid>/auxv: the program's headers, entry and interpreter base, and
    AT_RANDOM's stack address, each placed at random by ASLR), shared by every thread,
    changed by nothing but an execve (or CRIU's prctl). The thread's own, not the
    leader's: a leader that exited has no mm to show. b"" when we may not read it (then
    every read is b"", which tells no exec apart). One small copy, unlike /proc/<tid>/stat's
    layout fields, which cost the kernel a pass over the task (twice the ioctl's time)."""
    try:
        return _read_proc(f"/proc/{tid}/auxv")
    except OSError:
        return b""


def process_id(tid: int) -> ProcessId | None:
    """The process of calling thread `tid` (FUSE reports threads), None when it is gone.
    A thread-group leader opens as a pidfd itself (one syscall, and no /proc text to
    format); another thread's Tgid is read first. A caller blocked in our request cannot
    exit (FUSE waits for our answer even after SIGKILL), nor exec (execve waits for its
    other threads to die), so the pid and image are its own meanwhile."""
    try:
        fd, tgid = os.pidfd_open(tid), tid
    except OSError as e:
        if e.errno == errno.ESRCH:  # gone (a thread that is no leader: EINVAL, or ENOENT on 6.18)
            return None
        found = tgid_of(tid)
        if found is None:
            return None
        try:
            fd, tgid = os.pidfd_open(found), found
        except OSError:
            return None
    try:
        incarnation = _incarnation(tgid, fd)
        image = _image(tid)  # (a caller in our request: its own, see above)
    finally:
        os.close(fd)
    return None if incarnation is None else ProcessId(tgid, incarnation, image)


def process_of_pidfd(pid: int, pidfd: int) -> ProcessId | None:
    """The ProcessId of the process behind `pidfd` (whose pid is `pid`), None if unknown."""
    incarnation = _incarnation(pid, pidfd)
    image = _image(pid)
    if not image:  # a leader that exited has no mm: a live thread's image
        with contextlib.suppress(OSError):
            image = next((im for t in os.listdir(f"/proc/{pid}/task")
                          if (im := _image(int(t)))), image)
    if incarnation is None or _exited(pidfd):
        return None
    return ProcessId(pid, incarnation, image)


def open_pidfd(process: ProcessId) -> int | None:
    """A pidfd of exactly `process` (closed by the caller), None when it has exited: a pid
    given to another process since is refused, never opened in its place (a program it
    exec'd since is the same process: its fds are the ones it kept)."""
    try:
        fd = os.pidfd_open(process.pid)
    except OSError:
        return None
    if _incarnation(process.pid, fd) != process.incarnation:
        os.close(fd)
        return None
    return fd
