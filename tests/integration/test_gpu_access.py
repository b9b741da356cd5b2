"""GPU loads and stores on a real node: GEM_VA through libualink, then pread/pwrite at
offset = GPU VA on the render-node fd (spec §2.4, §2.6, Emulator policy 10)."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import hashlib
import mmap
import os
import struct
import threading
import time

import pytest
from nodes import Client

pytestmark = pytest.mark.integration

READABLE, WRITEABLE = 0x2, 0x4
VA = 0x1_0000_0000
MIB = 1 << 20


def faults(node) -> int:
    return int(node.debug(128, "gpu_faults"))


def test_map_write_read_back(node):
    """§2.6 + policy 10: map a VRAM BO, pwrite a pattern at its VA, pread it back."""
    with Client(node.render()) as c:
        bo = c.bo_create(MIB)
        c.va_map(bo, VA, MIB)
        pattern = bytes(range(256)) * 16
        assert c.gpu_write(VA + 4096, pattern) == len(pattern)
        assert c.gpu_read(VA + 4096, len(pattern)) == pattern
        assert c.gpu_read(VA, 16) == bytes(16)  # VRAM_CLEARED


def test_unmapped_va_is_efault_and_counted(node):
    """Policy 10: the first byte unmapped → EFAULT, and gpu_faults rises."""
    before = faults(node)
    with Client(node.render()) as c:
        with pytest.raises(OSError) as ei:
            c.gpu_read(0x7_0000_0000, 8)
        assert ei.value.errno == errno.EFAULT
        with pytest.raises(OSError) as ei:
            c.gpu_write(0x7_0000_0000, b"x")
        assert ei.value.errno == errno.EFAULT
    assert faults(node) == before + 2


def test_read_past_the_end_of_a_mapping_is_short(node):
    """Policy 10: a read spanning the end of the mapping returns up to the faulting page."""
    with Client(node.render()) as c:
        bo = c.bo_create(2 * 4096)
        c.va_map(bo, VA, 2 * 4096)
        c.gpu_write(VA + 2 * 4096 - 3, b"end")
        got = c.gpu_read(VA + 4096 + 100, 3 * 4096)
        assert len(got) == 4096 - 100 and got.endswith(b"end")


def test_write_to_read_only_mapping_is_efault(node):
    """Policy 10: stores need WRITEABLE; the READABLE-only mapping still reads."""
    with Client(node.render()) as c:
        bo = c.bo_create(4096)
        c.va_map(bo, VA, 4096, flags=READABLE)
        with pytest.raises(OSError) as ei:
            c.gpu_write(VA, b"no")
        assert ei.value.errno == errno.EFAULT
        assert c.gpu_read(VA, 2) == b"\0\0"


def test_unmap_and_gem_close_remove_the_mapping(node):
    """§2.6 UNMAP and §2.4: after GEM_VA UNMAP, and after GEM_CLOSE of the last handle,
    the VA faults."""
    with Client(node.render()) as c:
        bo = c.bo_create(4096)
        c.va_map(bo, VA, 4096)
        c.gpu_write(VA, b"gone soon")
        c.va_unmap(bo, VA, 4096)
        with pytest.raises(OSError) as ei:
            c.gpu_read(VA, 1)
        assert ei.value.errno == errno.EFAULT
        c.va_map(bo, VA, 4096)
        assert c.gpu_read(VA, 9) == b"gone soon"
        c.bo_close(bo)
        with pytest.raises(OSError) as ei:
            c.gpu_read(VA, 1)
        assert ei.value.errno == errno.EFAULT


def test_gem_va_errors_through_the_library(node):
    """§2.6 steps 1, 7, 11: reserved bottom EINVAL, unknown handle ENOENT, overlap EINVAL."""
    with Client(node.render()) as c:
        bo = c.bo_create(2 * 4096)
        for args, err in [((bo, 0x1000, 4096), errno.EINVAL), ((99, VA, 4096), errno.ENOENT)]:
            with pytest.raises(OSError) as ei:
                c.va_map(*args)
            assert ei.value.errno == err
        c.va_map(bo, VA, 2 * 4096)
        with pytest.raises(OSError) as ei:
            c.va_map(bo, VA + 4096, 4096)
        assert ei.value.errno == errno.EINVAL


def test_64_mib_round_trip_by_hash(node):
    """Policy 10: 64 MiB written and read back in 1 MiB transfers, compared by hash."""
    size = 64 * MIB
    with Client(node.render()) as c:
        bo = c.bo_create(size)
        c.va_map(bo, VA, size)
        data = os.urandom(size)
        t0 = time.perf_counter()
        for off in range(0, size, MIB):
            n = 0
            while n < MIB:  # FUSE may split a large transfer
                n += c.gpu_write(VA + off + n, data[off + n : off + MIB])
        t1 = time.perf_counter()
        h = hashlib.sha256()
        for off in range(0, size, MIB):
            chunk = b""
            while len(chunk) < MIB:
                chunk += c.gpu_read(VA + off + len(chunk), MIB - len(chunk))
            h.update(chunk)
        t2 = time.perf_counter()
        assert h.digest() == hashlib.sha256(data).digest()
        print(f"\n64 MiB through FUSE: write {size / MIB / (t1 - t0):.0f} MiB/s, "
              f"read {size / MIB / (t2 - t1):.0f} MiB/s")


def test_userptr_bo_is_the_callers_memory(node):
    """AMDGPU_GEM_USERPTR on a real node (the userptr rules of §1.6 E2, §2.7): a BO over this
    process's page-aligned buffer, registered from a worker thread that then exits; GPU loads
    through its mapping read the buffer, GPU stores change it (via /proc/<pid>/mem of the
    process); it is not UALink-exportable and GEM_MMAP refuses it."""
    buf = mmap.mmap(-1, 2 * 4096)
    buf[:11] = b"from memory"
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    with Client(node.render()) as c:
        arg = bytearray(struct.pack("<QQII", addr, len(buf), 0x8 | 0x4, 0))  # REGISTER|VALIDATE
        t = threading.Thread(target=fcntl.ioctl, args=(c.fd, 0xC0186451, arg, True))
        t.start()
        t.join()
        handle = struct.unpack_from("<I", arg, 20)[0]
        assert handle != 0
        c.va_map(handle, VA, len(buf))
        assert c.gpu_read(VA, 11) == b"from memory"
        assert c.gpu_write(VA + 4096, b"from the GPU") == 12
        assert buf[4096:4108] == b"from the GPU"
        with pytest.raises(OSError) as ei:
            c.export(handle)
        assert ei.value.errno == errno.EOPNOTSUPP
        with pytest.raises(OSError) as ei:
            fcntl.ioctl(c.fd, 0xC0086441, struct.pack("<II", handle, 0))  # GEM_MMAP
        assert ei.value.errno == errno.EPERM
        c.va_unmap(handle, VA, len(buf))
        # VALIDATE checks the process's mappings: a writable BO over a read-only page is
        # EFAULT (writes through /proc/<pid>/mem would otherwise ignore the protection).
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, ctypes.c_long]
        ro = libc.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        try:
            arg = bytearray(struct.pack("<QQII", ro, 4096, 0x8 | 0x4, 0))  # REGISTER|VALIDATE
            with pytest.raises(OSError) as ei:
                fcntl.ioctl(c.fd, 0xC0186451, arg, True)
            assert ei.value.errno == errno.EFAULT
            arg = bytearray(struct.pack("<QQII", ro, 4096, 0x1 | 0x4, 0))  # READONLY|VALIDATE
            fcntl.ioctl(c.fd, 0xC0186451, arg, True)
            assert struct.unpack_from("<I", arg, 20)[0] != 0
        finally:
            libc.munmap(ctypes.c_void_p(ro), 4096)
        # Policy 10: a GPU load that runs into a page the process made PROT_NONE stops
        # there (a short count), though /proc/<pid>/mem itself would read it.
        two = libc.mmap(None, 8192, mmap.PROT_READ | mmap.PROT_WRITE,
                        mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        try:
            ctypes.memmove(two, b"visible", 7)
            libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            assert libc.mprotect(ctypes.c_void_p(two + 4096), 4096, 0) == 0  # PROT_NONE
            arg = bytearray(struct.pack("<QQII", two, 8192, 0x1, 0))  # READONLY
            fcntl.ioctl(c.fd, 0xC0186451, arg, True)
            guarded = struct.unpack_from("<I", arg, 20)[0]
            c.va_map(guarded, VA, 8192, flags=READABLE)
            got = c.gpu_read(VA, 8192)
            assert len(got) == 4096 and got[:7] == b"visible"
            c.va_unmap(guarded, VA, 8192)
        finally:
            libc.munmap(ctypes.c_void_p(two), 8192)
    buf.close()
