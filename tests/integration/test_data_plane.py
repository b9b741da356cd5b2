"""The C data plane (fuse/dataplane.c) on real daemons: GPU loads of imported memory
carried by the two daemons' C threads on their data channel, with the same bytes, faults
and lifetimes as the link's LOAD/DATA path (spec policy 10, §4.5, §6.3)."""

from __future__ import annotations

import errno
import json
import mmap
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable

import pytest
from nodes import Client, recording, running_pod, stop_process, wait_until
from test_pod_fabric import pod_config
from test_pod_gpu import VA_A, VA_B, share

from ualinkd import sysfs

pytestmark = pytest.mark.integration
MIB = 1 << 20
CHUNK = 1 << 16  # amdgpu/memory.py: a BO's memory comes in chunks this big


def stats(node) -> dict[str, int]:
    return sysfs.parse_data_plane((node.mount / sysfs.DATA_PLANE_STATUS).read_text())


def pattern(n: int, seed: int = 0) -> bytes:
    return bytes((i * 7 + seed) & 0xFF for i in range(n))


def shared(ca: Client, cb: Client) -> int:
    """A's 1 MiB BO, mapped at VA_A with pattern(4096) written at its start, imported by B
    and mapped at VA_B; A's GEM handle."""
    bo, _, _ = share(ca, cb, MIB)
    ca.va_map(bo, VA_A, MIB)
    assert ca.gpu_write(VA_A, pattern(4096)) == 4096
    return bo


def aligned_read(c: Client, va: int, n: int) -> bytes:
    """One GPU load of `n` bytes as one read request (a page-aligned buffer: the kernel
    does not split it, as it does a read into bytes at an odd address)."""
    with mmap.mmap(-1, max(n, 1)) as buf:
        got = os.preadv(c.fd, [memoryview(buf)[:n]], va)
        return bytes(buf[:got])


def loads_carried(a, b, ca: Client, cb: Client, va_a: int, va_b: int, n: int) -> None:
    """Loads of B until the data plane carries them (the first of a mapping is Python's)."""
    def carried() -> bool:
        assert cb.gpu_read(va_b, n) == ca.gpu_read(va_a, n)
        return stats(b)["fast_loads"] > 0
    assert wait_until(carried, 10), (stats(a), stats(b), b.log_text())


