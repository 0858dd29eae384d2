/*
 * cuda.h - CUDA's driver (libcuda.so.1), loaded at run time: libloom
 * links no CUDA library, so one build runs where there is no GPU and no
 * driver.  The types and values are those of cuda.h, declared here so
 * that this file builds without CUDA's headers.
 *
 * The driver is loaded on first use (dlopen, once per process) and never
 * initialised here: loomi_mem_kind asks it about pointers only, and a
 * driver the application has not initialised (cuInit) answers with an
 * error, so its process has no device memory yet.  Code that runs work
 * on a device (src/reduce/reduce_cuda.c) calls cuInit itself.
 */
#ifndef LOOMI_CUDA_H
#define LOOMI_CUDA_H

#include <stddef.h>

typedef int loomi_cu_t;                 /* CUresult: 0 is CUDA_SUCCESS */
typedef unsigned long long loomi_cuptr_t; /* CUdeviceptr */
typedef void *loomi_cuh_t;              /* CUcontext, CUmodule, CUfunction, CUstream, CUevent */

enum {
    LOOMI_CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
    LOOMI_CU_POINTER_ATTRIBUTE_IS_MANAGED = 8,
    LOOMI_CU_MEMORYTYPE_DEVICE = 2,
    LOOMI_CU_DEVICE_ATTRIBUTE_CC_MAJOR = 75,
    LOOMI_CU_DEVICE_ATTRIBUTE_CC_MINOR = 76,
    LOOMI_CU_MEM_ATTACH_GLOBAL = 1,
    LOOMI_CU_POINTER_ATTRIBUTE_BUFFER_ID = 7,
    LOOMI_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
    LOOMI_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1,
    LOOMI_CU_IPC_HANDLE_SIZE = 64,
    LOOMI_CU_STREAM_NON_BLOCKING = 1,
    LOOMI_CU_EVENT_DISABLE_TIMING = 2,
    LOOMI_CUDA_ERROR_NOT_READY = 600,
    /* GPUDirect RDMA: device memory exported as a dmabuf (CUDA 11.7+). */
    LOOMI_CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 124,
    LOOMI_CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD = 1
};

/* CUipcMemHandle: 64 opaque bytes, passed by value. */
typedef struct {
    char reserved[LOOMI_CU_IPC_HANDLE_SIZE];
} loomi_cu_ipc_t;

/* The driver's functions.  cuPointerGetAttribute is the one that must be
 * there for the driver to count as loaded; the others are NULL where the
 * library lacks them (loomi_cuda_full says whether all are there). */
