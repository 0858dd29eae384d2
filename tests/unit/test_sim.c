/*
 * test_sim.c - the schedule validator and the sim transport.
 *
 * The validator must accept good schedules and reject hand-built broken
 * ones with a message naming rank, step, peer and tag; the sim transport
 * must deliver only matched pairs, report a length mismatch, withdraw
 * cancelled transfers, spread failures, and its driver must report a
 * hang instead of spinning.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "loom.h"
#include "coll/validate.h"
#include "comm/collectives.h"
#include "comm/comm.h"
#include "comm/local.h"
#include "tests/sim/harness.h"

static void quiet(void) { setenv("LOOM_DEBUG", "none", 1); }

/* ------------------------------------------------------------ validator */

#define P 4
static struct loomi_sched S[P];
static char msg[2048];

static void mk(int p)
{
    for (int r = 0; r < p; r++) {
        loomi_sched_init(&S[r], r, p, LOOM_FLOAT32, LOOM_SUM);
        S[r].buf_bytes[LOOMI_BUF_SEND] = 64;
        S[r].buf_bytes[LOOMI_BUF_RECV] = 64;
        S[r].buf_bytes[LOOMI_BUF_SCRATCH] = 64;
    }
}

static void rm(int p)
{
    for (int r = 0; r < p; r++) loomi_sched_free(&S[r]);
}

static loom_result_t check(int p, int hazards)
{
    struct loomi_validate_opts o = {.hazards = hazards};
    return loomi_sched_validate(S, p, &o, NULL, msg, sizeof msg);
}

#define HAS(word) cr_assert(strstr(msg, (word)) != NULL, "message '%s' lacks '%s'", msg, (word))

TestSuite(validate, .init = quiet);

Test(validate, accepts_a_good_exchange)
{
    mk(2);
    /* Each rank sends its SEND to the other and reduces what arrives. */
    for (int r = 0; r < 2; r++) {
        loomi_sched_send(&S[r], 1 - r, 7, LOOMI_BUF_SEND, 0, 16, NULL, 0);
        uint32_t rv = loomi_sched_recv(&S[r], 1 - r, 7, LOOMI_BUF_SCRATCH, 0, 16, NULL, 0);
        loomi_sched_reduce(&S[r], LOOMI_BUF_RECV, 0, LOOMI_BUF_SEND, 0, LOOMI_BUF_SCRATCH, 0, 16,
                           &rv, 1);
    }
    cr_assert_eq(check(2, 1), LOOM_SUCCESS, "%s", msg);
    cr_assert_str_eq(msg, "");
    rm(2);
}

Test(validate, rejects_a_send_without_receive)
{
    mk(2);
    loomi_sched_send(&S[0], 1, 7, LOOMI_BUF_SEND, 0, 4, NULL, 0);
    loomi_sched_send(&S[0], 1, 9, LOOMI_BUF_SEND, 0, 4, NULL, 0);
    loomi_sched_recv(&S[1], 0, 7, LOOMI_BUF_RECV, 0, 4, NULL, 0);
    cr_assert_eq(check(2, 0), LOOM_ERR_INTERNAL);
    HAS("rank 0 step 1");
    HAS("tag 9");
    HAS("no matching receive on rank 1");
    cr_assert(strstr(loom_get_last_error(), "no matching receive") != NULL);
    rm(2);
}

Test(validate, rejects_a_receive_without_send)
{
    mk(3);
    loomi_sched_recv(&S[2], 1, 3, LOOMI_BUF_RECV, 0, 4, NULL, 0);
    cr_assert_eq(check(3, 0), LOOM_ERR_INTERNAL);
    HAS("rank 2 step 0");
    HAS("no matching send on rank 1");
    rm(3);
}

Test(validate, rejects_a_count_mismatch)
{
    mk(2);
    loomi_sched_send(&S[0], 1, 7, LOOMI_BUF_SEND, 0, 4, NULL, 0);
    loomi_sched_recv(&S[1], 0, 7, LOOMI_BUF_RECV, 0, 5, NULL, 0);
    cr_assert_eq(check(2, 0), LOOM_ERR_INTERNAL);
    HAS("sends 4 elements");
    HAS("receives 5");
    HAS("rank 1 step 0");
    rm(2);
}

