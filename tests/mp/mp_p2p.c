/*
 * mp_p2p.c - one rank of the point-to-point, group and barrier test.
 *
 * Run under loomrun.  Checks, with real processes over TCP:
 *  - a ring exchange inside a group where half the ranks queue the
 *    receive first and half the send first (a deadlock without groups);
 *  - an all-pairs exchange in one group, every pair's order shuffled;
 *  - messages between two ranks match in the order they were posted
 *    (non-blocking sends of different sizes and contents);
 *  - zero-length messages;
 *  - a large message received while it is still arriving;
 *  - collectives queued in a group run at loom_group_end;
 *  - one group across two communicators, each rank receiving on one
 *    and sending large messages on the other, crosswise (waiting on the
 *    operations one communicator at a time would deadlock);
 *  - barrier: no rank leaves before the last one entered;
 *  - argument errors name the argument and leave the buffer untouched.
 * Exit 0 only when everything matched.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "loom.h"
#include "check.h"

static int rank, nranks, failures;


static uint32_t word(int from, int to, size_t i, int salt)
{
    return (uint32_t)(from * 1000003u + to * 7919u + i * 31u + (unsigned)salt * 131u);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void ring_in_group(loom_comm_t comm, size_t n)
{
    int right = (rank + 1) % nranks, left = (rank + nranks - 1) % nranks;
    uint32_t *s = malloc((n ? n : 1) * 4), *r = malloc((n ? n : 1) * 4);
    for (size_t i = 0; i < n; i++) s[i] = word(rank, right, i, 1), r[i] = 0xdeadbeef;
    loom_result_t e1, e2, e3, e4;
    e1 = loom_group_start();
    if (rank % 2) {
        e2 = loom_recv(r, n, LOOM_UINT32, left, comm);
        e3 = loom_send(s, n, LOOM_UINT32, right, comm);
    } else {
        e3 = loom_send(s, n, LOOM_UINT32, right, comm);
        e2 = loom_recv(r, n, LOOM_UINT32, left, comm);
    }
    e4 = loom_group_end();
    CHECK(!e1 && !e2 && !e3 && !e4, "ring group n=%zu: %s", n, loom_get_last_error());
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += r[i] != word(left, rank, i, 1);
    CHECK(bad == 0, "ring group n=%zu: %zu wrong words", n, bad);
    free(s);
    free(r);
}

static void all_pairs_in_group(loom_comm_t comm, size_t n)
{
    uint32_t *s = malloc(nranks * (n ? n : 1) * 4), *r = malloc(nranks * (n ? n : 1) * 4);
    for (int q = 0; q < nranks; q++)
        for (size_t i = 0; i < n; i++) s[q * n + i] = word(rank, q, i, 2), r[q * n + i] = 0;
    int *order = malloc(2 * nranks * sizeof *order);
    int k = 0;
    for (int q = 0; q < nranks; q++)
        if (q != rank) order[k++] = q, order[k++] = -1 - q; /* send to q, receive from q */
    srand(1234 + rank);
    for (int i = k - 1; i > 0; i--) {
        int j = rand() % (i + 1), t = order[i];
        order[i] = order[j], order[j] = t;
    }
    loom_result_t err = loom_group_start();
    for (int i = 0; i < k && !err; i++) {
        int q = order[i] >= 0 ? order[i] : -1 - order[i];
        err = order[i] >= 0 ? loom_send(s + q * n, n, LOOM_UINT32, q, comm)
                            : loom_recv(r + q * n, n, LOOM_UINT32, q, comm);
    }
    loom_result_t e2 = loom_group_end();
    CHECK(!err && !e2, "all pairs group n=%zu: %s", n, loom_get_last_error());
    size_t bad = 0;
    for (int q = 0; q < nranks; q++)
        for (size_t i = 0; q != rank && i < n; i++) bad += r[q * n + i] != word(q, rank, i, 2);
    CHECK(bad == 0, "all pairs n=%zu: %zu wrong words", n, bad);
    free(order);
    free(s);
    free(r);
}

/* Rank 0 posts three non-blocking sends of different sizes to rank 1;
 * rank 1 receives them with non-blocking receives posted in the same
 * order and waits for them in reverse. */
static void ordering(loom_comm_t comm)
{
    if (nranks < 2 || rank > 1) return;
    size_t len[3] = {5, 100000, 3};
    uint32_t *b[3];
    loom_request_t q[3];
    for (int m = 0; m < 3; m++) {
        b[m] = malloc(len[m] * 4);
        for (size_t i = 0; i < len[m]; i++) b[m][i] = rank == 0 ? word(0, 1, i, 10 + m) : 0;
        loom_result_t e = rank == 0 ? loom_isend(b[m], len[m], LOOM_UINT32, 1, comm, &q[m])
                                    : loom_irecv(b[m], len[m], LOOM_UINT32, 0, comm, &q[m]);
        CHECK(!e, "ordering post %d: %s", m, loom_get_last_error());
    }
    for (int m = 2; m >= 0; m--) {
        loom_result_t e = loom_wait(&q[m]);
        CHECK(!e, "ordering wait %d: %s", m, loom_get_last_error());
        CHECK(q[m] == LOOM_REQUEST_NULL, "request not released");
    }
    if (rank == 1)
        for (int m = 0; m < 3; m++) {
            size_t bad = 0;
            for (size_t i = 0; i < len[m]; i++) bad += b[m][i] != word(0, 1, i, 10 + m);
            CHECK(bad == 0, "ordering message %d: %zu wrong", m, bad);
        }
    for (int m = 0; m < 3; m++) free(b[m]);
}

