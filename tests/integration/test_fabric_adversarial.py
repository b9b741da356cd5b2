"""The fabric under bursts, slow readers and stalls (issue 10 items 4, 5, 7), with real daemons
and real clients: nothing a peer sent in order is lost after its ACK, what a link holds for
a peer that does not read is bounded, and a store reported as failed never lands later.
Every test checks that an unrelated client keeps being served and that nothing leaks
(`ualinkctl --json all`)."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
import trio
from nodes import Client, running_pod, start_node, stop_process
from test_fabric_link import raw_auth, read_frame
from test_pod_fabric import wait_until
from test_pod_gpu import VA_B, share

from ualinkd.amdgpu.vm import npa_byte_address
from ualinkd.cli.main import free_tcp_ports
from ualinkd.config import PodConfig
from ualinkd.fabric.wire import Ack, Load, Msg, Ping, encode_frame
from ualinkd.fuse.lowlevel import clear_stale_mount, fuse_mounts_at
from ualinkd.ualink import protocol as p

pytestmark = pytest.mark.integration


def ctl_all(node) -> dict:
    """`ualinkctl --json all` of a node (as root: debugfs is root-only)."""
    ctl = os.path.join(os.path.dirname(sys.executable), "ualinkctl")
    out = subprocess.run([ctl, "--mount", str(node.mount), "--json", "all"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def section_len(node, name: str) -> int:
    """How many entries `ualinkctl --json all` lists under `name`, for polling while the
    node changes; -1 when the read tore (a debugfs file longer than one FUSE read is
    rendered again for each piece, so a read racing a change can see two versions of it:
    tree.py, reported)."""
    ctl = os.path.join(os.path.dirname(sys.executable), "ualinkctl")
    out = subprocess.run([ctl, "--mount", str(node.mount), "--json", "all"],
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        return -1
    return len(json.loads(out.stdout)["accels"][0][name])


def peers(node) -> list[dict]:
    return ctl_all(node)["accels"][0]["peers"]


def rss_kib(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


class Bystander:
    """A client pair loading from an unrelated import between the same accels, in a thread,
    for as long as the test runs: every load must succeed with the right bytes."""

    def __init__(self, a, b, size: int = 64 << 10) -> None:
        self.ca, self.cb = Client(a.render()), Client(b.render())
        self.bo, self.handle, _ = share(self.ca, self.cb, size)
        self.ca.va_map(self.bo, 0x100000000, size)
        self.pattern = os.urandom(4096)
        assert self.ca.gpu_write(0x100000000, self.pattern) == 4096
        self.loads = 0
        self.errors: list[BaseException] = []
        self.worst = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            t = time.monotonic()
            try:
                got = self.cb.gpu_read(VA_B, 4096)
                assert got == self.pattern, "bystander read the wrong bytes"
            except BaseException as e:  # reported by check()
                self.errors.append(e)
                return
            self.worst = max(self.worst, time.monotonic() - t)
            self.loads += 1

    def __enter__(self) -> Bystander:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        self.ca.close()
        self.cb.close()

    def check(self) -> None:
        assert not self.errors, self.errors
        n = self.loads
        assert wait_until(lambda: self.loads > n + 3), "bystander loads stopped"


def test_revoke_burst_of_2000_loses_nothing_and_spares_a_bystander(tmp_path):
    """Issue 10 item 4 (§5.7, §5.1): a client with 2000 exported BOs imported by another
    node closes its render fd: 2000 NPA_REVOKEs in one burst, more than the importer's
    receive ring holds (agent.RING_SIZE). Each is taken in order (the link stops reading
    while the ring is full): every import goes, every release comes back, no connection is
    reset, and a bystander import between the same accels keeps loading throughout."""
    n = 2000
    # The property is that nothing is lost and nothing is reset, not how fast: the
    # bystander's LOADs share the TCP stream with the burst's 2000 RELEASEs and ACKs and
    # wait behind them (about 1 s here; more on a loaded 2-core CI machine), so their wait
    # is 10 s instead of the kernel's 2 s. The figure is printed (worst); speed belongs to
    # the benchmarks.
    cfg = dataclasses.replace(PodConfig.local(2, 1, free_tcp_ports(2)),
                              send_ack_timeout_ms=10_000)
    with running_pod(tmp_path, config=cfg) as (a, b):
        with Bystander(a, b) as by:
            gen_a, gen_b = peers(a), peers(b)
            ca, cb = Client(a.render()), Client(b.render())
            try:
                for _ in range(n):
                    fd = cb.import_(ca.export(ca.bo_create(4096)))
                    os.close(fd)
                doc = ctl_all(b)["accels"][0]
                assert len(doc["imports"]) == n + 1
                by.check()
                t0 = time.monotonic()
                ca.close()  # handle_free of 2000 exported BOs: the burst
                assert wait_until(lambda: section_len(b, "imports") == 1, 60)
                assert wait_until(lambda: section_len(a, "exports") == 1, 60)
                burst = time.monotonic() - t0
                by.check()
            finally:
                ca.close()
                cb.close()
            imports = ctl_all(b)["accels"][0]["imports"]
            assert [i["handle_lo"] for i in imports] == [f"{by.handle[0]:#018x}"]
            acc_a = ctl_all(a)["accels"][0]
            assert acc_a["npa"]["used_pages"] == 16  # the bystander's BO alone
            assert peers(a) == gen_a and peers(b) == gen_b  # no reset: same generations
            by.check()
            logs = [a.log_text(), b.log_text()]  # before the pod's own teardown
        print(f"revoke burst of {n}: done in {burst:.1f} s (polled); bystander {by.loads} "
              f"loads, worst {by.worst * 1000:.0f} ms")
    for log in logs:
        assert "reset (generation" not in log and "dropping" not in log, log[-3000:]
        assert "never released" not in log, log[-3000:]
        assert not re.search(r"sending \w+ to accel \d+ failed", log), log[-3000:]
        assert log.count("was full") <= 4, log[-3000:]  # one line per episode, not per message


# ---- a peer that does not read (item 5) --------------------------------------------------------

class RawImporter:
    """A key holder speaking the fabric by hand as node0 (accel 0) to node1 (accel 1): it
    says HELLO, asks for an NPA grant of `handle`, ACKs what node1 sends, then does as the
    test says."""

    def __init__(self, stream: trio.SocketStream, dec) -> None:
        self.stream, self.dec, self.seq = stream, dec, 0

    @classmethod
    async def connect(cls, port: int, cfg: PodConfig) -> RawImporter:
        return cls(*await raw_auth(port, cfg, "node0", "node1"))

    async def send_msg(self, msg) -> None:
        self.seq += 1
        await self.stream.send_all(encode_frame(Msg(self.seq, 0, 1, msg.encode())))

    async def recv_msg(self):
        while True:
            f = await read_frame(self.stream, self.dec)
            if isinstance(f, Msg):
                await self.stream.send_all(encode_frame(Ack(f.seq, 0)))
                return p.decode_message(f.dwords)

    async def grant(self, handle: tuple[int, int]) -> int:
        """HELLO, then NPA_REQ: the NPA byte address of the BO's first byte."""
        await self.send_msg(p.Hello(1, 0))
        assert isinstance(await self.recv_msg(), p.HelloAck)
        await self.send_msg(p.NpaReq(p.handle_lo_bits(handle[0]), handle[1]))
        rsp = await self.recv_msg()
        assert isinstance(rsp, p.NpaRsp), rsp
        return npa_byte_address((1, rsp.npa_offset, rsp.size_pages), 0)

    async def loads(self, addr: int, n: int, length: int) -> None:
        frames = []
        for _ in range(n):
            self.seq += 1
            frames.append(encode_frame(Load(self.seq, 0, 1, addr, length)))
        await self.stream.send_all(b"".join(frames))


