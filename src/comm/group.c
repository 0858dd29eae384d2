/*
 * group.c - the bodies of the point-to-point calls and of
 * loom_group_start/end (the public door is src/api/group.c).
 *
 * A group is per thread, as NCCL's: calls made between start and the
 * outermost end are checked and built into schedules at once, queued, and
 * started together at the end.  Every queued send and receive is then
 * posted to the transport before anything waits, so the order in which
 * ranks queued them cannot deadlock.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "coll/coll.h"
#include "comm/collectives.h"
#include "comm/devbuf.h"
#include "comm/group.h"
#include "comm/comm.h"
#include "core/hostmap.h"
#include "core/internal.h"
#include "sched/copy.h"

struct queued {
    loom_comm_t h; /* looked up again at the end: it may be gone by then */
    struct loom_comm *comm;
    struct loomi_sched s; /* built (fn NULL) */
    const void *sendbuf;
    void *recvbuf;
    int inplace;
    /* A fusable call, built at the end (fn set). */
    const char *fn;
    int coll;
    loom_datatype_t dtype;
    loom_op_t op;
    size_t count;
};

struct group {
    int depth;
    struct queued *q;
    size_t n, cap;
};

static _Thread_local struct group grp;

int loomi_group_active(void) { return grp.depth > 0; }

static struct queued *queue_slot(struct loom_comm *comm)
{
    if (grp.n == grp.cap) {
        size_t cap = grp.cap ? grp.cap * 2 : 16;
        struct queued *q = realloc(grp.q, cap * sizeof *q);
        if (!q) return NULL;
        grp.q = q;
        grp.cap = cap;
    }
    struct queued *e = &grp.q[grp.n++];
    memset(e, 0, sizeof *e);
    e->h = comm->handle;
    e->comm = comm;
    return e;
}

loom_result_t loomi_group_queue(struct loom_comm *comm, struct loomi_sched *s,
                                const void *sendbuf, void *recvbuf, int inplace)
{
    struct queued *e = queue_slot(comm);
    if (!e) {
        loomi_sched_free(s);
        return loomi_fail(LOOM_ERR_NO_MEMORY, comm->rank, "group: out of memory");
    }
    e->s = *s;
    memset(s, 0, sizeof *s);
    e->sendbuf = sendbuf;
    e->recvbuf = recvbuf;
    e->inplace = inplace;
    return LOOM_SUCCESS;
}

loom_result_t loomi_group_queue_call(struct loom_comm *comm, const char *fn, int coll,
                                     const void *sendbuf, void *recvbuf, size_t count,
                                     loom_datatype_t dtype, loom_op_t op, int inplace)
{
    struct queued *e = queue_slot(comm);
    if (!e) return loomi_fail(LOOM_ERR_NO_MEMORY, comm->rank, "%s: group: out of memory", fn);
    e->fn = fn;
    e->coll = coll;
    e->sendbuf = sendbuf;
    e->recvbuf = recvbuf;
    e->count = count;
    e->dtype = dtype;
    e->op = coll == LOOMI_COLL_ALLGATHER ? LOOM_SUM : op;
    e->inplace = inplace;
    return LOOM_SUCCESS;
}

loom_result_t loomi_group_start(void)
{
    grp.depth++;
    return LOOM_SUCCESS;
}

static int is_recv(const struct queued *e)
{
    return !e->fn && e->s.p2p && e->s.nsteps == 1 && e->s.steps[0].kind == LOOMI_STEP_RECV;
}

/* ------------------------------------------------------------- fusion */

/* The staging bytes of a call: what its packed input and output need. */
static size_t stage_bytes(int coll, size_t count, size_t es, int nranks)
{
    size_t n = count * es; /* checked: count * es * 4 * nranks fits */
    return coll == LOOMI_COLL_ALLREDUCE ? n : n * (size_t)nranks;
}

int loomi_fuse_eligible(int coll, size_t count, size_t es, int nranks)
{
    if (coll != LOOMI_COLL_ALLREDUCE && coll != LOOMI_COLL_REDUCE_SCATTER &&
        coll != LOOMI_COLL_ALLGATHER)
        return 0;
    if (!count || !es || nranks < 1 || count > LOOMI_FUSE_MEMBER_MAX / es) return 0;
    return stage_bytes(coll, count, es, nranks) <= LOOMI_FUSE_MEMBER_MAX;
}

