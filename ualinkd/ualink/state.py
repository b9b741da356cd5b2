"""The accelerator state machine and the pPod/vPod information that drives it (spec §5.9).

This module owns the accel state: `ACCEL_TRANSITIONS` is the one table of §5.9, and
`accel_transition()` the one lookup the manager's `change_state()` (the only place that
assigns the state) and `ualinkctl`'s explanations use. Each event has its rows in the
order the kernel checks them; the first row whose guard holds decides.

§5.9, as the table encodes it:

* Stage → target: IDLE → no change; PPOD → PPOD_CONFIGURED; VPOD or STATION →
  VPOD_CONFIGURED; COMPLETE → READY (`STAGE_TARGET`).
* Validation when moving towards the target (amdgpu_ualink_update_accel_state, event
  STAGE): not yet pPod-validated and pPod invalid: target PPOD_CONFIGURED → UNCONFIGURED,
  higher → ERROR; target PPOD_CONFIGURED → PPOD_CONFIGURED unless pPod-validated
  (unchanged); vPod id 0 → PPOD_CONFIGURED; not yet vPod-validated and vPod invalid →
  ERROR; target VPOD_CONFIGURED → VPOD_CONFIGURED unless vPod-validated (unchanged);
  target READY → READY unless already READY or ACTIVE. ("validated": the state is within
  PPOD_CONFIGURED…ACTIVE, resp. VPOD_CONFIGURED…ACTIVE; ERROR is not validated.)
* activate_accelerator (ACTIVATE): no-op on ACTIVE, else ACTIVE.
* deactivate_accelerator (DEACTIVATE): no-op below ACTIVE (so it acts on ACTIVE and
  ERROR), else PPOD_CONFIGURED.
* setup/commit (PPOD_COMMIT, §7.1): PPOD_CONFIGURED for a valid pPod, else UNCONFIGURED.
* config update "any other case" (CONFIG_REFUSED): ERROR.

The config update handler's cases (§5.9 "Event handling") are `CONFIG_UPDATE_CASES`, and
config/commit's EINVAL checks (§7.1) are `config_refusal()`; both carry the sentence that
explains them, so the daemon and `ualinkctl` say the same thing.
"""


from __future__ import annotations

import enum
import uuid
from collections.abc import Callable
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
        return vpod_problem(ppod, self) is None


# §5.9 "vPod valid", in the kernel's order: (check, why it fails). `ualinkctl` prints the
# first failing one after "accel N is <state>; ".
VPOD_CHECKS: tuple[tuple[Callable[[PpodInfo, VpodInfo], bool],
                         Callable[[PpodInfo, VpodInfo], str]], ...] = (
    (lambda pp, vp: 1 <= vp.vpod_size <= pp.ppod_size,
     lambda pp, vp: f"the vPod has {vp.vpod_size} members but the pPod only {pp.ppod_size} "
                    "accels"),
    (lambda pp, vp: vp.addr_mode in (AddrMode.SOURCE_ALIASING, AddrMode.SOURCE_IDENTIFICATION),
     lambda pp, vp: "the vPod needs an addr_mode (source-aliasing or source-identification)"),
    (lambda pp, vp: len(vp.active_accels) == vp.vpod_size,
     lambda pp, vp: f"vpod_size is {vp.vpod_size} but {len(vp.active_accels)} members are "
                    "listed"),
    (lambda pp, vp: pp.accel_id in vp.active_accels,
     lambda pp, vp: f"the vPod needs accel {pp.accel_id} among its members (members: "
                    f"{','.join(map(str, sorted(vp.active_accels))) or 'none'})"),
)

NEEDS_PPOD = "a vPod needs a committed pPod first (setup/ files, setup/commit)"


def vpod_problem(ppod: PpodInfo, vpod: VpodInfo) -> str | None:
    """The first §5.9 vPod check `vpod` fails for `ppod`, as a sentence; None if valid."""
    for ok, why in VPOD_CHECKS:
        if not ok(ppod, vpod):
            return why(ppod, vpod)
    return None


def config_refusal(state: AccelState, ppod: PpodInfo, vpod: VpodInfo) -> str | None:
    """Why config/commit answers EINVAL (§7.1): below PPOD_CONFIGURED, or a vPod (id ≠ 0)
    that is not valid; None when the commit goes on to the config update handler. An accel
    in ERROR is not refused for its state."""
    if state < AccelState.PPOD_CONFIGURED:
        return NEEDS_PPOD
    if vpod.vpod_id == VPOD_ID_INVALID:
        return None
    return vpod_problem(ppod, vpod)


class AccelEvent(enum.Enum):
    STAGE = "the firmware's configuration stage is applied (late init, joining a vPod)"
    ACTIVATE = "activate_accelerator"
    DEACTIVATE = "deactivate_accelerator"
    PPOD_COMMIT = "setup/commit"
    CONFIG_REFUSED = "config update in the 'any other case' row"


@dataclass(frozen=True, slots=True)
class AccelFacts:
    """What a guard may look at: the state, the stage's target and the firmware's info."""

    current: AccelState
    target: AccelState | None
    ppod: PpodInfo
    vpod: VpodInfo

    @property
    def ppod_validated(self) -> bool:
        return AccelState.PPOD_CONFIGURED <= self.current <= AccelState.ACTIVE

    @property
    def vpod_validated(self) -> bool:
        return AccelState.VPOD_CONFIGURED <= self.current <= AccelState.ACTIVE


@dataclass(frozen=True, slots=True)
class AccelRule:
    """One row: when `guard` holds, the state becomes `to` (None: unchanged)."""

    guard: Callable[[AccelFacts], bool]
    to: AccelState | None
    why: str


