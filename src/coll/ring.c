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
 * C chunks; the builder (build.h) orders each chunk after what it reads,
 * so chunk c of step k+1 leaves as soon as chunk c of step k is reduced:
 * the ring pipelines.
 *
 * The reduce-scatter and allgather collectives are the two halves on
 * their own, with blocks of a->count elements as the segments.
 */
#include "coll/build.h"
#include "coll/coll.h"
#include "core/internal.h"

/* The allgather half: rank r starts with segment `own` of g in RECV
 * (the first send reads it at src0, src0_off: SEND or RECV); step k sends
 * segment own-k to the right and receives own-k-1 from the left.  Tags
 * tag0 .. tag0+(p-1)*C-1. */
static void ring_allgather(struct loomi_build *b, const struct loomi_seg *g, int own, int src0,
                           size_t src0_off, uint32_t tag0)
{
    const int p = b->s->nranks, r = b->s->rank;
    const int right = loomi_mod(r + 1, p), left = loomi_mod(r - 1, p);
    const size_t own_off = loomi_seg_start(g, own) * b->s->esize;
    for (int k = 0; k < p - 1; k++)
        for (size_t c = 0; c < b->C; c++) {
            size_t o, n;
            uint32_t tag = tag0 + (uint32_t)((size_t)k * b->C + c);
            loomi_build_chunk(b, g, loomi_mod(own - k, p), c, &o, &n);
            loomi_bsend(b, right, tag, k ? LOOMI_BUF_RECV : src0, k ? o : src0_off + o - own_off, n);
            loomi_build_chunk(b, g, loomi_mod(own - k - 1, p), c, &o, &n);
            loomi_brecv(b, left, tag, LOOMI_BUF_RECV, o, n);
        }
}

loom_result_t loomi_allreduce_ring(struct loomi_sched *s, size_t count, int inplace,
                                   size_t chunk_bytes)
{
    const int p = s->nranks, r = s->rank, right = loomi_mod(r + 1, p), left = loomi_mod(r - 1, p);
    if (loomi_allreduce_trivial(s, count, inplace)) return LOOM_SUCCESS;
    const int src = inplace ? LOOMI_BUF_RECV : LOOMI_BUF_SEND;
    const size_t es = s->esize;
    struct loomi_seg g = loomi_seg_make(count, p);
    struct loomi_build b;
    loom_result_t rc = loomi_build_init(&b, s, loomi_seg_len(&g, 0) * es, chunk_bytes);
    if (rc != LOOM_SUCCESS) return rc;
    const size_t C = b.C, maxchunk = (loomi_seg_len(&g, 0) + C - 1) / C;
    s->buf_bytes[LOOMI_BUF_SCRATCH] = 2 * C * maxchunk * es; /* two slots of C chunks */
    for (int k = 0; k < p - 1; k++)
        for (size_t c = 0; c < C; c++) {
            size_t o, n, tmp = ((size_t)(k & 1) * C + c) * maxchunk * es;
            uint32_t tag = (uint32_t)((size_t)k * C + c);
            loomi_build_chunk(&b, &g, loomi_mod(r - k, p), c, &o, &n);
            loomi_bsend(&b, right, tag, k ? LOOMI_BUF_RECV : src, o, n);
            loomi_build_chunk(&b, &g, loomi_mod(r - k - 1, p), c, &o, &n);
            loomi_brecv(&b, left, tag, LOOMI_BUF_SCRATCH, tmp, n);
            loomi_breduce(&b, LOOMI_BUF_RECV, o, src, o, LOOMI_BUF_SCRATCH, tmp, n);
        }
    /* Rank r now owns segment r+1: finish AVG once, where it is owned. */
    const int own = loomi_mod(r + 1, p);
    for (size_t c = 0; c < C && s->op == LOOM_AVG; c++) {
        size_t o, n;
        loomi_build_chunk(&b, &g, own, c, &o, &n);
        loomi_bavg(&b, LOOMI_BUF_RECV, o, n);
    }
    ring_allgather(&b, &g, own, LOOMI_BUF_RECV, loomi_seg_start(&g, own) * es,
                   (uint32_t)((size_t)(p - 1) * C));
    return loomi_build_done(&b);
}

loom_result_t loomi_gen_allreduce_ring(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    return loomi_allreduce_ring(s, a->count, a->inplace, a->chunk_bytes);
}

/*
 * Reduce-scatter: at step k rank r sends its partial of block r-k-1 and
 * receives the partial of block r-k-2, adding its own contribution; the
 * last step (block r) reduces straight into RECV.  Partials live in two
 * scratch slots of one block each: step k receives into slot k&1, which
 * the send of step k+1 reads (so the receive of step k+2 into the same
 * slot waits for that send: a guard on a buffer, not a handshake).
 */
loom_result_t loomi_gen_reduce_scatter_ring(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    const int p = s->nranks, r = s->rank, right = loomi_mod(r + 1, p), left = loomi_mod(r - 1, p);
    const size_t es = s->esize, count = a->count;
    if (loomi_reduce_scatter_trivial(s, count, a->inplace)) return LOOM_SUCCESS;
    s->buf_bytes[LOOMI_BUF_SCRATCH] = (p > 2 ? 2 : 1) * count * es;
    struct loomi_build b;
    loom_result_t rc = loomi_build_init(&b, s, count * es, a->chunk_bytes);
    if (rc != LOOM_SUCCESS) return rc;
    b.recv_in_send = a->inplace;
    for (int k = 0; k < p - 1; k++) {
        const int sb = loomi_mod(r - k - 1, p), rb = loomi_mod(r - k - 2, p), last = k == p - 2;
        const size_t slot = (size_t)(k & 1) * count * es;
        const size_t prev = (size_t)((k - 1) & 1) * count * es;
        for (size_t c = 0; c < b.C; c++) {
            size_t o, n;
            uint32_t tag = (uint32_t)((size_t)k * b.C + c);
            loomi_chunk(count, b.C, c, &o, &n);
            o *= es;
            loomi_bsend(&b, right, tag, k ? LOOMI_BUF_SCRATCH : LOOMI_BUF_SEND,
                        k ? prev + o : (size_t)sb * count * es + o, n);
            loomi_brecv(&b, left, tag, LOOMI_BUF_SCRATCH, slot + o, n);
            /* In place the last reduce writes SEND block r through RECV. */
            loomi_breduce(&b, last ? LOOMI_BUF_RECV : LOOMI_BUF_SCRATCH, last ? o : slot + o,
                          LOOMI_BUF_SCRATCH, slot + o, LOOMI_BUF_SEND, (size_t)rb * count * es + o,
                          n);
            if (last && s->op == LOOM_AVG) loomi_bavg(&b, LOOMI_BUF_RECV, o, n);
        }
    }
    return loomi_build_done(&b);
}

/* Allgather: the allgather half of the ring over blocks of a->count. */
loom_result_t loomi_gen_allgather_ring(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    const int p = s->nranks, r = s->rank;
    int own_buf;
    size_t own_off;
    if (loomi_allgather_begin(s, a->count, a->inplace, &own_buf, &own_off)) return LOOM_SUCCESS;
    struct loomi_build b;
    loom_result_t rc = loomi_build_init(&b, s, a->count * s->esize, a->chunk_bytes);
    if (rc != LOOM_SUCCESS) return rc;
    struct loomi_seg g = loomi_seg_make((size_t)p * a->count, p);
    /* The first send reads the caller's block where it is: SEND out of
     * place, so it need not wait for the copy. */
    ring_allgather(&b, &g, r, own_buf, own_off, 0);
    return loomi_build_done(&b);
}
