/*
 * engine.c - runs schedules.
 *
 * Every step whose dependencies are done is "ready".  Ready sends and
 * receives are handed to the transport at once (so every chunk that can
 * be in flight is), ready local steps (reduce, copy, avg) run inline.
 * Completions arrive from the transport's progress(); they only mark
 * steps done and release successors, so the transport is never re-entered
 * from its own callbacks.  Failures are likewise recorded in callbacks and
 * acted on (cancel, restore, tell peers) after progress() returns.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "core/hostmap.h"
#include "sched/op.h"
#include "sched/sched.h"

/* A schedule's signature in its tags (transport.h), opaque here: the
 * owner's two 4-bit numbers (coll1, algo), named by e->name_sig. */
static unsigned sched_sig(const struct loomi_sched *s)
{
    return (unsigned)(s->coll1 & 15) << 4 | (unsigned)(s->algo & 15);
}

/* Break the owner (hooks.fail) with a formatted message. */
__attribute__((format(printf, 4, 5))) static void engine_fail(struct loomi_engine *e,
                                                              loom_result_t code, int peer,
                                                              const char *fmt, ...)
{
    char msg[512];
    LOOMI_VFORMAT(msg, fmt);
    e->hooks->fail(e, code, peer, msg);
}

void loomi_engine_bind(struct loomi_engine *e, void *owner, const struct loomi_engine_hooks *hooks,
                       const int *rank, struct loomi_settings *set, const loom_result_t *error,
                       const char *errmsg, struct loomi_hostmap *const *hosts,
                       struct loomi_ctrl *const *ctrl, loomi_sig_namer name_sig)
{
    e->owner = owner;
    e->hooks = hooks;
    e->rank = rank;
    e->set = set;
    e->error = error;
    e->errmsg = errmsg;
    e->hosts = hosts;
    e->ctrl = ctrl;
    e->name_sig = name_sig;
}

void loomi_engine_release(struct loomi_engine *e)
{
    free(e->spare_op);
    e->spare_op = NULL;
    free(e->slot_op);
    e->slot_op = NULL;
    free(e->slot_map);
    e->slot_map = NULL;
    e->slot_nmap = 0;
    loomi_stats_free(e);
    free(e->scratch);
    free(e->backup);
    e->scratch = e->backup = NULL;
    e->scratch_len = e->backup_len = 0;
}

/* ---------------------------------------------------------------- lists */

static void active_add(struct loomi_engine *e, struct loomi_op *op)
{
    op->prev = NULL;
    op->next = e->active;
    if (e->active) e->active->prev = op;
    e->active = op;
    e->nactive++;
}

/* Leave the queue of shared-arena operations, letting the next one run. */
static void shq_remove(struct loomi_engine *e, struct loomi_op *op)
{
    struct loomi_op **l = (struct loomi_op **)&e->shq_head;
    while (*l && *l != op) l = &(*l)->shq_next;
    if (*l) *l = op->shq_next;
    op->in_shq = 0;
    op->shq_next = NULL;
    struct loomi_op *head = e->shq_head;
    if (head && head->held) {
        head->held = 0;
        e->shq_kick = 1; /* engine_advance must visit it before anything sleeps */
    }
}

static void active_remove(struct loomi_engine *e, struct loomi_op *op)
{
    if (op->in_shq) shq_remove(e, op);
    if (op->prev) op->prev->next = op->next;
    else if (e->active == op) e->active = op->next;
    else return; /* not listed */
    if (op->next) op->next->prev = op->prev;
    op->next = op->prev = NULL;
    e->nactive--;
}

/* -------------------------------------------------------- step handling */

static void push_ready(struct loomi_op *op, uint32_t i) { op->ready[op->rtail++] = i; }

static void step_done(struct loomi_op *op, uint32_t i)
{
    const struct loomi_sched *s = &op->s;
    op->ndone++;
    for (uint32_t k = s->succ_start[i]; k < s->succ_start[i + 1]; k++) {
        uint32_t j = s->succ[k];
        if (--op->pending[j] == 0) push_ready(op, j);
    }
}

/* The first failure of a send or receive step: it fails the operation
 * (acted on after progress returns) and names the peer. */
static void step_failed(struct loomi_op *op, uint32_t i, loom_result_t code, const char *what)
{
    const struct loomi_step *st = &op->s.steps[i];
    if (op->status != LOOM_SUCCESS) return;
    op->status = code;
    op->failed_peer = st->peer;
    /* A length mismatch is reported as it happens, so the thread's last
     * error still says what did not match. */
    snprintf(op->errmsg, sizeof op->errmsg, "%s %s rank %d failed%s%s", what,
             st->kind == LOOMI_STEP_SEND ? "send to" : "receive from", st->peer,
             code == LOOM_ERR_MISMATCH ? ": " : "",
             code == LOOM_ERR_MISMATCH ? loom_get_last_error() : "");
}

static void xfer_complete(struct loomi_xfer *x, loom_result_t status)
{
    struct loomi_op *op = x->owner;
    uint32_t i = (uint32_t)(x - op->xfers);
    op->posted[i] = 0;
    op->eng->xfer_events++;
    if (status != LOOM_SUCCESS) {
        step_failed(op, i, status, "the");
        return;
    }
    op->eng->progressed = 1; /* the clock is read when the deadline is checked */
    if (op->stat_no) loomi_stats_recv(op, i);
    step_done(op, i);
}

/* A point-to-point transfer with this very rank: pair it with the oldest
 * opposite one of the same tag, or queue it.  Completions run at once;
 * they only mark steps done. */
