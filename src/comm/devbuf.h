/*
 * devbuf.h - collectives on CUDA device buffers, staged through pinned
 * host memory (devbuf.c): the device input is copied to host staging
 * buffers after the call's stream is synchronised, the ordinary host
 * collective runs on them, and the result is copied back to the device
 * when the operation completes (at once for a blocking call, in
 * loom_wait / loom_test / loom_wait_any for a non-blocking one).
 */
#ifndef LOOMI_DEVBUF_H
#define LOOMI_DEVBUF_H

#include <stddef.h>

#include "loom.h"

struct loom_comm;
struct loomi_devcall;

/* Whether the loaded driver has what staging needs; NULL if so, else
 * the name of a missing function (or why there is no driver). */
const char *loomi_devbuf_missing(void);

/* Stage one call's buffers: sb (slen bytes) and rb (rlen bytes), each
 * device memory where sdev / rdev say.  Synchronises stream (NULL: the
 * legacy default stream), then copies the device input in: sb, and rb
 * too where rin (the call reads rb: in place, or bytes it does not
 * write).  Buffers that overlap share one staging range, so that the
 * in-place relations hold between *hs and *hr.  *hs / *hr: the host
 * buffers to run the collective on (the caller's where not device). */
loom_result_t loomi_devbuf_stage(struct loom_comm *comm, const char *fn, void *stream,
                                 const void *sb, size_t slen, int sdev, void *rb, size_t rlen,
                                 int rdev, int rin, const void **hs, void **hr,
                                 struct loomi_devcall **dc);
/* The call is over (r its result so far): on success copy the device
 * result back; then release the staging buffers.  Returns r, or the
 * copy's failure. */
loom_result_t loomi_devbuf_done(struct loomi_devcall *dc, loom_result_t r);
/* Non-blocking: dc completes with request req (loomi_devbuf_req_done). */
void loomi_devbuf_attach(struct loomi_devcall *dc, loom_request_t req);
/* Request req completed with r: finish its staged call, if any. */
loom_result_t loomi_devbuf_req_done(loom_request_t req, loom_result_t r);
/* Whether any non-blocking staged call is pending (cheap). */
int loomi_devbuf_pending(void);
/* For the calls that do not stage (point-to-point, the quorum allreduce,
 * the sparse collectives): NULL where p is not CUDA device memory, else
 * writes why p (named `what`) is refused into msg and returns msg. */
const char *loomi_devbuf_refused(const char *fn, const void *p, const char *what, char *msg,
                                 size_t n);
/* Pipelined staging of a large element-wise call (allreduce, broadcast,
 * reduce; reduce-scatter, allgather: sendbuf / recvbuf of sblocks /
 * rblocks blocks, each chunked alike) whose buffers with bytes are all
 * device memory: the input is
 * copied to the host in chunks of `chunk` bytes (a multiple of the
 * element size es) on an internal stream, each with an event; the host
 * collective of chunk k is started (start(ctx, ...), non-blocking) as soon
 * as its copy is done, while later chunks are still copying; each chunk
 * whose collective finished is copied back at once (asynchronously); the
 * internal stream is synchronised once, at the end.  On a failure the
 * chunks already copied back are put back as they were, so that recvbuf
 * is left as it was.  req NULL: blocking; else *req completes the whole
 * call (loomi_devbuf_req_done), and every chunk was started before this
 * returns.  sb == rb: in place. */
typedef loom_result_t (*loomi_devchunk_fn)(void *ctx, const void *hs, void *hr, size_t count,
                                           loom_request_t *req);
/* The chunk size for a call of n bytes in elements of es bytes: 0 where
 * the call is not pipelined (LOOM_CUDA_PIPELINE_CHUNK 0, n not above it,
 * or the driver lacks the asynchronous functions). */
size_t loomi_devbuf_pipe_chunk(size_t n, size_t es);
loom_result_t loomi_devbuf_pipeline(struct loom_comm *comm, const char *fn, void *stream,
                                    const void *sb, size_t slen, void *rb, size_t rlen,
                                    size_t es, size_t chunk, size_t sblocks, size_t rblocks,
                                    loomi_devchunk_fn start, void *ctx, loom_request_t *req);
/* The communicator goes: its pending calls dropped, its buffers freed. */
void loomi_devbuf_free(struct loom_comm *comm);

#endif
