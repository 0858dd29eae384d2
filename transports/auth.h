/* auth.h - proving membership of a job on every connection Loom opens or
 * accepts, without the secret on the wire.
 *
 * A job's secret (LOOM_JOB_KEY, loomrun's, loom_get_unique_id's) is turned
 * into a 32-byte key (loomi_auth_key).  Every connection then begins with
 * a challenge-response in both directions, HMAC-SHA256 from OpenSSL's
 * libcrypto:
 *
 *   opener   -> acceptor  OPEN   {magic, version, identity, nonce_o}
 *   acceptor -> opener    ANSWER {magic, nonce_a, HMAC(key, "acceptor" | OPEN | nonce_a)}
 *   opener   -> acceptor  PROOF  {magic, HMAC(key, "opener" | OPEN | nonce_a | ANSWER's mac)}
 *
 * The identity (what the connection is for: kind, ranks, stream) is in
 * OPEN and so under both codes.  Each side's code covers the other side's
 * fresh nonce, so a recorded handshake cannot be replayed, and the opener
 * checks the acceptor's code before it proves anything, so an acceptor
 * that does not hold the key learns nothing.  The acceptor reads exactly
 * the handshake's bytes (OPEN, then PROOF) and nothing else until the
 * opener has proven itself.  Both sides then hold key material of that
 * connection alone (LOOMI_AUTH_SESSION_BYTES): HKDF-SHA256 of the key,
 * salted with both nonces, over OPEN.
 *
 * A job without a secret (one host, no LOOM_JOB_KEY) has the public key
 * of the empty secret (loomi_auth_key_is_public): its handshakes prove
 * nothing, and its acceptors take connections only from addresses of
 * their own host.
 */
#ifndef LOOMI_AUTH_H
#define LOOMI_AUTH_H

#include <stddef.h>
#include <stdint.h>

#define LOOMI_AUTH_KEY_BYTES 32
#define LOOMI_AUTH_NONCE 32
#define LOOMI_AUTH_MAC 32
/* Key material of one connection, from its handshake: bytes 0-31 for
 * what the opener sends, 32-63 for what the acceptor sends. */
#define LOOMI_AUTH_SESSION_BYTES 64
/* The fewest bytes of secret taken (128 bits). */
#define LOOMI_AUTH_SECRET_MIN 16
#define LOOMI_AUTH_SECRET_MAX 64
/* How long an acceptor waits for an unproven connection to prove itself
 * (and a proven one to say what it wants) before dropping it. */
#define LOOMI_AUTH_WAIT_MS 5000

/* What a connection is for; each acceptor takes only its own kinds. */
enum loomi_auth_kind {
    LOOMI_AUTH_BOOT = 1,  /* a rank registering with the rendezvous root */
    LOOMI_AUTH_TCP = 2,   /* a tcp stream between ranks */
    LOOMI_AUTH_VERBS = 3, /* the verbs queue pair exchange */
    LOOMI_AUTH_CTRL = 4,  /* the control plane between ranks */
    LOOMI_AUTH_JOIN = 5,  /* a joiner asking the join service */
    LOOMI_AUTH_KIND_MAX = 5
};

struct loomi_auth_id {
    uint32_t kind;   /* enum loomi_auth_kind */
    int32_t src;     /* the opener's rank; -1: none yet (a joiner) */
    int32_t dst;     /* the acceptor's rank; -1: the rendezvous root */
    uint32_t stream; /* tcp's stream; 0 otherwise */
};

/* The key of a secret of n bytes (n may be 0: the public key of a job
 * without a secret). */
void loomi_auth_key(const unsigned char *secret, size_t n, unsigned char key[LOOMI_AUTH_KEY_BYTES]);
/* 1 when key is the public key of the empty secret. */
int loomi_auth_key_is_public(const unsigned char key[LOOMI_AUTH_KEY_BYTES]);

