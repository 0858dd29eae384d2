/* bench_util.h - what the small perf programs (gossip_perf, quorum_perf,
 * sparse_perf, group_perf, overlap, stats_cost, and perf_common.c) share:
 * a monotonic clock in microseconds, the median of a sample, and FAIL. */
#ifndef LOOM_PERF_BENCH_UTIL_H
#define LOOM_PERF_BENCH_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* CLOCK_MONOTONIC in microseconds. */
static inline double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* qsort's comparison of doubles, ascending. */
static inline int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median of v[0..n-1] (n >= 1), which it sorts. */
static inline double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* In main of a program on loom.h that #defines BENCH_NAME "its name": on
 * a result other than LOOM_SUCCESS, print "NAME: what: the last error"
 * to standard error and return 1. */
#define FAIL(r, what)                                                                      \
    do {                                                                                   \
        if ((r) != LOOM_SUCCESS) {                                                         \
            fprintf(stderr, BENCH_NAME ": %s: %s\n", what, loom_get_last_error());         \
            return 1;                                                                      \
        }                                                                                  \
    } while (0)

#endif
