/*
 * nccl_prog.c - a program written against NCCL's API alone (host
 * buffers, NULL stream), run by tests/mp/test_nccl.sh over libloom-nccl:
 *
 *   nccl_prog run RANK NRANKS IDFILE       every call, checked
 *   nccl_prog mismatch RANK NRANKS IDFILE  ranks pass different counts
 *   nccl_prog kill RANK NRANKS IDFILE      the last rank dies mid-job
 *   nccl_prog pair P NPROC IDFILE          ranks 2P, 2P+1 of 2*NPROC here
 *   nccl_prog abortbusy RANK NRANKS IDFILE ncclCommAbort during a call
 *   nccl_prog initall NDEV                 NDEV ranks in this process
 *
 * Rank 0 makes the ncclUniqueId and hands it to the others in IDFILE.
 * Prints "ok"/"FAIL" lines and exits 1 if any check failed.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <nccl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nccl_check.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ------------------------------------------------ element conversions */

static size_t dt_size(ncclDataType_t dt)
{
    switch (dt) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
    }
}

static uint16_t to_half(double v) /* exact for the small values used */
{
    if (v == 0) return 0;
    uint16_t sign = v < 0 ? 0x8000 : 0;
    int e;
    double m = frexp(fabs(v), &e); /* v = m * 2^e, m in [0.5, 1) */
    return (uint16_t)(sign | ((e + 14) << 10) | ((uint16_t)((m * 2 - 1) * 1024) & 0x3ff));
}

static double from_half(uint16_t h)
{
    int e = (h >> 10) & 0x1f;
    double m = h & 0x3ff;
    double v = e ? ldexp(1 + m / 1024, e - 15) : ldexp(m / 1024, -14);
    return h & 0x8000 ? -v : v;
}

static uint16_t to_bf16(double v)
{
    float f = (float)v;
    uint32_t x;
    memcpy(&x, &f, 4);
    return (uint16_t)(x >> 16);
}

