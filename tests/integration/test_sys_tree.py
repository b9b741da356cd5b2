"""The sys/ tree on a real mount: the DRM and PCI sysfs of each GPU as libdrm 2.4.114 walks
it (readlink, realpath, uevent, fscanf'd ids, config), and debugfs root only (issue 10
item 2): another uid gets EACCES for every debugfs file and every sys write, root keeps
reading, ualinkctl works as root and says why it cannot as another uid."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from nodes import Node, running_node

from ualinkd import sysfs
from ualinkd.cli import ctl
from ualinkd.config import PodConfig

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (FUSE mounts, setuid)"),
]
NOBODY = 65534


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    """One node with two GPUs, mounted where uid nobody can reach it."""
    tmp = Path(tempfile.mkdtemp(prefix="ualink-sys-", dir="/tmp"))
    tmp.chmod(0o755)
    try:
        with running_node(tmp, PodConfig.local(1, 2)) as n:
            yield n
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def get_subsystem_type(device: str) -> str:
    """libdrm's get_subsystem_type: readlink of <device>/subsystem, from its last '/'."""
    link = os.readlink(f"{device}/subsystem")
    return link[link.rindex("/"):]


def test_drm_and_pci_sysfs_as_libdrm_walks_it(node: Node):
    """drmGetDevice2's sysfs steps (userspace-surface §2.2 steps 2–6) for both GPUs, and
    drmGetPrimaryDeviceNameFromFd's readdir of device/drm: each GPU its own card<n>."""
    m = node.mount / "sys"
    for card, minor in ((0, 128), (1, 129)):
        bdf = f"0000:{0x10 + card:02x}:00.0"
        pci = m / f"devices/pci0000:{0x10 + card:02x}/{bdf}"
        for num in (minor, card):
            char = m / f"dev/char/226:{num}"
            assert os.stat(char / "device/drm")  # drmNodeIsDRM
            assert get_subsystem_type(str(char / "device")).startswith("/pci")
            assert os.path.realpath(char / "device") == str(pci)
            name = f"renderD{num}" if num >= 128 else f"card{num}"
            assert (char / "uevent").read_text() == (
                f"MAJOR=226\nMINOR={num}\nDEVNAME=dri/{name}\nDEVTYPE=drm_minor\n")
        assert os.readlink(m / f"class/drm/card{card}") == \
            f"../../devices/pci0000:{0x10 + card:02x}/{bdf}/drm/card{card}"
        assert sorted(os.listdir(m / f"class/drm/card{card}/device/drm")) == [
            f"card{card}", f"renderD{minor}"]
        uevent = (pci / "uevent").read_text()
        assert f"PCI_SLOT_NAME={bdf}\n" in uevent and "PCI_ID=1002:74A1\n" in uevent
        assert "DRIVER=amdgpu\n" in uevent
        assert [int((pci / f).read_text(), 16) for f in (
            "vendor", "device", "subsystem_vendor", "subsystem_device", "revision")] == [
            0x1002, 0x74A1, 0x1002, 0x74A1, 0]
        with open(pci / "config", "rb") as f:  # parse_config_sysfs_file: one read of 64
            cfg = f.read(64)
        assert len(cfg) == 64 and cfg[0:4] == bytes.fromhex("0210a174") and cfg[8] == 0
        assert cfg[44:48] == bytes.fromhex("0210a174")
        assert (pci / "ualink/accel_id").read_text() == f"{card}\n"
        assert os.path.samefile(m / f"bus/pci/devices/{bdf}", pci)
    assert sorted(os.listdir(node.mount / "dri")) == [
        "card0", "card1", "renderD128", "renderD129"]


_AS_NOBODY = textwrap.dedent("""
    import errno, json, os, sys
    mount, paths, writes = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
    os.setgroups([]); os.setgid(%(uid)d); os.setuid(%(uid)d)
    out = {}
    def errno_of(fn):
        try:
            fn()
        except OSError as e:
            return errno.errorcode[e.errno]
        return "ok"
    def read(p):
        with open(os.path.join(mount, p), "rb") as f:
            f.read()
    def write(p):
        fd = os.open(os.path.join(mount, p), os.O_WRONLY)
        try:
            os.write(fd, b"0\\n")
        finally:
            os.close(fd)
    for p in paths:
        out["read " + p] = errno_of(lambda: read(p))
    for p in writes:
        out["write " + p] = errno_of(lambda: write(p))
    out["list debugfs"] = errno_of(lambda: os.listdir(os.path.join(mount, "sys/kernel/debug")))
    print(json.dumps(out))
""") % {"uid": NOBODY}


