"""The deprecated sysfs configuration interface, live in the emulator (spec §7.1, policy 8).

`setup/`, `config/` and `stations/` hold pending values; writing `true` to a `commit` file
pushes them to the "firmware" (here: the manager's pPod/vPod information) and runs the
kernel's state changes: pPod commit (§7.1 setup/commit) or a PSP config update (§5.9).
"""

from __future__ import annotations

import errno
import logging
import re
import uuid
from dataclasses import dataclass, fields, replace

from ..drm.errors import DrmError
from .host import UalinkHost
from .manager import UalinkManager
from .state import (
    ACCEL_MAX,
    LOCAL_ACCELS_MAX,
    VPOD_ID_INVALID,
    AccelEvent,
    AccelState,
    AddrMode,
    ConfigStage,
    ConfigUpdate,
    PpodInfo,
    VpodInfo,
    config_refusal,
    config_update_case,
)

log = logging.getLogger(__name__)
STATIONS_MAX = 64
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")
_UUID_TEXT = re.compile(r"[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}")


_U64_DIGITS = len(str((1 << 64) - 1))


def _decimal(text: str) -> int:
    """kstrtouint(…, 10): an optional "+", ASCII decimal digits, nothing else (no
    whitespace, no "0x", no "_", no "-"); EINVAL otherwise. _parse_integer stops at the
    first overflow of a u64 with ERANGE, whatever the length; leading zeros never overflow
    (5000 zeros then "7" is 7). Converting only what can fit also keeps int()'s 4300-digit
    limit (a ValueError) out of reach."""
    digits = text[1:] if text.startswith("+") else text
    if not digits or not (digits.isascii() and digits.isdigit()):
        raise DrmError(errno.EINVAL, f"not a decimal number: {text!r}")
    significant = digits.lstrip("0")
    if len(significant) > _U64_DIGITS:
        raise DrmError(errno.ERANGE, f"a {len(significant)}-digit number overflows a u64")
    return int(significant or "0", 10)


def parse_u32(text: str) -> int:
    """kstrtou32(buf, 10, …) as a sysfs store uses it (§7.1 "decimal u32"): one trailing
    newline allowed; EINVAL for anything that is not a number, ERANGE above u32."""
    value = _decimal(text[:-1] if text.endswith("\n") else text)
    if value > 0xFFFFFFFF:
        raise DrmError(errno.ERANGE, f"{value} is not a u32")
    return value


def parse_hex_u8(text: str) -> int:
    """kstrtou8(buf, 16, …) as a sysfs store uses it (§7.1 stations/flags "hex u8"): an
    optional "+", an optional "0x"/"0X", hex digits, one trailing newline allowed; EINVAL
    for anything else (no whitespace, "_" or "-"), ERANGE above 0xFF."""
    word = text[:-1] if text.endswith("\n") else text
    word = word[1:] if word.startswith("+") else word
    digits = word[2:] if word[:2] in ("0x", "0X") else word
    if not digits or not _HEX_DIGITS.issuperset(digits):
        raise DrmError(errno.EINVAL, f"not a hex number: {text!r}")
    value = int(digits, 16)
    if value > 0xFF:
        raise DrmError(errno.ERANGE, f"{value:#x} is not a u8")
    return value


def parse_ids(text: str, limit: int | None = None) -> list[int]:
    """Accel ids separated by spaces or commas; each < 256 (ERANGE); at most `limit`."""
    ids = []
    for part in text.replace(",", " ").split():
        v = _decimal(part)
        if v >= ACCEL_MAX:
            raise DrmError(errno.ERANGE, f"accel id {v} is not below {ACCEL_MAX}")
        ids.append(v)
    if limit is not None and len(ids) > limit:
        raise DrmError(errno.ENOSPC, f"at most {limit} ids")
    return ids


def _expect_true(text: str) -> None:
    """sysfs_streq(buf, "true"): the word exactly, one trailing newline allowed."""
    if text not in ("true", "true\n"):
        raise DrmError(errno.EINVAL, "commit takes the word true")


@dataclass(frozen=True, slots=True)
class PendingSetup:
    """setup/: the pPod values setup/commit pushes (§7.1); field names are the file names."""

    accel_id: int
    bandwidth: int
    latency: int
    ppod_size: int
    ppod_id: uuid.UUID
    local_accels: tuple[int, ...] = ()

    def ppod(self) -> PpodInfo:
        return PpodInfo(self.accel_id, self.bandwidth, self.latency, self.ppod_size,
                        self.ppod_id)


@dataclass(frozen=True, slots=True)
class PendingConfig:
    """config/: the vPod values config/commit pushes (§7.1)."""

    vpod_id: int
    vpod_size: int
    vpod_active_accels: tuple[int, ...]
    addr_mode: AddrMode

    def vpod(self) -> VpodInfo:
        return VpodInfo(self.vpod_id, self.vpod_size, self.addr_mode,
                        frozenset(self.vpod_active_accels))


@dataclass(frozen=True, slots=True)
class PendingStations:
    """stations/ (§7.1): pushed to the firmware, no state change."""

    flags: int = 0
    lane_en_bitmap: str = ""


def field_names(pending: PendingSetup | PendingConfig | PendingStations) -> list[str]:
    """The attribute files of one pending group, in declaration order."""
    return [f.name for f in fields(pending)]


