/* test_auth.c - the handshake every connection begins with
 * (transports/auth.c): members prove themselves both ways, a wrong key
 * fails on both sides, a recorded handshake cannot be replayed, the
 * secret and the key never travel, the acceptor reads nothing but the
 * handshake, and LOOM_JOB_KEY's text is checked. */
#include <criterion/criterion.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/internal.h"
#include "transports/auth.h"

static const unsigned char secret_a[16] = "0123456789abcdef";
static const unsigned char secret_b[16] = "fedcba9876543210";

struct side {
    int fd;
    unsigned char key[LOOMI_AUTH_KEY_BYTES];
    uint32_t kinds;
    int me;
    struct loomi_auth_id id;
    int rc;
    char msg[256];
    unsigned char session[LOOMI_AUTH_SESSION_BYTES];
};

/* The opener's key material of the last run. */
static unsigned char opener_session[LOOMI_AUTH_SESSION_BYTES];

static void *acceptor(void *arg)
{
    struct side *s = arg;
    s->rc = loomi_auth_accept(s->fd, s->key, s->kinds, s->me, &s->id, s->session,
                              loomi_now_ms() + 5000,
                              s->msg, sizeof s->msg);
    /* An opener that gave up leaves; so does this side. */
    if (s->rc) shutdown(s->fd, SHUT_RDWR);
    return NULL;
}

/* A relay between two socketpairs that keeps every byte it passes. */
struct relay {
    int a, b; /* a: the opener's far end; b: the acceptor's far end */
    unsigned char log[4096];
    size_t n;
    unsigned char from_opener[1024];
    size_t nfrom;
};

static void *relay_main(void *arg)
{
    struct relay *r = arg;
    struct pollfd pf[2] = {{r->a, POLLIN, 0}, {r->b, POLLIN, 0}};
    for (;;) {
        if (poll(pf, 2, 5000) <= 0) return NULL;
        for (int i = 0; i < 2; i++) {
            if (!(pf[i].revents & (POLLIN | POLLHUP))) continue;
            unsigned char buf[512];
            ssize_t k = read(pf[i].fd, buf, sizeof buf);
            if (k <= 0) {
                shutdown(pf[!i].fd, SHUT_WR);
                return NULL;
            }
            if (r->n + (size_t)k <= sizeof r->log) memcpy(r->log + r->n, buf, (size_t)k);
            r->n += (size_t)k;
            if (i == 0 && r->nfrom + (size_t)k <= sizeof r->from_opener) {
                memcpy(r->from_opener + r->nfrom, buf, (size_t)k);
                r->nfrom += (size_t)k;
            }
            cr_assert_eq(write(pf[!i].fd, buf, (size_t)k), k);
        }
    }
}

/* Run one handshake, opener key ka and acceptor key kb; the relay (when
 * given) sees the bytes.  Returns the opener's result. */
static int run(const unsigned char *ka, const unsigned char *kb, const struct loomi_auth_id *id,
               uint32_t kinds, int me, struct side *acc, char *omsg, size_t on,
               struct relay *rl)
{
    int p1[2], p2[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, p1), 0);
    pthread_t rt, at;
    int opener_fd = p1[0];
    memset(acc, 0, sizeof *acc);
    if (rl) {
        cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, p2), 0);
        rl->a = p1[1];
        rl->b = p2[0];
        acc->fd = p2[1];
        pthread_create(&rt, NULL, relay_main, rl);
    } else {
        acc->fd = p1[1];
    }
    memcpy(acc->key, kb, LOOMI_AUTH_KEY_BYTES);
    acc->kinds = kinds;
    acc->me = me;
    pthread_create(&at, NULL, acceptor, acc);
    int rc = loomi_auth_open(opener_fd, ka, id, loomi_now_ms() + 5000, opener_session, omsg, on);
    if (rc) shutdown(opener_fd, SHUT_RDWR);
    pthread_join(at, NULL);
    close(opener_fd);
    close(acc->fd);
    if (rl) {
        pthread_join(rt, NULL);
        close(p1[1]);
        close(p2[0]);
    }
    return rc;
}

static int contains(const unsigned char *hay, size_t n, const unsigned char *needle, size_t k)
{
    for (size_t i = 0; i + k <= n; i++)
        if (memcmp(hay + i, needle, k) == 0) return 1;
    return 0;
}

