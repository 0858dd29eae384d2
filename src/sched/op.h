/*
 * op.h - an operation as the engine runs it (engine.c), for the files
 * that run its local steps (local.c).
 */
#ifndef LOOMI_OP_H
#define LOOMI_OP_H

#include "sched/sched.h"

struct loomi_op {
    struct loomi_engine *eng;
    unsigned char *bufs[LOOMI_NBUFS];
    unsigned char **shared; /* [s.nshared]: this host's arenas as mapped here */
    /* Operations on the shared arenas run one at a time, in the order
     * they were started (the same on every rank): each reuses the arenas
     * from offset 0.  `held` until the ones before it are done. */
    struct loomi_op *shq_next;
    int in_shq, held;
    uint32_t cap; /* steps the block's arrays hold */
    uint64_t seq;
    uint16_t *pending;
    struct loomi_xfer *xfers; /* indexed by step */
    uint8_t *posted;          /* step handed to the transport, not completed */
    uint32_t *ready, rhead, rtail;
    uint32_t ndone;
    loom_result_t status; /* first failure seen by a callback */
    int failed_peer;
    int finished;
    /* In-place safety: the caller's bytes, put back on failure. */
    void *backup;
    const void *restore_from; /* backup, or SCRATCH (scratch_has_input) */
    void *inplace_buf;
    size_t inplace_len;
    int own_scratch; /* scratch was malloc'ed for this op, not the comm's cache */
    struct loomi_op *next, *prev;           /* comm->active: still running */
    struct loomi_op *live_next, *live_prev; /* comm->live: not yet waited for */
    uintptr_t req; /* the request handle it was given as (0: none) */
    /* LOOMI_STEP_SLOT (slot.c): published and waiting for the ranks from
     * slot_next on, in slot operation slot_s. */
    int slot_wait, slot_next;
    uint64_t slot_s;
    /* Telemetry (stats.c; stat_no 0: not counted): the operation's
     * number, its start, and its latest peer so far and by how much. */
    uint64_t stat_no, t0_ns, late_ns;
    int late_peer;
    /* Last, as op_start clears all before them and copies s whole. */
    struct loomi_sched s;
    char errmsg[256]; /* the first failure's (set with status) */
};

/* A buffer id's address: the operation's own buffers or a shared arena. */
static inline unsigned char *bufp(const struct loomi_op *op, int b)
{
    return b < LOOMI_NBUFS ? op->bufs[b] : op->shared[b - LOOMI_BUF_SHARED];
}

/* A reduce, copy or avg step on at least one element. */
void loomi_op_run_local(struct loomi_op *op, const struct loomi_step *st, size_t bytes);
/* An encode or decode step; a failure fails the operation (op->status). */
loom_result_t loomi_op_run_codec(struct loomi_op *op, const struct loomi_step *st);
/* An EXPECT step found a peer running the operation otherwise: fail the
 * operation saying how. */
void loomi_op_expect_failed(struct loomi_op *op, const struct loomi_step *st);
/* A LOOMI_STEP_SLOT step, run (publish, then look for the peers' words)
 * each time the engine visits it: 1 when done, 0 while it waits on rank
 * op->slot_next, -1 when the operation failed (op->status). */
int loomi_op_run_slot(struct loomi_op *op, const struct loomi_step *st);
/* An operation kept by the engine (e->slot_op), not started with
 * op_start, whose one step ran once off the lists (ran: what
 * loomi_op_run_slot returned, 0 or -1): the engine drives it to its end
 * as any running operation, e locked; returns its result (the thread's
 * last error set on a failure).  It is not freed. */
loom_result_t loomi_op_drive_kept(struct loomi_op *op, int ran);
/* Telemetry (stats.c): number and time the start of an operation (where
 * the engine has stats); the rest only where op->stat_no is set: a
 * receive step completed; a slot step's wait moved past local ranks
 * [from, to) (the first of them the one waited for; bytes: what it reads
 * of each); the operation ended well (clears stat_no). */
void loomi_stats_op_begin(struct loomi_op *op);
void loomi_stats_recv(struct loomi_op *op, uint32_t i);
void loomi_stats_slot_seen(struct loomi_op *op, int from, int to, size_t bytes);
void loomi_stats_op_done(struct loomi_op *op);

/* A failed saves_input operation: put back what its started steps wrote. */
void loomi_op_restore_written(struct loomi_op *op);

#endif
