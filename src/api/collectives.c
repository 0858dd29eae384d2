/*
 * collectives.c - the public collective calls and the calls on requests:
 * the door.  Each names itself and passes its arguments to the body in
 * comm/collectives.c, which checks them, picks the algorithm, builds the
 * schedule and runs it (blocking), hands back a request (non-blocking)
 * or queues it (inside a group).  The library's own services (probes,
 * tuning, state sync, windows) call those bodies directly.
 *
 * The wrappers below repeat one shape on purpose: each public call (and
 * its non-blocking twin) stays a visible one-liner with its own name
 * string, so a reader and the man pages can match them call for call.
 */
#include "comm/collectives.h"
#include "core/internal.h"

static loom_result_t need_req(const char *fn, loom_request_t *req)
{
    if (!req) return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1, "%s: req is NULL", fn);
    *req = LOOM_REQUEST_NULL;
    return LOOM_SUCCESS;
}

loom_result_t loom_allreduce(const void *sendbuf, void *recvbuf, size_t count,
                             loom_datatype_t dtype, loom_op_t op, loom_comm_t comm)
{
    return loomi_call_allreduce("loom_allreduce", sendbuf, recvbuf, count, dtype, op, comm, NULL,
                                NULL);
}

loom_result_t loom_allreduce_quorum(const void *sendbuf, void *recvbuf, size_t count,
                                    loom_datatype_t dtype, loom_op_t op, int quorum,
                                    loom_comm_t comm, int *contributors, int *ncontrib)
{
    return loomi_call_allreduce_quorum("loom_allreduce_quorum", sendbuf, recvbuf, count, dtype, op,
                                       quorum, comm, contributors, ncontrib);
}

loom_result_t loom_allreduce_opts(const void *sendbuf, void *recvbuf, size_t count,
                                  loom_datatype_t dtype, loom_op_t op, loom_comm_t comm,
                                  const loom_coll_options_t *opts)
{
    return loomi_call_allreduce("loom_allreduce_opts", sendbuf, recvbuf, count, dtype, op, comm,
                                opts, NULL);
}

loom_result_t loom_iallreduce_opts(const void *sendbuf, void *recvbuf, size_t count,
                                   loom_datatype_t dtype, loom_op_t op, loom_comm_t comm,
                                   const loom_coll_options_t *opts, loom_request_t *req)
{
    loom_result_t r = need_req("loom_iallreduce_opts", req);
    if (r != LOOM_SUCCESS) return r;
    return loomi_call_allreduce("loom_iallreduce_opts", sendbuf, recvbuf, count, dtype, op, comm,
                                opts, req);
}

loom_result_t loom_iallreduce(const void *sendbuf, void *recvbuf, size_t count,
                              loom_datatype_t dtype, loom_op_t op, loom_comm_t comm,
                              loom_request_t *req)
{
    loom_result_t r = need_req("loom_iallreduce", req);
    if (r != LOOM_SUCCESS) return r;
    return loomi_call_allreduce("loom_iallreduce", sendbuf, recvbuf, count, dtype, op, comm, NULL,
                                req);
}

loom_result_t loom_reduce_scatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                                  loom_datatype_t dtype, loom_op_t op, loom_comm_t comm)
{
    return loomi_call_reduce_scatter("loom_reduce_scatter", sendbuf, recvbuf, recvcount, dtype, op,
                                     comm, NULL, NULL);
}

loom_result_t loom_reduce_scatter_opts(const void *sendbuf, void *recvbuf, size_t recvcount,
                                       loom_datatype_t dtype, loom_op_t op, loom_comm_t comm,
                                       const loom_coll_options_t *opts)
{
    return loomi_call_reduce_scatter("loom_reduce_scatter_opts", sendbuf, recvbuf, recvcount, dtype,
                                     op, comm, opts, NULL);
}

loom_result_t loom_ireduce_scatter_opts(const void *sendbuf, void *recvbuf, size_t recvcount,
                                        loom_datatype_t dtype, loom_op_t op, loom_comm_t comm,
                                        const loom_coll_options_t *opts, loom_request_t *req)
{
    loom_result_t r = need_req("loom_ireduce_scatter_opts", req);
    if (r != LOOM_SUCCESS) return r;
    return loomi_call_reduce_scatter("loom_ireduce_scatter_opts", sendbuf, recvbuf, recvcount,
                                     dtype, op, comm, opts, req);
}

