/*
 * loom.h - the public interface of Loom, a collective communication library.
 *
 * This header compiles as C99, C11 and C++ and needs no other Loom header.
 * Every function returns a loom_result_t (LOOM_SUCCESS == 0) unless stated
 * otherwise; loom_strerror() turns it into text and loom_get_last_error()
 * gives the detailed message of the calling thread's last failure.
 */
#ifndef LOOM_H
#define LOOM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LOOM_VERSION_MAJOR 0
#define LOOM_VERSION_MINOR 1
#define LOOM_VERSION_PATCH 0
/* Single number for compile-time checks: major*10000 + minor*100 + patch. */
#define LOOM_VERSION_CODE                                                      \
    (LOOM_VERSION_MAJOR * 10000 + LOOM_VERSION_MINOR * 100 + LOOM_VERSION_PATCH)

/* ---------------------------------------------------------------- results */

typedef enum loom_result {
    LOOM_SUCCESS = 0,
    LOOM_ERR_SYSTEM = 2,           /* a system call failed (errno logged) */
    LOOM_ERR_INTERNAL = 3,         /* a bug in Loom */
    LOOM_ERR_INVALID_ARGUMENT = 4, /* a bad argument; nothing was touched */
    LOOM_ERR_INVALID_USAGE = 5,    /* a call out of order or on a wrong object */
    LOOM_ERR_REMOTE = 6,           /* a peer failed, closed or sent garbage */
    LOOM_IN_PROGRESS = 7,          /* not an error: the operation goes on */
    LOOM_ERR_TIMEOUT = 8,          /* a deadline passed */
    LOOM_ERR_NO_MEMORY = 9,        /* an allocation failed */
    LOOM_ERR_REVOKED = 10,         /* the communicator was revoked or aborted */
    LOOM_ERR_UNSUPPORTED = 11,     /* not available in this build or here */
    LOOM_ERR_MISMATCH = 12,        /* peers disagree (job, size, version) */
    LOOM_ERR_CONNECT = 13          /* could not reach an address */
} loom_result_t;

/* Static text for a result code; never NULL. */
const char *loom_strerror(loom_result_t result);

/* The calling thread's most recent detailed error message (it names the
 * argument, peer or address involved), or "" when none.  Valid until the
 * thread's next failing Loom call. */
const char *loom_get_last_error(void);

/* Library version as numbers; any pointer may be NULL. */
loom_result_t loom_get_version(int *major, int *minor, int *patch);

/* ------------------------------------------------------ datatypes and ops */

/* Values match NCCL's so that ported code can cast. */
typedef enum loom_datatype {
    LOOM_INT8 = 0,
    LOOM_UINT8 = 1,
    LOOM_INT32 = 2,
    LOOM_UINT32 = 3,
    LOOM_INT64 = 4,
    LOOM_UINT64 = 5,
    LOOM_FLOAT16 = 6,
    LOOM_FLOAT32 = 7,
    LOOM_FLOAT64 = 8,
    LOOM_BFLOAT16 = 9,
    LOOM_NUM_DATATYPES = 10
} loom_datatype_t;

typedef enum loom_op {
    LOOM_SUM = 0,
    LOOM_PROD = 1,
    LOOM_MAX = 2,
    LOOM_MIN = 3,
    LOOM_AVG = 4,
    LOOM_NUM_OPS = 5
} loom_op_t;

/* Size in bytes of one element, 0 for an invalid datatype. */
size_t loom_datatype_size(loom_datatype_t dtype);

/* -------------------------------------------------------------- config */

#define LOOM_CONFIG_VERSION 1

/*
 * Options for creating a communicator.  The first member is the size of
 * the structure the caller was compiled with, so later versions can grow
 * it without breaking binaries: always initialise with loom_config_init()
 * or LOOM_CONFIG_INITIALIZER.  A zero (or NULL string) member means
 * "use the environment variable, else the default".
 */
typedef struct loom_config {
    size_t size;               /* sizeof(loom_config_t) */
    unsigned int version;      /* LOOM_CONFIG_VERSION */
    int timeout_ms;            /* LOOM_TIMEOUT: no-progress deadline */
    int tcp_streams;           /* LOOM_TCP_STREAMS: sockets per peer */
    size_t chunk_bytes;        /* LOOM_CHUNK_SIZE: pipeline chunk */
    const char *socket_ifname; /* LOOM_SOCKET_IFNAME */
    const char *algo;          /* LOOM_ALGO */
    const char *transport;     /* LOOM_TRANSPORT */
} loom_config_t;

#define LOOM_CONFIG_INITIALIZER                                                \
    { sizeof(loom_config_t), LOOM_CONFIG_VERSION, 0, 0, 0, NULL, NULL, NULL }

/* Fill *cfg with defaults (size and version set, everything else zero). */
loom_result_t loom_config_init(loom_config_t *cfg);

/* ------------------------------------------------------- communicators */

