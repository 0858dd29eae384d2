/*
 * devbuf.c - collectives on CUDA device buffers, staged through pinned
 * host memory (devbuf.h).  A first, correct version: the calling thread
 * waits for the call's stream before the device input is read, and the
 * copies are the driver's synchronous ones; no device kernel runs.
 * Large element-wise calls are pipelined instead (loomi_devbuf_pipeline,
 * at the end): asynchronous copies in chunks on the communicator's own
 * stream, overlapping the host collectives of the chunks before.
 *
 * Staging buffers are kept per communicator (comm->devpool) and grown as
 * needed: a blocking call takes one and gives it back before it returns;
 * a non-blocking call holds its own until its request completes, so that
 * several may be in flight.  Requests that carry a copy back are listed
 * here (a mutex: requests may be waited for on any thread).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "comm/collectives.h"
#include "comm/comm.h"
#include "comm/devbuf.h"
#include "core/cuda.h"
#include "core/internal.h"

/* One pinned host allocation. */
struct slot {
    struct slot *next;
    void *p;
    size_t cap;
    atomic_int busy; /* released by whichever thread completes the call */
};

struct loomi_devpool {
    struct slot *slots;
    void *stream; /* the pipelined calls' copies (created on first use) */
};

struct pipe;

/* One staged call: up to two ranges (sendbuf's, recvbuf's; one where they
 * overlap) and the device range its result goes back to. */
struct loomi_devcall {
    struct loom_comm *comm;
    const char *fn;
    struct slot *slot;
    void *back_dev;  /* device recvbuf (NULL: nothing goes back) */
    void *back_host; /* its staged copy */
    size_t back_len;
    loom_request_t req;
    struct pipe *pipe; /* a pipelined call (req: its last chunk's) */
    struct loomi_devcall *next; /* pending: not yet completed */
};

static void pipe_free(struct pipe *p);
static loom_result_t pipe_finish(struct pipe *p, size_t upto, loom_result_t last);

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct loomi_devcall *pending;
static atomic_int npending;

const char *loomi_devbuf_missing(void)
{
    const struct loomi_cuda_drv *d = loomi_cuda_driver();
    if (!d) return loomi_cuda_why();
    if (!d->MemAllocHost) return "libcuda.so.1 has no cuMemAllocHost";
    if (!d->MemFreeHost) return "libcuda.so.1 has no cuMemFreeHost";
    if (!d->MemcpyDtoH) return "libcuda.so.1 has no cuMemcpyDtoH";
    if (!d->MemcpyHtoD) return "libcuda.so.1 has no cuMemcpyHtoD";
    if (!d->StreamSynchronize) return "libcuda.so.1 has no cuStreamSynchronize";
    return NULL;
}

static loom_result_t cu_fail(const struct loom_comm *comm, const char *fn, const char *what,
                             loomi_cu_t e)
{
    return loomi_fail(LOOM_ERR_SYSTEM, comm->rank, "%s: device buffers: %s failed: %s", fn, what,
                      loomi_cuda_strerror(e));
}

/* A free slot of at least need bytes: a free one grown, or a new one. */
static loom_result_t take_slot(struct loom_comm *comm, const char *fn, size_t need,
                               struct slot **out)
{
    const struct loomi_cuda_drv *d = loomi_cuda_driver();
    if (!comm->devpool && !(comm->devpool = calloc(1, sizeof *comm->devpool)))
        return loomi_fail(LOOM_ERR_NO_MEMORY, comm->rank, "%s: out of memory", fn);
    struct slot *s, *spare = NULL;
    for (s = comm->devpool->slots; s; s = s->next) {
        if (s->busy) continue;
        if (s->cap >= need) break;
        if (!spare) spare = s;
    }
    if (!s && spare) {
        /* Grown: the old one freed first, the new one twice as large as
         * the old or need, whichever is more. */
        d->MemFreeHost(spare->p);
        spare->p = NULL;
        size_t cap = spare->cap * 2 > need ? spare->cap * 2 : need;
        spare->cap = 0;
        loomi_cu_t e = d->MemAllocHost(&spare->p, cap);
        if (e) return cu_fail(comm, fn, "cuMemAllocHost", e);
        spare->cap = cap;
        s = spare;
    }
    if (!s) {
        if (!(s = calloc(1, sizeof *s)))
            return loomi_fail(LOOM_ERR_NO_MEMORY, comm->rank, "%s: out of memory", fn);
        loomi_cu_t e = d->MemAllocHost(&s->p, need);
        if (e) {
            free(s);
            return cu_fail(comm, fn, "cuMemAllocHost", e);
        }
        s->cap = need;
        s->next = comm->devpool->slots;
        comm->devpool->slots = s;
    }
    s->busy = 1;
    *out = s;
    return LOOM_SUCCESS;
}

