/*
 * stats.c - straggler telemetry: which peer's data comes late, which
 * link is slow (loom_comm_get_stats(3)).
 *
 * Each operation is numbered and timed from its start on this rank (its
 * "arrival").  The first receive from a peer to complete in it tells
 * how late that peer's data came: a rank that enters its calls late
 * shows as late at every rank that receives from it first thing.  Large
 * receives (LOOMI_STATS_TIMED_BYTES) are timed from post to completion,
 * per peer as the union of their intervals, for the link's rate.  A slot
 * operation (slot.c) sees each rank of the host publish: the rank it
 * waited for counts as late by the time it waited; one found at once
 * counts as prompt (a rank found at once after a wait may have come
 * late too: only the last one is sure to be named).
 *
 * What comes late through another rank counts against the rank that
 * sent it: with recursive doubling, a partner that waited for a late
 * rank sends late itself.  Schedules whose first message from each peer
 * depends on nothing (ring, the slots) name the late rank alone.
 *
 * Collectives only: point-to-point operations are not counted (a
 * receiver posting ahead of its sender is the normal case there).
 *
 * Every LOOMI_STATS_WINDOW operations, at LOOM_DEBUG=info, a peer that
 * was the latest in 80% of them, late by more than 5 ms and by more than
 * 3 times the median of the other peers, is named in one line; so is a
 * peer whose link delivered less than a third of the median rate of the
 * others over at least 1 MiB.
 */
#include <stdlib.h>
#include <string.h>

#include "core/hostmap.h"
#include "sched/op.h"
#include "sched/sched.h"

int loomi_stats_init(struct loomi_engine *e, int n)
{
    if (n < 1) return 0;
    struct loomi_stats *S = calloc(1, sizeof *S);
    if (!S) return -1;
    S->n = n;
    S->peer = calloc((size_t)n, sizeof *S->peer);
    S->tmp = calloc((size_t)n, sizeof *S->tmp);
    if (!S->peer || !S->tmp) {
        free(S->peer);
        free(S->tmp);
        free(S);
        return -1;
    }
    e->stats = S;
    return 0;
}

void loomi_stats_free(struct loomi_engine *e)
{
    struct loomi_stats *S = e->stats;
    if (!S) return;
    free(S->peer);
    free(S->tmp);
    free(S);
    e->stats = NULL;
}

void loomi_stats_reset(struct loomi_engine *e)
{
    struct loomi_stats *S = e->stats;
    if (!S) return;
    /* Operation numbers go on: an operation still running keeps its
     * number, which no peer's last_no may then hold. */
    memset(S->peer, 0, (size_t)S->n * sizeof *S->peer);
    S->own_n = S->own_ns = 0;
    S->w_ops = 0;
}

void loomi_stats_op_begin(struct loomi_op *op)
{
    struct loomi_stats *S = op->eng->stats;
    op->stat_no = ++S->opno;
    op->t0_ns = loomi_now_ns();
    op->late_ns = 0;
    op->late_peer = -1;
}

/* Peer p's first data in operation op came `late` ns after its start. */
static void first_data(struct loomi_op *op, struct loomi_peer_acc *a, int p, uint64_t late)
{
    a->late_n++;
    a->late_sum_ns += late;
    if (late > a->late_max_ns) a->late_max_ns = late;
    a->w_n++;
    a->w_late_ns += late;
    if (late > op->late_ns || op->late_peer < 0) {
        op->late_ns = late;
        op->late_peer = p;
    }
}

void loomi_stats_recv(struct loomi_op *op, uint32_t i)
{
    struct loomi_engine *e = op->eng;
    struct loomi_stats *S = e->stats;
    const struct loomi_step *st = &op->s.steps[i];
    const int p = st->peer;
    if (!S || st->kind != LOOMI_STEP_RECV || p < 0 || p >= S->n || p == *e->rank) return;
    struct loomi_peer_acc *a = &S->peer[p];
    const struct loomi_xfer *x = &op->xfers[i];
    /* The first receive from p in op, and the first that was posted at
     * the start (late_no: the operation it was seen in). */
    if (a->last_no != op->stat_no) {
        a->last_no = op->stat_no;
        a->ops++;
    }
    const int first = a->late_no != op->stat_no && x->post_ns == op->t0_ns;
    const int timed = x->len >= LOOMI_STATS_TIMED_BYTES && x->post_ns;
    a->bytes_in += x->len;
    if (!first && !timed) return;
    const uint64_t now = loomi_now_ns();
    if (timed) {
        /* The union of the intervals: receives in flight together count
         * their overlap once. */
        uint64_t from = x->post_ns > a->busy_end ? x->post_ns : a->busy_end;
        if (now > from) {
            a->busy_ns += now - from;
            a->w_busy_ns += now - from;
        }
        if (now > a->busy_end) a->busy_end = now;
        a->timed_bytes += x->len;
        a->w_bytes += x->len;
    }
    if (first) {
        a->late_no = op->stat_no;
        first_data(op, a, p, now > op->t0_ns ? now - op->t0_ns : 0);
    }
}

