/*
 * local.h - communicators built around a given transport without the
 * TCP bootstrap (the sim transport's worlds in tests, loom-info), and
 * the knobs tests turn on them.
 */
#ifndef LOOMI_LOCAL_H
#define LOOMI_LOCAL_H

#include <stddef.h>

#include "loom.h"
#include "transports/transport.h"

/* Creates the transport state of a communicator being built: ctx carries
 * rank, size and the failure callback that must reach the communicator. */
typedef loom_result_t (*loomi_tstate_fn)(void *arg, const struct loomi_tctx *ctx, void **state);

/* A communicator around a given transport, without the TCP bootstrap:
 * settings from cfg and the environment as for loom_comm_init_rank,
 * LOOM_ALGO parsed, then make(arg, ctx, &state) creates the transport
 * state.  Released with loom_comm_destroy / loom_comm_abort as usual. */
loom_result_t loomi_comm_create_local(loom_comm_t *out, int rank, int nranks,
                                      const loom_config_t *cfg,
                                      const struct loomi_transport_ops *tops,
                                      loomi_tstate_fn make, void *arg, const char *caller);

/* Whether h names a communicator with operations not yet waited for
 * (to be aborted rather than destroyed). */
int loomi_comm_busy(loom_comm_t h);

/* Force the algorithm of one collective (LOOMI_ALGO_AUTO: back to the
 * default choice), as LOOM_ALGO would. */
void loomi_comm_force_algo(loom_comm_t c, int coll, int algo);

/* Set the pipelining chunk without LOOM_CHUNK_SIZE's 4 KiB floor, so that
 * tests cut small messages into many chunks. */
void loomi_comm_set_chunk_bytes(loom_comm_t c, size_t bytes);
/* Tell a local communicator which ranks share a host (host_of[nranks],
 * any numbering), as topology discovery does for real ones. */
loom_result_t loomi_comm_set_hosts(loom_comm_t c, const int *host_of);

#endif
