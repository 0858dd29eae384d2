/*
 * sim.h - the simulated transport: every rank of a job in one process.
 *
 * A world holds one endpoint per rank behind the ordinary transport table
 * (loomi_sim_ops), so the real engine and the public collectives run
 * unchanged.  isend/irecv only queue; progress() delivers matched
 * (src, dst, tag) pairs by copying straight from the sender's buffer to
 * the receiver's and completing both sides (rendezvous: a send completes
 * only when its receive is there).  When several pairs can be delivered a
 * seeded PRNG picks which and how many, so tests explore orders and the
 * same seed replays the same run.  Everything is driven from one thread.
 */
#ifndef LOOMI_SIM_H
#define LOOMI_SIM_H

#include <stddef.h>
#include <stdint.h>

#include "loom.h"
#include "transports/transport.h"

struct loomi_sim_world;

extern const struct loomi_transport_ops loomi_sim_ops;

/* nranks communicators, all in this process, over the sim transport.
 * cfg may be NULL (environment and defaults, as loom_comm_init_rank).
 * comms must hold nranks entries. */
loom_result_t loomi_sim_world_create(int nranks, uint64_t seed, const loom_config_t *cfg,
                                     struct loomi_sim_world **w, loom_comm_t *comms);
/* Release every communicator still in comms (destroyed politely when it
 * has no pending operation, aborted otherwise; NULL entries are skipped
 * and every entry is set to NULL), then the world.  w may be NULL. */
void loomi_sim_world_destroy(struct loomi_sim_world *w, loom_comm_t *comms);

/* Restart the world's PRNG: same seed, same order of deliveries. */
void loomi_sim_world_reseed(struct loomi_sim_world *w, uint64_t seed);

/* ------------------------------------------------ the bare transport */

/* A world without communicators (for tests of the transport itself):
 * endpoints are added one by one with loomi_sim_endpoint_create and
 * released with loomi_sim_ops.destroy; loomi_sim_world_free frees what
 * is left. */
struct loomi_sim_world *loomi_sim_world_new(int nranks, uint64_t seed);
loom_result_t loomi_sim_endpoint_create(struct loomi_sim_world *w, const struct loomi_tctx *ctx,
                                        void **state);
void loomi_sim_world_free(struct loomi_sim_world *w);

/* --------------------------------------------------------- counters */

struct loomi_sim_stats {
    uint64_t delivered;   /* messages copied */
    uint64_t bytes;       /* payload bytes copied */
    uint64_t events;      /* deliveries, failures and notices: anything that moved */
    uint64_t max_ready;   /* most pairs deliverable at once */
    uint64_t digest;      /* hash of the delivery order: equal seeds, equal digests */
    size_t pending;       /* transfers posted and not yet matched */
    size_t deliverable;   /* pairs matched and not yet delivered */
};
void loomi_sim_world_stats(const struct loomi_sim_world *w, struct loomi_sim_stats *st);

/* Up to `max` posted, unmatched transfers as text ("rank 3: receive from
 * rank 2, tag 0x..., 64 bytes; ..."), for reports of a hang.  Returns buf. */
char *loomi_sim_world_describe(const struct loomi_sim_world *w, int max, char *buf, size_t len);

/* ----------------------------------------------------------- driver */

/* Drive the requests reqs[0..n) of comms[0..n) (LOOM_REQUEST_NULL entries
 * count as done) with loom_test, round-robin over the ranks, until all
 * have completed.  results[i] receives each rank's result, and msg the
 * first failure's message ("rank 3: ...", with the rank its communicator
 * blames when comms is given: the thread's last error is overwritten by
 * later calls), or "" when all succeeded.  comms may be NULL.  Returns
 * LOOM_SUCCESS when every request completed (whatever its result), or
 * LOOM_ERR_TIMEOUT when nothing moved for two whole rounds or after
 * max_rounds rounds (0: no cap) -- a hang, described in msg (rank, the
 * stuck transfers).  After a hang the requests still pending are left as
 * they are: release the communicators with loomi_sim_world_destroy. */
loom_result_t loomi_sim_run(struct loomi_sim_world *w, loom_comm_t *comms, loom_request_t *reqs,
                            int n, uint64_t max_rounds, loom_result_t *results, char *msg,
                            size_t msglen);

#endif
