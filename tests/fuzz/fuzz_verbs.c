/* The verbs transport's decoders of a peer's bytes, without an RDMA
 * device: what lands in a receive slot (on_slot: the header, then an
 * eager message or a clear-to-send), the immediate of a rendezvous write
 * (on_imm: the receive's id), the control connection (ctl_read,
 * ctl_handle: aborts, goodbyes) and the greeting with the queue pair's
 * details (loomi_verbs_hello_ok).  verbs_data.c is included so its
 * static receive path runs unchanged; the transport is built as
 * verbs_create leaves it for one peer, with no queue pair (nothing here
 * calls libibverbs: receives are eager-sized, so nothing is registered).
 *
 * Input: byte 0 odd: a greeting: [me][peer][struct hello's bytes];
 * even: records, op = byte % 5:
 *   0 slot:   [len lo][len hi][len bytes] a message of len bytes
 *             (at most a slot's) arrived in a receive slot
 *   1 post:   [tag][len lo][len hi][chk] an eager receive (tag % 4, len
 *             % (EAGER_MAX + 1), chk 0 or 0x100 + chk)
 *   2 cancel: [k] receive k (of those posted)
 *   3 ctl:    [n][n bytes] on the control connection, then read
 *   4 imm:    [4 bytes] a write's immediate (the receive's id) */
#include <stdlib.h>

#include "transports/verbs/verbs_data.c"

#include "tests/fuzz/fuzz.h"
#include "tests/fuzz/fuzz_xfer.h"

FUZZ_QUIET_INIT

#ifdef HAVE_VERBS_H

#define MAXX 16
/* Bytes held for receives not posted: small, so a message the limit
 * refuses costs no gigabyte here (the limit is a parameter). */
#define FUZZ_UNEXP ((size_t)1 << 20)

static void fuzz_hello(const uint8_t *d, size_t n)
{
    if (n < 2) return;
    int me = d[0] % 4, peer = d[1] % 4;
    struct hello h;
    memset(&h, 0, sizeof h);
    memcpy(&h, d + 2, n - 2 < sizeof h ? n - 2 : sizeof h);
    if (loomi_verbs_hello_ok(&h, me, peer) &&
        (h.src != peer || h.dst != me || h.qpn > 0xffffffu || h.psn > 0xffffffu ||
         h.mtu < IBV_MTU_256 || h.mtu > IBV_MTU_4096 || h.nrx != NRX))
        abort();
}

static void fuzz_data(const uint8_t *d, size_t size)
{
    static const unsigned char key[32] = {1, 2, 3};
    struct verbs *t = calloc(1, sizeof *t);
    if (!t) abort();
    t->ctx.rank = 0;
    t->ctx.nranks = 2;
    t->ctx.job_key = key;
    t->ctx.peer_failed = fuzz_on_fail;
    t->lfd = t->epfd = -1;
    loomi_match_init(&t->match, &t->ctx, sizeof(struct loomi_unexp), FUZZ_UNEXP,
                     loomi_verbs_match_fail, t);
    t->peers = calloc(2, sizeof *t->peers);
    if (!t->peers) abort();
    for (int r = 0; r < 2; r++) {
        t->peers[r].rank = r;
        t->peers[r].fd = -1;
    }
    struct peer *p = &t->peers[1];
    p->active = 1;
    t->npeers = 1;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv)) abort();
    p->fd = sv[0];
    char *slot = malloc(SLOT_BYTES);
    if (!slot) abort();
    struct loomi_xfer *xs[MAXX];
    int nx = 0;
    size_t off = 0;
    while (off < size && !p->failed) {
        int op = d[off++] % 5;
        if (op == 0 && size - off >= 2) {
            size_t len = (size_t)(d[off] | d[off + 1] << 8);
            off += 2;
            if (len > size - off) len = size - off;
            if (len > SLOT_BYTES) len = SLOT_BYTES;
            memcpy(slot, d + off, len);
            off += len;
            on_slot(t, p, slot, (uint32_t)len);
        } else if (op == 1 && size - off >= 4 && nx < MAXX) {
            struct loomi_xfer *x = fuzz_recv(1, d + off, EAGER_MAX);
            off += 4;
            xs[nx++] = x;
            loomi_verbs_irecv(t, x);
        } else if (op == 2 && size - off >= 1) {
            int k = d[off++];
            if (nx && !xs[k % nx]->owner) loomi_verbs_cancel(t, xs[k % nx]);
        } else if (op == 3 && size - off >= 1) {
            size_t len = d[off++];
            if (len > size - off) len = size - off;
            if (len) (void)send(sv[1], d + off, len, MSG_NOSIGNAL);
            off += len;
            ctl_read(t, p);
        } else if (op == 4 && size - off >= 4) {
            uint32_t rid;
            memcpy(&rid, d + off, 4);
            off += 4;
            on_imm(t, p, rid);
        } else {
            break;
        }
    }
    t->destroying = 1;
    loomi_verbs_peer_down(t, p, 1, LOOM_ERR_REMOTE, "the end of the input", 0);
    if (p->fd >= 0) close(p->fd);
    close(sv[1]);
    loomi_objpool_clear(&t->ops);
    loomi_match_fini(&t->match);
    free(t->peers);
    free(t);
    free(slot);
    fuzz_free_recvs(xs, nx);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    if (data[0] & 1) fuzz_hello(data + 1, size - 1);
    else fuzz_data(data + 1, size - 1);
    return 0;
}