static loom_result_t self_post(struct loomi_engine *e, struct loomi_xfer *x, int is_send)
{
    struct loomi_xfer **l = &e->self_q[!is_send];
    while (*l && (*l)->tag != x->tag) l = &(*l)->t_next;
    struct loomi_xfer *y = *l;
    if (!y) {
        struct loomi_xfer **end = &e->self_q[is_send];
        while (*end) end = &(*end)->t_next;
        x->t_next = NULL;
        *end = x;
        return LOOM_SUCCESS;
    }
    *l = y->t_next;
    struct loomi_xfer *snd = is_send ? x : y, *rcv = is_send ? y : x;
    loom_result_t r = LOOM_SUCCESS;
    if (snd->len != rcv->len)
        r = loomi_fail(LOOM_ERR_MISMATCH, *e->rank,
                       "a send of %zu bytes to this rank itself met a receive of %zu bytes",
                       snd->len, rcv->len);
    else if (snd->len && rcv->buf != snd->buf)
        memmove(rcv->buf, snd->buf, snd->len);
    y->complete(y, r);
    x->complete(x, r);
    return LOOM_SUCCESS;
}

static void self_cancel(struct loomi_engine *e, struct loomi_xfer *x)
{
    for (int k = 0; k < 2; k++)
        for (struct loomi_xfer **l = &e->self_q[k]; *l; l = &(*l)->t_next)
            if (*l == x) {
                *l = x->t_next;
                return;
            }
}

static int is_send_step(const struct loomi_step *st)
{
    return st->kind == LOOMI_STEP_SEND;
}

/* Run ready steps until none is left. */
static void op_run_ready(struct loomi_op *op)
{
    struct loomi_engine *e = op->eng;
    const struct loomi_sched *s = &op->s;
    if (op->held) return;
    /* Nothing runs once the communicator failed: the transport may have
     * given up what the steps read (a peer's arena) on its way down. */
    while (op->rhead < op->rtail && op->status == LOOM_SUCCESS && *e->error == LOOM_SUCCESS) {
        uint32_t i = op->ready[op->rhead++];
        const struct loomi_step *st = &s->steps[i];
        size_t bytes = st->count * s->esize;
        switch (st->kind) {
        case LOOMI_STEP_SEND:
        case LOOMI_STEP_RECV: {
            struct loomi_xfer *x = &op->xfers[i];
            memset(x, 0, sizeof *x);
            x->peer = st->peer;
            x->tag = s->p2p ? LOOMI_TAG_P2P | st->tag : loomi_tag_coll(op->seq, sched_sig(s), st->tag);
            x->chk = s->p2p ? 0 : s->chk;
            x->len = bytes;
            x->complete = xfer_complete;
            x->owner = op;
            x->dev = s->dev && (is_send_step(st) ? st->src : st->dst) < LOOMI_BUF_SCRATCH;
            op->posted[i] = 1;
            loom_result_t r;
            /* Zero-length messages (barriers) may name a buffer that is
             * NULL: give the transport an address it may pass to memcpy. */
            static unsigned char no_bytes[1];
            int is_send = st->kind == LOOMI_STEP_SEND;
            if (is_send)
                x->buf = bytes ? bufp(op, st->src) + st->src_off : no_bytes;
            else {
                x->buf = bytes ? bufp(op, st->dst) + st->dst_off : no_bytes;
                /* Telemetry: posted at the start, depending on no step
                 * (its completion is when the peer's data came), or
                 * timed for the link's rate. */
                if (op->stat_no)
                    x->post_ns = !s->ndeps[i] ? op->t0_ns
                                 : bytes >= LOOMI_STATS_TIMED_BYTES ? loomi_now_ns() : 0;
            }
            if (st->peer == *e->rank)
                r = self_post(e, x, is_send);
            else
                r = is_send ? e->tops->isend(e->tstate, x) : e->tops->irecv(e->tstate, x);
            if (r != LOOM_SUCCESS) {
                op->posted[i] = 0;
                step_failed(op, i, r, "posting the");
            }
            break;
        }
        case LOOMI_STEP_REDUCE_SHARED:
            if ((st->flags & LOOMI_RS_PUSH) && st->count) {
                /* Writes into the peers' windows: not into one whose
                 * owner has failed this operation (window.c).  The step
                 * then waits, unrun, for the news of the failure, which
                 * that rank has sent: it names the rank that caused it. */
                if (e->hooks->window_push_begin(e, s->win_id) >= 0) {
                    op->rhead--;
                    return;
                }
                loomi_op_run_local(op, st, bytes);
                e->hooks->window_push_end(e, s->win_id);
                step_done(op, i);
                break;
            }
            /* fall through */
        case LOOMI_STEP_REDUCE:
        case LOOMI_STEP_COPY:
        case LOOMI_STEP_AVG:
            if (st->count) loomi_op_run_local(op, st, bytes);
            step_done(op, i);
            break;
        case LOOMI_STEP_ENCODE:
        case LOOMI_STEP_DECODE:
        case LOOMI_STEP_DECODE_ACC:
            if (st->count && loomi_op_run_codec(op, st) != LOOM_SUCCESS) break;
            step_done(op, i);
            break;
        case LOOMI_STEP_SLOT: {
            /* Publishes on its first visit, then looks for the peers'
             * words a while on each: it stays at the head of the ready
             * list until they are all there (slot.c). */
            int k = loomi_op_run_slot(op, st);
            if (k > 0) step_done(op, i);
            else if (k == 0) {
                op->rhead--;
                return;
            }
            break;
        }
        case LOOMI_STEP_EXPECT:
            if (bytes && memcmp(bufp(op, st->src) + st->src_off, bufp(op, st->src2) + st->src2_off,
                                bytes) != 0) {
                loomi_op_expect_failed(op, st);
                break;
            }
            step_done(op, i);
            break;
        }
    }
}

/* ------------------------------------------------------------ lifecycle */

static void op_release_buffers(struct loomi_op *op)
{
    struct loomi_engine *e = op->eng;
    if (op->own_scratch) free(op->bufs[LOOMI_BUF_SCRATCH]);
    else if (op->bufs[LOOMI_BUF_SCRATCH]) e->scratch_busy = 0;
    op->bufs[LOOMI_BUF_SCRATCH] = NULL;
    if (op->backup) {
        if (op->backup == e->backup) e->backup_busy = 0;
        else free(op->backup);
        op->backup = NULL;
    }
}