Test(validate, rejects_a_duplicate_tag)
{
    mk(2);
    loomi_sched_send(&S[0], 1, 7, LOOMI_BUF_SEND, 0, 4, NULL, 0);
    loomi_sched_send(&S[0], 1, 7, LOOMI_BUF_SEND, 16, 4, NULL, 0);
    loomi_sched_recv(&S[1], 0, 7, LOOMI_BUF_RECV, 0, 4, NULL, 0);
    loomi_sched_recv(&S[1], 0, 8, LOOMI_BUF_RECV, 16, 4, NULL, 0);
    cr_assert_eq(check(2, 0), LOOM_ERR_INTERNAL);
    HAS("sends twice to rank 1 with tag 7");
    rm(2);
}

Test(validate, rejects_a_dependency_cycle_across_ranks)
{
    /* 0 waits for 1's message before sending the one 1 waits for. */
    mk(2);
    uint32_t a = loomi_sched_recv(&S[0], 1, 1, LOOMI_BUF_RECV, 0, 4, NULL, 0);
    loomi_sched_send(&S[0], 1, 2, LOOMI_BUF_RECV, 0, 4, &a, 1);
    uint32_t b = loomi_sched_recv(&S[1], 0, 2, LOOMI_BUF_RECV, 0, 4, NULL, 0);
    loomi_sched_send(&S[1], 0, 1, LOOMI_BUF_RECV, 0, 4, &b, 1);
    cr_assert_eq(check(2, 0), LOOM_ERR_INTERNAL);
    HAS("deadlock");
    HAS("4 of 4 steps");
    HAS("cycle");
    rm(2);
}

Test(validate, rejects_sends_that_need_buffering)
{
    /* Both send first and receive after their send completed: fine with
     * buffered sends, a deadlock under rendezvous, which is what counts. */
    mk(2);
    for (int r = 0; r < 2; r++) {
        uint32_t s = loomi_sched_send(&S[r], 1 - r, (uint32_t)r, LOOMI_BUF_SEND, 0, 4, NULL, 0);
        loomi_sched_recv(&S[r], 1 - r, (uint32_t)(1 - r), LOOMI_BUF_RECV, 0, 4, &s, 1);
    }
    cr_assert_eq(check(2, 0), LOOM_ERR_INTERNAL);
    HAS("deadlock");
    rm(2);
}

Test(validate, rejects_out_of_range_steps)
{
    mk(2);
    loomi_sched_send(&S[0], 1, 7, LOOMI_BUF_SEND, 56, 4, NULL, 0); /* 56 + 16 > 64 */
    loomi_sched_recv(&S[1], 0, 7, LOOMI_BUF_RECV, 0, 4, NULL, 0);
    cr_assert_eq(check(2, 0), LOOM_ERR_INTERNAL);
    HAS("rank 0 step 0");
    HAS("outside its buffer");
    rm(2);

    mk(2);
    loomi_sched_copy(&S[1], LOOMI_BUF_RECV, 0, LOOMI_BUF_SCRATCH, 60, 1, NULL, 0);
    loomi_sched_copy(&S[1], LOOMI_BUF_RECV, 0, LOOMI_BUF_SCRATCH, 61, 1, NULL, 0);
    cr_assert_eq(check(2, 0), LOOM_ERR_INTERNAL);
    HAS("rank 1 step 1");
    rm(2);

    mk(2);
    loomi_sched_send(&S[0], 0, 7, LOOMI_BUF_SEND, 0, 4, NULL, 0); /* to itself */
    cr_assert_eq(check(2, 0), LOOM_ERR_INTERNAL);
    HAS("bad peer");
    rm(2);
}

Test(validate, rejects_writes_to_send)
{
    mk(1);
    loomi_sched_copy(&S[0], LOOMI_BUF_SEND, 0, LOOMI_BUF_RECV, 0, 4, NULL, 0);
    cr_assert_eq(check(1, 0), LOOM_ERR_INTERNAL);
    HAS("writes SEND");
    rm(1);
}

/* One rank copying 4 elements from src+0 to SCRATCH+0 and to dst2+off2:
 * the validator must refuse it, saying `why`. */
static void copy2_refused(int dst2, size_t off2, int src, const char *why)
{
    mk(1);
    loomi_sched_copy2(&S[0], LOOMI_BUF_SCRATCH, 0, dst2, off2, src, 0, 4, NULL, 0);
    cr_assert_eq(check(1, 0), LOOM_ERR_INTERNAL);
    HAS(why);
    rm(1);
}

