/* algo.c - algorithm names, generators, LOOM_ALGO parsing and defaults. */
#include <stdio.h>
#include <string.h>

#include "coll/coll.h"
#include "core/internal.h"

static const char *const coll_names[LOOMI_NUM_COLLS] = {
    "allreduce", "reduce_scatter", "allgather", "alltoall", "alltoallv",
    "broadcast", "reduce",         "gather",    "scatter",  "barrier",
    "gossip"};
static const char *const algo_names[LOOMI_NUM_ALGOS] = {
    "auto", "ring", "recursive_doubling", "halving_doubling", "tree", "pairwise", "bruck",
    "scatter_allgather", "hierarchical", "shared"};

/* The generator table: its rows are alike on purpose (one designated
 * initializer per collective and algorithm), as the table that replaces
 * a switch over both. */
static const loomi_gen_fn gens[LOOMI_NUM_COLLS][LOOMI_NUM_ALGOS] = {
    [LOOMI_COLL_ALLREDUCE] = {[LOOMI_ALGO_RING] = loomi_gen_allreduce_ring,
                              [LOOMI_ALGO_RECURSIVE_DOUBLING] = loomi_gen_allreduce_rd,
                              [LOOMI_ALGO_HALVING_DOUBLING] = loomi_gen_allreduce_hd,
                              [LOOMI_ALGO_TREE] = loomi_gen_allreduce_tree,
                              [LOOMI_ALGO_HIERARCHICAL] = loomi_gen_allreduce_hier,
                              [LOOMI_ALGO_SHARED] = loomi_gen_allreduce_shared},
    [LOOMI_COLL_REDUCE_SCATTER] = {[LOOMI_ALGO_RING] = loomi_gen_reduce_scatter_ring,
                                   [LOOMI_ALGO_HALVING_DOUBLING] = loomi_gen_reduce_scatter_hd,
                                   [LOOMI_ALGO_HIERARCHICAL] = loomi_gen_reduce_scatter_hier,
                                   [LOOMI_ALGO_SHARED] = loomi_gen_reduce_scatter_shared},
    [LOOMI_COLL_ALLGATHER] = {[LOOMI_ALGO_RING] = loomi_gen_allgather_ring,
                              [LOOMI_ALGO_RECURSIVE_DOUBLING] = loomi_gen_allgather_rd,
                              [LOOMI_ALGO_BRUCK] = loomi_gen_allgather_bruck,
                              [LOOMI_ALGO_HIERARCHICAL] = loomi_gen_allgather_hier,
                              [LOOMI_ALGO_SHARED] = loomi_gen_allgather_shared},
    [LOOMI_COLL_ALLTOALL] = {[LOOMI_ALGO_PAIRWISE] = loomi_gen_alltoall_pairwise,
                             [LOOMI_ALGO_BRUCK] = loomi_gen_alltoall_bruck,
                             [LOOMI_ALGO_HIERARCHICAL] = loomi_gen_alltoall_hier},
    [LOOMI_COLL_ALLTOALLV] = {[LOOMI_ALGO_PAIRWISE] = loomi_gen_alltoallv_pairwise},
    [LOOMI_COLL_BROADCAST] = {[LOOMI_ALGO_TREE] = loomi_gen_broadcast_tree,
                              [LOOMI_ALGO_SCATTER_ALLGATHER] = loomi_gen_broadcast_sag,
                              [LOOMI_ALGO_HIERARCHICAL] = loomi_gen_broadcast_hier,
                              [LOOMI_ALGO_SHARED] = loomi_gen_broadcast_shared},
    [LOOMI_COLL_REDUCE] = {[LOOMI_ALGO_TREE] = loomi_gen_reduce_tree,
                           [LOOMI_ALGO_SCATTER_ALLGATHER] = loomi_gen_reduce_sag},
    [LOOMI_COLL_GATHER] = {[LOOMI_ALGO_TREE] = loomi_gen_gather_tree,
                           [LOOMI_ALGO_PAIRWISE] = loomi_gen_gather_pairwise},
    [LOOMI_COLL_SCATTER] = {[LOOMI_ALGO_TREE] = loomi_gen_scatter_tree,
                            [LOOMI_ALGO_PAIRWISE] = loomi_gen_scatter_pairwise},
    [LOOMI_COLL_BARRIER] = {[LOOMI_ALGO_BRUCK] = loomi_gen_barrier_bruck,
                            [LOOMI_ALGO_TREE] = loomi_gen_barrier_tree},
    [LOOMI_COLL_GOSSIP] = {[LOOMI_ALGO_PAIRWISE] = loomi_gen_gossip_pairwise},
};

