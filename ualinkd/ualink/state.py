"""The accelerator state machine and the pPod/vPod information that drives it (spec §5.9).

`next_state()` is amdgpu_ualink_update_accel_state: where a configuration stage wants to
take an accel, checked against the pPod and vPod rules. Activation and deactivation
(ACTIVE and back to PPOD_CONFIGURED) are host-wide and live in `host.py`.
"""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass, field


class AccelState(enum.IntEnum):
    UNCONFIGURED = 0
    PPOD_CONFIGURED = 1
    VPOD_CONFIGURED = 2
    READY = 3
    ACTIVE = 4
    ERROR = 5

    @property
    def sysfs(self) -> str:
        return self.name.lower()


class ConfigStage(enum.Enum):
    """The firmware's configuration stage (numeric values unknown, spec §12.7)."""

    IDLE = "idle"
    PPOD = "ppod"
    VPOD = "vpod"
    STATION = "station"
    COMPLETE = "complete"


# Stage -> the state it asks for (§5.9); IDLE asks for nothing.
STAGE_TARGET: dict[ConfigStage, AccelState | None] = {
    ConfigStage.IDLE: None,
    ConfigStage.PPOD: AccelState.PPOD_CONFIGURED,
    ConfigStage.VPOD: AccelState.VPOD_CONFIGURED,
    ConfigStage.STATION: AccelState.VPOD_CONFIGURED,
    ConfigStage.COMPLETE: AccelState.READY,
}


class AddrMode(enum.IntEnum):
    SOURCE_ALIASING = 0
    SOURCE_IDENTIFICATION = 1
    INVALID = 2  # the initial value (§7.1)

    @property
    def sysfs(self) -> str:
        return {0: "source-aliasing", 1: "source-identification"}.get(self.value, "invalid")


ACCEL_MAX = 256
LOCAL_ACCELS_MAX = 8
U32_UNSET = 0xFFFFFFFF
VPOD_ID_INVALID = 0
NIL_UUID = uuid.UUID(int=0)


@dataclass(frozen=True, slots=True)
class PpodInfo:
    accel_id: int = U32_UNSET
    bandwidth: int = U32_UNSET
    latency: int = U32_UNSET
    ppod_size: int = 0
    ppod_uuid: uuid.UUID = NIL_UUID

    @property
    def valid(self) -> bool:
        return 1 <= self.ppod_size <= ACCEL_MAX and self.accel_id < self.ppod_size


@dataclass(frozen=True, slots=True)
class VpodInfo:
    vpod_id: int = VPOD_ID_INVALID
    vpod_size: int = 0
    addr_mode: AddrMode = AddrMode.INVALID
    active_accels: frozenset[int] = field(default_factory=frozenset)

    def valid_for(self, ppod: PpodInfo) -> bool:
        return (
            1 <= self.vpod_size <= ppod.ppod_size
            and self.addr_mode in (AddrMode.SOURCE_ALIASING, AddrMode.SOURCE_IDENTIFICATION)
            and len(self.active_accels) == self.vpod_size
            and ppod.accel_id in self.active_accels
        )


def next_state(
    current: AccelState, target: AccelState | None, ppod: PpodInfo, vpod: VpodInfo
) -> AccelState:
    """Where `target` takes an accel now in `current` (§5.9 "Validation ...")."""
    if target is None:
        return current
    ppod_validated = AccelState.PPOD_CONFIGURED <= current <= AccelState.ACTIVE
    vpod_validated = AccelState.VPOD_CONFIGURED <= current <= AccelState.ACTIVE
    if not ppod_validated and not ppod.valid:
        return AccelState.UNCONFIGURED if target == AccelState.PPOD_CONFIGURED else AccelState.ERROR
    if target == AccelState.PPOD_CONFIGURED:
        return current if ppod_validated else AccelState.PPOD_CONFIGURED
    if vpod.vpod_id == VPOD_ID_INVALID:
        return AccelState.PPOD_CONFIGURED
    if not vpod_validated and not vpod.valid_for(ppod):
        return AccelState.ERROR
    if target == AccelState.VPOD_CONFIGURED:
        return current if vpod_validated else AccelState.VPOD_CONFIGURED
    # target READY
    return current if current in (AccelState.READY, AccelState.ACTIVE) else AccelState.READY
