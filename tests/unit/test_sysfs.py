"""The ualink/ sysfs attribute files (spec §7.1), read from `node.ualink_sysfs`."""

from __future__ import annotations

import errno
import os
import stat
import uuid

import pytest
from ualink_testkit import gem_create, make_node, open_file, pod_config

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


# -- the DRM and PCI sysfs of each GPU, as libdrm 2.4.114 reads it -------------------------------

TWO_GPUS = [[{"id": 0}, {"id": 1, "profile": "mi300a"}], [{"id": 5}]]


def test_minors_and_pci_device_as_drmGetDevice2_reads_them():
    """libdrm's drmNodeIsDRM (stat 226:M/device/drm), drmGetDeviceNameFromFd2 (the minor's
    uevent DEVNAME), drmParseSubsystemType (strrchr of the subsystem link's target starts
    "/pci"), get_pci_path (realpath of 226:M/device), drmParsePciBusInfo (PCI_SLOT_NAME as
    %04x:%02x:%02x.%1u) and parse_separate_sysfs_files (fscanf %x), each GPU its own
    profile (userspace-surface §2.2)."""
    core = make_node(pod_config(nodes=TWO_GPUS))
    sys_tree = core.sys_tree()
    for minor, card, device_id, bdf in ((128, 0, 0x74A1, "0000:10:00.0"),
                                        (129, 1, 0x74A0, "0000:11:00.0")):
        pci = resolve(sys_tree, f"devices/pci0000:{0x10 + card:02x}/{bdf}")
        for m, name in ((minor, f"renderD{minor}"), (card, f"card{card}")):
            node = resolve(sys_tree, f"dev/char/226:{m}")
            assert node is resolve(sys_tree, f"class/drm/{name}") is pci["drm"][name]
            assert resolve(sys_tree, f"dev/char/226:{m}/device") is pci
            assert isinstance(resolve(sys_tree, f"dev/char/226:{m}/device/drm"), dict)
            assert node["uevent"].read() == (
                f"MAJOR=226\nMINOR={m}\nDEVNAME=dri/{name}\nDEVTYPE=drm_minor\n")
            assert node["dev"].read() == f"226:{m}\n"
            assert resolve(sys_tree, f"dev/char/226:{m}/subsystem") is sys_tree["class"]["drm"]
        # Each accel its own card<n>: drmGetPrimaryDeviceNameFromFd keeps them apart.
        assert sorted(pci["drm"]) == [f"card{card}", f"renderD{minor}"]
        target = pci["subsystem"].target
        assert target[target.rindex("/"):].startswith("/pci")
        assert resolve(sys_tree, f"dev/char/226:{minor}/device/subsystem") \
            is sys_tree["bus"]["pci"]
        assert resolve(sys_tree, f"bus/pci/devices/{bdf}") is pci
        assert resolve(sys_tree, f"bus/pci/drivers/amdgpu/{bdf}") is pci
        assert resolve(sys_tree, f"devices/pci0000:{0x10 + card:02x}/{bdf}/driver") \
            is sys_tree["bus"]["pci"]["drivers"]["amdgpu"]
        uevent = dict(line.split("=", 1) for line in pci["uevent"].read().splitlines())
        assert uevent["DRIVER"] == "amdgpu"
        assert uevent["PCI_ID"] == f"1002:{device_id:04X}"
        assert uevent["PCI_SLOT_NAME"] == bdf
        dom, bus, dev_fn = bdf.split(":")
        assert (int(dom, 16), int(bus, 16), dev_fn) == (0, 0x10 + card, "00.0")
        files = {n: pci[n].read() for n in ("vendor", "device", "subsystem_vendor",
                                            "subsystem_device", "revision")}
        assert files == {"vendor": "0x1002\n", "device": f"{device_id:#06x}\n",
                         "subsystem_vendor": "0x1002\n",
                         "subsystem_device": f"{device_id:#06x}\n", "revision": "0x00\n"}
        assert pci["ualink"]["accel_id"].read() == f"{card}\n"


def test_pci_config_header_as_parse_config_sysfs_file_reads_it():
    """libdrm's fallback when `revision` is missing: 64 bytes of config space, vendor@0,
    device@2, revision@8, subsystem vendor@44, device@46, little-endian."""
    import struct

    from ualinkd.amdgpu.profile import PROFILES

    core = make_node(pod_config(nodes=TWO_GPUS))
    for bdf, profile in (("0000:10:00.0", PROFILES["mi300x"]),
                         ("0000:11:00.0", PROFILES["mi300a"])):
        attr = resolve(core.sys_tree(), f"bus/pci/devices/{bdf}/config")
        cfg = attr.read()
        assert isinstance(cfg, bytes) and len(cfg) == 64 == attr.size
        assert struct.unpack_from("<HH", cfg, 0) == (profile.pci_vendor, profile.pci_device)
        assert cfg[8] == profile.pci_revision
        assert struct.unpack_from("<HH", cfg, 44) == (profile.subsystem_vendor,
                                                      profile.subsystem_device)


