/*
 * quorum.c - the quorum allreduce (loom_allreduce_quorum(3)): an
 * allreduce that completes once `quorum` ranks have contributed, the
 * fastest n - b of backup-worker training.
 *
 * Rank 0 decides, alone, so that every rank ends with the same result:
 * - every other rank sends its contribution (a header and its data) to
 *   rank 0, under a tag made from the call's number, and waits for the
 *   call's result from rank 0;
 * - rank 0 posts a receive for each peer's contribution to this call,
 *   then takes contributions in the order they complete (several found
 *   at one look: by rank), counting itself as arriving when it makes
 *   the call (after the contributions already there), until `quorum`
 *   are in: those ranks are the contributors, the rest are left out;
 * - rank 0 reduces the contributors' data in rank order (LOOM_AVG: the
 *   sum divided by the number of contributors) and sends the result, the
 *   call's status and the contributors' flags to every other rank, the
 *   late ones included: a late rank finds them waiting when it makes the
 *   call, returns at once with its own flag 0, and its contribution is
 *   dropped by rule when it reaches rank 0 (its call number is past),
 *   never reduced into a later call's result.  Its next call is like any
 *   other rank's.
 * Rank 0's receives that the decision left behind stay posted (with
 * their buffers) in comm->quorum until their message comes; each call
 * and loom_comm_destroy reap them.  Sends of results stay too, so that a
 * late rank never holds rank 0 back.
 *
 * Every wait is the engine's, with the communicator's deadline
 * (LOOM_TIMEOUT).  Every header is checked (magic, call number, count,
 * type, op, quorum, flags) before a byte of data is used.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/collectives.h"
#include "comm/comm.h"
#include "comm/devbuf.h"
#include "comm/group.h"
#include "core/internal.h"
#include "reduce/reduce.h"
#include "sched/sched.h"

/* Quorum messages are point-to-point messages whose tag has bit 31 set
 * and the call number below it (loom_send's tags are per-peer counters
 * from 0: they would need 2^31 messages to one peer to meet these). */
#define QTAG(no) (UINT32_C(0x80000000) | (uint32_t)((no) & UINT64_C(0x7fffffff)))
#define QMAGIC UINT64_C(0x4c4f4f4d51554f52) /* "LOOMQUOR" */

/* Contribution header: magic, call, count, dtype, op, quorum. */
enum { CH_MAGIC, CH_CALL, CH_COUNT, CH_DTYPE, CH_OP, CH_QUORUM, CH_WORDS };
#define CH_BYTES (CH_WORDS * sizeof(uint64_t))
/* Result header: magic, call, count, status, culprit + 1, ncontrib; then
 * nranks flag bytes (padded to 8), then the data. */
enum { RH_MAGIC, RH_CALL, RH_COUNT, RH_STATUS, RH_CULPRIT, RH_NCONTRIB, RH_WORDS };
#define RH_BYTES (RH_WORDS * sizeof(uint64_t))

struct pending {
    loom_request_t req;
    unsigned char *buf;
    int peer, is_send;
    uint64_t call;
    size_t bytes;
};

struct loomi_quorum {
    uint64_t calls; /* quorum calls made on this communicator */
    struct pending *p;
    int n, cap;
};

static size_t flags_bytes(int nranks) { return ((size_t)nranks + 7) / 8 * 8; }

static uint64_t word(const unsigned char *b, int i)
{
    uint64_t v;
    memcpy(&v, b + (size_t)i * sizeof v, sizeof v);
    return v;
}

static void put(unsigned char *b, int i, uint64_t v) { memcpy(b + (size_t)i * sizeof v, &v, sizeof v); }

/* Start a point-to-point transfer of buf (bytes) with peer under tag. */
static loom_result_t start(struct loom_comm *comm, const char *fn, int is_send, unsigned char *buf,
                           size_t bytes, int peer, uint32_t tag, loom_request_t *req)
{
    struct loomi_sched s;
    loomi_sched_init(&s, comm->rank, comm->nranks, LOOM_UINT8, LOOM_SUM);
    s.p2p = 1;
    if (is_send) {
        s.buf_bytes[LOOMI_BUF_SEND] = bytes;
        loomi_sched_send(&s, peer, tag, LOOMI_BUF_SEND, 0, bytes, NULL, 0);
    } else {
        s.buf_bytes[LOOMI_BUF_RECV] = bytes;
        loomi_sched_recv(&s, peer, tag, LOOMI_BUF_RECV, 0, bytes, NULL, 0);
    }
    struct loomi_op *op;
    *req = LOOM_REQUEST_NULL;
    return loomi_comm_start(comm, fn, &s, is_send ? buf : NULL, is_send ? NULL : buf, 0, req, &op);
}

