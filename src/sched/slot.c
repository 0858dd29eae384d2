/*
 * slot.c - the engine's LOOMI_STEP_SLOT: a small collective among the
 * ranks of one host through slots at the tail of their shared arenas.
 *
 * For a few bytes, rounds of messages through the FIFOs are most of the
 * time.  Here each rank copies its input into its own slot, publishes
 * the operation's word, waits until every rank of the host has
 * published the same word, and then reads what it needs from the slots:
 * all of them for allreduce and allgather (reduced in rank order, so
 * every rank computes the same bytes), its own block of each for
 * reduce-scatter and all-to-all, nothing for barrier.  One
 * synchronisation instead of log2(p) rounds.  The step is the whole
 * operation; the engine visits it like any ready step until it is done
 * (op_run_ready), and its waits have the operation's deadline.  A
 * blocking call with nothing else in flight runs it at once instead
 * (loomi_op_run_slot_sched): most calls find every word within the first
 * look, and only a longer wait goes to the engine, on an operation kept
 * for it.
 *
 * Each rank's region (at e->slot_off in its arena, which the owner set
 * with the transport): two 64-byte lines, each holding a word that names
 * the last operation whose data is in one of two slots, then the two
 * slots of e->slot_bytes.  Inputs of up to 56 bytes go in the word's own
 * line instead.  Slot operation s uses slot s % 2.  A rank writes slot
 * s % 2 again only in operation s + 2, which it starts after seeing
 * every rank publish s + 1; a rank publishes s + 1 only after it has
 * finished reading for s.  So no slot is overwritten while it is read,
 * without any further message, as long as every rank runs the same slot
 * operations one at a time (the owner starts them for blocking calls
 * only, and waits for each).
 *
 * The word is the schedule's call number (its low 32 bits) and the
 * call's check above them (s->call, s->chk), so the load that tells a
 * rank its peer's input is there also tells it that the peer made the
 * same call: the same number with another check, or a later number (the
 * peer made this call some other way and went on), fails the operation
 * with LOOM_ERR_MISMATCH, and through the owner every rank, before any
 * slot is read.  A peer that stays away for LOOMI_CALL_STALL_MS is
 * probed (check_stall, engine.c), and the deadline is the engine's.  The
 * destination is written only once every input is there, so a failure
 * leaves it untouched.
 */
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reduce/reduce.h"
#include "sched/op.h"
#include "sched/sched.h"

#define LINE 64
#define SEQ_LINES 2
/* Inputs of up to this many bytes lie in the line of their word, so
 * that a reader's one cache miss brings both. */
#define INLINE (LINE - sizeof(uint64_t))
/* Loads of a peer's word per visit of the step: then the engine has a
 * turn (the transport, the control plane, the deadline). */
#define SPINS 32

size_t loomi_slot_region_bytes(size_t slot_bytes)
{
    size_t b = SEQ_LINES * LINE + 2 * slot_bytes;
    return (b + 4095) / 4096 * 4096;
}

/* The word of slot operation s in a rank's region. */
static _Atomic uint64_t *word_of(unsigned char *region, uint64_t s)
{
    return (_Atomic uint64_t *)(void *)(region + (s & 1) * LINE);
}

/* Where slot operation s's input of `bytes` lies. */
static unsigned char *slot_of(const struct loomi_engine *e, unsigned char *region, uint64_t s,
                              size_t bytes)
{
    if (bytes <= INLINE) return region + (s & 1) * LINE + sizeof(uint64_t);
    return region + SEQ_LINES * LINE + (s & 1) * e->slot_bytes;
}

/* What a rank publishes for a call: its number's low 32 bits, and its
 * check above them. */
static uint64_t slot_word(uint64_t no, uint32_t chk) { return (uint64_t)chk << 32 | (uint32_t)no; }

