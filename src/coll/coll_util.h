/* coll_util.h - arithmetic shared by the schedule generators. */
#ifndef LOOMI_COLL_UTIL_H
#define LOOMI_COLL_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "sched/sched.h"

/* n elements cut into p nearly equal segments, the first n % p one longer. */
struct loomi_seg {
    size_t base, rem;
};

static inline struct loomi_seg loomi_seg_make(size_t n, int p)
{
    struct loomi_seg g = {n / (size_t)p, n % (size_t)p};
    return g;
}
static inline size_t loomi_seg_start(const struct loomi_seg *g, int i)
{
    return (size_t)i * g->base + ((size_t)i < g->rem ? (size_t)i : g->rem);
}
static inline size_t loomi_seg_len(const struct loomi_seg *g, int i)
{
    return g->base + ((size_t)i < g->rem);
}

/* Element range of chunk c of n elements cut in C pieces. */
static inline void loomi_chunk(size_t n, size_t C, size_t c, size_t *off, size_t *len)
{
    size_t a = n * c / C, b = n * (c + 1) / C;
    *off = a;
    *len = b - a;
}

/* How many chunks of about chunk_bytes to cut `bytes` into (1..max). */
static inline size_t loomi_nchunks(size_t bytes, size_t chunk_bytes, size_t max)
{
    size_t C = chunk_bytes ? (bytes + chunk_bytes - 1) / chunk_bytes : 1;
    if (C < 1) C = 1;
    if (C > max) C = max;
    return C;
}

static inline int loomi_mod(int a, int p) { return ((a % p) + p) % p; }

/* Largest power of two <= p (p >= 1). */
static inline int loomi_pow2_floor(int p)
{
    int q = 1;
    while (q * 2 <= p) q *= 2;
    return q;
}

/* log2 of q, a power of two (the levels of recursive doubling/halving). */
static inline int loomi_log2(int q)
{
    int L = 0;
    while ((1 << L) < q) L++;
    return L;
}

/* Allgather's buffer extents (this rank's block in SEND, none in place;
 * all p blocks in RECV), where this rank's block is (*own_buf, *own_off:
 * SEND, or RECV in place) and, out of place, its copy into RECV, which
 * waits for nothing.  Returns 1 when that completes the schedule (count
 * 0 or one rank). */
static inline int loomi_allgather_begin(struct loomi_sched *s, size_t count, int inplace,
                                        int *own_buf, size_t *own_off)
{
    const size_t bb = count * s->esize;
    s->buf_bytes[LOOMI_BUF_SEND] = inplace ? 0 : bb;
    s->buf_bytes[LOOMI_BUF_RECV] = (size_t)s->nranks * bb;
    *own_buf = inplace ? LOOMI_BUF_RECV : LOOMI_BUF_SEND;
    *own_off = inplace ? (size_t)s->rank * bb : 0;
    if (count && !inplace)
        loomi_sched_copy(s, LOOMI_BUF_RECV, (size_t)s->rank * bb, LOOMI_BUF_SEND, 0, count, NULL,
                         0);
    return count == 0 || s->nranks == 1;
}

/* Allreduce's buffer extents, and the cases all its algorithms share:
 * count 0 (nothing) and one rank (a copy, out of place).  Returns 1 when
 * that already completes the schedule. */
static inline int loomi_allreduce_trivial(struct loomi_sched *s, size_t count, int inplace)
{
    s->buf_bytes[LOOMI_BUF_SEND] = inplace ? 0 : count * s->esize;
    s->buf_bytes[LOOMI_BUF_RECV] = count * s->esize;
    if (count && s->nranks == 1 && !inplace)
        loomi_sched_copy(s, LOOMI_BUF_RECV, 0, LOOMI_BUF_SEND, 0, count, NULL, 0);
    return count == 0 || s->nranks == 1;
}

/* Reduce-scatter's buffer extents (p blocks in SEND, one in RECV), and
 * the same trivial cases as allreduce: count 0 and one rank (a copy, out
 * of place).  Returns 1 when that already completes the schedule. */
static inline int loomi_reduce_scatter_trivial(struct loomi_sched *s, size_t count, int inplace)
{
    s->buf_bytes[LOOMI_BUF_SEND] = (size_t)s->nranks * count * s->esize;
    s->buf_bytes[LOOMI_BUF_RECV] = count * s->esize;
    if (count && s->nranks == 1 && !inplace)
        loomi_sched_copy(s, LOOMI_BUF_RECV, 0, LOOMI_BUF_SEND, 0, count, NULL, 0);
    return count == 0 || s->nranks == 1;
}

/* The extent, in elements, of p blocks given by counts and displacements
 * (alltoallv): *end = max(displs[i] + counts[i]) over non-empty blocks.
 * Returns the first rank whose block reaches past lim elements, or -1. */
static inline int loomi_vextent(const size_t *counts, const size_t *displs, int p, size_t lim,
                                size_t *end)
{
    *end = 0;
    for (int i = 0; i < p; i++) {
        if (!counts[i]) continue;
        if (displs[i] > lim || counts[i] > lim - displs[i]) return i;
        if (displs[i] + counts[i] > *end) *end = displs[i] + counts[i];
    }
    return -1;
}

/* Non-power-of-two rank counts fold onto a core of q = 2^k ranks: the
 * first 2*extra ranks pair up (the odd one hands its data to the even one,
 * which stands for both), the others shift down.  Core index of rank r, or
 * -1 for a folded-away odd rank; and the rank of core index nr. */
static inline int loomi_fold_core(int r, int extra)
{
    if (r < 2 * extra) return (r & 1) ? -1 : r / 2;
    return r - extra;
}
static inline int loomi_fold_rank(int nr, int extra) { return nr < extra ? 2 * nr : nr + extra; }

/* The last four writes to a region, so that a step can depend on all the
 * writes before it within LOOMI_MAX_DEPS: each new write depends on the
 * one four back (loomi_wl_back), so the last four cover every earlier one. */
struct loomi_wlist {
    uint32_t w[4];
    int n;
};
static inline uint32_t loomi_wl_back(const struct loomi_wlist *wl)
{
    return wl->n >= 4 ? wl->w[wl->n % 4] : LOOMI_NO_DEP;
}
static inline void loomi_wl_add(struct loomi_wlist *wl, uint32_t step)
{
    if (step != LOOMI_NO_DEP) wl->w[wl->n++ % 4] = step;
}
static inline int loomi_wl_all(const struct loomi_wlist *wl, uint32_t deps[4])
{
    int k = wl->n < 4 ? wl->n : 4;
    for (int i = 0; i < k; i++) deps[i] = wl->w[(wl->n - 1 - i) % 4];
    return k;
}

#endif
