/*
 * test_model.c - the alpha-beta-gamma timing model: closed forms against
 * the event simulation of the generators' real schedules, basic sanity of
 * both, and the host measurements.
 *
 * Agreement.  The closed forms describe each algorithm as its generator
 * is written, on an ideal schedule; the simulation runs the schedules
 * with one message at a time per port direction and one local step at a
 * time per core.  They agree within 10% except where the simulation sees
 * something the closed form deliberately leaves out (the tolerance table
 * below says what, per algorithm).  Sizes are at least a few elements per
 * rank: below that some segments are empty, their messages are skipped,
 * and the simulation legitimately comes out faster than the formulas.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "coll/coll.h"
#include "core/internal.h"
#include "topo/model.h"

static void quiet(void)
{
    /* Generators not written yet fail on purpose; do not log each one. */
    setenv("LOOM_DEBUG", "none", 1);
}

TestSuite(model, .init = quiet);

static struct loomi_model_params defaults(void)
{
    struct loomi_model_params m;
    loomi_model_defaults(&m);
    return m;
}

/* ------------------------------------------------------- parameters */

Test(model, defaults_are_documented)
{
    struct loomi_model_params m = defaults();
    cr_assert_eq(m.alpha, LOOMI_MODEL_ALPHA);
    cr_assert_eq(m.beta, LOOMI_MODEL_BETA);
    cr_assert_eq(m.gamma, LOOMI_MODEL_GAMMA);
    cr_assert_eq(m.gamma_copy, LOOMI_MODEL_GAMMA_COPY);
    cr_assert_eq(m.chunk_bytes, (size_t)2 << 20);
    cr_assert(m.alpha > 0 && m.beta > 0 && m.gamma > 0 && m.gamma_copy > 0);
}

/* ------------------------------------------------------ closed forms */

Test(model, closed_forms_exist_and_grow_with_size)
{
    struct loomi_model_params m = defaults();
    const int ps[] = {1, 2, 3, 7, 8, 64, 1000, 4096};
    for (int c = 0; c < LOOMI_NUM_COLLS; c++) {
        unsigned mask = loomi_coll_algos(c) & ~LOOMI_TOPO_ALGOS;
        for (int a = 0; a < LOOMI_NUM_ALGOS; a++) {
            int has = a == LOOMI_ALGO_AUTO || (mask & (1u << a));
            for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) {
                double prev = -1;
                for (size_t b = 0; b <= ((size_t)1 << 30); b = b ? b * 4 : 4) {
                    double t = loomi_model_time(c, a, ps[i], b, &m);
                    if (!has) {
                        cr_assert_lt(t, 0, "%s has no %s but got %g", loomi_coll_name(c),
                                     loomi_algo_name(a), t);
                        continue;
                    }
                    cr_assert(isfinite(t) && t >= 0, "%s/%s p=%d %zu B: %g", loomi_coll_name(c),
                              loomi_algo_name(a), ps[i], b, t);
                    if (a != LOOMI_ALGO_AUTO && c != LOOMI_COLL_BARRIER)
                        cr_assert_geq(t, prev * 0.999, "%s/%s p=%d: %zu B takes %g < %g",
                                      loomi_coll_name(c), loomi_algo_name(a), ps[i], b, t, prev);
                    prev = t;
                }
            }
        }
    }
    cr_assert_lt(loomi_model_time(LOOMI_COLL_ALLREDUCE, LOOMI_ALGO_RING, 0, 8, &m), 0);
    cr_assert_lt(loomi_model_time(-1, LOOMI_ALGO_RING, 8, 8, &m), 0);
    cr_assert_lt(loomi_model_time(LOOMI_NUM_COLLS, LOOMI_ALGO_RING, 8, 8, &m), 0);
    cr_assert_lt(loomi_model_time(LOOMI_COLL_ALLREDUCE, LOOMI_NUM_ALGOS, 8, 8, &m), 0);
    cr_assert_lt(loomi_model_time(LOOMI_COLL_ALLREDUCE, LOOMI_ALGO_RING, 8, 8, NULL), 0);
}

Test(model, textbook_costs)
{
    struct loomi_model_params m = defaults();
    const double a = m.alpha, b = m.beta, g = m.gamma;
    /* Unchunked ring: 2(p-1) alpha + 2(p-1)/p n beta + (p-1)/p n gamma. */
    double n = 64.0 * 1024, p = 8;
    double want = 2 * (p - 1) * a + 2 * (p - 1) / p * n * b + (p - 1) / p * n * g;
    double t = loomi_model_time(LOOMI_COLL_ALLREDUCE, LOOMI_ALGO_RING, 8, 64 * 1024, &m);
    cr_assert_float_eq(t, want, want * 1e-9, "ring: %g, want %g", t, want);
    /* Recursive doubling on a power of two: lg p (alpha + n beta + n gamma). */
    want = 3 * (a + n * b + n * g);
    t = loomi_model_time(LOOMI_COLL_ALLREDUCE, LOOMI_ALGO_RECURSIVE_DOUBLING, 8, 64 * 1024, &m);
    cr_assert_float_eq(t, want, want * 1e-9, "recursive doubling: %g, want %g", t, want);
    /* Rabenseifner: 2 lg p alpha + 2(p-1)/p n beta + (p-1)/p n gamma. */
    want = 6 * a + 2 * (p - 1) / p * n * b + (p - 1) / p * n * g;
    t = loomi_model_time(LOOMI_COLL_ALLREDUCE, LOOMI_ALGO_HALVING_DOUBLING, 8, 64 * 1024, &m);
    cr_assert_float_eq(t, want, want * 1e-9, "halving-doubling: %g, want %g", t, want);
    /* Dissemination barrier: ceil(lg p) alpha. */
    t = loomi_model_time(LOOMI_COLL_BARRIER, LOOMI_ALGO_BRUCK, 5, 0, &m);
    cr_assert_float_eq(t, 3 * a, a * 1e-9);
    /* One rank: a copy at most. */
    t = loomi_model_time(LOOMI_COLL_ALLREDUCE, LOOMI_ALGO_RING, 1, 1000, &m);
    cr_assert_float_eq(t, 1000 * m.gamma_copy, 1e-15);
}

Test(model, ring_wins_large_recursive_doubling_wins_small)
{
    struct loomi_model_params m = defaults();
    const int R = LOOMI_ALGO_RING, D = LOOMI_ALGO_RECURSIVE_DOUBLING, A = LOOMI_COLL_ALLREDUCE;
    for (int p = 16; p <= 4096; p *= 4) {
        double big_r = loomi_model_time(A, R, p, (size_t)256 << 20, &m);
        double big_d = loomi_model_time(A, D, p, (size_t)256 << 20, &m);
        double small_r = loomi_model_time(A, R, p, 8, &m);
        double small_d = loomi_model_time(A, D, p, 8, &m);
        cr_assert_lt(big_r, big_d, "p=%d 256 MiB: ring %g >= rd %g", p, big_r, big_d);
        cr_assert_lt(small_d, small_r, "p=%d 8 B: rd %g >= ring %g", p, small_d, small_r);
    }
    double t;
    cr_assert_eq(loomi_model_best(A, 64, 8, &m, &t), D);
    cr_assert_gt(t, 0);
    int big = loomi_model_best(A, 64, (size_t)1 << 30, &m, NULL);
    cr_assert(big != D && big != LOOMI_ALGO_AUTO, "best at 1 GiB: %s", loomi_algo_name(big));
}

/* The same in the simulation, where the generators exist. */
static int sim(int coll, int algo, int p, size_t bytes, double *t)
{
    struct loomi_model_params m = defaults();
    struct loomi_model_sim r;
    loom_result_t rc = loomi_model_simulate(coll, algo, p, LOOM_FLOAT32, LOOM_SUM, bytes / 4, &m,
                                            0, &r);
    if (rc == LOOM_ERR_UNSUPPORTED) return 0;
    cr_assert_eq(rc, LOOM_SUCCESS, "%s/%s p=%d %zu B: %s", loomi_coll_name(coll),
                 loomi_algo_name(algo), p, bytes, loom_get_last_error());
    cr_assert(!r.over_budget);
    *t = r.time;
    return 1;
}

Test(model, simulated_ring_and_recursive_doubling)
{
    const int A = LOOMI_COLL_ALLREDUCE;
    double ring_big, rd_big, ring_small, rd_small;
    if (!sim(A, LOOMI_ALGO_RING, 32, (size_t)32 << 20, &ring_big) ||
        !sim(A, LOOMI_ALGO_RECURSIVE_DOUBLING, 32, (size_t)32 << 20, &rd_big) ||
        !sim(A, LOOMI_ALGO_RING, 32, 8, &ring_small) ||
        !sim(A, LOOMI_ALGO_RECURSIVE_DOUBLING, 32, 8, &rd_small)) {
        cr_log_info("ring or recursive doubling not written yet: skipped");
        return;
    }
    cr_assert_lt(ring_big, rd_big);
    cr_assert_lt(rd_small, ring_small);
}

/* ------------------------------------------- simulation vs closed form */

struct tol {
    int coll, algo;
    double lo, hi;
    const char *why;
};

/* Ratios sim/closed form allowed beyond the default [0.9, 1.1]. */
static const struct tol tols[] = {
    {LOOMI_COLL_ALLREDUCE, LOOMI_ALGO_TREE, 0.95, 1.3,
     "the form follows the first chunk through one tree, where the two trees' messages "
     "also meet on the same ports; at many chunks a rank's four messages per pair of "
     "chunks go to and come from four peers, which the simulated ports match greedily "
     "(oldest first), about a fifth slower than the form's packing"},
    {LOOMI_COLL_ALLREDUCE, LOOMI_ALGO_RECURSIVE_DOUBLING, 0.9, 1.3,
     "with p not a power of two, fold-in traffic competes for the ports of the core "
     "ranks' first exchanges; the form has no port contention"},
    {LOOMI_COLL_ALLREDUCE, LOOMI_ALGO_HALVING_DOUBLING, 0.9, 1.3,
     "as recursive doubling: the fold-in contends with the first halving level"},
    {LOOMI_COLL_REDUCE_SCATTER, LOOMI_ALGO_HALVING_DOUBLING, 0.9, 1.3,
     "as recursive doubling: the fold-in contends with the first halving level"},
    {LOOMI_COLL_ALLTOALL, LOOMI_ALGO_PAIRWISE, 0.95, 1.35,
     "the form assumes a perfect permutation per step; with up to 8 exchanges in "
     "flight the simulated ports pick messages greedily (oldest first) and sometimes "
     "wait on a busy far end"},
    {LOOMI_COLL_ALLTOALLV, LOOMI_ALGO_PAIRWISE, 0.95, 1.35, "as alltoall pairwise"},
    {LOOMI_COLL_BROADCAST, LOOMI_ALGO_SCATTER_ALLGATHER, 0.9, 1.5,
     "the ring sends of a rank's own subtree segments wait on nothing, so they leave "
     "right after the scatter and hold up the forwarded ones on the same link"},
};

static void tolerance(int coll, int algo, double *lo, double *hi, const char **why)
{
    *lo = 0.9;
    *hi = 1.1;
    *why = "";
    for (size_t i = 0; i < sizeof tols / sizeof tols[0]; i++)
        if (tols[i].coll == coll && tols[i].algo == algo) {
            *lo = tols[i].lo;
            *hi = tols[i].hi;
            *why = tols[i].why;
        }
}

/* Every algorithm of every collective on each of ps ranks at each of
 * sizes, under m: simulated / closed form within the tolerance. */
