/*
 * reduce_avx512.c - AVX-512 F/BW/VL kernels (512-bit), chosen at run time.
 * Enabled per function by a target attribute: no compiler flags needed.
 *
 * AVX512_BF16 is deliberately not used: its conversions (vcvtne2ps2bf16)
 * flush subnormal inputs and outputs to zero, and we must round them.
 */
#include "reduce_internal.h"

#if LOOMI_REDUCE_X86
/* Deliberately the same shape as reduce_avx2.c: each ISA file only sets the
 * LS_* parameters and includes the shared template reduce_simd.h. */
#include <immintrin.h>

#define LS_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx2,f16c")))
#define LS_BYTES 64
/* vcvtps2ph with imm 0 rounds to nearest even regardless of MXCSR. */
#define LS_H2F(p)                                                              \
    ((vf32)_mm512_cvtph_ps(                                                    \
        _mm256_loadu_si256((const __m256i *)(const void *)(p))))
#define LS_F2H(p, v)                                                           \
    _mm256_storeu_si256((__m256i *)(void *)(p),                                \
                        _mm512_cvtps_ph((__m512)(v), _MM_FROUND_TO_NEAREST_INT))
#define LS_FILL loomi_reduce_fill_avx512

#include "reduce_simd.h"

#else
typedef int loomi_reduce_avx512_unused; /* ISO C wants a non-empty file */
#endif
