/*
 * test_reduce.c - reduction kernels against an independent scalar
 * reference, on every kernel set (ISA) this CPU runs.
 *
 * The reference computes fp16/bf16 results in double and rounds once with
 * its own rounding (scale to an integer, round with the 2^52 trick), so
 * it also checks that the library's "fp32 then round" gives the correctly
 * rounded result.  No libm calls, so no -lm is needed.
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

static const char *const all_isas[] = {"generic", "avx2", "avx512", "neon"};
#define N_ISAS (sizeof all_isas / sizeof all_isas[0])

static size_t esize(loom_datatype_t dt)
{
    switch (dt) {
    case LOOM_INT8:
    case LOOM_UINT8:
        return 1;
    case LOOM_FLOAT16:
    case LOOM_BFLOAT16:
        return 2;
    case LOOM_INT32:
    case LOOM_UINT32:
    case LOOM_FLOAT32:
        return 4;
    default:
        return 8;
    }
}

static const char *dt_name(loom_datatype_t dt)
{
    static const char *const n[] = {"int8",   "uint8",  "int32", "uint32",
                                    "int64",  "uint64", "fp16",  "fp32",
                                    "fp64",   "bf16"};
    return n[dt];
}

static const char *op_name(loom_op_t op)
{
    static const char *const n[] = {"sum", "prod", "max", "min", "avg"};
    return n[op];
}

static int is_float(loom_datatype_t dt)
{
    return dt == LOOM_FLOAT16 || dt == LOOM_BFLOAT16 || dt == LOOM_FLOAT32 ||
           dt == LOOM_FLOAT64;
}

static int is_signed(loom_datatype_t dt)
{
    return dt == LOOM_INT8 || dt == LOOM_INT32 || dt == LOOM_INT64;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void) /* splitmix64 */
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t getv(loom_datatype_t dt, const void *p, size_t i)
{
    uint64_t v = 0; /* little-endian: low bytes */
    memcpy(&v, (const unsigned char *)p + i * esize(dt), esize(dt));
    return v;
}

static void putv(loom_datatype_t dt, void *p, size_t i, uint64_t v)
{
    memcpy((unsigned char *)p + i * esize(dt), &v, esize(dt));
}

