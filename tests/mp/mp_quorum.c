/*
 * mp_quorum.c - one rank of the quorum allreduce test (test_quorum.sh).
 *
 *   mp_quorum all
 *   1. Refused arguments (quorum 0 and n + 1, a bad dtype and op, NULL
 *      buffers, inside a group): LOOM_ERR_INVALID_ARGUMENT or
 *      LOOM_ERR_INVALID_USAGE with a message naming the argument.
 *   2. quorum = n, every dtype x op (small integers: exact in any order):
 *      the same bytes as loom_allreduce of the same input, every rank a
 *      contributor.
 *   3. The slowest rank left out: rank n-1 sleeps 100 ms before a call
 *      with quorum n-1 (SUM, then AVG, in place): every rank gets the sum
 *      (the mean: / (n-1)) of ranks 0..n-2's data, contributors all but
 *      n-1, and rank n-1 sees its own flag 0.  Then, after a barrier,
 *      rank 1 is the slow one: rank n-1 rejoins (its data is in).  Then
 *      rank 0, which decides, is the slow one and is left out.
 *   4. Late contributions dropped by rule: K calls in a row with rank n-1
 *      sleeping before each (its data differs per call), then a call with
 *      quorum n: its result is exactly that call's sum over every rank.
 *   5. Mismatched calls: rank n-1 passes LOOM_MAX where the others pass
 *      LOOM_SUM (quorum n): every rank fails with LOOM_ERR_MISMATCH, and
 *      the next call works.
 *   After 2-5, every rank's result and contributors are allgathered and
 *   compared: the same bytes and the same list everywhere.
 *   mp_quorum absent
 *       Rank n-1 never makes the call (it waits 3 s, then destroys);
 *       the others call with quorum n: rank 0 fails with
 *       LOOM_ERR_TIMEOUT after LOOM_TIMEOUT (the script sets 2 s), the
 *       others with an error too, all within 10 s, and every rank's
 *       loom_comm_destroy returns.
 *   mp_quorum idle
 *       A call that leaves rank n-1 out (it sleeps 100 ms), then every
 *       rank idles 1.5 s, past LOOM_TIMEOUT (the script sets 1 s), with
 *       rank 0's receive of the late contribution still posted: the next
 *       calls (quorum n, then loom_allreduce) must succeed.
 * Exit 0 only when every check held.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loom.h"
#include "check.h"

static int rank, nranks, failures;
static loom_comm_t comm;

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Small integer v (1..8) as one element of dtype t at b[i]. */
static void put_int(void *b, size_t i, loom_datatype_t t, int v)
{
    switch (t) {
    case LOOM_INT8: ((int8_t *)b)[i] = (int8_t)v; break;
    case LOOM_UINT8: ((uint8_t *)b)[i] = (uint8_t)v; break;
    case LOOM_INT32: ((int32_t *)b)[i] = v; break;
    case LOOM_UINT32: ((uint32_t *)b)[i] = (uint32_t)v; break;
    case LOOM_INT64: ((int64_t *)b)[i] = v; break;
    case LOOM_UINT64: ((uint64_t *)b)[i] = (uint64_t)v; break;
    case LOOM_FLOAT32: ((float *)b)[i] = (float)v; break;
    case LOOM_FLOAT64: ((double *)b)[i] = v; break;
    case LOOM_BFLOAT16: {
        float f = (float)v;
        uint32_t u;
        memcpy(&u, &f, 4);
        ((uint16_t *)b)[i] = (uint16_t)(u >> 16);
        break;
    }
    case LOOM_FLOAT16: {
        int e = 0;
        while ((2 << e) <= v) e++;
        ((uint16_t *)b)[i] = (uint16_t)((e + 15) << 10 | ((v - (1 << e)) << (10 - e)));
        break;
    }
    default: break;
    }
}

/* Every rank's n bytes at b the same (allgathered and compared). */
static void same_everywhere(const void *b, size_t n, const char *what)
{
    unsigned char *all = malloc(n * (size_t)nranks);
    loom_result_t r = loom_allgather(b, all, n, LOOM_UINT8, comm);
    CHECK(r == LOOM_SUCCESS, "allgather of %s: %s", what, loom_get_last_error());
    for (int p = 1; r == LOOM_SUCCESS && p < nranks; p++)
        CHECK(!memcmp(all, all + (size_t)p * n, n), "%s differs between rank 0 and rank %d", what,
              p);
    free(all);
}

