"""The C data plane's importer side (fuse/dataplane.c) on a real FUSE mount, against a
hand-driven exporter on a socketpair: a large answer to a carried load is spliced from the
channel into /dev/fuse (the kernel's one copy into the caller's buffer), and answered from
memory when the pipe cannot hold its pieces; a small one is copied; an answer that is not
a whole one hands the load back to Python, whose own answer the caller gets."""

from __future__ import annotations

import errno
import mmap
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
from typing import Any

import pytest
import trio
from test_data_plane_channel import DATA_HEAD, LOAD, recv_exactly
from test_fuse_tree import COMPLETION_VA, FakeBackend, Mounted, eventually, in_thread, serving

from ualinkd.drm.errors import DrmError
from ualinkd.fabric.wire import FrameType
from ualinkd.fuse import lowlevel as ll
from ualinkd.fuse.dataplane import FAST_MAX

pytestmark = pytest.mark.integration
SRC, DST, NPA = 3, 9, 0x40_0000_0000  # our accel, the exporter's, where the BO is mapped
SPAN = 4 * FAST_MAX  # the remote mapping at COMPLETION_VA


def exporter_bytes(npa: int, n: int) -> bytes:
    """What the exporter's BO holds at `npa`: each 4-byte word its own offset."""
    first = (npa - NPA) // 4
    words = b"".join((first + i).to_bytes(4, "little") for i in range(n // 4 + 2))
    return words[(npa - NPA) % 4:][:n]


class RoutedBackend(FakeBackend):
    """Reads at COMPLETION_VA are one remote mapping: the data plane may carry them once
    Python answered one (FakeBackend's Completion, which the test completes)."""

    def gpu_read_route(self, drm_file: object, va: int,
                       size: int) -> tuple[int, int, int, int, int] | None:
        if COMPLETION_VA <= va < COMPLETION_VA + SPAN:
            return COMPLETION_VA, COMPLETION_VA + SPAN, NPA, SRC, DST
        return None


def aligned_pread(fd: int, n: int, va: int) -> bytes:
    """One read request of `n` bytes (a page-aligned buffer: the kernel does not split it)."""
    with mmap.mmap(-1, n) as buf:
        got = os.preadv(fd, [buf], va)
        return bytes(buf[:got])


def answer_load(peer: socket.socket, piece: int, status: int = 0,
                short: int = 0) -> tuple[int, int]:
    """Read one LOAD from the channel and answer it as an exporter would, its bytes sent
    `piece` bytes per send (status != 0: no bytes; `short`: that many fewer than asked).
    The LOAD's NPA and length."""
    _, ft, seq, src, dst, npa, length, _ = LOAD.unpack(recv_exactly(peer, LOAD.size))
    assert (ft, src, dst) == (FrameType.LOAD, SRC, DST)
    data = exporter_bytes(npa, length - short) if status == 0 else b""
    peer.sendall(DATA_HEAD.pack(9 + len(data), FrameType.DATA, seq, status))
    for at in range(0, len(data), piece):
        peer.sendall(data[at:at + piece])
    return npa, length


async def carried(m: Mounted, peer: socket.socket, fd: int, va: int, n: int, piece: int,
                  status: int = 0) -> bytes:
    """A read of `n` bytes at `va` that the data plane carries, its LOAD answered by us."""
    async with trio.open_nursery() as nursery:
        got: list[bytes] = []

        async def read() -> None:
            got.append(await in_thread(aligned_pread, fd, n, va))

        nursery.start_soon(read)
        npa, length = await in_thread(answer_load, peer, piece, status)
        assert (npa, length) == (NPA + va - COMPLETION_VA, n)
    return got[0]


def tcp_pair() -> tuple[socket.socket, socket.socket]:
    """Two ends of a loopback TCP connection, as a data channel's are (TCP_NODELAY)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        a = socket.create_connection(listener.getsockname())
        b, _ = listener.accept()
    for end in (a, b):
        end.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return a, b


async def channel(m: Mounted, tcp: bool = False) -> socket.socket:
    """A data channel to us (the exporter), a socketpair or loopback TCP: our end of it."""
    await eventually(lambda: m.session.data_plane.running)  # (serve() starts it)
    ours, peer = tcp_pair() if tcp else socket.socketpair()
    peer.settimeout(10)  # watchdog: a LOAD that never comes fails the test
    assert m.session.data_plane.open("exporter", ours.detach(), {DST}) is not None
    return peer


async def routed(m: Mounted, peer: socket.socket | None = None) -> tuple[int, socket.socket]:
    """An open render node whose reads at COMPLETION_VA the data plane carries on a
    channel to us (the exporter): the first one is Python's, completed here."""
    peer = peer or await channel(m)
    fd = await in_thread(os.open, m.path("dri/renderD128"), os.O_RDWR)
    k = len(m.backend.completions)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(in_thread, aligned_pread, fd, FAST_MAX, COMPLETION_VA)
        await eventually(lambda: len(m.backend.completions) == k + 1)
        m.backend.completions[k].set_result(exporter_bytes(NPA, FAST_MAX))
    return fd, peer


def stats(m: Mounted) -> dict[str, Any]:
    return m.session.data_plane.stats()


@pytest.mark.parametrize("tcp", [False, True], ids=["socketpair", "tcp"])
async def test_a_large_answer_is_spliced_into_the_caller_and_a_small_one_copied(tmp_path, tcp):
    """1 MiB and 200 KiB answers sent whole are spliced (the `spliced` counter), at a
    mapping's start and inside it; a 64 KiB one is received into memory and copied; every
    caller gets the exporter's bytes. (A 200 KiB answer fits the pipe's slots in any
    pieces; a 1 MiB one when the socket's pieces are 32 KiB page fragments, as they are
    unless memory is too fragmented for them: then it is answered from memory, as the next
    test's is, and this test fails on that line.) On TCP the rest of an answer wakes the
    thread once it is all in (SO_RCVLOWAT), and a small answer after a large one is not
    held back by it."""
    async with serving(tmp_path / "mnt", RoutedBackend()) as m:
        fd, peer = await routed(m, await channel(m, tcp))
        with peer:
            spliced = []
            for va, n in [(COMPLETION_VA + FAST_MAX, 200 << 10), (COMPLETION_VA, FAST_MAX),
                          (COMPLETION_VA + 3 * 4096, FAST_MAX),
                          (COMPLETION_VA + 8192, 64 << 10), (COMPLETION_VA + 7, 9)]:
                before = stats(m)
                got = await carried(m, peer, fd, va, n, piece=n)
                assert got == exporter_bytes(NPA + va - COMPLETION_VA, n), (va, n)
                after = stats(m)
                assert after["fast_loads"] == before["fast_loads"] + 1
                spliced.append(after["spliced"] - before["spliced"])
            assert spliced[0] == 1 and spliced[3:] == [0, 0] and 1 in spliced[1:3], spliced
            await in_thread(os.close, fd)


async def test_an_answer_in_more_pieces_than_the_pipe_holds_is_answered_from_memory(
        tmp_path):
    """A 1 MiB answer sent 1 KiB at a time (on a socketpair each send is a pipe slot of its
    own: more than the pipe has, 256 of 1 MiB, or 512 of 2 MiB): what the pipe took goes
    to memory behind the DATA's head and the rest is received there; the caller gets every
    byte in order, and the next answer, sent whole, is spliced again. Two such answers in
    a row pause splicing on the channel: the next, sent whole, goes to memory at once."""
    async with serving(tmp_path / "mnt", RoutedBackend()) as m:
        fd, peer = await routed(m)
        with peer:
            before = stats(m)
            got = await carried(m, peer, fd, COMPLETION_VA + 4, FAST_MAX, piece=1024)
            assert got == exporter_bytes(NPA + 4, FAST_MAX)
            mid = stats(m)
            assert (mid["fast_loads"], mid["spliced"]) == (before["fast_loads"] + 1,
                                                           before["spliced"])
            got = await carried(m, peer, fd, COMPLETION_VA, FAST_MAX, piece=FAST_MAX)
            assert got == exporter_bytes(NPA, FAST_MAX)
            assert stats(m)["spliced"] == mid["spliced"] + 1
            for piece in (1024, 1024, FAST_MAX):  # (the last one: the channel pauses)
                got = await carried(m, peer, fd, COMPLETION_VA + 8, FAST_MAX, piece=piece)
                assert got == exporter_bytes(NPA + 8, FAST_MAX)
            assert stats(m)["spliced"] == mid["spliced"] + 1
            assert stats(m)["fast_loads"] == mid["fast_loads"] + 4
            await in_thread(os.close, fd)


async def test_a_large_load_not_answered_whole_is_python_s_to_answer(tmp_path):
    """A 1 MiB load answered DP_FALLBACK (the exporter's C has no route), or with a DATA
    4 KiB short of it: nothing is spliced, the load goes back to Python (FakeBackend's
    Completion here, the link in a daemon), and the caller gets Python's answer; an EFAULT
    from Python is the caller's errno."""
    python_s = b"python's" * (FAST_MAX // 8)
    async with serving(tmp_path / "mnt", RoutedBackend()) as m:
        fd, peer = await routed(m)
        with peer:
            for status, short, answer in [(-errno.EAGAIN, 0, python_s), (0, 4096, python_s),
                                          (-errno.EAGAIN, 0, None)]:
                got: list[bytes | int] = []

                async def read(got: list[bytes | int] = got) -> None:
                    try:
                        got.append(await in_thread(aligned_pread, fd, FAST_MAX, COMPLETION_VA))
                    except OSError as e:
                        got.append(e.errno)

                k = len(m.backend.completions)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(read)
                    await in_thread(answer_load, peer, FAST_MAX, status, short)
                    await eventually(lambda k=k: len(m.backend.completions) == k + 1)
                    if answer is None:
                        m.backend.completions[k].set_error(DrmError(errno.EFAULT, "fault"))
                    else:
                        m.backend.completions[k].set_result(answer)
                assert got == [errno.EFAULT if answer is None else answer], (status, short)
            assert stats(m)["spliced"] == 0 and stats(m)["fallbacks"] == 3
            await in_thread(os.close, fd)


async def test_a_load_handed_back_while_the_loop_lingers_is_served_then(tmp_path, monkeypatch):
    """After a read the data plane took, the receive loop lingers for the caller's next
    request (CARRIED_LINGER_NS, _ualinkd_drain) with trio waiting behind it; a load the
    data plane hands back meanwhile ends the linger (its notify fd), so Python serves it
    then. Here the linger is 60 s: without that, the serving watchdog (20 s) ends the test."""
    monkeypatch.setattr(ll, "CARRIED_LINGER_NS", 60 * 10**9)
    python_s = b"python's" * (FAST_MAX // 8)
    async with serving(tmp_path / "mnt", RoutedBackend()) as m:
        fd, peer = await routed(m)
        with peer:
            # (answered from a thread: trio waits behind the linger until the hand-back)
            answerer = threading.Thread(target=answer_load,
                                        args=(peer, FAST_MAX, -errno.EAGAIN))
            answerer.start()
            got: list[bytes] = []

            async def read() -> None:
                got.append(await in_thread(aligned_pread, fd, FAST_MAX, COMPLETION_VA))

            k = len(m.backend.completions)
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(read)
                    await eventually(lambda: len(m.backend.completions) == k + 1)
                    m.backend.completions[k].set_result(python_s)
            finally:
                answerer.join(10)
            assert got == [python_s] and stats(m)["fallbacks"] == 1
            await in_thread(os.close, fd)


async def test_a_caller_killed_while_its_answer_travels_gets_it_and_the_plane_serves_on(
        tmp_path):
    """The caller of a carried 1 MiB load SIGKILLed before the answer comes cannot go
    before its request is answered (fuse's request_wait_answer waits for a request the
    server took): the spliced reply frees it, the data plane hands nothing to Python, and
    the next load is spliced as usual."""
    async with serving(tmp_path / "mnt", RoutedBackend()) as m:
        peer = await channel(m)
        with peer:
            # Spawned while this process has no file of the mount open: a child that
            # closes one before it runs Python waits for its FLUSH, which this process's
            # trio thread cannot answer while subprocess's vfork holds its GIL. Its first
            # load is Python's (it learns that file's route), the second is carried.
            reader = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
                import mmap, os
                fd = os.open({m.path("dri/renderD128")!r}, os.O_RDWR)
                for _ in range(2):
                    os.preadv(fd, [mmap.mmap(-1, {FAST_MAX})], {COMPLETION_VA})
            """)])
            try:
                await eventually(lambda: len(m.backend.completions) == 1)
                m.backend.completions[0].set_result(exporter_bytes(NPA, FAST_MAX))
                head = await in_thread(recv_exactly, peer, LOAD.size)  # (its LOAD is out)
                reader.kill()
                await trio.sleep(0.1)
                assert reader.poll() is None  # still waiting for its answer
                _, _, seq, _, _, npa, length, _ = LOAD.unpack(head)
                peer.sendall(DATA_HEAD.pack(9 + length, FrameType.DATA, seq, 0)
                             + exporter_bytes(npa, length))
                with trio.fail_after(10):
                    assert await in_thread(reader.wait) == -signal.SIGKILL
                assert stats(m)["spliced"] == 1  # (its answer was)
            finally:
                if reader.poll() is None:
                    reader.kill()
                    peer.close()  # (the data plane hands the load to Python: failed here)
                    with trio.move_on_after(5):
                        await eventually(lambda: len(m.backend.completions) > 1)
                        m.backend.completions[1].set_error(DrmError(errno.EFAULT, "cleanup"))
                    await in_thread(reader.wait)
            assert stats(m)["fallbacks"] == 0
            fd, _ = await routed(m, peer)
            before = stats(m)["spliced"]
            got = await carried(m, peer, fd, COMPLETION_VA, FAST_MAX, piece=FAST_MAX)
            assert got == exporter_bytes(NPA, FAST_MAX)
            assert stats(m)["spliced"] == before + 1
            await in_thread(os.close, fd)
