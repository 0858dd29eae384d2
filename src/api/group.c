/*
 * group.c - the public point-to-point calls and loom_group_start/end: the
 * door to comm/group.c, which checks and runs them.
 */
#include "comm/collectives.h"
#include "core/internal.h"

loom_result_t loom_group_start(void) { return loomi_group_start(); }

loom_result_t loom_group_end(void) { return loomi_group_end(); }

loom_result_t loom_send(const void *buf, size_t count, loom_datatype_t dtype, int peer,
                        loom_comm_t comm)
{
    return loomi_call_p2p("loom_send", 1, buf, NULL, count, dtype, peer, comm, NULL);
}

loom_result_t loom_recv(void *buf, size_t count, loom_datatype_t dtype, int peer, loom_comm_t comm)
{
    return loomi_call_p2p("loom_recv", 0, NULL, buf, count, dtype, peer, comm, NULL);
}

loom_result_t loom_isend(const void *buf, size_t count, loom_datatype_t dtype, int peer,
                         loom_comm_t comm, loom_request_t *req)
{
    if (!req) return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1, "loom_isend: req is NULL");
    *req = LOOM_REQUEST_NULL;
    return loomi_call_p2p("loom_isend", 1, buf, NULL, count, dtype, peer, comm, req);
}

loom_result_t loom_irecv(void *buf, size_t count, loom_datatype_t dtype, int peer, loom_comm_t comm,
                         loom_request_t *req)
{
    if (!req) return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1, "loom_irecv: req is NULL");
    *req = LOOM_REQUEST_NULL;
    return loomi_call_p2p("loom_irecv", 0, NULL, buf, count, dtype, peer, comm, req);
}
