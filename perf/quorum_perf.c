/*
 * quorum_perf.c - the quorum allreduce (loom_allreduce_quorum) with one
 * rank slowed, against loom_allreduce with the same rank slowed, in one
 * run, blocks of each interleaved.
 *
 * usage: loomrun -n RANKS perf/quorum_perf [-s bytes[,bytes...]] [-k calls]
 *                        [-r reps] [-d ms] [-l rank] [-q quorum]
 *   -s sizes   bytes per rank (float), K/M suffixes, comma-separated (4K,1M)
 *   -k calls   calls per block (10)
 *   -r reps    blocks of each, median reported (5; one more, first, untimed)
 *   -d ms      the slow rank sleeps this long before each call (100)
 *   -l rank    the slow rank (nranks - 1)
 *   -q quorum  the quorum (nranks - 1)
 * A block: a barrier, then `calls` calls, the slow rank sleeping -d ms
 * before each; each rank times its block, from the barrier to its last
 * call's return, over the calls.  Printed per size, medians over the
 * blocks: the time per call of the slowest of the fast ranks and of the
 * slow rank, for loom_allreduce and the quorum form, and how many of its
 * calls the slow rank was left out of.  Exits 1 when a call fails.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BENCH_NAME "quorum_perf"
#include "bench_util.h"
#include "loom.h"
#include "size_arg.h"

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int main(int argc, char **argv)
{
    const char *sizes = "4K,1M";
    int calls = 10, reps = 5, delay = 100, slow = -1, quorum = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-s")) sizes = argv[i + 1];
        else if (!strcmp(argv[i], "-k")) calls = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-r")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-d")) delay = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-l")) slow = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-q")) quorum = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: quorum_perf [-s bytes,...] [-k calls] [-r reps] [-d ms] "
                            "[-l rank] [-q quorum]\n");
            return 2;
        }
    }
    if (calls < 1) calls = 1;
    if (reps < 1) reps = 1;
    if (delay < 0) delay = 0;
    loom_comm_t comm;
    loom_result_t r = loom_comm_init_env(&comm, NULL);
    FAIL(r, "init");
    int rank, n;
    loom_comm_rank(comm, &rank);
    loom_comm_size(comm, &n);
    if (slow < 0 || slow >= n) slow = n - 1;
    if (quorum < 1) quorum = n > 1 ? n - 1 : 1;
    int *flags = malloc((size_t)n * sizeof *flags);
    /* Per block: [fast plain, slow plain, fast quorum, slow quorum, left out]. */
    double *res = malloc((size_t)reps * 5 * sizeof *res), *col = malloc((size_t)reps * sizeof *col);
    if (!flags || !res || !col) return 1;
    if (rank == 0)
        printf("# quorum_perf: %d ranks, rank %d sleeps %d ms before each call, quorum %d, "
               "%d calls per block, %d blocks (median)\n"
               "# %9s %14s %14s %14s %14s %9s\n",
               n, slow, delay, quorum, calls, reps, "bytes", "plain_fast_us", "plain_slow_us",
               "quorum_fast_us", "quorum_slow_us", "left_out");
    for (const char *p = sizes; *p;) {
        size_t bytes = size_arg(p) / sizeof(float) * sizeof(float);
        const char *c = strchr(p, ',');
        p = c ? c + 1 : p + strlen(p);
        if (!bytes) continue;
        const size_t count = bytes / sizeof(float);
        float *buf = malloc(bytes);
        if (!buf) return 1;
        for (size_t i = 0; i < count; i++) buf[i] = (float)(rank + 1);
        for (int k = -1; k < reps; k++) {
            double t[5] = {0}; /* this rank's: plain, quorum, left out */
            for (int form = 0; form < 2; form++) {
                r = loom_barrier(comm);
                FAIL(r, "barrier");
                double t0 = now_us();
                int out = 0;
                for (int j = 0; j < calls; j++) {
                    if (rank == slow) sleep_ms(delay);
                    if (form == 0) {
                        r = loom_allreduce(buf, buf, count, LOOM_FLOAT32, LOOM_AVG, comm);
                        FAIL(r, "loom_allreduce");
                    } else {
                        r = loom_allreduce_quorum(buf, buf, count, LOOM_FLOAT32, LOOM_AVG, quorum,
                                                  comm, flags, NULL);
                        FAIL(r, "loom_allreduce_quorum");
                        out += !flags[slow];
                    }
                }
                const double per = (now_us() - t0) / calls;
                t[2 * form + (rank == slow)] = per;
                if (form) t[4] = out;
            }
            /* Slowest fast rank, the slow rank (others report 0), left out. */
            r = loom_allreduce(t, t, 5, LOOM_FLOAT64, LOOM_MAX, comm);
            FAIL(r, "allreduce of the times");
            if (k >= 0) memcpy(res + (size_t)k * 5, t, sizeof t);
        }
        double m[5];
        for (int j = 0; j < 5; j++) {
            for (int k = 0; k < reps; k++) col[k] = res[(size_t)k * 5 + j];
            m[j] = median(col, reps);
        }
        if (rank == 0)
            printf("  %9zu %14.1f %14.1f %14.1f %14.1f %5.0f/%d\n", bytes, m[0], m[1], m[2], m[3],
                   m[4], calls);
        free(buf);
    }
    r = loom_comm_destroy(comm);
    FAIL(r, "destroy");
    free(flags);
    free(res);
    free(col);
    return 0;
}