/* A secret written as text (LOOM_JOB_KEY): hex digits, an even number of
 * them from 32 to 128.  Returns its length in bytes, or -1 (why says
 * what is wrong, without repeating the text). */
int loomi_auth_parse_secret(const char *text, unsigned char *out, size_t cap, const char **why);

/* 16 bytes that tell a job's key from another's (HMAC of label), to be
 * kept where the key must not be (a shared-memory segment's header). */
void loomi_auth_tag(const unsigned char key[LOOMI_AUTH_KEY_BYTES], const char *label,
                    unsigned char out[16]);

/* Fill buf with n random bytes (getrandom): 0, or -1. */
int loomi_auth_random(void *buf, size_t n);

/* The opener's side, on a blocking or non-blocking connected fd, until
 * deadline_ms.  Returns 0 when both sides proved themselves, with the
 * connection's key material in session (unless NULL); otherwise msg says
 * why and the result is -2 when the other side answered and is not this
 * job's or refused the connection (trying again will not help), -1 when
 * the connection broke or the deadline passed ("ECONNRESET during the
 * handshake", ...). */
int loomi_auth_open(int fd, const unsigned char key[LOOMI_AUTH_KEY_BYTES],
                    const struct loomi_auth_id *id, uint64_t deadline_ms,
                    unsigned char *session, char *msg, size_t msglen);

/* The acceptor's side, one step at a time, for poll loops: a fresh
 * connection starts with loomi_auth_accept_init, then each time fd is
 * readable loomi_auth_accept_step reads what the handshake still needs
 * (never more) and answers.  Kinds: a bit mask (1u << kind) of the kinds
 * this acceptor takes; me: its rank (dst must match; -1 takes any). */
struct loomi_auth_accept {
    int phase;  /* 0: reading OPEN; 1: reading PROOF; 2: proven; -1: failed */
    size_t got; /* bytes of the current message read */
    unsigned char in[96];
    unsigned char open[64]; /* the OPEN as received */
    unsigned char nonce[LOOMI_AUTH_NONCE];
    unsigned char mac[LOOMI_AUTH_MAC]; /* the ANSWER's code */
    struct loomi_auth_id id;           /* valid once proven */
    unsigned char session[LOOMI_AUTH_SESSION_BYTES]; /* valid once proven */
    uint32_t kinds;
    int me;
    int checked; /* the peer's address was looked at */
};
void loomi_auth_accept_init(struct loomi_auth_accept *a, uint32_t kinds, int me);
/* Returns 1 when the opener is proven (a->id says who it is), 0 when the
 * handshake needs more bytes (wait for POLLIN and call again), -1 when
 * the connection must be dropped (msg says why: EOF, a stranger, a wrong
 * kind or rank). */
int loomi_auth_accept_step(struct loomi_auth_accept *a, int fd,
                           const unsigned char key[LOOMI_AUTH_KEY_BYTES], char *msg,
                           size_t msglen);
/* The whole acceptor's side, waiting until deadline_ms; the connection's
 * key material goes to session (unless NULL). */
int loomi_auth_accept(int fd, const unsigned char key[LOOMI_AUTH_KEY_BYTES], uint32_t kinds,
                      int me, struct loomi_auth_id *id, unsigned char *session,
                      uint64_t deadline_ms, char *msg, size_t msglen);

/* For a job without a secret: 1 when the peer on fd connects from an
 * address of this host. */
int loomi_auth_peer_is_local(int fd);
/* "a.b.c.d:port" of the peer on fd, for the log ("?" when unknown). */
void loomi_auth_peer_name(int fd, char *buf, size_t n);

/* Log, as rank `rank`'s `service` (e.g. "rendezvous root 10.0.0.1:29500"),
 * that the connection on fd was refused and why, with the peer's
 * address: at notice level (printed unless LOOM_DEBUG=none), at most 20
 * lines in any 10 s per process, then how many more were refused. */
void loomi_auth_log_refusal(int rank, const char *service, int fd, const char *why);

#endif
