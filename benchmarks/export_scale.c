/* SPDX-License-Identifier: MIT */
/*
 * export_scale <render-node> <daemon-pid> <checkpoint>...
 *
 * Export latency and daemon memory against the number of live exports (issue 15, "Scale").
 * Creates 4 KiB VRAM BOs and UALink-exports each (raw ioctl(2)), all kept open in one
 * DrmFile, up to each checkpoint in turn (ascending).  At every checkpoint it prints
 *
 *   live=N new_p50_ns=.. new_p99_ns=.. reexport_p50_ns=.. rss_kib=..
 *
 * new_*: the export ioctls of the last min(N, 1000) BOs created (a new export each);
 * reexport_*: 1000 idempotent exports of BOs spread over the live ones (the E3 path);
 * rss_kib: the daemon's VmRSS then.  A first line "live=0 rss_kib=.." is the baseline.
 * Any failed ioctl is fatal.  The BOs go when the program exits (the file's release).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "ualink/ualink_drm.h"

#define WINDOW 1000

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static long rss_kib(const char *pid)
{
	char path[64], line[256];
	long kib = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%s/status", pid);
	f = fopen(path, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmRSS: %ld", &kib) == 1)
			break;
	fclose(f);
	return kib;
}

static uint64_t export_ns(int fd, uint32_t gem_handle)
{
	union drm_amdgpu_ualink_handle u;
	uint64_t t0, t1;

	memset(&u, 0, sizeof(u));
	u.in.op = DRM_AMDGPU_UALINK_HANDLE_OP_EXPORT;
	u.in.gem_handle = gem_handle;
	t0 = now_ns();
	if (ioctl(fd, DRM_IOCTL_AMDGPU_UALINK_HANDLE, &u) < 0) {
		fprintf(stderr, "UALINK export of %u: %s\n", gem_handle, strerror(errno));
		exit(1);
	}
	t1 = now_ns();
	return t1 - t0;
}

static uint64_t pct(uint64_t *ns, long n, int q)
{
	qsort(ns, (size_t)n, sizeof(*ns), cmp_u64);
	return ns[(n * q + 99) / 100 - 1]; /* nearest rank */
}

int main(int argc, char **argv)
{
	static uint64_t fresh[WINDOW], again[WINDOW];
	uint32_t *handles;
	long live = 0, max;
	int fd, a;

	if (argc < 4) {
		fprintf(stderr, "usage: %s <render-node> <daemon-pid> <checkpoint>...\n", argv[0]);
		return 2;
	}
	max = strtol(argv[argc - 1], NULL, 0);
	handles = calloc((size_t)max + 1, sizeof(*handles));
	fd = open(argv[1], O_RDWR | O_CLOEXEC);
	if (fd < 0 || !handles || max <= 0) {
		perror(argv[1]);
		return 1;
	}
	printf("live=0 rss_kib=%ld\n", rss_kib(argv[2]));
	fflush(stdout);
	for (a = 3; a < argc; a++) {
		long target = strtol(argv[a], NULL, 0), n, k;

		if (target < live || target > max) {
			fprintf(stderr, "checkpoints must ascend\n");
			return 2;
		}
		for (; live < target; live++) {
			union drm_amdgpu_gem_create create;

			memset(&create, 0, sizeof(create));
			create.in.bo_size = 4096;
			create.in.domains = AMDGPU_GEM_DOMAIN_VRAM;
			if (ioctl(fd, DRM_IOCTL_AMDGPU_GEM_CREATE, &create) < 0) {
				fprintf(stderr, "GEM_CREATE #%ld: %s\n", live, strerror(errno));
				return 1;
			}
			handles[live] = create.out.handle;
			fresh[live % WINDOW] = export_ns(fd, create.out.handle);
		}
		n = live < WINDOW ? live : WINDOW;
		for (k = 0; k < WINDOW; k++)
			again[k] = export_ns(fd, handles[(k * 7919 + 13) % live]);
		/* the fresh window is sorted in place: copy so later windows refill it */
		uint64_t f50, f99, r50;
		uint64_t tmp[WINDOW];

		memcpy(tmp, fresh, sizeof(uint64_t) * (size_t)n);
		f50 = pct(tmp, n, 50);
		memcpy(tmp, fresh, sizeof(uint64_t) * (size_t)n);
		f99 = pct(tmp, n, 99);
		r50 = pct(again, WINDOW, 50);
		printf("live=%ld new_p50_ns=%llu new_p99_ns=%llu reexport_p50_ns=%llu rss_kib=%ld\n",
		       live, (unsigned long long)f50, (unsigned long long)f99,
		       (unsigned long long)r50, rss_kib(argv[2]));
		fflush(stdout);
	}
	close(fd);
	free(handles);
	return 0;
}
