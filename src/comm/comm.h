/* comm.h - the communicator as the rest of the library sees it. */
#ifndef LOOMI_COMM_H
#define LOOMI_COMM_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/socket.h>

#include "coll/coll.h"
#include "comm/calls.h"
#include "core/internal.h"
#include "transports/auth.h"
#include "transports/transport.h"

struct loomi_op;
struct loomi_hostmap;
struct loomi_topo_job;
struct loomi_links;
struct loomi_selection;
struct loomi_ctrl;
struct loomi_cmsg;
struct loomi_topo_rank;

#define LOOMI_COMM_MAGIC 0x4c4f4f4du /* "LOOM" */

#define LOOMI_MAX_COLLS 16

struct loom_comm {
    uint32_t magic;
    /* What the application holds (core/handle.c); NULL until the
     * communicator is published, and again after it is withdrawn.  Calls
     * into the public API on this communicator's behalf pass it. */
    loom_comm_t handle;
    int rank, nranks;
    int algo_forced[LOOMI_MAX_COLLS]; /* from LOOM_ALGO */
    struct loomi_settings set;
    unsigned char job_key[LOOMI_AUTH_KEY_BYTES]; /* auth.h: the secret's key */

    /* The engine that runs this communicator's operations over its
     * transport (eng.tops, eng.tstate), bound to it at allocation
     * (loomi_comm_engine_bind): its operations, progress thread and
     * cached buffers (sched.h). */
    struct loomi_engine eng;

    int machine_ranks;         /* ranks of the job on this machine */
    struct loomi_sched_cache *sched_cache; /* small schedules, built once (collectives.c) */
    struct loomi_devpool *devpool; /* pinned staging for device buffers (devbuf.c) */
    /* GPUDirect RDMA (collectives.c): calls run on device buffers through
     * the NIC, and calls that could have but were staged (a refusal). */
    unsigned long long gd_direct, gd_staged;
    struct loomi_devpeer *devpeer; /* device-direct calls through CUDA IPC (devpeer.c) */
    /* loom_allreduce_quorum's call count and, on rank 0, the transfers
     * its decisions left behind (quorum.c); NULL until the first call. */
    struct loomi_quorum *quorum;
    struct loomi_mode_tuner saves;         /* in-place shared saves (coll.h); calling thread */
    struct loomi_copyin_tuner copyin;      /* the shared copy-in (coll.h); calling thread */
    /* loom_comm_set_codec: the codec of plain loom_allreduce on fp32
     * SUM/AVG (NULL: none).  Set and read by the calling thread only. */
    const loom_codec_t *codec;

    /* Point-to-point message counters, allocated on first use: [2q] sent
     * to rank q, [2q+1] received from it (they make the tags, so that
     * messages between two ranks match in the order they were posted). */
    uint32_t *p2p_seq;

    /* Which ranks share a host (owned; NULL until known: every rank its
     * own host), and the job's topology where it was discovered. */
    struct loomi_hostmap *hosts;
    struct loomi_topo_job *topo;
    /* Bytes of each rank's shared arena that schedules may use (0: none
     * reachable). */
    size_t shared_bytes;
    /* Small collectives through slots at the tail of the arenas (small.c,
     * the engine's slot steps): inputs up to small_max bytes (0: off), in
     * a region of small_region bytes (eng.slot_off, eng.slot_bytes). */
    size_t small_max, small_region;
    /* Allreduce, reduce-scatter, allgather and alltoall (the first
     * LOOMI_SMALL_TUNED collectives) take the slots up to this many bytes
     * of slot (at most small_max), where they were measured faster than
     * the engine at init; the barrier, which puts nothing in them, always. */
    size_t small_lim[LOOMI_SMALL_TUNED];
    unsigned small_unmeasured; /* bit k: small_lim[k] is small_max, unmeasured */
    /* How much slower per byte than fp32 sums each (datatype, op)
     * reduces (redclass.c, timed at init by rank 0): class 0 about as
     * fast, classes 1-3 slower by up to 2 times, 4 times, and more; each
     * class's excess in ns/B beyond fp32 sums' in cache (what its table's
     * model and tune.c add to reductions), and its slowest pair (0xff:
     * none; small.c sweeps with it).  The allreduces of class k > 0 take
     * the slots up to small_lim_red[k], and the engine's table
     * sel->allreduce_red[k]. */
    struct loomi_red_classes red;
    size_t small_lim_red[LOOMI_RED_CLASSES];
    /* On one host, the allreduce's table as timed at init (tune.c):
     * sizes timed_lo to timed_hi (0: none), and the spans where another
     * algorithm than the model's took over, from `from` to 2 * from. */
    size_t timed_lo, timed_hi;
    /* 1 while tune.c times them: its calls run no trials of the store
     * tuners (coll.h), whose alternation would blur its comparisons. */
    int timing;
    int ntuned;
    struct {
        int cls; /* the class of reductions (red.cls) */
        size_t from;
        int was, now;
    } tuned[LOOMI_TUNED];
    /* The one-step schedule of a small collective, rewritten for each
     * call and run by the engine, which keeps it the communicator's
     * (small.c, loomi_op_run_slot_sched; no steps until the first). */
    struct loomi_sched small_sched;
    /* What the links cost and the cost model's choices (NULL: fixed
     * thresholds, as for local communicators). */
    struct loomi_links *links;
    struct loomi_selection *sel;