static size_t up64(size_t n)
{
    return (n + 63) & ~(size_t)63;
}

loom_result_t loomi_devbuf_stage(struct loom_comm *comm, const char *fn, void *stream,
                                 const void *sb, size_t slen, int sdev, void *rb, size_t rlen,
                                 int rdev, int rin, const void **hs, void **hr,
                                 struct loomi_devcall **out)
{
    const struct loomi_cuda_drv *d = loomi_cuda_driver();
    *hs = sb;
    *hr = rb;
    *out = NULL;
    sdev = sdev && slen;
    rdev = rdev && rlen;
    if (!sdev && !rdev) return LOOM_SUCCESS;
    /* The ranges to stage: one where sendbuf and recvbuf overlap (in
     * place: one holds the other), else each device one on its own. */
    uintptr_t s0 = (uintptr_t)sb, r0 = (uintptr_t)rb;
    int one = sdev && rdev && s0 < r0 + rlen && r0 < s0 + slen;
    uintptr_t lo = 0, hi = 0;
    if (one) {
        lo = s0 < r0 ? s0 : r0;
        hi = s0 + slen > r0 + rlen ? s0 + slen : r0 + rlen;
    }
    size_t need = one ? up64(hi - lo) : (sdev ? up64(slen) : 0) + (rdev ? rlen : 0);
    struct loomi_devcall *dc = calloc(1, sizeof *dc);
    if (!dc) return loomi_fail(LOOM_ERR_NO_MEMORY, comm->rank, "%s: out of memory", fn);
    dc->comm = comm;
    dc->fn = fn;
    loom_result_t r = take_slot(comm, fn, need, &dc->slot);
    if (r != LOOM_SUCCESS) {
        free(dc);
        return r;
    }
    unsigned char *base = dc->slot->p;
    /* The work already queued on the stream first: its writes are the
     * input. */
    loomi_cu_t e = d->StreamSynchronize(stream);
    if (e) {
        loomi_devbuf_done(dc, LOOM_ERR_SYSTEM);
        return cu_fail(comm, fn, "cuStreamSynchronize on the call's stream", e);
    }
    const char *what = "cuMemcpyDtoH";
    if (one) {
        e = d->MemcpyDtoH(base, (loomi_cuptr_t)lo, hi - lo);
        *hs = base + (s0 - lo);
        *hr = base + (r0 - lo);
    } else {
        unsigned char *p = base;
        if (sdev) {
            e = d->MemcpyDtoH(p, (loomi_cuptr_t)s0, slen);
            *hs = p;
            p += up64(slen);
        }
        if (rdev && !e) {
            if (rin) e = d->MemcpyDtoH(p, (loomi_cuptr_t)r0, rlen);
            *hr = p;
        }
    }
    if (e) {
        loomi_devbuf_done(dc, LOOM_ERR_SYSTEM);
        return cu_fail(comm, fn, what, e);
    }
    if (rdev) {
        dc->back_dev = rb;
        dc->back_host = *hr;
        dc->back_len = rlen;
    }
    *out = dc;
    return LOOM_SUCCESS;
}

loom_result_t loomi_devbuf_done(struct loomi_devcall *dc, loom_result_t r)
{
    if (!dc) return r;
    if (dc->pipe) {
        struct pipe *p = dc->pipe;
        free(dc);
        return pipe_finish(p, (size_t)-1, r);
    }
    const struct loomi_cuda_drv *d = loomi_cuda_driver();
    if (r == LOOM_SUCCESS && dc->back_dev) {
        /* From pinned memory the driver's copy is synchronous: the bytes
         * are on the device when it returns, for any stream to see. */
        loomi_cu_t e = d->MemcpyHtoD((loomi_cuptr_t)(uintptr_t)dc->back_dev, dc->back_host,
                                     dc->back_len);
        if (e) r = cu_fail(dc->comm, dc->fn, "cuMemcpyHtoD of the result", e);
    }
    if (dc->slot) dc->slot->busy = 0;
    free(dc);
    return r;
}

void loomi_devbuf_attach(struct loomi_devcall *dc, loom_request_t req)
{
    if (!dc) return;
    dc->req = req;
    pthread_mutex_lock(&mu);
    dc->next = pending;
    pending = dc;
    atomic_fetch_add(&npending, 1);
    pthread_mutex_unlock(&mu);
}

