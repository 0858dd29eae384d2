/*
 * mp_devbuf.c - collectives on CUDA device buffers, staged through host
 * memory, across real ranks, with tests/gpu/cuda_fake.c standing in for
 * libcuda.so.1 (test_devbuf.sh).  Every collective, with sendbuf and
 * recvbuf each host or device memory, in place and not, blocking and
 * non-blocking (loom_wait, a loom_test loop, loom_wait_all), must give
 * exactly the host result.  The input is written with cuMemcpyHtoDAsync
 * on the call's stream, which the fake carries out only when that
 * stream is synchronised: a call that reads before synchronising gets
 * the old bytes (and the fake counts a stale read).  Also: a
 * non-blocking call's result goes back at completion, not before; an
 * opts struct of the older size (no stream member) still works, on the
 * legacy stream; the staging buffers are reused and freed with the
 * communicator.
 *
 *   mp_devbuf all     run everything above
 *   mp_devbuf pipe    large calls, pipelined in chunks (run with
 *                     LOOM_CUDA_PIPELINE_CHUNK small): every datatype and
 *                     op of allreduce, broadcast, reduce, reduce_scatter
 *                     and allgather, in place and
 *                     not, blocking and not, byte for byte the host call's
 *                     result; the order of the copies and the collectives
 *                     (the fake's log) shows that they overlap; a failed
 *                     copy back leaves recvbuf as it was
 */
#include <stddef.h>
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

enum { ALLREDUCE, REDUCE, BROADCAST, REDUCE_SCATTER, ALLGATHER, ALLTOALL, ALLTOALLV, GATHER,
       SCATTER, NCOLLS };
static const char *const names[] = {"allreduce", "reduce",  "broadcast", "reduce_scatter",
                                    "allgather", "alltoall", "alltoallv", "gather", "scatter"};
enum { BLOCKING, WAIT, TEST, WAIT_ALL, NMODES };
static const char *const modes[] = {"blocking", "loom_wait", "loom_test", "loom_wait_all"};

#define C 5              /* elements per block (the large allreduces: below) */
#define SENTINEL (-7)
static int32_t S(int r, size_t i) { return r * 1000 + (int32_t)i + 1; }

/* A buffer of n int32, device memory or host; its input written on stream
 * (device: queued, carried out when the stream is synchronised). */
static void *mk(size_t n, int dev, const int32_t *init, void *stream)
{
    if (!n) return NULL;
    if (!dev) {
        int32_t *p = malloc(n * sizeof *p);
        memcpy(p, init, n * sizeof *p);
        return p;
    }
    unsigned long long d;
    if (cu_alloc(&d, n * sizeof(int32_t))) return NULL;
    if (cu_htod_async(d, init, n * sizeof(int32_t), stream)) return NULL;
    return (void *)(uintptr_t)d;
}

static void rd(int32_t *out, const void *p, size_t n, int dev)
{
    if (dev) CHECK(cu_dtoh(out, (uintptr_t)p, n * sizeof *out) == 0, "reading device memory");
    else memcpy(out, p, n * sizeof *out);
}

static void rel(void *p, int dev)
{
    if (!p) return;
    if (dev) cu_free((uintptr_t)p);
    else free(p);
}

static int has_opts(int coll)
{
    return coll == ALLREDUCE || coll == REDUCE_SCATTER || coll == ALLGATHER;
}

/* Start coll (req NULL: blocking). */
static loom_result_t call(int coll, const void *sb, void *rb, int root,
                          const loom_coll_options_t *o, loom_request_t *req, size_t *cnt)
{
    const size_t p = (size_t)nranks;
    size_t sc[64], sd[64], rc[64], rdp[64];
    for (size_t q = 0; q < p; q++) {
        sc[q] = C, sd[q] = q * C, rc[q] = C, rdp[q] = q * (C + 2);
    }
    (void)cnt;
    switch (coll) {
    case ALLREDUCE:
        return req ? loom_iallreduce_opts(sb, rb, C, LOOM_INT32, LOOM_SUM, comm, o, req)
                   : loom_allreduce_opts(sb, rb, C, LOOM_INT32, LOOM_SUM, comm, o);
    case REDUCE:
        return req ? loom_ireduce(sb, rb, C, LOOM_INT32, LOOM_SUM, root, comm, req)
                   : loom_reduce(sb, rb, C, LOOM_INT32, LOOM_SUM, root, comm);
    case BROADCAST:
        return req ? loom_ibroadcast(sb, rb, C, LOOM_INT32, root, comm, req)
                   : loom_broadcast(sb, rb, C, LOOM_INT32, root, comm);
    case REDUCE_SCATTER:
        return req ? loom_ireduce_scatter_opts(sb, rb, C, LOOM_INT32, LOOM_SUM, comm, o, req)
                   : loom_reduce_scatter_opts(sb, rb, C, LOOM_INT32, LOOM_SUM, comm, o);
    case ALLGATHER:
        return req ? loom_iallgather_opts(sb, rb, C, LOOM_INT32, comm, o, req)
                   : loom_allgather_opts(sb, rb, C, LOOM_INT32, comm, o);
    case ALLTOALL:
        return req ? loom_ialltoall(sb, rb, C, LOOM_INT32, comm, req)
                   : loom_alltoall(sb, rb, C, LOOM_INT32, comm);
    case ALLTOALLV:
        return req ? loom_ialltoallv(sb, sc, sd, rb, rc, rdp, LOOM_INT32, comm, req)
                   : loom_alltoallv(sb, sc, sd, rb, rc, rdp, LOOM_INT32, comm);
    case GATHER:
        return req ? loom_igather(sb, rb, C, LOOM_INT32, root, comm, req)
                   : loom_gather(sb, rb, C, LOOM_INT32, root, comm);
    case SCATTER:
        return req ? loom_iscatter(sb, rb, C, LOOM_INT32, root, comm, req)
                   : loom_scatter(sb, rb, C, LOOM_INT32, root, comm);
    }
    return LOOM_ERR_INTERNAL;
}