static void agree(const struct loomi_model_params *m, const int *ps, size_t nps,
                  const size_t *sizes, size_t nsizes, int *checked, int *missing)
{
    for (int c = 0; c < LOOMI_NUM_COLLS; c++) {
        unsigned mask = loomi_coll_algos(c) & ~LOOMI_TOPO_ALGOS;
        for (int a = 1; a < LOOMI_NUM_ALGOS; a++) {
            if (!(mask & (1u << a))) continue;
            double lo, hi;
            const char *why;
            tolerance(c, a, &lo, &hi, &why);
            for (size_t i = 0; i < nps; i++)
                for (size_t k = 0; k < nsizes; k++) {
                    size_t bytes = c == LOOMI_COLL_BARRIER ? 0 : sizes[k];
                    struct loomi_model_sim r;
                    loom_result_t rc = loomi_model_simulate(c, a, ps[i], LOOM_FLOAT32, LOOM_SUM,
                                                            bytes / 4, m, 0, &r);
                    if (rc == LOOM_ERR_UNSUPPORTED) {
                        (*missing)++;
                        goto next_algo;
                    }
                    cr_assert_eq(rc, LOOM_SUCCESS, "%s/%s p=%d %zu B: %s", loomi_coll_name(c),
                                 loomi_algo_name(a), ps[i], bytes, loom_get_last_error());
                    cr_assert(!r.over_budget, "%s/%s p=%d %zu B: over the step budget",
                              loomi_coll_name(c), loomi_algo_name(a), ps[i], bytes);
                    double f = loomi_model_time(c, a, ps[i], bytes, m);
                    double ratio = r.time / f;
                    cr_expect(ratio >= lo && ratio <= hi,
                              "%s/%s p=%d %zu B: simulated %g s, closed form %g s (ratio %.3f "
                              "outside [%.2f, %.2f]) %s",
                              loomi_coll_name(c), loomi_algo_name(a), ps[i], bytes, r.time, f,
                              ratio, lo, hi, why);
                    (*checked)++;
                    if (c == LOOMI_COLL_BARRIER) break;
                }
        next_algo:;
        }
    }
}

Test(model, simulation_agrees_with_closed_forms, .timeout = 120)
{
    struct loomi_model_params m = defaults();
    const int ps[] = {2, 3, 5, 8, 13, 16, 64};
    /* Per rank or per vector, as each collective takes bytes; all big
     * enough for a few elements per segment even at 64 ranks. */
    const size_t sizes[] = {4096, 256 * 1024, (size_t)4 << 20};
    int checked = 0, missing = 0;
    agree(&m, ps, sizeof ps / sizeof ps[0], sizes, sizeof sizes / sizeof sizes[0], &checked,
          &missing);
    cr_log_info("%d simulations checked, %d algorithms not written yet", checked, missing);
    cr_assert_gt(checked, 0);
}

/* Sizes of many chunks, where the pipelines' steady state rules: up to
 * 4 MiB the pipelined algorithms cut a vector in one or two chunks
 * (LOOM_CHUNK_SIZE, 2 MiB), and the test above never sees their steady
 * state.  There the double binary tree's generator once let a leaf post
 * every chunk at once, which held up its sibling's and ran the tree level
 * by level: 2 to 3.3 times its closed form.  Both the defaults and
 * figures like a fast network's (loom-info --measure over loopback). */
Test(model, simulation_agrees_with_closed_forms_at_many_chunks, .timeout = 120)
{
    struct loomi_model_params m = defaults(), fast = defaults();
    fast.alpha = 7e-6;
    fast.beta = 0.3e-9;
    fast.gamma = 0.023e-9;
    fast.gamma_copy = 0.025e-9;
    const int ps[] = {3, 8, 64};
    const size_t sizes[] = {(size_t)64 << 20};
    int checked = 0, missing = 0;
    agree(&m, ps, 3, sizes, 1, &checked, &missing);
    agree(&fast, ps, 3, sizes, 1, &checked, &missing);
    /* The deep trees, allreduce only: 256 MiB on 1024 ranks. */
    const size_t big = (size_t)256 << 20;
    double lo, hi;
    const char *why;
    tolerance(LOOMI_COLL_ALLREDUCE, LOOMI_ALGO_TREE, &lo, &hi, &why);
    for (int k = 0; k < 2; k++) {
        const struct loomi_model_params *q = k ? &fast : &m;
        for (int p = 256; p <= 1024; p *= 4) {
            struct loomi_model_sim r;
            cr_assert_eq(loomi_model_simulate(LOOMI_COLL_ALLREDUCE, LOOMI_ALGO_TREE, p,
                                              LOOM_FLOAT32, LOOM_SUM, big / 4, q, 0, &r),
                         LOOM_SUCCESS, "%s", loom_get_last_error());
            cr_assert(!r.over_budget);
            double f = loomi_model_time(LOOMI_COLL_ALLREDUCE, LOOMI_ALGO_TREE, p, big, q);
            cr_expect(r.time / f >= lo && r.time / f <= hi,
                      "allreduce/tree p=%d 256 MiB: simulated %g s, closed form %g s (ratio "
                      "%.3f outside [%.2f, %.2f])",
                      p, r.time, f, r.time / f, lo, hi);
            checked++;
        }
    }
    cr_log_info("%d simulations checked, %d algorithms not written yet", checked, missing);
    cr_assert_gt(checked, 0);
}

/* ------------------------------------------------ simulation details */

Test(model, simulation_of_one_rank_and_of_nothing)
{
    struct loomi_model_params m = defaults();
    struct loomi_model_sim r;
    cr_assert_eq(loomi_model_simulate(LOOMI_COLL_ALLREDUCE, LOOMI_ALGO_RING, 1, LOOM_FLOAT32,
                                      LOOM_SUM, 1000, &m, 0, &r),
                 LOOM_SUCCESS);
    cr_assert_float_eq(r.time, 4000 * m.gamma_copy, 1e-15);
    cr_assert_eq(r.messages, 0);
    cr_assert_eq(loomi_model_simulate(LOOMI_COLL_ALLREDUCE, LOOMI_ALGO_RING, 8, LOOM_FLOAT32,
                                      LOOM_SUM, 0, &m, 0, &r),
                 LOOM_SUCCESS);
    cr_assert_eq(r.time, 0);
    cr_assert_eq(r.steps, 0);
}

Test(model, simulation_counts_the_ring)
{
    struct loomi_model_params m = defaults();
    struct loomi_model_sim r;
    /* 8 ranks, one chunk per segment: 2(p-1) messages per rank, each of
     * one segment, and the unchunked ring's time exactly. */
    cr_assert_eq(loomi_model_simulate(LOOMI_COLL_ALLREDUCE, LOOMI_ALGO_RING, 8, LOOM_FLOAT32,
                                      LOOM_SUM, 8 * 1024, &m, 0, &r),
                 LOOM_SUCCESS);
    cr_assert_eq(r.messages, 8 * 14);
    cr_assert_eq(r.wire_bytes, (uint64_t)8 * 14 * 4096);
    double want = 14 * (m.alpha + 4096 * m.beta) + 7 * 4096 * m.gamma;
    cr_assert_float_eq(r.time, want, want * 1e-9, "%g vs %g", r.time, want);
    cr_assert(r.last_rank >= 0 && r.last_rank < 8);
}

Test(model, simulation_budget_and_errors)
{
    struct loomi_model_params m = defaults();
    struct loomi_model_sim r;
    cr_assert_eq(loomi_model_simulate(LOOMI_COLL_ALLREDUCE, LOOMI_ALGO_RING, 64, LOOM_FLOAT32,
                                      LOOM_SUM, 1 << 20, &m, 100, &r),
                 LOOM_SUCCESS);
    cr_assert(r.over_budget);
    cr_assert_gt(r.steps, 100);
    cr_assert_eq(loomi_model_simulate(LOOMI_COLL_ALLREDUCE, LOOMI_ALGO_RING, 0, LOOM_FLOAT32,
                                      LOOM_SUM, 8, &m, 0, &r),
                 LOOM_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(loom_get_last_error(), "nranks"));
    cr_assert_eq(loomi_model_simulate(LOOMI_COLL_ALLREDUCE, LOOMI_ALGO_RING, 4,
                                      (loom_datatype_t)99, LOOM_SUM, 8, &m, 0, &r),
                 LOOM_ERR_INVALID_ARGUMENT);
    cr_assert_eq(loomi_model_simulate(LOOMI_COLL_ALLREDUCE, LOOMI_ALGO_BRUCK, 4, LOOM_FLOAT32,
                                      LOOM_SUM, 8, &m, 0, &r),
                 LOOM_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(loom_get_last_error(), "bruck"));
    cr_assert_eq(loomi_model_simulate(LOOMI_NUM_COLLS, LOOMI_ALGO_RING, 4, LOOM_FLOAT32, LOOM_SUM,
                                      8, &m, 0, &r),
                 LOOM_ERR_INVALID_ARGUMENT);
    cr_assert_eq(loomi_model_simulate(LOOMI_COLL_ALLREDUCE, LOOMI_ALGO_RING, 4, LOOM_FLOAT32,
                                      LOOM_SUM, 8, NULL, 0, &r),
                 LOOM_ERR_INVALID_ARGUMENT);
}

Test(model, simulation_runs_every_datatype_and_op)
{
    struct loomi_model_params m = defaults();
    for (int d = 0; d < LOOM_NUM_DATATYPES; d++)
        for (int o = 0; o < LOOM_NUM_OPS; o++) {
            struct loomi_model_sim r;
            loom_result_t rc = loomi_model_simulate(LOOMI_COLL_ALLREDUCE, LOOMI_ALGO_RING, 5,
                                                    (loom_datatype_t)d, (loom_op_t)o, 1000, &m,
                                                    0, &r);
            cr_assert_eq(rc, LOOM_SUCCESS, "%d/%d: %s", d, o, loom_get_last_error());
            cr_assert_gt(r.time, 0);
        }
}

/* ------------------------------------------------------- measurement */

Test(model, measures_this_host, .timeout = 60)
{
    double g, gc, a, b;
    cr_assert_eq(loomi_model_measure_cpu((size_t)1 << 20, &g, &gc), LOOM_SUCCESS, "%s",
                 loom_get_last_error());
    /* Between 1 TB/s and 10 MB/s: anything outside is a broken timer. */
    cr_assert(g > 1e-12 && g < 1e-7, "gamma %g s/B", g);
    cr_assert(gc > 1e-12 && gc < 1e-7, "gamma_copy %g s/B", gc);
    cr_assert_eq(loomi_model_measure_net((size_t)1 << 20, &a, &b), LOOM_SUCCESS, "%s",
                 loom_get_last_error());
    cr_assert(a > 0 && a < 0.1, "alpha %g s", a);
    cr_assert(b > 0 && b < 1e-6, "beta %g s/B", b);
    cr_assert_eq(loomi_model_measure_cpu(16, &g, &gc), LOOM_ERR_INVALID_ARGUMENT);
    cr_assert_eq(loomi_model_measure_net(16, &a, &b), LOOM_ERR_INVALID_ARGUMENT);
}

/* Init's timing of the reduction, and SCRATCH, take big buffers on huge
 * pages where the kernel has them: 2 MiB-aligned (the advice covers whole
 * huge pages), usable, and released by free(). */
Test(model, big_buffers_sit_on_huge_page_boundaries)
{
    const size_t big = (size_t)4 << 20;
    unsigned char *p = loomi_big_alloc(big), *q = loomi_big_alloc(100);
    cr_assert(p && q);
#ifdef MADV_HUGEPAGE
    cr_assert_eq((uintptr_t)p % ((size_t)2 << 20), 0, "%p", (void *)p);
#endif
    for (size_t i = 0; i < big; i += 4096) p[i] = (unsigned char)(i >> 12);
    memset(q, 7, 100);
    for (size_t i = 0; i < big; i += 4096) cr_assert_eq(p[i], (unsigned char)(i >> 12));
    free(p);
    free(q);
}

