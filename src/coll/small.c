/*
 * small.c - small collectives among the ranks of one host, through slots
 * at the tail of their shared arenas, without the engine.
 *
 * For a few bytes the engine's fixed costs (an operation, a schedule,
 * log2(p) rounds of messages through the FIFOs) are most of the time.
 * Here each rank copies its input into its own slot, publishes the
 * operation's number, waits until every rank of the host has published
 * it, and then reads what it needs from the slots: all of them for
 * allreduce and allgather (reduced in rank order, so every rank computes
 * the same bytes), its own block of each for reduce-scatter and
 * all-to-all, nothing for barrier.  One synchronisation instead of
 * log2(p) rounds.
 *
 * Each rank's region: two 64-byte lines, each holding the number of the
 * last operation whose data is in one of two slots, then the two slots.
 * Inputs of up to 56 bytes go in the number's own line instead.
 * Operation s uses slot s % 2.  A rank writes slot s % 2 again only in
 * operation s + 2, which it starts after seeing every rank publish s + 1;
 * a rank publishes s + 1 only after it has finished reading for s.  So no
 * slot is overwritten while it is read, without any further message.
 *
 * Every rank takes this path for the same calls: blocking, without a
 * codec, with at most small_max bytes in a slot, on a communicator whose
 * ranks all share one host through shared memory, with no LOOM_ALGO for
 * the collective (comm.c and collectives.c decide it from settings that
 * are the same on every rank).  The caller's buffer is written only once
 * every input is there, so a failure leaves it untouched.
 */
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coll/coll.h"
#include "comm/comm.h"
#include "core/internal.h"
#include "reduce/reduce.h"

#define LINE 64
#define SEQ_LINES 2

static _Atomic uint64_t *seq_of(unsigned char *region, uint64_t s)
{
    return (_Atomic uint64_t *)(void *)(region + (s & 1) * LINE);
}

/* Where operation s's input of `bytes` lies: up to INLINE bytes in the
 * line of its number, so that a reader's one cache miss brings both;
 * otherwise in slot s % 2. */
#define INLINE (LINE - sizeof(uint64_t))

static unsigned char *slot_of(const struct loom_comm *c, unsigned char *region, uint64_t s,
                              size_t bytes)
{
    if (bytes <= INLINE) return region + (s & 1) * LINE + sizeof(uint64_t);
    return region + SEQ_LINES * LINE + (s & 1) * c->small_max;
}

size_t loomi_small_region_bytes(size_t small_max)
{
    size_t b = SEQ_LINES * LINE + 2 * small_max;
    return (b + 4095) / 4096 * 4096;
}

/* Find every rank's region (once per communicator). */
static loom_result_t map_regions(struct loom_comm *c)
{
    if (c->small_map) return LOOM_SUCCESS;
    unsigned char **m = calloc((size_t)c->nranks, sizeof *m);
    if (!m) return loomi_fail(LOOM_ERR_NO_MEMORY, c->rank, "small collective: out of memory");
    for (int q = 0; q < c->nranks; q++) {
        size_t len = 0;
        unsigned char *a = c->tops->shared_map ? c->tops->shared_map(c->tstate, q, &len) : NULL;
        if (!a || len < c->shared_bytes + c->small_region) {
            free(m);
            return loomi_fail(LOOM_ERR_INTERNAL, c->rank,
                              "small collective: rank %d's shared arena is not mapped here "
                              "(%zu bytes, %zu needed)",
                              q, a ? len : 0, c->shared_bytes + c->small_region);
        }
        m[q] = a + c->shared_bytes;
    }
    c->small_map = m;
    return LOOM_SUCCESS;
}

/* Each rank reads every slot: past this many bytes read in all, the
 * engine's algorithms, which read less, are faster. */
#define READ_BUDGET ((size_t)256 << 10)

size_t loomi_small_limit(size_t shm_small, size_t arena_bytes, int nranks, int nhosts)
{
    if (!shm_small || nhosts != 1 || nranks < 2) return 0;
    size_t lim = READ_BUDGET / (size_t)nranks;
    if (lim > shm_small) lim = shm_small;
    /* The slots take a small part of the arena, or none of it. */
    return arena_bytes >= 4 * loomi_small_region_bytes(lim) ? lim : 0;
}

/* Bytes this rank puts in its slot for the collective (n: count times
 * the element size). */
static size_t slot_bytes(int coll, size_t n, int nranks)
{
    switch (coll) {
    case LOOMI_COLL_ALLREDUCE:
    case LOOMI_COLL_ALLGATHER: return n;
    case LOOMI_COLL_REDUCE_SCATTER:
    case LOOMI_COLL_ALLTOALL: return n > SIZE_MAX / (size_t)nranks ? SIZE_MAX : n * (size_t)nranks;
    case LOOMI_COLL_BARRIER: return 0;
    /* Broadcast and reduce stay with the engine: there the root's
     * partners need not wait for each other, and back-to-back calls
     * overlap, which a synchronisation of every rank would prevent. */
    default: return SIZE_MAX;
    }
}