/* A large message whose receive is posted while it is still arriving:
 * what came early is moved to the receive buffer and the rest read
 * straight into it (tcp_data.c, unexp_go_direct).  Several sizes and delays so
 * that the receive lands before, during and after the transfer. */
static void late_receive(loom_comm_t comm)
{
    if (nranks < 2) return;
    size_t n = (size_t)16 << 20; /* 64 MiB */
    uint32_t *b = rank <= 1 ? malloc(n * 4) : NULL;
    int delays_us[] = {0, 2000, 20000};
    for (int d = 0; d < 3; d++) {
        for (size_t i = 0; rank <= 1 && i < n; i++) b[i] = rank == 0 ? word(0, 1, i, 20 + d) : 0;
        loom_result_t e = LOOM_SUCCESS, e2;
        loom_request_t q = LOOM_REQUEST_NULL;
        /* Rank 1 reads part of the message during the barrier, before its
         * receive exists. */
        if (rank == 0) e = loom_isend(b, n, LOOM_UINT32, 1, comm, &q);
        e2 = loom_barrier(comm);
        if (rank == 1) {
            usleep((useconds_t)delays_us[d]);
            e = loom_recv(b, n, LOOM_UINT32, 0, comm);
        }
        if (rank == 0 && !e) e = loom_wait(&q);
        CHECK(!e && !e2, "late receive %d: %s", d, loom_get_last_error());
        size_t bad = 0;
        for (size_t i = 0; rank == 1 && i < n; i++) bad += b[i] != word(0, 1, i, 20 + d);
        CHECK(bad == 0, "late receive after %d us: %zu wrong words", delays_us[d], bad);
    }
    free(b);
}

static void collectives_in_group(loom_comm_t comm)
{
    int32_t a[64], b[64], c[64];
    for (int i = 0; i < 64; i++) a[i] = rank + i, b[i] = -1, c[i] = rank == 0 ? 7 * i : -1;
    loom_result_t e = loom_group_start();
    e = e ? e : loom_allreduce(a, b, 64, LOOM_INT32, LOOM_SUM, comm);
    e = e ? e : loom_broadcast(c, c, 64, LOOM_INT32, 0, comm);
    /* Queued, not run: the outputs are untouched until the end. */
    CHECK(b[0] == -1, "allreduce ran before loom_group_end");
    loom_result_t e2 = loom_group_end();
    CHECK(!e && !e2, "collectives in group: %s", loom_get_last_error());
    int bad = 0;
    for (int i = 0; i < 64; i++) {
        bad += b[i] != nranks * i + nranks * (nranks - 1) / 2;
        bad += c[i] != 7 * i;
    }
    CHECK(bad == 0, "collectives in group: %d wrong", bad);
}

static void barrier(loom_comm_t comm)
{
    /* The last rank enters 300 ms late; nobody may leave before that. */
    loom_result_t e = loom_barrier(comm);
    CHECK(!e, "barrier: %s", loom_get_last_error());
    double t0 = now_s();
    if (rank == nranks - 1) usleep(300000);
    e = loom_barrier(comm);
    double dt = now_s() - t0;
    CHECK(!e, "barrier: %s", loom_get_last_error());
    if (nranks > 1) CHECK(dt >= 0.25, "left the barrier after %.3f s, before the late rank", dt);
    loom_request_t q;
    e = loom_ibarrier(comm, &q);
    CHECK(!e, "ibarrier: %s", loom_get_last_error());
    e = loom_wait(&q);
    CHECK(!e, "ibarrier wait: %s", loom_get_last_error());
}