/* ------------------------------------------- selection across hosts */

#include "core/hostmap.h"
#include "topo/select.h"

/* Built-in figures, with shared memory between the host's ranks as
 * probed on some host: latency, per-byte transfer, copy and reduction. */
static void shm_links(struct loomi_links *l, double alpha, double beta, double gamma_copy,
                      double gamma)
{
    loomi_links_defaults(l, 1);
    l->alpha[LOOMI_LINK_INTRA] = alpha;
    l->beta[LOOMI_LINK_INTRA] = beta;
    l->gamma_copy = gamma_copy;
    l->gamma = gamma;
}

/* 2 hosts of 2 consecutive ranks, links with the given figures. */
static struct loomi_hostmap *two_by_two(struct loomi_links *l, const double shm[4],
                                        double inter_alpha, double inter_beta)
{
    const int host_of[4] = {0, 0, 1, 1};
    struct loomi_hostmap *hm = loomi_hostmap_build(4, host_of);
    cr_assert_not_null(hm);
    shm_links(l, shm[0], shm[1], shm[2], shm[3]);
    l->alpha[LOOMI_LINK_INTER] = inter_alpha;
    l->beta[LOOMI_LINK_INTER] = inter_beta;
    return hm;
}

/* The shape of a 2 x 2 job on 2-core hosts, with the default arenas,
 * chunks and streaming threshold. */
static struct loomi_job_shape two_by_two_job(struct loomi_hostmap *hm)
{
    struct loomi_job_shape j = {.hosts = hm, .nranks = 4, .cores_per_host = 2,
                                .shared_bytes = (size_t)4 << 20, .chunk_bytes = (size_t)2 << 20,
                                .stream_bytes = (size_t)64 << 20};
    return j;
}

/* The 2 x 2 job with a probe's figures {shm alpha, beta, tcp alpha,
 * beta} and reduction cost gamma (copies 0.018 ns/B). */
static struct loomi_hostmap *probed_two_by_two(const double fig[4], double gamma,
                                               struct loomi_links *l, struct loomi_job_shape *j)
{
    const double shm[4] = {fig[0], fig[1], gamma, 0.018e-9};
    struct loomi_hostmap *hm = two_by_two(l, shm, fig[2], fig[3]);
    *j = two_by_two_job(hm);
    return hm;
}

/* 2 hosts of per_host consecutive ranks; both links 1 us, the network
 * 10x slower than shared memory (1 ns a byte); m as flat over one link. */
static struct loomi_hostmap *two_hosts(int per_host, struct loomi_links *l,
                                       struct loomi_job_shape *j, struct loomi_model_params *m)
{
    int host_of[64];
    cr_assert(2 * per_host <= 64);
    for (int r = 0; r < 2 * per_host; r++) host_of[r] = r / per_host;
    struct loomi_hostmap *hm = loomi_hostmap_build(2 * per_host, host_of);
    cr_assert_not_null(hm);
    loomi_links_defaults(l, 1);
    l->alpha[LOOMI_LINK_INTRA] = 1e-6;
    l->alpha[LOOMI_LINK_INTER] = 1e-6;
    l->beta[LOOMI_LINK_INTRA] = 0.1e-9;
    l->beta[LOOMI_LINK_INTER] = 1e-9;
    *j = (struct loomi_job_shape){.hosts = hm, .nranks = 2 * per_host,
                                  .shared_bytes = (size_t)4 << 20, .chunk_bytes = (size_t)2 << 20};
    *m = defaults();
    m->alpha = 1e-6;
    m->gamma = l->gamma;
    m->gamma_copy = l->gamma_copy;
    m->chunk_bytes = j->chunk_bytes;
    return hm;
}

/* The cost select.c gives a flat algorithm on two_hosts() equals the
 * model's over one link whose beta mixes the inner link's (share w of the
 * bytes) with the outer one's, shared by `share` ranks crossing at once. */
static void expect_weighted(int coll, int algo, size_t n, const struct loomi_job_shape *j,
                            const struct loomi_links *l, struct loomi_model_params *m, double w,
                            double share, const char *what)
{
    m->beta = w * 0.1e-9 + (1 - w) * 1e-9 * share;
    double want = loomi_model_time(coll, algo, j->nranks, n, m);
    double got = loomi_select_cost(coll, algo, n, j, l);
    cr_expect(want > 0 && fabs(got - want) <= 1e-3 * want,
              "%s %s%s: %g s, want %g s (inner share of the bytes %.2f, %g to a link)",
              loomi_coll_name(coll), loomi_algo_name(algo), what, got, want, w, share);
}

/* 2 hosts x 2 consecutive ranks, the network 10x slower than shared
 * memory: recursive doubling's allgather and halving-doubling send one of
 * their three blocks inside the host and two across, so their time per
 * byte is a third of the inner link's plus two thirds of the outer's;
 * recursive doubling's allreduce sends the whole vector in each of its
 * two rounds, one inside and one across: half and half. */
Test(model, flat_recursive_algorithms_weigh_links_by_bytes)
{
    struct loomi_links l;
    struct loomi_job_shape j;
    struct loomi_model_params m;
    struct loomi_hostmap *hm = two_hosts(2, &l, &j, &m);
    const size_t n = (size_t)32 << 20;
    /* The crossing rounds of the reductions carry both ranks of a host
     * over its link at once: twice the inter-host beta; the allgather's
     * half of that share more (select.c says why). */
    const struct {
        int coll, algo;
        double w;     /* the inner link's share of the bytes */
        double share; /* ranks of a host crossing together */
    } c[] = {
        {LOOMI_COLL_ALLGATHER, LOOMI_ALGO_RECURSIVE_DOUBLING, 1.0 / 3, 1.5},
        {LOOMI_COLL_REDUCE_SCATTER, LOOMI_ALGO_HALVING_DOUBLING, 1.0 / 3, 2},
        {LOOMI_COLL_ALLREDUCE, LOOMI_ALGO_HALVING_DOUBLING, 1.0 / 3, 2},
        {LOOMI_COLL_ALLREDUCE, LOOMI_ALGO_RECURSIVE_DOUBLING, 0.5, 2},
    };
    for (size_t k = 0; k < sizeof c / sizeof c[0]; k++)
        expect_weighted(c[k].coll, c[k].algo, n, &j, &l, &m, c[k].w, c[k].share, "");
    free(hm);
}

/* 2 hosts x 8 ranks whose ranks each opened their own NIC for RDMA, 4
 * NICs a host: the crossing rounds share a NIC between 2 ranks, not the
 * host's link between 8.  Over TCP (the probe found it faster), or with
 * some rank on no NIC of its own, all 8 share it. */
Test(model, crossing_ranks_share_their_nics)
{
    struct loomi_links l;
    struct loomi_job_shape j;
    struct loomi_model_params m;
    struct loomi_hostmap *hm = two_hosts(8, &l, &j, &m);
    const size_t n = (size_t)32 << 20;
    const struct {
        int nics, verbs_compared, inter_verbs;
        double share; /* ranks crossing through one link */
    } cases[] = {{4, 0, 0, 2}, {4, 1, 1, 2}, {4, 1, 0, 8}, {0, 0, 0, 8}, {3, 0, 0, 3}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        j.nics_per_host = cases[k].nics;
        l.verbs_compared = cases[k].verbs_compared;
        l.inter_verbs = cases[k].inter_verbs;
        char what[64];
        snprintf(what, sizeof what, ", %d NICs (verbs compared %d, chosen %d)", cases[k].nics,
                 cases[k].verbs_compared, cases[k].inter_verbs);
        /* halving-doubling: 7 of a rank's 15 blocks stay inside the host */
        expect_weighted(LOOMI_COLL_ALLREDUCE, LOOMI_ALGO_HALVING_DOUBLING, n, &j, &l, &m, 7.0 / 15,
                        cases[k].share, what);
    }
    free(hm);
}

/* The shared-arena allreduce on one host against the flat ones, with the
 * figures probed on this 2-core VM with 4 ranks (beta 0.3 ns/B, a copy
 * 0.2 ns/B, a reduction 0.15 ns/B): its copies and reduction cover the
 * vector once whatever its rounds of half an arena, so a vector just
 * over one round costs about as much as one of it, not two; and the
 * flat algorithms' transfers through shared memory are copies by the
 * cores as well, so they cannot beat its fewer copies at large sizes
 * (measured: shared 0.75-0.9 of the best flat one from 128K to 64M). */
Test(model, shared_allreduce_against_flat_on_one_host)
{
    const int host_of[4] = {0, 0, 0, 0};
    struct loomi_hostmap *hm = loomi_hostmap_build(4, host_of);
    cr_assert_not_null(hm);
    struct loomi_links l;
    shm_links(&l, 3e-6, 0.3e-9, 0.2e-9, 0.15e-9);
    const size_t R = (size_t)2 << 20; /* half the 4M arena */
    struct loomi_job_shape j = {.hosts = hm, .nranks = 4, .cores_per_host = 2,
                                .shared_bytes = 2 * R, .chunk_bytes = (size_t)2 << 20};
    const int AR = LOOMI_COLL_ALLREDUCE;
    double one = loomi_select_cost(AR, LOOMI_ALGO_SHARED, R, &j, &l);
    double more = loomi_select_cost(AR, LOOMI_ALGO_SHARED, R + R / 4, &j, &l);
    cr_assert(one > 0 && more < 1.3 * one, "shared: %g s at 2M but %g s at 2.5M", one, more);
    for (size_t n = (size_t)256 << 10; n <= (size_t)64 << 20; n *= 2) {
        double sh = loomi_select_cost(AR, LOOMI_ALGO_SHARED, n, &j, &l);
        const int flat[] = {LOOMI_ALGO_RING, LOOMI_ALGO_HALVING_DOUBLING,
                            LOOMI_ALGO_RECURSIVE_DOUBLING};
        for (size_t k = 0; k < sizeof flat / sizeof flat[0]; k++) {
            double t = loomi_select_cost(AR, flat[k], n, &j, &l);
            cr_assert(sh > 0 && t > sh, "%zu B: %s %g s < shared %g s", n,
                      loomi_algo_name(flat[k]), t, sh);
        }
    }
    free(hm);
}

/* A flat broadcast on one host copies each byte its ranks receive
 * twice, into a cell and out (or once by the kernel, no faster), which
 * the alpha-beta terms leave out: with this host's figures for 2 ranks,
 * each on a core of its own, the tree must lose to shared from 32M (2
 * ranks, 64M: tree 21.7 ms, scatter-allgather 21.3, shared 12.3) and
 * win at 1M (97.6 us against 162.8). */
Test(model, flat_broadcast_pays_its_copies_on_one_host)
{
    const int host_of[2] = {0, 0};
    struct loomi_hostmap *hm = loomi_hostmap_build(2, host_of);
    cr_assert_not_null(hm);
    struct loomi_links l;
    shm_links(&l, 0.62e-6, 0.106e-9, 0.072e-9, 0.073e-9);
    struct loomi_job_shape j = {.hosts = hm, .nranks = 2, .cores_per_host = 2,
                                .shared_bytes = (size_t)4 << 20, .chunk_bytes = (size_t)2 << 20,
                                .stream_bytes = (size_t)64 << 20, .machine_ranks = 2};
    const int BC = LOOMI_COLL_BROADCAST;
    for (size_t n = (size_t)32 << 20; n <= (size_t)64 << 20; n *= 2) {
        double sh = loomi_select_cost(BC, LOOMI_ALGO_SHARED, n, &j, &l);
        double tr = loomi_select_cost(BC, LOOMI_ALGO_TREE, n, &j, &l);
        double sag = loomi_select_cost(BC, LOOMI_ALGO_SCATTER_ALLGATHER, n, &j, &l);
        cr_assert(sh > 0 && sh < tr && sh < sag, "%zu B: shared %g s, tree %g, s-ag %g", n, sh,
                  tr, sag);
    }
    const size_t m = (size_t)1 << 20;
    cr_assert_lt(loomi_select_cost(BC, LOOMI_ALGO_TREE, m, &j, &l),
                 loomi_select_cost(BC, LOOMI_ALGO_SHARED, m, &j, &l));
    free(hm);
}

