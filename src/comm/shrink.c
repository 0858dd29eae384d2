/*
 * shrink.c - loom_comm_shrink and loom_comm_grow: the survivors agree on
 * who failed (and which waiting processes come in) and build a new
 * communicator of the others, over the old one's control plane (whose
 * connections between survivors still stand).
 *
 * Each attempt is three steps, every one of them taken by every rank not
 * known failed, so that no rank can be in one step while another is in
 * a later one:
 *  1. membership: an agreement (agree.c) whose decision is the set D of
 *     ranks out, and, for a grow, how many of the processes waiting at
 *     the join service (held by the lowest rank alive) come in: the
 *     holder contributes that count, the others 0, and the maximum is
 *     decided.  The agreement is uniform (every rank that gets a decision
 *     gets the same one) and needs a majority (LOOM_QUORUM);
 *  2. build: every rank not in D creates its part of the new
 *     communicator and sends its address (ADDR) to the lowest of them;
 *     it answers with everyone's (ALL), admitted joiners included, and
 *     all connect and measure the new group.  A rank that gives up here
 *     tells the others (GIVEUP), and every wait of this step ends when a
 *     rank of the new group fails or gives up (the guard, core/util.c);
 *  3. commit: an agreement on whether every rank built its part (the
 *     minimum of 0/1).  On 1 every rank keeps the new communicator; on 0
 *     every rank discards it and the next attempt begins.
 * The commit is what makes the outcome all or nothing: without it a
 * rank whose part completed kept a communicator the others, failing a
 * moment later, had given up, and went on in a group of its own.
 * Everything has LOOM_TIMEOUT as its deadline: at worst shrink fails, it
 * never hangs.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "comm/ctrl.h"
#include "transports/net.h"
#include "transports/route.h"
#include "sched/sched.h"
#include "topo/select.h"
#include "topo/topo.h"

/* Messages of step 2 (type, arg): ADDR (the sender's new rank; a member
 * giving up before it has one sends GIVEUP instead), ALL (the new size;
 * 0 with no payload: the round is given up; to a joiner after step 3,
 * ALL_COMMIT or 0), GIVEUP.  Their epoch is the attempt's round number. */
#define ALL_COMMIT LOOMI_CTRL_ALL_COMMIT

struct shrink {
    struct loom_comm *old;
    struct loomi_ctrl *ctrl;
    int n, me;
    uint32_t round;           /* the attempt (messages of others are stale) */
    uint64_t deadline;
    unsigned char *D;         /* [n] the membership decision: ranks out */
    unsigned char *seen;      /* [n] the failed set, as the guard reads it */
    /* The new group: its members' ranks in old (parent) numbering, in
     * their new order, and each old rank's new rank (-1: not in it). */
    int *members, nmembers;
    int *newrank_of;          /* [n] */
    /* What the new communicator is made with: the old one's for a
     * shrink, the caller's for a split (loomi_comm_child). */
    const struct loomi_settings *set;
    const int *algo_forced;
    unsigned route_mask;
    int serve_joins;          /* it takes over the old one's join service */
    struct loom_comm *nc;     /* the new communicator, being built */
    int newrank, newn, coord; /* this rank in it, its size, step 2's coordinator */
    loom_result_t err;
    int grow;
    int holder;               /* this rank admitted the joiners (it holds the service) */
    int nj, slots[LOOMI_CTRL_MAX_JOINERS]; /* joiners: the decided count; the holder's slots */
    const char *fn;
    const uint32_t *pair_seq; /* a create_group's (loomi_child_spec), else NULL */
};

/* A shrink, grow or child of old, made with those settings. */
static void shrink_init(struct shrink *s, struct loom_comm *old, const char *fn,
                        uint64_t deadline, const struct loomi_settings *set,
                        const int *algo_forced, unsigned route_mask)
{
    *s = (struct shrink){.old = old, .ctrl = old->ctrl, .n = old->nranks, .me = old->rank,
                         .deadline = deadline, .fn = fn, .set = set,
                         .algo_forced = algo_forced, .route_mask = route_mask};
}

