/*
 * rooted.c - broadcast, reduce, gather and scatter.
 *
 * The trees are binomial over ranks relative to the root (v = r - root
 * mod p): v's parent is v minus its lowest set bit, its children are v + m
 * for the powers of two m below that bit (all m < p for the root), and
 * its subtree is the contiguous range [v, v + sub(v)).  Gather and scatter
 * rely on that contiguity to move a whole subtree as one message; blocks
 * in the user's buffer are in absolute rank order, so a subtree that
 * crosses rank p-1 arrives at (or leaves) the root as two messages.
 */
#include <stdlib.h>

#include "coll/coll.h"
#include "coll/coll_util.h"
#include "core/internal.h"

/* Enough to pipeline; bounded so that a tiny chunk size cannot blow the
 * schedule up. */
#define MAX_CHUNKS 4096

#define SEND_B LOOMI_BUF_SEND
#define RECV_B LOOMI_BUF_RECV
#define SCR_B LOOMI_BUF_SCRATCH

static int to_abs(int v, int root, int p) { return (v + root) % p; }
static int lowbit(int v) { return v & -v; }
static int parent_of(int v) { return v - lowbit(v); }

static int subtree(int v, int p)
{
    if (!v) return p;
    int m = lowbit(v);
    return m < p - v ? m : p - v;
}

/* Mask of v's largest child; children are v + m for m = that, m/2, .., 1
 * (each below p).  0: a leaf. */
static int child_mask(int v, int p)
{
    int m = v ? lowbit(v) / 2 : (p > 1 ? loomi_pow2_floor(p - 1) : 0);
    while (m && v + m >= p) m /= 2;
    return m;
}

/* Never more chunks than elements: every chunk is then non-empty. */
static size_t nchunks(size_t count, size_t es, size_t chunk_bytes)
{
    size_t C = loomi_nchunks(count * es, chunk_bytes, MAX_CHUNKS);
    return C > count ? count : C;
}

static loom_result_t check_root(const struct loomi_sched *s, const struct loomi_coll_args *a,
                                const char *fn)
{
    if (a->root < 0 || a->root >= s->nranks)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, s->rank,
                          "%s: root %d is not a rank of this communicator (size %d)", fn,
                          a->root, s->nranks);
    return LOOM_SUCCESS;
}

/* Fan deps[0..n) in to at most LOOMI_MAX_DEPS entries (returned count)
 * through zero-count copies, which move nothing and only join. */
static int fan_in(struct loomi_sched *s, uint32_t *d, int n)
{
    while (n > LOOMI_MAX_DEPS) {
        int m = 0;
        for (int i = 0; i < n; i += LOOMI_MAX_DEPS) {
            int k = n - i < LOOMI_MAX_DEPS ? n - i : LOOMI_MAX_DEPS;
            d[m++] = k == 1 ? d[i] : loomi_sched_copy(s, SCR_B, 0, SCR_B, 0, 0, d + i, k);
        }
        n = m;
    }
    return n;
}

/* The locals the broadcasts and reduces start from, once their begin
 * has checked the arguments: p ranks, this rank r, the root, v = r
 * relative to the root, the element size es and the count n. */
#define ROOTED_VIEW                                             \
    const int p = s->nranks, r = s->rank, root = a->root;      \
    const int v = loomi_mod(r - root, p), isroot = r == root; \
    const size_t es = s->esize, n = a->count

/* ------------------------------------------------------------ broadcast */

/* The check, buffers and cases both broadcasts share.  The root sends
 * from the caller's data directly (*src); out of place, its copy into
 * RECV runs alongside.  Returns 1 when that completes the schedule
 * (count 0, one rank, or an error: *rc says which). */
static int bcast_begin(struct loomi_sched *s, const struct loomi_coll_args *a, int *src,
                       loom_result_t *rc)
{
    *rc = check_root(s, a, "broadcast");
    if (*rc != LOOM_SUCCESS) return 1;
    const int isroot = s->rank == a->root, copy = isroot && !a->inplace;
    const size_t n = a->count;
    s->buf_bytes[SEND_B] = copy ? n * s->esize : 0;
    s->buf_bytes[RECV_B] = n * s->esize;
    *src = copy ? SEND_B : RECV_B;
    if (n && copy) loomi_sched_copy(s, RECV_B, 0, SEND_B, 0, n, NULL, 0);
    return n == 0 || s->nranks == 1;
}

