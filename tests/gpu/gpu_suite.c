/*
 * gpu_suite.c - the CUDA device kernels on a real GPU (run by
 * tests/gpu/run_on_gpu.sh and in make check): the driver loads, devices
 * are counted, the embedded kernels load, and the device reduction of
 * every datatype x op (sum, prod, max, min, avg) matches the CPU kernels
 * bit for bit (NaN by NaN-ness); then the throughput of a device
 * reduction against cuMemcpyDtoD of the same bytes.  Exits 77 (skipped)
 * where there is no driver or no GPU, or the build has no kernels.
 *
 * Also the many-input kernels of the device-direct allreduce
 * (loomi_cuda_reduce_n).  tests/gpu/cuda_fake.c runs it too, without a
 * GPU: LD_LIBRARY_PATH=<dir of the fake's libcuda.so.1> gpu_suite quick.
 * `gpu_suite quick` skips the throughput.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cuda.h"
#include "loom.h"
#include "reduce/reduce.h"
#include "reduce/reduce_cuda.h"

static int fails, passes;
static const struct loomi_cuda_drv *cu;

#define CUOK(call)                                                                       \
    do {                                                                                 \
        loomi_cu_t e_ = (call);                                                          \
        if (e_ != 0) {                                                                   \
            printf("FAIL %s: %s\n", #call, loomi_cuda_strerror(e_));                     \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

static void truth(int cond, const char *fmt, const char *a, const char *b)
{
    char line[256];
    snprintf(line, sizeof line, fmt, a, b);
    printf("%s %s\n", cond ? "ok  " : "FAIL", line);
    if (cond) passes++;
    else fails++;
}

static uint64_t rng = 88172645463325252ull;
static uint64_t next(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}

static const char *const tname[] = {"int8",    "uint8",   "int32", "uint32",  "int64",
                                    "uint64",  "float16", "float32", "float64", "bfloat16"};
static const char *const oname[] = {"sum", "prod", "max", "min", "avg"};

/* Values for float types: specials first (±0, ±inf, NaN, a subnormal),
 * then random ones in a range where prod neither overflows nor
 * underflows at once. */
static double fval(size_t i, int which)
{
    static const double sp[] = {0.0, -0.0, INFINITY, -INFINITY, NAN, 1e-40, -0.0, 0.0};
    if (i < 8) return sp[(i + (size_t)which * 3) % 8];
    return ((double)(next() % 2000001) - 1000000.0) / 1000.0 * ((next() & 1) ? 1 : 1e-3);
}

static void fill(void *p, size_t n, loom_datatype_t t, int which)
{
    for (size_t i = 0; i < n; i++) {
        double v = fval(i, which);
        uint64_t r = next();
        switch (t) {
        case LOOM_FLOAT16: ((uint16_t *)p)[i] = loomi_fp32_to_fp16((float)v); break;
        case LOOM_BFLOAT16: ((uint16_t *)p)[i] = loomi_fp32_to_bf16((float)v); break;
        case LOOM_FLOAT32: ((float *)p)[i] = (float)v; break;
        case LOOM_FLOAT64: ((double *)p)[i] = v; break;
        default: memcpy((char *)p + i * loom_datatype_size(t), &r, loom_datatype_size(t));
        }
    }
}

static int isnan_at(const void *p, size_t i, loom_datatype_t t)
{
    switch (t) {
    case LOOM_FLOAT16: return isnan(loomi_fp16_to_fp32(((const uint16_t *)p)[i]));
    case LOOM_BFLOAT16: return isnan(loomi_bf16_to_fp32(((const uint16_t *)p)[i]));
    case LOOM_FLOAT32: return isnan(((const float *)p)[i]);
    case LOOM_FLOAT64: return isnan(((const double *)p)[i]);
    default: return 0;
    }
}

/* Index of the first element that differs, or n. */
static size_t first_diff(const void *a, const void *b, size_t n, loom_datatype_t t)
{
    size_t es = loom_datatype_size(t);
    for (size_t i = 0; i < n; i++) {
        if (!memcmp((const char *)a + i * es, (const char *)b + i * es, es)) continue;
        if (isnan_at(a, i, t) && isnan_at(b, i, t)) continue;
        return i;
    }
    return n;
}

