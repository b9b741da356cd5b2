"""The DRM core: drm_ioctl's dispatch rules (spec §2.1, §1.4) and GEM/PRIME handles (§2.4, §2.5)."""

from __future__ import annotations

import errno
import struct

import pytest
import ualink_testkit as kit
from hypothesis import given, settings
from hypothesis import strategies as st_h

from ualinkd.abi import constants as c
from ualinkd.abi import ioctls as tbl
from ualinkd.abi import structs as st
from ualinkd.abi.ioc import IOC_READ, IOC_WRITE, ioc
from ualinkd.amdgpu.bo import AmdgpuBo
from ualinkd.amdgpu.driver import AmdgpuDriver
from ualinkd.drm.device import DrmDevice
from ualinkd.drm.errors import DrmError
from ualinkd.drm.tokens import DmaBufTokens
from ualinkd.node import NodeCore

RW = IOC_READ | IOC_WRITE


@pytest.fixture
def core() -> NodeCore:
    return kit.make_node(kit.pod_config(nodes=[[{"id": 0}, {"id": 1}], [{"id": 5}]]))


@pytest.fixture
def f(core):
    return kit.open_file(core)


class Spy:
    """Wraps a handler and records the kernel buffer it was handed."""

    def __init__(self, inner=None, write: bytes | None = None) -> None:
        self.inner = inner
        self.write = write
        self.seen: list[bytes] = []

    def __call__(self, file, kdata, caller):
        self.seen.append(bytes(kdata))
        if self.write is not None:
            kdata[: len(self.write)] = self.write
        if self.inner is not None:
            self.inner(file, kdata, caller)


def _spy_ualink(core: NodeCore) -> Spy:
    drv = kit.device(core).driver
    spy = Spy(drv.ioctls[tbl.AMDGPU_UALINK_HANDLE])
    drv.ioctls[tbl.AMDGPU_UALINK_HANDLE] = spy
    return spy


# ---- copy-in / copy-out sizes ------------------------------------------------------------------


def test_short_struct_zero_extended_and_truncated(core, f):
    """§2.1 / §1.4: a 16-byte IOWR UALink call: bytes 16..23 reach the handler as zeros,
    and only 16 bytes are copied back."""
    h = kit.gem_create(f)
    spy = _spy_ualink(core)
    cmd = ioc(RW, 0x64, 0x5B, 16)
    data = struct.pack("<III", 0, 0, h) + b"\xaa" * 4
    r = kit.ioctl(f, cmd, data)
    assert r.result == 0
    assert len(spy.seen[0]) == 24
    assert spy.seen[0] == data + bytes(8)
    lo, hi = struct.unpack("<QQ", r.out)
    assert len(r.out) == 16
    entry = kit.device(core).driver.ualink.exports[lo]
    assert (entry.handle_lo, entry.handle_hi) == (lo, hi)
    assert r.kdata[16:24] == bytes(8)


def test_long_struct_trailing_bytes_echoed(core, f):
    """§2.1 / §1.4: a 32-byte call: the handler's 24-byte prefix is used, bytes 16..31 come
    back exactly as sent."""
    h = kit.gem_create(f)
    spy = _spy_ualink(core)
    data = struct.pack("<III", 0, 7, h) + b"\x11" * 12 + b"\x5a" * 8
    r = kit.ioctl(f, ioc(RW, 0x64, 0x5B, 32), data)
    assert r.result == 0
    assert spy.seen[0] == data
    assert len(r.out) == 32
    assert r.out[16:] == data[16:]
    lo, hi = struct.unpack("<QQ", r.out[:16])
    assert lo & 0x3FF == 0
    assert kit.device(core).driver.ualink.exports[lo].handle_hi == hi


