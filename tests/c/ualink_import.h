/*
 * The importer's side of spec userspace-surface §3.3 steps 7-8 on one render fd: the
 * UALink IMPORT of an exporter's handle (a dma-buf fd), PRIME_FD_TO_HANDLE of it on the
 * same file, and a read/write GEM_VA MAP of the BO at `va` in that file's GPU VM (what
 * newer libhsakmt's hsaKmtMemoryVaMap does), through Debian's libdrm. For the two-node
 * SDMA tests hsakmt_sdma_fabric.c and fabric_sdma.c; the includer has included
 * amdgpu_drm.h, xf86drm.h and ualink/ualink_drm.h (in that order).
 */
#ifndef UALINK_IMPORT_H
#define UALINK_IMPORT_H
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

/* NULL, or the name of the step that failed (errno says why); *handle the GEM handle. */
static inline const char *import_and_map(int fd, uint64_t lo, uint64_t hi, uint64_t va,
					 uint64_t size, uint32_t *handle)
{
	union drm_amdgpu_ualink_handle u;
	struct drm_amdgpu_gem_va gva;
	int dmabuf, r, e;

	memset(&u, 0, sizeof(u));
	u.in.op = DRM_AMDGPU_UALINK_HANDLE_OP_IMPORT;
	u.in.import_ualink_handle[0] = lo;
	u.in.import_ualink_handle[1] = hi;
	if (drmCommandWriteRead(fd, DRM_AMDGPU_UALINK_HANDLE, &u, sizeof(u)))
		return "import";
	dmabuf = (int)u.out.import_dmabuf_handle;
	r = drmPrimeFDToHandle(fd, dmabuf, handle);
	e = errno;
	close(dmabuf); /* the handle holds the BO now */
	errno = e;
	if (r)
		return "prime_fd_to_handle";
	memset(&gva, 0, sizeof(gva));
	gva.handle = *handle;
	gva.operation = AMDGPU_VA_OP_MAP;
	gva.flags = AMDGPU_VM_PAGE_READABLE | AMDGPU_VM_PAGE_WRITEABLE;
	gva.va_address = va;
	gva.map_size = size;
	if (drmCommandWriteRead(fd, DRM_AMDGPU_GEM_VA, &gva, sizeof(gva)))
		return "gem_va";
	return NULL;
}

#endif
