/*
 * codecs.c - the built-in codecs: bf16, fp16 (additive), int8, int4, fp4
 * (decode-reduce, one fp32 scale per block) and topk (gather-only).
 *
 * Wire formats and error bounds are in loom-codecs(7).  Everything here
 * is deterministic: only IEEE single-precision operations in a fixed
 * order (the library builds with -std=c11, so no FMA contraction), so the
 * same input gives the same bytes on every machine and on every kernel
 * set.  The loops are plain C the compiler vectorises; they are built
 * twice, for the baseline and for AVX2 (+F16C for fp16), and the set
 * follows the reduction kernels' choice (loomi_reduce_isa, which
 * LOOM_REDUCE_ISA and the tests can lower).
 *
 * Decoders check the whole buffer (header, length, every scale, code and
 * index) before they write anything, so a malformed buffer leaves the
 * output untouched and is never read out of bounds.
 */
/* GCC 12 at -O2 vectorises only loops with a known trip count (its
 * "very cheap" cost model); these kernels are written as plain loops for
 * the vectoriser, so ask for it here, for this file only. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("tree-vectorize", "vect-cost-model=dynamic")
#endif

#include <float.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compress/compress.h"
#include "core/internal.h"
#include "reduce/reduce_internal.h" /* the inline fp16/bf16 conversions */

#if LOOMI_REDUCE_X86
#include <immintrin.h>
#endif

#if defined(__GNUC__) || defined(__clang__)
#define LC_INLINE static inline __attribute__((always_inline))
#else
#define LC_INLINE static inline
#endif

/* Adding then subtracting 1.5 * 2^23 rounds |v| < 2^22 to an integer,
 * nearest even, in the default rounding mode. */
#define LC_RND 12582912.0f
#define LC_QNAN 0x7fc00000u

/* ------------------------------------------------------------- helpers */

LC_INLINE void lc_st16(unsigned char *p, uint16_t v)
{
#if LOOMI_CODEC_BIG_ENDIAN
    v = (uint16_t)(v << 8 | v >> 8);
#endif
    memcpy(p, &v, sizeof v);
}

LC_INLINE uint16_t lc_ld16(const unsigned char *p)
{
    uint16_t v;
    memcpy(&v, p, sizeof v);
#if LOOMI_CODEC_BIG_ENDIAN
    v = (uint16_t)(v << 8 | v >> 8);
#endif
    return v;
}

LC_INLINE void lc_stf(unsigned char *p, float f)
{
    loomi_le32_store(p, lr_fbits(f));
}

LC_INLINE float lc_ldf(const unsigned char *p)
{
    return lr_bitsf(loomi_le32_load(p));
}

/* "codec NAME: ..." as LOOM_ERR_REMOTE: the encoded buffer is malformed. */
static loom_result_t bad_data(const loom_codec_t *c, const char *fmt, ...)
    LOOMI_PRINTF(2, 3);
static loom_result_t bad_data(const loom_codec_t *c, const char *fmt, ...)
{
    char what[256];
    LOOMI_VFORMAT(what, fmt);
    return loomi_fail(LOOM_ERR_REMOTE, -1, "codec %s: malformed encoded buffer: %s",
                      c->name, what);
}

static loom_result_t small_capacity(const loom_codec_t *c, size_t capacity,
                                    size_t need, size_t count)
{
    return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1,
                      "codec %s: capacity %zu bytes is less than the %zu "
                      "needed for %zu values",
                      c->name, capacity, need, count);
}

/* An encoding of count values needs need bytes (0: too many to encode). */
static loom_result_t check_room(const loom_codec_t *c, size_t capacity,
                                size_t need, size_t count)
{
    if (!need)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1,
                          "codec %s: count %zu is too large", c->name, count);
    if (capacity < need)
        return small_capacity(c, capacity, need, count);
    return LOOM_SUCCESS;
}

static void hdr_write(unsigned char *p, unsigned id, uint32_t param,
                      size_t count)
{
    p[0] = LOOMI_CODEC_MAGIC0;
    p[1] = LOOMI_CODEC_MAGIC1;
    p[2] = (unsigned char)id;
    p[3] = LOOMI_CODEC_WIRE_VERSION;
    loomi_le32_store(p + 4, param);
    loomi_le64_store(p + 8, (uint64_t)count);
}

/* Check the header of src against what this codec instance expects. */
static loom_result_t hdr_check(const loom_codec_t *c, const unsigned char *p,
                               size_t len, unsigned id, uint32_t param,
                               size_t count)
{
    if (len < LOOMI_CODEC_HDR_BYTES)
        return bad_data(c, "%zu bytes, shorter than the %u-byte header", len,
                        LOOMI_CODEC_HDR_BYTES);
    if (p[0] != LOOMI_CODEC_MAGIC0 || p[1] != LOOMI_CODEC_MAGIC1)
        return bad_data(c, "bad magic 0x%02x%02x", p[0], p[1]);
    if (p[2] != id)
        return bad_data(c, "codec id %u, expected %u", p[2], id);
    if (p[3] != LOOMI_CODEC_WIRE_VERSION)
        return bad_data(c, "format version %u, expected %u", p[3],
                        LOOMI_CODEC_WIRE_VERSION);
    uint32_t got = loomi_le32_load(p + 4);
    if (got != param)
        return bad_data(c, "parameter (block size) %u, expected %u", got,
                        param);
    uint64_t n = loomi_le64_load(p + 8);
    if (n != (uint64_t)count)
        return bad_data(c, "holds %llu values, expected %zu",
                        (unsigned long long)n, count);
    return LOOM_SUCCESS;
}

