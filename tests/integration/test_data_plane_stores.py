"""The C data plane's stores (fuse/dataplane.c: dp_try_store, dp_serve_store) on real
daemons: GPU stores of imported memory carried as STORE frames on the data channel, with
the semantics of the link's STORE path (spec policy 10: a store stops at its first faulting
page, EFAULT when nothing was stored; §6.3 revokes; a tracer sees every access)."""

from __future__ import annotations

import errno
import json
import mmap
import os
import signal
import time

import pytest
from nodes import Client, recording, running_pod, wait_until
from test_data_plane import CHUNK, MIB, pattern, shared, stats, while_stopped
from test_pod_fabric import pod_config
from test_pod_gpu import VA_A, VA_B

pytestmark = pytest.mark.integration


def aligned_write(c: Client, va: int, data: bytes) -> int:
    """One GPU store of `data` as one write request (from a page-aligned buffer)."""
    with mmap.mmap(-1, max(len(data), 1)) as buf:
        buf[: len(data)] = data
        return os.pwritev(c.fd, [memoryview(buf)[: len(data)]], va)


def stores_carried(a, b, cb: Client, va_b: int, n: int) -> None:
    """Stores of B until the data plane carries them (the first of a mapping is Python's,
    which learns the route)."""
    def carried() -> bool:
        assert aligned_write(cb, va_b, pattern(n, 9)) == n
        return stats(b)["fast_stores"] > 0
    assert wait_until(carried, 10), (stats(a), stats(b), b.log_text())


def test_stores_are_carried_by_the_data_plane_and_land_in_the_exporters_bo(tmp_path):
    """After B's first store of a mapping (Python's, through the link), its next stores go
    as STOREs on the data channel, answered by A's C thread: at any offset, across a BO
    chunk's edge, 1 byte, 64 KiB and the whole 1 MiB BO; A's own loads read B's bytes. A
    store into a chunk never written goes back to Python (A's C has no memory to put it
    in: refused_stores), which stores it through the link: the bytes land all the same."""
    with running_pod(tmp_path, config=pod_config(2)) as (a, b):
        assert wait_until(lambda: stats(a)["channels"] == 1 and stats(b)["channels"] == 1, 10)
        with Client(a.render()) as ca, Client(b.render()) as cb:
            shared(ca, cb)
            # Chunk 9 was never written: refused by A's C, stored by Python; then carried.
            stores_carried(a, b, cb, VA_B, 4096)
            before_a = stats(a)
            data = pattern(4096, 77)
            assert aligned_write(cb, VA_B + 9 * CHUNK, data) == 4096
            assert ca.gpu_read(VA_A + 9 * CHUNK, 4096) == data
            assert stats(a)["refused_stores"] > before_a["refused_stores"]
            assert ca.gpu_write(VA_A, bytes(MIB)) == MIB  # (every chunk has memory now)
            for seed, (off, n) in enumerate([(0, 4096), (123, 4000), (CHUNK - 2048, 4096),
                                             (3, 1), (0, CHUNK), (500, 3000), (0, MIB),
                                             (CHUNK + 5, 3 * CHUNK)], 1):
                # (the first may be refused: A's routes went when its chunks got memory)
                assert aligned_write(cb, VA_B + off, pattern(n)) == n
                data = pattern(n, seed)
                before_b, before_a = stats(b), stats(a)
                assert aligned_write(cb, VA_B + off, data) == n, (off, n)
                assert ca.gpu_read(VA_A + off, n) == data, (off, n)
                after_b, after_a = stats(b), stats(a)
                assert after_b["fast_stores"] - before_b["fast_stores"] == 1, (off, n)
                assert after_a["served_stores"] - before_a["served_stores"] == 1, (off, n)
            # (B's loads, carried too, see B's stores in order.)
            assert aligned_write(cb, VA_B + 64, b"ordered") == 7
            assert cb.gpu_read(VA_B + 64, 7) == b"ordered"
            assert "unexpected exception" not in a.log_text() + b.log_text()


