/*
 * alltoall.c - all-to-all: pairwise exchange (large blocks), Bruck's
 * log-p algorithm (small blocks), and pairwise alltoallv.
 */
#include <stdlib.h>

#include "coll/coll.h"
#include "coll/coll_util.h"
#include "core/internal.h"

#define SEND_B LOOMI_BUF_SEND
#define RECV_B LOOMI_BUF_RECV
#define SCR_B LOOMI_BUF_SCRATCH

/* Pairwise steps in flight at once.  All p-1 at once would have every
 * rank flood every peer at the same moment (incast, and as many
 * outstanding messages as ranks in the transport); a few keep the links
 * busy while one exchange waits on a slow peer. */
#define A2A_WINDOW 8

/* Checks the size and sets the buffer extents: p blocks in RECV, and in
 * SEND unless in place; out of place, copies the own block (which no
 * message carries) from SEND to RECV. */
static loom_result_t begin(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    const size_t count = a->count, bb = count * s->esize;
    if (count && count > SIZE_MAX / s->esize / (size_t)s->nranks)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, s->rank,
                          "alltoall: count %zu times %d ranks is too large", count, s->nranks);
    s->buf_bytes[SEND_B] = a->inplace ? 0 : (size_t)s->nranks * bb;
    s->buf_bytes[RECV_B] = (size_t)s->nranks * bb;
    if (count && !a->inplace) {
        const size_t own = (size_t)s->rank * bb;
        loomi_sched_copy(s, RECV_B, own, SEND_B, own, count, NULL, 0);
    }
    return LOOM_SUCCESS;
}

/* The steps of both pairwise alltoalls (see below): step k = 1..p-1
 * sends rank r+k its block from sbuf and receives rank r-k's into RECV,
 * once the send and receive of step k-W are done.  The blocks are n
 * elements at block q; or, with v (alltoallv), the counts and
 * displacements v gives, where a block of 0 elements takes no message. */
static loom_result_t pairwise_steps(struct loomi_sched *s, const char *what, int sbuf, size_t n,
                                    const struct loomi_coll_args *v)
{
    const int p = s->nranks, r = s->rank;
    const size_t es = s->esize;
    uint32_t *sd = malloc(2 * (size_t)p * sizeof *sd);
    if (!sd) return loomi_fail(LOOM_ERR_NO_MEMORY, r, "%s: out of memory", what);
    uint32_t *rd = sd + p;
    for (int k = 1; k < p; k++) {
        int to = (r + k) % p, from = loomi_mod(r - k, p);
        uint32_t d[2] = {LOOMI_NO_DEP, LOOMI_NO_DEP};
        if (k > A2A_WINDOW) {
            d[0] = sd[k - A2A_WINDOW];
            d[1] = rd[k - A2A_WINDOW];
        }
        const size_t sn = v ? v->counts[to] : n, rn = v ? v->rcounts[from] : n;
        const size_t so = v ? v->displs[to] : (size_t)to * n;
        const size_t ro = v ? v->rdispls[from] : (size_t)from * n;
        sd[k] = sn ? loomi_sched_send(s, to, 0, sbuf, so * es, sn, d, 2) : LOOMI_NO_DEP;
        rd[k] = rn ? loomi_sched_recv(s, from, 0, RECV_B, ro * es, rn, d, 2) : LOOMI_NO_DEP;
    }
    free(sd);
    return LOOM_SUCCESS;
}

/*
 * Step k = 1..p-1: send block r+k to rank r+k, receive block r-k from
 * rank r-k.  Both ends of a message are at the same step, and step k
 * waits only for steps before k-W, so the window cannot deadlock.  In
 * place, RECV holds the input: the engine copies it to SCRATCH before the
 * first step (scratch_has_input, which is also what it restores from on
 * failure), and the sends read it there.
 */
loom_result_t loomi_gen_alltoall_pairwise(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    loom_result_t rc = begin(s, a);
    if (rc != LOOM_SUCCESS || !a->count) return rc;
    const int p = s->nranks;
    const size_t n = a->count;
    if (a->inplace) {
        s->buf_bytes[SCR_B] = (size_t)p * n * s->esize;
        s->scratch_has_input = 1;
    }
    if (p == 1) return LOOM_SUCCESS;
    return pairwise_steps(s, "alltoall", a->inplace ? SCR_B : SEND_B, n, NULL);
}

/*
 * Bruck: position i of a rotated copy T holds the block for rank r+i.  In
 * round k (distance d = 2^k) every position with bit k set is packed,
 * sent to r+d, and replaced by what arrives from r-d; afterwards position
 * i holds the block from rank r-i.  A position's last round is that of
 * its highest bit, so the first run of each round, [d, 2d), is unpacked
 * straight to its place in RECV; T keeps the rest.  log2(p) messages of
 * about p/2 blocks each: good when blocks are small.
 *
 * SCRATCH: T (positions 1..p-1), then a pack area P and a receive area Q
 * of the largest round's size.  Each round's copies are chained (they run
 * one after the other anyway), which keeps every step at <= 3 deps.
 */
