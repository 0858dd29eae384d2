/*
 * ring.c - ring algorithms (Patarasuk & Yuan): p-1 steps per phase, each
 * rank sending (p-1)/p of the data per phase, bandwidth-optimal for large
 * messages.
 *
 * Allreduce = reduce-scatter + allgather.  Reduce-scatter step k: rank r
 * sends segment (r-k) to r+1 and receives segment (r-k-1) from r-1 into
 * scratch, then reduces it into recvbuf.  After p-1 steps rank r owns the
 * full sum of segment (r+1).  Allgather step k: send segment (r+1-k),
 * receive segment (r-k) straight into recvbuf.  Every segment is cut into
 * C chunks with per-chunk dependencies, so chunk c of step k+1 leaves as
 * soon as chunk c of step k is reduced: the ring pipelines.
 *
 * The reduce-scatter and allgather collectives are the two halves on
 * their own, with blocks of a->count elements as the segments.
 */
#include <stdlib.h>

#include "coll/coll.h"
#include "coll/coll_util.h"
#include "core/internal.h"

/* Bounds the step count (and tags) for huge messages with small chunks. */
#define RING_MAX_CHUNKS 4096

/*
 * The allgather half.  Segment i of g lies at seg_start(g, i) in RECV;
 * rank r starts with segment `own` and at step k sends segment own-k to
 * the right and receives own-k-1 from the left straight into RECV.  The
 * first send reads the own segment at src0/src0_off (SEND or RECV).
 * prev[c]: in, what chunk c of the own segment waits for (overwritten).
 * guard[k*C+c] (may be NULL): a step that still reads the RECV range the
 * receive of step k, chunk c overwrites.  Tags tag0 .. tag0+(p-1)*C-1.
 */
static void ring_allgather(struct loomi_sched *s, const struct loomi_seg *g, size_t C, int own,
                           int src0, size_t src0_off, uint32_t *prev, const uint32_t *guard,
                           uint32_t tag0)
{
    const int p = s->nranks, r = s->rank;
    const size_t es = s->esize;
    const int right = loomi_mod(r + 1, p), left = loomi_mod(r - 1, p);
    for (int k = 0; k < p - 1; k++) {
        int ss = loomi_mod(own - k, p), rs = loomi_mod(own - k - 1, p);
        for (size_t c = 0; c < C; c++) {
            size_t o, n;
            uint32_t tag = tag0 + (uint32_t)((size_t)k * C + c);
            loomi_chunk(loomi_seg_len(g, ss), C, c, &o, &n);
            if (n) {
                int b = k ? LOOMI_BUF_RECV : src0;
                size_t off = k ? (loomi_seg_start(g, ss) + o) * es : src0_off + o * es;
                loomi_sched_send(s, right, tag, b, off, n, &prev[c], 1);
            }
            loomi_chunk(loomi_seg_len(g, rs), C, c, &o, &n);
            prev[c] = LOOMI_NO_DEP;
            if (!n) continue;
            uint32_t dep = guard ? guard[(size_t)k * C + c] : LOOMI_NO_DEP;
            prev[c] = loomi_sched_recv(s, left, tag, LOOMI_BUF_RECV,
                                       (loomi_seg_start(g, rs) + o) * es, n, &dep, 1);
        }
    }
}

