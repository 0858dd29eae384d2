/*
 * collectives.c - the collective calls' bodies (the public door is
 * src/api/collectives.c): check the arguments, pick the algorithm, build
 * the schedule, then run it now (blocking), hand back a request
 * (non-blocking) or queue it (inside a group); and the calls on requests.
 *
 * Every check happens before anything is touched, so a call rejected for
 * its arguments leaves every buffer as it was.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "coll/coll_util.h"
#include "comm/collectives.h"
#include "comm/comm.h"
#include "comm/devbuf.h"
#include "comm/devpeer.h"
#include "comm/group.h"
#include "core/cuda.h"
#include "core/internal.h"
#include "transports/route.h"
#include "transports/verbs/verbs.h"

/* What one call asks for, after its arguments were checked. */
struct call {
    const char *fn;
    struct loom_comm *comm;
    loom_datatype_t dtype;
    loom_op_t op;
    const void *sendbuf;
    void *recvbuf;
    struct loomi_coll_args a;
    struct loomi_cz cz; /* compression (cz.codec NULL: none) */
    /* CUDA device buffers (devbuf.c): which are, their lengths, and the
     * stream the call is ordered on (NULL: the legacy default stream). */
    int sdev, rdev;
    size_t slen, rlen;
    void *stream;
    /* A fused group operation over a staging buffer whose results are
     * copied out again at once: they stream whatever their size
     * (loomi_group_build's stream_results). */
    int stream_results;
    int direct; /* GPUDirect RDMA: the schedule runs on the device buffers themselves */
};

static loom_result_t bad(const struct call *c, const char *fmt, const char *what)
{
    return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, c->comm->rank, fmt, c->fn, what);
}

/* Checks every call shares: the communicator (which h names: set in
 * c->comm), the type, the op (for reductions), the root, and that
 * blocks + per_rank * nranks blocks of count elements fit. */
static loom_result_t check_common(struct call *c, loom_comm_t h, int reduces, int rooted,
                                  size_t count, size_t blocks, size_t per_rank)
{
    struct loom_comm *comm;
    loom_result_t r = loomi_comm_live(h, c->fn, &comm);
    if (r != LOOM_SUCCESS) return r;
    c->comm = comm;
    blocks += per_rank * (size_t)comm->nranks;
    size_t es = loom_datatype_size(c->dtype);
    if (!es)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, comm->rank,
                          "%s: dtype %d is not a valid datatype", c->fn, (int)c->dtype);
    if (reduces && (unsigned)c->op >= LOOM_NUM_OPS)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, comm->rank,
                          "%s: op %d is not a valid reduction op", c->fn, (int)c->op);
    if (rooted && (c->a.root < 0 || c->a.root >= comm->nranks))
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, comm->rank,
                          "%s: root %d is not a rank of this communicator (size %d)", c->fn,
                          c->a.root, comm->nranks);
    if (blocks && count > SIZE_MAX / 4 / es / blocks)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, comm->rank,
                          "%s: count %zu is too large", c->fn, count);
    return LOOM_SUCCESS;
}

static int overlap(const void *a, size_t alen, const void *b, size_t blen)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return alen && blen && x < y + blen && y < x + alen;
}

/* A buffer CUDA's driver calls device memory is staged through pinned
 * host memory (devbuf.c; managed memory is host-accessible and taken as
 * host memory); refused where the driver lacks what staging needs.  The
 * driver is asked only where it is loaded and initialised (core/cuda.h);
 * elsewhere no pointer is device memory.  *dev: whether p is. */
static loom_result_t host_mem(const struct call *c, const void *p, const char *what, int *dev)
{
    *dev = 0;
    if (loomi_mem_kind(p) != LOOMI_MEM_DEVICE) return LOOM_SUCCESS;
    const char *missing = loomi_devbuf_missing();
    if (missing)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, c->comm->rank,
                          "%s: %s %p is CUDA device memory, which cannot be staged (%s): pass "
                          "host (or managed) memory",
                          c->fn, what, p, missing);
    *dev = 1;
    return LOOM_SUCCESS;
}

/* sendbuf (slen bytes) and recvbuf (rlen) must be non-NULL where they have
 * bytes, host memory, and must not overlap unless the call is in place. */
static loom_result_t check_bufs(struct call *c, size_t slen, size_t rlen, int inplace)
{
    if (slen && !c->sendbuf) return bad(c, "%s: %s is NULL", "sendbuf");
    if (rlen && !c->recvbuf) return bad(c, "%s: %s is NULL", "recvbuf");
    loom_result_t r;
    c->slen = slen;
    c->rlen = rlen;
    if (slen && (r = host_mem(c, c->sendbuf, "sendbuf", &c->sdev)) != LOOM_SUCCESS) return r;
    if (rlen && slen && (const void *)c->recvbuf == c->sendbuf) c->rdev = c->sdev;
    else if (rlen && (r = host_mem(c, c->recvbuf, "recvbuf", &c->rdev)) != LOOM_SUCCESS)
        return r;
    if ((c->sdev || c->rdev) && loomi_group_active())
        return loomi_fail(LOOM_ERR_INVALID_USAGE, c->comm->rank,
                          "%s: CUDA device buffers are not supported between loom_group_start "
                          "and loom_group_end yet: pass host memory, or call outside the group",
                          c->fn);
    if (!inplace && overlap(c->sendbuf, slen, c->recvbuf, rlen))
        return bad(c, "%s: %s overlap without being the in-place form",
                   "sendbuf and recvbuf");
    return LOOM_SUCCESS;
}

/* Schedules of small operations, kept per communicator: building one
 * (allocations, dependency lists) costs as much as running it.  Entries
 * are never evicted, so an operation may borrow one for as long as the
 * communicator lives; when the cache is full, new shapes are built each
 * time.  Only the calling thread of a communicator touches it. */
#define SCHED_CACHE_SLOTS 32
#define SCHED_CACHE_MAX_BYTES ((size_t)64 << 10)
/* What makes two calls' schedules the same (zeroed, then filled, so that
 * memcmp sees no padding). */
struct sched_key {
    int coll, algo, inplace, root;
    loom_datatype_t dtype;
    loom_op_t op;
    size_t count, chunk, shared, stream;
    int saves, copyin, gossip_peer1;
    uint64_t win;
    size_t win_send, win_recv;
    const void *hosts; /* tests change these on a live communicator */
};

struct loomi_sched_cache {
    int n;
    struct {
        struct sched_key k;
        struct loomi_sched s;
    } e[SCHED_CACHE_SLOTS];
};

