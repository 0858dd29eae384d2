/*
 * shrink.c - loom_comm_shrink: the survivors agree on who failed and
 * build a new communicator without them, over the old one's control
 * plane (whose connections between survivors still stand).
 *
 * The protocol, in rounds numbered by an epoch:
 *  - every survivor sends PROPOSE (its failed set) to the coordinator,
 *    the lowest rank it does not know failed;
 *  - the coordinator, once every rank it does not know failed has
 *    proposed, sends DECIDE(D): the failed set it then holds;
 *  - every survivor creates its part of the new communicator (ranks
 *    renumbered in the old order, failed ones left out) and sends its
 *    address (ADDR); the coordinator answers with everyone's (ALL) and
 *    all connect.
 * Failure sets only grow and travel with every message, so views
 * converge.  A member restarts (next epoch, next coordinator) only when
 * its coordinator fails; a coordinator that loses a member of the new
 * group before ALL decides again at the next epoch, and members follow
 * any message from a later epoch.  Everything has LOOM_TIMEOUT as its
 * deadline: at worst shrink fails, it never hangs.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "comm/ctrl.h"
#include "comm/net.h"
#include "comm/route.h"
#include "sched/sched.h"
#include "topo/select.h"
#include "topo/topo.h"

enum { ST_DONE = 0, ST_RESTART = 1, ST_ERROR = 2, ST_NOTHING = 3 };

struct shrink {
    struct loom_comm *old;
    struct loomi_ctrl *ctrl;
    int n, me;
    uint32_t epoch;
    uint64_t deadline;
    unsigned char *failed; /* [n] the current view */
    unsigned gen;
    unsigned char *proposed; /* [n] proposed to this rank as coordinator */
    struct loomi_cmsg *stash; /* messages of a later epoch, oldest first */
    struct loom_comm *nc;     /* the new communicator, being built */
    loom_result_t err;
    int grow;                 /* loom_comm_grow: admit joiners, keep comm if nothing to do */
    int nj, slots[LOOMI_CTRL_MAX_JOINERS]; /* joiners admitted (coordinator) */
    unsigned char *decided;   /* [n] the decision this rank built on */
    unsigned char *left;      /* [n] ranks some rank saw leave with a goodbye */
    unsigned char *seen;      /* [n] the failed set, as the guard reads it */
    const char *fn;
};

/* This rank's view, with the departures others told of. */
static void refresh(struct shrink *s)
{
    loomi_ctrl_failed(s->ctrl, s->failed, &s->gen);
    for (int q = 0; q < s->n; q++)
        if (s->failed[q] && s->left[q]) s->failed[q] = LOOMI_OUT_LEFT;
}

static int coordinator(const struct shrink *s)
{
    for (int q = 0; q < s->n; q++)
        if (!s->failed[q]) return q;
    return -1;
}

static void stash_front(struct shrink *s, struct loomi_cmsg *m)
{
    m->next = s->stash;
    s->stash = m;
}

/* The next message: stashed ones of this epoch first. */
static struct loomi_cmsg *next_msg(struct shrink *s)
{
    for (struct loomi_cmsg **l = &s->stash; *l; l = &(*l)->next)
        if ((*l)->epoch <= s->epoch) {
            struct loomi_cmsg *m = *l;
            *l = m->next;
            m->next = NULL;
            return m;
        }
    uint64_t d = loomi_now_ms() + 100;
    if (d > s->deadline) d = s->deadline;
    return loomi_ctrl_recv(s->ctrl, s->gen, d, LOOMI_CMSG_SHRINK);
}

static int alive_count(const unsigned char *D, int n)
{
    int k = 0;
    for (int q = 0; q < n; q++) k += !D[q];
    return k;
}

/* Whether the ranks not in D may go on (LOOM_QUORUM); when not, the
 * error, blamed on `who`. */
static int quorum(struct shrink *s, const unsigned char *D, const char *who)
{
    if (loomi_ctrl_quorum(D, s->n, s->old->set.quorum_any)) return 1;
    int left = 0;
    for (int q = 0; q < s->n; q++) left += D[q] == LOOMI_OUT_LEFT;
    char also[48] = "";
    if (left) snprintf(also, sizeof also, " (%d more left the job)", left);
    s->err = loomi_fail(LOOM_ERR_REVOKED, s->me,
                        "%s: %s only %d of the %d ranks%s: no majority, so this group may not "
                        "go on as the job (LOOM_QUORUM=majority); this rank must leave it",
                        s->fn, who, alive_count(D, s->n), s->n - left, also);
    return 0;
}

