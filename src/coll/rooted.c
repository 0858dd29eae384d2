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
#include "coll/build.h"
#include "coll/coll.h"
#include "core/internal.h"

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

/* A builder pipelining count elements, never in more chunks than
 * elements (every chunk is then non-empty). */
static loom_result_t rooted_build(struct loomi_build *b, struct loomi_sched *s, size_t count,
                                  size_t es, size_t chunk_bytes)
{
    loom_result_t rc = loomi_build_init(b, s, count * es, chunk_bytes);
    if (b->C > count) b->C = count;
    return rc;
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
    struct loomi_build b;
    if ((rc = rooted_build(&b, s, n, es, a->chunk_bytes)) != LOOM_SUCCESS) return rc;
    const int parent = to_abs(parent_of(v), root, p), m0 = child_mask(v, p);
    for (size_t c = 0; c < b.C; c++) {
        size_t o, len;
        loomi_chunk(n, b.C, c, &o, &len);
        if (!isroot) loomi_brecv(&b, parent, (uint32_t)c, RECV_B, o * es, len);
        /* Largest subtree first: it has the longest way to go. */
        for (int m = m0; m; m /= 2) loomi_bsend(&b, to_abs(v + m, root, p), (uint32_t)c, src, o * es, len);
    }
    return loomi_build_done(&b);
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
    struct loomi_build b;
    if ((rc = loomi_build_init(&b, s, 0, 0)) != LOOM_SUCCESS) return rc;
#define SEGS(i, k) loomi_seg_start(&g, (i)) * es, loomi_seg_start(&g, (i) + (k)) - loomi_seg_start(&g, (i))
    /* Scatter (tag 0): the own subtree's segments into RECV. */
    if (!isroot) loomi_brecv(&b, to_abs(parent_of(v), root, p), 0, RECV_B, SEGS(v, sub));
    for (int m = child_mask(v, p); m; m /= 2)
        loomi_bsend(&b, to_abs(v + m, root, p), 0, src, SEGS(v + m, subtree(v + m, p)));

    /* Ring allgather (tag 1 + k): step k sends segment v-k to the right and
     * receives v-k-1 from the left, forwarding what came in at step k-1. */
    const int vr = (v + 1) % p, subr = subtree(vr, p);
    const int right = to_abs(vr, root, p), left = to_abs(loomi_mod(v - 1, p), root, p);
    for (int k = 0; k < p - 1; k++) {
        int j = loomi_mod(v - k, p);
        if (!(j >= vr && j < vr + subr))
            loomi_bsend(&b, right, 1 + (uint32_t)k, j >= v && j < v + sub ? src : RECV_B, SEGS(j, 1));
        j = loomi_mod(v - k - 1, p);
        if (!(j >= v && j < v + sub)) loomi_brecv(&b, left, 1 + (uint32_t)k, RECV_B, SEGS(j, 1));
    }
#undef SEGS
    return loomi_build_done(&b);
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
    struct loomi_build b;
    if ((rc = rooted_build(&b, s, n, es, a->chunk_bytes)) != LOOM_SUCCESS) return rc;
    const size_t C = b.C, K = C < 2 ? 1 : 2, maxc = (n + C - 1) / C;
    int ch[32], nc = 0;
    for (int m = 1; m < p && (!v || m < lowbit(v)) && v + m < p; m *= 2)
        ch[nc++] = to_abs(v + m, root, p);
    const size_t accn = isroot ? 0 : K * maxc; /* accumulator slots (elements) */
    if (nc) s->buf_bytes[SCR_B] = (accn + (size_t)nc * K * maxc) * es;
    for (size_t c = 0; c < C; c++) {
        size_t o, len, sl = c % K;
        loomi_chunk(n, C, c, &o, &len);
        if (!nc) { /* a leaf sends its input as it is */
            loomi_bsend(&b, parent, (uint32_t)c, SEND_B, o * es, len);
            continue;
        }
        const int acc = isroot ? RECV_B : SCR_B;
        const size_t acc_off = isroot ? o * es : sl * maxc * es;
        for (int i = 0; i < nc; i++) {
            size_t soff = (accn + ((size_t)i * K + sl) * maxc) * es;
            loomi_brecv(&b, ch[i], (uint32_t)c, SCR_B, soff, len);
            loomi_breduce(&b, acc, acc_off, i ? acc : in, i ? acc_off : o * es, SCR_B, soff, len);
        }
        if (!isroot) loomi_bsend(&b, parent, (uint32_t)c, SCR_B, acc_off, len);
        else if (s->op == LOOM_AVG) loomi_bavg(&b, RECV_B, o * es, len);
    }
    return loomi_build_done(&b);
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
    const size_t maxseg = loomi_seg_len(&g, 0);
    struct loomi_build b;
    if ((rc = rooted_build(&b, s, maxseg, es, a->chunk_bytes)) != LOOM_SUCCESS) return rc;
    const size_t C = b.C, maxc = (maxseg + C - 1) / C;
    /* Partial sums, then receive slots: two alternate between steps. */
    const size_t nslots = p > 2 ? 2 : 1;
    s->buf_bytes[SCR_B] = (n + nslots * C * maxc) * es;
    const int right = to_abs((v + 1) % p, root, p), left = to_abs(loomi_mod(v - 1, p), root, p);
    const int in = isroot && a->inplace ? SCR_B : SEND_B;
    if (isroot && a->inplace) loomi_bcopy(&b, SCR_B, 0, RECV_B, 0, n);
    for (int k = 0; k < p - 1; k++) {
        const int ss = loomi_mod(v - k - 1, p), rs = loomi_mod(v - k - 2, p);
        const int last = k == p - 2; /* rs == v: the final value */
        for (size_t c = 0; c < C; c++) {
            size_t o, len;
            uint32_t tag = (uint32_t)((size_t)k * C + c);
            loomi_build_chunk(&b, &g, ss, c, &o, &len);
            loomi_bsend(&b, right, tag, k ? SCR_B : in, o, len);
            loomi_build_chunk(&b, &g, rs, c, &o, &len);
            size_t soff = (n + ((size_t)(k & 1) * C + c) * maxc) * es;
            loomi_brecv(&b, left, tag, SCR_B, soff, len);
            loomi_breduce(&b, last && isroot ? RECV_B : SCR_B, o, in, o, SCR_B, soff, len);
        }
    }
    /* Gather to the root (tag (p-1)*C + c); LOOM_AVG divides there, once. */
    const uint32_t gtag = (uint32_t)((size_t)(p - 1) * C);
    for (int j = isroot ? 0 : v; j < (isroot ? p : v + 1); j++)
        for (size_t c = 0; c < C; c++) {
            size_t o, len;
            loomi_build_chunk(&b, &g, j, c, &o, &len);
            if (!isroot) loomi_bsend(&b, root, gtag + (uint32_t)c, SCR_B, o, len);
            else if (j) loomi_brecv(&b, to_abs(j, root, p), gtag + (uint32_t)c, RECV_B, o, len);
            if (isroot && s->op == LOOM_AVG) loomi_bavg(&b, RECV_B, o, len);
        }
    return loomi_build_done(&b);
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
 * and the SCRATCH others keep their subtree's blocks in.  Returns 0 with
 * *b started where the rest is the caller's: this rank's subtree of *sub
 * blocks goes to or comes from *parent as *n1 then *n2 blocks (tags 0
 * and 1; *n2 = 0 unless the range wraps at the root). */
static int tree_begin(struct loomi_sched *s, const struct loomi_coll_args *a, int gather,
                      struct loomi_build *b, int *sub, int *parent, int *n1, int *n2,
                      loom_result_t *rc)
{
    if (blocks_begin(s, a, gather, rc)) return 1;
    const int p = s->nranks, root = a->root, v = loomi_mod(s->rank - root, p);
    const size_t n = a->count, bb = n * s->esize;
    uint32_t (*const xfer)(struct loomi_sched *, int, uint32_t, int, size_t, size_t,
                           const uint32_t *, int) = gather ? loomi_sched_recv : loomi_sched_send;
    int A;
    if (v == 0) {
        const int buf = gather ? RECV_B : SEND_B;
        for (int m = child_mask(v, p); m; m /= 2) {
            int w = v + m;
            root_split(w, subtree(w, p), root, p, &A, n1, n2);
            int peer = to_abs(w, root, p);
            xfer(s, peer, 0, buf, (size_t)A * bb, (size_t)*n1 * n, NULL, 0);
            if (*n2) xfer(s, peer, 1, buf, 0, (size_t)*n2 * n, NULL, 0);
        }
        return 1;
    }
    *sub = subtree(v, p), *parent = to_abs(parent_of(v), root, p);
    if (*sub == 1) {
        if (gather) loomi_sched_send(s, *parent, 0, SEND_B, 0, n, NULL, 0);
        else loomi_sched_recv(s, *parent, 0, RECV_B, 0, n, NULL, 0);
        return 1;
    }
    s->buf_bytes[SCR_B] = (size_t)*sub * bb;
    *n1 = *sub, *n2 = 0;
    if (parent_of(v) == 0) root_split(v, *sub, root, p, &A, n1, n2);
    *rc = loomi_build_init(b, s, 0, 0);
    return *rc != LOOM_SUCCESS;
}

/* Binomial gather: a rank collects its subtree's blocks in SCRATCH (in
 * relative order, its own first) and passes them up as one message.
 * Binomial scatter: a rank receives its subtree's blocks into SCRATCH (or
 * its own block straight into RECV when it is a leaf), keeps the first
 * and sends each child its subtree's range. */
static loom_result_t tree_blocks(struct loomi_sched *s, const struct loomi_coll_args *a,
                                 int gather)
{
    loom_result_t rc;
    struct loomi_build b;
    int sub, parent, n1, n2;
    if (tree_begin(s, a, gather, &b, &sub, &parent, &n1, &n2, &rc)) return rc;
    const int p = s->nranks, v = loomi_mod(s->rank - a->root, p);
    const size_t n = a->count, bb = n * s->esize;
    uint32_t (*const up)(struct loomi_build *, int, uint32_t, int, size_t, size_t) =
        gather ? loomi_bsend : loomi_brecv;
    uint32_t (*const down)(struct loomi_build *, int, uint32_t, int, size_t, size_t) =
        gather ? loomi_brecv : loomi_bsend;
    for (int k = 0; k < 2 && !gather; k++) /* the parent's part first */
        up(&b, parent, (uint32_t)k, SCR_B, k ? (size_t)n1 * bb : 0, (size_t)(k ? n2 : n1) * n);
    if (gather) loomi_bcopy(&b, SCR_B, 0, SEND_B, 0, n);
    else loomi_bcopy(&b, RECV_B, 0, SCR_B, 0, n);
    for (int m = child_mask(v, p); m; m /= 2)
        down(&b, to_abs(v + m, a->root, p), 0, SCR_B, (size_t)m * bb, (size_t)subtree(v + m, p) * n);
    for (int k = 0; k < 2 && gather; k++) /* the parent's part last */
        up(&b, parent, (uint32_t)k, SCR_B, k ? (size_t)n1 * bb : 0, (size_t)(k ? n2 : n1) * n);
    return loomi_build_done(&b);
}

loom_result_t loomi_gen_gather_tree(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    return tree_blocks(s, a, 1);
}

loom_result_t loomi_gen_scatter_tree(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    return tree_blocks(s, a, 0);
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