def test_a_store_past_the_mapping_stops_there_and_a_revoked_one_faults(tmp_path):
    """Policy 10: a store that runs past B's mapping stores up to its end (the count) and
    one that begins past it is EFAULT; §6.3: once A frees the BO (the revoke), B's stores,
    routes learnt or not, fault with EFAULT and store nothing."""
    with running_pod(tmp_path, config=pod_config(2)) as (a, b):
        with Client(a.render()) as ca, Client(b.render()) as cb:
            bo = shared(ca, cb)
            assert ca.gpu_write(VA_A, bytes(MIB)) == MIB  # (every chunk has memory)
            stores_carried(a, b, cb, VA_B, 4096)
            assert aligned_write(cb, VA_B + MIB - 4096, pattern(8192, 3)) == 4096
            assert ca.gpu_read(VA_A + MIB - 4096, 4096) == pattern(8192, 3)[:4096]
            with pytest.raises(OSError) as e:
                aligned_write(cb, VA_B + MIB, pattern(4096))
            assert e.value.errno == errno.EFAULT
            ca.va_unmap(bo, VA_A, MIB)
            ca.bo_close(bo)  # the revoke (§6.4)

            def faults() -> bool:
                try:
                    aligned_write(cb, VA_B, pattern(4096, 1))
                except OSError as e:
                    assert e.errno == errno.EFAULT
                    return True
                return False
            assert wait_until(faults, 10)
            with pytest.raises(OSError) as e:
                aligned_write(cb, VA_B + 4096, pattern(4096, 2))
            assert e.value.errno == errno.EFAULT
            assert "unexpected exception" not in a.log_text() + b.log_text()


def test_a_recording_sees_every_store_while_it_is_attached(tmp_path):
    """`ualinkd record` attached: B's stores come back through Python (the tracer setter
    drops the routes; gpu_read_route gives none while one is attached) and each is
    recorded; detached, the data plane carries them again."""
    out = tmp_path / "rec.jsonl"
    with running_pod(tmp_path, config=pod_config(2)) as (a, b):
        with Client(a.render()) as ca, Client(b.render()) as cb:
            shared(ca, cb)
            stores_carried(a, b, cb, VA_B, 4096)
            with recording([b.mount], out):
                fast = stats(b)["fast_stores"]
                for i in range(5):
                    assert aligned_write(cb, VA_B + i, pattern(4096, i)) == 4096
                assert stats(b)["fast_stores"] == fast
            stores = [r for r in map(json.loads, out.read_text().splitlines())
                      if r.get("type") == "gpu" and r.get("op") == "store"]
            assert len(stores) >= 5, out.read_text()[:2000]
            assert ca.gpu_read(VA_A + 4, 4096) == pattern(4096, 4)
            stores_carried(a, b, cb, VA_B, 4096)


def test_a_vanished_exporter_fails_the_stores_and_the_importer_serves_on(tmp_path):
    """A's daemon killed while B's stores ride the data plane: B's stores fail with an
    errno (EFAULT once B has seen the link go, policy 3) in bounded time, none hangs, and
    B serves its other requests."""
    with running_pod(tmp_path, config=pod_config(2)) as (a, b):
        with Client(a.render()) as ca, Client(b.render()) as cb:
            shared(ca, cb)
            assert ca.gpu_write(VA_A, bytes(MIB)) == MIB
            stores_carried(a, b, cb, VA_B, MIB)
            a.proc.send_signal(signal.SIGKILL)
            a.proc.wait(10)
            start = time.monotonic()
            with pytest.raises(OSError) as e:
                for _ in range(100):  # (until B has seen the link go: policy 3)
                    aligned_write(cb, VA_B, pattern(MIB, 4))
                    time.sleep(0.05)
            assert e.value.errno == errno.EFAULT
            assert time.monotonic() - start < 15
            assert wait_until(lambda: stats(b)["channels"] == 0, 10)
            assert cb.bo_create(4096) > 0  # B serves on
            assert "unexpected exception" not in b.log_text()


