"""The amdgpu half of a DrmDevice: its ioctl handlers and GEM/PRIME hooks (spec §1.6, §2.3–2.8).

Each DrmFile gets a GPU VM (`vm.GpuVm`) on first use; gem_object_open/close keep its bo_va
bookkeeping (§2.4) and GEM_VA maps BOs into it (§2.6).

The UALINK_HANDLE handler decodes the union and applies the kernel's prologue; the export
and import work itself is the UALink manager's (`UalinkOps`), injected so this layer does
not depend on the one above it.
"""

from __future__ import annotations

import errno
import logging
import struct
from collections.abc import Awaitable, Callable
from typing import Protocol

from ..abi import constants as c
from ..abi import ioctls as tbl
from ..abi import structs as st
from ..drm.completion import Completion
from ..drm.device import Caller, DriverVersion, DrmDevice, Handler, ProcessMemory
from ..drm.errors import DrmError
from ..drm.file import DrmFile
from ..drm.gem import DmaBuf, GemObject
from .bo import AmdgpuBo, MemoryPool, place
from .cs import BoLists, CommandSubmission
from .info import AmdgpuInfo
from .memory import UserMemory
from .profile import MI300X, DeviceProfile
from .vm import GpuVm, VaSync, gem_va

log = logging.getLogger(__name__)

