"""Debian's ROCr 5.2.3 (libhsa-runtime64, unmodified) on the emulated gfx90a through the shim
(issue 30, "Tests that must exist": ROCr; what ROCr needs is in ualinkd/amdgpu/aql.py's
docstring). tests/c/rocr_client.c uses only the public HSA API: hsa_init, hsa_queue_create
(an AQL queue: CREATE_QUEUE COMPUTE_AQL with EOP and CWSR areas), hsa_amd_memory_async_copy
host->VRAM->host at several sizes with the bytes checked (ROCr's BlitSdma on the SDMA
engine), a copy held by a dependency signal the CPU releases, a blocking hsa_signal_wait
(the interrupt path: FENCE to the mailbox, TRAP, the KFD event, hsaKmtWaitOnEvent), a
BARRIER_AND packet on the AQL queue, a KERNEL_DISPATCH that fails visibly (the queue's error
callback with HSA_STATUS_ERROR_INVALID_CODE_OBJECT, its completion signal never
decremented, one log line naming the kernel object), hsa_queue_destroy, hsa_shut_down."""

from __future__ import annotations

import dataclasses
import os
import subprocess
from pathlib import Path

import pytest
from nodes import SHIM, c_program, running_node

from ualinkd.config import AccelConfig, PodConfig

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not Path("/usr/include/hsa/hsa_ext_amd.h").exists(),
                       reason="libhsa-runtime-dev is not installed (make apt installs it)"),
]
HSA_STATUS_ERROR_INVALID_CODE_OBJECT = 0x1010
HSA_STATUS_ERROR_INVALID_PACKET_FORMAT = 0x1009


def mi210_config(nodes: int = 1) -> PodConfig:
    """ROCr 5.2.3 knows gfx90a, not gfx942: the MI210 profile, no override needed."""
    base = PodConfig.local(nodes, 1)
    return dataclasses.replace(base, nodes=tuple(
        dataclasses.replace(n, accels=(AccelConfig(0, profile="mi210"),))
        for n in base.nodes))


