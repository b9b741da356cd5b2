"""amdgpu GEM ioctls: GEM_CREATE (spec §2.3), GEM_MMAP (§2.7), GEM_OP (§2.8)."""

from __future__ import annotations

import errno
import struct

import pytest
import ualink_testkit as kit

from ualinkd.abi import constants as c
from ualinkd.abi import structs as st

KIB = 1024


@pytest.fixture
def ctu() -> kit.CopyToUserFake:
    return kit.CopyToUserFake()


@pytest.fixture
def core(ctu):
    accels = [{"id": 0, "vram_size": 64 * KIB, "gtt_size": 64 * KIB}, {"id": 1}]
    return kit.make_node(kit.pod_config(nodes=[accels]), copy_to_user=ctu)


@pytest.fixture
def f(core):
    return kit.open_file(core)


def bo(f, handle):
    return f.handles[handle]


# ---- GEM_CREATE (§2.3) -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags",
    [1 << 4, c.CREATE_VRAM_CONTIGUOUS, c.CREATE_CP_MQD_GFX9, c.CREATE_PREEMPTIBLE, 1 << 17,
     1 << 63],
)
def test_create_unsettable_flag_is_einval(f, flags):
    """§2.3: a flag outside the settable mask 0x1F6CF → EINVAL; the input is echoed."""
    data = st.GEM_CREATE_IN.encode(st.GemCreateIn(4096, 0, c.DOMAIN_VRAM, flags))
    r = kit.ioctl(f, 0xC0206440, data)
    assert (r.result, r.out) == (-errno.EINVAL, data)
    assert f.handles == {}


@pytest.mark.parametrize("domains", [0x80, c.DOMAIN_NPA | c.DOMAIN_VRAM, 0x100, 1 << 63])
def test_create_domain_outside_mask_is_einval(f, domains):
    """§2.3 / policy 6: any domain bit outside 0x7F (including NPA 0x80) → EINVAL."""
    assert kit.gem_create_raw(f, domains=domains).result == -errno.EINVAL


@pytest.mark.parametrize(
    "domains",
    [c.DOMAIN_GDS | c.DOMAIN_VRAM, c.DOMAIN_GWS | c.DOMAIN_OA, c.DOMAIN_DOORBELL | c.DOMAIN_GTT,
     c.DOMAIN_OA | c.DOMAIN_CPU, c.DOMAIN_GDS | c.DOMAIN_DOORBELL],
)
def test_create_special_domain_combination_is_einval(f, domains):
    """§2.3: GDS/GWS/OA/DOORBELL must stand alone."""
    assert kit.gem_create_raw(f, domains=domains).result == -errno.EINVAL


def test_create_gds_with_vm_always_valid_is_einval(f):
    """§2.3: GDS/GWS/OA with VM_ALWAYS_VALID → EINVAL; alone they force NO_CPU_ACCESS."""
    r = kit.gem_create_raw(f, domains=c.DOMAIN_GDS, flags=c.CREATE_VM_ALWAYS_VALID)
    assert r.result == -errno.EINVAL
    h = kit.gem_create(f, 1, domains=c.DOMAIN_GWS)
    assert bo(f, h).flags & c.CREATE_NO_CPU_ACCESS


def test_doorbell_bos_are_accounted(f):
    """Issue 10 item 10: a DOORBELL BO's bytes are the daemon's like any BO's (it can be
    GEM_VA mapped and stored to), so it is charged to the GTT pool: a 1 TiB one is ENOMEM,
    a small one takes its size from GTT."""
    domain = c.DOMAIN_DOORBELL
    assert kit.gem_create_raw(f, size=1 << 40, domains=domain).result == -errno.ENOMEM
    gtt = f.device.driver.gtt
    h = kit.gem_create(f, 16 * KIB, domains=domain)
    assert bo(f, h).placement is gtt and gtt.used == 16 * KIB