/* One run of coll.  sdev/rdev: device sendbuf/recvbuf (in place: sdev
 * names the one buffer); stream: the call's (opts collectives only;
 * old_opts: an opts struct of the size before stream, stream set in it
 * but the input queued on the legacy stream). */
static void run(int coll, int sdev, int rdev, int inplace, int mode, void *stream, int old_opts)
{
    const size_t p = (size_t)nranks;
    const int root = (int)(p - 1) - (coll % 2 == 0 ? 0 : (int)(p > 1));
    const int is_root = rank == root;
    size_t sn = 0, rn = 0, so = 0, ro = 0, big = 0;
    int ip = inplace; /* in place on this rank */
    switch (coll) {
    case ALLREDUCE: sn = rn = C; break;
    case REDUCE: sn = C, rn = is_root ? C : 0, ip &= is_root; break;
    case BROADCAST: sn = is_root ? C : 0, rn = C, ip &= is_root; break;
    case REDUCE_SCATTER: sn = p * C, rn = C, ro = (size_t)rank * C; break;
    case ALLGATHER: sn = C, rn = p * C, so = (size_t)rank * C; break;
    case ALLTOALL: sn = rn = p * C; break;
    case ALLTOALLV: sn = p * C, rn = p * (C + 2), ip = 0; break;
    case GATHER: sn = C, rn = is_root ? p * C : 0, so = (size_t)root * C, ip &= is_root; break;
    case SCATTER: sn = is_root ? p * C : 0, rn = C, ro = (size_t)root * C, ip &= is_root; break;
    }
    big = sn > rn ? sn : rn;
    int32_t *sin = malloc((big + 1) * sizeof *sin), *E = malloc((rn + 1) * sizeof *E);
    int32_t *rin = malloc((big + 1) * sizeof *rin), *got = malloc((big + 1) * sizeof *got);
    for (size_t i = 0; i < sn; i++) sin[i] = S(rank, i);
    for (size_t i = 0; i < big; i++) rin[i] = SENTINEL;
    for (size_t i = 0; i < rn; i++) {
        const size_t q = i / C, j = i % C;
        int32_t v = 0;
        switch (coll) {
        case ALLREDUCE:
        case REDUCE:
            for (int r = 0; r < nranks; r++) v += S(r, i);
            break;
        case BROADCAST: v = S(root, i); break;
        case REDUCE_SCATTER:
            for (int r = 0; r < nranks; r++) v += S(r, (size_t)rank * C + i);
            break;
        case ALLGATHER:
        case GATHER: v = S((int)q, j); break;
        case ALLTOALL: v = S((int)q, (size_t)rank * C + j); break;
        case ALLTOALLV:
            v = i % (C + 2) < C ? S((int)(i / (C + 2)), (size_t)rank * C + i % (C + 2))
                                : SENTINEL;
            break;
        case SCATTER: v = S(root, (size_t)rank * C + i); break;
        }
        E[i] = v;
    }
    void *queue_on = old_opts ? NULL : stream;
    const void *sb;
    void *rb, *sbuf = NULL, *rbuf = NULL;
    int rdev_eff = rdev;
    if (ip) {
        /* One buffer of big elements: the input at so (the recv region at
         * ro); sentinels elsewhere. */
        int32_t *init = malloc(big * sizeof *init);
        for (size_t i = 0; i < big; i++) init[i] = SENTINEL;
        memcpy(init + so, sin, sn * sizeof *sin);
        rbuf = mk(big, sdev, init, queue_on);
        rdev_eff = sdev;
        sb = (const char *)rbuf + so * sizeof(int32_t);
        rb = (char *)rbuf + ro * sizeof(int32_t);
        free(init);
    } else {
        sbuf = mk(sn, sdev, sin, queue_on);
        rbuf = mk(rn, rdev, rin, queue_on);
        sb = sbuf;
        rb = rbuf;
    }
    loom_coll_options_t o = LOOM_COLL_OPTIONS_INITIALIZER;
    o.stream = stream;
    if (old_opts) o.size = offsetof(loom_coll_options_t, stream);
    const long htod0 = fake_count("htod"), sync0 = fake_syncs(queue_on);
    const long ssync0 = stream ? fake_syncs(stream) : 0;
    const int devin = (sdev && sn) || (rdev_eff && rn);
    loom_request_t req = LOOM_REQUEST_NULL;
    char what[160];
    nruns++;
    snprintf(what, sizeof what, "%s%s send %s recv %s, %s%s%s", names[coll],
             inplace ? " in place" : "", sdev ? "device" : "host",
             (ip ? sdev : rdev) ? "device" : "host", modes[mode],
             stream ? ", on a stream" : "", old_opts ? ", older opts size" : "");
    loom_result_t r = call(coll, sb, rb, root, has_opts(coll) ? &o : NULL,
                           mode == BLOCKING ? NULL : &req, NULL);
    CHECK(r == LOOM_SUCCESS, "%s: %s (%s)", what, loom_strerror(r), loom_get_last_error());
    if (r == LOOM_SUCCESS && mode != BLOCKING) {
        /* The result goes back at completion, not before. */
        CHECK(fake_count("htod") == htod0, "%s: copied back before completion", what);
        if (mode == WAIT) r = loom_wait(&req);
        else if (mode == WAIT_ALL) r = loom_wait_all(&req, 1);
        else {
            int done = 0;
            for (int k = 0; k < 10000000 && !done && r == LOOM_SUCCESS; k++)
                r = loom_test(&req, &done);
            CHECK(done, "%s: never done", what);
        }
        CHECK(r == LOOM_SUCCESS, "%s: completion: %s (%s)", what, loom_strerror(r),
              loom_get_last_error());
    }
    if (devin) {
        CHECK(fake_syncs(queue_on) > sync0, "%s: the call's stream was not synchronised", what);
    }
    if (old_opts)
        CHECK(fake_syncs(stream) == ssync0, "%s: opts->stream read past opts->size", what);
    CHECK(fake_queued(queue_on) == 0, "%s: input still queued on the stream", what);
    if (rn && (ip ? sdev : rdev))
        CHECK(fake_count("htod") == htod0 + 1, "%s: %ld copies back, not 1", what,
              fake_count("htod") - htod0);
    if (rn) {
        rd(got, rb, rn, ip ? sdev : rdev);
        for (size_t i = 0; i < rn; i++)
            if (got[i] != E[i]) {
                CHECK(0, "%s: recv[%zu] %d, expected %d", what, i, (int)got[i], (int)E[i]);
                break;
            }
    }
    if (ip) rel(rbuf, sdev);
    else {
        rel(sbuf, sdev);
        rel(rbuf, rdev);
    }
    free(sin);
    free(rin);
    free(E);
    free(got);
}