/* A handle, not an address: once the communicator is destroyed (or
 * aborted) every call given the handle fails with
 * LOOM_ERR_INVALID_ARGUMENT, even where a later communicator was made
 * in the same memory.  NULL is never a communicator. */
typedef struct loom_comm_handle *loom_comm_t;

/* Opaque identity of a job, created by one process and passed to all
 * others out of band (as NCCL's ncclUniqueId).  It holds the rendezvous
 * address and the job's secret key. */
#define LOOM_UNIQUE_ID_BYTES 128
typedef struct loom_unique_id {
    char internal[LOOM_UNIQUE_ID_BYTES];
} loom_unique_id_t;

/* Create a job identity and start its rendezvous service in this process.
 * The service ends when every rank of the job has joined, or after the
 * bootstrap deadline.  Call it once per job, in one process. */
loom_result_t loom_get_unique_id(loom_unique_id_t *id);

/* Join the job named by id as rank `rank` of `nranks`.  Blocks until all
 * ranks have joined and are connected, or until the deadline. */
loom_result_t loom_comm_init_rank(loom_comm_t *comm, int nranks,
                                  const loom_unique_id_t *id, int rank,
                                  const loom_config_t *cfg);

/* Join the job described by the environment: LOOM_ROOT/LOOM_RANK/LOOM_SIZE
 * (as set by loomrun), torchrun's MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE,
 * Slurm's SLURM_PROCID/SLURM_NTASKS or Open MPI's OMPI_COMM_WORLD_RANK/SIZE.
 * cfg may be NULL. */
loom_result_t loom_comm_init_env(loom_comm_t *comm, const loom_config_t *cfg);

/* Release a communicator.  Every rank should call it; pending requests
 * of this communicator become invalid.  comm may not be used afterwards. */
loom_result_t loom_comm_destroy(loom_comm_t comm);

/* Stop every operation of the communicator now and release it, without
 * waiting for peers.  Peers see their pending operations fail. */
loom_result_t loom_comm_abort(loom_comm_t comm);

loom_result_t loom_comm_rank(loom_comm_t comm, int *rank);
loom_result_t loom_comm_size(loom_comm_t comm, int *size);

/* Force algorithms from now on, as LOOM_ALGO does at creation ("ring",
 * "allreduce:ring,allgather:recursive_doubling"; "auto", "" or NULL: the
 * automatic choice).  The spec replaces the previous setting.  Every rank
 * must set the same before the same calls; operations already started
 * keep their algorithm. */
loom_result_t loom_comm_set_algo(loom_comm_t comm, const char *spec);

/* The first error that broke the communicator (LOOM_SUCCESS while it is
 * healthy); the rank found responsible is stored in *failed_rank (-1 when
 * none is known).  failed_rank may be NULL. */
loom_result_t loom_comm_get_error(loom_comm_t comm, int *failed_rank);

/* Straggler telemetry (loom_comm_get_stats(3)): for each peer this rank
 * received from, how late its data came after this rank started each
 * operation, and the rate of its large receives.  size must be set to
 * sizeof(loom_peer_stats_t) in peers[0] by the caller: an older, smaller
 * structure is filled up to its size, elements size bytes apart. */
typedef struct loom_peer_stats {
    size_t size;        /* sizeof(loom_peer_stats_t), in peers[0] */
    int rank;           /* the peer */
    uint64_t ops;       /* operations with data from it */
    uint64_t late_ops;  /* those where its lateness was seen (see the page) */
    uint64_t bytes_in;  /* bytes received from it */
    double busy_s;      /* time receives of >= 64 KiB from it were outstanding */
    double late_ms_avg; /* its first data after this rank's start: average */
    double late_ms_max; /* and the largest, over late_ops */
    double mbps_in;     /* MB/s of those timed receives (0: none) */
} loom_peer_stats_t;

/* Fill peers[0..capacity) with the peers comm's rank received from,
 * lowest rank first; *count is how many there are (it may exceed
 * capacity: then the first capacity are written).  *own_wait_ms_avg
 * (may be NULL): this rank's average wait for the latest of its peers in
 * an operation (its late_ms from the latest one).  peers may be
 * NULL when capacity is 0.  LOOM_ERR_UNSUPPORTED with LOOM_STATS=0. */
loom_result_t loom_comm_get_stats(loom_comm_t comm, loom_peer_stats_t *peers, int capacity,
                                  int *count, double *own_wait_ms_avg);
/* Forget what loom_comm_get_stats would report, and start counting anew. */
loom_result_t loom_comm_reset_stats(loom_comm_t comm);

/* Register [buf, buf + bytes) with the transports of comm that need
 * registered memory (RDMA verbs): operations on buffers inside it skip
 * registering them, and the region stays registered until
 * loom_mem_deregister, which the application must call before it frees
 * or remaps that memory.  Where no transport needs registration it only
 * records the region.  Unregistered buffers work as well: Loom then
 * registers them itself and drops those registrations whenever comm is
 * idle. */
