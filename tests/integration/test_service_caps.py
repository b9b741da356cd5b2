"""packaging/ualinkd@.service: its capability bounding set is enough for what a node does for
clients of another uid (spec §2.5 PRIME FD_TO_HANDLE through /proc/<pid>/fd, Emulator policy
5; user memory through /proc/<pid>/mem). The node runs as root limited to exactly the unit's
CapabilityBoundingSet (setpriv), the client as nobody, with raw ioctls only."""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from nodes import SHIM, c_program, start_node

from ualinkd.config import PodConfig

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                       reason="needs root and setpriv"),
]
# The client runs as nobody, which cannot reach a python under /root (pyenv): it uses
# Debian's /usr/bin/python3, which `make setup` installs (python3-venv, python3-dev).

UNIT = Path(__file__).resolve().parents[2] / "packaging" / "ualinkd@.service"

CLIENT = """
import fcntl, os, struct, sys
mount = sys.argv[1]
fd = os.open(mount + "/dri/renderD128", os.O_RDWR)
arg = bytearray(struct.pack("<QQQQ", 4096, 0, 4, 0))
fcntl.ioctl(fd, 0xC0206440, arg, True)                        # AMDGPU_GEM_CREATE
handle = struct.unpack_from("<I", arg)[0]
arg = bytearray(struct.pack("<IIi", handle, 0x80002, -1))
fcntl.ioctl(fd, 0xC00C642D, arg, True)                        # PRIME_HANDLE_TO_FD: a token
token = struct.unpack_from("<I", arg, 8)[0]
buf = os.open(f"{mount}/dmabuf/{token}", os.O_RDWR)
arg = bytearray(struct.pack("<IIi", 0, 0, buf))
fcntl.ioctl(fd, 0xC00C642E, arg, True)                        # PRIME_FD_TO_HANDLE
print(handle, struct.unpack_from("<I", arg)[0])
"""


def bounding_set() -> list[str]:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read_string(UNIT.read_text())
    return unit["Service"]["CapabilityBoundingSet"].split()


def test_unit_capabilities_serve_a_client_of_another_uid():
    caps = ",".join("+" + c.lower().removeprefix("cap_") for c in bounding_set())
    tmp = Path(tempfile.mkdtemp(prefix="ualink-caps-", dir="/tmp"))
    tmp.chmod(0o755)  # the nobody client reaches the mount through it
    node = None
    try:
        node = start_node(tmp, PodConfig.local(1, 1), "node0",
                          prefix=["setpriv", f"--bounding-set=-all,{caps}", "--"])
        r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                            "/usr/bin/python3", "-c", CLIENT, str(node.mount)],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr + node.log_text()
        created, found = r.stdout.split()
        assert created == found  # the same dma-buf → the same handle (§2.5)
    finally:
        if node is not None:
            node.stop()
        shutil.rmtree(tmp, ignore_errors=True)


# The unit's seccomp filter (SystemCallFilter, SystemCallErrorNumber=EPERM), applied as
# systemd would, then the node exec'd under it: python3-seccomp from Debian, the groups
# expanded by systemd-analyze.
SECCOMP_EXEC = """
import errno, os, seccomp, sys
f = seccomp.SyscallFilter(seccomp.ERRNO(errno.EPERM))
for name in sys.argv[1].split(","):
    try:
        f.add_rule(seccomp.ALLOW, name)
    except Exception:  # a name libseccomp does not know on this arch
        pass
f.load()
os.execv(sys.argv[2], sys.argv[2:])
"""


def unit_syscalls() -> set[str]:
    """The calls SystemCallFilter= allows: its @groups expanded (nested ones too)."""
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read_string(UNIT.read_text())
    todo, seen, names = unit["Service"]["SystemCallFilter"].split(), set(), set()
    while todo:
        item = todo.pop()
        if not item.startswith("@"):
            names.add(item)
            continue
        if item in seen:
            continue
        seen.add(item)
        out = subprocess.run(["systemd-analyze", "syscall-filter", item], capture_output=True,
                             text=True, check=True, timeout=30).stdout
        todo += [w.split()[0] for w in out.splitlines()[1:]
                 if w.strip() and not w.strip().startswith("#")]
    return names


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_unit_syscall_filter_serves_the_kfd_and_syncobj_eventfd(tmp_path: Path):
    """Under the unit's seccomp filter the node still serves what needs its rarer system
    calls: KFD ACQUIRE_VM and SYNCOBJ_EVENTFD take the caller's fd with pidfd_getfd (not
    in @system-service), PRIME_FD_TO_HANDLE reads /proc. libhsakmt and libdrm, unmodified,
    through the shim; any call refused shows as the client's failure."""
    if subprocess.run(["/usr/bin/python3", "-c", "import seccomp"]).returncode:
        pytest.skip("python3-seccomp is not installed (make apt installs it)")
    allowed = ",".join(sorted(unit_syscalls()))
    node = start_node(tmp_path, PodConfig.local(1, 1), "node0",
                      prefix=["/usr/bin/python3", "-c", SECCOMP_EXEC, allowed])
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LD_", "HSA"))}
        env.update(LD_PRELOAD=str(SHIM), UALINK_DRI_DIR=str(node.mount / "dri"))
        for prog in ("hsakmt_client", "libdrm_bo"):
            r = subprocess.run([c_program(prog)], env=env, capture_output=True, text=True,
                               timeout=120)
            assert r.returncode == 0, prog + r.stdout + r.stderr + node.log_text()
            assert "fail " not in r.stdout, r.stdout
        assert "Operation not permitted" not in node.log_text(), node.log_text()
    finally:
        node.stop()
