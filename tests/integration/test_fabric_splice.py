"""A large DATA payload spliced from the link's socket into a pipe (fabric/splice.py,
drm/loaded.py): real links over loopback TCP, real pipes, a hand-driven peer for the cases a
daemon never produces."""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import socket
from collections.abc import AsyncIterator, Iterator

import pytest
import trio
from test_fabric_link import (
    Pod,
    _completed,
    _memory_server,
    make_pod,
    raw_server_b,
    read_frame,
    wait_until,
    warnings,
)

from ualinkd.drm.completion import Completion
from ualinkd.drm.errors import DrmError
from ualinkd.drm.loaded import Loaded
from ualinkd.fabric import splice
from ualinkd.fabric.link import FabricLink
from ualinkd.fabric.wire import Data, Load, encode_frame, encode_frame_parts

MIB = 1 << 20
PATTERN = bytes(range(251)) * (MIB // 251 + 1)  # 251: no period that hides a misplaced page


@pytest.fixture
async def pod() -> AsyncIterator[Pod]:
    async with trio.open_nursery() as nursery:
        yield Pod(make_pod(ack_ms=5000), nursery)  # (a trickled MiB takes a while)
        nursery.cancel_scope.cancel()


def _pipes() -> int:
    """This process's pipe fds (the links' sockets come and go with reconnects)."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:")
        except FileNotFoundError:
            pass  # (the listing's own fd)
    return n


def _drain_spliced(data: Loaded) -> bytes | None:
    """What a splicing consumer (the FUSE reply) does, inside the reader's call: take the
    pipe and read all of it. None when the bytes were not in a pipe."""
    assert not isinstance(data, bytes | bytearray), "a large payload should be PipedBytes"
    parts = data.splice_parts()
    if parts is None:
        return None
    prefix, fd, count = parts
    got = bytearray(prefix)
    while count:
        chunk = os.read(fd, count)
        assert chunk
        got += chunk
        count -= len(chunk)
    return bytes(got)


async def test_a_large_load_answer_comes_in_a_pipe_and_leaves_no_fd(pod: Pod) -> None:
    """A 1 MiB DATA on a plain TCP link reaches a request's consumer as PipedBytes: in
    the reader's call the pipe holds every byte after those that came with the header (the
    FUSE reply splices them on); a consumer that does not splice gets them in memory once
    that call ended. The pipes are reused: 20 loads later the process holds no more fds."""
    mem_b = bytearray(4 * MIB)
    mem_b[:MIB] = PATTERN[:MIB]
    a = await pod.start("a")
    await pod.start("b", on_request=_memory_server(mem_b))
    await wait_until(lambda: a.is_up("b") and pod.links["b"].is_up("a"))

    spliced: list[bytes | None] = []

    def load_spliced() -> Completion[Loaded]:
        c = a.request(0, 2, 0, MIB)
        assert c is not None
        c.when_done(lambda c: spliced.append(_drain_spliced(c.result())))
        return c

    c = load_spliced()
    await wait_until(lambda: c.done)
    assert spliced == [PATTERN[:MIB]]
    before = _pipes()
    for _ in range(20):
        c = load_spliced()
        await wait_until(lambda c=c: c.done)
        assert await _completed(a.request(0, 2, 0, MIB)) == PATTERN[:MIB]  # in memory
    assert spliced[1:] == [PATTERN[:MIB]] * 20
    assert _pipes() == before
    assert await _completed(a.request(0, 2, 12345, MIB - 12345)) == PATTERN[12345:MIB]


async def test_a_trickled_payload_fills_the_pipe_and_moves_to_memory(
        pod: Pod, monkeypatch: pytest.MonkeyPatch) -> None:
    """A peer that sends its 1 MiB DATA in small, separate TCP segments can fill the pipe's
    slots (one per fragment) long before its bytes: the reader then moves the payload to
    memory and reads the rest there. Every byte arrives in order and nothing is spliced.
    The reader is woken once most of a payload is in (SO_RCVLOWAT), and by then the kernel
    has merged most segments; a pipe of 4 slots is filled all the same."""
    monkeypatch.setattr(splice, "PIPE_SIZE", 4 * 4096)
    a, stream, dec, out, listeners = await raw_server_b(pod)
    await stream.send_all(b"".join(encode_frame(f) for f in out))
    await wait_until(lambda: a.is_up("b"))
    assert isinstance(stream, trio.SocketStream)
    stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    got: list[bytes | None] = []
    c = a.request(0, 2, 0, MIB)
    assert c is not None
    c.when_done(lambda c: got.append(_drain_spliced(c.result())))
    load = await read_frame(stream, dec)
    assert isinstance(load, Load) and load.length == MIB
    frame = b"".join(encode_frame_parts(Data(load.seq, 0, PATTERN[:MIB])))
    step = 2048  # 512 segments for the pipe's 128 slots
    for i in range(0, len(frame), step):
        await stream.send_all(frame[i:i + step])
        await trio.sleep(0.0005)  # its own segment, read (spliced) before the next
    assert await _completed(c) == PATTERN[:MIB]
    assert got == [None]  # in memory by the time it was dispatched
    # The reader waited for the rest with SO_RCVLOWAT at its size; waiting for the next
    # frames it is 1 again, so a small answer still wakes it.
    sock = a._conns["b"].sock
    assert sock is not None
    await wait_until(lambda: sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT) == 1)
    c = a.request(0, 2, 100, 16)
    assert c is not None
    load = await read_frame(stream, dec)
    assert isinstance(load, Load) and load.length == 16
    await stream.send_all(encode_frame(Data(load.seq, 0, PATTERN[100:116])))
    assert await _completed(c) == PATTERN[100:116]
    await stream.aclose()
    for lst in listeners:
        await lst.aclose()


async def _raw_peer_load(pod: Pod) -> tuple[FabricLink, trio.abc.Stream,
                                           list[trio.SocketListener], Completion[Loaded],
                                           bytes]:
    """Link a (heartbeats every 0.2 s, 0.6 s timeout) up with a hand-driven b, and a 1 MiB
    load that b has read: a, b's stream, the listeners, the load, and its DATA frame (of
    PATTERN) unsent."""
    a, stream, dec, out, listeners = await raw_server_b(pod, heartbeat_interval=0.2,
                                                        heartbeat_timeout=0.6)
    await stream.send_all(b"".join(encode_frame(f) for f in out))
    await wait_until(lambda: a.is_up("b"))
    c = a.request(0, 2, 0, MIB)
    assert c is not None
    load = await read_frame(stream, dec)
    assert isinstance(load, Load)
    return a, stream, listeners, c, b"".join(encode_frame_parts(Data(load.seq, 0,
                                                                     PATTERN[:MIB])))


async def test_a_payload_slower_than_the_heartbeat_timeout_keeps_its_link(pod: Pod) -> None:
    """The reader sleeps until most of a large payload is in (SO_RCVLOWAT), so it reads
    nothing while a slow link (tc's rate limit, say) brings the bytes; the heartbeat sweep
    counts bytes coming in as life. A 1 MiB DATA taking 4 heartbeat timeouts (0.6 s each)
    arrives whole on the same link."""
    a, stream, listeners, c, frame = await _raw_peer_load(pod)
    step = len(frame) // 60 + 1
    for i in range(0, len(frame), step):
        await stream.send_all(frame[i:i + step])
        await trio.sleep(0.04)  # 60 steps: 2.4 s
    assert await _completed(c) == PATTERN[:MIB]
    assert a.is_up("b") and pod.states == [("a", "b", True)]
    await stream.aclose()
    for lst in listeners:
        await lst.aclose()


async def test_a_peer_stalled_mid_payload_is_dropped_at_the_heartbeat_timeout(
        pod: Pod, caplog: pytest.LogCaptureFixture) -> None:
    """A peer that sends half a large DATA and then nothing (its socket still open) is
    silent, however long the reader waits for the rest: the link drops at the heartbeat
    timeout with one warning, and the load faults (EFAULT, policy 3)."""
    a, stream, listeners, c, frame = await _raw_peer_load(pod)
    await stream.send_all(frame[: len(frame) // 2])
    with trio.fail_after(3):
        with pytest.raises(DrmError) as e:
            await _completed(c)
    assert e.value.errno == errno.EFAULT
    await wait_until(lambda: not a.is_up("b"))
    assert [m for m in warnings(caplog) if "nothing received" in m], warnings(caplog)
    await stream.aclose()
    for lst in listeners:
        await lst.aclose()


async def test_a_peer_gone_mid_payload_fails_the_load_and_frees_the_pipe(pod: Pod) -> None:
    """The exporter's link drops halfway through a large DATA: the load fails with EFAULT
    (policy 3), the half-filled pipe is closed, and the next link carries loads again."""
    a, stream, dec, out, listeners = await raw_server_b(pod)
    await stream.send_all(b"".join(encode_frame(f) for f in out))
    await wait_until(lambda: a.is_up("b"))
    before = _pipes()
    c = a.request(0, 2, 0, MIB)
    assert c is not None
    load = await read_frame(stream, dec)
    assert isinstance(load, Load)
    frame = b"".join(encode_frame_parts(Data(load.seq, 0, PATTERN[:MIB])))
    await stream.send_all(frame[: len(frame) // 2])
    await trio.sleep(0.05)  # spliced into the pipe by now
    await stream.aclose()
    with pytest.raises(DrmError) as e:
        await _completed(c)
    assert e.value.errno == errno.EFAULT
    for lst in listeners:
        await lst.aclose()
    await wait_until(lambda: not a.is_up("b"))
    await wait_until(lambda: _pipes() == before)  # the half-filled pipe was closed


@contextlib.contextmanager
def _no_free_fds() -> Iterator[None]:
    """Every fd number this process may use is taken (RLIMIT_NOFILE, EMFILE), for a while."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    top = max(int(fd) for fd in os.listdir("/proc/self/fd"))
    fillers: list[int] = []
    resource.setrlimit(resource.RLIMIT_NOFILE, (top + 1, hard))
    try:
        with contextlib.suppress(OSError):
            while True:  # (the holes below `top`)
                fillers.append(os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC))
        with pytest.raises(OSError):
            os.pipe()
        yield
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_a_large_load_with_no_fd_for_a_pipe_is_read_into_memory(pod: Pod) -> None:
    """A process out of file descriptors (EMFILE) when a large DATA arrives cannot make the
    payload's pipe: the payload is read into memory, as on a TLS link, and the link stays
    up (a dropped link would fail every request in flight on it, policy 3)."""
    mem_b = bytearray(4 * MIB)
    mem_b[:MIB] = PATTERN[:MIB]
    a = await pod.start("a")
    await pod.start("b", on_request=_memory_server(mem_b))
    await wait_until(lambda: a.is_up("b") and pod.links["b"].is_up("a"))
    with _no_free_fds():
        got = await _completed(a.request(0, 2, 0, MIB))
        assert a.is_up("b")
    assert got == PATTERN[:MIB]
    assert await _completed(a.request(0, 2, 0, MIB)) == PATTERN[:MIB]  # (piped again)


