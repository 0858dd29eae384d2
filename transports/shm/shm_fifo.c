/*
 * shm_fifo.c - the shared-memory transport's messages through the FIFOs:
 * failing a peer, writing cells (eager messages, single-copy
 * descriptors, control cells), reading and acting on what arrives
 * (matched against the receives posted by match.c), and isend / irecv /
 * cancel.  shm.c says how it works.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transports/shm/shm_internal.h"

/* An early message taken off its list, and freed. */
static void unexp_remove(struct shm *t, struct peer *p, struct unexp *u)
{
    loomi_mq_unexp_del(&p->mq, &u->m);
    loomi_match_unexp_free(&t->match, &u->m);
}

/* ------------------------------------------------------------ failures */

/* Fail everything p holds.  `notify`: tell the core through peer_failed. */
void loomi_shm_peer_down(struct shm *t, struct peer *p, int failed, loom_result_t code,
                         const char *why, int notify)
{
    if (p->failed) return;
    p->failed = 1;
    /* Sends p may still be reading go back to the engine with an error:
     * from now on nothing read from this process is to be trusted. */
    if (p->acks.head && t->hdr) withdraw(t->hdr);
    /* Detach every list before completing: a completion may look around. */
    struct xq recvs = {NULL, NULL};
    struct loomi_xfer *x;
    while ((x = loomi_mq_recv_pop(&p->mq)) != NULL) xq_push(&recvs, x);
    struct loomi_xfer *lists[3] = {p->sq.head, p->acks.head, recvs.head};
    const int nl = 3;
    memset(&p->sq, 0, sizeof p->sq);
    memset(&p->acks, 0, sizeof p->acks);
    struct loomi_xfer *rx = p->rx_x;
    p->rx_x = NULL;
    p->rx_u = NULL;
    p->rx_on = 0;
    struct rd *rds[2] = {p->reads, p->resends};
    p->reads = p->resends = NULL;
    struct loomi_unexp *u;
    while ((u = loomi_mq_unexp_pop(&p->mq)) != NULL) loomi_match_unexp_free(&t->match, u);
    free(p->ctl);
    p->ctl = NULL;
    p->nctl = p->capctl = 0;
    for (int i = 0; i < nl; i++) {
        struct loomi_xfer *n;
        for (x = lists[i]; x; x = n) {
            n = x->t_next;
            x->t_next = x->t_prev = NULL;
            done(p, x, code);
        }
    }
    if (rx) done(p, rx, code);
    for (int i = 0; i < 2; i++) {
        struct rd *r = rds[i], *n;
        for (; r; r = n) {
            n = r->next;
            if (r->x) done(p, r->x, code);
            free(r);
        }
    }
    p->npending = 0;
    t->events++;
    if (notify && t->ctx.peer_failed) t->ctx.peer_failed(t->ctx.owner, p->rank, failed, code, why);
}

void loomi_shm_peer_error(struct shm *t, struct peer *p, loom_result_t code, const char *fmt, ...)
{
    if (p->failed) return;
    char why[LOOMI_MATCH_WHY];
    va_list ap;
    va_start(ap, fmt);
    loomi_match_vwarn(t->ctx.rank, "shm", p->rank, why, sizeof why, fmt, ap);
    va_end(ap);
    loomi_shm_peer_down(t, p, p->rank, code, why, 1);
}

void loomi_shm_match_fail(void *owner, int peer, loom_result_t code, const char *why)
{
    struct shm *t = owner;
    loomi_shm_peer_error(t, &t->peers[peer], code, "%s", why);
}

/* A collective transfer x is posted: the first of its operation scans
 * the messages held from every peer for one of that operation from
 * another schedule or call, which came before this rank made the call
 * (found: that peer fails).  Cheap when none is held. */
