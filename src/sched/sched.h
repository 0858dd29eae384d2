/*
 * sched.h - schedules (what algorithms emit) and the engine that runs them.
 *
 * A schedule is a DAG of steps for one rank.  Buffers are named, not
 * pointed to (send, recv, scratch), so one schedule can be run over any
 * user buffers and checked or simulated without them.  Sends and
 * receives carry a step tag; a send on rank A and the receive on rank B
 * with the same tag are one message.
 */
#ifndef LOOMI_SCHED_H
#define LOOMI_SCHED_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "loom.h"
#include "core/internal.h"
#include "transports/transport.h"

enum loomi_step_kind {
    LOOMI_STEP_SEND,   /* send buf[src]+src_off, count elements, to peer */
    LOOMI_STEP_RECV,   /* receive count elements from peer into dst */
    LOOMI_STEP_REDUCE, /* dst = src OP src2 (dst may be src or src2) */
    LOOMI_STEP_COPY,   /* dst = src; flags LOOMI_COPY_ALSO */
    LOOMI_STEP_AVG,    /* dst /= nranks (the end of LOOM_AVG), or by flags if nonzero */
    /* dst = src OP shared arena i at src2_off, for every arena i of the
     * host except `peer` (the caller's local index), in one pass that
     * reads each operand once (blocked in cache): the reduction of a
     * slice against the copies the host's other ranks left in their
     * arenas. */
    LOOMI_STEP_REDUCE_SHARED,
    /* Compression (s->codec; fp32 schedules).  An encoded "slot" of n
     * values is loomi_codec_slot_bytes(codec, n) bytes: a u64 LE length,
     * then the encoding, then zero padding; it is sent and received
     * whole (count = slot bytes / esize), so both sides agree on the
     * length whatever the codec.  count is the number of fp32 values. */
    LOOMI_STEP_ENCODE,     /* slot dst = encode(src fp32); flags LOOMI_ENC_* */
    LOOMI_STEP_DECODE,     /* dst fp32 = decode(slot src) */
    LOOMI_STEP_DECODE_ACC, /* dst fp32 = src2 fp32 + decode(slot src) */
    /* Fail the operation (LOOM_ERR_MISMATCH) unless count elements at
     * src equal those at src2: a received descriptor against this rank's
     * own (see loomi_sched.desc); `peer` names the rank it came from. */
    LOOMI_STEP_EXPECT,
    /* A small collective among the ranks of one host (s->nranks, all of
     * them), through the slots at the tail of their shared arenas
     * (slot.c): publish count elements of src (nranks blocks of them
     * with LOOMI_SLOT_BLOCKS) in this rank's slot under the word of call
     * s->call and check s->chk, wait until every rank published the same
     * word, then read into dst as flags LOOMI_SLOT_* say; one step is
     * the whole operation.  No message: the engine polls the words. */
    LOOMI_STEP_SLOT
};

/* LOOMI_STEP_SLOT flags: what is read once every rank has published.
 * REDUCE: dst = every rank's input reduced in rank order (the same bytes
 * on every rank); GATHER: rank q's input to dst + q * count elements;
 * with BLOCKS, each input is nranks blocks of count elements and a rank
 * reads block s->rank of each (reduce-scatter, all-to-all); neither
 * REDUCE nor GATHER: nothing (a barrier, count 0). */
#define LOOMI_SLOT_REDUCE 0x1u
#define LOOMI_SLOT_GATHER 0x2u
#define LOOMI_SLOT_BLOCKS 0x4u

/* LOOMI_STEP_ENCODE flags: write the decoded encoding to src2 (which may
 * be src itself); encode with error feedback (s->ef_state, s->ef_key, a
 * tensor of s->ef_count values whose element i is at byte ef_base + i *
 * esize of src's buffer). */
#define LOOMI_ENC_DECODED 0x1u
#define LOOMI_ENC_EF 0x2u

