/* SPDX-License-Identifier: MIT */
/*
 * ualinkd's subset of the KFD uAPI (/dev/kfd, 'K' ioctls): the structs and
 * numbers the emulated KFD answers.  Guarded so it can sit next to the system
 * <linux/kfd_ioctl.h>; where that header is included first its definitions
 * win (the layouts are the same, tests/abi/test_kfd_abi.py checks both).
 */
#ifndef UALINK_KFD_H
#define UALINK_KFD_H

#include <linux/types.h>
#include <linux/ioctl.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifndef KFD_IOCTL_H_INCLUDED
#define AMDKFD_IOCTL_BASE 'K'

struct kfd_ioctl_get_version_args {
	__u32 major_version;
	__u32 minor_version;
};

struct kfd_ioctl_set_memory_policy_args {
	__u64 alternate_aperture_base;
	__u64 alternate_aperture_size;
	__u32 gpu_id;
	__u32 default_policy;	/* 0 coherent, 1 non-coherent */
	__u32 alternate_policy;
	__u32 pad;
};

struct kfd_ioctl_get_clock_counters_args {
	__u64 gpu_clock_counter;
	__u64 cpu_clock_counter;	/* CLOCK_MONOTONIC_RAW, ns */
	__u64 system_clock_counter;	/* CLOCK_BOOTTIME, ns */
	__u64 system_clock_freq;
	__u32 gpu_id;
	__u32 pad;
};

/* One entry of the array GET_PROCESS_APERTURES_NEW writes. */
struct kfd_process_device_apertures {
	__u64 lds_base;
	__u64 lds_limit;
	__u64 scratch_base;
	__u64 scratch_limit;
	__u64 gpuvm_base;
	__u64 gpuvm_limit;
	__u32 gpu_id;
	__u32 pad;
};

struct kfd_ioctl_get_process_apertures_new_args {
	__u64 kfd_process_device_apertures_ptr;
	__u32 num_of_nodes;	/* in: entries room (0: ask); out: entries written */
	__u32 pad;
};

struct kfd_ioctl_acquire_vm_args {
	__u32 drm_fd;	/* an open render node of the same GPU */
	__u32 gpu_id;
};

#define KFD_IOC_ALLOC_MEM_FLAGS_VRAM		(1 << 0)
#define KFD_IOC_ALLOC_MEM_FLAGS_GTT		(1 << 1)
#define KFD_IOC_ALLOC_MEM_FLAGS_USERPTR		(1 << 2)
#define KFD_IOC_ALLOC_MEM_FLAGS_DOORBELL	(1 << 3)
#define KFD_IOC_ALLOC_MEM_FLAGS_MMIO_REMAP	(1 << 4)
#define KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE	(1U << 31)
#define KFD_IOC_ALLOC_MEM_FLAGS_EXECUTABLE	(1 << 30)
#define KFD_IOC_ALLOC_MEM_FLAGS_PUBLIC		(1 << 29)

struct kfd_ioctl_alloc_memory_of_gpu_args {
	__u64 va_addr;
	__u64 size;
	__u64 handle;		/* out: gpu_id << 32 | index */
	__u64 mmap_offset;	/* out: where to mmap the render node (or kfd) */
	__u32 gpu_id;
	__u32 flags;
};

struct kfd_ioctl_free_memory_of_gpu_args {
	__u64 handle;
};

struct kfd_ioctl_map_memory_to_gpu_args {
	__u64 handle;
	__u64 device_ids_array_ptr;	/* __u32 gpu_ids */
	__u32 n_devices;
	__u32 n_success;	/* in: GPUs already done; out: GPUs done */
};

struct kfd_ioctl_unmap_memory_from_gpu_args {
	__u64 handle;
	__u64 device_ids_array_ptr;
	__u32 n_devices;
	__u32 n_success;
};

struct kfd_ioctl_get_available_memory_args {
	__u64 available;
	__u32 gpu_id;
	__u32 pad;
};

/* Events: a signal event's id is its slot in the events page. */
struct kfd_ioctl_create_event_args {
	__u64 event_page_offset;	/* in: the events page's allocation; out: its mmap cookie */
	__u32 event_trigger_data;	/* out */
	__u32 event_type;		/* 0 signal, ... */
	__u32 auto_reset;
	__u32 node_id;
	__u32 event_id;			/* out */
	__u32 event_slot_index;		/* out */
};

struct kfd_ioctl_destroy_event_args {
	__u32 event_id;
	__u32 pad;
};

struct kfd_ioctl_set_event_args {
	__u32 event_id;
	__u32 pad;
};

struct kfd_ioctl_reset_event_args {
	__u32 event_id;
	__u32 pad;
};

/* One entry of WAIT_EVENTS' array: exception data (a 32-byte union) the kernel fills for
 * memory and HW exception events, then the event to wait for. */
struct kfd_event_data {
	__u64 exception_data[4];
	__u64 kfd_event_data_ext;
	__u32 event_id;
	__u32 pad;
};

