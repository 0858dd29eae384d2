/*
 * calls.c - collective calls: their descriptors and checks, the record of
 * a rank's last calls, probes from stalled ranks, and the verdict on a
 * mismatch (see calls.h).
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "comm/calls.h"
#include "comm/comm.h"
#include "comm/ctrl.h"
#include "compress/compress.h" /* loomi_le64_load/store */
#include "core/internal.h"

/* ---------------------------------------------------------- descriptors */

_Static_assert(LOOMI_COLL_ALLREDUCE == 0 && LOOMI_COLL_REDUCE_SCATTER == 1 &&
                   LOOMI_COLL_ALLTOALLV == 4 && LOOMI_COLL_BROADCAST == 5 &&
                   LOOMI_COLL_REDUCE == 6 && LOOMI_COLL_GATHER == 7 &&
                   LOOMI_COLL_SCATTER == 8 && LOOMI_COLL_BARRIER == 9 &&
                   LOOMI_COLL_GOSSIP == 10,
               "loomi_call_make's numbers (calls.h)");

static int reduces(int coll)
{
    return coll == LOOMI_COLL_ALLREDUCE || coll == LOOMI_COLL_REDUCE_SCATTER ||
           coll == LOOMI_COLL_REDUCE;
}

static int rooted(int coll)
{
    return coll == LOOMI_COLL_BROADCAST || coll == LOOMI_COLL_REDUCE ||
           coll == LOOMI_COLL_GATHER || coll == LOOMI_COLL_SCATTER;
}

static uint64_t word0(const struct loomi_call *d) { return loomi_call_word0(d); }

static struct loomi_call unword(uint64_t w0, uint64_t w1)
{
    struct loomi_call d;
    d.coll = (int)(w0 & 0xff);
    d.dtype = (loom_datatype_t)(w0 >> 8 & 0xff);
    d.op = (loom_op_t)(w0 >> 16 & 0xff);
    d.codec = (int)(w0 >> 24 & 1);
    d.fused = (int)(w0 >> 25 & 1);
    d.root = (int)(int32_t)(uint32_t)(w0 >> 32);
    d.count = w1;
    return d;
}

void loomi_call_str(const struct loomi_call *d, char *buf, size_t n)
{
    const char *cn = d->coll >= 0 && d->coll < LOOMI_NUM_COLLS ? loomi_coll_name(d->coll) : NULL;
    if (!cn) {
        snprintf(buf, n, "an unknown collective (%d)", d->coll);
        return;
    }
    if (d->coll == LOOMI_COLL_BARRIER) {
        snprintf(buf, n, "loom_barrier()");
        return;
    }
    if (d->coll == LOOMI_COLL_GOSSIP && !d->fused) {
        const uint32_t w = (uint32_t)d->root, lo = w & 0xffff, hi = w >> 16;
        char pr[48];
        if (w & UINT32_C(0x80000000))
            snprintf(pr, sizeof pr, "a pair hashed %08x", (unsigned)w);
        else if (lo == hi)
            snprintf(pr, sizeof pr, "rank %u idle", (unsigned)lo);
        else
            snprintf(pr, sizeof pr, "ranks %u and %u paired", (unsigned)lo, (unsigned)hi);
        snprintf(buf, n, "loom_gossip_average(count=%llu, %s, %s)", (unsigned long long)d->count,
                 loomi_dtype_name(d->dtype), pr);
        return;
    }
    const char *cnt = d->coll == LOOMI_COLL_ALLGATHER || d->coll == LOOMI_COLL_GATHER ? "sendcount"
                      : d->coll == LOOMI_COLL_REDUCE_SCATTER || d->coll == LOOMI_COLL_SCATTER
                          ? "recvcount"
                          : "count";
    char a[48] = "", o[24] = "", r[24] = "";
    if (d->fused) {
        const uint64_t low = (UINT64_C(1) << LOOMI_CALL_FUSED_SHIFT) - 1;
        if (reduces(d->coll)) snprintf(o, sizeof o, ", %s", loomi_op_name(d->op));
        snprintf(buf, n,
                 "%llu fused loom_%s calls in a group (%s=%llu in all, %s%s; counts hashed "
                 "%08x)",
                 (unsigned long long)(d->count >> LOOMI_CALL_FUSED_SHIFT), cn, cnt,
                 (unsigned long long)(d->count & low), loomi_dtype_name(d->dtype), o,
                 (unsigned)d->root);
        return;
    }
    if (d->coll != LOOMI_COLL_ALLTOALLV)
        snprintf(a, sizeof a, "%s=%llu, ", cnt, (unsigned long long)d->count);
    if (reduces(d->coll)) snprintf(o, sizeof o, ", %s", loomi_op_name(d->op));
    if (rooted(d->coll)) snprintf(r, sizeof r, ", root=%d", d->root);
    snprintf(buf, n, "loom_%s(%s%s%s%s%s)", cn, a, loomi_dtype_name(d->dtype), o, r,
             d->codec ? ", compressed" : "");
}