/* Take a sender's failed set (PROPOSE, DECIDE: its first n bytes) into
 * this rank's view. */
static int merge(struct shrink *s, const struct loomi_cmsg *m)
{
    if (m->len < (uint32_t)s->n) return -1;
    for (int q = 0; q < s->n; q++) {
        if (m->data[q] != 0 && m->data[q] != LOOMI_OUT && m->data[q] != LOOMI_OUT_LEFT)
            return -1;
        if (m->data[q] == LOOMI_OUT_LEFT) s->left[q] = 1;
        if (m->data[q] && !s->failed[q]) {
            char why[96];
            snprintf(why, sizeof why, "reported failed by rank %d while shrinking", m->src);
            loomi_ctrl_mark_failed(s->ctrl, q, why);
        }
    }
    return 0;
}

/* The guard of the new communicator's connection (loomi_guard_set): a
 * rank of the decision failed, a joiner being admitted left, or a later
 * round began: its connections will never all come. */
static int doomed(void *arg, char *msg, size_t n)
{
    struct shrink *s = arg;
    loomi_ctrl_failed(s->ctrl, s->seen, NULL);
    /* A departure is no news: a faster member done with the new
     * communicator destroys the old one. */
    for (int q = 0; q < s->n; q++)
        if (!s->decided[q] && s->seen[q] == LOOMI_OUT) {
            snprintf(msg, n, "rank %d failed while the new communicator was being connected", q);
            return 1;
        }
    for (int j = 0; j < s->nj; j++)
        if (!loomi_ctrl_joiner_alive(s->ctrl, s->slots[j])) {
            snprintf(msg, n, "a process being admitted left while the new communicator was "
                             "being connected");
            return 1;
        }
    if (loomi_ctrl_newer(s->ctrl, LOOMI_CMSG_SHRINK, s->epoch)) {
        snprintf(msg, n, "the coordinator started another round while the new communicator "
                         "was being connected");
        return 1;
    }
    return 0;
}

/* Connect the new communicator, giving up as soon as the guard says. */
static loom_result_t finish_new(struct shrink *s, const unsigned char *all)
{
    loomi_guard_set(doomed, s);
    loom_result_t r = loomi_comm_finish(s->nc, all, s->deadline, s->old->links);
    loomi_guard_set(NULL, NULL);
    return r;
}

static void drop_new(struct shrink *s)
{
    if (s->nc) loomi_comm_discard(s->nc);
    s->nc = NULL;
}

/* Create this rank's part of the communicator of the ranks not in D. */
static loom_result_t make_new(struct shrink *s, const unsigned char *D, int nj,
                              unsigned char *addr, int *newrank, int *newn)
{
    struct loom_comm *o = s->old;
    int k = 0, mine = -1;
    for (int q = 0; q < s->n; q++)
        if (!D[q]) {
            if (q == s->me) mine = k;
            k++;
        }
    k += nj; /* joiners come after the members */
    drop_new(s);
    struct loom_comm *c = calloc(1, sizeof *c);
    if (!c) return loomi_fail(LOOM_ERR_NO_MEMORY, s->me, "loom_comm_shrink: out of memory");
    c->rank = mine;
    c->nranks = k;
    c->failed_rank = -1;
    c->set = o->set;
    memcpy(c->algo_forced, o->algo_forced, sizeof c->algo_forced);
    memcpy(c->job_key, o->job_key, sizeof c->job_key);
    c->tops = o->tops;
    c->route_mask = o->route_mask;
    c->bind_addr = o->bind_addr;
    c->bind_len = o->bind_len;
    c->rdv_addr = o->rdv_addr;
    c->rdv_len = o->rdv_len;
    s->nc = c;
    *newrank = mine;
    *newn = k;
    return loomi_comm_prepare(c, &o->topo->ranks[o->rank], addr);
}