static loom_result_t len_check(const loom_codec_t *c, size_t len, size_t want)
{
    if (len != want)
        return bad_data(c, "%zu bytes, expected %zu", len, want);
    return LOOM_SUCCESS;
}

/* a + b and a * b, or SIZE_MAX on overflow (never a valid length). */
static size_t sz_add(size_t a, size_t b)
{
    return a > SIZE_MAX - b ? SIZE_MAX : a + b;
}

static size_t sz_mul(size_t a, size_t b)
{
    return b && a > SIZE_MAX / b ? SIZE_MAX : a * b;
}

/* Parse a decimal without sign or spaces; 0 on success. */
static int parse_uint(const char *s, unsigned long long max,
                      unsigned long long *out)
{
    unsigned long long v = 0;
    if (!*s)
        return -1;
    for (; *s; s++) {
        if (*s < '0' || *s > '9')
            return -1;
        v = v * 10 + (unsigned)(*s - '0');
        if (v > max)
            return -1;
    }
    *out = v;
    return 0;
}

/* -------------------------------------------------- bf16 / fp16 kernels */

/* The two formats' loops differ only in the conversion they call. */
#define LC_HALF_BODIES(t, to_half, from_half)                                  \
    LC_INLINE void t##_enc_body(const float *x, size_t n, unsigned char *out)  \
    {                                                                          \
        for (size_t i = 0; i < n; i++)                                         \
            lc_st16(out + 2 * i, to_half(x[i]));                               \
    }                                                                          \
    LC_INLINE void t##_dec_body(const unsigned char *in, size_t n, float *acc, \
                                int accumulate)                                \
    {                                                                          \
        for (size_t i = 0; i < n; i++) {                                       \
            float v = from_half(lc_ld16(in + 2 * i));                          \
            acc[i] = accumulate ? acc[i] + v : v;                              \
        }                                                                      \
    }

LC_HALF_BODIES(bf16, lr_f32_to_bf16, lr_bf16_to_f32)
LC_HALF_BODIES(fp16, lr_f32_to_f16, lr_f16_to_f32)

/* ------------------------------------------------------- block kernels */

enum { K_INT8 = 0, K_INT4 = 1, K_FP4 = 2, K_NBLOCK = 3 };

/* Largest code magnitude: a block's scale is absmax / LC_QMAX[kind]. */
static const float lc_qmax[K_NBLOCK] = {127.0f, 7.0f, 6.0f};

/* Largest |x| of a block as bits (>= 0x7f800000: an inf or a NaN). */
LC_INLINE uint32_t lc_absmax_bits(const float *x, size_t n)
{
    uint32_t m = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t a = lr_fbits(x[i]) & 0x7fffffffu;
        m = a > m ? a : m;
    }
    return m;
}

/* The scale of a block, and the factors a value is multiplied by to get
 * its code: (x * pre) * inv.  pre is 2^64 for a block whose absmax is
 * below 2^-64 (exact), so that inv stays finite even when absmax is
 * subnormal; 1 otherwise.  Returns 0 when every code is 0: a block with
 * an inf or a NaN (scale NaN: it decodes to NaN) or of zeros (scale 0). */
LC_INLINE int lc_scale(uint32_t mbits, float qmax, float *scale, float *pre,
                       float *inv)
{
    if (mbits >= 0x7f800000u) {
        *scale = lr_bitsf(LC_QNAN);
        return 0;
    }
    if (mbits == 0) {
        *scale = 0.0f;
        return 0;
    }
    float amax = lr_bitsf(mbits);
    *pre = mbits < 0x1f800000u ? 0x1p64f : 1.0f;
    *scale = amax / qmax;
    *inv = qmax / (amax * *pre);
    return 1;
}

/* Round v (|v| <= qmax, give or take an ulp) to an integer in
 * [-qmax, qmax], nearest even. */
LC_INLINE int lc_qint(float v, float qmax)
{
    v = (v + LC_RND) - LC_RND;
    v = v > qmax ? qmax : v;
    v = v < -qmax ? -qmax : v;
    return (int)v;
}

/* fp4 e2m1 code of v, |v| <= 6 (give or take an ulp): magnitudes
 * 0, 0.5, 1, 1.5, 2, 3, 4, 6 are codes 0-7, rounded to nearest with ties
 * to the even code; bit 3 is the sign. */
LC_INLINE unsigned lc_qfp4(float v)
{
    uint32_t u = lr_fbits(v);
    float a = lr_bitsf(u & 0x7fffffffu);
    unsigned c = (unsigned)(a > 0.25f) + (unsigned)(a >= 0.75f) +
                 (unsigned)(a > 1.25f) + (unsigned)(a >= 1.75f) +
                 (unsigned)(a > 2.5f) + (unsigned)(a >= 3.5f) +
                 (unsigned)(a > 5.0f);
    return c | (unsigned)(u >> 31) << 3;
}

