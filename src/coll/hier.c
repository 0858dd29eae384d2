/*
 * hier.c - hierarchical algorithms: phases inside a host and between
 * hosts, each phase a flat algorithm embedded for a group (embed.c).
 *
 * Names: H hosts; rank r is local index i on host h; with uniform hosts
 * every host has L ranks, and "rail i" is the H ranks of local index i,
 * in host order (vrank = host index).  Inter-host phases run on rails (or
 * on one rank per host), so each rank crosses the network with 1/L of
 * the data instead of every rank with all of it.
 *
 *   allreduce       uniform: per piece, intra reduce-scatter (ring) of L
 *                   slices -> allreduce of the own slice on the rail ->
 *                   intra allgather (ring); pieces pipeline (phase 1 of
 *                   piece k+1 waits only for phase 1 of piece k).
 *                   Non-uniform, and alongside for the count % L elements
 *                   left over: intra reduce to the host's local 0 ->
 *                   allreduce of the leaders -> intra broadcast.
 *   reduce_scatter  hosts of consecutive ranks: H intra reduce-scatters
 *                   (ring), one per host's run of the input, leave each
 *                   local rank the host sums of its rail's H blocks ->
 *                   reduce-scatter on the rail.  Other uniform layouts:
 *                   blocks permuted into SCRATCH as [local][host] -> one
 *                   intra reduce-scatter of H blocks per local rank ->
 *                   the rail's.  Non-uniform: flat.
 *   allgather       hosts of consecutive ranks: the rail swaps each
 *                   rank's block straight into RECV -> H intra allgathers
 *                   (ring), one per host's run of RECV, the own host's
 *                   at once.  Other uniform layouts: allgather on the
 *                   rail (H blocks) -> intra allgather (ring) of the
 *                   H-block groups -> copies into rank order.
 *                   Non-uniform: flat.
 *   broadcast       any layout: one delegate per host (the rank with the
 *                   root's local index, or local 0 where the host is
 *                   smaller) -> broadcast among delegates -> intra
 *                   broadcast from the delegate; pieces pipeline.
 *   alltoall        out of place on hosts of consecutive ranks: the
 *                   rail sends each remote host its run of SEND (L
 *                   blocks, one message) -> H intra alltoalls, one per
 *                   host's run, into RECV, the own host's at once.
 *                   Other uniform layouts, and in place: blocks
 *                   permuted as [dest host][dest local]
 *                   -> alltoall on the rail (L blocks per message: one
 *                   aggregated message per remote host) -> transposed to
 *                   [dest local][source host] -> intra alltoall (H blocks
 *                   per message) -> copies into rank order.  Non-uniform:
 *                   flat.
 *
 * Without a host map, with one host or one rank per host, the flat
 * algorithm the library would pick runs instead.
 *
 * Tags: phase k of a schedule uses [k << 24, (k+1) << 24) (embed.c's
 * span).  SCRATCH: the regions this file lays out first, then each
 * phase's own scratch after them, 64-byte aligned, never shared between
 * phases (phases of different pieces run at the same time).  LOOM_AVG:
 * the sub-groups reduce as a sum; the rank that ends with the full sum of
 * a slice divides it, once, and the slice is spread after that.
 */
#include <stdint.h>
#include <stdlib.h>

#include "coll/coll.h"
#include "coll/coll_util.h"
#include "core/internal.h"

#define TAG_SPAN LOOMI_EMBED_TAG_SPAN
#define PHASE(k) ((uint32_t)(k) * TAG_SPAN)
#define MAX_PIECES 4
#define SCR LOOMI_BUF_SCRATCH

/* The flat algorithm for a (sub-)collective: the library's default, never
 * one of the topology-aware ones (no host map inside a group). */
static int flat_algo(int coll, int p, size_t bytes)
{
    int a = loomi_algo_default(coll, p, bytes);
    if (a != LOOMI_ALGO_HIERARCHICAL && a != LOOMI_ALGO_SHARED && loomi_algo_gen(coll, a))
        return a;
    switch (coll) {
    case LOOMI_COLL_ALLTOALL: return LOOMI_ALGO_PAIRWISE;
    case LOOMI_COLL_BROADCAST:
    case LOOMI_COLL_REDUCE: return LOOMI_ALGO_TREE;
    default: return LOOMI_ALGO_RING;
    }
}

