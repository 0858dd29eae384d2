/* TCP stream parsing, stateful: this rank (0 of 3) reads two peers over
 * three streams each (two data streams and the control stream), every
 * stream a socketpair, with receives posted and cancelled between the
 * reads, so pieces of one message arrive on several streams in any
 * order, early (buffered) or into a posted receive, and headers and
 * payloads split anywhere.  tcp.c and tcp_data.c are included so the
 * static receive path (stream_read, handle_header, tcp_irecv,
 * tcp_cancel) is driven unchanged.
 *
 * Input: records, by op = byte 0 % 4:
 *   0 bytes:  [peer][stream][len lo][len hi][len bytes] written to that
 *             stream's far end, then read as progress() would
 *   1 post:   [peer][tag][len lo][len hi][chk] a receive (tag % 4, len
 *             % 4097, chk 0 or 0x100 + chk)
 *   2 cancel: [k] receive k (of those posted)
 *   3 close:  [peer][stream] the far end closes, then it is read */
#include "transports/tcp/tcp.c"
#include "transports/tcp/tcp_data.c"

#include "tests/fuzz/fuzz.h"
#include "tests/fuzz/fuzz_xfer.h"

FUZZ_QUIET_INIT

#define NR 3
#define NS 2
#define MAXX 16

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t size)
{
    static const unsigned char key[16] = {1, 2, 3};
    struct loomi_tctx ctx;
    memset(&ctx, 0, sizeof ctx);
    ctx.rank = 0;
    ctx.nranks = NR;
    ctx.job_key = key;
    ctx.peer_failed = fuzz_on_fail;
    ctx.sock.streams = NS;
    struct tcp *t = calloc(1, sizeof *t);
    if (!t) abort();
    /* As loomi_tcp_create, without the listening socket. */
    t->ctx = ctx;
    loomi_match_init(&t->match, &t->ctx, sizeof(struct unexp), UNEXP_LIMIT, loomi_tcp_match_fail,
                     t);
    t->nstreams = NS;
    t->lfd = t->epfd = -1;
    t->peers = calloc(NR, sizeof *t->peers);
    if (!t->peers) abort();
    int far[NR][NS + 1];
    for (int r = 0; r < NR; r++) {
        t->peers[r].rank = r;
        t->peers[r].s = calloc(NS + 1, sizeof(struct stream));
        if (!t->peers[r].s) abort();
        for (int i = 0; i <= NS; i++) {
            struct stream *s = &t->peers[r].s[i];
            s->fd = far[r][i] = -1;
            s->idx = i;
            s->peer = &t->peers[r];
            if (r == 0) continue;
            int sv[2];
            if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv)) abort();
            int sz = 1 << 20;
            setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
            s->fd = sv[0];
            s->writable = 1;
            t->peers[r].open++;
            far[r][i] = sv[1];
        }
    }
    struct loomi_xfer *xs[MAXX];
    int nx = 0;
    size_t off = 0;
    while (off < size) {
        int op = d[off++] % 4;
        if (op == 0 && size - off >= 4) {
            int r = 1 + d[off] % (NR - 1), i = d[off + 1] % (NS + 1);
            size_t len = (size_t)(d[off + 2] | d[off + 3] << 8);
            off += 4;
            if (len > size - off) len = size - off;
            if (far[r][i] >= 0 && len) (void)send(far[r][i], d + off, len, MSG_NOSIGNAL); /* gone: EPIPE */
            off += len;
            if (t->peers[r].s[i].fd >= 0) stream_read(t, &t->peers[r].s[i]);
        } else if (op == 1 && size - off >= 5 && nx < MAXX) {
            struct loomi_xfer *x = fuzz_recv(1 + d[off] % (NR - 1), d + off + 1, 4096);
            off += 5;
            xs[nx++] = x;
            tcp_irecv(t, x);
        } else if (op == 2 && size - off >= 1) {
            int k = d[off++];
            if (nx && !xs[k % nx]->owner) tcp_cancel(t, xs[k % nx]);
        } else if (op == 3 && size - off >= 2) {
            int r = 1 + d[off] % (NR - 1), i = d[off + 1] % (NS + 1);
            off += 2;
            if (far[r][i] >= 0) {
                close(far[r][i]);
                far[r][i] = -1;
            }
            if (t->peers[r].s[i].fd >= 0) stream_read(t, &t->peers[r].s[i]);
        } else {
            break;
        }
    }
    t->aborted = 1; /* no polite goodbye: nobody reads the far ends */
    loomi_tcp_destroy(t);
    for (int r = 1; r < NR; r++)
        for (int i = 0; i <= NS; i++)
            if (far[r][i] >= 0) close(far[r][i]);
    fuzz_free_recvs(xs, nx);
    return 0;
}

/* ------------------------------------------------------------ seeds */

