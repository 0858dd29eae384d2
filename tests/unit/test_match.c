/* test_match.c - the two-sided transports' message matching
 * (transports/match.c): a receive posted before its message, a message
 * before its receive, lengths and calls that differ, cancelling, order,
 * the limit on early bytes. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transports/match.h"

static uint32_t my_check; /* what call_check answers for collective tags */

static uint32_t call_check(void *owner, uint64_t tag)
{
    (void)owner;
    (void)tag;
    return my_check;
}

/* The peer failures match.c asks for: how many, the last one. */
static int nfail, fail_peer;
static loom_result_t fail_code;
static char why[LOOMI_MATCH_WHY];

static void fail(void *owner, int peer, loom_result_t code, const char *text)
{
    cr_assert_eq(owner, &nfail);
    nfail++;
    fail_peer = peer;
    fail_code = code;
    snprintf(why, sizeof why, "%s", text);
}

static struct loomi_tctx ctx;
static struct loomi_match m;
static struct loomi_mq q;

static void setup(void)
{
    memset(&ctx, 0, sizeof ctx);
    memset(&q, 0, sizeof q);
    my_check = 0;
    nfail = 0;
    fail_peer = -1;
    fail_code = LOOM_SUCCESS;
    why[0] = '\0';
    ctx.call_check = call_check;
    loomi_match_init(&m, &ctx, sizeof(struct loomi_unexp), 1000, fail, &nfail);
}

static void teardown(void)
{
    struct loomi_unexp *u;
    while ((u = loomi_mq_unexp_pop(&q)) != NULL) loomi_match_unexp_free(&m, u);
    /* The receives listed were the test's own (gone with its frame). */
    cr_assert_eq(m.unexp_bytes, 0);
    loomi_match_fini(&m);
}

static struct loomi_xfer xfer(uint64_t tag, size_t len, uint32_t chk, void *buf)
{
    struct loomi_xfer x;
    memset(&x, 0, sizeof x);
    x.peer = 3;
    x.tag = tag;
    x.len = len;
    x.chk = chk;
    x.buf = buf;
    return x;
}

#define P2P(n) (LOOMI_TAG_P2P | (n))

TestSuite(match, .init = setup, .fini = teardown);

Test(match, posted_before_arrival)
{
    char buf[8];
    struct loomi_xfer x = xfer(P2P(1), sizeof buf, 0, buf);
    struct loomi_unexp *u = (void *)1;
    cr_assert_eq(loomi_match_post(&m, &q, 3, &x, &u), LOOM_SUCCESS);
    cr_assert_null(u);
    cr_assert_eq(q.nrecv, 1);
    cr_assert_eq(nfail, 0);
    /* The message comes: it finds x, and they agree. */
    cr_assert_eq(loomi_mq_recv_find(&q, P2P(1)), &x);
    cr_assert_null(loomi_mq_recv_find(&q, P2P(2)));
    cr_assert_eq(loomi_match_pair(&m, 3, P2P(1), 0, sizeof buf, &x),
                 LOOM_SUCCESS);
    loomi_mq_recv_del(&q, &x);
    cr_assert_eq(q.nrecv, 0);
    cr_assert_null(loomi_mq_recv_find(&q, P2P(1)));
}

Test(match, arrival_before_post)
{
    struct loomi_unexp *u = NULL;
    cr_assert_eq(loomi_match_early(&m, &q, 3, P2P(7), 0, 5, 1, &u),
                 LOOM_SUCCESS);
    cr_assert_not_null(u);
    cr_assert_not_null(u->buf);
    cr_assert_eq(u->tag, P2P(7));
    cr_assert_eq(u->total, 5);
    cr_assert_eq(m.unexp_bytes, 5);
    cr_assert_eq(q.nunexp, 1);
    memcpy(u->buf, "hello", 5);
    u->got = 5;
    /* A descriptor-only message holds no bytes. */
    struct loomi_unexp *d = NULL;
    cr_assert_eq(loomi_match_early(&m, &q, 3, P2P(8), 0, 900, 0, &d),
                 LOOM_SUCCESS);
    cr_assert_null(d->buf);
    cr_assert_eq(m.unexp_bytes, 5);

    char buf[5];
    struct loomi_xfer x = xfer(P2P(7), 5, 0, buf);
    struct loomi_unexp *got = NULL;
    cr_assert_eq(loomi_match_post(&m, &q, 3, &x, &got), LOOM_SUCCESS);
    cr_assert_eq(got, u);
    cr_assert_eq(q.nrecv, 0, "a receive that found its message is not listed");
    cr_assert_eq(q.nunexp, 2, "the message stays listed until the transport takes it");
    memcpy(buf, got->buf, got->got);
    cr_assert_eq(memcmp(buf, "hello", 5), 0);
    loomi_mq_unexp_del(&q, got);
    loomi_match_unexp_free(&m, got);
    cr_assert_eq(q.nunexp, 1);
    cr_assert_eq(m.unexp_bytes, 0);
    cr_assert_null(loomi_mq_unexp_find(&q, P2P(7)));
    cr_assert_eq(loomi_mq_unexp_find(&q, P2P(8)), d);
}

