/*
 * mp_allreduce.c - one rank of the multi-process allreduce test.
 *
 * Run under loomrun (or any launcher): every rank fills its buffers with
 * values whose reduction is exact in every datatype, runs allreduce
 * in place and out of place for many counts, datatypes and ops, and
 * compares every element with a reference computed locally.  Also checks
 * that the non-blocking form completes in any order and that a bad
 * argument leaves the buffers untouched.  Exit 0 only when all match.
 *
 * usage: mp_allreduce [quick]
 *        mp_allreduce forced SPEC0 SPEC COUNT [COUNT0]
 *
 * The second form forces loom_comm_set_algo(SPEC0) on rank 0 and SPEC on
 * the others, runs one allreduce of COUNT floats (COUNT0 on rank 0 if
 * given), and prints its result on every rank: ranks that disagree must
 * fail, not hang or corrupt.  Exit 0 when the call failed.  SPEC "skip":
 * those ranks make no call and leave after 4 s (the others must time
 * out).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loom.h"
#include "check.h"
#include "reduce/reduce.h"
#include "tests/elem.h"

static int rank, nranks, failures, cases;

/* A small integer per (rank, index, salt): exact in every type, and the
 * sum over up to 64 ranks stays exact in fp16/bf16 (|sum| <= 320). */
static int val(int r, size_t i, int op)
{
    int v = (int)((r * 7 + i * 3 + (size_t)op) % 11) - 5;
    if (op == LOOM_PROD) v = ((r + i) % 5 == 0) ? 2 : ((r + i) % 7 == 0 ? -1 : 1);
    return v;
}

static int is_unsigned(loom_datatype_t t) { return t == LOOM_UINT8 || t == LOOM_UINT32 || t == LOOM_UINT64; }

/* The expected element, computed exactly in double, then stored in the
 * type (unsigned values wrap as the type does). */
static double expect(size_t i, loom_datatype_t t, loom_op_t op)
{
    double acc = 0;
    for (int r = 0; r < nranks; r++) {
        double v = val(r, i, op);
        if (is_unsigned(t) && v < 0) v = 0; /* unsigned gets non-negative inputs */
        if (r == 0) acc = v;
        else if (op == LOOM_SUM || op == LOOM_AVG) acc += v;
        else if (op == LOOM_PROD) acc *= v;
        else if (op == LOOM_MAX) acc = v > acc ? v : acc;
        else acc = v < acc ? v : acc;
    }
    if (op == LOOM_AVG) {
        if (t == LOOM_FLOAT16 || t == LOOM_BFLOAT16 || t == LOOM_FLOAT32)
            acc = (double)((float)acc / (float)nranks);
        else if (t == LOOM_FLOAT64)
            acc = acc / nranks;
        else
            acc = (double)((long long)acc / nranks); /* C division truncates */
    }
    unsigned char tmp[8];
    put(tmp, 0, t, acc);
    return get(tmp, 0, t);
}

static void fill(void *buf, size_t count, loom_datatype_t t, loom_op_t op)
{
    for (size_t i = 0; i < count; i++) {
        double v = val(rank, i, op);
        if (is_unsigned(t) && v < 0) v = 0;
        put(buf, i, t, v);
    }
}

static void check(const char *what, const void *buf, size_t count, loom_datatype_t t,
                  loom_op_t op)
{
    size_t wrong = 0, first = 0;
    for (size_t i = 0; i < count; i++) {
        double e = expect(i, t, op), g = get(buf, i, t);
        if (!(e == g)) {
            if (!wrong) first = i;
            wrong++;
        }
    }
    cases++;
    if (wrong) {
        failures++;
        fprintf(stderr,
                "rank %d: %s count %zu %s: %zu wrong, first at %zu: got %g want %g\n",
                rank, what, count, loom_datatype_size(t) ? "" : "", wrong, first,
                get(buf, first, t), expect(first, t, op));
    }
}

static void run_case(size_t count, loom_datatype_t t, loom_op_t op, loom_comm_t comm)
{
    size_t es = loom_datatype_size(t);
    char what[64];
    unsigned char *send = malloc(count * es + 1), *recv = malloc(count * es + 1);
    fill(send, count, t, op);
    memset(recv, 0xa5, count * es + 1);
    loom_result_t r = loom_allreduce(send, recv, count, t, op, comm);
    snprintf(what, sizeof what, "out-of-place dtype %d op %d", (int)t, (int)op);
    if (r != LOOM_SUCCESS) {
        fprintf(stderr, "rank %d: %s count %zu: %s (%s)\n", rank, what, count, loom_strerror(r),
                loom_get_last_error());
        exit(3);
    }
    check(what, recv, count, t, op);
    if (recv[count * es] != 0xa5) {
        failures++;
        fprintf(stderr, "rank %d: %s wrote past the end of recvbuf\n", rank, what);
    }
    fill(recv, count, t, op);
    r = loom_allreduce(recv, recv, count, t, op, comm);
    snprintf(what, sizeof what, "in-place dtype %d op %d", (int)t, (int)op);
    if (r != LOOM_SUCCESS) {
        fprintf(stderr, "rank %d: %s count %zu: %s (%s)\n", rank, what, count, loom_strerror(r),
                loom_get_last_error());
        exit(3);
    }
    check(what, recv, count, t, op);
    free(send);
    free(recv);
}

/* Ranks that forced different algorithms: rank 0 SPEC0, the others SPEC.
 * SPEC "skip": those ranks make no call, and leave after 4 s. */