def stop_nodes(*nodes) -> None:
    for node in nodes:
        node.stop()
        if fuse_mounts_at(str(node.mount)):
            clear_stale_mount(node.mount)


def three_node_pod(tmp_path):
    """node1 (the exporter) and node2 (a bystander's importer) as daemons; node0's name and
    key are the raw peer's."""
    cfg = PodConfig.local(3, 1, free_tcp_ports(3))
    nodes = [start_node(tmp_path, cfg, name) for name in ("node1", "node2")]
    return cfg, nodes


def test_a_peer_that_does_not_read_costs_bounded_memory(tmp_path):
    """Issue 10 item 5: a key holder granted a 1 MiB NPA sends 300 LOADs of all of it and
    never reads. The exporter holds at most link.HOLD_MAX of answers for it (its further
    LOADs wait unserved; one log line), keeps serving a bystander, and drops the link as
    "peer not reading" once it has taken nothing for the heartbeat timeout. Memory is
    measured (VmRSS), not time."""
    cfg, (b, c) = three_node_pod(tmp_path)
    port = cfg.node("node1").address.rsplit(":", 1)[1]
    try:
        assert wait_until(lambda: "node2 up" in
                          (b.mount / "sys/kernel/debug/ualink_fabric").read_text(), 10)
        with Bystander(b, c) as by, Client(b.render()) as cb:
            handle = cb.export(cb.bo_create(1 << 20))
            by.check()
            before = rss_kib(b.proc.pid)
            peak = [before]

            async def attack() -> None:
                raw = await RawImporter.connect(int(port), cfg)
                addr = await raw.grant(handle)
                await raw.loads(addr, 300, 1 << 20)
                for _ in range(15):  # PINGs keep it from looking silent; nothing is read
                    peak[0] = max(peak[0], rss_kib(b.proc.pid))
                    await raw.stream.send_all(encode_frame(Ping(1)))
                    await trio.sleep(0.2)
                grew = (peak[0] - before) >> 10
                print(f"exporter RSS {before >> 10} MiB before, peak +{grew} MiB (300 unread "
                      f"1 MiB answers); bystander worst load {by.worst * 1000:.0f} ms")
                assert grew < 64, f"exporter grew by {grew} MiB for a peer that does not read"
                by.check()  # served throughout
                with trio.fail_after(30):  # watchdog: the drop must come
                    while "peer not reading" not in b.log_text():
                        await raw.stream.send_all(encode_frame(Ping(1)))
                        await trio.sleep(0.2)
                await raw.stream.aclose()

            trio.run(attack)
            by.check()
        log = b.log_text()
        assert log.count("is not taking its answers") == 1, log[-3000:]
        assert log.count("peer not reading") == 1, log[-3000:]
        ctl_all(b)  # still answering, consistent
    finally:
        stop_nodes(b, c)