def test_direction_intersection_table_write_only(core, f):
    """§2.1: GEM_VA is IOW in the table, so an IOWR call is copied in but nothing is copied
    back, even though the handler wrote to the buffer."""
    spy = Spy(write=b"\xff" * 64)
    kit.device(core).driver.ioctls[tbl.AMDGPU_GEM_VA] = spy
    data = bytes(range(64))
    r = kit.ioctl(f, ioc(RW, 0x64, 0x48, 64), data)
    assert r.result == 0
    assert r.out == b""
    assert spy.seen == [data]


def test_direction_intersection_user_read_only(core, f):
    """§2.1: a user cmd without the IN bit copies nothing in: the handler sees zeros."""
    spy = Spy(write=b"\x01")
    kit.device(core).driver.ioctls[tbl.AMDGPU_GEM_VA] = spy
    r = kit.ioctl(f, ioc(IOC_READ, 0x64, 0x48, 64), b"\x99" * 64)
    assert (r.result, r.out) == (0, b"")
    assert spy.seen == [bytes(64)]


def test_iow_ualink_cmd_runs_but_copies_nothing_back(core, f):
    """§2.1: UALink called with _IOW: the export happens, no bytes come back."""
    h = kit.gem_create(f)
    r = kit.ioctl(f, ioc(IOC_WRITE, 0x64, 0x5B, 24), struct.pack("<III", 0, 0, h) + bytes(12))
    assert (r.result, r.out) == (0, b"")
    assert len(kit.device(core).driver.ualink.exports) == 1


def test_ior_ualink_cmd_hands_zeros_to_handler(core, f):
    """§2.1: UALink called with _IOR: nothing copied in, so op 0 / gem_handle 0 → ENOENT,
    and the 24 zero bytes are copied back."""
    kit.gem_create(f)
    r = kit.ioctl(f, ioc(IOC_READ, 0x64, 0x5B, 24), struct.pack("<III", 0, 0, 1) + bytes(12))
    assert r.result == -errno.ENOENT
    assert r.out == bytes(24)


@settings(max_examples=60, deadline=None)
@given(dir_=st_h.sampled_from([0, IOC_READ, IOC_WRITE, RW]), size=st_h.integers(0, 48),
       fill=st_h.integers(0, 255))
def test_copy_rules_same_on_every_call_of_a_number(dir_, size, fill):
    """§2.1 (drm_ioctl): for any user direction and size of the UALink number, the handler
    gets the intersection of the user's and the table's IN bits zero-extended to
    max(user size, table size), and the user's size is copied back where both have the OUT
    bit: on the first call of the number and on every later one (the dispatch remembers a
    number's decisions, DrmDevice._routes)."""
    core = kit.make_node(kit.pod_config(nodes=[[{"id": 0}]]))
    f = kit.open_file(core)
    spy = Spy(write=bytes([fill]) * 16)
    kit.device(core).driver.ioctls[tbl.AMDGPU_UALINK_HANDLE] = spy
    data = bytes(range(1, size + 1))
    in_size = size if dir_ & IOC_WRITE else 0
    out_size = size if dir_ & IOC_READ else 0
    ksize = max(in_size, out_size, 24)
    kdata = data[:in_size] + bytes(ksize - in_size)
    after = bytes([fill]) * 16 + kdata[16:]
    for _ in range(3):
        r = kit.ioctl(f, ioc(dir_, 0x64, 0x5B, size), data)
        assert spy.seen[-1] == kdata
        assert (r.result, r.out, r.kdata) == (0, after[:out_size], after)
    assert len(spy.seen) == 3


def test_handler_that_grows_the_buffer_still_copies_back_the_user_size(core, f):
    """drm_ioctl copies back the user's size from the kernel buffer, whatever a handler
    did to it: a handler writing past the end of its buffer (a test spy can) leaves
    exactly out_size bytes to copy back."""
    spy = Spy(write=b"\xee" * 40)
    kit.device(core).driver.ioctls[tbl.AMDGPU_UALINK_HANDLE] = spy
    r = kit.ioctl(f, ioc(RW, 0x64, 0x5B, 24), bytes(24))
    assert (r.result, r.out) == (0, b"\xee" * 24)
    assert r.kdata == b"\xee" * 40


