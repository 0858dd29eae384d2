/* group.h - loom_group_start/end: calls queued per thread, run together. */
#ifndef LOOMI_GROUP_H
#define LOOMI_GROUP_H

#include "sched/sched.h"

/* Nonzero between loom_group_start and the outermost loom_group_end of
 * the calling thread. */
int loomi_group_active(void);
/* Queue a built schedule (ownership passes to the group) to be started
 * at the outermost loom_group_end. */
loom_result_t loomi_group_queue(struct loom_comm *comm, struct loomi_sched *s,
                                const void *sendbuf, void *recvbuf, int inplace);

/* ------------------------------------------------------------- fusion
 *
 * At the outermost loom_group_end, the group's allreduces, reduce-scatters
 * and allgathers that were queued unbuilt (loomi_group_queue_call) are
 * fused: calls on one communicator with the same collective, datatype
 * and op (any op for allgather) run as one operation over a staging
 * buffer: their inputs are packed one after the other (for
 * reduce-scatter and allgather, block by block of the ranks), one
 * schedule runs over the concatenation, and the results are unpacked
 * into each call's output.  A fused operation is one collective call
 * (its own number, calls.h's fused descriptor).  A call that fuses with
 * no other runs as it always did. */

/* Calls whose staging bytes (the per-rank input of an allreduce, the
 * nranks blocks of a reduce-scatter or allgather) pass this do not fuse:
 * they run as their own schedule, over the caller's buffers. */
#define LOOMI_FUSE_MEMBER_MAX ((size_t)1 << 20)
/* A fused operation stages at most this many bytes (more calls of one
 * kind start another). */
#define LOOMI_FUSE_BUCKET_MAX ((size_t)64 << 20)
/* A fused operation that stages this many bytes of input (or of output)
 * packs them into the staging buffer (or unpacks them into the callers'
 * buffers) with streaming stores, which do not first read the lines they
 * overwrite: past what a core's caches keep, those reads are a third of
 * the copy's memory traffic.  The shared allreduce of such an operation
 * writes its results (into every rank's window) with streaming stores too
 * (perf/NOTES.md, "group.c, streamed packing"). */
#define LOOMI_FUSE_STREAM_BYTES ((size_t)2 << 20)

/* Whether a call of coll with count elements of es bytes on nranks
 * ranks (no codec, no window) may fuse. */
int loomi_fuse_eligible(int coll, size_t count, size_t es, int nranks);

/* One fusable call, as the fusion rule sees it. */
struct loomi_fuse_item {
    uintptr_t comm; /* the communicator's handle */
    int coll;       /* enum loomi_coll */
    loom_datatype_t dtype;
    loom_op_t op;
    size_t bytes; /* staging bytes */
};

/* The fusion rule: bucket[i] = the operation item i runs in, numbered in
 * order of first appearance; items of one bucket share communicator,
 * collective, datatype and op (not op for allgather) and stage at most
 * cap bytes together (a lone item may pass it).  Returns the number of
 * buckets (<= n), or 0 when out of memory. */
size_t loomi_fuse_plan(const struct loomi_fuse_item *it, size_t n, size_t cap, uint32_t *bucket);

/* The hash of a fused operation's member counts, in order (never 0). */
uint32_t loomi_fuse_shape(const size_t *counts, size_t n);

/* Queue a fusable call (checked) to be built at the outermost
 * loom_group_end. */
loom_result_t loomi_group_queue_call(struct loom_comm *comm, const char *fn, int coll,
                                     const void *sendbuf, void *recvbuf, size_t count,
                                     loom_datatype_t dtype, loom_op_t op, int inplace);

/* Build (collectives.c) the schedule of a group's call, or of `members`
 * fused calls (> 1: count is their total, shape their loomi_fuse_shape),
 * taking its call number now; *save as loomi_op_start's.  stream_results:
 * the shared allreduce writes the results with streaming stores at any
 * size (unless LOOM_SHM_STREAM is 0), as for a staged fused operation
 * past LOOMI_FUSE_STREAM_BYTES, whose results are unpacked at once. */
loom_result_t loomi_group_build(struct loom_comm *comm, const char *fn, int coll,
                                const void *sendbuf, void *recvbuf, size_t count,
                                loom_datatype_t dtype, loom_op_t op, int inplace,
                                uint32_t members, uint32_t shape, int stream_results,
                                struct loomi_sched *s, int *save);

#endif
