/*
 * mp_gpu.c - collectives on real CUDA device memory (cuMemAlloc through
 * CUDA's driver, loaded with dlopen: no CUDA header or library needed to
 * build), for tests/gpu/run_on_gpu.sh on a machine with a GPU: every
 * rank of the job shares device 0.
 *
 *   mp_gpu all    every collective, in place and not, blocking and not,
 *                 small and large (past LOOM_CUDA_PIPELINE_CHUNK: the
 *                 pipelined staging), checked element by element against
 *                 a reference computed here on the CPU; allreduce of every
 *                 datatype and op, large, against the same call on host
 *                 memory, byte for byte
 *   mp_gpu bench  allreduce of 64 and 256 MiB device buffers, timed
 *                 (rank 0 prints "bench" lines)
 *   mp_gpu kill   allreduces of device buffers in a loop; the last rank
 *                 kills itself (SIGKILL) in the middle of one: every other
 *                 rank must get an error (not hang) and exits 0 then
 *
 * Exit status 77 where there is no driver or no device (a skip).
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loom.h"
#include "../mp/check.h"
#include "cuda_dl.h"

static int rank, nranks, failures, nruns;
static loom_comm_t comm;
static void *stream;

static int load(void)
{
    if (cuda_load()) return -1;
    int dev;
    void *ctx;
    if (cu_init(0) || cu_device_get(&dev, 0) || cu_ctx_retain(&ctx, dev) || cu_ctx_set(ctx))
        return -1;
    return cu_stream_create(&stream, 1) ? -1 : 0;
}

/* A device buffer of n bytes holding init (NULL: 0x5A bytes). */
static void *dev_buf(size_t n, const void *init)
{
    unsigned long long d = 0;
    if (!n) return NULL;
    if (cu_alloc(&d, n)) {
        CHECK(0, "cuMemAlloc of %zu bytes", n);
        return NULL;
    }
    void *tmp = NULL;
    if (!init) {
        tmp = malloc(n);
        memset(tmp, 0x5A, n);
        init = tmp;
    }
    CHECK(cu_htod(d, init, n) == 0, "cuMemcpyHtoD");
    free(tmp);
    return (void *)(uintptr_t)d;
}

static void dev_read(void *out, const void *d, size_t n)
{
    if (n) CHECK(cu_dtoh(out, (uintptr_t)d, n) == 0, "cuMemcpyDtoH");
}

static void dev_free(void *d)
{
    if (d) cu_free((uintptr_t)d);
}

/* Rank r's element i: small whole numbers, so that float sums are exact. */
static float V(int r, size_t i)
{
    return (float)((r * 7 + (int)(i % 13)) % 17);
}

enum { ALLREDUCE, REDUCE, BROADCAST, REDUCE_SCATTER, ALLGATHER, ALLTOALL, ALLTOALLV, GATHER,
       SCATTER, NCOLLS };
static const char *const names[] = {"allreduce", "reduce",  "broadcast", "reduce_scatter",
                                    "allgather", "alltoall", "alltoallv", "gather", "scatter"};

/* One float32 collective of c elements per block on device buffers,
 * checked against the CPU reference.  mode 0 blocking, 1 loom_wait. */