static void op_finish(struct loomi_op *op)
{
    struct loomi_engine *e = op->eng;
    if (op->finished) return;
    op->finished = 1;
    if (op->status != LOOM_SUCCESS) {
        /* Withdraw what the transport still holds before the memory goes. */
        for (uint32_t i = 0; i < op->s.nsteps; i++)
            if (op->posted[i]) {
                if (op->xfers[i].peer == *e->rank) self_cancel(e, &op->xfers[i]);
                else e->tops->cancel(e->tstate, &op->xfers[i]);
                op->posted[i] = 0;
            }
        /* Peers write into this rank's window (out of place on one
         * host): none may once the call returns. */
        for (uint32_t i = 0; op->s.win_id && i < op->s.nsteps; i++)
            if (op->s.steps[i].kind == LOOMI_STEP_REDUCE_SHARED &&
                (op->s.steps[i].flags & LOOMI_RS_PUSH)) {
                int left = e->hooks->window_close(e, op->s.win_id,
                                                  loomi_now_ms() + e->set->timeout_ms);
                if (left)
                    LOOMI_WARN(*e->rank,
                               "%d peer(s) still writing into window %llu at the deadline",
                               left, (unsigned long long)op->s.win_id);
                break;
            }
        if (op->s.saves_input && !op->backup && op->inplace_buf && op->bufs[LOOMI_BUF_SCRATCH])
            loomi_op_restore_written(op);
        else if (op->restore_from && op->inplace_buf)
            memcpy(op->inplace_buf, op->restore_from, op->inplace_len);
    }
    /* Error feedback: what this operation encoded counts only if it
     * completed (a retry after a failure must not count it twice). */
    if (op->s.ef_state) {
        if (op->status == LOOM_SUCCESS) loom_codec_state_commit(op->s.ef_state, op->s.ef_key);
        else loom_codec_state_rollback(op->s.ef_state, op->s.ef_key);
    }
    if (op->stat_no && op->status == LOOM_SUCCESS) loomi_stats_op_done(op);
    op_release_buffers(op);
    active_remove(e, op);
}

static void op_free(struct loomi_op *op)
{
    struct loomi_engine *e = op->eng;
    if (op->req) loomi_handle_drop(LOOMI_HANDLE_REQUEST, op->req);
    op->req = 0;
    if (op->live_prev) op->live_prev->live_next = op->live_next;
    else if (e->live == op) e->live = op->live_next;
    if (op->live_next) op->live_next->live_prev = op->live_prev;
    e->nlive--;
    if (!op->s.borrowed) loomi_sched_free(&op->s); /* a borrowed one is the cache's */
    free(op->shared);
    op->shared = NULL;
    if (!e->spare_op && op->cap <= 256) e->spare_op = op;
    else free(op);
}

/* Find this host's shared arenas for a schedule that names them. */
static loom_result_t map_shared(struct loomi_op *op)
{
    struct loomi_engine *e = op->eng;
    const struct loomi_hostmap *m = *e->hosts;
    const int n = op->s.nshared;
    if (!m || !e->tops->shared_map)
        return loomi_fail(LOOM_ERR_UNSUPPORTED, *e->rank,
                          "engine: the schedule uses shared memory, which transport %s lacks",
                          e->tops->name);
    const int h = m->host_of[*e->rank];
    if (n > loomi_host_size(m, h))
        return loomi_fail(LOOM_ERR_INTERNAL, *e->rank,
                          "engine: the schedule names %d shared arenas, the host has %d ranks", n,
                          loomi_host_size(m, h));
    op->shared = malloc((size_t)n * sizeof *op->shared);
    if (!op->shared) return loomi_fail(LOOM_ERR_NO_MEMORY, *e->rank, "engine: out of memory");
    if (op->s.win_id) {
        /* The schedule reads the host's mappings of a window instead. */
        size_t len = 0;
        if (e->hooks->window_map(e, op->s.win_id, op->shared, n, &len) != n ||
            len < op->s.shared_bytes)
            return loomi_fail(LOOM_ERR_INVALID_USAGE, *e->rank,
                              "engine: window %llu is gone or smaller than %zu bytes (freed "
                              "while an operation used it?)",
                              (unsigned long long)op->s.win_id, op->s.shared_bytes);
        return LOOM_SUCCESS;
    }
    for (int i = 0; i < n; i++) {
        int q = m->host_ranks[m->host_start[h] + i];
        size_t len = 0;
        op->shared[i] = e->tops->shared_map(e->tstate, q, &len);
        if (!op->shared[i] || len < op->s.shared_bytes)
            return loomi_fail(LOOM_ERR_UNSUPPORTED, *e->rank,
                              "engine: no shared arena of %zu bytes for rank %d (has %zu)",
                              op->s.shared_bytes, q, op->shared[i] ? len : 0);
    }
    return LOOM_SUCCESS;
}

/* Buffers reused across operations: most jobs run one collective at a
 * time, and fresh large allocations would page-fault on every call. */
static void *comm_buffer(void **cache, size_t *cache_len, int *busy, size_t len,
                         int *own)
{
    *own = 0;
    if (!*busy) {
        if (*cache_len < len) {
            void *p = loomi_big_alloc(len);
            if (!p) return NULL;
            free(*cache);
            *cache = p;
            *cache_len = len;
        }
        *busy = 1;
        return *cache;
    }
    *own = 1;
    return loomi_big_alloc(len);
}