/* Find every rank's region (once per engine, through its transport). */
static loom_result_t map_slots(struct loomi_engine *e, int n)
{
    if (e->slot_map && e->slot_nmap == n) return LOOM_SUCCESS;
    const size_t need = e->slot_off + loomi_slot_region_bytes(e->slot_bytes);
    if (!e->slot_bytes || !e->tops || !e->tops->shared_map)
        return loomi_fail(LOOM_ERR_UNSUPPORTED, *e->rank,
                          "engine: a slot step, but the owner set no slots in the shared arenas");
    unsigned char **m = calloc((size_t)n, sizeof *m);
    if (!m) return loomi_fail(LOOM_ERR_NO_MEMORY, *e->rank, "engine: out of memory");
    for (int q = 0; q < n; q++) {
        size_t len = 0;
        unsigned char *a = e->tops->shared_map(e->tstate, q, &len);
        if (!a || len < need) {
            free(m);
            return loomi_fail(LOOM_ERR_INTERNAL, *e->rank,
                              "engine: rank %d's shared arena is not mapped here with its slots "
                              "(%zu bytes, %zu needed)",
                              q, a ? len : 0, need);
        }
        m[q] = a + e->slot_off;
    }
    free(e->slot_map);
    e->slot_map = m;
    e->slot_nmap = n;
    return LOOM_SUCCESS;
}

/* Fail the operation (acted on by engine_advance, which breaks the
 * owner and so every rank). */
__attribute__((format(printf, 4, 5))) static int slot_fail(struct loomi_op *op,
                                                           loom_result_t code, int peer,
                                                           const char *fmt, ...)
{
    LOOMI_VFORMAT(op->errmsg, fmt);
    op->status = code;
    op->failed_peer = peer;
    op->slot_wait = 0;
    return -1;
}

/* Rank q published v where this rank waits for the schedule's call: the
 * same call with other arguments, or a later call, which q made without
 * the slots (it made this call some other way).  Returns -1 (the
 * operation failed) for such a mismatch, 0 while q has not got there. */
static int slot_mismatch(struct loomi_op *op, int q, uint64_t v)
{
    const uint64_t no = op->s.call;
    const uint32_t ahead = (uint32_t)v - (uint32_t)no;
    if (ahead >= (1u << 24)) return 0; /* an earlier call's word */
    if (!ahead)
        return slot_fail(op, LOOM_ERR_MISMATCH, q,
                         "rank %d made collective call %llu with other arguments than this "
                         "rank (call check %08x there, %08x here)",
                         q, (unsigned long long)no, (unsigned)(v >> 32), (unsigned)op->s.chk);
    return slot_fail(op, LOOM_ERR_MISMATCH, q,
                     "rank %d went on to collective call %llu without making call %llu "
                     "through the shared-memory slots as this rank does",
                     q, (unsigned long long)(no + ahead), (unsigned long long)no);
}

/* Bytes of a step's input in a slot. */
static size_t slot_in(const struct loomi_sched *s, const struct loomi_step *st)
{
    return st->count * s->esize * ((st->flags & LOOMI_SLOT_BLOCKS) ? (size_t)s->nranks : 1);
}

/* Publish: this rank's input into its slot of slot operation sq (the
 * next), then the word.  In place, the input is in the slot before
 * anything is written. */
static uint64_t slot_publish(struct loomi_engine *e, const struct loomi_sched *s, const void *src,
                             size_t in, uint64_t want)
{
    const uint64_t sq = ++e->slot_seq;
    unsigned char *mine = e->slot_map[s->rank];
    if (in) memcpy(slot_of(e, mine, sq, in), src, in);
    /* Release, for two orderings arm64 does not keep by itself: the input
     * just copied is visible before the word (a peer that sees the word
     * reads the input, not the slot's older bytes), and this rank's reads
     * of the peers' slots in the previous operation (slot_read) are done
     * before the word, which lets each peer overwrite those slots in
     * operation sq + 1 (see the top of this file). */
    atomic_store_explicit(word_of(mine, sq), want, memory_order_release);
    return sq;
}