async def test_a_late_large_data_nobody_waits_for_is_dropped_and_leaves_no_pipe(
        pod: Pod) -> None:
    """A 1 MiB DATA that comes after its LOAD's deadline (the request failed, its seq was
    forgotten) is read and dropped with the link up: nobody is given it, its pipe is not
    left behind (the reader holds one pipe, in its pool, after this and the next large
    DATA, which is spliced as usual)."""
    a, stream, dec, out, listeners = await raw_server_b(pod)
    await stream.send_all(b"".join(encode_frame(f) for f in out))
    await wait_until(lambda: a.is_up("b"))
    a.ack_timeout = 0.1
    late = a.request(0, 2, 0, MIB)
    assert late is not None
    load = await read_frame(stream, dec)
    assert isinstance(load, Load)
    with pytest.raises(DrmError) as e:
        await _completed(late)
    assert e.value.errno == errno.EFAULT
    a.ack_timeout = 5.0
    before = _pipes()
    await stream.send_all(b"".join(encode_frame_parts(Data(load.seq, 0, PATTERN[:MIB]))))
    got: list[bytes | None] = []
    c = a.request(0, 2, 0, MIB)
    assert c is not None
    c.when_done(lambda c: got.append(_drain_spliced(c.result())))
    load = await read_frame(stream, dec)
    assert isinstance(load, Load)
    await stream.send_all(b"".join(encode_frame_parts(Data(load.seq, 0, PATTERN[1:MIB + 1]))))
    await wait_until(lambda: c.done)
    assert got == [PATTERN[1:MIB + 1]]
    assert a.is_up("b") and _pipes() == before + 2  # (the pool's one pipe)
    await stream.aclose()
    for lst in listeners:
        await lst.aclose()
