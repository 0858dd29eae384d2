/* libloom-nccl's mapping of NCCL's enums onto Loom's (nccl/map.c), the
 * values nccl.h gives them (those of NCCL 2.19), and PreMulSum's
 * element work. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "nccl/map.h"

Test(nccl_map, header_values_are_nccls)
{
    cr_assert_eq(NCCL_VERSION_CODE, 21903);
    cr_assert_eq(NCCL_VERSION(2, 8, 4), 2804); /* the old encoding up to 2.8 */
    cr_assert_eq(NCCL_UNIQUE_ID_BYTES, 128);
    cr_assert_eq(sizeof(ncclUniqueId), 128);
    cr_assert_eq(NCCL_SPLIT_NOCOLOR, -1);
    int res[] = {ncclSuccess, ncclUnhandledCudaError, ncclSystemError, ncclInternalError,
                 ncclInvalidArgument, ncclInvalidUsage, ncclRemoteError, ncclInProgress,
                 ncclNumResults};
    for (int i = 0; i < 9; i++) cr_assert_eq(res[i], i, "result %d", i);
    int dts[] = {ncclInt8, ncclUint8, ncclInt32, ncclUint32, ncclInt64, ncclUint64,
                 ncclFloat16, ncclFloat32, ncclFloat64, ncclBfloat16, ncclNumTypes};
    for (int i = 0; i < 11; i++) cr_assert_eq(dts[i], i, "datatype %d", i);
    cr_assert(ncclChar == ncclInt8 && ncclInt == ncclInt32 && ncclHalf == ncclFloat16 &&
              ncclFloat == ncclFloat32 && ncclDouble == ncclFloat64);
    int ops[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg, ncclNumOps};
    for (int i = 0; i < 6; i++) cr_assert_eq(ops[i], i, "op %d", i);
    cr_assert_eq(sizeof(ncclRedOp_t), sizeof(int));
    cr_assert_eq((long)ncclMaxRedOp, 0x7fffffffL);
    cr_assert(ncclScalarDevice == 0 && ncclScalarHostImmediate == 1);
    ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
    cr_assert_eq(c.size, sizeof(ncclConfig_t));
    cr_assert_eq(c.magic, 0xcafebeefu);
    cr_assert_eq(c.version, (unsigned)NCCL_VERSION_CODE);
    cr_assert(c.blocking == INT_MIN && c.cgaClusterSize == INT_MIN && c.minCTAs == INT_MIN &&
              c.maxCTAs == INT_MIN && c.netName == NULL && c.splitShare == INT_MIN);
    /* The layout of NCCL's: size, magic, version, then the ints. */
    cr_assert_eq(offsetof(ncclConfig_t, magic), sizeof(size_t));
    cr_assert_eq(offsetof(ncclConfig_t, blocking), sizeof(size_t) + 8);
}

Test(nccl_map, datatypes)
{
    static const struct { int nccl; loom_datatype_t loom; size_t size; } want[] = {
        {ncclInt8, LOOM_INT8, 1},         {ncclUint8, LOOM_UINT8, 1},
        {ncclInt32, LOOM_INT32, 4},       {ncclUint32, LOOM_UINT32, 4},
        {ncclInt64, LOOM_INT64, 8},       {ncclUint64, LOOM_UINT64, 8},
        {ncclFloat16, LOOM_FLOAT16, 2},   {ncclFloat32, LOOM_FLOAT32, 4},
        {ncclFloat64, LOOM_FLOAT64, 8},   {ncclBfloat16, LOOM_BFLOAT16, 2},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        loom_datatype_t l = (loom_datatype_t)-1;
        cr_assert_eq(lnccl_dtype(want[i].nccl, &l), 0, "datatype %d", want[i].nccl);
        cr_assert_eq(l, want[i].loom, "datatype %d", want[i].nccl);
        cr_assert_eq(lnccl_dtype_size(want[i].nccl), want[i].size);
    }
    /* FP8 (10, 11) came with NCCL 2.24: not a datatype of 2.19. */
    int bad[] = {-1, ncclNumTypes, 11, 255, INT32_MAX, INT32_MIN};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        loom_datatype_t l = LOOM_INT8;
        cr_assert_eq(lnccl_dtype(bad[i], &l), -1, "datatype %d", bad[i]);
        cr_assert_eq(lnccl_dtype_size(bad[i]), 0);
    }
}

Test(nccl_map, ops)
{
    static const struct { int nccl; loom_op_t loom; } want[] = {
        {ncclSum, LOOM_SUM}, {ncclProd, LOOM_PROD}, {ncclMax, LOOM_MAX},
        {ncclMin, LOOM_MIN}, {ncclAvg, LOOM_AVG},
    };
    for (size_t i = 0; i < 5; i++) {
        loom_op_t o = (loom_op_t)-1;
        cr_assert_eq(lnccl_op(want[i].nccl, &o), 0);
        cr_assert_eq(o, want[i].loom, "op %d", want[i].nccl);
    }
    /* Dynamic ops (PreMulSum) are not built in: the caller looks them up. */
    int bad[] = {-1, ncclNumOps, ncclNumOps + 1, ncclMaxRedOp};
    for (size_t i = 0; i < 4; i++) {
        loom_op_t o;
        cr_assert_eq(lnccl_op(bad[i], &o), -1, "op %d", bad[i]);
    }
}

