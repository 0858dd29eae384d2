/*
 * group_perf.c - many small allreduces fused in one group (DDP's gradient
 * buckets): K allreduces of S bytes (float sum) in one
 * loom_group_start/loom_group_end, against the same K calls one by one,
 * against one allreduce of the K*S-byte concatenation; the three
 * interleaved in every repetition, in one run.
 *
 * usage: loomrun -n RANKS perf/group_perf [-k calls] [-s bytes] [-r reps]
 *                                          [-w warm-up] [-p 0|1] [-c 0|1]
 *   -k calls   allreduces per group (1000)
 *   -s bytes   bytes of each, K/M suffixes (4K); a multiple of 4
 *   -r reps    repetitions, median reported (7; at least 1)
 *   -w warm    repetitions run first and not timed (2)
 *   -p 1       in place (recvbuf == sendbuf); 0 out of place (default)
 *   -c 1       check every result against the exact sum (1)
 *   -a 1       each call's buffers allocated apart (the group packs them
 *              into a staging buffer); 0 (default): views into one buffer
 *              each, one after the other, as DDP's buckets (no copy)
 *   -m modes   which to run, a sum of 1 (group), 2 (one by one), 4
 *              (concatenation, always run: the ratios' base); 7, all
 * Times are the slowest rank's, per repetition, median over reps.  Prints
 * one row per mode, its median time in microseconds, the ratio to the
 * concatenation, and the results found wrong ("#wrong", 0 when all are
 * right).  Exits 1 when a call fails or a result is wrong.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "loom.h"
#include "size_arg.h"

#define CHECK(x)                                                                    \
    do {                                                                            \
        loom_result_t r_ = (x);                                                     \
        if (r_ != LOOM_SUCCESS) {                                                   \
            fprintf(stderr, "group_perf: %s failed: %s: %s\n", #x,                  \
                    loom_strerror(r_), loom_get_last_error());                      \
            exit(1);                                                                \
        }                                                                           \
    } while (0)

static loom_comm_t comm;
static int rank, nranks;
static size_t K, E; /* calls, floats per call */
/* The concatenation; the calls' buffers (views into it, or -a 1 each
 * allocated apart). */
static float *in, *out, **ins, **outs;

/* Element j of call i on rank r: small integers, whose sum is exact. */
static float val(int r, size_t i, size_t j) { return (float)((r + 1) * (int)((i * 7 + j) % 13)); }

static void fill(int inplace)
{
    for (size_t i = 0; i < K; i++)
        for (size_t j = 0; j < E; j++) {
            in[i * E + j] = ins[i][j] = val(rank, i, j);
            out[i * E + j] = outs[i][j] = inplace ? ins[i][j] : -1.0f;
        }
}

/* Results found wrong, summed over the ranks. */
static double wrong(int mode, int inplace)
{
    const int tri = nranks * (nranks + 1) / 2;
    double bad = 0;
    for (size_t i = 0; i < K; i++) {
        const float *res = mode == 2 ? (inplace ? in : out) + i * E : inplace ? ins[i] : outs[i];
        for (size_t j = 0; j < E; j++)
            if (res[j] != (float)(tri * (int)((i * 7 + j) % 13))) bad++;
    }
    CHECK(loom_allreduce(&bad, &bad, 1, LOOM_FLOAT64, LOOM_SUM, comm));
    return bad;
}

static double slowest(double t)
{
    CHECK(loom_allreduce(&t, &t, 1, LOOM_FLOAT64, LOOM_MAX, comm));
    return t;
}

enum { GROUP, ONE_BY_ONE, CONCAT, MODES };
static const char *const mode_name[MODES] = {"group", "one by one", "concatenation"};

static double run(int mode, int inplace)
{
    float **o = inplace ? ins : outs;
    CHECK(loom_barrier(comm));
    double t0 = now_us();
    switch (mode) {
    case GROUP:
        CHECK(loom_group_start());
        for (size_t i = 0; i < K; i++)
            CHECK(loom_allreduce(ins[i], o[i], E, LOOM_FLOAT32, LOOM_SUM, comm));
        CHECK(loom_group_end());
        break;
    case ONE_BY_ONE:
        for (size_t i = 0; i < K; i++)
            CHECK(loom_allreduce(ins[i], o[i], E, LOOM_FLOAT32, LOOM_SUM, comm));
        break;
    default: CHECK(loom_allreduce(in, inplace ? in : out, K * E, LOOM_FLOAT32, LOOM_SUM, comm));
    }
    return slowest(now_us() - t0);
}