/* Pipelined binomial tree: chunk c leaves for the children as soon as it
 * has arrived, so the depth costs one chunk's latency per level instead
 * of the whole message's. */
loom_result_t loomi_gen_broadcast_tree(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    loom_result_t rc;
    int src;
    if (bcast_begin(s, a, &src, &rc)) return rc;
    ROOTED_VIEW;
    const size_t C = nchunks(n, es, a->chunk_bytes);
    const int parent = to_abs(parent_of(v), root, p), m0 = child_mask(v, p);
    for (size_t c = 0; c < C; c++) {
        size_t o, len;
        loomi_chunk(n, C, c, &o, &len);
        uint32_t got = LOOMI_NO_DEP;
        if (!isroot) got = loomi_sched_recv(s, parent, (uint32_t)c, RECV_B, o * es, len, NULL, 0);
        /* Largest subtree first: it has the longest way to go. */
        for (int m = m0; m; m /= 2)
            loomi_sched_send(s, to_abs(v + m, root, p), (uint32_t)c, src, o * es, len, &got, 1);
    }
    return LOOM_SUCCESS;
}

/*
 * Van de Geijn: binomial scatter of p segments (segment v to relative rank
 * v, so a subtree's segments are one range), then a ring allgather.  A
 * rank already holds its subtree's segments after the scatter, so ring
 * messages carrying one of them are skipped on both sides (the root
 * receives nothing at all).
 */
loom_result_t loomi_gen_broadcast_sag(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    loom_result_t rc;
    int src;
    if (bcast_begin(s, a, &src, &rc)) return rc;
    ROOTED_VIEW;
    const struct loomi_seg g = loomi_seg_make(n, p);
    const int sub = subtree(v, p);

    /* Scatter (tag 0). */
    uint32_t have = LOOMI_NO_DEP; /* own subtree's segments are in RECV */
    if (!isroot) {
        size_t st = loomi_seg_start(&g, v), len = loomi_seg_start(&g, v + sub) - st;
        if (len)
            have = loomi_sched_recv(s, to_abs(parent_of(v), root, p), 0, RECV_B, st * es, len,
                                    NULL, 0);
    }
    for (int m = child_mask(v, p); m; m /= 2) {
        int w = v + m, sw = subtree(w, p);
        size_t st = loomi_seg_start(&g, w), len = loomi_seg_start(&g, w + sw) - st;
        if (len) loomi_sched_send(s, to_abs(w, root, p), 0, src, st * es, len, &have, 1);
    }

    /* Ring allgather (tag 1 + k): step k sends segment v-k to the right and
     * receives v-k-1 from the left, forwarding what came in at step k-1. */
    const int vr = (v + 1) % p, subr = subtree(vr, p);
    const int right = to_abs(vr, root, p), left = to_abs(loomi_mod(v - 1, p), root, p);
    uint32_t prev = LOOMI_NO_DEP;
    for (int k = 0; k < p - 1; k++) {
        uint32_t tag = 1 + (uint32_t)k;
        int j = loomi_mod(v - k, p);
        size_t len = loomi_seg_len(&g, j);
        if (len && !(j >= vr && j < vr + subr)) {
            int mine = j >= v && j < v + sub;
            loomi_sched_send(s, right, tag, mine ? src : RECV_B, loomi_seg_start(&g, j) * es,
                             len, mine ? &have : &prev, 1);
        }
        j = loomi_mod(v - k - 1, p);
        len = loomi_seg_len(&g, j);
        prev = LOOMI_NO_DEP;
        if (len && !(j >= v && j < v + sub))
            prev = loomi_sched_recv(s, left, tag, RECV_B, loomi_seg_start(&g, j) * es, len,
                                    NULL, 0);
    }
    return LOOM_SUCCESS;
}

/* --------------------------------------------------------------- reduce */

/* The check, buffers and cases both reduces share.  Returns 1 when that
 * completes the schedule (count 0; one rank, where the result is the
 * input; or an error: *rc says which). */