static void note_op(struct shm *t, const struct loomi_xfer *x)
{
    if (!loomi_match_note_op(&t->match, x)) return;
    for (int i = 0; i < t->nlocal; i++) {
        struct peer *q = &t->peers[t->local[i]];
        if (!q->failed) loomi_match_held(&t->match, &q->mq, q->rank, x);
    }
}

/* ------------------------------------------------------------- sending */

static inline struct cell *out_cell(const struct peer *p, uint64_t pos)
{
    return (struct cell *)(p->out_cells + (size_t)(pos & (p->out_ncells - 1)) * p->out_cell_bytes);
}

/* Room for one more cell?  -1: the peer's tail is garbage (peer failed). */
static int out_space(struct shm *t, struct peer *p)
{
    if (p->out_head - p->out_tail < p->out_ncells) return 1;
    /* Acquire: the consumer release-stored its tail after copying the
     * cells out (poll_in), so its reads of them come before our stores
     * into them; with a plain load an arm64 core could overwrite a cell
     * the consumer is still reading. */
    uint64_t tl = atomic_load_explicit(&p->out_ctl->tail, memory_order_acquire);
    if (tl > p->out_head || p->out_head - tl > p->out_ncells) {
        PROTO(t, p, "FIFO tail %llu out of range (head %llu)", (unsigned long long)tl,
              (unsigned long long)p->out_head);
        return -1;
    }
    p->out_tail = tl;
    return p->out_head - tl < p->out_ncells;
}

/* Fill the next cell and publish it. */
static void out_put(struct peer *p, uint16_t type, uint64_t tag, uint32_t chk, uint64_t total,
                    const void *a, size_t alen, const void *b, size_t blen)
{
    struct cell *c = out_cell(p, p->out_head);
    c->type = type;
    c->flags = 0;
    c->len = (uint32_t)(alen + blen);
    c->chk = chk;
    c->tag = tag;
    c->total = total;
    if (alen) memcpy((char *)c + CELL_HDR, a, alen);
    if (blen) memcpy((char *)c + CELL_HDR + alen, b, blen);
    p->out_head++;
    /* Release: the header and payload above become visible before the
     * number that says the cell is full (arm64 reorders plain stores). */
    atomic_store_explicit(&c->seq, (uint32_t)p->out_head, memory_order_release);
}

void loomi_shm_ctl_push(struct shm *t, struct peer *p, uint16_t type, uint64_t id)
{
    if (p->failed) return;
    if (p->nctl == p->capctl) {
        size_t cap = p->capctl ? 2 * p->capctl : 16;
        struct ctl *n = realloc(p->ctl, cap * sizeof *n);
        if (!n) {
            loomi_shm_peer_error(t, p, LOOM_ERR_NO_MEMORY,
                                 "out of memory queueing a control message");
            return;
        }
        p->ctl = n;
        p->capctl = cap;
    }
    p->ctl[p->nctl].type = type;
    p->ctl[p->nctl++].id = id;
}

/* Write what fits: control cells first, then the send queue in order.
 * Returns cells written. */
