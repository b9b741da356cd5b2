"""Protocol rules driven straight through one manager (sans-IO). Exporter: failed NPA_RSP
sends (§5.6 step 7), pins per importer bit (§5.6, §6.10 quirk "alias-extra-pins"), what a
manager stop leaves in the BO (§3.4, §6.9, §6.10 quirk "stale-export-handle"). Importer:
NPA_REVOKE against an import still in flight (§5.5, §5.7)."""

from __future__ import annotations

import dataclasses
import errno

import pytest
from ualink_testkit import (
    connected_export,
    gem_create,
    make_node,
    open_file,
    pod_config,
    ualink_export,
)

from ualinkd.drm.errors import DrmError
from ualinkd.ualink import protocol as p
from ualinkd.ualink.manager import Send
from ualinkd.ualink.peers import ConnEvent, ConnState

THREE = {"nodes": [[{"id": 0}], [{"id": 1}], [{"id": 2}]]}


def exporter(quirks=()):
    core = make_node(pod_config(**THREE, quirks=list(quirks)))
    mgr = core.managers[128]
    for remote in (1, 2):  # connections up, as after HELLO / HELLO_ACK
        mgr.conn(remote).apply(ConnEvent.SETUP)
        mgr.conn(remote).apply(ConnEvent.HELLO_ACK)
        assert mgr.conn(remote).state == ConnState.ESTABLISHED
    f = open_file(core)
    h = gem_create(f, size=1 << 20)
    lo, hi = ualink_export(f, h)
    return core, mgr, f, h, lo, hi


def request(mgr, src: int, lo: int, hi: int) -> Send:
    mgr.receive(src, p.NpaReq(p.handle_lo_bits(lo), hi))
    (eff,) = mgr.take_effects()
    assert isinstance(eff, Send) and isinstance(eff.msg, p.NpaRsp)
    return eff


def test_failed_rsp_sends_free_the_shared_npa():
    """§5.6 step 7 (source-aliasing): two importers' grants in flight share one NPA; when
    both NPA_RSP sends fail, neither is an importer, the BO is unpinned and the shared NPA
    is unmapped and freed (not left behind because the second grant did not allocate it)."""
    core, mgr, f, h, lo, hi = exporter()
    first, second = request(mgr, 1, lo, hi), request(mgr, 2, lo, hi)
    entry = mgr.exports[lo]
    assert entry.bo.pin_count == 2 and mgr.npa_import_pages == 256
    mgr.on_sent(first, DrmError(errno.ETIME))
    assert list(entry.importers) == [2] and mgr.npa_import_pages == 256
    mgr.on_sent(second, DrmError(errno.ETIME))
    assert not entry.importers and entry.bo.pin_count == 0
    assert entry.shared_npa is None and mgr.npa_import_pages == 0 and len(mgr.npa_table) == 0
    mgr.check_invariants()


def test_repeated_alias_request_pins_once_by_contract():
    """§5.6 step 4, policy 1: a repeated NPA_REQ from an importer in source-aliasing mode
    gets the same NPA back and leaves no extra pin; a reset unpins it."""
    core, mgr, f, h, lo, hi = exporter()
    request(mgr, 1, lo, hi)
    request(mgr, 1, lo, hi)
    entry = mgr.exports[lo]
    assert entry.bo.pin_count == 1
    mgr.connection_reset(1, ConnState.NOT_READY, mgr.conn(1).generation)
    assert entry.bo.pin_count == 0 and mgr.npa_import_pages == 0


def test_alias_extra_pins_quirk_leaves_the_extra_pin():
    """§6.10, policy 2 ("alias-extra-pins"): the reference build pins once per granted
    NPA_REQ but unpins once per importer bit, so after a reset the extra pin is still
    there."""
    core, mgr, f, h, lo, hi = exporter(["alias-extra-pins"])
    request(mgr, 1, lo, hi)
    request(mgr, 1, lo, hi)
    entry = mgr.exports[lo]
    assert entry.bo.pin_count == 2
    mgr.connection_reset(1, ConnState.NOT_READY, mgr.conn(1).generation)
    assert not entry.importers and entry.bo.pin_count == 1
    mgr.check_invariants()


def test_stop_clears_the_handle_of_an_export_with_importers_even_with_the_quirk():
    """§3.4, §6.10: only an export *without* importers keeps its stale handle_lo across a
    revoke or a manager stop ("stale-export-handle"); one with importers is cleared, so the
    surviving BO gets a fresh, usable handle after reactivation."""
    core, mgr, f, h, lo, hi = exporter(["stale-export-handle"])
    request(mgr, 1, lo, hi)
    bo = mgr.exports[lo].bo
    mgr.deactivate()
    assert bo.ualink_handle_lo == 0 and bo.pin_count == 0
    mgr.activate()
    lo2, hi2 = ualink_export(f, h)
    assert lo2 in mgr.exports and mgr.exports[lo2].handle_hi == hi2


