"""Per-BO and per-export memory shape (issue 15 item 3: at most 1 KiB of daemon memory per
live export). What a BO, its bo_va and its export hold must not grow with per-object
containers that nearly every BO leaves empty."""

from __future__ import annotations

import gc
import tracemalloc

from ualink_testkit import gem_create, make_node, open_file, pod_config, ualink_export

from ualinkd.amdgpu import bo as bo_mod


def _bos(n: int) -> tuple[object, list[int]]:
    core = make_node(pod_config())
    f = open_file(core)
    return f, [gem_create(f, 1 << 20) for _ in range(n)]


def test_bo_vas_without_mappings_share_one_empty_set() -> None:
    """amdgpu_gem_object_open adds a bo_va per file and BO; most never get a mapping, so
    they share one empty set, and the first GEM_VA MAP gives that bo_va a set of its own."""
    f, (a, b) = _bos(2)
    vm = f.device.driver.vm(f)  # type: ignore[attr-defined]
    drv = f.device.driver  # type: ignore[attr-defined]
    va_a, va_b = vm.bo_find(drv.lookup_bo(f, a)), vm.bo_find(drv.lookup_bo(f, b))
    assert va_a.mappings is va_b.mappings and not va_a.mappings
    m = vm.bo_map(va_a, 1 << 30, 0, 1 << 20, 0)
    assert set(va_a.mappings) == {m} and not va_b.mappings
    vm.bo_unmap(va_a, 1 << 30)
    assert not va_a.mappings and not va_b.mappings and len(vm) == 0


def test_bos_share_their_size_and_flags_ints_and_handle_free_hook() -> None:
    f, (a, b) = _bos(2)
    drv = f.device.driver  # type: ignore[attr-defined]
    x, y = drv.lookup_bo(f, a), drv.lookup_bo(f, b)
    assert x.size == y.size == 1 << 20
    assert x.size is y.size and x.flags is y.flags
    assert x.on_handle_free is y.on_handle_free


def test_shared_ints_are_bounded() -> None:
    """A client making BOs of ever new sizes must not grow the shared table without end."""
    base = 1 << 40
    for i in range(bo_mod._SHARED_INTS_MAX + 10):
        assert bo_mod.shared_int(base + i) == base + i
    assert len(bo_mod._SHARED_INTS) <= bo_mod._SHARED_INTS_MAX


def test_a_live_export_costs_under_1_kib() -> None:
    """GEM_CREATE + UALink export of a 4 KiB VRAM BO, 5000 times: what stays allocated
    per export (the BO, its handle, bo_va, dma-buf, PRIME cache and export entry, and their
    table slots) is under 1 KiB. Memory, not time: tracemalloc counts bytes exactly."""
    core = make_node(pod_config())
    f = open_file(core)
    for _ in range(100):  # warm the tables and caches first
        ualink_export(f, gem_create(f, 4096))
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        n = 5000
        for _ in range(n):
            ualink_export(f, gem_create(f, 4096))
        gc.collect()
        per = (tracemalloc.get_traced_memory()[0] - before) / n
    finally:
        tracemalloc.stop()
    print(f"{per:.0f} bytes per live export")
    assert per < 1024, f"{per:.0f} bytes per live export"


def test_exports_share_an_empty_importers_dict_until_the_first_import() -> None:
    """§5.6: the first NPA_REQ makes the requester an importer of that export alone; the
    other exports (which share one empty importers dict to save 64 bytes each) stay empty,
    and a revoke/release leaves the shared one empty."""
    from test_manager_rules import exporter, request

    core, mgr, f, h, lo, hi = exporter()
    lo2, _ = ualink_export(f, gem_create(f, 1 << 20))
    a, b = mgr.exports[lo], mgr.exports[lo2]
    assert a.importers is b.importers and not a.importers
    request(mgr, 1, lo, hi)
    assert list(a.importers) == [1] and not b.importers
    assert a.importers is not b.importers
    mgr.check_invariants()
