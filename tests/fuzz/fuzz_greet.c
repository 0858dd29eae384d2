/* The greeting tcp and verbs read on each connection a higher rank opens
 * (loomi_accept_greeting, net.c): the handshake, then the greeting's
 * bytes, judged against the rank the opener proved to be.  A loopback
 * listening socket; the opener is a thread that connects, and either
 * passes a real handshake (loomi_auth_open) for the identity the input
 * names and then sends the input's greeting, or sends the input's bytes
 * raw (a stranger).  Oracle: a connection taken comes from the rank it
 * proved, with the magic, above this rank and below the job's size.
 *
 * Input: [flags: bit 0 raw, bit 1 the proof's kind is verbs (else tcp),
 * bit 2 the job's public key][src][dst][nranks][this rank]
 * [the greeting's or the raw bytes]. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/internal.h"
#include "transports/auth.h"
#include "transports/net.h"
#include "tests/fuzz/fuzz.h"

FUZZ_QUIET_INIT

#define MAGIC 0x4c4d4854u /* a greeting's magic (any: the harness wants it) */

struct opener {
    struct sockaddr_in sa;
    const unsigned char *key;
    struct loomi_auth_id id;
    int raw, unconnected;
    const uint8_t *d;
    size_t n;
    _Atomic int done; /* the opener has seen the acceptor's verdict */
};

/* The acceptor's guard: once the opener is done, no connection comes. */
static int opener_done(void *arg, char *msg, size_t n)
{
    struct opener *o = arg;
    if (!o->done) return 0;
    snprintf(msg, n, "the opener is done");
    return 1;
}

static void *open_main(void *arg)
{
    struct opener *o = arg;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) abort();
    if (connect(fd, (struct sockaddr *)&o->sa, sizeof o->sa) == 0) {
        char msg[200];
        uint64_t d = loomi_now_ms() + 2000;
        if (o->raw || loomi_auth_open(fd, o->key, &o->id, d, NULL, msg, sizeof msg) == 0)
            if (o->n) loomi_write_full(fd, o->d, o->n, d);
        shutdown(fd, SHUT_WR);
        char b[256];
        while (read(fd, b, sizeof b) > 0) {} /* until the acceptor is done */
    } else {
        o->unconnected = 1; /* the host's ports, not the code under test */
    }
    close(fd);
    o->done = 1;
    return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int lfd = -1;
    static struct sockaddr_in sa;
    if (size < 5) return 0;
    if (lfd < 0) {
        lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        memset(&sa, 0, sizeof sa);
        sa.sin_family = AF_INET;
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t sl = sizeof sa;
        if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof sa) || listen(lfd, 16) ||
            getsockname(lfd, (struct sockaddr *)&sa, &sl))
            abort();
    }
    static const unsigned char secret[LOOMI_AUTH_SECRET_MIN] = {0x5a, 7};
    unsigned char key[LOOMI_AUTH_KEY_BYTES];
    loomi_auth_key(secret, data[0] & 4 ? 0 : sizeof secret, key);
    const uint32_t kind = data[0] & 2 ? LOOMI_AUTH_VERBS : LOOMI_AUTH_TCP;
    const int nranks = 1 + data[3] % 8, me = data[4] % 8;
    struct opener o = {sa, key, {kind, (int8_t)data[1], (int8_t)data[2], 0}, data[0] & 1, 0,
                       data + 5, size - 5, 0};
    if (o.n > 4096) o.n = 4096;
    pthread_t th;
    if (pthread_create(&th, NULL, open_main, &o)) abort();
    unsigned char hello[20];
    char why[200];
    struct loomi_acceptor ac;
    loomi_acceptor_init(&ac, lfd, MAGIC, me, "fuzz");
    loomi_guard_set(opener_done, &o);
    int fd = loomi_accept_greeting(&ac, me + 1, nranks, key, LOOMI_AUTH_TCP, hello, sizeof hello,
                                   NULL, loomi_now_ms() + 5000, why, sizeof why);
    loomi_guard_set(NULL, NULL);
    loomi_acceptor_close(&ac);
    if (fd >= 0) {
        struct loomi_greeting g;
        memcpy(&g, hello, sizeof g);
        if (o.raw || kind != LOOMI_AUTH_TCP || g.magic != MAGIC || g.dst != me ||
            g.src != o.id.src || g.src <= me || g.src >= nranks || o.n < sizeof hello)
            abort();
        close(fd);
    }
    pthread_join(th, NULL);
    if (fd == -3 && !o.unconnected) abort(); /* a connection came, in time: no deadline */
    return 0;
}

int fuzz_seeds(const char *dir)
{
    unsigned char b[5 + 20];
    uint32_t g[5] = {MAGIC, 2, 1, 0, 2}; /* magic, src, dst, stream, nstreams */
    b[0] = 0;
    b[1] = 2;
    b[2] = 1;
    b[3] = 4;
    b[4] = 1;
    memcpy(b + 5, g, sizeof g);
    int bad = fuzz_write_seed(dir, "tcp-ok", b, sizeof b);
    b[0] = 4;
    bad |= fuzz_write_seed(dir, "tcp-ok-public", b, sizeof b);
    b[0] = 2;
    bad |= fuzz_write_seed(dir, "verbs-kind", b, sizeof b);
    b[0] = 0;
    bad |= fuzz_write_seed(dir, "short", b, sizeof b - 4);
    b[1] = 3; /* proves rank 3, greets as 2 */
    bad |= fuzz_write_seed(dir, "wrong-src", b, sizeof b);
    b[1] = 2;
    b[3] = 1; /* rank 2 of a job of 2 */
    bad |= fuzz_write_seed(dir, "beyond", b, sizeof b);
    b[3] = 4;
    b[0] = 1; /* raw: no handshake */
    bad |= fuzz_write_seed(dir, "raw", b, sizeof b);
    return bad ? -1 : 0;
}
