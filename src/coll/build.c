/*
 * build.c - the schedule builder (build.h): dependencies from byte ranges.
 *
 * Per buffer, ranges that cover every byte, each with its last writer
 * and the list of its readers since: the nodes of a treap (a search tree
 * kept balanced by random priorities) by offset, also linked in offset
 * order, so that a split and the walk over a step's ranges cost a
 * logarithm and the ranges walked.  Reader lists are linked from a pool
 * and only ever grow at the head, so two ranges split from one share the
 * older part of the list.
 */
#include <stdlib.h>
#include <string.h>

#include "coll/build.h"
#include "core/internal.h"

#define NONE LOOMI_NO_DEP

struct loomi_brange {
    size_t lo;       /* the range runs to the next one's lo */
    uint32_t writer; /* NONE: not written yet */
    int32_t readers; /* head in the pool, -1: none */
    uint32_t next;   /* the range after this one (NONE: the last) */
    uint32_t l, r, prio; /* the treap */
    int buf;
};

struct loomi_breader {
    uint32_t step;
    int32_t next;
};

/* ------------------------------------------------- what a step touches */

/* Bytes of an encoded slot of a step's count (0: no codec, or too big). */
static size_t slot_of(const struct loomi_sched *s, const struct loomi_step *st)
{
    return s->codec ? loomi_codec_slot_bytes(s->codec, st->count) : 0;
}

static void acc(struct loomi_access *a, int *n, int buf, size_t off, size_t bytes, int write)
{
    if (!bytes || buf >= LOOMI_NBUFS) return;
    a[(*n)++] = (struct loomi_access){buf, off, bytes, write};
}

int loomi_step_accesses(const struct loomi_sched *s, const struct loomi_step *st,
                        struct loomi_access *a)
{
    int n = 0;
    size_t bytes = st->count * s->esize;
    if ((st->kind == LOOMI_STEP_ENCODE && (st->flags & LOOMI_ENC_DECODED)) ||
        (st->kind == LOOMI_STEP_COPY && (st->flags & (LOOMI_COPY_ALSO | LOOMI_COPY_SAVE))))
        acc(a, &n, st->src2, st->src2_off, bytes, 1);
    switch (st->kind) {
    case LOOMI_STEP_SEND:
        acc(a, &n, st->src, st->src_off, bytes, 0);
        break;
    case LOOMI_STEP_RECV:
        acc(a, &n, st->dst, st->dst_off, bytes, 1);
        break;
    case LOOMI_STEP_REDUCE:
        acc(a, &n, st->src2, st->src2_off, bytes, 0);
        /* fall through */
    case LOOMI_STEP_REDUCE_SHARED: /* the arenas are not this rank's alone */
        if (st->flags & LOOMI_RS_SAVE) acc(a, &n, LOOMI_BUF_SCRATCH, st->dst_off, bytes, 1);
        /* fall through */
    case LOOMI_STEP_COPY:
        acc(a, &n, st->src, st->src_off, bytes, 0);
        /* fall through */
    case LOOMI_STEP_AVG:
        acc(a, &n, st->dst, st->dst_off, bytes, 1);
        break;
    case LOOMI_STEP_EXPECT:
        acc(a, &n, st->src, st->src_off, bytes, 0);
        acc(a, &n, st->src2, st->src2_off, bytes, 0);
        break;
    case LOOMI_STEP_ENCODE:
        acc(a, &n, st->src, st->src_off, bytes, 0);
        acc(a, &n, st->dst, st->dst_off, slot_of(s, st), 1);
        break;
    case LOOMI_STEP_DECODE_ACC:
        acc(a, &n, st->src2, st->src2_off, bytes, 0);
        /* fall through */
    case LOOMI_STEP_DECODE:
        acc(a, &n, st->src, st->src_off, slot_of(s, st), 0);
        acc(a, &n, st->dst, st->dst_off, bytes, 1);
        break;
    }
    return n;
}

/* ------------------------------------------------------------- ranges */

/* p with room for one more of n elements of `size` (capacity *cap,
 * doubled from `first`); NULL, p untouched and b->ok cleared when out of
 * memory. */