/* The whole collective, flat, straight into s. */
static loom_result_t flat(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    struct loomi_coll_args b = *a;
    b.hosts = NULL;
    int algo = flat_algo(a->coll, s->nranks, a->count * s->esize);
    return loomi_algo_gen(a->coll, algo)(s, &b);
}

/* A host map worth using: it describes this schedule's ranks and has
 * more than one host and more than one rank on some host. */
static const struct loomi_hostmap *hosts_of(const struct loomi_sched *s,
                                            const struct loomi_coll_args *a)
{
    const struct loomi_hostmap *m = a->hosts;
    if (!m || m->nranks != s->nranks || m->nhosts <= 1 || m->nhosts >= s->nranks) return NULL;
    return m;
}

static size_t align64(size_t x) { return (x + 63) & ~(size_t)63; }

/* Reserve `bytes` of SCRATCH after everything used so far. */
static size_t scr_take(struct loomi_sched *s, size_t bytes)
{
    size_t off = align64(s->buf_bytes[SCR]);
    s->buf_bytes[SCR] = off + bytes;
    return off;
}

static struct loomi_coll_args sub_args(const struct loomi_coll_args *a, int coll, size_t count,
                                       int root, int inplace)
{
    struct loomi_coll_args b = {0};
    b.coll = coll;
    b.count = count;
    b.root = root;
    b.inplace = inplace;
    b.chunk_bytes = a->chunk_bytes;
    return b;
}

/* One phase: collective b run by `group` (this rank is group[vrank]),
 * its SEND and RECV at the given places in s, its scratch after all
 * scratch used so far, its tags from PHASE(ph). */
static loom_result_t phase(struct loomi_sched *s, const int *group, int n, int vrank,
                           int sbuf, size_t soff, int rbuf, size_t roff, int ph,
                           const uint32_t *after, int nafter, const struct loomi_coll_args *b,
                           int algo, uint32_t *join)
{
    struct loomi_embed e = {
        .group = group, .n = n, .vrank = vrank,
        .bufmap = {(uint8_t)sbuf, (uint8_t)rbuf, SCR},
        .bufoff = {soff, roff, align64(s->buf_bytes[SCR])},
        .tag_base = PHASE(ph), .after = after, .nafter = nafter,
    };
    return loomi_embed(s, &e, b, algo, join);
}

/* Rail i: the rank of local index i on every host (uniform hosts). */
static int *rail_of(const struct loomi_hostmap *m, int i)
{
    int *g = malloc((size_t)m->nhosts * sizeof *g);
    if (g)
        for (int h = 0; h < m->nhosts; h++) g[h] = m->host_ranks[m->host_start[h] + i];
    return g;
}

static loom_result_t nomem(struct loomi_sched *s, const char *fn)
{
    return loomi_fail(LOOM_ERR_NO_MEMORY, s->rank, "%s: out of memory", fn);
}

/* rail_of(m, i) and room for n step ids, both for the caller to free;
 * 0 (with nothing to free) when either could not be had. */
static int rail_and_ids(const struct loomi_hostmap *m, int i, int n, int **rail, uint32_t **ids)
{
    *rail = rail_of(m, i);
    *ids = malloc((size_t)n * sizeof **ids);
    if (*rail && *ids) return 1;
    free(*rail);
    free(*ids);
    return 0;
}

/* P blocks of count elements must be addressable. */
static loom_result_t check_blocks(const struct loomi_sched *s, size_t count, const char *fn)
{
    if (count && count > SIZE_MAX / s->esize / (size_t)s->nranks / 4)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, s->rank,
                          "%s: count %zu times %d ranks is too large", fn, count, s->nranks);
    return LOOM_SUCCESS;
}

/* Uniform hosts of consecutive ranks: host h holds h*L .. h*L+L-1, as
 * launchers that fill hosts in turn place them; and the H + 1 phases of
 * the forms that use it fit the tags. */
static int host_runs(const struct loomi_hostmap *m)
{
    return m->nhosts < (int)(UINT32_MAX / TAG_SPAN) && loomi_hostmap_runs(m);
}

/* ---------------------------------------------------------- allreduce */

