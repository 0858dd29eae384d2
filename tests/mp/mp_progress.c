/*
 * mp_progress.c - one rank of the background-collective tests
 * (test_progress.sh), run with and without LOOM_PROGRESS_THREAD.
 *
 * usage: mp_progress order     several iallreduces in flight, completed in
 *                              reverse order, by loom_wait_any (each index
 *                              exactly once), by loom_test in a shuffled
 *                              order and by loom_wait_all; results checked
 *        mp_progress sleep     (thread on) an iallreduce completes while the
 *                              caller only sleeps: the first loom_test after
 *                              the sleep reports it done; an idle
 *                              communicator costs no CPU
 *        mp_progress kill VICTIM
 *                              VICTIM SIGKILLs itself while a large
 *                              iallreduce is in flight; the others make no
 *                              Loom call for a while, then loom_wait must
 *                              return an error (with the thread on, the first
 *                              loom_test already reports it)
 *        mp_progress args      bad arguments to loom_wait_any / loom_wait_all
 * Prints "rank R: OK ..." on success, exits non-zero on failure.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "loom.h"
#include "check.h"

#define K 6

static int rank, nranks;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static double cpu_ms(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e3 +
           (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e3;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {}
}

#define FAIL(...)                                                                        \
    do {                                                                                 \
        fprintf(stderr, "rank %d: FAIL line %d: ", rank, __LINE__);                      \
        fprintf(stderr, __VA_ARGS__);                                                    \
        fprintf(stderr, " (last error: %s)\n", loom_get_last_error());                   \
        exit(1);                                                                         \
    } while (0)

/* K operations of different sizes (and one int32 one); buffers and checks. */
static const size_t counts[K] = {1, 1000, 1 << 20, 4099, 3 << 20, 7};
static float *in[K], *out[K];

static float val(int k, int r, size_t i) { return (float)((r + 1) * (k + 1) + (int)(i % 7)); }

static void fill(void)
{
    for (int k = 0; k < K; k++) {
        if (!in[k]) {
            in[k] = malloc(counts[k] * sizeof(float));
            out[k] = malloc(counts[k] * sizeof(float));
            if (!in[k] || !out[k]) FAIL("out of memory");
        }
        for (size_t i = 0; i < counts[k]; i++) in[k][i] = val(k, rank, i), out[k][i] = -1;
    }
}

static void start_all(loom_comm_t comm, loom_request_t *req)
{
    fill();
    for (int k = 0; k < K; k++) {
        /* Op 1 in place, the others out of place. */
        const void *src = k == 1 ? (const void *)out[k] : (const void *)in[k];
        if (k == 1) memcpy(out[k], in[k], counts[k] * sizeof(float));
        if (loom_iallreduce(src, out[k], counts[k], LOOM_FLOAT32, LOOM_SUM, comm, &req[k]) !=
            LOOM_SUCCESS)
            FAIL("iallreduce %d", k);
    }
}

static void check(int k)
{
    for (size_t i = 0; i < counts[k]; i++) {
        float want = 0;
        for (int r = 0; r < nranks; r++) want += val(k, r, i);
        if (out[k][i] != want) FAIL("op %d element %zu is %g, want %g", k, i, out[k][i], want);
    }
}

static void order(loom_comm_t comm)
{
    loom_request_t req[K];
    /* Reverse order. */
    start_all(comm, req);
    for (int k = K - 1; k >= 0; k--) {
        if (loom_wait(&req[k]) != LOOM_SUCCESS) FAIL("wait %d", k);
        if (req[k] != LOOM_REQUEST_NULL) FAIL("request %d not released", k);
        check(k);
    }
    /* wait_any: each index exactly once, then -1. */
    for (int round = 0; round < 3; round++) {
        start_all(comm, req);
        int seen[K] = {0};
        for (int j = 0; j < K; j++) {
            int idx = -2;
            if (loom_wait_any(req, K, &idx) != LOOM_SUCCESS) FAIL("wait_any");
            if (idx < 0 || idx >= K || seen[idx]) FAIL("wait_any returned index %d", idx);
            if (req[idx] != LOOM_REQUEST_NULL) FAIL("request %d not released", idx);
            seen[idx] = 1;
            check(idx);
        }
        int idx = 5;
        if (loom_wait_any(req, K, &idx) != LOOM_SUCCESS || idx != -1)
            FAIL("wait_any on all-NULL requests: index %d", idx);
    }
    /* loom_test in a shuffled order until all are done. */
    start_all(comm, req);
    unsigned seed = 12345;
    int left = K;
    double t0 = now_ms();
    while (left) {
        int k = (int)((seed = seed * 1103515245u + 12345u) >> 16) % K;
        if (req[k] == LOOM_REQUEST_NULL) continue;
        int done = 0;
        if (loom_test(&req[k], &done) != LOOM_SUCCESS) FAIL("test %d", k);
        if (done) {
            check(k);
            left--;
        }
        if (now_ms() - t0 > 60000) FAIL("loom_test: not done after 60 s");
    }
    /* wait_all, with NULL entries among the requests. */
    start_all(comm, req);
    loom_request_t all[K + 2];
    all[0] = LOOM_REQUEST_NULL;
    memcpy(all + 1, req, sizeof req);
    all[K + 1] = LOOM_REQUEST_NULL;
    if (loom_wait_all(all, K + 2) != LOOM_SUCCESS) FAIL("wait_all");
    for (int k = 0; k < K + 2; k++)
        if (all[k] != LOOM_REQUEST_NULL) FAIL("wait_all left request %d", k);
    for (int k = 0; k < K; k++) check(k);
    /* Blocking calls between non-blocking ones still work. */
    start_all(comm, req);
    float x = 1;
    if (loom_allreduce(&x, &x, 1, LOOM_FLOAT32, LOOM_SUM, comm) != LOOM_SUCCESS ||
        x != (float)nranks)
        FAIL("blocking allreduce among requests");
    if (loom_wait_all(req, K) != LOOM_SUCCESS) FAIL("wait_all");
    for (int k = 0; k < K; k++) check(k);
    printf("rank %d: OK order (reverse, wait_any x3, shuffled test, wait_all)\n", rank);
}

