/*
 * tune.c - the allreduce's table on one host, checked by timing at init
 * where the cost model is weakest.
 *
 * The model charges copies and reductions at the rates measured on
 * vectors larger than the caches (what the big collectives meet), and
 * shared-memory messages at one rate, whether they go through the FIFO
 * cells or in one kernel copy.  Vectors that the caches hold break both:
 * on 2 ranks, recursive doubling's one 128K message is a single copy
 * and its reduction runs in cache, and it beat the ring that the table
 * chose (whose 64K halves go through the cells) clearly at 128K and
 * 256K (perf/NOTES.md, "tune.c, why the allreduce is timed").
 * Modelling that moves every crossover on the host, which the model's
 * other terms were calibrated against.  So the choice is measured
 * instead, in that range only: each power of two from TUNE_LOW, or from
 * above the slots' limit where that is higher, up to TUNE_TOP, the
 * table's algorithm against every other that the model puts within
 * TUNE_SPAN of it, in turns.  Rank 0 decides and tells the others (every
 * rank then runs the same algorithm): another one takes the sizes from
 * there to the next power of two where it was faster by TUNE_MARGIN.
 */
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "comm/collectives.h"
#include "comm/comm.h"
#include "core/internal.h"
#include "topo/select.h"
#include "topo/topo.h"

#define TUNE_LOW ((size_t)8 << 10)
#define TUNE_TOP ((size_t)512 << 10)
#define TUNE_SPAN 2.0
#define TUNE_MARGIN 1.15
#define TUNE_BATCHES 3
#define TUNE_BATCH 3
/* Sizes timed at most (TUNE_LOW to TUNE_TOP) */
#define TUNE_SIZES 8
/* The message algorithms' time over the model's beyond which fit_beta()
 * raises the probe's beta: past the timing's noise. */
#define TUNE_FIT 1.05

/* Only the allreduce.  Not the broadcast: its calls overlap back to
 * back, and short batches of them timed otherwise than the perf binary's
 * long ones (4 ranks, 64K: scatter-allgather ahead of the tree at init,
 * behind it in broadcast_perf; perf/NOTES.md, "tune.c, the broadcast"). */
#define COLL LOOMI_COLL_ALLREDUCE

/* Rank 0's word on every rank: the others check what came (`what`
 * names it in the error) with ok(). */
static loom_result_t from_rank0(struct loom_comm *c, uint8_t *v, size_t n, const char *what,
                                int (*ok)(const uint8_t *, size_t))
{
    loom_result_t r =
        loomi_call_broadcast("loom_broadcast", v, v, n, LOOM_UINT8, 0, c->handle, NULL);
    if (r == LOOM_SUCCESS && !ok(v, n))
        r = loomi_fail(LOOM_ERR_MISMATCH, c->rank, "%s: rank 0 sent an out-of-range %s",
                       loomi_coll_name(COLL), what);
    return r;
}

/* A candidate list: a count, then that many allreduce algorithms, none
 * twice. */
static int cands_ok(const uint8_t *v, size_t n)
{
    if (v[0] > n - 1) return 0;
    for (int i = 1; i <= v[0]; i++) {
        if (v[i] < 1 || v[i] >= LOOMI_NUM_ALGOS || !loomi_algo_gen(COLL, v[i])) return 0;
        for (int q = 1; q < i; q++)
            if (v[q] == v[i]) return 0;
    }
    return 1;
}

/* A verdict: the index of the pick among nc (v[2]), stop 0 or 1, then
 * the pick of each slower class of reductions (v[3..]; KEEP: none). */
#define KEEP 0xff
static int verdict_ok(const uint8_t *v, size_t n)
{
    for (size_t q = 3; q < n; q++)
        if (v[q] >= v[2] && v[q] != KEEP) return 0;
    return v[0] < v[2] && v[1] <= 1;
}

/* The starting size, log2 of TUNE_LOW..TUNE_TOP, or 0: not timed. */
static int start_ok(const uint8_t *v, size_t n)
{
    (void)n;
    return !v[0] ||
           (v[0] <= 40 && (size_t)1 << v[0] >= TUNE_LOW && (size_t)1 << v[0] <= TUNE_TOP);
}

/* A raised beta as it came: 0 (none) or a figure in range. */
static int beta_ok(const uint8_t *v, size_t n)
{
    double b;
    memcpy(&b, v, n < sizeof b ? n : sizeof b);
    return b == 0 || (b > 0 && b < 1e-6);
}

