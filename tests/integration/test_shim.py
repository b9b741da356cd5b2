"""libualink_shim.so: unmodified DRM/amdgpu clients against a real node (DESIGN.md, "A dma-buf
fd from a FUSE server" and "Restricted ioctls")."""

from __future__ import annotations

import ctypes.util
import errno
import os
import re
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from nodes import REPO, SHIM, c_program, running_node

from ualinkd.config import PodConfig

pytestmark = pytest.mark.integration

BO_SIZE = 2 << 20
INTERPOSED = {
    "open", "open64", "openat", "openat64", "__open_2", "__open64_2", "__openat_2",
    "__openat64_2", "close", "close_range", "closefrom", "dup", "dup2", "dup3", "fcntl",
    "fcntl64", "ioctl", "mmap", "mmap64", "munmap", "mremap",
    # paths and the device identity (spec userspace-surface §7 items 1-3)
    "fopen", "fopen64", "freopen", "freopen64", "opendir", "readdir", "readdir64",
    "rewinddir", "closedir", "stat", "stat64", "lstat", "lstat64", "fstat", "fstat64",
    "fstatat", "fstatat64", "statx", "__xstat", "__xstat64", "__lxstat", "__lxstat64",
    "__fxstat", "__fxstat64", "__fxstatat", "__fxstatat64", "access", "faccessat",
    "euidaccess", "eaccess", "readlink", "readlinkat", "realpath", "__realpath_chk",
    "canonicalize_file_name",
}
SHIM_MAP = REPO / "libualink_c" / "libualink_shim.map"


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    c_program("libualink_shim.so")
    with running_node(tmp_path_factory.mktemp("shim")) as n:
        yield n


def run(argv: list[str], **env: str | None) -> subprocess.CompletedProcess[str]:
    full = dict(os.environ)
    for key in ("LD_PRELOAD", "UALINK_DRI_DIR", "UALINK_DMABUF_DIR"):
        full.pop(key, None)
    full.update({k: v for k, v in env.items() if v is not None})
    return subprocess.run(argv, env=full, capture_output=True, text=True, timeout=60)


def steps(stdout: str) -> dict[str, dict[str, str]]:
    """`ok <step> k=v ...` / `fail <step> errno=N` lines → {step: {"status": ..., k: v}}."""
    out: dict[str, dict[str, str]] = {}
    for line in stdout.splitlines():
        status, step, *rest = line.split(" ")
        fields = {"status": status}
        key = None
        for word in rest:
            if "=" in word:
                key, _, value = word.partition("=")
                fields[key] = value
            elif key == "desc":  # desc=AMD GPU; a fail line's "(strerror)" is dropped
                fields[key] += " " + word
        out[step] = fields
    return out


def client(node, **env: str | None) -> subprocess.CompletedProcess[str]:
    return run([c_program("unmodified_client")], LD_PRELOAD=str(SHIM),
               UALINK_DRI_DIR=str(node.mount / "dri"), **env)


def test_unmodified_client_under_the_shim(node):
    r = client(node)
    assert r.returncode == 0, r.stdout + r.stderr
    s = steps(r.stdout)
    assert all(v["status"] in ("ok", "info") for v in s.values()), r.stdout
    # DRM_IOCTL_VERSION answered by the daemon through caller memory (drm_version):
    # drmGetVersion's two passes and truncation
    for step in ("version", "card0"):
        assert s[step] | {"status": "ok"} == {
            "status": "ok", "name": "amdgpu", "major": "3", "minor": "64",
            "patchlevel": "0", "date": "20150101", "desc": "AMD GPU"}
    assert s["version_truncated"]["name"] == "amd"
    assert s["version_truncated"]["name_len"] == "6"
    # IMPORT of its own handle: a real fd to the exporter's dma-buf, close-on-exec
    bo = s["gem_create"]["handle"]
    assert int(s["import"]["fd"]) >= 0 and s["import"]["cloexec"] == "1"
    assert int(s["import_size"]["size"]) == BO_SIZE
    # a 32-byte variant of the import (dispatch by nr, §2.2) gets a real fd as well
    assert int(s["import_32"]["fd"]) >= 0 and int(s["import_32"]["size"]) == BO_SIZE
    assert int(s["fstat"]["size"]) == BO_SIZE
    assert stat.S_ISREG(int(s["fstat"]["mode"], 8))
    assert int(s["fstat"]["uid"]) == os.getuid()
    # §2.5: same file, same dma-buf → same GEM handle
    assert s["fd_to_handle"]["handle"] == bo and s["fd_to_handle"]["same"] == "1"
    # PRIME_HANDLE_TO_FD: another real fd; O_CLOEXEC exactly when DRM_CLOEXEC is asked
    h2f = s["handle_to_fd"]
    assert h2f["distinct"] == "1" and h2f["cloexec"] == "1"
    assert int(h2f["size"]) == BO_SIZE
    assert s["handle_to_fd_back"]["handle"] == bo
    assert s["handle_to_fd_dup"]["cloexec"] == "0"
    assert int(s["handle_to_fd_dup"]["size"]) == BO_SIZE
    # one accel on this node: renderD129 is not there
    assert s["renderD129"]["errno"] == str(errno.ENOENT)
    assert "done" in s