static int all(void)
{
    void *stream;
    CHECK(cu_stream_create(&stream, 1) == 0, "cuStreamCreate");
    for (int coll = 0; coll < NCOLLS; coll++)
        for (int mode = 0; mode < NMODES; mode++) {
            for (int dv = 0; dv < 4; dv++) run(coll, dv & 1, dv >> 1, 0, mode, NULL, 0);
            if (coll != ALLTOALLV)
                for (int dv = 0; dv < 2; dv++) run(coll, dv, dv, 1, mode, NULL, 0);
            if (has_opts(coll)) {
                run(coll, 1, 1, 0, mode, stream, 0);
                run(coll, 1, 0, 0, mode, stream, 0);
                run(coll, 0, 1, 0, mode, stream, 0);
                run(coll, 1, 1, 1, mode, stream, 0);
                run(coll, 1, 1, 0, mode, stream, 1);
            }
        }
    /* Large vectors, past the small-call path, on the stream: allreduce
     * out of place and in place, blocking and non-blocking, growing the
     * staging buffers. */
    for (int k = 0; k < 4; k++) {
        const size_t n = (size_t)1 << (14 + 2 * (k / 2)); /* 16 Ki, then 64 Ki elements */
        const int ip = k % 2;
        int32_t *in = malloc(n * sizeof *in), *got = malloc(n * sizeof *got);
        for (size_t i = 0; i < n; i++) in[i] = (int32_t)(i % 1000) * (rank + 1);
        unsigned long long s, d;
        CHECK(cu_alloc(&s, n * sizeof *in) == 0 && cu_alloc(&d, n * sizeof *in) == 0, "cuMemAlloc");
        CHECK(cu_htod_async(s, in, n * sizeof *in, stream) == 0, "cuMemcpyHtoDAsync");
        void *sb = (void *)(uintptr_t)s, *rb = ip ? sb : (void *)(uintptr_t)d;
        loom_coll_options_t o = LOOM_COLL_OPTIONS_INITIALIZER;
        o.stream = stream;
        loom_request_t req;
        loom_result_t r = k < 2 ? loom_allreduce_opts(sb, rb, n, LOOM_INT32, LOOM_SUM, comm, &o)
                                : loom_iallreduce_opts(sb, rb, n, LOOM_INT32, LOOM_SUM, comm, &o,
                                                       &req);
        if (k >= 2 && r == LOOM_SUCCESS) r = loom_wait(&req);
        CHECK(r == LOOM_SUCCESS, "allreduce of %zu: %s (%s)", n, loom_strerror(r),
              loom_get_last_error());
        rd(got, rb, n, 1);
        const int32_t f = (int32_t)(nranks * (nranks + 1) / 2);
        for (size_t i = 0; i < n; i++)
            if (got[i] != (int32_t)(i % 1000) * f) {
                CHECK(0, "allreduce of %zu%s: [%zu] %d, expected %d", n, ip ? " in place" : "",
                      i, (int)got[i], (int)((int32_t)(i % 1000) * f));
                break;
            }
        cu_free(s);
        cu_free(d);
        free(in);
        free(got);
    }
    /* Inside a group: refused, naming the group, nothing queued. */
    {
        unsigned long long d;
        int32_t h[C] = {0};
        CHECK(cu_alloc(&d, sizeof h) == 0, "cuMemAlloc");
        loom_group_start();
        loom_result_t r = loom_allreduce((void *)(uintptr_t)d, h, C, LOOM_INT32, LOOM_SUM, comm);
        CHECK(r == LOOM_ERR_INVALID_USAGE && strstr(loom_get_last_error(), "loom_group_start"),
              "a device buffer in a group: %s (%s)", loom_strerror(r), loom_get_last_error());
        r = loom_group_end();
        CHECK(r == LOOM_SUCCESS, "the empty group: %s", loom_strerror(r));
        cu_free(d);
    }
    /* The calls that do not stage refuse a device buffer, naming it,
     * before anything moves: every rank makes the same calls, so none
     * is left waiting, and the communicator goes on. */
    {
        unsigned long long d;
        int32_t h[C] = {0};
        uint64_t ix[1] = {0};
        CHECK(cu_alloc(&d, sizeof h) == 0, "cuMemAlloc");
        void *dp = (void *)(uintptr_t)d;
        const int peer = (rank + 1) % nranks;
        loom_result_t r = loom_send(dp, C, LOOM_INT32, peer, comm);
        CHECK(r == LOOM_ERR_INVALID_ARGUMENT && strstr(loom_get_last_error(), "loom_send: buf") &&
                  strstr(loom_get_last_error(), "device memory"),
              "loom_send of device memory: %s (%s)", loom_strerror(r), loom_get_last_error());
        r = loom_recv(dp, C, LOOM_INT32, peer, comm);
        CHECK(r == LOOM_ERR_INVALID_ARGUMENT && strstr(loom_get_last_error(), "loom_recv: buf"),
              "loom_recv into device memory: %s (%s)", loom_strerror(r), loom_get_last_error());
        r = loom_allreduce_quorum(h, dp, C, LOOM_INT32, LOOM_SUM, nranks, comm, NULL, NULL);
        CHECK(r == LOOM_ERR_INVALID_ARGUMENT && strstr(loom_get_last_error(), "recvbuf"),
              "loom_allreduce_quorum into device memory: %s (%s)", loom_strerror(r),
              loom_get_last_error());
        r = loom_sparse_allgather(ix, dp, 1, C, LOOM_INT32, LOOM_SUM, h, comm);
        /* every rank refuses: rank 0 names the argument, the others rank 0 */
        CHECK(r == LOOM_ERR_INVALID_ARGUMENT &&
                  strstr(loom_get_last_error(), rank ? "rank 0 refused" : "val "),
              "loom_sparse_allgather of device values: %s (%s)", loom_strerror(r),
              loom_get_last_error());
        r = loom_allreduce(h, h, C, LOOM_INT32, LOOM_SUM, comm);
        CHECK(r == LOOM_SUCCESS, "an allreduce after the refusals: %s (%s)", loom_strerror(r),
              loom_get_last_error());
        cu_free(d);
    }
    CHECK(fake_count("stale") == 0, "%ld reads of device input still queued on a stream",
          fake_count("stale"));
    CHECK(fake_count("bad") == 0, "%ld copies named host memory as device memory",
          fake_count("bad"));
    /* Staging buffers are reused: a few, not one per call. */
    CHECK(fake_count("alloc_host") > 0 && fake_count("alloc_host") <= 8,
          "%ld pinned allocations (expected 1..8)", fake_count("alloc_host"));
    return 0;
}