def test_gds_gws_oa_bos_are_entries_of_their_aperture(f):
    """gfx_v9_4_3_set_gds_init, amdgpu_bo_create: GC 9.4.3 has no GDS (any GDS BO is
    ENOMEM, TTM's ENOSPC as ttm_bo_validate answers it); GWS and OA sizes count entries (64
    and 16), each one page of the BO (GDS's rounded up to a multiple of 4); entries go back
    when the BO goes; GTT is not charged."""
    gtt = f.device.driver.gtt
    assert kit.gem_create_raw(f, size=1, domains=c.DOMAIN_GDS).result == -errno.ENOMEM
    assert kit.gem_create_raw(f, size=65, domains=c.DOMAIN_GWS).result == -errno.ENOMEM
    gws = kit.gem_create(f, 60, domains=c.DOMAIN_GWS)
    assert bo(f, gws).size == 60 * 4096 and gtt.used == 0
    assert kit.gem_create_raw(f, size=5, domains=c.DOMAIN_GWS).result == -errno.ENOMEM
    assert kit.gem_create(f, 4, domains=c.DOMAIN_GWS)
    oa = kit.gem_create(f, 16, domains=c.DOMAIN_OA)
    assert kit.gem_create_raw(f, size=1, domains=c.DOMAIN_OA).result == -errno.ENOMEM
    f.handle_delete(oa)
    assert kit.gem_create(f, 3, domains=c.DOMAIN_OA)


def test_create_encrypted_is_einval(f):
    """§2.3: ENCRYPTED is settable but TMZ is off → EINVAL."""
    assert kit.gem_create_raw(f, flags=c.CREATE_ENCRYPTED).result == -errno.EINVAL


def test_create_success_zeroes_bytes_4_to_31(f):
    """§2.3: on success the 32-byte union is zeroed, then out.handle set."""
    data = st.GEM_CREATE_IN.encode(
        st.GemCreateIn(4096, 0xFFFF_FFFF_FFFF_F000, c.DOMAIN_VRAM, c.CREATE_EXPLICIT_SYNC))
    r = kit.ioctl(f, 0xC0206440, data)
    assert r.result == 0
    assert r.out == struct.pack("<I", 1) + bytes(28)


def test_create_forces_cleared_and_wipe_flags(f):
    """§2.3: VRAM_CLEARED and VRAM_WIPE_ON_RELEASE are always on; size rounds up to pages."""
    h = kit.gem_create(f, size=1, flags=c.CREATE_CPU_ACCESS_REQUIRED)
    b = bo(f, h)
    assert b.flags == (c.CREATE_CPU_ACCESS_REQUIRED | c.CREATE_VRAM_CLEARED
                       | c.CREATE_VRAM_WIPE_ON_RELEASE)
    assert b.size == 4096


def test_vram_only_falls_back_to_gtt_then_enomem(core, f):
    """§2.3: a VRAM-only BO that does not fit is retried as VRAM|GTT; nothing fits → ENOMEM;
    freeing returns the capacity."""
    drv = kit.device(core).driver
    h1 = kit.gem_create(f, size=48 * KIB)
    assert bo(f, h1).placement is drv.vram
    assert bo(f, h1).preferred_domains == c.DOMAIN_VRAM
    h2 = kit.gem_create(f, size=32 * KIB)
    assert bo(f, h2).placement is drv.gtt
    assert bo(f, h2).preferred_domains == c.DOMAIN_VRAM | c.DOMAIN_GTT
    assert (drv.vram.used, drv.gtt.used) == (48 * KIB, 32 * KIB)
    r = kit.gem_create_raw(f, size=48 * KIB)
    assert r.result == -errno.ENOMEM
    assert kit.gem_create_raw(f, size=48 * KIB, domains=c.DOMAIN_GTT).result == -errno.ENOMEM
    kit.gem_close(f, h1)
    assert drv.vram.used == 0
    h3 = kit.gem_create(f, size=64 * KIB)
    assert bo(f, h3).placement is drv.vram
    kit.gem_close(f, h2)
    kit.gem_close(f, h3)
    assert (drv.vram.used, drv.gtt.used) == (0, 0)


def test_retry_drops_cpu_access_required_first(core, f):
    """§2.3: on allocation failure the kernel retries without CPU_ACCESS_REQUIRED, then as
    VRAM|GTT: a BO that needed a retry has lost the flag; one that fit keeps it."""
    drv = kit.device(core).driver
    h1 = kit.gem_create(f, size=48 * KIB, flags=c.CREATE_CPU_ACCESS_REQUIRED)
    assert bo(f, h1).flags & c.CREATE_CPU_ACCESS_REQUIRED
    h2 = kit.gem_create(f, size=32 * KIB, flags=c.CREATE_CPU_ACCESS_REQUIRED)
    assert bo(f, h2).placement is drv.gtt
    assert not bo(f, h2).flags & c.CREATE_CPU_ACCESS_REQUIRED
    assert bo(f, h2).preferred_domains == c.DOMAIN_VRAM | c.DOMAIN_GTT


