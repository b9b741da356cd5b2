"""GET_TILE_CONFIG, RUNTIME_ENABLE and SVM as the KFD of GET_VERSION 1.17 answers them
(kfd_chardev.c: kfd_ioctl_get_tile_config, kfd_ioctl_runtime_enable, kfd_ioctl_svm without
CONFIG_HSA_AMD_SVM; issue 14 item 3)."""

from __future__ import annotations

import errno
import struct

from test_kfd_rules import call, memory_node

from ualinkd.abi import ioctls as tbl
from ualinkd.abi import structs as st


def tile(node, p, gpu: int, tiles: int, macros: int, tptr: int = 0x1000,
         mptr: int = 0x2000):
    res = call(node, p, tbl.KFD_GET_TILE_CONFIG.cmd, st.KFD_GET_TILE_CONFIG.encode(
        st.KfdGetTileConfig(tptr, mptr, tiles, macros, gpu, 0, 0, 0)))
    return res.result, st.KFD_GET_TILE_CONFIG.decode(res.out)


def test_get_tile_config_clamps_counts_and_copies_out_through_caller_memory():
    """An unknown gpu_id EINVAL; gb_addr_config the profile's, banks/ranks 0 (gfx9); counts
    clamped to 32 tile / 16 macro modes and that many zero u32 written to each array; 0
    asked writes nothing; a faulting tile array EFAULT with num_tile_configs 0 (the macro
    count untouched), a faulting macro array EFAULT with num_macro_tile_configs 0."""
    node, p, (g0, _), _, mem = memory_node()
    assert tile(node, p, 0xBEEF, 1, 1)[0] == -errno.EINVAL
    rc, out = tile(node, p, g0, 100, 100)
    profile = node.devices[128].driver.profile
    assert rc == 0
    assert (out.num_tile_configs, out.num_macro_tile_configs) == (32, 16)
    assert (out.gb_addr_config, out.num_banks, out.num_ranks) == (profile.gb_addr_config, 0, 0)
    assert mem.writes == {0x1000: bytes(128), 0x2000: bytes(64)}
    mem.writes.clear()
    rc, out = tile(node, p, g0, 4, 0)
    assert rc == 0 and (out.num_tile_configs, out.num_macro_tile_configs) == (4, 0)
    assert mem.writes == {0x1000: bytes(16)}
    mem.writes.clear()
    assert tile(node, p, g0, 0, 0)[0] == 0 and mem.writes == {}
    mem.bad.add(0x1000)
    rc, out = tile(node, p, g0, 8, 99)
    assert rc == -errno.EFAULT
    assert (out.num_tile_configs, out.num_macro_tile_configs) == (0, 99)
    mem.bad = {0x2000}
    rc, out = tile(node, p, g0, 8, 3)
    assert rc == -errno.EFAULT and (out.num_tile_configs, out.num_macro_tile_configs) == (8, 0)


def test_runtime_enable_once_then_disable():
    """runtime_enable: ENABLE sets the state (r_debug, TTMP setup kept), a second ENABLE is
    EBUSY; without ENABLE it disables (0, also when not enabled); enabling again works.
    Introduced with the debugger API (1.13), so a 1.17 KFD must answer it."""
    node, p, _, _, _ = memory_node(1)
    cmd = tbl.KFD_RUNTIME_ENABLE.cmd
    assert cmd == 0xC0104B25
    ver = struct.unpack("<II", call(node, p, tbl.KFD_GET_VERSION.cmd).out)
    assert ver >= (1, 13)
    res = call(node, p, cmd, struct.pack("<QII", 0x7000, 3, 0))
    assert res.result == 0 and (p.runtime_enabled, p.r_debug, p.ttmp_setup) == (True, 0x7000,
                                                                                 True)
    assert struct.unpack("<QII", res.out)[2] == 0  # capabilities_mask not written
    assert call(node, p, cmd, struct.pack("<QII", 0, 1, 0)).result == -errno.EBUSY
    assert call(node, p, cmd, struct.pack("<QII", 0, 0, 0)).result == 0
    assert (p.runtime_enabled, p.r_debug, p.ttmp_setup) == (False, 0, False)
    assert call(node, p, cmd, struct.pack("<QII", 0, 0, 0)).result == 0
    assert call(node, p, cmd, struct.pack("<QII", 0, 1, 0)).result == 0
    assert not p.ttmp_setup


def test_svm_is_eperm_and_no_gpu_claims_the_svm_api():
    """kfd_ioctl_svm without CONFIG_HSA_AMD_SVM: EPERM whatever the op; consistently no GPU
    node's capability has HSA_CAP_SVMAPI_SUPPORTED (0x08000000), so libhsakmt never offers SVM."""
    from ualinkd import sysfs
    node, p, _, _, _ = memory_node(1)
    for op in (0, 1):
        res = call(node, p, tbl.KFD_SVM.cmd, struct.pack("<QQII", 1 << 32, 4096, op, 0))
        assert res.result == -errno.EPERM
    props = dict(line.split() for line in sysfs.resolve(
        node.sys_tree(), "devices/virtual/kfd/kfd/topology/nodes/1/properties")
        .read().splitlines())
    assert not int(props["capability"]) & 0x08000000
