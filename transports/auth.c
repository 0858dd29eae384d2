/*
 * auth.c - the challenge-response every connection begins with (auth.h).
 * The cryptography is OpenSSL's (libcrypto): HMAC-SHA256 for the codes,
 * SHA-256 for the key, CRYPTO_memcmp to compare codes.
 */
#include "transports/auth.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/kdf.h>
#include <openssl/sha.h>

#include "core/internal.h"
#include "transports/net.h"

#define AUTH_MAGIC_OPEN 0x4c4d414fu   /* "LMAO" */
#define AUTH_MAGIC_ANSWER 0x4c4d4141u /* "LMAA" */
#define AUTH_MAGIC_PROOF 0x4c4d4150u  /* "LMAP" */
#define AUTH_VERSION 1u

/* Sizes on the wire (little-endian words). */
#define OPEN_BYTES (24 + LOOMI_AUTH_NONCE)
#define ANSWER_BYTES (8 + LOOMI_AUTH_NONCE + LOOMI_AUTH_MAC)
#define PROOF_BYTES (8 + LOOMI_AUTH_MAC)
_Static_assert(OPEN_BYTES <= sizeof((struct loomi_auth_accept *)0)->open, "OPEN fits");
_Static_assert(PROOF_BYTES <= sizeof((struct loomi_auth_accept *)0)->in, "PROOF fits");

/* What an ANSWER says besides "here is my proof". */
enum { ST_OK = 0, ST_KIND = 1, ST_RANK = 2, ST_VERSION = 3 };

static const char label_key[] = "loom job key v1";
static const char label_acceptor[] = "loom auth acceptor v1";
static const char label_opener[] = "loom auth opener v1";

/* OpenSSL, set up once and never torn down: its exit handler would free
 * what a thread of Loom (the rendezvous root, the control plane) may
 * still use while the process exits. */
static pthread_once_t crypto_once = PTHREAD_ONCE_INIT;
static void crypto_init(void) { OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, NULL); }
static void crypto_ready(void) { pthread_once(&crypto_once, crypto_init); }

static void put32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

static uint32_t get32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void loomi_auth_key(const unsigned char *secret, size_t n, unsigned char key[LOOMI_AUTH_KEY_BYTES])
{
    unsigned char buf[sizeof label_key + LOOMI_AUTH_SECRET_MAX];
    crypto_ready();
    if (n > LOOMI_AUTH_SECRET_MAX) n = LOOMI_AUTH_SECRET_MAX;
    memcpy(buf, label_key, sizeof label_key);
    if (n) memcpy(buf + sizeof label_key, secret, n);
    SHA256(buf, sizeof label_key + n, key);
    OPENSSL_cleanse(buf, sizeof buf);
}

int loomi_auth_key_is_public(const unsigned char key[LOOMI_AUTH_KEY_BYTES])
{
    unsigned char pub[LOOMI_AUTH_KEY_BYTES];
    loomi_auth_key(NULL, 0, pub);
    return memcmp(pub, key, sizeof pub) == 0;
}

int loomi_auth_parse_secret(const char *text, unsigned char *out, size_t cap, const char **why)
{
    size_t len = strlen(text);
    if (len < 2 * LOOMI_AUTH_SECRET_MIN) {
        *why = "is shorter than 32 hex digits (128 bits)";
        return -1;
    }
    if (len > 2 * LOOMI_AUTH_SECRET_MAX || len / 2 > cap) {
        *why = "is longer than 128 hex digits";
        return -1;
    }
    if (len % 2) {
        *why = "has an odd number of hex digits";
        return -1;
    }
    for (size_t i = 0; i < len; i += 2) {
        if (!isxdigit((unsigned char)text[i]) || !isxdigit((unsigned char)text[i + 1])) {
            *why = "is not hex digits";
            return -1;
        }
        char pair[3] = {text[i], text[i + 1], 0};
        out[i / 2] = (unsigned char)strtoul(pair, NULL, 16);
    }
    return (int)(len / 2);
}