_S = AccelState
_PP, _VP, _RDY = _S.PPOD_CONFIGURED, _S.VPOD_CONFIGURED, _S.READY


def _always(f: AccelFacts) -> bool:
    return True


def _ppod_unvalidated_invalid(f: AccelFacts) -> bool:
    return not f.ppod_validated and not f.ppod.valid


def _vpod_unvalidated_invalid(f: AccelFacts) -> bool:
    return not f.vpod_validated and not f.vpod.valid_for(f.ppod)


ACCEL_TRANSITIONS: dict[AccelEvent, tuple[AccelRule, ...]] = {
    AccelEvent.STAGE: (
        AccelRule(lambda f: f.target is None, None, "stage IDLE asks for nothing"),
        AccelRule(lambda f: _ppod_unvalidated_invalid(f) and f.target == _PP,
                  _S.UNCONFIGURED, "the pPod is not valid"),
        AccelRule(_ppod_unvalidated_invalid, _S.ERROR, "the pPod is not valid"),
        AccelRule(lambda f: f.target == _PP and f.ppod_validated, None,
                  "already pPod-validated"),
        AccelRule(lambda f: f.target == _PP, _PP, "the pPod is valid"),
        AccelRule(lambda f: f.vpod.vpod_id == VPOD_ID_INVALID, _PP, "vPod id 0: no vPod"),
        AccelRule(_vpod_unvalidated_invalid, _S.ERROR, "the vPod is not valid"),
        AccelRule(lambda f: f.target == _VP and f.vpod_validated, None,
                  "already vPod-validated"),
        AccelRule(lambda f: f.target == _VP, _VP, "the vPod is valid"),
        AccelRule(lambda f: f.current in (_RDY, _S.ACTIVE), None, "already READY or ACTIVE"),
        AccelRule(_always, _RDY, "configuration complete"),
    ),
    AccelEvent.ACTIVATE: (
        AccelRule(lambda f: f.current == _S.ACTIVE, None, "already ACTIVE"),
        AccelRule(_always, _S.ACTIVE, "the manager started"),
    ),
    AccelEvent.DEACTIVATE: (
        AccelRule(lambda f: f.current < _S.ACTIVE, None, "not ACTIVE nor ERROR"),
        AccelRule(_always, _PP, "the manager stopped"),
    ),
    AccelEvent.PPOD_COMMIT: (
        AccelRule(lambda f: f.ppod.valid, _PP, "the committed pPod is valid"),
        AccelRule(_always, _S.UNCONFIGURED, "the committed pPod is not valid"),
    ),
    AccelEvent.CONFIG_REFUSED: (
        AccelRule(_always, _S.ERROR, "a config update the kernel refuses (-EINVAL)"),
    ),
}


def accel_rule(
    current: AccelState, event: AccelEvent, ppod: PpodInfo, vpod: VpodInfo,
    target: AccelState | None = None,
) -> AccelRule:
    """The row of ACCEL_TRANSITIONS that decides `event` from `current`."""
    facts = AccelFacts(current, target, ppod, vpod)
    for rule in ACCEL_TRANSITIONS[event]:
        if rule.guard(facts):
            return rule
    raise AssertionError(f"no rule for {event} from {current}")  # every event ends in _always


def accel_transition(
    current: AccelState, event: AccelEvent, ppod: PpodInfo, vpod: VpodInfo,
    target: AccelState | None = None,
) -> AccelState:
    """Where `event` takes an accel now in `current` (§5.9)."""
    to = accel_rule(current, event, ppod, vpod, target).to
    return current if to is None else to


def next_state(
    current: AccelState, target: AccelState | None, ppod: PpodInfo, vpod: VpodInfo
) -> AccelState:
    """Where `target` takes an accel now in `current` (§5.9 "Validation ...")."""
    return accel_transition(current, AccelEvent.STAGE, ppod, vpod, target)


class ConfigUpdate(enum.Enum):
    """amdgpu_ualink_config_update_handler's cases (§5.9 "Event handling"), in its order;
    the value says what the case does."""

    SAME_VPOD_ACTIVE = "ACTIVE with the same vPod id: only a membership change acts"
    LEAVE = "new vPod id 0: deactivate"
    JOIN = "previous vPod id 0: state from the stage, then an activation pass"
    REFUSED = "any other case: -EINVAL, deactivate and ERROR"


def config_update_case(state: AccelState, prev_id: int, new_id: int) -> ConfigUpdate:
    if state == AccelState.ACTIVE and new_id == prev_id and prev_id != VPOD_ID_INVALID:
        return ConfigUpdate.SAME_VPOD_ACTIVE
    if new_id == VPOD_ID_INVALID:
        return ConfigUpdate.LEAVE
    if prev_id == VPOD_ID_INVALID:
        return ConfigUpdate.JOIN
    return ConfigUpdate.REFUSED


def why_error(before: AccelState, prev_id: int, new_id: int) -> str:
    """Why a config update with vPod `new_id` left an accel that was `before` in vPod
    `prev_id` in ERROR, from the case that decided it (the words `ualinkctl` prints)."""
    if config_update_case(before, prev_id, new_id) == ConfigUpdate.JOIN:
        # The vPod itself passed config/commit's checks: the pPod row of STAGE decided.
        return (f"it was {before.sysfs} with no vPod and its pPod is not valid (setup/ files, "
                "setup/commit)")
    if before == AccelState.ERROR:
        why = "only leaving its vPod takes an accel out of error"
    elif new_id != prev_id:
        why = "a GPU must leave its vPod (id 0) before joining another"
    else:
        why = "the kernel takes the same vPod again only from an active accel"
    return f"it was {before.sysfs} in vPod {prev_id}, and {why}"
