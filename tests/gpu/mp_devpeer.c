/*
 * mp_devpeer.c - the device-direct collectives between the ranks of one
 * host through CUDA IPC (src/comm/devpeer.c), across real ranks, with
 * tests/gpu/cuda_fake.c standing in for libcuda.so.1 (test_devpeer.sh):
 * its device memory is shared between processes and its kernels run on
 * the CPU.
 *
 *   mp_devpeer all       allreduce, reduce_scatter, allgather, broadcast,
 *                        reduce: every dtype x op, in place and not,
 *                        counts that n does not divide, roots in turn: the
 *                        result must be the host collective's (the CPU
 *                        kernels) byte for byte, and
 *                        an independent int32 sum; input written on a
 *                        stream (queued until it is synchronised); the
 *                        counts of the fake say which path ran: with
 *                        LOOM_CUDA_IPC unset, kernels and device copies
 *                        and no copy to the host, the peers' buffers
 *                        opened once and reused; with LOOM_CUDA_IPC=0 (or
 *                        a driver without IPC: EXPECT=staged), staging
 *                        and no kernel
 *   mp_devpeer ipcfail   rank 1's cuIpcGetMemHandle fails: every rank
 *                        stages, with the right result
 *   mp_devpeer mixed     rank 0 passes host memory, the others device
 *                        memory: every rank returns, an error or the
 *                        right result, within the deadline
 *   mp_devpeer kill      the last rank dies (SIGKILL) in its kernel
 *                        launch: every other rank fails within LIMIT_MS
 *                        (argv[2]) and says "ok after N ms"
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "loom.h"
#include "../mp/check.h"
#include "cuda_dl.h"

static int rank, nranks, failures;
static long test_dtoh; /* the test's own reads of device results */
static long want_launch; /* kernels the device path launches on this rank */
static loom_comm_t comm;

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* fp16 / bf16 of small integers (exact): bits built by hand. */
static uint16_t half_of(int v)
{
    if (!v) return 0;
    uint16_t s = v < 0 ? 0x8000 : 0;
    unsigned a = (unsigned)(v < 0 ? -v : v), e = 0;
    while ((a >> e) > 1) e++;
    return (uint16_t)(s | ((e + 15) << 10) | (((a << 10) >> e) & 0x3ff));
}
static uint16_t bf16_of(int v)
{
    float f = (float)v;
    uint32_t b;
    memcpy(&b, &f, 4);
    return (uint16_t)(b >> 16);
}

/* Element i of rank r's input, of type t: small values, so that every
 * float result is exact whatever the order (sums and products of up to
 * four of them), and integers that wrap (i8 sums and products). */
static void value(loom_datatype_t t, int r, size_t i, void *out)
{
    int v = (int)((i * 7 + (size_t)r * 3) % 9) - 3; /* -3..5 */
    if (v == 0 && r == 0 && i % 2) v = 0;          /* zeros, */
    int big = (int)((i * 31 + (size_t)r * 57) % 200); /* 0..199 for the integers */
    switch (t) {
    case LOOM_INT8: *(int8_t *)out = (int8_t)(big - 100); break;
    case LOOM_UINT8: *(uint8_t *)out = (uint8_t)big; break;
    case LOOM_INT32: *(int32_t *)out = (int32_t)(big * 1000003 - 7 * r); break;
    case LOOM_UINT32: *(uint32_t *)out = (uint32_t)big * 2654435761u; break;
    case LOOM_INT64: *(int64_t *)out = (int64_t)big * 1000000007LL - r; break;
    case LOOM_UINT64: *(uint64_t *)out = (uint64_t)big * 11400714819323198485ull; break;
    case LOOM_FLOAT16: *(uint16_t *)out = half_of(v); break;
    case LOOM_BFLOAT16: *(uint16_t *)out = bf16_of(v); break;
    case LOOM_FLOAT32: *(float *)out = (i == 0 && r == 0) ? -0.0f : (float)v; break;
    case LOOM_FLOAT64: *(double *)out = (double)v / 2; break;
    default: break;
    }
}

