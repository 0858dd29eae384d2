/*
 * tree.c - pipelined double binary tree allreduce.
 *
 * Why a double binary tree rather than a binomial one: in a pipelined
 * binomial tree the root (and every inner node) has up to log2(p)
 * children, so it receives log2(p) chunks for every one it sends up and
 * the pipeline runs at 1/log2(p) of the link rate.  A binary tree caps
 * that at two, and two complementary binary trees each carrying half the
 * data (NCCL's construction) make a rank that is a leaf in one tree an
 * inner node in the other, so per-rank traffic is about the same as one
 * pass of the vector each way, at a depth of about log2(p).
 *
 * Tree 0 is the in-order binary tree over positions 0..p-1 (1-based
 * position v has lowest set bit b; its children are v -/+ b/2; positions
 * beyond p are skipped over).  Tree 1 mirrors it (even p) or shifts it by
 * one (odd p), so the even ranks that are leaves in tree 0 are inner
 * nodes in tree 1.
 *
 * Each half is cut into chunks of about chunk_bytes.  For chunk c a rank
 * receives its children's partials, adds its own, sends the sum to its
 * parent, then receives the final value from it and passes it down; the
 * root finishes (and averages) it.  Chunk c climbs while c-1 descends.
 * Every value is finished at a root and copied down, so all ranks end with
 * the same bits.
 *
 * A rank sends its chunks up one after the other: chunk c leaves once
 * chunk c-1 has.  Without that a leaf, whose sends wait on nothing, posts
 * all of them at once, and they can take the parent's incoming link ahead
 * of every chunk of its sibling: the parent then reduces nothing until the
 * leaf's whole half has arrived (into its unexpected-message buffer), and
 * the pipeline runs level by level instead of all at once, slower the
 * deeper the tree (tests/unit/test_model.c compares the simulation of
 * these schedules with the closed form of src/topo/model.c).
 */
#include "coll/build.h"
#include "coll/coll.h"
#include "core/internal.h"

#define TREE_SLOTS 2 /* receive buffers per child: chunk c+1 arrives while c is reduced */

struct btree {
    int parent; /* -1 at the root */
    int child[2];
    int nch;
};

/* Node at position pos (0-based) of the in-order tree of p positions. */
static void inorder(int p, int pos, int *parent, int child[2], int *nch)
{
    const int v = pos + 1, b = v & -v;
    *parent = -1;
    if (v != loomi_pow2_floor(p)) {
        int u = v, ub = b;
        do { /* climb; ancestors past p do not exist */
            u = (u & (2 * ub)) ? u - ub : u + ub;
            ub *= 2;
        } while (u > p);
        *parent = u - 1;
    }
    *nch = 0;
    if (b > 1) {
        child[(*nch)++] = v - b / 2 - 1;
        int c = v + b / 2; /* right child, or the first of its left spine within p */
        while (c > p && (c & -c) > 1) c -= (c & -c) / 2;
        if (c <= p) child[(*nch)++] = c - 1;
    }
}

static void tree_of(int p, int r, int which, struct btree *t)
{
    int pos = r, par, ch[2];
    if (which) pos = (p & 1) ? loomi_mod(r - 1, p) : p - 1 - r;
    inorder(p, pos, &par, ch, &t->nch);
    /* Position -> rank in tree 1: the inverse of the map above. */
#define RANK(x) (which ? ((p & 1) ? ((x) + 1) % p : p - 1 - (x)) : (x))
    t->parent = par < 0 ? -1 : RANK(par);
    for (int i = 0; i < t->nch; i++) t->child[i] = RANK(ch[i]);
#undef RANK
}

loom_result_t loomi_gen_allreduce_tree(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    const int p = s->nranks, r = s->rank, inplace = a->inplace;
    const size_t es = s->esize, count = a->count;
    if (loomi_allreduce_trivial(s, count, inplace)) return LOOM_SUCCESS;
    const int src = inplace ? LOOMI_BUF_RECV : LOOMI_BUF_SEND;
    struct btree t[2];
    size_t off[2], len[2], C[2], maxchunk[2], slots[2], sbase[2];
    off[0] = 0, len[0] = count / 2, off[1] = len[0], len[1] = count - len[0];
    size_t scratch = 0;
    for (int k = 0; k < 2; k++) {
        tree_of(p, r, k, &t[k]);
        C[k] = loomi_build_chunks(len[k] * es, a->chunk_bytes);
        maxchunk[k] = (len[k] + C[k] - 1) / C[k];
        slots[k] = C[k] < TREE_SLOTS ? C[k] : TREE_SLOTS;
        sbase[k] = scratch;
        scratch += (size_t)t[k].nch * slots[k] * maxchunk[k] * es;
    }
    s->buf_bytes[LOOMI_BUF_SCRATCH] = scratch;
    struct loomi_build b;
    loom_result_t rc = loomi_build_init(&b, s, 0, 0);
    if (rc != LOOM_SUCCESS) return rc;
    uint32_t last_up[2] = {LOOMI_NO_DEP, LOOMI_NO_DEP};
    const size_t Cmax = C[0] > C[1] ? C[0] : C[1];
    /* Chunks of the two trees interleaved, so both pipelines fill at once. */
    for (size_t c = 0; c < Cmax; c++)
        for (int k = 0; k < 2; k++) {
            size_t o, n;
            if (c >= C[k]) continue;
            loomi_chunk(len[k], C[k], c, &o, &n);
            const size_t at = (off[k] + o) * es;
            const uint32_t up = (uint32_t)((k ? C[0] : 0) + c) * 2, down = up + 1;
            const struct btree *tk = &t[k];
            int acc = src; /* where this rank's partial is */
            for (int j = 0; j < tk->nch; j++) {
                size_t soff = sbase[k] + ((size_t)j * slots[k] + c % slots[k]) * maxchunk[k] * es;
                loomi_brecv(&b, tk->child[j], up, LOOMI_BUF_SCRATCH, soff, n);
                loomi_breduce(&b, LOOMI_BUF_RECV, at, acc, at, LOOMI_BUF_SCRATCH, soff, n);
                acc = LOOMI_BUF_RECV;
            }
            if (tk->parent >= 0) {
                /* Up the tree in chunk order (no data orders them). */
                loomi_build_after(&b, last_up[k]);
                uint32_t sd = loomi_bsend(&b, tk->parent, up, acc, at, n);
                if (sd != LOOMI_NO_DEP) last_up[k] = sd;
                loomi_brecv(&b, tk->parent, down, LOOMI_BUF_RECV, at, n);
            } else if (s->op == LOOM_AVG) {
                loomi_bavg(&b, LOOMI_BUF_RECV, at, n);
            }
            for (int j = 0; j < tk->nch; j++)
                loomi_bsend(&b, tk->child[j], down, LOOMI_BUF_RECV, at, n);
        }
    return loomi_build_done(&b);
}