/* Look for the words of slot operation sq from rank *next on, up to
 * SPINS loads, giving the core away between them when ranks share cores
 * (the rank waited for may need this one).  Returns 1 when every rank's
 * word is `want`, 0 while rank *next has not got there, -1 when it
 * published another call's word (*v). */
static int slot_look(struct loomi_engine *e, int p, uint64_t sq, uint64_t want, int *next,
                     uint64_t *v)
{
    for (unsigned spins = 0; *next < p;) {
        /* Acquire: the peer's slot is read (slot_read), and this rank's
         * slot overwritten in a later operation, only after its word. */
        *v = atomic_load_explicit(word_of(e->slot_map[*next], sq), memory_order_acquire);
        if (*v == want) {
            ++*next;
            e->progressed = 1; /* the deadline counts from the last arrival */
            continue;
        }
        if ((uint32_t)*v - (uint32_t)want < (1u << 24)) return -1;
        if (++spins == SPINS) return 0;
        if (e->oversubscribed) sched_yield();
    }
    return 1;
}

/* Every input of slot operation sq is there: read what step st says into
 * out (its destination). */
static void slot_read(const struct loomi_engine *e, const struct loomi_sched *s,
                      const struct loomi_step *st, uint64_t sq, size_t in, unsigned char *out)
{
    const size_t n = st->count * s->esize;
    const size_t off = (st->flags & LOOMI_SLOT_BLOCKS) ? (size_t)s->rank * n : 0;
    if (!n) return;
    if (st->flags & LOOMI_SLOT_REDUCE) {
        memcpy(out, slot_of(e, e->slot_map[0], sq, in) + off, n);
        for (int q = 1; q < s->nranks; q++)
            loomi_reduce_inplace(out, slot_of(e, e->slot_map[q], sq, in) + off, st->count,
                                 s->dtype, s->op);
        if (s->op == LOOM_AVG) loomi_reduce_finish_avg(out, st->count, s->dtype, s->nranks);
    } else if (st->flags & LOOMI_SLOT_GATHER) {
        for (int q = 0; q < s->nranks; q++)
            memcpy(out + (size_t)q * n, slot_of(e, e->slot_map[q], sq, in) + off, n);
    }
}

int loomi_op_run_slot(struct loomi_op *op, const struct loomi_step *st)
{
    struct loomi_engine *e = op->eng;
    const struct loomi_sched *s = &op->s;
    const size_t in = slot_in(s, st);
    const uint64_t want = slot_word(s->call, s->chk);
    if (!op->slot_wait) {
        /* First visit: publish. */
        loom_result_t r = map_slots(e, s->nranks);
        if (r != LOOM_SUCCESS) return slot_fail(op, r, -1, "%s", loom_get_last_error());
        op->slot_s = slot_publish(e, s, bufp(op, st->src) + st->src_off, in, want);
        op->slot_next = 0;
        op->slot_wait = 1;
    }
    /* Ranks below slot_next have published the call. */
    uint64_t v = 0;
    const int from = op->slot_next;
    const int k = slot_look(e, s->nranks, op->slot_s, want, &op->slot_next, &v);
    if (op->stat_no && op->slot_next > from)
        loomi_stats_slot_seen(op, from, op->slot_next, st->count * s->esize);
    if (k < 0) return slot_mismatch(op, op->slot_next, v);
    if (k == 0) return 0;
    op->slot_wait = 0;
    slot_read(e, s, st, op->slot_s, in, bufp(op, st->dst) + st->dst_off);
    if (op->stat_no) loomi_stats_op_done(op);
    return 1;
}

/* The engine's one slot operation (e->slot_op, allocated), re-armed for
 * a slot schedule: as op_start would set it up, without the lists. */
