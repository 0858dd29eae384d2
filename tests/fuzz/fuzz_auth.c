/* The connection handshake (auth.h): the acceptor's side
 * (loomi_auth_accept_step) reading whatever an opener sends, in any
 * splits, over a socketpair; and the opener's side (loomi_auth_open)
 * reading whatever comes back as the ANSWER.  auth.c is included so its
 * static MAC code writes the seeds, and so that its nonces (getrandom)
 * are fixed here: a real handshake is then a fixed string of bytes, and
 * the seeds hold whole handshakes that succeed.
 *
 * Input: byte 0 picks the side (even: acceptor, odd: opener); byte 1:
 * bit 0 the public key of a job without a secret (else a job's key),
 * bits 1-5 the kinds the acceptor takes (none: all); byte 2 % 5 - 1 the
 * acceptor's rank (-1: any).  Then, for the acceptor, records
 * [len][len bytes]: the bytes are written to the opener's end and the
 * acceptor steps once (len 255: the opener's end shuts down instead);
 * for the opener, the bytes it reads after its OPEN. */
#include <sys/random.h>
#include <sys/types.h>

static ssize_t fuzz_getrandom(void *buf, size_t n, unsigned int flags);
#define getrandom(b, n, f) fuzz_getrandom(b, n, f)
#include "transports/auth.c"
#undef getrandom

#include "tests/fuzz/fuzz.h"

FUZZ_QUIET_INIT

#define FUZZ_NONCE 0xa5

/* Every nonce of this harness: fixed, so that seeds can answer them. */
__attribute__((noinline)) static ssize_t fuzz_getrandom(void *buf, size_t n, unsigned int flags)
{
    (void)flags;
    unsigned char *b = buf;
    for (size_t i = 0; i < n; i++) b[i] = FUZZ_NONCE;
    return (ssize_t)n;
}

static void fuzz_key(int public, unsigned char key[LOOMI_AUTH_KEY_BYTES])
{
    static const unsigned char secret[LOOMI_AUTH_SECRET_MIN] = {0x5a, 1, 2, 3};
    loomi_auth_key(secret, public ? 0 : sizeof secret, key);
}

static void pair(int sv[2])
{
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv)) abort();
    int sz = 1 << 20;
    setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
    setsockopt(sv[0], SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
}

static void fuzz_acceptor(const uint8_t *d, size_t n, const unsigned char *key, uint32_t kinds,
                          int me)
{
    int sv[2];
    pair(sv);
    struct loomi_auth_accept a;
    loomi_auth_accept_init(&a, kinds, me);
    char msg[256];
    int k = 0, far = sv[1];
    size_t off = 0;
    while (k == 0 && off < n) {
        size_t len = d[off++];
        if (len == 255) {
            if (far >= 0) shutdown(far, SHUT_WR);
        } else {
            if (len > n - off) len = n - off;
            if (len) (void)send(far, d + off, len, MSG_NOSIGNAL);
            off += len;
        }
        k = loomi_auth_accept_step(&a, sv[0], key, msg, sizeof msg);
    }
    if (k == 0) {
        /* The opener stops: the acceptor reads the end. */
        shutdown(far, SHUT_WR);
        k = loomi_auth_accept_step(&a, sv[0], key, msg, sizeof msg);
        if (k == 0) abort(); /* an end is not "more bytes needed" */
    }
    if (k > 0 && (a.phase != 2 || a.id.kind < 1 || a.id.kind > LOOMI_AUTH_KIND_MAX ||
                  !(kinds & (1u << a.id.kind)) || (me >= 0 && a.id.dst != me)))
        abort(); /* proven, yet not what this acceptor takes */
    close(sv[0]);
    close(sv[1]);
}

