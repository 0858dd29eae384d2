/*
 * nccl_devbuf.c - an NCCL program (nccl.h alone, plus CUDA's driver
 * calls found with dlsym) on CUDA device buffers and a created stream,
 * run by tests/mp/test_nccl.sh with tests/gpu/cuda_fake.c standing in
 * for libcuda.so.1:
 *
 *   nccl_devbuf dev RANK NRANKS IDFILE
 *
 * Each input is written by an asynchronous copy queued on the stream,
 * which the fake carries out only when the stream is synchronised: a
 * call that read its input without synchronising the stream would read
 * the allocation's 0xA5 filler (and the fake would count a stale read).
 * Checked: allreduce (also in place, and on the NULL stream), reduce,
 * reduce-scatter, broadcast, bcast, allgather give exact results, the
 * stream was synchronised by each call and holds no queued copy after
 * it; ncclSend/ncclRecv/ncclCommRegister on device memory, device
 * buffers inside a group and a device input with a PreMulSum op are
 * refused (ncclInvalidUsage, the reason named); host buffers with the
 * stream work and synchronise it; a stream the driver does not know
 * gives ncclUnhandledCudaError.  Exits 77 without the fake.
 */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nccl_check.h"

static int (*cuInit_)(unsigned);
static int (*cuMemAlloc_)(unsigned long long *, size_t);
static int (*cuMemFree_)(unsigned long long);
static int (*cuMemcpyDtoH_)(void *, unsigned long long, size_t);
static int (*cuMemcpyHtoDAsync_)(unsigned long long, const void *, size_t, void *);
static int (*cuStreamCreate_)(void **, unsigned);
static int (*cuStreamSynchronize_)(void *);
static int (*cuStreamDestroy_)(void *);
static long (*fake_count)(const char *);
static long (*fake_syncs)(void *);
static int (*fake_queued)(void *);

static void *dev_alloc(size_t bytes)
{
    unsigned long long p = 0;
    if (cuMemAlloc_(&p, bytes) != 0) {
        printf("FAIL rank %d: cuMemAlloc %zu\n", g_rank, bytes);
        exit(1);
    }
    return (void *)(uintptr_t)p;
}

/* n int32 of f(i) queued on stream s into dev: done only when s is
 * synchronised. */
static void put_async(void *dev, size_t n, int32_t (*f)(size_t), void *s)
{
    int32_t *h = malloc(n * sizeof *h);
    if (!h) exit(1);
    for (size_t i = 0; i < n; i++) h[i] = f(i);
    if (cuMemcpyHtoDAsync_((unsigned long long)(uintptr_t)dev, h, n * sizeof *h, s) != 0) {
        printf("FAIL rank %d: cuMemcpyHtoDAsync\n", g_rank);
        exit(1);
    }
    free(h);
}

/* Whether n int32 of dev (read after s is synchronised) are f(i). */
static int equals(const void *dev, size_t n, int32_t (*f)(size_t), void *s)
{
    int32_t *h = malloc(n * sizeof *h);
    if (!h) exit(1);
    int bad = cuStreamSynchronize_(s) != 0 ||
              cuMemcpyDtoH_(h, (unsigned long long)(uintptr_t)dev, n * sizeof *h) != 0;
    size_t wrong = 0;
    for (size_t i = 0; !bad && i < n; i++)
        if (h[i] != f(i)) {
            if (!wrong) printf("  rank %d: [%zu] = %d, want %d\n", g_rank, i, h[i], f(i));
            wrong++;
        }
    free(h);
    return !bad && !wrong;
}

enum { N = 1000, RC = 300 };
static int32_t ar_in(size_t i) { return g_rank * 1000 + (int32_t)i; }
static int32_t ar_out(size_t i) { return 1000 * g_n * (g_n - 1) / 2 + g_n * (int32_t)i; }
static int32_t rs_in(size_t i) { return g_rank + (int32_t)i; }
static int32_t rs_out(size_t i) { return g_n * (g_n - 1) / 2 + g_n * (g_rank * RC + (int32_t)i); }
static int32_t ag_in(size_t i) { return g_rank * 100 + (int32_t)i; }
static int32_t ag_out(size_t i) { return (int32_t)(i / RC) * 100 + (int32_t)(i % RC); }
static int32_t bc_val(size_t i) { return 7 * (int32_t)i + 3; }
static int32_t rd_in(size_t i) { return g_rank * (int32_t)i; }
static int32_t rd_out(size_t i) { return (g_n - 1) * (int32_t)i; }
static int32_t zero(size_t i) { (void)i; return 0; }

/* After a call on stream s: s synchronised by it (its sync count past
 * before), nothing queued on it, no stale read anywhere so far. */
static void ordered(void *s, long before, const char *what)
{
    char msg[160];
    snprintf(msg, sizeof msg, "%s: the stream was synchronised before the input was read", what);
    expect(fake_syncs(s) > before && fake_queued(s) == 0 && fake_count("stale") == 0, msg);
}

