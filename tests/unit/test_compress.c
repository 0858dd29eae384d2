/*
 * test_compress.c - the codec layer (loom_codec_*): round-trip error
 * bounds of every built-in codec, the additive property of bf16/fp16,
 * top-k selection and error feedback, transactional state, malformed
 * input, zero length, NaN/Inf, the registry and argument checking.
 */
#include <criterion/criterion.h>

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom.h"
#include "reduce/reduce.h"

/* ------------------------------------------------------------ helpers */

#define OK(call)                                                               \
    do {                                                                       \
        loom_result_t r_ = (call);                                             \
        cr_assert_eq(r_, LOOM_SUCCESS, "%s: %s", #call, loom_get_last_error());\
    } while (0)

#define EXPECT_ERR(call, code, word)                                           \
    do {                                                                       \
        loom_result_t r_ = (call);                                             \
        cr_assert_eq(r_, (code), "%s returned %d (%s)", #call, r_,             \
                     loom_get_last_error());                                   \
        cr_assert(strstr(loom_get_last_error(), (word)) != NULL,               \
                  "%s: message '%s' does not name '%s'", #call,                \
                  loom_get_last_error(), (word));                              \
    } while (0)

static const loom_codec_t *find(const char *spec)
{
    const loom_codec_t *c = NULL;
    OK(loom_codec_find(spec, &c));
    cr_assert_not_null(c);
    return c;
}

static uint64_t rng_state = 42;
static uint32_t rnd(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}
/* Uniform in [-a, a). */
static float frand(float a)
{
    return ((float)rnd() / 2147483648.0f - 1.0f) * a;
}

/* Values spread over magnitudes, a few blocks of zeros and outliers. */
static void fill(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float v = frand(1.0f);
        if (i % 97 == 5) v *= 1000.0f;
        if (i % 13 == 0) v *= 1e-3f;
        x[i] = v;
    }
    for (size_t i = 512; i < 600 && i < n; i++) x[i] = 0.0f; /* a zero block */
}

static unsigned char *encode(const loom_codec_t *c, const float *x, size_t n,
                             size_t *len)
{
    size_t cap = 0;
    OK(loom_codec_max_encoded_bytes(c, n, &cap));
    unsigned char *buf = malloc(cap);
    cr_assert_not_null(buf);
    OK(loom_codec_encode(c, x, n, buf, cap, len, NULL));
    cr_assert_leq(*len, cap);
    return buf;
}

static float *decode(const loom_codec_t *c, const void *buf, size_t len,
                     size_t n)
{
    float *d = malloc((n ? n : 1) * sizeof *d);
    cr_assert_not_null(d);
    OK(loom_codec_decode(c, buf, len, d, n));
    return d;
}

