/*
 * fast_clock.c - an LD_PRELOAD module for the tests: CLOCK_MONOTONIC, as
 * the process reads it through clock_gettime(), runs FAST_CLOCK_X times
 * as fast as the real one (default 10) from the first reading on.
 *
 * It stands for a rank that a loaded host slowed down, whose clock says
 * more time has passed than its peers' say: what the ranks decide from
 * time measured at init must be one rank's word, or they part ways
 * (test_topo.sh).
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int (*gettime_fn)(clockid_t, struct timespec *);

int clock_gettime(clockid_t id, struct timespec *ts)
{
    static gettime_fn real;
    static uint64_t base; /* ns: the first reading, 0 until there is one */
    if (!real) {
        void *sym = dlsym(RTLD_NEXT, "clock_gettime");
        memcpy(&real, &sym, sizeof real); /* object to function pointer */
    }
    int rc = real(id, ts);
    if (rc || id != CLOCK_MONOTONIC) return rc;
    const uint64_t now = (uint64_t)ts->tv_sec * 1000000000u + (uint64_t)ts->tv_nsec;
    uint64_t b = 0;
    /* The first thread to read sets the base; the others take it. */
    if (!__atomic_compare_exchange_n(&base, &b, now, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE) &&
        now > b) {
        const char *e = getenv("FAST_CLOCK_X");
        const long x = e ? atol(e) : 10;
        const uint64_t t = b + (now - b) * (uint64_t)(x > 0 && x <= 1000 ? x : 10);
        ts->tv_sec = (time_t)(t / 1000000000u);
        ts->tv_nsec = (long)(t % 1000000000u);
    }
    return rc;
}