/* The probe's intra-host beta, against the allreduce's messages as the
 * timing met them at size s: the probe times one pair's round trips
 * while the host's other ranks wait, and where ranks take turns on
 * cores that pair can run as it never does in a collective.  On a
 * 2-core VM whose hypervisor at times puts its two CPUs close (a cache
 * line handed over several times faster), the probe's beta halved while
 * halving-doubling's allreduce on 4 ranks hardly sped up: a third of
 * the jobs then chose it over a shared allreduce that was faster at
 * 512K-768K and 2M-4M, and the ring at 12M (perf/NOTES.md, "tune.c,
 * the probe's beta").  So beta is fitted to each message algorithm
 * timed (not shared, which sends no data in messages) that ran slower
 * than the model by more than TUNE_FIT
 * (loomi_select_fit_beta; the others keep the probe's), and the lower
 * median of those figures stands: one algorithm that the model prices
 * badly (recursive doubling at 256K on 4 ranks, whose times varied far
 * above its estimate) neither raises it alone nor, matching its
 * estimate by luck, keeps it (as the tree did at 128K in a job whose
 * probe was made to read half its beta).  Returns the new beta, or 0. */
static double fit_beta(const struct loom_comm *c, const struct loomi_job_shape *j, size_t s,
                       const uint8_t *cand, const uint64_t *best, int nc)
{
    const struct loomi_links *l = c->links;
    if (!l->intra_shm || l->source[LOOMI_LINK_INTRA] != LOOMI_SRC_MEASURED) return 0;
    const double b0 = l->beta[LOOMI_LINK_INTRA];
    double f[LOOMI_NUM_ALGOS];
    int n = 0;
    for (int i = 0; i < nc; i++) {
        /* (Hierarchical is never a candidate: the timing runs on one host.) */
        if (cand[i] == LOOMI_ALGO_SHARED || best[i] == UINT64_MAX) continue;
        double b = loomi_select_fit_beta(COLL, cand[i], s, j, l, (double)best[i] * 1e-9, TUNE_FIT);
        f[n++] = b > b0 ? b : b0;
    }
    if (!n) return 0;
    qsort(f, (size_t)n, sizeof f[0], loomi_cmp_double);
    const double m = f[(n - 1) / 2];
    return m > b0 ? m : 0;
}

/* Time the allreduce from lo up, until TUNE_TOP or until rank 0 says
 * budget_ns is spent.  Every list and verdict is rank 0's, so every rank
 * makes the same calls whatever its own table, links or environment. */
