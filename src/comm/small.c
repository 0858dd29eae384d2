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
 * Each rank's region: two 64-byte lines, each holding a word that names
 * the last operation whose data is in one of two slots, then the two
 * slots.  Inputs of up to 56 bytes go in the word's own line instead.
 * Small operation s uses slot s % 2.  A rank writes slot s % 2 again only
 * in operation s + 2, which it starts after seeing every rank publish
 * s + 1; a rank publishes s + 1 only after it has finished reading for s.
 * So no slot is overwritten while it is read, without any further
 * message.
 *
 * The word is the collective call's number on the communicator (its low
 * 32 bits) and the call's check above them (comm/calls.h), so the load
 * that tells a rank its peer's input is there also tells it that the
 * peer made the same call: the same number with another check, or a
 * later number (the peer made this call some other way and went on),
 * fails every rank with LOOM_ERR_MISMATCH before any slot is read.  A
 * peer that stays away while it is in some other call is asked which
 * (a probe, after LOOMI_CALL_STALL_MS).
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
#include "comm/collectives.h"
#include "comm/comm.h"
#include "core/internal.h"
#include "reduce/reduce.h"

#define LINE 64
#define SEQ_LINES 2

/* The word of small operation s in a rank's region. */
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
        unsigned char *a = c->eng.tops->shared_map ? c->eng.tops->shared_map(c->eng.tstate, q, &len) : NULL;
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

int loomi_small_fits(const struct loom_comm *c, int coll, size_t n, loom_datatype_t dtype,
                     loom_op_t op)
{
    if (coll < 0 || coll >= LOOMI_NUM_COLLS) return 0;
    size_t lim = coll < LOOMI_SMALL_TUNED ? c->small_lim[coll] : c->small_max;
    const int cls = coll == LOOMI_COLL_ALLREDUCE ? loomi_red_class(c, dtype, op) : 0;
    if (cls) lim = c->small_lim_red[cls];
    return c->small_max && lim && slot_bytes(coll, n, c->nranks) <= lim &&
           c->algo_forced[coll] == LOOMI_ALGO_AUTO;
}

/* Where the slots stop paying, per collective.  Every rank reads every
 * slot, the engine's algorithms read less but pay per round; where the
 * two cross depends on the caches, on how many ranks share a core and
 * on the collective, which the cost model does not capture well (on 2
 * cores the allreduce's crossing came at a few KiB for 2 ranks and
 * higher for 4, and the allgather's slots were slower than the engine
 * from 8K a rank: perf/NOTES.md, "small.c, the slots' limit").  So it
 * is measured: each size of slot from TUNE_FIRST up to small_max, both
 * ways.  Every rank makes the same calls; rank 0 decides and tells the
 * others, so they all take the same path. */
#define TUNE_FIRST 1024
#define TUNE_WARM 4
#define TUNE_BATCH 8
#define TUNE_BATCHES 6
/* Past this, rank 0 ends the measuring: what is left keeps the slots up
 * to small_max, as it would unmeasured.  Ranks taking turns on few cores
 * make every call slow, and win with the slots anyway (16 ranks on 2
 * cores: slots faster at every size, and measuring all four
 * collectives took well past this budget). */
#define TUNE_BUDGET_NS 50000000u

/* One call of the collective with `bytes` of slot: floats and sums,
 * but the allreduce in dt and op. */
static loom_result_t tune_call(struct loom_comm *c, int coll, loom_datatype_t dt, loom_op_t op,
                               float *a, float *b, size_t bytes)
{
    const size_t count = bytes / sizeof(float);
    const size_t per = count / (size_t)c->nranks; /* a block: reduce-scatter, alltoall */
    switch (coll) {
    case LOOMI_COLL_ALLREDUCE:
        return loomi_call_allreduce("loom_allreduce", a, a, bytes / loom_datatype_size(dt), dt, op,
                                    c->handle, NULL, NULL);
    case LOOMI_COLL_ALLGATHER:
        return loomi_call_allgather("loom_allgather", a, b, count, LOOM_FLOAT32, c->handle, NULL,
                                    NULL);
    case LOOMI_COLL_REDUCE_SCATTER:
        return loomi_call_reduce_scatter("loom_reduce_scatter", a, b, per, LOOM_FLOAT32, LOOM_SUM,
                                         c->handle, NULL, NULL);
    default: return loomi_call_alltoall("loom_alltoall", a, b, per, LOOM_FLOAT32, c->handle, NULL);
    }
}