static int reduce_begin(struct loomi_sched *s, const struct loomi_coll_args *a, loom_result_t *rc)
{
    *rc = check_root(s, a, "reduce");
    if (*rc != LOOM_SUCCESS) return 1;
    const int isroot = s->rank == a->root;
    s->buf_bytes[SEND_B] = isroot && a->inplace ? 0 : a->count * s->esize;
    s->buf_bytes[RECV_B] = isroot ? a->count * s->esize : 0;
    if (!a->count) return 1;
    if (s->nranks == 1) {
        if (!a->inplace) loomi_sched_copy(s, RECV_B, 0, SEND_B, 0, a->count, NULL, 0);
        return 1;
    }
    return 0;
}

/*
 * Pipelined binomial reduce.  Per chunk, a rank receives each child's
 * partial into a slot and folds the children in (smallest subtree, the
 * first to arrive, first), into RECV on the root and into an accumulator
 * slot in SCRATCH elsewhere, then passes the chunk up.  Two slots of each
 * kind let chunk c+1 arrive while chunk c is being reduced or sent.
 */
loom_result_t loomi_gen_reduce_tree(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    loom_result_t rc;
    if (reduce_begin(s, a, &rc)) return rc;
    ROOTED_VIEW;
    const int in = isroot && a->inplace ? RECV_B : SEND_B;
    const int parent = to_abs(parent_of(v), root, p);
    const size_t C = nchunks(n, es, a->chunk_bytes);
    int ch[32], nc = 0;
    for (int m = 1; m < p && (!v || m < lowbit(v)) && v + m < p; m *= 2)
        ch[nc++] = to_abs(v + m, root, p);
    if (!nc) { /* a leaf sends its input as it is */
        for (size_t c = 0; c < C; c++) {
            size_t o, len;
            loomi_chunk(n, C, c, &o, &len);
            loomi_sched_send(s, parent, (uint32_t)c, SEND_B, o * es, len, NULL, 0);
        }
        return LOOM_SUCCESS;
    }
    const size_t K = C < 2 ? 1 : 2, maxc = (n + C - 1) / C;
    const size_t accn = isroot ? 0 : K * maxc; /* accumulator slots (elements) */
    s->buf_bytes[SCR_B] = (accn + (size_t)nc * K * maxc) * es;
    uint32_t last_use[32][2], acc_free[2] = {LOOMI_NO_DEP, LOOMI_NO_DEP};
    for (int i = 0; i < nc; i++) last_use[i][0] = last_use[i][1] = LOOMI_NO_DEP;
    for (size_t c = 0; c < C; c++) {
        size_t o, len, sl = c % K;
        loomi_chunk(n, C, c, &o, &len);
        const int acc = isroot ? RECV_B : SCR_B;
        const size_t acc_off = isroot ? o * es : sl * maxc * es;
        uint32_t prev = LOOMI_NO_DEP;
        for (int i = 0; i < nc; i++) {
            size_t soff = (accn + ((size_t)i * K + sl) * maxc) * es;
            uint32_t rv = loomi_sched_recv(s, ch[i], (uint32_t)c, SCR_B, soff, len,
                                           &last_use[i][sl], 1);
            uint32_t d[2] = {rv, i ? prev : acc_free[sl]};
            prev = i ? loomi_sched_reduce(s, acc, acc_off, acc, acc_off, SCR_B, soff, len, d, 2)
                     : loomi_sched_reduce(s, acc, acc_off, in, o * es, SCR_B, soff, len, d, 2);
            last_use[i][sl] = prev;
        }
        if (isroot) {
            if (s->op == LOOM_AVG) loomi_sched_avg(s, RECV_B, o * es, len, &prev, 1);
        } else {
            acc_free[sl] = loomi_sched_send(s, parent, (uint32_t)c, SCR_B, acc_off, len, &prev, 1);
        }
    }
    return LOOM_SUCCESS;
}

/*
 * Rabenseifner's reduce: a pipelined ring reduce-scatter leaves relative
 * rank v with the full reduction of segment v; each owner then sends its
 * segment, chunk by chunk as it is finished, straight to the root.  The
 * root receives the same (p-1)/p of the data a binomial gather would
 * bring it, without store-and-forward.  Partial sums live in SCRATCH on
 * every rank (on the root too, so that the gather can land in RECV while
 * the ring still reads them); an in-place root first copies its input
 * there, then reduces in place.
 */
