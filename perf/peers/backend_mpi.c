/*
 * backend_mpi.c - an MPI backend for the perf harness, so that Open MPI
 * (or any MPI) is measured with the same data, checks and table as Loom.
 * Not part of the normal build: see README.
 */
#include "../perf_common.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

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

/* The library's own version line, so that tables say what they measured. */
static void be_describe(char *buf, size_t len)
{
    char v[MPI_MAX_LIBRARY_VERSION_STRING] = "";
    int n = 0;

    MPI_Get_library_version(v, &n);
    v[strcspn(v, ",\n")] = '\0';
    snprintf(buf, len, "MPI: %s", v);
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

/* Completes a non-blocking call, or passes a blocking one's status on. */
static int finish(int rc, MPI_Request *req, const char *what, char *err,
                  size_t errlen)
{
    if (rc != MPI_SUCCESS)
        return fail(rc, what, err, errlen);
    if (req) {
        rc = MPI_Wait(req, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS)
            return fail(rc, "MPI_Wait", err, errlen);
    }
    return 0;
}

/*
 * One call.  The harness lays out in-place buffers by NCCL's rules
 * (loom.h); MPI_IN_PLACE means the same for every collective here but
 * reduce-scatter, whose MPI result lands at the start of the buffer
 * rather than at block `rank`: it is moved there, inside the timing, so
 * that both libraries deliver the same thing.  avg, which MPI lacks, is a
 * sum and a local division, timed too.
 */
static int be_run(const perf_call_t *call, char *err, size_t errlen)
{
    MPI_Datatype type = mpi_type(call->dtype);
    MPI_Op op = mpi_op(call->op);
    MPI_Comm w = MPI_COMM_WORLD;
    MPI_Request req = MPI_REQUEST_NULL, *rq = call->blocking ? NULL : &req;
    const char *sb = call->sendbuf;
    char *rb = call->recvbuf;
    int n = (int)call->count, root = call->root, tsize = 0, rc;
    size_t block;
    int is_root = my_rank == root;

    if (call->count > (size_t)INT_MAX) {
        snprintf(err, errlen, "count %zu exceeds MPI's int count",
                 call->count);
        return -1;
    }
    MPI_Type_size(type, &tsize);
    block = call->count * (size_t)tsize; /* bytes of one rank's block */

    switch (call->coll) {
    case PERF_ALLREDUCE: {
        const void *s = sb == rb ? MPI_IN_PLACE : sb;
        rc = rq ? MPI_Iallreduce(s, rb, n, type, op, w, rq)
                : MPI_Allreduce(s, rb, n, type, op, w);
        if ((rc = finish(rc, rq, "MPI_Allreduce", err, errlen)) != 0)
            return rc;
        if (call->op == PERF_AVG)
            divide(rb, call->count, call->dtype);
        return 0;
    }
    case PERF_REDUCE_SCATTER: {
        int ip = rb == sb + (size_t)my_rank * block;
        void *out = ip ? (void *)sb : rb;
        const void *s = ip ? MPI_IN_PLACE : sb;
        rc = rq ? MPI_Ireduce_scatter_block(s, out, n, type, op, w, rq)
                : MPI_Reduce_scatter_block(s, out, n, type, op, w);
        if ((rc = finish(rc, rq, "MPI_Reduce_scatter_block", err, errlen)) != 0)
            return rc;
        if (ip && my_rank != 0)
            memmove(rb, out, block);
        if (call->op == PERF_AVG)
            divide(rb, call->count, call->dtype);
        return 0;
    }
    case PERF_ALLGATHER: {
        int ip = sb == rb + (size_t)my_rank * block;
        rc = rq ? MPI_Iallgather(ip ? MPI_IN_PLACE : sb, n, type, rb, n, type,
                                 w, rq)
                : MPI_Allgather(ip ? MPI_IN_PLACE : sb, n, type, rb, n, type,
                                w);
        return finish(rc, rq, "MPI_Allgather", err, errlen);
    }
    case PERF_ALLTOALL: {
        const void *s = sb == rb ? MPI_IN_PLACE : sb;
        rc = rq ? MPI_Ialltoall(s, n, type, rb, n, type, w, rq)
                : MPI_Alltoall(s, n, type, rb, n, type, w);
        return finish(rc, rq, "MPI_Alltoall", err, errlen);
    }
    case PERF_BROADCAST:
        /* NCCL's broadcast also fills the root's receive buffer. */
        if (is_root && sb != rb)
            memcpy(rb, sb, block);
        rc = rq ? MPI_Ibcast(rb, n, type, root, w, rq)
                : MPI_Bcast(rb, n, type, root, w);
        return finish(rc, rq, "MPI_Bcast", err, errlen);
    case PERF_REDUCE: {
        /* MPI_IN_PLACE is for the root only. */
        const void *s = is_root && sb == rb ? MPI_IN_PLACE : sb;
        rc = rq ? MPI_Ireduce(s, rb, n, type, op, root, w, rq)
                : MPI_Reduce(s, rb, n, type, op, root, w);
        if ((rc = finish(rc, rq, "MPI_Reduce", err, errlen)) != 0)
            return rc;
        if (is_root && call->op == PERF_AVG)
            divide(rb, call->count, call->dtype);
        return 0;
    }
    case PERF_GATHER: {
        const void *s =
            is_root && sb == rb + (size_t)root * block ? MPI_IN_PLACE : sb;
        rc = rq ? MPI_Igather(s, n, type, rb, n, type, root, w, rq)
                : MPI_Gather(s, n, type, rb, n, type, root, w);
        return finish(rc, rq, "MPI_Gather", err, errlen);
    }
    case PERF_SCATTER: {
        void *r = is_root && rb == sb + (size_t)root * block ? MPI_IN_PLACE
                                                              : (void *)rb;
        rc = rq ? MPI_Iscatter(sb, n, type, r, n, type, root, w, rq)
                : MPI_Scatter(sb, n, type, r, n, type, root, w);
        return finish(rc, rq, "MPI_Scatter", err, errlen);
    }
    case PERF_SENDRECV: {
        MPI_Request two[2];
        /* One buffer both ways is MPI_Sendrecv_replace, which has no
         * non-blocking form before MPI 4: it serves -z 0 too. */
        if (sb == rb) {
            rc = MPI_Sendrecv_replace(rb, n, type, call->peer, 0,
                                      call->recv_peer, 0, w,
                                      MPI_STATUS_IGNORE);
            return finish(rc, NULL, "MPI_Sendrecv_replace", err, errlen);
        }
        if (!rq) {
            rc = MPI_Sendrecv(sb, n, type, call->peer, 0, rb, n, type,
                              call->recv_peer, 0, w, MPI_STATUS_IGNORE);
            return finish(rc, NULL, "MPI_Sendrecv", err, errlen);
        }
        rc = MPI_Irecv(rb, n, type, call->recv_peer, 0, w, &two[0]);
        if (rc != MPI_SUCCESS)
            return fail(rc, "MPI_Irecv", err, errlen);
        rc = MPI_Isend(sb, n, type, call->peer, 0, w, &two[1]);
        if (rc != MPI_SUCCESS)
            return fail(rc, "MPI_Isend", err, errlen);
        rc = MPI_Waitall(2, two, MPI_STATUSES_IGNORE);
        return rc == MPI_SUCCESS ? 0 : fail(rc, "MPI_Waitall", err, errlen);
    }
    default:
        snprintf(err, errlen, "collective %d unknown to backend_mpi.c",
                 (int)call->coll);
        return -1;
    }
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

/* -R 1: MPI_Alloc_mem, MPI's own memory for communication. */
static void *be_mem_alloc(size_t bytes, char *err, size_t errlen)
{
    void *p = NULL;

    if (MPI_Alloc_mem((MPI_Aint)bytes, MPI_INFO_NULL, &p) != MPI_SUCCESS) {
        snprintf(err, errlen, "MPI_Alloc_mem of %zu bytes failed", bytes);
        return NULL;
    }
    return p;
}

static void be_mem_free(void *p) { MPI_Free_mem(p); }

const perf_backend_t perf_backend = {
    .name = "mpi",
    .mem_alloc = be_mem_alloc,
    .mem_free = be_mem_free,
    .init = be_init,
    .describe = be_describe,
    .rank = be_rank,
    .size = be_size,
    .barrier = be_barrier,
    .supports = be_supports,
    .run = be_run,
    .allreduce_doubles = be_allreduce_doubles,
    .abort = be_abort,
    .finalize = be_finalize,
};