static double from_bf16(uint16_t b)
{
    uint32_t x = (uint32_t)b << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static void put(void *buf, ncclDataType_t dt, size_t i, double v)
{
    char *p = (char *)buf + i * dt_size(dt);
    switch (dt) {
    case ncclInt8: { int8_t x = (int8_t)v; memcpy(p, &x, 1); break; }
    case ncclUint8: { uint8_t x = (uint8_t)v; memcpy(p, &x, 1); break; }
    case ncclInt32: { int32_t x = (int32_t)v; memcpy(p, &x, 4); break; }
    case ncclUint32: { uint32_t x = (uint32_t)v; memcpy(p, &x, 4); break; }
    case ncclInt64: { int64_t x = (int64_t)v; memcpy(p, &x, 8); break; }
    case ncclUint64: { uint64_t x = (uint64_t)v; memcpy(p, &x, 8); break; }
    case ncclFloat16: { uint16_t x = to_half(v); memcpy(p, &x, 2); break; }
    case ncclBfloat16: { uint16_t x = to_bf16(v); memcpy(p, &x, 2); break; }
    case ncclFloat32: { float x = (float)v; memcpy(p, &x, 4); break; }
    default: { double x = v; memcpy(p, &x, 8); break; }
    }
}

static double get(const void *buf, ncclDataType_t dt, size_t i)
{
    const char *p = (const char *)buf + i * dt_size(dt);
    switch (dt) {
    case ncclInt8: { int8_t x; memcpy(&x, p, 1); return x; }
    case ncclUint8: { uint8_t x; memcpy(&x, p, 1); return x; }
    case ncclInt32: { int32_t x; memcpy(&x, p, 4); return x; }
    case ncclUint32: { uint32_t x; memcpy(&x, p, 4); return x; }
    case ncclInt64: { int64_t x; memcpy(&x, p, 8); return (double)x; }
    case ncclUint64: { uint64_t x; memcpy(&x, p, 8); return (double)x; }
    case ncclFloat16: { uint16_t x; memcpy(&x, p, 2); return from_half(x); }
    case ncclBfloat16: { uint16_t x; memcpy(&x, p, 2); return from_bf16(x); }
    case ncclFloat32: { float x; memcpy(&x, p, 4); return x; }
    default: { double x; memcpy(&x, p, 8); return x; }
    }
}

static int is_int(ncclDataType_t dt)
{
    return dt <= ncclUint64;
}

/* Rank r's element i: 1..3, so a product of 4 ranks fits an int8. */
static double val(int r, size_t i)
{
    return (double)((r + (int)(i % 5)) % 3 + 1);
}

static double reduce_ref(ncclRedOp_t op, ncclDataType_t dt, size_t i, int n)
{
    double acc = val(0, i);
    for (int r = 1; r < n; r++) {
        double v = val(r, i);
        switch (op) {
        case ncclSum: case ncclAvg: acc += v; break;
        case ncclProd: acc *= v; break;
        case ncclMax: acc = v > acc ? v : acc; break;
        default: acc = v < acc ? v : acc; break;
        }
    }
    if (op == ncclAvg) acc = is_int(dt) ? floor(acc / n) : acc / n;
    return acc;
}

static int close_to(double got, double want, ncclDataType_t dt)
{
    double tol = dt == ncclFloat16 || dt == ncclBfloat16 ? 0.02 * fabs(want) + 1e-3 : 1e-6;
    return fabs(got - want) <= tol;
}

static void *xmalloc(size_t n)
{
    void *p = calloc(1, n ? n : 1);
    if (!p) {
        printf("FAIL: out of memory\n");
        exit(1);
    }
    return p;
}

/* ---------------------------------------------------------------- checks */

static void check_allreduce(ncclComm_t comm, size_t count)
{
    static const ncclRedOp_t ops[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};
    int bad_total = 0;
    for (int d = 0; d < ncclNumTypes; d++) {
        ncclDataType_t dt = (ncclDataType_t)d;
        size_t es = dt_size(dt);
        char *send = xmalloc(count * es), *recv = xmalloc(count * es);
        for (int o = 0; o < 5; o++) {
            for (int inplace = 0; inplace < 2; inplace++) {
                for (size_t i = 0; i < count; i++) put(send, dt, i, val(g_rank, i));
                void *out = inplace ? send : recv;
                NCCLCHECK(ncclAllReduce(send, out, count, dt, ops[o], comm, NULL));
                int bad = 0;
                for (size_t i = 0; i < count; i++)
                    if (!close_to(get(out, dt, i), reduce_ref(ops[o], dt, i, g_n), dt)) {
                        if (!bad)
                            printf("FAIL rank %d: allreduce dt %d op %d%s [%zu] = %g, want %g\n",
                                   g_rank, d, o, inplace ? " in place" : "", i, get(out, dt, i),
                                   reduce_ref(ops[o], dt, i, g_n));
                        bad++;
                    }
                bad_total += bad != 0;
            }
        }
        free(send);
        free(recv);
    }
    expect(bad_total == 0, "allreduce: every datatype x op, in and out of place");
    if (g_rank == 0 && !bad_total)
        printf("ok   allreduce of %zu elements: 10 datatypes x 5 ops x 2 placements\n", count);
}

static void check_rooted(ncclComm_t comm, size_t count)
{
    int root = g_n - 1, bad = 0;
    float *a = xmalloc(count * 4), *b = xmalloc(count * 4);
    /* Broadcast, out of place, from the last rank. */
    for (size_t i = 0; i < count; i++) a[i] = g_rank == root ? (float)val(root, i) + 10 : -1;
    NCCLCHECK(ncclBroadcast(a, b, count, ncclFloat, root, comm, NULL));
    for (size_t i = 0; i < count; i++) bad += b[i] != (float)val(root, i) + 10;
    /* Bcast, in place, from rank 0. */
    for (size_t i = 0; i < count; i++) a[i] = g_rank == 0 ? (float)i : -1;
    NCCLCHECK(ncclBcast(a, count, ncclFloat, 0, comm, NULL));
    for (size_t i = 0; i < count; i++) bad += a[i] != (float)i;
    expect(bad == 0, "broadcast and bcast");
    /* Reduce to rank 1 % n, out of place, then in place. */
    int rroot = 1 % g_n;
    bad = 0;
    for (int inplace = 0; inplace < 2; inplace++) {
        for (size_t i = 0; i < count; i++) a[i] = (float)val(g_rank, i), b[i] = -1;
        float *out = inplace ? a : b;
        NCCLCHECK(ncclReduce(a, out, count, ncclFloat, ncclMax, rroot, comm, NULL));
        if (g_rank == rroot)
            for (size_t i = 0; i < count; i++)
                bad += out[i] != (float)reduce_ref(ncclMax, ncclFloat, i, g_n);
    }
    expect(bad == 0, "reduce (max) to one root, in and out of place");
    free(a);
    free(b);
    if (g_rank == 0) printf("ok   broadcast, bcast, reduce of %zu floats\n", count);
}

static void check_gather_scatter(ncclComm_t comm, size_t count)
{
    size_t n = (size_t)g_n;
    int64_t *all = xmalloc(n * count * 8), *mine = xmalloc(count * 8);
    int bad = 0;
    /* AllGather out of place, then in place (send = recv + rank * count). */
    for (int inplace = 0; inplace < 2; inplace++) {
        memset(all, 0xff, n * count * 8);
        int64_t *src = inplace ? all + (size_t)g_rank * count : mine;
        for (size_t i = 0; i < count; i++) src[i] = (int64_t)g_rank * 1000000 + (int64_t)i;
        NCCLCHECK(ncclAllGather(src, all, count, ncclInt64, comm, NULL));
        for (size_t r = 0; r < n; r++)
            for (size_t i = 0; i < count; i++) bad += all[r * count + i] != (int64_t)r * 1000000 + (int64_t)i;
    }
    expect(bad == 0, "allgather, in and out of place");
    /* ReduceScatter (sum) out of place, then in place (recv = send + rank * count). */
    bad = 0;
    for (int inplace = 0; inplace < 2; inplace++) {
        for (size_t j = 0; j < n * count; j++) all[j] = (int64_t)(g_rank + 1) * (int64_t)j;
        int64_t *dst = inplace ? all + (size_t)g_rank * count : mine;
        NCCLCHECK(ncclReduceScatter(all, dst, count, ncclInt64, ncclSum, comm, NULL));
        int64_t w = (int64_t)(n * (n + 1) / 2);
        for (size_t i = 0; i < count; i++) bad += dst[i] != w * (int64_t)((size_t)g_rank * count + i);
    }
    expect(bad == 0, "reducescatter, in and out of place");
    free(all);
    free(mine);
    if (g_rank == 0) printf("ok   allgather, reducescatter of %zu int64 per rank\n", count);
}

static void check_p2p(ncclComm_t comm, size_t count)
{
    int next = (g_rank + 1) % g_n, prev = (g_rank + g_n - 1) % g_n, bad = 0;
    int32_t *s = xmalloc(count * 4), *r = xmalloc(count * 4), *s2 = xmalloc(count * 4),
            *r2 = xmalloc(count * 4);
    for (size_t i = 0; i < count; i++) s[i] = g_rank * 7 + (int32_t)i, r[i] = -1;
    /* A ring exchange: every rank receives first, then sends, in a group. */
    NCCLCHECK(ncclGroupStart());
    NCCLCHECK(ncclRecv(r, count, ncclInt32, prev, comm, NULL));
    NCCLCHECK(ncclSend(s, count, ncclInt32, next, comm, NULL));
    NCCLCHECK(ncclGroupEnd());
    for (size_t i = 0; i < count; i++) bad += r[i] != prev * 7 + (int32_t)i;
    expect(bad == 0, "ring exchange (send/recv in a group)");
    /* Nested groups, both directions, plus a collective in the same group. */
    bad = 0;
    float f = (float)g_rank, fsum = -1;
    for (size_t i = 0; i < count; i++) s2[i] = -g_rank - (int32_t)i, r[i] = r2[i] = 0;
    NCCLCHECK(ncclGroupStart());
    NCCLCHECK(ncclSend(s, count, ncclInt32, next, comm, NULL));
    NCCLCHECK(ncclGroupStart());
    NCCLCHECK(ncclSend(s2, count, ncclInt32, prev, comm, NULL));
    NCCLCHECK(ncclRecv(r2, count, ncclInt32, next, comm, NULL));
    NCCLCHECK(ncclGroupEnd());
    NCCLCHECK(ncclRecv(r, count, ncclInt32, prev, comm, NULL));
    NCCLCHECK(ncclAllReduce(&f, &fsum, 1, ncclFloat, ncclSum, comm, NULL));
    NCCLCHECK(ncclGroupEnd());
    /* Messages between two ranks match in posting order: with 2 ranks
     * next == prev, so r2 (posted first) takes the peer's first send. */
    for (size_t i = 0; i < count; i++) {
        if (next != prev)
            bad += r[i] != prev * 7 + (int32_t)i || r2[i] != -next - (int32_t)i;
        else
            bad += r2[i] != prev * 7 + (int32_t)i || r[i] != -prev - (int32_t)i;
    }
    bad += fsum != (float)(g_n * (g_n - 1) / 2);
    expect(bad == 0, "nested groups: both ring directions and an allreduce");
    /* Send to self in a group. */
    for (size_t i = 0; i < count; i++) r[i] = 0;
    NCCLCHECK(ncclGroupStart());
    NCCLCHECK(ncclSend(s, count, ncclInt32, g_rank, comm, NULL));
    NCCLCHECK(ncclRecv(r, count, ncclInt32, g_rank, comm, NULL));
    NCCLCHECK(ncclGroupEnd());
    expect(memcmp(r, s, count * 4) == 0, "send to self in a group");
    free(s);
    free(r);
    free(s2);
    free(r2);
    if (g_rank == 0) printf("ok   send/recv: ring, nested groups, self\n");
}

static void check_premulsum(ncclComm_t comm, size_t count)
{
    static const ncclDataType_t dts[] = {ncclFloat32, ncclFloat64, ncclInt32, ncclUint8,
                                         ncclFloat16, ncclBfloat16, ncclInt64};
    int bad = 0;
    for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
        ncclDataType_t dt = dts[d];
        size_t es = dt_size(dt);
        char scalar[8];
        put(scalar, dt, 0, g_rank + 1); /* each rank its own scalar */
        ncclRedOp_t op;
        NCCLCHECK(ncclRedOpCreatePreMulSum(&op, scalar, dt, ncclScalarHostImmediate, comm));
        expect(op >= ncclNumOps, "PreMulSum op lies past the built-in ops");
        size_t n = (size_t)g_n;
        char *in = xmalloc(n * count * es), *out = xmalloc(n * count * es);
        for (size_t i = 0; i < n * count; i++) put(in, dt, i, val(g_rank, i));
        NCCLCHECK(ncclAllReduce(in, out, count, dt, op, comm, NULL));
        for (size_t i = 0; i < count; i++) {
            double w = 0;
            for (int r = 0; r < g_n; r++) w += (r + 1) * val(r, i);
            if (!close_to(get(out, dt, i), w, dt)) {
                if (!bad) printf("FAIL rank %d: premulsum dt %d [%zu] = %g, want %g\n", g_rank,
                                 (int)dt, i, get(out, dt, i), w);
                bad++;
            }
        }
        for (size_t i = 0; i < count; i++) { /* the input is left as it was */
            if (get(in, dt, i) != val(g_rank, i)) bad++;
        }
        /* Reduce-scatter and reduce with it too, in a group. */
        char *rs = xmalloc(count * es), *red = xmalloc(count * es);
        NCCLCHECK(ncclGroupStart());
        NCCLCHECK(ncclReduceScatter(in, rs, count, dt, op, comm, NULL));
        NCCLCHECK(ncclReduce(in, red, count, dt, op, 0, comm, NULL));
        NCCLCHECK(ncclGroupEnd());
        for (size_t i = 0; i < count; i++) {
            size_t j = (size_t)g_rank * count + i;
            double w = 0, w0 = 0;
            for (int r = 0; r < g_n; r++) w += (r + 1) * val(r, j), w0 += (r + 1) * val(r, i);
            if (!close_to(get(rs, dt, i), w, dt)) bad++;
            if (g_rank == 0 && !close_to(get(red, dt, i), w0, dt)) bad++;
        }
        NCCLCHECK(ncclRedOpDestroy(op, comm));
        expect_err(ncclAllReduce(in, out, count, dt, op, comm, NULL), ncclInvalidArgument,
                   "ncclRedOpCreatePreMulSum", "a destroyed PreMulSum op is refused");
        free(in);
        free(out);
        free(rs);
        free(red);
    }
    expect(bad == 0, "PreMulSum: allreduce, reducescatter, reduce = sum of scalar_r * x_r");
    if (g_rank == 0 && !bad) printf("ok   PreMulSum over 7 datatypes, per-rank scalars\n");
    float s = 2;
    ncclRedOp_t op;
    expect_err(ncclRedOpCreatePreMulSum(&op, &s, ncclFloat, ncclScalarDevice, comm),
               ncclInvalidUsage, "ncclScalarDevice", "a device-resident scalar is refused");
    NCCLCHECK(ncclRedOpCreatePreMulSum(&op, &s, ncclFloat, ncclScalarHostImmediate, comm));
    double dbuf[4] = {1, 2, 3, 4};
    expect_err(ncclAllReduce(dbuf, dbuf, 4, ncclDouble, op, comm, NULL), ncclInvalidArgument,
               "datatype", "a PreMulSum op used with another datatype is refused");
    NCCLCHECK(ncclRedOpDestroy(op, comm));
}