loom_result_t loomi_gen_reduce_sag(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    loom_result_t rc;
    if (reduce_begin(s, a, &rc)) return rc;
    ROOTED_VIEW;
    const struct loomi_seg g = loomi_seg_make(n, p);
    const size_t maxseg = g.base + (g.rem ? 1 : 0);
    const size_t C = nchunks(maxseg, es, a->chunk_bytes), maxc = (maxseg + C - 1) / C;
    /* Partial sums, then receive slots: two alternate between steps. */
    const size_t nslots = p > 2 ? 2 : 1;
    s->buf_bytes[SCR_B] = (n + nslots * C * maxc) * es;
    const int right = to_abs((v + 1) % p, root, p), left = to_abs(loomi_mod(v - 1, p), root, p);
    const int in = isroot && a->inplace ? SCR_B : SEND_B;
    uint32_t cp = LOOMI_NO_DEP;
    if (isroot && a->inplace) cp = loomi_sched_copy(s, SCR_B, 0, RECV_B, 0, n, NULL, 0);

    /* red[C]: reduces of the previous step (what this step forwards);
     * nred[C]: this step's; user[2][C]: last reduce to read a slot. */
    uint32_t *mem = malloc(4 * C * sizeof *mem);
    if (!mem) return loomi_fail(LOOM_ERR_NO_MEMORY, r, "reduce: out of memory");
    uint32_t *red = mem, *nred = mem + C, *user = mem + 2 * C;
    for (size_t i = 0; i < 4 * C; i++) mem[i] = LOOMI_NO_DEP;
    const uint32_t Ct = (uint32_t)C;
    for (int k = 0; k < p - 1; k++) {
        const int ss = loomi_mod(v - k - 1, p), rs = loomi_mod(v - k - 2, p);
        const int last = k == p - 2; /* rs == v: the final value */
        const size_t sl = (size_t)(k & 1);
        for (size_t c = 0; c < C; c++) {
            size_t o, len;
            uint32_t tag = (uint32_t)k * Ct + (uint32_t)c;
            loomi_chunk(loomi_seg_len(&g, ss), C, c, &o, &len);
            if (len) {
                uint32_t dep = k ? red[c] : cp;
                loomi_sched_send(s, right, tag, k ? SCR_B : in,
                                 (loomi_seg_start(&g, ss) + o) * es, len, &dep, 1);
            }
            loomi_chunk(loomi_seg_len(&g, rs), C, c, &o, &len);
            nred[c] = LOOMI_NO_DEP;
            if (!len) continue;
            size_t soff = (n + (sl * C + c) * maxc) * es, off = (loomi_seg_start(&g, rs) + o) * es;
            uint32_t rv = loomi_sched_recv(s, left, tag, SCR_B, soff, len, &user[sl * C + c], 1);
            uint32_t d[2] = {rv, cp};
            nred[c] = loomi_sched_reduce(s, last && isroot ? RECV_B : SCR_B, off, in, off, SCR_B,
                                         soff, len, d, 2);
            user[sl * C + c] = nred[c];
        }
        uint32_t *t = red;
        red = nred;
        nred = t;
    }

    /* Gather to the root (tag (p-1)*C + c); LOOM_AVG divides there, once.
     * red[c] is now the final reduce of chunk c of the own segment. */
    const uint32_t gtag = (uint32_t)(p - 1) * Ct;
    if (!isroot) {
        for (size_t c = 0; c < C; c++) {
            size_t o, len;
            loomi_chunk(loomi_seg_len(&g, v), C, c, &o, &len);
            if (len)
                loomi_sched_send(s, root, gtag + (uint32_t)c, SCR_B,
                                 (loomi_seg_start(&g, v) + o) * es, len, &red[c], 1);
        }
    } else {
        for (int j = 0; j < p; j++)
            for (size_t c = 0; c < C; c++) {
                size_t o, len;
                loomi_chunk(loomi_seg_len(&g, j), C, c, &o, &len);
                if (!len) continue;
                size_t off = (loomi_seg_start(&g, j) + o) * es;
                uint32_t done = j ? loomi_sched_recv(s, to_abs(j, root, p), gtag + (uint32_t)c,
                                                     RECV_B, off, len, &cp, 1)
                                  : red[c];
                if (s->op == LOOM_AVG) loomi_sched_avg(s, RECV_B, off, len, &done, 1);
            }
    }
    free(mem);
    return LOOM_SUCCESS;
}

/* ------------------------------------------------------ gather, scatter */

