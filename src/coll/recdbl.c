/*
 * recdbl.c - recursive doubling: log2(q) exchanges with partners at
 * distance 1, 2, 4, ... of a power-of-two core of q ranks; latency-optimal
 * for small messages.
 *
 * Non-power-of-two p: the first 2*(p-q) ranks pair up (2i, 2i+1); the odd
 * one hands its input to the even one before and gets the result back
 * after, so the core is ranks 0, 2, .., 2(p-q)-2, 2(p-q), .., p-1.
 */
#include "coll/coll.h"
#include "coll/coll_util.h"
#include "core/internal.h"

#include <stdlib.h>

#define RD_MAX_CHUNKS 1024

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
    const int L = loomi_log2(q);
    const size_t C = loomi_nchunks(count * es, a->chunk_bytes, RD_MAX_CHUNKS);
    const uint32_t Ct = (uint32_t)C, tag_out = (uint32_t)(L + 1) * Ct;
    const int nr = loomi_fold_core(r, extra);

    if (nr < 0) { /* folded: hand the input over, get the result back */
        for (size_t c = 0; c < C; c++) {
            size_t o, n;
            loomi_chunk(count, C, c, &o, &n);
            if (!n) continue;
            uint32_t sd = loomi_sched_send(s, r - 1, (uint32_t)c, src, o * es, n, NULL, 0);
            /* In place the result lands where the input is read from. */
            uint32_t dep = inplace ? sd : LOOMI_NO_DEP;
            loomi_sched_recv(s, r - 1, tag_out + (uint32_t)c, LOOMI_BUF_RECV, o * es, n, &dep, 1);
        }
        return LOOM_SUCCESS;
    }
    s->buf_bytes[LOOMI_BUF_SCRATCH] = count * es;
    /* cur[c]: last writer of RECV chunk c; scr[c]: last reader of scratch
     * chunk c. */
    uint32_t *cur = malloc(2 * C * sizeof *cur);
    if (!cur) return loomi_fail(LOOM_ERR_NO_MEMORY, r, "recursive doubling allreduce: out of memory");
    uint32_t *scr = cur + C;
    int have = src; /* where the current value is */
    for (size_t c = 0; c < 2 * C; c++) cur[c] = LOOMI_NO_DEP;
    if (r < 2 * extra) {
        for (size_t c = 0; c < C; c++) {
            size_t o, n;
            loomi_chunk(count, C, c, &o, &n);
            if (!n) continue;
            uint32_t rv = loomi_sched_recv(s, r + 1, (uint32_t)c, LOOMI_BUF_SCRATCH, o * es, n,
                                           NULL, 0);
            cur[c] = scr[c] = loomi_sched_reduce(s, LOOMI_BUF_RECV, o * es, src, o * es,
                                                 LOOMI_BUF_SCRATCH, o * es, n, &rv, 1);
        }
        have = LOOMI_BUF_RECV;
    }
    for (int l = 0; l < L; l++) {
        int pnr = nr ^ (1 << l), peer = loomi_fold_rank(pnr, extra), lower = nr < pnr;
        for (size_t c = 0; c < C; c++) {
            size_t o, n;
            loomi_chunk(count, C, c, &o, &n);
            if (!n) continue;
            uint32_t tag = (uint32_t)(l + 1) * Ct + (uint32_t)c;
            uint32_t sd = loomi_sched_send(s, peer, tag, have, o * es, n, &cur[c], 1);
            uint32_t rv = loomi_sched_recv(s, peer, tag, LOOMI_BUF_SCRATCH, o * es, n, &scr[c], 1);
            /* The reduce overwrites what the send reads when both are RECV. */
            uint32_t deps[2] = {rv, have == LOOMI_BUF_RECV ? sd : LOOMI_NO_DEP};
            cur[c] = scr[c] = loomi_sched_reduce(
                s, LOOMI_BUF_RECV, o * es, lower ? have : LOOMI_BUF_SCRATCH, o * es,
                lower ? LOOMI_BUF_SCRATCH : have, o * es, n, deps, 2);
        }
        have = LOOMI_BUF_RECV;
    }
    for (size_t c = 0; c < C; c++) {
        size_t o, n;
        loomi_chunk(count, C, c, &o, &n);
        if (!n) continue;
        if (s->op == LOOM_AVG) cur[c] = loomi_sched_avg(s, LOOMI_BUF_RECV, o * es, n, &cur[c], 1);
        if (r < 2 * extra)
            loomi_sched_send(s, r + 1, tag_out + (uint32_t)c, LOOMI_BUF_RECV, o * es, n, &cur[c], 1);
    }
    free(cur);
    return LOOM_SUCCESS;
}