# ---- a store reported as failed (item 7) --------------------------------------------------------

def test_a_store_that_failed_never_lands_later(tmp_path):
    """Issue 10 item 7 (policy 10; README, emulator decisions): the importer's GPU store
    towards a stopped exporter returns EFAULT after the request timeout; the STORE is in the
    exporter's socket by then, and when the exporter resumes it refuses it as past its
    deadline instead of applying it: a load gives the old bytes, and later stores work."""
    cfg = PodConfig.local(2, 1, free_tcp_ports(2))
    with running_pod(tmp_path, config=cfg) as (a, b):
        with Client(a.render()) as ca, Client(b.render()) as cb:
            share(ca, cb, 64 << 10)
            old, new = os.urandom(4096), os.urandom(4096)
            assert cb.gpu_write(VA_B, old) == 4096
            stop_process(a.proc.pid)
            try:
                with pytest.raises(OSError) as e:
                    cb.gpu_write(VA_B, new)
                assert e.value.errno == errno.EFAULT
            finally:
                a.proc.send_signal(signal.SIGCONT)
            assert cb.gpu_read(VA_B, 4096) == old
            assert cb.gpu_write(VA_B, new) == 4096  # the link and the grant are fine
            assert cb.gpu_read(VA_B, 4096) == new
        log = a.log_text()
        assert log.count("past its deadline") == 1, log[-2000:]