static const loom_datatype_t types[] = {LOOM_INT8,    LOOM_UINT8,   LOOM_INT32,  LOOM_UINT32,
                                        LOOM_INT64,   LOOM_UINT64,  LOOM_FLOAT16, LOOM_FLOAT32,
                                        LOOM_FLOAT64, LOOM_BFLOAT16};
static const char *const tnames[] = {"i8", "u8", "i32", "u32", "i64", "u64", "f16", "f32", "f64",
                                     "bf16"};
static const loom_op_t ops[] = {LOOM_SUM, LOOM_PROD, LOOM_MAX, LOOM_MIN, LOOM_AVG};
static const char *const onames[] = {"sum", "prod", "max", "min", "avg"};

static void *dev_alloc(size_t n)
{
    unsigned long long d = 0;
    if (cu_alloc(&d, n ? n : 1)) {
        fprintf(stderr, "rank %d: cuMemAlloc %zu failed\n", rank, n);
        exit(2);
    }
    return (void *)(uintptr_t)d;
}

/* One allreduce of count elements of t with op, on device buffers (in
 * place or not), its input written on stream; compared with the host
 * allreduce of the same input.  Returns 0 when it matched. */
static int one(loom_datatype_t t, const char *tn, loom_op_t op, const char *on, size_t count,
               int inplace, void *stream)
{
    size_t es = loom_datatype_size(t), n = count * es;
    unsigned char *in = malloc(n), *ref = malloc(n), *got = malloc(n);
    for (size_t i = 0; i < count; i++) value(t, rank, i, in + i * es);
    loom_result_t r = loom_allreduce(in, ref, count, t, op, comm); /* host: the CPU kernels */
    CHECK(r == LOOM_SUCCESS, "host allreduce %s %s: %s", tn, on, loom_get_last_error());
    void *sb = dev_alloc(n), *rb = inplace ? sb : dev_alloc(n);
    cu_htod_async((uintptr_t)sb, in, n, stream); /* queued until the stream is synchronised */
    if (!inplace) cu_htod((uintptr_t)rb, in, n); /* garbage the call must overwrite */
    loom_coll_options_t o = LOOM_COLL_OPTIONS_INITIALIZER;
    o.stream = stream;
    r = loom_allreduce_opts(sb, rb, count, t, op, comm, &o);
    /* This rank's slice: count / n, one more for the first count % n
     * ranks; one reduction kernel, and LOOM_AVG's division. */
    size_t len = count / (size_t)nranks + ((size_t)rank < count % (size_t)nranks);
    want_launch += len ? (op == LOOM_AVG ? 2 : 1) : 0;
    int bad = 0;
    CHECK(r == LOOM_SUCCESS, "device allreduce %s %s count %zu%s: %s (%s)", tn, on, count,
          inplace ? " in place" : "", loom_strerror(r), loom_get_last_error());
    cu_dtoh(got, (uintptr_t)rb, n);
    if (r == LOOM_SUCCESS && memcmp(got, ref, n)) {
        size_t i = 0;
        while (i < count && !memcmp(got + i * es, ref + i * es, es)) i++;
        CHECK(0, "device allreduce %s %s count %zu%s: differs from the host's at [%zu]", tn, on,
              count, inplace ? " in place" : "", i);
        bad = 1;
    }
    if (!inplace) {
        /* sendbuf is input only */
        cu_dtoh(got, (uintptr_t)sb, n);
        CHECK(!memcmp(got, in, n), "%s %s: sendbuf changed", tn, on);
    }
    cu_free((uintptr_t)sb);
    if (!inplace) cu_free((uintptr_t)rb);
    free(in);
    free(ref);
    free(got);
    return bad || r != LOOM_SUCCESS;
}

enum { RS, AG, BC, RD };
static const char *const cnames[] = {"reduce_scatter", "allgather", "broadcast", "reduce"};

/* Run collective k on host (dev 0) or device (dev 1) buffers; *res gets
 * the result bytes (rlen of them, 0 where this rank has none). */
