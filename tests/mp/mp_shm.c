/*
 * mp_shm.c - the shared-memory transport, driven directly through
 * loomi_shm_ops by N forked processes (N = argv[1], default 2).
 *
 * Each job: fresh random job key; every child creates the transport,
 * sends its local_addr up a pipe; the parent hands every child the table;
 * children connect_all and run a scenario.  Jobs:
 *  - main (CMA from 64 KiB): ping-pong and all-pairs at 0, 1, 63, 4 KiB,
 *    one cell + 1, 1 MiB, 16 MiB (data checked byte by byte); many tags
 *    posted in reverse order after the messages arrived (early messages,
 *    descriptors among them); cancel of a receive and of a descriptor
 *    send; the shared arena read through shared_map(peer); timings;
 *  - nocma (shm_cma_min 0): the same exchanges through the cells only;
 *  - fallback: process_vm_readv made to fail with EPERM (test hook): the
 *    receiver answers "no CMA" and the sender streams instead;
 *  - mismatch (2 ranks): a receive of the wrong length completes with
 *    MISMATCH and peer_failed says MISMATCH (early eager message, and a
 *    single-copy message with the receive posted first);
 *  - crowded (2 ranks, CMA from 64 KiB): a 128 KiB send is single-copy
 *    (not complete while the receive is unposted) until loomi_shm_crowded,
 *    then goes through the cells (complete at once); 1 MiB, more than a
 *    FIFO, stays single-copy; the data is checked;
 *  - kill: the last rank is SIGKILLed while the others wait for its
 *    message: they see peer_failed within 2 s; its arena, as mapped
 *    before, still reads what it wrote after abort_all (only destroy
 *    unmaps);
 *  - leftovers: a fake segment of a dead pid is removed by the next
 *    create, and no segment of any job's process remains at the end.
 * Every wait has a deadline.  Exit 0 only when everything passed.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/internal.h"
#include "transports/auth.h"
#include "transports/shm/shm.h"
#include "transports/transport.h"

#define ADDR 64
#define MAXR 16

static const struct loomi_transport_ops *ops = &loomi_shm_ops;
static int rank, nranks, failures;
static void *st;
static const char *job = "?";

#define CHECK(cond, ...)                                                                   \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            failures++;                                                                    \
            fprintf(stderr, "[%s] rank %d: FAIL line %d: ", job, rank, __LINE__);          \
            fprintf(stderr, __VA_ARGS__);                                                  \
            fprintf(stderr, "\n");                                                         \
        }                                                                                  \
    } while (0)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* ------------------------------------------------------- failure record */

static struct {
    int peer, failed;
    loom_result_t code;
    double when;
} fails[64];
static int nfails;

static void on_fail(void *owner, int peer, int failed, loom_result_t code, const char *why)
{
    (void)owner;
    (void)why;
    if (nfails < 64) {
        fails[nfails].peer = peer;
        fails[nfails].failed = failed;
        fails[nfails].code = code;
        fails[nfails].when = now_s();
    }
    nfails++;
}

/* ----------------------------------------------------------- transfers */

struct req {
    struct loomi_xfer x; /* first: the completion finds the req from it */
    int done;
    loom_result_t st;
};

static void on_done(struct loomi_xfer *x, loom_result_t s)
{
    struct req *r = (struct req *)x;
    CHECK(!r->done, "transfer (peer %d, tag %llu) completed twice", x->peer,
          (unsigned long long)x->tag);
    r->done = 1;
    r->st = s;
}

static loom_result_t post(struct req *r, int send, int peer, uint64_t tag, void *buf, size_t len)
{
    memset(r, 0, sizeof *r);
    r->x.peer = peer;
    r->x.tag = tag;
    r->x.buf = buf;
    r->x.len = len;
    r->x.complete = on_done;
    r->x.owner = r;
    loom_result_t e = send ? ops->isend(st, &r->x) : ops->irecv(st, &r->x);
    CHECK(e == LOOM_SUCCESS, "%s peer %d tag %llu len %zu: %s", send ? "isend" : "irecv", peer,
          (unsigned long long)tag, len, loom_get_last_error());
    if (e != LOOM_SUCCESS) r->done = 1, r->st = e;
    return e;
}