static loom_result_t op_start(struct loomi_engine *e, struct loomi_sched *s,
                              const void *sendbuf, void *recvbuf, int inplace,
                              struct loomi_op **out)
{
    loom_result_t r = loomi_sched_finish(s);
    if (r != LOOM_SUCCESS) {
        loomi_sched_free(s);
        return r;
    }
    /* Device buffers (GPUDirect): only what touches them through the
     * transport or the driver; the owner chooses such schedules only. */
    for (uint32_t i = 0; s->dev && i < s->nsteps; i++) {
        const int k = s->steps[i].kind;
        if (inplace || s->nshared ||
            (k != LOOMI_STEP_SEND && k != LOOMI_STEP_RECV && k != LOOMI_STEP_COPY)) {
            loomi_sched_free(s);
            return loomi_fail(LOOM_ERR_INTERNAL, *e->rank,
                              "engine: a schedule on device buffers has a host step (kind %d%s)",
                              k, inplace ? ", in place" : "");
        }
    }
    /* The operation and its per-step arrays in one block; the last block
     * freed is kept for the next operation that fits in it, so a stream of
     * small operations allocates nothing. */
    uint32_t n = s->nsteps, cap = n ? n : 1;
    struct loomi_op *op = NULL;
    if (e->spare_op && e->spare_op->cap >= cap) {
        op = e->spare_op;
        e->spare_op = NULL;
        cap = op->cap;
    } else {
        size_t bytes = sizeof *op + cap * (sizeof *op->xfers + sizeof *op->pending +
                                           sizeof *op->ready + 1);
        op = malloc(bytes);
        if (!op) {
            loomi_sched_free(s);
            return loomi_fail(LOOM_ERR_NO_MEMORY, *e->rank, "engine: out of memory");
        }
    }
    /* Everything before the schedule (copied whole below) and the
     * message (empty until a failure) starts cleared. */
    memset(op, 0, offsetof(struct loomi_op, s));
    op->errmsg[0] = 0;
    op->cap = cap;
    /* xfers first: struct loomi_xfer needs the strictest alignment. */
    op->xfers = (struct loomi_xfer *)(op + 1);
    op->ready = (uint32_t *)(op->xfers + cap);
    op->pending = (uint16_t *)(op->ready + cap);
    op->posted = (uint8_t *)(op->pending + cap);
    memset(op->posted, 0, cap);
    op->eng = e;
    op->failed_peer = -1;
    op->s = *s;
    /* The op owns it now (a borrowed one, a copy of the cache's, owns
     * nothing: no need to clear it). */
    if (!s->borrowed) memset(s, 0, sizeof *s);
    op->bufs[LOOMI_BUF_SEND] = (unsigned char *)(uintptr_t)sendbuf;
    op->bufs[LOOMI_BUF_RECV] = recvbuf;
    if (op->s.nshared && (r = map_shared(op)) != LOOM_SUCCESS) goto fail_op;
    size_t sl = op->s.buf_bytes[LOOMI_BUF_SCRATCH];
    if (sl) {
        op->bufs[LOOMI_BUF_SCRATCH] =
            comm_buffer(&e->scratch, &e->scratch_len, &e->scratch_busy, sl, &op->own_scratch);
        if (!op->bufs[LOOMI_BUF_SCRATCH]) goto nomem;
        if (op->s.desc_len)
            memcpy(op->bufs[LOOMI_BUF_SCRATCH] + op->s.desc_off, op->s.desc, op->s.desc_len);
    }
    if (inplace && op->s.buf_bytes[LOOMI_BUF_RECV]) {
        op->inplace_len = op->s.buf_bytes[LOOMI_BUF_RECV];
        if (op->s.saves_input && sl >= op->inplace_len) {
            /* Nothing to copy now: the schedule saves as it goes. */
        } else if (op->s.scratch_has_input && sl >= op->inplace_len) {
            memcpy(op->bufs[LOOMI_BUF_SCRATCH], recvbuf, op->inplace_len);
            op->restore_from = op->bufs[LOOMI_BUF_SCRATCH];
        } else {
            int own;
            op->backup = comm_buffer(&e->backup, &e->backup_len, &e->backup_busy,
                                     op->inplace_len, &own);
            if (!op->backup) goto nomem;
            memcpy(op->backup, recvbuf, op->inplace_len);
            op->restore_from = op->backup;
        }
        op->inplace_buf = recvbuf;
    }
    if (!op->s.p2p) op->seq = op->s.call;
    if (e->stats && !op->s.p2p) loomi_stats_op_begin(op); /* collectives only */
    /* The deadline counts from the last progress of the communicator,
     * or from now when nothing was running. */
    if (!e->nactive) e->progressed = 1;
    for (uint32_t i = 0; i < n; i++) {
        op->pending[i] = op->s.ndeps[i];
        if (!op->pending[i]) push_ready(op, i);
    }
    if (op->s.nshared) {
        struct loomi_op **l = (struct loomi_op **)&e->shq_head;
        while (*l) l = &(*l)->shq_next;
        *l = op;
        op->in_shq = 1;
        op->held = e->shq_head != op;
    }
    active_add(e, op);
    op->live_next = e->live;
    if (e->live) e->live->live_prev = op;
    e->live = op;
    e->nlive++;
    if (n == 0) op_finish(op);
    else op_run_ready(op);
    if (op->ndone == n && op->status == LOOM_SUCCESS) op_finish(op);
    *out = op;
    return LOOM_SUCCESS;
nomem:
    r = loomi_fail(LOOM_ERR_NO_MEMORY, *e->rank, "engine: out of memory for a schedule");
fail_op:
    op_release_buffers(op);
    op->live_next = e->live; /* op_free unlinks it */
    if (e->live) e->live->live_prev = op;
    e->live = op;
    e->nlive++;
    op_free(op);
    return r;
}

static void progress_start(struct loomi_engine *e);
static void progress_wake(struct loomi_progress *pt);

loom_result_t loomi_op_start(struct loomi_engine *e, struct loomi_sched *s,
                             const void *sendbuf, void *recvbuf, int inplace,
                             struct loomi_op **out)
{
    if (e->set->progress_thread && !e->pt) progress_start(e);
    loomi_engine_lock(e);
    loom_result_t r = op_start(e, s, sendbuf, recvbuf, inplace, out);
    /* A sleeping thread looks at the new operation (its sends may wait
     * for room, its receives for data). */
    if (e->pt && e->pt->sleeping && e->active) progress_wake(e->pt);
    loomi_engine_unlock(e);
    return r;
}