/* One sweep: collective k (in dt and op: a class of the allreduce's
 * when *lim is its small_lim_red) at each of sizes[from..ns-1], the slots against
 * the engine, until the slots lose (where the engine starts to win, it
 * keeps winning) or, past the budget, rank 0 calls it off.  Sets *lim,
 * the times in t and *done (sizes measured); *cut = 1 when it ran out of
 * time. */
static loom_result_t sweep(struct loom_comm *c, int k, loom_datatype_t dt, loom_op_t op,
                           size_t *lim, const size_t *sizes, int from, int ns, uint64_t start,
                           float *a, float *b, uint64_t (*t)[2], int *done, int *cut)
{
    const size_t max = c->small_max;
    size_t found = max;
    loom_result_t r = LOOM_SUCCESS;
    *done = from;
    for (int z = from; z < ns && r == LOOM_SUCCESS; z++) {
        uint64_t *tz = t[z];
        tz[0] = tz[1] = UINT64_MAX;
        /* Batch -1 warms both ways up (and builds the engine's schedule);
         * then batches of back-to-back calls, as an application makes
         * them, each way first in turn; the best batch counts. */
        for (int bt = -1; bt < TUNE_BATCHES && r == LOOM_SUCCESS; bt++)
            for (int w = 0; w < 2 && r == LOOM_SUCCESS; w++) {
                const int slots = (w + bt) & 1;
                const int calls = bt < 0 ? TUNE_WARM : TUNE_BATCH;
                *lim = slots ? max : 0;
                uint64_t t0 = loomi_now_ns();
                for (int i = 0; i < calls && r == LOOM_SUCCESS; i++)
                    r = tune_call(c, k, dt, op, a, b, sizes[z]);
                uint64_t dt_ns = (loomi_now_ns() - t0) / TUNE_BATCH;
                if (bt >= 0 && dt_ns < tz[slots]) tz[slots] = dt_ns;
            }
        /* Rank 0 decides from its figures whether the slots lost at this
         * size (1), and tells the others, or whether the budget is spent
         * (2). */
        uint8_t stop = 0;
        if (tz[1] > tz[0]) stop = 1;
        else if (z + 1 < ns && loomi_now_ns() - start > TUNE_BUDGET_NS) stop = 2;
        if (r == LOOM_SUCCESS)
            r = loomi_call_broadcast("loom_broadcast", &stop, &stop, 1, LOOM_UINT8, 0, c->handle,
                                     NULL);
        if (r != LOOM_SUCCESS) break;
        if (stop > 2) {
            r = loomi_fail(LOOM_ERR_MISMATCH, c->rank,
                           "small %s: rank 0 sent %u for whether to stop measuring",
                           loomi_coll_name(k), stop);
            break;
        }
        *done = z + 1;
        if (stop == 2) {
            *cut = 1;
            break;
        }
        if (stop) {
            /* Below TUNE_FIRST the slots' one synchronisation always
             * wins; below the first size of a sweep that starts higher,
             * the slots are taken to win. */
            found = z ? sizes[z - 1] : TUNE_FIRST / 2;
            break;
        }
    }
    *lim = found;
    return r;
}

/* The sizes and times of a sweep, for the log. */
static void log_times(char *m, size_t len, const size_t *sizes, int from, int done,
                      uint64_t (*t)[2])
{
    int u = 0;
    m[0] = 0;
    for (int z = from; z < done && u < (int)len - 48; z++)
        u += snprintf(m + u, len - (size_t)u, " %zu:%.1f/%.1f", sizes[z], (double)t[z][1] * 1e-3,
                      (double)t[z][0] * 1e-3);
}