typedef struct loom_mem *loom_mem_t;
loom_result_t loom_mem_register(loom_comm_t comm, void *buf, size_t bytes, loom_mem_t *handle);
loom_result_t loom_mem_deregister(loom_comm_t comm, loom_mem_t handle);

/* Collective: allocate a window of `bytes` on every rank of comm (all
 * pass the same bytes, and allocate in the same order), which the other
 * ranks of each host map too.  Buffers inside windows, at the same
 * offset on every rank, let large allreduces on one host work straight
 * from the peers' memory instead of staging it (see loom_mem_alloc(3)).
 * loom_mem_free is local; loom_comm_destroy frees what is left. */
loom_result_t loom_mem_alloc(loom_comm_t comm, size_t bytes, void **ptr);
loom_result_t loom_mem_free(loom_comm_t comm, void *ptr);

/* ------------------------------------------------------ fault tolerance */

/* A failed peer (killed, stopped, cut off: silent for a few heartbeats of
 * LOOM_HEARTBEAT_MS) makes every rank's pending and later operations on
 * the communicator fail (LOOM_ERR_REMOTE or LOOM_ERR_REVOKED) within a
 * bound (see loom(7)); the communicator then stays usable only for the
 * calls below and loom_comm_get_error / loom_comm_destroy. */

/* Revoke the communicator on every rank: their pending and later
 * operations on it fail with LOOM_ERR_REVOKED. */
loom_result_t loom_comm_revoke(loom_comm_t comm);

/* The ranks known here to have failed, in ascending order: the first
 * `capacity` of them are stored in ranks (which may be NULL when capacity
 * is 0) and *count receives how many there are. */
loom_result_t loom_comm_get_failed(loom_comm_t comm, int *ranks, int capacity, int *count);

/* Collective over the ranks still alive: they agree on which ranks failed
 * (even if more fail meanwhile) and build *newcomm of the others,
 * numbered in their old order.  Revokes comm first; comm must still be
 * destroyed.  Fails (and *newcomm is NULL) on a rank the others have
 * declared failed, in a group of survivors without a majority of the
 * ranks (LOOM_ERR_REVOKED; see LOOM_QUORUM), or when no agreement came
 * within LOOM_TIMEOUT. */
loom_result_t loom_comm_shrink(loom_comm_t comm, loom_comm_t *newcomm);

/* Collective over every rank of comm: the ranks that pass the same color
 * (>= 0) form *newcomm, ranked by key, then by their rank in comm (as
 * ncclCommSplit and MPI_Comm_split).  A rank passing LOOM_SPLIT_NOCOLOR
 * gets *newcomm = NULL.  The colours and keys go over comm itself and the
 * new communicators are connected over its control plane, with no new
 * rendezvous; each has transports and a control plane of its own, so
 * that a failure or revocation in one stays there, and it outlives comm
 * (loom_comm_destroy(comm) leaves it working).  cfg NULL: comm's
 * settings; otherwise the fields it sets override them. */
#define LOOM_SPLIT_NOCOLOR (-1)
loom_result_t loom_comm_split(loom_comm_t comm, int color, int key, const loom_config_t *cfg,
                              loom_comm_t *newcomm);

/* Collective over the n ranks of comm listed in ranks, and only they
 * (as MPI_Comm_create_group): they form *newcomm, rank i of it being
 * ranks[i]; the other ranks of comm do not call it and wait for nothing.
 * Every listed rank passes the same list and tag (>= 0); a member that
 * passes another list or tag, or is not in its own list, is named in the
 * error every member gets (LOOM_ERR_MISMATCH, LOOM_ERR_INVALID_ARGUMENT),
 * and one that never calls in LOOM_TIMEOUT (LOOM_ERR_TIMEOUT).  As
 * loom_comm_split: no new rendezvous (comm's control plane and
 * topology), transports and a control plane of its own, comm's settings.
 * Creates of disjoint lists may run at once; two ranks listed together
 * must make their creates in the same order. */
loom_result_t loom_comm_create_group(loom_comm_t comm, int n, const int *ranks, int tag,
                                     loom_comm_t *newcomm);

/* Collective over the ranks not known failed, fault tolerant, and on a
 * revoked communicator too: every rank contributes *value and every rank
 * that returns LOOM_SUCCESS gets the same result in *value, the minimum
 * (op LOOM_MIN; of flags 0/1: their AND) or maximum (LOOM_MAX: OR) of the
 * contributions of the ranks it counted in.  For example, whether a step
 * succeeded everywhere, or the last step every rank completed. */
loom_result_t loom_comm_agree(loom_comm_t comm, uint64_t *value, loom_op_t op);