Test(auth, members_prove_themselves_and_nothing_secret_travels)
{
    unsigned char key[LOOMI_AUTH_KEY_BYTES];
    loomi_auth_key(secret_a, sizeof secret_a, key);
    struct loomi_auth_id id = {LOOMI_AUTH_TCP, 3, 1, 2};
    struct side acc;
    struct relay rl = {0};
    char msg[256] = "";
    cr_assert_eq(run(key, key, &id, 1u << LOOMI_AUTH_TCP, 1, &acc, msg, sizeof msg, &rl), 0,
                 "opener: %s", msg);
    cr_assert_eq(acc.rc, 0, "acceptor: %s", acc.msg);
    cr_assert_eq(acc.id.kind, LOOMI_AUTH_TCP);
    cr_assert_eq(acc.id.src, 3);
    cr_assert_eq(acc.id.dst, 1);
    cr_assert_eq(acc.id.stream, 2u);
    cr_assert_gt(rl.n, 100u);
    /* Both sides hold the same key material, which is not the key and
     * differs from one connection to the next. */
    cr_assert_eq(memcmp(opener_session, acc.session, sizeof acc.session), 0);
    cr_assert_neq(memcmp(acc.session, key, sizeof key), 0);
    unsigned char first[LOOMI_AUTH_SESSION_BYTES];
    memcpy(first, acc.session, sizeof first);
    cr_assert_eq(run(key, key, &id, 1u << LOOMI_AUTH_TCP, 1, &acc, msg, sizeof msg, NULL), 0);
    cr_assert_eq(memcmp(opener_session, acc.session, sizeof acc.session), 0);
    cr_assert_neq(memcmp(first, acc.session, sizeof first), 0);
    /* No 8 bytes of the secret or of the key appear on the wire. */
    for (size_t o = 0; o + 8 <= sizeof secret_a; o++)
        cr_assert_not(contains(rl.log, rl.n, secret_a + o, 8), "secret on the wire");
    for (size_t o = 0; o + 8 <= sizeof key; o++)
        cr_assert_not(contains(rl.log, rl.n, key + o, 8), "key on the wire");
}

Test(auth, a_wrong_key_fails_on_both_sides)
{
    unsigned char ka[LOOMI_AUTH_KEY_BYTES], kb[LOOMI_AUTH_KEY_BYTES];
    loomi_auth_key(secret_a, sizeof secret_a, ka);
    loomi_auth_key(secret_b, sizeof secret_b, kb);
    struct loomi_auth_id id = {LOOMI_AUTH_CTRL, 0, 1, 0};
    struct side acc;
    char msg[256] = "";
    cr_assert_neq(run(ka, kb, &id, 1u << LOOMI_AUTH_CTRL, 1, &acc, msg, sizeof msg, NULL), 0);
    cr_assert(strstr(msg, "does not hold this job's key"), "%s", msg);
    cr_assert_neq(acc.rc, 0);
    cr_assert(strstr(acc.msg, "did not prove"), "%s", acc.msg);
}

/* An acceptor without the key gets no proof: the opener stops after its
 * answer, so all the acceptor ever reads is the opening. */
Test(auth, an_impostor_acceptor_learns_nothing)
{
    unsigned char ka[LOOMI_AUTH_KEY_BYTES], kb[LOOMI_AUTH_KEY_BYTES];
    loomi_auth_key(secret_a, sizeof secret_a, ka);
    loomi_auth_key(secret_b, sizeof secret_b, kb);
    struct loomi_auth_id id = {LOOMI_AUTH_BOOT, 2, -1, 0};
    struct side acc;
    struct relay rl = {0};
    char msg[256] = "";
    cr_assert_neq(run(ka, kb, &id, 1u << LOOMI_AUTH_BOOT, -1, &acc, msg, sizeof msg, &rl), 0);
    cr_assert_eq(rl.nfrom, 56u, "the opener sent %zu bytes, not just its opening", rl.nfrom);
}

/* What an opener sent in one handshake, sent again to a new acceptor
 * (whose nonce differs), is refused. */
Test(auth, a_recorded_handshake_cannot_be_replayed)
{
    unsigned char key[LOOMI_AUTH_KEY_BYTES];
    loomi_auth_key(secret_a, sizeof secret_a, key);
    struct loomi_auth_id id = {LOOMI_AUTH_TCP, 1, 0, 0};
    struct side acc;
    struct relay rl = {0};
    char msg[256] = "";
    cr_assert_eq(run(key, key, &id, 1u << LOOMI_AUTH_TCP, 0, &acc, msg, sizeof msg, &rl), 0);
    cr_assert_eq(rl.nfrom, 56u + 40u);
    int sp[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sp), 0);
    cr_assert_eq(write(sp[0], rl.from_opener, rl.nfrom), (ssize_t)rl.nfrom);
    struct loomi_auth_id got;
    char why[256] = "";
    cr_assert_neq(loomi_auth_accept(sp[1], key, 1u << LOOMI_AUTH_TCP, 0, &got, NULL,
                                    loomi_now_ms() + 2000, why, sizeof why),
                  0);
    cr_assert(strstr(why, "proof is wrong"), "%s", why);
    close(sp[0]);
    close(sp[1]);
}

Test(auth, wrong_kind_and_wrong_rank_are_refused_by_name)
{
    unsigned char key[LOOMI_AUTH_KEY_BYTES];
    loomi_auth_key(secret_a, sizeof secret_a, key);
    struct side acc;
    char msg[256] = "";
    struct loomi_auth_id id = {LOOMI_AUTH_JOIN, -1, -1, 0};
    cr_assert_neq(run(key, key, &id, 1u << LOOMI_AUTH_BOOT, -1, &acc, msg, sizeof msg, NULL), 0);
    cr_assert(strstr(msg, "no connections of this kind"), "%s", msg);
    cr_assert(strstr(acc.msg, "kind 5 (join)"), "%s", acc.msg);
    struct loomi_auth_id id2 = {LOOMI_AUTH_TCP, 4, 2, 0};
    cr_assert_neq(run(key, key, &id2, 1u << LOOMI_AUTH_TCP, 3, &acc, msg, sizeof msg, NULL), 0);
    cr_assert(strstr(msg, "not the rank"), "%s", msg);
    cr_assert(strstr(acc.msg, "for rank 2"), "%s", acc.msg);
}

