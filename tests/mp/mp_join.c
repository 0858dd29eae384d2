/*
 * mp_join.c - one rank of the join tests.
 *
 * usage: mp_join MODE OUTFILE [MIB]
 *   MODE grow:   rank 0 starts a new process (this program, "joiner")
 *                that joins; the members loop allreduce until they all
 *                see it waiting (allreduce of loom_comm_pending_joins),
 *                then call loom_comm_grow and destroy the old
 *                communicator.  Everyone then syncs a MIB MiB state (the
 *                newcomer has none) and checks an allreduce on n+1 ranks.
 *   MODE holder: the same, but rank 0 (which holds the join service)
 *                SIGKILLs itself once the joiner waits: the others shrink
 *                and then admit the joiner through the next holder.
 *   MODE mismatch: as grow, but the joiner runs with JOIN_SETTING (say
 *                "LOOM_CHUNK_SIZE=1M") added to its environment: its join
 *                must fail with LOOM_ERR_MISMATCH naming the variable, and
 *                the members' grow must keep their communicator, which
 *                must still work.  Members print "OK member kept size=N";
 *                the joiner writes "OK joiner refused: MESSAGE".
 *   MODE dies:   as grow, but the last member dies (SIGKILL from a thread,
 *                0-250 ms after it enters loom_comm_grow, which takes about as long): the joiner must
 *                still be admitted, and everyone settles (checked
 *                allreduce, loom_comm_agree, shrink until it works) on
 *                n ranks: the n - 1 members and the newcomer.  Prints
 *                "OK member dies size=N"; the joiner "OK joiner ... size=N".
 * JOIN_ALGO, if set, is given to loom_comm_set_algo on the members only:
 * the joiner must take it from them.
 * Members print "OK member grow_ms=G sync_ms=S size=N"; the joiner writes
 * "OK joiner join_ms=J rank=R size=N" to OUTFILE.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "loom.h"

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static unsigned char val(size_t i) { return (unsigned char)(i * 13u + 5u); }

/* The shared state, a check of it, and an allreduce on the new group. */
static int after(loom_comm_t comm, size_t bytes, int newcomer, double *sync_ms)
{
    unsigned char *b = malloc(bytes ? bytes : 1);
    for (size_t i = 0; i < bytes; i++) b[i] = newcomer ? 0 : val(i);
    loom_tensor_t t = {b, bytes};
    uint64_t rev = newcomer ? 0 : 5;
    double t0 = now_ms();
    loom_result_t r = loom_state_sync(comm, &t, 1, &rev);
    *sync_ms = now_ms() - t0;
    size_t wrong = 0;
    for (size_t i = 0; i < bytes; i++) wrong += b[i] != val(i);
    free(b);
    if (r != LOOM_SUCCESS || wrong || rev != 5) {
        printf("FAIL state sync: %s (%s) %zu wrong\n", loom_strerror(r), loom_get_last_error(),
               wrong);
        return -1;
    }
    int n;
    loom_comm_size(comm, &n);
    float x = 1;
    r = loom_allreduce(&x, &x, 1, LOOM_FLOAT32, LOOM_SUM, comm);
    if (r != LOOM_SUCCESS || x != (float)n) {
        printf("FAIL allreduce on %d ranks: %s %g\n", n, loom_strerror(r), (double)x);
        return -1;
    }
    /* One past the arenas' slots, by the algorithm the members chose
     * (JOIN_ALGO): a joiner that took another would not meet them. */
    const size_t big = 256 * 1024;
    float *v = malloc(big * sizeof *v);
    for (size_t i = 0; i < big; i++) v[i] = (float)(i % 7);
    r = loom_allreduce(v, v, big, LOOM_FLOAT32, LOOM_SUM, comm);
    size_t bad = 0;
    for (size_t i = 0; i < big; i++) bad += v[i] != (float)(i % 7) * (float)n;
    free(v);
    if (r != LOOM_SUCCESS || bad) {
        printf("FAIL 1 MiB allreduce on %d ranks: %s (%s), %zu wrong\n", n, loom_strerror(r),
               loom_get_last_error(), bad);
        return -1;
    }
    return 0;
}

/* After a member died around the admission: the ranks agree whether a
 * checked allreduce worked everywhere, and shrink until it did.  Returns
 * the final size, or -1. */
static int settle(loom_comm_t *comm)
{
    for (int round = 0; round < 5; round++) {
        int n;
        loom_comm_size(*comm, &n);
        float x = 1;
        loom_result_t r = loom_allreduce(&x, &x, 1, LOOM_FLOAT32, LOOM_SUM, *comm);
        uint64_t ok = r == LOOM_SUCCESS && x == (float)n;
        if (loom_comm_agree(*comm, &ok, LOOM_MIN) != LOOM_SUCCESS) return -1;
        if (ok) return n;
        loom_comm_t nc;
        if (loom_comm_shrink(*comm, &nc) != LOOM_SUCCESS) return -1;
        loom_comm_destroy(*comm);
        *comm = nc;
    }
    return -1;
}