def test_dmabuf_dir_override(node):
    """$UALINK_DMABUF_DIR replaces <dri>/../dmabuf; a failed token open fails the ioctl."""
    r = client(node, UALINK_DMABUF_DIR=str(node.mount / "dmabuf"))
    assert r.returncode == 0, r.stdout + r.stderr
    r = client(node, UALINK_DMABUF_DIR=str(node.mount / "nonexistent"))
    assert r.returncode == 1
    s = steps(r.stdout)
    assert s["export"]["status"] == "ok"
    assert s["import"] == {"status": "fail", "errno": str(errno.ENOENT)}
    assert r.stderr == ""  # says nothing else


def test_inert_without_dri_dir(node):
    """No UALINK_DRI_DIR: /dev/dri/renderD128 is opened as asked, which fails here; the shim
    says once on stderr that it is off and why (issue 32, item 2: it was silent, and the
    program's `open err=2` was all a user saw)."""
    if os.path.exists("/dev/dri/renderD128"):
        pytest.skip("this machine has a real /dev/dri/renderD128")
    plain = run([c_program("unmodified_client")])
    shimmed = run([c_program("unmodified_client")], LD_PRELOAD=str(SHIM))
    empty = run([c_program("unmodified_client")], LD_PRELOAD=str(SHIM), UALINK_DRI_DIR="")
    for r in (plain, shimmed, empty):
        assert r.returncode == 1
        assert steps(r.stdout) == {"open": {"status": "fail", "errno": str(errno.ENOENT)}}, r.stdout
    assert plain.stderr == ""
    for r in (shimmed, empty):
        assert r.stderr.splitlines() == [
            "libualink_shim: UALINK_DRI_DIR is not set; the shim is off and /dev/dri is the "
            "system's (ualinkd run NODE -- PROG sets it)"], r.stderr


def test_proc_modules_lists_amdgpu(tmp_path: Path):
    """Issue 32, item 1: under the shim /proc/modules reads as a host's with amdgpu loaded
    (the kernel's m_show() line: name size refcount users state address) and
    /sys/module/amdgpu is the node's, so kmod's real lsmod, a child inheriting the shim,
    lists amdgpu with its size and use count (the node's open files) and no libkmod error.
    The host's own lines stay; the file is read-only; without the shim nothing changes."""
    host = Path("/proc/modules").read_text() if Path("/proc/modules").exists() else ""
    if any(line.startswith("amdgpu ") for line in host.splitlines()):
        pytest.skip("this host has amdgpu loaded")
    c_program("libualink_shim.so")
    with running_node(tmp_path) as node:  # its own: no file of another test still open
        _proc_modules_on(node, host)


