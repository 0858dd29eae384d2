/* harness.h - the tests' jobs over the sim transport (harness.c). */
#ifndef LOOM_TEST_HARNESS_H
#define LOOM_TEST_HARNESS_H

#include "loom.h"
#include "transports/sim/sim.h"

/* nranks communicators, all in this process, over the sim transport.
 * cfg may be NULL (environment and defaults, as loom_comm_init_rank).
 * comms must hold nranks entries. */
loom_result_t loomi_sim_world_create(int nranks, uint64_t seed, const loom_config_t *cfg,
                                     struct loomi_sim_world **w, loom_comm_t *comms);
/* Release every communicator still in comms (destroyed politely when it
 * has no pending operation, aborted otherwise; NULL entries are skipped
 * and every entry is set to NULL), then the world.  w may be NULL. */
void loomi_sim_world_destroy(struct loomi_sim_world *w, loom_comm_t *comms);

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