void loomi_sched_cache_free(struct loomi_sched_cache *sc)
{
    if (!sc) return;
    for (int i = 0; i < sc->n; i++) loomi_sched_free(&sc->e[i].s);
    free(sc);
}

/* The schedule for c with algo, from the cache or built (and cached). */
static loom_result_t get_sched(struct loom_comm *comm, const struct call *c, int algo,
                               struct loomi_sched *s)
{
    size_t es = loom_datatype_size(c->dtype);
    int cacheable = c->a.coll != LOOMI_COLL_ALLTOALLV && c->a.count * es <= SCHED_CACHE_MAX_BYTES;
    struct sched_key k;
    memset(&k, 0, sizeof k);
    k.coll = c->a.coll;
    k.algo = algo;
    k.inplace = c->a.inplace;
    k.root = c->a.root;
    k.gossip_peer1 = c->a.gossip_peer1;
    k.dtype = c->dtype;
    k.op = c->op;
    k.count = c->a.count;
    k.chunk = c->a.chunk_bytes;
    k.shared = c->a.shared_bytes;
    k.stream = c->a.stream_bytes;
    k.saves = c->a.stream_saves;
    k.copyin = c->a.stream_copyin;
    k.win = c->a.win_id;
    k.win_send = c->a.win_send_off;
    k.win_recv = c->a.win_recv_off;
    k.hosts = c->a.hosts;
    struct loomi_sched_cache *sc = comm->sched_cache;
    if (cacheable && sc)
        for (int i = 0; i < sc->n; i++)
            if (!memcmp(&sc->e[i].k, &k, sizeof k)) {
                *s = sc->e[i].s;
                s->borrowed = 1;
                return LOOM_SUCCESS;
            }
    loom_result_t r = loomi_coll_build(s, comm->rank, comm->nranks, c->dtype, c->op, &c->a, algo);
    if (r != LOOM_SUCCESS || !cacheable) return r;
    if (!sc) sc = comm->sched_cache = calloc(1, sizeof *sc);
    if (!sc || sc->n == SCHED_CACHE_SLOTS) return LOOM_SUCCESS;
    r = loomi_sched_finish(s);
    if (r != LOOM_SUCCESS) {
        loomi_sched_free(s);
        return r;
    }
    sc->e[sc->n].k = k;
    sc->e[sc->n++].s = *s;
    s->borrowed = 1;
    return LOOM_SUCCESS;
}

/* The schedule of a compressed call (compressed.c). */
static loom_result_t build_cz(struct loom_comm *comm, const struct call *c, struct loomi_sched *s)
{
    loomi_sched_init(s, comm->rank, comm->nranks, c->dtype, c->op);
    loom_result_t r;
    switch (c->a.coll) {
    case LOOMI_COLL_ALLREDUCE: r = loomi_gen_allreduce_cz(s, &c->a, &c->cz); break;
    case LOOMI_COLL_REDUCE_SCATTER: r = loomi_gen_reduce_scatter_cz(s, &c->a, &c->cz); break;
    case LOOMI_COLL_ALLGATHER: r = loomi_gen_allgather_cz(s, &c->a, &c->cz); break;
    default: r = loomi_fail(LOOM_ERR_INTERNAL, comm->rank, "%s: no compressed form", c->fn);
    }
    if (r != LOOM_SUCCESS) loomi_sched_free(s);
    return r;
}

/* Is codec one that loom_codec_find returned? */
static int codec_ok(const loom_codec_t *codec)
{
    size_t b;
    return codec && loom_codec_max_encoded_bytes(codec, 1, &b) == LOOM_SUCCESS;
}

/* Check a call's options (after check_common) and set c->cz.  opts NULL:
 * the communicator's codec, for allreduce on fp32 SUM/AVG. */
static loom_result_t check_opts(struct call *c, const loom_coll_options_t *o)
{
    struct loom_comm *comm = c->comm;
    int reduces = c->a.coll != LOOMI_COLL_ALLGATHER;
    int fits = c->dtype == LOOM_FLOAT32 && (!reduces || c->op == LOOM_SUM || c->op == LOOM_AVG);
    if (!o) {
        if (c->a.coll == LOOMI_COLL_ALLREDUCE && comm->codec && fits) c->cz.codec = comm->codec;
        return LOOM_SUCCESS;
    }
    /* The struct grows at its end: a caller built against an older
     * loom.h passes a smaller one, whose later members are not read.
     * The first version ended at key. */
#define HAS(m) (o->size >= offsetof(loom_coll_options_t, m) + sizeof o->m)
    if (!HAS(key))
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, comm->rank,
                          "%s: opts->size %zu is less than sizeof(loom_coll_options_t) %zu "
                          "(initialise with LOOM_COLL_OPTIONS_INITIALIZER)",
                          c->fn, o->size, sizeof *o);
    if (HAS(stream)) c->stream = o->stream;
#undef HAS
    if (!o->codec) {
        if (o->state)
            return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, comm->rank,
                              "%s: opts->state is set but opts->codec is NULL", c->fn);
        return LOOM_SUCCESS;
    }
    if (!codec_ok(o->codec))
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, comm->rank,
                          "%s: opts->codec is not a codec found by loom_codec_find", c->fn);
    if (c->dtype != LOOM_FLOAT32)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, comm->rank,
                          "%s: dtype %s: opts->codec %s compresses LOOM_FLOAT32 data only",
                          c->fn, loomi_dtype_name(c->dtype), o->codec->name);
    if (!fits)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, comm->rank,
                          "%s: op %d: opts->codec %s compresses LOOM_SUM and LOOM_AVG only",
                          c->fn, (int)c->op, o->codec->name);
    c->cz.codec = o->codec;
    c->cz.state = o->state;
    c->cz.key = o->key;
    return LOOM_SUCCESS;
}

/* loom_comm_set_codec and loom_comm_set_algo are local settings: they
 * work on a broken communicator too (a rank that sets one around a call
 * that fails must be able to put it back, or the communicator that shrink
 * makes from comm inherits it on this rank alone). */
loom_result_t loom_comm_set_codec(loom_comm_t h, const loom_codec_t *codec)
{
    struct loom_comm *comm;
    loom_result_t r = loomi_comm_live(h, "loom_comm_set_codec", &comm);
    if (r != LOOM_SUCCESS) return r;
    if (codec && !codec_ok(codec))
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, comm->rank,
                          "loom_comm_set_codec: codec is not a codec found by loom_codec_find");
    comm->codec = codec;
    return LOOM_SUCCESS;
}