static int member(struct shrink *s, int coord)
{
    const int n = s->n;
    uint32_t e = s->epoch;
    s->nj = 0; /* joiners are the coordinator's (this rank may have been one) */
    if (loomi_ctrl_send(s->ctrl, coord, LOOMI_CMSG_PROPOSE, e, 0, s->failed, (uint32_t)n) !=
        LOOM_SUCCESS)
        return ST_RESTART; /* it failed meanwhile */
    int newrank = -1, newn = 0;
    unsigned char addr[LOOMI_ADDR_BYTES];
    for (;;) {
        struct loomi_cmsg *m = next_msg(s);
        if (!m) {
            if (loomi_now_ms() >= s->deadline) {
                s->err = loomi_fail(LOOM_ERR_TIMEOUT, s->me,
                                    "loom_comm_shrink: no decision from rank %d within "
                                    "LOOM_TIMEOUT (%d ms)",
                                    coord, s->old->set.timeout_ms);
                return ST_ERROR;
            }
            refresh(s);
            if (s->failed[s->me] || s->failed[coord]) return ST_RESTART;
            continue;
        }
        if (m->epoch > e) { /* the others moved on: follow */
            s->epoch = m->epoch;
            stash_front(s, m);
            return ST_RESTART;
        }
        int bad = 0;
        switch (m->type) {
        case LOOMI_CMSG_PROPOSE:
            /* Someone takes this rank for the coordinator: its view has
             * failures this one lacks.  Keep it for when that is so. */
            bad = merge(s, m);
            if (!bad) {
                s->proposed[m->src] = 1; /* counted when this rank coordinates */
                free(m);
                refresh(s);
                if (coordinator(s) != coord) return ST_RESTART;
                continue;
            }
            break;
        case LOOMI_CMSG_DECIDE:
            if (m->epoch < e) break; /* stale */
            if (m->src != coord) {
                refresh(s);
                if (coordinator(s) != m->src) break; /* not ours (yet) */
                coord = m->src;
            }
            if (m->len != (uint32_t)n && m->len != (uint32_t)n + 4) {
                bad = 1;
                break;
            }
            bad = merge(s, m);
            if (bad) break;
            if (m->arg == 1) { /* grow with nothing to do: keep the communicator */
                free(m);
                return ST_NOTHING;
            }
            if (!quorum(s, m->data, "the coordinator found") || m->arg == 2) {
                if (s->err == LOOM_SUCCESS) /* its rule differs: uniform.c refuses that */
                    s->err = loomi_fail(LOOM_ERR_REVOKED, s->me,
                                        "%s: the coordinator found no quorum", s->fn);
                free(m);
                return ST_ERROR;
            }
            uint32_t nj = 0;
            if (m->len == (uint32_t)n + 4)
                nj = (uint32_t)m->data[n] | (uint32_t)m->data[n + 1] << 8 |
                     (uint32_t)m->data[n + 2] << 16 | (uint32_t)m->data[n + 3] << 24;
            if (nj > LOOMI_CTRL_MAX_JOINERS) {
                bad = 1;
                break;
            }
            if (m->data[s->me]) {
                s->err = loomi_fail(LOOM_ERR_REVOKED, s->me,
                                    "loom_comm_shrink: the survivors counted this rank as failed");
                free(m);
                return ST_ERROR;
            }
            s->err = make_new(s, m->data, (int)nj, addr, &newrank, &newn);
            if (s->err != LOOM_SUCCESS) {
                free(m);
                return ST_ERROR;
            }
            memcpy(s->decided, m->data, (size_t)n);
            if (loomi_ctrl_send(s->ctrl, coord, LOOMI_CMSG_ADDR, e, (uint64_t)newrank, addr,
                                LOOMI_ADDR_BYTES) != LOOM_SUCCESS) {
                free(m);
                return ST_RESTART;
            }
            break;
        case LOOMI_CMSG_ALL:
            if (m->epoch < e || m->src != coord || !s->nc) break;
            if (m->len != (uint32_t)newn * LOOMI_ADDR_BYTES || m->arg != (uint64_t)newn ||
                memcmp(m->data + (size_t)newrank * LOOMI_ADDR_BYTES, addr, LOOMI_ADDR_BYTES)) {
                bad = 1;
                break;
            }
            s->err = finish_new(s, m->data);
            free(m);
            if (s->err != LOOM_SUCCESS) {
                LOOMI_WARN(s->me, "shrink: connecting the new communicator failed (%s); again",
                           loom_get_last_error());
                drop_new(s);
                return ST_RESTART;
            }
            return ST_DONE;
        default:
            break; /* ADDR: only coordinators take them */
        }
        if (bad) {
            char why[96];
            snprintf(why, sizeof why, "sent a malformed shrink message (type %u)", m->type);
            loomi_ctrl_mark_failed(s->ctrl, m->src, why);
        }
        free(m);
    }
}