static uint32_t fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bitsf(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static size_t block_of(const char *spec)
{
    const char *c = strchr(spec, ':');
    return c ? (size_t)strtoul(c + 1, NULL, 10) : 256;
}

static const size_t counts[] = {0, 1, 2, 3, 7, 255, 256, 257, 1000, 4097};
#define N_COUNTS (sizeof counts / sizeof counts[0])

/* ------------------------------------------------------- block codecs */

/* Decoded values stay within the documented bound of each block's absmax:
 * int8 absmax/254, int4 absmax/14, fp4 max(|x|/4, absmax/24). */
static void check_block_bounds(const char *spec, int kind)
{
    const loom_codec_t *c = find(spec);
    size_t B = block_of(spec);
    for (size_t ci = 0; ci < N_COUNTS; ci++) {
        size_t n = counts[ci];
        float *x = malloc((n ? n : 1) * sizeof *x);
        fill(x, n);
        size_t len;
        unsigned char *buf = encode(c, x, n, &len);
        size_t cap;
        OK(loom_codec_max_encoded_bytes(c, n, &cap));
        cr_assert_eq(len, cap, "%s: block codecs have a fixed size", spec);
        float *d = decode(c, buf, len, n);
        for (size_t b0 = 0; b0 < n; b0 += B) {
            size_t m = n - b0 < B ? n - b0 : B;
            float amax = 0;
            for (size_t j = 0; j < m; j++)
                amax = fmaxf(amax, fabsf(x[b0 + j]));
            for (size_t j = 0; j < m; j++) {
                float xv = x[b0 + j], err = fabsf(xv - d[b0 + j]);
                float bound = kind == 0   ? amax / 254.0f
                              : kind == 1 ? amax / 14.0f
                                          : fmaxf(fabsf(xv) / 4.0f, amax / 24.0f);
                bound = bound * (1.0f + 1e-5f) + 127 * 0x1p-149f;
                cr_assert_leq(err, bound,
                              "%s n=%zu: x[%zu]=%g decoded %g (err %g > %g, "
                              "absmax %g)",
                              spec, n, b0 + j, (double)xv,
                              (double)d[b0 + j], (double)err, (double)bound,
                              (double)amax);
            }
        }
        free(x);
        free(buf);
        free(d);
    }
}

Test(compress, int8_error_bound)
{
    check_block_bounds("int8", 0);
    check_block_bounds("int8:1", 0);
    check_block_bounds("int8:32", 0);
    check_block_bounds("int8:100", 0);
}

Test(compress, int4_error_bound)
{
    check_block_bounds("int4", 1);
    check_block_bounds("int4:2", 1);
    check_block_bounds("int4:64", 1);
}

Test(compress, fp4_error_bound)
{
    check_block_bounds("fp4", 2);
    check_block_bounds("fp4:2", 2);
    check_block_bounds("fp4:34", 2);
}

/* Values on a codec's grid (with the block's absmax present) come back
 * bit for bit. */
Test(compress, exact_on_representable_values)
{
    static const float fp4_mag[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
    static const float scales[] = {1.0f, 0.25f, 3.0f, 0x1p-20f, 1000.0f,
                                   0x1p100f};
    const size_t n = 1000; /* blocks of 256 and a partial one */
    float *x = malloc(n * sizeof *x);
    for (size_t si = 0; si < sizeof scales / sizeof scales[0]; si++) {
        float s = scales[si];
        for (int kind = 0; kind < 3; kind++) {
            const char *spec = kind == 0 ? "int8" : kind == 1 ? "int4" : "fp4";
            int qmax = kind == 0 ? 127 : kind == 1 ? 7 : 6;
            for (size_t i = 0; i < n; i++) {
                float v;
                if (i % 256 == 17) /* the block's absmax */
                    v = (float)qmax * (i % 512 == 17 ? 1.0f : -1.0f);
                else if (kind == 2)
                    v = fp4_mag[rnd() % 8] * ((rnd() & 1) ? -1.0f : 1.0f);
                else
                    v = (float)((int)(rnd() % (unsigned)(2 * qmax + 1)) - qmax);
                x[i] = v * s;
            }
            const loom_codec_t *c = find(spec);
            size_t len;
            unsigned char *buf = encode(c, x, n, &len);
            float *d = decode(c, buf, len, n);
            for (size_t i = 0; i < n; i++)
                cr_assert_eq(fbits(d[i]), fbits(x[i]),
                             "%s scale %g: x[%zu]=%a decoded %a", spec,
                             (double)s, i, (double)x[i], (double)d[i]);
            free(buf);
            free(d);
        }
    }
    free(x);
}

/* fp4 rounds to the nearest e2m1 value, ties to the even code. */
Test(compress, fp4_rounding)
{
    /* Block absmax 6 (scale 1), then the values to round. */
    static const float in[] = {6,    0.25f, 0.26f, 0.75f, 0.74f, 1.25f, 1.3f,
                               1.75f, 2.5f,  2.6f,  3.5f,  3.4f,  5.0f,  5.1f,
                               -0.3f, -5.0f, 0.1f};
    static const float want[] = {6,  0,    0.5f, 1,   0.5f, 1,    1.5f,
                                 2,  2,    3,    4,   3,    4,    6,
                                 -0.5f, -4, 0};
    size_t n = sizeof in / sizeof in[0], len;
    const loom_codec_t *c = find("fp4");
    unsigned char *buf = encode(c, in, n, &len);
    float *d = decode(c, buf, len, n);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(d[i], want[i], "fp4(%g) = %g, expected %g", (double)in[i],
                     (double)d[i], (double)want[i]);
    free(buf);
    free(d);
}

/* int8 rounds x * 127 / absmax to nearest even. */
Test(compress, int8_rounding)
{
    static const float in[] = {127, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, 0.49f,
                               126.5f, -127};
    static const float want[] = {127, 0, 2, 2, -0.0f, -2, 0, 126, -127};
    size_t n = sizeof in / sizeof in[0], len;
    const loom_codec_t *c = find("int8");
    unsigned char *buf = encode(c, in, n, &len);
    float *d = decode(c, buf, len, n);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(d[i], want[i], "int8(%g) = %g, expected %g", (double)in[i],
                     (double)d[i], (double)want[i]);
    free(buf);
    free(d);
}

/* Every kernel set the CPU runs gives the same bytes and values. */
Test(compress, same_bytes_on_every_kernel_set)
{
    static const char *const specs[] = {"bf16", "fp16", "int8", "int4", "fp4",
                                        "int8:7", "fp4:6", "topk:0.05"};
    static const char *const isas[] = {"generic", "avx2", "avx512"};
    const size_t n = 4099;
    float *x = malloc(n * sizeof *x);
    fill(x, n);
    x[3] = 1e-6f; x[4] = 70000.0f; x[5] = 3e-8f; /* fp16 subnormal, overflow */
    for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++) {
        const loom_codec_t *c = find(specs[s]);
        unsigned char *ref = NULL;
        float *refd = NULL, *refacc = NULL;
        size_t reflen = 0;
        for (size_t i = 0; i < 3; i++) {
            if (loomi_reduce_set_isa(isas[i]) != 0) continue;
            size_t len;
            unsigned char *buf = encode(c, x, n, &len);
            float *d = decode(c, buf, len, n);
            float *acc = malloc(n * sizeof *acc);
            for (size_t j = 0; j < n; j++) acc[j] = x[j];
            OK(loom_codec_decode_accumulate(c, buf, len, acc, n));
            if (!ref) {
                ref = buf; refd = d; refacc = acc; reflen = len;
                continue;
            }
            cr_assert_eq(len, reflen);
            cr_assert(memcmp(buf, ref, len) == 0, "%s: %s bytes differ",
                      specs[s], isas[i]);
            cr_assert(memcmp(d, refd, n * sizeof *d) == 0, "%s: %s decode",
                      specs[s], isas[i]);
            cr_assert(memcmp(acc, refacc, n * sizeof *d) == 0,
                      "%s: %s decode_accumulate", specs[s], isas[i]);
            free(buf); free(d); free(acc);
        }
        free(ref); free(refd); free(refacc);
    }
    const char *env = getenv("LOOM_REDUCE_ISA"); /* back to the default */
    if (!(env && *env && loomi_reduce_set_isa(env) == 0) && loomi_reduce_set_isa("avx2") != 0)
        loomi_reduce_set_isa("generic");
    free(x);
}

/* ---------------------------------------------------- bf16 and fp16 */

Test(compress, bf16_fp16_round_trip)
{
    const size_t n = 3001;
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = frand(100.0f);
    for (int f16 = 0; f16 < 2; f16++) {
        const loom_codec_t *c = find(f16 ? "fp16" : "bf16");
        cr_assert_eq(c->props, LOOM_CODEC_ADDITIVE);
        size_t len;
        unsigned char *buf = encode(c, x, n, &len);
        cr_assert_eq(len, 16 + 2 * n);
        float *d = decode(c, buf, len, n);
        for (size_t i = 0; i < n; i++) {
            uint16_t h = f16 ? loomi_fp32_to_fp16(x[i]) : loomi_fp32_to_bf16(x[i]);
            float want = f16 ? loomi_fp16_to_fp32(h) : loomi_bf16_to_fp32(h);
            cr_assert_eq(fbits(d[i]), fbits(want));
            float rel = f16 ? 0x1p-11f : 0x1p-8f;
            cr_assert_leq(fabsf(d[i] - x[i]), fabsf(x[i]) * rel + 0x1p-24f);
        }
        free(buf);
        free(d);
    }
    free(x);
}

/* Summing encoded buffers equals rounding the sum of the decoded values,
 * bit for bit, and chains (a + b + c) as a ring would. */
Test(compress, bf16_fp16_additive)
{
    const size_t n = 1025;
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b),
          *e = malloc(n * sizeof *e);
    for (size_t i = 0; i < n; i++) {
        a[i] = frand(10.0f); b[i] = frand(10.0f); e[i] = frand(10.0f);
    }
    for (int f16 = 0; f16 < 2; f16++) {
        const loom_codec_t *c = find(f16 ? "fp16" : "bf16");
        size_t la, lb, le;
        unsigned char *ea = encode(c, a, n, &la), *eb = encode(c, b, n, &lb),
                      *ee = encode(c, e, n, &le);
        float *da = decode(c, ea, la, n), *db = decode(c, eb, lb, n),
              *de = decode(c, ee, le, n);
        OK(loom_codec_reduce_encoded(c, ea, eb, la));
        OK(loom_codec_reduce_encoded(c, ea, ee, la));
        float *sum = decode(c, ea, la, n);
        for (size_t i = 0; i < n; i++) {
            float ab = f16 ? loomi_fp16_to_fp32(loomi_fp32_to_fp16(da[i] + db[i]))
                           : loomi_bf16_to_fp32(loomi_fp32_to_bf16(da[i] + db[i]));
            float abc = f16 ? loomi_fp16_to_fp32(loomi_fp32_to_fp16(ab + de[i]))
                            : loomi_bf16_to_fp32(loomi_fp32_to_bf16(ab + de[i]));
            cr_assert_eq(fbits(sum[i]), fbits(abc), "%s [%zu]", c->name, i);
        }
        /* In place (dst == src) doubles. */
        OK(loom_codec_reduce_encoded(c, eb, eb, lb));
        float *dbl = decode(c, eb, lb, n);
        for (size_t i = 0; i < n; i++)
            cr_assert_eq(dbl[i], 2 * db[i]);
        /* Mismatched counts are rejected. */
        size_t l2;
        unsigned char *e2 = encode(c, a, n - 1, &l2);
        EXPECT_ERR(loom_codec_reduce_encoded(c, ea, e2, l2), LOOM_ERR_REMOTE,
                   "malformed");
        free(e2);
        free(ea); free(eb); free(ee); free(da); free(db); free(de); free(sum);
        free(dbl);
    }
    EXPECT_ERR(loom_codec_reduce_encoded(find("int8"), a, b, 16),
               LOOM_ERR_INVALID_ARGUMENT, "not additive");
    free(a); free(b); free(e);
}

/* ---------------------------------------------------------------- topk */

