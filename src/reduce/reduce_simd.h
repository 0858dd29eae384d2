/*
 * reduce_simd.h - SIMD kernel template, included once by each ISA file
 * (reduce_avx2.c, reduce_avx512.c, reduce_neon.c) after it defines:
 *
 *   LS_TARGET     function attribute enabling the ISA (may be empty)
 *   LS_BYTES      vector width in bytes (16, 32 or 64)
 *   LS_H2F(p)     load LS_BYTES/4 fp16 values from p as a vf32
 *   LS_F2H(p, v)  store vf32 v at p as fp16, rounded to nearest even
 *   LS_FILL       name of the table-filling function to define
 * and optionally:
 *   LS_H16_OK()   whether LS_H2F and LS_F2H give the scalar conversions'
 *                 results now (default 1); the fp16 kernels ask once per
 *                 call and run the scalar loop when they do not
 *
 * Kernels use GCC/clang vector extensions, which the compiler lowers for
 * the ISA of LS_TARGET, so no -m flags are needed.  Each kernel runs the
 * vector body over whole vectors and the scalar lr_* operation (the
 * generic path's) over the rest.  Pointers need no alignment (memcpy).
 */
#ifndef LS_TARGET
#error "define LS_TARGET, LS_BYTES, LS_H2F, LS_F2H and LS_FILL first"
#endif
#ifndef LS_H16_OK
#define LS_H16_OK() 1
#endif

typedef float vf32 __attribute__((vector_size(LS_BYTES)));
typedef double vf64 __attribute__((vector_size(LS_BYTES)));
typedef int8_t vi8 __attribute__((vector_size(LS_BYTES)));
typedef uint8_t vu8 __attribute__((vector_size(LS_BYTES)));
typedef int32_t vi32 __attribute__((vector_size(LS_BYTES)));
typedef uint32_t vu32 __attribute__((vector_size(LS_BYTES)));
typedef int64_t vi64 __attribute__((vector_size(LS_BYTES)));
typedef uint64_t vu64 __attribute__((vector_size(LS_BYTES)));

typedef unsigned char uc;

/* ------------------------------------------------------------- loops */

/* STEP handles vbytes bytes of each operand, SCALAR one element; the
 * vector loops run up to vend, which OK false makes 0 (all SCALAR). */
#define LS_LOOP(fname, esz, vbytes, OK, STEP, SCALAR)                          \
    static LS_TARGET void fname(void *dst, const void *a, const void *b,       \
                                size_t n)                                      \
    {                                                                          \
        uc *d = dst;                                                           \
        const uc *x = a, *y = b;                                               \
        const size_t nb = n * (esz), vb = (vbytes), vend = (OK) ? nb : 0;      \
        size_t i = 0;                                                          \
        for (; i + 4 * vb <= vend; i += 4 * vb) {                              \
            STEP(d + i, x + i, y + i);                                         \
            STEP(d + i + vb, x + i + vb, y + i + vb);                          \
            STEP(d + i + 2 * vb, x + i + 2 * vb, y + i + 2 * vb);              \
            STEP(d + i + 3 * vb, x + i + 3 * vb, y + i + 3 * vb);              \
        }                                                                      \
        for (; i + vb <= vend; i += vb)                                        \
            STEP(d + i, x + i, y + i);                                         \
        for (; i < nb; i += (esz))                                             \
            SCALAR(d + i, x + i, y + i);                                       \
    }

#define LS_AVG_LOOP(fname, esz, vbytes, OK, D, STEP, SCALAR)                   \
    static LS_TARGET void fname(void *buf, size_t n, int nranks)               \
    {                                                                          \
        uc *p = buf;                                                           \
        const D dv = (D)nranks;                                                \
        const size_t nb = n * (esz), vb = (vbytes), vend = (OK) ? nb : 0;      \
        size_t i = 0;                                                          \
        for (; i + 2 * vb <= vend; i += 2 * vb) {                              \
            STEP(p + i, dv);                                                   \
            STEP(p + i + vb, dv);                                              \
        }                                                                      \
        for (; i + vb <= vend; i += vb)                                        \
            STEP(p + i, dv);                                                   \
        for (; i < nb; i += (esz))                                             \
            SCALAR(p + i, dv);                                                 \
    }

/* ----------------------------------------------------------- integers */

/* One vector step: ls_<tag>_<op>(d, a, b) sets d = EXPR of x (at a) and y
 * (at b), each a V. */
#define LS_V1(tag, op, V, EXPR)                                                \
    static inline LS_TARGET void ls_##tag##_##op(uc *d, const uc *a,           \
                                                 const uc *b)                  \
    {                                                                          \
        V x, y, r;                                                             \
        memcpy(&x, a, sizeof x);                                               \
        memcpy(&y, b, sizeof y);                                               \
        r = EXPR;                                                              \
        memcpy(d, &r, sizeof r);                                               \
    }