static loom_result_t coll(int k, loom_datatype_t t, loom_op_t op, size_t count, int inplace,
                          int root, int dev, void *stream, unsigned char *res, size_t *rlen)
{
    const size_t es = loom_datatype_size(t), blk = count * es, all = blk * (size_t)nranks;
    size_t sl = 0, rl = 0, soff = 0; /* send within recv (in place), or recv within send */
    int in_recv = 0;                 /* sendbuf lies in recvbuf (else recv in send) */
    switch (k) {
    case RS: sl = all, rl = blk; soff = (size_t)rank * blk; break;
    case AG: sl = blk, rl = all; soff = (size_t)rank * blk; in_recv = 1; break;
    case BC: sl = rank == root ? blk : 0, rl = blk; in_recv = 1; break;
    case RD: sl = blk, rl = rank == root ? blk : 0; break;
    }
    int ip = inplace && (k == RS || k == AG || rank == root);
    unsigned char *in = malloc(sl ? sl : 1);
    for (size_t i = 0; i < sl / es; i++) value(t, rank, i, in + i * es);
    size_t big = sl > rl ? sl : rl;
    unsigned char *hb = malloc(big ? big : 1), *hb2 = malloc(big ? big : 1);
    memset(hb, 0x5c, big ? big : 1);
    memset(hb2, 0x5c, big ? big : 1);
    void *sb = NULL, *rb = NULL;
    unsigned char *base = NULL;
    if (dev) base = big ? dev_alloc(big) : NULL;
    else base = hb;
    if (dev && big) cu_htod((uintptr_t)base, hb2, big);
    if (ip) {
        if (in_recv) rb = base, sb = base + soff;
        else sb = base, rb = base + soff;
    } else {
        sb = sl ? (dev ? dev_alloc(sl) : malloc(sl)) : NULL;
        rb = rl ? (dev ? base : base) : NULL;
    }
    if (sl) {
        if (dev) cu_htod_async((uintptr_t)sb, in, sl, stream);
        else memcpy(sb, in, sl);
    }
    loom_result_t r = LOOM_SUCCESS;
    loom_coll_options_t o = LOOM_COLL_OPTIONS_INITIALIZER;
    o.stream = stream;
    switch (k) {
    case RS: r = loom_reduce_scatter_opts(sb, rb, count, t, op, comm, &o); break;
    case AG: r = loom_allgather_opts(sb, rb, count, t, comm, &o); break;
    case BC:
        if (dev && sl) cu_stream_sync(stream); /* broadcast is on the legacy stream */
        r = loom_broadcast(sb, rb, count, t, root, comm);
        break;
    case RD:
        if (dev && sl) cu_stream_sync(stream);
        r = loom_reduce(sb, rb, count, t, op, root, comm);
        break;
    }
    *rlen = rl;
    if (rl) {
        if (dev) cu_dtoh(res, (uintptr_t)rb, rl), test_dtoh++;
        else memcpy(res, rb, rl);
    }
    if (!ip && sl) {
        if (dev) cu_free((uintptr_t)sb);
        else free(sb);
    }
    if (dev && base) cu_free((uintptr_t)base);
    free(in);
    free(hb);
    free(hb2);
    return r;
}

/* Collective k on device buffers against the same on host buffers. */
static void one_coll(int k, loom_datatype_t t, const char *tn, loom_op_t op, const char *on,
                     size_t count, int inplace, int root, void *stream)
{
    size_t es = loom_datatype_size(t), cap = count * es * (size_t)nranks, rl, rl2;
    unsigned char *ref = malloc(cap), *got = malloc(cap);
    loom_result_t r = coll(k, t, op, count, inplace, root, 0, NULL, ref, &rl);
    CHECK(r == LOOM_SUCCESS, "host %s %s %s: %s", cnames[k], tn, on, loom_get_last_error());
    r = coll(k, t, op, count, inplace, root, 1, stream, got, &rl2);
    CHECK(r == LOOM_SUCCESS, "device %s %s %s count %zu%s root %d: %s (%s)", cnames[k], tn, on,
          count, inplace ? " in place" : "", root, loom_strerror(r), loom_get_last_error());
    if (r == LOOM_SUCCESS && rl && memcmp(ref, got, rl)) {
        size_t i = 0;
        while (i < rl / es && !memcmp(got + i * es, ref + i * es, es)) i++;
        CHECK(0, "device %s %s %s count %zu%s root %d: differs from the host's at [%zu]",
              cnames[k], tn, on, count, inplace ? " in place" : "", root, i);
    }
    if (k == RS) want_launch += count ? (op == LOOM_AVG ? 2 : 1) : 0;
    if (k == RD && rank == root) want_launch += op == LOOM_AVG ? 2 : 1;
    free(ref);
    free(got);
}