static const float *g_keyx;
static int cmp_mag(const void *pa, const void *pb)
{
    size_t ia = *(const size_t *)pa, ib = *(const size_t *)pb;
    uint32_t ka = fbits(g_keyx[ia]) & 0x7fffffffu,
             kb = fbits(g_keyx[ib]) & 0x7fffffffu;
    if (ka != kb) return ka > kb ? -1 : 1;
    return ia < ib ? -1 : ia > ib;
}

Test(compress, topk_picks_the_k_largest)
{
    static const char *const specs[] = {"topk", "topk:0.1", "topk:0.5",
                                        "topk:1", "topk:0.001", "topk:.25"};
    static const double ratios[] = {0.01, 0.1, 0.5, 1.0, 0.001, 0.25};
    for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++) {
        const loom_codec_t *c = find(specs[s]);
        cr_assert_eq(c->props, LOOM_CODEC_GATHER_ONLY);
        for (size_t ci = 0; ci < N_COUNTS; ci++) {
            size_t n = counts[ci];
            float *x = malloc((n ? n : 1) * sizeof *x);
            for (size_t i = 0; i < n; i++) /* many ties, both signs */
                x[i] = (float)((int)(rnd() % 41) - 20) * 0.5f;
            if (n > 10) { x[3] = bitsf(0x7fc00000u); x[9] = -INFINITY; }
            size_t k = n ? (size_t)ceil((double)n * ratios[s] - 1e-9) : 0;
            if (n && !k) k = 1;
            size_t len;
            unsigned char *buf = encode(c, x, n, &len);
            cr_assert_eq(len, 24 + 8 * k, "%s n=%zu: len %zu, k %zu",
                         specs[s], n, len, k);
            float *d = decode(c, buf, len, n);
            size_t *idx = malloc((n ? n : 1) * sizeof *idx);
            for (size_t i = 0; i < n; i++) idx[i] = i;
            g_keyx = x;
            qsort(idx, n, sizeof *idx, cmp_mag);
            char *sel = calloc(n ? n : 1, 1);
            for (size_t j = 0; j < k; j++) sel[idx[j]] = 1;
            for (size_t i = 0; i < n; i++) {
                if (sel[i])
                    cr_assert_eq(fbits(d[i]), fbits(x[i]),
                                 "%s n=%zu: [%zu] should be sent", specs[s], n, i);
                else
                    cr_assert_eq(fbits(d[i]), 0u,
                                 "%s n=%zu: [%zu]=%g should not be sent",
                                 specs[s], n, i, (double)x[i]);
            }
            free(x); free(buf); free(d); free(idx); free(sel);
        }
    }
}

/* Over many steps, what was sent plus the final residual is what was put
 * in (integers, so every sum is exact). */
Test(compress, topk_error_feedback_conserves_the_sum)
{
    const size_t n = 777;
    const int steps = 20;
    const loom_codec_t *c = find("topk:0.02");
    loom_codec_state_t st;
    OK(loom_codec_state_create(&st));
    float *x = malloc(n * sizeof *x), *sent = calloc(n, sizeof *sent),
          *in = calloc(n, sizeof *in), *res = malloc(n * sizeof *res);
    size_t cap;
    OK(loom_codec_max_encoded_bytes(c, n, &cap));
    unsigned char *buf = malloc(cap);
    for (int t = 0; t < steps; t++) {
        for (size_t i = 0; i < n; i++) {
            x[i] = (float)((int)(rnd() % 21) - 10);
            in[i] += x[i];
        }
        size_t len;
        OK(loom_codec_encode_ef(c, st, 7, n, 0, x, n, buf, cap, &len, NULL));
        OK(loom_codec_decode_accumulate(c, buf, len, sent, n));
        OK(loom_codec_state_commit(st, 7));
    }
    OK(loom_codec_state_residual(st, 7, res, n));
    int nonzero = 0;
    for (size_t i = 0; i < n; i++) {
        cr_assert_eq(sent[i] + res[i], in[i], "[%zu]: sent %g + residual %g != %g",
                     i, (double)sent[i], (double)res[i], (double)in[i]);
        nonzero += res[i] != 0;
    }
    cr_assert_gt(nonzero, 0, "the residual carries what was not sent");
    OK(loom_codec_state_destroy(st));
    free(x); free(sent); free(in); free(res); free(buf);
}

/* Error feedback works with every codec: the residual is exactly
 * (x + previous residual) - decoded. */
Test(compress, error_feedback_residual_every_codec)
{
    static const char *const specs[] = {"bf16", "fp16", "int8", "int4", "fp4",
                                        "topk:0.1"};
    const size_t n = 600;
    float *x = malloc(n * sizeof *x), *d = malloc(n * sizeof *d),
          *res = malloc(n * sizeof *res), *res2 = malloc(n * sizeof *res2);
    for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++) {
        const loom_codec_t *c = find(specs[s]);
        loom_codec_state_t st;
        OK(loom_codec_state_create(&st));
        size_t cap, len;
        OK(loom_codec_max_encoded_bytes(c, n, &cap));
        unsigned char *buf = malloc(cap);
        fill(x, n);
        OK(loom_codec_encode_ef(c, st, 1, n, 0, x, n, buf, cap, &len, d));
        OK(loom_codec_state_commit(st, 1));
        OK(loom_codec_state_residual(st, 1, res, n));
        for (size_t i = 0; i < n; i++) /* zeros are kept as +0 */
            cr_assert_eq(fbits(res[i]), fbits(x[i] - d[i] + 0.0f), "%s [%zu]",
                         specs[s], i);
        /* Second step: y = x + res, the same with or without `decoded`. */
        loom_codec_state_t st2;
        OK(loom_codec_state_create(&st2));
        OK(loom_codec_encode_ef(c, st2, 1, n, 0, x, n, buf, cap, &len, NULL));
        OK(loom_codec_state_commit(st2, 1));
        OK(loom_codec_state_residual(st2, 1, res2, n));
        cr_assert(memcmp(res, res2, n * sizeof *res) == 0,
                  "%s: residual with and without decoded", specs[s]);
        OK(loom_codec_state_destroy(st2));
        free(buf);
        OK(loom_codec_state_destroy(st));
    }
    free(x); free(d); free(res); free(res2);
}

/* ------------------------------------------------- transactional state */