static void check_errors(ncclComm_t comm, ncclUniqueId id)
{
    float a[8] = {0}, b[8];
    expect_err(ncclAllReduce(a, b, 8, (ncclDataType_t)42, ncclSum, comm, NULL),
               ncclInvalidArgument, "datatype 42", "a bad datatype is refused");
    expect_err(ncclAllReduce(a, b, 8, ncclFloat, (ncclRedOp_t)77, comm, NULL),
               ncclInvalidArgument, "op 77", "a bad op is refused");
    expect_err(ncclAllReduce(a, b, 8, ncclFloat, ncclSum, NULL, NULL), ncclInvalidArgument,
               "comm is NULL", "a NULL comm is refused");
    {
        /* No driver: refused (ncclInvalidUsage); a driver that does not
         * know the stream: its error (ncclUnhandledCudaError). */
        ncclResult_t r = ncclAllReduce(a, b, 8, ncclFloat, ncclSum, comm,
                                       (cudaStream_t)(uintptr_t)0x10);
        const char *msg = ncclGetLastError(NULL);
        int ok = (r == ncclInvalidUsage && strstr(msg, "no CUDA driver") &&
                  strstr(msg, "stream")) ||
                 (r == ncclUnhandledCudaError && strstr(msg, "cuStreamSynchronize"));
        if (!ok) printf("FAIL rank %d: bogus stream: got %d, \"%s\"\n", g_rank, (int)r, msg);
        if (ok && g_rank == 0) printf("ok   a stream no driver can synchronise: %s\n", msg);
        expect(ok, "a stream no driver can synchronise is refused");
    }
    expect_err(ncclBroadcast(a, b, 8, ncclFloat, g_n, comm, NULL), ncclInvalidArgument, "root",
               "a root out of range is refused");
    expect_err(ncclSend(a, 8, ncclFloat, g_n + 3, comm, NULL), ncclInvalidArgument, "peer",
               "a peer out of range is refused");
    expect_err(ncclAllReduce(NULL, b, 8, ncclFloat, ncclSum, comm, NULL), ncclInvalidArgument,
               "sendbuf", "a NULL buffer is refused");
    expect_err(ncclGroupEnd(), ncclInvalidUsage, "ncclGroupStart",
               "ncclGroupEnd without ncclGroupStart is refused");
    /* ncclCommSplit: even and odd ranks, keys reversing the order; the
     * last rank (with more than 2) stays out with NCCL_SPLIT_NOCOLOR. */
    ncclComm_t sub = (ncclComm_t)1;
    const int out = g_n > 2 && g_rank == g_n - 1;
    NCCLCHECK(ncclCommSplit(comm, out ? NCCL_SPLIT_NOCOLOR : g_rank % 2, g_n - g_rank, &sub,
                            NULL));
    if (out) {
        expect(sub == NULL, "ncclCommSplit with NCCL_SPLIT_NOCOLOR gives NULL");
    } else {
        int members = 0, below = 0, srank = -1, scount = -1;
        for (int q = 0; q < g_n; q++) {
            if (q % 2 != g_rank % 2 || (g_n > 2 && q == g_n - 1)) continue;
            members++;
            below += q > g_rank; /* a larger key ranks first */
        }
        NCCLCHECK(ncclCommUserRank(sub, &srank));
        NCCLCHECK(ncclCommCount(sub, &scount));
        expect(scount == members && srank == below,
               "ncclCommSplit orders its members by key (rank and count)");
        int mine = g_rank + 1, sum = 0, want = 0;
        for (int q = 0; q < g_n; q++)
            if (q % 2 == g_rank % 2 && !(g_n > 2 && q == g_n - 1)) want += q + 1;
        NCCLCHECK(ncclAllReduce(&mine, &sum, 1, ncclInt32, ncclSum, sub, NULL));
        expect(sum == want, "an allreduce on a split communicator sums its members only");
        NCCLCHECK(ncclCommDestroy(sub));
    }
    int unit = 1, all = 0;
    NCCLCHECK(ncclAllReduce(&unit, &all, 1, ncclInt32, ncclSum, comm, NULL));
    expect(all == g_n, "the parent works after a split");
    sub = (ncclComm_t)1;
    expect_err(ncclCommSplit(comm, -5, 0, &sub, NULL), ncclInvalidArgument, "color -5",
               "a negative color other than NCCL_SPLIT_NOCOLOR is refused");
    NCCLCHECK(ncclGroupStart());
    expect_err(ncclCommSplit(comm, 0, 0, &sub, NULL), ncclInvalidUsage, "ncclGroupStart",
               "ncclCommSplit inside a group is refused");
    expect(ncclGroupEnd() == ncclInvalidUsage, "that group's ncclGroupEnd reports it");
    expect(sub == NULL, "a refused ncclCommSplit leaves *newcomm NULL");
    ncclConfig_t bad = NCCL_CONFIG_INITIALIZER;
    bad.magic = 0;
    ncclComm_t c2 = (ncclComm_t)1;
    expect_err(ncclCommInitRankConfig(&c2, g_n, id, g_rank, &bad), ncclInvalidArgument,
               "NCCL_CONFIG_INITIALIZER", "a config without NCCL_CONFIG_INITIALIZER is refused");
    ncclConfig_t net = NCCL_CONFIG_INITIALIZER;
    net.netName = "Carrier-pigeon";
    expect_err(ncclCommInitRankConfig(&c2, g_n, id, g_rank, &net), ncclInvalidArgument,
               "netName", "an unknown netName is refused");
    /* An error inside a group is returned by ncclGroupEnd as well. */
    NCCLCHECK(ncclGroupStart());
    ncclResult_t in = ncclAllReduce(a, b, 8, (ncclDataType_t)-1, ncclSum, comm, NULL);
    ncclResult_t end = ncclGroupEnd();
    expect(in == ncclInvalidArgument && end == ncclInvalidArgument,
           "an error inside a group is returned by ncclGroupEnd too");
    expect(strcmp(ncclGetErrorString(ncclInvalidUsage), "") != 0 &&
               strcmp(ncclGetErrorString(ncclSuccess), "no error") == 0,
           "ncclGetErrorString");
    ncclResult_t ae = ncclInternalError;
    NCCLCHECK(ncclCommGetAsyncError(comm, &ae));
    expect(ae == ncclSuccess, "no async error on a healthy comm after refused calls");
    /* The comm still works after every refusal. */
    float one = 1, sum = 0;
    NCCLCHECK(ncclAllReduce(&one, &sum, 1, ncclFloat, ncclSum, comm, NULL));
    expect(sum == (float)g_n, "the comm works after the refused calls");
}

