/* util.c - clocks, small parsers, a comparison and big buffers. */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "internal.h"

uint64_t loomi_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int loomi_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Big buffers get transparent huge pages where the kernel gives them on
 * request: the in-place shared allreduce streams its saves through all of
 * SCRATCH, and with 4K pages the TLB misses show in a large allreduce's
 * time; and a fresh buffer faults in a page at a time, which on a VM can
 * cost more than the work (most of the time init spends timing the
 * reduction, on a PVM guest).  See perf/NOTES.md, "util.c, huge
 * pages". */
#define BIG_PAGE ((size_t)2 << 20)
void *loomi_big_alloc(size_t len)
{
#ifdef MADV_HUGEPAGE
    if (len >= 2 * BIG_PAGE) {
        void *p;
        if (posix_memalign(&p, BIG_PAGE, len)) return NULL;
        (void)madvise(p, len, MADV_HUGEPAGE); /* advice: fine if refused */
        return p;
    }
#endif
    return malloc(len);
}

int loomi_ms_left(uint64_t deadline_ms)
{
    uint64_t now = loomi_now_ms();
    if (now >= deadline_ms) return 0;
    uint64_t d = deadline_ms - now;
    return d > INT_MAX ? INT_MAX : (int)d;
}

int loomi_parse_size(const char *s, size_t *out)
{
    if (!s || !isdigit((unsigned char)*s)) return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno) return -1;
    unsigned shift = 0;
    switch (*end) {
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    default: break;
    }
    if (*end == 'B' || *end == 'b') end++;
    if (*end != '\0') return -1;
    if (shift && v > (ULLONG_MAX >> shift)) return -1;
    v <<= shift;
    if (v > SIZE_MAX) return -1;
    *out = (size_t)v;
    return 0;
}

int loomi_parse_duration(const char *s, long long unit_us, long long *out)
{
    if (!s || !isdigit((unsigned char)*s) || unit_us <= 0) return -1;
    /* Whole part, then up to 9 decimals, in integers: no rounding. */
    unsigned long long whole = 0, frac = 0, scale = 1;
    const char *p = s;
    for (; isdigit((unsigned char)*p); p++) {
        if (whole > (ULLONG_MAX - 9) / 10) return -1;
        whole = whole * 10 + (unsigned)(*p - '0');
    }
    if (*p == '.') {
        p++;
        if (!isdigit((unsigned char)*p)) return -1;
        for (; isdigit((unsigned char)*p); p++) {
            if (scale >= 1000000000ull) return -1;
            frac = frac * 10 + (unsigned)(*p - '0');
            scale *= 10;
        }
    }
    unsigned long long mult; /* microseconds per unit given */
    if (!*p) mult = (unsigned long long)unit_us;
    else if (!strcmp(p, "us")) mult = 1;
    else if (!strcmp(p, "ms")) mult = 1000;
    else if (!strcmp(p, "s")) mult = 1000000;
    else if (!strcmp(p, "m")) mult = 60000000;
    else return -1;
    if (!*p && scale > 1) return -1; /* "1.5" without a unit: not whole */
    if (whole > ULLONG_MAX / mult) return -1;
    unsigned long long us = whole * mult;
    if (frac) {
        /* frac / scale of mult: exact, or not a whole microsecond. */
        if (frac > ULLONG_MAX / mult || (frac * mult) % scale) return -1;
        if (us > ULLONG_MAX - frac * mult / scale) return -1;
        us += frac * mult / scale;
    }
    if (us % (unsigned long long)unit_us) return -1;
    us /= (unsigned long long)unit_us;
    if (us > LLONG_MAX) return -1;
    *out = (long long)us;
    return 0;
}

static _Thread_local struct {
    loomi_guard_fn fn;
    void *arg;
    uint64_t next_ns; /* the next time fn is asked */
    int stopped;
    char why[200];
} guard;

/* How often a wait asks its guard (it takes the control plane's lock). */
#define GUARD_EVERY_NS (5 * 1000000u)

void loomi_guard_set(loomi_guard_fn fn, void *arg)
{
    guard.fn = fn;
    guard.arg = arg;
    guard.next_ns = 0;
    guard.stopped = 0;
    guard.why[0] = '\0';
}

int loomi_guard_stop(char *msg, size_t n)
{
    if (!guard.fn) return 0;
    if (!guard.stopped) {
        uint64_t now = loomi_now_ns();
        if (now < guard.next_ns) return 0;
        guard.next_ns = now + GUARD_EVERY_NS;
        guard.stopped = guard.fn(guard.arg, guard.why, sizeof guard.why);
        if (!guard.stopped) return 0;
    }
    if (msg && n) snprintf(msg, n, "%s", guard.why);
    return 1;
}
