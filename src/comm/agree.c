/*
 * agree.c - loom_comm_agree: the ranks of a communicator that are not
 * known failed agree on one value, the minimum or the maximum of what
 * they contribute, over the control plane: it works on a revoked
 * communicator, and while ranks fail (as ULFM's MPIX_Comm_agree).
 *
 * Agreement `a` is a communicator's a-th call (the same on every rank):
 *  - every rank sends AGREE (its value, the op, the ranks it knows out)
 *    to the coordinator, the lowest rank it does not know out;
 *  - the coordinator waits until every rank it does not know out has
 *    either proposed or told it of a decision taken already (it asks
 *    every rank for one when it starts, and again while it waits: it may
 *    have taken over from a coordinator that failed after only some
 *    ranks had its decision), merging their views; then it sends AGREED
 *    (the decision found, or else the op over the values of the ranks
 *    in, and the ranks out) to every rank in;
 *  - every rank keeps its decision, and its control thread answers a
 *    later coordinator's question with it (ctrl.c).
 * A rank that proposed to the new coordinator has closed its connection
 * to the old one, so it never takes the old one's decision afterwards:
 * every rank that returns LOOM_SUCCESS returns the same value.  The
 * decision needs a quorum of the ranks (loomi_ctrl_quorum), as shrink's.
 * Everything has LOOM_TIMEOUT as its deadline.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "comm/ctrl.h"
#include "compress/compress.h" /* loomi_le64_load/store */

/* Payloads: AGREE [value 8][op 1][out n]; AGREED [value 8][status 1][out n]. */
#define HEAD 9
enum { AG_OK = 0, AG_MINORITY = 1, AG_OPS = 2 };
enum { ST_DONE, ST_RESTART, ST_ERROR };
/* A coordinator asks again for decisions this often while it waits. */
#define ASK_MS 100

struct agree {
    struct loom_comm *comm;
    struct loomi_ctrl *ctrl;
    int n, me;
    uint64_t id, deadline;
    uint64_t value;
    loom_op_t op;
    unsigned char *out;   /* [n] this rank's view */
    unsigned gen;
    unsigned char *heard; /* [n] proposed to this rank, as coordinator */
    uint64_t *vals;       /* [n] their values */
    unsigned char *ops;   /* [n] and ops */
    unsigned char *msg;   /* [HEAD + n] a payload being built */
    loom_result_t err;
    uint64_t result;
    unsigned char *decided; /* [n] the decision's out-set, when the caller wants it */
    const char *fn;
};

static void refresh(struct agree *g) { loomi_ctrl_failed(g->ctrl, g->out, &g->gen); }

static int coordinator(const struct agree *g)
{
    for (int q = 0; q < g->n; q++)
        if (!g->out[q]) return q;
    return -1;
}

/* A well-formed payload of n out-bytes after the head, merged into this
 * rank's view (its control plane's failed set grows).  0, or -1 when the
 * sender broke the protocol. */
static int merge(struct agree *g, const struct loomi_cmsg *m)
{
    if (m->len != (uint32_t)(HEAD + g->n)) return -1;
    const unsigned char *o = m->data + HEAD;
    for (int q = 0; q < g->n; q++) {
        if (o[q] != 0 && o[q] != LOOMI_OUT && o[q] != LOOMI_OUT_LEFT) return -1;
        if (o[q] && !g->out[q]) {
            char why[96];
            snprintf(why, sizeof why, "reported out by rank %d during an agreement", m->src);
            loomi_ctrl_mark_failed(g->ctrl, q, why);
        }
    }
    refresh(g);
    return 0;
}

static void malformed(struct agree *g, const struct loomi_cmsg *m)
{
    char why[96];
    snprintf(why, sizeof why, "sent a malformed agreement message (type %u, %u bytes)", m->type,
             m->len);
    loomi_ctrl_mark_failed(g->ctrl, m->src, why);
    refresh(g);
}

static const char *op_word(loom_op_t op) { return op == LOOM_MIN ? "min" : "max"; }