/* The communicator rank of local rank q of this rank's host (-1: none). */
static int host_rank(const struct loomi_engine *e, int q)
{
    const struct loomi_hostmap *m = e->hosts ? *e->hosts : NULL;
    if (!m) return -1;
    const int h = m->host_of[*e->rank];
    if (q < 0 || q >= loomi_host_size(m, h)) return -1;
    return m->host_ranks[m->host_start[h] + q];
}

static void window_verdict(struct loomi_engine *e);

void loomi_stats_slot_prompt(struct loomi_engine *e, int nlocal, size_t bytes)
{
    struct loomi_stats *S = e->stats;
    if (!S) return;
    for (int q = 0; q < nlocal; q++) {
        const int p = host_rank(e, q);
        if (p < 0 || p >= S->n || p == *e->rank) continue;
        S->peer[p].ops++;
        S->peer[p].bytes_in += bytes;
        S->peer[p].late_n++;
        S->peer[p].w_n++;
    }
    S->own_n++;
    S->opno++;
    if (++S->w_ops >= LOOMI_STATS_WINDOW) window_verdict(e);
}

void loomi_stats_slot_seen(struct loomi_op *op, int from, int to, size_t bytes)
{
    struct loomi_engine *e = op->eng;
    struct loomi_stats *S = e->stats;
    if (!S || from >= to) return;
    const uint64_t now = loomi_now_ns();
    for (int q = from; q < to; q++) {
        const int p = host_rank(e, q);
        if (p < 0 || p >= S->n || p == *e->rank) continue;
        /* The first was waited for; the others were there at once. */
        uint64_t late = q == from && now > op->t0_ns ? now - op->t0_ns : 0;
        S->peer[p].ops++;
        S->peer[p].bytes_in += bytes;
        first_data(op, &S->peer[p], p, late);
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of the n values in v (sorted here); 0 when n is 0. */
static double median(double *v, int n)
{
    if (n <= 0) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* The end of a window: name a straggler or a slow link, then start the
 * next window. */
static void window_verdict(struct loomi_engine *e)
{
    struct loomi_stats *S = e->stats;
    const int me = *e->rank;
    if (loomi_log_level() >= LOOMI_LOG_INFO) {
        int c = -1;
        for (int p = 0; p < S->n; p++)
            if (S->peer[p].w_last && (c < 0 || S->peer[p].w_last > S->peer[c].w_last)) c = p;
        if (c >= 0 && (uint64_t)S->peer[c].w_last * 5 >= (uint64_t)S->w_ops * 4) {
            const struct loomi_peer_acc *a = &S->peer[c];
            const double avg = a->w_n ? (double)a->w_late_ns / a->w_n / 1e6 : 0;
            int k = 0;
            for (int p = 0; p < S->n; p++)
                if (p != c && S->peer[p].w_n)
                    S->tmp[k++] = (double)S->peer[p].w_late_ns / S->peer[p].w_n / 1e6;
            const double med = median(S->tmp, k);
            if (avg > 5.0 && avg > 3 * med)
                LOOMI_INFO(me,
                           "straggler: rank %d was the last to arrive in %u of the last %u "
                           "operations: its data came %.1f ms after this rank's start on "
                           "average (the other peers' median: %.2f ms)",
                           c, a->w_last, S->w_ops, avg, med);
        }
        for (int s = 0; s < S->n; s++) {
            const struct loomi_peer_acc *a = &S->peer[s];
            if (a->w_bytes < (1u << 20) || !a->w_busy_ns) continue;
            const double rate = (double)a->w_bytes / (double)a->w_busy_ns * 1e3; /* MB/s */
            int k = 0;
            for (int p = 0; p < S->n; p++)
                if (p != s && S->peer[p].w_bytes >= (1u << 20) && S->peer[p].w_busy_ns)
                    S->tmp[k++] = (double)S->peer[p].w_bytes / (double)S->peer[p].w_busy_ns * 1e3;
            if (!k) continue;
            const double med = median(S->tmp, k);
            if (rate * 3 < med)
                LOOMI_INFO(me,
                           "slow link: data from rank %d came at %.1f MB/s over the last %u "
                           "operations (%.1f MiB), the other peers' median %.1f MB/s",
                           s, rate, S->w_ops, (double)a->w_bytes / (1 << 20), med);
        }
    }
    for (int p = 0; p < S->n; p++) {
        struct loomi_peer_acc *a = &S->peer[p];
        a->w_last = a->w_n = 0;
        a->w_late_ns = a->w_bytes = a->w_busy_ns = 0;
    }
    S->w_ops = 0;
}

void loomi_stats_op_done(struct loomi_op *op)
{
    struct loomi_engine *e = op->eng;
    struct loomi_stats *S = e->stats;
    op->stat_no = 0;
    if (!S) return;
    /* This rank's wait: for its latest peer (no clock read here). */
    S->own_n++;
    S->own_ns += op->late_ns;
    if (op->late_peer >= 0 && op->late_peer < S->n) S->peer[op->late_peer].w_last++;
    if (++S->w_ops >= LOOMI_STATS_WINDOW) window_verdict(e);
}
