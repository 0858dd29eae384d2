/*
 * sparse.c - sparse collectives (loom_sparse_allgather(3),
 * loom_sparse_reduce_scatter(3)): every rank gives (index, value) pairs
 * of a vector of dense_count elements that is zero elsewhere; the result
 * is what the dense allreduce (reduce-scatter) of those vectors gives.
 *
 * One call is three steps, all on the collectives below it:
 *   1. each rank checks its arguments and merges its own pairs (sorted by
 *      index, duplicates combined with op), then allgathers a small
 *      header (what it was called with, its count, any error it found,
 *      and for reduce-scatter its count per destination block).  Every
 *      rank then holds every header and takes the same decision: fail
 *      (a rank's bad argument, an index out of range, ranks that passed
 *      different dense_count, dtype or op), or exchange sparse, or fall
 *      back to dense.  A rank's bad argument is reported on every rank,
 *      so none waits for a rank that gave up.
 *   2. sparse: an allgather of each rank's pairs padded to the largest
 *      count (allgather), or an alltoallv of each block's pairs to its
 *      owner (reduce-scatter); dense: the merged pairs are scattered into
 *      a dense vector and the dense collective runs.
 *   3. sparse: the ranks' sorted lists are merged by index, in rank order,
 *      with the reduction kernels; every received block is checked
 *      (count, order, range) before it is used.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/collectives.h"
#include "comm/comm.h"
#include "comm/devbuf.h"
#include "comm/group.h"
#include "comm/sparse.h"
#include "core/internal.h"
#include "reduce/reduce.h"

/* The header's fields (uint64 each), then one count per rank. */
enum {
    H_KIND,   /* SPARSE_MAGIC | 1 allgather, | 2 reduce-scatter */
    H_DENSE,  /* dense_count (reduce-scatter: nranks * recvcount) */
    H_DTYPE,
    H_OP,
    H_NNZ,    /* pairs after merging duplicates */
    H_ERR,    /* 0, ERR_INDEX or ERR_ARG */
    H_BADPOS, /* ERR_INDEX: the position in idx */
    H_BADIDX, /* ERR_INDEX: the index found there */
    H_FIXED
};
#define SPARSE_MAGIC 0x4c53505200000000ull /* "LSPR" */
#define ERR_INDEX 1
#define ERR_ARG 2
#define PAIR_IDX sizeof(uint64_t)

/* The bytes of a block of c pairs (c indices, then c values), rounded up
 * to 8 so that the next block's indices are aligned. */
static size_t padded(size_t c, size_t es) { return (c * (PAIR_IDX + es) + 7) & ~(size_t)7; }

/* One element of es bytes (2, 4 or 8: every sparse dtype but the 1-byte
 * ones), copied without a call. */
static inline void cp(void *d, const void *s, size_t es)
{
    switch (es) {
    case 2: memcpy(d, s, 2); break;
    case 4: memcpy(d, s, 4); break;
    case 8: memcpy(d, s, 8); break;
    default: memcpy(d, s, es); break;
    }
}

/* Sorts keys[0..n) by their bits [lo, lo + bits), carrying pos along
 * (pos may be NULL), stably: least significant digit first, 8 bits a
 * pass; k2/p2 are as long, scratch.  The result ends in keys/pos. */
static void radix_sort(uint64_t *keys, uint64_t *pos, uint64_t *k2, uint64_t *p2, size_t n,
                      int lo, int bits)
{
    enum { D = 8, R = 1 << D };
    size_t cnt[R];
    uint64_t *const k0 = keys, *const p0 = pos;
    for (int sh = lo; sh < lo + bits; sh += D) {
        memset(cnt, 0, sizeof cnt);
        for (size_t i = 0; i < n; i++) cnt[(keys[i] >> sh) & (R - 1)]++;
        size_t sum = 0;
        for (size_t d = 0; d < R; d++) {
            size_t c = cnt[d];
            cnt[d] = sum;
            sum += c;
        }
        for (size_t i = 0; i < n; i++) {
            size_t at = cnt[(keys[i] >> sh) & (R - 1)]++;
            k2[at] = keys[i];
            if (pos) p2[at] = pos[i];
        }
        uint64_t *t = keys;
        keys = k2, k2 = t;
        if (p0) t = pos, pos = p2, p2 = t;
    }
    if (keys != k0) { /* an odd number of passes: the result sits in the scratch */
        memcpy(k0, keys, n * sizeof *keys);
        if (p0) memcpy(p0, pos, n * sizeof *pos);
    }
}

