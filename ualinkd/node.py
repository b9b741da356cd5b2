"""NodeCore: one node's GPUs wired together, as the FUSE file tree sees them (sans-IO).

It builds, per local accel, a DrmDevice with the amdgpu driver and a UALink manager, runs
the host-wide late init (state from the pod config, vPod activation), and implements
`fuse.backend.NodeBackend`. What the edge provides (resolving a caller's fd to one of our
dma-buf keys, reading and writing a caller's memory, the waits and clocks, process identity
and exits, its own status) comes as one value, `NodeServices`, and the node is complete when
its constructor returns; only a fabric agent attaches later (`attach_fabric`), and
`ualinkd record` swaps the tracer.
"""

from __future__ import annotations

import errno
import functools
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from . import sysfs
from .abi.cpumap import UALINKD_IOCTL_MMAP_GRANT
from .abi.drmfile_query import NONCE, UALINKD_IOCTL_DRM_FILE_QUERY
from .amdgpu import translation
from .amdgpu.access import RemoteFn, gpu_load, gpu_store
from .amdgpu.cpu_map import CpuMapGrants
from .amdgpu.cs import IbRun
from .amdgpu.driver import AmdgpuDriver
from .amdgpu.profile import PROFILES
from .amdgpu.vm import RemotePiece, npa_byte_address
from .amdkfd.chardev import Clock, Kfd, KfdNode, KfdProcess, ResolveDrmFile
from .amdkfd.queues import KfdQueue
from .amdkfd.topology import Topology, TopologyGpu, gpu_ids
from .config import PodConfig
from .drm.completion import Completion, Spawn, run_now
from .drm.device import (
    Caller,
    CopyFromUser,
    CopyToUser,
    DrmDevice,
    IoctlResult,
    OpenProcessMemory,
)
from .drm.errors import DrmError
from .drm.file import DrmFile
from .drm.gem import DmaBuf
from .drm.loaded import Loaded, in_memory
from .drm.process import Identify, WatchExit, same_thread_group
from .drm.syncobj import EventFd, SyncWaits
from .drm.tokens import DmaBufTokens
from .fuse.backend import IoctlReply
from .sysfs import SysAttr, SysDir, pci_bdf  # noqa: F401 (pci_bdf: its old home)
from .trace import (
    EngineAccess,
    FdResolution,
    FileRecord,
    GpuAccessRecord,
    IbRecord,
    MemAccess,
    QueueRecord,
    Record,
    TraceRecord,
)
from .ualink.host import UalinkHost
from .ualink.manager import ImportWaiter, UalinkManager
from .ualink.sysconfig import SysConfig, field_names

log = logging.getLogger(__name__)

RENDER_MINOR_BASE = sysfs.RENDER_MINOR_BASE
FdResolver = Callable[[int, int], int]  # (pid, fd) -> dma-buf key; raises EBADF/EINVAL
# (importing accel id, piece, write, data to store | None) -> loaded bytes | count stored,
# by callback (fabric/agent.py's remote_access).
RemoteAccess = Callable[[int, RemotePiece, bool, "bytes | None"], "Completion[Loaded | int]"]


def _no_resolver(pid: int, fd: int) -> int:
    raise DrmError(errno.EBADF)


def _no_fabric(
    accel_id: int, piece: RemotePiece, write: bool, data: bytes | None = None
) -> Completion[Loaded | int]:
    c: Completion[Loaded | int] = Completion()
    c.set_error(DrmError(errno.EFAULT, f"accel {piece.exporter_accel} is unreachable "
                                       "(no fabric)"))
    return c


def _no_clock() -> tuple[int, int]:
    return (0, 0)


def _oops_unheard(caller: Caller) -> None:
    """A node with no edge cannot end a task (the daemon gives `kill_caller`)."""
    log.warning("an oops in pid %d's ioctl; no edge to end the task", caller.pid)


class DrmFileQueries:
    """ACQUIRE_VM's questions in flight (abi/drmfile_query.py): nonce -> the render file
    that answered (None until one does). Shared by the node, whose render files answer the
    question, and the edge that asks it of a caller's fd (daemon.resolve_drm_file)."""

    def __init__(self) -> None:
        self.pending: dict[int, DrmFile | None] = {}

    def answer(self, nonce: int, drm_file: DrmFile) -> bool:
        """A render file's answer: only to a pending nonce, and only once."""
        if nonce not in self.pending or self.pending[nonce] is not None:
            return False
        self.pending[nonce] = drm_file
        return True