/* Progress until all n are done or ms pass.  0: all done. */
static int wait_for(struct req *r, int n, int ms, const char *what)
{
    double end = now_s() + ms / 1000.0;
    for (;;) {
        int left = 0;
        for (int i = 0; i < n; i++) left += !r[i].done;
        if (!left) return 0;
        if (now_s() > end) {
            CHECK(0, "%s: %d of %d transfers not done after %d ms", what, left, n, ms);
            return -1;
        }
        ops->progress(st, 1);
    }
}

static void progress_for(int ms)
{
    double end = now_s() + ms / 1000.0;
    while (now_s() < end) ops->progress(st, 1);
}

static uint64_t bar_round;
/* Everyone to everyone, zero bytes: nobody leaves before all arrived. */
static void barrier(void)
{
    static char dummy;
    struct req r[2 * MAXR];
    int n = 0;
    uint64_t tag = 0x7000000000ull + bar_round++;
    for (int q = 0; q < nranks; q++)
        if (q != rank) {
            post(&r[n++], 0, q, tag, &dummy, 0);
            post(&r[n++], 1, q, tag, &dummy, 0);
        }
    wait_for(r, n, 20000, "barrier");
    for (int i = 0; i < n; i++) CHECK(r[i].st == LOOM_SUCCESS, "barrier: status %d", r[i].st);
}

static unsigned char pat(int src, int dst, uint64_t tag, size_t i)
{
    /* Not periodic in any power of two: a piece copied to the wrong
     * offset (cells, 2 MiB single-copy pieces) shows. */
    return (unsigned char)(i % 251u + (i / 251u) * 7u + (unsigned)src * 31u + (unsigned)dst * 17u +
                           (unsigned)tag * 13u);
}

static void fill(unsigned char *b, size_t len, int src, int dst, uint64_t tag)
{
    for (size_t i = 0; i < len; i++) b[i] = pat(src, dst, tag, i);
}

static size_t bad_bytes(const unsigned char *b, size_t len, int src, int dst, uint64_t tag)
{
    size_t bad = 0;
    for (size_t i = 0; i < len; i++) bad += b[i] != pat(src, dst, tag, i);
    return bad;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(3);
    }
    return p;
}

/* ------------------------------------------------------------ scenarios */

static const size_t sizes[] = {0, 1, 63, 4096, 16384 - 32 + 1, 40000, 1 << 20, 16 << 20};
#define NSIZES (sizeof sizes / sizeof sizes[0])

/* Rank 0 sends to every other rank in turn, which checks and answers. */
static void ping_pong(uint64_t base)
{
    for (size_t si = 0; si < NSIZES; si++) {
        size_t len = sizes[si];
        uint64_t tag = base + si;
        unsigned char *b = xmalloc(len);
        for (int q = 1; q < nranks; q++) {
            if (rank != 0 && rank != q) continue;
            struct req r;
            int peer = rank == 0 ? q : 0;
            if (rank == 0) {
                fill(b, len, 0, q, tag);
                post(&r, 1, q, tag, b, len);
                wait_for(&r, 1, 20000, "ping");
                CHECK(r.st == 0, "ping %zu to %d: status %d", len, q, r.st);
                memset(b, 0xee, len);
                post(&r, 0, q, tag, b, len);
                wait_for(&r, 1, 20000, "pong");
                CHECK(r.st == 0, "pong %zu from %d: status %d", len, q, r.st);
                size_t bad = bad_bytes(b, len, q, 0, tag);
                CHECK(bad == 0, "pong of %zu bytes from %d: %zu wrong bytes", len, q, bad);
            } else {
                memset(b, 0xee, len);
                post(&r, 0, peer, tag, b, len);
                wait_for(&r, 1, 20000, "ping recv");
                CHECK(r.st == 0, "ping %zu: status %d", len, r.st);
                size_t bad = bad_bytes(b, len, 0, rank, tag);
                CHECK(bad == 0, "ping of %zu bytes: %zu wrong bytes", len, bad);
                fill(b, len, rank, 0, tag);
                post(&r, 1, peer, tag, b, len);
                wait_for(&r, 1, 20000, "pong send");
                CHECK(r.st == 0, "pong send %zu: status %d", len, r.st);
            }
        }
        free(b);
        barrier();
    }
}