static void check_memory(ncclComm_t comm, size_t count)
{
    float *buf = NULL;
    NCCLCHECK(ncclMemAlloc((void **)&buf, count * sizeof(float)));
    void *h = NULL;
    NCCLCHECK(ncclCommRegister(comm, buf, count * sizeof(float), &h));
    for (size_t i = 0; i < count; i++) buf[i] = (float)(g_rank + 1);
    NCCLCHECK(ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, comm, NULL));
    int bad = 0;
    for (size_t i = 0; i < count; i++) bad += buf[i] != (float)(g_n * (g_n + 1) / 2);
    NCCLCHECK(ncclCommDeregister(comm, h));
    NCCLCHECK(ncclMemFree(buf));
    expect(bad == 0, "MemAlloc + CommRegister: allreduce in registered memory");
    if (g_rank == 0 && !bad) printf("ok   ncclMemAlloc, ncclCommRegister/Deregister\n");
}

static int mode_run(const char *idfile)
{
    int v = 0;
    NCCLCHECK(ncclGetVersion(&v));
    expect(v == NCCL_VERSION_CODE && v >= 21900, "ncclGetVersion reports the header's version");
    ncclUniqueId id;
    get_id(idfile, &id);
    /* As nccl-tests does: the init inside a group. */
    ncclComm_t comm = NULL;
    NCCLCHECK(ncclGroupStart());
    NCCLCHECK(ncclCommInitRank(&comm, g_n, id, g_rank));
    NCCLCHECK(ncclGroupEnd());
    int cnt = -1, rk = -1, dev = -1;
    NCCLCHECK(ncclCommCount(comm, &cnt));
    NCCLCHECK(ncclCommUserRank(comm, &rk));
    NCCLCHECK(ncclCommCuDevice(comm, &dev));
    expect(cnt == g_n && rk == g_rank && dev == 0, "ncclCommCount, UserRank, CuDevice");
    if (g_rank == 0) printf("ok   init in a group: version %d, %d ranks\n", v, cnt);

    check_allreduce(comm, 1031);
    check_allreduce(comm, 1);
    {   /* a large one, past the small-message paths */
        size_t big = 1 << 18;
        float *x = xmalloc(big * 4);
        for (size_t i = 0; i < big; i++) x[i] = (float)(g_rank + (int)(i % 13));
        NCCLCHECK(ncclAllReduce(x, x, big, ncclFloat, ncclSum, comm, NULL));
        int bad = 0;
        for (size_t i = 0; i < big; i++)
            bad += x[i] != (float)(g_n * (g_n - 1) / 2 + g_n * (int)(i % 13));
        expect(bad == 0, "allreduce of 1 MiB in place");
        free(x);
    }
    {   /* count 0 is a no-op */
        float z = 5;
        NCCLCHECK(ncclAllReduce(&z, &z, 0, ncclFloat, ncclSum, comm, NULL));
        expect(z == 5, "allreduce of count 0 leaves the buffer");
    }
    check_rooted(comm, 777);
    check_gather_scatter(comm, 333);
    check_p2p(comm, 4099);
    check_premulsum(comm, 257);
    check_errors(comm, id);
    check_memory(comm, 10000);

    NCCLCHECK(ncclCommFinalize(comm));
    float f = 1;
    expect_err(ncclAllReduce(&f, &f, 1, ncclFloat, ncclSum, comm, NULL), ncclInvalidUsage,
               "finalized", "an operation after ncclCommFinalize is refused");
    NCCLCHECK(ncclCommDestroy(comm));
    int c = 0;
    expect_err(ncclCommCount(comm, &c), ncclInvalidArgument, "destroyed",
               "a destroyed comm is refused");
    printf("rank %d of %d: %d passed, %d failed\n", g_rank, g_n, g_pass, g_fail);
    return g_fail ? 1 : 0;
}