static void *room(struct loomi_build *b, void *p, size_t *cap, size_t n, size_t size,
                  size_t first)
{
    if (n < *cap) return p;
    size_t nc = *cap ? 2 * *cap : first;
    void *np = nc > INT32_MAX ? NULL : realloc(p, nc * size);
    if (!np) b->ok = 0;
    else *cap = nc;
    return np;
}

/* The subtree t with node n inserted (by lo), rotated to keep the
 * greater priorities above. */
static uint32_t insert(struct loomi_brange *N, uint32_t t, uint32_t n)
{
    if (t == NONE) return n;
    if (N[n].lo < N[t].lo) {
        uint32_t c = N[t].l = insert(N, N[t].l, n);
        if (N[c].prio <= N[t].prio) return t;
        N[t].l = N[c].r, N[c].r = t;
        return c;
    }
    uint32_t c = N[t].r = insert(N, N[t].r, n);
    if (N[c].prio <= N[t].prio) return t;
    N[t].r = N[c].l, N[c].l = t;
    return c;
}

static size_t hash_of(int buf, size_t x)
{
    uint64_t h = ((uint64_t)x + (uint64_t)buf) * 0x9e3779b97f4a7c15ull;
    return (size_t)(h ^ (h >> 29));
}

/* Enter node n in the hash (which has room). */
static void hash_put(struct loomi_build *b, uint32_t n)
{
    size_t i = hash_of(b->node[n].buf, b->node[n].lo) & b->hmask;
    while (b->hash[i] != NONE) i = (i + 1) & b->hmask;
    b->hash[i] = n;
}

/* Room in the hash for one more node: at most half full. */
static int hash_room(struct loomi_build *b)
{
    if (2 * (b->nnode + 1) <= b->hmask + 1) return 1;
    size_t cap = b->hash ? 2 * (b->hmask + 1) : 256;
    while (2 * (b->nnode + 1) > cap) cap *= 2;
    uint32_t *h = malloc(cap * sizeof *h);
    if (!h) return b->ok = 0;
    free(b->hash);
    b->hash = h;
    b->hmask = cap - 1;
    for (size_t i = 0; i < cap; i++) h[i] = NONE;
    for (uint32_t n = 0; n < b->nnode; n++) hash_put(b, n);
    return 1;
}

/* The range of buffer buf that starts at byte x, split from the one that
 * holds x if need be (NONE when out of memory). */
static uint32_t split_at(struct loomi_build *b, int buf, size_t x)
{
    for (size_t i = hash_of(buf, x) & b->hmask; b->hash[i] != NONE; i = (i + 1) & b->hmask)
        if (b->node[b->hash[i]].lo == x && b->node[b->hash[i]].buf == buf) return b->hash[i];
    uint32_t at = NONE;
    for (uint32_t t = b->root[buf]; t != NONE;) { /* the last range with lo <= x */
        if (b->node[t].lo <= x) at = t, t = b->node[t].r;
        else t = b->node[t].l;
    }
    struct loomi_brange *N = room(b, b->node, &b->capnode, b->nnode, sizeof *N, 64);
    if (!N) return NONE;
    b->node = N;
    if (!hash_room(b)) return NONE;
    uint32_t n = (uint32_t)b->nnode++;
    b->seed = b->seed * 1664525u + 1013904223u;
    N[n] = N[at];
    N[n].lo = x, N[n].l = N[n].r = NONE, N[n].prio = b->seed;
    N[at].next = n;
    b->root[buf] = insert(N, b->root[buf], n);
    hash_put(b, n);
    return n;
}

/* Where (buf, off) lives: in-place reduce_scatter's RECV is in SEND. */
static void place(const struct loomi_build *b, struct loomi_access *a)
{
    if (a->buf == LOOMI_BUF_RECV && b->recv_in_send) {
        a->buf = LOOMI_BUF_SEND;
        a->off += (size_t)b->s->rank * b->s->buf_bytes[LOOMI_BUF_RECV];
    }
}

/* The first of the ranges that make up a's bytes (they run until one
 * starts at a->off + a->bytes), NONE when out of memory. */
static uint32_t span(struct loomi_build *b, const struct loomi_access *a)
{
    return split_at(b, a->buf, a->off + a->bytes) == NONE ? NONE : split_at(b, a->buf, a->off);
}

