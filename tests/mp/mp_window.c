/*
 * mp_window.c - one rank of the loom_mem_alloc window test (under
 * loomrun; test_window.sh forces the shared allreduce).
 *
 *   mp_window check
 *       argument errors of loom_mem_alloc / loom_mem_free, then
 *       allreduces whose buffers are in a window: out of place (SEND and
 *       RECV at different offsets), in place at an offset that is not a
 *       multiple of 64, for several datatypes, ops and counts (one
 *       element to several arena rounds), each element compared with the
 *       reference; the same calls on plain buffers in between, and the
 *       input of out-of-place calls unchanged; loom_mem_free refused while
 *       a non-blocking allreduce on the window is pending.  Exit 0 only
 *       when all match.
 *   mp_window mismatch | offsets [COUNT]
 *       an allreduce of COUNT floats (65536) where
 *       rank 0 passes plain buffers (mismatch) or buffers 64 bytes further
 *       into its window (offsets) than the others: every rank must fail,
 *       with LOOM_ERR_MISMATCH where it saw the difference itself or
 *       LOOM_ERR_REVOKED where another rank broke the communicator first
 *       (even in loom_mem_alloc's last step), and none may have written
 *       its buffers.  Each rank prints its error; test_window.sh wants
 *       the reason among them.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom.h"

static int rank, nranks, failures;
static loom_comm_t comm;

static void die(const char *what, loom_result_t r)
{
    fprintf(stderr, "rank %d: %s: %s (%s)\n", rank, what, loom_strerror(r), loom_get_last_error());
    exit(1);
}

static void fail(const char *fmt, const char *a, size_t n, size_t i, double got, double want)
{
    failures++;
    fprintf(stderr, "rank %d: FAIL %s: %s count %zu, [%zu] = %g, want %g\n", rank, fmt, a, n, i,
            got, want);
}

/* Small integers, exact in every type and sum. */
static int val(int r, size_t i) { return (int)((r * 7 + (int)(i % 13)) % 11) - 3; }

static double want(loom_op_t op, size_t i)
{
    double s = 0, mx = -1e9;
    for (int r = 0; r < nranks; r++) {
        s += val(r, i);
        if (val(r, i) > mx) mx = val(r, i);
    }
    return op == LOOM_MAX ? mx : op == LOOM_AVG ? s / nranks : s;
}

static void put(void *p, loom_datatype_t t, size_t i, double v)
{
    switch (t) {
    case LOOM_FLOAT32: ((float *)p)[i] = (float)v; break;
    case LOOM_FLOAT64: ((double *)p)[i] = v; break;
    case LOOM_INT32: ((int32_t *)p)[i] = (int32_t)v; break;
    default: ((int8_t *)p)[i] = (int8_t)v; break;
    }
}

static double get(const void *p, loom_datatype_t t, size_t i)
{
    switch (t) {
    case LOOM_FLOAT32: return ((const float *)p)[i];
    case LOOM_FLOAT64: return ((const double *)p)[i];
    case LOOM_INT32: return ((const int32_t *)p)[i];
    default: return ((const int8_t *)p)[i];
    }
}

static void fill(void *p, loom_datatype_t t, size_t n)
{
    for (size_t i = 0; i < n; i++) put(p, t, i, val(rank, i));
}

static void expect(const char *what, const void *p, loom_datatype_t t, loom_op_t op, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        double w = want(op, i), g = get(p, t, i);
        if (t == LOOM_FLOAT32 ? (float)g != (float)w : g != w) {
            fail("%s", what, n, i, g, w);
            return;
        }
    }
}

static void input_kept(const char *what, const void *p, loom_datatype_t t, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (get(p, t, i) != val(rank, i)) {
            fail("%s: input changed", what, n, i, get(p, t, i), val(rank, i));
            return;
        }
}

static void arg_errors(void)
{
    void *p = &p;
    loom_result_t r = loom_mem_alloc(comm, 4096, NULL);
    if (r != LOOM_ERR_INVALID_ARGUMENT || !strstr(loom_get_last_error(), "ptr"))
        fail("%s", "loom_mem_alloc(ptr NULL)", 0, 0, r, LOOM_ERR_INVALID_ARGUMENT);
    r = loom_mem_alloc(comm, 0, &p);
    if (r != LOOM_ERR_INVALID_ARGUMENT || p != NULL || !strstr(loom_get_last_error(), "bytes"))
        fail("%s", "loom_mem_alloc(bytes 0)", 0, 0, r, LOOM_ERR_INVALID_ARGUMENT);
    r = loom_mem_alloc(NULL, 4096, &p);
    if (r != LOOM_ERR_INVALID_ARGUMENT) fail("%s", "loom_mem_alloc(comm NULL)", 0, 0, r, 0);
    int x;
    r = loom_mem_free(comm, &x);
    if (r != LOOM_ERR_INVALID_ARGUMENT || !strstr(loom_get_last_error(), "ptr"))
        fail("%s", "loom_mem_free(not a window)", 0, 0, r, LOOM_ERR_INVALID_ARGUMENT);
    if (loom_mem_free(comm, NULL) != LOOM_SUCCESS) fail("%s", "loom_mem_free(NULL)", 0, 0, 1, 0);
}