loom_result_t loom_comm_set_algo(loom_comm_t h, const char *spec)
{
    struct loom_comm *comm;
    loom_result_t r = loomi_comm_live(h, "loom_comm_set_algo", &comm);
    if (r != LOOM_SUCCESS) return r;
    /* Parsed aside, so that a bad spec leaves the setting as it was. */
    int forced[LOOMI_MAX_COLLS];
    for (int c = 0; c < LOOMI_MAX_COLLS; c++) forced[c] = LOOMI_ALGO_AUTO;
    r = loomi_algo_parse("loom_comm_set_algo: spec", spec, forced, comm->rank);
    if (r != LOOM_SUCCESS) return r;
    memcpy(comm->algo_forced, forced, sizeof comm->algo_forced);
    return LOOM_SUCCESS;
}

loom_result_t loomi_comm_start(struct loom_comm *comm, const char *fn, struct loomi_sched *s,
                               const void *sbuf, void *rbuf, int save, loom_request_t *req,
                               struct loomi_op **op)
{
    uintptr_t rh = 0;
    if (req && !(rh = loomi_handle_new(LOOMI_HANDLE_REQUEST, NULL))) {
        loomi_sched_free(s);
        return loomi_fail(LOOM_ERR_NO_MEMORY, comm->rank,
                          "%s: no request handle left (too many requests not yet waited for)",
                          fn);
    }
    loom_result_t r = loomi_op_start(&comm->eng, s, sbuf, rbuf, save, op);
    if (r != LOOM_SUCCESS) {
        loomi_handle_drop(LOOMI_HANDLE_REQUEST, rh);
        return r;
    }
    if (req) {
        loomi_op_set_request(*op, rh);
        *req = (loom_request_t)rh;
    }
    return LOOM_SUCCESS;
}


/* Build the schedule of c (described by d) and run it, hand it out as a
 * request, or queue it (group: out NULL) or hand it over (out). */
static loom_result_t launch_as(struct call *c, const struct loomi_call *d, loom_request_t *req,
                               int group, struct loomi_sched *out, int *out_save)
{
    struct loom_comm *comm = c->comm;
    size_t es = loom_datatype_size(c->dtype);
    /* The call's number and check, whatever path it takes (calls.h). */
    uint32_t chk;
    const uint64_t no = loomi_call_begin(comm, d, &chk);
    /* A broken communicator fails the call (it counts among this rank's
     * calls: a mismatch's verdict sees it). */
    loom_result_t r = LOOM_SUCCESS;
    if (comm->eng.pt || comm->error != LOOM_SUCCESS)
        r = loomi_comm_check_call(comm, c->fn, group && !out);
    if (r != LOOM_SUCCESS) return r;
    /* Small blocking calls on one host: the arenas' slots (small.c). */
    if (!req && !group && !c->cz.codec && c->a.coll != LOOMI_COLL_GOSSIP &&
        loomi_small_fits(comm, c->a.coll, c->a.count * es, c->dtype, c->op))
        return loomi_small_coll(comm, c->a.coll, c->sendbuf, c->recvbuf, c->a.count, c->dtype,
                                c->op, c->fn, no, chk);
    /* A rooted collective can complete on a rank that never hears from
     * a peer that made it otherwise: the next small calls look at the
     * transport for that peer's messages (small.c). */
    if (c->a.coll == LOOMI_COLL_BROADCAST || c->a.coll == LOOMI_COLL_REDUCE ||
        c->a.coll == LOOMI_COLL_GATHER || c->a.coll == LOOMI_COLL_SCATTER)
        comm->poll_slots = LOOMI_CALL_POLL_SLOTS;
    size_t chunk = 0;
    /* Gossip has one algorithm, the pair exchange, in LOOM_CHUNK_SIZE
     * chunks: nothing for the selection table to weigh. */
    int algo = c->a.coll == LOOMI_COLL_GOSSIP
                   ? LOOMI_ALGO_PAIRWISE
                   : loomi_algo_for(comm, c->a.coll, c->a.count * es, c->a.inplace, c->dtype,
                                    c->op, &chunk);
    /* The model did not weigh compressed schedules: LOOM_CHUNK_SIZE for them. */
    c->a.chunk_bytes = chunk && !c->cz.codec ? chunk : comm->set.chunk_bytes;
    c->a.hosts = comm->hosts;
    c->a.shared_bytes = comm->shared_bytes;
    c->a.stream_bytes = c->stream_results && comm->set.shm_stream ? 1 : comm->set.shm_stream;
    /* Shared allreduces: streamed or cached stores where the first such
     * blocking calls measure which (coll.h): in place past LOOM_SHM_STREAM
     * the saves, staged the copy-in.  One at a time: while the saves are
     * on trial, the copy-in keeps what its size has (cached if nothing
     * yet), or the two would alternate together and neither could be
     * told from the other. */
    struct loomi_mode_tuner *tune = NULL;
    if (algo == LOOMI_ALGO_SHARED && c->a.coll == LOOMI_COLL_ALLREDUCE && !c->cz.codec &&
        comm->hosts) {
        const struct loomi_hostmap *m = comm->hosts;
        const int L = loomi_host_size(m, m->host_of[comm->rank]);
        const int trial = !req && !group && !comm->timing;
        const size_t n = c->a.count * es;
        if (c->a.inplace && loomi_shared_streams(c->a.stream_bytes, L, n)) {
            int fixed = comm->set.shm_stream_saves; /* LOOM_SHM_STREAM_SAVES */
            c->a.stream_saves = fixed >= 0 ? fixed : loomi_tuner_mode(&comm->saves);
            if (fixed < 0 && trial && !comm->saves.decided) tune = &comm->saves;
        }
        struct loomi_mode_tuner *t = loomi_copyin_tuner_for(&comm->copyin, c->a.inplace, n);
        int fixed = comm->set.shm_stream_copyin; /* LOOM_SHM_STREAM_COPYIN */
        if (c->a.win_id || !t) {
            /* The window form copies nothing in; small vectors stay cached. */
        } else if (fixed >= 0) {
            c->a.stream_copyin = fixed;
        } else if (tune || !trial || t->decided) {
            c->a.stream_copyin = t->decided ? t->mode : 0;
        } else {
            c->a.stream_copyin = loomi_tuner_mode(t);
            tune = t;
        }
    }
    struct loomi_sched s;
    /* Queued group members are handed over (the group frees them).
     * Compressed schedules are built each time (not cached: they carry
     * the codec and the error-feedback state). */
    r = c->cz.codec ? build_cz(comm, c, &s)
                      : group     ? loomi_coll_build(&s, comm->rank, comm->nranks, c->dtype,
                                                     c->op, &c->a, algo)
                                  : get_sched(comm, c, algo, &s);
    if (r != LOOM_SUCCESS) return r;
    if (c->cz.codec) algo = LOOMI_ALGO_RING;
    s.coll1 = c->a.coll + 1;
    s.algo = algo;
    s.call = no;
    s.chk = chk;
    s.dev = c->direct;
    LOOMI_TRACE(comm->rank, "%s: count %zu %s, %s, chunks of %zu, %u steps%s%s", c->fn,
                c->a.count, loomi_dtype_name(c->dtype), loomi_algo_name(algo), c->a.chunk_bytes,
                s.nsteps,
                c->a.inplace ? ", in place" : "", s.win_id ? ", from the window" : "");
    /* The engine saves RECV and puts it back if the operation fails, where
     * RECV holds input the operation overwrites.  In-place allgather,
     * gather and broadcast never write their input (the caller's own
     * block, the root's buffer), so they skip that copy. */
    int coll = c->a.coll;
    int save = c->a.inplace && (coll == LOOMI_COLL_ALLREDUCE || coll == LOOMI_COLL_REDUCE_SCATTER ||
                                coll == LOOMI_COLL_ALLTOALL || coll == LOOMI_COLL_REDUCE ||
                                coll == LOOMI_COLL_GOSSIP);
    if (out) {
        *out = s;
        *out_save = save;
        return LOOM_SUCCESS;
    }
    if (group) return loomi_group_queue(comm, &s, c->sendbuf, c->recvbuf, save);
    struct loomi_op *op;
    const uint64_t t0 = tune ? loomi_now_ns() : 0;
    r = loomi_comm_start(comm, c->fn, &s, c->sendbuf, c->recvbuf, save, req, &op);
    if (r != LOOM_SUCCESS || req) return r;
    r = loomi_op_wait(op);
    if (tune && r == LOOM_SUCCESS) {
        const int saves = tune == &comm->saves;
        loomi_tuner_record(tune, saves ? c->a.stream_saves : c->a.stream_copyin, c->a.count * es,
                           (double)(loomi_now_ns() - t0));
        if (tune->decided)
            LOOMI_INFO(comm->rank, "shared allreduce of %zu bytes%s: %s %s (best %.3f ns/B "
                       "streamed, %.3f cached)", c->a.count * es,
                       c->a.inplace ? ", in place" : "", tune->mode ? "streamed" : "cached",
                       saves ? "saves" : "copy-in", tune->best[1], tune->best[0]);
    }
    return r;
}