def test_handler_table_change_after_first_call_is_seen(core, f):
    """The dispatch remembers a number's copy sizes, never its handler: a handler swapped in
    after the number was first called is the one that runs, and one removed answers ENOTTY
    (what a number that was never called would get)."""
    cmd = ioc(RW, 0x64, 0x48, 64)  # GEM_VA
    first = kit.ioctl(f, cmd, bytes(64))
    assert first.result != 0  # the real handler refused an all-zero request
    spy = Spy(write=b"\x01")
    drv = kit.device(core).driver
    drv.ioctls[tbl.AMDGPU_GEM_VA] = spy
    assert kit.ioctl(f, cmd, bytes(64)).result == 0
    assert spy.seen == [bytes(64)]
    del drv.ioctls[tbl.AMDGPU_GEM_VA]
    r = kit.ioctl(f, cmd, bytes(64))
    assert (r.result, r.out) == (-errno.ENOTTY, b"")


@pytest.mark.parametrize(
    "nr",
    [0x04, 0x0E, 0x2F, 0xD2, 0xFF,  # core nrs with no entry / beyond the table
     0x4A, 0x4B, 0x4C, 0x4D, 0x4E, 0x4F,  # empty amdgpu slots 0x0A–0x0F
     0x5C, 0x60, 0x9F],  # beyond amdgpu's num_ioctls
)
def test_no_table_entry_is_einval_without_copy(f, nr):
    """§2.1: nr ≥ 0x5C in the driver range, empty slots 0x4A–0x4F and unknown core nrs
    → EINVAL before any copy: no bytes come back."""
    r = kit.ioctl(f, ioc(RW, 0x64, nr, 16), b"\x77" * 16)
    assert r.result == -errno.EINVAL
    assert r.out == b""
    assert r.spec is None


def test_ioctl_without_render_allow_is_eacces_with_echo(f):
    """§2.1: GEM_FLINK (0x0A) has no DRM_RENDER_ALLOW → EACCES from drm_ioctl_permit,
    after copy-in, so the input is echoed (§1.4)."""
    data = b"\x01\x02\x03\x04\x05\x06\x07\x08"
    r = kit.ioctl(f, ioc(RW, 0x64, 0x0A, 8), data)
    assert r.result == -errno.EACCES
    assert r.out == data
    assert r.spec is not None and r.spec.name == "GEM_FLINK"


def test_dumb_buffer_ioctls_are_not_render_allowed(f):
    """§2.1 (mainline drm_ioctl.c): CREATE_DUMB / MAP_DUMB / DESTROY_DUMB carry no flags, so
    a render node refuses them with EACCES after copy-in (the input echoed)."""
    for nr, size in ((0xB2, 32), (0xB3, 16), (0xB4, 4)):
        data = bytes(range(1, size + 1))
        r = kit.ioctl(f, ioc(RW, 0x64, nr, size), data)
        assert (r.result, r.out) == (-errno.EACCES, data), hex(nr)


def test_set_master_is_eacces_with_no_bytes(f):
    """§2.1: an _IO core ioctl without RENDER_ALLOW → EACCES, nothing to copy."""
    r = kit.ioctl(f, ioc(0, 0x64, 0x1E, 0), b"")
    assert (r.result, r.out) == (-errno.EACCES, b"")


def test_not_emulated_render_ioctl_is_enosys(f):
    """Emulator (ioctls.py, README): a render-allowed ioctl that ualinkd does not emulate
    (AMDGPU_USERQ: no user-mode queues) answers ENOTTY rather than pretending."""
    r = kit.ioctl(f, ioc(RW, 0x64, 0x56, 64), bytes(64))
    assert (r.result, r.out) == (-errno.ENOTTY, b"")


