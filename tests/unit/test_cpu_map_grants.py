"""CPU mappings of BOs, sans-IO: the kernel's mmap checks and the grants (amdgpu/cpu_map.py),
and a shared BO's memory as one memfd (amdgpu/memory.py). Issue 9 item 6; spec §2.7, §4.6."""

from __future__ import annotations

import errno
import fcntl
import mmap
import os

import pytest
import ualink_testkit as kit

from ualinkd.abi import constants as c
from ualinkd.abi import cpumap as abi
from ualinkd.amdgpu import cpu_map
from ualinkd.amdgpu.bo import AmdgpuBo
from ualinkd.amdgpu.memory import CHUNK, BoMemory
from ualinkd.drm.errors import DrmError
from ualinkd.drm.gem import DmaBuf
from ualinkd.drm.process import ProcessId

GIB = 1 << 30
SIZE = 2 << 20
RW = cpu_map.PROT_READ | cpu_map.PROT_WRITE
ME = ProcessId(kit.CALLER.pid, 0)  # the caller's process (same_thread_group's identity)


@pytest.fixture
def core():
    core = kit.make_node()
    core.cpu_maps.socket = 0x1234  # as the daemon's socket server does once it listens
    return core


def gem_mmap(f, handle: int) -> int:
    r = kit.ioctl(f, kit.GEM_MMAP, handle.to_bytes(4, "little") + bytes(4))
    assert r.result == 0, r
    return int.from_bytes(r.out, "little")


def grant_raw(core, f, offset: int, length: int = SIZE, prot: int = RW,
              flags: int = cpu_map.MAP_SHARED, fmode: int = cpu_map.O_RDWR, caller=kit.CALLER):
    req = abi.MmapGrant(offset, length, prot, flags, fmode, 0, 0, 0)
    return core.ioctl(f, abi.UALINKD_IOCTL_MMAP_GRANT, abi.MMAP_GRANT.encode(req),
                      abi.MMAP_GRANT.size, caller)


def grant(core, f, offset: int, **kw) -> abi.MmapGrant:
    result, out = grant_raw(core, f, offset, **kw)
    assert result == 0, result
    return abi.MMAP_GRANT.decode(out)


def bo_setup(core, size: int = SIZE):
    f = kit.open_file(core)
    h = kit.gem_create(f, size, c.DOMAIN_VRAM)
    return f, h, gem_mmap(f, h)


def test_the_number_is_not_a_drm_ioctl():
    """abi/cpumap.py: type 'u', nr 0xF0 — no DRM table has nr 0xF0, and it is not type 'd'."""
    from ualinkd.abi import ioctls
    assert abi.UALINKD_IOCTL_MMAP_GRANT == 0xC03075F0  # _IOWR('u', 0xF0, 48 bytes)
    assert ioctls.lookup(abi.UALINKD_MMAP_GRANT_NR) is None
    assert (abi.UALINKD_IOCTL_MMAP_GRANT >> 8) & 0xFF == ord("u")


def test_without_a_socket_mmap_stays_enodev():
    """Before the socket listens nothing can be fetched: ENODEV, mmap's old answer."""
    core = kit.make_node()
    f, _h, off = bo_setup(core)
    assert grant_raw(core, f, off) == (-errno.ENODEV, b"")


def test_grant_names_the_socket_and_is_fetched_once(core):
    """A granted mapping: the grant and socket come back, the other fields are echoed; the
    fetch by the same process and uid gives the BO's memfd, writable, from offset 0; a
    second fetch of the same grant is ENOENT."""
    f, h, off = bo_setup(core)
    g = grant(core, f, off)
    assert (g.offset, g.length, g.prot, g.socket) == (off, SIZE, RW, 0x1234)
    assert g.grant != 0 and core.cpu_maps.pending_count == 1
    got = core.cpu_maps.take(g.grant, ME, kit.CALLER.uid)
    assert (got.backing_offset, got.writable, got.map_type) == (0, True, cpu_map.MAP_SHARED)
    assert got.bo is f.lookup(h)
    core.cpu_maps.done(got)
    with pytest.raises(DrmError) as e:
        core.cpu_maps.take(g.grant, ME, kit.CALLER.uid)
    assert e.value.errno == errno.ENOENT


