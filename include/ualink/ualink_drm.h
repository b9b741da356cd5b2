/* SPDX-License-Identifier: MIT */
/*
 * ualinkd's subset of the DRM / amdgpu uAPI: the structs and ioctl numbers a
 * UALink client issues against an emulated render node.  Every block is
 * guarded so this header can be included next to the system <drm/drm.h> and
 * <drm/amdgpu_drm.h>; where a system header already defined a block, its
 * definitions win (the layouts are the same).
 */
#ifndef UALINK_DRM_H
#define UALINK_DRM_H

#include <linux/types.h>
#include <linux/ioctl.h>
#include <fcntl.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- DRM core (drm.h) ---------------------------------------------------- */
#ifndef _DRM_H_
#define DRM_IOCTL_BASE   'd'
#define DRM_IO(nr)          _IO(DRM_IOCTL_BASE, nr)
#define DRM_IOR(nr, type)   _IOR(DRM_IOCTL_BASE, nr, type)
#define DRM_IOW(nr, type)   _IOW(DRM_IOCTL_BASE, nr, type)
#define DRM_IOWR(nr, type)  _IOWR(DRM_IOCTL_BASE, nr, type)
#define DRM_COMMAND_BASE 0x40
#define DRM_COMMAND_END  0xA0

struct drm_gem_close {
	__u32 handle;
	__u32 pad;
};

#define DRM_CLOEXEC O_CLOEXEC
#define DRM_RDWR    O_RDWR
struct drm_prime_handle {
	__u32 handle;
	__u32 flags;
	__s32 fd;
};

/* User pointers inside: the FUSE file cannot fill it; the LD_PRELOAD shim answers it. */
struct drm_version {
	int version_major;
	int version_minor;
	int version_patchlevel;
	size_t name_len;
	char *name;
	size_t date_len;
	char *date;
	size_t desc_len;
	char *desc;
};
#define DRM_IOCTL_VERSION DRM_IOWR(0x00, struct drm_version)

struct drm_get_cap {
	__u64 capability;
	__u64 value;
};
#define DRM_CAP_PRIME 0x5
#define DRM_PRIME_CAP_IMPORT 0x1
#define DRM_PRIME_CAP_EXPORT 0x2

#define DRM_SYNCOBJ_CREATE_SIGNALED (1 << 0)
struct drm_syncobj_create {
	__u32 handle;
	__u32 flags;
};

struct drm_syncobj_destroy {
	__u32 handle;
	__u32 pad;
};

#define DRM_SYNCOBJ_WAIT_FLAGS_WAIT_ALL        (1 << 0)
#define DRM_SYNCOBJ_WAIT_FLAGS_WAIT_FOR_SUBMIT (1 << 1)
#define DRM_SYNCOBJ_WAIT_FLAGS_WAIT_AVAILABLE  (1 << 2)
#define DRM_SYNCOBJ_WAIT_FLAGS_WAIT_DEADLINE   (1 << 3)
struct drm_syncobj_wait {
	__u64 handles;
	__s64 timeout_nsec;	/* absolute CLOCK_MONOTONIC */
	__u32 count_handles;
	__u32 flags;
	__u32 first_signaled;
	__u32 pad;
	__u64 deadline_nsec;
};

struct drm_syncobj_timeline_wait {
	__u64 handles;
	__u64 points;
	__s64 timeout_nsec;	/* absolute CLOCK_MONOTONIC */
	__u32 count_handles;
	__u32 flags;
	__u32 first_signaled;
	__u32 pad;
	__u64 deadline_nsec;
};

struct drm_syncobj_array {
	__u64 handles;
	__u32 count_handles;
	__u32 pad;
};

#define DRM_SYNCOBJ_QUERY_FLAGS_LAST_SUBMITTED (1 << 0)
struct drm_syncobj_timeline_array {
	__u64 handles;
	__u64 points;
	__u32 count_handles;
	__u32 flags;
};