Test(match, length_mismatch)
{
    struct loomi_unexp *u;
    /* Early message of 16 bytes, receive of 8. */
    cr_assert_eq(loomi_match_early(&m, &q, 3, P2P(1), 0, 16, 1, &u),
                 LOOM_SUCCESS);
    char buf[16];
    struct loomi_xfer x = xfer(P2P(1), 8, 0, buf);
    struct loomi_unexp *got = NULL;
    cr_assert_eq(loomi_match_post(&m, &q, 3, &x, &got), LOOM_ERR_MISMATCH);
    cr_assert_eq(got, u);
    cr_assert_eq(nfail, 1, "the peer failed");
    cr_assert_eq(fail_peer, 3);
    cr_assert_eq(fail_code, LOOM_ERR_MISMATCH);
    cr_assert_str_eq(why, "rank 3 sent a message of 16 bytes where this rank expects 8: "
                          LOOMI_MISMATCH_HINT);
    cr_assert_eq(q.nrecv, 1, "the receive is listed, to fail with the peer");
    cr_assert_eq(q.nunexp, 1);
    /* A message meeting a posted receive: the same text. */
    cr_assert_eq(loomi_match_pair(&m, 5, P2P(1), 0, UINT64_MAX, &x),
                 LOOM_ERR_MISMATCH);
    cr_assert(strstr(why, "rank 5 sent a message of 18446744073709551615 bytes where this rank "
                          "expects 8") == why);
}

Test(match, tag_conflict)
{
    const uint64_t mine = loomi_tag_coll(5, 1, 0), theirs = loomi_tag_coll(5, 2, 3);
    char buf[4];
    struct loomi_xfer x = xfer(mine, 4, 0xabc, buf);
    struct loomi_unexp *u;
    cr_assert_eq(loomi_match_post(&m, &q, 3, &x, &u), LOOM_SUCCESS);
    /* A message of operation 5 from another schedule meets the listed
     * receive: a mismatch, not an early message. */
    cr_assert_eq(loomi_match_early(&m, &q, 3, theirs, 0xabc, 4, 1, &u),
                 LOOM_ERR_MISMATCH);
    cr_assert_null(u);
    cr_assert_eq(q.nunexp, 0);
    cr_assert_eq(nfail, 1);
    cr_assert_eq(fail_code, LOOM_ERR_MISMATCH);
    cr_assert(strstr(why, "rank 3 ran operation 5 as (schedule 2) where this rank runs "
                          "(schedule 1)") == why, "%s", why);
    /* Of another operation: no conflict. */
    cr_assert_eq(loomi_match_early(&m, &q, 3, loomi_tag_coll(6, 2, 0), 0xabc, 4, 1, &u),
                 LOOM_SUCCESS);
    /* Same tag, another call check: the call's text. */
    cr_assert_eq(loomi_match_pair(&m, 3, mine, 0xdef, 4, &x), LOOM_ERR_MISMATCH);
    cr_assert(strstr(why, "rank 3 made collective call 5 with other arguments than this rank "
                          "(call check 00000def there, 00000abc here)") == why, "%s", why);
    /* A receive posted after an early message of its operation from
     * another schedule: listed, and a mismatch. */
    struct loomi_xfer y = xfer(loomi_tag_coll(6, 1, 9), 4, 0xabc, buf);
    cr_assert_eq(loomi_match_post(&m, &q, 3, &y, &u), LOOM_ERR_MISMATCH);
    cr_assert_null(u);
    cr_assert(strstr(why, "rank 3 ran operation 6") == why, "%s", why);
    cr_assert_eq(q.nrecv, 2);
    /* This rank's own call of an operation differs from the message's. */
    my_check = 0x111;
    cr_assert_eq(loomi_match_own_conflict(&m, loomi_tag_coll(7, 1, 0), 0x222), 0x111);
    cr_assert_eq(loomi_match_own_conflict(&m, loomi_tag_coll(7, 1, 0), 0x111), 0);
    cr_assert_eq(loomi_match_own_conflict(&m, P2P(1), 0), 0, "point-to-point has no call");
    cr_assert_eq(loomi_match_early(&m, &q, 3, loomi_tag_coll(7, 1, 0), 0x222, 4, 1, &u),
                 LOOM_ERR_MISMATCH);
    cr_assert(strstr(why, "call check 00000222 there, 00000111 here") != NULL, "%s", why);
}

