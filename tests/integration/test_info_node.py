"""AMDGPU_INFO, DRM_IOCTL_VERSION, GET_CAP, CTX and VM on a real node through raw ioctl(2)
without the shim: the answers land in this process's memory (ctypes buffers) through the
daemon's copy_to_user, with the kernel's rules (userspace-surface.md §2.2, §2.5, §7;
amdgpu_info_ioctl, drm_version). A return_pointer into unmapped or read-only memory is
EFAULT, as the kernel's copy_to_user."""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import struct

import pytest
from nodes import call, errno_of, render_fd, running_node

from ualinkd.abi import structs as st
from ualinkd.abi.ioc import iow, iowr
from ualinkd.config import AccelConfig, NodeConfig, PodConfig

pytestmark = pytest.mark.integration

INFO, VERSION, GET_CAP = iow(0x45, 32), iowr(0x00, 64), iowr(0x0C, 16)
CTX, VM, GEM_CREATE = iowr(0x42, 16), iowr(0x53, 8), iowr(0x40, 32)
DEV_INFO, READ_MMR, VRAM_USAGE, MEMORY = 0x16, 0x15, 0x10, 0x19
MIB = 1 << 20


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    base = PodConfig.local(1, 1)
    cfg = PodConfig(base.uuid, base.key, (NodeConfig(
        "node0", "127.0.0.1:0", (AccelConfig(0, vram_size=256 * MIB, gtt_size=128 * MIB),
                                 AccelConfig(1, profile="mi300a"))),), base.vpods,
        base.ppod_size)
    with running_node(tmp_path_factory.mktemp("info"), cfg) as n:
        yield n


@pytest.fixture
def fd(node):
    with render_fd(node) as fd:
        yield fd


def info(fd: int, query: int, out: ctypes.Array | int, size: int,
         args: tuple[int, int, int, int] = (0, 0, 0, 0)) -> bytes:
    ptr = out if isinstance(out, int) else ctypes.addressof(out)
    return call(fd, INFO, st.INFO.encode(st.AmdgpuInfo(ptr, size, query, args)))


def buffer(n: int, fill: int = 0xEE) -> ctypes.Array:
    return (ctypes.c_uint8 * n)(*([fill] * n))


def test_dev_info_into_this_process(fd):
    """DEV_INFO through copy_to_user: 448 bytes, the MI300X identity and vm.py's VA range;
    libdrm 2.4.114's 368-byte buffer gets the first 368 and not a byte more."""
    out = buffer(512)
    assert info(fd, DEV_INFO, out, 448) == st.INFO.encode(
        st.AmdgpuInfo(ctypes.addressof(out), 448, DEV_INFO, (0, 0, 0, 0)))  # IOW: unchanged
    full = bytes(out)[:448]
    d = st.INFO_DEVICE.decode(full)
    assert (d.device_id, d.family, d.virtual_address_offset, d.virtual_address_max) == (
        0x74A1, 141, 0x10000, 0x800000000000)
    assert bytes(out)[448:] == b"\xee" * 64
    short = buffer(448)
    info(fd, DEV_INFO, short, 368)
    assert bytes(short)[:368] == full[:368] and bytes(short)[368:] == b"\xee" * 80


def test_second_accel_has_its_own_profile(node):
    """The pod TOML's per-accel profile reaches the daemon: renderD129 is an MI300A."""
    fd = os.open(node.render(1), os.O_RDWR)
    try:
        out = buffer(448)
        info(fd, DEV_INFO, out, 448)
        assert st.INFO_DEVICE.decode(bytes(out)).device_id == 0x74A0
    finally:
        os.close(fd)


def test_usage_is_live_and_sizes_are_the_accels(fd):
    """VRAM_USAGE grows by a new BO's size; MEMORY's VRAM heap is the accel's 256 MiB."""
    before = buffer(8)
    info(fd, VRAM_USAGE, before, 8)
    call(fd, GEM_CREATE, st.GEM_CREATE_IN.encode(st.GemCreateIn(2 * MIB, 0, 4, 0)))
    after = buffer(8)
    info(fd, VRAM_USAGE, after, 8)
    assert struct.unpack("<Q", bytes(after))[0] - struct.unpack("<Q", bytes(before))[0] == (
        2 * MIB)
    mem = buffer(96)
    info(fd, MEMORY, mem, 96)
    vram = st.HEAP_INFO.decode(bytes(mem)[:32])
    assert vram.total_heap_size == 256 * MIB
    assert vram.heap_usage == struct.unpack("<Q", bytes(after))[0]


