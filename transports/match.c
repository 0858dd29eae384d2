/* match.c - message matching, shared by the two-sided transports
 * (match.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "transports/match.h"

static unsigned bucket(uint64_t tag)
{
    return (unsigned)((tag ^ (tag >> 32) ^ (tag >> 17)) % LOOMI_MQ_BUCKETS);
}

void loomi_match_init(struct loomi_match *m, const struct loomi_tctx *ctx, size_t usize,
                      size_t limit,
                      void (*fail)(void *owner, int peer, loom_result_t code, const char *why),
                      void *owner)
{
    memset(m, 0, sizeof *m);
    m->ctx = ctx;
    m->fail = fail;
    m->owner = owner;
    m->usize = usize < sizeof(struct loomi_unexp) ? sizeof(struct loomi_unexp) : usize;
    m->unexp_limit = limit;
    m->count_limit = LOOMI_MATCH_EARLY_COUNT;
}

void loomi_match_fini(struct loomi_match *m) { loomi_bufpool_clear(&m->pool); }

/* ---------------------------------------------------- posted receives */

void loomi_mq_recv_add(struct loomi_mq *q, struct loomi_xfer *x)
{
    unsigned b = bucket(x->tag);
    x->t_next = NULL;
    x->t_prev = q->recv[b].tail;
    if (q->recv[b].tail) q->recv[b].tail->t_next = x;
    else q->recv[b].head = x;
    q->recv[b].tail = x;
    q->nrecv++;
}

void loomi_mq_recv_del(struct loomi_mq *q, struct loomi_xfer *x)
{
    unsigned b = bucket(x->tag);
    if (x->t_prev) x->t_prev->t_next = x->t_next;
    else q->recv[b].head = x->t_next;
    if (x->t_next) x->t_next->t_prev = x->t_prev;
    else q->recv[b].tail = x->t_prev;
    x->t_next = x->t_prev = NULL;
    q->nrecv--;
}

int loomi_mq_recv_has(struct loomi_mq *q, struct loomi_xfer *x, int take)
{
    for (const struct loomi_xfer *y = q->recv[bucket(x->tag)].head; y; y = y->t_next)
        if (y == x) {
            if (take) loomi_mq_recv_del(q, x);
            return 1;
        }
    return 0;
}

struct loomi_xfer *loomi_mq_recv_find(const struct loomi_mq *q, uint64_t tag)
{
    for (struct loomi_xfer *x = q->recv[bucket(tag)].head; x; x = x->t_next)
        if (x->tag == tag) return x;
    return NULL;
}

/* The receives' helpers and the early messages' below look alike on
 * purpose: two lists of two types.  A pop takes the head of the first
 * bucket that has one. */
struct loomi_xfer *loomi_mq_recv_pop(struct loomi_mq *q)
{
    struct loomi_xfer *x = NULL;
    for (int b = 0; !x && q->nrecv && b < LOOMI_MQ_BUCKETS; b++) x = q->recv[b].head;
    if (x) loomi_mq_recv_del(q, x);
    return x;
}

/* ---------------------------------------------------- early messages */

struct loomi_unexp *loomi_mq_unexp_find(const struct loomi_mq *q, uint64_t tag)
{
    for (struct loomi_unexp *u = q->unexp[bucket(tag)].head; u; u = u->next)
        if (u->tag == tag) return u;
    return NULL;
}

void loomi_mq_unexp_del(struct loomi_mq *q, struct loomi_unexp *u)
{
    unsigned b = bucket(u->tag);
    struct loomi_unexp *prev = NULL;
    for (struct loomi_unexp *v = q->unexp[b].head; v; prev = v, v = v->next)
        if (v == u) {
            if (prev) prev->next = u->next;
            else q->unexp[b].head = u->next;
            if (q->unexp[b].tail == u) q->unexp[b].tail = prev;
            u->next = NULL;
            q->nunexp--;
            return;
        }
}