@dataclass(frozen=True)
class NodeServices:
    """What the edge gives a node, as one value: the caller's memory and fds, the waits and
    clocks, process identity and exit notices, the host's size and the edge's own status
    (fabric links, data plane). The defaults are a node no caller can reach (tests)."""

    resolve_fd: FdResolver = _no_resolver  # a caller's fd -> one of our dma-buf keys
    copy_from_user: CopyFromUser | None = None
    copy_to_user: CopyToUser | None = None
    open_process_memory: OpenProcessMemory | None = None  # userptr BOs
    open_eventfd: Callable[[int, int], EventFd] | None = None  # SYNCOBJ_EVENTFD
    resolve_drm_file: ResolveDrmFile | None = None  # ACQUIRE_VM's fd -> our DrmFile
    drm_file_queries: DrmFileQueries = field(default_factory=DrmFileQueries)
    waits: SyncWaits | None = None
    clock: Clock = _no_clock  # the KFD's clock counters
    trace_clock: Callable[[], float] = time.time  # the trace's timestamps (strace -tt)
    tracer: Callable[[Record], None] | None = None  # the first one (`ualinkd record` swaps)
    randbits: Callable[[int], int] | None = None  # dma-buf tokens, UALink handles
    identify_process: Identify = same_thread_group
    watch_exit: WatchExit | None = None  # a KFD process's exit notice (a pidfd each)
    host_cpus: int = 1
    host_memory: int = 0
    # Peer node name -> its link's state (sys/kernel/debug/ualink_fabric, sysfs.show_fabric).
    fabric_links: Callable[[], dict[str, str]] = dict
    # The C data plane's counters (sys/kernel/debug/ualink_data_plane).
    data_plane_stats: Callable[[], dict[str, int]] = dict
    # What an oops in a caller's ioctl does to it (§13 N6's quirk: it ends the task).
    kill_caller: Callable[[Caller], None] = _oops_unheard
    # Runs the core's coroutines (an ioctl that awaits the caller's memory, a GPU access of a
    # userptr BO) to a Completion: the FUSE session's tasks; run_now with no edge.
    spawn: Spawn[Any] = run_now