/* x or y, lane by lane, by the mask of x CMP y. */
#define LS_SEL(V, CMP) ((x & (V)(x CMP y)) | (y & ~(V)(x CMP y)))

/* VS compares with the element's signedness; VU does the wrapping
 * arithmetic (unsigned, so signed overflow is defined). */
#define LS_INT(tag, VS, VU)                                                    \
    LS_V1(tag, sum, VU, x + y)                                                 \
    LS_V1(tag, prod, VU, x * y)                                                \
    LS_V1(tag, max, VS, LS_SEL(VS, >))                                         \
    LS_V1(tag, min, VS, LS_SEL(VS, <))

#define LS_INT_X(tag, T, utag, U, D) LS_INT(tag, v##tag, v##utag)
LR_INT_TYPES(LS_INT_X)

/* ------------------------------------------------------ float min/max */

/* Same rules as lr_maxf/lr_minf (NaN propagates; equal operands give
 * AND/OR of their bits, which orders -0 below +0), built from masks so
 * the result does not depend on how the compiler orders operands. */
#define LS_FMINMAX(name, VF, VI, CMP, EQOP)                                    \
    static inline LS_TARGET VF name(VF x, VF y)                                \
    {                                                                          \
        VI pick = (VI)(x CMP y), eq = (VI)(x == y);                            \
        VI un = (VI)((x != x) | (y != y));                                     \
        VI xi = (VI)x, yi = (VI)y, nan = (VI)(x + y);                          \
        VI r = (pick & xi) | (~pick & yi);                                     \
        r = (eq & (xi EQOP yi)) | (~eq & r);                                   \
        r = (un & nan) | (~un & r);                                            \
        return (VF)r;                                                          \
    }
LS_FMINMAX(ls_maxf, vf32, vi32, >, &)
LS_FMINMAX(ls_minf, vf32, vi32, <, |)
LS_FMINMAX(ls_maxd, vf64, vi64, >, &)
LS_FMINMAX(ls_mind, vf64, vi64, <, |)

/* ------------------------------------------------------ fp32 and fp64 */

LS_V1(f32, sum, vf32, x + y)
LS_V1(f32, prod, vf32, x * y)
LS_V1(f32, max, vf32, ls_maxf(x, y))
LS_V1(f32, min, vf32, ls_minf(x, y))
LS_V1(f64, sum, vf64, x + y)
LS_V1(f64, prod, vf64, x * y)
LS_V1(f64, max, vf64, ls_maxd(x, y))
LS_V1(f64, min, vf64, ls_mind(x, y))

/* ---------------------------------------------------------------- fp16 */

/* One step covers LS_BYTES/4 values: the fp32 vector they widen to. */
#define LS_H16(op, EXPR)                                                       \
    static inline LS_TARGET void ls_f16_##op(uc *d, const uc *a, const uc *b)  \
    {                                                                          \
        vf32 x = LS_H2F(a), y = LS_H2F(b);                                     \
        LS_F2H(d, EXPR);                                                       \
    }
LS_H16(sum, x + y)
LS_H16(prod, x * y)
LS_H16(max, ls_maxf(x, y))
LS_H16(min, ls_minf(x, y))

/* ---------------------------------------------------------------- bf16 */

/* lr_bf16_round_hi on every lane (rounded bf16 in the high halves), but
 * without its NaN test: here every input is a bf16 widened (low 16 bits
 * zero), and x86 and arm64 arithmetic return a NaN operand quieted with
 * its payload or the default NaN (0xffc00000, 0x7fc00000), so a NaN
 * result has zero low bits, the added 0x7fff(+1) cannot carry, and the
 * result is the same. */
static inline LS_TARGET vu32 ls_bf16_round_hi(vf32 v)
{
    vu32 u = (vu32)v;
    return u + 0x7fffu + ((u >> 16) & 1u);
}

/* A bf16 is the top half of an fp32, so a vector of 32-bit words holds
 * the even elements in its low halves and the odd ones in its high
 * halves: each set is widened, reduced and rounded in place, with no
 * cross-lane shuffles.  One step covers LS_BYTES/2 values. */
#define LS_B16(op, EXPR)                                                       \
    static inline LS_TARGET void ls_bf16_##op(uc *d, const uc *a,              \
                                              const uc *b)                     \
    {                                                                          \
        vu32 pa, pb, lo, hi;                                                   \
        vf32 x, y;                                                             \
        memcpy(&pa, a, sizeof pa);                                             \
        memcpy(&pb, b, sizeof pb);                                             \
        x = (vf32)(pa << 16);                                                  \
        y = (vf32)(pb << 16);                                                  \
        lo = ls_bf16_round_hi(EXPR) >> 16;                                     \
        x = (vf32)(pa & 0xffff0000u);                                          \
        y = (vf32)(pb & 0xffff0000u);                                          \
        hi = ls_bf16_round_hi(EXPR) & 0xffff0000u;                             \
        hi |= lo;                                                              \
        memcpy(d, &hi, sizeof hi);                                             \
    }