#define DRM_IOCTL_GEM_CLOSE          DRM_IOW(0x09, struct drm_gem_close)
#define DRM_IOCTL_GET_CAP            DRM_IOWR(0x0c, struct drm_get_cap)
#define DRM_IOCTL_PRIME_HANDLE_TO_FD DRM_IOWR(0x2d, struct drm_prime_handle)
#define DRM_IOCTL_PRIME_FD_TO_HANDLE DRM_IOWR(0x2e, struct drm_prime_handle)
#define DRM_IOCTL_SYNCOBJ_CREATE     DRM_IOWR(0xBF, struct drm_syncobj_create)
#define DRM_IOCTL_SYNCOBJ_DESTROY    DRM_IOWR(0xC0, struct drm_syncobj_destroy)
#define DRM_IOCTL_SYNCOBJ_WAIT       DRM_IOWR(0xC3, struct drm_syncobj_wait)
#define DRM_IOCTL_SYNCOBJ_RESET      DRM_IOWR(0xC4, struct drm_syncobj_array)
#define DRM_IOCTL_SYNCOBJ_SIGNAL     DRM_IOWR(0xC5, struct drm_syncobj_array)
#define DRM_IOCTL_SYNCOBJ_TIMELINE_WAIT   DRM_IOWR(0xCA, struct drm_syncobj_timeline_wait)
#define DRM_IOCTL_SYNCOBJ_QUERY           DRM_IOWR(0xCB, struct drm_syncobj_timeline_array)
#define DRM_IOCTL_SYNCOBJ_TIMELINE_SIGNAL DRM_IOWR(0xCD, struct drm_syncobj_timeline_array)
#endif /* _DRM_H_ */

/* ---- amdgpu (amdgpu_drm.h) ------------------------------------------------ */
#ifndef __AMDGPU_DRM_H__
#define DRM_AMDGPU_GEM_CREATE 0x00
#define DRM_AMDGPU_GEM_MMAP   0x01
#define DRM_AMDGPU_GEM_METADATA 0x06
#define DRM_AMDGPU_GEM_VA     0x08
#define DRM_AMDGPU_GEM_OP     0x10
#define DRM_AMDGPU_GEM_USERPTR 0x11

#define AMDGPU_GEM_DOMAIN_CPU      0x1
#define AMDGPU_GEM_DOMAIN_GTT      0x2
#define AMDGPU_GEM_DOMAIN_VRAM     0x4
#define AMDGPU_GEM_DOMAIN_GDS      0x8
#define AMDGPU_GEM_DOMAIN_GWS      0x10
#define AMDGPU_GEM_DOMAIN_OA       0x20
#define AMDGPU_GEM_DOMAIN_DOORBELL 0x40
#define AMDGPU_GEM_DOMAIN_MASK     0x7F

#define AMDGPU_GEM_CREATE_CPU_ACCESS_REQUIRED (1 << 0)
#define AMDGPU_GEM_CREATE_NO_CPU_ACCESS       (1 << 1)
#define AMDGPU_GEM_CREATE_CPU_GTT_USWC        (1 << 2)
#define AMDGPU_GEM_CREATE_VRAM_CLEARED        (1 << 3)
#define AMDGPU_GEM_CREATE_VRAM_CONTIGUOUS     (1 << 5)
#define AMDGPU_GEM_CREATE_VM_ALWAYS_VALID     (1 << 6)
#define AMDGPU_GEM_CREATE_EXPLICIT_SYNC       (1 << 7)

struct drm_amdgpu_gem_create_in {
	__u64 bo_size;
	__u64 alignment;
	__u64 domains;
	__u64 domain_flags;
};
struct drm_amdgpu_gem_create_out {
	__u32 handle;
	__u32 _pad;
};
union drm_amdgpu_gem_create {
	struct drm_amdgpu_gem_create_in in;
	struct drm_amdgpu_gem_create_out out;
};

struct drm_amdgpu_gem_mmap_in {
	__u32 handle;
	__u32 _pad;
};
struct drm_amdgpu_gem_mmap_out {
	__u64 addr_ptr;
};
union drm_amdgpu_gem_mmap {
	struct drm_amdgpu_gem_mmap_in in;
	struct drm_amdgpu_gem_mmap_out out;
};

#define AMDGPU_VA_OP_MAP     1
#define AMDGPU_VA_OP_UNMAP   2
#define AMDGPU_VA_OP_CLEAR   3
#define AMDGPU_VA_OP_REPLACE 4
#define AMDGPU_VM_DELAY_UPDATE    (1 << 0)
#define AMDGPU_VM_PAGE_READABLE   (1 << 1)
#define AMDGPU_VM_PAGE_WRITEABLE  (1 << 2)
#define AMDGPU_VM_PAGE_EXECUTABLE (1 << 3)
#define AMDGPU_VM_PAGE_PRT        (1 << 4)