/* ------------------------------------------------------------ pipelined */

static size_t pchunk;

/* Element i of rank r's input in datatype dt: a small whole number (1..3),
 * exact in every type and through every op on up to 4 ranks. */
static void put(void *buf, size_t i, loom_datatype_t dt, int v)
{
    static const uint16_t f16[4] = {0, 0x3C00, 0x4000, 0x4200};
    unsigned char *p = (unsigned char *)buf + i * loom_datatype_size(dt);
    float f = (float)v;
    uint32_t fb;
    memcpy(&fb, &f, 4);
    switch (dt) {
    case LOOM_INT8: *(int8_t *)p = (int8_t)v; break;
    case LOOM_UINT8: *(uint8_t *)p = (uint8_t)v; break;
    case LOOM_INT32: *(int32_t *)p = v; break;
    case LOOM_UINT32: *(uint32_t *)p = (uint32_t)v; break;
    case LOOM_INT64: *(int64_t *)p = v; break;
    case LOOM_UINT64: *(uint64_t *)p = (uint64_t)v; break;
    case LOOM_FLOAT16: memcpy(p, &f16[v], 2); break;
    case LOOM_FLOAT32: memcpy(p, &f, 4); break;
    case LOOM_FLOAT64: {
        double d = v;
        memcpy(p, &d, 8);
        break;
    }
    case LOOM_BFLOAT16: {
        uint16_t b = (uint16_t)(fb >> 16);
        memcpy(p, &b, 2);
        break;
    }
    default: break;
    }
}