static struct loomi_quorum *state(struct loom_comm *comm)
{
    if (!comm->quorum) comm->quorum = calloc(1, sizeof *comm->quorum);
    return comm->quorum;
}

static struct pending *push(struct loomi_quorum *q)
{
    if (q->n == q->cap) {
        int cap = q->cap ? 2 * q->cap : 16;
        struct pending *p = realloc(q->p, (size_t)cap * sizeof *p);
        if (!p) return NULL;
        q->p = p;
        q->cap = cap;
    }
    struct pending *e = &q->p[q->n++];
    memset(e, 0, sizeof *e);
    return e;
}

static void drop(struct loomi_quorum *q, int i)
{
    free(q->p[i].buf);
    q->p[i] = q->p[--q->n];
}

/* A late contribution (a receive the decision left behind) has come:
 * check that it is one, and drop it. */
static loom_result_t drop_late(struct loom_comm *comm, const char *fn, const struct pending *e)
{
    if (word(e->buf, CH_MAGIC) != QMAGIC || word(e->buf, CH_CALL) != e->call)
        return loomi_fail(LOOM_ERR_REMOTE, comm->rank,
                          "%s: rank %d sent a malformed contribution to quorum call %llu", fn,
                          e->peer, (unsigned long long)e->call);
    LOOMI_TRACE(comm->rank, "%s: rank %d's contribution to call %llu came late: dropped", fn,
                e->peer, (unsigned long long)e->call);
    return LOOM_SUCCESS;
}

/* Reap what earlier calls left: sends done, late contributions come
 * (dropped).  wait: until none is left (loom_comm_destroy). */
static loom_result_t reap(struct loom_comm *comm, const char *fn, int wait)
{
    struct loomi_quorum *q = comm->quorum;
    loom_result_t first = LOOM_SUCCESS;
    for (int i = 0; q && i < q->n;) {
        struct pending *e = &q->p[i];
        int done = 1;
        loom_result_t r = wait ? loomi_req_wait(&e->req) : loomi_req_test(&e->req, &done);
        if (!done) {
            i++;
            continue;
        }
        if (r == LOOM_SUCCESS && !e->is_send) r = drop_late(comm, fn, e);
        if (first == LOOM_SUCCESS) first = r;
        drop(q, i);
    }
    return first;
}

loom_result_t loomi_quorum_drain(struct loom_comm *comm)
{
    return reap(comm, "loom_comm_destroy", 1);
}

void loomi_quorum_free(struct loomi_quorum *q)
{
    if (!q) return;
    for (int i = 0; i < q->n; i++) free(q->p[i].buf);
    free(q->p);
    free(q);
}

/* A transfer of call `no` with peer that outlives the call, kept in
 * comm->quorum with its own buffer of `bytes`: a receive, or a send of a
 * copy of data.  Its entry is the last of comm->quorum->p on success. */
static loom_result_t post(struct loom_comm *comm, const char *fn, int is_send, const void *data,
                          size_t bytes, int peer, uint64_t no)
{
    struct loomi_quorum *q = comm->quorum;
    struct pending *e = push(q);
    unsigned char *b = e ? malloc(bytes) : NULL;
    if (!b) {
        if (e) q->n--;
        return loomi_fail(LOOM_ERR_NO_MEMORY, comm->rank, "%s: out of memory", fn);
    }
    if (is_send) memcpy(b, data, bytes);
    e->buf = b;
    e->peer = peer;
    e->is_send = is_send;
    e->call = no;
    e->bytes = bytes;
    loom_result_t r = start(comm, fn, is_send, b, bytes, peer, QTAG(no), &e->req);
    if (r != LOOM_SUCCESS) {
        free(b);
        q->n--;
    }
    return r;
}