/* Any layout: reduce to each host's local 0, allreduce of the leaders,
 * broadcast from local 0; for the elements [off, off + count), with tags
 * of phases ph .. ph+2. */
static loom_result_t allreduce_leaders(struct loomi_sched *s, const struct loomi_coll_args *a,
                                       const struct loomi_hostmap *m, size_t off, size_t count,
                                       int ph)
{
    const int r = s->rank, H = m->nhosts, h = m->host_of[r], i = m->local_index[r];
    const int n = loomi_host_size(m, h), lead = i == 0;
    const size_t es = s->esize, bo = off * es;
    const int ip = a->inplace, src = ip ? LOOMI_BUF_RECV : LOOMI_BUF_SEND;
    const int *local = &m->host_ranks[m->host_start[h]];
    int *leaders = malloc((size_t)H * sizeof *leaders);
    if (!leaders) return nomem(s, "hierarchical allreduce");
    for (int g = 0; g < H; g++) leaders[g] = m->host_ranks[m->host_start[g]];
    uint32_t j1, j2 = LOOMI_NO_DEP, j3;
    /* 1: reduce; the leader in place keeps its input in RECV, the others
     * read theirs from wherever it is (only SEND is read). */
    struct loomi_coll_args x = sub_args(a, LOOMI_COLL_REDUCE, count, 0, lead && ip);
    loom_result_t rc = phase(s, local, n, i, src, bo, LOOMI_BUF_RECV, bo, ph, NULL, 0, &x,
                             flat_algo(LOOMI_COLL_REDUCE, n, count * es), &j1);
    if (rc == LOOM_SUCCESS && lead) {
        x = sub_args(a, LOOMI_COLL_ALLREDUCE, count, 0, 1);
        rc = phase(s, leaders, H, h, LOOMI_BUF_RECV, bo, LOOMI_BUF_RECV, bo, ph + 1, &j1, 1, &x,
                   flat_algo(LOOMI_COLL_ALLREDUCE, H, count * es), &j2);
        if (rc == LOOM_SUCCESS && s->op == LOOM_AVG)
            j2 = loomi_sched_avg(s, LOOMI_BUF_RECV, bo, count, &j2, 1);
    }
    /* 3: broadcast; a non-leader's RECV (its input in place) is written
     * only after its part of the reduce. */
    x = sub_args(a, LOOMI_COLL_BROADCAST, count, 0, lead);
    if (rc == LOOM_SUCCESS)
        rc = phase(s, local, n, i, LOOMI_BUF_RECV, bo, LOOMI_BUF_RECV, bo, ph + 2,
                   lead ? &j2 : &j1, 1,
                   &x, flat_algo(LOOMI_COLL_BROADCAST, n, count * es), &j3);
    free(leaders);
    return rc;
}