int loomi_tuner_mode(const struct loomi_mode_tuner *t)
{
    return t->decided ? t->mode : t->calls % 2;
}

void loomi_tuner_record(struct loomi_mode_tuner *t, int mode, size_t bytes, double ns)
{
    if (t->decided || !bytes || ns <= 0 || mode < 0 || mode > 1) return;
    double v = ns / (double)bytes;
    if (t->best[mode] == 0 || v < t->best[mode]) t->best[mode] = v;
    if (++t->calls < LOOMI_TUNER_TRIALS) return;
    t->decided = 1;
    t->mode = t->best[0] > 0 && t->best[1] > 0 && t->best[1] < 0.95 * t->best[0];
}

struct loomi_mode_tuner *loomi_copyin_tuner_for(struct loomi_copyin_tuner *c, int inplace,
                                                size_t bytes)
{
    if (bytes < LOOMI_COPYIN_MIN) return NULL;
    int k = 0;
    for (size_t b = bytes / LOOMI_COPYIN_MIN; b > 1 && k < LOOMI_COPYIN_SIZES - 1; b /= 2) k++;
    return &c->t[inplace != 0][k];
}

static struct call call_init(const char *fn, int coll, const void *sendbuf, void *recvbuf,
                             size_t count, loom_datatype_t dtype, loom_op_t op, int root)
{
    struct call c;
    memset(&c, 0, sizeof c);
    c.fn = fn;
    c.dtype = dtype;
    c.op = op;
    c.sendbuf = sendbuf;
    c.recvbuf = recvbuf;
    c.a.coll = coll;
    c.a.count = count;
    c.a.root = root;
    return c;
}

/* Allreduce: both buffers in one loom_mem_alloc window, which shared.c
 * then reads from the peers (c->a.win_*). */
static void find_window(struct call *c, size_t n)
{
    uint64_t ws, wr;
    size_t os, orv, wb;
    if (c->comm->wins && n && loomi_mem_window_find(c->comm, c->recvbuf, n, &wr, &orv, &wb) &&
        loomi_mem_window_find(c->comm, c->sendbuf, n, &ws, &os, &wb) && ws == wr) {
        c->a.win_id = wr;
        c->a.win_send_off = os;
        c->a.win_recv_off = orv;
        c->a.win_bytes = wb;
    }
}

/* Build the schedule and run it, hand it out as a request, or queue it:
 * in a group, a small allreduce, reduce-scatter or allgather is queued
 * unbuilt, to be fused with others at loom_group_end (group.c). */
static loom_result_t launch(struct call *c, loom_request_t *req)
{
    struct loom_comm *comm = c->comm;
    int group = loomi_group_active();
    if (req && group)
        return loomi_fail(LOOM_ERR_INVALID_USAGE, comm->rank,
                          "%s: non-blocking calls are not allowed between loom_group_start and "
                          "loom_group_end (use the blocking form: loom_group_end completes it)",
                          c->fn);
    if (group && !c->cz.codec && !c->a.win_id &&
        loomi_fuse_eligible(c->a.coll, c->a.count, loom_datatype_size(c->dtype), comm->nranks))
        return loomi_group_queue_call(comm, c->fn, c->a.coll, c->sendbuf, c->recvbuf, c->a.count,
                                      c->dtype, c->op, c->a.inplace);
    const struct loomi_call d = loomi_call_make(c->a.coll, c->a.count, c->dtype, c->op,
                                                c->a.root, c->cz.codec != NULL);
    return launch_as(c, &d, req, group, NULL, NULL);
}

/* launch (d NULL) or launch_as(c, d), with device buffers staged through
 * host memory (devbuf.h): a blocking call copies its result back before
 * it returns; a non-blocking one when its request completes. */
/* One chunk of a pipelined device call (devbuf.h): the call on host
 * staging buffers, count elements, out of place, non-blocking. */
static loom_result_t launch_chunk(void *ctx, const void *hs, void *hr, size_t count,
                                  loom_request_t *req)
{
    struct call cc = *(const struct call *)ctx;
    cc.sendbuf = hs;
    cc.recvbuf = hr;
    cc.a.count = count;
    cc.a.inplace = 0;
    cc.a.win_id = 0;
    cc.sdev = cc.rdev = 0;
    return launch(&cc, req);
}