    /* Control plane: heartbeats, failure notices, membership (ctrl.h);
     * NULL for a single rank. */
    struct loomi_ctrl *ctrl;
    unsigned route_mask;                /* transports allowed (route.h) */
    struct sockaddr_storage bind_addr;  /* the local address used at bootstrap */
    unsigned bind_len;
    unsigned char *agreed_failed;       /* [nranks] left out of the last shrink or grow */
    uint64_t agree_seq;                 /* loom_comm_agree calls (agree.c) */
    uint32_t *grp_seq;                  /* [nranks] creates made with each rank (create_group.c) */
    uint32_t grp_calls;                 /* loom_comm_create_group calls */
    struct loomi_cmsg *agree_stash;     /* messages of the next agreement, come early */
    struct sockaddr_storage rdv_addr;   /* the job's rendezvous address (joiners come there) */
    unsigned rdv_len;                   /* 0: unknown */
    int rdv_fd;                         /* rank 0: the root's listening socket, kept (-1) */
    int rdv_keyed;                      /* the job has a key of its own (loomi_boot_target) */

    /* First failure; once set the communicator is broken. */
    loom_result_t error;
    int failed_rank;
    char errmsg[256];

    /* loom_mem_register's regions not yet deregistered (mem.c). */
    struct loom_mem *regs;
    /* loom_mem_alloc's windows not yet freed, and how many were made
     * (their ids, the same on every rank) (window.c). */
    struct loomi_win *wins;
    uint64_t win_count;
    /* A window shared by the host's ranks was made (collective, so every
     * rank agrees; never reset, as loom_mem_free is local): the
     * allreduce then selects from the window tables. */
    int win_shared;
    /* The window that loom_group_end stages fused allreduces in (group.c;
     * made without win_shared), and its bytes. */
    unsigned char *fuse_win;
    size_t fuse_win_bytes;

    /* Collective calls (calls.h): how many this rank made (the
     * operations' numbers, the same on every rank), the last
     * LOOMI_CALL_HIST of them, and what a mismatch has done so far. */
    _Atomic uint64_t call_no; /* written by the calling thread only */
    uint64_t last_w[2]; /* the last call's descriptor, and its check */
    uint32_t last_chk;
    struct loomi_call_rec calls[LOOMI_CALL_HIST];
    unsigned mail_seen;       /* control messages loomi_calls_poll has looked at */
    uint64_t calls_pushed;    /* loomi_calls_push ran (the last call shown + 1) */
    int verdict;              /* loomi_calls_verdict: 0 not yet, 1 found, 2 nothing found */
    int mismatch_told;        /* a call has returned LOOM_ERR_MISMATCH */
    int poll_slots;           /* small calls that look at the transport first (small.c) */
};

/* Number a collective call and remember it (calls.h; the calling
 * thread): returns its number, and its check in *chk. */
static inline uint64_t loomi_call_begin(struct loom_comm *c, const struct loomi_call *d,
                                        uint32_t *chk)
{
    const uint64_t no = atomic_load_explicit(&c->call_no, memory_order_relaxed) + 1;
    const uint64_t w0 = loomi_call_word0(d);
    atomic_store_explicit(&c->call_no, no, memory_order_relaxed);
    loomi_call_rec_put(&c->calls[no % LOOMI_CALL_HIST], no, w0, d->count);
    /* Loops make the same call over and over: its check is kept. */
    if (w0 != c->last_w[0] || d->count != c->last_w[1] || !c->last_chk) {
        c->last_w[0] = w0;
        c->last_w[1] = d->count;
        c->last_chk = loomi_call_check_words(w0, d->count);
    }
    *chk = c->last_chk;
    return no;
}