/* Take decision m (an AGREED of this agreement, well formed). */
static int adopt(struct agree *g, const struct loomi_cmsg *m)
{
    loomi_ctrl_agreed_put(g->ctrl, g->id, m->data, m->len);
    unsigned status = m->data[8];
    if (status == AG_OK) {
        g->result = loomi_le64_load(m->data);
        if (g->decided) memcpy(g->decided, m->data + HEAD, (size_t)g->n);
        return ST_DONE;
    }
    if (status == AG_OPS)
        g->err = loomi_fail(LOOM_ERR_MISMATCH, g->me,
                            "%s: the ranks passed different ops (this rank %s; rank %d %s)",
                            g->fn, op_word(g->op), (int)loomi_le64_load(m->data),
                            op_word(g->op == LOOM_MIN ? LOOM_MAX : LOOM_MIN));
    else
        g->err = loomi_fail(LOOM_ERR_REVOKED, g->me,
                            "%s: the coordinator (rank %d) reaches only a minority of the ranks: "
                            "no majority, so they may not go on (LOOM_QUORUM); this rank must "
                            "leave the job",
                            g->fn, m->src);
    return ST_ERROR;
}

/* The next message of this agreement (others of later agreements go to
 * the communicator's stash; earlier ones are dropped), or NULL after
 * wait_ms or a change of the failed set. */
static struct loomi_cmsg *next_msg(struct agree *g, int wait_ms)
{
    struct loom_comm *c = g->comm;
    for (struct loomi_cmsg **l = (struct loomi_cmsg **)&c->agree_stash; *l; l = &(*l)->next)
        if ((*l)->arg == g->id) {
            struct loomi_cmsg *m = *l;
            *l = m->next;
            m->next = NULL;
            return m;
        }
    for (;;) {
        uint64_t d = loomi_now_ms() + (uint64_t)wait_ms;
        if (d > g->deadline) d = g->deadline;
        struct loomi_cmsg *m = loomi_ctrl_recv(g->ctrl, g->gen, d, LOOMI_CMSG_AGREEMENT);
        if (m && (m->src < 0 || m->src >= g->n)) { /* no rank of this agreement */
            free(m);
            continue;
        }
        if (!m || m->arg == g->id) return m;
        if (m->arg > g->id && m->arg <= g->id + 1) { /* a faster rank: its next one */
            m->next = c->agree_stash;
            c->agree_stash = m;
            continue;
        }
        /* A slower rank's proposal for one this rank decided. */
        if (m->type == LOOMI_CMSG_AGREE && m->arg < g->id)
            loomi_ctrl_agreed_answer(g->ctrl, m->src, m->arg);
        free(m);
    }
}

static int member(struct agree *g, int coord)
{
    loomi_le64_store(g->msg, g->value);
    g->msg[8] = (unsigned char)g->op;
    memcpy(g->msg + HEAD, g->out, (size_t)g->n);
    if (loomi_ctrl_send(g->ctrl, coord, LOOMI_CMSG_AGREE, 0, g->id, g->msg,
                        (uint32_t)(HEAD + g->n)) != LOOM_SUCCESS)
        return ST_RESTART;
    for (;;) {
        /* Before going to another coordinator, read what is in: the old
         * one's decision, sent before it failed, must win over a new one. */
        int leaving = g->out[g->me] || g->out[coord];
        struct loomi_cmsg *m = next_msg(g, leaving ? 0 : ASK_MS);
        if (!m) {
            if (leaving) return ST_RESTART;
            refresh(g);
            if (loomi_now_ms() >= g->deadline) {
                g->err = loomi_fail(LOOM_ERR_TIMEOUT, g->me,
                                    "%s: no decision from rank %d within LOOM_TIMEOUT (%d ms)",
                                    g->fn, coord, g->comm->set.timeout_ms);
                return ST_ERROR;
            }
            continue;
        }
        int st = -1;
        if (m->type == LOOMI_CMSG_AGREED) {
            /* From whoever had it: every decision of an agreement is one. */
            if (merge(g, m) == 0) st = adopt(g, m);
            else malformed(g, m);
        } else if (merge(g, m) == 0) {
            /* A proposal: its sender takes this rank for the coordinator,
             * its view has failures this one lacked (merged now). */
            int q = m->src;
            g->heard[q] = 1;
            g->vals[q] = loomi_le64_load(m->data);
            g->ops[q] = m->data[8];
        } else {
            malformed(g, m);
        }
        free(m);
        if (st >= 0) return st;
    }
}

