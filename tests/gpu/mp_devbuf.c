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
 */
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom.h"
#include "../mp/check.h"

static int rank, nranks, failures, nruns;
static loom_comm_t comm;

static int (*cu_init)(unsigned);
static int (*cu_alloc)(unsigned long long *, size_t);
static int (*cu_free)(unsigned long long);
static int (*cu_dtoh)(void *, unsigned long long, size_t);
static int (*cu_htod_async)(unsigned long long, const void *, size_t, void *);
static int (*cu_stream_create)(void **, unsigned);
static long (*fake_count)(const char *);
static long (*fake_syncs)(void *);
static int (*fake_queued)(void *);

static int load_fake(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) return -1;
#define L(v, n) *(void **)&v = dlsym(h, n)
    L(cu_init, "cuInit");
    L(cu_alloc, "cuMemAlloc_v2");
    L(cu_free, "cuMemFree_v2");
    L(cu_dtoh, "cuMemcpyDtoH_v2");
    L(cu_htod_async, "cuMemcpyHtoDAsync_v2");
    L(cu_stream_create, "cuStreamCreate");
    L(fake_count, "fake_cuda_count");
    L(fake_syncs, "fake_cuda_syncs");
    L(fake_queued, "fake_cuda_queued");
#undef L
    return cu_init && cu_alloc && cu_free && cu_dtoh && cu_htod_async && cu_stream_create &&
                   fake_count && fake_syncs && fake_queued
               ? 0
               : -1;
}

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

int main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "all")) {
        fprintf(stderr, "usage: mp_devbuf all\n");
        return 2;
    }
    if (load_fake()) {
        fprintf(stderr, "libcuda.so.1 is not tests/gpu/cuda_fake.c\n");
        return 2;
    }
    cu_init(0);
    mp_join(&comm, &rank, &nranks);
    int rc = all();
    loom_comm_destroy(comm);
    CHECK(fake_count("free_host") == fake_count("alloc_host"),
          "pinned buffers: %ld allocated, %ld freed by loom_comm_destroy",
          fake_count("alloc_host"), fake_count("free_host"));
    if (rc) return rc;
    if (!failures) printf("rank %d: %d calls: ok\n", rank, nruns);
    return failures ? 1 : 0;
}