/* Rank 0's part of call `no`. */
static loom_result_t decide(struct loom_comm *comm, const char *fn, const void *sendbuf,
                            void *recvbuf, size_t count, loom_datatype_t dtype, loom_op_t op,
                            int quorum, uint64_t no, unsigned char *flags, int *ncontrib)
{
    struct loomi_quorum *q = comm->quorum;
    const int n = comm->nranks;
    const size_t es = loom_datatype_size(dtype), data = count * es;
    const size_t cbytes = CH_BYTES + data, rbytes = RH_BYTES + flags_bytes(n) + data;
    loom_result_t r = reap(comm, fn, 0);
    if (r != LOOM_SUCCESS) return r;
    /* This call's receives, by peer (index into q->p: ix[p]). */
    int *ix = malloc((size_t)n * sizeof *ix);
    loom_request_t *reqs = calloc((size_t)n, sizeof *reqs);
    unsigned char *res = malloc(rbytes);
    if (!ix || !reqs || !res) {
        free(ix), free(reqs), free(res);
        return loomi_fail(LOOM_ERR_NO_MEMORY, comm->rank, "%s: out of memory", fn);
    }
    for (int p = 0; p < n; p++) ix[p] = -1;
    for (int p = 1; p < n && r == LOOM_SUCCESS; p++)
        if ((r = post(comm, fn, 0, NULL, cbytes, p, no)) == LOOM_SUCCESS) ix[p] = q->n - 1;
    /* Arrivals: those already here, then rank 0, then as they come. */
    memset(flags, 0, (size_t)n);
    int got = 0, culprit = -1, self = 0;
    loom_result_t status = LOOM_SUCCESS;
    char why[160] = "";
    while (r == LOOM_SUCCESS && got < quorum) {
        int fresh = 0;
        for (int p = 1; p < n && got < quorum && r == LOOM_SUCCESS; p++) {
            if (ix[p] < 0) continue;
            struct pending *e = &q->p[ix[p]];
            if (flags[p] || e->req == LOOM_REQUEST_NULL) continue;
            int done = 0;
            r = loomi_req_test(&e->req, &done);
            if (r != LOOM_SUCCESS || !done) continue;
            fresh = 1;
            flags[p] = 1;
            got++;
        }
        if (r != LOOM_SUCCESS || got == quorum) break;
        if (!self) {
            self = 1;
            flags[0] = 1;
            got++;
            continue;
        }
        if (fresh) continue;
        /* Nothing new: wait for the first of the rest to come. */
        for (int p = 0; p < n; p++)
            reqs[p] = ix[p] >= 0 && !flags[p] ? q->p[ix[p]].req : LOOM_REQUEST_NULL;
        int i;
        r = loomi_req_wait_any(reqs, n, &i);
        if (i > 0) {
            q->p[ix[i]].req = LOOM_REQUEST_NULL;
            flags[i] = 1;
            got++;
        }
    }
    /* The contributors' headers, then their data in rank order. */
    unsigned char *acc = res + RH_BYTES + flags_bytes(n);
    int first = 1;
    for (int p = 0; p < n && r == LOOM_SUCCESS && status == LOOM_SUCCESS; p++) {
        if (!flags[p]) continue;
        const unsigned char *src = sendbuf;
        if (p) {
            const unsigned char *h = q->p[ix[p]].buf;
            const uint64_t want[CH_WORDS] = {QMAGIC, no, count, (uint64_t)dtype, (uint64_t)op,
                                             (uint64_t)quorum};
            static const char *const what[CH_WORDS] = {"header", "call number", "count",
                                                       "dtype", "op", "quorum"};
            for (int w = 0; w < CH_WORDS && status == LOOM_SUCCESS; w++)
                if (word(h, w) != want[w]) {
                    status = w < CH_COUNT ? LOOM_ERR_REMOTE : LOOM_ERR_MISMATCH;
                    culprit = p;
                    snprintf(why, sizeof why,
                             "rank %d's %s is %llu where rank 0's is %llu", p, what[w],
                             (unsigned long long)word(h, w), (unsigned long long)want[w]);
                }
            if (status != LOOM_SUCCESS) break;
            src = h + CH_BYTES;
        }
        if (!data) {
        } else if (first) {
            memcpy(acc, src, data);
        } else {
            loomi_reduce_inplace(acc, src, count, dtype, op);
        }
        first = 0;
    }
    /* The contributions taken are done with; those left behind stay.
     * This call's entries lie in rank order at the end of q->p: dropped
     * from the last, each drop moves only an entry of a higher index. */
    for (int p = n - 1; p >= 1; p--)
        if (ix[p] >= 0 && q->p[ix[p]].req == LOOM_REQUEST_NULL) drop(q, ix[p]);
    free(ix);
    free(reqs);
    if (r != LOOM_SUCCESS) {
        free(res);
        return r;
    }
    if (status == LOOM_SUCCESS && op == LOOM_AVG) loomi_reduce_finish_avg(acc, count, dtype, got);
    put(res, RH_MAGIC, QMAGIC);
    put(res, RH_CALL, no);
    put(res, RH_COUNT, count);
    put(res, RH_STATUS, (uint64_t)status);
    put(res, RH_CULPRIT, (uint64_t)(culprit + 1));
    put(res, RH_NCONTRIB, (uint64_t)got);
    memcpy(res + RH_BYTES, flags, (size_t)n);
    memset(res + RH_BYTES + n, 0, flags_bytes(n) - (size_t)n);
    if (status != LOOM_SUCCESS) memset(acc, 0, data);
    /* The result to every other rank, one buffer per send (a late rank
     * may take it a while after this call has returned). */
    for (int p = 1; p < n && r == LOOM_SUCCESS; p++) r = post(comm, fn, 1, res, rbytes, p, no);
    if (r == LOOM_SUCCESS && status == LOOM_SUCCESS && data) memcpy(recvbuf, acc, data);
    free(res);
    *ncontrib = got;
    if (r != LOOM_SUCCESS) return r;
    if (status != LOOM_SUCCESS)
        return loomi_fail(status, comm->rank, "%s: call %llu: %s", fn, (unsigned long long)no,
                          why);
    return LOOM_SUCCESS;
}