int loomi_small_fits(const struct loom_comm *c, int coll, size_t n)
{
    size_t lim = coll == LOOMI_COLL_ALLREDUCE ? c->small_allreduce : c->small_max;
    return lim && slot_bytes(coll, n, c->nranks) <= lim &&
           c->algo_forced[coll] == LOOMI_ALGO_AUTO;
}

/* Where the slots stop paying for allreduce.  Every rank reads every
 * slot, the engine's algorithms read less but pay per round; where the
 * two cross depends on the caches and on how many ranks share a core
 * (on 2 cores here: about 3K for 2 ranks, 16K for 4), which the cost
 * model does not capture well.  So it is measured: each size from
 * TUNE_FIRST up to small_max, both ways.  Every rank makes the same
 * calls; rank 0 decides and tells the others, so they all take the same
 * path. */
#define TUNE_FIRST 1024
#define TUNE_WARM 4
#define TUNE_BATCH 8
#define TUNE_BATCHES 6
loom_result_t loomi_small_tune(struct loom_comm *c)
{
    const size_t max = c->small_max;
    /* Off, all below the first size, or LOOM_PROBE=0 (measure nothing). */
    if (max < TUNE_FIRST || !c->set.probe) return LOOM_SUCCESS;
    const uint64_t start = loomi_now_ns();
    enum { NSIZES = 16 };
    uint64_t t[NSIZES][2];
    size_t sizes[NSIZES];
    int ns = 0;
    for (size_t s = TUNE_FIRST; s <= max && ns < NSIZES; s *= 2) sizes[ns++] = s;
    float *buf = calloc(max / sizeof(float) + 1, sizeof(float));
    if (!buf) return loomi_fail(LOOM_ERR_NO_MEMORY, c->rank, "small allreduce: out of memory");
    loom_result_t r = LOOM_SUCCESS;
    for (int k = 0; k < ns && r == LOOM_SUCCESS; k++) {
        const size_t count = sizes[k] / sizeof(float);
        t[k][0] = t[k][1] = UINT64_MAX;
        /* Batch -1 warms both ways up (and builds the engine's schedule);
         * then batches of back-to-back calls, as an application makes
         * them, each way first in turn; the best batch counts. */
        for (int b = -1; b < TUNE_BATCHES && r == LOOM_SUCCESS; b++)
            for (int w = 0; w < 2 && r == LOOM_SUCCESS; w++) {
                const int slots = (w + b) & 1;
                const int calls = b < 0 ? TUNE_WARM : TUNE_BATCH;
                c->small_allreduce = slots ? max : 0;
                uint64_t t0 = loomi_now_ns();
                for (int i = 0; i < calls && r == LOOM_SUCCESS; i++)
                    r = loom_allreduce(buf, buf, count, LOOM_FLOAT32, LOOM_SUM, c);
                uint64_t dt = (loomi_now_ns() - t0) / TUNE_BATCH;
                if (b >= 0 && dt < t[k][slots]) t[k][slots] = dt;
            }
    }
    free(buf);
    /* Below TUNE_FIRST the slots' one synchronisation always wins. */
    uint64_t lim = max;
    for (int k = 0; k < ns; k++)
        if (t[k][1] > t[k][0]) {
            lim = k ? sizes[k - 1] : TUNE_FIRST / 2;
            break;
        }
    if (r == LOOM_SUCCESS) r = loom_broadcast(&lim, &lim, sizeof lim, LOOM_UINT8, 0, c);
    if (r != LOOM_SUCCESS) {
        c->small_allreduce = max;
        return loomi_fail(r, c->rank, "measuring small allreduce: %s", loom_get_last_error());
    }
    if (lim > max)
        return loomi_fail(LOOM_ERR_MISMATCH, c->rank,
                          "small allreduce: rank 0 chose slots up to %llu bytes, past the %zu "
                          "they hold", (unsigned long long)lim, max);
    c->small_allreduce = (size_t)lim;
    if (c->rank == 0) {
        char b[512];
        int u = 0;
        for (int k = 0; k < ns && u < (int)sizeof b - 48; k++)
            u += snprintf(b + u, sizeof b - (size_t)u, " %zu:%.1f/%.1f", sizes[k],
                          (double)t[k][1] * 1e-3, (double)t[k][0] * 1e-3);
        LOOMI_INFO(c->rank,
                   "small allreduce: slots up to %zu bytes (bytes:slots/engine us%s; %.1f ms)",
                   c->small_allreduce, b, (double)(loomi_now_ns() - start) * 1e-6);
    }
    return LOOM_SUCCESS;
}

/* Wait until every rank has published operation s; fails when the
 * communicator breaks or nothing arrives for LOOM_TIMEOUT. */
