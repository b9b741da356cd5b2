/* The libdrm test programs' one way to fail a step: a "fail <step> err=<n> (<message>)"
 * line that tests/integration/test_libdrm.py reads, then exit 1. libdrm returns -errno from
 * amdgpu_* and -1 with errno set from some drm* calls; check() takes both. */
#ifndef UALINK_TESTS_LIBDRM_CHECK_H
#define UALINK_TESTS_LIBDRM_CHECK_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static inline void fail(const char *step, int err)
{
	printf("fail %s err=%d (%s)\n", step, err, strerror(err < 0 ? -err : err));
	exit(1);
}

static inline void check(int ret, const char *step)
{
	if (ret < 0)
		fail(step, ret == -1 ? -errno : ret);
}

static inline void expect(int cond, const char *step)
{
	if (!cond) {
		printf("fail %s err=0 (check)\n", step);
		exit(1);
	}
}

#endif
