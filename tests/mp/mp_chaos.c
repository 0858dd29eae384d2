/*
 * mp_chaos.c - one process of the chaos test (test_chaos.sh drives it).
 *
 * usage: mp_chaos member|join DIR
 * Members start from the launcher's environment; "join" processes enter
 * the running job with loom_comm_join.  Every process loops steps:
 *   - an allreduce of 64K floats whose exact sum it knows (every rank
 *     adds step + i % 13, so the sum is size * (step + i % 13)), checked
 *     element by element;
 *   - a check that every rank ends the step with the same bytes (the
 *     XXH-like digest of the result, min and max over the ranks agree);
 *   - every 8 steps, whether processes wait to join (allreduce of
 *     loom_comm_pending_joins), then loom_comm_grow and loom_state_sync
 *     of the shared state (a 1 MiB tensor and the step counter).
 * When an operation fails, the survivors shrink and redo the step.
 * Progress goes to DIR/progress.PID ("step time_ms") after every step,
 * so the driver can tell a hang; DIR/stop makes everyone stop at the
 * same step.  At the end each process prints
 *   "SUMMARY pid=P steps=S shrinks=K grows=G wrong=W diverged=D"
 * to DIR/summary.PID.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "loom.h"

#define COUNT (64 * 1024)
#define STATE_BYTES (1u << 20)

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static uint64_t digest(const float *x, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    const unsigned char *b = (const unsigned char *)x;
    for (size_t i = 0; i < n * sizeof *x; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static const char *dir;
static int stopping(void)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/stop", dir);
    return access(p, F_OK) == 0;
}

static void progress(uint64_t step)
{
    char p[2048], t[2100];
    snprintf(p, sizeof p, "%s/progress.%d", dir, (int)getpid());
    snprintf(t, sizeof t, "%s.tmp", p);
    FILE *f = fopen(t, "w");
    if (!f) return;
    fprintf(f, "%llu %.0f\n", (unsigned long long)step, now_ms());
    fclose(f);
    rename(t, p);
}

int main(int argc, char **argv)
{
    if (argc < 3) return 2;
    dir = argv[2];
    int joined = !strcmp(argv[1], "join");
    loom_comm_t comm;
    loom_result_t r = joined ? loom_comm_join(&comm, NULL) : loom_comm_init_env(&comm, NULL);
    if (r != LOOM_SUCCESS) {
        fprintf(stderr, "%s: %s\n", joined ? "join" : "init", loom_get_last_error());
        return 2;
    }
    unsigned char *state = calloc(1, STATE_BYTES);
    uint64_t step = 0, rev = 0;
    if (!joined) {
        for (size_t i = 0; i < STATE_BYTES; i++) state[i] = (unsigned char)(i * 7);
        rev = 1;
    }
    loom_tensor_t ts[2] = {{state, STATE_BYTES}, {&step, sizeof step}};
    float *x = malloc(COUNT * sizeof *x);
    long shrinks = 0, grows = 0, wrong = 0, diverged = 0;
    int synced = !joined;
    for (;;) {
        if (!synced) { /* a newcomer: take the state first */
            r = loom_state_sync(comm, ts, 2, &rev);
            if (r == LOOM_SUCCESS) synced = 1;
            goto check;
        }
        progress(step);
        int n;
        loom_comm_size(comm, &n);
        for (size_t i = 0; i < COUNT; i++) x[i] = (float)(step % 1000 + i % 13);
        r = loom_allreduce(x, x, COUNT, LOOM_FLOAT32, LOOM_SUM, comm);
        if (r != LOOM_SUCCESS) goto check;
        for (size_t i = 0; i < COUNT; i++)
            if (x[i] != (float)n * (float)(step % 1000 + i % 13)) {
                wrong++;
                break;
            }
        uint64_t d[2] = {digest(x, COUNT), 0};
        d[1] = d[0];
        uint64_t lo = d[0];
        r = loom_allreduce(&d[0], &d[0], 1, LOOM_UINT64, LOOM_MAX, comm);
        if (r == LOOM_SUCCESS) r = loom_allreduce(&d[1], &d[1], 1, LOOM_UINT64, LOOM_MIN, comm);
        if (r != LOOM_SUCCESS) goto check;
        if (d[0] != lo || d[1] != lo) diverged++;
        /* Stop together: the same step on every rank. */
        int stop = stopping();
        r = loom_allreduce(&stop, &stop, 1, LOOM_INT32, LOOM_MAX, comm);
        if (r != LOOM_SUCCESS) goto check;
        if (stop) break;
        step++;
        if (step % 8 == 0) {
            int pend = 0;
            loom_comm_pending_joins(comm, &pend);
            int all = pend > 0;
            r = loom_allreduce(&all, &all, 1, LOOM_INT32, LOOM_MAX, comm);
            if (r != LOOM_SUCCESS) goto check;
            if (all) {
                loom_comm_t big = NULL;
                r = loom_comm_grow(comm, &big);
                if (r != LOOM_SUCCESS) goto check;
                if (big) {
                    loom_comm_destroy(comm);
                    comm = big;
                    grows++;
                    r = loom_state_sync(comm, ts, 2, &rev);
                    if (r != LOOM_SUCCESS) goto check;
                }
            }
        }
        continue;
    check:
        if (r == LOOM_SUCCESS) continue;
        {
            loom_comm_t small = NULL;
            double t0 = now_ms();
            loom_result_t rs = loom_comm_shrink(comm, &small);
            if (rs != LOOM_SUCCESS) {
                fprintf(stderr, "pid %d: shrink failed after %.0f ms: %s (%s); leaving\n",
                        (int)getpid(), now_ms() - t0, loom_strerror(rs), loom_get_last_error());
                loom_comm_destroy(comm);
                return 3;
            }
            loom_comm_destroy(comm);
            comm = small;
            shrinks++;
            /* Whoever may have missed a grow's state takes it now. */
            r = loom_state_sync(comm, ts, 2, &rev);
            if (r == LOOM_SUCCESS) synced = 1;
        }
    }
    char p[4096];
    snprintf(p, sizeof p, "%s/summary.%d", dir, (int)getpid());
    FILE *f = fopen(p, "w");
    if (f) {
        fprintf(f, "SUMMARY pid=%d steps=%llu shrinks=%ld grows=%ld wrong=%ld diverged=%ld\n",
                (int)getpid(), (unsigned long long)step, shrinks, grows, wrong, diverged);
        fclose(f);
    }
    loom_comm_destroy(comm);
    free(x);
    free(state);
    return 0;
}
