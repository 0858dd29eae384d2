/*
 * map.c - NCCL's enums onto Loom's, and PreMulSum's scaling.
 */
#include "nccl/map.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

int lnccl_dtype(int dt, loom_datatype_t *out)
{
    switch (dt) {
    case ncclInt8: *out = LOOM_INT8; return 0;
    case ncclUint8: *out = LOOM_UINT8; return 0;
    case ncclInt32: *out = LOOM_INT32; return 0;
    case ncclUint32: *out = LOOM_UINT32; return 0;
    case ncclInt64: *out = LOOM_INT64; return 0;
    case ncclUint64: *out = LOOM_UINT64; return 0;
    case ncclFloat16: *out = LOOM_FLOAT16; return 0;
    case ncclFloat32: *out = LOOM_FLOAT32; return 0;
    case ncclFloat64: *out = LOOM_FLOAT64; return 0;
    case ncclBfloat16: *out = LOOM_BFLOAT16; return 0;
    default: return -1;
    }
}

size_t lnccl_dtype_size(int dt)
{
    loom_datatype_t l;
    return lnccl_dtype(dt, &l) == 0 ? loom_datatype_size(l) : 0;
}

int lnccl_op(int op, loom_op_t *out)
{
    switch (op) {
    case ncclSum: *out = LOOM_SUM; return 0;
    case ncclProd: *out = LOOM_PROD; return 0;
    case ncclMax: *out = LOOM_MAX; return 0;
    case ncclMin: *out = LOOM_MIN; return 0;
    case ncclAvg: *out = LOOM_AVG; return 0;
    default: return -1;
    }
}

ncclResult_t lnccl_result(loom_result_t r)
{
    switch (r) {
    case LOOM_SUCCESS: return ncclSuccess;
    case LOOM_ERR_SYSTEM: return ncclSystemError;
    case LOOM_ERR_INTERNAL: return ncclInternalError;
    case LOOM_ERR_INVALID_ARGUMENT: return ncclInvalidArgument;
    case LOOM_ERR_INVALID_USAGE: return ncclInvalidUsage;
    case LOOM_ERR_REMOTE: return ncclRemoteError;
    case LOOM_IN_PROGRESS: return ncclInProgress;
    /* NCCL 2.19 has no ncclTimeout: a deadline passes when a peer stops
     * answering, which NCCL calls a remote error. */
    case LOOM_ERR_TIMEOUT: return ncclRemoteError;
    case LOOM_ERR_NO_MEMORY: return ncclSystemError;
    /* Revoked: a peer failed (or the job was aborted elsewhere). */
    case LOOM_ERR_REVOKED: return ncclRemoteError;
    case LOOM_ERR_UNSUPPORTED: return ncclInvalidUsage;
    /* Ranks made different calls: the program's mistake. */
    case LOOM_ERR_MISMATCH: return ncclInvalidUsage;
    case LOOM_ERR_CONNECT: return ncclSystemError;
    }
    return ncclInternalError;
}

const char *lnccl_result_string(int r)
{
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

float lnccl_half_to_float(unsigned short h)
{
    unsigned sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    float v;
    if (exp == 0)
        v = ldexpf((float)man, -24);
    else if (exp == 31)
        v = man ? NAN : INFINITY;
    else
        v = ldexpf((float)(man | 0x400), (int)exp - 25);
    return sign ? -v : v;
}

unsigned short lnccl_float_to_half(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t ax = x & 0x7fffffff;
    if (ax > 0x7f800000) return (unsigned short)(sign | 0x7e00); /* NaN */
    if (ax >= 0x477ff000) return (unsigned short)(sign | 0x7c00); /* overflow */
    if (ax < 0x38800000) { /* subnormal or zero: round at 2^-24 */
        float a;
        memcpy(&a, &ax, 4);
        float q = a * 16777216.0f; /* in units of 2^-24 */
        float r = nearbyintf(q);   /* current mode: nearest even */
        return (unsigned short)(sign | (uint32_t)r);
    }
    uint32_t e = (ax >> 23) - 112, m = ax & 0x7fffff;
    uint32_t h = (e << 10) | (m >> 13);
    uint32_t rest = m & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;
    return (unsigned short)(sign | h);
}

float lnccl_bf16_to_float(unsigned short b)
{
    uint32_t x = (uint32_t)b << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

unsigned short lnccl_float_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffff) > 0x7f800000) return (unsigned short)((x >> 16) | 0x40);
    x += 0x7fff + ((x >> 16) & 1);
    return (unsigned short)(x >> 16);
}

#define SCALE_T(T)                                                           \
    do {                                                                       \
        T s, v;                                                                \
        memcpy(&s, scalar, sizeof s);                                          \
        for (size_t i = 0; i < count; i++) {                                   \
            memcpy(&v, (const char *)src + i * sizeof v, sizeof v);            \
            v = (T)(s * v);                                                    \
            memcpy((char *)dst + i * sizeof v, &v, sizeof v);                  \
        }                                                                      \
    } while (0)

void lnccl_scale(void *dst, const void *src, size_t count, int dt,
                 const void *scalar)
{
    switch (dt) {
    /* Integers in unsigned arithmetic: they wrap, never overflow. */
    case ncclInt8:
    case ncclUint8: {
        uint8_t s;
        memcpy(&s, scalar, 1);
        for (size_t i = 0; i < count; i++)
            ((uint8_t *)dst)[i] = (uint8_t)(s * ((const uint8_t *)src)[i]);
        break;
    }
    case ncclInt32: case ncclUint32: SCALE_T(uint32_t); break;
    case ncclInt64: case ncclUint64: SCALE_T(uint64_t); break;
    case ncclFloat32: SCALE_T(float); break;
    case ncclFloat64: SCALE_T(double); break;
    case ncclFloat16: case ncclBfloat16: {
        int half = dt == ncclFloat16;
        unsigned short s, v;
        memcpy(&s, scalar, 2);
        float fs = half ? lnccl_half_to_float(s) : lnccl_bf16_to_float(s);
        for (size_t i = 0; i < count; i++) {
            memcpy(&v, (const char *)src + 2 * i, 2);
            float p = fs * (half ? lnccl_half_to_float(v) : lnccl_bf16_to_float(v));
            v = half ? lnccl_float_to_half(p) : lnccl_float_to_bf16(p);
            memcpy((char *)dst + 2 * i, &v, 2);
        }
        break;
    }
    default: break;
    }
}