/* Free the handles of the registrations left on comm (destroy, after
 * the transport released the registrations themselves). */
void loomi_mem_release_all(struct loom_comm *comm);
/* loom_mem_alloc for fn; tables 0: the allreduce keeps its own tables
 * (comm->win_shared stays as it is): a window of the library's own. */
loom_result_t loomi_mem_alloc(loom_comm_t comm, const char *fn, size_t bytes, void **ptr,
                              int tables);
/* Unmap the windows left on comm (destroy). */
void loomi_mem_windows_free_all(struct loom_comm *comm);
/* Whether [p, p + len) lies in one of comm's windows shared with other
 * ranks: its id, the offset of p and the window's size. */
int loomi_mem_window_find(const struct loom_comm *comm, const void *p, size_t len, uint64_t *id,
                          size_t *off, size_t *win_bytes);
/* The host's n mappings of window id, by local index, and its size:
 * returns n, or 0 when comm has no such window of n ranks. */
int loomi_mem_window_map(const struct loom_comm *comm, uint64_t id, unsigned char **out, int n,
                         size_t *len);
/* The push guard of window id (window.c).  Before a step that writes
 * into the host's windows: returns -1 to go on, or a rank whose window
 * is closed (an operation failed there: do not write).  After the
 * step, with its streaming stores fenced: push_end.  When an operation
 * that pushes into this rank's window fails: close it and wait until no
 * peer is inside a push step, or deadline_ms; returns how many peers
 * were still inside one at the deadline. */
int loomi_mem_window_push_begin(const struct loom_comm *comm, uint64_t id);
void loomi_mem_window_push_end(const struct loom_comm *comm, uint64_t id);
int loomi_mem_window_close(const struct loom_comm *comm, uint64_t id, uint64_t deadline_ms);

/* Take / release the communicator's engine lock (nothing without a
 * progress thread).  Recursive; the caller thread's own calls only. */
static inline void loomi_comm_lock(const struct loom_comm *c) { loomi_engine_lock(&c->eng); }
static inline void loomi_comm_unlock(const struct loom_comm *c) { loomi_engine_unlock(&c->eng); }

/* Point c->eng at c (its rank, settings, failure, host map, control
 * plane, and the hooks by which the engine fails it, asks its control
 * plane and reaches its windows): right after allocation. */
void loomi_comm_engine_bind(struct loom_comm *c);

/* The communicator handle h names, or NULL when it names none (no
 * message). */
struct loom_comm *loomi_comm_get(loom_comm_t h);
/* The communicator h names, broken or not, in *out; else
 * LOOM_ERR_INVALID_ARGUMENT with a message naming fn and why (NULL,
 * destroyed, never a communicator). */
loom_result_t loomi_comm_live(loom_comm_t h, const char *fn, struct loom_comm **out);
/* loomi_comm_live, then arg (the call's argument named what) not NULL:
 * the door of the calls that take a pointer they must have. */
loom_result_t loomi_comm_live_arg(loom_comm_t h, const char *fn, const void *arg,
                                 const char *what, struct loom_comm **out);
/* Same, and the communicator can run operations (LOOM_ERR_REVOKED when
 * broken). */
loom_result_t loomi_comm_check(loom_comm_t h, const char *fn, struct loom_comm **out);
/* Same for a call queued in a group (loomi_group_active): a
 * communicator broken by ranks whose calls differ (LOOM_ERR_MISMATCH)
 * does not fail it; loom_group_end fails the group with that mismatch,
 * as a lone call would fail (comm/group.c). */
loom_result_t loomi_comm_check_queued(loom_comm_t h, const char *fn, struct loom_comm **out);
/* The same for a collective call that has its number (comm/calls.h),
 * without bringing the communicator up to date with its control plane:
 * the call's own progress does that.  Before it, a collective checks
 * only that comm is a communicator (loomi_comm_live), so that a call
 * that finds the communicator broken counts among this rank's calls.
 * queued: the call is queued in a group (see loomi_comm_check_queued). */
