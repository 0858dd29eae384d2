/*
 * nccl.h - NCCL's programming interface, served by Loom (libloom-nccl,
 * installed as libnccl.so.2).  See loom-nccl(7).
 *
 * Written from NCCL's documented API: the names, enum values, structure
 * layout and signatures are those of NCCL 2.19, so a program written for
 * NCCL compiles unchanged against this header and a binary linked with
 * -lnccl runs against this library.  Compiles as C99, C11 and C++ and
 * needs no CUDA header: cudaStream_t is declared here exactly as CUDA
 * declares it, unless a CUDA runtime header came first.
 *
 * Host buffers work with a NULL stream on any machine; the collectives
 * also take CUDA device buffers (staged through host memory) and a
 * stream, which is synchronised before the call; every call blocks the
 * calling thread until it is complete (loom-nccl(7)).  What it cannot
 * honour returns ncclInvalidUsage, with the reason in ncclGetLastError() and on stderr
 * under NCCL_DEBUG=WARN.
 */
#ifndef NCCL_H_
#define NCCL_H_

#include <limits.h>
#include <stddef.h>

/* As NVIDIA's nccl.h does: CUDA's half types (half, __nv_bfloat16) for
 * programs that CUDA's compiler builds (nccl-tests uses them). */
#if defined(__CUDACC__)
#include <cuda_fp16.h>
#if defined(__CUDACC_VER_MAJOR__) && __CUDACC_VER_MAJOR__ >= 11
#include <cuda_bf16.h>
#endif
#endif

/* CUDA's own declaration; skipped when a CUDA runtime header was
 * included first (it declares the same type). */
#if !defined(CUDART_VERSION) && !defined(__DRIVER_TYPES_H__) &&                \
    !defined(LOOM_NCCL_HAVE_CUDA_STREAM)
typedef struct CUstream_st *cudaStream_t;
#endif
#define LOOM_NCCL_HAVE_CUDA_STREAM 1

#define NCCL_MAJOR 2
#define NCCL_MINOR 19
#define NCCL_PATCH 3
#define NCCL_SUFFIX ""

/* X*1000+Y*100+Z up to 2.8, X*10000+Y*100+Z from 2.9 on. */
#define NCCL_VERSION(X, Y, Z)                                                  \
    (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z)                     \
                            : (X) * 10000 + (Y) * 100 + (Z))
#define NCCL_VERSION_CODE NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH)

/* Marks the implementation, for programs that want to know. */
#define LOOM_NCCL 1

#ifdef __cplusplus
extern "C" {
#endif

/* An opaque communicator. */
typedef struct ncclComm *ncclComm_t;
#define NCCL_COMM_NULL NULL

/* The identity of a job: made by one rank, passed to the others. */
#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
    char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
    ncclNumResults = 8
} ncclResult_t;

/* Values an ncclConfig_t member keeps when the caller leaves it. */
#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
#define NCCL_SPLIT_NOCOLOR (-1)

/* Options of ncclCommInitRankConfig and ncclCommSplit.  Always start
 * from NCCL_CONFIG_INITIALIZER: size, magic and version tell the
 * library which prefix of the structure the caller knows. */
typedef struct ncclConfig_v21700 {
    size_t size;
    unsigned int magic;
    unsigned int version;
    int blocking;       /* 0: calls may return ncclInProgress */
    int cgaClusterSize; /* GPU kernels only */
    int minCTAs;        /* GPU kernels only */
    int maxCTAs;        /* GPU kernels only */
    const char *netName; /* "Socket" or "IB" */
    int splitShare;
} ncclConfig_t;

#define NCCL_CONFIG_INITIALIZER                                                \
    {                                                                          \
        sizeof(ncclConfig_t), 0xcafebeef,                                      \
            NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH),                  \
            NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,                      \
            NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,                      \
            NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT                       \
    }

/* ------------------------------------------------------------ lifecycle */

ncclResult_t ncclMemAlloc(void **ptr, size_t size);
ncclResult_t ncclMemFree(void *ptr);

ncclResult_t ncclGetVersion(int *version);
ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId);

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks,
                                    ncclUniqueId commId, int rank,
                                    ncclConfig_t *config);
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks,
                              ncclUniqueId commId, int rank);
ncclResult_t ncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist);

ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key,
                           ncclComm_t *newcomm, ncclConfig_t *config);

const char *ncclGetErrorString(ncclResult_t result);
const char *ncclGetLastError(ncclComm_t comm);

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError);
ncclResult_t ncclCommCount(const ncclComm_t comm, int *count);
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank);

ncclResult_t ncclCommRegister(const ncclComm_t comm, void *buff, size_t size,
                              void **handle);
ncclResult_t ncclCommDeregister(const ncclComm_t comm, void *handle);

/* ------------------------------------------------ datatypes and ops */

typedef enum {
    ncclSum = 0,
    ncclProd = 1,
    ncclMax = 2,
    ncclMin = 3,
    ncclAvg = 4,
    ncclNumOps = 5,
    /* Operations made by ncclRedOpCreatePreMulSum lie in
     * [ncclNumOps, ncclMaxRedOp]; the member makes the enum int-sized. */
    ncclMaxRedOp = INT_MAX
} ncclRedOp_t;

typedef enum {
    ncclInt8 = 0,
    ncclChar = 0,
    ncclUint8 = 1,
    ncclInt32 = 2,
    ncclInt = 2,
    ncclUint32 = 3,
    ncclInt64 = 4,
    ncclUint64 = 5,
    ncclFloat16 = 6,
    ncclHalf = 6,
    ncclFloat32 = 7,
    ncclFloat = 7,
    ncclFloat64 = 8,
    ncclDouble = 8,
    ncclBfloat16 = 9,
    ncclNumTypes = 10
} ncclDataType_t;

/* Where the scalar of ncclRedOpCreatePreMulSum lives. */
typedef enum {
    ncclScalarDevice = 0,        /* refused on this build */
    ncclScalarHostImmediate = 1  /* read once, at creation */
} ncclScalarResidence_t;

/* An op that multiplies each rank's input by *scalar (of datatype), then
 * sums.  Valid on comm only, with datatype only. */
ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar,
                                      ncclDataType_t datatype,
                                      ncclScalarResidence_t residence,
                                      ncclComm_t comm);
ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm);

/* ---------------------------------------------------------- collectives */

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                        ncclDataType_t datatype, ncclRedOp_t op, int root,
                        ncclComm_t comm, cudaStream_t stream);
/* The older in-place broadcast. */
ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype,
                       int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff,
                               size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream);
ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff,
                           size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream);

/* ------------------------------------------------------ point to point */

ncclResult_t ncclSend(const void *sendbuff, size_t count,
                      ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype,
                      int peer, ncclComm_t comm, cudaStream_t stream);

/* --------------------------------------------------------------- groups */

ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);

#ifdef __cplusplus
}
#endif

#endif /* NCCL_H_ */
