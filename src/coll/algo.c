/* algo.c - algorithm names, LOOM_ALGO parsing and selection. */
#include <stdio.h>
#include <string.h>

#include "coll/coll.h"
#include "comm/comm.h"

static const char *const coll_names[LOOMI_NUM_COLLS] = {"allreduce"};
static const char *const algo_names[LOOMI_NUM_ALGOS] = {"auto", "ring"};
/* Which algorithms each collective has (bit per enum loomi_algo). */
static const unsigned coll_algos[LOOMI_NUM_COLLS] = {1u << LOOMI_ALGO_RING};

static void list_valid(char *buf, size_t n)
{
    size_t o = 0;
    for (int c = 0; c < LOOMI_NUM_COLLS; c++) {
        o += (size_t)snprintf(buf + o, n - o, "%s%s:", c ? "; " : "", coll_names[c]);
        for (int a = 1; a < LOOMI_NUM_ALGOS && o < n; a++)
            if (coll_algos[c] & (1u << a))
                o += (size_t)snprintf(buf + o, n - o, " %s", algo_names[a]);
        if (o >= n) break;
    }
}

static int find(const char *const *names, int n, const char *s, size_t len)
{
    for (int i = 0; i < n; i++)
        if (strlen(names[i]) == len && !strncmp(names[i], s, len)) return i;
    return -1;
}

loom_result_t loomi_algo_parse(const char *spec, int forced[LOOMI_NUM_COLLS], int rank)
{
    for (int c = 0; c < LOOMI_NUM_COLLS; c++) forced[c] = LOOMI_ALGO_AUTO;
    if (!spec || !*spec) return LOOM_SUCCESS;
    char valid[512];
    const char *p = spec;
    while (*p) {
        size_t len = strcspn(p, ";,");
        const char *colon = memchr(p, ':', len);
        int coll = -1;
        const char *an = p;
        size_t alen = len;
        if (colon) {
            coll = find(coll_names, LOOMI_NUM_COLLS, p, (size_t)(colon - p));
            if (coll < 0) {
                list_valid(valid, sizeof valid);
                return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, rank,
                                  "LOOM_ALGO: unknown collective '%.*s' (valid: %s)",
                                  (int)(colon - p), p, valid);
            }
            an = colon + 1;
            alen = len - (size_t)(an - p);
        }
        int a = find(algo_names, LOOMI_NUM_ALGOS, an, alen);
        int ok = a >= 0 && (a == LOOMI_ALGO_AUTO || coll < 0 || (coll_algos[coll] & (1u << a)));
        if (!ok) {
            list_valid(valid, sizeof valid);
            return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, rank,
                              "LOOM_ALGO: '%.*s' is not an algorithm of %s (valid: %s)",
                              (int)alen, an, coll >= 0 ? coll_names[coll] : "any collective",
                              valid);
        }
        for (int c = 0; c < LOOMI_NUM_COLLS; c++)
            if (c == coll || (coll < 0 && (a == LOOMI_ALGO_AUTO || (coll_algos[c] & (1u << a)))))
                forced[c] = a;
        p += len;
        if (*p) p++;
    }
    return LOOM_SUCCESS;
}

int loomi_algo_for(const struct loom_comm *comm, int coll, size_t bytes)
{
    (void)bytes;
    if (comm->algo_forced[coll] != LOOMI_ALGO_AUTO) return comm->algo_forced[coll];
    return LOOMI_ALGO_RING; /* the only one so far */
}