loom_result_t loomi_gen_alltoall_bruck(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    const int src = a->inplace ? RECV_B : SEND_B;
    loom_result_t rc = begin(s, a);
    if (rc != LOOM_SUCCESS || !a->count) return rc;
    const int p = s->nranks, r = s->rank;
    const size_t n = a->count, bb = n * s->esize;
    if (p == 1) return LOOM_SUCCESS;

    size_t nbmax = 0;
    for (int d = 1; d < p; d *= 2) {
        size_t nb = 0;
        for (int st = d; st < p; st += 2 * d) nb += (size_t)((st + d < p ? st + d : p) - st);
        if (nb > nbmax) nbmax = nb;
    }
    const size_t P = (size_t)(p - 1) * bb, Q = P + nbmax * bb;
    s->buf_bytes[SCR_B] = Q + nbmax * bb;
#define TPOS(i) ((size_t)((i)-1) * bb)

    /* Rotation: T[i] = src[r+i] for i = 1..p-1. */
    uint32_t start[2] = {LOOMI_NO_DEP, LOOMI_NO_DEP};
    if (r < p - 1)
        start[0] = loomi_sched_copy(s, SCR_B, TPOS(1), src, (size_t)(r + 1) * bb,
                                    (size_t)(p - 1 - r) * n, NULL, 0);
    if (r > 0) start[1] = loomi_sched_copy(s, SCR_B, TPOS(p - r), src, 0, (size_t)r * n, NULL, 0);

    uint32_t qfree = LOOMI_NO_DEP; /* the previous round's unpacking has read Q */
    uint32_t k = 0;
    for (int d = 1; d < p; d *= 2, k++) {
        uint32_t pk = LOOMI_NO_DEP;
        size_t pos = 0;
        for (int st = d; st < p; st += 2 * d) {
            int e = st + d < p ? st + d : p;
            uint32_t dd[3] = {pk, start[0], start[1]};
            pk = loomi_sched_copy(s, SCR_B, P + pos * bb, SCR_B, TPOS(st), (size_t)(e - st) * n,
                                  dd, 3);
            pos += (size_t)(e - st);
        }
        uint32_t snd = loomi_sched_send(s, (r + d) % p, k, SCR_B, P, pos * n, &pk, 1);
        uint32_t rcv = loomi_sched_recv(s, loomi_mod(r - d, p), k, SCR_B, Q, pos * n, &qfree, 1);
        /* Unpacking overwrites the packed positions: after all the packing. */
        uint32_t u = LOOMI_NO_DEP;
        pos = 0;
        for (int st = d; st < p; st += 2 * d) {
            int e = st + d < p ? st + d : p;
            if (st == d) {
                for (int i = st; i < e; i++) {
                    uint32_t dd[3] = {rcv, pk, u};
                    u = loomi_sched_copy(s, RECV_B, (size_t)loomi_mod(r - i, p) * bb, SCR_B,
                                         Q + (pos + (size_t)(i - st)) * bb, n, dd, 3);
                }
            } else {
                uint32_t dd[3] = {rcv, pk, u};
                u = loomi_sched_copy(s, SCR_B, TPOS(st), SCR_B, Q + pos * bb,
                                     (size_t)(e - st) * n, dd, 3);
            }
            pos += (size_t)(e - st);
        }
        /* The next round packs into P (read by this send) from T (written
         * by this unpacking). */
        start[0] = u;
        start[1] = snd;
        qfree = u;
    }
#undef TPOS
    return LOOM_SUCCESS;
}

/* Extent of the blocks a side uses: the end of the furthest non-empty
 * one, in bytes.  Fails on overflow. */
static loom_result_t vextent(const struct loomi_sched *s, const size_t *cnt, const size_t *dsp,
                             const char *what, size_t *out)
{
    size_t end;
    int i = loomi_vextent(cnt, dsp, s->nranks, SIZE_MAX / s->esize, &end);
    if (i >= 0)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, s->rank,
                          "alltoallv: %s block of rank %d (displacement %zu, count %zu) is "
                          "too large",
                          what, i, dsp[i], cnt[i]);
    *out = end * s->esize;
    return LOOM_SUCCESS;
}

/* As the pairwise alltoall, with per-peer counts and displacements; a
 * peer with nothing to send or receive takes no message. */
loom_result_t loomi_gen_alltoallv_pairwise(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    const int p = s->nranks, r = s->rank;
    const size_t es = s->esize;
    if (!a->counts || !a->displs || !a->rcounts || !a->rdispls)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, r,
                          "alltoallv: counts, displacements and receive counts and "
                          "displacements must all be given");
    if (a->inplace)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, r, "alltoallv: no in-place form");
    const size_t *sc = a->counts, *sdp = a->displs, *rcn = a->rcounts, *rdp = a->rdispls;
    if (sc[r] != rcn[r])
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, r,
                          "alltoallv: rank %d sends itself %zu elements but expects %zu", r,
                          sc[r], rcn[r]);
    loom_result_t rc = vextent(s, sc, sdp, "send", &s->buf_bytes[SEND_B]);
    if (rc == LOOM_SUCCESS) rc = vextent(s, rcn, rdp, "receive", &s->buf_bytes[RECV_B]);
    if (rc != LOOM_SUCCESS) return rc;
    if (sc[r]) loomi_sched_copy(s, RECV_B, rdp[r] * es, SEND_B, sdp[r] * es, sc[r], NULL, 0);
    if (p == 1) return LOOM_SUCCESS;
    return pairwise_steps(s, "alltoallv", SEND_B, 0, a);
}