size_t loomi_sparse_merge(const uint64_t *idx, const void *val, size_t nnz, loom_datatype_t dtype,
                          loom_op_t op, uint64_t *out_idx, void *out_val, uint64_t *scratch)
{
    const size_t es = loom_datatype_size(dtype);
    const char *v = val;
    char *ov = out_val;
    size_t i = 1;
    while (i < nnz && idx[i - 1] < idx[i]) i++;
    if (i >= nnz) { /* already sorted, no duplicates */
        if (nnz) {
            memcpy(out_idx, idx, nnz * sizeof *idx);
            memcpy(ov, v, nnz * es);
        }
        return nnz;
    }
    uint64_t *keys = scratch, *pos = scratch + nnz, maxk = 0;
    for (i = 0; i < nnz; i++)
        if (idx[i] > maxk) maxk = idx[i];
    int bits = 1;
    while (bits < 64 && (maxk >> bits)) bits++;
    /* small enough: one word a pair, the index above the position */
    const int packed = bits <= 32 && nnz <= UINT32_MAX;
    for (i = 0; i < nnz; i++) {
        keys[i] = packed ? idx[i] << 32 | i : idx[i];
        if (!packed) pos[i] = i;
    }
    radix_sort(keys, packed ? NULL : pos, scratch + 2 * nnz, scratch + 3 * nnz, nnz,
               packed ? 32 : 0, bits);
    size_t k = 0;
    for (i = 0; i < nnz; i++) {
        const uint64_t key = packed ? keys[i] >> 32 : keys[i];
        const size_t p = (size_t)(packed ? keys[i] & UINT32_MAX : pos[i]);
        if (k && out_idx[k - 1] == key) {
            loomi_reduce_inplace(ov + (k - 1) * es, v + p * es, 1, dtype, op);
        } else {
            out_idx[k] = key;
            cp(ov + k * es, v + p * es, es);
            k++;
        }
    }
    return k;
}

/* A block of cnt pairs from rank r: idx (cnt indices) then cnt values. */
struct list {
    const uint64_t *idx;
    const char *val;
    size_t cnt, pos;
};

/* Each list sorted, indices unique and in [lo, hi)?  The bytes came from
 * a peer: a NULL return names nothing wrong, else what is. */
static const char *list_bad(const struct list *l, uint64_t lo, uint64_t hi)
{
    for (size_t i = 0; i < l->cnt; i++) {
        uint64_t x;
        memcpy(&x, &l->idx[i], sizeof x);
        if (x < lo || x >= hi) return "an index out of its range";
        if (i && l->idx[i - 1] >= x) return "indices out of order";
    }
    return NULL;
}

/* out[i - lo] = op over the n ranks of their value at i, a rank without
 * a pair at i giving zero; out holds hi - lo elements, zeroed here.  The
 * lists are folded in rank order, the same on every rank (sum: from 0,
 * rank by rank; the other ops: the holders in rank order, then 0 once
 * when some rank holds none). */
static void merge_lists(struct list *l, int n, char *out, uint64_t lo, uint64_t hi,
                        loom_datatype_t dtype, loom_op_t op)
{
    const size_t es = loom_datatype_size(dtype);
    const uint64_t zero = 0;
    if (hi <= lo) return; /* an empty vector (recvbuf may be NULL) */
    memset(out, 0, (size_t)(hi - lo) * es);
    if (op == LOOM_SUM || op == LOOM_AVG) {
        /* 0 + rank 0's + rank 1's ...: a rank without a pair adds 0, so
         * each rank's pairs are added on their own, a batch at a time
         * through the kernels (a rank's indices are unique) */
        enum { BATCH = 2048 };
        uint64_t tmp[BATCH];
        for (int r = 0; r < n; r++)
            for (size_t k0 = 0; k0 < l[r].cnt; k0 += BATCH) {
                const size_t c = LOOMI_MIN((size_t)BATCH, l[r].cnt - k0);
                const uint64_t *ix = l[r].idx + k0;
                for (size_t k = 0; k < c; k++)
                    cp((char *)tmp + k * es, out + (size_t)(ix[k] - lo) * es, es);
                loomi_reduce_inplace(tmp, l[r].val + k0 * es, c, dtype, LOOM_SUM);
                for (size_t k = 0; k < c; k++)
                    cp(out + (size_t)(ix[k] - lo) * es, (char *)tmp + k * es, es);
            }
        if (op == LOOM_AVG) loomi_reduce_finish_avg(out, (size_t)(hi - lo), dtype, n);
        return;
    }
    for (;;) {
        uint64_t m = UINT64_MAX;
        for (int r = 0; r < n; r++)
            if (l[r].pos < l[r].cnt && l[r].idx[l[r].pos] < m) m = l[r].idx[l[r].pos];
        if (m == UINT64_MAX) break;
        char *dst = out + (size_t)(m - lo) * es;
        int held = 0;
        for (int r = 0; r < n; r++) {
            if (l[r].pos >= l[r].cnt || l[r].idx[l[r].pos] != m) continue;
            const char *src = l[r].val + l[r].pos * es;
            if (!held) cp(dst, src, es);
            else loomi_reduce_inplace(dst, src, 1, dtype, op);
            held++;
            l[r].pos++;
        }
        if (held < n) loomi_reduce_inplace(dst, &zero, 1, dtype, op);
    }
}

