"""libualink_shim.so: unmodified DRM/amdgpu clients against a real node (DESIGN.md, "A dma-buf
fd from a FUSE server" and "Restricted ioctls")."""

from __future__ import annotations

import ctypes.util
import errno
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from nodes import REPO, c_program, running_node

pytestmark = pytest.mark.integration

SHIM = REPO / "libualink_c" / "build" / "libualink_shim.so"
BO_SIZE = 2 << 20
INTERPOSED = {
    "open", "open64", "openat", "openat64", "__open_2", "__open64_2", "__openat_2",
    "__openat64_2", "close", "close_range", "closefrom", "dup", "dup2", "dup3", "fcntl",
    "fcntl64", "ioctl", "mmap", "mmap64", "munmap", "mremap",
}


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
    # DRM_IOCTL_VERSION answered by the shim, drmGetVersion's two passes and truncation
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
    """No UALINK_DRI_DIR: /dev/dri/renderD128 is opened as asked, which fails here."""
    if os.path.exists("/dev/dri/renderD128"):
        pytest.skip("this machine has a real /dev/dri/renderD128")
    plain = run([c_program("unmodified_client")])
    shimmed = run([c_program("unmodified_client")], LD_PRELOAD=str(SHIM))
    empty = run([c_program("unmodified_client")], LD_PRELOAD=str(SHIM), UALINK_DRI_DIR="")
    for r in (plain, shimmed, empty):
        assert r.returncode == 1
        assert steps(r.stdout) == {"open": {"status": "fail", "errno": str(errno.ENOENT)}}, r.stdout
        assert r.stderr == ""


def test_only_interposed_symbols_are_exported():
    c_program("libualink_shim.so")
    nm = subprocess.run(["nm", "-D", "--defined-only", str(SHIM)], capture_output=True,
                        text=True, check=True)
    exported = {line.split()[-1] for line in nm.stdout.splitlines() if line.strip()}
    assert exported == INTERPOSED


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
