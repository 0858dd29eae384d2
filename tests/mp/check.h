/*
 * check.h - the multi-process tests' CHECK(cond, fmt, ...): on a false
 * cond, count a failure in the including file's `failures` and print
 * "rank R: FAIL line L: " and the message to standard error, R being
 * its `rank`.  The test goes on; it exits non-zero at the end when
 * failures is not 0.
 */
#ifndef LOOM_TESTS_MP_CHECK_H
#define LOOM_TESTS_MP_CHECK_H

#include <stdio.h>

#define CHECK(cond, ...)                                                    \
    do {                                                                    \
        if (!(cond)) {                                                      \
            failures++;                                                     \
            fprintf(stderr, "rank %d: FAIL line %d: ", rank, __LINE__);     \
            fprintf(stderr, __VA_ARGS__);                                   \
            fprintf(stderr, "\n");                                          \
        }                                                                   \
    } while (0)

#endif