/* Where addr falls in [base, base+len): its chunk, else -1. */
static long chunk_of(unsigned long long addr, const void *base, size_t len)
{
    uintptr_t b = (uintptr_t)base;
    return addr >= b && addr < b + len ? (long)((addr - b) / pchunk) : -1;
}

/* The fake's log of the last call: every input chunk's copy queued in
 * order, chunk k+1's before chunk k's event completed (so before chunk
 * k's collective started); a result chunk copied back before the last
 * input chunk's event completed (so before the last collective started,
 * let alone finished); every result chunk copied back once. */
static void check_order(const char *what, const void *sb, const void *rb, size_t len,
                        size_t sbl, int has_in, int has_out, int slow)
{
    char k;
    unsigned long long a;
    size_t n;
    const int total = fake_oplog(0, &k, &a, &n);
    const long nch = (long)((len + pchunk - 1) / pchunk);
    long posD[64], posE[64], posH[64];
    for (long c = 0; c < 64; c++) posD[c] = posE[c] = posH[c] = -1;
    long nextD = 0, nH = 0;
    for (int i = 0; i < total; i++) {
        fake_oplog(i, &k, &a, &n);
        long c;
        /* (n past a chunk: recvbuf saved whole, not an input chunk) */
        if (k == 'D' && n <= pchunk && (c = chunk_of(a, sb, len)) >= 0 && has_in) {
            CHECK(c == nextD, "%s: input chunk %ld copied in as number %ld", what, c, nextD);
            if (c < 64) posD[c] = i;
            nextD++;
        } else if (k == 'E' && has_in && a >= (uintptr_t)sb && a < (uintptr_t)sb + sbl * len &&
                   (c = (long)((a - (uintptr_t)sb) % len / pchunk)) < 64) {
            /* (named by the last block's copy of the chunk) */
            if (posE[c] < 0) posE[c] = i;
        } else if (k == 'H' && (c = chunk_of(a, rb, len)) >= 0 && c < 64) {
            if (posH[c] < 0) posH[c] = i;
            nH++;
        }
    }
    CHECK(nch >= 3 && nch < 64, "%s: %ld chunks", what, nch);
    if (has_in) {
        CHECK(nextD == nch, "%s: %ld input chunks copied, not %ld", what, nextD, nch);
        for (long c = 0; c + 1 < nch; c++)
            CHECK(posD[c + 1] >= 0 && posE[c] >= 0 && posD[c + 1] < posE[c],
                  "%s: chunk %ld's input copy not queued before chunk %ld's collective", what,
                  c + 1, c);
    }
    if (has_out) {
        CHECK(nH == nch, "%s: %ld result chunks copied back, not %ld", what, nH, nch);
        if (has_in && slow)
            CHECK(posH[0] >= 0 && posH[0] < posE[nch - 1],
                  "%s: no result chunk copied back before the last chunk's collective started",
                  what);
    }
}

