"""GEM lifetimes as a hypothesis state machine (STYLE rule 7; spec §2.4, §2.5, §6.1, §6.4, §6.8).

Rules create BOs in several DrmFiles on two devices of one node, export them to dma-bufs
(PRIME_HANDLE_TO_FD → token → open), import them (PRIME_FD_TO_HANDLE) into other files,
close handles, dma-bufs and whole files, and UALink-export / locally import. After every
step each count is recomputed from its holders and compared with the object's own counter;
handle_free must run exactly once per drop of handle_count to 0.
"""

from __future__ import annotations

import errno
import random
from collections import Counter

from hypothesis import HealthCheck, settings
from hypothesis import strategies as hs
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from ualink_testkit import (
    CALLER,
    device,
    gem_close_raw,
    gem_create_raw,
    make_node,
    open_file,
    open_token,
    pod_config,
    prime_from_fd,
    prime_to_fd_raw,
    u32,
    ualink_export_raw,
    ualink_import_raw,
)

from ualinkd.abi import constants as c
from ualinkd.amdgpu.bo import AmdgpuBo
from ualinkd.drm.file import DrmFile
from ualinkd.drm.gem import DmaBuf, GemObject

KIB = 1024
VRAM = 48 * KIB
GTT = 64 * KIB
idx = hs.integers(0, 1 << 16)


