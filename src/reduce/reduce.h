/*
 * reduce.h - element-wise reduction kernels for every datatype x op.
 *
 * Kernels are chosen at run time for the CPU (AVX-512 / AVX2+F16C / plain C).
 * fp16 and bf16 are reduced in fp32 and rounded back to nearest-even after
 * every operation, so results are the same on every code path.
 */
#ifndef LOOMI_REDUCE_H
#define LOOMI_REDUCE_H

#include <stddef.h>
#include <stdint.h>

#include "loom.h"

/* dst[i] = dst[i] OP src[i] for i < count.  LOOM_AVG reduces as LOOM_SUM
 * (the division happens once, in loomi_reduce_finish_avg).  dst and src
 * may be the same pointer, but must not overlap otherwise.
 * Integers wrap on overflow.  Float LOOM_MAX/LOOM_MIN return NaN if either
 * operand is NaN (unlike fmax or NCCL, which drop it), and order -0 below
 * +0.  NaN results are quiet; with two NaN operands which payload wins is
 * unspecified.  Buffers need no alignment. */
void loomi_reduce_inplace(void *dst, const void *src, size_t count,
                          loom_datatype_t dtype, loom_op_t op);

/* dst[i] = a[i] OP b[i]; dst may equal a or b. */
void loomi_reduce_out(void *dst, const void *a, const void *b, size_t count,
                      loom_datatype_t dtype, loom_op_t op);

/* The last step of LOOM_AVG: buf[i] = buf[i] / nranks (integers truncate
 * toward zero as C division does; fp16/bf16 computed in fp32 and rounded). */
void loomi_reduce_finish_avg(void *buf, size_t count, loom_datatype_t dtype,
                             int nranks);

/* Scalar conversions with round-to-nearest-even; NaN stays NaN (quiet),
 * infinities and signed zeros are kept, overflow gives infinity. */
uint16_t loomi_fp32_to_fp16(float f);
float loomi_fp16_to_fp32(uint16_t h);
uint16_t loomi_fp32_to_bf16(float f);
float loomi_bf16_to_fp32(uint16_t b);

/* Name of the kernel set in use ("avx512", "avx2", "neon", "generic"),
 * for logs and loom-info: avx2 where the CPU runs it, neon on aarch64, or
 * what LOOM_REDUCE_ISA=generic|avx2|avx512|neon asks for, never above what
 * the CPU runs (a set of another architecture is ignored). */
const char *loomi_reduce_isa(void);

/* Whether this CPU runs the AVX-512 kernel set (and the OS saves its
 * registers), whatever LOOM_REDUCE_ISA chose: the engine's streamed
 * copies use 64-byte stores where it does. */
int loomi_reduce_cpu_avx512(void);

/* Test hook: switch every later call to the kernel set `name` ("generic",
 * "avx2", "avx512", "neon").  Returns 0, or -1 (nothing changed) when the name is
 * unknown or this CPU cannot run it. */
int loomi_reduce_set_isa(const char *name);

#endif
