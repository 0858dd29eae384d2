/*
 * mp_mismatch.c - one rank of the call-mismatch tests (test_mismatch.sh):
 * one rank, ODD, calls a collective otherwise than the others, and every
 * rank must fail with LOOM_ERR_MISMATCH at once, naming ODD and both
 * calls.
 *
 * usage: mp_mismatch CASE ODD [nb]
 *
 *   count1k, count100k, count1m   loom_allreduce of 1024, 102400 and
 *                1048576 floats (sum); ODD passes 1000, 100000, 1000000
 *   dtype        1024 elements, float32; ODD int32
 *   op           1024 floats, sum; ODD max
 *   root         loom_broadcast of 1024 floats from rank 0; ODD names
 *                itself the root
 *   bcast        loom_allreduce of 1024 floats; ODD calls
 *                loom_broadcast of 1024 floats from rank 0 instead
 *   window       loom_allreduce of 65536 floats whose buffers are in a
 *                loom_mem_alloc window; ODD passes 65472
 *   late         no mismatch: ODD enters each call 300 ms after the
 *                others (allreduces through each path, a broadcast, a
 *                barrier), and every call must succeed with the right
 *                result
 *   nb           (third argument) the allreduces are loom_iallreduce
 *                and loom_wait
 *
 * Every rank prints one line
 *     rank R: CASE: RESULT in MS ms: MESSAGE
 * (RESULT "success", "LOOM_ERR_MISMATCH", ...), where a call that succeeds
 * says whether its result was right; "in MS ms (in the barrier before)"
 * where the barrier that lines the ranks up failed (a rank still in it
 * when the others' mismatch broke the communicator).  A rank whose call succeeded makes
 * one loom_barrier more and prints a second line "rank R: CASE: then
 * barrier: RESULT in MS ms: MESSAGE" (a rank whose part completed before
 * the difference could be seen, as the root of a broadcast, fails there).
 * Exits 0 when the lines were printed; test_mismatch.sh judges them.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loom.h"
#include "check.h"

static int rank, nranks, odd, nb;
static loom_comm_t comm;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {}
}

static const char *rname(loom_result_t r)
{
    switch (r) {
    case LOOM_SUCCESS: return "success";
    case LOOM_ERR_MISMATCH: return "LOOM_ERR_MISMATCH";
    case LOOM_ERR_TIMEOUT: return "LOOM_ERR_TIMEOUT";
    case LOOM_ERR_REVOKED: return "LOOM_ERR_REVOKED";
    case LOOM_ERR_REMOTE: return "LOOM_ERR_REMOTE";
    default: return loom_strerror(r);
    }
}

static void report_note(const char *what, loom_result_t r, double ms, const char *note,
                        const char *ok)
{
    printf("rank %d: %s: %s in %.1f ms%s: %s\n", rank, what, rname(r), ms, note,
           r == LOOM_SUCCESS ? ok : loom_get_last_error());
    fflush(stdout);
}

static void report(const char *what, loom_result_t r, double ms, const char *ok)
{
    report_note(what, r, ms, "", ok);
}

static loom_result_t allreduce(const void *s, void *d, size_t n, loom_datatype_t t, loom_op_t op)
{
    if (!nb) return loom_allreduce(s, d, n, t, op, comm);
    loom_request_t req;
    loom_result_t r = loom_iallreduce(s, d, n, t, op, comm, &req);
    return r == LOOM_SUCCESS ? loom_wait(&req) : r;
}

/* An allreduce of floats, all ones: each element must come back nranks. */
static loom_result_t sum_case(size_t n, size_t n_odd, loom_datatype_t t, loom_datatype_t t_odd,
                              loom_op_t op, loom_op_t op_odd, const char **ok)
{
    int me = rank == odd;
    size_t cnt = me ? n_odd : n;
    float *a = calloc(cnt + 1, sizeof *a), *b = calloc(cnt + 1, sizeof *b);
    if (!a || !b) exit(2);
    for (size_t i = 0; i < cnt; i++) a[i] = 1.0f;
    loom_result_t r = allreduce(a, b, cnt, me ? t_odd : t, me ? op_odd : op);
    size_t wrong = 0;
    for (size_t i = 0; r == LOOM_SUCCESS && i < cnt; i++)
        if (b[i] != (op == LOOM_MAX ? 1.0f : (float)nranks)) wrong++;
    static char m[96];
    snprintf(m, sizeof m, "result %s (%zu of %zu elements wrong)", wrong ? "WRONG" : "right",
             wrong, cnt);
    *ok = m;
    free(a);
    free(b);
    return r;
}

static loom_result_t bcast(int root, size_t n, const char **ok)
{
    float *a = malloc(n * sizeof *a);
    if (!a) exit(2);
    for (size_t i = 0; i < n; i++) a[i] = (float)(rank + 1);
    loom_result_t r = loom_broadcast(a, a, n, LOOM_FLOAT32, root, comm);
    size_t wrong = 0;
    for (size_t i = 0; r == LOOM_SUCCESS && i < n; i++)
        if (a[i] != 1.0f) wrong++; /* rank 0's data, the majority's root */
    static char m[96];
    snprintf(m, sizeof m, "result %s (%zu of %zu elements wrong)", wrong ? "WRONG" : "right",
             wrong, n);
    *ok = m;
    free(a);
    return r;
}

