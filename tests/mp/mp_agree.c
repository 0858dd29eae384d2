/*
 * mp_agree.c - one rank of the loom_comm_agree tests (test_agree.sh).
 *
 * usage: mp_agree MODE ITER [VICTIM]
 *   basic   ITER agreements, LOOM_MIN and LOOM_MAX in turn, on values the
 *           ranks compute differently; each result checked against the
 *           value every rank can compute.  Prints "OK basic n=N us=U"
 *           (U: microseconds per agreement, the median).
 *   kill    ITER agreements; rank VICTIM (0: the coordinator) is
 *           SIGKILLed from a thread at a random moment while the ranks
 *           agree.  Every rank prints "A it status value" per agreement,
 *           so the driver checks that all survivors got the same value
 *           for each; agreements go on after the death, on the broken
 *           communicator.
 *   revoke  rank 1 revokes the communicator; then the ranks agree
 *           (LOOM_MIN of 1s) on it: "OK revoke value=1".
 *   ops     rank 1 passes LOOM_MAX, the others LOOM_MIN: every rank must
 *           fail with LOOM_ERR_MISMATCH ("OK ops ...").
 *   stop    rank VICTIM stops itself (SIGSTOP) before agreement 3; the
 *           others agree without it ("OK stop ..." with the value), then
 *           rank 0 sends it SIGCONT: its loom_comm_grow and its own
 *           agreement must fail with LOOM_ERR_REVOKED, and its
 *           loom_comm_get_error say REVOKED naming it ("OK excluded ...").
 *   setalgo 4 ranks: ranks 0 and 1 force the shared allreduce for a call
 *           that fails (rank 3 dies), then put the automatic choice back
 *           on the broken communicator; the survivors' shrink must not
 *           hang (the new group's measuring splits ranks between slots
 *           and engine otherwise).  "OK setalgo ...".
 *   steps   the retry pattern of loom_comm_agree(3): checked allreduces;
 *           rank VICTIM dies around step ITER/2's allreduce (a thread
 *           kills it 0-3 ms into the step); after each step the
 *           ranks agree on whether it succeeded everywhere, and where it
 *           did not they shrink and redo it.  Every rank prints
 *           "OK steps done=D redone=R size=N", the driver checks D and
 *           R agree and that no sum was wrong.
 */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "loom.h"

static int rank, nranks;

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static uint64_t contrib(int it, int r) { return (uint64_t)((it * 7919 + r * 104729) % 1000003); }

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int basic(loom_comm_t comm, int iters)
{
    double *t = malloc(sizeof *t * (size_t)iters);
    for (int it = 0; it < iters; it++) {
        loom_op_t op = it % 2 ? LOOM_MAX : LOOM_MIN;
        uint64_t v = contrib(it, rank), want = contrib(it, 0);
        for (int q = 1; q < nranks; q++) {
            uint64_t c = contrib(it, q);
            if (op == LOOM_MIN ? c < want : c > want) want = c;
        }
        double t0 = now_us();
        loom_result_t r = loom_comm_agree(comm, &v, op);
        t[it] = now_us() - t0;
        if (r != LOOM_SUCCESS || v != want) {
            printf("FAIL basic it=%d: %s (%s), value %llu, want %llu\n", it, loom_strerror(r),
                   loom_get_last_error(), (unsigned long long)v, (unsigned long long)want);
            return 1;
        }
        /* Uneven speeds: the ranks do not enter each agreement together. */
        if ((it + rank) % 5 == 0) usleep(200);
    }
    qsort(t, (size_t)iters, sizeof *t, cmp_double);
    printf("OK basic n=%d us=%.0f\n", nranks, t[iters / 2]);
    free(t);
    loom_comm_destroy(comm);
    return 0;
}

static void *killer(void *arg)
{
    useconds_t us = (useconds_t)(uintptr_t)arg;
    usleep(us);
    raise(SIGKILL);
    return NULL;
}

static int kill_mode(loom_comm_t comm, int iters, int victim)
{
    if (rank == victim) {
        srand((unsigned)getpid());
        pthread_t th;
        /* A random moment within the first half of the run. */
        pthread_create(&th, NULL, killer, (void *)(uintptr_t)(20000 + rand() % 200000));
    }
    for (int it = 0; it < iters; it++) {
        uint64_t v = contrib(it, rank);
        loom_result_t r = loom_comm_agree(comm, &v, it % 2 ? LOOM_MAX : LOOM_MIN);
        printf("A %d %d %llu\n", it, (int)r, (unsigned long long)(r == LOOM_SUCCESS ? v : 0));
        if (r != LOOM_SUCCESS) {
            printf("FAIL kill it=%d: %s (%s)\n", it, loom_strerror(r), loom_get_last_error());
            return 1;
        }
        usleep(1000);
    }
    printf("OK kill\n");
    loom_comm_destroy(comm);
    return 0;
}

static float *buf;
enum { COUNT = 65537 };