loomi_gen_fn loomi_algo_gen(int coll, int algo)
{
    if (coll < 0 || coll >= LOOMI_NUM_COLLS || algo <= 0 || algo >= LOOMI_NUM_ALGOS) return NULL;
    return gens[coll][algo];
}

const char *loomi_coll_name(int coll)
{
    return coll >= 0 && coll < LOOMI_NUM_COLLS ? coll_names[coll] : "?";
}

const char *loomi_algo_name(int algo)
{
    return algo >= 0 && algo < LOOMI_NUM_ALGOS ? algo_names[algo] : "?";
}

void loomi_sched_sig_name(unsigned sig, char *buf, size_t n)
{
    const int coll1 = (int)(sig >> 4), algo = (int)(sig & 15);
    if (coll1 > 0 && coll1 <= LOOMI_NUM_COLLS)
        snprintf(buf, n, "(%s, %s)", loomi_coll_name(coll1 - 1), loomi_algo_name(algo));
    else
        snprintf(buf, n, "(internal %u)", sig);
}

unsigned loomi_coll_algos(int coll)
{
    unsigned m = 0;
    for (int a = 1; a < LOOMI_NUM_ALGOS; a++)
        if (loomi_algo_gen(coll, a)) m |= 1u << a;
    return m;
}

/* Fixed thresholds from the textbook costs: latency-optimal algorithms
 * for small messages, bandwidth-optimal ones for large.  Only where there
 * is no selection table (the in-process communicators of the tests) and
 * for the flat phases of the hierarchical and shared algorithms; every
 * other communicator chooses from the table its cost model built
 * (topo/select.c; loomi_algo_for in comm/comm.c). */
int loomi_algo_default(int coll, int nranks, size_t bytes)
{
    (void)nranks;
    switch (coll) {
    case LOOMI_COLL_ALLREDUCE:
        if (bytes <= 32 * 1024) return LOOMI_ALGO_RECURSIVE_DOUBLING;
        if (bytes <= 1024 * 1024) return LOOMI_ALGO_HALVING_DOUBLING;
        return LOOMI_ALGO_RING;
    case LOOMI_COLL_REDUCE_SCATTER:
        return bytes <= 1024 * 1024 ? LOOMI_ALGO_HALVING_DOUBLING : LOOMI_ALGO_RING;
    case LOOMI_COLL_ALLGATHER:
        return bytes <= 64 * 1024 ? LOOMI_ALGO_BRUCK : LOOMI_ALGO_RING;
    case LOOMI_COLL_ALLTOALL:
        return bytes <= 4 * 1024 ? LOOMI_ALGO_BRUCK : LOOMI_ALGO_PAIRWISE;
    case LOOMI_COLL_ALLTOALLV:
        return LOOMI_ALGO_PAIRWISE;
    case LOOMI_COLL_BROADCAST:
    case LOOMI_COLL_REDUCE:
        return bytes <= 512 * 1024 ? LOOMI_ALGO_TREE : LOOMI_ALGO_SCATTER_ALLGATHER;
    case LOOMI_COLL_GATHER:
    case LOOMI_COLL_SCATTER:
        return bytes <= 64 * 1024 ? LOOMI_ALGO_TREE : LOOMI_ALGO_PAIRWISE;
    case LOOMI_COLL_GOSSIP:
        return LOOMI_ALGO_PAIRWISE;
    case LOOMI_COLL_BARRIER:
    default:
        return LOOMI_ALGO_BRUCK;
    }
}

loom_result_t loomi_coll_build(struct loomi_sched *s, int rank, int nranks,
                               loom_datatype_t dtype, loom_op_t op,
                               const struct loomi_coll_args *a, int algo)
{
    loomi_sched_init(s, rank, nranks, dtype, op);
    if (algo == LOOMI_ALGO_AUTO)
        algo = loomi_algo_default(a->coll, nranks, a->count * s->esize);
    loomi_gen_fn g = loomi_algo_gen(a->coll, algo);
    if (!g)
        return loomi_fail(LOOM_ERR_INTERNAL, rank, "%s has no algorithm %s",
                          loomi_coll_name(a->coll), loomi_algo_name(algo));
    loom_result_t r = g(s, a);
    if (r != LOOM_SUCCESS) loomi_sched_free(s);
    return r;
}