static loom_result_t time_sizes(struct loom_comm *c, size_t lo, uint64_t budget_ns, float *a,
                                float *b)
{
    const int coll = COLL;
    struct loomi_job_shape j;
    loomi_comm_shape(c, &j);
    /* Each timed size's verdict, per class of reductions, applied once
     * the loop is done (over tables rebuilt if the links were raised). */
    size_t tsz[TUNE_SIZES];
    int tpick[TUNE_SIZES][LOOMI_RED_CLASSES], nts = 0;
    /* The largest size's times, rank 0's, for fit_beta(). */
    size_t fit_s = 0;
    int fit_nc = 0;
    uint8_t fit_cand[LOOMI_NUM_ALGOS];
    uint64_t fit_best[LOOMI_NUM_ALGOS];
    /* The slower classes' reductions run on ranks that take turns on the
     * cores as the timed ones did. */
    const double cf = loomi_select_turns(&j);
    char log[640] = "";
    int used = 0;
    loom_result_t r = LOOM_SUCCESS;
    const uint64_t start = loomi_now_ns();
    uint64_t last = start;
    size_t s;
    for (s = lo; s <= TUNE_TOP && nts < TUNE_SIZES && r == LOOM_SUCCESS; s *= 2) {
        /* The candidates, the table's first. */
        uint8_t cv[1 + LOOMI_NUM_ALGOS] = {0};
        if (c->rank == 0) {
            int nc = 0;
            const int t0 = loomi_select_lookup(c->sel, coll, s);
            cv[1 + nc++] = (uint8_t)t0;
            const double base = loomi_select_cost(coll, t0, s, &j, c->links);
            for (int q = 1; q < LOOMI_NUM_ALGOS; q++) {
                if (q == t0 || !loomi_algo_gen(coll, q)) continue;
                double t = loomi_select_cost(coll, q, s, &j, c->links);
                if (t >= 0 && (base < 0 || t <= TUNE_SPAN * base)) cv[1 + nc++] = (uint8_t)q;
            }
            cv[0] = (uint8_t)nc;
        }
        r = from_rank0(c, cv, sizeof cv, "candidate list", cands_ok);
        if (r != LOOM_SUCCESS) break;
        const int nc = cv[0];
        const uint8_t *cand = cv + 1;
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
                    r = loomi_call_allreduce("loom_allreduce", a, b, s / sizeof(float),
                                             LOOM_FLOAT32, LOOM_SUM, c->handle, NULL, NULL);
                uint64_t dt = (loomi_now_ns() - t0) / TUNE_BATCH;
                if (bt >= 0 && dt < best[i]) best[i] = dt;
            }
        if (r != LOOM_SUCCESS) break;
        /* Rank 0's verdict: the index of the candidate to run, whether
         * the budget is spent (with the count, for the check), and each
         * slower class's pick.  Those were timed with fp32 sums; their
         * own reductions add the bytes each candidate reduces at the
         * class's slowest kernel's excess (2 ranks: recursive doubling
         * reduces the whole vector, the ring half of it, and with bf16
         * max at 256K the ring won where with fp32 sums recursive
         * doubling had: perf/NOTES.md, "tune.c, slower reductions"). */
        uint8_t v[3 + LOOMI_RED_CLASSES - 1] = {0, 0, (uint8_t)nc};
        memset(v + 3, KEEP, LOOMI_RED_CLASSES - 1);
        /* Each class's own table's algorithm here (class 0: the list's first). */
        int own[LOOMI_RED_CLASSES];
        for (int q = 0; q < LOOMI_RED_CLASSES; q++)
            own[q] = q ? loomi_ranges_algo(&c->sel->allreduce_red[q], s) : cand[0];
        for (int q = 0; q < LOOMI_RED_CLASSES; q++) {
            const double dg = q ? c->red.excess[q] * cf : 0;
            double tq[LOOMI_NUM_ALGOS];
            int win = 0;
            for (int i = 0; i < nc; i++) {
                tq[i] = (double)best[i] + loomi_allreduce_reduced(cand[i], c->nranks, (double)s) * dg;
                if (tq[i] < tq[win]) win = i;
            }
            /* Where the class's own algorithm was timed. */
            int b = 0;
            while (b < nc && cand[b] != own[q]) b++;
            if (b == nc) continue;
            uint8_t *pick = &v[q ? 2 + q : 0];
            if (tq[b] > TUNE_MARGIN * tq[win]) *pick = (uint8_t)win;
            /* The margin stands against the noise of the timing, which
             * the fp32 sums' verdict has passed; the reductions' excess
             * is the model's and shifts every candidate: the sums' pick
             * stays where it still comes out ahead.  (2 ranks, 128K: a
             * clear win for recursive doubling at init that fp16 sums'
             * excess, larger for it, would have undone in the estimate;
             * measured in fp16, it won by more: perf/NOTES.md, "tune.c,
             * slower reductions".) */
            else if (q && v[0] && tq[v[0]] < tq[b])
                *pick = v[0];
        }
        /* Stop where the next size, twice as long as this one, would
         * end past the budget. */
        const uint64_t now = loomi_now_ns();
        v[1] = now - start + 2 * (now - last) > budget_ns;
        last = now;
        r = from_rank0(c, v, sizeof v, "verdict", verdict_ok);
        if (r == LOOM_SUCCESS && v[2] != nc)
            r = loomi_fail(LOOM_ERR_MISMATCH, c->rank, "%s: rank 0 timed %u candidates, not %d",
                           loomi_coll_name(coll), v[2], nc);
        if (r != LOOM_SUCCESS) break;
        tsz[nts] = s;
        for (int q = 0; q < LOOMI_RED_CLASSES; q++) {
            const int pick = v[q ? 2 + q : 0];
            tpick[nts][q] = pick != KEEP ? cand[pick] : -1; /* -1: the table's */
        }
        nts++;
        fit_s = s;
        fit_nc = nc;
        memcpy(fit_cand, cand, (size_t)nc);
        memcpy(fit_best, best, (size_t)nc * sizeof best[0]);
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
    c->algo_forced[coll] = LOOMI_ALGO_AUTO;
    /* The links, checked against the largest size's times: rank 0's word
     * (0: as they are). */
    double nb = 0;
    if (r == LOOM_SUCCESS && c->rank == 0 && fit_s)
        nb = fit_beta(c, &j, fit_s, fit_cand, fit_best, fit_nc);
    uint8_t nbv[sizeof nb];
    memcpy(nbv, &nb, sizeof nb);
    if (r == LOOM_SUCCESS) r = from_rank0(c, nbv, sizeof nbv, "raised beta", beta_ok);
    if (r != LOOM_SUCCESS) {
        c->ntuned = 0;
        return r;
    }
    memcpy(&nb, nbv, sizeof nb);
    if (nb > 0) {
        if (c->rank == 0)
            LOOMI_INFO(c->rank,
                       "links: within a host beta %.3f ns/B, raised from the probe's %.3f: the "
                       "allreduce's messages timed slower at %zu bytes than the probe's figures "
                       "predict",
                       nb * 1e9, c->links->beta[LOOMI_LINK_INTRA] * 1e9, fit_s);
        c->links->beta[LOOMI_LINK_INTRA] = nb;
        c->links->source[LOOMI_LINK_INTRA] = LOOMI_SRC_TIMED;
        loomi_select_build(c->sel, &j, c->links);
        loomi_select_build_red(c->sel, &j, c->links, c->red.excess);
    }
    /* The verdicts over the model's tables; where they differ from the
     * model's choice, the record that loom-info prints. */
    for (int k = 0; k < nts; k++)
        for (int q = 0; q < LOOMI_RED_CLASSES; q++) {
            struct loomi_ranges *t = q ? &c->sel->allreduce_red[q] : &c->sel->coll[coll];
            const int was = loomi_ranges_algo(t, tsz[k]), now = tpick[k][q];
            if (now < 0 || now == was || loomi_ranges_set(t, tsz[k], 2 * tsz[k], now) != 0)
                continue;
            /* A near-tie that the model broke there is the timing's now. */
            if (!q) loomi_select_untie(c->sel, coll, tsz[k], 2 * tsz[k]);
            if (c->ntuned < LOOMI_TUNED) {
                c->tuned[c->ntuned].cls = q;
                c->tuned[c->ntuned].from = tsz[k];
                c->tuned[c->ntuned].was = was;
                c->tuned[c->ntuned++].now = now;
            }
        }
    c->timed_lo = lo;
    c->timed_hi = s / 2;
    if (c->rank == 0)
        LOOMI_INFO(c->rank, "%s measured from %zu to %zu bytes (bytes:algorithm:us%s; %.1f ms), "
                   "%d size(s) changed",
                   loomi_coll_name(coll), lo, c->timed_hi, log,
                   (double)(loomi_now_ns() - start) * 1e-6, c->ntuned);
    return LOOM_SUCCESS;
}

