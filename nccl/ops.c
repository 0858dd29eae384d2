/*
 * ops.c - libloom-nccl's memory and operations: ncclMemAlloc / ncclMemFree
 * and buffer registration, the reduction ops ncclRedOpCreatePreMulSum
 * makes, the detection of CUDA device memory (is_device) and the
 * synchronisation of a call's stream (sync_stream), and the operations
 * (allreduce, reduce, reduce-scatter, broadcast, allgather, send, recv)
 * with the checks every one makes.  The collectives take device buffers
 * (Loom stages them through pinned host memory) outside groups, after
 * the call's stream is synchronised; send, recv and registration take
 * host memory only.  nccl.c says how the
 * library works and holds errors, groups and the communicators'
 * lifecycle; internal.h the state both use.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nccl/internal.h"

/* ncclInvalidUsage when CUDA's driver says p is device memory. */
static ncclResult_t host_only(const char *fn, const char *what, const void *p);
static ncclResult_t host_bufs(const char *fn, const void *send, const void *recv);
static int is_device(const void *p);
static ncclResult_t sync_stream(const char *fn, cudaStream_t stream);

/* ---------------------------------------------------------------- memory */

/* Host memory on this build (page-aligned); NCCL gives device memory. */
ncclResult_t ncclMemAlloc(void **ptr, size_t size)
{
    if (!ptr) return lnccl_fail(ncclInvalidArgument, "ncclMemAlloc: ptr is NULL");
    *ptr = NULL;
    if (size == 0) return lnccl_fail(ncclInvalidArgument, "ncclMemAlloc: size is 0");
    void *p = NULL;
    int e = posix_memalign(&p, 4096, size);
    if (e != 0)
        return lnccl_fail(ncclSystemError, "ncclMemAlloc: %zu bytes: %s", size, strerror(e));
    *ptr = p;
    return ncclSuccess;
}

ncclResult_t ncclMemFree(void *ptr)
{
    free(ptr);
    return ncclSuccess;
}

ncclResult_t ncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle)
{
    static const char fn[] = "ncclCommRegister";
    ncclResult_t r = ncclSuccess;
    struct ncclComm *c = lnccl_comm_ready(comm, fn, &r);
    if (!c) return r;
    if (!handle) return lnccl_fail(ncclInvalidArgument, "%s: handle is NULL", fn);
    *handle = NULL;
    r = host_only(fn, "buff", buff);
    if (r != ncclSuccess) return r;
    loom_mem_t h = NULL;
    r = lnccl_from_loom(loom_mem_register(c->lc, buff, size, &h), fn, NULL);
    if (r == ncclSuccess) *handle = h;
    return r;
}

ncclResult_t ncclCommDeregister(const ncclComm_t comm, void *handle)
{
    static const char fn[] = "ncclCommDeregister";
    ncclResult_t r = ncclSuccess;
    struct ncclComm *c = lnccl_comm_ready(comm, fn, &r);
    if (!c) return r;
    return lnccl_from_loom(loom_mem_deregister(c->lc, (loom_mem_t)handle), fn, NULL);
}