static int same_kind(const struct loomi_fuse_item *a, const struct loomi_fuse_item *b)
{
    return a->comm == b->comm && a->coll == b->coll && a->dtype == b->dtype &&
           (a->coll == LOOMI_COLL_ALLGATHER || a->op == b->op);
}

size_t loomi_fuse_plan(const struct loomi_fuse_item *it, size_t n, size_t cap, uint32_t *bucket)
{
    /* The bucket of each kind still open: its first item and its bytes. */
    size_t *first = malloc((n ? n : 1) * sizeof *first);
    size_t *bytes = malloc((n ? n : 1) * sizeof *bytes);
    size_t nb = 0, nopen = 0;
    uint32_t *open = malloc((n ? n : 1) * sizeof *open);
    if (!first || !bytes || !open) {
        free(first);
        free(bytes);
        free(open);
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        size_t k = 0;
        while (k < nopen && !same_kind(&it[first[open[k]]], &it[i])) k++;
        if (k < nopen && bytes[open[k]] <= cap && it[i].bytes <= cap - bytes[open[k]]) {
            bucket[i] = open[k];
            bytes[open[k]] += it[i].bytes;
            continue;
        }
        first[nb] = i;
        bytes[nb] = it[i].bytes;
        bucket[i] = (uint32_t)nb;
        if (k < nopen)
            open[k] = (uint32_t)nb; /* the full one is closed */
        else
            open[nopen++] = (uint32_t)nb;
        nb++;
    }
    free(first);
    free(bytes);
    free(open);
    return nb;
}

uint32_t loomi_fuse_shape(const size_t *counts, size_t n)
{
    uint64_t h = UINT64_C(0xcbf29ce484222325) ^ n;
    for (size_t i = 0; i < n; i++) {
        uint64_t v = counts[i];
        for (int b = 0; b < 8; b++, v >>= 8) h = (h ^ (v & 0xff)) * UINT64_C(0x100000001b3);
    }
    uint32_t s = (uint32_t)(h ^ h >> 32);
    return s ? s : 1;
}

/* The staging buffer, kept per thread between groups (freed when the
 * thread ends). */
static pthread_key_t stage_key;
static pthread_once_t stage_once = PTHREAD_ONCE_INIT;
struct stage {
    unsigned char *p;
    size_t len;
};
static void stage_free(void *v)
{
    struct stage *st = v;
    if (st) free(st->p);
    free(st);
}
static void stage_init(void) { (void)pthread_key_create(&stage_key, stage_free); }

static unsigned char *stage_get(size_t len)
{
    (void)pthread_once(&stage_once, stage_init);
    struct stage *st = pthread_getspecific(stage_key);
    if (!st) {
        if (!(st = calloc(1, sizeof *st))) return NULL;
        if (pthread_setspecific(stage_key, st)) {
            free(st);
            return NULL;
        }
    }
    if (st->len < len) {
        free(st->p);
        st->len = 0;
        if (!(st->p = malloc(len))) return NULL;
        st->len = len;
    }
    return st->p;
}

/* A unit of work at the end: a built call, or a bucket of fusable ones. */
struct unit {
    size_t q;     /* the (first) queued call */
    int fused;    /* a bucket of more than one call */
    int direct;   /* fused over the callers' buffers (contiguous): no staging */
    int win;      /* staged in its communicator's fuse window, not per thread */
    size_t *mem;  /* its members (queue indices), in order */
    size_t nmem;
    size_t total; /* sum of the members' counts */
    size_t off;   /* staging offset (in the thread's buffer or the window) */
    size_t len;   /* staging bytes */
    struct loomi_sched s;
    const void *sendbuf;
    void *recvbuf;
    int save;
};

/* The bytes a unit's input and output take in the staging buffer. */
static size_t in_bytes(int coll, size_t total, size_t es, int nranks)
{
    return coll == LOOMI_COLL_REDUCE_SCATTER ? total * es * (size_t)nranks : total * es;
}

