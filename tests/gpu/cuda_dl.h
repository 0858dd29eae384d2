/*
 * cuda_dl.h - the CUDA driver calls of the GPU tests (mp_devbuf.c,
 * mp_devpeer.c, mp_gpu.c), found with dlsym in libcuda.so.1: CUDA's own
 * driver on a GPU machine, or tests/gpu/cuda_fake.c standing in for it.
 * No CUDA header or library is needed to build them.
 *
 * cuda_load(): 0 when libcuda.so.1 opens and has every cu_* call below,
 * else -1.  The fake_* calls, tests/gpu/cuda_fake.c's own, are looked up
 * too: NULL with a real driver.
 * cuda_load_fake(): cuda_load(), and libcuda.so.1 is the fake: 0 when
 * every fake_* call is there too, else -1.
 */
#ifndef LOOM_TESTS_GPU_CUDA_DL_H
#define LOOM_TESTS_GPU_CUDA_DL_H

#include <dlfcn.h>
#include <stddef.h>

static int (*cu_init)(unsigned);
static int (*cu_device_get)(int *, int);
static int (*cu_ctx_retain)(void **, int);
static int (*cu_ctx_set)(void *);
static int (*cu_alloc)(unsigned long long *, size_t);
static int (*cu_free)(unsigned long long);
static int (*cu_dtoh)(void *, unsigned long long, size_t);
static int (*cu_htod)(unsigned long long, const void *, size_t);
static int (*cu_htod_async)(unsigned long long, const void *, size_t, void *);
static int (*cu_stream_create)(void **, unsigned);
static int (*cu_stream_sync)(void *);

static long (*fake_count)(const char *);
static long (*fake_syncs)(void *);
static int (*fake_queued)(void *);
static int (*fake_oplog)(int, char *, unsigned long long *, size_t *);
static void (*fake_oplog_reset)(void);
static void (*fake_fail_htod_async)(int);
static void (*fake_copy_us)(long);
static void (*fake_hold_event)(int);

static inline int cuda_load(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) return -1;
#define L(v, n) *(void **)&v = dlsym(h, n)
    L(cu_init, "cuInit");
    L(cu_device_get, "cuDeviceGet");
    L(cu_ctx_retain, "cuDevicePrimaryCtxRetain");
    L(cu_ctx_set, "cuCtxSetCurrent");
    L(cu_alloc, "cuMemAlloc_v2");
    L(cu_free, "cuMemFree_v2");
    L(cu_dtoh, "cuMemcpyDtoH_v2");
    L(cu_htod, "cuMemcpyHtoD_v2");
    L(cu_htod_async, "cuMemcpyHtoDAsync_v2");
    L(cu_stream_create, "cuStreamCreate");
    L(cu_stream_sync, "cuStreamSynchronize");
    L(fake_count, "fake_cuda_count");
    L(fake_syncs, "fake_cuda_syncs");
    L(fake_queued, "fake_cuda_queued");
    L(fake_oplog, "fake_cuda_oplog");
    L(fake_oplog_reset, "fake_cuda_oplog_reset");
    L(fake_fail_htod_async, "fake_cuda_fail_htod_async");
    L(fake_copy_us, "fake_cuda_copy_us");
    L(fake_hold_event, "fake_cuda_hold_event");
#undef L
    return cu_init && cu_device_get && cu_ctx_retain && cu_ctx_set && cu_alloc && cu_free &&
                   cu_dtoh && cu_htod && cu_htod_async && cu_stream_create && cu_stream_sync
               ? 0
               : -1;
}

static inline int cuda_load_fake(void)
{
    if (cuda_load()) return -1;
    return fake_count && fake_syncs && fake_queued && fake_oplog && fake_oplog_reset &&
                   fake_fail_htod_async && fake_copy_us && fake_hold_event
               ? 0
               : -1;
}

#endif