/* LOOMI_STEP_COPY flag: also write the bytes to src2 + src2_off, a second
 * destination.  It is meant for a saved input, read back only if the
 * operation fails: with LOOMI_COPY_STREAM too, both are written in one
 * pass over src (read once from memory) and the second copy bypasses the
 * cache (a big vector); without, two ordinary copies from a src that is
 * in cache, and both stay there (a small one's save is cheaper in cache,
 * where the next call finds it). */
#define LOOMI_COPY_ALSO 0x1u
/* LOOMI_STEP_COPY flag: write dst with non-temporal stores, which do not
 * first read the lines they overwrite.  For results the operation does
 * not read again and that the caches cannot keep anyway (a big vector):
 * on those, cached stores cost a third more memory traffic. */
#define LOOMI_COPY_STREAM 0x2u
/* LOOMI_STEP_COPY flag: first write dst's old bytes to src2 + src2_off
 * (the saved input of saves_input, read back only if the operation
 * fails), then dst = src, in one pass: the read of each old line serves
 * both the save and the store that overwrites it.  With
 * LOOMI_COPY_STREAM too, the save's stores are non-temporal (a big
 * vector; a small one's save stays in cache for the next call). */
#define LOOMI_COPY_SAVE 0x4u
/* LOOMI_STEP_COPY flag, with LOOMI_COPY_ALSO: dst's stores are
 * non-temporal too (an input copied into an arena that the host's other
 * ranks read from memory: see loomi_copyin_tuner in coll.h). */
#define LOOMI_COPY_STREAM_DST 0x8u
/* LOOMI_STEP_REDUCE_SHARED flag: save dst's old bytes to SCRATCH at
 * dst_off, block by block before overwriting it (the saves_input
 * convention of the same offsets); non-temporal with LOOMI_RS_STREAM. */
#define LOOMI_RS_SAVE 0x1u
/* LOOMI_STEP_REDUCE_SHARED flags: push the result to every shared id i
 * other than `peer`, at win_push_off + dst_off, as well as to dst (the
 * out-of-place window form: the reducer of a slice writes it into every
 * rank's RECV); with LOOMI_RS_STREAM, all those stores are non-temporal
 * (without LOOMI_RS_PUSH, LOOMI_RS_STREAM applies to LOOMI_RS_SAVE's).
 * The division of LOOM_AVG is done before the push. */
#define LOOMI_RS_PUSH 0x2u
#define LOOMI_RS_STREAM 0x4u
/* LOOMI_STEP_REDUCE_SHARED flag: also write the result to this rank's
 * own arena (shared id `peer`) at src2_off, where the host's other ranks
 * copy it from, in the same pass as dst: the staged form's reducer then
 * writes RECV directly instead of reading its slice back from the arena.
 * LOOM_AVG's division is done before both writes.  With LOOMI_RS_STREAM,
 * the saves (LOOMI_RS_SAVE) or else dst's stores are non-temporal; the
 * arena's never are (peers read it next). */
#define LOOMI_RS_KEEP 0x8u

enum loomi_buf { LOOMI_BUF_SEND = 0, LOOMI_BUF_RECV = 1, LOOMI_BUF_SCRATCH = 2,
                 LOOMI_NBUFS = 3 };
/* Buffer ids from LOOMI_BUF_SHARED on name shared arenas: id
 * LOOMI_BUF_SHARED + i is the arena of local rank i of this rank's host
 * (hostmap order), which every rank of the host can read and write; or,
 * in a schedule with a window (win_id), local rank i's mapping of that
 * loom_mem_alloc window.
 * Local steps (COPY, REDUCE, AVG) and sends may use them; what orders
 * one rank's access against another's is the schedule's messages, which
 * the validator does not check (the sim suite runs them). */
#define LOOMI_BUF_SHARED 3
#define LOOMI_MAX_SHARED (256 - LOOMI_BUF_SHARED)