int loomi_devbuf_pending(void)
{
    return atomic_load_explicit(&npending, memory_order_relaxed) > 0;
}

loom_result_t loomi_devbuf_req_done(loom_request_t req, loom_result_t r)
{
    if (!loomi_devbuf_pending() || req == LOOM_REQUEST_NULL) return r;
    pthread_mutex_lock(&mu);
    struct loomi_devcall **pp = &pending, *dc = NULL;
    for (; *pp; pp = &(*pp)->next)
        if ((*pp)->req == req) {
            dc = *pp;
            *pp = dc->next;
            atomic_fetch_sub(&npending, 1);
            break;
        }
    pthread_mutex_unlock(&mu);
    return dc ? loomi_devbuf_done(dc, r) : r;
}

void loomi_devbuf_free(struct loom_comm *comm)
{
    pthread_mutex_lock(&mu);
    for (struct loomi_devcall **pp = &pending; *pp;) {
        struct loomi_devcall *dc = *pp;
        if (dc->comm != comm) {
            pp = &dc->next;
            continue;
        }
        *pp = dc->next;
        atomic_fetch_sub(&npending, 1);
        if (dc->pipe) pipe_free(dc->pipe);
        free(dc); /* never completed: nothing goes back */
    }
    pthread_mutex_unlock(&mu);
    if (!comm->devpool) return;
    const struct loomi_cuda_drv *d = loomi_cuda_driver();
    if (d && comm->devpool->stream) {
        d->StreamSynchronize(comm->devpool->stream);
        d->StreamDestroy(comm->devpool->stream);
    }
    for (struct slot *s = comm->devpool->slots, *n; s; s = n) {
        n = s->next;
        if (d && s->p) d->MemFreeHost(s->p);
        free(s);
    }
    free(comm->devpool);
    comm->devpool = NULL;
}

const char *loomi_devbuf_refused(const char *fn, const void *p, const char *what, char *msg,
                                 size_t n)
{
    if (!p || loomi_mem_kind(p) != LOOMI_MEM_DEVICE) return NULL;
    snprintf(msg, n, "%s: %s %p is CUDA device memory, which %s does not take yet (only the "
             "collectives stage device buffers): pass host (or managed) memory",
             fn, what, p, fn);
    return msg;
}

/* ------------------------------------------------------------ pipelined */

/* One pipelined call.  Host regions in its slot: hs (the input), hr (the
 * result), bk (recvbuf as it was: hs in place, else a copy of rb). */
struct pipe {
    struct loom_comm *comm;
    const char *fn;
    struct slot *slot;
    void *stream;                /* comm->devpool->stream */
    unsigned char *sb, *rb;      /* device */
    unsigned char *hs, *hr, *bk; /* host */
    size_t slen, rlen, len, chunk, n;
    size_t sbl, rbl;        /* blocks of len bytes in sb (reduce-scatter: p) and rb
                             * (allgather: p); chunk k is bytes [k*chunk, ...) of
                             * each, held together on the host (at sbl*k*chunk) */
    void **ev;              /* n events, one after each chunk's input copy */
    loom_request_t *reqs;   /* chunk requests; NULL once finished */
    unsigned char *back;    /* chunk k was copied back */
    size_t next;            /* the first chunk not yet finished */
    loom_result_t r;
};

size_t loomi_devbuf_pipe_chunk(size_t n, size_t es)
{
    const struct loomi_env *env = loomi_env_get();
    const struct loomi_cuda_drv *d = loomi_cuda_driver();
    if (!env || !d || !es || !env->cuda_pipe_chunk || n <= env->cuda_pipe_chunk) return 0;
    if (!d->MemcpyDtoHAsync || !d->MemcpyHtoDAsync || !d->EventCreate || !d->EventRecord ||
        !d->EventQuery || !d->EventDestroy || !d->StreamCreate || !d->StreamDestroy)
        return 0;
    size_t c = env->cuda_pipe_chunk / es * es;
    if (!c) c = es;
    /* At most 1024 chunks: larger ones past that. */
    if (n / c >= 1024) c = (n / 1024 + es - 1) / es * es;
    return n > c ? c : 0;
}

static size_t chunk_len(const struct pipe *p, size_t k)
{
    size_t off = k * p->chunk;
    return p->len - off < p->chunk ? p->len - off : p->chunk;
}