/*
 * loomi_wlist keeps "everything written so far" as at most LOOMI_MAX_DEPS dependencies:
 * each new write depends on the write four places back, so the last four
 * writes cover all earlier ones.  Writes land in disjoint ranges, so the
 * extra edge only delays posting a receive behind one that came long
 * before it.
 */
/*
 * Allgather.  At level l a core rank holds the blocks of the 2^l core
 * ranks of its aligned group; core rank i stands for the real blocks
 * [loomi_fold_rank(i), loomi_fold_rank(i+1)) (two of them when it folded an odd rank), so
 * every group's blocks are contiguous in RECV and each level is one
 * message each way.
 */
loom_result_t loomi_gen_allgather_rd(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    const int p = s->nranks, r = s->rank, inplace = a->inplace;
    const size_t es = s->esize, count = a->count, bb = count * es;
    if (loomi_allgather_trivial(s, count, inplace)) return LOOM_SUCCESS;
    const int own_buf = inplace ? LOOMI_BUF_RECV : LOOMI_BUF_SEND;
    const size_t own_off = inplace ? (size_t)r * bb : 0;
    struct loomi_wlist wl = {.n = 0};
    if (!inplace) loomi_wl_add(&wl, loomi_sched_copy(s, LOOMI_BUF_RECV, (size_t)r * bb, LOOMI_BUF_SEND,
                                               0, count, NULL, 0));
    if (p == 1) return LOOM_SUCCESS;
    const int q = loomi_pow2_floor(p), extra = p - q;
    const int L = loomi_log2(q);
    const uint32_t tag_lo = 1, tag_hi = 2; /* fold-out messages */
    const int nr = loomi_fold_core(r, extra);
    if (nr < 0) {
        loomi_sched_send(s, r - 1, 0, own_buf, own_off, count, NULL, 0);
        loomi_sched_recv(s, r - 1, tag_lo, LOOMI_BUF_RECV, 0, (size_t)r * count, NULL, 0);
        if (r + 1 < p)
            loomi_sched_recv(s, r - 1, tag_hi, LOOMI_BUF_RECV, (size_t)(r + 1) * bb,
                             (size_t)(p - r - 1) * count, NULL, 0);
        return LOOM_SUCCESS;
    }
    const int folded = r < 2 * extra;
    if (folded)
        loomi_wl_add(&wl, loomi_sched_recv(s, r + 1, 0, LOOMI_BUF_RECV, (size_t)(r + 1) * bb, count,
                                     NULL, 0));
    uint32_t deps[4];
    for (int l = 0; l < L; l++) {
        int mask = 1 << l, pnr = nr ^ mask, peer = loomi_fold_rank(pnr, extra);
        int mine = nr & ~(mask - 1), theirs = pnr & ~(mask - 1);
        size_t b0 = (size_t)loomi_fold_rank(mine, extra), b1 = (size_t)loomi_fold_rank(mine + mask, extra);
        size_t t0 = (size_t)loomi_fold_rank(theirs, extra), t1 = (size_t)loomi_fold_rank(theirs + mask, extra);
        uint32_t tag = 3 + (uint32_t)l;
        if (l == 0 && !folded) /* just the own block, wherever it is */
            loomi_sched_send(s, peer, tag, own_buf, own_off, count, NULL, 0);
        else
            loomi_sched_send(s, peer, tag, LOOMI_BUF_RECV, b0 * bb, (b1 - b0) * count, deps,
                             loomi_wl_all(&wl, deps));
        uint32_t back = loomi_wl_back(&wl);
        loomi_wl_add(&wl, loomi_sched_recv(s, peer, tag, LOOMI_BUF_RECV, t0 * bb, (t1 - t0) * count,
                                     &back, 1));
    }
    if (folded) {
        int n = loomi_wl_all(&wl, deps);
        loomi_sched_send(s, r + 1, tag_lo, LOOMI_BUF_RECV, 0, (size_t)(r + 1) * count, deps, n);
        if (r + 2 < p)
            loomi_sched_send(s, r + 1, tag_hi, LOOMI_BUF_RECV, (size_t)(r + 2) * bb,
                             (size_t)(p - r - 2) * count, deps, n);
    }
    return LOOM_SUCCESS;
}
