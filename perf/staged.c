/*
 * staged.c - how fast an allreduce of heap buffers can be on this host
 * when it is staged through shared arenas, with nothing but the copies
 * and the reduction: the ceiling of the design of the shared algorithm
 * (src/coll/shared.c) for buffers that peers cannot read, against which
 * perf/mem_bound.sh sets what Loom reaches.
 *
 * P processes (forked, each bound to CPU rank mod CPUs as loomrun --bind
 * core binds ranks), each with private SIZE-byte float vectors, and one
 * ARENA of shared memory per process, used in two halves.  Per round of
 * half an arena: every process copies its input but its own slice into
 * its arena; barrier; it adds its slice of the input and every peer's
 * copy of it and writes the sum into its output (streaming stores) and
 * its arena; barrier; it copies every other slice from its owner's arena
 * into its output (streaming stores).  That is the least the staging
 * takes: each input byte another process needs must be copied out of
 * private memory once, and each result byte copied into it once.  The
 * copy into the arena is done both ways Loom can do it (runs alternate):
 * with cached stores, and with streaming ones, whose lines the peers then
 * read from memory (LOOM_SHM_STREAM_COPYIN).  The barriers spin, yielding
 * the CPU, as ranks of an oversubscribed host do.  Prints the best of
 * ROUNDS runs of each as time and busbw (2(P-1)/P times the vector over
 * the time, as the perf binaries count it), the faster's first, and
 * checks the sums.
 *
 *   staged [RANKS [SIZE [ARENA [ROUNDS]]]]   defaults: 4, 64M, 4M, 10
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "procs.h"
#include "size_arg.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

struct ctl {
    struct procs_sync sync;
    double best[2]; /* rank 0's: copy-in cached, streamed */
    int bad;
};

static struct ctl *ctl;
static int nranks;

static void barrier(void)
{
    procs_barrier(&ctl->sync, nranks, "staged");
}

/* d = s (n floats, a multiple of 16, both 64-byte aligned), streaming;
 * out = keep = in + the k peer copies, out with streaming stores.  With
 * the widest vectors the CPU has, as Loom's kernels (src/reduce). */
#if defined(__x86_64__)
__attribute__((target("avx512f"))) static void copy_stream512(float *d, const float *s, size_t n)
{
    for (size_t i = 0; i < n; i += 16) _mm512_stream_ps(d + i, _mm512_load_ps(s + i));
}

__attribute__((target("avx512f"))) static void reduce512(float *out, float *keep, const float *in,
                                                         const float *const *peer, int k, size_t n)
{
    for (size_t i = 0; i < n; i += 16) {
        __m512 v = _mm512_load_ps(in + i);
        for (int q = 0; q < k; q++) v = _mm512_add_ps(v, _mm512_load_ps(peer[q] + i));
        _mm512_stream_ps(out + i, v);
        _mm512_store_ps(keep + i, v);
    }
}

static int wide; /* the CPU has AVX-512: x86 only */
#endif

static void copy_stream(float *d, const float *s, size_t n)
{
#if defined(__x86_64__)
    if (wide) {
        copy_stream512(d, s, n);
        return;
    }
    for (size_t i = 0; i < n; i += 4) _mm_stream_ps(d + i, _mm_load_ps(s + i));
#else
    memcpy(d, s, n * sizeof *d);
#endif
}

static void reduce(float *out, float *keep, const float *in, const float *const *peer, int k,
                   size_t n)
{
#if defined(__x86_64__)
    if (wide) {
        reduce512(out, keep, in, peer, k, n);
        return;
    }
    for (size_t i = 0; i < n; i += 4) {
        __m128 v = _mm_load_ps(in + i);
        for (int q = 0; q < k; q++) v = _mm_add_ps(v, _mm_load_ps(peer[q] + i));
        _mm_stream_ps(out + i, v);
        _mm_store_ps(keep + i, v);
    }
#else
    for (size_t i = 0; i < n; i++) {
        float v = in[i];
        for (int q = 0; q < k; q++) v += peer[q][i];
        out[i] = keep[i] = v;
    }
#endif
}