def test_small_loads_are_carried_by_the_data_plane_with_the_exporters_bytes(tmp_path):
    """4 KiB loads of an imported BO: after the first (served by Python, which learns the
    routes) the data plane carries them, on both daemons, with the exporter's bytes: at
    any offset, across a BO chunk's edge, in a chunk never written (zeros), 1 byte, 64 KiB
    and 1 MiB (the largest it carries: the whole BO, half of it never written). Each such
    load is one read request; the ones of 128 KiB and more are spliced into FUSE."""
    with running_pod(tmp_path, config=pod_config(2)) as (a, b):
        # (dialed once the link is up: it may still be on its way)
        assert wait_until(lambda: stats(a)["channels"] == 1 and stats(b)["channels"] == 1, 10)
        with Client(a.render()) as ca, Client(b.render()) as cb:
            bo, _, _ = share(ca, cb, MIB)
            ca.va_map(bo, VA_A, MIB)
            data = pattern(MIB // 2)
            assert ca.gpu_write(VA_A, data) == len(data)
            loads_carried(a, b, ca, cb, VA_A, VA_B, 4096)
            for off, n in [(0, 4096), (12345, 4096), (CHUNK - 2048, 4096), (3 * CHUNK, 1),
                           (5 * CHUNK + 17, 4000), (0, CHUNK), (MIB - 4096, 4096),
                           (MIB // 2 - 100, 300), (0, MIB), (CHUNK + 5, 3 * CHUNK)]:
                want = (data + bytes(MIB - len(data)))[off:off + n]
                assert aligned_read(cb, VA_B + off, n) == want, (off, n)  # (routes learnt)
                before_b, before_a = stats(b), stats(a)["served"]
                for _ in range(2):  # each one read request, carried (a large one spliced)
                    assert aligned_read(cb, VA_B + off, n) == want, (off, n)
                after = stats(b)
                assert after["fast_loads"] - before_b["fast_loads"] == 2, (off, n)
                assert stats(a)["served"] - before_a == 2, (off, n)
                # (A 1 MiB answer is spliced when its TCP pieces fit the pipe's slots, as
                # loopback's 32 KiB page fragments do; in page-sized ones, where memory is
                # too fragmented for those, it goes to memory: carried all the same.)
                if n < MIB:
                    assert after["spliced"] - before_b["spliced"] == (
                        2 if n >= 128 << 10 else 0), (off, n)
            assert "unexpected exception" not in a.log_text() + b.log_text()


def test_a_write_after_the_route_was_learnt_is_what_the_next_load_reads(tmp_path):
    """A route reads the exporter's memory as it is now: a write by the exporter's own GPU
    after it, in a chunk written before and in one that read as zeros (its first write
    gives it memory: every route is dropped), is what B's next load returns."""
    with running_pod(tmp_path, config=pod_config(2)) as (a, b):
        with Client(a.render()) as ca, Client(b.render()) as cb:
            shared(ca, cb)
            loads_carried(a, b, ca, cb, VA_A, VA_B, 4096)
            assert cb.gpu_read(VA_B + 7 * CHUNK, 4096) == bytes(4096)  # never written
            assert cb.gpu_read(VA_B + 7 * CHUNK, 4096) == bytes(4096)
            for seed in range(1, 4):
                assert ca.gpu_write(VA_A, pattern(4096, seed)) == 4096
                assert ca.gpu_write(VA_A + 7 * CHUNK, pattern(4096, seed)) == 4096
                assert cb.gpu_read(VA_B, 4096) == pattern(4096, seed)
                assert cb.gpu_read(VA_B + 7 * CHUNK, 4096) == pattern(4096, seed)
            # (B's own stores go through the link; the next loads see them too.)
            assert cb.gpu_write(VA_B + 10, b"from B") == 6
            assert cb.gpu_read(VA_B, 4096)[10:16] == b"from B"


def test_after_a_revoke_or_an_unmap_a_carried_load_faults(tmp_path):
    """§6.3: once the exporter's BO is freed (GEM_CLOSE revokes it) B's loads fault with
    EFAULT as the link's do, routes learnt or not; an unmap on B faults at once."""
    with running_pod(tmp_path, config=pod_config(2)) as (a, b):
        with Client(a.render()) as ca, Client(b.render()) as cb:
            bo, _, gem = share(ca, cb, MIB)
            bo2, _, gem2 = share(ca, cb, MIB, va=VA_B + 2 * MIB)
            ca.va_map(bo, VA_A, MIB)
            ca.va_map(bo2, VA_A + 2 * MIB, MIB)
            loads_carried(a, b, ca, cb, VA_A, VA_B, 4096)
            loads_carried(a, b, ca, cb, VA_A + 2 * MIB, VA_B + 2 * MIB, 4096)
            cb.va_unmap(gem2, VA_B + 2 * MIB, MIB)
            with pytest.raises(OSError) as e:
                cb.gpu_read(VA_B + 2 * MIB, 4096)
            assert e.value.errno == errno.EFAULT
            ca.va_unmap(bo, VA_A, MIB)
            ca.bo_close(bo)  # the revoke (§6.4)

            def faults() -> bool:
                try:
                    cb.gpu_read(VA_B, 4096)
                except OSError as e:
                    assert e.errno == errno.EFAULT
                    return True
                return False
            assert wait_until(faults, 10)
            with pytest.raises(OSError) as e:
                cb.gpu_read(VA_B + 4096, 4096)
            assert e.value.errno == errno.EFAULT


def test_a_vanished_exporter_faults_the_loads_and_the_importer_serves_on(tmp_path):
    """The exporter's daemon killed while B's loads ride the data plane: B's next load
    faults (EFAULT, policy 3) in bounded time, B logs the channel's end, and its other
    requests are served."""
    with running_pod(tmp_path, config=pod_config(2)) as (a, b):
        with Client(a.render()) as ca, Client(b.render()) as cb:
            shared(ca, cb)
            loads_carried(a, b, ca, cb, VA_A, VA_B, 4096)
            a.proc.send_signal(signal.SIGKILL)
            a.proc.wait(10)
            start = time.monotonic()
            with pytest.raises(OSError) as e:
                for _ in range(100):  # (until B has seen the link go: policy 3)
                    cb.gpu_read(VA_B, 4096)
                    time.sleep(0.05)
            assert e.value.errno == errno.EFAULT
            assert time.monotonic() - start < 15
            assert wait_until(lambda: stats(b)["channels"] == 0, 10)
            assert cb.bo_create(4096) > 0  # B serves on
            assert "unexpected exception" not in b.log_text()


def test_a_recording_sees_every_load_while_it_is_attached(tmp_path):
    """`ualinkd record` attached: the loads the data plane carried come back through
    Python (node.py's tracer setter drops the routes) and each is recorded; detached, the
    data plane carries them again."""
    out = tmp_path / "rec.jsonl"
    with running_pod(tmp_path, config=pod_config(2)) as (a, b):
        with Client(a.render()) as ca, Client(b.render()) as cb:
            shared(ca, cb)
            loads_carried(a, b, ca, cb, VA_A, VA_B, 4096)
            with recording([b.mount], out):
                for i in range(5):
                    assert cb.gpu_read(VA_B + i, 4096) == (pattern(4096) + bytes(8))[i:i + 4096]
            loads = [r for r in map(json.loads, out.read_text().splitlines())
                     if r.get("type") == "gpu" and r.get("op") == "load"]
            assert len(loads) >= 5, out.read_text()[:2000]
            fast = stats(b)["fast_loads"]
            loads_carried(a, b, ca, cb, VA_A, VA_B, 4096)
            assert wait_until(lambda: (cb.gpu_read(VA_B, 4096),
                                       stats(b)["fast_loads"] > fast)[1], 10)


def test_a_tls_pod_has_no_data_channel_and_loads_go_through_the_link(tmp_path):
    """The C side speaks no TLS: a TLS pod's loads all go through the (TLS) link."""
    from nodes import tls_pod_config

    config = tls_pod_config(tmp_path, pod_config(2))
    with running_pod(tmp_path, config=config) as (a, b):
        with Client(a.render()) as ca, Client(b.render()) as cb:
            shared(ca, cb)
            for _ in range(5):
                assert cb.gpu_read(VA_B, 4096) == pattern(4096)
        assert stats(b)["channels"] == 0 and stats(b)["fast_loads"] == 0


def test_a_traced_exporter_records_every_load_it_serves_and_its_peer_logs_no_refusal(tmp_path):
    """A pod where only the exporter runs with --trace=json: it takes the data channel (so
    its peer logs no refusal) but learns no routes, so every LOAD it serves is Python's and
    is in its trace (the fabric's "recv" records); B's loads are right all along."""
    from nodes import start_node, wait_links_up

    config = pod_config(2)
    a = start_node(tmp_path, config, "node0", trace="json")
    try:
        b = start_node(tmp_path, config, "node1")
        try:
            wait_links_up(a)
            wait_links_up(b)
            assert wait_until(lambda: stats(a)["channels"] == 1 and stats(b)["channels"] == 1)
            with Client(a.render()) as ca, Client(b.render()) as cb:
                shared(ca, cb)
                for _ in range(10):
                    assert cb.gpu_read(VA_B, 4096) == pattern(4096)
            assert stats(a)["served"] == 0 and stats(b)["fast_loads"] == 0
            assert "refused" not in b.log_text() and "refused" not in a.log_text()
        finally:
            b.close()
    finally:
        a.close()
    served = [r for r in map(json.loads, a.out.read_text().splitlines())
              if r.get("type") == "fabric" and r.get("message") == "LOAD"
              and r.get("direction") == "recv"]
    assert len(served) >= 10, a.out.read_text()[-3000:]


def while_stopped(proc: subprocess.Popen[bytes], access: Callable[[], object]) -> list[object]:
    """`access` (a GPU load or store through the importer) run while the exporter `proc` is
    stopped (SIGSTOP) for 0.9 s, past the 250 ms deadline and well within the 5 s
    heartbeat's: [what it returned], or [the errno it failed with]."""
    got: list[object] = []
    started = threading.Event()

    def run() -> None:
        started.set()
        try:
            got.append(access())
        except OSError as e:
            got.append(e.errno)
    stop_process(proc.pid)
    try:
        t = threading.Thread(target=run, daemon=True)
        t.start()
        assert started.wait(10)
        time.sleep(0.9)
    finally:
        proc.send_signal(signal.SIGCONT)
    t.join(10)  # watchdog
    return got


@pytest.mark.parametrize("tls", [False, True], ids=["data-plane", "link-only"])
def test_a_load_answered_after_the_links_deadline_faults_as_on_the_link(tmp_path, tls):
    """A LOAD on the link has the pod's send_ack_timeout_ms to be answered, then the load
    faults (EFAULT, gpu_faults counts it: policy 7, 10): the TLS pod, whose loads all go
    through the link, shows it. A load the data plane carries has the same deadline: the
    exporter stopped (SIGSTOP) past it and resumed within the heartbeat timeout (the link
    stays up), B's load faults; it did not when the data plane waited its own 1 s and then
    asked again on the link."""

    from nodes import tls_pod_config

    config = pod_config(2, response_ms=250)
    with running_pod(tmp_path, config=tls_pod_config(tmp_path, config) if tls
                     else config) as (a, b):
        with Client(a.render()) as ca, Client(b.render()) as cb:
            shared(ca, cb)
            if tls:
                assert cb.gpu_read(VA_B, 4096) == pattern(4096)
            else:
                loads_carried(a, b, ca, cb, VA_A, VA_B, 4096)
            faults = int(b.debug(128, "gpu_faults"))
            fast = stats(b)["fast_loads"]
            got = while_stopped(a.proc, lambda: cb.gpu_read(VA_B, 4096))
            assert got == [errno.EFAULT], str(got)[:80]
            assert int(b.debug(128, "gpu_faults")) == faults + 1
            assert stats(b)["fast_loads"] == fast
            assert cb.gpu_read(VA_B, 4096) == pattern(4096)  # (the link is still up)
            assert "unexpected exception" not in b.log_text()


async def test_the_data_plane_runs_before_the_link_can_hand_it_a_channel(tmp_path,
                                                                          monkeypatch):
    """A peer's data channel is dialed once per link, as soon as the link is up, and one
    the data plane refuses is not dialed again: the link carries that peer's loads for
    good. So the daemon starts its data plane before its link runs (it did so only when
    FUSE serving began, after the link, the agent and the trace socket had started: a
    link that came up in between lost its data channel)."""
    import io

    import trio

    from ualinkd.cli.main import free_tcp_ports
    from ualinkd.config import PodConfig
    from ualinkd.daemon import run_node
    from ualinkd.fabric.link import FabricLink
    from ualinkd.fuse.lowlevel import fuse_mounts_at

    seen: list[bool] = []
    run = FabricLink.run

    async def run_noting(self, **kw):
        plane = self._channels.plane  # (the link's DataChannels: the node's data plane)
        seen.append(plane is not None and plane.running)
        await run(self, **kw)
    monkeypatch.setattr(FabricLink, "run", run_noting)
    mount = tmp_path / "mnt"
    try:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                await nursery.start(run_node, PodConfig.local(1, 1, free_tcp_ports(1)),
                                    "node0", str(mount), None, io.StringIO())
                nursery.cancel_scope.cancel()
    finally:
        assert not fuse_mounts_at(str(mount)), "mount left behind"
    assert seen == [True]


def test_loads_over_more_chunks_than_a_few_hundred_are_carried_too(tmp_path):
    """4 KiB loads that cycle over 512 chunks of a 32 MiB BO (more than the 256 routes the
    exporter once kept, in one list): after one pass the data plane carries them. With
    too few routes every load missed at the exporter, was answered DP_FALLBACK and asked
    again on the link: slower than the link alone (~1.5-2x, on a shared 2-core machine)."""
    size = 32 * MIB
    with running_pod(tmp_path, config=pod_config(2)) as (a, b):
        with Client(a.render()) as ca, Client(b.render()) as cb:
            bo, _, _ = share(ca, cb, size)
            ca.va_map(bo, VA_A, size)
            offsets = range(0, size, CHUNK)
            for off in offsets:
                assert ca.gpu_write(VA_A + off, off.to_bytes(8, "little")) == 8
            for off in offsets:  # (the routes are learnt)
                cb.gpu_read(VA_B + off, 4096)
            before = stats(b)
            for _ in range(2):
                for off in offsets:
                    assert cb.gpu_read(VA_B + off, 4096)[:8] == off.to_bytes(8, "little")
            after = stats(b)
            loads = 2 * len(offsets)
            assert after["fast_loads"] - before["fast_loads"] >= loads * 9 // 10, (before, after)
            assert after["fallbacks"] - before["fallbacks"] <= loads // 10, (before, after)


def _data_channel_ports(pid: int, loads_bytes: int) -> tuple[str, str]:
    """(local, peer) address of the TCP connection of daemon `pid` that received at least
    `loads_bytes`: its data channel, after that many bytes of carried loads (its link
    carried a few messages and heartbeats meanwhile)."""
    out = subprocess.run(["ss", "-tnpiH", "state", "established"], capture_output=True,
                         text=True, check=True).stdout
    found = []
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if f"pid={pid}," not in line:
            continue
        local, peer = line.split()[2:4]
        info = lines[i + 1] if i + 1 < len(lines) else ""
        got = re.search(r"bytes_received:(\d+)", info)
        if got and int(got.group(1)) >= loads_bytes:
            found.append((local, peer))
    assert len(found) == 1, out
    return found[0]


def _established(local: str, peer: str) -> bool:
    out = subprocess.run(["ss", "-tnH", "state", "established", "src", local, "dst", peer],
                         capture_output=True, text=True, check=True).stdout
    return bool(out.strip())


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2)")
def test_a_data_channel_reset_while_the_link_lasts_is_dialed_again(tmp_path):
    """A data channel that breaks while its link stays up (here reset with `ss -K`, as a
    middlebox or a peer's crash of that one socket would): the loads in flight and after
    it go through the link with the exporter's bytes, one WARNING says so, and the dialer
    dials a new channel (fabric/channels.py ChannelKeeper.keep), which carries them again."""
    with running_pod(tmp_path, config=pod_config(2)) as (a, b):
        assert wait_until(lambda: stats(a)["channels"] == 1 and stats(b)["channels"] == 1, 10)
        with Client(a.render()) as ca, Client(b.render()) as cb:
            shared(ca, cb)
            loads_carried(a, b, ca, cb, VA_A, VA_B, 4096)
            for _ in range(64):
                assert cb.gpu_read(VA_B, 4096) == pattern(4096)
            local, peer = _data_channel_ports(b.proc.pid, 64 * 4096)
            subprocess.run(["ss", "-K", "-tn", "src", local, "dst", peer], check=True,
                           capture_output=True)
            if _established(local, peer):  # (a kernel without CONFIG_INET_DIAG_DESTROY)
                pytest.skip("ss -K cannot reset a socket on this kernel")
            for _ in range(20):  # through the link until a new channel is up
                assert cb.gpu_read(VA_B, 4096) == pattern(4096)
            assert wait_until(lambda: "channel to node0 dropped" in b.log_text()
                              or "channel to node1 dropped" in a.log_text(), 10)
            assert wait_until(lambda: stats(a)["channels"] == 1 and stats(b)["channels"] == 1,
                              10), (stats(a), stats(b))
            before = stats(b)["fast_loads"]
            assert wait_until(lambda: cb.gpu_read(VA_B, 4096) == pattern(4096)
                              and stats(b)["fast_loads"] > before, 10), (stats(b), b.log_text())
            assert "handed over again" in a.log_text() + b.log_text()
            assert "unexpected exception" not in a.log_text() + b.log_text()


def test_a_party_with_the_link_key_cannot_take_a_live_data_channel(tmp_path):
    """Issue 29 item 6 on real daemons: node0 dialed node1, so node1 admits node0's data
    channel. A second party holding node0's link key (a stolen or superseded node config)
    dials node1 data channels as node0, ten times, and keeps them open: node1 refuses each,
    not bound to the live link (one WARNING naming node0 and the address), node0's channel
    stays the one node1's C data plane uses, and node1's loads of node0's memory are
    node0's bytes, carried. On the old code each newcomer was admitted and took the
    channel over (10 of 10; node0, its channel closed, dialed again and took it back, so a
    forger answering the loads it got gave 37-54 % of them its own bytes in the issue's
    run)."""
    import trio
    from test_fabric_data_channel import data_hello

    from ualinkd.fabric.link import parse_address

    config = pod_config(2)
    with running_pod(tmp_path, config=config) as (a, b):
        assert wait_until(lambda: stats(a)["channels"] == 1 and stats(b)["channels"] == 1, 10)
        with Client(a.render()) as ca, Client(b.render()) as cb:
            shared(ca, cb)
            loads_carried(a, b, ca, cb, VA_A, VA_B, 4096)
            _, port = parse_address(config.nodes[1].address)

            async def attack_then_load() -> tuple[int, list[bool]]:
                held: list[trio.abc.Stream] = []
                taken = 0

                async def one() -> None:
                    nonlocal taken
                    stream, ok = await data_hello(port, config, "node0", "node1")
                    taken += ok
                    held.append(stream)

                try:
                    async with trio.open_nursery() as n:  # (each is refused after a wait)
                        for _ in range(10):
                            n.start_soon(one)
                    before = stats(b)["fast_loads"]
                    right = []
                    for _ in range(10):
                        got = await trio.to_thread.run_sync(cb.gpu_read, VA_B, 4096)
                        right.append(got == pattern(4096))
                    assert stats(b)["fast_loads"] > before  # (carried, not the link's)
                    return taken, right
                finally:
                    for s in held:
                        await s.aclose()

            taken, right = trio.run(attack_then_load)
            print(f"{taken} of 10 impostor data channels admitted; "
                  f"{right.count(False)} of 10 loads wrong")
            assert taken == 0 and all(right), (taken, right)
            assert stats(b)["channels"] == 1
        warned = [line for line in b.log_text().splitlines()
                  if "refused connection from node0 (127.0.0.1:" in line]
        assert len(warned) == 1 and "WARNING" in warned[0], b.log_text()
        # (refused at once: its nonce is not bound to the live link's handshake)
        assert "a data channel from node0 not dialed by its live link's end" in warned[0]


def test_a_peer_that_stops_closes_its_channels_without_a_warning(tmp_path):
    """A peer that stops (SIGTERM: a pod's orderly stop) closes its data channels and its
    links together: the nodes it leaves log no data-plane WARNING for the channel (the
    link's own INFO line says the peer closed it), whichever of the two ends they see
    first (fuse/dataplane.py DROP_LOG_GRACE). Before, every node wrote "channel to node2
    dropped: the peer closed it" as a WARNING, one per peer at a 256-node pod's stop.
    (A channel that breaks while its link lasts still warns: the reset test above.)"""
    from ualinkd.fuse.dataplane import DROP_LOG_GRACE

    with running_pod(tmp_path, config=pod_config(3)) as (a, b, c):
        assert wait_until(lambda: all(stats(n)["channels"] == 2 for n in (a, b, c)), 10)
        assert c.stop() == 0
        for node in (a, b):
            assert wait_until(lambda n=node: "node2 closed the connection" in n.log_text(), 10)
        time.sleep(DROP_LOG_GRACE + 1)
        for node in (a, b):
            bad = [ln for ln in node.log_text().splitlines()
                   if " WARNING " in ln or " ERROR " in ln]
            assert not bad, bad
            assert stats(node)["channels"] == 1