loom_result_t loomi_allreduce_ring(struct loomi_sched *s, size_t count, int inplace,
                                   size_t chunk_bytes)
{
    const int p = s->nranks, r = s->rank;
    const size_t es = s->esize;
    if (loomi_allreduce_trivial(s, count, inplace)) return LOOM_SUCCESS;
    const int src = inplace ? LOOMI_BUF_RECV : LOOMI_BUF_SEND;
    struct loomi_seg g = loomi_seg_make(count, p);
    size_t maxseg = loomi_seg_len(&g, 0);
    size_t C = loomi_nchunks(maxseg * es, chunk_bytes, RING_MAX_CHUNKS);
    size_t maxchunk = (maxseg + C - 1) / C;
    s->buf_bytes[LOOMI_BUF_SCRATCH] = 2 * C * maxchunk * es;

    const int right = loomi_mod(r + 1, p), left = loomi_mod(r - 1, p);
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
        int ss = loomi_mod(r - k, p), rs = loomi_mod(r - k - 1, p);
        size_t slot = (size_t)(k & 1);
        for (size_t c = 0; c < C; c++) {
            size_t o, n;
            uint32_t tag = (uint32_t)k * Ct + (uint32_t)c;
            loomi_chunk(loomi_seg_len(&g, ss), C, c, &o, &n);
            uint32_t dep = k ? red[((k - 1) % 3) * C + c] : LOOMI_NO_DEP;
            /* Out of place, step 0 reads sendbuf: no allgather receive
             * needs to wait for it. */
            uint32_t sd = n ? loomi_sched_send(s, right, tag, k ? LOOMI_BUF_RECV : src,
                                               (loomi_seg_start(&g, ss) + o) * es, n, &dep, 1)
                            : LOOMI_NO_DEP;
            rs_send[(size_t)k * C + c] = (k || inplace) ? sd : LOOMI_NO_DEP;
            loomi_chunk(loomi_seg_len(&g, rs), C, c, &o, &n);
            uint32_t *mine = &red[(k % 3) * C + c];
            *mine = LOOMI_NO_DEP;
            if (!n) continue;
            size_t soff = (slot * C + c) * maxchunk * es;
            uint32_t rv = loomi_sched_recv(s, left, tag, LOOMI_BUF_SCRATCH, soff, n,
                                           &user[slot * C + c], 1);
            size_t doff = (loomi_seg_start(&g, rs) + o) * es;
            *mine = loomi_sched_reduce(s, LOOMI_BUF_RECV, doff, src, doff, LOOMI_BUF_SCRATCH,
                                       soff, n, &rv, 1);
            user[slot * C + c] = *mine;
        }
    }
    /* Rank r now owns segment r+1: finish AVG once, where it is owned. */
    int own = loomi_mod(r + 1, p);
    for (size_t c = 0; c < C; c++) {
        size_t o, n;
        loomi_chunk(loomi_seg_len(&g, own), C, c, &o, &n);
        uint32_t *last = &red[((p - 2) % 3) * C + c];
        if (n && s->op == LOOM_AVG)
            *last = loomi_sched_avg(s, LOOMI_BUF_RECV, (loomi_seg_start(&g, own) + o) * es, n,
                                    last, 1);
        ag_prev[c] = *last;
    }
    ring_allgather(s, &g, C, own, LOOMI_BUF_RECV, loomi_seg_start(&g, own) * es, ag_prev,
                   rs_send, (uint32_t)(p - 1) * Ct);
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

/*
 * Reduce-scatter: at step k rank r sends its partial of block r-k-1 and
 * receives the partial of block r-k-2, adding its own contribution; the
 * last step (block r) reduces straight into RECV.  Partials live in two
 * scratch slots of one block each: step k receives into slot k&1, and
 * the send of step k+1 reads it, so the receive of step k+2 into the same
 * slot waits for that send (a guard on a buffer, not a handshake: the
 * send's own completion depends only on earlier steps of the ring).
 */