/* What one call was given, checked, merged. */
struct sp {
    const char *fn;
    struct loom_comm *comm;
    int rs; /* reduce-scatter */
    loom_datatype_t dtype;
    loom_op_t op;
    size_t es, dense, block; /* block: reduce-scatter's recvcount */
    uint64_t *midx;          /* merged pairs */
    char *mval;
    size_t mnnz;
    uint64_t *hdr; /* every rank's header, (H_FIXED + n) each */
    size_t hn;
    char msg[512]; /* this rank's own refusal */
};

static uint64_t *hdr_of(const struct sp *s, int r) { return s->hdr + (size_t)r * s->hn; }

static loom_result_t nomem(const struct sp *s)
{
    return loomi_fail(LOOM_ERR_NO_MEMORY, s->comm->rank, "%s: out of memory", s->fn);
}

/* Step 1 on this rank: checks, the merge, this rank's header. */
static void prepare(struct sp *s, const uint64_t *idx, const void *val, size_t nnz, void *recvbuf,
                    uint64_t *h)
{
    const int n = s->comm->nranks;
    h[H_KIND] = SPARSE_MAGIC | (s->rs ? 2u : 1u);
    h[H_DENSE] = s->dense;
    h[H_DTYPE] = (uint64_t)s->dtype;
    h[H_OP] = (uint64_t)s->op;
    s->es = loom_datatype_size(s->dtype);
#define REFUSE(...)                                             \
    do {                                                        \
        snprintf(s->msg, sizeof s->msg, __VA_ARGS__);           \
        h[H_ERR] = ERR_ARG;                                     \
        return;                                                 \
    } while (0)
    if (!s->es) REFUSE("%s: dtype %d is not a valid datatype", s->fn, (int)s->dtype);
    if ((unsigned)s->op >= LOOM_NUM_OPS)
        REFUSE("%s: op %d is not a valid reduction op", s->fn, (int)s->op);
    if (s->rs && s->block > SIZE_MAX / 4 / s->es / (size_t)n)
        REFUSE("%s: recvcount %zu is too large", s->fn, s->block);
    if (s->dense > SIZE_MAX / 4 / s->es / (size_t)n)
        REFUSE("%s: dense_count %zu is too large", s->fn, s->dense);
    if (nnz > SIZE_MAX / 4 / (PAIR_IDX + s->es + 4 * sizeof(uint64_t)))
        REFUSE("%s: nnz %zu is too large", s->fn, nnz);
    if (nnz && !idx) REFUSE("%s: idx is NULL with nnz %zu", s->fn, nnz);
    if (nnz && !val) REFUSE("%s: val is NULL with nnz %zu", s->fn, nnz);
    if ((s->rs ? s->block : s->dense) && !recvbuf) REFUSE("%s: recvbuf is NULL", s->fn);
    char dmsg[256];
    const char *dev = nnz ? loomi_devbuf_refused(s->fn, idx, "idx", dmsg, sizeof dmsg) : NULL;
    if (!dev && nnz) dev = loomi_devbuf_refused(s->fn, val, "val", dmsg, sizeof dmsg);
    if (!dev && (s->rs ? s->block : s->dense))
        dev = loomi_devbuf_refused(s->fn, recvbuf, "recvbuf", dmsg, sizeof dmsg);
    if (dev) REFUSE("%s", dev);
    for (size_t i = 0; i < nnz; i++)
        if (idx[i] >= s->dense) {
            h[H_ERR] = ERR_INDEX;
            h[H_BADPOS] = i;
            h[H_BADIDX] = idx[i];
            return;
        }
    s->midx = malloc(nnz ? nnz * PAIR_IDX : 1);
    s->mval = malloc(nnz ? nnz * s->es : 1);
    uint64_t *scratch = malloc(nnz ? 4 * nnz * sizeof *scratch : 1);
    if (!s->midx || !s->mval || !scratch) {
        free(scratch);
        REFUSE("%s: out of memory merging %zu pairs", s->fn, nnz);
    }
    s->mnnz = loomi_sparse_merge(idx, val, nnz, s->dtype, s->op, s->midx, s->mval, scratch);
    free(scratch);
    h[H_NNZ] = s->mnnz;
    if (s->rs) /* the merged indices are sorted: each block's are a run */
        for (size_t i = 0; i < s->mnnz; i++) h[H_FIXED + s->midx[i] / s->block]++;
#undef REFUSE
}