/* ------------------------------------------------------------ the record */

static int rec_read(const struct loomi_call_rec *r, uint64_t *no, uint64_t *w0, uint64_t *w1)
{
    struct loomi_call_rec *m = (struct loomi_call_rec *)r;
    uint64_t a = atomic_load_explicit(&m->no, memory_order_acquire);
    /* Acquire loads of the words (loomi_call_rec_put stores them with
     * release) keep the second load of the number after them. */
    *w0 = atomic_load_explicit(&m->w0, memory_order_acquire);
    *w1 = atomic_load_explicit(&m->w1, memory_order_acquire);
    uint64_t b = atomic_load_explicit(&m->no, memory_order_relaxed);
    *no = a;
    return a != 0 && a == b;
}

int loomi_call_get(const struct loom_comm *c, uint64_t no, struct loomi_call *d)
{
    uint64_t got, w0, w1;
    if (!no || !rec_read(&c->calls[no % LOOMI_CALL_HIST], &got, &w0, &w1) || got != no) return 0;
    *d = unword(w0, w1);
    return 1;
}

uint32_t loomi_call_check_of_op(const struct loom_comm *c, uint64_t op)
{
    const uint64_t mask = (UINT64_C(1) << LOOMI_TAG_SEQ_BITS) - 1;
    /* The latest call with these low bits: LOOMI_CALL_HIST divides
     * 2^LOOMI_TAG_SEQ_BITS, so it has the record's slot. */
    uint64_t got, w0, w1;
    if (!rec_read(&c->calls[op % LOOMI_CALL_HIST], &got, &w0, &w1) || (got & mask) != op) return 0;
    struct loomi_call d = unword(w0, w1);
    return loomi_call_check(&d);
}
_Static_assert(((UINT64_C(1) << LOOMI_TAG_SEQ_BITS) % LOOMI_CALL_HIST) == 0,
               "the history's slots follow the tags' operation numbers");

/* --------------------------------------------------------------- wire */

/* A call on the wire: its number, then its two words, little-endian. */
#define ENTRY_BYTES 24

/* A descriptor that came from a peer: in range before it is printed. */
static int sane(const struct loomi_call *d)
{
    return d->coll >= 0 && d->coll < LOOMI_NUM_COLLS && (unsigned)d->dtype < LOOM_NUM_DATATYPES &&
           (unsigned)d->op < LOOM_NUM_OPS;
}

/* ------------------------------------------------------------- probes */

void loomi_calls_probe(struct loom_comm *c, uint64_t no, const int *peers, int npeers)
{
    struct loomi_call d;
    if (!c->ctrl || !loomi_call_get(c, no, &d)) return;
    unsigned char e[ENTRY_BYTES];
    loomi_le64_store(e, no);
    loomi_le64_store(e + 8, word0(&d));
    loomi_le64_store(e + 16, d.count);
    for (int i = 0; i < npeers; i++)
        if (peers[i] >= 0 && peers[i] < c->nranks && peers[i] != c->rank)
            (void)loomi_ctrl_send(c->ctrl, peers[i], LOOMI_CMSG_CALL_PROBE, 0, no, e, sizeof e);
    LOOMI_INFO(c->rank, "collective call %llu has waited %d ms on rank %d%s: asked it which call "
               "it makes", (unsigned long long)no, LOOMI_CALL_STALL_MS, npeers ? peers[0] : -1,
               npeers > 1 ? " and others" : "");
}