loom_result_t loomi_small_tune(struct loom_comm *c)
{
    const size_t max = c->small_max;
    /* Off, all below the first size, or LOOM_PROBE=0 (measure nothing). */
    if (max < TUNE_FIRST || !c->set.probe) return LOOM_SUCCESS;
    const uint64_t start = loomi_now_ns();
    enum { NSIZES = 16 };
    uint64_t t[LOOMI_SMALL_TUNED][NSIZES][2], ts[LOOMI_RED_CLASSES][NSIZES][2];
    int done[LOOMI_SMALL_TUNED] = {0}; /* sizes measured */
    int cut = LOOMI_SMALL_TUNED;       /* the collective whose sweep ran out of time */
    size_t sizes[NSIZES];
    int ns = 0;
    for (size_t s = TUNE_FIRST; s <= max && ns < NSIZES; s *= 2) sizes[ns++] = s;
    loom_result_t r = LOOM_SUCCESS;
    int sfrom[LOOMI_RED_CLASSES] = {0}, sdone[LOOMI_RED_CLASSES] = {0};
    int swept = 0; /* the classes swept */
    /* The allgather's output holds a slot from every rank. */
    float *a = calloc(max / sizeof(float) + 1, sizeof(float));
    float *b = calloc((max / sizeof(float) + 1) * (size_t)c->nranks, sizeof(float));
    if (!a || !b) {
        free(a);
        free(b);
        return loomi_fail(LOOM_ERR_NO_MEMORY, c->rank, "small collectives: out of memory");
    }
    for (int k = 0; k < LOOMI_SMALL_TUNED && r == LOOM_SUCCESS; k++) {
        int out = 0;
        r = sweep(c, k, LOOM_FLOAT32, LOOM_SUM, &c->small_lim[k], sizes, 0, ns, start, a, b,
                  t[k], &done[k], &out);
        if (out) {
            cut = k;
            for (int q = k + 1; q < LOOMI_SMALL_TUNED; q++) {
                c->small_lim[q] = max;
                c->small_unmeasured |= 1u << q;
            }
            break;
        }
    }
    /* The allreduce's slower classes last, so that where time is short
     * the four collectives' own limits come first: whether any is left,
     * rank 0's word.  Each class from an eighth of the limit of the class
     * before it (below, one synchronisation against rounds of messages
     * wins whatever the reduction) up to that limit at most; a class not
     * reached keeps that limit (class 0's: the sums'). */
    uint8_t go = 0;
    if (r == LOOM_SUCCESS) {
        go = cut == LOOMI_SMALL_TUNED && loomi_now_ns() - start < TUNE_BUDGET_NS;
        r = loomi_call_broadcast("loom_broadcast", &go, &go, 1, LOOM_UINT8, 0, c->handle, NULL);
        if (r == LOOM_SUCCESS && go > 1)
            r = loomi_fail(LOOM_ERR_MISMATCH, c->rank,
                           "small allreduce: rank 0 sent %u for whether to time the slower "
                           "reductions", go);
    }
    size_t above = c->small_lim[LOOMI_COLL_ALLREDUCE];
    int sout = 0;
    for (int q = 1; q < LOOMI_RED_CLASSES && r == LOOM_SUCCESS; q++) {
        c->small_lim_red[q] = above;
        if (!go || sout || c->red.rep[q][0] == 0xff) continue;
        int top = 0;
        while (top < ns && sizes[top] <= above) top++;
        sfrom[q] = 0;
        while (sfrom[q] + 1 < top && sizes[sfrom[q]] < above / 8) sfrom[q]++;
        if (top > 0) {
            r = sweep(c, LOOMI_COLL_ALLREDUCE, (loom_datatype_t)c->red.rep[q][0],
                      (loom_op_t)c->red.rep[q][1], &c->small_lim_red[q], sizes, sfrom[q], top, start,
                      a, b, ts[q], &sdone[q], &sout);
            /* Out of time: as the class before. */
            if (c->small_lim_red[q] > above || sout) c->small_lim_red[q] = above;
            swept |= 1 << q;
        }
        above = c->small_lim_red[q];
    }
    free(a);
    free(b);
    if (r != LOOM_SUCCESS) {
        for (int k = 0; k < LOOMI_SMALL_TUNED; k++) c->small_lim[k] = max;
        for (int k = 0; k < LOOMI_RED_CLASSES; k++) c->small_lim_red[k] = max;
        return loomi_fail(r, c->rank, "measuring small collectives: %s", loom_get_last_error());
    }
    if (c->rank == 0) {
        const double ms = (double)(loomi_now_ns() - start) * 1e-6;
        char m[512];
        for (int k = 0; k < LOOMI_SMALL_TUNED; k++) {
            if (c->small_unmeasured >> k & 1) {
                LOOMI_INFO(c->rank, "small %s: slots up to %zu bytes (unmeasured: out of time)",
                           loomi_coll_name(k), c->small_lim[k]);
                continue;
            }
            log_times(m, sizeof m, sizes, 0, done[k], t[k]);
            LOOMI_INFO(c->rank,
                       "small %s: slots up to %zu bytes (bytes:slots/engine us%s; %.1f ms "
                       "measuring all%s)",
                       loomi_coll_name(k), c->small_lim[k], m, ms,
                       k == cut ? ", out of time: larger sizes unmeasured" : "");
        }
        char names[512];
        for (int q = 1; q < LOOMI_RED_CLASSES; q++) {
            loomi_red_class_describe(c, q, names, sizeof names);
            if (c->red.rep[q][0] == 0xff) continue;
            log_times(m, sizeof m, sizes, sfrom[q], swept >> q & 1 ? sdone[q] : sfrom[q], ts[q]);
            LOOMI_INFO(c->rank,
                       "small allreduce, reductions of class %d (%s): %s %s %s: slots up to %zu "
                       "bytes (bytes:slots/engine us%s)",
                       q, names,
                       swept >> q & 1 ? "swept with" : "out of time, as the class before; slowest",
                       loomi_dtype_name((loom_datatype_t)c->red.rep[q][0]),
                       loomi_op_name((loom_op_t)c->red.rep[q][1]), c->small_lim_red[q], m);
        }
    }
    return LOOM_SUCCESS;
}

