/*
 * validate.c - checks all ranks' schedules of one collective together,
 * without running them: ranges, message matching, deadlock freedom
 * and (optionally) data hazards inside each rank.
 *
 * Deadlock: the DAGs are executed symbolically with rendezvous semantics
 * (a send and its receive complete together once both are runnable), the
 * strictest a transport can be; the engine posts every ready transfer at
 * once, so a schedule that finishes here finishes on any transport.
 * Every step is visited once, messages are matched through a hash on
 * (src, dst, tag), so the whole check is linear in the number of steps.
 *
 * Hazards: steps of a rank are visited in index order (a topological
 * order, since dependencies point backwards).  Per byte range we keep the
 * last writer and the readers since; a step must be ordered after the
 * last writer of what it touches, and a writer after those readers too.
 * Checking only these neighbours suffices by transitivity.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "coll/build.h"
#include "coll/validate.h"

#define NONE UINT32_MAX
/* Reachability searches of the hazard check, per validation. */
#define HAZARD_BUDGET (64u * 1000 * 1000)

struct vctx {
    const struct loomi_sched *S;
    int p;
    const struct loomi_validate_opts *o;
    size_t *base; /* first global step id of each rank; base[p] = total */
    char *msg;
    size_t len;
};

/* Fails the check, keeping the text for the caller's msg too. */
static loom_result_t vfail(struct vctx *v, const char *fmt, ...) LOOMI_PRINTF(2, 3);
static loom_result_t vfail(struct vctx *v, const char *fmt, ...)
{
    char tmp[3072];
    LOOMI_VFORMAT(tmp, fmt);
    if (v->msg && v->len) snprintf(v->msg, v->len, "%s", tmp);
    return loomi_fail(LOOM_ERR_INTERNAL, -1, "schedule check: %s", tmp);
}

static const char *buf_name(int b)
{
    static const char *const n[] = {"SEND", "RECV", "SCRATCH"};
    if (b >= LOOMI_BUF_SHARED) return "SHARED";
    return b >= 0 && b < LOOMI_NBUFS ? n[b] : "?";
}

/* "step 12 (send to rank 3, tag 7, 16 elements from RECV+64)" */
static char *step_str(const struct loomi_sched *s, uint32_t i, char *b, size_t n)
{
    const struct loomi_step *st = &s->steps[i];
    switch (st->kind) {
    case LOOMI_STEP_SEND:
        snprintf(b, n, "step %u (send to rank %d, tag %u, %zu elements from %s+%zu)", i, st->peer,
                 st->tag, st->count, buf_name(st->src), st->src_off);
        break;
    case LOOMI_STEP_RECV:
        snprintf(b, n, "step %u (receive from rank %d, tag %u, %zu elements into %s+%zu)", i,
                 st->peer, st->tag, st->count, buf_name(st->dst), st->dst_off);
        break;
    case LOOMI_STEP_REDUCE:
        snprintf(b, n, "step %u (reduce %s+%zu = %s+%zu op %s+%zu, %zu elements)", i,
                 buf_name(st->dst), st->dst_off, buf_name(st->src), st->src_off,
                 buf_name(st->src2), st->src2_off, st->count);
        break;
    case LOOMI_STEP_COPY:
        if (st->flags & LOOMI_COPY_SAVE)
            snprintf(b, n, "step %u (copy %s+%zu = %s+%zu, saving it to %s+%zu, %zu elements)",
                     i, buf_name(st->dst), st->dst_off, buf_name(st->src), st->src_off,
                     buf_name(st->src2), st->src2_off, st->count);
        else if (st->flags & LOOMI_COPY_ALSO)
            snprintf(b, n, "step %u (copy %s+%zu = %s+%zu = %s+%zu, %zu elements)", i,
                     buf_name(st->dst), st->dst_off, buf_name(st->src2), st->src2_off,
                     buf_name(st->src), st->src_off, st->count);
        else
            snprintf(b, n, "step %u (copy %s+%zu = %s+%zu, %zu elements%s)", i,
                     buf_name(st->dst), st->dst_off, buf_name(st->src), st->src_off, st->count,
                     (st->flags & LOOMI_COPY_STREAM) ? ", streamed" : "");
        break;
    case LOOMI_STEP_AVG:
        snprintf(b, n, "step %u (avg %s+%zu, %zu elements)", i, buf_name(st->dst), st->dst_off,
                 st->count);
        break;
    case LOOMI_STEP_REDUCE_SHARED:
        snprintf(b, n,
                 "step %u (reduce %s+%zu = %s+%zu op every arena but %d at +%zu, %zu elements%s)",
                 i, buf_name(st->dst), st->dst_off, buf_name(st->src), st->src_off, st->peer,
                 st->src2_off, st->count,
                 (st->flags & LOOMI_RS_SAVE)   ? ", saving it to SCRATCH"
                 : (st->flags & LOOMI_RS_PUSH) ? ", pushed to every window"
                 : (st->flags & LOOMI_RS_KEEP) ? ", kept in its arena"
                                               : "");
        break;
    case LOOMI_STEP_EXPECT:
        snprintf(b, n, "step %u (expect %s+%zu = %s+%zu from rank %d, %zu elements)", i,
                 buf_name(st->src), st->src_off, buf_name(st->src2), st->src2_off, st->peer,
                 st->count);
        break;
    case LOOMI_STEP_ENCODE:
        snprintf(b, n, "step %u (encode %s+%zu = %s+%zu, %zu values%s%s)", i, buf_name(st->dst),
                 st->dst_off, buf_name(st->src), st->src_off, st->count,
                 (st->flags & LOOMI_ENC_DECODED) ? ", decoded back" : "",
                 (st->flags & LOOMI_ENC_EF) ? ", error feedback" : "");
        break;
    case LOOMI_STEP_DECODE:
    case LOOMI_STEP_DECODE_ACC:
        snprintf(b, n, "step %u (decode%s %s+%zu = %s+%zu, %zu values)", i,
                 st->kind == LOOMI_STEP_DECODE ? "" : "-accumulate", buf_name(st->dst),
                 st->dst_off, buf_name(st->src), st->src_off, st->count);
        break;
    default:
        snprintf(b, n, "step %u (kind %d)", i, st->kind);
    }
    return b;
}