static void one(int coll, size_t c, int inplace, int mode)
{
    const size_t p = (size_t)nranks;
    const int root = nranks - 1, is_root = rank == root;
    size_t sn = 0, rn = 0, so = 0, ro = 0;
    int ip = inplace;
    switch (coll) {
    case ALLREDUCE: sn = rn = c; break;
    case REDUCE: sn = c, rn = is_root ? c : 0, ip &= is_root; break;
    case BROADCAST: sn = is_root ? c : 0, rn = c, ip &= is_root; break;
    case REDUCE_SCATTER: sn = p * c, rn = c, ro = (size_t)rank * c; break;
    case ALLGATHER: sn = c, rn = p * c, so = (size_t)rank * c; break;
    case ALLTOALL: sn = rn = p * c, ip = 0; break;
    case ALLTOALLV: sn = p * c, rn = p * c, ip = 0; break;
    case GATHER: sn = c, rn = is_root ? p * c : 0, so = (size_t)root * c, ip &= is_root; break;
    case SCATTER: sn = is_root ? p * c : 0, rn = c, ro = (size_t)root * c, ip &= is_root; break;
    }
    const size_t big = (sn > rn ? sn : rn) + 1;
    float *in = calloc(big, 4), *E = calloc(big, 4), *got = calloc(big, 4), *init = calloc(big, 4);
    for (size_t i = 0; i < sn; i++) in[i] = V(rank, i);
    for (size_t i = 0; i < rn; i++) {
        const size_t q = i / c, j = i % c;
        float v = 0;
        switch (coll) {
        case ALLREDUCE:
        case REDUCE:
            for (int r = 0; r < nranks; r++) v += V(r, i);
            break;
        case BROADCAST: v = V(root, i); break;
        case REDUCE_SCATTER:
            for (int r = 0; r < nranks; r++) v += V(r, (size_t)rank * c + i);
            break;
        case ALLGATHER:
        case GATHER: v = V((int)q, j); break;
        case ALLTOALL:
        case ALLTOALLV: v = V((int)q, (size_t)rank * c + j); break;
        case SCATTER: v = V(root, (size_t)rank * c + i); break;
        }
        E[i] = v;
    }
    void *sbuf = NULL, *rbuf = NULL;
    const void *sb;
    void *rb;
    if (ip) {
        const size_t n = sn > rn ? sn : rn;
        for (size_t i = 0; i < n; i++) init[i] = -1;
        memcpy(init + so, in, sn * 4);
        rbuf = dev_buf(n * 4, init);
        sb = (float *)rbuf + so;
        rb = (float *)rbuf + ro;
    } else {
        sbuf = dev_buf(sn * 4, in);
        rbuf = dev_buf(rn * 4, NULL);
        sb = sbuf;
        rb = rbuf;
    }
    size_t cnt[64], dsp[64];
    for (size_t q = 0; q < p && q < 64; q++) cnt[q] = c, dsp[q] = q * c;
    loom_request_t req = LOOM_REQUEST_NULL, *rq = mode ? &req : NULL;
    loom_coll_options_t o = LOOM_COLL_OPTIONS_INITIALIZER;
    o.stream = stream;
    loom_result_t r = LOOM_ERR_INTERNAL;
    const loom_datatype_t F = LOOM_FLOAT32;
    switch (coll) {
    case ALLREDUCE:
        r = rq ? loom_iallreduce_opts(sb, rb, c, F, LOOM_SUM, comm, &o, rq)
               : loom_allreduce_opts(sb, rb, c, F, LOOM_SUM, comm, &o);
        break;
    case REDUCE:
        r = rq ? loom_ireduce(sb, rb, c, F, LOOM_SUM, root, comm, rq)
               : loom_reduce(sb, rb, c, F, LOOM_SUM, root, comm);
        break;
    case BROADCAST:
        r = rq ? loom_ibroadcast(sb, rb, c, F, root, comm, rq)
               : loom_broadcast(sb, rb, c, F, root, comm);
        break;
    case REDUCE_SCATTER:
        r = rq ? loom_ireduce_scatter_opts(sb, rb, c, F, LOOM_SUM, comm, &o, rq)
               : loom_reduce_scatter_opts(sb, rb, c, F, LOOM_SUM, comm, &o);
        break;
    case ALLGATHER:
        r = rq ? loom_iallgather_opts(sb, rb, c, F, comm, &o, rq)
               : loom_allgather_opts(sb, rb, c, F, comm, &o);
        break;
    case ALLTOALL:
        r = rq ? loom_ialltoall(sb, rb, c, F, comm, rq) : loom_alltoall(sb, rb, c, F, comm);
        break;
    case ALLTOALLV:
        r = rq ? loom_ialltoallv(sb, cnt, dsp, rb, cnt, dsp, F, comm, rq)
               : loom_alltoallv(sb, cnt, dsp, rb, cnt, dsp, F, comm);
        break;
    case GATHER:
        r = rq ? loom_igather(sb, rb, c, F, root, comm, rq)
               : loom_gather(sb, rb, c, F, root, comm);
        break;
    case SCATTER:
        r = rq ? loom_iscatter(sb, rb, c, F, root, comm, rq)
               : loom_scatter(sb, rb, c, F, root, comm);
        break;
    }
    if (r == LOOM_SUCCESS && rq) r = loom_wait(rq);
    nruns++;
    CHECK(r == LOOM_SUCCESS, "%s of %zu%s%s: %s (%s)", names[coll], c, ip ? " in place" : "",
          mode ? ", loom_wait" : "", loom_strerror(r), loom_get_last_error());
    if (rn) {
        dev_read(got, rb, rn * 4);
        for (size_t i = 0; i < rn; i++)
            if (got[i] != E[i]) {
                CHECK(0, "%s of %zu%s%s: [%zu] %g, expected %g", names[coll], c,
                      ip ? " in place" : "", mode ? ", loom_wait" : "", i, got[i], E[i]);
                break;
            }
    }
    dev_free(sbuf);
    dev_free(rbuf);
    free(in);
    free(E);
    free(got);
    free(init);
}