# ---- the importer's side ---------------------------------------------------------------------


def importer():
    core = make_node(pod_config(**THREE), node="node1")
    mgr = core.managers[128]
    mgr.conn(0).apply(ConnEvent.SETUP)
    mgr.conn(0).apply(ConnEvent.HELLO_ACK)
    return core, mgr


def test_revoke_overtaking_the_answer_fails_the_import():
    """§5.7 "NPA_REVOKE receipt", §5.5: the exporter records an importer before its NPA_RSP
    is delivered, so a revoke can arrive while the import still waits (NOT_READY) or has
    its answer but no BO yet (PENDING). The node is torn down and NPA_RELEASE is sent (the
    exporter would otherwise time out and reset the connection); the waiter fails with
    EINVAL, and no dead READY node is left for the dedupe path to hand out."""
    lo, hi = 0x1234_5678_9ABC_0000, 0x42  # exporter accel 0
    for answered in (False, True):
        core, mgr = importer()
        node = mgr.import_begin(lo, hi)
        if answered:
            mgr.receive(0, p.NpaRsp(p.handle_lo_bits(lo), 256, 0x800))
            mgr.take_effects()
        mgr.receive(0, p.NpaRevoke(p.handle_lo_bits(lo), hi))
        sends = [e for e in mgr.take_effects() if isinstance(e, Send)]
        assert [(s.dst, type(s.msg).__name__) for s in sends] == [(0, "NpaRelease")]
        assert lo not in mgr.imports
        with pytest.raises(DrmError) as e:
            mgr.import_finish(node)
        assert e.value.errno == errno.EINVAL
        mgr.import_abort(node)
        assert not mgr.imports and core.live_objects() == 0


def test_revoke_with_wrong_handle_hi_is_dropped_without_release():
    """§5.5, §5.7: NPA_REVOKE with a wrong handle_hi (or for an unknown handle) is dropped
    without NPA_RELEASE; the waiting import is untouched."""
    lo, hi = 0x1234_5678_9ABC_0000, 0x42
    core, mgr = importer()
    mgr.import_begin(lo, hi)
    mgr.receive(0, p.NpaRevoke(p.handle_lo_bits(lo), hi ^ 1))
    mgr.receive(0, p.NpaRevoke(p.handle_lo_bits(lo ^ 0x400), hi))
    assert not mgr.take_effects() and lo in mgr.imports


def test_npa_values_on_the_wire_per_addressing_mode():
    """§4.2: source-aliasing takes a 2-page write-back area from its allocator at activation,
    so the first BO's NPA is 0x802 and a 2 MiB-aligned BO lands on the next 512-page
    boundary; source-identification allocates in the importer's segment above its 512
    reserved pages."""
    core, mgr, f, h, lo, hi = exporter()
    assert request(mgr, 1, lo, hi).msg.npa_offset == 0x802
    big = gem_create(f, size=4 << 20)
    lo2, hi2 = ualink_export(f, big)
    assert request(mgr, 1, lo2, hi2).msg.npa_offset == 0xA00
    assert mgr.npa_import_pages == 256 + 1024  # the write-back area is not an import's
    mgr.check_invariants()
    core, mgr, f, lo, hi = connected_export(pod_config(nodes=THREE["nodes"], vpods=[
        {"id": 1, "members": [0, 1, 2], "addr_mode": "source-identification"}]))
    assert request(mgr, 2, lo, hi).msg.npa_offset == 0x200  # offset in accel 2's segment


def test_repeated_alias_request_records_the_current_generation():
    """§5.6 step 4: a repeated source-aliasing NPA_REQ marks the requester as importer with
    the *current* generation, so a later revoke still reaches it (visible with the
    hello-no-reset quirk, where a new HELLO keeps the old record)."""
    core, mgr, f, h, lo, hi = exporter(quirks=["hello-no-reset"])
    request(mgr, 1, lo, hi)
    gen = mgr.conn(1).generation
    mgr.receive(1, p.Hello(0, 1))  # the importer reconnects: generation 2, nothing reset
    for eff in mgr.take_effects():
        if isinstance(eff, Send):  # the HELLO_ACK went out
            mgr.on_sent(eff, None, 0.0)
    mgr.take_effects()  # the wake-up of a local setup waiting for it (none here)
    assert mgr.conn(1).state == ConnState.ESTABLISHED and mgr.conn(1).generation == gen + 1
    gen += 1
    request(mgr, 1, lo, hi)
    assert mgr.exports[lo].importers[1].generation == gen