#define LOOMI_MAX_DEPS 4

struct loomi_step {
    uint8_t kind;
    uint8_t src, src2, dst; /* enum loomi_buf */
    int32_t peer;           /* SEND/RECV */
    uint32_t tag;           /* SEND/RECV: equal on both sides of a message */
    uint32_t flags;         /* ENCODE: LOOMI_ENC_* */
    size_t src_off, src2_off, dst_off; /* bytes */
    size_t count;                      /* elements */
};

struct loomi_sched {
    int nranks, rank;
    loom_datatype_t dtype;
    loom_op_t op;
    size_t esize;
    size_t buf_bytes[LOOMI_NBUFS]; /* extent each buffer must have */
    size_t shared_bytes;           /* extent used in every shared arena (0: none used) */
    int nshared;                   /* shared arenas named (ranks on this host) */
    uint32_t nsteps, cap;
    struct loomi_step *steps;
    uint8_t *ndeps;         /* per step */
    uint32_t (*deps)[LOOMI_MAX_DEPS];
    /* Successor lists, built by loomi_sched_finish (CSR form). */
    uint32_t *succ_start, *succ;
    int ok; /* 0 after an allocation failure: finish() reports it */
    /* Point-to-point: not a collective, so it takes no collective sequence
     * number; each step's tag is the per-peer message counter. */
    /* The operation's own buffers (SEND, RECV) are CUDA device memory
     * (GPUDirect RDMA, the verbs transport): sends and receives are
     * marked so (loomi_xfer.dev), copies go through the driver, and the
     * schedule may hold nothing else, nor run in place. */
    int dev;
    int p2p;
    /* In place: the engine copies RECV's bytes to SCRATCH offset 0 before
     * any step runs, and restores RECV from there if the operation fails,
     * so a generator that needs the input staged gets it for free. */
    int scratch_has_input;
    /* In place, the other way: the schedule itself copies each range of
     * RECV to the same offset of SCRATCH before any step overwrites it
     * (the copy can then come late, from data already in cache).  The
     * engine makes no copy up front, and on failure restores only the
     * ranges of RECV that steps already started had written. */
    int saves_input;
    /* The collective (plus one; 0: none, as for point-to-point) and the
     * algorithm that built it, for the messages of a failure: ranks that
     * forced different algorithms stall on each other. */
    int coll1, algo;
    /* The collective call it runs (its number, the operation's, the same
     * on every rank) and the call's check, which every message carries
     * (comm/calls.h); set by the caller before loomi_op_start. */
    uint64_t call;
    uint32_t chk;
    /* Owned by a cache, lent to an operation: loomi_sched_free leaves the
     * arrays alone, and loomi_sched_finish has already run. */
    int borrowed;
    /* Compressed schedules: the codec of the ENCODE/DECODE steps, and the
     * error-feedback state the engine commits when the operation
     * succeeds and rolls back when it fails (NULL: none). */
    const loom_codec_t *codec;
    loom_codec_state_t ef_state;
    uint64_t ef_key;
    size_t ef_count;
    size_t ef_base; /* byte offset of the tensor's element 0 in an EF step's src */
    /* Shared ids name the host's mappings of this loom_mem_alloc window
     * (its id, nonzero) instead of the arenas; shared_bytes is then the
     * extent used in each. */
    uint64_t win_id;
    size_t win_push_off; /* LOOMI_RS_PUSH: RECV's offset in the windows */
    /* A descriptor of how this rank runs the operation, which the engine
     * writes at SCRATCH + desc_off before any step runs (desc_len bytes,
     * 0: none): the schedule sends it to peers, who compare it with
     * their own (LOOMI_STEP_EXPECT). */
    uint64_t desc[4];
    size_t desc_off, desc_len;
};

int loomi_sched_init(struct loomi_sched *s, int rank, int nranks,
                     loom_datatype_t dtype, loom_op_t op);
