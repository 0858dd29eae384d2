/*
 * barrier.c - barrier: dissemination (bruck) and binomial tree, both with
 * zero-length messages (count 0 at offset 0 of SEND/RECV, which have 0
 * bytes).
 */
#include "coll/coll.h"
#include "coll/coll_util.h"
#include "core/internal.h"

/*
 * Dissemination: round k sends to r+2^k and receives from r-2^k; after
 * ceil(log2 p) rounds every rank has heard, transitively, from all.  The
 * send of round k+1 must carry everything heard so far, so it waits for
 * round k's receive and (through it, for earlier rounds) round k's send.
 */
loom_result_t loomi_gen_barrier_bruck(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    (void)a;
    const int p = s->nranks, r = s->rank;
    uint32_t d[2] = {LOOMI_NO_DEP, LOOMI_NO_DEP};
    uint32_t k = 0;
    for (int dist = 1; dist < p; dist *= 2, k++) {
        uint32_t snd = loomi_sched_send(s, (r + dist) % p, k, LOOMI_BUF_SEND, 0, 0, d, 2);
        d[0] = loomi_sched_recv(s, loomi_mod(r - dist, p), k, LOOMI_BUF_RECV, 0, 0, NULL, 0);
        d[1] = snd;
    }
    return LOOM_SUCCESS;
}

/*
 * Binomial tree rooted at rank 0: each rank reports to its parent once its
 * whole subtree has reported (tag 0), then the release travels down
 * (tag 1).  Receives from the children are chained in the order the
 * children finish (smallest subtree first) so that one step stands for
 * all of them; the release goes to the largest subtree first, which has
 * the longest way still to go (lg p hops down instead of lg p (lg p + 1)/2
 * when sends leave one after the other).
 */
loom_result_t loomi_gen_barrier_tree(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    (void)a;
    const int p = s->nranks, v = s->rank;
    if (p == 1) return LOOM_SUCCESS;
    const int lim = v ? (v & -v) : p; /* children are v+m for m < lim */
    uint32_t up = LOOMI_NO_DEP;
    for (int m = 1; m < lim && v + m < p; m *= 2)
        up = loomi_sched_recv(s, v + m, 0, LOOMI_BUF_RECV, 0, 0, &up, 1);
    uint32_t down = up;
    if (v) {
        int parent = v - (v & -v);
        loomi_sched_send(s, parent, 0, LOOMI_BUF_SEND, 0, 0, &up, 1);
        down = loomi_sched_recv(s, parent, 1, LOOMI_BUF_RECV, 0, 0, NULL, 0);
    }
    int top = 1;
    while (top * 2 < lim && v + top * 2 < p) top *= 2;
    for (int m = top; m >= 1; m /= 2)
        if (m < lim && v + m < p) loomi_sched_send(s, v + m, 1, LOOMI_BUF_SEND, 0, 0, &down, 1);
    return LOOM_SUCCESS;
}
