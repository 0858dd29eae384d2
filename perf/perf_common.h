/*
 * perf_common.h - the harness shared by the nccl-tests style *_perf
 * benchmarks.
 *
 * A benchmark binary is three parts linked together:
 *   - a small per-collective file (all_reduce_perf.c, ...) holding a
 *     perf_coll_desc_t and main(), which calls perf_main();
 *   - this harness (perf_common.c): options, test data, timing, checking,
 *     the table and the JSON records;
 *   - one backend, which defines perf_backend: backend_loom.c for the
 *     normal build, peers/backend_mpi.c to measure Open MPI with the very
 *     same harness and table.
 *
 * The harness does not include loom.h, so that other backends build
 * without Loom; its datatype and op numbers are those of loom.h (and
 * NCCL), which backend_loom.c checks at compile time.
 */
#ifndef LOOM_PERF_COMMON_H
#define LOOM_PERF_COMMON_H

#include <stddef.h>

typedef enum perf_dtype {
    PERF_INT8 = 0,
    PERF_UINT8 = 1,
    PERF_INT32 = 2,
    PERF_UINT32 = 3,
    PERF_INT64 = 4,
    PERF_UINT64 = 5,
    PERF_HALF = 6,
    PERF_FLOAT = 7,
    PERF_DOUBLE = 8,
    PERF_BFLOAT16 = 9,
    PERF_NUM_DTYPES = 10
} perf_dtype_t;

typedef enum perf_op {
    PERF_OP_NONE = -1, /* the collective does not reduce */
    PERF_SUM = 0,
    PERF_PROD = 1,
    PERF_MAX = 2,
    PERF_MIN = 3,
    PERF_AVG = 4,
    PERF_NUM_OPS = 5
} perf_op_t;

typedef enum perf_coll {
    PERF_ALLREDUCE = 0,
    PERF_REDUCE_SCATTER,
    PERF_ALLGATHER,
    PERF_ALLTOALL,
    PERF_BROADCAST,
    PERF_REDUCE,
    PERF_GATHER,
    PERF_SCATTER,
    PERF_SENDRECV,
    PERF_NUM_COLLS
} perf_coll_t;

/* Size of the error buffers handed to backends. */
#define PERF_ERRLEN 1024

/* One operation, as the backend is asked to run it. */
typedef struct perf_call {
    perf_coll_t coll;
    const void *sendbuf;
    void *recvbuf;      /* == sendbuf (or overlapping it) for in-place */
    size_t count;       /* the count argument of the collective's API */
    perf_dtype_t dtype;
    perf_op_t op;       /* PERF_OP_NONE for data movement */
    int root;           /* -1 when the collective has none */
    int peer;           /* sendrecv: send to peer, receive from recv_peer; */
    int recv_peer;      /* -1 otherwise */
    int blocking;       /* -z: 1 = blocking call, 0 = non-blocking + wait */
    const char *codec;  /* -Z: a codec spec ("int8", "topk:0.01"), NULL:
                           none (allreduce, reduce_scatter, allgather) */
} perf_call_t;

/*
 * A backend.  Functions returning int return 0 on success, else non-zero
 * with a message in err (errlen bytes, NUL-terminated).  rank() and size()
 * are valid after init().
 */
