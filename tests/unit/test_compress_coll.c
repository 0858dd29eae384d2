/*
 * test_compress_coll.c - compressed collectives (loom_allreduce_opts and
 * friends) over the sim transport: every codec x ranks 1..9 x odd counts
 * x in place or not x SUM/AVG, many small chunks.
 *
 * Checked: every rank ends with identical bytes; inputs a codec carries
 * exactly (small integers for bf16/fp16, constant blocks for the block
 * codecs) give the exact sum; random inputs stay within a loose error
 * bound; top-k equals the sum of each rank's top-k decoded in rank order
 * (computed here with the public codec calls); error-feedback residuals
 * are committed on success and rolled back when the operation fails;
 * bad arguments are refused with the buffers untouched.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom.h"
#include "coll/validate.h"
#include "comm/local.h"
#include "tests/sim/harness.h"

#define PMAX 9

static void quiet(void) { setenv("LOOM_DEBUG", "none", 1); }

static struct loomi_sim_world *W;
static loom_comm_t comms[PMAX];
static char msg[4096];

static void world(int p, uint64_t seed, size_t chunk)
{
    loom_config_t cfg = LOOM_CONFIG_INITIALIZER;
    cfg.timeout_ms = 20000;
    cr_assert_eq(loomi_sim_world_create(p, seed, &cfg, &W, comms), LOOM_SUCCESS, "%s",
                 loom_get_last_error());
    for (int r = 0; r < p; r++) loomi_comm_set_chunk_bytes(comms[r], chunk);
}

static void unworld(void)
{
    loomi_sim_world_destroy(W, comms);
    W = NULL;
}

static const loom_codec_t *codec(const char *spec)
{
    const loom_codec_t *c = NULL;
    cr_assert_eq(loom_codec_find(spec, &c), LOOM_SUCCESS, "%s", spec);
    return c;
}

enum { ALLREDUCE, REDUCE_SCATTER, ALLGATHER };

/* Run one collective on every rank; in[r] / out[r] per rank. */
static void run(int p, int coll, float **in, float **out, size_t count, loom_op_t op,
                const loom_coll_options_t *o, loom_result_t want)
{
    loom_request_t req[PMAX];
    loom_result_t res[PMAX];
    for (int r = 0; r < p; r++) {
        loom_result_t rc;
        if (coll == ALLREDUCE)
            rc = loom_iallreduce_opts(in[r], out[r], count, LOOM_FLOAT32, op, comms[r], o,
                                      &req[r]);
        else if (coll == REDUCE_SCATTER)
            rc = loom_ireduce_scatter_opts(in[r], out[r], count, LOOM_FLOAT32, op, comms[r], o,
                                           &req[r]);
        else
            rc = loom_iallgather_opts(in[r], out[r], count, LOOM_FLOAT32, comms[r], o, &req[r]);
        cr_assert_eq(rc, LOOM_SUCCESS, "rank %d: %s", r, loom_get_last_error());
    }
    cr_assert_eq(loomi_sim_run(W, comms, req, p, 0, res, msg, sizeof msg), LOOM_SUCCESS, "%s",
                 msg);
    for (int r = 0; r < p; r++)
        cr_assert_eq(res[r], want, "rank %d: %s (%s)", r, loom_strerror(res[r]), msg);
}

static float **bufs(int p, size_t n)
{
    float **b = calloc((size_t)p, sizeof *b);
    for (int r = 0; r < p; r++) b[r] = calloc(n ? n : 1, sizeof(float));
    return b;
}

static void unbufs(float **b, int p)
{
    for (int r = 0; r < p; r++) free(b[r]);
    free(b);
}