/* A copy back that fails on rank 0: that rank's call fails (an
 * allreduce's naming cuMemcpyHtoDAsync) and its recvbuf is as it was,
 * the chunks already back put back; the others succeed.  allreduce (ag
 * 0, in place where ip): the copy that fails is the second chunk's;
 * allgather (ag 1, out of place): the second chunk's first block, the
 * first chunk, all its blocks back, put back whole. */
static void failed_copy_back(int ag, int ip, void *stream)
{
    const size_t count = (pchunk * 3 + pchunk / 2) / 4, len = count * 4;
    const size_t rcount = ag ? (size_t)nranks * count : count, rlen = rcount * 4;
    const char *what = ag ? "an allgather's failed copy back" : ip ? "a failed copy back in place"
                                                                 : "a failed copy back";
    const char *coll = ag ? "allgather" : "allreduce";
    int32_t *in = malloc(len), *got = malloc(rlen), *sent = malloc(rlen);
    for (size_t i = 0; i < count; i++) in[i] = (int32_t)i + rank;
    for (size_t i = 0; i < rcount; i++) sent[i] = SENTINEL;
    unsigned long long s, d;
    CHECK(cu_alloc(&s, len) == 0 && cu_alloc(&d, rlen) == 0, "cuMemAlloc");
    cu_htod_async(s, in, len, stream);
    cu_htod_async(d, sent, rlen, stream);
    void *sb = (void *)(uintptr_t)s, *rb = ip ? sb : (void *)(uintptr_t)d;
    loom_coll_options_t o = LOOM_COLL_OPTIONS_INITIALIZER;
    o.stream = stream;
    if (rank == 0) fake_fail_htod_async(ag ? nranks + 1 : 2);
    loom_result_t r = ag ? loom_allgather_opts(sb, rb, count, LOOM_INT32, comm, &o)
                         : loom_allreduce_opts(sb, rb, count, LOOM_INT32, LOOM_SUM, comm, &o);
    fake_fail_htod_async(0);
    rd(got, rb, rcount, 1);
    if (rank == 0) {
        CHECK(r == LOOM_ERR_SYSTEM &&
                  (ag || strstr(loom_get_last_error(), "cuMemcpyHtoDAsync")),
              "%s: %s (%s)", what, loom_strerror(r), loom_get_last_error());
        CHECK(!memcmp(got, ip ? in : sent, rlen), "%s: recvbuf changed", what);
    } else {
        CHECK(r == LOOM_SUCCESS, "%s beside a failed copy back: %s", coll, loom_strerror(r));
        for (size_t i = 0; i < rcount; i++) {
            const int32_t want = ag ? (int32_t)(i % count) + (int32_t)(i / count)
                                    : (int32_t)(nranks * (int)i + nranks * (nranks - 1) / 2);
            if (got[i] != want) {
                CHECK(0, "%s beside a failed copy back: [%zu] %d", coll, i, (int)got[i]);
                break;
            }
        }
    }
    cu_free(s);
    cu_free(d);
    free(in);
    free(got);
    free(sent);
}