int loomi_shm_pump_out(struct shm *t, struct peer *p)
{
    int n = 0, sp;
    size_t done_ctl = 0;
    while (done_ctl < p->nctl && (sp = out_space(t, p)) > 0) {
        out_put(p, p->ctl[done_ctl].type, p->ctl[done_ctl].id, 0, 0, NULL, 0, NULL, 0);
        done_ctl++;
        n++;
    }
    if (p->failed) return n;
    if (done_ctl) {
        memmove(p->ctl, p->ctl + done_ctl, (p->nctl - done_ctl) * sizeof *p->ctl);
        p->nctl -= done_ctl;
    }
    if (p->nctl) return n; /* control goes first */
    const size_t cap = p->out_cell_bytes - CELL_HDR;
    struct loomi_xfer *x;
    while ((x = p->sq.head) != NULL && (sp = out_space(t, p)) > 0) {
        unsigned mode = (unsigned)(x->t_posted & 3);
        uint64_t id = (uint64_t)x->t_posted >> 2;
        n++;
        if (mode == M_RTS) {
            uint64_t d[2] = {(uint64_t)(uintptr_t)x->buf, id};
            out_put(p, C_RTS, x->tag, x->chk, x->len, d, sizeof d, NULL, 0);
            xq_del(&p->sq, x);
            xq_push(&p->acks, x);
            continue;
        }
        size_t len = LOOMI_MIN(cap, x->len - x->t_done);
        const char *src = (const char *)x->buf + x->t_done;
        if (x->t_done == 0)
            out_put(p, mode == M_RESEND ? C_RESEND : C_FIRST, mode == M_RESEND ? id : x->tag,
                    x->chk, x->len, src, len, NULL, 0);
        else
            out_put(p, C_CONT, 0, 0, 0, src, len, NULL, 0);
        x->t_done += len;
        if (x->t_done == x->len) {
            xq_del(&p->sq, x);
            done(p, x, LOOM_SUCCESS);
        }
    }
    return n;
}

/* The peer a new transfer goes to or comes from, the transfer noted
 * (note_op), or NULL (error set) when it cannot: a bad rank, or a peer
 * not reached here, failed or gone. */
static struct peer *xfer_peer(struct shm *t, struct loomi_xfer *x, loom_result_t *r)
{
    if (x->peer < 0 || x->peer >= t->ctx.nranks || x->peer == t->ctx.rank) {
        *r = loomi_fail(LOOM_ERR_INTERNAL, t->ctx.rank, "shm: transfer with bad peer %d", x->peer);
        return NULL;
    }
    struct peer *p = &t->peers[x->peer];
    if (!p->connected || p->failed || p->gone || t->aborted) {
        *r = loomi_fail(LOOM_ERR_REMOTE, t->ctx.rank, "shm: rank %d is unreachable (%s)", x->peer,
                        !p->connected ? "not connected through shared memory"
                        : p->failed   ? "failed"
                        : p->gone     ? "it closed the communicator"
                                      : "communicator aborted");
        return NULL;
    }
    x->t_done = 0;
    x->t_posted = 0;
    x->t_next = x->t_prev = NULL;
    note_op(t, x);
    if (p->failed) {
        *r = loomi_fail(LOOM_ERR_REMOTE, t->ctx.rank, "shm: rank %d failed", x->peer);
        return NULL;
    }
    return p;
}

/* Messages up to this size go through the cells (LOOM_SHM_CMA, or a
 * whole FIFO when the ranks share cores). */
static size_t cells_max(const struct shm *t, const struct peer *p)
{
    size_t m = t->ctx.shm.cma_min ? t->ctx.shm.cma_min - 1 : SIZE_MAX;
    size_t fifo = (size_t)p->out_ncells * p->out_cell_bytes;
    return t->crowded && m < fifo ? fifo : m;
}

void loomi_shm_crowded(void *state) { ((struct shm *)state)->crowded = 1; }

size_t loomi_shm_cells_max(void *state, int peer)
{
    struct shm *t = state;
    if (peer < 0 || peer >= t->ctx.nranks || !t->peers[peer].out_cells) return 0;
    return cells_max(t, &t->peers[peer]);
}

loom_result_t loomi_shm_isend(void *state, struct loomi_xfer *x)
{
    struct shm *t = state;
    loom_result_t r;
    struct peer *p = xfer_peer(t, x, &r);
    if (!p) return r;
    if (x->len > MAX_MSG)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, t->ctx.rank, "shm: message of %zu bytes",
                          x->len);
    if (x->len > cells_max(t, p) && !p->no_cma) /* SIZE_MAX when shm_cma_min is 0 */
        x->t_posted = (size_t)(p->next_id++ << 2) | M_RTS;
    p->npending++;
    int idle = p->sq.head == NULL;
    xq_push(&p->sq, x);
    /* Nothing ahead of it: write now, so a small message is out (and
     * complete) before isend returns. */
    if (idle) loomi_shm_pump_out(t, p);
    return LOOM_SUCCESS;
}

