/*
 * sparse_perf.c - the sparse collectives against the dense ones, in one
 * run: loom_sparse_allgather against loom_allreduce, and
 * loom_sparse_reduce_scatter against loom_reduce_scatter, of a float32
 * vector of N elements of which each rank holds a fraction (its top-k:
 * random indices, so the ranks' sets overlap by chance).
 *
 * usage: loomrun -n RANKS perf/sparse_perf [-n elements] [-d pct[,pct...]]
 *                                          [-r reps] [-w warm-up]
 *   -n elements   dense length, K/M suffixes (4M)
 *   -d pcts       density per rank in percent, comma-separated (1,10)
 *   -r reps       timed repetitions of each, median reported (11)
 *   -w warm       repetitions run first and not timed (2)
 * Each repetition runs the four calls in turn, each after a barrier; a
 * call's time is the slowest rank's (an allreduce outside the timed
 * part).  Bytes: before the timed repetitions each call runs once more
 * between loom_comm_reset_stats and loom_comm_get_stats, and the bytes
 * this rank received from its peers (bytes_in, summed) are printed, the
 * largest over the ranks; the sparse calls' include their header
 * exchange.  The telemetry counts what the transports receive as
 * messages: over shared memory the slots and single copies of one host
 * are not counted, so take the bytes from a run with
 * LOOM_TRANSPORT=tcp.  Exits 1 when a call fails.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BENCH_NAME "sparse_perf"
#include "bench_util.h"
#include "loom.h"
#include "size_arg.h"

enum { S_AG, D_AR, S_RS, D_RS, NCALLS };
static const char *const names[NCALLS] = {"sparse_allgather", "allreduce",
                                          "sparse_reduce_scatter", "reduce_scatter"};

struct bench {
    loom_comm_t comm;
    int n;
    size_t dense, nnz;
    const uint64_t *idx;
    const float *val;
    float *grad, *out;
};

static loom_result_t call(const struct bench *b, int which)
{
    const size_t block = b->dense / (size_t)b->n;
    switch (which) {
    case S_AG:
        return loom_sparse_allgather(b->idx, b->val, b->nnz, b->dense, LOOM_FLOAT32, LOOM_SUM,
                                     b->out, b->comm);
    case D_AR:
        return loom_allreduce(b->grad, b->out, b->dense, LOOM_FLOAT32, LOOM_SUM, b->comm);
    case S_RS:
        return loom_sparse_reduce_scatter(b->idx, b->val, b->nnz, block, LOOM_FLOAT32, LOOM_SUM,
                                          b->out, b->comm);
    default:
        return loom_reduce_scatter(b->grad, b->out, block, LOOM_FLOAT32, LOOM_SUM, b->comm);
    }
}

/* Bytes this rank received from its peers in one call of `which`. */
static loom_result_t bytes_of(const struct bench *b, int which, double *bytes)
{
    loom_peer_stats_t st[256];
    int count = 0;
    loom_result_t r = loom_comm_reset_stats(b->comm);
    if (r == LOOM_SUCCESS) r = call(b, which);
    st[0].size = sizeof st[0];
    if (r == LOOM_SUCCESS) r = loom_comm_get_stats(b->comm, st, 256, &count, NULL);
    *bytes = 0;
    for (int i = 0; i < count && i < 256 && r == LOOM_SUCCESS; i++) *bytes += (double)st[i].bytes_in;
    return r;
}