static void sleep_test(loom_comm_t comm)
{
    /* Idle: nothing in flight costs (almost) no CPU, thread or not. */
    double c0 = cpu_ms(), w0 = now_ms();
    sleep_ms(1000);
    double idle_cpu = cpu_ms() - c0, idle_wall = now_ms() - w0;
    if (idle_cpu > 0.05 * idle_wall)
        FAIL("idle for %.0f ms used %.1f ms of CPU", idle_wall, idle_cpu);
    for (int rep = 0; rep < 3; rep++) {
        loom_request_t req[K];
        start_all(comm, req);
        /* No Loom call at all: only the progress thread can finish them. */
        sleep_ms(3000);
        for (int k = 0; k < K; k++) {
            int done = 0;
            double t = now_ms();
            if (loom_test(&req[k], &done) != LOOM_SUCCESS) FAIL("test %d", k);
            if (!done) FAIL("op %d not done after 3 s of sleep (test took %.1f ms)", k,
                            now_ms() - t);
            check(k);
        }
    }
    printf("rank %d: OK sleep (ops completed while the caller slept; idle CPU %.1f ms in %.0f ms)\n",
           rank, idle_cpu, idle_wall);
}

static void kill_test(loom_comm_t comm, int victim, int thread)
{
    size_t count = 16u << 20;
    float *buf = malloc(count * sizeof *buf);
    if (!buf) FAIL("out of memory");
    for (size_t i = 0; i < count; i++) buf[i] = 1.0f;
    loom_request_t req;
    /* The victim may die before this rank starts: the control plane has
     * then told everyone, and the start itself fails; that is fine. */
    loom_result_t r0 = loom_iallreduce(buf, buf, count, LOOM_FLOAT32, LOOM_SUM, comm, &req);
    if (r0 != LOOM_SUCCESS && (rank == victim || r0 == LOOM_ERR_INVALID_ARGUMENT))
        FAIL("iallreduce");
    if (rank == victim) {
        sleep_ms(2); /* under way (in the background, or not at all) */
        raise(SIGKILL);
    }
    sleep_ms(3000);
    double t = now_ms();
    int done = 1;
    loom_result_t r = r0;
    if (r0 == LOOM_SUCCESS) {
        done = 0;
        r = loom_test(&req, &done);
        if (thread && !done) FAIL("the failure was not seen in the background in 3 s");
        if (!done) r = loom_wait(&req);
    }
    if (r == LOOM_SUCCESS) FAIL("the allreduce succeeded although rank %d was killed", victim);
    int failed = -2;
    loom_comm_get_error(comm, &failed);
    float x = 0;
    if (loom_allreduce(&x, &x, 1, LOOM_FLOAT32, LOOM_SUM, comm) != LOOM_ERR_REVOKED)
        FAIL("a broken communicator accepted an allreduce");
    printf("rank %d: OK kill (error %s after %.1f ms more, failed rank %d)\n", rank,
           loom_strerror(r), now_ms() - t, failed);
    loom_comm_abort(comm);
    free(buf);
    exit(0);
}

static void args_test(void)
{
    loom_request_t req[2] = {LOOM_REQUEST_NULL, LOOM_REQUEST_NULL};
    int idx = 3;
    if (loom_wait_any(req, 2, NULL) != LOOM_ERR_INVALID_ARGUMENT ||
        !strstr(loom_get_last_error(), "index"))
        FAIL("wait_any index NULL");
    if (loom_wait_any(NULL, 2, &idx) != LOOM_ERR_INVALID_ARGUMENT ||
        !strstr(loom_get_last_error(), "reqs") || idx != -1)
        FAIL("wait_any reqs NULL");
    if (loom_wait_any(req, -1, &idx) != LOOM_ERR_INVALID_ARGUMENT ||
        !strstr(loom_get_last_error(), "n -1"))
        FAIL("wait_any n negative");
    if (loom_wait_any(NULL, 0, &idx) != LOOM_SUCCESS || idx != -1) FAIL("wait_any n 0");
    if (loom_wait_all(NULL, 1) != LOOM_ERR_INVALID_ARGUMENT) FAIL("wait_all reqs NULL");
    if (loom_wait_all(req, -2) != LOOM_ERR_INVALID_ARGUMENT) FAIL("wait_all n negative");
    if (loom_wait_all(req, 2) != LOOM_SUCCESS) FAIL("wait_all all NULL");
    printf("rank %d: OK args\n", rank);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: mp_progress order|sleep|kill VICTIM|args\n");
        return 2;
    }
    const char *mode = argv[1];
    const char *pt = getenv("LOOM_PROGRESS_THREAD");
    int thread = pt && atoi(pt) == 1;
    loom_comm_t comm;
    mp_join(&comm, &rank, &nranks);
    if (!strcmp(mode, "order")) order(comm);
    else if (!strcmp(mode, "sleep")) sleep_test(comm);
    else if (!strcmp(mode, "kill")) kill_test(comm, argc > 2 ? atoi(argv[2]) : 1, thread);
    else if (!strcmp(mode, "args")) args_test();
    else FAIL("unknown mode %s", mode);
    if (loom_comm_destroy(comm) != LOOM_SUCCESS) FAIL("destroy");
    for (int k = 0; k < K; k++) free(in[k]), free(out[k]);
    return 0;
}