LS_B16(sum, x + y)
LS_B16(prod, x * y)
LS_B16(max, ls_maxf(x, y))
LS_B16(min, ls_minf(x, y))

/* ------------------------------------------------------------ kernels */

/* vb: bytes per step (fp16 widens, so its step covers half a vector);
 * ok: whether the vector loops may run (LS_H16_OK for fp16). */
#define LS_KERNELS(tag, esz, vb, ok)                                           \
    LS_LOOP(k_##tag##_sum, esz, vb, ok, ls_##tag##_sum, lr_##tag##_sum)        \
    LS_LOOP(k_##tag##_prod, esz, vb, ok, ls_##tag##_prod, lr_##tag##_prod)     \
    LS_LOOP(k_##tag##_max, esz, vb, ok, ls_##tag##_max, lr_##tag##_max)        \
    LS_LOOP(k_##tag##_min, esz, vb, ok, ls_##tag##_min, lr_##tag##_min)

LS_KERNELS(i8, 1, LS_BYTES, 1)
LS_KERNELS(u8, 1, LS_BYTES, 1)
LS_KERNELS(i32, 4, LS_BYTES, 1)
LS_KERNELS(u32, 4, LS_BYTES, 1)
LS_KERNELS(i64, 8, LS_BYTES, 1)
LS_KERNELS(u64, 8, LS_BYTES, 1)
LS_KERNELS(f32, 4, LS_BYTES, 1)
LS_KERNELS(f64, 8, LS_BYTES, 1)
LS_KERNELS(f16, 2, LS_BYTES / 2, LS_H16_OK())
LS_KERNELS(bf16, 2, LS_BYTES, 1)

/* ------------------------------------------------------- avg finish */

static inline LS_TARGET void ls_f32_div(uc *p, float dv)
{
    vf32 x;
    memcpy(&x, p, sizeof x);
    x = x / dv;
    memcpy(p, &x, sizeof x);
}

static inline LS_TARGET void ls_f64_div(uc *p, double dv)
{
    vf64 x;
    memcpy(&x, p, sizeof x);
    x = x / dv;
    memcpy(p, &x, sizeof x);
}

static inline LS_TARGET void ls_f16_div(uc *p, float dv)
{
    vf32 x = LS_H2F(p);
    LS_F2H(p, x / dv);
}

static inline LS_TARGET void ls_bf16_div(uc *p, float dv)
{
    vu32 w, lo, hi;
    memcpy(&w, p, sizeof w);
    lo = ls_bf16_round_hi((vf32)(w << 16) / dv) >> 16;
    hi = ls_bf16_round_hi((vf32)(w & 0xffff0000u) / dv) & 0xffff0000u;
    hi |= lo;
    memcpy(p, &hi, sizeof hi);
}

LS_AVG_LOOP(avg_f32, 4, LS_BYTES, 1, float, ls_f32_div, lr_f32_div)
LS_AVG_LOOP(avg_f64, 8, LS_BYTES, 1, double, ls_f64_div, lr_f64_div)
LS_AVG_LOOP(avg_f16, 2, LS_BYTES / 2, LS_H16_OK(), float, ls_f16_div,
            lr_f16_div)
LS_AVG_LOOP(avg_bf16, 2, LS_BYTES, 1, float, ls_bf16_div, lr_bf16_div)

/* -------------------------------------------------------------- table */

#define LS_SET(dt, tag)                                                        \
    do {                                                                       \
        t->op[dt][LR_SUM] = k_##tag##_sum;                                     \
        t->op[dt][LR_PROD] = k_##tag##_prod;                                   \
        t->op[dt][LR_MAX] = k_##tag##_max;                                     \
        t->op[dt][LR_MIN] = k_##tag##_min;                                     \
    } while (0)

void LS_FILL(struct loomi_reduce_table *t)
{
    LS_SET(LOOM_INT8, i8);
    LS_SET(LOOM_UINT8, u8);
    LS_SET(LOOM_INT32, i32);
    LS_SET(LOOM_UINT32, u32);
    LS_SET(LOOM_INT64, i64);
    LS_SET(LOOM_UINT64, u64);
    LS_SET(LOOM_FLOAT16, f16);
    LS_SET(LOOM_FLOAT32, f32);
    LS_SET(LOOM_FLOAT64, f64);
    LS_SET(LOOM_BFLOAT16, bf16);
    /* integer avg stays generic: no SIMD integer divide */
    t->avg[LOOM_FLOAT16] = avg_f16;
    t->avg[LOOM_FLOAT32] = avg_f32;
    t->avg[LOOM_FLOAT64] = avg_f64;
    t->avg[LOOM_BFLOAT16] = avg_bf16;
}