static int steps_mode(loom_comm_t comm, int iters, int victim)
{
    buf = malloc(COUNT * sizeof *buf);
    int done = 0, redone = 0, orig = rank, me = rank, n = nranks, done_kill = 0;
    for (int step = 0; step < iters;) {
        if (orig == victim && step == iters / 2 && !done_kill) {
            /* Dies within the step's allreduce, or just before or after. */
            srand((unsigned)getpid());
            pthread_t th;
            pthread_create(&th, NULL, killer, (void *)(uintptr_t)(rand() % 3000));
            done_kill = 1;
        }
        /* The killer's moment may come after the last steps (an idle
         * machine does them in less): the victim goes no further than
         * two steps on, so that it dies inside the run. */
        if (orig == victim && done_kill && step >= iters / 2 + 2) pause();
        /* Inputs from the step and the rank's original number, so a rank
         * that redid another step than the others would be seen. */
        for (int i = 0; i < COUNT; i++) buf[i] = (float)(step + 1 + (i % 5));
        loom_result_t r = loom_allreduce(buf, buf, COUNT, LOOM_FLOAT32, LOOM_SUM, comm);
        int wrong = 0;
        if (r == LOOM_SUCCESS)
            for (int i = 0; i < COUNT; i++)
                wrong += buf[i] != (float)n * (float)(step + 1 + (i % 5));
        if (wrong) {
            printf("FAIL steps: step %d: %d wrong sums on %d ranks\n", step, wrong, n);
            return 1;
        }
        uint64_t ok = r == LOOM_SUCCESS;
        loom_result_t a = loom_comm_agree(comm, &ok, LOOM_MIN);
        if (a != LOOM_SUCCESS) {
            printf("FAIL steps: agreement after step %d: %s (%s)\n", step, loom_strerror(a),
                   loom_get_last_error());
            return 1;
        }
        if (ok) { /* every rank completed it: commit */
            step++;
            done++;
            continue;
        }
        loom_comm_t nc;
        r = loom_comm_shrink(comm, &nc);
        if (r != LOOM_SUCCESS) {
            printf("FAIL steps: shrink after step %d: %s (%s)\n", step, loom_strerror(r),
                   loom_get_last_error());
            return 1;
        }
        loom_comm_destroy(comm);
        comm = nc;
        loom_comm_rank(comm, &me);
        loom_comm_size(comm, &n);
        redone++;
        fprintf(stderr, "rank %d (now %d of %d): redo step %d\n", orig, me, n, step);
    }
    printf("OK steps done=%d redone=%d size=%d\n", done, redone, n);
    loom_comm_destroy(comm);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: mp_agree basic|kill|revoke|ops|stop|steps ITER [VICTIM]\n");
        return 2;
    }
    const char *mode = argv[1];
    int iters = atoi(argv[2]), victim = argc > 3 ? atoi(argv[3]) : 1;
    setvbuf(stdout, NULL, _IOLBF, 0);
    loom_comm_t comm;
    loom_result_t r = loom_comm_init_env(&comm, NULL);
    if (r != LOOM_SUCCESS) {
        printf("FAIL init: %s\n", loom_get_last_error());
        return 1;
    }
    loom_comm_rank(comm, &rank);
    loom_comm_size(comm, &nranks);
    if (!strcmp(mode, "basic")) return basic(comm, iters);
    if (!strcmp(mode, "kill")) return kill_mode(comm, iters, victim);
    if (!strcmp(mode, "steps")) return steps_mode(comm, iters, victim);
    if (!strcmp(mode, "setalgo")) {
        /* Ranks 0 and 1 force the shared allreduce around a call that
         * fails (rank 3 died), rank 2 does not; they put the automatic
         * choice back on the broken communicator, and the survivors'
         * shrink (which measures the new group with the same calls on
         * every rank) must not split them between the slots and the
         * engine. */
        if (rank < 2) loom_comm_set_algo(comm, "allreduce:shared");
        loom_barrier(comm);
        if (rank == 3) raise(SIGKILL);
        usleep(100000);
        float *x = calloc(1 << 16, sizeof *x);
        loom_result_t a = loom_allreduce(x, x, 1 << 16, LOOM_FLOAT32, LOOM_SUM, comm);
        loom_result_t s0 = loom_comm_set_algo(comm, NULL);
        double t0 = now_us();
        loom_comm_t nc = NULL;
        r = loom_comm_shrink(comm, &nc);
        double ms = (now_us() - t0) / 1e3;
        float one = 1;
        if (r == LOOM_SUCCESS) r = loom_allreduce(&one, &one, 1, LOOM_FLOAT32, LOOM_SUM, nc);
        int ok = a != LOOM_SUCCESS && s0 == LOOM_SUCCESS && r == LOOM_SUCCESS && one == 3.0f;
        printf("%s setalgo: allreduce %s, set_algo(NULL) on the broken communicator %s, shrink "
               "and allreduce on 3 %s in %.0f ms\n",
               ok ? "OK" : "FAIL", loom_strerror(a), loom_strerror(s0), loom_strerror(r), ms);
        if (nc) loom_comm_destroy(nc);
        loom_comm_destroy(comm);
        free(x);
        return !ok;
    }
    if (!strcmp(mode, "revoke")) {
        loom_barrier(comm); /* every rank's init is over */
        if (rank == 1) loom_comm_revoke(comm);
        uint64_t one = 1;
        r = loom_comm_agree(comm, &one, LOOM_MIN);
        if (r != LOOM_SUCCESS || one != 1) {
            printf("FAIL revoke: %s (%s), value %llu\n", loom_strerror(r), loom_get_last_error(),
                   (unsigned long long)one);
            return 1;
        }
        /* The communicator itself stays revoked. */
        float x = 1;
        r = loom_allreduce(&x, &x, 1, LOOM_FLOAT32, LOOM_SUM, comm);
        printf("%s revoke value=1 allreduce=%s\n", r == LOOM_ERR_REVOKED ? "OK" : "FAIL",
               loom_strerror(r));
        loom_comm_destroy(comm);
        return r == LOOM_ERR_REVOKED ? 0 : 1;
    }
    if (!strcmp(mode, "ops")) {
        uint64_t v = (uint64_t)rank;
        double t0 = now_us();
        r = loom_comm_agree(comm, &v, rank == 1 ? LOOM_MAX : LOOM_MIN);
        double ms = (now_us() - t0) / 1e3;
        int ok = r == LOOM_ERR_MISMATCH && strstr(loom_get_last_error(), "different ops");
        printf("%s ops %s in %.1f ms: %s\n", ok ? "OK" : "FAIL", loom_strerror(r), ms,
               loom_get_last_error());
        loom_comm_destroy(comm);
        return !ok;
    }
    if (!strcmp(mode, "stop")) {
        uint64_t v = 0;
        for (int it = 0; it < 3; it++) {
            v = contrib(it, rank);
            if ((r = loom_comm_agree(comm, &v, LOOM_MIN)) != LOOM_SUCCESS) {
                printf("FAIL stop: agreement %d: %s\n", it, loom_get_last_error());
                return 1;
            }
        }
        char pidfile[64];
        snprintf(pidfile, sizeof pidfile, "/tmp/mp_agree.%d.victim", (int)getppid());
        if (rank == victim) {
            FILE *f = fopen(pidfile, "w");
            if (f) {
                fprintf(f, "%d\n", (int)getpid());
                fclose(f);
            }
            raise(SIGSTOP);
            /* Continued after the others went on without this rank: a
             * grow (which revokes nothing itself) is refused, and the
             * communicator then says why. */
            loom_comm_t nc = NULL;
            loom_result_t g = loom_comm_grow(comm, &nc);
            int fr = -2;
            loom_result_t ge = loom_comm_get_error(comm, &fr);
            int ok = g == LOOM_ERR_REVOKED && !nc && ge == LOOM_ERR_REVOKED && fr == rank;
            printf("%s excluded: grow %s (%s); get_error %s rank %d\n", ok ? "" : "FAIL",
                   loom_strerror(g), loom_get_last_error(), loom_strerror(ge), fr);
            v = 5;
            r = loom_comm_agree(comm, &v, LOOM_MIN);
            ok = ok && r == LOOM_ERR_REVOKED;
            printf("%s excluded: agree %s (%s)\n", ok ? "OK" : "FAIL", loom_strerror(r),
                   loom_get_last_error());
            return !ok;
        }
        /* Without the victim: its silence is found by heartbeats. */
        v = contrib(3, rank);
        uint64_t want = UINT64_MAX;
        for (int q = 0; q < nranks; q++)
            if (q != victim && contrib(3, q) < want) want = contrib(3, q);
        double t0 = now_us();
        r = loom_comm_agree(comm, &v, LOOM_MIN);
        double ms = (now_us() - t0) / 1e3;
        int ok = r == LOOM_SUCCESS && v == want;
        int failed[8], nf = 0;
        loom_comm_get_failed(comm, failed, 8, &nf);
        ok = ok && nf == 1 && failed[0] == victim;
        printf("%s stop value=%llu want=%llu in %.0f ms, failed %d (rank %d)\n", ok ? "OK" : "FAIL",
               (unsigned long long)v, (unsigned long long)want, ms, nf, nf ? failed[0] : -1);
        /* Rank 0 continues the victim and stays until it has answered. */
        uint64_t bye = 1;
        if (rank == 0) {
            FILE *f = fopen(pidfile, "r");
            int pid = 0;
            if (f && fscanf(f, "%d", &pid) == 1 && pid > 0) kill(pid, SIGCONT);
            if (f) fclose(f);
            unlink(pidfile);
        }
        loom_comm_agree(comm, &bye, LOOM_MIN); /* the survivors leave together */
        sleep(1);
        loom_comm_destroy(comm);
        return !ok;
    }
    fprintf(stderr, "unknown mode %s\n", mode);
    return 2;
}
