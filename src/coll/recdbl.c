/*
 * recdbl.c - recursive doubling: log2(q) exchanges with partners at
 * distance 1, 2, 4, ... of a power-of-two core of q ranks; latency-optimal
 * for small messages.
 *
 * Non-power-of-two p: the first 2*(p-q) ranks pair up (2i, 2i+1); the odd
 * one hands its input to the even one before and gets the result back
 * after, so the core is ranks 0, 2, .., 2(p-q)-2, 2(p-q), .., p-1.
 */
#include "coll/build.h"
#include "coll/coll.h"
#include "core/internal.h"

/*
 * Allreduce.  Each level exchanges the whole vector (chunked, so chunk c
 * of level l+1 leaves while chunk c+1 of level l is being reduced) and
 * both partners compute lower OP higher (by core index): every core rank
 * ends with the same bits, and AVG divides the same bits everywhere.
 */
loom_result_t loomi_gen_allreduce_rd(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    const int p = s->nranks, r = s->rank, inplace = a->inplace;
    const size_t es = s->esize, count = a->count;
    if (loomi_allreduce_trivial(s, count, inplace)) return LOOM_SUCCESS;
    const int q = loomi_pow2_floor(p), extra = p - q, src = inplace ? LOOMI_BUF_RECV : LOOMI_BUF_SEND;
    const int L = loomi_log2(q), nr = loomi_fold_core(r, extra);
    struct loomi_build b;
    loom_result_t rc = loomi_build_init(&b, s, count * es, a->chunk_bytes);
    if (rc != LOOM_SUCCESS) return rc;
    const size_t C = b.C;
    const uint32_t tag_out = (uint32_t)((size_t)(L + 1) * C);
    if (nr >= 0) s->buf_bytes[LOOMI_BUF_SCRATCH] = count * es;
    int have = src; /* where the current value is */
    for (size_t c = 0; c < C; c++) {
        size_t o, n;
        loomi_chunk(count, C, c, &o, &n);
        o *= es;
        if (nr < 0) { /* folded: hand the input over, get the result back */
            loomi_bsend(&b, r - 1, (uint32_t)c, src, o, n);
            loomi_brecv(&b, r - 1, tag_out + (uint32_t)c, LOOMI_BUF_RECV, o, n);
        } else if (r < 2 * extra) {
            loomi_brecv(&b, r + 1, (uint32_t)c, LOOMI_BUF_SCRATCH, o, n);
            loomi_breduce(&b, LOOMI_BUF_RECV, o, src, o, LOOMI_BUF_SCRATCH, o, n);
            have = LOOMI_BUF_RECV;
        }
    }
    for (int l = 0; l < L && nr >= 0; l++) {
        int pnr = nr ^ (1 << l), peer = loomi_fold_rank(pnr, extra), lower = nr < pnr;
        for (size_t c = 0; c < C; c++) {
            size_t o, n;
            loomi_chunk(count, C, c, &o, &n);
            o *= es;
            uint32_t tag = (uint32_t)((size_t)(l + 1) * C + c);
            loomi_bsend(&b, peer, tag, have, o, n);
            loomi_brecv(&b, peer, tag, LOOMI_BUF_SCRATCH, o, n);
            loomi_breduce(&b, LOOMI_BUF_RECV, o, lower ? have : LOOMI_BUF_SCRATCH, o,
                          lower ? LOOMI_BUF_SCRATCH : have, o, n);
        }
        have = LOOMI_BUF_RECV;
    }
    for (size_t c = 0; c < C && nr >= 0; c++) {
        size_t o, n;
        loomi_chunk(count, C, c, &o, &n);
        if (s->op == LOOM_AVG) loomi_bavg(&b, LOOMI_BUF_RECV, o * es, n);
        if (r < 2 * extra) loomi_bsend(&b, r + 1, tag_out + (uint32_t)c, LOOMI_BUF_RECV, o * es, n);
    }
    return loomi_build_done(&b);
}

/*
 * Allgather.  At level l a core rank holds the blocks of the 2^l core
 * ranks of its aligned group; core rank i stands for the real blocks
 * [loomi_fold_rank(i), loomi_fold_rank(i+1)) (two of them when it folded an odd rank), so
 * every group's blocks are contiguous in RECV and each level is one
 * message each way.
 */
loom_result_t loomi_gen_allgather_rd(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    const int p = s->nranks, r = s->rank, q = loomi_pow2_floor(p), extra = p - q, L = loomi_log2(q);
    const size_t count = a->count, bb = count * s->esize;
    int own_buf;
    size_t own_off;
    if (loomi_allgather_begin(s, count, a->inplace, &own_buf, &own_off)) return LOOM_SUCCESS;
    const uint32_t tag_lo = 1, tag_hi = 2; /* fold-out messages */
    const int nr = loomi_fold_core(r, extra), folded = r < 2 * extra;
    struct loomi_build b;
    loom_result_t rc = loomi_build_init(&b, s, 0, 0);
    if (rc != LOOM_SUCCESS) return rc;
    if (nr < 0) {
        loomi_bsend(&b, r - 1, 0, own_buf, own_off, count);
        loomi_brecv(&b, r - 1, tag_lo, LOOMI_BUF_RECV, 0, (size_t)r * count);
        if (r + 1 < p)
            loomi_brecv(&b, r - 1, tag_hi, LOOMI_BUF_RECV, (size_t)(r + 1) * bb,
                        (size_t)(p - r - 1) * count);
        return loomi_build_done(&b);
    }
    if (folded) loomi_brecv(&b, r + 1, 0, LOOMI_BUF_RECV, (size_t)(r + 1) * bb, count);
    for (int l = 0; l < L; l++) {
        int mask = 1 << l, pnr = nr ^ mask, peer = loomi_fold_rank(pnr, extra);
        int mine = nr & ~(mask - 1), theirs = pnr & ~(mask - 1);
        size_t b0 = (size_t)loomi_fold_rank(mine, extra), b1 = (size_t)loomi_fold_rank(mine + mask, extra);
        size_t t0 = (size_t)loomi_fold_rank(theirs, extra), t1 = (size_t)loomi_fold_rank(theirs + mask, extra);
        uint32_t tag = 3 + (uint32_t)l;
        if (l == 0 && !folded) /* just the own block, wherever it is */
            loomi_bsend(&b, peer, tag, own_buf, own_off, count);
        else
            loomi_bsend(&b, peer, tag, LOOMI_BUF_RECV, b0 * bb, (b1 - b0) * count);
        loomi_brecv(&b, peer, tag, LOOMI_BUF_RECV, t0 * bb, (t1 - t0) * count);
    }
    if (folded) {
        loomi_bsend(&b, r + 1, tag_lo, LOOMI_BUF_RECV, 0, (size_t)(r + 1) * count);
        if (r + 2 < p)
            loomi_bsend(&b, r + 1, tag_hi, LOOMI_BUF_RECV, (size_t)(r + 2) * bb,
                        (size_t)(p - r - 2) * count);
    }
    return loomi_build_done(&b);
}
