/*
 * tune.c - the allreduce's table on one host, checked by timing at init
 * where the cost model is weakest.
 *
 * The model charges copies and reductions at the rates measured on
 * vectors larger than the caches (what the big collectives meet), and
 * shared-memory messages at one rate, whether they go through the FIFO
 * cells or in one kernel copy.  Vectors that the caches hold break both:
 * 2 ranks here, recursive doubling's one 128K message is a single copy
 * and its reduction runs in cache, 12.2 us against the 19.6 of the ring
 * that the table chose (whose 64K halves go through the cells), and 22.8
 * against 38.3 at 256K.  Modelling that moves every crossover on the
 * host, which the model's other terms were calibrated against.  So the
 * choice is measured instead, in that range only: each power of two from
 * above the slots' limit up to TUNE_TOP, the table's algorithm against
 * every other that the model puts within TUNE_SPAN of it, in turns.
 * Rank 0 decides and tells the others (every rank then runs the same
 * algorithm): another one takes the sizes from there to the next power
 * of two where it was faster by TUNE_MARGIN.
 */
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "comm/comm.h"
#include "core/internal.h"
#include "topo/select.h"

#define TUNE_LOW ((size_t)8 << 10)
#define TUNE_TOP ((size_t)512 << 10)
#define TUNE_SPAN 2.0
#define TUNE_MARGIN 1.15
#define TUNE_BATCHES 3
#define TUNE_BATCH 3

/* Not the broadcast: its calls overlap back to back, and short batches
 * of them timed otherwise than the perf binary's long ones (4 ranks,
 * 64K: scatter-allgather 9.1-9.4 us against the tree's 10.2-10.3 at
 * init, 19.7-21.4 against 16.3-18.2 in broadcast_perf). */
const int loomi_timed[LOOMI_TIMED] = {LOOMI_COLL_ALLREDUCE};

/* One call of `bytes` of floats. */
static loom_result_t timed_call(struct loom_comm *c, int coll, float *a, float *b, size_t bytes)
{
    (void)coll; /* the allreduce, so far */
    return loom_allreduce(a, b, bytes / sizeof(float), LOOM_FLOAT32, LOOM_SUM, c);
}

/* Time collective loomi_timed[k] from lo up, until TUNE_TOP or until
 * rank 0 says the budget (counted from `start`) is spent (*out = 1). */
