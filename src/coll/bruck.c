/*
 * bruck.c - Bruck allgather: ceil(log2 p) steps for any p, one message
 * each way per step, so the latency of recursive doubling without its
 * power-of-two fold.
 *
 * In a scratch array T, T[i] is the block of rank r+i.  T[0] is the own
 * block; at step k (d = 2^k) rank r sends T[0, n) to r-d and receives
 * T[d, d+n) from r+d, n = min(d, p-d).  A final local rotation puts
 * T[i] at RECV block (r+i) mod p.  (Placing T in RECV rotated would save
 * the copy but cut messages that wrap around the end of RECV in two,
 * doubling the message count in the latency-bound range Bruck is for.)
 */
#include "coll/build.h"
#include "coll/coll.h"
#include "core/internal.h"

loom_result_t loomi_gen_allgather_bruck(struct loomi_sched *s, const struct loomi_coll_args *a)
{
    const int p = s->nranks, r = s->rank, inplace = a->inplace;
    const size_t es = s->esize, count = a->count, bb = count * es;
    int own_buf;
    size_t own_off;
    if (loomi_allgather_begin(s, count, inplace, &own_buf, &own_off)) return LOOM_SUCCESS;
    /* T[0] is needed in scratch only when a later step sends it along
     * with received blocks (p > 2); then T starts at T[0], else at T[1]. */
    const size_t t0 = p > 2 ? 0 : 1;
#define T(i) (((size_t)(i) - t0) * bb)
    s->buf_bytes[LOOMI_BUF_SCRATCH] = ((size_t)p - t0) * bb;
    struct loomi_build b;
    loom_result_t rc = loomi_build_init(&b, s, 0, 0);
    if (rc != LOOM_SUCCESS) return rc;
    if (!t0) loomi_bcopy(&b, LOOMI_BUF_SCRATCH, T(0), own_buf, own_off, count);
    for (int k = 0; (1 << k) < p; k++) {
        int d = 1 << k, n = d < p - d ? d : p - d;
        if (k == 0) /* just the own block, wherever it is */
            loomi_bsend(&b, loomi_mod(r - d, p), (uint32_t)k, own_buf, own_off, count);
        else
            loomi_bsend(&b, loomi_mod(r - d, p), (uint32_t)k, LOOMI_BUF_SCRATCH, T(0),
                        (size_t)n * count);
        loomi_brecv(&b, loomi_mod(r + d, p), (uint32_t)k, LOOMI_BUF_SCRATCH, T(d),
                    (size_t)n * count);
    }
    /* Rotate: T[1, p-r) to blocks r+1.., T[p-r, p) to blocks 0..r-1. */
    loomi_bcopy(&b, LOOMI_BUF_RECV, (size_t)(r + 1) * bb, LOOMI_BUF_SCRATCH, T(1),
                (size_t)(p - r - 1) * count);
    loomi_bcopy(&b, LOOMI_BUF_RECV, 0, LOOMI_BUF_SCRATCH, T(p - r), (size_t)r * count);
#undef T
    return loomi_build_done(&b);
}
