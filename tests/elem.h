/* elem.h - element i of a buffer of any loom_datatype_t, as a double:
 * put and get, shared by tests/mp/mp_allreduce.c and
 * tests/sim/sim_exhaustive.c.  put wraps a negative value into an
 * unsigned type (through a signed integer of its width or wider);
 * fp16 and bf16 go through the library's conversions. */
#ifndef LOOM_TESTS_ELEM_H
#define LOOM_TESTS_ELEM_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "loom.h"
#include "reduce/reduce.h"

static inline void put(void *buf, size_t i, loom_datatype_t t, double v)
{
    switch (t) {
    case LOOM_INT8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case LOOM_UINT8: ((uint8_t *)buf)[i] = (uint8_t)(int)v; break;
    case LOOM_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case LOOM_UINT32: ((uint32_t *)buf)[i] = (uint32_t)(int64_t)v; break;
    case LOOM_INT64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case LOOM_UINT64: ((uint64_t *)buf)[i] = (uint64_t)(int64_t)v; break;
    case LOOM_FLOAT16: ((uint16_t *)buf)[i] = loomi_fp32_to_fp16((float)v); break;
    case LOOM_BFLOAT16: ((uint16_t *)buf)[i] = loomi_fp32_to_bf16((float)v); break;
    case LOOM_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case LOOM_FLOAT64: ((double *)buf)[i] = v; break;
    default: break;
    }
}

static inline double get(const void *buf, size_t i, loom_datatype_t t)
{
    switch (t) {
    case LOOM_INT8: return ((const int8_t *)buf)[i];
    case LOOM_UINT8: return ((const uint8_t *)buf)[i];
    case LOOM_INT32: return ((const int32_t *)buf)[i];
    case LOOM_UINT32: return ((const uint32_t *)buf)[i];
    case LOOM_INT64: return (double)((const int64_t *)buf)[i];
    case LOOM_UINT64: return (double)((const uint64_t *)buf)[i];
    case LOOM_FLOAT16: return loomi_fp16_to_fp32(((const uint16_t *)buf)[i]);
    case LOOM_BFLOAT16: return loomi_bf16_to_fp32(((const uint16_t *)buf)[i]);
    case LOOM_FLOAT32: return ((const float *)buf)[i];
    case LOOM_FLOAT64: return ((const double *)buf)[i];
    default: return NAN;
    }
}

#endif