static loom_result_t time_coll(struct loom_comm *c, int k, size_t lo, uint64_t start,
                               uint64_t budget_ns, float *a, float *b, int *out)
{
    const int coll = loomi_timed[k];
    struct loomi_job_shape j;
    loomi_comm_shape(c, &j);
    struct loomi_ranges tuned = c->sel->coll[coll];
    const int first = c->ntuned;
    char log[640] = "";
    int used = 0;
    loom_result_t r = LOOM_SUCCESS;
    const uint64_t t_coll = loomi_now_ns();
    uint64_t last = t_coll;
    size_t s;
    for (s = lo; s <= TUNE_TOP && r == LOOM_SUCCESS; s *= 2) {
        /* The candidates, the table's first: the same list on every rank,
         * which all hold rank 0's links. */
        int cand[LOOMI_NUM_ALGOS], nc = 0;
        cand[nc++] = loomi_select_lookup(c->sel, coll, s);
        const double base = loomi_select_cost(coll, cand[0], s, &j, c->links);
        for (int q = 1; q < LOOMI_NUM_ALGOS; q++) {
            if (q == cand[0] || !loomi_algo_gen(coll, q)) continue;
            double t = loomi_select_cost(coll, q, s, &j, c->links);
            if (t >= 0 && (base < 0 || t <= TUNE_SPAN * base)) cand[nc++] = q;
        }
        if (nc < 2) continue;
        uint64_t best[LOOMI_NUM_ALGOS];
        for (int i = 0; i < nc; i++) best[i] = UINT64_MAX;
        /* Batch -1 warms each up (and builds its schedule); then batches
         * of back-to-back calls, the candidates in turns that rotate;
         * the best batch counts. */
        for (int bt = -1; bt < TUNE_BATCHES && r == LOOM_SUCCESS; bt++)
            for (int w = 0; w < nc && r == LOOM_SUCCESS; w++) {
                const int i = (w + (bt < 0 ? 0 : bt)) % nc;
                c->algo_forced[coll] = cand[i];
                uint64_t t0 = loomi_now_ns();
                for (int q = 0; q < (bt < 0 ? 1 : TUNE_BATCH) && r == LOOM_SUCCESS; q++)
                    r = timed_call(c, coll, a, b, s);
                uint64_t dt = (loomi_now_ns() - t0) / TUNE_BATCH;
                if (bt >= 0 && dt < best[i]) best[i] = dt;
            }
        c->algo_forced[coll] = LOOMI_ALGO_AUTO;
        if (r != LOOM_SUCCESS) break;
        /* Rank 0's verdict: the index of the candidate to run, and
         * whether the budget is spent. */
        uint8_t v[2] = {0, 0};
        int win = 0;
        for (int i = 1; i < nc; i++)
            if (best[i] < best[win]) win = i;
        if ((double)best[0] > TUNE_MARGIN * (double)best[win]) v[0] = (uint8_t)win;
        /* Stop where the next size, twice as long as this one, would
         * end past the budget. */
        const uint64_t now = loomi_now_ns();
        v[1] = now - start + 2 * (now - last) > budget_ns;
        last = now;
        r = loom_broadcast(v, v, 2, LOOM_UINT8, 0, c);
        if (r != LOOM_SUCCESS) break;
        if (v[0] >= nc || v[1] > 1) {
            r = loomi_fail(LOOM_ERR_MISMATCH, c->rank,
                           "%s: rank 0 sent candidate %u of %d, stop %u", loomi_coll_name(coll),
                           v[0], nc, v[1]);
            break;
        }
        if (v[0] && c->ntuned < LOOMI_TUNED &&
            loomi_ranges_set(&tuned, s, 2 * s, cand[v[0]]) == 0) {
            c->tuned[c->ntuned].coll = coll;
            c->tuned[c->ntuned].from = s;
            c->tuned[c->ntuned].was = cand[0];
            c->tuned[c->ntuned++].now = cand[v[0]];
        }
        for (int i = 0; i < nc && used < (int)sizeof log - 64; i++) {
            if (!i) used += snprintf(log + used, sizeof log - (size_t)used, " %zu", s);
            used += snprintf(log + used, sizeof log - (size_t)used, "%c%s:%.1f", i ? '/' : ':',
                             loomi_algo_name(cand[i]), (double)best[i] * 1e-3);
        }
        if (v[1]) {
            *out = 1;
            s *= 2;
            break;
        }
    }
    c->algo_forced[coll] = LOOMI_ALGO_AUTO;
    if (r != LOOM_SUCCESS) {
        c->ntuned = first;
        return r;
    }
    c->sel->coll[coll] = tuned;
    c->timed_lo[k] = lo;
    c->timed_hi[k] = s / 2;
    if (c->rank == 0)
        LOOMI_INFO(c->rank, "%s measured from %zu to %zu bytes (bytes:algorithm:us%s; %.1f ms), "
                   "%d size(s) changed",
                   loomi_coll_name(coll), lo, c->timed_hi[k], log,
                   (double)(loomi_now_ns() - t_coll) * 1e-6, c->ntuned - first);
    return LOOM_SUCCESS;
}

loom_result_t loomi_algo_tune(struct loom_comm *c, uint64_t budget_ns)
{
    c->ntuned = 0;
    memset(c->timed_lo, 0, sizeof c->timed_lo);
    memset(c->timed_hi, 0, sizeof c->timed_hi);
    if (!c->sel || !c->links || !c->links->intra_shm || !c->set.probe || c->nranks < 2 ||
        !c->hosts || c->hosts->nhosts != 1)
        return LOOM_SUCCESS;
    float *a = calloc(TUNE_TOP / sizeof(float), sizeof(float));
    float *b = calloc(TUNE_TOP / sizeof(float), sizeof(float));
    if (!a || !b) {
        free(a);
        free(b);
        return loomi_fail(LOOM_ERR_NO_MEMORY, c->rank, "timing the tables: out of memory");
    }
    const uint64_t start = loomi_now_ns();
    loom_result_t r = LOOM_SUCCESS;
    int out = 0;
    for (int k = 0; k < LOOMI_TIMED && r == LOOM_SUCCESS && !out; k++) {
        const int coll = loomi_timed[k];
        if (c->algo_forced[coll] != LOOMI_ALGO_AUTO) continue;
        /* Above the sizes that take the slots instead (allreduce). */
        size_t lo = TUNE_LOW;
        while (coll < LOOMI_SMALL_TUNED && lo <= c->small_lim[coll] && lo <= TUNE_TOP) lo *= 2;
        if (lo <= TUNE_TOP) r = time_coll(c, k, lo, start, budget_ns, a, b, &out);
    }
    free(a);
    free(b);
    if (r != LOOM_SUCCESS)
        return loomi_fail(r, c->rank, "timing the tables: %s", loom_get_last_error());
    return LOOM_SUCCESS;
}