static const char *kind_name(uint64_t k)
{
    if (k == (SPARSE_MAGIC | 1u)) return "loom_sparse_allgather";
    if (k == (SPARSE_MAGIC | 2u)) return "loom_sparse_reduce_scatter";
    return "something else";
}

/* Step 1 on every rank: the same verdict from the same headers. */
static loom_result_t verdict(struct sp *s)
{
    const int n = s->comm->nranks, me = s->comm->rank;
    for (int r = 0; r < n; r++)
        if (hdr_of(s, r)[H_ERR] == ERR_ARG) {
            if (r == me) return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, me, "%s", s->msg);
            return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, me,
                              "%s: rank %d refused its arguments (its log says why); nothing "
                              "was exchanged",
                              s->fn, r);
        }
    const uint64_t *h0 = hdr_of(s, 0);
    static const char *const field[] = {"the call", "dense_count", "dtype", "op"};
    for (int r = 1; r < n; r++)
        for (int f = H_KIND; f <= H_OP; f++)
            if (f == H_KIND && hdr_of(s, r)[f] != h0[f]) {
                const uint64_t x = hdr_of(s, r)[f];
                return loomi_fail(LOOM_ERR_MISMATCH, me,
                                  "%s: ranks disagree on the call: rank %d passed %s, rank 0 %s; "
                                  "nothing was exchanged",
                                  s->fn, r, kind_name(x), kind_name(h0[f]));
            } else if (hdr_of(s, r)[f] != h0[f])
                return loomi_fail(LOOM_ERR_MISMATCH, me,
                                  "%s: ranks disagree on %s: rank %d passed %llu, rank 0 %llu%s; "
                                  "nothing was exchanged",
                                  s->fn, field[f], r, (unsigned long long)hdr_of(s, r)[f],
                                  (unsigned long long)h0[f],
                                  f == H_DENSE && s->rs ? " (nranks * recvcount)" : "");
    for (int r = 0; r < n; r++) {
        const uint64_t *h = hdr_of(s, r);
        if (h[H_KIND] != h0[H_KIND] || h[H_ERR] > ERR_ARG)
            return loomi_fail(LOOM_ERR_REMOTE, me, "%s: rank %d sent a malformed header", s->fn,
                              r);
        if (h[H_ERR] == ERR_INDEX)
            return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, me,
                              "%s: rank %d's idx[%llu] = %llu is out of range (dense_count "
                              "%zu); nothing was exchanged",
                              s->fn, r, (unsigned long long)h[H_BADPOS],
                              (unsigned long long)h[H_BADIDX], s->dense);
        uint64_t sum = 0;
        int over = 0;
        for (int b = 0; s->rs && b < n; b++) {
            if (h[H_FIXED + b] > s->block) over = 1;
            else sum += h[H_FIXED + b];
        }
        if (h[H_NNZ] > s->dense || (s->rs && (over || sum != h[H_NNZ])))
            return loomi_fail(LOOM_ERR_REMOTE, me, "%s: rank %d's header counts %llu pairs",
                              s->fn, r, (unsigned long long)h[H_NNZ]);
    }
    return LOOM_SUCCESS;
}

/* Write the merged pairs into a zeroed dense vector of s->dense elements. */
static void densify(const struct sp *s, char *dense)
{
    if (s->dense) memset(dense, 0, s->dense * s->es);
    for (size_t i = 0; i < s->mnnz; i++)
        cp(dense + s->midx[i] * s->es, s->mval + i * s->es, s->es);
}