void loomi_calls_poll(struct loom_comm *c)
{
    if (!c->ctrl) return;
    unsigned n = loomi_ctrl_mail_count(c->ctrl);
    if (n == c->mail_seen) return;
    c->mail_seen = n;
    struct loomi_cmsg *m;
    while ((m = loomi_ctrl_take(c->ctrl, LOOMI_CMSG_CALL_PROBE, 0)) != NULL) {
        struct loomi_call theirs, mine;
        uint64_t no = m->arg;
        int ok = m->len == ENTRY_BYTES && loomi_le64_load(m->data) == no && m->src >= 0 &&
                 m->src < c->nranks;
        if (ok) {
            theirs = unword(loomi_le64_load(m->data + 8), loomi_le64_load(m->data + 16));
            ok = sane(&theirs);
        }
        if (!ok) {
            LOOMI_WARN(c->rank, "collective calls: a malformed probe from rank %d ignored", m->src);
        } else if (c->error == LOOM_SUCCESS && loomi_call_get(c, no, &mine) &&
                   loomi_call_check(&mine) != loomi_call_check(&theirs)) {
            char a[128], b[128];
            loomi_call_str(&theirs, a, sizeof a);
            loomi_call_str(&mine, b, sizeof b);
            loomi_comm_fail(c, LOOM_ERR_MISMATCH, m->src,
                            "rank %d waits in collective call %llu as %s, which this rank made "
                            "as %s",
                            m->src, (unsigned long long)no, a, b);
        }
        /* Else the call is the same here, or this rank has not made it
         * yet (the prober waits for it, rightly), or made it too long ago
         * to say. */
        free(m);
    }
}

/* ----------------------------------------------------------- verdicts */

/* How many of its last calls a rank sends. */
#define SHOW 8

void loomi_calls_push(struct loom_comm *c)
{
    const uint64_t last = atomic_load_explicit(&c->call_no, memory_order_relaxed);
    if (!c->ctrl || c->calls_pushed == last + 1) return;
    c->calls_pushed = last + 1;
    unsigned char buf[SHOW * ENTRY_BYTES];
    size_t len = 0;
    for (uint64_t k = 0; k < SHOW && k < last; k++) {
        uint64_t no = last - k;
        struct loomi_call d;
        if (!loomi_call_get(c, no, &d)) continue;
        loomi_le64_store(buf + len, no);
        loomi_le64_store(buf + len + 8, word0(&d));
        loomi_le64_store(buf + len + 16, d.count);
        len += ENTRY_BYTES;
    }
    for (int q = 0; q < c->nranks; q++)
        if (q != c->rank)
            (void)loomi_ctrl_send(c->ctrl, q, LOOMI_CMSG_CALL_SHOW, 0, last, buf,
                                  (uint32_t)len);
}

struct shown {
    int n; /* entries, latest first; -1: nothing came */
    uint64_t no[SHOW];
    struct loomi_call d[SHOW];
};

static const struct loomi_call *shown_call(const struct shown *s, uint64_t no)
{
    for (int i = 0; i < s->n; i++)
        if (s->no[i] == no) return &s->d[i];
    return NULL;
}

/* Gossip calls differ between ranks by design (each names its own pair):
 * at call `no`, where every call shown is a gossip call, a rank is in
 * conflict when the partner it names shows another call (another pair,
 * count or datatype).  Returns -1 when some call shown there is not a
 * gossip call, else the number of ranks in conflict; with conf, marks
 * them. */
static int gossip_partner_of(const struct loomi_call *d, int r)
{
    const uint32_t w = (uint32_t)d->root, lo = w & 0xffff, hi = w >> 16;
    if (w & UINT32_C(0x80000000) || lo == hi) return -1; /* hashed or idle */
    return (int)lo == r ? (int)hi : (int)hi == r ? (int)lo : -1;
}

