"""Unmodified libdrm / libdrm_amdgpu programs (tests/c/libdrm_*.c, Debian's libdrm 2.4.114)
against real nodes through libualink_shim.so, and inside a namespace node (issue 9, "Tests
that must exist"; spec userspace-surface §2.2, §3.3, §7).

The programs print `ok <step> k=v ...` lines and stop at the first `fail`; every test here
asserts a zero exit first, so a missing daemon feature (sysfs, AMDGPU_INFO, syncobj fds)
fails loudly at the step that needs it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from nodes import SHIM, c_program, running_node, running_pod

from ualinkd.amdgpu import vm
from ualinkd.config import PodConfig

pytestmark = pytest.mark.integration

BO_SIZE = 2 << 20
DRM_NODE_RENDER = 2
DRM_BUS_PCI = 0
AMDGPU_FAMILY_AI = 141
ALL_NODES = (1 << 0) | (1 << 2)  # DRM_NODE_PRIMARY | DRM_NODE_RENDER


def parse(stdout: str) -> dict[str, dict[str, str]]:
    """`ok <step> k=v ...` lines → {step: {"status": ..., k: v}}; a repeated step keeps a list
    of its lines under "all"."""
    out: dict[str, dict[str, str]] = {}
    for line in stdout.splitlines():
        status, step, *rest = line.split(" ")
        fields = {"status": status}
        for word in rest:
            if "=" in word:
                k, _, v = word.partition("=")
                fields[k] = v
        if step in out:
            out[step].setdefault("all", [dict(out[step])])  # type: ignore[arg-type]
            out[step]["all"].append(fields)  # type: ignore[attr-defined]
        else:
            out[step] = fields
    return out


def run_shimmed(prog: str, mount: Path, *args: str,
                **kw: object) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("LD_PRELOAD", "UALINK_DRI_DIR", "UALINK_DMABUF_DIR")}
    env.update(LD_PRELOAD=str(SHIM), UALINK_DRI_DIR=str(mount / "dri"))
    return subprocess.run([c_program(prog), *args], env=env, capture_output=True, text=True,
                          timeout=60, **kw)  # type: ignore[call-overload]


@contextlib.contextmanager
def libdrm_exporter(
        mount: Path) -> Iterator[tuple[subprocess.Popen[str], dict[str, dict[str, str]]]]:
    """`libdrm_fabric export` through the shim on the node at `mount`, once it has exported
    its BO: (the process, its first two steps: `export` lo/hi and `gpu_store` text). A
    newline or EOF on its stdin ends it; killed on the way out if it has not ended."""
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env.update(LD_PRELOAD=str(SHIM), UALINK_DRI_DIR=str(mount / "dri"))
    exporter = subprocess.Popen([c_program("libdrm_fabric"), "export"], env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    try:
        assert exporter.stdout is not None and exporter.stderr is not None
        lines = exporter.stdout.readline() + exporter.stdout.readline()
        head = parse(lines)
        assert "export" in head, lines + exporter.stderr.read()
        yield exporter, head
    finally:
        if exporter.poll() is None:
            exporter.kill()
            exporter.wait()


def passed(r: subprocess.CompletedProcess[str]) -> dict[str, dict[str, str]]:
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}{r.stderr}"
    s = parse(r.stdout)
    assert "done" in s and all(v["status"] == "ok" for v in s.values()), r.stdout
    return s


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    c_program("libualink_shim.so")
    with running_node(tmp_path_factory.mktemp("libdrm")) as n:
        yield n


def check_discovery(s: dict[str, dict[str, str]], accels: int) -> None:
    # drmGetNodeTypeFromFd: the fd is a render node (fstat S_IFCHR 226:128, sysfs drm/)
    assert s["node_type"]["type"] == str(DRM_NODE_RENDER)
    # drmGetDeviceNameFromFd2 (uevent DEVNAME), drmGetPrimary/RenderDeviceNameFromFd
    # (device/drm's card0 / renderD128)
    assert s["device_name"]["name"] == "/dev/dri/renderD128"
    assert s["primary_name"]["name"] == "/dev/dri/card0"
    assert s["render_name"]["name"] == "/dev/dri/renderD128"
    # drmGetDevice2 with DRM_DEVICE_GET_PCI_REVISION: the MI300X profile's PCI identity,
    # both minors of the accel; without the flag libdrm reports revision 0xff
    dev = s["get_device"]
    assert dev["bustype"] == str(DRM_BUS_PCI)
    assert dev["pci"] == "0000:10:00.0"
    assert (dev["vendor"], dev["device"], dev["revision"]) == ("1002", "74a1", "00")
    assert int(dev["available"], 16) == ALL_NODES
    assert (dev["primary"], dev["render"]) == ("/dev/dri/card0", "/dev/dri/renderD128")
    assert s["get_device_norev"]["revision"] == "ff"
    assert s["devices_equal"]["same"] == "1"
    # drmGetDevices2: one device per accel (each its own PCI address), not one per minor
    assert s["get_devices_count"]["count"] == str(accels)
    listed = s["get_devices"].get("all", [s["get_devices"]])
    assert sorted(d["pci"] for d in listed) == [f"0000:{0x10 + i:02x}:00.0"  # type: ignore[index]
                                                for i in range(accels)]
    assert s["version"]["name"] == "amdgpu" and s["version"]["major"] == "3"
    # amdgpu_device_initialize: DRM 3.x, and twice on one node is one device handle
    assert s["init"]["major"] == "3" and s["init"]["fd_valid"] == "1"
    assert s["init_twice"]["same"] == "1"


def check_queries(s: dict[str, dict[str, str]], vram_size: int) -> None:
    info = s["query_gpu_info"]
    assert int(info["family"]) == AMDGPU_FAMILY_AI
    assert int(info["asic_id"], 16) == 0x74A1
    assert int(s["accel_working"]["value"]) != 0
    # DEV_INFO's VA limits are the GPU VM's (amdgpu/vm.py, spec §2.2 table)
    di = s["dev_info"]
    assert int(di["device_id"], 16) == 0x74A1 and int(di["family"]) == AMDGPU_FAMILY_AI
    assert int(di["va_offset"], 16) == vm.VA_RESERVED_BOTTOM
    assert int(di["va_max"], 16) == vm.GMC_HOLE_START
    assert int(di["high_va_offset"], 16) == vm.GMC_HOLE_END
    assert int(di["high_va_max"], 16) == vm.GMC_HOLE_END | (vm.VM_SIZE - vm.VA_RESERVED_TOP)
    assert int(di["va_alignment"]) == 4096
    # amdgpu_query_heap_info is VRAM_GTT's vram_size: the accel's capacity less what the
    # kernel keeps (pins, AMDGPU_VM_RESERVED_VRAM), as MEMORY's usable size; MEMORY's total
    # is the capacity itself
    usable = int(s["vram_gtt"]["vram"])
    assert 0 < usable <= vram_size
    assert int(s["heap_vram"]["size"]) == usable == int(s["memory"]["vram_usable"])
    assert int(s["heap_vram"]["usage"]) <= usable
    assert int(s["memory"]["vram_total"]) == vram_size
    assert s["timestamp"]["nonzero"] == "1"
    # the kernel's rules: unknown query and return_size 0 are EINVAL
    assert s["unknown_query"]["ret"] == str(-errno.EINVAL)
    assert s["zero_size"]["ret"] == str(-errno.EINVAL)


def test_discovery_and_queries(node):
    """drmGetDevice2/drmGetDevices2/node type/the three names/PCI ids and revision,
    amdgpu_device_initialize twice, amdgpu_query_gpu_info, heap info and every
    AMDGPU_INFO query of the 2.4.114 API (spec §2.2)."""
    s = passed(run_shimmed("libdrm_discovery", node.mount))
    check_discovery(s, accels=1)
    # drmGetCap (drm_getcap): SYNCOBJ_TIMELINE, and the KMS half amdgpu keeps headless
    assert (s["cap_timeline"]["value"], s["cap_dumb"]["value"], s["cap_cursor"]["value"]) == (
        "1", "1", "64")
    assert s["cap_unknown"]["ret"] == str(-errno.EINVAL)
    cfg = PodConfig.local(1, 1)
    check_queries(s, cfg.accel_memory(cfg.nodes[0].accels[0])[0])
    assert "init_other" not in s


def test_two_accels_are_two_devices(tmp_path_factory):
    """amdgpu_device_initialize once per accel of a 2-accel node: distinct handles (each
    accel has its own card<n>, so fd_compare tells them apart; spec §2.2 step 2)."""
    with running_node(tmp_path_factory.mktemp("libdrm2"), PodConfig.local(1, 2)) as n:
        s = passed(run_shimmed("libdrm_discovery", n.mount))
    check_discovery(s, accels=2)
    assert s["init_other"]["node"] == "/dev/dri/renderD129"
    assert s["init_other"]["distinct"] == "1"


def test_buffer_objects_and_syncobjs(node):
    """amdgpu_bo_alloc, export kms/dma-buf, import, VA map/unmap, wait_for_idle, a context's
    stable pstate, metadata, query_info,
    userptr, and the syncobj calls including their fds (SYNCOBJ_HANDLE_TO_FD tokens turned
    into real fds by the shim; issue 9 item 7)."""
    s = passed(run_shimmed("libdrm_bo", node.mount))
    assert int(s["export_kms"]["handle"]) > 0
    assert s["export_dmabuf"] == {"status": "ok", "cloexec": "1", "size": str(BO_SIZE)}
    assert s["import_dmabuf"] == {"status": "ok", "same": "1", "size": str(BO_SIZE)}
    assert s["gpu_store_load"]["status"] == "ok"
    assert s["va_unmap"]["load_errno"] == str(errno.EFAULT)
    assert s["wait_idle"]["busy"] == "0"  # amdgpu_gem_wait_idle_ioctl: no fence, idle
    # amdgpu_ctx_set_stable_pstate: PEAK held by the context, put back (NONE) when it went
    assert s["stable_pstate"] == {"status": "ok", "before": "0", "peak": "4",
                                  "after_free": "0"}
    q = s["query_info"]
    assert (q["size"], q["alignment"], q["heap"]) == (str(BO_SIZE), "4096", "4")
    assert (q["tiling"], q["meta_size"], q["meta0"], q["meta1"]) == (
        "0x1234", "8", "0xcafe", "0xf00d")
    assert s["userptr"]["cpu_sees"] == "1"
    # drm_syncobj_array_wait: no fence and no WAIT_FOR_SUBMIT is EINVAL
    assert s["syncobj_unsignaled"]["ret"] == str(-errno.EINVAL)
    assert s["syncobj_export"] == {"status": "ok", "fd_valid": "1", "cloexec": "1"}
    assert s["syncobj_import"] == {"status": "ok", "distinct": "1", "shared": "1"}
    assert s["sync_file_export"] == {"status": "ok", "fd_valid": "1", "cloexec": "1"}
    assert s["sync_file_import"]["signaled"] == "1"
    assert s["timeline"]["point"] == "3"
    assert s["transfer"]["point"] == "5"
    assert s["eventfd_signaled"]["read"] == "1"
    assert s["eventfd_later"] == {"status": "ok", "before": "0", "after": "1"}
    # amdgpu_bo_cpu_map: one memory for the CPU mapping and the GPU's loads and stores
    assert s["cpu_map"] == {"status": "ok", "gpu_before": "1", "cpu_to_gpu": "1",
                            "gpu_to_cpu": "1"}


def test_fabric_export_import_across_two_nodes(tmp_path):
    """libhsakmt's FABRIC flow with libdrm calls (spec §3.3 steps 6-8): UALink export on
    node 0, import on node 1 → a real dma-buf fd, amdgpu_bo_import, the 64-byte timeline
    GEM_VA with SYNCOBJ_TIMELINE_WAIT(WAIT_FOR_SUBMIT), a GPU load equal to the exporter's
    store, and amdgpu_bo_cpu_map of the import refused with EPERM."""
    c_program("libualink_shim.so")
    with running_pod(tmp_path, nodes=2) as (a, b):
        with libdrm_exporter(a.mount) as (exporter, head):
            text = head["gpu_store"]["text"]
            r = run_shimmed("libdrm_fabric", b.mount, "import", head["export"]["lo"],
                            head["export"]["hi"], text)
            s = passed(r)
            assert s["import"] == {"status": "ok", "fd_valid": "1", "cloexec": "1"}
            assert s["bo_import"]["size"] == str(BO_SIZE)
            assert s["load"]["equal"] == "1"
            assert s["cpu_map_import"]["ret"] == str(-errno.EPERM)
            out, err = exporter.communicate("", timeout=30)
            assert exporter.returncode == 0, out + err
            assert "ok done" in out