static size_t out_bytes(int coll, size_t total, size_t es, int nranks)
{
    return coll == LOOMI_COLL_ALLGATHER ? total * es * (size_t)nranks : total * es;
}

#define ALIGN64(x) (((x) + 63) & ~(size_t)63)

/* Between the members' buffers and a staging buffer st: in, their
 * inputs into it (for reduce-scatter block by block of the ranks: block
 * r holds every member's block r); out, their results from it (for
 * allgather likewise).  Past LOOMI_FUSE_STREAM_BYTES in all, the stores
 * stream (loomi_copy_stream_nf: pieces under 4K, and a piece's unaligned
 * head and tail, are ordinary copies), fenced once at the end. */
static void stage(const struct unit *u, const struct queued *q, unsigned char *st, int nranks,
                  int out)
{
    const struct queued *f = &q[u->q];
    const size_t es = loom_datatype_size(f->dtype), C = u->total * es;
    const int blocks = f->coll == (out ? LOOMI_COLL_ALLGATHER : LOOMI_COLL_REDUCE_SCATTER)
                       ? nranks : 1;
    const int nt = C * (size_t)blocks >= LOOMI_FUSE_STREAM_BYTES;
    size_t off = 0;
    for (size_t j = 0; j < u->nmem; j++) {
        const struct queued *e = &q[u->mem[j]];
        const size_t b = e->count * es;
        for (int r = 0; r < blocks; r++) {
            unsigned char *at = st + (size_t)r * C + off;
            unsigned char *d = out ? (unsigned char *)e->recvbuf + (size_t)r * b : at;
            const unsigned char *src =
                out ? at : (const unsigned char *)e->sendbuf + (size_t)r * b;
            if (nt) loomi_copy_stream_nf(d, NULL, src, b, 0);
            else memcpy(d, src, b);
        }
        off += b;
    }
    loomi_copy_fence(nt);
}

/* Whether comm's fused allreduces are staged in a window of its own
 * (loomi_mem_alloc): where the host's ranks share memory, the shared
 * allreduce then reads its peers' inputs where they were packed and
 * writes each result into every rank's window, instead of copying the
 * input into its arena and the results out of it.  The same facts as
 * loom_mem_alloc's, job-wide, so that every rank decides alike. */
static int window_host(const struct loom_comm *c)
{
    const struct loomi_hostmap *m = c->hosts;
    return m && c->shared_bytes > 0 && m->nranks == c->nranks && m->nhosts < c->nranks;
}

/* Grow the fuse windows of the communicators that need one to the bytes
 * their fused allreduces stage (collective: every rank's group asks for
 * the same, in the same order). */
static loom_result_t grow_windows(struct unit *u, size_t nu, struct queued *q)
{
    for (size_t i = 0; i < nu; i++) {
        if (!u[i].win) continue;
        const loom_comm_t h = q[u[i].q].h;
        size_t need = 0, seen = 0;
        for (size_t j = 0; j < nu; j++) {
            if (!u[j].win || q[u[j].q].h != h) continue;
            if (j < i) seen = 1;
            const size_t end = u[j].off + u[j].len;
            if (end > need) need = end;
        }
        if (seen) continue; /* done at its first unit */
        struct loom_comm *c;
        loom_result_t r = loomi_comm_check(h, "loom_group_end", &c);
        if (r != LOOM_SUCCESS) return r;
        if (c->fuse_win_bytes >= need) continue;
        size_t want = c->fuse_win_bytes * 2 > need ? c->fuse_win_bytes * 2 : need;
        want = (want + ((size_t)1 << 20) - 1) & ~(((size_t)1 << 20) - 1);
        void *p;
        r = loomi_mem_alloc(h, "loom_group_end (the window of fused allreduces)", want, &p, 0);
        if (r != LOOM_SUCCESS) return r;
        if (c->fuse_win) (void)loom_mem_free(h, c->fuse_win);
        c->fuse_win = p;
        c->fuse_win_bytes = want;
    }
    return LOOM_SUCCESS;
}

/* Whether a fused allreduce's members lie one after the other in the
 * order queued, inputs and outputs alike (views into one bucket buffer,
 * as DDP's): then it runs over the callers' memory, with no copy. */