/* The root's buffer holds p blocks of count elements. */
static loom_result_t check_blocks(const struct loomi_sched *s, const struct loomi_coll_args *a,
                                  const char *fn)
{
    loom_result_t rc = check_root(s, a, fn);
    if (rc != LOOM_SUCCESS) return rc;
    if (a->count && a->count > SIZE_MAX / s->esize / (size_t)s->nranks)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, s->rank,
                          "%s: count %zu times %d ranks is too large", fn, a->count, s->nranks);
    return LOOM_SUCCESS;
}

/* The check, buffers and cases all gathers (gather != 0) and scatters
 * share: the root's p blocks are in RECV for a gather, in SEND for a
 * scatter; out of place, the root copies its own block first.  Returns 1
 * when that completes the schedule (count 0, one rank, or an error: *rc
 * says which). */
static int blocks_begin(struct loomi_sched *s, const struct loomi_coll_args *a, int gather,
                        loom_result_t *rc)
{
    *rc = check_blocks(s, a, gather ? "gather" : "scatter");
    if (*rc != LOOM_SUCCESS) return 1;
    const int p = s->nranks, r = s->rank, isroot = r == a->root;
    const size_t n = a->count, bb = n * s->esize;
    const size_t all = isroot ? (size_t)p * bb : 0, own = isroot && a->inplace ? 0 : bb;
    s->buf_bytes[SEND_B] = gather ? own : all;
    s->buf_bytes[RECV_B] = gather ? all : own;
    if (!n) return 1;
    if (isroot && !a->inplace)
        loomi_sched_copy(s, RECV_B, gather ? (size_t)r * bb : 0, SEND_B,
                         gather ? 0 : (size_t)r * bb, n, NULL, 0);
    return p == 1;
}

/* Blocks [w, w+sw) of relative ranks, as the root's absolute blocks: the
 * first message covers blocks A.. up to rank p-1, the second (when the
 * range wraps) starts at block 0.  *n2 = 0 when there is no second. */
static void root_split(int w, int sw, int root, int p, int *A, int *n1, int *n2)
{
    *A = to_abs(w, root, p);
    *n1 = sw < p - *A ? sw : p - *A;
    *n2 = sw - *n1;
}

/* blocks_begin, and what a binomial gather or scatter does the same
 * way: the root's whole part (per child, largest subtree first, the
 * blocks of the child's subtree, in one message or, where the range
 * wraps, two), a leaf's (its own block, straight from SEND or into RECV)
 * and the SCRATCH others keep their subtree's blocks in. */
static int tree_begin(struct loomi_sched *s, const struct loomi_coll_args *a, int gather,
                      loom_result_t *rc)
{
    if (blocks_begin(s, a, gather, rc)) return 1;
    const int p = s->nranks, root = a->root, v = loomi_mod(s->rank - root, p);
    const size_t n = a->count, bb = n * s->esize;
    uint32_t (*const xfer)(struct loomi_sched *, int, uint32_t, int, size_t, size_t,
                           const uint32_t *, int) = gather ? loomi_sched_recv : loomi_sched_send;
    if (v == 0) {
        const int buf = gather ? RECV_B : SEND_B;
        int A, n1, n2;
        for (int m = child_mask(v, p); m; m /= 2) {
            int w = v + m;
            root_split(w, subtree(w, p), root, p, &A, &n1, &n2);
            int peer = to_abs(w, root, p);
            xfer(s, peer, 0, buf, (size_t)A * bb, (size_t)n1 * n, NULL, 0);
            if (n2) xfer(s, peer, 1, buf, 0, (size_t)n2 * n, NULL, 0);
        }
        return 1;
    }
    const int sub = subtree(v, p), parent = to_abs(parent_of(v), root, p);
    if (sub == 1) {
        if (gather) loomi_sched_send(s, parent, 0, SEND_B, 0, n, NULL, 0);
        else loomi_sched_recv(s, parent, 0, RECV_B, 0, n, NULL, 0);
        return 1;
    }
    s->buf_bytes[SCR_B] = (size_t)sub * bb;
    return 0;
}

/* Binomial gather: a rank collects its subtree's blocks in SCRATCH (in
 * relative order, its own first) and passes them up as one message. */