/* Bytes of an encoded slot of a step's count (0: no codec, or too big). */
static size_t slot_of(const struct loomi_sched *s, const struct loomi_step *st)
{
    return s->codec ? loomi_codec_slot_bytes(s->codec, st->count) : 0;
}

static int in_range(const struct loomi_sched *s, int buf, size_t off, size_t bytes)
{
    if (buf >= LOOMI_BUF_SHARED && buf < LOOMI_BUF_SHARED + s->nshared)
        return off <= s->shared_bytes && bytes <= s->shared_bytes - off;
    if (buf < 0 || buf >= LOOMI_NBUFS) return 0;
    return off <= s->buf_bytes[buf] && bytes <= s->buf_bytes[buf] - off;
}

/* Where (buf, off) lives: in-place reduce_scatter's RECV is part of SEND. */
static void place(const struct vctx *v, const struct loomi_sched *s, int buf, size_t off,
                  int *space, size_t *addr)
{
    if (buf == LOOMI_BUF_RECV && v->o && v->o->recv_in_send) {
        *space = LOOMI_BUF_SEND;
        *addr = off + (size_t)s->rank * s->buf_bytes[LOOMI_BUF_RECV];
    } else {
        *space = buf;
        *addr = off;
    }
}

/* Places both ranges (*aa, *ba); 1 when they are in the same space. */
static int same_space(const struct vctx *v, const struct loomi_sched *s, int ab, size_t aoff,
                      size_t *aa, int bb, size_t boff, size_t *ba)
{
    int as, bs;
    place(v, s, ab, aoff, &as, aa);
    place(v, s, bb, boff, &bs, ba);
    return as == bs;
}

/* A local step reading `sb` and writing `db` must use the same range or
 * disjoint ones (the kernels allow dst == src, memcpy nothing else). */
static int overlap_ok(const struct vctx *v, const struct loomi_sched *s, int db, size_t doff,
                      int sb, size_t soff, size_t bytes)
{
    size_t da, sa;
    if (!same_space(v, s, db, doff, &da, sb, soff, &sa) || !bytes || da == sa) return 1;
    return da + bytes <= sa || sa + bytes <= da;
}

/* The step writes src2 + src2_off as a second destination. */
static int writes_src2(const struct loomi_step *st)
{
    return (st->kind == LOOMI_STEP_ENCODE && (st->flags & LOOMI_ENC_DECODED)) ||
           (st->kind == LOOMI_STEP_COPY && (st->flags & (LOOMI_COPY_ALSO | LOOMI_COPY_SAVE)));
}

/* The two ranges share a byte (identical ones included). */
static int ranges_meet(const struct vctx *v, const struct loomi_sched *s, int ab, size_t aoff,
                       int bb, size_t boff, size_t bytes)
{
    size_t aa, ba;
    return same_space(v, s, ab, aoff, &aa, bb, boff, &ba) && bytes && aa < ba + bytes &&
           ba < aa + bytes;
}

/* ---------------------------------------------------- per-step checks */

