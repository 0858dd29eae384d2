/*
 * small.c - small collectives among the ranks of one host, through slots
 * at the tail of their shared arenas: the generator and launcher of the
 * engine's slot operations, and the measuring of where they pay.
 *
 * For a few bytes the fixed costs of rounds of messages through the
 * FIFOs are most of the time.  A slot operation (LOOMI_STEP_SLOT,
 * src/sched/slot.c) is one synchronisation instead: each rank copies its
 * input into its own slot and publishes the call's word, waits until
 * every rank of the host has published it, and reads what it needs from
 * the slots, reduced in rank order where it reduces (the same bytes on
 * every rank).  The word carries the call's number and check
 * (comm/calls.h), so ranks that made different calls fail with
 * LOOM_ERR_MISMATCH before any slot is read; a peer that stays away is
 * probed and the engine's deadline holds; the caller's buffer is
 * written only once every input is there, so a failure leaves it
 * untouched.  Here: which calls take the slots, the one-step schedule
 * of such a call (the communicator's, rewritten for each call, so that
 * a call allocates nothing), and the engine runs it.  The engine finds
 * the slots through its own transport, at the offset comm.c gave it.
 *
 * Every rank takes this path for the same calls: blocking, without a
 * codec, with at most small_max bytes in a slot, on a communicator whose
 * ranks all share one host through shared memory, with no LOOM_ALGO for
 * the collective (comm.c and collectives.c decide it from settings that
 * are the same on every rank), so every rank runs the same slot
 * operations one at a time, as the slots need.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "comm/collectives.h"
#include "comm/comm.h"
#include "core/internal.h"

/* Each rank reads every slot: past this many bytes read in all, the
 * engine's algorithms, which read less, are faster. */
#define READ_BUDGET ((size_t)256 << 10)

size_t loomi_small_limit(size_t shm_small, size_t arena_bytes, int nranks, int nhosts)
{
    if (!shm_small || nhosts != 1 || nranks < 2) return 0;
    size_t lim = READ_BUDGET / (size_t)nranks;
    if (lim > shm_small) lim = shm_small;
    /* The slots take a small part of the arena, or none of it. */
    return arena_bytes >= 4 * loomi_slot_region_bytes(lim) ? lim : 0;
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

/* The communicator's slot schedule, rewritten for this call (number no,
 * check chk): one LOOMI_STEP_SLOT, without dependencies, so that only
 * its step and its buffers' extents change from call to call.  Built and
 * finished once; the engine runs it without taking it (*out). */
static loom_result_t slot_sched(struct loom_comm *c, int coll, size_t count,
                                loom_datatype_t dtype, loom_op_t op, uint64_t no, uint32_t chk,
                                const struct loomi_sched **out)
{
    struct loomi_sched *s = &c->small_sched;
    const size_t p = (size_t)c->nranks, es = loom_datatype_size(dtype);
    unsigned flags;
    switch (coll) {
    case LOOMI_COLL_ALLREDUCE: flags = LOOMI_SLOT_REDUCE; break;
    case LOOMI_COLL_REDUCE_SCATTER: flags = LOOMI_SLOT_REDUCE | LOOMI_SLOT_BLOCKS; break;
    case LOOMI_COLL_ALLGATHER: flags = LOOMI_SLOT_GATHER; break;
    case LOOMI_COLL_ALLTOALL: flags = LOOMI_SLOT_GATHER | LOOMI_SLOT_BLOCKS; break;
    default: flags = 0; count = 0; break; /* the barrier: nothing in the slots */
    }
    const size_t n = count * es; /* within small_max: loomi_small_fits */
    size_t bytes[LOOMI_NBUFS] = {(flags & LOOMI_SLOT_BLOCKS) ? n * p : n,
                                 (flags & LOOMI_SLOT_GATHER) ? n * p : flags ? n : 0, 0};
    if (s->nsteps) {
        s->dtype = dtype;
        s->op = op;
        s->esize = es;
        s->steps[0].count = count;
        s->steps[0].flags = flags;
    } else {
        loomi_sched_init(s, c->rank, c->nranks, dtype, op);
        loomi_sched_slot(s, LOOMI_BUF_RECV, LOOMI_BUF_SEND, count, flags);
    }
    memcpy(s->buf_bytes, bytes, sizeof bytes);
    s->coll1 = coll + 1;
    s->algo = LOOMI_ALGO_AUTO;
    if (!s->succ_start) {
        loom_result_t r = loomi_sched_finish(s);
        if (r != LOOM_SUCCESS) {
            loomi_sched_free(s);
            return r;
        }
    }
    s->call = no;
    s->chk = chk;
    *out = s;
    return LOOM_SUCCESS;
}

loom_result_t loomi_small_coll(struct loom_comm *c, int coll, const void *sendbuf,
                               void *recvbuf, size_t count, loom_datatype_t dtype,
                               loom_op_t op, const char *fn, uint64_t no, uint32_t chk)
{
    const int me = c->rank;
    loomi_comm_lock(c);
    /* After a rooted collective, the next calls look at the transport
     * first: there a rank may have completed its part without hearing
     * from a peer that made the call otherwise (two ranks that both took
     * themselves for the root), whose message only shows it (calls.h). */
    const int look = c->poll_slots > 0;
    if (look) c->poll_slots--;
    loom_result_t r = LOOM_SUCCESS;
    if (loomi_engine_poll(&c->eng, look) != LOOM_SUCCESS) {
        if (c->error == LOOM_ERR_MISMATCH) { /* which rank's call differs (calls.h) */
            loomi_calls_verdict(c, LOOMI_VERDICT_WAIT_MS);
            c->mismatch_told = 1;
        }
        r = loomi_fail(c->error, me, "%s: %s", fn, c->errmsg);
    }
    const struct loomi_sched *s = NULL;
    if (r == LOOM_SUCCESS) r = slot_sched(c, coll, count, dtype, op, no, chk, &s);
    /* Not in place for the engine: the input goes into the slot first,
     * and the result is written only at the end. */
    if (r == LOOM_SUCCESS &&
        (r = loomi_op_run_slot_sched(&c->eng, s, sendbuf, recvbuf)) != LOOM_SUCCESS) {
        char why[512];
        snprintf(why, sizeof why, "%s", loom_get_last_error());
        r = loomi_fail(r, me, "%s: %s", fn, why);
    }
    loomi_comm_unlock(c);
    return r;
}
