/*
 * mp_chaos.c - one process of the chaos test (test_chaos.sh drives it).
 *
 * usage: mp_chaos member|join DIR
 * Members start from the launcher's environment; "join" processes enter
 * the running job with loom_comm_join.  Every process loops steps:
 *   - an allreduce of 64K floats whose exact sum it knows (every rank
 *     adds step + i % 13, so the sum is size * (step + i % 13)), checked
 *     element by element;
 *   - an allreduce of 262,147 floats (just over 1 MiB) forced to the
 *     shared-memory algorithm, checked likewise;
 *   - a check that every rank ends the step with the same bytes (the
 *     FNV digest of both results, min and max over the ranks agree);
 *   - every 8 steps, whether processes wait to join (allreduce of
 *     loom_comm_pending_joins), then loom_comm_grow and loom_state_sync
 *     of the shared state (a 1 MiB tensor and the step counter).
 * Every step ends with loom_comm_agree on whether it succeeded on every
 * rank; if not, the survivors shrink, sync the state and the step's
 * number, and redo the step.
 *
 * The driver's other hooks: DIR/stop makes everyone stop at the same
 * step; a file DIR/die.PHASE (shrink, grow or sync) is taken (renamed) by
 * the first process that enters that call, which then SIGKILLs itself a
 * few milliseconds into it.  Progress goes to DIR/progress.PID
 * ("step time_ms rank size") after every step, so the driver can tell a
 * hang and find rank 0.
 *
 * What a process may end with (its exit status):
 *   0  stopped with the others at DIR/stop; DIR/summary.PID holds
 *      "SUMMARY pid=P steps=S shrinks=K grows=G wrong=W diverged=D"
 *   3  left: loom_comm_agree or loom_comm_shrink refused it with
 *      LOOM_ERR_REVOKED (the others declared it failed, or it is in no
 *      majority) or LOOM_ERR_TIMEOUT (the others may have gone on
 *      without it): loom_comm_agree(3), loom_comm_shrink(3); or a joiner's
 *      loom_comm_join failed with one of the results loom_comm_join(3)
 *      gives for a job it could not enter (LOOM_ERR_TIMEOUT,
 *      LOOM_ERR_CONNECT); the line "LEFT ..." on standard error says which
 *   4  a shrink gave it a communicator that is not a majority of the one
 *      it shrank from (more than half, or exactly half with the old rank
 *      0): "MINORITY ..." on standard error; the driver counts these as
 *      jobs of one
 *   1  a wrong result, ranks that disagree, or a result that the call's
 *      man page does not give: "BAD ..." on standard error
 * and it never dies of a signal the driver did not send; crash.h prints
 * the backtrace of one that does.
 */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "crash.h"
#include "loom.h"