static void check(void)
{
    arg_errors();
    const size_t counts[] = {1, 7, 1000, 65537, (1u << 20) + 3};
    const struct {
        loom_datatype_t t;
        loom_op_t op;
        size_t es;
        const char *name;
    } kinds[] = {{LOOM_FLOAT32, LOOM_SUM, 4, "float32 sum"},
                 {LOOM_FLOAT32, LOOM_AVG, 4, "float32 avg"},
                 {LOOM_INT32, LOOM_MAX, 4, "int32 max"},
                 {LOOM_FLOAT64, LOOM_SUM, 8, "float64 sum"},
                 {LOOM_INT8, LOOM_SUM, 1, "int8 sum"}};
    const size_t most = ((1u << 20) + 3) * 8;
    /* Out of place: SEND at 0, RECV after it; in place at 8 bytes in. */
    const size_t wbytes = 2 * most + 4096;
    unsigned char *w;
    loom_result_t r = loom_mem_alloc(comm, wbytes, (void **)&w);
    if (r != LOOM_SUCCESS) die("loom_mem_alloc", r);
    unsigned char *plain = malloc(2 * most);
    if (!plain) die("malloc", LOOM_ERR_NO_MEMORY);
    int runs = 0;
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
            const size_t n = counts[c];
            if (kinds[k].t == LOOM_INT8 && n > 100000) continue; /* sums stay small anyway */
            char what[96];
            unsigned char *send = w, *recv = w + most + 4096 - 64;
            fill(send, kinds[k].t, n);
            memset(recv, 0x5a, n * kinds[k].es);
            r = loom_allreduce(send, recv, n, kinds[k].t, kinds[k].op, comm);
            if (r != LOOM_SUCCESS) die("loom_allreduce (window)", r);
            snprintf(what, sizeof what, "window, out of place, %s", kinds[k].name);
            expect(what, recv, kinds[k].t, kinds[k].op, n);
            input_kept(what, send, kinds[k].t, n);

            unsigned char *io = w + 8;
            fill(io, kinds[k].t, n);
            r = loom_allreduce(io, io, n, kinds[k].t, kinds[k].op, comm);
            if (r != LOOM_SUCCESS) die("loom_allreduce (window, in place)", r);
            snprintf(what, sizeof what, "window, in place, %s", kinds[k].name);
            expect(what, io, kinds[k].t, kinds[k].op, n);

            /* The same on plain memory, between window calls. */
            fill(plain, kinds[k].t, n);
            r = loom_allreduce(plain, plain + most, n, kinds[k].t, kinds[k].op, comm);
            if (r != LOOM_SUCCESS) die("loom_allreduce (plain)", r);
            snprintf(what, sizeof what, "plain, %s", kinds[k].name);
            expect(what, plain + most, kinds[k].t, kinds[k].op, n);
            runs += 3;
        }
    }
    /* A second window, and the first freed: allocations stay in step. */
    void *w2;
    if ((r = loom_mem_alloc(comm, 1 << 20, &w2)) != LOOM_SUCCESS) die("loom_mem_alloc 2", r);
    /* Not while an operation on it is pending: its steps read the
     * mappings of the peers' windows. */
    loom_request_t rq;
    fill(w, LOOM_FLOAT32, 65537);
    r = loom_iallreduce(w, w + most + 4096 - 64, 65537, LOOM_FLOAT32, LOOM_SUM, comm, &rq);
    if (r != LOOM_SUCCESS) die("loom_iallreduce (window)", r);
    if ((r = loom_mem_free(comm, w)) != LOOM_ERR_INVALID_USAGE)
        fail("%s", "loom_mem_free with an operation pending", 0, 0, r, LOOM_ERR_INVALID_USAGE);
    if ((r = loom_wait(&rq)) != LOOM_SUCCESS) die("loom_wait (window)", r);
    expect("window, non-blocking", w + most + 4096 - 64, LOOM_FLOAT32, LOOM_SUM, 65537);
    if ((r = loom_mem_free(comm, w)) != LOOM_SUCCESS) die("loom_mem_free", r);
    if (loom_mem_free(comm, w) != LOOM_ERR_INVALID_ARGUMENT)
        fail("%s", "loom_mem_free twice", 0, 0, 0, LOOM_ERR_INVALID_ARGUMENT);
    fill(w2, LOOM_FLOAT32, 65536);
    r = loom_allreduce(w2, (float *)w2 + 65536, 65536, LOOM_FLOAT32, LOOM_SUM, comm);
    if (r != LOOM_SUCCESS) die("loom_allreduce (second window)", r);
    expect("second window", (float *)w2 + 65536, LOOM_FLOAT32, LOOM_SUM, 65536);
    runs++;
    free(plain);
    /* w2 is left for loom_comm_destroy. */
    if (rank == 0) printf("rank 0 of %d: %d allreduces checked\n", nranks, runs);
}