loom_result_t loomi_comm_check_call(struct loom_comm *comm, const char *fn, int queued);
/* The algorithm to run for this collective and size, in place or not;
 * *chunk (when not NULL) gets the chunk its table names for it, 0 for
 * LOOM_CHUNK_SIZE (always where LOOM_ALGO forces the algorithm). */
int loomi_algo_for(const struct loom_comm *comm, int coll, size_t bytes, int inplace,
                   loom_datatype_t dtype, loom_op_t op, size_t *chunk);
/* Make c live: give it its handle and magic (LOOM_ERR_NO_MEMORY when no
 * handle is left).  Withdraw: its handle names nothing from now on
 * (nothing when it has none).  Every communicator that was published is
 * withdrawn before it is freed. */
loom_result_t loomi_comm_publish(struct loom_comm *c);
void loomi_comm_withdraw(struct loom_comm *c);

/* Mark the communicator failed (first caller wins), fail its operations
 * and tell the peers.  Safe to call more than once. */
void loomi_comm_fail(struct loom_comm *comm, loom_result_t code, int failed_rank,
                     const char *fmt, ...) LOOMI_PRINTF(4, 5);

/* loom_comm_agree's fault-tolerant agreement (agree.c), for the library's
 * own use too: every rank of comm not known failed contributes *value;
 * the result (op LOOM_MIN or LOOM_MAX) is the same on every rank that
 * returns LOOM_SUCCESS, and so is, in decided ([nranks], may be NULL),
 * the set of ranks the decision counted out (LOOMI_OUT, LOOMI_OUT_LEFT).
 * Needs comm->ctrl; breaks nothing on failure (the caller decides). */
loom_result_t loomi_agree(struct loom_comm *comm, uint64_t *value, loom_op_t op,
                          unsigned char *decided, uint64_t deadline_ms, const char *fn);

/* A membership call (shrink, grow, agree) found this rank out of the job
 * (declared failed, or in a minority): for err LOOM_ERR_REVOKED, break
 * the communicator with the thread's last error as its reason, which
 * stays the last error.  Returns err. */
loom_result_t loomi_comm_out(struct loom_comm *comm, loom_result_t err);

/* Bring the communicator up to date with its control plane: a failure
 * or revocation seen there breaks it here (returns comm->error). */
loom_result_t loomi_comm_sync(struct loom_comm *comm);
/* Whether the control plane holds a revocation that loomi_comm_sync
 * would act on (cheap: an atomic load). */
int loomi_comm_revoke_pending(const struct loom_comm *comm);

/* Building a communicator in two halves around an exchange of every
 * rank's LOOMI_ADDR_BYTES address (the bootstrap root, or the control
 * plane for shrink): prepare creates transports and the control plane
 * and fills `addr`; finish connects, measures (or reuses `links`) and
 * chooses algorithms.  On failure, discard frees what prepare made. */
loom_result_t loomi_comm_prepare(struct loom_comm *c, const struct loomi_topo_rank *me,
                                 unsigned char *addr);
loom_result_t loomi_comm_finish(struct loom_comm *c, const unsigned char *all,
                                uint64_t deadline_ms, const struct loomi_links *links);
void loomi_comm_discard(struct loom_comm *c);

/* A communicator of some of parent's ranks, built over parent's control
 * plane as a shrink builds the survivors' (shrink.c): every member calls
 * it with the same spec (the others do not); the lowest of the new order
 * gathers the members' addresses and hands them out (messages of epoch
 * `round`, which no other build on parent may use), then all connect and
 * measure, giving up when a member fails or gives up.  The new
 * communicator, published, in *out; on failure NULL, and the others hear
 * it.  Its settings are spec's; it does not serve joiners. */
struct loomi_child_spec {
    const int *members; /* parent ranks, in the new communicator's rank order */
    int nmembers;
    const struct loomi_settings *set;
    const int *algo_forced; /* [LOOMI_MAX_COLLS] */
    unsigned route_mask;
    uint32_t round;
    uint64_t deadline;
    const char *fn;
    /* NULL for a split; for loom_comm_create_group, [nranks of parent]:
     * the epoch of this create's messages between this rank and each
     * member, and a rank giving up tells the others with a
     * LOOMI_CMSG_GROUP (LOOMI_GRP_GIVEUP) of that epoch, not a GIVEUP of
     * the round (whose epochs shrink and split compare by order). */
    const uint32_t *pair_seq;
};
loom_result_t loomi_comm_child(struct loom_comm *parent, const struct loomi_child_spec *spec,
                               struct loom_comm **out);

