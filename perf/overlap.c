/*
 * overlap.c - compute overlap: the time of H compute steps (an N x N fp32
 * matrix multiply each) alone, against the same H steps with a compressed
 * allreduce (default 64 MiB of fp32, codec int8) in flight in the
 * background, started just before them with loom_iallreduce_opts and
 * waited for after them.
 *
 * usage: loomrun -n RANKS perf/overlap [-H steps] [-N dim] [-b bytes] [-c codec] [-r reps]
 * Run with LOOM_PROGRESS_THREAD=1 (background progress) and 0 (the
 * operation moves only inside loom_wait) to compare.  Times are the
 * slowest rank's, median of the repetitions.  Prints:
 *   compute alone          H steps, nothing in flight
 *   allreduce alone        the compressed allreduce, blocking
 *   compute with AR        H steps while the allreduce is in flight
 *   AR wait after          loom_wait after the H steps
 *   ratio                  compute with AR / compute alone
 *   overlapped total       compute with AR + wait after, against alone+alone
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "loom.h"

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int N = 256;
static float *A, *B, *C;

static void step(void)
{
    for (int i = 0; i < N; i++)
        for (int k = 0; k < N; k++) {
            float a = A[(size_t)i * N + k];
            for (int j = 0; j < N; j++) C[(size_t)i * N + j] += a * B[(size_t)k * N + j];
        }
    /* Keep the values bounded. */
    C[0] *= 0.5f;
}

static double slowest(double t, loom_comm_t comm)
{
    loom_allreduce(&t, &t, 1, LOOM_FLOAT64, LOOM_MAX, comm);
    return t;
}

#define CHECK(x)                                                                    \
    do {                                                                            \
        if ((x) != LOOM_SUCCESS) {                                                  \
            fprintf(stderr, "%s failed: %s\n", #x, loom_get_last_error());          \
            exit(1);                                                                \
        }                                                                           \
    } while (0)

int main(int argc, char **argv)
{
    int H = 20, reps = 3;
    size_t bytes = (size_t)64 << 20;
    const char *spec = "int8";
    int o;
    while ((o = getopt(argc, argv, "H:N:b:c:r:")) != -1) {
        switch (o) {
        case 'H': H = atoi(optarg); break;
        case 'N': N = atoi(optarg); break;
        case 'b': bytes = strtoull(optarg, NULL, 10); break;
        case 'c': spec = optarg; break;
        case 'r': reps = atoi(optarg); break;
        default:
            fprintf(stderr, "usage: overlap [-H steps] [-N dim] [-b bytes] [-c codec] [-r reps]\n");
            return 2;
        }
    }
    if (H < 1 || N < 1 || reps < 1 || reps > 64) return 2;
    loom_comm_t comm;
    CHECK(loom_comm_init_env(&comm, NULL));
    int rank, nranks;
    loom_comm_rank(comm, &rank);
    loom_comm_size(comm, &nranks);
    const loom_codec_t *codec = NULL;
    if (strcmp(spec, "none")) CHECK(loom_codec_find(spec, &codec));
    loom_coll_options_t opts = LOOM_COLL_OPTIONS_INITIALIZER;
    opts.codec = codec;
    size_t count = bytes / sizeof(float);
    float *g = malloc(count * sizeof *g);
    A = malloc((size_t)N * N * sizeof *A);
    B = malloc((size_t)N * N * sizeof *B);
    C = calloc((size_t)N * N, sizeof *C);
    if (!g || !A || !B || !C) return 1;
    for (size_t i = 0; i < (size_t)N * N; i++) A[i] = (float)(i % 13) / 13, B[i] = (float)(i % 7) / 7;
    for (size_t i = 0; i < count; i++) g[i] = (float)((i + (size_t)rank) % 101) / 101;
    double t_comp[64], t_ar[64], t_with[64], t_wait[64];
    /* Warm-up: pages, connections, codec tables. */
    step();
    CHECK(loom_allreduce_opts(g, g, count, LOOM_FLOAT32, LOOM_AVG, comm, &opts));
    for (int r = 0; r < reps; r++) {
        CHECK(loom_barrier(comm));
        double t0 = now_ms();
        for (int h = 0; h < H; h++) step();
        t_comp[r] = slowest(now_ms() - t0, comm);

        CHECK(loom_barrier(comm));
        t0 = now_ms();
        CHECK(loom_allreduce_opts(g, g, count, LOOM_FLOAT32, LOOM_AVG, comm, &opts));
        t_ar[r] = slowest(now_ms() - t0, comm);

        CHECK(loom_barrier(comm));
        loom_request_t req;
        t0 = now_ms();
        CHECK(loom_iallreduce_opts(g, g, count, LOOM_FLOAT32, LOOM_AVG, comm, &opts, &req));
        for (int h = 0; h < H; h++) step();
        double t1 = now_ms();
        CHECK(loom_wait(&req));
        double t2 = now_ms();
        t_with[r] = slowest(t1 - t0, comm);
        t_wait[r] = slowest(t2 - t1, comm);
    }
    qsort(t_comp, (size_t)reps, sizeof(double), cmp_double);
    qsort(t_ar, (size_t)reps, sizeof(double), cmp_double);
    qsort(t_with, (size_t)reps, sizeof(double), cmp_double);
    qsort(t_wait, (size_t)reps, sizeof(double), cmp_double);
    double c = t_comp[reps / 2], a = t_ar[reps / 2], w = t_with[reps / 2], x = t_wait[reps / 2];
    if (rank == 0) {
        const char *pt = getenv("LOOM_PROGRESS_THREAD");
        printf("# overlap: %d ranks, H=%d steps of %dx%d fp32 matmul, allreduce %zu MiB fp32 "
               "codec %s, progress thread %s, median of %d (slowest rank)\n",
               nranks, H, N, N, bytes >> 20, spec, pt && atoi(pt) == 1 ? "on" : "off", reps);
        printf("%-28s %10.1f ms\n", "compute alone", c);
        printf("%-28s %10.1f ms\n", "allreduce alone", a);
        printf("%-28s %10.1f ms\n", "compute with allreduce", w);
        printf("%-28s %10.1f ms\n", "wait after compute", x);
        printf("%-28s %10.2f\n", "ratio (with / alone)", w / c);
        printf("%-28s %10.1f ms (sequential %.1f ms, %.0f%% of the allreduce hidden)\n",
               "overlapped total", w + x, c + a, a > 0 ? 100.0 * (c + a - (w + x)) / a : 0);
    }
    loom_comm_destroy(comm);
    free(g);
    free(A);
    free(B);
    free(C);
    return 0;
}
