"""AMDGPU_GEM_METADATA (amdgpu_gem_metadata_ioctl, amdgpu_bo_set/get_metadata; spec §9:
libhsakmt's hsaKmtMemHandleFree sets empty metadata before it frees the BO)."""

from __future__ import annotations

import errno

import pytest
import ualink_testkit as kit

from ualinkd.abi import constants as c
from ualinkd.abi import structs as st
from ualinkd.abi.ioc import iowr

GEM_METADATA = iowr(0x46, 288)
assert GEM_METADATA == 0xC1206446
SET, GET = c.GEM_METADATA_OP_SET_METADATA, c.GEM_METADATA_OP_GET_METADATA


def meta(handle: int, op: int, flags: int = 0, tiling: int = 0, size: int = 0,
         data: tuple[int, ...] = ()) -> bytes:
    return st.encode_gem_metadata(
        st.GemMetadata(handle, op, flags, tiling, size, tuple(data) + (0,) * (64 - len(data))))


def get(f, handle: int, fill: int = 0) -> st.GemMetadata:
    r = kit.ioctl(f, GEM_METADATA, meta(handle, GET, data=(fill,) * 64))
    assert r.result == 0, r
    return st.decode_gem_metadata(r.out)


def test_set_then_get_round_trip(f):
    """SET stores flags, tiling_info and data_size_bytes of data; GET returns them and the
    whole struct is copied back (table direction RW)."""
    h = kit.gem_create(f)
    r = kit.ioctl(f, GEM_METADATA, meta(h, SET, 0xF1A6, 0x7111, 12, (1, 2, 3)))
    assert r.result == 0
    m = get(f, h)
    assert (m.handle, m.op, m.flags, m.tiling_info, m.data_size_bytes) == (
        h, GET, 0xF1A6, 0x7111, 12)
    assert m.data[:3] == (1, 2, 3)


def test_get_echoes_the_callers_bytes_past_the_blob(f):
    """amdgpu_bo_get_metadata copies only metadata_size bytes into data[]."""
    h = kit.gem_create(f)
    kit.ioctl(f, GEM_METADATA, meta(h, SET, size=8, data=(0xA, 0xB)))
    m = get(f, h, fill=0x5A5A5A5A)
    assert m.data[:2] == (0xA, 0xB)
    assert set(m.data[2:]) == {0x5A5A5A5A}


def test_fresh_bo_reads_zero(f):
    h = kit.gem_create(f)
    m = get(f, h, fill=7)
    assert (m.flags, m.tiling_info, m.data_size_bytes, m.data[0]) == (0, 0, 0, 7)


def test_set_more_than_256_bytes_is_einval(f):
    """data_size_bytes > sizeof(data) → EINVAL, nothing stored; 256 is allowed."""
    h = kit.gem_create(f)
    assert kit.ioctl(f, GEM_METADATA, meta(h, SET, 1, 2, 257)).result == -errno.EINVAL
    assert get(f, h).tiling_info == 0
    assert kit.ioctl(f, GEM_METADATA, meta(h, SET, 1, 2, 256, (9,) * 64)).result == 0
    assert get(f, h).data == (9,) * 64


def test_unknown_handle_is_enoent(f):
    assert kit.ioctl(f, GEM_METADATA, meta(77, GET)).result == -errno.ENOENT
    assert kit.ioctl(f, GEM_METADATA, meta(0, SET)).result == -errno.ENOENT


@pytest.mark.parametrize("op", [0, 3, 1 << 31])
def test_unknown_op_is_einval(f, op):
    """Current amdgpu_gem_metadata_ioctl: any op but GET/SET → EINVAL (older kernels
    fell through with 0); the input is echoed."""
    h = kit.gem_create(f)
    data = meta(h, op, 5, 6, 4, (1,))
    r = kit.ioctl(f, GEM_METADATA, data)
    assert (r.result, r.out) == (-errno.EINVAL, data)


def test_empty_set_drops_the_blob_but_keeps_the_flags(f):
    """amdgpu_bo_set_metadata with size 0 frees the blob and returns: the flags stay;
    tiling_info is set regardless (hsaKmtMemHandleFree's zero metadata)."""
    h = kit.gem_create(f)
    kit.ioctl(f, GEM_METADATA, meta(h, SET, 0xAB, 0xCD, 4, (1,)))
    assert kit.ioctl(f, GEM_METADATA, meta(h, SET)).result == 0
    m = get(f, h)
    assert (m.flags, m.tiling_info, m.data_size_bytes) == (0xAB, 0, 0)


def test_metadata_belongs_to_the_bo(core, f):
    """The metadata lives in the BO: a self-import in another file (same BO, §2.5) sees it."""
    h = kit.gem_create(f)
    kit.ioctl(f, GEM_METADATA, meta(h, SET, 0x11, 0x22, 4, (0x33,)))
    g = kit.open_file(core)
    h2 = kit.prime_from_fd(g, kit.open_token(core, kit.prime_to_token(f, h)))
    m = get(g, h2)
    assert (m.flags, m.tiling_info, m.data[0]) == (0x11, 0x22, 0x33)


def test_trace_decodes_gem_metadata_and_syncobj_wait():
    """--trace: the new structs decode through the one ioctl table."""
    from ualinkd.abi import ioctls as tbl
    from ualinkd.trace import TraceRecord

    data = meta(3, SET, 0x10, 0x20, 4, (0xAB,))
    rec = TraceRecord(1, "n", 128, GEM_METADATA, tbl.lookup(0x46), data, 0, data)
    d = rec.as_dict()
    assert d["in"]["data"] == [0xAB] and d["out"]["tiling_info"] == 0x20
    assert "tiling_info=0x20" in rec.text() and "data=[0xab]" in rec.text()
    wait = st.SYNCOBJ_WAIT.encode(st.DrmSyncobjWait(0x1000, 5, 1, 2, 0, 0, 0))
    rec = TraceRecord(1, "n", 128, iowr(0xC3, 40), tbl.lookup(0xC3), wait, 0, wait)
    assert rec.as_dict()["in"]["count_handles"] == 1
    assert "SYNCOBJ_WAIT" in rec.text()