def test_gtt_only_does_not_fall_back_to_vram(core, f):
    """§2.3: only VRAM-only requests are retried; GTT-only beyond GTT → ENOMEM."""
    assert kit.gem_create_raw(f, size=65 * KIB, domains=c.DOMAIN_GTT).result == -errno.ENOMEM
    assert kit.device(core).driver.vram.used == 0


def test_vram_gtt_fallback_bo_is_exportable(f):
    """§1.6 E2: a VRAM|GTT BO (here from the fallback) is UALink-exportable."""
    kit.gem_create(f, size=64 * KIB)
    h = kit.gem_create(f, size=4 * KIB)
    assert kit.ualink_export_raw(f, h).result == 0


# ---- GEM_MMAP (§2.7) -------------------------------------------------------------------------


def test_mmap_unknown_handle_zeroes_union(f):
    """§2.7: the union is zeroed first, so ENOENT reads back 8 zero bytes."""
    r = kit.ioctl(f, kit.GEM_MMAP, struct.pack("<II", 5, 0xFFFFFFFF))
    assert (r.result, r.out) == (-errno.ENOENT, bytes(8))


def test_mmap_no_cpu_access_is_eperm(f):
    """§2.7: NO_CPU_ACCESS → EPERM, 8 zero bytes back."""
    h = kit.gem_create(f, flags=c.CREATE_NO_CPU_ACCESS)
    r = kit.ioctl(f, kit.GEM_MMAP, struct.pack("<II", h, 0))
    assert (r.result, r.out) == (-errno.EPERM, bytes(8))


def test_mmap_offsets_are_stable_and_disjoint(f):
    """§2.7: out.addr_ptr is a fake offset in the DRM file-offset range, the same for one BO,
    page aligned and non-overlapping between BOs."""
    h1, h2 = kit.gem_create(f, size=3 * 4096), kit.gem_create(f)
    a1 = struct.unpack("<Q", kit.ioctl(f, kit.GEM_MMAP, struct.pack("<II", h1, 0)).out)[0]
    a2 = struct.unpack("<Q", kit.ioctl(f, kit.GEM_MMAP, struct.pack("<II", h2, 0)).out)[0]
    again = struct.unpack("<Q", kit.ioctl(f, kit.GEM_MMAP, struct.pack("<II", h1, 0)).out)[0]
    assert a1 == again
    assert a1 >= 0x100000000 and a1 % 4096 == 0 and a2 % 4096 == 0
    assert a2 >= a1 + 3 * 4096 or a1 >= a2 + 4096


# ---- GEM_OP (§2.8) -------------------------------------------------------------------------


def gem_op(f, handle, op, value=0, padding=0, caller=kit.CALLER):
    # GET_GEM_CREATE_INFO's copy_to_user is an awaitable (the fakes finish at once).
    args = st.GEM_OP.encode(st.GemOp(handle, op, value, 0, padding))
    return kit.run(kit.ioctl(f, kit.GEM_OP, args, caller))


def test_gem_op_padding_is_einval(f):
    """§2.8: non-zero padding → EINVAL (checked before the handle); input echoed."""
    h = kit.gem_create(f)
    r = gem_op(f, h, c.GEM_OP_SET_PLACEMENT, c.DOMAIN_GTT, padding=1)
    assert r.result == -errno.EINVAL
    assert r.out == st.GEM_OP.encode(st.GemOp(h, 1, c.DOMAIN_GTT, 0, 1))
    assert gem_op(f, 99, 0, padding=1).result == -errno.EINVAL
    assert bo(f, h).preferred_domains == c.DOMAIN_VRAM


def test_gem_op_unknown_handle_and_op(f):
    """§2.8: unknown handle → ENOENT; unknown op → EINVAL."""
    assert gem_op(f, 9, c.GEM_OP_SET_PLACEMENT).result == -errno.ENOENT
    h = kit.gem_create(f)
    assert gem_op(f, h, 7).result == -errno.EINVAL