static void all_pairs(uint64_t base)
{
    for (size_t si = 0; si < NSIZES; si++) {
        size_t len = sizes[si];
        uint64_t tag = base + si;
        unsigned char *sb[MAXR], *rb[MAXR];
        struct req r[2 * MAXR];
        int n = 0;
        /* Receives first on even ranks, sends first on odd ones. */
        for (int pass = 0; pass < 2; pass++)
            for (int q = 0; q < nranks; q++) {
                if (q == rank) continue;
                int send = (pass == 0) == (rank % 2 == 1);
                if (send) {
                    sb[q] = xmalloc(len);
                    fill(sb[q], len, rank, q, tag);
                    post(&r[n++], 1, q, tag, sb[q], len);
                } else {
                    rb[q] = xmalloc(len);
                    memset(rb[q], 0xee, len);
                    post(&r[n++], 0, q, tag, rb[q], len);
                }
            }
        wait_for(r, n, 30000, "all pairs");
        for (int i = 0; i < n; i++) CHECK(r[i].st == 0, "all pairs %zu: status %d", len, r[i].st);
        for (int q = 0; q < nranks; q++) {
            if (q == rank) continue;
            size_t bad = bad_bytes(rb[q], len, q, rank, tag);
            CHECK(bad == 0, "all pairs: %zu bytes from %d: %zu wrong", len, q, bad);
            free(sb[q]);
            free(rb[q]);
        }
        barrier();
    }
}

/* Every rank sends M messages to every peer; receivers post nothing
 * until all have had time to arrive, then post them newest first. */
static void reverse_tags(uint64_t base)
{
    enum { M = 48 };
    static struct req sr[MAXR][M], rr[MAXR][M];
    static unsigned char *sb[MAXR][M], *rb[MAXR][M];
    size_t len[M];
    for (int m = 0; m < M; m++) len[m] = m % 8 == 7 ? 100000 + (size_t)m : ((size_t)m * 977u) % 40000u;
    for (int q = 0; q < nranks; q++) {
        if (q == rank) continue;
        for (int m = 0; m < M; m++) {
            sb[q][m] = xmalloc(len[m]);
            fill(sb[q][m], len[m], rank, q, base + (uint64_t)m);
            post(&sr[q][m], 1, q, base + (uint64_t)m, sb[q][m], len[m]);
        }
    }
    progress_for(100); /* everything that can arrives, unexpected */
    for (int q = 0; q < nranks; q++) {
        if (q == rank) continue;
        for (int m = M - 1; m >= 0; m--) {
            rb[q][m] = xmalloc(len[m]);
            memset(rb[q][m], 0xee, len[m]);
            post(&rr[q][m], 0, q, base + (uint64_t)m, rb[q][m], len[m]);
        }
    }
    for (int q = 0; q < nranks; q++) {
        if (q == rank) continue;
        wait_for(rr[q], M, 30000, "reverse tags: receives");
        wait_for(sr[q], M, 30000, "reverse tags: sends");
        for (int m = 0; m < M; m++) {
            CHECK(rr[q][m].st == 0 && sr[q][m].st == 0, "reverse tags: status %d/%d",
                  rr[q][m].st, sr[q][m].st);
            size_t bad = bad_bytes(rb[q][m], len[m], q, rank, base + (uint64_t)m);
            CHECK(bad == 0, "reverse tags: message %d (%zu bytes) from %d: %zu wrong", m, len[m],
                  q, bad);
            free(sb[q][m]);
            free(rb[q][m]);
        }
    }
    barrier();
}