static size_t piece(unsigned char *b, int peer, int stream, uint64_t tag, uint64_t total,
                    uint64_t offset, uint32_t len, uint32_t chk)
{
    struct wire_hdr h;
    memset(&h, 0, sizeof h);
    h.magic = TCP_MAGIC;
    h.type = T_DATA;
    h.tag = tag;
    h.total = total;
    h.offset = offset;
    h.len = len;
    h.aux = (int32_t)chk;
    size_t n = sizeof h + len;
    b[0] = 0;
    b[1] = (unsigned char)(peer - 1);
    b[2] = (unsigned char)stream;
    b[3] = (unsigned char)n;
    b[4] = (unsigned char)(n >> 8);
    memcpy(b + 5, &h, sizeof h);
    memset(b + 5 + sizeof h, 0xab, len);
    return 5 + n;
}

static size_t post(unsigned char *b, int peer, int tag, size_t len, int chk)
{
    b[0] = 1;
    b[1] = (unsigned char)(peer - 1);
    b[2] = (unsigned char)tag;
    b[3] = (unsigned char)len;
    b[4] = (unsigned char)(len >> 8);
    b[5] = (unsigned char)chk;
    return 6;
}

static size_t control(unsigned char *b, int peer, int type, uint64_t tag, int aux)
{
    struct wire_hdr h = control_hdr(type, tag, aux);
    b[0] = 0;
    b[1] = (unsigned char)(peer - 1);
    b[2] = NS;
    b[3] = sizeof h;
    b[4] = 0;
    memcpy(b + 5, &h, sizeof h);
    return 5 + sizeof h;
}

int fuzz_seeds(const char *dir)
{
    unsigned char b[8192];
    size_t n;
    /* Posted, then one piece. */
    n = post(b, 1, 1, 100, 0);
    n += piece(b + n, 1, 0, 1, 100, 0, 100, 0);
    if (fuzz_write_seed(dir, "posted", b, n)) return -1;
    /* Early, two pieces on two streams in reverse order, then posted. */
    n = piece(b, 2, 1, 2, 300, 200, 100, 0x105);
    n += piece(b + n, 2, 0, 2, 300, 0, 200, 0x105);
    n += post(b + n, 2, 2, 300, 5);
    if (fuzz_write_seed(dir, "early-two-pieces", b, n)) return -1;
    /* A piece's header in, posted half way, then its payload. */
    n = piece(b, 1, 1, 3, 1000, 0, 600, 0);
    size_t whole = n;
    b[3] = 5 + 40; /* header and 40 bytes only (the record's len) */
    b[4] = 0;
    n = 5 + 40;
    n += post(b + n, 1, 3, 1000, 0);
    b[n] = 0;
    b[n + 1] = 0;
    b[n + 2] = 1;
    size_t rest = whole - 5 - 40;
    b[n + 3] = (unsigned char)rest;
    b[n + 4] = (unsigned char)(rest >> 8);
    memset(b + n + 5, 0xcd, rest);
    n += 5 + rest;
    n += piece(b + n, 1, 0, 3, 1000, 600, 400, 0);
    if (fuzz_write_seed(dir, "go-direct", b, n)) return -1;
    /* Posted, cancelled, the message comes anyway. */
    n = post(b, 2, 0, 64, 0);
    b[n++] = 2;
    b[n++] = 0;
    n += piece(b + n, 2, 0, 0, 64, 0, 64, 0);
    if (fuzz_write_seed(dir, "cancelled", b, n)) return -1;
    /* Length and check mismatches. */
    n = post(b, 1, 1, 10, 0);
    n += piece(b + n, 1, 0, 1, 20, 0, 20, 0);
    if (fuzz_write_seed(dir, "length-mismatch", b, n)) return -1;
    n = piece(b, 1, 0, 1, 20, 0, 10, 0x101);
    n += piece(b + n, 1, 1, 1, 20, 10, 10, 0x102);
    if (fuzz_write_seed(dir, "check-mismatch", b, n)) return -1;
    /* Zero-length message, goodbye and close, abort. */
    n = post(b, 1, 0, 0, 0);
    n += piece(b + n, 1, 0, 0, 0, 0, 0, 0);
    n += control(b + n, 1, T_BYE, 0, 0);
    b[n++] = 3;
    b[n++] = 0;
    b[n++] = NS;
    if (fuzz_write_seed(dir, "empty-bye-close", b, n)) return -1;
    n = post(b, 2, 1, 8, 0);
    n += control(b + n, 2, T_ABORT, LOOM_ERR_REVOKED, 1);
    if (fuzz_write_seed(dir, "abort", b, n)) return -1;
    /* More pieces than an early message tracks, then posted. */
    n = 0;
    for (int k = 0; k < 20; k++) n += piece(b + n, 1, k % 2, 2, 200, (uint64_t)k * 10, 10, 0);
    n += post(b + n, 1, 2, 200, 0);
    return fuzz_write_seed(dir, "many-pieces", b, n);
}