static struct loomi_op *slot_op_arm(struct loomi_engine *e, const struct loomi_sched *s,
                                    const void *sendbuf, void *recvbuf)
{
    struct loomi_op *op = e->slot_op;
    memset(op, 0, offsetof(struct loomi_op, s));
    op->errmsg[0] = 0;
    op->cap = 1;
    /* As op_start lays out a block of one step. */
    op->xfers = (struct loomi_xfer *)(op + 1);
    op->ready = (uint32_t *)(op->xfers + 1);
    op->pending = (uint16_t *)(op->ready + 1);
    op->posted = (uint8_t *)(op->pending + 1);
    op->posted[0] = 0;
    op->pending[0] = 0;
    op->eng = e;
    op->failed_peer = -1;
    op->s = *s;
    op->s.borrowed = 1; /* the caller's: never freed here */
    op->bufs[LOOMI_BUF_SEND] = (unsigned char *)(uintptr_t)sendbuf;
    op->bufs[LOOMI_BUF_RECV] = recvbuf;
    op->seq = op->s.call;
    op->ready[op->rtail++] = 0;
    return op;
}

loom_result_t loomi_op_run_slot_sched(struct loomi_engine *e, const struct loomi_sched *s,
                                      const void *sendbuf, void *recvbuf)
{
    const struct loomi_step *st = s->steps;
    loomi_engine_lock(e);
    /* Something else in flight (its steps must progress while this
     * waits), not one slot step between the caller's buffers, or the
     * slots or the kept operation not there (the operation's first visit
     * says why): an operation like any other. */
    if (!e->slot_op) {
        struct loomi_op *op;
        e->slot_op = malloc(sizeof *op + sizeof *op->xfers + sizeof *op->pending +
                            sizeof *op->ready + 1);
    }
    if (e->active || s->nsteps != 1 || st->kind != LOOMI_STEP_SLOT || s->nshared ||
        st->src != LOOMI_BUF_SEND || st->dst != LOOMI_BUF_RECV || *e->error != LOOM_SUCCESS ||
        !e->slot_op || map_slots(e, s->nranks) != LOOM_SUCCESS) {
        loomi_engine_unlock(e);
        struct loomi_sched b = *s;
        b.borrowed = 1;
        struct loomi_op *op = NULL;
        loom_result_t r = loomi_op_start(e, &b, sendbuf, recvbuf, 0, &op);
        return r == LOOM_SUCCESS ? loomi_op_wait(op) : r;
    }
    /* The step at once, as its first visit would run it: publish, and
     * look for the words a while, which is all the usual call takes. */
    const size_t in = slot_in(s, st);
    const uint64_t want = slot_word(s->call, s->chk);
    const uint64_t sq = slot_publish(e, s, (const unsigned char *)sendbuf + st->src_off, in, want);
    int next = 0;
    uint64_t v = 0;
    if (slot_look(e, s->nranks, sq, want, &next, &v) > 0) {
        slot_read(e, s, st, sq, in, (unsigned char *)recvbuf + st->dst_off);
        if (e->stats) loomi_stats_slot_prompt(e, s->nranks, st->count * s->esize);
        loomi_engine_unlock(e);
        return LOOM_SUCCESS;
    }
    /* Not yet every word, or another call's: the engine's kept operation
     * takes the step over where it stands, and the engine drives it as
     * if op_start had started it, with everything the engine does for a
     * wait (the control plane, the transport, the deadline, the probe of
     * a stalled peer, a mismatch or any failure failing every rank). */
    struct loomi_op *op = slot_op_arm(e, s, sendbuf, recvbuf);
    if (e->stats) {
        /* Timed from here: the ranks found so far count as prompt. */
        loomi_stats_op_begin(op);
        loomi_stats_slot_seen(op, 0, next, st->count * s->esize);
    }
    op->slot_wait = 1;
    op->slot_s = sq;
    op->slot_next = next;
    const loom_result_t r = loomi_op_drive_kept(op, 0);
    loomi_engine_unlock(e);
    return r;
}