Test(auth, garbage_and_silence_are_dropped)
{
    unsigned char key[LOOMI_AUTH_KEY_BYTES];
    loomi_auth_key(secret_a, sizeof secret_a, key);
    int sp[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sp), 0);
    char junk[100];
    memset(junk, 'G', sizeof junk);
    cr_assert_eq(write(sp[0], junk, sizeof junk), (ssize_t)sizeof junk);
    struct loomi_auth_id got;
    char why[256] = "";
    cr_assert_neq(loomi_auth_accept(sp[1], key, 1u << LOOMI_AUTH_TCP, 0, &got, NULL,
                                    loomi_now_ms() + 2000, why, sizeof why), 0);
    cr_assert(strstr(why, "not a Loom handshake"), "%s", why);
    close(sp[0]);
    close(sp[1]);
    /* Silence: dropped at the deadline, not waited for. */
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sp), 0);
    uint64_t t0 = loomi_now_ms();
    cr_assert_neq(loomi_auth_accept(sp[1], key, 1u << LOOMI_AUTH_TCP, 0, &got, NULL, t0 + 300, why,
                                    sizeof why), 0);
    cr_assert_lt(loomi_now_ms() - t0, 2000u);
    cr_assert(strstr(why, "in time"), "%s", why);
    close(sp[0]);
    close(sp[1]);
}

/* The acceptor reads the handshake's bytes and no more: what the opener
 * sends after it stays for the caller. */
Test(auth, nothing_but_the_handshake_is_read)
{
    unsigned char key[LOOMI_AUTH_KEY_BYTES];
    loomi_auth_key(secret_a, sizeof secret_a, key);
    int sp[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sp), 0);
    struct side acc = {.fd = sp[1], .kinds = 1u << LOOMI_AUTH_VERBS, .me = 0};
    memcpy(acc.key, key, sizeof key);
    pthread_t at;
    pthread_create(&at, NULL, acceptor, &acc);
    struct loomi_auth_id id = {LOOMI_AUTH_VERBS, 1, 0, 0};
    char msg[256];
    cr_assert_eq(loomi_auth_open(sp[0], key, &id, loomi_now_ms() + 5000, NULL, msg, sizeof msg), 0);
    cr_assert_eq(write(sp[0], "after", 5), 5);
    pthread_join(at, NULL);
    cr_assert_eq(acc.rc, 0, "%s", acc.msg);
    char buf[8] = {0};
    cr_assert_eq(read(sp[1], buf, 5), 5);
    cr_assert_str_eq(buf, "after");
    close(sp[0]);
    close(sp[1]);
}

Test(auth, secrets_are_checked_and_keys_differ)
{
    unsigned char s[LOOMI_AUTH_SECRET_MAX];
    const char *why = "";
    cr_assert_eq(loomi_auth_parse_secret("0123456789abcdef0123456789ABCDEF", s, sizeof s, &why),
                 16);
    cr_assert_eq(s[0], 0x01);
    cr_assert_eq(s[15], 0xef);
    cr_assert_eq(loomi_auth_parse_secret("0123456789abcdef", s, sizeof s, &why), -1);
    cr_assert(strstr(why, "shorter"), "%s", why);
    cr_assert_eq(loomi_auth_parse_secret("0123456789abcdef0123456789abcdef0", s, sizeof s, &why),
                 -1);
    cr_assert(strstr(why, "odd"), "%s", why);
    cr_assert_eq(loomi_auth_parse_secret("jobA-jobA-jobA-jobA-jobA-jobA-jo", s, sizeof s, &why),
                 -1);
    cr_assert(strstr(why, "not hex"), "%s", why);
    char longer[200];
    memset(longer, 'a', 130);
    longer[130] = 0;
    cr_assert_eq(loomi_auth_parse_secret(longer, s, sizeof s, &why), -1);
    longer[64] = 0;
    cr_assert_eq(loomi_auth_parse_secret(longer, s, sizeof s, &why), 32);
    unsigned char k1[32], k2[32], pub[32];
    loomi_auth_key(secret_a, 16, k1);
    loomi_auth_key(secret_b, 16, k2);
    loomi_auth_key(NULL, 0, pub);
    cr_assert_neq(memcmp(k1, k2, 32), 0);
    cr_assert(loomi_auth_key_is_public(pub));
    cr_assert_not(loomi_auth_key_is_public(k1));
    unsigned char t1[16], t2[16];
    loomi_auth_tag(k1, "loom shm segment", t1);
    loomi_auth_tag(k2, "loom shm segment", t2);
    cr_assert_neq(memcmp(t1, t2, 16), 0);
    cr_assert_not(contains(k1, 32, t1, 8));
}