static uint32_t fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bitsf(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint64_t dbits(double d)
{
    uint64_t u;
    memcpy(&u, &d, 8);
    return u;
}

static double bitsd(uint64_t u)
{
    double d;
    memcpy(&d, &u, 8);
    return d;
}

/* ------------------------------------------- reference fp16/bf16 codec */

/* x * 2^e, exact while the result stays a normal double. */
static double scale2(double x, int e)
{
    for (; e > 1000; e -= 1000)
        x *= bitsd((uint64_t)(1000 + 1023) << 52);
    for (; e < -1000; e += 1000)
        x *= bitsd((uint64_t)(-1000 + 1023) << 52);
    return x * bitsd((uint64_t)(e + 1023) << 52);
}

/* Round 0 <= y < 2^52 to an integer, ties to even (the FPU default):
 * adding 2^52 leaves no fraction bits. */
static double round_even(double y)
{
    const double two52 = 4503599627370496.0;
    return (y + two52) - two52;
}

/* Format of a 16-bit float: mantissa bits and exponent bias. */
static int mbits16(loom_datatype_t dt)
{
    return dt == LOOM_FLOAT16 ? 10 : 7;
}

static int bias16(loom_datatype_t dt)
{
    return dt == LOOM_FLOAT16 ? 15 : 127;
}

static int emax16(loom_datatype_t dt) /* all-ones exponent field */
{
    return dt == LOOM_FLOAT16 ? 31 : 255;
}

static int isnan16(loom_datatype_t dt, uint16_t h)
{
    int mb = mbits16(dt);
    return ((h >> mb) & emax16(dt)) == emax16(dt) && (h & ((1u << mb) - 1));
}

static uint16_t quiet16(loom_datatype_t dt, uint16_t h)
{
    return (uint16_t)(h | (1u << (mbits16(dt) - 1)));
}

static double dec16(loom_datatype_t dt, uint16_t h)
{
    int mb = mbits16(dt), e = (h >> mb) & emax16(dt);
    int m = h & ((1 << mb) - 1);
    double v;
    if (e == emax16(dt))
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = scale2(m, 1 - bias16(dt) - mb);
    else
        v = scale2(m + (1 << mb), e - bias16(dt) - mb);
    return (h & 0x8000) ? -v : v;
}

/* Round a double to the 16-bit format, nearest even. */
static uint16_t enc16(loom_datatype_t dt, double x)
{
    int mb = mbits16(dt), bias = bias16(dt), emax = emax16(dt);
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    uint16_t inf = (uint16_t)(sign | (emax << mb));
    if (isnan(x))
        return (uint16_t)(inf | (1 << (mb - 1)));
    double ax = sign ? -x : x;
    if (isinf(ax))
        return inf;
    if (ax == 0)
        return sign;
    /* exponent of the leading bit (x is a normal double here) */
    int lead = (int)((dbits(ax) >> 52) & 0x7ff) - 1023;
    if (lead < 1 - bias)
        lead = 1 - bias; /* subnormal: fixed quantum */
    double m = round_even(scale2(ax, mb - lead));
    if (m >= scale2(1, mb + 1)) {
        m /= 2;
        lead++;
    }
    if (m < scale2(1, mb))
        return (uint16_t)(sign | (uint16_t)m);
    if (lead + bias >= emax)
        return inf;
    return (uint16_t)(sign | ((lead + bias) << mb) |
                      ((uint16_t)m - (1 << mb)));
}

/* ------------------------------------------------- reference operations */

static double ref_maxd(double x, double y, int is_max)
{
    if (x == y) {
        if (x != 0)
            return x;
        int neg = is_max ? (signbit(x) && signbit(y))
                         : (signbit(x) || signbit(y));
        return neg ? -0.0 : 0.0;
    }
    return is_max ? (x > y ? x : y) : (x < y ? x : y);
}

static int isnan_bits(loom_datatype_t dt, uint64_t v)
{
    if (dt == LOOM_FLOAT16 || dt == LOOM_BFLOAT16)
        return isnan16(dt, (uint16_t)v);
    if (dt == LOOM_FLOAT32)
        return (v & 0x7fffffffu) > 0x7f800000u;
    return (v & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
}

static int is_quiet_nan(loom_datatype_t dt, uint64_t v)
{
    if (!isnan_bits(dt, v))
        return 0;
    if (dt == LOOM_FLOAT16)
        return (v & 0x200) != 0;
    if (dt == LOOM_BFLOAT16)
        return (v & 0x40) != 0;
    if (dt == LOOM_FLOAT32)
        return (v & 0x400000) != 0;
    return (v & 0x8000000000000ull) != 0;
}

static uint64_t quiet_bits(loom_datatype_t dt, uint64_t v)
{
    if (dt == LOOM_FLOAT16 || dt == LOOM_BFLOAT16)
        return quiet16(dt, (uint16_t)v);
    if (dt == LOOM_FLOAT32)
        return v | 0x400000;
    return v | 0x8000000000000ull;
}

static double to_double(loom_datatype_t dt, uint64_t v)
{
    if (dt == LOOM_FLOAT16 || dt == LOOM_BFLOAT16)
        return dec16(dt, (uint16_t)v);
    if (dt == LOOM_FLOAT32)
        return bitsf((uint32_t)v);
    return bitsd(v);
}

/*
 * Expected bits of a OP b.  *any_nan is set when any quiet NaN is right:
 * NaN from two NaN inputs (which payload wins is unspecified) or created
 * by the op (inf - inf).  With one NaN input we expect that NaN, quieted
 * (x86 hardware keeps the payload; other CPUs may not).
 */
static uint64_t ref_op(loom_datatype_t dt, loom_op_t op, uint64_t a,
                       uint64_t b, int *any_nan)
{
    *any_nan = 0;
    if (!is_float(dt)) {
        size_t sz = esize(dt);
        uint64_t mask = sz == 8 ? ~0ull : (1ull << (8 * sz)) - 1;
        int64_t sa = 0, sb = 0;
        if (is_signed(dt)) { /* sign-extend */
            int sh = 64 - 8 * (int)sz;
            sa = (int64_t)(a << sh) >> sh;
            sb = (int64_t)(b << sh) >> sh;
        }
        switch (op) {
        case LOOM_SUM:
        case LOOM_AVG:
            return (a + b) & mask;
        case LOOM_PROD:
            return (a * b) & mask;
        case LOOM_MAX:
            if (is_signed(dt))
                return sa > sb ? a : b;
            return a > b ? a : b;
        default:
            if (is_signed(dt))
                return sa < sb ? a : b;
            return a < b ? a : b;
        }
    }
    int na = isnan_bits(dt, a), nb = isnan_bits(dt, b);
    if (na || nb) {
#if defined(__x86_64__) || defined(__i386__)
        if (!(na && nb))
            return quiet_bits(dt, na ? a : b);
#endif
        *any_nan = 1;
        return quiet_bits(dt, na ? a : b);
    }
    double x = to_double(dt, a), y = to_double(dt, b), r;
    if (dt == LOOM_FLOAT64) {
        switch (op) {
        case LOOM_PROD:
            r = x * y;
            break;
        case LOOM_MAX:
        case LOOM_MIN:
            r = ref_maxd(x, y, op == LOOM_MAX);
            break;
        default:
            r = x + y;
        }
        if (isnan(r)) {
            *any_nan = 1;
            return 0x7ff8000000000000ull;
        }
        return dbits(r);
    }
    /* fp32/fp16/bf16 operands are exact in double; a product is exact
     * and a sum is rounded innocuously (53 >= 2*24+2), so rounding it
     * once more to the target format is the correctly rounded result. */
    switch (op) {
    case LOOM_PROD:
        r = x * y;
        break;
    case LOOM_MAX:
    case LOOM_MIN:
        r = ref_maxd(x, y, op == LOOM_MAX);
        break;
    default:
        r = x + y;
    }
    if (isnan(r)) {
        *any_nan = 1;
        return quiet_bits(dt, dt == LOOM_FLOAT32 ? 0x7f800001u
                              : dt == LOOM_FLOAT16 ? 0x7c01u
                                                   : 0x7f81u);
    }
    if (dt == LOOM_FLOAT32)
        return fbits((float)r);
    return enc16(dt, r);
}

/* ------------------------------------------------------ test data */

static uint64_t special_value(loom_datatype_t dt)
{
    static const uint16_t h16[] = {
        0x0000, 0x8000, 0x7c00, 0xfc00, 0x7e00, 0x7c01, 0xfd55, 0x7bff,
        0xfbff, 0x0001, 0x8001, 0x03ff, 0x0400, 0x3c00, 0xbc00, 0x3c01,
        0x1000, 0x1001, 0x0fff, 0x4c00, 0x0200, 0x3555};
    static const uint16_t b16[] = {
        0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0x7f81, 0xffa5, 0x7f7f,
        0xff7f, 0x0001, 0x8001, 0x007f, 0x0080, 0x3f80, 0xbf80, 0x3f81,
        0x3b80, 0x3b81, 0x3b7f, 0x7b00, 0x0040, 0x3eab};
    static const uint32_t f32[] = {
        0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000,
        0x7f800001, 0xffa5a5a5, 0x7f7fffff, 0xff7fffff, 0x00000001,
        0x80000001, 0x007fffff, 0x00800000, 0x3f800000, 0xbf800000,
        0x3f800001, 0x33800000, 0x33800001, 0x337fffff, 0x34000000};
    static const uint64_t f64[] = {
        0x0000000000000000ull, 0x8000000000000000ull, 0x7ff0000000000000ull,
        0xfff0000000000000ull, 0x7ff8000000000000ull, 0x7ff0000000000001ull,
        0xfff5a5a5a5a5a5a5ull, 0x7fefffffffffffffull, 0xffefffffffffffffull,
        0x0000000000000001ull, 0x8000000000000001ull, 0x000fffffffffffffull,
        0x0010000000000000ull, 0x3ff0000000000000ull, 0xbff0000000000000ull,
        0x3ff0000000000001ull, 0x3ca0000000000000ull, 0x3ca0000000000001ull};
    static const uint64_t ints[] = {0,
                                    1,
                                    ~0ull,
                                    2,
                                    0x7f,
                                    0x80,
                                    0xff,
                                    0x7fffffff,
                                    0x80000000,
                                    0xffffffff,
                                    0x7fffffffffffffffull,
                                    0x8000000000000000ull};
    switch (dt) {
    case LOOM_FLOAT16:
        return h16[rnd() % (sizeof h16 / sizeof h16[0])];
    case LOOM_BFLOAT16:
        return b16[rnd() % (sizeof b16 / sizeof b16[0])];
    case LOOM_FLOAT32:
        return f32[rnd() % (sizeof f32 / sizeof f32[0])];
    case LOOM_FLOAT64:
        return f64[rnd() % (sizeof f64 / sizeof f64[0])];
    default: {
        size_t sz = esize(dt);
        uint64_t mask = sz == 8 ? ~0ull : (1ull << (8 * sz)) - 1;
        return ints[rnd() % (sizeof ints / sizeof ints[0])] & mask;
    }
    }
}

/* A float of moderate magnitude, so sums and products stay finite and
 * many of them round. */
static uint64_t moderate_value(loom_datatype_t dt)
{
    uint64_t r = rnd(), s = r >> 63;
    switch (dt) {
    case LOOM_FLOAT16:
        return (s << 15) | ((8 + (r >> 40) % 15) << 10) | (r & 0x3ff);
    case LOOM_BFLOAT16:
        return (s << 15) | ((100 + (r >> 40) % 55) << 7) | (r & 0x7f);
    case LOOM_FLOAT32:
        return (s << 31) | ((97 + (r >> 40) % 60) << 23) | (r & 0x7fffff);
    default:
        return (s << 63) | ((993 + (r >> 20) % 60) << 52) |
               (r & 0xfffffffffffffull);
    }
}

/* Fill a and b: random bits, specials, and pairs close to each other
 * (cancellation, near-ties) or of opposite sign. */
static void gen_pair(loom_datatype_t dt, uint64_t *a, uint64_t *b)
{
    size_t sz = esize(dt);
    uint64_t mask = sz == 8 ? ~0ull : (1ull << (8 * sz)) - 1;
    uint64_t sign = 1ull << (8 * sz - 1);
    unsigned k = (unsigned)(rnd() % 8);
    if (!is_float(dt)) {
        *a = k == 0 ? special_value(dt) : rnd() & mask;
        *b = k == 1 ? special_value(dt) : rnd() & mask;
        return;
    }
    switch (k) {
    case 0:
        *a = special_value(dt);
        *b = special_value(dt);
        break;
    case 1:
        *a = special_value(dt);
        *b = moderate_value(dt);
        break;
    case 2:
        *a = rnd() & mask;
        *b = rnd() & mask;
        break;
    case 3: /* near cancellation */
        *a = moderate_value(dt);
        *b = (*a ^ sign) ^ (rnd() & 0xf);
        break;
    case 4: /* small against large: the sum rounds at a low bit */
        *a = moderate_value(dt);
        *b = *a - ((uint64_t)(rnd() % 12 + 1)
                   << (dt == LOOM_FLOAT16 ? 10 : sz == 2 ? 7 : 23));
        if (sz == 8)
            *b = *a - ((uint64_t)(rnd() % 60 + 1) << 52);
        break;
    default:
        *a = moderate_value(dt);
        *b = moderate_value(dt);
    }
}

/* ------------------------------------------------------ kernel driver */

struct ktest {
    loom_datatype_t dt;
    loom_op_t op;
    size_t n;
    unsigned char *a, *b;           /* packed inputs */
    unsigned char *exp_ab, *exp_aa; /* expected a OP b, a OP a */
    unsigned char *nan_ab, *nan_aa; /* per element: any quiet NaN is fine */
    unsigned char *bufs[3];         /* guarded work buffers, reused */
};

#define GUARD 64
#define GUARD_BYTE 0xa5
#define MAX_OFF 8

static void ktest_prepare(struct ktest *t)
{
    size_t sz = esize(t->dt), n = t->n;
    size_t bytes = n * sz + 1;
    t->a = malloc(bytes);
    t->b = malloc(bytes);
    t->exp_ab = malloc(bytes);
    t->exp_aa = malloc(bytes);
    t->nan_ab = malloc(n + 1);
    t->nan_aa = malloc(n + 1);
    cr_assert(t->a && t->b && t->exp_ab && t->exp_aa && t->nan_ab &&
              t->nan_aa);
    for (int k = 0; k < 3; k++) {
        t->bufs[k] = malloc(n * sz + 2 * GUARD + MAX_OFF);
        cr_assert(t->bufs[k]);
    }
    for (size_t i = 0; i < n; i++) {
        uint64_t a, b;
        int an;
        gen_pair(t->dt, &a, &b);
        putv(t->dt, t->a, i, a);
        putv(t->dt, t->b, i, b);
        putv(t->dt, t->exp_ab, i, ref_op(t->dt, t->op, a, b, &an));
        t->nan_ab[i] = (unsigned char)an;
        putv(t->dt, t->exp_aa, i, ref_op(t->dt, t->op, a, a, &an));
        t->nan_aa[i] = (unsigned char)an;
    }
}

static void ktest_free(struct ktest *t)
{
    free(t->a);
    free(t->b);
    free(t->exp_ab);
    free(t->exp_aa);
    free(t->nan_ab);
    free(t->nan_aa);
    for (int k = 0; k < 3; k++)
        free(t->bufs[k]);
}

/* Guard bytes around the `off`-shifted data, which is set from init. */
static unsigned char *guarded(unsigned char *m, size_t bytes, size_t off,
                              const void *init)
{
    memset(m, GUARD_BYTE, bytes + 2 * GUARD + off);
    if (init)
        memcpy(m + GUARD + off, init, bytes);
    return m;
}

static void check_guards(const unsigned char *m, size_t bytes, size_t off,
                         const char *what)
{
    for (size_t i = 0; i < GUARD + off; i++)
        cr_assert(m[i] == GUARD_BYTE, "%s: wrote before the buffer", what);
    for (size_t i = 0; i < GUARD; i++)
        cr_assert(m[GUARD + off + bytes + i] == GUARD_BYTE,
                  "%s: wrote past the end", what);
}

static void check_result(const struct ktest *t, const unsigned char *got,
                         const unsigned char *exp, const unsigned char *nan,
                         const unsigned char *in_a, const unsigned char *in_b,
                         const char *isa, size_t off, const char *mode)
{
    size_t sz = esize(t->dt);
    if (memcmp(got, exp, t->n * sz) == 0)
        return; /* also when every any-NaN slot holds the expected NaN */
    for (size_t i = 0; i < t->n; i++) {
        uint64_t g = getv(t->dt, got, i), e = getv(t->dt, exp, i);
        if (g == e || (nan[i] && is_quiet_nan(t->dt, g)))
            continue;
        cr_assert_fail("%s %s isa=%s n=%zu off=%zu %s: [%zu] a=%#llx "
                       "b=%#llx expected %#llx got %#llx",
                       dt_name(t->dt), op_name(t->op), isa, t->n, off, mode,
                       i, (unsigned long long)getv(t->dt, in_a, i),
                       (unsigned long long)getv(t->dt, in_b, i),
                       (unsigned long long)e, (unsigned long long)g);
    }
}

/* Run every call form on one ISA at one misalignment. */
static void ktest_run(const struct ktest *t, const char *isa, size_t off,
                      int all_modes)
{
    size_t bytes = t->n * esize(t->dt);
    loom_datatype_t dt = t->dt;
    loom_op_t op = t->op;

    /* out of place: inputs untouched */
    unsigned char *A = guarded(t->bufs[0], bytes, off, t->a);
    unsigned char *B = guarded(t->bufs[1], bytes, off, t->b);
    unsigned char *D = guarded(t->bufs[2], bytes, off, NULL);
    unsigned char *a = A + GUARD + off, *b = B + GUARD + off;
    unsigned char *d = D + GUARD + off;
    loomi_reduce_out(d, a, b, t->n, dt, op);
    check_result(t, d, t->exp_ab, t->nan_ab, t->a, t->b, isa, off, "out");
    check_guards(D, bytes, off, "out");
    cr_assert(memcmp(a, t->a, bytes) == 0 && memcmp(b, t->b, bytes) == 0,
              "out: an input changed");

    /* in place: dst OP= src */
    loomi_reduce_inplace(a, b, t->n, dt, op);
    check_result(t, a, t->exp_ab, t->nan_ab, t->a, t->b, isa, off,
                 "inplace");
    check_guards(A, bytes, off, "inplace");
    cr_assert(memcmp(b, t->b, bytes) == 0, "inplace: src changed");

    if (all_modes) {
        /* out with dst == b */
        loomi_reduce_out(b, t->a, b, t->n, dt, op);
        check_result(t, b, t->exp_ab, t->nan_ab, t->a, t->b, isa, off,
                     "out dst==b");
        check_guards(B, bytes, off, "out dst==b");

        /* in place with src == dst: a OP a */
        memcpy(a, t->a, bytes);
        loomi_reduce_inplace(a, a, t->n, dt, op);
        check_result(t, a, t->exp_aa, t->nan_aa, t->a, t->a, isa, off,
                     "inplace src==dst");
        check_guards(A, bytes, off, "inplace src==dst");
    }
}

static int n_isas_run;

static void run_kernel_test(loom_datatype_t dt, loom_op_t op)
{
    static const size_t lens[] = {0,   1,   7,   15,  16,   17,     33,
                                  63,  64,  65,  255, 256,  257,    1023,
                                  1024, 4099, 1000003};
    size_t sz = esize(dt);
    rng_state = 0x1234567ull + 1000ull * dt + (uint64_t)op;
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        struct ktest t = {.dt = dt, .op = op, .n = lens[li]};
        int big = t.n > 100000;
        ktest_prepare(&t);
        n_isas_run = 0;
        for (size_t k = 0; k < N_ISAS; k++) {
            if (loomi_reduce_set_isa(all_isas[k]) != 0)
                continue;
            n_isas_run++;
            ktest_run(&t, all_isas[k], 0, 1);
            ktest_run(&t, all_isas[k], sz, !big); /* one element off */
            if (sz > 1 && !big)
                ktest_run(&t, all_isas[k], 1, 1); /* not even aligned */
        }
        ktest_free(&t);
        cr_assert(n_isas_run >= 1, "not even the generic ISA ran");
    }
}

/* Test names are spelled out: INT8_MAX etc. are macros. */
#define KTEST(name, DT, OP)                                                    \
    Test(kernels, name)                                                        \
    {                                                                          \
        run_kernel_test(LOOM_##DT, LOOM_##OP);                                 \
    }
#define KTEST_ALL_OPS(t, DT)                                                   \
    KTEST(t##_sum, DT, SUM)                                                    \
    KTEST(t##_prod, DT, PROD)                                                  \
    KTEST(t##_max, DT, MAX)                                                    \
    KTEST(t##_min, DT, MIN)                                                    \
    KTEST(t##_avg, DT, AVG)

KTEST_ALL_OPS(int8, INT8)
KTEST_ALL_OPS(uint8, UINT8)
KTEST_ALL_OPS(int32, INT32)
KTEST_ALL_OPS(uint32, UINT32)
KTEST_ALL_OPS(int64, INT64)
KTEST_ALL_OPS(uint64, UINT64)
KTEST_ALL_OPS(fp16, FLOAT16)
KTEST_ALL_OPS(bf16, BFLOAT16)
KTEST_ALL_OPS(fp32, FLOAT32)
KTEST_ALL_OPS(fp64, FLOAT64)

/* Every fp16/bf16 value against a fixed set of partners, every op. */
static void run_all16(loom_datatype_t dt)
{
    enum { NB = 48 };
    const size_t n = 65536 * NB;
    uint16_t *a = malloc(n * 2), *b = malloc(n * 2), *d = malloc(n * 2);
    uint16_t *exp = malloc(n * 2);
    unsigned char *nan = malloc(n);
    uint16_t partners[NB];
    cr_assert(a && b && d && exp && nan);
    rng_state = 77 + dt;
    for (int j = 0; j < NB; j++)
        partners[j] = (uint16_t)(j < 24 ? special_value(dt)
                                        : (j < 36 ? moderate_value(dt)
                                                  : rnd()));
    partners[0] = 0x8000; /* x + -0 = x: the plain conversion round trip */
    partners[1] = dt == LOOM_FLOAT16 ? 0x3c00 : 0x3f80; /* x * 1 = x */
    for (size_t i = 0; i < n; i++) {
        a[i] = (uint16_t)(i & 0xffff);
        b[i] = partners[i >> 16];
    }
    for (int op = LOOM_SUM; op <= LOOM_MIN; op++) {
        for (size_t i = 0; i < n; i++) {
            int an;
            exp[i] = (uint16_t)ref_op(dt, (loom_op_t)op, a[i], b[i], &an);
            nan[i] = (unsigned char)an;
        }
        for (size_t k = 0; k < N_ISAS; k++) {
            if (loomi_reduce_set_isa(all_isas[k]) != 0)
                continue;
            loomi_reduce_out(d, a, b, n, dt, (loom_op_t)op);
            for (size_t i = 0; i < n; i++) {
                if (d[i] == exp[i] || (nan[i] && is_quiet_nan(dt, d[i])))
                    continue;
                cr_assert_fail("%s %s isa=%s: a=%#x b=%#x expected %#x "
                               "got %#x",
                               dt_name(dt), op_name((loom_op_t)op),
                               all_isas[k], a[i], b[i], exp[i], d[i]);
            }
        }
    }
    free(a);
    free(b);
    free(d);
    free(exp);
    free(nan);
}

Test(kernels, fp16_every_value)
{
    run_all16(LOOM_FLOAT16);
}

Test(kernels, bf16_every_value)
{
    run_all16(LOOM_BFLOAT16);
}

/* ------------------------------------------ explicit rounding cases */

struct case16 {
    loom_op_t op;
    uint16_t a, b, expect; /* expect 0xffff: any quiet NaN */
};

static void run_cases16(loom_datatype_t dt, const struct case16 *c,
                        size_t nc)
{
    enum { N = 300 }; /* long enough for the vector body and the tail */
    uint16_t a[N + 1], b[N + 1], d[N + 1];
    for (size_t k = 0; k < N_ISAS; k++) {
        if (loomi_reduce_set_isa(all_isas[k]) != 0)
            continue;
        for (size_t j = 0; j < nc; j++) {
            for (size_t i = 0; i < N + 1; i++) {
                a[i] = c[j].a;
                b[i] = c[j].b;
            }
            /* a OP b into d; b OP= a one element off (other order) */
            loomi_reduce_out(d, a, b, N, dt, c[j].op);
            loomi_reduce_inplace(b + 1, a + 1, N, dt, c[j].op);
            for (size_t i = 0; i < N; i++) {
                uint16_t g1 = d[i], g2 = b[i + 1];
                int ok1 = c[j].expect == 0xffff ? is_quiet_nan(dt, g1)
                                                : g1 == c[j].expect;
                int ok2 = c[j].expect == 0xffff ? is_quiet_nan(dt, g2)
                                                : g2 == c[j].expect;
                cr_assert(ok1 && ok2,
                          "%s %s isa=%s: %#x op %#x expected %#x got %#x "
                          "and %#x (elem %zu)",
                          dt_name(dt), op_name(c[j].op), all_isas[k],
                          c[j].a, c[j].b, c[j].expect, g1, g2, i);
            }
        }
    }
}

Test(rounding, fp16_kernels)
{
    static const struct case16 c[] = {
        {LOOM_SUM, 0x3c00, 0x1000, 0x3c00}, /* 1 + 2^-11: tie, to even */
        {LOOM_SUM, 0x3c01, 0x1000, 0x3c02}, /* tie, odd: up */
        {LOOM_SUM, 0x3c00, 0x1001, 0x3c01}, /* just above the tie */
        {LOOM_SUM, 0x3c00, 0x0fff, 0x3c00}, /* just below the tie */
        {LOOM_SUM, 0x7bff, 0x4c00, 0x7c00}, /* 65504 + 16 = 65520: inf */
        {LOOM_SUM, 0x7bff, 0x4bff, 0x7bff}, /* just below: stays finite */
        {LOOM_SUM, 0xfbff, 0xcc00, 0xfc00}, /* to -inf */
        {LOOM_SUM, 0x0001, 0x0001, 0x0002}, /* subnormals */
        {LOOM_SUM, 0x03ff, 0x0001, 0x0400}, /* subnormal to normal */
        {LOOM_SUM, 0x0400, 0x8001, 0x03ff}, /* normal to subnormal */
        {LOOM_SUM, 0x8000, 0x8000, 0x8000}, /* -0 + -0 = -0 */
        {LOOM_SUM, 0x0000, 0x8000, 0x0000}, /* +0 + -0 = +0 */
        {LOOM_SUM, 0x3c00, 0xbc00, 0x0000}, /* x - x = +0 */
        {LOOM_SUM, 0x7c00, 0xfc00, 0xffff}, /* inf - inf: NaN */
        {LOOM_SUM, 0x7c00, 0x3c00, 0x7c00},
        {LOOM_SUM, 0x7e00, 0x3c00, 0x7e00},
        {LOOM_PROD, 0x0c00, 0x0800, 0x0000}, /* 2^-25: tie to 0 */
        {LOOM_PROD, 0x0e00, 0x0800, 0x0001}, /* 0.75 * 2^-24: up */
        {LOOM_PROD, 0x0e00, 0x0c00, 0x0002}, /* 1.5 * 2^-24: tie, to 2 */
        {LOOM_PROD, 0x0d00, 0x1000, 0x0002}, /* 2.5 * 2^-24: tie, to 2 */
        {LOOM_PROD, 0x7bff, 0x4000, 0x7c00}, /* overflow */
        {LOOM_PROD, 0x8000, 0x3c00, 0x8000},
        {LOOM_PROD, 0x7c00, 0x0000, 0xffff}, /* inf * 0: NaN */
        {LOOM_PROD, 0x3e00, 0x3e00, 0x4080}, /* 1.5 * 1.5 = 2.25 */
        {LOOM_MAX, 0x8000, 0x0000, 0x0000},
        {LOOM_MAX, 0x0000, 0x8000, 0x0000},
        {LOOM_MIN, 0x8000, 0x0000, 0x8000},
        {LOOM_MIN, 0x0000, 0x8000, 0x8000},
        {LOOM_MAX, 0x7e00, 0x3c00, 0x7e00}, /* NaN propagates */
        {LOOM_MAX, 0x3c00, 0x7e00, 0x7e00},
        {LOOM_MIN, 0xfe00, 0x3c00, 0xfe00},
        {LOOM_MIN, 0x3c00, 0xfe00, 0xfe00},
        {LOOM_MAX, 0xfc00, 0x7c00, 0x7c00},
        {LOOM_MIN, 0xfc00, 0x7c00, 0xfc00},
        {LOOM_MAX, 0x0001, 0x8001, 0x0001},
        {LOOM_MIN, 0x0001, 0x8001, 0x8001},
    };
    run_cases16(LOOM_FLOAT16, c, sizeof c / sizeof c[0]);
}

Test(rounding, bf16_kernels)
{
    static const struct case16 c[] = {
        {LOOM_SUM, 0x3f80, 0x3b80, 0x3f80}, /* 1 + 2^-8: tie, to even */
        {LOOM_SUM, 0x3f81, 0x3b80, 0x3f82}, /* tie, odd: up */
        {LOOM_SUM, 0x3f80, 0x3b81, 0x3f81}, /* just above */
        {LOOM_SUM, 0x3f80, 0x3b7f, 0x3f80}, /* just below */
        {LOOM_SUM, 0x7f7f, 0x7b00, 0x7f80}, /* max + half ulp: inf */
        {LOOM_SUM, 0x7f7f, 0x7a80, 0x7f7f}, /* below the tie */
        {LOOM_SUM, 0xff7f, 0xfb00, 0xff80},
        {LOOM_SUM, 0x0001, 0x0001, 0x0002}, /* subnormals */
        {LOOM_SUM, 0x007f, 0x0001, 0x0080}, /* subnormal to normal */
        {LOOM_SUM, 0x0080, 0x8001, 0x007f}, /* normal to subnormal */
        {LOOM_SUM, 0x8000, 0x8000, 0x8000},
        {LOOM_SUM, 0x0000, 0x8000, 0x0000},
        {LOOM_SUM, 0x3f80, 0xbf80, 0x0000},
        {LOOM_SUM, 0x7f80, 0xff80, 0xffff},
        {LOOM_SUM, 0x7fc0, 0x3f80, 0x7fc0},
        {LOOM_SUM, 0x7f81, 0x3f80, 0x7fc1}, /* signalling NaN quieted */
        {LOOM_PROD, 0x0001, 0x3f00, 0x0000}, /* 2^-134: tie to 0 */
        {LOOM_PROD, 0x0003, 0x3f00, 0x0002}, /* 1.5 ulp: tie, to 2 */
        {LOOM_PROD, 0x0005, 0x3f00, 0x0002}, /* 2.5 ulp: tie, to 2 */
        {LOOM_PROD, 0x0001, 0x3f40, 0x0001}, /* 0.75 ulp: up */
        {LOOM_PROD, 0x7f7f, 0x4000, 0x7f80}, /* overflow */
        {LOOM_PROD, 0x8000, 0x3f80, 0x8000},
        {LOOM_PROD, 0x7f80, 0x0000, 0xffff},
        {LOOM_MAX, 0x8000, 0x0000, 0x0000},
        {LOOM_MAX, 0x0000, 0x8000, 0x0000},
        {LOOM_MIN, 0x8000, 0x0000, 0x8000},
        {LOOM_MIN, 0x0000, 0x8000, 0x8000},
        {LOOM_MAX, 0x7fc0, 0x3f80, 0x7fc0},
        {LOOM_MAX, 0x3f80, 0x7fc0, 0x7fc0},
        {LOOM_MIN, 0xffc0, 0x3f80, 0xffc0},
        {LOOM_MIN, 0x3f80, 0x7f81, 0x7fc1},
        {LOOM_MAX, 0xff80, 0x7f80, 0x7f80},
        {LOOM_MIN, 0xff80, 0x7f80, 0xff80},
    };
    run_cases16(LOOM_BFLOAT16, c, sizeof c / sizeof c[0]);
}

Test(rounding, fp32_minmax_and_zero)
{
    float a[40], b[40], d[40];
    for (size_t k = 0; k < N_ISAS; k++) {
        if (loomi_reduce_set_isa(all_isas[k]) != 0)
            continue;
        for (int i = 0; i < 40; i++) {
            a[i] = (i & 1) ? -0.0f : 0.0f;
            b[i] = (i & 1) ? 0.0f : -0.0f;
        }
        loomi_reduce_out(d, a, b, 40, LOOM_FLOAT32, LOOM_MAX);
        for (int i = 0; i < 40; i++)
            cr_assert(fbits(d[i]) == 0, "%s max(+-0)", all_isas[k]);
        loomi_reduce_out(d, a, b, 40, LOOM_FLOAT32, LOOM_MIN);
        for (int i = 0; i < 40; i++)
            cr_assert(fbits(d[i]) == 0x80000000u, "%s min(+-0)",
                      all_isas[k]);
        for (int i = 0; i < 40; i++) {
            a[i] = (i & 1) ? NAN : 1.0f;
            b[i] = (i & 1) ? -INFINITY : NAN;
        }
        loomi_reduce_out(d, a, b, 40, LOOM_FLOAT32, LOOM_MAX);
        for (int i = 0; i < 40; i++)
            cr_assert(isnan(d[i]), "%s max with NaN", all_isas[k]);
        loomi_reduce_out(d, a, b, 40, LOOM_FLOAT32, LOOM_MIN);
        for (int i = 0; i < 40; i++)
            cr_assert(isnan(d[i]), "%s min with NaN", all_isas[k]);
    }
}

/* ------------------------------------------------------- conversions */

Test(conversions, fp16_all_patterns)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = loomi_fp16_to_fp32((uint16_t)h);
        uint16_t back = loomi_fp32_to_fp16(f);
        if (isnan16(LOOM_FLOAT16, (uint16_t)h)) {
            uint32_t want = ((h & 0x8000u) << 16) | 0x7fc00000u |
                            ((h & 0x3ffu) << 13);
            cr_assert(fbits(f) == want, "fp16 %#x -> %#x", h, fbits(f));
            cr_assert(back == (h | 0x200), "fp16 NaN %#x -> %#x", h, back);
        } else {
            double v = dec16(LOOM_FLOAT16, (uint16_t)h);
            cr_assert((double)f == v && !!signbit(f) == !!signbit(v),
                      "fp16 %#x -> %a, want %a", h, (double)f, v);
            cr_assert(back == h, "fp16 round trip %#x -> %#x", h, back);
        }
    }
}

Test(conversions, bf16_all_patterns)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = loomi_bf16_to_fp32((uint16_t)h);
        uint16_t back = loomi_fp32_to_bf16(f);
        if (isnan16(LOOM_BFLOAT16, (uint16_t)h)) {
            cr_assert(fbits(f) == ((h << 16) | 0x400000u), "bf16 %#x -> %#x",
                      h, fbits(f));
            cr_assert(back == (h | 0x40), "bf16 NaN %#x -> %#x", h, back);
        } else {
            cr_assert(fbits(f) == h << 16, "bf16 %#x -> %#x", h, fbits(f));
            cr_assert(back == h, "bf16 round trip %#x -> %#x", h, back);
        }
    }
}

static void check_f32_to_16(loom_datatype_t dt, uint32_t u)
{
    float f = bitsf(u);
    uint16_t got = dt == LOOM_FLOAT16 ? loomi_fp32_to_fp16(f)
                                      : loomi_fp32_to_bf16(f);
    if (isnan(f)) {
        cr_assert(is_quiet_nan(dt, got) && (got & 0x8000) == (u >> 16 & 0x8000),
                  "%s NaN %#x -> %#x", dt_name(dt), u, got);
        return;
    }
    uint16_t want = enc16(dt, (double)f);
    cr_assert(got == want, "%s(%#x = %a) = %#x, want %#x", dt_name(dt), u,
              (double)f, got, want);
}

/* fp32 -> 16 bit against the reference: ties and their neighbours around
 * every 16-bit value, a sweep of the whole fp32 range, and random bits. */
static void run_f32_to_16(loom_datatype_t dt)
{
    /* every positive finite value; the sign is added below */
    for (uint32_t h = 0; h < (dt == LOOM_FLOAT16 ? 0x7c00u : 0x7f80u); h++) {
        double lo = dec16(dt, (uint16_t)h);
        double hi = dec16(dt, (uint16_t)(h + 1));
        if (isinf(hi)) /* the tie above the largest finite value */
            hi = 2 * lo - dec16(dt, (uint16_t)(h - 1));
        float mid = (float)((lo + hi) / 2); /* exact in fp32 */
        uint32_t m = fbits(mid);
        for (uint32_t s = 0; s < 2; s++)
            for (int k = -2; k <= 2; k++)
                check_f32_to_16(dt, (s << 31) | (uint32_t)((int32_t)m + k));
    }
    for (uint64_t u = 0; u < 0x100000000ull; u += 4093)
        check_f32_to_16(dt, (uint32_t)u);
    rng_state = 5;
    for (int i = 0; i < 1000000; i++)
        check_f32_to_16(dt, (uint32_t)rnd());
}

Test(conversions, fp32_to_fp16_rounding)
{
    run_f32_to_16(LOOM_FLOAT16);
}

Test(conversions, fp32_to_bf16_rounding)
{
    run_f32_to_16(LOOM_BFLOAT16);
}

Test(conversions, named_cases)
{
    static const struct {
        uint32_t in;
        uint16_t h, b;
    } c[] = {
        {0x3f801000, 0x3c00, 0x3f80}, /* 1 + 2^-11: fp16 tie to even */
        {0x3f803000, 0x3c02, 0x3f80}, /* 1 + 3*2^-11: tie up */
        {0x3f801001, 0x3c01, 0x3f80}, /* just above a tie */
        {0x3f800fff, 0x3c00, 0x3f80}, /* just below */
        {0x3f808000, 0x3c04, 0x3f80}, /* 1 + 2^-8: bf16 tie to even */
        {0x3f818000, 0x3c0c, 0x3f82}, /* 1 + 3*2^-8: bf16 tie up */
        {0x3f808001, 0x3c04, 0x3f81}, /* bf16: just above */
        {0x477fe000, 0x7bff, 0x4780}, /* 65504 */
        {0x477fefff, 0x7bff, 0x4780},
        {0x477ff000, 0x7c00, 0x4780}, /* 65520: fp16 inf */
        {0xc77ff000, 0xfc00, 0xc780},
        {0x7f7fffff, 0x7c00, 0x7f80}, /* FLT_MAX: bf16 inf too */
        {0x7f7f7fff, 0x7c00, 0x7f7f},
        {0x7f7f8000, 0x7c00, 0x7f80}, /* bf16 tie at the top: inf */
        {0x7f800000, 0x7c00, 0x7f80},
        {0xff800000, 0xfc00, 0xff80},
        {0x33800000, 0x0001, 0x3380}, /* 2^-24 */
        {0x33000000, 0x0000, 0x3300}, /* 2^-25: tie to 0 */
        {0x33000001, 0x0001, 0x3300}, /* just above */
        {0x33c00000, 0x0002, 0x33c0}, /* 3*2^-25: tie to 2 */
        {0x34200000, 0x0002, 0x3420}, /* 5*2^-25: tie to 2 */
        {0x387fe000, 0x0400, 0x3880}, /* 2^-14 - 2^-25: to min normal */
        {0x387fc000, 0x03ff, 0x3880}, /* 2^-14 - 2^-24: subnormal */
        {0xb3000000, 0x8000, 0xb300}, /* -2^-25 */
        {0x00000001, 0x0000, 0x0000}, /* fp32 subnormals */
        {0x80000001, 0x8000, 0x8000},
        {0x00008000, 0x0000, 0x0000}, /* bf16 tie to 0 */
        {0x00018000, 0x0000, 0x0002}, /* bf16 tie to 2 */
        {0x00008001, 0x0000, 0x0001},
        {0x007fffff, 0x0000, 0x0080}, /* bf16: up to the min normal */
        {0x80000000, 0x8000, 0x8000}, /* -0 */
        {0x7fc00000, 0x7e00, 0x7fc0}, /* quiet NaN */
        {0x7f800001, 0x7e00, 0x7fc0}, /* signalling NaN: quieted */
        {0xffa00000, 0xff00, 0xffe0}, /* NaN sign and payload kept */
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        float f = bitsf(c[i].in);
        cr_assert(loomi_fp32_to_fp16(f) == c[i].h, "fp16(%#x) = %#x, want %#x",
                  c[i].in, loomi_fp32_to_fp16(f), c[i].h);
        cr_assert(loomi_fp32_to_bf16(f) == c[i].b, "bf16(%#x) = %#x, want %#x",
                  c[i].in, loomi_fp32_to_bf16(f), c[i].b);
    }
    cr_assert(fbits(loomi_fp16_to_fp32(0x0001)) == 0x33800000u);
    cr_assert(fbits(loomi_fp16_to_fp32(0x83ff)) == 0xb87fc000u);
    cr_assert(fbits(loomi_fp16_to_fp32(0x7c01)) == 0x7fc02000u);
    cr_assert(fbits(loomi_fp16_to_fp32(0x8000)) == 0x80000000u);
    cr_assert(fbits(loomi_bf16_to_fp32(0x0001)) == 0x00010000u);
    cr_assert(fbits(loomi_bf16_to_fp32(0xff81)) == 0xffc10000u);
}

/* ----------------------------------------------------------- avg finish */

static const int avg_ranks[] = {-1, 0, 1, 2, 3, 4, 5, 7, 8, 13, 255, 256, 1000};
#define N_AVG_RANKS (sizeof avg_ranks / sizeof avg_ranks[0])

static uint64_t ref_avg(loom_datatype_t dt, uint64_t v, int nr)
{
    if (nr < 2)
        return v; /* 1 is the identity, fewer a no-op */
    switch (dt) {
    case LOOM_INT8:
        return (uint8_t)((int8_t)v / nr);
    case LOOM_UINT8:
        return (uint8_t)((uint8_t)v / nr);
    case LOOM_INT32:
        return (uint32_t)((int32_t)v / nr);
    case LOOM_UINT32:
        return (uint32_t)v / (uint32_t)nr;
    case LOOM_INT64:
        return (uint64_t)((int64_t)v / nr);
    case LOOM_UINT64:
        return v / (uint64_t)nr;
    case LOOM_FLOAT64:
        return dbits(bitsd(v) / nr);
    case LOOM_FLOAT32: /* double division rounds innocuously to fp32 */
        return fbits((float)((double)bitsf((uint32_t)v) / nr));
    default: {
        /* defined as fp32 division rounded to 16 bits */
        double q = (double)(float)(dec16(dt, (uint16_t)v) / (float)nr);
        return enc16(dt, q);
    }
    }
}

static void run_avg(loom_datatype_t dt)
{
    const size_t n = 4099;
    size_t sz = esize(dt);
    unsigned char *in = malloc(n * sz), *buf = malloc(n * sz + 1 + GUARD);
    cr_assert(in && buf);
    rng_state = 99 + dt;
    for (size_t i = 0; i < n; i++) {
        uint64_t a, b;
        gen_pair(dt, &a, &b);
        putv(dt, in, i, i % 3 ? a : b);
    }
    for (size_t k = 0; k < N_ISAS; k++) {
        if (loomi_reduce_set_isa(all_isas[k]) != 0)
            continue;
        for (size_t r = 0; r < N_AVG_RANKS; r++) {
            for (size_t off = 0; off < 2; off++) {
                unsigned char *p = buf + off;
                memset(buf, GUARD_BYTE, n * sz + 1 + GUARD);
                memcpy(p, in, n * sz);
                loomi_reduce_finish_avg(p, n, dt, avg_ranks[r]);
                for (size_t i = 0; i < n; i++) {
                    uint64_t v = getv(dt, in, i);
                    uint64_t e = ref_avg(dt, v, avg_ranks[r]);
                    uint64_t g = getv(dt, p, i);
                    int ok = g == e;
                    if (is_float(dt) && isnan_bits(dt, v) &&
                        avg_ranks[r] >= 2)
#if defined(__x86_64__) || defined(__i386__)
                        ok = g == quiet_bits(dt, v); /* payload kept */
#else
                        ok = is_quiet_nan(dt, g);
#endif
                    if (ok)
                        continue;
                    cr_assert_fail("%s avg isa=%s nranks=%d [%zu] %#llx: "
                                   "expected %#llx got %#llx",
                                   dt_name(dt), all_isas[k], avg_ranks[r], i,
                                   (unsigned long long)v,
                                   (unsigned long long)e,
                                   (unsigned long long)g);
                }
                for (size_t i = n * sz + off; i < n * sz + 1 + GUARD; i++)
                    cr_assert(buf[i] == GUARD_BYTE, "avg wrote past the end");
            }
        }
    }
    free(in);
    free(buf);
}

#define AVGTEST(name, DT)                                                      \
    Test(avg, name)                                                            \
    {                                                                          \
        run_avg(LOOM_##DT);                                                    \
    }
AVGTEST(int8, INT8)
AVGTEST(uint8, UINT8)
AVGTEST(int32, INT32)
AVGTEST(uint32, UINT32)
AVGTEST(int64, INT64)
AVGTEST(uint64, UINT64)
AVGTEST(fp16, FLOAT16)
AVGTEST(bf16, BFLOAT16)
AVGTEST(fp32, FLOAT32)
AVGTEST(fp64, FLOAT64)

Test(avg, named_cases)
{
    int8_t i8[3] = {-128, 127, -7};
    loomi_reduce_finish_avg(i8, 3, LOOM_INT8, 2);
    cr_assert(i8[0] == -64 && i8[1] == 63 && i8[2] == -3);
    int64_t i64[2] = {INT64_MIN, -5};
    loomi_reduce_finish_avg(i64, 2, LOOM_INT64, 3);
    cr_assert(i64[0] == INT64_MIN / 3 && i64[1] == -1);
    uint64_t u64 = UINT64_MAX;
    loomi_reduce_finish_avg(&u64, 1, LOOM_UINT64, 2);
    cr_assert(u64 == UINT64_MAX / 2);
    float f[2] = {1.0f, -0.0f};
    loomi_reduce_finish_avg(f, 2, LOOM_FLOAT32, 3);
    cr_assert(f[0] == 1.0f / 3.0f && fbits(f[1]) == 0x80000000u);
    uint16_t h[2] = {0x0001, 0x3c00}; /* 2^-24 / 2: tie to 0; 1 / 2 */
    loomi_reduce_finish_avg(h, 2, LOOM_FLOAT16, 2);
    cr_assert(h[0] == 0x0000 && h[1] == 0x3800, "%#x %#x", h[0], h[1]);
    uint16_t bf = 0x0003; /* 3 ulp / 2 = 1.5 ulp: tie to 2 */
    loomi_reduce_finish_avg(&bf, 1, LOOM_BFLOAT16, 2);
    cr_assert(bf == 0x0002, "%#x", bf);
}

/* ------------------------------------------------------ integer wrap */

Test(kernels, integer_wrap)
{
    enum { N = 200 };
    for (size_t k = 0; k < N_ISAS; k++) {
        if (loomi_reduce_set_isa(all_isas[k]) != 0)
            continue;
        int8_t a8[N], b8[N];
        for (int i = 0; i < N; i++) {
            a8[i] = 127;
            b8[i] = 1;
        }
        loomi_reduce_inplace(a8, b8, N, LOOM_INT8, LOOM_SUM);
        for (int i = 0; i < N; i++)
            cr_assert(a8[i] == -128, "%s int8 127+1", all_isas[k]);
        for (int i = 0; i < N; i++)
            b8[i] = -1;
        loomi_reduce_inplace(a8, b8, N, LOOM_INT8, LOOM_PROD);
        for (int i = 0; i < N; i++)
            cr_assert(a8[i] == -128, "%s int8 -128*-1", all_isas[k]);

        uint8_t u8[N], v8[N];
        for (int i = 0; i < N; i++) {
            u8[i] = 255;
            v8[i] = 2;
        }
        loomi_reduce_out(v8, u8, v8, N, LOOM_UINT8, LOOM_SUM);
        for (int i = 0; i < N; i++)
            cr_assert(v8[i] == 1, "%s uint8 255+2", all_isas[k]);
        loomi_reduce_inplace(u8, u8, N, LOOM_UINT8, LOOM_PROD);
        for (int i = 0; i < N; i++)
            cr_assert(u8[i] == 1, "%s uint8 255*255", all_isas[k]);

        int32_t a32[N], b32[N];
        for (int i = 0; i < N; i++) {
            a32[i] = INT32_MAX;
            b32[i] = INT32_MAX;
        }
        loomi_reduce_inplace(a32, b32, N, LOOM_INT32, LOOM_SUM);
        for (int i = 0; i < N; i++)
            cr_assert(a32[i] == -2, "%s int32 max+max", all_isas[k]);
        loomi_reduce_inplace(b32, b32, N, LOOM_INT32, LOOM_PROD);
        for (int i = 0; i < N; i++)
            cr_assert(b32[i] == 1, "%s int32 max*max", all_isas[k]);

        uint32_t u32[N];
        for (int i = 0; i < N; i++)
            u32[i] = UINT32_MAX;
        loomi_reduce_inplace(u32, u32, N, LOOM_UINT32, LOOM_SUM);
        for (int i = 0; i < N; i++)
            cr_assert(u32[i] == UINT32_MAX - 1, "%s uint32", all_isas[k]);

        int64_t a64[N], b64[N];
        for (int i = 0; i < N; i++) {
            a64[i] = INT64_MIN;
            b64[i] = -1;
        }
        loomi_reduce_inplace(a64, b64, N, LOOM_INT64, LOOM_PROD);
        for (int i = 0; i < N; i++)
            cr_assert(a64[i] == INT64_MIN, "%s int64 min*-1", all_isas[k]);
        loomi_reduce_inplace(a64, b64, N, LOOM_INT64, LOOM_SUM);
        for (int i = 0; i < N; i++)
            cr_assert(a64[i] == INT64_MAX, "%s int64 min-1", all_isas[k]);

        uint64_t u64[N];
        for (int i = 0; i < N; i++)
            u64[i] = UINT64_MAX;
        loomi_reduce_inplace(u64, u64, N, LOOM_UINT64, LOOM_PROD);
        for (int i = 0; i < N; i++)
            cr_assert(u64[i] == 1, "%s uint64 max*max", all_isas[k]);
    }
}

/* ------------------------------------------- floating-point modes */

/* A program may change the FPU's modes (fesetround, -ffast-math's
 * flush to zero) before it reduces: every kernel set must still give
 * the generic kernels' results bit for bit (any quiet NaN where theirs
 * is NaN), whose fp16/bf16 conversions round to nearest even in
 * software whatever the mode.  The modes are
 * set directly (no libm): FPCR on aarch64, MXCSR on x86-64. */
#if defined(__aarch64__)
static uint64_t fpmode_get(void)
{
    uint64_t r;
    __asm__ volatile("mrs %0, fpcr" : "=r"(r) : : "memory");
    return r;
}
static void fpmode_set(uint64_t r)
{
    __asm__ volatile("msr fpcr, %0" : : "r"(r) : "memory");
}
/* RMode toward +inf, toward zero; FZ; DN (default NaN) */
static const uint64_t fpmodes[] = {1ull << 22, 3ull << 22, 1ull << 24,
                                   1ull << 25};
#elif defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
static uint64_t fpmode_get(void)
{
    return __builtin_ia32_stmxcsr();
}
static void fpmode_set(uint64_t r)
{
    __builtin_ia32_ldmxcsr((unsigned)r);
}
/* RC toward +inf, toward zero */
static const uint64_t fpmodes[] = {2ull << 13, 3ull << 13};
#endif

#if defined(__aarch64__) ||                                                   \
    (defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)))
static void modes_check(loom_datatype_t dt, size_t n, const void *a,
                        const void *b, void *exp, void *got, uint64_t mode)
{
    size_t bytes = n * esize(dt);
    for (int op = LOOM_SUM; op <= LOOM_AVG; op++) {
        cr_assert(loomi_reduce_set_isa("generic") == 0);
        loomi_reduce_out(exp, a, b, n, dt, (loom_op_t)op);
        if (op == LOOM_AVG)
            loomi_reduce_finish_avg(exp, n, dt, 3);
        for (size_t k = 1; k < N_ISAS; k++) {
            if (loomi_reduce_set_isa(all_isas[k]) != 0)
                continue;
            loomi_reduce_out(got, a, b, n, dt, (loom_op_t)op);
            if (op == LOOM_AVG)
                loomi_reduce_finish_avg(got, n, dt, 3);
            if (memcmp(got, exp, bytes) == 0)
                continue;
            for (size_t i = 0; i < n; i++) {
                uint64_t g = getv(dt, got, i), e = getv(dt, exp, i);
                /* which NaN operand comes out is the compiler's choice */
                cr_assert(g == e || (isnan_bits(dt, e) && is_quiet_nan(dt, g)),
                          "%s %s isa=%s fp mode %#llx: [%zu] a=%#llx b=%#llx "
                          "generic %#llx got %#llx",
                          dt_name(dt), op_name((loom_op_t)op), all_isas[k],
                          (unsigned long long)mode, i,
                          (unsigned long long)getv(dt, a, i),
                          (unsigned long long)getv(dt, b, i),
                          (unsigned long long)e, (unsigned long long)g);
            }
        }
    }
}

Test(kernels, fp_modes_do_not_change_results)
{
    static const loom_datatype_t dts[] = {LOOM_FLOAT16, LOOM_BFLOAT16,
                                          LOOM_FLOAT32};
    const size_t n = 65536 + 3; /* every 16-bit pattern, and a tail */
    uint32_t *a = malloc(n * 4), *b = malloc(n * 4);
    uint32_t *exp = malloc(n * 4), *got = malloc(n * 4);
    cr_assert(a && b && exp && got);
    const uint64_t saved = fpmode_get();
    for (size_t m = 0; m < sizeof fpmodes / sizeof fpmodes[0]; m++) {
        for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
            loom_datatype_t dt = dts[d];
            rng_state = 991 + 17 * m + dt;
            for (size_t i = 0; i < n; i++) {
                uint64_t x = esize(dt) == 2 ? (i & 0xffff) : rnd();
                putv(dt, a, i, x);
                putv(dt, b, i, rnd() & (esize(dt) == 2 ? 0xffff : 0xffffffff));
            }
            fpmode_set(saved | fpmodes[m]);
            modes_check(dt, n, a, b, exp, got, fpmodes[m]);
            fpmode_set(saved);
        }
    }
    free(a);
    free(b);
    free(exp);
    free(got);
}
#endif

/* ------------------------------------------------------------ dispatch */

/* The default set where LOOM_REDUCE_ISA does not choose: avx2 on x86-64
 * where the CPU runs it, neon on aarch64, else generic.  Switches. */
static const char *default_isa(void)
{
    if (loomi_reduce_set_isa("avx2") == 0)
        return "avx2";
    if (loomi_reduce_set_isa("neon") == 0)
        return "neon";
    return "generic";
}

Test(dispatch, names_and_hook)
{
    const char *isa = loomi_reduce_isa();
    cr_assert(strcmp(isa, "generic") == 0 || strcmp(isa, "avx2") == 0 ||
              strcmp(isa, "avx512") == 0 || strcmp(isa, "neon") == 0);
    cr_assert(loomi_reduce_set_isa("bogus") == -1);
    cr_assert(loomi_reduce_set_isa(NULL) == -1);
    cr_assert_str_eq(loomi_reduce_isa(), isa, "a failed switch changed it");
    cr_assert(loomi_reduce_set_isa("generic") == 0);
    cr_assert_str_eq(loomi_reduce_isa(), "generic");
    cr_assert(loomi_reduce_set_isa(isa) == 0);
    cr_assert_str_eq(loomi_reduce_isa(), isa);
    /* without LOOM_REDUCE_ISA the default is avx2 or neon */
    const char *want = default_isa();
    if (!getenv("LOOM_REDUCE_ISA"))
        cr_assert_str_eq(isa, want);
}

/* Each architecture builds and runs its own sets, and only those. */
Test(dispatch, sets_of_this_architecture)
{
#if defined(__aarch64__)
    cr_assert(loomi_reduce_set_isa("neon") == 0, "no NEON kernels on arm64");
    cr_assert_str_eq(loomi_reduce_isa(), "neon");
    cr_assert(loomi_reduce_set_isa("avx2") == -1);
    cr_assert(loomi_reduce_set_isa("avx512") == -1);
#else
    cr_assert(loomi_reduce_set_isa("neon") == -1, "neon away from arm64");
#endif
    cr_assert(loomi_reduce_set_isa("generic") == 0);
}

/* A set of another architecture is ignored like an unknown name, not
 * taken down to generic. */
Test(dispatch, env_other_architecture_ignored)
{
#if defined(__aarch64__)
    setenv("LOOM_REDUCE_ISA", "avx512", 1);
#else
    setenv("LOOM_REDUCE_ISA", "neon", 1);
#endif
    const char *got = loomi_reduce_isa();
    cr_assert_str_eq(got, default_isa());
}

/* The 512-bit kernels are there when asked for (never above the CPU). */
Test(dispatch, env_asks_for_avx512)
{
    setenv("LOOM_REDUCE_ISA", "avx512", 1);
    const char *got = loomi_reduce_isa();
    if (loomi_reduce_set_isa("avx512") == 0)
        cr_assert_str_eq(got, "avx512");
    else /* avx2 or generic below it; on arm64 ignored (neon) */
        cr_assert_str_eq(got, default_isa());
}

/* Criterion runs each test in its own process, so the library's one-time
 * selection has not happened yet when this test starts. */
Test(dispatch, env_forces_generic)
{
    setenv("LOOM_REDUCE_ISA", "generic", 1);
    cr_assert_str_eq(loomi_reduce_isa(), "generic");
}

Test(dispatch, count_zero_and_bad_args)
{
    loomi_reduce_inplace(NULL, NULL, 0, LOOM_FLOAT32, LOOM_SUM);
    loomi_reduce_out(NULL, NULL, NULL, 0, LOOM_BFLOAT16, LOOM_MAX);
    loomi_reduce_finish_avg(NULL, 0, LOOM_INT8, 4);
    float x = 1.0f, y = 2.0f;
    loomi_reduce_inplace(&x, &y, 1, LOOM_NUM_DATATYPES, LOOM_SUM);
    loomi_reduce_inplace(&x, &y, 1, LOOM_FLOAT32, LOOM_NUM_OPS);
    cr_assert(x == 1.0f, "invalid arguments must not touch the buffer");
}