static int coordinate(struct shrink *s)
{
    const int n = s->n;
    uint32_t e = s->epoch;
    unsigned char *D = malloc((size_t)n + 4), *have = calloc((size_t)n, 1);
    unsigned char *all = NULL;
    unsigned char addr[LOOMI_ADDR_BYTES];
    int jhave[LOOMI_CTRL_MAX_JOINERS];
    int newrank = -1, newn = 0, alive = 0, decided = 0, st = ST_ERROR;
    if (!D || !have) {
        s->err = loomi_fail(LOOM_ERR_NO_MEMORY, s->me, "loom_comm_shrink: out of memory");
        goto out;
    }
    for (;;) {
        refresh(s);
        if (s->failed[s->me]) {
            st = ST_RESTART;
            goto out;
        }
        if (decided) {
            /* A member of the new group failed before every address was
             * in: decide again, at the next epoch. */
            for (int q = 0; q < n; q++)
                if (!D[q] && s->failed[q]) {
                    st = ST_RESTART;
                    goto out;
                }
            for (int j = 0; j < s->nj; j++)
                if (!jhave[j] && !loomi_ctrl_joiner_alive(s->ctrl, s->slots[j])) {
                    LOOMI_WARN(s->me, "shrink: a joiner left during its admission; again");
                    st = ST_RESTART;
                    goto out;
                }
        } else {
            int waiting = 0;
            for (int q = 0; q < n; q++)
                if (q != s->me && !s->failed[q] && !s->proposed[q]) waiting = 1;
            if (!waiting) {
                memcpy(D, s->failed, (size_t)n);
                alive = alive_count(D, n);
                s->nj = 0;
                if (s->grow) {
                    int k = loomi_ctrl_admit(s->ctrl, s->slots, LOOMI_CTRL_MAX_JOINERS);
                    for (int j = 0; j < k; j++)
                        if (loomi_ctrl_joiner_alive(s->ctrl, s->slots[j]))
                            s->slots[s->nj++] = s->slots[j];
                }
                /* Growing with nobody failed and nobody to admit: keep comm. */
                int nothing = s->grow && alive == n && s->nj == 0;
                /* A minority is told so, and nobody goes on. */
                int minority = !quorum(s, D, "this rank, coordinating, reaches");
                if (minority) s->nj = 0;
                uint32_t nj = (uint32_t)s->nj;
                for (int i = 0; i < 4; i++) D[n + i] = (unsigned char)(nj >> (8 * i));
                for (int q = 0; q < n; q++)
                    if (q != s->me && !D[q])
                        loomi_ctrl_send(s->ctrl, q, LOOMI_CMSG_DECIDE, e,
                                        minority ? 2 : nothing ? 1 : 0, D, (uint32_t)n + 4);
                if (minority) goto out;
                if (nothing) {
                    st = ST_NOTHING;
                    goto out;
                }
                memcpy(s->decided, D, (size_t)n);
                s->err = make_new(s, D, s->nj, addr, &newrank, &newn);
                if (s->err != LOOM_SUCCESS) goto out;
                /* Joiners learn their rank, the links (measured once) and
                 * the settings they must share (join.c checks them). */
                struct loomi_join_accept acc;
                memset(&acc, 0, sizeof acc);
                acc.links = *s->old->links;
                loomi_uniform_fill(&acc.uniform, &s->old->set, s->old->algo_forced, s->old->route_mask,
                                   0);
                for (int j = 0; j < s->nj; j++) {
                    jhave[j] = 0;
                    uint64_t arg = (uint64_t)(alive + j) | (uint64_t)newn << 32;
                    loomi_ctrl_send(s->ctrl, s->slots[j], LOOMI_CMSG_ACCEPT, e, arg, &acc,
                                    (uint32_t)sizeof acc);
                }
                free(all);
                all = malloc((size_t)newn * LOOMI_ADDR_BYTES);
                if (!all) {
                    s->err = loomi_fail(LOOM_ERR_NO_MEMORY, s->me, "loom_comm_shrink: out of memory");
                    goto out;
                }
                memset(have, 0, (size_t)n);
                memcpy(all + (size_t)newrank * LOOMI_ADDR_BYTES, addr, LOOMI_ADDR_BYTES);
                have[s->me] = 1;
                decided = 1;
            }
        }
        if (decided) {
            int missing = 0;
            for (int q = 0; q < n; q++)
                if (!D[q] && !have[q]) missing = 1;
            for (int j = 0; j < s->nj; j++)
                if (!jhave[j]) missing = 1;
            if (!missing) {
                for (int q = 0; q < n; q++)
                    if (q != s->me && !D[q])
                        loomi_ctrl_send(s->ctrl, q, LOOMI_CMSG_ALL, e, (uint64_t)newn, all,
                                        (uint32_t)((size_t)newn * LOOMI_ADDR_BYTES));
                for (int j = 0; j < s->nj; j++)
                    loomi_ctrl_send(s->ctrl, s->slots[j], LOOMI_CMSG_ALL, e, (uint64_t)newn, all,
                                    (uint32_t)((size_t)newn * LOOMI_ADDR_BYTES));
                s->err = finish_new(s, all);
                if (s->err != LOOM_SUCCESS) {
                    LOOMI_WARN(s->me, "shrink: connecting the new communicator failed (%s); again",
                               loom_get_last_error());
                    drop_new(s);
                    st = ST_RESTART;
                    goto out;
                }
                loomi_ctrl_joiners_done(s->ctrl);
                st = ST_DONE;
                goto out;
            }
        }
        struct loomi_cmsg *m = next_msg(s);
        if (!m) {
            if (loomi_now_ms() >= s->deadline) {
                s->err = loomi_fail(LOOM_ERR_TIMEOUT, s->me,
                                    "loom_comm_shrink: the survivors did not all answer within "
                                    "LOOM_TIMEOUT (%d ms)",
                                    s->old->set.timeout_ms);
                goto out;
            }
            continue;
        }
        if (m->src >= n) { /* a joiner's address */
            int j = 0;
            while (j < s->nj && s->slots[j] != m->src) j++;
            if (decided && m->epoch == e && j < s->nj && m->type == LOOMI_CMSG_ADDR &&
                m->len == LOOMI_ADDR_BYTES && m->arg == (uint64_t)(alive + j)) {
                memcpy(all + (size_t)(alive + j) * LOOMI_ADDR_BYTES, m->data, LOOMI_ADDR_BYTES);
                jhave[j] = 1;
            }
            free(m);
            continue;
        }
        if (m->epoch > e) {
            s->epoch = m->epoch;
            stash_front(s, m);
            st = ST_RESTART;
            goto out;
        }
        int bad = 0;
        switch (m->type) {
        case LOOMI_CMSG_PROPOSE:
            bad = m->len != (uint32_t)n || merge(s, m);
            if (!bad) s->proposed[m->src] = 1;
            break;
        case LOOMI_CMSG_DECIDE:
            /* From a rank that takes itself for the coordinator: its view
             * has failures this one lacks (merged: the next pass sees
             * whether this rank still coordinates). */
            if (m->epoch == e) bad = merge(s, m);
            break;
        case LOOMI_CMSG_ADDR: {
            if (!decided || m->epoch != e) break;
            int q = m->src, k = 0;
            for (int i = 0; i < q; i++) k += !D[i];
            if (D[q] || m->len != LOOMI_ADDR_BYTES || m->arg != (uint64_t)k) {
                bad = 1;
                break;
            }
            memcpy(all + (size_t)k * LOOMI_ADDR_BYTES, m->data, LOOMI_ADDR_BYTES);
            have[q] = 1;
            break;
        }
        default:
            break;
        }
        if (bad) {
            char why[96];
            snprintf(why, sizeof why, "sent a malformed shrink message (type %u)", m->type);
            loomi_ctrl_mark_failed(s->ctrl, m->src, why);
        }
        free(m);
        /* Still the coordinator? */
        refresh(s);
        if (coordinator(s) != s->me) {
            st = ST_RESTART;
            goto out;
        }
    }
out:
    free(D);
    free(have);
    free(all);
    return st;
}

