"""DRM syncobjs (drm_syncobj.c) and GEM_VA's syncobjs (spec §2.6 steps 6, 8, 9, 12; §9).

User memory is a fake address space (`UserMemory`), so arrays behind ioctl pointers are read
and written as the daemon's /proc/<pid>/mem access would; bad pointers give EFAULT. Blocking
waits run on trio's MockClock with autojump: timeouts are exact and take no real time.
"""

from __future__ import annotations

import errno
import struct
import time
from collections.abc import Awaitable
from typing import Any

import pytest
import trio
import trio.testing
import ualink_testkit as kit
from ualink_testkit import CALLER, GEM_VA, gem_close, gem_create, open_file, pod_config, run
from ualink_testkit import ioctl as raw_ioctl

from ualinkd.abi import constants as c
from ualinkd.abi import structs as st
from ualinkd.abi.ioc import iowr
from ualinkd.daemon import TrioSyncWaits
from ualinkd.drm.device import IoctlResult
from ualinkd.drm.errors import DrmError
from ualinkd.drm.file import DrmFile
from ualinkd.node import NodeCore, NodeServices

CREATE, DESTROY = iowr(0xBF, 8), iowr(0xC0, 8)
WAIT, RESET, SIGNAL = iowr(0xC3, 40), iowr(0xC4, 16), iowr(0xC5, 16)
TL_WAIT, QUERY, TL_SIGNAL = iowr(0xCA, 48), iowr(0xCB, 24), iowr(0xCD, 24)
ALL = c.DRM_SYNCOBJ_WAIT_FLAGS_WAIT_ALL
SUBMIT = c.DRM_SYNCOBJ_WAIT_FLAGS_WAIT_FOR_SUBMIT
AVAILABLE = c.DRM_SYNCOBJ_WAIT_FLAGS_WAIT_AVAILABLE
DEADLINE = c.DRM_SYNCOBJ_WAIT_FLAGS_WAIT_DEADLINE
FOREVER = (1 << 63) - 1
BASE, SIZE = 0x10_0000, 1 << 16
BAD = 0xDEAD_0000
VA = 0x1_0000_0000
R = c.VM_PAGE_READABLE