/* loom_comm_split's order (split.c): of n ranks' (color, key), the ranks
 * of colour `color` ordered by key, then rank, into members; returns how
 * many (0 for LOOM_SPLIT_NOCOLOR). */
int loomi_split_order(const int *color, const int *key, int n, int color_of_me, int *members);

/* A zeroed communicator with its rank, size, settings (from cfg and the
 * environment) and LOOM_ALGO resolved; no transport yet.  Freed with free()
 * until it has one. */
loom_result_t loomi_comm_alloc(struct loom_comm **out, int rank, int nranks,
                               const loom_config_t *cfg, const char *caller);

/* Release a communicator's schedule cache (collectives.c). */
void loomi_sched_cache_free(struct loomi_sched_cache *sc);
/* quorum.c: wait for the transfers earlier quorum calls left behind
 * (loom_comm_destroy), and free the state. */
struct loomi_quorum;
loom_result_t loomi_quorum_drain(struct loom_comm *comm);
void loomi_quorum_free(struct loomi_quorum *q);

/* The transport's peer_failed callback (owner: the communicator). */
/* The transports' ctx.peer_word: wait up to ms for the control plane's
 * word on peer; 1 when the communicator failed meanwhile for a reason
 * other than a rank's failure (a mismatch, a revocation), which is then
 * its error. */
int loomi_comm_peer_word(void *owner, int peer, int ms);
void loomi_comm_on_peer_failed(void *owner, int peer, int failed, loom_result_t code,
                               const char *why);

/* ------------------------------------------------------------ uniform */

/* The settings that choose each rank's part of a schedule or a path
 * (LOOM_ALGO, LOOM_CHUNK_SIZE, LOOM_SHM_*, LOOM_PROBE, LOOM_TRANSPORT,
 * LOOM_TUNING_FILE's content, LOOM_HEARTBEAT_MS, by which a peer's
 * silence is judged, LOOM_QUORUM, by which survivors may go on, and
 * LOOM_ENCRYPT, without which the ends of a connection cannot talk).
 * Ranks that differ in one would wait on each other until LOOM_TIMEOUT,
 * call a live peer failed or split the job: they are compared when
 * the ranks meet (bootstrap.c, join.c) and refused with the name.
 * Fixed-size and host-endian, like the rest of the rendezvous. */
struct loomi_uniform {
    uint64_t chunk_bytes; /* 0: the model chooses */
    uint64_t shm_bytes, shm_small, shm_stream;
    uint64_t shm_cma; /* UINT64_MAX: unset (the default, crowded or not) */
    uint64_t tuning_hash;
    int32_t tuning; /* 0: no file, 1: read, 2: could not be read */
    int32_t probe, shm_stream_saves, shm_stream_copyin, heartbeat_ms, tcp_streams;
    int32_t quorum_any;
    int32_t encrypt; /* LOOM_ENCRYPT */
    uint32_t route_mask;
    int8_t algo[LOOMI_MAX_COLLS];
    char transport[64]; /* as given, for the message */
};

/* with_tuning: hash LOOM_TUNING_FILE's content (a joiner takes the
 * members' links and reads no file, so it leaves this out). */
void loomi_uniform_fill(struct loomi_uniform *u, const struct loomi_settings *s,
                        const int *algo_forced, unsigned route_mask, int with_tuning);
/* 0 when a and b agree; else 1, and msg says which setting differs and
 * its value at each side, named by who_a and who_b ("rank 0"). */
int loomi_uniform_diff(const struct loomi_uniform *a, const char *who_a,
                       const struct loomi_uniform *b, const char *who_b, char *msg, size_t n);

/* ------------------------------------------------------------ bootstrap */

/* 16-byte job key + rendezvous address, as carried in a loom_unique_id_t;
 * and for messages, how the deadline is set (loomi_timeout_str; "" when
 * unknown) and where the key came from. */