# Domains that must stand alone (amdgpu_gem_are_domains_valid, §2.3).
_SPECIAL = c.DOMAIN_GDS | c.DOMAIN_GWS | c.DOMAIN_OA | c.DOMAIN_DOORBELL
_GDS_GWS_OA = c.DOMAIN_GDS | c.DOMAIN_GWS | c.DOMAIN_OA
# DRM_FILE_PAGE_OFFSET_START/SIZE in bytes: the fake mmap offset window (drm_gem.c, 64-bit).
_MMAP_OFFSET_START = (0xFFFFFFFF // c.PAGE_SIZE + 1) * c.PAGE_SIZE
_MMAP_OFFSET_END = _MMAP_OFFSET_START + (0xFFFFFFFF // c.PAGE_SIZE) * 256 * c.PAGE_SIZE
# Fields the handlers read or put in kdata, by the layouts' names (the unions' arms).
_CREATE_OUT_HANDLE = st.GEM_CREATE_OUT.field("handle")
_USERPTR_HANDLE = st.GEM_USERPTR.field("handle")
_MMAP_IN_HANDLE = st.GEM_MMAP_IN.field("handle")
_MMAP_OUT_ADDR = st.GEM_MMAP_OUT.field("addr_ptr")


class UalinkOps(Protocol):
    """What the UALINK_HANDLE handler needs from the accel's UALink manager."""

    @property
    def accel_active(self) -> bool: ...

    def export(self, file: DrmFile, gem_handle: int) -> tuple[int, int]: ...

    def import_handle(
        self, file: DrmFile, handle_lo: int, handle_hi: int
    ) -> DmaBuf | Completion[DmaBuf]: ...

    def revoke(self, bo: AmdgpuBo) -> None: ...


__all__ = ["AmdgpuDriver", "UalinkOps"]


async def user_pages_present(process: ProcessMemory, addr: int, size: int,
                             readonly: bool) -> None:
    """get_user_pages for a userptr BO that must be backed now (GEM_USERPTR's VALIDATE, the
    KFD's USERPTR allocation): every page mapped, writable unless `readonly`; else EFAULT,
    and `process` is closed on any failure."""
    try:
        ok = await process.accessible(addr, size, not readonly) >= size
    except BaseException:
        process.close()
        raise
    if not ok:
        process.close()
        raise DrmError(errno.EFAULT, "userptr range not mapped as asked")


# drm_getcap's KMS answers for amdgpu on a GPU without a display block (every profile: GC
# 9.4.x has no DCE). amdgpu keeps DRIVER_MODESET and calls drm_mode_config_init in
# amdgpu_device_init, but only a display IP's sw_init would set mode_config's fields, so
# they stay zero and there is no CRTC. By cap: DUMB_BUFFER (amdgpu has dumb_create),
# VBLANK_HIGH_CRTC, DUMB_PREFERRED_DEPTH, DUMB_PREFER_SHADOW, ASYNC_PAGE_FLIP, CURSOR_WIDTH
# and _HEIGHT (64 when unset), ADDFB2_MODIFIERS (!fb_modifiers_not_supported),
# PAGE_FLIP_TARGET (1 unless a CRTC lacks it), CRTC_IN_VBLANK_EVENT, ATOMIC_ASYNC_PAGE_FLIP.
HEADLESS_KMS_CAPS = {0x1: 1, 0x2: 1, 0x3: 0, 0x4: 0, 0x7: 0, 0x8: 64, 0x9: 64, 0x10: 1,
                     0x11: 1, 0x12: 1, 0x15: 0}


class AmdgpuDriver:
    def __init__(
        self,
        device: DrmDevice,
        vram_size: int,
        gtt_size: int,
        profile: DeviceProfile = MI300X,
        ualink_ip: bool = True,
        oops: Callable[[Caller], None] | None = None,
        oops_without_ualink: bool = False,
    ) -> None:
        self.device = device
        self.profile = profile
        # §13 N6: whether the GPU has the UALink IP block (a manager attaches as `ualink`
        # only then).
        self.ualink_ip = ualink_ip
        self.vram = MemoryPool("vram", vram_size)
        self.gtt = MemoryPool("gtt", gtt_size)
        # GDS, GWS and OA (AMDGPU_PL_GDS/GWS/OA): a BO of n entries is n pages of them
        self.on_chip = {
            c.DOMAIN_GDS: MemoryPool("gds", profile.gds_size * c.PAGE_SIZE),
            c.DOMAIN_GWS: MemoryPool("gws", profile.gws_size * c.PAGE_SIZE),
            c.DOMAIN_OA: MemoryPool("oa", profile.oa_size * c.PAGE_SIZE)}
        self.ualink: UalinkOps | None = None
        # §13 N6's quirk "no-ualink-oops": U's ioctl on a GPU without the UALink block
        # dereferences NULL; `oops` is what the oops does to the caller (the node's kills it)
        self.oops_without_ualink = oops_without_ualink
        self.oops = oops
        self._mmap_next = _MMAP_OFFSET_START
        # One hook shared by every BO (a bound method per BO would be 64 bytes each); it
        # looks _handle_free up at each call, so a wrapper installed later is honoured.
        self._on_handle_free: Callable[[AmdgpuBo], None] = lambda bo: self._handle_free(bo)
        self.gpu_faults = 0  # GPU page faults of loads/stores through any file's VM (policy 10)
        # amdgpu_drv.c: KMS_DRIVER_MAJOR.MINOR.PATCHLEVEL of the kernels the spec is from
        self.version = DriverVersion(3, 64, 0, "amdgpu", "20150101", "AMD GPU")
        self.kms_caps: dict[int, int] | None = HEADLESS_KMS_CAPS
        self.info = AmdgpuInfo(self, profile)  # INFO, and the CTX / VM stubs
        self.bo_lists = BoLists(self, device)  # BO_LIST (issue 35)
        self.cs = CommandSubmission(self, device, self.bo_lists)  # CS, WAIT_CS, WAIT_FENCES
        self.ioctls: dict[tbl.IoctlSpec, Handler] = {
            **tbl.bind(self), **tbl.bind(self.info), **tbl.bind(self.bo_lists),
            **tbl.bind(self.cs)}
        device.driver = self

    # -- BOs ---------------------------------------------------------------------------------
    def bo_create(self, size: int, alignment: int, domains: int, flags: int) -> AmdgpuBo:
        """amdgpu_gem_object_create with the create ioctl's retries (§2.3): a request that
        does not fit is retried without CPU_ACCESS_REQUIRED (the BO keeps that loss), then,
        if it was VRAM-only, as VRAM|GTT. A GDS, GWS or OA BO takes its entries from that
        aperture; none left is ENOMEM (TTM's ENOSPC, as ttm_bo_validate answers it)."""
        on_chip = self.on_chip.get(domains)
        if on_chip is not None:
            if not on_chip.fits(size):
                raise DrmError(errno.ENOMEM, f"{size // c.PAGE_SIZE} {on_chip.name} entries "
                               f"do not fit ({on_chip.size // c.PAGE_SIZE} in all)")
            bo = AmdgpuBo(self.device, size, alignment, domains, flags, on_chip)
            bo.on_handle_free = self._on_handle_free
            return bo
        while True:
            try:
                pool = place(size, domains, self.vram, self.gtt)
                break
            except DrmError:
                if flags & c.CREATE_CPU_ACCESS_REQUIRED:
                    flags &= ~c.CREATE_CPU_ACCESS_REQUIRED
                elif domains == c.DOMAIN_VRAM:
                    domains |= c.DOMAIN_GTT
                else:
                    raise
        bo = AmdgpuBo(self.device, size, alignment, domains, flags, pool)
        bo.on_handle_free = self._on_handle_free
        return bo

    def _handle_free(self, bo: AmdgpuBo) -> None:
        if self.ualink is not None:
            self.ualink.revoke(bo)

    def lookup_bo(self, file: DrmFile, handle: int) -> AmdgpuBo:
        obj = file.lookup(handle)
        if obj is None:
            raise DrmError(errno.ENOENT, f"no GEM handle {handle}")
        assert isinstance(obj, AmdgpuBo)
        return obj

    # -- DRM driver hooks --------------------------------------------------------------------
    def vm(self, file: DrmFile) -> GpuVm:
        """The file's GPU VM (amdgpu_driver_open_kms creates it at open; here on first use)."""
        vm = file.vm
        if vm is None:
            vm = file.vm = GpuVm()
        assert isinstance(vm, GpuVm)
        return vm

    def count_gpu_fault(self) -> None:
        self.gpu_faults += 1

    def gem_object_open(self, obj: GemObject, file: DrmFile) -> None:
        assert isinstance(obj, AmdgpuBo)
        self.vm(file).bo_open(obj)  # amdgpu_gem_object_open: find or add the bo_va

    def gem_object_close(self, obj: GemObject, file: DrmFile) -> None:
        assert isinstance(obj, AmdgpuBo)
        self.vm(file).bo_close(obj)  # the last handle takes the bo_va and its mappings

    def postclose(self, file: DrmFile) -> None:
        """amdgpu_driver_postclose_kms: the file's contexts go (amdgpu_ctx_mgr_fini), then
        its BO lists."""
        self.info.contexts_closed(file)
        self.bo_lists.file_closed(file)

    def gem_prime_export(self, obj: GemObject) -> DmaBuf:
        """amdgpu_gem_prime_export: userptr and VM_ALWAYS_VALID BOs cannot be shared."""
        assert isinstance(obj, AmdgpuBo)
        if obj.userptr is not None or obj.vm_always_valid:
            raise DrmError(errno.EPERM, "userptr and VM_ALWAYS_VALID BOs cannot be exported")
        return DmaBuf(obj)

    def gem_prime_import(self, buf: DmaBuf) -> GemObject:
        """amdgpu_gem_prime_import: our own dma-buf resolves to the BO itself (a new
        reference); another device's becomes a GTT import BO of ours."""
        if buf.obj.device is self.device:
            buf.obj.get()
            return buf.obj
        bo = AmdgpuBo(self.device, buf.size, 0, c.DOMAIN_GTT, 0, None)
        bo.on_handle_free = self._on_handle_free
        buf.get()
        bo.import_buf = buf
        return bo

    # -- GEM_CREATE (§2.3) ---------------------------------------------------------------------
    @tbl.handles(tbl.AMDGPU_GEM_CREATE)
    def gem_create_ioctl(self, file: DrmFile, kdata: bytearray, caller: Caller) -> None:
        args = st.GEM_CREATE_IN.decode(bytes(kdata[: st.GEM_CREATE_IN.size]))
        flags, domains = args.domain_flags, args.domains
        if flags & ~c.CREATE_SETTABLE_MASK:
            raise DrmError(errno.EINVAL, f"create flags {flags:#x}")
        if domains & ~c.DOMAIN_MASK:
            raise DrmError(errno.EINVAL, f"domains {domains:#x}")
        if domains & _SPECIAL and domains.bit_count() != 1:
            raise DrmError(errno.EINVAL, f"domains {domains:#x}: GDS/GWS/OA/DOORBELL stand alone")
        if flags & c.CREATE_ENCRYPTED:
            raise DrmError(errno.EINVAL, "TMZ is disabled")
        if domains & _GDS_GWS_OA:
            if flags & c.CREATE_VM_ALWAYS_VALID:
                raise DrmError(errno.EINVAL, "GDS/GWS/OA cannot be VM_ALWAYS_VALID")
            flags |= c.CREATE_NO_CPU_ACCESS
        if args.bo_size == 0:
            raise DrmError(errno.EINVAL, "zero-sized BO")
        if domains & (c.DOMAIN_GWS | c.DOMAIN_OA):  # amdgpu_bo_create: bo_size is entries
            size = args.bo_size * c.PAGE_SIZE
        elif domains & c.DOMAIN_GDS:  # ... a multiple of 4 of them
            size = -(-args.bo_size // 4) * 4 * c.PAGE_SIZE
        else:
            size = -(-args.bo_size // c.PAGE_SIZE) * c.PAGE_SIZE
        flags |= c.CREATE_VRAM_CLEARED | c.CREATE_VRAM_WIPE_ON_RELEASE
        bo = self.bo_create(size, args.alignment, domains, flags)
        handle = file.handle_create(bo)
        bo.put()  # the handle holds its own reference
        kdata[: st.GEM_CREATE_SIZE] = bytes(st.GEM_CREATE_SIZE)  # the union's out arm
        _CREATE_OUT_HANDLE.put(kdata, handle)

    # -- GEM_USERPTR (amdgpu_gem_userptr_ioctl) ----------------------------------------------
    @tbl.handles(tbl.AMDGPU_GEM_USERPTR)
    def gem_userptr_ioctl(
        self, file: DrmFile, kdata: bytearray, caller: Caller
    ) -> Awaitable[None] | None:
        """A BO over the caller's own memory, for the userptr rules of §1.6 E2, §2.5, §2.7 and
        §2.8. Unaligned address or size, or unknown flags → EINVAL; writable without
        REGISTER → EACCES (the MMU-notifier rule of the kernels the spec is taken from);
        VALIDATE faults the pages in now (EFAULT if any is not mapped, or not writable for a
        writable BO). The BO prefers and allows only GTT; GPU loads and stores reach the
        process's memory (the process, so the registering thread may exit; never another
        process that gets its pid later), and a READONLY one refuses GPU stores. VALIDATE
        looks at the process's mappings off the FUSE thread: then the answer is an
        awaitable."""
        args = st.GEM_USERPTR.decode(bytes(kdata[: st.GEM_USERPTR.size]))
        if (args.addr | args.size) & (c.GPU_PAGE_SIZE - 1):
            raise DrmError(errno.EINVAL, "userptr address and size must be page aligned")
        if args.flags & ~c.USERPTR_FLAGS:
            raise DrmError(errno.EINVAL, f"userptr flags {args.flags:#x}")
        if not args.flags & (c.USERPTR_READONLY | c.USERPTR_REGISTER):
            raise DrmError(errno.EACCES, "a writable userptr needs USERPTR_REGISTER")
        if args.size == 0:
            raise DrmError(errno.EINVAL, "zero-sized BO")
        opener = self.device.open_process_memory
        if opener is None:
            raise DrmError(errno.EFAULT, "no access to the caller's memory")
        process = opener(caller.pid)
        readonly = bool(args.flags & c.USERPTR_READONLY)
        if args.flags & c.USERPTR_VALIDATE:
            return self._userptr_validated(file, kdata, process, args.addr, args.size,
                                           readonly)
        self._userptr_create(file, kdata, process, args.addr, args.size, readonly)
        return None

    async def _userptr_validated(self, file: DrmFile, kdata: bytearray,
                                 process: ProcessMemory, addr: int, size: int,
                                 readonly: bool) -> None:
        await user_pages_present(process, addr, size, readonly)
        self._userptr_create(file, kdata, process, addr, size, readonly)

    def userptr_bo(self, process: ProcessMemory, addr: int, size: int,
                   readonly: bool) -> AmdgpuBo:
        """A GTT BO over `process`'s memory at `addr` (amdgpu_ttm_tt_set_userptr); it keeps
        `process` open for as long as it lives."""
        bo = AmdgpuBo(self.device, size, 0, c.DOMAIN_GTT, 0, None)
        bo.userptr = UserMemory(process, addr, size, readonly)
        bo.on_handle_free = self._on_handle_free
        return bo

    def _userptr_create(self, file: DrmFile, kdata: bytearray, process: ProcessMemory,
                        addr: int, size: int, readonly: bool) -> None:
        bo = self.userptr_bo(process, addr, size, readonly)
        handle = file.handle_create(bo)
        bo.put()
        _USERPTR_HANDLE.put(kdata, handle)

    # -- GEM_MMAP (§2.7) -----------------------------------------------------------------------
    @tbl.handles(tbl.AMDGPU_GEM_MMAP)
    def gem_mmap_ioctl(self, file: DrmFile, kdata: bytearray, caller: Caller) -> None:
        handle = _MMAP_IN_HANDLE.get(kdata)
        _MMAP_OUT_ADDR.put(kdata, 0)  # the union is zeroed before anything can fail
        bo = self.lookup_bo(file, handle)
        if bo.userptr is not None or not bo.cpu_accessible:
            raise DrmError(errno.EPERM, "userptr BO, or BO with NO_CPU_ACCESS")
        _MMAP_OUT_ADDR.put(kdata, self.mmap_offset(bo))

    def mmap_offset(self, bo: AmdgpuBo) -> int:
        """amdgpu_bo_mmap_offset: the BO's fake offset on the render node, given on first
        use (drm_gem_create_mmap_offset); ENOSPC when the offset space is used up."""
        if bo.mmap_offset == 0:
            pages = -(-bo.size // c.PAGE_SIZE) * c.PAGE_SIZE
            if self._mmap_next + pages > _MMAP_OFFSET_END:
                raise DrmError(errno.ENOSPC, "mmap offset space exhausted")
            bo.mmap_offset = self._mmap_next
            self._mmap_next += pages
        return bo.mmap_offset

    # -- GEM_VA (§2.6) -------------------------------------------------------------------------
    @tbl.handles(tbl.AMDGPU_GEM_VA)
    def gem_va_ioctl(
        self, file: DrmFile, kdata: bytearray, caller: Caller
    ) -> Awaitable[None] | None:
        """Table direction W: nothing is copied back. A 40-byte legacy call arrives here
        zero-extended to 64 bytes by the DRM core (§2.1)."""
        args = st.GEM_VA.decode(bytes(kdata[: st.GEM_VA.size]))

        def lookup(handle: int) -> AmdgpuBo | None:
            obj = file.lookup(handle)
            assert obj is None or isinstance(obj, AmdgpuBo)
            return obj

        sync = VaSync(lambda address, n: self.device.syncobj.read_u32s(caller, address, n),
                      file.syncobjs.find)
        return gem_va(self.vm(file), args, lookup, sync)

    # -- GEM_WAIT_IDLE (amdgpu_gem_wait_idle_ioctl) ----------------------------------------------
    @tbl.handles(tbl.AMDGPU_GEM_WAIT_IDLE)
    def gem_wait_idle_ioctl(self, file: DrmFile, kdata: bytearray, caller: Caller) -> None:
        """Unknown handle → ENOENT; else the BO's reservation is waited on. Nothing ever
        executes here, so no BO has a fence: it is idle at once, whatever the timeout and
        flags, and the kernel zeroes the union and answers out.status 0 (out.domain 0)."""
        args = st.GEM_WAIT_IDLE_IN.decode(bytes(kdata[: st.GEM_WAIT_IDLE_IN.size]))
        self.lookup_bo(file, args.handle)
        kdata[: st.GEM_WAIT_IDLE_SIZE] = bytes(st.GEM_WAIT_IDLE_SIZE)

    # -- GEM_METADATA (amdgpu_gem_metadata_ioctl) --------------------------------------------------
    @tbl.handles(tbl.AMDGPU_GEM_METADATA)
    def gem_metadata_ioctl(self, file: DrmFile, kdata: bytearray, caller: Caller) -> None:
        """Unknown handle → ENOENT; GET returns tiling_info, flags, data_size_bytes and the
        blob (bytes of data[] past it are the caller's, echoed); SET stores them (more than
        256 bytes → EINVAL); any other op → EINVAL (older kernels answered 0 there).
        The tiling check of pre-GFX9 families (TILE_SPLIT > 6) does not apply to ours."""
        args = st.decode_gem_metadata(bytes(kdata[: st.GEM_METADATA_SIZE]))
        bo = self.lookup_bo(file, args.handle)
        data_at = st.GEM_METADATA_DATA_OFFSET
        if args.op == c.GEM_METADATA_OP_GET_METADATA:
            struct.pack_into("<QQI", kdata, 8, bo.metadata_flags, bo.tiling_flags,
                             len(bo.metadata))
            kdata[data_at : data_at + len(bo.metadata)] = bo.metadata
        elif args.op == c.GEM_METADATA_OP_SET_METADATA:
            size = args.data_size_bytes
            if size > st.GEM_METADATA_DATA_BYTES:
                raise DrmError(errno.EINVAL, f"GEM_METADATA data_size_bytes {size} > 256")
            bo.tiling_flags = args.tiling_info
            bo.set_metadata(bytes(kdata[data_at : data_at + size]), args.flags)
        else:
            raise DrmError(errno.EINVAL, f"GEM_METADATA op {args.op}")

    # -- GEM_OP (§2.8) -------------------------------------------------------------------------
    @tbl.handles(tbl.AMDGPU_GEM_OP)
    def gem_op_ioctl(
        self, file: DrmFile, kdata: bytearray, caller: Caller
    ) -> Awaitable[None] | None:
        args = st.GEM_OP.decode(bytes(kdata[: st.GEM_OP.size]))
        if args.padding:
            raise DrmError(errno.EINVAL, "GEM_OP padding must be 0")
        bo = self.lookup_bo(file, args.handle)
        if args.op == c.GEM_OP_GET_GEM_CREATE_INFO:
            # The BO keeps its alignment in pages (tbo.page_alignment): it reads back rounded
            # up to a page (an NPA BO's byte alignment of 1 reads 4096).
            alignment = -(-bo.alignment // c.PAGE_SIZE) * c.PAGE_SIZE
            info = st.GemCreateIn(bo.size, alignment, bo.preferred_domains, bo.flags)
            # The last thing it does: nothing changes while the copy is in flight.
            return self.device.write_user(caller, args.value, st.GEM_CREATE_IN.encode(info))
        if args.op == c.GEM_OP_SET_PLACEMENT:
            if (bo.import_buf is not None or bo.npa is not None) and args.value & c.DOMAIN_VRAM:
                raise DrmError(errno.EINVAL, "imported BOs cannot prefer VRAM")
            if bo.userptr is not None:
                raise DrmError(errno.EPERM, "a userptr BO stays in GTT")
            bo.preferred_domains = args.value & (c.DOMAIN_VRAM | c.DOMAIN_GTT | c.DOMAIN_CPU)
            bo.allowed_domains = bo.preferred_domains
            if bo.allowed_domains == c.DOMAIN_VRAM:
                bo.allowed_domains |= c.DOMAIN_GTT
            return None
        raise DrmError(errno.EINVAL, f"GEM_OP op {args.op}")

    # -- UALINK_HANDLE (§1.3–§1.6) ---------------------------------------------------------------
    def _imported(self, file: DrmFile, kdata: bytearray, caller: Caller, buf: DmaBuf) -> None:
        """An import's dma-buf, at once or once the fabric completed it (§1.6 I3–I20): its
        token is the ioctl's answer, unless the file closed while the import was in flight."""
        if file.closed:
            buf.put()
            raise DrmError(errno.EBADF, "the file closed while the import was in flight")
        token = self.device.tokens.install(buf, file, caller.uid)
        st.UALINK_OUT_IMPORT_DMABUF.put(kdata, token)

    @tbl.handles(tbl.AMDGPU_UALINK_HANDLE)
    def ualink_handle_ioctl(
        self, file: DrmFile, kdata: bytearray, caller: Caller
    ) -> Completion[None] | None:
        args = st.decode_ualink_handle_in(bytes(kdata[: st.UALINK_HANDLE_SIZE]))
        if self.ualink is None and self.oops_without_ualink:
            log.critical("BUG: kernel NULL pointer dereference in the UALink ioctl of a GPU "
                         "without UALink (pid %d; quirk no-ualink-oops, §13 N6)", caller.pid)
            if self.oops is not None:
                self.oops(caller)
            raise DrmError(errno.EFAULT, "oops: NULL UALink info")
        # The state check comes before the op is even looked at (§1.6 step 1, §11.1; §13 N6:
        # also on a GPU without the UALink block).
        if self.ualink is None or not self.ualink.accel_active:
            raise DrmError(errno.EOPNOTSUPP, "accel is not ACTIVE")
        if args.op == c.UalinkOp.EXPORT:
            lo, hi = self.ualink.export(file, args.gem_handle)
            st.UALINK_HANDLE_OUT_EXPORT.pack_into(kdata, 0, lo, hi)  # export_ualink_handle[2]
        elif args.op == c.UalinkOp.IMPORT:
            got = self.ualink.import_handle(file, args.handle_lo, args.handle_hi)
            if isinstance(got, Completion):
                return got.then(lambda c: self._imported(file, kdata, caller, c.result()))
            self._imported(file, kdata, caller, got)
        else:
            raise DrmError(errno.EINVAL, f"UALink op {args.op}")
        return None
