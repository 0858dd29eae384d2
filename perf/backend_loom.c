/*
 * backend_loom.c - the Loom backend of the perf harness.
 */
#include "perf_common.h"

#include <stdio.h>

#include "loom.h"

/* The harness numbers types and ops as loom.h does, so a cast suffices. */
_Static_assert((int)PERF_INT8 == (int)LOOM_INT8 &&
                   (int)PERF_UINT8 == (int)LOOM_UINT8 &&
                   (int)PERF_INT32 == (int)LOOM_INT32 &&
                   (int)PERF_UINT32 == (int)LOOM_UINT32 &&
                   (int)PERF_INT64 == (int)LOOM_INT64 &&
                   (int)PERF_UINT64 == (int)LOOM_UINT64 &&
                   (int)PERF_HALF == (int)LOOM_FLOAT16 &&
                   (int)PERF_FLOAT == (int)LOOM_FLOAT32 &&
                   (int)PERF_DOUBLE == (int)LOOM_FLOAT64 &&
                   (int)PERF_BFLOAT16 == (int)LOOM_BFLOAT16 &&
                   (int)PERF_NUM_DTYPES == (int)LOOM_NUM_DATATYPES,
               "perf_dtype_t and loom_datatype_t differ");
_Static_assert((int)PERF_SUM == (int)LOOM_SUM &&
                   (int)PERF_PROD == (int)LOOM_PROD &&
                   (int)PERF_MAX == (int)LOOM_MAX &&
                   (int)PERF_MIN == (int)LOOM_MIN &&
                   (int)PERF_AVG == (int)LOOM_AVG &&
                   (int)PERF_NUM_OPS == (int)LOOM_NUM_OPS,
               "perf_op_t and loom_op_t differ");

static loom_comm_t comm;
static int my_rank = -1, nranks;

/* loom_strerror plus the detailed message of the failing call. */
static int fail(loom_result_t res, const char *what, char *err, size_t errlen)
{
    const char *detail = loom_get_last_error();

    snprintf(err, errlen, "%s: %s%s%s", what, loom_strerror(res),
             detail && *detail ? ": " : "", detail ? detail : "");
    return (int)res;
}

static int be_init(int *argc, char ***argv, char *err, size_t errlen)
{
    loom_result_t res;

    (void)argc;
    (void)argv;
    res = loom_comm_init_env(&comm, NULL);
    if (res != LOOM_SUCCESS)
        return fail(res, "loom_comm_init_env", err, errlen);
    res = loom_comm_rank(comm, &my_rank);
    if (res != LOOM_SUCCESS)
        return fail(res, "loom_comm_rank", err, errlen);
    res = loom_comm_size(comm, &nranks);
    if (res != LOOM_SUCCESS)
        return fail(res, "loom_comm_size", err, errlen);
    return 0;
}

static int be_rank(void) { return my_rank; }
static int be_size(void) { return nranks; }

/* No loom_barrier yet: a one-element allreduce synchronises as well. */
static int be_barrier(char *err, size_t errlen)
{
    int32_t token = 0;
    loom_result_t res =
        loom_allreduce(&token, &token, 1, LOOM_INT32, LOOM_SUM, comm);

    return res == LOOM_SUCCESS ? 0 : fail(res, "barrier", err, errlen);
}

static int be_supports(const perf_call_t *call, const char **why)
{
    if (call->coll == PERF_ALLREDUCE)
        return 1;
    *why = "collective not in loom.h yet";
    return 0;
}

static int be_run(const perf_call_t *call, char *err, size_t errlen)
{
    loom_datatype_t dtype = (loom_datatype_t)call->dtype;
    loom_op_t op = (loom_op_t)call->op;
    loom_request_t req = LOOM_REQUEST_NULL;
    loom_result_t res;

    switch (call->coll) {
    case PERF_ALLREDUCE:
        if (call->blocking) {
            res = loom_allreduce(call->sendbuf, call->recvbuf, call->count,
                                 dtype, op, comm);
            if (res != LOOM_SUCCESS)
                return fail(res, "loom_allreduce", err, errlen);
            return 0;
        }
        res = loom_iallreduce(call->sendbuf, call->recvbuf, call->count,
                              dtype, op, comm, &req);
        if (res != LOOM_SUCCESS)
            return fail(res, "loom_iallreduce", err, errlen);
        res = loom_wait(&req);
        if (res != LOOM_SUCCESS)
            return fail(res, "loom_wait", err, errlen);
        return 0;
    default:
        snprintf(err, errlen, "collective %d not in loom.h yet",
                 (int)call->coll);
        return -1;
    }
}

static int be_allreduce_doubles(double *vals, size_t n, perf_op_t op,
                                char *err, size_t errlen)
{
    loom_result_t res =
        loom_allreduce(vals, vals, n, LOOM_FLOAT64, (loom_op_t)op, comm);

    return res == LOOM_SUCCESS ? 0
                               : fail(res, "allreduce of doubles", err, errlen);
}

static void be_abort(void)
{
    if (comm)
        loom_comm_abort(comm);
    comm = NULL;
}

static int be_finalize(char *err, size_t errlen)
{
    loom_result_t res;

    if (!comm)
        return 0;
    res = loom_comm_destroy(comm);
    comm = NULL;
    return res == LOOM_SUCCESS ? 0
                               : fail(res, "loom_comm_destroy", err, errlen);
}

const perf_backend_t perf_backend = {
    .name = "loom",
    .init = be_init,
    .rank = be_rank,
    .size = be_size,
    .barrier = be_barrier,
    .supports = be_supports,
    .run = be_run,
    .allreduce_doubles = be_allreduce_doubles,
    .abort = be_abort,
    .finalize = be_finalize,
};