struct kfd_ioctl_wait_events_args {
	__u64 events_ptr;	/* struct kfd_event_data[num_events], 48 bytes each */
	__u32 num_events;
	__u32 wait_for_all;
	__u32 timeout;		/* ms; 0xffffffff: for ever */
	__u32 wait_result;	/* out: 0 complete, 1 timeout */
};

struct kfd_ioctl_set_scratch_backing_va_args {
	__u64 va_addr;
	__u32 gpu_id;
	__u32 pad;
};

struct kfd_ioctl_set_trap_handler_args {
	__u64 tba_addr;
	__u64 tma_addr;
	__u32 gpu_id;
	__u32 pad;
};

struct kfd_ioctl_set_xnack_mode_args {
	__s32 xnack_enabled;	/* < 0: query (out: the mode) */
};

struct kfd_ioctl_get_dmabuf_info_args {
	__u64 size;		/* out */
	__u64 metadata_ptr;	/* where the BO's UMD metadata goes (0: not wanted) */
	__u32 metadata_size;	/* in: room; out: the metadata's size */
	__u32 gpu_id;		/* out */
	__u32 flags;		/* out: KFD_IOC_ALLOC_MEM_FLAGS_* */
	__u32 dmabuf_fd;
};

struct kfd_ioctl_import_dmabuf_args {
	__u64 va_addr;
	__u64 handle;		/* out */
	__u32 gpu_id;
	__u32 dmabuf_fd;
};

struct kfd_ioctl_export_dmabuf_args {
	__u64 handle;
	__u32 flags;		/* O_CLOEXEC etc. for the fd */
	__u32 dmabuf_fd;	/* out */
};

/* Queues: create_queue_args is 96 bytes since 1.17 (sdma_engine_id); 88 before. */
struct kfd_ioctl_create_queue_args {
	__u64 ring_base_address;
	__u64 write_pointer_address;
	__u64 read_pointer_address;
	__u64 doorbell_offset;		/* out */
	__u32 ring_size;
	__u32 gpu_id;
	__u32 queue_type;
	__u32 queue_percentage;
	__u32 queue_priority;
	__u32 queue_id;			/* out */
	__u64 eop_buffer_address;
	__u64 eop_buffer_size;
	__u64 ctx_save_restore_address;
	__u32 ctx_save_restore_size;
	__u32 ctl_stack_size;
	__u32 sdma_engine_id;
	__u32 pad;
};

struct kfd_ioctl_destroy_queue_args {
	__u32 queue_id;
	__u32 pad;
};

struct kfd_ioctl_update_queue_args {
	__u64 ring_base_address;
	__u32 queue_id;
	__u32 ring_size;
	__u32 queue_percentage;
	__u32 queue_priority;
};

struct kfd_ioctl_set_cu_mask_args {
	__u32 queue_id;
	__u32 num_cu_mask;
	__u64 cu_mask_ptr;
};

struct kfd_ioctl_get_queue_wave_state_args {
	__u64 ctl_stack_address;
	__u32 ctl_stack_used_size;	/* out */
	__u32 save_area_used_size;	/* out */
	__u32 queue_id;
	__u32 pad;
};

struct kfd_ioctl_alloc_queue_gws_args {
	__u32 queue_id;
	__u32 num_gws;
	__u32 first_gws;		/* out */
	__u32 pad;
};

struct kfd_ioctl_get_tile_config_args {
	__u64 tile_config_ptr;		/* array of num_tile_configs u32 */
	__u64 macro_tile_config_ptr;	/* array of num_macro_tile_configs u32 */
	__u32 num_tile_configs;		/* in: array size, out: entries written */
	__u32 num_macro_tile_configs;	/* in: array size, out: entries written */
	__u32 gpu_id;
	__u32 gb_addr_config;		/* out */
	__u32 num_banks;		/* out */
	__u32 num_ranks;		/* out */
};

struct kfd_ioctl_runtime_enable_args {
	__u64 r_debug;
	__u32 mode_mask;
	__u32 capabilities_mask;
};

/* Answered EPERM for every op, as a kernel built without CONFIG_HSA_AMD_SVM. */
struct kfd_ioctl_svm_attribute {
	__u32 type;
	__u32 value;
};

struct kfd_ioctl_svm_args {
	__u64 start_addr;
	__u64 size;
	__u32 op;
	__u32 nattr;
	struct kfd_ioctl_svm_attribute attrs[];	/* nattr of them */
};

#define AMDKFD_IOC_GET_VERSION \
	_IOR(AMDKFD_IOCTL_BASE, 0x01, struct kfd_ioctl_get_version_args)
#define AMDKFD_IOC_SET_MEMORY_POLICY \
	_IOW(AMDKFD_IOCTL_BASE, 0x04, struct kfd_ioctl_set_memory_policy_args)
#define AMDKFD_IOC_GET_CLOCK_COUNTERS \
	_IOWR(AMDKFD_IOCTL_BASE, 0x05, struct kfd_ioctl_get_clock_counters_args)
#define AMDKFD_IOC_CREATE_EVENT \
	_IOWR(AMDKFD_IOCTL_BASE, 0x08, struct kfd_ioctl_create_event_args)
#define AMDKFD_IOC_DESTROY_EVENT \
	_IOW(AMDKFD_IOCTL_BASE, 0x09, struct kfd_ioctl_destroy_event_args)