static int gossip_conflicts(const struct shown *sh, int n, uint64_t no, unsigned char *conf)
{
    int any = 0, bad = 0;
    for (int r = 0; r < n; r++) {
        const struct loomi_call *d = shown_call(&sh[r], no);
        if (!d) continue;
        if (d->coll != LOOMI_COLL_GOSSIP || d->fused) return -1;
        any = 1;
    }
    if (!any) return -1;
    for (int r = 0; r < n; r++) {
        const struct loomi_call *d = shown_call(&sh[r], no);
        int p = d ? gossip_partner_of(d, r) : -1;
        const struct loomi_call *e = p >= 0 && p < n ? shown_call(&sh[p], no) : NULL;
        int c = e && loomi_call_check(e) != loomi_call_check(d);
        if (conf) conf[r] = (unsigned char)c;
        bad += c;
    }
    return bad;
}

/* The first call number whose calls differ between the ranks shown (0:
 * none). */
static uint64_t first_difference(const struct shown *sh, int n)
{
    uint64_t best = 0;
    for (int r = 0; r < n; r++)
        for (int i = 0; i < sh[r].n; i++) {
            uint64_t no = sh[r].no[i];
            if (best && no >= best) continue;
            const int gc = gossip_conflicts(sh, n, no, NULL);
            if (gc >= 0) {
                if (gc > 0) best = no;
                continue;
            }
            const struct loomi_call *first = NULL;
            int differ = 0;
            for (int q = 0; q < n && !differ; q++) {
                const struct loomi_call *d = shown_call(&sh[q], no);
                if (!d) continue;
                if (!first) first = d;
                else differ = loomi_call_check(d) != loomi_call_check(first);
            }
            if (differ) best = no;
        }
    return best;
}

/* Whether the ranks yet to show their calls (or to make call `no`)
 * could no longer change which ranks differ from the majority: the
 * largest group of ranks that made one call of `no` outnumbers every
 * other group by more than there are such ranks. */
static int settled(const struct shown *sh, int n, uint64_t no, const unsigned char *failed)
{
    /* Gossip: a conflict between two ranks shown stands whatever the
     * others show. */
    if (gossip_conflicts(sh, n, no, NULL) > 0) return 1;
    enum { MAXG = 6 };
    uint32_t chk[MAXG];
    int size[MAXG], ng = 0, open = 0;
    for (int r = 0; r < n; r++) {
        const struct loomi_call *d = shown_call(&sh[r], no);
        if (!d) {
            open += !failed[r] && (sh[r].n < 0 || (sh[r].n > 0 && sh[r].no[0] < no));
            continue;
        }
        const uint32_t k = loomi_call_check(d);
        int g = 0;
        while (g < ng && chk[g] != k) g++;
        if (g == ng) {
            if (ng == MAXG) return 0;
            chk[ng] = k;
            size[ng++] = 0;
        }
        size[g]++;
    }
    int a = 0, b = 0; /* the largest group, and the next */
    for (int g = 0; g < ng; g++) {
        if (size[g] > a) {
            b = a;
            a = size[g];
        } else if (size[g] > b) {
            b = size[g];
        }
    }
    return ng >= 2 && a > b + open;
}

/* Take one SHOW message into sh: a rank's later showing (it made a call
 * since) replaces its earlier one.  Returns 1 when it was the rank's
 * first. */
static int take_shown(const struct loom_comm *c, struct shown *sh, struct loomi_cmsg *m)
{
    const int n = c->nranks;
    struct shown *s = m->src >= 0 && m->src < n && m->src != c->rank ? &sh[m->src] : NULL;
    int first = 0;
    if (s && m->len % ENTRY_BYTES == 0 && m->len <= SHOW * ENTRY_BYTES &&
        (s->n <= 0 || (m->len && loomi_le64_load(m->data) > s->no[0]))) {
        first = s->n < 0;
        s->n = 0;
        for (uint32_t off = 0; off < m->len; off += ENTRY_BYTES) {
            struct loomi_call d = unword(loomi_le64_load(m->data + off + 8), loomi_le64_load(m->data + off + 16));
            if (!sane(&d)) continue;
            s->no[s->n] = loomi_le64_load(m->data + off);
            s->d[s->n++] = d;
        }
    }
    free(m);
    return first;
}