typedef struct perf_backend {
    const char *name; /* "loom", "mpi": shown in the header and JSON */
    int (*init)(int *argc, char ***argv, char *err, size_t errlen);
    /* Optional (may be NULL): settings worth a header line, such as an
     * algorithm forced by the environment, in buf (len bytes, "" for
     * none).  Called on rank 0 after init(). */
    void (*describe)(char *buf, size_t len);
    int (*rank)(void);
    int (*size)(void);
    int (*barrier)(char *err, size_t errlen);
    /* 1 when the backend can run this call's collective, type and op;
     * else 0 and a short reason in *why.  Must agree on all ranks. */
    int (*supports)(const perf_call_t *call, const char **why);
    int (*run)(const perf_call_t *call, char *err, size_t errlen);
    /* In place over all ranks: vals[i] = op(vals[i]) for i < n, with op
     * PERF_SUM, PERF_MIN or PERF_MAX.  The harness uses it to combine
     * times and error counts. */
    int (*allreduce_doubles)(double *vals, size_t n, perf_op_t op, char *err,
                             size_t errlen);
    /* Optional (may be NULL: -A is refused): make the calls of coll that
     * follow run algorithm `algo` ("auto": the backend's own choice).
     * Called by every rank alike. */
    int (*set_algo)(perf_coll_t coll, const char *algo, char *err,
                    size_t errlen);
    /* Optional (may be NULL: -R 1 is refused): the backend's own memory
     * for the buffers (-R 1), allocated by every rank alike, and its
     * release.  NULL and a reason in err when it cannot. */
    void *(*mem_alloc)(size_t bytes, char *err, size_t errlen);
    void (*mem_free)(void *p);
    /* Optional (NULL: -t above 1 is refused): for -t T, called once in
     * the main thread before any rank starts, to prepare T ranks in this
     * process; then each of T threads calls thread_init(t), t = 0..T-1,
     * instead of init(), and every other function from that thread acts
     * on that thread's rank. */
    int (*setup_threads)(int nthreads, char *err, size_t errlen);
    int (*thread_init)(int thread, char *err, size_t errlen);
    /* After a failure: stop now, without waiting for peers. */
    void (*abort)(void);
    int (*finalize)(char *err, size_t errlen);
} perf_backend_t;

/* Defined by the backend linked into the binary. */
extern const perf_backend_t perf_backend;

/* Element counts of one row, from the requested size in bytes. */
typedef struct perf_sizes {
    size_t count;       /* perf_call_t.count; 0 skips the row */
    size_t send_elems;  /* elements in the send buffer */
    size_t recv_elems;  /* elements in the receive buffer */
    size_t elems;       /* the table's "count" column */
    size_t bytes;       /* the table's "size" column; algbw's numerator */
    size_t ip_send_off; /* in place: element offsets of the send and the */
    size_t ip_recv_off; /* receive region within one shared buffer */
} perf_sizes_t;

/* The data of one (type, op, root) series, for expected values. */
typedef struct perf_check perf_check_t;

/* A collective, as one *_perf.c file describes it. */
typedef struct perf_coll_desc {
    perf_coll_t id;
    const char *name; /* "all_reduce": messages and JSON */
    int reduces;      /* runs once per -o op; else redop "none" */
    int rooted;       /* takes -r; else root -1 */
    int peered;       /* sendrecv: perf_call_t.peer = rank + 1 and
                         recv_peer = rank - 1 (mod nranks) */
    double (*busbw_factor)(int nranks);
    /* Fill *s for a requested size; round down to whole elements (and to
     * a multiple of nranks where the size is the total buffer). */
    void (*sizes)(size_t bytes, size_t type_size, int nranks, int rank,
                  perf_sizes_t *s);
    /* Expected value of element j of rank's receive buffer; return 0 to
     * leave that element unchecked (e.g. a non-root's buffer). */
    int (*expected)(const perf_check_t *c, int rank, size_t j, double *value);
} perf_coll_desc_t;

/* For expected(): the value rank put at element i of its send buffer. */
double perf_input(const perf_check_t *c, int rank, size_t i);
/* For expected(): the op over all ranks of perf_input(c, r, i). */
double perf_reduced(const perf_check_t *c, size_t i);
int perf_check_nranks(const perf_check_t *c);
int perf_check_root(const perf_check_t *c);
const perf_sizes_t *perf_check_sizes(const perf_check_t *c);

/* Parse the options, run the benchmark and return the exit status. */
int perf_main(int argc, char **argv, const perf_backend_t *backend,
              const perf_coll_desc_t *coll);

#endif /* LOOM_PERF_COMMON_H */