/* Append a step depending on `deps` (indices of earlier steps; entries
 * equal to UINT32_MAX are ignored).  Returns its index. */
uint32_t loomi_sched_add(struct loomi_sched *s, const struct loomi_step *st,
                         const uint32_t *deps, int ndeps);
/* Check ranges against buf_bytes and build successor lists. */
loom_result_t loomi_sched_finish(struct loomi_sched *s);
void loomi_sched_free(struct loomi_sched *s);

#define LOOMI_NO_DEP UINT32_MAX

/* Helpers for algorithms. */
uint32_t loomi_sched_send(struct loomi_sched *s, int peer, uint32_t tag, int buf,
                          size_t off, size_t count, const uint32_t *deps, int ndeps);
uint32_t loomi_sched_recv(struct loomi_sched *s, int peer, uint32_t tag, int buf,
                          size_t off, size_t count, const uint32_t *deps, int ndeps);
uint32_t loomi_sched_reduce(struct loomi_sched *s, int dst, size_t dst_off, int a,
                            size_t a_off, int b, size_t b_off, size_t count,
                            const uint32_t *deps, int ndeps);
uint32_t loomi_sched_copy(struct loomi_sched *s, int dst, size_t dst_off, int src,
                          size_t src_off, size_t count, const uint32_t *deps, int ndeps);
/* A copy with non-temporal stores (LOOMI_COPY_STREAM). */
uint32_t loomi_sched_copy_stream(struct loomi_sched *s, int dst, size_t dst_off, int src,
                                 size_t src_off, size_t count, const uint32_t *deps,
                                 int ndeps);
/* save = dst, then dst = src, in one pass (LOOMI_COPY_SAVE). */
uint32_t loomi_sched_copy_save(struct loomi_sched *s, int dst, size_t dst_off, int src,
                               size_t src_off, int save, size_t save_off, size_t count,
                               const uint32_t *deps, int ndeps);
/* dst = src and dst2 = src, reading src once (LOOMI_COPY_ALSO). */
uint32_t loomi_sched_copy2(struct loomi_sched *s, int dst, size_t dst_off, int dst2,
                           size_t dst2_off, int src, size_t src_off, size_t count,
                           const uint32_t *deps, int ndeps);

uint32_t loomi_sched_avg(struct loomi_sched *s, int dst, size_t dst_off, size_t count,
                         const uint32_t *deps, int ndeps);
/* A step that completes after all n steps of list: a tree of zero-count
 * copies (no-ops in the engine), each waiting for up to LOOMI_MAX_DEPS.
 * The list is overwritten.  Returns list[0] when n is 1, LOOMI_NO_DEP
 * when n is 0. */
uint32_t loomi_sched_join(struct loomi_sched *s, uint32_t *list, size_t n);
/* LOOMI_STEP_EXPECT: count elements at a + a_off equal those at b + b_off,
 * as received from peer. */
uint32_t loomi_sched_expect(struct loomi_sched *s, int a, size_t a_off, int b, size_t b_off,
                            size_t count, int peer, const uint32_t *deps, int ndeps);
uint32_t loomi_sched_reduce_shared(struct loomi_sched *s, int dst, size_t dst_off, int src,
                                   size_t src_off, size_t arena_off, int skip, size_t count,
                                   const uint32_t *deps, int ndeps);
/* LOOMI_STEP_SLOT from src (offset 0) to dst (offset 0), count elements a
 * block, flags LOOMI_SLOT_*. */
uint32_t loomi_sched_slot(struct loomi_sched *s, int dst, int src, size_t count, unsigned flags);
/* Bytes at the tail of each arena that slots of slot_bytes take (slot.c). */
size_t loomi_slot_region_bytes(size_t slot_bytes);

/* Bytes of an encoded slot of n values (see LOOMI_STEP_ENCODE): 8 +
 * loom_codec_max_encoded_bytes, rounded up to 8; 0 if too large. */
