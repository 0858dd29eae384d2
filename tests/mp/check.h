/*
 * check.h - what the multi-process tests share.
 *
 * CHECK(cond, fmt, ...): on a false cond, count a failure in the
 * including file's `failures` and print "rank R: FAIL line L: " and the
 * message to standard error, R being its `rank`.  The test goes on; it
 * exits non-zero at the end when failures is not 0.
 *
 * mp_join(&comm, &rank, &nranks): the start of such a test's main.
 */
#ifndef LOOM_TESTS_MP_CHECK_H
#define LOOM_TESTS_MP_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#include "loom.h"

#define CHECK(cond, ...)                                                    \
    do {                                                                    \
        if (!(cond)) {                                                      \
            failures++;                                                     \
            fprintf(stderr, "rank %d: FAIL line %d: ", rank, __LINE__);     \
            fprintf(stderr, __VA_ARGS__);                                   \
            fprintf(stderr, "\n");                                          \
        }                                                                   \
    } while (0)

/* Joins the job loomrun started (loom_comm_init_env): the communicator
 * in *comm, this process's rank in *rank, the number of ranks in
 * *nranks.  On failure prints the error and exits 2. */
static inline void mp_join(loom_comm_t *comm, int *rank, int *nranks)
{
    loom_result_t r = loom_comm_init_env(comm, NULL);
    if (r != LOOM_SUCCESS) {
        fprintf(stderr, "init: %s: %s\n", loom_strerror(r), loom_get_last_error());
        exit(2);
    }
    loom_comm_rank(*comm, rank);
    loom_comm_size(*comm, nranks);
}

#endif