struct loomi_cuda_drv {
    loomi_cu_t (*PointerGetAttribute)(void *data, int attr, loomi_cuptr_t p);
    loomi_cu_t (*Init)(unsigned flags);
    loomi_cu_t (*DriverGetVersion)(int *v);
    loomi_cu_t (*GetErrorString)(loomi_cu_t e, const char **s);
    loomi_cu_t (*DeviceGetCount)(int *n);
    loomi_cu_t (*DeviceGet)(int *dev, int ordinal);
    loomi_cu_t (*DeviceGetName)(char *name, int len, int dev);
    loomi_cu_t (*DeviceGetAttribute)(int *v, int attr, int dev);
    loomi_cu_t (*DevicePrimaryCtxRetain)(loomi_cuh_t *ctx, int dev);
    loomi_cu_t (*DevicePrimaryCtxRelease)(int dev);
    loomi_cu_t (*CtxSetCurrent)(loomi_cuh_t ctx);
    loomi_cu_t (*MemAlloc)(loomi_cuptr_t *p, size_t bytes);
    loomi_cu_t (*MemAllocManaged)(loomi_cuptr_t *p, size_t bytes, unsigned flags);
    loomi_cu_t (*MemFree)(loomi_cuptr_t p);
    loomi_cu_t (*MemcpyHtoD)(loomi_cuptr_t dst, const void *src, size_t bytes);
    loomi_cu_t (*MemcpyDtoH)(void *dst, loomi_cuptr_t src, size_t bytes);
    loomi_cu_t (*MemcpyDtoDAsync)(loomi_cuptr_t dst, loomi_cuptr_t src, size_t bytes,
                                  loomi_cuh_t stream);
    loomi_cu_t (*ModuleLoadData)(loomi_cuh_t *mod, const void *image);
    loomi_cu_t (*ModuleUnload)(loomi_cuh_t mod);
    loomi_cu_t (*ModuleGetFunction)(loomi_cuh_t *fn, loomi_cuh_t mod, const char *name);
    loomi_cu_t (*LaunchKernel)(loomi_cuh_t fn, unsigned gx, unsigned gy, unsigned gz,
                               unsigned bx, unsigned by, unsigned bz, unsigned shmem,
                               loomi_cuh_t stream, void **params, void **extra);
    loomi_cu_t (*StreamCreate)(loomi_cuh_t *s, unsigned flags);
    loomi_cu_t (*StreamDestroy)(loomi_cuh_t s);
    loomi_cu_t (*StreamSynchronize)(loomi_cuh_t s);
    loomi_cu_t (*EventCreate)(loomi_cuh_t *e, unsigned flags);
    loomi_cu_t (*EventRecord)(loomi_cuh_t e, loomi_cuh_t s);
    loomi_cu_t (*EventSynchronize)(loomi_cuh_t e);
    loomi_cu_t (*EventElapsedTime)(float *ms, loomi_cuh_t start, loomi_cuh_t end);
    loomi_cu_t (*EventDestroy)(loomi_cuh_t e);
    /* Pinned host memory: the staging buffers of device collectives
     * (src/comm/devbuf.c). */
    loomi_cu_t (*MemAllocHost)(void **p, size_t bytes);
    loomi_cu_t (*MemFreeHost)(void *p);
    /* Peer memory between processes (transports/cuda): optional, NULL
     * where the driver lacks them (loomi_cuda_ipc says whether all are
     * there); loomi_cuda_full does not count them. */
    loomi_cu_t (*IpcGetMemHandle)(loomi_cu_ipc_t *h, loomi_cuptr_t p);
    loomi_cu_t (*IpcOpenMemHandle)(loomi_cuptr_t *p, loomi_cu_ipc_t h, unsigned flags);
    loomi_cu_t (*IpcCloseMemHandle)(loomi_cuptr_t p);
    loomi_cu_t (*MemGetAddressRange)(loomi_cuptr_t *base, size_t *size, loomi_cuptr_t p);
    /* The pipelined staging of large device buffers (devbuf.c). */
    loomi_cu_t (*MemcpyDtoHAsync)(void *dst, loomi_cuptr_t src, size_t bytes, loomi_cuh_t stream);
    loomi_cu_t (*MemcpyHtoDAsync)(loomi_cuptr_t dst, const void *src, size_t bytes,
                                  loomi_cuh_t stream);
    loomi_cu_t (*EventQuery)(loomi_cuh_t e);
    /* GPUDirect RDMA (loomi_cuda_dmabuf): optional, NULL where the
     * driver lacks it (before CUDA 11.7). */
    loomi_cu_t (*MemGetHandleForAddressRange)(void *handle, loomi_cuptr_t p, size_t bytes,
                                              int type, unsigned long long flags);
    /* Any direction (unified addressing): the device-direct schedules'
     * copies and the verbs transport's eager copies (GPUDirect). */
    loomi_cu_t (*Memcpy)(loomi_cuptr_t dst, loomi_cuptr_t src, size_t bytes);
};

/* Copy n bytes, either side CUDA device memory (cuMemcpy): 0, or -1 with
 * the driver's message in why. */
int loomi_cuda_copy(void *dst, const void *src, size_t n, char *why, size_t wn);

/* The driver's table, loaded on the first call; NULL when libcuda.so.1
 * is absent or lacks cuPointerGetAttribute (loomi_cuda_why says which). */
const struct loomi_cuda_drv *loomi_cuda_driver(void);
/* Whether every member of the table is there (for running kernels). */
int loomi_cuda_full(void);
/* Whether the driver has the IPC functions (and every other one). */
int loomi_cuda_ipc(void);
/* Why loomi_cuda_driver is NULL, or "" when it is not. */
const char *loomi_cuda_why(void);
/* Whether this build has the device kernels (configure --with-cuda). */
int loomi_cuda_built(void);
/* The driver's text for a result, or "CUresult N". */
const char *loomi_cuda_strerror(loomi_cu_t e);

/* What memory a pointer is, as the driver says: device memory, managed
 * memory (host-accessible), or host memory: every pointer without a
 * driver, NULL, and every pointer when the driver is not initialised. */
enum loomi_mem_kind { LOOMI_MEM_HOST = 0, LOOMI_MEM_DEVICE = 1, LOOMI_MEM_MANAGED = 2 };
enum loomi_mem_kind loomi_mem_kind(const void *p);

/* GPUDirect RDMA: the device memory [p, p + len) as a dmabuf that a NIC
 * can register (ibv_reg_dmabuf_mr).  The driver exports page-aligned
 * ranges only: the range exported is [p, p + len) widened to whole host
 * pages, which must lie within p's allocation.  Returns 0 with *fd (the
 * caller closes it) and *off (p's offset in the dmabuf); or -1 with why
 * the driver cannot (no driver, p not device memory, the driver lacks
 * cuMemGetHandleForAddressRange, the device does not support dmabuf
 * (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED), the range leaves its
 * allocation once widened, the export failed) written into why. */
int loomi_cuda_dmabuf(const void *p, size_t len, int *fd, size_t *off, char *why, size_t n);
const char *loomi_mem_kind_name(enum loomi_mem_kind k);

#endif
