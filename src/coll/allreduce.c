/* allreduce.c - the public allreduce calls: validate, select, plan, run. */
#include <string.h>

#include "coll/coll.h"
#include "comm/comm.h"
#include "core/internal.h"

/* Argument checks shared by the blocking and non-blocking forms.  Nothing
 * is touched before they pass. */
static loom_result_t check_args(const char *fn, const void *sendbuf, void *recvbuf,
                                size_t count, loom_datatype_t dtype, loom_op_t op,
                                loom_comm_t comm)
{
    loom_result_t r = loomi_comm_check(comm, fn);
    if (r != LOOM_SUCCESS) return r;
    size_t es = loom_datatype_size(dtype);
    if (!es)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, comm->rank,
                          "%s: dtype %d is not a valid datatype", fn, (int)dtype);
    if ((unsigned)op >= LOOM_NUM_OPS)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, comm->rank,
                          "%s: op %d is not a valid reduction op", fn, (int)op);
    if (count > SIZE_MAX / es / 2)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, comm->rank,
                          "%s: count %zu is too large", fn, count);
    if (count == 0) return LOOM_SUCCESS;
    if (!sendbuf)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, comm->rank, "%s: sendbuf is NULL", fn);
    if (!recvbuf)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, comm->rank, "%s: recvbuf is NULL", fn);
    uintptr_t s = (uintptr_t)sendbuf, d = (uintptr_t)recvbuf, n = count * es;
    if (s != d && s < d + n && d < s + n)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, comm->rank,
                          "%s: sendbuf and recvbuf overlap without being equal (in place)", fn);
    return LOOM_SUCCESS;
}

static loom_result_t start(const char *fn, const void *sendbuf, void *recvbuf, size_t count,
                           loom_datatype_t dtype, loom_op_t op, loom_comm_t comm,
                           struct loomi_op **out)
{
    loom_result_t r = check_args(fn, sendbuf, recvbuf, count, dtype, op, comm);
    if (r != LOOM_SUCCESS) return r;
    struct loomi_sched s;
    loomi_sched_init(&s, comm->rank, comm->nranks, dtype, op);
    int inplace = sendbuf == recvbuf;
    switch (loomi_algo_for(comm, LOOMI_COLL_ALLREDUCE, count * s.esize)) {
    case LOOMI_ALGO_RING:
    default:
        r = loomi_allreduce_ring(&s, count, inplace, comm->set.chunk_bytes);
        break;
    }
    if (r != LOOM_SUCCESS) {
        loomi_sched_free(&s);
        return r;
    }
    LOOMI_TRACE(comm->rank, "%s: count %zu %s %s, ring, %u steps", fn, count,
                loomi_dtype_name(dtype), loomi_op_name(op), s.nsteps);
    return loomi_op_start(comm, &s, sendbuf, recvbuf, inplace, out);
}

loom_result_t loom_allreduce(const void *sendbuf, void *recvbuf, size_t count,
                             loom_datatype_t dtype, loom_op_t op, loom_comm_t comm)
{
    struct loomi_op *o;
    loom_result_t r = start("loom_allreduce", sendbuf, recvbuf, count, dtype, op, comm, &o);
    if (r != LOOM_SUCCESS) return r;
    return loomi_op_wait(o);
}

loom_result_t loom_iallreduce(const void *sendbuf, void *recvbuf, size_t count,
                              loom_datatype_t dtype, loom_op_t op, loom_comm_t comm,
                              loom_request_t *req)
{
    if (!req)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1, "loom_iallreduce: req is NULL");
    struct loomi_op *o;
    loom_result_t r = start("loom_iallreduce", sendbuf, recvbuf, count, dtype, op, comm, &o);
    if (r != LOOM_SUCCESS) return r;
    *req = (loom_request_t)o;
    return LOOM_SUCCESS;
}

/* Requests are operations; the cast keeps the public type opaque. */
loom_result_t loom_wait(loom_request_t *req)
{
    if (!req) return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1, "loom_wait: req is NULL");
    if (*req == LOOM_REQUEST_NULL) return LOOM_SUCCESS;
    struct loomi_op *o = (struct loomi_op *)*req;
    *req = LOOM_REQUEST_NULL;
    return loomi_op_wait(o);
}

loom_result_t loom_test(loom_request_t *req, int *done)
{
    if (!req) return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1, "loom_test: req is NULL");
    if (!done) return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1, "loom_test: done is NULL");
    if (*req == LOOM_REQUEST_NULL) {
        *done = 1;
        return LOOM_SUCCESS;
    }
    loom_result_t r = loomi_op_test((struct loomi_op *)*req, done);
    if (*done) *req = LOOM_REQUEST_NULL;
    return r;
}