size_t loomi_codec_slot_bytes(const loom_codec_t *codec, size_t n);
uint32_t loomi_sched_encode(struct loomi_sched *s, int dst, size_t dst_off, int src,
                            size_t src_off, size_t count, unsigned flags, int dec,
                            size_t dec_off, const uint32_t *deps, int ndeps);
uint32_t loomi_sched_decode(struct loomi_sched *s, int dst, size_t dst_off, int src,
                            size_t src_off, size_t count, const uint32_t *deps, int ndeps);
/* dst = base + decode(src); base may be dst itself (accumulate). */
uint32_t loomi_sched_decode_acc(struct loomi_sched *s, int dst, size_t dst_off, int base,
                                size_t base_off, int src, size_t src_off, size_t count,
                                const uint32_t *deps, int ndeps);

/* ------------------------------------------------------------- engine */

struct loomi_op;
struct loomi_engine;
struct loomi_hostmap;
struct loomi_ctrl; /* the owner's control plane: opaque here */

/* Where the owner has a control plane: the longest the engine sleeps in
 * one wait, so that a revocation arriving there is acted on promptly. */
#define LOOMI_CTRL_POLL_MS 50
/* A wait on a peer with nothing moving for this long asks the owner to
 * probe the peer (hooks.calls_probe: the call this rank is in), once per
 * stall. */
#define LOOMI_CALL_STALL_MS 20
/* For this long into a stall, a wait looks at the control plane every
 * LOOMI_CALL_ANSWER_POLL_MS (not every LOOMI_CTRL_POLL_MS): a peer's
 * probe, or its answer to this rank's, is likely to come then. */
#define LOOMI_CALL_ANSWER_MS 500
#define LOOMI_CALL_ANSWER_POLL_MS 5

/* What the engine asks of its owner (the communicator), which fills
 * loomi_engine.hooks.  Every hook is called with the engine's lock held
 * (loomi_engine_lock), from the calling thread or the progress thread. */
struct loomi_engine_hooks {
    /* The owner breaks with code (its first failure sticks), blaming
     * peer (-1: none), because of msg; it sets *e->error and e->errmsg,
     * and tells the other ranks.  The engine then fails its operations. */
    void (*fail)(struct loomi_engine *e, loom_result_t code, int peer, const char *msg);
    /* The control plane (called only where *e->ctrl is not NULL):
     * whether a peer's revocation waits to be acted on; bring the owner
     * up to date with it (not LOOM_SUCCESS: it broke); answer the
     * probes of peers stalled in a call; ask peers that this rank waits
     * on in call `no` which call they are in (comm/calls.h). */
    int (*revoke_pending)(struct loomi_engine *e);
    loom_result_t (*sync)(struct loomi_engine *e);
    void (*calls_poll)(struct loomi_engine *e);
    void (*calls_probe)(struct loomi_engine *e, uint64_t no, const int *peers, int npeers);
    /* A collective failed with LOOM_ERR_MISMATCH: find out which rank's
     * call differs; returns nonzero when e->errmsg now says so. */
    int (*calls_verdict)(struct loomi_engine *e);
    /* Windows (schedules with win_id): the host's n mappings of window
     * id and its size (returns n, or 0: no such window); the push guard
     * around a step that writes into the peers' windows (begin: -1 to
     * go on, else the rank whose window is closed); close this rank's
     * window to pushes after a failure, waiting until deadline_ms for
     * the peers inside one (returns how many were left). */
    int (*window_map)(struct loomi_engine *e, uint64_t id, unsigned char **out, int n,
                      size_t *len);
    int (*window_push_begin)(struct loomi_engine *e, uint64_t id);
    void (*window_push_end)(struct loomi_engine *e, uint64_t id);
    int (*window_close)(struct loomi_engine *e, uint64_t id, uint64_t deadline_ms);
};

