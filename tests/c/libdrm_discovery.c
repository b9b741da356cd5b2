/* SPDX-License-Identifier: MIT */
/*
 * libdrm_discovery: how an unmodified libdrm / libdrm_amdgpu program finds and
 * opens its GPUs, written only against the public API of Debian's libdrm-dev
 * (2.4.114; `pkg-config libdrm libdrm_amdgpu`).  Each check names the libdrm
 * function it follows (spec userspace-surface §2.2).  Run under
 * libualink_shim.so against a node, or inside a namespace node, by
 * tests/integration/test_libdrm.py, which parses its lines:
 *
 *   ok <step> key=value ...     a step that went as on real amdgpu hardware
 *   fail <step> err=<n> ...     the first step that failed (exit status 1)
 *
 * Nothing here knows ualinkd: the paths are /dev/dri's.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <amdgpu.h>
#include <amdgpu_drm.h>
#include <xf86drm.h>

#include "libdrm_check.h"

static void print_device(const char *step, drmDevicePtr d)
{
	printf("ok %s bustype=%d available=%#x primary=%s render=%s", step, d->bustype,
	       d->available_nodes,
	       d->available_nodes & (1 << DRM_NODE_PRIMARY) ? d->nodes[DRM_NODE_PRIMARY] : "-",
	       d->available_nodes & (1 << DRM_NODE_RENDER) ? d->nodes[DRM_NODE_RENDER] : "-");
	if (d->bustype == DRM_BUS_PCI)
		printf(" pci=%04x:%02x:%02x.%u vendor=%04x device=%04x subvendor=%04x "
		       "subdevice=%04x revision=%02x",
		       d->businfo.pci->domain, d->businfo.pci->bus, d->businfo.pci->dev,
		       d->businfo.pci->func, d->deviceinfo.pci->vendor_id,
		       d->deviceinfo.pci->device_id, d->deviceinfo.pci->subvendor_id,
		       d->deviceinfo.pci->subdevice_id, d->deviceinfo.pci->revision_id);
	printf("\n");
}

/* Every AMDGPU_INFO query of the 2.4.114 API a tool or libdrm's tests issue
 * (amdgpu_device_initialize issued ACCEL_WORKING, DEV_INFO, READ_MMR_REG). */