static uint64_t rng = 88172645463325252ull;
static float frand(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static const size_t counts[] = {0, 1, 2, 7, 13, 64, 333, 1001};
#define NCOUNTS (sizeof counts / sizeof counts[0])

/* kind 0: small integers (exact in bf16/fp16 sums); 1: constant per
 * rank (exact for the block codecs); 2: random in [-1, 1]. */
static float input(int kind, int r, size_t i)
{
    if (kind == 0) return (float)((int)((i * 7 + (size_t)r * 3) % 11) - 5);
    if (kind == 1) return (float)(r + 1) * 0.5f;
    return frand();
}

/* One allreduce configuration; checks identical bytes and the error. */
static void allreduce_case(const char *spec, int p, size_t count, int inplace, loom_op_t op,
                           int kind, double tol)
{
    loom_coll_options_t o = LOOM_COLL_OPTIONS_INITIALIZER;
    o.codec = codec(spec);
    float **in = bufs(p, count), **out = bufs(p, count);
    double *exact = calloc(count ? count : 1, sizeof *exact);
    for (int r = 0; r < p; r++)
        for (size_t i = 0; i < count; i++) {
            in[r][i] = input(kind, r, i);
            exact[i] += in[r][i];
            if (inplace) out[r][i] = in[r][i];
        }
    if (op == LOOM_AVG)
        for (size_t i = 0; i < count; i++) exact[i] /= p;
    run(p, ALLREDUCE, inplace ? out : in, out, count, op, &o, LOOM_SUCCESS);
    for (int r = 1; r < p; r++)
        cr_assert(!memcmp(out[r], out[0], count * sizeof(float)),
                  "%s p=%d count=%zu inplace=%d: rank %d differs from rank 0", spec, p, count,
                  inplace, r);
    double e2 = 0, x2 = 0, emax = 0;
    for (size_t i = 0; i < count; i++) {
        double e = fabs(out[0][i] - exact[i]);
        cr_assert(out[0][i] == out[0][i], "NaN at %zu", i);
        e2 += e * e;
        x2 += exact[i] * exact[i];
        if (e > emax) emax = e;
    }
    double rel = x2 > 0 ? sqrt(e2 / x2) : sqrt(e2);
    cr_assert(rel <= tol, "%s p=%d count=%zu inplace=%d op=%d kind=%d: relative L2 error %g > %g "
              "(max abs %g)", spec, p, count, inplace, (int)op, kind, rel, tol, emax);
    free(exact);
    unbufs(in, p);
    unbufs(out, p);
}

TestSuite(cz, .init = quiet, .timeout = 600);

Test(cz, additive_codecs_exact_on_small_integers)
{
    const char *specs[] = {"bf16", "fp16"};
    for (int p = 1; p <= PMAX; p++) {
        world(p, (uint64_t)p, 64);
        for (size_t s = 0; s < 2; s++)
            for (size_t k = 0; k < NCOUNTS; k++)
                for (int ip = 0; ip < 2; ip++) {
                    allreduce_case(specs[s], p, counts[k], ip, LOOM_SUM, 0, 0);
                    allreduce_case(specs[s], p, counts[k], ip, LOOM_AVG, 0, 1.0 / 128);
                }
        unworld();
    }
}

Test(cz, block_codecs_exact_on_constant_blocks)
{
    const char *specs[] = {"int8", "int4", "fp4", "int8:32"};
    for (int p = 1; p <= PMAX; p++) {
        world(p, (uint64_t)p * 3, 96);
        for (size_t s = 0; s < 4; s++)
            for (size_t k = 0; k < NCOUNTS; k++)
                for (int ip = 0; ip < 2; ip++)
                    allreduce_case(specs[s], p, counts[k], ip, (k & 1) ? LOOM_AVG : LOOM_SUM, 1,
                                   1e-5);
        unworld();
    }
}

Test(cz, random_inputs_within_bounds)
{
    const char *specs[] = {"bf16", "fp16", "int8", "int4", "fp4"};
    const double tol[] = {0.01, 0.002, 0.03, 0.4, 0.6};
    for (int p = 2; p <= PMAX; p += 3) {
        world(p, (uint64_t)p * 5, 200);
        for (size_t s = 0; s < 5; s++)
            for (int ip = 0; ip < 2; ip++) allreduce_case(specs[s], p, 4099, ip, LOOM_SUM, 2, tol[s]);
        unworld();
    }
}

/* top-k: the sum, in rank order, of each rank's decoded top-k per chunk
 * of the whole tensor.  With one chunk the reference is simple. */
Test(cz, topk_equals_the_reference)
{
    const loom_codec_t *c = codec("topk:0.1");
    for (int p = 1; p <= PMAX; p++) {
        world(p, (uint64_t)p * 7, 1 << 20);
        for (size_t k = 0; k < NCOUNTS; k++)
            for (int ip = 0; ip < 2; ip++) {
                size_t n = counts[k];
                loom_coll_options_t o = LOOM_COLL_OPTIONS_INITIALIZER;
                o.codec = c;
                float **in = bufs(p, n), **out = bufs(p, n);
                float *ref = calloc(n ? n : 1, sizeof *ref);
                size_t cap = 0, len = 0;
                loom_codec_max_encoded_bytes(c, n, &cap);
                unsigned char *enc = malloc(cap);
                for (int r = 0; r < p; r++) {
                    for (size_t i = 0; i < n; i++) {
                        in[r][i] = frand();
                        if (ip) out[r][i] = in[r][i];
                    }
                    if (p > 1 && n) {
                        cr_assert_eq(loom_codec_encode(c, in[r], n, enc, cap, &len, NULL),
                                     LOOM_SUCCESS);
                        cr_assert_eq(r ? loom_codec_decode_accumulate(c, enc, len, ref, n)
                                       : loom_codec_decode(c, enc, len, ref, n),
                                     LOOM_SUCCESS);
                    } else if (n) {
                        memcpy(ref, in[r], n * sizeof *ref);
                    }
                }
                run(p, ALLREDUCE, ip ? out : in, out, n, LOOM_SUM, &o, LOOM_SUCCESS);
                for (int r = 0; r < p; r++)
                    cr_assert(!memcmp(out[r], ref, n * sizeof(float)),
                              "p=%d n=%zu inplace=%d: rank %d differs from the reference", p, n,
                              ip, r);
                free(enc);
                free(ref);
                unbufs(in, p);
                unbufs(out, p);
            }
        unworld();
    }
}

Test(cz, topk_many_chunks_identical)
{
    for (int p = 2; p <= PMAX; p++) {
        world(p, (uint64_t)p * 11, 64);
        for (size_t k = 0; k < NCOUNTS; k++) {
            allreduce_case("topk:0.3", p, counts[k], k & 1, LOOM_AVG, 2, 1e3);
            allreduce_case("topk:1", p, counts[k], !(k & 1), LOOM_SUM, 2, 1e-6);
        }
        unworld();
    }
}

Test(cz, allgather_and_reduce_scatter)
{
    const char *specs[] = {"bf16", "int8", "topk:0.5"};
    for (int p = 1; p <= PMAX; p++) {
        world(p, (uint64_t)p * 13, 64);
        for (size_t s = 0; s < 3; s++)
            for (size_t k = 0; k < NCOUNTS; k++)
                for (int ip = 0; ip < 2; ip++) {
                    size_t n = counts[k];
                    loom_coll_options_t o = LOOM_COLL_OPTIONS_INITIALIZER;
                    o.codec = codec(specs[s]);
                    /* allgather: small integers, exact for bf16 and int8
                     * only when constant: check identical bytes always
                     * and exactness for bf16. */
                    float **in = bufs(p, n), **out = bufs(p, (size_t)p * n);
                    for (int r = 0; r < p; r++)
                        for (size_t i = 0; i < n; i++) {
                            in[r][i] = input(0, r, i);
                            if (ip) out[r][(size_t)r * n + i] = in[r][i];
                        }
                    float **src = in;
                    float *ipsrc[PMAX];
                    if (ip) {
                        for (int r = 0; r < p; r++) ipsrc[r] = out[r] + (size_t)r * n;
                        src = ipsrc;
                    }
                    run(p, ALLGATHER, src, out, n, LOOM_SUM, &o, LOOM_SUCCESS);
                    for (int r = 1; r < p; r++)
                        cr_assert(!memcmp(out[r], out[0], (size_t)p * n * sizeof(float)),
                                  "allgather %s p=%d n=%zu ip=%d: rank %d differs", specs[s], p, n,
                                  ip, r);
                    if (s == 0)
                        for (int q = 0; q < p; q++)
                            for (size_t i = 0; i < n; i++)
                                cr_assert_eq(out[0][(size_t)q * n + i], input(0, q, i));
                    unbufs(in, p);
                    unbufs(out, p);
                    /* reduce_scatter, bf16 on small integers: exact. */
                    in = bufs(p, (size_t)p * n);
                    out = bufs(p, n);
                    for (int r = 0; r < p; r++)
                        for (size_t i = 0; i < (size_t)p * n; i++) in[r][i] = input(0, r, i);
                    float *ipdst[PMAX];
                    float **dst = out;
                    if (ip) {
                        for (int r = 0; r < p; r++) ipdst[r] = in[r] + (size_t)r * n;
                        dst = ipdst;
                    }
                    if (s == 2) { /* gather-only codecs don't reduce on the way */
                        unbufs(in, p);
                        unbufs(out, p);
                        continue;
                    }
                    run(p, REDUCE_SCATTER, in, dst, n, LOOM_SUM, &o, LOOM_SUCCESS);
                    if (s == 0)
                        for (int r = 0; r < p; r++)
                            for (size_t i = 0; i < n; i++) {
                                float e = 0;
                                for (int q = 0; q < p; q++) e += input(0, q, (size_t)r * n + i);
                                cr_assert_eq(dst[r][i], e, "reduce_scatter p=%d n=%zu r=%d i=%zu",
                                             p, n, r, i);
                            }
                    unbufs(in, p);
                    unbufs(out, p);
                }
        unworld();
    }
}

Test(cz, comm_default_codec)
{
    const int p = 3;
    const size_t n = 100;
    world(p, 5, 1 << 20);
    const loom_codec_t *c = codec("topk:0.05");
    float **in = bufs(p, n), **out = bufs(p, n);
    for (int r = 0; r < p; r++) {
        cr_assert_eq(loom_comm_set_codec(comms[r], c), LOOM_SUCCESS);
        for (size_t i = 0; i < n; i++) in[r][i] = (float)i + (float)r;
    }
    loom_request_t req[PMAX];
    loom_result_t res[PMAX];
    for (int r = 0; r < p; r++)
        cr_assert_eq(loom_iallreduce(in[r], out[r], n, LOOM_FLOAT32, LOOM_SUM, comms[r], &req[r]),
                     LOOM_SUCCESS);
    cr_assert_eq(loomi_sim_run(W, comms, req, p, 0, res, msg, sizeof msg), LOOM_SUCCESS);
    /* top 5 of each rank: elements 95..99; the rest is 0. */
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(out[1][i], i >= 95 ? (float)(3 * i + 3) : 0.0f, "i=%zu: %g", i, out[1][i]);
    /* Not fp32 SUM: exact, the codec does not apply. */
    for (int r = 0; r < p; r++)
        cr_assert_eq(loom_iallreduce(in[r], out[r], n, LOOM_FLOAT32, LOOM_MAX, comms[r], &req[r]),
                     LOOM_SUCCESS);
    cr_assert_eq(loomi_sim_run(W, comms, req, p, 0, res, msg, sizeof msg), LOOM_SUCCESS);
    for (size_t i = 0; i < n; i++) cr_assert_eq(out[0][i], (float)i + 2);
    for (int r = 0; r < p; r++) cr_assert_eq(loom_comm_set_codec(comms[r], NULL), LOOM_SUCCESS);
    unbufs(in, p);
    unbufs(out, p);
    unworld();
}

Test(cz, bad_arguments_touch_nothing)
{
    world(2, 1, 4096);
    loom_coll_options_t o = LOOM_COLL_OPTIONS_INITIALIZER;
    o.codec = codec("int8");
    int32_t a[4] = {1, 2, 3, 4}, b[4] = {9, 9, 9, 9};
    cr_assert_eq(loom_allreduce_opts(a, b, 4, LOOM_INT32, LOOM_SUM, comms[0], &o),
                 LOOM_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(loom_get_last_error(), "dtype") != NULL, "%s", loom_get_last_error());
    float x[4] = {1, 2, 3, 4}, y[4] = {9, 9, 9, 9};
    cr_assert_eq(loom_allreduce_opts(x, y, 4, LOOM_FLOAT32, LOOM_MAX, comms[0], &o),
                 LOOM_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(loom_get_last_error(), "op") != NULL, "%s", loom_get_last_error());
    loom_request_t rq;
    cr_assert_eq(loom_ireduce_scatter_opts(x, y, 2, LOOM_FLOAT32, LOOM_PROD, comms[0], &o, &rq),
                 LOOM_ERR_INVALID_ARGUMENT);
    cr_assert_eq(loom_allgather_opts(a, b, 2, LOOM_INT32, comms[0], &o),
                 LOOM_ERR_INVALID_ARGUMENT);
    loom_coll_options_t bad = o;
    bad.size = 4;
    cr_assert_eq(loom_allreduce_opts(x, y, 4, LOOM_FLOAT32, LOOM_SUM, comms[0], &bad),
                 LOOM_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(loom_get_last_error(), "opts->size") != NULL);
    loom_codec_t fake = *o.codec;
    bad = o;
    bad.codec = &fake;
    cr_assert_eq(loom_allreduce_opts(x, y, 4, LOOM_FLOAT32, LOOM_SUM, comms[0], &bad),
                 LOOM_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(loom_get_last_error(), "opts->codec") != NULL);
    cr_assert_eq(loom_comm_set_codec(comms[0], &fake), LOOM_ERR_INVALID_ARGUMENT);
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(b[i], 9);
        cr_assert_eq(y[i], 9.0f);
    }
    unworld();
}