static void errors(loom_comm_t comm)
{
    uint32_t buf[4] = {1, 2, 3, 4};
    loom_result_t e = loom_send(buf, 4, LOOM_UINT32, nranks, comm);
    CHECK(e == LOOM_ERR_INVALID_ARGUMENT && strstr(loom_get_last_error(), "peer"),
          "bad peer: %d %s", e, loom_get_last_error());
    e = loom_recv(buf, 4, LOOM_UINT32, rank, comm);
    CHECK(e == LOOM_ERR_INVALID_USAGE && strstr(loom_get_last_error(), "itself"),
          "self peer: %d %s", e, loom_get_last_error());
    e = loom_recv(NULL, 4, LOOM_UINT32, (rank + 1) % nranks, comm);
    CHECK(e == LOOM_ERR_INVALID_ARGUMENT || nranks == 1, "NULL buf: %d", e);
    e = loom_send(buf, 4, (loom_datatype_t)99, 0, comm);
    CHECK(e == LOOM_ERR_INVALID_ARGUMENT && strstr(loom_get_last_error(), "dtype"), "bad dtype");
    CHECK(buf[0] == 1 && buf[3] == 4, "buffer touched by a rejected call");
    e = loom_group_end();
    CHECK(e == LOOM_ERR_INVALID_USAGE, "group_end without start: %d", e);
    loom_request_t q = LOOM_REQUEST_NULL;
    loom_group_start();
    e = loom_iallreduce(buf, buf, 4, LOOM_UINT32, LOOM_SUM, comm, &q);
    CHECK(e == LOOM_ERR_INVALID_USAGE && q == LOOM_REQUEST_NULL,
          "non-blocking call inside a group: %d", e);
    if (nranks > 1) {
        e = loom_isend(buf, 4, LOOM_UINT32, (rank + 1) % nranks, comm, &q);
        CHECK(e == LOOM_ERR_INVALID_USAGE, "isend inside a group: %d", e);
    }
    CHECK(loom_group_end() == LOOM_SUCCESS, "empty group end");
    int32_t x = 5;
    e = loom_broadcast(&x, &x, 1, LOOM_INT32, nranks, comm);
    CHECK(e == LOOM_ERR_INVALID_ARGUMENT && strstr(loom_get_last_error(), "root"), "bad root");
    CHECK(x == 5, "buffer touched by a rejected broadcast");
}

/* A group over two communicators: even ranks send on a and receive on
 * b, odd ranks the other way round; receives are waited for first, and
 * 8 MiB sends need their communicator driven, so each must be. */
static void group_two_comms(loom_comm_t a, loom_comm_t b)
{
    if (nranks % 2) return; /* pairs */
    const size_t n = (size_t)2 << 20; /* 8 MiB of words */
    const int peer = rank ^ 1;
    uint32_t *out = malloc(n * sizeof *out), *in = malloc(n * sizeof *in);
    if (!out || !in) {
        CHECK(0, "two comms: out of memory");
        free(out);
        free(in);
        return;
    }
    for (size_t i = 0; i < n; i++) out[i] = word(rank, peer, i, 7), in[i] = 0;
    loom_comm_t snd = rank % 2 ? b : a, rcv = rank % 2 ? a : b;
    double t0 = now_s();
    loom_result_t e1 = loom_group_start();
    loom_result_t e2 = loom_send(out, n, LOOM_UINT32, peer, snd);
    loom_result_t e3 = loom_recv(in, n, LOOM_UINT32, peer, rcv);
    loom_result_t e4 = loom_group_end();
    CHECK(!e1 && !e2 && !e3 && !e4, "two comms: %s", loom_get_last_error());
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += in[i] != word(peer, rank, i, 7);
    size_t first = n;
    for (size_t i = 0; i < n && first == n; i++)
        if (in[i] != word(peer, rank, i, 7)) first = i;
    CHECK(bad == 0, "two comms: %zu wrong words, the first at %zu of %zu", bad, first, n);
    CHECK(now_s() - t0 < 20, "two comms: took %.1f s", now_s() - t0);
    free(out);
    free(in);
}

int main(void)
{
    loom_comm_t comm;
    mp_join(&comm, &rank, &nranks);
    errors(comm);
    if (nranks > 1) {
        size_t sizes[] = {0, 1, 1000, 1 << 20};
        for (int i = 0; i < 4; i++) ring_in_group(comm, sizes[i]);
        all_pairs_in_group(comm, 0);
        all_pairs_in_group(comm, 4099);
        ordering(comm);
        late_receive(comm);
        /* A second communicator of the same ranks. */
        loom_unique_id_t id;
        memset(&id, 0, sizeof id);
        loom_result_t e = rank == 0 ? loom_get_unique_id(&id) : LOOM_SUCCESS;
        CHECK(!e, "unique id: %s", loom_get_last_error());
        e = loom_broadcast(&id, &id, sizeof id, LOOM_UINT8, 0, comm);
        loom_comm_t c2;
        if (!e) e = loom_comm_init_rank(&c2, nranks, &id, rank, NULL);
        CHECK(!e, "second communicator: %s", loom_get_last_error());
        if (!e) {
            group_two_comms(comm, c2);
            loom_comm_destroy(c2);
        }
    }
    collectives_in_group(comm);
    barrier(comm);
    loom_result_t e = loom_comm_destroy(comm);
    CHECK(!e, "destroy: %s", loom_get_last_error());
    if (rank == 0) printf("rank 0 of %d: %s\n", nranks, failures ? "FAILED" : "all passed");
    return failures ? 1 : 0;
}