/* Uniform hosts: reduce-scatter, rail allreduce, allgather, per piece. */
static loom_result_t allreduce_rails(struct loomi_sched *s, const struct loomi_coll_args *a,
                                     const struct loomi_hostmap *m)
{
    const int r = s->rank, H = m->nhosts, L = loomi_host_size(m, 0);
    const int h = m->host_of[r], i = m->local_index[r];
    const size_t es = s->esize, count = a->count, b = count / (size_t)L;
    const size_t tail = count - b * (size_t)L;
    const int ip = a->inplace, src = ip ? LOOMI_BUF_RECV : LOOMI_BUF_SEND;
    const int *local = &m->host_ranks[m->host_start[h]];
    loom_result_t rc = LOOM_SUCCESS;
    int *rail = rail_of(m, i);
    if (!rail) return nomem(s, "hierarchical allreduce");
    /* Pieces big enough that each phase still cuts its own chunks. */
    size_t np = b ? loomi_nchunks(b * (size_t)L * es, 4 * (size_t)L * LOOMI_MAX(a->chunk_bytes, 1),
                                  MAX_PIECES)
                  : 0;
    if (np > b) np = b;
    uint32_t prev1 = LOOMI_NO_DEP;
    for (size_t j = 0; j < np && rc == LOOM_SUCCESS; j++) {
        size_t o, bj;
        loomi_chunk(b, np, j, &o, &bj);
        const size_t E = o * (size_t)L, mine = (E + (size_t)i * bj) * es;
        const int ph = (int)j * 3;
        uint32_t j1, j2, j3;
        /* 1: intra reduce-scatter; slice i lands in place in RECV.  In
         * place the input is RECV, whose block i is the output (the
         * reduce-scatter's own in-place form). */
        struct loomi_coll_args x = sub_args(a, LOOMI_COLL_REDUCE_SCATTER, bj, 0, ip);
        rc = phase(s, local, L, i, src, E * es, LOOMI_BUF_RECV, mine, ph, &prev1, 1, &x,
                   LOOMI_ALGO_RING, &j1);
        prev1 = j1;
        /* 2: the slice's host sums, added up along the rail. */
        x = sub_args(a, LOOMI_COLL_ALLREDUCE, bj, 0, 1);
        if (rc == LOOM_SUCCESS)
            rc = phase(s, rail, H, h, LOOMI_BUF_RECV, mine, LOOMI_BUF_RECV, mine, ph + 1, &j1, 1,
                       &x, flat_algo(LOOMI_COLL_ALLREDUCE, H, bj * es), &j2);
        if (rc == LOOM_SUCCESS && s->op == LOOM_AVG)
            j2 = loomi_sched_avg(s, LOOMI_BUF_RECV, mine, bj, &j2, 1);
        /* 3: every slice to every local rank. */
        x = sub_args(a, LOOMI_COLL_ALLGATHER, bj, 0, 1);
        if (rc == LOOM_SUCCESS)
            rc = phase(s, local, L, i, LOOMI_BUF_RECV, 0, LOOMI_BUF_RECV, E * es, ph + 2, &j2, 1,
                       &x, LOOMI_ALGO_RING, &j3);
    }
    /* The last count % L (< L) elements: through the host leaders,
     * alongside. */
    if (rc == LOOM_SUCCESS && tail)
        rc = allreduce_leaders(s, a, m, b * (size_t)L, tail, (int)np * 3);
    free(rail);
    return rc;
}

loom_result_t loomi_gen_allreduce_hier(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    const struct loomi_hostmap *m = hosts_of(s, a);
    if (!m || !a->count) return flat(s, a);
    s->buf_bytes[LOOMI_BUF_SEND] = a->inplace ? 0 : a->count * s->esize;
    s->buf_bytes[LOOMI_BUF_RECV] = a->count * s->esize;
    return loomi_hostmap_uniform(m) ? allreduce_rails(s, a, m)
                                    : allreduce_leaders(s, a, m, 0, a->count, 0);
}

/* ----------------------------------------------------- reduce_scatter */

/* Reduce-scatter when host h holds ranks h*L .. h*L+L-1: the blocks
 * bound for host g are one run of SEND.  H reduce-scatters inside the
 * host, one per run, leave local rank i the host's sum of block g*L+i
 * for every g, in host order: the rail's input as it is, with no copy
 * of the whole input into another order first. */
static loom_result_t reduce_scatter_runs(struct loomi_sched *s, const struct loomi_coll_args *a,
                                         const struct loomi_hostmap *m)
{
    const int r = s->rank, H = m->nhosts, L = loomi_host_size(m, 0);
    const int h = m->host_of[r], i = m->local_index[r];
    const size_t es = s->esize, n = a->count, bb = n * es;
    const int *local = &m->host_ranks[m->host_start[h]];
    int *rail = rail_of(m, i);
    uint32_t *runs = malloc((size_t)H * sizeof *runs);
    loom_result_t rc = LOOM_SUCCESS;
    if (!rail || !runs) rc = nomem(s, "hierarchical reduce_scatter");
    /* B: the host sums, B + g * bb for block g*L+i. */
    const size_t B = scr_take(s, (size_t)H * bb);
    struct loomi_coll_args x = sub_args(a, LOOMI_COLL_REDUCE_SCATTER, n, 0, 0);
    /* Run h + 1 first: the runs other hosts wait for go before our own. */
    for (int k = 1; k <= H && rc == LOOM_SUCCESS; k++) {
        const int g = (h + k) % H;
        rc = phase(s, local, L, i, LOOMI_BUF_SEND, (size_t)g * (size_t)L * bb, SCR,
                   B + (size_t)g * bb, k - 1, NULL, 0, &x, LOOMI_ALGO_RING, &runs[k - 1]);
    }
    uint32_t j2;
    x = sub_args(a, LOOMI_COLL_REDUCE_SCATTER, n, 0, 0);
    /* In place RECV is SEND block r: written only by the rail, after
     * every run's reads. */
    if (rc == LOOM_SUCCESS)
        rc = phase(s, rail, H, h, SCR, B, LOOMI_BUF_RECV, 0, H, runs, H, &x,
                   flat_algo(LOOMI_COLL_REDUCE_SCATTER, H, bb), &j2);
    if (rc == LOOM_SUCCESS && s->op == LOOM_AVG) loomi_sched_avg(s, LOOMI_BUF_RECV, 0, n, &j2, 1);
    free(rail);
    free(runs);
    return rc;
}