static loom_result_t check_steps(struct vctx *v)
{
    char d[256];
    const struct loomi_sched *S = v->S;
    for (int r = 0; r < v->p; r++) {
        const struct loomi_sched *s = &S[r];
        if (s->rank != r || s->nranks != v->p)
            return vfail(v, "schedule %d is for rank %d of %d, not rank %d of %d", r, s->rank,
                         s->nranks, r, v->p);
        if (s->dtype != S[0].dtype || s->op != S[0].op || s->esize != S[0].esize || !s->esize)
            return vfail(v, "rank %d: datatype/op (%d/%d) differ from rank 0's (%d/%d)", r,
                         (int)s->dtype, (int)s->op, (int)S[0].dtype, (int)S[0].op);
        if (!s->ok)
            return vfail(v, "rank %d: the schedule was not built completely (out of memory, a "
                         "forward dependency or more than %d dependencies)", r, LOOMI_MAX_DEPS);
        if (s->nsteps && (!s->steps || !s->ndeps || !s->deps))
            return vfail(v, "rank %d: schedule has %u steps but no step arrays", r, s->nsteps);
        if (v->o && v->o->send_limit && s->buf_bytes[LOOMI_BUF_SEND] > v->o->send_limit[r])
            return vfail(v, "rank %d: the schedule uses %zu bytes of SEND, the caller's buffer "
                         "has %zu", r, s->buf_bytes[LOOMI_BUF_SEND], v->o->send_limit[r]);
        if (v->o && v->o->recv_limit && s->buf_bytes[LOOMI_BUF_RECV] > v->o->recv_limit[r])
            return vfail(v, "rank %d: the schedule uses %zu bytes of RECV, the caller's buffer "
                         "has %zu", r, s->buf_bytes[LOOMI_BUF_RECV], v->o->recv_limit[r]);
        for (uint32_t i = 0; i < s->nsteps; i++) {
            const struct loomi_step *st = &s->steps[i];
            if (s->ndeps[i] > LOOMI_MAX_DEPS)
                return vfail(v, "rank %d %s has %u dependencies", r, step_str(s, i, d, sizeof d),
                             s->ndeps[i]);
            for (int k = 0; k < s->ndeps[i]; k++)
                if (s->deps[i][k] >= i)
                    return vfail(v, "rank %d %s depends on later step %u", r,
                                 step_str(s, i, d, sizeof d), s->deps[i][k]);
            if (st->count > SIZE_MAX / s->esize)
                return vfail(v, "rank %d %s: count overflows", r, step_str(s, i, d, sizeof d));
            size_t bytes = st->count * s->esize;
            const char *why = NULL;
            const int bad_peer = st->peer < 0 || st->peer >= v->p || st->peer == r;
            /* One case per step kind, alike on purpose: each spells out
             * which ranges that kind reads and writes. */
            switch (st->kind) {
            case LOOMI_STEP_SEND:
                if (!in_range(s, st->src, st->src_off, bytes)) why = "reads outside its buffer";
                else if (bad_peer) why = "names a bad peer";
                break;
            case LOOMI_STEP_RECV:
                if (!in_range(s, st->dst, st->dst_off, bytes)) why = "writes outside its buffer";
                else if (bad_peer) why = "names a bad peer";
                break;
            case LOOMI_STEP_REDUCE:
                if (!in_range(s, st->src, st->src_off, bytes) ||
                    !in_range(s, st->src2, st->src2_off, bytes))
                    why = "reads outside its buffer";
                else if (!in_range(s, st->dst, st->dst_off, bytes))
                    why = "writes outside its buffer";
                else if (!overlap_ok(v, s, st->dst, st->dst_off, st->src, st->src_off, bytes) ||
                         !overlap_ok(v, s, st->dst, st->dst_off, st->src2, st->src2_off, bytes))
                    why = "writes a range that partly overlaps an input";
                break;
            case LOOMI_STEP_COPY: {
                int also = (st->flags & (LOOMI_COPY_ALSO | LOOMI_COPY_SAVE)) != 0;
                if (!in_range(s, st->src, st->src_off, bytes)) why = "reads outside its buffer";
                else if (!in_range(s, st->dst, st->dst_off, bytes) ||
                         (also && !in_range(s, st->src2, st->src2_off, bytes)))
                    why = "writes outside its buffer";
                else if (!overlap_ok(v, s, st->dst, st->dst_off, st->src, st->src_off, bytes))
                    why = "copies between partly overlapping ranges";
                /* The two copies are written in one pass: neither may
                 * touch the source or the other. */
                else if (also && (ranges_meet(v, s, st->src2, st->src2_off, st->src, st->src_off,
                                              bytes) ||
                                  ranges_meet(v, s, st->src2, st->src2_off, st->dst, st->dst_off,
                                              bytes)))
                    why = "writes its second copy over its source or its first copy";
                break;
            }
            case LOOMI_STEP_AVG:
                if (!in_range(s, st->dst, st->dst_off, bytes)) why = "writes outside its buffer";
                break;
            case LOOMI_STEP_REDUCE_SHARED:
                if (s->nshared < 2 || st->peer < 0 || st->peer >= s->nshared)
                    why = "names a bad arena";
                else if (!in_range(s, st->src, st->src_off, bytes) ||
                         !in_range(s, LOOMI_BUF_SHARED, st->src2_off, bytes))
                    why = "reads outside its buffer";
                else if (!in_range(s, st->dst, st->dst_off, bytes) ||
                         ((st->flags & LOOMI_RS_SAVE) &&
                          !in_range(s, LOOMI_BUF_SCRATCH, st->dst_off, bytes)) ||
                         ((st->flags & LOOMI_RS_PUSH) &&
                          (st->dst_off > SIZE_MAX - s->win_push_off ||
                           !in_range(s, LOOMI_BUF_SHARED, s->win_push_off + st->dst_off, bytes))))
                    why = "writes outside its buffer";
                else if (!overlap_ok(v, s, st->dst, st->dst_off, st->src, st->src_off, bytes))
                    why = "writes a range that partly overlaps an input";
                else if ((st->flags & LOOMI_RS_SAVE) &&
                         (st->dst == LOOMI_BUF_SCRATCH || st->src == LOOMI_BUF_SCRATCH))
                    why = "saves into the buffer it works on";
                break;
            case LOOMI_STEP_EXPECT:
                if (!in_range(s, st->src, st->src_off, bytes) ||
                    !in_range(s, st->src2, st->src2_off, bytes))
                    why = "reads outside its buffer";
                else if (bad_peer) why = "names a bad peer";
                break;
            case LOOMI_STEP_ENCODE:
            case LOOMI_STEP_DECODE:
            case LOOMI_STEP_DECODE_ACC: {
                size_t sb = slot_of(s, st);
                int enc = st->kind == LOOMI_STEP_ENCODE;
                int two = !enc || (st->flags & LOOMI_ENC_DECODED);
                if (!sb || s->dtype != LOOM_FLOAT32) why = "has no codec for fp32 data";
                else if (!in_range(s, st->src, st->src_off, enc ? bytes : sb))
                    why = "reads outside its buffer";
                else if (!in_range(s, st->dst, st->dst_off, enc ? sb : bytes) ||
                         (enc && two && !in_range(s, st->src2, st->src2_off, bytes)))
                    why = "writes outside its buffer";
                else if (st->kind == LOOMI_STEP_DECODE_ACC &&
                         (!in_range(s, st->src2, st->src2_off, bytes) ||
                          !overlap_ok(v, s, st->dst, st->dst_off, st->src2, st->src2_off, bytes)))
                    why = "accumulates onto a bad range";
                break;
            }
            default:
                why = "has an unknown kind";
            }
            if (!why && ((st->kind != LOOMI_STEP_SEND && st->kind != LOOMI_STEP_EXPECT &&
                          st->dst == LOOMI_BUF_SEND) ||
                         (writes_src2(st) && st->src2 == LOOMI_BUF_SEND)))
                why = "writes SEND (the caller's read-only buffer)";
            if (why)
                return vfail(v, "rank %d %s %s (extents SEND %zu, RECV %zu, SCRATCH %zu bytes)",
                             r, step_str(s, i, d, sizeof d), why, s->buf_bytes[0],
                             s->buf_bytes[1], s->buf_bytes[2]);
        }
    }
    return LOOM_SUCCESS;
}