/* After progress: run what became ready, finish what completed, and turn
 * any failure into a broken communicator. */
static void engine_advance(struct loomi_engine *e)
{
    struct loomi_op *op, *next;
again:
    e->shq_kick = 0;
    for (op = e->active; op && *e->error == LOOM_SUCCESS; op = next) {
        next = op->next;
        op_run_ready(op);
        if (op->status != LOOM_SUCCESS) {
            if (*e->error == LOOM_SUCCESS)
                engine_fail(e, op->status, op->failed_peer, "%s", op->errmsg);
        } else if (op->ndone == op->s.nsteps) {
            op_finish(op);
        }
    }
    /* An operation released from the shared-arena queue during this pass
     * may sit earlier in the list: run it now, not after a sleep. */
    if (e->shq_kick && *e->error == LOOM_SUCCESS) goto again;
    if (*e->error != LOOM_SUCCESS) loomi_engine_fail_all(e);
}

void loomi_engine_free_all(struct loomi_engine *e)
{
    loomi_engine_fail_all(e);
    while (e->live) op_free(e->live);
}

int loomi_engine_window_users(const struct loomi_engine *e, uint64_t id)
{
    int k = 0;
    for (const struct loomi_op *op = e->live; op; op = op->live_next) k += op->s.win_id == id;
    return k;
}

void loomi_engine_fail_all(struct loomi_engine *e)
{
    struct loomi_op *op;
    loomi_engine_lock(e);
    while ((op = e->active) != NULL) {
        /* Ranks whose calls differ: every collective fails for that, not
         * for what followed (peers that aborted, transfers refused). */
        if (op->status == LOOM_SUCCESS || (*e->error == LOOM_ERR_MISMATCH && !op->s.p2p)) {
            op->status = *e->error;
            snprintf(op->errmsg, sizeof op->errmsg, "%s", e->errmsg);
        } else if (e->errmsg[0]) {
            /* The communicator's message names the failed peer (this op's
             * own may only name the neighbour that passed the news on). */
            snprintf(op->errmsg, sizeof op->errmsg, "%s", e->errmsg);
        }
        op_finish(op);
    }
    loomi_engine_unlock(e);
}

/* Milliseconds until the no-progress deadline of the running operations. */
static int ms_to_deadline(struct loomi_engine *e)
{
    if (e->progressed) {
        e->progressed = 0;
        e->last_progress_ms = loomi_now_ms();
    }
    return loomi_ms_left(e->last_progress_ms + (uint64_t)e->set->timeout_ms);
}

/* The peer a stalled communicator waits on: the source of a receive still
 * posted, else the destination of a send (-1 when none).  A guess: only
 * heartbeats can tell a silent rank from one stalled behind it. */
static int silent_peer(const struct loomi_engine *e)
{
    int send_peer = -1;
    for (const struct loomi_op *op = e->active; op; op = op->next) {
        if (op->slot_wait) return op->slot_next;
        for (uint32_t i = 0; i < op->s.nsteps; i++) {
            if (!op->posted[i]) continue;
            if (op->s.steps[i].kind == LOOMI_STEP_RECV) return op->s.steps[i].peer;
            if (send_peer < 0) send_peer = op->s.steps[i].peer;
        }
    }
    return send_peer;
}

/* Nothing has moved for LOOMI_CALL_STALL_MS: ask the peers each
 * operation waits on whether they made its call as this rank did (a peer
 * in another call may never send what this one waits for), once per
 * stall (calls.h). */
static void check_stall(struct loomi_engine *e)
{
    if (!*e->ctrl || *e->error != LOOM_SUCCESS || e->stall_probed_ms == e->last_progress_ms ||
        loomi_now_ms() - e->last_progress_ms < LOOMI_CALL_STALL_MS)
        return;
    e->stall_probed_ms = e->last_progress_ms;
    for (const struct loomi_op *op = e->active; op; op = op->next) {
        if (op->s.p2p || !op->s.call) continue;
        int peers[16], np = 0;
        /* In the slots: the first rank whose word is not there yet. */
        if (op->slot_wait) peers[np++] = op->slot_next;
        for (uint32_t i = 0; i < op->s.nsteps && np < 16; i++) {
            if (!op->posted[i]) continue;
            int q = op->s.steps[i].peer, seen = 0;
            for (int k = 0; k < np; k++) seen |= peers[k] == q;
            if (!seen) peers[np++] = q;
        }
        if (np) e->hooks->calls_probe(e, op->s.call, peers, np);
    }
}

/* Running operations fail when the communicator has moved nothing for
 * timeout_ms. */
static void check_deadline(struct loomi_engine *e)
{
    if (!e->active) return;
    const int left = ms_to_deadline(e);
    /* Probes from ranks stalled in a call: is it the one this rank made? */
    if (*e->ctrl && *e->error == LOOM_SUCCESS) e->hooks->calls_poll(e);
    check_stall(e);
    if (left != 0 || !e->active || *e->error != LOOM_SUCCESS) return;
    const struct loomi_op *op = e->active;
    int suspect = silent_peer(e);
    const struct loomi_op *head = e->shq_head;
    char held[96] = "", what[64] = "";
    const unsigned sig = sched_sig(&op->s);
    if (sig && e->name_sig) {
        what[0] = ' ';
        e->name_sig(sig, what + 1, sizeof what - 1);
    }
    if (op->held && head)
        snprintf(held, sizeof held, " (waiting for operation %llu, %u of %u steps done, "
                 "to release the shared arenas)",
                 (unsigned long long)head->seq, head->ndone, head->s.nsteps);
    else if (op->slot_wait)
        snprintf(held, sizeof held, " (a small collective through the shared arenas' slots)");
    engine_fail(e, LOOM_ERR_TIMEOUT, suspect,
                    "no progress for %d ms (LOOM_TIMEOUT) with %d operation(s) running, "
                    "waiting on rank %d; operation %llu%s had %u of %u steps done%s",
                    e->set->timeout_ms, e->nactive, suspect, (unsigned long long)op->seq, what,
                    op->ndone, op->s.nsteps, held);
    loomi_engine_fail_all(e);
}