static void cancel_test(uint64_t base)
{
    if (nranks >= 2 && rank <= 1) {
        static unsigned char big[200000];
        char a[100], b[100];
        struct req r1, r2, s;
        if (rank == 0) {
            /* A receive cancelled before its message comes never completes;
             * the one posted after it gets the message. */
            post(&r1, 0, 1, base, a, sizeof a);
            ops->cancel(st, &r1.x);
            memset(b, 0, sizeof b);
            post(&r2, 0, 1, base, b, sizeof b);
            barrier();
            wait_for(&r2, 1, 10000, "receive after cancel");
            CHECK(r2.st == 0 && bad_bytes((unsigned char *)b, sizeof b, 1, 0, base) == 0,
                  "receive after a cancelled one: status %d", r2.st);
            progress_for(50);
            CHECK(!r1.done, "a cancelled receive completed");
        } else {
            barrier();
            fill((unsigned char *)a, sizeof a, 1, 0, base);
            post(&s, 1, 0, base, a, sizeof a);
            wait_for(&s, 1, 10000, "send after cancel");
            /* A single-copy send nobody receives, withdrawn. */
            post(&r1, 1, 0, base + 1, big, sizeof big);
            progress_for(20);
            ops->cancel(st, &r1.x);
            progress_for(50);
            CHECK(!r1.done, "a cancelled send completed");
        }
    } else {
        barrier();
    }
    barrier();
}

static void arena_test(void)
{
    size_t len = 0;
    unsigned char *mine = ops->shared_map(st, rank, &len);
    CHECK(mine && len >= (1u << 20), "own arena: %p, %zu bytes", (void *)mine, len);
    if (!mine) return;
    fill(mine, len, rank, rank, 77);
    barrier(); /* "done": every arena written */
    for (int q = 0; q < nranks; q++) {
        size_t l = 0;
        unsigned char *a = ops->shared_map(st, q, &l);
        CHECK(a && l == len, "arena of %d: %p, %zu bytes", q, (void *)a, l);
        if (a) CHECK(bad_bytes(a, l, q, q, 77) == 0, "arena of rank %d reads wrong", q);
    }
    CHECK(ops->shared_map(st, nranks, &len) == NULL, "arena of a rank that does not exist");
    barrier();
}

static void timing(const char *label)
{
    if (nranks < 2) return;
    if (rank <= 1) {
        static char small[8];
        int peer = 1 - rank;
        struct req r;
        const int warm = 1000, iters = nranks > 2 ? 2000 : 20000;
        double t0 = 0;
        for (int i = 0; i < warm + iters; i++) {
            if (i == warm) t0 = now_s();
            if (rank == 0) {
                post(&r, 1, peer, 0x5000, small, 8);
                if (wait_for(&r, 1, 10000, "latency send")) return;
                post(&r, 0, peer, 0x5001, small, 8);
                if (wait_for(&r, 1, 10000, "latency recv")) return;
            } else {
                post(&r, 0, peer, 0x5000, small, 8);
                if (wait_for(&r, 1, 10000, "latency recv")) return;
                post(&r, 1, peer, 0x5001, small, 8);
                if (wait_for(&r, 1, 10000, "latency send")) return;
            }
        }
        double lat = (now_s() - t0) / iters / 2 * 1e6;
        size_t len = (size_t)64 << 20;
        unsigned char *b = xmalloc(len);
        memset(b, rank, len);
        const int reps = 6;
        char z;
        for (int i = 0; i <= reps; i++) {
            if (i == 1) t0 = now_s();
            if (rank == 0) {
                post(&r, 0, peer, 0x5002, &z, 0); /* the receive is posted */
                if (wait_for(&r, 1, 10000, "bw ready")) break;
                post(&r, 1, peer, 0x5003, b, len);
                if (wait_for(&r, 1, 20000, "bw send")) break;
            } else {
                struct req d;
                post(&d, 0, peer, 0x5003, b, len);
                post(&r, 1, peer, 0x5002, &z, 0);
                if (wait_for(&r, 1, 10000, "bw ready") || wait_for(&d, 1, 20000, "bw recv")) break;
            }
        }
        double bw = (double)len * reps / (now_s() - t0) / 1e9;
        free(b);
        if (rank == 0)
            printf("timing (%s, %d ranks): 8 B ping-pong latency %.2f us, 64 MiB one-way "
                   "bandwidth %.2f GB/s\n",
                   label, nranks, lat, bw);
        fflush(stdout);
    }
    barrier();
}

