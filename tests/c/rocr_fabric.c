/*
 * rocr_fabric: the importer's side of AMD's two-node UALink fabric test, on Debian's ROCr
 * 5.2.3 (tests/integration/test_fabric_sdma.py; the exporter is `fabric_sdma export`).
 * As AMD's test does: hsa_init, a dummy AQL queue "to create a VMID", the UALink import on
 * the render file the runtime's libhsakmt acquired (with ROCr's APIs Debian has, the BO is
 * mapped with GEM_VA there, as newer libhsakmt's hsaKmtMemoryVaMap does), then
 * hsa_amd_memory_async_copy with the CPU named as the destination agent, which forces ROCr's
 * SDMA blit (device->host), and back (host->device). Public APIs only: hsa.h,
 * hsa_ext_amd.h, the UALink/DRM uAPI (include/ualink/ualink_drm.h).
 *
 *   rocr_fabric <lo> <hi> <bytes>
 *     ok copy_remote_to_host ...   the exporter's pattern (seed 1) over the fabric
 *     ok copy_host_to_remote ...   pattern seed 2 at offset bytes/2 (the exporter checks)
 *   then, after a stdin line: one more remote->host copy, which after the exporter freed
 *   the BO is a GPU page fault: ROCr's VM-fault handler reports it and aborts the process.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <hsa/hsa.h>
#include <hsa/hsa_ext_amd.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ualink/ualink_drm.h"
#include "fabric_pattern.h"
#include "render_fd.h"

static hsa_agent_t cpu, gpu;
static hsa_amd_memory_pool_t sys_pool;
static int have_pool;

#define FAIL(name, fmt, ...)                                                      \
	do {                                                                      \
		printf("fail %s " fmt "\n", name, ##__VA_ARGS__);                 \
		exit(1);                                                          \
	} while (0)
#define CHECK(name, call)                                                         \
	do {                                                                      \
		hsa_status_t s_ = (call);                                         \
		if (s_ != HSA_STATUS_SUCCESS)                                     \
			FAIL(name, "status=0x%x", (unsigned)s_);                  \
	} while (0)

static hsa_status_t agent_cb(hsa_agent_t agent, void *data)
{
	hsa_device_type_t dev;
	(void)data;
	hsa_agent_get_info(agent, HSA_AGENT_INFO_DEVICE, &dev);
	if (dev == HSA_DEVICE_TYPE_CPU && !cpu.handle)
		cpu = agent;
	if (dev == HSA_DEVICE_TYPE_GPU && !gpu.handle)
		gpu = agent;
	return HSA_STATUS_SUCCESS;
}

static hsa_status_t pool_cb(hsa_amd_memory_pool_t pool, void *data)
{
	hsa_amd_segment_t seg;
	uint32_t flags = 0;
	(void)data;
	hsa_amd_memory_pool_get_info(pool, HSA_AMD_MEMORY_POOL_INFO_SEGMENT, &seg);
	hsa_amd_memory_pool_get_info(pool, HSA_AMD_MEMORY_POOL_INFO_GLOBAL_FLAGS, &flags);
	if (seg == HSA_AMD_SEGMENT_GLOBAL && !have_pool &&
	    (flags & HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_FINE_GRAINED)) {
		sys_pool = pool;
		have_pool = 1;
	}
	return HSA_STATUS_SUCCESS;
}

static void copy(void *dst, hsa_agent_t dst_agent, const void *src, hsa_agent_t src_agent,
		 size_t size, const char *name)
{
	hsa_signal_t done;
	hsa_signal_value_t v;

	CHECK("signal_create", hsa_signal_create(1, 0, NULL, &done));
	CHECK(name, hsa_amd_memory_async_copy(dst, dst_agent, src, src_agent, size, 0, NULL, done));
	v = hsa_signal_wait_scacquire(done, HSA_SIGNAL_CONDITION_LT, 1, 30000000000ull,
				      HSA_WAIT_STATE_BLOCKED);
	if (v != 0)
		FAIL(name, "value=%" PRId64 " after 30 s", v);
	hsa_signal_destroy(done);
}

int main(int argc, char **argv)
{
	union drm_amdgpu_ualink_handle u;
	struct drm_prime_handle ph = {0};
	struct drm_amdgpu_gem_va gva = {0};
	hsa_queue_t *q;
	uint8_t *host, *want;
	uint64_t remote;
	size_t size;
	void *reserve;
	char line[64];
	int fd;

	if (argc != 4) {
		fprintf(stderr, "usage: rocr_fabric <lo> <hi> <bytes>\n");
		return 2;
	}
	size = strtoull(argv[3], NULL, 0);
	setvbuf(stdout, NULL, _IOLBF, 0);
	alarm(120);
	CHECK("hsa_init", hsa_init());
	CHECK("agents", hsa_iterate_agents(agent_cb, NULL));
	CHECK("pools", hsa_amd_agent_iterate_memory_pools(cpu, pool_cb, NULL));
	if (!gpu.handle || !have_pool)
		FAIL("agents", "gpu=%d pool=%d", gpu.handle != 0, have_pool);
	/* AMD's test: a dummy queue to create a VMID */
	CHECK("queue_create", hsa_queue_create(gpu, 64, HSA_QUEUE_TYPE_MULTI, NULL, NULL,
					       UINT32_MAX, UINT32_MAX, &q));
	fd = acquired_render_fd(-1); /* (ROCr knows no render minor: the one of any) */
	if (fd < 0)
		FAIL("render_fd", "not exactly one render file");
	memset(&u, 0, sizeof(u));
	u.in.op = DRM_AMDGPU_UALINK_HANDLE_OP_IMPORT;
	u.in.import_ualink_handle[0] = strtoull(argv[1], NULL, 0);
	u.in.import_ualink_handle[1] = strtoull(argv[2], NULL, 0);
	if (ioctl(fd, DRM_IOCTL_AMDGPU_UALINK_HANDLE, &u))
		FAIL("import", "errno=%d", errno);
	ph.fd = (int32_t)u.out.import_dmabuf_handle;
	if (ioctl(fd, DRM_IOCTL_PRIME_FD_TO_HANDLE, &ph))
		FAIL("prime_fd_to_handle", "errno=%d", errno);
	close(ph.fd);
	reserve = mmap(NULL, size + (2u << 20), PROT_NONE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (reserve == MAP_FAILED)
		FAIL("reserve_va", "errno=%d", errno);
	remote = ((uint64_t)(uintptr_t)reserve + (2u << 20) - 1) & ~(uint64_t)((2u << 20) - 1);
	gva.handle = ph.handle;
	gva.operation = AMDGPU_VA_OP_MAP;
	gva.flags = AMDGPU_VM_PAGE_READABLE | AMDGPU_VM_PAGE_WRITEABLE;
	gva.va_address = remote;
	gva.map_size = size;
	if (ioctl(fd, DRM_IOCTL_AMDGPU_GEM_VA, &gva))
		FAIL("gem_va", "errno=%d", errno);
	printf("ok import va=%#" PRIx64 " size=%zu\n", remote, size);

	CHECK("host_alloc", hsa_amd_memory_pool_allocate(sys_pool, size, 0, (void **)&host));
	CHECK("allow_access", hsa_amd_agents_allow_access(1, &gpu, NULL, host));
	memset(host, 0, size);
	/* the CPU as the destination agent: ROCr's device->host SDMA blit */
	copy(host, cpu, (void *)(uintptr_t)remote, gpu, size, "copy_remote_to_host");
	want = malloc(size);
	pattern(want, size, 1);
	if (memcmp(host, want, size) != 0)
		FAIL("remote_bytes", "differ");
	printf("ok copy_remote_to_host size=%zu\n", size);
	pattern(host, size / 2, 2);
	copy((void *)(uintptr_t)(remote + size / 2), gpu, host, cpu, size / 2, "copy_host_to_remote");
	printf("ok copy_host_to_remote offset=%zu size=%zu seed=2\n", size / 2, size / 2);

	if (!fgets(line, sizeof(line), stdin))
		FAIL("again", "stdin closed");
	/* after the exporter freed the BO: a GPU page fault; ROCr aborts in its handler */
	copy(host, cpu, (void *)(uintptr_t)remote, gpu, 4096, "revoked_copy");
	printf("fail revoked_copy completed\n");
	return 1;
}