static void refused(void)
{
    double x[4] = {0}, y[4];
    int flags[64], nc;
    struct {
        int quorum, dtype, op;
        const void *s;
        void *d;
        const char *word;
    } bad[] = {
        {0, LOOM_FLOAT64, LOOM_SUM, x, y, "quorum 0"},
        {nranks + 1, LOOM_FLOAT64, LOOM_SUM, x, y, "quorum"},
        {-1, LOOM_FLOAT64, LOOM_SUM, x, y, "quorum -1"},
        {nranks, 99, LOOM_SUM, x, y, "dtype 99"},
        {nranks, LOOM_FLOAT64, 42, x, y, "op 42"},
        {nranks, LOOM_FLOAT64, LOOM_SUM, NULL, y, "sendbuf"},
        {nranks, LOOM_FLOAT64, LOOM_SUM, x, NULL, "recvbuf"},
        {nranks, LOOM_FLOAT64, LOOM_SUM, x, x + 1, "overlap"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        loom_result_t r = loom_allreduce_quorum(bad[i].s, bad[i].d, 2, (loom_datatype_t)bad[i].dtype,
                                                (loom_op_t)bad[i].op, bad[i].quorum, comm, flags,
                                                &nc);
        CHECK(r == LOOM_ERR_INVALID_ARGUMENT && strstr(loom_get_last_error(), bad[i].word) &&
                  strstr(loom_get_last_error(), "loom_allreduce_quorum"),
              "case %zu: got %s, '%s', expected a refusal naming '%s'", i, loom_strerror(r),
              loom_get_last_error(), bad[i].word);
    }
    loom_group_start();
    loom_result_t r = loom_allreduce_quorum(x, y, 2, LOOM_FLOAT64, LOOM_SUM, nranks, comm, NULL,
                                            NULL);
    loom_group_end();
    CHECK(r == LOOM_ERR_INVALID_USAGE && strstr(loom_get_last_error(), "loom_group_start"),
          "in a group: got %s, '%s'", loom_strerror(r), loom_get_last_error());
}

static void every_type(void)
{
    enum { N = 37 };
    int checked = 0;
    for (int t = 0; t < LOOM_NUM_DATATYPES; t++)
        for (int op = 0; op < LOOM_NUM_OPS; op++) {
            const size_t es = loom_datatype_size((loom_datatype_t)t);
            unsigned char *in = malloc(N * es), *a = malloc(N * es), *b = malloc(N * es);
            for (size_t i = 0; i < N; i++)
                put_int(in, i, (loom_datatype_t)t,
                        op == LOOM_PROD ? 1 + (int)((i + (size_t)rank) % 2)
                                        : 1 + (int)((i * 3 + (size_t)rank * 5) % 7));
            memset(a, 0x5a, N * es);
            memset(b, 0xa5, N * es);
            loom_result_t r1 = loom_allreduce(in, a, N, (loom_datatype_t)t, (loom_op_t)op, comm);
            int flags[64], nc = -1;
            loom_result_t r2 = loom_allreduce_quorum(in, b, N, (loom_datatype_t)t, (loom_op_t)op,
                                                     nranks, comm, flags, &nc);
            CHECK(r1 == LOOM_SUCCESS && r2 == LOOM_SUCCESS, "dtype %d op %d: %s / %s: %s", t, op,
                  loom_strerror(r1), loom_strerror(r2), loom_get_last_error());
            CHECK(!memcmp(a, b, N * es), "dtype %d op %d: quorum n differs from loom_allreduce",
                  t, op);
            CHECK(nc == nranks, "dtype %d op %d: %d contributors of %d", t, op, nc, nranks);
            for (int p = 0; p < nranks; p++) CHECK(flags[p] == 1, "rank %d not a contributor", p);
            same_everywhere(b, N * es, "the quorum result");
            checked++;
            free(in), free(a), free(b);
        }
    if (rank == 0) printf("every dtype x op: %d pairs equal to loom_allreduce\n", checked);
}

/* One call with quorum n-1 where rank `slow` sleeps 100 ms first;
 * element i of rank r's data is 10 r + i + 1 + 100 call. */
static void slow_call(int slow, loom_op_t op, int call)
{
    enum { N = 1000 };
    double *x = malloc(N * sizeof *x);
    for (int i = 0; i < N; i++) x[i] = 10.0 * rank + i + 1 + 100.0 * call;
    int flags[64], nc = -1;
    if (rank == slow) sleep_ms(100);
    loom_result_t r =
        loom_allreduce_quorum(x, x, N, LOOM_FLOAT64, op, nranks - 1, comm, flags, &nc);
    CHECK(r == LOOM_SUCCESS, "slow rank %d: %s: %s", slow, loom_strerror(r),
          loom_get_last_error());
    CHECK(nc == nranks - 1, "slow rank %d: %d contributors, expected %d", slow, nc, nranks - 1);
    for (int p = 0; p < nranks; p++)
        CHECK(flags[p] == (p != slow), "slow rank %d: rank %d's flag is %d", slow, p, flags[p]);
    if (rank == slow)
        CHECK(flags[rank] == 0, "the slow rank %d was not told it was left out", rank);
    int bad = 0;
    for (int i = 0; i < N; i++) {
        double want = 0;
        for (int p = 0; p < nranks; p++)
            if (p != slow) want += 10.0 * p + i + 1 + 100.0 * call;
        if (op == LOOM_AVG) want /= nranks - 1;
        bad += x[i] != want;
    }
    CHECK(!bad, "slow rank %d, op %d: %d elements wrong (x[0] = %g)", slow, (int)op, bad, x[0]);
    same_everywhere(x, N * sizeof *x, "the result of a call with a slow rank");
    same_everywhere(flags, (size_t)nranks * sizeof *flags, "the contributors");
    if (rank == 0)
        printf("slow rank %d, %s: left out by all, result of the other %d ranks\n", slow,
               op == LOOM_AVG ? "AVG" : "SUM", nranks - 1);
    loom_barrier(comm);
    free(x);
}

static void late_dropped(int K)
{
    enum { N = 64 };
    int64_t x[N];
    int flags[64], nc;
    int left_out = 0;
    for (int k = 0; k <= K; k++) {
        for (int i = 0; i < N; i++) x[i] = (int64_t)rank * 1000 + i + (int64_t)k * 1000000;
        if (rank == nranks - 1 && k < K) sleep_ms(100);
        loom_result_t r = loom_allreduce_quorum(x, x, N, LOOM_INT64, LOOM_SUM,
                                                k < K ? nranks - 1 : nranks, comm, flags, &nc);
        CHECK(r == LOOM_SUCCESS, "late call %d: %s: %s", k, loom_strerror(r),
              loom_get_last_error());
        if (k < K) left_out += !flags[nranks - 1];
        if (k < K) continue;
        CHECK(nc == nranks, "the last call had %d contributors", nc);
        int bad = 0;
        for (int i = 0; i < N; i++) {
            int64_t want = 0;
            for (int p = 0; p < nranks; p++) want += (int64_t)p * 1000 + i + (int64_t)k * 1000000;
            bad += x[i] != want;
        }
        CHECK(!bad, "after %d late calls, the full call's result is wrong in %d elements", K, bad);
        same_everywhere(x, sizeof x, "the full call's result");
    }
    CHECK(left_out == K, "rank %d left out of %d of %d calls it was late for", nranks - 1,
          left_out, K);
    if (rank == 0) printf("late contributions: %d dropped, the next full call exact\n", K);
}

static void mismatch(void)
{
    double x[8], y[8];
    for (int i = 0; i < 8; i++) x[i] = rank + i;
    int flags[64], nc;
    loom_result_t r = loom_allreduce_quorum(x, y, 8, LOOM_FLOAT64,
                                            rank == nranks - 1 ? LOOM_MAX : LOOM_SUM, nranks, comm,
                                            flags, &nc);
    CHECK(r == LOOM_ERR_MISMATCH, "mismatched op: got %s: %s", loom_strerror(r),
          loom_get_last_error());
    if (rank == 0)
        CHECK(strstr(loom_get_last_error(), "op") != NULL, "rank 0's error names no op: %s",
              loom_get_last_error());
    if (rank == 0) printf("mismatched op: %s\n", loom_get_last_error());
    r = loom_allreduce_quorum(x, y, 8, LOOM_FLOAT64, LOOM_SUM, nranks, comm, flags, &nc);
    CHECK(r == LOOM_SUCCESS, "the call after a mismatch: %s: %s", loom_strerror(r),
          loom_get_last_error());
}

static void absent(void)
{
    double x[4] = {1, 2, 3, 4};
    if (rank == nranks - 1) {
        sleep_ms(3000);
        return;
    }
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    loom_result_t r = loom_allreduce_quorum(x, x, 4, LOOM_FLOAT64, LOOM_SUM, nranks, comm, NULL,
                                            NULL);
    clock_gettime(CLOCK_MONOTONIC, &b);
    const double s = (double)(b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9;
    CHECK(r != LOOM_SUCCESS, "a call with an absent rank succeeded");
    if (rank == 0)
        CHECK(r == LOOM_ERR_TIMEOUT, "rank 0: %s, expected LOOM_ERR_TIMEOUT: %s",
              loom_strerror(r), loom_get_last_error());
    CHECK(s < 10, "the call took %.1f s to fail", s);
    printf("absent rank: rank %d failed after %.1f s: %s\n", rank, s, loom_strerror(r));
}

static void idle(void)
{
    double x[4] = {1, 2, 3, 4};
    int flags[64], nc;
    if (rank == nranks - 1) sleep_ms(100);
    loom_result_t r = loom_allreduce_quorum(x, x, 4, LOOM_FLOAT64, LOOM_SUM, nranks - 1, comm,
                                            flags, &nc);
    CHECK(r == LOOM_SUCCESS && !flags[nranks - 1], "the call leaving rank %d out: %s: %s",
          nranks - 1, loom_strerror(r), loom_get_last_error());
    sleep_ms(1500);
    r = loom_allreduce_quorum(x, x, 4, LOOM_FLOAT64, LOOM_SUM, nranks, comm, flags, &nc);
    CHECK(r == LOOM_SUCCESS && nc == nranks, "the call after idling: %s: %s", loom_strerror(r),
          loom_get_last_error());
    r = loom_allreduce(x, x, 4, LOOM_FLOAT64, LOOM_SUM, comm);
    CHECK(r == LOOM_SUCCESS, "loom_allreduce after idling: %s: %s", loom_strerror(r),
          loom_get_last_error());
    if (rank == 0) printf("idle past LOOM_TIMEOUT with a late contribution pending: ok\n");
}

int main(int argc, char **argv)
{
    const int all = argc > 1 && !strcmp(argv[1], "all");
    if (argc < 2 || (!all && strcmp(argv[1], "absent") && strcmp(argv[1], "idle"))) {
        fprintf(stderr, "usage: mp_quorum all|absent|idle\n");
        return 2;
    }
    mp_join(&comm, &rank, &nranks);
    if (nranks < 3 || nranks > 64) {
        fprintf(stderr, "mp_quorum needs 3 to 64 ranks\n");
        return 2;
    }
    if (!all) {
        if (!strcmp(argv[1], "idle")) idle();
        else absent();
        loom_result_t r = loom_comm_destroy(comm);
        CHECK(r == LOOM_SUCCESS, "destroy: %s: %s", loom_strerror(r), loom_get_last_error());
        return failures ? 1 : 0;
    }
    refused();
    every_type();
    slow_call(nranks - 1, LOOM_SUM, 0);
    slow_call(nranks - 1, LOOM_AVG, 1);
    slow_call(1, LOOM_SUM, 2); /* rank n-1 rejoins */
    slow_call(0, LOOM_AVG, 3); /* the deciding rank left out */
    late_dropped(5);
    mismatch();
    loom_result_t r = loom_comm_destroy(comm);
    CHECK(r == LOOM_SUCCESS, "destroy: %s: %s", loom_strerror(r), loom_get_last_error());
    return failures ? 1 : 0;
}