/* The shared allreduce's three synchronisations of all the host's ranks
 * wait for every one of them to run: with 4 ranks on 2 cores they cost
 * about twice what the pairwise ping-pong suggests.  With the figures
 * probed on such a host, halving-doubling measured 10-30% faster from 16K
 * to 64K, and shared from 256K on (2 cores: 4 ranks; 4 cores: no wait). */
/* 4 ranks on one host of 2 cores, with this VM's probed figures. */
static struct loomi_hostmap *four_ranks_here(struct loomi_links *l, struct loomi_job_shape *j)
{
    const int host_of[4] = {0, 0, 0, 0};
    struct loomi_hostmap *hm = loomi_hostmap_build(4, host_of);
    cr_assert_not_null(hm);
    shm_links(l, 1.24e-6, 0.098e-9, 0.068e-9, 0.068e-9);
    *j = (struct loomi_job_shape){.hosts = hm, .nranks = 4, .cores_per_host = 2,
                                  .shared_bytes = (size_t)4 << 20, .chunk_bytes = (size_t)1 << 20};
    return hm;
}

Test(model, shared_syncs_wait_for_turns_on_the_cores)
{
    struct loomi_links l;
    struct loomi_job_shape j;
    struct loomi_hostmap *hm = four_ranks_here(&l, &j);
    const int AR = LOOMI_COLL_ALLREDUCE;
    for (size_t n = (size_t)16 << 10; n <= (size_t)64 << 10; n *= 2) {
        double hd = loomi_select_cost(AR, LOOMI_ALGO_HALVING_DOUBLING, n, &j, &l);
        double sh = loomi_select_cost(AR, LOOMI_ALGO_SHARED, n, &j, &l);
        cr_assert(hd > 0 && sh > hd, "%zu B: shared %g s < halving-doubling %g s", n, sh, hd);
    }
    for (size_t n = (size_t)256 << 10; n <= (size_t)4 << 20; n *= 2) {
        double hd = loomi_select_cost(AR, LOOMI_ALGO_HALVING_DOUBLING, n, &j, &l);
        double sh = loomi_select_cost(AR, LOOMI_ALGO_SHARED, n, &j, &l);
        cr_assert(sh > 0 && sh < hd, "%zu B: shared %g s > halving-doubling %g s", n, sh, hd);
    }
    /* One rank to a core: nobody waits for a turn. */
    j.cores_per_host = 4;
    double with = loomi_select_cost(AR, LOOMI_ALGO_SHARED, 8, &j, &l);
    j.cores_per_host = 2;
    double without = loomi_select_cost(AR, LOOMI_ALGO_SHARED, 8, &j, &l);
    cr_assert(without > 1.9 * with, "8 B: %g s on 2 cores, %g s on 4", without, with);
    free(hm);
}

/* A probe that ran while the VM's two CPUs sat close (a cache line
 * handed over in 110-130 ns, not 450-550) halves the shm beta, and the
 * table then gave halving-doubling and the ring sizes where shared was
 * measured 1.6-1.9 times faster (jobs of this session, 4 ranks: 512K
 * halving-doubling 172-176 us against shared's 100-109, 2M 729-769
 * against 383-441).  tune.c fits beta to the message algorithm it timed;
 * with the 172 us, every size from 512K is shared's again. */
Test(model, timing_raises_a_probe_beta_too_low_for_the_collectives)
{
    struct loomi_links l;
    struct loomi_job_shape j;
    const int host_of[4] = {0, 0, 0, 0};
    struct loomi_hostmap *hm = loomi_hostmap_build(4, host_of);
    cr_assert_not_null(hm);
    /* Figures probed in such a job (and a common one's beta below). */
    shm_links(&l, 7.75e-6, 0.046e-9, 0.025e-9, 0.027e-9);
    l.source[LOOMI_LINK_INTRA] = LOOMI_SRC_MEASURED;
    j = (struct loomi_job_shape){.hosts = hm, .nranks = 4, .cores_per_host = 2,
                                 .machine_ranks = 4, .shared_bytes = (size_t)4 << 20,
                                 .chunk_bytes = (size_t)2 << 20, .stream_bytes = (size_t)64 << 20};
    const int AR = LOOMI_COLL_ALLREDUCE, HD = LOOMI_ALGO_HALVING_DOUBLING;
    const size_t k512 = (size_t)512 << 10;
    struct loomi_selection sel;
    loomi_select_build(&sel, &j, &l);
    int off = 0; /* sizes from 512K that the low beta gives to others */
    for (size_t n = k512; n <= (size_t)64 << 20; n += n / 2)
        off += loomi_select_lookup(&sel, AR, n) != LOOMI_ALGO_SHARED;
    cr_expect(off > 0, "the low beta no longer misleads the model: the test shows nothing");
    /* As the model predicts, within the margin, or faster: kept. */
    const double est = loomi_select_cost(AR, HD, k512, &j, &l);
    cr_expect_eq(loomi_select_fit_beta(AR, HD, k512, &j, &l, 1.04 * est, 1.05), 0);
    cr_expect_eq(loomi_select_fit_beta(AR, HD, k512, &j, &l, 0.5 * est, 1.05), 0);
    /* Measured slower: beta rises until the estimate gives that time. */
    const double took = 172e-6;
    double nb = loomi_select_fit_beta(AR, HD, k512, &j, &l, took, 1.05);
    cr_assert(nb > 0.046e-9, "beta %g, not raised", nb);
    struct loomi_links x = l;
    x.beta[LOOMI_LINK_INTRA] = nb;
    double fit = loomi_select_cost(AR, HD, k512, &j, &x);
    cr_expect(fit >= took && fit < 1.01 * took, "fitted estimate %g s against %g", fit, took);
    loomi_select_build(&sel, &j, &x);
    for (size_t n = k512; n <= (size_t)64 << 20; n += n / 2) {
        int got = loomi_select_lookup(&sel, AR, n);
        cr_expect_eq(got, LOOMI_ALGO_SHARED, "%zu B: %s after the fit", n, loomi_algo_name(got));
    }
    /* A common job's probe (beta 0.09), timed as the model predicts: kept. */
    shm_links(&l, 6.28e-6, 0.097e-9, 0.022e-9, 0.024e-9);
    const double est2 = loomi_select_cost(AR, HD, (size_t)256 << 10, &j, &l);
    cr_expect_eq(loomi_select_fit_beta(AR, HD, (size_t)256 << 10, &j, &l, est2, 1.05), 0);
    free(hm);
}

/* 2 ranks on one host of 2 cores, with this VM's probed figures. */
static struct loomi_hostmap *two_ranks_here(struct loomi_links *l, struct loomi_job_shape *j)
{
    const int host_of[2] = {0, 0};
    struct loomi_hostmap *hm = loomi_hostmap_build(2, host_of);
    cr_assert_not_null(hm);
    shm_links(l, 0.5e-6, 0.095e-9, 0.068e-9, 0.068e-9);
    *j = (struct loomi_job_shape){.hosts = hm, .nranks = 2, .cores_per_host = 2,
                                  .shared_bytes = (size_t)4 << 20,
                                  .chunk_bytes = (size_t)2 << 20,
                                  .stream_bytes = (size_t)64 << 20};
    return hm;
}

/* 2 ranks on one host, the figures probed here: the algorithms' CPU work
 * decides from a few MiB.  The ring, the tree and halving-doubling do the
 * same work and measured within 10% of each other; recursive doubling
 * reads its input twice (1.22-1.8x the ring's time from 4M); past
 * LOOM_SHM_STREAM the shared allreduce streams its results and measured
 * 1.2-1.4x faster than the best of them (32M, 64M), below it 3-15%
 * slower. */
Test(model, shared_streams_where_the_caches_cannot_keep_the_vectors)
{
    struct loomi_links l;
    struct loomi_job_shape j;
    struct loomi_hostmap *hm = two_ranks_here(&l, &j);
    const int AR = LOOMI_COLL_ALLREDUCE;
    const int flat[] = {LOOMI_ALGO_RING, LOOMI_ALGO_TREE, LOOMI_ALGO_HALVING_DOUBLING,
                        LOOMI_ALGO_RECURSIVE_DOUBLING};
    for (size_t n = (size_t)1 << 20; n <= (size_t)64 << 20; n *= 2) {
        double sh = loomi_select_cost(AR, LOOMI_ALGO_SHARED, n, &j, &l), best = 1e30;
        for (size_t k = 0; k < sizeof flat / sizeof flat[0]; k++) {
            double t = loomi_select_cost(AR, flat[k], n, &j, &l);
            cr_assert(t > 0);
            if (t < best) best = t;
        }
        if (n >= (size_t)32 << 20)
            cr_assert(sh < best, "%zu B streamed: shared %g s, best flat %g s", n, sh, best);
        else
            cr_assert(sh > best, "%zu B: shared %g s, best flat %g s", n, sh, best);
        double rd = loomi_select_cost(AR, LOOMI_ALGO_RECURSIVE_DOUBLING, n, &j, &l);
        double ring = loomi_select_cost(AR, LOOMI_ALGO_RING, n, &j, &l);
        cr_assert(rd > 1.2 * ring, "%zu B: recursive doubling %g s, ring %g s", n, rd, ring);
    }
    /* Without streaming, no gain to show for it. */
    j.stream_bytes = 0;
    double sh = loomi_select_cost(AR, LOOMI_ALGO_SHARED, (size_t)64 << 20, &j, &l);
    double tree = loomi_select_cost(AR, LOOMI_ALGO_TREE, (size_t)64 << 20, &j, &l);
    cr_assert(sh > tree, "64M unstreamed: shared %g s, tree %g s", sh, tree);
    free(hm);
}

/* 2 hosts x 2 ranks, the figures probed over veth between namespaces:
 * the shared allreduce's rounds pipeline (one round's slices cross the
 * hosts while the next is copied in and reduced), and measured 5-20%
 * faster than hierarchical from 8M to 64M; summing its phases, as for
 * hierarchical, had it slower at every size. */
Test(model, shared_rounds_overlap_the_rails)
{
    struct loomi_links l;
    const double shm[4] = {0.68e-6, 0.091e-9, 0.066e-9, 0.067e-9};
    struct loomi_hostmap *hm = two_by_two(&l, shm, 13.65e-6, 0.189e-9);
    struct loomi_job_shape j = two_by_two_job(hm);
    const int AR = LOOMI_COLL_ALLREDUCE;
    for (size_t n = (size_t)8 << 20; n <= (size_t)64 << 20; n *= 2) {
        double hi = loomi_select_cost(AR, LOOMI_ALGO_HIERARCHICAL, n, &j, &l);
        double sh = loomi_select_cost(AR, LOOMI_ALGO_SHARED, n, &j, &l);
        cr_assert(hi > 0 && sh > 0 && sh < hi, "%zu B: shared %g s, hierarchical %g s", n, sh,
                  hi);
    }
    /* One round (half an arena or less): nothing to overlap. */
    double one = loomi_select_cost(AR, LOOMI_ALGO_SHARED, (size_t)1 << 20, &j, &l);
    j.hosts = NULL;
    free(hm);
    const int one_host[2] = {0, 0};
    struct loomi_hostmap *h1 = loomi_hostmap_build(2, one_host);
    j.hosts = h1;
    j.nranks = 2;
    double intra = loomi_select_cost(AR, LOOMI_ALGO_SHARED, (size_t)1 << 20, &j, &l);
    cr_assert(one > intra, "1M on 2 x 2: %g s, not more than its part inside a host (%g s)",
              one, intra);
    free(h1);
}

