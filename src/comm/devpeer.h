/*
 * devpeer.h - collectives on CUDA device buffers without staging
 * (devpeer.c): when every rank of a communicator is on one host and
 * passes device memory, the ranks map each other's buffers through CUDA
 * IPC (transports/cuda/cuipc.h), reduce on the device and copy device to
 * device.  Elsewhere the call is staged through host memory (devbuf.h).
 */
#ifndef LOOMI_DEVPEER_H
#define LOOMI_DEVPEER_H

#include <stddef.h>

#include "loom.h"

struct loom_comm;

/* A blocking allreduce of count elements, sendbuf and recvbuf device
 * memory (the same pointer: in place), ordered after the work queued on
 * stream.  *taken: 0 where the call is not for this path, or every rank
 * found it cannot be taken (then nothing was done and the caller
 * stages); 1 where the path ran, with its result returned.  Every rank
 * takes the same decision. */
loom_result_t loomi_devpeer_allreduce(struct loom_comm *comm, const char *fn,
                                      const void *sendbuf, void *recvbuf, size_t count,
                                      loom_datatype_t dtype, loom_op_t op, void *stream,
                                      int *taken);
/* The communicator goes: its peers' mappings closed, its device let go. */
void loomi_devpeer_free(struct loom_comm *comm);

#endif