def _small_vram_exporter():
    """Accel 0 with 2 MiB of VRAM and 4 MiB of GTT; connections to accels 1 and 2 up."""
    nodes = [[{"id": 0, "vram_size": 2 << 20, "gtt_size": 4 << 20}], [{"id": 1}], [{"id": 2}]]
    core = make_node(pod_config(nodes=nodes))
    mgr = core.managers[128]
    for remote in (1, 2):
        mgr.conn(remote).apply(ConnEvent.SETUP)
        mgr.conn(remote).apply(ConnEvent.HELLO_ACK)
    return core, mgr, open_file(core)


def test_pin_moves_the_bo_into_vram_evicting_unpinned_ones():
    """§5.6 step 3, §4.4: the exported BO is pinned in VRAM; one that sits in GTT (a VRAM|GTT
    fallback) is moved there, unpinned VRAM BOs making room in GTT."""
    core, mgr, f = _small_vram_exporter()
    other = f.handles[gem_create(f, size=1 << 20)]  # VRAM, never exported
    h = gem_create(f, size=2 << 20)  # no room: placed in GTT, preferred VRAM|GTT
    bo = f.handles[h]
    drv = mgr.driver
    assert (other.placement, bo.placement) == (drv.vram, drv.gtt)
    lo, hi = ualink_export(f, h)
    request(mgr, 1, lo, hi)
    assert (other.placement, bo.placement) == (drv.gtt, drv.vram)
    assert (drv.vram.used, drv.gtt.used) == (2 << 20, 1 << 20)
    assert bo.pin_count == 1


def test_pin_that_vram_cannot_take_is_npa_fail_error():
    """§5.6 step 3: "Pin it in VRAM; failure → NPA_FAIL(ERROR)" (the importer's EINVAL,
    §1.6 I16) when VRAM is held by pinned BOs; nothing is pinned or allocated."""
    core, mgr, f = _small_vram_exporter()
    first = gem_create(f, size=1 << 20)
    lo1, hi1 = ualink_export(f, first)
    request(mgr, 1, lo1, hi1)  # pinned in VRAM
    h = gem_create(f, size=2 << 20)  # in GTT
    lo, hi = ualink_export(f, h)
    mgr.receive(2, p.NpaReq(p.handle_lo_bits(lo), hi))
    (eff,) = mgr.take_effects()
    assert isinstance(eff.msg, p.NpaFail) and eff.msg.reason == p.NpaFailReason.ERROR
    assert f.handles[h].pin_count == 0 and f.handles[h].placement is mgr.driver.gtt
    assert mgr.npa_import_pages == 256  # only the first BO's
    mgr.check_invariants()


def test_messages_are_taken_from_the_accels_of_the_activation():
    """Policy 4, §5.10: per-peer resources exist for the bitmap the accel was activated with.
    A config update whose activation pass has not run (deferred) changes the recorded vPod
    but not whom the accel hears: accel 2, still in the activation's bitmap, is answered."""
    core, mgr, f, h, lo, hi = exporter()
    mgr.vpod = dataclasses.replace(mgr.vpod, vpod_size=2, active_accels=frozenset({0, 1}))
    assert isinstance(request(mgr, 2, lo, hi).msg, p.NpaRsp)
    mgr.active_snapshot = frozenset({0, 1})  # as after an activation with the new bitmap
    mgr.receive(2, p.NpaReq(p.handle_lo_bits(lo), hi))
    assert mgr.take_effects() == []  # dropped (and logged)


def test_a_flood_of_one_cause_is_logged_with_a_count(caplog):
    """Issue 10 item 4: 2000 NPA_RELEASEs for handles nobody revokes (a burst that outlived
    its revokes) log the first and then the 10th, 100th, 1000th with the count, not 2000
    lines; and a revoke timing out towards an importer that never released logs once, with
    the connection reset, counting the other revokes waiting on it."""
    import logging

    core, mgr, f, h, lo, hi = exporter()
    with caplog.at_level(logging.INFO, "ualinkd.ualink.manager"):
        for i in range(2000):
            mgr.receive(1, p.NpaRelease((i + 1) << 10, 7))
    lines = [r.getMessage() for r in caplog.records if "NPA_RELEASE" in r.getMessage()]
    assert len(lines) == 4
    assert lines[-1].endswith("(1000 times so far)")
    caplog.clear()
    entries = []
    for _ in range(5):  # five exports imported by accel 1, all revoked, none released
        g = gem_create(f, size=1 << 20)
        elo, ehi = ualink_export(f, g)
        request(mgr, 1, elo, ehi)
        entries.append(mgr.exports[elo])
    for entry in entries:
        mgr.revoke(entry.bo)
    mgr.take_effects()
    with caplog.at_level(logging.INFO, "ualinkd.ualink.manager"):
        for entry in entries:
            assert mgr.revoke_finish(entry) == [1]
    never = [r.getMessage() for r in caplog.records if "never released" in r.getMessage()]
    assert len(never) == 1 and "nor 4 other handles" in never[0]
    assert mgr.conn(1).state == ConnState.NOT_READY
    mgr.check_invariants()
