"""The ualink/ sysfs attribute files (spec §7.1), read from `node.ualink_sysfs`."""

from __future__ import annotations

import errno
import os
import stat
import uuid

import pytest
from ualink_testkit import make_node, pod_config

from ualinkd.amdgpu.driver import AmdgpuDriver
from ualinkd.drm.device import DrmDevice
from ualinkd.drm.tokens import DmaBufTokens
from ualinkd.fuse.backend import Caller as FuseCaller
from ualinkd.fuse.lowlevel import ROOT_INO, FuseError
from ualinkd.fuse.tree import FileTree
from ualinkd.node import ualink_sysfs
from ualinkd.sysfs import pci_bdf, resolve
from ualinkd.ualink.host import UalinkHost
from ualinkd.ualink.manager import UalinkManager
from ualinkd.ualink.state import AddrMode, ConfigStage, PpodInfo, VpodInfo

FILES = {
    "link_type", "accel_id", "bandwidth", "latency", "ppod_id", "ppod_size", "vpod_id",
    "vpod_size", "vpod_active_accels", "addr_mode", "accel_state", "local_accels",
}


def read_all(mgr) -> dict[str, str]:
    d = ualink_sysfs(mgr)
    assert set(d) == FILES
    for attr in d.values():
        assert attr.mode == 0o444 and attr.write is None  # read-only in the reference build
    return {name: attr.read() for name, attr in d.items()}


def bare_manager(ppod=None, vpod=None) -> UalinkManager:
    dev = DrmDevice(128, DmaBufTokens(), lambda pid, fd: None)  # type: ignore[arg-type, return-value]
    drv = AmdgpuDriver(dev, 1 << 20, 1 << 20)
    return UalinkManager(UalinkHost(), drv, ppod or PpodInfo(), vpod or VpodInfo(),
                         ConfigStage.IDLE)


def test_active_accel_values():
    """§7.1: exact text of every file for an active accel; uuid lowercase; every value
    ends with a newline."""
    core = make_node(pod_config(nodes=[[{"id": 3, "bandwidth": 400, "latency": 7},
                                        {"id": 1}], [{"id": 10}, {"id": 2}]]))
    mgr = core.managers[128]
    assert read_all(mgr) == {
        "link_type": "UALoE\n",
        "accel_id": "3\n",
        "bandwidth": "400\n",
        "latency": "7\n",
        "ppod_id": "0123abcd-4567-89ab-cdef-0123456789ab\n",
        "ppod_size": "11\n",
        "vpod_id": "1\n",
        "vpod_size": "4\n",
        "vpod_active_accels": "1 2 3 10\n",
        "addr_mode": "source-aliasing\n",
        "accel_state": "active\n",
        "local_accels": "3 1\n",
    }
    assert read_all(core.managers[129])["local_accels"] == "1 3\n"


def test_unset_values():
    """§7.1: 4294967295 until configured; empty bitmap prints just a newline; initial
    addr mode 2 → invalid; nil uuid."""
    vals = read_all(bare_manager())
    assert vals["accel_id"] == vals["bandwidth"] == vals["latency"] == "4294967295\n"
    assert vals["vpod_active_accels"] == "\n"
    assert vals["local_accels"] == "\n"
    assert vals["addr_mode"] == "invalid\n"
    assert vals["accel_state"] == "unconfigured\n"
    assert vals["vpod_id"] == "0\n"
    assert vals["ppod_id"] == "00000000-0000-0000-0000-000000000000\n"
    assert all(v.endswith("\n") and not v.endswith("\n\n") for v in vals.values())


def test_uuid_lowercase_and_identification_mode():
    """§7.1: UUID printed lowercase; source-identification spelled out."""
    u = uuid.UUID("ABCDEF00-1111-2222-3333-444455556666")
    mgr = bare_manager(PpodInfo(0, 1, 1, 4, u),
                       VpodInfo(9, 1, AddrMode.SOURCE_IDENTIFICATION, frozenset({0})))
    vals = read_all(mgr)
    assert vals["ppod_id"] == "abcdef00-1111-2222-3333-444455556666\n"
    assert vals["addr_mode"] == "source-identification\n"
    assert vals["vpod_active_accels"] == "0\n"


def test_reads_are_live():
    """§7.1: files reflect the current state on every read."""
    core = make_node(pod_config(nodes=[[{"id": 0}], [{"id": 5}]]))
    mgr = core.managers[128]
    attrs = ualink_sysfs(mgr)
    assert attrs["accel_state"].read() == "active\n"
    mgr.deactivate()
    assert attrs["accel_state"].read() == "ppod_configured\n"


def test_sys_tree_layout():
    """§7.1: /sys/class/drm/renderD<minor>/device/ualink/ for every render node."""
    core = make_node(pod_config(nodes=[[{"id": 0}, {"id": 1}], [{"id": 5}]]))
    sys_tree = core.sys_tree()
    drm = sys_tree["class"]["drm"]
    assert {n for n in drm if n.startswith("renderD")} == {"renderD128", "renderD129"}
    ualink = resolve(sys_tree, "class/drm/renderD129/device/ualink")
    assert set(ualink) == FILES | {"setup", "config", "stations"}  # policy 8: live config dirs
    assert all(ualink[n].mode == 0o444 for n in FILES)
    assert ualink["accel_id"].read() == "1\n"


# -- the mounted tree, driven through FileTree's operations (no mount needed) -----------------

ROOT = FuseCaller(pid=1, uid=0, gid=0)
USER = FuseCaller(pid=2, uid=1000, gid=1000)