def _proc_modules_on(node, host: str) -> None:
    script = ("cat /proc/modules; echo ---; lsmod; echo ---; cat /sys/module/amdgpu/coresize;"
              " python3 -c 'import os; fd = os.open(\"/proc/modules\", os.O_RDONLY);"
              " print(os.read(fd, 7));\ntry: os.write(fd, b\"x\")\n"
              "except OSError as e: print(e.errno)'")
    r = run(["sh", "-c", script], LD_PRELOAD=str(SHIM), UALINK_DRI_DIR=str(node.mount / "dri"))
    assert r.returncode == 0, r.stdout + r.stderr
    modules, lsmod, rest = r.stdout.split("---\n")
    assert modules == host + "amdgpu 9928704 0 - Live 0x0000000000000000\n"
    assert lsmod.splitlines()[0].split() == ["Module", "Size", "Used", "by"]
    assert ["amdgpu", "9928704", "0"] in [line.split() for line in lsmod.splitlines()]
    assert rest.splitlines() == ["9928704", "b'amdgpu '", str(errno.EBADF)]
    assert "libkmod" not in r.stderr, r.stderr
    # the use count is the node's open files, as each open takes a module reference
    r = run(["sh", "-c", "exec 3</dev/dri/renderD128; cat /proc/modules"],
            LD_PRELOAD=str(SHIM), UALINK_DRI_DIR=str(node.mount / "dri"))
    assert r.stdout.splitlines()[-1] == "amdgpu 9928704 1 - Live 0x0000000000000000", r.stderr
    plain = run(["sh", "-c", "grep -c amdgpu /proc/modules"])
    assert plain.stdout.strip() in ("", "0"), plain.stdout


def test_only_interposed_symbols_are_exported():
    c_program("libualink_shim.so")
    nm = subprocess.run(["nm", "-D", "--defined-only", str(SHIM)], capture_output=True,
                        text=True, check=True)
    exported = {line.split()[-1] for line in nm.stdout.splitlines() if line.strip()}
    assert exported == INTERPOSED
    # the map names the same set, unversioned (an anonymous node: old binaries' versioned
    # references such as __xstat@GLIBC_2.2.5 bind to the wrappers)
    body = re.sub(r"/\*.*?\*/", "", SHIM_MAP.read_text(), flags=re.S)
    glob = body.split("global:")[1].split("local:")[0]
    # (it also names shim_mmap.c's wrappers, so building that file in cannot hide them)
    assert {n.strip() for n in glob.split(";") if n.strip()} == INTERPOSED | {
        "mmap", "mmap64", "munmap", "mremap"}
    assert "@" not in nm.stdout


def chr_steps(r: subprocess.CompletedProcess[str]) -> dict[str, dict[str, str]]:
    assert r.returncode == 0, r.stdout + r.stderr
    return steps(r.stdout)


def test_stat_family_reports_a_drm_character_device(node):
    """§7 item 1: every stat entry point (the glibc < 2.33 __xstat family through their
    versioned symbols) reports /dev/dri/renderD128 and card0, and the fds opened from them
    (dups too), as S_IFCHR|0666 with st_rdev 226:128 and 226:0 (drmGetNodeTypeFromFd,
    drmGetDevice2's fstat64/stat64); a node the node lacks is ENOENT."""
    r = run([c_program("shim_stat")], LD_PRELOAD=str(SHIM),
            UALINK_DRI_DIR=str(node.mount / "dri"))
    s = chr_steps(r)
    chr_mode = f"{stat.S_IFCHR | 0o666:o}"
    card = {"stat_card", "lstat64", "fstatat64", "fstat_card", "statx_fd", "__lxstat",
            "__fxstat64"}
    render = {"stat", "stat64", "lstat", "fstatat", "fstat", "fstat64", "fstatat_empty",
              "fstat_dup", "statx", "__xstat", "__fxstat", "__fxstatat", "__xstat64"}
    if os.uname().machine != "x86_64":
        card -= {"__lxstat", "__fxstat64"}
        render -= {"__xstat", "__fxstat", "__fxstatat", "__xstat64"}
    for step in card | render:
        assert s[step]["mode"] == chr_mode, (step, r.stdout)
        assert s[step]["rdev"] == ("226:0" if step in card else "226:128"), (step, r.stdout)
    if os.uname().machine == "x86_64":
        assert s["__xstat_bad_version"]["errno"] == str(errno.EINVAL)
    assert s["stat_missing"]["errno"] == str(errno.ENOENT)
    # §2.2 step 7: opendir("/dev/dri") lists render and card, both DT_CHR, again after a rewind
    entries = [line.split()[2:] for line in r.stdout.splitlines() if " entry " in line]
    assert entries == [["name=renderD128", "type=2"], ["name=card0", "type=2"]]
    again = [line.split()[2] for line in r.stdout.splitlines() if " entry_again " in line]
    assert again == ["name=renderD128", "name=card0"]
    # realpath answers the host's paths, never the mount's
    assert s["realpath"]["path"] == "/dev/dri/card0"
    assert s["realpath_dir"]["path"] == "/dev/dri"
    # the accel's real sysfs directory (sysfs.pci_root, pci_bdf), as /sys on a host shows it
    assert s["realpath_sys"]["path"] == "/sys/devices/pci0000:10/0000:10:00.0"
    assert s["realpath_chk"]["path"] == "/sys/devices/pci0000:10/0000:10:00.0"
    assert s["readlink"]["link"].endswith("/bus/pci")  # relative, as the kernel's
    assert str(node.mount) not in r.stdout
    assert r.stderr == ""


