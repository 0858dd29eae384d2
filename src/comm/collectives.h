/*
 * collectives.h - the bodies of the public collective, point-to-point,
 * group and request calls (comm/collectives.c, comm/group.c).
 *
 * src/api/ is the door: each public call passes its own name (fn, used
 * in every error message) and its arguments here.  The library's own
 * services on a communicator (link probes, tuning, state sync, windows)
 * call these directly, below the public API.  opts and req may be NULL
 * (no options; blocking).
 */
#ifndef LOOMI_COLLECTIVES_H
#define LOOMI_COLLECTIVES_H

#include <stddef.h>
#include <stdint.h>

#include "loom.h"

loom_result_t loomi_call_allreduce(const char *fn, const void *sendbuf, void *recvbuf, size_t count,
                                   loom_datatype_t dtype, loom_op_t op, loom_comm_t h,
                                   const loom_coll_options_t *opts, loom_request_t *req);
loom_result_t loomi_call_reduce_scatter(const char *fn, const void *sendbuf, void *recvbuf,
                                        size_t recvcount, loom_datatype_t dtype, loom_op_t op,
                                        loom_comm_t h, const loom_coll_options_t *opts,
                                        loom_request_t *req);
loom_result_t loomi_call_allgather(const char *fn, const void *sendbuf, void *recvbuf,
                                   size_t sendcount, loom_datatype_t dtype, loom_comm_t h,
                                   const loom_coll_options_t *opts, loom_request_t *req);
loom_result_t loomi_call_alltoall(const char *fn, const void *sendbuf, void *recvbuf, size_t count,
                                  loom_datatype_t dtype, loom_comm_t h, loom_request_t *req);
loom_result_t loomi_call_alltoallv(const char *fn, const void *sendbuf, const size_t *sendcounts,
                                   const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                                   const size_t *rdispls, loom_datatype_t dtype, loom_comm_t h,
                                   loom_request_t *req);
loom_result_t loomi_call_broadcast(const char *fn, const void *sendbuf, void *recvbuf, size_t count,
                                   loom_datatype_t dtype, int root, loom_comm_t h,
                                   loom_request_t *req);
loom_result_t loomi_call_reduce(const char *fn, const void *sendbuf, void *recvbuf, size_t count,
                                loom_datatype_t dtype, loom_op_t op, int root, loom_comm_t h,
                                loom_request_t *req);
loom_result_t loomi_call_gather(const char *fn, const void *sendbuf, void *recvbuf,
                                size_t sendcount, loom_datatype_t dtype, int root, loom_comm_t h,
                                loom_request_t *req);
loom_result_t loomi_call_scatter(const char *fn, const void *sendbuf, void *recvbuf,
                                 size_t recvcount, loom_datatype_t dtype, int root, loom_comm_t h,
                                 loom_request_t *req);
loom_result_t loomi_call_barrier(const char *fn, loom_comm_t h, loom_request_t *req);
/* loom_gossip_average(3): buf averaged in place with one partner's. */
loom_result_t loomi_call_gossip(const char *fn, void *buf, size_t count, loom_datatype_t dtype,
                                int peer, uint64_t round, loom_comm_t h, loom_request_t *req);
/* loom_gossip_partner(3): this rank's partner in a seeded round. */
loom_result_t loomi_call_gossip_partner(const char *fn, loom_comm_t h, uint64_t round,
                                        int *partner);

/* loom_allreduce_quorum(3) (quorum.c): contributors (nranks flags) and
 * ncontrib may be NULL. */
loom_result_t loomi_call_allreduce_quorum(const char *fn, const void *sendbuf, void *recvbuf,
                                          size_t count, loom_datatype_t dtype, loom_op_t op,
                                          int quorum, loom_comm_t h, int *contributors,
                                          int *ncontrib);

/* loom_sparse_allgather(3), loom_sparse_reduce_scatter(3) (comm/sparse.c). */
loom_result_t loomi_call_sparse_allgather(const char *fn, const uint64_t *idx, const void *val,
                                          size_t nnz, size_t dense_count, loom_datatype_t dtype,
                                          loom_op_t op, void *recvbuf, loom_comm_t h);
loom_result_t loomi_call_sparse_reduce_scatter(const char *fn, const uint64_t *idx,
                                               const void *val, size_t nnz, size_t recvcount,
                                               loom_datatype_t dtype, loom_op_t op,
                                               void *recvbuf, loom_comm_t h);

/* A send (is_send) of sbuf or a receive into rbuf: loom_send(3) and
 * friends; inside a group it is queued. */
loom_result_t loomi_call_p2p(const char *fn, int is_send, const void *sbuf, void *rbuf,
                             size_t count, loom_datatype_t dtype, int peer, loom_comm_t h,
                             loom_request_t *req);
/* Starts s (built for comm; it passes to the operation, or is freed) as
 * the operation *op; with req, also makes the request *req for it. */
struct loom_comm;
struct loomi_sched;
struct loomi_op;
loom_result_t loomi_comm_start(struct loom_comm *comm, const char *fn, struct loomi_sched *s,
                               const void *sbuf, void *rbuf, int save, loom_request_t *req,
                               struct loomi_op **op);

loom_result_t loomi_group_start(void);
loom_result_t loomi_group_end(void);

/* loom_wait(3), loom_test(3), loom_wait_any(3), loom_wait_all(3). */
loom_result_t loomi_req_wait(loom_request_t *req);
loom_result_t loomi_req_test(loom_request_t *req, int *done);
loom_result_t loomi_req_wait_any(loom_request_t *reqs, int n, int *index);
loom_result_t loomi_req_wait_all(loom_request_t *reqs, int n);

#endif