static void fuzz_opener(const uint8_t *d, size_t n, const unsigned char *key)
{
    int sv[2];
    pair(sv);
    if (n > 4096) n = 4096;
    if (n && write(sv[1], d, n) != (ssize_t)n) abort();
    shutdown(sv[1], SHUT_WR);
    const struct loomi_auth_id id = {LOOMI_AUTH_CTRL, 1, 0, 0};
    unsigned char session[LOOMI_AUTH_SESSION_BYTES];
    char msg[256];
    loomi_auth_open(sv[0], key, &id, loomi_now_ms() + 1000, session, msg, sizeof msg);
    close(sv[0]);
    close(sv[1]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3) return 0;
    unsigned char key[LOOMI_AUTH_KEY_BYTES];
    fuzz_key(data[1] & 1, key);
    uint32_t kinds = (uint32_t)data[1] & 0x3e;
    if (!kinds) kinds = 0x3e;
    int me = data[2] % 5 - 1;
    if (data[0] & 1) fuzz_opener(data + 3, size - 3, key);
    else fuzz_acceptor(data + 3, size - 3, key, kinds, me);
    return 0;
}

/* ------------------------------------------------------------ seeds */

/* A whole handshake as an opener with the key sends it: OPEN, PROOF. */
static void handshake(const unsigned char *key, const struct loomi_auth_id *id,
                      unsigned char open[OPEN_BYTES], unsigned char proof[PROOF_BYTES],
                      unsigned char ans[ANSWER_BYTES])
{
    unsigned char nonce[LOOMI_AUTH_NONCE], amac[LOOMI_AUTH_MAC];
    memset(nonce, FUZZ_NONCE, sizeof nonce);
    encode_open(open, id, nonce); /* the opener's nonce, as the acceptor's */
    mac(key, label_acceptor, open, OPEN_BYTES, nonce, LOOMI_AUTH_NONCE, NULL, 0, amac);
    put32(proof, AUTH_MAGIC_PROOF);
    put32(proof + 4, 0);
    mac(key, label_opener, open, OPEN_BYTES, nonce, LOOMI_AUTH_NONCE, amac, LOOMI_AUTH_MAC,
        proof + 8);
    put32(ans, AUTH_MAGIC_ANSWER);
    put32(ans + 4, ST_OK);
    memcpy(ans + 8, nonce, LOOMI_AUTH_NONCE);
    memcpy(ans + 8 + LOOMI_AUTH_NONCE, amac, LOOMI_AUTH_MAC);
}

/* Acceptor seed: OPEN and PROOF in records of `split` bytes (0: one
 * record each), then `tail` (255: the end). */
static int acc_seed(const char *dir, const char *name, int flags, int me,
                    const unsigned char *open, const unsigned char *proof, size_t proof_len,
                    size_t split, int tail)
{
    unsigned char b[512];
    size_t n = 0;
    b[n++] = 0;
    b[n++] = (unsigned char)flags;
    b[n++] = (unsigned char)(me + 1);
    const unsigned char *parts[2] = {open, proof};
    const size_t lens[2] = {OPEN_BYTES, proof_len};
    for (int i = 0; i < 2; i++)
        for (size_t o = 0; o < lens[i];) {
            size_t k = split && split < lens[i] - o ? split : lens[i] - o;
            b[n++] = (unsigned char)k;
            memcpy(b + n, parts[i] + o, k);
            n += k;
            o += k;
        }
    if (tail >= 0) b[n++] = (unsigned char)tail;
    return fuzz_write_seed(dir, name, b, n);
}

