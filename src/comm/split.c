/*
 * split.c - loom_comm_split: the ranks of a communicator that pass the
 * same colour form a new one (ncclCommSplit, MPI_Comm_split).
 *
 * Three steps, every one taken by every rank of the parent:
 *  1. exchange: an allgather on the parent of each rank's card (colour,
 *     key, and the settings the new communicator must share, struct
 *     loomi_uniform).  It is one of the parent's collective calls, so a
 *     rank that never calls loom_comm_split leaves the others with the
 *     parent's LOOM_ERR_TIMEOUT naming it, and a rank that made another
 *     call there shows as one (LOOM_ERR_MISMATCH); a card of a rank
 *     that made an allgather of the same size fails the parent naming it.
 *  2. build: the members of each colour, in (key, rank) order, build
 *     their communicator over the parent's control plane with the
 *     machinery of loom_comm_shrink (loomi_comm_child, shrink.c): no new
 *     rendezvous, the parent's topology cards and measured links.  The
 *     colours build at once, each under its own coordinator.
 *  3. commit: an agreement on the parent (loomi_agree, as shrink's
 *     commit) on whether every member of every colour built its part:
 *     on 0 every rank discards what it built, so a split either gives
 *     every colour its communicator or none.
 *
 * A child has its own transports, control plane and engine: its tags and
 * streams cannot meet the parent's or a sibling's, a revocation or abort
 * of one reaches no other, and it lives on when the parent is destroyed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "comm/collectives.h"
#include "comm/comm.h"
#include "comm/ctrl.h"
#include "comm/group.h"
#include "transports/route.h"

#define SPLIT_MAGIC 0x53504c54u /* "SPLT" */

/* What each rank tells the others in step 1 (host-endian, as the rest of
 * a job on one architecture). */
struct split_card {
    uint32_t magic;
    int32_t color, key;
    uint32_t zero;
    struct loomi_uniform uniform; /* of the settings it asks for the child */
};

struct order_ent {
    int key, rank;
};