Test(validate, checks_both_destinations_of_a_copy)
{
    /* Copy RECV[0,16) to SCRATCH[0,16) and RECV[32,48): fine, and the
     * second destination counts as a write (a hazard with an unordered
     * send of it). */
    mk(2);
    loomi_sched_copy2(&S[0], LOOMI_BUF_SCRATCH, 0, LOOMI_BUF_RECV, 32, LOOMI_BUF_RECV, 0, 4, NULL,
                      0);
    cr_assert_eq(check(2, 1), LOOM_SUCCESS, "%s", msg);
    loomi_sched_send(&S[0], 1, 1, LOOMI_BUF_RECV, 40, 2, NULL, 0);
    loomi_sched_recv(&S[1], 0, 1, LOOMI_BUF_RECV, 0, 2, NULL, 0);
    cr_assert_eq(check(2, 1), LOOM_ERR_INTERNAL);
    HAS("hazard on rank 0");
    HAS("RECV+32");
    rm(2);

    /* The second destination past its buffer, over its source, over the
     * first copy, or into SEND. */
    copy2_refused(LOOMI_BUF_RECV, 56, LOOMI_BUF_SEND, "outside its buffer");
    copy2_refused(LOOMI_BUF_RECV, 8, LOOMI_BUF_RECV, "second copy");
    copy2_refused(LOOMI_BUF_SCRATCH, 0, LOOMI_BUF_RECV, "second copy");
    copy2_refused(LOOMI_BUF_SEND, 0, LOOMI_BUF_RECV, "writes SEND");
}

Test(validate, finds_hazards_only_when_asked)
{
    /* Two receives into overlapping bytes of RECV with no order. */
    mk(3);
    loomi_sched_recv(&S[0], 1, 1, LOOMI_BUF_RECV, 0, 4, NULL, 0);
    loomi_sched_recv(&S[0], 2, 1, LOOMI_BUF_RECV, 8, 4, NULL, 0);
    loomi_sched_send(&S[1], 0, 1, LOOMI_BUF_SEND, 0, 4, NULL, 0);
    loomi_sched_send(&S[2], 0, 1, LOOMI_BUF_SEND, 0, 4, NULL, 0);
    cr_assert_eq(check(3, 0), LOOM_SUCCESS, "%s", msg);
    cr_assert_eq(check(3, 1), LOOM_ERR_INTERNAL);
    HAS("hazard on rank 0");
    HAS("step 0");
    HAS("step 1");
    rm(3);

    /* A send reading what an unordered reduce writes. */
    mk(2);
    loomi_sched_reduce(&S[0], LOOMI_BUF_RECV, 0, LOOMI_BUF_SEND, 0, LOOMI_BUF_SEND, 16, 4, NULL, 0);
    loomi_sched_send(&S[0], 1, 1, LOOMI_BUF_RECV, 4, 2, NULL, 0);
    loomi_sched_recv(&S[1], 0, 1, LOOMI_BUF_RECV, 0, 2, NULL, 0);
    cr_assert_eq(check(2, 1), LOOM_ERR_INTERNAL);
    HAS("writes what the other reads");
    rm(2);

    /* The same, ordered: fine. */
    mk(2);
    uint32_t d = loomi_sched_reduce(&S[0], LOOMI_BUF_RECV, 0, LOOMI_BUF_SEND, 0, LOOMI_BUF_SEND,
                                    16, 4, NULL, 0);
    loomi_sched_send(&S[0], 1, 1, LOOMI_BUF_RECV, 4, 2, &d, 1);
    loomi_sched_recv(&S[1], 0, 1, LOOMI_BUF_RECV, 0, 2, NULL, 0);
    cr_assert_eq(check(2, 1), LOOM_SUCCESS, "%s", msg);
    rm(2);
}