/* Ranks pass different counts: every rank gets an error, none hangs. */
static int mode_mismatch(const char *idfile)
{
    ncclUniqueId id;
    get_id(idfile, &id);
    ncclComm_t comm;
    NCCLCHECK(ncclCommInitRank(&comm, g_n, id, g_rank));
    size_t count = g_rank == 0 ? 1000 : 1001;
    float *a = xmalloc(1001 * 4);
    /* One matching call first: every rank has finished its init. */
    NCCLCHECK(ncclAllReduce(a, a, 1, ncclFloat, ncclSum, comm, NULL));
    double t0 = now();
    ncclResult_t r = ncclAllReduce(a, a, count, ncclFloat, ncclSum, comm, NULL);
    double t1 = now();
    printf("rank %d: mismatched allreduce: %s after %.2f s: %s\n", g_rank, ncclGetErrorString(r),
           t1 - t0, ncclGetLastError(NULL));
    expect(r == ncclInvalidUsage, "mismatched counts fail with ncclInvalidUsage");
    expect(strstr(ncclGetLastError(NULL), "1000") && strstr(ncclGetLastError(NULL), "1001"),
           "the message names both counts");
    ncclResult_t ae = ncclSuccess;
    NCCLCHECK(ncclCommGetAsyncError(comm, &ae));
    expect(ae != ncclSuccess, "ncclCommGetAsyncError reports the broken comm");
    printf("rank %d: async error %s\n", g_rank, ncclGetErrorString(ae));
    t0 = now();
    NCCLCHECK(ncclCommAbort(comm));
    t1 = now();
    expect(t1 - t0 < 5, "ncclCommAbort returns at once");
    printf("rank %d: abort took %.3f s\n", g_rank, t1 - t0);
    printf("rank %d of %d: %d passed, %d failed\n", g_rank, g_n, g_pass, g_fail);
    free(a);
    return g_fail ? 1 : 0;
}