def test_debugfs_and_sys_writes_are_root_only(node: Node):
    """Issue 10 item 2: as uid nobody every debugfs file is EACCES — even after root
    looked them up, so the kernel's dentry cache holds them — and so is a write to any
    sys attribute; the public sysfs files stay readable; root still reads debugfs."""
    debug = [f"{sysfs.DEBUGFS_DRI}/{minor}/{name}" for minor in (128, 129)
             for name in sorted(os.listdir(node.mount / sysfs.DEBUGFS_DRI / str(minor)))]
    debug.append(sysfs.FABRIC_STATUS)
    # 12 per GPU (kfd_allocations, _processes, _queues, amdgpu_cs_contexts) and ualink_fabric
    assert len(debug) == 25
    for p in debug:
        (node.mount / p).read_bytes()  # root: fine, and now cached
    ualink = sysfs.ualink_dir(128)
    public = [f"{ualink}/accel_state", "sys/dev/char/226:128/uevent",
              "sys/bus/pci/devices/0000:10:00.0/config", "sys/class/drm/version"]
    writes = [f"{ualink}/config/vpod_id", f"{ualink}/config/commit", f"{ualink}/accel_state",
              f"{ualink}/setup/accel_id", f"{ualink}/stations/flags",
              sysfs.debugfs_file(128, sysfs.DROP_MSG), "sys/dev/char/226:128/device/vendor"]
    r = subprocess.run([sys.executable, "-c", _AS_NOBODY, str(node.mount),
                        json.dumps(debug + public), json.dumps(writes)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got == {**{f"read {p}": "EACCES" for p in debug},
                   **{f"read {p}": "ok" for p in public},
                   **{f"write {p}": "EACCES" for p in writes},
                   "list debugfs": "EACCES"}
    assert sysfs.DEBUGFS["ualink_npa"].parse(node.debug(128, "ualink_npa")) == [
        {"used_pages": 0, "mappings": 0}]
    assert node.sysfs(128, "vpod_id") == "1\n"  # nobody's writes changed nothing


_CTL_AS_NOBODY = textwrap.dedent("""
    import os, sys
    from ualinkd.cli import ctl
    ctl.build_parser()  # its lazy imports, while /root's interpreter files are readable
    os.setgroups([]); os.setgid(%(uid)d); os.setuid(%(uid)d)
    sys.exit(ctl.main(["--mount", sys.argv[1], sys.argv[2]]))
""") % {"uid": NOBODY}


def test_ualinkctl_as_root_and_as_another_uid(node: Node):
    """Root reads everything (`all`); another uid reads the public sysfs (`state`) and is
    told in one line that debugfs needs root."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert ctl.main(["--mount", str(node.mount), "--json", "all"]) == 0
    doc = json.loads(out.getvalue())
    assert [a["render"] for a in doc["accels"]] == ["renderD128", "renderD129"]
    assert doc["accels"][1]["faults"] == {"gpu_faults": 0, "drop_msg": 0, "drop_next": []}
    state = subprocess.run([sys.executable, "-c", _CTL_AS_NOBODY, str(node.mount), "state"],
                           capture_output=True, text=True, timeout=60)
    assert state.returncode == 0 and "renderD129" in state.stdout, state.stderr
    peers = subprocess.run([sys.executable, "-c", _CTL_AS_NOBODY, str(node.mount), "peers"],
                           capture_output=True, text=True, timeout=60)
    assert peers.returncode == 1 and peers.stdout == ""
    assert peers.stderr == (
        f"ualinkctl: {node.mount}: reading sys/kernel/debug/dri/128/ualink_peers: Permission "
        "denied (EACCES) (debugfs is root only, as on a real host: run ualinkctl as root)\n")
