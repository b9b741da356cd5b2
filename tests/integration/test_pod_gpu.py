"""GPU loads and stores across the pod (DESIGN "GPU loads and stores", spec §4.4–§4.6, §6.3,
Emulator policies 3 and 10): real daemons, real mounts, clients through libualink."""

from __future__ import annotations

import errno
import hashlib
import os
import signal

import pytest
from nodes import Client, running_pod
from test_pod_fabric import pod_config, wait_until

pytestmark = pytest.mark.integration
RW = 0x6  # READABLE | WRITEABLE
VA_A, VA_B = 0x100000000, 0x7F0000000000


def share(ca: Client, cb: Client, size: int, va: int = VA_B):
    """A creates a VRAM BO and exports it; B imports, turns the fd into a GEM handle and
    maps it at `va`."""
    bo = ca.bo_create(size)
    handle = ca.export(bo)
    fd = cb.import_(handle)
    gem = cb.fd_to_handle(fd)
    os.close(fd)
    cb.va_map(gem, va, size)
    return bo, handle, gem


def test_write_on_a_read_on_b_and_back_and_c_sees_it(tmp_path):
    """A writes a pattern through its own VM; B reads it through the imported NPA BO; B
    writes; A and C read B's bytes (a store returns only once the exporter applied it)."""
    with running_pod(tmp_path, config=pod_config(3)) as (a, b, c):
        with Client(a.render()) as ca, Client(b.render()) as cb, Client(c.render()) as cc:
            bo, handle, gem_b = share(ca, cb, 1 << 20)
            ca.va_map(bo, VA_A, 1 << 20)
            pattern = bytes(range(256)) * 16
            assert ca.gpu_write(VA_A + 8192, pattern) == len(pattern)
            assert cb.gpu_read(VA_B + 8192, len(pattern)) == pattern
            assert cb.gpu_write(VA_B + 100, b"written by B") == 12
            assert ca.gpu_read(VA_A + 100, 12) == b"written by B"
            gem_c = cc.fd_to_handle(fd := cc.import_(handle))
            os.close(fd)
            cc.va_map(gem_c, VA_A, 1 << 20, flags=0x2)  # read-only
            assert cc.gpu_read(VA_A + 100, 12) == b"written by B"
            with pytest.raises(OSError) as e:
                cc.gpu_write(VA_A, b"x")  # no WRITEABLE
            assert e.value.errno == errno.EFAULT


def test_revoke_makes_the_next_read_fault(tmp_path):
    """§6.3: after A closes its handle, B's mapping stays but faults (EFAULT) and B's
    GPU fault counter rises."""
    with running_pod(tmp_path, config=pod_config(2)) as (a, b):
        with Client(a.render()) as ca, Client(b.render()) as cb:
            bo, handle, gem_b = share(ca, cb, 64 << 10)
            assert cb.gpu_read(VA_B, 16) == bytes(16)  # VRAM_CLEARED
            before = int(b.debug(128, "gpu_faults"))
            ca.bo_close(bo)
            assert wait_until(lambda: b.debug(128, "ualink_imports") == "")
            with pytest.raises(OSError) as e:
                cb.gpu_read(VA_B, 16)
            assert e.value.errno == errno.EFAULT
            assert int(b.debug(128, "gpu_faults")) > before


def test_64_mib_round_trip_by_hash(tmp_path):
    """A 64 MiB transfer across the fabric compares equal byte for byte (both ways)."""
    size = 64 << 20
    data = os.urandom(size)
    with running_pod(tmp_path, config=pod_config(2)) as (a, b):
        with Client(a.render()) as ca, Client(b.render()) as cb:
            bo, handle, gem_b = share(ca, cb, size)
            ca.va_map(bo, VA_A, size)
            step = 1 << 20
            for off in range(0, size, step):
                assert cb.gpu_write(VA_B + off, data[off:off + step]) == step
            got = b"".join(ca.gpu_read(VA_A + off, step) for off in range(0, size, step))
            assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest()
            back = b"".join(cb.gpu_read(VA_B + off, step) for off in range(0, size, step))
            assert hashlib.sha256(back).digest() == hashlib.sha256(data).digest()


def test_partial_fault_short_count(tmp_path):
    """Policy 10: a read that runs past the end of the imported mapping returns the bytes
    up to the first faulting page; a read starting there is EFAULT."""
    with running_pod(tmp_path, config=pod_config(2)) as (a, b):
        with Client(a.render()) as ca, Client(b.render()) as cb:
            share(ca, cb, 64 << 10)
            got = cb.gpu_read(VA_B + (60 << 10), 16 << 10)
            assert len(got) == 4 << 10
            with pytest.raises(OSError) as e:
                cb.gpu_read(VA_B + (64 << 10), 16)
            assert e.value.errno == errno.EFAULT


def test_exporter_killed_mid_transfer_faults_without_hanging(tmp_path):
    """Policy 3: a GPU access to an exporter that cannot be reached faults at once."""
    with running_pod(tmp_path, config=pod_config(2)) as (a, b):
        with Client(a.render()) as ca, Client(b.render()) as cb:
            share(ca, cb, 1 << 20)
            assert len(cb.gpu_read(VA_B, 4096)) == 4096
            a.stop(signal.SIGKILL)
            assert wait_until(lambda: "node0 down" in
                              (b.mount / "sys/kernel/debug/ualink_fabric").read_text())
            with pytest.raises(OSError) as e:
                cb.gpu_read(VA_B, 1 << 20)
            assert e.value.errno == errno.EFAULT
