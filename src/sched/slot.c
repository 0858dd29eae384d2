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
 * (op_run_ready), and its waits have the operation's deadline.
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
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(op->errmsg, sizeof op->errmsg, fmt, ap);
    va_end(ap);
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

/* Every input is there: read what the step says into its destination. */
static void slot_read(struct loomi_op *op, const struct loomi_step *st, size_t in)
{
    const struct loomi_engine *e = op->eng;
    const struct loomi_sched *s = &op->s;
    const uint64_t sq = op->slot_s;
    const size_t n = st->count * s->esize;
    const size_t off = (st->flags & LOOMI_SLOT_BLOCKS) ? (size_t)s->rank * n : 0;
    unsigned char *out = bufp(op, st->dst) + st->dst_off;
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
    const int p = s->nranks;
    const size_t in = st->count * s->esize * ((st->flags & LOOMI_SLOT_BLOCKS) ? (size_t)p : 1);
    const uint64_t want = slot_word(s->call, s->chk);
    if (!op->slot_wait) {
        /* First visit: publish.  In place, the input is in the slot
         * before anything is written. */
        loom_result_t r = map_slots(e, p);
        if (r != LOOM_SUCCESS) return slot_fail(op, r, -1, "%s", loom_get_last_error());
        op->slot_s = ++e->slot_seq;
        op->slot_next = 0;
        op->slot_wait = 1;
        unsigned char *mine = e->slot_map[s->rank];
        if (in) memcpy(slot_of(e, mine, op->slot_s, in), bufp(op, st->src) + st->src_off, in);
        atomic_store_explicit(word_of(mine, op->slot_s), want, memory_order_release);
    }
    /* Ranks below slot_next have published the call. */
    for (unsigned spins = 0; op->slot_next < p;) {
        const int q = op->slot_next;
        uint64_t v = atomic_load_explicit(word_of(e->slot_map[q], op->slot_s),
                                          memory_order_acquire);
        if (v == want) {
            op->slot_next++;
            e->progressed = 1; /* the deadline counts from the last arrival */
            continue;
        }
        if (slot_mismatch(op, q, v)) return -1;
        if (++spins == SPINS) return 0;
        /* Give the core away between looks when ranks share cores (the
         * rank we wait for may need this one). */
        if (e->oversubscribed) sched_yield();
    }
    op->slot_wait = 0;
    slot_read(op, st, in);
    return 1;
}