/* ------------------------------------------------------------ matching */

struct msg {
    int32_t src, dst;
    uint32_t tag;
    uint32_t snd, rcv; /* global step ids, NONE when absent */
};

struct table {
    struct msg *e;
    size_t mask;
};

static struct msg *lookup(struct table *t, int src, int dst, uint32_t tag, int insert)
{
    uint64_t h = ((uint64_t)(uint32_t)src * 0x9e3779b97f4a7c15ull) ^
                 ((uint64_t)(uint32_t)dst * 0xc2b2ae3d27d4eb4full) ^
                 ((uint64_t)tag * 0x165667b19e3779f9ull);
    h ^= h >> 31;
    for (size_t i = (size_t)h & t->mask;; i = (i + 1) & t->mask) {
        struct msg *m = &t->e[i];
        if (m->src < 0) {
            if (!insert) return NULL;
            *m = (struct msg){src, dst, tag, NONE, NONE};
            return m;
        }
        if (m->src == src && m->dst == dst && m->tag == tag) return m;
    }
}

/* Rank and step of a global id. */
static void locate(const struct vctx *v, uint32_t g, int *r, uint32_t *i)
{
    int lo = 0, hi = v->p - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (v->base[mid] <= g) lo = mid;
        else hi = mid - 1;
    }
    *r = lo;
    *i = (uint32_t)(g - v->base[lo]);
}

static loom_result_t match_messages(struct vctx *v, uint32_t *partner, size_t *nmsg)
{
    const struct loomi_sched *S = v->S;
    size_t n = 0;
    for (int r = 0; r < v->p; r++)
        for (uint32_t i = 0; i < S[r].nsteps; i++)
            n += S[r].steps[i].kind == LOOMI_STEP_SEND || S[r].steps[i].kind == LOOMI_STEP_RECV;
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    struct table t = {malloc(cap * sizeof *t.e), cap - 1};
    if (!t.e) return loomi_fail(LOOM_ERR_NO_MEMORY, -1, "schedule check: out of memory");
    for (size_t i = 0; i < cap; i++) t.e[i].src = -1;
    loom_result_t rc = LOOM_SUCCESS;
    char d1[256], d2[256];
    /* Pass 1: enter every send and receive; a second one with the same
     * key is a duplicate (peer, tag) in that direction. */
    for (int r = 0; r < v->p && rc == LOOM_SUCCESS; r++) {
        const struct loomi_sched *s = &S[r];
        for (uint32_t i = 0; i < s->nsteps && rc == LOOM_SUCCESS; i++) {
            const struct loomi_step *st = &s->steps[i];
            uint32_t g = (uint32_t)(v->base[r] + i);
            partner[g] = NONE;
            if (st->kind == LOOMI_STEP_SEND) {
                struct msg *m = lookup(&t, r, st->peer, st->tag, 1);
                if (m->snd != NONE)
                    rc = vfail(v, "rank %d sends twice to rank %d with tag %u: %s and %s", r,
                               st->peer, st->tag,
                               step_str(s, (uint32_t)(m->snd - v->base[r]), d1, sizeof d1),
                               step_str(s, i, d2, sizeof d2));
                m->snd = g;
            } else if (st->kind == LOOMI_STEP_RECV) {
                struct msg *m = lookup(&t, st->peer, r, st->tag, 1);
                if (m->rcv != NONE)
                    rc = vfail(v, "rank %d receives twice from rank %d with tag %u: %s and %s",
                               r, st->peer, st->tag,
                               step_str(s, (uint32_t)(m->rcv - v->base[r]), d1, sizeof d1),
                               step_str(s, i, d2, sizeof d2));
                m->rcv = g;
            }
        }
    }
    /* Pass 2, in step order so the first report is the lowest rank's. */
    for (int r = 0; r < v->p && rc == LOOM_SUCCESS; r++) {
        const struct loomi_sched *s = &S[r];
        for (uint32_t i = 0; i < s->nsteps && rc == LOOM_SUCCESS; i++) {
            const struct loomi_step *st = &s->steps[i];
            uint32_t g = (uint32_t)(v->base[r] + i);
            if (st->kind == LOOMI_STEP_SEND) {
                struct msg *m = lookup(&t, r, st->peer, st->tag, 0);
                if (m->rcv == NONE) {
                    rc = vfail(v, "rank %d %s has no matching receive on rank %d", r,
                               step_str(s, i, d1, sizeof d1), st->peer);
                    break;
                }
                int q;
                uint32_t j;
                locate(v, m->rcv, &q, &j);
                const struct loomi_step *rt = &S[q].steps[j];
                if (rt->count != st->count) {
                    rc = vfail(v, "rank %d %s sends %zu elements, rank %d %s receives %zu", r,
                               step_str(s, i, d1, sizeof d1), st->count, q,
                               step_str(&S[q], j, d2, sizeof d2), rt->count);
                    break;
                }
                partner[g] = m->rcv;
                partner[m->rcv] = g;
            } else if (st->kind == LOOMI_STEP_RECV) {
                struct msg *m = lookup(&t, st->peer, r, st->tag, 0);
                if (m->snd == NONE)
                    rc = vfail(v, "rank %d %s has no matching send on rank %d", r,
                               step_str(s, i, d1, sizeof d1), st->peer);
            }
        }
    }
    free(t.e);
    *nmsg = n / 2;
    return rc;
}