static int pipe_all(void)
{
    void *stream;
    CHECK(cu_stream_create(&stream, 1) == 0, "cuStreamCreate");
    const char *cv = getenv("LOOM_CUDA_PIPELINE_CHUNK");
    pchunk = cv ? (size_t)atol(cv) : 0;
    CHECK(pchunk >= 64 && pchunk <= 65536, "run with LOOM_CUDA_PIPELINE_CHUNK=64..65536 bytes");
    if (pchunk < 64 || pchunk > 65536) return 1;
    const int root = nranks - 1, ncolls = 5;
    static const char *const cn[] = {"allreduce", "broadcast", "reduce", "reduce_scatter",
                                     "allgather"};
    /* First with slow copies (each chunk's input copy takes 5 ms, the
     * last one until a result chunk went back, or 5 s): the order shows
     * the overlap; then every datatype and op, fast. */
    for (int slow = 1; slow >= 0; slow--)
    for (int coll = 0; coll < ncolls; coll++)
        for (int dt = 0; dt < LOOM_NUM_DATATYPES; dt++)
            for (int op = 0; op < (coll == 1 ? 1 : LOOM_NUM_OPS); op++)
                for (int ip = 0; ip < 2; ip++)
                    for (int mode = 0; mode < 3; mode++) {
        if (slow && (op || (dt != LOOM_INT32 && dt != LOOM_FLOAT32))) continue;
        fake_copy_us(slow ? 5000 : 0);
        const size_t es = loom_datatype_size((loom_datatype_t)dt);
        /* 3.5 chunks and an odd number of elements more */
        const size_t count = (pchunk * 3 + pchunk / 2) / es + 3 + (size_t)(dt % 2) * 2;
        const size_t len = count * es;
        const int is_root = rank == root;
        const int has_in = coll != 1 || is_root, has_out = coll != 2 || is_root;
        const int inplace = ip && has_in && has_out;
        const size_t P = (size_t)nranks;
        const size_t sbytes = has_in ? (coll == 3 ? P : 1) * len : 0;
        const size_t rbytes = has_out ? (coll == 4 ? P : 1) * len : 0;
        /* in place: one buffer; sendbuf and recvbuf at these offsets */
        const size_t tot = sbytes > rbytes ? sbytes : rbytes;
        const size_t soff = inplace && coll == 4 ? (size_t)rank * len : 0;
        const size_t roff = inplace && coll == 3 ? (size_t)rank * len : 0;
        unsigned char *hin = malloc(tot + 1), *ref = malloc(tot + 1), *got = malloc(tot + 1);
        unsigned char *sent = malloc(tot + 1), *hbuf = malloc(tot + 1);
        for (size_t i = 0; i < sbytes / es; i++)
            put(hin, i, (loom_datatype_t)dt, 1 + (int)((i + (size_t)rank) % 3));
        memset(sent, 0x5A, tot);
        /* The reference: the same call on host memory. */
        loom_result_t r;
        const void *hsb;
        void *hrb;
        if (inplace) {
            memcpy(hbuf, sent, tot);
            memcpy(hbuf + soff, hin, sbytes);
            memcpy(ref, hbuf, tot); /* the device buffer's first bytes */
            hsb = ref + soff;
            hrb = ref + roff;
        } else {
            memcpy(ref, sent, tot);
            hsb = hin;
            hrb = ref;
        }
        if (coll == 0) r = loom_allreduce(hsb, hrb, count, dt, op, comm);
        else if (coll == 1) r = loom_broadcast(has_in ? hsb : NULL, hrb, count, dt, root, comm);
        else if (coll == 2) r = loom_reduce(hsb, has_out ? hrb : NULL, count, dt, op, root, comm);
        else if (coll == 3) r = loom_reduce_scatter(hsb, hrb, count, dt, op, comm);
        else r = loom_allgather(hsb, hrb, count, dt, comm);
        CHECK(r == LOOM_SUCCESS, "host %s: %s", cn[coll], loom_strerror(r));
        unsigned long long s = 0, d = 0;
        void *qs = coll == 0 || coll >= 3 ? stream : NULL;
        if (inplace) {
            CHECK(cu_alloc(&s, tot) == 0 && cu_htod_async(s, hbuf, tot, qs) == 0, "device buffer");
        } else {
            CHECK((!sbytes || (cu_alloc(&s, sbytes) == 0 && cu_htod_async(s, hin, sbytes, qs) == 0)) &&
                      (!rbytes || (cu_alloc(&d, rbytes) == 0 && cu_htod_async(d, sent, rbytes, qs) == 0)),
                  "device buffers");
        }
        void *sb = inplace ? (char *)(uintptr_t)s + soff : (void *)(uintptr_t)s;
        void *rb = inplace ? (char *)(uintptr_t)s + roff : (void *)(uintptr_t)d;
        const unsigned char *E = inplace ? ref + roff : ref;
        char what[160];
        snprintf(what, sizeof what, "pipelined %s dtype %d op %d%s, %zu elements, %s%s", cn[coll],
                 dt, op, inplace ? " in place" : "", count, modes[mode],
                 slow ? ", slow copies" : "");
        nruns++;
        /* together: a late peer would hold the first chunk back */
        if (slow) CHECK(loom_barrier(comm) == LOOM_SUCCESS, "barrier");
        const long htod0 = fake_count("htod");
        fake_oplog_reset();
        /* slow: the last chunk's input copy ends only once a result chunk
         * went back (or after 5 s) */
        fake_hold_event(slow && has_in && has_out ? (int)((len + pchunk - 1) / pchunk) - 1 : -1);
        loom_request_t req = LOOM_REQUEST_NULL;
        loom_coll_options_t o = LOOM_COLL_OPTIONS_INITIALIZER;
        o.stream = stream;
        loom_request_t *rq = mode ? &req : NULL;
        if (coll == 0)
            r = rq ? loom_iallreduce_opts(sb, rb, count, dt, op, comm, &o, rq)
                   : loom_allreduce_opts(sb, rb, count, dt, op, comm, &o);
        else if (coll == 3)
            r = rq ? loom_ireduce_scatter_opts(sb, rb, count, dt, op, comm, &o, rq)
                   : loom_reduce_scatter_opts(sb, rb, count, dt, op, comm, &o);
        else if (coll == 4)
            r = rq ? loom_iallgather_opts(sb, rb, count, dt, comm, &o, rq)
                   : loom_allgather_opts(sb, rb, count, dt, comm, &o);
        else {
            /* broadcast and reduce: ordered on the legacy stream */
            if (coll == 1)
                r = rq ? loom_ibroadcast(has_in ? sb : NULL, rb, count, dt, root, comm, rq)
                       : loom_broadcast(has_in ? sb : NULL, rb, count, dt, root, comm);
            else
                r = rq ? loom_ireduce(sb, has_out ? rb : NULL, count, dt, op, root, comm, rq)
                       : loom_reduce(sb, has_out ? rb : NULL, count, dt, op, root, comm);
        }
        if (r == LOOM_SUCCESS && mode == 1) r = loom_wait(&req);
        if (r == LOOM_SUCCESS && mode == 2) {
            int done = 0;
            for (long k = 0; k < 100000000 && !done && r == LOOM_SUCCESS; k++)
                r = loom_test(&req, &done);
            CHECK(done, "%s: never done", what);
        }
        CHECK(r == LOOM_SUCCESS, "%s: %s (%s)", what, loom_strerror(r), loom_get_last_error());
        CHECK(fake_count("htod") == htod0, "%s: a synchronous copy back (not pipelined)", what);
        if (has_out) {
            CHECK(cu_dtoh(got, (uintptr_t)rb, rbytes) == 0, "reading device memory");
            for (size_t i = 0; i < rbytes; i++)
                if (got[i] != E[i]) {
                    CHECK(0, "%s: byte %zu (element %zu) is %#x, the host call's %#x", what, i,
                          i / es, got[i], E[i]);
                    break;
                }
        }
        check_order(what, sb, rb, len, coll == 3 ? P : 1, has_in, has_out, slow);
        if (s) cu_free(s);
        if (d) cu_free(d);
        free(hin);
        free(ref);
        free(got);
        free(sent);
        free(hbuf);
    }
    /* A copy back that fails: the allreduce's, out of place and in
     * place, then the allgather's; the communicator goes on. */
    for (int ip = 0; ip < 2; ip++) failed_copy_back(0, ip, stream);
    failed_copy_back(1, 0, stream);
    int32_t x = 1, y = 0;
    loom_result_t r = loom_allreduce(&x, &y, 1, LOOM_INT32, LOOM_SUM, comm);
    CHECK(r == LOOM_SUCCESS && y == nranks, "an allreduce after: %s", loom_strerror(r));
    CHECK(fake_count("stale") == 0, "%ld stale reads", fake_count("stale"));
    CHECK(fake_count("bad") == 0, "%ld bad copies", fake_count("bad"));
    return 0;
}