/* The progress thread (LOOM_PROGRESS_THREAD=1; engine.c).  `mu` guards
 * the engine's state (operations, transport) against it: every entry
 * that touches them takes it through loomi_engine_lock. */
struct loomi_progress {
    pthread_mutex_t mu;  /* recursive: internal paths nest */
    pthread_cond_t turn; /* the thread waits here while a caller wants mu */
    /* callers waiting for mu: a hint, relaxed everywhere; mu orders what
     * the thread and the callers share */
    atomic_int want;
    pthread_t thread;
    int wakefd;          /* eventfd: an operation started, or stop */
    int sleeping;        /* the thread is in poll() (under mu) */
    int stop;            /* under mu */
};

/* An engine: runs schedules over one transport, every wait with the
 * owner's deadline.  It knows no collective and no communicator: a
 * schedule's tags are opaque to it (name_sig names them in messages),
 * and what it needs of its owner it reads through the pointers below or
 * asks through the hooks.  The owner embeds it and sets the first group
 * with loomi_engine_bind; the transport's fields when it has one. */
struct loomi_engine {
    /* The owner's, read by the engine: */
    void *owner;
    const struct loomi_engine_hooks *hooks;
    const int *rank;                     /* this rank */
    struct loomi_settings *set;          /* timeout_ms, spin_us, progress_thread */
    const loom_result_t *error;          /* the owner's first failure (set through fail) */
    const char *errmsg;                  /* and its message */
    struct loomi_hostmap *const *hosts;  /* which ranks share a host (NULL: unknown) */
    struct loomi_ctrl *const *ctrl;      /* a control plane (NULL: none; the hooks use it) */
    loomi_sig_namer name_sig;            /* names a schedule's signature (NULL: by number) */
    int oversubscribed;                  /* more ranks than cores: waiting ranks yield */
    /* The transport the engine runs schedules over: */
    const struct loomi_transport_ops *tops;
    void *tstate;
    /* The slots of LOOMI_STEP_SLOT (slot.c): a region at byte slot_off of
     * every rank's shared arena (tops->shared_map), with slots of
     * slot_bytes (0: none); the owner sets them with the transport. */
    size_t slot_off, slot_bytes;

    /* The engine's own: */
    struct loomi_op *active;   /* running operations (doubly linked) */
    struct loomi_op *live;     /* every operation not yet waited for */
    int nactive;
    int nlive;                 /* operations started and not yet waited for (requests held) */
    uint64_t last_progress_ms; /* a step completed (the deadline's clock) */
    int progressed;            /* a transfer completed since last_progress_ms was read */
    unsigned rounds;           /* polls, to read the clock every so many */
    uint64_t xfer_events;      /* transfers completed: lets a transport see its progress */
    struct loomi_op *shq_head; /* shared-arena operations, oldest first */
    int shq_kick;              /* one of them was released: run it before sleeping */
    uint64_t stall_probed_ms;  /* the stall (its last_progress_ms) already probed */
    struct loomi_op *spare_op; /* the last small operation freed, for reuse */
    /* LOOMI_STEP_SLOT: every rank's slot region as mapped here (slot_nmap
     * of them; NULL until the first such step), and the slot operations
     * started, which pick one of two slots. */
    unsigned char **slot_map;
    int slot_nmap;
    uint64_t slot_seq;
    /* The operation that runs slot schedules when nothing else runs
     * (loomi_op_run_slot_sched), kept from call to call. */
    struct loomi_op *slot_op;
    /* Buffers cached across operations. */
    void *scratch, *backup;
    size_t scratch_len, backup_len;
    int scratch_busy, backup_busy;
    /* Sends to and receives from this very rank, not yet matched (the
     * engine pairs them; no transport sees them).  Linked by t_next. */
    struct loomi_xfer *self_q[2];
    /* The progress thread, started with the first operation when
     * set->progress_thread; NULL: none (then no lock is taken). */
    struct loomi_progress *pt;
    /* Straggler telemetry (stats.c), NULL when off (LOOM_STATS=0). */
    struct loomi_stats *stats;
};

