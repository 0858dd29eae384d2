/* Membership payloads that peers send through the control plane's
 * mailbox (struct loomi_cmsg), as the protocols read them:
 *  - agreements (agree.c, included so its static readers run): each
 *    message goes through merge() and adopt() as member() takes it
 *    (an AGREED: merged, then adopted; an AGREE: merged, then its value
 *    and op read), on a real control plane whose failed set they grow;
 *  - a joiner's admission (loomi_join_accept_bad, join.c's check of the
 *    holder's ACCEPT: rank, size, link figures, algorithms);
 *  - a control frame's header (loomi_ctrl_parse) and whether the mailbox
 *    takes it (loomi_ctrl_mail_bad);
 *  - an address a peer publishes for its control connection
 *    (loomi_wire_to_sockaddr).
 * Shrink's ADDR and ALL and state sync's records carry no more than a
 * length and equality checks of these (shrink.c build_*, state.c: the
 * tensor count is agreed before the records), so they have no harness.
 *
 * Input: byte 0 % 4 picks the reader; then, for agreements, [ranks]
 * [this rank][decided?] and records [type & src][len][len bytes] (type
 * bit 7: AGREED, else AGREE; src: the low bits % ranks); for the
 * others, the bytes: [arg: 8 bytes][payload] for an admission, a
 * header then [n][held] for a frame, a wire address. */
#include "src/comm/agree.c"

#include <arpa/inet.h>
#include <netinet/in.h>

#include "transports/net.h"
#include "tests/fuzz/fuzz.h"

FUZZ_QUIET_INIT

#define MAXN 8

static void fuzz_agree(const uint8_t *d, size_t size)
{
    if (size < 3) return;
    const int n = 1 + d[0] % MAXN, me = d[1] % n, want_decided = d[2] & 1;
    d += 3;
    size -= 3;
    static const unsigned char key[32] = {0x5a};
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct loomi_ctrl *c;
    if (loomi_ctrl_create(me, n, key, 0, (struct sockaddr *)&sa, sizeof sa, &c)) abort();
    struct agree g;
    memset(&g, 0, sizeof g);
    unsigned char out[MAXN], heard[MAXN], ops[MAXN], msg[HEAD + MAXN], decided[MAXN];
    uint64_t vals[MAXN];
    memset(out, 0, sizeof out);
    memset(heard, 0, sizeof heard);
    g.ctrl = c;
    g.n = n;
    g.me = me;
    g.id = 7;
    g.op = LOOM_MIN;
    g.out = out;
    g.heard = heard;
    g.vals = vals;
    g.ops = ops;
    g.msg = msg;
    g.decided = want_decided ? decided : NULL;
    g.fn = "loom_comm_agree";
    refresh(&g);
    size_t off = 0;
    while (size - off >= 2) {
        int agreed = d[off] & 0x80, src = (d[off] & 0x7f) % n;
        size_t len = d[off + 1];
        off += 2;
        if (len > size - off) len = size - off;
        struct loomi_cmsg *m = malloc(sizeof *m + (len ? len : 1));
        if (!m) abort();
        *m = (struct loomi_cmsg){.type = agreed ? LOOMI_CMSG_AGREED : LOOMI_CMSG_AGREE,
                                 .src = src, .epoch = 0, .arg = g.id, .len = (uint32_t)len};
        memcpy(m->data, d + off, len);
        off += len;
        /* As member() takes it. */
        if (agreed) {
            if (merge(&g, m) == 0) adopt(&g, m);
            else malformed(&g, m);
        } else if (merge(&g, m) == 0) {
            g.heard[m->src] = 1;
            g.vals[m->src] = loomi_le64_load(m->data);
            g.ops[m->src] = m->data[8];
        } else {
            malformed(&g, m);
        }
        free(m);
    }
    loomi_ctrl_destroy(c, 0);
}

static void fuzz_accept(const uint8_t *d, size_t size)
{
    if (size < 8) return;
    uint64_t arg;
    memcpy(&arg, d, 8);
    struct loomi_join_accept acc;
    if (loomi_join_accept_bad(arg, d + 8, (uint32_t)(size - 8), &acc)) return;
    if ((arg >> 32) < 2 || (arg & 0xffffffffu) >= (arg >> 32) || !loomi_links_valid(&acc.links))
        abort();
    char why[320];
    loomi_uniform_diff(&acc.uniform, "this joiner", &acc.uniform, "the members", why, sizeof why);
}

static void fuzz_frame(const uint8_t *d, size_t size)
{
    if (size < LOOMI_CTRL_HDR_BYTES + 2) return;
    uint16_t type;
    uint32_t epoch, len;
    uint64_t arg;
    if (loomi_ctrl_parse(d, &type, &epoch, &arg, &len)) return;
    if (len > LOOMI_CTRL_MAX_PAYLOAD) abort(); /* parse takes no longer payload */
    const int n = 1 + d[LOOMI_CTRL_HDR_BYTES] % 16, q = d[LOOMI_CTRL_HDR_BYTES + 1] % (n + 4);
    loomi_ctrl_mail_bad(n, q, type, len, d[LOOMI_CTRL_HDR_BYTES + 1] >> 4,
                        (uint64_t)d[LOOMI_CTRL_HDR_BYTES] << 24);
}