/* ------------------------------------------------------------ reduce ops */

ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm)
{
    static const char fn[] = "ncclRedOpCreatePreMulSum";
    ncclResult_t r = ncclSuccess;
    struct ncclComm *c = lnccl_comm_ready(comm, fn, &r);
    if (!c) return r;
    if (!op) return lnccl_fail(ncclInvalidArgument, "%s: op is NULL", fn);
    size_t sz = lnccl_dtype_size((int)datatype);
    if (!sz)
        return lnccl_fail(ncclInvalidArgument, "%s: datatype %d is not an ncclDataType_t", fn,
                          (int)datatype);
    if (residence == ncclScalarDevice)
        return lnccl_fail(ncclInvalidUsage,
                          "%s: a device-resident scalar (ncclScalarDevice) is not read by this "
                          "libnccl (Loom); pass ncclScalarHostImmediate",
                          fn);
    if (residence != ncclScalarHostImmediate)
        return lnccl_fail(ncclInvalidArgument, "%s: residence %d is not an ncclScalarResidence_t",
                          fn, (int)residence);
    if (!scalar) return lnccl_fail(ncclInvalidArgument, "%s: scalar is NULL", fn);
    r = host_only(fn, "scalar (ncclScalarHostImmediate)", scalar);
    if (r != ncclSuccess) return r;
    pthread_mutex_lock(&c->mu);
    int slot = -1;
    for (int i = 0; i < c->nops; i++)
        if (!c->ops[i].used) {
            slot = i;
            break;
        }
    if (slot < 0) {
        if (c->nops >= MAX_REDOPS) {
            pthread_mutex_unlock(&c->mu);
            return lnccl_fail(ncclInvalidUsage, "%s: %d ops exist on comm %p; destroy some first",
                              fn, c->nops, (void *)comm);
        }
        struct redop *p = realloc(c->ops, (size_t)(c->nops + 1) * sizeof *p);
        if (!p) {
            pthread_mutex_unlock(&c->mu);
            return lnccl_fail(ncclSystemError, "%s: out of memory", fn);
        }
        c->ops = p;
        slot = c->nops++;
    }
    c->ops[slot].used = 1;
    c->ops[slot].dtype = (int)datatype;
    memset(c->ops[slot].scalar, 0, sizeof c->ops[slot].scalar);
    memcpy(c->ops[slot].scalar, scalar, sz);
    pthread_mutex_unlock(&c->mu);
    *op = (ncclRedOp_t)(ncclNumOps + slot);
    return ncclSuccess;
}

ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm)
{
    static const char fn[] = "ncclRedOpDestroy";
    ncclResult_t r = ncclSuccess;
    struct ncclComm *c = lnccl_comm_get(comm, fn, &r);
    if (!c) return r;
    if ((int)op >= 0 && (int)op < ncclNumOps)
        return lnccl_fail(ncclInvalidArgument, "%s: op %d is built in", fn, (int)op);
    long slot = (long)op - ncclNumOps;
    pthread_mutex_lock(&c->mu);
    int ok = slot >= 0 && slot < c->nops && c->ops[slot].used;
    if (ok) c->ops[slot].used = 0;
    pthread_mutex_unlock(&c->mu);
    if (!ok)
        return lnccl_fail(ncclInvalidArgument,
                          "%s: op %d was not made by ncclRedOpCreatePreMulSum on "
                          "comm %p (or is destroyed)",
                          fn, (int)op, (void *)comm);
    return ncclSuccess;
}

/* -------------------------------------------------------- device memory */

/* Built without CUDA, a device pointer can still be recognised where
 * CUDA's driver is installed: libcuda.so.1 is loaded at run time and
 * asked what each buffer is.  No driver: every buffer is host memory (a
 * process without the driver has no device memory).  A driver not yet
 * initialised answers with an error: nothing in this process is device
 * memory yet, so the buffer is host memory too.  Managed memory is
 * host-accessible and taken as host memory.  The values are those of
 * cuda.h.  The collectives hand device buffers to Loom, which stages
 * them through pinned host memory (loom(7), GPUS); what that needs of
 * the driver is checked here (cu_missing), so that a driver lacking it
 * gives ncclInvalidUsage, and cuStreamSynchronize orders a call after
 * the work on its stream (sync_stream). */
enum {
    CU_ATTR_MEMORY_TYPE = 2,
    CU_ATTR_IS_MANAGED = 8,
    CU_MEMTYPE_DEVICE = 2
};
typedef int (*cu_attr_fn)(void *data, int attribute, unsigned long long ptr);
typedef int (*cu_sync_fn)(void *stream);
static cu_attr_fn cu_attr;
static cu_sync_fn cu_sync;
static char cu_missing[96]; /* why device buffers cannot be staged; "" where they can */
static pthread_once_t cu_once = PTHREAD_ONCE_INIT;

static void cu_load(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(cu_missing, sizeof cu_missing, "no CUDA driver (libcuda.so.1) is loaded");
        lnccl_info("no CUDA driver (libcuda.so.1): buffers are host memory");
        return;
    }
    *(void **)&cu_attr = dlsym(h, "cuPointerGetAttribute");
    *(void **)&cu_sync = dlsym(h, "cuStreamSynchronize");
    /* What Loom's staging calls (src/comm/devbuf.c, through its own
     * loader): the first one absent makes device buffers unusable. */
    static const char *const need[] = {"cuStreamSynchronize", "cuMemAllocHost_v2",
                                       "cuMemFreeHost", "cuMemcpyDtoH_v2", "cuMemcpyHtoD_v2"};
    for (size_t i = 0; i < sizeof need / sizeof need[0] && !cu_missing[0]; i++)
        if (!dlsym(h, need[i]))
            snprintf(cu_missing, sizeof cu_missing, "libcuda.so.1 has no %s", need[i]);
    lnccl_info("CUDA driver found: device buffers are %s%s%s",
               cu_missing[0] ? "refused (" : "staged through host memory by the collectives",
               cu_missing, cu_missing[0] ? ")" : "");
}