static loom_result_t window_case(const char **ok)
{
    const size_t n = 65536, n_odd = 65472;
    float *w = NULL;
    loom_result_t r = loom_mem_alloc(comm, 2 * n * sizeof *w, (void **)&w);
    if (r != LOOM_SUCCESS) {
        fprintf(stderr, "rank %d: loom_mem_alloc: %s\n", rank, loom_get_last_error());
        exit(2);
    }
    size_t cnt = rank == odd ? n_odd : n;
    for (size_t i = 0; i < cnt; i++) w[i] = 1.0f;
    r = allreduce(w, w + n, cnt, LOOM_FLOAT32, LOOM_SUM);
    size_t wrong = 0;
    for (size_t i = 0; r == LOOM_SUCCESS && i < cnt; i++)
        if (w[n + i] != (float)nranks) wrong++;
    static char m[96];
    snprintf(m, sizeof m, "result %s (%zu of %zu elements wrong)", wrong ? "WRONG" : "right",
             wrong, cnt);
    *ok = m;
    return r; /* the window goes with the communicator */
}

/* No mismatch: ODD comes 300 ms late to every call, and nothing may fail. */
static int late_case(void)
{
    const size_t sizes[] = {1024, 102400, 1048576};
    int bad = 0;
    for (int k = 0; k < 5; k++) {
        if (rank == odd) sleep_ms(300);
        const char *ok = "";
        double t0 = now_ms();
        loom_result_t r;
        char what[64];
        if (k < 3) {
            r = sum_case(sizes[k], sizes[k], LOOM_FLOAT32, LOOM_FLOAT32, LOOM_SUM, LOOM_SUM, &ok);
            snprintf(what, sizeof what, "late: allreduce %zu", sizes[k]);
        } else if (k == 3) {
            int saved = odd;
            odd = -1;
            r = bcast(0, 1024, &ok);
            odd = saved;
            snprintf(what, sizeof what, "late: broadcast");
        } else {
            r = loom_barrier(comm);
            snprintf(what, sizeof what, "late: barrier");
        }
        report(what, r, now_ms() - t0, ok);
        if (r != LOOM_SUCCESS || strstr(ok, "WRONG")) bad = 1;
    }
    return bad;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: mp_mismatch CASE ODD [nb]\n");
        return 2;
    }
    mp_join(&comm, &rank, &nranks);
    const char *c = argv[1];
    odd = atoi(argv[2]);
    nb = argc > 3 && !strcmp(argv[3], "nb");
    /* Start together, so that the time measured is the call's.  A rank
     * still completing the barrier when the others' mismatch breaks the
     * communicator fails there (the same failure, a call earlier). */
    double t0 = now_ms();
    loom_result_t r = loom_barrier(comm);
    if (r != LOOM_SUCCESS) {
        report_note(c, r, now_ms() - t0, " (in the barrier before)", "");
        loom_comm_destroy(comm);
        return strcmp(c, "late") ? 0 : 1;
    }
    if (!strcmp(c, "late")) {
        int bad = late_case();
        loom_comm_destroy(comm);
        return bad;
    }
    const char *ok = "";
    t0 = now_ms();
    if (!strcmp(c, "count1k"))
        r = sum_case(1024, 1000, LOOM_FLOAT32, LOOM_FLOAT32, LOOM_SUM, LOOM_SUM, &ok);
    else if (!strcmp(c, "count100k"))
        r = sum_case(102400, 100000, LOOM_FLOAT32, LOOM_FLOAT32, LOOM_SUM, LOOM_SUM, &ok);
    else if (!strcmp(c, "count1m"))
        r = sum_case(1048576, 1000000, LOOM_FLOAT32, LOOM_FLOAT32, LOOM_SUM, LOOM_SUM, &ok);
    else if (!strcmp(c, "dtype"))
        r = sum_case(1024, 1024, LOOM_FLOAT32, LOOM_INT32, LOOM_SUM, LOOM_SUM, &ok);
    else if (!strcmp(c, "op"))
        r = sum_case(1024, 1024, LOOM_FLOAT32, LOOM_FLOAT32, LOOM_SUM, LOOM_MAX, &ok);
    else if (!strcmp(c, "root"))
        r = bcast(rank == odd ? odd : 0, 1024, &ok);
    else if (!strcmp(c, "bcast"))
        r = rank == odd ? bcast(0, 1024, &ok)
                        : sum_case(1024, 1024, LOOM_FLOAT32, LOOM_FLOAT32, LOOM_SUM, LOOM_SUM, &ok);
    else if (!strcmp(c, "window"))
        r = window_case(&ok);
    else {
        fprintf(stderr, "mp_mismatch: unknown case %s\n", c);
        return 2;
    }
    report(c, r, now_ms() - t0, ok);
    if (r == LOOM_SUCCESS) {
        char what[64];
        snprintf(what, sizeof what, "%s: then barrier", c);
        t0 = now_ms();
        r = loom_barrier(comm);
        report(what, r, now_ms() - t0, "");
    }
    loom_comm_destroy(comm);
    return 0;
}