Test(match, cancel)
{
    char buf[4];
    struct loomi_xfer x = xfer(P2P(1), 4, 0, buf), y = xfer(P2P(2), 4, 0, buf);
    struct loomi_unexp *u;
    cr_assert_eq(loomi_match_post(&m, &q, 3, &x, &u), LOOM_SUCCESS);
    cr_assert_eq(loomi_match_post(&m, &q, 3, &y, &u), LOOM_SUCCESS);
    cr_assert_eq(loomi_mq_recv_has(&q, &x, 0), 1);
    cr_assert_eq(q.nrecv, 2);
    cr_assert_eq(loomi_mq_recv_has(&q, &x, 1), 1, "cancelled");
    cr_assert_eq(loomi_mq_recv_has(&q, &x, 1), 0, "a second cancel finds nothing");
    cr_assert_eq(q.nrecv, 1);
    /* Its message now arrives early, for no receive. */
    cr_assert_null(loomi_mq_recv_find(&q, P2P(1)));
    cr_assert_eq(loomi_match_early(&m, &q, 3, P2P(1), 0, 4, 1, &u),
                 LOOM_SUCCESS);
    cr_assert_eq(loomi_mq_recv_find(&q, P2P(2)), &y);
}

Test(match, oldest_first)
{
    char buf[4];
    struct loomi_xfer x[3];
    struct loomi_unexp *u;
    for (int i = 0; i < 3; i++) {
        x[i] = xfer(P2P(4), 4, 0, buf);
        cr_assert_eq(loomi_match_post(&m, &q, 3, &x[i], &u), LOOM_SUCCESS);
    }
    for (int i = 0; i < 3; i++) {
        struct loomi_xfer *f = loomi_mq_recv_find(&q, P2P(4));
        cr_assert_eq(f, &x[i]);
        loomi_mq_recv_del(&q, f);
    }
    struct loomi_unexp *e[3];
    for (int i = 0; i < 3; i++)
        cr_assert_eq(loomi_match_early(&m, &q, 3, P2P(4), 0, 4, 1, &e[i]),
                     LOOM_SUCCESS);
    for (int i = 0; i < 3; i++) {
        struct loomi_xfer r = xfer(P2P(4), 4, 0, buf);
        cr_assert_eq(loomi_match_post(&m, &q, 3, &r, &u), LOOM_SUCCESS);
        cr_assert_eq(u, e[i]);
        loomi_mq_unexp_del(&q, u);
        loomi_match_unexp_free(&m, u);
    }
}

Test(match, limit_and_overflow)
{
    struct loomi_unexp *u;
    cr_assert_eq(loomi_match_early(&m, &q, 3, P2P(1), 0, 600, 1, &u),
                 LOOM_SUCCESS);
    cr_assert_eq(loomi_match_early(&m, &q, 3, P2P(2), 0, 401, 1, &u),
                 LOOM_ERR_REMOTE);
    cr_assert_eq(fail_code, LOOM_ERR_REMOTE);
    cr_assert_str_eq(why, "more than 1000 bytes arrived for receives not posted");
    /* A length near 2^64 must not wrap the sum. */
    cr_assert_eq(loomi_match_early(&m, &q, 3, P2P(2), 0, UINT64_MAX - 100, 1, &u),
                 LOOM_ERR_REMOTE);
    cr_assert_eq(loomi_match_early(&m, &q, 3, P2P(2), 0, 400, 1, &u),
                 LOOM_SUCCESS);
    cr_assert_eq(m.unexp_bytes, 1000);
    cr_assert_eq(q.nunexp, 2);
}

