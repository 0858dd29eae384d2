/* The rendezvous: hellos as the root judges them (judge(), as
 * root_main() calls it on each new registration), a hello that comes to
 * a running job's join service (loomi_boot_late_hello), and the root's
 * reply and address table as a rank reads them (loomi_boot_exchange,
 * over a socketpair).  bootstrap.c is included so its static root code
 * is reached without changing it.
 *
 * Input: byte 0 picks the decoder (0 root, 1 late hello, 2 reply) and
 * byte 1 the job size (1-16 ranks; 0: root's size set by the first
 * hello); then the bytes: for the root, hellos one after another (the
 * last may be short); otherwise one message. */
#include "src/comm/bootstrap.c"

#include <fcntl.h>

#include "tests/fuzz/fuzz.h"

FUZZ_QUIET_INIT

static void fuzz_root(const uint8_t *d, size_t n, int nranks)
{
    enum { MAXC = 32 };
    struct root_args *a = calloc(1, sizeof *a);
    struct root_client *cl = calloc(MAXC, sizeof *cl);
    int *by_rank = NULL, registered = 0, nc = 0;
    if (!a || !cl) abort();
    memset(a->key, 0x5a, sizeof a->key);
    a->keyed = nranks & 1;
    a->nranks = nranks;
    a->lfd = -1;
    snprintf(a->name, sizeof a->name, "fuzz:0");
    for (size_t off = 0; off < n && nc < MAXC; off += sizeof(struct boot_hello), nc++) {
        struct root_client *c = &cl[nc];
        size_t k = n - off < sizeof c->h ? n - off : sizeof c->h;
        c->rank = -1;
        c->fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
        if (c->fd < 0) abort();
        memcpy(&c->h, d + off, k);
        c->got = k;
        /* As root_main: judged once complete, or early by its version. */
        const struct boot_hello *h = &c->h;
        const int early = c->got >= 2 * sizeof(uint32_t) &&
                          (h->magic != BOOT_MAGIC || h->version != BOOT_VERSION);
        if (c->got < sizeof c->h && !early) continue;
        c->h.host[sizeof c->h.host - 1] = '\0';
        if (!judge(a, cl, nc, &by_rank, &registered, early)) {
            if (c->fd >= 0) close(c->fd);
            c->fd = -1;
        }
    }
    /* Everyone here: the settings compared, as root_main does. */
    if (a->nranks > 0 && registered == a->nranks && !a->refused) {
        char msg[sizeof ((struct boot_reply *)0)->msg];
        for (int j = 1; j < a->nranks; j++)
            loomi_uniform_diff(&cl[by_rank[0]].h.uniform, "rank 0", &cl[by_rank[j]].h.uniform,
                               "rank j", msg, sizeof msg);
    }
    for (int i = 0; i < nc; i++)
        if (cl[i].fd >= 0) close(cl[i].fd);
    free(by_rank);
    free(cl);
    free(a);
}

static void fuzz_late(const uint8_t *d, size_t n, int keyed)
{
    char why[256];
    int fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (fd < 0) abort();
    loomi_boot_late_hello(fd, d, n, keyed, "fuzz:0", why, sizeof why);
    close(fd);
}

static void fuzz_reply(const uint8_t *d, size_t n, int nranks)
{
    int sv[2];
    if (n > 32768) n = 32768; /* what the socket holds at once */
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv)) abort();
    int sz = 1 << 20;
    setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
    setsockopt(sv[0], SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
    if (n && write(sv[1], d, n) != (ssize_t)n) abort();
    shutdown(sv[1], SHUT_WR);
    struct loomi_boot_target t;
    memset(&t, 0, sizeof t);
    snprintf(t.host, sizeof t.host, "fuzz");
    snprintf(t.port, sizeof t.port, "0");
    memset(t.job_key, 0x5a, sizeof t.job_key);
    struct loomi_uniform u;
    memset(&u, 0, sizeof u);
    unsigned char addr[LOOMI_ADDR_BYTES] = {0};
    unsigned char *all = calloc((size_t)nranks, LOOMI_ADDR_BYTES);
    if (!all) abort();
    /* Closes sv[0]. */
    loomi_boot_exchange(sv[0], &t, 0, nranks, addr, sizeof addr, &u, all,
                        loomi_now_ms() + 2000);
    free(all);
    close(sv[1]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2) return 0;
    int nranks = data[1] % 17;
    switch (data[0] % 3) {
    case 0: fuzz_root(data + 2, size - 2, nranks); break;
    case 1: fuzz_late(data + 2, size - 2, nranks & 1); break;
    default: fuzz_reply(data + 2, size - 2, nranks ? nranks : 1); break;
    }
    return 0;
}

/* Seeds: a job of 1, 2 and 3 ranks registering (and one twice, one of
 * another version, one out of range), late hellos, and the root's
 * replies: a table, a refusal, a timeout. */
int fuzz_seeds(const char *dir)
{
    struct loomi_boot_target t;
    memset(&t, 0, sizeof t);
    memset(t.job_key, 0x5a, sizeof t.job_key);
    unsigned char buf[2 + 4 * sizeof(struct boot_hello)];
    for (int nr = 1; nr <= 3; nr++) {
        for (int var = 0; var < 4; var++) {
            buf[0] = 0;
            buf[1] = (unsigned char)(var == 3 ? 0 : nr);
            size_t len = 2;
            for (int r = 0; r < nr + (var == 1); r++) {
                struct boot_hello h;
                hello_init(&h, &t, nr, var == 1 && r == nr ? 0 : r);
                snprintf(h.host, sizeof h.host, "host%d", r);
                h.pid = 100 + r;
                h.addr_len = 16;
                if (var == 2 && r == 1) h.version = 4;
                if (var == 2 && r == 0) h.rank = -1;
                if (var == 3 && r == 1) h.uniform.chunk_bytes = 7;
                memcpy(buf + len, &h, sizeof h);
                len += sizeof h;
            }
            char name[32];
            snprintf(name, sizeof name, "root-%d-%d", nr, var);
            if (fuzz_write_seed(dir, name, buf, len)) return -1;
        }
    }
    struct boot_hello h;
    hello_init(&h, &t, 4, 2);
    buf[0] = 1;
    buf[1] = 1;
    memcpy(buf + 2, &h, sizeof h);
    if (fuzz_write_seed(dir, "late-same-key", buf, 2 + sizeof h)) return -1;
    h.flags = BOOT_F_CONFLICT;
    memcpy(buf + 2, &h, sizeof h);
    if (fuzz_write_seed(dir, "late-conflict", buf, 2 + sizeof h)) return -1;
    if (fuzz_write_seed(dir, "late-short", buf, 2 + 12)) return -1;
    for (int k = 0; k < 3; k++) {
        unsigned char rep[2 + sizeof(struct boot_reply) + 3 * LOOMI_ADDR_BYTES];
        memset(rep, 0, sizeof rep);
        struct boot_reply rp;
        memset(&rp, 0, sizeof rp);
        rp.magic = BOOT_MAGIC;
        rp.code = k == 0 ? LOOM_SUCCESS : k == 1 ? LOOM_ERR_MISMATCH : LOOM_ERR_TIMEOUT;
        rp.nranks = 3;
        rp.whole = k == 1;
        snprintf(rp.msg, sizeof rp.msg, "reply %d", k);
        rep[0] = 2;
        rep[1] = 3;
        memcpy(rep + 2, &rp, sizeof rp);
        char name[32];
        snprintf(name, sizeof name, "reply-%d", k);
        if (fuzz_write_seed(dir, name, rep, k ? 2 + sizeof rp : sizeof rep)) return -1;
    }
    return 0;
}