/* One round: progress the transport for at most wait_ms, then advance and
 * enforce the deadline. */
static void engine_round(struct loomi_engine *e, int wait_ms)
{
    /* A revocation comes from the control plane's thread: look for it
     * between short sleeps, not only when the data plane wakes us. */
    if (*e->ctrl) {
        if (wait_ms > LOOMI_CTRL_POLL_MS) wait_ms = LOOMI_CTRL_POLL_MS;
        /* Early in a stall, look at the control plane often: a peer in
         * another call asks (or answers) there (calls.h). */
        if (wait_ms > LOOMI_CALL_ANSWER_POLL_MS &&
            loomi_now_ms() - e->last_progress_ms < LOOMI_CALL_ANSWER_MS)
            wait_ms = LOOMI_CALL_ANSWER_POLL_MS;
        if (*e->error == LOOM_SUCCESS && e->hooks->revoke_pending(e)) {
            /* What the peers sent before they revoked still counts: an
             * operation whose messages are all here completes. */
            if (e->tops->progress(e->tstate, 0) == LOOM_SUCCESS) engine_advance(e);
        }
        if (*e->error == LOOM_SUCCESS && e->hooks->sync(e) != LOOM_SUCCESS) {
            loomi_engine_fail_all(e);
            return;
        }
    }
    loom_result_t r = e->tops->progress(e->tstate, wait_ms);
    if (r != LOOM_SUCCESS && *e->error == LOOM_SUCCESS)
        engine_fail(e, r, -1, "transport %s failed: %s", e->tops->name,
                        loom_get_last_error());
    engine_advance(e);
    /* Reading the clock costs as much as a poll: polls check the deadline
     * only now and then (it is counted in milliseconds anyway). */
    if (e->active && (wait_ms > 0 || ++e->rounds % 64 == 0)) check_deadline(e);
}

loom_result_t loomi_engine_poll(struct loomi_engine *e, int transport)
{
    if (e->active || (transport && *e->error == LOOM_SUCCESS)) engine_round(e, 0);
    else if (*e->ctrl && *e->error == LOOM_SUCCESS) e->hooks->sync(e);
    return *e->error;
}

/* A finished operation's result, the thread's last error set from it. */
static loom_result_t op_status(struct loomi_op *op)
{
    loom_result_t r = op->status;
    struct loomi_engine *e = op->eng;
    if (r == LOOM_ERR_MISMATCH && !op->s.p2p) {
        /* Which rank's call differs: the others say (calls.h). */
        if (e->hooks->calls_verdict(e)) snprintf(op->errmsg, sizeof op->errmsg, "%s", e->errmsg);
    }
    if (r != LOOM_SUCCESS)
        loomi_fail(r, *op->eng->rank, "%s", op->errmsg[0] ? op->errmsg : loom_strerror(r));
    return r;
}

static loom_result_t op_result(struct loomi_op *op)
{
    loom_result_t r = op_status(op);
    op_free(op);
    return r;
}

static int any_finished(struct loomi_op *const *ops, int n)
{
    for (int i = 0; i < n; i++)
        if (ops[i] && ops[i]->finished) return 1;
    return 0;
}

/* Drive e (locked) until op, waiting in the slots (slot.c), is finished.
 * Each visit of its step looks at the peers' words a while; between
 * visits, the other operations progress, the control plane is heard,
 * the deadline holds and a stalled peer is probed (check_deadline), but
 * the transport is polled for the slot operation alone only once
 * nothing has arrived for a millisecond (a message there may show that
 * a peer made the call otherwise): the slots' words are the critical
 * path.  Past spin_us the wait naps between visits (a rank still
 * computing), as the slots have nothing to sleep on. */
static void drive_slot(struct loomi_engine *e, struct loomi_op *op)
{
    uint64_t t0 = 0, seen = 0; /* ns: the wait began; a peer's word last arrived */
    int next = op->slot_next;
    for (unsigned visits = 1; !op->finished; visits++) {
        engine_advance(e);
        /* A turn every few visits, the deadline every few turns: the
         * clock costs more than a look. */
        if (op->finished || visits % 8) continue;
        const uint64_t now = loomi_now_ns();
        if (!t0) t0 = seen = now;
        if (op->slot_next != next) {
            next = op->slot_next;
            seen = now;
        }
        if (e->nactive > 1 || now - seen >= 1000000u) {
            engine_round(e, 0);
        } else if (*e->ctrl && *e->error == LOOM_SUCCESS && e->hooks->sync(e) != LOOM_SUCCESS) {
            loomi_engine_fail_all(e);
            break;
        }
        if (visits % 64 == 0) check_deadline(e);
        if (!op->finished && now - t0 >= (uint64_t)e->set->spin_us * 1000u) {
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
        }
    }
}

/* Drive e (locked) until op is finished or, op NULL, one of ops (all of
 * e): progress is op's steps done, or with ops any transfer completed.
 * Inlined into both callers, so each keeps its own tight polling loop. */
static inline __attribute__((always_inline)) void drive(struct loomi_engine *e,
                                                        struct loomi_op *op,
                                                        struct loomi_op *const *ops, int n)
{
#define DRIVE_DONE() (op ? op->finished : any_finished(ops, n))
    while (!DRIVE_DONE()) {
        /* Work or a failure may already be pending (a send that failed
         * while it was posted): act on it before sleeping on sockets that
         * may all be closed by now. */
        engine_advance(e);
        if (DRIVE_DONE()) break;
        if (op && op->slot_wait) {
            drive_slot(e, op);
            break;
        }
        /* Poll without sleeping for up to spin_us after the last progress:
         * a sleep and wake-up costs more than the wait when cores are free. */
        if (e->set->spin_us) {
            uint64_t t0 = 0; /* when the current idle stretch began; 0: unknown */
            unsigned idle = 0;
            while (!DRIVE_DONE()) {
                uint64_t before = op ? op->ndone : e->xfer_events;
                engine_round(e, 0);
                if ((op ? op->ndone : e->xfer_events) != before) {
                    idle = 0;
                    t0 = 0;
                    continue;
                }
                /* Give the core away between polls when ranks share cores
                 * (the peer we wait for may need this one); otherwise
                 * only now and then.  The clock is read every few idle
                 * polls: it costs as much as a poll. */
                if (e->oversubscribed || idle % 64 == 63) sched_yield();
                if (++idle % 8 == 0) {
                    uint64_t now = loomi_now_ns();
                    if (!t0) t0 = now;
                    else if (now - t0 >= (uint64_t)e->set->spin_us * 1000u) break;
                }
            }
            if (DRIVE_DONE()) break;
        }
        engine_round(e, ms_to_deadline(e));
    }
#undef DRIVE_DONE
}

