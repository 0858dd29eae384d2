/*
 * nccl_devptr.c - an NCCL program on one rank that hands libloom-nccl
 * buffers CUDA's driver calls device memory (through tests/mp/cuda_stub.c
 * standing in for libcuda.so.1, run by tests/mp/test_nccl.sh).  The stub
 * has cuPointerGetAttribute alone, none of what staging device buffers
 * and synchronising streams needs: each device buffer is refused with
 * ncclInvalidUsage naming the buffer and the missing function, and so
 * is a stream; host and managed memory are used, and so is every buffer
 * while the driver is not initialised.  Exits 77 when no stub is loaded.
 */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <nccl.h>
#include <stdio.h>
#include <string.h>

static int fails, passes;

static void expect(ncclResult_t got, ncclResult_t want, const char *word, const char *what)
{
    const char *msg = ncclGetLastError(NULL);
    if (got == want && (!word || strstr(msg, word))) {
        passes++;
        printf("ok   %s%s%s\n", what, word ? ": " : "", word ? msg : "");
    } else {
        fails++;
        printf("FAIL %s: got %s, want %s; \"%s\"\n", what, ncclGetErrorString(got),
               ncclGetErrorString(want), msg);
    }
}

int main(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    void (*init)(void) = NULL;
    void (*mark)(const void *, size_t, int) = NULL;
    if (h) {
        *(void **)&init = dlsym(h, "stub_cuda_init");
        *(void **)&mark = dlsym(h, "stub_cuda_mark");
    }
    if (!init || !mark) {
        printf("no stub libcuda.so.1 loaded: skipped\n");
        return 77;
    }
    static float host[64], dev[64], managed[64], out[64];
    mark(dev, sizeof dev, 0);
    mark(managed, sizeof managed, 1);
    ncclUniqueId id;
    ncclComm_t comm;
    if (ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&comm, 1, id, 0) != ncclSuccess) {
        printf("FAIL init: %s\n", ncclGetLastError(NULL));
        return 1;
    }
    expect(ncclAllReduce(dev, out, 64, ncclFloat, ncclSum, comm, NULL), ncclSuccess, NULL,
           "driver not initialised: no device memory yet, the buffer is used");
    init();
    expect(ncclAllReduce(dev, out, 64, ncclFloat, ncclSum, comm, NULL), ncclInvalidUsage,
           "sendbuff", "a device sendbuff is refused");
    expect(ncclAllReduce(dev, out, 64, ncclFloat, ncclSum, comm, NULL), ncclInvalidUsage,
           "has no cuStreamSynchronize", "... because staging needs what the driver lacks");
    expect(ncclAllReduce(host, dev, 64, ncclFloat, ncclSum, comm, NULL), ncclInvalidUsage,
           "recvbuff", "a device recvbuff is refused");
    expect(ncclBcast(dev + 8, 8, ncclFloat, 0, comm, NULL), ncclInvalidUsage, "cannot be staged",
           "ncclBcast inside a device buffer is refused");
    expect(ncclAllGather(host, dev, 8, ncclFloat, comm, NULL), ncclInvalidUsage,
           "has no cuStreamSynchronize", "ncclAllGather into a device buffer is refused");
    expect(ncclAllReduce(host, out, 64, ncclFloat, ncclSum, comm, (cudaStream_t)(void *)host),
           ncclInvalidUsage, "cannot wait for the stream",
           "a stream, where the driver has no cuStreamSynchronize, is refused");
    expect(ncclRecv(dev, 4, ncclFloat, 0, comm, NULL), ncclInvalidUsage, "recvbuff",
           "ncclRecv into device memory is refused");
    void *handle = NULL;
    expect(ncclCommRegister(comm, dev, sizeof dev, &handle), ncclInvalidUsage, "buff",
           "ncclCommRegister of device memory is refused");
    ncclRedOp_t op;
    expect(ncclRedOpCreatePreMulSum(&op, dev, ncclFloat, ncclScalarHostImmediate, comm),
           ncclInvalidUsage, "scalar", "a HostImmediate scalar in device memory is refused");
    for (int i = 0; i < 64; i++) host[i] = (float)i, managed[i] = 2.0f * (float)i;
    expect(ncclAllReduce(host, out, 64, ncclFloat, ncclSum, comm, NULL), ncclSuccess, NULL,
           "host buffers are used");
    expect(ncclAllReduce(managed, managed, 64, ncclFloat, ncclSum, comm, NULL), ncclSuccess, NULL,
           "managed memory is used");
    int bad = 0;
    for (int i = 0; i < 64; i++) bad += out[i] != (float)i || managed[i] != 2.0f * (float)i;
    expect(bad ? ncclInternalError : ncclSuccess, ncclSuccess, NULL, "their results");
    ncclCommDestroy(comm);
    printf("devptr: %d passed, %d failed\n", passes, fails);
    return fails ? 1 : 0;
}
