"""The accelerator state machine (spec §5.9) and host-wide vPod activation (§5.10, §6.9)."""

from __future__ import annotations

import errno
import uuid

import pytest
from ualink_testkit import (
    device,
    gem_create,
    make_node,
    open_file,
    pod_config,
    ualink_export,
    ualink_export_raw,
    ualink_import_raw,
)

from ualinkd.amdgpu.driver import AmdgpuDriver
from ualinkd.drm.device import DrmDevice
from ualinkd.drm.tokens import DmaBufTokens
from ualinkd.ualink.host import UalinkHost
from ualinkd.ualink.manager import UalinkManager
from ualinkd.ualink.state import (
    STAGE_TARGET,
    AccelState,
    AddrMode,
    ConfigStage,
    PpodInfo,
    VpodInfo,
    next_state,
)

S = AccelState
U = uuid.UUID(int=0x1234)
SA = AddrMode.SOURCE_ALIASING

PPOD = PpodInfo(accel_id=0, bandwidth=1, latency=1, ppod_size=4, ppod_uuid=U)
PPOD_SIZE0 = PpodInfo(accel_id=0, ppod_size=0, ppod_uuid=U)
PPOD_ID_TOO_BIG = PpodInfo(accel_id=4, ppod_size=4, ppod_uuid=U)
PPOD_257 = PpodInfo(accel_id=0, ppod_size=257, ppod_uuid=U)
PPOD_256 = PpodInfo(accel_id=255, ppod_size=256, ppod_uuid=U)

VPOD = VpodInfo(1, 2, SA, frozenset({0, 1}))
NO_VPOD = VpodInfo()
BAD_VPODS = {
    "size0": VpodInfo(1, 0, SA, frozenset()),
    "bigger-than-ppod": VpodInfo(1, 5, SA, frozenset(range(5))),
    "addr-mode-invalid": VpodInfo(1, 2, AddrMode.INVALID, frozenset({0, 1})),
    "popcount-differs": VpodInfo(1, 3, SA, frozenset({0, 1})),
    "not-a-member": VpodInfo(1, 2, SA, frozenset({1, 2})),
}

IDLE, PP, VP, STN, DONE = (ConfigStage.IDLE, ConfigStage.PPOD, ConfigStage.VPOD,
                           ConfigStage.STATION, ConfigStage.COMPLETE)

