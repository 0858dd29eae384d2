/* Control-plane frames: what peers write on their control connections,
 * read and acted on by peer_read() and handle() (heartbeats, failure
 * notices, revocations, agreement queries, membership messages for the
 * mailbox, and a joiner's first message, or a rendezvous hello that
 * came to the join service).  ctrl.c is included so its static reader
 * is reached unchanged; the peers are socketpairs.
 *
 * This rank is 0 of 4; peers 1-3 are ranks, then the join service's
 * slots: 4 a connection that has not proven itself (J_AUTH: everything
 * it sends goes to the handshake), 5 a joiner that passed a real
 * handshake (loomi_auth_open on the far end, in a thread) and has not
 * yet asked to join, 6 a rank that proved itself for a rendezvous hello
 * (the late hello), 7 a joiner admitted.  Input: records of [who][len lo]
 * [len hi][len bytes]: the bytes are written to peer (who % 8)'s end and
 * read as the control thread would; who & 0x80 closes that end first
 * (the peer went away after them). */
#include "src/comm/ctrl.c"

#include "tests/fuzz/fuzz.h"

FUZZ_QUIET_INIT

#define NR 4
#define NP (NR + 4)

static const unsigned char fuzz_key[32] = {0x5a, 0x5a, 0x5a, 0x5a};

struct opener {
    int fd, rc;
};

static void *open_main(void *arg)
{
    struct opener *o = arg;
    const struct loomi_auth_id id = {LOOMI_AUTH_JOIN, -1, -1, 0};
    char msg[200];
    o->rc = loomi_auth_open(o->fd, fuzz_key, &id, loomi_now_ms() + 5000, NULL, msg, sizeof msg);
    return NULL;
}

/* A joiner's real handshake on slot q (J_AUTH), the join service's
 * side stepped as the control thread does: J_HELLO after it. */
static void handshake(struct loomi_ctrl *c, int q, int far)
{
    struct opener o = {far, -1};
    pthread_t th;
    if (pthread_create(&th, NULL, open_main, &o)) abort();
    while (c->p[q].jstate == J_AUTH) {
        struct pollfd pf = {c->p[q].fd, POLLIN, 0};
        int k = poll(&pf, 1, 5000);
        if (k < 0 && errno == EINTR) continue; /* libFuzzer's timer */
        if (k <= 0) abort();
        pthread_mutex_lock(&c->mu);
        peer_read(c, q, loomi_now_ms());
        pthread_mutex_unlock(&c->mu);
    }
    pthread_join(th, NULL);
    if (o.rc || c->p[q].jstate != J_HELLO || c->p[q].auth.id.kind != LOOMI_AUTH_JOIN) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct loomi_ctrl *c;
    if (loomi_ctrl_create(0, NR, fuzz_key, 1000, (struct sockaddr *)&sa, sizeof sa, &c)) abort();
    int far[NP];
    for (int q = 1; q < NP; q++) {
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv)) abort();
        int sz = 1 << 20;
        setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
        c->p[q].fd = sv[0];
        far[q] = sv[1];
    }
    /* The join service's slots, as accept_joiner() leaves them. */
    for (int q = NR; q < NP; q++) {
        c->p[q].jstate = J_AUTH;
        loomi_auth_accept_init(&c->p[q].auth, 1u << LOOMI_AUTH_JOIN | 1u << LOOMI_AUTH_BOOT, -1);
        c->p[q].jsince = c->p[q].last_heard_ms = loomi_now_ms();
    }
    handshake(c, NR + 1, far[NR + 1]);
    /* Past the handshake, as peer_read leaves a slot once
     * loomi_auth_accept_step succeeds (a rendezvous hello's), and one
     * admitted later. */
    c->p[NR + 2].jstate = J_HELLO;
    c->p[NR + 2].auth.phase = 2;
    c->p[NR + 2].auth.id = (struct loomi_auth_id){LOOMI_AUTH_BOOT, 3, -1, 0};
    c->p[NR + 3].jstate = J_ADMITTED;
    c->p[NR + 3].auth.phase = 2;
    c->p[NR + 3].auth.id = (struct loomi_auth_id){LOOMI_AUTH_JOIN, -1, -1, 0};
    size_t off = 0;
    while (size - off >= 3) {
        int who = data[off] % NP, eof = data[off] & 0x80;
        size_t len = (size_t)(data[off + 1] | data[off + 2] << 8);
        off += 3;
        if (len > size - off) len = size - off;
        if (who == 0 || c->p[who].fd < 0 || far[who] < 0) {
            off += len;
            continue;
        }
        if (len) (void)send(far[who], data + off, len, MSG_NOSIGNAL); /* gone: EPIPE */
        off += len;
        if (eof) {
            close(far[who]);
            far[who] = -1;
        }
        pthread_mutex_lock(&c->mu);
        peer_read(c, who, loomi_now_ms());
        pthread_mutex_unlock(&c->mu);
    }
    for (int q = 1; q < NP; q++)
        if (far[q] >= 0) close(far[q]);
    loomi_ctrl_destroy(c, 0);
    return 0;
}

