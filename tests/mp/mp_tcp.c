/*
 * mp_tcp.c - the TCP transport driven directly through loomi_tcp_ops by
 * two forked processes: what a cancelled send leaves to the transport.
 *
 * transport.h: once cancel() returns, the transfer's buffer is the
 * caller's again.  Rank 0 sends 32 MiB to rank 1, which is not reading,
 * so the message is half on the wire when rank 0 cancels it; rank 0 then
 * overwrites the buffer (and frees it) as an engine would.  The stream
 * must still carry the message's own bytes to its end: rank 1 posts its
 * receive late and checks every byte.  Before the fix the rest of the
 * message was read from the buffer after cancel: rank 1 received the
 * overwritten bytes (and ASan reports a use after free).
 * Exit 0 when rank 1 got the original bytes; 1 otherwise; 2 on setup.
 */
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/internal.h"
#include "transports/auth.h"
#include "transports/transport.h"

#define ADDR 128
#define BIG ((size_t)32 << 20)
#define TAG_BIG 7
#define TAG_DONE 8

static void on_fail(void *owner, int peer, int failed, loom_result_t code, const char *why)
{
    (void)owner, (void)failed;
    fprintf(stderr, "mp_tcp: peer %d failed: %s (%s)\n", peer, loom_strerror(code), why);
}

struct wait {
    int done;
    loom_result_t status;
};

static void complete(struct loomi_xfer *x, loom_result_t status)
{
    struct wait *w = x->owner;
    w->done = 1;
    w->status = status;
}

/* Progress until *done or ms pass; 1 when done. */
static int progress_until(const struct loomi_transport_ops *ops, void *st, const int *done,
                          int ms)
{
    uint64_t end = loomi_now_ms() + (uint64_t)ms;
    while (!*done && loomi_now_ms() < end) ops->progress(st, 10);
    return *done;
}

static unsigned char pattern(size_t i)
{
    return (unsigned char)(i * 131 + (i >> 12));
}

