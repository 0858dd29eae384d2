/*
 * gossip_perf.c - one round of gossip averaging (loom_gossip_average,
 * seeded pairing) against an allreduce (LOOM_AVG) of the same buffer,
 * interleaved in every repetition, in one run.
 *
 * usage: loomrun -n RANKS perf/gossip_perf [-s bytes[,bytes...]] [-r reps]
 *                                           [-w warm-up] [-t float|double]
 *   -s sizes   bytes per rank, K/M suffixes, comma-separated (4K,4M)
 *   -r reps    timed repetitions of each, median reported (21)
 *   -w warm    repetitions run first and not timed (3)
 *   -t type    float (default) or double
 * Each repetition: a barrier, one gossip round (timed), a barrier, one
 * allreduce (timed); a repetition's time is the slowest rank's (found
 * by an allreduce outside the timed part).  Prints per size the median
 * time of each in microseconds and allreduce / gossip.  Exits 1 when a
 * call fails.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BENCH_NAME "gossip_perf"
#include "bench_util.h"
#include "loom.h"
#include "size_arg.h"

int main(int argc, char **argv)
{
    const char *sizes = "4K,4M";
    int reps = 21, warm = 3;
    loom_datatype_t t = LOOM_FLOAT32;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-s")) sizes = argv[i + 1];
        else if (!strcmp(argv[i], "-r")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-w")) warm = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-t")) t = !strcmp(argv[i + 1], "double") ? LOOM_FLOAT64 : LOOM_FLOAT32;
        else {
            fprintf(stderr, "usage: gossip_perf [-s bytes,...] [-r reps] [-w warm] [-t float|double]\n");
            return 2;
        }
    }
    if (reps < 1) reps = 1;
    if (warm < 0) warm = 0;
    loom_comm_t comm;
    loom_result_t r = loom_comm_init_env(&comm, NULL);
    FAIL(r, "init");
    int rank, n;
    loom_comm_rank(comm, &rank);
    loom_comm_size(comm, &n);
    const size_t es = loom_datatype_size(t);
    double *tg = malloc((size_t)reps * sizeof *tg), *ta = malloc((size_t)reps * sizeof *ta);
    if (!tg || !ta) return 1;
    if (rank == 0)
        printf("# gossip_perf: %d ranks, %s, %d repetitions (median, slowest rank)\n"
               "# %10s %12s %14s %10s\n",
               n, t == LOOM_FLOAT32 ? "float" : "double", reps, "bytes", "gossip_us",
               "allreduce_us", "ratio");
    uint64_t round = 0;
    for (const char *p = sizes; *p;) {
        size_t bytes = size_arg(p) / es * es;
        const char *c = strchr(p, ',');
        p = c ? c + 1 : p + strlen(p);
        if (!bytes) continue;
        const size_t count = bytes / es;
        void *buf = malloc(bytes);
        if (!buf) return 1;
        memset(buf, 0, bytes);
        for (int k = -warm; k < reps; k++) {
            double lat[2];
            r = loom_barrier(comm);
            FAIL(r, "barrier");
            double t0 = now_us();
            r = loom_gossip_average(buf, count, t, LOOM_GOSSIP_SEEDED, round++, comm);
            lat[0] = now_us() - t0;
            FAIL(r, "loom_gossip_average");
            r = loom_barrier(comm);
            FAIL(r, "barrier");
            t0 = now_us();
            r = loom_allreduce(buf, buf, count, t, LOOM_AVG, comm);
            lat[1] = now_us() - t0;
            FAIL(r, "loom_allreduce");
            r = loom_allreduce(lat, lat, 2, LOOM_FLOAT64, LOOM_MAX, comm);
            FAIL(r, "allreduce of the times");
            if (k >= 0) {
                tg[k] = lat[0];
                ta[k] = lat[1];
            }
        }
        double mg = median(tg, reps), ma = median(ta, reps);
        if (rank == 0) printf("  %10zu %12.1f %14.1f %10.2f\n", bytes, mg, ma, ma / mg);
        free(buf);
    }
    loom_comm_destroy(comm);
    free(tg);
    free(ta);
    return 0;
}