/* Hierarchical reduce-scatter, allgather and alltoall on hosts that do
 * not hold runs of consecutive ranks copy all p blocks once more than
 * the flat ones (into SCRATCH, into rank order).  On 2 hosts x 2 whose
 * link is about as fast as a copy (veth between namespaces: the figures
 * probed there), that copy costs more than the crossing bytes it saves,
 * and the flat algorithms measured 15-45% faster from 512K; over
 * 1 Gbit/s the saving wins.  On hosts of consecutive ranks the phases
 * work in place, with no such copy: hierarchical costs less there. */
Test(model, hierarchical_pays_its_copies_unless_hosts_hold_runs)
{
    struct loomi_links l;
    const double shm[4] = {2e-6, 0.35e-9, 0.15e-9, 0.16e-9};
    struct loomi_hostmap *runs = two_by_two(&l, shm, 45e-6, 0.55e-9);
    const int alt_of[4] = {0, 1, 0, 1};
    struct loomi_hostmap *alt = loomi_hostmap_build(4, alt_of);
    cr_assert_not_null(alt);
    struct loomi_job_shape j = {.hosts = alt, .nranks = 4, .cores_per_host = 2,
                                .shared_bytes = (size_t)4 << 20, .chunk_bytes = (size_t)2 << 20};
    struct loomi_job_shape jr = j;
    jr.hosts = runs;
    struct loomi_selection sel;
    const int colls[] = {LOOMI_COLL_REDUCE_SCATTER, LOOMI_COLL_ALLGATHER, LOOMI_COLL_ALLTOALL};
    const int H = LOOMI_ALGO_HIERARCHICAL;
    loomi_select_build(&sel, &j, &l);
    for (size_t c = 0; c < 2; c++)
        for (size_t n = (size_t)512 << 10; n <= (size_t)64 << 20; n *= 2) {
            cr_assert_neq(loomi_select_lookup(&sel, colls[c], n), H,
                          "%s %zu B: hierarchical over a fast link", loomi_coll_name(colls[c]), n);
            /* The copy of p blocks (a core per rank here). */
            double copy = 4.0 * (double)n * l.gamma_copy;
            for (size_t k = 0; k < 3; k++) {
                double ta = loomi_select_cost(colls[k], H, n, &j, &l);
                double tr = loomi_select_cost(colls[k], H, n, &jr, &l);
                cr_assert(tr > 0 && tr < ta - copy * 0.9, "%s %zu B: runs %g s, interleaved %g s",
                          loomi_coll_name(colls[k]), n, tr, ta);
            }
        }
    l.beta[LOOMI_LINK_INTER] = 8e-9; /* 1 Gbit/s */
    loomi_select_build(&sel, &j, &l);
    for (size_t c = 0; c < 2; c++)
        for (size_t n = (size_t)512 << 10; n <= (size_t)64 << 20; n *= 2)
            cr_assert_eq(loomi_select_lookup(&sel, colls[c], n), H, "%s %zu B: %s over 1 Gbit/s",
                         loomi_coll_name(colls[c]), n,
                         loomi_algo_name(loomi_select_lookup(&sel, colls[c], n)));
    free(runs);
    free(alt);
}

/* Buffers in windows (2 ranks here): the shared allreduce reads the
 * peers' inputs where they are and pushes its slice into every RECV,
 * no copy-in, one zero-byte round less: 2.6 us at 64K, 0.30 ms at 4M,
 * against the ring's 9.5 us and 0.61 ms.  The window table takes it
 * from a few KiB on, where the plain table keeps it to the largest
 * sizes; and it costs every size less than the staged form. */
Test(model, windows_make_the_shared_allreduce_cheaper)
{
    struct loomi_links l;
    struct loomi_job_shape j;
    struct loomi_hostmap *hm = two_ranks_here(&l, &j);
    struct loomi_job_shape jw = j;
    jw.window = LOOMI_WINDOW_OUT;
    const int AR = LOOMI_COLL_ALLREDUCE, SH = LOOMI_ALGO_SHARED;
    for (size_t n = 8; n <= (size_t)64 << 20; n *= 4) {
        double staged = loomi_select_cost(AR, SH, n, &j, &l);
        double win = loomi_select_cost(AR, SH, n, &jw, &l);
        cr_assert(win > 0 && win < staged, "%zu B: window %g s, staged %g s", n, win, staged);
        /* The flat algorithms do not care. */
        cr_assert_float_eq(loomi_select_cost(AR, LOOMI_ALGO_RING, n, &jw, &l),
                           loomi_select_cost(AR, LOOMI_ALGO_RING, n, &j, &l), 1e-12);
    }
    struct loomi_selection sel;
    loomi_select_build(&sel, &j, &l);
    for (size_t n = (size_t)16 << 10; n <= (size_t)64 << 20; n *= 2) {
        cr_assert_eq(loomi_ranges_algo(&sel.window[0], n), SH, "%zu B: %s with windows", n,
                     loomi_algo_name(loomi_ranges_algo(&sel.window[0], n)));
        if (n <= (size_t)4 << 20)
            cr_assert_neq(loomi_select_lookup(&sel, AR, n), SH, "%zu B: shared without windows",
                          n);
    }
    /* 8 bytes: a latency, not a copy; recursive doubling's one round. */
    cr_assert_eq(loomi_ranges_algo(&sel.window[0], 8), LOOMI_ALGO_RECURSIVE_DOUBLING);
    free(hm);
}

/* In place with windows, 2 ranks here (ring against shared's window
 * form, in place): 64K 9 against 18 us, 512K 90 against 99, 1M 216
 * against 173, 4M 0.80 against 0.49 ms.  Shared saves what it overwrites
 * and reads lines its peer has just written; the others copy RECV aside
 * first, which only this table charges them. */
Test(model, windows_in_place_take_shared_from_a_megabyte)
{
    struct loomi_links l;
    struct loomi_job_shape j;
    struct loomi_hostmap *hm = two_ranks_here(&l, &j);
    struct loomi_job_shape out = j, in = j;
    out.window = LOOMI_WINDOW_OUT;
    in.window = LOOMI_WINDOW_IN;
    const int AR = LOOMI_COLL_ALLREDUCE, SH = LOOMI_ALGO_SHARED;
    for (size_t n = 8; n <= (size_t)64 << 20; n *= 4) {
        /* The copy aside, for every algorithm but shared. */
        double ring_out = loomi_select_cost(AR, LOOMI_ALGO_RING, n, &out, &l);
        double ring_in = loomi_select_cost(AR, LOOMI_ALGO_RING, n, &in, &l);
        cr_assert(ring_in > ring_out, "%zu B: ring in place %g s, out of place %g s", n, ring_in,
                  ring_out);
        cr_assert(loomi_select_cost(AR, SH, n, &in, &l) > loomi_select_cost(AR, SH, n, &out, &l),
                  "%zu B: shared in place no dearer than out of place", n);
    }
    struct loomi_selection sel;
    loomi_select_build(&sel, &j, &l);
    for (size_t n = (size_t)16 << 10; n <= (size_t)64 << 20; n *= 2) {
        int got = loomi_ranges_algo(&sel.window[1], n);
        if (n <= (size_t)512 << 10)
            cr_assert_neq(got, SH, "%zu B in place: shared", n);
        else if (n >= (size_t)2 << 20)
            cr_assert_eq(got, SH, "%zu B in place: %s", n, loomi_algo_name(got));
        /* Out of place, the window table stands. */
        cr_assert_eq(loomi_ranges_algo(&sel.window[0], n), SH);
    }
    free(hm);
}

/* 2 hosts x 2 over veth on a VM whose shared memory answers in 8-10 us
 * (an AMD EPYC, 2 cores), with figures its probe gave in three jobs:
 * select_check.sh measured the allgather's recursive doubling faster up
 * to 16K a rank (49.4 against hierarchical's 55.2 us at 16K) and
 * hierarchical from 64K (88.7-97.5 against 108.8-112.3 us). */
Test(model, two_hosts_of_two_over_veth_slow_shm)
{
    const double figs[][4] = {/* shm alpha, beta; tcp alpha, beta */
                              {8.85e-6, 0.093e-9, 22.98e-6, 0.335e-9},
                              {8.87e-6, 0.124e-9, 23.76e-6, 0.282e-9},
                              {8.23e-6, 0.090e-9, 17.86e-6, 0.235e-9}};
    for (size_t f = 0; f < sizeof figs / sizeof figs[0]; f++) {
        struct loomi_links l;
        struct loomi_job_shape j;
        struct loomi_hostmap *hm = probed_two_by_two(figs[f], 0.017e-9, &l, &j);
        struct loomi_selection sel;
        loomi_select_build(&sel, &j, &l);
        const int small = loomi_select_lookup(&sel, LOOMI_COLL_ALLGATHER, (size_t)16 << 10);
        const int big = loomi_select_lookup(&sel, LOOMI_COLL_ALLGATHER, (size_t)64 << 10);
        cr_expect_eq(small, LOOMI_ALGO_RECURSIVE_DOUBLING, "figures %zu: allgather 16K a rank: %s",
                     f, loomi_algo_name(small));
        cr_expect_eq(big, LOOMI_ALGO_HIERARCHICAL, "figures %zu: allgather 64K a rank: %s", f,
                     loomi_algo_name(big));
        free(hm);
    }
}

/* 2 hosts x 2 in network namespaces of one 2-core VM (AMD EPYC, shared
 * memory answering in 8-13 us), with two of its probes' figures: the
 * shared allreduce's syncs wait for all 4 ranks' turns on the 2 cores.
 * select_check.sh measured hierarchical faster up to 256K (191.8 against
 * shared's 211.8 us) and shared from 512K (354 against 403).  Counted
 * per host (2 ranks, 2 cores: no turns), shared came from 64K. */
Test(model, hosts_faked_on_one_machine_share_its_cores)
{
    const double figs[][4] = {/* shm alpha, beta; tcp alpha, beta */
                              {7.71e-6, 0.097e-9, 18.54e-6, 0.198e-9},
                              {13.29e-6, 0.099e-9, 18.16e-6, 0.179e-9}};
    const int AR = LOOMI_COLL_ALLREDUCE;
    for (size_t f = 0; f < sizeof figs / sizeof figs[0]; f++) {
        struct loomi_links l;
        struct loomi_job_shape j;
        struct loomi_hostmap *hm = probed_two_by_two(figs[f], 0.019e-9, &l, &j);
        struct loomi_selection sel;
        j.machine_ranks = 4;
        loomi_select_build(&sel, &j, &l);
        for (size_t n = (size_t)64 << 10; n <= (size_t)256 << 10; n *= 2) {
            int got = loomi_select_lookup(&sel, AR, n);
            cr_expect_neq(got, LOOMI_ALGO_SHARED, "figures %zu, one machine: %zu B shared", f, n);
        }
        int big = loomi_select_lookup(&sel, AR, (size_t)2 << 20);
        cr_expect_eq(big, LOOMI_ALGO_SHARED, "figures %zu, one machine: 2M %s", f,
                     loomi_algo_name(big));
        /* Two real machines: no turns to wait for. */
        j.machine_ranks = 2;
        loomi_select_build(&sel, &j, &l);
        int mid = loomi_select_lookup(&sel, AR, (size_t)256 << 10);
        cr_expect_eq(mid, LOOMI_ALGO_SHARED, "figures %zu, two machines: 256K %s", f,
                     loomi_algo_name(mid));
        free(hm);
    }
}