def test_links_through_the_file_tree():
    """The FUSE tree serves SysLinks as symlinks (S_IFLNK, readlink gives the relative
    target, readdir says DT_LNK), and a walk that follows them as the kernel does reaches
    the PCI directory from every name; dri/ has card<n> beside renderD<128+n>."""
    core = make_node(pod_config(nodes=TWO_GPUS))
    tree = FileTree(core, "/nonexistent")
    ino = walk(tree, "sys/class/drm")
    attr = tree.lookup(ino, "card1", ROOT)
    assert stat.S_ISLNK(attr.mode) and attr.size == len(
        b"../../devices/pci0000:11/0000:11:00.0/drm/card1")
    assert tree.readlink(attr.ino, ROOT) == b"../../devices/pci0000:11/0000:11:00.0/drm/card1"
    types = {name: mode for name, _, mode, _ in tree.readdir(ino, 0, 0)}
    assert types["card1"] == types["renderD128"] == stat.S_IFLNK
    assert types["version"] == stat.S_IFREG
    pci = walk(tree, "sys/devices/pci0000:11/0000:11:00.0")
    for path in ("sys/dev/char/226:129/device", "sys/dev/char/226:1/device",
                 "sys/class/drm/card1/device", "sys/bus/pci/devices/0000:11:00.0",
                 "sys/class/drm/renderD129/device/drm/card1/device"):
        assert walk(tree, path) == pci, path
    assert read(tree, "sys/dev/char/226:1/device/uevent").endswith(
        "PCI_SLOT_NAME=0000:11:00.0\nMODALIAS=pci:v00001002d000074A0sv00001002sd000074A0"
        "bc12sc00i00\n")
    with pytest.raises(FuseError) as e:
        tree.readlink(walk(tree, "sys/class/drm/version"), ROOT)
    assert e.value.errno == errno.EINVAL
    dri = walk(tree, "dri")
    assert sorted(n for n, *_ in tree.readdir(dri, 0, 0) if n[0] != ".") == [
        "card0", "card1", "renderD128", "renderD129"]
    card1 = tree.lookup(dri, "card1", ROOT).ino
    fh = tree.open(card1, os.O_RDWR, USER).fh
    try:
        assert tree._render_fh[fh].device.minor == 129  # the same GPU as renderD129
    finally:
        tree.release(card1, fh)


# -- permissions: debugfs is root's, and no sys file is writable by others (issue 10 item 2) -----

DEBUGFS_FILES = ["amdgpu_cs_contexts", "clients", "gem_objects", "gpu_faults",
                 "kfd_allocations", "kfd_processes", "kfd_queues", "ualink_drop_msg",
                 "ualink_exports", "ualink_imports", "ualink_npa", "ualink_peers"]


def _files(tree: dict, path: str = ""):
    for name, item in tree.items():
        p = f"{path}/{name}" if path else name
        if isinstance(item, dict):
            yield p, item
            yield from _files(item, p)
        else:
            yield p, item


def test_modes_debugfs_root_only_and_no_file_writable_by_others():
    """debugfs is mounted 0700 root (its handles are capabilities: a uid that reads
    ualink_exports can import anyone's BO); every writable attribute is writable by root
    only, as sysfs attributes are (§7.1: 0600 / 0200)."""
    from ualinkd.sysfs import SysAttr, SysLink, dir_mode

    core = make_node(pod_config(nodes=TWO_GPUS))
    sys_tree = core.sys_tree()
    assert dir_mode(sys_tree["kernel"]["debug"]) == 0o700
    assert sorted(sys_tree["kernel"]["debug"]["dri"]["128"]) == DEBUGFS_FILES
    seen = 0
    for path, item in _files(sys_tree):
        if isinstance(item, SysLink):
            continue
        mode = dir_mode(item) if isinstance(item, dict) else item.mode
        if path.startswith("kernel/debug/"):
            assert mode & 0o077 == 0, (path, oct(mode))
            seen += 1
        if isinstance(item, SysAttr):
            assert mode & 0o022 == 0, (path, oct(mode))
            if item.write is None:
                assert mode & 0o222 == 0, (path, oct(mode))
    # dri/, per minor dir + files, ualink_fabric, ualink_data_plane, cpu_map_grants
    assert seen == 1 + 2 * (1 + len(DEBUGFS_FILES)) + 3