static void correctness(const struct loomi_cuda_dev *d)
{
    const size_t n = 100003; /* odd, several blocks */
    void *a = malloc(n * 8), *b = malloc(n * 8), *ref = malloc(n * 8), *got = malloc(n * 8);
    loomi_cuptr_t da, db;
    CUOK(cu->MemAlloc(&da, n * 8));
    CUOK(cu->MemAlloc(&db, n * 8));
    for (int t = 0; t < LOOM_NUM_DATATYPES; t++) {
        size_t bytes = n * loom_datatype_size((loom_datatype_t)t);
        for (int o = 0; o < LOOM_NUM_OPS; o++) {
            fill(a, n, (loom_datatype_t)t, 0);
            fill(b, n, (loom_datatype_t)t, 1);
            CUOK(cu->MemcpyHtoD(da, a, bytes));
            CUOK(cu->MemcpyHtoD(db, b, bytes));
            memcpy(ref, a, bytes);
            loomi_reduce_inplace(ref, b, n, (loom_datatype_t)t, (loom_op_t)o);
            loom_result_t r =
                loomi_cuda_reduce(d, da, db, n, (loom_datatype_t)t, (loom_op_t)o, NULL);
            if (r == LOOM_SUCCESS && o == LOOM_AVG) {
                loomi_reduce_finish_avg(ref, n, (loom_datatype_t)t, 3);
                r = loomi_cuda_finish_avg(d, da, n, (loom_datatype_t)t, 3, NULL);
            }
            if (r != LOOM_SUCCESS) {
                truth(0, "%s %s: launch", tname[t], oname[o]);
                printf("     %s\n", loom_get_last_error());
                continue;
            }
            CUOK(cu->StreamSynchronize(NULL));
            CUOK(cu->MemcpyDtoH(got, da, bytes));
            size_t i = first_diff(ref, got, n, (loom_datatype_t)t);
            truth(i == n, "device %s %s matches the CPU kernels", tname[t], oname[o]);
            if (i != n) printf("     first difference at element %zu\n", i);
        }
    }
    /* The many-input kernels of the device-direct allreduce
     * (loomi_cuda_reduce_n): three inputs, the result over the second
     * (in place), against the CPU kernels applied in input order. */
    void *c = malloc(n * 8);
    loomi_cuptr_t dc;
    CUOK(cu->MemAlloc(&dc, n * 8));
    for (int t = 0; t < LOOM_NUM_DATATYPES; t++) {
        size_t bytes = n * loom_datatype_size((loom_datatype_t)t);
        for (int o = 0; o < 4; o++) {
            fill(a, n, (loom_datatype_t)t, 0);
            fill(b, n, (loom_datatype_t)t, 1);
            fill(c, n, (loom_datatype_t)t, 2);
            CUOK(cu->MemcpyHtoD(da, a, bytes));
            CUOK(cu->MemcpyHtoD(db, b, bytes));
            CUOK(cu->MemcpyHtoD(dc, c, bytes));
            memcpy(ref, a, bytes);
            loomi_reduce_inplace(ref, b, n, (loom_datatype_t)t, (loom_op_t)o);
            loomi_reduce_inplace(ref, c, n, (loom_datatype_t)t, (loom_op_t)o);
            const loomi_cuptr_t in[3] = {da, db, dc};
            loom_result_t r =
                loomi_cuda_reduce_n(d, db, in, 3, n, (loom_datatype_t)t, (loom_op_t)o, NULL);
            if (r != LOOM_SUCCESS) {
                truth(0, "%s %s: launch of the 3-input kernel", tname[t], oname[o]);
                printf("     %s\n", loom_get_last_error());
                continue;
            }
            CUOK(cu->StreamSynchronize(NULL));
            CUOK(cu->MemcpyDtoH(got, db, bytes));
            size_t i = first_diff(ref, got, n, (loom_datatype_t)t);
            truth(i == n, "device %s %s of 3 inputs matches the CPU kernels", tname[t], oname[o]);
            if (i != n) printf("     first difference at element %zu\n", i);
        }
    }
    CUOK(cu->MemFree(dc));
    free(c);
    truth(loomi_cuda_reduce(d, da, db, n, LOOM_FLOAT32, LOOM_NUM_OPS, NULL) ==
              LOOM_ERR_INVALID_ARGUMENT,
          "an invalid op is refused%s%s", "", "");
    truth(loomi_cuda_reduce(d, da, db, n, LOOM_NUM_DATATYPES, LOOM_SUM, NULL) ==
              LOOM_ERR_INVALID_ARGUMENT,
          "an invalid dtype is refused%s%s", "", "");
    CUOK(cu->MemFree(da));
    CUOK(cu->MemFree(db));
    free(a), free(b), free(ref), free(got);
}

static int cmpf(const void *x, const void *y)
{
    float a = *(const float *)x, b = *(const float *)y;
    return (a > b) - (a < b);
}

/* Median milliseconds of `reps` timed runs of the reduction (red) or of
 * cuMemcpyDtoDAsync of the same bytes, interleaved. */
