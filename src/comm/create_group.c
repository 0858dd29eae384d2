/*
 * create_group.c - loom_comm_create_group: the listed ranks of a
 * communicator, and only they, make a new one of themselves
 * (MPI_Comm_create_group); the other ranks take no part and wait for
 * nothing.
 *
 * Three steps, taken by the members alone, over the parent's control
 * plane (no new rendezvous):
 *  1. cards: every member sends each other member its list and tag and
 *     reads theirs, so that a member that passed another list or tag is
 *     named on every member that hears it, and a member that finds
 *     something wrong tells every rank of its list
 *     (LOOMI_GRP_FAIL, with its message): every member fails fast,
 *     with the culprit named (a rank listed by another member but not by
 *     this one hears nothing from it: it names this rank at its deadline).
 *     A member that never calls is named at the
 *     deadline (LOOM_ERR_TIMEOUT), a failed one as soon as the control
 *     plane knows it.
 *  2. build: as split, with shrink's loomi_comm_child (its own
 *     transports, control plane and engine, the parent's topology and
 *     measured links), under the first listed rank; a round number made
 *     from that rank's count of creates, so that messages of an earlier
 *     create, or of a shrink or split, are never taken for this one's.
 *  3. commit, among the members only: each sends the first listed rank
 *     whether it built its part, and that rank tells each whether to keep
 *     it (all built) or not.
 *
 * Messages of steps 1 and 3 (LOOMI_CMSG_GROUP) carry as epoch the count
 * of creates the two ranks made together before (comm->grp_seq, raised
 * at the end of every create, failed or not, for every rank it
 * involved): a message of an earlier create is recognised and dropped,
 * and ranks whose counts differ (one failed a create the other never
 * made) are told so.  Members of disjoint groups exchange nothing, so
 * their creates run at once.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "comm/ctrl.h"
#include "comm/group.h"

#define GRP_MAGIC 0x47525043u /* "GRPC" */
#define POLL_MS 5

/* A member's card (host-endian, as the rest of a job on one
 * architecture): its tag, its count of creates and its list. */
struct grp_card {
    uint32_t magic;
    int32_t tag;
    int32_t n;
    uint32_t calls;
    int32_t ranks[];
};

struct grp {
    struct loom_comm *comm;
    const char *fn;
    int n, me, k;            /* parent size, rank, members */
    const int *ranks;        /* [k] this rank's list */
    unsigned char *notify;   /* [n] the ranks of this rank's list */
    uint32_t *seq;           /* [n] the epoch of this create with each rank */
    uint64_t deadline;
};

static int seq_before(uint32_t a, uint32_t b) { return (int32_t)(a - b) < 0; }

/* Tell every rank to notify that this rank gives up, and why. */
static void tell_fail(struct grp *g, loom_result_t code, const char *why)
{
    const uint32_t len = (uint32_t)strlen(why) + 1;
    for (int q = 0; q < g->n; q++)
        if (g->notify[q] && q != g->me)
            (void)loomi_ctrl_send(g->comm->ctrl, q, LOOMI_CMSG_GROUP, g->seq[q],
                                  LOOMI_GRP_FAIL | (uint64_t)code << 8, why, len);
}

/* The next message of this create from rank q (earlier creates' dropped):
 * NULL with the error set when none came in time, q failed or q is at
 * another create. */
