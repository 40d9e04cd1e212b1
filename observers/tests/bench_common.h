/* Shared by the provider bench's baselines (tcp_bench, pvm_bench): exit on a
 * failed call, the monotonic clock in seconds, the <msg> <total> <span>
 * arguments and the result line. */
#ifndef ORBITE_BENCH_COMMON_H
#define ORBITE_BENCH_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define DIE(what)                      \
	do {                           \
		perror(what);          \
		exit(3);               \
	} while (0)

static inline double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* <msg> <total> <span> from argv[0..2]: 0, or -1 when they do not fit. */
static inline int bench_sizes(char **argv, uint64_t *msg, uint64_t *total, uint64_t *span)
{
	*msg = strtoull(argv[0], NULL, 10);
	*total = strtoull(argv[1], NULL, 10);
	*span = strtoull(argv[2], NULL, 10);
	return *msg && *total >= *msg && *span >= *msg ? 0 : -1;
}

static inline void bench_report(const char *op, uint64_t msg, uint64_t total, uint64_t span, double dt)
{
	printf("{\"op\":\"%s\",\"msg\":%llu,\"bytes\":%llu,\"span\":%llu,\"seconds\":%.6f,"
	       "\"mb_per_s\":%.1f}\n",
	       op, (unsigned long long)msg, (unsigned long long)total, (unsigned long long)span, dt,
	       (double)total / dt / 1e6);
}

#endif
