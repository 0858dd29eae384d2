/*
 * reduce_internal.h - shared by the reduction kernel files only.
 *
 * The one-element ("scalar") operations below define the exact semantics.
 * The generic path is built from them, and the SIMD paths use them for the
 * elements left over after their vector loops, so every path agrees there
 * by construction; the vector bodies are checked against them by tests.
 */
#ifndef LOOMI_REDUCE_INTERNAL_H
#define LOOMI_REDUCE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "reduce.h"

/* SIMD kernels are built only where GCC/clang target attributes exist. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define LOOMI_REDUCE_X86 1
#else
#define LOOMI_REDUCE_X86 0
#endif

/* The NEON kernels (reduce_neon.c) on little-endian aarch64, where
 * configure's REDUCE_NEON conditional builds them (host_cpu aarch64;
 * big-endian is aarch64_be): the two tests must agree. */
#if defined(__aarch64__) && defined(__BYTE_ORDER__) &&                       \
    __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ &&                             \
    (defined(__GNUC__) || defined(__clang__))
#define LOOMI_REDUCE_NEON 1
#else
#define LOOMI_REDUCE_NEON 0
#endif

/* Index of an op in a kernel table; LOOM_AVG uses the LOOM_SUM kernel. */
enum { LR_SUM = 0, LR_PROD = 1, LR_MAX = 2, LR_MIN = 3, LR_NOPS = 4 };

/* dst[i] = a[i] OP b[i]; dst may equal a or b. Pointers need no alignment. */
typedef void (*loomi_reduce_fn)(void *dst, const void *a, const void *b,
                                size_t n);
/* buf[i] /= nranks, nranks >= 2. */
typedef void (*loomi_avg_fn)(void *buf, size_t n, int nranks);

struct loomi_reduce_table {
    const char *name;
    loomi_reduce_fn op[LOOM_NUM_DATATYPES][LR_NOPS];
    loomi_avg_fn avg[LOOM_NUM_DATATYPES];
};

/* Overwrite the entries that have a SIMD version; the rest stay generic. */
void loomi_reduce_fill_avx2(struct loomi_reduce_table *t);
void loomi_reduce_fill_avx512(struct loomi_reduce_table *t);
void loomi_reduce_fill_neon(struct loomi_reduce_table *t);

/* ------------------------------------------------------------ bit casts */

#define LR_BITCAST(name, FROM, TO)                                             \
    static inline TO name(FROM v)                                              \
    {                                                                          \
        TO r;                                                                  \
        memcpy(&r, &v, sizeof r);                                              \
        return r;                                                              \
    }
LR_BITCAST(lr_fbits, float, uint32_t)
LR_BITCAST(lr_bitsf, uint32_t, float)
LR_BITCAST(lr_dbits, double, uint64_t)
LR_BITCAST(lr_bitsd, uint64_t, double)

/* ---------------------------------------------------------- conversions */

/* Matches F16C/AVX-512 vcvtph2ps bit for bit, NaN quieted as it does. */
static inline float lr_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f)
        return lr_bitsf(sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0));
    if (e == 0) /* subnormal or zero: m * 2^-24 is exact in fp32 */
        return lr_bitsf(sign | lr_fbits((float)m * 0x1p-24f));
    return lr_bitsf(sign | ((e + 112u) << 23) | (m << 13));
}

/* Round to nearest even; matches vcvtps2ph with imm 0 bit for bit. */
static inline uint16_t lr_f32_to_f16(float f)
{
    uint32_t u = lr_fbits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) /* NaN: keep the top payload bits, set quiet */
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) /* >= 65520 (the tie above 65504) gives inf */
        return (uint16_t)(sign | 0x7c00u);
    if (a >= 0x38800000u) { /* normal fp16; a carry may bump the exponent */
        uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
        return (uint16_t)(sign | ((r >> 13) - (112u << 10)));
    }
    if (a <= 0x33000000u) /* <= 2^-25, half the smallest subnormal: 0 */
        return sign;
    /* fp16 subnormal: round the 24-bit significand at bit `shift` */
    uint32_t shift = 126u - (a >> 23);
    uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    uint32_t h = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (h & 1u)))
        h++; /* may carry into the smallest normal, which is correct */
    return (uint16_t)(sign | h);
}

static inline float lr_bf16_to_f32(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    if ((u & 0x7fffffffu) > 0x7f800000u)
        u |= 0x400000u; /* quiet a signalling NaN, as the fp16 path does */
    return lr_bitsf(u);
}

/* Rounded bf16 in the high 16 bits of the result (low bits are junk).
 * Adding 0x7fff plus the kept lsb rounds to nearest even; a carry out
 * of the mantissa bumps the exponent, up to inf.  NaN would carry into
 * the sign, so it is only quieted. */
static inline uint32_t lr_bf16_round_hi(uint32_t u)
{
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return u | 0x400000u;
    return u + 0x7fffu + ((u >> 16) & 1u);
}

static inline uint16_t lr_f32_to_bf16(float f)
{
    return (uint16_t)(lr_bf16_round_hi(lr_fbits(f)) >> 16);
}

/* ------------------------------------------------- float min and max */