static struct loomi_cmsg *next_from(struct grp *g, int q, const char *what, unsigned char *set,
                                    loom_result_t *err)
{
    for (;;) {
        uint64_t until = loomi_now_ms() + POLL_MS;
        if (until > g->deadline) until = g->deadline;
        struct loomi_cmsg *m = loomi_ctrl_take_src(g->comm->ctrl, LOOMI_CMSG_GROUP, q, until,
                                                   NULL);
        if (m) {
            if (seq_before(m->epoch, g->seq[q])) { /* an earlier create's */
                free(m);
                continue;
            }
            if (m->epoch != g->seq[q]) {
                *err = loomi_fail(LOOM_ERR_MISMATCH, g->me,
                                  "%s: rank %d is at a later create with this rank (its "
                                  "#%u, this rank's #%u): an earlier loom_comm_create_group "
                                  "that listed both did not run on both", g->fn, q,
                                  (unsigned)m->epoch + 1, (unsigned)g->seq[q] + 1);
                free(m);
                return NULL;
            }
            return m;
        }
        loomi_ctrl_failed(g->comm->ctrl, set, NULL);
        int out = set[q] ? q : -1; /* q, or else any member */
        for (int i = 0; i < g->k && out < 0; i++)
            if (set[g->ranks[i]]) out = g->ranks[i];
        if (out >= 0) {
            *err = loomi_fail(LOOM_ERR_REMOTE, g->me, "%s: rank %d failed (or left)%s%s", g->fn,
                              out, out == q ? " before it " : "", out == q ? what : "");
            return NULL;
        }
        if (loomi_now_ms() >= g->deadline) {
            char tmo[128];
            loomi_timeout_str(&g->comm->set, tmo, sizeof tmo);
            *err = loomi_fail(LOOM_ERR_TIMEOUT, g->me,
                              "%s: rank %d never %s within LOOM_TIMEOUT (%s); did it call "
                              "loom_comm_create_group with this communicator?", g->fn, q, what,
                              tmo);
            return NULL;
        }
    }
}

/* A FAIL or GIVEUP from q: its reason as this rank's error. */
static loom_result_t from_fail(struct grp *g, const struct loomi_cmsg *m)
{
    if ((m->arg & 0xff) == LOOMI_GRP_GIVEUP)
        return loomi_fail(LOOM_ERR_REMOTE, g->me, "%s: rank %d gave up building the new "
                          "communicator", g->fn, m->src);
    loom_result_t code = (loom_result_t)(m->arg >> 8);
    if (code <= LOOM_SUCCESS || code > LOOM_ERR_CONNECT) code = LOOM_ERR_REMOTE;
    int len = 0;
    while ((uint32_t)len < m->len && len < 400 && m->data[len]) len++;
    return loomi_fail(code, g->me, "%s: rank %d gave up: %.*s", g->fn, m->src, len,
                      (const char *)m->data);
}

static void list_str(const int32_t *r, int k, char *out, size_t n)
{
    size_t len = 0;
    out[0] = '\0';
    for (int i = 0; i < k; i++) {
        if (i == 12) {
            snprintf(out + len, n - len, ", ... (%d in all)", k);
            return;
        }
        int w = snprintf(out + len, n - len, "%s%d", i ? ", " : "", r[i]);
        if (w < 0 || (size_t)w >= n - len) return;
        len += (size_t)w;
    }
}

/* Step 1: every other member's card; the coordinator's count of creates
 * in *coord_calls. */