/* "rank 2", "ranks 0, 1, 3", "ranks 0-5, 7" (the ranks with g[r] == k). */
static void ranks_str(const int *g, int n, int k, char *buf, size_t len)
{
    int count = 0;
    for (int r = 0; r < n; r++) count += g[r] == k;
    size_t u = (size_t)snprintf(buf, len, "%s", count == 1 ? "rank" : "ranks");
    const char *sep = " ";
    for (int r = 0; r < n && u < len; r++) {
        if (g[r] != k) continue;
        int e = r;
        while (e + 1 < n && g[e + 1] == k) e++;
        if (e - r >= 2)
            u += (size_t)snprintf(buf + u, len - u, "%s%d-%d", sep, r, e);
        else if (e > r)
            u += (size_t)snprintf(buf + u, len - u, "%s%d, %d", sep, r, e);
        else
            u += (size_t)snprintf(buf + u, len - u, "%s%d", sep, r);
        sep = ", ";
        r = e;
    }
}

/* The verdict from every rank's calls that came: the first call number
 * whose calls differ between ranks, and who made which. */
static int judge(struct loom_comm *c, const struct shown *sh)
{
    const int n = c->nranks;
    const uint64_t best = first_difference(sh, n);
    if (!best) return 0;
    unsigned char *conf = calloc((size_t)n, 1);
    if (conf && gossip_conflicts(sh, n, best, conf) > 0) {
        /* Gossip: each rank in conflict, with the call its partner made. */
        char msg[sizeof c->errmsg], what[128], theirs[128];
        size_t u = (size_t)snprintf(msg, sizeof msg, "ranks disagree on collective call %llu: ",
                                    (unsigned long long)best);
        int k = 0, first = -1;
        for (int r = 0; r < n && u < sizeof msg; r++) {
            if (!conf[r]) continue;
            const struct loomi_call *d = shown_call(&sh[r], best);
            const int p = gossip_partner_of(d, r);
            const struct loomi_call *e = shown_call(&sh[p], best);
            /* Each conflict once: from its lower rank when both conflict. */
            if (p < r && conf[p] && gossip_partner_of(e, p) == r) continue;
            loomi_call_str(d, what, sizeof what);
            loomi_call_str(e, theirs, sizeof theirs);
            u += (size_t)snprintf(msg + u, sizeof msg - u, "%srank %d called %s but rank %d called %s",
                                  k++ ? "; " : "", r, what, p, theirs);
            if (first < 0) first = r;
        }
        free(conf);
        snprintf(c->errmsg, sizeof c->errmsg, "%s", msg);
        /* Which of two partners erred, nothing here tells. */
        c->failed_rank = -1;
        (void)first;
        return 1;
    }
    free(conf);
    /* Group the ranks by their call of that number. */
    enum { MAXG = 6 };
    int *g = malloc((size_t)n * sizeof *g);
    if (!g) return 0;
    const struct loomi_call *rep[MAXG];
    int size[MAXG], ng = 0, others = 0;
    for (int r = 0; r < n; r++) {
        const struct loomi_call *d = shown_call(&sh[r], best);
        g[r] = -1;
        if (!d) continue;
        int k = 0;
        while (k < ng && loomi_call_check(rep[k]) != loomi_call_check(d)) k++;
        if (k == ng) {
            if (ng == MAXG) {
                others++;
                continue;
            }
            rep[ng] = d;
            size[ng++] = 0;
        }
        g[r] = k;
        size[k]++;
    }
    /* The majority: a group larger than every other. */
    int maj = 0;
    for (int k = 1; k < ng; k++)
        if (size[k] > size[maj]) maj = k;
    for (int k = 0; k < ng; k++)
        if (k != maj && size[k] == size[maj]) maj = -1;
    char msg[sizeof c->errmsg], who[64], what[128];
    size_t u = (size_t)snprintf(msg, sizeof msg, "ranks disagree on collective call %llu: ",
                                (unsigned long long)best);
    int nodd = 0, odd = -1, nodd_ranks = 0;
    for (int k = 0; k < ng && u < sizeof msg; k++) {
        if (k == maj) continue;
        ranks_str(g, n, k, who, sizeof who);
        loomi_call_str(rep[k], what, sizeof what);
        u += (size_t)snprintf(msg + u, sizeof msg - u, "%s%s called %s", nodd++ ? ", " : "", who,
                              what);
    }
    for (int r = 0; r < n; r++)
        if (g[r] >= 0 && g[r] != maj) {
            odd = r;
            nodd_ranks++;
        }
    if (maj >= 0 && u < sizeof msg) {
        ranks_str(g, n, maj, who, sizeof who);
        loomi_call_str(rep[maj], what, sizeof what);
        snprintf(msg + u, sizeof msg - u, " while %s called %s", who, what);
    }
    if (others && strlen(msg) + 40 < sizeof msg)
        snprintf(msg + strlen(msg), sizeof msg - strlen(msg), " (and %d more)", others);
    free(g);
    snprintf(c->errmsg, sizeof c->errmsg, "%s", msg);
    c->failed_rank = maj >= 0 && nodd_ranks == 1 ? odd : -1;
    return 1;
}