loom_result_t loom_ireduce_scatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                                   loom_datatype_t dtype, loom_op_t op, loom_comm_t comm,
                                   loom_request_t *req)
{
    loom_result_t r = need_req("loom_ireduce_scatter", req);
    if (r != LOOM_SUCCESS) return r;
    return loomi_call_reduce_scatter("loom_ireduce_scatter", sendbuf, recvbuf, recvcount, dtype, op,
                                     comm, NULL, req);
}

loom_result_t loom_allgather(const void *sendbuf, void *recvbuf, size_t sendcount,
                             loom_datatype_t dtype, loom_comm_t comm)
{
    return loomi_call_allgather("loom_allgather", sendbuf, recvbuf, sendcount, dtype, comm, NULL,
                                NULL);
}

loom_result_t loom_allgather_opts(const void *sendbuf, void *recvbuf, size_t sendcount,
                                  loom_datatype_t dtype, loom_comm_t comm,
                                  const loom_coll_options_t *opts)
{
    return loomi_call_allgather("loom_allgather_opts", sendbuf, recvbuf, sendcount, dtype, comm,
                                opts, NULL);
}

loom_result_t loom_iallgather_opts(const void *sendbuf, void *recvbuf, size_t sendcount,
                                   loom_datatype_t dtype, loom_comm_t comm,
                                   const loom_coll_options_t *opts, loom_request_t *req)
{
    loom_result_t r = need_req("loom_iallgather_opts", req);
    if (r != LOOM_SUCCESS) return r;
    return loomi_call_allgather("loom_iallgather_opts", sendbuf, recvbuf, sendcount, dtype, comm,
                                opts, req);
}

loom_result_t loom_iallgather(const void *sendbuf, void *recvbuf, size_t sendcount,
                              loom_datatype_t dtype, loom_comm_t comm, loom_request_t *req)
{
    loom_result_t r = need_req("loom_iallgather", req);
    if (r != LOOM_SUCCESS) return r;
    return loomi_call_allgather("loom_iallgather", sendbuf, recvbuf, sendcount, dtype, comm, NULL,
                                req);
}

loom_result_t loom_alltoall(const void *sendbuf, void *recvbuf, size_t count, loom_datatype_t dtype,
                            loom_comm_t comm)
{
    return loomi_call_alltoall("loom_alltoall", sendbuf, recvbuf, count, dtype, comm, NULL);
}

loom_result_t loom_ialltoall(const void *sendbuf, void *recvbuf, size_t count,
                             loom_datatype_t dtype, loom_comm_t comm, loom_request_t *req)
{
    loom_result_t r = need_req("loom_ialltoall", req);
    if (r != LOOM_SUCCESS) return r;
    return loomi_call_alltoall("loom_ialltoall", sendbuf, recvbuf, count, dtype, comm, req);
}

loom_result_t loom_alltoallv(const void *sendbuf, const size_t *sendcounts, const size_t *sdispls,
                             void *recvbuf, const size_t *recvcounts, const size_t *rdispls,
                             loom_datatype_t dtype, loom_comm_t comm)
{
    return loomi_call_alltoallv("loom_alltoallv", sendbuf, sendcounts, sdispls, recvbuf, recvcounts,
                                rdispls, dtype, comm, NULL);
}

loom_result_t loom_ialltoallv(const void *sendbuf, const size_t *sendcounts, const size_t *sdispls,
                              void *recvbuf, const size_t *recvcounts, const size_t *rdispls,
                              loom_datatype_t dtype, loom_comm_t comm, loom_request_t *req)
{
    loom_result_t r = need_req("loom_ialltoallv", req);
    if (r != LOOM_SUCCESS) return r;
    return loomi_call_alltoallv("loom_ialltoallv", sendbuf, sendcounts, sdispls, recvbuf,
                                recvcounts, rdispls, dtype, comm, req);
}

loom_result_t loom_broadcast(const void *sendbuf, void *recvbuf, size_t count,
                             loom_datatype_t dtype, int root, loom_comm_t comm)
{
    return loomi_call_broadcast("loom_broadcast", sendbuf, recvbuf, count, dtype, root, comm, NULL);
}

loom_result_t loom_ibroadcast(const void *sendbuf, void *recvbuf, size_t count,
                              loom_datatype_t dtype, int root, loom_comm_t comm,
                              loom_request_t *req)
{
    loom_result_t r = need_req("loom_ibroadcast", req);
    if (r != LOOM_SUCCESS) return r;
    return loomi_call_broadcast("loom_ibroadcast", sendbuf, recvbuf, count, dtype, root, comm, req);
}

