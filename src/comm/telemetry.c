/*
 * telemetry.c - loom_comm_get_stats, loom_comm_reset_stats: the engine's
 * straggler telemetry (src/sched/stats.c) as the application reads it.
 */
#include <string.h>

#include "comm/comm.h"

/* The failure of a call that reads the telemetry where there is none. */
static loom_result_t stats_off(const struct loom_comm *c, const char *fn)
{
    return loomi_fail(LOOM_ERR_UNSUPPORTED, c->rank,
                      "%s: telemetry is off (LOOM_STATS=0, or no memory for it)", fn);
}

loom_result_t loom_comm_get_stats(loom_comm_t h, loom_peer_stats_t *peers, int capacity,
                                  int *count, double *own_wait_ms_avg)
{
    struct loom_comm *c;
    loom_result_t r = loomi_comm_live_arg(h, "loom_comm_get_stats", count, "count", &c);
    if (r != LOOM_SUCCESS) return r;
    if (capacity < 0 || (capacity > 0 && !peers))
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, c->rank,
                          "loom_comm_get_stats: capacity %d with peers %s", capacity,
                          peers ? "given" : "NULL");
    size_t esize = capacity > 0 ? peers[0].size : sizeof(loom_peer_stats_t);
    if (capacity > 0 && (esize < offsetof(loom_peer_stats_t, rank) + sizeof(int) ||
                         esize > sizeof(loom_peer_stats_t) * 16))
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, c->rank,
                          "loom_comm_get_stats: peers[0].size is %zu, expected "
                          "sizeof(loom_peer_stats_t) = %zu",
                          esize, sizeof(loom_peer_stats_t));
    loomi_comm_lock(c);
    const struct loomi_stats *S = c->eng.stats;
    if (!S) {
        loomi_comm_unlock(c);
        return stats_off(c, "loom_comm_get_stats");
    }
    int n = 0;
    for (int p = 0; p < S->n; p++) {
        const struct loomi_peer_acc *a = &S->peer[p];
        if (!a->ops && !a->bytes_in) continue;
        if (n < capacity) {
            loom_peer_stats_t v;
            memset(&v, 0, sizeof v);
            v.size = esize < sizeof v ? esize : sizeof v;
            v.rank = p;
            v.ops = a->ops;
            v.late_ops = a->late_n;
            v.bytes_in = a->bytes_in;
            v.busy_s = (double)a->busy_ns / 1e9;
            v.late_ms_avg = a->late_n ? (double)a->late_sum_ns / (double)a->late_n / 1e6 : 0;
            v.late_ms_max = (double)a->late_max_ns / 1e6;
            v.mbps_in = a->busy_ns ? (double)a->timed_bytes / (double)a->busy_ns * 1e3 : 0;
            memcpy((unsigned char *)peers + (size_t)n * esize, &v, v.size);
        }
        n++;
    }
    *count = n;
    if (own_wait_ms_avg)
        *own_wait_ms_avg = S->own_n ? (double)S->own_ns / (double)S->own_n / 1e6 : 0;
    loomi_comm_unlock(c);
    return LOOM_SUCCESS;
}

loom_result_t loom_comm_reset_stats(loom_comm_t h)
{
    static const char fn[] = "loom_comm_reset_stats";
    struct loom_comm *c;
    loom_result_t r = loomi_comm_live(h, fn, &c);
    if (r != LOOM_SUCCESS) return r;
    loomi_comm_lock(c);
    const int on = c->eng.stats != NULL;
    if (on) loomi_stats_reset(&c->eng);
    loomi_comm_unlock(c);
    return on ? LOOM_SUCCESS : stats_off(c, fn);
}
