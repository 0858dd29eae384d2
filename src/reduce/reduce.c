/*
 * reduce.c - reduction entry points, run-time kernel selection, the
 * portable (generic) kernels and the scalar fp16/bf16 conversions.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "reduce_internal.h"

#if LOOMI_REDUCE_X86
#include <cpuid.h>
#endif
#if LOOMI_REDUCE_NEON
#include <sys/auxv.h>
#endif

/* ------------------------------------------------------ generic kernels */

#define LR_GENERIC(tag, op, esz)                                               \
    static void gen_##tag##_##op(void *dst, const void *a, const void *b,     \
                                 size_t n)                                     \
    {                                                                          \
        unsigned char *d = dst;                                                \
        const unsigned char *x = a, *y = b;                                    \
        for (size_t i = 0; i < n; i++)                                         \
            lr_##tag##_##op(d + i * (esz), x + i * (esz), y + i * (esz));      \
    }
#define LR_GENERIC4(tag, esz)                                                  \
    LR_GENERIC(tag, sum, esz)                                                  \
    LR_GENERIC(tag, prod, esz)                                                 \
    LR_GENERIC(tag, max, esz)                                                  \
    LR_GENERIC(tag, min, esz)

LR_GENERIC4(i8, 1)
LR_GENERIC4(u8, 1)
LR_GENERIC4(i32, 4)
LR_GENERIC4(u32, 4)
LR_GENERIC4(i64, 8)
LR_GENERIC4(u64, 8)
LR_GENERIC4(f16, 2)
LR_GENERIC4(bf16, 2)
LR_GENERIC4(f32, 4)
LR_GENERIC4(f64, 8)

/* Integer avg: C division (truncates toward zero); nranks >= 2, so
 * INT_MIN / -1 cannot happen.  Not vectorised: x86 has no SIMD divide
 * for integers and integer avg is rare. */
#define LR_GENERIC_IAVG(tag, T, utag, U, D)                                    \
    static void gen_##tag##_avg(void *buf, size_t n, int nranks)               \
    {                                                                          \
        unsigned char *p = buf;                                                \
        D dv = (D)nranks;                                                      \
        for (size_t i = 0; i < n; i++) {                                       \
            T x;                                                               \
            memcpy(&x, p + i * sizeof x, sizeof x);                            \
            x = (T)(x / dv);                                                   \
            memcpy(p + i * sizeof x, &x, sizeof x);                            \
        }                                                                      \
    }
LR_INT_TYPES(LR_GENERIC_IAVG)

/* Float avg: divide (not multiply by a reciprocal, which rounds twice). */
#define LR_GENERIC_FAVG(tag, esz, D)                                           \
    static void gen_##tag##_avg(void *buf, size_t n, int nranks)               \
    {                                                                          \
        unsigned char *p = buf;                                                \
        D dv = (D)nranks;                                                      \
        for (size_t i = 0; i < n; i++)                                         \
            lr_##tag##_div(p + i * (esz), dv);                                 \
    }
LR_GENERIC_FAVG(f16, 2, float)
LR_GENERIC_FAVG(bf16, 2, float)
LR_GENERIC_FAVG(f32, 4, float)
LR_GENERIC_FAVG(f64, 8, double)

#define LR_ROW(tag)                                                            \
    {                                                                          \
        gen_##tag##_sum, gen_##tag##_prod, gen_##tag##_max, gen_##tag##_min    \
    }

static const struct loomi_reduce_table generic_table = {
    "generic",
    {
        [LOOM_INT8] = LR_ROW(i8),
        [LOOM_UINT8] = LR_ROW(u8),
        [LOOM_INT32] = LR_ROW(i32),
        [LOOM_UINT32] = LR_ROW(u32),
        [LOOM_INT64] = LR_ROW(i64),
        [LOOM_UINT64] = LR_ROW(u64),
        [LOOM_FLOAT16] = LR_ROW(f16),
        [LOOM_FLOAT32] = LR_ROW(f32),
        [LOOM_FLOAT64] = LR_ROW(f64),
        [LOOM_BFLOAT16] = LR_ROW(bf16),
    },
    {
        [LOOM_INT8] = gen_i8_avg,
        [LOOM_UINT8] = gen_u8_avg,
        [LOOM_INT32] = gen_i32_avg,
        [LOOM_UINT32] = gen_u32_avg,
        [LOOM_INT64] = gen_i64_avg,
        [LOOM_UINT64] = gen_u64_avg,
        [LOOM_FLOAT16] = gen_f16_avg,
        [LOOM_FLOAT32] = gen_f32_avg,
        [LOOM_FLOAT64] = gen_f64_avg,
        [LOOM_BFLOAT16] = gen_bf16_avg,
    },
};

/* ------------------------------------------------------------ dispatch */

enum { ISA_GENERIC, ISA_AVX2, ISA_AVX512, ISA_NEON, ISA_COUNT };

static const char *const isa_names[ISA_COUNT] = {"generic", "avx2", "avx512",
                                                 "neon"};

/* Where the CPU lacks an ISA, the next one down its architecture's chain
 * (avx512, avx2, generic; neon, generic). */
static const int isa_lower[ISA_COUNT] = {
    [ISA_AVX2] = ISA_GENERIC, [ISA_AVX512] = ISA_AVX2, [ISA_NEON] = ISA_GENERIC};
/* The sets this architecture has; LOOM_REDUCE_ISA naming another's is
 * ignored like an unknown name (a job may set it for mixed hosts). */
static const int isa_built[ISA_COUNT] = {1, LOOMI_REDUCE_X86, LOOMI_REDUCE_X86,
                                         LOOMI_REDUCE_NEON};

