/*
 * mp_stranger.c - one rank of a job that strangers attack
 * (test_stranger.sh): it runs checked allreduces until SECONDS have
 * passed, and reports what it saw.
 *
 * usage: mp_stranger SECONDS
 * Started from the launcher's environment (LOOM_ROOT, LOOM_RANK,
 * LOOM_SIZE, LOOM_JOB_KEY).  Every step is an allreduce (sum) of a count
 * that cycles from 1 to 1M floats, where rank r adds r + 1 + (i % 7), so
 * every element's sum is known exactly; each element is checked.  Rank 0
 * samples its resident memory (VmRSS) once every count has run twice
 * (the library's buffers are grown by then) and at the end.  Rank 0 prints "RESULT steps=S wrong=W rss_kib_first=A
 * rss_kib_last=B"; every rank exits 0 when every step succeeded with
 * every element right, 1 otherwise.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loom.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static long rss_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld", &v) == 1) break;
    if (f) fclose(f);
    return v;
}

int main(int argc, char **argv)
{
    double secs = argc > 1 ? atof(argv[1]) : 10;
    loom_comm_t comm;
    loom_result_t r = loom_comm_init_env(&comm, NULL);
    if (r != LOOM_SUCCESS) {
        fprintf(stderr, "mp_stranger: init: %s: %s\n", loom_strerror(r), loom_get_last_error());
        return 1;
    }
    int rank, n;
    loom_comm_rank(comm, &rank);
    loom_comm_size(comm, &n);
    const size_t maxc = (size_t)1 << 20;
    float *buf = malloc(maxc * sizeof *buf);
    if (!buf) return 1;
    long steps = 0, wrong = 0, rss_first = -1, rss_last, cycles = 0;
    double t0 = now_s();
    int stop = 0, failed = 0;
    for (size_t count = 1; !stop; count = count >= maxc ? 1 : count * 4 + 3) {
        if (count > maxc) count = maxc;
        for (size_t i = 0; i < count; i++) buf[i] = (float)(rank + 1 + (int)(i % 7));
        r = loom_allreduce(buf, buf, count, LOOM_FLOAT32, LOOM_SUM, comm);
        if (r != LOOM_SUCCESS) {
            fprintf(stderr, "mp_stranger: rank %d: step %ld: %s: %s\n", rank, steps,
                    loom_strerror(r), loom_get_last_error());
            failed = 1;
            break;
        }
        for (size_t i = 0; i < count; i++) {
            float want = (float)(n * (n + 1) / 2 + n * (int)(i % 7));
            if (buf[i] != want) wrong++;
        }
        ++steps;
        if (count == maxc && ++cycles == 2) rss_first = rss_kib();
        /* Every rank stops at the same step: rank 0's clock decides. */
        int s = rank == 0 && now_s() - t0 >= secs;
        r = loom_allreduce(&s, &s, 1, LOOM_INT32, LOOM_MAX, comm);
        if (r != LOOM_SUCCESS) {
            fprintf(stderr, "mp_stranger: rank %d: stop vote: %s: %s\n", rank, loom_strerror(r),
                    loom_get_last_error());
            failed = 1;
            break;
        }
        stop = s;
    }
    rss_last = rss_kib();
    if (rank == 0)
        printf("RESULT steps=%ld wrong=%ld rss_kib_first=%ld rss_kib_last=%ld\n", steps, wrong,
               rss_first, rss_last);
    if (wrong) fprintf(stderr, "mp_stranger: rank %d: %ld wrong elements\n", rank, wrong);
    free(buf);
    loom_comm_destroy(comm);
    return failed || wrong ? 1 : 0;
}
