"""One accel's UALink manager: state, export table, local-path import, revoke (spec §1.6, §3, §6).

Sans-IO and synchronous. Randomness is injected (`randbits`) so tests can pin handles.
Remote imports (NPA_REQ over the fabric) are the pod-fabric issue's; until then a handle
whose exporter is on another node fails the way an undeliverable HELLO does.
"""

from __future__ import annotations

import errno
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..abi.constants import DOMAIN_VRAM
from ..amdgpu.bo import AmdgpuBo
from ..amdgpu.driver import AmdgpuDriver
from ..drm.errors import DrmError
from ..drm.file import DrmFile
from ..drm.gem import DmaBuf
from .state import ACCEL_MAX, AccelState, ConfigStage, PpodInfo, VpodInfo

if TYPE_CHECKING:
    from .host import UalinkHost

log = logging.getLogger(__name__)

HANDLE_ACCID_MASK = 0x3FF  # bits 9..0 of handle_lo carry the exporter's accel id (§3.1)
_U64 = (1 << 64) - 1

# Kernel quirks (Emulator policy 2): named switches, all off by default.
QUIRK_HELLO_NO_RESET = "hello-no-reset"  # §5.4
QUIRK_NO_REMOTE_SHOOTDOWN = "no-remote-shootdown"  # §5.11
QUIRK_STALE_EXPORT_HANDLE = "stale-export-handle"  # §6.10: re-export returns handle_hi = 0
QUIRK_ALIAS_EXTRA_PINS = "alias-extra-pins"  # §6.10
KNOWN_QUIRKS = frozenset(
    {QUIRK_HELLO_NO_RESET, QUIRK_NO_REMOTE_SHOOTDOWN, QUIRK_STALE_EXPORT_HANDLE,
     QUIRK_ALIAS_EXTRA_PINS}
)


@dataclass(slots=True)
class ExportEntry:
    """A live export (§6.1): holds one BO reference and the export-time dma-buf."""

    handle_lo: int
    handle_hi: int
    bo: AmdgpuBo
    buf: DmaBuf
    importers: set[int] = field(default_factory=set)  # remote accel ids holding an NPA


def generate_handle(
    accel_id: int, randbits: Callable[[int], int], live: dict[int, ExportEntry]
) -> tuple[int, int]:
    """§3.2: random handle_lo with the accel id in bits 9..0, non-zero and unique among
    live exports; handle_hi is 64 random bits drawn afterwards (may be 0)."""
    while True:
        lo = (randbits(64) & ~HANDLE_ACCID_MASK & _U64) | accel_id
        if lo != 0 and lo not in live:
            break
    return lo, randbits(64)