static void disagree(int offsets, size_t n)
{
    const size_t bytes = n * sizeof(float);
    unsigned char *w;
    loom_result_t r = loom_mem_alloc(comm, 2 * bytes + 128, (void **)&w);
    if (r == LOOM_ERR_REVOKED || r == LOOM_ERR_MISMATCH) {
        printf("rank %d: loom_mem_alloc: %s: %s\n", rank, loom_strerror(r), loom_get_last_error());
        return;
    }
    if (r != LOOM_SUCCESS) die("loom_mem_alloc", r);
    float *send = (float *)(void *)w, *recv = (float *)(void *)(w + bytes + 64);
    float *own = NULL;
    if (rank == 0) {
        if (offsets) {
            send = (float *)(void *)(w + 64);
        } else {
            own = malloc(2 * bytes);
            if (!own) die("malloc", LOOM_ERR_NO_MEMORY);
            send = own;
            recv = own + n;
        }
    }
    fill(send, LOOM_FLOAT32, n);
    for (size_t i = 0; i < n; i++) recv[i] = -1;
    r = loom_allreduce(send, recv, n, LOOM_FLOAT32, LOOM_SUM, comm);
    const char *e = loom_get_last_error();
    if (r != LOOM_ERR_MISMATCH && r != LOOM_ERR_REVOKED) {
        failures++;
        fprintf(stderr, "rank %d: FAIL %s: got %s (%s), want a mismatch\n", rank,
                offsets ? "offsets" : "mismatch", loom_strerror(r), e);
    }
    input_kept("after the mismatch", send, LOOM_FLOAT32, n);
    for (size_t i = 0; i < n; i++)
        if (recv[i] != -1) {
            fail("%s", "after the mismatch: RECV written", n, i, recv[i], -1);
            break;
        }
    printf("rank %d: loom_allreduce: %s: %s\n", rank, loom_strerror(r), e);
    free(own);
}

/* Rank 1 asks for another size than the others: every rank fails with
 * LOOM_ERR_MISMATCH, and those that see the sizes name them. */
static void sizes(void)
{
    void *w = NULL;
    loom_result_t r = loom_mem_alloc(comm, rank == 1 ? 8192 : 4096, &w);
    if (r != LOOM_ERR_MISMATCH) {
        failures++;
        fprintf(stderr, "rank %d: FAIL sizes: loom_mem_alloc got %s (%s), want %s\n", rank,
                loom_strerror(r), loom_get_last_error(), loom_strerror(LOOM_ERR_MISMATCH));
    }
    printf("rank %d: loom_mem_alloc: %s: %s\n", rank, loom_strerror(r), loom_get_last_error());
    if (r == LOOM_SUCCESS) loom_mem_free(comm, w);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "check";
    loom_result_t r;
    if ((r = loom_comm_init_env(&comm, NULL)) != LOOM_SUCCESS) die("init", r);
    loom_comm_rank(comm, &rank);
    loom_comm_size(comm, &nranks);
    if (!strcmp(mode, "check")) check();
    else if (!strcmp(mode, "sizes")) sizes();
    else if (!strcmp(mode, "mismatch") || !strcmp(mode, "offsets")) {
        long n = argc > 2 ? atol(argv[2]) : 1 << 16;
        if (n < 1) {
            fprintf(stderr, "mp_window: bad count %s\n", argv[2]);
            return 2;
        }
        disagree(!strcmp(mode, "offsets"), (size_t)n);
    } else {
        fprintf(stderr, "usage: mp_window check|sizes|mismatch|offsets [COUNT]\n");
        return 2;
    }
    loom_comm_destroy(comm);
    if (failures) fprintf(stderr, "rank %d: %d failure(s)\n", rank, failures);
    return failures ? 1 : 0;
}