/* The last rank dies: the others' next call fails with ncclRemoteError,
 * ncclCommGetAsyncError reports it, ncclCommAbort returns at once. */
static int mode_kill(const char *idfile)
{
    ncclUniqueId id;
    get_id(idfile, &id);
    ncclComm_t comm;
    NCCLCHECK(ncclCommInitRank(&comm, g_n, id, g_rank));
    size_t count = 1 << 16;
    float *a = xmalloc(count * 4);
    NCCLCHECK(ncclAllReduce(a, a, count, ncclFloat, ncclSum, comm, NULL));
    if (g_rank == g_n - 1) { /* dies without a word, once the others are done */
        nanosleep(&(struct timespec){0, 300000000}, NULL);
        _exit(3);
    }
    double t0 = now();
    ncclResult_t r = ncclSuccess;
    for (int i = 0; i < 1000 && r == ncclSuccess; i++)
        r = ncclAllReduce(a, a, count, ncclFloat, ncclSum, comm, NULL);
    double t1 = now();
    printf("rank %d: allreduce after the death: %s after %.2f s: %s\n", g_rank,
           ncclGetErrorString(r), t1 - t0, ncclGetLastError(NULL));
    expect(r == ncclRemoteError, "the dead peer's communicator fails with ncclRemoteError");
    ncclResult_t ae = ncclSuccess;
    NCCLCHECK(ncclCommGetAsyncError(comm, &ae));
    printf("rank %d: async error %s: %s\n", g_rank, ncclGetErrorString(ae), ncclGetLastError(NULL));
    expect(ae == ncclRemoteError, "ncclCommGetAsyncError reports ncclRemoteError");
    t0 = now();
    NCCLCHECK(ncclCommAbort(comm));
    t1 = now();
    printf("rank %d: abort took %.3f s\n", g_rank, t1 - t0);
    expect(t1 - t0 < 5, "ncclCommAbort returns at once");
    printf("rank %d of %d: %d passed, %d failed\n", g_rank, g_n, g_pass, g_fail);
    free(a);
    return g_fail ? 1 : 0;
}

