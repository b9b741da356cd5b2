/* SPDX-License-Identifier: MIT */
/*
 * shim_reenter.so: a library preloaded after libualink_shim.so whose realpath
 * opens a /sys file first, as malloc interposers do from inside libc calls
 * (jemalloc reads /sys/kernel/mm/transparent_hugepage/enabled).  The shim
 * reaches this realpath while it reads its configuration (realpath of
 * $UALINK_DRI_DIR); the open comes back into the shim, which must pass it
 * through rather than wait on its own configuration (test_shim.py).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

__attribute__((visibility("default"))) char *realpath(const char *path, char *resolved)
{
	char *(*next)(const char *, char *) =
		(char *(*)(const char *, char *))dlsym(RTLD_NEXT, "realpath");
	int fd = open("/sys/kernel/mm/transparent_hugepage/enabled", O_RDONLY | O_CLOEXEC);

	if (fd >= 0)
		close(fd);
	return next ? next(path, resolved) : NULL;
}
