/*
 * reduce_cuda.cu - the reduction kernels for CUDA devices, one per
 * datatype x op: dst[i] = dst[i] OP src[i], with the CPU kernels'
 * semantics (reduce.h): integers wrap, float max/min propagate NaN and
 * order -0 below +0, fp16 and bf16 are reduced in fp32 and rounded back
 * to nearest-even after every operation; and the last step of LOOM_AVG,
 * buf[i] /= nranks.
 *
 * Built by nvcc into a fatbin (sm_80, sm_90 and PTX for compute_90;
 * Makefile.am) that is embedded in libloom as a byte array and loaded at
 * run time through CUDA's driver API (src/reduce/reduce_cuda.c): no
 * host code is compiled here, and libloom links no CUDA library.
 * Kernel names are extern "C": loom_red_<type>_<op>, loom_avg_<type>.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

template <typename T> struct U;
template <> struct U<int8_t> { typedef uint8_t t; };
template <> struct U<uint8_t> { typedef uint8_t t; };
template <> struct U<int32_t> { typedef uint32_t t; };
template <> struct U<uint32_t> { typedef uint32_t t; };
template <> struct U<int64_t> { typedef uint64_t t; };
template <> struct U<uint64_t> { typedef uint64_t t; };

/* Integers, in their unsigned type so that overflow wraps. */
template <typename T> struct IntOps {
    typedef typename U<T>::t UT;
    static __device__ T sum(T a, T b) { return (T)(UT)((UT)a + (UT)b); }
    static __device__ T prod(T a, T b) { return (T)(UT)((UT)a * (UT)b); }
    static __device__ T max(T a, T b) { return a > b ? a : b; }
    static __device__ T min(T a, T b) { return a < b ? a : b; }
};

__device__ static inline float maxf(float a, float b)
{
    if (a != a || b != b) return a + b;
    if (a == b) return __int_as_float(__float_as_int(a) & __float_as_int(b));
    return a > b ? a : b;
}
__device__ static inline float minf(float a, float b)
{
    if (a != a || b != b) return a + b;
    if (a == b) return __int_as_float(__float_as_int(a) | __float_as_int(b));
    return a < b ? a : b;
}
__device__ static inline double maxd(double a, double b)
{
    if (a != a || b != b) return a + b;
    if (a == b)
        return __longlong_as_double(__double_as_longlong(a) & __double_as_longlong(b));
    return a > b ? a : b;
}
__device__ static inline double mind(double a, double b)
{
    if (a != a || b != b) return a + b;
    if (a == b)
        return __longlong_as_double(__double_as_longlong(a) | __double_as_longlong(b));
    return a < b ? a : b;
}

/* Operations on an accumulator type C (fp32 for fp16/bf16); __fadd_rn and
 * friends keep the compiler from contracting anything. */
struct F32 {
    static __device__ float sum(float a, float b) { return __fadd_rn(a, b); }
    static __device__ float prod(float a, float b) { return __fmul_rn(a, b); }
    static __device__ float max(float a, float b) { return maxf(a, b); }
    static __device__ float min(float a, float b) { return minf(a, b); }
};
struct F64 {
    static __device__ double sum(double a, double b) { return __dadd_rn(a, b); }
    static __device__ double prod(double a, double b) { return __dmul_rn(a, b); }
    static __device__ double max(double a, double b) { return maxd(a, b); }
    static __device__ double min(double a, double b) { return mind(a, b); }
};

/* Loads and stores between the stored type T and the accumulator type. */
__device__ static inline float ld(__half x) { return __half2float(x); }
__device__ static inline float ld(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ static inline void st(__half *p, float v) { *p = __float2half_rn(v); }
__device__ static inline void st(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }

#define GRID_LOOP(i, n)                                                                  \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n);              \
         i += (size_t)blockDim.x * gridDim.x)

#define INT_KERNELS(tag, T)                                                              \
    extern "C" __global__ void loom_red_##tag##_sum(T *d, const T *s, size_t n)          \
    { GRID_LOOP(i, n) d[i] = IntOps<T>::sum(d[i], s[i]); }                               \
    extern "C" __global__ void loom_red_##tag##_prod(T *d, const T *s, size_t n)         \
    { GRID_LOOP(i, n) d[i] = IntOps<T>::prod(d[i], s[i]); }                              \
    extern "C" __global__ void loom_red_##tag##_max(T *d, const T *s, size_t n)          \
    { GRID_LOOP(i, n) d[i] = IntOps<T>::max(d[i], s[i]); }                               \
    extern "C" __global__ void loom_red_##tag##_min(T *d, const T *s, size_t n)          \
    { GRID_LOOP(i, n) d[i] = IntOps<T>::min(d[i], s[i]); }
INT_KERNELS(i8, int8_t)
INT_KERNELS(u8, uint8_t)
INT_KERNELS(i32, int32_t)
INT_KERNELS(u32, uint32_t)
INT_KERNELS(i64, int64_t)
INT_KERNELS(u64, uint64_t)

/* Integer avg: C division, truncating toward zero. */
#define INT_AVG(tag, T, W)                                                               \
    extern "C" __global__ void loom_avg_##tag(T *b, size_t n, int nranks)               \
    { GRID_LOOP(i, n) b[i] = (T)((W)b[i] / (W)nranks); }
INT_AVG(i8, int8_t, long long)
INT_AVG(u8, uint8_t, long long)
INT_AVG(i32, int32_t, long long)
INT_AVG(u32, uint32_t, long long)
INT_AVG(i64, int64_t, long long)
INT_AVG(u64, uint64_t, unsigned long long)