Test(compress, rollback_then_reencode_gives_the_same_bytes)
{
    const size_t n = 1000, half = 500;
    const loom_codec_t *c = find("topk:0.05");
    loom_codec_state_t st;
    OK(loom_codec_state_create(&st));
    float *x = malloc(n * sizeof *x), *r0 = malloc(n * sizeof *r0),
          *r1 = malloc(n * sizeof *r1);
    fill(x, n);
    size_t cap, l1, l2, l3;
    OK(loom_codec_max_encoded_bytes(c, half, &cap));
    unsigned char *b1 = malloc(cap), *b2 = malloc(cap), *b3 = malloc(cap);
    /* Step 1, committed: a residual exists. */
    OK(loom_codec_encode_ef(c, st, 99, n, 0, x, half, b1, cap, &l1, NULL));
    OK(loom_codec_encode_ef(c, st, 99, n, half, x + half, half, b1, cap, &l1,
                            NULL));
    OK(loom_codec_state_commit(st, 99));
    OK(loom_codec_state_residual(st, 99, r0, n));
    /* Step 2 fails (rollback), then is retried. */
    OK(loom_codec_encode_ef(c, st, 99, n, 0, x, half, b1, cap, &l1, NULL));
    OK(loom_codec_state_rollback(st, 99));
    OK(loom_codec_state_residual(st, 99, r1, n));
    cr_assert(memcmp(r0, r1, n * sizeof *r0) == 0, "rollback kept the residual");
    OK(loom_codec_encode_ef(c, st, 99, n, 0, x, half, b2, cap, &l2, NULL));
    cr_assert_eq(l1, l2);
    cr_assert(memcmp(b1, b2, l1) == 0, "the retry sends the same bytes");
    /* Encoding a range twice in one transaction is the same too. */
    OK(loom_codec_encode_ef(c, st, 99, n, 0, x, half, b3, cap, &l3, NULL));
    cr_assert(memcmp(b1, b3, l1) == 0);
    /* Commit with only the first half encoded: the second half keeps its
     * residual. */
    OK(loom_codec_state_commit(st, 99));
    OK(loom_codec_state_residual(st, 99, r1, n));
    cr_assert(memcmp(r0 + half, r1 + half, half * sizeof *r0) == 0);
    cr_assert(memcmp(r0, r1, half * sizeof *r0) != 0);
    /* After the commit the next step differs (the residual grew). */
    OK(loom_codec_encode_ef(c, st, 99, n, 0, x, half, b3, cap, &l3, NULL));
    cr_assert(l3 != l1 || memcmp(b1, b3, l1) != 0);
    OK(loom_codec_state_rollback(st, 99));
    /* A failed encode leaves the state as it was. */
    EXPECT_ERR(loom_codec_encode_ef(c, st, 99, n, 0, x, half, b3, 10, &l3, NULL),
               LOOM_ERR_INVALID_ARGUMENT, "capacity");
    OK(loom_codec_state_commit(st, 99));
    float *r2 = malloc(n * sizeof *r2);
    OK(loom_codec_state_residual(st, 99, r2, n));
    cr_assert(memcmp(r1, r2, n * sizeof *r1) == 0);
    /* Commit and rollback of an unknown key do nothing; reset forgets. */
    OK(loom_codec_state_commit(st, 12345));
    OK(loom_codec_state_rollback(st, 12345));
    OK(loom_codec_state_reset(st, 99));
    EXPECT_ERR(loom_codec_state_residual(st, 99, r2, n),
               LOOM_ERR_INVALID_ARGUMENT, "key");
    OK(loom_codec_state_destroy(st));
    free(x); free(r0); free(r1); free(r2); free(b1); free(b2); free(b3);
}

Test(compress, many_keys)
{
    const loom_codec_t *c = find("int8");
    loom_codec_state_t st;
    OK(loom_codec_state_create(&st));
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8.5f}, r[8];
    unsigned char buf[64];
    size_t len;
    for (uint64_t k = 0; k < 500; k++) {
        x[0] = (float)k;
        OK(loom_codec_encode_ef(c, st, k * 0x100000001ull, 8, 0, x, 8, buf,
                                sizeof buf, &len, NULL));
        if (k % 2) OK(loom_codec_state_commit(st, k * 0x100000001ull));
    }
    for (uint64_t k = 0; k < 500; k++) {
        OK(loom_codec_state_residual(st, k * 0x100000001ull, r, 8));
        if (k % 2 == 0)
            for (int i = 0; i < 8; i++) cr_assert_eq(r[i], 0.0f);
    }
    EXPECT_ERR(loom_codec_encode_ef(c, st, 0x100000001ull, 9, 0, x, 8, buf,
                                    sizeof buf, &len, NULL),
               LOOM_ERR_INVALID_ARGUMENT, "tensor_count");
    OK(loom_codec_state_destroy(st));
}

/* --------------------------------------------- the owner's final value */

/* The owner's decoded value equals what every receiver decodes, also in
 * place, and encoding is deterministic. */
Test(compress, encode_keeps_the_decoded_value)
{
    static const char *const specs[] = {"bf16", "fp16", "int8", "int4", "fp4",
                                        "topk:0.1"};
    const size_t n = 2000;
    float *x = malloc(n * sizeof *x), *own = malloc(n * sizeof *own),
          *inplace = malloc(n * sizeof *inplace);
    fill(x, n);
    for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++) {
        const loom_codec_t *c = find(specs[s]);
        size_t cap, l1, l2;
        OK(loom_codec_max_encoded_bytes(c, n, &cap));
        unsigned char *b1 = malloc(cap), *b2 = malloc(cap);
        OK(loom_codec_encode(c, x, n, b1, cap, &l1, own));
        memcpy(inplace, x, n * sizeof *x);
        OK(loom_codec_encode(c, inplace, n, b2, cap, &l2, inplace));
        cr_assert_eq(l1, l2);
        cr_assert(memcmp(b1, b2, l1) == 0, "%s: deterministic", specs[s]);
        float *recv = decode(c, b1, l1, n);
        cr_assert(memcmp(recv, own, n * sizeof *own) == 0, "%s", specs[s]);
        cr_assert(memcmp(recv, inplace, n * sizeof *own) == 0, "%s", specs[s]);
        free(b1); free(b2); free(recv);
    }
    free(x); free(own); free(inplace);
}

/* decode_accumulate adds onto what is there, in fp32. */
Test(compress, decode_accumulate_adds)
{
    static const char *const specs[] = {"bf16", "fp16", "int8", "int4", "fp4",
                                        "topk:0.1"};
    const size_t n = 1500;
    float *x = malloc(n * sizeof *x), *acc = malloc(n * sizeof *acc);
    fill(x, n);
    for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++) {
        const loom_codec_t *c = find(specs[s]);
        size_t len;
        unsigned char *buf = encode(c, x, n, &len);
        float *d = decode(c, buf, len, n);
        for (size_t i = 0; i < n; i++) acc[i] = (float)i;
        OK(loom_codec_decode_accumulate(c, buf, len, acc, n));
        for (size_t i = 0; i < n; i++)
            cr_assert_eq(fbits(acc[i]), fbits((float)i + d[i]), "%s [%zu]",
                         specs[s], i);
        free(buf); free(d);
    }
    free(x); free(acc);
}

/* --------------------------------------------------- malformed input */

static void expect_rejected(const loom_codec_t *c, const void *buf,
                            size_t len, size_t n, const char *what)
{
    float *acc = malloc((n ? n : 1) * sizeof *acc);
    for (size_t i = 0; i < n; i++) acc[i] = 1.0f;
    /* A copy of exactly len bytes, so ASan sees any read past it. */
    unsigned char *copy = malloc(len ? len : 1);
    memcpy(copy, buf, len);
    loom_result_t r = loom_codec_decode_accumulate(c, copy, len, acc, n);
    cr_assert_eq(r, LOOM_ERR_REMOTE, "%s: %s accepted (%d)", c->name, what, r);
    cr_assert(strstr(loom_get_last_error(), "malformed") != NULL, "%s",
              loom_get_last_error());
    r = loom_codec_decode(c, copy, len, acc, n);
    cr_assert_eq(r, LOOM_ERR_REMOTE, "%s: %s accepted by decode", c->name, what);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(acc[i], 1.0f, "%s: %s: output touched", c->name, what);
    free(copy);
    free(acc);
}