static void list_valid(char *buf, size_t n)
{
    size_t o = 0;
    for (int c = 0; c < LOOMI_NUM_COLLS && o < n; c++) {
        o += (size_t)snprintf(buf + o, n - o, "%s%s:", c ? "; " : "", coll_names[c]);
        for (int a = 1; a < LOOMI_NUM_ALGOS && o < n; a++)
            if (loomi_algo_gen(c, a)) o += (size_t)snprintf(buf + o, n - o, " %s", algo_names[a]);
    }
}

static int find(const char *const *names, int n, const char *s, size_t len)
{
    for (int i = 0; i < n; i++)
        if (strlen(names[i]) == len && !strncmp(names[i], s, len)) return i;
    return -1;
}

loom_result_t loomi_algo_parse(const char *what, const char *spec, int forced[LOOMI_NUM_COLLS],
                               int rank)
{
    for (int c = 0; c < LOOMI_NUM_COLLS; c++) forced[c] = LOOMI_ALGO_AUTO;
    if (!spec || !*spec) return LOOM_SUCCESS;
    char valid[1024];
    const char *p = spec;
    while (*p) {
        size_t len = strcspn(p, ";,");
        const char *colon = memchr(p, ':', len);
        int coll = -1;
        const char *an = p;
        size_t alen = len;
        if (colon) {
            coll = find(coll_names, LOOMI_NUM_COLLS, p, (size_t)(colon - p));
            if (coll < 0) {
                list_valid(valid, sizeof valid);
                return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, rank,
                                  "%s: unknown collective '%.*s' (valid: %s)", what,
                                  (int)(colon - p), p, valid);
            }
            an = colon + 1;
            alen = len - (size_t)(an - p);
        }
        int a = find(algo_names, LOOMI_NUM_ALGOS, an, alen);
        int any = 0; /* a bare name must apply to some collective */
        for (int c = 0; c < LOOMI_NUM_COLLS && a > 0; c++) any |= loomi_algo_gen(c, a) != NULL;
        int ok = a >= 0 && (a == LOOMI_ALGO_AUTO || (coll >= 0 ? loomi_algo_gen(coll, a) != NULL : any));
        if (!ok) {
            list_valid(valid, sizeof valid);
            return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, rank,
                              "%s: '%.*s' is not an algorithm of %s (valid: %s)", what,
                              (int)alen, an, coll >= 0 ? coll_names[coll] : "any collective",
                              valid);
        }
        /* A bare name forces every collective that has that algorithm. */
        for (int c = 0; c < LOOMI_NUM_COLLS; c++)
            if (c == coll || (coll < 0 && (a == LOOMI_ALGO_AUTO || loomi_algo_gen(c, a))))
                forced[c] = a;
        p += len;
        if (*p) p++;
    }
    return LOOM_SUCCESS;
}

int loomi_red_classes_valid(const struct loomi_red_classes *rc)
{
    int seen[LOOMI_RED_CLASSES] = {0};
    for (int dt = 0; dt < LOOM_NUM_DATATYPES; dt++)
        for (int op = 0; op < LOOM_NUM_OPS; op++) {
            if (rc->cls[dt][op] >= LOOMI_RED_CLASSES) return 0;
            seen[rc->cls[dt][op]] = 1;
        }
    if (rc->cls[LOOM_FLOAT32][LOOM_SUM] != 0) return 0;
    for (int dt = 0; dt < LOOM_NUM_DATATYPES; dt++)
        if (rc->cls[dt][LOOM_AVG] != rc->cls[dt][LOOM_SUM]) return 0;
    for (int k = 0; k < LOOMI_RED_CLASSES; k++) {
        const uint8_t *r = rc->rep[k];
        /* Class 0 costs nothing more; the others, finite and below a
         * microsecond a byte. */
        if (!(rc->excess[k] >= 0 && rc->excess[k] < 1000) || (!k && rc->excess[k] != 0))
            return 0;
        if (!k || !seen[k]) {
            if (r[0] != 0xff || r[1] != 0xff) return 0;
        } else if (r[0] >= LOOM_NUM_DATATYPES || r[1] >= LOOM_NUM_OPS || rc->cls[r[0]][r[1]] != k) {
            return 0;
        }
    }
    return 1;
}
