"""Emulated VRAM and GTT are bounded by the pod's memory budget, and running out is ENOMEM
to the client, never the daemon growing without bound (issue 10 item 10; spec §2.3's
GEM_CREATE ENOMEM). Every BO's bytes live in the daemon (allocated on first write), so
capacity is charged at creation for every BO, special domains included."""

from __future__ import annotations

import dataclasses
import errno
from pathlib import Path

import pytest
from nodes import Client, running_node

from ualinkd.config import PodConfig

pytestmark = pytest.mark.integration

MIB = 1 << 20
BO = 4 * MIB


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_filling_every_bo_of_the_budget_is_enomem_not_a_dead_daemon(tmp_path):
    """memory_budget 64 MiB for a one-accel pod: 32 MiB of VRAM and 32 of GTT. 4 MiB BOs
    fit sixteen times (VRAM-only ones fall back to GTT, §2.3), the seventeenth is ENOMEM,
    as is a GDS BO that nothing used to account; writing every byte of all sixteen grows the
    daemon by about the budget and no more, and it keeps serving."""
    config = dataclasses.replace(PodConfig.local(1, 1), memory_budget=64 * MIB)
    with running_node(tmp_path, config) as node, Client(node.render()) as c:
        before = rss(node.proc.pid)
        bos = []
        with pytest.raises(OSError) as e:
            for _ in range(64):
                bos.append(c.bo_create(BO))
        assert e.value.errno == errno.ENOMEM and len(bos) == 16
        with pytest.raises(OSError) as e:
            c.bo_create(BO, domains=0x8)  # GDS
        assert e.value.errno == errno.ENOMEM
        chunk = b"\xa5" * MIB
        for i, bo in enumerate(bos):
            va = 0x1_0000_0000 + i * BO
            c.va_map(bo, va, BO)
            for off in range(0, BO, MIB):
                done = 0
                while done < MIB:
                    done += c.gpu_write(va + off + done, chunk[done:])
        assert c.gpu_read(0x1_0000_0000 + 15 * BO + BO - 4, 4) == b"\xa5" * 4
        grown = rss(node.proc.pid) - before
        print(f"daemon RSS grew {grown / MIB:.1f} MiB for 64 MiB of BOs written")
        assert grown < 64 * MIB + 32 * MIB, grown / MIB
        assert node.proc.poll() is None
        assert node.sysfs(128, "accel_state") == "active\n"
        c.bo_close(bos.pop())
        bos.append(c.bo_create(BO))  # freed capacity is there again