static int contiguous(const struct unit *u, const struct queued *q)
{
    const struct queued *f = &q[u->q];
    if (f->coll != LOOMI_COLL_ALLREDUCE) return 0;
    const size_t es = loom_datatype_size(f->dtype);
    const unsigned char *s = f->sendbuf, *r = f->recvbuf;
    for (size_t j = 0; j < u->nmem; j++) {
        const struct queued *e = &q[u->mem[j]];
        if ((const unsigned char *)e->sendbuf != s || (unsigned char *)e->recvbuf != r) return 0;
        s += e->count * es;
        r += e->count * es;
    }
    /* Out of place, the two ranges must not overlap either. */
    const uintptr_t a = (uintptr_t)f->sendbuf, b = (uintptr_t)f->recvbuf, n = u->total * es;
    return a == b || a + n <= b || b + n <= a;
}

/* Group the queued calls into units: the built ones alone, the fusable
 * ones by loomi_fuse_plan, each bucket where its first call was queued.
 * Returns the number of units, 0 when out of memory (nothing kept). */
static size_t plan_units(struct queued *q, size_t n, struct unit **out, size_t **memstore)
{
    struct loomi_fuse_item *it = calloc(n, sizeof *it);
    size_t *qi = calloc(n, sizeof *qi);
    uint32_t *bk = calloc(n, sizeof *bk);
    struct unit *u = calloc(n, sizeof *u);
    size_t *mem = calloc(n, sizeof *mem);
    size_t nf = 0, nu = 0;
    if (!it || !qi || !bk || !u || !mem) goto oom;
    for (size_t i = 0; i < n; i++) {
        if (!q[i].fn) continue;
        it[nf] = (struct loomi_fuse_item){(uintptr_t)q[i].h, q[i].coll, q[i].dtype, q[i].op,
                                          stage_bytes(q[i].coll, q[i].count,
                                                      loom_datatype_size(q[i].dtype),
                                                      q[i].comm ? q[i].comm->nranks : 1)};
        qi[nf++] = i;
    }
    size_t nb = nf ? loomi_fuse_plan(it, nf, LOOMI_FUSE_BUCKET_MAX, bk) : 0;
    if (nf && !nb) goto oom;
    /* Members of each bucket, contiguous in mem, in bucket order. */
    size_t *cnt = calloc(nb + 1, sizeof *cnt), *unit_of = calloc(nb + 1, sizeof *unit_of);
    if (!cnt || !unit_of) {
        free(cnt);
        free(unit_of);
        goto oom;
    }
    for (size_t k = 0; k < nf; k++) cnt[bk[k] + 1]++;
    for (size_t b = 0; b < nb; b++) cnt[b + 1] += cnt[b];
    for (size_t b = 0; b <= nb; b++) unit_of[b] = SIZE_MAX;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (!q[i].fn) {
            u[nu++].q = i;
            continue;
        }
        size_t b = bk[k++];
        if (unit_of[b] == SIZE_MAX) {
            unit_of[b] = nu;
            u[nu].q = i;
            u[nu].mem = mem + cnt[b];
            nu++;
        }
        struct unit *x = &u[unit_of[b]];
        x->mem[x->nmem++] = i;
        x->total += q[i].count;
    }
    for (size_t i = 0; i < nu; i++) {
        u[i].fused = u[i].nmem > 1;
        u[i].direct = u[i].fused && contiguous(&u[i], q);
    }
    free(cnt);
    free(unit_of);
    free(it);
    free(qi);
    free(bk);
    *out = u;
    *memstore = mem;
    return nu;
oom:
    free(it);
    free(qi);
    free(bk);
    free(u);
    free(mem);
    return 0;
}

/* Build unit x's schedule (its call number is taken now); the fused ones
 * over the staging buffer at st + x->off, their inputs packed. */