/* Whether CUDA's driver calls p device memory (not managed). */
static int is_device(const void *p)
{
    pthread_once(&cu_once, cu_load);
    if (!cu_attr || !p) return 0;
    unsigned int type = 0, managed = 0;
    unsigned long long a = (unsigned long long)(uintptr_t)p;
    if (cu_attr(&type, CU_ATTR_MEMORY_TYPE, a) != 0 || type != CU_MEMTYPE_DEVICE) return 0;
    return !(cu_attr(&managed, CU_ATTR_IS_MANAGED, a) == 0 && managed);
}

/* ncclInvalidUsage when p is device memory: for the calls that do not
 * stage device buffers (send, recv, registration, scalars). */
static ncclResult_t host_only(const char *fn, const char *what, const void *p)
{
    if (!is_device(p)) return ncclSuccess;
    return lnccl_fail(ncclInvalidUsage,
                      "%s: %s %p is CUDA device memory, which this libnccl (Loom) takes only in "
                      "the collectives (allreduce, reduce, reduce-scatter, broadcast, allgather): "
                      "pass host (or managed) memory",
                      fn, what, p);
}

static ncclResult_t host_bufs(const char *fn, const void *send, const void *recv)
{
    ncclResult_t r = host_only(fn, "sendbuff", send);
    return r == ncclSuccess && recv != send ? host_only(fn, "recvbuff", recv) : r;
}

/* The call's stream synchronised: the work queued on it before the call
 * is done, its writes visible to the call.  A NULL stream is left alone
 * (Loom synchronises the legacy default stream before it reads a device
 * buffer; host buffers of a NULL-stream call are not ordered on any
 * stream, as before). */
static ncclResult_t sync_stream(const char *fn, cudaStream_t stream)
{
    if (!stream) return ncclSuccess;
    pthread_once(&cu_once, cu_load);
    if (!cu_sync)
        return lnccl_fail(ncclInvalidUsage,
                          "%s: stream %p: %s, so this libnccl (Loom) cannot wait for the "
                          "stream's work: pass a NULL stream",
                          fn, (void *)stream,
                          cu_attr ? "libcuda.so.1 has no cuStreamSynchronize" : cu_missing);
    int e = cu_sync(stream);
    if (e != 0)
        return lnccl_fail(ncclUnhandledCudaError,
                          "%s: cuStreamSynchronize(stream %p) failed: CUDA error %d", fn,
                          (void *)stream, e);
    return ncclSuccess;
}

/* ----------------------------------------------------------- operations */

struct call {
    struct ncclComm *c;
    loom_datatype_t dt;
    loom_op_t op;
    int premul;                  /* scale the input by scalar first */
    unsigned char scalar[8];
};

enum { HOST_ONLY, STAGED }; /* what a call does with device buffers */

static ncclResult_t check_call(struct call *k, const char *fn, ncclComm_t comm,
                               ncclDataType_t datatype, long op);

/* What every operation does first: the checks of comm, datatype and op
 * (op < 0: the call takes none) and of its buffers (NULL where it has
 * none): device buffers are refused by HOST_ONLY calls, and by STAGED
 * ones inside a group, with PreMulSum (it scales the input on the host)
 * or where the driver lacks what staging needs; then the call's stream
 * is synchronised (sync_stream), and Loom's group opened inside an NCCL
 * group.  Every refusal is ncclInvalidUsage, made here before Loom is
 * called. */
static ncclResult_t prepare(struct call *k, const char *fn, ncclComm_t comm, cudaStream_t stream,
                            ncclDataType_t datatype, long op, const void *send, const void *recv,
                            int kind)
{
    ncclResult_t r = check_call(k, fn, comm, datatype, op);
    if (r != ncclSuccess) return r;
    if (kind == HOST_ONLY) {
        r = host_bufs(fn, send, recv);
    } else {
        int sdev = is_device(send), rdev = recv == send ? sdev : is_device(recv);
        const char *what = sdev ? "sendbuff" : "recvbuff";
        const void *p = sdev ? send : recv;
        if (!sdev && !rdev)
            r = ncclSuccess;
        else if (lnccl_tl_depth > 0)
            r = lnccl_fail(ncclInvalidUsage,
                           "%s: %s %p is CUDA device memory, which this libnccl (Loom) does not "
                           "take between ncclGroupStart and ncclGroupEnd: call outside the group "
                           "or pass host memory",
                           fn, what, p);
        else if (cu_missing[0])
            r = lnccl_fail(ncclInvalidUsage,
                           "%s: %s %p is CUDA device memory, which cannot be staged through host "
                           "memory: %s; pass host (or managed) memory",
                           fn, what, p, cu_missing);
        else if (k->premul && sdev)
            r = lnccl_fail(ncclInvalidUsage,
                           "%s: op %ld is a PreMulSum (ncclRedOpCreatePreMulSum), whose scaling "
                           "this libnccl (Loom) does on the host: sendbuff %p is CUDA device "
                           "memory; pass host memory, or scale the input and use ncclSum",
                           fn, op, send);
    }
    if (r == ncclSuccess) r = sync_stream(fn, stream);
    if (r == ncclSuccess) r = lnccl_enter_op(fn);
    return r;
}

