/* SPDX-License-Identifier: MIT */
/*
 * gem_churn <render-node> <seconds>
 *
 * Allocation throughput of the daemon's GEM path: GEM_CREATE (4 KiB, VRAM)
 * then GEM_CLOSE, in a loop, for <seconds> of wall time.  Prints
 * pairs_per_sec=.. (and pairs=.. seconds=..).  Any failure stops the run.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <ualink/ualink.h>

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	double seconds, start, end, elapsed;
	unsigned long pairs = 0;
	ualink_dev *dev;
	uint32_t bo;
	int ret;

	if (argc != 3 || (seconds = strtod(argv[2], NULL)) <= 0) {
		fprintf(stderr, "usage: %s <render-node> <seconds>\n", argv[0]);
		return 2;
	}
	ret = ualink_open(argv[1], &dev);
	if (ret) {
		fprintf(stderr, "open %s: %s\n", argv[1], strerror(-ret));
		return 1;
	}
	start = now_s();
	end = start + seconds;
	do {
		/* check the clock every 64 pairs: clock_gettime is not free */
		for (int i = 0; i < 64; i++) {
			ret = ualink_bo_create(dev, 4096, 4096, AMDGPU_GEM_DOMAIN_VRAM, 0, &bo);
			if (ret) {
				fprintf(stderr, "GEM_CREATE: %s\n", strerror(-ret));
				goto out;
			}
			ret = ualink_bo_close(dev, bo);
			if (ret) {
				fprintf(stderr, "GEM_CLOSE: %s\n", strerror(-ret));
				goto out;
			}
			pairs++;
		}
	} while (now_s() < end);
out:
	elapsed = now_s() - start;
	ualink_close(dev);
	printf("pairs_per_sec=%.0f pairs=%lu seconds=%.3f\n",
	       elapsed > 0 ? pairs / elapsed : 0.0, pairs, elapsed);
	return ret ? 1 : 0;
}