static loom_result_t build_unit(struct unit *x, struct queued *q, struct loom_comm *c,
                                unsigned char *st)
{
    if (x->win) st = c->fuse_win;
    struct queued *f = &q[x->q];
    if (!f->fn) {
        x->s = f->s;
        memset(&f->s, 0, sizeof f->s);
        x->sendbuf = f->sendbuf;
        x->recvbuf = f->recvbuf;
        x->save = f->inplace;
        return LOOM_SUCCESS;
    }
    if (!x->fused) {
        x->sendbuf = f->sendbuf;
        x->recvbuf = f->recvbuf;
        return loomi_group_build(c, f->fn, f->coll, f->sendbuf, f->recvbuf, f->count, f->dtype,
                                 f->op, f->inplace, 1, 0, 0, &x->s, &x->save);
    }
    size_t *counts = malloc(x->nmem * sizeof *counts);
    if (!counts)
        return loomi_fail(LOOM_ERR_NO_MEMORY, c->rank, "loom_group_end: out of memory");
    for (size_t j = 0; j < x->nmem; j++) counts[j] = q[x->mem[j]].count;
    const uint32_t shape = loomi_fuse_shape(counts, x->nmem);
    free(counts);
    if (x->direct) {
        x->sendbuf = f->sendbuf;
        x->recvbuf = f->recvbuf;
        LOOMI_TRACE(c->rank, "loom_group_end: %zu %s calls fused in place of the callers' "
                    "buffers (count %zu in all)", x->nmem, loomi_coll_name(f->coll), x->total);
        return loomi_group_build(c, f->fn, f->coll, f->sendbuf, f->recvbuf, x->total, f->dtype,
                                 f->op, f->sendbuf == f->recvbuf, (uint32_t)x->nmem, shape, 0,
                                 &x->s, &x->save);
    }
    const size_t es = loom_datatype_size(f->dtype);
    unsigned char *in = st + x->off;
    unsigned char *out = in + ALIGN64(in_bytes(f->coll, x->total, es, c->nranks));
    stage(x, q, in, c->nranks, 0);
    /* Out of place over the staging buffer: nothing to save (in place,
     * the shared allreduce would save what it overwrites; perf/NOTES.md,
     * "group.c, staging out of place"). */
    x->sendbuf = in;
    x->recvbuf = out;
    /* Results that the unpack copies out at once, past what the caches
     * keep: streamed, as the unpack's stores (stage()). */
    const int nt = out_bytes(f->coll, x->total, es, c->nranks) >= LOOMI_FUSE_STREAM_BYTES;
    loom_result_t r = loomi_group_build(c, f->fn, f->coll, x->sendbuf, x->recvbuf, x->total,
                                        f->dtype, f->op, 0, (uint32_t)x->nmem, shape, nt,
                                        &x->s, &x->save);
    x->save = 0;
    LOOMI_TRACE(c->rank, "loom_group_end: %zu %s calls fused (count %zu in all)", x->nmem,
                loomi_coll_name(f->coll), x->total);
    return r;
}

