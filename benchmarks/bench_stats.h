/* The C floors' and clients' one clock and one summary line, so every program of
 * `make bench` reports the same statistics the same way (benchmarks/run.py parses
 * "median_ns=.. p99_ns=.. mean_ns=.. count=..", nearest-rank percentiles). */
#ifndef UALINK_BENCH_STATS_H
#define UALINK_BENCH_STATS_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* The idle gap before each timed first import (pod_latency import) and before each
 * sample of its floor (tcp_floor import): the releases of the previous sample settle. */
#define IMPORT_SETTLE_NS 2000000

static inline uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* Sorts ns[0..count) and prints the summary fields, without a newline: the caller adds
 * its own fields (size=..) and ends the line. */
static inline void print_stats(uint64_t *ns, long count)
{
	uint64_t sum = 0;
	long i;

	for (i = 0; i < count; i++)
		sum += ns[i];
	qsort(ns, (size_t)count, sizeof(*ns), cmp_u64);
	printf("median_ns=%llu p99_ns=%llu mean_ns=%llu count=%ld",
	       (unsigned long long)ns[(count - 1) / 2],
	       (unsigned long long)ns[(count * 99 + 99) / 100 - 1],
	       (unsigned long long)(sum / (uint64_t)count), count);
}

#endif