static void mismatch_test(int cma)
{
    if (rank > 1) return;
    size_t len = cma ? (1u << 20) : 100;
    unsigned char *b = xmalloc(len);
    struct req r;
    if (rank == 1) {
        fill(b, len, 1, 0, 9);
        post(&r, 1, 0, 9, b, len);
        /* The eager one completes once written; the descriptor one fails
         * when rank 0 (which gave up on us) closes. */
        wait_for(&r, 1, 10000, "mismatch send");
        CHECK(cma ? r.st != 0 : r.st == 0, "mismatch send: status %d", r.st);
    } else {
        if (cma) {
            post(&r, 0, 1, 9, b, len - 1);
        } else {
            progress_for(100); /* arrives early */
            post(&r, 0, 1, 9, b, len - 1);
        }
        wait_for(&r, 1, 10000, "mismatch recv");
        CHECK(r.st == LOOM_ERR_MISMATCH, "a receive of the wrong length: status %d", r.st);
        CHECK(nfails == 1 && fails[0].peer == 1 && fails[0].code == LOOM_ERR_MISMATCH,
              "mismatch: %d peer_failed calls (peer %d code %d)", nfails, fails[0].peer,
              fails[0].code);
    }
    free(b);
}

/* Rank 0 sends `len` bytes on tag; whether the send completes before
 * rank 1 posts its receive (which it does on rank 0's word) tells the
 * path: the cells complete a send that fits them at once, a single copy
 * waits for its reader. */
static void path_probe(uint64_t tag, size_t len, int want_done)
{
    unsigned char *b = xmalloc(len);
    struct req r, go;
    char z = 0;
    if (rank == 0) {
        fill(b, len, 0, 1, tag);
        post(&r, 1, 1, tag, b, len);
        if (want_done)
            wait_for(&r, 1, 10000, "a send through the cells");
        else {
            progress_for(200);
            CHECK(!r.done, "%zu bytes on tag %llu completed before the receive was posted: not "
                  "single-copy", len, (unsigned long long)tag);
        }
        post(&go, 1, 1, tag + 1, &z, 0);
        wait_for(&go, 1, 10000, "go");
        wait_for(&r, 1, 10000, "the send");
        CHECK(r.st == LOOM_SUCCESS, "send of %zu bytes: status %d", len, r.st);
    } else if (rank == 1) {
        post(&go, 0, 0, tag + 1, &z, 0);
        wait_for(&go, 1, 20000, "go");
        memset(b, 0, len);
        post(&r, 0, 0, tag, b, len);
        wait_for(&r, 1, 10000, "the receive");
        CHECK(r.st == LOOM_SUCCESS && !bad_bytes(b, len, 0, 1, tag),
              "receive of %zu bytes: status %d, %zu bad bytes", len, r.st,
              bad_bytes(b, len, 0, 1, tag));
    }
    free(b);
}

static void crowded_test(void)
{
    const size_t mid = 128u << 10, big = 1u << 20;
    barrier();
    CHECK(loomi_shm_cells_max(st, 1 - rank) == 64 * 1024 - 1, "cells up to %zu bytes, not 64K-1",
          loomi_shm_cells_max(st, 1 - rank));
    path_probe(7000, mid, 0);
    loomi_shm_crowded(st);
    size_t cm = loomi_shm_cells_max(st, 1 - rank);
    CHECK(cm >= mid && cm < big, "crowded: cells up to %zu bytes, not a FIFO's", cm);
    path_probe(7010, mid, 1);
    path_probe(7020, big, 0);
    barrier();
}

