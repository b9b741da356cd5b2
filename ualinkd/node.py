"""NodeCore: one node's GPUs wired together, as the FUSE file tree sees them (sans-IO).

It builds, per local accel, a DrmDevice with the amdgpu driver and a UALink manager, runs
the host-wide late init (state from the pod config, vPod activation), and implements
`fuse.backend.NodeBackend`. The edge injects resolving a caller's fd to one of our dma-buf
keys (/proc), reading and writing a caller's memory, and the syncobj wait primitive.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Awaitable, Callable

from .amdgpu.driver import AmdgpuDriver, CopyToUser
from .amdgpu.vm import RemoteFn, RemotePiece, gpu_load, gpu_store
from .config import PodConfig
from .drm.device import Caller, CopyFromUser, DrmDevice, IoctlResult, OpenProcessMemory
from .drm.errors import DrmError
from .drm.file import DrmFile
from .drm.gem import DmaBuf
from .drm.syncobj import SyncWaits
from .drm.tokens import DmaBufTokens
from .fuse.backend import IoctlReply, SysAttr, SysDir
from .trace import TraceRecord
from .ualink.host import UalinkHost
from .ualink.manager import UalinkManager
from .ualink.state import AddrMode
from .ualink.sysconfig import SysConfig

log = logging.getLogger(__name__)

RENDER_MINOR_BASE = 128
FdResolver = Callable[[int, int], int]  # (pid, fd) -> dma-buf key; raises EBADF/EINVAL
# (importing accel id, piece, write, data to store | None) -> loaded bytes | count stored.
RemoteAccess = Callable[[int, RemotePiece, bool, "bytes | None"], Awaitable["bytes | int"]]


def pci_bdf(minor: int) -> str:
    """The made-up PCI address of the GPU behind render node `minor`: one bus per GPU from
    0x10 up (0000:10:00.0 for renderD128), stable across runs so scripts may name it."""
    return f"0000:{0x10 + minor - RENDER_MINOR_BASE:02x}:00.0"


def _no_resolver(pid: int, fd: int) -> int:
    raise DrmError(errno.EBADF)


async def _no_fabric(
    accel_id: int, piece: RemotePiece, write: bool, data: bytes | None = None
) -> bytes | int:
    raise DrmError(errno.EFAULT, f"accel {piece.exporter_accel} is unreachable (no fabric)")


class NodeCore:
    def __init__(
        self,
        config: PodConfig,
        node_name: str,
        resolve_fd: FdResolver = _no_resolver,
        copy_to_user: CopyToUser | None = None,
        tracer: Callable[[TraceRecord], None] | None = None,
        randbits: Callable[[int], int] | None = None,
        copy_from_user: CopyFromUser | None = None,
        waits: SyncWaits | None = None,
        open_process_memory: OpenProcessMemory | None = None,
    ) -> None:
        self.config = config
        self.node = config.node(node_name)
        self.name = node_name
        self.tracer = tracer
        self.tokens = DmaBufTokens(randbits) if randbits else DmaBufTokens()
        self._resolve_key = resolve_fd
        self.host = UalinkHost()
        self.devices: dict[int, DrmDevice] = {}
        self.managers: dict[int, UalinkManager] = {}
        for i, accel in enumerate(self.node.accels):
            minor = RENDER_MINOR_BASE + i
            device = DrmDevice(minor, self.tokens, self._resolve_dmabuf, copy_from_user,
                               copy_to_user, waits)
            device.open_process_memory = open_process_memory
            driver = AmdgpuDriver(device, *config.accel_memory(accel), copy_to_user)
            kwargs = {"randbits": randbits} if randbits else {}
            mgr = UalinkManager(
                self.host, driver, config.ppod_info(accel), config.vpod_info(accel.accel_id),
                accel.stage, config.kernel_quirks, npa_limit_pages=accel.npa_pages, **kwargs,
            )
            self.host.managers.append(mgr)
            self.devices[minor] = device
            self.managers[minor] = mgr
        self.host.late_init()
        # Called after every request that may have queued UALink effects (a GEM_CLOSE can
        # start a revoke); the fabric agent replaces it to carry them out.
        self.after_request: Callable[[], None] = self._discard_effects
        # One line per peer node, "<name> up|down"; the daemon plugs in its fabric link.
        self.fabric_status: Callable[[], str] = lambda: ""
        # GPU loads/stores of imported NPA BOs (policy 10). The fabric agent replaces it.
        # Contract: `remote_access(accel_id, piece, write, data)` with accel_id the importing
        # accel; returns the bytes loaded / the count stored, short when the exporter faults
        # part-way, and raises DrmError(EFAULT) when not even the first byte could be done
        # (no PTE at the exporter, exporter unreachable: policy 3).
        self.remote_access: RemoteAccess = _no_fabric

    def _discard_effects(self) -> None:
        for mgr in self.managers.values():
            for eff in mgr.take_effects():
                log.debug("no fabric: dropping %s", eff)

    def manager_by_accel(self, accel_id: int) -> UalinkManager | None:
        return self.host.by_accel_id(accel_id)

    def _resolve_dmabuf(self, pid: int, fd: int) -> DmaBuf:
        return self.tokens.resolve(self._resolve_key(pid, fd))

    # -- NodeBackend: render nodes ----------------------------------------------------------
    def render_minors(self) -> list[int]:
        return list(self.devices)

    def open_render(self, minor: int, caller: Caller) -> DrmFile:
        device = self.devices.get(minor)
        if device is None:
            raise DrmError(errno.ENODEV)
        return device.open(caller.pid, caller.uid)

    def release_render(self, drm_file: object) -> None:
        assert isinstance(drm_file, DrmFile)
        drm_file.release()
        self.after_request()

    def ioctl(
        self, drm_file: object, cmd: int, in_bytes: bytes, out_size: int, caller: Caller
    ) -> IoctlReply | Awaitable[IoctlReply]:
        assert isinstance(drm_file, DrmFile)
        res = drm_file.device.ioctl(drm_file, cmd, in_bytes, caller)
        self.after_request()
        if not isinstance(res, IoctlResult):
            return self._ioctl_later(res, drm_file, cmd, in_bytes, caller)
        return self._reply(res, drm_file, cmd, in_bytes, caller)

    async def _ioctl_later(
        self, pending: Awaitable[IoctlResult], drm_file: DrmFile, cmd: int, in_bytes: bytes,
        caller: Caller,
    ) -> IoctlReply:
        res = await pending
        self.after_request()
        return self._reply(res, drm_file, cmd, in_bytes, caller)

    def _reply(
        self, res: IoctlResult, drm_file: DrmFile, cmd: int, in_bytes: bytes, caller: Caller
    ) -> IoctlReply:
        if self.tracer is not None:
            self.tracer(TraceRecord(caller.pid, self.name, drm_file.device.minor, cmd,
                                    res.spec, in_bytes, res.result, res.out))
        return res.result, res.out

    def gpu_read(
        self, drm_file: object, va: int, size: int, caller: Caller
    ) -> bytes | Awaitable[bytes | bytearray]:
        """A GPU load through the file's VM (policy 10): bytes at once when every piece is
        local memory, an awaitable when some are remote (the FUSE edge takes both)."""
        assert isinstance(drm_file, DrmFile)
        driver = drm_file.device.driver
        assert isinstance(driver, AmdgpuDriver)
        return gpu_load(driver.vm(drm_file), va, size, self._remote_for(drm_file),
                        driver.count_gpu_fault)

    def gpu_write(
        self, drm_file: object, va: int, data: bytes, caller: Caller
    ) -> int | Awaitable[int]:
        """A GPU store through the file's VM (policy 10); the count stored."""
        assert isinstance(drm_file, DrmFile)
        driver = drm_file.device.driver
        assert isinstance(driver, AmdgpuDriver)
        return gpu_store(driver.vm(drm_file), va, data, self._remote_for(drm_file),
                         driver.count_gpu_fault)

    def _remote_for(self, drm_file: DrmFile) -> RemoteFn:
        def remote(piece: RemotePiece, write: bool,
                   data: bytes | None) -> Awaitable[bytes | bytearray | int]:
            # The access is issued by the accel that holds the NPA BO (normally this file's).
            device = piece.bo.device if piece.bo is not None else drm_file.device
            accel_id = self.managers[device.minor].accel_id
            return self.remote_access(accel_id, piece, write, data)

        return remote

    # -- NodeBackend: dma-bufs ----------------------------------------------------------------
    def dmabuf_lookup(self, name: str, caller: Caller) -> tuple[int, int]:
        return self.tokens.lookup(name, caller.uid)

    def dmabuf_open(self, key: int, caller: Caller) -> object:
        return self.tokens.open(key, caller.uid)

    def dmabuf_size(self, key: int) -> int:
        return self.tokens.size(key)

    def dmabuf_release(self, dmabuf_ref: object) -> None:
        assert isinstance(dmabuf_ref, int)
        self.tokens.release(dmabuf_ref)
        self.after_request()

    def dmabuf_resolve(self, ino_or_key: int) -> object | None:
        return self.tokens.opened.get(ino_or_key)

    # -- NodeBackend: sys/ ----------------------------------------------------------------------
    def sys_tree(self) -> SysDir:
        """§7.1: each GPU's `ualink/` lives under its PCI device, which the card and render
        node links also reach; the three paths share one directory of attribute objects."""
        pci: SysDir = {}
        drm: SysDir = {}
        for minor, mgr in self.managers.items():
            ualink = ualink_sysfs(mgr)
            ualink.update(self._config_files(SysConfig(self.host, mgr)))
            device: SysDir = {"ualink": ualink}
            pci[pci_bdf(minor)] = device
            drm[f"card{minor - RENDER_MINOR_BASE}"] = {"device": device}
            drm[f"renderD{minor}"] = {"device": device}
        debug: SysDir = {str(minor): self._debugfs(minor) for minor in self.devices}
        fabric = SysAttr(lambda: self.fabric_status())
        return {"bus": {"pci": {"devices": pci}},
                "class": {"drm": drm},
                "kernel": {"debug": {"dri": debug, "ualink_fabric": fabric}}}

    def _debugfs(self, minor: int) -> SysDir:
        """debugfs lookalikes (read-only): what the device holds right now."""
        device, mgr = self.devices[minor], self.managers[minor]
        driver = device.driver
        assert isinstance(driver, AmdgpuDriver)

        def gem_objects() -> str:
            return "".join(
                f"{o.id} size={o.size} refcount={o.refcount} handle_count={o.handle_count}\n"
                for o in device.objects.values()
            )

        def exports() -> str:
            return "".join(
                f"{e.handle_lo:#018x} {e.handle_hi:#018x} bo={e.bo.id} size={e.bo.size} "
                f"pins={e.bo.pin_count} importers={','.join(map(str, sorted(e.importers)))}\n"
                for e in mgr.exports.values()
            )

        def write_drop(text: str) -> None:
            try:
                mgr.drop_msg_bitmap = int(text.strip() or "0", 16) & ((1 << 64) - 1)
            except ValueError:
                raise DrmError(errno.EINVAL, "ualink_drop_msg takes a hex bitmap") from None

        return {
            # Emulator policy 9: bit n drops the next message of type n (§5.12).
            "ualink_drop_msg": SysAttr(lambda: f"{mgr.drop_msg_bitmap:#x}\n", write_drop,
                                       0o600),
            "gem_objects": SysAttr(gem_objects),
            "gpu_faults": SysAttr(lambda: f"{driver.gpu_faults}\n"),
            "ualink_imports": SysAttr(lambda: "".join(
                f"{n.handle_lo:#018x} {n.handle_hi:#018x} exporter={n.exporter} "
                f"state={n.state.name} pages={n.size_pages}\n" for n in mgr.imports.values())),
            "ualink_peers": SysAttr(lambda: "".join(
                f"accel={c.remote} state={c.state.name} generation={c.generation}\n"
                for c in sorted(mgr.conns.values(), key=lambda c: c.remote))),
            "ualink_npa": SysAttr(lambda: f"used_pages={mgr.npa_import_pages} "
                                          f"mappings={len(mgr.npa_table)}\n"),
            "ualink_exports": SysAttr(exports),
            "clients": SysAttr(lambda: "".join(
                f"pid={f.pid} uid={f.uid} handles={len(f.handles)}\n" for f in device.files)),
        }

    def _config_files(self, cfg: SysConfig) -> SysDir:
        """setup/, config/, stations/ with their commit files (§7.1, policy 8)."""

        def rw(group: dict[str, object], name: str,
               write: Callable[[str, str], None]) -> SysAttr:
            def show() -> str:
                v = group[name]
                if isinstance(v, list):
                    return " ".join(map(str, v)) + "\n"
                if isinstance(v, AddrMode):
                    return v.sysfs + "\n"
                return f"{v}\n"

            return SysAttr(show, self._after(lambda text: write(name, text)), 0o600)

        def commit(fn: Callable[[str], None]) -> SysAttr:
            return SysAttr(lambda: "", self._after(fn), 0o200)

        return {
            "setup": {**{n: rw(cfg.setup, n, cfg.write_setup) for n in cfg.setup},
                      "commit": commit(cfg.commit_setup)},
            "config": {**{n: rw(cfg.config, n, cfg.write_config) for n in cfg.config},
                       "commit": commit(cfg.commit_config)},
            "stations": {**{n: rw(cfg.stations, n, cfg.write_stations) for n in cfg.stations},
                         "commit": commit(cfg.commit_stations)},
        }

    def _after(self, fn: Callable[[str], None]) -> Callable[[str], None]:
        def run(text: str) -> None:
            try:
                fn(text)
            finally:
                self.after_request()

        return run

    # -- introspection (tests, ualinkctl) ---------------------------------------------------------
    def live_objects(self) -> int:
        return sum(len(d.objects) for d in self.devices.values())


def ualink_sysfs(mgr: UalinkManager) -> SysDir:
    """The 12 read-only attribute files of spec §7.1, read live from the manager."""

    def attr(fn: Callable[[], object]) -> SysAttr:
        return SysAttr(lambda: f"{fn()}\n")

    return {
        "link_type": attr(lambda: "UALoE"),
        "accel_id": attr(lambda: mgr.ppod.accel_id),
        "bandwidth": attr(lambda: mgr.ppod.bandwidth),
        "latency": attr(lambda: mgr.ppod.latency),
        "ppod_id": attr(lambda: str(mgr.ppod.ppod_uuid).lower()),
        "ppod_size": attr(lambda: mgr.ppod.ppod_size),
        "vpod_id": attr(lambda: mgr.vpod.vpod_id),
        "vpod_size": attr(lambda: mgr.vpod.vpod_size),
        "vpod_active_accels": attr(lambda: " ".join(map(str, sorted(mgr.vpod.active_accels)))),
        "addr_mode": attr(lambda: mgr.vpod.addr_mode.sysfs),
        "accel_state": attr(lambda: mgr.state.sysfs),
        "local_accels": attr(lambda: " ".join(map(str, mgr.local_accels))),
    }