# (current, stage, ppod, vpod, expected) — one row per rule of §5.9 "Validation".
ROWS = [
    # IDLE → no change
    *[(cur, IDLE, PPOD_SIZE0, NO_VPOD, cur) for cur in S],
    # pPod invalid, not yet pPod-validated: PPOD target → UNCONFIGURED, higher → ERROR
    (S.UNCONFIGURED, PP, PPOD_SIZE0, VPOD, S.UNCONFIGURED),
    (S.UNCONFIGURED, PP, PPOD_ID_TOO_BIG, VPOD, S.UNCONFIGURED),
    (S.UNCONFIGURED, PP, PPOD_257, VPOD, S.UNCONFIGURED),
    (S.ERROR, PP, PPOD_SIZE0, VPOD, S.UNCONFIGURED),
    (S.UNCONFIGURED, VP, PPOD_SIZE0, VPOD, S.ERROR),
    (S.UNCONFIGURED, STN, PPOD_ID_TOO_BIG, VPOD, S.ERROR),
    (S.UNCONFIGURED, DONE, PPOD_257, VPOD, S.ERROR),
    (S.ERROR, DONE, PPOD_SIZE0, VPOD, S.ERROR),
    # pPod-validated states skip the pPod check
    (S.PPOD_CONFIGURED, PP, PPOD_SIZE0, VPOD, S.PPOD_CONFIGURED),
    (S.READY, DONE, PPOD_SIZE0, VPOD, S.READY),
    # target PPOD_CONFIGURED: PPOD_CONFIGURED unless already validated (unchanged)
    (S.UNCONFIGURED, PP, PPOD, VPOD, S.PPOD_CONFIGURED),
    (S.UNCONFIGURED, PP, PPOD_256, VPOD, S.PPOD_CONFIGURED),
    (S.ERROR, PP, PPOD, VPOD, S.PPOD_CONFIGURED),
    (S.PPOD_CONFIGURED, PP, PPOD, VPOD, S.PPOD_CONFIGURED),
    (S.VPOD_CONFIGURED, PP, PPOD, VPOD, S.VPOD_CONFIGURED),
    (S.READY, PP, PPOD, VPOD, S.READY),
    (S.ACTIVE, PP, PPOD, VPOD, S.ACTIVE),
    # vPod id 0 → PPOD_CONFIGURED
    (S.UNCONFIGURED, VP, PPOD, NO_VPOD, S.PPOD_CONFIGURED),
    (S.UNCONFIGURED, DONE, PPOD, NO_VPOD, S.PPOD_CONFIGURED),
    (S.READY, STN, PPOD, NO_VPOD, S.PPOD_CONFIGURED),
    (S.ACTIVE, DONE, PPOD, NO_VPOD, S.PPOD_CONFIGURED),
    # vPod invalid, not yet vPod-validated → ERROR (one row per invalid reason)
    *[(S.PPOD_CONFIGURED, VP, PPOD, v, S.ERROR) for v in BAD_VPODS.values()],
    *[(S.UNCONFIGURED, DONE, PPOD, v, S.ERROR) for v in BAD_VPODS.values()],
    (S.ERROR, STN, PPOD, BAD_VPODS["not-a-member"], S.ERROR),
    # vPod-validated states skip the vPod check
    *[(S.VPOD_CONFIGURED, VP, PPOD, v, S.VPOD_CONFIGURED) for v in BAD_VPODS.values()],
    (S.VPOD_CONFIGURED, DONE, PPOD, BAD_VPODS["size0"], S.READY),
    # target VPOD_CONFIGURED: VPOD_CONFIGURED unless already vPod-validated
    (S.UNCONFIGURED, VP, PPOD, VPOD, S.VPOD_CONFIGURED),
    (S.PPOD_CONFIGURED, STN, PPOD, VPOD, S.VPOD_CONFIGURED),
    (S.ERROR, VP, PPOD, VPOD, S.VPOD_CONFIGURED),
    (S.VPOD_CONFIGURED, STN, PPOD, VPOD, S.VPOD_CONFIGURED),
    (S.READY, VP, PPOD, VPOD, S.READY),
    (S.ACTIVE, STN, PPOD, VPOD, S.ACTIVE),
    # target READY: READY unless already READY or ACTIVE
    (S.UNCONFIGURED, DONE, PPOD, VPOD, S.READY),
    (S.PPOD_CONFIGURED, DONE, PPOD, VPOD, S.READY),
    (S.VPOD_CONFIGURED, DONE, PPOD, VPOD, S.READY),
    (S.READY, DONE, PPOD, VPOD, S.READY),
    (S.ACTIVE, DONE, PPOD, VPOD, S.ACTIVE),
    (S.ERROR, DONE, PPOD, VPOD, S.READY),
]


@pytest.mark.parametrize("current,stage,ppod,vpod,expected", ROWS)
def test_next_state_table(current, stage, ppod, vpod, expected):
    """§5.9 "Stage → target" and "Validation applied when moving towards the target"."""
    assert next_state(current, STAGE_TARGET[stage], ppod, vpod) is expected


def test_stage_targets():
    """§5.9: IDLE → none; PPOD → PPOD_CONFIGURED; VPOD/STATION → VPOD_CONFIGURED;
    COMPLETE → READY."""
    assert STAGE_TARGET == {IDLE: None, PP: S.PPOD_CONFIGURED, VP: S.VPOD_CONFIGURED,
                            STN: S.VPOD_CONFIGURED, DONE: S.READY}


def test_state_values_and_sysfs_strings():
    """§5.9: the six states, their values and sysfs strings."""
    assert [(s.value, s.sysfs) for s in S] == [
        (0, "unconfigured"), (1, "ppod_configured"), (2, "vpod_configured"),
        (3, "ready"), (4, "active"), (5, "error"),
    ]


# ---- host: late init and vPod activation (§5.9, §5.10) ---------------------------------------


def _states(core):
    return [m.state for m in core.managers.values()]


def test_late_init_activates_local_vpod_members():
    """§5.10: every local member goes ACTIVE with local_accels = own id first, then the
    other local members."""
    core = make_node(pod_config(nodes=[[{"id": 0}, {"id": 3}, {"id": 1}], [{"id": 5}]]))
    assert _states(core) == [S.ACTIVE] * 3
    assert [m.local_accels for m in core.managers.values()] == [[0, 3, 1], [3, 0, 1], [1, 0, 3]]


def test_late_init_stage_vpod_goes_straight_to_active():
    """§5.9: VPOD_CONFIGURED (stage vpod/station) can be activated without READY."""
    core = make_node(pod_config(nodes=[[{"id": 0, "stage": "vpod"}, {"id": 1,
                                                                     "stage": "station"}]]))
    assert _states(core) == [S.ACTIVE, S.ACTIVE]