Test(validate, accepts_every_generator_here)
{
    /* A few real schedules: what the exhaustive suite does at scale. */
    for (int p = 1; p <= 6; p++) {
        struct loomi_sched s[6];
        struct loomi_coll_args a[6];
        for (int r = 0; r < p; r++) {
            memset(&a[r], 0, sizeof a[r]);
            a[r].coll = LOOMI_COLL_ALLREDUCE;
            a[r].count = 1001;
            a[r].chunk_bytes = 64;
            cr_assert_eq(loomi_coll_build(&s[r], r, p, LOOM_FLOAT32, LOOM_SUM, &a[r],
                                          LOOMI_ALGO_RING),
                         LOOM_SUCCESS, "%s", loom_get_last_error());
        }
        struct loomi_validate_stats st;
        cr_assert_eq(loomi_sched_validate_coll(s, p, a, 1, &st, msg, sizeof msg), LOOM_SUCCESS,
                     "p=%d: %s", p, msg);
        if (p > 1) cr_assert_gt(st.messages, 0);
        /* Claiming a smaller user buffer than the schedule uses is caught. */
        a[0].count = 1000;
        cr_assert_eq(loomi_sched_validate_coll(s, p, a, 0, NULL, msg, sizeof msg),
                     LOOM_ERR_INTERNAL);
        HAS("rank 0");
        for (int r = 0; r < p; r++) loomi_sched_free(&s[r]);
    }
}

/* ------------------------------------------------ the bare transport */

struct seen {
    int n;
    loom_result_t st;
};

static void on_complete(struct loomi_xfer *x, loom_result_t st)
{
    struct seen *s = x->owner;
    s->n++;
    s->st = st;
}

static int pf_calls, pf_peer, pf_failed;
static loom_result_t pf_code;
static char pf_why[256];

static void on_peer_failed(void *owner, int peer, int failed, loom_result_t code, const char *why)
{
    (void)owner;
    pf_calls++;
    pf_peer = peer;
    pf_failed = failed;
    pf_code = code;
    snprintf(pf_why, sizeof pf_why, "%s", why);
}

static struct loomi_sim_world *W;
static void *ep[3];

static void bare(int p)
{
    quiet();
    pf_calls = 0;
    W = loomi_sim_world_new(p, 42);
    cr_assert(W);
    for (int r = 0; r < p; r++) {
        struct loomi_tctx ctx = {.rank = r, .nranks = p, .peer_failed = on_peer_failed};
        cr_assert_eq(loomi_sim_endpoint_create(W, &ctx, &ep[r]), LOOM_SUCCESS);
    }
}

static void xfer(struct loomi_xfer *x, int peer, uint64_t tag, void *buf, size_t len,
                 struct seen *s)
{
    memset(x, 0, sizeof *x);
    x->peer = peer;
    x->tag = tag;
    x->buf = buf;
    x->len = len;
    x->complete = on_complete;
    x->owner = s;
}

Test(simt, delivers_matched_pairs_only)
{
    bare(2);
    const struct loomi_transport_ops *t = &loomi_sim_ops;
    char src[16] = "fifteen bytes!!", dst[16] = {0};
    struct loomi_xfer xs, xr, xo;
    struct seen ss = {0}, sr = {0}, so = {0};
    xfer(&xs, 1, 5, src, 16, &ss);
    cr_assert_eq(t->isend(ep[0], &xs), LOOM_SUCCESS);
    /* A receive with another tag does not match, and a lone send waits. */
    xfer(&xo, 0, 6, dst, 16, &so);
    cr_assert_eq(t->irecv(ep[1], &xo), LOOM_SUCCESS);
    for (int i = 0; i < 5; i++) t->progress(ep[0], 0);
    cr_assert_eq(ss.n, 0, "a send completed without a receive");
    cr_assert_eq(so.n, 0);
    xfer(&xr, 0, 5, dst, 16, &sr);
    cr_assert_eq(t->irecv(ep[1], &xr), LOOM_SUCCESS);
    t->progress(ep[1], 0);
    cr_assert_eq(ss.n, 1);
    cr_assert_eq(sr.n, 1);
    cr_assert_eq(ss.st, LOOM_SUCCESS);
    cr_assert_eq(sr.st, LOOM_SUCCESS);
    cr_assert_str_eq(dst, src);
    cr_assert_eq(so.n, 0);
    struct loomi_sim_stats st;
    loomi_sim_world_stats(W, &st);
    cr_assert_eq(st.delivered, 1);
    cr_assert_eq(st.bytes, 16);
    cr_assert_eq(st.pending, 1); /* the tag-6 receive */
    t->cancel(ep[1], &xo);
    loomi_sim_world_stats(W, &st);
    cr_assert_eq(st.pending, 0);
    loomi_sim_world_free(W);
}