static int alive_count(const unsigned char *D, int n)
{
    int k = 0;
    for (int q = 0; q < n; q++) k += !D[q];
    return k;
}

/* Old rank q is in the new group. */
static int member(const struct shrink *s, int q) { return s->newrank_of[q] >= 0; }

/* The new group of a shrink or grow: the ranks not in D, in their old
 * order. */
static void members_from(struct shrink *s)
{
    s->nmembers = 0;
    for (int q = 0; q < s->n; q++) {
        s->newrank_of[q] = s->D[q] ? -1 : s->nmembers;
        if (!s->D[q]) s->members[s->nmembers++] = q;
    }
}

/* A round given up: every rank of the new group hears it. */
static void give_up(struct shrink *s, const char *why)
{
    LOOMI_INFO(s->me, "%s: round %u given up: %s", s->fn, s->round, why);
    for (int q = 0; q < s->n; q++)
        if (q != s->me && member(s, q)) {
            if (s->pair_seq)
                loomi_ctrl_send(s->ctrl, q, LOOMI_CMSG_GROUP, s->pair_seq[q], LOOMI_GRP_GIVEUP,
                                NULL, 0);
            else
                loomi_ctrl_send(s->ctrl, q, LOOMI_CMSG_GIVEUP, s->round, 0, NULL, 0);
        }
}

/* A create_group's member gave up (or failed its checks) in this create. */
static int group_gave_up(const struct loomi_cmsg *m, void *arg)
{
    const struct shrink *s = arg;
    const uint64_t kind = m->arg & 0xff;
    return m->type == LOOMI_CMSG_GROUP && m->src >= 0 && m->src < s->n &&
           s->newrank_of[m->src] >= 0 && m->epoch == s->pair_seq[m->src] &&
           (kind == LOOMI_GRP_GIVEUP || kind == LOOMI_GRP_FAIL);
}

/* A GIVEUP of this round in the mailbox (taken out of it). */
static int given_up(struct shrink *s)
{
    for (;;) {
        struct loomi_cmsg *m = loomi_ctrl_take(s->ctrl, LOOMI_CMSG_GIVEUP, 0);
        if (!m) return 0;
        int now = m->epoch == s->round;
        free(m);
        if (now) return 1;
    }
}

/* The guard of step 2 (loomi_guard_set): a rank of the new group failed,
 * a joiner being admitted left, or a rank gave the round up: its
 * connections will never all come. */