loom_result_t loomi_gen_reduce_scatter_ring(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    const int p = s->nranks, r = s->rank;
    const size_t es = s->esize, count = a->count;
    if (loomi_reduce_scatter_trivial(s, count, a->inplace)) return LOOM_SUCCESS;
    size_t C = loomi_nchunks(count * es, a->chunk_bytes, RING_MAX_CHUNKS);
    s->buf_bytes[LOOMI_BUF_SCRATCH] = (p > 2 ? 2 : 1) * count * es;
    uint32_t *red = malloc(C * sizeof *red);
    uint32_t *snd = malloc(C * sizeof *snd);
    if (!red || !snd) {
        free(red);
        free(snd);
        return loomi_fail(LOOM_ERR_NO_MEMORY, r, "ring reduce_scatter: out of memory");
    }
    const int right = loomi_mod(r + 1, p), left = loomi_mod(r - 1, p);
    for (size_t c = 0; c < C; c++) red[c] = snd[c] = LOOMI_NO_DEP;
    for (int k = 0; k < p - 1; k++) {
        int sb = loomi_mod(r - k - 1, p), rb = loomi_mod(r - k - 2, p);
        int last = k == p - 2;
        size_t slot = (size_t)(k & 1) * count * es, prev_slot = (size_t)((k - 1) & 1) * count * es;
        for (size_t c = 0; c < C; c++) {
            size_t o, n;
            loomi_chunk(count, C, c, &o, &n);
            if (!n) continue;
            uint32_t tag = (uint32_t)((size_t)k * C + c);
            /* snd[c] is still the send of step k-1: from step 2 on it
             * read this slot (step 0 read SEND). */
            uint32_t guard = k >= 2 ? snd[c] : LOOMI_NO_DEP;
            snd[c] = k ? loomi_sched_send(s, right, tag, LOOMI_BUF_SCRATCH, prev_slot + o * es, n,
                                          &red[c], 1)
                       : loomi_sched_send(s, right, tag, LOOMI_BUF_SEND,
                                          ((size_t)sb * count + o) * es, n, NULL, 0);
            uint32_t rv = loomi_sched_recv(s, left, tag, LOOMI_BUF_SCRATCH, slot + o * es, n,
                                           &guard, 1);
            /* In place the last reduce writes SEND block r through RECV;
             * nothing else reads that block (step 0 sends block r-1). */
            red[c] = loomi_sched_reduce(s, last ? LOOMI_BUF_RECV : LOOMI_BUF_SCRATCH,
                                        last ? o * es : slot + o * es, LOOMI_BUF_SCRATCH,
                                        slot + o * es, LOOMI_BUF_SEND,
                                        ((size_t)rb * count + o) * es, n, &rv, 1);
            if (last && s->op == LOOM_AVG) loomi_sched_avg(s, LOOMI_BUF_RECV, o * es, n, &red[c], 1);
        }
    }
    free(red);
    free(snd);
    return LOOM_SUCCESS;
}

/* Allgather: the allgather half of the ring over blocks of a->count. */
loom_result_t loomi_gen_allgather_ring(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    const int p = s->nranks, r = s->rank;
    const size_t es = s->esize, count = a->count;
    s->buf_bytes[LOOMI_BUF_SEND] = a->inplace ? 0 : count * es;
    s->buf_bytes[LOOMI_BUF_RECV] = (size_t)p * count * es;
    if (count == 0) return LOOM_SUCCESS;
    if (!a->inplace)
        loomi_sched_copy(s, LOOMI_BUF_RECV, (size_t)r * count * es, LOOMI_BUF_SEND, 0, count,
                         NULL, 0);
    if (p == 1) return LOOM_SUCCESS;
    size_t C = loomi_nchunks(count * es, a->chunk_bytes, RING_MAX_CHUNKS);
    uint32_t *prev = malloc(C * sizeof *prev);
    if (!prev) return loomi_fail(LOOM_ERR_NO_MEMORY, r, "ring allgather: out of memory");
    for (size_t c = 0; c < C; c++) prev[c] = LOOMI_NO_DEP;
    struct loomi_seg g = loomi_seg_make((size_t)p * count, p);
    /* The first send reads the caller's block where it is: SEND out of
     * place, so it need not wait for the copy. */
    ring_allgather(s, &g, C, r, a->inplace ? LOOMI_BUF_RECV : LOOMI_BUF_SEND,
                   a->inplace ? (size_t)r * count * es : 0, prev, NULL, 0);
    free(prev);
    return LOOM_SUCCESS;
}