loom_result_t loomi_group_end(void)
{
    if (grp.depth <= 0)
        return loomi_fail(LOOM_ERR_INVALID_USAGE, -1,
                          "loom_group_end: no group is open (call loom_group_start first)");
    if (--grp.depth > 0) return LOOM_SUCCESS;
    size_t n = grp.n;
    struct queued *q = grp.q;
    grp.q = NULL;
    grp.n = grp.cap = 0;
    if (!n) {
        free(q);
        return LOOM_SUCCESS;
    }
    /* A communicator destroyed since its calls were queued: they fail
     * below (loomi_comm_check); until then they count as one rank's. */
    for (size_t i = 0; i < n; i++) q[i].comm = loomi_comm_get(q[i].h);
    loom_result_t first = LOOM_SUCCESS;
    struct unit *u = NULL;
    size_t *memstore = NULL;
    size_t nu = plan_units(q, n, &u, &memstore);
    struct loomi_op **ops = nu ? calloc(nu, sizeof *ops) : NULL;
    size_t *order = nu ? malloc(nu * sizeof *order) : NULL;
    size_t started = 0, k = 0;
    unsigned char *st = NULL;
    if (!ops || !order) {
        first = loomi_fail(LOOM_ERR_NO_MEMORY, -1, "loom_group_end: out of memory");
    } else {
        /* The staging buffer of the fused units, each 64-byte aligned. */
        size_t len = 0;
        for (size_t i = 0; i < nu; i++) {
            if (!u[i].fused || u[i].direct) continue;
            const struct queued *f = &q[u[i].q];
            const size_t es = loom_datatype_size(f->dtype);
            const int nr = f->comm ? f->comm->nranks : 1;
            u[i].len = ALIGN64(in_bytes(f->coll, u[i].total, es, nr)) +
                       ALIGN64(out_bytes(f->coll, u[i].total, es, nr));
            u[i].win = f->coll == LOOMI_COLL_ALLREDUCE && f->comm && window_host(f->comm);
            if (u[i].win) {
                /* After the units of its communicator before it. */
                for (size_t j = 0; j < i; j++)
                    if (u[j].win && q[u[j].q].h == f->h) u[i].off = u[j].off + u[j].len;
                continue;
            }
            u[i].off = len;
            len += u[i].len;
        }
        if (len && !(st = stage_get(len)))
            first = loomi_fail(LOOM_ERR_NO_MEMORY, -1,
                               "loom_group_end: no memory for %zu bytes of fused calls", len);
        if (first == LOOM_SUCCESS) first = grow_windows(u, nu, q);
        /* Receives first: a message that finds its receive posted lands
         * in place, one that comes early is copied through a buffer.
         * Only point-to-point ops move; collectives keep their order. */
        for (int pass = 0; pass < 2; pass++)
            for (size_t i = 0; i < nu; i++)
                if (is_recv(&q[u[i].q]) == !pass) order[k++] = i;
    }
    for (size_t j = 0; j < nu; j++) {
        struct unit *x = &u[order ? order[j] : j];
        struct queued *f = &q[x->q];
        if (first != LOOM_SUCCESS) continue;
        /* A communicator broken by an earlier call of this group fails
         * the rest at once. */
        struct loom_comm *qc;
        loom_result_t r = loomi_comm_check(f->h, "loom_group_end", &qc);
        if (r == LOOM_SUCCESS) r = build_unit(x, q, qc, st);
        if (r == LOOM_SUCCESS)
            r = loomi_op_start(&qc->eng, &x->s, x->sendbuf, x->recvbuf, x->save, &ops[started]);
        else
            loomi_sched_free(&x->s);
        if (r != LOOM_SUCCESS) {
            first = r;
            continue;
        }
        started++;
    }
    loom_result_t w = ops ? loomi_op_wait_all(ops, started) : LOOM_SUCCESS;
    if (first == LOOM_SUCCESS) first = w;
    /* An operation of the group may end revoked by a peer that found
     * another one's calls differ: the group's failure is that mismatch,
     * as a lone call's would be. */
    for (size_t i = 0; first == LOOM_ERR_REVOKED && i < nu; i++) {
        struct loom_comm *c;
        if (loomi_comm_live(q[u[i].q].h, "loom_group_end", &c) != LOOM_SUCCESS) continue;
        /* Said as what it is, not as the "broken since an earlier
         * failure" of a rank that came to its group after the others
         * found the difference. */
        char why[sizeof c->errmsg];
        loomi_comm_lock(c);
        const int mismatch = c->error == LOOM_ERR_MISMATCH;
        snprintf(why, sizeof why, "%s", c->errmsg);
        loomi_comm_unlock(c);
        if (mismatch)
            first = loomi_fail(LOOM_ERR_MISMATCH, c->rank,
                               "loom_group_end: the ranks' collective calls differ: %s", why);
    }
    /* Ranks whose groups differ fail as above; say what a group must
     * agree on when the difference may lie in a fused call, which the
     * verdict on the last calls may not reach. */
    size_t nfused = 0, calls_fused = 0;
    for (size_t i = 0; i < nu; i++)
        if (u[i].fused) nfused++, calls_fused += u[i].nmem;
    if (first == LOOM_ERR_MISMATCH && nfused) {
        char msg[768];
        snprintf(msg, sizeof msg, "%s", loom_get_last_error());
        first = loomi_fail(first, -1,
                           "%s (loom_group_end fused %zu of this group's calls into %zu "
                           "operations: every rank's group must make the same calls, with the "
                           "same counts, datatypes and ops, in the same order)",
                           msg, calls_fused, nfused);
    }
    /* The fused calls' results, once every operation succeeded: on a
     * failure their outputs (in place: their inputs) are left as they
     * were, as the engine leaves a failed call's. */
    if (first == LOOM_SUCCESS)
        for (size_t i = 0; i < nu; i++)
            if (u[i].fused && !u[i].direct)
                stage(&u[i], q, (unsigned char *)u[i].recvbuf, q[u[i].q].comm->nranks, 1);
    /* Schedules never started: the built calls' (the others were never
     * built, or were handed to the engine). */
    for (size_t i = 0; i < n; i++)
        if (!q[i].fn) loomi_sched_free(&q[i].s);
    free(q);
    free(u);
    free(memstore);
    free(order);
    free(ops);
    return first;
}