/* Point e at its owner's fields (they may change later; the engine reads
 * them through these pointers). */
void loomi_engine_bind(struct loomi_engine *e, void *owner, const struct loomi_engine_hooks *hooks,
                       const int *rank, struct loomi_settings *set, const loom_result_t *error,
                       const char *errmsg, struct loomi_hostmap *const *hosts,
                       struct loomi_ctrl *const *ctrl, loomi_sig_namer name_sig);
/* Free what the engine cached (after loomi_engine_free_all and
 * loomi_progress_stop). */
void loomi_engine_release(struct loomi_engine *e);

/* Take / release the engine's lock (nothing without a progress thread).
 * Recursive; the owner's calling thread's own calls only. */
static inline void loomi_engine_lock(const struct loomi_engine *e)
{
    struct loomi_progress *pt = e->pt;
    if (!pt) return;
    atomic_fetch_add_explicit(&pt->want, 1, memory_order_relaxed);
    pthread_mutex_lock(&pt->mu);
    atomic_fetch_sub_explicit(&pt->want, 1, memory_order_relaxed);
}

static inline void loomi_engine_unlock(const struct loomi_engine *e)
{
    struct loomi_progress *pt = e->pt;
    if (!pt) return;
    pthread_cond_signal(&pt->turn);
    pthread_mutex_unlock(&pt->mu);
}

/* Start running `s` (ownership passes to the op) over the given buffers;
 * progress happens in loomi_op_progress / loomi_op_wait.  inplace_backup:
 * recv buffer of an in-place operation, saved and put back on failure. */
loom_result_t loomi_op_start(struct loomi_engine *e, struct loomi_sched *s,
                             const void *sendbuf, void *recvbuf, int inplace,
                             struct loomi_op **out);
/* Block until done or failed; frees the op; returns its result. */
loom_result_t loomi_op_wait(struct loomi_op *op);
/* Run `s`, one LOOMI_STEP_SLOT (slot.c), to its end over the given
 * buffers, not in place; s stays the caller's.  When nothing else runs
 * on e, its step runs at once, on the calling thread: publish, then look
 * for the peers' words a while; if they are not all there yet (or one
 * is another call's), the engine's own slot operation, kept from call to
 * call, takes the step over where it stands and the engine drives it as
 * any operation.  Otherwise it is started and waited for as any
 * schedule.  Returns its result (the thread's last error set on a
 * failure). */
loom_result_t loomi_op_run_slot_sched(struct loomi_engine *e, const struct loomi_sched *s,
                                      const void *sendbuf, void *recvbuf);
/* Non-blocking: *done=1 and result returned (op freed) when complete. */
loom_result_t loomi_op_test(struct loomi_op *op, int *done);

/* Wait for every one of ops[0..n) (started, on one engine or several),
 * freeing each; returns the first failure.  With one engine, waiting on
 * each in turn progresses all of them; with several, each is driven in
 * turn, or one could wait on a peer that waits on another. */
loom_result_t loomi_op_wait_all(struct loomi_op **ops, size_t n);

/* Wait until one of reqs[0..n) (NULL entries skipped; at least one is
 * not; all live requests) completes, across engines: frees it, sets
 * reqs[i] to LOOM_REQUEST_NULL and *index to i, and returns its result. */
loom_result_t loomi_op_wait_any(loom_request_t *reqs, int n, int *index);

/* Requests are handles (core/handle.c) of operations: op becomes the
 * object of handle h, reserved with loomi_handle_new(LOOMI_HANDLE_REQUEST,
 * NULL) before it started; h is dropped when op is freed (waited, tested
 * done, or released by loom_comm_abort).  loomi_request_op: the
 * operation a request names, or NULL (*why says why). */
