/* SPDX-License-Identifier: MIT */
/*
 * ioctl_hammer <render-node|kfd> <count> <seed> [-v]
 *
 * Robustness test for the daemon's ioctl path: issues <count> pseudo-random
 * ioctls on one render-node fd and tallies the errnos.  On a file named "kfd"
 * the type is the KFD's 'K' and every nr 0x01-0x3f is as likely (the KFD's
 * whole table; the pointer-carrying ones - MAP_MEMORY's device array,
 * WAIT_EVENTS' events, GET_TILE_CONFIG's arrays - land in scratch, and
 * ACQUIRE_VM's drm_fd names one of this program's own fds).  Numbers are biased
 * towards the DRM type 'd' and the interesting nrs (the amdgpu driver range
 * 0x40-0x5c, VERSION 0x00, GEM_CLOSE 0x09, GET_CAP 0x0c, PRIME 0x2d/0x2e, the
 * syncobj range 0xbf-0xcf); direction bits, sizes (0-64, often 16/24/32) and
 * payload bytes are random.  Some payloads carry pointers into this program's
 * own scratch area, so ioctls that write through user pointers (AMDGPU_INFO's
 * return_pointer, VERSION's buffers, syncobj arrays) succeed now and then.
 * Never more than 4096 bytes, never another fd.  The same seed gives the same
 * sequence (own PRNG).
 *
 * Output, one line: hammer: N ioctls, ok=.., EINVAL=.., <ENAME>=.., ...
 * Exit 0 unless the arguments or the open are bad.  -v logs every ioctl to
 * stderr, to replay a failure.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#define MAX_SIZE 64
#define BUF_SIZE 4096	/* the arg always points at this much memory */
#define NERR 4096

static uint64_t rng_state;

/* xorshift64*: deterministic across libcs, unlike rand(). */
static uint64_t rng(void)
{
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 0x2545F4914F6CDD1DULL;
}

static unsigned pick(unsigned n)
{
	return (unsigned)(rng() % n);
}

/*
 * Types the VFS handles itself before the file system sees them (FIBMAP,
 * FIOCLEX, FIONBIO, FIFREEZE, FICLONE, FS_IOC_*, block and tty ioctls): they would
 * change our fd or the mount rather than exercise the daemon.
 */
static int vfs_type(unsigned type)
{
	return type == 0x00 || type == 'T' || type == 'X' || type == 'f' ||
	       type == 0x94 || type == 0x12 || type == 0x15;
}

static unsigned random_nr(void)
{
	static const unsigned hot[] = { 0x00, 0x09, 0x0c, 0x2d, 0x2e, 0x40, 0x42, 0x45,
					0x48, 0x50, 0x53, 0x5b, 0xbf, 0xc1, 0xc2, 0xc4,
					0xcb, 0xcc, 0xcf };
	unsigned r = pick(100);

	if (r < 25)
		return hot[pick(sizeof(hot) / sizeof(hot[0]))];
	if (r < 70)
		return 0x40 + pick(0x1d);	/* 0x40..0x5c */
	return pick(0x100);
}

static unsigned random_size(void)
{
	static const unsigned common[] = { 8, 12, 16, 24, 32, 40, 64 };

	if (pick(2))
		return common[pick(sizeof(common) / sizeof(common[0]))];
	return pick(MAX_SIZE + 1);
}

static int kfd_mode;

static unsigned long random_cmd(void)
{
	unsigned type = 'd';

	if (kfd_mode && pick(10) != 0)
		return _IOC(pick(4), 'K', 1 + pick(0x3f), random_size());
	if (pick(10) == 0)
		do
			type = pick(0x100);
		while (vfs_type(type));
	return _IOC(pick(4), type, random_nr(), random_size());
}

/* Where pointer-carrying payloads point: writes through them land here. */
static unsigned char scratch[2 * BUF_SIZE];

static void fill_random(unsigned char *buf, unsigned size)
{
	unsigned i;

	switch (pick(5)) {
	case 4:		/* 8-byte slots: small integers or pointers into scratch */
		memset(buf, 0, size);
		for (i = 0; i + 8 <= size; i += 8) {
			uint64_t v = pick(2) ? (uint64_t)(uintptr_t)(scratch + pick(BUF_SIZE))
					     : pick(512);

			memcpy(buf + i, &v, sizeof(v));
		}
		break;
	case 0:		/* all zero: the common "empty struct" */
		memset(buf, 0, size);
		break;
	case 1:		/* small integers in each u32: plausible handles and ops */
		memset(buf, 0, size);
		for (i = 0; i + 4 <= size; i += 4)
			buf[i] = (unsigned char)pick(4);
		break;
	default:
		for (i = 0; i < size; i++)
			buf[i] = (unsigned char)rng();
	}
}

int main(int argc, char **argv)
{
	static unsigned long tally[NERR];
	static unsigned char buf[BUF_SIZE];
	unsigned long count, i, ok = 0, other = 0;
	int fd, verbose, e;
	const char *base;

	if (argc < 4 || argc > 5 || (argc == 5 && strcmp(argv[4], "-v"))) {
		fprintf(stderr, "usage: %s <render-node|kfd> <count> <seed> [-v]\n", argv[0]);
		return 2;
	}
	verbose = argc == 5;
	count = strtoul(argv[2], NULL, 0);
	rng_state = strtoull(argv[3], NULL, 0) * 0x9E3779B97F4A7C15ULL + 1;
	base = strrchr(argv[1], '/');
	kfd_mode = strcmp(base ? base + 1 : argv[1], "kfd") == 0;
	fd = open(argv[1], O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		fprintf(stderr, "%s: %s: %s\n", argv[0], argv[1], strerror(errno));
		return 1;
	}

	for (i = 0; i < count; i++) {
		unsigned long cmd = random_cmd();
		int ret;

		_Static_assert(MAX_SIZE <= BUF_SIZE, "arg buffer too small");
		fill_random(buf, _IOC_SIZE(cmd));
		ret = ioctl(fd, cmd, buf);
		e = ret < 0 ? errno : 0;
		if (verbose)
			fprintf(stderr, "%lu cmd=0x%08lx ret=%d errno=%d\n", i, cmd, ret, e);
		if (ret >= 0)
			ok++;
		else if (e > 0 && e < NERR)
			tally[e]++;
		else
			other++;
	}
	close(fd);

	printf("hammer: %lu ioctls, ok=%lu, EINVAL=%lu", count, ok, tally[EINVAL]);
	for (e = 1; e < NERR; e++) {
		const char *name = strerrorname_np(e);

		if (tally[e] && e != EINVAL) {
			if (name)
				printf(", %s=%lu", name, tally[e]);
			else
				printf(", E%d=%lu", e, tally[e]);
		}
	}
	if (other)
		printf(", other=%lu", other);
	printf("\n");
	return 0;
}