/* ------------------------------------------------------------ deadlock */

static loom_result_t run_symbolic(struct vctx *v, const uint32_t *partner)
{
    const struct loomi_sched *S = v->S;
    const size_t N = v->base[v->p];
    size_t E = 0;
    for (int r = 0; r < v->p; r++)
        for (uint32_t i = 0; i < S[r].nsteps; i++) E += S[r].ndeps[i];
    uint32_t *start = calloc(N + 1, sizeof *start);
    uint32_t *succ = malloc((E ? E : 1) * sizeof *succ);
    uint32_t *pending = malloc((N ? N : 1) * sizeof *pending);
    uint32_t *queue = malloc((N ? N : 1) * sizeof *queue);
    uint8_t *state = calloc(N ? N : 1, 1); /* 0 waiting, 1 posted, 2 done */
    uint8_t *kind = malloc(N ? N : 1);
    if (!start || !succ || !pending || !queue || !state || !kind) {
        free(kind);
        free(start);
        free(succ);
        free(pending);
        free(queue);
        free(state);
        return loomi_fail(LOOM_ERR_NO_MEMORY, -1, "schedule check: out of memory");
    }
    /* Successors in CSR form over global ids. */
    for (int r = 0; r < v->p; r++)
        for (uint32_t i = 0; i < S[r].nsteps; i++)
            for (int k = 0; k < S[r].ndeps[i]; k++) start[v->base[r] + S[r].deps[i][k] + 1]++;
    for (size_t g = 0; g < N; g++) start[g + 1] += start[g];
    uint32_t *fill = queue; /* reuse: the queue is not needed yet */
    memcpy(fill, start, N * sizeof *fill);
    for (int r = 0; r < v->p; r++)
        for (uint32_t i = 0; i < S[r].nsteps; i++)
            for (int k = 0; k < S[r].ndeps[i]; k++)
                succ[fill[v->base[r] + S[r].deps[i][k]]++] = (uint32_t)(v->base[r] + i);
    size_t qh = 0, qt = 0, ndone = 0;
    for (int r = 0; r < v->p; r++)
        for (uint32_t i = 0; i < S[r].nsteps; i++) {
            uint32_t g = (uint32_t)(v->base[r] + i);
            kind[g] = S[r].steps[i].kind;
            pending[g] = S[r].ndeps[i];
            if (!pending[g]) queue[qt++] = g;
        }
    while (qh < qt) {
        uint32_t g = queue[qh++];
        uint8_t k = kind[g];
        uint32_t fin[2] = {g, NONE};
        if (k == LOOMI_STEP_SEND || k == LOOMI_STEP_RECV) {
            state[g] = 1;
            uint32_t q = partner[g];
            if (state[q] != 1) continue; /* waits for its partner */
            fin[1] = q;
        }
        for (int f = 0; f < 2 && fin[f] != NONE; f++) {
            state[fin[f]] = 2;
            ndone++;
            for (uint32_t e = start[fin[f]]; e < start[fin[f] + 1]; e++)
                if (--pending[succ[e]] == 0) queue[qt++] = succ[e];
        }
    }
    loom_result_t rc = LOOM_SUCCESS;
    if (ndone < N) {
        /* Every stuck step waits for another stuck one (an unfinished
         * dependency, or its partner): follow those links to a cycle. */
        uint32_t *mark = pending; /* no longer needed: walk positions */
        for (size_t g = 0; g < N; g++) mark[g] = NONE;
        uint32_t first = NONE;
        for (size_t g = 0; g < N && first == NONE; g++)
            if (state[g] == 1) first = (uint32_t)g;
        for (size_t g = 0; g < N && first == NONE; g++)
            if (state[g] != 2) first = (uint32_t)g;
        uint32_t *walk = queue;
        uint32_t len = 0, g = first;
        while (mark[g] == NONE) {
            mark[g] = len;
            walk[len++] = g;
            int r;
            uint32_t i;
            locate(v, g, &r, &i);
            uint32_t next = NONE;
            if (state[g] == 1) {
                next = partner[g];
            } else {
                for (int k = 0; k < S[r].ndeps[i]; k++)
                    if (state[v->base[r] + S[r].deps[i][k]] != 2) {
                        next = (uint32_t)(v->base[r] + S[r].deps[i][k]);
                        break;
                    }
            }
            if (next == NONE) break; /* cannot happen: stuck steps wait on something */
            g = next;
        }
        char cyc[2048], d[256];
        size_t o = 0;
        uint32_t from = mark[g] == NONE ? 0 : mark[g], shown = 0;
        int prev_rank = -1;
        for (uint32_t k = from; k < len && o < sizeof cyc && shown < 10; k++, shown++) {
            int r, n;
            uint32_t i;
            locate(v, walk[k], &r, &i);
            step_str(&S[r], i, d, sizeof d);
            if (k == from) n = snprintf(cyc + o, sizeof cyc - o, "rank %d %s", r, d);
            else if (r == prev_rank) n = snprintf(cyc + o, sizeof cyc - o, " -> after its %s", d);
            else n = snprintf(cyc + o, sizeof cyc - o, " -> needs rank %d %s", r, d);
            if (n > 0) o += (size_t)n;
            prev_rank = r;
        }
        if (len - from > shown && o < sizeof cyc)
            snprintf(cyc + o, sizeof cyc - o, " -> ... (%u steps in the cycle)", len - from);
        else if (o < sizeof cyc)
            snprintf(cyc + o, sizeof cyc - o, " -> back to the first");
        rc = vfail(v, "deadlock: %zu of %zu steps can never run; cycle: %s", N - ndone, N, cyc);
    }
    free(start);
    free(succ);
    free(pending);
    free(queue);
    free(state);
    free(kind);
    return rc;
}