def test_sched_is_master_only(f):
    """amdgpu_ioctls_kms: AMDGPU_SCHED is DRM_MASTER without DRM_RENDER_ALLOW, so a render
    client gets EACCES from drm_ioctl_permit (its buffer copied in and back), not ENOTTY."""
    data = struct.pack("<IIii", 1, 5, 3, 512)
    r = kit.ioctl(f, ioc(IOC_WRITE, 0x64, 0x55, 16), data)
    assert (r.result, r.out) == (-errno.EACCES, b"")


def test_gem_wait_idle_answers_idle(f):
    """amdgpu_gem_wait_idle_ioctl: an unknown handle → ENOENT (the buffer echoed); a BO has
    no fences here (nothing executes), so the union is zeroed and out.status is 0 (idle),
    whatever the timeout."""
    cmd = ioc(RW, 0x64, 0x47, 16)
    r = kit.ioctl(f, cmd, struct.pack("<IIQ", 77, 0, 0))
    assert (r.result, r.out) == (-errno.ENOENT, struct.pack("<IIQ", 77, 0, 0))
    bo = kit.gem_create(f)
    for timeout in (0, 1 << 62, 0xFFFFFFFFFFFFFFFF):
        r = kit.ioctl(f, cmd, struct.pack("<IIQ", bo, 0xFF, timeout))
        assert (r.result, r.out) == (0, bytes(16))


def test_failure_copies_back_the_echo(f):
    """§1.4: a failing handler still gets its buffer copied back: every byte echoed."""
    data = struct.pack("<III", 0, 0xCAFE, 99) + b"\x42" * 12
    r = kit.ioctl(f, ioc(RW, 0x64, 0x5B, 24), data)
    assert r.result == -errno.ENOENT
    assert r.out == data
    r = kit.prime_to_fd_raw(f, 77, flags=c.DRM_CLOEXEC)
    assert r.result == -errno.ENOENT
    assert r.out == struct.pack("<IIi", 77, c.DRM_CLOEXEC, -1)


@pytest.mark.parametrize("type_", [0x00, ord("x"), 0xFF])
def test_type_byte_is_ignored(f, type_):
    """§1.4: the table is indexed by nr only; the ioctl type byte plays no part."""
    data = st.GEM_CREATE_IN.encode(st.GemCreateIn(4096, 0, c.DOMAIN_VRAM, 0))
    r = kit.ioctl(f, ioc(RW, type_, 0x40, 32), data)
    assert r.result == 0
    assert r.out == struct.pack("<I", 1) + bytes(28)


def test_get_cap_prime():
    """§2.5: DRM_CAP_PRIME reports import|export; unknown caps are EINVAL (echoed)."""
    core = kit.make_node()
    f = kit.open_file(core)
    r = kit.ioctl(f, ioc(RW, 0x64, 0x0C, 16), struct.pack("<QQ", c.DRM_CAP_PRIME, 0))
    assert r.result == 0
    assert r.out == struct.pack("<QQ", c.DRM_CAP_PRIME, 3)
    data = struct.pack("<QQ", 0x9999, 5)
    r = kit.ioctl(f, ioc(RW, 0x64, 0x0C, 16), data)
    assert (r.result, r.out) == (-errno.EINVAL, data)


def test_bare_device_without_ualink_block():
    """§12 open question 5: a device whose driver has no UALink manager answers
    EOPNOTSUPP (echo), while GEM_CREATE works."""
    dev = DrmDevice(128, DmaBufTokens(), lambda pid, fd: (_ for _ in ()).throw(DrmError(9)))
    AmdgpuDriver(dev, 1 << 20, 1 << 20)
    f = dev.open(1, 1)
    r = kit.ioctl(f, kit.GEM_CREATE, st.GEM_CREATE_IN.encode(st.GemCreateIn(4096, 0, 4, 0)))
    assert (r.result, kit.u32(r.out)) == (0, 1)
    data = struct.pack("<IIQQ", 7, 0, 1, 2)
    r = kit.ioctl(f, ioc(RW, 0x64, 0x5B, 24), data)
    assert (r.result, r.out) == (-errno.EOPNOTSUPP, data)