static ncclResult_t check_call(struct call *k, const char *fn, ncclComm_t comm,
                               ncclDataType_t datatype, long op)
{
    ncclResult_t r = ncclSuccess;
    memset(k, 0, sizeof *k);
    k->c = lnccl_comm_ready(comm, fn, &r);
    if (!k->c) return r;
    if (lnccl_dtype((int)datatype, &k->dt) != 0)
        return lnccl_fail(ncclInvalidArgument, "%s: datatype %d is not an ncclDataType_t (0..%d)",
                          fn, (int)datatype, ncclNumTypes - 1);
    if (op < 0) return ncclSuccess;
    if (lnccl_op((int)op, &k->op) == 0) return ncclSuccess;
    long slot = op - ncclNumOps;
    pthread_mutex_lock(&k->c->mu);
    int ok = slot >= 0 && slot < k->c->nops && k->c->ops[slot].used;
    int odt = ok ? k->c->ops[slot].dtype : -1;
    if (ok) memcpy(k->scalar, k->c->ops[slot].scalar, sizeof k->scalar);
    pthread_mutex_unlock(&k->c->mu);
    if (!ok)
        return lnccl_fail(ncclInvalidArgument,
                          "%s: op %ld is neither built in (0..%d) nor made by "
                          "ncclRedOpCreatePreMulSum on comm %p",
                          fn, op, ncclNumOps - 1, (void *)comm);
    if (odt != (int)datatype)
        return lnccl_fail(ncclInvalidArgument,
                          "%s: op %ld was made for datatype %d, the call passes datatype %d", fn,
                          op, odt, (int)datatype);
    k->premul = 1;
    k->op = LOOM_SUM;
    return ncclSuccess;
}

/* For PreMulSum: a scaled copy of count elements of src, freed by done()
 * (after the group when inside one).  *out NULL when src is NULL or
 * count 0: Loom then checks the arguments as given. */
static ncclResult_t scaled_input(struct call *k, const char *fn, const void *src, size_t count,
                                 const void **out)
{
    *out = src;
    if (!k->premul || !src || count == 0) return ncclSuccess;
    size_t esz = loom_datatype_size(k->dt);
    if (count > SIZE_MAX / esz)
        return lnccl_fail(ncclInvalidArgument, "%s: count %zu overflows the address space", fn,
                          count);
    void *tmp = malloc(count * esz);
    if (!tmp)
        return lnccl_fail(ncclSystemError, "%s: out of memory for %zu bytes", fn, count * esz);
    lnccl_scale(tmp, src, count, (int)k->dt, k->scalar);
    if (lnccl_tl_depth > 0) {
        if (lnccl_push_ptr(&lnccl_tl_tmp, &lnccl_tl_ntmp, &lnccl_tl_captmp, tmp) != 0) {
            free(tmp);
            return lnccl_fail(ncclSystemError, "%s: out of memory", fn);
        }
    }
    *out = tmp;
    return ncclSuccess;
}

/* The call is under way on k->c (ncclCommAbort and ncclCommDestroy
 * refuse it meanwhile): until done() outside a group, until the
 * outermost ncclGroupEnd inside one. */
static void begin(struct call *k)
{
    atomic_fetch_add(&k->c->inflight, 1);
    if (lnccl_tl_depth > 0 && lnccl_push_ptr((void ***)&lnccl_tl_queued, &lnccl_tl_nqueued,
                                             &lnccl_tl_capqueued, k->c) != 0)
        atomic_fetch_sub(&k->c->inflight, 1); /* no room: not counted */
}