Test(compress, truncated_and_corrupt_input_rejected)
{
    static const char *const specs[] = {"bf16", "fp16", "int8", "int4", "fp4",
                                        "int4:6", "topk:0.1"};
    const size_t n = 301; /* odd: a padding nibble for the 4-bit codecs */
    float *x = malloc(n * sizeof *x);
    fill(x, n);
    for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++) {
        const loom_codec_t *c = find(specs[s]);
        size_t len;
        unsigned char *buf = encode(c, x, n, &len);
        char what[64];
        /* Every truncation, and one byte too many. */
        for (size_t l = 0; l < len; l++) {
            snprintf(what, sizeof what, "truncated to %zu", l);
            expect_rejected(c, buf, l, n, what);
        }
        unsigned char *longer = calloc(len + 1, 1);
        memcpy(longer, buf, len);
        expect_rejected(c, longer, len + 1, n, "one byte too long");
        free(longer);
        /* Every header byte changed. */
        size_t hdr = strncmp(specs[s], "topk", 4) == 0 ? 24 : 16;
        for (size_t b = 0; b < hdr; b++) {
            buf[b] ^= 0x41;
            snprintf(what, sizeof what, "header byte %zu", b);
            expect_rejected(c, buf, len, n, what);
            buf[b] ^= 0x41;
        }
        /* The wrong count for the caller. */
        float *acc = malloc(n * sizeof *acc);
        EXPECT_ERR(loom_codec_decode_accumulate(c, buf, len, acc, n - 1),
                   LOOM_ERR_REMOTE, "values");
        free(acc);
        /* Random garbage never crashes (ASan watches). */
        unsigned char *junk = malloc(len);
        float *out = malloc(n * sizeof *out);
        for (int t = 0; t < 200; t++) {
            memcpy(junk, buf, len);
            for (int f = 0; f < 1 + t % 5; f++)
                junk[16 + rnd() % (len - 16)] = (unsigned char)rnd();
            loom_result_t r = loom_codec_decode(c, junk, len, out, n);
            cr_assert(r == LOOM_SUCCESS || r == LOOM_ERR_REMOTE);
        }
        free(junk); free(out);
        free(buf);
    }
    free(x);
}

Test(compress, bad_payload_values_rejected)
{
    const size_t n = 300;
    float *x = malloc(n * sizeof *x);
    fill(x, n);
    size_t len;
    /* Scales: negative, infinite, too large. */
    static const char *const blk[] = {"int8", "int4", "fp4"};
    for (int k = 0; k < 3; k++) {
        const loom_codec_t *c = find(blk[k]);
        unsigned char *buf = encode(c, x, n, &len);
        static const uint32_t bad_scales[] = {0xbf800000u, 0x7f800000u,
                                              0x7f7fffffu, 0xff800000u};
        for (int i = 0; i < 4; i++) {
            unsigned char save[4];
            memcpy(save, buf + 20, 4); /* block 1's scale */
            uint32_t v = bad_scales[i];
            for (int j = 0; j < 4; j++) buf[20 + j] = (unsigned char)(v >> 8 * j);
            expect_rejected(c, buf, len, n, "bad scale");
            memcpy(buf + 20, save, 4);
        }
        /* NaN scales are valid (a block with a NaN). */
        float *d = decode(c, buf, len, n);
        free(d);
        free(buf);
    }
    /* int8 code -128, int4 code -8, a set padding nibble. */
    {
        const loom_codec_t *c = find("int8");
        unsigned char *buf = encode(c, x, n, &len);
        buf[len - 5] = 0x80;
        expect_rejected(c, buf, len, n, "int8 code -128");
        free(buf);
        c = find("int4");
        buf = encode(c, x, n, &len);
        buf[len - 7] = 0x8f & (unsigned char)(buf[len - 7] | 0x80);
        buf[len - 7] = (unsigned char)((buf[len - 7] & 0x0f) | 0x80);
        expect_rejected(c, buf, len, n, "int4 code -8");
        free(buf);
        float y[3] = {1, 2, 3};
        c = find("fp4");
        buf = encode(c, y, 3, &len);
        buf[len - 1] |= 0x10;
        expect_rejected(c, buf, len, 3, "padding nibble");
        free(buf);
    }
    /* topk: index out of range, repeated, decreasing; wrong k. */
    {
        const loom_codec_t *c = find("topk:0.1");
        unsigned char *buf = encode(c, x, n, &len);
        size_t k = (len - 24) / 8;
        cr_assert_gt(k, 2);
        unsigned char save[12];
        memcpy(save, buf + 24, 12);
        buf[24] = 0x2c; buf[25] = 0x01; buf[26] = 0; buf[27] = 0; /* 300 */
        expect_rejected(c, buf, len, n, "index == count");
        memcpy(buf + 24, save, 12);
        memcpy(buf + 28, buf + 24, 4);
        expect_rejected(c, buf, len, n, "repeated index");
        memcpy(buf + 24, save, 12);
        memcpy(buf + 24, save + 4, 4);
        memcpy(buf + 28, save, 4);
        expect_rejected(c, buf, len, n, "decreasing indices");
        memcpy(buf + 24, save, 12);
        const loom_codec_t *c2 = find("topk:0.2");
        expect_rejected(c2, buf, len, n, "another k");
        free(buf);
    }
    /* A buffer of another codec. */
    {
        unsigned char *buf = encode(find("int8"), x, n, &len);
        expect_rejected(find("int8:128"), buf, len, n, "another block size");
        expect_rejected(find("fp4"), buf, len, n, "another codec");
        free(buf);
    }
    free(x);
}

/* ---------------------------------------------- zero length, NaN, Inf */

Test(compress, zero_length)
{
    static const char *const specs[] = {"bf16", "fp16", "int8", "int4", "fp4",
                                        "topk"};
    for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++) {
        const loom_codec_t *c = find(specs[s]);
        size_t cap, len = 0;
        OK(loom_codec_max_encoded_bytes(c, 0, &cap));
        unsigned char buf[64];
        cr_assert_leq(cap, sizeof buf);
        OK(loom_codec_encode(c, NULL, 0, buf, cap, &len, NULL));
        cr_assert_eq(len, strcmp(specs[s], "topk") ? 16u : 24u);
        OK(loom_codec_decode(c, buf, len, NULL, 0));
        OK(loom_codec_decode_accumulate(c, buf, len, NULL, 0));
        if (c->props & LOOM_CODEC_ADDITIVE)
            OK(loom_codec_reduce_encoded(c, buf, buf, len));
        loom_codec_state_t st;
        OK(loom_codec_state_create(&st));
        OK(loom_codec_encode_ef(c, st, 3, 0, 0, NULL, 0, buf, cap, &len, NULL));
        OK(loom_codec_state_commit(st, 3));
        OK(loom_codec_state_destroy(st));
    }
}

/* A block holding a NaN or an infinity decodes to NaN (it is never hidden
 * or turned into a finite number); other blocks are unaffected. */
