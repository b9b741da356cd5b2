"""The UALINK_HANDLE ioctl: prologue, export, handle format, revoke and local import
(spec §1.4–§1.6, §3, §6.1, §6.4, §6.8, Emulator policy 4)."""

from __future__ import annotations

import errno
import struct

import pytest
import ualink_testkit as kit

from ualinkd.abi import constants as c
from ualinkd.amdgpu.bo import AmdgpuBo
from ualinkd.ualink.state import AccelState

TWO_LOCAL = {"nodes": [[{"id": 0}, {"id": 1}], [{"id": 5}, {"id": 7}]],
             "vpods": [{"id": 1, "members": [0, 1, 5]}]}


@pytest.fixture
def core():
    return kit.make_node(kit.pod_config(**TWO_LOCAL))


def mgr(core, i=0):
    return list(core.managers.values())[i]


# ---- prologue (§1.6 steps 1–2) --------------------------------------------------------------


@pytest.mark.parametrize(
    "pod",
    [
        {"nodes": [[{"id": 0, "stage": "ppod"}]], "vpods": [{"id": 1, "members": [0]}]},
        {"nodes": [[{"id": 0}]], "vpods": []},
        {"nodes": [[{"id": 0}], [{"id": 5}]], "size": 1},
        {"nodes": [[{"id": 0, "stage": "idle"}]]},
    ],
    ids=["stage-ppod", "no-vpod", "vpod-invalid-error", "stage-idle"],
)
@pytest.mark.parametrize("op", [0, 1, 7])
def test_not_active_is_eopnotsupp_before_op(pod, op):
    """§1.6 step 1 / §11.1: not ACTIVE → EOPNOTSUPP, even for an unknown op; all 24 bytes
    are echoed."""
    core = kit.make_node(kit.pod_config(**pod))
    assert mgr(core).state != AccelState.ACTIVE
    f = kit.open_file(core)
    h = kit.gem_create(f)
    data = struct.pack("<IIIIQ", op, 0, h, 0xABCD, 0x1122334455667788)
    r = kit.ioctl(f, kit.UALINK, data)
    assert (r.result, r.out) == (-errno.EOPNOTSUPP, data)


@pytest.mark.parametrize("op", [2, 7, 0xFFFFFFFF])
def test_unknown_op_when_active_is_einval_echoed(f, op):
    """§1.6 step 2: op not 0/1 → EINVAL; nothing written (§1.4)."""
    data = struct.pack("<IIQQ", op, 0x55, 0x0102030405060708, 0x1112131415161718)
    r = kit.ioctl(f, kit.UALINK, data)
    assert (r.result, r.out) == (-errno.EINVAL, data)


# ---- export (§1.6 E1–E7) ----------------------------------------------------------------------


def test_export_unknown_handle_is_enoent(f):
    """§1.6 E1."""
    data = struct.pack("<III", 0, 0, 3) + b"\xee" * 12
    r = kit.ioctl(f, kit.UALINK, data)
    assert (r.result, r.out) == (-errno.ENOENT, data)


@pytest.mark.parametrize("domains", [c.DOMAIN_GTT, c.DOMAIN_CPU, c.DOMAIN_GTT | c.DOMAIN_CPU])
def test_export_non_vram_bo_is_eopnotsupp(f, domains):
    """§1.6 E2: preferred domains without VRAM → EOPNOTSUPP."""
    h = kit.gem_create(f, domains=domains)
    assert kit.ualink_export_raw(f, h).result == -errno.EOPNOTSUPP


def test_export_vm_always_valid_is_eperm(core, f):
    """§1.6 E5: the export-time dma-buf is refused for VM_ALWAYS_VALID → EPERM, no entry."""
    h = kit.gem_create(f, flags=c.CREATE_VM_ALWAYS_VALID)
    assert kit.ualink_export_raw(f, h).result == -errno.EPERM
    assert mgr(core).exports == {}
    assert f.handles[h].ualink_handle_lo == 0


def test_export_success_writes_bytes_0_to_15_only(core, f):
    """§1.4: EXPORT success writes handle_lo, handle_hi; bytes 16–23 are echoed; flags are
    ignored (§1.5)."""
    h = kit.gem_create(f)
    tail = b"\x00" * 4 + b"\x77" * 8
    r = kit.ualink_export_raw(f, h, flags=0xFFFFFFFF, tail=tail)
    assert r.result == 0
    lo, hi = struct.unpack("<QQ", r.out[:16])
    assert r.out[16:] == b"\x77" * 8
    entry = mgr(core).exports[lo]
    assert (entry.handle_lo, entry.handle_hi, entry.bo) == (lo, hi, f.handles[h])
    assert lo != 0 and lo & 0x3FF == 0