void loomi_auth_tag(const unsigned char key[LOOMI_AUTH_KEY_BYTES], const char *label,
                    unsigned char out[16])
{
    unsigned char m[32];
    unsigned int ml = sizeof m;
    crypto_ready();
    HMAC(EVP_sha256(), key, LOOMI_AUTH_KEY_BYTES, (const unsigned char *)label, strlen(label), m,
         &ml);
    memcpy(out, m, 16);
}

int loomi_auth_random(void *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = getrandom((char *)buf + got, n - got, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        got += (size_t)r;
    }
    return 0;
}

/* HMAC-SHA256(key, label | a | b | c), the parts given. */
static void mac(const unsigned char key[LOOMI_AUTH_KEY_BYTES], const char *label,
                const unsigned char *a, size_t an, const unsigned char *b, size_t bn,
                const unsigned char *c, size_t cn, unsigned char out[LOOMI_AUTH_MAC])
{
    unsigned char buf[32 + OPEN_BYTES + LOOMI_AUTH_NONCE + LOOMI_AUTH_MAC];
    size_t ln = strlen(label) + 1, o = 0;
    crypto_ready();
    memcpy(buf, label, ln);
    o += ln;
    memcpy(buf + o, a, an);
    o += an;
    if (bn) memcpy(buf + o, b, bn);
    o += bn;
    if (cn) memcpy(buf + o, c, cn);
    o += cn;
    unsigned int olen = LOOMI_AUTH_MAC;
    HMAC(EVP_sha256(), key, LOOMI_AUTH_KEY_BYTES, buf, o, out, &olen);
}

/* HKDF-SHA256: ikm the job's key, salt both nonces, info a label and
 * the OPEN.  Returns 0, or -1 (OpenSSL failed). */
static int session_key(const unsigned char key[LOOMI_AUTH_KEY_BYTES], const unsigned char *open,
                       const unsigned char nonce_a[LOOMI_AUTH_NONCE],
                       unsigned char out[LOOMI_AUTH_SESSION_BYTES])
{
    static const char label[] = "loom session v1";
    unsigned char salt[2 * LOOMI_AUTH_NONCE], info[sizeof label + OPEN_BYTES];
    memcpy(salt, open + 24, LOOMI_AUTH_NONCE);
    memcpy(salt + LOOMI_AUTH_NONCE, nonce_a, LOOMI_AUTH_NONCE);
    memcpy(info, label, sizeof label);
    memcpy(info + sizeof label, open, OPEN_BYTES);
    size_t outlen = LOOMI_AUTH_SESSION_BYTES;
    crypto_ready();
    EVP_PKEY_CTX *pc = EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, NULL);
    int ok = pc && EVP_PKEY_derive_init(pc) > 0 &&
             EVP_PKEY_CTX_set_hkdf_md(pc, EVP_sha256()) > 0 &&
             EVP_PKEY_CTX_set1_hkdf_salt(pc, salt, sizeof salt) > 0 &&
             EVP_PKEY_CTX_set1_hkdf_key(pc, key, LOOMI_AUTH_KEY_BYTES) > 0 &&
             EVP_PKEY_CTX_add1_hkdf_info(pc, info, sizeof info) > 0 &&
             EVP_PKEY_derive(pc, out, &outlen) > 0 && outlen == LOOMI_AUTH_SESSION_BYTES;
    EVP_PKEY_CTX_free(pc);
    return ok ? 0 : -1;
}

static void encode_open(unsigned char *o, const struct loomi_auth_id *id,
                        const unsigned char nonce[LOOMI_AUTH_NONCE])
{
    put32(o, AUTH_MAGIC_OPEN);
    put32(o + 4, AUTH_VERSION);
    put32(o + 8, id->kind);
    put32(o + 12, (uint32_t)id->src);
    put32(o + 16, (uint32_t)id->dst);
    put32(o + 20, id->stream);
    memcpy(o + 24, nonce, LOOMI_AUTH_NONCE);
}