Test(compress, nan_and_inf)
{
    const size_t n = 600; /* three blocks of 256 */
    float *x = malloc(n * sizeof *x);
    fill(x, n);
    x[10] = bitsf(0x7fc00000u);
    x[300] = INFINITY;
    static const char *const blk[] = {"int8", "int4", "fp4"};
    for (int k = 0; k < 3; k++) {
        const loom_codec_t *c = find(blk[k]);
        size_t len;
        unsigned char *buf = encode(c, x, n, &len);
        float *d = decode(c, buf, len, n);
        for (size_t i = 0; i < n; i++) {
            if (i < 512)
                cr_assert(isnan(d[i]), "%s [%zu] = %g", blk[k], i, (double)d[i]);
            else
                cr_assert(isfinite(d[i]));
        }
        free(buf); free(d);
    }
    for (int f16 = 0; f16 < 2; f16++) {
        const loom_codec_t *c = find(f16 ? "fp16" : "bf16");
        float y[4] = {bitsf(0x7fc00000u), INFINITY, -INFINITY, f16 ? 1e6f : FLT_MAX};
        if (!f16) y[3] = FLT_MAX; /* rounds up to inf in bf16 */
        size_t len;
        unsigned char *buf = encode(c, y, 4, &len);
        float *d = decode(c, buf, len, 4);
        cr_assert(isnan(d[0]));
        cr_assert(isinf(d[1]) && d[1] > 0);
        cr_assert(isinf(d[2]) && d[2] < 0);
        cr_assert(isinf(d[3]), "%s overflow gives inf", c->name);
        free(buf); free(d);
    }
    /* topk sends NaN and inf first; error feedback restarts a non-finite
     * residual from zero. */
    {
        const loom_codec_t *c = find("topk:0.01");
        loom_codec_state_t st;
        OK(loom_codec_state_create(&st));
        size_t cap, len;
        OK(loom_codec_max_encoded_bytes(c, n, &cap));
        unsigned char *buf = malloc(cap);
        float *d = malloc(n * sizeof *d), *res = malloc(n * sizeof *res);
        OK(loom_codec_encode_ef(c, st, 5, n, 0, x, n, buf, cap, &len, d));
        cr_assert(isnan(d[10]) && isinf(d[300]));
        OK(loom_codec_state_commit(st, 5));
        OK(loom_codec_state_residual(st, 5, res, n));
        for (size_t i = 0; i < n; i++) cr_assert(isfinite(res[i]), "[%zu]", i);
        cr_assert_eq(res[10], 0.0f);
        cr_assert_eq(res[300], 0.0f);
        OK(loom_codec_state_destroy(st));
        free(buf); free(d); free(res);
    }
    /* Tiny and subnormal blocks keep the bound, give or take the
     * precision of a subnormal scale (qmax * 2^-149). */
    {
        static const float blocks[3][4] = {{1e-39f, -2e-40f, 0, 1e-41f},
                                           {2e-38f, -1e-38f, 0, 1.5e-38f},
                                           {1e-30f, 3e-31f, -7e-31f, 0}};
        static const char *const specs[] = {"int8:4", "int4:4", "fp4:4"};
        static const float qm[] = {127, 7, 6};
        for (int k = 0; k < 3; k++)
            for (int b = 0; b < 3; b++) {
                const loom_codec_t *c = find(specs[k]);
                size_t len;
                unsigned char *buf = encode(c, blocks[b], 4, &len);
                float *d = decode(c, buf, len, 4);
                float amax = fabsf(blocks[b][0]) > fabsf(blocks[b][1])
                                 ? fabsf(blocks[b][0]) : fabsf(blocks[b][1]);
                if (fabsf(blocks[b][2]) > amax) amax = fabsf(blocks[b][2]);
                for (int i = 0; i < 4; i++) {
                    float x = blocks[b][i];
                    float bound = k == 2 ? fmaxf(fabsf(x) / 4, amax / 24)
                                         : amax / (2 * qm[k]);
                    bound = bound * 1.0001f + qm[k] * 0x1p-149f;
                    cr_assert_leq(fabsf(d[i] - x), bound, "%s %g -> %g",
                                  specs[k], (double)x, (double)d[i]);
                }
                free(buf); free(d);
            }
    }
    free(x);
}

/* ------------------------------------------------------------ registry */

/* A user codec: raw little-endian fp32 with a 4-byte count, negated on
 * the wire (so a mistake shows), gather-only, optional scale parameter. */
static loom_result_t neg_configure(const loom_codec_t *c, const char *args,
                                   const void **params)
{
    (void)c;
    static float two = 2.0f, one = 1.0f;
    if (args && strcmp(args, "2") != 0) return LOOM_ERR_INVALID_ARGUMENT;
    *params = args ? &two : &one;
    return LOOM_SUCCESS;
}
static size_t neg_max(const loom_codec_t *c, size_t n)
{
    (void)c;
    return 4 + 4 * n;
}
static loom_result_t neg_encode(const loom_codec_t *c, const float *src,
                                size_t n, void *dst, size_t cap, size_t *len)
{
    (void)cap;
    float m = *(const float *)c->params;
    uint32_t n32 = (uint32_t)n;
    memcpy(dst, &n32, 4);
    for (size_t i = 0; i < n; i++) {
        float v = -src[i] * m;
        memcpy((char *)dst + 4 + 4 * i, &v, 4);
    }
    *len = 4 + 4 * n;
    return LOOM_SUCCESS;
}
static loom_result_t neg_decode_acc(const loom_codec_t *c, const void *src,
                                    size_t len, float *acc, size_t n)
{
    float m = *(const float *)c->params;
    uint32_t n32;
    if (len != 4 + 4 * n) return LOOM_ERR_REMOTE;
    memcpy(&n32, src, 4);
    if (n32 != n) return LOOM_ERR_REMOTE;
    for (size_t i = 0; i < n; i++) {
        float v;
        memcpy(&v, (const char *)src + 4 + 4 * i, 4);
        acc[i] += -v / m;
    }
    return LOOM_SUCCESS;
}

static loom_codec_t neg_codec(void)
{
    loom_codec_t c;
    memset(&c, 0, sizeof c);
    c.size = sizeof c;
    c.name = "test-neg";
    c.props = LOOM_CODEC_GATHER_ONLY;
    c.configure = neg_configure;
    c.max_encoded_bytes = neg_max;
    c.encode = neg_encode;
    c.decode_accumulate = neg_decode_acc; /* decode derived by Loom */
    return c;
}

Test(compress, user_codec)
{
    loom_codec_t t = neg_codec();
    OK(loom_codec_register(&t));
    t.name = "overwritten"; /* the registry keeps its own copy */
    const loom_codec_t *c = find("test-neg"), *c2 = find("test-neg:2");
    cr_assert_str_eq(c->name, "test-neg");
    cr_assert_str_eq(c2->name, "test-neg:2");
    cr_assert_eq(find("test-neg"), c, "the same spec gives the same pointer");
    cr_assert_neq(c, c2);
    float x[5] = {1, -2, 3.5f, 0, 8}, acc[5] = {1, 1, 1, 1, 1}, d[5];
    size_t len;
    unsigned char buf[64];
    OK(loom_codec_encode(c2, x, 5, buf, sizeof buf, &len, d));
    cr_assert_eq(len, 24u);
    float v;
    memcpy(&v, buf + 4 + 8, 4);
    cr_assert_eq(v, -7.0f, "params reach the codec");
    for (int i = 0; i < 5; i++) cr_assert_eq(d[i], x[i]);
    OK(loom_codec_decode_accumulate(c2, buf, len, acc, 5));
    for (int i = 0; i < 5; i++) cr_assert_eq(acc[i], x[i] + 1);
    EXPECT_ERR(loom_codec_decode(c, buf, 3, d, 5), LOOM_ERR_REMOTE, "test-neg");
    EXPECT_ERR(loom_codec_find("test-neg:3", &c), LOOM_ERR_INVALID_ARGUMENT,
               "spec");
    /* Error feedback through a user codec. */
    loom_codec_state_t st;
    OK(loom_codec_state_create(&st));
    OK(loom_codec_encode_ef(c, st, 1, 5, 0, x, 5, buf, sizeof buf, &len, NULL));
    OK(loom_codec_state_commit(st, 1));
    OK(loom_codec_state_residual(st, 1, acc, 5));
    for (int i = 0; i < 5; i++) cr_assert_eq(acc[i], 0.0f);
    OK(loom_codec_state_destroy(st));

    /* Duplicate names, a built-in's included. */
    t = neg_codec();
    EXPECT_ERR(loom_codec_register(&t), LOOM_ERR_INVALID_ARGUMENT, "name");
    t.name = "int8";
    EXPECT_ERR(loom_codec_register(&t), LOOM_ERR_INVALID_ARGUMENT,
               "already registered");
}