/* ----------------------------------------------------------- receiving */

/* Copy payload into whatever the arriving message lands in. */
static void rx_data(struct shm *t, struct peer *p, const char *src, size_t len)
{
    if (len && p->rx_x) memcpy((char *)p->rx_x->buf + p->rx_off, src, len);
    else if (len && p->rx_u) memcpy(p->rx_u->m.buf + p->rx_off, src, len);
    p->rx_off += len;
    if (p->rx_u) p->rx_u->m.got = p->rx_off;
    if (p->rx_off < p->rx_total) return;
    p->rx_on = 0;
    struct loomi_xfer *x = p->rx_x;
    p->rx_x = NULL;
    p->rx_u = NULL;
    (void)t;
    if (x) done(p, x, LOOM_SUCCESS);
}

/* A message nobody waits for yet: keep it (descriptor, or a buffer),
 * unless a receive of its operation, or this rank's call of it, shows
 * that its sender made the call otherwise. */
static struct unexp *unexp_new(struct shm *t, struct peer *p, const struct cell *h, int rts)
{
    struct loomi_unexp *m;
    if (loomi_match_early(&t->match, &p->mq, p->rank, h->tag, h->chk, h->total, !rts, &m))
        return NULL;
    struct unexp *u = (struct unexp *)m;
    u->rts = rts;
    LOOMI_TRACE(t->ctx.rank, "shm: early message from rank %d, tag %llx, %llu bytes%s", p->rank,
                (unsigned long long)h->tag, (unsigned long long)h->total,
                rts ? " (descriptor)" : "");
    return u;
}

/* The oldest receive posted for h's message, taken off its list; NULL
 * when there is none, or (peer failed, *bad set) when it does not agree
 * with the message. */
static struct loomi_xfer *take_recv(struct shm *t, struct peer *p, const struct cell *h, int *bad)
{
    struct loomi_xfer *x = loomi_mq_recv_find(&p->mq, h->tag);
    *bad = x && loomi_match_pair(&t->match, p->rank, h->tag, h->chk, h->total, x);
    if (!x || *bad) return NULL; /* a receive that disagrees failed with the peer */
    loomi_mq_recv_del(&p->mq, x);
    return x;
}

/* id came back from the peer: is it one we could have issued? */
static int id_known(const struct peer *p, uint64_t id) { return id < p->next_id; }

static struct loomi_xfer *take_ack(struct peer *p, uint64_t id)
{
    for (struct loomi_xfer *x = p->acks.head; x; x = x->t_next)
        if ((uint64_t)x->t_posted >> 2 == id) {
            xq_del(&p->acks, x);
            return x;
        }
    return NULL;
}

/* One cell (header copied to h, payload at pl).  Returns -1 when the
 * peer was failed. */