/* A new process enters a running job: it connects to the job's
 * rendezvous address (LOOM_ROOT, with LOOM_JOB_KEY, as the launcher gave
 * the members) and waits until the members call loom_comm_grow, or
 * LOOM_TIMEOUT (cfg->timeout_ms) passes.  Its rank in *comm follows the
 * members'.  cfg may be NULL. */
loom_result_t loom_comm_join(loom_comm_t *comm, const loom_config_t *cfg);

/* How many processes wait to join (cheap: no communication; the count
 * the join service last announced). */
loom_result_t loom_comm_pending_joins(loom_comm_t comm, int *count);

/* Collective over the members: admit the processes waiting to join, and
 * leave out ranks that failed, into *newcomm (members keep their order,
 * newcomers follow).  When nobody waits and nobody failed, *newcomm is
 * NULL and comm goes on.  Otherwise comm must be destroyed afterwards. */
loom_result_t loom_comm_grow(loom_comm_t comm, loom_comm_t *newcomm);

/* The revision of a state that a failed loom_state_sync was writing:
 * it never wins a sync, and the next successful one replaces it. */
#define LOOM_REVISION_NONE UINT64_MAX

/* One tensor of the shared state: `bytes` bytes at `data`. */
typedef struct loom_tensor {
    void *data;
    size_t bytes;
} loom_tensor_t;

/* Collective: make every rank hold the same shared state.  Each rank
 * hashes its tensors (XXH64); the newest *revision present wins and, per
 * tensor, the version most ranks of that revision hold (ties: the lowest
 * rank's).  Ranks that lack it receive it, in slices from every rank
 * that has it, and check the hash.  On success *revision is the winning
 * revision on every rank.  Sizes must agree (LOOM_ERR_MISMATCH, nothing
 * changed); after a failed transfer a receiving rank's tensors are
 * unspecified and its *revision is LOOM_REVISION_NONE until the next
 * successful sync. */
loom_result_t loom_state_sync(loom_comm_t comm, const loom_tensor_t *tensors, int ntensors,
                              uint64_t *revision);

/* ------------------------------------------------------------ requests */

/* A handle as well: a request already completed (waited or tested
 * done, or released by loom_comm_abort) is refused with
 * LOOM_ERR_INVALID_ARGUMENT, never taken for a later request. */
typedef struct loom_request *loom_request_t;
#define LOOM_REQUEST_NULL ((loom_request_t)0)

/* Wait until the operation completes, release the request and set *req to
 * LOOM_REQUEST_NULL.  Returns the operation's result.  Waiting on
 * LOOM_REQUEST_NULL returns LOOM_SUCCESS at once. */
loom_result_t loom_wait(loom_request_t *req);

/* Make progress without blocking.  *done is set to 1 when the operation
 * has completed; the request is then released, *req set to
 * LOOM_REQUEST_NULL and the operation's result returned. */
loom_result_t loom_test(loom_request_t *req, int *done);

/* Wait until one of the n requests completes, release it, set reqs[*index]
 * to LOOM_REQUEST_NULL and return its result.  LOOM_REQUEST_NULL entries
 * are skipped; when every entry is one, *index is -1 and LOOM_SUCCESS is
 * returned at once.  The requests may belong to different communicators. */
loom_result_t loom_wait_any(loom_request_t *reqs, int n, int *index);

/* Wait for every one of the n requests (LOOM_REQUEST_NULL entries are
 * skipped), setting each to LOOM_REQUEST_NULL; returns the first failure
 * in completion order, or LOOM_SUCCESS. */
loom_result_t loom_wait_all(loom_request_t *reqs, int n);

/* ---------------------------------------------------------- collectives */

/* recvbuf[i] = op over all ranks of sendbuf[i], for i < count, on every
 * rank.  sendbuf == recvbuf is the in-place form.  The buffers must not
 * overlap otherwise. */
loom_result_t loom_allreduce(const void *sendbuf, void *recvbuf, size_t count,
                             loom_datatype_t dtype, loom_op_t op,
                             loom_comm_t comm);

/* Non-blocking allreduce: the buffers must not be touched until the
 * request completes (loom_wait / loom_test). */
loom_result_t loom_iallreduce(const void *sendbuf, void *recvbuf,
                              size_t count, loom_datatype_t dtype,
                              loom_op_t op, loom_comm_t comm,
                              loom_request_t *req);

/* Quorum allreduce (loom_allreduce_quorum(3)): completes once `quorum`
 * ranks (1..nranks) have contributed, the first to reach rank 0, which
 * decides.  Every rank gets the same recvbuf (op over the contributors'
 * sendbufs; LOOM_AVG divides by their number), contributors[r] = 1 for
 * each contributing rank r, else 0 (nranks ints, or NULL), and *ncontrib
 * (or NULL).  A rank left out (contributors[rank] == 0) still gets the
 * call's result; its own data is dropped.  Blocking, not in groups. */