/* Error feedback: after a successful allreduce the residual of each rank
 * is its input minus its decoded top-k; a failed one leaves it as it
 * was. */
Test(cz, error_feedback_commit_and_rollback)
{
    const int p = 3;
    const size_t n = 50;
    const loom_codec_t *c = codec("topk:0.1");
    world(p, 9, 1 << 20);
    loom_codec_state_t st[PMAX];
    float **in = bufs(p, n), **out = bufs(p, n);
    for (int r = 0; r < p; r++) {
        cr_assert_eq(loom_codec_state_create(&st[r]), LOOM_SUCCESS);
        for (size_t i = 0; i < n; i++) in[r][i] = (float)((i * 13 + (size_t)r) % 50) - 25.0f;
    }
    loom_request_t req[PMAX];
    loom_result_t res[PMAX];
    for (int r = 0; r < p; r++) {
        loom_coll_options_t o = LOOM_COLL_OPTIONS_INITIALIZER;
        o.codec = c;
        o.state = st[r];
        o.key = 42;
        cr_assert_eq(loom_iallreduce_opts(in[r], out[r], n, LOOM_FLOAT32, LOOM_SUM, comms[r], &o,
                                          &req[r]),
                     LOOM_SUCCESS);
    }
    cr_assert_eq(loomi_sim_run(W, comms, req, p, 0, res, msg, sizeof msg), LOOM_SUCCESS);
    float resid[50], dec[50], committed[PMAX][50];
    size_t cap = 0, len = 0;
    loom_codec_max_encoded_bytes(c, n, &cap);
    unsigned char *enc = malloc(cap);
    for (int r = 0; r < p; r++) {
        cr_assert_eq(res[r], LOOM_SUCCESS);
        cr_assert_eq(loom_codec_state_residual(st[r], 42, resid, n), LOOM_SUCCESS);
        cr_assert_eq(loom_codec_encode(c, in[r], n, enc, cap, &len, dec), LOOM_SUCCESS);
        for (size_t i = 0; i < n; i++)
            cr_assert_eq(resid[i], in[r][i] - dec[i], "rank %d i %zu", r, i);
        memcpy(committed[r], resid, sizeof resid);
    }
    /* A second allreduce that fails: rank 2 aborts after the others have
     * started (and encoded their input with the residual). */
    for (int r = 0; r < p - 1; r++) {
        loom_coll_options_t o = LOOM_COLL_OPTIONS_INITIALIZER;
        o.codec = c;
        o.state = st[r];
        o.key = 42;
        cr_assert_eq(loom_iallreduce_opts(in[r], out[r], n, LOOM_FLOAT32, LOOM_SUM, comms[r], &o,
                                          &req[r]),
                     LOOM_SUCCESS);
    }
    loom_comm_abort(comms[p - 1]);
    comms[p - 1] = NULL;
    req[p - 1] = LOOM_REQUEST_NULL;
    cr_assert_eq(loomi_sim_run(W, comms, req, p, 0, res, msg, sizeof msg), LOOM_SUCCESS, "%s", msg);
    for (int r = 0; r < p - 1; r++) {
        cr_assert_neq(res[r], LOOM_SUCCESS, "rank %d succeeded", r);
        cr_assert_eq(loom_codec_state_residual(st[r], 42, resid, n), LOOM_SUCCESS);
        cr_assert(!memcmp(resid, committed[r], sizeof resid), "rank %d: residual changed", r);
    }
    free(enc);
    for (int r = 0; r < p; r++) loom_codec_state_destroy(st[r]);
    unbufs(in, p);
    unbufs(out, p);
    unworld();
}