/* What a rank publishes for a call: its number's low 32 bits, and its
 * check above them (calls.h), so that one load tells a peer both that
 * the data is there and that it is for the same call. */
static uint64_t slot_word(uint64_t no, uint32_t chk) { return (uint64_t)chk << 32 | (uint32_t)no; }

/* Rank q published `v` in the slot where this rank waits for call `no`
 * with check chk: the same call with other arguments, or a later call,
 * which q made without these slots (it made call `no` some other way).
 * Returns 1 for such a mismatch, 0 while q has not got there yet. */
static int slot_mismatch(struct loom_comm *c, int q, uint64_t v, uint64_t no, uint32_t chk,
                         const char *fn)
{
    const uint32_t ahead = (uint32_t)v - (uint32_t)no;
    if (ahead >= (1u << 24)) return 0; /* an earlier call's word */
    struct loomi_call mine;
    char what[128] = "";
    if (loomi_call_get(c, no, &mine)) loomi_call_str(&mine, what, sizeof what);
    if (!ahead)
        loomi_comm_fail(c, LOOM_ERR_MISMATCH, q,
                        "rank %d made collective call %llu with other arguments than this "
                        "rank's %s (call check %08x there, %08x here)",
                        q, (unsigned long long)no, what[0] ? what : fn, (unsigned)(v >> 32),
                        (unsigned)chk);
    else
        loomi_comm_fail(c, LOOM_ERR_MISMATCH, q,
                        "rank %d went on to collective call %llu without making call %llu "
                        "through the shared-memory slots as this rank's %s does",
                        q, (unsigned long long)(no + ahead), (unsigned long long)no,
                        what[0] ? what : fn);
    return 1;
}

/* Wait until every rank has published call `no` (small operation s);
 * fails when a rank published another call there, when the communicator
 * breaks, or when nothing arrives for LOOM_TIMEOUT. */