loom_result_t loomi_algo_tune(struct loom_comm *c, uint64_t budget_ns)
{
    c->ntuned = 0;
    c->timed_lo = c->timed_hi = 0;
    /* The same on every rank: the job's shape. */
    if (!c->sel || !c->links || c->nranks < 2 || !c->hosts || c->hosts->nhosts != 1)
        return LOOM_SUCCESS;
    /* Whether and from where, rank 0's call: the others' LOOM_PROBE,
     * LOOM_ALGO or transports may differ, and all must make the same
     * calls.  A rank whose LOOM_ALGO forces the allreduce still takes
     * part, and keeps its forced choice. */
    uint8_t from = 0;
    if (c->rank == 0 && c->links->intra_shm && c->set.probe &&
        c->algo_forced[COLL] == LOOMI_ALGO_AUTO) {
        /* Above the sizes that take the slots instead. */
        size_t lo = TUNE_LOW;
        while (lo <= c->small_lim[COLL] && lo <= TUNE_TOP) lo *= 2;
        if (lo <= TUNE_TOP) {
            if (!budget_ns)
                LOOMI_INFO(c->rank, "%s not timed: measuring the slots spent the time at init",
                           loomi_coll_name(COLL));
            else
                while ((size_t)1 << from < lo) from++;
        }
    }
    loom_result_t r = from_rank0(c, &from, 1, "starting size", start_ok);
    if (r != LOOM_SUCCESS || !from) return r;
    float *a = calloc(TUNE_TOP / sizeof(float), sizeof(float));
    float *b = calloc(TUNE_TOP / sizeof(float), sizeof(float));
    if (!a || !b) {
        free(a);
        free(b);
        return loomi_fail(LOOM_ERR_NO_MEMORY, c->rank, "timing the tables: out of memory");
    }
    const int forced = c->algo_forced[COLL];
    c->timing = 1;
    r = time_sizes(c, (size_t)1 << from, budget_ns, a, b);
    c->timing = 0;
    /* A rank's own LOOM_ALGO still rules its calls. */
    if (forced != LOOMI_ALGO_AUTO) {
        c->algo_forced[COLL] = forced;
        c->timed_lo = c->timed_hi = 0;
    }
    free(a);
    free(b);
    if (r != LOOM_SUCCESS)
        return loomi_fail(r, c->rank, "timing the tables: %s", loom_get_last_error());
    return LOOM_SUCCESS;
}