/* Every datatype and op of a large (pipelined) allreduce against the same
 * call on host memory. */
static void dtypes(size_t bytes)
{
    for (int dt = 0; dt < LOOM_NUM_DATATYPES; dt++)
        for (int op = 0; op < LOOM_NUM_OPS; op++) {
            const size_t es = loom_datatype_size((loom_datatype_t)dt);
            const size_t count = bytes / es + 3, len = count * es;
            unsigned char *in = malloc(len), *ref = malloc(len), *got = malloc(len);
            /* bytes that are small whole numbers in every type: 1 or 2 in
             * the integer types' low byte, 0 elsewhere, and for the float
             * types the same small values written as floats */
            memset(in, 0, len);
            for (size_t i = 0; i < count; i++) {
                unsigned char *e = in + i * es;
                const int v = 1 + (int)((i + (size_t)rank) % 2);
                if (dt == LOOM_FLOAT32) {
                    float f = (float)v;
                    memcpy(e, &f, 4);
                } else if (dt == LOOM_FLOAT64) {
                    double f = v;
                    memcpy(e, &f, 8);
                } else if (dt == LOOM_FLOAT16) {
                    uint16_t h = v == 1 ? 0x3C00 : 0x4000;
                    memcpy(e, &h, 2);
                } else if (dt == LOOM_BFLOAT16) {
                    uint16_t h = v == 1 ? 0x3F80 : 0x4000;
                    memcpy(e, &h, 2);
                } else {
                    e[0] = (unsigned char)v; /* little-endian */
                }
            }
            loom_result_t r = loom_allreduce(in, ref, count, dt, op, comm);
            CHECK(r == LOOM_SUCCESS, "host allreduce dtype %d op %d: %s", dt, op,
                  loom_strerror(r));
            void *s = dev_buf(len, in), *d = dev_buf(len, NULL);
            loom_coll_options_t o = LOOM_COLL_OPTIONS_INITIALIZER;
            o.stream = stream;
            r = loom_allreduce_opts(s, d, count, dt, op, comm, &o);
            nruns++;
            CHECK(r == LOOM_SUCCESS, "device allreduce dtype %d op %d: %s (%s)", dt, op,
                  loom_strerror(r), loom_get_last_error());
            dev_read(got, d, len);
            CHECK(!memcmp(got, ref, len), "device allreduce dtype %d op %d of %zu: differs from "
                  "the host call", dt, op, count);
            dev_free(s);
            dev_free(d);
            free(in);
            free(ref);
            free(got);
        }
}