/* GPUDirect RDMA (LOOM_GPUDIRECT): an alltoall, allgather or broadcast,
 * out of place, whose buffers with bytes are all device memory, on a
 * communicator whose every peer is reached through verbs, runs on the
 * device buffers themselves where this rank's NIC registers them
 * (dmabuf): the NIC reads and writes device memory, eager messages and
 * the schedule's own copies go through the driver.  Calls that staging
 * would pipeline (LOOM_CUDA_PIPELINE_CHUNK) and calls small enough for
 * the shared arenas are left to staging, so that the messages on the
 * wire are the same whichever path each rank takes: ranks decide alone.
 * Returns 1 (taken: *r its result), 0 (staged), or -1 (*r an error:
 * LOOM_GPUDIRECT=1 and the NIC or driver refused). */
static int gd_try(struct call *c, const struct loomi_call *d, loom_request_t *req,
                  loom_result_t *r)
{
    struct loom_comm *comm = c->comm;
    const int coll = c->a.coll;
    if (comm->set.gpudirect == LOOMI_GPUDIRECT_OFF || d || c->cz.codec || c->a.win_id ||
        c->a.inplace || (coll != LOOMI_COLL_ALLTOALL && coll != LOOMI_COLL_ALLGATHER &&
                         coll != LOOMI_COLL_BROADCAST))
        return 0;
    if ((c->slen && !c->sdev) || (c->rlen && !c->rdev) || (!c->slen && !c->rlen) ||
        (c->slen && c->rlen && (const void *)c->recvbuf == c->sendbuf))
        return 0;
    const size_t es = loom_datatype_size(c->dtype), p = (size_t)comm->nranks;
    if (coll != LOOMI_COLL_ALLTOALL &&
        loomi_devbuf_pipe_chunk(coll == LOOMI_COLL_ALLGATHER ? c->rlen / p : c->rlen, es))
        return 0;
    if (loomi_small_fits(comm, coll, c->a.count * es, c->dtype, c->op)) return 0;
    if (comm->eng.tops != &loomi_route_ops) return 0;
    for (int q = 0; q < comm->nranks; q++)
        if (q != comm->rank && loomi_route_peer_transport(comm->eng.tstate, q, NULL) != 2)
            return 0;
    void *vs = loomi_route_verbs_state(comm->eng.tstate);
    if (!vs) return 0;
    char why[256] = "";
    loomi_comm_lock(comm);
    int ok = 1;
    if (c->slen)
        ok = loomi_verbs_gd_probe(vs, c->fn, (void *)(uintptr_t)c->sendbuf, c->slen, why,
                                  sizeof why);
    if (ok == 1 && c->rlen)
        ok = loomi_verbs_gd_probe(vs, c->fn, c->recvbuf, c->rlen, why, sizeof why);
    loomi_comm_unlock(comm);
    if (ok < 0) {
        *r = LOOM_ERR_UNSUPPORTED; /* set by the probe, naming LOOM_GPUDIRECT */
        return -1;
    }
    if (!ok) {
        comm->gd_staged++;
        LOOMI_TRACE(comm->rank, "%s: device buffers staged: %s", c->fn, why);
        return 0;
    }
    /* The work queued on the call's stream first, as staging does. */
    const struct loomi_cuda_drv *drv = loomi_cuda_driver();
    loomi_cu_t e = drv && drv->StreamSynchronize ? drv->StreamSynchronize(c->stream) : 0;
    if (e) {
        *r = loomi_fail(LOOM_ERR_SYSTEM, comm->rank, "%s: cuStreamSynchronize: %s", c->fn,
                        loomi_cuda_strerror(e));
        return 1;
    }
    comm->gd_direct++;
    c->direct = 1;
    *r = launch(c, req);
    c->direct = 0;
    return 1;
}

static loom_result_t launch_dev(struct call *c, const struct loomi_call *d, loom_request_t *req)
{
    if (!c->sdev && !c->rdev) return d ? launch_as(c, d, req, 0, NULL, NULL) : launch(c, req);
    /* Every rank on one host with device buffers: through CUDA IPC
     * (devpeer.h), unless some rank cannot; then staged. */
    if (!d && !req && !c->cz.codec && !c->a.win_id && (!c->slen || c->sdev) &&
        (!c->rlen || c->rdev)) {
        int taken = 0;
        loom_result_t r =
            loomi_devpeer_call(c->comm, c->fn, c->a.coll, c->sendbuf, c->recvbuf, c->a.count,
                               c->dtype, c->op, c->a.root, c->stream, &taken);
        if (r != LOOM_SUCCESS || taken) return r;
    }
    {
        loom_result_t gr = LOOM_SUCCESS;
        if (gd_try(c, d, req, &gr)) return gr;
    }
    /* Large element-wise calls on device buffers alone: pipelined, the
     * copies overlapping the host collective (reduce-scatter's sendbuf and
     * allgather's recvbuf: p blocks, each chunked alike). */
    const int coll = c->a.coll;
    const size_t p = (size_t)c->comm->nranks;
    const size_t sbl = coll == LOOMI_COLL_REDUCE_SCATTER ? p : 1;
    const size_t rbl = coll == LOOMI_COLL_ALLGATHER ? p : 1;
    if (!d && !c->cz.codec &&
        (coll == LOOMI_COLL_ALLREDUCE || coll == LOOMI_COLL_BROADCAST ||
         coll == LOOMI_COLL_REDUCE || coll == LOOMI_COLL_REDUCE_SCATTER ||
         coll == LOOMI_COLL_ALLGATHER) &&
        (c->sdev || !c->slen) && (c->rdev || !c->rlen)) {
        const size_t es = loom_datatype_size(c->dtype);
        const size_t blk = c->slen ? c->slen / sbl : c->rlen / rbl;
        const size_t chunk = loomi_devbuf_pipe_chunk(blk, es);
        if (chunk)
            return loomi_devbuf_pipeline(c->comm, c->fn, c->stream, c->sendbuf, c->slen,
                                         c->recvbuf, c->rlen, es, chunk, sbl, rbl, launch_chunk,
                                         c, req);
    }
    /* recvbuf is read where the call is in place, and alltoallv's may
     * hold bytes between its blocks that no peer writes. */
    const int rin = c->a.inplace || c->a.coll == LOOMI_COLL_ALLTOALLV;
    struct loomi_devcall *dc;
    const void *hs;
    void *hr;
    loom_result_t r = loomi_devbuf_stage(c->comm, c->fn, c->stream, c->sendbuf, c->slen, c->sdev,
                                         c->recvbuf, c->rlen, c->rdev, rin, &hs, &hr, &dc);
    if (r != LOOM_SUCCESS) return r;
    c->sendbuf = hs;
    c->recvbuf = hr;
    r = d ? launch_as(c, d, req, 0, NULL, NULL) : launch(c, req);
    if (r != LOOM_SUCCESS || !req) return loomi_devbuf_done(dc, r);
    loomi_devbuf_attach(dc, *req);
    return LOOM_SUCCESS;
}

