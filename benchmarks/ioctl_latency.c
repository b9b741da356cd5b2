/* SPDX-License-Identifier: MIT */
/*
 * ioctl_latency [--idle] <file> <cmd-hex> <count> [warmup]
 * ioctl_latency [--idle] --export <render-node> <count> [warmup]
 *
 * Times single ioctls (raw ioctl(2), no retry) with CLOCK_MONOTONIC and
 * prints one line:  median_ns=.. p99_ns=.. mean_ns=.. count=..
 *
 * Plain mode issues <cmd-hex> on a buffer whose first 24 bytes are
 * op=0 (export), flags=0, gem_handle=1, then zeros; against fuse_echo that
 * is the floor of any FUSE ioctl.  --export first creates a 2 MiB VRAM BO
 * and exports it once, then times repeated (idempotent) UALink exports of it:
 * the daemon's real fast path.  With --idle, the client sleeps the first
 * import's gap (IMPORT_SETTLE_NS) before each ioctl (warm-ups included), so
 * that every timed one meets a server that has been idle that long.  Failed
 * ioctls are timed too and counted on stderr; in --export mode any failure is
 * fatal.
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

#include "bench_stats.h"

#include "ualink/ualink_drm.h"

#define BUF_SIZE 4096

/* Create a VRAM BO and export it once; returns its GEM handle, 0 on error. */
static uint32_t setup_export(int fd)
{
	union drm_amdgpu_gem_create create;
	union drm_amdgpu_ualink_handle args, *u = &args;

	memset(&create, 0, sizeof(create));
	create.in.bo_size = 2 << 20;
	create.in.alignment = 4096;
	create.in.domains = AMDGPU_GEM_DOMAIN_VRAM;
	if (ioctl(fd, DRM_IOCTL_AMDGPU_GEM_CREATE, &create) < 0) {
		perror("GEM_CREATE");
		return 0;
	}
	memset(u, 0, sizeof(*u));
	u->in.op = DRM_AMDGPU_UALINK_HANDLE_OP_EXPORT;
	u->in.gem_handle = create.out.handle;
	if (ioctl(fd, DRM_IOCTL_AMDGPU_UALINK_HANDLE, u) < 0) {
		perror("UALINK export");
		return 0;
	}
	fprintf(stderr, "exported gem_handle=%u as handle_lo=0x%016llx handle_hi=0x%016llx\n",
		create.out.handle, (unsigned long long)u->out.export_ualink_handle[0],
		(unsigned long long)u->out.export_ualink_handle[1]);
	return create.out.handle;
}

int main(int argc, char **argv)
{
	static unsigned char buf[BUF_SIZE], request[BUF_SIZE];
	unsigned long cmd;
	long count, warmup = 1000, i, failures = 0;
	int export_mode, idle = 0, argi = 3, fd, first_errno = 0;
	const char *prog = argv[0];
	uint64_t *ns;
	size_t size;

	if (argc > 1 && !strcmp(argv[1], "--idle")) {
		idle = 1;
		argc--;
		argv++;
	}
	export_mode = argc > 1 && !strcmp(argv[1], "--export");
	if (argc < argi + 1 || argc > argi + 2) {
		fprintf(stderr, "usage: %s [--idle] <file> <cmd-hex> <count> [warmup]\n"
				"       %s [--idle] --export <render-node> <count> [warmup]\n",
			prog, prog);
		return 2;
	}
	cmd = export_mode ? DRM_IOCTL_AMDGPU_UALINK_HANDLE : strtoul(argv[2], NULL, 16);
	count = strtol(argv[argi], NULL, 0);
	if (argc > argi + 1)
		warmup = strtol(argv[argi + 1], NULL, 0);
	size = _IOC_SIZE(cmd);
	if (count <= 0 || warmup < 0 || size > BUF_SIZE) {
		fprintf(stderr, "%s: need count > 0, warmup >= 0, _IOC_SIZE(cmd) <= %d\n",
			prog, BUF_SIZE);
		return 2;
	}
	fd = open(argv[export_mode ? 2 : 1], O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		perror(argv[export_mode ? 2 : 1]);
		return 1;
	}
	ns = calloc((size_t)count, sizeof(*ns));
	if (!ns)
		return 1;

	/* Every timed ioctl starts from this request: the output overwrites it. */
	uint32_t gem_handle = export_mode ? setup_export(fd) : 1;

	if (!gem_handle)
		return 1;
	memcpy(request, &(struct drm_amdgpu_ualink_handle_in){
		.op = DRM_AMDGPU_UALINK_HANDLE_OP_EXPORT, .gem_handle = gem_handle,
	}, 24);

	for (i = -warmup; i < count; i++) {
		uint64_t t0, t1;
		int ret;

		memcpy(buf, request, size);
		if (idle) {
			struct timespec gap = { 0, IMPORT_SETTLE_NS };

			nanosleep(&gap, NULL);
		}
		t0 = now_ns();
		ret = ioctl(fd, cmd, buf);
		t1 = now_ns();
		if (ret < 0) {
			if (!failures++)
				first_errno = errno;
			if (export_mode) {
				fprintf(stderr, "UALINK export: %s\n", strerror(errno));
				return 1;
			}
		}
		if (i >= 0)
			ns[i] = t1 - t0;
	}
	close(fd);

	if (failures)
		fprintf(stderr, "%ld of %ld ioctls failed (first: %s)\n",
			failures, count + warmup, strerrorname_np(first_errno));
	print_stats(ns, count);
	printf("\n");
	free(ns);
	return 0;
}