/* ------------------------------------------------------- point to point */

loom_result_t loomi_call_p2p(const char *fn, int is_send, const void *sbuf, void *rbuf,
                             size_t count, loom_datatype_t dtype, int peer, loom_comm_t h,
                             loom_request_t *req)
{
    struct loom_comm *comm;
    loom_result_t r = loomi_group_active() ? loomi_comm_check_queued(h, fn, &comm)
                                           : loomi_comm_check(h, fn, &comm);
    if (r != LOOM_SUCCESS) return r;
    size_t es = loom_datatype_size(dtype);
    if (!es)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, comm->rank,
                          "%s: dtype %d is not a valid datatype", fn, (int)dtype);
    if (peer < 0 || peer >= comm->nranks)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, comm->rank,
                          "%s: peer %d is not a rank of this communicator (size %d)", fn, peer,
                          comm->nranks);
    if (count > SIZE_MAX / 4 / es)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, comm->rank, "%s: count %zu is too large",
                          fn, count);
    if (count && !(is_send ? sbuf : (const void *)rbuf))
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, comm->rank, "%s: buf is NULL", fn);
    char dmsg[256];
    if (count && loomi_devbuf_refused(fn, is_send ? sbuf : (const void *)rbuf, "buf", dmsg,
                                      sizeof dmsg))
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, comm->rank, "%s", dmsg);
    if (req && loomi_group_active())
        return loomi_fail(LOOM_ERR_INVALID_USAGE, comm->rank,
                          "%s: non-blocking calls are not allowed between loom_group_start and "
                          "loom_group_end (use the blocking form: loom_group_end completes it)",
                          fn);
    /* A blocking send to oneself could only wait for a receive that the
     * same thread can never post. */
    if (peer == comm->rank && !req && !loomi_group_active())
        return loomi_fail(LOOM_ERR_INVALID_USAGE, comm->rank,
                          "%s: peer %d is the calling rank itself: a transfer with oneself must "
                          "be in a group with its counterpart, or non-blocking",
                          fn, peer);
    if (!comm->p2p_seq) {
        comm->p2p_seq = calloc(2 * (size_t)comm->nranks, sizeof *comm->p2p_seq);
        if (!comm->p2p_seq)
            return loomi_fail(LOOM_ERR_NO_MEMORY, comm->rank, "%s: out of memory", fn);
    }
    struct loomi_sched s;
    loomi_sched_init(&s, comm->rank, comm->nranks, dtype, LOOM_SUM);
    s.p2p = 1;
    uint32_t tag = comm->p2p_seq[2 * (size_t)peer + (is_send ? 0 : 1)]++;
    if (is_send) {
        s.buf_bytes[LOOMI_BUF_SEND] = count * es;
        loomi_sched_send(&s, peer, tag, LOOMI_BUF_SEND, 0, count, NULL, 0);
    } else {
        s.buf_bytes[LOOMI_BUF_RECV] = count * es;
        loomi_sched_recv(&s, peer, tag, LOOMI_BUF_RECV, 0, count, NULL, 0);
    }
    if (loomi_group_active()) return loomi_group_queue(comm, &s, sbuf, rbuf, 0);
    struct loomi_op *op;
    r = loomi_comm_start(comm, fn, &s, sbuf, rbuf, 0, req, &op);
    if (r != LOOM_SUCCESS || req) return r;
    return loomi_op_wait(op);
}
