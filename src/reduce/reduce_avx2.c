/*
 * reduce_avx2.c - AVX2 + F16C kernels (256-bit), chosen at run time.
 * Enabled per function by a target attribute: no compiler flags needed.
 */
#include "reduce_internal.h"

#if LOOMI_REDUCE_X86
/* Deliberately the same shape as reduce_avx512.c: each ISA file only sets the
 * LS_* parameters and includes the shared template reduce_simd.h. */
#include <immintrin.h>

#define LS_TARGET __attribute__((target("avx2,f16c")))
#define LS_BYTES 32
/* vcvtps2ph with imm 0 rounds to nearest even regardless of MXCSR. */
#define LS_H2F(p)                                                              \
    ((vf32)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p))))
#define LS_F2H(p, v)                                                           \
    _mm_storeu_si128((__m128i *)(void *)(p),                                   \
                     _mm256_cvtps_ph((__m256)(v), _MM_FROUND_TO_NEAREST_INT))
#define LS_FILL loomi_reduce_fill_avx2

#include "reduce_simd.h"

#else
typedef int loomi_reduce_avx2_unused; /* ISO C wants a non-empty file */
#endif
