/* coll_util.h - arithmetic shared by the schedule generators. */
#ifndef LOOMI_COLL_UTIL_H
#define LOOMI_COLL_UTIL_H

#include <stddef.h>
#include <stdint.h>

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

#endif