int loomi_sparse_use_sparse(int rs, int n, size_t es, size_t dense, const uint64_t *counts,
                            size_t stride)
{
    const size_t pair = PAIR_IDX + es;
    if (!rs) { /* the largest count, padded, from each of n - 1 peers */
        uint64_t m = 0;
        for (int r = 0; r < n; r++)
            if (counts[(size_t)r * stride] > m) m = counts[(size_t)r * stride];
        return m <= (uint64_t)(2 * dense * es / ((size_t)n * pair));
    }
    const size_t block = dense / (size_t)n;
    const uint64_t lim = (uint64_t)((size_t)(n - 1) * block * es / pair);
    for (int b = 0; b < n; b++) {
        uint64_t in = 0, out = 0;
        for (int r = 0; r < n; r++) {
            if (r == b) continue;
            in += counts[(size_t)r * stride + (size_t)b];
            out += counts[(size_t)b * stride + (size_t)r];
        }
        if (in > lim || out > lim) return 0;
    }
    return 1;
}

static loom_result_t run_allgather(struct sp *s, void *recvbuf, loom_comm_t h, int *sparse)
{
    const int n = s->comm->nranks, me = s->comm->rank;
    uint64_t *cnt = malloc((size_t)n * sizeof *cnt);
    if (!cnt) return nomem(s);
    uint64_t m = 0;
    for (int r = 0; r < n; r++) {
        cnt[r] = hdr_of(s, r)[H_NNZ];
        if (cnt[r] > m) m = cnt[r];
    }
    *sparse = loomi_sparse_use_sparse(0, n, s->es, s->dense, cnt, 1);
    loom_result_t res;
    if (!*sparse) {
        free(cnt);
        densify(s, recvbuf);
        return loomi_call_allreduce(s->fn, recvbuf, recvbuf, s->dense, s->dtype, s->op, h, NULL,
                                    NULL);
    }
    /* m * (8 + es) * n <= 2 * dense * es, which the checks bound */
    const size_t B = padded((size_t)m, s->es);
    char *all = malloc(B ? B * (size_t)n : 1);
    struct list *l = malloc((size_t)n * sizeof *l);
    if (!all || !l) {
        free(all), free(l), free(cnt);
        return nomem(s);
    }
    char *mine = all + (size_t)me * B;
    memset(mine, 0, B);
    if (s->mnnz) {
        memcpy(mine, s->midx, s->mnnz * PAIR_IDX);
        memcpy(mine + m * PAIR_IDX, s->mval, s->mnnz * s->es);
    }
    res = B ? loomi_call_allgather(s->fn, mine, all, B, LOOM_UINT8, h, NULL, NULL) : LOOM_SUCCESS;
    for (int r = 0; res == LOOM_SUCCESS && r < n; r++) {
        l[r].idx = (const uint64_t *)(all + (size_t)r * B);
        l[r].val = all + (size_t)r * B + m * PAIR_IDX;
        l[r].cnt = cnt[r];
        l[r].pos = 0;
        const char *why = list_bad(&l[r], 0, s->dense);
        if (why)
            res = loomi_fail(LOOM_ERR_REMOTE, me, "%s: rank %d sent %s", s->fn, r, why);
    }
    if (res == LOOM_SUCCESS) merge_lists(l, n, recvbuf, 0, s->dense, s->dtype, s->op);
    free(all), free(l), free(cnt);
    return res;
}