Test(simt, reports_a_length_mismatch)
{
    bare(2);
    const struct loomi_transport_ops *t = &loomi_sim_ops;
    char src[16] = {1}, dst[16] = {0};
    struct loomi_xfer xs, xr;
    struct seen ss = {0}, sr = {0};
    xfer(&xs, 1, 5, src, 16, &ss);
    xfer(&xr, 0, 5, dst, 8, &sr);
    t->isend(ep[0], &xs);
    t->irecv(ep[1], &xr);
    t->progress(ep[0], 0);
    cr_assert_eq(sr.n, 1);
    cr_assert_eq(sr.st, LOOM_ERR_MISMATCH);
    cr_assert_eq(ss.n, 1);
    cr_assert_eq(ss.st, LOOM_ERR_MISMATCH);
    cr_assert_eq(dst[0], 0, "a mismatched message was copied");
    cr_assert_eq(pf_calls, 1);
    cr_assert_eq(pf_peer, 0);
    cr_assert_eq(pf_code, LOOM_ERR_MISMATCH);
    cr_assert(strstr(pf_why, "rank 0 sent a message of 16 bytes") != NULL, "%s", pf_why);
    cr_assert(strstr(pf_why, "expects 8") != NULL, "%s", pf_why);
    /* The receiver dropped the peer: new transfers with it fail at once. */
    struct loomi_xfer x2;
    struct seen s2 = {0};
    xfer(&x2, 0, 9, dst, 8, &s2);
    cr_assert_eq(t->irecv(ep[1], &x2), LOOM_ERR_REMOTE);
    loomi_sim_world_free(W);
}

Test(simt, cancel_withdraws_one_side_of_a_pair)
{
    bare(2);
    const struct loomi_transport_ops *t = &loomi_sim_ops;
    char a[8] = "abcdefg", b[8] = {0};
    struct loomi_xfer xs, xr, xs2;
    struct seen ss = {0}, sr = {0}, ss2 = {0};
    xfer(&xs, 1, 5, a, 8, &ss);
    xfer(&xr, 0, 5, b, 8, &sr);
    t->isend(ep[0], &xs);
    t->irecv(ep[1], &xr); /* now a deliverable pair */
    t->cancel(ep[0], &xs);
    t->progress(ep[1], 0);
    cr_assert_eq(ss.n + sr.n, 0, "a cancelled transfer moved");
    /* The receive waits again and takes the next matching send. */
    xfer(&xs2, 1, 5, a, 8, &ss2);
    t->isend(ep[0], &xs2);
    t->progress(ep[0], 0);
    cr_assert_eq(sr.n, 1);
    cr_assert_eq(ss2.n, 1);
    cr_assert_eq(ss.n, 0);
    cr_assert_str_eq(b, a);
    loomi_sim_world_free(W);
}

Test(simt, abort_fails_own_transfers_and_tells_the_peers)
{
    bare(3);
    const struct loomi_transport_ops *t = &loomi_sim_ops;
    char buf[8];
    struct loomi_xfer x0, x1, x2;
    struct seen s0 = {0}, s1 = {0}, s2 = {0};
    xfer(&x0, 1, 1, buf, 8, &s0);
    t->irecv(ep[0], &x0);
    xfer(&x1, 0, 2, buf, 8, &s1);
    t->irecv(ep[1], &x1);
    xfer(&x2, 1, 3, buf, 8, &s2); /* 2 with 1: not involved */
    t->irecv(ep[2], &x2);
    t->abort_all(ep[0], 0, LOOM_ERR_REVOKED);
    cr_assert_eq(s0.n, 1);
    cr_assert_eq(s0.st, LOOM_ERR_REVOKED);
    cr_assert_eq(s1.n, 0, "the notice is acted on in the peer's own progress");
    t->progress(ep[1], 0);
    cr_assert_eq(s1.n, 1);
    cr_assert_eq(s1.st, LOOM_ERR_REVOKED);
    cr_assert_eq(pf_calls, 1);
    cr_assert_eq(pf_peer, 0);
    cr_assert_eq(s2.n, 0);
    t->destroy(ep[0]);
    /* Rank 1 leaving with rank 2 still waiting on it fails that receive. */
    t->destroy(ep[1]);
    t->progress(ep[2], 0);
    cr_assert_eq(s2.n, 1);
    cr_assert_eq(s2.st, LOOM_ERR_REMOTE);
    loomi_sim_world_free(W);
}