loom_result_t loomi_group_build(struct loom_comm *comm, const char *fn, int coll,
                                const void *sendbuf, void *recvbuf, size_t count,
                                loom_datatype_t dtype, loom_op_t op, int inplace,
                                uint32_t members, uint32_t shape, int stream_results,
                                struct loomi_sched *s, int *save)
{
    struct call c = call_init(fn, coll, sendbuf, recvbuf, count, dtype, op, 0);
    c.comm = comm;
    c.a.inplace = inplace;
    c.stream_results = stream_results;
    if (coll == LOOMI_COLL_ALLREDUCE) find_window(&c, count * loom_datatype_size(dtype));
    const struct loomi_call d =
        members > 1 ? loomi_call_make_fused(coll, count, dtype, op, members, shape)
                    : loomi_call_make(coll, count, dtype, op, 0, 0);
    return launch_as(&c, &d, NULL, 1, s, save);
}

/* ------------------------------------------------------------ allreduce */

loom_result_t loomi_call_allreduce(const char *fn, const void *sendbuf, void *recvbuf, size_t count,
                                   loom_datatype_t dtype, loom_op_t op, loom_comm_t h,
                                   const loom_coll_options_t *opts, loom_request_t *req)
{
    struct call c = call_init(fn, LOOMI_COLL_ALLREDUCE, sendbuf, recvbuf, count, dtype, op, 0);
    loom_result_t r = check_common(&c, h, 1, 0, count, 2, 0);
    if (r == LOOM_SUCCESS) r = check_opts(&c, opts);
    if (r != LOOM_SUCCESS) return r;
    size_t n = count * loom_datatype_size(dtype);
    c.a.inplace = sendbuf == recvbuf;
    if ((r = check_bufs(&c, n, n, c.a.inplace)) != LOOM_SUCCESS) return r;
    find_window(&c, n);
    return launch_dev(&c, NULL, req);
}

/* ------------------------------------------------------- reduce_scatter */

/* Reduce-scatter and allgather: one buffer holds p blocks (sendbuf for
 * reduce-scatter, recvbuf for allgather), the other this rank's block; in
 * place when that block is this rank's own within the p. */
static loom_result_t call_blocks(struct call *c, loom_comm_t h, const loom_coll_options_t *opts,
                                 loom_request_t *req)
{
    const int rs = c->a.coll == LOOMI_COLL_REDUCE_SCATTER;
    loom_result_t r = check_common(c, h, rs, 0, c->a.count, 1, 1);
    if (r == LOOM_SUCCESS) r = check_opts(c, opts);
    if (r != LOOM_SUCCESS) return r;
    struct loom_comm *comm = c->comm;
    size_t n = c->a.count * loom_datatype_size(c->dtype), all = n * (size_t)comm->nranks;
    const char *big = rs ? c->sendbuf : c->recvbuf;
    const void *own = rs ? (const void *)c->recvbuf : c->sendbuf;
    c->a.inplace = big && big + (size_t)comm->rank * n == own;
    if ((r = check_bufs(c, rs ? all : n, rs ? n : all, c->a.inplace)) != LOOM_SUCCESS) return r;
    return launch_dev(c, NULL, req);
}

loom_result_t loomi_call_reduce_scatter(const char *fn, const void *sendbuf, void *recvbuf,
                                        size_t recvcount, loom_datatype_t dtype, loom_op_t op,
                                        loom_comm_t h, const loom_coll_options_t *opts,
                                        loom_request_t *req)
{
    struct call c =
        call_init(fn, LOOMI_COLL_REDUCE_SCATTER, sendbuf, recvbuf, recvcount, dtype, op, 0);
    return call_blocks(&c, h, opts, req);
}

/* ------------------------------------------------------------ allgather */

loom_result_t loomi_call_allgather(const char *fn, const void *sendbuf, void *recvbuf,
                                   size_t sendcount, loom_datatype_t dtype, loom_comm_t h,
                                   const loom_coll_options_t *opts, loom_request_t *req)
{
    struct call c =
        call_init(fn, LOOMI_COLL_ALLGATHER, sendbuf, recvbuf, sendcount, dtype, LOOM_SUM, 0);
    return call_blocks(&c, h, opts, req);
}

/* ------------------------------------------------------------- alltoall */

loom_result_t loomi_call_alltoall(const char *fn, const void *sendbuf, void *recvbuf, size_t count,
                                  loom_datatype_t dtype, loom_comm_t h, loom_request_t *req)
{
    struct call c = call_init(fn, LOOMI_COLL_ALLTOALL, sendbuf, recvbuf, count, dtype, LOOM_SUM, 0);
    loom_result_t r = check_common(&c, h, 0, 0, count, 0, 2);
    if (r != LOOM_SUCCESS) return r;
    struct loom_comm *comm = c.comm;
    size_t n = count * loom_datatype_size(dtype) * (size_t)comm->nranks;
    c.a.inplace = sendbuf == recvbuf;
    if ((r = check_bufs(&c, n, n, c.a.inplace)) != LOOM_SUCCESS) return r;
    return launch_dev(&c, NULL, req);
}

/* ------------------------------------------------------------ alltoallv */