/* The value of an fp4 e2m1 code (exact). */
LC_INLINE float lc_fp4_val(unsigned c)
{
    uint32_t m = c & 7u;
    uint32_t bits = m >= 2u ? (m + 252u) << 22 : (m == 1u ? 252u << 22 : 0u);
    return lr_bitsf(bits | (uint32_t)(c & 8u) << 28);
}

/* The value of an int4 code (two's complement nibble). */
LC_INLINE float lc_int4_val(unsigned c)
{
    return (float)((int)((c & 15u) ^ 8u) - 8);
}

/* codes: int8, one byte per value; int4 and fp4, value i in byte i/2, low
 * nibble first.  B is even for the 4-bit kinds, so blocks start on a byte. */
LC_INLINE void blk_enc_body(const float *x, size_t n, uint32_t B,
                            unsigned char *scales, unsigned char *codes,
                            int kind)
{
    const float qmax = lc_qmax[kind];
    size_t blk = 0;
    for (size_t b0 = 0; b0 < n; b0 += B, blk++) {
        size_t m = n - b0 < B ? n - b0 : B;
        const float *xb = x + b0;
        unsigned char *cb = kind == K_INT8 ? codes + b0 : codes + b0 / 2;
        float s, pre = 1.0f, inv = 0.0f;
        if (!lc_scale(lc_absmax_bits(xb, m), qmax, &s, &pre, &inv)) {
            memset(cb, 0, kind == K_INT8 ? m : (m + 1) / 2);
        } else if (kind == K_INT8) {
            for (size_t j = 0; j < m; j++)
                cb[j] = (unsigned char)(lc_qint(xb[j] * pre * inv, qmax) & 0xff);
        } else {
            size_t p = m / 2;
            for (size_t j = 0; j < p; j++) {
                float v0 = xb[2 * j] * pre * inv, v1 = xb[2 * j + 1] * pre * inv;
                unsigned lo, hi;
                if (kind == K_INT4) {
                    lo = (unsigned)lc_qint(v0, qmax) & 15u;
                    hi = (unsigned)lc_qint(v1, qmax) & 15u;
                } else {
                    lo = lc_qfp4(v0);
                    hi = lc_qfp4(v1);
                }
                cb[j] = (unsigned char)(lo | hi << 4);
            }
            if (m & 1) { /* the last value of an odd count; high nibble 0 */
                float v = xb[m - 1] * pre * inv;
                cb[p] = (unsigned char)(kind == K_INT4
                                            ? (unsigned)lc_qint(v, qmax) & 15u
                                            : lc_qfp4(v));
            }
        }
        lc_stf(scales + 4 * blk, s);
    }
}

LC_INLINE void blk_dec_body(const unsigned char *scales,
                            const unsigned char *codes, size_t n, uint32_t B,
                            float *acc, int kind, int accumulate)
{
    size_t blk = 0;
    for (size_t b0 = 0; b0 < n; b0 += B, blk++) {
        size_t m = n - b0 < B ? n - b0 : B;
        const float s = lc_ldf(scales + 4 * blk);
        float *ab = acc + b0;
        if (kind == K_INT8) {
            const unsigned char *cb = codes + b0;
            for (size_t j = 0; j < m; j++) {
                float v = (float)(int8_t)cb[j] * s;
                ab[j] = accumulate ? ab[j] + v : v;
            }
            continue;
        }
        const unsigned char *cb = codes + b0 / 2;
        size_t p = m / 2;
        for (size_t j = 0; j < p; j++) {
            unsigned c = cb[j];
            float v0 = (kind == K_INT4 ? lc_int4_val(c) : lc_fp4_val(c)) * s;
            float v1 = (kind == K_INT4 ? lc_int4_val(c >> 4)
                                       : lc_fp4_val(c >> 4)) * s;
            ab[2 * j] = accumulate ? ab[2 * j] + v0 : v0;
            ab[2 * j + 1] = accumulate ? ab[2 * j + 1] + v1 : v1;
        }
        if (m & 1) {
            unsigned c = cb[p];
            float v = (kind == K_INT4 ? lc_int4_val(c) : lc_fp4_val(c)) * s;
            ab[m - 1] = accumulate ? ab[m - 1] + v : v;
        }
    }
}

/* ----------------------------------------------------- kernel sets */

typedef void (*lc_cenc_fn)(const float *x, size_t n, unsigned char *out);
typedef void (*lc_cdec_fn)(const unsigned char *in, size_t n, float *acc);
typedef void (*lc_benc_fn)(const float *x, size_t n, uint32_t B,
                           unsigned char *scales, unsigned char *codes);
typedef void (*lc_bdec_fn)(const unsigned char *scales,
                           const unsigned char *codes, size_t n, uint32_t B,
                           float *acc);

struct lc_kernels {
    lc_cenc_fn cenc[2];    /* [bf16, fp16] */
    lc_cdec_fn cdec[2][2]; /* [bf16, fp16][set, accumulate] */
    lc_benc_fn benc[K_NBLOCK];
    lc_bdec_fn bdec[K_NBLOCK][2];
};