/* The alltoall on 2 hosts x 2 ranks faked on one 2-core machine, with
 * figures its probe gave in jobs where select_check.sh measured (per
 * peer): hierarchical faster up to 32K (46-49 against pairwise's 59-63
 * us for 8 bytes; 78-85 against 81-90 at 32K), pairwise from 128K
 * (201-241 against 289-325 us), bruck never (57-61 us for 8 bytes).
 * There the runs' copies take turns with the other host's ranks and no
 * longer hide behind the rail, and bruck's crossing rounds pay the
 * turns; on two machines of 2 cores neither applies. */
Test(model, alltoall_on_hosts_faked_on_one_machine)
{
    const double figs[][4] = {/* shm alpha, beta; tcp alpha, beta */
                              {14.51e-6, 0.090e-9, 17.60e-6, 0.312e-9},
                              {10.88e-6, 0.088e-9, 18.06e-6, 0.326e-9},
                              {13.14e-6, 0.066e-9, 17.47e-6, 0.316e-9},
                              {9.21e-6, 0.114e-9, 24.91e-6, 0.253e-9},
                              {7.66e-6, 0.088e-9, 18.36e-6, 0.428e-9}};
    const int A2A = LOOMI_COLL_ALLTOALL;
    for (size_t f = 0; f < sizeof figs / sizeof figs[0]; f++) {
        struct loomi_links l;
        struct loomi_job_shape j;
        struct loomi_hostmap *hm = probed_two_by_two(figs[f], 0.023e-9, &l, &j);
        struct loomi_selection sel;
        j.machine_ranks = 4;
        loomi_select_build(&sel, &j, &l);
        const struct {
            size_t bytes;
            int algo;
        } want[] = {{8, LOOMI_ALGO_HIERARCHICAL},
                    {2048, LOOMI_ALGO_HIERARCHICAL},
                    {(size_t)32 << 10, LOOMI_ALGO_HIERARCHICAL},
                    {(size_t)128 << 10, LOOMI_ALGO_PAIRWISE},
                    {(size_t)1 << 20, LOOMI_ALGO_PAIRWISE}};
        for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
            int got = loomi_select_lookup(&sel, A2A, want[k].bytes);
            cr_expect_eq(got, want[k].algo, "figures %zu: %zu B a peer: %s, want %s", f,
                         want[k].bytes, loomi_algo_name(got), loomi_algo_name(want[k].algo));
        }
        /* Bruck's two rounds: the first half crossing, the second all:
         * one latency and two. */
        const double ao = figs[f][2];
        double br = loomi_select_cost(A2A, LOOMI_ALGO_BRUCK, 8, &j, &l);
        cr_expect(br > 2.95 * ao && br < 3.2 * ao, "figures %zu: bruck %g s, want about 3 x %g",
                  f, br, ao);
        /* The hierarchical one: the runs' bytes at twice the shm beta,
         * the own run's after the rail's. */
        const size_t big = (size_t)1 << 20;
        double h4 = loomi_select_cost(A2A, LOOMI_ALGO_HIERARCHICAL, big, &j, &l);
        /* Two machines of 2 cores: one latency a round, and the own run
         * behind the rail. */
        j.machine_ranks = 2;
        double br2 = loomi_select_cost(A2A, LOOMI_ALGO_BRUCK, 8, &j, &l);
        cr_expect(br2 > 1.95 * ao && br2 < 2.2 * ao, "figures %zu: bruck %g s on two machines",
                  f, br2);
        double h2 = loomi_select_cost(A2A, LOOMI_ALGO_HIERARCHICAL, big, &j, &l);
        /* At least the two runs' 1M a peer at the shm beta once more. */
        cr_expect(h4 - h2 > 1.8 * figs[f][1] * (double)big, "figures %zu: %g s against %g", f,
                  h4, h2);
        free(hm);
    }
}

/* ----------------------------------------------------------- near-ties */

/* The near-tie that the table of coll marks at `bytes`, or NULL. */
static const struct loomi_tie *tie_at(const struct loomi_selection *sel, int coll, size_t bytes)
{
    const struct loomi_ties *ts = &sel->ties[coll];
    for (int i = 0; i < ts->n; i++)
        if (ts->t[i].from <= bytes && (!ts->t[i].to || bytes < ts->t[i].to)) return &ts->t[i];
    return NULL;
}

/* The estimate as best_algo() weighs it: phased algorithms across hosts
 * at cost / 0.9 (select.c's PHASED_MARGIN). */
static double weighed(double t, int algo, const struct loomi_job_shape *j)
{
    const int phased = (algo == LOOMI_ALGO_HIERARCHICAL || algo == LOOMI_ALGO_SHARED) &&
                       j->hosts && j->hosts->nhosts > 1;
    return t >= 0 && phased ? t / 0.9 : t;
}

/* 2 x 2 with the veth figures of two_hosts_of_two_over_veth (inter beta
 * 0.19 ns/B): at 32K a peer the alltoall's hierarchical estimate is the
 * least, pairwise's within 10% of it; doubled, beta raises
 * hierarchical's more (its inter-host messages are larger), and the
 * table takes pairwise and marks the near-tie. */
Test(model, near_tie_goes_to_the_better_worst_case)
{
    struct loomi_links l;
    const double shm[4] = {1.3e-6, 0.094e-9, 0.068e-9, 0.067e-9};
    struct loomi_hostmap *hm = two_by_two(&l, shm, 4.4e-6, 0.19e-9);
    struct loomi_job_shape j = two_by_two_job(hm);
    const int A2A = LOOMI_COLL_ALLTOALL, PW = LOOMI_ALGO_PAIRWISE, HI = LOOMI_ALGO_HIERARCHICAL;
    const size_t n = (size_t)32 << 10;
    const double tp = weighed(loomi_select_cost(A2A, PW, n, &j, &l), PW, &j);
    const double th = weighed(loomi_select_cost(A2A, HI, n, &j, &l), HI, &j);
    const double wp = weighed(loomi_select_worst(A2A, PW, n, &j, &l), PW, &j);
    const double wh = weighed(loomi_select_worst(A2A, HI, n, &j, &l), HI, &j);
    /* The premise: hierarchical the least, pairwise near, better worst. */
    cr_assert(th < tp && tp <= th * (1 + LOOMI_TIE_NEAR), "pairwise %g, hierarchical %g s", tp, th);
    cr_assert_lt(wp, wh * 0.99);
    for (int a = 1; a < LOOMI_NUM_ALGOS; a++) {
        const double t = weighed(loomi_select_cost(A2A, a, n, &j, &l), a, &j);
        if (a != PW && a != HI && loomi_algo_gen(A2A, a) && t >= 0)
            cr_assert_gt(t, th * (1 + LOOMI_TIE_NEAR), "%s is near too", loomi_algo_name(a));
    }
    struct loomi_selection sel;
    loomi_select_build(&sel, &j, &l);
    cr_expect_eq(loomi_select_lookup(&sel, A2A, n), PW, "chose %s",
                 loomi_algo_name(loomi_select_lookup(&sel, A2A, n)));
    const struct loomi_tie *t = tie_at(&sel, A2A, n);
    cr_assert_not_null(t, "the near-tie at 32K is not marked");
    cr_expect_eq(t->chosen, PW);
    cr_expect_eq(t->other, HI);
    cr_expect(t->from <= n && t->to > n);
    cr_expect(t->ratio >= tp / th - 1e-9 && t->ratio <= 1 + LOOMI_TIE_NEAR, "ratio %g", t->ratio);
    cr_expect(t->worst <= wp / wh + 1e-9 && t->worst < 1, "worst %g", t->worst);
    char line[160];
    loomi_tie_format(line, sizeof line, t);
    cr_expect(strstr(line, "tie: pairwise 1.") && strstr(line, "x hierarchical; chose pairwise, "
                                                                  "worst case 0."),
              "%s", line);
    char buf[4096];
    FILE *f = fmemopen(buf, sizeof buf, "w");
    cr_assert_not_null(f);
    loomi_select_print(f, &sel);
    fclose(f);
    cr_expect(strstr(buf, line) != NULL, "the printed table lacks \"%s\":\n%s", line, buf);
    /* Not tied: 8 bytes, hierarchical the least by far. */
    cr_expect_eq(loomi_select_lookup(&sel, A2A, 8), HI);
    cr_expect_null(tie_at(&sel, A2A, 8));
    free(hm);
}

/* Every entry of several tables obeys the rule: where no near-tie is
 * marked the choice is the least estimate (to rounding), where one is,
 * the chosen one's estimate is within LOOMI_TIE_NEAR of the least and
 * its worst case is the best of those within it.  And the table is a
 * function of the links and the shape alone: built again from copies of
 * them (another rank, given rank 0's links), it is the same, byte for
 * byte. */
Test(model, near_ties_follow_the_rule_and_every_rank_builds_the_same)
{
    const double betas[] = {0.14e-9, 0.19e-9, 0.28e-9};
    for (int shape = 0; shape < 4; shape++) {
        struct loomi_links l;
        struct loomi_hostmap *hm;
        struct loomi_job_shape j;
        if (shape < 3) {
            const double shm[4] = {1.3e-6, 0.094e-9, 0.068e-9, 0.067e-9};
            hm = two_by_two(&l, shm, 4.4e-6, betas[shape]);
            j = two_by_two_job(hm);
        } else {
            const int host_of[4] = {0, 0, 0, 0};
            hm = loomi_hostmap_build(4, host_of);
            cr_assert_not_null(hm);
            loomi_links_defaults(&l, 1);
            j = (struct loomi_job_shape){.hosts = hm, .nranks = 4, .cores_per_host = 2,
                                         .shared_bytes = (size_t)4 << 20,
                                         .chunk_bytes = (size_t)2 << 20,
                                         .stream_bytes = (size_t)64 << 20};
        }
        struct loomi_selection sel;
        loomi_select_build(&sel, &j, &l);
        int ties = 0;
        for (int c = 0; c < LOOMI_NUM_COLLS; c++) {
            ties += sel.ties[c].n;
            for (int k = 0; k <= 60; k++) {
                if (k == 1) continue;
                const size_t n = k % 2 ? (size_t)3 << (k / 2 - 1) : (size_t)1 << (k / 2);
                double least = -1;
                for (int a = 1; a < LOOMI_NUM_ALGOS; a++) {
                    const double t = weighed(loomi_select_cost(c, a, n, &j, &l), a, &j);
                    if (loomi_algo_gen(c, a) && t >= 0 && (least < 0 || t < least)) least = t;
                }
                if (least < 0) continue;
                const int got = loomi_select_lookup(&sel, c, n);
                const double tg = weighed(loomi_select_cost(c, got, n, &j, &l), got, &j);
                const struct loomi_tie *tie = tie_at(&sel, c, n);
                if (!tie || tie->chosen != got) {
                    cr_expect_leq(tg, least * (1 + 1e-9), "shape %d, %s at %zu B: %s unmarked",
                                  shape, loomi_coll_name(c), n, loomi_algo_name(got));
                    continue;
                }
                cr_expect_leq(tg, least * (1 + LOOMI_TIE_NEAR) * (1 + 1e-9));
                const double wg = weighed(loomi_select_worst(c, got, n, &j, &l), got, &j);
                for (int a = 1; a < LOOMI_NUM_ALGOS; a++) {
                    const double t = weighed(loomi_select_cost(c, a, n, &j, &l), a, &j);
                    if (a == got || !loomi_algo_gen(c, a) || t < 0 ||
                        t > least * (1 + LOOMI_TIE_NEAR))
                        continue;
                    const double w = weighed(loomi_select_worst(c, a, n, &j, &l), a, &j);
                    cr_expect_leq(wg, w * (1 + 0.01) + 1e-15,
                                  "shape %d, %s at %zu B: %s's worst %g, %s's %g", shape,
                                  loomi_coll_name(c), n, loomi_algo_name(got), wg,
                                  loomi_algo_name(a), w);
                }
            }
        }
        cr_expect_gt(ties, 0, "shape %d: no near-tie anywhere", shape);
        /* Another rank: its own copies of the same inputs. */
        struct loomi_links l2;
        memcpy(&l2, &l, sizeof l);
        struct loomi_job_shape j2 = j;
        struct loomi_selection *sel2 = malloc(sizeof *sel2);
        cr_assert_not_null(sel2);
        memset(sel2, 0xa5, sizeof *sel2);
        loomi_select_build(sel2, &j2, &l2);
        cr_expect(memcmp(&sel, sel2, sizeof sel) == 0, "shape %d: two builds differ", shape);
        free(sel2);
        free(hm);
    }
}

