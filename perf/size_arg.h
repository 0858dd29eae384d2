/* size_arg.h - "64M" and the like on the command lines of the perf
 * helpers that do not link the library (membw, staged). */
#ifndef LOOM_PERF_SIZE_ARG_H
#define LOOM_PERF_SIZE_ARG_H

#include <stdlib.h>

/* Bytes: digits and an optional K, M or G (powers of 1024). */
static inline size_t size_arg(const char *s)
{
    char *end;
    size_t v = strtoull(s, &end, 10);
    if (*end == 'K' || *end == 'k') v <<= 10;
    else if (*end == 'M' || *end == 'm') v <<= 20;
    else if (*end == 'G' || *end == 'g') v <<= 30;
    return v;
}

#endif