#define LC_CONV(sfx, ATTR, t)                                                  \
    ATTR static void t##_enc_##sfx(const float *x, size_t n,                   \
                                   unsigned char *o)                           \
    {                                                                          \
        t##_enc_body(x, n, o);                                                 \
    }                                                                          \
    ATTR static void t##_set_##sfx(const unsigned char *i, size_t n, float *a) \
    {                                                                          \
        t##_dec_body(i, n, a, 0);                                              \
    }                                                                          \
    ATTR static void t##_acc_##sfx(const unsigned char *i, size_t n, float *a) \
    {                                                                          \
        t##_dec_body(i, n, a, 1);                                              \
    }

/* Block decode into a (accumulate 0: t##_bset_##sfx) or onto it (1: bacc). */
#define LC_BDEC(sfx, ATTR, t, K, op, accumulate)                               \
    ATTR static void t##_b##op##_##sfx(const unsigned char *s,                 \
                                      const unsigned char *c, size_t n,        \
                                      uint32_t B, float *a)                    \
    {                                                                          \
        blk_dec_body(s, c, n, B, a, K, accumulate);                            \
    }

#define LC_BLOCK(sfx, ATTR, t, K)                                              \
    ATTR static void t##_benc_##sfx(const float *x, size_t n, uint32_t B,      \
                                    unsigned char *s, unsigned char *c)        \
    {                                                                          \
        blk_enc_body(x, n, B, s, c, K);                                        \
    }                                                                          \
    LC_BDEC(sfx, ATTR, t, K, set, 0)                                           \
    LC_BDEC(sfx, ATTR, t, K, acc, 1)

#define LC_BLOCKS(sfx, ATTR)                                                   \
    LC_CONV(sfx, ATTR, bf16)                                                   \
    LC_BLOCK(sfx, ATTR, int8, K_INT8)                                          \
    LC_BLOCK(sfx, ATTR, int4, K_INT4)                                          \
    LC_BLOCK(sfx, ATTR, fp4, K_FP4)