static void queries(amdgpu_device_handle dev)
{
	struct drm_amdgpu_info_hw_ip ip;
	struct drm_amdgpu_info_vram_gtt vram_gtt;
	struct drm_amdgpu_memory_info mem;
	struct drm_amdgpu_info_device di;
	struct amdgpu_gds_resource_info gds;
	struct amdgpu_heap_info heap;
	struct amdgpu_gpu_info info;
	uint32_t u32, fw, feature, reg;
	uint64_t u64;
	unsigned count;

	/* amdgpu_query_gpu_info: the copy amdgpu_device_initialize made of DEV_INFO */
	check(amdgpu_query_gpu_info(dev, &info), "query_gpu_info");
	printf("ok query_gpu_info family=%u asic_id=%#x chip_rev=%u chip_external_rev=%u "
	       "ids_flags=%#" PRIx64 " pci_rev=%u cu_active=%u num_se=%u vram_type=%u "
	       "vram_bit_width=%u\n", info.family_id, info.asic_id, info.chip_rev,
	       info.chip_external_rev, info.ids_flags, info.pci_rev_id, info.cu_active_number,
	       info.num_shader_engines, info.vram_type, info.vram_bit_width);
	printf("ok marketing_name name=%s\n", amdgpu_get_marketing_name(dev) ?: "(null)");

	/* amdgpu_query_info(ACCEL_WORKING): non-zero on a working GPU */
	check(amdgpu_query_info(dev, AMDGPU_INFO_ACCEL_WORKING, sizeof(u32), &u32),
	      "accel_working");
	printf("ok accel_working value=%u\n", u32);
	/* amdgpu_query_info(DEV_INFO), the 2.4.114 struct (368 bytes): its VA limits */
	memset(&di, 0, sizeof(di));
	check(amdgpu_query_info(dev, AMDGPU_INFO_DEV_INFO, sizeof(di), &di), "dev_info");
	printf("ok dev_info size=%zu device_id=%#x family=%u va_offset=%#llx va_max=%#llx "
	       "high_va_offset=%#llx high_va_max=%#llx va_alignment=%u\n", sizeof(di),
	       di.device_id, di.family, (unsigned long long)di.virtual_address_offset,
	       (unsigned long long)di.virtual_address_max,
	       (unsigned long long)di.high_va_offset, (unsigned long long)di.high_va_max,
	       di.virtual_address_alignment);
	/* amdgpu_read_mm_registers: GB_ADDR_CONFIG, as amdgpu_device_initialize reads it */
	check(amdgpu_read_mm_registers(dev, 0x263e, 1, 0xffffffff, 0, &reg), "read_mmr_reg");
	printf("ok read_mmr_reg value=%#x\n", reg);

	/* amdgpu_query_heap_info: VRAM_GTT + VRAM_USAGE / VIS_VRAM_USAGE / GTT_USAGE */
	check(amdgpu_query_heap_info(dev, AMDGPU_GEM_DOMAIN_VRAM, 0, &heap), "heap_vram");
	printf("ok heap_vram size=%" PRIu64 " usage=%" PRIu64 " max_allocation=%" PRIu64 "\n",
	       heap.heap_size, heap.heap_usage, heap.max_allocation);
	check(amdgpu_query_heap_info(dev, AMDGPU_GEM_DOMAIN_VRAM,
				     AMDGPU_GEM_CREATE_CPU_ACCESS_REQUIRED, &heap), "heap_vis_vram");
	printf("ok heap_vis_vram size=%" PRIu64 " usage=%" PRIu64 "\n", heap.heap_size,
	       heap.heap_usage);
	check(amdgpu_query_heap_info(dev, AMDGPU_GEM_DOMAIN_GTT, 0, &heap), "heap_gtt");
	printf("ok heap_gtt size=%" PRIu64 " usage=%" PRIu64 "\n", heap.heap_size,
	       heap.heap_usage);
	check(amdgpu_query_info(dev, AMDGPU_INFO_VRAM_GTT, sizeof(vram_gtt), &vram_gtt),
	      "vram_gtt");
	printf("ok vram_gtt vram=%llu cpu_accessible_vram=%llu gtt=%llu\n",
	       (unsigned long long)vram_gtt.vram_size,
	       (unsigned long long)vram_gtt.vram_cpu_accessible_size,
	       (unsigned long long)vram_gtt.gtt_size);
	check(amdgpu_query_info(dev, AMDGPU_INFO_VRAM_USAGE, sizeof(u64), &u64), "vram_usage");
	printf("ok vram_usage value=%" PRIu64 "\n", u64);
	/* amdgpu_query_info(MEMORY): the three heaps in one */
	check(amdgpu_query_info(dev, AMDGPU_INFO_MEMORY, sizeof(mem), &mem), "memory");
	printf("ok memory vram_total=%llu vram_usable=%llu gtt_total=%llu\n",
	       (unsigned long long)mem.vram.total_heap_size,
	       (unsigned long long)mem.vram.usable_heap_size,
	       (unsigned long long)mem.gtt.total_heap_size);
	/* amdgpu_query_info(TIMESTAMP) */
	check(amdgpu_query_info(dev, AMDGPU_INFO_TIMESTAMP, sizeof(u64), &u64), "timestamp");
	printf("ok timestamp nonzero=%d\n", u64 != 0);
	/* amdgpu_query_hw_ip_count / _info: the compute rings (gfx942 has no GFX ring) */
	check(amdgpu_query_hw_ip_count(dev, AMDGPU_HW_IP_COMPUTE, &count), "hw_ip_count");
	printf("ok hw_ip_count compute=%u\n", count);
	check(amdgpu_query_hw_ip_info(dev, AMDGPU_HW_IP_COMPUTE, 0, &ip), "hw_ip_info");
	printf("ok hw_ip_info major=%u minor=%u rings=%#x\n", ip.hw_ip_version_major,
	       ip.hw_ip_version_minor, ip.available_rings);
	/* amdgpu_query_firmware_version(FW_GFX_MEC) */
	check(amdgpu_query_firmware_version(dev, AMDGPU_INFO_FW_GFX_MEC, 0, 0, &fw, &feature),
	      "fw_version");
	printf("ok fw_version mec=%#x feature=%u\n", fw, feature);
	/* amdgpu_query_gds_info (GDS_CONFIG) */
	check(amdgpu_query_gds_info(dev, &gds), "gds_config");
	printf("ok gds_config gds_total=%u gws=%u oa=%u\n", gds.gds_total_size,
	       gds.gws_per_compute_partition, gds.oa_per_compute_partition);
	/* amdgpu_query_info(VRAM_LOST_COUNTER) */
	check(amdgpu_query_info(dev, AMDGPU_INFO_VRAM_LOST_COUNTER, sizeof(u32), &u32),
	      "vram_lost_counter");
	printf("ok vram_lost_counter value=%u\n", u32);
	/* amdgpu_query_sensor_info(GFX_SCLK) */
	check(amdgpu_query_sensor_info(dev, AMDGPU_INFO_SENSOR_GFX_SCLK, sizeof(u32), &u32),
	      "sensor");
	printf("ok sensor gfx_sclk=%u\n", u32);
	/* the kernel's rules: an unknown query is EINVAL, so is a zero return_size */
	printf("ok unknown_query ret=%d\n", amdgpu_query_info(dev, 0x7e, sizeof(u32), &u32));
	printf("ok zero_size ret=%d\n", amdgpu_query_info(dev, AMDGPU_INFO_ACCEL_WORKING, 0,
							  &u32));
}