#define EACH(b, i, i0, a) \
    for (uint32_t i = (i0); i != NONE && (b)->node[i].lo < (a)->off + (a)->bytes; i = (b)->node[i].next)

static void want(struct loomi_build *b, uint32_t d)
{
    if (d == NONE) return;
    for (size_t k = 0; k < b->ndeps; k++)
        if (b->deps[k] == d) return;
    uint32_t *nd = room(b, b->deps, &b->capdeps, b->ndeps, sizeof *nd, 16);
    if (!nd) return;
    b->deps = nd;
    b->deps[b->ndeps++] = d;
}

/* Drop the dependencies that another one depends on directly. */
static void prune(struct loomi_build *b)
{
    const struct loomi_sched *s = b->s;
    if (b->ndeps < 2 || b->ndeps > 64) return;
    size_t k = 0;
    for (size_t i = 0; i < b->ndeps; i++) {
        int implied = 0;
        for (size_t j = 0; j < b->ndeps && !implied; j++)
            for (int e = 0; e < s->ndeps[b->deps[j]] && !implied; e++)
                implied = s->deps[b->deps[j]][e] == b->deps[i];
        if (!implied) b->deps[k++] = b->deps[i];
    }
    b->ndeps = k;
}

static void record(struct loomi_build *b, uint32_t j, const struct loomi_access *a, uint32_t i0)
{
    EACH(b, i, i0, a) {
        struct loomi_brange *r = &b->node[i];
        if (a->write) {
            r->writer = j;
            r->readers = -1;
            continue;
        }
        if (r->readers >= 0 && b->pool[r->readers].step == j) continue;
        struct loomi_breader *np = room(b, b->pool, &b->cappool, b->npool, sizeof *np, 1024);
        if (!np) return;
        b->pool = np;
        b->pool[b->npool] = (struct loomi_breader){j, r->readers};
        r->readers = (int32_t)b->npool++;
    }
}

uint32_t loomi_build_step(struct loomi_build *b, const struct loomi_step *st)
{
    struct loomi_sched *s = b->s;
    struct loomi_access a[LOOMI_MAX_ACCESS];
    if (!st->count || !b->ok) return NONE;
    int na = loomi_step_accesses(s, st, a);
    b->ndeps = 0;
    want(b, b->after);
    b->after = NONE;
    uint32_t first[LOOMI_MAX_ACCESS]; /* stays the first: later splits link in after it */
    for (int k = 0; k < na; k++) {
        place(b, &a[k]);
        uint32_t i0 = first[k] = span(b, &a[k]);
        if (i0 == NONE) return NONE;
        EACH(b, i, i0, &a[k]) {
            want(b, b->node[i].writer);
            if (a[k].write)
                for (int32_t q = b->node[i].readers; q >= 0; q = b->pool[q].next)
                    want(b, b->pool[q].step);
        }
    }
    if (!b->ok) return NONE;
    prune(b);
    /* Too many: join the first few through zero-count copies, each
     * taking up to LOOMI_MAX_DEPS, until LOOMI_MAX_DEPS are left. */
    while (b->ndeps > LOOMI_MAX_DEPS) {
        size_t k = b->ndeps - LOOMI_MAX_DEPS + 1;
        if (k > LOOMI_MAX_DEPS) k = LOOMI_MAX_DEPS;
        uint32_t jn = loomi_sched_copy(s, LOOMI_BUF_RECV, 0, LOOMI_BUF_RECV, 0, 0, b->deps, (int)k);
        memmove(b->deps + 1, b->deps + k, (b->ndeps - k) * sizeof *b->deps);
        b->deps[0] = jn;
        b->ndeps -= k - 1;
    }
    uint32_t j = loomi_sched_add(s, st, b->deps, (int)b->ndeps);
    if (!s->ok) {
        b->ok = 0;
        return NONE;
    }
    for (int k = 0; k < na; k++) record(b, j, &a[k], first[k]);
    return b->ok ? j : NONE;
}

