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
#define DRM_CAP_TIMESTAMP_MONOTONIC 0x6
#define DRM_CAP_SYNCOBJ 0x13
#define DRM_CAP_SYNCOBJ_TIMELINE 0x14

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

/* fd: a dmabuf/ token from HANDLE_TO_FD (the shim turns it into an fd), a real fd in. */
#define DRM_SYNCOBJ_FD_TO_HANDLE_FLAGS_IMPORT_SYNC_FILE (1 << 0)
#define DRM_SYNCOBJ_HANDLE_TO_FD_FLAGS_EXPORT_SYNC_FILE (1 << 0)
struct drm_syncobj_handle {
	__u32 handle;
	__u32 flags;
	__s32 fd;
	__u32 pad;
};

struct drm_syncobj_transfer {
	__u32 src_handle;
	__u32 dst_handle;
	__u64 src_point;
	__u64 dst_point;
	__u32 flags;
	__u32 pad;
};

struct drm_syncobj_eventfd {
	__u32 handle;
	__u32 flags;
	__u64 point;
	__s32 fd;
	__u32 pad;
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
#define DRM_IOCTL_SYNCOBJ_HANDLE_TO_FD    DRM_IOWR(0xC1, struct drm_syncobj_handle)
#define DRM_IOCTL_SYNCOBJ_FD_TO_HANDLE    DRM_IOWR(0xC2, struct drm_syncobj_handle)
#define DRM_IOCTL_SYNCOBJ_TRANSFER        DRM_IOWR(0xCC, struct drm_syncobj_transfer)
#define DRM_IOCTL_SYNCOBJ_EVENTFD         DRM_IOWR(0xCF, struct drm_syncobj_eventfd)
#endif /* _DRM_H_ */

/* ---- amdgpu (amdgpu_drm.h) ------------------------------------------------ */
#ifndef __AMDGPU_DRM_H__
#define DRM_AMDGPU_GEM_CREATE 0x00
#define DRM_AMDGPU_GEM_MMAP   0x01
#define DRM_AMDGPU_GEM_METADATA 0x06
#define DRM_AMDGPU_GEM_WAIT_IDLE 0x07
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

struct drm_amdgpu_gem_wait_idle_in {
	__u32 handle;
	__u32 flags;
	__u64 timeout;
};
struct drm_amdgpu_gem_wait_idle_out {
	__u32 status;
	__u32 domain;
};
union drm_amdgpu_gem_wait_idle {
	struct drm_amdgpu_gem_wait_idle_in in;
	struct drm_amdgpu_gem_wait_idle_out out;
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
#define DRM_IOCTL_AMDGPU_GEM_WAIT_IDLE DRM_IOWR(DRM_COMMAND_BASE + DRM_AMDGPU_GEM_WAIT_IDLE, union drm_amdgpu_gem_wait_idle)
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

/* Contexts and VMIDs: accepted as the kernel does, nothing ever runs on them. */
#define DRM_AMDGPU_CTX 0x02
#define AMDGPU_CTX_OP_ALLOC_CTX     1
#define AMDGPU_CTX_OP_FREE_CTX      2
#define AMDGPU_CTX_OP_QUERY_STATE   3
#define AMDGPU_CTX_OP_QUERY_STATE2  4
#define AMDGPU_CTX_OP_GET_STABLE_PSTATE 5
#define AMDGPU_CTX_OP_SET_STABLE_PSTATE 6
#define AMDGPU_CTX_STABLE_PSTATE_FLAGS_MASK 0xf
#define AMDGPU_CTX_STABLE_PSTATE_NONE      0
#define AMDGPU_CTX_STABLE_PSTATE_STANDARD  1
#define AMDGPU_CTX_STABLE_PSTATE_MIN_SCLK  2
#define AMDGPU_CTX_STABLE_PSTATE_MIN_MCLK  3
#define AMDGPU_CTX_STABLE_PSTATE_PEAK      4
#define AMDGPU_CTX_NO_RESET         0
#define AMDGPU_CTX_PRIORITY_UNSET     -2048
#define AMDGPU_CTX_PRIORITY_VERY_LOW  -1023
#define AMDGPU_CTX_PRIORITY_NORMAL    0
#define AMDGPU_CTX_PRIORITY_VERY_HIGH 1023
struct drm_amdgpu_ctx_in {
	__u32 op;
	__u32 flags;
	__u32 ctx_id;
	__s32 priority;
};
union drm_amdgpu_ctx_out {
	struct {
		__u32 ctx_id;
		__u32 _pad;
	} alloc;
	struct {
		__u64 flags;
		__u32 hangs;
		__u32 reset_status;
	} state;
	struct {
		__u32 flags;
		__u32 _pad;
	} pstate;
};
union drm_amdgpu_ctx {
	struct drm_amdgpu_ctx_in in;
	union drm_amdgpu_ctx_out out;
};
#define DRM_IOCTL_AMDGPU_CTX DRM_IOWR(DRM_COMMAND_BASE + DRM_AMDGPU_CTX, union drm_amdgpu_ctx)

#define DRM_AMDGPU_VM 0x13
#define AMDGPU_VM_OP_RESERVE_VMID   1
#define AMDGPU_VM_OP_UNRESERVE_VMID 2
struct drm_amdgpu_vm_in {
	__u32 op;
	__u32 flags;
};
struct drm_amdgpu_vm_out {
	__u64 flags;
};
union drm_amdgpu_vm {
	struct drm_amdgpu_vm_in in;
	struct drm_amdgpu_vm_out out;
};
#define DRM_IOCTL_AMDGPU_VM DRM_IOWR(DRM_COMMAND_BASE + DRM_AMDGPU_VM, union drm_amdgpu_vm)

#define DRM_AMDGPU_BO_LIST 0x03
#define AMDGPU_BO_LIST_OP_CREATE  0
#define AMDGPU_BO_LIST_OP_DESTROY 1
#define AMDGPU_BO_LIST_OP_UPDATE  2
struct drm_amdgpu_bo_list_in {
	__u32 operation;
	__u32 list_handle;
	__u32 bo_number;
	__u32 bo_info_size;
	__u64 bo_info_ptr;
};
struct drm_amdgpu_bo_list_entry {
	__u32 bo_handle;
	__u32 bo_priority;
};
struct drm_amdgpu_bo_list_out {
	__u32 list_handle;
	__u32 _pad;
};
union drm_amdgpu_bo_list {
	struct drm_amdgpu_bo_list_in in;
	struct drm_amdgpu_bo_list_out out;
};
#define DRM_IOCTL_AMDGPU_BO_LIST \
	DRM_IOWR(DRM_COMMAND_BASE + DRM_AMDGPU_BO_LIST, union drm_amdgpu_bo_list)

#define DRM_AMDGPU_CS          0x04
#define DRM_AMDGPU_WAIT_CS     0x09
#define DRM_AMDGPU_WAIT_FENCES 0x12
#define AMDGPU_CHUNK_ID_IB                      0x01
#define AMDGPU_CHUNK_ID_FENCE                   0x02
#define AMDGPU_CHUNK_ID_DEPENDENCIES            0x03
#define AMDGPU_CHUNK_ID_SYNCOBJ_IN              0x04
#define AMDGPU_CHUNK_ID_SYNCOBJ_OUT             0x05
#define AMDGPU_CHUNK_ID_BO_HANDLES              0x06
#define AMDGPU_CHUNK_ID_SCHEDULED_DEPENDENCIES  0x07
#define AMDGPU_CHUNK_ID_SYNCOBJ_TIMELINE_WAIT   0x08
#define AMDGPU_CHUNK_ID_SYNCOBJ_TIMELINE_SIGNAL 0x09
#define AMDGPU_CHUNK_ID_CP_GFX_SHADOW           0x0a
struct drm_amdgpu_cs_chunk {
	__u32 chunk_id;
	__u32 length_dw;
	__u64 chunk_data;
};
struct drm_amdgpu_cs_in {
	__u32 ctx_id;
	__u32 bo_list_handle;
	__u32 num_chunks;
	__u32 flags;
	__u64 chunks;
};
struct drm_amdgpu_cs_out {
	__u64 handle;
};
union drm_amdgpu_cs {
	struct drm_amdgpu_cs_in in;
	struct drm_amdgpu_cs_out out;
};
struct drm_amdgpu_cs_chunk_ib {
	__u32 _pad;
	__u32 flags;
	__u64 va_start;
	__u32 ib_bytes;
	__u32 ip_type;
	__u32 ip_instance;
	__u32 ring;
};
struct drm_amdgpu_cs_chunk_dep {
	__u32 ip_type;
	__u32 ip_instance;
	__u32 ring;
	__u32 ctx_id;
	__u64 handle;
};
struct drm_amdgpu_cs_chunk_fence {
	__u32 handle;
	__u32 offset;
};
struct drm_amdgpu_cs_chunk_sem {
	__u32 handle;
};
struct drm_amdgpu_cs_chunk_syncobj {
	__u32 handle;
	__u32 flags;
	__u64 point;
};
struct drm_amdgpu_wait_cs_in {
	__u64 handle;
	__u64 timeout;
	__u32 ip_type;
	__u32 ip_instance;
	__u32 ring;
	__u32 ctx_id;
};
struct drm_amdgpu_wait_cs_out {
	__u64 status;
};
union drm_amdgpu_wait_cs {
	struct drm_amdgpu_wait_cs_in in;
	struct drm_amdgpu_wait_cs_out out;
};
struct drm_amdgpu_fence {
	__u32 ctx_id;
	__u32 ip_type;
	__u32 ip_instance;
	__u32 ring;
	__u64 seq_no;
};
struct drm_amdgpu_wait_fences_in {
	__u64 fences;
	__u32 fence_count;
	__u32 wait_all;
	__u64 timeout_ns;
};
struct drm_amdgpu_wait_fences_out {
	__u32 status;
	__u32 first_signaled;
};
union drm_amdgpu_wait_fences {
	struct drm_amdgpu_wait_fences_in in;
	struct drm_amdgpu_wait_fences_out out;
};
#define DRM_IOCTL_AMDGPU_CS DRM_IOWR(DRM_COMMAND_BASE + DRM_AMDGPU_CS, union drm_amdgpu_cs)
#define DRM_IOCTL_AMDGPU_WAIT_CS \
	DRM_IOWR(DRM_COMMAND_BASE + DRM_AMDGPU_WAIT_CS, union drm_amdgpu_wait_cs)
#define DRM_IOCTL_AMDGPU_WAIT_FENCES \
	DRM_IOWR(DRM_COMMAND_BASE + DRM_AMDGPU_WAIT_FENCES, union drm_amdgpu_wait_fences)

#define DRM_AMDGPU_FENCE_TO_HANDLE 0x14
#define AMDGPU_FENCE_TO_HANDLE_GET_SYNCOBJ      0
#define AMDGPU_FENCE_TO_HANDLE_GET_SYNCOBJ_FD   1
#define AMDGPU_FENCE_TO_HANDLE_GET_SYNC_FILE_FD 2
union drm_amdgpu_fence_to_handle {
	struct {
		struct drm_amdgpu_fence fence;
		__u32 what;
		__u32 pad;
	} in;
	struct {
		__u32 handle;
	} out;
};
#define DRM_IOCTL_AMDGPU_FENCE_TO_HANDLE \
	DRM_IOWR(DRM_COMMAND_BASE + DRM_AMDGPU_FENCE_TO_HANDLE, union drm_amdgpu_fence_to_handle)

/* AMDGPU_INFO: the answer goes to return_pointer, at most return_size bytes. */
#define DRM_AMDGPU_INFO 0x05
#define AMDGPU_INFO_ACCEL_WORKING     0x00
#define AMDGPU_INFO_HW_IP_INFO        0x02
#define AMDGPU_INFO_HW_IP_COUNT       0x03
#define AMDGPU_INFO_TIMESTAMP         0x05
#define AMDGPU_INFO_FW_VERSION        0x0e
#define AMDGPU_INFO_VRAM_USAGE        0x10
#define AMDGPU_INFO_GTT_USAGE         0x11
#define AMDGPU_INFO_GDS_CONFIG        0x13
#define AMDGPU_INFO_VRAM_GTT          0x14
#define AMDGPU_INFO_READ_MMR_REG      0x15
#define AMDGPU_INFO_DEV_INFO          0x16
#define AMDGPU_INFO_VIS_VRAM_USAGE    0x17
#define AMDGPU_INFO_MEMORY            0x19
#define AMDGPU_INFO_SENSOR            0x1D
#define AMDGPU_INFO_VRAM_LOST_COUNTER 0x1F
#define AMDGPU_INFO_MMR_SE_INDEX_SHIFT 0
#define AMDGPU_INFO_MMR_SE_INDEX_MASK  0xff
#define AMDGPU_INFO_MMR_SH_INDEX_SHIFT 8
#define AMDGPU_INFO_MMR_SH_INDEX_MASK  0xff
#define AMDGPU_HW_IP_GFX      0
#define AMDGPU_HW_IP_COMPUTE  1
#define AMDGPU_HW_IP_DMA      2
#define AMDGPU_HW_IP_UVD      3
#define AMDGPU_HW_IP_VCE      4
#define AMDGPU_HW_IP_UVD_ENC  5
#define AMDGPU_HW_IP_VCN_DEC  6
#define AMDGPU_HW_IP_VCN_ENC  7
#define AMDGPU_HW_IP_VCN_JPEG 8
#define AMDGPU_HW_IP_VPE      9
#define AMDGPU_HW_IP_NUM      10
#define AMDGPU_HW_IP_INSTANCE_MAX_COUNT 1
#define AMDGPU_INFO_FW_GFX_MEC 0x08
#define AMDGPU_INFO_FW_SDMA    0x0b
#define AMDGPU_INFO_SENSOR_GFX_SCLK 0x1
#define AMDGPU_INFO_SENSOR_GPU_TEMP 0x3
#define AMDGPU_IDS_FLAGS_FUSION      0x01
#define AMDGPU_IDS_FLAGS_GANG_SUBMIT 0x10
#define AMDGPU_FAMILY_AI 141
#define AMDGPU_VRAM_TYPE_HBM 6

struct drm_amdgpu_query_fw {
	__u32 fw_type;
	__u32 ip_instance;
	__u32 index;
	__u32 _pad;
};

struct drm_amdgpu_info {
	__u64 return_pointer;
	__u32 return_size;
	__u32 query;
	union {
		struct {
			__u32 id;
			__u32 _pad;
		} mode_crtc;
		struct {
			__u32 type;
			__u32 ip_instance;
		} query_hw_ip;
		struct {
			__u32 dword_offset;
			__u32 count;
			__u32 instance;
			__u32 flags;
		} read_mmr_reg;
		struct drm_amdgpu_query_fw query_fw;
		struct {
			__u32 type;
			__u32 offset;
		} vbios_info;
		struct {
			__u32 type;
		} sensor_info;
		struct {
			__u32 type;
		} video_cap;
	};
};

struct drm_amdgpu_info_gds {
	__u32 gds_gfx_partition_size;
	__u32 compute_partition_size;
	__u32 gds_total_size;
	__u32 gws_per_gfx_partition;
	__u32 gws_per_compute_partition;
	__u32 oa_per_gfx_partition;
	__u32 oa_per_compute_partition;
	__u32 _pad;
};

struct drm_amdgpu_info_vram_gtt {
	__u64 vram_size;
	__u64 vram_cpu_accessible_size;
	__u64 gtt_size;
};

struct drm_amdgpu_heap_info {
	__u64 total_heap_size;
	__u64 usable_heap_size;
	__u64 heap_usage;
	__u64 max_allocation;
};

struct drm_amdgpu_memory_info {
	struct drm_amdgpu_heap_info vram;
	struct drm_amdgpu_heap_info cpu_accessible_vram;
	struct drm_amdgpu_heap_info gtt;
};

struct drm_amdgpu_info_firmware {
	__u32 ver;
	__u32 feature;
};

/* The current kernel's 448 bytes; libdrm 2.4.114 knows the first 368 (to tcc_disabled_mask). */
struct drm_amdgpu_info_device {
	__u32 device_id;
	__u32 chip_rev;
	__u32 external_rev;
	__u32 pci_rev;
	__u32 family;
	__u32 num_shader_engines;
	__u32 num_shader_arrays_per_engine;
	__u32 gpu_counter_freq;
	__u64 max_engine_clock;
	__u64 max_memory_clock;
	__u32 cu_active_number;
	__u32 cu_ao_mask;
	__u32 cu_bitmap[4][4];
	__u32 enabled_rb_pipes_mask;
	__u32 num_rb_pipes;
	__u32 num_hw_gfx_contexts;
	__u32 pcie_gen;
	__u64 ids_flags;
	__u64 virtual_address_offset;
	__u64 virtual_address_max;
	__u32 virtual_address_alignment;
	__u32 pte_fragment_size;
	__u32 gart_page_size;
	__u32 ce_ram_size;
	__u32 vram_type;
	__u32 vram_bit_width;
	__u32 vce_harvest_config;
	__u32 gc_double_offchip_lds_buf;
	__u64 prim_buf_gpu_addr;
	__u64 pos_buf_gpu_addr;
	__u64 cntl_sb_buf_gpu_addr;
	__u64 param_buf_gpu_addr;
	__u32 prim_buf_size;
	__u32 pos_buf_size;
	__u32 cntl_sb_buf_size;
	__u32 param_buf_size;
	__u32 wave_front_size;
	__u32 num_shader_visible_vgprs;
	__u32 num_cu_per_sh;
	__u32 num_tcc_blocks;
	__u32 gs_vgt_table_depth;
	__u32 gs_prim_buffer_depth;
	__u32 max_gs_waves_per_vgt;
	__u32 pcie_num_lanes;
	__u32 cu_ao_bitmap[4][4];
	__u64 high_va_offset;
	__u64 high_va_max;
	__u32 pa_sc_tile_steering_override;
	__u64 tcc_disabled_mask;
	__u64 min_engine_clock;
	__u64 min_memory_clock;
	__u32 tcp_cache_size;
	__u32 num_sqc_per_wgp;
	__u32 sqc_data_cache_size;
	__u32 sqc_inst_cache_size;
	__u32 gl1c_cache_size;
	__u32 gl2c_cache_size;
	__u64 mall_size;
	__u32 enabled_rb_pipes_mask_hi;
	__u32 shadow_size;
	__u32 shadow_alignment;
	__u32 csa_size;
	__u32 csa_alignment;
	__u32 userq_ip_mask;
	__u32 pad;
};

/* The current kernel's 40 bytes (libdrm 2.4.114: 32, without the last two fields). */
struct drm_amdgpu_info_hw_ip {
	__u32 hw_ip_version_major;
	__u32 hw_ip_version_minor;
	__u64 capabilities_flags;
	__u32 ib_start_alignment;
	__u32 ib_size_alignment;
	__u32 available_rings;
	__u32 ip_discovery_version;
	__u32 userq_num_slots;
};
#define DRM_IOCTL_AMDGPU_INFO DRM_IOW(DRM_COMMAND_BASE + DRM_AMDGPU_INFO, struct drm_amdgpu_info)
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
