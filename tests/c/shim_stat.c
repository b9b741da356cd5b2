/* SPDX-License-Identifier: MIT */
/*
 * shim_stat: every libc entry point libualink_shim.so gives the DRM device
 * identity and the /dev/dri listing to (spec userspace-surface §2.2 and §7
 * items 1 and 3), called by name.  Run under the shim against a node by
 * tests/integration/test_shim.py, which parses its lines:
 *
 *   ok <step> mode=<octal> rdev=<maj>:<min>   a stat of a render node
 *   ok <step> key=value ...                   any other observation
 *   fail <step> errno=<n>                     a call that failed (exit 1)
 *
 * The glibc < 2.33 entry points (__xstat and friends) are reached through
 * their versioned compat symbols, as an old binary would (x86_64 only).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

static void fail(const char *step)
{
	int e = errno;

	printf("fail %s errno=%d (%s)\n", step, e, strerror(e));
	exit(1);
}

static void show(const char *step, int ret, const struct stat *st)
{
	if (ret != 0)
		fail(step);
	printf("ok %s mode=%o rdev=%u:%u\n", step, (unsigned)st->st_mode,
	       major(st->st_rdev), minor(st->st_rdev));
}

char *__realpath_chk(const char *path, char *resolved, size_t resolvedlen);

#if defined(__x86_64__)
/* The symbols an old binary links to (glibc 2.2.5's versions). */
int old_xstat(int, const char *, struct stat *);
int old_lxstat(int, const char *, struct stat *);
int old_fxstat(int, int, struct stat *);
int old_fxstatat(int, int, const char *, struct stat *, int);
int old_xstat64(int, const char *, struct stat64 *);
int old_fxstat64(int, int, struct stat64 *);
__asm__(".symver old_xstat, __xstat@GLIBC_2.2.5");
__asm__(".symver old_lxstat, __lxstat@GLIBC_2.2.5");
__asm__(".symver old_fxstat, __fxstat@GLIBC_2.2.5");
__asm__(".symver old_fxstatat, __fxstatat@GLIBC_2.4");
__asm__(".symver old_xstat64, __xstat64@GLIBC_2.2.5");
__asm__(".symver old_fxstat64, __fxstat64@GLIBC_2.2.5");
#endif

int main(void)
{
	char path[PATH_MAX], *canon;
	struct statx stx;
	struct stat st;
	struct stat64 st64;
	struct dirent *e;
	DIR *dir;
	int fd, card, dup_fd;

	setvbuf(stdout, NULL, _IOLBF, 0);

	fd = open("/dev/dri/renderD128", O_RDWR | O_CLOEXEC);
	if (fd < 0)
		fail("open");
	card = open("/dev/dri/card0", O_RDWR | O_CLOEXEC);
	if (card < 0)
		fail("open_card");

	/* the path-based calls */
	show("stat", stat("/dev/dri/renderD128", &st), &st);
	show("stat64", stat64("/dev/dri/renderD128", &st64), (struct stat *)&st64);
	show("lstat", lstat("/dev/dri/renderD128", &st), &st);
	show("lstat64", lstat64("/dev/dri/card0", &st64), (struct stat *)&st64);
	show("stat_card", stat("/dev/dri/card0", &st), &st);
	show("fstatat", fstatat(AT_FDCWD, "/dev/dri/renderD128", &st, 0), &st);
	show("fstatat64", fstatat64(AT_FDCWD, "/dev/dri/card0", &st64, 0),
	     (struct stat *)&st64);
	/* the fd-based calls: the fd reports the minor it was opened as */
	show("fstat", fstat(fd, &st), &st);
	show("fstat64", fstat64(fd, &st64), (struct stat *)&st64);
	show("fstat_card", fstat(card, &st), &st);
	show("fstatat_empty", fstatat(fd, "", &st, AT_EMPTY_PATH), &st);
	dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
	show("fstat_dup", fstat(dup_fd, &st), &st);
	close(dup_fd);
	show("fstat_closed", fstat(dup_fd, &st) == -1 && errno == EBADF ? 0 : -1, &st);

	if (statx(AT_FDCWD, "/dev/dri/renderD128", 0, STATX_BASIC_STATS, &stx))
		fail("statx");
	printf("ok statx mode=%o rdev=%u:%u\n", stx.stx_mode, stx.stx_rdev_major,
	       stx.stx_rdev_minor);
	if (statx(card, "", AT_EMPTY_PATH, STATX_BASIC_STATS, &stx))
		fail("statx_fd");
	printf("ok statx_fd mode=%o rdev=%u:%u\n", stx.stx_mode, stx.stx_rdev_major,
	       stx.stx_rdev_minor);

#if defined(__x86_64__)
	show("__xstat", old_xstat(1, "/dev/dri/renderD128", &st), &st);
	show("__lxstat", old_lxstat(1, "/dev/dri/card0", &st), &st);
	show("__fxstat", old_fxstat(1, fd, &st), &st);
	show("__fxstatat", old_fxstatat(1, AT_FDCWD, "/dev/dri/renderD128", &st, 0), &st);
	show("__xstat64", old_xstat64(1, "/dev/dri/renderD128", &st64), (struct stat *)&st64);
	show("__fxstat64", old_fxstat64(1, card, &st64), (struct stat *)&st64);
	/* glibc: a version it does not know is EINVAL */
	if (old_xstat(7, "/dev/dri/renderD128", &st) != -1 || errno != EINVAL)
		fail("__xstat_bad_version");
	printf("ok __xstat_bad_version errno=%d\n", errno);
#endif

	/* opendir + readdir of /dev/dri: the node's entries, card beside render */
	dir = opendir("/dev/dri");
	if (!dir)
		fail("opendir");
	while ((e = readdir(dir)))
		if (e->d_name[0] != '.')
			printf("ok entry name=%s type=%d\n", e->d_name, e->d_type);
	rewinddir(dir);
	while ((e = readdir(dir)))
		if (e->d_name[0] != '.')
			printf("ok entry_again name=%s\n", e->d_name);
	closedir(dir);

	/* access, realpath: the host's path, never the mount's */
	if (access("/dev/dri/card0", F_OK))
		fail("access");
	printf("ok access\n");
	canon = realpath("/dev/dri/card0", path);
	if (!canon)
		fail("realpath");
	printf("ok realpath path=%s\n", canon);
	canon = realpath("/dev/dri", NULL);
	if (!canon)
		fail("realpath_dir");
	printf("ok realpath_dir path=%s\n", canon);
	free(canon);
	canon = realpath("/sys/class/drm/renderD128/device", NULL);
	if (!canon)
		fail("realpath_sys");
	printf("ok realpath_sys path=%s\n", canon);
	free(canon);

	/* libdrm's get_pci_path (fortified: __realpath_chk) and get_subsystem_type */
	canon = __realpath_chk("/sys/dev/char/226:128/device", path, sizeof(path));
	if (!canon)
		fail("realpath_chk");
	printf("ok realpath_chk path=%s\n", canon);
	{
		char link[PATH_MAX] = "";

		if (readlink("/sys/dev/char/226:128/device/subsystem", link, sizeof(link) - 1) < 0)
			fail("readlink");
		printf("ok readlink link=%s\n", link);
	}

	/* a node the node does not have */
	if (stat("/dev/dri/renderD200", &st) != -1)
		fail("stat_missing");
	printf("ok stat_missing errno=%d\n", errno);

	printf("ok done\n");
	return 0;
}