loom_result_t loom_allreduce_quorum(const void *sendbuf, void *recvbuf,
                                    size_t count, loom_datatype_t dtype,
                                    loom_op_t op, int quorum,
                                    loom_comm_t comm, int *contributors,
                                    int *ncontrib);

/* Every collective below has a non-blocking form, loom_iNAME, taking the
 * same arguments plus a request (the last argument).  All ranks of the
 * communicator call each collective in the same order.  Counts are in
 * elements of dtype.  In-place forms follow NCCL's rules. */

/* recvbuf (recvcount elements) = op over all ranks of block `rank` of
 * sendbuf (nranks * recvcount elements).  In place: recvbuf ==
 * sendbuf + rank * recvcount elements. */
loom_result_t loom_reduce_scatter(const void *sendbuf, void *recvbuf,
                                  size_t recvcount, loom_datatype_t dtype,
                                  loom_op_t op, loom_comm_t comm);
loom_result_t loom_ireduce_scatter(const void *sendbuf, void *recvbuf,
                                   size_t recvcount, loom_datatype_t dtype,
                                   loom_op_t op, loom_comm_t comm,
                                   loom_request_t *req);

/* Block r of recvbuf (nranks * sendcount elements) = sendbuf of rank r.
 * In place: sendbuf == recvbuf + rank * sendcount elements. */
loom_result_t loom_allgather(const void *sendbuf, void *recvbuf,
                             size_t sendcount, loom_datatype_t dtype,
                             loom_comm_t comm);
loom_result_t loom_iallgather(const void *sendbuf, void *recvbuf,
                              size_t sendcount, loom_datatype_t dtype,
                              loom_comm_t comm, loom_request_t *req);

/* Block r of recvbuf = block `rank` of rank r's sendbuf; blocks are
 * count elements, nranks of them in each buffer.  In place: sendbuf ==
 * recvbuf. */
loom_result_t loom_alltoall(const void *sendbuf, void *recvbuf, size_t count,
                            loom_datatype_t dtype, loom_comm_t comm);
loom_result_t loom_ialltoall(const void *sendbuf, void *recvbuf, size_t count,
                             loom_datatype_t dtype, loom_comm_t comm,
                             loom_request_t *req);

/* All-to-all with a count and a displacement (in elements) per peer, as
 * MPI_Alltoallv: sendcounts[r] elements from sendbuf + sdispls[r] go to
 * rank r, which receives them at recvbuf + rdispls[rank].  recvcounts[r]
 * must equal rank r's sendcounts[rank].  The buffers must not overlap. */
loom_result_t loom_alltoallv(const void *sendbuf, const size_t *sendcounts,
                             const size_t *sdispls, void *recvbuf,
                             const size_t *recvcounts, const size_t *rdispls,
                             loom_datatype_t dtype, loom_comm_t comm);
loom_result_t loom_ialltoallv(const void *sendbuf, const size_t *sendcounts,
                              const size_t *sdispls, void *recvbuf,
                              const size_t *recvcounts, const size_t *rdispls,
                              loom_datatype_t dtype, loom_comm_t comm,
                              loom_request_t *req);

/* recvbuf on every rank = sendbuf of root (read on root only).  In place:
 * sendbuf == recvbuf on root. */
loom_result_t loom_broadcast(const void *sendbuf, void *recvbuf, size_t count,
                             loom_datatype_t dtype, int root, loom_comm_t comm);
loom_result_t loom_ibroadcast(const void *sendbuf, void *recvbuf, size_t count,
                              loom_datatype_t dtype, int root, loom_comm_t comm,
                              loom_request_t *req);

/* recvbuf on root = op over all ranks of sendbuf (recvbuf is used on root
 * only and may be NULL elsewhere).  In place: sendbuf == recvbuf. */
loom_result_t loom_reduce(const void *sendbuf, void *recvbuf, size_t count,
                          loom_datatype_t dtype, loom_op_t op, int root,
                          loom_comm_t comm);
loom_result_t loom_ireduce(const void *sendbuf, void *recvbuf, size_t count,
                           loom_datatype_t dtype, loom_op_t op, int root,
                           loom_comm_t comm, loom_request_t *req);

/* Block r of recvbuf on root (nranks * sendcount elements) = sendbuf of
 * rank r.  In place on root: sendbuf == recvbuf + root * sendcount. */
loom_result_t loom_gather(const void *sendbuf, void *recvbuf, size_t sendcount,
                          loom_datatype_t dtype, int root, loom_comm_t comm);
loom_result_t loom_igather(const void *sendbuf, void *recvbuf, size_t sendcount,
                           loom_datatype_t dtype, int root, loom_comm_t comm,
                           loom_request_t *req);

/* recvbuf of rank r = block r of root's sendbuf (nranks * recvcount
 * elements, read on root only).  In place on root: recvbuf == sendbuf +
 * root * recvcount. */
loom_result_t loom_scatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                           loom_datatype_t dtype, int root, loom_comm_t comm);
loom_result_t loom_iscatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                            loom_datatype_t dtype, int root, loom_comm_t comm,
                            loom_request_t *req);