def test_a_store_answered_after_the_links_deadline_faults_as_on_the_link(tmp_path):
    """A carried store has the link's deadline (send_ack_timeout_ms): the exporter stopped
    (SIGSTOP) past it and resumed within the heartbeat timeout, B's store faults (EFAULT,
    gpu_faults counts it: policy 7, 10), as a STORE on the link whose answer is late does
    (agent._piece_fault), and never lands later (issue 10 item 7: A refuses it as past its
    deadline); the link stays up and the next store is carried again."""

    config = pod_config(2, response_ms=250)
    with running_pod(tmp_path, config=config) as (a, b):
        with Client(a.render()) as ca, Client(b.render()) as cb:
            shared(ca, cb)
            stores_carried(a, b, cb, VA_B, 4096)
            faults = int(b.debug(128, "gpu_faults"))
            fast = stats(b)["fast_stores"]
            got = while_stopped(a.proc, lambda: aligned_write(cb, VA_B, pattern(4096, 3)))
            assert got == [errno.EFAULT], got
            assert int(b.debug(128, "gpu_faults")) == faults + 1
            assert stats(b)["fast_stores"] == fast
            # The STORE was in A's socket: resumed, A refuses it as past its deadline (the
            # deadline the link's STOREs carry too, on A's link clock), never stores it.
            assert wait_until(lambda: "past its deadline" in a.log_text(), 10)
            assert stats(a)["late_stores"] == 1
            assert ca.gpu_read(VA_A, 4096) == pattern(4096, 9)  # stores_carried's bytes
            stores_carried(a, b, cb, VA_B, 4096)  # (the link is still up)
            assert "unexpected exception" not in b.log_text()


def test_large_stores_reuse_the_request_buffers_and_an_idle_node_frees_them(tmp_path):
    """fuse/dataplane.c dp_try_store / dp_block_done: a carried store of 64 KiB or more
    takes libfuse's request buffer (no copy of its bytes); once answered, that buffer is
    kept and handed to libfuse in place of the next one a store takes, so the daemon does
    not allocate (and the kernel fault in) a fresh 1 MiB per store. Every store's bytes land
    whole in A's BO, in order, whichever buffer carried them (§6 GPU stores: a store is
    stored whole, policy 10); a node idle for a second keeps none (its memory goes, as an
    idle channel's receive buffer does)."""
    with running_pod(tmp_path, config=pod_config(2)) as (a, b):
        assert wait_until(lambda: stats(a)["channels"] == 1 and stats(b)["channels"] == 1, 10)
        with Client(a.render()) as ca, Client(b.render()) as cb:
            shared(ca, cb)
            assert ca.gpu_write(VA_A, bytes(MIB)) == MIB  # (every chunk has memory)
            stores_carried(a, b, cb, VA_B, MIB)
            before = stats(b)
            for seed in range(1, 7):
                data = pattern(MIB, seed)
                assert aligned_write(cb, VA_B, data) == MIB
                assert ca.gpu_read(VA_A, MIB) == data, seed
            after = stats(b)
            assert after["fast_stores"] - before["fast_stores"] == 6
            # (each store but maybe the first hands libfuse the buffer an earlier one kept)
            assert after["reused_buffers"] - before["reused_buffers"] >= 5, (before, after)
            assert 1 <= after["kept_buffers"] <= 2
            assert wait_until(lambda: stats(b)["kept_buffers"] == 0, 5), stats(b)
            data = pattern(MIB, 99)  # (and a store after that takes a fresh one again)
            assert aligned_write(cb, VA_B, data) == MIB
            assert ca.gpu_read(VA_A, MIB) == data
            assert "unexpected exception" not in a.log_text() + b.log_text()
