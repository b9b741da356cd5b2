"""What the KFD topology says about a node (kfd_topology.c, kfd_crat.c), sans-IO: node 0 the
CPU, then one GPU node per local accel in accel order, each with the gpu_id the ioctls take.
`sysfs.kfd_topology_sysfs` lays it out as files; `chardev.Kfd` answers for the same gpu_ids.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from ..amdgpu.profile import DeviceProfile

KFD_GPU_ID_HASH_WIDTH = 16  # kfd_topology.c: gpu_ids are 16-bit hashes, never 0


@dataclass(frozen=True, slots=True)
class TopologyGpu:
    """A GPU node: the accel's identity as its render node and PCI device show it."""

    gpu_id: int
    render_minor: int
    pci_bus: int  # location_id = bus << 8 | devfn (devfn 0), domain 0
    profile: DeviceProfile
    vram_size: int


@dataclass(frozen=True, slots=True)
class Topology:
    cpu_cores: int
    system_memory: int  # bytes, the CPU node's memory bank
    gpus: tuple[TopologyGpu, ...]


def gpu_ids(identities: list[tuple[DeviceProfile, int]]) -> list[int]:
    """kfd_generate_gpu_id's contract: a 16-bit hash of the device's identity (PCI ids and
    location), unique within the node (a collision moves to the next free value), never 0.
    `identities` is (profile, location_id) per accel, in order; stable across runs."""
    out: list[int] = []
    mask = (1 << KFD_GPU_ID_HASH_WIDTH) - 1
    for p, location in identities:
        key = f"{p.pci_vendor}:{p.pci_device}:{p.subsystem_vendor}:{p.subsystem_device}:" \
              f"{location}:{p.num_xcc}".encode()
        gid = zlib.crc32(key) & mask
        while gid == 0 or gid in out:
            gid = (gid + 1) & mask
        out.append(gid)
    return out
