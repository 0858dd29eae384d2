/*
 * devpeer.c - the device-direct collectives between the ranks of one
 * host (devpeer.h), through CUDA IPC.  The allreduce:
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
 *
 * The others have steps 1 and 5 alike, and in between: reduce_scatter,
 * rank r reduces block r of every rank's sendbuf into its recvbuf;
 * reduce, the root reduces every rank's sendbuf; allgather, rank r
 * copies every rank's sendbuf into block q of its recvbuf; broadcast,
 * every rank copies the root's sendbuf.  In place holds as each rank
 * writes only its own buffers, in places no peer reads.
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
#include "coll/coll.h"
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
#define MAGIC 0x4c6f6f6d44657632ull /* "LoomDev2" */
struct row {
    uint64_t magic;
    uint64_t count;    /* the call's count */
    int32_t coll, dtype, op, root;
    int32_t ok;        /* this rank can take the path */
    int32_t pid;
    int32_t has_send, has_recv;
    struct loomi_cuipc_desc send, recv;
};

/* The comm's device, open on the calling thread (p's device). */
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

/* The bytes of rank q's sendbuf and recvbuf in a call (0: none). */
static void lengths(int coll, int n, int q, int root, size_t bytes, size_t *sl, size_t *rl)
{
    *sl = *rl = 0;
    switch (coll) {
    case LOOMI_COLL_ALLREDUCE: *sl = *rl = bytes; break;
    case LOOMI_COLL_REDUCE_SCATTER: *sl = bytes * (size_t)n, *rl = bytes; break;
    case LOOMI_COLL_ALLGATHER: *sl = bytes, *rl = bytes * (size_t)n; break;
    case LOOMI_COLL_BROADCAST: *sl = q == root ? bytes : 0, *rl = bytes; break;
    case LOOMI_COLL_REDUCE: *sl = bytes, *rl = q == root ? bytes : 0; break;
    }
}

struct run {
    struct loom_comm *comm;
    const char *fn;
    const struct loomi_cuda_drv *cu;
    struct loomi_devpeer *dp;
    size_t es;
    loom_datatype_t dtype;
    loom_op_t op;
    void *stream;
};

static loom_result_t copy(const struct run *x, loomi_cuptr_t dst, loomi_cuptr_t src, size_t n,
                          int from)
{
    if (!n || dst == src) return LOOM_SUCCESS;
    loomi_cu_t e = x->cu->MemcpyDtoDAsync(dst, src, n, x->stream);
    if (e)
        return loomi_fail(LOOM_ERR_SYSTEM, x->comm->rank,
                          "%s: device buffers: cuMemcpyDtoDAsync from rank %d: %s", x->fn, from,
                          loomi_cuda_strerror(e));
    return LOOM_SUCCESS;
}

/* dst[0, len) = OP over q of in[q] + off, in rank order; LOOM_AVG divided. */
static loom_result_t reduce(const struct run *x, loomi_cuptr_t dst, const loomi_cuptr_t *in,
                            size_t off, size_t len)
{
    const int n = x->comm->nranks;
    if (!len) return LOOM_SUCCESS;
    loomi_cuptr_t src[LOOMI_CUDA_REDN_MAX];
    for (int q = 0; q < n; q++) src[q] = in[q] + off;
    loom_result_t r = loomi_cuda_reduce_n(&x->dp->dev, dst, src, n, len, x->dtype, x->op,
                                          x->stream);
    if (r == LOOM_SUCCESS && x->op == LOOM_AVG)
        r = loomi_cuda_finish_avg(&x->dp->dev, dst, len, x->dtype, n, x->stream);
    return r;
}

static loom_result_t sync_stream(const struct run *x, const char *what)
{
    loomi_cu_t e = x->cu->StreamSynchronize(x->stream);
    if (e)
        return loomi_fail(LOOM_ERR_SYSTEM, x->comm->rank, "%s: device buffers: %s: %s", x->fn,
                          what, loomi_cuda_strerror(e));
    return LOOM_SUCCESS;
}

