/*
 * local.c - communicators built around a given transport, without the
 * TCP bootstrap: every rank of the sim transport lives in this process,
 * so there is nothing to rendezvous with.  The struct is filled the way
 * loomi_comm_create fills it, so loom_comm_destroy, loom_comm_abort and
 * the engine treat both alike.
 */
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "comm/comm.h"
#include "core/hostmap.h"
#include "comm/local.h"

loom_result_t loomi_comm_create_local(loom_comm_t *out, int rank, int nranks,
                                      const loom_config_t *cfg,
                                      const struct loomi_transport_ops *tops,
                                      loomi_tstate_fn make, void *arg, const char *caller)
{
    if (!out || !tops || !make)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, rank, "%s: out, tops and make are required",
                          caller);
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, rank, "%s: rank %d of %d is not valid",
                          caller, rank, nranks);
    *out = NULL;
    struct loom_comm *c;
    loom_result_t r = loomi_comm_alloc(&c, rank, nranks, cfg, caller);
    if (r != LOOM_SUCCESS) return r;
    c->eng.tops = tops;
    struct loomi_tctx ctx = {
        .rank = rank,
        .nranks = nranks,
        .job_key = c->job_key,
        .peer_failed = loomi_comm_on_peer_failed,
        .owner = c,
        .name_sig = loomi_sched_sig_name,
        .sock = {.streams = 1},
        .shm = {.bytes = c->set.shm_bytes},
    };
    if (tops->shared_map) c->shared_bytes = c->set.shm_bytes;
    r = make(arg, &ctx, &c->eng.tstate);
    if (r != LOOM_SUCCESS) {
        free(c);
        return r;
    }
    r = loomi_comm_publish(c);
    if (r != LOOM_SUCCESS) {
        tops->destroy(c->eng.tstate);
        free(c);
        return r;
    }
    LOOMI_INFO(rank, "local communicator ready: rank %d of %d, transport %s, chunk %zu", rank,
               nranks, tops->name, c->set.chunk_bytes);
    *out = c->handle;
    return LOOM_SUCCESS;
}

int loomi_comm_busy(loom_comm_t h)
{
    const struct loom_comm *c = loomi_comm_get(h);
    return c && c->eng.nlive;
}

void loomi_comm_force_algo(loom_comm_t h, int coll, int algo)
{
    struct loom_comm *c = loomi_comm_get(h);
    if (c && coll >= 0 && coll < LOOMI_NUM_COLLS && algo >= 0 && algo < LOOMI_NUM_ALGOS)
        c->algo_forced[coll] = algo;
}

void loomi_comm_set_chunk_bytes(loom_comm_t h, size_t bytes)
{
    struct loom_comm *c = loomi_comm_get(h);
    if (c && bytes && c->set.chunk_bytes != bytes) {
        c->set.chunk_bytes = bytes;
        loomi_sched_cache_free(c->sched_cache);
        c->sched_cache = NULL;
    }
}

loom_result_t loomi_comm_set_hosts(loom_comm_t h, const int *host_of)
{
    struct loom_comm *c = loomi_comm_get(h);
    if (!c || !host_of) return LOOM_ERR_INVALID_ARGUMENT;
    struct loomi_hostmap *m = loomi_hostmap_build(c->nranks, host_of);
    if (!m) return loomi_fail(LOOM_ERR_NO_MEMORY, c->rank, "loomi_comm_set_hosts: out of memory");
    free(c->hosts);
    c->hosts = m;
    loomi_sched_cache_free(c->sched_cache); /* built for the old layout */
    c->sched_cache = NULL;
    return LOOM_SUCCESS;
}
