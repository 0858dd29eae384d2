/*
 * calls.h - what every rank's collective calls must agree on, and what
 * happens when they do not (calls.c).
 *
 * Every collective call a rank makes on a communicator (blocking or not,
 * in a group or not, through the shared-memory slots or messages) gets
 * the next number of the communicator's count of calls, which is the
 * same on every rank as long as the ranks make the same calls in the same
 * order; the engine's tags carry it (transport.h).  Each call has a
 * descriptor (collective, count, datatype, op, root, compression) and a
 * 32-bit check of it.  Every path compares checks where it meets a peer:
 * the slots' published words, the messages' headers (transports), and,
 * for a rank that waits on a peer that entered some other call, a probe
 * over the control plane once the wait has lasted LOOMI_CALL_STALL_MS.
 *
 * A rank that finds a difference fails the communicator with
 * LOOM_ERR_MISMATCH (loomi_comm_fail), which revokes it everywhere; every
 * rank that learns of such a failure sends the descriptors of its last
 * calls to every other over the control plane (loomi_calls_push), and
 * before it returns the error, collects the others' (loomi_calls_verdict)
 * and names the ranks whose call differs from the majority's, with both
 * calls: "rank 2 called loom_allreduce(count=1000, float32, sum) while
 * ranks 0, 1, 3 called loom_allreduce(count=1024, float32, sum)".
 */
#ifndef LOOMI_CALLS_H
#define LOOMI_CALLS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "loom.h"

struct loom_comm;

/* A collective call as the ranks must all make it.  Fields a collective
 * has no use for are 0 (op of non-reductions, root of unrooted ones; the
 * count of alltoallv, whose counts differ between ranks and are checked
 * per message, and of the barrier). */
struct loomi_call {
    int coll; /* enum loomi_coll */
    loom_datatype_t dtype;
    loom_op_t op;
    int root;
    uint64_t count;
    int codec; /* compressed (loom_coll_options_t.codec, loom_comm_set_codec) */
    /* A group's fused calls (comm/group.c): several calls of coll with
     * this dtype and op run as one.  Then root holds a hash of the
     * members' counts in order (loomi_fuse_shape) and count the members
     * (high LOOMI_CALL_FUSED_SHIFT..63 bits) and their total count (low
     * bits), so that ranks whose groups differ in any member's count, or
     * in how many calls fused, fail with LOOM_ERR_MISMATCH. */
    int fused;
};

#define LOOMI_CALL_FUSED_SHIFT 40

/* The descriptor of `members` fused calls of coll (see fused above). */
static inline struct loomi_call loomi_call_make_fused(int coll, uint64_t total,
                                                      loom_datatype_t dtype, loom_op_t op,
                                                      uint32_t members, uint32_t shape)
{
    struct loomi_call d = {coll, dtype, coll == 2 ? (loom_op_t)0 : op, (int)(int32_t)shape,
                           (uint64_t)members << LOOMI_CALL_FUSED_SHIFT |
                               (total & ((UINT64_C(1) << LOOMI_CALL_FUSED_SHIFT) - 1)),
                           0, 1};
    return d;
}

/* Calls remembered per communicator, for probes and verdicts. */
#define LOOMI_CALL_HIST 64
/* How long a wait on a peer lasts before it probes the peer, and how
 * often it looks at the control plane early in a stall: the engine's
 * LOOMI_CALL_STALL_MS, LOOMI_CALL_ANSWER_MS and LOOMI_CALL_ANSWER_POLL_MS
 * (sched/sched.h). */
/* After a rooted collective (broadcast, reduce, gather, scatter), which
 * can complete on a rank that never hears from a peer that made it
 * otherwise, this many small calls through the slots look at the
 * transport first for such a peer's messages. */
#define LOOMI_CALL_POLL_SLOTS 64

/* One remembered call: its number (0 while the record is written: a
 * seqlock, read from other threads) and its descriptor's two words. */
struct loomi_call_rec {
    _Atomic uint64_t no;
    _Atomic uint64_t w0, w1;
};

/* The descriptor of a call with these arguments (normalised); coll is
 * an enum loomi_coll (0 allreduce, 1 reduce_scatter, 6 reduce: the
 * reductions; 5 broadcast, 6 reduce, 7 gather, 8 scatter: rooted; 4
 * alltoallv, 9 barrier; see coll.h). */
static inline struct loomi_call loomi_call_make(int coll, size_t count, loom_datatype_t dtype,
                                                loom_op_t op, int root, int codec)
{
    struct loomi_call d = {coll, (loom_datatype_t)0, (loom_op_t)0, 0, 0, codec != 0, 0};
    if (coll == 9) return d;
    d.dtype = dtype;
    if (coll != 4) d.count = count;
    if (coll == 0 || coll == 1 || coll == 6) d.op = op;
    if (coll >= 5 && coll <= 8) d.root = root;
    return d;
}

