/*
 * devpeer.c - the device-direct allreduce between the ranks of one host
 * (devpeer.h), through CUDA IPC:
 *
 *  1. each rank synchronises the call's stream (the input is then on
 *     the device), exports sendbuf and recvbuf (IPC handles, offsets,
 *     lengths) and allgathers them with its verdict on the path (driver
 *     with IPC, kernels loaded, device open) over the communicator's host
 *     connections; every rank then decides alike from the same table:
 *     the path is taken only if every rank can, and else every rank
 *     stages (devbuf.c); a table whose sizes, types or ops differ fails
 *     every rank with LOOM_ERR_MISMATCH;
 *  2. rank r reduces its 1/n slice of the vector, reading the slice of
 *     every rank's sendbuf through its mapping, in rank order, with one
 *     multi-input kernel (loom_redn_*, reduce_cuda.cu) into its own
 *     recvbuf; LOOM_AVG then divides the slice;
 *  3. a host allreduce of one word (the phases' barrier, which also tells
 *     every rank whether any failed);
 *  4. rank r copies every other slice from its owner's recvbuf into its
 *     own (device to device, through the mapping);
 *  5. the same barrier again: no rank returns (and lets the caller reuse
 *     its buffers) while a peer may still read them.
 * The kernels and copies are queued on the call's stream, synchronised
 * before each barrier: the result is on the device when the call
 * returns, for any stream to read, as with staging.  In place works: a
 * rank writes in step 2 only its own slice, which no peer reads then,
 * and in step 4 only the slices of others, which peers read only in
 * step 2.  Every wait is a host collective with LOOM_TIMEOUT as its
 * deadline: a rank that dies fails the others' next barrier.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/collectives.h"
#include "comm/comm.h"
#include "comm/devpeer.h"
#include "core/cuda.h"
#include "core/hostmap.h"
#include "core/internal.h"
#include "reduce/reduce_cuda.h"
#include "transports/cuda/cuipc.h"

struct loomi_devpeer {
    struct loomi_cuda_dev dev;
    int opened;            /* dev is open */
    int ordinal;           /* its ordinal */
    struct loomi_cuipc *ipc; /* the peers' mappings */
};

/* One rank's row of the table (host endian: every rank is on this host). */
#define MAGIC 0x4c6f6f6d44657631ull /* "LoomDev1" */
struct row {
    uint64_t magic;
    uint64_t bytes;    /* count * element size */
    int32_t dtype, op;
    int32_t ok;        /* this rank can take the path */
    int32_t pid;
    struct loomi_cuipc_desc send, recv;
};

/* The comm's device, open on the calling thread (recvbuf's device). */
static loom_result_t device(struct loom_comm *comm, const void *p, struct loomi_devpeer **out)
{
    const struct loomi_cuda_drv *cu = loomi_cuda_driver();
    if (!comm->devpeer && !(comm->devpeer = calloc(1, sizeof *comm->devpeer)))
        return loomi_fail(LOOM_ERR_NO_MEMORY, comm->rank, "out of memory");
    struct loomi_devpeer *dp = comm->devpeer;
    int ord = 0;
    loomi_cu_t e = cu->PointerGetAttribute(&ord, LOOMI_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                           (loomi_cuptr_t)(uintptr_t)p);
    if (e)
        return loomi_fail(LOOM_ERR_SYSTEM, comm->rank, "CUDA: the device of %p: %s", p,
                          loomi_cuda_strerror(e));
    if (dp->opened && dp->ordinal != ord) {
        loomi_cuda_close(&dp->dev);
        dp->opened = 0;
    }
    if (!dp->opened) {
        loom_result_t r = loomi_cuda_open(&dp->dev, ord);
        if (r != LOOM_SUCCESS) return r;
        dp->opened = 1;
        dp->ordinal = ord;
    } else if ((e = cu->CtxSetCurrent(dp->dev.ctx))) {
        return loomi_fail(LOOM_ERR_SYSTEM, comm->rank, "CUDA: cuCtxSetCurrent: %s",
                          loomi_cuda_strerror(e));
    }
    *out = dp;
    return LOOM_SUCCESS;
}

/* The barrier between phases: every rank's `failed`, OR-ed.  Returns the
 * host collective's own failure (a peer gone, the deadline), else
 * LOOM_SUCCESS with *any set. */
static loom_result_t phase(struct loom_comm *comm, const char *fn, int failed, int *any)
{
    int32_t in = failed ? 1 : 0, out = 0;
    loom_result_t r =
        loomi_call_allreduce(fn, &in, &out, 1, LOOM_INT32, LOOM_MAX, comm->handle, NULL, NULL);
    *any = out != 0;
    return r;
}