loom_result_t loomi_devpeer_call(struct loom_comm *comm, const char *fn, int coll,
                                 const void *sendbuf, void *recvbuf, size_t count,
                                 loom_datatype_t dtype, loom_op_t op, int root, void *stream,
                                 int *taken)
{
    *taken = 0;
    const int n = comm->nranks, me = comm->rank;
    /* Asked of this rank's setup only; what must be alike on every rank
     * (one host, LOOM_CUDA_IPC) is alike there too, or the exchange
     * below meets another call and fails as a mismatch. */
    if (!comm->set.cuda_ipc || n < 2 || !comm->hosts || comm->hosts->nhosts != 1 || !count)
        return LOOM_SUCCESS;
    if (coll != LOOMI_COLL_ALLREDUCE && coll != LOOMI_COLL_REDUCE_SCATTER &&
        coll != LOOMI_COLL_ALLGATHER && coll != LOOMI_COLL_BROADCAST &&
        coll != LOOMI_COLL_REDUCE)
        return LOOM_SUCCESS;
    const struct loomi_cuda_drv *cu = loomi_cuda_driver();
    const size_t es = loom_datatype_size(dtype), bytes = count * es;
    size_t slen, rlen;
    lengths(coll, n, me, root, bytes, &slen, &rlen);
    const int reduces = coll == LOOMI_COLL_ALLREDUCE || coll == LOOMI_COLL_REDUCE_SCATTER ||
                        coll == LOOMI_COLL_REDUCE;
    struct row mine = {.magic = MAGIC, .count = count, .coll = coll, .dtype = dtype,
                       .op = reduces ? op : 0, .root = root, .pid = (int32_t)getpid(),
                       .has_send = slen != 0, .has_recv = rlen != 0};
    struct loomi_devpeer *dp = NULL;
    loom_result_t why = LOOM_SUCCESS;
    if (!loomi_cuda_ipc())
        why = loomi_fail(LOOM_ERR_UNSUPPORTED, me, "the driver has no CUDA IPC functions");
    else if (reduces && n > LOOMI_CUDA_REDN_MAX)
        why = loomi_fail(LOOM_ERR_UNSUPPORTED, me, "more than %d ranks", LOOMI_CUDA_REDN_MAX);
    else if ((why = device(comm, rlen ? recvbuf : sendbuf, &dp)) == LOOM_SUCCESS &&
             (!slen || (why = loomi_cuipc_export(sendbuf, slen, "sendbuf", me, &mine.send)) ==
                           LOOM_SUCCESS) &&
             (!rlen || (why = loomi_cuipc_export(recvbuf, rlen, "recvbuf", me, &mine.recv)) ==
                           LOOM_SUCCESS)) {
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
        LOOMI_INFO(me, "%s: device buffers: no CUDA IPC path here (%s): staged", fn,
                   loom_get_last_error());

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
        if (x->magic != MAGIC || x->count != count || x->coll != coll ||
            x->dtype != (int32_t)dtype || x->op != mine.op || x->root != root) {
            r = loomi_fail(LOOM_ERR_MISMATCH, me,
                           "%s: rank %d called collective %d with count %llu of dtype %d, op "
                           "%d, root %d; rank %d collective %d with count %zu of dtype %d, op "
                           "%d, root %d (device buffers)",
                           fn, q, (int)x->coll, (unsigned long long)x->count, (int)x->dtype,
                           (int)x->op, (int)x->root, me, coll, count, (int)dtype, (int)mine.op,
                           root);
            goto out;
        }
        if (!x->ok) every = 0;
        /* IPC opens another process's memory, never the opener's own. */
        for (int p = 0; p < q; p++)
            if (all[p].pid == x->pid) every = 0;
    }
    if (!every) goto out; /* every rank stages */
    *taken = 1;

    /* Map what this rank reads or writes of each peer's, its lengths
     * checked first: a peer's row is only what it says. */
    loom_result_t mine_r = LOOM_SUCCESS;
    const int need_send = coll != LOOMI_COLL_BROADCAST || me != root;
    for (int q = 0; q < n && mine_r == LOOM_SUCCESS; q++) {
        if (q == me) {
            in[q] = (loomi_cuptr_t)(uintptr_t)sendbuf;
            peer_recv[q] = (loomi_cuptr_t)(uintptr_t)recvbuf;
            continue;
        }
        size_t sl, rl;
        lengths(coll, n, q, root, bytes, &sl, &rl);
        const struct row *x = &all[q];
        if (x->has_send != (sl != 0) || x->has_recv != (rl != 0) ||
            (sl && x->send.len != sl) || (rl && x->recv.len != rl)) {
            mine_r = loomi_fail(LOOM_ERR_REMOTE, me,
                                "%s: rank %d sent buffers of %llu and %llu bytes, not %zu and "
                                "%zu",
                                fn, q, (unsigned long long)x->send.len,
                                (unsigned long long)x->recv.len, sl, rl);
            break;
        }
        const int want_send = sl && need_send && (coll != LOOMI_COLL_REDUCE || me == root);
        if (want_send) mine_r = loomi_cuipc_open(&dp->ipc, me, q, &x->send, &in[q]);
        if (mine_r == LOOM_SUCCESS && coll == LOOMI_COLL_ALLREDUCE)
            mine_r = loomi_cuipc_open(&dp->ipc, me, q, &x->recv, &peer_recv[q]);
    }
    const struct run x = {comm, fn, cu, dp, es, dtype, op, stream};
    const loomi_cuptr_t rb = (loomi_cuptr_t)(uintptr_t)recvbuf,
                        sb = (loomi_cuptr_t)(uintptr_t)sendbuf;
    int any = 0;
    if (mine_r == LOOM_SUCCESS) {
        switch (coll) {
        case LOOMI_COLL_ALLREDUCE: {
            size_t lo, len;
            slice(count, n, me, &lo, &len);
            mine_r = reduce(&x, rb + lo * es, in, lo * es, len);
            break;
        }
        case LOOMI_COLL_REDUCE_SCATTER:
            mine_r = reduce(&x, rb, in, (size_t)me * bytes, count);
            break;
        case LOOMI_COLL_REDUCE:
            if (me == root) mine_r = reduce(&x, rb, in, 0, count);
            break;
        case LOOMI_COLL_ALLGATHER:
            for (int q = 0; q < n && mine_r == LOOM_SUCCESS; q++)
                mine_r = copy(&x, rb + (size_t)q * bytes, in[q], bytes, q);
            break;
        case LOOMI_COLL_BROADCAST:
            mine_r = copy(&x, rb, me == root ? sb : in[root], bytes, root);
            break;
        }
    }
    if (mine_r == LOOM_SUCCESS) mine_r = sync_stream(&x, "the reduction or copies");
    if (coll == LOOMI_COLL_ALLREDUCE) {
        /* Every slice reduced before any is copied. */
        if ((r = phase(comm, fn, mine_r != LOOM_SUCCESS, &any)) != LOOM_SUCCESS) goto out;
        if (any) goto failed;
        for (int q = 0; q < n && mine_r == LOOM_SUCCESS; q++) {
            size_t qlo, qlen;
            slice(count, n, q, &qlo, &qlen);
            if (q != me) mine_r = copy(&x, rb + qlo * es, peer_recv[q] + qlo * es, qlen * es, q);
        }
        if (mine_r == LOOM_SUCCESS) mine_r = sync_stream(&x, "the copies");
    }
    /* No rank returns while a peer may still read its buffers. */
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
