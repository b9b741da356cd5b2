"""Syncobjs, GEM_VA with a timeline syncobj and GEM_METADATA on a real node, through raw
ioctls: the handle and point arrays live in this process's memory (ctypes), so the daemon
reads and writes them through /proc/<pid>/mem as the kernel's copy_from/to_user would
(drm_syncobj.c; spec §2.6 steps 9 and 12, §9)."""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import threading
import time

import pytest
from nodes import call, errno_of, render_fd

from ualinkd.abi import constants as c
from ualinkd.abi import structs as st
from ualinkd.abi.ioc import iow, iowr

pytestmark = pytest.mark.integration

GEM_CREATE, GEM_VA, GEM_METADATA = iowr(0x40, 32), iow(0x48, 64), iowr(0x46, 288)
GET_CAP = iowr(0x0C, 16)
CREATE, WAIT, TL_WAIT, QUERY = iowr(0xBF, 8), iowr(0xC3, 40), iowr(0xCA, 48), iowr(0xCB, 24)
SUBMIT = c.DRM_SYNCOBJ_WAIT_FLAGS_WAIT_FOR_SUBMIT
BAD = 0x10  # never mapped
VA = 0x1_0000_0000


@pytest.fixture
def fd(node):
    with render_fd(node) as fd:
        yield fd


def u32s(*values: int) -> ctypes.Array:
    return (ctypes.c_uint32 * len(values))(*values)


def u64s(*values: int) -> ctypes.Array:
    return (ctypes.c_uint64 * len(values))(*values)


def addr(arr: ctypes.Array) -> int:
    return ctypes.addressof(arr)


def syncobj_create(fd: int) -> int:
    return struct.unpack_from("<I", call(fd, CREATE, bytes(8)))[0]


def bo_create(fd: int, size: int = 4096) -> int:
    out = call(fd, GEM_CREATE, st.GEM_CREATE_IN.encode(
        st.GemCreateIn(size, 0, c.DOMAIN_VRAM, 0)))
    return struct.unpack_from("<I", out)[0]


def test_gem_va_timeline_then_wait_and_query(fd):
    """§9 hsaKmtMemoryVaMap: GEM_VA MAP with a timeline syncobj at point 5, then a
    TIMELINE_WAIT (WAIT_FOR_SUBMIT, no timeout) on point 5 returns at once; QUERY says 5."""
    s, bo = syncobj_create(fd), bo_create(fd)
    call(fd, GEM_VA, st.GEM_VA.encode(st.GemVa(
        bo, 0, c.VA_OP_MAP, c.VM_PAGE_READABLE, VA, 0, 4096, 5, s, 0, 0)))
    handles, points = u32s(s), u64s(5)
    t0 = time.monotonic()
    out = call(fd, TL_WAIT, st.SYNCOBJ_TIMELINE_WAIT.encode(st.DrmSyncobjTimelineWait(
        addr(handles), addr(points), (1 << 63) - 1, 1, SUBMIT, 0, 0, 0)))
    assert time.monotonic() - t0 < 1
    assert st.SYNCOBJ_TIMELINE_WAIT.decode(out).first_signaled == 0
    got = u64s(0)
    call(fd, QUERY, st.SYNCOBJ_TIMELINE_ARRAY.encode(
        st.DrmSyncobjTimelineArray(addr(handles), addr(got), 1, 0)))
    assert got[0] == 5


def test_wait_times_out_while_others_are_served(node, fd):
    """An unsignaled syncobj, WAIT_FOR_SUBMIT, absolute timeout now + 50 ms: ETIME after at
    least 50 ms; meanwhile another client's ioctls on the same node are answered."""
    s = syncobj_create(fd)
    handles = u32s(s)
    result: dict[str, float | int] = {}

    def waiter() -> None:
        t0 = time.monotonic()
        deadline = time.monotonic_ns() + 50_000_000
        try:
            call(fd, WAIT, st.SYNCOBJ_WAIT.encode(
                st.DrmSyncobjWait(addr(handles), deadline, 1, SUBMIT, 0, 0, 0)))
            result["errno"] = 0
        except OSError as e:
            result["errno"] = e.errno
        result["start"], result["end"] = t0, time.monotonic()

    other = os.open(node.render(), os.O_RDWR)
    try:
        th = threading.Thread(target=waiter)
        th.start()
        answered: list[float] = []
        while th.is_alive():
            call(other, GET_CAP, struct.pack("<QQ", c.DRM_CAP_PRIME, 0))
            answered.append(time.monotonic())
        th.join()
    finally:
        os.close(other)
    assert result["errno"] == errno.ETIME
    assert result["end"] - result["start"] >= 0.05
    assert any(result["start"] < t < result["end"] for t in answered)


def test_gem_metadata_round_trip(fd):
    """GEM_METADATA SET then GET on a real node (hsaKmtMemHandleFree's zero SET too)."""
    bo = bo_create(fd)
    blob = (0xDEADBEEF, 7) + (0,) * 62
    call(fd, GEM_METADATA, st.encode_gem_metadata(
        st.GemMetadata(bo, c.GEM_METADATA_OP_SET_METADATA, 0x42, 0x99, 8, blob)))
    out = call(fd, GEM_METADATA, st.encode_gem_metadata(
        st.GemMetadata(bo, c.GEM_METADATA_OP_GET_METADATA, 0, 0, 0, (0,) * 64)))
    m = st.decode_gem_metadata(out)
    assert (m.flags, m.tiling_info, m.data_size_bytes, m.data[:2]) == (0x42, 0x99, 8, blob[:2])
    call(fd, GEM_METADATA, st.encode_gem_metadata(
        st.GemMetadata(bo, c.GEM_METADATA_OP_SET_METADATA, 0, 0, 0, (0,) * 64)))


def test_bad_pointers_are_efault(fd):
    """drm_syncobj_array_find / query copy-out / GEM_VA input array: unmapped → EFAULT."""
    s, bo = syncobj_create(fd), bo_create(fd)
    handles = u32s(s)
    assert errno_of(fd, WAIT, st.SYNCOBJ_WAIT.encode(
        st.DrmSyncobjWait(BAD, 0, 1, 0, 0, 0, 0))) == errno.EFAULT
    assert errno_of(fd, QUERY, st.SYNCOBJ_TIMELINE_ARRAY.encode(
        st.DrmSyncobjTimelineArray(addr(handles), BAD, 1, 0))) == errno.EFAULT
    assert errno_of(fd, GEM_VA, st.GEM_VA.encode(st.GemVa(
        bo, 0, c.VA_OP_MAP, c.VM_PAGE_READABLE, VA, 0, 4096, 0, 0, 1, BAD))) == errno.EFAULT