/* ----------------------------------------------- worlds of communicators */

static loom_comm_t comms[8];
static loom_request_t req[8];
static loom_result_t res[8];

static void world(int p, uint64_t seed)
{
    quiet();
    loom_config_t cfg = LOOM_CONFIG_INITIALIZER;
    cr_assert_eq(loomi_sim_world_create(p, seed, &cfg, &W, comms), LOOM_SUCCESS, "%s",
                 loom_get_last_error());
    for (int r = 0; r < p; r++) {
        loomi_comm_set_chunk_bytes(comms[r], 64);
        req[r] = LOOM_REQUEST_NULL;
    }
}

/* A sim world has no control plane to build children over: split says
 * so at once, on the calling rank, before any exchange (no rank waits
 * for the others), and the world goes on. */
Test(simw, split_is_refused_without_a_control_plane)
{
    world(3, 1);
    loom_comm_t c = (loom_comm_t)1;
    cr_assert_eq(loom_comm_split(comms[1], 0, 0, NULL, &c), LOOM_ERR_UNSUPPORTED);
    cr_assert(strstr(loom_get_last_error(), "control plane"), "%s", loom_get_last_error());
    cr_assert_null(c);
    float in[3][8], out[3][8];
    for (int r = 0; r < 3; r++) {
        for (int i = 0; i < 8; i++) in[r][i] = (float)(r + i);
        cr_assert_eq(loom_iallreduce(in[r], out[r], 8, LOOM_FLOAT32, LOOM_SUM, comms[r], &req[r]),
                     LOOM_SUCCESS);
    }
    char msg[256];
    cr_assert_eq(loomi_sim_run(W, comms, req, 3, 0, res, msg, sizeof msg), LOOM_SUCCESS, "%s", msg);
    for (int r = 0; r < 3; r++) {
        cr_assert_eq(res[r], LOOM_SUCCESS, "%s", msg);
        cr_assert_float_eq(out[r][5], 18.0f, 0, "rank %d", r);
    }
    loomi_sim_world_destroy(W, comms);
    W = NULL;
}

Test(simw, runs_an_allreduce_through_the_public_api)
{
    world(5, 1);
    float in[5][300], out[5][300];
    for (int r = 0; r < 5; r++)
        for (int i = 0; i < 300; i++) in[r][i] = (float)(r + i);
    for (int r = 0; r < 5; r++) {
        loomi_comm_force_algo(comms[r], LOOMI_COLL_ALLREDUCE, LOOMI_ALGO_RING);
        cr_assert_eq(loom_iallreduce(in[r], out[r], 300, LOOM_FLOAT32, LOOM_SUM, comms[r], &req[r]),
                     LOOM_SUCCESS, "%s", loom_get_last_error());
    }
    cr_assert_eq(loomi_sim_run(W, comms, req, 5, 0, res, msg, sizeof msg), LOOM_SUCCESS, "%s",
                 msg);
    for (int r = 0; r < 5; r++) {
        cr_assert_eq(res[r], LOOM_SUCCESS, "%s", msg);
        for (int i = 0; i < 300; i++) cr_assert_eq(out[r][i], (float)(10 + 5 * i));
    }
    struct loomi_sim_stats st;
    loomi_sim_world_stats(W, &st);
    cr_assert_gt(st.delivered, 5 * 8); /* 64-byte chunks: many messages */
    loomi_sim_world_destroy(W, comms);
    for (int r = 0; r < 5; r++) cr_assert_null(comms[r]);
}

static uint64_t digest_of(uint64_t seed)
{
    world(6, seed);
    static double in[6][500], out[6][500];
    for (int r = 0; r < 6; r++) {
        for (int i = 0; i < 500; i++) in[r][i] = r * i;
        loom_iallreduce(in[r], out[r], 500, LOOM_FLOAT64, LOOM_SUM, comms[r], &req[r]);
    }
    cr_assert_eq(loomi_sim_run(W, comms, req, 6, 0, res, msg, sizeof msg), LOOM_SUCCESS);
    struct loomi_sim_stats st;
    loomi_sim_world_stats(W, &st);
    loomi_sim_world_destroy(W, comms);
    return st.digest;
}

Test(simw, same_seed_same_order)
{
    uint64_t a = digest_of(7), b = digest_of(7), c = digest_of(8);
    cr_assert_eq(a, b, "one seed gave two delivery orders");
    cr_assert_neq(a, c, "two seeds gave the same delivery order");
}