/* The descriptor of a gossip call (coll 10, loom_gossip_average) between
 * `rank` and `partner` (equal: the rank sits the round out): the two must
 * agree on count and datatype, and on who pairs with whom, so root holds
 * the pair, lower rank in the low 16 bits and higher above (a hash with
 * the sign bit set past 32767 ranks).  Partners make the same descriptor;
 * a rank whose message reaches a rank that named another partner shows a
 * different check there, and the verdict names both pairs. */
static inline struct loomi_call loomi_call_make_gossip(size_t count, loom_datatype_t dtype,
                                                       int rank, int partner)
{
    struct loomi_call d = {10, dtype, (loom_op_t)0, 0, count, 0, 0};
    const uint32_t lo = (uint32_t)(rank < partner ? rank : partner);
    const uint32_t hi = (uint32_t)(rank < partner ? partner : rank);
    if (hi < 32768)
        d.root = (int)(lo | hi << 16);
    else
        d.root = (int)(int32_t)(UINT32_C(0x80000000) |
                                ((lo * UINT32_C(0x9e3779b1) ^ hi * UINT32_C(0x85ebca6b)) >> 1));
    return d;
}

/* The first of the two words a descriptor travels and is remembered
 * as (the second is the count). */
static inline uint64_t loomi_call_word0(const struct loomi_call *d)
{
    return (uint64_t)(d->coll & 0xff) | (uint64_t)(d->dtype & 0xff) << 8 |
           (uint64_t)(d->op & 0xff) << 16 | (uint64_t)(d->codec ? 1 : 0) << 24 |
           (uint64_t)(d->fused ? 1 : 0) << 25 |
           (uint64_t)(uint32_t)d->root << 32;
}

/* The 32-bit check of a descriptor's words (never 0). */
static inline uint32_t loomi_call_check_words(uint64_t w0, uint64_t w1)
{
    uint64_t h = (w0 ^ (w1 * UINT64_C(0x9e3779b97f4a7c15))) * UINT64_C(0xd6e8feb86659fd93);
    h ^= h >> 32;
    h *= UINT64_C(0xd6e8feb86659fd93);
    uint32_t c = (uint32_t)(h ^ h >> 29);
    return c ? c : 1;
}

static inline uint32_t loomi_call_check(const struct loomi_call *d)
{
    return loomi_call_check_words(loomi_call_word0(d), d->count);
}

/* Remember call `no` (the calling thread; see loomi_call_begin in
 * comm.h). */
static inline void loomi_call_rec_put(struct loomi_call_rec *r, uint64_t no, uint64_t w0,
                                      uint64_t w1)
{
    /* The words are stored with release, not after a release fence: a
     * reader that sees either new word then sees no == 0 (or the new
     * number), and ThreadSanitizer, which does not model fences, sees
     * the same ordering (plain moves on x86 either way; on arm64 each is
     * an stlr, which the zeroing of `no` cannot pass, and the number's
     * release puts it after both words). */
    atomic_store_explicit(&r->no, 0, memory_order_relaxed);
    atomic_store_explicit(&r->w0, w0, memory_order_release);
    atomic_store_explicit(&r->w1, w1, memory_order_release);
    atomic_store_explicit(&r->no, no, memory_order_release);
}

/* "loom_allreduce(count=1000, float32, sum)". */
void loomi_call_str(const struct loomi_call *d, char *buf, size_t n);
/* This rank's call number `no` (any thread): 1 when remembered. */
int loomi_call_get(const struct loom_comm *c, uint64_t no, struct loomi_call *d);
/* The check of this rank's call whose number's low LOOMI_TAG_SEQ_BITS
 * bits are `op` (0: none remembered): the transports' ctx.call_check. */
uint32_t loomi_call_check_of_op(const struct loom_comm *c, uint64_t op);

/* A wait in call `no` has stalled on these peers: probe them (control
 * plane; nothing without one). */
void loomi_calls_probe(struct loom_comm *c, uint64_t no, const int *peers, int npeers);
/* Answer the probes that came (under the communicator's lock; cheap when
 * none did): one whose call differs from this rank's call of the same
 * number fails the communicator with LOOM_ERR_MISMATCH.  Waits call it
 * now and then (the engine's deadline checks, in the slots' waits too). */
void loomi_calls_poll(struct loom_comm *c);
/* The communicator failed with LOOM_ERR_MISMATCH: send this rank's last
 * calls to every rank (once). */
void loomi_calls_push(struct loom_comm *c);
/* Collect the others' calls (waiting up to wait_ms for ranks that have
 * not sent them yet) and, where the ranks' calls of one number differ,
 * put the verdict in the communicator's message (once).  Returns 1 when
 * a verdict names differing calls. */
int loomi_calls_verdict(struct loom_comm *c, int wait_ms);
/* How long a rank that returns a mismatch waits at most for the
 * others' calls: those in a call send theirs within milliseconds, and it
 * stops as soon as the ranks still to come could no longer change the
 * verdict; this bounds the wait for a rank that makes no Loom call
 * meanwhile, or is slow to be scheduled. */
#define LOOMI_VERDICT_WAIT_MS 1000

#endif