static int rank_main(int r, size_t n, size_t arena, int rounds, float *arenas)
{
    float *base[PROCS_MAX]; /* each process's arena */
    for (int q = 0; q < nranks; q++) base[q] = arenas + (size_t)q * (arena / sizeof(float));
    procs_bind(r);
    const size_t R = arena / 2 / sizeof(float); /* floats per round */
    float *in = aligned_alloc(64, n * sizeof *in), *out = aligned_alloc(64, n * sizeof *out);
    if (!in || !out) {
        fprintf(stderr, "staged: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < n; i++) in[i] = (float)(r + 1);
    memset(out, 0, n * sizeof *out);
    float *mine = base[r];
    const float *peer[PROCS_MAX];
    double best[2] = {1e30, 1e30}; /* copy-in cached, streamed */
    barrier();
    for (int it = -2; it < 2 * rounds; it++) { /* one untimed of each */
        const int nt = (it + 2) % 2;
        barrier();
        const double t0 = procs_now();
        for (size_t b = 0, k = 0; b < n; b += R, k++) {
            const size_t len = n - b < R ? n - b : R, half = (k % 2) * R;
            size_t my0, myn;
            procs_slice(len, nranks, r, &my0, &myn);
            if (nt) {
                copy_stream(mine + half, in + b, my0);
                copy_stream(mine + half + my0 + myn, in + b + my0 + myn, len - my0 - myn);
#if defined(__x86_64__)
                _mm_sfence();
#endif
            } else {
                memcpy(mine + half, in + b, my0 * sizeof *in);
                memcpy(mine + half + my0 + myn, in + b + my0 + myn,
                       (len - my0 - myn) * sizeof *in);
            }
            barrier();
            int np = 0;
            for (int q = 0; q < nranks; q++)
                if (q != r) peer[np++] = base[q] + half + my0;
            reduce(out + b + my0, mine + half + my0, in + b + my0, peer, np, myn);
            barrier();
            for (int q = 0; q < nranks; q++) {
                size_t q0, qn;
                procs_slice(len, nranks, q, &q0, &qn);
                if (q != r) copy_stream(out + b + q0, base[q] + half + q0, qn);
            }
        }
#if defined(__x86_64__)
        _mm_sfence();
#endif
        barrier();
        const double t = procs_now() - t0;
        if (it >= 0 && t < best[nt]) best[nt] = t;
    }
    if (!procs_sum_ok(out, n, r, nranks, "staged")) ctl->bad = 1;
    if (r == 0) {
        ctl->best[0] = best[0];
        ctl->best[1] = best[1];
    }
    free(in);
    free(out);
    return 0;
}

struct job {
    size_t n, arena;
    int rounds;
    float *arenas;
};

static int run_rank(int r, void *arg)
{
    const struct job *j = arg;
    return rank_main(r, j->n, j->arena, j->rounds, j->arenas);
}

int main(int argc, char **argv)
{
    nranks = argc > 1 ? atoi(argv[1]) : 4;
    size_t bytes = argc > 2 ? size_arg(argv[2]) : (size_t)64 << 20;
    size_t arena = argc > 3 ? size_arg(argv[3]) : (size_t)4 << 20;
    int rounds = argc > 4 ? atoi(argv[4]) : 10;
    if (nranks < 2 || nranks > PROCS_MAX || rounds < 1) {
        fprintf(stderr, "usage: staged [RANKS (2-%d) [SIZE [ARENA [ROUNDS]]]]\n", PROCS_MAX);
        return 2;
    }
    /* Whole 64-byte lines per round. */
    bytes = bytes / 64 * 64;
    arena = arena / 128 * 128;
    if (!bytes || !arena) {
        fprintf(stderr, "staged: SIZE and ARENA must be at least 64 and 128 bytes\n");
        return 2;
    }
    const size_t n = bytes / sizeof(float);
#if defined(__x86_64__)
    wide = __builtin_cpu_supports("avx512f");
#endif
    ctl = mmap(NULL, sizeof *ctl, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    float *arenas = mmap(NULL, arena * (size_t)nranks, PROT_READ | PROT_WRITE,
                         MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (ctl == MAP_FAILED || arenas == MAP_FAILED) {
        fprintf(stderr, "staged: mmap: %s\n", strerror(errno));
        return 1;
    }
    struct job job = {n, arena, rounds, arenas};
    const int failed = procs_run(nranks, run_rank, &job, "staged");
    if (failed || ctl->bad) return 1;
    const int f = ctl->best[1] < ctl->best[0];
    printf("staged: %d ranks, %zu bytes, arenas of %zu: %.3f ms, busbw %.2f GB/s "
           "(copy-in %s; cached %.3f ms, streamed %.3f ms)\n",
           nranks, bytes, arena, ctl->best[f] * 1e3,
           2.0 * (nranks - 1) / nranks * (double)bytes / ctl->best[f] / 1e9,
           f ? "streamed" : "cached", ctl->best[0] * 1e3, ctl->best[1] * 1e3);
    return 0;
}