# ---- GEM handles (§2.3, §2.4) -------------------------------------------------------------------


def test_handles_start_at_one_lowest_free_reused(f):
    """§2.3: handles per file start at 1, never 0; the lowest free one is reused."""
    assert [kit.gem_create(f) for _ in range(3)] == [1, 2, 3]
    kit.gem_close(f, 2)
    assert kit.gem_create(f) == 2
    kit.gem_close(f, 3)
    kit.gem_close(f, 1)
    assert [kit.gem_create(f) for _ in range(3)] == [1, 3, 4]


def test_handles_are_per_file(core):
    """§2.3: two files of one device each start at handle 1."""
    a, b = kit.open_file(core), kit.open_file(core)
    assert kit.gem_create(a) == 1
    assert kit.gem_create(b) == 1
    assert a.handles[1] is not b.handles[1]


@pytest.mark.parametrize("handle", [0, 1, 2, 0xFFFFFFFF])
def test_gem_close_unknown_handle_is_einval(f, handle):
    """§2.4: GEM_CLOSE of an unknown handle → EINVAL (not ENOENT); IOW: no bytes back."""
    if handle == 1:
        kit.gem_close(f, kit.gem_create(f))  # 1 existed once, now closed
    r = kit.gem_close_raw(f, handle)
    assert (r.result, r.out) == (-errno.EINVAL, b"")


def test_gem_close_frees_the_object(core, f):
    """§2.4: closing the last handle frees the BO."""
    h = kit.gem_create(f)
    assert len(kit.device(core).objects) == 1
    kit.gem_close(f, h)
    assert kit.device(core).objects == {}


# ---- PRIME (§2.5) -----------------------------------------------------------------------------


@pytest.mark.parametrize("flags", [0x1, 0x800, 0x80000 | 0x2 | 0x40, 0xFFFFFFFF])
def test_prime_handle_to_fd_bad_flags(f, flags):
    """§2.5: flags other than O_CLOEXEC|O_RDWR → EINVAL, echoed."""
    h = kit.gem_create(f)
    r = kit.prime_to_fd_raw(f, h, flags=flags)
    assert r.result == -errno.EINVAL
    assert r.out == struct.pack("<IIi", h, flags, -1)


@pytest.mark.parametrize("flags", [0, c.DRM_CLOEXEC, c.DRM_RDWR, c.DRM_CLOEXEC | c.DRM_RDWR])
def test_prime_handle_to_fd_allowed_flags(core, f, flags):
    """§2.5: any subset of O_CLOEXEC|O_RDWR is accepted; only the fd field is written."""
    h = kit.gem_create(f)
    r = kit.prime_to_fd_raw(f, h, flags=flags)
    assert r.result == 0
    handle, fl, token = struct.unpack("<IIi", r.out)
    assert (handle, fl) == (h, flags)
    assert token != 0
    assert core.tokens.pending_count == 1


def test_prime_handle_to_fd_unknown_handle(f):
    """§2.5: unknown handle → ENOENT."""
    assert kit.prime_to_fd_raw(f, 1).result == -errno.ENOENT


def test_prime_export_vm_always_valid_is_eperm(f):
    """§2.5 (DMABUF): VM_ALWAYS_VALID BOs cannot become dma-bufs → EPERM."""
    h = kit.gem_create(f, flags=c.CREATE_VM_ALWAYS_VALID)
    assert kit.prime_to_fd_raw(f, h).result == -errno.EPERM


