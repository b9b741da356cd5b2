/*
 * The render fd libhsakmt acquired the GPU's VM with, for the test programs that drive
 * Debian's libhsakmt 5.2.3 and then use that file themselves (hsakmt_client.c,
 * hsakmt_sdma_fabric.c, fabric_sdma.c). libhsakmt opens each render node once
 * (hsakmt_open_drm_render_device) and passes that fd to ACQUIRE_VM; these programs open
 * none themselves, so it is the one fd of the process on renderD<minor> (minor < 0: on
 * any render node, for rocr_fabric.c, which knows no minor): more than one is a failure
 * (-1), not a pick.
 */
#ifndef RENDER_FD_H
#define RENDER_FD_H
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static inline int acquired_render_fd(int minor)
{
	char want[32], path[300], target[4096];
	int found = -1, count = 0;
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;

	if (minor < 0)
		snprintf(want, sizeof(want), "/renderD");
	else
		snprintf(want, sizeof(want), "/renderD%d", minor);
	while (d && (e = readdir(d))) {
		size_t w = strlen(want);
		ssize_t n;

		snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
		n = readlink(path, target, sizeof(target) - 1);
		if (n <= 0)
			continue;
		target[n] = 0;
		if (minor < 0 ? strstr(target, want) != NULL
			      : (size_t)n >= w && strcmp(target + n - w, want) == 0) {
			found = atoi(e->d_name);
			count++;
		}
	}
	if (d)
		closedir(d);
	return count == 1 ? found : -1;
}

#endif