/* Returns on each rank once every rank has entered it. */
loom_result_t loom_barrier(loom_comm_t comm);
loom_result_t loom_ibarrier(loom_comm_t comm, loom_request_t *req);

/* Gossip averaging (loom_gossip_average(3)): buf (count elements of a
 * floating type, in place) becomes the average of this rank's and one
 * partner's, (lower rank's + higher rank's) / 2, the same bits on both;
 * no rank waits for any rank but its partner.  peer >= 0 names the
 * partner, who must name this rank back (a rank naming itself sits the
 * call out); LOOM_GOSSIP_SEEDED takes round `round` of the
 * communicator's seeded pairing, a perfect matching of the ranks that
 * every rank computes alike (the hypercube, dimension round % log2 n,
 * when n is a power of two).  Every rank makes the call, as any
 * collective. */
#define LOOM_GOSSIP_SEEDED (-1)
loom_result_t loom_gossip_average(void *buf, size_t count, loom_datatype_t dtype, int peer,
                                  uint64_t round, loom_comm_t comm);
loom_result_t loom_igossip_average(void *buf, size_t count, loom_datatype_t dtype, int peer,
                                   uint64_t round, loom_comm_t comm, loom_request_t *req);
/* This rank's partner in round `round` of the seeded pairing (the rank
 * itself when it sits the round out: one rank per round when the size
 * is odd). */
loom_result_t loom_gossip_partner(loom_comm_t comm, uint64_t round, int *partner);

/* Sparse collectives (loom_sparse_allgather(3)): each rank gives nnz
 * (index, value) pairs, idx[k] < dense_count in any order, of a vector
 * that is zero elsewhere (pairs sharing an index are combined with op);
 * recvbuf (dense_count elements) on every rank = op over the ranks of
 * those vectors, as loom_allreduce of them would give.  The pairs go on
 * the wire while they are fewer bytes than the dense allreduce would
 * move; past that the dense allreduce runs.  A bad index or argument on
 * any rank, or ranks disagreeing on dense_count, dtype or op, fails the
 * call on every rank before any pair is sent.  Blocking only. */
loom_result_t loom_sparse_allgather(const uint64_t *idx, const void *val, size_t nnz,
                                    size_t dense_count, loom_datatype_t dtype, loom_op_t op,
                                    void *recvbuf, loom_comm_t comm);
/* The same, reduce-scattered: the vectors have nranks * recvcount
 * elements and recvbuf (recvcount elements) gets block `rank` of the
 * result, as loom_reduce_scatter of them would give. */
loom_result_t loom_sparse_reduce_scatter(const uint64_t *idx, const void *val, size_t nnz,
                                         size_t recvcount, loom_datatype_t dtype, loom_op_t op,
                                         void *recvbuf, loom_comm_t comm);

/* ------------------------------------------------------- point to point */

/* Send count elements to peer / receive them from peer.  Messages between
 * two ranks are matched in the order they were posted; the counts of a
 * send and its receive must be equal.  A send may complete before the
 * receive is posted (the data is buffered).  A rank may send to itself
 * within a group holding the receive, or with the non-blocking forms.
 * The buffer of a receive must not overlap that of a send or receive
 * still in progress (in one group, or non-blocking): data may land while
 * a send still reads it. */
loom_result_t loom_send(const void *buf, size_t count, loom_datatype_t dtype,
                        int peer, loom_comm_t comm);
loom_result_t loom_recv(void *buf, size_t count, loom_datatype_t dtype,
                        int peer, loom_comm_t comm);
loom_result_t loom_isend(const void *buf, size_t count, loom_datatype_t dtype,
                         int peer, loom_comm_t comm, loom_request_t *req);
loom_result_t loom_irecv(void *buf, size_t count, loom_datatype_t dtype,
                         int peer, loom_comm_t comm, loom_request_t *req);

/* --------------------------------------------------------------- groups */

/* Between loom_group_start and loom_group_end (per thread, nestable),
 * blocking collectives and sends/receives are queued instead of run;
 * the outermost loom_group_end starts them all and returns when all are
 * complete, so sends and receives in one group never deadlock whatever
 * order the ranks queue them in.  Non-blocking calls are not allowed in
 * a group (LOOM_ERR_INVALID_USAGE).  loom_group_end returns the first
 * failure; the arguments of every queued call are checked when it is
 * queued. */
loom_result_t loom_group_start(void);
loom_result_t loom_group_end(void);

/* ---------------------------------------------------------- compression */

/*
 * A codec turns fp32 values into bytes for the wire and back (see
 * loom_codec_register(3), loom_codec_encode(3) and loom-codecs(7) for the
 * built-ins "bf16", "fp16", "int8", "int4", "fp4" and "topk").  Each codec
 * declares exactly one kind, which says how a reduction treats it:
 */