def test_read_mmr_and_its_rules(fd):
    """GB_ADDR_CONFIG as amdgpu_device_initialize reads it; count 129 → EINVAL; a register
    off the whitelist → EFAULT."""
    out = (ctypes.c_uint32 * 1)()
    info(fd, READ_MMR, out, 4, (0x263E, 1, 0xFFFFFFFF, 0))
    assert out[0] == 0x2A114042
    args = st.AmdgpuInfo(ctypes.addressof(out), 4, READ_MMR, (0x263E, 129, 0xFFFFFFFF, 0))
    assert errno_of(fd, INFO, st.INFO.encode(args)) == errno.EINVAL
    args = st.AmdgpuInfo(ctypes.addressof(out), 4, READ_MMR, (0x1234, 1, 0xFFFFFFFF, 0))
    assert errno_of(fd, INFO, st.INFO.encode(args)) == errno.EFAULT


def test_size_zero_null_pointer_and_unknown_query_are_einval(fd):
    out = buffer(8)
    for ptr, size, query in ((ctypes.addressof(out), 0, 0), (0, 8, 0),
                             (ctypes.addressof(out), 8, 0x7F)):
        assert errno_of(fd, INFO, st.INFO.encode(st.AmdgpuInfo(ptr, size, query, (0,) * 4))) \
            == errno.EINVAL
    assert bytes(out) == b"\xee" * 8


def test_unmapped_and_read_only_return_pointers_are_efault(fd):
    """copy_to_user into a page that is not mapped, or mapped PROT_READ: EFAULT at once,
    and the read-only page is left as it was (/proc/<pid>/mem alone would have written)."""
    m = mmap.mmap(-1, 8192, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(m))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    m.write(b"\x5a" * 8192)
    assert libc.mprotect(base, 4096, mmap.PROT_READ) == 0
    try:
        for ptr in (base, base + 4096 - 2):  # read-only, and straddling into it
            if ptr != base:
                assert libc.mprotect(base, 4096, mmap.PROT_READ | mmap.PROT_WRITE) == 0
                assert libc.mprotect(base + 4096, 4096, mmap.PROT_READ) == 0
            args = st.INFO.encode(st.AmdgpuInfo(ptr, 448, DEV_INFO, (0,) * 4))
            assert errno_of(fd, INFO, args) == errno.EFAULT
        # The read-only page is left as it was (/proc/<pid>/mem alone would have written it);
        # in the straddling call the bytes before it may take the answer's head, as the
        # kernel's copy_to_user writes up to the fault.
        assert ctypes.string_at(base, 4094) == b"\x5a" * 4094
        assert ctypes.string_at(base + 4096, 4096) == b"\x5a" * 4096
        hole = mmap.mmap(-1, 4096)
        hole_addr = ctypes.addressof(ctypes.c_char.from_buffer(hole))
        del hole  # the buffer export is gone with the ctypes object; unmap the page itself
        assert libc.munmap(hole_addr, 4096) == 0
        args = st.INFO.encode(st.AmdgpuInfo(hole_addr, 4, 0, (0,) * 4))
        assert errno_of(fd, INFO, args) == errno.EFAULT
    finally:
        libc.mprotect(base, 8192, mmap.PROT_READ | mmap.PROT_WRITE)


def test_version_through_caller_memory(fd):
    """drm_version without the shim: drmGetVersion's two calls (lengths, then buffers of
    those lengths) give "amdgpu" 3.64.0; a short buffer gets a prefix, the full length."""
    first = st.DRM_VERSION.decode(call(fd, VERSION, bytes(64)))
    assert (first.version_major, first.version_minor, first.version_patchlevel) == (3, 64, 0)
    name, date, desc = (ctypes.create_string_buffer(n + 1) for n in (
        first.name_len, first.date_len, first.desc_len))
    v = st.DrmVersion(0, 0, 0, first.name_len, ctypes.addressof(name), first.date_len,
                      ctypes.addressof(date), first.desc_len, ctypes.addressof(desc))
    call(fd, VERSION, st.DRM_VERSION.encode(v))
    assert (name.value, date.value, desc.value) == (b"amdgpu", b"20150101", b"AMD GPU")
    short = ctypes.create_string_buffer(b"\x01" * 8)
    v = st.DrmVersion(0, 0, 0, 3, ctypes.addressof(short), 0, 0, 0, 0)
    got = st.DRM_VERSION.decode(call(fd, VERSION, st.DRM_VERSION.encode(v)))
    assert short.raw == b"amd" + b"\x01" * 5 + b"\0" and got.name_len == 6