static const char *kind_name(uint32_t k)
{
    switch (k) {
    case LOOMI_AUTH_BOOT: return "rendezvous";
    case LOOMI_AUTH_TCP: return "tcp";
    case LOOMI_AUTH_VERBS: return "verbs";
    case LOOMI_AUTH_CTRL: return "control plane";
    case LOOMI_AUTH_JOIN: return "join";
    default: return "unknown";
    }
}

int loomi_auth_open(int fd, const unsigned char key[LOOMI_AUTH_KEY_BYTES],
                    const struct loomi_auth_id *id, uint64_t deadline_ms,
                    unsigned char *session, char *msg, size_t msglen)
{
    unsigned char nonce[LOOMI_AUTH_NONCE], open[OPEN_BYTES], ans[ANSWER_BYTES];
    unsigned char want[LOOMI_AUTH_MAC], proof[PROOF_BYTES];
    if (loomi_auth_random(nonce, sizeof nonce)) {
        snprintf(msg, msglen, "getrandom: %s", strerror(errno));
        return -1;
    }
    encode_open(open, id, nonce);
    /* A rank waiting for a peer's answer gives up when its control plane
     * says the job has (a peer that died after publishing its address
     * never answers): the read asks the thread's guard. */
    size_t got = 0;
    char why[160];
    int gk = loomi_write_full(fd, open, sizeof open, deadline_ms) ? -1
             : loomi_read_more(fd, ans, sizeof ans, &got, deadline_ms, why, sizeof why);
    if (gk == -2) {
        snprintf(msg, msglen, "gave up waiting for the handshake's answer: %s", why);
        return -1;
    }
    if (gk) {
        int e = errno;
        snprintf(msg, msglen, "%s during the handshake%s", loomi_errno_name(e),
                 e == ECONNRESET ? " (the other side closed it: not a Loom job, or another "
                                   "job, or it refused this address)"
                                 : "");
        return -1;
    }
    if (get32(ans) != AUTH_MAGIC_ANSWER) {
        snprintf(msg, msglen, "the other side did not answer the handshake as Loom does (an "
                              "older Loom version, or another program)");
        return -2;
    }
    uint32_t st = get32(ans + 4);
    if (st != ST_OK) {
        snprintf(msg, msglen, "the other side refused the connection: %s",
                 st == ST_KIND ? "it takes no connections of this kind here"
                 : st == ST_RANK ? "it is not the rank this connection is for"
                 : st == ST_VERSION ? "another handshake version"
                                    : "for no reason given");
        return -2;
    }
    mac(key, label_acceptor, open, sizeof open, ans + 8, LOOMI_AUTH_NONCE, NULL, 0, want);
    if (CRYPTO_memcmp(want, ans + 8 + LOOMI_AUTH_NONCE, LOOMI_AUTH_MAC) != 0) {
        snprintf(msg, msglen, "the other side does not hold this job's key (another job, or "
                              "LOOM_JOB_KEY differs)");
        return -2;
    }
    put32(proof, AUTH_MAGIC_PROOF);
    put32(proof + 4, 0);
    mac(key, label_opener, open, sizeof open, ans + 8, LOOMI_AUTH_NONCE,
        ans + 8 + LOOMI_AUTH_NONCE, LOOMI_AUTH_MAC, proof + 8);
    if (loomi_write_full(fd, proof, sizeof proof, deadline_ms)) {
        snprintf(msg, msglen, "%s sending the handshake's proof", loomi_errno_name(errno));
        return -1;
    }
    if (session && session_key(key, open, ans + 8, session)) {
        snprintf(msg, msglen, "OpenSSL's HKDF failed");
        return -1;
    }
    return 0;
}

void loomi_auth_accept_init(struct loomi_auth_accept *a, uint32_t kinds, int me)
{
    memset(a, 0, sizeof *a);
    a->kinds = kinds;
    a->me = me;
}

/* Read what the current message still lacks, never more. */
static int read_part(struct loomi_auth_accept *a, int fd, size_t need, char *msg, size_t msglen)
{
    while (a->got < need) {
        ssize_t r = recv(fd, a->in + a->got, need - a->got, MSG_DONTWAIT);
        if (r > 0) {
            a->got += (size_t)r;
            continue;
        }
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        snprintf(msg, msglen, "%s during the handshake (%zu of %zu bytes)",
                 r == 0 ? "closed" : loomi_errno_name(errno), a->got, need);
        return -1;
    }
    return 1;
}

