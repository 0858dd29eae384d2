/*
 * mp_sparse.c - one rank of the sparse collectives' test (test_sparse.sh).
 *
 *   mp_sparse correct
 *       For float32, float64, float16, bfloat16, int32 and int64, each op
 *       (sum, prod, max, min, avg), and both calls: every rank draws its
 *       pairs (unsorted, with duplicate indices inside a rank and indices
 *       shared across ranks), makes the dense vector they stand for (zero
 *       elsewhere, duplicates combined with op, in input order) and runs
 *       the dense loom_allreduce / loom_reduce_scatter on it as the
 *       reference; the sparse call must give the same values.  Cases:
 *       every rank empty, only rank 0 with pairs, 1% density, 10%, 60%
 *       (past the switch to dense), all indices colliding in 8 slots,
 *       sorted input with each index twice, sorted input without
 *       duplicates (the path that skips the sort).
 *       Then dense_count 0 and recvcount 0 with NULL buffers.
 *       Prints "cases N" on rank 0.
 *   mp_sparse badindex
 *       The last rank passes idx[3] = dense_count + 5: every rank must
 *       fail fast with LOOM_ERR_INVALID_ARGUMENT naming that rank, the
 *       position and the index, recvbuf untouched; then a good call works.
 *   mp_sparse mismatch
 *       Rank 1 passes dense_count + 1 (allgather), then recvcount + 1
 *       (reduce-scatter), then another dtype, then calls
 *       loom_sparse_reduce_scatter where the others call
 *       loom_sparse_allgather: every rank fails with LOOM_ERR_MISMATCH
 *       naming what differs and rank 1; after each a good call works.
 *   mp_sparse badarg
 *       Rank 0 passes val NULL with nnz 4, then an invalid op: rank 0
 *       fails naming val (op), every other rank fails naming rank 0, none
 *       waits; then a good call works.
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

static uint64_t rng_state;
static uint64_t rnd(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return rng_state >> 33;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* fp16 / bf16 <-> double, for small integers (exact) and for reading. */
static uint16_t to_half(double d)
{
    if (d == 0) return 0;
    uint16_t s = d < 0 ? 0x8000 : 0;
    if (d < 0) d = -d;
    int e = 0;
    while (d >= 2) d /= 2, e++;
    while (d < 1) d *= 2, e--;
    return (uint16_t)(s | (uint16_t)((e + 15) << 10) | (uint16_t)((d - 1) * 1024));
}
static double from_half(uint16_t h)
{
    int e = (h >> 10) & 31;
    double m = (h & 1023) / 1024.0;
    double v = e ? (1 + m) : m;
    e = e ? e - 15 : -14;
    while (e > 0) v *= 2, e--;
    while (e < 0) v /= 2, e++;
    return (h & 0x8000) ? -v : v;
}
static uint16_t to_bf16(double d)
{
    float f = (float)d;
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16); /* exact for the small integers used */
}
static double from_bf16(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void put(void *buf, size_t i, loom_datatype_t dt, double v)
{
    switch (dt) {
    case LOOM_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case LOOM_FLOAT64: ((double *)buf)[i] = v; break;
    case LOOM_FLOAT16: ((uint16_t *)buf)[i] = to_half(v); break;
    case LOOM_BFLOAT16: ((uint16_t *)buf)[i] = to_bf16(v); break;
    case LOOM_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
    default: ((int64_t *)buf)[i] = (int64_t)v; break;
    }
}
static double get(const void *buf, size_t i, loom_datatype_t dt)
{
    switch (dt) {
    case LOOM_FLOAT32: return ((const float *)buf)[i];
    case LOOM_FLOAT64: return ((const double *)buf)[i];
    case LOOM_FLOAT16: return from_half(((const uint16_t *)buf)[i]);
    case LOOM_BFLOAT16: return from_bf16(((const uint16_t *)buf)[i]);
    case LOOM_INT32: return ((const int32_t *)buf)[i];
    default: return (double)((const int64_t *)buf)[i];
    }
}

/* Equal values, or both NaN (0 * inf in a product of float16). */
static int same(double a, double b) { return a == b || (a != a && b != b); }

static double combine(double a, double b, loom_op_t op)
{
    switch (op) {
    case LOOM_PROD: return a * b;
    case LOOM_MAX: return a > b ? a : b;
    case LOOM_MIN: return a < b ? a : b;
    default: return a + b;
    }
}

static const loom_datatype_t dts[] = {LOOM_FLOAT32, LOOM_FLOAT64, LOOM_FLOAT16,
                                      LOOM_BFLOAT16, LOOM_INT32,   LOOM_INT64};
static const char *const dtn[] = {"float32", "float64", "float16", "bfloat16", "int32", "int64"};
static const char *const opn[] = {"sum", "prod", "max", "min", "avg"};

/* Case c's pairs on this rank: *nnz of them, of a vector of dense. */
static size_t draw(int c, size_t dense, uint64_t *idx, double *v, loom_op_t op)
{
    size_t nnz;
    switch (c) {
    case 0: nnz = 0; break;                                  /* all empty */
    case 1: nnz = rank == 0 ? dense / 20 : 0; break;          /* one rank */
    case 2: nnz = dense / 100 + 1; break;                     /* 1% */
    case 3: nnz = dense / 10; break;                          /* 10% */
    case 4: nnz = dense * 6 / 10; break;                      /* past the switch */
    case 5: nnz = 12 + (size_t)rank; break;                  /* 8 slots */
    default: nnz = dense / 20; break;                        /* sorted input */
    }
    for (size_t k = 0; k < nnz; k++) {
        if (c == 6) idx[k] = (k / 2) * 3; /* sorted, each index twice */
        else if (c == 7) idx[k] = k * 3 + (size_t)rank % 3; /* sorted, unique */
        else idx[k] = c == 5 ? (rnd() % 8) * (dense / 8) : rnd() % dense;
        if (op == LOOM_PROD) v[k] = (rnd() & 1 ? 1 : -1) * (rnd() & 1 ? 2 : 1);
        else v[k] = (double)(rnd() % 9) - 4;
    }
    /* duplicates inside this rank: a few repeated indices */
    if (nnz > 4 && c < 6) idx[nnz - 1] = idx[0], idx[nnz - 2] = idx[1];
    return nnz;
}

/* Nothing to reduce: dense_count 0 (recvbuf NULL), recvcount 0. */
static void empty_vectors(void)
{
    loom_result_t r = loom_sparse_allgather(NULL, NULL, 0, 0, LOOM_FLOAT32, LOOM_SUM, NULL, comm);
    CHECK(r == LOOM_SUCCESS, "dense_count 0: %s", loom_get_last_error());
    r = loom_sparse_reduce_scatter(NULL, NULL, 0, 0, LOOM_INT64, LOOM_MAX, NULL, comm);
    CHECK(r == LOOM_SUCCESS, "recvcount 0: %s", loom_get_last_error());
}

static int correct(void)
{
    const size_t block = 400, dense_ag = 1600;
    int cases = 0;
    for (int rs = 0; rs < 2; rs++) {
        const size_t dense = rs ? block * (size_t)nranks : dense_ag;
        uint64_t *idx = malloc(dense * sizeof *idx);
        double *v = malloc(dense * sizeof *v);
        char *val = malloc(dense * 8), *ref = malloc(dense * 8), *got = malloc(dense * 8);
        char *refrs = malloc(block * 8);
        unsigned char *set = malloc(dense);
        for (size_t t = 0; t < sizeof dts / sizeof *dts; t++)
            for (int op = 0; op < LOOM_NUM_OPS; op++)
                for (int c = 0; c < 8; c++) {
                    const loom_datatype_t dt = dts[t];
                    rng_state = (uint64_t)rank * 1000003u + (uint64_t)c * 7919u + t * 31u +
                                (uint64_t)op * 977u + (uint64_t)rs;
                    size_t nnz = draw(c, dense, idx, v, (loom_op_t)op);
                    /* the reference: this rank's dense vector, reduced densely */
                    memset(set, 0, dense);
                    double *dv = calloc(dense, sizeof *dv);
                    for (size_t k = 0; k < nnz; k++) {
                        dv[idx[k]] = set[idx[k]] ? combine(dv[idx[k]], v[k], (loom_op_t)op) : v[k];
                        set[idx[k]] = 1;
                        put(val, k, dt, v[k]);
                    }
                    for (size_t i = 0; i < dense; i++) put(ref, i, dt, dv[i]);
                    free(dv);
                    loom_result_t r;
                    const size_t out = rs ? block : dense;
                    if (rs)
                        r = loom_reduce_scatter(ref, refrs, block, dt, (loom_op_t)op, comm);
                    else
                        r = loom_allreduce(ref, ref, dense, dt, (loom_op_t)op, comm);
                    CHECK(r == LOOM_SUCCESS, "dense reference: %s", loom_get_last_error());
                    const char *rb = rs ? refrs : ref;
                    memset(got, 0x5a, dense * 8);
                    if (rs)
                        r = loom_sparse_reduce_scatter(idx, val, nnz, block, dt, (loom_op_t)op,
                                                       got, comm);
                    else
                        r = loom_sparse_allgather(idx, val, nnz, dense, dt, (loom_op_t)op, got,
                                                  comm);
                    CHECK(r == LOOM_SUCCESS, "%s %s %s case %d: %s", rs ? "rs" : "ag", dtn[t],
                          opn[op], c, loom_get_last_error());
                    int bad = 0;
                    for (size_t i = 0; i < out && r == LOOM_SUCCESS; i++)
                        if (!same(get(got, i, dt), get(rb, i, dt)) && bad++ < 3)
                            CHECK(0, "%s %s %s case %d nnz %zu: [%zu] = %g, dense gives %g",
                                  rs ? "rs" : "ag", dtn[t], opn[op], c, nnz, i, get(got, i, dt),
                                  get(rb, i, dt));
                    cases++;
                }
        free(idx), free(v), free(val), free(ref), free(got), free(set), free(refrs);
    }
    empty_vectors();
    if (rank == 0) printf("cases %d\n", cases);
    return 0;
}

/* A good call after a refused one: the communicator still works. */
static void good_after(const char *what)
{
    uint64_t idx[1] = {(uint64_t)rank};
    float v[1] = {1}, out[8];
    loom_result_t r = loom_sparse_allgather(idx, v, 1, 8, LOOM_FLOAT32, LOOM_SUM, out, comm);
    CHECK(r == LOOM_SUCCESS, "good call after %s: %s", what, loom_get_last_error());
    for (int i = 0; i < 8 && r == LOOM_SUCCESS; i++)
        CHECK(out[i] == (i < nranks ? 1.0f : 0.0f), "after %s: out[%d] = %g", what, i, out[i]);
}

static int badindex(void)
{
    const size_t dense = 100;
    uint64_t idx[6] = {1, 2, 3, 4, 5, 6};
    float v[6] = {1, 1, 1, 1, 1, 1}, out[100];
    if (rank == nranks - 1) idx[3] = dense + 5;
    for (int rs = 0; rs < 2; rs++) {
        for (size_t i = 0; i < dense; i++) out[i] = -7;
        double t0 = now_s();
        loom_result_t r =
            rs ? loom_sparse_reduce_scatter(idx, v, 6, dense / (size_t)nranks, LOOM_FLOAT32,
                                            LOOM_SUM, out, comm)
               : loom_sparse_allgather(idx, v, 6, dense, LOOM_FLOAT32, LOOM_SUM, out, comm);
        double dt = now_s() - t0;
        char want[128];
        snprintf(want, sizeof want, "rank %d's idx[3] = %zu is out of range", nranks - 1,
                 dense + 5);
        CHECK(r == LOOM_ERR_INVALID_ARGUMENT, "%s: bad index gave %d", rs ? "rs" : "ag", (int)r);
        CHECK(strstr(loom_get_last_error(), want) != NULL, "message '%s' lacks '%s'",
              loom_get_last_error(), want);
        CHECK(dt < 5, "bad index took %.1f s", dt);
        int touched = 0;
        for (size_t i = 0; i < dense; i++) touched |= out[i] != -7;
        CHECK(!touched, "recvbuf touched by a refused call");
        if (rank == 0 && !rs) printf("refused: %s (%.3f s)\n", loom_get_last_error(), dt);
        good_after("a bad index");
    }
    return 0;
}

static int mismatch(void)
{
    uint64_t idx[2] = {0, 5};
    float v[2] = {1, 2}, out[64];
    for (int rs = 0; rs < 2; rs++) {
        size_t n = rs ? 8 : 40;
        if (rank == 1) n++;
        loom_result_t r =
            rs ? loom_sparse_reduce_scatter(idx, v, 2, n, LOOM_FLOAT32, LOOM_SUM, out, comm)
               : loom_sparse_allgather(idx, v, 2, n, LOOM_FLOAT32, LOOM_SUM, out, comm);
        CHECK(r == LOOM_ERR_MISMATCH, "%s: mismatched dense_count gave %d (%s)", rs ? "rs" : "ag",
              (int)r, loom_get_last_error());
        CHECK(strstr(loom_get_last_error(), "dense_count") &&
                  strstr(loom_get_last_error(), "rank 1 passed"),
              "message '%s' names neither dense_count nor rank 1", loom_get_last_error());
        if (rank == 0 && !rs) printf("mismatch: %s\n", loom_get_last_error());
        good_after("a mismatch");
    }
    /* rank 1 passes another dtype; then the other call */
    for (int k = 0; k < 2; k++) {
        loom_result_t r;
        if (k == 0)
            r = loom_sparse_allgather(idx, v, 2, 40, rank == 1 ? LOOM_INT32 : LOOM_FLOAT32,
                                      LOOM_SUM, out, comm);
        else if (rank == 1)
            r = loom_sparse_reduce_scatter(idx, v, 2, 40 / (size_t)nranks, LOOM_FLOAT32, LOOM_SUM,
                                           out, comm);
        else
            r = loom_sparse_allgather(idx, v, 2, 40 / (size_t)nranks * (size_t)nranks,
                                      LOOM_FLOAT32, LOOM_SUM, out, comm);
        CHECK(r == LOOM_ERR_MISMATCH, "%s: gave %d (%s)", k ? "other call" : "other dtype", (int)r,
              loom_get_last_error());
        CHECK(strstr(loom_get_last_error(), k ? "disagree on the call" : "disagree on dtype") &&
                  strstr(loom_get_last_error(), "rank 1 passed"),
              "message '%s'", loom_get_last_error());
        good_after(k ? "another call" : "another dtype");
    }
    return 0;
}

static int badarg(void)
{
    uint64_t idx[4] = {0, 1, 2, 3};
    float v[4] = {1, 2, 3, 4}, out[16];
    for (int k = 0; k < 2; k++) {
        const void *vp = rank == 0 && k == 0 ? NULL : v;
        loom_op_t op = rank == 0 && k == 1 ? (loom_op_t)17 : LOOM_SUM;
        double t0 = now_s();
        loom_result_t r = loom_sparse_allgather(idx, vp, 4, 16, LOOM_FLOAT32, op, out, comm);
        double dt = now_s() - t0;
        CHECK(r == LOOM_ERR_INVALID_ARGUMENT, "bad argument gave %d", (int)r);
        const char *m = loom_get_last_error();
        if (rank == 0)
            CHECK(strstr(m, k == 0 ? "val is NULL" : "op 17"), "rank 0's message '%s'", m);
        else
            CHECK(strstr(m, "rank 0 refused"), "message '%s' does not name rank 0", m);
        CHECK(dt < 5, "bad argument took %.1f s", dt);
        if (rank == nranks - 1) printf("badarg %d: %s\n", k, m);
        good_after("a bad argument");
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: mp_sparse correct | badindex | mismatch | badarg\n");
        return 2;
    }
    mp_join(&comm, &rank, &nranks);
    int rc = 2;
    if (!strcmp(argv[1], "correct")) rc = correct();
    else if (!strcmp(argv[1], "badindex")) rc = badindex();
    else if (!strcmp(argv[1], "mismatch") && nranks > 1) rc = mismatch();
    else if (!strcmp(argv[1], "badarg") && nranks > 1) rc = badarg();
    loom_comm_destroy(comm);
    if (rc) return rc;
    return failures ? 1 : 0;
}
