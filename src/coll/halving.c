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
#include <stdlib.h>

#include "coll/coll.h"
#include "coll/coll_util.h"
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
    const int L = loomi_log2(q);
    const uint32_t tag_out = 1 + 2 * (uint32_t)L;
    const int nr = loomi_fold_core(r, extra);
    if (nr < 0) {
        uint32_t sd = loomi_sched_send(s, r - 1, 0, src, 0, count, NULL, 0);
        uint32_t dep = inplace ? sd : LOOMI_NO_DEP; /* the result lands on the input */
        loomi_sched_recv(s, r - 1, tag_out, LOOMI_BUF_RECV, 0, count, &dep, 1);
        return LOOM_SUCCESS;
    }
    const struct loomi_seg g = loomi_seg_make(count, q);
#define SEG(i) loomi_seg_start(&g, (i))
    const int folded = r < 2 * extra;
    int lo = 0, hi = q, klo, khi, glo, ghi;
    halve(nr, q / 2, lo, hi, &klo, &khi, &glo, &ghi);
    size_t kept0 = SEG(khi) - SEG(klo);
    s->buf_bytes[LOOMI_BUF_SCRATCH] = (folded ? count : kept0) * es;

    /* cur: last writer of RECV (each level writes a subrange of the
     * previous one); scr: last reader of scratch. */
    uint32_t cur = LOOMI_NO_DEP, scr = LOOMI_NO_DEP, rs_send[32];
    int have = src;
    if (folded) {
        uint32_t rv = loomi_sched_recv(s, r + 1, 0, LOOMI_BUF_SCRATCH, 0, count, NULL, 0);
        cur = scr = loomi_sched_reduce(s, LOOMI_BUF_RECV, 0, src, 0, LOOMI_BUF_SCRATCH, 0, count,
                                       &rv, 1);
        have = LOOMI_BUF_RECV;
    }
    int wins[32][4];
    for (int j = 0; j < L; j++) {
        int mask = q >> (j + 1), peer = loomi_fold_rank(nr ^ mask, extra);
        halve(nr, mask, lo, hi, &klo, &khi, &glo, &ghi);
        wins[j][0] = klo, wins[j][1] = khi, wins[j][2] = glo, wins[j][3] = ghi;
        size_t ks = SEG(klo), kn = SEG(khi) - ks, gs = SEG(glo), gn = SEG(ghi) - gs;
        uint32_t tag = 1 + (uint32_t)j;
        uint32_t sd = gn ? loomi_sched_send(s, peer, tag, have, gs * es, gn, &cur, 1) : LOOMI_NO_DEP;
        /* The allgather later receives into what this send reads. */
        rs_send[j] = have == LOOMI_BUF_RECV ? sd : LOOMI_NO_DEP;
        if (kn) {
            uint32_t rv = loomi_sched_recv(s, peer, tag, LOOMI_BUF_SCRATCH, 0, kn, &scr, 1);
            uint32_t deps[2] = {rv, cur};
            cur = scr = loomi_sched_reduce(s, LOOMI_BUF_RECV, ks * es, have, ks * es,
                                           LOOMI_BUF_SCRATCH, 0, kn, deps, 2);
        }
        /* With nothing kept, nothing later is sent from RECV either. */
        have = LOOMI_BUF_RECV;
        lo = klo, hi = khi;
    }
    size_t own = SEG(nr), ownn = SEG(nr + 1) - own;
    if (ownn && s->op == LOOM_AVG) cur = loomi_sched_avg(s, LOOMI_BUF_RECV, own * es, ownn, &cur, 1);
    struct loomi_wlist wl = {.n = 0};
    loomi_wl_add(&wl, cur);
    uint32_t deps[4];
    for (int j = L - 1; j >= 0; j--) {
        int mask = q >> (j + 1), peer = loomi_fold_rank(nr ^ mask, extra);
        size_t ks = SEG(wins[j][0]), kn = SEG(wins[j][1]) - ks;
        size_t gs = SEG(wins[j][2]), gn = SEG(wins[j][3]) - gs;
        uint32_t tag = 1 + (uint32_t)L + (uint32_t)j;
        if (kn) loomi_sched_send(s, peer, tag, LOOMI_BUF_RECV, ks * es, kn, deps, loomi_wl_all(&wl, deps));
        if (gn) {
            uint32_t d2[2] = {rs_send[j], loomi_wl_back(&wl)};
            loomi_wl_add(&wl, loomi_sched_recv(s, peer, tag, LOOMI_BUF_RECV, gs * es, gn, d2, 2));
        }
    }
    if (folded)
        loomi_sched_send(s, r + 1, tag_out, LOOMI_BUF_RECV, 0, count, deps, loomi_wl_all(&wl, deps));