loom_result_t loomi_call_alltoallv(const char *fn, const void *sendbuf, const size_t *sendcounts,
                                   const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                                   const size_t *rdispls, loom_datatype_t dtype, loom_comm_t h,
                                   loom_request_t *req)
{
    struct call c = call_init(fn, LOOMI_COLL_ALLTOALLV, sendbuf, recvbuf, 0, dtype, LOOM_SUM, 0);
    loom_result_t r = check_common(&c, h, 0, 0, 0, 0, 0);
    if (r != LOOM_SUCCESS) return r;
    struct loom_comm *comm = c.comm;
    if (!sendcounts) return bad(&c, "%s: %s is NULL", "sendcounts");
    if (!sdispls) return bad(&c, "%s: %s is NULL", "sdispls");
    if (!recvcounts) return bad(&c, "%s: %s is NULL", "recvcounts");
    if (!rdispls) return bad(&c, "%s: %s is NULL", "rdispls");
    size_t es = loom_datatype_size(dtype);
    size_t se, re, lim = SIZE_MAX / 4 / es;
    int ok1 = loomi_vextent(sendcounts, sdispls, comm->nranks, lim, &se) < 0;
    int ok2 = loomi_vextent(recvcounts, rdispls, comm->nranks, lim, &re) < 0;
    if (!ok1) return bad(&c, "%s: %s reach beyond the address space", "sendcounts + sdispls");
    if (!ok2) return bad(&c, "%s: %s reach beyond the address space", "recvcounts + rdispls");
    /* Receive blocks must not overlap each other: two peers would write
     * the same bytes in an order nobody chose. */
    for (int i = 0; i < comm->nranks; i++)
        for (int j = i + 1; j < comm->nranks && recvcounts[i]; j++)
            if (recvcounts[j] && rdispls[i] < rdispls[j] + recvcounts[j] &&
                rdispls[j] < rdispls[i] + recvcounts[i])
                return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, comm->rank,
                                  "%s: rdispls: the blocks of ranks %d and %d overlap", fn, i, j);
    if ((r = check_bufs(&c, se * es, re * es, 0)) != LOOM_SUCCESS) return r;
    c.a.counts = sendcounts;
    c.a.displs = sdispls;
    c.a.rcounts = recvcounts;
    c.a.rdispls = rdispls;
    c.a.count = se > re ? se : re; /* for the algorithm choice */
    return launch_dev(&c, NULL, req);
}

/* ------------------------------------- broadcast, reduce, gather, scatter */

/* The rooted collectives share their checks.  The root's buffer (sendbuf
 * for broadcast and scatter, recvbuf for reduce and gather) holds one
 * block, or p for gather and scatter; other ranks neither pass nor touch
 * it. */
static loom_result_t call_rooted(struct call *c, loom_comm_t h, loom_request_t *req)
{
    const int coll = c->a.coll, root = c->a.root;
    const int blocks = coll == LOOMI_COLL_GATHER || coll == LOOMI_COLL_SCATTER;
    const int root_sends = coll == LOOMI_COLL_BROADCAST || coll == LOOMI_COLL_SCATTER;
    const size_t count = c->a.count;
    loom_result_t r = check_common(c, h, coll == LOOMI_COLL_REDUCE, 1, count, blocks ? 1 : 2,
                                   blocks ? 1 : 0);
    if (r != LOOM_SUCCESS) return r;
    struct loom_comm *comm = c->comm;
    size_t n = count * loom_datatype_size(c->dtype);
    int is_root = comm->rank == root;
    const char *sb = c->sendbuf, *rb = c->recvbuf;
    if (!blocks) c->a.inplace = is_root && sb == rb;
    else if (root_sends) c->a.inplace = is_root && sb && sb + (size_t)root * n == rb;
    else c->a.inplace = is_root && rb && rb + (size_t)root * n == sb;
    size_t rootn = is_root ? (blocks ? n * (size_t)comm->nranks : n) : 0;
    if (!is_root && root_sends) c->sendbuf = NULL; /* read on root only */
    if (!is_root && !root_sends) c->recvbuf = NULL; /* used on root only */
    r = check_bufs(c, root_sends ? rootn : n, root_sends ? n : rootn, c->a.inplace);
    if (r != LOOM_SUCCESS) return r;
    return launch_dev(c, NULL, req);
}

static loom_result_t rooted_call(const char *fn, int coll, const void *sendbuf, void *recvbuf,
                                 size_t count, loom_datatype_t dtype, loom_op_t op, int root,
                                 loom_comm_t h, loom_request_t *req)
{
    struct call c = call_init(fn, coll, sendbuf, recvbuf, count, dtype, op, root);
    return call_rooted(&c, h, req);
}

loom_result_t loomi_call_broadcast(const char *fn, const void *sendbuf, void *recvbuf, size_t count,
                                   loom_datatype_t dtype, int root, loom_comm_t h,
                                   loom_request_t *req)
{
    return rooted_call(fn, LOOMI_COLL_BROADCAST, sendbuf, recvbuf, count, dtype, LOOM_SUM, root,
                       h, req);
}

loom_result_t loomi_call_reduce(const char *fn, const void *sendbuf, void *recvbuf, size_t count,
                                loom_datatype_t dtype, loom_op_t op, int root, loom_comm_t h,
                                loom_request_t *req)
{
    return rooted_call(fn, LOOMI_COLL_REDUCE, sendbuf, recvbuf, count, dtype, op, root, h, req);
}

loom_result_t loomi_call_gather(const char *fn, const void *sendbuf, void *recvbuf,
                                size_t sendcount, loom_datatype_t dtype, int root, loom_comm_t h,
                                loom_request_t *req)
{
    return rooted_call(fn, LOOMI_COLL_GATHER, sendbuf, recvbuf, sendcount, dtype, LOOM_SUM, root,
                       h, req);
}

loom_result_t loomi_call_scatter(const char *fn, const void *sendbuf, void *recvbuf,
                                 size_t recvcount, loom_datatype_t dtype, int root, loom_comm_t h,
                                 loom_request_t *req)
{
    return rooted_call(fn, LOOMI_COLL_SCATTER, sendbuf, recvbuf, recvcount, dtype, LOOM_SUM, root,
                       h, req);
}

/* -------------------------------------------------------------- barrier */

loom_result_t loomi_call_barrier(const char *fn, loom_comm_t h, loom_request_t *req)
{
    struct call c = call_init(fn, LOOMI_COLL_BARRIER, NULL, NULL, 0, LOOM_UINT8, LOOM_SUM, 0);
    loom_result_t r = check_common(&c, h, 0, 0, 0, 0, 0);
    if (r != LOOM_SUCCESS) return r;
    return launch(&c, req);
}

/* --------------------------------------------------------------- gossip */

/* The seed of a communicator's gossip pairing: the same on every rank
 * (each holds the job's key), different between jobs: 64 bits of an
 * HMAC-SHA256 of the key (loomi_auth_tag), so that the pairings, which
 * anyone watching the traffic sees, tell nothing about the key. */
static uint64_t gossip_seed(const struct loom_comm *comm)
{
    unsigned char t[16];
    uint64_t seed;
    loomi_auth_tag(comm->job_key, "loom gossip pairing", t);
    memcpy(&seed, t, sizeof seed);
    return seed ^ (uint64_t)comm->nranks;
}