static loom_result_t wait_all(struct loom_comm *c, uint64_t s, const char *fn)
{
    const int n = c->nranks;
    int next = 0;          /* ranks below `next` have published s */
    unsigned spins = 0;
    uint64_t start = 0, last = 0; /* ns: the wait began; something last arrived */
    while (next < n) {
        uint64_t v = atomic_load_explicit(seq_of(c->small_map[next], s), memory_order_acquire);
        if (v == s) {
            next++;
            last = 0;
            continue;
        }
        /* Only the previous use of the slot (or nothing yet) may be there:
         * anything else is a peer out of step or memory overwritten. */
        if (v != (s >= 2 ? s - 2 : 0)) {
            loomi_comm_fail(c, LOOM_ERR_INTERNAL, next,
                            "small collective: rank %d published operation %llu in the slot "
                            "of operation %llu (ranks out of step, or shared memory "
                            "overwritten)",
                            next, (unsigned long long)v, (unsigned long long)s);
            loomi_engine_fail_all(c);
            break;
        }
        /* Give the core away between looks when ranks share cores (the
         * rank we wait for may need this one). */
        if (c->oversubscribed) sched_yield();
        if (++spins % 32) continue;
        if (loomi_engine_poll(c) != LOOM_SUCCESS) break;
        uint64_t now = loomi_now_ns();
        if (!start) start = now;
        if (!last) last = now;
        if (now - last >= (uint64_t)c->set.timeout_ms * 1000000u) {
            loomi_comm_fail(c, LOOM_ERR_TIMEOUT, next,
                            "no progress for %d ms (LOOM_TIMEOUT) in a small collective "
                            "through the shared arenas' slots, waiting on rank %d",
                            c->set.timeout_ms, next);
            loomi_engine_fail_all(c);
            break;
        }
        /* A long wait (a rank still computing) need not burn a core: past
         * the spin time, sleep a little between looks. */
        if (now - start >= (uint64_t)c->set.spin_us * 1000u) {
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
        }
    }
    if (next == n) return LOOM_SUCCESS;
    return loomi_fail(c->error != LOOM_SUCCESS ? c->error : LOOM_ERR_INTERNAL, c->rank, "%s: %s",
                      fn, c->errmsg);
}

/* Reduce block `off` of every slot of operation s into dst, in rank order. */
static void reduce_slots(struct loom_comm *c, uint64_t s, size_t in, size_t off, void *dst,
                         size_t count, loom_datatype_t dtype, loom_op_t op)
{
    size_t n = count * loom_datatype_size(dtype);
    memcpy(dst, slot_of(c, c->small_map[0], s, in) + off, n);
    for (int q = 1; q < c->nranks; q++)
        loomi_reduce_inplace(dst, slot_of(c, c->small_map[q], s, in) + off, count, dtype, op);
    if (op == LOOM_AVG) loomi_reduce_finish_avg(dst, count, dtype, c->nranks);
}

loom_result_t loomi_small_coll(struct loom_comm *c, int coll, const void *sendbuf,
                               void *recvbuf, size_t count, loom_datatype_t dtype,
                               loom_op_t op, const char *fn)
{
    const size_t n = count * loom_datatype_size(dtype);
    const int me = c->rank, p = c->nranks;
    loomi_comm_lock(c);
    loom_result_t r = map_regions(c);
    if (r == LOOM_SUCCESS && loomi_engine_poll(c) != LOOM_SUCCESS)
        r = loomi_fail(c->error, me, "%s: %s", fn, c->errmsg);
    if (r != LOOM_SUCCESS) {
        loomi_comm_unlock(c);
        return r;
    }
    const uint64_t s = ++c->small_seq;
    unsigned char *mine = c->small_map[me];
    /* In place, the input is in this slot before anything is written. */
    const size_t in = slot_bytes(coll, n, p);
    if (in) memcpy(slot_of(c, mine, s, in), sendbuf, in);
    atomic_store_explicit(seq_of(mine, s), s, memory_order_release);
    r = wait_all(c, s, fn);
    if (r == LOOM_SUCCESS && n) {
        unsigned char *out = recvbuf;
        switch (coll) {
        case LOOMI_COLL_ALLREDUCE: reduce_slots(c, s, in, 0, out, count, dtype, op); break;
        case LOOMI_COLL_REDUCE_SCATTER:
            reduce_slots(c, s, in, (size_t)me * n, out, count, dtype, op);
            break;
        case LOOMI_COLL_ALLGATHER:
            for (int q = 0; q < p; q++)
                memcpy(out + (size_t)q * n, slot_of(c, c->small_map[q], s, in), n);
            break;
        case LOOMI_COLL_ALLTOALL:
            for (int q = 0; q < p; q++)
                memcpy(out + (size_t)q * n, slot_of(c, c->small_map[q], s, in) + (size_t)me * n,
                       n);
            break;
        default: break;
        }
    }
    loomi_comm_unlock(c);
    return r;
}