static loom_result_t read_cards(struct grp *g, const struct grp_card *mine, uint32_t *coord_calls)
{
    unsigned char *set = malloc((size_t)g->n);
    if (!set) return loomi_fail(LOOM_ERR_NO_MEMORY, g->me, "%s: out of memory", g->fn);
    loom_result_t r = LOOM_SUCCESS;
    *coord_calls = mine->calls;
    for (int i = 0; i < g->k && r == LOOM_SUCCESS; i++) {
        const int q = g->ranks[i];
        if (q == g->me) continue;
        struct loomi_cmsg *m = next_from(g, q, "sent its list", set, &r);
        if (!m) break;
        const uint64_t kind = m->arg & 0xff;
        const size_t hdr = sizeof(struct grp_card);
        const struct grp_card *c = (const struct grp_card *)(const void *)m->data;
        if (kind == LOOMI_GRP_FAIL || kind == LOOMI_GRP_GIVEUP) {
            r = from_fail(g, m);
        } else if (kind != LOOMI_GRP_CARD || m->len < hdr || c->magic != GRP_MAGIC ||
                   c->n < 1 || c->n > g->n ||
                   m->len != hdr + (size_t)c->n * sizeof(int32_t)) {
            r = loomi_fail(LOOM_ERR_REMOTE, g->me, "%s: rank %d sent a malformed card (kind "
                           "%llu, %u bytes)", g->fn, q, (unsigned long long)kind, m->len);
        } else {
            if (c->tag != mine->tag) {
                r = loomi_fail(LOOM_ERR_MISMATCH, g->me, "%s: rank %d passed tag %d, this rank "
                               "(%d) tag %d", g->fn, q, c->tag, g->me, mine->tag);
            } else if (c->n != mine->n ||
                       memcmp(c->ranks, mine->ranks, (size_t)c->n * sizeof(int32_t))) {
                char a[160], b[160];
                list_str(c->ranks, c->n, a, sizeof a);
                list_str(mine->ranks, mine->n, b, sizeof b);
                r = loomi_fail(LOOM_ERR_MISMATCH, g->me, "%s: rank %d passed another list of "
                               "ranks (%d: %s) than this rank (%d) did (%d: %s)", g->fn, q,
                               c->n, a, g->me, mine->n, b);
            } else if (i == 0) {
                *coord_calls = c->calls;
            }
        }
        free(m);
    }
    free(set);
    return r;
}

/* Step 3 on the first listed rank: every member's vote; the decision to
 * each.  Returns the decision. */
static int commit_coord(struct grp *g, int built)
{
    unsigned char *set = malloc((size_t)g->n);
    int ok = built && set;
    for (int i = 1; i < g->k && ok; i++) {
        loom_result_t r = LOOM_SUCCESS;
        struct loomi_cmsg *m = next_from(g, g->ranks[i], "said whether it built its part", set,
                                         &r);
        ok = m && (m->arg & 0xff) == LOOMI_GRP_VOTE && (m->arg >> 8) == 1;
        free(m);
    }
    free(set);
    for (int i = 1; i < g->k; i++)
        (void)loomi_ctrl_send(g->comm->ctrl, g->ranks[i], LOOMI_CMSG_GROUP, g->seq[g->ranks[i]],
                              LOOMI_GRP_DECIDE | (uint64_t)ok << 8, NULL, 0);
    return ok;
}

/* Step 3 on the others: the vote, then the decision (when built). */
static loom_result_t commit_member(struct grp *g, int built)
{
    const int c = g->ranks[0];
    (void)loomi_ctrl_send(g->comm->ctrl, c, LOOMI_CMSG_GROUP, g->seq[c],
                          LOOMI_GRP_VOTE | (uint64_t)(built ? 1 : 0) << 8, NULL, 0);
    if (!built) return LOOM_SUCCESS;
    unsigned char *set = malloc((size_t)g->n);
    if (!set) return loomi_fail(LOOM_ERR_NO_MEMORY, g->me, "%s: out of memory", g->fn);
    loom_result_t r = LOOM_SUCCESS;
    for (;;) {
        struct loomi_cmsg *m = next_from(g, c, "said whether to keep the new communicator", set,
                                         &r);
        if (!m) break;
        const uint64_t kind = m->arg & 0xff;
        if (kind == LOOMI_GRP_DECIDE) {
            if ((m->arg >> 8) != 1)
                r = loomi_fail(LOOM_ERR_REMOTE, g->me, "%s: not every member built its part "
                               "(rank %d, the first listed, says); none keeps it", g->fn, c);
            free(m);
            break;
        }
        if (kind == LOOMI_GRP_GIVEUP || kind == LOOMI_GRP_FAIL) {
            r = from_fail(g, m);
            free(m);
            break;
        }
        free(m); /* anything else of this create from it: not a decision */
    }
    free(set);
    return r;
}

/* The arguments, checked; "" when fine, else the message (the code in
 * *code).  Returns 1 when the listed ranks are to be told (this rank is
 * not in its list, which is otherwise sound). */