int main(int argc, char **argv)
{
    int reps = 7, warm = 2, inplace = 0, check = 1, apart = 0, o;
    size_t bytes = 4096;
    K = 1000;
    unsigned modes = 7;
    while ((o = getopt(argc, argv, "k:s:r:w:p:c:m:a:")) != -1) {
        switch (o) {
        case 'k': K = strtoull(optarg, NULL, 10); break;
        case 's': bytes = size_arg(optarg); break;
        case 'r': reps = atoi(optarg); break;
        case 'w': warm = atoi(optarg); break;
        case 'p': inplace = atoi(optarg); break;
        case 'c': check = atoi(optarg); break;
        case 'a': apart = atoi(optarg); break;
        case 'm': modes = (unsigned)atoi(optarg); break;
        default:
            fprintf(stderr, "usage: group_perf [-k calls] [-s bytes] [-r reps] [-w warm-up] "
                            "[-p 0|1] [-c 0|1] [-m modes] [-a 0|1]\n");
            return 2;
        }
    }
    if (!K || K > 1000000 || bytes < 4 || bytes % 4 || bytes > ((size_t)1 << 30) / K ||
        reps < 1 || reps > 1000 || warm < 0 || !(modes & 4) || modes > 7) {
        fprintf(stderr, "group_perf: -k 1..1000000, -s a multiple of 4, K*S at most 1 GiB, "
                        "-r 1..1000, -w 0 or more, -m 4..7\n");
        return 2;
    }
    E = bytes / 4;
    CHECK(loom_comm_init_env(&comm, NULL));
    CHECK(loom_comm_rank(comm, &rank));
    CHECK(loom_comm_size(comm, &nranks));
    in = malloc(K * E * sizeof *in);
    out = malloc(K * E * sizeof *out);
    ins = malloc(K * sizeof *ins);
    outs = malloc(K * sizeof *outs);
    double *t = malloc((size_t)MODES * (size_t)reps * sizeof *t);
    if (!in || !out || !ins || !outs || !t) return 1;
    for (size_t i = 0; i < K; i++) {
        ins[i] = apart ? malloc(E * sizeof **ins) : in + i * E;
        outs[i] = apart ? malloc(E * sizeof **outs) : out + i * E;
        if (!ins[i] || !outs[i]) return 1;
    }
    double bad[MODES] = {0};
    for (int r = -warm; r < reps; r++)
        for (int m = 0; m < MODES; m++) {
            if (!(modes >> m & 1)) continue;
            fill(inplace);
            double x = run(m, inplace);
            if (r >= 0) t[m * reps + r] = x;
            if (check) bad[m] += wrong(m, inplace);
        }
    double med[MODES] = {0};
    for (int m = 0; m < MODES; m++) {
        if (!(modes >> m & 1)) continue;
        qsort(t + m * reps, (size_t)reps, sizeof *t, cmp_double);
        med[m] = t[m * reps + reps / 2];
    }
    int ok = 1;
    if (rank == 0) {
        const char *tr = getenv("LOOM_TRANSPORT");
        printf("# group_perf: %d ranks, %zu allreduces of %zu B (float32 sum, %s) per group, "
               "%s, transport %s, median of %d (slowest rank), %d warm-up\n",
               nranks, K, bytes, inplace ? "in place" : "out of place",
               apart ? "each allocated apart" : "views into one buffer", tr && *tr ? tr : "auto",
               reps, warm);
        printf("# %-14s %12s %10s %8s\n", "mode", "time(us)", "/concat", "#wrong");
    }
    for (int m = 0; m < MODES; m++) {
        if (bad[m] != 0) ok = 0;
        if (rank == 0 && modes >> m & 1)
            printf("  %-14s %12.1f %10.2f %8.0f\n", mode_name[m], med[m], med[m] / med[CONCAT],
                   check ? bad[m] : -1.0);
    }
    if (rank == 0)
        printf("# group / concatenation: %.2f, one by one / group: %.2f\n", med[GROUP] / med[CONCAT],
               med[ONE_BY_ONE] / med[GROUP]);
    CHECK(loom_comm_destroy(comm));
    for (size_t i = 0; apart && i < K; i++) {
        free(ins[i]);
        free(outs[i]);
    }
    free(ins);
    free(outs);
    free(in);
    free(out);
    free(t);
    return ok ? 0 : 1;
}