static int refuse(struct loomi_auth_accept *a, int fd, uint32_t status)
{
    unsigned char ans[ANSWER_BYTES] = {0};
    put32(ans, AUTH_MAGIC_ANSWER);
    put32(ans + 4, status);
    /* Best effort, never blocking: the socket is fresh and the answer
     * small. */
    ssize_t w = send(fd, ans, sizeof ans, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)w;
    a->phase = -1;
    return -1;
}

int loomi_auth_accept_step(struct loomi_auth_accept *a, int fd,
                           const unsigned char key[LOOMI_AUTH_KEY_BYTES], char *msg,
                           size_t msglen)
{
    if (a->phase == 2) return 1;
    if (a->phase < 0) {
        snprintf(msg, msglen, "handshake failed before");
        return -1;
    }
    if (a->phase == 0 && !a->checked) {
        a->checked = 1;
        if (loomi_auth_key_is_public(key) && !loomi_auth_peer_is_local(fd)) {
            snprintf(msg, msglen, "this job has no secret (no LOOM_JOB_KEY), so it takes "
                                  "connections from this host only");
            a->phase = -1;
            return -1;
        }
    }
    if (a->phase == 0) {
        int k = read_part(a, fd, OPEN_BYTES, msg, msglen);
        if (k < 0) a->phase = -1;
        if (k <= 0) return k;
        const unsigned char *o = a->in;
        if (get32(o) != AUTH_MAGIC_OPEN) {
            snprintf(msg, msglen, "not a Loom handshake (first word 0x%08x)", get32(o));
            a->phase = -1;
            return -1;
        }
        if (get32(o + 4) != AUTH_VERSION) {
            snprintf(msg, msglen, "handshake version %u, not %u", get32(o + 4), AUTH_VERSION);
            return refuse(a, fd, ST_VERSION);
        }
        a->id.kind = get32(o + 8);
        a->id.src = (int32_t)get32(o + 12);
        a->id.dst = (int32_t)get32(o + 16);
        a->id.stream = get32(o + 20);
        if (a->id.kind < 1 || a->id.kind > LOOMI_AUTH_KIND_MAX ||
            !(a->kinds & (1u << a->id.kind))) {
            snprintf(msg, msglen, "a connection of kind %u (%s), which this service does not take",
                     a->id.kind, kind_name(a->id.kind));
            return refuse(a, fd, ST_KIND);
        }
        if (a->me >= 0 && a->id.dst != a->me) {
            snprintf(msg, msglen, "a %s connection for rank %d, not this rank",
                     kind_name(a->id.kind), (int)a->id.dst);
            return refuse(a, fd, ST_RANK);
        }
        memcpy(a->open, o, OPEN_BYTES);
        if (loomi_auth_random(a->nonce, sizeof a->nonce)) {
            snprintf(msg, msglen, "getrandom: %s", strerror(errno));
            a->phase = -1;
            return -1;
        }
        unsigned char ans[ANSWER_BYTES];
        put32(ans, AUTH_MAGIC_ANSWER);
        put32(ans + 4, ST_OK);
        memcpy(ans + 8, a->nonce, LOOMI_AUTH_NONCE);
        mac(key, label_acceptor, a->open, OPEN_BYTES, a->nonce, LOOMI_AUTH_NONCE, NULL, 0,
            a->mac);
        memcpy(ans + 8 + LOOMI_AUTH_NONCE, a->mac, LOOMI_AUTH_MAC);
        ssize_t w = send(fd, ans, sizeof ans, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w != (ssize_t)sizeof ans) {
            snprintf(msg, msglen, "%s answering the handshake",
                     w < 0 ? loomi_errno_name(errno) : "a short write");
            a->phase = -1;
            return -1;
        }
        a->phase = 1;
        a->got = 0;
    }
    int k = read_part(a, fd, PROOF_BYTES, msg, msglen);
    if (k <= 0) {
        if (k < 0) {
            /* An opener without the key stops after the answer. */
            size_t l = strlen(msg);
            snprintf(msg + l, msglen > l ? msglen - l : 0,
                     "; it did not prove it holds the job's key");
            a->phase = -1;
        }
        return k;
    }
    unsigned char want[LOOMI_AUTH_MAC];
    mac(key, label_opener, a->open, OPEN_BYTES, a->nonce, LOOMI_AUTH_NONCE, a->mac,
        LOOMI_AUTH_MAC, want);
    if (get32(a->in) != AUTH_MAGIC_PROOF ||
        CRYPTO_memcmp(want, a->in + 8, LOOMI_AUTH_MAC) != 0) {
        snprintf(msg, msglen, "its proof is wrong: it does not hold the job's key (or it "
                              "replayed another handshake)");
        a->phase = -1;
        return -1;
    }
    if (session_key(key, a->open, a->nonce, a->session)) {
        snprintf(msg, msglen, "OpenSSL's HKDF failed");
        a->phase = -1;
        return -1;
    }
    a->phase = 2;
    return 1;
}

