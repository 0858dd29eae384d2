/* procs.h - what the perf helpers that fork their own ranks (staged,
 * kcopy) share: a clock, a spinning barrier with a deadline, the slices
 * of a vector, binding as loomrun --bind core binds, and the fork and
 * reaping of the ranks.  They do not link the library, so that they
 * measure nothing but their copies. */
#ifndef LOOM_PERF_PROCS_H
#define LOOM_PERF_PROCS_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PROCS_MAX 64
#define PROCS_DEADLINE_S 60.0 /* a barrier that waits longer: a process died */

/* In memory every rank maps (MAP_SHARED before the fork). */
struct procs_sync {
    atomic_int count;
    atomic_int gen;
};

static inline double procs_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Spins yielding the CPU, as ranks of an oversubscribed host do; exits
 * the process past the deadline. */
static inline void procs_barrier(struct procs_sync *s, int nranks, const char *prog)
{
    const int g = atomic_load(&s->gen);
    if (atomic_fetch_add(&s->count, 1) == nranks - 1) {
        atomic_store(&s->count, 0);
        atomic_fetch_add(&s->gen, 1);
        return;
    }
    const double until = procs_now() + PROCS_DEADLINE_S;
    while (atomic_load(&s->gen) == g) {
        sched_yield();
        if (procs_now() > until) {
            fprintf(stderr, "%s: a barrier waited %.0f s; giving up\n", prog, PROCS_DEADLINE_S);
            _exit(1);
        }
    }
}

/* Slice q of len floats among nranks: cut on 16-float (64-byte) bounds. */
static inline void procs_slice(size_t len, int nranks, int q, size_t *start, size_t *n)
{
    size_t lines = len / 16, per = lines / (size_t)nranks, extra = lines % (size_t)nranks;
    size_t uq = (size_t)q;
    *start = 16 * (uq * per + (uq < extra ? uq : extra));
    *n = 16 * (per + (uq < extra));
}

/* Whether the n floats at out all hold 1 + 2 + ... + nranks, the sum
 * of the ranks' inputs (rank q's all q + 1); says where not. */
static inline int procs_sum_ok(const float *out, size_t n, int r, int nranks, const char *prog)
{
    const float want = (float)nranks * (float)(nranks + 1) / 2;
    for (size_t i = 0; i < n; i++)
        if (out[i] != want) {
            fprintf(stderr, "%s: rank %d: element %zu is %g, not %g\n", prog, r, i, out[i], want);
            return 0;
        }
    return 1;
}

/* Rank r on CPU r mod CPUs; best effort, as loomrun's. */
static inline void procs_bind(int r)
{
    const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET((int)(r % (cpus > 0 ? cpus : 1)), &set);
    sched_setaffinity(0, sizeof set, &set);
}

/* Forks nranks processes that exit with fn(r, arg) and reaps them:
 * 0 when all exited 0.  Whichever ends first is reaped first, and one
 * that failed gets the others killed: they would wait for it at a
 * barrier until the deadline. */
static inline int procs_run(int nranks, int (*fn)(int, void *), void *arg, const char *prog)
{
    pid_t pid[PROCS_MAX];
    for (int r = 0; r < nranks; r++) {
        pid[r] = fork();
        if (pid[r] < 0) {
            fprintf(stderr, "%s: fork: %s\n", prog, strerror(errno));
            for (int q = 0; q < r; q++) kill(pid[q], SIGKILL);
            for (int q = 0; q < r; q++) waitpid(pid[q], NULL, 0);
            return 1;
        }
        if (!pid[r]) _exit(fn(r, arg));
    }
    int failed = 0;
    for (int left = nranks; left > 0; left--) {
        int st;
        if (waitpid(-1, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st)) {
            if (!failed)
                for (int q = 0; q < nranks; q++) kill(pid[q], SIGKILL);
            failed = 1;
        }
    }
    return failed;
}

#endif