static loom_result_t run_reduce_scatter(struct sp *s, void *recvbuf, loom_comm_t h, int *sparse)
{
    const int n = s->comm->nranks, me = s->comm->rank;
    *sparse = loomi_sparse_use_sparse(1, n, s->es, s->dense, s->hdr + H_FIXED, s->hn);
    if (!*sparse) {
        char *d = malloc(s->dense ? s->dense * s->es : 1);
        if (!d) return nomem(s);
        densify(s, d);
        loom_result_t r = loomi_call_reduce_scatter(s->fn, d, recvbuf, s->block, s->dtype, s->op,
                                                    h, NULL, NULL);
        free(d);
        return r;
    }
    const size_t pair = PAIR_IDX + s->es;
    size_t *v = malloc(4 * (size_t)n * sizeof *v);
    struct list *l = malloc((size_t)n * sizeof *l);
    size_t rtotal = 0;
    for (int r = 0; r < n; r++) rtotal += (size_t)hdr_of(s, r)[H_FIXED + me];
    char *sb = malloc(s->mnnz * pair + (size_t)n * 8), *rb = malloc(rtotal * pair + (size_t)n * 8);
    loom_result_t res = LOOM_SUCCESS;
    if (!v || !l || !sb || !rb) res = nomem(s);
    if (res == LOOM_SUCCESS) {
        size_t *sc = v, *sd = v + n, *rc = v + 2 * n, *rd = v + 3 * n, off = 0, first = 0;
        const uint64_t *mine = hdr_of(s, me) + H_FIXED;
        for (int b = 0; b < n; b++) { /* block b: its indices, then its values */
            sc[b] = padded((size_t)mine[b], s->es);
            sd[b] = off;
            memcpy(sb + off, s->midx + first, (size_t)mine[b] * PAIR_IDX);
            memcpy(sb + off + (size_t)mine[b] * PAIR_IDX, s->mval + first * s->es,
                   (size_t)mine[b] * s->es);
            off += sc[b];
            first += (size_t)mine[b];
        }
        off = 0;
        for (int r = 0; r < n; r++) {
            const size_t c = (size_t)hdr_of(s, r)[H_FIXED + me];
            rc[r] = padded(c, s->es);
            rd[r] = off;
            l[r].idx = (const uint64_t *)(rb + off);
            l[r].val = rb + off + c * PAIR_IDX;
            l[r].cnt = c;
            l[r].pos = 0;
            off += rc[r];
        }
        res = loomi_call_alltoallv(s->fn, sb, sc, sd, rb, rc, rd, LOOM_UINT8, h, NULL);
    }
    const uint64_t lo = (uint64_t)me * s->block, hi = lo + s->block;
    for (int r = 0; res == LOOM_SUCCESS && r < n; r++) {
        const char *why = list_bad(&l[r], lo, hi);
        if (why)
            res = loomi_fail(LOOM_ERR_REMOTE, me, "%s: rank %d sent %s", s->fn, r, why);
    }
    if (res == LOOM_SUCCESS) merge_lists(l, n, recvbuf, lo, hi, s->dtype, s->op);
    free(v), free(l), free(sb), free(rb);
    return res;
}

static loom_result_t sparse_call(struct sp *s, const uint64_t *idx, const void *val, size_t nnz,
                                 void *recvbuf, loom_comm_t h)
{
    loom_result_t r = loomi_comm_live(h, s->fn, &s->comm);
    if (r != LOOM_SUCCESS) return r;
    if (loomi_group_active())
        return loomi_fail(LOOM_ERR_INVALID_USAGE, s->comm->rank,
                          "%s: not allowed between loom_group_start and loom_group_end", s->fn);
    const int n = s->comm->nranks;
    if (s->rs) s->dense = s->block <= SIZE_MAX / (size_t)n ? s->block * (size_t)n : SIZE_MAX;
    s->hn = H_FIXED + (size_t)n;
    s->hdr = calloc((size_t)n, s->hn * sizeof *s->hdr);
    if (!s->hdr) return nomem(s);
    uint64_t *h_me = hdr_of(s, s->comm->rank);
    prepare(s, idx, val, nnz, recvbuf, h_me);
    r = loomi_call_allgather(s->fn, h_me, s->hdr, s->hn, LOOM_UINT64, h, NULL, NULL);
    if (r == LOOM_SUCCESS) r = verdict(s);
    int sparse = 0;
    if (r == LOOM_SUCCESS)
        r = s->rs ? run_reduce_scatter(s, recvbuf, h, &sparse)
                  : run_allgather(s, recvbuf, h, &sparse);
    if (r == LOOM_SUCCESS)
        LOOMI_INFO(s->comm->rank, "%s: %zu pairs here, %s exchange", s->fn, s->mnnz,
                    sparse ? "sparse" : "dense");
    free(s->hdr), free(s->midx), free(s->mval);
    return r;
}

loom_result_t loomi_call_sparse_allgather(const char *fn, const uint64_t *idx, const void *val,
                                          size_t nnz, size_t dense_count, loom_datatype_t dtype,
                                          loom_op_t op, void *recvbuf, loom_comm_t h)
{
    struct sp s = {.fn = fn, .dtype = dtype, .op = op, .dense = dense_count};
    return sparse_call(&s, idx, val, nnz, recvbuf, h);
}

loom_result_t loomi_call_sparse_reduce_scatter(const char *fn, const uint64_t *idx,
                                               const void *val, size_t nnz, size_t recvcount,
                                               loom_datatype_t dtype, loom_op_t op,
                                               void *recvbuf, loom_comm_t h)
{
    struct sp s = {.fn = fn, .rs = 1, .dtype = dtype, .op = op, .block = recvcount};
    return sparse_call(&s, idx, val, nnz, recvbuf, h);
}