int loomi_auth_accept(int fd, const unsigned char key[LOOMI_AUTH_KEY_BYTES], uint32_t kinds,
                      int me, struct loomi_auth_id *id, unsigned char *session,
                      uint64_t deadline_ms, char *msg, size_t msglen)
{
    struct loomi_auth_accept a;
    loomi_auth_accept_init(&a, kinds, me);
    for (;;) {
        int k = loomi_auth_accept_step(&a, fd, key, msg, msglen);
        if (k > 0) {
            *id = a.id;
            if (session) memcpy(session, a.session, sizeof a.session);
            OPENSSL_cleanse(&a, sizeof a);
            return 0;
        }
        if (k < 0) return -1;
        int left = loomi_ms_left(deadline_ms);
        if (left == 0) {
            snprintf(msg, msglen, "no handshake in time (%zu bytes of it came)", a.got);
            return -1;
        }
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, left) < 0 && errno != EINTR) {
            snprintf(msg, msglen, "poll: %s", strerror(errno));
            return -1;
        }
    }
}

int loomi_auth_peer_is_local(int fd)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) != 0) return 0;
    if (ss.ss_family == AF_INET) {
        struct sockaddr_in *in = (struct sockaddr_in *)&ss;
        if ((ntohl(in->sin_addr.s_addr) >> 24) == 127) return 1;
        in->sin_port = 0;
    } else if (ss.ss_family == AF_INET6) {
        struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
        if (IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr)) return 1;
        in6->sin6_port = 0;
    } else {
        return ss.ss_family == AF_UNIX;
    }
    /* An address of this host binds; another host's does not. */
    int s = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) return 0;
    int ok = bind(s, (struct sockaddr *)&ss, sl) == 0;
    close(s);
    return ok;
}

void loomi_auth_log_refusal(int rank, const char *service, int fd, const char *why)
{
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static uint64_t window_start;
    static unsigned logged, suppressed;
    char peer[80];
    loomi_auth_peer_name(fd, peer, sizeof peer);
    uint64_t now = loomi_now_ms();
    unsigned held = 0;
    int show;
    pthread_mutex_lock(&mu);
    if (now - window_start >= 10000) {
        held = suppressed;
        window_start = now;
        logged = suppressed = 0;
    }
    show = logged < 20;
    if (show) logged++;
    else suppressed++;
    pthread_mutex_unlock(&mu);
    if (held)
        LOOMI_NOTICE(rank, "%s: %u more connection(s) refused in the last 10 s (not logged)",
                     service, held);
    if (show) LOOMI_NOTICE(rank, "%s: refused a connection from %s: %s", service, peer, why);
}

void loomi_auth_peer_name(int fd, char *buf, size_t n)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) != 0) {
        snprintf(buf, n, "?");
        return;
    }
    loomi_sockaddr_str((struct sockaddr *)&ss, buf, n);
}