#define COUNT (64 * 1024)
#define BIG 262147u
#define STATE_BYTES (1u << 20)

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static uint64_t digest(const float *x, size_t n, uint64_t h)
{
    const unsigned char *b = (const unsigned char *)x;
    for (size_t i = 0; i < n * sizeof *x; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static double t_start;
#define EVENT(...)                                                                    \
    do {                                                                              \
        fprintf(stderr, "t=%.0f pid %d: ", now_ms() - t_start, (int)getpid());        \
        fprintf(stderr, __VA_ARGS__);                                                 \
        fputc('\n', stderr);                                                          \
    } while (0)

static const char *dir;
static int stopping(void)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/stop", dir);
    return access(p, F_OK) == 0;
}

static void progress(uint64_t step, loom_comm_t comm)
{
    char p[2048], t[2100];
    int rank = -1, size = 0;
    loom_comm_rank(comm, &rank);
    loom_comm_size(comm, &size);
    snprintf(p, sizeof p, "%s/progress.%d", dir, (int)getpid());
    snprintf(t, sizeof t, "%s.tmp", p);
    FILE *f = fopen(t, "w");
    if (!f) return;
    /* The fifth field, this process's start time (/proc/self/stat's
     * 22nd), tells the driver a later process that got the same pid
     * (pids wrap within a long run) from this one. */
    static char started[32];
    if (!started[0]) {
        FILE *st = fopen("/proc/self/stat", "r");
        char line[1024] = "";
        if (st && fgets(line, sizeof line, st)) {
            const char *q = strrchr(line, ')');
            for (int k = 2; q && k < 22; k++) q = strchr(q + 1, ' ');
            if (q) sscanf(q + 1, "%31s", started);
        }
        if (st) fclose(st);
        if (!started[0]) snprintf(started, sizeof started, "0");
    }
    fprintf(f, "%llu %.0f %d %d %s\n", (unsigned long long)step, now_ms(), rank, size, started);
    fclose(f);
    rename(t, p);
}

static void *die_later(void *arg)
{
    struct timespec ts = {0, (long)(intptr_t)arg * 1000000L};
    nanosleep(&ts, NULL);
    kill(getpid(), SIGKILL);
    return NULL;
}

/* Entering PHASE: if the driver left DIR/die.PHASE, take it and die
 * 0-9 ms into the call. */
static void maybe_die(const char *phase)
{
    char from[4096], to[4200];
    snprintf(from, sizeof from, "%s/die.%s", dir, phase);
    snprintf(to, sizeof to, "%s/died.%s.%d", dir, phase, (int)getpid());
    if (rename(from, to) != 0) return;
    fprintf(stderr, "pid %d: dying inside %s\n", (int)getpid(), phase);
    pthread_t t;
    intptr_t ms = rand() % 10;
    if (pthread_create(&t, NULL, die_later, (void *)ms) != 0) kill(getpid(), SIGKILL);
    pthread_detach(t);
}

static int checked(loom_comm_t comm, float *x, size_t count, uint64_t step, int shared,
                   long *wrong, loom_result_t *r)
{
    int n;
    loom_comm_size(comm, &n);
    for (size_t i = 0; i < count; i++) x[i] = (float)(step % 1000 + i % 13);
    if (shared) loom_comm_set_algo(comm, "allreduce:shared");
    *r = loom_allreduce(x, x, count, LOOM_FLOAT32, LOOM_SUM, comm);
    if (shared) loom_comm_set_algo(comm, NULL);
    if (*r != LOOM_SUCCESS) return 0;
    for (size_t i = 0; i < count; i++)
        if (x[i] != (float)n * (float)(step % 1000 + i % 13)) {
            (*wrong)++;
            fprintf(stderr, "BAD pid %d: wrong %s allreduce at step %llu: [%zu] = %g\n",
                    (int)getpid(), shared ? "shared" : "automatic", (unsigned long long)step, i,
                    (double)x[i]);
            return 1;
        }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 3) return 2;
    crash_setup();
    t_start = now_ms();
    dir = argv[2];
    srand((unsigned)getpid());
    int joined = !strcmp(argv[1], "join");
    loom_comm_t comm;
    loom_result_t r = joined ? loom_comm_join(&comm, NULL) : loom_comm_init_env(&comm, NULL);
    if (r != LOOM_SUCCESS) {
        if (joined && (r == LOOM_ERR_TIMEOUT || r == LOOM_ERR_CONNECT)) {
            fprintf(stderr, "LEFT pid %d: loom_comm_join: %s (%s)\n", (int)getpid(),
                    loom_strerror(r), loom_get_last_error());
            return 3;
        }
        fprintf(stderr, "BAD pid %d: %s: %s (%s)\n", (int)getpid(), joined ? "join" : "init",
                loom_strerror(r), loom_get_last_error());
        return 1;
    }
    unsigned char *state = calloc(1, STATE_BYTES);
    uint64_t step = 0, rev = 0;
    if (!joined) {
        for (size_t i = 0; i < STATE_BYTES; i++) state[i] = (unsigned char)(i * 7);
        rev = 1;
    }
    loom_tensor_t ts[2] = {{state, STATE_BYTES}, {&step, sizeof step}};
    float *x = malloc(COUNT * sizeof *x), *y = malloc(BIG * sizeof *y);
    long shrinks = 0, grows = 0, wrong = 0, diverged = 0;
    int rc = 0;
    const char *call = "";
    /* resync: the step starts with a state sync (1: a newcomer's, with
     * the members' sync after their grow; 2: after a shrink, everyone's,
     * then the step's number agreed, whatever a failed sync left of it). */
    int resync = joined;
    for (;;) {
        int stop = 0;
        r = LOOM_SUCCESS;
        if (resync) {
            call = "loom_state_sync";
            maybe_die("sync");
            r = loom_state_sync(comm, ts, 2, &rev);
            if (r == LOOM_ERR_INVALID_USAGE && rev == LOOM_REVISION_NONE) {
                /* loom_state_sync(3): no rank holds a state; the job
                 * starts it over. */
                EVENT("state lost on every rank: %s", loom_get_last_error());
                memset(state, 0, STATE_BYTES);
                rev = 0;
                r = LOOM_SUCCESS;
            }
            if (r != LOOM_SUCCESS) EVENT("state sync: %s", loom_strerror(r));
            if (r == LOOM_SUCCESS && resync == 2) {
                call = "loom_allreduce";
                uint64_t st = step;
                r = loom_allreduce(&st, &st, 1, LOOM_UINT64, LOOM_MAX, comm);
                if (r == LOOM_SUCCESS) step = st;
            }
            /* A newcomer's sync was the end of the members' step. */
            if (r != LOOM_SUCCESS || resync == 1) goto agree;
        }
        progress(step, comm);
        call = "loom_allreduce";
        if (checked(comm, x, COUNT, step, 0, &wrong, &r) ||
            (r == LOOM_SUCCESS && checked(comm, y, BIG, step, 1, &wrong, &r))) {
            rc = 1;
            break;
        }
        if (r != LOOM_SUCCESS) goto agree;
        uint64_t d[2] = {digest(y, BIG, digest(x, COUNT, 1469598103934665603ull)), 0};
        d[1] = d[0];
        uint64_t lo = d[0];
        r = loom_allreduce(&d[0], &d[0], 1, LOOM_UINT64, LOOM_MAX, comm);
        if (r == LOOM_SUCCESS) r = loom_allreduce(&d[1], &d[1], 1, LOOM_UINT64, LOOM_MIN, comm);
        if (r != LOOM_SUCCESS) goto agree;
        if (d[0] != lo || d[1] != lo) {
            diverged++;
            fprintf(stderr, "BAD pid %d: ranks ended step %llu with different bytes\n",
                    (int)getpid(), (unsigned long long)step);
            rc = 1;
            break;
        }
        /* Stop together: the same step on every rank. */
        stop = stopping();
        r = loom_allreduce(&stop, &stop, 1, LOOM_INT32, LOOM_MAX, comm);
        if (r != LOOM_SUCCESS || stop) goto agree;
        step++;
        if (step % 8 == 0) {
            /* Decided by agreement, as loom_comm_grow(3) says: an
             * allreduce can succeed on some ranks and fail on others,
             * which would then grow while these agree (the ranks' calls
             * differ: LOOM_ERR_MISMATCH, seen once in a 600 s run). */
            int pend = 0;
            loom_comm_pending_joins(comm, &pend);
            uint64_t all = pend > 0;
            r = loom_comm_agree(comm, &all, LOOM_MAX);
            if (r != LOOM_SUCCESS) goto agree;
            if (all) {
                loom_comm_t big = NULL;
                call = "loom_comm_grow";
                maybe_die("grow");
                r = loom_comm_grow(comm, &big);
                if (r != LOOM_SUCCESS) goto agree;
                if (big) {
                    int nb = 0;
                    loom_comm_size(big, &nb);
                    EVENT("grow at step %llu: %d ranks", (unsigned long long)step, nb);
                    loom_comm_destroy(comm);
                    comm = big;
                    grows++;
                    call = "loom_state_sync";
                    maybe_die("sync");
                    r = loom_state_sync(comm, ts, 2, &rev);
                }
            }
        }
    agree:
        if (r != LOOM_SUCCESS) {
            EVENT("%s failed at step %llu: %s (%s)", call, (unsigned long long)step,
                  loom_strerror(r), loom_get_last_error());
            /* loom(7) FAILURE MODEL: an operation on a communicator that
             * lost a rank fails with LOOM_ERR_REMOTE or LOOM_ERR_REVOKED;
             * loom_comm_grow(3) adds LOOM_ERR_TIMEOUT, which takes
             * LOOM_TIMEOUT (the driver sets 60 s). */
            if (r != LOOM_ERR_REMOTE && r != LOOM_ERR_REVOKED &&
                !(r == LOOM_ERR_TIMEOUT && !strcmp(call, "loom_comm_grow"))) {
                fprintf(stderr,
                        "BAD pid %d: %s failed with %s, which its man page does not give (%s)\n",
                        (int)getpid(), call, loom_strerror(r), loom_get_last_error());
                rc = 1;
                break;
            }
        }
        {
            /* Did the step succeed on every rank?  Only then is it done;
             * otherwise the survivors shrink and redo it. */
            uint64_t ok = r == LOOM_SUCCESS;
            loom_result_t ra = loom_comm_agree(comm, &ok, LOOM_MIN);
            if (ra != LOOM_SUCCESS) {
                /* loom_comm_agree(3): REVOKED, this rank is out (declared
                 * failed, or no majority); TIMEOUT, someone did not take
                 * part in LOOM_TIMEOUT. */
                fprintf(stderr, "%s pid %d: loom_comm_agree: %s (%s); leaving\n",
                        ra == LOOM_ERR_REVOKED || ra == LOOM_ERR_TIMEOUT ? "LEFT" : "BAD",
                        (int)getpid(), loom_strerror(ra), loom_get_last_error());
                rc = ra == LOOM_ERR_REVOKED || ra == LOOM_ERR_TIMEOUT ? 3 : 1;
                break;
            }
            if (ok) {
                resync = 0;
                if (stop) break;
                continue;
            }
        }
        {
            int size = 0, low = 0;
            loom_comm_size(comm, &size);
            loom_comm_rank(comm, &low);
            loom_comm_t small = NULL;
            double t0 = now_ms();
            maybe_die("shrink");
            loom_result_t rs = loom_comm_shrink(comm, &small);
            if (rs != LOOM_SUCCESS) {
                const char *m = loom_get_last_error();
                /* loom_comm_shrink(3): REVOKED, declared failed or no
                 * majority; TIMEOUT, the others may have gone on. */
                int doc = rs == LOOM_ERR_REVOKED || rs == LOOM_ERR_TIMEOUT;
                fprintf(stderr, "%s pid %d: shrink refused after %.0f ms: %s (%s); leaving\n",
                        doc ? "LEFT" : "BAD", (int)getpid(), now_ms() - t0, loom_strerror(rs), m);
                rc = doc ? 3 : 1;
                break;
            }
            /* A majority of the old communicator, or this process must
             * not go on (a partitioned job's minority): more than half,
             * or exactly half with the old rank 0 (loom_comm_shrink(3)). */
            int n2 = 0;
            loom_comm_size(small, &n2);
            int had0 = 1;
            if (2 * n2 == size &&
                loom_allreduce(&low, &low, 1, LOOM_INT32, LOOM_MIN, small) == LOOM_SUCCESS)
                had0 = low == 0;
            loom_comm_destroy(comm);
            comm = small;
            shrinks++;
            EVENT("shrink in %.0f ms: %d -> %d ranks", now_ms() - t0, size, n2);
            if (!(2 * n2 > size || (2 * n2 == size && had0))) {
                fprintf(stderr, "MINORITY pid %d: shrank from %d ranks to %d\n", (int)getpid(),
                        size, n2);
                rc = 4;
                break;
            }
            resync = 2;
        }
    }
    if (rc == 0) {
        char p[4096];
        snprintf(p, sizeof p, "%s/summary.%d", dir, (int)getpid());
        FILE *f = fopen(p, "w");
        if (f) {
            fprintf(f, "SUMMARY pid=%d steps=%llu shrinks=%ld grows=%ld wrong=%ld diverged=%ld\n",
                    (int)getpid(), (unsigned long long)step, shrinks, grows, wrong, diverged);
            fclose(f);
        }
    }
    loom_comm_destroy(comm);
    free(x);
    free(y);
    free(state);
    return rc;
}