#define WIDE_KERNELS(tag, T, OPS)                                                        \
    extern "C" __global__ void loom_red_##tag##_sum(T *d, const T *s, size_t n)          \
    { GRID_LOOP(i, n) d[i] = OPS::sum(d[i], s[i]); }                                     \
    extern "C" __global__ void loom_red_##tag##_prod(T *d, const T *s, size_t n)         \
    { GRID_LOOP(i, n) d[i] = OPS::prod(d[i], s[i]); }                                    \
    extern "C" __global__ void loom_red_##tag##_max(T *d, const T *s, size_t n)          \
    { GRID_LOOP(i, n) d[i] = OPS::max(d[i], s[i]); }                                     \
    extern "C" __global__ void loom_red_##tag##_min(T *d, const T *s, size_t n)          \
    { GRID_LOOP(i, n) d[i] = OPS::min(d[i], s[i]); }
WIDE_KERNELS(f32, float, F32)
WIDE_KERNELS(f64, double, F64)
extern "C" __global__ void loom_avg_f32(float *b, size_t n, int nranks)
{ GRID_LOOP(i, n) b[i] = __fdiv_rn(b[i], (float)nranks); }
extern "C" __global__ void loom_avg_f64(double *b, size_t n, int nranks)
{ GRID_LOOP(i, n) b[i] = __ddiv_rn(b[i], (double)nranks); }

/* fp16 and bf16: in fp32, rounded back after each operation. */
#define HALF_KERNELS(tag, T)                                                             \
    extern "C" __global__ void loom_red_##tag##_sum(T *d, const T *s, size_t n)          \
    { GRID_LOOP(i, n) st(&d[i], F32::sum(ld(d[i]), ld(s[i]))); }                         \
    extern "C" __global__ void loom_red_##tag##_prod(T *d, const T *s, size_t n)         \
    { GRID_LOOP(i, n) st(&d[i], F32::prod(ld(d[i]), ld(s[i]))); }                        \
    extern "C" __global__ void loom_red_##tag##_max(T *d, const T *s, size_t n)          \
    { GRID_LOOP(i, n) st(&d[i], F32::max(ld(d[i]), ld(s[i]))); }                         \
    extern "C" __global__ void loom_red_##tag##_min(T *d, const T *s, size_t n)          \
    { GRID_LOOP(i, n) st(&d[i], F32::min(ld(d[i]), ld(s[i]))); }                         \
    extern "C" __global__ void loom_avg_##tag(T *b, size_t n, int nranks)               \
    { GRID_LOOP(i, n) st(&b[i], __fdiv_rn(ld(b[i]), (float)nranks)); }
HALF_KERNELS(f16, __half)
HALF_KERNELS(bf16, __nv_bfloat16)

/* Many inputs at once, for the device-direct collectives
 * (src/comm/devpeer.c): d[i] = s[0][i] OP s[1][i] OP ... OP s[nin-1][i],
 * in input order, each step with the two-input kernels' semantics (fp16
 * and bf16 in fp32, rounded back after every operation, as on the CPU).
 * Every input is read before d[i] is written, so d may be one of them
 * (in place).  The inputs may be peers' buffers mapped through CUDA IPC.
 * Kernel names: loom_redn_<type>_<op>. */
#define LOOM_REDN_MAX 8
struct RednSrcs {
    const void *p[LOOM_REDN_MAX];
};

template <typename T, typename Op> struct Direct {
    static __device__ T run(const RednSrcs &s, int nin, size_t i)
    {
        T acc = ((const T *)s.p[0])[i];
        for (int k = 1; k < nin; k++) acc = Op::f(acc, ((const T *)s.p[k])[i]);
        return acc;
    }
};
/* fp16 / bf16: the running value is stored type T between steps. */
template <typename T, typename Op> struct Half {
    static __device__ T run(const RednSrcs &s, int nin, size_t i)
    {
        T acc = ((const T *)s.p[0])[i];
        for (int k = 1; k < nin; k++) st(&acc, Op::f(ld(acc), ld(((const T *)s.p[k])[i])));
        return acc;
    }
};

#define OPFN(name, OPS, T, fn)                                                           \
    struct name {                                                                        \
        static __device__ T f(T a, T b) { return OPS::fn(a, b); }                        \
    };

#define REDN_ONE(tag, T, OPT, OPS, op, How)                                              \
    OPFN(Op_##tag##_##op, OPS, OPT, op)                                                  \
    extern "C" __global__ void loom_redn_##tag##_##op(T *d, RednSrcs s, int nin, size_t n) \
    { GRID_LOOP(i, n) d[i] = How<T, Op_##tag##_##op>::run(s, nin, i); }

#define REDN_ALL(tag, T, OPT, OPS, How)                                                  \
    REDN_ONE(tag, T, OPT, OPS, sum, How)                                                 \
    REDN_ONE(tag, T, OPT, OPS, prod, How)                                                \
    REDN_ONE(tag, T, OPT, OPS, max, How)                                                 \
    REDN_ONE(tag, T, OPT, OPS, min, How)

REDN_ALL(i8, int8_t, int8_t, IntOps<int8_t>, Direct)
REDN_ALL(u8, uint8_t, uint8_t, IntOps<uint8_t>, Direct)
REDN_ALL(i32, int32_t, int32_t, IntOps<int32_t>, Direct)
REDN_ALL(u32, uint32_t, uint32_t, IntOps<uint32_t>, Direct)
REDN_ALL(i64, int64_t, int64_t, IntOps<int64_t>, Direct)
REDN_ALL(u64, uint64_t, uint64_t, IntOps<uint64_t>, Direct)
REDN_ALL(f32, float, float, F32, Direct)
REDN_ALL(f64, double, double, F64, Direct)
REDN_ALL(f16, __half, float, F32, Half)
REDN_ALL(bf16, __nv_bfloat16, float, F32, Half)