#define LC_TABLE_ROWS(sfx)                                                     \
    .benc = {int8_benc_##sfx, int4_benc_##sfx, fp4_benc_##sfx},                \
    .bdec = {{int8_bset_##sfx, int8_bacc_##sfx},                               \
             {int4_bset_##sfx, int4_bacc_##sfx},                               \
             {fp4_bset_##sfx, fp4_bacc_##sfx}}

LC_BLOCKS(gen, )
LC_CONV(gen, , fp16)

static const struct lc_kernels lc_generic = {
    .cenc = {bf16_enc_gen, fp16_enc_gen},
    .cdec = {{bf16_set_gen, bf16_acc_gen}, {fp16_set_gen, fp16_acc_gen}},
    LC_TABLE_ROWS(gen)};

#if LOOMI_REDUCE_X86
#define LC_AVX2 __attribute__((target("avx2,f16c")))
LC_BLOCKS(avx2, LC_AVX2)

/* F16C converts 8 values at once, bit for bit as lr_f32_to_f16 and
 * lr_f16_to_f32 (which do the tails). */
LC_AVX2 static void fp16_enc_avx2(const float *x, size_t n, unsigned char *o)
{
    size_t i = 0;
#if !LOOMI_CODEC_BIG_ENDIAN
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(void *)(o + 2 * i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i),
                                         _MM_FROUND_TO_NEAREST_INT));
#endif
    fp16_enc_body(x + i, n - i, o + 2 * i);
}

LC_AVX2 LC_INLINE void fp16_dec_avx2(const unsigned char *in, size_t n,
                                     float *a, int accumulate)
{
    size_t i = 0;
#if !LOOMI_CODEC_BIG_ENDIAN
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_cvtph_ps(
            _mm_loadu_si128((const __m128i *)(const void *)(in + 2 * i)));
        if (accumulate)
            v = _mm256_add_ps(_mm256_loadu_ps(a + i), v);
        _mm256_storeu_ps(a + i, v);
    }
#endif
    fp16_dec_body(in + 2 * i, n - i, a + i, accumulate);
}

LC_AVX2 static void fp16_set_avx2(const unsigned char *in, size_t n, float *a)
{
    fp16_dec_avx2(in, n, a, 0);
}

LC_AVX2 static void fp16_acc_avx2(const unsigned char *in, size_t n, float *a)
{
    fp16_dec_avx2(in, n, a, 1);
}

static const struct lc_kernels lc_avx2 = {
    .cenc = {bf16_enc_avx2, fp16_enc_avx2},
    .cdec = {{bf16_set_avx2, bf16_acc_avx2}, {fp16_set_avx2, fp16_acc_avx2}},
    LC_TABLE_ROWS(avx2)};
#endif

/* The set matching the reduction kernels' (AVX2 and F16C when they are
 * above "generic"). */
static const struct lc_kernels *kern(void)
{
#if LOOMI_REDUCE_X86
    if (loomi_reduce_isa()[0] != 'g')
        return &lc_avx2;
#endif
    return &lc_generic;
}

/* ------------------------------------------------ bf16 and fp16 codecs */

static size_t conv_max(const loom_codec_t *c, size_t count)
{
    (void)c;
    size_t n = sz_add(LOOMI_CODEC_HDR_BYTES, sz_mul(count, 2));
    return n == SIZE_MAX ? 0 : n;
}

static loom_result_t conv_encode(const loom_codec_t *c, const float *src,
                                 size_t count, void *dst, size_t capacity,
                                 size_t *len, int f16)
{
    size_t need = conv_max(c, count);
    loom_result_t r = check_room(c, capacity, need, count);
    if (r != LOOM_SUCCESS)
        return r;
    unsigned char *p = dst;
    hdr_write(p, f16 ? LOOMI_CODEC_ID_FP16 : LOOMI_CODEC_ID_BF16, 0, count);
    if (count)
        kern()->cenc[f16](src, count, p + LOOMI_CODEC_HDR_BYTES);
    *len = need;
    return LOOM_SUCCESS;
}

static loom_result_t conv_check(const loom_codec_t *c, const void *src,
                                size_t len, size_t count, int f16)
{
    loom_result_t r =
        hdr_check(c, src, len, f16 ? LOOMI_CODEC_ID_FP16 : LOOMI_CODEC_ID_BF16,
                  0, count);
    if (r == LOOM_SUCCESS)
        r = len_check(c, len, sz_add(LOOMI_CODEC_HDR_BYTES, sz_mul(count, 2)));
    return r;
}

static loom_result_t conv_decode(const loom_codec_t *c, const void *src,
                                 size_t len, float *dst, size_t count, int f16,
                                 int accumulate)
{
    loom_result_t r = conv_check(c, src, len, count, f16);
    if (r != LOOM_SUCCESS)
        return r;
    if (count)
        kern()->cdec[f16][accumulate](
            (const unsigned char *)src + LOOMI_CODEC_HDR_BYTES, count, dst);
    return LOOM_SUCCESS;
}

static loom_result_t conv_reduce(const loom_codec_t *c, void *dst,
                                 const void *src, size_t len, int f16)
{
    if (len < LOOMI_CODEC_HDR_BYTES)
        return bad_data(c, "%zu bytes, shorter than the %u-byte header", len,
                        LOOMI_CODEC_HDR_BYTES);
    uint64_t n64 = loomi_le64_load((const unsigned char *)dst + 8);
    size_t count = (size_t)n64;
    if ((uint64_t)count != n64 || (len - LOOMI_CODEC_HDR_BYTES) / 2 != count)
        return bad_data(c, "%zu bytes cannot hold the %llu values its header "
                        "announces", len, (unsigned long long)n64);
    loom_result_t r = conv_check(c, dst, len, count, f16);
    if (r == LOOM_SUCCESS)
        r = conv_check(c, src, len, count, f16);
    if (r != LOOM_SUCCESS)
        return r;
    loomi_reduce_inplace((unsigned char *)dst + LOOMI_CODEC_HDR_BYTES,
                         (const unsigned char *)src + LOOMI_CODEC_HDR_BYTES,
                         count, f16 ? LOOM_FLOAT16 : LOOM_BFLOAT16, LOOM_SUM);
    return LOOM_SUCCESS;
}

/* A codec's encode, decode and decode_acc: impl##_encode and impl##_decode
   with the codec's kind K (and decode's accumulate flag) as last arguments. */
#define LC_CODEC_CODING(t, impl, K)                                            \
    static loom_result_t t##_encode(const loom_codec_t *c, const float *src,   \
                                    size_t count, void *dst, size_t cap,       \
                                    size_t *len)                               \
    {                                                                          \
        return impl##_encode(c, src, count, dst, cap, len, K);                 \
    }                                                                          \
    static loom_result_t t##_decode(const loom_codec_t *c, const void *src,    \
                                    size_t len, float *dst, size_t count)      \
    {                                                                          \
        return impl##_decode(c, src, len, dst, count, K, 0);                   \
    }                                                                          \
    static loom_result_t t##_decode_acc(const loom_codec_t *c,                 \
                                        const void *src, size_t len,           \
                                        float *acc, size_t count)              \
    {                                                                          \
        return impl##_decode(c, src, len, acc, count, K, 1);                   \
    }

#define LC_CONV_CODEC(t, f16)                                                  \
    LC_CODEC_CODING(t, conv, f16)                                              \
    static loom_result_t t##_reduce(const loom_codec_t *c, void *dst,          \
                                    const void *src, size_t len)               \
    {                                                                          \
        return conv_reduce(c, dst, src, len, f16);                             \
    }                                                                          \
    const loom_codec_t loomi_codec_##t = {                                     \
        sizeof(loom_codec_t), #t, LOOM_CODEC_ADDITIVE, NULL, NULL, NULL,       \
        conv_max, t##_encode, t##_decode, t##_decode_acc, t##_reduce};

LC_CONV_CODEC(bf16, 0)
LC_CONV_CODEC(fp16, 1)

/* ------------------------------------------------- int8, int4 and fp4 */

struct blk_params {
    uint32_t block;
};

