"""The accels of one host (node) and the host-wide vPod activation pass (spec §5.9, §5.10)."""

from __future__ import annotations

import logging

from .manager import UalinkManager
from .state import AccelEvent, AccelState

log = logging.getLogger(__name__)


class UalinkHost:
    def __init__(self) -> None:
        self.managers: list[UalinkManager] = []

    def by_accel_id(self, accel_id: int) -> UalinkManager | None:
        for m in self.managers:
            if m.accel_id == accel_id:
                return m
        return None

    def late_init(self) -> None:
        """ualink_ip_late_init on every GPU: state from the firmware stage, then activation."""
        for m in self.managers:
            m.change_state(AccelEvent.STAGE, m.stage)
        for m in self.managers:
            self.activate_vpod(m)

    def _integrity_ok(self, m: UalinkManager) -> bool:
        """__check_local_vpod_integrity: False defers or fails the activation."""
        ids = [x.accel_id for x in self.managers]
        if len(set(ids)) != len(ids):
            log.error("local accel ids are not unique: %s", ids)
            return False
        for other in self.managers:
            if other is m:
                continue
            if other.state < AccelState.PPOD_CONFIGURED:
                return False  # deferred (-EAGAIN), silently
            if other.accel_id not in m.vpod.active_accels:
                continue
            if other.state < AccelState.VPOD_CONFIGURED:  # ERROR is not below: it may join
                return False
            if (
                other.ppod.ppod_uuid != m.ppod.ppod_uuid
                or other.ppod.ppod_size != m.ppod.ppod_size
                or other.vpod != m.vpod
            ):
                log.error(
                    "accel %d and accel %d disagree on their vPod; not activating",
                    m.accel_id, other.accel_id,
                )
                return False
        return True

    def activate_vpod(self, m: UalinkManager) -> None:
        """__amdgpu_ualink_activate_vpod_locked for `m` and its local vPod peers."""
        if m.state < AccelState.VPOD_CONFIGURED or m.state == AccelState.ERROR:
            return
        if not self._integrity_ok(m):
            return
        members = [x for x in self.managers if x.accel_id in m.vpod.active_accels]
        for x in members:
            x.local_accels = [x.accel_id] + [y.accel_id for y in members if y is not x]
            if x.active_snapshot != x.vpod.active_accels or x.state != AccelState.ACTIVE:
                x.deactivate()
                x.activate()