/* Filled once, read-only afterwards; `active` may be switched by tests. */
static struct loomi_reduce_table tables[ISA_COUNT];
static int isa_ok[ISA_COUNT];
static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static _Atomic(const struct loomi_reduce_table *) active;

static int isa_index(const char *name)
{
    for (int i = 0; i < ISA_COUNT; i++)
        if (strcmp(name, isa_names[i]) == 0)
            return i;
    return -1;
}

static void detect_isas(void)
{
#if LOOMI_REDUCE_X86
    unsigned int eax, ebx, ecx, edx;
    int f16c = 0;
    __builtin_cpu_init();
    /* clang has no "f16c" for __builtin_cpu_supports: ask CPUID. */
    if (__get_cpuid(1, &eax, &ebx, &ecx, &edx))
        f16c = (ecx & bit_F16C) != 0;
    /* __builtin_cpu_supports also checks that the OS saves the registers. */
    isa_ok[ISA_AVX2] = __builtin_cpu_supports("avx2") && f16c;
    isa_ok[ISA_AVX512] = isa_ok[ISA_AVX2] &&
                         __builtin_cpu_supports("avx512f") &&
                         __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vl");
#endif
#if LOOMI_REDUCE_NEON
    /* Advanced SIMD is in aarch64's base ISA; ask the kernel anyway. */
    isa_ok[ISA_NEON] = (getauxval(AT_HWCAP) & HWCAP_ASIMD) != 0;
#endif
}

static void init_tables(void)
{
    isa_ok[ISA_GENERIC] = 1;
    detect_isas();
    for (int i = 0; i < ISA_COUNT; i++) {
        tables[i] = generic_table;
        tables[i].name = isa_names[i];
    }
#if LOOMI_REDUCE_X86
    if (isa_ok[ISA_AVX2])
        loomi_reduce_fill_avx2(&tables[ISA_AVX2]);
    if (isa_ok[ISA_AVX512])
        loomi_reduce_fill_avx512(&tables[ISA_AVX512]);
#endif
#if LOOMI_REDUCE_NEON
    if (isa_ok[ISA_NEON])
        loomi_reduce_fill_neon(&tables[ISA_NEON]);
#endif
    /* 256-bit kernels unless asked for more: the 512-bit ones were no
     * faster on the Xeon measured (2 ranks, float32 and bfloat16 sums of
     * 1K-4M), and slower where ranks take turns on the cores (2 x 2
     * ranks on 2 cores, recursive-doubling allreduce); see perf/NOTES.md,
     * "reduce.c, 512-bit kernels".  On aarch64 the NEON ones, not timed
     * on arm64 hardware yet: perf/NOTES.md, "reduce.c, NEON kernels". */
    int best = LOOMI_REDUCE_NEON ? ISA_NEON : ISA_AVX2;
    const char *env = getenv("LOOM_REDUCE_ISA");
    if (env && *env) {
        int want = isa_index(env);
        if (want >= 0 && isa_built[want]) /* an unknown name is ignored */
            best = want;
    }
    while (!isa_ok[best]) /* never above what the CPU runs */
        best = isa_lower[best];
    atomic_store(&active, &tables[best]);
}

static const struct loomi_reduce_table *table(void)
{
    const struct loomi_reduce_table *t =
        atomic_load_explicit(&active, memory_order_acquire);
    if (t)
        return t;
    pthread_once(&init_once, init_tables);
    return atomic_load_explicit(&active, memory_order_acquire);
}

int loomi_reduce_cpu_avx512(void)
{
    pthread_once(&init_once, init_tables);
    return isa_ok[ISA_AVX512];
}

const char *loomi_reduce_isa(void)
{
    return table()->name;
}

int loomi_reduce_set_isa(const char *name)
{
    pthread_once(&init_once, init_tables);
    int i = name ? isa_index(name) : -1;
    if (i < 0 || !isa_ok[i])
        return -1;
    atomic_store(&active, &tables[i]);
    return 0;
}

/* ---------------------------------------------------------- entry points */

static loomi_reduce_fn lookup(loom_datatype_t dtype, loom_op_t op)
{
    /* Callers validate arguments; a bad one here is a no-op, not a crash. */
    if ((unsigned)dtype >= LOOM_NUM_DATATYPES || (unsigned)op >= LOOM_NUM_OPS)
        return NULL;
    return table()->op[dtype][op == LOOM_AVG ? LR_SUM : (int)op];
}

void loomi_reduce_inplace(void *dst, const void *src, size_t count,
                          loom_datatype_t dtype, loom_op_t op)
{
    loomi_reduce_fn fn = lookup(dtype, op);
    if (fn && count)
        fn(dst, dst, src, count);
}

void loomi_reduce_out(void *dst, const void *a, const void *b, size_t count,
                      loom_datatype_t dtype, loom_op_t op)
{
    loomi_reduce_fn fn = lookup(dtype, op);
    if (fn && count)
        fn(dst, a, b, count);
}

void loomi_reduce_finish_avg(void *buf, size_t count, loom_datatype_t dtype,
                             int nranks)
{
    /* nranks == 1 is the identity; nranks < 1 is meaningless: no-op. */
    if ((unsigned)dtype >= LOOM_NUM_DATATYPES || nranks < 2 || !count)
        return;
    table()->avg[dtype](buf, count, nranks);
}

/* ---------------------------------------------------------- conversions */

uint16_t loomi_fp32_to_fp16(float f)
{
    return lr_f32_to_f16(f);
}

float loomi_fp16_to_fp32(uint16_t h)
{
    return lr_f16_to_f32(h);
}

uint16_t loomi_fp32_to_bf16(float f)
{
    return lr_f32_to_bf16(f);
}

float loomi_bf16_to_fp32(uint16_t b)
{
    return lr_bf16_to_f32(b);
}