/* ------------------------------------------------------------- hazards */

struct access {
    uint32_t step;
    int space;
    size_t lo, hi;
    int write;
};

struct reader {
    uint32_t step;
    int32_t next;
};

struct hz {
    const struct loomi_sched *s;
    uint32_t *stamp, cur;
    uint32_t *stack;
    uint64_t budget, queries;
    int truncated;
};

/* Does step a come before step b (a < b) in the DAG? */
static int reaches(struct hz *h, uint32_t a, uint32_t b)
{
    if (a == b) return 1;
    if (a > b) return 0;
    h->queries++;
    if (++h->cur == 0) {
        memset(h->stamp, 0, h->s->nsteps * sizeof *h->stamp);
        h->cur = 1;
    }
    uint32_t sp = 0;
    h->stack[sp++] = b;
    h->stamp[b] = h->cur;
    while (sp) {
        uint32_t x = h->stack[--sp];
        if (h->budget) h->budget--;
        for (int k = 0; k < h->s->ndeps[x]; k++) {
            uint32_t y = h->s->deps[x][k];
            if (y == a) return 1;
            if (y < a || h->stamp[y] == h->cur) continue;
            h->stamp[y] = h->cur;
            h->stack[sp++] = y;
        }
    }
    return 0;
}

/* LSD radix sort of n offsets (tmp: n more): qsort's callbacks were a
 * good part of the whole check on schedules of a million steps. */
static void sort_offsets(size_t *a, size_t *tmp, size_t n)
{
    size_t max = 0;
    for (size_t i = 0; i < n; i++) max = a[i] > max ? a[i] : max;
    for (unsigned shift = 0; shift < 64 && (max >> shift); shift += 11) {
        size_t count[2048 + 1] = {0};
        for (size_t i = 0; i < n; i++) count[((a[i] >> shift) & 2047) + 1]++;
        for (int d = 0; d < 2048; d++) count[d + 1] += count[d];
        for (size_t i = 0; i < n; i++) tmp[count[(a[i] >> shift) & 2047]++] = a[i];
        memcpy(a, tmp, n * sizeof *a);
    }
}

static size_t find_bound(const size_t *b, size_t n, size_t x)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (b[mid] < x) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static void add_access(const struct vctx *v, const struct loomi_sched *s, struct access *a,
                       size_t *n, uint32_t step, int buf, size_t off, size_t bytes, int write)
{
    struct access *x = &a[(*n)++];
    x->step = step;
    place(v, s, buf, off, &x->space, &x->lo);
    x->hi = x->lo + bytes;
    x->write = write;
}

static loom_result_t hazard_conflict(struct vctx *v, const struct loomi_sched *s, uint32_t a,
                                     uint32_t b, const char *what)
{
    char d1[256], d2[256];
    return vfail(v, "hazard on rank %d: %s and %s are unordered in its DAG but %s", s->rank,
                 step_str(s, a, d1, sizeof d1), step_str(s, b, d2, sizeof d2), what);
}

