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

/* How many ranks the world has. */
int loomi_sim_world_size(const struct loomi_sim_world *w);

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

#endif