/* ncclCommAbort from a watchdog thread while the main thread waits in a
 * call (rank 1 comes 2 s late): refused at once, as Loom cannot
 * interrupt the call; once it returns, the abort goes through. */
struct busy {
    ncclComm_t comm;
    float *buf;
    ncclResult_t r;
};

static void *busy_main(void *arg)
{
    struct busy *b = arg;
    b->r = ncclAllReduce(b->buf, b->buf, 1024, ncclFloat, ncclSum, b->comm, NULL);
    return NULL;
}

static int mode_abortbusy(const char *idfile)
{
    ncclUniqueId id;
    get_id(idfile, &id);
    ncclComm_t comm;
    NCCLCHECK(ncclCommInitRank(&comm, g_n, id, g_rank));
    struct busy b = {comm, xmalloc(1024 * 4), ncclInternalError};
    if (g_rank != 0) {
        nanosleep(&(struct timespec){2, 0}, NULL);
        NCCLCHECK(ncclAllReduce(b.buf, b.buf, 1024, ncclFloat, ncclSum, comm, NULL));
        ncclCommDestroy(comm); /* rank 0 may have aborted by now */
        printf("rank %d of %d (abortbusy): %d passed, %d failed\n", g_rank, g_n, g_pass, g_fail);
        free(b.buf);
        return g_fail ? 1 : 0;
    }
    pthread_t th;
    if (pthread_create(&th, NULL, busy_main, &b) != 0) return 1;
    nanosleep(&(struct timespec){0, 300000000}, NULL);
    double t0 = now();
    expect_err(ncclCommAbort(comm), ncclInvalidUsage, "under way",
               "ncclCommAbort while another thread waits in a call is refused");
    expect_err(ncclCommDestroy(comm), ncclInvalidUsage, "under way",
               "so is ncclCommDestroy");
    expect(now() - t0 < 1, "... at once");
    pthread_join(th, NULL);
    expect(b.r == ncclSuccess && b.buf[0] == 0, "the waiting call completes");
    NCCLCHECK(ncclCommAbort(comm));
    printf("rank %d of %d (abortbusy): %d passed, %d failed\n", g_rank, g_n, g_pass, g_fail);
    free(b.buf);
    return g_fail ? 1 : 0;
}

/* Two ranks in each process, created in one group by one thread (as
 * nccl-tests -g 2 does), then driven together: ranks 2p and 2p+1 here. */
static int mode_pair(const char *idfile)
{
    ncclUniqueId id;
    get_id(idfile, &id);
    int n = 2 * g_n;
    ncclComm_t c[2];
    /* With a config: TCP between hosts, and non-blocking (which a
     * library that completes every call may ignore). */
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.netName = "Socket";
    cfg.blocking = 0;
    NCCLCHECK(ncclGroupStart());
    for (int k = 0; k < 2; k++)
        NCCLCHECK(ncclCommInitRankConfig(&c[k], n, id, 2 * g_rank + k, &cfg));
    NCCLCHECK(ncclGroupEnd());
    for (int k = 0; k < 2; k++) { /* a non-blocking user polls */
        ncclResult_t st = ncclInProgress;
        NCCLCHECK(ncclCommGetAsyncError(c[k], &st));
        expect(st == ncclSuccess, "the comm is ready after ncclGroupEnd");
    }
    size_t count = 5000;
    double *buf[2], *in[2];
    int bad = 0;
    for (int k = 0; k < 2; k++) {
        int r = -1;
        NCCLCHECK(ncclCommUserRank(c[k], &r));
        bad += r != 2 * g_rank + k;
        buf[k] = xmalloc(count * 8);
        in[k] = xmalloc(count * 8);
        for (size_t i = 0; i < count; i++) buf[k][i] = (double)(r + 1) * (double)i;
    }
    expect(bad == 0, "two ranks per process: their ranks");
    NCCLCHECK(ncclGroupStart());
    for (int k = 0; k < 2; k++)
        NCCLCHECK(ncclAllReduce(buf[k], buf[k], count, ncclDouble, ncclSum, c[k], NULL));
    NCCLCHECK(ncclGroupEnd());
    bad = 0;
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < count; i++) bad += buf[k][i] != (double)(n * (n + 1) / 2) * (double)i;
    expect(bad == 0, "two ranks per process: an allreduce on both in one group");
    NCCLCHECK(ncclGroupStart());
    for (int k = 0; k < 2; k++) {
        int r = 2 * g_rank + k;
        NCCLCHECK(ncclSend(buf[k], count, ncclDouble, (r + 1) % n, c[k], NULL));
        NCCLCHECK(ncclRecv(in[k], count, ncclDouble, (r + n - 1) % n, c[k], NULL));
    }
    NCCLCHECK(ncclGroupEnd());
    bad = 0;
    for (int k = 0; k < 2; k++)
        bad += memcmp(in[k], buf[k], count * 8) != 0; /* every rank holds the same sums */
    expect(bad == 0, "two ranks per process: a ring of send/recv");
    double t0 = now();
    for (int k = 0; k < 2; k++) {
        NCCLCHECK(ncclCommDestroy(c[k]));
        free(buf[k]);
        free(in[k]);
    }
    expect(now() - t0 < 5, "destroying both ranks, one after the other, is prompt");
    printf("rank %d of %d (pair): %d passed, %d failed\n", g_rank, g_n, g_pass, g_fail);
    return g_fail ? 1 : 0;
}