def test_debugfs_refuses_other_uids_at_every_step():
    """As a 0700 debugfs: another uid cannot search or list the directories, stat what is
    in them, or open a file, even through an inode the kernel cached from root's lookup
    (FUSE answers cached dentries without a lookup: the open is checked too). Root reads
    and writes them."""
    core = make_node(pod_config(nodes=TWO_GPUS))
    tree = FileTree(core, "/nonexistent")
    debug = walk(tree, "sys/kernel/debug")
    assert stat.S_IMODE(tree.getattr(debug, USER).mode) == 0o700  # stat of the mount point
    for caller in (USER, FuseCaller(pid=3, uid=1000, gid=0)):
        for parent, name in ((debug, "dri"), (walk(tree, "sys/kernel/debug/dri"), "128")):
            with pytest.raises(FuseError) as e:
                tree.lookup(parent, name, caller)
            assert e.value.errno == errno.EACCES
        for d in ("sys/kernel/debug", "sys/kernel/debug/dri", "sys/kernel/debug/dri/129"):
            with pytest.raises(FuseError) as e:
                tree.opendir(walk(tree, d), caller)
            assert e.value.errno == errno.EACCES
        for name in DEBUGFS_FILES:
            ino = walk(tree, f"sys/kernel/debug/dri/128/{name}")  # root looked it up
            with pytest.raises(FuseError) as e:
                tree.getattr(ino, caller)
            assert e.value.errno == errno.EACCES, name
            with pytest.raises(FuseError) as e:
                tree.open(ino, os.O_RDONLY, caller)
            assert e.value.errno == errno.EACCES, name
        with pytest.raises(FuseError) as e:
            tree.open(walk(tree, "sys/kernel/debug/ualink_fabric"), os.O_RDONLY, caller)
        assert e.value.errno == errno.EACCES
    assert read(tree, "sys/kernel/debug/dri/128/ualink_npa") == "used_pages=0 mappings=0\n"
    write(tree, "sys/kernel/debug/dri/128/ualink_drop_msg", "0x10")
    assert read(tree, "sys/kernel/debug/dri/128/ualink_drop_msg") == "0x10\n"
    assert read(tree, "sys/class/drm/renderD128/device/ualink/accel_state", USER) == "active\n"


# -- the line formats: what the daemon prints is what the readers parse --------------------------


def test_debugfs_lines_round_trip():
    """sysfs.DEBUGFS: line() is the daemon's, parse_line() ualinkctl's and the harnesses'."""
    from ualinkd import sysfs

    fmt = sysfs.DEBUGFS["ualink_exports"]
    line = fmt.line(handle_lo=0x1234, handle_hi=0xABC, bo=3, size=4096, pins=1,
                    importers={5, 2})
    assert line == "0x0000000000001234 0x0000000000000abc bo=3 size=4096 pins=1 importers=2,5\n"
    assert fmt.parse_line(line) == {"handle_lo": "0x0000000000001234",
                                    "handle_hi": "0x0000000000000abc", "bo": 3, "size": 4096,
                                    "pins": 1, "importers": [2, 5]}
    with pytest.raises(TypeError):
        fmt.line(bo=1)
    fabric = {"node1": "up", "node2": "down", "node3": "unlinked", "node4": "linking"}
    text = sysfs.show_fabric(fabric)
    # the second field stays up|down; a link on first use not up yet says which in a third
    assert text == "node1 up\nnode2 down\nnode3 down unlinked\nnode4 down linking\n"
    assert sysfs.parse_fabric(text) == {
        "node1": True, "node2": False, "node3": False, "node4": False}
    assert sysfs.parse_fabric_states(text) == fabric
    assert sysfs.parse_fabric_states("node5 down what\n") == {"node5": "down"}
    assert sysfs.parse_drop_msg(sysfs.show_drop_msg(0x82)) == 0x82
    counters = {"fast_loads": 7, "served": 0, "channels": 2}
    assert sysfs.show_data_plane(counters) == "fast_loads 7\nserved 0\nchannels 2\n"
    assert sysfs.parse_data_plane(sysfs.show_data_plane(counters)) == counters
    with pytest.raises(sysfs.ParseError):
        sysfs.parse_drop_msg("zz")
    core = make_node(pod_config(nodes=TWO_GPUS))
    f = open_file(core)
    debug = core.sys_tree()["kernel"]["debug"]["dri"]["128"]
    assert sysfs.DEBUGFS["clients"].parse(debug["clients"].read()) == [
        {"pid": f.pid, "uid": f.uid, "handles": 0}]


def test_a_sys_file_read_in_pieces_is_one_text():
    """seq_file's rule: the read at offset 0 takes the text, later offsets of the same open
    read from it, so a debugfs table longer than one FUSE read that changes meanwhile is
    never torn (it was: 'cannot parse 292t=1'); a new open (or a read at 0) sees the change."""
    core = make_node(pod_config(nodes=TWO_GPUS))
    tree = FileTree(core, "/nonexistent")
    f = open_file(core)
    ino = walk(tree, "sys/kernel/debug/dri/128/gem_objects")
    fh = tree.open(ino, os.O_RDONLY, ROOT).fh
    first = tree.read(ino, fh, 0, 10, ROOT)
    for _ in range(50):  # the table grows between the two reads
        gem_create(f, 4096)
    rest = tree.read(ino, fh, 10, 1 << 20, ROOT)
    whole = tree.read(ino, fh, 0, 1 << 20, ROOT)
    assert len(first + rest) < len(whole)  # the later state is longer
    assert whole.startswith(first)
    tree.release(ino, fh)