loom_result_t loomi_call_gossip(const char *fn, void *buf, size_t count, loom_datatype_t dtype,
                                int peer, uint64_t round, loom_comm_t h, loom_request_t *req)
{
    struct call c = call_init(fn, LOOMI_COLL_GOSSIP, NULL, buf, count, dtype, LOOM_SUM, 0);
    loom_result_t r = check_common(&c, h, 0, 0, count, 2, 0);
    if (r != LOOM_SUCCESS) return r;
    struct loom_comm *comm = c.comm;
    if (dtype != LOOM_FLOAT32 && dtype != LOOM_FLOAT64 && dtype != LOOM_FLOAT16 &&
        dtype != LOOM_BFLOAT16)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, comm->rank,
                          "%s: dtype %s cannot be averaged (float16, bfloat16, float32 or "
                          "float64 only)",
                          fn, loomi_dtype_name(dtype));
    if (peer != LOOM_GOSSIP_SEEDED && (peer < 0 || peer >= comm->nranks))
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, comm->rank,
                          "%s: peer %d is neither a rank of this communicator (size %d) nor "
                          "LOOM_GOSSIP_SEEDED",
                          fn, peer, comm->nranks);
    if (loomi_group_active())
        return loomi_fail(LOOM_ERR_INVALID_USAGE, comm->rank,
                          "%s: not allowed between loom_group_start and loom_group_end", fn);
    const size_t n = count * loom_datatype_size(dtype);
    if ((r = check_bufs(&c, 0, n, 1)) != LOOM_SUCCESS) return r;
    c.a.inplace = 1;
    int partner = peer;
    if (peer == LOOM_GOSSIP_SEEDED) {
        c.a.gossip_round = round;
        c.a.gossip_seed = gossip_seed(comm);
        partner = loomi_gossip_partner(comm->rank, comm->nranks, round, c.a.gossip_seed);
        if (partner < 0) partner = comm->rank; /* idle this round */
    }
    /* Resolved here, so that the schedule cache tells pairs apart. */
    c.a.gossip_peer1 = partner + 1;
    const struct loomi_call d = loomi_call_make_gossip(count, dtype, comm->rank, partner);
    return launch_dev(&c, &d, req);
}

loom_result_t loomi_call_gossip_partner(const char *fn, loom_comm_t h, uint64_t round,
                                        int *partner)
{
    struct loom_comm *comm;
    loom_result_t r = loomi_comm_live(h, fn, &comm);
    if (r != LOOM_SUCCESS) return r;
    if (!partner)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, comm->rank, "%s: partner is NULL", fn);
    int q = loomi_gossip_partner(comm->rank, comm->nranks, round, gossip_seed(comm));
    *partner = q < 0 ? comm->rank : q;
    return LOOM_SUCCESS;
}

/* ------------------------------------------------------------- requests */

/* The operation request req names, or LOOM_ERR_INVALID_ARGUMENT naming
 * fn and why. */
static loom_result_t request_op(const char *fn, const char *what, loom_request_t req,
                                struct loomi_op **op)
{
    enum loomi_handle_state why;
    *op = loomi_request_op(req, &why);
    if (*op) return LOOM_SUCCESS;
    return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1,
                      why == LOOMI_HANDLE_GONE
                          ? "%s: %s is not a live request (completed already: a request is "
                            "waited for, or tested done, once; or released by loom_comm_abort)"
                          : "%s: %s is not a request (never returned by a Loom call)",
                      fn, what);
}

static loom_result_t check_reqs(const char *fn, loom_request_t *reqs, int n)
{
    if (n < 0) return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1, "%s: n %d is negative", fn, n);
    if (n > 0 && !reqs)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1, "%s: reqs is NULL with n %d", fn, n);
    /* Every entry before anything waits: a stale one is refused, not
     * taken for whatever operation now lives at its old address. */
    for (int i = 0; i < n; i++) {
        struct loomi_op *o;
        char what[32];
        snprintf(what, sizeof what, "reqs[%d]", i);
        if (reqs[i] != LOOM_REQUEST_NULL && request_op(fn, what, reqs[i], &o) != LOOM_SUCCESS)
            return LOOM_ERR_INVALID_ARGUMENT;
    }
    return LOOM_SUCCESS;
}

loom_result_t loomi_req_wait(loom_request_t *req)
{
    if (!req) return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1, "loom_wait: req is NULL");
    if (*req == LOOM_REQUEST_NULL) return LOOM_SUCCESS;
    struct loomi_op *o;
    loom_result_t r = request_op("loom_wait", "*req", *req, &o);
    if (r != LOOM_SUCCESS) return r;
    const loom_request_t key = *req;
    *req = LOOM_REQUEST_NULL;
    /* A staged device call's result goes back now (devbuf.h). */
    return loomi_devbuf_req_done(key, loomi_op_wait(o));
}

loom_result_t loomi_req_test(loom_request_t *req, int *done)
{
    if (!req) return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1, "loom_test: req is NULL");
    if (!done) return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1, "loom_test: done is NULL");
    if (*req == LOOM_REQUEST_NULL) {
        *done = 1;
        return LOOM_SUCCESS;
    }
    struct loomi_op *o;
    loom_result_t r = request_op("loom_test", "*req", *req, &o);
    if (r != LOOM_SUCCESS) return r;
    const loom_request_t key = *req;
    r = loomi_op_test(o, done);
    if (*done) {
        *req = LOOM_REQUEST_NULL;
        r = loomi_devbuf_req_done(key, r);
    }
    return r;
}

loom_result_t loomi_req_wait_any(loom_request_t *reqs, int n, int *index)
{
    const char *fn = "loom_wait_any";
    if (!index) return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1, "%s: index is NULL", fn);
    *index = -1;
    loom_result_t r = check_reqs(fn, reqs, n);
    if (r != LOOM_SUCCESS) return r;
    int i = 0;
    while (i < n && reqs[i] == LOOM_REQUEST_NULL) i++;
    if (i == n) return LOOM_SUCCESS;
    if (!loomi_devbuf_pending()) return loomi_op_wait_any(reqs, n, index);
    /* Staged device calls among them: the one that completes is known by
     * its handle, which loomi_op_wait_any clears. */
    loom_request_t *keys = malloc((size_t)n * sizeof *keys);
    if (!keys) return loomi_fail(LOOM_ERR_NO_MEMORY, -1, "%s: out of memory", fn);
    memcpy(keys, reqs, (size_t)n * sizeof *keys);
    r = loomi_op_wait_any(reqs, n, index);
    if (*index >= 0) r = loomi_devbuf_req_done(keys[*index], r);
    free(keys);
    return r;
}

loom_result_t loomi_req_wait_all(loom_request_t *reqs, int n)
{
    const char *fn = "loom_wait_all";
    loom_result_t r = check_reqs(fn, reqs, n), first = LOOM_SUCCESS;
    if (r != LOOM_SUCCESS) return r;
    for (;;) {
        int i;
        r = loomi_req_wait_any(reqs, n, &i);
        if (i < 0) break;
        if (first == LOOM_SUCCESS) first = r;
    }
    return first;
}