@pytest.mark.parametrize("peer", [(kit.OTHER_UID.pid, kit.CALLER.uid),
                                  (kit.CALLER.pid, kit.OTHER_UID.uid),
                                  (kit.OTHER_UID.pid, kit.OTHER_UID.uid)])
def test_someone_elses_grant_is_eacces_and_gone(core, peer):
    """Security: only the process (and uid) whose ioctl made the grant can fetch it; a wrong
    peer gets EACCES, and the grant is consumed (its BO reference dropped)."""
    f, h, off = bo_setup(core)
    bo = f.lookup(h)
    refs = bo.refcount
    g = grant(core, f, off)
    assert bo.refcount == refs + 1
    with pytest.raises(DrmError) as e:
        core.cpu_maps.take(g.grant, ProcessId(peer[0], 0), peer[1])
    assert e.value.errno == errno.EACCES
    assert bo.refcount == refs and core.cpu_maps.pending_count == 0


def test_a_thread_of_the_process_is_the_process(core):
    """FUSE reports the calling thread; SO_PEERCRED the process: they match through Tgid."""
    f, _h, off = bo_setup(core)
    core.cpu_maps.identify = lambda tid: ProcessId({5001: 5000}.get(tid, tid), 0)
    g = grant(core, f, off, caller=type(kit.CALLER)(pid=5001, uid=kit.CALLER.uid))
    got = core.cpu_maps.take(g.grant, ProcessId(5000, 0), kit.CALLER.uid)
    core.cpu_maps.done(got)


def test_a_later_process_with_the_pid_is_not_the_process(core):
    """Issue 29 item 1's hazard for grants: the process that asked has exited and its pid
    went to another process of the same uid; that one connecting (its SO_PEERPIDFD names
    it) gets EACCES, and the grant is gone."""
    f, _h, off = bo_setup(core)
    core.cpu_maps.identify = lambda tid: ProcessId(tid, 1)
    g = grant(core, f, off)
    with pytest.raises(DrmError) as e:
        core.cpu_maps.take(g.grant, ProcessId(kit.CALLER.pid, 2), kit.CALLER.uid)
    assert e.value.errno == errno.EACCES and core.cpu_maps.pending_count == 0


@pytest.mark.parametrize("kw,err", [
    ({"length": 0}, errno.EINVAL),
    ({"flags": 0}, errno.EINVAL),                                    # no map type
    ({"fmode": cpu_map.O_RDONLY}, errno.EACCES),                     # PROT_WRITE, shared
    ({"fmode": cpu_map.O_WRONLY, "prot": cpu_map.PROT_READ}, errno.EACCES),
    ({"length": SIZE + 4096}, errno.EINVAL),                         # longer than the BO
    ({"flags": cpu_map.MAP_PRIVATE, "prot": cpu_map.PROT_READ}, errno.EINVAL),  # COW
])
def test_kernel_refusals(core, kw, err):
    """do_mmap's checks, then drm_gem_mmap's, then ttm's no-COW rule (amdgpu/cpu_map.py)."""
    f, _h, off = bo_setup(core)
    assert grant_raw(core, f, off, **kw) == (-err, b"")
    assert core.cpu_maps.pending_count == 0


def test_offsets_that_are_no_bo_start(core):
    """drm_gem_mmap: drm_vma_offset_exact_lookup — a BO's start only (EINVAL otherwise)."""
    f, _h, off = bo_setup(core)
    for bad in (off + 4096, off - 4096, 0, off + 1):
        assert grant_raw(core, f, bad, length=4096)[0] == -errno.EINVAL


def test_file_without_a_handle_is_eacces(core):
    """drm_vma_node_is_allowed: another DrmFile of the same device (same uid even) that holds
    no handle to the BO cannot map it."""
    _f, _h, off = bo_setup(core)
    other = kit.open_file(core)
    assert grant_raw(core, other, off) == (-errno.EACCES, b"")