static void kill_test(void)
{
    int victim = nranks - 1;
    /* The victim's arena, as the engine would hold it in an operation. */
    size_t alen = 0;
    unsigned char *arena = ops->shared_map(st, victim, &alen);
    CHECK(arena && alen >= 4096, "arena of rank %d: %p, %zu bytes", victim, (void *)arena, alen);
    if (rank == victim && arena) fill(arena, 4096, victim, victim, 78);
    barrier();
    if (rank == victim) {
        usleep(200000);
        kill(getpid(), SIGKILL);
        pause();
    }
    char b[64];
    struct req r;
    double t0 = now_s();
    post(&r, 0, victim, 6000, b, sizeof b);
    wait_for(&r, 1, 5000, "receive from the killed rank");
    double dt = now_s() - t0;
    CHECK(r.done && r.st != 0, "receive from a killed rank: done %d status %d", r.done, r.st);
    CHECK(nfails >= 1 && fails[0].peer == victim && fails[0].code == LOOM_ERR_REMOTE,
          "killed rank: %d peer_failed calls (first: peer %d code %d)", nfails, fails[0].peer,
          fails[0].code);
    CHECK(nfails >= 1 && fails[0].when - t0 < 2.2, "killed rank noticed after %.2f s",
          nfails ? fails[0].when - t0 : dt);
    /* The survivors still talk to each other. */
    if (nranks > 2 && rank < victim) {
        struct req rr[2 * MAXR];
        int n = 0;
        char z;
        for (int q = 0; q < victim; q++)
            if (q != rank) {
                post(&rr[n++], 0, q, 6001, &z, 0);
                post(&rr[n++], 1, q, 6001, &z, 0);
            }
        wait_for(rr, n, 10000, "survivors");
        for (int i = 0; i < n; i++) CHECK(rr[i].st == 0, "survivors: status %d", rr[i].st);
    }
    /* The communicator goes down, as the engine takes it down after a
     * failure: what an operation still holds of the arenas stays mapped
     * until destroy (the operation unwinds after abort_all returns). */
    ops->abort_all(st, victim, LOOM_ERR_REMOTE);
    if (arena)
        CHECK(bad_bytes(arena, 4096, victim, victim, 78) == 0,
              "the dead rank's arena reads wrong after abort_all");
}

/* --------------------------------------------------------------- jobs */

struct jobspec {
    const char *name;
    int n;
    size_t cma_min;
    int fault;
    int killed; /* the last rank dies by SIGKILL */
};