Test(match, note_op_once_per_operation)
{
    char buf[4];
    struct loomi_xfer a = xfer(loomi_tag_coll(9, 1, 0), 4, 1, buf);
    struct loomi_xfer b = xfer(loomi_tag_coll(9, 1, 1), 4, 1, buf);
    struct loomi_xfer c = xfer(loomi_tag_coll(10, 1, 0), 4, 1, buf);
    struct loomi_xfer p = xfer(P2P(3), 4, 0, buf);
    cr_assert_eq(loomi_match_note_op(&m, &a), 1);
    cr_assert_eq(loomi_match_note_op(&m, &b), 0);
    cr_assert_eq(loomi_match_note_op(&m, &p), 0);
    cr_assert_eq(loomi_match_note_op(&m, &c), 1);
    /* What the transport then scans: a message of operation 10 from
     * another schedule, held before this rank made its call. */
    struct loomi_unexp *u;
    cr_assert_eq(loomi_match_early(&m, &q, 4, loomi_tag_coll(10, 2, 5), 1, 4, 1, &u),
                 LOOM_SUCCESS);
    cr_assert_eq(loomi_match_held(&m, &q, 4, &a), LOOM_SUCCESS, "another operation");
    cr_assert_eq(nfail, 0);
    cr_assert_eq(loomi_match_held(&m, &q, 4, &c), LOOM_ERR_MISMATCH);
    cr_assert_eq(nfail, 1);
    cr_assert_eq(fail_peer, 4);
    cr_assert(strstr(why, "rank 4 ran operation 10 as (schedule 2)") == why, "%s", why);
}

Test(match, pop_drains_everything)
{
    char buf[4];
    struct loomi_xfer x[10];
    struct loomi_unexp *u;
    for (int i = 0; i < 10; i++) {
        x[i] = xfer(P2P(100 + i), 4, 0, buf);
        cr_assert_eq(loomi_match_post(&m, &q, 3, &x[i], &u), LOOM_SUCCESS);
        cr_assert_eq(loomi_match_early(&m, &q, 3, P2P(200 + i), 0, 4, 1, &u),
                     LOOM_SUCCESS);
    }
    int n = 0;
    while (loomi_mq_recv_pop(&q)) n++;
    cr_assert_eq(n, 10);
    cr_assert_eq(q.nrecv, 0);
    n = 0;
    while ((u = loomi_mq_unexp_pop(&q)) != NULL) {
        loomi_match_unexp_free(&m, u);
        n++;
    }
    cr_assert_eq(n, 10);
    cr_assert_eq(q.nunexp, 0);
    cr_assert_eq(m.unexp_bytes, 0);
}

/* Security issue 47, item 4: early messages are budgeted per peer, in
 * bytes and in count, and the peer that passes its budget is the one
 * that fails. */
Test(match, the_peer_over_its_byte_budget_fails_not_the_next)
{
    struct loomi_mq q2;
    memset(&q2, 0, sizeof q2);
    struct loomi_unexp *u, *v;
    /* Rank 3 holds 900 of its 1000 bytes... */
    cr_assert_eq(loomi_match_early(&m, &q, 3, P2P(1), 0, 900, 1, &u), LOOM_SUCCESS);
    /* ... which leaves rank 5's budget whole: it is not failed for it. */
    cr_assert_eq(loomi_match_early(&m, &q2, 5, P2P(1), 0, 200, 1, &v), LOOM_SUCCESS);
    cr_assert_eq(nfail, 0);
    /* Rank 3 passing its own budget fails rank 3. */
    cr_assert_eq(loomi_match_early(&m, &q, 3, P2P(2), 0, 101, 1, &u), LOOM_ERR_REMOTE);
    cr_assert_eq(fail_peer, 3);
    cr_assert_eq(q2.early_bytes, 200);
    cr_assert_eq(q.early_bytes, 900);
    while ((v = loomi_mq_unexp_pop(&q2)) != NULL) loomi_match_unexp_free(&m, v);
    cr_assert_eq(q2.early_bytes, 0);
}

Test(match, early_messages_are_counted_per_peer)
{
    struct loomi_unexp *u;
    /* Messages that bring no bytes (a rendezvous) cost memory too. */
    unsigned k = 0;
    while (k <= LOOMI_MATCH_EARLY_COUNT &&
           loomi_match_early(&m, &q, 3, P2P(k), 0, 64, 0, &u) == LOOM_SUCCESS)
        k++;
    cr_assert_eq(k, LOOMI_MATCH_EARLY_COUNT, "refused past %u", LOOMI_MATCH_EARLY_COUNT);
    cr_assert_eq(fail_peer, 3);
    cr_assert_eq(fail_code, LOOM_ERR_REMOTE);
    cr_assert_str_eq(why, "more than 65536 messages arrived for receives not posted");
    /* Another peer's budget is its own. */
    struct loomi_mq q2;
    memset(&q2, 0, sizeof q2);
    cr_assert_eq(loomi_match_early(&m, &q2, 5, P2P(1), 0, 64, 0, &u), LOOM_SUCCESS);
    loomi_mq_unexp_del(&q2, u);
    loomi_match_unexp_free(&m, u);
}