def test_set_placement_gtt_makes_bo_unexportable(f):
    """§2.8 / §1.6 E2 note: exportability follows the current preferred domains."""
    h = kit.gem_create(f)
    assert gem_op(f, h, c.GEM_OP_SET_PLACEMENT, c.DOMAIN_GTT).result == 0
    assert bo(f, h).preferred_domains == c.DOMAIN_GTT
    assert kit.ualink_export_raw(f, h).result == -errno.EOPNOTSUPP
    assert gem_op(f, h, c.GEM_OP_SET_PLACEMENT, 0xFF).result == 0
    assert bo(f, h).preferred_domains == c.DOMAIN_VRAM | c.DOMAIN_GTT | c.DOMAIN_CPU
    assert kit.ualink_export_raw(f, h).result == 0


def test_set_placement_vram_only_allows_gtt(f):
    """§2.8: VRAM-only placement keeps GTT in the allowed domains."""
    h = kit.gem_create(f, domains=c.DOMAIN_GTT)
    assert gem_op(f, h, c.GEM_OP_SET_PLACEMENT, c.DOMAIN_VRAM).result == 0
    assert (bo(f, h).preferred_domains, bo(f, h).allowed_domains) == (
        c.DOMAIN_VRAM, c.DOMAIN_VRAM | c.DOMAIN_GTT)


def test_set_placement_vram_on_import_is_einval(core, f):
    """§2.8: an imported BO cannot prefer VRAM → EINVAL."""
    h = kit.gem_create(f)
    key = kit.open_token(core, kit.prime_to_token(f, h))
    g = kit.open_file(core, 1)
    hg = kit.prime_from_fd(g, key)
    assert gem_op(g, hg, c.GEM_OP_SET_PLACEMENT, c.DOMAIN_VRAM).result == -errno.EINVAL
    assert gem_op(g, hg, c.GEM_OP_SET_PLACEMENT, c.DOMAIN_GTT).result == 0


def test_get_gem_create_info_writes_user_memory(f, ctu):
    """§2.8: GET_GEM_CREATE_INFO writes drm_amdgpu_gem_create_in to the pointer in value;
    the ioctl buffer itself is echoed."""
    h = kit.gem_create(f, size=8192, domains=c.DOMAIN_VRAM, flags=c.CREATE_NO_CPU_ACCESS)
    r = gem_op(f, h, c.GEM_OP_GET_GEM_CREATE_INFO, value=0x7FFF0000)
    assert r.result == 0
    assert r.out == st.GEM_OP.encode(st.GemOp(h, 0, 0x7FFF0000, 0, 0))
    flags = c.CREATE_NO_CPU_ACCESS | c.CREATE_VRAM_CLEARED | c.CREATE_VRAM_WIPE_ON_RELEASE
    assert ctu.writes == [
        (kit.CALLER.pid, 0x7FFF0000, struct.pack("<QQQQ", 8192, 0, c.DOMAIN_VRAM, flags))
    ]


def test_get_gem_create_info_fault_is_efault(f, ctu):
    """§2.8: a faulting user pointer → EFAULT."""
    h = kit.gem_create(f)
    ctu.fault = True
    assert gem_op(f, h, c.GEM_OP_GET_GEM_CREATE_INFO, value=8).result == -errno.EFAULT


def test_get_gem_create_info_without_user_access_is_efault():
    """§2.8: with no way to reach user memory the copy faults → EFAULT."""
    core = kit.make_node()
    f = kit.open_file(core)
    h = kit.gem_create(f)
    assert gem_op(f, h, c.GEM_OP_GET_GEM_CREATE_INFO, value=8).result == -errno.EFAULT


def test_get_gem_create_info_alignment_in_pages(f, ctu):
    """§2.8 (GEM: amdgpu_gem_op_ioctl reports tbo.page_alignment << PAGE_SHIFT): a byte
    alignment reads back rounded up to whole pages; 0 stays 0."""
    for asked, reported in ((100, 4096), (8192, 8192), (0, 0)):
        r = kit.gem_create_raw(f, 8192, c.DOMAIN_VRAM, 0, alignment=asked)
        h = kit.u32(r.out)
        ctu.writes.clear()
        assert gem_op(f, h, c.GEM_OP_GET_GEM_CREATE_INFO, value=0x7FFF0000).result == 0
        assert struct.unpack_from("<QQ", ctu.writes[0][2])[1] == reported
