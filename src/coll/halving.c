/*
 * halving.c - recursive halving / doubling (Rabenseifner).
 *
 * Reduce-scatter by recursive halving over a power-of-two core of q
 * ranks: at level j (mask q/2, q/4, .., 1) each core rank keeps the half
 * of its window on its side of the mask, sends the other half to its
 * partner and adds the partner's copy of the kept half.  After log2(q)
 * levels core rank i owns window [i, i+1).  The allreduce follows with
 * recursive doubling in the reverse order, exchanging whole windows.
 * Each rank sends about 2(q-1)/q of the vector in 2 log2(q) messages: the
 * ring's bandwidth at a logarithmic latency, good for mid sizes.
 *
 * Non-power-of-two p: the first 2*(p-q) ranks pair up (2i, 2i+1); the odd
 * one hands its input to the even one before and gets its result back
 * after.
 */
#include "coll/build.h"
#include "coll/coll.h"
#include "core/internal.h"

/* Window after level j of the halving: kept [*klo, *khi), given away
 * [*glo, *ghi), in core indices; lo/hi is the window before. */
static void halve(int nr, int mask, int lo, int hi, int *klo, int *khi, int *glo, int *ghi)
{
    if (nr & mask) {
        *klo = lo + mask, *khi = hi, *glo = lo, *ghi = lo + mask;
    } else {
        *klo = lo, *khi = lo + mask, *glo = lo + mask, *ghi = hi;
    }
}

/*
 * Allreduce: the vector is cut into q segments, one per core rank, and
 * accumulates in RECV; each level's incoming half goes to one scratch
 * area the size of the first kept half.  Every segment is finished (and
 * averaged) on one rank and copied everywhere else, so all ranks end with
 * the same bits.
 */
loom_result_t loomi_gen_allreduce_hd(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    const int p = s->nranks, r = s->rank, inplace = a->inplace;
    const size_t es = s->esize, count = a->count;
    if (loomi_allreduce_trivial(s, count, inplace)) return LOOM_SUCCESS;
    const int q = loomi_pow2_floor(p), extra = p - q, src = inplace ? LOOMI_BUF_RECV : LOOMI_BUF_SEND;
    const int L = loomi_log2(q), nr = loomi_fold_core(r, extra), folded = r < 2 * extra;
    const uint32_t tag_out = 1 + 2 * (uint32_t)L;
    struct loomi_build b;
    loom_result_t rc = loomi_build_init(&b, s, 0, 0);
    if (rc != LOOM_SUCCESS) return rc;
    if (nr < 0) {
        loomi_bsend(&b, r - 1, 0, src, 0, count);
        loomi_brecv(&b, r - 1, tag_out, LOOMI_BUF_RECV, 0, count); /* onto the input in place */
        return loomi_build_done(&b);
    }
    const struct loomi_seg g = loomi_seg_make(count, q);
#define SEG(i) loomi_seg_start(&g, (i))
    int lo = 0, hi = q, klo, khi, glo, ghi;
    halve(nr, q / 2, lo, hi, &klo, &khi, &glo, &ghi);
    s->buf_bytes[LOOMI_BUF_SCRATCH] = (folded ? count : SEG(khi) - SEG(klo)) * es;
    int have = src;
    if (folded) {
        loomi_brecv(&b, r + 1, 0, LOOMI_BUF_SCRATCH, 0, count);
        loomi_breduce(&b, LOOMI_BUF_RECV, 0, src, 0, LOOMI_BUF_SCRATCH, 0, count);
        have = LOOMI_BUF_RECV;
    }
    int wins[32][4];
    for (int j = 0; j < L; j++) {
        int mask = q >> (j + 1), peer = loomi_fold_rank(nr ^ mask, extra);
        halve(nr, mask, lo, hi, &klo, &khi, &glo, &ghi);
        wins[j][0] = klo, wins[j][1] = khi, wins[j][2] = glo, wins[j][3] = ghi;
        size_t ks = SEG(klo), kn = SEG(khi) - ks, gs = SEG(glo), gn = SEG(ghi) - gs;
        loomi_bsend(&b, peer, 1 + (uint32_t)j, have, gs * es, gn);
        loomi_brecv(&b, peer, 1 + (uint32_t)j, LOOMI_BUF_SCRATCH, 0, kn);
        loomi_breduce(&b, LOOMI_BUF_RECV, ks * es, have, ks * es, LOOMI_BUF_SCRATCH, 0, kn);
        have = LOOMI_BUF_RECV;
        lo = klo, hi = khi;
    }
    if (s->op == LOOM_AVG) loomi_bavg(&b, LOOMI_BUF_RECV, SEG(nr) * es, SEG(nr + 1) - SEG(nr));
    for (int j = L - 1; j >= 0; j--) {
        int mask = q >> (j + 1), peer = loomi_fold_rank(nr ^ mask, extra);
        size_t ks = SEG(wins[j][0]), kn = SEG(wins[j][1]) - ks;
        size_t gs = SEG(wins[j][2]), gn = SEG(wins[j][3]) - gs;
        uint32_t tag = 1 + (uint32_t)L + (uint32_t)j;
        loomi_bsend(&b, peer, tag, LOOMI_BUF_RECV, ks * es, kn);
        loomi_brecv(&b, peer, tag, LOOMI_BUF_RECV, gs * es, gn);
    }
    if (folded) loomi_bsend(&b, r + 1, tag_out, LOOMI_BUF_RECV, 0, count);
#undef SEG
    return loomi_build_done(&b);
}