#define LOOM_CODEC_ADDITIVE 0x1u      /* encoded buffers are summed as is */
#define LOOM_CODEC_DECODE_REDUCE 0x2u /* each hop decodes, sums in fp32 and
                                         encodes again */
#define LOOM_CODEC_GATHER_ONLY 0x4u   /* all-gathered, summed after decoding */

/* Longest codec name and codec spec ("name" or "name:args"), the
 * terminating NUL included. */
#define LOOM_CODEC_NAME_MAX 32
#define LOOM_CODEC_SPEC_MAX 64

typedef struct loom_codec loom_codec_t;

/*
 * A codec's table.  Every function gets the codec instance found by
 * loom_codec_find (so it can read params and user), must be deterministic
 * (the same input gives the same bytes on every machine) and must check
 * encoded input fully: it comes from the network.  Loom checks the
 * arguments before calling them.
 */
struct loom_codec {
    size_t size;        /* sizeof(loom_codec_t) as the codec was built */
    const char *name;   /* [a-z0-9_-], 1 to LOOM_CODEC_NAME_MAX - 1 chars */
    unsigned int props; /* exactly one LOOM_CODEC_* kind */
    void *user;         /* the codec's own; Loom never reads it */
    const void *params; /* an instance's parameters (from configure) */
    /* Parse the text after "name:" (args is NULL for a bare "name") into
     * *params, kept for the life of the process.  NULL: no parameters. */
    loom_result_t (*configure)(const loom_codec_t *codec, const char *args,
                               const void **params);
    /* Largest encoding of count values; 0 if count is too large. */
    size_t (*max_encoded_bytes)(const loom_codec_t *codec, size_t count);
    /* Encode src[0..count) into dst (capacity >= max_encoded_bytes). */
    loom_result_t (*encode)(const loom_codec_t *codec, const float *src,
                            size_t count, void *dst, size_t capacity,
                            size_t *len);
    /* dst[0..count) = the values encoded in src[0..len).  May be NULL if
     * decode_accumulate is not. */
    loom_result_t (*decode)(const loom_codec_t *codec, const void *src,
                            size_t len, float *dst, size_t count);
    /* acc[i] += the values encoded in src[0..len).  May be NULL if decode
     * is not. */
    loom_result_t (*decode_accumulate)(const loom_codec_t *codec,
                                       const void *src, size_t len,
                                       float *acc, size_t count);
    /* Additive codecs only: dst = dst + src, both len bytes encoding the
     * same count.  NULL for the other kinds. */
    loom_result_t (*reduce_encoded)(const loom_codec_t *codec, void *dst,
                                    const void *src, size_t len);
};

/* Add a codec (copied; its name must be new).  Registration lasts for
 * the life of the process.  Thread-safe, as is everything below. */
loom_result_t loom_codec_register(const loom_codec_t *codec);

/* The codec instance for spec, "name" or "name:args" ("int8:128",
 * "topk:0.001").  The same spec always gives the same pointer, valid for
 * the life of the process. */
loom_result_t loom_codec_find(const char *spec, const loom_codec_t **codec);

/* *bytes = the largest encoding of count values. */
loom_result_t loom_codec_max_encoded_bytes(const loom_codec_t *codec,
                                           size_t count, size_t *bytes);

/* Encode src[0..count) into dst (capacity bytes, at least
 * loom_codec_max_encoded_bytes); *len = the bytes written.  When decoded
 * is not NULL it receives the decoded encoding (decoded may equal src):
 * the owner of a chunk's final value keeps what the others will decode. */
loom_result_t loom_codec_encode(const loom_codec_t *codec, const float *src,
                                size_t count, void *dst, size_t capacity,
                                size_t *len, float *decoded);

/* dst[0..count) = the values encoded in src[0..len), or acc[i] += them.
 * A malformed src gives LOOM_ERR_REMOTE and leaves dst/acc untouched. */
loom_result_t loom_codec_decode(const loom_codec_t *codec, const void *src,
                                size_t len, float *dst, size_t count);
loom_result_t loom_codec_decode_accumulate(const loom_codec_t *codec,
                                           const void *src, size_t len,
                                           float *acc, size_t count);

/* Additive codecs: dst = dst + src on the wire format (len bytes each). */
loom_result_t loom_codec_reduce_encoded(const loom_codec_t *codec, void *dst,
                                        const void *src, size_t len);

/* Error-feedback residuals of many tensors, each named by the caller's
 * key.  loom_codec_encode_ef writes a pending residual; commit makes it
 * the current one (when the collective succeeded), rollback drops it. */
typedef struct loom_codec_state *loom_codec_state_t;

loom_result_t loom_codec_state_create(loom_codec_state_t *state);
loom_result_t loom_codec_state_destroy(loom_codec_state_t state);

/* Encode src[0..count) + the residual of elements [offset, offset+count)
 * of tensor key (tensor_count elements; created zero at first use) and
 * keep what was not sent as that range's pending residual.  Otherwise as
 * loom_codec_encode. */
