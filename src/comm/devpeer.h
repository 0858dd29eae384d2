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

/* A blocking allreduce, reduce_scatter, allgather, broadcast or reduce
 * (coll: LOOMI_COLL_*) of count elements (per rank's block for
 * reduce_scatter and allgather), with the arguments the call has after
 * its checks (a non-root's unused buffer NULL), every buffer this rank
 * uses device memory, ordered after the work queued on stream.
 * *taken: 0 where the call is not for this path, or some rank found it
 * cannot take it (then nothing was done, on every rank, and the caller
 * stages); 1 where the path ran, with its result returned.  Every rank
 * takes the same decision. */
loom_result_t loomi_devpeer_call(struct loom_comm *comm, const char *fn, int coll,
                                 const void *sendbuf, void *recvbuf, size_t count,
                                 loom_datatype_t dtype, loom_op_t op, int root, void *stream,
                                 int *taken);
/* The communicator goes: its peers' mappings closed, its device let go. */
void loomi_devpeer_free(struct loom_comm *comm);

#endif
