/*
 * build.h - a schedule builder that derives the dependencies.
 *
 * A generator states, per step, what moves or is reduced: send this
 * range to that peer, receive into that range, reduce these two ranges
 * into a third, copy, divide.  The builder keeps, per buffer and byte
 * range, the last step that wrote it and the steps that read it since
 * (the validator's view of hazards), and makes each new step wait for
 * - the last writer of every range it reads or writes (read after
 *   write, write after write), and
 * - for the ranges it writes, the readers since that writer (write
 *   after read),
 * nothing else.  Steps are ordered as the generator adds them; ranges
 * that share no byte get no dependency, so a schedule cut into chunks
 * pipelines by itself.  A dependency that another one already implies
 * (a direct dependency of it) is dropped; more than LOOMI_MAX_DEPS
 * left are joined through zero-count copies, as loomi_sched_join does.
 *
 * Shared arenas are not tracked (another rank's steps order them, by
 * messages): a generator orders those with loomi_build_after.  In-place
 * reduce_scatter's RECV is SEND block `rank` (recv_in_send).
 */
#ifndef LOOMI_BUILD_H
#define LOOMI_BUILD_H

#include <stddef.h>
#include <stdint.h>

#include "coll/coll_util.h"
#include "sched/sched.h"

/* One range a step reads or writes (bytes). */
struct loomi_access {
    int buf;
    size_t off, bytes;
    int write;
};
/* The ranges step st of s reads and writes, in the order the step uses
 * them (a write after a read of the same range covers the read), empty
 * ones and shared arenas left out: at most LOOMI_MAX_ACCESS.  Shared by
 * the builder and the validator's hazard check. */
#define LOOMI_MAX_ACCESS 6
int loomi_step_accesses(const struct loomi_sched *s, const struct loomi_step *st,
                        struct loomi_access *a);

struct loomi_brange;  /* build.c */
struct loomi_breader; /* build.c */
struct loomi_build {
    struct loomi_sched *s;
    size_t C; /* chunks of the pipeline (loomi_build_init's rule) */
    int recv_in_send;
    /* Per buffer, a treap of ranges by offset (root[buf]) whose nodes
     * are also linked in offset order; nodes in one pool, and a hash of
     * where each starts (most steps start and end where others did). */
    uint32_t root[LOOMI_NBUFS];
    struct loomi_brange *node;
    size_t nnode, capnode;
    uint32_t *hash;
    size_t hmask;
    uint32_t seed;
    struct loomi_breader *pool;
    size_t npool, cappool;
    uint32_t *deps;
    size_t ndeps, capdeps;
    uint32_t after; /* one more dependency of the next step */
    int ok;
};

/* The rule of every generator that pipelines: `bytes` cut into chunks of
 * about chunk_bytes, 1 to LOOMI_MAX_CHUNKS of them (which bounds the
 * steps and tags of a huge message in small chunks). */
#define LOOMI_MAX_CHUNKS 4096
static inline size_t loomi_build_chunks(size_t bytes, size_t chunk_bytes)
{
    return loomi_nchunks(bytes, chunk_bytes, LOOMI_MAX_CHUNKS);
}

/* Start building on s (its steps so far are taken in as if added here),
 * pipelining `bytes` in chunks of about chunk_bytes: b->C is
 * loomi_build_chunks(bytes, chunk_bytes).  Out of memory: an error. */
loom_result_t loomi_build_init(struct loomi_build *b, struct loomi_sched *s, size_t bytes,
                               size_t chunk_bytes);
/* Free the builder; the error of a step that could not be added. */
loom_result_t loomi_build_done(struct loomi_build *b);
/* The next step added (not an empty one) also waits for step, which no
 * range orders (LOOMI_NO_DEP: nothing). */
static inline void loomi_build_after(struct loomi_build *b, uint32_t step) { b->after = step; }

/* Chunk c of segment i of g, in bytes from the buffer's start (*off) and
 * elements (*n). */
static inline void loomi_build_chunk(const struct loomi_build *b, const struct loomi_seg *g,
                                     int i, size_t c, size_t *off, size_t *n)
{
    size_t o;
    loomi_chunk(loomi_seg_len(g, i), b->C, c, &o, n);
    *off = (loomi_seg_start(g, i) + o) * b->s->esize;
}

/* Add a step (its dependencies derived): the index, or LOOMI_NO_DEP for
 * an empty one (count 0, which is left out) or after a failure. */
uint32_t loomi_build_step(struct loomi_build *b, const struct loomi_step *st);
/* Offsets in bytes, counts in elements, as loomi_sched_*. */
uint32_t loomi_bsend(struct loomi_build *b, int peer, uint32_t tag, int buf, size_t off,
                     size_t count);
uint32_t loomi_brecv(struct loomi_build *b, int peer, uint32_t tag, int buf, size_t off,
                     size_t count);
/* dst = a OP b2 */
uint32_t loomi_breduce(struct loomi_build *b, int dst, size_t dst_off, int a, size_t a_off,
                       int b2, size_t b2_off, size_t count);
uint32_t loomi_bcopy(struct loomi_build *b, int dst, size_t dst_off, int src, size_t src_off,
                     size_t count);
uint32_t loomi_bavg(struct loomi_build *b, int dst, size_t dst_off, size_t count);
/* dst /= by (an AVG step whose flags hold the divisor: gossip's 2). */
uint32_t loomi_bavg_by(struct loomi_build *b, int dst, size_t dst_off, size_t count, uint32_t by);

#endif