def walk(tree: FileTree, path: str, caller=ROOT) -> int:
    """The inode at `path` (relative to the mount), by lookups as the kernel does them,
    following symlinks (relative to the link's directory) on the way."""
    todo = [p for p in path.split("/") if p]
    stack = [ROOT_INO]  # the directories walked, for ".."
    hops = 0
    while todo:
        name = todo.pop(0)
        if name == "..":
            if len(stack) > 1:
                stack.pop()
            continue
        attr = tree.lookup(stack[-1], name, caller)
        if stat.S_ISLNK(attr.mode):
            hops += 1
            assert hops < 40, f"{path}: symlink loop"
            todo = tree.readlink(attr.ino, caller).decode().split("/") + todo
            continue
        stack.append(attr.ino)
    return stack[-1]


def read(tree: FileTree, path: str, caller=ROOT) -> str:
    ino = walk(tree, path)
    fh = tree.open(ino, os.O_RDONLY, caller).fh
    try:
        return tree.read(ino, fh, 0, 4096, caller).decode()  # type: ignore[union-attr]
    finally:
        tree.release(ino, fh)


def write(tree: FileTree, path: str, text: str, caller=ROOT) -> None:
    ino = walk(tree, path)
    fh = tree.open(ino, os.O_WRONLY, caller).fh
    try:
        tree.write(ino, fh, 0, text.encode(), caller)
    finally:
        tree.release(ino, fh)


def open_errno(tree: FileTree, path: str, flags: int, caller=ROOT) -> int:
    with pytest.raises(FuseError) as e:
        tree.open(walk(tree, path), flags, caller)
    return e.value.errno


def test_ualink_dir_under_the_pci_device_card_and_render_node():
    """§7.1: `ualink/` sits under the GPU's PCI device (/sys/bus/pci/devices/<BDF>/ualink/),
    also reachable as /sys/class/drm/card*/device/ualink/ and renderD*/device/ualink/. The
    three paths hold the same attribute objects; card<n> is renderD<128+n>; the made-up BDF
    is 0000:<0x10 + index>:00.0."""
    core = make_node(pod_config(nodes=[[{"id": 0}, {"id": 1}], [{"id": 5}]]))
    sys_tree = core.sys_tree()
    drm, pci = sys_tree["class"]["drm"], sys_tree["bus"]["pci"]["devices"]
    assert set(drm) == {"card0", "card1", "renderD128", "renderD129", "version"}
    assert set(pci) == {"0000:10:00.0", "0000:11:00.0"} == {pci_bdf(128), pci_bdf(129)}
    for index, minor in enumerate((128, 129)):
        ualink = resolve(sys_tree, f"class/drm/renderD{minor}/device/ualink")
        assert resolve(sys_tree, f"class/drm/card{index}/device/ualink") is ualink
        assert resolve(sys_tree, f"bus/pci/devices/{pci_bdf(minor)}/ualink") is ualink

    tree = FileTree(core, "/nonexistent")
    paths = ["sys/class/drm/renderD129/device/ualink", "sys/class/drm/card1/device/ualink",
             "sys/bus/pci/devices/0000:11:00.0/ualink"]
    for p in paths:
        assert read(tree, f"{p}/accel_id") == "1\n"
        assert open_errno(tree, f"{p}/accel_state", os.O_WRONLY) == errno.EACCES
    # A write through one path is what the others read, and a commit through another acts.
    write(tree, f"{paths[1]}/config/vpod_id", "0\n")
    assert read(tree, f"{paths[2]}/config/vpod_id") == read(tree, f"{paths[0]}/config/vpod_id")
    assert read(tree, f"{paths[0]}/config/vpod_id") == "0\n"
    write(tree, f"{paths[2]}/config/commit", "true\n")
    assert {read(tree, f"{p}/accel_state") for p in paths} == {"ppod_configured\n"}
    assert read(tree, "sys/class/drm/card0/device/ualink/accel_state") == "active\n"


@pytest.mark.parametrize("caller", [ROOT, USER], ids=["root", "user"])
def test_no_read_bit_no_read_open_no_write_bit_no_write_open(caller):
    """§7.1 modes, as kernfs_fop_open: a file with no read bit (the 0200 commit files) is
    EACCES for a read open and one with no write bit (the 0444 attributes) for a write
    open, whatever the uid; root may read and write the 0600 files, others may not."""
    core = make_node(pod_config(nodes=[[{"id": 0}], [{"id": 5}]]))
    tree = FileTree(core, "/nonexistent")
    base = "sys/class/drm/renderD128/device/ualink"
    for commit in ("setup/commit", "config/commit", "stations/commit"):
        assert open_errno(tree, f"{base}/{commit}", os.O_RDONLY, caller) == errno.EACCES
        assert open_errno(tree, f"{base}/{commit}", os.O_RDWR, caller) == errno.EACCES
    assert open_errno(tree, f"{base}/accel_state", os.O_WRONLY, caller) == errno.EACCES
    assert read(tree, f"{base}/accel_state", caller) == "active\n"
    if caller is ROOT:
        assert read(tree, f"{base}/config/vpod_id", caller) == "1\n"
        write(tree, f"{base}/stations/flags", "0x4\n", caller)
        write(tree, f"{base}/stations/commit", "true", caller)
    else:
        for flags in (os.O_RDONLY, os.O_WRONLY):
            assert open_errno(tree, f"{base}/config/vpod_id", flags, caller) == errno.EACCES
        assert open_errno(tree, f"{base}/config/commit", os.O_WRONLY, caller) == errno.EACCES
