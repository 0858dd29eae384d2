/*
 * mem.c - loom_mem_register / loom_mem_deregister: regions the
 * application keeps registered with the transports that need it (RDMA
 * verbs), so that its operations skip registration and, above all, so
 * that a registration ends exactly when the application says the memory
 * may change: deregistering invalidates it in the transport's cache.
 */
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "transports/route.h"
#include "core/internal.h"

/* A handle is only ever found by its address in comm->regs, so it needs
 * no magic of its own. */
struct loom_mem {
    struct loom_mem *next;
    int in_transport; /* a transport holds a registration for it */
    struct loomi_mr mr;
};

loom_result_t loom_mem_register(loom_comm_t h, void *buf, size_t bytes, loom_mem_t *handle)
{
    const char *fn = "loom_mem_register";
    if (handle) *handle = NULL;
    struct loom_comm *comm;
    loom_result_t r = loomi_comm_check(h, fn, &comm);
    if (r != LOOM_SUCCESS) return r;
    if (!handle) return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, comm->rank, "%s: handle is NULL", fn);
    if (!buf) return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, comm->rank, "%s: buf is NULL", fn);
    if (bytes == 0)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, comm->rank, "%s: bytes is 0", fn);
    if ((uintptr_t)buf + bytes < (uintptr_t)buf)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, comm->rank,
                          "%s: buf + bytes (%zu) wraps around the address space", fn, bytes);
    struct loom_mem *m = calloc(1, sizeof *m);
    if (!m) return loomi_fail(LOOM_ERR_NO_MEMORY, comm->rank, "%s: out of memory", fn);
    if (comm->eng.tops == &loomi_route_ops) {
        /* The transport is the engine's: not while the progress thread
         * drives it. */
        loomi_comm_lock(comm);
        r = loomi_route_mem_register(comm->eng.tstate, buf, bytes, &m->mr, &m->in_transport);
        loomi_comm_unlock(comm);
        if (r != LOOM_SUCCESS) {
            free(m);
            return r;
        }
    }
    m->next = comm->regs;
    comm->regs = m;
    *handle = m;
    return LOOM_SUCCESS;
}

loom_result_t loom_mem_deregister(loom_comm_t h, loom_mem_t handle)
{
    const char *fn = "loom_mem_deregister";
    /* A broken communicator still releases its registrations. */
    struct loom_comm *comm;
    loom_result_t r = loomi_comm_live_arg(h, fn, handle, "handle", &comm);
    if (r != LOOM_SUCCESS) return r;
    /* Find it by address before touching it: a handle deregistered
     * already, or another communicator's, is refused, not dereferenced. */
    struct loom_mem **l = &comm->regs;
    while (*l && *l != handle) l = &(*l)->next;
    if (!*l)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, comm->rank,
                          "%s: handle is not a registration of this communicator (deregistered "
                          "already, or made on another one)",
                          fn);
    *l = handle->next;
    if (handle->in_transport) {
        /* Transfers using the region keep it until they complete; the
         * cache never hands it out again. */
        loomi_comm_lock(comm);
        loomi_route_mem_deregister(comm->eng.tstate, &handle->mr);
        loomi_comm_unlock(comm);
    }
    free(handle);
    return LOOM_SUCCESS;
}

/* Walks its list as loomi_mem_windows_free_all (window.c) does its
 * own: two lists of two types, alike on purpose. */
void loomi_mem_release_all(struct loom_comm *comm)
{
    /* The transport is gone (its destroy released every registration):
     * only the handles are left. */
    while (comm->regs) {
        struct loom_mem *m = comm->regs;
        comm->regs = m->next;
        free(m);
    }
}