def client_env(mount: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LD_", "HSA"))}
    env.update(LD_PRELOAD=str(SHIM), UALINK_DRI_DIR=str(mount / "dri"), **extra)
    return env


def steps(stdout: str) -> dict[str, list[dict[str, str]]]:
    by: dict[str, list[dict[str, str]]] = {}
    for line in stdout.splitlines():
        status, step, *rest = line.split(" ")
        assert status == "ok", stdout
        by.setdefault(step, []).append(dict(w.split("=", 1) for w in rest if "=" in w))
    return by


def test_rocr_moves_bytes_waits_and_reports_a_dispatch(tmp_path: Path):
    with running_node(tmp_path / "node", mi210_config(), trace="text") as node:
        r = subprocess.run([c_program("rocr_client")], env=client_env(node.mount),
                           capture_output=True, text=True, timeout=280)
        log = node.log_text()
        assert r.returncode == 0, r.stdout + r.stderr[-3000:] + log[-3000:]
        by = steps(r.stdout)
        assert [int(c["size"]) for c in by["copy"]] == [4, 4096, 65536 + 12, 4 << 20, 9 << 20]
        assert "copy_dep_held" in by and "copy_dep_released" in by
        assert "blocked_wait" in by and "barrier_and" in by
        assert "barrier_or" in by and "barrier_value" in by
        (d,) = by["dispatch_fails"]
        assert int(d["status"], 16) == HSA_STATUS_ERROR_INVALID_CODE_OBJECT, d
        assert d["completion"] == "1"
        assert "queue_destroy" in by and "shut_down" in by
        # one log line names the kernel object that could not run
        named = [line for line in log.splitlines() if d["kernel_object"] in line]
        assert len(named) == 1, log[-3000:]
        trace = (tmp_path / "node" / "node0.out").read_text()
        # the queues ROCr made: its AQL queue and the SDMA blits (host->device, device->host)
        assert "queue_type=2" in trace and "queue_type=1" in trace, trace[-2000:]
        # a blocked wait slept in the KFD (hsaKmtWaitOnEvent: one event, no timeout) and
        # only the engine's TRAP could end it: COMPLETE (0) copied back
        woken = [line for line in trace.splitlines() if "AMDKFD_WAIT_EVENTS" in line and
                 "num_events=1, wait_for_all=1, timeout=4294967294, wait_result=0})" in line]
        assert woken, [line for line in trace.splitlines() if "WAIT_EVENTS" in line]
        assert "AMDKFD_DESTROY_QUEUE" in trace


def test_rocr_dispatch_fails_on_rocrs_own_queue_and_shuts_down(tmp_path: Path):
    """Only the dispatch: the queue's first packet is the one that cannot run; the queue
    error reaches the callback, destroy and shut_down still complete (nothing hangs)."""
    with running_node(tmp_path / "node", mi210_config()) as node:
        r = subprocess.run([c_program("rocr_client"), "dispatch"], env=client_env(node.mount),
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr[-3000:] + node.log_text()[-3000:]
        (d,) = steps(r.stdout)["dispatch_fails"]
        assert int(d["status"], 16) == HSA_STATUS_ERROR_INVALID_CODE_OBJECT


def test_rocr_unknown_packet_type_is_an_invalid_packet_format(tmp_path: Path):
    """A packet of a type hsa.h does not define on ROCr's queue: the CP's code 32 in
    queue_inactive_signal, which ROCr's handler reports as
    HSA_STATUS_ERROR_INVALID_PACKET_FORMAT; one log line; destroy and shut_down complete."""
    with running_node(tmp_path / "node", mi210_config()) as node:
        r = subprocess.run([c_program("rocr_client"), "bad"], env=client_env(node.mount),
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr[-3000:] + node.log_text()[-3000:]
        by = steps(r.stdout)
        (b,) = by["bad_packet"]
        assert int(b["status"], 16) == HSA_STATUS_ERROR_INVALID_PACKET_FORMAT
        assert "queue_destroy" in by and "shut_down" in by
        errors = [line for line in node.log_text().splitlines() if "packet type 23" in line]
        assert len(errors) == 1, node.log_text()[-2000:]


@pytest.mark.skipif(not Path("/usr/include/hip/hip_runtime_api.h").exists(),
                    reason="libamdhip64-dev (Debian's HIP 5.2.3) is not installed "
                           "(make apt installs it)")
def test_hip_memcpy_stops_visibly_at_rocclrs_blit_kernel(tmp_path: Path):
    """Debian's HIP 5.2.3 (tests/c/rocr_hip.c): hipGetDeviceCount, hipSetDevice and hipMalloc
    work; hipMemcpy host->device is where it stops: ROCclr copies pageable memory with its
    blit kernel, a KERNEL_DISPATCH on its own AQL queue, which the emulated GPU cannot run.
    The queue error reaches ROCclr (HSA_STATUS_ERROR_INVALID_CODE_OBJECT), which aborts the
    process, visibly and at once: no hang, one log line naming the kernel object, the daemon
    serving on. (The README's "What the engines run" names this call.)"""
    with running_node(tmp_path / "node", mi210_config()) as node:
        r = subprocess.run([c_program("rocr_hip")], env=client_env(node.mount),
                           capture_output=True, text=True, timeout=120)
        out = r.stdout + r.stderr
        for call in ("hipGetDeviceCount", "hipSetDevice", "hipMalloc"):
            assert f"ok {call}(" in r.stdout, out
        assert "ok hipMemcpy(" not in r.stdout, out
        assert r.returncode != 0, out
        assert "HSA_STATUS_ERROR_INVALID_CODE_OBJECT" in r.stderr, out
        dispatch = [line for line in node.log_text().splitlines()
                    if "KERNEL_DISPATCH of kernel object" in line]
        assert len(dispatch) == 1, node.log_text()[-2000:]
        assert node.proc.poll() is None