static int child(const struct jobspec *j, int r, const unsigned char *key, int up, int down)
{
    rank = r;
    nranks = j->n;
    job = j->name;
    loomi_shm_fault_cma = j->fault;
    struct loomi_tctx ctx = {
        .rank = r,
        .nranks = j->n,
        .job_key = key,
        .peer_failed = on_fail,
        .sock = {.streams = 1},
        .shm = {.bytes = 1u << 20, .cma_min = j->cma_min},
    };
    if (ops->create(&ctx, &st) != LOOM_SUCCESS) {
        fprintf(stderr, "[%s] rank %d: create: %s\n", job, r, loom_get_last_error());
        return 2;
    }
    unsigned char addr[ADDR], table[MAXR * ADDR];
    size_t alen = sizeof addr;
    memset(addr, 0, sizeof addr);
    if (ops->local_addr(st, addr, &alen) != LOOM_SUCCESS || write(up, addr, ADDR) != ADDR) {
        fprintf(stderr, "[%s] rank %d: local_addr: %s\n", job, r, loom_get_last_error());
        return 2;
    }
    size_t got = 0, want = (size_t)j->n * ADDR;
    while (got < want) {
        ssize_t k = read(down, table + got, want - got);
        if (k <= 0) return 2;
        got += (size_t)k;
    }
    if (ops->connect_all(st, table, ADDR, loomi_now_ms() + 10000) != LOOM_SUCCESS) {
        fprintf(stderr, "[%s] rank %d: connect_all: %s\n", job, r, loom_get_last_error());
        return 2;
    }
    if (!strcmp(j->name, "main")) {
        barrier();
        ping_pong(1000);
        all_pairs(2000);
        reverse_tags(3000);
        cancel_test(4000);
        arena_test();
        timing("single copy from 64 KiB");
    } else if (!strcmp(j->name, "nocma")) {
        barrier();
        ping_pong(1000);
        all_pairs(2000);
        reverse_tags(3000);
        timing("copy through cells only");
    } else if (!strcmp(j->name, "fallback")) {
        barrier();
        ping_pong(1000);
        all_pairs(2000);
        reverse_tags(3000);
    } else if (!strcmp(j->name, "mismatch") || !strcmp(j->name, "mismatch-cma")) {
        mismatch_test(j->name[8] == '-');
    } else if (!strcmp(j->name, "kill")) {
        kill_test();
    } else if (!strcmp(j->name, "crowded")) {
        crowded_test();
    }
    if (strncmp(j->name, "mismatch", 8) && strcmp(j->name, "kill"))
        CHECK(nfails == 0, "%d unexpected peer_failed calls (first: peer %d code %d)", nfails,
              fails[0].peer, fails[0].code);
    ops->destroy(st);
    return failures ? 1 : 0;
}

static void random_key(unsigned char key[LOOMI_AUTH_KEY_BYTES])
{
    int fd = open("/dev/urandom", O_RDONLY);
    if (fd < 0 || read(fd, key, LOOMI_AUTH_KEY_BYTES) != LOOMI_AUTH_KEY_BYTES) {
        for (int i = 0; i < LOOMI_AUTH_KEY_BYTES; i++)
            key[i] = (unsigned char)(rand() ^ getpid() ^ i);
    }
    if (fd >= 0) close(fd);
}

/* Every rank process of every job (segment names carry the pid, not the
 * key: shm.c). */
static pid_t job_pids[64 * MAXR];
static int njob_pids;

/* Files in /dev/shm left by any rank of any job. */
static int leftovers(void)
{
    int n = 0;
    DIR *d = opendir("/dev/shm");
    if (!d) return 0;
    struct dirent *e;
    const size_t pl = strlen(LOOMI_SHM_PREFIX);
    while ((e = readdir(d)) != NULL) {
        char hex[17];
        int rank, pid;
        unsigned num;
        if (strncmp(e->d_name, LOOMI_SHM_PREFIX, pl) ||
            sscanf(e->d_name + pl, "%16[0-9a-f]-%d-%d-%u", hex, &rank, &pid, &num) != 4)
            continue;
        for (int k = 0; k < njob_pids; k++)
            if (job_pids[k] == pid) {
                fprintf(stderr, "left behind: /dev/shm/%s\n", e->d_name);
                n++;
            }
    }
    closedir(d);
    return n;
}

