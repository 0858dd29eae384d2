/*
 * devbuf.c - collectives on CUDA device buffers, staged through pinned
 * host memory (devbuf.h).  A first, correct version: the calling thread
 * waits for the call's stream before the device input is read, and the
 * copies are the driver's synchronous ones; no device kernel runs.
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
};

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
    struct loomi_devcall *next; /* pending: not yet completed */
};

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
        free(dc); /* never completed: nothing goes back */
    }
    pthread_mutex_unlock(&mu);
    if (!comm->devpool) return;
    const struct loomi_cuda_drv *d = loomi_cuda_driver();
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