class GemLifetimes(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        accels = [{"id": i, "vram_size": VRAM, "gtt_size": GTT} for i in (0, 1)]
        # Seeded randomness: handles and tokens must not make one run differ from its replay.
        self.core = make_node(pod_config(nodes=[accels, [{"id": 5}]]),
                              randbits=random.Random(0).getrandbits)
        self.devices = [device(self.core, 0), device(self.core, 1)]
        self.drivers = [d.driver for d in self.devices]
        self.handle_free_calls: Counter[GemObject] = Counter()
        self.expected_drops: Counter[GemObject] = Counter()
        for drv in self.drivers:
            drv._handle_free = self._counting(drv._handle_free)  # type: ignore[method-assign]
        self.files: list[DrmFile] = []
        self.objs: list[GemObject] = []  # every object ever created (kept for the checks)
        self.bufs: list[DmaBuf] = []  # every dma-buf ever seen
        self.pending: dict[int, tuple[DrmFile, DmaBuf]] = {}  # token -> (owner, buf)
        self.opened: dict[int, DmaBuf] = {}  # key -> buf
        self.exported: list[tuple[int, int]] = []  # UALink handles ever returned
        self.prev_counts: Counter[GemObject] = Counter()

    def _counting(self, inner):
        def handle_free(bo: AmdgpuBo) -> None:
            assert bo.handle_count == 0
            self.handle_free_calls[bo] += 1
            inner(bo)

        return handle_free

    # -- helpers --------------------------------------------------------------------------------
    def _file(self, i: int) -> DrmFile:
        return self.files[i % len(self.files)]

    def _handle(self, f: DrmFile, j: int) -> int:
        hs_ = sorted(f.handles)
        return hs_[j % len(hs_)]

    def _files_with_handles(self) -> list[DrmFile]:
        return [f for f in self.files if f.handles]

    def _pick(self, i: int, j: int) -> tuple[DrmFile, int, AmdgpuBo]:
        """The i-th file that holds handles, its j-th handle and that handle's BO."""
        fs = self._files_with_handles()
        f = fs[i % len(fs)]
        h = self._handle(f, j)
        bo = f.handles[h]
        assert isinstance(bo, AmdgpuBo)
        return f, h, bo

    def _track_obj(self, obj: GemObject) -> None:
        if not any(o is obj for o in self.objs):
            self.objs.append(obj)

    def _track_buf(self, buf: DmaBuf) -> None:
        if not any(b is buf for b in self.bufs):
            self.bufs.append(buf)

    def _mgr(self, f: DrmFile):
        return f.device.driver.ualink

    # -- rules ------------------------------------------------------------------------------------
    @initialize()
    def first_files(self):
        self.files += [open_file(self.core, 0), open_file(self.core, 1)]

    @precondition(lambda self: len(self.files) < 6)
    @rule(dev=hs.integers(0, 1))
    def open_render(self, dev):
        self.files.append(open_file(self.core, dev))

    @precondition(lambda self: len(self.files) > 1)
    @rule(i=idx)
    def close_file(self, i):
        f = self._file(i)
        self.files.remove(f)
        f.release()
        for token in [t for t, (owner, _) in self.pending.items() if owner is f]:
            del self.pending[token]  # unopened tokens die with their DrmFile (policy 5)

    @precondition(lambda self: self.files)
    @rule(
        i=idx,
        size=hs.sampled_from([4 * KIB, 8 * KIB, 40 * KIB]),
        domains=hs.sampled_from([c.DOMAIN_VRAM, c.DOMAIN_GTT, c.DOMAIN_VRAM | c.DOMAIN_GTT]),
        always_valid=hs.sampled_from([False, False, False, True]),
    )
    def create_bo(self, i, size, domains, always_valid):
        f = self._file(i)
        drv = f.device.driver
        flags = c.CREATE_VM_ALWAYS_VALID if always_valid else 0
        vram_fits, gtt_fits = drv.vram.fits(size), drv.gtt.fits(size)
        r = gem_create_raw(f, size, domains, flags)
        # §2.3: VRAM-only falls back to VRAM|GTT; nothing fits → ENOMEM.
        fits = (domains & c.DOMAIN_VRAM and vram_fits) or gtt_fits
        if not fits:
            assert r.result == -errno.ENOMEM
            return
        assert r.result == 0
        bo = f.handles[u32(r.out)]
        assert isinstance(bo, AmdgpuBo)
        assert bo.placement is (drv.vram if domains & c.DOMAIN_VRAM and vram_fits else drv.gtt)
        self._track_obj(bo)

    @precondition(lambda self: any(f.handles for f in self.files))
    @rule(i=idx, j=idx, unknown=hs.sampled_from([False, False, False, True]))
    def gem_close(self, i, j, unknown):
        fs = self._files_with_handles()
        f = fs[i % len(fs)]
        if unknown:  # §2.4: EINVAL, nothing changes
            unused = next(h for h in range(1, 100) if h not in f.handles)
            assert gem_close_raw(f, unused).result == -errno.EINVAL
            return
        assert gem_close_raw(f, self._handle(f, j)).result == 0

    @precondition(lambda self: any(f.handles for f in self.files))
    @rule(i=idx, j=idx)
    def prime_export(self, i, j):
        f, h, bo = self._pick(i, j)
        r = prime_to_fd_raw(f, h)
        if bo.vm_always_valid:
            assert r.result == -errno.EPERM
            return
        assert r.result == 0
        buf = f.prime_by_handle[h]
        assert buf.obj is bo or buf is bo.import_buf
        self._track_buf(buf)
        self.pending[u32(r.out, 8)] = (f, buf)

    @precondition(lambda self: self.pending)
    @rule(n=idx)
    def open_dmabuf(self, n):
        token = sorted(self.pending)[n % len(self.pending)]
        _, buf = self.pending.pop(token)
        key = open_token(self.core, token)
        assert self.core.tokens.resolve(key) is buf
        self.opened[key] = buf

    @precondition(lambda self: self.opened and self.files)
    @rule(i=idx, n=idx)
    def prime_import(self, i, n):
        f = self._file(i)
        key = sorted(self.opened)[n % len(self.opened)]
        buf = self.opened[key]
        cached = f.prime_by_buf.get(buf.id)
        h = prime_from_fd(f, key)
        obj = f.handles[h]
        if cached is not None:
            assert h == cached  # §2.5: same dma-buf in the same file → same handle
        elif buf.obj.device is f.device:
            assert obj is buf.obj  # §2.5 self-import
        else:
            assert isinstance(obj, AmdgpuBo) and obj.import_buf is buf
            assert obj.preferred_domains == c.DOMAIN_GTT
            self._track_obj(obj)

    @precondition(lambda self: self.opened)
    @rule(n=idx)
    def close_dmabuf(self, n):
        key = sorted(self.opened)[n % len(self.opened)]
        del self.opened[key]
        self.core.tokens.release(key)

    @precondition(lambda self: any(f.handles for f in self.files))
    @rule(i=idx, j=idx)
    def ualink_export(self, i, j):
        f, h, bo = self._pick(i, j)
        r = ualink_export_raw(f, h)
        if not bo.preferred_domains & c.DOMAIN_VRAM:
            assert r.result == -errno.EOPNOTSUPP  # §1.6 E2 (GTT BOs, imports)
            return
        if bo.vm_always_valid:
            assert r.result == -errno.EPERM  # §1.6 E5
            return
        assert r.result == 0
        lo, hi = int.from_bytes(r.out[:8], "little"), int.from_bytes(r.out[8:16], "little")
        entry = self._mgr(f).exports[lo]
        assert entry.bo is bo and entry.handle_hi == hi
        assert lo & 0x3FF == self._mgr(f).accel_id
        self._track_buf(entry.buf)
        if (lo, hi) not in self.exported:
            self.exported.append((lo, hi))

    @precondition(lambda self: self.exported and self.files)
    @rule(i=idx, n=idx)
    def ualink_import_local(self, i, n):
        f = self._file(i)
        lo, hi = self.exported[n % len(self.exported)]
        exporter = self.core.host.by_accel_id(lo & 0x3FF)
        entry = exporter.exports.get(lo)
        r = ualink_import_raw(f, lo, hi)
        if entry is None:
            assert r.result == -errno.EINVAL  # §1.6 I2b: revoked
            return
        assert r.result == 0
        self.pending[u32(r.out)] = (f, entry.buf)  # I2c: the export-time dma-buf

    # -- invariants ------------------------------------------------------------------------------
    def _handle_counts(self) -> Counter[GemObject]:
        counts: Counter[GemObject] = Counter()
        for f in self.files:
            for obj in f.handles.values():
                counts[obj] += 1
        return counts

    def _live_bufs(self) -> list[DmaBuf]:
        for f in self.files:
            for buf in f.prime_by_handle.values():
                self._track_buf(buf)
        for o in self.objs:
            if o.dma_buf is not None:
                self._track_buf(o.dma_buf)
        return [b for b in self.bufs if b.refcount > 0]

    @invariant()
    def counts_match_holders(self):
        counts = self._handle_counts()
        for obj in counts:
            assert any(o is obj for o in self.objs), "an object nobody created"
        for obj in self.objs:
            if self.prev_counts[obj] > 0 and counts[obj] == 0:
                self.expected_drops[obj] += 1
        self.prev_counts = counts

        live_bufs = self._live_bufs()
        entries = [e for d in self.drivers for e in d.ualink.exports.values()]
        for obj in self.objs:
            assert obj.handle_count == counts[obj] >= 0
            assert self.handle_free_calls[obj] == self.expected_drops[obj]
            holders = (
                obj.handle_count
                + sum(1 for b in live_bufs if b.obj is obj)
                + sum(1 for e in entries if e.bo is obj)
            )
            assert obj.refcount == holders >= 0
            assert (obj.device.objects.get(obj.id) is obj) == (obj.refcount > 0)
            if obj.handle_count == 0:
                assert obj.dma_buf is None  # dropped before handle_free (§6.4)
        for dev in self.devices:
            assert all(any(o is x for x in self.objs) for o in dev.objects.values())

        pending_bufs = [buf for _, buf in self.pending.values()]
        import_bufs = [o.import_buf for o in self.objs
                       if isinstance(o, AmdgpuBo) and o.refcount > 0 and o.import_buf]
        for buf in self.bufs:
            holders = (
                (1 if buf.obj.dma_buf is buf else 0)
                + sum(1 for f in self.files for b in f.prime_by_handle.values() if b is buf)
                + sum(1 for b in pending_bufs if b is buf)
                + sum(1 for b in self.opened.values() if b is buf)
                + sum(1 for e in entries if e.buf is buf)
                + sum(1 for b in import_bufs if b is buf)
            )
            assert buf.refcount == holders >= 0
        assert self.core.tokens.pending_count == len(self.pending)
        assert set(self.core.tokens.opened) == set(self.opened)

    @invariant()
    def exports_only_for_handled_bos(self):
        """§6.4: an export entry lives exactly while its BO has GEM handles."""
        for drv in self.drivers:
            for lo, e in drv.ualink.exports.items():
                assert e.handle_lo == lo == e.bo.ualink_handle_lo
                assert e.bo.handle_count > 0
                assert e.bo.device is drv.device

    @invariant()
    def pools_account_live_bos(self):
        """§2.3: each pool's use is the sum of the live BOs placed in it."""
        for drv in self.drivers:
            for pool in (drv.vram, drv.gtt):
                live = [o for o in self.objs if isinstance(o, AmdgpuBo) and o.refcount > 0
                        and o.placement is pool]
                assert pool.used == sum(o.size for o in live)
                assert 0 <= pool.used <= pool.size

    def teardown(self):
        for f in list(self.files):
            f.release()
        self.files.clear()
        self.pending.clear()
        for key in list(self.opened):
            self.core.tokens.release(key)
        self.opened.clear()
        for dev in self.devices:
            assert dev.objects == {}
        for drv in self.drivers:
            assert (drv.vram.used, drv.gtt.used) == (0, 0)
            assert drv.ualink.exports == {}
        assert self.core.tokens.pending_count == 0
        assert self.core.tokens.opened == {}
        for obj in self.objs:
            assert (obj.refcount, obj.handle_count) == (0, 0)
            assert self.handle_free_calls[obj] == self.expected_drops[obj] + (
                1 if self.prev_counts[obj] > 0 else 0
            )
        for buf in self.bufs:
            assert buf.refcount == 0


GemLifetimes.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestGemLifetimes = GemLifetimes.TestCase


def test_caller_is_stable():
    """Policy 5: tokens are opened by the same uid that received them."""
    assert CALLER.uid == 1000