class UalinkManager:
    def __init__(
        self,
        host: UalinkHost,
        driver: AmdgpuDriver,
        ppod: PpodInfo,
        vpod: VpodInfo,
        stage: ConfigStage,
        quirks: frozenset[str] = frozenset(),
        randbits: Callable[[int], int] = secrets.randbits,
    ) -> None:
        self.host = host
        self.driver = driver
        self.ppod = ppod
        self.vpod = vpod
        self.stage = stage
        self.quirks = quirks
        self.randbits = randbits
        self.state = AccelState.UNCONFIGURED
        self.local_accels: list[int] = []
        self.active_snapshot: frozenset[int] | None = None  # bitmap at activation (§5.10)
        self.exports: dict[int, ExportEntry] = {}
        driver.ualink = self

    @property
    def accel_id(self) -> int:
        return self.ppod.accel_id

    @property
    def accel_active(self) -> bool:
        return self.state == AccelState.ACTIVE

    # -- activation (§5.9) --------------------------------------------------------------------
    def activate(self) -> None:
        if self.state >= AccelState.ACTIVE and self.state != AccelState.ERROR:
            return
        self.state = AccelState.ACTIVE
        self.active_snapshot = self.vpod.active_accels
        log.info("accel %d: ACTIVE in vPod %d", self.accel_id, self.vpod.vpod_id)

    def deactivate(self) -> None:
        """deactivate_accelerator: acts on ACTIVE and ERROR; stops the manager (§6.9)."""
        if self.state < AccelState.ACTIVE:
            return
        self.stop()
        self.state = AccelState.PPOD_CONFIGURED

    def stop(self) -> None:
        """Manager stop: every live export torn down without messages (§6.9)."""
        for entry in list(self.exports.values()):
            self._free_export(entry)
        self.exports.clear()

    # -- export (§1.6 E1–E7) -----------------------------------------------------------------
    def export(self, file: DrmFile, gem_handle: int) -> tuple[int, int]:
        bo = self.driver.lookup_bo(file, gem_handle)  # E1: ENOENT
        if not bo.preferred_domains & DOMAIN_VRAM:  # E2
            raise DrmError(errno.EOPNOTSUPP, "only BOs preferring VRAM are exportable")
        if bo.ualink_handle_lo:  # E3: idempotent per BO
            entry = self.exports.get(bo.ualink_handle_lo)
            if entry is not None and entry.bo is bo:
                return entry.handle_lo, entry.handle_hi
            if QUIRK_STALE_EXPORT_HANDLE in self.quirks:
                log.warning(
                    "accel %d: stale UALink handle %#x re-exported with handle_hi 0 (quirk)",
                    self.accel_id, bo.ualink_handle_lo,
                )
                return bo.ualink_handle_lo, 0
        buf = self.driver.device.prime_handle_to_dmabuf(file, gem_handle)  # E5: EPERM
        lo, hi = generate_handle(self.accel_id, self.randbits, self.exports)
        bo.get()
        self.exports[lo] = ExportEntry(lo, hi, bo, buf)
        bo.ualink_handle_lo = lo
        return lo, hi

    # -- revoke (§5.7, §6.4) -----------------------------------------------------------------
    def revoke(self, bo: AmdgpuBo) -> None:
        """handle_free: the BO's GEM handle count reached 0."""
        entry = self.exports.get(bo.ualink_handle_lo) if bo.ualink_handle_lo else None
        if entry is None or entry.bo is not bo:
            return
        del self.exports[entry.handle_lo]
        self._free_export(entry)

    def _free_export(self, entry: ExportEntry) -> None:
        # No importers can exist before the fabric (issue 3) brings remote ones.
        if QUIRK_STALE_EXPORT_HANDLE not in self.quirks or entry.importers:
            entry.bo.ualink_handle_lo = 0
        entry.buf.put()
        entry.bo.put()

    # -- import (§1.6 I1–I2c) ----------------------------------------------------------------
    def import_handle(self, file: DrmFile, handle_lo: int, handle_hi: int) -> DmaBuf:
        exporter_id = handle_lo & HANDLE_ACCID_MASK
        if exporter_id >= ACCEL_MAX:  # I1
            raise DrmError(errno.EINVAL, f"exporter accel id {exporter_id} >= 256")
        if exporter_id in self.local_accels:  # I2: local path, no messages, no pin
            exporter = self.host.by_accel_id(exporter_id)
            if exporter is None:  # I2a
                raise DrmError(errno.ENODEV, f"no local accel {exporter_id}")
            entry = exporter.exports.get(handle_lo)
            if entry is None or entry.handle_hi != handle_hi:  # I2b
                raise DrmError(errno.EINVAL, "no live export with that handle")
            entry.buf.get()  # I2c: a new fd of the exporter's export-time dma-buf
            return entry.buf
        if exporter_id not in self.vpod.active_accels:  # Emulator policy 4
            log.warning(
                "import refused: accel %d is not in vPod %d of accel %d",
                exporter_id, self.vpod.vpod_id, self.accel_id,
            )
            raise DrmError(errno.EACCES, f"accel {exporter_id} is outside vPod")
        # The HELLO towards a remote node cannot be sent without the fabric (§5.1 -ETIME).
        log.warning("accel %d: no fabric link towards accel %d", self.accel_id, exporter_id)
        raise DrmError(errno.ETIME, f"no fabric link towards accel {exporter_id}")