def test_prot_none_private_is_a_read_only_shared_mapping(core):
    """amdgpu_gem_object_mmap's Thunk workaround: PROT_NONE MAP_PRIVATE is allowed and never
    writable; a read-only file's shared mapping is read-only too."""
    f, _h, off = bo_setup(core)
    for kw in ({"prot": 0, "flags": cpu_map.MAP_PRIVATE},
               {"prot": cpu_map.PROT_READ, "fmode": cpu_map.O_RDONLY}):
        got = core.cpu_maps.take(grant(core, f, off, **kw).grant, ME, kit.CALLER.uid)
        assert (got.writable, got.map_type) == (False, cpu_map.MAP_SHARED)
        core.cpu_maps.done(got)


def test_no_cpu_access_bo_is_eperm(core):
    """§2.7: a BO with NO_CPU_ACCESS (every imported NPA BO) cannot be mapped: EPERM — here
    through its dma-buf, since GEM_MMAP already refuses it an offset."""
    dev = kit.device(core)
    bo = AmdgpuBo(dev, SIZE, 0, c.DOMAIN_VRAM, c.CREATE_NO_CPU_ACCESS, None)
    buf = DmaBuf(bo)
    bo.put()
    assert core.cpu_maps.dmabuf_ioctl(buf, _req(0, SIZE), kit.CALLER) == (-errno.EPERM, b"")
    assert core.cpu_maps.dmabuf_ioctl(buf, _req(0, 2 * SIZE), kit.CALLER) == (-errno.EINVAL, b"")
    buf.put()


def _req(offset: int, length: int) -> bytes:
    return abi.MMAP_GRANT.encode(abi.MmapGrant(offset, length, RW, cpu_map.MAP_SHARED,
                                               cpu_map.O_RDWR, 0, 0, 0))


def test_dmabuf_offsets_are_bo_offsets(core):
    """dma_buf_mmap_internal: pgoff is relative to the buffer; the range must lie inside."""
    f, h, _off = bo_setup(core)
    buf = DmaBuf(f.lookup(h))
    result, out = core.cpu_maps.dmabuf_ioctl(buf, _req(8192, 4096), kit.CALLER)
    assert result == 0
    got = core.cpu_maps.take(abi.MMAP_GRANT.decode(out).grant, ME, kit.CALLER.uid)
    assert got.backing_offset == 8192
    core.cpu_maps.done(got)
    assert core.cpu_maps.dmabuf_ioctl(buf, _req(SIZE - 4096, 8192), kit.CALLER)[0] == -errno.EINVAL
    buf.put()


def test_pending_grant_keeps_the_bo_and_eviction_drops_it(core, monkeypatch):
    """A grant holds a BO reference until fetched, so a handle closed in between cannot free
    the memory under the fetch; past MAX_PENDING_GRANTS the oldest goes with its reference."""
    monkeypatch.setattr(cpu_map, "MAX_PENDING_GRANTS", 2)
    f, h, off = bo_setup(core)
    bo = f.lookup(h)
    g = grant(core, f, off)
    kit.gem_close(f, h)
    assert bo.refcount == 1 and bo.memory.shared
    got = core.cpu_maps.take(g.grant, ME, kit.CALLER.uid)
    os.pread(got.memfd, 1, 0)  # still open
    core.cpu_maps.done(got)
    assert bo.refcount == 0
    f2, h2, off2 = bo_setup(core)
    bo2 = f2.lookup(h2)
    for _ in range(3):
        grant(core, f2, off2)
    assert core.cpu_maps.pending_count == 2 and bo2.refcount == 1 + 2
    core.cpu_maps.clear()
    assert bo2.refcount == 1


def test_grant_through_the_node_on_a_dmabuf_file(core):
    """The dma-buf file answers the grant ioctl; any other ioctl on it stays ENOTTY."""
    f, h, _off = bo_setup(core)
    key = kit.open_token(core, kit.prime_to_token(f, h))
    assert core.dmabuf_ioctl(key, abi.UALINKD_IOCTL_MMAP_GRANT, _req(0, SIZE), 48,
                             kit.CALLER)[0] == 0
    with pytest.raises(DrmError) as e:
        core.dmabuf_ioctl(key, 0xC0086200, bytes(8), 8, kit.CALLER)
    assert e.value.errno == errno.ENOTTY
    core.cpu_maps.clear()
    core.dmabuf_release(key)