/*
 * NaN propagates: if either operand is NaN the result is NaN (unlike C
 * fmax or NCCL, which drop it), so a NaN on any rank is never hidden.
 * a + b yields a quiet NaN carrying an input payload.  Equal operands give
 * their bitwise AND (max) / OR (min), so max(-0, +0) = +0 and
 * min(-0, +0) = -0 whatever the order.
 */
#define LR_FMINMAX(name, T, BITS, FROMBITS, CMP, BITOP)                        \
    static inline T name(T a, T b)                                             \
    {                                                                          \
        if (a != a || b != b)                                                  \
            return a + b;                                                      \
        if (a == b)                                                            \
            return FROMBITS(BITS(a) BITOP BITS(b));                            \
        return a CMP b ? a : b;                                                \
    }
LR_FMINMAX(lr_maxf, float, lr_fbits, lr_bitsf, >, &)
LR_FMINMAX(lr_minf, float, lr_fbits, lr_bitsf, <, |)
LR_FMINMAX(lr_maxd, double, lr_dbits, lr_bitsd, >, &)
LR_FMINMAX(lr_mind, double, lr_dbits, lr_bitsd, <, |)

/* ------------------------------------------------- integer types */

/* X(tag, T, utag, U, D) for each integer element type: T the type, U its
 * unsigned twin (tag utag), D the type its avg divides in. */
#define LR_INT_TYPES(X)                                                        \
    X(i8, int8_t, u8, uint8_t, int)                                            \
    X(u8, uint8_t, u8, uint8_t, int)                                           \
    X(i32, int32_t, u32, uint32_t, int32_t)                                    \
    X(u32, uint32_t, u32, uint32_t, uint32_t)                                  \
    X(i64, int64_t, u64, uint64_t, int64_t)                                    \
    X(u64, uint64_t, u64, uint64_t, uint64_t)

/* ---------------------------------------------- one-element operations */

/* lr_<type>_<op>(dst, a, b) for one element; memcpy because buffers need
 * not be aligned.  T: storage type; LOAD/STORE convert to/from the compute
 * type C.  Integer sum/prod run on the unsigned type, so they wrap and
 * signed overflow is never undefined. */
#define LR_SCALAR1(tag, op, T, C, LOAD, STORE, EXPR)                           \
    static inline void lr_##tag##_##op(void *d, const void *a, const void *b)  \
    {                                                                          \
        T xs, ys, rs;                                                          \
        memcpy(&xs, a, sizeof xs);                                             \
        memcpy(&ys, b, sizeof ys);                                             \
        C x = LOAD(xs), y = LOAD(ys);                                          \
        rs = STORE(EXPR);                                                      \
        memcpy(d, &rs, sizeof rs);                                             \
    }

#define LR_IDENT(x) (x)

#define LR_SCALAR_INT(tag, T, utag, U, D)                                      \
    LR_SCALAR1(tag, sum, U, U, LR_IDENT, LR_IDENT, (U)(x + y))                 \
    LR_SCALAR1(tag, prod, U, U, LR_IDENT, LR_IDENT, (U)(x * y))                \
    LR_SCALAR1(tag, max, T, T, LR_IDENT, LR_IDENT, x > y ? x : y)              \
    LR_SCALAR1(tag, min, T, T, LR_IDENT, LR_IDENT, x < y ? x : y)

LR_INT_TYPES(LR_SCALAR_INT)

#define LR_SCALAR_FP(tag, T, C, LOAD, STORE, MAX, MIN)                         \
    LR_SCALAR1(tag, sum, T, C, LOAD, STORE, x + y)                             \
    LR_SCALAR1(tag, prod, T, C, LOAD, STORE, x * y)                            \
    LR_SCALAR1(tag, max, T, C, LOAD, STORE, MAX(x, y))                         \
    LR_SCALAR1(tag, min, T, C, LOAD, STORE, MIN(x, y))

LR_SCALAR_FP(f32, float, float, LR_IDENT, LR_IDENT, lr_maxf, lr_minf)
LR_SCALAR_FP(f64, double, double, LR_IDENT, LR_IDENT, lr_maxd, lr_mind)
LR_SCALAR_FP(f16, uint16_t, float, lr_f16_to_f32, lr_f32_to_f16, lr_maxf,
             lr_minf)
LR_SCALAR_FP(bf16, uint16_t, float, lr_bf16_to_f32, lr_f32_to_bf16, lr_maxf,
             lr_minf)

/* One element of the float avg finish: x / nranks in the compute type. */
#define LR_DIV(tag, T, D, LOAD, STORE)                                         \
    static inline void lr_##tag##_div(void *p, D dv)                           \
    {                                                                          \
        T x;                                                                   \
        memcpy(&x, p, sizeof x);                                               \
        x = STORE(LOAD(x) / dv);                                               \
        memcpy(p, &x, sizeof x);                                               \
    }
LR_DIV(f32, float, float, LR_IDENT, LR_IDENT)
LR_DIV(f64, double, double, LR_IDENT, LR_IDENT)
LR_DIV(f16, uint16_t, float, lr_f16_to_f32, lr_f32_to_f16)
LR_DIV(bf16, uint16_t, float, lr_bf16_to_f32, lr_f32_to_bf16)

#endif