class NodeCore:
    def __init__(self, config: PodConfig, node_name: str,
                 services: NodeServices | None = None) -> None:
        edge = services if services is not None else NodeServices()
        randbits = edge.randbits
        copy_from_user, copy_to_user, waits = edge.copy_from_user, edge.copy_to_user, edge.waits
        self.config = config
        self.node = config.node(node_name)
        self.name = node_name
        self._tracer = edge.tracer
        self.trace_clock = edge.trace_clock
        self.tokens = DmaBufTokens(randbits) if randbits else DmaBufTokens()
        self._resolve_key = edge.resolve_fd
        # What a recording needs beyond the ioctl's bytes (trace schema 2), kept only while
        # tracing: the id of each open file, and per calling thread the caller memory and
        # fds its ioctl in progress touched (a thread has one ioctl in flight at a time).
        self._file_ids: dict[int, int] = {}  # id(DrmFile | KfdProcess) or dma-buf key -> id
        self._next_file = 1
        self._token_of_key: dict[int, int] = {}
        self._mem: dict[int, list[MemAccess]] = {}
        self._fds: dict[int, list[FdResolution]] = {}
        if copy_from_user is not None:
            copy_from_user = self._recorded_copy_from(copy_from_user)
        if copy_to_user is not None:
            copy_to_user = self._recorded_copy_to(copy_to_user)
        self.host = UalinkHost()
        self.devices: dict[int, DrmDevice] = {}
        self.managers: dict[int, UalinkManager] = {}
        # The same devices' drivers, as this node made them (DrmDevice.driver is the DRM
        # core's view of any driver).
        self.drivers: dict[int, AmdgpuDriver] = {}
        for i, accel in enumerate(self.node.accels):
            minor = RENDER_MINOR_BASE + i
            device = DrmDevice(minor, self.tokens, self._resolve_dmabuf, copy_from_user,
                               copy_to_user, waits, edge.open_process_memory,
                               self._resolve_token, edge.open_eventfd, edge.spawn)
            # §13 N6: no UALink IP block, so no UALink info to reach (a quirk oopses)
            driver = AmdgpuDriver(
                device, *config.accel_memory(accel), PROFILES[accel.profile],
                ualink_ip=accel.ualink, oops=edge.kill_caller,
                oops_without_ualink="no-ualink-oops" in config.kernel_quirks)
            kwargs = {"randbits": randbits} if randbits else {}
            mgr = UalinkManager(
                self.host, driver, config.ppod_info(accel), config.vpod_info(accel.accel_id),
                accel.stage, config.kernel_quirks, npa_limit_pages=accel.npa_pages,
                response_timeout=config.response_timeout_ms / 1000, **kwargs,
            )
            self.host.managers.append(mgr)
            self.devices[minor] = device
            self.drivers[minor] = driver
            self.managers[minor] = mgr
        self.host.late_init()
        # The KFD (issue 14): a GPU node per accel over the same devices, and the topology
        # that names them by the same gpu_ids.
        profiles = [PROFILES[a.profile] for a in self.node.accels]
        ids = gpu_ids([(p, sysfs.pci_bus(m) << 8) for p, m in zip(profiles, self.devices,
                                                                    strict=True)])
        self.topology = Topology(edge.host_cpus, edge.host_memory, tuple(
            TopologyGpu(gid, m, sysfs.pci_bus(m), p, config.accel_memory(a)[0])
            for gid, m, p, a in zip(ids, self.devices, profiles, self.node.accels,
                                    strict=True)))
        self.drm_file_queries = edge.drm_file_queries
        self.kfd = Kfd([KfdNode(gid, d) for gid, d in zip(ids, self.drivers.values(),
                                                           strict=True)],
                       edge.clock, copy_to_user, edge.resolve_drm_file, copy_from_user,
                       waits, edge.identify_process, self._resolve_dmabuf, edge.spawn)
        self.spawn = edge.spawn
        # The edge's exit notices of the KFD's processes (a pidfd each): a process that
        # exits ends its KFD context, whoever still holds its files.
        self._watch_exit = edge.watch_exit
        self.kfd.queues.listeners.append(
            lambda q, created: self.trace_queue(q, "create" if created else "destroy"))
        # CPU mappings (amdgpu/cpu_map.py): the daemon's socket server sets `socket`.
        self.cpu_maps = CpuMapGrants(identify=edge.identify_process)
        # Called after every request that may have queued UALink effects (a GEM_CLOSE can
        # start a revoke); a fabric carries them out (`attach_fabric`).
        self.after_request: Callable[[], None] = self._discard_effects
        self.fabric_links = edge.fabric_links
        self.data_plane_stats = edge.data_plane_stats
        # GPU loads/stores of imported NPA BOs (policy 10); a fabric's (`attach_fabric`).
        # Contract: `remote_access(accel_id, piece, write, data)` with accel_id the importing
        # accel; returns the bytes loaded / the count stored, short when the exporter faults
        # part-way, and raises DrmError(EFAULT) when not even the first byte could be done
        # (no PTE at the exporter, exporter unreachable: policy 3).
        self.remote_access: RemoteAccess = _no_fabric

    def attach_fabric(self, drain: Callable[[], None], wait_import: ImportWaiter,
                      remote_access: RemoteAccess | None) -> None:
        """A fabric agent (fabric/agent.py) serves this node from now on: `drain` carries
        the managers' effects after each request, `wait_import` waits for their remote
        imports, `remote_access` (when it has a data plane) does GPU loads/stores of
        imported NPA BOs, by callback."""
        self.after_request = drain
        for mgr in self.managers.values():
            mgr.attach(wait_import)
        if remote_access is not None:
            self.remote_access = remote_access

    def _discard_effects(self) -> None:
        for mgr in self.managers.values():
            for eff in mgr.take_effects():
                log.debug("no fabric: dropping %s", eff)

    def manager_by_accel(self, accel_id: int) -> UalinkManager | None:
        return self.host.by_accel_id(accel_id)

    def _resolve_dmabuf(self, pid: int, fd: int) -> DmaBuf:
        return self.tokens.resolve(self._recorded_key(pid, fd))

    def _resolve_token(self, pid: int, fd: int) -> object:
        """Any token file behind the caller's fd (syncobj files, sync files)."""
        return self.tokens.resolve_any(self._recorded_key(pid, fd))

    # -- what a recording keeps (trace schema 2) ---------------------------------------------
    def _recorded_key(self, pid: int, fd: int) -> int:
        fds = self._fds.get(pid)
        if fds is None:
            return self._resolve_key(pid, fd)
        try:
            key = self._resolve_key(pid, fd)
        except DrmError as e:
            fds.append(FdResolution(fd, None, -e.errno))
            raise
        fds.append(FdResolution(fd, key))
        return key

    def _recorded_copy_from(self, copy: CopyFromUser) -> CopyFromUser:
        async def copy_from_user(pid: int, addr: int, size: int) -> bytes:
            mem = self._mem.get(pid)
            if mem is None:
                return await copy(pid, addr, size)
            try:
                data = await copy(pid, addr, size)
            except DrmError as e:
                mem.append(MemAccess("read", addr, size, b"", -e.errno))
                raise
            mem.append(MemAccess("read", addr, size, bytes(data)))
            return data

        return copy_from_user

    def _recorded_copy_to(self, copy: CopyToUser) -> CopyToUser:
        async def copy_to_user(pid: int, addr: int, data: bytes) -> None:
            mem = self._mem.get(pid)
            if mem is None:
                return await copy(pid, addr, data)
            try:
                await copy(pid, addr, data)
            except DrmError as e:
                mem.append(MemAccess("write", addr, len(data), bytes(data), -e.errno))
                raise
            mem.append(MemAccess("write", addr, len(data), bytes(data)))

        return copy_to_user

    def _begin_call(self, caller: Caller) -> None:
        if self._tracer is not None:
            self._mem[caller.pid] = []
            self._fds[caller.pid] = []

    def _end_call(self, caller: Caller) -> tuple[tuple[MemAccess, ...], tuple[FdResolution, ...]]:
        return (tuple(self._mem.pop(caller.pid, ())), tuple(self._fds.pop(caller.pid, ())))

    def _trace_open(self, obj: object, caller: Caller, path: str, minor: int | None = None,
                    token: int | None = None, key: int | None = None) -> None:
        if self._tracer is None:
            return
        file = self._next_file
        self._next_file += 1
        self._file_ids[key if key is not None else id(obj)] = file
        self._tracer(FileRecord("open", caller.pid, self.name, file, path, minor, token, key,
                               start=self.trace_clock()))

    def _trace_release(self, obj: object, path: str, key: int | None = None) -> None:
        file = self._file_ids.pop(key if key is not None else id(obj), None)
        if self._tracer is not None and file is not None:
            self._tracer(FileRecord("release", 0, self.name, file, path, key=key,
                                   start=self.trace_clock()))

    def file_id(self, obj: object) -> int | None:
        """The trace's id of an open render node or KFD file (None: opened untraced)."""
        return self._file_ids.get(id(obj))

    # -- NodeBackend: render nodes ----------------------------------------------------------
    def render_minors(self) -> list[int]:
        return list(self.devices)

    def primary_minors(self) -> list[int]:
        return [sysfs.card_index(m) for m in self.devices]

    def open_render(self, minor: int, caller: Caller) -> DrmFile:
        if minor < RENDER_MINOR_BASE:  # card<n>: the same device as renderD<128 + n>
            minor += RENDER_MINOR_BASE
        device = self.devices.get(minor)
        if device is None:
            raise DrmError(errno.ENODEV)
        drm_file = device.open(caller.pid, caller.uid)
        self._trace_open(drm_file, caller, f"dri/renderD{minor}", minor)
        return drm_file

    def release_render(self, drm_file: DrmFile) -> None:
        self._trace_release(drm_file, f"dri/renderD{drm_file.device.minor}")
        drm_file.release()
        self.after_request()

    def ioctl(
        self, drm_file: DrmFile, cmd: int, in_bytes: bytes, out_size: int, caller: Caller
    ) -> IoctlReply | Completion[IoctlReply]:
        if cmd == UALINKD_IOCTL_MMAP_GRANT:  # ualinkd's own, by its whole number (abi/cpumap.py)
            return self.cpu_maps.render_ioctl(drm_file, in_bytes, caller)
        start = self.trace_clock() if self._tracer is not None else 0.0
        if cmd == UALINKD_IOCTL_DRM_FILE_QUERY:
            return self._answer_drm_file_query(drm_file, in_bytes)
        if self._tracer is not None:
            self._begin_call(caller)
        res = drm_file.device.ioctl(drm_file, cmd, in_bytes, caller)
        self.after_request()
        if isinstance(res, Completion):
            return res.then(functools.partial(self._ioctl_ended, drm_file, cmd, in_bytes,
                                              caller, start))
        if self._tracer is None and not self._mem:  # nothing to record, nothing to forget
            return res.result, res.out
        return self._reply(res, drm_file, cmd, in_bytes, caller, start)

    def _ioctl_ended(self, drm_file: DrmFile, cmd: int, in_bytes: bytes, caller: Caller,
                     start: float, answered: Completion[IoctlResult]) -> IoctlReply:
        """The end of an ioctl answered later (a wait, the caller's memory, a remote
        import). An interrupted wait ends as an error (EINTR): what the call touched goes
        with it, or its thread's entry stays for good (a killed client's tid is never seen
        again) and every later ioctl takes the recording path."""
        try:
            res = answered.result()
        except Exception:
            self._end_call(caller)
            raise
        self.after_request()
        return self._reply(res, drm_file, cmd, in_bytes, caller, start)

    def _reply(
        self, res: IoctlResult, drm_file: DrmFile, cmd: int, in_bytes: bytes, caller: Caller,
        start: float,
    ) -> IoctlReply:
        mem, fds = self._end_call(caller)
        if self._tracer is not None:
            minor = drm_file.device.minor
            self._tracer(TraceRecord(caller.pid, self.name, minor, cmd, res.spec, in_bytes,
                                    res.result, res.out, self.managers[minor].accel_id, start,
                                    self.trace_clock() - start, self.file_id(drm_file), mem,
                                    fds))
        return res.result, res.out

    @property
    def tracer(self) -> Callable[[Record], None] | None:
        # (This file reads _tracer: every ioctl, lookup and open asks it, and a property
        # is a Python call each.)
        return self._tracer

    @tracer.setter
    def tracer(self, tracer: Callable[[Record], None] | None) -> None:
        """(`ualinkd record` attaches one at any time: the loads the data plane carries
        must come back through Python to be recorded.)"""
        self._tracer = tracer
        translation.changed()

    def gpu_read(
        self, drm_file: DrmFile, va: int, size: int, caller: Caller
    ) -> bytes | Completion[Loaded]:
        """A GPU load through the file's VM (policy 10): bytes at once when every piece is
        local memory, a Completion when some are remote or a process's (userptr)."""
        driver = self.drivers[drm_file.device.minor]
        spawn = self.spawn
        remote = self._remote_for(drm_file)
        load = self._traced_gpu(drm_file, "load", va, size, b"", caller,
                                lambda: gpu_load(driver.vm(drm_file), va, size, remote,
                                                 driver.count_gpu_fault, spawn))
        return load  # type: ignore[return-value]  # gpu_load's result, traced

    def gpu_read_route(self, drm_file: DrmFile, va: int, size: int,
                       write: bool = False) -> tuple[int, int, int, int, int] | None:
        """For the data plane (fuse/dataplane.c), after a load (`write`: a store) of
        [va, va + size) that one remote mapping answered: (VA start, VA end, NPA byte
        address at the start, issuing accel, exporting accel) of that mapping; None when
        Python must see its accesses (a tracer records them) or it is not one remote
        mapping (readable; for a store, writeable)."""
        driver = self.drivers[drm_file.device.minor]
        vm = driver.vm(drm_file)
        if self._tracer is not None or (hit := vm.remote_route(va, size, write)) is None:
            return None
        m, bo = hit
        assert bo.npa is not None  # (remote_route: an NPA BO)
        # Issued by the accel that holds the NPA BO, as _remote_for's pieces are.
        return (m.start, m.end, npa_byte_address(bo.npa, m.offset),
                self.managers[bo.device.minor].accel_id, bo.npa[0])

    def gpu_read_expired(self, drm_file: DrmFile) -> None:
        """A load the data plane carried was not answered in time: the fault gpu_load
        counts when a remote piece's LOAD expires on the link (access._short)."""
        driver = self.drivers[drm_file.device.minor]
        driver.count_gpu_fault()

    def gpu_write(
        self, drm_file: DrmFile, va: int, data: bytes, caller: Caller
    ) -> int | Completion[int]:
        """A GPU store through the file's VM (policy 10); the count stored."""
        driver = self.drivers[drm_file.device.minor]
        spawn = self.spawn
        remote = self._remote_for(drm_file)
        store = self._traced_gpu(drm_file, "store", va, len(data), data, caller,
                                 lambda: gpu_store(driver.vm(drm_file), va, data, remote,
                                                   driver.count_gpu_fault, spawn))
        return store  # type: ignore[return-value]  # gpu_store's result, traced

    def trace_queue(self, q: KfdQueue, event: str, value: int = 0, detail: str = "",
                    mem: tuple[EngineAccess, ...] = (), mem_truncated: bool = False,
                    fields: dict[str, object] | None = None) -> None:
        """A user queue's creation, destruction, doorbell, packet or error, to the tracer
        (a packet's or an error's: the memory touched for it, its decoded fields)."""
        if self._tracer is None:
            return
        minor = self.kfd.nodes[q.gpu_id].render_minor
        self._tracer(QueueRecord(q.pid, self.name, minor, self.managers[minor].accel_id,
                                q.queue_id, q.type_name, event, value, detail,
                                self.trace_clock(), mem, mem_truncated, fields))

    def trace_ib(self, drm_file: DrmFile, ib: IbRun, event: str, offset: int, detail: str,
                 mem: tuple[EngineAccess, ...] = (), mem_truncated: bool = False,
                 fields: dict[str, object] | None = None) -> None:
        """An AMDGPU_CS IB's packet executed (or the error that stopped it), to the tracer."""
        if self._tracer is None:
            return
        minor = drm_file.device.minor
        self._tracer(IbRecord(ib.pid, self.name, minor, self.managers[minor].accel_id,
                             self.file_id(drm_file), ib.ctx_id, ib.seq, ib.index, ib.va, event,
                             offset, detail, self.trace_clock(), mem, mem_truncated, fields))

    def _traced_gpu(self, drm_file: DrmFile, op: str, va: int, length: int, data: bytes,
                    caller: Caller, access: Callable[[], object]) -> object:
        """Run a GPU load/store; with a tracer, record its VA, length, result and fault
        (whether it finished at once or after remote pieces came back). The tracer is the
        one there when the access started, taken once: a recorder that attaches or leaves
        while remote pieces are in flight (`ualinkd record`, core.tracer) neither gets half
        an access nor changes its outcome."""
        tracer = self._tracer
        if tracer is None:
            return access()
        start = self.trace_clock()

        def record(result: object) -> None:
            minor = drm_file.device.minor
            if isinstance(result, DrmError):
                done, got = -result.errno, b""
            elif isinstance(result, int):
                done, got = result, bytes(data[:result])
            else:  # a load's bytes (in memory now if the fabric held them in a pipe)
                loaded = in_memory(result)  # type: ignore[arg-type]  # a load's result
                done, got = len(loaded), bytes(loaded)
            tracer(GpuAccessRecord(caller.pid, self.name, minor,
                                   self.managers[minor].accel_id, op, va, length, done, got,
                                   start, self.trace_clock() - start, self.file_id(drm_file)))

        try:
            res = access()
        except DrmError as e:
            record(e)
            raise
        if type(res) is Completion:
            def recorded(c: Completion[object]) -> object:
                try:
                    done = c.result()
                except DrmError as e:
                    record(e)
                    raise
                record(done)
                return done

            return res.then(recorded)
        record(res)
        return res

    def _remote_for(self, drm_file: DrmFile) -> RemoteFn:
        """The fabric's access function for `drm_file`'s remote pieces, answered by the
        fabric's Completion."""
        def remote(piece: RemotePiece, write: bool,
                   data: bytes | None) -> Completion[Loaded | int]:
            # The access is issued by the accel that holds the NPA BO (normally this file's).
            device = piece.bo.device if piece.bo is not None else drm_file.device
            return self.remote_access(self.managers[device.minor].accel_id, piece, write, data)

        return remote

    def _answer_drm_file_query(self, drm_file: DrmFile, in_bytes: bytes) -> IoctlReply:
        """The daemon's own question (abi/drmfile_query.py): only a pending nonce, answered
        once; anything else EINVAL, as a real DRM fd answers an unknown nr."""
        (nonce,) = NONCE.unpack(in_bytes[: NONCE.size].ljust(NONCE.size, b"\0"))
        if not self.drm_file_queries.answer(nonce, drm_file):
            return -errno.EINVAL, b""
        return 0, b""

    # -- NodeBackend: the KFD ---------------------------------------------------------------
    def open_kfd(self, caller: Caller) -> KfdProcess:
        process = self.kfd.open(caller)
        if process.exit is None and self._watch_exit is not None:  # a new context
            process.exit = self._watch_exit(process.id)
            process.exit.when_done(lambda done: self._kfd_process_exited(process, done))
        if process.ended:  # (its process exited before it could be watched)
            self.kfd.release(process)
            raise DrmError(errno.ESRCH, f"process {process.pid} has exited")
        self._trace_open(process, caller, "kfd")
        return process

    def _kfd_process_exited(self, process: KfdProcess, notice: Completion[None]) -> None:
        """A KFD process's exit notice (an error: the watch was cancelled, the context
        having ended first)."""
        try:
            notice.result()
        except Exception:
            return
        self.kfd.process_exited(process)
        self.after_request()  # what freeing its memory queued (a revoke) goes out now

    def release_kfd(self, process: KfdProcess) -> None:
        self._trace_release(process, "kfd")
        self.kfd.release(process)
        self.after_request()

    def kfd_ioctl(
        self, process: KfdProcess, cmd: int, in_bytes: bytes, out_size: int, caller: Caller
    ) -> IoctlReply | Completion[IoctlReply]:
        if cmd == UALINKD_IOCTL_MMAP_GRANT:  # mmap(kfd fd): kfd_mmap's memory (cpu_map.py)
            return self.cpu_maps.kfd_ioctl(
                lambda offset, length: self.kfd.mmap_target(caller, offset, length),
                in_bytes, caller)
        start = self.trace_clock() if self._tracer is not None else 0.0
        self._begin_call(caller)
        res = self.kfd.ioctl(process, cmd, in_bytes, caller)
        if isinstance(res, Completion):
            return res.then(functools.partial(self._kfd_ended, process, cmd, in_bytes,
                                              caller, start))
        return self._kfd_reply(res, process, cmd, in_bytes, caller, start)

    def _kfd_ended(self, process: KfdProcess, cmd: int, in_bytes: bytes, caller: Caller,
                   start: float, answered: Completion[IoctlResult]) -> IoctlReply:
        """A KFD ioctl answered later (`_ioctl_ended`'s rules)."""
        try:
            res = answered.result()
        except Exception:
            self._end_call(caller)
            raise
        return self._kfd_reply(res, process, cmd, in_bytes, caller, start)

    def _kfd_reply(self, res: IoctlResult, process: KfdProcess, cmd: int, in_bytes: bytes,
                   caller: Caller, start: float) -> IoctlReply:
        self.after_request()
        mem, fds = self._end_call(caller)
        if self._tracer is not None:
            self._tracer(TraceRecord(caller.pid, self.name, 0, cmd, res.spec, in_bytes,
                                    res.result, res.out, None, start,
                                    self.trace_clock() - start, self.file_id(process), mem,
                                    fds))
        return res.result, res.out

    # -- NodeBackend: dma-bufs ----------------------------------------------------------------
    def dmabuf_lookup(self, name: str, caller: Caller) -> tuple[int, int]:
        key, size = self.tokens.lookup(name, caller.uid)
        if self._tracer is not None:
            if len(self._token_of_key) >= 4096:  # looked up, never opened: keep it bounded
                self._token_of_key.clear()
            self._token_of_key[key] = int(name)
        return key, size

    def dmabuf_open(self, key: int, caller: Caller) -> int:
        ref = self.tokens.open(key, caller.uid)
        token = self._token_of_key.pop(key, None)
        self._trace_open(ref, caller, f"dmabuf/{token}", token=token, key=key)
        return ref

    def dmabuf_size(self, key: int) -> int:
        return self.tokens.size(key)

    def dmabuf_release(self, dmabuf_ref: int) -> None:
        self._trace_release(dmabuf_ref, "dmabuf", key=dmabuf_ref)
        self.tokens.release(dmabuf_ref)
        self.after_request()

    def dmabuf_ioctl(
        self, dmabuf_ref: int, cmd: int, in_bytes: bytes, out_size: int, caller: Caller
    ) -> IoctlReply:
        """An ioctl on an opened dma-buf file: only the CPU-mapping grant (a kernel dma-buf's
        own DMA_BUF_IOCTL_* are not emulated: ENOTTY, as before)."""
        if cmd != UALINKD_IOCTL_MMAP_GRANT:
            raise DrmError(errno.ENOTTY)
        return self.cpu_maps.dmabuf_ioctl(self.tokens.resolve(dmabuf_ref), in_bytes, caller)

    def dmabuf_resolve(self, ino_or_key: int) -> object | None:
        return self.tokens.opened.get(ino_or_key)

    # -- NodeBackend: sys/ ----------------------------------------------------------------------
    def sys_tree(self) -> SysDir:
        """The layout of `sysfs.py`: per GPU its PCI device directory (§7.1: `ualink/` is
        there) with its DRM minors, reached through the card, render node, bus and
        dev/char links; debugfs (root only) under kernel/debug."""
        root = SysDir({"class": SysDir({"drm": SysDir({
            "version": SysAttr(lambda: "drm 1.1.0 20060810\n")})})})  # drm_sysfs's class file
        for minor, mgr in self.managers.items():
            ualink = ualink_sysfs(mgr)
            ualink.update(self._config_files(SysConfig(self.host, mgr)))
            profile = PROFILES[self.node.accels[sysfs.card_index(minor)].profile]
            sysfs.merge(root, sysfs.gpu_sysfs(minor, profile, ualink))
        sysfs.merge(root, sysfs.kfd_topology_sysfs(self.topology))
        sysfs.merge(root, sysfs.module_sysfs(lambda: sum(
            len(d.files) for d in self.devices.values()) + len(self.kfd.processes)))
        debug = SysDir({str(minor): self._debugfs(minor) for minor in self.devices},
                       mode=sysfs.DEBUGFS_DIR_MODE)
        fabric = SysAttr(lambda: sysfs.show_fabric(self.fabric_links()), mode=sysfs.DEBUG_RO)
        grants = SysAttr(lambda: f"{self.cpu_maps.pending_count}\n", mode=sysfs.DEBUG_RO)
        data_plane = SysAttr(lambda: sysfs.show_data_plane(self.data_plane_stats()),
                             mode=sysfs.DEBUG_RO)
        root["kernel"] = SysDir({"debug": SysDir({"dri": debug, "ualink_fabric": fabric,
                                                 "ualink_data_plane": data_plane,
                                                 "cpu_map_grants": grants},
                                                 mode=sysfs.DEBUGFS_DIR_MODE)})
        return root

    def _debugfs(self, minor: int) -> SysDir:
        """debugfs lookalikes (root only, as debugfs is): what the device holds right now,
        one line per item in the formats of `sysfs.DEBUGFS`."""
        device, mgr, driver = self.devices[minor], self.managers[minor], self.drivers[minor]
        fmt = sysfs.DEBUGFS

        def table(name: str, rows: Callable[[], Iterable[dict[str, object]]]) -> SysAttr:
            return SysAttr(lambda: "".join(fmt[name].line(**r) for r in rows()),
                           mode=sysfs.DEBUG_RO)

        def write_drop(text: str) -> None:
            try:
                mgr.drop_msg_bitmap = sysfs.parse_drop_msg(text)
            except sysfs.ParseError as e:
                raise DrmError(errno.EINVAL, str(e)) from None

        return SysDir({
            # Emulator policy 9: bit n drops the next message of type n (§5.12).
            sysfs.DROP_MSG: SysAttr(lambda: sysfs.show_drop_msg(mgr.drop_msg_bitmap),
                                    write_drop, sysfs.DEBUG_RW),
            "gem_objects": table("gem_objects", lambda: (
                {"id": o.id, "size": o.size, "refcount": o.refcount,
                 "handle_count": o.handle_count} for o in device.objects.values())),
            "gpu_faults": SysAttr(lambda: f"{driver.gpu_faults}\n", mode=sysfs.DEBUG_RO),
            "ualink_imports": table("ualink_imports", lambda: (
                {"handle_lo": n.handle_lo, "handle_hi": n.handle_hi, "exporter": n.exporter,
                 "state": n.state.name, "pages": n.size_pages} for n in mgr.imports.values())),
            "ualink_peers": table("ualink_peers", lambda: (
                {"accel": c.remote, "state": c.state.name, "generation": c.generation}
                for c in sorted(mgr.conns.values(), key=lambda c: c.remote))),
            "ualink_npa": table("ualink_npa", lambda: (
                {"used_pages": mgr.npa_import_pages, "mappings": len(mgr.npa_table)},)),
            "ualink_exports": table("ualink_exports", lambda: (
                {"handle_lo": e.handle_lo, "handle_hi": e.handle_hi, "bo": e.bo.id,
                 "size": e.bo.size, "pins": e.bo.pin_count, "importers": e.importers}
                for e in mgr.exports.values())),
            "clients": table("clients", lambda: (
                {"pid": f.pid, "uid": f.uid, "handles": len(f.handles)} for f in device.files)),
            "kfd_allocations": table("kfd_allocations", lambda: (
                {"pid": proc.pid, "handle": gpu_id << 32 | idr, "va": mem.va, "size": mem.size,
                 "mapped": sorted(mem.mapped)}
                for proc in self.kfd.processes.values()
                for gpu_id, pdd in proc.pdds.items() if pdd.node.driver is driver
                for idr, mem in pdd.mems.items())),
            "kfd_processes": table("kfd_processes", lambda: (
                {"pid": proc.pid, "gpu_id": gpu_id,
                 "vm_file_pid": pdd.drm_file.pid if pdd.drm_file is not None else 0,
                 "vm_mappings": len(pdd.vm()) if pdd.drm_file is not None else 0,
                 "allocations": len(pdd.mems), "events": len(proc.events)}
                for proc in self.kfd.processes.values()
                for gpu_id, pdd in proc.pdds.items() if pdd.node.driver is driver)),
            "kfd_queues": table("kfd_queues", lambda: (
                {"pid": q.pid, "gpu_id": q.gpu_id, "queue_id": q.queue_id,
                 "type": q.type_name, "ring": q.ring_base, "ring_size": q.ring_size,
                 "rptr": q.rptr, "wptr": q.last_doorbell, "packets": q.packets,
                 "state": q.state.value}
                for q in self.kfd.queues.all_queues()
                if self.kfd.nodes[q.gpu_id].driver is driver)),
            "amdgpu_cs_contexts": table("amdgpu_cs_contexts", driver.cs.context_rows),
        }, mode=sysfs.DEBUGFS_DIR_MODE)

    def _config_files(self, cfg: SysConfig) -> SysDir:
        """setup/, config/, stations/ with their commit files (§7.1, policy 8)."""

        def rw(group: Callable[[], object], name: str,
               write: Callable[[str, str], None]) -> SysAttr:
            # `group` reads the pending value now: a write replaces the whole typed value.
            return SysAttr(lambda: sysfs.show_value(getattr(group(), name)),
                           self._after(lambda text: write(name, text)), sysfs.ATTR_RW)

        def commit(fn: Callable[[str], None]) -> SysAttr:
            return SysAttr(lambda: "", self._after(fn), sysfs.ATTR_WO)

        return SysDir({
            "setup": SysDir({**{n: rw(lambda: cfg.setup, n, cfg.write_setup)
                                for n in field_names(cfg.setup)},
                             "commit": commit(cfg.commit_setup)}),
            "config": SysDir({**{n: rw(lambda: cfg.config, n, cfg.write_config)
                                 for n in field_names(cfg.config)},
                              "commit": commit(cfg.commit_config)}),
            "stations": SysDir({**{n: rw(lambda: cfg.stations, n, cfg.write_stations)
                                   for n in field_names(cfg.stations)},
                                "commit": commit(cfg.commit_stations)}),
        })

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
        return SysAttr(lambda: sysfs.show_value(fn()))

    return SysDir({
        "link_type": attr(lambda: "UALoE"),
        "accel_id": attr(lambda: mgr.ppod.accel_id),
        "bandwidth": attr(lambda: mgr.ppod.bandwidth),
        "latency": attr(lambda: mgr.ppod.latency),
        "ppod_id": attr(lambda: str(mgr.ppod.ppod_uuid).lower()),
        "ppod_size": attr(lambda: mgr.ppod.ppod_size),
        "vpod_id": attr(lambda: mgr.vpod.vpod_id),
        "vpod_size": attr(lambda: mgr.vpod.vpod_size),
        "vpod_active_accels": attr(lambda: sorted(mgr.vpod.active_accels)),
        "addr_mode": attr(lambda: mgr.vpod.addr_mode),
        "accel_state": attr(lambda: mgr.state),
        "local_accels": attr(lambda: list(mgr.local_accels)),
    })