static int all(int expect_direct)
{
    void *stream = NULL;
    cu_stream_create(&stream, 0);
    const long launch0 = fake_count("launch"), dtoh0 = fake_count("dtoh");
    long dtoh_ours = 0, ar_calls; /* the test's own reads of results */
    const size_t counts[] = {1, (size_t)nranks + 1, 37, 1000 + (size_t)nranks - 1};
    int calls = 0;
    for (size_t k = 0; k < sizeof types / sizeof *types; k++)
        for (size_t o = 0; o < sizeof ops / sizeof *ops; o++)
            for (size_t c = 0; c < sizeof counts / sizeof *counts; c++)
                for (int inplace = 0; inplace < 2; inplace++) {
                    one(types[k], tnames[k], ops[o], onames[o], counts[c], inplace,
                        c % 2 ? stream : NULL);
                    dtoh_ours += inplace ? 1 : 2;
                    calls++;
                }
    ar_calls = calls;
    /* The other collectives: every dtype for the ones that move data,
     * every dtype x op for the reductions. */
    for (int k = RS; k <= RD; k++)
        for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++)
            for (size_t o = 0; o < sizeof ops / sizeof *ops; o++) {
                if ((k == AG || k == BC) && o) break;
                for (size_t c = 0; c < 3; c++)
                    for (int inplace = 0; inplace < 2; inplace++) {
                        int root = (int)(c + o + ti) % nranks;
                        one_coll(k, types[ti], tnames[ti], ops[o], onames[o], counts[c], inplace,
                                 root, c % 2 ? stream : NULL);
                        calls++;
                    }
            }
    /* An independent reference: the int32 sum by formula. */
    {
        const size_t count = 101;
        int32_t *h = malloc(count * 4), *got = malloc(count * 4);
        for (size_t i = 0; i < count; i++) h[i] = (int32_t)(rank * 100000 + (int)i);
        void *b = dev_alloc(count * 4);
        cu_htod((uintptr_t)b, h, count * 4);
        loom_result_t r = loom_allreduce(b, b, count, LOOM_INT32, LOOM_SUM, comm);
        CHECK(r == LOOM_SUCCESS, "int32 sum: %s", loom_get_last_error());
        cu_dtoh(got, (uintptr_t)b, count * 4);
        dtoh_ours++;
        int32_t tri = (int32_t)(100000LL * nranks * (nranks - 1) / 2);
        for (size_t i = 0; i < count; i++)
            if (got[i] != tri + (int32_t)i * nranks) {
                CHECK(0, "int32 sum [%zu] = %d, expected %d", i, got[i],
                      tri + (int32_t)i * nranks);
                break;
            }
        /* The same buffers again: nothing more is opened. */
        long open0 = fake_count("ipc_open");
        for (int j = 0; j < 3; j++) loom_allreduce(b, b, count, LOOM_INT32, LOOM_SUM, comm);
        want_launch += 4;
        CHECK(fake_count("ipc_open") == open0, "repeated calls on the same buffers opened %ld "
              "mappings", fake_count("ipc_open") - open0);
        cu_free((uintptr_t)b);
        free(h);
        free(got);
        calls += 4;
    }
    long launches = fake_count("launch") - launch0, dtoh = fake_count("dtoh") - dtoh0 - dtoh_ours - test_dtoh;
    if (expect_direct) {
        CHECK(launches == want_launch, "device path: %ld kernel launches for %d calls, not %ld",
              launches, calls, want_launch);
        CHECK(dtoh == 0, "device path: %ld copies of user data to the host", dtoh);
        CHECK(fake_count("ipc_open") > 0 && fake_count("dtod") > 0,
              "device path: %ld mappings opened, %ld device copies", fake_count("ipc_open"),
              fake_count("dtod"));
    } else {
        CHECK(launches == 0, "staged: %ld kernel launches", launches);
        CHECK(dtoh >= ar_calls, "staged: %ld copies to the host for %ld allreduces", dtoh,
              ar_calls);
        CHECK(fake_count("ipc_open") == 0, "staged: %ld mappings opened", fake_count("ipc_open"));
    }
    CHECK(fake_count("stale") == 0, "%ld reads of input still queued on a stream",
          fake_count("stale"));
    CHECK(fake_count("bad") == 0, "%ld device accesses outside device memory", fake_count("bad"));
    printf("rank %d: %d calls, %ld launches, %ld staged copies, %ld mappings: %s\n", rank, calls,
           launches, dtoh, fake_count("ipc_open"), failures ? "FAILED" : "ok");
    return 0;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    if (cuda_load_fake()) {
        fprintf(stderr, "libcuda.so.1 is not tests/gpu/cuda_fake.c\n");
        return 2;
    }
    cu_init(0);
    mp_join(&comm, &rank, &nranks);
    const char *ipc = getenv("LOOM_CUDA_IPC"), *ex = getenv("EXPECT");
    int direct = !(ipc && !strcmp(ipc, "0")) && !(ex && !strcmp(ex, "staged"));
    if (!strcmp(mode, "all")) {
        all(direct);
    } else if (!strcmp(mode, "ipcfail")) {
        if (rank == 1) setenv("FAKE_CUDA_IPC_FAIL", "1", 1);
        all(0);
    } else if (!strcmp(mode, "mixed") || !strcmp(mode, "kill")) {
        const size_t count = 1000;
        int32_t *h = malloc(count * 4);
        for (size_t i = 0; i < count; i++) h[i] = rank + (int32_t)i;
        void *b = h;
        if (!strcmp(mode, "kill")) {
            if (rank == nranks - 1) setenv("FAKE_CUDA_KILL_AT_LAUNCH", "1", 1);
        }
        if (strcmp(mode, "mixed") || rank) {
            b = dev_alloc(count * 4);
            cu_htod((uintptr_t)b, h, count * 4);
        }
        loom_barrier(comm); /* every rank past init: the call is what is tested */
        double t0 = now_ms();
        loom_result_t r = loom_allreduce(b, b, count, LOOM_INT32, LOOM_SUM, comm);
        double dt = now_ms() - t0;
        if (b != h) cu_dtoh(h, (uintptr_t)b, count * 4);
        int right = 1;
        for (size_t i = 0; i < count; i++)
            if (h[i] != nranks * (nranks - 1) / 2 + nranks * (int32_t)i) right = 0;
        if (!strcmp(mode, "mixed")) {
            CHECK(r != LOOM_SUCCESS || right, "mixed host/device: success with a wrong result");
            printf("rank %d: %s after %.0f ms (%s): ok\n", rank,
                   r == LOOM_SUCCESS ? "right result" : loom_strerror(r), dt,
                   loom_get_last_error());
        } else {
            double limit = argc > 2 ? atof(argv[2]) : 5000;
            CHECK(r != LOOM_SUCCESS, "a peer killed mid-call, yet success");
            CHECK(dt < limit, "the error came after %.0f ms (limit %.0f)", dt, limit);
            if (!failures)
                printf("rank %d: %s: ok after %.0f ms\n", rank, loom_get_last_error(), dt);
            fflush(stdout);
            _exit(failures ? 1 : 0); /* the communicator lost a rank: no destroy */
        }
    } else {
        fprintf(stderr, "usage: mp_devpeer all|ipcfail|mixed|kill [LIMIT_MS]\n");
        return 2;
    }
    loom_comm_destroy(comm);
    if (!strcmp(mode, "all") && direct)
        CHECK(fake_count("ipc_close") == fake_count("ipc_open"),
              "loom_comm_destroy closed %ld of %ld mappings", fake_count("ipc_close"),
              fake_count("ipc_open"));
    return failures ? 1 : 0;
}
