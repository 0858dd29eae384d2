/*
 * reduce_neon.c - Advanced SIMD (NEON) kernels (128-bit) for aarch64,
 * chosen at run time.  Built for aarch64 hosts only (configure's
 * REDUCE_NEON conditional); Advanced SIMD is in aarch64's base ISA, so
 * no target attribute is needed.
 */
#include "reduce_internal.h"

#include <arm_neon.h>

/* Half <-> single through FCVTL/FCVTN, 4 lanes.  With FPCR's defaults
 * (round to nearest even, NaN payloads kept and quieted) they give the
 * scalar lr_f16_to_f32/lr_f32_to_f16 results bit for bit; FPCR.FZ does
 * not change them (single inputs it flushes round to a zero fp16
 * anyway, and it never flushes fp16 results).  A program may change the
 * other modes (fesetround, ...), unlike x86's vcvtps2ph with imm 0,
 * which ignores MXCSR: the fp16 kernels read FPCR once per call and run
 * the scalar loop when RMode, DN, FZ16 or FEAT_AFP's AH/FIZ are set. */
#define LS_NEON_FPCR_MODES                                                     \
    ((1u << 25) | (3u << 22) | (1u << 19) | (1u << 1) | (1u << 0))

static inline int ls_neon_h16_ok(void)
{
    uint64_t fpcr;
    __asm__ volatile("mrs %0, fpcr" : "=r"(fpcr));
    return (fpcr & LS_NEON_FPCR_MODES) == 0;
}

static inline float16x4_t ls_neon_ld4h(const void *p)
{
    float16x4_t h;
    memcpy(&h, p, sizeof h);
    return h;
}

static inline void ls_neon_st4h(void *p, float16x4_t h)
{
    memcpy(p, &h, sizeof h);
}

#define LS_TARGET
#define LS_BYTES 16
#define LS_H2F(p) ((vf32)vcvt_f32_f16(ls_neon_ld4h(p)))
#define LS_F2H(p, v) ls_neon_st4h((p), vcvt_f16_f32((float32x4_t)(v)))
#define LS_H16_OK() ls_neon_h16_ok()
#define LS_FILL loomi_reduce_fill_neon

#include "reduce_simd.h"