#define AMDKFD_IOC_SET_EVENT \
	_IOW(AMDKFD_IOCTL_BASE, 0x0A, struct kfd_ioctl_set_event_args)
#define AMDKFD_IOC_RESET_EVENT \
	_IOW(AMDKFD_IOCTL_BASE, 0x0B, struct kfd_ioctl_reset_event_args)
#define AMDKFD_IOC_WAIT_EVENTS \
	_IOWR(AMDKFD_IOCTL_BASE, 0x0C, struct kfd_ioctl_wait_events_args)
#define AMDKFD_IOC_SET_SCRATCH_BACKING_VA \
	_IOWR(AMDKFD_IOCTL_BASE, 0x11, struct kfd_ioctl_set_scratch_backing_va_args)
#define AMDKFD_IOC_SET_TRAP_HANDLER \
	_IOW(AMDKFD_IOCTL_BASE, 0x13, struct kfd_ioctl_set_trap_handler_args)
#define AMDKFD_IOC_GET_PROCESS_APERTURES_NEW \
	_IOWR(AMDKFD_IOCTL_BASE, 0x14, struct kfd_ioctl_get_process_apertures_new_args)
#define AMDKFD_IOC_ACQUIRE_VM \
	_IOW(AMDKFD_IOCTL_BASE, 0x15, struct kfd_ioctl_acquire_vm_args)
#define AMDKFD_IOC_ALLOC_MEMORY_OF_GPU \
	_IOWR(AMDKFD_IOCTL_BASE, 0x16, struct kfd_ioctl_alloc_memory_of_gpu_args)
#define AMDKFD_IOC_FREE_MEMORY_OF_GPU \
	_IOW(AMDKFD_IOCTL_BASE, 0x17, struct kfd_ioctl_free_memory_of_gpu_args)
#define AMDKFD_IOC_MAP_MEMORY_TO_GPU \
	_IOWR(AMDKFD_IOCTL_BASE, 0x18, struct kfd_ioctl_map_memory_to_gpu_args)
#define AMDKFD_IOC_UNMAP_MEMORY_FROM_GPU \
	_IOWR(AMDKFD_IOCTL_BASE, 0x19, struct kfd_ioctl_unmap_memory_from_gpu_args)
#define AMDKFD_IOC_AVAILABLE_MEMORY \
	_IOWR(AMDKFD_IOCTL_BASE, 0x23, struct kfd_ioctl_get_available_memory_args)
#define AMDKFD_IOC_GET_DMABUF_INFO \
	_IOWR(AMDKFD_IOCTL_BASE, 0x1C, struct kfd_ioctl_get_dmabuf_info_args)
#define AMDKFD_IOC_IMPORT_DMABUF \
	_IOWR(AMDKFD_IOCTL_BASE, 0x1D, struct kfd_ioctl_import_dmabuf_args)
#define AMDKFD_IOC_SET_XNACK_MODE \
	_IOWR(AMDKFD_IOCTL_BASE, 0x21, struct kfd_ioctl_set_xnack_mode_args)
#define AMDKFD_IOC_EXPORT_DMABUF \
	_IOWR(AMDKFD_IOCTL_BASE, 0x24, struct kfd_ioctl_export_dmabuf_args)
#define AMDKFD_IOC_CREATE_QUEUE \
	_IOWR(AMDKFD_IOCTL_BASE, 0x02, struct kfd_ioctl_create_queue_args)
#define AMDKFD_IOC_DESTROY_QUEUE \
	_IOWR(AMDKFD_IOCTL_BASE, 0x03, struct kfd_ioctl_destroy_queue_args)
#define AMDKFD_IOC_UPDATE_QUEUE \
	_IOW(AMDKFD_IOCTL_BASE, 0x07, struct kfd_ioctl_update_queue_args)
#define AMDKFD_IOC_GET_TILE_CONFIG \
	_IOWR(AMDKFD_IOCTL_BASE, 0x12, struct kfd_ioctl_get_tile_config_args)
#define AMDKFD_IOC_SET_CU_MASK \
	_IOW(AMDKFD_IOCTL_BASE, 0x1A, struct kfd_ioctl_set_cu_mask_args)
#define AMDKFD_IOC_GET_QUEUE_WAVE_STATE \
	_IOWR(AMDKFD_IOCTL_BASE, 0x1B, struct kfd_ioctl_get_queue_wave_state_args)
#define AMDKFD_IOC_ALLOC_QUEUE_GWS \
	_IOWR(AMDKFD_IOCTL_BASE, 0x1E, struct kfd_ioctl_alloc_queue_gws_args)
#define AMDKFD_IOC_RUNTIME_ENABLE \
	_IOWR(AMDKFD_IOCTL_BASE, 0x25, struct kfd_ioctl_runtime_enable_args)
#define AMDKFD_IOC_SVM \
	_IOWR(AMDKFD_IOCTL_BASE, 0x20, struct kfd_ioctl_svm_args)
#endif /* KFD_IOCTL_H_INCLUDED */

#ifdef __cplusplus
}
#endif

#endif /* UALINK_KFD_H */