static const unsigned blk_id[K_NBLOCK] = {
    LOOMI_CODEC_ID_INT8, LOOMI_CODEC_ID_INT4, LOOMI_CODEC_ID_FP4};

static uint32_t blk_size(const loom_codec_t *c)
{
    const struct blk_params *p = c->params;
    return p ? p->block : LOOMI_CODEC_BLOCK_DEFAULT;
}

static loom_result_t blk_configure(const loom_codec_t *c, const char *args,
                                   const void **params, int kind)
{
    unsigned long long b = LOOMI_CODEC_BLOCK_DEFAULT;
    if (args && (parse_uint(args, LOOMI_CODEC_BLOCK_MAX, &b) || b == 0 ||
                 (kind != K_INT8 && b % 2)))
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1,
                          "spec: codec %s: block size '%s' is not %s from "
                          "%u to %u",
                          c->name, args,
                          kind == K_INT8 ? "an integer" : "an even integer",
                          kind == K_INT8 ? 1u : 2u, LOOMI_CODEC_BLOCK_MAX);
    struct blk_params *p = malloc(sizeof *p);
    if (!p)
        return loomi_fail(LOOM_ERR_NO_MEMORY, -1, "codec %s: parameters",
                          c->name);
    p->block = (uint32_t)b;
    *params = p;
    return LOOM_SUCCESS;
}

static size_t blk_nblocks(size_t count, uint32_t B)
{
    return count / B + (count % B != 0);
}

static size_t blk_code_bytes(size_t count, int kind)
{
    return kind == K_INT8 ? count : count / 2 + (count & 1);
}

/* Exact length of an encoding: header, scales, codes (SIZE_MAX: too big). */
static size_t blk_len(size_t count, uint32_t B, int kind)
{
    return sz_add(sz_add(LOOMI_CODEC_HDR_BYTES,
                         sz_mul(blk_nblocks(count, B), 4)),
                  blk_code_bytes(count, kind));
}

static size_t blk_max(const loom_codec_t *c, size_t count, int kind)
{
    size_t n = blk_len(count, blk_size(c), kind);
    return n == SIZE_MAX ? 0 : n;
}

static loom_result_t blk_encode(const loom_codec_t *c, const float *src,
                                size_t count, void *dst, size_t capacity,
                                size_t *len, int kind)
{
    uint32_t B = blk_size(c);
    size_t need = blk_max(c, count, kind);
    loom_result_t r = check_room(c, capacity, need, count);
    if (r != LOOM_SUCCESS)
        return r;
    unsigned char *p = dst;
    hdr_write(p, blk_id[kind], B, count);
    unsigned char *scales = p + LOOMI_CODEC_HDR_BYTES;
    if (count)
        kern()->benc[kind](src, count, B, scales,
                           scales + 4 * blk_nblocks(count, B));
    *len = need;
    return LOOM_SUCCESS;
}

/* Every check a decoder makes before it writes anything. */
static loom_result_t blk_check(const loom_codec_t *c, const unsigned char *p,
                               size_t len, size_t count, int kind)
{
    uint32_t B = blk_size(c);
    loom_result_t r = hdr_check(c, p, len, blk_id[kind], B, count);
    if (r == LOOM_SUCCESS)
        r = len_check(c, len, blk_len(count, B, kind));
    if (r != LOOM_SUCCESS)
        return r;
    /* Scales: NaN (a block with a non-finite value) or 0 <= s <= the
     * largest an encoder makes, so no finite code can decode to inf. */
    const float smax = FLT_MAX / lc_qmax[kind];
    size_t nb = blk_nblocks(count, B);
    const unsigned char *scales = p + LOOMI_CODEC_HDR_BYTES;
    for (size_t b = 0; b < nb; b++) {
        float s = lc_ldf(scales + 4 * b);
        if (!(s >= 0.0f && s <= smax) && s == s)
            return bad_data(c, "block %zu has scale %g, outside [0, %g]", b,
                            (double)s, (double)smax);
    }
    const unsigned char *codes = scales + 4 * nb;
    size_t ncb = blk_code_bytes(count, kind);
    unsigned bad = 0;
    if (kind == K_INT8) { /* -128 is never made: the codes are symmetric */
        for (size_t i = 0; i < ncb; i++)
            bad |= codes[i] == 0x80u;
    } else if (kind == K_INT4) { /* nor is -8 */
        for (size_t i = 0; i < ncb; i++)
            bad |= (codes[i] & 15u) == 8u || (codes[i] >> 4) == 8u;
    }
    if (bad)
        return bad_data(c, "a code outside [-%d, %d]",
                        (int)lc_qmax[kind], (int)lc_qmax[kind]);
    if ((count & 1) && kind != K_INT8 && (codes[ncb - 1] >> 4) != 0)
        return bad_data(c, "the padding nibble after the last value is not 0");
    return LOOM_SUCCESS;
}