static int kill_test(void)
{
    const size_t n = (size_t)16 << 20; /* 64 MiB of float32: pipelined */
    void *s = dev_buf(n * 4, NULL), *d = dev_buf(n * 4, NULL);
    loom_coll_options_t o = LOOM_COLL_OPTIONS_INITIALIZER;
    o.stream = stream;
    const int victim = nranks - 1;
    for (int it = 0; it < 1000; it++) {
        loom_request_t req;
        loom_result_t r = loom_iallreduce_opts(s, d, n, LOOM_FLOAT32, LOOM_SUM, comm, &o, &req);
        if (rank == victim && it == 3) {
            /* in the middle of it: the chunks started, not finished */
            struct timespec t = {0, 2000000};
            nanosleep(&t, NULL);
            raise(SIGKILL);
        }
        if (r == LOOM_SUCCESS) r = loom_wait(&req);
        if (r != LOOM_SUCCESS) {
            printf("rank %d: allreduce %d failed as it should: %s (%s)\n", rank, it,
                   loom_strerror(r), loom_get_last_error());
            CHECK(it >= 3, "allreduce %d failed before the kill: %s", it, loom_strerror(r));
            return failures ? 1 : 0;
        }
    }
    CHECK(0, "every allreduce succeeded with rank %d killed", victim);
    return 1;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Allreduce of device buffers, 64 and 256 MiB of float32: the median of
 * 7 timed calls (after 2), as "bench" lines (rank 0).  label: what the
 * caller set (LOOM_CUDA_PIPELINE_CHUNK). */
static int bench(const char *label)
{
    for (size_t mib = 64; mib <= 256; mib *= 4) {
        const size_t n = mib << 18; /* floats */
        void *s = dev_buf(n * 4, NULL), *d = dev_buf(n * 4, NULL);
        loom_coll_options_t o = LOOM_COLL_OPTIONS_INITIALIZER;
        o.stream = stream;
        double t[9];
        for (int i = 0; i < 9; i++) {
            loom_barrier(comm);
            double t0 = now_s();
            loom_result_t r = loom_allreduce_opts(s, d, n, LOOM_FLOAT32, LOOM_SUM, comm, &o);
            t[i] = now_s() - t0;
            CHECK(r == LOOM_SUCCESS, "bench allreduce: %s", loom_strerror(r));
        }
        qsort(t + 2, 7, sizeof *t, cmp_d);
        if (rank == 0)
            printf("bench device allreduce %zu MiB, %d ranks, %s: %.2f ms median of 7 "
                   "(%.2f GB/s algbw)\n",
                   mib, nranks, label, t[5] * 1e3, (double)(n * 4) / t[5] * 1e-9);
        dev_free(s);
        dev_free(d);
    }
    return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc < 2 || (strcmp(argv[1], "all") && strcmp(argv[1], "kill") &&
                     strcmp(argv[1], "bench"))) {
        fprintf(stderr, "usage: mp_gpu all|kill|bench\n");
        return 2;
    }
    if (load()) {
        printf("skipped: no CUDA driver or device\n");
        return 77;
    }
    mp_join(&comm, &rank, &nranks);
    if (!strcmp(argv[1], "bench")) {
        const char *c = getenv("LOOM_CUDA_PIPELINE_CHUNK");
        char label[96];
        const char *tr = getenv("LOOM_TRANSPORT");
        snprintf(label, sizeof label, "%s, LOOM_CUDA_PIPELINE_CHUNK=%s", tr ? tr : "any",
                 c ? c : "(default)");
        int rc = bench(label);
        loom_comm_destroy(comm);
        return rc;
    }
    if (!strcmp(argv[1], "kill")) {
        int rc = kill_test();
        loom_comm_abort(comm);
        return rc;
    }
    /* small (staged whole) and large (pipelined: 8 MiB per block past
     * the 4 MiB default chunk, and an odd count) */
    static const size_t sizes[] = {5, 1000003, (size_t)2 << 20};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++)
        for (int coll = 0; coll < NCOLLS; coll++)
            for (int ip = 0; ip < 2; ip++)
                for (int mode = 0; mode < 2; mode++) one(coll, sizes[k], ip, mode);
    dtypes((size_t)9 << 20);
    loom_comm_destroy(comm);
    if (!failures) printf("rank %d: %d calls on device memory: ok\n", rank, nruns);
    return failures ? 1 : 0;
}