loom_result_t loom_codec_encode_ef(const loom_codec_t *codec,
                                   loom_codec_state_t state, uint64_t key,
                                   size_t tensor_count, size_t offset,
                                   const float *src, size_t count, void *dst,
                                   size_t capacity, size_t *len,
                                   float *decoded);
loom_result_t loom_codec_state_commit(loom_codec_state_t state, uint64_t key);
loom_result_t loom_codec_state_rollback(loom_codec_state_t state,
                                        uint64_t key);
/* Forget tensor key (its residual restarts from zero). */
loom_result_t loom_codec_state_reset(loom_codec_state_t state, uint64_t key);
/* Copy the committed residual of tensor key (count elements) out. */
loom_result_t loom_codec_state_residual(loom_codec_state_t state,
                                        uint64_t key, float *residual,
                                        size_t count);

/* ------------------------------------------------ compressed collectives */

/*
 * Options of the *_opts collectives (see loom_allreduce_opts(3) and
 * loom-codecs(7)).  The first member is the size of the structure the
 * caller was compiled with: initialise with LOOM_COLL_OPTIONS_INITIALIZER
 * (or zero it and set size).  With a codec the traffic is encoded: the
 * data must be LOOM_FLOAT32 and the op LOOM_SUM or LOOM_AVG, else the
 * call fails with LOOM_ERR_INVALID_ARGUMENT and touches nothing.  The
 * result is then approximate, and allreduce and allgather leave
 * identical bytes on every rank.  With state, each rank's own input is
 * encoded with error feedback under key (loom_codec_encode_ef), and the
 * residual is committed when the operation succeeds on this rank and
 * rolled back when it fails.
 *
 * stream (a CUstream / cudaStream_t; NULL: the legacy default stream)
 * orders a call on CUDA device buffers (loom(7), GPUS): before reading
 * the device input the call waits for the work already queued on it;
 * a blocking call's device result is written, and seen by work queued
 * afterwards, when it returns; a non-blocking call's when loom_wait or
 * loom_test reports it complete.  This version blocks the calling thread
 * on the stream.  A caller built before stream existed passes a smaller
 * size: its calls use the legacy default stream.
 */
typedef struct loom_coll_options {
    size_t size;              /* sizeof(loom_coll_options_t) */
    const loom_codec_t *codec; /* from loom_codec_find; NULL: exact */
    loom_codec_state_t state; /* error feedback; NULL: none */
    uint64_t key;             /* the tensor's key in state */
    void *stream;             /* CUDA stream of device buffers; NULL: default */
} loom_coll_options_t;

#define LOOM_COLL_OPTIONS_INITIALIZER                                          \
    { sizeof(loom_coll_options_t), NULL, NULL, 0, NULL }

/* As loom_allreduce / loom_reduce_scatter / loom_allgather (and their
 * non-blocking forms) with options; opts NULL is the plain call. */
loom_result_t loom_allreduce_opts(const void *sendbuf, void *recvbuf,
                                  size_t count, loom_datatype_t dtype,
                                  loom_op_t op, loom_comm_t comm,
                                  const loom_coll_options_t *opts);
loom_result_t loom_iallreduce_opts(const void *sendbuf, void *recvbuf,
                                   size_t count, loom_datatype_t dtype,
                                   loom_op_t op, loom_comm_t comm,
                                   const loom_coll_options_t *opts,
                                   loom_request_t *req);
loom_result_t loom_reduce_scatter_opts(const void *sendbuf, void *recvbuf,
                                       size_t recvcount, loom_datatype_t dtype,
                                       loom_op_t op, loom_comm_t comm,
                                       const loom_coll_options_t *opts);
loom_result_t loom_ireduce_scatter_opts(const void *sendbuf, void *recvbuf,
                                        size_t recvcount,
                                        loom_datatype_t dtype, loom_op_t op,
                                        loom_comm_t comm,
                                        const loom_coll_options_t *opts,
                                        loom_request_t *req);
loom_result_t loom_allgather_opts(const void *sendbuf, void *recvbuf,
                                  size_t sendcount, loom_datatype_t dtype,
                                  loom_comm_t comm,
                                  const loom_coll_options_t *opts);
loom_result_t loom_iallgather_opts(const void *sendbuf, void *recvbuf,
                                   size_t sendcount, loom_datatype_t dtype,
                                   loom_comm_t comm,
                                   const loom_coll_options_t *opts,
                                   loom_request_t *req);

/* The codec plain loom_allreduce / loom_iallreduce of this communicator
 * use for LOOM_FLOAT32 with LOOM_SUM or LOOM_AVG (other calls stay
 * exact); NULL: none (the default).  Every rank must set the same. */
loom_result_t loom_comm_set_codec(loom_comm_t comm, const loom_codec_t *codec);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_H */
