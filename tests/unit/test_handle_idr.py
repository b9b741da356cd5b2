"""drm/idr.py: the one handle allocator of GEM handles and syncobjs (idr_alloc(…, 1, 0):
lowest free handle from 1, never 0), against a model, and both tables using it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ualinkd.drm.idr import HandleIdr
from ualinkd.drm.syncobj import SyncobjTable


def _lowest_free(used: set[int]) -> int:
    h = 1
    while h in used:
        h += 1
    return h


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 1 << 16)), max_size=200))
def test_alloc_is_lowest_free_from_one(ops: list[tuple[bool, int]]) -> None:
    """Any mix of allocs and removes: each alloc is the lowest handle ≥ 1 not in use."""
    idr, used = HandleIdr(), set[int]()
    for is_alloc, pick in ops:
        if is_alloc or not used:
            h = idr.alloc()
            assert h == _lowest_free(used) and h != 0
            used.add(h)
        else:
            h = sorted(used)[pick % len(used)]
            idr.remove(h)
            used.discard(h)


def test_clear_starts_again_at_one() -> None:
    idr = HandleIdr()
    assert [idr.alloc() for _ in range(3)] == [1, 2, 3]
    idr.remove(2)
    idr.clear()
    assert idr.alloc() == 1


def test_syncobj_table_reuses_the_lowest_handle() -> None:
    """drm_syncobj_create → idr_alloc(…, 1, 0): after destroying 1 of 1, 2, 3 the next is 1."""
    t = SyncobjTable(lambda obj: None)
    assert [t.create(False) for _ in range(3)] == [1, 2, 3]
    t.destroy(1)
    assert t.create(True) == 1
    assert t.create(False) == 4
    t.release()
    assert t.create(False) == 1
