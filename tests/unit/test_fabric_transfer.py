"""A large remote access in chunks (fabric/agent.py _Transfer, UalinkAgent.remote_access)
and the copies it saves: a load's chunks land in one buffer at their offsets as they come,
from the fabric's pipe (PipedPayload.read_into) or from memory; an exporter answers a shared
BO's LOAD from a mapping of its memfd (amdgpu/memory.py _mapped), never over a hole.

Policy 10 (spec "Emulator policy"): a GPU load stops at its first faulting chunk, the bytes
before it intact; EFAULT if nothing was loaded."""

from __future__ import annotations

import errno
import os
import socket
from typing import Any

import pytest

from ualinkd.amdgpu.memory import BoMemory
from ualinkd.amdgpu.vm import RemotePiece
from ualinkd.drm.completion import Completion
from ualinkd.drm.errors import DrmError
from ualinkd.fabric.agent import CHUNK, IN_FLIGHT, _Transfer
from ualinkd.fabric.splice import PipedPayload, PipePool, unread

NPA = 0x40_0000_0000


def pattern(n: int, seed: int = 1) -> bytes:
    return bytes((i * 7 + seed) & 0xFF for i in range(256)) * (n // 256) + bytes(n % 256)


class Fabric:
    """The request function a _Transfer sends its chunks with: each request's Completion
    kept, to be answered by the test in any order."""

    def __init__(self) -> None:
        self.asked: dict[int, tuple[int, Completion[Any]]] = {}  # offset -> (length, c)
        self.most_in_flight = 0

    def request(self, src: int, dst: int, npa: int, arg: int | bytes) -> Completion[Any]:
        c: Completion[Any] = Completion()
        self.asked[npa - NPA] = (arg if isinstance(arg, int) else len(arg), c)
        self.most_in_flight = max(self.most_in_flight,
                                  sum(not c._done for _, c in self.asked.values()))
        return c


def start(length: int) -> tuple[Fabric, Completion[Any]]:
    f = Fabric()
    piece = RemotePiece(exporter_accel=2, npa_byte_address=NPA, length=length)
    return f, _Transfer(f.request, 1, piece, False, None).start()


def answer_all(f: Fabric, data: bytes, fail: set[int] = frozenset(),  # type: ignore[assignment]
               short: dict[int, int] | None = None, order: int = -1) -> None:
    """Answer every chunk as it is asked for, newest first (out of order): the chunk at an
    offset in `fail` with EFAULT, one in `short` with only that many bytes."""
    answered: set[int] = set()
    while len(answered) < len(f.asked):
        off = sorted(set(f.asked) - answered)[0 if order > 0 else -1]
        answered.add(off)
        n, c = f.asked[off]
        if off in fail:
            c.set_error(DrmError(errno.EFAULT, "fault"))
        else:
            c.set_result(data[off:off + (short or {}).get(off, n)])


def test_a_chunked_load_lands_every_chunk_at_its_offset_out_of_order():
    size = 3 * CHUNK + 12345
    data = pattern(size)
    f, done = start(size)
    answer_all(f, data)
    assert done.result() == data
    assert f.most_in_flight == IN_FLIGHT


def test_a_load_whose_middle_chunk_faults_stops_there_bytes_before_it_intact():
    """Policy 10: the chunks after the faulting one were loaded, but the load ends at it."""
    size = 4 * CHUNK
    data = pattern(size, 3)
    f, done = start(size)
    answer_all(f, data, fail={CHUNK})
    assert done.result() == data[:CHUNK]


def test_a_short_chunk_ends_the_load_at_its_count():
    size = 3 * CHUNK
    data = pattern(size, 5)
    f, done = start(size)
    answer_all(f, data, short={CHUNK: 4096}, order=1)
    assert done.result() == data[:CHUNK + 4096]


def test_a_load_whose_first_chunk_faults_is_efault():
    f, done = start(2 * CHUNK)
    answer_all(f, bytes(2 * CHUNK), fail={0})
    with pytest.raises(DrmError) as e:
        done.result()
    assert e.value.errno == errno.EFAULT


def piped(data: bytes, prefix: int, pool: PipePool) -> PipedPayload:
    """A DATA payload as the link's reader makes one: its first bytes came with the header,
    the rest spliced from the socket into a pipe."""
    pipe = pool.take()
    assert pipe is not None
    payload = PipedPayload(len(data), pool, pipe)
    payload.start(data[:prefix])
    a, b = socket.socketpair()
    try:
        b.setblocking(False)
        sent = prefix
        while payload.left:
            if sent < len(data):
                sent += a.send(data[sent:sent + (64 << 10)])
            try:
                payload.splice_from(b.fileno())
            except BlockingIOError:
                pass
    finally:
        a.close()
        b.close()
    return payload


def test_a_piped_chunk_is_read_from_its_pipe_straight_into_the_load():
    """PipedBytes.read_into: the pipe's bytes go to the load's buffer at the chunk's offset
    (no buffer of the payload's own); the emptied pipe goes back to the reader's pool."""
    pool = PipePool()
    size = 2 * CHUNK
    data = pattern(size, 9)
    f, done = start(size)
    payloads = []
    for off in sorted(f.asked):
        n, c = f.asked[off]
        payloads.append(p := piped(data[off:off + n], 1000, pool))
        c.set_result(p)
        assert p.splice_parts() is None  # (taken by the load)
        pipe = p._pipe
        assert pipe is not None and unread(pipe[0]) == 0
        p.settle()
        assert pool._free == [pipe]  # emptied: reused
    assert done.result() == data
    pool.close()


def test_a_piped_chunk_already_in_memory_is_copied_from_there():
    """A payload whose reader call ended (its bytes moved to memory) still loads."""
    pool = PipePool()
    data = pattern(CHUNK + 100, 4)
    f, done = start(len(data))
    for off in sorted(f.asked):
        n, c = f.asked[off]
        p = piped(data[off:off + n], 10, pool)
        p.settle()  # (to memory)
        c.set_result(p)
    assert done.result() == data
    pool.close()


def blocks(fd: int) -> int:
    return os.fstat(fd).st_blocks


def test_a_shared_bos_large_load_is_a_view_of_its_memfd_and_a_hole_stays_a_hole():
    """An exporter's LOAD answer of a shared BO: a view of a mapping (the bytes as they are
    in the memfd), except over a hole, which is read (zeros) and not allocated."""
    m = BoMemory(8 * CHUNK)
    data = pattern(2 * CHUNK, 6)
    m.write(0, data)
    fd = m.share()
    [view] = m.read_views(100, CHUNK)
    assert not isinstance(view.obj, bytes)  # a mapping, not a pread's copy
    assert bytes(view) == data[100:100 + CHUNK]
    del view
    before = blocks(fd)
    [view] = m.read_views(CHUNK, 2 * CHUNK)  # half data, half hole
    assert bytes(view) == data[CHUNK:] + bytes(CHUNK)
    assert blocks(fd) == before
    [view] = m.read_views(4 * CHUNK, CHUNK)
    assert bytes(view) == bytes(CHUNK)
    assert blocks(fd) == before
    m.write(4 * CHUNK, data[:CHUNK])  # the hole filled: mapped from now on
    [view] = m.read_views(4 * CHUNK + 8, CHUNK - 8)
    assert not isinstance(view.obj, bytes)
    assert bytes(view) == data[8:CHUNK]
    [view] = m.read_views(50, CHUNK)  # (within the range known to have no hole)
    assert not isinstance(view.obj, bytes) and bytes(view) == data[50:50 + CHUNK]
    del view
    m.close()