/* The uniform-host generators (reduce_scatter, allgather, alltoall)
 * open alike on purpose: the same checks and the same names for where
 * this rank stands, which their bodies use throughout; a struct of them
 * would put every use behind its name. */
loom_result_t loomi_gen_reduce_scatter_hier(struct loomi_sched *s,
                                            const struct loomi_coll_args *a)
{
    const struct loomi_hostmap *m = hosts_of(s, a);
    if (!m || !a->count || !loomi_hostmap_uniform(m)) return flat(s, a);
    loom_result_t rc = check_blocks(s, a->count, "hierarchical reduce_scatter");
    if (rc != LOOM_SUCCESS) return rc;
    const int P = s->nranks, r = s->rank, H = m->nhosts, L = loomi_host_size(m, 0);
    const int h = m->host_of[r], i = m->local_index[r];
    const size_t es = s->esize, n = a->count, bb = n * es;
    const int *local = &m->host_ranks[m->host_start[h]];
    s->buf_bytes[LOOMI_BUF_SEND] = (size_t)P * bb;
    s->buf_bytes[LOOMI_BUF_RECV] = bb;
    if (host_runs(m)) return reduce_scatter_runs(s, a, m);
    int *rail;
    uint32_t *cp;
    if (!rail_and_ids(m, i, P, &rail, &cp)) return nomem(s, "hierarchical reduce_scatter");
    /* A: the input as [local index][host], so that local rank i' gets
     * one contiguous run of the H blocks bound for rail i'.  B: the host
     * sums of those H blocks. */
    const size_t A = scr_take(s, (size_t)P * bb), B = scr_take(s, (size_t)H * bb);
    for (int q = 0; q < P; q++) {
        size_t slot = (size_t)m->local_index[q] * (size_t)H + (size_t)m->host_of[q];
        cp[q] = loomi_sched_copy(s, SCR, A + slot * bb, LOOMI_BUF_SEND, (size_t)q * bb, n, NULL,
                                 0);
    }
    uint32_t j1, j2;
    struct loomi_coll_args x = sub_args(a, LOOMI_COLL_REDUCE_SCATTER, (size_t)H * n, 0, 0);
    rc = phase(s, local, L, i, SCR, A, SCR, B, 0, cp, P, &x, LOOMI_ALGO_RING, &j1);
    /* In place RECV is SEND block r: written only from here on, after
     * the copies that read it (phase 1 waits for them all). */
    x = sub_args(a, LOOMI_COLL_REDUCE_SCATTER, n, 0, 0);
    if (rc == LOOM_SUCCESS)
        rc = phase(s, rail, H, h, SCR, B, LOOMI_BUF_RECV, 0, 1, &j1, 1, &x,
                   flat_algo(LOOMI_COLL_REDUCE_SCATTER, H, bb), &j2);
    if (rc == LOOM_SUCCESS && s->op == LOOM_AVG) loomi_sched_avg(s, LOOMI_BUF_RECV, 0, n, &j2, 1);
    free(rail);
    free(cp);
    return rc;
}

/* ---------------------------------------------------------- allgather */

/* Allgather when host h holds ranks h*L .. h*L+L-1, in RECV itself:
 * each rank swaps its block with its rail peers straight into their
 * places, then H allgathers inside the host, one per host's run of
 * RECV, spread them; the own host's run needs nothing from the rail and
 * goes at once.  No copies into rank order. */