static int check_list(const struct loom_comm *comm, int n, const int *ranks, int tag,
                       unsigned char *listed, loom_result_t *code, char *msg, size_t len)
{
    const char *fn = "loom_comm_create_group";
    const int nr = comm->nranks;
    int *at = malloc((size_t)nr * sizeof *at), in = 0;
    *code = LOOM_SUCCESS;
    msg[0] = '\0';
    if (!at) {
        *code = LOOM_ERR_NO_MEMORY;
        snprintf(msg, len, "%s: out of memory", fn);
        return 0;
    }
    for (int q = 0; q < nr; q++) at[q] = -1;
    for (int i = 0; i < n; i++) {
        const int q = ranks[i];
        if (q < 0 || q >= nr) {
            if (!*code) {
                *code = LOOM_ERR_INVALID_ARGUMENT;
                snprintf(msg, len, "%s: rank %d: ranks[%d] = %d is not a rank of the "
                         "communicator (0..%d)", fn, comm->rank, i, q, nr - 1);
            }
            continue;
        }
        if (at[q] >= 0 && !*code) {
            *code = LOOM_ERR_INVALID_ARGUMENT;
            snprintf(msg, len, "%s: rank %d: ranks[%d] = %d repeats ranks[%d]", fn, comm->rank,
                     i, q, at[q]);
        }
        if (at[q] < 0) at[q] = i;
        listed[q] = 1;
        in |= q == comm->rank;
    }
    if (!*code && tag < 0) {
        *code = LOOM_ERR_INVALID_ARGUMENT;
        snprintf(msg, len, "%s: rank %d: tag %d is negative", fn, comm->rank, tag);
    }
    int tell = 0;
    if (!*code && !in) {
        tell = 1;
        *code = LOOM_ERR_INVALID_ARGUMENT;
        snprintf(msg, len, "%s: rank %d called it but is not in its own list of ranks "
                 "(every listed rank, and only they, call it)", fn, comm->rank);
    }
    free(at);
    return tell;
}