def test_same_bo_exported_twice_gives_same_dmabuf(core, f):
    """§2.5: a BO already exported returns a new fd for the same dma-buf."""
    h = kit.gem_create(f)
    k1 = kit.open_token(core, kit.prime_to_token(f, h))
    k2 = kit.open_token(core, kit.prime_to_token(f, h))
    assert k1 != k2
    assert core.tokens.resolve(k1) is core.tokens.resolve(k2)
    f2 = kit.open_file(core)
    h2 = kit.prime_from_fd(f2, k1)
    k3 = kit.open_token(core, kit.prime_to_token(f2, h2))
    assert core.tokens.resolve(k3) is core.tokens.resolve(k1)


def test_fd_to_handle_same_file_returns_same_handle(core, f):
    """§2.5: the file's own export comes back as the same handle; handle_count unchanged."""
    h = kit.gem_create(f)
    key = kit.open_token(core, kit.prime_to_token(f, h))
    r = kit.prime_from_fd_raw(f, key)
    assert r.result == 0
    assert r.out == struct.pack("<IIi", h, 0, key)  # only the handle field is written
    assert f.handles[h].handle_count == 1


def test_fd_to_handle_other_file_same_device_is_same_bo(core, f):
    """§2.5: self-import in another file: the same BO, handle_count 2; a second import in
    that file returns the same handle."""
    h = kit.gem_create(f)
    key = kit.open_token(core, kit.prime_to_token(f, h))
    f2 = kit.open_file(core)
    h2 = kit.prime_from_fd(f2, key)
    assert f2.handles[h2] is f.handles[h]
    assert f.handles[h].handle_count == 2
    assert kit.prime_from_fd(f2, key) == h2
    assert f.handles[h].handle_count == 2
    kit.gem_close(f, h)
    assert f2.handles[h2].handle_count == 1
    assert len(kit.device(core).objects) == 1


def test_fd_to_handle_other_device_is_gtt_import(core, f):
    """§2.5: a dma-buf of another device becomes a new GTT import BO there."""
    h = kit.gem_create(f)
    key = kit.open_token(core, kit.prime_to_token(f, h))
    g = kit.open_file(core, 1)
    hg = kit.prime_from_fd(g, key)
    bo = g.handles[hg]
    assert isinstance(bo, AmdgpuBo)
    assert bo is not f.handles[h]
    assert bo.preferred_domains == c.DOMAIN_GTT
    assert bo.import_buf is core.tokens.resolve(key)
    assert f.handles[h].handle_count == 1


def test_fd_to_handle_not_our_dmabuf_is_einval(f):
    """Emulator policy 5: an fd that is not one of our dma-bufs → EINVAL."""
    assert kit.prime_from_fd_raw(f, 12345).result == -errno.EINVAL


def test_fd_to_handle_bad_fd_is_ebadf():
    """Emulator policy 5 / §2.5: a bad fd → EBADF (the default resolver)."""
    core = NodeCore(kit.pod_config(), "node0")
    f = kit.open_file(core)
    r = kit.ioctl(f, kit.PRIME_FD_TO_HANDLE, struct.pack("<IIi", 0, 0, 3))
    assert r.result == -errno.EBADF
    assert r.out == struct.pack("<IIi", 0, 0, 3)


def test_file_release_drops_every_handle(core, f):
    """§6.6: closing a file releases all its handles; objects held elsewhere survive."""
    h1, h2 = kit.gem_create(f), kit.gem_create(f)
    key = kit.open_token(core, kit.prime_to_token(f, h2))
    f.release()
    assert f.handles == {}
    objs = kit.device(core).objects
    assert len(objs) == 1
    (bo,) = objs.values()
    assert (bo.handle_count, bo.refcount) == (0, 1)
    core.tokens.release(key)
    assert objs == {}
    assert h1 != h2


def test_prime_cmds_are_table_values():
    """§2.2: the wrappers above issue the spec's numbers."""
    assert (kit.PRIME_HANDLE_TO_FD, kit.PRIME_FD_TO_HANDLE) == (0xC00C642D, 0xC00C642E)
    assert kit.CALLER.uid == 1000