def test_member_still_in_ppod_defers_activation():
    """§5.10: a local vPod member below VPOD_CONFIGURED defers everyone's activation."""
    core = make_node(pod_config(nodes=[[{"id": 0}, {"id": 1, "stage": "ppod"}]]))
    assert _states(core) == [S.READY, S.PPOD_CONFIGURED]
    f = open_file(core)
    assert ualink_export_raw(f, gem_create(f)).result == -errno.EOPNOTSUPP


def test_unconfigured_non_member_defers_activation():
    """§5.10: any other local GPU below PPOD_CONFIGURED defers activation, member or not."""
    core = make_node(pod_config(nodes=[[{"id": 0}, {"id": 1, "stage": "idle"}], [{"id": 5}]],
                                vpods=[{"id": 1, "members": [0, 5]}]))
    assert _states(core) == [S.READY, S.UNCONFIGURED]


def test_non_member_local_accel_is_not_in_local_accels():
    """§5.10: local_accels lists only local members of the vPod."""
    core = make_node(pod_config(nodes=[[{"id": 0}, {"id": 1}], [{"id": 5}]],
                                vpods=[{"id": 1, "members": [0, 5]}, {"id": 2, "members": [1]}]))
    assert _states(core) == [S.ACTIVE, S.ACTIVE]
    assert [m.local_accels for m in core.managers.values()] == [[0], [1]]


def _host_with(vpods: list[VpodInfo], ppods: list[PpodInfo]) -> UalinkHost:
    host = UalinkHost()
    for i, (pp, vp) in enumerate(zip(ppods, vpods, strict=True)):
        dev = DrmDevice(128 + i, DmaBufTokens(), lambda pid, fd: None)  # type: ignore[arg-type, return-value]
        drv = AmdgpuDriver(dev, 1 << 20, 1 << 20)
        host.managers.append(UalinkManager(host, drv, pp, vp, ConfigStage.COMPLETE))
    return host


@pytest.mark.parametrize(
    "other_ppod,other_vpod",
    [
        (PpodInfo(1, 1, 1, 4, U), VpodInfo(1, 2, AddrMode.SOURCE_IDENTIFICATION,
                                          frozenset({0, 1}))),
        (PpodInfo(1, 1, 1, 4, U), VpodInfo(2, 2, SA, frozenset({0, 1}))),
        (PpodInfo(1, 1, 1, 4, uuid.UUID(int=99)), VpodInfo(1, 2, SA, frozenset({0, 1}))),
        (PpodInfo(1, 1, 1, 3, U), VpodInfo(1, 2, SA, frozenset({0, 1}))),
    ],
    ids=["addr-mode", "vpod-id", "ppod-uuid", "ppod-size"],
)
def test_vpod_disagreement_blocks_activation(other_ppod, other_vpod, caplog):
    """§5.10: local members must agree on pPod UUID/size, vPod id/size, addr mode and the
    bitmap; otherwise nobody is activated and the failure is logged."""
    caplog.set_level("ERROR")
    host = _host_with([VPOD, other_vpod], [PPOD, other_ppod])
    host.late_init()
    assert [m.state for m in host.managers] == [S.READY, S.READY]
    assert any("disagree" in r.getMessage() for r in caplog.records)


def test_duplicate_local_accel_ids_block_activation():
    """§5.10: accel ids must be unique among the host's GPUs."""
    host = _host_with([VPOD, VPOD], [PPOD, PPOD])
    host.late_init()
    assert [m.state for m in host.managers] == [S.READY, S.READY]


def test_agreeing_members_activate():
    """§5.10: the same setup with agreeing members activates both."""
    host = _host_with([VPOD, VPOD], [PPOD, PpodInfo(1, 1, 1, 4, U)])
    host.late_init()
    assert [m.state for m in host.managers] == [S.ACTIVE, S.ACTIVE]
    assert [m.local_accels for m in host.managers] == [[0, 1], [1, 0]]
    assert host.by_accel_id(1) is host.managers[1]
    assert host.by_accel_id(2) is None


def test_member_in_error_with_agreeing_info_is_bounced_back_to_active():
    """§5.10: only a member *below* VPOD_CONFIGURED defers the activation; one in ERROR
    whose pPod/vPod info agrees is deactivated and activated with the rest (§5.9)."""
    host = _host_with([VPOD, VPOD], [PPOD, PpodInfo(1, 1, 1, 4, U)])
    host.managers[0].state, host.managers[1].state = S.READY, S.ERROR
    host.activate_vpod(host.managers[0])
    assert [m.state for m in host.managers] == [S.ACTIVE, S.ACTIVE]