static int child(int rank, const unsigned char *key, int up, int down)
{
    const struct loomi_transport_ops *ops = &loomi_tcp_ops;
    struct loomi_tctx ctx = {
        .rank = rank,
        .nranks = 2,
        .job_key = key,
        .peer_failed = on_fail,
        /* Small socket buffers: most of the message waits in the piece. */
        .sock = {.streams = 1, .sockbuf = 65536},
    };
    void *st = NULL;
    unsigned char addr[ADDR] = {0}, table[2 * ADDR];
    size_t alen = sizeof addr;
    if (ops->create(&ctx, &st) != LOOM_SUCCESS || ops->local_addr(st, addr, &alen) ||
        write(up, addr, ADDR) != ADDR) {
        fprintf(stderr, "mp_tcp: rank %d: create: %s\n", rank, loom_get_last_error());
        return 2;
    }
    size_t got = 0;
    while (got < sizeof table) {
        ssize_t k = read(down, table + got, sizeof table - got);
        if (k <= 0) return 2;
        got += (size_t)k;
    }
    if (ops->connect_all(st, table, ADDR, loomi_now_ms() + 10000) != LOOM_SUCCESS) {
        fprintf(stderr, "mp_tcp: rank %d: connect_all: %s\n", rank, loom_get_last_error());
        return 2;
    }
    int rc = 0;
    unsigned char *buf = malloc(BIG);
    unsigned char verdict = 0;
    struct wait wd = {0, LOOM_SUCCESS};
    struct loomi_xfer xd = {.peer = 1 - rank, .tag = TAG_DONE, .buf = &verdict, .len = 1,
                            .complete = complete, .owner = &wd};
    if (!buf) return 2;
    if (rank == 0) {
        for (size_t i = 0; i < BIG; i++) buf[i] = pattern(i);
        struct wait ws = {0, LOOM_SUCCESS};
        struct loomi_xfer xs = {.peer = 1, .tag = TAG_BIG, .buf = buf, .len = BIG,
                                .complete = complete, .owner = &ws};
        if (ops->isend(st, &xs) != LOOM_SUCCESS) return 2;
        for (int k = 0; k < 20; k++) ops->progress(st, 1);
        if (ws.done) {
            fprintf(stderr, "mp_tcp: the 32 MiB send completed unread: the test proves nothing\n");
            return 2;
        }
        ops->cancel(st, &xs);
        /* The buffer is ours again: reuse it, then give it back. */
        memset(buf, 0xee, BIG);
        free(buf);
        buf = NULL;
        if (ops->irecv(st, &xd) != LOOM_SUCCESS || !progress_until(ops, st, &wd.done, 30000)) {
            fprintf(stderr, "mp_tcp: rank 0: no verdict from rank 1\n");
            rc = 1;
        } else if (wd.status != LOOM_SUCCESS || verdict != 1) {
            rc = 1;
        }
        if (ws.done) {
            fprintf(stderr, "mp_tcp: the cancelled send completed\n");
            rc = 1;
        }
    } else {
        /* Read nothing until the sender has cancelled and reused its buffer. */
        usleep(300 * 1000);
        memset(buf, 0, BIG);
        struct wait wr = {0, LOOM_SUCCESS};
        struct loomi_xfer xr = {.peer = 0, .tag = TAG_BIG, .buf = buf, .len = BIG,
                                .complete = complete, .owner = &wr};
        if (ops->irecv(st, &xr) != LOOM_SUCCESS || !progress_until(ops, st, &wr.done, 30000)) {
            fprintf(stderr, "mp_tcp: rank 1: the message never ended\n");
            rc = 1;
        } else if (wr.status != LOOM_SUCCESS) {
            fprintf(stderr, "mp_tcp: rank 1: receive failed: %s\n", loom_strerror(wr.status));
            rc = 1;
        } else {
            size_t bad = 0, first = BIG;
            for (size_t i = 0; i < BIG; i++)
                if (buf[i] != pattern(i) && bad++ == 0) first = i;
            if (bad) {
                fprintf(stderr,
                        "mp_tcp: rank 1: %zu of %zu bytes differ from the message sent, from "
                        "byte %zu (0x%02x): the rest was read from the buffer after cancel\n",
                        bad, BIG, first, buf[first]);
                rc = 1;
            }
        }
        verdict = rc == 0;
        struct wait ws = {0, LOOM_SUCCESS};
        xd.complete = complete;
        xd.owner = &ws;
        if (ops->isend(st, &xd) != LOOM_SUCCESS || !progress_until(ops, st, &ws.done, 10000))
            rc = 1;
    }
    free(buf);
    ops->destroy(st);
    return rc;
}

int main(void)
{
    unsigned char key[LOOMI_AUTH_KEY_BYTES]; /* as transport.h's job_key */
    for (int i = 0; i < (int)sizeof key; i++) key[i] = (unsigned char)(getpid() * 31 + i * 7);
    int up[2][2], down[2][2];
    pid_t pid[2];
    for (int i = 0; i < 2; i++) {
        if (pipe(up[i]) || pipe(down[i])) return 2;
        fflush(stdout);
        pid[i] = fork();
        if (pid[i] < 0) return 2;
        if (pid[i] == 0) {
            close(up[i][0]);
            close(down[i][1]);
            alarm(120);
            _exit(child(i, key, up[i][1], down[i][0]));
        }
        close(up[i][1]);
        close(down[i][0]);
    }
    unsigned char table[2 * ADDR];
    int bad = 0;
    for (int i = 0; i < 2; i++) {
        struct pollfd pf = {up[i][0], POLLIN, 0};
        if (poll(&pf, 1, 10000) != 1 || read(up[i][0], table + i * ADDR, ADDR) != ADDR) bad = 1;
    }
    for (int i = 0; i < 2; i++) {
        if (!bad && write(down[i][1], table, sizeof table) != (ssize_t)sizeof table) bad = 1;
        close(down[i][1]);
        close(up[i][0]);
    }
    int rc = bad ? 2 : 0;
    for (int i = 0; i < 2; i++) {
        int status = 0;
        waitpid(pid[i], &status, 0);
        int r = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
        if (!WIFEXITED(status))
            fprintf(stderr, "mp_tcp: rank %d died of signal %d\n", i, WTERMSIG(status));
        if (r > rc) rc = r;
    }
    printf("mp_tcp: a send cancelled half on the wire: %s\n",
           rc == 0 ? "the receiver got every byte of the message" : "FAILED");
    return rc;
}