int main(void)
{
	drmDevicePtr devices[16], dev_rev, dev_norev;
	uint64_t cap;
	amdgpu_device_handle adev, adev2, other;
	uint32_t major, minor;
	drmVersionPtr ver;
	char *name;
	int fd, fd2, ofd, n, i;

	setvbuf(stdout, NULL, _IOLBF, 0);

	fd = open("/dev/dri/renderD128", O_RDWR | O_CLOEXEC);
	if (fd < 0)
		fail("open", errno);
	printf("ok open\n");

	/* drmGetNodeTypeFromFd: fstat S_IFCHR 226:128 and /sys/dev/char/226:128/device/drm */
	n = drmGetNodeTypeFromFd(fd);
	check(n, "node_type");
	printf("ok node_type type=%d\n", n);

	/* the three name functions: the uevent DEVNAME, and the card or renderD entry of device/drm */
	name = drmGetDeviceNameFromFd2(fd);
	if (!name)
		fail("device_name", errno ? errno : ENOENT);
	printf("ok device_name name=%s\n", name);
	free(name);
	name = drmGetPrimaryDeviceNameFromFd(fd);
	if (!name)
		fail("primary_name", errno ? errno : ENOENT);
	printf("ok primary_name name=%s\n", name);
	free(name);
	name = drmGetRenderDeviceNameFromFd(fd);
	if (!name)
		fail("render_name", errno ? errno : ENOENT);
	printf("ok render_name name=%s\n", name);
	free(name);

	/* drmGetDevice2: sysfs only, no ioctl; with and without the revision file */
	check(drmGetDevice2(fd, DRM_DEVICE_GET_PCI_REVISION, &dev_rev), "get_device");
	print_device("get_device", dev_rev);
	check(drmGetDevice2(fd, 0, &dev_norev), "get_device_norev");
	print_device("get_device_norev", dev_norev);
	printf("ok devices_equal same=%d\n", drmDevicesEqual(dev_rev, dev_norev));

	/* drmGetDevices2: count first, then the list (opendir("/dev/dri"), folded by PCI) */
	n = drmGetDevices2(DRM_DEVICE_GET_PCI_REVISION, NULL, 0);
	check(n, "get_devices_count");
	printf("ok get_devices_count count=%d\n", n);
	n = drmGetDevices2(DRM_DEVICE_GET_PCI_REVISION, devices, 16);
	check(n, "get_devices");
	for (i = 0; i < n; i++)
		print_device("get_devices", devices[i]);

	/* drmGetVersion (two DRM_IOCTL_VERSION passes) */
	ver = drmGetVersion(fd);
	if (!ver)
		fail("version", errno);
	printf("ok version name=%s major=%d minor=%d\n", ver->name, ver->version_major,
	       ver->version_minor);
	drmFreeVersion(ver);

	/* drmGetCap: a render-only cap, and KMS ones amdgpu answers with no display block */
	check(drmGetCap(fd, DRM_CAP_SYNCOBJ_TIMELINE, &cap), "cap_timeline");
	printf("ok cap_timeline value=%" PRIu64 "\n", cap);
	check(drmGetCap(fd, DRM_CAP_DUMB_BUFFER, &cap), "cap_dumb");
	printf("ok cap_dumb value=%" PRIu64 "\n", cap);
	check(drmGetCap(fd, DRM_CAP_CURSOR_WIDTH, &cap), "cap_cursor");
	printf("ok cap_cursor value=%" PRIu64 "\n", cap);
	printf("ok cap_unknown ret=%d\n", drmGetCap(fd, 0x7f, &cap) ? -errno : 0);

	/* amdgpu_device_initialize twice on one node: the same handle (fd_compare through
	 * drmGetPrimaryDeviceNameFromFd), as libhsakmt relies on */
	check(amdgpu_device_initialize(fd, &major, &minor, &adev), "init");
	printf("ok init major=%u minor=%u fd_valid=%d\n", major, minor,
	       amdgpu_device_get_fd(adev) >= 0);
	fd2 = open("/dev/dri/renderD128", O_RDWR | O_CLOEXEC);
	if (fd2 < 0)
		fail("open2", errno);
	check(amdgpu_device_initialize(fd2, &major, &minor, &adev2), "init_twice");
	printf("ok init_twice same=%d\n", adev == adev2);
	queries(adev);

	/* each other accel of the node: its own handle */
	for (i = 0; i < n; i++) {
		const char *node;

		if (!(devices[i]->available_nodes & (1 << DRM_NODE_RENDER)))
			continue;
		node = devices[i]->nodes[DRM_NODE_RENDER];
		if (strcmp(node, "/dev/dri/renderD128") == 0)
			continue;
		ofd = open(node, O_RDWR | O_CLOEXEC);
		if (ofd < 0)
			fail("open_other", errno);
		check(amdgpu_device_initialize(ofd, &major, &minor, &other), "init_other");
		printf("ok init_other node=%s distinct=%d\n", node, other != adev);
		amdgpu_device_deinitialize(other);
		close(ofd);
	}

	amdgpu_device_deinitialize(adev2);
	amdgpu_device_deinitialize(adev);
	drmFreeDevices(devices, n);
	drmFreeDevice(&dev_rev);
	drmFreeDevice(&dev_norev);
	close(fd2);
	close(fd);
	printf("ok done\n");
	return 0;
}