/* 2 hosts x 2 over veth on this 2-core VM, with the figures its probe
 * gives (the inter-host beta varies from job to job, 0.14-0.28 ns/B),
 * against what select_check.sh measured there:
 *   - allgather: recursive doubling's two messages beat hierarchical's
 *     three up to 16K a rank (9.6 against 11.7 us for 8 bytes), which
 *     wins from 64K a rank (350 against 752 us at 256K);
 *   - alltoall: hierarchical up to 32K a peer (37-40 against 41.5-42
 *     us there), pairwise (18 us for 8 bytes: its crossing messages do
 *     not overlap) from 64K a peer; at 32K the model's two estimates
 *     are a near-tie, which goes to pairwise's better worst case
 *     (near_tie_goes_to_the_better_worst_case): up to 12% slower there
 *     as measured then;
 *   - allreduce and reduce-scatter: halving-doubling, whose ranks all
 *     cross at once, never past 64K (allreduce 512K: 454 us against
 *     shared's 288; reduce-scatter 128K a rank: 222 against 186);
 *   - reduce-scatter of 2K a rank: halving-doubling's two messages
 *     (13.4 us) beat hierarchical's three reduce-scatters (14.8). */
Test(model, two_hosts_of_two_over_veth)
{
    const double betas[] = {0.14e-9, 0.19e-9, 0.28e-9};
    for (size_t b = 0; b < sizeof betas / sizeof betas[0]; b++) {
        struct loomi_links l;
        const double shm[4] = {1.3e-6, 0.094e-9, 0.068e-9, 0.067e-9};
        struct loomi_hostmap *hm = two_by_two(&l, shm, 4.4e-6, betas[b]);
        struct loomi_job_shape j = two_by_two_job(hm);
        struct loomi_selection sel;
        loomi_select_build(&sel, &j, &l);
        const struct {
            int coll;
            size_t bytes;
            int algo, not; /* want algo, or anything but `not` */
        } c[] = {
            {LOOMI_COLL_ALLGATHER, 8, LOOMI_ALGO_RECURSIVE_DOUBLING, 0},
            {LOOMI_COLL_ALLGATHER, 4096, LOOMI_ALGO_RECURSIVE_DOUBLING, 0},
            {LOOMI_COLL_ALLGATHER, (size_t)256 << 10, LOOMI_ALGO_HIERARCHICAL, 0},
            {LOOMI_COLL_ALLGATHER, (size_t)16 << 20, LOOMI_ALGO_HIERARCHICAL, 0},
            {LOOMI_COLL_ALLTOALL, 8, LOOMI_ALGO_HIERARCHICAL, 0},
            {LOOMI_COLL_ALLTOALL, 8192, LOOMI_ALGO_HIERARCHICAL, 0},
            /* 32K a peer: a near-tie (tests near_tie_*), not asserted here. */
            {LOOMI_COLL_ALLTOALL, (size_t)128 << 10, LOOMI_ALGO_PAIRWISE, 0},
            {LOOMI_COLL_ALLTOALL, (size_t)16 << 20, LOOMI_ALGO_PAIRWISE, 0},
            {LOOMI_COLL_ALLREDUCE, 8, LOOMI_ALGO_RECURSIVE_DOUBLING, 0},
            {LOOMI_COLL_ALLREDUCE, (size_t)128 << 10, 0, LOOMI_ALGO_HALVING_DOUBLING},
            {LOOMI_COLL_ALLREDUCE, (size_t)512 << 10, 0, LOOMI_ALGO_HALVING_DOUBLING},
            {LOOMI_COLL_ALLREDUCE, (size_t)2 << 20, 0, LOOMI_ALGO_HALVING_DOUBLING},
            {LOOMI_COLL_ALLREDUCE, (size_t)32 << 20, LOOMI_ALGO_SHARED, 0},
            {LOOMI_COLL_REDUCE_SCATTER, 2048, LOOMI_ALGO_HALVING_DOUBLING, 0},
            {LOOMI_COLL_REDUCE_SCATTER, (size_t)128 << 10, LOOMI_ALGO_HIERARCHICAL, 0},
            {LOOMI_COLL_REDUCE_SCATTER, (size_t)1 << 20, LOOMI_ALGO_HIERARCHICAL, 0},
        };
        for (size_t k = 0; k < sizeof c / sizeof c[0]; k++) {
            int got = loomi_select_lookup(&sel, c[k].coll, c[k].bytes);
            if (c[k].algo)
                cr_expect_eq(got, c[k].algo, "beta %g: %s %zu B: %s, want %s", betas[b],
                             loomi_coll_name(c[k].coll), c[k].bytes, loomi_algo_name(got),
                             loomi_algo_name(c[k].algo));
            else
                cr_expect_neq(got, c[k].not, "beta %g: %s %zu B: %s", betas[b],
                              loomi_coll_name(c[k].coll), c[k].bytes, loomi_algo_name(got));
        }
        free(hm);
    }
}

static int lookup_ranges(const struct loomi_ranges *t, size_t bytes)
{
    static struct loomi_selection sel;
    sel.coll[LOOMI_COLL_ALLREDUCE] = *t;
    return loomi_select_lookup(&sel, LOOMI_COLL_ALLREDUCE, bytes);
}

/* What the init-time timing of the allreduce (tune.c) does to a table:
 * the sizes from..to-1 take the new algorithm, the rest keep theirs,
 * neighbours that end up alike merge, and a table that would need too
 * many ranges is left as it was. */
Test(model, ranges_set_overrides_one_span)
{
    enum { RD = LOOMI_ALGO_RECURSIVE_DOUBLING, RING = LOOMI_ALGO_RING,
           SH = LOOMI_ALGO_SHARED, HD = LOOMI_ALGO_HALVING_DOUBLING };
    struct loomi_ranges t = {.n = 3,
                             .r = {{0, RD}, {(size_t)24 << 10, RING}, {(size_t)32 << 20, SH}}};
    cr_assert_eq(loomi_ranges_set(&t, (size_t)128 << 10, (size_t)256 << 10, RD), 0);
    const struct {
        size_t bytes;
        int algo;
    } want[] = {{8, RD},
                {(size_t)24 << 10, RING},
                {((size_t)128 << 10) - 1, RING},
                {(size_t)128 << 10, RD},
                {((size_t)256 << 10) - 1, RD},
                {(size_t)256 << 10, RING},
                {(size_t)32 << 20, SH}};
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++)
        cr_expect_eq(lookup_ranges(&t, want[k].bytes), want[k].algo, "%zu B: %s", want[k].bytes,
                     loomi_algo_name(lookup_ranges(&t, want[k].bytes)));
    cr_expect_eq(t.n, 5);
    /* The next span with the same algorithm joins it. */
    cr_assert_eq(loomi_ranges_set(&t, (size_t)256 << 10, (size_t)512 << 10, RD), 0);
    cr_expect_eq(t.n, 5);
    cr_expect_eq(lookup_ranges(&t, (size_t)300 << 10), RD);
    cr_expect_eq(lookup_ranges(&t, (size_t)512 << 10), RING);
    /* Back to what it was: the ranges merge again. */
    cr_assert_eq(loomi_ranges_set(&t, (size_t)128 << 10, (size_t)512 << 10, RING), 0);
    cr_expect_eq(t.n, 3);
    cr_expect_eq(t.r[0].from, 0);
    /* From 0 on, and a full table left alone. */
    cr_assert_eq(loomi_ranges_set(&t, 0, 16, HD), 0);
    cr_expect_eq(lookup_ranges(&t, 0), HD);
    cr_expect_eq(lookup_ranges(&t, 16), RD);
    struct loomi_ranges full = {.n = LOOMI_SELECT_MAX_RANGES};
    for (int i = 0; i < full.n; i++) {
        full.r[i].from = (size_t)i << 10;
        full.r[i].algo = i % 2 ? RD : RING;
    }
    struct loomi_ranges before = full;
    cr_expect_eq(loomi_ranges_set(&full, 1536, 1792, SH), -1);
    cr_expect_eq(memcmp(&full, &before, sizeof full), 0,
                 "a table that cannot take it is unchanged");
}

/* A failure that prefixes the cause it got from below (tune.c, small.c,
 * probe.c) passes loom_get_last_error() into the buffer being written:
 * the message must come out whole (formatted in place it came out as
 * "...: ailed: the peer aborted ..."). */
Test(model, failure_message_can_quote_the_last_one)
{
    loomi_fail(LOOM_ERR_REMOTE, -1, "rank %d failed: the peer aborted the communicator", 1);
    loomi_fail(LOOM_ERR_REMOTE, -1, "measuring small collectives: %s", loom_get_last_error());
    cr_expect_str_eq(loom_get_last_error(),
                     "measuring small collectives: rank 1 failed: the peer aborted the "
                     "communicator");
}

/* A class of slower reductions gets the model's allreduce table with
 * reductions dearer by its excess (select.c, redclass.c): on 4 ranks of
 * one host with this VM's figures, bf16 max (0.16 ns/B more than fp32
 * sums) moves recursive doubling, which reduces the whole vector twice,
 * out of sizes where the fp32 table runs it (measured at 8K: 14.3 us
 * against halving-doubling's 12.7); a reduction-heavier algorithm never
 * gains; class 0 and classes without excess keep the fp32 table. */
Test(model, slower_reductions_shift_the_allreduce_table)
{
    struct loomi_links l;
    struct loomi_job_shape j;
    struct loomi_hostmap *hm = four_ranks_here(&l, &j);
    static struct loomi_selection sel;
    loomi_select_build(&sel, &j, &l);
    const double excess[LOOMI_RED_CLASSES] = {0, 0, 0, 0.16};
    loomi_select_build_red(&sel, &j, &l, excess);
    const int RD = LOOMI_ALGO_RECURSIVE_DOUBLING;
    int moved = 0;
    for (size_t n = 1024; n <= (size_t)1 << 20; n *= 2) {
        const int f32 = loomi_select_lookup(&sel, LOOMI_COLL_ALLREDUCE, n);
        const int slow = loomi_ranges_algo(&sel.allreduce_red[3], n);
        cr_assert(slow != RD || f32 == RD, "%zu B: recursive doubling for bf16 max only", n);
        moved |= f32 == RD && slow != RD;
        cr_assert_eq(loomi_ranges_algo(&sel.allreduce_red[1], n), f32,
                     "%zu B: class 1 has no excess", n);
        cr_assert_eq(loomi_ranges_algo(&sel.allreduce_red[0], n), f32);
    }
    cr_assert(moved, "no size moved off recursive doubling");
    cr_assert_neq(loomi_ranges_algo(&sel.allreduce_red[3], 8192), RD, "8K: %s",
                  loomi_algo_name(loomi_ranges_algo(&sel.allreduce_red[3], 8192)));
    free(hm);
}