static int doomed(void *arg, char *msg, size_t n)
{
    struct shrink *s = arg;
    loomi_ctrl_failed(s->ctrl, s->seen, NULL);
    /* A departure is no news: a faster rank done with the new group
     * destroys the old communicator. */
    for (int q = 0; q < s->n; q++)
        if (member(s, q) && s->seen[q] == LOOMI_OUT) {
            snprintf(msg, n, "rank %d failed while the new communicator was being connected", q);
            return 1;
        }
    for (int j = 0; s->holder && j < s->nj; j++)
        if (!loomi_ctrl_joiner_alive(s->ctrl, s->slots[j])) {
            snprintf(msg, n, "a process being admitted left while the new communicator was "
                             "being connected");
            return 1;
        }
    if (s->pair_seq ? loomi_ctrl_peek(s->ctrl, group_gave_up, s)
                    : loomi_ctrl_newer(s->ctrl, LOOMI_CMSG_BIT(LOOMI_CMSG_GIVEUP), s->round - 1)) {
        snprintf(msg, n, "another rank gave the round up");
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

/* Create this rank's part of the communicator of the ranks not in D and
 * the nj joiners; its address in addr. */
static loom_result_t make_new(struct shrink *s, unsigned char *addr)
{
    struct loom_comm *o = s->old;
    const int mine = s->newrank_of[s->me];
    const int k = s->nmembers + s->nj; /* joiners come after the members */
    drop_new(s);
    struct loom_comm *c = calloc(1, sizeof *c);
    if (!c) return loomi_fail(LOOM_ERR_NO_MEMORY, s->me, "%s: out of memory", s->fn);
    loomi_comm_engine_bind(c);
    c->rank = mine;
    c->nranks = k;
    c->failed_rank = -1;
    c->set = *s->set;
    memcpy(c->algo_forced, s->algo_forced, sizeof c->algo_forced);
    memcpy(c->job_key, o->job_key, sizeof c->job_key);
    c->eng.tops = o->eng.tops;
    c->route_mask = s->route_mask;
    c->bind_addr = o->bind_addr;
    c->bind_len = o->bind_len;
    if (s->serve_joins) {
        c->rdv_addr = o->rdv_addr;
        c->rdv_len = o->rdv_len;
        c->rdv_keyed = o->rdv_keyed;
    }
    c->rdv_fd = -1;
    s->nc = c;
    s->newrank = mine;
    s->newn = k;
    return loomi_comm_prepare(c, &o->topo->ranks[o->rank], addr);
}

/* The next message of step 2 for this round (stale ones dropped), or
 * NULL after a short wait. */
static struct loomi_cmsg *next_msg(struct shrink *s)
{
    for (;;) {
        uint64_t d = loomi_now_ms() + 20;
        if (d > s->deadline) d = s->deadline;
        unsigned gen;
        loomi_ctrl_failed(s->ctrl, NULL, &gen);
        struct loomi_cmsg *m = loomi_ctrl_recv(s->ctrl, gen, d, LOOMI_CMSG_SHRINK);
        if (!m || m->epoch == s->round) return m;
        free(m);
    }
}

/* Why waiting in step 2 is over, or NULL to go on waiting. */
static const char *wait_over(struct shrink *s, char *why, size_t n)
{
    if (loomi_now_ms() >= s->deadline) return "LOOM_TIMEOUT passed";
    if (doomed(s, why, n)) return why;
    return NULL;
}

/* Step 2 on the lowest rank of the new group: collect the addresses,
 * send everyone's, connect. */
static loom_result_t build_coordinator(struct shrink *s, const unsigned char *addr)
{
    const size_t ab = LOOMI_ADDR_BYTES;
    unsigned char *all = calloc((size_t)s->newn, ab), *have = calloc((size_t)s->newn, 1);
    loom_result_t r = LOOM_SUCCESS;
    if (!all || !have) {
        r = loomi_fail(LOOM_ERR_NO_MEMORY, s->me, "%s: out of memory", s->fn);
        goto out;
    }
    memcpy(all + (size_t)s->newrank * ab, addr, ab);
    have[s->newrank] = 1;
    const int members = s->newn - s->nj;
    /* Joiners learn their rank, the links (measured once) and the
     * settings they must share (join.c checks them). */
    if (s->nj) {
        struct loomi_join_accept acc;
        memset(&acc, 0, sizeof acc);
        acc.links = *s->old->links;
        loomi_uniform_fill(&acc.uniform, &s->old->set, s->old->algo_forced, s->old->route_mask,
                           0);
        for (int j = 0; j < s->nj; j++) {
            uint64_t arg = (uint64_t)(members + j) | (uint64_t)s->newn << 32;
            loomi_ctrl_send(s->ctrl, s->slots[j], LOOMI_CMSG_ACCEPT, s->round, arg, &acc,
                            (uint32_t)sizeof acc);
        }
    }
    for (;;) {
        int missing = 0;
        for (int k = 0; k < s->newn; k++) missing += !have[k];
        if (!missing) break;
        char why[200];
        const char *over = wait_over(s, why, sizeof why);
        if (over) {
            r = loomi_fail(LOOM_ERR_REMOTE, s->me, "%s: %d address(es) of the new group "
                           "missing: %s", s->fn, missing, over);
            goto out;
        }
        struct loomi_cmsg *m = next_msg(s);
        if (!m) continue;
        int bad = 0;
        if (m->type == LOOMI_CMSG_GIVEUP) {
            free(m);
            r = loomi_fail(LOOM_ERR_REMOTE, s->me, "%s: a rank of the new group gave up", s->fn);
            goto out;
        }
        if (m->type == LOOMI_CMSG_ADDR) {
            int k = -1;
            if (m->src >= s->n) { /* a joiner: its slot says which */
                for (int j = 0; s->holder && j < s->nj; j++)
                    if (s->slots[j] == m->src) k = members + j;
            } else {
                k = s->newrank_of[m->src];
            }
            if (k < 0 || m->len != ab || m->arg != (uint64_t)k) bad = 1;
            else {
                memcpy(all + (size_t)k * ab, m->data, ab);
                have[k] = 1;
            }
        }
        if (bad && m->src < s->n) {
            char w[96];
            snprintf(w, sizeof w, "sent a malformed shrink message (type %u)", m->type);
            loomi_ctrl_mark_failed(s->ctrl, m->src, w);
        }
        free(m);
    }
    for (int q = 0; q < s->n; q++)
        if (q != s->me && member(s, q))
            loomi_ctrl_send(s->ctrl, q, LOOMI_CMSG_ALL, s->round, (uint64_t)s->newn, all,
                            (uint32_t)((size_t)s->newn * ab));
    for (int j = 0; j < s->nj; j++)
        loomi_ctrl_send(s->ctrl, s->slots[j], LOOMI_CMSG_ALL, s->round, (uint64_t)s->newn, all,
                        (uint32_t)((size_t)s->newn * ab));
    r = finish_new(s, all);
out:
    free(all);
    free(have);
    return r;
}

/* Step 2 on the other ranks of the new group. */
static loom_result_t build_member(struct shrink *s, const unsigned char *addr)
{
    if (loomi_ctrl_send(s->ctrl, s->coord, LOOMI_CMSG_ADDR, s->round, (uint64_t)s->newrank, addr,
                        LOOMI_ADDR_BYTES) != LOOM_SUCCESS)
        return loomi_fail(LOOM_ERR_REMOTE, s->me, "%s: rank %d, which gathers the addresses, "
                          "failed", s->fn, s->coord);
    for (;;) {
        char why[200];
        const char *over = wait_over(s, why, sizeof why);
        if (over)
            return loomi_fail(LOOM_ERR_REMOTE, s->me, "%s: no addresses from rank %d: %s", s->fn,
                              s->coord, over);
        struct loomi_cmsg *m = next_msg(s);
        if (!m) continue;
        if (m->type == LOOMI_CMSG_GIVEUP) {
            free(m);
            return loomi_fail(LOOM_ERR_REMOTE, s->me, "%s: a rank of the new group gave up",
                              s->fn);
        }
        if (m->type != LOOMI_CMSG_ALL || m->src != s->coord) {
            free(m);
            continue;
        }
        if (m->arg != (uint64_t)s->newn || m->len != (uint32_t)s->newn * LOOMI_ADDR_BYTES ||
            memcmp(m->data + (size_t)s->newrank * LOOMI_ADDR_BYTES, addr, LOOMI_ADDR_BYTES)) {
            free(m);
            loomi_ctrl_mark_failed(s->ctrl, s->coord, "sent malformed addresses in a shrink");
            return loomi_fail(LOOM_ERR_REMOTE, s->me, "%s: rank %d sent malformed addresses",
                              s->fn, s->coord);
        }
        loom_result_t r = finish_new(s, m->data);
        free(m);
        return r;
    }
}

/* One attempt: returns 1 (done: s->nc, or NULL for a grow with nothing to
 * do), 0 (go again) or -1 (error in s->err). */
static int attempt(struct shrink *s)
{
    /* 1. Membership.  The holder of the join service admits the waiting
     * processes now, before it knows whether it coordinates. */
    uint64_t nj = 0;
    s->holder = 0;
    s->nj = 0;
    if (s->grow) {
        int k = loomi_ctrl_admit(s->ctrl, s->slots, LOOMI_CTRL_MAX_JOINERS), live = 0;
        for (int j = 0; j < k; j++)
            if (loomi_ctrl_joiner_alive(s->ctrl, s->slots[j])) s->slots[live++] = s->slots[j];
        s->holder = live > 0;
        s->nj = live;
        nj = (uint64_t)live;
    }
    loom_result_t r = loomi_agree(s->old, &nj, LOOM_MAX, s->D, s->deadline, s->fn);
    if (r != LOOM_SUCCESS) {
        s->err = r;
        return -1;
    }
    s->round = (uint32_t)s->old->agree_seq;
    if (s->D[s->me]) {
        s->err = loomi_fail(LOOM_ERR_REVOKED, s->me,
                            "%s: the survivors counted this rank as failed", s->fn);
        return -1;
    }
    if (nj > LOOMI_CTRL_MAX_JOINERS) {
        s->err = loomi_fail(LOOM_ERR_REMOTE, s->me, "%s: %llu joiners decided", s->fn,
                            (unsigned long long)nj);
        return -1;
    }
    const int held = s->holder ? (int)s->nj : 0; /* this rank's admitted joiners */
    s->nj = (int)nj;
    if (s->grow && alive_count(s->D, s->n) == s->n && s->nj == 0) return 1; /* nothing to do */
    members_from(s);
    s->coord = s->members[0];

    /* 2. Build. */
    unsigned char addr[LOOMI_ADDR_BYTES];
    r = make_new(s, addr);
    if (r == LOOM_SUCCESS) {
        /* The joiners are the holder's to gather: it must be the lowest
         * of the new group, and hold as many as were decided (else the
         * holder that admitted them failed, and they with it). */
        if (s->nj && (s->coord == s->me) != (held == s->nj))
            r = loomi_fail(LOOM_ERR_REMOTE, s->me, "%s: the %d process(es) being admitted are "
                           "not held by rank %d, which gathers the addresses", s->fn, s->nj,
                           s->coord);
        else if (s->coord == s->me)
            r = build_coordinator(s, addr);
        else
            r = build_member(s, addr);
    }
    int built = r == LOOM_SUCCESS;
    if (!built) {
        s->err = r;
        give_up(s, loom_get_last_error());
    }

    s->holder = s->holder && s->coord == s->me && held == s->nj;

    /* 3. Commit, or not, everywhere alike. */
    uint64_t ok = (uint64_t)built;
    r = loomi_agree(s->old, &ok, LOOM_MIN, NULL, s->deadline, s->fn);
    if (r == LOOM_SUCCESS && ok) {
        if (s->holder)
            for (int j = 0; j < s->nj; j++)
                loomi_ctrl_send(s->ctrl, s->slots[j], LOOMI_CMSG_ALL, s->round, ALL_COMMIT, NULL,
                                0);
        if (s->holder) loomi_ctrl_joiners_done(s->ctrl);
        return 1;
    }
    if (s->holder)
        for (int j = 0; j < s->nj; j++)
            loomi_ctrl_send(s->ctrl, s->slots[j], LOOMI_CMSG_ALL, s->round, 0, NULL, 0);
    drop_new(s);
    if (r != LOOM_SUCCESS) {
        s->err = r;
        return -1;
    }
    LOOMI_INFO(s->me, "%s: round %u: not every rank built the new communicator; again", s->fn,
               s->round);
    (void)given_up(s);
    return 0;
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
        loomi_engine_fail_all(&comm->eng);
    } else if (comm->eng.nlive) {
        return loomi_fail(LOOM_ERR_INVALID_USAGE, comm->rank,
                          "%s: %d operation(s) still pending; wait for them first", fn,
                          comm->eng.nlive);
    }

    struct shrink s;
    shrink_init(&s, comm, fn, t0 + (uint64_t)comm->set.timeout_ms, &comm->set, comm->algo_forced,
                comm->route_mask);
    s.grow = grow;
    s.serve_joins = 1;
    s.D = malloc((size_t)s.n);
    s.seen = malloc((size_t)s.n);
    s.members = malloc((size_t)s.n * sizeof *s.members);
    s.newrank_of = malloc((size_t)s.n * sizeof *s.newrank_of);
    if (!s.D || !s.seen || !s.members || !s.newrank_of) {
        free(s.D);
        free(s.seen);
        free(s.members);
        free(s.newrank_of);
        return loomi_fail(LOOM_ERR_NO_MEMORY, comm->rank, "%s: out of memory", fn);
    }
    int st, attempts = 0;
    do {
        attempts++;
        st = attempt(&s);
        if (st == 0 && loomi_now_ms() >= s.deadline) {
            s.err = loomi_fail(LOOM_ERR_TIMEOUT, s.me, "%s: no new communicator within "
                               "LOOM_TIMEOUT (%d ms)", fn, comm->set.timeout_ms);
            st = -1;
        }
    } while (st == 0);
    free(s.seen);
    free(s.members);
    free(s.newrank_of);
    if (st < 0) {
        free(s.D);
        drop_new(&s);
        /* Out of the job: comm says so from now on (loom_comm_get_error). */
        return loomi_comm_out(comm, s.err != LOOM_SUCCESS ? s.err : LOOM_ERR_INTERNAL);
    }
    if (!s.nc) { /* a grow with nothing to do */
        free(s.D);
        return LOOM_SUCCESS;
    }
    free(comm->agreed_failed);
    comm->agreed_failed = s.D;
    LOOMI_INFO(comm->rank, "%s: rank %d is rank %d of %d in the new communicator (%d "
               "attempt(s), %llu ms)",
               fn, comm->rank, s.nc->rank, s.nc->nranks, attempts,
               (unsigned long long)(loomi_now_ms() - t0));
    *newcomm = s.nc->handle;
    return LOOM_SUCCESS;
}

loom_result_t loomi_comm_child(struct loom_comm *parent, const struct loomi_child_spec *spec,
                               struct loom_comm **out)
{
    const char *fn = spec->fn;
    *out = NULL;
    if (!parent->ctrl || !parent->topo)
        return loomi_fail(LOOM_ERR_UNSUPPORTED, parent->rank,
                          "%s: this communicator has no control plane (a local one)", fn);
    struct shrink s;
    shrink_init(&s, parent, fn, spec->deadline, spec->set, spec->algo_forced, spec->route_mask);
    s.round = spec->round;
    s.pair_seq = spec->pair_seq;
    s.nmembers = spec->nmembers;
    if (s.nmembers < 1 || s.nmembers > s.n)
        return loomi_fail(LOOM_ERR_INTERNAL, s.me, "%s: %d members of %d ranks", fn, s.nmembers,
                          s.n);
    s.seen = malloc((size_t)s.n);
    s.members = malloc((size_t)s.nmembers * sizeof *s.members);
    s.newrank_of = malloc((size_t)s.n * sizeof *s.newrank_of);
    loom_result_t r = LOOM_SUCCESS;
    if (!s.seen || !s.members || !s.newrank_of) {
        r = loomi_fail(LOOM_ERR_NO_MEMORY, s.me, "%s: out of memory", fn);
        goto out;
    }
    for (int q = 0; q < s.n; q++) s.newrank_of[q] = -1;
    for (int k = 0; k < s.nmembers; k++) {
        const int q = spec->members[k];
        if (q < 0 || q >= s.n || s.newrank_of[q] >= 0) {
            r = loomi_fail(LOOM_ERR_INTERNAL, s.me, "%s: member %d (rank %d) is not a rank of "
                           "the communicator or comes twice", fn, k, q);
            goto out;
        }
        s.members[k] = q;
        s.newrank_of[q] = k;
    }
    if (s.newrank_of[s.me] < 0) {
        r = loomi_fail(LOOM_ERR_INTERNAL, s.me, "%s: this rank is not a member", fn);
        goto out;
    }
    s.coord = s.members[0];
    unsigned char addr[LOOMI_ADDR_BYTES];
    r = make_new(&s, addr);
    if (r == LOOM_SUCCESS)
        r = s.coord == s.me ? build_coordinator(&s, addr) : build_member(&s, addr);
    if (r != LOOM_SUCCESS) {
        char why[256];
        snprintf(why, sizeof why, "%s", loom_get_last_error());
        give_up(&s, why);
        drop_new(&s);
        r = loomi_fail(r, s.me, "%s", why);
    }
    *out = s.nc;
out:
    free(s.seen);
    free(s.members);
    free(s.newrank_of);
    return r;
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