static void pipe_free(struct pipe *p)
{
    const struct loomi_cuda_drv *d = loomi_cuda_driver();
    if (p->ev)
        for (size_t k = 0; k < p->n; k++)
            if (p->ev[k]) d->EventDestroy(p->ev[k]);
    if (p->slot) p->slot->busy = 0;
    free(p->ev);
    free(p->reqs);
    free(p->back);
    free(p);
}

/* Chunk k's result goes back to the device now (asynchronously). */
static void pipe_back(struct pipe *p, size_t k)
{
    if (!p->rlen || p->r != LOOM_SUCCESS) return;
    const struct loomi_cuda_drv *d = loomi_cuda_driver();
    const size_t off = k * p->chunk, lk = chunk_len(p, k);
    loomi_cu_t e = 0;
    for (size_t q = 0; q < p->rbl && !e; q++)
        e = d->MemcpyHtoDAsync((loomi_cuptr_t)(uintptr_t)(p->rb + q * p->len + off),
                               p->hr + off * p->rbl + q * lk, lk, p->stream);
    /* a chunk partly copied back counts as copied back */
    p->back[k] = 1;
    if (e) p->r = cu_fail(p->comm, p->fn, "cuMemcpyHtoDAsync of a result chunk", e);
}

/* Finish chunks, in order, below upto: those done (block: all). */
static void pipe_poll(struct pipe *p, size_t upto, int block)
{
    while (p->next < upto) {
        int done = 1;
        loom_result_t r = block ? loomi_req_wait(&p->reqs[p->next])
                                : loomi_req_test(&p->reqs[p->next], &done);
        if (!done) return;
        p->reqs[p->next] = LOOM_REQUEST_NULL;
        if (r != LOOM_SUCCESS && p->r == LOOM_SUCCESS) p->r = r;
        pipe_back(p, p->next++);
    }
}

/* The call is over once chunks [0, upto) (upto -1: every chunk but the
 * last, whose result is `last`) are: wait for them, copy back, put
 * recvbuf back on a failure, synchronise the copies, release. */
static loom_result_t pipe_finish(struct pipe *p, size_t upto, loom_result_t last)
{
    const struct loomi_cuda_drv *d = loomi_cuda_driver();
    const int all_but_last = upto == (size_t)-1;
    pipe_poll(p, all_but_last ? p->n - 1 : upto, 1);
    if (all_but_last) {
        if (last != LOOM_SUCCESS && p->r == LOOM_SUCCESS) p->r = last;
        pipe_back(p, p->n - 1);
    }
    loom_result_t r = p->r;
    if (r != LOOM_SUCCESS && p->rlen) {
        /* recvbuf as it was, after the copies back (and that of bk) are
         * done: put back where a chunk went. */
        d->StreamSynchronize(p->stream);
        for (size_t k = 0; k < p->n; k++)
            for (size_t q = 0; q < p->rbl && p->back[k]; q++) {
                const size_t off = q * p->len + k * p->chunk;
                d->MemcpyHtoDAsync((loomi_cuptr_t)(uintptr_t)(p->rb + off), p->bk + off,
                                   chunk_len(p, k), p->stream);
            }
    }
    loomi_cu_t e = d->StreamSynchronize(p->stream);
    if (e && r == LOOM_SUCCESS)
        r = cu_fail(p->comm, p->fn, "cuStreamSynchronize on the staging stream", e);
    pipe_free(p);
    return r;
}

