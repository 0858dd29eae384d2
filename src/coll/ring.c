/*
 * ring.c - ring allreduce (Patarasuk & Yuan): 2(p-1) steps, each rank
 * sending 2(p-1)/p of the buffer, bandwidth-optimal for large messages.
 *
 * Reduce-scatter step k: rank r sends segment (r-k) to r+1 and receives
 * segment (r-k-1) from r-1 into scratch, then reduces it into recvbuf.
 * After p-1 steps rank r owns the full sum of segment (r+1).  Allgather
 * step k: send segment (r+1-k), receive segment (r-k) straight into
 * recvbuf.  Every segment is cut into C chunks with per-chunk
 * dependencies, so chunk c of step k+1 leaves as soon as chunk c of step
 * k is reduced: the ring pipelines.
 */
#include <stdlib.h>

#include "coll/coll.h"
#include "core/internal.h"

struct seg {
    size_t base, rem;
};

static size_t seg_start(const struct seg *g, int i)
{
    return (size_t)i * g->base + ((size_t)i < g->rem ? (size_t)i : g->rem);
}
static size_t seg_len(const struct seg *g, int i) { return g->base + ((size_t)i < g->rem); }

/* Element range of chunk c of a segment of n elements cut in C pieces. */
static void chunk(size_t n, size_t C, size_t c, size_t *off, size_t *len)
{
    size_t a = n * c / C, b = n * (c + 1) / C;
    *off = a;
    *len = b - a;
}

static int mod(int a, int p) { return ((a % p) + p) % p; }