static ncclResult_t done(struct call *k, const char *fn, loom_result_t lr, const void *scaled,
                         const void *orig)
{
    if (scaled != orig && lnccl_tl_depth == 0) free((void *)scaled);
    ncclResult_t r = lnccl_group_note(lnccl_from_loom(lr, fn, k->c));
    if (lnccl_tl_depth == 0) atomic_fetch_sub(&k->c->inflight, 1); /* k->c is not read after */
    return r;
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream)
{
    static const char fn[] = "ncclAllReduce";
    struct call k;
    const void *in;
    ncclResult_t r = prepare(&k, fn, comm, stream, datatype, (long)op, sendbuff, recvbuff, STAGED);
    if (r == ncclSuccess) r = scaled_input(&k, fn, sendbuff, count, &in);
    if (r != ncclSuccess) return lnccl_group_note(r);
    begin(&k);
    return done(&k, fn, loom_allreduce(in, recvbuff, count, k.dt, k.op, k.c->lc), in, sendbuff);
}

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                        ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                        cudaStream_t stream)
{
    static const char fn[] = "ncclReduce";
    struct call k;
    const void *in;
    ncclResult_t r = prepare(&k, fn, comm, stream, datatype, (long)op, sendbuff, recvbuff, STAGED);
    if (r == ncclSuccess) r = scaled_input(&k, fn, sendbuff, count, &in);
    if (r != ncclSuccess) return lnccl_group_note(r);
    begin(&k);
    return done(&k, fn, loom_reduce(in, recvbuff, count, k.dt, k.op, root, k.c->lc), in,
                sendbuff);
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream)
{
    static const char fn[] = "ncclReduceScatter";
    struct call k;
    const void *in = sendbuff;
    ncclResult_t r = prepare(&k, fn, comm, stream, datatype, (long)op, sendbuff, recvbuff, STAGED);
    if (r == ncclSuccess && k.premul) {
        if (recvcount > SIZE_MAX / (size_t)k.c->nranks)
            r = lnccl_fail(ncclInvalidArgument, "%s: recvcount %zu times %d ranks overflows", fn,
                           recvcount, k.c->nranks);
        else
            r = scaled_input(&k, fn, sendbuff, recvcount * (size_t)k.c->nranks, &in);
    }
    if (r != ncclSuccess) return lnccl_group_note(r);
    begin(&k);
    return done(&k, fn, loom_reduce_scatter(in, recvbuff, recvcount, k.dt, k.op, k.c->lc), in,
                sendbuff);
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)
{
    static const char fn[] = "ncclBroadcast";
    struct call k;
    ncclResult_t r = prepare(&k, fn, comm, stream, datatype, -1, sendbuff, recvbuff, STAGED);
    if (r != ncclSuccess) return lnccl_group_note(r);
    begin(&k);
    return done(&k, fn, loom_broadcast(sendbuff, recvbuff, count, k.dt, root, k.c->lc), NULL,
                NULL);
}

ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root,
                       ncclComm_t comm, cudaStream_t stream)
{
    static const char fn[] = "ncclBcast";
    struct call k;
    ncclResult_t r = prepare(&k, fn, comm, stream, datatype, -1, buff, buff, STAGED);
    if (r != ncclSuccess) return lnccl_group_note(r);
    begin(&k);
    return done(&k, fn, loom_broadcast(buff, buff, count, k.dt, root, k.c->lc), NULL, NULL);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    static const char fn[] = "ncclAllGather";
    struct call k;
    ncclResult_t r = prepare(&k, fn, comm, stream, datatype, -1, sendbuff, recvbuff, STAGED);
    if (r != ncclSuccess) return lnccl_group_note(r);
    begin(&k);
    return done(&k, fn, loom_allgather(sendbuff, recvbuff, sendcount, k.dt, k.c->lc), NULL, NULL);
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream)
{
    static const char fn[] = "ncclSend";
    struct call k;
    ncclResult_t r = prepare(&k, fn, comm, stream, datatype, -1, sendbuff, NULL, HOST_ONLY);
    if (r != ncclSuccess) return lnccl_group_note(r);
    begin(&k);
    return done(&k, fn, loom_send(sendbuff, count, k.dt, peer, k.c->lc), NULL, NULL);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream)
{
    static const char fn[] = "ncclRecv";
    struct call k;
    ncclResult_t r = prepare(&k, fn, comm, stream, datatype, -1, NULL, recvbuff, HOST_ONLY);
    if (r != ncclSuccess) return lnccl_group_note(r);
    begin(&k);
    return done(&k, fn, loom_recv(recvbuff, count, k.dt, peer, k.c->lc), NULL, NULL);
}

/* The pnccl* names of this file's calls (PNCCL: internal.h). */
PNCCL(ncclMemAlloc);
PNCCL(ncclMemFree);
PNCCL(ncclCommRegister);
PNCCL(ncclCommDeregister);
PNCCL(ncclRedOpCreatePreMulSum);
PNCCL(ncclRedOpDestroy);
PNCCL(ncclReduce);
PNCCL(ncclBcast);
PNCCL(ncclBroadcast);
PNCCL(ncclAllReduce);
PNCCL(ncclReduceScatter);
PNCCL(ncclAllGather);
PNCCL(ncclSend);
PNCCL(ncclRecv);