static loom_result_t blk_decode(const loom_codec_t *c, const void *src,
                                size_t len, float *dst, size_t count, int kind,
                                int accumulate)
{
    const unsigned char *p = src;
    loom_result_t r = blk_check(c, p, len, count, kind);
    if (r != LOOM_SUCCESS)
        return r;
    if (count) {
        uint32_t B = blk_size(c);
        const unsigned char *scales = p + LOOMI_CODEC_HDR_BYTES;
        kern()->bdec[kind][accumulate](
            scales, scales + 4 * blk_nblocks(count, B), count, B, dst);
    }
    return LOOM_SUCCESS;
}

#define LC_BLOCK_CODEC(t, K)                                                   \
    static loom_result_t t##_configure(const loom_codec_t *c,                  \
                                       const char *args, const void **params)  \
    {                                                                          \
        return blk_configure(c, args, params, K);                              \
    }                                                                          \
    static size_t t##_max(const loom_codec_t *c, size_t count)                 \
    {                                                                          \
        return blk_max(c, count, K);                                           \
    }                                                                          \
    LC_CODEC_CODING(t, blk, K)                                                 \
    const loom_codec_t loomi_codec_##t = {                                     \
        sizeof(loom_codec_t), #t, LOOM_CODEC_DECODE_REDUCE, NULL, NULL,        \
        t##_configure, t##_max, t##_encode, t##_decode, t##_decode_acc, NULL};

LC_BLOCK_CODEC(int8, K_INT8)
LC_BLOCK_CODEC(int4, K_INT4)
LC_BLOCK_CODEC(fp4, K_FP4)

/* ----------------------------------------------------------------- topk */

/* The fraction sent, num / den, exactly as written ("0.01" = 1/100). */
struct topk_params {
    uint64_t num, den;
};

#define TOPK_HDR_BYTES (LOOMI_CODEC_HDR_BYTES + 8u)
#define TOPK_MAX_COUNT 0xffffffffu /* indices are u32 */
#define TOPK_MAX_DIGITS 9

static loom_result_t topk_configure(const loom_codec_t *c, const char *args,
                                    const void **params)
{
    uint64_t num = 1, den = 100; /* LOOMI_CODEC_TOPK_DEFAULT */
    if (args) {
        const char *s = args;
        uint64_t ip = 0, fp = 0, scale = 1;
        int digits = 0, fdigits = 0, ok = 1;
        for (; *s >= '0' && *s <= '9'; s++, digits++)
            if ((ip = ip * 10 + (uint64_t)(*s - '0')) > 1)
                ok = 0;
        if (*s == '.')
            for (s++; *s >= '0' && *s <= '9'; s++, fdigits++) {
                if (fdigits == TOPK_MAX_DIGITS) {
                    ok = 0;
                    break;
                }
                fp = fp * 10 + (uint64_t)(*s - '0');
                scale *= 10;
            }
        num = ip * scale + fp;
        den = scale;
        if (!ok || *s || digits + fdigits == 0 || num == 0 || num > den)
            return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1,
                              "spec: codec %s: '%s' is not a fraction in "
                              "(0, 1] with at most %d decimals",
                              c->name, args, TOPK_MAX_DIGITS);
    }
    struct topk_params *p = malloc(sizeof *p);
    if (!p)
        return loomi_fail(LOOM_ERR_NO_MEMORY, -1, "codec %s: parameters",
                          c->name);
    p->num = num;
    p->den = den;
    *params = p;
    return LOOM_SUCCESS;
}

/* k for count values: ceil(count * fraction), at least 1 (count > 0). */
static size_t topk_k(const loom_codec_t *c, size_t count)
{
    const struct topk_params *p = c->params;
    uint64_t num = p ? p->num : 1, den = p ? p->den : 100;
    if (!count)
        return 0;
    uint64_t k = ((uint64_t)count * num + den - 1) / den;
    return k ? (size_t)k : 1;
}

static size_t topk_max(const loom_codec_t *c, size_t count)
{
    if ((uint64_t)count > TOPK_MAX_COUNT)
        return 0;
    size_t n = sz_add(TOPK_HDR_BYTES, sz_mul(topk_k(c, count), 8));
    return n == SIZE_MAX ? 0 : n;
}

/* Order key: |x| as bits, so NaN > inf > every number; ties go to the
 * lower index. */
static inline uint32_t topk_key(float x)
{
    return lr_fbits(x) & 0x7fffffffu;
}

/* One radix digit of the k-th largest key: keys whose bits above `shift`
 * equal `prefix` are counted by the digit at shift (width bits); *need is
 * how many of the largest are still to be found among them. */
static uint32_t topk_digit(const float *x, size_t n, uint32_t prefix,
                           unsigned hi_shift, unsigned shift, unsigned width,
                           size_t *need)
{
    uint32_t hist[2048];
    uint32_t mask = (1u << width) - 1u;
    memset(hist, 0, sizeof(uint32_t) << width);
    if (hi_shift >= 31) {
        for (size_t i = 0; i < n; i++)
            hist[(topk_key(x[i]) >> shift) & mask]++;
    } else {
        for (size_t i = 0; i < n; i++) {
            uint32_t k = topk_key(x[i]);
            if ((k >> hi_shift) == prefix)
                hist[(k >> shift) & mask]++;
        }
    }
    uint32_t d = mask;
    for (;; d--) {
        if (hist[d] >= *need || d == 0)
            break;
        *need -= hist[d];
    }
    return d;
}

