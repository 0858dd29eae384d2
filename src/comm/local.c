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
#include "sched/simulate.h"

/* The same reaction to a failed peer as a TCP communicator's. */
static void local_peer_failed(void *owner, int peer, int failed, loom_result_t code,
                              const char *why)
{
    struct loom_comm *c = owner;
    if (failed == peer || failed < 0)
        loomi_comm_fail(c, code, peer, "rank %d failed: %s", peer, why);
    else
        loomi_comm_fail(c, code, failed, "rank %d reported that rank %d failed: %s", peer,
                        failed, why);
}

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
    struct loom_comm *c = calloc(1, sizeof *c);
    if (!c) return loomi_fail(LOOM_ERR_NO_MEMORY, rank, "%s: out of memory", caller);
    c->rank = rank;
    c->nranks = nranks;
    c->failed_rank = -1;
    loom_result_t r = loomi_settings_resolve(&c->set, cfg, caller);
    if (r == LOOM_SUCCESS) r = loomi_algo_parse(c->set.algo, c->algo_forced, rank);
    if (r != LOOM_SUCCESS) {
        free(c);
        return r;
    }
    c->tops = tops;
    struct loomi_tctx ctx = {
        .rank = rank,
        .nranks = nranks,
        .job_key = c->job_key,
        .streams = 1,
        .peer_failed = local_peer_failed,
        .owner = c,
    };
    r = make(arg, &ctx, &c->tstate);
    if (r != LOOM_SUCCESS) {
        free(c);
        return r;
    }
    c->magic = LOOMI_COMM_MAGIC;
    LOOMI_INFO(rank, "local communicator ready: rank %d of %d, transport %s, chunk %zu", rank,
               nranks, tops->name, c->set.chunk_bytes);
    *out = c;
    return LOOM_SUCCESS;
}

void loomi_comm_force_algo(loom_comm_t c, int coll, int algo)
{
    if (c && coll >= 0 && coll < LOOMI_NUM_COLLS && algo >= 0 && algo < LOOMI_NUM_ALGOS)
        c->algo_forced[coll] = algo;
}

void loomi_comm_set_chunk_bytes(loom_comm_t c, size_t bytes)
{
    if (c && bytes) c->set.chunk_bytes = bytes;
}
