/*
 * mp_stats.c - one rank of the straggler-telemetry tests (test_stats.sh).
 *
 * usage: mp_stats slow SLOW OPS SLEEP_MS COUNT
 *            OPS allreduces of COUNT floats; rank SLOW sleeps SLEEP_MS
 *            before each call.  Every other rank that received from SLOW
 *            checks that loom_comm_get_stats shows SLOW the latest peer,
 *            by at least SLEEP_MS - 5 ms on average, every other peer by
 *            less than half that, and its own wait; it prints "rank R:
 *            saw SLOW late by X ms".
 *        mp_stats link OPS COUNT
 *            OPS allreduces of COUNT floats; prints each peer's rate.
 *        mp_stats api
 *            the mistakes: NULL count, a bad size, capacity below the
 *            number of peers, reset; with LOOM_STATS=0, "off" instead.
 *        mp_stats off
 *            LOOM_STATS=0: loom_comm_get_stats says telemetry is off.
 * Prints "rank R: OK ..." on success, exits non-zero on failure.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loom.h"

static int rank, nranks;

#define FAIL(...)                                                                        \
    do {                                                                                 \
        fprintf(stderr, "rank %d: FAIL line %d: ", rank, __LINE__);                      \
        fprintf(stderr, __VA_ARGS__);                                                    \
        fprintf(stderr, "\n");                                                           \
        exit(1);                                                                         \
    } while (0)

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {}
}

static void run(loom_comm_t comm, int ops, size_t count, int slow, int sleep)
{
    float *buf = malloc(count * sizeof *buf);
    if (!buf) FAIL("out of memory");
    for (int k = 0; k < ops; k++) {
        for (size_t i = 0; i < count; i++) buf[i] = (float)(rank + 1);
        if (rank == slow) sleep_ms(sleep);
        loom_result_t r = loom_allreduce(buf, buf, count, LOOM_FLOAT32, LOOM_SUM, comm);
        if (r != LOOM_SUCCESS) FAIL("allreduce %d: %s", k, loom_get_last_error());
        const float want = (float)nranks * (float)(nranks + 1) / 2;
        if (buf[0] != want || buf[count - 1] != want)
            FAIL("allreduce %d: %g, expected %g", k, buf[0], want);
    }
    free(buf);
}

static int get(loom_comm_t comm, loom_peer_stats_t *ps, int cap, double *own)
{
    int n = -1;
    for (int i = 0; i < cap; i++) ps[i].size = sizeof *ps;
    if (loom_comm_get_stats(comm, ps, cap, &n, own) != LOOM_SUCCESS)
        FAIL("loom_comm_get_stats: %s", loom_get_last_error());
    return n;
}

static void print(const loom_peer_stats_t *ps, int n, double own)
{
    for (int i = 0; i < n; i++)
        printf("rank %d: peer %d ops %llu/%llu bytes %llu busy %.4f s late avg %.2f ms max %.2f "
               "ms rate %.1f MB/s\n",
               rank, ps[i].rank, (unsigned long long)ps[i].late_ops, (unsigned long long)ps[i].ops,
               (unsigned long long)ps[i].bytes_in, ps[i].busy_s, ps[i].late_ms_avg,
               ps[i].late_ms_max, ps[i].mbps_in);
    printf("rank %d: own wait %.2f ms\n", rank, own);
}

int main(int argc, char **argv)
{
    if (argc < 2) return 2;
    loom_comm_t comm;
    if (loom_comm_init_env(&comm, NULL) != LOOM_SUCCESS) {
        fprintf(stderr, "init: %s\n", loom_get_last_error());
        return 1;
    }
    loom_comm_rank(comm, &rank);
    loom_comm_size(comm, &nranks);
    loom_peer_stats_t ps[64];
    double own = -1;
    if (!strcmp(argv[1], "slow") && argc == 6) {
        const int slow = atoi(argv[2]), ops = atoi(argv[3]), sleep = atoi(argv[4]);
        const size_t count = (size_t)atol(argv[5]);
        run(comm, ops, count, slow, sleep);
        int n = get(comm, ps, 64, &own);
        print(ps, n, own);
        if (rank != slow) {
            int at = -1;
            for (int i = 0; i < n; i++)
                if (ps[i].rank == slow) at = i;
            if (at >= 0 && ps[at].late_ops) {
                if (ps[at].late_ms_avg < sleep - 5)
                    FAIL("rank %d's data late by %.2f ms on average, expected >= %d", slow,
                         ps[at].late_ms_avg, sleep - 5);
                /* The others: well under it (a loaded machine may keep
                 * a rank from its core for tens of ms now and then). */
                for (int i = 0; i < n; i++)
                    if (i != at && ps[i].late_ops && ps[i].late_ms_avg >= ps[at].late_ms_avg / 2)
                        FAIL("rank %d (not slowed) late by %.2f ms on average, rank %d by %.2f",
                             ps[i].rank, ps[i].late_ms_avg, slow, ps[at].late_ms_avg);
                /* It waited for the latest peer, rank SLOW, each time. */
                if (own < ps[at].late_ms_avg * 0.5)
                    FAIL("own wait %.2f ms, rank %d's lateness %.2f ms", own, slow,
                         ps[at].late_ms_avg);
                printf("rank %d: saw %d late by %.2f ms\n", rank, slow, ps[at].late_ms_avg);
            }
        }
        printf("rank %d: OK slow\n", rank);
    } else if (!strcmp(argv[1], "link") && argc == 4) {
        run(comm, atoi(argv[2]), (size_t)atol(argv[3]), -1, 0);
        int n = get(comm, ps, 64, &own);
        print(ps, n, own);
        printf("rank %d: OK link\n", rank);
    } else if (!strcmp(argv[1], "api")) {
        int n = -1;
        if (loom_comm_get_stats(comm, ps, 64, NULL, NULL) != LOOM_ERR_INVALID_ARGUMENT ||
            !strstr(loom_get_last_error(), "count"))
            FAIL("NULL count accepted or not named: %s", loom_get_last_error());
        ps[0].size = 3;
        if (loom_comm_get_stats(comm, ps, 1, &n, NULL) != LOOM_ERR_INVALID_ARGUMENT ||
            !strstr(loom_get_last_error(), "size"))
            FAIL("size 3 accepted or not named: %s", loom_get_last_error());
        if (loom_comm_get_stats(comm, NULL, 2, &n, NULL) != LOOM_ERR_INVALID_ARGUMENT)
            FAIL("NULL peers with capacity 2 accepted");
        if (loom_comm_get_stats(NULL, ps, 1, &n, NULL) == LOOM_SUCCESS)
            FAIL("a NULL communicator accepted");
        n = get(comm, ps, 64, &own);
        if (n != 0) FAIL("%d peers before any operation", n);
        run(comm, 5, 1024, -1, 0);
        n = get(comm, ps, 64, &own);
        if (n < 1 || n > nranks - 1) FAIL("%d peers after 5 allreduces on %d ranks", n, nranks);
        for (int i = 0; i < n; i++) {
            if (ps[i].rank < 0 || ps[i].rank >= nranks || ps[i].rank == rank)
                FAIL("peer %d listed", ps[i].rank);
            if (ps[i].ops < 1 || ps[i].ops > 5 || ps[i].bytes_in == 0)
                FAIL("peer %d: %llu ops, %llu bytes after 5 allreduces", ps[i].rank,
                     (unsigned long long)ps[i].ops, (unsigned long long)ps[i].bytes_in);
            if (i && ps[i].rank <= ps[i - 1].rank) FAIL("peers not in rank order");
        }
        if (own < 0) FAIL("own wait %.3f ms", own);
        if (n > 1) {
            /* Room for one: the first is written, count says how many. */
            loom_peer_stats_t one[2];
            memset(one, 0x5a, sizeof one);
            one[0].size = sizeof one[0];
            int m = -1;
            if (loom_comm_get_stats(comm, one, 1, &m, NULL) != LOOM_SUCCESS || m != n ||
                one[0].rank != ps[0].rank || one[1].size != 0x5a5a5a5a5a5a5a5aull)
                FAIL("capacity 1: count %d (expected %d), a second element written?", m, n);
        }
        if (loom_comm_reset_stats(comm) != LOOM_SUCCESS) FAIL("reset: %s", loom_get_last_error());
        n = get(comm, ps, 64, &own);
        if (n != 0 || own != 0) FAIL("%d peers, own %.3f after reset", n, own);
        run(comm, 2, 1024, -1, 0);
        n = get(comm, ps, 64, &own);
        for (int i = 0; i < n; i++)
            if (ps[i].ops > 2) FAIL("peer %d: %llu ops after reset and 2 allreduces", ps[i].rank,
                                    (unsigned long long)ps[i].ops);
        if (n < 1) FAIL("no peer after reset and 2 allreduces");
        printf("rank %d: OK api\n", rank);
    } else if (!strcmp(argv[1], "off")) {
        int n = -1;
        ps[0].size = sizeof ps[0];
        if (loom_comm_get_stats(comm, ps, 64, &n, NULL) != LOOM_ERR_UNSUPPORTED ||
            !strstr(loom_get_last_error(), "LOOM_STATS=0"))
            FAIL("LOOM_STATS=0 not refused: %s", loom_get_last_error());
        if (loom_comm_reset_stats(comm) != LOOM_ERR_UNSUPPORTED) FAIL("reset with LOOM_STATS=0");
        run(comm, 3, 16, -1, 0);
        printf("rank %d: OK off\n", rank);
    } else {
        return 2;
    }
    loom_comm_destroy(comm);
    return 0;
}