loom_result_t loom_comm_create_group(loom_comm_t h, int n, const int *ranks, int tag,
                                     loom_comm_t *newcomm)
{
    const char *fn = "loom_comm_create_group";
    if (!newcomm) return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1, "%s: newcomm is NULL", fn);
    *newcomm = NULL;
    struct loom_comm *comm;
    loom_result_t r = loomi_comm_live(h, fn, &comm);
    if (r != LOOM_SUCCESS) return r;
    const int nr = comm->nranks, me = comm->rank;
    if (n < 1 || n > nr)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, me, "%s: n = %d is not in 1..%d (the "
                          "communicator's size)", fn, n, nr);
    if (!ranks) return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, me, "%s: ranks is NULL", fn);
    if (loomi_group_active())
        return loomi_fail(LOOM_ERR_INVALID_USAGE, me,
                          "%s: called between loom_group_start and loom_group_end", fn);
    r = loomi_comm_check(h, fn, &comm);
    if (r != LOOM_SUCCESS) return r;
    if (!comm->ctrl || !comm->topo)
        return loomi_fail(LOOM_ERR_UNSUPPORTED, me,
                          "%s: this communicator has no control plane (a local one)", fn);
    if (!comm->grp_seq && !(comm->grp_seq = calloc((size_t)nr, sizeof *comm->grp_seq)))
        return loomi_fail(LOOM_ERR_NO_MEMORY, me, "%s: out of memory", fn);

    struct grp g = {.comm = comm, .fn = fn, .n = nr, .me = me, .k = n, .ranks = ranks,
                    .seq = comm->grp_seq,
                    .deadline = loomi_now_ms() + (uint64_t)comm->set.timeout_ms};
    const size_t cbytes = sizeof(struct grp_card) + (size_t)n * sizeof(int32_t);
    struct grp_card *mine = calloc(1, cbytes);
    g.notify = calloc((size_t)nr, 1);
    struct loom_comm *child = NULL;
    if (!mine || !g.notify) {
        free(mine);
        free(g.notify);
        return loomi_fail(LOOM_ERR_NO_MEMORY, me, "%s: out of memory", fn);
    }
    const uint64_t t0 = loomi_now_ms();
    char why[400];
    loom_result_t code;
    int tell = check_list(comm, n, ranks, tag, g.notify, &code, why, sizeof why);
    if (code != LOOM_SUCCESS) {
        /* A rank not in its own list: the listed ranks, which would wait
         * for it, hear why.  The other mistakes are this rank's alone
         * (the others name it at their deadline). */
        if (tell) tell_fail(&g, code, why);
        else memset(g.notify, 0, (size_t)nr);
        r = loomi_fail(code, me, "%s", why);
        goto out;
    }

    /* 1. Cards. */
    mine->magic = GRP_MAGIC;
    mine->tag = tag;
    mine->n = n;
    mine->calls = comm->grp_calls;
    for (int i = 0; i < n; i++) mine->ranks[i] = ranks[i];
    for (int i = 0; i < n; i++)
        if (ranks[i] != me)
            (void)loomi_ctrl_send(comm->ctrl, ranks[i], LOOMI_CMSG_GROUP, g.seq[ranks[i]],
                                  LOOMI_GRP_CARD, mine, (uint32_t)cbytes);
    uint32_t coord_calls = 0;
    r = read_cards(&g, mine, &coord_calls);
    if (r != LOOM_SUCCESS) {
        snprintf(why, sizeof why, "%s", loom_get_last_error());
        tell_fail(&g, r, why);
        r = loomi_fail(r, me, "%s", why);
        goto out;
    }

    /* 2. Build, under the first listed rank. */
    uint32_t round = (uint32_t)ranks[0] * 0x9e3779b1u ^ coord_calls * 0x85ebca6bu ^
                     (uint32_t)tag * 0xc2b2ae35u;
    round |= 0x80000000u; /* never a shrink's or split's (agreement numbers) */
    struct loomi_child_spec spec = {
        .members = ranks,
        .nmembers = n,
        .set = &comm->set,
        .algo_forced = comm->algo_forced,
        .route_mask = comm->route_mask,
        .round = round,
        .deadline = g.deadline,
        .fn = fn,
        .pair_seq = g.seq,
    };
    loom_result_t built = loomi_comm_child(comm, &spec, &child);
    if (built != LOOM_SUCCESS) {
        snprintf(why, sizeof why, "%s", loom_get_last_error());
        if (strncmp(why, fn, strlen(fn)) != 0) {
            char was[300];
            const size_t wl = strnlen(why, sizeof was - 1);
            memcpy(was, why, wl);
            was[wl] = '\0';
            snprintf(why, sizeof why, "%s: building the new communicator (ranks numbered in "
                     "it): %s", fn, was);
        }
    }

    /* 3. Commit among the members. */
    if (ranks[0] == me) {
        int ok = commit_coord(&g, built == LOOM_SUCCESS);
        if (built != LOOM_SUCCESS) r = loomi_fail(built, me, "%s", why);
        else if (!ok)
            r = loomi_fail(LOOM_ERR_REMOTE, me, "%s: not every member built its part (or "
                           "said so in time); none keeps it: %s", fn, loom_get_last_error());
    } else {
        r = commit_member(&g, built == LOOM_SUCCESS);
        if (built != LOOM_SUCCESS) r = loomi_fail(built, me, "%s", why);
    }
    if (r != LOOM_SUCCESS) {
        if (child) loomi_comm_discard(child);
        child = NULL;
        goto out;
    }
    LOOMI_INFO(me, "%s: rank %d is rank %d of %d in the new communicator (tag %d, %llu ms)", fn,
               me, child->rank, child->nranks, tag, (unsigned long long)(loomi_now_ms() - t0));
    *newcomm = child->handle;
out:
    /* This create is over with every rank it involved, whatever came of it. */
    for (int q = 0; q < nr; q++)
        if (g.notify[q] && q != me) g.seq[q]++;
    comm->grp_calls++;
    free(mine);
    free(g.notify);
    return r;
}