static int mode_dev(const char *idfile)
{
    ncclUniqueId id;
    ncclComm_t comm;
    get_id(idfile, &id);
    if (ncclCommInitRank(&comm, g_n, id, g_rank) != ncclSuccess) {
        printf("FAIL rank %d: init: %s\n", g_rank, ncclGetLastError(NULL));
        return 1;
    }
    void *s = NULL;
    if (cuStreamCreate_(&s, 0) != 0) return 1;
    cudaStream_t st = (cudaStream_t)s;
    char what[160];
    long before;

    int32_t *a = dev_alloc(N * 4), *b = dev_alloc(N * 4), *c = dev_alloc((size_t)g_n * RC * 4);

    put_async(a, N, ar_in, s);
    before = fake_syncs(s);
    expect(ncclAllReduce(a, b, N, ncclInt32, ncclSum, comm, st) == ncclSuccess &&
               equals(b, N, ar_out, s),
           "ncclAllReduce on device buffers with a stream: exact");
    ordered(s, before, "ncclAllReduce");

    put_async(a, N, ar_in, s);
    before = fake_syncs(s);
    expect(ncclAllReduce(a, a, N, ncclInt32, ncclSum, comm, st) == ncclSuccess &&
               equals(a, N, ar_out, s),
           "ncclAllReduce in place on device memory: exact");
    ordered(s, before, "ncclAllReduce in place");

    /* The NULL stream: Loom synchronises the legacy default stream. */
    put_async(a, N, ar_in, NULL);
    expect(ncclAllReduce(a, b, N, ncclInt32, ncclSum, comm, NULL) == ncclSuccess &&
               equals(b, N, ar_out, NULL) && fake_queued(NULL) == 0,
           "ncclAllReduce on device buffers with the NULL stream: exact");

    put_async(c, (size_t)g_n * RC, rs_in, s);
    before = fake_syncs(s);
    expect(ncclReduceScatter(c, b, RC, ncclInt32, ncclSum, comm, st) == ncclSuccess &&
               equals(b, RC, rs_out, s),
           "ncclReduceScatter on device buffers: exact");
    ordered(s, before, "ncclReduceScatter");

    put_async(a, RC, ag_in, s);
    before = fake_syncs(s);
    expect(ncclAllGather(a, c, RC, ncclInt32, comm, st) == ncclSuccess &&
               equals(c, (size_t)g_n * RC, ag_out, s),
           "ncclAllGather on device buffers: exact");
    ordered(s, before, "ncclAllGather");

    int root = 1 % g_n;
    put_async(a, N, g_rank == root ? bc_val : zero, s);
    put_async(b, N, zero, s);
    before = fake_syncs(s);
    snprintf(what, sizeof what, "ncclBroadcast from rank %d on device buffers: exact", root);
    expect(ncclBroadcast(a, b, N, ncclInt32, root, comm, st) == ncclSuccess &&
               equals(b, N, bc_val, s),
           what);
    ordered(s, before, "ncclBroadcast");

    put_async(a, N, g_rank == 0 ? bc_val : zero, s);
    before = fake_syncs(s);
    expect(ncclBcast(a, N, ncclInt32, 0, comm, st) == ncclSuccess && equals(a, N, bc_val, s),
           "ncclBcast in place on device memory: exact");
    ordered(s, before, "ncclBcast");

    root = g_n - 1;
    put_async(a, N, rd_in, s);
    put_async(b, N, zero, s);
    before = fake_syncs(s);
    snprintf(what, sizeof what, "ncclReduce (max) to rank %d on device buffers: exact", root);
    expect(ncclReduce(a, b, N, ncclInt32, ncclMax, root, comm, st) == ncclSuccess &&
               equals(b, N, g_rank == root ? rd_out : zero, s),
           what);
    ordered(s, before, "ncclReduce");

    /* Host buffers with the stream: synchronised and used. */
    int32_t h[8], hr[8];
    for (int i = 0; i < 8; i++) h[i] = g_rank + i;
    before = fake_syncs(s);
    int okh = ncclAllReduce(h, hr, 8, ncclInt32, ncclSum, comm, st) == ncclSuccess;
    for (int i = 0; okh && i < 8; i++) okh = hr[i] == g_n * (g_n - 1) / 2 + g_n * i;
    expect(okh && fake_syncs(s) > before, "host buffers with a stream: exact, stream synchronised");

    /* Refused, on every rank alike, before any communication. */
    int peer = (g_rank + 1) % g_n, from = (g_rank + g_n - 1) % g_n;
    expect_err(ncclSend(a, 4, ncclInt32, peer, comm, st), ncclInvalidUsage, "sendbuff",
               "ncclSend from device memory is refused");
    expect_err(ncclRecv(a, 4, ncclInt32, from, comm, st), ncclInvalidUsage, "recvbuff",
               "ncclRecv into device memory is refused");
    void *handle = NULL;
    expect_err(ncclCommRegister(comm, a, N * 4, &handle), ncclInvalidUsage, "device memory",
               "ncclCommRegister of device memory is refused");
    expect(ncclGroupStart() == ncclSuccess, "ncclGroupStart");
    expect_err(ncclAllReduce(a, b, N, ncclInt32, ncclSum, comm, st), ncclInvalidUsage,
               "ncclGroupStart", "device buffers inside a group are refused");
    ncclResult_t ge = ncclGroupEnd();
    expect(ge == ncclInvalidUsage, "... and ncclGroupEnd returns ncclInvalidUsage");
    int32_t scalar = 3;
    ncclRedOp_t op;
    if (ncclRedOpCreatePreMulSum(&op, &scalar, ncclInt32, ncclScalarHostImmediate, comm) ==
        ncclSuccess) {
        expect_err(ncclAllReduce(a, b, N, ncclInt32, op, comm, st), ncclInvalidUsage, "PreMulSum",
                   "a device input with a PreMulSum op is refused");
        /* Host input, device output: the scaling reads host memory. */
        for (int i = 0; i < 8; i++) h[i] = g_rank + i;
        int okp = ncclAllReduce(h, b, 8, ncclInt32, op, comm, st) == ncclSuccess;
        int32_t out[8];
        okp = okp && cuMemcpyDtoH_(out, (unsigned long long)(uintptr_t)b, sizeof out) == 0;
        for (int i = 0; okp && i < 8; i++) okp = out[i] == 3 * (g_n * (g_n - 1) / 2 + g_n * i);
        expect(okp, "PreMulSum with a host input and a device output: exact");
        ncclRedOpDestroy(op, comm);
    } else {
        expect(0, "ncclRedOpCreatePreMulSum");
    }
    expect_err(ncclAllReduce(h, hr, 8, ncclInt32, ncclSum, comm, (cudaStream_t)(uintptr_t)0x77),
               ncclUnhandledCudaError, "cuStreamSynchronize",
               "a stream the driver does not know: its error");

    /* Still usable after the refusals. */
    put_async(a, N, ar_in, s);
    before = fake_syncs(s);
    expect(ncclAllReduce(a, b, N, ncclInt32, ncclSum, comm, st) == ncclSuccess &&
               equals(b, N, ar_out, s),
           "an allreduce after the refusals: exact");
    ordered(s, before, "the last allreduce");
    expect(fake_count("bad") == 0, "no copy touched memory that was not device memory");

    ncclCommDestroy(comm);
    cuMemFree_((unsigned long long)(uintptr_t)a);
    cuMemFree_((unsigned long long)(uintptr_t)b);
    cuMemFree_((unsigned long long)(uintptr_t)c);
    cuStreamDestroy_(s);
    printf("rank %d: %d passed, %d failed\n", g_rank, g_pass, g_fail);
    return g_fail ? 1 : 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    g_say_ok = 1;
    if (argc != 5 || strcmp(argv[1], "dev") != 0) {
        fprintf(stderr, "usage: %s dev RANK NRANKS IDFILE\n", argv[0]);
        return 2;
    }
    g_rank = atoi(argv[2]);
    g_n = atoi(argv[3]);
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h) {
        *(void **)&cuInit_ = dlsym(h, "cuInit");
        *(void **)&cuMemAlloc_ = dlsym(h, "cuMemAlloc_v2");
        *(void **)&cuMemFree_ = dlsym(h, "cuMemFree_v2");
        *(void **)&cuMemcpyDtoH_ = dlsym(h, "cuMemcpyDtoH_v2");
        *(void **)&cuMemcpyHtoDAsync_ = dlsym(h, "cuMemcpyHtoDAsync_v2");
        *(void **)&cuStreamCreate_ = dlsym(h, "cuStreamCreate");
        *(void **)&cuStreamSynchronize_ = dlsym(h, "cuStreamSynchronize");
        *(void **)&cuStreamDestroy_ = dlsym(h, "cuStreamDestroy_v2");
        *(void **)&fake_count = dlsym(h, "fake_cuda_count");
        *(void **)&fake_syncs = dlsym(h, "fake_cuda_syncs");
        *(void **)&fake_queued = dlsym(h, "fake_cuda_queued");
    }
    if (!fake_count || !fake_syncs || !fake_queued || !cuInit_ || !cuMemAlloc_ || !cuMemFree_ ||
        !cuMemcpyDtoH_ || !cuMemcpyHtoDAsync_ || !cuStreamCreate_ || !cuStreamSynchronize_ ||
        !cuStreamDestroy_) {
        printf("no fake libcuda.so.1 (tests/gpu/cuda_fake.c) loaded: skipped\n");
        return 77;
    }
    if (cuInit_(0) != 0) return 1;
    return mode_dev(argv[4]);
}