def test_two_accels_list_and_stat_each(tmp_path_factory):
    """Each accel of a 2-accel node is its own pair of minors: renderD128/card0 and
    renderD129/card1, listed in /dev/dri and each with its own rdev."""
    with running_node(tmp_path_factory.mktemp("two"), PodConfig.local(1, 2)) as n:
        r = run(["sh", "-c", "stat -c '%n %F %t:%T' /dev/dri/renderD129 /dev/dri/card1 && "
                 "ls /dev/dri"], LD_PRELOAD=str(SHIM), UALINK_DRI_DIR=str(n.mount / "dri"))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[:2] == ["/dev/dri/renderD129 character special file e2:81",
                         "/dev/dri/card1 character special file e2:1"]
    assert sorted(lines[2:]) == ["card0", "card1", "renderD128", "renderD129"]


def test_sys_paths_are_the_nodes(node):
    """§7 item 2: /sys/class/drm, the accel's PCI directory and /sys/dev/char/226:* are read
    from the node's own sys/ tree by fopen, open, opendir, access and stat; other /sys
    paths stay the host's."""
    state = (node.mount / "sys/class/drm/renderD128/device/ualink/accel_state").read_text()
    script = ("cat /sys/class/drm/renderD128/device/ualink/accel_state && "
              "ls /sys/class/drm | grep -E '^(card|renderD)' && "
              "cat /sys/bus/pci/devices/0000:10:00.0/ualink/accel_state && "
              "test -e /sys/class/drm/card0 && echo access-ok && "
              "test ! -e /sys/class/drm/renderD129 && echo absent-ok && "
              "test -d /sys/kernel && echo host-ok")
    r = run(["sh", "-c", script], LD_PRELOAD=str(SHIM), UALINK_DRI_DIR=str(node.mount / "dri"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == [state.strip(), "card0", "renderD128", state.strip(),
                                     "access-ok", "absent-ok", "host-ok"]
    fopen = textwrap.dedent("""
        import sys
        # Python's open() is open(2); ctypes' fopen is glibc's, which opens internally
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.fopen.restype = ctypes.c_void_p
        f = libc.fopen(b"/sys/class/drm/renderD128/device/ualink/accel_state", b"r")
        print("fopen", bool(f))
    """)
    r = run([sys.executable, "-c", fopen], LD_PRELOAD=str(SHIM),
            UALINK_DRI_DIR=str(node.mount / "dri"))
    assert r.stdout.split() == ["fopen", "True"], r.stderr


def test_wrapper_reentered_while_reading_the_configuration(node):
    """shim.c's recursion guard: a later preload's realpath (reached from the shim's own
    configuration) opens a /sys file through the shim; that open passes through instead of
    waiting on the configuration it is part of (a hang: the timeout fails it)."""
    reenter = c_program("shim_reenter.so")
    r = run([c_program("shim_stat")], LD_PRELOAD=f"{SHIM}:{reenter}",
            UALINK_DRI_DIR=str(node.mount / "dri"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert steps(r.stdout)["stat"]["rdev"] == "226:128"


@pytest.mark.parametrize("bad", ["nonexistent", "plain-dir", "file"])
def test_bad_dri_dir_leaves_dev_dri_alone(node, tmp_path: Path, bad: str):
    """Issue 9, bad input: a UALINK_DRI_DIR that does not exist or is not a ualinkd mount
    leaves the program's own /dev/dri alone and says so once on stderr."""
    if os.path.exists("/dev/dri/renderD128"):
        pytest.skip("this machine has a real /dev/dri/renderD128")
    target = tmp_path / bad
    if bad == "plain-dir":
        target.mkdir()
        (target / "renderD128").write_text("")  # looks like one, but not on a FUSE mount
    elif bad == "file":
        target.write_text("")
    r = run(["sh", "-c", "cat /dev/dri/renderD128; stat /dev/dri/card0; ls /dev/dri"],
            LD_PRELOAD=str(SHIM), UALINK_DRI_DIR=str(target))
    said = [line for line in r.stderr.splitlines() if line.startswith("libualink_shim:")]
    # one line per process (cat, stat and ls each say it once), naming the directory
    assert len(said) == 3, r.stderr
    assert all(str(target) in line and "not a ualinkd mount" in line for line in said)
    assert r.stderr.count("No such file or directory") >= 3  # the system's /dev/dri
    # the unmodified client sees the real /dev/dri: ENOENT, not the node
    r = run([c_program("unmodified_client")], LD_PRELOAD=str(SHIM), UALINK_DRI_DIR=str(target))
    assert steps(r.stdout) == {"open": {"status": "fail", "errno": str(errno.ENOENT)}}
    assert r.stderr.count("libualink_shim:") == 1


LIBDRM_SCRIPT = textwrap.dedent("""
    import ctypes, fcntl, os, struct, sys
    drm = ctypes.CDLL(sys.argv[1], use_errno=True)

    class Version(ctypes.Structure):
        _fields_ = [("major", ctypes.c_int), ("minor", ctypes.c_int), ("patch", ctypes.c_int),
                    ("name_len", ctypes.c_int), ("name", ctypes.c_char_p),
                    ("date_len", ctypes.c_int), ("date", ctypes.c_char_p),
                    ("desc_len", ctypes.c_int), ("desc", ctypes.c_char_p)]

    drm.drmGetVersion.restype = ctypes.POINTER(Version)
    fd = os.open("/dev/dri/renderD128", os.O_RDWR)
    v = drm.drmGetVersion(fd).contents
    print("version", v.name.decode(), v.major, v.minor, v.patch, v.date.decode(), v.desc.decode())
    # GEM_CREATE through Python's own ioctl(2) (fcntl.ioctl), then libdrm's PRIME helpers
    GEM_CREATE = (3 << 30) | (32 << 16) | (ord("d") << 8) | 0x40
    out = fcntl.ioctl(fd, GEM_CREATE, struct.pack("=QQQQ", 1 << 20, 4096, 4, 0))
    bo = struct.unpack_from("=I", out)[0]
    dmabuf = ctypes.c_int(-1)
    assert drm.drmPrimeHandleToFD(fd, bo, os.O_CLOEXEC | os.O_RDWR, ctypes.byref(dmabuf)) == 0
    print("size", os.lseek(dmabuf.value, 0, os.SEEK_END))
    back = ctypes.c_uint32()
    assert drm.drmPrimeFDToHandle(fd, dmabuf.value, ctypes.byref(back)) == 0
    print("same", back.value == bo)
""")


def test_libdrm_through_the_shim(node):
    """libdrm's drmGetVersion / drmPrimeHandleToFD / drmPrimeFDToHandle, unmodified."""
    libdrm = ctypes.util.find_library("drm")
    if libdrm is None:
        pytest.skip("libdrm is not installed")
    r = run([sys.executable, "-c", LIBDRM_SCRIPT, libdrm], LD_PRELOAD=str(SHIM),
            UALINK_DRI_DIR=str(node.mount / "dri"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == [
        "version amdgpu 3 64 0 20150101 AMD GPU", f"size {1 << 20}", "same True"]


def test_shim_keeps_unrelated_files_working(node, tmp_path: Path):
    """Everything not under /dev/dri passes through: a shell pipeline under the shim."""
    f = tmp_path / "x"
    r = run(["sh", "-c", f"echo hi > {f} && cat {f} && exec 3<{f} && cat <&3"],
            LD_PRELOAD=str(SHIM), UALINK_DRI_DIR=str(node.mount / "dri"))
    assert r.returncode == 0, r.stderr
    assert r.stdout == "hi\nhi\n"