Test(compress, user_codec_decode_only_and_no_parameters)
{
    loom_codec_t t = neg_codec();
    t.name = "test-plain";
    t.configure = NULL;
    static float one = 1.0f;
    t.params = &one; /* fixed parameters */
    OK(loom_codec_register(&t));
    const loom_codec_t *c = find("test-plain");
    EXPECT_ERR(loom_codec_find("test-plain:1", &c), LOOM_ERR_INVALID_ARGUMENT,
               "no parameters");
    float x[3] = {1, 2, 3}, d[3] = {9, 9, 9};
    unsigned char buf[32];
    size_t len;
    OK(loom_codec_encode(c, x, 3, buf, sizeof buf, &len, NULL));
    OK(loom_codec_decode(c, buf, len, d, 3));
    for (int i = 0; i < 3; i++) cr_assert_eq(d[i], x[i]);
}

Test(compress, register_checks_every_field)
{
    loom_codec_t t = neg_codec();
    EXPECT_ERR(loom_codec_register(NULL), LOOM_ERR_INVALID_ARGUMENT, "codec");
    t.size = 8;
    EXPECT_ERR(loom_codec_register(&t), LOOM_ERR_INVALID_ARGUMENT, "codec->size");
    t = neg_codec();
    t.name = NULL;
    EXPECT_ERR(loom_codec_register(&t), LOOM_ERR_INVALID_ARGUMENT, "codec->name");
    t.name = "Upper";
    EXPECT_ERR(loom_codec_register(&t), LOOM_ERR_INVALID_ARGUMENT, "codec->name");
    t.name = "a:b";
    EXPECT_ERR(loom_codec_register(&t), LOOM_ERR_INVALID_ARGUMENT, "codec->name");
    t.name = "";
    EXPECT_ERR(loom_codec_register(&t), LOOM_ERR_INVALID_ARGUMENT, "codec->name");
    t.name = "a-name-that-is-far-too-long-for-the-registry";
    EXPECT_ERR(loom_codec_register(&t), LOOM_ERR_INVALID_ARGUMENT, "codec->name");
    t = neg_codec();
    t.name = "test-bad";
    t.props = 0;
    EXPECT_ERR(loom_codec_register(&t), LOOM_ERR_INVALID_ARGUMENT, "codec->props");
    t.props = LOOM_CODEC_ADDITIVE | LOOM_CODEC_GATHER_ONLY;
    EXPECT_ERR(loom_codec_register(&t), LOOM_ERR_INVALID_ARGUMENT, "codec->props");
    t.props = 0x100 | LOOM_CODEC_GATHER_ONLY;
    EXPECT_ERR(loom_codec_register(&t), LOOM_ERR_INVALID_ARGUMENT, "codec->props");
    t.props = LOOM_CODEC_ADDITIVE; /* additive needs reduce_encoded */
    EXPECT_ERR(loom_codec_register(&t), LOOM_ERR_INVALID_ARGUMENT,
               "codec->reduce_encoded");
    t = neg_codec();
    t.name = "test-bad";
    t.encode = NULL;
    EXPECT_ERR(loom_codec_register(&t), LOOM_ERR_INVALID_ARGUMENT, "codec->encode");
    t = neg_codec();
    t.name = "test-bad";
    t.max_encoded_bytes = NULL;
    EXPECT_ERR(loom_codec_register(&t), LOOM_ERR_INVALID_ARGUMENT,
               "codec->max_encoded_bytes");
    t = neg_codec();
    t.name = "test-bad";
    t.decode_accumulate = NULL;
    EXPECT_ERR(loom_codec_register(&t), LOOM_ERR_INVALID_ARGUMENT, "codec->decode");
    const loom_codec_t *c;
    EXPECT_ERR(loom_codec_find("test-bad", &c), LOOM_ERR_INVALID_ARGUMENT,
               "names no codec");
}