int main(int argc, char **argv)
{
    const char *dens = "1,10";
    size_t dense = (size_t)4 << 20;
    int reps = 11, warm = 2;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-n")) dense = size_arg(argv[i + 1]);
        else if (!strcmp(argv[i], "-d")) dens = argv[i + 1];
        else if (!strcmp(argv[i], "-r")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-w")) warm = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: sparse_perf [-n elements] [-d pct,...] [-r reps] [-w warm]\n");
            return 2;
        }
    }
    if (reps < 1) reps = 1;
    if (warm < 0) warm = 0;
    struct bench b = {0};
    loom_result_t r = loom_comm_init_env(&b.comm, NULL);
    FAIL(r, "init");
    int rank;
    loom_comm_rank(b.comm, &rank);
    loom_comm_size(b.comm, &b.n);
    b.dense = dense / (size_t)b.n * (size_t)b.n; /* reduce-scatter's blocks */
    b.dense = b.dense ? b.dense : (size_t)b.n;
    uint64_t *idx = malloc(b.dense * sizeof *idx);
    float *val = malloc(b.dense * sizeof *val);
    b.grad = malloc(b.dense * sizeof *b.grad);
    b.out = malloc(b.dense * sizeof *b.out);
    double *t[NCALLS];
    for (int k = 0; k < NCALLS; k++) t[k] = malloc((size_t)reps * sizeof(double));
    if (!idx || !val || !b.grad || !b.out || !t[NCALLS - 1]) return 1;
    b.idx = idx;
    b.val = val;
    if (rank == 0)
        printf("# sparse_perf: %d ranks, float32 sum, %zu elements dense (%zu bytes), %d "
               "repetitions (median of the slowest rank, us)\n"
               "# bytes: received per rank in one call (largest rank), from the telemetry\n"
               "# %5s %9s %-22s %12s %14s %12s %9s\n",
               b.n, b.dense, b.dense * 4, reps, "dens%", "nnz/rank", "call", "time_us",
               "bytes_in", "dense/sparse", "bytes_x");
    uint64_t seed = 0x9e3779b97f4a7c15ull * (uint64_t)(rank + 1);
    for (const char *p = dens; *p;) {
        double pct = atof(p);
        const char *c = strchr(p, ',');
        p = c ? c + 1 : p + strlen(p);
        b.nnz = (size_t)((double)b.dense * pct / 100.0);
        if (b.nnz > b.dense) b.nnz = b.dense;
        memset(b.grad, 0, b.dense * sizeof *b.grad);
        for (size_t k = 0; k < b.nnz; k++) { /* random indices, as a top-k gives */
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            idx[k] = (seed >> 17) % b.dense;
            val[k] = (float)((seed >> 40) % 1000) / 100.0f - 5.0f;
            b.grad[idx[k]] += val[k];
        }
        double bytes[NCALLS];
        for (int k = 0; k < NCALLS; k++) {
            r = bytes_of(&b, k, &bytes[k]);
            FAIL(r, names[k]);
        }
        r = loom_allreduce(bytes, bytes, NCALLS, LOOM_FLOAT64, LOOM_MAX, b.comm);
        FAIL(r, "allreduce of the bytes");
        for (int k = -warm; k < reps; k++) {
            double lat[NCALLS];
            for (int w = 0; w < NCALLS; w++) {
                r = loom_barrier(b.comm);
                FAIL(r, "barrier");
                double t0 = now_us();
                r = call(&b, w);
                lat[w] = now_us() - t0;
                FAIL(r, names[w]);
            }
            r = loom_allreduce(lat, lat, NCALLS, LOOM_FLOAT64, LOOM_MAX, b.comm);
            FAIL(r, "allreduce of the times");
            for (int w = 0; k >= 0 && w < NCALLS; w++) t[w][k] = lat[w];
        }
        double m[NCALLS];
        for (int w = 0; w < NCALLS; w++) m[w] = median(t[w], reps);
        for (int w = 0; rank == 0 && w < NCALLS; w++) {
            int sp = w == S_AG || w == S_RS;
            printf("  %5g %9zu %-22s %12.1f %14.0f", pct, b.nnz, names[w], m[w], bytes[w]);
            if (sp)
                printf(" %12.2f %9.2f\n", m[w + 1] / m[w],
                       bytes[w] > 0 ? bytes[w + 1] / bytes[w] : 0.0);
            else
                printf(" %12s %9s\n", "", "");
        }
    }
    loom_comm_destroy(b.comm);
    for (int k = 0; k < NCALLS; k++) free(t[k]);
    free(idx), free(val), free(b.grad), free(b.out);
    return 0;
}