static loom_result_t op_wait(struct loomi_op *op)
{
    drive(op->eng, op, NULL, 0);
    return op_result(op);
}

/* With a progress thread, the waiting caller drives the engine itself
 * (holding the lock, so the thread stays parked): no hand-off on the
 * critical path, and the same spin-then-sleep as without the thread. */
loom_result_t loomi_op_wait(struct loomi_op *op)
{
    struct loomi_engine *e = op->eng;
    loomi_engine_lock(e);
    loom_result_t r = op_wait(op);
    loomi_engine_unlock(e);
    return r;
}

loom_result_t loomi_op_drive_kept(struct loomi_op *op, int ran)
{
    struct loomi_engine *e = op->eng;
    if (ran == 0) op->rhead = 0; /* its step runs again */
    e->progressed = 1;           /* nothing else runs: the deadline counts from now */
    active_add(e, op);
    drive(e, op, NULL, 0);
    return op_status(op);
}

loom_result_t loomi_op_test(struct loomi_op *op, int *done)
{
    struct loomi_engine *e = op->eng;
    loomi_engine_lock(e);
    if (!op->finished) engine_advance(e);
    if (!op->finished) engine_round(e, 0);
    loom_result_t r = LOOM_SUCCESS;
    *done = op->finished;
    if (op->finished) r = op_result(op);
    loomi_engine_unlock(e);
    return r;
}


void loomi_op_set_request(struct loomi_op *op, uintptr_t h)
{
    op->req = h;
    loomi_handle_set(LOOMI_HANDLE_REQUEST, h, op);
}

struct loomi_op *loomi_request_op(loom_request_t req, enum loomi_handle_state *why)
{
    return loomi_handle_get(LOOMI_HANDLE_REQUEST, (uintptr_t)req, why);
}

/* ------------------------------------------------------- wait for any */

/* Drive c (locked) until one of ops (all of c) is finished. */
static void wait_some(struct loomi_engine *e, struct loomi_op *const *ops, int n)
{
    drive(e, NULL, ops, n);
}

/* Is ops[i] finished?  Drives its communicator one round first if not. */
static int test_one(struct loomi_op *op)
{
    struct loomi_engine *e = op->eng;
    loomi_engine_lock(e);
    if (!op->finished) engine_advance(e);
    if (!op->finished) engine_round(e, 0);
    int f = op->finished;
    loomi_engine_unlock(e);
    return f;
}

/* Sleep until a transport of the operations ops[0..n) (NULL entries
 * skipped; several engines) has work: short, since a transport without
 * a descriptor can only be polled.  pf: room for n descriptors (NULL:
 * nap). */
static void sleep_on_engines(struct loomi_op *const *ops, size_t n, struct pollfd *pf)
{
    nfds_t npf = 0;
    int blind = !pf;
    for (size_t i = 0; i < n && pf; i++) {
        if (!ops[i]) continue;
        struct loomi_engine *e = ops[i]->eng;
        loomi_engine_lock(e);
        int fd = e->tops->wait_fd(e->tstate);
        loomi_engine_unlock(e);
        if (fd >= 0) pf[npf++] = (struct pollfd){.fd = fd, .events = POLLIN};
        else blind = 1;
    }
    poll(pf, npf, npf && !blind ? 10 : 1);
}

loom_result_t loomi_op_wait_any(loom_request_t *reqs, int n, int *index)
{
    struct loomi_op **ops = (struct loomi_op **)malloc((size_t)n * sizeof *ops);
    if (!ops) return loomi_fail(LOOM_ERR_NO_MEMORY, -1, "loom_wait_any: out of memory");
    struct loomi_engine *one = NULL;
    int single = 1;
    for (int i = 0; i < n; i++) {
        ops[i] = loomi_request_op(reqs[i], NULL);
        if (!ops[i]) continue;
        if (!one) one = ops[i]->eng;
        else if (ops[i]->eng != one) single = 0;
    }
    struct pollfd *pf = single ? NULL : malloc((size_t)n * sizeof *pf);
    int found = -1;
    while (found < 0) {
        for (int i = 0; i < n && found < 0; i++)
            if (ops[i] && test_one(ops[i])) found = i;
        if (found >= 0) break;
        if (single) {
            /* One communicator: sleep in its transport, as loom_wait does. */
            loomi_engine_lock(one);
            wait_some(one, ops, n);
            loomi_engine_unlock(one);
            continue;
        }
        /* Several: each is driven in turn, or one could wait on a peer
         * that waits on another; sleep until some transport has work. */
        sleep_on_engines(ops, (size_t)n, pf);
    }
    free(pf);
    struct loomi_op *op = ops[found];
    free(ops);
    struct loomi_engine *e = op->eng;
    loomi_engine_lock(e);
    loom_result_t r = op_result(op);
    loomi_engine_unlock(e);
    reqs[found] = LOOM_REQUEST_NULL;
    *index = found;
    return r;
}