def test_membership_change_bounces_and_tears_down_exports():
    """§5.10 / §6.9: a changed bitmap deactivates and reactivates the accel; its exports
    are torn down (old handles → EINVAL) while GEM handles survive."""
    core = make_node(pod_config(nodes=[[{"id": 0}], [{"id": 5}, {"id": 6}]],
                                vpods=[{"id": 1, "members": [0, 5]}]))
    m = next(iter(core.managers.values()))
    f = open_file(core)
    h = gem_create(f)
    lo, hi = ualink_export(f, h)
    m.vpod = VpodInfo(1, 3, SA, frozenset({0, 5, 6}))
    core.host.activate_vpod(m)
    assert m.state is S.ACTIVE
    assert m.active_snapshot == frozenset({0, 5, 6})
    assert m.exports == {}
    assert f.handles[h].ualink_handle_lo == 0
    assert ualink_import_raw(f, lo, hi).result == -errno.EINVAL
    lo2, _ = ualink_export(f, h)
    assert lo2 != lo and lo2 in m.exports
    assert len(device(core).objects) == 1


def test_unchanged_membership_keeps_exports():
    """§5.9: an activation pass with the same bitmap leaves an ACTIVE accel alone."""
    core = make_node(pod_config(nodes=[[{"id": 0}], [{"id": 5}]]))
    m = next(iter(core.managers.values()))
    f = open_file(core)
    lo, _ = ualink_export(f, gem_create(f))
    core.host.activate_vpod(m)
    assert lo in m.exports


def test_deactivate_stops_manager_and_ioctl():
    """§5.9 / §6.9: deactivate → PPOD_CONFIGURED, exports torn down, ioctl EOPNOTSUPP;
    deactivate below ACTIVE is a no-op."""
    core = make_node(pod_config(nodes=[[{"id": 0}], [{"id": 5}]]))
    m = next(iter(core.managers.values()))
    f = open_file(core)
    h = gem_create(f)
    ualink_export(f, h)
    m.deactivate()
    assert m.state is S.PPOD_CONFIGURED
    assert m.exports == {}
    assert ualink_export_raw(f, h).result == -errno.EOPNOTSUPP
    m.deactivate()
    assert m.state is S.PPOD_CONFIGURED
    f.release()
    assert device(core).objects == {}


# -- the one table (ualink/state.py ACCEL_TRANSITIONS) --------------------------------------------


@pytest.mark.parametrize("current", list(S))
def test_activate_deactivate_and_commit_rows(current):
    """§5.9: activate_accelerator is a no-op on ACTIVE only; deactivate_accelerator acts on
    ACTIVE and ERROR (→ PPOD_CONFIGURED); setup/commit (§7.1) follows the pPod's validity."""
    from ualinkd.ualink.state import AccelEvent, accel_transition

    assert accel_transition(current, AccelEvent.ACTIVATE, PPOD, VPOD) is S.ACTIVE
    want = S.PPOD_CONFIGURED if current >= S.ACTIVE else current
    assert accel_transition(current, AccelEvent.DEACTIVATE, PPOD, VPOD) is want
    assert accel_transition(current, AccelEvent.PPOD_COMMIT, PPOD, VPOD) is S.PPOD_CONFIGURED
    assert accel_transition(current, AccelEvent.PPOD_COMMIT, PPOD_SIZE0, VPOD) is S.UNCONFIGURED
    assert accel_transition(current, AccelEvent.CONFIG_REFUSED, PPOD, VPOD) is S.ERROR


@pytest.mark.parametrize("name", sorted(BAD_VPODS))
def test_the_refusal_explained_is_the_check_that_failed(name):
    """config/commit's EINVAL (§7.1) and ualinkctl's sentence come from the same checks:
    each invalid vPod is refused with the sentence of its own check, a valid one is not."""
    from ualinkd.ualink.state import config_refusal

    why = config_refusal(S.PPOD_CONFIGURED, PPOD, BAD_VPODS[name])
    assert why is not None and not BAD_VPODS[name].valid_for(PPOD)
    words = {"size0": "the pPod only", "bigger-than-ppod": "the pPod only",
             "addr-mode-invalid": "addr_mode", "popcount-differs": "members are listed",
             "not-a-member": "among its members"}
    assert words[name] in why
    assert config_refusal(S.PPOD_CONFIGURED, PPOD, VPOD) is None
    assert config_refusal(S.ERROR, PPOD, VPOD) is None  # error is not refused for its state
    assert "committed pPod" in (config_refusal(S.UNCONFIGURED, PPOD, VPOD) or "")
    assert config_refusal(S.PPOD_CONFIGURED, PPOD, NO_VPOD) is None  # leaving: never refused