class UserMemory:
    """The caller's address space: [BASE, BASE+SIZE) is mapped, the rest faults."""

    def __init__(self) -> None:
        self.mem = bytearray(SIZE)
        self.next = BASE

    def _span(self, address: int, n: int) -> slice:
        if not (BASE <= address and address + n <= BASE + SIZE):
            raise DrmError(errno.EFAULT, f"bad address {address:#x}")
        return slice(address - BASE, address - BASE + n)

    def peek(self, address: int, n: int) -> bytes:
        return bytes(self.mem[self._span(address, n)])

    def poke(self, address: int, data: bytes) -> None:
        self.mem[self._span(address, len(data))] = data

    # The device's copy_from_user / copy_to_user: awaitables, as the daemon's are.
    async def read(self, pid: int, address: int, n: int) -> bytes:
        return self.peek(address, n)

    async def write(self, pid: int, address: int, data: bytes) -> None:
        self.poke(address, data)

    def put(self, data: bytes) -> int:
        address, self.next = self.next, self.next + -(-len(data) // 8) * 8
        self.poke(address, data)
        return address

    def u32s(self, *values: int) -> int:
        return self.put(struct.pack(f"<{len(values)}I", *values))

    def u64s(self, *values: int) -> int:
        return self.put(struct.pack(f"<{len(values)}Q", *values))


def mock_now() -> int:
    """CLOCK_MONOTONIC as the syncobj code sees it: trio's (mock) clock inside trio.run,
    the real one outside (the tests there never block)."""
    try:
        return int(trio.current_time() * 1e9)
    except RuntimeError:
        return time.monotonic_ns()


@pytest.fixture
def mem() -> UserMemory:
    return UserMemory()


@pytest.fixture
def core(mem):
    return NodeCore(pod_config(), "node0", NodeServices(resolve_fd=lambda pid, fd: fd,
                    copy_to_user=mem.write, copy_from_user=mem.read,
                    waits=TrioSyncWaits(mock_now), spawn=kit.lazy_spawn))


@pytest.fixture
def f(core) -> DrmFile:
    return open_file(core)


def ioctl(f: DrmFile, cmd: int, data: bytes, caller: Any = CALLER) -> IoctlResult:
    """An ioctl that does not block (its user-memory copies are awaitables that finish at
    once here), run to its result."""
    return run(raw_ioctl(f, cmd, data, caller))


def create(f: DrmFile, flags: int = 0) -> int:
    r = ioctl(f, CREATE, struct.pack("<II", 0, flags))
    assert r.result == 0, r
    return int.from_bytes(r.out[:4], "little")


def wait_raw(f: DrmFile, mem: UserMemory, handles: list[int], flags: int = 0,
             timeout: int = 0) -> IoctlResult | Awaitable[IoctlResult]:
    data = st.SYNCOBJ_WAIT.encode(st.DrmSyncobjWait(
        mem.u32s(*handles), timeout, len(handles), flags, 0, 0, 0))
    return raw_ioctl(f, WAIT, data)


def tl_wait_raw(f: DrmFile, mem: UserMemory, handles: list[int], points: list[int] | None,
                flags: int = 0, timeout: int = 0) -> IoctlResult | Awaitable[IoctlResult]:
    pts = mem.u64s(*points) if points is not None else 0
    data = st.SYNCOBJ_TIMELINE_WAIT.encode(st.DrmSyncobjTimelineWait(
        mem.u32s(*handles), pts, timeout, len(handles), flags, 0, 0, 0))
    return raw_ioctl(f, TL_WAIT, data)


def first_signaled(r: IoctlResult, at: int = 24) -> int:
    return int.from_bytes(r.out[at : at + 4], "little")


def array(f: DrmFile, mem: UserMemory, cmd: int, handles: list[int], pad: int = 0) -> int:
    data = st.SYNCOBJ_ARRAY.encode(st.DrmSyncobjArray(mem.u32s(*handles), len(handles), pad))
    return ioctl(f, cmd, data).result


def tl_signal(f: DrmFile, mem: UserMemory, handles: list[int], points: list[int] | None,
              flags: int = 0) -> int:
    pts = mem.u64s(*points) if points is not None else 0
    data = st.SYNCOBJ_TIMELINE_ARRAY.encode(
        st.DrmSyncobjTimelineArray(mem.u32s(*handles), pts, len(handles), flags))
    return ioctl(f, TL_SIGNAL, data).result


def query(f: DrmFile, mem: UserMemory, handles: list[int], flags: int = 0) -> list[int]:
    out = mem.u64s(*([0xFFFF] * len(handles)))
    data = st.SYNCOBJ_TIMELINE_ARRAY.encode(
        st.DrmSyncobjTimelineArray(mem.u32s(*handles), out, len(handles), flags))
    r = ioctl(f, QUERY, data)
    assert r.result == 0, r
    return list(struct.unpack(f"<{len(handles)}Q", mem.peek(out, 8 * len(handles))))


# ---- CREATE / DESTROY -------------------------------------------------------------------------


def test_handles_from_1_lowest_free(f):
    """drm_syncobj_get_handle: idr_alloc(…, 1, 0) — handles from 1, lowest free reused."""
    assert [create(f) for _ in range(3)] == [1, 2, 3]
    assert ioctl(f, DESTROY, struct.pack("<II", 2, 0)).result == 0
    assert create(f) == 2
    assert create(f) == 4


@pytest.mark.parametrize("flags", [2, 1 << 31, 3])
def test_create_unknown_flag_is_einval(f, flags):
    """drm_syncobj_create_ioctl: flags other than CREATE_SIGNALED → EINVAL."""
    assert ioctl(f, CREATE, struct.pack("<II", 0, flags)).result == -errno.EINVAL
    assert len(f.syncobjs) == 0


def test_create_signaled_holds_a_plain_fence(f, mem):
    """CREATE_SIGNALED: a signaled stub fence — WAIT returns at once; QUERY says 0."""
    h = create(f, c.DRM_SYNCOBJ_CREATE_SIGNALED)
    r = run(wait_raw(f, mem, [h]))
    assert (r.result, first_signaled(r)) == (0, 0)
    assert query(f, mem, [h]) == [0]


def test_destroy_pad_and_unknown_are_einval(f):
    """drm_syncobj_destroy_ioctl: pad ≠ 0 → EINVAL; unknown handle → EINVAL (not ENOENT)."""
    h = create(f)
    assert ioctl(f, DESTROY, struct.pack("<II", h, 1)).result == -errno.EINVAL
    assert ioctl(f, DESTROY, struct.pack("<II", 99, 0)).result == -errno.EINVAL
    assert ioctl(f, DESTROY, struct.pack("<II", h, 0)).result == 0
    assert ioctl(f, DESTROY, struct.pack("<II", h, 0)).result == -errno.EINVAL


def test_syncobjs_are_per_file(core, f, mem):
    """drm_syncobj_find looks in the caller's file only: another file's handle → ENOENT."""
    h = create(f, c.DRM_SYNCOBJ_CREATE_SIGNALED)
    g = open_file(core)
    assert run(wait_raw(g, mem, [h])).result == -errno.ENOENT


def test_release_drops_the_files_syncobjs(core, f):
    """drm_syncobj_release at the file's last close."""
    create(f)
    core.release_render(f)
    assert len(f.syncobjs) == 0


# ---- WAIT / TIMELINE_WAIT: argument rules -------------------------------------------------------


@pytest.mark.parametrize("flags", [AVAILABLE, 1 << 4, 1 << 31])
def test_wait_unknown_flags_are_einval(f, mem, flags):
    """drm_syncobj_wait_ioctl accepts WAIT_ALL, WAIT_FOR_SUBMIT, WAIT_DEADLINE only;
    WAIT_AVAILABLE is for TIMELINE_WAIT."""
    h = create(f, 1)
    assert run(wait_raw(f, mem, [h], flags)).result == -errno.EINVAL


@pytest.mark.parametrize("flags", [1 << 4, 1 << 31])
def test_timeline_wait_unknown_flags_are_einval(f, mem, flags):
    """drm_syncobj_timeline_wait_ioctl: any bit outside the four wait flags → EINVAL."""
    h = create(f, 1)
    assert run(tl_wait_raw(f, mem, [h], [0], flags)).result == -errno.EINVAL
    assert run(tl_wait_raw(f, mem, [h], [0], AVAILABLE | DEADLINE | ALL)).result == 0


def test_wait_count_zero_is_einval_before_handles(f, mem):
    """count_handles 0 → EINVAL, before the (bad) handle pointer is looked at."""
    data = st.SYNCOBJ_WAIT.encode(st.DrmSyncobjWait(BAD, 0, 0, 0, 0, 0, 0))
    assert ioctl(f, WAIT, data).result == -errno.EINVAL
    data = st.SYNCOBJ_TIMELINE_WAIT.encode(st.DrmSyncobjTimelineWait(BAD, BAD, 0, 0, 0, 0, 0, 0))
    assert ioctl(f, TL_WAIT, data).result == -errno.EINVAL


def test_wait_bad_pointers_are_efault(f, mem):
    """drm_syncobj_array_find copies the handles in (EFAULT); the timeline points too."""
    h = create(f, 1)
    data = st.SYNCOBJ_WAIT.encode(st.DrmSyncobjWait(BAD, 0, 1, 0, 0, 0, 0))
    assert ioctl(f, WAIT, data).result == -errno.EFAULT
    data = st.SYNCOBJ_TIMELINE_WAIT.encode(
        st.DrmSyncobjTimelineWait(mem.u32s(h), BAD, 0, 1, 0, 0, 0, 0))
    assert ioctl(f, TL_WAIT, data).result == -errno.EFAULT


def test_wait_unknown_handle_is_enoent(f, mem):
    """drm_syncobj_array_find: a handle that is not this file's → ENOENT (0 included)."""
    h = create(f, 1)
    assert run(wait_raw(f, mem, [h, 7])).result == -errno.ENOENT
    assert run(wait_raw(f, mem, [0])).result == -errno.ENOENT


def test_wait_on_no_fence_without_wait_for_submit_is_einval(f, mem):
    """drm_syncobj_array_wait_timeout: no fence and neither WAIT_FOR_SUBMIT nor
    WAIT_AVAILABLE → EINVAL, whatever the timeout — even if another entry is signaled."""
    empty, ready = create(f), create(f, 1)
    assert run(wait_raw(f, mem, [ready, empty], timeout=FOREVER)).result == -errno.EINVAL


def test_wait_any_returns_first_signaled_index(f, mem):
    """WAIT_ANY: satisfied by any signaled entry; first_signaled = its index. WAIT_ALL with
    all signaled: first_signaled = the first signaled one (index 0)."""
    empty, ready = create(f), create(f, 1)
    r = run(wait_raw(f, mem, [empty, ready, empty], SUBMIT))
    assert (r.result, first_signaled(r)) == (0, 1)
    r = run(wait_raw(f, mem, [ready, ready], ALL))
    assert (r.result, first_signaled(r)) == (0, 0)


def test_expired_timeout_only_checks(f, mem):
    """drm_timeout_abs_to_jiffies: 0, negative, or a time already past → poll → ETIME."""
    empty = create(f)
    for timeout in (0, -5, 1):
        assert run(wait_raw(f, mem, [empty], SUBMIT, timeout)).result == -errno.ETIME


# ---- SIGNAL / RESET / TIMELINE_SIGNAL / QUERY ---------------------------------------------------


def test_array_ioctls_pad_count_pointer(f, mem):
    """drm_syncobj_reset/signal_ioctl: pad ≠ 0 → EINVAL, count 0 → EINVAL, bad pointer →
    EFAULT, unknown → ENOENT."""
    h = create(f)
    for cmd in (RESET, SIGNAL):
        assert array(f, mem, cmd, [h], pad=1) == -errno.EINVAL
        assert array(f, mem, cmd, []) == -errno.EINVAL
        assert ioctl(f, cmd, struct.pack("<QII", BAD, 1, 0)).result == -errno.EFAULT
        assert array(f, mem, cmd, [h, 9]) == -errno.ENOENT


def test_signal_then_reset(f, mem):
    """SIGNAL attaches a signaled stub fence; RESET removes the fence (wait → EINVAL)."""
    h = create(f)
    assert array(f, mem, SIGNAL, [h]) == 0
    assert run(wait_raw(f, mem, [h])).result == 0
    assert array(f, mem, RESET, [h]) == 0
    assert run(wait_raw(f, mem, [h])).result == -errno.EINVAL


def test_timeline_signal_wait_query(f, mem):
    """TIMELINE_SIGNAL adds a chain point; a timeline wait on a point at or below it returns;
    a later point has no fence yet (EINVAL without WAIT_FOR_SUBMIT, ETIME with it);
    QUERY gives the chain head."""
    h = create(f)
    assert tl_signal(f, mem, [h], [5]) == 0
    for point in (0, 3, 5):
        assert run(tl_wait_raw(f, mem, [h], [point])).result == 0
    assert run(tl_wait_raw(f, mem, [h], [6])).result == -errno.EINVAL
    assert run(tl_wait_raw(f, mem, [h], [6], SUBMIT)).result == -errno.ETIME
    assert run(tl_wait_raw(f, mem, [h], [6], AVAILABLE)).result == -errno.ETIME
    assert query(f, mem, [h]) == [5]
    assert query(f, mem, [h], c.DRM_SYNCOBJ_QUERY_FLAGS_LAST_SUBMITTED) == [5]


def test_unordered_point_keeps_the_timeline_monotonic(f, mem):
    """dma_fence_chain_init: a point at or below the head keeps the head's seqno."""
    h = create(f)
    tl_signal(f, mem, [h], [5])
    tl_signal(f, mem, [h], [3])
    assert query(f, mem, [h]) == [5]
    tl_signal(f, mem, [h], [9])
    assert query(f, mem, [h]) == [9]


def test_plain_fence_has_no_timeline_points(f, mem):
    """dma_fence_chain_find_seqno: a plain fence satisfies point 0 only; QUERY → 0."""
    h = create(f, 1)
    assert run(tl_wait_raw(f, mem, [h], [1])).result == -errno.EINVAL
    assert run(tl_wait_raw(f, mem, [h], None)).result == 0  # NULL points: all 0
    assert query(f, mem, [h]) == [0]


def test_timeline_signal_rules(f, mem):
    """drm_syncobj_timeline_signal_ioctl: flags ≠ 0 → EINVAL, count 0 → EINVAL, unknown →
    ENOENT, bad points → EFAULT with nothing signaled, NULL points → point 0."""
    h, g = create(f), create(f)
    assert tl_signal(f, mem, [h], [1], flags=1) == -errno.EINVAL
    assert tl_signal(f, mem, [], []) == -errno.EINVAL
    assert tl_signal(f, mem, [h, 8], [1, 2]) == -errno.ENOENT
    data = st.SYNCOBJ_TIMELINE_ARRAY.encode(
        st.DrmSyncobjTimelineArray(mem.u32s(h, g), BAD, 2, 0))
    assert ioctl(f, TL_SIGNAL, data).result == -errno.EFAULT
    assert f.syncobjs.find(h).fence is None  # type: ignore[union-attr]
    assert tl_signal(f, mem, [h], None) == 0
    assert query(f, mem, [h]) == [0]
    assert run(wait_raw(f, mem, [h])).result == 0


def test_query_rules(f, mem):
    """drm_syncobj_query_ioctl: flags beyond LAST_SUBMITTED → EINVAL, count 0 → EINVAL,
    unknown → ENOENT, points not writable → EFAULT; an empty syncobj reads 0."""
    h = create(f)
    data = lambda pts, n=1, flags=0: st.SYNCOBJ_TIMELINE_ARRAY.encode(  # noqa: E731
        st.DrmSyncobjTimelineArray(mem.u32s(h), pts, n, flags))
    assert ioctl(f, QUERY, data(mem.u64s(0), flags=2)).result == -errno.EINVAL
    assert ioctl(f, QUERY, data(mem.u64s(0), n=0)).result == -errno.EINVAL
    assert ioctl(f, QUERY, data(BAD)).result == -errno.EFAULT
    assert ioctl(f, QUERY, data(0)).result == -errno.EFAULT
    assert query(f, mem, [h]) == [0]
    bad = st.SYNCOBJ_TIMELINE_ARRAY.encode(
        st.DrmSyncobjTimelineArray(mem.u32s(77), mem.u64s(0), 1, 0))
    assert ioctl(f, QUERY, bad).result == -errno.ENOENT


def test_too_many_handles_is_enomem(f, mem):
    """kmalloc_array of the syncobj pointers fails past KMALLOC_MAX_SIZE → ENOMEM."""
    data = st.SYNCOBJ_WAIT.encode(st.DrmSyncobjWait(BASE, 0, 1 << 20, 0, 0, 0, 0))
    assert ioctl(f, WAIT, data).result == -errno.ENOMEM


# ---- blocking waits (trio MockClock: exact, no real time) -------------------------------------


def run_trio(fn: Any) -> None:
    trio.run(fn, clock=trio.testing.MockClock(autojump_threshold=0))


def test_wait_for_submit_is_woken_by_signal(f, mem):
    """WAIT_FOR_SUBMIT on an empty syncobj waits (returns an awaitable, the daemon goes on);
    a SIGNAL from the same file at t=0.3 s completes it then, with first_signaled set."""

    async def main() -> None:
        a, b = create(f), create(f)
        pending = wait_raw(f, mem, [a, b], SUBMIT, mock_now() + 1_000_000_000)
        assert not isinstance(pending, IoctlResult)
        done: list[tuple[float, IoctlResult]] = []

        async def waiter() -> None:
            r = await kit.answer(pending)
            done.append((trio.current_time(), r))

        async with trio.open_nursery() as n:
            n.start_soon(waiter)
            await trio.sleep(0.3)
            assert done == []
            assert array(f, mem, SIGNAL, [b]) == 0
        t, r = done[0]
        assert (t, r.result, first_signaled(r)) == (0.3, 0, 1)

    run_trio(main)


def test_wait_times_out_with_etime_at_the_deadline(f, mem):
    """An unsatisfied wait ends with ETIME exactly at its absolute deadline."""

    async def main() -> None:
        h = create(f)
        t0 = trio.current_time()
        r = await kit.answer(wait_raw(f, mem, [h], SUBMIT, mock_now() + 50_000_000))
        assert (r.result, trio.current_time() - t0) == (-errno.ETIME, pytest.approx(0.05))

    run_trio(main)


def test_wait_all_needs_every_point(f, mem):
    """WAIT_ALL: the wait ends when the last entry gets its point; an entry already captured
    stays done even if its syncobj is reset meanwhile (the waiter holds the fence)."""

    async def main() -> None:
        a, b = create(f), create(f)
        pending = tl_wait_raw(f, mem, [a, b], [2, 4], ALL | SUBMIT, FOREVER)
        results: list[IoctlResult] = []

        async def waiter() -> None:
            results.append(await kit.answer(pending))

        async with trio.open_nursery() as n:
            n.start_soon(waiter)
            await trio.sleep(1)
            tl_signal(f, mem, [a], [2])
            await trio.sleep(1)
            array(f, mem, RESET, [a])
            tl_signal(f, mem, [b], [3])  # not yet point 4
            await trio.sleep(1)
            assert results == []
            tl_signal(f, mem, [b], [4])
        assert results[0].result == 0
        assert first_signaled(results[0], 32) == 0xFFFFFFFF  # none was done at the start

    run_trio(main)


# ---- GEM_VA with syncobjs (§2.6 steps 6, 8, 9, 12) ---------------------------------------------


def va(f: DrmFile, handle: int, *, op: int = c.VA_OP_MAP, va_address: int = VA,
       flags: int = R, point: int = 0, out: int = 0, inputs: int = 0, n_inputs: int = 0) -> int:
    args = st.GemVa(handle, 0, op, flags, va_address, 0, 4096, point, out, n_inputs, inputs)
    return ioctl(f, GEM_VA, st.GEM_VA.encode(args)).result


def test_gem_va_timeline_out_at_point(f, mem):
    """Step 12: without DELAY_UPDATE the (already signaled) update fence is added to the
    timeline syncobj at vm_timeline_point: libhsakmt's VaMap + timeline wait (§9)."""
    bo, s = gem_create(f), create(f)
    assert va(f, bo, point=5, out=s) == 0
    r = run(tl_wait_raw(f, mem, [s], [5], SUBMIT, FOREVER))
    assert r.result == 0
    assert query(f, mem, [s]) == [5]
    assert va(f, bo, op=c.VA_OP_UNMAP, flags=0, point=6, out=s) == 0
    assert query(f, mem, [s]) == [6]


def test_gem_va_point_0_replaces_the_fence(f, mem):
    """Step 12: point 0 → drm_syncobj_replace_fence with the update's plain fence."""
    bo, s = gem_create(f), create(f)
    tl_signal(f, mem, [s], [7])
    assert va(f, bo, out=s) == 0
    assert query(f, mem, [s]) == [0]
    assert run(wait_raw(f, mem, [s])).result == 0


def test_gem_va_unknown_out_is_enoent_and_nothing_is_mapped(f):
    """Step 9: an unknown vm_timeline_syncobj_out → ENOENT (amdgpu_gem_update_timeline_node),
    before the mapping is made."""
    bo = gem_create(f)
    assert va(f, bo, point=1, out=42) == -errno.ENOENT
    assert va(f, bo) == 0  # the range is still free


def test_gem_va_delay_update_with_out_is_einval(f):
    """Step 6: DELAY_UPDATE with a timeline syncobj → EINVAL, even a valid one."""
    bo, s = gem_create(f), create(f)
    assert va(f, bo, flags=R | c.VM_DELAY_UPDATE, out=s) == -errno.EINVAL


def test_gem_va_failed_operation_leaves_the_timeline(f, mem):
    """Step 12 runs only on success: an overlapping MAP (step 11, EINVAL) adds no point."""
    bo, s = gem_create(f), create(f)
    assert va(f, bo, point=1, out=s) == 0
    assert va(f, bo, point=2, out=s) == -errno.EINVAL
    assert query(f, mem, [s]) == [1]


def test_gem_va_input_fences(f, mem):
    """Step 8 (amdgpu_gem_add_input_fence): the array is copied in (EFAULT), then per handle
    in order: 0 → EINVAL, unknown → ENOENT, no fence → EINVAL (drm_syncobj_find_fence
    without WAIT_FOR_SUBMIT); fenced syncobjs are waited for (already signaled here)."""
    bo, ready, empty = gem_create(f), create(f, 1), create(f)
    assert va(f, bo, inputs=BAD, n_inputs=1) == -errno.EFAULT
    assert va(f, bo, inputs=mem.u32s(ready, 0), n_inputs=2) == -errno.EINVAL
    assert va(f, bo, inputs=mem.u32s(77, 0), n_inputs=2) == -errno.ENOENT
    assert va(f, bo, inputs=mem.u32s(ready, empty), n_inputs=2) == -errno.EINVAL
    assert va(f, bo, inputs=mem.u32s(ready, ready), n_inputs=2) == 0


def test_gem_va_input_fences_come_after_the_bo_lookup(f, mem):
    """Steps 7 then 8: an unknown BO handle → ENOENT before the input array is read."""
    assert va(f, 99, inputs=BAD, n_inputs=1) == -errno.ENOENT


def test_gem_va_wakes_a_timeline_waiter(f, mem):
    """hsaKmtMemoryVaMap's order reversed: a wait for submit on point 3 posted first is
    completed by the GEM_VA that adds point 3."""

    async def main() -> None:
        bo, s = gem_create(f), create(f)
        pending = tl_wait_raw(f, mem, [s], [3], SUBMIT, FOREVER)
        results: list[IoctlResult] = []

        async def waiter() -> None:
            results.append(await kit.answer(pending))

        async with trio.open_nursery() as n:
            n.start_soon(waiter)
            await trio.sleep(0.1)
            assert va(f, bo, point=3, out=s) == 0
        assert results[0].result == 0

    run_trio(main)


def test_gem_close_does_not_touch_syncobjs(f, mem):
    """Syncobjs are independent of GEM handles."""
    bo, s = gem_create(f), create(f)
    va(f, bo, point=2, out=s)
    gem_close(f, bo)
    assert query(f, mem, [s]) == [2]


def test_no_user_memory_is_efault():
    """Without an injected copy_from_user no array can be read: EFAULT (CALLER's pid)."""
    core = NodeCore(pod_config(), "node0", NodeServices(resolve_fd=lambda pid, fd: fd))
    f = open_file(core)
    h = create(f, 1)
    data = st.SYNCOBJ_WAIT.encode(st.DrmSyncobjWait(BASE, 0, 1, 0, 0, 0, 0))
    assert ioctl(f, WAIT, data, CALLER).result == -errno.EFAULT
    assert h == 1