loom_result_t loomi_op_wait_all(struct loomi_op **ops, size_t n)
{
    loom_result_t first = LOOM_SUCCESS;
    int one = 1;
    for (size_t i = 1; i < n; i++) one &= ops[i]->eng == ops[0]->eng;
    if (one) {
        for (size_t i = 0; i < n; i++) {
            loom_result_t r = loomi_op_wait(ops[i]);
            if (first == LOOM_SUCCESS) first = r;
        }
        return first;
    }
    size_t left = n;
    struct pollfd *pf = calloc(n, sizeof *pf);
    while (left) {
        for (size_t i = 0; i < n; i++) {
            if (!ops[i]) continue;
            int done = 0;
            loom_result_t r = loomi_op_test(ops[i], &done);
            if (done) {
                ops[i] = NULL; /* freed */
                left--;
                if (first == LOOM_SUCCESS) first = r;
            }
        }
        if (left) sleep_on_engines(ops, n, pf);
    }
    free(pf);
    return first;
}

/* ------------------------------------------------------ progress thread */

/* Called with mu held. */
static void progress_wake(struct loomi_progress *pt)
{
    uint64_t one = 1;
    ssize_t w = write(pt->wakefd, &one, sizeof one);
    (void)w; /* the counter is full: a wake-up is pending anyway */
    pt->sleeping = 0;
}

/* Sleep with mu released until the wake descriptor or `fd` (if >= 0) is
 * readable, or ms pass (-1: no limit). */
static void progress_sleep(struct loomi_progress *pt, int fd, int ms)
{
    struct pollfd pf[2] = {{.fd = pt->wakefd, .events = POLLIN},
                           {.fd = fd, .events = POLLIN}};
    pt->sleeping = 1;
    pthread_mutex_unlock(&pt->mu);
    if (poll(pf, fd >= 0 ? 2 : 1, ms) > 0 && (pf[0].revents & POLLIN)) {
        uint64_t v;
        ssize_t rd = read(pt->wakefd, &v, sizeof v);
        (void)rd;
    }
    pthread_mutex_lock(&pt->mu);
    pt->sleeping = 0;
}

/* The thread: drives the engine while operations are in flight, polls on
 * for LOOM_SPIN_US after the last progress, then sleeps in the transport's
 * descriptor (in 1 ms naps where it has none: shared memory), and with
 * nothing in flight sleeps until an operation starts.  Callers that want
 * the lock get it first. */
static void *progress_main(void *arg)
{
    struct loomi_engine *e = arg;
    struct loomi_progress *pt = e->pt;
    pthread_setname_np(pthread_self(), "loom-progress");
    uint64_t t0 = 0; /* when the current stretch without progress began; 0: none */
    pthread_mutex_lock(&pt->mu);
    while (!pt->stop) {
        while (atomic_load_explicit(&pt->want, memory_order_relaxed) > 0 && !pt->stop)
            pthread_cond_wait(&pt->turn, &pt->mu);
        if (pt->stop) break;
        if (!e->active) {
            t0 = 0;
            progress_sleep(pt, -1, -1);
            continue;
        }
        uint64_t ev = e->xfer_events;
        int na = e->nactive;
        engine_advance(e);
        if (e->active) engine_round(e, 0);
        if (e->xfer_events != ev || e->nactive != na) {
            t0 = 0;
            continue;
        }
        uint64_t now = loomi_now_ns();
        if (!t0) t0 = now;
        if (now - t0 < (uint64_t)e->set->spin_us * 1000u) {
            pthread_mutex_unlock(&pt->mu);
            sched_yield();
            pthread_mutex_lock(&pt->mu);
            continue;
        }
        int fd = e->tops->wait_fd(e->tstate);
        int ms = ms_to_deadline(e);
        if (*e->ctrl && ms > LOOMI_CTRL_POLL_MS) ms = LOOMI_CTRL_POLL_MS;
        if (*e->ctrl && ms > LOOMI_CALL_ANSWER_POLL_MS &&
            loomi_now_ms() - e->last_progress_ms < LOOMI_CALL_ANSWER_MS)
            ms = LOOMI_CALL_ANSWER_POLL_MS; /* as in engine_round */
        if (fd < 0 && ms > 1) ms = 1; /* nothing to sleep on: nap, then look again */
        progress_sleep(pt, fd, ms);
        check_deadline(e);
    }
    pthread_mutex_unlock(&pt->mu);
    return NULL;
}

static void progress_free(struct loomi_progress *pt)
{
    pthread_cond_destroy(&pt->turn);
    pthread_mutex_destroy(&pt->mu);
    if (pt->wakefd >= 0) close(pt->wakefd);
    free(pt);
}

static void progress_start(struct loomi_engine *e)
{
    const char *why = "out of memory";
    int err = 0;
    struct loomi_progress *pt = calloc(1, sizeof *pt);
    if (!pt) goto fail;
    pt->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (pt->wakefd < 0) {
        err = errno;
        why = "eventfd";
        free(pt);
        goto fail;
    }
    atomic_init(&pt->want, 0);
    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&pt->mu, &ma);
    pthread_mutexattr_destroy(&ma);
    pthread_cond_init(&pt->turn, NULL);
    e->pt = pt;
    /* Signals stay with the application's threads. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    err = pthread_create(&pt->thread, NULL, progress_main, e);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (err) {
        e->pt = NULL;
        progress_free(pt);
        why = "pthread_create";
        goto fail;
    }
    LOOMI_INFO(*e->rank, "progress thread started (LOOM_PROGRESS_THREAD=1)");
    return;
fail:
    e->set->progress_thread = 0;
    LOOMI_NOTICE(*e->rank, "progress thread not started (%s%s%s): operations progress inside "
                 "Loom calls only", why, err ? ": " : "", err ? strerror(err) : "");
}

void loomi_progress_stop(struct loomi_engine *e)
{
    struct loomi_progress *pt = e->pt;
    if (!pt) return;
    pthread_mutex_lock(&pt->mu);
    pt->stop = 1;
    progress_wake(pt);
    pthread_cond_signal(&pt->turn);
    pthread_mutex_unlock(&pt->mu);
    pthread_join(pt->thread, NULL);
    e->pt = NULL;
    progress_free(pt);
}
