"""What a test skips without is installed by `make apt` (or said here why it need not be),
so that `make test` on a fresh machine (CI's `.ci/run`) runs it. CI runs on a machine that
may keep what was installed there by hand: its green run said nothing of test_rocr's HIP
test, which skipped on any fresh machine because libamdhip64-dev was not in the Makefile's
APT_PKGS."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# The file a skip mark looks for -> the Debian package that ships it (and where).
SKIPPED_WITHOUT = {
    "/usr/include/hsakmt.h": "libhsakmt-dev",  # nodes.NEEDS_HSAKMT (seven test files)
    "/usr/include/hsa/hsa_ext_amd.h": "libhsa-runtime-dev",  # test_rocr.py
    "/usr/include/hsa/amd_hsa_queue.h": "libhsa-runtime-dev",  # unit/test_aql.py
    "/usr/include/hip/hip_runtime_api.h": "libamdhip64-dev",  # test_rocr.py's HIP test
    "/usr/bin/rocminfo": "rocminfo",  # test_hsakmt.py
    "/usr/bin/amdgpu_stress": "libdrm-tests",  # test_libdrm_cs.py
    "/usr/bin/tshark": "tshark",  # test_wireshark.py
    "/bin/ss": "iproute2",  # test_data_plane.py
    "/usr/include/libdrm/amdgpu_drm.h": "libdrm-dev",  # abi/test_abi_check.py
    "/usr/lib/python3/dist-packages/seccomp.cpython-311-x86_64-linux-gnu.so":
        "python3-seccomp",  # test_service_caps.py
}


# What else the tests look for, found in their source (`_looked_for`), and why make apt need
# not install it: part of a package it installs, a dependency of one, essential, or a tool
# whose tests say why they skip without it.
NOT_ITS_OWN_PACKAGE = {
    "gcc": "make apt's gcc",
    "cc": "gcc's (make apt)",
    "make": "make apt's make",
    "nm": "binutils, a dependency of gcc",
    "setpriv": "util-linux, essential on Debian",
    "podman": "make test-containers installs it (the container tier)",
    "podman-compose": "make test-containers installs it into the venv",
    "systemd-analyze": "systemd, on a machine that runs it; the unit's checks skip, saying so, "
                       "where there is none (a bare container)",
    "/usr/lib/x86_64-linux-gnu/libhsa-runtime64.so.1": "libhsa-runtime64-1, a dependency of "
                                                       "libhsa-runtime-dev (make apt)",
    "/usr/include/linux/kfd_ioctl.h": "linux-libc-dev, a dependency of gcc's libc6-dev",
    "/usr/include/libdrm": "libdrm-dev (make apt): /usr/include/libdrm/amdgpu_drm.h above",
}
_LOOKED_FOR = re.compile(r'shutil\.which\("([^"]+)"\)'
                         r'|(?:Path|os\.path\.exists)\("(/(?:usr|bin)/[^"]*)"\)')


def _looked_for() -> dict[str, list[str]]:
    """Every tool (shutil.which) and system file (Path / os.path.exists of /usr or /bin) a
    test's source names -> the files naming it."""
    found: dict[str, list[str]] = {}
    for f in sorted((REPO / "tests").rglob("*.py")):
        if f.name == Path(__file__).name:
            continue
        for m in _LOOKED_FOR.finditer(f.read_text()):
            found.setdefault(m.group(1) or m.group(2), []).append(str(f.relative_to(REPO)))
    return found


def test_every_tool_and_file_a_test_looks_for_is_accounted_for():
    """The table above is kept by hand: a new skip on a tool or file make apt does not
    install must be added to it (and so to APT_PKGS), or said here why not."""
    by_name = {Path(p).name: p for p in SKIPPED_WITHOUT}
    found = _looked_for()
    assert "hsakmt.h" in {Path(k).name for k in found}  # (the scan sees nodes.NEEDS_HSAKMT)
    unknown = {k: v for k, v in found.items()
               if k not in SKIPPED_WITHOUT and k not in NOT_ITS_OWN_PACKAGE
               and by_name.get(k) is None}
    assert unknown == {}, f"add to SKIPPED_WITHOUT (or say why not) what tests look for: {unknown}"


def _apt_pkgs() -> set[str]:
    """The packages `make apt` checks for and installs (its dry run's loop)."""
    r = subprocess.run(["make", "-n", "-C", str(REPO), "apt"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    m = re.search(r"for p in ([^;]*);", r.stdout)
    assert m, r.stdout
    return set(m.group(1).split())


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_every_package_a_test_skips_without_is_one_make_apt_installs():
    missing = sorted(set(SKIPPED_WITHOUT.values()) - _apt_pkgs())
    assert missing == [], f"tests skip on a fresh machine without {missing}: add to APT_PKGS"


@pytest.mark.parametrize("path", sorted(SKIPPED_WITHOUT))
def test_the_package_named_is_the_one_that_ships_the_file(path):
    """Where the file is here, dpkg says which package it came from: the table's."""
    if not os.path.exists(path) or shutil.which("dpkg-query") is None:
        pytest.skip(f"{path} is not on this machine")  # (make apt has not run here)
    r = subprocess.run(["dpkg-query", "-S", path], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    owners = {name.split(":")[0].strip() for name in r.stdout.split(": ", 1)[0].split(",")}
    assert SKIPPED_WITHOUT[path] in owners, r.stdout
