"""Mount points of FUSE servers, read from mountinfo: clearing one a dead server left behind,
listing FUSE mounts under a path, and what a non-root user must change to mount at all.

No FUSE session here (lowlevel.py serves one); only /proc/self/mountinfo, umount2 and
fusermount3, so the daemon, the CLI and the tests clear mounts without a session.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import re
import shutil
import subprocess

log = logging.getLogger(__name__)

__all__ = [
    "clear_stale_mount",
    "fuse_mounts_at",
    "fuse_mounts_under",
    "non_root_mount_hint",
    "unescape_mountinfo",
]

_MNT_DETACH = 2


def non_root_mount_hint(fuse_conf: str = "/etc/fuse.conf") -> str:
    """What to change so that this uid can mount ualinkd (README "Running without root"):
    "" for root or when nothing is missing. A non-root mount goes through fusermount3 (setuid
    root, from the fuse3 package), needs read/write access to /dev/fuse, and, for
    allow_other (clients of other uids), user_allow_other in /etc/fuse.conf."""
    if os.geteuid() == 0:
        return ""
    fixes = []
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        fixes.append("/dev/fuse is not read/writable by this user (Debian makes it 0666; "
                     "`chmod 0666 /dev/fuse`, or a group with access)")
    if shutil.which("fusermount3") is None:
        fixes.append("fusermount3 is missing (apt-get install fuse3)")
    try:
        with open(fuse_conf) as f:
            allowed = any(line.split("#")[0].strip() == "user_allow_other" for line in f)
    except OSError:
        allowed = False
    if not allowed:
        fixes.append(f"add the line `user_allow_other` to {fuse_conf} (ualinkd mounts with "
                     "allow_other so clients of other uids reach the node)")
    return (": as a non-root user, " + "; ".join(fixes)) if fixes else ""


def unescape_mountinfo(field: str) -> str:
    """A mountinfo path field as the path: the kernel writes space, tab, newline and
    backslash as octal escapes (\\040 …) and every other byte as is (UTF-8 included), so
    the escapes are undone on the bytes, never with unicode_escape (which garbles UTF-8)."""
    if "\\" not in field:
        return field
    raw = re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), os.fsencode(field))
    return os.fsdecode(raw)


def _fuse_mounts(mountinfo: str) -> list[tuple[str, str]]:
    """(mount point, fstype) of every FUSE mount, in mount order (parsed, not stat'ed: a stat
    would call into the server)."""
    found = []
    try:
        with open(mountinfo) as f:
            for line in f:
                fields = line.split()
                fstype = fields[fields.index("-") + 1]
                if fstype.startswith("fuse"):
                    found.append((unescape_mountinfo(fields[4]), fstype))
    except FileNotFoundError:
        pass
    return found


def fuse_mounts_at(path: str, mountinfo: str = "/proc/self/mountinfo") -> list[str]:
    """fstypes of the mounts stacked at `path` that are FUSE mounts."""
    path = os.path.abspath(path)
    return [fstype for point, fstype in _fuse_mounts(mountinfo) if point == path]


def fuse_mounts_under(top: str | os.PathLike[str],
                      mountinfo: str = "/proc/self/mountinfo") -> list[str]:
    """FUSE mount points at or below `top`, in mount order (unmount in reverse)."""
    top = os.path.abspath(os.fspath(top))
    return [point for point, _ in _fuse_mounts(mountinfo)
            if point == top or point.startswith(top + "/")]


def _lazy_unmount(path: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.umount2(os.fsencode(path), _MNT_DETACH) == 0:
        return
    err = ctypes.get_errno()
    if err == errno.EPERM:  # not root: fusermount3 is setuid and may do it
        subprocess.run(["fusermount3", "-uz", path], check=True, capture_output=True)
        return
    raise OSError(err, f"umount2({path}, MNT_DETACH): {os.strerror(err)}")


def clear_stale_mount(path: str | os.PathLike[str]) -> None:
    """Make `path` usable as a mountpoint: create it if missing, and lazily unmount any FUSE
    mount left there by a server that died. A live FUSE mount is left alone and reported as
    EBUSY, so two daemons never stack on one directory. Probes with statfs (never answered
    from the kernel's attribute cache, unlike stat): do not call it on a mount served by
    the calling thread."""
    p = os.path.abspath(os.fspath(path))
    for _ in range(16):  # mounts can be stacked
        try:
            os.statvfs(p)
        except FileNotFoundError:
            if fuse_mounts_at(p):
                _lazy_unmount(p)
                continue
            os.makedirs(p, exist_ok=True)
            return
        except OSError as e:
            if e.errno != errno.ENOTCONN:
                raise
            log.warning("clearing stale FUSE mount at %s (its server is gone)", p)
            _lazy_unmount(p)
            continue
        if fuse_mounts_at(p):
            raise OSError(errno.EBUSY, f"a live FUSE server is mounted at {p}")
        if not os.path.isdir(p):
            raise NotADirectoryError(errno.ENOTDIR, f"mountpoint {p} is not a directory")
        return
    raise OSError(errno.EBUSY, f"cannot clear the mounts stacked at {p}")