/* Another rank's part of call `no`: its contribution to rank 0, then
 * the result and the contributors from rank 0. */
static loom_result_t contribute(struct loom_comm *comm, const char *fn, const void *sendbuf,
                                void *recvbuf, size_t count, loom_datatype_t dtype, loom_op_t op,
                                int quorum, uint64_t no, unsigned char *flags, int *ncontrib)
{
    const int n = comm->nranks;
    const size_t es = loom_datatype_size(dtype), data = count * es;
    const size_t cbytes = CH_BYTES + data, rbytes = RH_BYTES + flags_bytes(n) + data;
    unsigned char *c = malloc(cbytes), *res = malloc(rbytes);
    if (!c || !res) {
        free(c), free(res);
        return loomi_fail(LOOM_ERR_NO_MEMORY, comm->rank, "%s: out of memory", fn);
    }
    put(c, CH_MAGIC, QMAGIC);
    put(c, CH_CALL, no);
    put(c, CH_COUNT, count);
    put(c, CH_DTYPE, (uint64_t)dtype);
    put(c, CH_OP, (uint64_t)op);
    put(c, CH_QUORUM, (uint64_t)quorum);
    if (data) memcpy(c + CH_BYTES, sendbuf, data);
    loom_request_t rq[2];
    loom_result_t r = start(comm, fn, 1, c, cbytes, 0, QTAG(no), &rq[0]);
    if (r == LOOM_SUCCESS) {
        r = start(comm, fn, 0, res, rbytes, 0, QTAG(no), &rq[1]);
        if (r != LOOM_SUCCESS) (void)loomi_req_wait(&rq[0]);
        else r = loomi_req_wait_all(rq, 2);
    }
    free(c);
    loom_result_t status = LOOM_SUCCESS;
    int got = 0;
    uint64_t culprit = 0;
    if (r == LOOM_SUCCESS) {
        status = (loom_result_t)word(res, RH_STATUS);
        culprit = word(res, RH_CULPRIT);
        uint64_t nc = word(res, RH_NCONTRIB);
        for (int p = 0; p < n; p++) got += res[RH_BYTES + (size_t)p] != 0;
        int flags_ok = 1;
        for (int p = 0; p < n; p++) flags_ok &= res[RH_BYTES + (size_t)p] <= 1;
        if (word(res, RH_MAGIC) != QMAGIC || word(res, RH_CALL) != no ||
            word(res, RH_COUNT) != count || !flags_ok || nc != (uint64_t)got || got < 1 ||
            word(res, RH_STATUS) > LOOM_ERR_CONNECT || culprit > (uint64_t)n ||
            (status == LOOM_SUCCESS && got < quorum))
            r = loomi_fail(LOOM_ERR_REMOTE, comm->rank,
                           "%s: rank 0 sent a malformed result for quorum call %llu", fn,
                           (unsigned long long)no);
    }
    if (r == LOOM_SUCCESS) {
        memcpy(flags, res + RH_BYTES, (size_t)n);
        *ncontrib = got;
        if (status == LOOM_SUCCESS && data) memcpy(recvbuf, res + RH_BYTES + flags_bytes(n), data);
        else
            r = loomi_fail(status, comm->rank,
                           "%s: call %llu: rank 0 found rank %d's call differs from its own "
                           "(count, dtype, op and quorum must agree; see rank 0's error)",
                           fn, (unsigned long long)no, (int)culprit - 1);
    }
    free(res);
    return r;
}

