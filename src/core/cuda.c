/*
 * cuda.c - CUDA's driver, loaded at run time (cuda.h), and what memory a
 * pointer is.
 */
#include "config.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

#include "core/cuda.h"
#include "core/internal.h"

static struct loomi_cuda_drv drv;
static int loaded, full, ipc;
static char why[256];
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void load(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(why, sizeof why, "no CUDA driver (libcuda.so.1 not found)");
        LOOMI_INFO(-1, "%s: every buffer is host memory", why);
        return;
    }
    /* Names with a version suffix are the ones cuda.h maps the plain
     * names to; the suffix-less symbols are older ABIs. */
    static const struct {
        size_t off;
        const char *name;
    } syms[] = {
#define S(m, n) {offsetof(struct loomi_cuda_drv, m), n}
        S(PointerGetAttribute, "cuPointerGetAttribute"),
        S(Init, "cuInit"),
        S(DriverGetVersion, "cuDriverGetVersion"),
        S(GetErrorString, "cuGetErrorString"),
        S(DeviceGetCount, "cuDeviceGetCount"),
        S(DeviceGet, "cuDeviceGet"),
        S(DeviceGetName, "cuDeviceGetName"),
        S(DeviceGetAttribute, "cuDeviceGetAttribute"),
        S(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
        S(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"),
        S(CtxSetCurrent, "cuCtxSetCurrent"),
        S(MemAlloc, "cuMemAlloc_v2"),
        S(MemAllocManaged, "cuMemAllocManaged"),
        S(MemFree, "cuMemFree_v2"),
        S(MemcpyHtoD, "cuMemcpyHtoD_v2"),
        S(MemcpyDtoH, "cuMemcpyDtoH_v2"),
        S(MemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2"),
        S(ModuleLoadData, "cuModuleLoadData"),
        S(ModuleUnload, "cuModuleUnload"),
        S(ModuleGetFunction, "cuModuleGetFunction"),
        S(LaunchKernel, "cuLaunchKernel"),
        S(StreamCreate, "cuStreamCreate"),
        S(StreamDestroy, "cuStreamDestroy_v2"),
        S(StreamSynchronize, "cuStreamSynchronize"),
        S(EventCreate, "cuEventCreate"),
        S(EventRecord, "cuEventRecord"),
        S(EventSynchronize, "cuEventSynchronize"),
        S(EventElapsedTime, "cuEventElapsedTime"),
        S(EventDestroy, "cuEventDestroy_v2"),
        S(MemAllocHost, "cuMemAllocHost_v2"),
        S(MemFreeHost, "cuMemFreeHost"),
#define NFULL 31 /* the ones above; those below are optional */
        S(IpcGetMemHandle, "cuIpcGetMemHandle"),
        S(IpcOpenMemHandle, "cuIpcOpenMemHandle_v2"),
        S(IpcCloseMemHandle, "cuIpcCloseMemHandle"),
        S(MemGetAddressRange, "cuMemGetAddressRange_v2"),
#define NIPC (NFULL + 4) /* the IPC ones; after them: the pipeline's */
        S(MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"),
        S(MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"),
        S(EventQuery, "cuEventQuery"),
        S(MemGetHandleForAddressRange, "cuMemGetHandleForAddressRange"),
        S(Memcpy, "cuMemcpy"),
#undef S
    };
    _Static_assert(offsetof(struct loomi_cuda_drv, IpcGetMemHandle) ==
                       NFULL * sizeof(void *),
                   "NFULL counts the required functions");
    full = 1;
    ipc = 1;
    for (size_t i = 0; i < LOOMI_ARRAY_LEN(syms); i++) {
        void *f = dlsym(h, syms[i].name);
        /* cuIpcOpenMemHandle_v2 is CUDA 11's name; older drivers have
         * the unversioned one, with the same arguments. */
        if (!f && i == NFULL + 1) f = dlsym(h, "cuIpcOpenMemHandle");
        if (!f) {
            if (i < NFULL) full = 0;
            else if (i < NIPC) ipc = 0;
        }
        *(void **)((char *)&drv + syms[i].off) = f;
    }
    if (!drv.PointerGetAttribute) {
        snprintf(why, sizeof why, "libcuda.so.1 has no cuPointerGetAttribute");
        full = 0;
        dlclose(h);
        return;
    }
    loaded = 1;
    LOOMI_INFO(-1, "CUDA driver loaded (libcuda.so.1%s)",
               full ? "" : "; some functions missing: no device kernels");
}

const struct loomi_cuda_drv *loomi_cuda_driver(void)
{
    pthread_once(&once, load);
    return loaded ? &drv : NULL;
}

int loomi_cuda_full(void)
{
    return loomi_cuda_driver() && full;
}

int loomi_cuda_ipc(void)
{
    return loomi_cuda_full() && ipc;
}

const char *loomi_cuda_why(void)
{
    pthread_once(&once, load);
    return why;
}

int loomi_cuda_built(void)
{
#ifdef HAVE_CUDA
    return 1;
#else
    return 0;
#endif
}

const char *loomi_cuda_strerror(loomi_cu_t e)
{
    static _Thread_local char buf[32];
    const char *s = NULL;
    const struct loomi_cuda_drv *d = loomi_cuda_driver();
    if (d && d->GetErrorString && d->GetErrorString(e, &s) == 0 && s) return s;
    snprintf(buf, sizeof buf, "CUresult %d", e);
    return buf;
}

enum loomi_mem_kind loomi_mem_kind(const void *p)
{
    const struct loomi_cuda_drv *d = loomi_cuda_driver();
    if (!d || !p) return LOOMI_MEM_HOST;
    loomi_cuptr_t a = (loomi_cuptr_t)(uintptr_t)p;
    unsigned int type = 0, managed = 0;
    /* Pageable host memory gives CUDA_ERROR_INVALID_VALUE; an
     * uninitialised driver CUDA_ERROR_NOT_INITIALIZED: host either way. */
    if (d->PointerGetAttribute(&type, LOOMI_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, a) != 0 ||
        type != LOOMI_CU_MEMORYTYPE_DEVICE)
        return LOOMI_MEM_HOST;
    if (d->PointerGetAttribute(&managed, LOOMI_CU_POINTER_ATTRIBUTE_IS_MANAGED, a) == 0 &&
        managed)
        return LOOMI_MEM_MANAGED;
    return LOOMI_MEM_DEVICE;
}

const char *loomi_mem_kind_name(enum loomi_mem_kind k)
{
    return k == LOOMI_MEM_DEVICE ? "device" : k == LOOMI_MEM_MANAGED ? "managed" : "host";
}

int loomi_cuda_dmabuf(const void *p, size_t len, int *fd, size_t *off, char *why, size_t n)
{
    *fd = -1;
    *off = 0;
    const struct loomi_cuda_drv *d = loomi_cuda_driver();
    if (!d) {
        snprintf(why, n, "%s", loomi_cuda_why());
        return -1;
    }
    if (!p || !len || (uintptr_t)p + len < (uintptr_t)p) {
        snprintf(why, n, "the range %p + %zu is empty or wraps", p, len);
        return -1;
    }
    if (loomi_mem_kind(p) != LOOMI_MEM_DEVICE) {
        snprintf(why, n, "%p is not CUDA device memory", p);
        return -1;
    }
    if (!d->MemGetHandleForAddressRange || !d->MemGetAddressRange) {
        snprintf(why, n, "the CUDA driver lacks %s (CUDA 11.7 or later has it)",
                 d->MemGetHandleForAddressRange ? "cuMemGetAddressRange"
                                                : "cuMemGetHandleForAddressRange");
        return -1;
    }
    const loomi_cuptr_t a = (loomi_cuptr_t)(uintptr_t)p;
    int ordinal = -1, ok = 0;
    loomi_cu_t e = d->PointerGetAttribute(&ordinal, LOOMI_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, a);
    if (e == 0 && d->DeviceGetAttribute)
        e = d->DeviceGetAttribute(&ok, LOOMI_CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, ordinal);
    if (e != 0) {
        snprintf(why, n, "cannot ask the driver whether device %d supports dmabuf: %s", ordinal,
                 loomi_cuda_strerror(e));
        return -1;
    }
    if (!ok) {
        snprintf(why, n,
                 "device %d does not support dmabuf (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED is 0: "
                 "an older GPU, driver or kernel, or the proprietary module without it)",
                 ordinal);
        return -1;
    }
    loomi_cuptr_t base = 0;
    size_t size = 0;
    if ((e = d->MemGetAddressRange(&base, &size, a)) != 0) {
        snprintf(why, n, "cuMemGetAddressRange(%p): %s", p, loomi_cuda_strerror(e));
        return -1;
    }
    long pg = sysconf(_SC_PAGESIZE);
    const loomi_cuptr_t page = pg > 0 ? (loomi_cuptr_t)pg : 4096;
    const loomi_cuptr_t lo = a & ~(page - 1);
    const loomi_cuptr_t end = a + len;
    if (end < a || end > base + size || end + page - 1 < end) {
        snprintf(why, n, "%p + %zu runs past its allocation", p, len);
        return -1;
    }
    const loomi_cuptr_t hi = (end + page - 1) & ~(page - 1);
    /* Allocations are page-aligned and whole pages in practice; one that
     * is not cannot be exported around this range. */
    if (lo < base || hi > ((base + size + page - 1) & ~(page - 1))) {
        snprintf(why, n, "%p + %zu widened to whole pages leaves its allocation", p, len);
        return -1;
    }
    int h = -1;
    e = d->MemGetHandleForAddressRange(&h, lo, (size_t)(hi - lo),
                                       LOOMI_CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
    if (e != 0 || h < 0) {
        if (h >= 0) close(h);
        snprintf(why, n, "cuMemGetHandleForAddressRange(%p, %llu bytes): %s", (void *)(uintptr_t)lo,
                 (unsigned long long)(hi - lo), e ? loomi_cuda_strerror(e) : "no descriptor");
        return -1;
    }
    *fd = h;
    *off = (size_t)(a - lo);
    return 0;
}

int loomi_cuda_copy(void *dst, const void *src, size_t n, char *why, size_t wn)
{
    const struct loomi_cuda_drv *d = loomi_cuda_driver();
    if (!n) return 0;
    if (!d || !d->Memcpy) {
        snprintf(why, wn, "the CUDA driver lacks cuMemcpy");
        return -1;
    }
    loomi_cu_t e = d->Memcpy((loomi_cuptr_t)(uintptr_t)dst, (loomi_cuptr_t)(uintptr_t)src, n);
    if (e) {
        snprintf(why, wn, "cuMemcpy of %zu bytes: %s", n, loomi_cuda_strerror(e));
        return -1;
    }
    return 0;
}