static loom_result_t reconfigure(loom_comm_t h, loom_comm_t *newcomm, int grow,
                                 const char *fn)
{
    if (!newcomm) return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1, "%s: newcomm is NULL", fn);
    struct loom_comm *comm;
    loom_result_t lr = loomi_comm_live(h, fn, &comm);
    if (lr != LOOM_SUCCESS) return lr;
    if (!comm->ctrl || !comm->topo)
        return loomi_fail(LOOM_ERR_UNSUPPORTED, comm->rank,
                          "%s: this communicator has no control plane (a local one)", fn);
    *newcomm = NULL;
    uint64_t t0 = loomi_now_ms();
    /* Shrinking revokes: operations still running fail everywhere, and
     * the ranks blocked in them come here too.  Growing does not: when
     * nobody failed and nobody waits to join, comm goes on. */
    if (!grow) {
        if (loomi_comm_sync(comm) == LOOM_SUCCESS)
            loomi_comm_fail(comm, LOOM_ERR_REVOKED, -1, "revoked by loom_comm_shrink on rank %d",
                            comm->rank);
        loomi_engine_fail_all(comm);
    } else if (comm->nlive) {
        return loomi_fail(LOOM_ERR_INVALID_USAGE, comm->rank,
                          "%s: %d operation(s) still pending; wait for them first", fn,
                          comm->nlive);
    }

    struct shrink s;
    memset(&s, 0, sizeof s);
    s.old = comm;
    s.ctrl = comm->ctrl;
    s.n = comm->nranks;
    s.me = comm->rank;
    s.deadline = t0 + (uint64_t)comm->set.timeout_ms;
    s.fn = fn;
    s.failed = malloc((size_t)s.n);
    s.proposed = calloc((size_t)s.n, 1);
    s.decided = malloc((size_t)s.n);
    s.left = calloc((size_t)s.n, 1);
    s.seen = malloc((size_t)s.n);
    if (!s.failed || !s.proposed || !s.decided || !s.left || !s.seen) {
        free(s.failed);
        free(s.proposed);
        free(s.decided);
        free(s.left);
        free(s.seen);
        return loomi_fail(LOOM_ERR_NO_MEMORY, comm->rank, "%s: out of memory", fn);
    }
    s.epoch = comm->shrink_epoch + 1;
    s.grow = grow;
    int st;
    int coord = -1;
    do {
        refresh(&s);
        if (s.failed[s.me]) {
            s.err = loomi_fail(LOOM_ERR_REVOKED, s.me,
                               "%s: the other ranks declared this rank failed", fn);
            st = ST_ERROR;
            break;
        }
        /* Failed sets only grow: a view without a quorum never gets one. */
        if (!quorum(&s, s.failed, "this rank reaches")) {
            st = ST_ERROR;
            break;
        }
        coord = coordinator(&s);
        uint32_t e = s.epoch;
        st = coord == s.me ? coordinate(&s) : member(&s, coord);
        /* A round that failed goes again at the next epoch (unless it
         * followed the others to a later one already). */
        if (st == ST_RESTART && s.epoch == e) s.epoch++;
        if (st == ST_RESTART && loomi_now_ms() >= s.deadline) {
            s.err = loomi_fail(LOOM_ERR_TIMEOUT, s.me, "%s: no agreement within LOOM_TIMEOUT (%d ms)",
                               fn, comm->set.timeout_ms);
            st = ST_ERROR;
        }
    } while (st == ST_RESTART);
    comm->shrink_epoch = s.epoch;
    while (s.stash) {
        struct loomi_cmsg *m = s.stash;
        s.stash = m->next;
        free(m);
    }
    free(s.failed);
    free(s.proposed);
    free(s.left);
    free(s.seen);
    if (st == ST_NOTHING) {
        free(s.decided);
        drop_new(&s);
        return LOOM_SUCCESS; /* *newcomm stays NULL */
    }
    if (st != ST_DONE) {
        free(s.decided);
        drop_new(&s);
        /* Out of the job: comm says so from now on (loom_comm_get_error). */
        return loomi_comm_out(comm, s.err != LOOM_SUCCESS ? s.err : LOOM_ERR_INTERNAL);
    }
    free(comm->agreed_failed);
    comm->agreed_failed = s.decided;
    LOOMI_INFO(comm->rank, "%s: rank %d is rank %d of %d in the new communicator "
               "(epoch %u, coordinator %d, %llu ms)",
               fn, comm->rank, s.nc->rank, s.nc->nranks, s.epoch, coord,
               (unsigned long long)(loomi_now_ms() - t0));
    *newcomm = s.nc->handle;
    return LOOM_SUCCESS;
}

loom_result_t loom_comm_shrink(loom_comm_t comm, loom_comm_t *newcomm)
{
    return reconfigure(comm, newcomm, 0, "loom_comm_shrink");
}

loom_result_t loom_comm_grow(loom_comm_t comm, loom_comm_t *newcomm)
{
    return reconfigure(comm, newcomm, 1, "loom_comm_grow");
}

loom_result_t loom_comm_pending_joins(loom_comm_t h, int *count)
{
    const char *fn = "loom_comm_pending_joins";
    if (!count) return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1, "%s: count is NULL", fn);
    struct loom_comm *comm;
    loom_result_t lr = loomi_comm_live(h, fn, &comm);
    if (lr != LOOM_SUCCESS) return lr;
    *count = comm->ctrl ? loomi_ctrl_pending(comm->ctrl) : 0;
    return LOOM_SUCCESS;
}