static loom_result_t allgather_runs(struct loomi_sched *s, const struct loomi_coll_args *a,
                                    const struct loomi_hostmap *m)
{
    const int r = s->rank, H = m->nhosts, L = loomi_host_size(m, 0);
    const int h = m->host_of[r], i = m->local_index[r], ip = a->inplace;
    const size_t n = a->count, bb = n * s->esize;
    const int *local = &m->host_ranks[m->host_start[h]];
    const int src = ip ? LOOMI_BUF_RECV : LOOMI_BUF_SEND;
    const size_t soff = ip ? (size_t)r * bb : 0;
    loom_result_t rc = LOOM_SUCCESS;
    uint32_t own = LOOMI_NO_DEP;
    if (!ip) own = loomi_sched_copy(s, LOOMI_BUF_RECV, (size_t)r * bb, src, soff, n, NULL, 0);
    struct loomi_coll_args x = sub_args(a, LOOMI_COLL_ALLGATHER, n, 0, 1);
    for (int k = 0; k < H && rc == LOOM_SUCCESS; k++) {
        /* Host h first, then h - 1, h - 2, ...: the one whose block we
         * send first to, h + 1, receives ours from us first. */
        const int g = (h - k + H) % H, peer = g * L + i;
        uint32_t got = own, j;
        if (g != h) {
            loomi_sched_send(s, (h + k) % H * L + i, PHASE(0), src, soff, n, NULL, 0);
            got = loomi_sched_recv(s, peer, PHASE(0), LOOMI_BUF_RECV, (size_t)peer * bb, n, NULL,
                                   0);
        }
        rc = phase(s, local, L, i, LOOMI_BUF_RECV, 0, LOOMI_BUF_RECV, (size_t)g * (size_t)L * bb,
                   k + 1, &got, 1, &x, LOOMI_ALGO_RING, &j);
    }
    return rc;
}

loom_result_t loomi_gen_allgather_hier(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    const struct loomi_hostmap *m = hosts_of(s, a);
    if (!m || !a->count || !loomi_hostmap_uniform(m)) return flat(s, a);
    loom_result_t rc = check_blocks(s, a->count, "hierarchical allgather");
    if (rc != LOOM_SUCCESS) return rc;
    const int P = s->nranks, r = s->rank, H = m->nhosts, L = loomi_host_size(m, 0);
    const int h = m->host_of[r], i = m->local_index[r], ip = a->inplace;
    const size_t es = s->esize, n = a->count, bb = n * es;
    const int *local = &m->host_ranks[m->host_start[h]];
    s->buf_bytes[LOOMI_BUF_SEND] = ip ? 0 : bb;
    s->buf_bytes[LOOMI_BUF_RECV] = (size_t)P * bb;
    if (host_runs(m)) return allgather_runs(s, a, m);
    int *rail = rail_of(m, i);
    if (!rail) return nomem(s, "hierarchical allgather");
    /* B: every block as [local index][host]; the rail fills run i. */
    const size_t B = scr_take(s, (size_t)P * bb);
    uint32_t j1, j2;
    struct loomi_coll_args x = sub_args(a, LOOMI_COLL_ALLGATHER, n, 0, 0);
    rc = phase(s, rail, H, h, ip ? LOOMI_BUF_RECV : LOOMI_BUF_SEND, ip ? (size_t)r * bb : 0, SCR,
               B + (size_t)i * (size_t)H * bb, 0, NULL, 0, &x,
               flat_algo(LOOMI_COLL_ALLGATHER, H, bb), &j1);
    x = sub_args(a, LOOMI_COLL_ALLGATHER, (size_t)H * n, 0, 1);
    if (rc == LOOM_SUCCESS)
        rc = phase(s, local, L, i, SCR, B, SCR, B, 1, &j1, 1, &x, LOOMI_ALGO_RING, &j2);
    /* Into rank order (in place the own block is already there). */
    for (int q = 0; q < P && rc == LOOM_SUCCESS; q++) {
        if (ip && q == r) continue;
        size_t slot = (size_t)m->local_index[q] * (size_t)H + (size_t)m->host_of[q];
        loomi_sched_copy(s, LOOMI_BUF_RECV, (size_t)q * bb, SCR, B + slot * bb, n, &j2, 1);
    }
    free(rail);
    return rc;
}

/* ---------------------------------------------------------- broadcast */