static int handle_cell(struct shm *t, struct peer *p, const struct cell *h, const char *pl)
{
    const size_t cap = t->cell_bytes - CELL_HDR;
    const size_t len = h->len;
    if (len > cap) {
        PROTO(t, p, "cell payload of %zu bytes (cells hold %zu)", len, cap);
        return -1;
    }
    switch (h->type) {
    case C_FIRST:
    case C_RESEND: {
        if (p->rx_on) {
            PROTO(t, p, "a new message began inside another");
            return -1;
        }
        if (h->total > MAX_MSG || len > h->total) {
            PROTO(t, p, "message of %llu bytes, first cell %zu", (unsigned long long)h->total, len);
            return -1;
        }
        struct loomi_xfer *x = NULL;
        struct unexp *u = NULL;
        if (h->type == C_RESEND) {
            struct rd **l = &p->resends, *r = NULL;
            for (; *l; l = &(*l)->next)
                if ((*l)->id == h->tag) break;
            if (!(r = *l)) {
                PROTO(t, p, "resend of unknown message %llu", (unsigned long long)h->tag);
                return -1;
            }
            *l = r->next;
            x = r->x;
            free(r);
            if (x && x->len != h->total) {
                done(p, x, LOOM_ERR_MISMATCH);
                PROTO(t, p, "resend of %llu bytes for a message of %zu",
                      (unsigned long long)h->total, x->len);
                return -1;
            }
        } else {
            int bad;
            x = take_recv(t, p, h, &bad);
            if (bad || (!x && !(u = unexp_new(t, p, h, 0)))) return -1;
        }
        p->rx_on = 1;
        p->rx_x = x;
        p->rx_u = u;
        p->rx_off = 0;
        p->rx_total = h->total;
        rx_data(t, p, pl, len);
        return 0;
    }
    case C_CONT:
        if (!p->rx_on || len == 0 || len > p->rx_total - p->rx_off) {
            PROTO(t, p, "continuation cell of %zu bytes outside a message", len);
            return -1;
        }
        rx_data(t, p, pl, len);
        return 0;
    case C_RTS: {
        uint64_t d[2];
        if (p->rx_on || len != sizeof d || h->total > MAX_MSG) {
            PROTO(t, p, "bad single-copy descriptor (len %zu, total %llu)", len,
                  (unsigned long long)h->total);
            return -1;
        }
        memcpy(d, pl, sizeof d);
        int bad;
        struct loomi_xfer *x = take_recv(t, p, h, &bad);
        if (bad) return -1;
        if (x) {
            loomi_shm_start_read(t, p, x, d[0], d[1]);
        } else {
            struct unexp *u = unexp_new(t, p, h, 1);
            if (!u) return -1;
            u->raddr = d[0];
            u->id = d[1];
        }
        return 0;
    }
    case C_ACK:
    case C_NACK: {
        struct loomi_xfer *x = take_ack(p, h->tag);
        if (!x) {
            if (id_known(p, h->tag)) return 0; /* its send was cancelled */
            PROTO(t, p, "ack for unknown message %llu", (unsigned long long)h->tag);
            return -1;
        }
        if (h->type == C_ACK) {
            done(p, x, LOOM_SUCCESS);
        } else {
            if (!p->no_cma)
                LOOMI_INFO(t->ctx.rank,
                           "shm: rank %d cannot read this process's memory (process_vm_readv "
                           "refused): messages to it go through the FIFO cells",
                           p->rank);
            p->no_cma = 1;
            x->t_done = 0;
            x->t_posted = (size_t)(h->tag << 2) | M_RESEND;
            xq_push(&p->sq, x);
        }
        return 0;
    }
    case C_ABANDON:
        if (!p->rx_on) {
            PROTO(t, p, "abandon outside a message");
            return -1;
        }
        p->rx_on = 0;
        if (p->rx_u) unexp_remove(t, p, p->rx_u);
        p->rx_u = NULL;
        if (p->rx_x) {
            struct loomi_xfer *x = p->rx_x;
            p->rx_x = NULL;
            done(p, x, LOOM_ERR_REMOTE);
        }
        return 0;
    default:
        PROTO(t, p, "unknown cell type %u", h->type);
        return -1;
    }
}

static inline struct cell *in_cell(const struct shm *t, const struct peer *p, uint64_t pos)
{
    return (struct cell *)(p->in_cells + (size_t)(pos & (t->ncells - 1)) * t->cell_bytes);
}

