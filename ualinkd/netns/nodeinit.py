"""Inside a pod node's fresh mount namespace: make the places a real host has, then exec.

Run as `ip netns exec NS unshare --mount --propagation private python -m
ualinkd.netns.nodeinit --stage DIR -- CMD…`. It puts a tmpfs over `/dev`, `/sys/class`,
`/sys/devices`, `/sys/dev/char` and `/sys/bus/pci/devices` that mirrors what was there (bind
mounts of every entry, symlinks copied, so `/dev/null`, `/dev/fuse`, `/dev/pts`,
`/sys/class/net` … keep working) plus the empty mount points `/dev/dri`, `/dev/dmabuf`,
`/sys/class/drm`, and a tmpfs on `/sys/kernel/debug` with `dri/` and `ualink_fabric`, then
execs CMD (the node daemon).

Once the daemon is ready the pod runs `python -m ualinkd.netns.nodeinit --bind MOUNT` in
the daemon's mount namespace (a FUSE server cannot bind its own files: the lookups would
wait on itself): the daemon's `dri/`, `dmabuf/`, `sys/class/drm`, debugfs files and GPU
directories `sys/devices/pci0000:<bb>` are bound over the same paths, and its
`sys/dev/char/226:*` and `sys/bus/pci/devices/<bdf>` links are copied, so the relative links
of the sys tree (ualinkd/sysfs.py) resolve inside the node's /sys as on a real host:
`readlink -f /sys/dev/char/226:128/device` is `/sys/devices/pci0000:10/0000:10:00.0`.

Nothing here touches the host's /dev or /sys: the new tmpfs mounts exist only in this
private mount namespace; the host's devtmpfs and sysfs are only bound, never written.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import stat
import sys

MS_BIND = 4096
MS_REC = 16384
MNT_DETACH = 2

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


def mount(src: str, dst: str, fstype: str | None = None, flags: int = 0,
          data: str | None = None) -> None:
    if _libc.mount(src.encode(), dst.encode(), fstype.encode() if fstype else None, flags,
                   data.encode() if data else None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {src} on {dst}: {os.strerror(err)}")


def umount(path: str) -> None:
    if _libc.umount2(path.encode(), MNT_DETACH) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"umount {path}: {os.strerror(err)}")


def mirror(target: str, saved: str, extra_dirs: list[str]) -> None:
    """A tmpfs on `target` holding a bind of every entry of `saved` (a bind of the old
    `target`), symlinks copied, plus the empty directories `extra_dirs`."""
    mount("tmpfs", target, "tmpfs", 0, "mode=755")
    for name in sorted(os.listdir(saved)):
        src, dst = os.path.join(saved, name), os.path.join(target, name)
        st = os.lstat(src)
        if stat.S_ISLNK(st.st_mode):
            os.symlink(os.readlink(src), dst)
            continue
        if stat.S_ISDIR(st.st_mode):
            os.mkdir(dst, stat.S_IMODE(st.st_mode))
        else:
            os.close(os.open(dst, os.O_CREAT | os.O_WRONLY, 0o600))
        try:
            mount(src, dst, None, MS_BIND | MS_REC)
        except OSError as e:  # e.g. a file we may not bind; leave the placeholder
            print(f"nodeinit: {e}", file=sys.stderr)
    for d in extra_dirs:
        os.makedirs(os.path.join(target, d), exist_ok=True)


# What is mirrored (a tmpfs of binds and copied links) so the daemon's files can be added.
# /sys/devices/virtual is mirrored too (after /sys/devices), so the KFD's directory can be
# added beside the host's virtual devices (net, tty, ...) without hiding them.
MIRRORS: tuple[tuple[str, str, list[str]], ...] = (
           ("dev", "/dev", ["dri", "dmabuf"]), ("class", "/sys/class", ["drm", "kfd"]),
           ("devices", "/sys/devices", []), ("virtual", "/sys/devices/virtual", ["kfd"]),
           ("char", "/sys/dev/char", []), ("pci", "/sys/bus/pci/devices", []))


def prepare(stage: str) -> None:
    os.makedirs(stage, exist_ok=True)
    mount("tmpfs", stage, "tmpfs", 0, "mode=700")
    for name, target, extra in MIRRORS:
        if not os.path.isdir(target):  # e.g. no PCI bus in this machine
            continue
        saved = os.path.join(stage, name)
        os.mkdir(saved)
        mount(target, saved, None, MS_BIND | MS_REC)
        mirror(target, saved, extra)
    umount(stage)  # the binds above keep what they need
    # debugfs is not mounted in this fresh /sys: a tmpfs with the two places we bind.
    mount("tmpfs", "/sys/kernel/debug", "tmpfs", 0, "mode=700")
    os.mkdir("/sys/kernel/debug/dri")
    os.close(os.open("/sys/kernel/debug/ualink_fabric", os.O_CREAT | os.O_WRONLY, 0o444))


def _link(target: str, path: str) -> None:
    """`ln -sfn target path`: a host's link of that name (its own GPU) is replaced."""
    if os.path.lexists(path):
        os.unlink(path)
    os.symlink(target, path)