def test_export_does_not_pin_and_holds_references(core, f):
    """§6.1 / §11.4: export holds one BO reference and the export-time dma-buf, no pin;
    the dma-buf is the file's PRIME export of that handle."""
    h = kit.gem_create(f)
    b = f.handles[h]
    assert isinstance(b, AmdgpuBo)
    before = b.refcount
    lo, _ = kit.ualink_export(f, h)
    entry = mgr(core).exports[lo]
    assert b.pin_count == 0
    assert b.refcount == before + 2  # the entry + its dma-buf
    assert b.dma_buf is entry.buf is f.prime_by_handle[h]
    key = kit.open_token(core, kit.prime_to_token(f, h))
    assert core.tokens.resolve(key) is entry.buf


def test_export_is_idempotent_per_bo_across_files(core, f):
    """§3.4 / §1.6 E3: a second export, from the same or another file (BO reached via
    PRIME), returns the same handle; one entry."""
    h = kit.gem_create(f)
    first = kit.ualink_export(f, h)
    assert kit.ualink_export(f, h) == first
    g = kit.open_file(core)
    hg = kit.prime_from_fd(g, kit.open_token(core, kit.prime_to_token(f, h)))
    assert kit.ualink_export(g, hg) == first
    assert list(mgr(core).exports) == [first[0]]


def test_export_from_second_accel_carries_its_id(core):
    """§3.2: bits 9..0 of handle_lo are the exporting accel's id."""
    g = kit.open_file(core, 1)
    lo, _ = kit.ualink_export(g, kit.gem_create(g))
    assert lo & 0x3FF == 1
    assert lo in mgr(core, 1).exports and mgr(core).exports == {}


# ---- handle generation (§3.2) ---------------------------------------------------------------


def test_handle_generation_retries_zero_and_collision():
    """§3.2: handle_lo = random with bits 9..0 = accel id; a value giving lo == 0 (accel 0)
    and a value colliding with a live export are both redrawn; handle_hi is drawn after and
    may be 0."""
    bits = kit.ScriptedBits()
    core = kit.make_node(kit.pod_config(nodes=[[{"id": 0}]]), randbits=bits)
    f = kit.open_file(core)
    h1, h2 = kit.gem_create(f), kit.gem_create(f)
    bits.values = [0x3FF, 0xAAAA_BBBB_CCCC_DDDD, 0]
    bits.calls.clear()
    lo1, hi1 = kit.ualink_export(f, h1)
    assert (lo1, hi1) == (0xAAAA_BBBB_CCCC_DC00, 0)
    assert bits.calls == [64, 64, 64]
    bits.values = [0xAAAA_BBBB_CCCC_DFFF, 0x1234_5678_9ABC_DEF0, 0x42]
    bits.calls.clear()
    lo2, hi2 = kit.ualink_export(f, h2)
    assert (lo2, hi2) == (0x1234_5678_9ABC_DC00, 0x42)
    assert bits.calls == [64, 64, 64]


# ---- revoke (§6.4, §1.6 I2b) ----------------------------------------------------------------


def test_revoke_when_handle_count_hits_zero(core, f):
    """§6.4: the last GEM handle going revokes the export: entry gone, references dropped,
    BO freed; a later local import → EINVAL (§1.6 I2b)."""
    h = kit.gem_create(f)
    lo, hi = kit.ualink_export(f, h)
    dev = kit.device(core)
    assert len(dev.objects) == 1
    kit.gem_close(f, h)
    assert mgr(core).exports == {}
    assert dev.objects == {}
    assert dev.driver.vram.used == 0
    r = kit.ualink_import_raw(f, lo, hi)
    assert r.result == -errno.EINVAL
    assert r.out == struct.pack("<IIQQ", 1, 0, lo, hi)


def test_no_revoke_while_another_file_holds_a_handle(core, f):
    """§6.4 / §6.6: handles in other files (self-import via PRIME) keep the export alive."""
    h = kit.gem_create(f)
    lo, hi = kit.ualink_export(f, h)
    g = kit.open_file(core)
    key = kit.open_token(core, kit.prime_to_token(f, h))
    kit.prime_from_fd(g, key)
    core.tokens.release(key)
    f.release()
    assert lo in mgr(core).exports
    key2 = kit.open_token(core, kit.ualink_import(g, lo, hi))
    g.release()
    assert mgr(core).exports == {}
    assert len(kit.device(core).objects) == 1  # the opened import dma-buf holds the BO
    core.tokens.release(key2)
    assert kit.device(core).objects == {}


def test_local_import_fd_outlives_revoke(core, f):
    """§6.8: a dma-buf handed out by a local import keeps the BO alive after revoke."""
    h = kit.gem_create(f)
    lo, hi = kit.ualink_export(f, h)
    key = kit.open_token(core, kit.ualink_import(f, lo, hi))
    b = f.handles[h]
    kit.gem_close(f, h)
    assert mgr(core).exports == {}
    assert kit.device(core).objects == {b.id: b}
    g = kit.open_file(core)
    hg = kit.prime_from_fd(g, key)
    assert g.handles[hg] is b and b.handle_count == 1
    core.tokens.release(key)
    g.release()
    assert kit.device(core).objects == {}


# ---- local import (§1.6 I1–I2c, §6.8) ---------------------------------------------------------