/* The picks of one collective's table over 1M..1G: how many ranges name
 * a chunk, and the smallest named. */
static int chunked_ranges(const struct loomi_ranges *t, size_t *smallest)
{
    int k = 0;
    *smallest = 0;
    for (int i = 0; i < t->n; i++)
        if (t->r[i].chunk) {
            k++;
            if (!*smallest || t->r[i].chunk < *smallest) *smallest = t->r[i].chunk;
        }
    return k;
}

/* 8 hosts of one rank on a 100 Gb/s RDMA fabric (5 us, 0.08 ns/B, a
 * chunk 5 us), each with cores to spare, as a cluster runs: reductions
 * then cost about what the transfers do, and the model cuts pipelined
 * algorithms into chunks where that saves LOOMI_CHUNK_GAIN of the time
 * at LOOM_CHUNK_SIZE, each pick the best of the candidates.  (On 10 Gb/s
 * Ethernet, the model's defaults, the transfers dwarf the reductions
 * that a chunk would overlap: no pick clears the gain.)  Dear chunks
 * (each message 5 ms more) make it keep fewer, never smaller ones; one
 * host, ranks taking turns on the cores, and a LOOM_CHUNK_SIZE that the
 * user set leave every table without chunks. */
Test(model, chunks_are_picked_where_they_pipeline_across_hosts)
{
    int host_of[8];
    for (int r = 0; r < 8; r++) host_of[r] = r;
    struct loomi_hostmap *hm = loomi_hostmap_build(8, host_of);
    cr_assert_not_null(hm);
    struct loomi_links l;
    loomi_links_defaults(&l, 1);
    l.alpha[LOOMI_LINK_INTER] = 5e-6;
    l.beta[LOOMI_LINK_INTER] = 0.08e-9;
    l.chunk_cost[LOOMI_LINK_INTER] = 5e-6;
    const size_t dflt = (size_t)2 << 20;
    struct loomi_job_shape j = {.hosts = hm, .nranks = 8, .cores_per_host = 8,
                                .shared_bytes = (size_t)4 << 20, .chunk_bytes = dflt};
    static struct loomi_selection sel;
    loomi_select_build(&sel, &j, &l);
    int picked = 0;
    for (int c = 0; c < LOOMI_NUM_COLLS; c++) {
        const struct loomi_ranges *t = &sel.coll[c];
        for (int i = 0; i < t->n; i++) {
            const size_t ch = t->r[i].chunk;
            if (!ch) continue;
            picked++;
            cr_assert(ch >= LOOMI_CHUNK_MIN && ch <= LOOMI_CHUNK_MAX && !(ch & (ch - 1)) &&
                          ch != dflt,
                      "%s: chunk %zu", loomi_coll_name(c), ch);
            /* At the range's first size (and the next, when it has one):
             * the pick's estimate is the least, and clears the gain. */
            const size_t n = t->r[i].from;
            cr_assert_eq(loomi_select_chunk(c, t->r[i].algo, n, &j, &l), ch);
            struct loomi_job_shape jc = j;
            const double base = loomi_select_cost(c, t->r[i].algo, n, &j, &l);
            jc.chunk_bytes = ch;
            const double got = loomi_select_cost(c, t->r[i].algo, n, &jc, &l);
            cr_assert(got < (1 - LOOMI_CHUNK_GAIN) * base, "%s %zu B: %g s in %zu, %g s in 2M",
                      loomi_coll_name(c), n, got, ch, base);
            for (size_t k = LOOMI_CHUNK_MIN; k <= LOOMI_CHUNK_MAX; k *= 2) {
                jc.chunk_bytes = k;
                cr_assert(loomi_select_cost(c, t->r[i].algo, n, &jc, &l) >= got,
                          "%s %zu B: %zu beats the pick %zu", loomi_coll_name(c), n, k, ch);
            }
        }
    }
    size_t small;
    cr_assert(chunked_ranges(&sel.coll[LOOMI_COLL_REDUCE], &small) > 0 && small < dflt,
              "the pipelined reduce takes smaller chunks than 2M somewhere");
    cr_assert(picked > 1);

    /* Each chunk costs 5 ms: none smaller than the default. */
    l.chunk_cost[LOOMI_LINK_INTER] = 5e-3;
    loomi_select_build(&sel, &j, &l);
    for (int c = 0; c < LOOMI_NUM_COLLS; c++)
        cr_assert(!chunked_ranges(&sel.coll[c], &small) || small > dflt,
                  "%s: chunks of %zu though each costs 5 ms", loomi_coll_name(c), small);
    l.chunk_cost[LOOMI_LINK_INTER] = 0; /* unknown: alpha stands for it */

    struct loomi_job_shape none[3] = {j, j, j};
    none[0].chunk_fixed = 1;
    none[1].cores_per_host = 4; /* 8 ranks... */
    const int one_host[8] = {0};
    struct loomi_hostmap *hm1 = loomi_hostmap_build(8, one_host);
    cr_assert_not_null(hm1);
    none[1].hosts = hm1; /* ...on one host of 4 cores: taking turns */
    none[2].hosts = hm1; /* one host with a core each */
    for (int k = 0; k < 3; k++) {
        loomi_select_build(&sel, &none[k], &l);
        for (int c = 0; c < LOOMI_NUM_COLLS; c++)
            cr_assert_eq(chunked_ranges(&sel.coll[c], &small), 0, "case %d, %s: chunk %zu", k,
                         loomi_coll_name(c), small);
    }
    /* Across hosts with turns on the cores: 8 hosts of 2 ranks, 1 core. */
    int two_of[16];
    for (int r = 0; r < 16; r++) two_of[r] = r / 2;
    struct loomi_hostmap *hm2 = loomi_hostmap_build(16, two_of);
    cr_assert_not_null(hm2);
    struct loomi_job_shape jt = j;
    jt.hosts = hm2;
    jt.nranks = 16;
    jt.cores_per_host = 1;
    loomi_select_build(&sel, &jt, &l);
    for (int c = 0; c < LOOMI_NUM_COLLS; c++)
        cr_assert_eq(chunked_ranges(&sel.coll[c], &small), 0, "turns, %s: chunk %zu",
                     loomi_coll_name(c), small);
    free(hm);
    free(hm1);
    free(hm2);
}

/* What each allreduce reduces on its busiest rank, for the slower
 * classes' timing (tune.c) and the CPU bound on one host (select.c):
 * recursive doubling the whole vector per round and per fold-in round. */
Test(model, allreduce_reduced_bytes)
{
    const double n = 1 << 20;
    cr_assert_float_eq(loomi_allreduce_reduced(LOOMI_ALGO_RECURSIVE_DOUBLING, 4, n), 2 * n, 1);
    cr_assert_float_eq(loomi_allreduce_reduced(LOOMI_ALGO_RECURSIVE_DOUBLING, 3, n), 2 * n, 1);
    cr_assert_float_eq(loomi_allreduce_reduced(LOOMI_ALGO_RECURSIVE_DOUBLING, 6, n), 3 * n, 1);
    cr_assert_float_eq(loomi_allreduce_reduced(LOOMI_ALGO_RING, 4, n), 0.75 * n, 1);
    cr_assert_float_eq(loomi_allreduce_reduced(LOOMI_ALGO_HALVING_DOUBLING, 8, n), 7 * n / 8, 1);
    cr_assert_float_eq(loomi_allreduce_reduced(LOOMI_ALGO_SHARED, 2, n), n / 2, 1);
    cr_assert_float_eq(loomi_allreduce_reduced(LOOMI_ALGO_TREE, 2, n), n / 2, 1);
    cr_assert_float_eq(loomi_allreduce_reduced(LOOMI_ALGO_TREE, 5, n), n, 1);
}

/* Links that come over the network (a joiner's, from the coordinator)
 * carry the classes of reductions once timed, checked like the rest. */
Test(model, links_carry_checked_classes_of_reductions)
{
    struct loomi_links l;
    loomi_links_defaults(&l, 1);
    cr_assert(loomi_links_valid(&l), "no classes yet");
    l.red_known = 1;
    memset(l.red.rep, 0xff, sizeof l.red.rep);
    cr_assert(loomi_links_valid(&l), "every pair as fp32 sums");
    l.red.cls[LOOM_BFLOAT16][LOOM_MAX] = 3;
    cr_assert(!loomi_links_valid(&l), "class 3 without its slowest pair");
    l.red.rep[3][0] = LOOM_BFLOAT16;
    l.red.rep[3][1] = LOOM_MAX;
    l.red.excess[3] = 0.16;
    cr_assert(loomi_links_valid(&l));
    l.red.cls[LOOM_BFLOAT16][LOOM_MAX] = 4;
    cr_assert(!loomi_links_valid(&l), "a class out of range");
    l.red.cls[LOOM_BFLOAT16][LOOM_MAX] = 3;
    l.red.excess[3] = NAN;
    cr_assert(!loomi_links_valid(&l), "an excess that is not a number");
    l.red.excess[3] = 0.16;
    l.red_known = 2;
    cr_assert(!loomi_links_valid(&l), "red_known is a flag");
    l.red_known = 0;
    l.red.cls[LOOM_FLOAT32][LOOM_SUM] = 9;
    cr_assert(loomi_links_valid(&l), "classes not known are not read");
}

/* A table switches algorithm only where the new one is cheaper, not where
 * two estimates tie to the last bits: on 2 ranks the ring and
 * halving-doubling reduce-scatter are the same single exchange, and the
 * table once flipped between them (ring from 0, halving_doubling from 12,
 * ring from 24, ...) as rounding favoured one or the other.  A switch to
 * a dearer one is a near-tie that the table marks there, whose worst
 * case is the better. */
Test(model, tables_do_not_switch_on_ties)
{
    for (int p = 2; p <= 4; p += 2) {
        const int host_of[4] = {0, 0, 0, 0};
        struct loomi_hostmap *hm = loomi_hostmap_build(p, host_of);
        cr_assert_not_null(hm);
        struct loomi_links l;
        loomi_links_defaults(&l, 1);
        struct loomi_job_shape j = {.hosts = hm, .nranks = p, .cores_per_host = 2,
                                    .shared_bytes = (size_t)4 << 20,
                                    .chunk_bytes = (size_t)2 << 20,
                                    .stream_bytes = (size_t)64 << 20};
        struct loomi_selection sel;
        loomi_select_build(&sel, &j, &l);
        for (int c = 0; c < LOOMI_NUM_COLLS; c++) {
            const struct loomi_ranges *t = &sel.coll[c];
            for (int k = 1; k < t->n; k++) {
                const size_t at = t->r[k].from;
                double was = loomi_select_cost(c, t->r[k - 1].algo, at, &j, &l);
                double now = loomi_select_cost(c, t->r[k].algo, at, &j, &l);
                const struct loomi_tie *tie = tie_at(&sel, c, at);
                if (tie && tie->chosen == t->r[k].algo) {
                    cr_expect_lt(loomi_select_worst(c, t->r[k].algo, at, &j, &l),
                                 loomi_select_worst(c, t->r[k - 1].algo, at, &j, &l) + 1e-15,
                                 "%d ranks, %s at %zu B: a near-tie to the worse worst case", p,
                                 loomi_coll_name(c), at);
                    continue;
                }
                cr_expect(now < was * (1 - 1e-9),
                          "%d ranks, %s: %s from %zu B on, at %.17g s against %s's %.17g s",
                          p, loomi_coll_name(c), loomi_algo_name(t->r[k].algo), at, now,
                          loomi_algo_name(t->r[k - 1].algo), was);
            }
        }
        free(hm);
    }
}