static void *killer(void *arg)
{
    usleep((useconds_t)(uintptr_t)arg);
    raise(SIGKILL);
    return NULL;
}

static int joiner(const char *out, size_t bytes, int dies)
{
    FILE *f = fopen(out, "w");
    if (!f) return 2;
    double t0 = now_ms();
    loom_comm_t comm;
    loom_result_t r = loom_comm_join(&comm, NULL);
    double dt = now_ms() - t0;
    if (r != LOOM_SUCCESS) {
        fprintf(f, "FAIL join: %s: %s\n", loom_strerror(r), loom_get_last_error());
        fclose(f);
        return 1;
    }
    int rank, n;
    loom_comm_rank(comm, &rank);
    loom_comm_size(comm, &n);
    if (dies) {
        int size = settle(&comm);
        fprintf(f, "%s joiner join_ms=%.1f size=%d\n", size > 0 ? "OK" : "FAIL", dt, size);
        fclose(f);
        loom_comm_destroy(comm);
        return size > 0 ? 0 : 1;
    }
    double sync;
    if (after(comm, bytes, 1, &sync)) {
        fprintf(f, "FAIL after join\n");
        fclose(f);
        return 1;
    }
    /* As the members do: nobody else waits, so grow keeps the communicator. */
    loom_comm_t none = comm;
    r = loom_comm_grow(comm, &none);
    if (r != LOOM_SUCCESS || none != NULL) {
        fprintf(f, "FAIL grow with nobody waiting: %s\n", loom_strerror(r));
        fclose(f);
        return 1;
    }
    fprintf(f, "OK joiner join_ms=%.1f sync_ms=%.1f rank=%d size=%d\n", dt, sync, rank, n);
    fclose(f);
    loom_comm_destroy(comm);
    return 0;
}