/* Several ranks in one process, driven from one thread. */
static int mode_initall(int ndev)
{
    ncclComm_t comms[8];
    int devs[8];
    if (ndev < 0 || ndev > 8) return 2;
    if (ndev == 0) { /* refused, with the reason under NCCL_DEBUG=WARN */
        ncclResult_t r = ncclCommInitAll(comms, 0, devs);
        printf("ncclCommInitAll(ndev 0): %s\n", ncclGetErrorString(r));
        return r == ncclInvalidArgument ? 0 : 1;
    }
    for (int i = 0; i < ndev; i++) devs[i] = 10 + i;
    NCCLCHECK(ncclCommInitAll(comms, ndev, devs));
    size_t count = 4096;
    float *buf[8];
    int bad = 0;
    for (int i = 0; i < ndev; i++) {
        int c, r, d;
        NCCLCHECK(ncclCommCount(comms[i], &c));
        NCCLCHECK(ncclCommUserRank(comms[i], &r));
        NCCLCHECK(ncclCommCuDevice(comms[i], &d));
        bad += c != ndev || r != i || d != 10 + i;
        buf[i] = xmalloc(count * 4);
        for (size_t j = 0; j < count; j++) buf[i][j] = (float)(i + 1) * (float)(j % 10);
    }
    expect(bad == 0, "ncclCommInitAll: count, rank and device of each comm");
    NCCLCHECK(ncclGroupStart());
    for (int i = 0; i < ndev; i++)
        NCCLCHECK(ncclAllReduce(buf[i], buf[i], count, ncclFloat, ncclSum, comms[i], NULL));
    NCCLCHECK(ncclGroupEnd());
    bad = 0;
    for (int i = 0; i < ndev; i++)
        for (size_t j = 0; j < count; j++)
            bad += buf[i][j] != (float)(ndev * (ndev + 1) / 2) * (float)(j % 10);
    expect(bad == 0, "one thread, one group: an allreduce on every comm");
    /* A ring among the comms, from the same thread. */
    float *out[8];
    for (int i = 0; i < ndev; i++) out[i] = xmalloc(count * 4);
    NCCLCHECK(ncclGroupStart());
    for (int i = 0; i < ndev; i++) {
        NCCLCHECK(ncclSend(buf[i], count, ncclFloat, (i + 1) % ndev, comms[i], NULL));
        NCCLCHECK(ncclRecv(out[i], count, ncclFloat, (i + ndev - 1) % ndev, comms[i], NULL));
    }
    NCCLCHECK(ncclGroupEnd());
    bad = 0;
    for (int i = 0; i < ndev; i++) bad += memcmp(out[i], buf[(i + ndev - 1) % ndev], count * 4) != 0;
    expect(bad == 0, "one thread, one group: a ring of send/recv among the comms");
    for (int i = 0; i < ndev; i++) {
        NCCLCHECK(ncclCommDestroy(comms[i]));
        free(buf[i]);
        free(out[i]);
    }
    printf("initall %d ranks in one process: %d passed, %d failed\n", ndev, g_pass, g_fail);
    return g_fail ? 1 : 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 3 && !strcmp(argv[1], "initall")) return mode_initall(atoi(argv[2]));
    if (argc != 5) {
        fprintf(stderr, "usage: %s run|mismatch|kill|pair|abortbusy RANK NRANKS IDFILE | initall NDEV\n", argv[0]);
        return 2;
    }
    g_rank = atoi(argv[2]);
    g_n = atoi(argv[3]);
    if (!strcmp(argv[1], "run")) return mode_run(argv[4]);
    if (!strcmp(argv[1], "mismatch")) return mode_mismatch(argv[4]);
    if (!strcmp(argv[1], "kill")) return mode_kill(argv[4]);
    if (!strcmp(argv[1], "pair")) return mode_pair(argv[4]);
    if (!strcmp(argv[1], "abortbusy")) return mode_abortbusy(argv[4]);
    return 2;
}