struct loomi_unexp *loomi_mq_unexp_pop(struct loomi_mq *q)
{
    struct loomi_unexp *u = NULL;
    for (int b = 0; !u && q->nunexp && b < LOOMI_MQ_BUCKETS; b++) u = q->unexp[b].head;
    if (u) loomi_mq_unexp_del(q, u);
    return u;
}

void loomi_match_unexp_unbuffer(struct loomi_match *m, struct loomi_unexp *u)
{
    if (!u->buf) return;
    m->unexp_bytes -= u->total;
    if (u->q) u->q->early_bytes -= u->total;
    loomi_bufpool_put(&m->pool, u->buf, u->cap);
    u->buf = NULL;
}

void loomi_match_unexp_free(struct loomi_match *m, struct loomi_unexp *u)
{
    if (!u) return;
    loomi_match_unexp_unbuffer(m, u);
    free(u);
}

/* ----------------------------------------------------------- checking */

const struct loomi_xfer *loomi_mq_recv_conflict(const struct loomi_mq *q, uint64_t tag,
                                                uint32_t chk)
{
    for (int b = 0; q->nrecv && b < LOOMI_MQ_BUCKETS; b++)
        for (const struct loomi_xfer *x = q->recv[b].head; x; x = x->t_next)
            if (loomi_call_conflict(x->tag, x->chk, tag, chk)) return x;
    return NULL;
}

const struct loomi_unexp *loomi_mq_unexp_conflict(const struct loomi_mq *q, uint64_t tag,
                                                  uint32_t chk)
{
    for (int b = 0; q->nunexp && b < LOOMI_MQ_BUCKETS; b++)
        for (const struct loomi_unexp *u = q->unexp[b].head; u; u = u->next)
            if (loomi_call_conflict(u->tag, u->chk, tag, chk)) return u;
    return NULL;
}

uint32_t loomi_match_own_conflict(const struct loomi_match *m, uint64_t tag, uint32_t chk)
{
    const struct loomi_tctx *c = m->ctx;
    uint32_t my = !(tag & LOOMI_TAG_P2P) && c->call_check ? c->call_check(c->owner, tag) : 0;
    return my && my != chk ? my : 0;
}

static loom_result_t fail(struct loomi_match *m, int peer, loom_result_t code, const char *why)
{
    m->fail(m->owner, peer, code, why);
    return code;
}

loom_result_t loomi_match_conflict(struct loomi_match *m, int peer, uint64_t theirs,
                                   uint32_t theirs_chk, uint64_t mine, uint32_t mine_chk)
{
    char why[LOOMI_MATCH_WHY];
    int k = snprintf(why, sizeof why, "rank %d ", peer); /* well under sizeof why */
    loomi_call_conflict_why(theirs, theirs_chk, mine, mine_chk, m->ctx->name_sig, why + k,
                            sizeof why - (size_t)k);
    return fail(m, peer, LOOM_ERR_MISMATCH, why);
}

loom_result_t loomi_match_length(struct loomi_match *m, int peer, uint64_t sent, uint64_t want)
{
    char why[LOOMI_MATCH_WHY];
    snprintf(why, sizeof why,
             "rank %d sent a message of %llu bytes where this rank expects %llu: "
             LOOMI_MISMATCH_HINT,
             peer, (unsigned long long)sent, (unsigned long long)want);
    return fail(m, peer, LOOM_ERR_MISMATCH, why);
}

loom_result_t loomi_match_pair(struct loomi_match *m, int peer, uint64_t tag, uint32_t chk,
                               uint64_t total, const struct loomi_xfer *x)
{
    if (x->chk != chk) return loomi_match_conflict(m, peer, tag, chk, x->tag, x->chk);
    if ((uint64_t)x->len != total) return loomi_match_length(m, peer, total, x->len);
    return LOOM_SUCCESS;
}

