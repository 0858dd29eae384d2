/*
 * map.h - how NCCL's enums meet Loom's (libloom-nccl's own, not
 * exported): datatypes, built-in ops, results, and the element work of
 * PreMulSum.  Tested by tests/unit/test_nccl_map.c.
 */
#ifndef LOOM_NCCL_MAP_H
#define LOOM_NCCL_MAP_H

#include <stddef.h>

#include "loom.h"
#include "nccl/nccl.h"

/* The Loom datatype of dt; 0 and *out set, or -1 for no ncclDataType_t. */
int lnccl_dtype(int dt, loom_datatype_t *out);
/* Bytes of one element of dt, 0 for no ncclDataType_t. */
size_t lnccl_dtype_size(int dt);
/* The Loom op of a built-in op (ncclSum..ncclAvg); -1 otherwise. */
int lnccl_op(int op, loom_op_t *out);
/* The NCCL result that tells an NCCL user what a Loom result means. */
ncclResult_t lnccl_result(loom_result_t r);
/* Static text of an NCCL result; never NULL. */
const char *lnccl_result_string(int r);
/* dst[i] = scalar * src[i] for count elements of dt, the scalar an
 * element of dt too (fp16/bf16 multiplied in fp32, rounded to nearest
 * even; integers wrap).  dst and src may be equal. */
void lnccl_scale(void *dst, const void *src, size_t count, int dt,
                 const void *scalar);
/* fp16 / bf16 conversions (round to nearest even). */
float lnccl_half_to_float(unsigned short h);
unsigned short lnccl_float_to_half(float f);
float lnccl_bf16_to_float(unsigned short b);
unsigned short lnccl_float_to_bf16(float f);

#endif
