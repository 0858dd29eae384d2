/*
 * reduce_cuda.h - the reduction kernels on a CUDA device
 * (reduce_cuda.cu), launched through the driver loaded at run time
 * (core/cuda.h).  Nothing here is used by the collectives yet: device
 * buffers are refused at the door (src/comm/collectives.c); the GPU
 * suite (tests/gpu) checks the kernels against the CPU ones.
 */
#ifndef LOOMI_REDUCE_CUDA_H
#define LOOMI_REDUCE_CUDA_H

#include <stddef.h>

#include "core/cuda.h"
#include "loom.h"

/* One device: its primary context (current on the thread that opened it)
 * and the kernels' module. */
struct loomi_cuda_dev {
    int ordinal, dev;
    loomi_cuh_t ctx, mod;
    loomi_cuh_t red[LOOM_NUM_DATATYPES][4]; /* sum, prod, max, min */
    loomi_cuh_t avg[LOOM_NUM_DATATYPES];
    loomi_cuh_t redn[LOOM_NUM_DATATYPES][4]; /* many inputs (loomi_cuda_reduce_n) */
    char name[128];
    int cc_major, cc_minor;
};

/* Opens device `ordinal`: initialises the driver (cuInit), retains the
 * device's primary context and makes it current, loads the embedded
 * kernels.  LOOM_ERR_UNSUPPORTED, with the reason in the last error,
 * when this build has no kernels (configure --without-cuda), there is no
 * driver, or no such device; LOOM_ERR_SYSTEM when the driver fails. */
loom_result_t loomi_cuda_open(struct loomi_cuda_dev *d, int ordinal);
void loomi_cuda_close(struct loomi_cuda_dev *d);

/* dst[i] = dst[i] OP src[i] on the device, queued on stream (NULL: the
 * default stream); LOOM_AVG reduces as LOOM_SUM, as on the CPU. */
loom_result_t loomi_cuda_reduce(const struct loomi_cuda_dev *d, loomi_cuptr_t dst,
                                loomi_cuptr_t src, size_t count, loom_datatype_t dtype,
                                loom_op_t op, loomi_cuh_t stream);
/* dst[i] = src[0][i] OP ... OP src[nin-1][i], in that order, each step
 * as loomi_cuda_reduce's (LOOM_AVG as LOOM_SUM); 1 <= nin <=
 * LOOMI_CUDA_REDN_MAX.  dst may be one of the inputs; the inputs may be
 * peers' memory mapped through CUDA IPC. */
#define LOOMI_CUDA_REDN_MAX 8
loom_result_t loomi_cuda_reduce_n(const struct loomi_cuda_dev *d, loomi_cuptr_t dst,
                                  const loomi_cuptr_t *src, int nin, size_t count,
                                  loom_datatype_t dtype, loom_op_t op, loomi_cuh_t stream);
/* buf[i] /= nranks (LOOM_AVG's last step, as loomi_reduce_finish_avg). */
loom_result_t loomi_cuda_finish_avg(const struct loomi_cuda_dev *d, loomi_cuptr_t buf,
                                    size_t count, loom_datatype_t dtype, int nranks,
                                    loomi_cuh_t stream);

#endif