static int by_key(const void *a, const void *b)
{
    const struct order_ent *x = a, *y = b;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

int loomi_split_order(const int *color, const int *key, int n, int color_of_me, int *members)
{
    if (color_of_me == LOOM_SPLIT_NOCOLOR) return 0;
    struct order_ent *e = malloc((size_t)(n > 0 ? n : 1) * sizeof *e);
    if (!e) return -1;
    int k = 0;
    for (int q = 0; q < n; q++)
        if (color[q] == color_of_me) e[k++] = (struct order_ent){key[q], q};
    qsort(e, (size_t)k, sizeof *e, by_key);
    for (int i = 0; i < k; i++) members[i] = e[i].rank;
    free(e);
    return k;
}

/* The child's settings: the parent's, with what cfg sets over them. */
static loom_result_t child_settings(const struct loom_comm *p, const loom_config_t *cfg,
                                    const char *fn, struct loomi_settings *set,
                                    int *algo_forced, unsigned *route_mask)
{
    *set = p->set;
    memcpy(algo_forced, p->algo_forced, sizeof p->algo_forced);
    *route_mask = p->route_mask;
    if (!cfg) return LOOM_SUCCESS;
    struct loomi_settings t; /* checks cfg, with the message every init gives */
    loom_result_t r = loomi_settings_resolve(&t, cfg, fn);
    if (r != LOOM_SUCCESS) return r;
#define HAS(m) (cfg->size >= offsetof(loom_config_t, m) + sizeof cfg->m)
    if (HAS(timeout_ms) && cfg->timeout_ms) {
        set->timeout_ms = t.timeout_ms;
        set->timeout_src = t.timeout_src;
    }
    if (HAS(tcp_streams) && cfg->tcp_streams) set->tcp_streams = t.tcp_streams;
    if (HAS(chunk_bytes) && cfg->chunk_bytes) {
        set->chunk_bytes = t.chunk_bytes;
        set->chunk_fixed = t.chunk_fixed;
    }
    if (HAS(socket_ifname) && cfg->socket_ifname)
        memcpy(set->socket_ifname, t.socket_ifname, sizeof set->socket_ifname);
    if (HAS(algo) && cfg->algo) {
        memcpy(set->algo, t.algo, sizeof set->algo);
        r = loomi_algo_parse("loom_comm_split: cfg->algo", set->algo, algo_forced, p->rank);
        if (r != LOOM_SUCCESS) return r;
    }
    if (HAS(transport) && cfg->transport) {
        memcpy(set->transport, t.transport, sizeof set->transport);
        r = loomi_route_parse(set->transport, route_mask, p->rank);
        if (r != LOOM_SUCCESS) return r;
    }
#undef HAS
    return LOOM_SUCCESS;
}

/* The exchange (call `no` of the parent) failed on this rank: the ranks
 * that never came to it are those that do not say, within a short wait,
 * that they were in it too (the others fail at about the same moment: the
 * first to give up tells them).  Their names in out ("" when all came). */
#define IN_WAIT_MS 300
static void name_absent(struct loom_comm *comm, uint64_t no, char *out, size_t n)
{
    const int nr = comm->nranks, me = comm->rank;
    const uint32_t epoch = (uint32_t)no;
    out[0] = '\0';
    unsigned char *seen = calloc((size_t)nr, 1);
    if (!seen || !comm->ctrl) {
        free(seen);
        return;
    }
    for (int q = 0; q < nr; q++)
        if (q != me) (void)loomi_ctrl_send(comm->ctrl, q, LOOMI_CMSG_SPLIT_IN, epoch, 0, NULL, 0);
    int heard = 1;
    seen[me] = 1;
    const uint64_t until = loomi_now_ms() + IN_WAIT_MS;
    while (heard < nr) {
        struct loomi_cmsg *m = loomi_ctrl_take(comm->ctrl, LOOMI_CMSG_SPLIT_IN, until);
        if (!m) break;
        if (m->epoch == epoch && m->src >= 0 && m->src < nr && !seen[m->src]) {
            seen[m->src] = 1;
            heard++;
        }
        free(m);
    }
    size_t len = 0;
    int listed = 0, missing = nr - heard;
    for (int q = 0; q < nr && missing; q++) {
        if (seen[q]) continue;
        if (listed == 8) {
            snprintf(out + len, n - len, " and %d more", missing - listed);
            break;
        }
        int w = snprintf(out + len, n - len, "%s%d", listed ? ", " : "", q);
        if (w < 0 || (size_t)w >= n - len) break;
        len += (size_t)w;
        listed++;
    }
    free(seen);
}

loom_result_t loom_comm_split(loom_comm_t h, int color, int key, const loom_config_t *cfg,
                              loom_comm_t *newcomm)
{
    const char *fn = "loom_comm_split";
    if (!newcomm) return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1, "%s: newcomm is NULL", fn);
    *newcomm = NULL;
    struct loom_comm *comm;
    loom_result_t r = loomi_comm_live(h, fn, &comm);
    if (r != LOOM_SUCCESS) return r;
    if (color < 0 && color != LOOM_SPLIT_NOCOLOR)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, comm->rank,
                          "%s: color %d is negative (colours are >= 0; LOOM_SPLIT_NOCOLOR, -1, "
                          "leaves this rank out)", fn, color);
    if (loomi_group_active())
        return loomi_fail(LOOM_ERR_INVALID_USAGE, comm->rank,
                          "%s: called between loom_group_start and loom_group_end", fn);
    r = loomi_comm_check(h, fn, &comm);
    if (r != LOOM_SUCCESS) return r;
    if (!comm->ctrl || !comm->topo)
        return loomi_fail(LOOM_ERR_UNSUPPORTED, comm->rank,
                          "%s: this communicator has no control plane (a local one)", fn);
    struct loomi_settings set;
    int forced[LOOMI_MAX_COLLS];
    unsigned mask;
    r = child_settings(comm, cfg, fn, &set, forced, &mask);
    if (r != LOOM_SUCCESS) return r;

    const int n = comm->nranks, me = comm->rank;
    struct split_card mine, *cards = calloc((size_t)n, sizeof *cards);
    int *colors = malloc((size_t)n * sizeof *colors), *keys = malloc((size_t)n * sizeof *keys);
    int *members = malloc((size_t)n * sizeof *members);
    struct loom_comm *child = NULL;
    if (!cards || !colors || !keys || !members) {
        r = loomi_fail(LOOM_ERR_NO_MEMORY, me, "%s: out of memory", fn);
        goto out;
    }
    memset(&mine, 0, sizeof mine);
    mine.magic = SPLIT_MAGIC;
    mine.color = color;
    mine.key = key;
    loomi_uniform_fill(&mine.uniform, &set, forced, mask, 1);

    /* 1. Every rank's card, over the parent. */
    r = loomi_call_allgather(fn, &mine, cards, sizeof mine, LOOM_UINT8, h, NULL, NULL);
    if (r != LOOM_SUCCESS) {
        char was[300], absent[96] = "";
        snprintf(was, sizeof was, "%s", loom_get_last_error());
        /* Only where the exchange ran out of time with every rank alive:
         * a failed rank is named by the failure, and a rank that found
         * the communicator revoked before it got here sends no word. */
        loom_result_t code = LOOM_SUCCESS;
        int failed = -1;
        loomi_ctrl_reason(comm->ctrl, &code, &failed, absent, sizeof absent);
        absent[0] = '\0';
        if (code == LOOM_ERR_TIMEOUT && loomi_ctrl_failed(comm->ctrl, NULL, NULL) == 0)
            name_absent(comm, atomic_load(&comm->call_no), absent, sizeof absent);
        if (absent[0]) {
            char tmo[128];
            loomi_timeout_str(&comm->set, tmo, sizeof tmo);
            r = loomi_fail(LOOM_ERR_TIMEOUT, me,
                           "%s: rank%s %s never called loom_comm_split (or failed); the others "
                           "waited for %s (%s): %s", fn, strchr(absent, ',') ? "s" : "", absent,
                           strchr(absent, ',') ? "them" : "it", tmo, was);
        } else {
            r = loomi_fail(r, me, "%s: exchanging colours and keys over the communicator: %s",
                           fn, was);
        }
        goto out;
    }
    for (int q = 0; q < n; q++) {
        if (cards[q].magic != SPLIT_MAGIC || cards[q].color < LOOM_SPLIT_NOCOLOR) {
            /* Its allgather had the size of ours: the calls differ. */
            loomi_comm_fail(comm, LOOM_ERR_MISMATCH, q,
                            "rank %d made another call of the communicator's where the others "
                            "called loom_comm_split (an allgather of %zu bytes?)", q, sizeof mine);
            r = loomi_fail(LOOM_ERR_MISMATCH, me, "%s: %s", fn, comm->errmsg);
            goto out;
        }
        colors[q] = cards[q].color;
        keys[q] = cards[q].key;
    }

    /* 2. Build this rank's colour, if it has one. */
    const uint64_t t0 = loomi_now_ms();
    const uint64_t deadline = t0 + (uint64_t)comm->set.timeout_ms;
    int k = loomi_split_order(colors, keys, n, color, members);
    loom_result_t built = LOOM_SUCCESS;
    char why[320] = "";
    if (k < 0) {
        built = loomi_fail(LOOM_ERR_NO_MEMORY, me, "%s: out of memory", fn);
    } else if (k > 0) {
        /* The members must build alike: the settings every rank of a
         * communicator shares (loomi_uniform) compared with each member's. */
        for (int i = 0; i < k && built == LOOM_SUCCESS; i++) {
            const int q = members[i];
            char who[32], msg[200];
            snprintf(who, sizeof who, "rank %d", q);
            if (q != me && loomi_uniform_diff(&cards[q].uniform, who, &mine.uniform,
                                              "this rank", msg, sizeof msg))
                built = loomi_fail(LOOM_ERR_MISMATCH, me, "%s: colour %d: %s", fn, color, msg);
        }
        if (built == LOOM_SUCCESS) {
            struct loomi_child_spec spec = {
                .members = members,
                .nmembers = k,
                .set = &set,
                .algo_forced = forced,
                .route_mask = mask,
                .round = (uint32_t)(comm->agree_seq + 1),
                .deadline = deadline,
                .fn = fn,
            };
            built = loomi_comm_child(comm, &spec, &child);
        }
    }
    if (built != LOOM_SUCCESS) {
        /* Ranks in the message of a failed build are numbered in the new
         * communicator. */
        char was[200];
        snprintf(was, sizeof was, "%s", loom_get_last_error());
        if (strncmp(was, fn, strlen(fn)) == 0)
            snprintf(why, sizeof why, "%s", was);
        else
            snprintf(why, sizeof why, "%s: building colour %d (ranks numbered in it): %s", fn,
                     color, was);
    }

    /* 3. Every colour, or none. */
    uint64_t ok = built == LOOM_SUCCESS;
    r = loomi_agree(comm, &ok, LOOM_MIN, NULL, deadline, fn);
    if (r != LOOM_SUCCESS) {
        r = loomi_fail(r, me, "%s: %s%s%s", fn, built != LOOM_SUCCESS ? why : "",
                       built != LOOM_SUCCESS ? "; then " : "", loom_get_last_error());
    } else if (built != LOOM_SUCCESS) {
        r = loomi_fail(built, me, "%s", why);
    } else if (!ok) {
        r = loomi_fail(LOOM_ERR_REMOTE, me, "%s: another colour's communicator could not be "
                       "built (its ranks say why); none is kept", fn);
    }
    if (r != LOOM_SUCCESS) {
        if (child) loomi_comm_discard(child);
        child = NULL;
        goto out;
    }
    if (child) {
        LOOMI_INFO(me, "%s: rank %d is rank %d of %d in colour %d (%llu ms)", fn, me, child->rank,
                   child->nranks, color, (unsigned long long)(loomi_now_ms() - t0));
        *newcomm = child->handle;
    }
out:
    free(cards);
    free(colors);
    free(keys);
    free(members);
    return r;
}
