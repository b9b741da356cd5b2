/* SPDX-License-Identifier: MIT */
/*
 * libualink: a small C client for ualinkd's emulated amdgpu render nodes.
 * Every call returns 0 (or a byte count) on success and a negative errno on
 * failure; EINTR and EAGAIN are retried as libdrm's drmIoctl does.
 */
#ifndef UALINK_UALINK_H
#define UALINK_UALINK_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "ualink/ualink_drm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* An open render node (a DrmFile in the daemon). Opaque. */
typedef struct ualink_dev ualink_dev;

/* Open a render node, e.g. "<mount>/dri/renderD128". NULL means
 * $UALINK_RENDER_NODE, else /dev/dri/renderD128.  The dma-buf directory is
 * $UALINK_DMABUF_DIR, else "<dir of path>/../dmabuf" (<mount>/dmabuf). */
int ualink_open(const char *path, ualink_dev **out);
/* Close the render node: the daemon drops every GEM handle of this file. */
void ualink_close(ualink_dev *dev);
/* The underlying render-node fd (still owned by dev). */
int ualink_fd(const ualink_dev *dev);

int ualink_bo_create(ualink_dev *dev, uint64_t size, uint64_t alignment,
		     uint64_t domains, uint64_t flags, uint32_t *handle);
int ualink_bo_close(ualink_dev *dev, uint32_t handle);

/* UALink EXPORT: handle[0] = handle_lo, handle[1] = handle_hi. */
int ualink_export(ualink_dev *dev, uint32_t gem_handle, uint64_t handle[2]);
/* UALink IMPORT: *dmabuf_fd receives a real dma-buf fd (O_RDWR|O_CLOEXEC). */
int ualink_import(ualink_dev *dev, const uint64_t handle[2], int *dmabuf_fd);

int ualink_prime_handle_to_fd(ualink_dev *dev, uint32_t gem_handle,
			      uint32_t flags, int *dmabuf_fd);
int ualink_prime_fd_to_handle(ualink_dev *dev, int dmabuf_fd,
			      uint32_t *gem_handle);

int ualink_va_map(ualink_dev *dev, uint32_t gem_handle, uint64_t va,
		  uint64_t offset_in_bo, uint64_t size, uint32_t flags);
int ualink_va_unmap(ualink_dev *dev, uint32_t gem_handle, uint64_t va,
		    uint64_t offset_in_bo, uint64_t size);

/* GPU load/store through this file's GPU VM at virtual address va. */
ssize_t ualink_gpu_read(ualink_dev *dev, uint64_t va, void *buf, size_t len);
ssize_t ualink_gpu_write(ualink_dev *dev, uint64_t va, const void *buf,
			 size_t len);

#ifdef __cplusplus
}
#endif

#endif /* UALINK_UALINK_H */