/* One record: message (type, arg, payload) from peer q, as queue_msg
 * frames it. */
static size_t rec(unsigned char *b, int q, uint16_t type, uint32_t src, uint64_t arg,
                  const void *pl, uint32_t len)
{
    size_t n = HDR_BYTES + len;
    b[0] = (unsigned char)q;
    b[1] = (unsigned char)n;
    b[2] = (unsigned char)(n >> 8);
    unsigned char *h = b + 3;
    memset(h, 0, HDR_BYTES);
    put32(h, CTRL_MSG_MAGIC);
    h[4] = (unsigned char)type;
    h[5] = (unsigned char)(type >> 8);
    put32(h + 8, src);
    put32(h + 12, 1);
    put64(h + 16, arg);
    put32(h + 24, len);
    if (len) memcpy(h + HDR_BYTES, pl, len);
    return 3 + n;
}

int fuzz_seeds(const char *dir)
{
    unsigned char b[4096], key[16];
    unsigned char pl[64];
    memset(key, 0x5a, sizeof key);
    memset(pl, 7, sizeof pl);
    size_t n = 0;
    n += rec(b + n, 1, T_HB, 1, 0, NULL, 0);
    n += rec(b + n, 2, T_PENDING, 2, 3, NULL, 0);
    n += rec(b + n, 3, T_AGREE_QUERY, 3, 9, NULL, 0);
    n += rec(b + n, 1, LOOMI_CMSG_AGREE, 1, 9, pl, 24);
    n += rec(b + n, 2, LOOMI_CMSG_GIVEUP, 2, 1, pl, 8);
    if (fuzz_write_seed(dir, "mix", b, n)) return -1;
    n = rec(b, 2, T_FAILED, 2, 3, NULL, 0);
    if (fuzz_write_seed(dir, "failed", b, n)) return -1;
    n = rec(b, 3, T_REVOKE, 3, 5 | (UINT64_C(2) << 32), NULL, 0);
    if (fuzz_write_seed(dir, "revoke", b, n)) return -1;
    n = rec(b, 1, T_BYE, 1, 0, NULL, 0);
    b[0] |= 0x80;
    if (fuzz_write_seed(dir, "bye-close", b, n)) return -1;
    n = rec(b, NR + 1, T_JOIN, 0, 0, NULL, 0);
    n += rec(b + n, NR + 1, T_HB, 0, 0, NULL, 0);
    if (fuzz_write_seed(dir, "join", b, n)) return -1;
    n = rec(b, NR + 1, T_JOIN, 0, 0, key, 16); /* a payload: refused */
    if (fuzz_write_seed(dir, "join-payload", b, n)) return -1;
    n = rec(b, NR, T_JOIN, 0, 0, NULL, 0); /* before the handshake */
    if (fuzz_write_seed(dir, "join-unproven", b, n)) return -1;
    n = rec(b, NR + 3, LOOMI_CMSG_ADDR, 0, 0, pl, 40);
    n += rec(b + n, NR + 3, LOOMI_CMSG_MAX, 0, 0, pl, 40);
    if (fuzz_write_seed(dir, "admitted", b, n)) return -1;
    /* Split: a header in two reads. */
    n = rec(b, 1, T_HB, 1, 0, NULL, 0);
    unsigned char s[64];
    memcpy(s, b, 3 + 10);
    s[1] = 10;
    s[2] = 0;
    s[13] = 1;
    s[14] = HDR_BYTES - 10;
    s[15] = 0;
    memcpy(s + 16, b + 13, HDR_BYTES - 10);
    if (fuzz_write_seed(dir, "split", s, 16 + HDR_BYTES - 10)) return -1;
    /* A rendezvous hello at the join service, after its handshake
     * (bootstrap.c: "LMBT", version 6), and one of an old version. */
    unsigned char hb[3 + 8] = {NR + 2, 8, 0};
    put32(hb + 3, 0x4c4d4254u);
    put32(hb + 7, 6);
    if (fuzz_write_seed(dir, "late-hello", hb, sizeof hb)) return -1;
    put32(hb + 7, 5);
    if (fuzz_write_seed(dir, "late-hello-v5", hb, sizeof hb)) return -1;
    /* An OPEN's start at the unproven slot. */
    unsigned char ob[3 + 12] = {NR, 12, 0};
    put32(ob + 3, 0x4c4d414fu);
    put32(ob + 7, 1);
    put32(ob + 11, LOOMI_AUTH_JOIN);
    return fuzz_write_seed(dir, "open-start", ob, sizeof ob);
}