struct loomi_boot_target {
    char host[256];
    char port[16];
    unsigned char job_key[LOOMI_AUTH_KEY_BYTES]; /* auth.h: the secret's key */
    char tmo[128];
    /* 0: no secret (no LOOM_JOB_KEY): the public key, which only ranks
     * on one host may use; two jobs started by hand on one address then
     * hold the same key. */
    int keyed;
};

/* Start the rendezvous service for a job of nranks (or any size if
 * nranks == 0: fixed by the first rank that arrives) on host:port
 * ("0" = ephemeral); the chosen port is written back.  Runs in a thread
 * of its own and ends when every rank has its reply, or at deadline_ms,
 * when it tells every rank registered which ranks never came.  With
 * listen_fd, the caller gets a descriptor of the listening socket of its
 * own (or -1), which keeps the address bound after the thread ends: the
 * job's join service takes it over (ctrl.c), so that no other job's rank
 * 0 can bind the address in between.  A host
 * that is not an address of this machine fails at once
 * (LOOM_ERR_INVALID_ARGUMENT), and so does an address in use (the root
 * of another job there is told, so that the jobs do not merge). */
loom_result_t loomi_root_start(const struct loomi_boot_target *t, char *port, size_t portlen,
                               int nranks, uint64_t deadline_ms, int detached,
                               pthread_t *thread, int *listen_fd);

/* A connection to a running job's join service (ctrl.c), proven to hold
 * the job's key, began with the `len` bytes in buf: when they are a
 * rendezvous hello (a rank registering after the job formed, or a second
 * rank 0 that found the address in use), answer it with
 * LOOM_ERR_MISMATCH.  Returns -1 when buf is not a hello, 0 when more
 * bytes are needed, 1 when it was answered and the job goes on (a job
 * with a key of its own: the process is refused), 2 when it was answered
 * and the job must be refused too (why, for the revocation): the job has
 * no secret, so two jobs started by hand share the address and this one
 * may hold ranks of the other. */
int loomi_boot_late_hello(int fd, const unsigned char *buf, size_t len, int keyed,
                          const char *addr, char *why, size_t whyn);

/* 1 when host (a name or an address) is an address of this host. */
int loomi_boot_host_is_local(const char *host);

/* Connect to the root before deadline_ms, and prove this process holds
 * the job's key (auth.h: as rank `rank`, or as a joiner when rank is -1,
 * whom only a running job's join service takes); `local` receives the
 * address this process used to reach it (the interface to use for data
 * when none is configured).  LOOM_ERR_MISMATCH: what listens there is
 * not this job's; LOOM_ERR_REMOTE: the connection broke during the
 * handshake (a join service whose holder just died: try again).  The
 * connection's key material goes to session, unless NULL (auth.h). */
loom_result_t loomi_boot_connect(const struct loomi_boot_target *t, int rank,
                                 uint64_t deadline_ms, int *fd, void *local, unsigned *local_len,
                                 unsigned char *session);
/* Register with the root over fd (closed on return) and receive every
 * rank's transport address (LOOMI_ADDR_BYTES each, rank order). */
loom_result_t loomi_boot_exchange(int fd, const struct loomi_boot_target *t, int rank,
                                  int nranks, const void *addr, size_t addr_len,
                                  const struct loomi_uniform *uniform, unsigned char *all_addrs,
                                  uint64_t deadline_ms);

/* A joiner's target: LOOM_ROOT and LOOM_JOB_KEY (join.c). */
loom_result_t loomi_env_join_target(struct loomi_boot_target *t);

/* Read the launcher's environment: fills target, rank and nranks. */
loom_result_t loomi_env_target(struct loomi_boot_target *t, int *rank, int *nranks);
/* This process's index among the job's ranks on its host, and their
 * number, as the launcher says (LOOM_LOCAL_RANK/LOOM_LOCAL_SIZE, torchrun's
 * LOCAL_RANK/LOCAL_WORLD_SIZE, Open MPI's OMPI_COMM_WORLD_LOCAL_RANK/SIZE);
 * -1 and 0 when none does.  A hint (which NIC to open), never an error. */
void loomi_env_local_rank(int rank, int *local, int *nlocal);

/* Create and connect a communicator (shared by init_rank and init_env).
 * is_root_host: this process must run the root service (env mode, rank 0). */
loom_result_t loomi_comm_create(loom_comm_t *out, const struct loomi_boot_target *t,
                                int rank, int nranks, const loom_config_t *cfg,
                                const char *caller, bool run_root);

#endif