#undef SEG
    return LOOM_SUCCESS;
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
    if (nr < 0) {
        uint32_t sd = loomi_sched_send(s, r - 1, 0, LOOMI_BUF_SEND, 0, (size_t)p * count, NULL, 0);
        /* In place RECV is SEND block r, which that send reads. */
        uint32_t dep = inplace ? sd : LOOMI_NO_DEP;
        loomi_sched_recv(s, r - 1, tag_out, LOOMI_BUF_RECV, 0, count, &dep, 1);
        return LOOM_SUCCESS;
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

    /* Partials: buffer, byte offset of block `pblo` in it, writer. */
    int pbuf = LOOMI_BUF_SEND;
    size_t poff = 0;
    int pblo = 0;
    uint32_t pw = LOOMI_NO_DEP;
    /* Per area: the steps that still read it (a receive into it waits). */
    uint32_t busy[2][2] = {{LOOMI_NO_DEP, LOOMI_NO_DEP}, {LOOMI_NO_DEP, LOOMI_NO_DEP}};
    i = 0;
    if (folded) {
        uint32_t rv = loomi_sched_recv(s, r + 1, 0, LOOMI_BUF_SCRATCH, aoff[0], (size_t)p * count,
                                       NULL, 0);
        pw = loomi_sched_reduce(s, LOOMI_BUF_SCRATCH, aoff[0], LOOMI_BUF_SCRATCH, aoff[0],
                                LOOMI_BUF_SEND, 0, (size_t)p * count, &rv, 1);
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
        uint32_t sd = loomi_sched_send(s, peer, tag, pbuf, poff + (size_t)(gb0 - pblo) * bb,
                                       (size_t)(gb1 - gb0) * count, &pw, 1);
        const int ar = i & 1;
        uint32_t rv = loomi_sched_recv(s, peer, tag, LOOMI_BUF_SCRATCH, aoff[ar],
                                       (size_t)(kb1 - kb0) * count, busy[ar], 2);
        size_t pk = poff + (size_t)(kb0 - pblo) * bb;
        uint32_t deps[2] = {rv, pw};
        uint32_t red;
        if (j < L - 1) {
            red = loomi_sched_reduce(s, LOOMI_BUF_SCRATCH, aoff[ar], LOOMI_BUF_SCRATCH, aoff[ar],
                                     pbuf, pk, (size_t)(kb1 - kb0) * count, deps, 2);
        } else {
            /* Block r (= kb0) into RECV; in place that is SEND block r,
             * read by nothing after this reduce. */
            red = loomi_sched_reduce(s, LOOMI_BUF_RECV, 0, LOOMI_BUF_SCRATCH, aoff[ar], pbuf, pk,
                                     count, deps, 2);
            if (s->op == LOOM_AVG) loomi_sched_avg(s, LOOMI_BUF_RECV, 0, count, &red, 1);
            if (folded) { /* block r+1 goes on to the folded partner */
                uint32_t r2 = loomi_sched_reduce(s, LOOMI_BUF_SCRATCH, aoff[ar] + bb,
                                                 LOOMI_BUF_SCRATCH, aoff[ar] + bb, pbuf, pk + bb,
                                                 count, deps, 2);
                if (s->op == LOOM_AVG)
                    r2 = loomi_sched_avg(s, LOOMI_BUF_SCRATCH, aoff[ar] + bb, count, &r2, 1);
                loomi_sched_send(s, r + 1, tag_out, LOOMI_BUF_SCRATCH, aoff[ar] + bb, count, &r2,
                                 1);
            }
        }
        /* The area holding the old partials is read by this level's send
         * and reduce; the next receive into it waits for both. */
        if (pbuf == LOOMI_BUF_SCRATCH) busy[ar ^ 1][0] = sd, busy[ar ^ 1][1] = red;
        pbuf = LOOMI_BUF_SCRATCH, poff = aoff[ar], pblo = kb0, pw = red;
        lo = klo, hi = khi;
    }
    return LOOM_SUCCESS;
}