loom_result_t loom_reduce(const void *sendbuf, void *recvbuf, size_t count, loom_datatype_t dtype,
                          loom_op_t op, int root, loom_comm_t comm)
{
    return loomi_call_reduce("loom_reduce", sendbuf, recvbuf, count, dtype, op, root, comm, NULL);
}

loom_result_t loom_ireduce(const void *sendbuf, void *recvbuf, size_t count, loom_datatype_t dtype,
                           loom_op_t op, int root, loom_comm_t comm, loom_request_t *req)
{
    loom_result_t r = need_req("loom_ireduce", req);
    if (r != LOOM_SUCCESS) return r;
    return loomi_call_reduce("loom_ireduce", sendbuf, recvbuf, count, dtype, op, root, comm, req);
}

loom_result_t loom_gather(const void *sendbuf, void *recvbuf, size_t sendcount,
                          loom_datatype_t dtype, int root, loom_comm_t comm)
{
    return loomi_call_gather("loom_gather", sendbuf, recvbuf, sendcount, dtype, root, comm, NULL);
}

loom_result_t loom_igather(const void *sendbuf, void *recvbuf, size_t sendcount,
                           loom_datatype_t dtype, int root, loom_comm_t comm, loom_request_t *req)
{
    loom_result_t r = need_req("loom_igather", req);
    if (r != LOOM_SUCCESS) return r;
    return loomi_call_gather("loom_igather", sendbuf, recvbuf, sendcount, dtype, root, comm, req);
}

loom_result_t loom_scatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                           loom_datatype_t dtype, int root, loom_comm_t comm)
{
    return loomi_call_scatter("loom_scatter", sendbuf, recvbuf, recvcount, dtype, root, comm, NULL);
}

loom_result_t loom_iscatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                            loom_datatype_t dtype, int root, loom_comm_t comm, loom_request_t *req)
{
    loom_result_t r = need_req("loom_iscatter", req);
    if (r != LOOM_SUCCESS) return r;
    return loomi_call_scatter("loom_iscatter", sendbuf, recvbuf, recvcount, dtype, root, comm, req);
}

loom_result_t loom_barrier(loom_comm_t comm)
{
    return loomi_call_barrier("loom_barrier", comm, NULL);
}

loom_result_t loom_ibarrier(loom_comm_t comm, loom_request_t *req)
{
    loom_result_t r = need_req("loom_ibarrier", req);
    if (r != LOOM_SUCCESS) return r;
    return loomi_call_barrier("loom_ibarrier", comm, req);
}

loom_result_t loom_wait(loom_request_t *req) { return loomi_req_wait(req); }

loom_result_t loom_test(loom_request_t *req, int *done) { return loomi_req_test(req, done); }

loom_result_t loom_wait_any(loom_request_t *reqs, int n, int *index)
{
    return loomi_req_wait_any(reqs, n, index);
}

loom_result_t loom_wait_all(loom_request_t *reqs, int n) { return loomi_req_wait_all(reqs, n); }

loom_result_t loom_gossip_average(void *buf, size_t count, loom_datatype_t dtype, int peer,
                                  uint64_t round, loom_comm_t comm)
{
    return loomi_call_gossip("loom_gossip_average", buf, count, dtype, peer, round, comm, NULL);
}

loom_result_t loom_igossip_average(void *buf, size_t count, loom_datatype_t dtype, int peer,
                                   uint64_t round, loom_comm_t comm, loom_request_t *req)
{
    loom_result_t r = need_req("loom_igossip_average", req);
    if (r != LOOM_SUCCESS) return r;
    return loomi_call_gossip("loom_igossip_average", buf, count, dtype, peer, round, comm, req);
}

loom_result_t loom_gossip_partner(loom_comm_t comm, uint64_t round, int *partner)
{
    return loomi_call_gossip_partner("loom_gossip_partner", comm, round, partner);
}

loom_result_t loom_sparse_allgather(const uint64_t *idx, const void *val, size_t nnz,
                                    size_t dense_count, loom_datatype_t dtype, loom_op_t op,
                                    void *recvbuf, loom_comm_t comm)
{
    return loomi_call_sparse_allgather("loom_sparse_allgather", idx, val, nnz, dense_count, dtype,
                                       op, recvbuf, comm);
}

loom_result_t loom_sparse_reduce_scatter(const uint64_t *idx, const void *val, size_t nnz,
                                         size_t recvcount, loom_datatype_t dtype, loom_op_t op,
                                         void *recvbuf, loom_comm_t comm)
{
    return loomi_call_sparse_reduce_scatter("loom_sparse_reduce_scatter", idx, val, nnz,
                                            recvcount, dtype, op, recvbuf, comm);
}
