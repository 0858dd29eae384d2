/*
 * gpu_ipc_bw.c - the device-direct allreduce (CUDA IPC, src/comm/devpeer.c)
 * on a real GPU, for tests/gpu/run_on_gpu.sh: N ranks (loomrun -n N, 2 by
 * default) share device 0, allreduce SIZE MiB of fp32 (256 by default,
 * argv[1]) between device buffers, check the result, and rank 0 prints
 * one "bench" line: the median time of 10 calls, the bus bandwidth
 * (2 (N-1)/N bytes / time, as NCCL counts it), and the bound the device's
 * own copies set: cuMemcpyDtoD of the same bytes, timed here, and the
 * share of it reached, counting the bytes the path moves through the
 * one device's memory ((3N-1) x bytes: every slice read from N buffers,
 * written once, then N-1 slices copied by each rank) against a copy's 2.
 * Exits 77 (skipped) where there is no driver or no GPU, before anything.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loom.h"
#include "../mp/check.h"

static int (*cuInit_)(unsigned);
static int (*cuDeviceGetCount_)(int *);
static int (*cuDeviceGet_)(int *, int);
static int (*cuDevicePrimaryCtxRetain_)(void **, int);
static int (*cuCtxSetCurrent_)(void *);
static int (*cuMemAlloc_)(unsigned long long *, size_t);
static int (*cuMemFree_)(unsigned long long);
static int (*cuMemcpyHtoD_)(unsigned long long, const void *, size_t);
static int (*cuMemcpyDtoH_)(void *, unsigned long long, size_t);
static int (*cuMemcpyDtoDAsync_)(unsigned long long, unsigned long long, size_t, void *);
static int (*cuStreamSynchronize_)(void *);

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static int cmpd(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#define CU(call)                                                                         \
    do {                                                                                 \
        int e_ = (call);                                                                 \
        if (e_) {                                                                        \
            printf("FAIL %s: CUresult %d\n", #call, e_);                                 \
            return 1;                                                                    \
        }                                                                                \
    } while (0)

int main(int argc, char **argv)
{
    size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 256;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        printf("skipped: no CUDA driver (libcuda.so.1)\n");
        return 77;
    }
#define L(v, n) *(void **)&v = dlsym(h, n)
    L(cuInit_, "cuInit");
    L(cuDeviceGetCount_, "cuDeviceGetCount");
    L(cuDeviceGet_, "cuDeviceGet");
    L(cuDevicePrimaryCtxRetain_, "cuDevicePrimaryCtxRetain");
    L(cuCtxSetCurrent_, "cuCtxSetCurrent");
    L(cuMemAlloc_, "cuMemAlloc_v2");
    L(cuMemFree_, "cuMemFree_v2");
    L(cuMemcpyHtoD_, "cuMemcpyHtoD_v2");
    L(cuMemcpyDtoH_, "cuMemcpyDtoH_v2");
    L(cuMemcpyDtoDAsync_, "cuMemcpyDtoDAsync_v2");
    L(cuStreamSynchronize_, "cuStreamSynchronize");
#undef L
    int ndev = 0;
    if (!cuInit_ || !cuDeviceGetCount_ || !cuMemcpyDtoDAsync_ || !cuStreamSynchronize_ ||
        cuInit_(0) || cuDeviceGetCount_(&ndev) || ndev < 1) {
        printf("skipped: no GPU\n");
        return 77;
    }
    int dev;
    void *ctx;
    CU(cuDeviceGet_(&dev, 0));
    CU(cuDevicePrimaryCtxRetain_(&ctx, dev));
    CU(cuCtxSetCurrent_(ctx));
    loom_comm_t comm;
    int rank, n;
    mp_join(&comm, &rank, &n);
    loom_result_t r;
    const size_t bytes = mib << 20, count = bytes / 4;
    float *host = malloc(bytes);
    for (size_t i = 0; i < count; i++) host[i] = (float)(rank + 1) + (float)(i % 1024);
    unsigned long long sb, rb;
    CU(cuMemAlloc_(&sb, bytes));
    CU(cuMemAlloc_(&rb, bytes));
    CU(cuMemcpyHtoD_(sb, host, bytes));
    enum { REPS = 10 };
    double t[REPS];
    int fails = 0;
    for (int rep = -2; rep < REPS; rep++) { /* two warm-ups: the mappings are opened */
        loom_barrier(comm);
        double t0 = now();
        r = loom_allreduce((void *)(uintptr_t)sb, (void *)(uintptr_t)rb, count, LOOM_FLOAT32,
                           LOOM_SUM, comm);
        double dt = now() - t0;
        if (r != LOOM_SUCCESS) {
            printf("FAIL rank %d allreduce: %s\n", rank, loom_get_last_error());
            return 1;
        }
        if (rep >= 0) t[rep] = dt;
    }
    CU(cuMemcpyDtoH_(host, rb, bytes));
    const float tri = (float)n * (float)(n + 1) / 2;
    for (size_t i = 0; i < count; i += 4099)
        if (host[i] != tri + (float)n * (float)(i % 1024)) {
            printf("FAIL rank %d: [%zu] = %g, expected %g\n", rank, i, host[i],
                   tri + (float)n * (float)(i % 1024));
            fails++;
            break;
        }
    /* The bound: a device-to-device copy of the same bytes, timed on
     * rank 0 alone while the others wait. */
    double c[REPS];
    loom_barrier(comm);
    if (rank == 0)
        for (int rep = -1; rep < REPS; rep++) {
            double t0 = now();
            CU(cuMemcpyDtoDAsync_(rb, sb, bytes, NULL));
            CU(cuStreamSynchronize_(NULL));
            if (rep >= 0) c[rep] = now() - t0;
        }
    loom_barrier(comm);
    if (rank == 0) {
        qsort(t, REPS, sizeof *t, cmpd);
        qsort(c, REPS, sizeof *c, cmpd);
        double ta = t[REPS / 2], tc = c[REPS / 2];
        double busbw = 2.0 * (n - 1) / n * (double)bytes / ta / 1e9;
        double copy = 2.0 * (double)bytes / tc / 1e9; /* read + write */
        double moved = (3.0 * n - 1) * (double)bytes / ta / 1e9;
        printf("bench allreduce-ipc fp32 %zu MiB, %d ranks on one GPU: %.3f ms, busbw %.1f "
               "GB/s; DtoD copy %.3f ms (%.0f GB/s moved); the allreduce moves %.0f GB/s, "
               "%.0f%% of the copy's\n",
               mib, n, ta * 1e3, busbw, tc * 1e3, copy, moved, 100 * moved / copy);
    }
    cuMemFree_(sb);
    cuMemFree_(rb);
    loom_comm_destroy(comm);
    free(host);
    if (!fails && rank == 0) printf("ok   allreduce-ipc result\n");
    return fails ? 1 : 0;
}