def test_import_success_writes_bytes_0_to_3_only(f):
    """§1.4: IMPORT success writes the fd (token) in bytes 0–3; flags, handle_lo and
    handle_hi are echoed."""
    lo, hi = kit.ualink_export(f, kit.gem_create(f))
    r = kit.ualink_import_raw(f, lo, hi, flags=0xF00D)
    assert r.result == 0
    token = struct.unpack("<I", r.out[:4])[0]
    assert token != 0
    assert r.out[4:] == struct.pack("<IQQ", 0xF00D, lo, hi)


def test_local_self_import_resolves_to_original_bo(core, f):
    """§1.6 I2c / §2.5: own-accel import → the export-time dma-buf; PRIME_FD_TO_HANDLE on
    the same device is the original BO (same handle in the same file, handle_count 2 in
    another)."""
    h = kit.gem_create(f)
    lo, hi = kit.ualink_export(f, h)
    key = kit.open_token(core, kit.ualink_import(f, lo, hi))
    assert core.tokens.resolve(key) is mgr(core).exports[lo].buf
    assert kit.prime_from_fd(f, key) == h
    g = kit.open_file(core)
    hg = kit.prime_from_fd(g, key)
    assert g.handles[hg] is f.handles[h]
    assert f.handles[h].handle_count == 2
    assert f.handles[h].pin_count == 0


def test_local_import_from_other_local_accel(core, f):
    """§1.6 I2 / §5.10: accel 1 imports accel 0's handle locally; on accel 1's device the
    dma-buf becomes a GTT import BO, which is not UALink-exportable (EOPNOTSUPP); on
    accel 0's device it is the original BO."""
    h = kit.gem_create(f)
    lo, hi = kit.ualink_export(f, h)
    g = kit.open_file(core, 1)
    key = kit.open_token(core, kit.ualink_import(g, lo, hi))
    hg = kit.prime_from_fd(g, key)
    imp = g.handles[hg]
    assert isinstance(imp, AmdgpuBo)
    assert imp is not f.handles[h]
    assert imp.preferred_domains == c.DOMAIN_GTT
    assert imp.import_buf is mgr(core).exports[lo].buf
    assert kit.ualink_export_raw(g, hg).result == -errno.EOPNOTSUPP
    f2 = kit.open_file(core, 0)
    assert f2.handles[kit.prime_from_fd(f2, key)] is f.handles[h]


@pytest.mark.parametrize("accel", [0x100, 0x1FF, 0x3FF])
def test_import_exporter_id_256_or_more_is_einval(f, accel):
    """§1.6 I1: exporter id = handle_lo & 0x3FF ≥ 256 → EINVAL, echoed."""
    r = kit.ualink_import_raw(f, 0xABCD_0000_0000_0000 | accel, 5)
    assert r.result == -errno.EINVAL
    assert r.out == struct.pack("<IIQQ", 1, 0, 0xABCD_0000_0000_0000 | accel, 5)


def test_import_handle_hi_mismatch_is_einval(f):
    """§1.6 I2b: a live handle_lo with the wrong handle_hi → EINVAL."""
    lo, hi = kit.ualink_export(f, kit.gem_create(f))
    assert kit.ualink_import_raw(f, lo, hi ^ 1).result == -errno.EINVAL
    assert kit.ualink_import_raw(f, lo ^ 0x400, hi).result == -errno.EINVAL


def test_import_unknown_local_handle_is_einval(core):
    """§1.6 I2b: no live export with that handle_lo on the local exporter."""
    f = kit.open_file(core)
    assert kit.ualink_import_raw(f, 0x5000 | 1, 0).result == -errno.EINVAL


def test_import_local_accel_without_gpu_is_enodev(core, f):
    """§1.6 I2a: an id in local_accels with no local GPU → ENODEV."""
    mgr(core).local_accels.append(3)
    assert kit.ualink_import_raw(f, 0x7000 | 3, 0).result == -errno.ENODEV


def test_import_from_outside_the_vpod_is_eacces(core, f, caplog):
    """Emulator policy 4: an exporter outside this accel's vPod → EACCES, and one log line
    naming both accel ids and the vPod."""
    caplog.set_level("WARNING")
    data = struct.pack("<IIQQ", 1, 0, 0xBEEF_0000_0000_0000 | 7, 9)
    r = kit.ioctl(f, kit.UALINK, data)
    assert (r.result, r.out) == (-errno.EACCES, data)
    msgs = [rec.getMessage() for rec in caplog.records]
    assert any("7" in m and "vPod 1" in m and "accel 0" in m for m in msgs), msgs


def test_import_token_dropped_with_its_file(core, f):
    """Policy 5: an unopened import token dies with its DrmFile; the dma-buf reference
    returns."""
    h = kit.gem_create(f)
    lo, hi = kit.ualink_export(f, h)
    buf = mgr(core).exports[lo].buf
    before = buf.refcount
    g = kit.open_file(core)
    token = kit.ualink_import(g, lo, hi)
    assert buf.refcount == before + 1
    g.release()
    assert buf.refcount == before
    assert core.tokens.pending_count == 0
    with pytest.raises(OSError) as e:
        kit.open_token(core, token)
    assert e.value.errno == errno.ENOENT