static void ask_all(struct agree *g)
{
    for (int q = 0; q < g->n; q++)
        if (q != g->me && !g->out[q] && !g->heard[q]) loomi_ctrl_agreed_ask(g->ctrl, q, 0, g->id);
}

static int coordinate(struct agree *g)
{
    g->heard[g->me] = 1;
    g->vals[g->me] = g->value;
    g->ops[g->me] = (unsigned char)g->op;
    /* Ranks below this one were in when the agreement began, or may have
     * been: one of them may have decided already. */
    int took_over = 0;
    for (int q = 0; q < g->me; q++) took_over |= g->out[q] != 0;
    if (took_over) ask_all(g);
    uint64_t asked = loomi_now_ms();
    for (;;) {
        int waiting = 0;
        for (int q = 0; q < g->n; q++) waiting |= !g->out[q] && !g->heard[q];
        if (!waiting) break;
        struct loomi_cmsg *m = next_msg(g, ASK_MS);
        if (!m) {
            refresh(g);
            if (g->out[g->me] || coordinator(g) != g->me) return ST_RESTART;
            if (loomi_now_ms() >= g->deadline) {
                int q = 0;
                while (q < g->n && (g->out[q] || g->heard[q])) q++;
                g->err = loomi_fail(LOOM_ERR_TIMEOUT, g->me,
                                    "%s: rank %d did not take part within LOOM_TIMEOUT (%d ms)",
                                    g->fn, q, g->comm->set.timeout_ms);
                return ST_ERROR;
            }
            if (took_over && loomi_now_ms() - asked >= ASK_MS) {
                ask_all(g);
                asked = loomi_now_ms();
            }
            continue;
        }
        if (merge(g, m) != 0) {
            malformed(g, m);
        } else if (m->type == LOOMI_CMSG_AGREED) {
            /* A decision taken before this rank coordinated: it stands,
             * as it was (value and out-set), and every rank in hears it
             * again from here. */
            for (int q = 0; q < g->n; q++)
                if (q != g->me && !g->out[q])
                    loomi_ctrl_send(g->ctrl, q, LOOMI_CMSG_AGREED, 0, g->id, m->data, m->len);
            int st = adopt(g, m);
            free(m);
            return st;
        } else {
            int q = m->src;
            g->heard[q] = 1;
            g->vals[q] = loomi_le64_load(m->data);
            g->ops[q] = m->data[8];
        }
        free(m);
        if (g->out[g->me] || coordinator(g) != g->me) return ST_RESTART;
    }
    /* Decide: the ops must agree; the value over the ranks in. */
    unsigned status = AG_OK;
    uint64_t v = g->value;
    int odd = -1;
    for (int q = 0; q < g->n; q++) {
        if (g->out[q]) continue;
        if (g->ops[q] != (unsigned char)g->op && odd < 0) odd = q;
        if (g->op == LOOM_MIN ? g->vals[q] < v : g->vals[q] > v) v = g->vals[q];
    }
    if (odd >= 0) {
        status = AG_OPS;
        v = (uint64_t)odd;
    }
    if (!loomi_ctrl_quorum(g->out, g->n, g->comm->set.quorum_any)) status = AG_MINORITY;
    loomi_le64_store(g->msg, v);
    g->msg[8] = (unsigned char)status;
    memcpy(g->msg + HEAD, g->out, (size_t)g->n);
    for (int q = 0; q < g->n; q++)
        if (q != g->me && !g->out[q])
            loomi_ctrl_send(g->ctrl, q, LOOMI_CMSG_AGREED, 0, g->id, g->msg,
                            (uint32_t)(HEAD + g->n));
    struct loomi_cmsg self = {.src = g->me, .len = (uint32_t)(HEAD + g->n)};
    struct loomi_cmsg *m = malloc(sizeof self + self.len);
    if (!m) {
        g->err = loomi_fail(LOOM_ERR_NO_MEMORY, g->me, "%s: out of memory", g->fn);
        return ST_ERROR;
    }
    *m = self;
    memcpy(m->data, g->msg, self.len);
    int st = adopt(g, m);
    free(m);
    return st;
}