static int forced(loom_comm_t comm, const char *spec0, const char *spec, size_t count)
{
    const char *mine = rank == 0 ? spec0 : spec;
    if (!strcmp(mine, "skip")) {
        sleep(4);
        printf("rank %d (skip): no call\n", rank);
        loom_comm_destroy(comm);
        return 0;
    }
    loom_result_t r = loom_comm_set_algo(comm, mine);
    if (r != LOOM_SUCCESS) {
        fprintf(stderr, "rank %d: set_algo %s: %s\n", rank, mine, loom_get_last_error());
        return 2;
    }
    float *x = malloc(count * sizeof *x);
    for (size_t i = 0; i < count; i++) x[i] = (float)rank;
    r = loom_allreduce(x, x, count, LOOM_FLOAT32, LOOM_SUM, comm);
    printf("rank %d (%s): %s: %s\n", rank, mine, loom_strerror(r),
           r == LOOM_SUCCESS ? "" : loom_get_last_error());
    free(x);
    loom_comm_destroy(comm);
    return r == LOOM_SUCCESS;
}

int main(int argc, char **argv)
{
    int quick = argc > 1 && !strcmp(argv[1], "quick");
    loom_comm_t comm;
    loom_result_t r;
    mp_join(&comm, &rank, &nranks);
    if ((argc == 5 || argc == 6) && !strcmp(argv[1], "forced"))
        return forced(comm, argv[2], argv[3],
                      strtoul(argv[argc == 6 && rank == 0 ? 5 : 4], NULL, 10));
    size_t big = quick ? 100003 : 1048583; /* about a million, odd */
    size_t counts[] = {0, 1, 7, (size_t)nranks - 1, (size_t)nranks + 1, 4099, big};
    int ncounts = (int)(sizeof counts / sizeof counts[0]);
    for (int t = 0; t < LOOM_NUM_DATATYPES; t++)
        for (int c = 0; c < ncounts; c++)
            run_case(counts[c], (loom_datatype_t)t, LOOM_SUM, comm);
    for (int t = 0; t < LOOM_NUM_DATATYPES; t++)
        for (int op = 1; op < LOOM_NUM_OPS; op++)
            for (int c = 0; c < ncounts - (quick || (t != LOOM_FLOAT32 && t != LOOM_INT32)); c++)
                run_case(counts[c], (loom_datatype_t)t, (loom_op_t)op, comm);

    /* Non-blocking: several in flight, completed in reverse order. */
    enum { NREQ = 4 };
    size_t n = 5000;
    float *bufs[NREQ];
    loom_request_t req[NREQ];
    for (int k = 0; k < NREQ; k++) {
        bufs[k] = malloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++) bufs[k][i] = (float)(rank + k);
        r = loom_iallreduce(bufs[k], bufs[k], n, LOOM_FLOAT32, LOOM_SUM, comm, &req[k]);
        if (r != LOOM_SUCCESS) {
            fprintf(stderr, "rank %d: iallreduce: %s\n", rank, loom_get_last_error());
            return 3;
        }
    }
    /* Blocking small allreduces while those run: on one host these take
     * the arenas' slots, and must keep the others moving as they wait. */
    for (int k = 0; k < 20; k++) {
        float v[3] = {(float)rank, (float)k, 1.0f};
        r = loom_allreduce(v, v, 3, LOOM_FLOAT32, LOOM_SUM, comm);
        cases++;
        if (r != LOOM_SUCCESS || v[0] != (float)(nranks * (nranks - 1) / 2) ||
            v[1] != (float)(nranks * k) || v[2] != (float)nranks) {
            failures++;
            fprintf(stderr, "rank %d: small allreduce %d beside iallreduces: %s, got %g %g %g\n",
                    rank, k, loom_strerror(r), v[0], v[1], v[2]);
        }
    }
    for (int k = NREQ - 1; k >= 0; k--) {
        r = loom_wait(&req[k]);
        cases++;
        float want = (float)(nranks * (nranks - 1) / 2 + nranks * k);
        size_t bad = 0;
        for (size_t i = 0; i < n; i++) bad += bufs[k][i] != want;
        if (r != LOOM_SUCCESS || bad || req[k] != LOOM_REQUEST_NULL) {
            failures++;
            fprintf(stderr, "rank %d: iallreduce %d: %s, %zu wrong\n", rank, k, loom_strerror(r),
                    bad);
        }
        free(bufs[k]);
    }

    /* A bad argument is refused and nothing is touched. */
    float a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8};
    r = loom_allreduce(a, b, 4, (loom_datatype_t)42, LOOM_SUM, comm);
    cases++;
    if (r != LOOM_ERR_INVALID_ARGUMENT || b[0] != 5 || a[0] != 1 ||
        !strstr(loom_get_last_error(), "dtype")) {
        failures++;
        fprintf(stderr, "rank %d: bad dtype not refused cleanly (%d, %s)\n", rank, r,
                loom_get_last_error());
    }
    /* The communicator still works after an argument error. */
    run_case(33, LOOM_FLOAT32, LOOM_SUM, comm);

    r = loom_comm_destroy(comm);
    if (r != LOOM_SUCCESS) {
        fprintf(stderr, "rank %d: destroy: %s\n", rank, loom_get_last_error());
        failures++;
    }
    if (rank == 0 || failures)
        printf("rank %d of %d: %d cases, %d failed\n", rank, nranks, cases, failures);
    return failures ? 1 : 0;
}