static int run_job(const struct jobspec *j, const unsigned char *key)
{
    int up[MAXR][2], down[MAXR][2];
    pid_t pid[MAXR];
    fflush(stdout);
    for (int i = 0; i < j->n; i++) {
        if (pipe(up[i]) || pipe(down[i])) {
            perror("pipe");
            return 1;
        }
        pid[i] = fork();
        if (pid[i] < 0) {
            perror("fork");
            return 1;
        }
        if (pid[i] == 0) {
            close(up[i][0]);
            close(down[i][1]);
            for (int k = 0; k < i; k++) close(up[k][0]), close(down[k][1]);
            _exit(child(j, i, key, up[i][1], down[i][0]));
        }
        if (njob_pids < (int)(sizeof job_pids / sizeof job_pids[0])) job_pids[njob_pids++] = pid[i];
        close(up[i][1]);
        close(down[i][0]);
    }
    unsigned char table[MAXR * ADDR];
    int bad = 0;
    for (int i = 0; i < j->n; i++) {
        struct pollfd pf = {up[i][0], POLLIN, 0};
        if (poll(&pf, 1, 10000) != 1 || read(up[i][0], table + i * ADDR, ADDR) != ADDR) {
            fprintf(stderr, "[%s] no address from rank %d\n", j->name, i);
            bad = 1;
        }
    }
    for (int i = 0; i < j->n; i++) {
        if (!bad && write(down[i][1], table, (size_t)j->n * ADDR) != (ssize_t)(j->n * ADDR))
            bad = 1;
        close(down[i][1]);
        close(up[i][0]);
    }
    int fails = bad;
    double end = now_s() + 240;
    for (int i = 0; i < j->n; i++) {
        int status = 0;
        pid_t w;
        while ((w = waitpid(pid[i], &status, WNOHANG)) == 0 && now_s() < end) usleep(10000);
        if (w == 0) {
            fprintf(stderr, "[%s] rank %d hangs: killing the job\n", j->name, i);
            for (int k = 0; k < j->n; k++) kill(pid[k], SIGKILL);
            waitpid(pid[i], &status, 0);
            fails++;
            continue;
        }
        int killed = j->killed && i == j->n - 1;
        if (killed) {
            if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL) {
                fprintf(stderr, "[%s] rank %d should have died by SIGKILL\n", j->name, i);
                fails++;
            }
        } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "[%s] rank %d: %s %d\n", j->name, i,
                    WIFEXITED(status) ? "exit" : "signal",
                    WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
            fails++;
        }
    }
    printf("%s %s on %d ranks\n", fails ? "FAILED" : "passed", j->name, j->n);
    return fails;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 2;
    if (n < 2 || n > MAXR) {
        fprintf(stderr, "usage: mp_shm NRANKS (2..%d)\n", MAXR);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    struct jobspec jobs[] = {
        {"main", n, 64 << 10, 0, 0},     {"nocma", n, 0, 0, 0},
        {"fallback", n, 64 << 10, 1, 0}, {"mismatch", 2, 64 << 10, 0, 0},
        {"mismatch-cma", 2, 64 << 10, 0, 0}, {"crowded", 2, 64 << 10, 0, 0},
        {"kill", n, 64 << 10, 0, 1},
    };
    enum { NJOBS = sizeof jobs / sizeof jobs[0] };
    unsigned char keys[NJOBS][LOOMI_AUTH_KEY_BYTES];
    int total = 0;
    for (int i = 0; i < NJOBS; i++) {
        random_key(keys[i]);
        char fake[128];
        pid_t dead = 0;
        if (i == 0) {
            /* A leftover of a process that no longer exists (a reaped
             * child's pid), under this job's key: create must remove it. */
            dead = fork();
            if (dead == 0) _exit(0);
            waitpid(dead, NULL, 0);
            snprintf(fake, sizeof fake, "/dev/shm/" LOOMI_SHM_PREFIX "0123456789abcdef-9-%d-0",
                     (int)dead);
            int fd = open(fake, O_CREAT | O_RDWR | O_CLOEXEC, 0600);
            if (fd < 0 || ftruncate(fd, 4096) != 0) {
                perror(fake);
                total++;
            }
            if (fd >= 0) close(fd);
        }
        total += run_job(&jobs[i], keys[i]);
        if (i == 0 && access(fake, F_OK) == 0) {
            fprintf(stderr, "a stale segment of dead pid %d was not removed: %s\n", (int)dead, fake);
            unlink(fake);
            total++;
        }
    }
    int left = 0;
    left += leftovers();
    if (left) fprintf(stderr, "%d segment(s) left in /dev/shm\n", left);
    total += left;
    printf("mp_shm on %d ranks: %s\n", n, total ? "FAILED" : "all passed");
    return total ? 1 : 0;
}
