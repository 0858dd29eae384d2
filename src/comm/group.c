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
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "comm/collectives.h"
#include "comm/group.h"
#include "comm/comm.h"
#include "core/internal.h"

struct queued {
    loom_comm_t h; /* looked up again at the end: it may be gone by then */
    struct loom_comm *comm;
    struct loomi_sched s;
    const void *sendbuf;
    void *recvbuf;
    int inplace;
};

struct group {
    int depth;
    struct queued *q;
    size_t n, cap;
};

static _Thread_local struct group grp;

int loomi_group_active(void) { return grp.depth > 0; }

loom_result_t loomi_group_queue(struct loom_comm *comm, struct loomi_sched *s,
                                const void *sendbuf, void *recvbuf, int inplace)
{
    if (grp.n == grp.cap) {
        size_t cap = grp.cap ? grp.cap * 2 : 16;
        struct queued *q = realloc(grp.q, cap * sizeof *q);
        if (!q) {
            loomi_sched_free(s);
            return loomi_fail(LOOM_ERR_NO_MEMORY, comm->rank, "group: out of memory");
        }
        grp.q = q;
        grp.cap = cap;
    }
    struct queued *e = &grp.q[grp.n++];
    e->h = comm->handle;
    e->comm = comm;
    e->s = *s;
    memset(s, 0, sizeof *s);
    e->sendbuf = sendbuf;
    e->recvbuf = recvbuf;
    e->inplace = inplace;
    return LOOM_SUCCESS;
}

loom_result_t loomi_group_start(void)
{
    grp.depth++;
    return LOOM_SUCCESS;
}

static int is_recv(const struct loomi_sched *s)
{
    return s->p2p && s->nsteps == 1 && s->steps[0].kind == LOOMI_STEP_RECV;
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
    struct loomi_op **ops = calloc(n, sizeof *ops);
    loom_result_t first = LOOM_SUCCESS;
    size_t started = 0;
    if (!ops) first = loomi_fail(LOOM_ERR_NO_MEMORY, -1, "loom_group_end: out of memory");
    /* Receives first: a message that finds its receive posted lands in
     * place, one that comes early is copied through a buffer.  Only
     * point-to-point ops move; collectives keep their order. */
    size_t *order = malloc(n * sizeof *order), k = 0;
    if (!order) first = loomi_fail(LOOM_ERR_NO_MEMORY, -1, "loom_group_end: out of memory");
    for (int pass = 0; pass < 2 && order; pass++)
        for (size_t i = 0; i < n; i++)
            if (is_recv(&q[i].s) == !pass) order[k++] = i;
    for (size_t j = 0; j < n; j++) {
        size_t i = order ? order[j] : j;
        if (first != LOOM_SUCCESS) {
            loomi_sched_free(&q[i].s); /* never started */
            continue;
        }
        /* A communicator broken by an earlier call of this group fails
         * the rest at once. */
        struct loom_comm *qc;
        loom_result_t r = loomi_comm_check(q[i].h, "loom_group_end", &qc);
        if (r == LOOM_SUCCESS)
            r = loomi_op_start(&qc->eng, &q[i].s, q[i].sendbuf, q[i].recvbuf, q[i].inplace,
                               &ops[started]);
        else
            loomi_sched_free(&q[i].s);
        if (r != LOOM_SUCCESS) {
            first = r;
            continue;
        }
        started++;
    }
    free(q);
    free(order);
    loom_result_t w = ops ? loomi_op_wait_all(ops, started) : LOOM_SUCCESS;
    if (first == LOOM_SUCCESS) first = w;
    free(ops);
    return first;
}

/* ------------------------------------------------------- point to point */

loom_result_t loomi_call_p2p(const char *fn, int is_send, const void *sbuf, void *rbuf,
                             size_t count, loom_datatype_t dtype, int peer, loom_comm_t h,
                             loom_request_t *req)
{
    struct loom_comm *comm;
    loom_result_t r = loomi_comm_check(h, fn, &comm);
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