Test(simw, driver_reports_a_hang)
{
    /* Rank 2 never calls: its peers wait on receives never matched. */
    world(3, 3);
    int in[3][64], out[3][64];
    memset(in, 0, sizeof in);
    for (int r = 0; r < 2; r++)
        cr_assert_eq(loom_iallreduce(in[r], out[r], 64, LOOM_INT32, LOOM_SUM, comms[r], &req[r]),
                     LOOM_SUCCESS);
    cr_assert_eq(loomi_sim_run(W, comms, req, 3, 0, res, msg, sizeof msg), LOOM_ERR_TIMEOUT);
    HAS("hang");
    HAS("ranks not done: 0 1");
    HAS("rank 2");
    /* The waiting ranks' operations are still pending: destroy aborts them. */
    loomi_sim_world_destroy(W, comms);
}

Test(simw, driver_caps_rounds)
{
    world(2, 3);
    int in[64], out[64];
    cr_assert_eq(loom_iallreduce(in, out, 64, LOOM_INT32, LOOM_SUM, comms[0], &req[0]),
                 LOOM_SUCCESS);
    cr_assert_eq(loomi_sim_run(W, comms, req, 2, 1, res, msg, sizeof msg), LOOM_ERR_TIMEOUT);
    HAS("after 1 rounds");
    loomi_sim_world_destroy(W, comms);
}

Test(simw, a_failed_rank_fails_the_others)
{
    world(4, 5);
    static float in[4][256], out[4][256];
    for (int r = 0; r < 4; r++)
        cr_assert_eq(loom_iallreduce(in[r], out[r], 256, LOOM_FLOAT32, LOOM_SUM, comms[r], &req[r]),
                     LOOM_SUCCESS);
    /* Rank 2 dies before anything moved: its request goes with it. */
    cr_assert_eq(loom_comm_abort(comms[2]), LOOM_SUCCESS);
    comms[2] = NULL;
    req[2] = LOOM_REQUEST_NULL;
    cr_assert_eq(loomi_sim_run(W, comms, req, 4, 0, res, msg, sizeof msg), LOOM_SUCCESS, "%s",
                 msg);
    for (int r = 0; r < 4; r++) {
        if (r == 2) continue;
        cr_assert_neq(res[r], LOOM_SUCCESS, "rank %d completed without rank 2", r);
        int failed = -1;
        cr_assert_neq(loom_comm_get_error(comms[r], &failed), LOOM_SUCCESS);
        cr_assert_eq(failed, 2, "rank %d blames rank %d", r, failed);
    }
    loomi_sim_world_destroy(W, comms);
}

Test(simw, a_count_mismatch_between_ranks_is_reported)
{
    world(2, 9);
    int a[16] = {0}, b[16] = {0}, oa[16], ob[16];
    loomi_comm_force_algo(comms[0], LOOMI_COLL_ALLREDUCE, LOOMI_ALGO_RING);
    loomi_comm_force_algo(comms[1], LOOMI_COLL_ALLREDUCE, LOOMI_ALGO_RING);
    cr_assert_eq(loom_iallreduce(a, oa, 16, LOOM_INT32, LOOM_SUM, comms[0], &req[0]), LOOM_SUCCESS);
    cr_assert_eq(loom_iallreduce(b, ob, 8, LOOM_INT32, LOOM_SUM, comms[1], &req[1]), LOOM_SUCCESS);
    cr_assert_eq(loomi_sim_run(W, comms, req, 2, 0, res, msg, sizeof msg), LOOM_SUCCESS, "%s",
                 msg);
    cr_assert(res[0] != LOOM_SUCCESS && res[1] != LOOM_SUCCESS);
    cr_assert(res[0] == LOOM_ERR_MISMATCH || res[1] == LOOM_ERR_MISMATCH, "%d %d", res[0], res[1]);
    HAS("rank ");
    int failed;
    cr_assert_eq(loom_comm_get_error(comms[1], &failed), LOOM_ERR_MISMATCH);
    loomi_sim_world_destroy(W, comms);
}

/* ---------------------------------------------- the engine's slot step */

/* Start call `no` (check chk) as a LOOMI_STEP_SLOT on rank r, as small.c
 * does but as a request, so that the driver runs every rank in turn:
 * the engine finds the slots through the sim transport's arenas. */