struct drm_amdgpu_gem_va {
	__u32 handle;
	__u32 _pad;
	__u32 operation;
	__u32 flags;
	__u64 va_address;
	__u64 offset_in_bo;
	__u64 map_size;
	__u64 vm_timeline_point;
	__u32 vm_timeline_syncobj_out;
	__u32 num_syncobj_handles;
	__u64 input_fence_syncobj_handles;
};

#define AMDGPU_GEM_OP_GET_GEM_CREATE_INFO 0
#define AMDGPU_GEM_OP_SET_PLACEMENT       1
#define AMDGPU_GEM_OP_GET_MAPPING_INFO    2
struct drm_amdgpu_gem_op {
	__u32 handle;
	__u32 op;
	__u64 value;
	__u32 num_entries;
	__u32 padding;
};

#define AMDGPU_GEM_METADATA_OP_SET_METADATA 1
#define AMDGPU_GEM_METADATA_OP_GET_METADATA 2
struct drm_amdgpu_gem_metadata {
	__u32 handle;
	__u32 op;
	struct {
		__u64 flags;
		__u64 tiling_info;
		__u32 data_size_bytes;
		__u32 data[64];
	} data;
};

#define DRM_IOCTL_AMDGPU_GEM_CREATE DRM_IOWR(DRM_COMMAND_BASE + DRM_AMDGPU_GEM_CREATE, union drm_amdgpu_gem_create)
#define DRM_IOCTL_AMDGPU_GEM_MMAP   DRM_IOWR(DRM_COMMAND_BASE + DRM_AMDGPU_GEM_MMAP, union drm_amdgpu_gem_mmap)
#define DRM_IOCTL_AMDGPU_GEM_VA     DRM_IOW(DRM_COMMAND_BASE + DRM_AMDGPU_GEM_VA, struct drm_amdgpu_gem_va)
#define DRM_IOCTL_AMDGPU_GEM_METADATA DRM_IOWR(DRM_COMMAND_BASE + DRM_AMDGPU_GEM_METADATA, struct drm_amdgpu_gem_metadata)
#define DRM_IOCTL_AMDGPU_GEM_OP     DRM_IOWR(DRM_COMMAND_BASE + DRM_AMDGPU_GEM_OP, struct drm_amdgpu_gem_op)

#define AMDGPU_GEM_USERPTR_READONLY (1 << 0)
#define AMDGPU_GEM_USERPTR_ANONONLY (1 << 1)
#define AMDGPU_GEM_USERPTR_VALIDATE (1 << 2)
#define AMDGPU_GEM_USERPTR_REGISTER (1 << 3)
struct drm_amdgpu_gem_userptr {
	__u64 addr;
	__u64 size;
	__u32 flags;
	__u32 handle;
};
#define DRM_IOCTL_AMDGPU_GEM_USERPTR DRM_IOWR(DRM_COMMAND_BASE + DRM_AMDGPU_GEM_USERPTR, struct drm_amdgpu_gem_userptr)
#endif /* __AMDGPU_DRM_H__ */

/* ---- UALink (series 2, patch 2/3) ------------------------------------------ */
#ifndef DRM_AMDGPU_UALINK_HANDLE
#define DRM_AMDGPU_UALINK_HANDLE 0x1B

#define DRM_AMDGPU_UALINK_HANDLE_OP_EXPORT 0
#define DRM_AMDGPU_UALINK_HANDLE_OP_IMPORT 1

struct drm_amdgpu_ualink_handle_in {
	__u32 op;
	__u32 flags;
	union {
		__u32 gem_handle;
		__u64 import_ualink_handle[2];
	};
};

union drm_amdgpu_ualink_handle_out {
	__u64 export_ualink_handle[2];
	__u32 import_dmabuf_handle;
};

union drm_amdgpu_ualink_handle {
	struct drm_amdgpu_ualink_handle_in in;
	union drm_amdgpu_ualink_handle_out out;
};

#define DRM_IOCTL_AMDGPU_UALINK_HANDLE \
	DRM_IOWR(DRM_COMMAND_BASE + DRM_AMDGPU_UALINK_HANDLE, union drm_amdgpu_ualink_handle)
#endif /* DRM_AMDGPU_UALINK_HANDLE */

#ifdef __cplusplus
}
#endif

#endif /* UALINK_DRM_H */
