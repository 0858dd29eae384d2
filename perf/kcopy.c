/*
 * kcopy.c - how fast an allreduce of heap buffers can be on this host
 * when processes read each other's buffers with the kernel's single copy
 * (process_vm_readv), with nothing but those copies and the reduction:
 * the other way between heap buffers than staging them through shared
 * arenas (perf/staged), and against which perf/mem_bound.sh sets both.
 *
 * P processes (forked, each bound to CPU rank mod CPUs as loomrun --bind
 * core binds ranks), each with private SIZE-byte float vectors.  Each
 * reduces its slice: block by block (PIECE bytes, which stay in the
 * caches), it reads every peer's block of its input into a buffer of its
 * own and adds it to its own input's, then writes the sum into its
 * output; barrier; it reads every other slice from its owner's output
 * straight into its own; barrier.  Per rank that moves a read of SIZE
 * and a write of SIZE/P for the reduction and a read and a write of
 * (P-1)/P SIZE for the second half through memory, less than staging's
 * copies in and out of the arenas; but the kernel does the copies.
 * Prints the best of ROUNDS as time and busbw (2(P-1)/P times the vector
 * over the time, as the perf binaries count it), and checks the sums.
 *
 *   kcopy [RANKS [SIZE [ROUNDS]]]   defaults: 4, 64M, 10
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/uio.h>

#include "procs.h"
#include "size_arg.h"

#define PIECE ((size_t)128 << 10)

struct ctl {
    struct procs_sync sync;
    pid_t pid[PROCS_MAX];
    float *in[PROCS_MAX], *out[PROCS_MAX]; /* addresses in each process */
    double best;                           /* rank 0's */
    int bad;
};

static struct ctl *ctl;
static int nranks;

static void barrier(void)
{
    procs_barrier(&ctl->sync, nranks, "kcopy");
}

/* len bytes at `from` in process q into `to`; exits on failure. */
static void read_peer(int q, void *to, const void *from, size_t len)
{
    struct iovec l = {to, len}, r = {(void *)(uintptr_t)from, len};
    ssize_t got = process_vm_readv(ctl->pid[q], &l, 1, &r, 1, 0);
    if (got != (ssize_t)len) {
        fprintf(stderr, "kcopy: process_vm_readv from rank %d: %s\n", q,
                got < 0 ? strerror(errno) : "short read");
        _exit(1);
    }
}

static int rank_main(int r, size_t n, int rounds)
{
#ifdef PR_SET_PTRACER
    /* Where Yama lets only ancestors read a process, let the siblings. */
    (void)prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
#endif
    procs_bind(r);
    float *in = aligned_alloc(64, n * sizeof *in), *out = aligned_alloc(64, n * sizeof *out);
    float *tmp = aligned_alloc(64, PIECE);
    if (!in || !out || !tmp) {
        fprintf(stderr, "kcopy: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < n; i++) in[i] = (float)(r + 1);
    memset(out, 0, n * sizeof *out);
    memset(tmp, 0, PIECE);
    ctl->pid[r] = getpid();
    ctl->in[r] = in;
    ctl->out[r] = out;
    size_t my0, myn;
    procs_slice(n, nranks, r, &my0, &myn);
    const size_t blk = PIECE / sizeof(float);
    double best = 1e30;
    barrier();
    for (int it = -1; it < rounds; it++) { /* one untimed */
        barrier();
        const double t0 = procs_now();
        for (size_t b = 0; b < myn; b += blk) {
            const size_t k = myn - b < blk ? myn - b : blk;
            float *o = out + my0 + b;
            const float *a = in + my0 + b;
            for (int s = 1; s < nranks; s++) {
                const int q = (r + s) % nranks; /* not all on one peer at once */
                read_peer(q, tmp, ctl->in[q] + my0 + b, k * sizeof(float));
                const float *x = s == 1 ? a : o;
                for (size_t i = 0; i < k; i++) o[i] = x[i] + tmp[i];
            }
        }
        barrier();
        for (int s = 1; s < nranks; s++) {
            const int q = (r + s) % nranks;
            size_t q0, qn;
            procs_slice(n, nranks, q, &q0, &qn);
            for (size_t b = 0; b < qn; b += (size_t)16 * blk) {
                const size_t k = qn - b < 16 * blk ? qn - b : 16 * blk;
                read_peer(q, out + q0 + b, ctl->out[q] + q0 + b, k * sizeof(float));
            }
        }
        barrier();
        const double t = procs_now() - t0;
        if (it >= 0 && t < best) best = t;
    }
    if (!procs_sum_ok(out, n, r, nranks, "kcopy")) ctl->bad = 1;
    if (r == 0) ctl->best = best;
    /* The peers may still be reading this rank's output. */
    barrier();
    free(in);
    free(out);
    free(tmp);
    return 0;
}

struct job {
    size_t n;
    int rounds;
};

static int run_rank(int r, void *arg)
{
    const struct job *j = arg;
    return rank_main(r, j->n, j->rounds);
}

int main(int argc, char **argv)
{
    nranks = argc > 1 ? atoi(argv[1]) : 4;
    size_t bytes = argc > 2 ? size_arg(argv[2]) : (size_t)64 << 20;
    int rounds = argc > 3 ? atoi(argv[3]) : 10;
    if (nranks < 2 || nranks > PROCS_MAX || rounds < 1) {
        fprintf(stderr, "usage: kcopy [RANKS (2-%d) [SIZE [ROUNDS]]]\n", PROCS_MAX);
        return 2;
    }
    bytes = bytes / 64 * 64; /* whole 64-byte lines */
    if (!bytes) {
        fprintf(stderr, "kcopy: SIZE must be at least 64 bytes\n");
        return 2;
    }
    const size_t n = bytes / sizeof(float);
    ctl = mmap(NULL, sizeof *ctl, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (ctl == MAP_FAILED) {
        fprintf(stderr, "kcopy: mmap: %s\n", strerror(errno));
        return 1;
    }
    struct job job = {n, rounds};
    const int failed = procs_run(nranks, run_rank, &job, "kcopy");
    if (failed || ctl->bad) return 1;
    printf("kcopy: %d ranks, %zu bytes: %.3f ms, busbw %.2f GB/s\n", nranks, bytes,
           ctl->best * 1e3, 2.0 * (nranks - 1) / nranks * (double)bytes / ctl->best / 1e9);
    return 0;
}