loom_result_t loomi_call_allreduce_quorum(const char *fn, const void *sendbuf, void *recvbuf,
                                          size_t count, loom_datatype_t dtype, loom_op_t op,
                                          int quorum, loom_comm_t h, int *contributors,
                                          int *ncontrib)
{
    struct loom_comm *comm;
    loom_result_t r = loomi_comm_check(h, fn, &comm);
    if (r != LOOM_SUCCESS) return r;
    const int me = comm->rank, n = comm->nranks;
    size_t es = loom_datatype_size(dtype);
    if (!es)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, me, "%s: dtype %d is not a valid datatype",
                          fn, (int)dtype);
    if ((unsigned)op >= LOOM_NUM_OPS)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, me, "%s: op %d is not a valid reduction op",
                          fn, (int)op);
    if (quorum < 1 || quorum > n)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, me,
                          "%s: quorum %d is not between 1 and the communicator's size %d", fn,
                          quorum, n);
    if (count > (SIZE_MAX / 4 - 4096 - (size_t)n) / es)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, me, "%s: count %zu is too large", fn, count);
    const size_t data = count * es;
    if (data && !sendbuf)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, me, "%s: sendbuf is NULL", fn);
    if (data && !recvbuf)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, me, "%s: recvbuf is NULL", fn);
    char dmsg[256];
    if (data && (loomi_devbuf_refused(fn, sendbuf, "sendbuf", dmsg, sizeof dmsg) ||
                 loomi_devbuf_refused(fn, recvbuf, "recvbuf", dmsg, sizeof dmsg)))
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, me, "%s", dmsg);
    if (sendbuf != recvbuf && data) {
        uintptr_t a = (uintptr_t)sendbuf, b = (uintptr_t)recvbuf;
        if (a < b + data && b < a + data)
            return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, me,
                              "%s: sendbuf and recvbuf overlap without being the in-place form",
                              fn);
    }
    if (loomi_group_active())
        return loomi_fail(LOOM_ERR_INVALID_USAGE, me,
                          "%s: not allowed between loom_group_start and loom_group_end", fn);
    struct loomi_quorum *q = state(comm);
    unsigned char *flags = malloc((size_t)n);
    if (!q || !flags) {
        free(flags);
        return loomi_fail(LOOM_ERR_NO_MEMORY, me, "%s: out of memory", fn);
    }
    const uint64_t no = ++q->calls;
    int got = 0;
    r = me == 0 ? decide(comm, fn, sendbuf, recvbuf, count, dtype, op, quorum, no, flags, &got)
                : contribute(comm, fn, sendbuf, recvbuf, count, dtype, op, quorum, no, flags,
                             &got);
    if (r == LOOM_SUCCESS || r == LOOM_ERR_MISMATCH) {
        if (contributors)
            for (int p = 0; p < n; p++) contributors[p] = flags[p];
        if (ncontrib) *ncontrib = got;
    }
    if (r == LOOM_SUCCESS && !flags[me])
        LOOMI_TRACE(me, "%s: call %llu completed without this rank (%d of %d contributed)", fn,
                    (unsigned long long)no, got, n);
    free(flags);
    return r;
}
