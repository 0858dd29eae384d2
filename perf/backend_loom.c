/*
 * backend_loom.c - the Loom backend of the perf harness.
 */
#include "perf_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* Per thread: with -t each thread is a rank with its own communicator. */
static _Thread_local loom_comm_t comm;
static _Thread_local int my_rank = -1, nranks;

/* -t: what the threads of this process share, set by be_setup_threads
 * before they start. */
static struct {
    int nthreads, nprocs, proc;
    loom_unique_id_t id;
} job;

/* loom_strerror plus the detailed message of the failing call. */
static int fail(loom_result_t res, const char *what, char *err, size_t errlen)
{
    const char *detail = loom_get_last_error();

    snprintf(err, errlen, "%s: %s%s%s", what, loom_strerror(res),
             detail && *detail ? ": " : "", detail ? detail : "");
    return (int)res;
}

/*
 * Whether a launcher started this process: any of the variables that
 * loom_comm_init_env reads to find its rank (LOOM_RANK, LOOM_SIZE or
 * LOOM_ROOT alone already count, so that init names what is missing),
 * else a complete pair of another launcher's.  Without one the process
 * is a job of its own, as an nccl-tests binary started without mpirun.
 */
static int have_launcher(void)
{
    static const char *const loom[] = {"LOOM_RANK", "LOOM_SIZE", "LOOM_ROOT"};
    static const char *const pairs[][2] = {
        {"RANK", "WORLD_SIZE"},
        {"SLURM_PROCID", "SLURM_NTASKS"},
        {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"}};

    for (size_t i = 0; i < sizeof loom / sizeof loom[0]; i++) {
        const char *v = getenv(loom[i]);
        if (v && *v)
            return 1;
    }
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        const char *a = getenv(pairs[i][0]), *b = getenv(pairs[i][1]);
        if (a && *a && b && *b)
            return 1;
    }
    return 0;
}

static int init_done(char *err, size_t errlen)
{
    loom_result_t res = loom_comm_rank(comm, &my_rank);
    if (res != LOOM_SUCCESS)
        return fail(res, "loom_comm_rank", err, errlen);
    res = loom_comm_size(comm, &nranks);
    if (res != LOOM_SUCCESS)
        return fail(res, "loom_comm_size", err, errlen);
    return 0;
}

static int be_init(int *argc, char ***argv, char *err, size_t errlen)
{
    loom_unique_id_t id;
    loom_result_t res;

    (void)argc;
    (void)argv;
    if (have_launcher()) {
        res = loom_comm_init_env(&comm, NULL);
        if (res != LOOM_SUCCESS)
            return fail(res, "loom_comm_init_env", err, errlen);
        return init_done(err, errlen);
    }
    /* No launcher: a job of one rank. */
    res = loom_get_unique_id(&id);
    if (res != LOOM_SUCCESS)
        return fail(res, "loom_get_unique_id", err, errlen);
    res = loom_comm_init_rank(&comm, 1, &id, 0, NULL);
    if (res != LOOM_SUCCESS)
        return fail(res, "loom_comm_init_rank", err, errlen);
    return init_done(err, errlen);
}

/*
 * -t T: rank p*T+t of P*T for thread t of process p of P, as nccl-tests
 * numbers them.  The processes form a communicator from the launcher's
 * environment only to pass process 0's unique id to the others, then
 * each thread joins the job of that id.  Without a launcher P is 1.
 */
static int be_setup_threads(int nthreads, char *err, size_t errlen)
{
    loom_comm_t pcomm = NULL;
    loom_result_t res;

    job.nthreads = nthreads;
    job.nprocs = 1;
    job.proc = 0;
    if (!have_launcher()) {
        res = loom_get_unique_id(&job.id);
        return res == LOOM_SUCCESS ? 0
                                   : fail(res, "loom_get_unique_id", err, errlen);
    }
    res = loom_comm_init_env(&pcomm, NULL);
    if (res != LOOM_SUCCESS)
        return fail(res, "loom_comm_init_env", err, errlen);
    if (loom_comm_rank(pcomm, &job.proc) != LOOM_SUCCESS ||
        loom_comm_size(pcomm, &job.nprocs) != LOOM_SUCCESS) {
        loom_comm_destroy(pcomm);
        snprintf(err, errlen, "cannot read the process communicator's rank");
        return -1;
    }
    if (job.nprocs > (1 << 20) / nthreads) {
        loom_comm_destroy(pcomm);
        snprintf(err, errlen, "%d processes x %d threads is too many ranks",
                 job.nprocs, nthreads);
        return -1;
    }
    res = job.proc == 0 ? loom_get_unique_id(&job.id) : LOOM_SUCCESS;
    if (res != LOOM_SUCCESS) {
        /* The others wait in the broadcast: abort it for them. */
        fail(res, "loom_get_unique_id", err, errlen);
        loom_comm_abort(pcomm);
        return (int)res;
    }
    res = loom_broadcast(&job.id, &job.id, sizeof job.id, LOOM_UINT8, 0, pcomm);
    if (res != LOOM_SUCCESS) {
        fail(res, "loom_broadcast of the unique id", err, errlen);
        loom_comm_abort(pcomm);
        return (int)res;
    }
    res = loom_comm_destroy(pcomm);
    return res == LOOM_SUCCESS ? 0 : fail(res, "loom_comm_destroy", err, errlen);
}

static int be_thread_init(int thread, char *err, size_t errlen)
{
    loom_result_t res = loom_comm_init_rank(&comm, job.nprocs * job.nthreads,
                                            &job.id,
                                            job.proc * job.nthreads + thread,
                                            NULL);

    if (res != LOOM_SUCCESS)
        return fail(res, "loom_comm_init_rank", err, errlen);
    return init_done(err, errlen);
}

/* The library reads LOOM_ALGO itself (and rejects a bad value at init);
 * the header repeats it, as nccl-tests repeats NCCL_ALGO's effect. */
static void be_describe(char *buf, size_t len)
{
    const char *algo = getenv("LOOM_ALGO");
    int major = 0, minor = 0, patch = 0;

    loom_get_version(&major, &minor, &patch);
    snprintf(buf, len, "Loom %d.%d.%d  algorithm: %s%s", major, minor, patch,
             algo && *algo ? "LOOM_ALGO=" : "auto",
             algo && *algo ? algo : "");
}

static int be_rank(void) { return my_rank; }
static int be_size(void) { return nranks; }

/* Every collective of the harness is in loom.h; whether it runs is the
 * library's answer (LOOM_ERR_UNSUPPORTED otherwise, reported per call). */
static int be_supports(const perf_call_t *call, const char **why)
{
    if (call->codec && call->dtype != PERF_FLOAT) {
        *why = "a codec compresses float data only";
        return 0;
    }
    if (call->codec && call->op != PERF_OP_NONE && call->op != PERF_SUM &&
        call->op != PERF_AVG) {
        *why = "a codec applies to sum and avg only";
        return 0;
    }
    return 1;
}

/* -A: the algorithm for this collective from the next call on, through
 * loom_comm_set_algo (which names the valid ones on a bad name). */
static int be_set_algo(perf_coll_t coll, const char *algo, char *err,
                       size_t errlen)
{
    static const char *const names[PERF_NUM_COLLS] = {
        [PERF_ALLREDUCE] = "allreduce", [PERF_REDUCE_SCATTER] = "reduce_scatter",
        [PERF_ALLGATHER] = "allgather", [PERF_ALLTOALL] = "alltoall",
        [PERF_BROADCAST] = "broadcast", [PERF_REDUCE] = "reduce",
        [PERF_GATHER] = "gather",       [PERF_SCATTER] = "scatter"};
    char spec[256];
    loom_result_t res;

    if ((unsigned)coll >= PERF_NUM_COLLS || !names[coll]) {
        snprintf(err, errlen, "sendrecv has no algorithms to choose from");
        return (int)LOOM_ERR_INVALID_ARGUMENT;
    }
    snprintf(spec, sizeof spec, "%s:%s", names[coll], algo);
    res = loom_comm_set_algo(comm, spec);
    return res == LOOM_SUCCESS ? 0 : fail(res, "loom_comm_set_algo", err, errlen);
}

/* A non-blocking call's request, waited on; a blocking call's result. */
static int finish(loom_result_t res, loom_request_t *req, const char *what,
                  char *err, size_t errlen)
{
    if (res != LOOM_SUCCESS)
        return fail(res, what, err, errlen);
    if (req) {
        res = loom_wait(req);
        if (res != LOOM_SUCCESS)
            return fail(res, "loom_wait", err, errlen);
    }
    return 0;
}

/* Receive buffer of an in-place sendrecv (see sendrecv()). */
static _Thread_local void *stage;
static _Thread_local size_t stage_size;

/*
 * sendrecv as nccl-tests does it: a send and a receive in one group, so
 * that the ring of sends cannot deadlock; without blocking (-z 0), a
 * non-blocking send and receive (groups take blocking calls only).
 *
 * In place, the received data replaces the data sent, as with
 * MPI_Sendrecv_replace.  loom.h does not define a send and a receive on
 * the same memory (the incoming bytes may overwrite bytes not yet sent),
 * so the data is received into a staging buffer and copied, as Open MPI's
 * MPI_Sendrecv_replace does; the copy is timed with the transfer.
 */
static int sendrecv(const perf_call_t *call, char *err, size_t errlen)
{
    loom_datatype_t dtype = (loom_datatype_t)call->dtype;
    loom_request_t rq[2] = {LOOM_REQUEST_NULL, LOOM_REQUEST_NULL};
    size_t bytes = call->count * loom_datatype_size(dtype);
    void *rb = call->recvbuf;
    loom_result_t res, res2;

    if (call->sendbuf == call->recvbuf) {
        if (stage_size < bytes) {
            void *p = realloc(stage, bytes);
            if (!p) {
                snprintf(err, errlen, "out of memory for %zu bytes", bytes);
                return -1;
            }
            stage = p;
            stage_size = bytes;
        }
        rb = stage;
    }
    if (call->blocking) {
        res = loom_group_start();
        if (res != LOOM_SUCCESS)
            return fail(res, "loom_group_start", err, errlen);
        res = loom_send(call->sendbuf, call->count, dtype, call->peer, comm);
        if (res != LOOM_SUCCESS) {
            loom_group_end();
            return fail(res, "loom_send", err, errlen);
        }
        res = loom_recv(rb, call->count, dtype, call->recv_peer, comm);
        if (res != LOOM_SUCCESS) {
            loom_group_end();
            return fail(res, "loom_recv", err, errlen);
        }
        res = loom_group_end();
        if (res != LOOM_SUCCESS)
            return fail(res, "loom_group_end", err, errlen);
    } else {
        res = loom_irecv(rb, call->count, dtype, call->recv_peer, comm,
                         &rq[0]);
        if (res != LOOM_SUCCESS)
            return fail(res, "loom_irecv", err, errlen);
        res = loom_isend(call->sendbuf, call->count, dtype, call->peer, comm,
                         &rq[1]);
        if (res != LOOM_SUCCESS) {
            loom_wait(&rq[0]);
            return fail(res, "loom_isend", err, errlen);
        }
        res = loom_wait(&rq[0]);
        res2 = loom_wait(&rq[1]);
        if (res != LOOM_SUCCESS)
            return fail(res, "loom_wait (receive)", err, errlen);
        if (res2 != LOOM_SUCCESS)
            return fail(res2, "loom_wait (send)", err, errlen);
    }
    if (rb != call->recvbuf)
        memcpy(call->recvbuf, rb, bytes);
    return 0;
}

/* CALL(name, args...): loom_name(args..., comm) or, without blocking,
 * loom_iname(args..., comm, &req) and loom_wait. */
#define CALL(name, ...)                                                        \
    finish(call->blocking ? loom_##name(__VA_ARGS__, comm)                     \
                          : loom_i##name(__VA_ARGS__, comm, &req),             \
           call->blocking ? NULL : &req,                                       \
           call->blocking ? "loom_" #name : "loom_i" #name, err, errlen)

/* CALLO(name, args...): as CALL, for the *_opts forms with options o. */
#define CALLO(name, ...)                                                       \
    finish(call->blocking ? loom_##name##_opts(__VA_ARGS__, comm, &o)          \
                          : loom_i##name##_opts(__VA_ARGS__, comm, &o, &req),  \
           call->blocking ? NULL : &req,                                       \
           call->blocking ? "loom_" #name "_opts" : "loom_i" #name "_opts",    \
           err, errlen)

/* A call with a codec (-Z). */
static int run_codec(const perf_call_t *call, char *err, size_t errlen)
{
    loom_datatype_t dtype = (loom_datatype_t)call->dtype;
    loom_op_t op = (loom_op_t)call->op;
    loom_request_t req = LOOM_REQUEST_NULL;
    loom_coll_options_t o = LOOM_COLL_OPTIONS_INITIALIZER;
    loom_result_t res = loom_codec_find(call->codec, &o.codec);

    if (res != LOOM_SUCCESS)
        return fail(res, "loom_codec_find", err, errlen);
    switch (call->coll) {
    case PERF_ALLREDUCE:
        return CALLO(allreduce, call->sendbuf, call->recvbuf, call->count,
                     dtype, op);
    case PERF_REDUCE_SCATTER:
        return CALLO(reduce_scatter, call->sendbuf, call->recvbuf,
                     call->count, dtype, op);
    case PERF_ALLGATHER:
        return CALLO(allgather, call->sendbuf, call->recvbuf, call->count,
                     dtype);
    default:
        snprintf(err, errlen, "no compressed form of collective %d",
                 (int)call->coll);
        return -1;
    }
}

static int be_run(const perf_call_t *call, char *err, size_t errlen)
{
    loom_datatype_t dtype = (loom_datatype_t)call->dtype;
    loom_op_t op = (loom_op_t)call->op;
    loom_request_t req = LOOM_REQUEST_NULL;
    const void *sb = call->sendbuf;
    void *rb = call->recvbuf;
    size_t n = call->count;
    int root = call->root;

    if (call->codec)
        return run_codec(call, err, errlen);
    switch (call->coll) {
    case PERF_ALLREDUCE: return CALL(allreduce, sb, rb, n, dtype, op);
    case PERF_REDUCE_SCATTER:
        return CALL(reduce_scatter, sb, rb, n, dtype, op);
    case PERF_ALLGATHER: return CALL(allgather, sb, rb, n, dtype);
    case PERF_ALLTOALL: return CALL(alltoall, sb, rb, n, dtype);
    case PERF_BROADCAST: return CALL(broadcast, sb, rb, n, dtype, root);
    case PERF_REDUCE: return CALL(reduce, sb, rb, n, dtype, op, root);
    case PERF_GATHER: return CALL(gather, sb, rb, n, dtype, root);
    case PERF_SCATTER: return CALL(scatter, sb, rb, n, dtype, root);
    case PERF_SENDRECV: return sendrecv(call, err, errlen);
    default:
        snprintf(err, errlen, "collective %d unknown to backend_loom.c",
                 (int)call->coll);
        return -1;
    }
}

/*
 * The harness's own bookkeeping (barriers, times, error counts) runs over
 * point-to-point messages through rank 0, never over a collective: so it
 * does not depend on the collective under test, nor on the algorithm
 * LOOM_ALGO forces, and a broken algorithm shows up as #wrong rather than
 * as a harness failure.  The values are a few doubles per row.
 */
static int be_allreduce_doubles(double *vals, size_t n, perf_op_t op,
                                char *err, size_t errlen)
{
    double *all = NULL;
    loom_result_t res = LOOM_SUCCESS, end;

    if (nranks == 1)
        return 0;
    all = malloc((size_t)nranks * n * sizeof *all);
    if (!all) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (my_rank != 0) {
        /* One group: the send to rank 0 and the receive of the result. */
        loom_group_start();
        res = loom_send(vals, n, LOOM_FLOAT64, 0, comm);
        if (res == LOOM_SUCCESS)
            res = loom_recv(all, n, LOOM_FLOAT64, 0, comm);
        end = loom_group_end();
        if (res == LOOM_SUCCESS)
            res = end;
        if (res == LOOM_SUCCESS)
            memcpy(vals, all, n * sizeof *vals);
        free(all);
        return res == LOOM_SUCCESS ? 0
                                   : fail(res, "harness exchange", err, errlen);
    }
    loom_group_start();
    for (int r = 1; r < nranks && res == LOOM_SUCCESS; r++)
        res = loom_recv(all + (size_t)r * n, n, LOOM_FLOAT64, r, comm);
    end = loom_group_end();
    if (res == LOOM_SUCCESS)
        res = end;
    if (res == LOOM_SUCCESS) {
        for (int r = 1; r < nranks; r++) {
            for (size_t i = 0; i < n; i++) {
                double v = all[(size_t)r * n + i];
                if (op == PERF_MIN)
                    vals[i] = v < vals[i] ? v : vals[i];
                else if (op == PERF_MAX)
                    vals[i] = v > vals[i] ? v : vals[i];
                else
                    vals[i] += v;
            }
        }
        loom_group_start();
        for (int r = 1; r < nranks && res == LOOM_SUCCESS; r++)
            res = loom_send(vals, n, LOOM_FLOAT64, r, comm);
        end = loom_group_end();
        if (res == LOOM_SUCCESS)
            res = end;
    }
    free(all);
    return res == LOOM_SUCCESS ? 0
                               : fail(res, "harness exchange", err, errlen);
}

static int be_barrier(char *err, size_t errlen)
{
    double token = 0;

    return be_allreduce_doubles(&token, 1, PERF_SUM, err, errlen);
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

    free(stage);
    stage = NULL;
    stage_size = 0;

    if (!comm)
        return 0;
    res = loom_comm_destroy(comm);
    comm = NULL;
    return res == LOOM_SUCCESS ? 0
                               : fail(res, "loom_comm_destroy", err, errlen);
}

/* -R 1: a loom_mem_alloc window, which the shared allreduce reads from
 * the peers' processes instead of staging the vectors. */
static void *be_mem_alloc(size_t bytes, char *err, size_t errlen)
{
    void *p = NULL;
    loom_result_t res = loom_mem_alloc(comm, bytes, &p);

    if (res != LOOM_SUCCESS) {
        fail(res, "loom_mem_alloc", err, errlen);
        return NULL;
    }
    return p;
}

static void be_mem_free(void *p)
{
    if (comm)
        loom_mem_free(comm, p);
}

const perf_backend_t perf_backend = {
    .name = "loom",
    .mem_alloc = be_mem_alloc,
    .mem_free = be_mem_free,
    .init = be_init,
    .setup_threads = be_setup_threads,
    .thread_init = be_thread_init,
    .describe = be_describe,
    .rank = be_rank,
    .size = be_size,
    .barrier = be_barrier,
    .supports = be_supports,
    .run = be_run,
    .set_algo = be_set_algo,
    .allreduce_doubles = be_allreduce_doubles,
    .abort = be_abort,
    .finalize = be_finalize,
};