/* The validator over compressed schedules: messages matched, no
 * deadlock, no hazard between unordered steps, for every collective,
 * codec kind, rank count, count, placement and with error feedback. */
Test(cz, schedules_validate)
{
    static struct loomi_sched S[PMAX];
    const char *specs[] = {"int8", "bf16", "topk:0.2"};
    loom_codec_state_t st;
    cr_assert_eq(loom_codec_state_create(&st), LOOM_SUCCESS);
    for (int coll = 0; coll < 3; coll++)
        for (size_t sp = 0; sp < 3; sp++)
            for (int p = 1; p <= PMAX; p++)
                for (size_t k = 0; k < NCOUNTS; k++)
                    for (int v = 0; v < 4; v++) {
                        if (coll == REDUCE_SCATTER && sp == 2) continue;
                        struct loomi_coll_args a;
                        memset(&a, 0, sizeof a);
                        a.coll = coll == ALLREDUCE        ? LOOMI_COLL_ALLREDUCE
                                 : coll == REDUCE_SCATTER ? LOOMI_COLL_REDUCE_SCATTER
                                                          : LOOMI_COLL_ALLGATHER;
                        a.count = counts[k];
                        a.inplace = v & 1;
                        a.chunk_bytes = 40;
                        struct loomi_cz z = {codec(specs[sp]), (v & 2) ? st : NULL, 3};
                        for (int r = 0; r < p; r++) {
                            loomi_sched_init(&S[r], r, p, LOOM_FLOAT32, LOOM_SUM);
                            loom_result_t rc =
                                coll == ALLREDUCE        ? loomi_gen_allreduce_cz(&S[r], &a, &z)
                                : coll == REDUCE_SCATTER ? loomi_gen_reduce_scatter_cz(&S[r], &a, &z)
                                                         : loomi_gen_allgather_cz(&S[r], &a, &z);
                            cr_assert_eq(rc, LOOM_SUCCESS, "%s", loom_get_last_error());
                        }
                        struct loomi_coll_args aa[PMAX];
                        for (int r = 0; r < p; r++) aa[r] = a;
                        loom_result_t rc =
                            loomi_sched_validate_coll(S, p, aa, 1, NULL, msg, sizeof msg);
                        cr_assert_eq(rc, LOOM_SUCCESS, "coll %d %s p=%d n=%zu v=%d: %s", coll,
                                     specs[sp], p, counts[k], v, msg);
                        for (int r = 0; r < p; r++) loomi_sched_free(&S[r]);
                    }
    loom_codec_state_destroy(st);
}