static loom_result_t check_hazards_rank(struct vctx *v, const struct loomi_sched *s,
                                        struct hz *h)
{
    loom_result_t rc = LOOM_SUCCESS;
    size_t na = 0, cap = (size_t)s->nsteps * 3 + 1;
    struct access *acc = malloc(cap * sizeof *acc);
    size_t *bounds = malloc(4 * cap * sizeof *bounds); /* and the sort's scratch */
    uint32_t *writer = NULL;
    int32_t *rhead = NULL;
    struct reader *rpool = NULL;
    size_t nr = 0, rcap = 0;
    h->s = s;
    h->stamp = calloc(s->nsteps + 1, sizeof *h->stamp);
    h->stack = malloc((s->nsteps + 1) * sizeof *h->stack);
    h->cur = 0;
    if (!acc || !bounds || !h->stamp || !h->stack) goto nomem;
    for (uint32_t i = 0; i < s->nsteps; i++) {
        struct loomi_access x[LOOMI_MAX_ACCESS];
        int nx = loomi_step_accesses(s, &s->steps[i], x);
        for (int k = 0; k < nx; k++)
            add_access(v, s, acc, &na, i, x[k].buf, x[k].off, x[k].bytes, x[k].write);
    }
    /* Elementary ranges: every boundary of every access, per space. */
    size_t nb_space[LOOMI_NBUFS] = {0}, nbt = 0;
    size_t off_space[LOOMI_NBUFS + 1];
    for (int sp = 0; sp < LOOMI_NBUFS; sp++) {
        off_space[sp] = nbt;
        size_t first = nbt;
        for (size_t k = 0; k < na; k++)
            if (acc[k].space == sp) {
                bounds[nbt++] = acc[k].lo;
                bounds[nbt++] = acc[k].hi;
            }
        sort_offsets(bounds + first, bounds + 2 * cap, nbt - first);
        size_t u = first;
        for (size_t k = first; k < nbt; k++)
            if (u == first || bounds[u - 1] != bounds[k]) bounds[u++] = bounds[k];
        nbt = u;
        nb_space[sp] = nbt - first;
    }
    off_space[LOOMI_NBUFS] = nbt;
    writer = malloc((nbt + 1) * sizeof *writer);
    rhead = malloc((nbt + 1) * sizeof *rhead);
    if (!writer || !rhead) goto nomem;
    for (size_t k = 0; k < nbt; k++) {
        writer[k] = NONE;
        rhead[k] = -1;
    }
    /* Accesses are grouped by step in index order (a topological order). */
    for (size_t k0 = 0; k0 < na && rc == LOOM_SUCCESS;) {
        size_t k1 = k0;
        while (k1 < na && acc[k1].step == acc[k0].step) k1++;
        uint32_t j = acc[k0].step;
        /* Check against what came before... */
        for (size_t k = k0; k < k1 && rc == LOOM_SUCCESS; k++) {
            const struct access *a = &acc[k];
            const size_t *b = bounds + off_space[a->space];
            size_t e0 = find_bound(b, nb_space[a->space], a->lo);
            size_t e1 = find_bound(b, nb_space[a->space], a->hi);
            for (size_t e = e0; e < e1 && rc == LOOM_SUCCESS; e++) {
                size_t ge = off_space[a->space] + e;
                uint32_t w = writer[ge];
                if (!h->budget) {
                    h->truncated = 1;
                    goto out;
                }
                if (w != NONE && w != j && !reaches(h, w, j))
                    rc = hazard_conflict(v, s, w, j,
                                         a->write ? "both write the same bytes"
                                                  : "one writes what the other reads");
                if (!a->write) continue;
                for (int32_t rd = rhead[ge]; rd >= 0 && rc == LOOM_SUCCESS; rd = rpool[rd].next)
                    if (rpool[rd].step != j && !reaches(h, rpool[rd].step, j))
                        rc = hazard_conflict(v, s, rpool[rd].step, j,
                                             "one writes what the other reads");
            }
        }
        /* ...then record this step's reads and writes. */
        for (size_t k = k0; k < k1 && rc == LOOM_SUCCESS; k++) {
            const struct access *a = &acc[k];
            const size_t *b = bounds + off_space[a->space];
            size_t e0 = find_bound(b, nb_space[a->space], a->lo);
            size_t e1 = find_bound(b, nb_space[a->space], a->hi);
            for (size_t e = e0; e < e1; e++) {
                size_t ge = off_space[a->space] + e;
                if (a->write) {
                    writer[ge] = j;
                    rhead[ge] = -1;
                } else if (rhead[ge] < 0 || rpool[rhead[ge]].step != j) {
                    if (nr == rcap) {
                        size_t nc = rcap ? rcap * 2 : 1024;
                        struct reader *np = realloc(rpool, nc * sizeof *np);
                        if (!np) goto nomem;
                        rpool = np;
                        rcap = nc;
                    }
                    rpool[nr] = (struct reader){j, rhead[ge]};
                    rhead[ge] = (int32_t)nr++;
                }
            }
        }
        /* A write after a read of the same step drops that read: fine,
         * the write covers it for later steps. */
        k0 = k1;
    }
out:
    free(acc);
    free(bounds);
    free(writer);
    free(rhead);
    free(rpool);
    free(h->stamp);
    free(h->stack);
    h->stamp = h->stack = NULL;
    return rc;
nomem:
    rc = loomi_fail(LOOM_ERR_NO_MEMORY, s->rank, "schedule check: out of memory");
    goto out;
}