Test(nccl_map, results)
{
    cr_assert_eq(lnccl_result(LOOM_SUCCESS), ncclSuccess);
    cr_assert_eq(lnccl_result(LOOM_ERR_SYSTEM), ncclSystemError);
    cr_assert_eq(lnccl_result(LOOM_ERR_INTERNAL), ncclInternalError);
    cr_assert_eq(lnccl_result(LOOM_ERR_INVALID_ARGUMENT), ncclInvalidArgument);
    cr_assert_eq(lnccl_result(LOOM_ERR_INVALID_USAGE), ncclInvalidUsage);
    cr_assert_eq(lnccl_result(LOOM_ERR_REMOTE), ncclRemoteError);
    cr_assert_eq(lnccl_result(LOOM_IN_PROGRESS), ncclInProgress);
    cr_assert_eq(lnccl_result(LOOM_ERR_TIMEOUT), ncclRemoteError);
    cr_assert_eq(lnccl_result(LOOM_ERR_NO_MEMORY), ncclSystemError);
    cr_assert_eq(lnccl_result(LOOM_ERR_REVOKED), ncclRemoteError);
    cr_assert_eq(lnccl_result(LOOM_ERR_UNSUPPORTED), ncclInvalidUsage);
    cr_assert_eq(lnccl_result(LOOM_ERR_MISMATCH), ncclInvalidUsage);
    cr_assert_eq(lnccl_result(LOOM_ERR_CONNECT), ncclSystemError);
    cr_assert_eq(lnccl_result((loom_result_t)999), ncclInternalError);
    /* Every result has its own text, and an unknown one a text too. */
    for (int i = 0; i < ncclNumResults; i++) {
        cr_assert_not_null(lnccl_result_string(i));
        for (int j = 0; j < i; j++)
            cr_assert_str_neq(lnccl_result_string(i), lnccl_result_string(j));
    }
    cr_assert_str_eq(ncclGetErrorString(ncclSuccess), "no error");
    cr_assert_str_eq(ncclGetErrorString((ncclResult_t)42), "unknown result code");
}

Test(nccl_map, half_and_bf16)
{
    static const float exact[] = {0.0f, 1.0f, -2.5f, 0.125f, 65504.0f, 6.103515625e-05f,
                                  5.9604644775390625e-08f /* smallest subnormal */};
    for (size_t i = 0; i < sizeof exact / sizeof exact[0]; i++)
        cr_assert_eq(lnccl_half_to_float(lnccl_float_to_half(exact[i])), exact[i], "%g", exact[i]);
    static const float bexact[] = {0.0f, 1.0f, -2.5f, 0.125f, 65536.0f, 1.5f, -3.0e38f};
    for (size_t i = 0; i < sizeof bexact / sizeof bexact[0]; i++)
        cr_assert_eq(lnccl_bf16_to_float(lnccl_float_to_bf16(bexact[i])),
                     bexact[i] == -3.0e38f ? -3.00405527e38f : bexact[i], "%g", bexact[i]);
    cr_assert_eq(lnccl_bf16_to_float(lnccl_float_to_bf16(65504.0f)), 65536.0f); /* 8 bits */
    cr_assert_eq(lnccl_float_to_half(1.0f), 0x3c00);
    cr_assert_eq(lnccl_float_to_half(65520.0f), 0x7c00);       /* rounds to infinity */
    cr_assert_eq(lnccl_float_to_half(1.0f + 1.0f / 2048), 0x3c00); /* tie to even */
    cr_assert_eq(lnccl_float_to_half(1.0f + 3.0f / 2048), 0x3c02); /* tie to even, up */
    cr_assert_eq(lnccl_float_to_bf16(1.0f), 0x3f80);
    cr_assert_eq(lnccl_float_to_bf16(1.0f + 1.0f / 256), 0x3f80); /* tie to even */
    cr_assert_eq(lnccl_float_to_bf16(1.0f + 3.0f / 256), 0x3f82);
}

Test(nccl_map, premulsum_scale)
{
    float f[4] = {1, -2, 3.5f, 0}, fs = 2.5f;
    lnccl_scale(f, f, 4, ncclFloat32, &fs); /* in place */
    cr_assert(f[0] == 2.5f && f[1] == -5 && f[2] == 8.75f && f[3] == 0);
    double d[2] = {1e300, -3}, ds = -2, dout[2];
    lnccl_scale(dout, d, 2, ncclFloat64, &ds);
    cr_assert(dout[0] == -2e300 && dout[1] == 6 && d[1] == -3);
    int32_t i32[3] = {7, -7, INT32_MAX}, is = 3;
    lnccl_scale(i32, i32, 3, ncclInt32, &is);
    cr_assert(i32[0] == 21 && i32[1] == -21 && i32[2] == (int32_t)(3u * (uint32_t)INT32_MAX));
    int8_t i8[2] = {-5, 100}, s8 = -3;
    lnccl_scale(i8, i8, 2, ncclInt8, &s8);
    cr_assert(i8[0] == 15 && i8[1] == (int8_t)(uint8_t)(-300 & 0xff));
    uint64_t u64[1] = {1ull << 62}, us = 4;
    lnccl_scale(u64, u64, 1, ncclUint64, &us); /* wraps */
    cr_assert_eq(u64[0], 0);
    unsigned short h[2] = {lnccl_float_to_half(1.5f), lnccl_float_to_half(-4)},
                   hs = lnccl_float_to_half(0.5f);
    lnccl_scale(h, h, 2, ncclFloat16, &hs);
    cr_assert(lnccl_half_to_float(h[0]) == 0.75f && lnccl_half_to_float(h[1]) == -2);
    unsigned short b[1] = {lnccl_float_to_bf16(3)}, bs = lnccl_float_to_bf16(-1.5f);
    lnccl_scale(b, b, 1, ncclBfloat16, &bs);
    cr_assert_eq(lnccl_bf16_to_float(b[0]), -4.5f);
}