/* Slice q of count elements among n: [*lo, *lo + *len). */
static void slice(size_t count, int n, int q, size_t *lo, size_t *len)
{
    size_t b = count / (size_t)n, m = count % (size_t)n, uq = (size_t)q;
    *lo = uq * b + (uq < m ? uq : m);
    *len = b + (uq < m);
}

loom_result_t loomi_devpeer_allreduce(struct loom_comm *comm, const char *fn,
                                      const void *sendbuf, void *recvbuf, size_t count,
                                      loom_datatype_t dtype, loom_op_t op, void *stream,
                                      int *taken)
{
    *taken = 0;
    const int n = comm->nranks, me = comm->rank;
    /* Asked of this rank's setup only; what must be alike on every rank
     * (one host, LOOM_CUDA_IPC) is alike there too, or the exchange
     * below meets another call and fails as a mismatch. */
    if (!comm->set.cuda_ipc || n < 2 || !comm->hosts || comm->hosts->nhosts != 1 || !count)
        return LOOM_SUCCESS;
    const struct loomi_cuda_drv *cu = loomi_cuda_driver();
    const size_t es = loom_datatype_size(dtype), bytes = count * es;
    struct row mine = {.magic = MAGIC, .bytes = bytes, .dtype = dtype, .op = op,
                       .pid = (int32_t)getpid()};
    struct loomi_devpeer *dp = NULL;
    /* Why this rank cannot, logged (the others say nothing: they stage). */
    loom_result_t why = LOOM_SUCCESS;
    if (!loomi_cuda_ipc())
        why = loomi_fail(LOOM_ERR_UNSUPPORTED, me, "the driver has no CUDA IPC functions");
    else if (n > LOOMI_CUDA_REDN_MAX)
        why = loomi_fail(LOOM_ERR_UNSUPPORTED, me, "more than %d ranks", LOOMI_CUDA_REDN_MAX);
    else if ((why = device(comm, recvbuf, &dp)) == LOOM_SUCCESS &&
             (why = loomi_cuipc_export(sendbuf, bytes, "sendbuf", me, &mine.send)) ==
                 LOOM_SUCCESS &&
             (why = loomi_cuipc_export(recvbuf, bytes, "recvbuf", me, &mine.recv)) ==
                 LOOM_SUCCESS) {
        /* The input is what the stream's work so far wrote. */
        loomi_cu_t e = cu->StreamSynchronize(stream);
        if (e)
            return loomi_fail(LOOM_ERR_SYSTEM, me,
                              "%s: device buffers: cuStreamSynchronize on the call's stream "
                              "failed: %s",
                              fn, loomi_cuda_strerror(e));
        mine.ok = 1;
    }
    (void)why;
    if (!mine.ok)
        LOOMI_INFO(me, "%s: device buffers: no CUDA IPC path here (%s): staged",
                   fn, loom_get_last_error());

    struct row *all = calloc((size_t)n, sizeof *all);
    loomi_cuptr_t *in = calloc((size_t)n, sizeof *in), *peer_recv = calloc((size_t)n, sizeof *in);
    loom_result_t r = LOOM_SUCCESS;
    if (!all || !in || !peer_recv) {
        r = loomi_fail(LOOM_ERR_NO_MEMORY, me, "%s: out of memory", fn);
        goto out;
    }
    r = loomi_call_allgather(fn, &mine, all, sizeof mine, LOOM_UINT8, comm->handle, NULL, NULL);
    if (r != LOOM_SUCCESS) goto out;
    /* The table is the same on every rank: so is every decision below. */
    int every = 1;
    for (int q = 0; q < n; q++) {
        const struct row *x = &all[q];
        if (x->magic != MAGIC || x->bytes != bytes || x->dtype != (int32_t)dtype ||
            x->op != (int32_t)op) {
            r = loomi_fail(LOOM_ERR_MISMATCH, me,
                           "%s: rank %d called with %llu bytes of dtype %d, op %d; rank %d with "
                           "%zu bytes of dtype %d, op %d (device buffers)",
                           fn, q, (unsigned long long)x->bytes, (int)x->dtype, (int)x->op, me,
                           bytes, (int)dtype, (int)op);
            goto out;
        }
        if (!x->ok) every = 0;
        /* IPC opens another process's memory, never the opener's own. */
        for (int p = 0; p < q; p++)
            if (all[p].pid == x->pid) every = 0;
    }
    if (!every) goto out; /* every rank stages */
    *taken = 1;

    /* Step 2: this rank's slice, from every rank's sendbuf. */
    size_t lo, len;
    slice(count, n, me, &lo, &len);
    loom_result_t mine_r = LOOM_SUCCESS;
    for (int q = 0; q < n && mine_r == LOOM_SUCCESS; q++) {
        if (q == me) {
            in[q] = (loomi_cuptr_t)(uintptr_t)sendbuf;
            peer_recv[q] = (loomi_cuptr_t)(uintptr_t)recvbuf;
            continue;
        }
        mine_r = loomi_cuipc_open(&dp->ipc, me, q, &all[q].send, &in[q]);
        if (mine_r == LOOM_SUCCESS && all[q].recv.len != bytes)
            mine_r = loomi_fail(LOOM_ERR_REMOTE, me, "%s: rank %d sent a recvbuf of %llu bytes",
                                fn, q, (unsigned long long)all[q].recv.len);
        if (mine_r == LOOM_SUCCESS && all[q].send.len != bytes)
            mine_r = loomi_fail(LOOM_ERR_REMOTE, me, "%s: rank %d sent a sendbuf of %llu bytes",
                                fn, q, (unsigned long long)all[q].send.len);
        if (mine_r == LOOM_SUCCESS)
            mine_r = loomi_cuipc_open(&dp->ipc, me, q, &all[q].recv, &peer_recv[q]);
    }
    if (mine_r == LOOM_SUCCESS && len) {
        loomi_cuptr_t src[LOOMI_CUDA_REDN_MAX];
        for (int q = 0; q < n; q++) src[q] = in[q] + lo * es;
        mine_r = loomi_cuda_reduce_n(&dp->dev, peer_recv[me] + lo * es, src, n, len, dtype, op,
                                     stream);
        if (mine_r == LOOM_SUCCESS && op == LOOM_AVG)
            mine_r = loomi_cuda_finish_avg(&dp->dev, peer_recv[me] + lo * es, len, dtype, n,
                                           stream);
    }
    if (mine_r == LOOM_SUCCESS) {
        loomi_cu_t e = cu->StreamSynchronize(stream);
        if (e)
            mine_r = loomi_fail(LOOM_ERR_SYSTEM, me, "%s: device buffers: the reduction: %s", fn,
                                loomi_cuda_strerror(e));
    }
    int any = 0;
    /* Step 3. */
    if ((r = phase(comm, fn, mine_r != LOOM_SUCCESS, &any)) != LOOM_SUCCESS) goto out;
    if (any) goto failed;

    /* Step 4: every other slice, from its owner's recvbuf. */
    for (int q = 0; q < n && mine_r == LOOM_SUCCESS; q++) {
        size_t qlo, qlen;
        slice(count, n, q, &qlo, &qlen);
        if (q == me || !qlen) continue;
        loomi_cu_t e = cu->MemcpyDtoDAsync(peer_recv[me] + qlo * es, peer_recv[q] + qlo * es,
                                           qlen * es, stream);
        if (e)
            mine_r = loomi_fail(LOOM_ERR_SYSTEM, me,
                                "%s: device buffers: cuMemcpyDtoDAsync from rank %d: %s", fn, q,
                                loomi_cuda_strerror(e));
    }
    if (mine_r == LOOM_SUCCESS) {
        loomi_cu_t e = cu->StreamSynchronize(stream);
        if (e)
            mine_r = loomi_fail(LOOM_ERR_SYSTEM, me, "%s: device buffers: the copies: %s", fn,
                                loomi_cuda_strerror(e));
    }
    /* Step 5. */
    if ((r = phase(comm, fn, mine_r != LOOM_SUCCESS, &any)) != LOOM_SUCCESS) goto out;
    if (!any) goto out;
failed:
    if (mine_r != LOOM_SUCCESS)
        r = mine_r; /* its message was the last error before the barrier */
    else
        r = loomi_fail(LOOM_ERR_REMOTE, me, "%s: device buffers: another rank failed its part",
                       fn);
out:
    free(all);
    free(in);
    free(peer_recv);
    return r;
}

void loomi_devpeer_free(struct loom_comm *comm)
{
    struct loomi_devpeer *dp = comm->devpeer;
    if (!dp) return;
    loomi_cuipc_close_all(&dp->ipc);
    if (dp->opened) loomi_cuda_close(&dp->dev);
    free(dp);
    comm->devpeer = NULL;
}
