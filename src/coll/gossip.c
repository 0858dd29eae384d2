/*
 * gossip.c - gossip averaging: each call averages a rank's vector with
 * one partner's, in pairs, with no global step (loom_gossip_average(3)).
 *
 * The seeded pairing is a perfect matching of the ranks per round that
 * every rank computes alike from (round, seed):
 * - nranks = 2^k: the hypercube, dimension d = round % k, partner
 *   rank ^ (1 << d).  Any k consecutive rounds cover every dimension, so
 *   after them every rank holds the exact mean (up to rounding).
 * - otherwise: a permutation of the ranks drawn from (seed, round)
 *   (Fisher-Yates over splitmix64), paired in order (perm[0], perm[1]),
 *   (perm[2], perm[3]), ...; with nranks odd, the last rank of the
 *   permutation sits the round out.  For a uniform random perfect
 *   matching of n ranks (n even) the expected sum of squared deviations
 *   from the mean shrinks by (n - 2) / (2 (n - 1)) per round; with n odd
 *   and one rank idle, by exactly 1/2.
 */
#include "coll/build.h"
#include "coll/coll.h"
#include "core/internal.h"

#include <stdlib.h>

static uint64_t splitmix(uint64_t *x)
{
    uint64_t z = (*x += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

/* Uniform in [0, n) without modulo bias (n >= 1). */
static uint32_t below(uint64_t *x, uint32_t n)
{
    const uint64_t lim = UINT64_MAX - UINT64_MAX % n;
    uint64_t v;
    do v = splitmix(x);
    while (v >= lim);
    return (uint32_t)(v % n);
}

int loomi_gossip_partner(int rank, int nranks, uint64_t round, uint64_t seed)
{
    if (nranks < 2 || rank < 0 || rank >= nranks) return -1;
    if ((nranks & (nranks - 1)) == 0) {
        const int k = loomi_log2(nranks);
        return rank ^ (1 << (int)(round % (uint64_t)k));
    }
    /* The rank's place in the permutation, found without storing it: the
     * shuffle is replayed on an array only where it is small enough;
     * larger jobs allocate (once per call, n ints). */
    int stack[256], *perm = nranks <= 256 ? stack : malloc((size_t)nranks * sizeof *perm);
    if (!perm) return -1;
    for (int i = 0; i < nranks; i++) perm[i] = i;
    uint64_t x = seed ^ (round * UINT64_C(0xd6e8feb86659fd93)) ^ (uint64_t)nranks << 48;
    for (int i = nranks - 1; i > 0; i--) {
        int j = (int)below(&x, (uint32_t)i + 1);
        int t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int partner = -1;
    for (int i = 0; i + 1 < nranks; i += 2) {
        if (perm[i] == rank) partner = perm[i + 1];
        else if (perm[i + 1] == rank) partner = perm[i];
    }
    if (perm != stack) free(perm);
    return partner;
}

loom_result_t loomi_gen_gossip_pairwise(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    const int r = s->rank, p = s->nranks;
    const size_t es = s->esize, count = a->count;
    s->buf_bytes[LOOMI_BUF_SEND] = 0;
    s->buf_bytes[LOOMI_BUF_RECV] = count * es;
    int peer = a->gossip_peer1 > 0 ? a->gossip_peer1 - 1
                                   : loomi_gossip_partner(r, p, a->gossip_round, a->gossip_seed);
    if (peer >= p)
        return loomi_fail(LOOM_ERR_INTERNAL, r, "gossip: partner %d of %d ranks", peer, p);
    if (peer < 0 || peer == r || !count) return LOOM_SUCCESS; /* idle this round */
    struct loomi_build b;
    loom_result_t rc = loomi_build_init(&b, s, count * es, a->chunk_bytes);
    if (rc != LOOM_SUCCESS) return rc;
    s->buf_bytes[LOOMI_BUF_SCRATCH] = count * es;
    const int lower = r < peer;
    for (size_t c = 0; c < b.C; c++) {
        size_t o, n;
        loomi_chunk(count, b.C, c, &o, &n);
        o *= es;
        loomi_bsend(&b, peer, (uint32_t)c, LOOMI_BUF_RECV, o, n);
        loomi_brecv(&b, peer, (uint32_t)c, LOOMI_BUF_SCRATCH, o, n);
        /* Lower rank's value first on both sides: the same bits. */
        loomi_breduce(&b, LOOMI_BUF_RECV, o, lower ? LOOMI_BUF_RECV : LOOMI_BUF_SCRATCH, o,
                      lower ? LOOMI_BUF_SCRATCH : LOOMI_BUF_RECV, o, n);
        loomi_bavg_by(&b, LOOMI_BUF_RECV, o, n, 2);
    }
    return loomi_build_done(&b);
}
