/*
 * fail.h - the checks of the multi-process tests that stop a rank at
 * its first failure (mp_split.c, mp_cgroup.c), where check.h's CHECK
 * counts failures and goes on: include one or the other.
 *
 * The including file has a `rank` (this process's rank) in scope.
 *
 * FAIL(fmt, ...): print "FAIL rank R line L: ", the message and the
 * library's last error in brackets to standard output, and exit 1.
 * CHECK(call): FAIL unless call gives LOOM_SUCCESS.
 * EXPECT(call, code, word): FAIL unless call gives code and the last
 * error's message holds word.
 * now_ms(): a monotonic clock in milliseconds.
 * fail_join(&comm, &rank, &nranks): the start of such a test's main
 * (loom_comm_init_env); on failure prints "FAIL init: ..." and exits 1.
 */
#ifndef LOOM_TESTS_MP_FAIL_H
#define LOOM_TESTS_MP_FAIL_H

#ifdef LOOM_TESTS_MP_CHECK_H
#error "tests/mp/fail.h and tests/mp/check.h both define CHECK: include one"
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loom.h"

#define FAIL(...)                                                                              \
    do {                                                                                       \
        printf("FAIL rank %d line %d: ", rank, __LINE__);                                      \
        printf(__VA_ARGS__);                                                                   \
        printf(" [%s]\n", loom_get_last_error());                                              \
        exit(1);                                                                               \
    } while (0)
#define CHECK(call)                                                                            \
    do {                                                                                       \
        loom_result_t r_ = (call);                                                             \
        if (r_ != LOOM_SUCCESS) FAIL("%s: %s", #call, loom_strerror(r_));                      \
    } while (0)
#define EXPECT(call, code, word)                                                               \
    do {                                                                                       \
        loom_result_t r_ = (call);                                                             \
        if (r_ != (code))                                                                      \
            FAIL("%s gave %s, expected %s", #call, loom_strerror(r_), loom_strerror(code));    \
        if (!strstr(loom_get_last_error(), (word)))                                            \
            FAIL("%s: message does not name '%s'", #call, (word));                             \
    } while (0)

static inline double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static inline void fail_join(loom_comm_t *comm, int *rank, int *nranks)
{
    if (loom_comm_init_env(comm, NULL) != LOOM_SUCCESS) {
        printf("FAIL init: %s\n", loom_get_last_error());
        exit(1);
    }
    loom_comm_rank(*comm, rank);
    loom_comm_size(*comm, nranks);
}

#endif