/* A joiner whose settings differ from the members'. */
static int refused(const char *out, const char *setting)
{
    FILE *f = fopen(out, "w");
    if (!f) return 2;
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int)strcspn(setting, "="), setting);
    double t0 = now_ms();
    loom_comm_t comm = NULL;
    loom_result_t r = loom_comm_join(&comm, NULL);
    double dt = now_ms() - t0;
    const char *msg = loom_get_last_error();
    if (r != LOOM_ERR_MISMATCH || !strstr(msg, name)) {
        fprintf(f, "FAIL join with %s: %s after %.0f ms: %s\n", setting, loom_strerror(r), dt,
                r == LOOM_SUCCESS ? "admitted" : msg);
        if (r == LOOM_SUCCESS) loom_comm_destroy(comm);
        fclose(f);
        return 1;
    }
    fprintf(f, "OK joiner refused after %.0f ms: %s\n", dt, msg);
    fclose(f);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: mp_join grow|holder OUTFILE [MIB]\n");
        return 2;
    }
    size_t bytes = (argc > 3 ? (size_t)atoi(argv[3]) : 4) << 20;
    if (!strcmp(argv[1], "joiner")) return joiner(argv[2], bytes, 0);
    if (!strcmp(argv[1], "joiner-dies")) return joiner(argv[2], bytes, 1);
    int dies = !strcmp(argv[1], "dies");
    const char *setting = getenv("JOIN_SETTING");
    if (!strcmp(argv[1], "refused")) return refused(argv[2], setting ? setting : "");
    int holder = !strcmp(argv[1], "holder");
    int mismatch = !strcmp(argv[1], "mismatch");
    if (mismatch && (!setting || !strchr(setting, '='))) {
        fprintf(stderr, "mp_join mismatch: set JOIN_SETTING=VARIABLE=VALUE\n");
        return 2;
    }
    loom_comm_t comm;
    if (loom_comm_init_env(&comm, NULL) != LOOM_SUCCESS) {
        fprintf(stderr, "init: %s\n", loom_get_last_error());
        return 2;
    }
    /* The communicator's own algorithms, which a joiner must take. */
    const char *algo = getenv("JOIN_ALGO");
    if (algo && loom_comm_set_algo(comm, algo) != LOOM_SUCCESS) {
        fprintf(stderr, "loom_comm_set_algo: %s\n", loom_get_last_error());
        return 2;
    }
    int rank, n;
    loom_comm_rank(comm, &rank);
    loom_comm_size(comm, &n);
    pid_t child = -1;
    if (rank == 0) {
        child = fork();
        if (child == 0) {
            char mib[16];
            snprintf(mib, sizeof mib, "%zu", bytes >> 20);
            if (mismatch) putenv((char *)setting);
            execl("/proc/self/exe", argv[0], mismatch ? "refused" : dies ? "joiner-dies" : "joiner",
                  argv[2], mib, (char *)NULL);
            _exit(127);
        }
    }
    /* Loop until every member sees the joiner waiting. */
    double t_end = now_ms() + 20000;
    int seen = 0;
    while (!seen && now_ms() < t_end) {
        int pend = 0;
        loom_comm_pending_joins(comm, &pend);
        int all = pend > 0;
        loom_result_t r = loom_allreduce(&all, &all, 1, LOOM_INT32, LOOM_MIN, comm);
        if (r != LOOM_SUCCESS && holder) {
            /* Rank 0 died right after its part of the last check. */
            seen = 1;
            break;
        }
        if (r != LOOM_SUCCESS) {
            printf("FAIL allreduce while waiting: %s\n", loom_get_last_error());
            return 1;
        }
        seen = all;
        if (!seen) usleep(20000);
    }
    if (!seen) {
        printf("FAIL the joiner was never seen waiting\n");
        return 1;
    }
    if (holder) {
        if (rank == 0) raise(SIGKILL);
        float x = 1;
        loom_result_t r = LOOM_SUCCESS;
        for (int k = 0; k < 1000 && r == LOOM_SUCCESS; k++)
            r = loom_allreduce(&x, &x, 1, LOOM_FLOAT32, LOOM_SUM, comm);
        loom_comm_t small;
        if (r == LOOM_SUCCESS || loom_comm_shrink(comm, &small) != LOOM_SUCCESS) {
            printf("FAIL shrink after the holder died: %s\n", loom_get_last_error());
            return 1;
        }
        loom_comm_destroy(comm);
        comm = small;
        /* The joiner comes back to the next holder: wait for it again. */
        seen = 0;
        while (!seen && now_ms() < t_end) {
            int pend = 0;
            loom_comm_pending_joins(comm, &pend);
            int all = pend > 0;
            if (loom_allreduce(&all, &all, 1, LOOM_INT32, LOOM_MIN, comm) != LOOM_SUCCESS) {
                printf("FAIL allreduce on the shrunk communicator\n");
                return 1;
            }
            seen = all;
            if (!seen) usleep(20000);
        }
        if (!seen) {
            printf("FAIL the joiner never came back to the next holder\n");
            return 1;
        }
    }
    if (mismatch) {
        /* The joiner is refused: nobody to admit, the communicator stays. */
        loom_comm_t same = comm;
        loom_result_t r = loom_comm_grow(comm, &same);
        float x = 1;
        if (r == LOOM_SUCCESS && same == NULL)
            r = loom_allreduce(&x, &x, 1, LOOM_FLOAT32, LOOM_SUM, comm);
        if (r != LOOM_SUCCESS || same != NULL || x != (float)n) {
            printf("FAIL grow with a refused joiner: %s (%s), newcomm %p, sum %g\n",
                   loom_strerror(r), loom_get_last_error(), (void *)same, x);
            return 1;
        }
        int st = 0;
        if (child > 0 && (waitpid(child, &st, 0) != child || !WIFEXITED(st) ||
                          WEXITSTATUS(st) != 0)) {
            printf("FAIL the refused joiner exited with status %d\n", st);
            return 1;
        }
        printf("OK member kept size=%d\n", n);
        loom_comm_destroy(comm);
        return 0;
    }
    if (dies && rank == n - 1) {
        /* Dies during the grow, or just before or after it. */
        srand((unsigned)getpid());
        pthread_t th;
        pthread_create(&th, NULL, killer, (void *)(uintptr_t)(rand() % 250000));
    }
    double t0 = now_ms();
    loom_comm_t big = NULL;
    loom_result_t r = loom_comm_grow(comm, &big);
    double grow = now_ms() - t0;
    if (dies) {
        if (r != LOOM_SUCCESS || !big) {
            printf("FAIL grow while a member died: %s: %s\n", loom_strerror(r),
                   loom_get_last_error());
            return 1;
        }
        loom_comm_destroy(comm);
        int size = settle(&big);
        printf("%s member dies size=%d\n", size == n ? "OK" : "FAIL", size);
        if (size > 0) loom_comm_destroy(big);
        if (child > 0) waitpid(child, NULL, 0);
        return size == n ? 0 : 1;
    }
    if (r != LOOM_SUCCESS || !big) {
        printf("FAIL grow: %s: %s\n", loom_strerror(r), loom_get_last_error());
        return 1;
    }
    loom_comm_destroy(comm);
    int nn, nr;
    loom_comm_size(big, &nn);
    loom_comm_rank(big, &nr);
    double sync;
    if (after(big, bytes, 0, &sync)) return 1;
    /* Nobody waits now: grow keeps the communicator. */
    loom_comm_t none = big;
    r = loom_comm_grow(big, &none);
    if (r != LOOM_SUCCESS || none != NULL) {
        printf("FAIL grow with nobody waiting: %s, newcomm %p\n", loom_strerror(r), (void *)none);
        return 1;
    }
    printf("OK member grow_ms=%.1f sync_ms=%.1f size=%d rank=%d\n", grow, sync, nn, nr);
    loom_comm_destroy(big);
    if (child > 0) waitpid(child, NULL, 0);
    return 0;
}