class SysConfig:
    """Pending configuration of one accel and the commits that apply it."""

    def __init__(self, host: UalinkHost, mgr: UalinkManager) -> None:
        self.host = host
        self.mgr = mgr
        pp, vp = mgr.ppod, mgr.vpod
        self.setup = PendingSetup(pp.accel_id, pp.bandwidth, pp.latency, pp.ppod_size,
                                  pp.ppod_uuid)
        self.config = PendingConfig(vp.vpod_id, vp.vpod_size, tuple(sorted(vp.active_accels)),
                                    vp.addr_mode)
        self.stations = PendingStations()

    # -- writes -----------------------------------------------------------------------------
    def write_setup(self, name: str, text: str) -> None:
        if name == "ppod_id":
            word = text[:-1] if text.endswith("\n") else text
            if not _UUID_TEXT.fullmatch(word):  # uuid_parse: the 36-character form only
                raise DrmError(errno.EINVAL, "not a UUID (xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)")
            self.setup = replace(self.setup, ppod_id=uuid.UUID(word))
        elif name == "local_accels":
            self.setup = replace(self.setup, local_accels=tuple(parse_ids(text, LOCAL_ACCELS_MAX)))
        else:
            v, s = parse_u32(text), self.setup
            self.setup = {"accel_id": lambda: replace(s, accel_id=v),
                          "bandwidth": lambda: replace(s, bandwidth=v),
                          "latency": lambda: replace(s, latency=v),
                          "ppod_size": lambda: replace(s, ppod_size=v)}[name]()

    def write_config(self, name: str, text: str) -> None:
        if name == "vpod_active_accels":
            self.config = replace(self.config,
                                  vpod_active_accels=tuple(sorted(set(parse_ids(text)))))
        elif name == "addr_mode":
            word = text[:-1] if text.endswith("\n") else text
            modes = {"source-aliasing": AddrMode.SOURCE_ALIASING,
                     "source-identification": AddrMode.SOURCE_IDENTIFICATION}
            if word not in modes:
                raise DrmError(errno.EINVAL, f"unknown addr_mode {word!r}")
            self.config = replace(self.config, addr_mode=modes[word])
        else:
            v, c = parse_u32(text), self.config
            self.config = {"vpod_id": lambda: replace(c, vpod_id=v),
                           "vpod_size": lambda: replace(c, vpod_size=v)}[name]()

    def write_stations(self, name: str, text: str) -> None:
        if name == "flags":
            self.stations = replace(self.stations, flags=parse_hex_u8(text))
        else:
            digits = text.rstrip("\n")
            if len(digits) > STATIONS_MAX:
                raise DrmError(errno.ENOSPC, f"at most {STATIONS_MAX} stations")
            if not _HEX_DIGITS.issuperset(digits):
                raise DrmError(errno.EINVAL, "one hex digit per station")
            self.stations = replace(self.stations, lane_en_bitmap=digits)

    # -- commits ----------------------------------------------------------------------------
    def commit_setup(self, text: str) -> None:
        """setup/commit: new pPod info; deactivate if ≥ READY; state from the pPod rules;
        vPod id := 0."""
        _expect_true(text)
        mgr = self.mgr
        mgr.ppod = self.setup.ppod()
        if mgr.state >= AccelState.READY:
            mgr.deactivate()
        mgr.vpod = VpodInfo()
        mgr.change_state(AccelEvent.PPOD_COMMIT)
        self.config = replace(self.config, vpod_id=VPOD_ID_INVALID)
        log.info("accel %d: pPod committed, state %s", mgr.accel_id, mgr.state.sysfs)

    def commit_config(self, text: str) -> None:
        """config/commit: EINVAL below PPOD_CONFIGURED or for an invalid vPod (§7.1), else a
        PSP config update with the pending vPod (§5.9 event table; from ERROR that is the
        "any other case" row unless the new vPod id is 0)."""
        _expect_true(text)
        mgr, new = self.mgr, self.config.vpod()
        why = config_refusal(mgr.state, mgr.ppod, new)
        if why is not None:
            raise DrmError(errno.EINVAL, f"accel is {mgr.state.sysfs}; {why}")
        config_update(self.host, mgr, new, ConfigStage.COMPLETE)

    def commit_stations(self, text: str) -> None:
        _expect_true(text)  # pushed to the firmware; no state change (§7.1)


def config_update(
    host: UalinkHost, mgr: UalinkManager, new: VpodInfo, stage: ConfigStage
) -> None:
    """amdgpu_ualink_config_update_handler (§5.9 "Event handling")."""
    prev = mgr.vpod.vpod_id
    case = config_update_case(mgr.state, prev, new.vpod_id)
    if case == ConfigUpdate.SAME_VPOD_ACTIVE:
        # The new info is recorded as it is, addr_mode included, but only a membership
        # change acts: the NPA space running keeps the mode it was laid out with at
        # activation, and the next activation takes the new one.
        mgr.vpod = new
        if new.active_accels != mgr.active_snapshot:
            host.activate_vpod(mgr)  # membership changed: bounce the members
        return
    if case == ConfigUpdate.LEAVE:
        mgr.vpod = new
        mgr.deactivate()
        mgr.local_accels = []
        return
    if case == ConfigUpdate.JOIN:
        mgr.vpod = new
        mgr.change_state(AccelEvent.STAGE, stage)
        host.activate_vpod(mgr)
        return
    log.error("accel %d: vPod %d -> %d without leaving first: ERROR", mgr.accel_id, prev,
              new.vpod_id)
    mgr.deactivate()
    mgr.vpod = new
    mgr.change_state(AccelEvent.CONFIG_REFUSED)