/* A device that never finishes the input copies (each event 100 s
 * after the one before): the pipelined call must fail by LOOM_TIMEOUT
 * (set to 1500 ms by the test), not wait for the copies. */
static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

static int stuck(void)
{
    const size_t count = 3 * 4096 / 4, len = count * 4;
    unsigned long long s;
    CHECK(cu_alloc(&s, len) == 0, "cuMemAlloc");
    fake_copy_us(100000000L);
    const long long t0 = now_ms();
    loom_result_t r = loom_allreduce((void *)(uintptr_t)s, (void *)(uintptr_t)s, count,
                                     LOOM_INT32, LOOM_SUM, comm);
    const long long took = now_ms() - t0;
    fake_copy_us(0);
    CHECK(r == LOOM_ERR_TIMEOUT && strstr(loom_get_last_error(), "LOOM_TIMEOUT"),
          "a device that never copies: %s (%s)", loom_strerror(r), loom_get_last_error());
    CHECK(took < 10000, "a device that never copies: failed after %lld ms", took);
    cu_free(s);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2 || (strcmp(argv[1], "all") && strcmp(argv[1], "pipe") &&
                     strcmp(argv[1], "stuck"))) {
        fprintf(stderr, "usage: mp_devbuf all|pipe|stuck\n");
        return 2;
    }
    if (cuda_load_fake()) {
        fprintf(stderr, "libcuda.so.1 is not tests/gpu/cuda_fake.c\n");
        return 2;
    }
    cu_init(0);
    mp_join(&comm, &rank, &nranks);
    int rc = !strcmp(argv[1], "stuck") ? stuck() : strcmp(argv[1], "pipe") ? all() : pipe_all();
    loom_comm_destroy(comm);
    CHECK(fake_count("free_host") == fake_count("alloc_host"),
          "pinned buffers: %ld allocated, %ld freed by loom_comm_destroy",
          fake_count("alloc_host"), fake_count("free_host"));
    if (rc) return rc;
    if (!failures) printf("rank %d: %d calls: ok\n", rank, nruns);
    return failures ? 1 : 0;
}
