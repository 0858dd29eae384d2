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
loom_result_t loomi_algo_tune(struct loom_comm *c, uint64_t budget_ns)
{
    const int AR = LOOMI_COLL_ALLREDUCE;
    c->ar_ntuned = 0;
    c->ar_tune_lo = c->ar_tune_hi = 0;
    if (!c->sel || !c->links || !c->links->intra_shm || !c->set.probe || c->nranks < 2 ||
        !c->hosts || c->hosts->nhosts != 1 || c->algo_forced[AR] != LOOMI_ALGO_AUTO)
        return LOOM_SUCCESS;
    size_t lo = TUNE_LOW;
    while (lo <= c->small_lim[AR] && lo <= TUNE_TOP) lo *= 2;
    if (lo > TUNE_TOP) return LOOM_SUCCESS;
    struct loomi_job_shape j;
    loomi_comm_shape(c, &j);
    float *a = calloc(TUNE_TOP / sizeof(float), sizeof(float));
    float *b = calloc(TUNE_TOP / sizeof(float), sizeof(float));
    if (!a || !b) {
        free(a);
        free(b);
        return loomi_fail(LOOM_ERR_NO_MEMORY, c->rank, "measuring the allreduce: out of memory");
    }
    const uint64_t start = loomi_now_ns();
    struct loomi_ranges tuned = c->sel->coll[AR];
    char log[640] = "";
    int used = 0;
    loom_result_t r = LOOM_SUCCESS;
    size_t s;
    uint64_t last = start;
    for (s = lo; s <= TUNE_TOP && r == LOOM_SUCCESS; s *= 2) {
        /* The candidates, the table's first: the same list on every rank,
         * which all hold rank 0's links. */
        int cand[LOOMI_NUM_ALGOS], nc = 0;
        cand[nc++] = loomi_select_lookup(c->sel, AR, s);
        const double base = loomi_select_cost(AR, cand[0], s, &j, c->links);
        for (int k = 1; k < LOOMI_NUM_ALGOS; k++) {
            if (k == cand[0] || !loomi_algo_gen(AR, k)) continue;
            double t = loomi_select_cost(AR, k, s, &j, c->links);
            if (t >= 0 && (base < 0 || t <= TUNE_SPAN * base)) cand[nc++] = k;
        }
        if (nc < 2) continue;
        uint64_t best[LOOMI_NUM_ALGOS];
        for (int i = 0; i < nc; i++) best[i] = UINT64_MAX;
        const size_t count = s / sizeof(float);
        /* Batch -1 warms each up (and builds its schedule); then batches
         * of back-to-back calls, the candidates in turns that rotate;
         * the best batch counts. */
        for (int bt = -1; bt < TUNE_BATCHES && r == LOOM_SUCCESS; bt++)
            for (int w = 0; w < nc && r == LOOM_SUCCESS; w++) {
                const int i = (w + (bt < 0 ? 0 : bt)) % nc;
                c->algo_forced[AR] = cand[i];
                uint64_t t0 = loomi_now_ns();
                for (int q = 0; q < (bt < 0 ? 1 : TUNE_BATCH) && r == LOOM_SUCCESS; q++)
                    r = loom_allreduce(a, b, count, LOOM_FLOAT32, LOOM_SUM, c);
                uint64_t dt = (loomi_now_ns() - t0) / TUNE_BATCH;
                if (bt >= 0 && dt < best[i]) best[i] = dt;
            }
        c->algo_forced[AR] = LOOMI_ALGO_AUTO;
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
                           "allreduce: rank 0 sent candidate %u of %d, stop %u", v[0], nc, v[1]);
            break;
        }
        if (v[0] && loomi_ranges_set(&tuned, s, 2 * s, cand[v[0]]) == 0 &&
            c->ar_ntuned < LOOMI_AR_TUNED) {
            c->ar_tuned[c->ar_ntuned].from = s;
            c->ar_tuned[c->ar_ntuned].was = cand[0];
            c->ar_tuned[c->ar_ntuned++].now = cand[v[0]];
        }
        for (int i = 0; i < nc && used < (int)sizeof log - 64; i++) {
            if (!i) used += snprintf(log + used, sizeof log - (size_t)used, " %zu", s);
            used += snprintf(log + used, sizeof log - (size_t)used, "%c%s:%.1f", i ? '/' : ':',
                             loomi_algo_name(cand[i]), (double)best[i] * 1e-3);
        }
        if (v[1]) {
            s *= 2;
            break;
        }
    }
    free(a);
    free(b);
    c->algo_forced[AR] = LOOMI_ALGO_AUTO;
    if (r != LOOM_SUCCESS)
        return loomi_fail(r, c->rank, "measuring the allreduce: %s", loom_get_last_error());
    c->sel->coll[AR] = tuned;
    c->ar_tune_lo = lo;
    c->ar_tune_hi = s / 2;
    if (c->rank == 0)
        LOOMI_INFO(c->rank, "allreduce measured from %zu to %zu bytes (bytes:algorithm:us%s; %.1f "
                   "ms), %d size(s) changed",
                   lo, c->ar_tune_hi, log, (double)(loomi_now_ns() - start) * 1e-6,
                   c->ar_ntuned);
    return LOOM_SUCCESS;
}