loom_result_t loomi_devbuf_pipeline(struct loom_comm *comm, const char *fn, void *stream,
                                    const void *sb, size_t slen, void *rb, size_t rlen,
                                    size_t es, size_t chunk, size_t sblocks, size_t rblocks,
                                    loomi_devchunk_fn start, void *ctx, loom_request_t *req)
{
    const struct loomi_cuda_drv *d = loomi_cuda_driver();
    struct pipe *p = calloc(1, sizeof *p);
    if (!p) return loomi_fail(LOOM_ERR_NO_MEMORY, comm->rank, "%s: out of memory", fn);
    p->comm = comm;
    p->fn = fn;
    p->sb = (unsigned char *)(uintptr_t)sb;
    p->rb = rb;
    p->slen = slen;
    p->rlen = rlen;
    p->sbl = sblocks;
    p->rbl = rblocks;
    p->len = slen ? slen / sblocks : rlen / rblocks;
    p->chunk = chunk;
    p->n = (p->len + chunk - 1) / chunk;
    const int inplace = slen && rlen && (const void *)rb == sb && sblocks == 1 && rblocks == 1;
    const size_t S = up64(slen), R = up64(rlen), B = rlen && !inplace ? up64(rlen) : 0;
    p->ev = calloc(p->n, sizeof *p->ev);
    p->reqs = calloc(p->n, sizeof *p->reqs);
    p->back = calloc(p->n, 1);
    loom_result_t r = LOOM_SUCCESS;
    if (!p->ev || !p->reqs || !p->back)
        r = loomi_fail(LOOM_ERR_NO_MEMORY, comm->rank, "%s: out of memory", fn);
    if (r == LOOM_SUCCESS) r = take_slot(comm, fn, S + R + B, &p->slot);
    if (r != LOOM_SUCCESS) {
        pipe_free(p);
        return r;
    }
    p->hs = p->slot->p;
    p->hr = p->hs + S;
    p->bk = inplace ? p->hs : p->hr + R;
    loomi_cu_t e = 0;
    const char *what = "cuStreamCreate";
    if (!comm->devpool->stream)
        e = d->StreamCreate(&comm->devpool->stream, LOOMI_CU_STREAM_NON_BLOCKING);
    p->stream = comm->devpool->stream;
    /* The work already queued on the call's stream first. */
    if (!e) {
        what = "cuStreamSynchronize on the call's stream";
        e = d->StreamSynchronize(stream);
    }
    /* Every input chunk's copy queued at once, an event after each, then
     * recvbuf as it was (out of place). */
    for (size_t k = 0; k < p->n && slen && !e; k++) {
        const size_t off = k * chunk, lk = chunk_len(p, k);
        what = "cuMemcpyDtoHAsync of an input chunk";
        for (size_t q = 0; q < sblocks && !e; q++)
            e = d->MemcpyDtoHAsync(p->hs + off * sblocks + q * lk,
                                   (loomi_cuptr_t)(uintptr_t)(p->sb + q * p->len + off), lk,
                                   p->stream);
        if (!e) {
            what = "cuEventCreate";
            e = d->EventCreate(&p->ev[k], LOOMI_CU_EVENT_DISABLE_TIMING);
        }
        if (!e) {
            what = "cuEventRecord";
            e = d->EventRecord(p->ev[k], p->stream);
        }
    }
    if (!e && B) {
        what = "cuMemcpyDtoHAsync of recvbuf";
        e = d->MemcpyDtoHAsync(p->bk, (loomi_cuptr_t)(uintptr_t)p->rb, rlen, p->stream);
    }
    if (e) {
        r = cu_fail(comm, fn, what, e);
        if (p->stream) d->StreamSynchronize(p->stream);
        pipe_free(p);
        return r;
    }
    /* Chunk k's collective starts once its input is here; meanwhile the
     * earlier chunks progress, and go back as they finish. */
    size_t k = 0;
    const uint64_t deadline = loomi_now_ms() + (uint64_t)comm->set.timeout_ms;
    for (; k < p->n; k++) {
        const size_t off = k * chunk;
        int late = 0;
        while (slen && (e = d->EventQuery(p->ev[k])) == LOOMI_CUDA_ERROR_NOT_READY &&
               !(late = loomi_now_ms() >= deadline))
            pipe_poll(p, k, 0);
        if (late) {
            if (p->r == LOOM_SUCCESS)
                p->r = loomi_fail(LOOM_ERR_TIMEOUT, comm->rank,
                                  "%s: input chunk %zu of %zu not copied from the device within "
                                  "%d ms (LOOM_TIMEOUT)", fn, k, p->n, comm->set.timeout_ms);
            break;
        }
        if (slen && e) {
            if (p->r == LOOM_SUCCESS) p->r = cu_fail(comm, fn, "cuEventQuery", e);
            break;
        }
        r = start(ctx, slen ? p->hs + off * sblocks : NULL, rlen ? p->hr + off * rblocks : NULL,
                  chunk_len(p, k) / es,
                  &p->reqs[k]);
        if (r != LOOM_SUCCESS) {
            if (p->r == LOOM_SUCCESS) p->r = r;
            break;
        }
        pipe_poll(p, k, 0);
    }
    if (k < p->n || !req) return pipe_finish(p, k, LOOM_SUCCESS);
    struct loomi_devcall *dc = calloc(1, sizeof *dc);
    if (!dc) {
        r = loomi_fail(LOOM_ERR_NO_MEMORY, comm->rank, "%s: out of memory", fn);
        p->r = r;
        pipe_finish(p, k, LOOM_SUCCESS);
        return r;
    }
    dc->comm = comm;
    dc->fn = fn;
    dc->pipe = p;
    *req = p->reqs[p->n - 1];
    loomi_devbuf_attach(dc, *req);
    return LOOM_SUCCESS;
}