loom_result_t loomi_gen_broadcast_hier(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    const struct loomi_hostmap *m = hosts_of(s, a);
    if (!m || !a->count || a->root < 0 || a->root >= s->nranks) return flat(s, a);
    const int r = s->rank, H = m->nhosts, h = m->host_of[r], i = m->local_index[r];
    const int R = a->root, ir = m->local_index[R], n = loomi_host_size(m, h);
    const size_t es = s->esize, count = a->count;
    const int *local = &m->host_ranks[m->host_start[h]];
    s->buf_bytes[LOOMI_BUF_SEND] = r == R && !a->inplace ? count * es : 0;
    s->buf_bytes[LOOMI_BUF_RECV] = count * es;
    /* Each host's delegate: the rank with the root's local index, or
     * local 0 on a smaller host; on the root's host, the root. */
    int *dele = malloc((size_t)H * sizeof *dele);
    if (!dele) return nomem(s, "hierarchical broadcast");
    for (int g = 0; g < H; g++)
        dele[g] = m->host_ranks[m->host_start[g] + (loomi_host_size(m, g) > ir ? ir : 0)];
    const int me_dele = dele[h] == r, vdele = m->local_index[dele[h]];
    size_t np = loomi_nchunks(count * es, 4 * LOOMI_MAX(a->chunk_bytes, 1), MAX_PIECES);
    if (np > count) np = count;
    loom_result_t rc = LOOM_SUCCESS;
    uint32_t prev = LOOMI_NO_DEP;
    for (size_t j = 0; j < np && rc == LOOM_SUCCESS; j++) {
        size_t o, len;
        loomi_chunk(count, np, j, &o, &len);
        uint32_t j1 = LOOMI_NO_DEP, j2;
        struct loomi_coll_args x;
        if (me_dele) {
            /* 1: between hosts, delegates only; pieces one after another
             * on the network while earlier ones spread inside hosts. */
            x = sub_args(a, LOOMI_COLL_BROADCAST, len, m->host_of[R], r == R && a->inplace);
            rc = phase(s, dele, H, h, LOOMI_BUF_SEND, o * es, LOOMI_BUF_RECV, o * es, 2 * (int)j,
                       &prev, 1, &x, flat_algo(LOOMI_COLL_BROADCAST, H, len * es), &j1);
            prev = j1;
        }
        /* 2: inside the host, from the delegate (its copy is in RECV). */
        x = sub_args(a, LOOMI_COLL_BROADCAST, len, vdele, me_dele);
        if (rc == LOOM_SUCCESS)
            rc = phase(s, local, n, i, LOOMI_BUF_RECV, o * es, LOOMI_BUF_RECV, o * es,
                       2 * (int)j + 1, &j1, 1, &x, flat_algo(LOOMI_COLL_BROADCAST, n, len * es),
                       &j2);
    }
    free(dele);
    return rc;
}

/* ----------------------------------------------------------- alltoall */

/* Alltoall out of place when host h holds ranks h*L .. h*L+L-1: SEND is
 * already [dest host][dest local], so the rail sends each remote host
 * its run of L blocks as it lies; an intra alltoall per host's run then
 * spreads them into RECV, where the L blocks from host g's ranks form
 * run g in source order.  The own host's run goes from SEND at once.  No
 * copies. */
static loom_result_t alltoall_runs(struct loomi_sched *s, const struct loomi_coll_args *a,
                                   const struct loomi_hostmap *m)
{
    const int r = s->rank, H = m->nhosts, L = loomi_host_size(m, 0);
    const int h = m->host_of[r], i = m->local_index[r];
    const size_t n = a->count, bb = n * s->esize, run = (size_t)L * bb;
    const int *local = &m->host_ranks[m->host_start[h]];
    /* S: the runs the rail delivered, S + g * run from host g. */
    const size_t S = scr_take(s, (size_t)H * run);
    struct loomi_coll_args x = sub_args(a, LOOMI_COLL_ALLTOALL, n, 0, 0);
    const int algo = flat_algo(LOOMI_COLL_ALLTOALL, L, bb);
    loom_result_t rc = LOOM_SUCCESS;
    for (int k = 0; k < H && rc == LOOM_SUCCESS; k++) {
        /* Host h + k gets our run while host h - k's comes in. */
        const int g = (h - k + H) % H;
        uint32_t got = LOOMI_NO_DEP, j;
        if (g != h) {
            const int to = (h + k) % H;
            loomi_sched_send(s, to * L + i, PHASE(0), LOOMI_BUF_SEND, (size_t)to * run,
                             (size_t)L * n, NULL, 0);
            got = loomi_sched_recv(s, g * L + i, PHASE(0), SCR, S + (size_t)g * run,
                                   (size_t)L * n, NULL, 0);
        }
        rc = phase(s, local, L, i, g == h ? LOOMI_BUF_SEND : SCR, g == h ? (size_t)h * run
                                                                          : S + (size_t)g * run,
                   LOOMI_BUF_RECV, (size_t)g * run, k + 1, &got, 1, &x, algo, &j);
    }
    return rc;
}

