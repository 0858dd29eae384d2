/* coll.h - algorithms: each writes a schedule, none touches a socket. */
#ifndef LOOMI_COLL_H
#define LOOMI_COLL_H

#include "sched/sched.h"

/* Ring allreduce: reduce-scatter then allgather around the ring, every
 * segment cut into chunks of about chunk_bytes so that the hops pipeline. */
loom_result_t loomi_allreduce_ring(struct loomi_sched *s, size_t count, int inplace,
                                   size_t chunk_bytes);

/* Collectives and algorithms by name (LOOM_ALGO). */
enum loomi_coll { LOOMI_COLL_ALLREDUCE = 0, LOOMI_NUM_COLLS };
enum loomi_algo { LOOMI_ALGO_AUTO = 0, LOOMI_ALGO_RING, LOOMI_NUM_ALGOS };

struct loom_comm;
/* Parse a LOOM_ALGO string into forced[LOOMI_NUM_COLLS]; an unknown name is
 * an error whose message lists the valid ones. */
loom_result_t loomi_algo_parse(const char *spec, int forced[LOOMI_NUM_COLLS], int rank);
/* The algorithm to run for this collective and size. */
int loomi_algo_for(const struct loom_comm *comm, int coll, size_t bytes);

#endif