loom_result_t loomi_agree(struct loom_comm *comm, uint64_t *value, loom_op_t op,
                          unsigned char *decided, uint64_t deadline, const char *fn)
{
    uint64_t t0 = loomi_now_ms();
    struct agree g = {.comm = comm,
                      .ctrl = comm->ctrl,
                      .n = comm->nranks,
                      .me = comm->rank,
                      .id = ++comm->agree_seq,
                      .deadline = deadline,
                      .value = *value,
                      .op = op,
                      .fn = fn,
                      .decided = decided};
    g.out = malloc((size_t)g.n);
    g.heard = calloc((size_t)g.n, 1);
    g.vals = calloc((size_t)g.n, sizeof *g.vals);
    g.ops = calloc((size_t)g.n, 1);
    g.msg = malloc(HEAD + (size_t)g.n);
    int st = ST_ERROR;
    if (!g.out || !g.heard || !g.vals || !g.ops || !g.msg) {
        g.err = loomi_fail(LOOM_ERR_NO_MEMORY, g.me, "%s: out of memory", fn);
        goto out;
    }
    int coord = -1;
    do {
        refresh(&g);
        if (g.out[g.me]) {
            g.err = loomi_fail(LOOM_ERR_REVOKED, g.me,
                               "%s: the other ranks declared this rank failed; it must leave the "
                               "job",
                               fn);
            st = ST_ERROR;
            break;
        }
        if (!loomi_ctrl_quorum(g.out, g.n, comm->set.quorum_any)) {
            int alive = 0;
            for (int q = 0; q < g.n; q++) alive += !g.out[q];
            g.err = loomi_fail(LOOM_ERR_REVOKED, g.me,
                               "%s: this rank reaches only %d of the %d ranks: no majority, so "
                               "they may not go on (LOOM_QUORUM); this rank must leave the job",
                               fn, alive, g.n);
            st = ST_ERROR;
            break;
        }
        coord = coordinator(&g);
        st = coord == g.me ? coordinate(&g) : member(&g, coord);
        if (st == ST_RESTART && loomi_now_ms() >= g.deadline) {
            g.err = loomi_fail(LOOM_ERR_TIMEOUT, g.me, "%s: no agreement within LOOM_TIMEOUT (%d ms)",
                               fn, comm->set.timeout_ms);
            st = ST_ERROR;
        }
    } while (st == ST_RESTART);
out:
    free(g.out);
    free(g.heard);
    free(g.vals);
    free(g.ops);
    free(g.msg);
    if (st != ST_DONE) return g.err != LOOM_SUCCESS ? g.err : LOOM_ERR_INTERNAL;
    LOOMI_INFO(g.me, "%s: agreement %llu: %llu (%s, coordinator %d, %llu ms)", fn,
               (unsigned long long)g.id, (unsigned long long)g.result, op_word(op), coord,
               (unsigned long long)(loomi_now_ms() - t0));
    *value = g.result;
    return LOOM_SUCCESS;
}

loom_result_t loom_comm_agree(loom_comm_t h, uint64_t *value, loom_op_t op)
{
    const char *fn = "loom_comm_agree";
    struct loom_comm *comm;
    loom_result_t lr = loomi_comm_live_arg(h, fn, value, "value", &comm);
    if (lr != LOOM_SUCCESS) return lr;
    if (op != LOOM_MIN && op != LOOM_MAX)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, comm->rank,
                          "%s: op %d is not LOOM_MIN or LOOM_MAX", fn, (int)op);
    if (comm->nranks == 1) return LOOM_SUCCESS;
    if (!comm->ctrl)
        return loomi_fail(LOOM_ERR_UNSUPPORTED, comm->rank,
                          "%s: this communicator has no control plane (a local one)", fn);
    loom_result_t r = loomi_agree(comm, value, op, NULL,
                                  loomi_now_ms() + (uint64_t)comm->set.timeout_ms, fn);
    return r == LOOM_SUCCESS ? r : loomi_comm_out(comm, r);
}