def bind(node_mount: str) -> None:
    """The daemon's files over the host paths (see the module docstring)."""
    from .. import sysfs

    def at(rel: str) -> str:
        return os.path.join(node_mount, rel)

    for rel, dst in (("dri", "/dev/dri"), ("dmabuf", "/dev/dmabuf"),
                     (sysfs.DRM_CLASS, "/sys/class/drm"),
                     (sysfs.DEBUGFS_DRI, "/sys/kernel/debug/dri"),
                     (sysfs.FABRIC_STATUS, "/sys/kernel/debug/ualink_fabric")):
        mount(at(rel), dst, None, MS_BIND)
    for root in sorted(os.listdir(at("sys/devices"))):  # pci0000:<bb>, one per GPU
        if root == "virtual":  # only its kfd/ is the daemon's (below)
            continue
        dst = os.path.join("/sys/devices", root)
        os.makedirs(dst, exist_ok=True)
        mount(at(f"sys/devices/{root}"), dst, None, MS_BIND)
    # The KFD: its sysfs directory, the class link to it, and /dev/kfd (issue 14).
    os.makedirs("/sys/devices/virtual/kfd", exist_ok=True)
    mount(at("sys/devices/virtual/kfd"), "/sys/devices/virtual/kfd", None, MS_BIND)
    os.makedirs("/sys/class/kfd", exist_ok=True)
    _link(os.readlink(at("sys/class/kfd/kfd")), "/sys/class/kfd/kfd")
    if not os.path.exists("/dev/kfd"):
        os.close(os.open("/dev/kfd", os.O_CREAT | os.O_WRONLY, 0o666))
    mount(at("kfd"), "/dev/kfd", None, MS_BIND)
    for rel, host in (("sys/dev/char", "/sys/dev/char"),
                      ("sys/bus/pci/devices", "/sys/bus/pci/devices")):
        if not os.path.isdir(host):
            continue
        for name in sorted(os.listdir(at(rel))):
            _link(os.readlink(at(f"{rel}/{name}")), os.path.join(host, name))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) == 2 and argv[0] == "--bind":
        try:
            bind(argv[1])
        except OSError as e:
            print(f"nodeinit --bind: {e}", file=sys.stderr)
            return 1
        return 0
    if len(argv) < 4 or argv[0] != "--stage" or argv[2] != "--":
        print("usage: python -m ualinkd.netns.nodeinit --stage DIR -- CMD...\n"
              "       python -m ualinkd.netns.nodeinit --bind NODE_MOUNT", file=sys.stderr)
        return 2
    stage, cmd = argv[1], argv[3:]
    try:
        prepare(stage)
    except OSError as e:
        print(f"nodeinit: {e}", file=sys.stderr)
        return 1
    os.execvp(cmd[0], cmd)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