/* ------------------------------------------------------------ seeds */

static size_t msg(unsigned char *b, uint16_t type, uint64_t tag, uint64_t len, uint64_t addr,
                  uint32_t chk, size_t payload)
{
    struct vhdr h;
    memset(&h, 0, sizeof h);
    h.magic = V_MAGIC;
    h.type = type;
    h.tag = tag;
    h.len = len;
    h.addr = addr;
    h.rkey = 0x1234;
    h.rid = 1;
    h.chk = chk;
    size_t n = sizeof h + payload;
    b[0] = 0;
    b[1] = (unsigned char)n;
    b[2] = (unsigned char)(n >> 8);
    memcpy(b + 3, &h, sizeof h);
    for (size_t i = 0; i < payload; i++) b[3 + sizeof h + i] = (unsigned char)i;
    return 3 + n;
}

static size_t post(unsigned char *b, int tag, size_t len, int chk)
{
    b[0] = 1;
    b[1] = (unsigned char)tag;
    b[2] = (unsigned char)len;
    b[3] = (unsigned char)(len >> 8);
    b[4] = (unsigned char)chk;
    return 5;
}

int fuzz_seeds(const char *dir)
{
    static unsigned char b[4 * SLOT_BYTES];
    int bad = 0;
    size_t n = 0;
    b[n++] = 0;
    n += post(b + n, 1, 100, 0);
    n += msg(b + n, T_EAGER, 1, 100, 0, 0, 100);
    n += msg(b + n, T_EAGER, 2, 10, 0, 0x105, 10);
    n += post(b + n, 2, 10, 5);
    bad |= fuzz_write_seed(dir, "eager", b, n);
    n = 0;
    b[n++] = 0;
    n += msg(b + n, T_EAGER, 3, EAGER_MAX, 0, 0, EAGER_MAX);
    n += post(b + n, 3, EAGER_MAX, 0);
    bad |= fuzz_write_seed(dir, "eager-max", b, n);
    n = 0;
    b[n++] = 0;
    n += post(b + n, 0, 64, 0);
    b[n++] = 2;
    b[n++] = 0;
    n += msg(b + n, T_EAGER, 0, 64, 0, 0, 64);
    bad |= fuzz_write_seed(dir, "cancelled", b, n);
    n = 0;
    b[n++] = 0;
    n += msg(b + n, T_CTS, 1, EAGER_MAX + 1, 0x10000, 0, 0);
    n += msg(b + n, T_CTS, 1, (uint64_t)1 << 30, UINT64_MAX - 5, 0, 0);
    bad |= fuzz_write_seed(dir, "cts", b, n);
    n = 0;
    b[n++] = 0;
    n += msg(b + n, T_EAGER, 1, 5, 0, 0, 4); /* length and payload differ */
    bad |= fuzz_write_seed(dir, "eager-bad", b, n);
    struct ctlmsg c = {CTL_MAGIC, C_ABORT, 0, LOOM_ERR_REVOKED, 1};
    n = 0;
    b[n++] = 0;
    b[n++] = 3;
    b[n++] = sizeof c;
    memcpy(b + n, &c, sizeof c);
    n += sizeof c;
    bad |= fuzz_write_seed(dir, "ctl-abort", b, n);
    c.type = C_BYE;
    memcpy(b + 3, &c, sizeof c);
    b[n++] = 3;
    b[n++] = 0;
    bad |= fuzz_write_seed(dir, "ctl-bye", b, n);
    n = 0;
    b[n++] = 0;
    b[n++] = 4;
    uint32_t rid = 5u << 16 | 3;
    memcpy(b + n, &rid, 4);
    n += 4;
    bad |= fuzz_write_seed(dir, "imm", b, n);
    struct hello h;
    memset(&h, 0, sizeof h);
    h.magic = HELLO_MAGIC;
    h.src = 1;
    h.dst = 0;
    h.qpn = 0x123;
    h.psn = 0xabcdef;
    h.lid = 7;
    h.link_layer = IBV_LINK_LAYER_ETHERNET;
    h.mtu = IBV_MTU_1024;
    h.cred_addr = 0x7f0000001000ull;
    h.cred_rkey = 0x55;
    h.nrx = NRX;
    b[0] = 1;
    b[1] = 0;
    b[2] = 1;
    memcpy(b + 3, &h, sizeof h);
    bad |= fuzz_write_seed(dir, "hello", b, 3 + sizeof h);
    h.qpn = 0x1000000;
    memcpy(b + 3, &h, sizeof h);
    bad |= fuzz_write_seed(dir, "hello-qpn", b, 3 + sizeof h);
    return bad ? -1 : 0;
}

#else /* no infiniband/verbs.h: nothing to fuzz */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    (void)data, (void)size;
    return 0;
}

int fuzz_seeds(const char *dir)
{
    (void)dir;
    return 0;
}

#endif