/* Consume up to `budget` cells from p.  Returns cells consumed. */
int loomi_shm_poll_in(struct shm *t, struct peer *p, int budget)
{
    int n = 0;
    while (n < budget && !p->failed) {
        struct cell *c = in_cell(t, p, p->in_pos);
        /* Acquire: the cell's header and payload are read only after the
         * number the producer release-stored last (out_put). */
        if (atomic_load_explicit(&c->seq, memory_order_acquire) != (uint32_t)(p->in_pos + 1)) break;
        struct cell h;
        h.type = c->type;
        h.len = c->len;
        h.tag = c->tag;
        h.chk = c->chk;
        h.total = c->total;
        int rc = handle_cell(t, p, &h, (const char *)c + CELL_HDR);
        if (rc < 0) break;
        p->in_pos++;
        /* Release: every read of the cell (handle_cell copied out what it
         * keeps) comes before the producer may reuse it (out_space). */
        atomic_store_explicit(&p->in_ctl->tail, p->in_pos, memory_order_release);
        n++;
    }
    return n;
}

loom_result_t loomi_shm_irecv(void *state, struct loomi_xfer *x)
{
    struct shm *t = state;
    loom_result_t r;
    struct peer *p = xfer_peer(t, x, &r);
    if (!p) return r;
    /* Opens as tcp's and verbs' irecv do: the peer, its count, then
     * match.c; what follows is shm's own. */
    p->npending++;
    struct loomi_unexp *m;
    /* Failed: x fails with the peer's other transfers. */
    if (loomi_match_post(&t->match, &p->mq, p->rank, x, &m)) return LOOM_SUCCESS;
    if (!m) return LOOM_SUCCESS; /* listed */
    struct unexp *u = (struct unexp *)m;
    loomi_mq_unexp_del(&p->mq, m); /* x is not listed */
    if (u->rts) {
        loomi_shm_start_read(t, p, x, u->raddr, u->id);
        loomi_match_unexp_free(&t->match, m);
        return LOOM_SUCCESS;
    }
    if (m->got) memcpy(x->buf, m->buf, m->got);
    if (p->rx_u == u) {
        /* Still arriving: the rest lands in place. */
        p->rx_u = NULL;
        p->rx_x = x;
        loomi_match_unexp_free(&t->match, m);
        return LOOM_SUCCESS;
    }
    loomi_match_unexp_free(&t->match, m);
    done(p, x, LOOM_SUCCESS);
    return LOOM_SUCCESS;
}

void loomi_shm_cancel(void *state, struct loomi_xfer *x)
{
    struct shm *t = state;
    if (x->peer < 0 || x->peer >= t->ctx.nranks || x->peer == t->ctx.rank) return;
    struct peer *p = &t->peers[x->peer];
    if (p->failed) return;
    if (xq_has(&p->sq, x)) {
        /* Part written: tell the receiver to drop what it has (the rest of
         * the buffer may be gone once we return). */
        int part = x->t_done > 0 && x->t_done < x->len;
        xq_del(&p->sq, x);
        p->npending--;
        if (part) loomi_shm_ctl_push(t, p, C_ABANDON, 0);
        return;
    }
    if (xq_has(&p->acks, x)) {
        /* The receiver may be reading the buffer right now, and it is the
         * engine's again once we return: say so first. */
        if (t->hdr) withdraw(t->hdr);
        xq_del(&p->acks, x);
        p->npending--;
        return;
    }
    if (loomi_mq_recv_has(&p->mq, x, 1)) {
        p->npending--;
        return;
    }
    if (p->rx_x == x) {
        p->rx_x = NULL; /* the rest of the message goes nowhere */
        p->npending--;
        return;
    }
    for (struct rd **l = &p->reads; *l; l = &(*l)->next)
        if ((*l)->x == x) {
            struct rd *r = *l;
            uint64_t id = r->id;
            *l = r->next;
            free(r);
            p->npending--;
            /* The sender only waits for us to be done with its buffer. */
            loomi_shm_ctl_push(t, p, C_ACK, id);
            return;
        }
    for (struct rd *r = p->resends; r; r = r->next)
        if (r->x == x) {
            r->x = NULL; /* its data still comes: discard it */
            p->npending--;
            return;
        }
}