int loomi_calls_verdict(struct loom_comm *c, int wait_ms)
{
    if (c->verdict) return c->verdict == 1;
    if (!c->ctrl || c->error != LOOM_ERR_MISMATCH) return 0;
    loomi_calls_push(c);
    const int n = c->nranks;
    struct shown *sh = calloc((size_t)n, sizeof *sh);
    if (!sh) return 0;
    for (int r = 0; r < n; r++) sh[r].n = -1;
    /* This rank's own calls. */
    sh[c->rank].n = 0;
    const uint64_t last = atomic_load_explicit(&c->call_no, memory_order_relaxed);
    for (uint64_t k = 0; k < SHOW && k < last; k++) {
        struct shown *s = &sh[c->rank];
        if (loomi_call_get(c, last - k, &s->d[s->n])) s->no[s->n++] = last - k;
    }
    const uint64_t deadline = loomi_now_ms() + (uint64_t)wait_ms;
    unsigned char *failed = calloc((size_t)n, 1);
    if (!failed) {
        free(sh);
        return 0;
    }
    int missing = n - 1;
    for (;;) {
        struct loomi_cmsg *m;
        while ((m = loomi_ctrl_take(c->ctrl, LOOMI_CMSG_CALL_SHOW, 0)) != NULL)
            missing -= take_shown(c, sh, m);
        /* Ranks known failed send nothing: do not wait for them. */
        if (missing > 0 && loomi_ctrl_failed(c->ctrl, failed, NULL))
            for (int r = 0; r < n; r++)
                if (failed[r] && sh[r].n < 0) {
                    sh[r].n = 0;
                    missing--;
                }
        /* Done once the ranks still to come could change nothing, or
         * when every rank has shown its calls and made the call in
         * question (one that has not shows it once it does). */
        const uint64_t no = first_difference(sh, n);
        if (no && settled(sh, n, no, failed)) break;
        if (missing <= 0) {
            int behind = 0;
            for (int r = 0; r < n && no; r++)
                behind |= sh[r].n > 0 && sh[r].no[0] < no && !failed[r];
            if (!behind) break;
        }
        uint64_t now = loomi_now_ms();
        if (now >= deadline) break;
        m = loomi_ctrl_take(c->ctrl, LOOMI_CMSG_CALL_SHOW, now + 10 < deadline ? now + 10 : deadline);
        if (m) missing -= take_shown(c, sh, m);
    }
    free(failed);
    int found = judge(c, sh);
    free(sh);
    c->verdict = found ? 1 : 2;
    if (found) LOOMI_WARN(c->rank, "%s", c->errmsg);
    return found;
}