loom_result_t loomi_gen_alltoall_hier(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    const struct loomi_hostmap *m = hosts_of(s, a);
    if (!m || !a->count || !loomi_hostmap_uniform(m)) return flat(s, a);
    loom_result_t rc = check_blocks(s, a->count, "hierarchical alltoall");
    if (rc != LOOM_SUCCESS) return rc;
    const int P = s->nranks, r = s->rank, H = m->nhosts, L = loomi_host_size(m, 0);
    const int h = m->host_of[r], i = m->local_index[r], ip = a->inplace;
    const int src = ip ? LOOMI_BUF_RECV : LOOMI_BUF_SEND;
    const size_t es = s->esize, n = a->count, bb = n * es;
    const int *local = &m->host_ranks[m->host_start[h]];
    s->buf_bytes[LOOMI_BUF_SEND] = ip ? 0 : (size_t)P * bb;
    s->buf_bytes[LOOMI_BUF_RECV] = (size_t)P * bb;
    if (!ip && host_runs(m)) return alltoall_runs(s, a, m);
    int *rail;
    uint32_t *cp;
    if (!rail_and_ids(m, i, P, &rail, &cp)) return nomem(s, "hierarchical alltoall");
    /* A: input as [dest host][dest local]; B: what the rail delivered,
     * [source host][dest local]; C: B transposed, [dest local][source
     * host]; D: what the host delivered, [source local][source host]. */
    const size_t A = scr_take(s, (size_t)P * bb), B = scr_take(s, (size_t)P * bb);
    const size_t C = scr_take(s, (size_t)P * bb), D = scr_take(s, (size_t)P * bb);
    for (int q = 0; q < P; q++) {
        size_t slot = (size_t)m->host_of[q] * (size_t)L + (size_t)m->local_index[q];
        cp[q] = loomi_sched_copy(s, SCR, A + slot * bb, src, (size_t)q * bb, n, NULL, 0);
    }
    uint32_t j1, j2;
    struct loomi_coll_args x = sub_args(a, LOOMI_COLL_ALLTOALL, (size_t)L * n, 0, 0);
    rc = phase(s, rail, H, h, SCR, A, SCR, B, 0, cp, P, &x,
               flat_algo(LOOMI_COLL_ALLTOALL, H, (size_t)L * bb), &j1);
    for (int g = 0; g < H && rc == LOOM_SUCCESS; g++)
        for (int l = 0; l < L; l++)
            cp[g * L + l] = loomi_sched_copy(s, SCR, C + ((size_t)l * H + (size_t)g) * bb, SCR,
                                             B + ((size_t)g * L + (size_t)l) * bb, n, &j1, 1);
    x = sub_args(a, LOOMI_COLL_ALLTOALL, (size_t)H * n, 0, 0);
    if (rc == LOOM_SUCCESS)
        rc = phase(s, local, L, i, SCR, C, SCR, D, 1, cp, P, &x,
                   flat_algo(LOOMI_COLL_ALLTOALL, L, (size_t)H * bb), &j2);
    /* Into rank order; in place this overwrites the input in RECV, all
     * of whose reads (the copies into A) came before phase 1. */
    for (int q = 0; q < P && rc == LOOM_SUCCESS; q++) {
        size_t slot = (size_t)m->local_index[q] * (size_t)H + (size_t)m->host_of[q];
        loomi_sched_copy(s, LOOMI_BUF_RECV, (size_t)q * bb, SCR, D + slot * bb, n, &j2, 1);
    }
    free(rail);
    free(cp);
    return rc;
}