loom_result_t loomi_allreduce_ring(struct loomi_sched *s, size_t count, int inplace,
                                   size_t chunk_bytes)
{
    const int p = s->nranks, r = s->rank;
    const size_t es = s->esize;
    s->buf_bytes[LOOMI_BUF_SEND] = inplace ? 0 : count * es;
    s->buf_bytes[LOOMI_BUF_RECV] = count * es;
    if (count == 0) return LOOM_SUCCESS;
    if (p == 1) {
        if (!inplace) loomi_sched_copy(s, LOOMI_BUF_RECV, 0, LOOMI_BUF_SEND, 0, count, NULL, 0);
        return LOOM_SUCCESS;
    }
    const int src = inplace ? LOOMI_BUF_RECV : LOOMI_BUF_SEND;
    struct seg g = {count / (size_t)p, count % (size_t)p};
    size_t maxseg = g.base + (g.rem ? 1 : 0);
    size_t C = (maxseg * es + chunk_bytes - 1) / chunk_bytes;
    if (C < 1) C = 1;
    if (C > 4096) C = 4096;
    size_t maxchunk = (maxseg + C - 1) / C;
    s->buf_bytes[LOOMI_BUF_SCRATCH] = 2 * C * maxchunk * es;

    const int right = mod(r + 1, p), left = mod(r - 1, p);
    const uint32_t Ct = (uint32_t)C;
    /* red[k % 3][c]: reduce of step k; rs_send[k][c]: RS sends (AG recvs
     * overwrite what they read); user[slot][c]: the last reduce that read
     * that scratch chunk (a receive into it must wait for it; tracked
     * apart from red because steps with empty segments add no reduce). */
    uint32_t *red = malloc(3 * C * sizeof *red);
    uint32_t *user = malloc(2 * C * sizeof *user);
    uint32_t *rs_send = malloc((size_t)(p - 1) * C * sizeof *rs_send);
    uint32_t *ag_prev = malloc(C * sizeof *ag_prev);
    if (!red || !rs_send || !ag_prev || !user) {
        free(user);
        free(red);
        free(rs_send);
        free(ag_prev);
        return loomi_fail(LOOM_ERR_NO_MEMORY, r, "ring allreduce: out of memory");
    }
    for (size_t i = 0; i < 3 * C; i++) red[i] = LOOMI_NO_DEP;
    for (size_t i = 0; i < 2 * C; i++) user[i] = LOOMI_NO_DEP;

    for (int k = 0; k < p - 1; k++) {
        int ss = mod(r - k, p), rs = mod(r - k - 1, p);
        size_t slot = (size_t)(k & 1);
        for (size_t c = 0; c < C; c++) {
            size_t o, n;
            uint32_t tag = (uint32_t)k * Ct + (uint32_t)c;
            chunk(seg_len(&g, ss), C, c, &o, &n);
            uint32_t dep = k ? red[((k - 1) % 3) * C + c] : LOOMI_NO_DEP;
            rs_send[(size_t)k * C + c] =
                n ? loomi_sched_send(s, right, tag, k ? LOOMI_BUF_RECV : src,
                                     (seg_start(&g, ss) + o) * es, n, &dep, 1)
                  : LOOMI_NO_DEP;
            chunk(seg_len(&g, rs), C, c, &o, &n);
            uint32_t *mine = &red[(k % 3) * C + c];
            *mine = LOOMI_NO_DEP;
            if (!n) continue;
            size_t soff = (slot * C + c) * maxchunk * es;
            uint32_t rv = loomi_sched_recv(s, left, tag, LOOMI_BUF_SCRATCH, soff, n,
                                           &user[slot * C + c], 1);
            size_t doff = (seg_start(&g, rs) + o) * es;
            *mine = loomi_sched_reduce(s, LOOMI_BUF_RECV, doff, src, doff, LOOMI_BUF_SCRATCH,
                                       soff, n, &rv, 1);
            user[slot * C + c] = *mine;
        }
    }
    /* Rank r now owns segment r+1: finish AVG once, where it is owned. */
    int own = mod(r + 1, p);
    for (size_t c = 0; c < C; c++) {
        size_t o, n;
        chunk(seg_len(&g, own), C, c, &o, &n);
        uint32_t *last = &red[((p - 2) % 3) * C + c];
        if (n && s->op == LOOM_AVG)
            *last = loomi_sched_avg(s, LOOMI_BUF_RECV, (seg_start(&g, own) + o) * es, n, last, 1);
        ag_prev[c] = *last;
    }
    for (int k = 0; k < p - 1; k++) {
        int ss = mod(r + 1 - k, p), rs = mod(r - k, p);
        for (size_t c = 0; c < C; c++) {
            size_t o, n;
            uint32_t tag = (uint32_t)(p - 1 + k) * Ct + (uint32_t)c;
            chunk(seg_len(&g, ss), C, c, &o, &n);
            if (n) loomi_sched_send(s, right, tag, LOOMI_BUF_RECV, (seg_start(&g, ss) + o) * es,
                                    n, &ag_prev[c], 1);
            chunk(seg_len(&g, rs), C, c, &o, &n);
            ag_prev[c] = LOOMI_NO_DEP;
            if (!n) continue;
            /* The RS send of step k read this range of recvbuf (unless it
             * read sendbuf: step 0 out of place); overwrite it only after. */
            uint32_t dep = (k || inplace) ? rs_send[(size_t)k * C + c] : LOOMI_NO_DEP;
            ag_prev[c] = loomi_sched_recv(s, left, tag, LOOMI_BUF_RECV,
                                          (seg_start(&g, rs) + o) * es, n, &dep, 1);
        }
    }
    free(user);
    free(red);
    free(rs_send);
    free(ag_prev);
    return LOOM_SUCCESS;
}

loom_result_t loomi_gen_allreduce_ring(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    return loomi_allreduce_ring(s, a->count, a->inplace, a->chunk_bytes);
}

loom_result_t loomi_gen_reduce_scatter_ring(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    (void)a;
    return loomi_fail(LOOM_ERR_UNSUPPORTED, s->rank, "reduce_scatter ring: not written yet");
}

loom_result_t loomi_gen_allgather_ring(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    (void)a;
    return loomi_fail(LOOM_ERR_UNSUPPORTED, s->rank, "allgather ring: not written yet");
}