/* ---------------------------------------------------------------- entry */

loom_result_t loomi_sched_validate(const struct loomi_sched *sched, int nranks,
                                   const struct loomi_validate_opts *opts,
                                   struct loomi_validate_stats *stats, char *msg, size_t msglen)
{
    struct loomi_validate_stats dummy;
    if (!stats) stats = &dummy;
    memset(stats, 0, sizeof *stats);
    if (msg && msglen) msg[0] = '\0';
    struct vctx v = {sched, nranks, opts, NULL, msg, msglen};
    if (!sched || nranks < 1) return vfail(&v, "no schedules (nranks %d)", nranks);
    v.base = malloc(((size_t)nranks + 1) * sizeof *v.base);
    if (!v.base) return loomi_fail(LOOM_ERR_NO_MEMORY, -1, "schedule check: out of memory");
    v.base[0] = 0;
    for (int r = 0; r < nranks; r++) v.base[r + 1] = v.base[r] + sched[r].nsteps;
    size_t N = v.base[nranks];
    stats->steps = N;
    uint32_t *partner = NULL;
    loom_result_t rc;
    if (N >= NONE) {
        rc = vfail(&v, "%zu steps in all: too many to check", N);
        goto out;
    }
    rc = check_steps(&v);
    if (rc != LOOM_SUCCESS) goto out;
    partner = malloc((N ? N : 1) * sizeof *partner);
    if (!partner) {
        rc = loomi_fail(LOOM_ERR_NO_MEMORY, -1, "schedule check: out of memory");
        goto out;
    }
    rc = match_messages(&v, partner, &stats->messages);
    if (rc == LOOM_SUCCESS) rc = run_symbolic(&v, partner);
    if (rc == LOOM_SUCCESS && opts && opts->hazards) {
        struct hz h = {.budget = HAZARD_BUDGET};
        for (int r = 0; r < nranks && rc == LOOM_SUCCESS && !h.truncated; r++)
            rc = check_hazards_rank(&v, &sched[r], &h);
        stats->hazard_pairs = h.queries;
        stats->hazards_truncated = h.truncated;
    }
out:
    free(partner);
    free(v.base);
    return rc;
}

void loomi_coll_extents(const struct loomi_coll_args *a, int rank, int nranks, size_t es,
                        size_t *send_bytes, size_t *recv_bytes)
{
    const size_t n = a->count * es, pn = (size_t)nranks * n;
    const int root = rank == a->root, ip = a->inplace;
    size_t s = 0, r = 0;
    switch (a->coll) {
    case LOOMI_COLL_ALLREDUCE: s = ip ? 0 : n; r = n; break;
    case LOOMI_COLL_REDUCE_SCATTER: s = pn; r = n; break;
    case LOOMI_COLL_ALLGATHER: s = ip ? 0 : n; r = pn; break;
    case LOOMI_COLL_ALLTOALL: s = ip ? 0 : pn; r = pn; break;
    case LOOMI_COLL_ALLTOALLV:
        for (int q = 0; q < nranks; q++) {
            if (a->counts && a->displs && a->counts[q])
                s = LOOMI_MAX(s, (a->displs[q] + a->counts[q]) * es);
            if (a->rcounts && a->rdispls && a->rcounts[q])
                r = LOOMI_MAX(r, (a->rdispls[q] + a->rcounts[q]) * es);
        }
        break;
    case LOOMI_COLL_BROADCAST: s = root && !ip ? n : 0; r = n; break;
    case LOOMI_COLL_REDUCE: s = root && ip ? 0 : n; r = root ? n : 0; break;
    case LOOMI_COLL_GATHER: s = root && ip ? 0 : n; r = root ? pn : 0; break;
    case LOOMI_COLL_SCATTER: s = root ? pn : 0; r = root && ip ? 0 : n; break;
    case LOOMI_COLL_GOSSIP: r = n; break;
    default: break;
    }
    *send_bytes = s;
    *recv_bytes = r;
}

loom_result_t loomi_sched_validate_coll(const struct loomi_sched *sched, int nranks,
                                        const struct loomi_coll_args *a, int hazards,
                                        struct loomi_validate_stats *stats, char *msg,
                                        size_t msglen)
{
    if (!sched || nranks < 1 || !a)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1, "loomi_sched_validate_coll: bad arguments");
    size_t *lim = malloc(2 * (size_t)nranks * sizeof *lim);
    if (!lim) return loomi_fail(LOOM_ERR_NO_MEMORY, -1, "schedule check: out of memory");
    int alias = 0;
    for (int r = 0; r < nranks; r++) {
        loomi_coll_extents(&a[r], r, nranks, sched[0].esize, &lim[r], &lim[nranks + r]);
        alias |= a[r].coll == LOOMI_COLL_REDUCE_SCATTER && a[r].inplace;
    }
    struct loomi_validate_opts o = {
        .hazards = hazards,
        .recv_in_send = alias,
        .send_limit = lim,
        .recv_limit = lim + nranks,
    };
    loom_result_t rc = loomi_sched_validate(sched, nranks, &o, stats, msg, msglen);
    free(lim);
    return rc;
}
