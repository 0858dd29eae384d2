/*
 * backend_mpi.c - an MPI backend for the perf harness, so that Open MPI
 * (or any MPI) is measured with the same data, checks and table as Loom.
 * Not part of the normal build: see README.
 */
#include "../perf_common.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>

#include <mpi.h>

static int my_rank = -1, nranks;

static int fail(int code, const char *what, char *err, size_t errlen)
{
    char msg[MPI_MAX_ERROR_STRING] = "";
    int len = 0;

    MPI_Error_string(code, msg, &len);
    snprintf(err, errlen, "%s: %s", what, msg);
    return code ? code : -1;
}

/* MPI has no 16-bit floats: those types are skipped. */
static MPI_Datatype mpi_type(perf_dtype_t t)
{
    switch (t) {
    case PERF_INT8: return MPI_INT8_T;
    case PERF_UINT8: return MPI_UINT8_T;
    case PERF_INT32: return MPI_INT32_T;
    case PERF_UINT32: return MPI_UINT32_T;
    case PERF_INT64: return MPI_INT64_T;
    case PERF_UINT64: return MPI_UINT64_T;
    case PERF_FLOAT: return MPI_FLOAT;
    case PERF_DOUBLE: return MPI_DOUBLE;
    default: return MPI_DATATYPE_NULL;
    }
}

/* avg is not an MPI op: it runs as MPI_SUM and a local division. */
static MPI_Op mpi_op(perf_op_t op)
{
    switch (op) {
    case PERF_SUM: case PERF_AVG: return MPI_SUM;
    case PERF_PROD: return MPI_PROD;
    case PERF_MAX: return MPI_MAX;
    case PERF_MIN: return MPI_MIN;
    default: return MPI_OP_NULL;
    }
}

static int be_init(int *argc, char ***argv, char *err, size_t errlen)
{
    int rc = MPI_Init(argc, argv);

    if (rc != MPI_SUCCESS)
        return fail(rc, "MPI_Init", err, errlen);
    /* Errors come back to the harness, which reports and aborts. */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &my_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    return 0;
}

static int be_rank(void) { return my_rank; }
static int be_size(void) { return nranks; }

static int be_barrier(char *err, size_t errlen)
{
    int rc = MPI_Barrier(MPI_COMM_WORLD);

    return rc == MPI_SUCCESS ? 0 : fail(rc, "MPI_Barrier", err, errlen);
}

static int be_supports(const perf_call_t *call, const char **why)
{
    if (call->coll != PERF_ALLREDUCE) {
        *why = "collective not wired up in backend_mpi.c yet";
        return 0;
    }
    if (mpi_type(call->dtype) == MPI_DATATYPE_NULL) {
        *why = "no MPI datatype";
        return 0;
    }
    return 1;
}

#define DIVIDE(T)                                                              \
    do {                                                                       \
        T *p = buf;                                                            \
        for (size_t i = 0; i < count; i++)                                     \
            p[i] = (T)(p[i] / (T)nranks);                                      \
    } while (0)

static void divide(void *buf, size_t count, perf_dtype_t t)
{
    switch (t) {
    case PERF_INT8: DIVIDE(int8_t); break;
    case PERF_UINT8: DIVIDE(uint8_t); break;
    case PERF_INT32: DIVIDE(int32_t); break;
    case PERF_UINT32: DIVIDE(uint32_t); break;
    case PERF_INT64: DIVIDE(int64_t); break;
    case PERF_UINT64: DIVIDE(uint64_t); break;
    case PERF_FLOAT: DIVIDE(float); break;
    case PERF_DOUBLE: DIVIDE(double); break;
    default: break;
    }
}

static int be_run(const perf_call_t *call, char *err, size_t errlen)
{
    const void *send =
        call->sendbuf == call->recvbuf ? MPI_IN_PLACE : call->sendbuf;
    MPI_Datatype type = mpi_type(call->dtype);
    MPI_Request req;
    int rc;

    if (call->coll != PERF_ALLREDUCE) {
        snprintf(err, errlen, "collective %d not wired up in backend_mpi.c",
                 (int)call->coll);
        return -1;
    }
    if (call->count > (size_t)INT_MAX) {
        snprintf(err, errlen, "count %zu exceeds MPI's int count",
                 call->count);
        return -1;
    }
    if (call->blocking) {
        rc = MPI_Allreduce(send, call->recvbuf, (int)call->count, type,
                           mpi_op(call->op), MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS)
            return fail(rc, "MPI_Allreduce", err, errlen);
    } else {
        rc = MPI_Iallreduce(send, call->recvbuf, (int)call->count, type,
                            mpi_op(call->op), MPI_COMM_WORLD, &req);
        if (rc != MPI_SUCCESS)
            return fail(rc, "MPI_Iallreduce", err, errlen);
        rc = MPI_Wait(&req, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS)
            return fail(rc, "MPI_Wait", err, errlen);
    }
    if (call->op == PERF_AVG)
        divide(call->recvbuf, call->count, call->dtype);
    return 0;
}

static int be_allreduce_doubles(double *vals, size_t n, perf_op_t op,
                                char *err, size_t errlen)
{
    int rc = MPI_Allreduce(MPI_IN_PLACE, vals, (int)n, MPI_DOUBLE, mpi_op(op),
                           MPI_COMM_WORLD);

    return rc == MPI_SUCCESS ? 0 : fail(rc, "MPI_Allreduce", err, errlen);
}

static void be_abort(void)
{
    MPI_Abort(MPI_COMM_WORLD, 1);
}

static int be_finalize(char *err, size_t errlen)
{
    int rc = MPI_Finalize();

    return rc == MPI_SUCCESS ? 0 : fail(rc, "MPI_Finalize", err, errlen);
}

const perf_backend_t perf_backend = {
    .name = "mpi",
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