/*
 * Reduce-scatter: the p output blocks are the segments, core rank i
 * standing for blocks [loomi_fold_rank(i), loomi_fold_rank(i+1)) (its own, and its folded
 * partner's), so every window is a contiguous run of blocks and rank r's
 * block ends on rank r (or on r-1, which passes it on).
 *
 * RECV holds one block, so partial sums live in scratch: level j
 * receives the partner's copy of the kept window into area j&1 and adds
 * the current partials (SEND at the first level, else the other area) into
 * it.  A folded even rank first receives its partner's whole input into
 * area 0 and adds SEND to it (its first level then uses area 1).  The
 * last level reduces block r straight into RECV.
 */
loom_result_t loomi_gen_reduce_scatter_hd(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    const int p = s->nranks, r = s->rank, inplace = a->inplace;
    const size_t es = s->esize, count = a->count, bb = count * es;
    s->buf_bytes[LOOMI_BUF_SEND] = (size_t)p * bb;
    s->buf_bytes[LOOMI_BUF_RECV] = bb;
    if (count == 0) return LOOM_SUCCESS;
    if (p == 1) {
        if (!inplace) loomi_sched_copy(s, LOOMI_BUF_RECV, 0, LOOMI_BUF_SEND, 0, count, NULL, 0);
        return LOOM_SUCCESS;
    }
    const int q = loomi_pow2_floor(p), extra = p - q;
    const int L = loomi_log2(q);
    const uint32_t tag_out = 1 + (uint32_t)L;
    const int nr = loomi_fold_core(r, extra);
    struct loomi_build b;
    loom_result_t rc = loomi_build_init(&b, s, 0, 0);
    if (rc != LOOM_SUCCESS) return rc;
    b.recv_in_send = inplace;
    if (nr < 0) { /* in place RECV is SEND block r, which the send reads */
        loomi_bsend(&b, r - 1, 0, LOOMI_BUF_SEND, 0, (size_t)p * count);
        loomi_brecv(&b, r - 1, tag_out, LOOMI_BUF_RECV, 0, count);
        return loomi_build_done(&b);
    }
    const int folded = r < 2 * extra;
    /* Size the two scratch areas: area (i & 1) holds the i-th partial
     * window, i counting the fold as the first. */
    size_t area[2] = {0, 0};
    int lo = 0, hi = q, klo, khi, glo, ghi, i = 0;
    if (folded) area[i++] = (size_t)p;
    for (int j = 0; j < L; j++, i++) {
        halve(nr, q >> (j + 1), lo, hi, &klo, &khi, &glo, &ghi);
        size_t kb = (size_t)(loomi_fold_rank(khi, extra) - loomi_fold_rank(klo, extra));
        if (kb > area[i & 1]) area[i & 1] = kb;
        lo = klo, hi = khi;
    }
    s->buf_bytes[LOOMI_BUF_SCRATCH] = (area[0] + area[1]) * bb;
    const size_t aoff[2] = {0, area[0] * bb};

    /* Partials: buffer, and byte offset of block `pblo` in it. */
    int pbuf = LOOMI_BUF_SEND, pblo = 0;
    size_t poff = 0;
    i = 0;
    if (folded) {
        loomi_brecv(&b, r + 1, 0, LOOMI_BUF_SCRATCH, aoff[0], (size_t)p * count);
        loomi_breduce(&b, LOOMI_BUF_SCRATCH, aoff[0], LOOMI_BUF_SCRATCH, aoff[0], LOOMI_BUF_SEND,
                      0, (size_t)p * count);
        pbuf = LOOMI_BUF_SCRATCH, poff = aoff[0], pblo = 0;
        i = 1;
    }
    lo = 0, hi = q;
    for (int j = 0; j < L; j++, i++) {
        int mask = q >> (j + 1), peer = loomi_fold_rank(nr ^ mask, extra);
        halve(nr, mask, lo, hi, &klo, &khi, &glo, &ghi);
        int kb0 = loomi_fold_rank(klo, extra), kb1 = loomi_fold_rank(khi, extra);
        int gb0 = loomi_fold_rank(glo, extra), gb1 = loomi_fold_rank(ghi, extra);
        uint32_t tag = 1 + (uint32_t)j;
        const size_t ar = aoff[i & 1], pk = poff + (size_t)(kb0 - pblo) * bb;
        loomi_bsend(&b, peer, tag, pbuf, poff + (size_t)(gb0 - pblo) * bb,
                    (size_t)(gb1 - gb0) * count);
        loomi_brecv(&b, peer, tag, LOOMI_BUF_SCRATCH, ar, (size_t)(kb1 - kb0) * count);
        if (j < L - 1) {
            loomi_breduce(&b, LOOMI_BUF_SCRATCH, ar, LOOMI_BUF_SCRATCH, ar, pbuf, pk,
                          (size_t)(kb1 - kb0) * count);
        } else {
            /* Block r (= kb0) into RECV: in place, SEND block r. */
            loomi_breduce(&b, LOOMI_BUF_RECV, 0, LOOMI_BUF_SCRATCH, ar, pbuf, pk, count);
            if (s->op == LOOM_AVG) loomi_bavg(&b, LOOMI_BUF_RECV, 0, count);
            if (folded) { /* block r+1 goes on to the folded partner */
                loomi_breduce(&b, LOOMI_BUF_SCRATCH, ar + bb, LOOMI_BUF_SCRATCH, ar + bb, pbuf,
                              pk + bb, count);
                if (s->op == LOOM_AVG) loomi_bavg(&b, LOOMI_BUF_SCRATCH, ar + bb, count);
                loomi_bsend(&b, r + 1, tag_out, LOOMI_BUF_SCRATCH, ar + bb, count);
            }
        }
        pbuf = LOOMI_BUF_SCRATCH, poff = ar, pblo = kb0;
        lo = klo, hi = khi;
    }
    return loomi_build_done(&b);
}
