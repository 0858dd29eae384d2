/*
 * validate.h - checking the schedules of a collective without running
 * them: every rank's part built by a generator, matched and run
 * symbolically (the sim suite, tests, loom-info).
 */
#ifndef LOOMI_VALIDATE_H
#define LOOMI_VALIDATE_H

#include <stddef.h>

#include "coll/coll.h"
#include "sched/sched.h"

struct loomi_validate_opts {
    /* Also check that two steps of one rank that are unordered in its DAG
     * neither write overlapping bytes nor write what the other reads. */
    int hazards;
    /* RECV lies inside SEND: RECV of rank r is SEND bytes from
     * r * buf_bytes[RECV] on (in-place reduce_scatter).  Used by the
     * hazard check, which then sees both names of the same bytes. */
    int recv_in_send;
    /* Upper bounds on buf_bytes[SEND] / [RECV] per rank (the user's
     * buffers), SIZE_MAX when unchecked; NULL: unchecked. */
    const size_t *send_limit, *recv_limit;
};

/* What a validation found (filled on success too). */
struct loomi_validate_stats {
    size_t steps, messages;
    size_t hazard_pairs;      /* overlapping pairs whose order was checked */
    int hazards_truncated;    /* the hazard check gave up on its budget */
};

/* Check all nranks ranks' schedules of one collective (sched[i] is rank
 * i's, built by a generator; loomi_sched_finish need not have been run):
 * every range inside its buffer and peer valid; every send matched by
 * exactly one receive (same src, dst, tag) of the same count and vice
 * versa; no (peer, tag) twice per direction; no deadlock when the DAGs
 * run with rendezvous semantics; optionally no hazards.  No step may
 * write SEND (the caller's const buffer).  Returns LOOM_SUCCESS or
 * LOOM_ERR_INTERNAL with a message naming rank, step, peer and tag in msg
 * (and loom_get_last_error).  opts and stats may be NULL. */
loom_result_t loomi_sched_validate(const struct loomi_sched *sched, int nranks,
                                   const struct loomi_validate_opts *opts,
                                   struct loomi_validate_stats *stats, char *msg, size_t msglen);

/* The same for schedules generated for a[r] on each rank r (the buffer
 * limits and the in-place aliasing follow coll.h's conventions for the
 * collective; ranks may differ in `inplace` and alltoallv's counts). */
loom_result_t loomi_sched_validate_coll(const struct loomi_sched *sched, int nranks,
                                        const struct loomi_coll_args *a, int hazards,
                                        struct loomi_validate_stats *stats, char *msg,
                                        size_t msglen);

/* Bytes of SEND and RECV that rank `rank` gives a collective (coll.h's
 * table; the alltoallv extents from the counts and displacements). */
void loomi_coll_extents(const struct loomi_coll_args *a, int rank, int nranks, size_t esize,
                        size_t *send_bytes, size_t *recv_bytes);

#endif