void loomi_op_set_request(struct loomi_op *op, uintptr_t h);
struct loomi_op *loomi_request_op(loom_request_t req, enum loomi_handle_state *why);

/* Stop and join the progress thread, if any (before the transport
 * goes); afterwards the engine takes no lock. */
void loomi_progress_stop(struct loomi_engine *e);

/* One pass that blocks nowhere, for a caller that needs the news before
 * it starts an operation (small.c, before a slot operation publishes):
 * running operations progress and their deadline holds, and a failure
 * seen by the control plane breaks the owner.  `transport`: the transport progresses even when no operation
 * runs (a message that came for none of this rank's may show a call that
 * a peer made otherwise).  Returns *e->error. */
loom_result_t loomi_engine_poll(struct loomi_engine *e, int transport);

/* ------------------------------------------------ straggler telemetry */

/* Per communicator, per peer: when its data arrived against this rank's
 * own start of each operation, and how fast its large receives came
 * (stats.c).  Fixed-size accumulators, updated as receives complete and
 * operations end; nothing is allocated after loomi_stats_init. */

/* Receives of at least this many bytes are timed from post to completion
 * (for the link's rate); smaller ones only count bytes. */
#define LOOMI_STATS_TIMED_BYTES 65536
/* Operations per window of the LOOM_DEBUG=info verdict. */
#define LOOMI_STATS_WINDOW 20

struct loomi_peer_acc {
    uint64_t last_no;     /* the operation whose first receive from it counted */
    uint64_t late_no;     /* the operation whose lateness from it counted */
    uint64_t ops;         /* operations with data from it */
    uint64_t late_n;      /* those whose lateness was seen (late_sum_ns's count) */
    uint64_t bytes_in;    /* every byte received from it */
    uint64_t timed_bytes; /* bytes of the timed receives (>= LOOMI_STATS_TIMED_BYTES) */
    uint64_t busy_ns;     /* time timed receives from it were outstanding (union) */
    uint64_t busy_end;    /* the last timed receive's completion */
    /* Its first data after this rank's start, in the operations where a
     * receive from it was posted at the start (one posted later, after
     * this rank's own steps, completes when it is posted if the data was
     * early, which tells nothing of the peer). */
    uint64_t late_sum_ns, late_max_ns;
    /* The current window: operations it was the latest peer of, its
     * lateness summed over the window, timed bytes and time. */
    uint32_t w_last, w_n;
    uint64_t w_late_ns, w_bytes, w_busy_ns;
};

struct loomi_stats {
    int n;                 /* ranks of the communicator */
    uint64_t opno;         /* operations counted (numbers them from 1) */
    uint64_t own_n, own_ns; /* operations ended, and this rank's wait for its latest peer */
    uint32_t w_ops;        /* operations in the current window */
    double *tmp;           /* n values: the medians of a window's verdict */
    struct loomi_peer_acc *peer; /* [n] */
};

/* Turn the telemetry on for an engine of n ranks (0, or -1 out of memory). */
int loomi_stats_init(struct loomi_engine *e, int n);
void loomi_stats_free(struct loomi_engine *e);
/* Forget everything counted so far. */
void loomi_stats_reset(struct loomi_engine *e);
/* A LOOMI_STEP_SLOT operation found every rank's word at once: every
 * peer of the host arrived with this rank (no clock is read); bytes: what
 * it read of each. */
void loomi_stats_slot_prompt(struct loomi_engine *e, int nlocal, size_t bytes);

/* Fail every running op (called when the owner breaks). */
void loomi_engine_fail_all(struct loomi_engine *e);
/* Fail and free every op, waited for or not (loom_comm_abort): the
 * application's requests of this engine become invalid. */
void loomi_engine_free_all(struct loomi_engine *e);
/* How many operations not yet waited for read or write window id (the
 * window's mappings must outlive them). */
int loomi_engine_window_users(const struct loomi_engine *e, uint64_t id);

#endif