loom_result_t loomi_match_held(struct loomi_match *m, const struct loomi_mq *q, int peer,
                               const struct loomi_xfer *x)
{
    const struct loomi_unexp *theirs = loomi_mq_unexp_conflict(q, x->tag, x->chk);
    if (!theirs) return LOOM_SUCCESS;
    return loomi_match_conflict(m, peer, theirs->tag, theirs->chk, x->tag, x->chk);
}

loom_result_t loomi_match_early(struct loomi_match *m, struct loomi_mq *q, int peer, uint64_t tag,
                                uint32_t chk, uint64_t total, int buffered,
                                struct loomi_unexp **u)
{
    *u = NULL;
    const struct loomi_xfer *mine = loomi_mq_recv_conflict(q, tag, chk);
    if (mine) return loomi_match_conflict(m, peer, tag, chk, mine->tag, mine->chk);
    uint32_t my = loomi_match_own_conflict(m, tag, chk);
    if (my) return loomi_match_conflict(m, peer, tag, chk, tag, my);
    /* The budget is the peer's own, so the peer that passes it fails,
     * not another whose message comes after.  Neither sum can wrap:
     * early_bytes stays under the limit. */
    if (buffered && (total > m->unexp_limit || q->early_bytes > m->unexp_limit - total)) {
        char why[LOOMI_MATCH_WHY];
        snprintf(why, sizeof why, "more than %llu bytes arrived for receives not posted",
                 (unsigned long long)m->unexp_limit);
        return fail(m, peer, LOOM_ERR_REMOTE, why);
    }
    if (q->nunexp < 0 || (unsigned)q->nunexp >= m->count_limit) {
        char why[LOOMI_MATCH_WHY];
        snprintf(why, sizeof why, "more than %u messages arrived for receives not posted",
                 m->count_limit);
        return fail(m, peer, LOOM_ERR_REMOTE, why);
    }
    struct loomi_unexp *v = calloc(1, m->usize);
    if (v && buffered && !(v->buf = loomi_bufpool_get(&m->pool, (size_t)total, &v->cap))) {
        free(v);
        v = NULL;
    }
    if (!v) return fail(m, peer, LOOM_ERR_NO_MEMORY, "out of memory for an early message");
    v->tag = tag;
    v->chk = chk;
    v->total = (size_t)total;
    v->q = q;
    if (buffered) {
        m->unexp_bytes += v->total;
        q->early_bytes += v->total;
    }
    unsigned b = bucket(tag);
    if (q->unexp[b].tail) q->unexp[b].tail->next = v;
    else q->unexp[b].head = v;
    q->unexp[b].tail = v;
    q->nunexp++;
    *u = v;
    return LOOM_SUCCESS;
}

loom_result_t loomi_match_post(struct loomi_match *m, struct loomi_mq *q, int peer,
                               struct loomi_xfer *x, struct loomi_unexp **u)
{
    struct loomi_unexp *v = q->nunexp ? loomi_mq_unexp_find(q, x->tag) : NULL;
    *u = v;
    if (!v) {
        loomi_mq_recv_add(q, x);
        return loomi_match_held(m, q, peer, x);
    }
    /* Listed first: the peer that fails here fails x too. */
    if (v->chk != x->chk || v->total != x->len) loomi_mq_recv_add(q, x);
    return loomi_match_pair(m, peer, v->tag, v->chk, v->total, x);
}

int loomi_match_note_op(struct loomi_match *m, const struct loomi_xfer *x)
{
    if (x->tag & LOOMI_TAG_P2P || m->noted_op == loomi_tag_op(x->tag) + 1) return 0;
    m->noted_op = loomi_tag_op(x->tag) + 1;
    return 1;
}

void loomi_match_vwarn(int rank, const char *transport, int peer, char *why, size_t n,
                       const char *fmt, va_list ap)
{
    vsnprintf(why, n, fmt, ap);
    LOOMI_WARN(rank, "%s: peer rank %d: %s", transport, peer, why);
}
