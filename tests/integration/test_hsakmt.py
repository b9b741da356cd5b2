"""Debian's libhsakmt 5.2.3, unmodified (tests/c/hsakmt_client.c), through the shim against a
real node (issue 14, "Acceptance with the real thing"; spec userspace-surface §3.3):
hsaKmtOpenKFD, the version, the topology snapshot (a CPU node and a GPU node per accel with
the DRM identity), node and memory properties, VRAM and system memory allocated, mapped to
the GPU, stored to and loaded back by the emulated GPU (the system memory's CPU pointer sees
the GPU's store), unmapped, freed; a signal event set and waited for (its events page a
KFD allocation); closed; and the node left holding nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from nodes import NEEDS_HSAKMT, SHIM, c_program, running_node

from ualinkd import sysfs
from ualinkd.config import PodConfig

pytestmark = [
    pytest.mark.integration,
    NEEDS_HSAKMT,
]


def steps(stdout: str) -> list[tuple[str, str, dict[str, str]]]:
    out = []
    for line in stdout.splitlines():
        status, step, *rest = line.split(" ")
        out.append((status, step, dict(w.split("=", 1) for w in rest if "=" in w)))
    return out


def test_libhsakmt_opens_allocates_maps_and_frees(tmp_path: Path):
    config = PodConfig.local(1, 2)
    with running_node(tmp_path, config) as node:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LD_", "HSA"))}
        env.update(LD_PRELOAD=str(SHIM), UALINK_DRI_DIR=str(node.mount / "dri"))
        r = subprocess.run([c_program("hsakmt_client")], env=env, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr + node.log_text()
        got = steps(r.stdout)
        assert all(s == "ok" for s, _, _ in got if s != "info"), r.stdout
        # the MMIO remap page's CPU mapping (mmap of the kfd fd) now succeeds
        assert "Failed to map remapped mmio page" not in r.stdout + r.stderr
        by = {}
        for _, step, f in got:
            by.setdefault(step, []).append(f)
        assert by["get_version"] == [{"major": "1", "minor": "17"}]
        assert by["system_properties"] == [{"nodes": "3"}]
        nodes = {int(f["node"]): f for f in by["node_properties"]}
        assert nodes[0]["simds"] == "0" and int(nodes[0]["cpu_cores"]) >= 1
        vram = config.accel_memory(config.nodes[0].accels[0])[0]
        for n, minor in ((1, 128), (2, 129)):
            f = nodes[n]
            assert f["render_minor"] == str(minor)
            assert f["device_id"] == str(0x74A1) and f["simds"] == "1216"
            assert f["gfx"] == "9.4.2"
            assert int(f["location_id"]) == sysfs.pci_bus(minor) << 8
            banks = [b for b in by["memory_properties"] if b["node"] == str(n)]
            assert {"heap": "1", "size": str(vram)} in [
                {"heap": b["heap"], "size": b["size"]} for b in banks]
        for step in ("alloc_vram", "map_vram", "gpu_store_load_vram", "alloc_system",
                     "map_system", "gpu_store_load_system", "free", "create_event",
                     "wait_event", "close_kfd"):
            assert step in by, r.stdout
        # A queue whose ring and pointers are plain malloc'd memory the GPU VM does not
        # map: refused (EINVAL, kfd_queue_acquire_buffers), which libhsakmt 5.2.3 reports
        # as HSAKMT_STATUS_ERROR for any failed CREATE_QUEUE; what it allocated for the
        # queue first (EOP buffer, CWSR area) is freed again. (Queues that run:
        # test_hsakmt_queues.py.)
        (q,) = by["create_queue"]
        assert q["status"] == "1", q  # HSAKMT_STATUS_ERROR
        assert int(q["gem_before"]) >= 0 and q["gem_before"] == q["gem_after"], q
        assert "AMDKFD_CREATE_QUEUE (nr 0x02) is not emulated" not in node.log_text()
        # Everything freed: no GEM object left on either GPU (the debugfs tables).
        for minor in (128, 129):
            assert node.debug(minor, "gem_objects").strip() == "", node.debug(minor,
                                                                              "gem_objects")



def run_rocminfo(node, **extra_env: str) -> str:
    """Debian's rocminfo through the shim against `node`, nothing else faked: its
    `lsmod | grep amdgpu` runs the real kmod lsmod, which reads /proc/modules and
    /sys/module/amdgpu through the shim it inherits (this container has no /proc/modules at
    all). Its output (stdout, then stderr), once it exited 0."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LD_", "HSA"))}
    env.update(LD_PRELOAD=str(SHIM), UALINK_DRI_DIR=str(node.mount / "dri"), **extra_env)
    r = subprocess.run(["rocminfo"], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr + node.log_text()
    assert "ROCk module is loaded" in r.stdout
    return r.stdout + r.stderr


def agent_field(stdout: str, name: str) -> list[str]:
    """The values of one `Name: value` field of rocminfo's agents, in order."""
    return [line.split(":", 1)[1].strip() for line in stdout.splitlines()
            if line.strip().startswith(f"{name}:")]


@pytest.mark.skipif(shutil.which("rocminfo") is None, reason="rocminfo is not installed")
def test_rocminfo_recognizes_an_mi210_without_override(tmp_path: Path):
    """With the gfx90a (MI210) profile, ROCr 5.2.3 knows the GPU: rocminfo lists it as a
    GPU agent named gfx90a with its 104 CUs, no HSA_OVERRIDE_GFX_VERSION set and nothing
    faked (issue 32, item 1: the shim answers rocminfo's lsmod)."""
    import dataclasses

    from ualinkd.config import AccelConfig
    base = PodConfig.local(1, 1)
    node_cfg = dataclasses.replace(base.nodes[0], accels=(AccelConfig(0, profile="mi210"),))
    config = dataclasses.replace(base, nodes=(node_cfg,))
    with running_node(tmp_path / "node", config) as node:
        out = run_rocminfo(node)
        assert agent_field(out, "Device Type") == ["CPU", "GPU"], out
        assert "amdgcn-amd-amdhsa--gfx90a" in out
        assert "unrecognized id" not in out
        assert agent_field(out, "Compute Unit")[-1] == "104", out


@pytest.mark.skipif(shutil.which("rocminfo") is None, reason="rocminfo is not installed")
def test_rocminfo_lists_the_accel_as_a_gpu_agent(tmp_path: Path):
    """Debian's rocminfo 5.2.3 (ROCr 5.2.3 over libhsakmt) through the shim lists the CPU
    and the accel as a GPU agent. ROCr 5.2.3 drops a gfx942 node as "unrecognized id", so
    HSA_OVERRIDE_GFX_VERSION=9.0.10 presents it as gfx90a, as a user of an old ROCr on MI300
    would; rocminfo's `lsmod | grep amdgpu` is answered by the shim (nothing on PATH)."""
    with running_node(tmp_path / "node", PodConfig.local(1, 1)) as node:
        out = run_rocminfo(node, HSA_OVERRIDE_GFX_VERSION="9.0.10")
        assert agent_field(out, "Device Type") == ["CPU", "GPU"], out
        assert "amdgcn-amd-amdhsa--gfx90a" in out


ROCR_QUEUE = r"""
import ctypes
hsa = ctypes.CDLL("libhsa-runtime64.so.1")
class Agent(ctypes.Structure):
    _fields_ = [("handle", ctypes.c_uint64)]
assert hsa.hsa_init() == 0
gpus = []
def cb(agent, data):
    dev = ctypes.c_uint32(99)
    hsa.hsa_agent_get_info(agent, 17, ctypes.byref(dev))  # HSA_AGENT_INFO_DEVICE
    if dev.value == 1:  # HSA_DEVICE_TYPE_GPU
        gpus.append(Agent(agent.handle))
    return 0
cbf = ctypes.CFUNCTYPE(ctypes.c_int, Agent, ctypes.c_void_p)(cb)
assert hsa.hsa_iterate_agents(cbf, None) == 0
hsa.hsa_queue_create.argtypes = [Agent, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_void_p,
                                 ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint32,
                                 ctypes.POINTER(ctypes.c_void_p)]
q = ctypes.c_void_p()
status = hsa.hsa_queue_create(gpus[0], 1024, 0, None, None, 0xFFFFFFFF, 0xFFFFFFFF,
                              ctypes.byref(q))
hsa.hsa_queue_destroy.argtypes = [ctypes.c_void_p]
destroyed = hsa.hsa_queue_destroy(q) if status == 0 else -1
print(len(gpus), hex(status), hex(destroyed), hex(hsa.hsa_shut_down()))
"""


@pytest.mark.skipif(not Path("/usr/lib/x86_64-linux-gnu/libhsa-runtime64.so.1").exists(),
                    reason="Debian's ROCr (libhsa-runtime64-1) is not installed")
def test_rocr_queue_create_and_destroy(tmp_path: Path):
    """What a runtime that needs a queue sees: Debian's ROCr 5.2.3 (ctypes, through the
    shim) comes up and finds the MI210 GPU agent; hsa_queue_create makes its AQL queue
    (CREATE_QUEUE answers, issue 30 item 1; before, EPERM made it OUT_OF_RESOURCES),
    hsa_queue_destroy and hsa_shut_down succeed, and the node holds no queue after."""
    import dataclasses
    import sys

    from ualinkd.config import AccelConfig
    base = PodConfig.local(1, 1)
    node_cfg = dataclasses.replace(base.nodes[0], accels=(AccelConfig(0, profile="mi210"),))
    config = dataclasses.replace(base, nodes=(node_cfg,))
    with running_node(tmp_path / "node", config) as node:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LD_", "HSA"))}
        env.update(LD_PRELOAD=str(SHIM), UALINK_DRI_DIR=str(node.mount / "dri"))
        r = subprocess.run([sys.executable, "-c", ROCR_QUEUE], env=env, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr + node.log_text()
        assert r.stdout.split() == ["1", "0x0", "0x0", "0x0"], r.stdout + r.stderr
        assert node.debug(128, "kfd_queues").strip() == "", node.debug(128, "kfd_queues")


@pytest.mark.skipif(shutil.which("rocminfo") is None, reason="rocminfo is not installed")
def test_rocminfo_one_flag_away(tmp_path: Path):
    """Issue 32, items 1-3 as a user types them: `ualinkd pod --profile mi210`, then
    `ualinkd run ROOT/node0 -- rocminfo` (no LD_PRELOAD, no UALINK_DRI_DIR, no PATH trick,
    no HSA override): rocminfo finds the ROCk module loaded and lists the gfx90a GPU."""
    import signal
    import sys
    import time

    root = tmp_path / "pod"
    out = tmp_path / "pod.out"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LD_", "HSA", "UALINK"))}
    with open(out, "w") as f:
        pod = subprocess.Popen([sys.executable, "-m", "ualinkd", "pod", "--nodes", "1",
                                "--profile", "mi210", "--root", str(root)], stdout=f,
                               stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + 60
        while " ready: " not in out.read_text():
            assert pod.poll() is None and time.monotonic() < deadline, out.read_text()
            time.sleep(0.05)
        r = subprocess.run([sys.executable, "-m", "ualinkd", "run", str(root / "node0"), "--",
                            "rocminfo"], env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr
        assert "ROCk module is loaded" in r.stdout
        assert agent_field(r.stdout, "Device Type") == ["CPU", "GPU"], r.stdout
        assert "amdgcn-amd-amdhsa--gfx90a" in r.stdout
        pod.send_signal(signal.SIGTERM)
        assert pod.wait(30) == 0
    finally:
        if pod.poll() is None:
            pod.kill()
            pod.wait()
        subprocess.run(["umount", "-l", str(root / "node0")], capture_output=True)