static void slot_start(int r, int p, unsigned flags, size_t count, const float *in, float *out,
                       uint64_t no, uint32_t chk)
{
    struct loom_comm *c = loomi_comm_get(comms[r]);
    cr_assert_not_null(c);
    c->eng.slot_off = 4096;
    c->eng.slot_bytes = 2048;
    struct loomi_sched s;
    loomi_sched_init(&s, r, p, LOOM_FLOAT32, LOOM_SUM);
    loomi_sched_slot(&s, LOOMI_BUF_RECV, LOOMI_BUF_SEND, count, flags);
    const size_t n = count * sizeof(float);
    s.buf_bytes[LOOMI_BUF_SEND] = (flags & LOOMI_SLOT_BLOCKS) ? n * (size_t)p : n;
    s.buf_bytes[LOOMI_BUF_RECV] = (flags & LOOMI_SLOT_GATHER) ? n * (size_t)p : n;
    s.call = no;
    s.chk = chk;
    struct loomi_op *op;
    cr_assert_eq(loomi_comm_start(c, "slot", &s, in, out, 0, &req[r], &op), LOOM_SUCCESS, "%s",
                 loom_get_last_error());
}

Test(simw, slot_steps_reduce_in_rank_order_and_exchange_blocks)
{
    enum { p = 4 };
    world(p, 11);
    static float in[p][4 * 100], out[p][4 * 100];
    /* 5 values lie in the word's line, 100 in a slot; two calls in a row
     * use both slots; then an all-to-all of blocks. */
    const size_t counts[3] = {5, 100, 100};
    for (int k = 0; k < 3; k++) {
        const int a2a = k == 2;
        const size_t cnt = counts[k];
        for (int r = 0; r < p; r++) {
            for (size_t i = 0; i < cnt * p; i++) in[r][i] = (float)(1000 * k + 100 * r) + (float)i;
            memset(out[r], 0xff, sizeof out[r]);
            slot_start(r, p, a2a ? LOOMI_SLOT_GATHER | LOOMI_SLOT_BLOCKS : LOOMI_SLOT_REDUCE, cnt,
                       in[r], out[r], (uint64_t)k + 1, 0x1234);
        }
        cr_assert_eq(loomi_sim_run(W, comms, req, p, 0, res, msg, sizeof msg), LOOM_SUCCESS, "%s",
                     msg);
        for (int r = 0; r < p; r++) {
            cr_assert_eq(res[r], LOOM_SUCCESS, "call %d, rank %d: %s", k, r, msg);
            for (size_t i = 0; i < cnt; i++) {
                float want = 0;
                for (int q = 0; q < p; q++) want += in[q][i];
                if (a2a)
                    for (int q = 0; q < p; q++)
                        cr_assert_eq(out[r][(size_t)q * cnt + i], in[q][(size_t)r * cnt + i]);
                else
                    cr_assert_eq(out[r][i], want, "call %d, rank %d, element %zu", k, r, i);
            }
        }
    }
    loomi_sim_world_destroy(W, comms);
}

Test(simw, a_slot_step_of_another_call_fails_every_rank_untouched)
{
    enum { p = 3 };
    world(p, 12);
    float in[p][8], out[p][8];
    for (int r = 0; r < p; r++) {
        for (int i = 0; i < 8; i++) in[r][i] = (float)r;
        memset(out[r], 0x5a, sizeof out[r]);
        /* Rank 1's call has another check: other arguments. */
        slot_start(r, p, LOOMI_SLOT_REDUCE, 8, in[r], out[r], 1, r == 1 ? 0x2222 : 0x1111);
    }
    cr_assert_eq(loomi_sim_run(W, comms, req, p, 0, res, msg, sizeof msg), LOOM_SUCCESS, "%s",
                 msg);
    for (int r = 0; r < p; r++) {
        cr_assert_eq(res[r], LOOM_ERR_MISMATCH, "rank %d: %d", r, res[r]);
        for (int i = 0; i < 8; i++) {
            uint32_t v;
            memcpy(&v, &out[r][i], sizeof v);
            cr_assert_eq(v, 0x5a5a5a5au, "rank %d wrote its buffer after a mismatch", r);
        }
    }
    HAS("other arguments");
    loomi_sim_world_destroy(W, comms);
}
