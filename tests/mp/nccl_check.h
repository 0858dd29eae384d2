/*
 * nccl_check.h - what the NCCL programs run by tests/mp/test_nccl.sh
 * (nccl_prog.c, nccl_devbuf.c) share, on nccl.h alone: this rank and the
 * number of ranks (g_rank, g_n, set by main), the checks passed and
 * failed (g_pass, g_fail), expect and expect_err, NCCLCHECK, and get_id,
 * which hands rank 0's ncclUniqueId to the others through a file.
 * Checks print "FAIL rank R: ..." lines; with g_say_ok set, rank 0 also
 * prints an "ok   ..." line for each check passed.
 */
#ifndef LOOM_TESTS_MP_NCCL_CHECK_H
#define LOOM_TESTS_MP_NCCL_CHECK_H

#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int g_rank, g_n, g_fail, g_pass, g_say_ok;

/* A call that must succeed: on failure, print the call and its error and
 * exit 1. */
#define NCCLCHECK(call)                                                        \
    do {                                                                       \
        ncclResult_t r_ = (call);                                              \
        if (r_ != ncclSuccess) {                                               \
            printf("FAIL rank %d: %s:%d %s: %s (%s)\n", g_rank, __FILE__,      \
                   __LINE__, #call, ncclGetErrorString(r_),                    \
                   ncclGetLastError(NULL));                                    \
            exit(1);                                                           \
        }                                                                      \
    } while (0)

static inline void expect(int cond, const char *what)
{
    if (cond) {
        g_pass++;
        if (g_say_ok && g_rank == 0) printf("ok   %s\n", what);
    } else {
        g_fail++;
        printf("FAIL rank %d: %s\n", g_rank, what);
    }
}

/* An error call: the code want, and a message that names the culprit
 * (holds word). */
static inline void expect_err(ncclResult_t got, ncclResult_t want, const char *word,
                              const char *what)
{
    const char *msg = ncclGetLastError(NULL);
    if (got == want && strstr(msg, word) != NULL) {
        g_pass++;
        if (g_rank == 0) printf("ok   %s: %s\n", what, msg);
    } else {
        g_fail++;
        printf("FAIL rank %d: %s: got %d (%s), want %d, message \"%s\" lacks \"%s\"?\n", g_rank,
               what, (int)got, ncclGetErrorString(got), (int)want, msg, word);
    }
}

/* Rank 0 makes the id and writes it to file (through file.tmp, renamed);
 * the others wait up to 30 s for it.  Exits 1 when it cannot. */
static inline void get_id(const char *file, ncclUniqueId *id)
{
    if (g_rank == 0) {
        NCCLCHECK(ncclGetUniqueId(id));
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp", file);
        FILE *f = fopen(tmp, "wb");
        if (!f || fwrite(id, sizeof *id, 1, f) != 1 || fclose(f) != 0 || rename(tmp, file) != 0) {
            printf("FAIL rank 0: cannot write %s\n", file);
            exit(1);
        }
        return;
    }
    for (int tries = 0; tries < 3000; tries++) { /* 30 s */
        FILE *f = fopen(file, "rb");
        if (f) {
            size_t got = fread(id, sizeof *id, 1, f);
            fclose(f);
            if (got == 1) return;
        }
        nanosleep(&(struct timespec){0, 10000000}, NULL);
    }
    printf("FAIL rank %d: no id in %s after 30 s\n", g_rank, file);
    exit(1);
}

#endif