static loom_result_t topk_encode(const loom_codec_t *c, const float *src,
                                 size_t count, void *dst, size_t capacity,
                                 size_t *len)
{
    size_t need_bytes = topk_max(c, count);
    if (!need_bytes)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1,
                          "count: codec %s takes at most %u values per call, "
                          "not %zu",
                          c->name, TOPK_MAX_COUNT, count);
    if (capacity < need_bytes)
        return small_capacity(c, capacity, need_bytes, count);
    size_t k = topk_k(c, count);
    unsigned char *p = dst;
    hdr_write(p, LOOMI_CODEC_ID_TOPK, 0, count);
    loomi_le64_store(p + LOOMI_CODEC_HDR_BYTES, (uint64_t)k);
    unsigned char *idx = p + TOPK_HDR_BYTES, *val = idx + 4 * k;
    *len = need_bytes;
    if (!k)
        return LOOM_SUCCESS;
    /* The k-th largest key T by radix selection (11 + 11 + 9 bits), and
     * how many keys equal to T are taken (the first ones). */
    uint32_t thr = 0, take_eq = 0;
    if (k < count) {
        size_t need = k;
        uint32_t d1 = topk_digit(src, count, 0, 31, 20, 11, &need);
        uint32_t d2 = topk_digit(src, count, d1, 20, 9, 11, &need);
        uint32_t d3 = topk_digit(src, count, d1 << 11 | d2, 9, 0, 9, &need);
        thr = d1 << 20 | d2 << 9 | d3;
        take_eq = (uint32_t)need;
    }
    size_t j = 0;
    const int all = k == count;
    for (size_t i = 0; i < count; i++) {
        uint32_t key = topk_key(src[i]);
        if (all || key > thr || (key == thr && take_eq && take_eq--)) {
            loomi_le32_store(idx + 4 * j, (uint32_t)i);
            lc_stf(val + 4 * j, src[i]);
            j++;
        }
    }
    if (j != k) /* cannot happen: the selection counted them */
        return loomi_fail(LOOM_ERR_INTERNAL, -1,
                          "codec %s: selected %zu values, not %zu", c->name, j,
                          k);
    return LOOM_SUCCESS;
}

static loom_result_t topk_check(const loom_codec_t *c, const unsigned char *p,
                                size_t len, size_t count, size_t *k_out)
{
    loom_result_t r = hdr_check(c, p, len, LOOMI_CODEC_ID_TOPK, 0, count);
    if (r != LOOM_SUCCESS)
        return r;
    if (len < TOPK_HDR_BYTES)
        return bad_data(c, "%zu bytes, shorter than the %u-byte header", len,
                        TOPK_HDR_BYTES);
    uint64_t k = loomi_le64_load(p + LOOMI_CODEC_HDR_BYTES);
    if (k != (uint64_t)topk_k(c, count))
        return bad_data(c, "holds %llu pairs, expected %zu for %zu values",
                        (unsigned long long)k, topk_k(c, count), count);
    r = len_check(c, len, sz_add(TOPK_HDR_BYTES, sz_mul((size_t)k, 8)));
    if (r != LOOM_SUCCESS)
        return r;
    const unsigned char *idx = p + TOPK_HDR_BYTES;
    uint64_t prev = 0;
    for (size_t j = 0; j < (size_t)k; j++) {
        uint64_t i = loomi_le32_load(idx + 4 * j);
        if (i >= (uint64_t)count || (j && i <= prev))
            return bad_data(c, "index %llu (pair %zu) is out of range or not "
                            "above the previous one",
                            (unsigned long long)i, j);
        prev = i;
    }
    *k_out = (size_t)k;
    return LOOM_SUCCESS;
}

static loom_result_t topk_decode_any(const loom_codec_t *c, const void *src,
                                     size_t len, float *dst, size_t count,
                                     int accumulate)
{
    const unsigned char *p = src;
    size_t k = 0;
    loom_result_t r = topk_check(c, p, len, count, &k);
    if (r != LOOM_SUCCESS)
        return r;
    if (!accumulate && count)
        memset(dst, 0, count * sizeof *dst);
    const unsigned char *idx = p + TOPK_HDR_BYTES, *val = idx + 4 * k;
    for (size_t j = 0; j < k; j++) {
        uint32_t i = loomi_le32_load(idx + 4 * j);
        float v = lc_ldf(val + 4 * j);
        dst[i] = accumulate ? dst[i] + v : v;
    }
    return LOOM_SUCCESS;
}

static loom_result_t topk_decode(const loom_codec_t *c, const void *src,
                                 size_t len, float *dst, size_t count)
{
    return topk_decode_any(c, src, len, dst, count, 0);
}

static loom_result_t topk_decode_acc(const loom_codec_t *c, const void *src,
                                     size_t len, float *acc, size_t count)
{
    return topk_decode_any(c, src, len, acc, count, 1);
}

const loom_codec_t loomi_codec_topk = {
    sizeof(loom_codec_t), "topk", LOOM_CODEC_GATHER_ONLY, NULL, NULL,
    topk_configure, topk_max, topk_encode, topk_decode, topk_decode_acc, NULL};