static loom_result_t wait_all(struct loom_comm *c, uint64_t s, uint64_t no, uint32_t chk,
                              const char *fn)
{
    const int n = c->nranks;
    const uint64_t want = slot_word(no, chk);
    int next = 0;          /* ranks below `next` have published the call */
    int probed = -1;       /* the rank asked which call it makes (calls.h) */
    unsigned spins = 0;
    uint64_t start = 0, last = 0; /* ns: the wait began; something last arrived */
    while (next < n) {
        uint64_t v = atomic_load_explicit(seq_of(c->small_map[next], s), memory_order_acquire);
        if (v == want) {
            next++;
            last = 0;
            continue;
        }
        if (slot_mismatch(c, next, v, no, chk, fn)) {
            loomi_engine_fail_all(&c->eng);
            break;
        }
        /* Give the core away between looks when ranks share cores (the
         * rank we wait for may need this one). */
        if (c->eng.oversubscribed) sched_yield();
        if (++spins % 32) continue;
        uint64_t now = loomi_now_ns();
        if (!start) start = now;
        if (!last) last = now;
        /* Past a millisecond, the transport too (see loomi_small_coll). */
        if (loomi_engine_poll(&c->eng, now - last >= 1000000u) != LOOM_SUCCESS) break;
        /* A rank stalled in another call may be asking this one. */
        if (c->ctrl) {
            loomi_calls_poll(c);
            if (c->error != LOOM_SUCCESS) {
                loomi_engine_fail_all(&c->eng);
                break;
            }
        }
        /* A rank that is in another call may never come here: ask it. */
        if (probed != next && now - last >= (uint64_t)LOOMI_CALL_STALL_MS * 1000000u) {
            probed = next;
            loomi_calls_probe(c, no, &next, 1);
        }
        if (now - last >= (uint64_t)c->set.timeout_ms * 1000000u) {
            loomi_comm_fail(c, LOOM_ERR_TIMEOUT, next,
                            "no progress for %d ms (LOOM_TIMEOUT) in a small collective "
                            "through the shared arenas' slots, waiting on rank %d",
                            c->set.timeout_ms, next);
            loomi_engine_fail_all(&c->eng);
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
    if (c->error == LOOM_ERR_MISMATCH) {
        /* Which rank's call differs: the others say (calls.h). */
        loomi_calls_verdict(c, LOOMI_VERDICT_WAIT_MS);
        c->mismatch_told = 1;
    }
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
                               loom_op_t op, const char *fn, uint64_t no, uint32_t chk)
{
    const size_t n = count * loom_datatype_size(dtype);
    const int me = c->rank, p = c->nranks;
    loomi_comm_lock(c);
    loom_result_t r = map_regions(c);
    /* After a rooted collective, the next calls look at the transport
     * first: there a rank may have completed its part without hearing
     * from a peer that made the call otherwise (two ranks that both took
     * themselves for the root), whose message only shows it (calls.h). */
    const int look = c->poll_slots > 0;
    if (look) c->poll_slots--;
    if (r == LOOM_SUCCESS && loomi_engine_poll(&c->eng, look) != LOOM_SUCCESS) {
        if (c->error == LOOM_ERR_MISMATCH) { /* which rank's call differs (calls.h) */
            loomi_calls_verdict(c, LOOMI_VERDICT_WAIT_MS);
            c->mismatch_told = 1;
        }
        r = loomi_fail(c->error, me, "%s: %s", fn, c->errmsg);
    }
    if (r != LOOM_SUCCESS) {
        loomi_comm_unlock(c);
        return r;
    }
    const uint64_t s = ++c->small_seq;
    unsigned char *mine = c->small_map[me];
    /* In place, the input is in this slot before anything is written. */
    const size_t in = slot_bytes(coll, n, p);
    if (in) memcpy(slot_of(c, mine, s, in), sendbuf, in);
    atomic_store_explicit(seq_of(mine, s), slot_word(no, chk), memory_order_release);
    r = wait_all(c, s, no, chk, fn);
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
