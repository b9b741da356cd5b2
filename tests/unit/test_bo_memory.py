"""BoMemory: lazily allocated BO bytes, zero until written (spec §2.3 VRAM_CLEARED)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs
from ualink_testkit import device, gem_close, gem_create, make_node, open_file

from ualinkd.abi import constants as c
from ualinkd.amdgpu.bo import AmdgpuBo
from ualinkd.amdgpu.memory import CHUNK, BoMemory

GIB = 1 << 30


def test_untouched_bo_reads_zero_and_costs_nothing():
    """§2.3: VRAM_CLEARED is forced on, so a new BO reads as zeros; nothing is allocated."""
    m = BoMemory(16 * GIB)
    assert m.read(0, 4096) == bytes(4096)
    assert m.read(16 * GIB - 100, 100) == bytes(100)
    assert m.read(5 * GIB - 10, 3 * CHUNK) == bytes(3 * CHUNK)
    assert m.chunks == 0 and m.resident_bytes == 0


def test_16_gib_bo_written_far_apart_allocates_two_chunks():
    """§2.3: a 16 GiB BO written at two far apart offsets holds only the two chunks it
    touched (64 KiB each), and reads them back."""
    m = BoMemory(16 * GIB)
    m.write(0x1000, b"head")
    m.write(16 * GIB - 4, b"tail")
    assert m.chunks == 2
    assert m.resident_bytes == 2 * CHUNK
    assert m.read(0x1000, 4) == b"head"
    assert m.read(16 * GIB - 4, 4) == b"tail"
    assert m.read(0x0FFE, 8) == b"\0\0head\0\0"


def test_page_granularity_is_a_parameter():
    """§2.3: with 4 KiB pages the same two writes cost two pages."""
    m = BoMemory(16 * GIB, chunk=4096)
    m.write(0, b"x")
    m.write(8 * GIB, b"y")
    assert (m.chunks, m.resident_bytes) == (2, 8192)


def test_last_chunk_is_cut_to_the_bo_size():
    """§2.3: a BO whose size is not a multiple of the chunk allocates no bytes past it."""
    m = BoMemory(CHUNK + 4096)
    m.write(CHUNK + 4000, b"z" * 96)
    assert m.resident_bytes == 4096


@pytest.mark.parametrize("offset,n", [(-1, 1), (0, 4097), (4096, 1), (4000, 200), (0, -1)])
def test_out_of_range_read_is_a_bug(offset, n):
    """§2.6: callers check ranges against the BO first; an access outside is our bug."""
    with pytest.raises(AssertionError):
        BoMemory(4096).read(offset, n)


@pytest.mark.parametrize("offset,n", [(-1, 1), (0, 4097), (4096, 1), (4000, 200)])
def test_out_of_range_write_is_a_bug(offset, n):
    """§2.6: the same for stores; nothing is written."""
    m = BoMemory(4096)
    with pytest.raises(AssertionError):
        m.write(offset, b"x" * n)
    assert m.chunks == 0


@settings(max_examples=200, deadline=None)
@given(hs.lists(hs.tuples(hs.integers(0, 5 * 4096 - 1), hs.binary(min_size=0, max_size=9000)),
                max_size=12),
       hs.sampled_from([4096, 8192, CHUNK]))
def test_matches_a_flat_bytearray(writes, chunk):
    """§2.3: any sequence of writes reads back like one flat zero-filled buffer."""
    size = 5 * 4096
    m, flat = BoMemory(size, chunk), bytearray(size)
    for off, data in writes:
        data = data[: size - off]
        m.write(off, data)
        flat[off : off + len(data)] = data
    assert m.read(0, size) == bytes(flat)
    for off, data in writes:
        n = len(data[: size - off])
        assert m.read(off, n) == bytes(flat[off : off + n])
        # read_views: the same bytes, as views a socket writes out (the exporter's LOAD path)
        assert b"".join(m.read_views(off, n)) == bytes(flat[off : off + n])
    assert m.read_views(size, 0) == []


def test_bo_memory_created_on_first_use_and_freed_with_the_bo():
    """§2.4: the bytes appear on first use and go when the BO is freed (last handle)."""
    core = make_node()
    f = open_file(core)
    h = gem_create(f, 1 << 20, c.DOMAIN_VRAM)
    bo = f.lookup(h)
    assert isinstance(bo, AmdgpuBo)
    assert bo._memory is None
    bo.memory.write(4096, b"data")
    assert bo.memory.read(4096, 4) == b"data"
    assert bo._memory is not None
    gem_close(f, h)
    assert bo.refcount == 0
    assert bo._memory is None
    assert not device(core).objects


def test_a_freed_bo_still_mapped_keeps_its_charge_until_the_last_user_goes():
    """Issue 29 item 5: the kernel's vma holds the GEM object, so a BO freed while mapped
    keeps its pool charge until the last unmap. Here the users are the grant's own file
    description (as cpumap_server.py reopens the memfd), held by a mapping after its fd is
    closed, then by a forked child that inherited the mapping; the charge goes with the
    last of them, and not before."""
    import mmap
    import os

    core = make_node()
    f = open_file(core)
    h = gem_create(f, 1 << 20, c.DOMAIN_VRAM)
    bo = f.lookup(h)
    assert isinstance(bo, AmdgpuBo)
    vram = bo.placement
    assert vram is not None and vram.used == 1 << 20
    given_out = os.open(f"/proc/self/fd/{bo.memory.share()}", os.O_RDWR | os.O_CLOEXEC)
    mapping = mmap.mmap(given_out, 1 << 20, mmap.MAP_SHARED)
    os.close(given_out)
    mapping[:5] = b"kept!"
    gem_close(f, h)
    assert vram.used == 1 << 20 and len(vram.held) == 1 and bo not in vram.residents
    assert not vram.fits(vram.size)
    child = os.fork()
    if child == 0:  # holds the inherited mapping a moment, then exits
        import time

        time.sleep(0.3)
        os._exit(0 if mapping[:5] == b"kept!" else 1)
    mapping.close()
    assert vram.used == 1 << 20  # the child still maps it
    _, status = os.waitpid(child, 0)
    assert status == 0
    assert vram.used == 0 and vram.held == {} and vram.fits(vram.size)


def test_a_read_of_a_pools_use_probes_a_bounded_batch_of_held_memfds(monkeypatch):
    """Issue 29 item 5's holding, under load: a client of uid nobody that keeps thousands of
    closed 4 KiB BOs mapped made every read of the pool's use (each GEM_CREATE, INFO) probe
    every held memfd on the serving thread (4,000 held: a GEM_CREATE of anyone took 140 ms
    instead of 0.1 ms). A read probes at most REAP_BATCH of them, the ones looked at
    longest ago, so what was unmapped is given back after a few reads."""
    from ualinkd.amdgpu import bo as bo_module

    probed: list[int] = []
    mapped = set(range(1000, 1000 + 5000))  # fake fds the client still maps
    monkeypatch.setattr(bo_module, "in_use_elsewhere", lambda fd: probed.append(fd) or fd in mapped)
    closed: list[int] = []
    monkeypatch.setattr(bo_module.os, "close", closed.append)
    pool = bo_module.MemoryPool("vram", 1 << 30)

    class Freed:  # what hold() reads of a BO
        size = 4096

    for fd in sorted(mapped):
        pool.charge(Freed())  # type: ignore[arg-type]
        pool.hold(Freed(), fd)  # type: ignore[arg-type]
    assert pool.used == 5000 * 4096 and len(probed) == bo_module.REAP_BATCH
    last = max(mapped)
    mapped.discard(last)  # unmapped: the newest held, looked at last
    reads = 0
    while last not in closed:
        probed.clear()
        pool.used  # noqa: B018
        reads += 1
        assert len(probed) <= bo_module.REAP_BATCH
    assert reads <= 5000 // bo_module.REAP_BATCH + 1
    assert pool.used == 4999 * 4096 and last not in pool.held