loom_result_t loomi_gen_gather_tree(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    loom_result_t rc;
    if (tree_begin(s, a, 1, &rc)) return rc;
    const int p = s->nranks, root = a->root, v = loomi_mod(s->rank - root, p);
    const size_t n = a->count, bb = n * s->esize;
    const int sub = subtree(v, p), pv = parent_of(v), parent = to_abs(pv, root, p);
    uint32_t d[33];
    int nd = 0;
    d[nd++] = loomi_sched_copy(s, SCR_B, 0, SEND_B, 0, n, NULL, 0);
    for (int m = child_mask(v, p); m; m /= 2) {
        int w = v + m;
        d[nd++] = loomi_sched_recv(s, to_abs(w, root, p), 0, SCR_B, (size_t)m * bb,
                                   (size_t)subtree(w, p) * n, NULL, 0);
    }
    nd = fan_in(s, d, nd);
    if (pv == 0) {
        int A, n1, n2;
        root_split(v, sub, root, p, &A, &n1, &n2);
        loomi_sched_send(s, parent, 0, SCR_B, 0, (size_t)n1 * n, d, nd);
        if (n2) loomi_sched_send(s, parent, 1, SCR_B, (size_t)n1 * bb, (size_t)n2 * n, d, nd);
    } else {
        loomi_sched_send(s, parent, 0, SCR_B, 0, (size_t)sub * n, d, nd);
    }
    return LOOM_SUCCESS;
}

/* Binomial scatter: a rank receives its subtree's blocks into SCRATCH (or
 * its own block straight into RECV when it is a leaf), keeps the first
 * and sends each child its subtree's range. */
loom_result_t loomi_gen_scatter_tree(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    loom_result_t rc;
    if (tree_begin(s, a, 0, &rc)) return rc;
    const int p = s->nranks, root = a->root, v = loomi_mod(s->rank - root, p);
    const size_t n = a->count, bb = n * s->esize;
    const int sub = subtree(v, p), pv = parent_of(v), parent = to_abs(pv, root, p);
    uint32_t d[2] = {LOOMI_NO_DEP, LOOMI_NO_DEP};
    if (pv == 0) {
        int A, n1, n2;
        root_split(v, sub, root, p, &A, &n1, &n2);
        d[0] = loomi_sched_recv(s, parent, 0, SCR_B, 0, (size_t)n1 * n, NULL, 0);
        if (n2) d[1] = loomi_sched_recv(s, parent, 1, SCR_B, (size_t)n1 * bb, (size_t)n2 * n, NULL, 0);
    } else {
        d[0] = loomi_sched_recv(s, parent, 0, SCR_B, 0, (size_t)sub * n, NULL, 0);
    }
    loomi_sched_copy(s, RECV_B, 0, SCR_B, 0, n, d, 2);
    for (int m = child_mask(v, p); m; m /= 2) {
        int w = v + m;
        loomi_sched_send(s, to_abs(w, root, p), 0, SCR_B, (size_t)m * bb,
                         (size_t)subtree(w, p) * n, d, 2);
    }
    return LOOM_SUCCESS;
}

/* Direct gather (gather != 0): every rank sends its block to the root;
 * direct scatter: the root sends every rank its block.  The root posts
 * from root+1 on, so that ranks are not all served in order 0.. */
static loom_result_t direct(struct loomi_sched *s, const struct loomi_coll_args *a, int gather)
{
    loom_result_t rc;
    if (blocks_begin(s, a, gather, &rc)) return rc;
    const int p = s->nranks, r = s->rank, root = a->root;
    const size_t n = a->count, bb = n * s->esize;
    if (r != root) {
        if (gather) loomi_sched_send(s, root, 0, SEND_B, 0, n, NULL, 0);
        else loomi_sched_recv(s, root, 0, RECV_B, 0, n, NULL, 0);
        return LOOM_SUCCESS;
    }
    for (int i = 1; i < p; i++) {
        int j = (r + i) % p;
        if (gather) loomi_sched_recv(s, j, 0, RECV_B, (size_t)j * bb, n, NULL, 0);
        else loomi_sched_send(s, j, 0, SEND_B, (size_t)j * bb, n, NULL, 0);
    }
    return LOOM_SUCCESS;
}

loom_result_t loomi_gen_gather_pairwise(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    return direct(s, a, 1);
}

loom_result_t loomi_gen_scatter_pairwise(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    return direct(s, a, 0);
}