static void throughput(const struct loomi_cuda_dev *d, loom_datatype_t t, size_t bytes)
{
    enum { REPS = 15 };
    size_t n = bytes / loom_datatype_size(t);
    loomi_cuptr_t x, y;
    loomi_cuh_t s, e0, e1;
    CUOK(cu->MemAlloc(&x, bytes));
    CUOK(cu->MemAlloc(&y, bytes));
    CUOK(cu->StreamCreate(&s, 0));
    CUOK(cu->EventCreate(&e0, 0));
    CUOK(cu->EventCreate(&e1, 0));
    float red[REPS], cpy[REPS];
    for (int rep = -1; rep < REPS; rep++) { /* rep -1 warms up */
        float ms;
        CUOK(cu->EventRecord(e0, s));
        if (loomi_cuda_reduce(d, x, y, n, t, LOOM_SUM, s) != LOOM_SUCCESS) {
            printf("FAIL reduce: %s\n", loom_get_last_error());
            exit(1);
        }
        CUOK(cu->EventRecord(e1, s));
        CUOK(cu->EventSynchronize(e1));
        CUOK(cu->EventElapsedTime(&ms, e0, e1));
        if (rep >= 0) red[rep] = ms;
        CUOK(cu->EventRecord(e0, s));
        CUOK(cu->MemcpyDtoDAsync(x, y, bytes, s));
        CUOK(cu->EventRecord(e1, s));
        CUOK(cu->EventSynchronize(e1));
        CUOK(cu->EventElapsedTime(&ms, e0, e1));
        if (rep >= 0) cpy[rep] = ms;
    }
    qsort(red, REPS, sizeof *red, cmpf);
    qsort(cpy, REPS, sizeof *cpy, cmpf);
    double mr = red[REPS / 2], mc = cpy[REPS / 2], gb = (double)bytes / 1e9;
    /* Bytes moved: the reduction reads 2 and writes 1, the copy reads 1
     * and writes 1. */
    printf("bench %-8s sum %6zu MiB: reduce %.3f ms (%.0f GB/s of dst, %.0f GB/s moved), "
           "DtoD copy %.3f ms (%.0f GB/s moved); reduce/copy time %.2f\n",
           tname[t], bytes >> 20, mr, gb / (mr / 1e3), 3 * gb / (mr / 1e3), mc,
           2 * gb / (mc / 1e3), mr / mc);
    cu->EventDestroy(e0), cu->EventDestroy(e1), cu->StreamDestroy(s);
    cu->MemFree(x), cu->MemFree(y);
}

int main(int argc, char **argv)
{
    const int quick = argc > 1 && !strcmp(argv[1], "quick");
    struct loomi_cuda_dev d;
    loom_result_t r = loomi_cuda_open(&d, 0);
    if (r == LOOM_ERR_UNSUPPORTED) {
        printf("skipped: %s\n", loom_get_last_error());
        return 77;
    }
    if (r != LOOM_SUCCESS) {
        printf("FAIL open device 0: %s\n", loom_get_last_error());
        return 1;
    }
    cu = loomi_cuda_driver();
    int ver = 0, ndev = 0;
    CUOK(cu->DriverGetVersion(&ver));
    CUOK(cu->DeviceGetCount(&ndev));
    printf("gpu: %s (sm_%d%d), %d device%s, CUDA driver API %d.%d\n", d.name, d.cc_major,
           d.cc_minor, ndev, ndev == 1 ? "" : "s", ver / 1000, ver % 1000 / 10);
    truth(ndev >= 1 && d.mod != NULL, "driver loaded, %s%s, kernels loaded", d.name, "");
    /* A device buffer at the collectives' door, now the driver is
     * initialised. */
    loomi_cuptr_t p;
    CUOK(cu->MemAlloc(&p, 4096));
    truth(loomi_mem_kind((void *)(uintptr_t)p) == LOOMI_MEM_DEVICE,
          "cuMemAlloc memory is device memory%s%s", "", "");
    loomi_cuptr_t m;
    CUOK(cu->MemAllocManaged(&m, 4096, LOOMI_CU_MEM_ATTACH_GLOBAL));
    truth(loomi_mem_kind((void *)(uintptr_t)m) == LOOMI_MEM_MANAGED,
          "cuMemAllocManaged memory is managed memory%s%s", "", "");
    static float host[1024];
    truth(loomi_mem_kind(host) == LOOMI_MEM_HOST, "static memory is host memory%s%s", "", "");
    loom_unique_id_t id;
    loom_comm_t comm;
    if (loom_get_unique_id(&id) == LOOM_SUCCESS &&
        loom_comm_init_rank(&comm, 1, &id, 0, NULL) == LOOM_SUCCESS) {
        r = loom_allreduce((void *)(uintptr_t)p, host, 1024, LOOM_FLOAT32, LOOM_SUM, comm);
        /* Staged through host memory (src/comm/devbuf.c). */
        truth(r == LOOM_SUCCESS, "loom_allreduce takes a device sendbuf: %s%s",
              r == LOOM_SUCCESS ? "" : loom_get_last_error(), "");
        r = loom_allreduce(host, (void *)(uintptr_t)m, 1024, LOOM_FLOAT32, LOOM_SUM, comm);
        truth(r == LOOM_SUCCESS, "... and takes a managed recvbuf%s%s", "", "");
        loom_comm_destroy(comm);
    } else {
        truth(0, "one-rank communicator: %s%s", loom_get_last_error(), "");
    }
    cu->MemFree(p), cu->MemFree(m);
    correctness(&d);
    if (!quick) {
        throughput(&d, LOOM_FLOAT32, (size_t)256 << 20);
        throughput(&d, LOOM_BFLOAT16, (size_t)256 << 20);
        throughput(&d, LOOM_FLOAT32, (size_t)4 << 20);
    }
    loomi_cuda_close(&d);
    printf("%d passed, %d failed\n", passes, fails);
    return fails ? 1 : 0;
}