int fuzz_seeds(const char *dir)
{
    unsigned char key[LOOMI_AUTH_KEY_BYTES], pub[LOOMI_AUTH_KEY_BYTES];
    fuzz_key(0, key);
    fuzz_key(1, pub);
    unsigned char open[OPEN_BYTES], proof[PROOF_BYTES], ans[ANSWER_BYTES];
    const struct loomi_auth_id ctrl = {LOOMI_AUTH_CTRL, 1, 0, 0};
    handshake(key, &ctrl, open, proof, ans);
    int bad = 0;
    bad |= acc_seed(dir, "acc-ok", 0, 0, open, proof, PROOF_BYTES, 0, -1);
    bad |= acc_seed(dir, "acc-ok-any", 0, -1, open, proof, PROOF_BYTES, 0, -1);
    bad |= acc_seed(dir, "acc-ok-bytes", 0, 0, open, proof, PROOF_BYTES, 1, -1);
    bad |= acc_seed(dir, "acc-ok-7", 1 << LOOMI_AUTH_CTRL, 0, open, proof, PROOF_BYTES, 7, -1);
    bad |= acc_seed(dir, "acc-short-proof", 0, 0, open, proof, PROOF_BYTES - 5, 0, 255);
    bad |= acc_seed(dir, "acc-no-proof", 0, 0, open, proof, 0, 0, 255);
    bad |= acc_seed(dir, "acc-wrong-rank", 0, 2, open, proof, PROOF_BYTES, 0, -1);
    bad |= acc_seed(dir, "acc-wrong-kind", 1 << LOOMI_AUTH_TCP, 0, open, proof, PROOF_BYTES, 0,
                    -1);
    bad |= acc_seed(dir, "acc-wrong-key", 1, 0, open, proof, PROOF_BYTES, 0, -1);
    unsigned char p2[PROOF_BYTES];
    memcpy(p2, proof, sizeof p2);
    p2[20] ^= 1;
    bad |= acc_seed(dir, "acc-bad-proof", 0, 0, open, p2, PROOF_BYTES, 0, -1);
    unsigned char o2[OPEN_BYTES];
    memcpy(o2, open, sizeof o2);
    put32(o2 + 4, AUTH_VERSION + 1);
    bad |= acc_seed(dir, "acc-version", 0, 0, o2, proof, PROOF_BYTES, 0, -1);
    memcpy(o2, open, sizeof o2);
    put32(o2, 0x4c4d4254u); /* a boot hello's magic, not a handshake */
    bad |= acc_seed(dir, "acc-magic", 0, 0, o2, proof, PROOF_BYTES, 0, -1);
    /* Every kind, from a joiner (-1) to the root (-1), public key. */
    for (uint32_t k = LOOMI_AUTH_BOOT; k <= LOOMI_AUTH_KIND_MAX; k++) {
        const struct loomi_auth_id id = {k, k == LOOMI_AUTH_JOIN ? -1 : 2,
                                         k == LOOMI_AUTH_BOOT ? -1 : 3, k == LOOMI_AUTH_TCP};
        handshake(pub, &id, open, proof, ans);
        char name[32];
        snprintf(name, sizeof name, "acc-public-%u", k);
        bad |= acc_seed(dir, name, 1, k == LOOMI_AUTH_BOOT ? -1 : 3, open, proof, PROOF_BYTES, 0,
                        -1);
    }
    /* The opener's side: the acceptor's answer to ctrl's OPEN. */
    handshake(key, &ctrl, open, proof, ans);
    unsigned char b[3 + ANSWER_BYTES + 8] = {1, 0, 0};
    memcpy(b + 3, ans, ANSWER_BYTES);
    bad |= fuzz_write_seed(dir, "open-ok", b, 3 + ANSWER_BYTES);
    bad |= fuzz_write_seed(dir, "open-short", b, 3 + ANSWER_BYTES / 2);
    b[1] = 1;
    bad |= fuzz_write_seed(dir, "open-wrong-key", b, 3 + ANSWER_BYTES);
    b[1] = 0;
    for (uint32_t st = ST_KIND; st <= ST_VERSION + 1; st++) {
        put32(b + 3 + 4, st);
        char name[32];
        snprintf(name, sizeof name, "open-refused-%u", st);
        bad |= fuzz_write_seed(dir, name, b, 3 + ANSWER_BYTES);
    }
    put32(b + 3, AUTH_MAGIC_OPEN);
    put32(b + 3 + 4, ST_OK);
    bad |= fuzz_write_seed(dir, "open-magic", b, sizeof b);
    return bad ? -1 : 0;
}