loom_result_t loomi_build_init(struct loomi_build *b, struct loomi_sched *s, size_t bytes,
                               size_t chunk_bytes)
{
    memset(b, 0, sizeof *b);
    b->s = s;
    b->C = loomi_build_chunks(bytes, chunk_bytes);
    b->after = NONE;
    b->ok = 1;
    b->capnode = 64;
    b->node = malloc(b->capnode * sizeof *b->node);
    if (!b->node) b->ok = 0;
    for (int m = 0; m < LOOMI_NBUFS && b->ok; m++) { /* one range: the whole buffer */
        b->node[m] = (struct loomi_brange){0, NONE, -1, NONE, NONE, NONE, 0, m};
        b->root[m] = (uint32_t)m;
        b->nnode = (size_t)m + 1;
        if (hash_room(b)) hash_put(b, (uint32_t)m);
    }
    /* What the schedule already does (e.g. loomi_allreduce_trivial's copy). */
    for (uint32_t i = 0; i < s->nsteps && b->ok; i++) {
        struct loomi_access a[LOOMI_MAX_ACCESS];
        int na = loomi_step_accesses(s, &s->steps[i], a);
        for (int k = 0; k < na; k++) {
            place(b, &a[k]);
            uint32_t i0 = span(b, &a[k]);
            if (i0 != NONE) record(b, i, &a[k], i0);
        }
    }
    if (!b->ok) {
        loomi_build_done(b);
        return loomi_fail(LOOM_ERR_NO_MEMORY, s->rank, "schedule builder: out of memory");
    }
    return LOOM_SUCCESS;
}

loom_result_t loomi_build_done(struct loomi_build *b)
{
    free(b->node);
    free(b->hash);
    free(b->pool);
    free(b->deps);
    int ok = b->ok && b->s->ok;
    b->node = NULL;
    b->hash = NULL;
    b->pool = NULL;
    b->deps = NULL;
    return ok ? LOOM_SUCCESS
              : loomi_fail(LOOM_ERR_NO_MEMORY, b->s->rank, "schedule builder: out of memory");
}

/* ------------------------------------------------------------ the steps */

uint32_t loomi_bsend(struct loomi_build *b, int peer, uint32_t tag, int buf, size_t off,
                     size_t count)
{
    struct loomi_step st = {.kind = LOOMI_STEP_SEND, .src = (uint8_t)buf, .peer = peer,
                            .tag = tag, .src_off = off, .count = count};
    return loomi_build_step(b, &st);
}

uint32_t loomi_brecv(struct loomi_build *b, int peer, uint32_t tag, int buf, size_t off,
                     size_t count)
{
    struct loomi_step st = {.kind = LOOMI_STEP_RECV, .dst = (uint8_t)buf, .peer = peer,
                            .tag = tag, .dst_off = off, .count = count};
    return loomi_build_step(b, &st);
}

uint32_t loomi_breduce(struct loomi_build *b, int dst, size_t dst_off, int a, size_t a_off,
                       int b2, size_t b2_off, size_t count)
{
    struct loomi_step st = {.kind = LOOMI_STEP_REDUCE, .peer = -1, .dst = (uint8_t)dst, .src = (uint8_t)a,
                            .src2 = (uint8_t)b2, .dst_off = dst_off, .src_off = a_off,
                            .src2_off = b2_off, .count = count};
    return loomi_build_step(b, &st);
}

uint32_t loomi_bcopy(struct loomi_build *b, int dst, size_t dst_off, int src, size_t src_off,
                     size_t count)
{
    struct loomi_step st = {.kind = LOOMI_STEP_COPY, .peer = -1, .dst = (uint8_t)dst, .src = (uint8_t)src,
                            .dst_off = dst_off, .src_off = src_off, .count = count};
    return loomi_build_step(b, &st);
}

uint32_t loomi_bavg(struct loomi_build *b, int dst, size_t dst_off, size_t count)
{
    struct loomi_step st = {.kind = LOOMI_STEP_AVG, .peer = -1, .dst = (uint8_t)dst, .dst_off = dst_off,
                            .count = count};
    return loomi_build_step(b, &st);
}

uint32_t loomi_bavg_by(struct loomi_build *b, int dst, size_t dst_off, size_t count, uint32_t by)
{
    struct loomi_step st = {.kind = LOOMI_STEP_AVG, .peer = -1, .dst = (uint8_t)dst, .dst_off = dst_off,
                            .flags = by, .count = count};
    return loomi_build_step(b, &st);
}