static void fuzz_wire(const uint8_t *d, size_t size)
{
    struct loomi_wire_addr w;
    memset(&w, 0, sizeof w);
    memcpy(&w, d, size < sizeof w ? size : sizeof w);
    struct sockaddr_storage ss;
    socklen_t sl = 0;
    if (loomi_wire_to_sockaddr(&w, &ss, &sl)) return;
    if (sl == 0 || sl > sizeof ss) abort();
    char s[80];
    loomi_sockaddr_str((struct sockaddr *)&ss, s, sizeof s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    switch (data[0] % 4) {
    case 0: fuzz_agree(data + 1, size - 1); break;
    case 1: fuzz_accept(data + 1, size - 1); break;
    case 2: fuzz_frame(data + 1, size - 1); break;
    default: fuzz_wire(data + 1, size - 1); break;
    }
    return 0;
}

/* ------------------------------------------------------------ seeds */

static size_t agree_msg(unsigned char *b, int agreed, int src, uint64_t v, unsigned op,
                        const unsigned char *out, int n)
{
    b[0] = (unsigned char)((agreed ? 0x80 : 0) | src);
    b[1] = (unsigned char)(HEAD + n);
    loomi_le64_store(b + 2, v);
    b[10] = (unsigned char)op;
    memcpy(b + 11, out, (size_t)n);
    return 2 + HEAD + (size_t)n;
}

int fuzz_seeds(const char *dir)
{
    unsigned char b[4096];
    int bad = 0;
    for (int n = 1; n <= 4; n += 3) {
        unsigned char out[MAXN] = {0};
        size_t k = 0;
        b[k++] = 0;
        b[k++] = (unsigned char)(n - 1);
        b[k++] = 0;
        b[k++] = 1;
        for (int q = 1; q < n; q++) k += agree_msg(b + k, 0, q, 100 + (uint64_t)q, LOOM_MIN, out, n);
        if (n > 2) out[2] = LOOMI_OUT;
        k += agree_msg(b + k, 1, 0, 42, AG_OK, out, n);
        char name[32];
        snprintf(name, sizeof name, "agree-%d", n);
        bad |= fuzz_write_seed(dir, name, b, k);
    }
    unsigned char out[4] = {0, LOOMI_OUT_LEFT, 0, 0};
    size_t k = 0;
    b[k++] = 0;
    b[k++] = 3;
    b[k++] = 2;
    b[k++] = 0;
    k += agree_msg(b + k, 0, 1, 5, LOOM_MAX, out, 4);
    k += agree_msg(b + k, 1, 0, 1, AG_OPS, out, 4);
    k += agree_msg(b + k, 1, 3, 1, AG_MINORITY, out, 4);
    b[k++] = 2;
    b[k++] = 3; /* too short */
    b[k++] = 1;
    b[k++] = 2;
    b[k++] = 3;
    bad |= fuzz_write_seed(dir, "agree-errors", b, k);
    /* An admission, as shrink.c's coordinator sends it. */
    struct loomi_join_accept acc;
    memset(&acc, 0, sizeof acc);
    loomi_links_defaults(&acc.links, 1);
    b[0] = 1;
    uint64_t arg = 3 | (uint64_t)4 << 32;
    memcpy(b + 1, &arg, 8);
    memcpy(b + 9, &acc, sizeof acc);
    bad |= fuzz_write_seed(dir, "accept", b, 9 + sizeof acc);
    arg = 4 | (uint64_t)4 << 32;
    memcpy(b + 1, &arg, 8);
    bad |= fuzz_write_seed(dir, "accept-rank", b, 9 + sizeof acc);
    /* A frame header. */
    b[0] = 2;
    loomi_ctrl_frame(b + 1, LOOMI_CMSG_AGREE, 1, 7, 13);
    b[1 + LOOMI_CTRL_HDR_BYTES] = 4;
    b[2 + LOOMI_CTRL_HDR_BYTES] = 2;
    bad |= fuzz_write_seed(dir, "frame", b, 3 + LOOMI_CTRL_HDR_BYTES);
    /* Addresses: v4 and v6. */
    struct sockaddr_in s4;
    memset(&s4, 0, sizeof s4);
    s4.sin_family = AF_INET;
    s4.sin_port = htons(29500);
    s4.sin_addr.s_addr = htonl(0x0a000001);
    struct loomi_wire_addr w;
    b[0] = 3;
    if (loomi_sockaddr_to_wire((struct sockaddr *)&s4, &w) == 0) {
        memcpy(b + 1, &w, sizeof w);
        bad |= fuzz_write_seed(dir, "wire-4", b, 1 + sizeof w);
    }
    struct sockaddr_in6 s6;
    memset(&s6, 0, sizeof s6);
    s6.sin6_family = AF_INET6;
    s6.sin6_port = htons(29501);
    s6.sin6_addr = in6addr_loopback;
    if (loomi_sockaddr_to_wire((struct sockaddr *)&s6, &w) == 0) {
        memcpy(b + 1, &w, sizeof w);
        bad |= fuzz_write_seed(dir, "wire-6", b, 1 + sizeof w);
    }
    return bad ? -1 : 0;
}
