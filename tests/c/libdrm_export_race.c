/* SPDX-License-Identifier: MIT */
/*
 * libdrm_export_race: spec §13 N7 through the public API of Debian's libdrm /
 * libdrm_amdgpu (2.4.114), as libhsakmt's hsaKmtHandleExport(FABRIC) calls it
 * (amdgpu_bo_export(kms), then the UALink EXPORT through drmCommandWriteRead,
 * whose drmIoctl retries EAGAIN: §1.7).
 *
 *   libdrm_export_race <threads> <rounds>
 *       each round: a fresh VRAM BO, then <threads> threads released together
 *       (a barrier) each export it once; every thread must get the same
 *       128-bit handle (one BO never has two), and an export after the race
 *       too. Then a VM_ALWAYS_VALID BO: its export is refused (EPERM) and,
 *       once freed, VRAM usage is back where it was (nothing leaked).
 *
 * Output (tests/integration/test_kernel_n_pod.py parses it):
 *   ok <step> key=value ...  |  fail <step> err=<n> ...  (exit status 1)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <amdgpu.h>
#include <amdgpu_drm.h>
#include <xf86drm.h>

#include "libdrm_check.h"

#include "ualink/ualink_drm.h"	/* only its UALink part: amdgpu_drm.h came first */

#define MAX_THREADS 64
#define BO_SIZE (1u << 20)

struct racer {
	pthread_t thread;
	int fd;
	uint32_t kms;
	pthread_barrier_t *start;
	int err;
	uint64_t lo, hi;
};

static int export_once(int fd, uint32_t kms, uint64_t *lo, uint64_t *hi)
{
	union drm_amdgpu_ualink_handle u;
	int ret;

	memset(&u, 0, sizeof(u));
	u.in.op = DRM_AMDGPU_UALINK_HANDLE_OP_EXPORT;
	u.in.gem_handle = kms;
	ret = drmCommandWriteRead(fd, DRM_AMDGPU_UALINK_HANDLE, &u, sizeof(u));
	if (ret == 0) {
		*lo = u.out.export_ualink_handle[0];
		*hi = u.out.export_ualink_handle[1];
	}
	return ret;
}

static void *race(void *arg)
{
	struct racer *r = arg;

	pthread_barrier_wait(r->start);
	r->err = export_once(r->fd, r->kms, &r->lo, &r->hi);
	return NULL;
}

static uint64_t vram_usage(amdgpu_device_handle dev)
{
	uint64_t used = 0;

	check(amdgpu_query_info(dev, AMDGPU_INFO_VRAM_USAGE, sizeof(used), &used), "vram_usage");
	return used;
}

int main(int argc, char **argv)
{
	struct amdgpu_bo_alloc_request req = {
		.alloc_size = BO_SIZE, .phys_alignment = 4096,
		.preferred_heap = AMDGPU_GEM_DOMAIN_VRAM,
	};
	static struct racer racers[MAX_THREADS];
	amdgpu_device_handle dev;
	pthread_barrier_t start;
	uint32_t major, minor, kms;
	uint64_t lo = 0, hi = 0, before, after;
	amdgpu_bo_handle bo;
	int threads, rounds, fd, distinct = 0;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc != 3 || (threads = atoi(argv[1])) < 2 || threads > MAX_THREADS ||
	    (rounds = atoi(argv[2])) < 1) {
		fprintf(stderr, "usage: %s <threads 2-%d> <rounds>\n", argv[0], MAX_THREADS);
		return 2;
	}
	fd = open("/dev/dri/renderD128", O_RDWR | O_CLOEXEC);
	if (fd < 0)
		fail("open", errno);
	check(amdgpu_device_initialize(fd, &major, &minor, &dev), "init");
	close(fd);
	fd = amdgpu_device_get_fd(dev);

	for (int round = 0; round < rounds; round++) {
		check(amdgpu_bo_alloc(dev, &req, &bo), "bo_alloc");
		check(amdgpu_bo_export(bo, amdgpu_bo_handle_type_kms, &kms), "export_kms");
		if (pthread_barrier_init(&start, NULL, (unsigned)threads))
			fail("barrier", errno);
		for (int i = 0; i < threads; i++) {
			racers[i] = (struct racer){ .fd = fd, .kms = kms, .start = &start };
			if (pthread_create(&racers[i].thread, NULL, race, &racers[i]))
				fail("pthread_create", errno);
		}
		for (int i = 0; i < threads; i++)
			pthread_join(racers[i].thread, NULL);
		pthread_barrier_destroy(&start);
		for (int i = 0; i < threads; i++) {
			check(racers[i].err, "export");
			if (racers[i].lo != racers[0].lo || racers[i].hi != racers[0].hi)
				distinct++;
		}
		check(export_once(fd, kms, &lo, &hi), "export_after");
		if (lo != racers[0].lo || hi != racers[0].hi)
			distinct++;
		check(amdgpu_bo_free(bo), "bo_free");
	}
	printf("ok export_race threads=%d rounds=%d mismatched=%d\n", threads, rounds, distinct);

	/* §1.6 E5: VM_ALWAYS_VALID is refused (EPERM); freeing it frees its VRAM (§13 N7) */
	before = vram_usage(dev);
	req.flags = AMDGPU_GEM_CREATE_VM_ALWAYS_VALID;
	check(amdgpu_bo_alloc(dev, &req, &bo), "bo_alloc_always_valid");
	check(amdgpu_bo_export(bo, amdgpu_bo_handle_type_kms, &kms), "export_kms_always_valid");
	printf("ok export_always_valid err=%d\n", export_once(fd, kms, &lo, &hi) ? errno : 0);
	check(amdgpu_bo_free(bo), "bo_free_always_valid");
	after = vram_usage(dev);
	printf("ok vram_after_refused before=%" PRIu64 " after=%" PRIu64 "\n", before, after);
	amdgpu_device_deinitialize(dev);
	printf("ok done\n");
	return 0;
}