Test(compress, find_specs)
{
    const loom_codec_t *c = NULL;
    static const char *const bad[] = {
        "",       "nope",    "int8:",     "int8:0",    "int8:abc", "int8:-4",
        "int8: 4", "int4:3", "fp4:1",     "int8:2000000", "topk:0", "topk:1.5",
        "topk:abc", "topk:1e-3", "topk:0.0000000001", "bf16:3", "INT8",
        ":3",     "topk:",   "fp16:",
        "a-spec-that-is-much-longer-than-sixty-three-characters-in-all-xxxxx"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        EXPECT_ERR(loom_codec_find(bad[i], &c), LOOM_ERR_INVALID_ARGUMENT, "spec");
    cr_assert_null(c, "nothing stored on failure");
    cr_assert(strstr((loom_codec_find("nope", &c), loom_get_last_error()),
                     "int8") != NULL, "the message lists the known codecs");
    /* "int8" and "int8:256" are two instances with the same bytes. */
    const loom_codec_t *a = find("int8"), *b = find("int8:256"), *e = find("int8:8");
    cr_assert_neq(a, b);
    cr_assert_eq(a->props, LOOM_CODEC_DECODE_REDUCE);
    float x[300];
    fill(x, 300);
    size_t la, lb, le;
    unsigned char *ba = encode(a, x, 300, &la), *bb = encode(b, x, 300, &lb),
                  *be = encode(e, x, 300, &le);
    cr_assert_eq(la, lb);
    cr_assert(memcmp(ba, bb, la) == 0);
    cr_assert_gt(le, la, "smaller blocks, more scales");
    free(ba); free(bb); free(be);
    find("topk:1.0"); find("topk:0.000000001"); find("fp4:1048576");
}

/* ---------------------------------------------------------- arguments */

Test(compress, bad_arguments)
{
    const loom_codec_t *c = find("int8");
    float x[16] = {1}, acc[16];
    unsigned char buf[256];
    size_t len = 0, cap;
    OK(loom_codec_max_encoded_bytes(c, 16, &cap));
    EXPECT_ERR(loom_codec_find(NULL, &c), LOOM_ERR_INVALID_ARGUMENT, "spec");
    EXPECT_ERR(loom_codec_find("int8", NULL), LOOM_ERR_INVALID_ARGUMENT, "codec");
    EXPECT_ERR(loom_codec_max_encoded_bytes(NULL, 1, &cap),
               LOOM_ERR_INVALID_ARGUMENT, "codec");
    EXPECT_ERR(loom_codec_max_encoded_bytes(c, 1, NULL),
               LOOM_ERR_INVALID_ARGUMENT, "bytes");
    EXPECT_ERR(loom_codec_max_encoded_bytes(c, SIZE_MAX, &cap),
               LOOM_ERR_INVALID_ARGUMENT, "count");
    EXPECT_ERR(loom_codec_max_encoded_bytes(find("topk"), (size_t)1 << 33, &cap),
               LOOM_ERR_INVALID_ARGUMENT, "count");
    /* A table that is not an instance (not from loom_codec_find). */
    loom_codec_t fake = neg_codec();
    EXPECT_ERR(loom_codec_encode(&fake, x, 16, buf, sizeof buf, &len, NULL),
               LOOM_ERR_INVALID_ARGUMENT, "loom_codec_find");
    EXPECT_ERR(loom_codec_encode(NULL, x, 16, buf, sizeof buf, &len, NULL),
               LOOM_ERR_INVALID_ARGUMENT, "codec");
    EXPECT_ERR(loom_codec_encode(c, NULL, 16, buf, sizeof buf, &len, NULL),
               LOOM_ERR_INVALID_ARGUMENT, "src");
    EXPECT_ERR(loom_codec_encode(c, x, 16, NULL, sizeof buf, &len, NULL),
               LOOM_ERR_INVALID_ARGUMENT, "dst");
    EXPECT_ERR(loom_codec_encode(c, x, 16, buf, sizeof buf, NULL, NULL),
               LOOM_ERR_INVALID_ARGUMENT, "len");
    EXPECT_ERR(loom_codec_encode(c, x, 16, buf, cap - 1, &len, NULL),
               LOOM_ERR_INVALID_ARGUMENT, "capacity");
    EXPECT_ERR(loom_codec_encode(c, x, 16, x + 4, cap, &len, NULL),
               LOOM_ERR_INVALID_ARGUMENT, "overlaps");
    EXPECT_ERR(loom_codec_encode(c, x, 16, buf, sizeof buf, &len, x + 1),
               LOOM_ERR_INVALID_ARGUMENT, "decoded");
    EXPECT_ERR(loom_codec_encode(c, x, 16, buf, sizeof buf, &len,
                                 (float *)(void *)(buf + 8)),
               LOOM_ERR_INVALID_ARGUMENT, "decoded");
    cr_assert_eq(len, 0u, "len untouched on failure");
    OK(loom_codec_encode(c, x, 16, buf, sizeof buf, &len, NULL));
    EXPECT_ERR(loom_codec_decode(NULL, buf, len, acc, 16),
               LOOM_ERR_INVALID_ARGUMENT, "codec");
    EXPECT_ERR(loom_codec_decode(c, NULL, len, acc, 16),
               LOOM_ERR_INVALID_ARGUMENT, "src");
    EXPECT_ERR(loom_codec_decode(c, buf, len, NULL, 16),
               LOOM_ERR_INVALID_ARGUMENT, "dst");
    EXPECT_ERR(loom_codec_decode_accumulate(c, buf, len, NULL, 16),
               LOOM_ERR_INVALID_ARGUMENT, "acc");
    EXPECT_ERR(loom_codec_decode_accumulate(c, buf, len, (float *)(void *)buf, 4),
               LOOM_ERR_INVALID_ARGUMENT, "overlaps");
    EXPECT_ERR(loom_codec_reduce_encoded(NULL, buf, buf, len),
               LOOM_ERR_INVALID_ARGUMENT, "codec");
    const loom_codec_t *h = find("bf16");
    EXPECT_ERR(loom_codec_reduce_encoded(h, NULL, buf, len),
               LOOM_ERR_INVALID_ARGUMENT, "dst");
    EXPECT_ERR(loom_codec_reduce_encoded(h, buf, NULL, len),
               LOOM_ERR_INVALID_ARGUMENT, "src");
    EXPECT_ERR(loom_codec_reduce_encoded(h, buf, buf + 2, 40),
               LOOM_ERR_INVALID_ARGUMENT, "overlaps");

    loom_codec_state_t st;
    EXPECT_ERR(loom_codec_state_create(NULL), LOOM_ERR_INVALID_ARGUMENT, "state");
    EXPECT_ERR(loom_codec_state_destroy(NULL), LOOM_ERR_INVALID_ARGUMENT, "state");
    EXPECT_ERR(loom_codec_state_commit(NULL, 1), LOOM_ERR_INVALID_ARGUMENT, "state");
    EXPECT_ERR(loom_codec_state_rollback(NULL, 1), LOOM_ERR_INVALID_ARGUMENT,
               "state");
    EXPECT_ERR(loom_codec_state_reset(NULL, 1), LOOM_ERR_INVALID_ARGUMENT, "state");
    EXPECT_ERR(loom_codec_state_residual(NULL, 1, acc, 16),
               LOOM_ERR_INVALID_ARGUMENT, "state");
    OK(loom_codec_state_create(&st));
    EXPECT_ERR(loom_codec_encode_ef(c, NULL, 1, 16, 0, x, 16, buf, sizeof buf,
                                    &len, NULL),
               LOOM_ERR_INVALID_ARGUMENT, "state");
    EXPECT_ERR(loom_codec_encode_ef(c, st, 1, 16, 17, x, 0, buf, sizeof buf,
                                    &len, NULL),
               LOOM_ERR_INVALID_ARGUMENT, "offset");
    EXPECT_ERR(loom_codec_encode_ef(c, st, 1, 16, 8, x, 16, buf, sizeof buf,
                                    &len, NULL),
               LOOM_ERR_INVALID_ARGUMENT, "count");
    EXPECT_ERR(loom_codec_encode_ef(c, st, 1, 16, 0, NULL, 16, buf, sizeof buf,
                                    &len, NULL),
               LOOM_ERR_INVALID_ARGUMENT, "src");
    EXPECT_ERR(loom_codec_encode_ef(c, st, 1, SIZE_MAX, 0, x, 16, buf,
                                    sizeof buf, &len, NULL),
               LOOM_ERR_INVALID_ARGUMENT, "tensor_count");
    OK(loom_codec_encode_ef(c, st, 1, 16, 0, x, 16, buf, sizeof buf, &len, NULL));
    EXPECT_ERR(loom_codec_state_residual(st, 1, NULL, 16),
               LOOM_ERR_INVALID_ARGUMENT, "residual");
    EXPECT_ERR(loom_codec_state_residual(st, 1, acc, 15),
               LOOM_ERR_INVALID_ARGUMENT, "count");
    EXPECT_ERR(loom_codec_state_residual(st, 2, acc, 16),
               LOOM_ERR_INVALID_ARGUMENT, "key");
    OK(loom_codec_state_destroy(st));
}

/* Chunks encoded out of order, overlapping, with gaps: commit keeps the
 * gaps' residual and takes the encoded chunks'. */
Test(compress, commit_with_gaps_and_overlaps)
{
    const size_t n = 1000;
    const loom_codec_t *c = find("int4:8");
    loom_codec_state_t st;
    OK(loom_codec_state_create(&st));
    float *x = malloc(n * sizeof *x), *r0 = malloc(n * sizeof *r0),
          *r1 = malloc(n * sizeof *r1), *d = malloc(n * sizeof *d);
    fill(x, n);
    size_t cap, len;
    OK(loom_codec_max_encoded_bytes(c, n, &cap));
    unsigned char *buf = malloc(cap);
    OK(loom_codec_encode_ef(c, st, 4, n, 0, x, n, buf, cap, &len, NULL));
    OK(loom_codec_state_commit(st, 4));
    OK(loom_codec_state_residual(st, 4, r0, n));
    /* [600, 800), [100, 300), [200, 400): gaps [0, 100), [400, 600), [800, n) */
    static const size_t rg[3][2] = {{600, 800}, {100, 300}, {200, 400}};
    for (int i = 0; i < 3; i++) {
        size_t lo = rg[i][0], m = rg[i][1] - lo;
        OK(loom_codec_encode_ef(c, st, 4, n, lo, x + lo, m, buf, cap, &len,
                                d + lo));
    }
    OK(loom_codec_state_commit(st, 4));
    OK(loom_codec_state_residual(st, 4, r1, n));
    for (size_t i = 0; i < n; i++) {
        int enc = (i >= 100 && i < 400) || (i >= 600 && i < 800);
        if (!enc)
            cr_assert_eq(fbits(r1[i]), fbits(r0[i]), "gap [%zu]", i);
        else
            cr_assert_eq(fbits(r1[i]), fbits(x[i] + r0[i] - d[i] + 0.0f),
                         "encoded [%zu]", i);
    }
    OK(loom_codec_state_destroy(st));
    free(x); free(r0); free(r1); free(d); free(buf);
}