def test_get_cap_syncobj(fd):
    for cap in (0x13, 0x14):
        assert struct.unpack("<QQ", call(fd, GET_CAP, struct.pack("<QQ", cap, 0))) == (cap, 1)


def test_ctx_and_vm_stubs(fd):
    """CTX alloc/query/free and VM reserve/unreserve as the kernel answers them."""
    out = call(fd, CTX, struct.pack("<IIIi", 1, 0, 0, 0))
    ctx_id = struct.unpack_from("<I", out)[0]
    assert ctx_id >= 1
    assert call(fd, CTX, struct.pack("<IIIi", 3, 0, ctx_id, 0)) == bytes(16)
    call(fd, CTX, struct.pack("<IIIi", 2, 0, ctx_id, 0))
    assert errno_of(fd, CTX, struct.pack("<IIIi", 2, 0, ctx_id, 0)) == errno.EINVAL
    assert call(fd, VM, struct.pack("<II", 1, 0)) == struct.pack("<II", 1, 0)
    assert call(fd, VM, struct.pack("<II", 2, 0)) == struct.pack("<II", 2, 0)
    assert errno_of(fd, VM, struct.pack("<II", 9, 0)) == errno.EINVAL


def test_cs_bo_list_wait_cs_answer_as_the_kernel(fd):
    """Command submission (README, amdgpu/cs.py): a zeroed CS has no chunks (EINVAL), a
    zeroed WAIT_CS names context 0, which no CTX gives (EINVAL), a zeroed BO_LIST creates an
    empty list (handle 1), a zeroed FENCE_TO_HANDLE names context 0 (EINVAL); USERQ is not
    emulated: ENOTTY."""
    assert errno_of(fd, iowr(0x44, 24), bytes(24)) == errno.EINVAL
    assert errno_of(fd, iowr(0x49, 32), bytes(32)) == errno.EINVAL
    assert call(fd, iowr(0x43, 24), bytes(24))[:8] == struct.pack("<II", 1, 0)
    assert errno_of(fd, iowr(0x54, 32), bytes(32)) == errno.EINVAL
    assert errno_of(fd, iowr(0x56, 64), bytes(64)) == errno.ENOTTY


class _DrmVersion(ctypes.Structure):
    _fields_ = [("version_major", ctypes.c_int), ("version_minor", ctypes.c_int),
                ("version_patchlevel", ctypes.c_int), ("name_len", ctypes.c_int),
                ("name", ctypes.c_char_p), ("date_len", ctypes.c_int),
                ("date", ctypes.c_char_p), ("desc_len", ctypes.c_int),
                ("desc", ctypes.c_char_p)]


def _libdrm():
    try:
        return ctypes.CDLL("libdrm.so.2", use_errno=True)
    except OSError:
        pytest.skip("libdrm.so.2 not installed (make setup installs libdrm-dev)")


def test_unmodified_libdrm_calls_without_the_shim(fd):
    """Debian's libdrm, unmodified, no LD_PRELOAD: drmGetVersion (its two VERSION calls),
    drmGetCap(DRM_CAP_SYNCOBJ[_TIMELINE]) and drmCommandWrite(DRM_AMDGPU_INFO) with
    libdrm 2.4.114's 368-byte DEV_INFO struct all reach the daemon and succeed."""
    drm = _libdrm()
    drm.drmGetVersion.restype = ctypes.POINTER(_DrmVersion)
    drm.drmFreeVersion.argtypes = [ctypes.POINTER(_DrmVersion)]
    v = drm.drmGetVersion(fd)
    assert v
    try:
        got = v.contents
        assert (got.version_major, got.version_minor, got.name, got.desc) == (
            3, 64, b"amdgpu", b"AMD GPU")
    finally:
        drm.drmFreeVersion(v)
    value = ctypes.c_uint64()
    for cap in (0x13, 0x14):
        assert drm.drmGetCap(fd, ctypes.c_uint64(cap), ctypes.byref(value)) == 0
        assert value.value == 1
    out = buffer(368)
    req = bytearray(st.INFO.encode(st.AmdgpuInfo(ctypes.addressof(out), 368, DEV_INFO,
                                                 (0, 0, 0, 0))))
    arg = (ctypes.c_char * len(req)).from_buffer(req)
    assert drm.drmCommandWrite(fd, ctypes.c_ulong(0x05), arg, ctypes.c_ulong(32)) == 0
    device_id, family, num_se = (struct.unpack_from("<I", bytes(out), at)[0]
                                 for at in (0, 16, 20))
    assert (device_id, family, num_se) == (0x74A1, 141, 32)