# ---- BoMemory.share: one memory ------------------------------------------------------------


def test_share_moves_the_written_chunks_into_a_sealed_sparse_memfd():
    """A 16 GiB BO written at two spots, then shared: the memfd holds those bytes, costs two
    chunks, and its size is sealed (a client cannot shrink or grow it under the daemon)."""
    m = BoMemory(16 * GIB)
    m.write(0x1000, b"head")
    m.write(16 * GIB - 4, b"tail")
    fd = m.share()
    assert m.share() == fd and m.chunks == 0
    assert os.pread(fd, 4, 0x1000) == b"head" and os.pread(fd, 4, 16 * GIB - 4) == b"tail"
    assert os.fstat(fd).st_size == 16 * GIB
    assert m.resident_bytes <= 2 * CHUNK
    seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    assert seals & fcntl.F_SEAL_SHRINK and seals & fcntl.F_SEAL_GROW and seals & fcntl.F_SEAL_SEAL
    with pytest.raises(PermissionError):
        os.ftruncate(fd, 4096)
    # GPU loads of holes read zeros and allocate nothing
    assert m.read(8 * GIB, 3 * CHUNK) == bytes(3 * CHUNK)
    assert m.resident_bytes <= 2 * CHUNK
    m.close()


def test_shared_memory_is_one_memory_with_a_mapping():
    """What a client's mapping stores, the daemon's reads (GPU load, fabric LOAD views) see
    at once, and the daemon's writes (GPU store, fabric STORE) are in the mapping at once."""
    m = BoMemory(SIZE)
    fd = m.share()
    view = mmap.mmap(fd, SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    try:
        view[100:105] = b"cpu!!"
        assert m.read(100, 5) == b"cpu!!"
        assert b"".join(m.read_views(98, 9)) == b"\0\0cpu!!\0\0"
        m.write(SIZE - 3, b"gpu")
        assert view[SIZE - 3 :] == b"gpu"
    finally:
        view.close()
        m.close()


def test_freed_bo_closes_its_memfd(core):
    """VRAM_WIPE_ON_RELEASE: the BO's bytes go with it — the daemon's memfd is closed."""
    f, h, off = bo_setup(core)
    got = core.cpu_maps.take(grant(core, f, off).grant, ME, kit.CALLER.uid)
    fd = got.memfd
    ino = os.fstat(fd).st_ino
    core.cpu_maps.done(got)
    kit.gem_close(f, h)
    try:
        assert os.fstat(fd).st_ino != ino  # the number was reused by something else
    except OSError:
        pass  # closed


def test_no_cpu_access_is_refused_through_a_cross_device_import():
    """Review finding: a NO_CPU_ACCESS BO of renderD128 imported by renderD129 of the same
    node is backed by that BO: the grant checks the memory it would hand out (EPERM), not
    only the import BO's own flags."""

    from ualinkd.abi import constants as c
    from ualinkd.abi import cpumap as abi
    from ualinkd.amdgpu import cpu_map

    core = kit.make_node(kit.pod_config(nodes=(({"id": 0}, {"id": 1}), ({"id": 5},))))
    core.cpu_maps.socket = 0x1234
    fa, fb = kit.open_file(core, 0), kit.open_file(core, 1)
    h = kit.gem_create(fa, 2 << 20, c.DOMAIN_VRAM, c.CREATE_NO_CPU_ACCESS)
    hb = kit.prime_from_fd(fb, kit.open_token(core, kit.prime_to_token(fa, h)))
    r = kit.ioctl(fb, kit.GEM_MMAP, hb.to_bytes(4, "little") + bytes(4))
    off = int.from_bytes(r.out[:8], "little")
    req = abi.MmapGrant(off, 2 << 20, cpu_map.PROT_READ | cpu_map.PROT_WRITE,
                        cpu_map.MAP_SHARED, cpu_map.O_RDWR, 0, 0, 0)
    res, _ = core.ioctl(fb, abi.UALINKD_IOCTL_MMAP_GRANT, abi.MMAP_GRANT.encode(req), 48,
                        kit.CALLER)
    assert res == -errno.EPERM
